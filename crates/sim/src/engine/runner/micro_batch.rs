//! One micro-batch: its batch loaded, its forward (and the forward of an output kept with a
//! graph of its own), its backward and what is kept or freed after it.

use trainmem_autograd::{Tape, TensorId, ValueDtype};
use trainmem_core::Category;

use super::Runner;
use crate::engine::memory::SimOom;
use crate::profile::DroppedGraphs;
use trainmem_core::timeline::Phase;

impl Runner<'_> {
    /// Loads a micro-batch (`samples` read from the data set) and runs its forward
    /// (`batch_loaded`, `forward`); returns its tape and batch.
    pub(super) fn forward_micro_batch(
        &mut self,
        samples: u64,
    ) -> Result<(Tape, Vec<TensorId>), SimOom> {
        self.begin(Phase::BatchLoaded);
        let scale = self.clock.next_scale(self.spec.plan.data.size_variation);
        let moment = &mut self.host.moment;
        moment.scale = scale;
        // on a CPU backend the batch tensors may be the loader's host batch (one copy,
        // counted by the store), not a host copy beside a device copy
        moment.batch_on_host = !(self.spec.cpu && self.spec.profile.cpu.batch_is_host_batch);
        moment.samples_read += samples;
        moment.batches_loaded += 1;
        moment.epoch_batches_taken += 1;
        let inputs = self.load_batch(scale)?;
        self.sample(Phase::BatchLoaded);
        self.host.moment.batch_on_host = false;
        self.host.moment.batches_since_start += 1;
        self.begin(Phase::Forward);
        let micro = self.spec.plan.micro_batch_size();
        if self.keeps_graphs_without_backward() {
            // the kept output comes from a forward of its own, never backwarded
            for &t in &inputs {
                self.store.retain(t);
            }
            let kept = self
                .autograd
                .forward_kept(&mut self.store, &inputs, micro, scale)?;
            self.retention.keep_graph(kept);
        }
        let tape = self
            .autograd
            .forward(&mut self.store, &inputs, micro, scale)?;
        self.sample(Phase::Forward);
        Ok((tape, inputs))
    }

    /// The batch's tensors at size factor `scale`: `activation` for an input that requires
    /// grad (a pipeline stage's received activations), `input` otherwise.
    fn load_batch(&mut self, scale: f64) -> Result<Vec<TensorId>, SimOom> {
        let (plan, program) = (self.spec.plan, self.spec.program);
        let micro = plan.micro_batch_size();
        let mut out = Vec::with_capacity(program.inputs.len());
        for &v in &program.inputs {
            let info = program.values[v as usize];
            let size = match info.dtype {
                ValueDtype::Compute => plan.precision.compute.size(),
                ValueDtype::Fixed(d) => d.size(),
            };
            let cat = if info.requires_grad {
                Category::Activation
            } else {
                Category::Input
            };
            out.push(self.store.alloc(info.elems(micro, scale) * size, cat)?);
        }
        Ok(out)
    }

    /// Backward through a micro-batch's `tape` (`backward`), then what follows it: dropped
    /// graphs freed a layer further, DDP's buckets, the batch freed, the tape kept or
    /// freed, the metrics when the framework records them per micro-batch.
    pub(super) fn backward_micro_batch(
        &mut self,
        mut tape: Tape,
        inputs: Vec<TensorId>,
    ) -> Result<(), SimOom> {
        let profile = self.spec.profile;
        self.begin(Phase::Backward);
        self.autograd.backward(&mut self.store, &mut tape)?;
        if profile.autograd.dropped_graphs == DroppedGraphs::OneLayerPerBackward {
            self.retention
                .free_orphaned_layer(&mut self.store, self.spec.program);
        }
        self.state.ensure_ddp_buckets(&mut self.store, &self.spec)?;
        if !profile.autograd.forward_owns_batch {
            // (otherwise the forward pass took the batch over)
            for t in inputs {
                self.store.release(t);
            }
        }
        self.sample(Phase::Backward);
        self.retention
            .after_backward(&mut self.store, tape, self.spec.plan, profile);
        if profile.metrics_after_backward() {
            // per micro-batch right after its backward pass, before the optimizer step
            // (the held logits are dropped then)
            self.record_metrics();
        }
        Ok(())
    }

    /// Outputs are kept with a graph of their own that is never backwarded.
    pub(super) fn keeps_graphs_without_backward(&self) -> bool {
        let leak = &self.spec.plan.leak;
        leak.retain_outputs
            && leak.retain_graph
            && self.spec.profile.kept_graph_is_separate_forward()
    }
}
