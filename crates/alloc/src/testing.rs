//! Property-testing support (cargo feature `proptest`): the invariant checker, operation
//! sequence strategies and a runner that applies operations and checks the allocator's
//! contract after every step. Use them to test code built on the allocator, or a custom
//! [`DeviceMemory`].
//!
//! ```
//! use proptest::prelude::*;
//! use trainmem_alloc::{CachingAllocator, SimulatedDevice};
//! use trainmem_alloc::testing::{ops_strategy, run_ops};
//!
//! proptest!(ProptestConfig::with_cases(8), |(ops in ops_strategy(2, 1..=50))| {
//!     let mut a = CachingAllocator::new(SimulatedDevice::new(96 << 20));
//!     run_ops(&mut a, &ops).map_err(|e| TestCaseError::fail(e.to_string()))?;
//! });
//! ```

use proptest::prelude::*;

use crate::allocator::CachingAllocator;
pub use crate::allocator::invariants::{InvariantViolation, check_invariants};
use crate::block::{Block, BlockId};
use crate::config::{AllocatorConfig, RoundupPower2Divisions};
use crate::device::DeviceMemory;
use crate::error::AllocError;
use crate::size::MIB;
use crate::snapshot::{BlockState, SegmentInfo, Snapshot};
use crate::stream::StreamId;

/// One allocator operation. `pick` selects a live block as `pick % live.len()` (a no-op when
/// nothing is live).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// `malloc(size, stream)`.
    Alloc {
        /// Requested bytes.
        size: u64,
        /// Stream.
        stream: StreamId,
    },
    /// `free(id)` of a live block, then a second `free` that must fail as a double free.
    Free {
        /// Which live block.
        pick: usize,
    },
    /// `free_address(address)` of a live block.
    FreeAddress {
        /// Which live block.
        pick: usize,
    },
    /// `record_stream(id, stream)` on a live block.
    RecordStream {
        /// Which live block.
        pick: usize,
        /// The other stream.
        stream: StreamId,
    },
    /// `synchronize_stream(stream)`.
    SynchronizeStream {
        /// Stream.
        stream: StreamId,
    },
    /// `synchronize()`.
    Synchronize,
    /// `empty_cache()`.
    EmptyCache,
}

/// Request sizes mixing every rule's range: sub-512 B, small pool, 1–10 MiB (20 MiB
/// segments), and large requests up to 48 MiB.
pub fn size_strategy() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => 1u64..=4096,
        3 => 4097u64..=MIB,
        3 => (MIB + 1)..=(10 * MIB),
        2 => (10 * MIB)..=(48 * MIB),
    ]
}

/// One operation on streams `0..streams` (at least 1).
pub fn op_strategy(streams: u64) -> impl Strategy<Value = Op> {
    let streams = streams.max(1);
    let stream = (0..streams).prop_map(StreamId);
    prop_oneof![
        8 => (size_strategy(), stream.clone()).prop_map(|(size, stream)| Op::Alloc { size, stream }),
        5 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        1 => any::<usize>().prop_map(|pick| Op::FreeAddress { pick }),
        1 => (any::<usize>(), stream.clone()).prop_map(|(pick, stream)| Op::RecordStream { pick, stream }),
        1 => stream.prop_map(|stream| Op::SynchronizeStream { stream }),
        1 => Just(Op::Synchronize),
        1 => Just(Op::EmptyCache),
    ]
}

/// A sequence of operations whose length lies in `len`.
pub fn ops_strategy(
    streams: u64,
    len: std::ops::RangeInclusive<usize>,
) -> impl Strategy<Value = Vec<Op>> {
    proptest::collection::vec(op_strategy(streams), len)
}

/// Configurations exercising the knobs: optional `max_split_size_mb` (20–40), optional
/// uniform `roundup_power2_divisions` (2, 4 or 8), and expandable segments on in one case in
/// three.
pub fn config_strategy() -> impl Strategy<Value = AllocatorConfig> {
    (
        whole_segment_config_strategy(),
        proptest::bool::weighted(1.0 / 3.0),
    )
        .prop_map(|(c, expandable)| c.with_expandable_segments(expandable))
}

/// [`config_strategy`] without expandable segments (every segment allocated whole, as
/// [`CachingAllocator::from_state`] builds them).
pub fn whole_segment_config_strategy() -> impl Strategy<Value = AllocatorConfig> {
    (
        proptest::option::of(20u64..=40),
        prop_oneof![Just(0u64), Just(2), Just(4), Just(8)],
    )
        .prop_map(|(split, div)| {
            let mut c = AllocatorConfig::default()
                .with_roundup_power2_divisions(RoundupPower2Divisions::uniform(div));
            if let Some(mb) = split {
                c = c
                    .with_max_split_size_mb(mb)
                    .expect("strategy only produces values >= 20");
            }
            c
        })
}

fn fail(msg: String) -> InvariantViolation {
    InvariantViolation(msg)
}

