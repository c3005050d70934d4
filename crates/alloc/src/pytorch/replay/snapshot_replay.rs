//! Replaying a PyTorch snapshot from the state its recording began in: the start state is
//! rebuilt ([`start_state`]), an allocator is seeded with it on a simulated device, and the
//! trace's ops ([`seeded_ops`]) are ready to apply. With the run's own configuration the
//! device hands new segments the recorded addresses, so best fit breaks ties between equal
//! blocks as PyTorch did.

use serde::Serialize;

use super::engine::Replayer;
use super::error::ReplayError;
use super::from_snapshot::{SnapshotTraceInfo, seeded_ops};
use super::op::{Op, Origin};
use super::start_state::{StartState, start_state};
use crate::allocator::CachingAllocator;
use crate::config::AllocatorConfig;
use crate::device::SimulatedDevice;
use crate::{Snapshot, TraceAction, TraceEntry};

/// What the recording itself says, from its events alone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RecordedFigures {
    /// Bytes reserved when recording began (the rebuilt start state).
    pub start_reserved: u64,
    /// Bytes allocated when recording began.
    pub start_allocated: u64,
    /// Segments when recording began.
    pub start_segments: u64,
    /// Peak reserved bytes: the start plus the running sum of `segment_alloc` minus
    /// `segment_free`.
    pub peak_reserved: u64,
    /// `segment_alloc` entries (cudaMalloc calls during the trace).
    pub segment_allocs: u64,
    /// `segment_free` entries (cudaFree calls during the trace).
    pub segment_frees: u64,
    /// `oom` entries.
    pub ooms: u64,
    /// Bytes reserved when the snapshot was taken.
    pub final_reserved: u64,
    /// The capacity the run ran out of memory on: at its first `oom` entry, the bytes reserved
    /// plus the bytes CUDA reported free (`None` without an `oom` entry).
    pub oom_capacity: Option<u64>,
}

impl RecordedFigures {
    fn from_trace(start: &StartState, trace: &[TraceEntry]) -> Self {
        let start_reserved = start.reserved();
        let mut f = RecordedFigures {
            start_reserved,
            start_allocated: start.allocated(),
            start_segments: start.seed.segments.len() as u64,
            peak_reserved: start_reserved,
            final_reserved: start_reserved,
            ..RecordedFigures::default()
        };
        for e in trace {
            match e.action {
                TraceAction::SegmentAlloc => {
                    f.segment_allocs += 1;
                    f.final_reserved += e.size;
                    f.peak_reserved = f.peak_reserved.max(f.final_reserved);
                }
                TraceAction::SegmentFree => {
                    f.segment_frees += 1;
                    f.final_reserved = f.final_reserved.saturating_sub(e.size);
                }
                TraceAction::Oom => {
                    f.ooms += 1;
                    f.oom_capacity.get_or_insert(f.final_reserved + e.addr);
                }
                _ => {}
            }
        }
        f
    }
}

/// A snapshot replay ready to run: the seeded replayer and the ops to apply.
pub struct SnapshotReplay {
    /// The replayer, seeded with the start state.
    pub replayer: Replayer<SimulatedDevice>,
    /// The trace's ops, in order.
    pub ops: Vec<(Origin, Op)>,
    /// What the trace held.
    pub info: SnapshotTraceInfo,
    /// The rebuilt start state.
    pub start: StartState,
    /// The recording's own figures.
    pub recorded: RecordedFigures,
}

impl SnapshotReplay {
    /// Applies every op; the replayer then holds the result.
    pub fn run(&mut self) -> Result<(), ReplayError> {
        for (at, op) in std::mem::take(&mut self.ops) {
            self.replayer.apply(at, op)?;
        }
        Ok(())
    }
}

/// The configuration the run recorded in `allocator_settings` (PyTorch's defaults when the
/// snapshot has none).
pub fn run_config(snapshot: &Snapshot) -> Result<AllocatorConfig, ReplayError> {
    match &snapshot.allocator_settings {
        Some(s) => s.to_config().map_err(ReplayError::Settings),
        None => Ok(AllocatorConfig::default()),
    }
}

