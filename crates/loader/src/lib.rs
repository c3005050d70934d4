//! Memory-mapped data sets and a multi-worker prefetching loader that accounts its own memory.
//!
//! trainmem-loader feeds trainmem's measured training runs (trainmem-burn, and the
//! `epoch-spike`, `memmap-vs-preload` and `pinned-staging` scenarios), and its knobs and
//! memory terms are what trainmem-sim's host-memory model predicts. It depends on no training
//! framework: anything that wants batches of rows from `.npy` or raw record files, built by
//! worker threads, in a fixed order, with a bound on the memory held in flight, can use it
//! alone (with feature `burn` it also plugs into burn's `Dataset` trait).
//!
//! # The parts
//!
//! * Data sets: [`MappedArray`] (one `.npy` file, versions 1–3, or a raw record file with a
//!   JSON sidecar, validated at open), [`MmapDataset`] (several arrays of equal length side by
//!   side: features, labels, ...), the [`Dataset`] trait the loader reads (also implemented by
//!   `Vec<T>`), [`fixtures`] (deterministic data sets written on demand), and
//!   [`evict_page_cache`] (drop a file's cached pages before a cold or cgroup-limited run).
//! * The knobs: [`LoaderConfig`] (batch size, `drop_last`, [`Order`], [`Shard`], `workers`,
//!   `prefetch_factor`, `persistent_workers`, `pin_memory`, `reuse_buffers`, timeout, seed),
//!   serde-serialisable so plans carry it; names and defaults follow PyTorch's `DataLoader`.
//! * The loader: [`Loader`] over a data set and a [`BatchBuilder`]; [`Loader::epoch`] returns
//!   an [`Epoch`], an iterator of `Result<batch, `[`LoaderError`]`>` in sampler order
//!   ([`EpochPlan`]).
//! * Batch building: [`StackColumns`] copies each column's rows of a [`MmapDataset`] into one
//!   buffer per column ([`ColumnBatch`]; the only copy, page cache → batch buffer); a user
//!   transform + collate ([`MapCollate`], [`Loader::with_transform`]); a random-resize
//!   augmentation with per-worker scratch ([`RandomResize`], [`ScratchResize`]). Builders see
//!   a [`WorkerContext`] (worker id, a per-batch random generator, scratch and output
//!   buffers that are accounted).
//! * Memory: [`LoaderMemory`], the loader's own byte counts, read with [`Loader::memory`],
//!   [`Loader::memory_peak`], or a [`MemoryWatch`] from any thread.
//! * With feature `burn`: `burn_adapter`, burn's `Dataset` trait over these data sets.
//!
//! # The rules
//!
//! * **Validation at open**: a file's header, dtype, shape and length are checked when it is
//!   opened (a truncated or malformed file is a [`DataError`] naming the file and the
//!   problem), and the length again at the start of every epoch.
//! * **Order**: `Sequential` is `0, 1, 2, ...`; `Shuffled { seed }` is a permutation drawn from
//!   `(seed, epoch)`, the same on every run and rank. An epoch has `ceil(n / batch_size)`
//!   batches, `floor` with `drop_last`, where `n` is the samples this rank reads.
//! * **Ranks in step**: a [`Shard`] of rank `r` out of `W` works as PyTorch's
//!   `DistributedSampler`: the epoch order is padded by repeating it from its start up to a
//!   multiple of `W` ([`ShardTail::Pad`], the default) or cut down to one
//!   ([`ShardTail::Drop`]), and rank `r` takes positions `r, r + W, r + 2W, ...` of it
//!   ([`shard_order`]). Every rank reads the same number of samples (`ceil(len / W)` or
//!   `floor(len / W)`) and so runs the same number of batches: no rank waits in a collective
//!   for a step another rank never takes.
//! * **Resumption**: [`Epoch::state`] (during an epoch) and [`Loader::state`] (between epochs)
//!   return a [`LoaderState`]: the epoch, the batches delivered in it, and the knobs that decide
//!   which samples each batch holds; small and serde-serialisable, for a training checkpoint.
//!   [`Loader::resume`] (a new loader) or [`Loader::restore`] (this one) continue from it with
//!   exactly the batches the stopped run would have delivered next, whatever the workers,
//!   prefetch factor or worker lifetime of either run; a state from a different data set
//!   length, batch size, order, shard or seed is refused ([`ResumeError`]).
//! * **Delivery** is always in sampler order, whatever the number of workers: a batch that is
//!   ready early waits in the reorder buffer.
//! * **Bound**: with `W` workers and prefetch factor `P`, at most `P·W` batches are queued,
//!   being built, or waiting to be reordered (PyTorch's credit scheme: one new task per batch
//!   the caller takes). `workers = 0` builds each batch in the caller's thread on demand.
//! * **Worker lifetime**: without `persistent_workers` a fresh set of `W` threads is spawned
//!   at every epoch start and joined at its end (the refill burst behind the epoch-start
//!   spike); with it the threads live as long as the loader and start building the next
//!   epoch's first batches while the current one ends.
//! * **Buffers**: with `reuse_buffers` (the default) or `pin_memory`, batch buffers come from
//!   a pool of page-aligned blocks, a whole number of 4096-byte pages per column, returned to
//!   the pool when the batch is dropped (`pin_memory` also `mlock`s them). On x86_64, batch
//!   buffers of 1 MiB or more are written with non-temporal stores: they are not read back
//!   before the hand-off, so the copy skips reading each destination line first.
//! * **Accounting**: [`LoaderMemory::total`] is `queue + reorder + building + scratch +
//!   staging_idle + sampler`; the sampler holds 8 bytes per sample of the epoch; a batch
//!   counts once while in flight and not at all once the caller has it. Worker threads tag
//!   themselves [`Category::Input`](trainmem_core::Category::Input), so a counting global
//!   allocator (trainmem-probe) files their bytes under `input`.
//! * **Failures** are per batch: a transform that errors or panics yields an `Err` naming the
//!   sample and the epoch goes on; a timeout ends the epoch; dropping an [`Epoch`] cancels it.
//!
//! # Example: one epoch over a memory-mapped fixture with two workers
//!
//! ```
//! use std::sync::Arc;
//! use trainmem_loader::fixtures::{FixtureSpec, feature_value, label_value, write_fixture};
//! use trainmem_loader::{Dataset, Loader, LoaderConfig, MmapDataset, StackColumns};
//!
//! // 100 samples of 4 f32 features and an i64 label, written to a fresh directory.
//! let dir = std::env::temp_dir().join(format!("trainmem-loader-doc-{}", std::process::id()));
//! let spec = FixtureSpec {
//!     samples: 100,
//!     dim: 4,
//!     classes: 10,
//!     seed: 7,
//!     ..FixtureSpec::default()
//! };
//! let paths = write_fixture(&dir, &spec, |_, _| {})?;
//! let data = Arc::new(MmapDataset::open(&[&paths.features, &paths.labels])?);
//! assert_eq!(data.len(), 100);
//! assert_eq!(data.bytes_per_sample(), 4 * 4 + 8);
//!
//! let config = LoaderConfig {
//!     batch_size: 10,
//!     workers: 2,
//!     prefetch_factor: 2,
//!     ..LoaderConfig::default()
//! };
//! assert_eq!(config.max_batches_in_flight(), 4);
//! let mut loader = Loader::new(Arc::clone(&data), config, StackColumns)?;
//! assert_eq!(loader.batches_per_epoch(), 10);
//!
//! let mut seen = Vec::new();
//! let mut epoch = loader.epoch()?;
//! assert_eq!(epoch.memory().sampler, 100 * 8); // the epoch's index list
//! while let Some(batch) = epoch.next() {
//!     let batch = batch?;
//!     assert_eq!(batch.shapes, [vec![10, 4], vec![10]]);
//!     let features = batch.column::<f32>(0).expect("f32 features");
//!     let labels = batch.column::<i64>(1).expect("i64 labels");
//!     for (row, &i) in batch.indices.iter().enumerate() {
//!         assert_eq!(features[row * 4 + 3], feature_value(7, i, 3));
//!         assert_eq!(labels[row], i64::from(label_value(7, i, 10)));
//!     }
//!     seen.extend_from_slice(&batch.indices);
//! } // each batch is dropped here, and its buffers go back to the pool
//! drop(epoch);
//!
//! // Two workers built the batches concurrently; they still arrived in sampler order.
//! assert_eq!(seen, (0..100).collect::<Vec<_>>());
//! // Never more than P·W = 4 finished batches waited inside the loader.
//! assert!(loader.memory_peak().ready_batches <= 4);
//! // After the epoch: nothing in flight, no index list; what is left is the pool of idle
//! // buffers, one 4096-byte page per column per batch, for at most the 4 batches in flight
//! // plus the one the caller held.
//! let now = loader.memory();
//! assert_eq!((now.queue, now.reorder, now.building, now.sampler), (0, 0, 0, 0));
//! assert_eq!(now.total, now.staging_idle);
//! assert_eq!(now.staging, now.staging_idle);
//! assert!(now.staging > 0 && now.staging <= (4 + 1) * 2 * 4096);
//! // Per-epoch workers: two threads were spawned for this epoch and joined at its end.
//! assert_eq!(loader.threads_spawned(), 2);
//! # drop(loader);
//! # drop(data);
//! std::fs::remove_dir_all(&dir)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Example: stop part-way through an epoch, resume with another worker count
//!
//! ```
//! use std::sync::Arc;
//! use trainmem_loader::{BoxError, Loader, LoaderConfig, LoaderState, Order, Shard, WorkerContext};
//!
//! fn ident(x: &u64, _: &mut WorkerContext) -> Result<u64, BoxError> { Ok(*x) }
//! fn stack(v: Vec<u64>, _: &mut WorkerContext) -> Result<Vec<u64>, BoxError> { Ok(v) }
//!
//! let data: Arc<Vec<u64>> = Arc::new((0..10).collect());
//! let config = LoaderConfig {
//!     batch_size: 2,
//!     order: Order::Shuffled { seed: 1 },
//!     // Rank 1 of 4: 10 samples padded to 12, 3 for every rank, so 2 batches on every rank.
//!     shard: Some(Shard::new(1, 4)),
//!     workers: 2,
//!     ..LoaderConfig::default()
//! };
//! let mut loader = Loader::with_transform(Arc::clone(&data), config.clone(), ident, stack)?;
//! assert_eq!(loader.batches_per_epoch(), 2);
//! let mut seen = Vec::new();
//! let saved = {
//!     let mut epoch = loader.epoch()?;
//!     seen.push(epoch.next().expect("batch 0")?);
//!     serde_json::to_string(&epoch.state())? // saved with the checkpoint
//! };
//! drop(loader);
//!
//! // Later, in a new process: the same knobs, any worker count.
//! let state: LoaderState = serde_json::from_str(&saved)?;
//! assert_eq!((state.epoch, state.batches_delivered), (0, 1));
//! let mut resumed = Loader::with_transform(data, LoaderConfig { workers: 0, ..config }, ident, stack)?;
//! resumed.restore(&state)?;
//! for batch in resumed.epoch()? {
//!     seen.push(batch?); // batch 1 of epoch 0, then the epoch ends
//! }
//! assert_eq!(seen.len(), 2);
//! assert_eq!(resumed.state().epoch, 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod array;
pub mod augment;
mod builder;
pub mod config;
mod context;
mod dataset;
mod dtype;
mod error;
pub mod fixtures;
mod loader;
mod memory;
pub mod npy;
mod pagecache;
mod resume;
mod rng;
mod sampler;
mod staging;

#[cfg(feature = "burn")]
pub mod burn_adapter;

pub use array::{FileFormat, MappedArray, RawSidecar, sidecar_path};
pub use augment::{RandomResize, ResizeColumns, ScratchResize};
pub use builder::{BatchBuilder, BoxError, ColumnBatch, HeldBytes, MapCollate, StackColumns};
pub use config::{ConfigError, LoaderConfig, Order, Shard, ShardTail};
pub use context::WorkerContext;
pub use dataset::{Column, Dataset, MmapDataset, SampleView};
pub use dtype::{DTypeError, Dtype, Element, descr, from_descr};
pub use error::{DataError, FileProblem};
pub use loader::{Epoch, Loader, LoaderError, WorkerInfo};
pub use memory::{LoaderMemory, MemoryWatch};
pub use pagecache::evict_page_cache;
pub use resume::{LoaderState, ResumeError};
pub use rng::{Rng, mix};
pub use sampler::{EpochPlan, epoch_order, shard_order};
pub use staging::{BatchBuffer, prefetch_pages};
