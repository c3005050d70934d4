//! An autograd graph over abstract tensors: which tensors a training step keeps, and when.
//!
//! A [`Program`] lists the ops of one forward pass over abstract tensors (elements per
//! sample, dtype). A [`Graph`] runs it over a [`TensorStore`], whose bytes come from any
//! [`TensorMemory`] (the caching allocator of trainmem-alloc via [`AllocatorMemory`], or a
//! plain counter):
//!
//! * **forward** allocates each op's output and records the tensors the op saves for
//!   backward, per the data-driven [`SavedTable`] (documented in [`op`]); intermediate
//!   values are freed after their last use unless saved;
//! * **backward** walks the ops in reverse, allocating input gradients (temporary) and
//!   parameter gradients, and frees each op's saved tensors as soon as its backward is done;
//! * `retain_graph` keeps the saved tensors; a [`Tape`] the caller keeps (with held
//!   outputs) keeps them alive: the leak;
//! * [`checkpoint`] segments drop their activations and recompute them in backward
//!   (policies: none, every k layers, √n, best under a memory budget);
//! * a no-grad forward saves nothing.

pub mod checkpoint;
pub mod graph;
mod memory;
pub mod op;
pub mod program;
pub mod store;

pub use checkpoint::{CheckpointPolicy, ResolvedCheckpointing, Segment};
pub use graph::{BackwardError, GradMode, Graph, LayerHooks, NoHooks, Pass, Tape};
pub use memory::AllocatorMemory;
pub use op::{BURN_NODE_BYTES, Framework, OpKind, Saved, SavedTable, burn_recorded_ops};
pub use program::{
    Op, ParamId, ParamInfo, Program, ProgramBuilder, ProgramError, ValueDtype, ValueId, ValueInfo,
};
pub use store::{Allocated, CountingMemory, CountingOom, TensorId, TensorMemory, TensorStore};
pub use trainmem_core::Dtype;

#[cfg(test)]
mod tests;
