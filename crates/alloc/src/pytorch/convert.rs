//! From the allocator's [`Snapshot`] to PyTorch's snapshot dict ([`MemorySnapshot`]).
//!
//! A block's or event's label becomes its `category` and a one-frame stack
//! (`{"filename": "trainmem", "line": 0, "name": label}`), so the viewers colour and name it.

use super::model::{Action, BlockRecord, Frame, MemorySnapshot, SegmentRecord, TraceEvent};
use crate::label::Label;
use crate::snapshot::Snapshot;

fn frames(label: Option<&Label>) -> Vec<Frame> {
    label
        .map(|l| vec![Frame::for_label(l.as_str())])
        .unwrap_or_default()
}

fn category(label: Option<&Label>) -> Option<String> {
    label.map(|l| l.as_str().to_string())
}

impl From<&Snapshot> for MemorySnapshot {
    /// The allocator's state as PyTorch writes it (device 0), with the `"unknown"` category
    /// pytorch.org/memory_viz needs added where labels are present
    /// ([`MemorySnapshot::add_unknown_category`]).
    fn from(snap: &Snapshot) -> Self {
        let segments = snap
            .segments
            .iter()
            .map(|seg| SegmentRecord {
                device: 0,
                address: seg.address,
                total_size: seg.total_size,
                allocated_size: seg.allocated_size,
                active_size: seg.active_size,
                requested_size: seg.requested_size,
                stream: seg.stream.0,
                segment_type: seg.segment_type,
                segment_pool_id: (0, 0),
                is_expandable: false,
                frames: Vec::new(),
                blocks: seg
                    .blocks
                    .iter()
                    .map(|b| BlockRecord {
                        address: b.address,
                        size: b.size,
                        requested_size: b.requested_size,
                        state: b.state,
                        frames: frames(b.label.as_ref()),
                        category: category(b.label.as_ref()),
                    })
                    .collect(),
            })
            .collect();
        let device_traces = snap
            .device_traces
            .iter()
            .map(|trace| {
                trace
                    .iter()
                    .map(|e| TraceEvent {
                        action: Action::from(e.action),
                        addr: e.addr,
                        size: e.size,
                        stream: e.stream.0,
                        time_us: Some(e.time),
                        frames: frames(e.label.as_ref()),
                        category: category(e.label.as_ref()),
                    })
                    .collect()
            })
            .collect();
        let mut out = MemorySnapshot {
            segments,
            device_traces,
            allocator_settings: Some(snap.allocator_settings.clone()),
        };
        out.add_unknown_category();
        out
    }
}
