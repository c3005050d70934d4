//! The one model of a PyTorch memory snapshot (`torch.cuda.memory._snapshot()`): the dict
//! the allocator's [`snapshot`](crate::CachingAllocator::snapshot) returns, the pickles
//! [`pytorch::pickle`](crate::pytorch::pickle) reads and writes, and what the replay engine
//! replays.
//!
//! The types keep what the viewers and a replay use: segments with their blocks, one event
//! trace per device ([`TraceEntry`]), the allocator settings, stack frames and categories.
//! Keys PyTorch adds that nothing here reads (`external_annotations`, `compile_context`,
//! `user_metadata`) are dropped on reading.
//!
//! A label the caller gave an allocation is the block's and its events' `category`. The
//! allocator records no stacks; an entry with a category and no frames is written with the
//! one frame `{"filename": "trainmem", "line": 0, "name": category}`, so viewers that show
//! stacks show the label. Serialised with serde (JSON), the category is written as `label`;
//! in a pickle, as `category`.

use std::collections::BTreeMap;

use serde::ser::{SerializeMap, SerializeSeq, SerializeStruct};

use crate::config::AllocatorConfig;
use crate::label::Label;
use crate::size::PoolKind;
use crate::stream::StreamId;
use crate::trace::{TraceAction, TraceEntry};

/// The state of a block in a snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockState {
    /// Handed to a client.
    ActiveAllocated,
    /// Freed by the client but waiting for other streams' work (`record_stream`).
    ActivePendingFree,
    /// Free and cached.
    Inactive,
}

impl BlockState {
    /// PyTorch's state string.
    pub fn as_str(self) -> &'static str {
        match self {
            BlockState::ActiveAllocated => "active_allocated",
            BlockState::ActivePendingFree => "active_pending_free",
            BlockState::Inactive => "inactive",
        }
    }
}

/// One stack frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// Source file (`"trainmem"` for the frame trainmem writes to carry a label).
    pub filename: String,
    /// Line number.
    pub line: i64,
    /// Function name (the label, in trainmem's frames).
    pub name: String,
}

/// The `filename` of the one frame trainmem writes to show a block's label as its stack.
pub const TRAINMEM_FRAME_FILE: &str = "trainmem";

/// The category pytorch.org/memory_viz needs whenever events carry categories.
pub const UNKNOWN_CATEGORY: &str = "unknown";

impl Frame {
    /// The frame trainmem writes for a label: `{"filename": "trainmem", "line": 0, "name":
    /// label}`.
    pub fn for_label(label: &str) -> Self {
        Frame {
            filename: TRAINMEM_FRAME_FILE.to_string(),
            line: 0,
            name: label.to_string(),
        }
    }
}

/// The stack an entry is written with: its frames, or for an entry with a category (other
/// than `"unknown"`) and no frames, the one trainmem frame naming the category.
#[derive(Clone, Copy)]
pub(crate) enum WrittenFrames<'a> {
    /// The recorded frames.
    Recorded(&'a [Frame]),
    /// The trainmem frame of a label.
    Label(&'a str),
}

impl<'a> WrittenFrames<'a> {
    pub(crate) fn of(frames: &'a [Frame], category: Option<&'a Label>) -> Self {
        match category {
            Some(c) if frames.is_empty() && c.as_str() != UNKNOWN_CATEGORY => {
                WrittenFrames::Label(c.as_str())
            }
            _ => WrittenFrames::Recorded(frames),
        }
    }

    /// Each frame as (filename, line, name).
    pub(crate) fn each(self) -> impl Iterator<Item = (&'a str, i64, &'a str)> {
        let (recorded, label) = match self {
            WrittenFrames::Recorded(f) => (f, None),
            WrittenFrames::Label(l) => (&[][..], Some((TRAINMEM_FRAME_FILE, 0, l))),
        };
        recorded
            .iter()
            .map(|f| (f.filename.as_str(), f.line, f.name.as_str()))
            .chain(label)
    }
}

impl serde::Serialize for WrittenFrames<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        struct One<'a>((&'a str, i64, &'a str));
        impl serde::Serialize for One<'_> {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let mut st = s.serialize_struct("Frame", 3)?;
                st.serialize_field("filename", self.0.0)?;
                st.serialize_field("line", &self.0.1)?;
                st.serialize_field("name", self.0.2)?;
                st.end()
            }
        }
        let mut seq = s.serialize_seq(None)?;
        for f in self.each() {
            seq.serialize_element(&One(f))?;
        }
        seq.end()
    }
}

