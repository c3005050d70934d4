//! Buffer identity on burn's cubecl backends (features `cuda`, `wgpu`): one rule for every
//! cubecl runtime, unfused and under burn's `fusion`.
//!
//! **Unfused** (`CubeBackend<R, …>`, whatever the runtime `R`): a tensor holds a cubecl
//! `Handle` whose managed memory handle is shared by every view and in-place result of the
//! tensor (cubecl's `can_mut` counts its holders). cubecl 0.10 keeps the handle's id private
//! but prints it in the handle's `Debug` form (`ManagedMemoryId { value: N }`); the tracker
//! reads it from there ([`crate::cubecl_id`], whose test holds the form on cubecl's own handles
//! without a GPU). The bytes are the handle's size: the slice size cubecl's `memory_usage` sums
//! into bytes in use.
//!
//! **With burn's `fusion` feature** (this crate's feature `fusion`), `burn::backend::Cuda` and
//! `Wgpu` are `Fusion<CubeBackend<…>>`: a tensor is a lazy id whose buffer exists only once its
//! queue runs, and an op fused away never gets one. The tracker then counts each fusion tensor
//! (clones share its id) at its dense size: a view gets an id of its own and is counted again,
//! and a fused-away intermediate is counted while a tensor holds it. The figures are the
//! logical tensors' bytes, which cubecl's bytes in use are compared against, not held to.

use burn::cubecl::Runtime;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};

use crate::buffer::{BufferInfo, TrackableBackend};
use crate::memory::DeviceFigures;

/// cubecl's pool figures for `device` of runtime `R` (its client's `memory_usage`), with the
/// driver's free and total bytes where the runtime has them; `None` when cubecl cannot say.
pub fn device_figures<R: Runtime>(
    device: &R::Device,
    driver_free_total: Option<(u64, u64)>,
) -> Option<DeviceFigures> {
    let usage = R::client(device).memory_usage().ok()?;
    Some(DeviceFigures {
        number_allocs: usage.number_allocs,
        bytes_in_use: usage.bytes_in_use,
        bytes_padding: usage.bytes_padding,
        bytes_reserved: usage.bytes_reserved,
        driver_free: driver_free_total.map(|d| d.0),
        driver_total: driver_free_total.map(|d| d.1),
        categories: None,
    })
}

/// The cubecl handle's id as the key, and its size.
fn cube_buffer<R: CubeRuntime>(tensor: &CubeTensor<R>) -> Option<BufferInfo> {
    Some(BufferInfo {
        key: crate::cubecl_id::handle_id(&tensor.handle.memory)?,
        bytes: tensor.handle.size(),
        // The tensor's shape and strides are host memory, which the counting allocator sees;
        // not counted here.
        handle_bytes: 0,
        handle_key: 0,
        adoptable: 0,
    })
}

/// Every cubecl runtime's tensors name their buffer by their memory handle.
impl<R, F, I, BT> TrackableBackend for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn float_buffer(tensor: &CubeTensor<R>) -> Option<BufferInfo> {
        cube_buffer(tensor)
    }

    fn int_buffer(tensor: &CubeTensor<R>) -> Option<BufferInfo> {
        cube_buffer(tensor)
    }

    fn bool_buffer(tensor: &CubeTensor<R>) -> Option<BufferInfo> {
        cube_buffer(tensor)
    }

    fn quantized_buffer(tensor: &CubeTensor<R>) -> Option<BufferInfo> {
        cube_buffer(tensor)
    }
}

/// A fusion tensor's id as a key, and its dense size.
#[cfg(feature = "fusion")]
fn fusion_buffer<R: burn_fusion::FusionRuntime>(
    tensor: &burn_fusion::FusionTensor<R>,
) -> Option<BufferInfo> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    tensor.id.hash(&mut h);
    Some(BufferInfo {
        key: h.finish(),
        bytes: (tensor.shape.num_elements() * tensor.dtype.size()) as u64,
        handle_bytes: 0,
        handle_key: 0,
        adoptable: 0,
    })
}

/// A fused backend's tensors are counted by their fusion ids (see the module docs).
#[cfg(feature = "fusion")]
impl<B: burn_fusion::FusionBackend> TrackableBackend for burn_fusion::Fusion<B> {
    fn float_buffer(tensor: &burn::tensor::ops::FloatTensor<Self>) -> Option<BufferInfo> {
        fusion_buffer(tensor)
    }

    fn int_buffer(tensor: &burn::tensor::ops::IntTensor<Self>) -> Option<BufferInfo> {
        fusion_buffer(tensor)
    }

    fn bool_buffer(tensor: &burn::tensor::ops::BoolTensor<Self>) -> Option<BufferInfo> {
        fusion_buffer(tensor)
    }

    fn quantized_buffer(tensor: &burn::tensor::ops::QuantizedTensor<Self>) -> Option<BufferInfo> {
        fusion_buffer(tensor)
    }
}
