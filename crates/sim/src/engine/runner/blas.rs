//! The BLAS library's workspaces ([`BlasWorkspaces`]): allocated through the caching
//! allocator at the first layer of each pass that calls the library, kept until the run is
//! torn down, tagged `other` (no tensor owns them).

use trainmem_autograd::{Pass, Program, TensorId, TensorStore};

use trainmem_core::Category;
use trainmem_core::OpKind;

use crate::engine::memory::{SimMemory, SimOom};
use crate::profile::{BlasWorkspaces, FrameworkProfile, pytorch_cublas_workspace};
use trainmem_core::plan::{DeviceKind, Plan};

/// The workspaces of one run and the layers that make them.
pub(super) struct Workspaces {
    /// Bytes of one cuBLAS workspace (0: none are made).
    bytes: u64,
    /// Bytes of one cuBLASLt workspace.
    lt_bytes: u64,
    /// Per layer: it runs a matmul (a linear layer or a matmul of activations).
    blas_layers: Vec<bool>,
    /// Per layer: it runs a linear layer with a bias (`addmm` through cuBLASLt).
    lt_layers: Vec<bool>,
    /// The training thread's workspace, once made.
    forward: Option<TensorId>,
    /// The training thread's cuBLASLt workspace, once made.
    forward_lt: Option<TensorId>,
    /// The autograd engine's device thread's workspace, once made.
    backward: Option<TensorId>,
}

impl Workspaces {
    /// The workspaces `plan`'s run makes under `profile` over `program`: none on a CPU
    /// device.
    pub(super) fn new(plan: &Plan, profile: &FrameworkProfile, program: &Program) -> Workspaces {
        let (bytes, lt_bytes) = match (plan.device.kind, profile.gpu.blas) {
            (DeviceKind::Cuda, BlasWorkspaces::PerThread { lt_bytes }) => {
                (pytorch_cublas_workspace(&plan.device), lt_bytes)
            }
            _ => (0, 0),
        };
        let mut blas_layers = vec![false; program.layers.len()];
        let mut lt_layers = vec![false; program.layers.len()];
        for op in &program.ops {
            let Some(layer) = blas_layers.get_mut(op.layer as usize) else {
                continue;
            };
            match op.kind {
                OpKind::Linear => {
                    *layer = true;
                    let biased = program
                        .params_of(op)
                        .iter()
                        .any(|&p| program.params[p as usize].name.ends_with(".bias"));
                    lt_layers[op.layer as usize] |= biased;
                }
                OpKind::Matmul => *layer = true,
                _ => {}
            }
        }
        Workspaces {
            bytes,
            lt_bytes,
            blas_layers,
            lt_layers,
            forward: None,
            forward_lt: None,
            backward: None,
        }
    }

    /// Before `layer` runs in `pass`: the workspaces its thread's first matmul makes.
    pub(super) fn before_layer(
        &mut self,
        store: &mut TensorStore<SimMemory>,
        layer: u32,
        pass: Pass,
    ) -> Result<(), SimOom> {
        if self.bytes == 0
            || !self
                .blas_layers
                .get(layer as usize)
                .copied()
                .unwrap_or(false)
        {
            return Ok(());
        }
        let slot = match pass {
            Pass::Forward => &mut self.forward,
            // recomputation runs on the autograd engine's thread too
            Pass::Backward | Pass::Recompute => &mut self.backward,
        };
        if slot.is_none() {
            *slot = Some(store.alloc(self.bytes, Category::Other)?);
        }
        if pass == Pass::Forward && self.lt_layers[layer as usize] && self.forward_lt.is_none() {
            self.forward_lt = Some(store.alloc(self.lt_bytes, Category::Other)?);
        }
        Ok(())
    }

    /// Bytes of the workspaces made so far (as the allocator's blocks).
    pub(super) fn live_bytes(&self, store: &TensorStore<SimMemory>) -> u64 {
        [self.forward, self.forward_lt, self.backward]
            .into_iter()
            .flatten()
            .map(|t| store.size(t))
            .sum()
    }

    /// Frees them (the run is torn down).
    pub(super) fn release(&mut self, store: &mut TensorStore<SimMemory>) {
        for t in [
            self.forward.take(),
            self.forward_lt.take(),
            self.backward.take(),
        ]
        .into_iter()
        .flatten()
        {
            store.release(t);
        }
    }
}
