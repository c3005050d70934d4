//! The event trace (PyTorch's `device_traces`): one [`TraceEntry`] per allocator event, as
//! the allocator records it and as a snapshot file holds it.

use std::collections::VecDeque;

use serde::ser::SerializeMap;

use crate::label::Label;
use crate::snapshot::{Frame, WrittenFrames, label_of};
use crate::stream::StreamId;

/// What happened, with PyTorch's action strings.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum TraceAction {
    /// A block was handed to a client (`alloc`). `size` = the unrounded request.
    Alloc,
    /// A client freed a block (`free_requested`). `size` = the block's requested size. If the
    /// block was used on other streams, the memory returns to the cache only at the matching
    /// `FreeCompleted`.
    FreeRequested,
    /// A freed block returned to the cache (`free_completed`). `size` = the block's requested
    /// size.
    FreeCompleted,
    /// A segment was allocated from the device (`segment_alloc`). `size` = the segment size.
    SegmentAlloc,
    /// A segment was returned to the device (`segment_free`). `size` = the segment size.
    SegmentFree,
    /// Expandable segments: pages were mapped at the end of (or into a hole of) a segment
    /// (`segment_map`). `addr`/`size` = the mapped range.
    SegmentMap,
    /// Expandable segments: whole free pages were unmapped (`segment_unmap`). `addr`/`size` =
    /// the range.
    SegmentUnmap,
    /// A snapshot was taken while recording (`snapshot`); the allocator never records one.
    Snapshot,
    /// An allocation failed (`oom`). `size` = the rounded request; `addr` holds the bytes the
    /// device reported free (written as `device_free`).
    Oom,
    /// Any other action string in a snapshot file, kept as read (the allocator never records
    /// one).
    Other(String),
}

impl TraceAction {
    /// PyTorch's action string (`"alloc"`, `"free_requested"`, …).
    pub fn as_str(&self) -> &str {
        match self {
            TraceAction::Alloc => "alloc",
            TraceAction::FreeRequested => "free_requested",
            TraceAction::FreeCompleted => "free_completed",
            TraceAction::SegmentAlloc => "segment_alloc",
            TraceAction::SegmentFree => "segment_free",
            TraceAction::SegmentMap => "segment_map",
            TraceAction::SegmentUnmap => "segment_unmap",
            TraceAction::Snapshot => "snapshot",
            TraceAction::Oom => "oom",
            TraceAction::Other(s) => s,
        }
    }

    /// The action named by `s` (unknown strings give [`TraceAction::Other`]).
    pub fn parse(s: &str) -> Self {
        match s {
            "alloc" => TraceAction::Alloc,
            "free_requested" => TraceAction::FreeRequested,
            "free_completed" => TraceAction::FreeCompleted,
            "segment_alloc" => TraceAction::SegmentAlloc,
            "segment_free" => TraceAction::SegmentFree,
            "segment_map" => TraceAction::SegmentMap,
            "segment_unmap" => TraceAction::SegmentUnmap,
            "snapshot" => TraceAction::Snapshot,
            "oom" => TraceAction::Oom,
            other => TraceAction::Other(other.to_string()),
        }
    }

    /// True for the segment events (`segment_alloc`, `segment_free`, `segment_map`,
    /// `segment_unmap`).
    pub fn is_segment_event(&self) -> bool {
        matches!(
            self,
            TraceAction::SegmentAlloc
                | TraceAction::SegmentFree
                | TraceAction::SegmentMap
                | TraceAction::SegmentUnmap
        )
    }
}

impl std::fmt::Display for TraceAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for TraceAction {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// One trace entry.
///
/// Serialised as PyTorch's trace dict: `action`, `addr` (or `device_free` for `oom`), `size`,
/// `stream`, `time_us` (when known), `frames` and, when set, the category as `label` (see the
/// [`snapshot`](crate::Snapshot) model for the frame a category without frames is written
/// with).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceEntry {
    /// The event.
    pub action: TraceAction,
    /// Block or segment address; for [`TraceAction::Oom`], the bytes the device reported free
    /// (PyTorch's `device_free` key).
    pub addr: u64,
    /// Bytes, as [`TraceAction`] defines per action.
    pub size: u64,
    /// The stream of the block or segment (a CUDA stream handle in PyTorch's files).
    pub stream: StreamId,
    /// Time stamp (`time_us`; torch ≥ ~2.1). The allocator always sets it: a non-decreasing
    /// logical clock (1, 2, 3, …) unless the caller sets times (see
    /// [`CachingAllocator::set_time`](crate::CachingAllocator::set_time)).
    pub time_us: Option<u64>,
    /// The stack of the event (empty when unknown, and in the allocator's own trace).
    pub frames: Vec<Frame>,
    /// The event's category: the caller's label for the block in the allocator's trace.
    /// pytorch.org/memory_viz colours the timeline by category and needs an `"unknown"` one
    /// among them when any event has a category (see
    /// [`Snapshot::needs_unknown_category`](crate::Snapshot::needs_unknown_category)).
    pub category: Option<Label>,
}

