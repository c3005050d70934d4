//! Expandable segments: page arithmetic worked out by hand on a fragmentation-heavy trace.

use super::*;
use crate::device::SimulatedDevice;
use crate::size::MIB;
use crate::testing::check_invariants;

const S0: StreamId = StreamId(0);
/// Where the simulated device starts handing out addresses (the segment's base).
const BASE: u64 = 1 << 32;

fn alloc(expandable: bool) -> CachingAllocator<SimulatedDevice> {
    let device = SimulatedDevice::new(1 << 30).with_base_address(BASE);
    let cfg = AllocatorConfig::default().with_expandable_segments(expandable);
    CachingAllocator::with_config(device, cfg)
}

/// The growing-batch pattern: each iteration allocates four tensors a little larger than the
/// iteration before, then frees them.
fn grow(a: &mut CachingAllocator<SimulatedDevice>) -> Vec<Vec<Block>> {
    let mut iterations = Vec::new();
    for mb in [12, 14, 16] {
        let blocks: Vec<Block> = (0..4).map(|_| a.malloc(mb * MIB, S0).unwrap()).collect();
        check_invariants(a).unwrap();
        for b in &blocks {
            a.free(*b).unwrap();
        }
        check_invariants(a).unwrap();
        iterations.push(blocks);
    }
    iterations
}

#[test]
fn growing_requests_fragment_whole_segments() {
    // Without expandable segments every request of 10 MiB or more gets a segment of its own
    // (rounded to 2 MiB): 4 × 12 + 4 × 14 + 4 × 16 = 168 MiB in 12 segments, since a cached
    // 12 MiB segment cannot serve 14 MiB and a 14 MiB one cannot serve 16 MiB.
    let mut a = alloc(false);
    grow(&mut a);
    assert_eq!(a.max_memory_reserved(), 168 * MIB);
    assert_eq!(a.max_memory_allocated(), 64 * MIB);
    assert_eq!(a.stats().num_device_alloc, 12);
    assert_eq!(a.empty_cache().unwrap().segments, 12);
    assert_eq!(a.stats().num_device_free, 12);
}

#[test]
fn growing_requests_tile_one_expandable_segment() {
    let mut a = alloc(true);
    a.enable_trace(None);
    let it = grow(&mut a);
    let at = |mb: u64| BASE + mb * MIB;
    // The large pool maps pages of 20 MiB. Iteration 1 (12 MiB × 4):
    //   A1: nothing cached; map page [0, 20); A1 = [0, 12), free [12, 20).
    //   A2: 8 MiB free < 12; the free block before the unmapped space has room: map one more
    //       page [20, 40), merged free [12, 40); A2 = [12, 24), free [24, 40).
    //   A3: fits the 16 MiB free block: [24, 36), free [36, 40).
    //   A4: map page [40, 60), merged free [36, 60); A4 = [36, 48), free [48, 60).
    let addrs = |i: usize| it[i].iter().map(|b| b.address).collect::<Vec<_>>();
    assert_eq!(addrs(0), vec![at(0), at(12), at(24), at(36)]);
    // Freeing all four merges everything into one free block [0, 60); iteration 2 (14 MiB ×
    // 4 = 56 MiB) tiles it without mapping anything: [0, 14), [14, 28), [28, 42), [42, 56).
    assert_eq!(addrs(1), vec![at(0), at(14), at(28), at(42)]);
    // Iteration 3 (16 MiB × 4 = 64 MiB): three fit in [0, 48); the fourth finds 12 MiB free
    // at [48, 60) before the unmapped space, maps page [60, 80) and takes [48, 64).
    assert_eq!(addrs(2), vec![at(0), at(16), at(32), at(48)]);
    // Peak reserved: 4 pages = 80 MiB (against 168 MiB without), in 4 mappings.
    assert_eq!(a.max_memory_reserved(), 80 * MIB);
    assert_eq!(a.max_memory_allocated(), 64 * MIB);
    assert_eq!(a.memory_reserved(), 80 * MIB);
    assert_eq!(a.stats().num_device_alloc, 4);
    // Expandable segments count in neither the segment nor the inactive-split statistics.
    assert_eq!(a.stats().segment.all.current, 0);
    assert_eq!(a.stats().inactive_split.all.current, 0);
    // Everything is free: one free block [0, 80). The snapshot shows the mapped range.
    let snap = a.snapshot();
    assert_eq!(snap.segments.len(), 1);
    let s = &snap.segments[0];
    assert!(s.is_expandable && s.segment_type == PoolKind::Large);
    assert_eq!(
        (s.address, s.total_size, s.blocks.len()),
        (at(0), 80 * MIB, 1)
    );
    assert!(
        snap.allocator_settings
            .as_ref()
            .unwrap()
            .expandable_segments
    );
    let maps: Vec<(u64, u64)> = a
        .trace()
        .iter()
        .filter(|e| e.action == TraceAction::SegmentMap)
        .map(|e| (e.addr, e.size))
        .collect();
    let page = 20 * MIB;
    assert_eq!(
        maps,
        vec![
            (at(0), page),
            (at(20), page),
            (at(40), page),
            (at(60), page)
        ]
    );
    // empty_cache unmaps the four pages in one call and, nothing being mapped any more,
    // gives the address range back.
    let released = a.empty_cache().unwrap();
    assert_eq!(released.bytes, 80 * MIB);
    assert_eq!(released.segments, 1);
    assert_eq!(a.memory_reserved(), 0);
    assert_eq!(a.stats().num_device_free, 1);
    assert_eq!(a.segment_count(), 0);
    assert_eq!(a.device().used_bytes(), 0);
    assert_eq!(a.device().reserved_spaces(), 0);
    check_invariants(&a).unwrap();
}

