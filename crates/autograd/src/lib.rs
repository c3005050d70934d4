//! An autograd graph over abstract tensors: which tensors a training step keeps, and when.
//!
//! trainmem-autograd runs the memory side of a training step without computing anything:
//! tensors are byte sizes, ops are entries of a table that says what each op saves for
//! backward, and the graph allocates and frees exactly what a framework's autograd would.
//! trainmem-sim runs every step of a plan through it over trainmem-alloc's caching allocator;
//! used alone it answers "how many bytes of activations does this model hold at batch *B*, and
//! from when to when" for a model written as a [`Program`].
//!
//! # The parts
//!
//! * [`Program`], built with [`ProgramBuilder`]: the ops of one forward pass in order, over
//!   values given in elements per sample (and fixed elements, e.g. a scalar loss), with
//!   parameters, layers, the caller-supplied inputs and the loss. Built once per model.
//! * [`SavedTable`]: what each [`OpKind`](trainmem_core::OpKind) saves for backward, as data, one table per framework
//!   ([`SavedTable::pytorch`], [`SavedTable::burn`]); the [`op`] module documents every entry.
//! * [`TensorStore`]: reference-counted tensors over a [`TensorMemory`], with live bytes per
//!   [`Category`](trainmem_core::Category) and the breakdown at the peak. [`CountingMemory`]
//!   is a plain counter (optionally with a capacity); [`AllocatorMemory`] puts every tensor in
//!   a block of trainmem-alloc's caching allocator, labelled with its category.
//! * [`Graph`]: runs a program over a store. [`Graph::forward`] returns a [`Tape`] (the saved
//!   tensors, the loss, any outputs the caller asked to hold); [`Graph::backward`] consumes it.
//!   [`LayerHooks`] are called at layer boundaries (ZeRO-3 gathers, gradient reduce-scatter).
//! * [`checkpoint`]: which layers drop their activations and recompute them in backward.
//!
//! # The rules
//!
//! * **Sizes.** A value of `per_sample` elements at batch `B` and size factor `s` has
//!   `round(per_sample × s) × B + fixed` elements, in the run's compute dtype (4 bytes for
//!   f32, 2 for f16/bf16) unless it has a fixed dtype (i64 token ids, the f32 loss).
//! * **Forward** allocates each op's output as `activation` (a `view` aliases its input) and
//!   records what the table says the op saves: a reference to an input or to the output (no
//!   new bytes, but the tensor lives until backward), or a new tensor: a boolean mask (1 byte
//!   per output element), i64 indices (8 bytes per output element), per-row statistics
//!   (`n × 4` bytes per row), per-channel statistics (not batch-scaled), or burn's graph
//!   bookkeeping ([`BURN_NODE_BYTES`] per recorded op). A value nobody saved is freed right
//!   after the last op that reads it. The program's inputs stay the caller's unless
//!   [`Graph::owns_inputs`] is set (burn moves the batch into the model).
//! * **Backward** walks the ops in reverse. The loss gradient and every input gradient are
//!   `temporary`, freed once the op that produced the value has run its backward. A
//!   parameter's gradient is allocated as `gradient` the first time it is reached
//!   ([`Graph::param_grad_bytes`], by default elements × compute dtype) and accumulated into
//!   afterwards (the addend is a short temporary); it stays until
//!   [`Graph::drop_param_grads`]. Each op's saved tensors are released as soon as its own
//!   backward is done, so activation memory falls as backward proceeds.
//! * **`retain_graph`** keeps every saved tensor on the tape, and a second backward is
//!   allowed; without it a second backward is [`BackwardError::Consumed`].
//! * **The tape holds the loss** (and any held outputs) until [`Tape::release`]; a tape the
//!   caller keeps without running backward keeps all its saved tensors alive. Keeping each
//!   step's tape is the retained-graph leak: memory grows by one step's activations a step.
//! * **No grad** ([`GradMode::NoGrad`]) saves nothing; backward on it is
//!   [`BackwardError::NoGraph`].
//! * **Checkpointing** ([`CheckpointPolicy`]: none, every `k` blocks, ⌈√n⌉ blocks, the least
//!   recomputation under a byte budget) keeps only a segment's inputs during forward and
//!   re-runs its forward inside backward; only layers begun with
//!   [`ProgramBuilder::begin_block`] are ever checkpointed.
//!
//! # Example: saved activations live from forward until backward
//!
//! A two-layer network, `x[4] → linear → relu → linear → out[2]`, with an MSE loss against
//! `t[2]`, at batch 8 in f32 with PyTorch's table, over a counting memory:
//!
//! ```
//! use trainmem_autograd::{
//!     BackwardError, CountingMemory, GradMode, Graph, NoHooks, ProgramBuilder, SavedTable,
//!     TensorStore, ValueDtype,
//! };
//! use trainmem_core::{Category, Dtype, OpKind};
//!
//! let mut b = ProgramBuilder::new();
//! let x = b.input(4, ValueDtype::Compute);
//! let t = b.input(2, ValueDtype::Compute);
//! b.begin_layer("fc1");
//! let (w1, b1) = (b.param(4 * 8, "fc1.weight"), b.param(8, "fc1.bias"));
//! let h = b.op(OpKind::Linear, &[x], 8, &[w1, b1]);
//! let a = b.op(OpKind::Relu, &[h], 8, &[]);
//! b.begin_layer("fc2");
//! let (w2, b2) = (b.param(8 * 2, "fc2.weight"), b.param(2, "fc2.bias"));
//! let out = b.op(OpKind::Linear, &[a], 2, &[w2, b2]);
//! b.loss(OpKind::MseLoss, &[out, t]);
//! let program = b.finish()?;
//!
//! const BATCH: u64 = 8;
//! let mut store = TensorStore::new(CountingMemory::new());
//! let mut graph = Graph::new(&program, &SavedTable::pytorch(), Dtype::F32);
//! // The batch and the targets are the caller's tensors.
//! let inputs = vec![
//!     store.alloc(BATCH * 4 * 4, Category::Input)?,
//!     store.alloc(BATCH * 2 * 4, Category::Input)?,
//! ];
//!
//! // Forward: relu saves its output `a` (which the second linear saves too), the MSE saves
//! // `out` and `t`, the first linear saves `x`. `h` is freed after relu read it.
//! let a_bytes = BATCH * 8 * 4;
//! let out_bytes = BATCH * 2 * 4;
//! let loss_bytes = 4;
//! let mut tape =
//!     graph.forward(&mut store, &inputs, BATCH, 1.0, GradMode::Train, &[], &mut NoHooks)?;
//! assert_eq!(store.live_of(Category::Activation), a_bytes + out_bytes + loss_bytes);
//! assert_eq!(tape.saved_count(), 5); // x, a (twice), out, t
//!
//! // Backward frees every saved tensor and leaves the parameter gradients.
//! graph.backward(&mut store, &mut tape, false, &mut NoHooks)?;
//! assert_eq!(tape.saved_count(), 0);
//! assert_eq!(store.live_of(Category::Activation), loss_bytes, "only the loss, on the tape");
//! assert_eq!(store.live_of(Category::Gradient), (32 + 8 + 16 + 2) * 4);
//! assert_eq!(store.live_of(Category::Temporary), 0);
//! assert!(matches!(
//!     graph.backward(&mut store, &mut tape, false, &mut NoHooks),
//!     Err(BackwardError::Consumed)
//! ));
//! tape.release(&mut store);
//! graph.drop_param_grads(&mut store);
//!
//! // retain_graph: the saved tensors outlive backward, until the tape is released.
//! let mut tape =
//!     graph.forward(&mut store, &inputs, BATCH, 1.0, GradMode::Train, &[], &mut NoHooks)?;
//! graph.backward(&mut store, &mut tape, true, &mut NoHooks)?;
//! assert_eq!(store.live_of(Category::Activation), a_bytes + out_bytes + loss_bytes);
//! tape.release(&mut store);
//! graph.drop_param_grads(&mut store);
//! assert_eq!(store.live_of(Category::Activation), 0);
//!
//! // Keeping each step's tape (say, to log the loss tensor later) keeps its graph: the leak
//! // grows by one step's activations per step.
//! let mut kept = Vec::new();
//! for step in 1..=3 {
//!     let tape =
//!         graph.forward(&mut store, &inputs, BATCH, 1.0, GradMode::Train, &[], &mut NoHooks)?;
//!     kept.push(tape);
//!     assert_eq!(store.live_of(Category::Activation), step * (a_bytes + out_bytes + loss_bytes));
//! }
//! for tape in kept {
//!     tape.release(&mut store);
//! }
//! // Only the caller's inputs are left.
//! assert_eq!(store.live_total(), BATCH * (4 + 2) * 4);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Over the caching allocator the same step holds what a GPU would: every tensor rounded to
//! 512 bytes, in a 2 MiB segment of the small pool.
//!
//! ```
//! # use trainmem_autograd::{GradMode, Graph, NoHooks, ProgramBuilder};
//! # use trainmem_core::{Dtype, OpKind};
//! # use trainmem_autograd::{SavedTable, TensorStore, ValueDtype};
//! use trainmem_alloc::{CachingAllocator, SimulatedDevice};
//! use trainmem_autograd::AllocatorMemory;
//! use trainmem_core::Category;
//! # let mut b = ProgramBuilder::new();
//! # let x = b.input(4, ValueDtype::Compute);
//! # let t = b.input(2, ValueDtype::Compute);
//! # b.begin_layer("fc1");
//! # let (w1, b1) = (b.param(4 * 8, "fc1.weight"), b.param(8, "fc1.bias"));
//! # let h = b.op(OpKind::Linear, &[x], 8, &[w1, b1]);
//! # let a = b.op(OpKind::Relu, &[h], 8, &[]);
//! # b.begin_layer("fc2");
//! # let (w2, b2) = (b.param(8 * 2, "fc2.weight"), b.param(2, "fc2.bias"));
//! # let out = b.op(OpKind::Linear, &[a], 2, &[w2, b2]);
//! # b.loss(OpKind::MseLoss, &[out, t]);
//! # let program = b.finish()?;
//! // `program` is the two-layer network above.
//! let device = CachingAllocator::new(SimulatedDevice::new(1 << 30));
//! let mut store = TensorStore::new(AllocatorMemory::new(device));
//! let mut graph = Graph::new(&program, &SavedTable::pytorch(), Dtype::F32);
//! let inputs = vec![
//!     store.alloc(8 * 4 * 4, Category::Input)?, // 128 B → 512 B
//!     store.alloc(8 * 2 * 4, Category::Input)?, //  64 B → 512 B
//! ];
//! let tape = graph.forward(&mut store, &inputs, 8, 1.0, GradMode::Train, &[], &mut NoHooks)?;
//! // a (256 B), out (64 B) and the loss (4 B): three blocks of 512 B.
//! assert_eq!(store.live_of(Category::Activation), 3 * 512);
//! let allocator = &store.memory().allocator;
//! assert_eq!(allocator.memory_allocated(), 5 * 512);
//! assert_eq!(allocator.memory_reserved(), 2 << 20);
//! tape.release(&mut store);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![forbid(unsafe_code)]

pub mod checkpoint;
pub mod graph;
mod memory;
pub mod op;
pub mod program;
pub mod store;

pub use checkpoint::{CheckpointPolicy, ResolvedCheckpointing, Segment};
pub use graph::{BackwardError, GradMode, Graph, LayerHooks, NoHooks, Pass, SizeOverflow, Tape};
pub use memory::AllocatorMemory;
pub use op::{BURN_NODE_BYTES, Saved, SavedTable, burn_recorded_ops};
pub use program::{
    LossChunks, Op, ParamId, ParamInfo, Program, ProgramBuilder, ProgramError, ValueDtype, ValueId,
    ValueInfo,
};
pub use store::{Allocated, CountingMemory, CountingOom, TensorId, TensorMemory, TensorStore};

#[cfg(test)]
mod tests;
