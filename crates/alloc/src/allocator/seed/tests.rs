//! Seeding: a seeded allocator is the allocator that reached the same state by allocating,
//! and a state the allocator cannot be in is refused with an error naming what is wrong.

use proptest::prelude::*;

use super::*;
use crate::device::SimulatedDevice;
use crate::host::HostDevice;
use crate::size::MIB;
use crate::testing::{Op, check_invariants, op_strategy, whole_segment_config_strategy};

const S0: StreamId = StreamId(0);
const S1: StreamId = StreamId(1);

fn currents(a: &CachingAllocator<SimulatedDevice>) -> Vec<(String, i64)> {
    a.memory_stats()
        .into_iter()
        .filter(|(k, _)| k.ends_with(".current"))
        .collect()
}

/// `a`'s state seeded into a new allocator on a device that hands out the same next
/// address, with the seeded live blocks.
fn reseed(
    a: &CachingAllocator<SimulatedDevice>,
) -> (CachingAllocator<SimulatedDevice>, Vec<Block>) {
    let device =
        SimulatedDevice::new(a.device().capacity()).with_base_address(a.device().next_address());
    let state = SeedState::from_snapshot(&a.snapshot());
    CachingAllocator::from_state(device, a.config().clone(), &state).expect("a reachable state")
}

#[test]
fn a_seeded_allocator_continues_like_the_one_that_allocated() {
    let mut a = CachingAllocator::new(SimulatedDevice::new(1 << 30));
    let small = a.malloc(1000, S0).unwrap();
    let mid = a.malloc(3 * MIB, S0).unwrap();
    let _kept = a.malloc(5 * MIB, S0).unwrap();
    let _other = a.malloc(12 * MIB, S1).unwrap();
    a.free(mid).unwrap();
    let (mut b, live) = reseed(&a);
    check_invariants(&b).unwrap();
    // 1024 B + 5 MiB + 12 MiB allocated in 2 + 20 + 12 MiB of segments, 2 MiB - 1024 B and
    // 20 - 5 MiB cached inside split segments.
    assert_eq!(b.memory_allocated(), 1024 + 5 * MIB + 12 * MIB);
    assert_eq!(b.memory_reserved(), 34 * MIB);
    assert_eq!(
        b.stats().inactive_split_bytes.all.current as u64,
        2 * MIB - 1024 + 15 * MIB
    );
    assert_eq!(b.stats().num_device_alloc, 0);
    assert_eq!(b.max_memory_reserved(), 34 * MIB);
    assert_eq!(currents(&a), currents(&b));
    assert_eq!(a.snapshot().segments, b.snapshot().segments);
    assert_eq!(live.len(), 3);
    assert_eq!(live[0].address, small.address);
    // The same requests land on the same addresses: 2 MiB reuses the cached front of the
    // 20 MiB segment, 7 MiB needs a new segment.
    for (size, stream) in [(2 * MIB, S0), (7 * MIB, S0), (100, S0), (12 * MIB, S1)] {
        let x = a.malloc(size, stream).unwrap();
        let y = b.malloc(size, stream).unwrap();
        assert_eq!((x.address, x.size), (y.address, y.size), "malloc({size})");
    }
    b.free(live[0]).unwrap();
    a.free(small).unwrap();
    assert_eq!(a.snapshot().segments, b.snapshot().segments);
    assert_eq!(currents(&a), currents(&b));
}

fn seg(address: u64, size: u64, blocks: Vec<SeedBlock>) -> SeedSegment {
    SeedSegment {
        address,
        size,
        stream: S0,
        pool: if size == SMALL_BUFFER {
            PoolKind::Small
        } else {
            PoolKind::Large
        },
        blocks,
    }
}

fn seed_err(segments: Vec<SeedSegment>) -> SeedError {
    let state = SeedState { segments };
    match CachingAllocator::from_state(
        SimulatedDevice::new(1 << 30),
        AllocatorConfig::default(),
        &state,
    ) {
        Ok(_) => panic!("an impossible state was accepted"),
        Err(e) => e,
    }
}

