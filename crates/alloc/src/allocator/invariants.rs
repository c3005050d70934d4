//! The invariant checker: recounts the allocator's state from its blocks and compares.

use super::expandable::expandable_page_size;
use super::{CachingAllocator, NONE, NodeState, fkey, pidx};
use crate::device::DeviceMemory;
use crate::size::{MIN_BLOCK_SIZE, PoolKind};
use crate::stats::{MemoryStats, Stat, StatArray};
use crate::stream::StreamId;

/// A broken allocator invariant, with a description of what differs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("allocator invariant violated: {0}")]
pub struct InvariantViolation(pub String);

macro_rules! ensure {
    ($cond:expr, $($arg:tt)*) => {
        if !$cond {
            return Err(InvariantViolation(format!($($arg)*)));
        }
    };
}

#[derive(Default)]
struct Counts {
    allocation: [u64; 2],
    allocated_bytes: [u64; 2],
    active: [u64; 2],
    active_bytes: [u64; 2],
    requested_bytes: [u64; 2],
    segment: [u64; 2],
    reserved_bytes: [u64; 2],
    inactive_split: [u64; 2],
    inactive_split_bytes: [u64; 2],
    oversize_allocations: u64,
    oversize_segments: u64,
}

fn check_array(name: &str, a: &StatArray, want: [u64; 2]) -> Result<(), InvariantViolation> {
    let got = [a.small_pool.current, a.large_pool.current, a.all.current];
    let want = [want[0] as i64, want[1] as i64, (want[0] + want[1]) as i64];
    ensure!(
        got == want,
        "{name}: stats say (small, large, all) = {got:?}, recount gives {want:?}"
    );
    for (pool, s) in [
        ("all", &a.all),
        ("small", &a.small_pool),
        ("large", &a.large_pool),
    ] {
        check_stat(&format!("{name}.{pool}"), s)?;
    }
    Ok(())
}

fn check_stat(name: &str, s: &Stat) -> Result<(), InvariantViolation> {
    ensure!(s.current >= 0, "{name}: negative current {}", s.current);
    ensure!(
        s.peak >= s.current,
        "{name}: peak {} below current {}",
        s.peak,
        s.current
    );
    Ok(())
}

/// What a walk over every segment's blocks found, for the checks that follow it.
#[derive(Default)]
struct Walk {
    /// The statistics recounted from the blocks.
    counts: Counts,
    /// Blocks reached from a segment head.
    visited: usize,
    /// Free blocks among them.
    free: usize,
    /// Unmapped blocks among them.
    unmapped: usize,
    /// Stream events outstanding on pending blocks.
    pending_events: u64,
    /// Sum of the segment sizes.
    reserved: u64,
}

/// The segment a block is checked in.
struct Seg {
    base: u64,
    pool: usize,
    stream: StreamId,
    split: bool,
    /// An expandable segment (its blocks tile the reserved range; only mapped blocks count
    /// as reserved).
    expandable: bool,
}

/// Checks every structural and accounting invariant of `alloc`:
///
/// * the blocks of each segment tile it exactly (address order, no gap, no overlap, linked
///   both ways, same stream and pool), every block is in exactly one segment, sizes are
///   multiples of 512;
/// * in expandable segments, unmapped blocks are whole pages, are exactly the members of the
///   unmapped sets, and no two are neighbours; reserved counts their mapped blocks only;
/// * free blocks are exactly the members of the free sets, and no two free blocks are
///   neighbours (frees merge);
/// * the address map holds exactly the allocated blocks; pending frees match their events;
/// * every current statistic equals a recount from the blocks, peaks are ≥ current, and
///   allocated + pending + cached bytes = reserved bytes = the sum of segment sizes;
/// * the snapshot's totals agree with the statistics, and [`CachingAllocator::cache_figures`]
///   with the snapshot's fragmentation figures.
pub fn check_invariants<D: DeviceMemory>(
    alloc: &CachingAllocator<D>,
) -> Result<(), InvariantViolation> {
    let walk = walk_segments(alloc)?;
    check_indexes(alloc, &walk)?;
    check_stats(&alloc.stats, &walk.counts)?;
    check_totals(alloc, &walk.counts)
}

