//! Memory-mapped data sets and a multi-worker prefetching loader that accounts its own memory.
//!
//! trainmem-loader feeds trainmem's measured training runs (trainmem-burn, and the
//! `epoch-spike`, `memmap-vs-preload` and `pinned-staging` scenarios), and its knobs and
//! memory terms are what trainmem-sim's host-memory model predicts. It depends on no training
//! framework: anything that wants batches of rows from `.npy` or raw record files, built by
//! worker threads, in a fixed order, with a bound on the memory held in flight, can use it
//! alone (with feature `burn` it also plugs into burn's `Dataset` trait).
//!
//! # Two rooms
//!
//! The source keeps the file formats and the loading engine apart, with a few shared leaves
//! (the [`Dataset`] trait and [`MmapDataset`], element types (trainmem-core's
//! [`Dtype`](trainmem_core::Dtype) with [`Element`]), the errors, the random generator, the
//! page-cache tools) beside them. Every public item is re-exported from this root (and the
//! public modules `npy`, `config`, `augment`, `fixtures` and `format_fixtures` too), so no
//! import names either folder.
//!
//! * `src/formats/`: one module per kind of data file (`.npy` and raw records, token files,
//!   Megatron indexed, Arrow IPC, safetensors), each validated at open and read zero-copy from a
//!   memory mapping, plus the fixture writers. A new format is a module here implementing
//!   [`Dataset`] (and, when it needs its own batching, a [`BatchBuilder`]).
//! * `src/engine/`: everything between a [`Dataset`] and the caller's batches, whatever the
//!   format: the knobs, the sampler, the workers and reorder buffer, the batch builders' context
//!   and buffers, the memory accounting and build times, resumption.
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
//!   augmentation with per-worker scratch ([`RandomResize`], [`ScratchResize`]); a
//!   [`BatchWriter`] ([`WorkerContext::writer`]) for collates that write rows, padding and
//!   masks into one buffer front to back, every byte once, no zeroing first. Builders see
//!   a [`WorkerContext`] (worker id, a per-batch random generator, scratch and output
//!   buffers that are accounted).
//! * Memory: [`LoaderMemory`], the loader's own byte counts, read with [`Loader::memory`],
//!   [`Loader::memory_peak`], or a [`MemoryWatch`] from any thread.
//! * Training-data formats: [`TokenFile`] and [`TokenWindows`] (a flat `u16`/`u32` token
//!   file cut into windows of `seq + 1` tokens, [`StackWindows`] to batch them),
//!   [`IndexedTokens`] (Megatron-LM's `.bin` + `.idx`), [`ArrowDataset`] (an Arrow IPC file or
//!   stream, such as a Hugging Face `datasets` cache, with [`StackArrowColumns`],
//!   [`PadCollate`] and [`PackCollate`]) and [`open_safetensors`] (one tensor per column), all
//!   memory-mapped and zero-copy until the batch copy; [`format_fixtures`] writes large ones.
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
//!   the pool when the batch is dropped (`pin_memory` also `mlock`s them). A thread is handed
//!   the block it last wrote on the same CPU when one fits (so the next batch is written into
//!   lines already in that CPU's cache, not fetched from another's). On x86_64, batch buffers
//!   of 1 MiB or more are written with non-temporal stores when the buffers in rotation (the
//!   batches in flight and the caller's) would not fit in three quarters of the last-level
//!   cache: they are not read back before the hand-off, so the copy skips reading each
//!   destination line first.
//! * **Waiting**: with fewer workers than CPUs, a caller whose batches have been arriving
//!   within 100 µs polls for up to 100 µs before it sleeps (backing off when a poll misses or
//!   loses its CPU), so that its worker need not wake it for every batch; with as many workers
//!   as CPUs or more, each worker yields its CPU after handing a batch over, so that the
//!   caller runs at once. Neither changes which batches are delivered or how many are in flight.
//! * **Build times**: every batch's build (its transforms and collate, in a worker or in the
//!   caller) is timed into a histogram per building thread; [`Loader::build_times`] reads them
//!   merged ([`BuildTimes`]: count, total, quantiles within 1/16). With workers, build times
//!   above those of a 0-worker loader mean the workers' CPUs are slower or shared; the same
//!   build times with a slower epoch mean the time goes in the hand-over.
//! * **Accounting**: [`LoaderMemory::total`] is `queue + reorder + building + scratch +
//!   staging_idle + sampler`; the sampler holds 8 bytes per sample of the epoch; a batch
//!   counts once while in flight and not at all once the caller has it. Worker threads tag
//!   themselves [`Category::Input`](trainmem_core::Category::Input), so a counting global
//!   allocator (trainmem-probe) files their bytes under `input`.
//! * **Failures** are per batch: a transform that errors or panics yields an `Err` naming the
//!   sample and the epoch goes on; a timeout ends the epoch at its deadline, without waiting
//!   for a worker stuck in a transform (it is retired, and exits once the transform returns:
//!   [`Loader::abandoned_workers`]); dropping an [`Epoch`] cancels it.
//! * **Limits**: a configuration is refused ([`ConfigError`]) beyond [`MAX_WORKERS`] workers or
//!   [`MAX_BATCHES_IN_FLIGHT`] batches in flight, and a data set beyond [`MAX_EPOCH_SAMPLES`]
//!   samples ([`LoaderError::EpochTooLarge`]), rather than overflowing or exhausting memory.
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
//!
//! # Example: token windows from a nanoGPT `train.bin`
//!
//! ```
//! use std::sync::Arc;
//! use trainmem_core::Dtype;
//! use trainmem_loader::{
//!     Dataset, Loader, LoaderConfig, StackWindows, TokenFile, TokenWindows, WindowOrder,
//!     WindowSpec,
//! };
//!
//! let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/data/tokens_u16.bin");
//! // 4,096 u16 ids, every one checked against GPT-2's vocabulary at open.
//! let tokens = TokenFile::open(path, Dtype::U16, Some(50257))?;
//! assert_eq!(tokens.len(), 4096);
//! // 200 windows of 65 tokens at seeded random offsets (nanoGPT's get_batch, addressable).
//! let spec = WindowSpec { seq: 64, order: WindowOrder::Random { count: 200, seed: 1 } };
//! let windows = Arc::new(TokenWindows::new(tokens, spec)?);
//! let config = LoaderConfig { batch_size: 8, workers: 2, ..LoaderConfig::default() };
//! let mut loader = Loader::new(Arc::clone(&windows), config, StackWindows)?;
//! for batch in loader.epoch()? {
//!     let batch = batch?;
//!     let (input, target) = batch.input_target::<u16>(0).expect("u16 row");
//!     assert_eq!((input.len(), target.len()), (64, 64));
//!     assert_eq!(input[1..], target[..63]); // the target is the input shifted by one
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Example: a Megatron-LM indexed data set, windows inside documents
//!
//! ```
//! use trainmem_loader::{Dataset, IndexedTokens, WindowOrder, WindowSpec};
//!
//! let prefix = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/data/indexed_u16");
//! let indexed = IndexedTokens::open(prefix, Some(50257))?; // reads .idx and .bin
//! assert_eq!(indexed.documents().len(), 12);
//! let docs = indexed.documents().to_vec();
//! let spec = WindowSpec { seq: 16, order: WindowOrder::Strided { stride: 8 } };
//! let windows = indexed.windows(spec, false)?; // no window crosses a document's end
//! for i in 0..windows.len() {
//!     let w = windows.sample(i)?;
//!     assert!(docs.iter().any(|&(s, n)| s <= w.start && w.start + 17 <= s + n));
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Example: a `datasets` Arrow cache, padded per batch
//!
//! ```
//! use std::sync::Arc;
//! use trainmem_loader::{ArrowDataset, Loader, LoaderConfig, PadCollate, PadTo};
//!
//! let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/data/hf_stream.arrow");
//! // An Arrow IPC stream written by pyarrow: input_ids list<int32>, attention_mask,
//! // pixels fixed_size_list<float32, 4>, label int64.
//! let data = Arc::new(ArrowDataset::open_columns(path, &["input_ids", "label"])?);
//! let pad = PadCollate::new(&data, "input_ids", 0, PadTo::Longest)?;
//! let config = LoaderConfig { batch_size: 4, ..LoaderConfig::default() };
//! let mut loader = Loader::new(Arc::clone(&data), config, pad)?;
//! let batch = loader.epoch()?.next().expect("a batch")?;
//! let longest = *batch.lengths.iter().max().expect("rows");
//! assert_eq!(batch.width, longest);
//! // The mask is 1 over each row's ids and 0 over its padding.
//! let ones: usize = batch.mask().iter().map(|&m| usize::from(m)).sum();
//! assert_eq!(ones, batch.lengths.iter().sum::<usize>());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Example: a safetensors file, one tensor per column
//!
//! ```
//! use std::sync::Arc;
//! use trainmem_loader::{Dataset, Loader, LoaderConfig, StackColumns, open_safetensors};
//!
//! let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/data/tensors.safetensors");
//! let data = Arc::new(open_safetensors(path, &["features", "labels"])?);
//! assert_eq!(data.len(), 32); // the tensors' first dimension
//! let config = LoaderConfig { batch_size: 16, ..LoaderConfig::default() };
//! let mut loader = Loader::new(Arc::clone(&data), config, StackColumns)?;
//! let batch = loader.epoch()?.next().expect("a batch")?;
//! assert_eq!(batch.shapes, [vec![16, 8], vec![16]]);
//! assert_eq!(batch.column::<f32>(0).expect("f32")[9], 9.0 / 4.0); // (8 i + j) / 4
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