#[test]
fn impossible_states_are_refused_with_what_is_wrong() {
    let base = 0x1000_0000;
    let gap = seed_err(vec![seg(
        base,
        20 * MIB,
        vec![
            SeedBlock::allocated(base, 4 * MIB, 4 * MIB),
            SeedBlock::free(base + 5 * MIB, 15 * MIB),
        ],
    )]);
    assert_eq!(
        gap,
        SeedError::Tiling {
            segment: base,
            address: base + 5 * MIB,
            expected: base + 4 * MIB
        }
    );
    let short = seed_err(vec![seg(
        base,
        20 * MIB,
        vec![SeedBlock::allocated(base, 4 * MIB, 1)],
    )]);
    assert!(
        matches!(short, SeedError::Tiling { address, .. } if address == base + 4 * MIB),
        "{short}"
    );
    let frees = seed_err(vec![seg(
        base,
        20 * MIB,
        vec![
            SeedBlock::free(base, 4 * MIB),
            SeedBlock::free(base + 4 * MIB, 16 * MIB),
        ],
    )]);
    assert!(
        frees.to_string().contains("two neighbouring free blocks"),
        "{frees}"
    );
    let requested = seed_err(vec![seg(
        base,
        20 * MIB,
        vec![SeedBlock::allocated(base, 20 * MIB, 21 * MIB)],
    )]);
    assert!(
        requested.to_string().contains("outside 1..="),
        "{requested}"
    );
    let odd = seed_err(vec![seg(
        base,
        20 * MIB,
        vec![
            SeedBlock::allocated(base, 1000, 1000),
            SeedBlock::free(base + 1000, 20 * MIB - 1000),
        ],
    )]);
    assert!(odd.to_string().contains("multiple of 512"), "{odd}");
    let mut small = seg(base, 4 * MIB, vec![SeedBlock::free(base, 4 * MIB)]);
    small.pool = PoolKind::Small;
    assert!(
        seed_err(vec![small])
            .to_string()
            .contains("small-pool segment must be 2 MiB")
    );
    let overlap = seed_err(vec![
        seg(base, 20 * MIB, vec![SeedBlock::free(base, 20 * MIB)]),
        seg(
            base + 10 * MIB,
            20 * MIB,
            vec![SeedBlock::free(base + 10 * MIB, 20 * MIB)],
        ),
    ]);
    assert_eq!(
        overlap,
        SeedError::Overlap {
            first: base,
            second: base + 10 * MIB
        }
    );
    let empty = seed_err(vec![seg(base, 20 * MIB, vec![])]);
    assert!(empty.to_string().contains("no blocks"), "{empty}");
}

#[test]
fn a_device_that_cannot_take_over_ranges_is_an_error() {
    let state = SeedState {
        segments: vec![seg(
            0x1000_0000,
            20 * MIB,
            vec![SeedBlock::free(0x1000_0000, 20 * MIB)],
        )],
    };
    let err = CachingAllocator::from_state(
        HostDevice::new(64 * MIB),
        AllocatorConfig::default(),
        &state,
    )
    .expect_err("host memory cannot be adopted");
    assert!(matches!(err, SeedError::Device { .. }), "{err}");
    let full = CachingAllocator::from_state(
        SimulatedDevice::new(10 * MIB),
        AllocatorConfig::default(),
        &state,
    )
    .expect_err("20 MiB does not fit on 10 MiB");
    assert!(full.to_string().contains("out of memory"), "{full}");
}

/// Applies `op` to `a`, keeping `live` (address order not kept).
fn apply(a: &mut CachingAllocator<SimulatedDevice>, live: &mut Vec<Block>, op: &Op) {
    match *op {
        Op::Alloc { size, stream } => {
            if let Ok(b) = a.malloc(size, stream) {
                live.push(b);
            }
        }
        Op::Free { pick } | Op::FreeAddress { pick } if !live.is_empty() => {
            let b = live.swap_remove(pick % live.len());
            a.free(b).expect("live");
        }
        Op::EmptyCache => {
            a.empty_cache().expect("simulated devices free");
        }
        _ => {}
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(10_000))]

    /// Any state reached by allocating, freeing and emptying the cache on two streams seeds
    /// an allocator that passes every invariant, and the two then answer the same requests
    /// with the same blocks, run out of memory at the same requests and end in the same state.
    #[test]
    fn seeding_any_reached_state_gives_the_same_allocator(
        cfg in whole_segment_config_strategy(),
        prefix in proptest::collection::vec(op_strategy(2), 0..40),
        suffix in proptest::collection::vec(op_strategy(2), 0..40),
    ) {
        let mut a = CachingAllocator::with_config(SimulatedDevice::new(160 * MIB), cfg);
        let mut live_a = Vec::new();
        for op in &prefix {
            apply(&mut a, &mut live_a, op);
        }
        live_a.sort_by_key(|b| b.address);
        let (mut b, mut live_b) = reseed(&a);
        check_invariants(&b).map_err(|e| TestCaseError::fail(e.0))?;
        prop_assert_eq!(currents(&a), currents(&b));
        prop_assert_eq!(
            live_a.iter().map(|x| (x.address, x.size)).collect::<Vec<_>>(),
            live_b.iter().map(|x| (x.address, x.size)).collect::<Vec<_>>()
        );
        for op in &suffix {
            match *op {
                Op::Alloc { size, stream } => {
                    let (x, y) = (a.malloc(size, stream), b.malloc(size, stream));
                    prop_assert_eq!(x.is_ok(), y.is_ok(), "malloc({}) on one only", size);
                    if let (Ok(x), Ok(y)) = (x, y) {
                        prop_assert_eq!((x.address, x.size), (y.address, y.size));
                        live_a.push(x);
                        live_b.push(y);
                    }
                }
                Op::Free { pick } | Op::FreeAddress { pick } if !live_a.is_empty() => {
                    let i = pick % live_a.len();
                    a.free(live_a.swap_remove(i)).expect("live");
                    b.free(live_b.swap_remove(i)).expect("live");
                }
                Op::EmptyCache => {
                    prop_assert_eq!(a.empty_cache().expect("frees"), b.empty_cache().expect("frees"));
                }
                _ => {}
            }
        }
        check_invariants(&b).map_err(|e| TestCaseError::fail(e.0))?;
        prop_assert_eq!(currents(&a), currents(&b));
        prop_assert_eq!(a.snapshot().segments, b.snapshot().segments);
    }
}
