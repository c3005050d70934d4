//! Which buffer a tensor of the inner backend holds: [`TrackableBackend`].

use burn::backend::Flex;
use burn::backend::flex::FlexTensor;
use burn::tensor::backend::Backend;
use burn::tensor::ops::{BoolTensor, FloatTensor, IntTensor, QuantizedTensor};

/// The buffer behind one tensor of an inner backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferInfo {
    /// Names the buffer while it is alive: two live tensors hold the same buffer exactly when
    /// their keys are equal (an address, or an id the backend assigns). A key may be reused
    /// once the buffer is gone.
    pub key: u64,
    /// The buffer's bytes, as the backend holds them (a view's buffer is its base's).
    pub bytes: u64,
    /// Host bytes this one tensor holds beside the buffer (its own shape and strides on the
    /// heap; a view or clone holds its own): counted as the tensor's bookkeeping, not as the
    /// buffer.
    pub handle_bytes: u64,
    /// Names the tensor's own record while it is alive (the address of its strides), so an
    /// in-place op whose output keeps its input's record keeps its count too; 0 when unknown.
    pub handle_key: u64,
    /// Of `bytes`, those a tensor made from host data (`*_from_data`) takes over from the
    /// caller instead of allocating them in the op: the data's block and what the caller's
    /// `Bytes` boxed with it. Counted when the buffer's key is the data's address (the backend
    /// kept the caller's block); 0 for a backend that always copies.
    pub adoptable: u64,
}

/// A backend [`crate::Tracked`] can wrap, and how it names the buffer behind each tensor.
///
/// Every method defaults to `None`: "this backend cannot tell". A backend that names its
/// buffers is counted exactly (views, in-place results and shared handles join the buffer's
/// existing count); one that does not is counted by the view rule of the crate docs.
pub trait TrackableBackend: Backend {
    /// The buffer of a float tensor.
    fn float_buffer(_tensor: &FloatTensor<Self>) -> Option<BufferInfo> {
        None
    }

    /// The buffer of an int tensor.
    fn int_buffer(_tensor: &IntTensor<Self>) -> Option<BufferInfo> {
        None
    }

    /// The buffer of a bool tensor.
    fn bool_buffer(_tensor: &BoolTensor<Self>) -> Option<BufferInfo> {
        None
    }

    /// The buffer of a quantized tensor's values.
    fn quantized_buffer(_tensor: &QuantizedTensor<Self>) -> Option<BufferInfo> {
        None
    }
}

/// The heap bytes every Flex storage holds beside its data, once per buffer: the `Arc<Bytes>`
/// block (two reference counts and the `Bytes` header) and the allocation controller that
/// `Bytes` boxes (24 bytes for memory Flex allocates itself; the property test of
/// `tests/flex_ops.rs` holds the sum against the counting allocator).
pub const FLEX_STORAGE_HEADER: u64 =
    (2 * std::mem::size_of::<usize>() + std::mem::size_of::<burn::tensor::Bytes>() + 24) as u64;

/// Dimensions a Flex shape keeps inline (cubecl-zspace's `INLINE_DIMS`); a shape of more
/// dimensions moves to the heap.
const FLEX_INLINE_DIMS: usize = 5;

/// The heap bytes of a Flex storage's `Arc<Bytes>` block, which Flex allocates in the op even
/// when it keeps the caller's data (`from_data`); the rest of [`FLEX_STORAGE_HEADER`] is the
/// allocation controller, boxed with the data by whoever made the `Bytes`.
const FLEX_STORAGE_ARC: u64 =
    (2 * std::mem::size_of::<usize>() + std::mem::size_of::<burn::tensor::Bytes>()) as u64;

/// The heap bytes one Flex tensor holds beside its storage: its strides (`Vec<isize>`, one per
/// dimension) and, beyond five dimensions, its shape.
fn flex_handle_bytes(rank: usize) -> u64 {
    let word = std::mem::size_of::<usize>();
    let shape = if rank > FLEX_INLINE_DIMS {
        rank * word
    } else {
        0
    };
    (rank * word + shape) as u64
}

/// Flex's tensors hold an `Arc` of their byte storage: the data's address names the buffer
/// (views and in-place results keep the same storage); the bytes are the storage's capacity
/// plus its [`FLEX_STORAGE_HEADER`], as the host allocates them.
fn flex_buffer(tensor: &FlexTensor) -> Option<BufferInfo> {
    // The allocation's capacity, not the data's length: a small result can sit in a larger
    // allocation (4 bytes of data in 16). The `Arc` is cloned for the read and dropped at once,
    // after the op that made the tensor, so no op sees a shared storage because of it.
    let storage = tensor.data_arc();
    Some(BufferInfo {
        key: storage.as_ptr() as usize as u64,
        bytes: storage.capacity() as u64 + FLEX_STORAGE_HEADER,
        handle_bytes: flex_handle_bytes(tensor.layout().num_dims()),
        handle_key: tensor.layout().strides().as_ptr() as usize as u64,
        adoptable: storage.capacity() as u64 + FLEX_STORAGE_HEADER - FLEX_STORAGE_ARC,
    })
}

/// Float, int and bool tensors name their storage; quantized tensors (whose storage Flex does
/// not expose) follow the view rule.
impl TrackableBackend for Flex {
    fn float_buffer(tensor: &FlexTensor) -> Option<BufferInfo> {
        flex_buffer(tensor)
    }

    fn int_buffer(tensor: &FlexTensor) -> Option<BufferInfo> {
        flex_buffer(tensor)
    }

    fn bool_buffer(tensor: &FlexTensor) -> Option<BufferInfo> {
        flex_buffer(tensor)
    }
}
