//! wgpu (feature `wgpu`): burn's cubecl backend on Vulkan, Metal or DirectX 12, device figures
//! from cubecl and the adapter from wgpu.
//!
//! * cubecl's compute client for the device (`WgpuRuntime::client(&device).memory_usage()`):
//!   bytes in use by live tensors, padding, and bytes reserved in cubecl's pools, as on CUDA.
//!   wgpu reports no free/total device memory, so the driver figures stay `None`.
//! * the adapter burn's default device picks ([`adapter`]): its name, its kind (a discrete or
//!   integrated GPU, or a CPU such as Mesa's lavapipe, a software Vulkan that makes a machine
//!   with no GPU run a cubecl runtime for real), and the two limits cubecl sizes its pools
//!   from: the largest page is the largest storage-buffer binding, the alignment the uniform
//!   offset alignment.
//!
//! Buffer identity is cubecl's, as on every cubecl runtime ([`crate::cube`]). Reads of a
//! tensor return wgpu's mapped staging buffers, outside Rust's allocator: counted by
//! [`crate::host_reads`] while the caller holds them.

use burn::backend::Wgpu;
use burn::backend::wgpu::graphics::{AutoGraphicsApi, GraphicsApi};
use burn::backend::wgpu::{WgpuDevice, WgpuRuntime};

use crate::memory::{DeviceFigures, MemoryBackend};

/// The adapter burn's default wgpu device runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adapter {
    /// The adapter's name (`llvmpipe (LLVM 15.0.6, 256 bits)`, `NVIDIA GeForce RTX 4090`).
    pub name: String,
    /// The graphics API (`Vulkan`, `Metal`, `Dx12`).
    pub api: String,
    /// What the adapter is: `DiscreteGpu`, `IntegratedGpu`, `VirtualGpu`, `Cpu` or `Other`.
    pub kind: String,
    /// The largest storage-buffer binding in bytes: cubecl's largest page on this adapter.
    pub max_page_size: u64,
    /// The uniform buffer offset alignment in bytes: cubecl's allocation alignment here.
    pub alignment: u64,
}

/// The adapter burn's default wgpu device would run on (the graphics API burn picks for this
/// platform, high-performance preference), or why there is none, in words. burn itself
/// panics without one; this asks wgpu first, once per process (every later call gets the
/// same answer).
pub fn adapter() -> Result<Adapter, String> {
    static FOUND: std::sync::OnceLock<Result<Adapter, String>> = std::sync::OnceLock::new();
    FOUND.get_or_init(find_adapter).clone()
}

fn find_adapter() -> Result<Adapter, String> {
    let api = AutoGraphicsApi::backend();
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
        backends: api.into(),
        ..wgpu::InstanceDescriptor::new_without_display_handle()
    });
    let found =
        cubecl_common::future::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions {
            power_preference: wgpu::PowerPreference::HighPerformance,
            force_fallback_adapter: false,
            compatible_surface: None,
        }))
        .map_err(|e| {
            format!(
                "wgpu finds no {api:?} adapter ({e}): this machine has no GPU driver wgpu can use \
             (on Linux without a GPU, Mesa's software Vulkan, package `mesa-vulkan-drivers`, \
             provides one)"
            )
        })?;
    let info = found.get_info();
    let limits = found.limits();
    Ok(Adapter {
        name: info.name,
        api: format!("{:?}", info.backend),
        kind: format!("{:?}", info.device_type),
        max_page_size: limits.max_storage_buffer_binding_size,
        alignment: u64::from(limits.min_uniform_buffer_offset_alignment),
    })
}

/// cubecl's pool figures for `device` (no driver figures: wgpu reports none).
pub fn device_memory(device: &WgpuDevice) -> Option<DeviceFigures> {
    crate::cube::device_figures::<WgpuRuntime>(device, None)
}

impl MemoryBackend for Wgpu {
    fn device_memory(device: &Self::Device) -> Option<DeviceFigures> {
        device_memory(device)
    }
}
