//! [`Loader`]: worker threads that build whole batches, at most `prefetch_factor × workers`
//! in flight, delivered in sampler order.
//!
//! # How it runs
//!
//! At the start of an epoch the loader draws the epoch's order ([`EpochPlan`]), hands the first
//! `P·W` batch tasks to a shared task queue, and then hands out one new task per batch the
//! caller takes (PyTorch's credit scheme: batches queued, being built, or waiting in the reorder
//! buffer never exceed `P·W`). Workers pull tasks, build the batch with the user's
//! [`BatchBuilder`], and send it back; a batch that arrives ahead of its turn waits in the
//! reorder buffer, so the caller always sees sampler order. With `workers == 0` each batch is
//! built in the caller's thread when asked for.
//!
//! With fewer workers than CPUs, a caller whose batches have been arriving within 100 µs polls
//! for the next one before it sleeps, so that its worker does not have to wake it for every
//! batch (see the `pacing` module for when it does and does not). With as many workers as CPUs
//! or more, a worker yields its CPU after handing a batch over, so that the caller it may have
//! woken runs at once instead of waiting out the worker's time slice, and the caller looks for
//! its batch between yields of its own CPU rather than spinning on a CPU a worker needs.
//!
//! Worker threads tag themselves [`Category::Input`], so a counting global allocator
//! (trainmem-probe) attributes their bytes to input; in-caller building does the same in a
//! scope.
//!
//! # Worker lifetime
//!
//! With `persistent_workers` the threads are spawned once (at the first epoch) and reused
//! (until a timeout retires them, see below: the next epoch then spawns a fresh set);
//! otherwise a fresh set is spawned at every epoch start and joined at its end, as PyTorch does
//! by default, which is one cause of the epoch-start memory spike.
//!
//! Persistent workers also keep the pipeline full across the epoch boundary: once every task
//! of epoch `e` has been handed out, each batch the caller takes frees a slot that goes to the
//! next epoch's first batches (epoch `e + 1`, the one [`Loader::epoch`] starts next; its order
//! is already determined by the seed). The bound on batches in flight holds across both epochs,
//! so the next epoch starts with its first `P·W` batches built one at a time at the training
//! pace, instead of all workers building `P·W` batches at once after the queue ran dry: no
//! refill burst at the epoch start, and no stall. The price: after the last epoch the loader
//! holds up to `P·W` batches of an epoch that is never run, until it is dropped (or
//! [`Loader::epoch_at`] starts a different epoch, which discards them).
//!
//! # Failure and shutdown
//!
//! * A transform or collate that returns an error or panics becomes
//!   `Err(`[`LoaderError::Sample`]`)` / `Err(`[`LoaderError::Panic`]`)` for that batch, naming
//!   the sample index; the epoch continues with the next batch. A worker init hook that panics
//!   makes every batch that worker picks up an error ([`LoaderError::WorkerInit`]).
//! * With `timeout_ms`, a batch that has not arrived in time yields
//!   `Err(`[`LoaderError::Timeout`]`)` and ends the epoch. Without it the wait is unbounded but
//!   the loader checks every 100 ms that workers are alive ([`LoaderError::WorkersGone`]). The
//!   timeout does not apply with `workers == 0`.
//! * A timeout does not wait for the workers: the late batch may be stuck in a transform that
//!   never looks at the cancel flag, and a thread cannot be stopped from outside. The error
//!   comes at the deadline, the epoch's tasks are cancelled, and its workers (the per-epoch
//!   ones, or the whole persistent pool with any work built ahead) are retired unjoined: each
//!   exits as soon as the batch it is building returns, builds nothing more, and holds the
//!   data set and builder (shared, not copied) until then. [`Loader::abandoned_workers`] counts
//!   those still running. The next epoch runs on fresh workers; dropping the epoch or the
//!   loader does not wait for retired ones either (they are detached, and exit on their own).
//! * Dropping an [`Epoch`] mid-way cancels it: workers abandon its remaining tasks (checked
//!   between samples), per-epoch workers are joined before `drop` returns, persistent ones go
//!   back to waiting and are joined when the [`Loader`] is dropped. Either way no loader thread
//!   is left once every transform has returned.
//! * An empty data set (or a shard with no samples) gives an epoch with no batches. A batch
//!   size larger than the data set gives one short batch, or none with `drop_last`.

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use trainmem_core::Category;
use trainmem_probe::{CategoryScope, set_thread_category};

use crate::dataset::Dataset;
use crate::engine::build_times::{BuildClock, BuildTimes};
use crate::engine::builder::{BatchBuilder, BoxError, HeldBytes, MapCollate};
use crate::engine::config::{ConfigError, LoaderConfig, Order};
use crate::engine::context::WorkerContext;
use crate::engine::memory::{LoaderMemory, MemoryCounters, MemoryWatch, Term};
use crate::engine::pacing::{Pacing, Polled, SpinWait, WorkerCpus, current_cpu};
use crate::engine::resume::{LoaderState, ResumeError};
use crate::engine::sampler::{EpochPlan, check_epoch_len};
use crate::engine::staging::StagingPool;
use crate::error::DataError;
use crate::rng::mix;

/// How often a waiting consumer checks that its workers are still alive.
const LIVENESS_POLL: Duration = Duration::from_millis(100);

