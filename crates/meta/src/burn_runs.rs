//! trainmem-burn's own training loop on Meta: the loop measured runs use, with only the backend
//! type changed.
//!
//! [`Meta`] implements trainmem-burn's `MemoryBackend`: at every phase boundary the probe reads
//! the device's live tensor bytes per category (and, with a [`crate::CachingModel`], the
//! allocator's allocated and reserved bytes) as device memory. Host figures (the loader's
//! batches, the counting allocator, RSS) are read as in any measured run.

use trainmem_burn::{BurnRunError, DeviceMemory, MeasuredRun, MemoryBackend, RunOptions};
use trainmem_core::plan::Plan;
use trainmem_core::timeline::Source;

use crate::backend::Meta;
use crate::device::MetaDevice;

impl MemoryBackend for Meta {
    fn device_memory(device: &MetaDevice) -> Option<DeviceMemory> {
        let stats = device.stats();
        let totals = device.ledger().device_totals();
        Some(DeviceMemory {
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

/// Trains `plan` with trainmem-burn's loop on `device` (a fresh [`MetaDevice`] per run keeps
/// runs apart). The timeline's source is [`Source::Simulated`] (a prediction); tensor bytes are
/// in its device domain.
pub fn run_plan(
    plan: &Plan,
    opts: RunOptions<'_>,
    device: MetaDevice,
) -> Result<MeasuredRun, BurnRunError> {
    let mut run = trainmem_burn::run_on_backend::<Meta>(plan, opts, device, "trainmem-meta")?;
    run.timeline.source = Source::Simulated;
    Ok(run)
}
