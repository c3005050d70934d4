//! Snapshots of the allocator state, serialised as PyTorch's `_snapshot()` dict so the same
//! data can be written as a memory_viz pickle.

use std::collections::BTreeMap;

use serde::ser::SerializeMap;

use crate::config::AllocatorConfig;
use crate::label::Label;
use crate::size::PoolKind;
use crate::stream::StreamId;
use crate::trace::{Frames, TraceEntry};

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

/// One block of a segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockInfo {
    /// Address of the first byte.
    pub address: u64,
    /// Size in bytes (after rounding).
    pub size: u64,
    /// The client's unrounded request (0 for inactive blocks).
    pub requested_size: u64,
    /// Allocated, pending free or inactive.
    pub state: BlockState,
    /// The caller's label (active blocks only).
    pub label: Option<Label>,
}

impl serde::Serialize for BlockInfo {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("address", &self.address)?;
        m.serialize_entry("size", &self.size)?;
        m.serialize_entry("requested_size", &self.requested_size)?;
        m.serialize_entry("state", self.state.as_str())?;
        m.serialize_entry("frames", &Frames(self.label.as_ref()))?;
        if let Some(l) = &self.label {
            m.serialize_entry("label", l.as_str())?;
        }
        m.end()
    }
}

/// One segment (device allocation) and its blocks in address order; the blocks tile it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentInfo {
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
    /// The stream the segment serves.
    pub stream: StreamId,
    /// Small or large pool.
    pub segment_type: PoolKind,
    /// True for one mapped range of an expandable segment (PyTorch reports each contiguous
    /// mapped range of an expandable segment as a segment of its own).
    pub is_expandable: bool,
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
        m.serialize_entry("device", &0u32)?;
        m.serialize_entry("address", &self.address)?;
        m.serialize_entry("total_size", &self.total_size)?;
        m.serialize_entry("allocated_size", &self.allocated_size)?;
        m.serialize_entry("active_size", &self.active_size)?;
        m.serialize_entry("requested_size", &self.requested_size)?;
        m.serialize_entry("stream", &self.stream.0)?;
        m.serialize_entry("segment_type", self.segment_type.as_str())?;
        m.serialize_entry("segment_pool_id", &(0u32, 0u32))?;
        m.serialize_entry("is_expandable", &self.is_expandable)?;
        m.serialize_entry("frames", &Frames(None))?;
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

/// The allocator state at one moment (PyTorch's `_snapshot()` dict).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Snapshot {
    /// Segments in address order.
    pub segments: Vec<SegmentInfo>,
    /// One trace per device (trainmem has one): the recorded entries, oldest first.
    pub device_traces: Vec<Vec<TraceEntry>>,
    /// The settings.
    pub allocator_settings: AllocatorSettings,
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
        self.segments
            .iter()
            .flat_map(|s| s.blocks.iter())
            .filter(|b| b.state == BlockState::Inactive)
            .map(|b| b.size)
            .sum()
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
        self.segments
            .iter()
            .flat_map(|s| s.blocks.iter())
            .filter(|b| b.state == BlockState::Inactive)
            .map(|b| b.size)
            .max()
            .unwrap_or(0)
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
