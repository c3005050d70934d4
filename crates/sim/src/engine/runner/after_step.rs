//! After the optimizer step: metrics recorded (when the framework records them per step),
//! kept outputs dropped every `leak.clear_every` steps, a checkpoint saved every
//! `training.checkpoint_every` steps, the cache emptied when the plan asks every step.

use trainmem_core::Category;
use trainmem_core::Dtype;

use super::Runner;
use crate::profile::CheckpointRecord;
use trainmem_core::plan::{EmptyCachePolicy, MetricRetention};
use trainmem_core::timeline::Phase;

impl Runner<'_> {
    /// Everything after the optimizer step (see the module docs). A checkpoint's temporary
    /// copy can run out of memory like any allocation.
    pub(super) fn after_step(&mut self) -> Result<(), crate::engine::memory::SimOom> {
        let plan = self.spec.plan;
        if !self.spec.profile.metrics_after_backward() {
            // once per step, after the optimizer step
            self.record_metrics();
        }
        let ce = plan.leak.clear_every;
        if ce > 0 && (self.clock.step + 1).is_multiple_of(ce) {
            self.retention
                .clear(&mut self.store, self.spec.profile.autograd.dropped_graphs);
        }
        let every = plan.training.checkpoint_every;
        if every > 0 && (self.clock.step + 1).is_multiple_of(every) {
            self.save_checkpoint()?;
        }
        if plan.training.empty_cache == EmptyCachePolicy::EveryStep {
            self.empty_cache();
        }
        Ok(())
    }

    /// Records the metrics the plan keeps (scalars, or tensors already kept with the tape)
    /// and samples `metrics`.
    pub(super) fn record_metrics(&mut self) {
        match self.spec.plan.metrics.retention {
            MetricRetention::None => {}
            MetricRetention::Scalars => {
                self.begin(Phase::Metrics);
                self.host.moment.scalars += self.spec.plan.metrics.per_step;
                self.sample(Phase::Metrics);
            }
            MetricRetention::Tensors => {
                self.begin(Phase::Metrics);
                self.sample(Phase::Metrics);
            }
        }
    }

    /// A checkpoint is written (`checkpoint_save`), holding what the framework's record
    /// holds ([`CheckpointRecord`]): burn's f32 copy of every parameter, a `temporary` tensor
    /// on a CPU device and host memory beside a GPU's tensors; PyTorch's serialised
    /// parameters and optimizer state, host `other`.
    fn save_checkpoint(&mut self) -> Result<(), crate::engine::memory::SimOom> {
        self.begin(Phase::CheckpointSave);
        let program = self.spec.program;
        match self.spec.profile.checkpoint {
            CheckpointRecord::F32ParameterCopy => {
                let elems: u64 = program.params.iter().map(|p| p.elems).sum();
                let bytes = elems * Dtype::F32.size();
                if self.spec.cpu {
                    let t = self.store.alloc(bytes, Category::Temporary)?;
                    self.sample(Phase::CheckpointSave);
                    self.store.release(t);
                } else {
                    self.host.moment.checkpoint_copy = bytes;
                    self.sample(Phase::CheckpointSave);
                    self.host.moment.checkpoint_copy = 0;
                }
            }
            CheckpointRecord::SerialisedState => {
                let ms = self.state.bytes(program);
                self.host.moment.checkpoint_bytes = ms.parameters + ms.optimizer_state;
                self.sample(Phase::CheckpointSave);
                self.host.moment.checkpoint_bytes = 0;
            }
        }
        Ok(())
    }
}
