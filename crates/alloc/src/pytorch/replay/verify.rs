//! Checking a snapshot replay against the recording as it goes: every recorded
//! `segment_alloc` and `segment_free` (action, size, address, order, and the ops they fall
//! between), every `alloc` placed at the recorded address (the same offset of the same
//! segment: segments get the recorded addresses), and the end state against the snapshot's
//! `segments`. The first divergence is kept with what PyTorch did and what trainmem did;
//! agreements are counted up to it (after it the two runs are no longer comparable).

use std::collections::BTreeMap;

use serde::Serialize;

use super::engine::Applied;
use super::error::ReplayError;
use super::op::{Op, Origin};
use super::snapshot_replay::SnapshotReplay;
use crate::snapshot::BlockState;
use crate::{Snapshot, TraceAction, TraceEntry};

/// How many of the recorded events of one kind the replay reproduced.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Agreement {
    /// Reproduced exactly (before the first divergence).
    pub agreed: u64,
    /// Recorded.
    pub recorded: u64,
}

impl Agreement {
    /// True when every recorded event was reproduced.
    pub fn all(&self) -> bool {
        self.agreed == self.recorded
    }
}

/// Where the replay first did something other than the recording.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Divergence {
    /// Trace entry index (`None`: the end state).
    pub entry: Option<usize>,
    /// The request being replayed.
    pub request: String,
    /// What PyTorch did.
    pub pytorch: String,
    /// What trainmem did.
    pub trainmem: String,
}

/// The verdict of [`verify`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Verification {
    /// `segment_alloc` entries reproduced (size, address, between the same ops).
    pub segment_allocs: Agreement,
    /// `segment_free` entries reproduced.
    pub segment_frees: Agreement,
    /// `alloc` entries placed at the recorded address.
    pub allocs: Agreement,
    /// `oom` entries whose request ran out of memory in the replay too.
    pub ooms: Agreement,
    /// Final segments reproduced with the same address and size.
    pub end_segments: Agreement,
    /// Final blocks reproduced with the same address, size and state (active or not).
    pub end_blocks: Agreement,
    /// The first divergence, if any.
    pub first_divergence: Option<Divergence>,
}

/// A recorded segment event.
struct Recorded {
    index: usize,
    action: TraceAction,
    addr: u64,
    size: u64,
}

fn describe(action: &TraceAction, addr: u64, size: u64) -> String {
    let call = if *action == TraceAction::SegmentAlloc {
        "cudaMalloc"
    } else {
        "cudaFree"
    };
    format!("{call} of {size} bytes at {addr:#x}")
}

/// The comparison in progress.
struct Checker<'a> {
    trace: &'a [TraceEntry],
    recorded: Vec<Recorded>,
    next: usize,
    v: Verification,
}

impl<'a> Checker<'a> {
    /// A checker holding what the recorded `trace` did: its segment calls in order, and its
    /// counts of segment calls, allocations and out-of-memory errors.
    fn of_recording(trace: &'a [TraceEntry]) -> Self {
        let recorded: Vec<Recorded> = trace
            .iter()
            .enumerate()
            .filter(|(_, e)| {
                matches!(
                    e.action,
                    TraceAction::SegmentAlloc | TraceAction::SegmentFree
                )
            })
            .map(|(index, e)| Recorded {
                index,
                action: e.action.clone(),
                addr: e.addr,
                size: e.size,
            })
            .collect();
        let mut c = Checker {
            trace,
            next: 0,
            v: Verification::default(),
            recorded,
        };
        for r in &c.recorded {
            match r.action {
                TraceAction::SegmentAlloc => c.v.segment_allocs.recorded += 1,
                _ => c.v.segment_frees.recorded += 1,
            }
        }
        c.v.allocs.recorded = trace
            .iter()
            .filter(|e| e.action == TraceAction::Alloc)
            .count() as u64;
        c.v.ooms.recorded = trace
            .iter()
            .filter(|e| e.action == TraceAction::Oom)
            .count() as u64;
        c
    }

    fn diverge(&mut self, entry: Option<usize>, pytorch: String, trainmem: String) {
        if self.v.first_divergence.is_some() {
            return;
        }
        let request = match entry.and_then(|i| self.trace.get(i)) {
            Some(e) => format!(
                "{} of {} bytes at {:#x} on stream {}",
                e.action, e.size, e.addr, e.stream
            ),
            None => "the end state".to_string(),
        };
        self.v.first_divergence = Some(Divergence {
            entry,
            request,
            pytorch,
            trainmem,
        });
    }

    fn live(&self) -> bool {
        self.v.first_divergence.is_none()
    }

    /// Matches the segment events trainmem made during the op at `index` (after the op at
    /// `prev`) against the recording's, in order.
    fn segments(&mut self, prev: Option<usize>, index: usize, made: &[(TraceAction, u64, u64)]) {
        for (action, addr, size) in made {
            if !self.live() {
                return;
            }
            let ours = describe(action, *addr, *size);
            let Some(r) = self.recorded.get(self.next) else {
                self.diverge(Some(index), "no further segment call".into(), ours);
                return;
            };
            let in_gap = r.index <= index && prev.is_none_or(|p| r.index > p);
            if !in_gap || r.action != *action || r.addr != *addr || r.size != *size {
                let theirs = format!(
                    "{} (entry {})",
                    describe(&r.action, r.addr, r.size),
                    r.index
                );
                self.diverge(Some(index), theirs, ours);
                return;
            }
            match action {
                TraceAction::SegmentAlloc => self.v.segment_allocs.agreed += 1,
                _ => self.v.segment_frees.agreed += 1,
            }
            self.next += 1;
        }
        if let Some(r) = self.recorded.get(self.next)
            && r.index <= index
            && self.live()
        {
            let theirs = format!(
                "{} (entry {})",
                describe(&r.action, r.addr, r.size),
                r.index
            );
            self.diverge(Some(index), theirs, "no segment call".into());
        }
    }

