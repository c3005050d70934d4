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
//! Buffer identity is cubecl's, as on every cubecl runtime ([`crate::cube`]).

use crate::memory::{DeviceFigures, MemoryBackend};
use burn::backend::Cuda;
use burn::backend::cuda::CudaDevice;
use burn::cubecl::cuda::CudaRuntime;

/// Whether the CUDA driver library can be loaded (cudarc panics on first use otherwise).
pub fn driver_present() -> bool {
    // SAFETY: this only asks libloading to open the driver library by its usual names (running
    // its initialisers, as any first CUDA call does); no symbol is called.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// `Ok` when CUDA device `index` can be used, or what is missing, in words: the driver
/// library, or the device.
pub fn device_available(index: usize) -> Result<(), String> {
    if !driver_present() {
        return Err(
            "the CUDA driver library (libcuda) is not installed or not on the library \
                    path: this machine has no usable NVIDIA GPU"
                .into(),
        );
    }
    match driver_free_total(index) {
        Some(_) => Ok(()),
        None => Err(format!("the CUDA driver has no device {index}")),
    }
}

/// Free and total bytes of a device according to the driver, or `None` when the driver (or
/// the device) is unavailable.
pub fn driver_free_total(index: usize) -> Option<(u64, u64)> {
    if !driver_present() {
        return None;
    }
    let ctx = cudarc::driver::CudaContext::new(index).ok()?;
    let (free, total) = ctx.mem_get_info().ok()?;
    Some((free as u64, total as u64))
}

/// cubecl's pool figures and the driver's free/total for `device`.
pub fn device_memory(device: &CudaDevice) -> Option<DeviceFigures> {
    crate::cube::device_figures::<CudaRuntime>(device, driver_free_total(device.index))
}

impl MemoryBackend for Cuda {
    fn device_memory(device: &Self::Device) -> Option<DeviceFigures> {
        device_memory(device)
    }
}