/// Errors the loader reports.
#[derive(Debug, thiserror::Error)]
pub enum LoaderError {
    /// The configuration is invalid.
    #[error("invalid loader configuration: {0}")]
    Config(#[from] ConfigError),
    /// The data set failed its epoch-start check.
    #[error(transparent)]
    Data(#[from] DataError),
    /// A transform, collate or data access returned an error.
    #[error("{} (batch {batch} of epoch {epoch}) failed: {message}", at(*.sample, *.batch))]
    Sample {
        /// Epoch.
        epoch: u64,
        /// Batch position in the epoch.
        batch: usize,
        /// The sample being processed, if known (`None` in collate).
        sample: Option<usize>,
        /// The error text.
        message: String,
    },
    /// A transform or collate panicked.
    #[error("{} (batch {batch} of epoch {epoch}) panicked: {message}", at(*.sample, *.batch))]
    Panic {
        /// Epoch.
        epoch: u64,
        /// Batch position in the epoch.
        batch: usize,
        /// The sample being processed, if known.
        sample: Option<usize>,
        /// The panic payload.
        message: String,
    },
    /// The worker init hook panicked.
    #[error("worker {worker} init hook panicked: {message}")]
    WorkerInit {
        /// The worker.
        worker: usize,
        /// The panic payload.
        message: String,
    },
    /// A batch did not arrive within `timeout_ms`.
    #[error("batch {batch} of epoch {epoch} did not arrive within {timeout_ms} ms")]
    Timeout {
        /// Epoch.
        epoch: u64,
        /// Batch position.
        batch: usize,
        /// The timeout.
        timeout_ms: u64,
    },
    /// Every worker thread has exited.
    #[error("all loader workers exited while batch {batch} of epoch {epoch} was pending")]
    WorkersGone {
        /// Epoch.
        epoch: u64,
        /// Batch position.
        batch: usize,
    },
    /// A worker thread could not be spawned.
    #[error("cannot spawn a loader worker: {0}")]
    Spawn(#[source] std::io::Error),
    /// The data set has more samples than an epoch may range over
    /// ([`MAX_EPOCH_SAMPLES`](crate::MAX_EPOCH_SAMPLES)): its index list (8 bytes a sample)
    /// is not allocated.
    #[error(
        "an epoch over {samples} samples is more than the {limit} samples an epoch may range \
         over (MAX_EPOCH_SAMPLES: the loader holds each epoch's order, 8 bytes a sample)"
    )]
    EpochTooLarge {
        /// The samples of the data set.
        samples: usize,
        /// The limit.
        limit: usize,
    },
    /// The index list of an epoch (8 bytes a sample) could not be allocated.
    #[error(
        "cannot allocate the order of an epoch over {samples} samples ({} bytes)",
        samples.saturating_mul(std::mem::size_of::<usize>())
    )]
    EpochAlloc {
        /// The samples of the data set.
        samples: usize,
    },
    /// A saved [`LoaderState`] does not fit this loader.
    #[error(transparent)]
    Resume(#[from] ResumeError),
}

fn at(sample: Option<usize>, batch: usize) -> String {
    match sample {
        Some(s) => format!("sample {s}"),
        None => format!("collate of batch {batch}"),
    }
}

fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

/// What a worker init hook is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerInfo {
    /// The worker, `0..num_workers`.
    pub id: usize,
    /// Number of workers.
    pub num_workers: usize,
    /// A seed for this worker: from the config seed, the spawn generation (which changes when
    /// workers are respawned each epoch) and the worker id.
    pub seed: u64,
}

type InitHook = dyn Fn(&WorkerInfo) + Send + Sync;

struct Shared<D: Dataset, Bd: BatchBuilder<D>> {
    dataset: Arc<D>,
    builder: Bd,
    memory: Arc<MemoryCounters>,
    staging: Option<Arc<StagingPool>>,
    seed: u64,
    /// How the caller and the workers meet at a hand-over (see `pacing`).
    pacing: Pacing,
    /// Where each worker last handed a batch over (see `pacing`).
    worker_cpus: WorkerCpus,
    /// How long each batch took to build (see [`Loader::build_times`]).
    build_clock: BuildClock,
}

/// A finished batch whose bytes are counted as queued or reordered until it is handed out or
/// dropped.
struct InFlight<B: HeldBytes> {
    batch: Option<B>,
    bytes: usize,
    term: Term,
    memory: Arc<MemoryCounters>,
}

impl<B: HeldBytes> InFlight<B> {
    fn new(batch: B, memory: Arc<MemoryCounters>) -> InFlight<B> {
        let bytes = batch.byte_size();
        memory.add(Term::Queue, bytes);
        memory.add(Term::ReadyBatches, 1);
        InFlight {
            batch: Some(batch),
            bytes,
            term: Term::Queue,
            memory,
        }
    }

    fn move_to_reorder(&mut self) {
        self.memory.sub(self.term, self.bytes);
        self.memory.add(Term::Reorder, self.bytes);
        self.term = Term::Reorder;
    }

    fn release(&mut self) -> Option<B> {
        let b = self.batch.take()?;
        self.memory.sub(self.term, self.bytes);
        self.memory.sub(Term::ReadyBatches, 1);
        Some(b)
    }
}

impl<B: HeldBytes> Drop for InFlight<B> {
    fn drop(&mut self) {
        self.release();
    }
}

type Msg<B> = (usize, Result<InFlight<B>, LoaderError>);

struct Job<B: HeldBytes> {
    epoch: u64,
    plan: Arc<EpochPlan>,
    results: Sender<Msg<B>>,
    cancel: Arc<AtomicBool>,
}

struct Task<B: HeldBytes> {
    batch: usize,
    job: Arc<Job<B>>,
}

struct WorkerPool<B: HeldBytes> {
    tasks: Option<Sender<Task<B>>>,
    handles: Vec<JoinHandle<()>>,
}

