//! A snapshot's device trace as replay ops. Blocks are keyed by address: an `alloc` at an
//! address gets a fresh id, the matching free at the same address frees it.

use std::collections::HashMap;
use std::collections::hash_map::Entry;

use super::error::ReplayError;
use super::op::{Op, Origin};
use crate::fast_hash::FastMap;
use crate::label::Label;
use crate::{Snapshot, TraceAction, TraceEntry};

/// What a snapshot's trace held besides the ops to replay.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct SnapshotTraceInfo {
    /// Number of devices with a trace.
    pub devices: usize,
    /// Entries in the replayed device's trace.
    pub entries: usize,
    /// Which free action was replayed: `free_completed` (preferred) or `free_requested`.
    pub free_action: &'static str,
    /// Frees of addresses whose `alloc` is not in the trace (recording usually starts
    /// part-way through a run, and the trace is a ring buffer); they are skipped.
    pub frees_of_unknown_blocks: u64,
    /// `oom` entries recorded by PyTorch.
    pub recorded_ooms: u64,
    /// `segment_*` entries (not replayed: the allocator makes its own).
    pub segment_entries: u64,
}

/// The free action a trace is replayed by: `free_completed` when the trace has any (the
/// moment a block returns to the cache, after other streams' use), else `free_requested`.
pub fn free_action(trace: &[TraceEntry]) -> TraceAction {
    if trace.iter().any(|e| e.action == TraceAction::FreeCompleted) {
        TraceAction::FreeCompleted
    } else {
        TraceAction::FreeRequested
    }
}

/// The ops of a trace replayed from its start state: the blocks live at the start have ids
/// `0..live.len()` in the order of `live` (their addresses), blocks allocated in the trace
/// get ids from `live.len()` on, an `oom` entry becomes the allocation that failed (its
/// rounded size; never freed), and every run of consecutive `segment_free` entries becomes
/// one `empty_cache` (tagged with the run's last entry): PyTorch frees segments only when it
/// releases its cache, on `torch.cuda.empty_cache()` or when cudaMalloc fails.
pub fn seeded_ops(
    trace: &[TraceEntry],
    device: usize,
    live: &[u64],
) -> (Vec<(Origin, Op)>, SnapshotTraceInfo) {
    let free_action = free_action(trace);
    let mut info = SnapshotTraceInfo {
        entries: trace.len(),
        free_action: if free_action == TraceAction::FreeCompleted {
            "free_completed"
        } else {
            "free_requested"
        },
        ..SnapshotTraceInfo::default()
    };
    let mut ids: FastMap<u64, u64> = live
        .iter()
        .enumerate()
        .map(|(i, &a)| (a, i as u64))
        .collect();
    let mut next_id = live.len() as u64;
    let mut ops = Vec::with_capacity(trace.len() / 2);
    for (index, e) in trace.iter().enumerate() {
        let at = Origin::Entry { device, index };
        match &e.action {
            TraceAction::Alloc => {
                ids.insert(e.addr, next_id);
                let label = e.label().map(|l| Label::from(l.to_string()));
                ops.push((
                    at,
                    Op::Alloc {
                        id: next_id,
                        size: e.size,
                        stream: e.stream.0,
                        label,
                    },
                ));
                next_id += 1;
            }
            a if *a == free_action => match ids.remove(&e.addr) {
                Some(id) => ops.push((at, Op::Free { id })),
                None => info.frees_of_unknown_blocks += 1,
            },
            TraceAction::SegmentFree => {
                info.segment_entries += 1;
                if trace
                    .get(index + 1)
                    .is_none_or(|n| n.action != TraceAction::SegmentFree)
                {
                    ops.push((at, Op::EmptyCache));
                }
            }
            TraceAction::Oom => {
                // The request that failed: PyTorch records no alloc for it.
                info.recorded_ooms += 1;
                ops.push((at, Op::alloc(next_id, e.size, e.stream.0)));
                next_id += 1;
            }
            a if a.is_segment_event() => info.segment_entries += 1,
            _ => {}
        }
    }
    (ops, info)
}

