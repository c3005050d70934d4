//! Building an allocator in a given state: [`CachingAllocator::from_state`] takes segments
//! with their blocks (allocated or cached free), checks them against the allocator's
//! invariants and returns an allocator that continues from there, as if it had reached that
//! state by allocating. A replay of a recording that began part-way through a run starts
//! from the state rebuilt for the moment recording began.

use super::invariants::check_invariants;
use super::{CachingAllocator, NONE, Node, NodeState, fkey, pidx};
use crate::block::{Block, BlockId};
use crate::config::AllocatorConfig;
use crate::device::{DeviceError, DeviceMemory};
use crate::size::{MIN_BLOCK_SIZE, PoolKind, SMALL_BUFFER};
use crate::snapshot::{BlockState, Snapshot};
use crate::stream::StreamId;

/// The state to build an allocator in: every segment with the blocks that tile it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SeedState {
    /// The segments, in any order.
    pub segments: Vec<SeedSegment>,
}

impl SeedState {
    /// The state an allocator's [`Snapshot`] shows: its segments and blocks, with blocks
    /// pending a cross-stream free seeded as allocated.
    pub fn from_snapshot(snapshot: &Snapshot) -> Self {
        let segments = snapshot
            .segments
            .iter()
            .map(|s| SeedSegment {
                address: s.address,
                size: s.total_size,
                stream: s.stream,
                pool: s.segment_type,
                blocks: s
                    .blocks
                    .iter()
                    .map(|b| SeedBlock {
                        address: b.address,
                        size: b.size,
                        requested: (b.state != BlockState::Inactive).then_some(b.requested_size),
                    })
                    .collect(),
            })
            .collect();
        SeedState { segments }
    }
}

/// One segment of a [`SeedState`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeedSegment {
    /// Base address.
    pub address: u64,
    /// Size in bytes.
    pub size: u64,
    /// The stream whose pool the segment belongs to.
    pub stream: StreamId,
    /// Small or large pool (a small-pool segment is 2 MiB).
    pub pool: PoolKind,
    /// The blocks in address order; they must tile the segment.
    pub blocks: Vec<SeedBlock>,
}

/// One block of a [`SeedSegment`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeedBlock {
    /// Address of the first byte.
    pub address: u64,
    /// Size in bytes (a multiple of 512).
    pub size: u64,
    /// `Some(requested bytes)` for an allocated block, `None` for a cached free block.
    pub requested: Option<u64>,
}

impl SeedBlock {
    /// An allocated block of `size` bytes for a request of `requested` bytes.
    pub fn allocated(address: u64, size: u64, requested: u64) -> Self {
        SeedBlock {
            address,
            size,
            requested: Some(requested),
        }
    }

    /// A cached free block.
    pub fn free(address: u64, size: u64) -> Self {
        SeedBlock {
            address,
            size,
            requested: None,
        }
    }
}

/// A [`SeedState`] the allocator cannot be in.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SeedError {
    /// A segment has size 0, a size that is not a multiple of 512, or no blocks.
    #[error("segment {address:#x}: {reason}")]
    BadSegment {
        /// The segment's address.
        address: u64,
        /// What is wrong.
        reason: String,
    },
    /// Two segments share addresses.
    #[error("segments {first:#x} and {second:#x} overlap")]
    Overlap {
        /// The lower segment.
        first: u64,
        /// The segment starting inside it.
        second: u64,
    },
    /// The blocks of a segment leave a gap, overlap or run past its end.
    #[error(
        "segment {segment:#x}: block at {address:#x}, expected one at {expected:#x} (blocks must tile the segment)"
    )]
    Tiling {
        /// The segment.
        segment: u64,
        /// The block's address.
        address: u64,
        /// Where the block should have started.
        expected: u64,
    },
    /// A block is wrong in itself (size, requested size) or beside another free block.
    #[error("segment {segment:#x}, block {address:#x}: {reason}")]
    BadBlock {
        /// The segment.
        segment: u64,
        /// The block.
        address: u64,
        /// What is wrong.
        reason: String,
    },
    /// The device would not take over a segment.
    #[error("segment {address:#x}: the device refused it: {source}")]
    Device {
        /// The segment.
        address: u64,
        /// The device's error.
        #[source]
        source: DeviceError,
    },
    /// The built allocator fails the invariant checker (a bug if the checks above passed).
    #[error("{0}")]
    Invariant(String),
}

fn bad_block(seg: &SeedSegment, b: &SeedBlock, reason: impl Into<String>) -> SeedError {
    SeedError::BadBlock {
        segment: seg.address,
        address: b.address,
        reason: reason.into(),
    }
}