/// Walks every segment from its head block, checking the tiling and each block, and
/// recounting the statistics.
fn walk_segments<D: DeviceMemory>(alloc: &CachingAllocator<D>) -> Result<Walk, InvariantViolation> {
    let mut walk = Walk::default();
    let mut by_addr = std::collections::HashMap::new();
    for (i, n) in alloc.nodes.iter().enumerate() {
        if n.state != NodeState::Vacant && n.prev == NONE {
            by_addr.insert(n.addr, i as u32);
        }
    }
    let whole = alloc.segments.iter().map(|(&b, &s)| (b, s, false));
    let expandable = alloc.expandable.iter().map(|(&b, &s)| (b, s, true));
    for (base, seg_size, is_exp) in whole.chain(expandable) {
        let Some(&head) = by_addr.get(&base) else {
            return Err(InvariantViolation(format!(
                "segment {base:#x} has no head block"
            )));
        };
        walk_segment(alloc, base, seg_size, is_exp, head, &mut walk)?;
    }
    Ok(walk)
}

/// Walks one segment (`base`, `seg_size`, expandable or not) from its `head` block: the
/// blocks tile it, link both ways and agree on pool, stream and kind; each is checked and
/// counted.
fn walk_segment<D: DeviceMemory>(
    alloc: &CachingAllocator<D>,
    base: u64,
    seg_size: u64,
    is_exp: bool,
    head: u32,
    walk: &mut Walk,
) -> Result<(), InvariantViolation> {
    let max_split = alloc.config.max_split_size_or_max();
    let hn = &alloc.nodes[head as usize];
    let seg = Seg {
        base,
        pool: pidx(hn.pool),
        stream: alloc.pools[hn.slot as usize].stream,
        split: hn.next != NONE,
        expandable: is_exp,
    };
    if !is_exp {
        walk.reserved += seg_size;
        walk.counts.segment[seg.pool] += 1;
        walk.counts.reserved_bytes[seg.pool] += seg_size;
        if seg_size >= max_split {
            walk.counts.oversize_segments += 1;
        }
    }
    let mut cursor = base;
    let mut prev = NONE;
    let mut prev_state = NodeState::Vacant;
    let mut cur = head;
    while cur != NONE {
        let n = &alloc.nodes[cur as usize];
        walk.visited += 1;
        check_link(alloc, &seg, hn.pool, cur, cursor, prev, prev_state)?;
        if is_exp && n.state != NodeState::Unmapped {
            walk.reserved += n.size;
            walk.counts.reserved_bytes[seg.pool] += n.size;
        }
        check_block(alloc, &seg, cur, max_split, walk)?;
        prev_state = n.state;
        cursor += n.size;
        prev = cur;
        cur = n.next;
    }
    ensure!(
        cursor == base + seg_size,
        "segment {base:#x}: blocks end at {cursor:#x}, segment ends at {:#x}",
        base + seg_size
    );
    Ok(())
}

/// Checks block `cur`'s place in segment `seg` (of `pool`): live, at `cursor`, linked back
/// to `prev`, of the segment's pool, stream and kind, of a whole number of 512 B units, and
/// not a second free (or unmapped) block after a `prev_state` one.
fn check_link<D: DeviceMemory>(
    alloc: &CachingAllocator<D>,
    seg: &Seg,
    pool: PoolKind,
    cur: u32,
    cursor: u64,
    prev: u32,
    prev_state: NodeState,
) -> Result<(), InvariantViolation> {
    let base = seg.base;
    let n = &alloc.nodes[cur as usize];
    ensure!(
        n.state != NodeState::Vacant,
        "vacant block {cur} linked into segment {base:#x}"
    );
    ensure!(
        n.addr == cursor,
        "segment {base:#x}: block at {:#x}, expected {cursor:#x} (gap or overlap)",
        n.addr
    );
    ensure!(
        n.prev == prev,
        "segment {base:#x}: block {cur} has prev {} instead of {prev}",
        n.prev
    );
    ensure!(
        n.pool == pool && alloc.pools[n.slot as usize].stream == seg.stream,
        "segment {base:#x}: block {cur} has another pool or stream"
    );
    ensure!(
        n.size > 0 && n.size.is_multiple_of(MIN_BLOCK_SIZE),
        "block {cur} has size {}",
        n.size
    );
    ensure!(
        n.expandable == seg.expandable,
        "segment {base:#x}: block {cur} disagrees on being expandable"
    );
    ensure!(
        n.state != prev_state || !matches!(n.state, NodeState::Free | NodeState::Unmapped),
        "segment {base:#x}: two neighbouring {:?} blocks at {:#x}",
        n.state,
        n.addr
    );
    Ok(())
}

