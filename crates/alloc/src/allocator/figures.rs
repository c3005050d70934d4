//! The cache's fragmentation figures read straight from the blocks: what a [`Snapshot`]
//! would give, without building one (no per-block records, labels or traces copied).
//!
//! [`Snapshot`]: crate::Snapshot

use super::{CachingAllocator, NONE, NodeState};
use crate::device::DeviceMemory;

/// Fragmentation figures of the cache at one moment, equal to the same figures computed
/// from [`CachingAllocator::snapshot`] (see [`Snapshot::largest_free_block`],
/// [`Snapshot::non_releasable`] and [`SegmentInfo::is_free`]).
///
/// [`Snapshot::largest_free_block`]: crate::Snapshot::largest_free_block
/// [`Snapshot::non_releasable`]: crate::Snapshot::non_releasable
/// [`SegmentInfo::is_free`]: crate::SegmentInfo::is_free
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheFigures {
    /// The largest cached (inactive) block.
    pub largest_free_block: u64,
    /// Cached bytes in split segments that also hold an active block: `empty_cache` cannot
    /// release them (expandable segments left out, as in the snapshot's figure).
    pub non_releasable: u64,
    /// Bytes of segments (or mapped runs of an expandable segment) with no active block:
    /// what `empty_cache` would release.
    pub releasable: u64,
}

impl<D: DeviceMemory> CachingAllocator<D> {
    /// The cache's fragmentation figures, read from the blocks in one pass in slab order
    /// (linear in the number of blocks, nothing allocated, no block list followed outside
    /// expandable segments). Equal to what [`snapshot`](Self::snapshot) gives for the same
    /// figures; use this when the snapshot itself is not needed.
    ///
    /// In an ordinary segment no two free blocks are neighbours (frees merge; the invariant
    /// checker holds it), so a free block alone in its segment is a whole segment with no
    /// active block (releasable), and a free block with a neighbour lies in a segment that
    /// also holds an active one (non-releasable). Only expandable segments, whose mapped runs
    /// are the snapshot's segments, are walked block by block.
    pub fn cache_figures(&self) -> CacheFigures {
        let mut f = CacheFigures::default();
        let mut expandable_heads = false;
        for n in self.nodes.iter() {
            match n.state {
                NodeState::Free => {
                    f.largest_free_block = f.largest_free_block.max(n.size);
                    if n.expandable {
                        expandable_heads = true;
                    } else if n.prev == NONE && n.next == NONE {
                        f.releasable += n.size;
                    } else {
                        f.non_releasable += n.size;
                    }
                }
                NodeState::Vacant => {}
                _ => expandable_heads |= n.expandable,
            }
        }
        if expandable_heads {
            f.releasable += self.expandable_releasable();
        }
        f
    }

    /// Bytes of the mapped runs of expandable segments that hold no active block.
    fn expandable_releasable(&self) -> u64 {
        let mut releasable = 0;
        for (head, n) in self.nodes.iter().enumerate() {
            if !n.expandable
                || n.state == NodeState::Vacant
                || n.prev != NONE
                || !self.expandable.contains_key(&n.addr)
            {
                continue;
            }
            let mut cur = head as u32;
            while cur != NONE {
                if self.nodes[cur as usize].state == NodeState::Unmapped {
                    cur = self.nodes[cur as usize].next;
                    continue;
                }
                // One mapped run: the snapshot's segment.
                let (mut total, mut active) = (0u64, 0);
                while cur != NONE {
                    let b = &self.nodes[cur as usize];
                    match b.state {
                        NodeState::Unmapped => break,
                        NodeState::Allocated | NodeState::Pending => active += b.size,
                        _ => {}
                    }
                    total += b.size;
                    cur = b.next;
                }
                if active == 0 {
                    releasable += total;
                }
            }
        }
        releasable
    }
}
