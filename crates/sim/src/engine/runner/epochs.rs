//! The run from start to end: model construction, then epochs of steps, with the loader's
//! workers started and stopped at epoch boundaries and the cache emptied when asked.

use super::Runner;
use crate::engine::memory::SimOom;
use trainmem_core::plan::EmptyCachePolicy;
use trainmem_core::timeline::Phase;

impl Runner<'_> {
    /// Runs `total_steps` optimizer steps (fewer if the plan has fewer), reporting
    /// (steps done, total) to `progress` after each.
    pub(super) fn run(
        &mut self,
        total_steps: u64,
        progress: &mut Option<&mut dyn FnMut(u64, u64)>,
    ) -> Result<(), SimOom> {
        self.construct_model()?;
        let per_epoch = self.spec.plan.steps_per_epoch();
        'epochs: for epoch in 0..self.spec.plan.training.epochs {
            self.start_epoch(epoch);
            for _ in 0..per_epoch {
                if self.clock.step >= total_steps {
                    break 'epochs;
                }
                self.train_step()?;
                self.clock.step += 1;
                if let Some(p) = progress.as_mut() {
                    p(self.clock.step, total_steps);
                }
            }
            self.clock.step = self.clock.step.saturating_sub(1);
            self.end_epoch();
            self.clock.step += 1;
        }
        self.clock.step = self.clock.step.saturating_sub(1);
        self.host.moment.workers_alive = false;
        self.sample(Phase::End);
        Ok(())
    }

    /// `start`, then model construction (`model_init`).
    fn construct_model(&mut self) -> Result<(), SimOom> {
        self.sample(Phase::Start);
        self.begin(Phase::ModelInit);
        self.state.construct(&mut self.store, &self.spec)?;
        self.host.moment.records = self.state.host_records;
        self.sample(Phase::ModelInit);
        Ok(())
    }

    /// An epoch starts: its sample order exists, and workers start unless persistent ones
    /// are alive.
    fn start_epoch(&mut self, epoch: u64) {
        self.clock.epoch = epoch;
        self.begin(Phase::EpochStart);
        let moment = &mut self.host.moment;
        moment.epoch_open = true;
        moment.epoch_batches_taken = 0;
        if !(self.spec.plan.loader.persistent_workers && moment.workers_alive) {
            moment.workers_alive = true;
            moment.batches_since_start = 0;
        }
        self.sample(Phase::EpochStart);
    }

    /// An epoch ends: non-persistent workers stop; the cache is emptied if the plan asks
    /// every epoch.
    fn end_epoch(&mut self) {
        self.begin(Phase::EpochEnd);
        self.host.moment.epoch_open = false;
        if !self.spec.plan.loader.persistent_workers {
            self.host.moment.workers_alive = false;
        }
        self.sample(Phase::EpochEnd);
        if self.spec.plan.training.empty_cache == EmptyCachePolicy::EveryEpoch {
            self.empty_cache();
        }
    }

    /// `empty_cache()`, sampled.
    pub(super) fn empty_cache(&mut self) {
        self.begin(Phase::EmptyCache);
        self.store.memory_mut().empty_cache();
        self.sample(Phase::EmptyCache);
    }
}
