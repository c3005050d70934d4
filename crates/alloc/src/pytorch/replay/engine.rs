//! The replay engine: applies [`Op`]s one at a time to a [`CachingAllocator`] over any
//! [`DeviceMemory`], keeping the counts a replay report needs, the out-of-memory events (the
//! replay goes on after one) and the live bytes per label. The allocator can be read between
//! ops (statistics, snapshots), so a caller can sample it wherever its trace has a boundary.

use std::collections::BTreeMap;

use serde::Serialize;

use super::error::ReplayError;
use super::op::{Op, Origin};
use crate::allocator::{CachingAllocator, ReleasedMemory};
use crate::block::{Block, BlockId};
use crate::config::AllocatorConfig;
use crate::device::{DeviceMemory, SimulatedDevice};
use crate::error::AllocError;
use crate::fast_hash::{FastMap, FastSet};
use crate::label::Label;
use crate::stream::StreamId;

/// What to do with a `free` of an id that is not live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UnknownFree {
    /// Stop with [`ReplayError::FreeOfUnknownId`] (a hand-written trace is wrong).
    #[default]
    Error,
    /// Count it in [`Counts::frees_of_unknown_ids`] and go on (a recorded trace that started
    /// after the block was allocated, or that did not see its allocation).
    Skip,
}

/// What to do with an `alloc` of an id that is still live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LiveIdAlloc {
    /// Stop with [`ReplayError::AllocOfLiveId`].
    #[default]
    Error,
    /// Allocate, and let the id name the new block; the old block stays allocated and can no
    /// longer be freed (its free was never seen). Counted in [`Counts::orphaned_blocks`].
    Orphan,
}

/// How strict a replay is about ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReplayPolicy {
    /// Frees of ids that are not live.
    pub unknown_free: UnknownFree,
    /// Allocs of ids that are still live.
    pub live_id_alloc: LiveIdAlloc,
}

impl ReplayPolicy {
    /// Every id mistake is an error (the default; for traces written by hand or by tools).
    pub const STRICT: ReplayPolicy = ReplayPolicy {
        unknown_free: UnknownFree::Error,
        live_id_alloc: LiveIdAlloc::Error,
    };
    /// For recorded event streams that may miss events: unknown frees are skipped and a
    /// re-used live id orphans the old block.
    pub const RECORDED: ReplayPolicy = ReplayPolicy {
        unknown_free: UnknownFree::Skip,
        live_id_alloc: LiveIdAlloc::Orphan,
    };
}

/// An allocation that ran out of memory; the replay went on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OomEvent {
    /// Where the op is in the trace (`line 12`, `device_traces[0] entry 40`).
    pub at: String,
    /// Line number for JSON-lines traces.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<u64>,
    /// The block's id in the trace.
    pub id: u64,
    /// Requested bytes.
    pub size: u64,
    /// The allocator's out-of-memory message.
    pub message: String,
}

fn is_zero(x: &u64) -> bool {
    *x == 0
}

/// Counts of what was replayed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// Ops applied.
    pub ops: u64,
    /// `alloc` ops (including those that ran out of memory).
    pub allocs: u64,
    /// `free` ops applied to live blocks.
    pub frees: u64,
    /// `free` ops of blocks whose `alloc` ran out of memory (nothing to free; skipped).
    pub frees_of_failed_allocs: u64,
    /// `free` ops of ids that were not live, skipped under [`UnknownFree::Skip`].
    #[serde(skip_serializing_if = "is_zero")]
    pub frees_of_unknown_ids: u64,
    /// Blocks left allocated because their id was re-used while live
    /// ([`LiveIdAlloc::Orphan`]).
    #[serde(skip_serializing_if = "is_zero")]
    pub orphaned_blocks: u64,
    /// `empty_cache` ops.
    pub empty_cache_calls: u64,
    /// Bytes `empty_cache` ops returned to the device.
    pub empty_cache_released_bytes: u64,
    /// Blocks still live when the trace ended.
    pub live_at_end: u64,
}

/// What one op did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// The block was allocated.
    Allocated(Block),
    /// The allocation ran out of memory (recorded in [`Replayer::ooms`]).
    OutOfMemory,
    /// The block was freed; its rounded size.
    Freed {
        /// Bytes the block held (after rounding).
        size: u64,
    },
    /// A free with nothing to free (its alloc ran out of memory, or an unknown id skipped).
    Skipped,
    /// `empty_cache` released this much.
    Released(ReleasedMemory),
}

struct LiveBlock {
    id: BlockId,
    size: u64,
    label: Option<Label>,
}

/// A replay in progress: a caching allocator and the trace's live ids.
pub struct Replayer<D: DeviceMemory> {
    alloc: CachingAllocator<D>,
    policy: ReplayPolicy,
    live: FastMap<u64, LiveBlock>,
    failed: FastSet<u64>,
    label_bytes: BTreeMap<String, u64>,
    counts: Counts,
    ooms: Vec<OomEvent>,
}

impl Replayer<SimulatedDevice> {
    /// A fresh allocator with `config` on a simulated device of `capacity` bytes, strict
    /// policy.
    pub fn simulated(capacity: u64, config: AllocatorConfig) -> Self {
        Replayer::new(CachingAllocator::with_config(
            SimulatedDevice::new(capacity),
            config,
        ))
    }
}

impl<D: DeviceMemory> Replayer<D> {
    /// Replays onto `alloc` (configure it first: trace recording, memory fraction, ...) with
    /// the [strict](ReplayPolicy::STRICT) policy.
    pub fn new(alloc: CachingAllocator<D>) -> Self {
        Replayer {
            alloc,
            policy: ReplayPolicy::STRICT,
            live: FastMap::default(),
            failed: FastSet::default(),
            label_bytes: BTreeMap::new(),
            counts: Counts::default(),
            ooms: Vec::new(),
        }
    }

