//! Model state: the parameters and what is kept beside them, the optimizer's state and
//! bookkeeping, and DDP's gradient buckets — allocated, replaced and freed.

use trainmem_autograd::{Program, TensorId, TensorStore};

use trainmem_core::Category;
use trainmem_core::{Dtype, OpKind};
use trainmem_core::{OptimizerKind, StateAllocation};
use trainmem_optim::{ModelStateBytes, OptimizerConfig, Sharding, model_state_bytes};

use super::RunSpec;
use crate::engine::memory::{SimMemory, SimOom};
use crate::profile::{FrameworkProfile, ParamUpdate, StateDtype};
use trainmem_core::plan::Plan;

/// Size of one DDP gradient bucket (PyTorch's default `bucket_cap_mb`, 25 MiB).
const DDP_BUCKET_BYTES: u64 = 25 << 20;

/// The tensors of model state and the optimizer configuration that sizes them.
pub(super) struct ModelState {
    /// The optimizer, as far as memory goes.
    pub(super) opt: OptimizerConfig,
    /// ZeRO sharding of parameters, gradients and state.
    pub(super) sharding: Sharding,
    /// The gradients' dtype.
    pub(super) grad_dtype: Dtype,
    /// The parameter tensors (shards under ZeRO-3), in program order.
    pub(super) params: Vec<TensorId>,
    /// Tensors kept beside the parameters: f32 master weights and the framework's
    /// per-tensor bookkeeping.
    pub(super) beside_params: Vec<TensorId>,
    /// The optimizer's state buffers.
    pub(super) optimizer_state: Vec<TensorId>,
    /// The model's buffers on the device (causal masks), `other`: neither parameters nor
    /// activations.
    buffers: Vec<TensorId>,
    /// State the optimizer makes when it is constructed and shares between parameters
    /// (`adamw8bit`'s quantization maps).
    shared_state: Option<TensorId>,
    /// The state buffers of their own exist (not only aliased gradients).
    state_ready: bool,
    /// DDP's gradient buckets, from the first backward on.
    pub(super) ddp_buckets: Vec<TensorId>,
    /// The optimizer's bookkeeping, from the first step on.
    optimizer_records: Option<TensorId>,
    /// The framework's records kept in host memory while the tensors are on a GPU.
    pub(super) host_records: HostRecords,
    /// Per parameter: a graph kept without backward references it (the weight of a linear
    /// layer whose input requires grad).
    saved_by_graph: Vec<bool>,
    /// Per parameter, its matrix shape when the optimizer factors its state (Adafactor);
    /// empty otherwise.
    shapes: Vec<Option<(u64, u64)>>,
}

/// Per parameter of `program`: whether a graph that is kept references it (the weight of
/// a linear layer whose input requires grad: the matmul saves it).
fn saved_by_graph(program: &Program) -> Vec<bool> {
    let mut saved = vec![false; program.params.len()];
    for op in &program.ops {
        if op.kind == OpKind::Linear
            && program.values[op.inputs[0] as usize].requires_grad
            && let Some(&w) = program.params_of(op).first()
        {
            saved[w as usize] = true;
        }
    }
    saved
}

/// The model state of trainable parameters (`trainable`) beside frozen ones (`frozen`, as
/// if they were trainable): the frozen ones add their parameter bytes alone.
pub(super) fn with_frozen(trainable: ModelStateBytes, frozen: ModelStateBytes) -> ModelStateBytes {
    ModelStateBytes {
        parameters: trainable.parameters + frozen.parameters - frozen.master_weights,
        ..trainable
    }
}

