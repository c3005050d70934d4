//! [`WorkerContext`]: what a batch builder sees while it builds one batch — which worker and
//! batch it is, a reproducible random generator, scratch memory and output buffers that the
//! loader accounts for.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::engine::batch_writer::BatchWriter;
use crate::engine::memory::{MemoryCounters, Term};
use crate::engine::staging::{BatchBuffer, StagingPool};
use crate::rng::Rng;

/// Per-worker state handed to the batch builder.
#[derive(Debug)]
pub struct WorkerContext {
    worker: Option<usize>,
    num_workers: usize,
    epoch: u64,
    batch: usize,
    rng: Rng,
    sample: Option<usize>,
    scratch: Vec<f32>,
    scratch_counted: usize,
    building_counted: usize,
    memory: Arc<MemoryCounters>,
    staging: Option<Arc<StagingPool>>,
    cancel: Option<Arc<AtomicBool>>,
}

impl WorkerContext {
    pub(crate) fn new(
        worker: Option<usize>,
        num_workers: usize,
        memory: Arc<MemoryCounters>,
        staging: Option<Arc<StagingPool>>,
    ) -> WorkerContext {
        WorkerContext {
            worker,
            num_workers,
            epoch: 0,
            batch: 0,
            rng: Rng::new(0),
            sample: None,
            scratch: Vec::new(),
            scratch_counted: 0,
            building_counted: 0,
            memory,
            staging,
            cancel: None,
        }
    }

    /// The worker's id in `0..num_workers`, or `None` when building in the caller's thread.
    pub fn worker_id(&self) -> Option<usize> {
        self.worker
    }

    /// Number of worker threads (0 when building in the caller's thread).
    pub fn num_workers(&self) -> usize {
        self.num_workers
    }

    /// The epoch being loaded.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The batch being built (its position in the epoch).
    pub fn batch_index(&self) -> usize {
        self.batch
    }

    /// A generator seeded from `(config seed, epoch, batch)`: the same draws for the same batch
    /// whichever worker builds it, so augmentation is reproducible with any worker count.
    pub fn rng(&mut self) -> &mut Rng {
        &mut self.rng
    }

    /// Names the sample being processed, so a failure or panic is reported against it.
    pub fn set_sample(&mut self, index: usize) {
        self.sample = Some(index);
    }

    /// Forgets the current sample (for batch-level steps such as collate).
    pub fn clear_sample(&mut self) {
        self.sample = None;
    }

    /// The sample named by the last [`Self::set_sample`].
    pub fn current_sample(&self) -> Option<usize> {
        self.sample
    }

    /// Whether the consumer has stopped this epoch (a builder may return early).
    pub fn is_cancelled(&self) -> bool {
        self.cancel
            .as_ref()
            .is_some_and(|c| c.load(Ordering::Relaxed))
    }

    /// Scratch memory of at least `len` floats, valid until the end of this batch; it grows to
    /// the largest request of the batch and is freed when the batch is done, so the loader's
    /// `scratch` bytes follow what each batch needs.
    pub fn scratch_f32(&mut self, len: usize) -> &mut [f32] {
        if self.scratch.len() < len {
            self.scratch.reserve_exact(len - self.scratch.len());
            self.scratch.resize(len, 0.0);
            let bytes = self.scratch.capacity() * 4;
            self.memory.add(Term::Scratch, bytes - self.scratch_counted);
            self.scratch_counted = bytes;
        }
        &mut self.scratch[..len]
    }

    /// A zeroed output buffer of `len` bytes for the batch: a reusable page-locked staging
    /// block when `pin_memory` is on, a 64-byte-aligned heap block otherwise. It counts as
    /// `building` until the batch is finished.
    pub fn alloc_buffer(&mut self, len: usize) -> BatchBuffer {
        let buf = match &self.staging {
            Some(pool) => BatchBuffer::staged(pool, len),
            None => BatchBuffer::heap(len),
        };
        self.building_counted += buf.capacity();
        self.memory.add(Term::Building, buf.capacity());
        buf
    }

    /// An output buffer of `len` bytes filled with `parts` back to back in one pass (no
    /// zeroing first; bytes past the parts are zeroed). Staged and accounted like
    /// [`Self::alloc_buffer`].
    pub fn alloc_concat<'a>(
        &mut self,
        len: usize,
        parts: impl IntoIterator<Item = &'a [u8]>,
    ) -> BatchBuffer {
        let buf = BatchBuffer::concat(self.staging.as_ref(), len, parts);
        self.building_counted += buf.capacity();
        self.memory.add(Term::Building, buf.capacity());
        buf
    }

    /// An output buffer of `len` bytes to be written front to back with a [`BatchWriter`]
    /// (rows, runs of one byte, a repeated element; every byte once, no zeroing first; bytes
    /// left unwritten are zeroed by [`BatchWriter::finish`]). Staged and accounted like
    /// [`Self::alloc_buffer`].
    pub fn writer(&mut self, len: usize) -> BatchWriter {
        let w = BatchWriter::new(self.staging.as_ref(), len);
        let capacity = w.capacity();
        self.building_counted += capacity;
        self.memory.add(Term::Building, capacity);
        w
    }

    pub(crate) fn begin_batch(
        &mut self,
        epoch: u64,
        batch: usize,
        seed: u64,
        cancel: Option<Arc<AtomicBool>>,
    ) {
        self.epoch = epoch;
        self.batch = batch;
        self.rng = Rng::new(seed);
        self.sample = None;
        self.cancel = cancel;
    }

    pub(crate) fn end_batch(&mut self) {
        self.scratch = Vec::new();
        self.memory.sub(Term::Scratch, self.scratch_counted);
        self.scratch_counted = 0;
        self.memory.sub(Term::Building, self.building_counted);
        self.building_counted = 0;
        self.cancel = None;
    }
}

impl Drop for WorkerContext {
    fn drop(&mut self) {
        self.end_batch();
    }
}