/// The recording's own figures for `device`, from the rebuilt start state and the trace.
pub fn recorded(snapshot: &Snapshot, device: usize) -> Result<RecordedFigures, ReplayError> {
    let trace = device_trace(snapshot, device)?;
    let start = start_state(snapshot, device, trace, &run_config(snapshot)?)?;
    Ok(RecordedFigures::from_trace(&start, trace))
}

/// The trace of `device`.
pub fn device_trace(snapshot: &Snapshot, device: usize) -> Result<&[TraceEntry], ReplayError> {
    let devices = snapshot.device_traces.len();
    snapshot
        .device_traces
        .get(device)
        .map(Vec::as_slice)
        .ok_or(ReplayError::NoSuchDevice { device, devices })
}

/// A snapshot's trace made ready to replay, once, for as many replays as asked: the start
/// state rebuilt with the run's own rules, the ops, the recording's own figures. Each
/// [`replayer`](PreparedTrace::replayer) is seeded afresh; the ops are applied from here
/// (cloned one at a time), so several configurations replay one preparation.
pub struct PreparedTrace {
    /// The trace's ops, in order.
    pub ops: Vec<(Origin, Op)>,
    /// What the trace held.
    pub info: SnapshotTraceInfo,
    /// The rebuilt start state.
    pub start: StartState,
    /// The recording's own figures.
    pub recorded: RecordedFigures,
    /// The run's own configuration.
    own: AllocatorConfig,
    /// The recorded `segment_alloc`s (size, address), in order.
    planned: Vec<(u64, u64)>,
    /// The device replayed.
    pub device: usize,
    /// Trace entries of the recorded `snapshot` points, ascending.
    pub snapshot_points: Vec<usize>,
}

impl PreparedTrace {
    /// A replayer seeded with the start state on a simulated device of `capacity` bytes,
    /// under `config` (`None`: the run's own, with new segments at the recorded addresses).
    pub fn replayer(
        &self,
        capacity: u64,
        config: Option<AllocatorConfig>,
    ) -> Result<Replayer<SimulatedDevice>, ReplayError> {
        let mut sim = SimulatedDevice::new(capacity);
        if config.is_none() {
            sim = sim.with_planned_addresses(self.planned.iter().copied());
        }
        let config = config.unwrap_or_else(|| self.own.clone());
        let (alloc, blocks) = CachingAllocator::from_state(sim, config, &self.start.seed)?;
        Ok(Replayer::seeded(alloc, &blocks))
    }
}

/// Prepares `device`'s trace of `snapshot` for replays (see [`PreparedTrace`]).
pub fn prepare_trace(snapshot: &Snapshot, device: usize) -> Result<PreparedTrace, ReplayError> {
    let trace = device_trace(snapshot, device)?;
    let own = run_config(snapshot)?;
    let start = start_state(snapshot, device, trace, &own)?;
    let recorded = RecordedFigures::from_trace(&start, trace);
    let planned = trace
        .iter()
        .filter(|e| e.action == TraceAction::SegmentAlloc)
        .map(|e| (e.size, e.addr))
        .collect();
    let snapshot_points = trace
        .iter()
        .enumerate()
        .filter(|(_, e)| e.action == TraceAction::Snapshot)
        .map(|(index, _)| index)
        .collect();
    let (ops, mut info) = seeded_ops(trace, device, &start.live);
    info.devices = snapshot.device_traces.len();
    Ok(PreparedTrace {
        ops,
        info,
        start,
        recorded,
        own,
        planned,
        device,
        snapshot_points,
    })
}

/// Prepares the replay of `device`'s trace on a simulated device of `capacity` bytes, from
/// the start state rebuilt with the run's own rules. `config` is the configuration to
/// replay under (`None`: the run's own, with new segments at the recorded addresses).
pub fn prepare(
    snapshot: &Snapshot,
    device: usize,
    capacity: u64,
    config: Option<AllocatorConfig>,
) -> Result<SnapshotReplay, ReplayError> {
    let p = prepare_trace(snapshot, device)?;
    let replayer = p.replayer(capacity, config)?;
    Ok(SnapshotReplay {
        replayer,
        ops: p.ops,
        info: p.info,
        start: p.start,
        recorded: p.recorded,
    })
}
