//! CUDA (feature `cuda`): device figures from cubecl and the driver, and buffer identity from
//! cubecl's memory handles.
//!
//! Two sources of device figures, read after the probe has synced the device:
//!
//! * cubecl's compute client for the device (`CudaRuntime::client(&device).memory_usage()`):
//!   bytes in use by live tensors (≈ PyTorch's `memory_allocated`), padding, and bytes reserved
//!   in cubecl's pools (≈ `memory_reserved`). In cubecl 0.10 this covers the calling thread's
//!   stream, which is the training thread's: the probe samples from that thread.
//! * the driver's free and total memory (`cuMemGetInfo` through cudarc on the device's primary
//!   context), which also sees memory held outside cubecl (the CUDA context itself, other
//!   processes).
//!
//! The CUDA driver library is loaded at run time, so this compiles without CUDA installed;
//! without a GPU the readings are `None` and a run on a CUDA device fails when burn first
//! touches it.
//!
//! **Buffer identity.** A burn CUDA tensor holds a cubecl `Handle` whose managed memory
//! handle is shared by every view and in-place result of the tensor (cubecl's `can_mut` counts
//! its holders). cubecl 0.10 keeps the handle's id private but prints it in the handle's
//! `Debug` form (`ManagedMemoryId { value: N }`); the tracker reads it from there
//! ([`crate::cubecl_id`], whose test holds the form on cubecl's own handles without a GPU). The bytes are the handle's size:
//! the slice size cubecl's `memory_usage` sums into bytes in use.

use burn::backend::Cuda;
use burn::backend::cuda::CudaDevice;
use burn::cubecl::Runtime;
use burn::cubecl::cuda::CudaRuntime;
use burn_cubecl::tensor::CubeTensor;

use crate::buffer::{BufferInfo, TrackableBackend};
use crate::memory::{DeviceFigures, MemoryBackend};

/// Free and total bytes of a device according to the driver, or `None` when the driver (or
/// the device) is unavailable.
pub fn driver_free_total(index: usize) -> Option<(u64, u64)> {
    let ctx = cudarc::driver::CudaContext::new(index).ok()?;
    let (free, total) = ctx.mem_get_info().ok()?;
    Some((free as u64, total as u64))
}

/// cubecl's pool figures and the driver's free/total for `device`.
pub fn device_memory(device: &CudaDevice) -> Option<DeviceFigures> {
    let client = CudaRuntime::client(device);
    let usage = client.memory_usage().ok()?;
    let driver = driver_free_total(device.index);
    Some(DeviceFigures {
        number_allocs: usage.number_allocs,
        bytes_in_use: usage.bytes_in_use,
        bytes_padding: usage.bytes_padding,
        bytes_reserved: usage.bytes_reserved,
        driver_free: driver.map(|d| d.0),
        driver_total: driver.map(|d| d.1),
        categories: None,
    })
}

impl MemoryBackend for Cuda {
    fn device_memory(device: &Self::Device) -> Option<DeviceFigures> {
        device_memory(device)
    }
}

fn cube_buffer(tensor: &CubeTensor<CudaRuntime>) -> Option<BufferInfo> {
    Some(BufferInfo {
        key: crate::cubecl_id::handle_id(&tensor.handle.memory)?,
        bytes: tensor.handle.size(),
        // The tensor's shape and strides are host memory, which the counting allocator sees;
        // not counted here.
        handle_bytes: 0,
        handle_key: 0,
    })
}

impl TrackableBackend for Cuda {
    fn float_buffer(tensor: &CubeTensor<CudaRuntime>) -> Option<BufferInfo> {
        cube_buffer(tensor)
    }

    fn int_buffer(tensor: &CubeTensor<CudaRuntime>) -> Option<BufferInfo> {
        cube_buffer(tensor)
    }

    fn bool_buffer(tensor: &CubeTensor<CudaRuntime>) -> Option<BufferInfo> {
        cube_buffer(tensor)
    }

    fn quantized_buffer(tensor: &CubeTensor<CudaRuntime>) -> Option<BufferInfo> {
        cube_buffer(tensor)
    }
}