/// Turns the trace of `device` into ops: each `alloc` (with its label, if trainmem wrote one)
/// and each free of a block allocated in the trace, using `free_completed` entries when the
/// trace has any, else `free_requested`.
pub fn ops_from_trace(
    snapshot: &Snapshot,
    device: usize,
) -> Result<(Vec<(Origin, Op)>, SnapshotTraceInfo), ReplayError> {
    let devices = snapshot.device_traces.len();
    let entries = snapshot
        .device_traces
        .get(device)
        .ok_or(ReplayError::NoSuchDevice { device, devices })?;
    let has_completed = entries
        .iter()
        .any(|e| e.action == TraceAction::FreeCompleted);
    let free_action = if has_completed {
        TraceAction::FreeCompleted
    } else {
        TraceAction::FreeRequested
    };
    let mut info = SnapshotTraceInfo {
        devices,
        entries: entries.len(),
        free_action: if has_completed {
            "free_completed"
        } else {
            "free_requested"
        },
        ..SnapshotTraceInfo::default()
    };
    let mut live: HashMap<u64, u64> = HashMap::new();
    let mut next_id = 0u64;
    let mut ops = Vec::new();
    for (index, e) in entries.iter().enumerate() {
        let at = Origin::Entry { device, index };
        match &e.action {
            TraceAction::Alloc => {
                match live.entry(e.addr) {
                    Entry::Occupied(_) => {
                        return Err(ReplayError::AddressAlreadyLive { at, addr: e.addr });
                    }
                    Entry::Vacant(slot) => {
                        slot.insert(next_id);
                    }
                }
                let op = Op::Alloc {
                    id: next_id,
                    size: e.size,
                    stream: e.stream.0,
                    label: e.label().map(|l| Label::from(l.to_string())),
                };
                ops.push((at, op));
                next_id += 1;
            }
            a if *a == free_action => match live.remove(&e.addr) {
                Some(id) => ops.push((at, Op::Free { id })),
                None => info.frees_of_unknown_blocks += 1,
            },
            TraceAction::Oom => info.recorded_ooms += 1,
            a if a.as_str().starts_with("segment_") => info.segment_entries += 1,
            _ => {}
        }
    }
    Ok((ops, info))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(action: &str, addr: u64, size: u64) -> TraceEntry {
        TraceEntry {
            action: TraceAction::parse(action),
            addr,
            size,
            stream: crate::StreamId::DEFAULT,
            time_us: None,
            frames: Vec::new(),
            category: None,
        }
    }

    fn snapshot(traces: Vec<Vec<TraceEntry>>) -> Snapshot {
        Snapshot {
            device_traces: traces,
            ..Default::default()
        }
    }

    #[test]
    fn snapshot_is_keyed_by_address() {
        let mut labelled = entry("alloc", 0x1200, 300);
        labelled.category = Some("activation".into());
        let s = snapshot(vec![vec![
            entry("free_completed", 0x999, 64), // alloc cut off by the ring buffer
            entry("segment_alloc", 0x1000, 2 << 20),
            entry("alloc", 0x1000, 100),
            labelled,
            entry("free_requested", 0x1000, 100),
            entry("free_completed", 0x1000, 100),
            entry("alloc", 0x1000, 50), // the address is reused: a new block
            entry("oom", 0, 1 << 40),
        ]]);
        let (ops, info) = ops_from_trace(&s, 0).unwrap();
        let ops: Vec<Op> = ops.into_iter().map(|(_, op)| op).collect();
        assert_eq!(
            ops,
            vec![
                Op::alloc(0, 100, 0),
                Op::Alloc {
                    id: 1,
                    size: 300,
                    stream: 0,
                    label: Some(Label::from("activation"))
                },
                Op::Free { id: 0 },
                Op::alloc(2, 50, 0),
            ]
        );
        assert_eq!(info.free_action, "free_completed");
        assert_eq!(info.frees_of_unknown_blocks, 1);
        assert_eq!(info.recorded_ooms, 1);
        assert_eq!(info.segment_entries, 1);
        assert_eq!(info.entries, 8);
    }

    #[test]
    fn snapshot_without_completed_frees_uses_requested() {
        let s = snapshot(vec![vec![
            entry("alloc", 0x10, 1),
            entry("free_requested", 0x10, 1),
        ]]);
        let (ops, info) = ops_from_trace(&s, 0).unwrap();
        assert_eq!(info.free_action, "free_requested");
        assert_eq!(ops.len(), 2);
        assert_eq!(ops[1].1, Op::Free { id: 0 });
    }

    #[test]
    fn bad_device_and_double_alloc_are_errors() {
        let s = snapshot(vec![vec![entry("alloc", 0x10, 1)]]);
        assert!(
            ops_from_trace(&s, 3)
                .unwrap_err()
                .to_string()
                .contains("device 3")
        );
        let double = snapshot(vec![vec![entry("alloc", 0x10, 1), entry("alloc", 0x10, 1)]]);
        let msg = ops_from_trace(&double, 0).unwrap_err().to_string();
        assert!(
            msg.contains("entry 1") && msg.contains("already live"),
            "{msg}"
        );
    }
}
