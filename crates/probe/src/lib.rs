//! Host-memory probes shared by every trainmem crate.
//!
//! * [`Category`]: the names bytes are counted under, the same ones PyTorch's memory timeline
//!   uses (parameter, gradient, optimizer state, activation, input, temporary, cache, other).

mod category;

pub use category::Category;