impl<B: HeldBytes> WorkerPool<B> {
    /// The threads, not joined: the task queue closes, so each exits once it has returned from
    /// the task it is building (if any) and skipped the cancelled ones left in the queue.
    fn detach(mut self) -> Vec<JoinHandle<()>> {
        self.tasks = None;
        std::mem::take(&mut self.handles)
    }

    fn all_exited(&self) -> bool {
        self.handles.iter().all(JoinHandle::is_finished)
    }

    fn send(&self, task: Task<B>) {
        if let Some(tx) = &self.tasks {
            // Fails only when every worker has exited; the consumer notices through liveness.
            let _ = tx.send(task);
        }
    }
}

impl<B: HeldBytes> Drop for WorkerPool<B> {
    fn drop(&mut self) {
        self.tasks = None;
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

fn build_batch<D: Dataset, Bd: BatchBuilder<D>>(
    shared: &Shared<D, Bd>,
    epoch: u64,
    batch: usize,
    indices: &[usize],
    cancel: Option<Arc<AtomicBool>>,
    ctx: &mut WorkerContext,
) -> Result<InFlight<Bd::Batch>, LoaderError> {
    ctx.begin_batch(
        epoch,
        batch,
        mix(&[shared.seed, epoch, batch as u64]),
        cancel,
    );
    let started = Instant::now();
    let r = catch_unwind(AssertUnwindSafe(|| {
        shared.builder.build(&shared.dataset, indices, ctx)
    }));
    shared
        .build_clock
        .record(ctx.worker_id(), started.elapsed());
    let sample = ctx.current_sample();
    // Release the batch's `building` (and scratch) bytes before it is counted as `queue`, so a
    // batch is never counted twice: `building + queue + reorder ≤ P·W × batch bytes` holds at
    // every instant (the total may dip for the moment between the two updates).
    ctx.end_batch();
    match r {
        Ok(Ok(b)) => Ok(InFlight::new(b, Arc::clone(&shared.memory))),
        Ok(Err(e)) => Err(LoaderError::Sample {
            epoch,
            batch,
            sample,
            message: error_chain(&*e),
        }),
        Err(p) => Err(LoaderError::Panic {
            epoch,
            batch,
            sample,
            message: panic_message(p),
        }),
    }
}

fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

fn worker_main<D: Dataset, Bd: BatchBuilder<D>>(
    shared: Arc<Shared<D, Bd>>,
    tasks: Receiver<Task<Bd::Batch>>,
    info: WorkerInfo,
    init: Option<Arc<InitHook>>,
) {
    set_thread_category(Category::Input);
    let init_error = init
        .as_ref()
        .and_then(|f| catch_unwind(AssertUnwindSafe(|| f(&info))).err())
        .map(panic_message);
    let mut ctx = WorkerContext::new(
        Some(info.id),
        info.num_workers,
        Arc::clone(&shared.memory),
        shared.staging.clone(),
    );
    for task in tasks.iter() {
        let job = &task.job;
        if job.cancel.load(Ordering::Relaxed) {
            continue;
        }
        let result = match &init_error {
            Some(message) => Err(LoaderError::WorkerInit {
                worker: info.id,
                message: message.clone(),
            }),
            None => build_batch(
                &shared,
                job.epoch,
                task.batch,
                job.plan.batch(task.batch),
                Some(Arc::clone(&job.cancel)),
                &mut ctx,
            ),
        };
        if shared.pacing == Pacing::CallerPolls {
            shared.worker_cpus.note(info.id);
        }
        // If the epoch was dropped the send fails and the batch is dropped (and uncounted).
        let _ = job.results.send((task.batch, result));
        if shared.pacing == Pacing::WorkersYield {
            // The caller may have just been woken by this batch and have no CPU of its own
            // (see `pacing`): let it run now rather than after this worker's time slice.
            std::thread::yield_now();
        }
    }
}

/// A multi-worker, bounded, in-order prefetching loader over a [`Dataset`].
pub struct Loader<D: Dataset, Bd: BatchBuilder<D>> {
    shared: Arc<Shared<D, Bd>>,
    config: LoaderConfig,
    next_epoch: u64,
    /// The next batch to deliver as `(epoch, batch)`, after the last epoch run (a finished
    /// epoch stated as the next one's start) or as restored: what [`Loader::state`] reports.
    position: (u64, usize),
    /// A restored position: the epoch it names starts at this batch instead of batch 0.
    resume_at: Option<(u64, usize)>,
    /// Batches of the next epoch already handed to persistent workers. Declared before `pool`
    /// so that dropping the loader cancels them before the workers are joined.
    ahead: Option<Ahead<Bd::Batch>>,
    pool: Option<WorkerPool<Bd::Batch>>,
    /// The hook each worker runs when it starts ([`Self::with_worker_init`]).
    init: Option<Arc<InitHook>>,
    /// Workers of epochs that timed out, not joined (see "Failure and shutdown"): each exits
    /// once its transform returns. Finished ones are joined at the next epoch start; the rest
    /// are detached when the loader is dropped.
    stragglers: Vec<JoinHandle<()>>,
    spawned: u64,
    /// How long the caller's recent waits for a batch took (see `pacing`).
    spin: SpinWait,
}

/// The next epoch's tasks handed out ahead of time (persistent workers only).
struct Ahead<B: HeldBytes> {
    job: Arc<Job<B>>,
    results: Receiver<Msg<B>>,
    plan: Arc<EpochPlan>,
    sent: usize,
    sampler_bytes: usize,
    memory: Arc<MemoryCounters>,
    /// Cleared when an epoch takes the tasks over.
    armed: bool,
}

impl<B: HeldBytes> Drop for Ahead<B> {
    fn drop(&mut self) {
        if self.armed {
            self.job.cancel.store(true, Ordering::Relaxed);
            while self.results.try_recv().is_ok() {}
            self.memory.sub(Term::Sampler, self.sampler_bytes);
        }
    }
}

impl<D: Dataset, Bd: BatchBuilder<D>> std::fmt::Debug for Loader<D, Bd> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loader")
            .field("config", &self.config)
            .field("next_epoch", &self.next_epoch)
            .field("threads_spawned", &self.spawned)
            .finish_non_exhaustive()
    }
}