/// The optimizer (as far as memory goes), the ZeRO sharding and the gradients' dtype of
/// `plan` under `profile`: state in the dtype the framework gives it.
pub(super) fn state_config(
    plan: &Plan,
    profile: &FrameworkProfile,
) -> (OptimizerConfig, Sharding, Dtype) {
    let compute = plan.precision.compute;
    let grad_dtype = plan.precision.grads.unwrap_or(compute);
    // bitsandbytes' 8-bit step is its CPU backend's composed kernel on a CPU device and one
    // fused kernel (no scratch) on a GPU
    let implementation = if plan.optimizer.kind == OptimizerKind::AdamW8bit
        && plan.device.kind != trainmem_core::plan::DeviceKind::Cpu
    {
        trainmem_core::StepImpl::Fused
    } else {
        plan.optimizer.implementation
    };
    let opt = OptimizerConfig {
        kind: plan.optimizer.kind,
        allocation: plan.optimizer.state,
        implementation,
        state_dtype: match profile.optimizer.state_dtype {
            StateDtype::Gradients => grad_dtype,
            StateDtype::Plan => plan.optimizer.state_dtype,
        },
        amsgrad: plan.optimizer.amsgrad,
        param_dtype: compute,
        master_weights: plan.precision.master_weights,
    };
    let sharding = Sharding {
        world_size: plan.parallel.world_size,
        zero_stage: plan.parallel.zero_stage,
    };
    (opt, sharding, grad_dtype)
}

/// Whether model construction makes the optimizer state's own buffers: eager allocation,
/// unless the framework's first momentum velocity is the gradient itself (then there is
/// nothing to make before the first step).
pub(super) fn state_made_at_construction(
    opt: &OptimizerConfig,
    profile: &FrameworkProfile,
) -> bool {
    opt.allocation == StateAllocation::Eager
        && !(profile.optimizer.momentum_first_velocity_is_gradient
            && opt.kind == OptimizerKind::Momentum)
}

impl ModelState {
    /// Nothing allocated yet; the optimizer and sharding of `spec`'s plan, state in the
    /// dtype the framework gives it.
    pub(super) fn new(spec: &RunSpec<'_>) -> ModelState {
        let (opt, sharding, grad_dtype) = state_config(spec.plan, spec.profile);
        ModelState {
            opt,
            sharding,
            grad_dtype,
            params: Vec::new(),
            beside_params: Vec::new(),
            optimizer_state: Vec::new(),
            buffers: Vec::new(),
            shared_state: None,
            state_ready: false,
            ddp_buckets: Vec::new(),
            optimizer_records: None,
            host_records: HostRecords::default(),
            saved_by_graph: saved_by_graph(spec.program),
            shapes: if opt.kind == OptimizerKind::Adafactor {
                crate::param_shapes::matrix_shapes(spec.program)
            } else {
                Vec::new()
            },
        }
    }

    /// Model construction: each parameter (and its master copy), the framework's
    /// per-tensor bookkeeping, and the optimizer state if it is made eagerly.
    pub(super) fn construct(
        &mut self,
        store: &mut TensorStore<SimMemory>,
        spec: &RunSpec<'_>,
    ) -> Result<(), SimOom> {
        let compute = spec.plan.precision.compute;
        let program = spec.program;
        for p in &program.params {
            let t = store.alloc(
                self.sharding.param_elems(p.elems) * compute.size(),
                Category::Parameter,
            )?;
            self.params.push(t);
            // a frozen parameter is never updated: no master copy
            let master = self.opt.master_bytes(self.sharding.state_elems(p.elems));
            if master > 0 && !p.frozen {
                let t = store.alloc(master, Category::Parameter)?;
                self.beside_params.push(t);
            }
        }
        if let trainmem_core::model::ModelSpec::Transformer(t) = &spec.plan.model
            && t.mask_buffer_bytes() > 0
        {
            // one mask per block
            let each = t.mask_buffer_bytes() / t.layers;
            for _ in 0..t.layers {
                self.buffers.push(store.alloc(each, Category::Other)?);
            }
        }
        let per_tensor = spec.profile.bookkeeping.per_param_tensor;
        if per_tensor > 0 && !program.params.is_empty() {
            let b = per_tensor * program.params.len() as u64;
            // the framework's records are host memory: device bytes only on a CPU device
            if spec.cpu {
                let t = store.alloc(b, Category::Parameter)?;
                self.beside_params.push(t);
            } else {
                self.host_records.param_records = b;
            }
        }
        let shared = self.opt.shared_state_bytes();
        if shared > 0 {
            self.shared_state = Some(store.alloc(shared, Category::OptimizerState)?);
        }
        if self.opt.allocation == StateAllocation::Eager {
            self.alloc_state(store, spec, &[])?;
        }
        Ok(())
    }

