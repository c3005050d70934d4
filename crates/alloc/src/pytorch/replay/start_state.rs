//! The allocator's state at the moment a snapshot's recording began, rebuilt by walking the
//! trace backwards from the final `segments`: segments allocated in the trace did not exist
//! yet, segments freed in it did; blocks allocated in the trace were not live yet, blocks
//! freed in it without their allocation were. Every start-live block lies inside a start
//! segment; its size is the final block's where it is still live at the end, else its
//! request rounded by the run's rules, widened to the next block when the gap left is one the
//! allocator would not have split off (a large-pool remainder of 1 MiB or less).
//!
//! One case cannot be told from the recording: a large-pool block freed in the trace that
//! kept a remainder of 1 MiB or less and had a free block after it when recording began looks
//! like a block of its rounded size followed by a larger free block; the rebuild takes the
//! rounded size. (Blocks still live at the end have their exact size from `segments`.)

use std::collections::BTreeMap;

use super::from_snapshot::free_action;
use crate::allocator::{SeedBlock, SeedSegment, SeedState};
use crate::config::AllocatorConfig;
use crate::fast_hash::FastMap;
use crate::size::{PoolKind, SMALL_BUFFER, SMALL_SIZE, round_size};
use crate::snapshot::BlockState;
use crate::stream::StreamId;
use crate::{Snapshot, TraceAction, TraceEntry};

/// The start state could not be rebuilt: the trace and the final segments disagree.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StartStateError {
    /// A `segment_alloc` (walked backwards) names a segment that does not exist then.
    #[error("entry {index}: segment_alloc of {addr:#x}, but no such segment exists after it")]
    SegmentAllocOfUnknown {
        /// Trace entry.
        index: usize,
        /// Segment address.
        addr: u64,
    },
    /// A `segment_free` (walked backwards) names a segment that still exists after it.
    #[error("entry {index}: segment_free of {addr:#x}, but that segment still exists after it")]
    SegmentFreeOfLive {
        /// Trace entry.
        index: usize,
        /// Segment address.
        addr: u64,
    },
    /// An `alloc` (walked backwards) names a block that is not live after it.
    #[error("entry {index}: alloc at {addr:#x}, but no block is live there after it")]
    AllocOfUnknown {
        /// Trace entry.
        index: usize,
        /// Block address.
        addr: u64,
    },
    /// A free (walked backwards) names a block that is live after it.
    #[error("entry {index}: free of {addr:#x}, but a block is live there after it")]
    FreeOfLive {
        /// Trace entry.
        index: usize,
        /// Block address.
        addr: u64,
    },
    /// A block live at the start lies in no segment of the start.
    #[error("block {addr:#x} ({size} bytes requested) is live at the start but lies in no segment")]
    BlockOutsideSegments {
        /// Block address.
        addr: u64,
        /// Requested bytes.
        size: u64,
    },
    /// A block live at the start does not fit before the next block or the segment's end.
    #[error("block {addr:#x} needs {size} bytes but only {room} are left before the next block")]
    BlockDoesNotFit {
        /// Block address.
        addr: u64,
        /// Its size.
        size: u64,
        /// Bytes to the next block or the segment end.
        room: u64,
    },
}

/// A segment at the start of recording.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct StartSegment {
    size: u64,
    stream: StreamId,
    pool: PoolKind,
}

/// A block live at the start of recording.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct StartBlock {
    requested: u64,
    /// The block's size where it is known (still live in the final segments).
    size: Option<u64>,
}

/// The allocator's state when recording began, as a [`SeedState`], and what it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StartState {
    /// Segments and blocks, ready for [`CachingAllocator::from_state`](crate::CachingAllocator::from_state).
    pub seed: SeedState,
    /// Addresses of the live blocks in address order (the order `from_state` returns them).
    pub live: Vec<u64>,
}

impl StartState {
    /// Bytes reserved at the start.
    pub fn reserved(&self) -> u64 {
        self.seed.segments.iter().map(|s| s.size).sum()
    }

    /// Bytes allocated at the start.
    pub fn allocated(&self) -> u64 {
        self.blocks()
            .filter(|b| b.requested.is_some())
            .map(|b| b.size)
            .sum()
    }

    /// Every block of every segment.
    pub fn blocks(&self) -> impl Iterator<Item = &SeedBlock> {
        self.seed.segments.iter().flat_map(|s| s.blocks.iter())
    }

    /// True when the allocator was empty when recording began.
    pub fn is_empty(&self) -> bool {
        self.seed.segments.is_empty()
    }
}