impl<D, F, C, T, B> Loader<D, MapCollate<F, C>>
where
    D: Dataset,
    F: for<'a> Fn(D::Sample<'a>, &mut WorkerContext) -> Result<T, BoxError> + Send + Sync + 'static,
    C: Fn(Vec<T>, &mut WorkerContext) -> Result<B, BoxError> + Send + Sync + 'static,
    B: HeldBytes + Send + 'static,
{
    /// A loader with a per-sample `transform` and a `collate` step.
    pub fn with_transform(
        dataset: Arc<D>,
        config: LoaderConfig,
        transform: F,
        collate: C,
    ) -> Result<Self, LoaderError> {
        Loader::new(dataset, config, MapCollate::new(transform, collate))
    }
}

impl<D: Dataset, Bd: BatchBuilder<D>> Loader<D, Bd> {
    /// A loader over `dataset` building batches with `builder`.
    ///
    /// Errors on a configuration that [`LoaderConfig::validate`] refuses, and on a data set
    /// with more samples than an epoch may range over ([`LoaderError::EpochTooLarge`]).
    pub fn new(dataset: Arc<D>, config: LoaderConfig, builder: Bd) -> Result<Self, LoaderError> {
        config.validate()?;
        check_epoch_len(dataset.len())?;
        let memory = Arc::new(MemoryCounters::default());
        let staging = (config.pin_memory || config.reuse_buffers).then(|| {
            // Validated, the count is at most `MAX_BATCHES_IN_FLIGHT`: none of this saturates.
            let in_flight = config.max_batches_in_flight();
            // Enough idle blocks for every batch in flight plus the one the caller holds.
            let keep = in_flight.max(1).saturating_mul(4).saturating_add(4);
            // The batches in flight and the one the caller holds take turns in the pool.
            Arc::new(
                StagingPool::new(config.pin_memory, keep, Arc::clone(&memory))
                    .with_rotation(in_flight.saturating_add(1)),
            )
        });
        let seed = match config.order {
            Order::Shuffled { seed } => mix(&[config.seed, seed]),
            Order::Sequential => config.seed,
        };
        Ok(Loader {
            shared: Arc::new(Shared {
                dataset,
                builder,
                memory,
                staging,
                seed,
                pacing: Pacing::for_workers(config.workers),
                worker_cpus: WorkerCpus::new(config.workers),
                build_clock: BuildClock::new(config.workers),
            }),
            config,
            next_epoch: 0,
            position: (0, 0),
            resume_at: None,
            ahead: None,
            pool: None,
            init: None,
            stragglers: Vec::new(),
            spawned: 0,
            spin: SpinWait::default(),
        })
    }

    /// Sets a hook run once in each worker thread when it starts, before it builds any batch
    /// (once per spawn: every epoch without persistent workers). Persistent workers already
    /// running are joined first, so the hook applies to all workers from the next epoch on.
    /// (Workers left behind by a timed-out epoch are not waited for; they build nothing more.)
    pub fn with_worker_init(mut self, hook: impl Fn(&WorkerInfo) + Send + Sync + 'static) -> Self {
        self.ahead = None;
        self.pool = None;
        self.init = Some(Arc::new(hook));
        self
    }

    /// A loader that continues a run from `state` (saved by [`Self::state`] or
    /// [`Epoch::state`]): its first [`Self::epoch`] is `state.epoch`, starting at batch
    /// `state.batches_delivered`, and every batch from there on is the one the saved run would
    /// have delivered next, whatever the worker count, prefetch factor or worker lifetime of
    /// either. A state whose data set length, batch size, `drop_last`, order, shard or seed
    /// differ from this loader's is refused ([`LoaderError::Resume`]).
    pub fn resume(
        dataset: Arc<D>,
        config: LoaderConfig,
        builder: Bd,
        state: &LoaderState,
    ) -> Result<Self, LoaderError> {
        let mut loader = Loader::new(dataset, config, builder)?;
        loader.restore(state)?;
        Ok(loader)
    }

    /// Moves this loader to `state` (see [`Self::resume`]): the next [`Self::epoch`] is
    /// `state.epoch`, starting at batch `state.batches_delivered`. Batches of another epoch
    /// that persistent workers had built ahead are discarded.
    pub fn restore(&mut self, state: &LoaderState) -> Result<(), LoaderError> {
        state.check(&self.config, self.shared.dataset.len())?;
        self.next_epoch = state.epoch;
        self.position = (state.epoch, state.batches_delivered);
        self.resume_at = Some((state.epoch, state.batches_delivered));
        Ok(())
    }