/// Checks one block by its state (free: filed in its free set, not next to another free
/// block; allocated: in the address map; pending: waiting on events) and counts it.
fn check_block<D: DeviceMemory>(
    alloc: &CachingAllocator<D>,
    seg: &Seg,
    cur: u32,
    max_split: u64,
    walk: &mut Walk,
) -> Result<(), InvariantViolation> {
    let n = &alloc.nodes[cur as usize];
    match n.state {
        NodeState::Unmapped => check_unmapped_block(alloc, seg, cur, walk)?,
        NodeState::Free => check_free_block(alloc, seg, cur, walk)?,
        NodeState::Allocated => {
            ensure!(
                alloc
                    .addr_index
                    .as_ref()
                    .is_none_or(|m| m.get(&n.addr) == Some(&cur)),
                "allocated block {cur} at {:#x} missing from the address map",
                n.addr
            );
            ensure!(
                n.requested > 0 && n.requested <= n.size,
                "block {cur}: requested {} vs size {}",
                n.requested,
                n.size
            );
            ensure!(n.event_count == 0, "allocated block {cur} has events");
            walk.counts.allocation[seg.pool] += 1;
            walk.counts.allocated_bytes[seg.pool] += n.size;
            walk.counts.active[seg.pool] += 1;
            walk.counts.active_bytes[seg.pool] += n.size;
            walk.counts.requested_bytes[seg.pool] += n.requested;
            if n.size >= max_split {
                walk.counts.oversize_allocations += 1;
            }
        }
        NodeState::Pending => {
            ensure!(n.event_count > 0, "pending block {cur} without events");
            walk.pending_events += u64::from(n.event_count);
            walk.counts.active[seg.pool] += 1;
            walk.counts.active_bytes[seg.pool] += n.size;
            walk.counts.requested_bytes[seg.pool] += n.requested;
        }
        NodeState::Vacant => unreachable!(),
    }
    Ok(())
}

/// Checks an unmapped block: inside an expandable segment, whole pages, in its unmapped set.
fn check_unmapped_block<D: DeviceMemory>(
    alloc: &CachingAllocator<D>,
    seg: &Seg,
    cur: u32,
    walk: &mut Walk,
) -> Result<(), InvariantViolation> {
    let n = &alloc.nodes[cur as usize];
    let page = expandable_page_size(n.pool);
    walk.unmapped += 1;
    ensure!(
        seg.expandable,
        "unmapped block {cur} outside an expandable segment"
    );
    ensure!(
        (n.addr - seg.base).is_multiple_of(page) && n.size.is_multiple_of(page),
        "unmapped block {cur} at {:#x} of {} bytes is not whole pages of {page}",
        n.addr,
        n.size
    );
    ensure!(
        alloc.pools[n.slot as usize].unmapped[seg.pool].get(&n.addr) == Some(&cur),
        "unmapped block {cur} at {:#x} missing from its unmapped set",
        n.addr
    );
    Ok(())
}

/// Checks a free block (filed in its stream's free set, no stream uses) and counts it.
fn check_free_block<D: DeviceMemory>(
    alloc: &CachingAllocator<D>,
    seg: &Seg,
    cur: u32,
    walk: &mut Walk,
) -> Result<(), InvariantViolation> {
    let n = &alloc.nodes[cur as usize];
    walk.free += 1;
    let sp = &alloc.pools[n.slot as usize];
    ensure!(
        sp.stream == seg.stream,
        "free block {cur} filed under stream {:?}",
        sp.stream
    );
    ensure!(
        sp.free[seg.pool].get(&fkey(n.size, n.addr)) == Some(&cur),
        "free block {cur} at {:#x} missing from its free set",
        n.addr
    );
    ensure!(
        n.event_count == 0 && !n.has_uses,
        "free block {cur} has stream uses"
    );
    if seg.split && !seg.expandable {
        walk.counts.inactive_split[seg.pool] += 1;
        walk.counts.inactive_split_bytes[seg.pool] += n.size;
    }
    Ok(())
}

