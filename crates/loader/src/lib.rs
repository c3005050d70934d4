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
//!   `(seed, epoch)`, the same on every run and rank. A [`Shard`] of rank `r` out of `W` takes
//!   positions `r, r + W, r + 2W, ...` of that order. An epoch has `ceil(n / batch_size)`
//!   batches, `floor` with `drop_last`.
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
//!   the pool when the batch is dropped (`pin_memory` also `mlock`s them).
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

mod array;
mod arrow_collate;
mod arrow_dataset;
mod arrow_ipc_file;
pub mod augment;
mod builder;
pub mod config;
mod context;
mod dataset;
mod dtype;
mod error;
pub mod fixtures;
pub mod format_fixtures;
mod indexed;
mod loader;
mod mapped;
mod memory;
pub mod npy;
mod pagecache;
mod rng;
mod safetensors_file;
mod sampler;
mod staging;
mod tokens;

#[cfg(feature = "burn")]
pub mod burn_adapter;

pub use array::{FileFormat, MappedArray, RawSidecar, sidecar_path};
pub use arrow_collate::{
    PackCollate, PackedBatch, PadCollate, PadTo, PaddedBatch, Segment, StackArrowColumns,
    scalar_bytes,
};
pub use arrow_dataset::{ArrowColumn, ArrowDataset, ArrowRow, ColumnKind, dtype_of_arrow};
pub use arrow_ipc_file::{ARROW_MAGIC, ArrowFormat};
pub use augment::{RandomResize, ResizeColumns, ScratchResize};
pub use builder::{BatchBuilder, BoxError, ColumnBatch, HeldBytes, MapCollate, StackColumns};
pub use config::{ConfigError, LoaderConfig, Order, Shard};
pub use context::WorkerContext;
pub use dataset::{Column, Dataset, MmapDataset, SampleView};
pub use dtype::{DTypeError, Dtype, Element, descr, from_descr};
pub use error::{DataError, FileProblem};
pub use indexed::{IDX_MAGIC, IndexedTokens, code_of_dtype, dtype_of_code, write_indexed};
pub use loader::{Epoch, Loader, LoaderError, WorkerInfo};
pub use mapped::MappedFile;
pub use memory::{LoaderMemory, MemoryWatch};
pub use pagecache::evict_page_cache;
pub use rng::{Rng, mix};
pub use safetensors_file::{dtype_of_safetensors, open_safetensors};
pub use sampler::{EpochPlan, epoch_order};
pub use staging::BatchBuffer;
pub use tokens::{
    StackWindows, TOKEN_DTYPES, TokenBatch, TokenFile, TokenWindows, Window, WindowOrder,
    WindowSpec,
};