/// After an out-of-memory error, a mapped range of an expandable segment lies inside one
/// that existed before (the flush only unmaps pages), holds an active block and no pending
/// free.
fn check_expandable_after_oom(
    before: &Snapshot,
    seg: &SegmentInfo,
) -> Result<(), InvariantViolation> {
    let end = seg.address + seg.total_size;
    let inside = before.segments.iter().any(|old| {
        old.is_expandable
            && old.stream == seg.stream
            && old.address <= seg.address
            && end <= old.address + old.total_size
    });
    if !inside {
        return Err(fail(format!(
            "out-of-memory left mapped range {:#x}..{end:#x} that was not mapped before",
            seg.address
        )));
    }
    if seg.is_free() {
        return Err(fail(format!(
            "fully free mapped range {:#x} survived the out-of-memory flush",
            seg.address
        )));
    }
    if seg
        .blocks
        .iter()
        .any(|b| b.state == BlockState::ActivePendingFree)
    {
        return Err(fail("pending free survived the out-of-memory flush".into()));
    }
    Ok(())
}

/// Allocated blocks of a snapshot as (address, size, requested size), in address order.
fn allocated_blocks(s: &Snapshot) -> Vec<(u64, u64, u64)> {
    s.segments
        .iter()
        .flat_map(|seg| seg.blocks.iter())
        .filter(|b| b.state == BlockState::ActiveAllocated)
        .map(|b| (b.address, b.size, b.requested_size))
        .collect()
}

/// Applies [`Op`]s to an allocator, tracking the live blocks, and checks after each step
/// [`check_invariants`] plus the contract of the operation:
///
/// * a successful allocation fits its request and lies inside a segment of its stream;
/// * an out-of-memory error changes no live block, adds no segment, leaves no fully free
///   segment and no pending free behind (the ladder flushed them), keeps every segment that
///   had no pending free block exactly as it was, and counts one `num_ooms`;
/// * `empty_cache` keeps every live block, leaves no fully free segment, and reports exactly
///   the bytes by which reserved memory fell;
/// * freeing twice is a [`AllocError::DoubleFree`] that changes no statistic.
#[derive(Debug, Default)]
pub struct OpRunner {
    live: Vec<Block>,
    /// Number of out-of-memory errors seen.
    pub ooms: usize,
}

impl OpRunner {
    /// A runner with no live blocks.
    pub fn new() -> Self {
        Self::default()
    }

    /// Blocks allocated through this runner and not yet freed.
    pub fn live(&self) -> &[Block] {
        &self.live
    }

    fn pick(&self, pick: usize) -> Option<usize> {
        (!self.live.is_empty()).then(|| pick % self.live.len())
    }

