//! PyTorch's memory-snapshot dict as plain Rust data: what `torch.cuda.memory._snapshot()`
//! returns and `torch.cuda.memory._dump_snapshot()` pickles, and what PyTorch's viewers
//! (`python -m torch.cuda._memory_viz`, pytorch.org/memory_viz) read.
//!
//! The types keep what the viewers and a replay use: segments with their blocks, one event
//! trace per device, the allocator settings, stack frames and categories. Keys PyTorch adds
//! that nothing here reads (`external_annotations`, `compile_context`, `user_metadata`) are
//! dropped on reading.

use crate::size::PoolKind;
use crate::snapshot::{AllocatorSettings, BlockState};
use crate::trace::TraceAction;

/// A memory snapshot: the allocator's segments at one moment and the events that led there.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MemorySnapshot {
    /// Segments (device allocations) when the snapshot was taken, with their blocks.
    pub segments: Vec<SegmentRecord>,
    /// One event trace per device, oldest event first. Recording usually starts part-way
    /// through a run, so a trace can free blocks it never saw allocated.
    pub device_traces: Vec<Vec<TraceEvent>>,
    /// The allocator's settings (torch ≥ ~2.6 writes them; older snapshots have none).
    pub allocator_settings: Option<AllocatorSettings>,
}

/// One segment (`segments[i]`).
#[derive(Clone, Debug, PartialEq)]
pub struct SegmentRecord {
    /// Device index.
    pub device: u64,
    /// Base address.
    pub address: u64,
    /// Segment size in bytes.
    pub total_size: u64,
    /// Bytes of allocated blocks.
    pub allocated_size: u64,
    /// Bytes of active blocks (allocated or pending free).
    pub active_size: u64,
    /// Unrounded requests of active blocks.
    pub requested_size: u64,
    /// The stream the segment serves (a CUDA stream handle in PyTorch's files).
    pub stream: u64,
    /// Small or large pool (`segment_type`).
    pub segment_type: PoolKind,
    /// The memory pool (`segment_pool_id`; `(0, 0)` outside CUDA graphs).
    pub segment_pool_id: (u64, u64),
    /// Whether the segment is an expandable segment.
    pub is_expandable: bool,
    /// Where the segment was allocated (often empty).
    pub frames: Vec<Frame>,
    /// The blocks tiling the segment, in address order.
    pub blocks: Vec<BlockRecord>,
}

/// One block of a segment.
#[derive(Clone, Debug, PartialEq)]
pub struct BlockRecord {
    /// Address of the first byte.
    pub address: u64,
    /// Size after rounding.
    pub size: u64,
    /// The unrounded request (0 for inactive blocks in trainmem's snapshots).
    pub requested_size: u64,
    /// Allocated, pending free or inactive.
    pub state: BlockState,
    /// The stack of the allocation (empty when unknown).
    pub frames: Vec<Frame>,
    /// The block's category, when the writer had one.
    pub category: Option<String>,
}

/// One entry of a device trace.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceEvent {
    /// What happened.
    pub action: Action,
    /// Block or segment address; for [`Action::Oom`], the bytes the device reported free
    /// (PyTorch's `device_free` key).
    pub addr: u64,
    /// Bytes: the unrounded request for `alloc` and the frees, the segment size for segment
    /// events, the rounded request for `oom`.
    pub size: u64,
    /// The stream (a CUDA stream handle in PyTorch's files).
    pub stream: u64,
    /// Time stamp in microseconds (torch ≥ ~2.1; trainmem writes its logical clock).
    pub time_us: Option<u64>,
    /// The stack of the event (empty when unknown).
    pub frames: Vec<Frame>,
    /// The event's category. pytorch.org/memory_viz colours the timeline by category and
    /// needs an `"unknown"` one among them when any event has a category (see
    /// [`MemorySnapshot::needs_unknown_category`]).
    pub category: Option<String>,
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

/// A trace event's action, with PyTorch's strings.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// A block was handed out (`alloc`).
    Alloc,
    /// A block was freed by its user (`free_requested`).
    FreeRequested,
    /// A freed block returned to the cache (`free_completed`).
    FreeCompleted,
    /// A segment was allocated from the device (`segment_alloc`).
    SegmentAlloc,
    /// A segment was returned to the device (`segment_free`).
    SegmentFree,
    /// Expandable segments: pages mapped (`segment_map`).
    SegmentMap,
    /// Expandable segments: pages unmapped (`segment_unmap`).
    SegmentUnmap,
    /// A snapshot was taken while recording (`snapshot`).
    Snapshot,
    /// An allocation failed (`oom`).
    Oom,
    /// Any other action string, kept as read.
    Other(String),
}

impl Action {
    /// PyTorch's action string.
    pub fn as_str(&self) -> &str {
        match self {
            Action::Alloc => "alloc",
            Action::FreeRequested => "free_requested",
            Action::FreeCompleted => "free_completed",
            Action::SegmentAlloc => "segment_alloc",
            Action::SegmentFree => "segment_free",
            Action::SegmentMap => "segment_map",
            Action::SegmentUnmap => "segment_unmap",
            Action::Snapshot => "snapshot",
            Action::Oom => "oom",
            Action::Other(s) => s,
        }
    }