/// Checks the allocator's indexes against the walk: every block reached, the free sets, the
/// address map, the stream uses, the pending frees and the reserved total.
fn check_indexes<D: DeviceMemory>(
    alloc: &CachingAllocator<D>,
    walk: &Walk,
) -> Result<(), InvariantViolation> {
    let live = alloc
        .nodes
        .iter()
        .filter(|n| n.state != NodeState::Vacant)
        .count();
    ensure!(
        walk.visited == live,
        "{live} blocks in the slab but {} reachable from segments",
        walk.visited
    );
    let in_unmapped: usize = alloc
        .pools
        .iter()
        .map(|sp| sp.unmapped.iter().map(|m| m.len()).sum::<usize>())
        .sum();
    ensure!(
        in_unmapped == walk.unmapped,
        "unmapped sets hold {in_unmapped} blocks, {} blocks are unmapped",
        walk.unmapped
    );
    let in_sets = alloc.free_entries().count();
    ensure!(
        in_sets == walk.free,
        "free sets hold {in_sets} blocks, {} blocks are free",
        walk.free
    );
    for key in alloc.free_entries() {
        let n = &alloc.nodes[key.idx as usize];
        ensure!(
            n.state == NodeState::Free
                && n.pool == key.pool
                && n.slot == key.slot
                && n.addr == key.addr
                && n.size == key.size,
            "free set entry {key:?} does not describe its block"
        );
    }
    check_live_indexes(alloc, walk)
}

/// Checks the indexes of live blocks against the walk: the address map, the labels, the
/// stream uses, the pending frees, and the reserved total.
fn check_live_indexes<D: DeviceMemory>(
    alloc: &CachingAllocator<D>,
    walk: &Walk,
) -> Result<(), InvariantViolation> {
    let allocated_blocks: u64 = walk.counts.allocation.iter().sum();
    if let Some(m) = &alloc.addr_index {
        ensure!(
            m.len() as u64 == allocated_blocks,
            "address map has {} entries for {allocated_blocks} allocated blocks",
            m.len()
        );
    }
    ensure!(
        alloc.labels.len() == alloc.nodes.len(),
        "{} labels for {} block records",
        alloc.labels.len(),
        alloc.nodes.len()
    );
    for (i, (n, label)) in alloc.nodes.iter().zip(alloc.labels.iter()).enumerate() {
        let live = matches!(n.state, NodeState::Allocated | NodeState::Pending);
        ensure!(
            live || label.is_none(),
            "block {i} in state {:?} keeps a label",
            n.state
        );
    }
    let uses_flags = alloc.nodes.iter().filter(|n| n.has_uses).count();
    ensure!(
        uses_flags == alloc.stream_uses.len(),
        "{uses_flags} blocks flagged with stream uses, {} recorded",
        alloc.stream_uses.len()
    );
    for &idx in alloc.stream_uses.keys() {
        let n = &alloc.nodes[idx as usize];
        ensure!(
            n.has_uses && n.state == NodeState::Allocated,
            "stream uses recorded for block {idx} that is not a live flagged block"
        );
    }
    ensure!(
        walk.pending_events == alloc.pending.len() as u64,
        "{} events on pending blocks, {} queued",
        walk.pending_events,
        alloc.pending.len()
    );
    for &(_, idx) in &alloc.pending {
        ensure!(
            alloc.nodes[idx as usize].state == NodeState::Pending,
            "queued event for non-pending block {idx}"
        );
    }
    ensure!(
        walk.reserved == alloc.reserved,
        "segments sum to {}, reserved is {}",
        walk.reserved,
        alloc.reserved
    );
    Ok(())
}

/// Checks every current statistic against the recount, and every peak against its current.
fn check_stats(st: &MemoryStats, c: &Counts) -> Result<(), InvariantViolation> {
    check_array("allocation", &st.allocation, c.allocation)?;
    check_array("allocated_bytes", &st.allocated_bytes, c.allocated_bytes)?;
    check_array("active", &st.active, c.active)?;
    check_array("active_bytes", &st.active_bytes, c.active_bytes)?;
    check_array("requested_bytes", &st.requested_bytes, c.requested_bytes)?;
    check_array("segment", &st.segment, c.segment)?;
    check_array("reserved_bytes", &st.reserved_bytes, c.reserved_bytes)?;
    check_array("inactive_split", &st.inactive_split, c.inactive_split)?;
    check_array(
        "inactive_split_bytes",
        &st.inactive_split_bytes,
        c.inactive_split_bytes,
    )?;
    ensure!(
        st.oversize_allocations.current as u64 == c.oversize_allocations,
        "oversize_allocations {} vs recount {}",
        st.oversize_allocations.current,
        c.oversize_allocations
    );
    ensure!(
        st.oversize_segments.current as u64 == c.oversize_segments,
        "oversize_segments {} vs recount {}",
        st.oversize_segments.current,
        c.oversize_segments
    );
    check_stat("oversize_allocations", &st.oversize_allocations)?;
    check_stat("oversize_segments", &st.oversize_segments)?;
    Ok(())
}