    /// Replays onto `alloc` built in a given state, whose live `blocks` the trace names by
    /// the ids `0..blocks.len()` (as [`seeded_ops`](super::seeded_ops) numbers them).
    pub fn seeded(alloc: CachingAllocator<D>, blocks: &[Block]) -> Self {
        let mut r = Replayer::new(alloc);
        for (id, b) in blocks.iter().enumerate() {
            let live = LiveBlock {
                id: b.id,
                size: b.size,
                label: None,
            };
            r.live.insert(id as u64, live);
        }
        r
    }

    /// The same replayer with another policy.
    pub fn with_policy(mut self, policy: ReplayPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Applies one op. Out-of-memory is recorded and is not an error; id mistakes (as the
    /// policy says) and allocator errors other than out-of-memory are.
    pub fn apply(&mut self, at: Origin, op: Op) -> Result<Applied, ReplayError> {
        self.counts.ops += 1;
        match op {
            Op::Alloc {
                id,
                size,
                stream,
                label,
            } => self.alloc(at, id, size, StreamId(stream), label),
            Op::Free { id } => self.free(at, id),
            Op::EmptyCache => {
                let released = self
                    .alloc
                    .empty_cache()
                    .map_err(|source| ReplayError::EmptyCache { at, source })?;
                self.counts.empty_cache_calls += 1;
                self.counts.empty_cache_released_bytes += released.bytes;
                Ok(Applied::Released(released))
            }
        }
    }

    /// Applies ops in order, stopping at the first error.
    pub fn apply_all(
        &mut self,
        ops: impl IntoIterator<Item = (Origin, Op)>,
    ) -> Result<(), ReplayError> {
        for (at, op) in ops {
            self.apply(at, op)?;
        }
        Ok(())
    }

    fn alloc(
        &mut self,
        at: Origin,
        id: u64,
        size: u64,
        stream: StreamId,
        label: Option<Label>,
    ) -> Result<Applied, ReplayError> {
        self.counts.allocs += 1;
        if self.live.contains_key(&id) {
            match self.policy.live_id_alloc {
                LiveIdAlloc::Error => return Err(ReplayError::AllocOfLiveId { at, id }),
                LiveIdAlloc::Orphan => {
                    if let Some(old) = self.live.remove(&id) {
                        self.forget_label_bytes(&old);
                        self.counts.orphaned_blocks += 1;
                    }
                }
            }
        }
        self.failed.remove(&id);
        let result = match &label {
            Some(l) => self.alloc.malloc_labeled(size, stream, l.clone()),
            None => self.alloc.malloc(size, stream),
        };
        match result {
            Ok(block) => {
                if let Some(l) = &label {
                    *self.label_bytes.entry(l.as_str().to_string()).or_default() += block.size;
                }
                let live = LiveBlock {
                    id: block.id,
                    size: block.size,
                    label,
                };
                self.live.insert(id, live);
                Ok(Applied::Allocated(block))
            }
            Err(AllocError::OutOfMemory(report)) => {
                self.failed.insert(id);
                self.ooms.push(OomEvent {
                    at: at.to_string(),
                    line: at.line(),
                    id,
                    size,
                    message: report.to_string(),
                });
                Ok(Applied::OutOfMemory)
            }
            Err(source) => Err(ReplayError::Alloc { at, size, source }),
        }
    }

    fn free(&mut self, at: Origin, id: u64) -> Result<Applied, ReplayError> {
        let Some(block) = self.live.remove(&id) else {
            if self.failed.remove(&id) {
                self.counts.frees_of_failed_allocs += 1;
                return Ok(Applied::Skipped);
            }
            return match self.policy.unknown_free {
                UnknownFree::Error => Err(ReplayError::FreeOfUnknownId { at, id }),
                UnknownFree::Skip => {
                    self.counts.frees_of_unknown_ids += 1;
                    Ok(Applied::Skipped)
                }
            };
        };
        if let Err(source) = self.alloc.free(block.id) {
            self.live.insert(id, block);
            return Err(ReplayError::Free { at, id, source });
        }
        self.forget_label_bytes(&block);
        self.counts.frees += 1;
        Ok(Applied::Freed { size: block.size })
    }

    fn forget_label_bytes(&mut self, block: &LiveBlock) {
        if let Some(l) = &block.label
            && let Some(bytes) = self.label_bytes.get_mut(l.as_str())
        {
            *bytes = bytes.saturating_sub(block.size);
        }
    }

    /// The counts so far (with `live_at_end` filled in).
    pub fn counts(&self) -> Counts {
        Counts {
            live_at_end: self.live.len() as u64,
            ..self.counts.clone()
        }
    }

    /// The out-of-memory events so far.
    pub fn ooms(&self) -> &[OomEvent] {
        &self.ooms
    }

    /// Rounded bytes of the live blocks the trace can still free, per label (labels whose
    /// blocks are all freed stay, with 0).
    pub fn live_bytes_by_label(&self) -> &BTreeMap<String, u64> {
        &self.label_bytes
    }

    /// The allocator: statistics, snapshots, trace.
    pub fn allocator(&self) -> &CachingAllocator<D> {
        &self.alloc
    }

    /// The allocator, to change settings or the clock between ops. Allocating or freeing
    /// through it is invisible to the replay's ids and counts.
    pub fn allocator_mut(&mut self) -> &mut CachingAllocator<D> {
        &mut self.alloc
    }

    /// Ends the replay and hands back the allocator.
    pub fn into_allocator(self) -> CachingAllocator<D> {
        self.alloc
    }
}
