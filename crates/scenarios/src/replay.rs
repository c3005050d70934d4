//! A measured run's tensor allocations replayed through trainmem-alloc's caching allocator over
//! host memory: what a GPU caching allocator (PyTorch's rules) would hold for the same tensors.
//!
//! A measured run records every allocation and free of at least [`MIN_TRACE`] bytes
//! (trainmem-probe's allocation trace) and marks where each phase-boundary sample falls in it.
//! [`replay`] feeds the training thread's events to a [`CachingAllocator`] over a
//! [`HostDevice`] (real memory), samples it at the same boundaries, and hands back the
//! timeline (device domain: allocated, reserved, bytes per category, cache) and the allocator's
//! snapshot with its trace, which becomes the scenario's memory_viz pickle.

use super::error::replay_error;
use super::error::{Result, ScenarioError};
use trainmem_alloc::pytorch::replay::{Applied, Op, Origin, ReplayPolicy, Replayer};
use trainmem_alloc::{AllocatorConfig, CachingAllocator, HostDevice, Label, Snapshot};
use trainmem_burn::MeasuredRun;
use trainmem_core::Category;
use trainmem_core::Plan;
use trainmem_core::timeline::{
    DeviceBytes, HostBytes, Phase, Sample, Source, Timeline, TimelineMeta,
};
use trainmem_probe::TraceKind;

/// Smallest allocation traced and replayed (smaller host allocations are bookkeeping; on a GPU
/// they would share the small pool's 2 MiB segments).
pub const MIN_TRACE: u64 = 4096;

/// Capacity of the replay's host device (reserved memory is real memory, touched lazily).
const REPLAY_CAPACITY: u64 = 8 << 30;

/// Most allocator trace entries kept for the snapshot (the most recent).
const TRACE_ENTRIES: usize = 50_000;

/// What `empty_cache` did, checked against the allocator snapshot taken just before it.
#[derive(Debug, Clone, Default)]
pub struct EmptyCacheCheck {
    /// Reserved bytes just before `empty_cache`.
    pub reserved_before: u64,
    /// Allocated bytes at that moment (what `empty_cache` cannot release).
    pub allocated: u64,
    /// Bytes `empty_cache` returned to the device.
    pub released: u64,
    /// Bytes in segments that were entirely free before the call (what it should release).
    pub fully_free_before: u64,
    /// Reserved bytes after the call.
    pub reserved_after: u64,
    /// Segments that kept at least one live block (and so stayed reserved).
    pub segments_with_live_blocks: u64,
    /// Free bytes left inside those segments: cached, but not releasable.
    pub non_releasable_after: u64,
}

/// The run's allocations replayed through the caching allocator.
pub struct Replay {
    /// Device bytes (allocated, reserved, per category, cache) at the run's phase boundaries.
    pub timeline: Timeline,
    /// What `empty_cache` after the first epoch did, when asked for.
    pub check: Option<EmptyCacheCheck>,
    /// Frees of blocks the trace never saw allocated (made before it started), skipped.
    pub unmatched_frees: u64,
    /// The allocator at the end of the run, with its event trace (memory_viz's input).
    pub snapshot: Snapshot,
}

fn empty_cache_checked(r: &mut Replayer<HostDevice>, at: Origin) -> Result<EmptyCacheCheck> {
    let snap = r.allocator().snapshot();
    let fully_free_before = snap
        .segments
        .iter()
        .filter(|s| s.is_free())
        .map(|s| s.total_size)
        .sum();
    let segments_with_live_blocks = snap.segments.iter().filter(|s| !s.is_free()).count() as u64;
    let reserved_before = r.allocator().memory_reserved();
    let allocated = r.allocator().memory_allocated();
    let released = match r
        .apply(at, Op::EmptyCache)
        .map_err(replay_error("empty_cache"))?
    {
        Applied::Released(m) => m.bytes,
        _ => 0,
    };
    Ok(EmptyCacheCheck {
        reserved_before,
        allocated,
        released,
        fully_free_before,
        reserved_after: r.allocator().memory_reserved(),
        segments_with_live_blocks,
        non_releasable_after: r.allocator().snapshot().non_releasable(),
    })
}

