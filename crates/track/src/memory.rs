//! What a backend reports of its memory: [`MemoryBackend`] and [`DeviceFigures`].

use burn::tensor::backend::Backend;
use serde::{Deserialize, Serialize};
use trainmem_core::CategoryBytes;

use crate::backend::Tracked;
use crate::buffer::TrackableBackend;
use crate::ledger::TrackedBytes;

/// Device memory as the backend reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceFigures {
    /// Live allocations (slices, not pages).
    pub number_allocs: u64,
    /// Bytes used by live allocations, padding excluded (≈ PyTorch's `memory_allocated`).
    pub bytes_in_use: u64,
    /// Padding bytes of live allocations.
    pub bytes_padding: u64,
    /// Bytes reserved from the device: in use plus pages kept for reuse (≈ PyTorch's
    /// `memory_reserved`).
    pub bytes_reserved: u64,
    /// Free device memory according to the driver, when it could be read.
    pub driver_free: Option<u64>,
    /// Total device memory according to the driver, when it could be read.
    pub driver_total: Option<u64>,
    /// Bytes in use per category: a backend that attributes its own tensors (trainmem-meta),
    /// or a device backend under [`Tracked`] (its buffers as the tracker counts them); `None`
    /// where the split is not known.
    #[serde(default)]
    pub categories: Option<CategoryBytes>,
}

/// A backend whose memory a measured run's probe can read beyond the host allocator.
///
/// CPU backends keep the defaults: their tensors are host heap memory, counted by the counting
/// allocator. `Autodiff` forwards to the backend it wraps; [`Tracked`] adds its counts.
pub trait MemoryBackend: Backend {
    /// Device memory figures for `device`, or `None` when the backend has no device pools.
    fn device_memory(_device: &Self::Device) -> Option<DeviceFigures> {
        None
    }

    /// Releases cached, unused device memory (`empty_cache`): `Backend::memory_cleanup`.
    fn empty_cache(device: &Self::Device) {
        Self::memory_cleanup(device);
    }

    /// The buffers the backend's tensors hold, per category, when a [`Tracked`] layer counts
    /// them; `None` otherwise.
    fn tracked_bytes() -> Option<TrackedBytes> {
        None
    }
}

impl MemoryBackend for burn::backend::Flex {}

impl<B: MemoryBackend, C: burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy>
    MemoryBackend for burn::backend::Autodiff<B, C>
{
    fn device_memory(device: &Self::Device) -> Option<DeviceFigures> {
        B::device_memory(device)
    }

    fn empty_cache(device: &Self::Device) {
        B::empty_cache(device);
    }

    fn tracked_bytes() -> Option<TrackedBytes> {
        B::tracked_bytes()
    }
}

/// The inner backend's device figures, with the tracker's bytes per category where the inner
/// backend names none (a device backend's buffers are device memory; Meta keeps its own); the
/// tracker's counts always.
impl<B: MemoryBackend + TrackableBackend> MemoryBackend for Tracked<B> {
    fn device_memory(device: &Self::Device) -> Option<DeviceFigures> {
        B::device_memory(device).map(|mut figures| {
            if figures.categories.is_none() {
                figures.categories = Some(crate::ledger::snapshot().live);
            }
            figures
        })
    }

    fn empty_cache(device: &Self::Device) {
        B::empty_cache(device);
    }

    fn tracked_bytes() -> Option<TrackedBytes> {
        Some(crate::ledger::snapshot())
    }
}
