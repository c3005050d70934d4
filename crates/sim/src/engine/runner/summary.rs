//! The end of a stage's simulation: the out-of-memory report, fragmentation, what is
//! retained beyond model state, teardown, and the [`Summary`].

use trainmem_alloc::Snapshot;

use super::Runner;
use crate::engine::memory::{SimMemory, SimOom};
use crate::engine::{Fragmentation, OomReport, Summary};
use trainmem_core::timeline::{Phase, Timeline};

impl Runner<'_> {
    /// The stage's timeline, summary and (with `keep_snapshot`) the allocator's snapshot,
    /// after `outcome` of a run of `total` steps; tears the run down.
    pub(super) fn finish(
        mut self,
        outcome: Result<(), SimOom>,
        total: u64,
        keep_snapshot: bool,
    ) -> (Timeline, Summary, Option<Snapshot>) {
        let oom = outcome.err().map(|e| self.out_of_memory(e));
        let end = self
            .recorder
            .timeline
            .samples
            .last()
            .map(|s| s.device.allocated)
            .unwrap_or(0);
        let mem = self.store.memory();
        // The figures come from the blocks directly: a snapshot copies every block and the
        // trace, which is only worth it when the export asks for one.
        let fragmentation = fragmentation(mem);
        let snapshot = if keep_snapshot { mem.snapshot() } else { None };
        let retained = end.saturating_sub(self.steady_bytes());
        let steps = if oom.is_some() {
            self.clock.step
        } else {
            total
        };
        let peak_allocated = self.store.peak().0;
        let timeline = &self.recorder.timeline;
        let peak_reserved = timeline.peak_reserved().map_or(0, |p| p.bytes);
        let peak_host_rss = timeline.peak_host_rss().map_or(0, |p| p.bytes);
        let ended = timeline
            .samples
            .last()
            .is_some_and(|s| s.phase == Phase::End);
        let all_freed = self.teardown();
        let program = self.spec.program;
        let summary = Summary {
            stage: self.spec.stage,
            parameters: program.params.iter().map(|p| p.elems).sum(),
            model_state: self.state.bytes(program),
            peak_allocated,
            peak_when: self.recorder.peak_when,
            peak_breakdown: self.recorder.peak_breakdown,
            peak_reserved,
            peak_host_rss,
            fragmentation,
            oom,
            steps,
            allocations: self.store.allocation_count(),
            retained_at_end: if ended { retained } else { 0 },
            all_freed_at_teardown: all_freed,
            checkpointing: self.autograd.checkpointing,
            tensor_peaks: self.recorder.tensor_peaks,
        };
        (self.recorder.timeline, summary, snapshot)
    }

    /// The report of an allocation that failed, with a last `out_of_memory` sample.
    fn out_of_memory(&mut self, e: SimOom) -> OomReport {
        let when = self.clock.when(self.clock.in_phase);
        self.sample(Phase::OutOfMemory);
        OomReport {
            message: e.message,
            requested: e.requested,
            category: e.category.name().to_string(),
            when,
        }
    }

    /// Bytes of the steady state alive now: model state, gradients and the BLAS library's
    /// workspaces.
    fn steady_bytes(&self) -> u64 {
        self.state.live_bytes(&self.store)
            + self.autograd.hooks.blas.live_bytes(&self.store)
            + self
                .autograd
                .graph
                .param_grads
                .iter()
                .flatten()
                .map(|&t| self.store.size(t))
                .sum::<u64>()
    }

    /// Frees everything; whether every allocation was freed.
    fn teardown(&mut self) -> bool {
        self.retention.release(&mut self.store);
        self.state.release_records(&mut self.store);
        self.autograd.drop_grads(&mut self.store);
        self.autograd.hooks.blas.release(&mut self.store);
        self.state.release(&mut self.store);
        self.store.live_total() == 0 && self.store.memory().allocated() == 0
    }
}

/// The allocator's fragmentation now (zero for exact counting).
fn fragmentation(mem: &SimMemory) -> Fragmentation {
    let f = mem.cache_figures().unwrap_or_default();
    Fragmentation {
        cached_unallocated: mem.reserved().saturating_sub(mem.allocated()),
        largest_free_block: f.largest_free_block,
        non_releasable: f.non_releasable,
        releasable: f.releasable,
    }
}