    /// Where this loader stands: the epoch and batches delivered of the last epoch run (or
    /// the position restored), with a finished epoch stated as the start of the next one.
    /// Saved with a checkpoint and given to [`Self::resume`], it continues the run with the
    /// batches not yet delivered. During an epoch, ask the [`Epoch`] ([`Epoch::state`]).
    ///
    /// An epoch dropped part-way leaves the state at the batch it reached, while
    /// [`Self::epoch`] on this same loader still starts the next epoch (as a new iterator
    /// does in PyTorch); [`Self::restore`] continues the interrupted one instead.
    pub fn state(&self) -> LoaderState {
        let (epoch, delivered) = self.position;
        LoaderState::at(&self.config, self.shared.dataset.len(), epoch, delivered)
    }

    /// The configuration.
    pub fn config(&self) -> &LoaderConfig {
        &self.config
    }

    /// The data set.
    pub fn dataset(&self) -> &Arc<D> {
        &self.shared.dataset
    }

    /// Batches per epoch.
    pub fn batches_per_epoch(&self) -> usize {
        self.config.batches_per_epoch(self.shared.dataset.len())
    }

    /// Worker threads spawned so far (grows by `workers` every epoch unless persistent, and
    /// at the epoch after a timeout either way).
    pub fn threads_spawned(&self) -> u64 {
        self.spawned
    }

    /// Worker threads of timed-out epochs that are still running: stuck in a transform or
    /// collate that has not returned (see "Failure and shutdown" in the module docs). Each
    /// exits on its own once it returns; 0 when no epoch timed out or all have exited.
    pub fn abandoned_workers(&self) -> usize {
        self.stragglers.iter().filter(|h| !h.is_finished()).count()
    }

    /// Joins the workers of timed-out epochs that have exited.
    fn reap_stragglers(&mut self) {
        let (done, running): (Vec<_>, Vec<_>) = std::mem::take(&mut self.stragglers)
            .into_iter()
            .partition(JoinHandle::is_finished);
        for h in done {
            let _ = h.join();
        }
        self.stragglers = running;
    }

    /// The loader's own bytes right now (see [`LoaderMemory`]).
    pub fn memory(&self) -> LoaderMemory {
        self.shared.memory.current()
    }

    /// How long the batches built so far took to build, by the caller (no workers) and every
    /// worker together, cumulative since the loader was created (see [`BuildTimes::since`]).
    /// Beside the epoch's wall time it tells a loader that builds slowly from one that hands
    /// batches over slowly.
    pub fn build_times(&self) -> BuildTimes {
        self.shared.build_clock.read()
    }

    /// The largest value each term reached since creation or [`Self::reset_memory_peak`].
    pub fn memory_peak(&self) -> LoaderMemory {
        self.shared.memory.peaks()
    }

    /// Lowers every peak to the current value.
    pub fn reset_memory_peak(&self) {
        self.shared.memory.reset_peaks();
    }

    /// A handle that reads this loader's memory counters without borrowing the loader.
    pub fn memory_watch(&self) -> MemoryWatch {
        MemoryWatch(Arc::clone(&self.shared.memory))
    }

    fn spawn_pool(&mut self) -> Result<WorkerPool<Bd::Batch>, LoaderError> {
        let n = self.config.workers;
        let generation = self.spawned / n.max(1) as u64;
        let (tx, rx) = crossbeam_channel::unbounded::<Task<Bd::Batch>>();
        let mut pool = WorkerPool {
            tasks: Some(tx),
            handles: Vec::with_capacity(n),
        };
        for id in 0..n {
            let info = WorkerInfo {
                id,
                num_workers: n,
                seed: mix(&[self.shared.seed, generation, id as u64]),
            };
            let shared = Arc::clone(&self.shared);
            let rx = rx.clone();
            let init = self.init.clone();
            let h = std::thread::Builder::new()
                .name(format!("trainmem-loader-{id}"))
                .spawn(move || worker_main(shared, rx, info, init))
                .map_err(LoaderError::Spawn)?;
            pool.handles.push(h);
            self.spawned += 1;
        }
        Ok(pool)
    }

    /// The workers' side of starting `epoch` at batch `first`: the workers to build it (this
    /// epoch's own, or the persistent pool, respawned if its threads are gone), and the job
    /// they build, adopted from the work built `ahead` or started afresh; and how many of its
    /// batches have been sent to them already.
    fn worker_state(
        &mut self,
        epoch: u64,
        plan: &Arc<EpochPlan>,
        ahead: &mut Option<Ahead<Bd::Batch>>,
        first: usize,
    ) -> Result<(State<Bd::Batch>, usize), LoaderError> {
        let own = if self.config.persistent_workers {
            if self.pool.as_ref().is_none_or(WorkerPool::all_exited) {
                if let Some(mut a) = ahead.take() {
                    // Its tasks went to workers that are gone: start the epoch afresh
                    // (the sampler bytes stay counted, now for this epoch).
                    a.job.cancel.store(true, Ordering::Relaxed);
                    a.armed = false;
                }
                self.pool = Some(self.spawn_pool()?);
            }
            None
        } else {
            Some(self.spawn_pool()?)
        };
        Ok(match ahead.as_mut() {
            Some(a) => {
                a.armed = false;
                let state = State::Workers {
                    job: Arc::clone(&a.job),
                    results: a.results.clone(),
                    reorder: BTreeMap::new(),
                    own_pool: own,
                };
                (state, a.sent)
            }
            None => {
                let (tx, rx) = crossbeam_channel::unbounded();
                let state = State::Workers {
                    job: Arc::new(Job {
                        epoch,
                        plan: Arc::clone(plan),
                        results: tx,
                        cancel: Arc::new(AtomicBool::new(false)),
                    }),
                    results: rx,
                    reorder: BTreeMap::new(),
                    own_pool: own,
                };
                (state, first)
            }
        })
    }