/// Rebuilds the state of `device`'s allocator when its trace began, with the run's rounding
/// rules from `config`.
pub fn start_state(
    snapshot: &Snapshot,
    device: usize,
    trace: &[TraceEntry],
    config: &AllocatorConfig,
) -> Result<StartState, StartStateError> {
    let (segments, live) = undo_trace(snapshot, device, trace)?;
    let mut per_segment: BTreeMap<u64, Vec<(u64, StartBlock)>> =
        segments.keys().map(|&a| (a, Vec::new())).collect();
    for (&addr, &block) in &live {
        let owner = segments
            .range(..=addr)
            .next_back()
            .filter(|(base, s)| addr < **base + s.size);
        let Some((&base, _)) = owner else {
            return Err(StartStateError::BlockOutsideSegments {
                addr,
                size: block.requested,
            });
        };
        per_segment.entry(base).or_default().push((addr, block));
    }
    let mut seed = SeedState::default();
    for (base, mut blocks) in per_segment {
        let seg = segments[&base];
        blocks.sort_by_key(|&(a, _)| a);
        seed.segments
            .push(build_segment(base, seg, &blocks, config)?);
    }
    let live = live.keys().copied().collect();
    Ok(StartState { seed, live })
}

/// Segments and live blocks after undoing the whole trace, keyed by address.
type Undone = (BTreeMap<u64, StartSegment>, BTreeMap<u64, StartBlock>);

/// Walks the trace backwards from the final segments.
fn undo_trace(
    snapshot: &Snapshot,
    device: usize,
    trace: &[TraceEntry],
) -> Result<Undone, StartStateError> {
    let mut segments = BTreeMap::new();
    let mut live: FastMap<u64, StartBlock> = FastMap::default();
    for s in snapshot
        .segments
        .iter()
        .filter(|s| s.device == device as u64)
    {
        let seg = StartSegment {
            size: s.total_size,
            stream: s.stream,
            pool: s.segment_type,
        };
        segments.insert(s.address, seg);
        for b in s.blocks.iter().filter(|b| b.state != BlockState::Inactive) {
            let block = StartBlock {
                requested: b.requested_size.max(1),
                size: Some(b.size),
            };
            live.insert(b.address, block);
        }
    }
    let free = free_action(trace);
    for (index, e) in trace.iter().enumerate().rev() {
        let addr = e.addr;
        let broken = match &e.action {
            TraceAction::SegmentAlloc => segments
                .remove(&addr)
                .is_none()
                .then_some(StartStateError::SegmentAllocOfUnknown { index, addr }),
            TraceAction::SegmentFree => {
                let pool = if e.size == SMALL_BUFFER {
                    PoolKind::Small
                } else {
                    PoolKind::Large
                };
                let seg = StartSegment {
                    size: e.size,
                    stream: e.stream,
                    pool,
                };
                segments
                    .insert(addr, seg)
                    .map(|_| StartStateError::SegmentFreeOfLive { index, addr })
            }
            TraceAction::Alloc => live
                .remove(&addr)
                .is_none()
                .then_some(StartStateError::AllocOfUnknown { index, addr }),
            a if *a == free => {
                let block = StartBlock {
                    requested: e.size.max(1),
                    size: None,
                };
                live.insert(addr, block)
                    .map(|_| StartStateError::FreeOfLive { index, addr })
            }
            _ => None,
        };
        if let Some(err) = broken {
            return Err(err);
        }
    }
    Ok((segments, live.into_iter().collect()))
}

/// The size of a start-live block at `addr` with `room` bytes before the next block or the
/// segment's end.
fn block_size(
    addr: u64,
    block: StartBlock,
    pool: PoolKind,
    room: u64,
    config: &AllocatorConfig,
) -> Result<u64, StartStateError> {
    let size = match block.size {
        Some(size) => size,
        None => {
            let rounded =
                round_size(block.requested, config.roundup_power2_divisions()).unwrap_or(u64::MAX);
            let left = room.saturating_sub(rounded);
            let unsplit = match pool {
                PoolKind::Small => false,
                PoolKind::Large if rounded >= config.max_split_size_or_max() => {
                    left < config.max_non_split_rounding()
                }
                PoolKind::Large => left <= SMALL_SIZE,
            };
            if unsplit && rounded <= room {
                room
            } else {
                rounded
            }
        }
    };
    if size > room {
        return Err(StartStateError::BlockDoesNotFit { addr, size, room });
    }
    Ok(size)
}

/// One start segment: its live blocks with their sizes and the free blocks between them.
fn build_segment(
    base: u64,
    seg: StartSegment,
    blocks: &[(u64, StartBlock)],
    config: &AllocatorConfig,
) -> Result<SeedSegment, StartStateError> {
    let end = base + seg.size;
    let mut out = Vec::with_capacity(blocks.len() * 2 + 1);
    let mut cursor = base;
    for (i, &(addr, block)) in blocks.iter().enumerate() {
        let next = blocks.get(i + 1).map_or(end, |&(a, _)| a);
        if addr > cursor {
            out.push(SeedBlock::free(cursor, addr - cursor));
        }
        let size = block_size(addr, block, seg.pool, next - addr, config)?;
        out.push(SeedBlock::allocated(addr, size, block.requested.min(size)));
        cursor = addr + size;
    }
    if cursor < end {
        out.push(SeedBlock::free(cursor, end - cursor));
    }
    Ok(SeedSegment {
        address: base,
        size: seg.size,
        stream: seg.stream,
        pool: seg.pool,
        blocks: out,
    })
}