/// Checks one segment on its own: size, tiling, block sizes, requests, free neighbours.
fn check_segment(seg: &SeedSegment) -> Result<(), SeedError> {
    let bad = |reason: &str| SeedError::BadSegment {
        address: seg.address,
        reason: reason.to_string(),
    };
    if seg.size == 0 || !seg.size.is_multiple_of(MIN_BLOCK_SIZE) {
        return Err(bad("its size must be a positive multiple of 512 bytes"));
    }
    if seg.pool == PoolKind::Small && seg.size != SMALL_BUFFER {
        return Err(bad("a small-pool segment must be 2 MiB"));
    }
    if seg.address.checked_add(seg.size).is_none() {
        return Err(bad("it runs past the end of the address space"));
    }
    if seg.blocks.is_empty() {
        return Err(bad("it has no blocks"));
    }
    let mut cursor = seg.address;
    let mut prev_free = false;
    for b in &seg.blocks {
        if b.address != cursor || cursor >= seg.address + seg.size {
            return Err(SeedError::Tiling {
                segment: seg.address,
                address: b.address,
                expected: cursor,
            });
        }
        if b.size == 0 || !b.size.is_multiple_of(MIN_BLOCK_SIZE) {
            return Err(bad_block(seg, b, "size must be a positive multiple of 512"));
        }
        match b.requested {
            Some(r) if r == 0 || r > b.size => {
                return Err(bad_block(
                    seg,
                    b,
                    format!("requested {r} bytes, outside 1..={}", b.size),
                ));
            }
            None if prev_free => {
                return Err(bad_block(
                    seg,
                    b,
                    "two neighbouring free blocks (frees merge)",
                ));
            }
            _ => {}
        }
        prev_free = b.requested.is_none();
        cursor = cursor.saturating_add(b.size);
    }
    if cursor != seg.address + seg.size {
        return Err(SeedError::Tiling {
            segment: seg.address,
            address: cursor,
            expected: seg.address + seg.size,
        });
    }
    Ok(())
}

/// Checks every segment and that no two overlap; returns the segments in address order.
fn check_state(state: &SeedState) -> Result<Vec<&SeedSegment>, SeedError> {
    let mut segs: Vec<&SeedSegment> = state.segments.iter().collect();
    segs.sort_by_key(|s| s.address);
    for s in &segs {
        check_segment(s)?;
    }
    for w in segs.windows(2) {
        if w[0].address + w[0].size > w[1].address {
            return Err(SeedError::Overlap {
                first: w[0].address,
                second: w[1].address,
            });
        }
    }
    Ok(segs)
}

impl<D: DeviceMemory> CachingAllocator<D> {
    /// An allocator with `config` over `device`, in `state`: its segments taken over from the
    /// device ([`DeviceMemory::adopt`]) and its blocks allocated or cached as given. Returns
    /// the allocator and a [`Block`] (with the id to free it by) for each allocated block, in
    /// the order of `state`. Statistics start from the state: current values and peaks are
    /// its totals; cumulative counts and device calls are 0.
    ///
    /// A state the allocator cannot be in is a [`SeedError`] naming the segment and block:
    /// a segment whose blocks do not tile it, overlapping segments, sizes that are not
    /// multiples of 512, a small-pool segment other than 2 MiB, a requested size outside
    /// `1..=size`, two neighbouring free blocks; the built allocator is then checked by the
    /// invariant checker.
    pub fn from_state(
        device: D,
        config: AllocatorConfig,
        state: &SeedState,
    ) -> Result<(Self, Vec<Block>), SeedError> {
        let segs = check_state(state)?;
        let mut alloc = CachingAllocator::with_config(device, config);
        let mut live = Vec::new();
        for seg in segs {
            alloc
                .device
                .adopt(seg.address, seg.size)
                .map_err(|source| SeedError::Device {
                    address: seg.address,
                    source,
                })?;
            alloc.seed_segment(seg, &mut live);
        }
        alloc.stats.reset_accumulated();
        check_invariants(&alloc).map_err(|v| SeedError::Invariant(v.0))?;
        Ok((alloc, live))
    }

    /// Adds one checked segment and its blocks, with their statistics.
    fn seed_segment(&mut self, seg: &SeedSegment, live: &mut Vec<Block>) {
        let pool = seg.pool;
        let p = pidx(pool);
        let slot = self.slot_of(seg.stream);
        let max_split = self.config.max_split_size_or_max();
        self.segments.insert(seg.address, seg.size);
        self.reserved += seg.size;
        self.stats.segment.increase(pool, 1);
        self.stats.reserved_bytes.increase(pool, seg.size);
        if seg.size >= max_split {
            self.stats.oversize_segments.increase(1);
        }
        let split = seg.blocks.len() > 1;
        let mut prev = NONE;
        for b in &seg.blocks {
            let node = Node::free_block(b.address, b.size, pool, slot, 0, prev, NONE);
            let idx = self.new_node(node);
            if prev != NONE {
                self.nodes[prev as usize].next = idx;
            }
            prev = idx;
            let Some(requested) = b.requested else {
                self.pools[slot as usize].free[p].insert(fkey(b.size, b.address), idx);
                if split {
                    self.stats.inactive_split.increase(pool, 1);
                    self.stats.inactive_split_bytes.increase(pool, b.size);
                }
                continue;
            };
            let seq = self.next_seq;
            self.next_seq += 1;
            let n = &mut self.nodes[idx as usize];
            n.state = NodeState::Allocated;
            n.requested = requested;
            n.seq = seq;
            if let Some(m) = &mut self.addr_index {
                m.insert(b.address, idx);
            }
            let st = &mut self.stats;
            st.allocation.increase(pool, 1);
            st.allocated_bytes.increase(pool, b.size);
            st.active.increase(pool, 1);
            st.active_bytes.increase(pool, b.size);
            st.requested_bytes.increase(pool, requested);
            if b.size >= max_split {
                st.oversize_allocations.increase(1);
            }
            live.push(Block {
                id: BlockId {
                    owner: self.owner,
                    index: idx,
                    seq,
                },
                address: b.address,
                size: b.size,
                requested_size: requested,
                stream: seg.stream,
            });
        }
    }
}

#[cfg(test)]
mod tests;