    /// Starts the next epoch (0, 1, 2, ..., or the one a [`Self::restore`] named, at its
    /// restored batch).
    pub fn epoch(&mut self) -> Result<Epoch<'_, D, Bd>, LoaderError> {
        let e = self.next_epoch;
        self.epoch_at(e)
    }

    /// Starts epoch `epoch` (its order depends on it when shuffled) at batch 0, or at the
    /// restored batch when a [`Self::restore`] named this epoch; the next call to
    /// [`Self::epoch`] starts `epoch + 1`.
    pub fn epoch_at(&mut self, epoch: u64) -> Result<Epoch<'_, D, Bd>, LoaderError> {
        self.shared.dataset.check()?;
        self.reap_stragglers();
        let first = match self.resume_at {
            Some((e, k)) if e == epoch => k,
            _ => 0,
        };
        // Work built ahead is for batch 0 on: of no use to an epoch resumed past it.
        let mut ahead = self
            .ahead
            .take()
            .filter(|a| a.job.epoch == epoch && first == 0);
        let plan = match &ahead {
            Some(a) => Arc::clone(&a.plan),
            None => Arc::new(EpochPlan::try_new(
                self.shared.dataset.len(),
                &self.config,
                epoch,
            )?),
        };
        self.shared
            .dataset
            .advise(matches!(self.config.order, Order::Sequential));
        self.next_epoch = epoch + 1;
        self.resume_at = None;
        self.position = (epoch, first);
        let sampler_bytes = plan.bytes();
        if ahead.is_none() {
            self.shared.memory.add(Term::Sampler, sampler_bytes);
        }
        let (state, sent) = if self.config.workers == 0 {
            let ctx = WorkerContext::new(
                None,
                0,
                Arc::clone(&self.shared.memory),
                self.shared.staging.clone(),
            );
            (State::Inline(ctx), first)
        } else {
            self.worker_state(epoch, &plan, &mut ahead, first)?
        };
        drop(ahead);
        let mut it = Epoch {
            loader: self,
            plan,
            epoch,
            next: first,
            sent,
            done: false,
            sampler_bytes,
            state,
        };
        let prime = first
            .saturating_add(it.loader.config.max_batches_in_flight())
            .min(it.plan.len());
        while it.sent < prime {
            it.send_next();
        }
        Ok(it)
    }
}

enum State<B: HeldBytes> {
    Inline(WorkerContext),
    Workers {
        job: Arc<Job<B>>,
        results: Receiver<Msg<B>>,
        reorder: BTreeMap<usize, Result<InFlight<B>, LoaderError>>,
        own_pool: Option<WorkerPool<B>>,
    },
}

/// One epoch: an iterator of batches in sampler order.
pub struct Epoch<'l, D: Dataset, Bd: BatchBuilder<D>> {
    loader: &'l mut Loader<D, Bd>,
    plan: Arc<EpochPlan>,
    epoch: u64,
    next: usize,
    sent: usize,
    done: bool,
    sampler_bytes: usize,
    state: State<Bd::Batch>,
}

impl<D: Dataset, Bd: BatchBuilder<D>> std::fmt::Debug for Epoch<'_, D, Bd> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Epoch")
            .field("epoch", &self.epoch)
            .field("next", &self.next)
            .field("batches", &self.plan.len())
            .finish_non_exhaustive()
    }
}