    /// Makes the optimizer state if the buffers of its own do not exist yet (`grads` are
    /// the parameters' current gradients).
    pub(super) fn ensure_state(
        &mut self,
        store: &mut TensorStore<SimMemory>,
        spec: &RunSpec<'_>,
        grads: &[Option<TensorId>],
    ) -> Result<(), SimOom> {
        if self.state_ready {
            return Ok(());
        }
        self.alloc_state(store, spec, grads)
    }

    fn alloc_state(
        &mut self,
        store: &mut TensorStore<SimMemory>,
        spec: &RunSpec<'_>,
        grads: &[Option<TensorId>],
    ) -> Result<(), SimOom> {
        if spec.profile.optimizer.momentum_first_velocity_is_gradient
            && self.opt.kind == OptimizerKind::Momentum
            && self.optimizer_state.is_empty()
        {
            // the first velocity is the gradient tensor itself (a reference, tagged
            // `gradient`); the next step replaces it with a new tensor (below).
            for g in grads.iter().flatten() {
                store.retain(*g);
                self.optimizer_state.push(*g);
            }
            return Ok(());
        }
        let aliased: Vec<TensorId> = self.optimizer_state.drain(..).collect();
        for (i, p) in spec.program.params.iter().enumerate() {
            if p.frozen {
                continue;
            }
            let matrix = self.shapes.get(i).copied().flatten();
            for b in self.opt.state_bytes_of(p.elems, matrix, self.sharding) {
                let t = store.alloc(b, Category::OptimizerState)?;
                self.optimizer_state.push(t);
            }
        }
        for t in aliased {
            store.release(t);
        }
        self.state_ready = true;
        Ok(())
    }

    /// Makes the optimizer's bookkeeping at the first step, kept for the optimizer's life
    /// (if the framework keeps any).
    pub(super) fn ensure_records(
        &mut self,
        store: &mut TensorStore<SimMemory>,
        spec: &RunSpec<'_>,
    ) -> Result<(), SimOom> {
        if let Some(records) = spec.profile.bookkeeping.optimizer_records
            && self.optimizer_records.is_none()
        {
            let trainable = spec.program.params.iter().filter(|p| !p.frozen).count();
            let b = (records.bytes)(self.opt.kind, trainable as u64);
            if spec.cpu {
                self.optimizer_records = Some(store.alloc(b, Category::OptimizerState)?);
            } else {
                self.host_records.optimizer_records = b;
            }
        }
        Ok(())
    }

    /// Parameters the step writes into new buffers ([`ParamUpdate::WhenUniquelyOwned`]):
    /// every parameter under AdamW (under any optimizer with [`ParamUpdate::NewBuffer`]),
    /// and, when `kept_graphs` (graphs kept without backward exist), the weights they
    /// reference. The new buffer is allocated inside the step
    /// (`optimizer_state`); the old one is freed, or returned with its parameter's layer
    /// (it stays with the kept graphs until they are released).
    ///
    /// Under [`crate::profile::GpuRules::sgd_rewrite_in_gradient`] on a GPU, plain SGD writes
    /// such a parameter into its gradient's buffer (`grads`: the parameters' gradients), which
    /// stays a `gradient` tensor.
    pub(super) fn rewrite_params(
        &mut self,
        store: &mut TensorStore<SimMemory>,
        spec: &RunSpec<'_>,
        kept_graphs: bool,
        grads: &[Option<TensorId>],
    ) -> Result<Vec<(u32, TensorId)>, SimOom> {
        let mut pinned = Vec::new();
        // every trainable parameter is written anew: all of them under AdamW or fusion
        let every = match spec.profile.optimizer.param_update {
            ParamUpdate::InPlace => return Ok(pinned),
            ParamUpdate::WhenUniquelyOwned => self.opt.kind == OptimizerKind::AdamW,
            ParamUpdate::NewBuffer => true,
        };
        for i in 0..self.params.len() {
            let pin = kept_graphs && self.saved_by_graph[i];
            if !((every && !spec.program.params[i].frozen) || pin) {
                continue;
            }
            let old = self.params[i];
            let into_gradient = !spec.cpu
                && spec.profile.gpu.sgd_rewrite_in_gradient
                && self.opt.kind == OptimizerKind::Sgd;
            let new = match grads.get(i).copied().flatten() {
                Some(g) if into_gradient => {
                    store.retain(g);
                    g
                }
                _ => store.alloc(store.size(old), Category::OptimizerState)?,
            };
            self.params[i] = new;
            if pin {
                pinned.push((spec.program.params[i].layer, old));
            } else {
                store.release(old);
            }
        }
        Ok(pinned)
    }