    fn alloc(&mut self, index: usize, applied: &Applied) {
        if !self.live() {
            return;
        }
        if self.trace[index].action == TraceAction::Oom {
            match applied {
                Applied::OutOfMemory => self.v.ooms.agreed += 1,
                Applied::Allocated(b) => {
                    let ours = format!("placed it at {:#x} ({} bytes)", b.address, b.size);
                    self.diverge(Some(index), "ran out of memory".into(), ours);
                }
                _ => {}
            }
            return;
        }
        let want = self.trace[index].addr;
        match applied {
            Applied::Allocated(b) if b.address == want => self.v.allocs.agreed += 1,
            Applied::Allocated(b) => {
                let ours = format!("placed it at {:#x} ({} bytes)", b.address, b.size);
                self.diverge(Some(index), format!("placed it at {want:#x}"), ours);
            }
            _ => {
                let theirs = format!("placed it at {want:#x}");
                self.diverge(Some(index), theirs, "ran out of memory".into());
            }
        }
    }
}

/// Replays `replay` (prepared with the run's own configuration) and checks it against the
/// recording of `device` in `snapshot`.
pub fn verify(
    replay: &mut SnapshotReplay,
    snapshot: &Snapshot,
    device: usize,
) -> Result<Verification, ReplayError> {
    let trace = super::snapshot_replay::device_trace(snapshot, device)?;
    let mut c = Checker::of_recording(trace);
    replay.replayer.allocator_mut().enable_trace(None);
    let mut prev = None;
    for (at, op) in std::mem::take(&mut replay.ops) {
        let Origin::Entry { index, .. } = at else {
            continue;
        };
        let is_alloc = matches!(op, Op::Alloc { .. });
        let applied = replay.replayer.apply(at, op)?;
        let made: Vec<(TraceAction, u64, u64)> = replay
            .replayer
            .allocator_mut()
            .take_trace()
            .into_iter()
            .filter(|e| {
                matches!(
                    e.action,
                    TraceAction::SegmentAlloc | TraceAction::SegmentFree
                )
            })
            .map(|e| (e.action, e.addr, e.size))
            .collect();
        c.segments(prev, index, &made);
        if is_alloc {
            c.alloc(index, &applied);
        }
        prev = Some(index);
    }
    replay.replayer.allocator_mut().disable_trace();
    if let Some(r) = c.recorded.get(c.next) {
        let (entry, theirs) = (r.index, describe(&r.action, r.addr, r.size));
        c.diverge(
            Some(entry),
            theirs,
            "no segment call by the end of the trace".into(),
        );
    }
    end_state(&mut c, replay, snapshot, device);
    Ok(c.v)
}

/// (size, active) of each block by address, per segment (address, size).
type Layout = BTreeMap<(u64, u64), BTreeMap<u64, (u64, bool)>>;

/// Compares the replay's final segments and blocks with the snapshot's.
fn end_state(c: &mut Checker<'_>, replay: &SnapshotReplay, snapshot: &Snapshot, device: usize) {
    let theirs: Layout = snapshot
        .segments
        .iter()
        .filter(|s| s.device == device as u64)
        .map(|s| {
            let blocks = s
                .blocks
                .iter()
                .map(|b| (b.address, (b.size, b.state != BlockState::Inactive)));
            ((s.address, s.total_size), blocks.collect())
        })
        .collect();
    let ours: Layout = replay
        .replayer
        .allocator()
        .snapshot()
        .segments
        .iter()
        .map(|s| {
            let blocks = s
                .blocks
                .iter()
                .map(|b| (b.address, (b.size, b.state != BlockState::Inactive)));
            ((s.address, s.total_size), blocks.collect())
        })
        .collect();
    c.v.end_segments.recorded = theirs.len() as u64;
    c.v.end_blocks.recorded = theirs.values().map(|b| b.len() as u64).sum();
    let mut first_miss: Option<String> = None;
    for (seg, blocks) in &theirs {
        let Some(our_blocks) = ours.get(seg) else {
            first_miss.get_or_insert_with(|| format!("segment {:#x} of {} bytes", seg.0, seg.1));
            continue;
        };
        c.v.end_segments.agreed += 1;
        for (addr, b) in blocks {
            if our_blocks.get(addr) == Some(b) {
                c.v.end_blocks.agreed += 1;
            } else {
                first_miss.get_or_insert_with(|| {
                    format!(
                        "block {addr:#x} of {} bytes ({})",
                        b.0,
                        if b.1 { "active" } else { "free" }
                    )
                });
            }
        }
    }
    let extra = ours.keys().find(|k| !theirs.contains_key(k));
    if let Some(miss) = first_miss {
        c.diverge(
            None,
            format!("ended with {miss}"),
            "ended without it".into(),
        );
    } else if let Some(seg) = extra {
        let ours = format!("ended with segment {:#x} of {} bytes", seg.0, seg.1);
        c.diverge(None, "ended without it".into(), ours);
    }
}
