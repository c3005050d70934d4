//! trainmem-meta: a burn backend whose tensors have shapes and dtypes but no data.
//!
//! (Crate docs are completed below.)

mod backend;
mod device;
pub mod memory;
mod ops;
mod shape;
mod tensor;

pub use backend::Meta;
pub use device::MetaDevice;
pub use memory::{AllocationHook, Ledger, MemoryStats};
pub use tensor::{MetaQTensor, MetaTensor, tensor_bytes};
