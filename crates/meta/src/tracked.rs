//! [`Meta`] under trainmem-track's traits, so trainmem-burn's training loop (the loop measured
//! runs use: `trainmem_burn::run_predicted::<Meta>(plan, opts, device, PRODUCER)`) runs on it
//! with only the backend type changed.
//!
//! [`Meta`] implements trainmem-track's `MemoryBackend` and `TrackableBackend` (a Meta tensor
//! names its counted buffer, so `Tracked<Meta>` counts exactly what Meta's own ledger counts):
//! at every phase boundary the probe reads
//! the device's live tensor bytes per category (and, with a [`crate::CachingModel`], the
//! allocator's allocated and reserved bytes) as device memory. Host figures (the loader's
//! batches, the counting allocator, RSS) are read as in any measured run.

use trainmem_track::{BufferInfo, DeviceFigures, MemoryBackend, TrackableBackend};

use crate::backend::Meta;
use crate::device::MetaDevice;
use crate::tensor::{MetaQTensor, MetaTensor};

/// The name a run on Meta gives its timeline's producer.
pub const PRODUCER: &str = "trainmem-meta";

impl MemoryBackend for Meta {
    fn device_memory(device: &MetaDevice) -> Option<DeviceFigures> {
        let stats = device.stats();
        let totals = device.ledger().device_totals();
        Some(DeviceFigures {
            number_allocs: stats.live_buffers(),
            bytes_in_use: totals.map_or(stats.total_live, |t| t.allocated),
            bytes_padding: 0,
            bytes_reserved: totals.map_or(stats.total_live, |t| t.reserved),
            driver_free: None,
            driver_total: None,
            categories: Some(stats.live),
        })
    }
}

fn meta_buffer(tensor: &MetaTensor) -> Option<BufferInfo> {
    Some(BufferInfo {
        key: tensor.buffer_key(),
        bytes: tensor.buffer_bytes(),
        handle_bytes: 0,
        handle_key: 0,
        adoptable: 0,
    })
}

impl TrackableBackend for Meta {
    fn float_buffer(tensor: &MetaTensor) -> Option<BufferInfo> {
        meta_buffer(tensor)
    }

    fn int_buffer(tensor: &MetaTensor) -> Option<BufferInfo> {
        meta_buffer(tensor)
    }

    fn bool_buffer(tensor: &MetaTensor) -> Option<BufferInfo> {
        meta_buffer(tensor)
    }

    fn quantized_buffer(tensor: &MetaQTensor) -> Option<BufferInfo> {
        meta_buffer(tensor.values())
    }
}