#[test]
fn empty_cache_unmaps_whole_free_pages_and_the_hole_is_filled_first() {
    let mut a = alloc(true);
    let at = |mb: u64| BASE + mb * MIB;
    // Map four pages [0, 80) and free them: one free block [0, 80).
    let x = a.malloc(80 * MIB, S0).unwrap();
    a.free(x).unwrap();
    // 30 + 30 MiB tile it: L1 = [0, 30), L2 = [30, 60), free [60, 80).
    let l1 = a.malloc(30 * MIB, S0).unwrap();
    let l2 = a.malloc(30 * MIB, S0).unwrap();
    assert_eq!((l1.address, l2.address), (at(0), at(30)));
    a.free(l1).unwrap();
    // Free blocks [0, 30) and [60, 80). empty_cache unmaps the whole pages inside them:
    // [0, 20) (the 10 MiB [20, 30) shares its page with L2 and stays) and [60, 80).
    let released = a.empty_cache().unwrap();
    assert_eq!((released.bytes, released.segments), (40 * MIB, 0));
    assert_eq!(a.memory_reserved(), 40 * MIB);
    assert_eq!(a.stats().num_device_free, 2);
    check_invariants(&a).unwrap();
    // The mapped range left: [20, 60) = free [20, 30) + L2 [30, 60).
    let snap = a.snapshot();
    assert_eq!(snap.segments.len(), 1);
    let s = &snap.segments[0];
    assert_eq!((s.address, s.total_size), (at(20), 40 * MIB));
    let blocks: Vec<(u64, u64)> = s.blocks.iter().map(|b| (b.address, b.size)).collect();
    assert_eq!(blocks, vec![(at(20), 10 * MIB), (at(30), 30 * MIB)]);
    assert_eq!(s.allocated_size, 30 * MIB);
    // 25 MiB fits no free block (10 MiB). The lowest place with room is the unmapped hole
    // [0, 20) with the free [20, 30) after it: map page [0, 20), merged free [0, 30), and the
    // request takes [0, 25), leaving 5 MiB free at [25, 30) (any remainder of 512 B or more
    // is split off with expandable segments on).
    let y = a.malloc(25 * MIB, S0).unwrap();
    assert_eq!((y.address, y.size), (at(0), 25 * MIB));
    assert_eq!(a.memory_reserved(), 60 * MIB);
    // Two mappings in all: the four pages for 80 MiB in one call, then this page.
    assert_eq!(a.stats().num_device_alloc, 2);
    assert_eq!(a.largest_free_block(), 5 * MIB);
    check_invariants(&a).unwrap();
    // The small pool has a segment of its own, mapped 2 MiB at a time: 3 MiB of 1 MiB
    // requests need two pages.
    let smalls: Vec<Block> = (0..3).map(|_| a.malloc(MIB, S0).unwrap()).collect();
    assert_eq!(a.memory_reserved(), 64 * MIB);
    assert_eq!(a.stats().reserved_bytes.small_pool.current as u64, 4 * MIB);
    for b in smalls.into_iter().chain([y, l2]) {
        a.free(b).unwrap();
    }
    a.empty_cache().unwrap();
    assert_eq!(a.memory_reserved(), 0);
    assert_eq!(a.segment_count(), 0);
    check_invariants(&a).unwrap();
}

#[test]
fn best_fit_keeps_the_growing_end_for_requests_that_need_it() {
    let mut a = alloc(true);
    let at = |mb: u64| BASE + mb * MIB;
    // Page [0, 20): A = [0, 10), B = [10, 12), free [12, 20) (8 MiB, unmapped space after it).
    let x = a.malloc(10 * MIB, S0).unwrap();
    let b = a.malloc(2 * MIB, S0).unwrap();
    assert_eq!(b.address, at(10));
    // Free A: free blocks [0, 10) (10 MiB) and [12, 20) (8 MiB, could grow to the whole
    // address range).
    a.free(x).unwrap();
    // 6 MiB: by (size, address) the best fit is the 8 MiB block at the growing end, but the
    // next block by size could grow to less (10 MiB < 8 MiB + unmapped), so it is taken.
    let y = a.malloc(6 * MIB, S0).unwrap();
    assert_eq!(y.address, at(0));
    // Without expandable segments the same requests take the 8 MiB block... of a 20 MiB
    // segment too, but by plain best fit.
    let mut plain = alloc(false);
    let px = plain.malloc(3 * MIB, S0).unwrap();
    let pb = plain.malloc(2 * MIB, S0).unwrap();
    plain.free(px).unwrap();
    // Free [0, 3) and [5, 20) in one 20 MiB segment; 2.5 MiB takes [0, 3) by best fit.
    let py = plain.malloc(2 * MIB + MIB / 2, S0).unwrap();
    assert_eq!(py.address, pb.address - 3 * MIB);
    for blk in [b, y] {
        a.free(blk).unwrap();
    }
    check_invariants(&a).unwrap();
}