    /// DDP's gradient buckets (25 MiB each, as large as the gradients together), made at
    /// the first backward of a data-parallel run without ZeRO.
    pub(super) fn ensure_ddp_buckets(
        &mut self,
        store: &mut TensorStore<SimMemory>,
        spec: &RunSpec<'_>,
    ) -> Result<(), SimOom> {
        let parallel = &spec.plan.parallel;
        if !self.ddp_buckets.is_empty() || parallel.world_size <= 1 || parallel.zero_stage != 0 {
            return Ok(());
        }
        let total: u64 = spec
            .program
            .params
            .iter()
            .filter(|p| !p.frozen)
            .map(|p| p.elems * self.grad_dtype.size())
            .sum();
        let mut left = total;
        while left > 0 {
            let b = left.min(DDP_BUCKET_BYTES);
            let t = store.alloc(b, Category::Gradient)?;
            self.ddp_buckets.push(t);
            left -= b;
        }
        Ok(())
    }

    /// Steady-state model-state bytes of `program`'s parameters (parameters, gradients,
    /// optimizer state; frozen parameters have neither gradients, state nor master copies).
    pub(super) fn bytes(&self, program: &Program) -> ModelStateBytes {
        let elems = |frozen: bool| -> Vec<u64> {
            program
                .params
                .iter()
                .filter(|p| p.frozen == frozen)
                .map(|p| p.elems)
                .collect()
        };
        let trainable = model_state_bytes(&self.opt, self.grad_dtype, self.sharding, &elems(false));
        let frozen = model_state_bytes(&self.opt, self.grad_dtype, self.sharding, &elems(true));
        let mut bytes = with_frozen(trainable, frozen);
        if !self.shapes.is_empty() {
            // factored state: sized by each parameter's shape
            bytes.optimizer_state = program
                .params
                .iter()
                .zip(&self.shapes)
                .filter(|(p, _)| !p.frozen)
                .flat_map(|(p, &m)| self.opt.state_elems_of(p.elems, m))
                .map(|e| self.sharding.state_elems(e) * self.opt.state_dtype.size())
                .sum();
        }
        bytes
    }

    /// Bytes of the model-state tensors alive now, besides the gradients (the model's buffers
    /// included).
    pub(super) fn live_bytes(&self, store: &TensorStore<SimMemory>) -> u64 {
        self.params
            .iter()
            .chain(&self.beside_params)
            .chain(&self.optimizer_state)
            .chain(&self.shared_state)
            .chain(&self.ddp_buckets)
            .chain(&self.buffers)
            .map(|&t| store.size(t))
            .sum()
    }

    /// Frees the optimizer's bookkeeping.
    pub(super) fn release_records(&mut self, store: &mut TensorStore<SimMemory>) {
        if let Some(t) = self.optimizer_records.take() {
            store.release(t);
        }
    }

    /// Frees the parameters, what is kept beside them, the optimizer state and the DDP
    /// buckets.
    pub(super) fn release(&mut self, store: &mut TensorStore<SimMemory>) {
        for t in self
            .params
            .drain(..)
            .chain(self.beside_params.drain(..))
            .chain(self.optimizer_state.drain(..))
            .chain(self.shared_state.take())
            .chain(self.ddp_buckets.drain(..))
            .chain(self.buffers.drain(..))
        {
            store.release(t);
        }
    }
}

/// The framework's records (parameter wrappers, the optimizer's per-parameter records) in
/// host memory, when the tensors are on a GPU: bytes per category of the host side.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostRecords {
    /// Beside the parameters, from construction on (`parameter`).
    pub param_records: u64,
    /// The optimizer's, from the first step on (`optimizer_state`).
    pub optimizer_records: u64,
}
