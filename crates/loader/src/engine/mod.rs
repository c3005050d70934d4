//! The loading engine: everything between a [`Dataset`](crate::Dataset) and the batches the
//! caller receives, whatever file format the samples come from.
//!
//! * [`config`]: the knobs ([`LoaderConfig`](crate::LoaderConfig)); [`sampler`]: each epoch's
//!   order, sharded and cut into batches; [`resume`]: where a run stands, to continue it.
//! * [`loader`]: the workers, the bounded queue and the reorder buffer
//!   ([`Loader`](crate::Loader), [`Epoch`](crate::Epoch)); [`pacing`]: how the caller waits
//!   for the workers.
//! * [`builder`], [`context`], [`batch_writer`] and [`augment`]: how a batch is built from
//!   sample indices, and what a builder sees while it builds.
//! * [`staging`]: the batch buffers and their pool; [`memory`]: the loader's own byte
//!   counts; [`build_times`]: how long each batch took to build.

pub mod augment;
pub(crate) mod batch_writer;
pub(crate) mod build_times;
pub(crate) mod builder;
pub mod config;
pub(crate) mod context;
pub(crate) mod loader;
pub(crate) mod memory;
pub(crate) mod pacing;
pub(crate) mod resume;
pub(crate) mod sampler;
pub(crate) mod staging;