// The README's examples run as doc tests, so that they keep compiling (the docs above, not the
// README, are the crate's root documentation).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

mod dataset;
mod dtype;
mod engine;
mod error;
mod formats;
mod pagecache;
mod rng;

#[cfg(feature = "burn")]
pub mod burn_adapter;

// Shared by both rooms.
pub use dataset::{Column, Dataset, MmapDataset, SampleView};
pub use dtype::{DTypeError, Element, descr, from_descr};
pub use error::{DataError, FileProblem};
pub use pagecache::{
    MappedPages, evict_page_cache, mapped_pages, mapped_pages_in, read_in_huge_pages,
};
pub use rng::{Rng, mix};

// The file formats.
pub use formats::array::{FileFormat, MappedArray, RawSidecar, sidecar_path};
pub use formats::arrow_collate::{
    PackCollate, PackedBatch, PadCollate, PadTo, PaddedBatch, Segment, StackArrowColumns,
    scalar_bytes,
};
pub use formats::arrow_dataset::{ArrowColumn, ArrowDataset, ArrowRow, ColumnKind, dtype_of_arrow};
pub use formats::arrow_ipc_file::{ARROW_MAGIC, ArrowFormat};
pub use formats::indexed::{IDX_MAGIC, IndexedTokens, code_of_dtype, dtype_of_code, write_indexed};
pub use formats::mapped::MappedFile;
pub use formats::safetensors_file::{dtype_of_safetensors, open_safetensors};
pub use formats::tokens::{
    StackWindows, TOKEN_DTYPES, TokenBatch, TokenFile, TokenWindows, Window, WindowOrder,
    WindowSpec,
};
pub use formats::{fixtures, format_fixtures, npy};

// The loading engine.
pub use engine::augment::{RandomResize, ResizeColumns, ScratchResize};
pub use engine::batch_writer::BatchWriter;
pub use engine::build_times::BuildTimes;
pub use engine::builder::{
    BatchBuilder, BoxError, ColumnBatch, HeldBytes, MapCollate, StackColumns,
};
pub use engine::config::{
    ConfigError, LoaderConfig, MAX_BATCHES_IN_FLIGHT, MAX_WORKERS, Order, Shard, ShardTail,
};
pub use engine::context::WorkerContext;
pub use engine::loader::{Epoch, Loader, LoaderError, WorkerInfo};
pub use engine::memory::{LoaderMemory, MemoryWatch};
pub use engine::pacing::current_cpu;
pub use engine::resume::{LoaderState, ResumeError};
pub use engine::sampler::{EpochPlan, MAX_EPOCH_SAMPLES, epoch_order, shard_order};
pub use engine::staging::{BatchBuffer, prefetch_pages};
pub use engine::{augment, config};