/// The label a category and frames give: the category unless it is `"unknown"`, else the
/// name of a single trainmem frame.
pub(crate) fn label_of<'a>(category: Option<&'a Label>, frames: &'a [Frame]) -> Option<&'a str> {
    match (category.map(Label::as_str), frames) {
        (Some(c), _) if c != UNKNOWN_CATEGORY => Some(c),
        (_, [f]) if f.filename == TRAINMEM_FRAME_FILE => Some(&f.name),
        _ => None,
    }
}

/// One block of a segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockInfo {
    /// Address of the first byte.
    pub address: u64,
    /// Size in bytes (after rounding).
    pub size: u64,
    /// The client's unrounded request (0 for inactive blocks in trainmem's snapshots).
    pub requested_size: u64,
    /// Allocated, pending free or inactive.
    pub state: BlockState,
    /// The stack of the allocation (empty when unknown, and in the allocator's own
    /// snapshots).
    pub frames: Vec<Frame>,
    /// The block's category: the caller's label in the allocator's snapshots (active blocks
    /// only); in a pickle, what its writer set.
    pub category: Option<Label>,
}

impl BlockInfo {
    /// The label trainmem attached to the block (as [`TraceEntry::label`]).
    pub fn label(&self) -> Option<&str> {
        label_of(self.category.as_ref(), &self.frames)
    }
}

impl serde::Serialize for BlockInfo {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("address", &self.address)?;
        m.serialize_entry("size", &self.size)?;
        m.serialize_entry("requested_size", &self.requested_size)?;
        m.serialize_entry("state", self.state.as_str())?;
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

/// One segment (device allocation) and its blocks in address order; the blocks tile it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentInfo {
    /// Device index (0 in the allocator's snapshots).
    pub device: u64,
    /// Base address.
    pub address: u64,
    /// Segment size.
    pub total_size: u64,
    /// Bytes of allocated blocks.
    pub allocated_size: u64,
    /// Bytes of active blocks (allocated or pending free).
    pub active_size: u64,
    /// Unrounded requests of active blocks.
    pub requested_size: u64,
    /// The stream the segment serves (a CUDA stream handle in PyTorch's files).
    pub stream: StreamId,
    /// Small or large pool (`segment_type`).
    pub segment_type: PoolKind,
    /// The memory pool (`segment_pool_id`; `(0, 0)` outside CUDA graphs).
    pub segment_pool_id: (u64, u64),
    /// True for one mapped range of an expandable segment (PyTorch reports each contiguous
    /// mapped range of an expandable segment as a segment of its own).
    pub is_expandable: bool,
    /// Where the segment was allocated (often empty; always in the allocator's snapshots).
    pub frames: Vec<Frame>,
    /// The blocks, in address order.
    pub blocks: Vec<BlockInfo>,
}

impl SegmentInfo {
    /// True when no block is active, i.e. `empty_cache` would release it.
    pub fn is_free(&self) -> bool {
        self.active_size == 0
    }
}

impl serde::Serialize for SegmentInfo {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("device", &self.device)?;
        m.serialize_entry("address", &self.address)?;
        m.serialize_entry("total_size", &self.total_size)?;
        m.serialize_entry("allocated_size", &self.allocated_size)?;
        m.serialize_entry("active_size", &self.active_size)?;
        m.serialize_entry("requested_size", &self.requested_size)?;
        m.serialize_entry("stream", &self.stream.0)?;
        m.serialize_entry("segment_type", self.segment_type.as_str())?;
        m.serialize_entry("segment_pool_id", &self.segment_pool_id)?;
        m.serialize_entry("is_expandable", &self.is_expandable)?;
        m.serialize_entry("frames", &WrittenFrames::Recorded(&self.frames))?;
        m.serialize_entry("blocks", &self.blocks)?;
        m.end()
    }
}