impl<D: Dataset, Bd: BatchBuilder<D>> Epoch<'_, D, Bd> {
    /// The epoch number.
    pub fn number(&self) -> u64 {
        self.epoch
    }

    /// The epoch's plan (order and batches).
    pub fn plan(&self) -> &EpochPlan {
        &self.plan
    }

    /// The loader's memory right now.
    pub fn memory(&self) -> LoaderMemory {
        self.loader.memory()
    }

    /// Where the run stands after the batches delivered so far (see [`Loader::state`]):
    /// save it with a checkpoint taken after the last batch returned by `next`.
    pub fn state(&self) -> LoaderState {
        let (epoch, batch) = self.next_position();
        let loader = &*self.loader;
        LoaderState::at(&loader.config, loader.shared.dataset.len(), epoch, batch)
    }

    /// The next batch as `(epoch, batch)`: a finished epoch is the start of the next one.
    fn next_position(&self) -> (u64, usize) {
        if self.next >= self.plan.len() {
            (self.epoch + 1, 0)
        } else {
            (self.epoch, self.next)
        }
    }

    fn send_next(&mut self) {
        if self.sent >= self.plan.len() {
            self.send_ahead();
            return;
        }
        if let State::Workers { job, own_pool, .. } = &self.state {
            let pool = own_pool.as_ref().or(self.loader.pool.as_ref());
            if let Some(pool) = pool {
                pool.send(Task {
                    batch: self.sent,
                    job: Arc::clone(job),
                });
            }
        }
        self.sent += 1;
    }

    /// Hands the next epoch's next task to the persistent workers (see "Worker lifetime").
    fn send_ahead(&mut self) {
        let loader = &mut *self.loader;
        if !loader.config.persistent_workers
            || loader.next_epoch != self.epoch + 1
            || !matches!(self.state, State::Workers { .. })
        {
            return;
        }
        let Some(pool) = loader.pool.as_ref() else {
            return;
        };
        if loader.ahead.is_none() {
            let epoch = self.epoch + 1;
            // Should its order not fit in memory, no work is built ahead: the next epoch start
            // reports it.
            let Ok(plan) = EpochPlan::try_new(loader.shared.dataset.len(), &loader.config, epoch)
            else {
                return;
            };
            let plan = Arc::new(plan);
            let sampler_bytes = plan.bytes();
            loader.shared.memory.add(Term::Sampler, sampler_bytes);
            let (tx, rx) = crossbeam_channel::unbounded();
            loader.ahead = Some(Ahead {
                job: Arc::new(Job {
                    epoch,
                    plan: Arc::clone(&plan),
                    results: tx,
                    cancel: Arc::new(AtomicBool::new(false)),
                }),
                results: rx,
                plan,
                sent: 0,
                sampler_bytes,
                memory: Arc::clone(&loader.shared.memory),
                armed: true,
            });
        }
        if let Some(a) = loader.ahead.as_mut()
            && a.sent < a.plan.len()
        {
            pool.send(Task {
                batch: a.sent,
                job: Arc::clone(&a.job),
            });
            a.sent += 1;
        }
    }

    fn workers_exited(&self) -> bool {
        match &self.state {
            State::Workers { own_pool, .. } => own_pool
                .as_ref()
                .or(self.loader.pool.as_ref())
                .is_none_or(WorkerPool::all_exited),
            State::Inline(_) => false,
        }
    }

    /// Ends the epoch: cancels its tasks, drops what was built, and joins per-epoch workers
    /// (they stop within one sample of the cancel flag).
    fn stop(&mut self) {
        self.end(true);
    }

    /// Ends the epoch as [`Self::stop`] does, but with `wait` false joins no worker: the
    /// epoch's workers (per-epoch ones, or the persistent pool with the work it built ahead)
    /// are retired to the loader's stragglers, so that a worker stuck in a transform does not
    /// hold the caller up. Each exits once its transform returns.
    fn end(&mut self, wait: bool) {
        self.done = true;
        let State::Workers {
            job,
            results,
            reorder,
            own_pool,
        } = &mut self.state
        else {
            return;
        };
        // Cancel first, so that no retired worker builds another of the epoch's tasks.
        job.cancel.store(true, Ordering::Relaxed);
        reorder.clear();
        let mut pool = own_pool.take();
        if !wait && pool.is_none() {
            // Persistent workers: their next-epoch work is cancelled with them, and the next
            // epoch spawns a fresh pool.
            self.loader.ahead = None;
            pool = self.loader.pool.take();
        }
        if let Some(pool) = pool {
            if wait {
                drop(pool); // joins the threads
            } else {
                self.loader.stragglers.extend(pool.detach());
            }
        }
        while results.try_recv().is_ok() {}
    }

    /// After a wait for batch `want` (begun at `started`) that received nothing: the error
    /// that ends the epoch if the wait has run past `timeout` or no worker is left to build
    /// the batch; `None` while the caller should wait on.
    fn stalled(
        &self,
        want: usize,
        started: Instant,
        timeout: Option<Duration>,
    ) -> Option<LoaderError> {
        if let Some(t) = timeout
            && started.elapsed() >= t
        {
            return Some(LoaderError::Timeout {
                epoch: self.epoch,
                batch: want,
                timeout_ms: t.as_millis() as u64,
            });
        }
        if self.workers_exited() {
            return Some(LoaderError::WorkersGone {
                epoch: self.epoch,
                batch: want,
            });
        }
        None
    }

    fn next_from_workers(&mut self) -> Result<Bd::Batch, LoaderError> {
        let timeout = self.loader.config.timeout_ms.map(Duration::from_millis);
        let started = Instant::now();
        let want = self.next;
        let shared = &self.loader.shared;
        // Every wait is recorded and may poll (the pacing is never `Inline` with workers): with
        // a CPU free the caller polls busily, unless a worker last handed over on its CPU; with
        // the workers on every CPU it polls between yields of its CPU (see `pacing`).
        let mut spins = self.loader.spin.worth_spinning()
            && (shared.pacing == Pacing::WorkersYield
                || current_cpu().is_some_and(|here| !shared.worker_cpus.any_on(here)));
        // How this wait's last poll ended, if it polled.
        let mut poll_end: Option<Polled<()>> = None;
        let item = loop {
            let State::Workers {
                results, reorder, ..
            } = &mut self.state
            else {
                unreachable!("called only in worker mode");
            };
            if let Some(r) = reorder.remove(&want) {
                break r;
            }
            let wait = match timeout {
                Some(t) => t.saturating_sub(started.elapsed()).min(LIVENESS_POLL),
                None => LIVENESS_POLL,
            };
            // Batches arriving quickly: poll for a while before sleeping (see `pacing`); a
            // poll that misses (or, polling busily, loses its CPU) is not repeated in this
            // wait.
            let mut polled = None;
            if spins {
                let look = || results.try_recv().ok();
                let (found, end) = match shared.pacing {
                    Pacing::WorkersYield => SpinWait::yield_between(started, look),
                    _ => SpinWait::spin(started, look),
                }
                .split();
                spins = found.is_some();
                (polled, poll_end) = (found, Some(end));
            }
            match polled.map_or_else(|| results.recv_timeout(wait), Ok) {
                Ok((k, r)) if k == want => break r,
                Ok((k, mut r)) => {
                    if let Ok(b) = &mut r {
                        b.move_to_reorder();
                    }
                    reorder.insert(k, r);
                }
                Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => {
                    if let Some(e) = self.stalled(want, started, timeout) {
                        // A worker may be stuck in a transform: after a timeout, do not wait
                        // for it (every worker has exited otherwise, and joining is quick).
                        self.end(!matches!(e, LoaderError::Timeout { .. }));
                        return Err(e);
                    }
                }
            }
        };
        self.loader
            .spin
            .record(started.elapsed(), poll_end.as_ref());
        // Hand the batch out (and uncount it) before issuing the replacement task, so the
        // loader never holds more than P·W batches.
        let out = item.map(|mut b| {
            b.release()
                .expect("an in-flight batch is released exactly once")
        });
        self.next += 1;
        self.send_next();
        out
    }
}

