//! The optional event trace (PyTorch's `device_traces`): one entry per allocator event.

use std::collections::VecDeque;

use serde::ser::{SerializeMap, SerializeStruct};

use crate::label::Label;
use crate::stream::StreamId;

/// What happened. Serialised with PyTorch's action strings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TraceAction {
    /// A block was handed to a client. `size` = the unrounded request.
    Alloc,
    /// A client freed a block. `size` = the block's requested size. If the block was used on
    /// other streams, the memory returns to the cache only at the matching `FreeCompleted`.
    FreeRequested,
    /// A freed block returned to the cache. `size` = the block's requested size.
    FreeCompleted,
    /// A segment was allocated from the device. `size` = the segment size.
    SegmentAlloc,
    /// A segment was returned to the device. `size` = the segment size.
    SegmentFree,
    /// Expandable segments: pages were mapped at the end of (or into a hole of) a segment.
    /// `addr`/`size` = the mapped range.
    SegmentMap,
    /// Expandable segments: whole free pages were unmapped. `addr`/`size` = the range.
    SegmentUnmap,
    /// An allocation failed. `size` = the rounded request; `addr` holds the bytes the device
    /// reported free (serialised as `device_free`).
    Oom,
}

impl TraceAction {
    /// The action string (`"alloc"`, `"free_requested"`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            TraceAction::Alloc => "alloc",
            TraceAction::FreeRequested => "free_requested",
            TraceAction::FreeCompleted => "free_completed",
            TraceAction::SegmentAlloc => "segment_alloc",
            TraceAction::SegmentFree => "segment_free",
            TraceAction::SegmentMap => "segment_map",
            TraceAction::SegmentUnmap => "segment_unmap",
            TraceAction::Oom => "oom",
        }
    }
}

/// One trace entry.
///
/// Serialised as PyTorch's trace dict: `action`, `addr` (or `device_free` for `oom`), `size`,
/// `stream`, `time_us` (trainmem's time value, see
/// [`CachingAllocator::set_time`](crate::CachingAllocator::set_time)), `frames` and, when set,
/// `label`. A labelled entry carries one frame `{"filename": "trainmem", "line": 0, "name":
/// <label>}` so viewers that show stacks show the label.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceEntry {
    /// The event.
    pub action: TraceAction,
    /// Block or segment address; for [`TraceAction::Oom`], the device's free bytes.
    pub addr: u64,
    /// Bytes, as [`TraceAction`] defines per action.
    pub size: u64,
    /// The stream of the block or segment.
    pub stream: StreamId,
    /// Non-decreasing time: a logical clock (1, 2, 3, …) unless the caller sets times.
    pub time: u64,
    /// The caller's label for the block, if any.
    pub label: Option<Label>,
}

struct Frame<'a>(&'a Label);

impl serde::Serialize for Frame<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut st = s.serialize_struct("Frame", 3)?;
        st.serialize_field("filename", "trainmem")?;
        st.serialize_field("line", &0u32)?;
        st.serialize_field("name", self.0.as_str())?;
        st.end()
    }
}

/// Serialises the `frames` list for an optional label.
pub(crate) struct Frames<'a>(pub(crate) Option<&'a Label>);

impl serde::Serialize for Frames<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let mut seq = s.serialize_seq(Some(usize::from(self.0.is_some())))?;
        if let Some(l) = self.0 {
            seq.serialize_element(&Frame(l))?;
        }
        seq.end()
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
        m.serialize_entry("time_us", &self.time)?;
        m.serialize_entry("frames", &Frames(self.label.as_ref()))?;
        if let Some(l) = &self.label {
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
            time: self.now,
            label: label.cloned(),
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
        let times: Vec<u64> = t.entries().iter().map(|e| e.time).collect();
        assert_eq!(times, vec![4, 5]);
        t.set_time(100);
        t.record(TraceAction::Alloc, 9, 1, StreamId(0), None);
        t.set_time(50); // never goes back
        t.record(TraceAction::Alloc, 10, 1, StreamId(0), None);
        let times: Vec<u64> = t.entries().iter().map(|e| e.time).collect();
        assert_eq!(times, vec![100, 100]);
    }

    #[test]
    fn serialises_like_pytorch() {
        let e = TraceEntry {
            action: TraceAction::Oom,
            addr: 77,
            size: 512,
            stream: StreamId(3),
            time: 9,
            label: Some(Label::from("activation")),
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
            label: None,
            ..e
        };
        let v = serde_json::to_value(&e2).unwrap();
        assert_eq!(v["action"], "free_requested");
        assert_eq!(v["addr"], 77);
        assert_eq!(v["frames"], serde_json::json!([]));
    }
}