/// The allocator settings as a snapshot reports them.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct AllocatorSettings {
    /// The configuration as an option string.
    #[serde(rename = "PYTORCH_CUDA_ALLOC_CONF")]
    pub conf: String,
    /// Split limit in bytes (`i64::MAX` when unlimited).
    pub max_split_size: i64,
    /// Garbage-collection threshold (0 when off).
    pub garbage_collection_threshold: f64,
    /// Whether expandable segments are on.
    pub expandable_segments: bool,
    /// Division count per interval, keyed by the interval's lower bound in MB (`"1"`, `"2"`, …).
    pub roundup_power2_divisions: BTreeMap<String, u64>,
}

impl AllocatorSettings {
    /// The configuration these settings describe (a snapshot's `allocator_settings`): a
    /// `max_split_size` of 0, -1 or `i64::MAX` is no limit, a threshold of 0 is no garbage
    /// collection, and `roundup_power2_divisions` keys are interval starts in MB (`"1"`,
    /// `"2"`, `"4"`, …).
    pub fn to_config(&self) -> Result<AllocatorConfig, crate::config::ConfigError> {
        let mut c = AllocatorConfig::default();
        if self.max_split_size > 0 && self.max_split_size < i64::MAX {
            c = c.with_max_split_size_mb(self.max_split_size as u64 / crate::size::MIB)?;
        }
        if self.garbage_collection_threshold > 0.0 {
            c = c.with_garbage_collection_threshold(self.garbage_collection_threshold)?;
        }
        let mut intervals = [0u64; crate::config::ROUNDUP_INTERVALS];
        for (key, &d) in &self.roundup_power2_divisions {
            let slot = key
                .parse::<u64>()
                .ok()
                .filter(|k| k.is_power_of_two())
                .map(|k| k.trailing_zeros() as usize)
                .filter(|&i| i < intervals.len());
            if let Some(i) = slot {
                intervals[i] = d;
            }
        }
        c = c.with_roundup_power2_divisions(crate::config::RoundupPower2Divisions::from_intervals(
            intervals,
        )?);
        if self.expandable_segments {
            c.set("expandable_segments", "True")?;
        }
        Ok(c)
    }

    /// The settings of a configuration.
    pub fn from_config(c: &AllocatorConfig) -> Self {
        AllocatorSettings {
            conf: c.to_string(),
            max_split_size: c
                .max_split_size()
                .map_or(i64::MAX, |m| m.min(i64::MAX as u64) as i64),
            garbage_collection_threshold: c.garbage_collection_threshold().unwrap_or(0.0),
            expandable_segments: c.expandable_segments(),
            roundup_power2_divisions: c
                .roundup_power2_divisions()
                .intervals()
                .iter()
                .enumerate()
                .map(|(i, &d)| ((1u64 << i).to_string(), d))
                .collect(),
        }
    }
}

/// A memory snapshot: the allocator's segments at one moment and the events that led there
/// (PyTorch's `_snapshot()` dict).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct Snapshot {
    /// Segments (device allocations) in address order, with their blocks.
    pub segments: Vec<SegmentInfo>,
    /// One event trace per device (the allocator has one), oldest entry first. Recording
    /// usually starts part-way through a run, so a trace can free blocks it never saw
    /// allocated.
    pub device_traces: Vec<Vec<TraceEntry>>,
    /// The allocator's settings (the allocator always writes them, torch ≥ ~2.6 too; older
    /// snapshots have none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allocator_settings: Option<AllocatorSettings>,
}

impl Snapshot {
    /// Sum of segment sizes (`reserved_bytes.all.current`).
    pub fn total_reserved(&self) -> u64 {
        self.segments.iter().map(|s| s.total_size).sum()
    }

    /// Sum of allocated block sizes (`allocated_bytes.all.current`).
    pub fn total_allocated(&self) -> u64 {
        self.segments.iter().map(|s| s.allocated_size).sum()
    }

    /// Sum of active block sizes (`active_bytes.all.current`).
    pub fn total_active(&self) -> u64 {
        self.segments.iter().map(|s| s.active_size).sum()
    }

    /// Free bytes inside segments that also hold active blocks (`inactive_split_bytes`):
    /// cached memory that `empty_cache` cannot release. Expandable segments are left out (as
    /// PyTorch leaves them out of `inactive_split_bytes`): their whole free pages can be
    /// given back.
    pub fn non_releasable(&self) -> u64 {
        self.segments
            .iter()
            .filter(|s| s.blocks.len() > 1 && !s.is_expandable)
            .flat_map(|s| s.blocks.iter())
            .filter(|b| b.state == BlockState::Inactive)
            .map(|b| b.size)
            .sum()
    }

