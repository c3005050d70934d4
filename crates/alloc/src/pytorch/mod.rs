//! PyTorch's memory-snapshot formats, in one place.
//!
//! The snapshot dict itself (`segments`, `device_traces`, `allocator_settings`, as
//! `torch.cuda.memory._snapshot()` returns it and PyTorch's viewers read it) is the crate's
//! one snapshot model, [`Snapshot`](crate::Snapshot), which the allocator's own
//! [`snapshot`](crate::CachingAllocator::snapshot) returns too.
//!
//! * [`pickle`]: reading snapshot pickles (PyTorch's or trainmem's) and writing ones that
//!   `python -m torch.cuda._memory_viz` and pytorch.org/memory_viz open.
//! * [`framed`]: a snapshot read with the stack of every trace event and block (frames
//!   interned, shared as PyTorch shares them), and written back with categories set.
//! * [`replay`]: the replay engine: JSON-lines traces or a snapshot's `device_traces` as ops
//!   applied to a [`CachingAllocator`](crate::CachingAllocator) over any device.

pub mod framed;
pub mod pickle;
pub mod replay;