    /// Applies one operation and checks the allocator afterwards.
    pub fn apply<D: DeviceMemory>(
        &mut self,
        alloc: &mut CachingAllocator<D>,
        op: &Op,
    ) -> Result<(), InvariantViolation> {
        match *op {
            Op::Alloc { size, stream } => {
                let before = alloc.snapshot();
                let stats_before = alloc.stats().clone();
                match alloc.malloc(size, stream) {
                    Ok(b) => {
                        if b.size < size || !b.size.is_multiple_of(512) || b.stream != stream {
                            return Err(fail(format!("alloc({size}) returned {b:?}")));
                        }
                        let snap = alloc.snapshot();
                        let inside = snap.segments.iter().any(|s| {
                            s.stream == stream
                                && b.address >= s.address
                                && b.address + b.size <= s.address + s.total_size
                        });
                        if !inside {
                            return Err(fail(format!(
                                "{b:?} is not inside a segment of its stream"
                            )));
                        }
                        self.live.push(b);
                    }
                    Err(AllocError::OutOfMemory(oom)) => {
                        self.ooms += 1;
                        let after = alloc.snapshot();
                        let st = alloc.stats();
                        if allocated_blocks(&before) != allocated_blocks(&after) {
                            return Err(fail("out-of-memory changed the live blocks".into()));
                        }
                        if st.num_ooms != stats_before.num_ooms + 1 {
                            return Err(fail("num_ooms not incremented by one".into()));
                        }
                        if st.allocated_bytes.all.current
                            != stats_before.allocated_bytes.all.current
                            || st.allocation.all.current != stats_before.allocation.all.current
                        {
                            return Err(fail("out-of-memory changed allocation stats".into()));
                        }
                        for seg in &after.segments {
                            if seg.is_expandable {
                                check_expandable_after_oom(&before, seg)?;
                                continue;
                            }
                            let Some(old) =
                                before.segments.iter().find(|s| s.address == seg.address)
                            else {
                                return Err(fail(format!(
                                    "out-of-memory left a new segment {:#x}",
                                    seg.address
                                )));
                            };
                            if seg.is_free() {
                                return Err(fail(format!(
                                    "fully free segment {:#x} survived the out-of-memory flush",
                                    seg.address
                                )));
                            }
                            let had_pending = old
                                .blocks
                                .iter()
                                .any(|b| b.state == BlockState::ActivePendingFree);
                            if !had_pending && old != seg {
                                return Err(fail(format!(
                                    "out-of-memory changed segment {:#x}",
                                    seg.address
                                )));
                            }
                            if seg
                                .blocks
                                .iter()
                                .any(|b| b.state == BlockState::ActivePendingFree)
                            {
                                return Err(fail(
                                    "pending free survived the out-of-memory flush".into(),
                                ));
                            }
                        }
                        if oom.allocated != st.allocated_bytes.all.current as u64
                            || oom.reserved != alloc.memory_reserved()
                        {
                            return Err(fail(format!(
                                "out-of-memory report disagrees with stats: {oom:?}"
                            )));
                        }
                    }
                    Err(e) => return Err(fail(format!("alloc({size}) failed unexpectedly: {e}"))),
                }
            }
            Op::Free { pick } | Op::FreeAddress { pick } => {
                let Some(i) = self.pick(pick) else {
                    return check_invariants(alloc);
                };
                let b = self.live.swap_remove(i);
                let r = if matches!(op, Op::Free { .. }) {
                    alloc.free(b.id)
                } else {
                    alloc.free_address(b.address)
                };
                r.map_err(|e| fail(format!("free of live {b:?} failed: {e}")))?;
                let stats = alloc.memory_stats();
                match alloc.free(b.id) {
                    Err(AllocError::DoubleFree { .. }) => {}
                    other => return Err(fail(format!("second free of {b:?} gave {other:?}"))),
                }
                if alloc.memory_stats() != stats {
                    return Err(fail("a rejected double free changed the statistics".into()));
                }
            }
            Op::RecordStream { pick, stream } => {
                if let Some(i) = self.pick(pick) {
                    let id: BlockId = self.live[i].id;
                    alloc
                        .record_stream(id, stream)
                        .map_err(|e| fail(format!("record_stream failed: {e}")))?;
                }
            }
            Op::SynchronizeStream { stream } => {
                alloc.synchronize_stream(stream);
            }
            Op::Synchronize => {
                alloc.synchronize();
            }
            Op::EmptyCache => {
                let before = alloc.snapshot();
                let reserved_before = alloc.memory_reserved();
                let released = alloc
                    .empty_cache()
                    .map_err(|e| fail(format!("empty_cache failed: {e}")))?;
                let after = alloc.snapshot();
                if allocated_blocks(&before) != allocated_blocks(&after) {
                    return Err(fail("empty_cache changed the live blocks".into()));
                }
                if after.segments.iter().any(|s| s.is_free()) {
                    return Err(fail("empty_cache left a fully free segment".into()));
                }
                if released.bytes != reserved_before - alloc.memory_reserved() {
                    return Err(fail(format!(
                        "empty_cache reported {released:?}, reserved fell by {}",
                        reserved_before - alloc.memory_reserved()
                    )));
                }
                if alloc.pending_frees() != 0 {
                    return Err(fail("empty_cache left pending frees".into()));
                }
            }
        }
        check_invariants(alloc)
    }

    /// Frees every live block, synchronizes and empties the cache; checks that reserved
    /// memory is then 0 and every statistic's current value is 0.
    pub fn finish<D: DeviceMemory>(
        &mut self,
        alloc: &mut CachingAllocator<D>,
    ) -> Result<(), InvariantViolation> {
        for b in self.live.drain(..) {
            alloc
                .free(b.id)
                .map_err(|e| fail(format!("final free of {b:?} failed: {e}")))?;
        }
        alloc
            .empty_cache()
            .map_err(|e| fail(format!("final empty_cache failed: {e}")))?;
        check_invariants(alloc)?;
        if alloc.memory_reserved() != 0 || alloc.segment_count() != 0 {
            return Err(fail(format!(
                "{} bytes still reserved after freeing everything",
                alloc.memory_reserved()
            )));
        }
        let nonzero: Vec<(String, i64)> = alloc
            .memory_stats()
            .into_iter()
            .filter(|(k, v)| k.ends_with(".current") && *v != 0)
            .collect();
        if !nonzero.is_empty() {
            return Err(fail(format!(
                "current stats not zero at the end: {nonzero:?}"
            )));
        }
        Ok(())
    }
}

/// Applies `ops` with an [`OpRunner`] (checking after every step), then frees everything and
/// checks that the allocator returns to zero.
pub fn run_ops<D: DeviceMemory>(
    alloc: &mut CachingAllocator<D>,
    ops: &[Op],
) -> Result<OpRunner, InvariantViolation> {
    let mut r = OpRunner::new();
    for (i, op) in ops.iter().enumerate() {
        r.apply(alloc, op)
            .map_err(|e| InvariantViolation(format!("step {i} ({op:?}): {}", e.0)))?;
    }
    r.finish(alloc)?;
    Ok(r)
}