impl<D: Dataset, Bd: BatchBuilder<D>> Iterator for Epoch<'_, D, Bd> {
    type Item = Result<Bd::Batch, LoaderError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done || self.next >= self.plan.len() {
            if !self.done {
                self.stop();
            }
            return None;
        }
        if let State::Inline(ctx) = &mut self.state {
            let k = self.next;
            self.next += 1;
            let _tag = CategoryScope::enter(Category::Input);
            let shared = &self.loader.shared;
            let r = build_batch(shared, self.epoch, k, self.plan.batch(k), None, ctx);
            return Some(r.map(|mut b| {
                b.release()
                    .expect("an in-flight batch is released exactly once")
            }));
        }
        Some(self.next_from_workers())
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = if self.done {
            0
        } else {
            self.plan.len() - self.next
        };
        (left, Some(left))
    }
}

impl<D: Dataset, Bd: BatchBuilder<D>> Drop for Epoch<'_, D, Bd> {
    fn drop(&mut self) {
        self.stop();
        self.loader.position = self.next_position();
        self.loader
            .shared
            .memory
            .sub(Term::Sampler, self.sampler_bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::config::{MAX_BATCHES_IN_FLIGHT, MAX_WORKERS};
    use crate::engine::sampler::MAX_EPOCH_SAMPLES;
    use proptest::prelude::*;

    fn ident(x: &u64, _: &mut WorkerContext) -> Result<u64, BoxError> {
        Ok(*x)
    }

    fn stack(v: Vec<u64>, _: &mut WorkerContext) -> Result<Vec<u64>, BoxError> {
        Ok(v)
    }

    fn numbers() -> Arc<Vec<u64>> {
        Arc::new((0..10).collect())
    }

    #[test]
    fn an_absurd_prefetch_factor_is_a_config_error_not_an_overflow() {
        for (workers, prefetch_factor) in [(2, usize::MAX), (1 << 10, 1 << 11)] {
            let config = LoaderConfig {
                workers,
                prefetch_factor,
                ..LoaderConfig::default()
            };
            let err = Loader::with_transform(numbers(), config, ident, stack).expect_err("refused");
            assert!(
                matches!(
                    err,
                    LoaderError::Config(ConfigError::TooManyInFlight { .. })
                ),
                "{err}"
            );
        }
        let err = Loader::with_transform(
            numbers(),
            LoaderConfig {
                workers: usize::MAX,
                ..LoaderConfig::default()
            },
            ident,
            stack,
        )
        .expect_err("refused");
        assert!(
            matches!(err, LoaderError::Config(ConfigError::TooManyWorkers { .. })),
            "{err}"
        );
    }

    /// A data set of `len` samples that never has to produce one.
    struct Endless(usize);

    impl Dataset for Endless {
        type Sample<'a> = usize;
        fn len(&self) -> usize {
            self.0
        }
        fn sample(&self, index: usize) -> Result<usize, DataError> {
            Ok(index)
        }
    }

    #[test]
    fn a_data_set_over_the_epoch_limit_is_refused_at_new() {
        fn one(x: usize, _: &mut WorkerContext) -> Result<u64, BoxError> {
            Ok(x as u64)
        }
        for len in [MAX_EPOCH_SAMPLES + 1, 1 << 40, usize::MAX] {
            let r =
                Loader::with_transform(Arc::new(Endless(len)), LoaderConfig::default(), one, stack);
            match r {
                Err(LoaderError::EpochTooLarge { samples, limit }) => {
                    assert_eq!((samples, limit), (len, MAX_EPOCH_SAMPLES));
                }
                Err(e) => panic!("{len}: {e}"),
                Ok(_) => panic!("{len}: accepted, its epoch would allocate {len} indices"),
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]

        /// Whatever the worker count and prefetch factor, `Loader::new` answers (a loader or a
        /// configuration error) and never overflows; a loader it makes has at most
        /// `MAX_BATCHES_IN_FLIGHT` batches in flight.
        #[test]
        fn new_never_panics_on_worker_counts(
            workers in prop_oneof![0usize..=64, Just(MAX_WORKERS), Just(MAX_WORKERS + 1), any::<usize>()],
            prefetch_factor in prop_oneof![0usize..=8, Just(MAX_BATCHES_IN_FLIGHT), any::<usize>()],
            pin_memory in any::<bool>(),
            reuse_buffers in any::<bool>(),
        ) {
            let config = LoaderConfig {
                workers,
                prefetch_factor,
                pin_memory,
                reuse_buffers,
                ..LoaderConfig::default()
            };
            let valid = config.validate();
            // Loaders of more than 64 workers are checked by `validate` alone (their
            // per-worker bookkeeping would make each case slow).
            if workers > 64 && valid.is_ok() {
                return Ok(());
            }
            match Loader::with_transform(numbers(), config, ident, stack) {
                Ok(l) => {
                    prop_assert!(valid.is_ok());
                    prop_assert!(l.config().max_batches_in_flight() <= MAX_BATCHES_IN_FLIGHT);
                }
                Err(LoaderError::Config(e)) => prop_assert_eq!(Err(e), valid),
                Err(e) => prop_assert!(false, "unexpected {e}"),
            }
        }
    }
}