fn device_sample(
    r: &Replayer<HostDevice>,
    template: &trainmem_burn::ProbeSample,
    phase: Phase,
) -> Sample {
    let alloc = r.allocator();
    let mut device = DeviceBytes {
        allocated: alloc.memory_allocated(),
        reserved: alloc.memory_reserved(),
        ..Default::default()
    };
    for (name, bytes) in r.live_bytes_by_label() {
        if let Some(c) = Category::from_name(name) {
            device.categories.add(c, *bytes);
        }
    }
    device.categories.set(
        Category::Cache,
        device.reserved.saturating_sub(device.allocated),
    );
    device.peak_allocated = device.allocated;
    device.peak_reserved = device.reserved;
    Sample {
        phase,
        step: template.step,
        epoch: template.epoch,
        micro_batch: template.micro_batch,
        time_us: template.time_us,
        host: HostBytes::default(),
        device,
    }
}

/// Replays the training thread's traced allocations through a caching allocator over host
/// memory, sampling at the run's phase boundaries; with `empty_cache_after_epoch0`, calls
/// `empty_cache` after the first epoch's end (checked against the snapshot).
pub fn replay(
    plan: &Plan,
    run: &MeasuredRun,
    config: AllocatorConfig,
    empty_cache_after_epoch0: bool,
) -> Result<Replay> {
    if run.allocation_trace_dropped > 0 {
        return Err(ScenarioError::Replayed(format!(
            "the allocation trace dropped {} events (buffer full): shorten the plan",
            run.allocation_trace_dropped
        )));
    }
    let config_text = format!("{config:?}");
    let mut alloc = CachingAllocator::with_config(HostDevice::new(REPLAY_CAPACITY), config);
    alloc.enable_trace(Some(TRACE_ENTRIES));
    let mut r = Replayer::new(alloc).with_policy(ReplayPolicy::RECORDED);
    let mut meta = TimelineMeta {
        name: plan.name.clone(),
        producer: format!(
            "trainmem-alloc caching allocator over host memory, replaying the burn run's \
             allocations of at least {MIN_TRACE} bytes (training thread)"
        ),
        device: "host memory through the caching allocator (as a GPU would hold it)".into(),
        device_capacity: Some(REPLAY_CAPACITY),
        ..Default::default()
    };
    meta.notes.insert("allocator".into(), config_text);
    let mut t = Timeline::new(Source::Measured, meta);
    let mut check = None;
    let mut cursor = 0usize;
    let events = &run.allocation_trace;
    for s in &run.samples {
        let Some(mark) = s.trace_events else {
            return Err(ScenarioError::Replayed(
                "the measured run has no trace marks (run it with trace_allocations)".into(),
            ));
        };
        let mark = mark.min(events.len());
        for (n, e) in events.iter().enumerate().take(mark).skip(cursor) {
            if e.thread != run.training_thread {
                continue;
            }
            let op = match e.kind {
                TraceKind::Alloc => Op::Alloc {
                    id: e.addr,
                    size: e.size,
                    stream: 0,
                    label: Some(Label::from(e.category.name())),
                },
                TraceKind::Free => Op::Free { id: e.addr },
            };
            let at = Origin::Event(n as u64);
            if r.apply(at, op)
                .map_err(replay_error("replaying the allocation trace"))?
                == Applied::OutOfMemory
            {
                return Err(ScenarioError::Replayed(format!(
                    "replaying an allocation: {}",
                    r.ooms().last().map_or("", |o| o.message.as_str())
                )));
            }
        }
        cursor = cursor.max(mark);
        t.push(device_sample(&r, s, s.phase));
        if empty_cache_after_epoch0 && s.phase == Phase::EpochEnd && s.epoch == 0 {
            check = Some(empty_cache_checked(&mut r, Origin::Event(mark as u64))?);
            t.push(device_sample(&r, s, Phase::EmptyCache));
        }
    }
    Ok(Replay {
        timeline: t,
        check,
        unmatched_frees: r.counts().frees_of_unknown_ids,
        snapshot: r.allocator().snapshot(),
    })
}