/// Checks allocated + cached = reserved, and the snapshot's totals against the recount.
fn check_totals<D: DeviceMemory>(
    alloc: &CachingAllocator<D>,
    c: &Counts,
) -> Result<(), InvariantViolation> {
    // allocated + cached = reserved, where cached = pending + free bytes.
    let allocated: u64 = c.allocated_bytes.iter().sum();
    let active: u64 = c.active_bytes.iter().sum();
    let free_bytes: u64 = alloc.free_entries().map(|k| k.size).sum();
    ensure!(
        active + free_bytes == alloc.reserved,
        "active {active} + free {free_bytes} != reserved {}",
        alloc.reserved
    );
    ensure!(
        allocated <= active,
        "allocated {allocated} exceeds active {active}"
    );

    let snap = alloc.snapshot();
    ensure!(
        snap.total_reserved() == alloc.reserved,
        "snapshot reserved {} != {}",
        snap.total_reserved(),
        alloc.reserved
    );
    ensure!(
        snap.total_allocated() == allocated,
        "snapshot allocated {} != {allocated}",
        snap.total_allocated()
    );
    ensure!(
        snap.total_active() == active,
        "snapshot active {} != {active}",
        snap.total_active()
    );
    let non_rel: u64 = c.inactive_split_bytes.iter().sum();
    ensure!(
        snap.non_releasable() == non_rel,
        "snapshot non-releasable {} != {non_rel}",
        snap.non_releasable()
    );
    let figures = alloc.cache_figures();
    let from_snapshot = super::CacheFigures {
        largest_free_block: snap.largest_free_block(),
        non_releasable: snap.non_releasable(),
        releasable: snap
            .segments
            .iter()
            .filter(|s| s.is_free())
            .map(|s| s.total_size)
            .sum(),
    };
    ensure!(
        figures == from_snapshot,
        "cache figures {figures:?} != the snapshot's {from_snapshot:?}"
    );
    for s in &snap.segments {
        let small = s.segment_type == PoolKind::Small;
        ensure!(
            !small || s.is_expandable || s.total_size == crate::size::SMALL_BUFFER,
            "small segment {:#x} of {} bytes",
            s.address,
            s.total_size
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! The checker must catch what it claims to: each test breaks one invariant of a healthy
    //! allocator by hand and expects the violation that names it.

    use super::*;
    use crate::device::SimulatedDevice;
    use crate::stream::StreamId;

    /// An allocator with a split small segment and a large one, one block freed (cached).
    fn healthy() -> CachingAllocator<SimulatedDevice> {
        let mut a = CachingAllocator::new(SimulatedDevice::new(1 << 30));
        let s = StreamId(0);
        let _small = a.malloc(1000, s).expect("small");
        let big = a.malloc(3 << 20, s).expect("large");
        let _kept = a.malloc(5 << 20, s).expect("large");
        a.free(big).expect("free");
        check_invariants(&a).expect("a healthy allocator passes");
        a
    }

    fn violation(a: &CachingAllocator<SimulatedDevice>) -> String {
        match check_invariants(a) {
            Ok(()) => panic!("the broken invariant went unnoticed"),
            Err(InvariantViolation(message)) => message,
        }
    }

    #[test]
    fn a_statistic_that_disagrees_with_the_blocks() {
        let mut a = healthy();
        a.stats.allocated_bytes.all.current += 512;
        assert!(violation(&a).contains("allocated_bytes"));
    }

    #[test]
    fn a_peak_below_its_current_value() {
        let mut a = healthy();
        a.stats.oversize_segments.peak = -1;
        assert!(violation(&a).contains("peak"));
    }

    #[test]
    fn reserved_bytes_that_are_not_the_segments_sum() {
        let mut a = healthy();
        a.reserved += 2 << 20;
        assert!(violation(&a).contains("reserved"));
    }

    #[test]
    fn a_block_that_does_not_tile_its_segment() {
        let mut a = healthy();
        let i = a
            .nodes
            .iter()
            .position(|n| n.state == NodeState::Allocated && n.next != NONE)
            .expect("a split segment's first block");
        a.nodes[i].size += MIN_BLOCK_SIZE;
        assert!(violation(&a).contains("gap or overlap"));
    }

    #[test]
    fn a_free_block_missing_from_its_free_set() {
        let mut a = healthy();
        let i = a
            .nodes
            .iter()
            .position(|n| n.state == NodeState::Free)
            .expect("a free block");
        let n = &a.nodes[i];
        let (slot, pool, key) = (n.slot as usize, pidx(n.pool), fkey(n.size, n.addr));
        a.pools[slot].free[pool].remove(key);
        assert!(violation(&a).contains("missing from its free set"));
    }
}
