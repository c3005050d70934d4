//! The loader's own memory accounting, readable at any time.
//!
//! Every term is a byte count the loader tracks itself (independently of any global allocator),
//! so a simulator can predict each one:
//!
//! * `queue`: finished batches waiting in the result channel for the consumer;
//! * `reorder`: finished batches that arrived ahead of their turn, held to keep sampler order;
//! * `building`: output buffers of batches being built right now (allocated through
//!   [`crate::WorkerContext::alloc_buffer`]);
//! * `scratch`: per-batch worker scratch (from [`crate::WorkerContext::scratch_f32`]), freed at
//!   the end of each batch;
//! * `staging_idle`: pooled batch buffers (page-locked with `pin_memory`, reused with
//!   `reuse_buffers`) parked in the pool, owned by no batch;
//! * `sampler`: the epoch's index list (8 bytes per sample of the shard).
//!
//! `total = queue + reorder + building + scratch + staging_idle + sampler`. A batch's bytes
//! are its [`crate::HeldBytes`]; while it is in flight it counts once (in `building`, then
//! `queue` or `reorder`), and not at all once delivered to the caller. With `W` workers and
//! prefetch factor `P`, at most `P·W` batches are in `building + queue + reorder`, so
//! `queue + reorder + building ≤ P·W × batch bytes` and `scratch ≤ W × scratch per batch`.
//!
//! `staging` (all pooled bytes, idle or held by batches, the caller's included),
//! `staging_pinned` (the part that is page-locked) and `pin_failures` describe the pool; it only
//! grows when no idle block fits, so `staging ≤ (P·W + batches the caller holds) × batch bytes`
//! (page-rounded per column). when `mlock` fails (for example
//! under a low `RLIMIT_MEMLOCK`) the buffer is used unpinned and the failure is counted here.

use std::sync::atomic::{AtomicUsize, Ordering};

use serde::{Deserialize, Serialize};

/// A reading of the loader's memory, in bytes (or a reading of its peaks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct LoaderMemory {
    /// Finished batches waiting for the consumer.
    pub queue: usize,
    /// Finished batches held out of order.
    pub reorder: usize,
    /// Output buffers of batches being built.
    pub building: usize,
    /// Worker scratch of the batches being built.
    pub scratch: usize,
    /// Idle staging buffers in the pool.
    pub staging_idle: usize,
    /// The epoch's index list.
    pub sampler: usize,
    /// All staging buffers (idle or held by batches).
    pub staging: usize,
    /// Staging bytes that are page-locked.
    pub staging_pinned: usize,
    /// Staging buffers that could not be pinned (used unpinned instead).
    pub pin_failures: usize,
    /// Batches in `queue` and `reorder`.
    pub ready_batches: usize,
    /// `queue + reorder + building + scratch + staging_idle + sampler`.
    pub total: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Term {
    Queue,
    Reorder,
    Building,
    Scratch,
    StagingIdle,
    Sampler,
    Staging,
    StagingPinned,
    PinFailures,
    ReadyBatches,
}

const TERMS: usize = 10;

impl Term {
    fn in_total(self) -> bool {
        matches!(
            self,
            Term::Queue
                | Term::Reorder
                | Term::Building
                | Term::Scratch
                | Term::StagingIdle
                | Term::Sampler
        )
    }
}

/// A cloneable handle on a loader's memory counters, readable from anywhere (another thread,
/// or while an [`crate::Epoch`] borrows the loader).
#[derive(Debug, Clone)]
pub struct MemoryWatch(pub(crate) std::sync::Arc<MemoryCounters>);

impl MemoryWatch {
    /// The loader's bytes right now.
    pub fn current(&self) -> LoaderMemory {
        self.0.current()
    }

    /// The largest value each term reached since creation or the last peak reset.
    pub fn peaks(&self) -> LoaderMemory {
        self.0.peaks()
    }

    /// Lowers every peak to the current value.
    pub fn reset_peaks(&self) {
        self.0.reset_peaks();
    }
}

/// Shared atomic counters behind [`LoaderMemory`].
#[derive(Debug, Default)]
pub(crate) struct MemoryCounters {
    now: [AtomicUsize; TERMS],
    peak: [AtomicUsize; TERMS],
    total: AtomicUsize,
    total_peak: AtomicUsize,
}

impl MemoryCounters {
    pub(crate) fn add(&self, term: Term, bytes: usize) {
        let i = term as usize;
        let v = self.now[i].fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak[i].fetch_max(v, Ordering::Relaxed);
        if term.in_total() {
            let t = self.total.fetch_add(bytes, Ordering::Relaxed) + bytes;
            self.total_peak.fetch_max(t, Ordering::Relaxed);
        }
    }

    pub(crate) fn sub(&self, term: Term, bytes: usize) {
        self.now[term as usize].fetch_sub(bytes, Ordering::Relaxed);
        if term.in_total() {
            self.total.fetch_sub(bytes, Ordering::Relaxed);
        }
    }

    fn read(&self, values: &[AtomicUsize; TERMS], total: &AtomicUsize) -> LoaderMemory {
        let g = |t: Term| values[t as usize].load(Ordering::Relaxed);
        LoaderMemory {
            queue: g(Term::Queue),
            reorder: g(Term::Reorder),
            building: g(Term::Building),
            scratch: g(Term::Scratch),
            staging_idle: g(Term::StagingIdle),
            sampler: g(Term::Sampler),
            staging: g(Term::Staging),
            staging_pinned: g(Term::StagingPinned),
            pin_failures: g(Term::PinFailures),
            ready_batches: g(Term::ReadyBatches),
            total: total.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn current(&self) -> LoaderMemory {
        self.read(&self.now, &self.total)
    }

    pub(crate) fn peaks(&self) -> LoaderMemory {
        self.read(&self.peak, &self.total_peak)
    }

    pub(crate) fn reset_peaks(&self) {
        for i in 0..TERMS {
            self.peak[i].store(self.now[i].load(Ordering::Relaxed), Ordering::Relaxed);
        }
        self.total_peak
            .store(self.total.load(Ordering::Relaxed), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn total_and_peaks() {
        let m = MemoryCounters::default();
        m.add(Term::Queue, 100);
        m.add(Term::Scratch, 50);
        m.add(Term::Staging, 4096);
        m.sub(Term::Queue, 100);
        m.add(Term::Reorder, 30);
        let now = m.current();
        assert_eq!(
            (now.queue, now.reorder, now.scratch, now.total),
            (0, 30, 50, 80)
        );
        assert_eq!(now.staging, 4096);
        let peak = m.peaks();
        assert_eq!((peak.queue, peak.total), (100, 150));
        m.reset_peaks();
        assert_eq!(m.peaks().total, 80);
    }
}
