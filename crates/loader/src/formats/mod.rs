//! The file formats: each module reads one kind of data file, validates it at open and
//! serves its samples as a [`Dataset`](crate::Dataset), zero-copy from a memory mapping until
//! the batch copy.
//!
//! * [`npy`] parses and writes the `.npy` header; [`array`] maps one `.npy` array or raw record
//!   file ([`MappedArray`](crate::MappedArray)), which `MmapDataset` puts side by side.
//! * [`mapped`] maps one whole file ([`MappedFile`](crate::MappedFile)) for the readers below,
//!   and holds the check every mapped file shares: the file must not have shrunk since it was
//!   opened (`check_not_shrunk`).
//! * [`tokens`]: flat token files cut into windows; [`indexed`]: Megatron-LM's `.bin` + `.idx`.
//! * [`arrow_ipc_file`] decodes an Arrow IPC file or stream, [`arrow_dataset`] serves its
//!   columns and [`arrow_collate`] batches them (stacked, padded or packed).
//! * [`safetensors_file`]: one tensor per column.
//! * [`fixtures`] and [`format_fixtures`] write deterministic files of these formats on demand.
//!
//! Format modules use the loading engine only through its builder interface
//! ([`BatchBuilder`](crate::BatchBuilder), [`WorkerContext`](crate::WorkerContext)), to batch
//! what they read.

pub(crate) mod array;
pub(crate) mod arrow_collate;
pub(crate) mod arrow_dataset;
pub(crate) mod arrow_ipc_file;
pub mod fixtures;
pub mod format_fixtures;
pub(crate) mod indexed;
pub(crate) mod mapped;
pub mod npy;
pub(crate) mod safetensors_file;
pub(crate) mod tokens;