impl TraceEntry {
    /// The label trainmem attached to the event: its category unless that is `"unknown"`,
    /// else the name of a single trainmem frame.
    pub fn label(&self) -> Option<&str> {
        label_of(self.category.as_ref(), &self.frames)
    }
}

impl serde::Serialize for TraceEntry {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("action", self.action.as_str())?;
        if self.action == TraceAction::Oom {
            m.serialize_entry("device_free", &self.addr)?;
        } else {
            m.serialize_entry("addr", &self.addr)?;
        }
        m.serialize_entry("size", &self.size)?;
        m.serialize_entry("stream", &self.stream.0)?;
        if let Some(t) = self.time_us {
            m.serialize_entry("time_us", &t)?;
        }
        m.serialize_entry(
            "frames",
            &WrittenFrames::of(&self.frames, self.category.as_ref()),
        )?;
        if let Some(l) = &self.category {
            m.serialize_entry("label", l.as_str())?;
        }
        m.end()
    }
}

/// The trace recorder and the allocator's clock.
#[derive(Debug, Default)]
pub(crate) struct TraceBuffer {
    pub(crate) enabled: bool,
    max_entries: Option<usize>,
    entries: VecDeque<TraceEntry>,
    /// Time of the latest entry (or the caller's last `set_time`).
    now: u64,
    manual_time: bool,
}

impl TraceBuffer {
    pub(crate) fn enable(&mut self, max_entries: Option<usize>) {
        self.enabled = true;
        self.max_entries = max_entries;
        self.trim();
    }

    pub(crate) fn disable(&mut self) {
        self.enabled = false;
    }

    pub(crate) fn set_time(&mut self, t: u64) {
        self.manual_time = true;
        self.now = self.now.max(t);
    }

    pub(crate) fn time(&self) -> u64 {
        self.now
    }

    pub(crate) fn entries(&self) -> &VecDeque<TraceEntry> {
        &self.entries
    }

    pub(crate) fn take(&mut self) -> Vec<TraceEntry> {
        self.entries.drain(..).collect()
    }

    pub(crate) fn clear(&mut self) {
        self.entries.clear();
    }

    fn trim(&mut self) {
        if let Some(max) = self.max_entries {
            while self.entries.len() > max {
                self.entries.pop_front();
            }
        }
    }

    #[inline]
    pub(crate) fn record(
        &mut self,
        action: TraceAction,
        addr: u64,
        size: u64,
        stream: StreamId,
        label: Option<&Label>,
    ) {
        if !self.enabled {
            return;
        }
        if !self.manual_time {
            self.now += 1;
        }
        if self.max_entries == Some(0) {
            return;
        }
        if let Some(max) = self.max_entries
            && self.entries.len() >= max
        {
            self.entries.pop_front();
        }
        self.entries.push_back(TraceEntry {
            action,
            addr,
            size,
            stream,
            time_us: Some(self.now),
            frames: Vec::new(),
            category: label.cloned(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_buffer_keeps_latest() {
        let mut t = TraceBuffer::default();
        t.record(TraceAction::Alloc, 1, 1, StreamId(0), None);
        assert!(t.entries().is_empty());
        t.enable(Some(2));
        for i in 0..5 {
            t.record(TraceAction::Alloc, i, 1, StreamId(0), None);
        }
        let e: Vec<u64> = t.entries().iter().map(|e| e.addr).collect();
        assert_eq!(e, vec![3, 4]);
        let times: Vec<u64> = t.entries().iter().map(|e| e.time_us.unwrap_or(0)).collect();
        assert_eq!(times, vec![4, 5]);
        t.set_time(100);
        t.record(TraceAction::Alloc, 9, 1, StreamId(0), None);
        t.set_time(50); // never goes back
        t.record(TraceAction::Alloc, 10, 1, StreamId(0), None);
        let times: Vec<u64> = t.entries().iter().map(|e| e.time_us.unwrap_or(0)).collect();
        assert_eq!(times, vec![100, 100]);
    }

    #[test]
    fn serialises_like_pytorch() {
        let e = TraceEntry {
            action: TraceAction::Oom,
            addr: 77,
            size: 512,
            stream: StreamId(3),
            time_us: Some(9),
            frames: Vec::new(),
            category: Some(Label::from("activation")),
        };
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(v["action"], "oom");
        assert_eq!(v["device_free"], 77);
        assert!(v.get("addr").is_none());
        assert_eq!(v["time_us"], 9);
        assert_eq!(v["frames"][0]["name"], "activation");
        assert_eq!(v["label"], "activation");
        let e2 = TraceEntry {
            action: TraceAction::FreeRequested,
            category: None,
            ..e
        };
        let v = serde_json::to_value(&e2).unwrap();
        assert_eq!(v["action"], "free_requested");
        assert_eq!(v["addr"], 77);
        assert_eq!(v["frames"], serde_json::json!([]));
    }
}
