//! Memory-mapped data sets and a multi-worker prefetching loader that accounts its own memory.
//!
//! * [`config`]: the loader's knobs ([`LoaderConfig`]), serde-serialisable for plans.
//! * Data sets: [`MappedArray`] (one `.npy` file, versions 1–3, or a raw record file with a JSON
//!   sidecar, validated at open), [`MmapDataset`] (several arrays side by side), the [`Dataset`]
//!   trait the loader reads, [`fixtures`] (deterministic data sets written on demand), and
//!   [`evict_page_cache`] (drop a file's cached pages before a cold or cgroup-limited run).
//! * The loader: [`Loader`] with sequential / shuffled / sharded sampling ([`EpochPlan`]),
//!   `workers` threads each building whole batches, at most `prefetch_factor × workers` batches
//!   in flight, delivery in sampler order, persistent or per-epoch workers, optional pinned
//!   staging, and its own memory report ([`LoaderMemory`]).
//! * Batch building: [`BatchBuilder`], a user transform + collate ([`MapCollate`]), the column
//!   stacker ([`StackColumns`]) and a random-resize augmentation ([`RandomResize`]).
//! * With feature `burn`: [`burn_adapter`], burn's `Dataset` trait over these data sets.

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
mod rng;
mod sampler;
mod staging;

#[cfg(feature = "burn")]
pub mod burn_adapter;

pub use array::{FileFormat, MappedArray, RawSidecar, sidecar_path};
pub use augment::{RandomResize, ResizeColumns, ScratchResize};
pub use builder::{BatchBuilder, BoxError, ColumnBatch, HeldBytes, MapCollate, StackColumns};
pub use config::{ConfigError, LoaderConfig, Order, Shard};
pub use context::WorkerContext;
pub use dataset::{Column, Dataset, MmapDataset, SampleView};
pub use dtype::{DTypeError, Dtype, Element, descr, from_descr};
pub use error::{DataError, FileProblem};
pub use loader::{Epoch, Loader, LoaderError, WorkerInfo};
pub use memory::{LoaderMemory, MemoryWatch};
pub use pagecache::evict_page_cache;
pub use rng::{Rng, mix};
pub use sampler::{EpochPlan, epoch_order};
pub use staging::BatchBuffer;
