//! What-if replays of a snapshot: the recorded trace from the rebuilt start state under
//! another configuration, memory fraction, capacity, or with `empty_cache` called at the
//! recorded `snapshot` points, summarised as the figures a user compares side by side.

use serde::Serialize;

use super::engine::Applied;
use super::error::ReplayError;
use super::op::{Op, Origin};
use super::snapshot_replay::{PreparedTrace, prepare_trace};
use crate::Snapshot;
use crate::config::AllocatorConfig;

/// One way to replay a snapshot.
#[derive(Clone, Debug, PartialEq)]
pub struct Scenario {
    /// A name for tables (`recorded`, the configuration string, ...).
    pub name: String,
    /// The configuration (`None`: the run's own, segments at the recorded addresses).
    pub config: Option<AllocatorConfig>,
    /// `torch.cuda.set_per_process_memory_fraction` (needed by garbage collection).
    pub memory_fraction: Option<f64>,
    /// Call `empty_cache` at every recorded `snapshot` entry.
    pub empty_cache_at_snapshots: bool,
}

impl Scenario {
    /// The recording as it ran: its own configuration, nothing added.
    pub fn recorded() -> Self {
        Scenario {
            name: "recorded".to_string(),
            config: None,
            memory_fraction: None,
            empty_cache_at_snapshots: false,
        }
    }

    /// The recording under another configuration.
    pub fn with_config(name: impl Into<String>, config: AllocatorConfig) -> Self {
        Scenario {
            name: name.into(),
            config: Some(config),
            ..Scenario::recorded()
        }
    }
}

/// What a scenario did, on the capacity it ran on.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Outcome {
    /// The scenario's name.
    pub name: String,
    /// Peak reserved bytes.
    pub peak_reserved: u64,
    /// Peak allocated bytes.
    pub peak_allocated: u64,
    /// Reserved minus allocated bytes at the peak: the peak reserved bytes minus the most
    /// allocated while reserved was at its peak (cache the run never used then).
    pub unused_at_peak: u64,
    /// The largest cached free block at that moment.
    pub largest_free_at_peak: u64,
    /// cudaMalloc calls (segments allocated) during the trace.
    pub cuda_mallocs: u64,
    /// cudaFree calls (segments released) during the trace.
    pub cuda_frees: u64,
    /// Allocations that ran out of memory.
    pub ooms: u64,
    /// Trace entry of the first allocation that ran out of memory.
    pub first_oom_entry: Option<usize>,
    /// The bytes that allocation asked for.
    pub first_oom_request: Option<u64>,
    /// Set when the state at the start of recording alone does not fit the capacity (nothing
    /// was replayed).
    pub start_does_not_fit: bool,
}

impl Outcome {
    /// True when the whole trace ran without running out of memory.
    pub fn fits(&self) -> bool {
        self.ooms == 0 && !self.start_does_not_fit
    }
}

/// The ops with an `empty_cache` added at each of `points` (trace entries, ascending).
fn with_empty_cache_at_snapshots(
    ops: &[(Origin, Op)],
    points: &[usize],
    device: usize,
) -> Vec<(Origin, Op)> {
    let mut points = points.iter().copied().peekable();
    let mut out = Vec::with_capacity(ops.len() + points.len());
    for (at, op) in ops.iter().cloned() {
        if let Origin::Entry { index, .. } = at {
            while let Some(p) = points.next_if(|&p| p < index) {
                out.push((Origin::Entry { device, index: p }, Op::EmptyCache));
            }
        }
        out.push((at, op));
    }
    out.extend(points.map(|p| (Origin::Entry { device, index: p }, Op::EmptyCache)));
    out
}

/// Replays `device`'s trace of `snapshot` under `scenario` on a simulated device of
/// `capacity` bytes, from the rebuilt start state.
pub fn run_scenario(
    snapshot: &Snapshot,
    device: usize,
    capacity: u64,
    scenario: &Scenario,
) -> Result<Outcome, ReplayError> {
    run_prepared(&prepare_trace(snapshot, device)?, capacity, scenario)
}

/// [`run_scenario`] on a trace prepared once ([`prepare_trace`]) for several scenarios.
pub fn run_prepared(
    prepared: &PreparedTrace,
    capacity: u64,
    scenario: &Scenario,
) -> Result<Outcome, ReplayError> {
    let mut out = Outcome {
        name: scenario.name.clone(),
        ..Outcome::default()
    };
    let mut r = match prepared.replayer(capacity, scenario.config.clone()) {
        Ok(r) => r,
        Err(ReplayError::Seed(crate::allocator::SeedError::Device { .. })) => {
            out.start_does_not_fit = true;
            return Ok(out);
        }
        Err(e) => return Err(e),
    };
    if let Some(f) = scenario.memory_fraction {
        r.allocator_mut()
            .set_memory_fraction(f)
            .map_err(ReplayError::Settings)?;
    }
    let with_empty_cache;
    let ops = if scenario.empty_cache_at_snapshots {
        with_empty_cache = with_empty_cache_at_snapshots(
            &prepared.ops,
            &prepared.snapshot_points,
            prepared.device,
        );
        &with_empty_cache
    } else {
        &prepared.ops
    };
    let mut peak = r.allocator().memory_reserved();
    out.unused_at_peak = peak - r.allocator().memory_allocated();
    out.largest_free_at_peak = r.allocator().largest_free_block();
    for (at, op) in ops.iter().cloned() {
        let size = match op {
            Op::Alloc { size, .. } => size,
            _ => 0,
        };
        if let Applied::OutOfMemory = r.apply(at, op)? {
            out.ooms += 1;
            if let (None, Origin::Entry { index, .. }) = (out.first_oom_entry, at) {
                out.first_oom_entry = Some(index);
                out.first_oom_request = Some(size);
            }
        }
        let a = r.allocator();
        let reserved = a.memory_reserved();
        let unused = reserved - a.memory_allocated();
        if reserved > peak || (reserved == peak && unused < out.unused_at_peak) {
            peak = reserved;
            out.unused_at_peak = unused;
            out.largest_free_at_peak = a.largest_free_block();
        }
    }
    let a = r.allocator();
    let st = a.stats();
    out.peak_reserved = a.max_memory_reserved();
    out.peak_allocated = a.max_memory_allocated();
    out.cuda_mallocs = st.num_device_alloc.max(0) as u64;
    out.cuda_frees = st.num_device_free.max(0) as u64;
    Ok(out)
}
