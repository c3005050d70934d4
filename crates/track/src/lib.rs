//! Bytes per category on any burn backend.
//!
//! Two things live here, both facing burn backends:
//!
//! * **What a backend reports** ([`memory`]): the [`MemoryBackend`] trait a measured run's
//!   probe reads at every phase boundary, and the [`DeviceFigures`] it returns (cubecl's bytes in
//!   use and reserved on CUDA and wgpu, CUDA's driver free and total, and the bytes per
//!   category when they are known).
//! * **[`Tracked<B>`]**, a backend decorator: every op runs on the inner backend `B` unchanged,
//!   and every buffer the inner backend holds is counted, from the op that creates it until the
//!   last tensor sharing it is dropped, under the category the creating thread carries
//!   (trainmem-probe's tag, as measured runs set it). The counts are process-wide
//!   ([`snapshot`], [`reset_peaks`]).
//!
//! # Buffers, not tensors
//!
//! Views, in-place results and clones share their input's buffer; counting tensors would count
//! those bytes twice and release them early. [`Tracked<B>`] asks the inner backend which buffer
//! each output holds ([`TrackableBackend`]): Flex names its storage, Meta its buffer, every
//! cubecl runtime its memory handle (features `cuda`, `wgpu`; the `cube` module). An output whose buffer is already counted shares that
//! buffer's token; a new buffer gets a token of its own; the bytes leave the count when the last
//! token holder (a tensor of any op, view or clone) is dropped. A backend that cannot name its
//! buffers (`impl TrackableBackend for MyBackend {}`) is counted by a rule instead: an output of
//! a view op (reshape, permute, swap_dims, flip, expand, slice, unfold, detach) shares its
//! input's token, every other output is a new buffer of `elements × dtype size`. That rule is
//! wrong where such a backend writes in place (the result is counted as new bytes, under the
//! category of the op that wrote it, while the input's token goes when its tensor is consumed:
//! totals stay right, the category can move) and where it copies on a view op.
//!
//! ```
//! use burn::backend::{Autodiff, Flex};
//! use burn::tensor::Tensor;
//! use trainmem_core::Category;
//! use trainmem_probe::CategoryScope;
//! use trainmem_track::Tracked;
//!
//! type B = Autodiff<Tracked<Flex>>;
//! let device = Default::default();
//! let before = trainmem_track::snapshot().live.total();
//! let x = {
//!     let _tag = CategoryScope::enter(Category::Activation);
//!     Tensor::<B, 2>::ones([256, 256], &device)
//! };
//! let view = x.clone().reshape([65536]); // shares x's buffer
//! let after = trainmem_track::snapshot();
//! // One buffer: the data and Flex's storage header, counted once for x and its view.
//! let buffer = 256 * 256 * 4 + trainmem_track::buffer::FLEX_STORAGE_HEADER;
//! assert_eq!(after.live.total() - before, buffer);
//! assert!(after.live.get(Category::Activation) >= buffer);
//! drop((x, view));
//! assert_eq!(trainmem_track::snapshot().live.total(), before);
//! ```
//!
//! # The records beside the tensors
//!
//! A run holds more than its tensors: burn-autodiff registers a graph node for every float op
//! (even on tensors that need no gradient) until a backward frees it, optimizers keep records
//! per parameter, modules keep `Param` records, a loader keeps queues. Those are host memory on
//! every backend. Every op of [`Tracked<B>`] (and every clone of a tracked tensor) runs inside
//! a [`trainmem_probe::BackendScope`], so where trainmem-probe's counting allocator is the
//! global allocator, the host bytes allocated outside the backend's ops are those records:
//! [`TrackedBytes::records`], per category, less the host data a tensor took over as its
//! buffer (Flex keeps the block a `from_data` was given; [`BufferInfo::adoptable`]). On Flex,
//! the tracker's buffers, handles and records equal the counting allocator's bytes within
//! 80 bytes at every phase boundary of every CPU scenario plan (trainmem-meta's
//! `tests/burn_loop.rs`), and within 1% + 16 KiB on an LSTM and a per-item batcher, whose
//! records are most of what their forward and their batches add (`tests/records.rs` there).
//!
//! A device backend reads a tensor back (`into_data`, a transaction) into host buffers outside
//! Rust's allocator (cubecl's page-locked read buffers on CUDA, wgpu's mapped staging buffers),
//! which a counting allocator cannot see. [`Tracked<B>`] wraps such data so its bytes are
//! counted under the reading thread's category while the program holds it
//! ([`host_reads::live`]); the values, the alignment and the buffer's kind are unchanged.
//!
//! The op traits are implemented by code generated from burn-backend's trait definitions
//! (`codegen/gen_ops.py`): every method, defaulted ones included, calls the inner backend's
//! method of the same name, so no computed value changes. A method that a later burn adds
//! without a default stops `Tracked<B>` compiling until the code is generated again; one added
//! with a default runs burn's default body over tracked ops, so its buffers are still counted.

mod backend;
pub mod buffer;
#[cfg(any(feature = "cuda", feature = "wgpu"))]
pub mod cube;
pub mod cubecl_id;
#[cfg(feature = "cuda")]
pub mod cuda;
mod hash;
pub mod host_reads;
pub mod ledger;
pub mod memory;
#[allow(missing_docs)]
mod ops;
mod params;
pub mod tensor;
#[cfg(feature = "wgpu")]
pub mod wgpu;

pub use backend::Tracked;

/// Whether this build runs burn's cubecl backends fused (this crate's `fusion` feature, which
/// turns on burn's): `burn::backend::Cuda` and `Wgpu` are then `Fusion<CubeBackend<…>>`.
pub const FUSION: bool = cfg!(feature = "fusion");
pub use buffer::{BufferInfo, TrackableBackend};
pub use ledger::{TrackedBytes, records_beside, reset_peaks, snapshot};
pub use memory::{DeviceFigures, MemoryBackend};
pub use params::materialize;
pub use tensor::TrackedTensor;
