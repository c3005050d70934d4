//! The optimizer step: state made lazily, the framework's bookkeeping, parameters written
//! into new buffers, the step's scratch buffers, gradients consumed or zeroed.

use trainmem_autograd::{Program, TensorStore};
use trainmem_core::Category;
use trainmem_optim::{OptimizerConfig, Sharding};

use super::Runner;
use crate::engine::memory::{SimMemory, SimOom};
use trainmem_core::timeline::Phase;

impl Runner<'_> {
    /// The optimizer step (`optimizer_step`), then `zero_grad` with `grads_to_none` unless
    /// the step consumed the gradients.
    pub(super) fn optimizer_step(&mut self) -> Result<(), SimOom> {
        self.begin(Phase::OptimizerStep);
        self.state.ensure_state(
            &mut self.store,
            &self.spec,
            &self.autograd.graph.param_grads,
        )?;
        self.state.ensure_records(&mut self.store, &self.spec)?;
        self.host.moment.records = self.state.host_records;
        let kept_graphs = self.keeps_graphs_without_backward();
        let pinned = self.state.rewrite_params(
            &mut self.store,
            &self.spec,
            kept_graphs,
            &self.autograd.graph.param_grads,
        )?;
        self.retention.pin(pinned);
        step_temporaries(
            &mut self.store,
            &self.state.opt,
            self.state.sharding,
            self.spec.program,
        )?;
        let consumes_grads = self.spec.profile.optimizer.step_consumes_grads;
        if consumes_grads {
            // the step consumed the gradients (there is no zero_grad)
            self.autograd.drop_grads(&mut self.store);
        }
        self.sample(Phase::OptimizerStep);
        if self.spec.plan.training.grads_to_none && !consumes_grads {
            self.begin(Phase::ZeroGrad);
            self.autograd.grads_to_none(&mut self.store);
            self.sample(Phase::ZeroGrad);
        }
        Ok(())
    }
}

/// The step's scratch buffers (trainmem-optim `step_temporaries`): all at once (foreach),
/// or one parameter's at a time (for-loop), each freed before the step ends.
fn step_temporaries(
    store: &mut TensorStore<SimMemory>,
    opt: &OptimizerConfig,
    sharding: Sharding,
    program: &Program,
) -> Result<(), SimOom> {
    let elems: Vec<u64> = program
        .params
        .iter()
        .filter(|p| !p.frozen)
        .map(|p| sharding.state_elems(p.elems))
        .collect();
    let temps = opt.step_temporaries(&elems);
    let size = temps.dtype.size();
    if temps.all_at_once {
        let mut live = Vec::with_capacity(temps.buffers.len());
        for &e in &temps.buffers {
            live.push(store.alloc(e * size, Category::Temporary)?);
        }
        for t in live {
            store.release(t);
        }
    } else if temps.per_param > 0 {
        let mut live = Vec::with_capacity(temps.per_param);
        for chunk in temps.buffers.chunks(temps.per_param) {
            // zero-sized entries pad a parameter that needs fewer buffers than the others
            for &e in chunk.iter().filter(|&&e| e > 0) {
                live.push(store.alloc(e * size, Category::Temporary)?);
            }
            for t in live.drain(..) {
                store.release(t);
            }
        }
    }
    Ok(())
}
