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
    /// The cache's fragmentation figures, read from the blocks in one pass (linear in the
    /// number of blocks, nothing allocated). Equal to what [`snapshot`](Self::snapshot)
    /// gives for the same figures; use this when the snapshot itself is not needed.
    pub fn cache_figures(&self) -> CacheFigures {
        let mut f = CacheFigures::default();
        for (head, n) in self.nodes.iter().enumerate() {
            if n.state == NodeState::Vacant || n.prev != NONE {
                continue;
            }
            let listed = if n.expandable {
                self.expandable.contains_key(&n.addr)
            } else {
                self.segments.contains_key(&n.addr)
            };
            if !listed {
                continue;
            }
            let mut cur = head as u32;
            while cur != NONE {
                if self.nodes[cur as usize].state == NodeState::Unmapped {
                    cur = self.nodes[cur as usize].next;
                    continue;
                }
                // One segment as the snapshot reports it: a whole segment, or one run of
                // mapped blocks of an expandable segment.
                let (mut blocks, mut total, mut active, mut inactive) = (0u64, 0, 0, 0);
                while cur != NONE {
                    let b = &self.nodes[cur as usize];
                    match b.state {
                        NodeState::Unmapped => break,
                        NodeState::Allocated | NodeState::Pending => active += b.size,
                        _ => {
                            inactive += b.size;
                            f.largest_free_block = f.largest_free_block.max(b.size);
                        }
                    }
                    blocks += 1;
                    total += b.size;
                    cur = b.next;
                }
                if active == 0 {
                    f.releasable += total;
                }
                if blocks > 1 && !n.expandable {
                    f.non_releasable += inactive;
                }
            }
        }
        f
    }
}
