//! Device memory on CUDA (feature `cuda`).
//!
//! Two sources, read after the probe has synced the device:
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

use burn::cubecl::Runtime;
use burn::cubecl::cuda::{CudaDevice, CudaRuntime};

use crate::probe::DeviceMemory;

/// Free and total bytes of a device according to the driver, or `None` when the driver (or
/// the device) is unavailable.
pub fn driver_free_total(index: usize) -> Option<(u64, u64)> {
    let ctx = cudarc::driver::CudaContext::new(index).ok()?;
    let (free, total) = ctx.mem_get_info().ok()?;
    Some((free as u64, total as u64))
}

/// cubecl's pool figures and the driver's free/total for `device`.
pub fn device_memory(device: &CudaDevice) -> Option<DeviceMemory> {
    let client = CudaRuntime::client(device);
    let usage = client.memory_usage().ok()?;
    let driver = driver_free_total(device.index);
    Some(DeviceMemory {
        number_allocs: usage.number_allocs,
        bytes_in_use: usage.bytes_in_use,
        bytes_padding: usage.bytes_padding,
        bytes_reserved: usage.bytes_reserved,
        driver_free: driver.map(|d| d.0),
        driver_total: driver.map(|d| d.1),
        categories: None,
    })
}