    /// Bytes of inactive (cached, free) blocks.
    pub fn total_inactive(&self) -> u64 {
        self.inactive_sizes().sum()
    }

    /// External fragmentation of the cache: `(free - largest free block) / free` over
    /// inactive blocks (the BFC allocator's metric); 0 when nothing is cached.
    pub fn fragmentation(&self) -> f64 {
        let free = self.total_inactive();
        if free == 0 {
            0.0
        } else {
            (free - self.largest_free_block()) as f64 / free as f64
        }
    }

    /// The largest inactive block (the biggest request a cache hit could serve, ignoring
    /// streams and oversize rules).
    pub fn largest_free_block(&self) -> u64 {
        self.inactive_sizes().max().unwrap_or(0)
    }

    fn inactive_sizes(&self) -> impl Iterator<Item = u64> + '_ {
        self.segments
            .iter()
            .flat_map(|s| s.blocks.iter())
            .filter(|b| b.state == BlockState::Inactive)
            .map(|b| b.size)
    }

    /// The distinct trace-entry categories in order of first appearance, as the web viewer
    /// collects them.
    pub fn categories(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for c in self
            .device_traces
            .iter()
            .flatten()
            .filter_map(|e| e.category.as_ref().map(Label::as_str))
        {
            if !out.contains(&c) {
                out.push(c);
            }
        }
        out
    }

    /// True when some trace entry has a category and none is `"unknown"`. pytorch.org/
    /// memory_viz cannot show such a snapshot: it then tries to add `"unknown"` through a
    /// misspelt property (`snapshot.categores`), throws, and draws nothing. PyTorch's own
    /// snapshots always include `"unknown"`.
    pub fn needs_unknown_category(&self) -> bool {
        let cats = self.categories();
        !cats.is_empty() && !cats.contains(&UNKNOWN_CATEGORY)
    }

    /// Makes the snapshot viewable when [`needs_unknown_category`](Self::needs_unknown_category):
    /// every trace entry without a category gets `"unknown"`; if every entry already had one,
    /// a `snapshot` entry categorised `"unknown"` (the moment this snapshot was taken, with
    /// its allocated bytes as size) is appended to the first device trace. Does nothing
    /// otherwise.
    pub fn add_unknown_category(&mut self) {
        if !self.needs_unknown_category() {
            return;
        }
        let mut added = false;
        for e in self.device_traces.iter_mut().flatten() {
            if e.category.is_none() {
                e.category = Some(Label::new_static(UNKNOWN_CATEGORY));
                added = true;
            }
        }
        if added {
            return;
        }
        let allocated = self.total_allocated();
        if let Some(trace) = self.device_traces.iter_mut().find(|t| !t.is_empty()) {
            let time_us = trace.last().and_then(|e| e.time_us);
            trace.push(TraceEntry {
                action: TraceAction::Snapshot,
                addr: 0,
                size: allocated,
                stream: StreamId::DEFAULT,
                time_us,
                frames: Vec::new(),
                category: Some(Label::new_static(UNKNOWN_CATEGORY)),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorded_settings_become_the_configuration() {
        let mut s = AllocatorSettings::from_config(&AllocatorConfig::default());
        // PyTorch writes -1 (SIZE_MAX) when max_split_size is unset and 0 for no threshold.
        s.max_split_size = -1;
        assert_eq!(s.to_config().unwrap(), AllocatorConfig::default());
        s.max_split_size = 128 << 20;
        s.garbage_collection_threshold = 0.8;
        s.roundup_power2_divisions.insert("256".into(), 4);
        let c = s.to_config().unwrap();
        assert_eq!(c.max_split_size(), Some(128 << 20));
        assert_eq!(c.garbage_collection_threshold(), Some(0.8));
        assert_eq!(c.roundup_power2_divisions().divisions_for(300 << 20), 4);
        assert_eq!(c.roundup_power2_divisions().divisions_for(100 << 20), 0);
        s.roundup_power2_divisions.insert("512".into(), 3);
        assert!(s.to_config().is_err(), "3 divisions is not a power of two");
    }
}