    /// The action named by `s` (unknown strings give [`Action::Other`]).
    pub fn parse(s: &str) -> Self {
        match s {
            "alloc" => Action::Alloc,
            "free_requested" => Action::FreeRequested,
            "free_completed" => Action::FreeCompleted,
            "segment_alloc" => Action::SegmentAlloc,
            "segment_free" => Action::SegmentFree,
            "segment_map" => Action::SegmentMap,
            "segment_unmap" => Action::SegmentUnmap,
            "snapshot" => Action::Snapshot,
            "oom" => Action::Oom,
            other => Action::Other(other.to_string()),
        }
    }

    /// True for the segment events (`segment_alloc`, `segment_free`, `segment_map`,
    /// `segment_unmap`).
    pub fn is_segment_event(&self) -> bool {
        matches!(
            self,
            Action::SegmentAlloc | Action::SegmentFree | Action::SegmentMap | Action::SegmentUnmap
        )
    }
}

impl From<TraceAction> for Action {
    fn from(a: TraceAction) -> Self {
        match a {
            TraceAction::Alloc => Action::Alloc,
            TraceAction::FreeRequested => Action::FreeRequested,
            TraceAction::FreeCompleted => Action::FreeCompleted,
            TraceAction::SegmentAlloc => Action::SegmentAlloc,
            TraceAction::SegmentFree => Action::SegmentFree,
            TraceAction::SegmentMap => Action::SegmentMap,
            TraceAction::SegmentUnmap => Action::SegmentUnmap,
            TraceAction::Oom => Action::Oom,
        }
    }
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl TraceEvent {
    /// The label trainmem attached to the event: its category unless that is `"unknown"`,
    /// else the name of a single trainmem frame.
    pub fn label(&self) -> Option<&str> {
        label_of(self.category.as_deref(), &self.frames)
    }
}

impl BlockRecord {
    /// The label trainmem attached to the block (as [`TraceEvent::label`]).
    pub fn label(&self) -> Option<&str> {
        label_of(self.category.as_deref(), &self.frames)
    }
}

fn label_of<'a>(category: Option<&'a str>, frames: &'a [Frame]) -> Option<&'a str> {
    match (category, frames) {
        (Some(c), _) if c != UNKNOWN_CATEGORY => Some(c),
        (_, [f]) if f.filename == TRAINMEM_FRAME_FILE => Some(&f.name),
        _ => None,
    }
}

impl MemorySnapshot {
    /// Sum of segment sizes (reserved bytes when the snapshot was taken).
    pub fn total_reserved(&self) -> u64 {
        self.segments.iter().map(|s| s.total_size).sum()
    }

    /// Sum of allocated bytes over segments.
    pub fn total_allocated(&self) -> u64 {
        self.segments.iter().map(|s| s.allocated_size).sum()
    }

    /// The distinct trace-event categories in order of first appearance, as the web viewer
    /// collects them.
    pub fn categories(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for c in self
            .device_traces
            .iter()
            .flatten()
            .filter_map(|e| e.category.as_deref())
        {
            if !out.contains(&c) {
                out.push(c);
            }
        }
        out
    }

    /// True when some trace event has a category and none is `"unknown"`. pytorch.org/
    /// memory_viz cannot show such a snapshot: it then tries to add `"unknown"` through a
    /// misspelt property (`snapshot.categores`), throws, and draws nothing. PyTorch's own
    /// snapshots always include `"unknown"`.
    pub fn needs_unknown_category(&self) -> bool {
        let cats = self.categories();
        !cats.is_empty() && !cats.contains(&UNKNOWN_CATEGORY)
    }

    /// Makes the snapshot viewable when [`needs_unknown_category`](Self::needs_unknown_category):
    /// every trace event without a category gets `"unknown"`; if every event already had one,
    /// a `snapshot` event categorised `"unknown"` (the moment this snapshot was taken, with
    /// its allocated bytes as size) is appended to the first device trace. Does nothing
    /// otherwise.
    pub fn add_unknown_category(&mut self) {
        if !self.needs_unknown_category() {
            return;
        }
        let mut added = false;
        for e in self.device_traces.iter_mut().flatten() {
            if e.category.is_none() {
                e.category = Some(UNKNOWN_CATEGORY.to_string());
                added = true;
            }
        }
        if added {
            return;
        }
        let allocated = self.total_allocated();
        if let Some(trace) = self.device_traces.iter_mut().find(|t| !t.is_empty()) {
            let time_us = trace.last().and_then(|e| e.time_us);
            trace.push(TraceEvent {
                action: Action::Snapshot,
                addr: 0,
                size: allocated,
                stream: 0,
                time_us,
                frames: Vec::new(),
                category: Some(UNKNOWN_CATEGORY.to_string()),
            });
        }
    }
}
