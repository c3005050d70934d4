//! The caching allocator: [`CachingAllocator`] (single owner, `&mut self`, the fast path) and
//! the rules it applies on every request. See the crate documentation for the rules.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::block::{Block, BlockId};
use crate::config::{AllocatorConfig, ConfigError};
use crate::device::{DeviceError, DeviceMemory};
use crate::error::{AllocError, OutOfMemory};
use crate::host::HostDevice;
use crate::label::Label;
use crate::size::{MIN_BLOCK_SIZE, PoolKind, SMALL_SIZE, allocation_size, round_size};
use crate::snapshot::{AllocatorSettings, BlockInfo, BlockState, SegmentInfo, Snapshot};
use crate::stats::MemoryStats;
use crate::stream::StreamId;
use crate::trace::{TraceAction, TraceBuffer, TraceEntry};

mod expandable;
mod figures;
mod free_set;
pub(crate) mod invariants;
mod seed;
mod slab;

pub use figures::CacheFigures;
pub use seed::{SeedBlock, SeedError, SeedSegment, SeedState};

use free_set::{Found, FreeSet};
use slab::Slab;

const NONE: u32 = u32::MAX;

static NEXT_OWNER: AtomicU32 = AtomicU32::new(1);

/// Block ids by address (the crate's word hasher: no per-op allocation).
type AddrMap = crate::fast_hash::FastMap<u64, u32>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NodeState {
    /// Slot not in use.
    Vacant,
    /// Free and cached (in a free set), or a fresh segment about to be handed out.
    Free,
    /// Handed to a client.
    Allocated,
    /// Freed by the client, waiting for other streams' work (record_stream).
    Pending,
    /// Address space of an expandable segment with no memory behind it (whole pages).
    Unmapped,
}

/// A block: a contiguous range inside one segment. Blocks of a segment form a doubly linked
/// list in address order through `prev`/`next` (slab indices).
///
/// One record is one 64-byte cache line (its stream is its pool slot's, its label is kept
/// beside it in `CachingAllocator::labels`): merging and splitting touch neighbours, and a
/// record that straddles two lines costs two misses once the blocks outgrow the cache.
#[derive(Debug)]
#[repr(align(64))]
struct Node {
    addr: u64,
    size: u64,
    requested: u64,
    seq: u64,
    gc_base: u64,
    prev: u32,
    next: u32,
    pool: PoolKind,
    /// Index of the stream's entry in `pools`.
    slot: u32,
    state: NodeState,
    raii: bool,
    event_count: u32,
    /// Other streams recorded with `record_stream` (kept in `stream_uses` while set).
    has_uses: bool,
    /// Part of an expandable segment.
    expandable: bool,
}

const _: () = assert!(std::mem::size_of::<Node>() == 64);

impl Default for Node {
    /// A vacant record (what an unused slab slot holds).
    fn default() -> Self {
        let mut n = Node::free_block(0, 0, PoolKind::Small, 0, 0, NONE, NONE);
        n.state = NodeState::Vacant;
        n
    }
}

impl Node {
    /// A free block of `size` bytes at `addr` in `pool` of the stream at slot `slot`,
    /// linked between `prev` and `next` in its segment.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn free_block(
        addr: u64,
        size: u64,
        pool: PoolKind,
        slot: u32,
        gc_base: u64,
        prev: u32,
        next: u32,
    ) -> Node {
        Node {
            addr,
            size,
            requested: 0,
            seq: 0,
            gc_base,
            prev,
            next,
            pool,
            slot,
            state: NodeState::Free,
            raii: false,
            event_count: 0,
            has_uses: false,
            expandable: false,
        }
    }

    #[inline]
    fn is_split(&self) -> bool {
        self.prev != NONE || self.next != NONE
    }
}

/// A free block about to be handed out, as it was found (before any split).
#[derive(Clone, Copy, Debug)]
struct FoundBlock {
    /// Its size before the split.
    size: u64,
    pool: PoolKind,
    /// The next block of its segment (`NONE` at the end).
    next: u32,
    addr: u64,
    stream: StreamId,
    /// Its stream's slot in `pools`.
    slot: u32,
    /// True when it was already part of a split segment.
    already_split: bool,
    /// True when it lies in an expandable segment.
    expandable: bool,
}

/// What merging a freed block with its free neighbours absorbed.
struct Merged {
    /// The key of a merged neighbour still in the free set: the merged block is re-filed in
    /// its place (one move of the entries between the two positions).
    old_key: Option<u128>,
    /// Neighbours merged (free blocks of a split segment, so inactive splits that end).
    count: i64,
    /// Their bytes.
    bytes: i64,
}

/// The free blocks of one stream, per pool, keyed by `size << 64 | address`: best fit is
/// the first key at or after `size << 64` (PyTorch orders by (stream, size, address); keeping
/// one map per stream gives the same order within a stream with a cheaper key).
#[derive(Debug)]
struct StreamPools {
    stream: StreamId,
    free: [FreeSet; 2],
    /// Unmapped blocks of the stream's expandable segments, per pool: address → slab index.
    unmapped: [BTreeMap<u64, u32>; 2],
}

#[inline]
fn fkey(size: u64, addr: u64) -> u128 {
    (u128::from(size) << 64) | u128::from(addr)
}

/// A free block as found in a map: where it is filed and what it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FreeKey {
    slot: u32,
    pool: PoolKind,
    size: u64,
    addr: u64,
    idx: u32,
}

impl FreeKey {
    fn from_entry(slot: u32, pool: PoolKind, key: u128, idx: u32) -> Self {
        FreeKey {
            slot,
            pool,
            size: (key >> 64) as u64,
            addr: key as u64,
            idx,
        }
    }
}

/// What [`CachingAllocator::empty_cache`] (or a flush) gave back to the device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ReleasedMemory {
    /// Bytes returned to the device.
    pub bytes: u64,
    /// Segments returned to the device.
    pub segments: u64,
}

/// A caching device allocator with PyTorch `CUDACachingAllocator` semantics, drawing
/// segments from a [`DeviceMemory`].
///
/// This is the single-owner form: every operation takes `&mut self` and no lock is taken, which
/// is what a simulator replaying millions of operations wants. It is `Send` (and `Sync` when
/// the device is). For sharing between threads and RAII handles use
/// [`SharedAllocator`](crate::SharedAllocator), which wraps it in a mutex.
///
/// Data structures: blocks live in a slab (chunks of 1,024 records, see `slab`) linked per
/// segment by prev/next indices, with their labels in a second slab at the same index;
/// free blocks are kept per stream and pool in sorted arrays of at most 128 entries keyed by
/// (size, address), with each array's first key in a small index (see `free_set`), so best
/// fit is two binary searches. A malloc hit costs that lookup, O(1) slab work, O(1) statistics and one removal or,
/// when it splits, one re-filing (the remainder takes the found block's place); a free costs
/// one insertion, or a re-filing (plus a removal when both neighbours merge). No heap
/// allocation happens on these paths when tracing is off, apart from a free set's growth.
pub struct CachingAllocator<D: DeviceMemory> {
    device: D,
    config: AllocatorConfig,
    owner: u32,
    nodes: Slab<Node>,
    /// Each block's label, at its slab index (kept out of `Node` so a record fits a line).
    labels: Slab<Option<Label>>,
    vacant: Vec<u32>,
    pools: Vec<StreamPools>,
    last_slot: u32,
    /// Address → slot of allocated blocks; built on the first `free_address` and maintained
    /// from then on, so callers that free by id pay nothing for it.
    addr_index: Option<AddrMap>,
    /// Streams recorded on live blocks (`record_stream`), by slot.
    stream_uses: HashMap<u32, Vec<StreamId>>,
    /// Segment base address → size (segments allocated whole; expandable ones are in
    /// `expandable`).
    segments: BTreeMap<u64, u64>,
    /// Expandable segments: base address → size of the reserved address range.
    expandable: BTreeMap<u64, u64>,
    pending: Vec<(StreamId, u32)>,
    next_seq: u64,
    pool_calls: [u64; 2],
    reserved: u64,
    fraction: Option<f64>,
    allowed_max: Option<u64>,
    stats: MemoryStats,
    trace: TraceBuffer,
}

#[inline]
fn pidx(p: PoolKind) -> usize {
    match p {
        PoolKind::Small => 0,
        PoolKind::Large => 1,
    }
}

impl<D: DeviceMemory> std::fmt::Debug for CachingAllocator<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachingAllocator")
            .field("device", &self.device.name())
            .field("config", &self.config)
            .field("allocated", &self.stats.allocated_bytes.all.current)
            .field("reserved", &self.reserved)
            .field("segments", &self.segments.len())
            .finish()
    }
}

impl<D: DeviceMemory> CachingAllocator<D> {
    /// An allocator with the default (PyTorch default) configuration.
    pub fn new(device: D) -> Self {
        Self::with_config(device, AllocatorConfig::default())
    }

    /// An allocator with the given configuration. A `per_process_memory_fraction` below 1 in
    /// it is applied as [`set_memory_fraction`](Self::set_memory_fraction) (as PyTorch applies
    /// it when its allocator starts).
    pub fn with_config(device: D, config: AllocatorConfig) -> Self {
        let fraction = config.per_process_memory_fraction();
        let stats = MemoryStats {
            max_split_size: config
                .max_split_size()
                .map_or(i64::MAX, |m| m.min(i64::MAX as u64) as i64),
            ..MemoryStats::default()
        };
        let mut alloc = CachingAllocator {
            device,
            config,
            owner: NEXT_OWNER.fetch_add(1, Ordering::Relaxed),
            nodes: Slab::default(),
            labels: Slab::default(),
            vacant: Vec::new(),
            pools: Vec::new(),
            last_slot: 0,
            addr_index: None,
            stream_uses: HashMap::new(),
            segments: BTreeMap::new(),
            expandable: BTreeMap::new(),
            pending: Vec::new(),
            next_seq: 1,
            pool_calls: [0, 0],
            reserved: 0,
            fraction: None,
            allowed_max: None,
            stats,
            trace: TraceBuffer::default(),
        };
        if fraction < 1.0 {
            alloc.fraction = Some(fraction);
            alloc.allowed_max = Some((fraction * alloc.device.capacity() as f64) as u64);
        }
        alloc
    }

    /// The configuration.
    pub fn config(&self) -> &AllocatorConfig {
        &self.config
    }

    /// The backing device.
    pub fn device(&self) -> &D {
        &self.device
    }

    // ----------------------------------------------------------------- allocation

    /// Allocates `size` bytes on `stream`.
    ///
    /// Size 0 returns the null block (address 0, size 0, [`BlockId::NULL`]) without touching
    /// any state, as PyTorch returns a null pointer; freeing it is a no-op. Sizes whose rounded
    /// or segment size overflows `u64`, or exceeds `i64::MAX` (the statistics are `i64`, as
    /// PyTorch's), fail with [`AllocError::SizeOverflow`] and change nothing. On [`AllocError::OutOfMemory`] see [`CachingAllocator`]'s ladder docs in the
    /// crate root: live blocks are untouched; cached segments may have been released.
    #[inline]
    pub fn malloc(&mut self, size: u64, stream: StreamId) -> Result<Block, AllocError> {
        self.malloc_impl(size, stream, None)
    }

    /// Like [`malloc`](Self::malloc), attaching a label (kept in snapshots and traces).
    #[inline]
    pub fn malloc_labeled(
        &mut self,
        size: u64,
        stream: StreamId,
        label: impl Into<Label>,
    ) -> Result<Block, AllocError> {
        self.malloc_impl(size, stream, Some(label.into()))
    }

    // Inlined into its callers: returning the `Result<Block, _>` through memory cost a tenth
    // of a simulation's time in the caller, reading it back right after the call.
    #[inline]
    fn malloc_impl(
        &mut self,
        orig: u64,
        stream: StreamId,
        label: Option<Label>,
    ) -> Result<Block, AllocError> {
        if orig == 0 {
            return Ok(Block::null(stream));
        }
        let size = round_size(orig, self.config.roundup_power2_divisions())
            .ok_or(AllocError::SizeOverflow { size: orig })?;
        let alloc_size = allocation_size(size)
            .filter(|&a| a <= i64::MAX as u64)
            .ok_or(AllocError::SizeOverflow { size: orig })?;
        let pool = PoolKind::for_size(size);
        let slot = self.slot_of(stream);
        // A cached block is still filed in its free set (`filed`); a fresh segment is not.
        let (idx, filed) = match self.get_free_block(size, slot, pool) {
            Some(found) => (found.idx, Some(found)),
            None => (
                self.alloc_miss(orig, size, alloc_size, slot, pool, label.as_ref())?,
                None,
            ),
        };
        Ok(self.alloc_found_block(idx, filed, size, orig, label))
    }

    #[inline]
    fn gc_enabled(&self) -> bool {
        self.allowed_max.is_some() && self.config.garbage_collection_threshold().is_some()
    }

    /// The index of `stream`'s entry in `pools`, creating it on first use.
    #[inline]
    fn slot_of(&mut self, stream: StreamId) -> u32 {
        if let Some(p) = self.pools.get(self.last_slot as usize)
            && p.stream == stream
        {
            return self.last_slot;
        }
        let slot = match self.pools.iter().position(|p| p.stream == stream) {
            Some(i) => i as u32,
            None => {
                self.pools.push(StreamPools {
                    stream,
                    free: [FreeSet::default(), FreeSet::default()],
                    unmapped: [BTreeMap::new(), BTreeMap::new()],
                });
                (self.pools.len() - 1) as u32
            }
        };
        self.last_slot = slot;
        slot
    }

    #[inline]
    fn free_remove(&mut self, slot: u32, pool: PoolKind, size: u64, addr: u64) {
        self.pools[slot as usize].free[pidx(pool)].remove(fkey(size, addr));
    }

    /// Every cached free block, across streams and pools.
    fn free_entries(&self) -> impl Iterator<Item = FreeKey> + '_ {
        self.pools.iter().enumerate().flat_map(|(slot, sp)| {
            [PoolKind::Small, PoolKind::Large]
                .into_iter()
                .flat_map(move |pool| {
                    sp.free[pidx(pool)]
                        .iter()
                        .map(move |(k, idx)| FreeKey::from_entry(slot as u32, pool, k, idx))
                })
        })
    }

    /// Best fit on the request's stream, honouring the oversize rules. The block stays in its
    /// free set: [`alloc_found_block`](Self::alloc_found_block) takes it out (or re-files its
    /// remainder in its place, which moves fewer entries).
    #[inline]
    fn get_free_block(&mut self, size: u64, slot: u32, pool: PoolKind) -> Option<Found> {
        let p = pidx(pool);
        if self.gc_enabled() {
            self.pool_calls[p] += 1;
        }
        let max_split = self.config.max_split_size_or_max();
        let max_rounding = self.config.max_non_split_rounding();
        // The oversize rules bound the acceptable sizes from above: a request below
        // max_split_size takes no block of max_split_size or more; a larger request takes no
        // block of request + max_non_split_rounding or more. Best fit is the first key in range.
        let limit = if size < max_split {
            max_split
        } else {
            size.saturating_add(max_rounding)
        };
        let set = &self.pools[slot as usize].free[p];
        if self.config.expandable_segments() {
            return self.best_fit_expandable(set, size, limit);
        }
        set.first_in(fkey(size, 0), fkey(limit, 0))
    }

    /// The miss path: new segment, then release oversize blocks, then flush everything.
    fn alloc_miss(
        &mut self,
        orig: u64,
        size: u64,
        alloc_size: u64,
        slot: u32,
        pool: PoolKind,
        label: Option<&Label>,
    ) -> Result<u32, AllocError> {
        let stream = self.pools[slot as usize].stream;
        if self.gc_enabled() {
            self.garbage_collect_cached_blocks()?;
        }
        if let Some(i) = self.alloc_segment(size, alloc_size, slot, pool, false, label)? {
            return Ok(i);
        }
        if self.release_available_cached_blocks(size, slot, pool)?
            && let Some(i) = self.alloc_segment(size, alloc_size, slot, pool, false, label)?
        {
            return Ok(i);
        }
        self.release_cached_blocks()?;
        if let Some(i) = self.alloc_segment(size, alloc_size, slot, pool, true, label)? {
            return Ok(i);
        }
        let device_free = self.device.free_bytes();
        self.trace
            .record(TraceAction::Oom, device_free, size, stream, label);
        self.stats.num_ooms += 1;
        Err(AllocError::OutOfMemory(Box::new(OutOfMemory {
            requested_size: orig,
            rounded_size: size,
            allocation_size: alloc_size,
            stream,
            device: self.device.name(),
            capacity: self.device.capacity(),
            device_free,
            allowed: self.allowed_max,
            allocated: self.stats.allocated_bytes.all.current as u64,
            reserved: self.reserved,
        })))
    }

    fn new_node(&mut self, node: Node) -> u32 {
        if let Some(i) = self.vacant.pop() {
            self.nodes[i as usize] = node;
            i
        } else {
            let i = self.nodes.len();
            assert!(i < NONE as usize, "more than 2^32-1 blocks");
            self.nodes.push(node);
            self.labels.push(None);
            i as u32
        }
    }

    fn vacate(&mut self, idx: u32) {
        let n = &mut self.nodes[idx as usize];
        n.state = NodeState::Vacant;
        // Only free or unmapped blocks are vacated, and a block's label leaves it when it is
        // freed (`free_block`), so there is no label to drop here.
        debug_assert!(
            self.labels[idx as usize].is_none(),
            "vacated a labelled block"
        );
        self.vacant.push(idx);
    }

    /// Allocates a segment of `alloc_size` bytes from the device for a request of `size`
    /// (with expandable segments: maps pages for `size` bytes instead). `Ok(None)` = no
    /// memory (or over the fraction).
    fn alloc_segment(
        &mut self,
        size: u64,
        alloc_size: u64,
        slot: u32,
        pool: PoolKind,
        is_retry: bool,
        label: Option<&Label>,
    ) -> Result<Option<u32>, AllocError> {
        let stream = self.pools[slot as usize].stream;
        if is_retry {
            self.stats.num_alloc_retries += 1;
        }
        // The fraction check is on the whole-segment size also with expandable segments,
        // as in PyTorch.
        if let Some(max) = self.allowed_max
            && self
                .reserved
                .checked_add(alloc_size)
                .is_none_or(|t| t > max)
        {
            return Ok(None);
        }
        if self.config.expandable_segments() {
            return self.alloc_expandable(size, slot, pool, label);
        }
        let addr = match self.device.allocate(alloc_size) {
            Ok(a) => a,
            Err(DeviceError::OutOfMemory { .. }) => return Ok(None),
            Err(e) => return Err(AllocError::Device(e)),
        };
        let idx = self.new_node(Node::free_block(
            addr, alloc_size, pool, slot, 0, NONE, NONE,
        ));
        self.segments.insert(addr, alloc_size);
        self.reserved += alloc_size;
        self.stats.segment.increase(pool, 1);
        self.stats.reserved_bytes.increase(pool, alloc_size);
        if alloc_size >= self.config.max_split_size_or_max() {
            self.stats.oversize_segments.increase(1);
        }
        self.stats.num_device_alloc += 1;
        self.trace
            .record(TraceAction::SegmentAlloc, addr, alloc_size, stream, label);
        Ok(Some(idx))
    }

    /// Hands free block `idx` to the client, splitting off the rest. `filed`: where the block
    /// is in its free set on a cache hit; `None` for a fresh segment.
    #[inline]
    fn alloc_found_block(
        &mut self,
        idx: u32,
        filed: Option<Found>,
        size: u64,
        orig: u64,
        label: Option<Label>,
    ) -> Block {
        let found = self.found_block(idx);
        if self.should_split(found.pool, size, found.size - size) {
            self.split_found_block(idx, &found, filed, size);
        } else {
            self.take_whole_block(&found, filed);
        }
        self.hand_out(idx, &found, orig, label)
    }

    /// What [`alloc_found_block`](Self::alloc_found_block) needs of free block `idx` before
    /// it changes.
    #[inline]
    fn found_block(&self, idx: u32) -> FoundBlock {
        let n = &self.nodes[idx as usize];
        FoundBlock {
            size: n.size,
            pool: n.pool,
            next: n.next,
            addr: n.addr,
            stream: self.pools[n.slot as usize].stream,
            slot: n.slot,
            already_split: n.is_split(),
            expandable: n.expandable,
        }
    }

    /// Whether a free block of `pool` serving a request of `size` splits off its `remaining`
    /// bytes: in the small pool, when they are at least 512 B; in the large pool, when the
    /// request is below max_split_size and they exceed 1 MiB. With expandable segments on,
    /// both pools split off any remainder of 512 B or more.
    #[inline]
    fn should_split(&self, pool: PoolKind, size: u64, remaining: u64) -> bool {
        if pool == PoolKind::Small || self.config.expandable_segments() {
            remaining >= MIN_BLOCK_SIZE
        } else {
            size < self.config.max_split_size_or_max() && remaining > SMALL_SIZE
        }
    }

    /// Splits the free block `b` (slot `idx`) into the request's `size` at the front and a
    /// free remainder, filed in the free set in the block's place (`filed`) or anew, and
    /// counts the split in the inactive-split statistics. Expandable segments stay out of
    /// those (PyTorch: their fully free pages can always be given back).
    #[inline]
    fn split_found_block(&mut self, idx: u32, b: &FoundBlock, filed: Option<Found>, size: u64) {
        let remaining = b.size - size;
        let p = pidx(b.pool);
        let mut rest = Node::free_block(
            b.addr + size,
            remaining,
            b.pool,
            b.slot,
            self.pool_calls[p],
            idx,
            b.next,
        );
        rest.expandable = b.expandable;
        let r = self.new_node(rest);
        if b.next != NONE {
            self.nodes[b.next as usize].prev = r;
        }
        let n = &mut self.nodes[idx as usize];
        n.next = r;
        n.size = size;
        let set = &mut self.pools[b.slot as usize].free[p];
        match filed {
            Some(found) => set.replace_found(found, fkey(remaining, b.addr + size), r),
            None => set.insert(fkey(remaining, b.addr + size), r),
        }
        if b.expandable {
            return;
        }
        if b.already_split {
            self.stats.inactive_split_bytes.decrease(b.pool, size);
        } else {
            self.stats.inactive_split_bytes.increase(b.pool, remaining);
            self.stats.inactive_split.increase(b.pool, 1);
        }
    }

    /// Takes the free block `b` whole: out of its free set (`filed`, on a cache hit), and out
    /// of the inactive-split statistics if it was a split block of a whole segment.
    #[inline]
    fn take_whole_block(&mut self, b: &FoundBlock, filed: Option<Found>) {
        if b.already_split && !b.expandable {
            self.stats.inactive_split_bytes.decrease(b.pool, b.size);
            self.stats.inactive_split.decrease(b.pool, 1);
        }
        if let Some(found) = filed {
            self.pools[b.slot as usize].free[pidx(b.pool)].remove_found(found);
        }
    }

    /// Marks block `idx` (found as `b`, now split to its final size) allocated for a request
    /// of `orig` bytes with `label`, counts it, traces it and returns the client's handle.
    #[inline]
    fn hand_out(&mut self, idx: u32, b: &FoundBlock, orig: u64, label: Option<Label>) -> Block {
        let seq = self.next_seq;
        self.next_seq += 1;
        let n = &mut self.nodes[idx as usize];
        n.state = NodeState::Allocated;
        n.requested = orig;
        n.seq = seq;
        self.labels[idx as usize] = label;
        let final_size = n.size;
        let pool = b.pool;
        if let Some(m) = &mut self.addr_index {
            m.insert(b.addr, idx);
        }
        let st = &mut self.stats;
        st.allocation.increase(pool, 1);
        st.allocated_bytes.increase(pool, final_size);
        st.active.increase(pool, 1);
        st.active_bytes.increase(pool, final_size);
        st.requested_bytes.increase(pool, orig);
        if final_size >= self.config.max_split_size_or_max() {
            st.oversize_allocations.increase(1);
        }
        if self.trace.enabled {
            let label = self.labels[idx as usize].as_ref();
            self.trace
                .record(TraceAction::Alloc, b.addr, orig, b.stream, label);
        }
        Block {
            id: BlockId {
                owner: self.owner,
                index: idx,
                seq,
            },
            address: b.addr,
            size: final_size,
            requested_size: orig,
            stream: b.stream,
        }
    }

    // ----------------------------------------------------------------- freeing

    /// Resolves a live (allocated) block id to its slot. `Ok(None)` for the null id;
    /// [`AllocError::AlreadyFreed`] for a stale id (a free turns it into
    /// [`AllocError::DoubleFree`] with [`resolve_for_free`](Self::resolve_for_free)).
    fn resolve(&self, id: BlockId) -> Result<Option<u32>, AllocError> {
        if id.is_null() {
            return Ok(None);
        }
        if id.owner != self.owner {
            return Err(AllocError::ForeignBlock);
        }
        let Some(n) = self.nodes.get(id.index as usize) else {
            return Err(AllocError::UnknownBlock);
        };
        if n.seq == id.seq && n.state == NodeState::Allocated {
            return Ok(Some(id.index));
        }
        if id.seq >= 1 && id.seq < self.next_seq {
            Err(AllocError::AlreadyFreed { sequence: id.seq })
        } else {
            Err(AllocError::UnknownBlock)
        }
    }

    /// [`resolve`](Self::resolve) for a free: a stale id is a double free.
    fn resolve_for_free(&self, id: BlockId) -> Result<Option<u32>, AllocError> {
        self.resolve(id).map_err(|e| match e {
            AllocError::AlreadyFreed { sequence } => AllocError::DoubleFree { sequence },
            other => other,
        })
    }

    /// Frees an allocation. If the block was used on other streams
    /// ([`record_stream`](Self::record_stream)) its memory returns to the cache only once
    /// those streams are synchronized; until then it stays *active* (`active_pending_free`).
    ///
    /// Errors: [`AllocError::DoubleFree`], [`AllocError::ForeignBlock`],
    /// [`AllocError::UnknownBlock`], [`AllocError::OwnedByHandle`]; nothing changes on error.
    /// Freeing [`BlockId::NULL`] is a no-op.
    #[inline]
    pub fn free(&mut self, id: impl Into<BlockId>) -> Result<(), AllocError> {
        let id = id.into();
        let Some(idx) = self.resolve_for_free(id)? else {
            return Ok(());
        };
        if self.nodes[idx as usize].raii {
            return Err(AllocError::OwnedByHandle { sequence: id.seq });
        }
        self.free_idx(idx);
        Ok(())
    }

    /// Frees the allocation starting at `address` (PyTorch's `free(ptr)`).
    /// [`AllocError::UnknownAddress`] if no live allocation starts there (address 0 is the
    /// null allocation: a no-op). The first call builds an address index over the live blocks
    /// (O(blocks)); from then on it is kept up to date and each call is O(1). Callers that
    /// only free by id never pay for the index.
    pub fn free_address(&mut self, address: u64) -> Result<(), AllocError> {
        if address == 0 {
            return Ok(());
        }
        let nodes = &self.nodes;
        let index = self.addr_index.get_or_insert_with(|| {
            nodes
                .iter()
                .enumerate()
                .filter(|(_, n)| n.state == NodeState::Allocated)
                .map(|(i, n)| (n.addr, i as u32))
                .collect()
        });
        let idx = *index
            .get(&address)
            .ok_or(AllocError::UnknownAddress { address })?;
        let n = &self.nodes[idx as usize];
        if n.raii {
            return Err(AllocError::OwnedByHandle { sequence: n.seq });
        }
        self.free_idx(idx);
        Ok(())
    }

    /// Frees a block owned by an RAII handle (bypasses the ownership check).
    pub(crate) fn free_owned(&mut self, id: BlockId) -> Result<(), AllocError> {
        if let Some(idx) = self.resolve_for_free(id)? {
            self.free_idx(idx);
        }
        Ok(())
    }

    pub(crate) fn set_raii(&mut self, id: BlockId, owned: bool) -> Result<(), AllocError> {
        if let Some(idx) = self.resolve(id)? {
            self.nodes[idx as usize].raii = owned;
        }
        Ok(())
    }

    #[inline]
    fn free_idx(&mut self, idx: u32) {
        let max_split = self.config.max_split_size_or_max();
        let n = &mut self.nodes[idx as usize];
        let (addr, size, pool, stream, requested) = (
            n.addr,
            n.size,
            n.pool,
            self.pools[n.slot as usize].stream,
            n.requested,
        );
        n.raii = false;
        if let Some(m) = &mut self.addr_index {
            m.remove(&addr);
        }
        self.stats.allocation.decrease(pool, 1);
        self.stats.allocated_bytes.decrease(pool, size);
        if size >= max_split {
            self.stats.oversize_allocations.decrease(1);
        }
        if self.trace.enabled {
            let label = self.labels[idx as usize].as_ref();
            self.trace
                .record(TraceAction::FreeRequested, addr, requested, stream, label);
        }
        let n = &mut self.nodes[idx as usize];
        if !n.has_uses {
            self.free_block(idx);
        } else {
            n.has_uses = false;
            let uses = self.stream_uses.remove(&idx).unwrap_or_default();
            let n = &mut self.nodes[idx as usize];
            n.state = NodeState::Pending;
            n.event_count = uses.len() as u32;
            for s in uses {
                self.pending.push((s, idx));
            }
        }
    }

    /// Returns block `idx` (allocated or pending) to the cache, merging free neighbours.
    fn free_block(&mut self, idx: u32) {
        let n = &mut self.nodes[idx as usize];
        let (orig_size, requested, pool, stream, addr, slot) = (
            n.size,
            n.requested,
            n.pool,
            self.pools[n.slot as usize].stream,
            n.addr,
            n.slot,
        );
        n.state = NodeState::Free;
        n.requested = 0;
        n.seq = 0;
        n.event_count = 0;
        let label = self.labels[idx as usize].take();
        self.trace.record(
            TraceAction::FreeCompleted,
            addr,
            requested,
            stream,
            label.as_ref(),
        );
        let p = pidx(pool);
        let merged = self.merge_free_neighbours(idx, slot, p);
        let (mut before_count, mut before_bytes) = (merged.count, merged.bytes);
        let n = &mut self.nodes[idx as usize];
        n.gc_base = self.pool_calls[p];
        if n.expandable {
            (before_count, before_bytes) = (0, 0);
        }
        let (after_count, after_bytes) = if n.is_split() && !n.expandable {
            (1i64, n.size as i64)
        } else {
            (0, 0)
        };
        let (size, start) = (n.size, n.addr);
        let set = &mut self.pools[slot as usize].free[p];
        match merged.old_key {
            Some(k) => set.replace(k, fkey(size, start), idx),
            None => set.insert(fkey(size, start), idx),
        }
        let st = &mut self.stats;
        st.inactive_split.change(pool, after_count - before_count);
        st.inactive_split_bytes
            .change(pool, after_bytes - before_bytes);
        st.active.decrease(pool, 1);
        st.active_bytes.decrease(pool, orig_size);
        st.requested_bytes.decrease(pool, requested);
    }

    /// Merges the freed block `idx` (slot `slot`, pool index `p`) with its free neighbours,
    /// taking the next one out of its free set; the previous (or, when it is the only one
    /// merged, the next) one stays filed for the merged block to take its place.
    fn merge_free_neighbours(&mut self, idx: u32, slot: u32, p: usize) -> Merged {
        let mut merged = Merged {
            old_key: None,
            count: 0,
            bytes: 0,
        };
        let prev = self.nodes[idx as usize].prev;
        if prev != NONE && self.nodes[prev as usize].state == NodeState::Free {
            let pn = &self.nodes[prev as usize];
            let (paddr, psize, pprev) = (pn.addr, pn.size, pn.prev);
            merged.old_key = Some(fkey(psize, paddr));
            merged.count += 1;
            merged.bytes += psize as i64;
            let n = &mut self.nodes[idx as usize];
            n.addr = paddr;
            n.size += psize;
            n.prev = pprev;
            if pprev != NONE {
                self.nodes[pprev as usize].next = idx;
            }
            self.vacate(prev);
        }
        let next = self.nodes[idx as usize].next;
        if next != NONE && self.nodes[next as usize].state == NodeState::Free {
            let nn = &self.nodes[next as usize];
            let (naddr, nsize, nnext) = (nn.addr, nn.size, nn.next);
            if let Some(k) = merged.old_key.replace(fkey(nsize, naddr)) {
                self.pools[slot as usize].free[p].remove(k);
            }
            merged.count += 1;
            merged.bytes += nsize as i64;
            let n = &mut self.nodes[idx as usize];
            n.size += nsize;
            n.next = nnext;
            if nnext != NONE {
                self.nodes[nnext as usize].prev = idx;
            }
            self.vacate(next);
        }
        merged
    }

    // ----------------------------------------------------------------- streams

    /// Marks a live block as used by `stream` (PyTorch's `record_stream`). When the block is
    /// freed, its memory is not reused until `stream`'s work is complete, i.e. until
    /// [`synchronize_stream`](Self::synchronize_stream)`(stream)`,
    /// [`synchronize`](Self::synchronize), or a flush (`empty_cache`, the out-of-memory ladder)
    /// is reached. Recording the block's own stream is a no-op. A freed block is
    /// [`AllocError::AlreadyFreed`].
    pub fn record_stream(
        &mut self,
        id: impl Into<BlockId>,
        stream: StreamId,
    ) -> Result<(), AllocError> {
        let Some(idx) = self.resolve(id.into())? else {
            return Ok(());
        };
        let n = &mut self.nodes[idx as usize];
        if self.pools[n.slot as usize].stream != stream {
            let uses = self.stream_uses.entry(idx).or_default();
            if !uses.contains(&stream) {
                uses.push(stream);
            }
            n.has_uses = true;
        }
        Ok(())
    }

    /// Declares all work queued so far on `stream` complete: frees that were waiting on it
    /// (and on no other stream) are completed now, returning their blocks to the cache.
    ///
    /// trainmem has no real streams, so stream work completes only when the caller says so.
    /// (PyTorch polls completion events at the start of each malloc; completing them here
    /// gives the state that malloc would then see.) Returns the number of frees completed.
    pub fn synchronize_stream(&mut self, stream: StreamId) -> usize {
        self.complete_events(|s| s == stream)
    }

    /// Declares the work of every stream complete: completes every pending free. Unlike
    /// `empty_cache`, this does not count in `num_sync_all_streams` and releases nothing.
    /// Returns the number of frees completed.
    pub fn synchronize(&mut self) -> usize {
        self.complete_events(|_| true)
    }

    fn complete_events(&mut self, mut pred: impl FnMut(StreamId) -> bool) -> usize {
        if self.pending.is_empty() {
            return 0;
        }
        let mut done = Vec::new();
        self.pending.retain(|&(s, idx)| {
            if pred(s) {
                done.push(idx);
                false
            } else {
                true
            }
        });
        let mut completed = 0;
        for idx in done {
            let n = &mut self.nodes[idx as usize];
            n.event_count -= 1;
            if n.event_count == 0 {
                self.free_block(idx);
                completed += 1;
            }
        }
        completed
    }

    /// Number of frees waiting for other streams.
    pub fn pending_frees(&self) -> usize {
        self.nodes
            .iter()
            .filter(|n| n.state == NodeState::Pending)
            .count()
    }

    // ----------------------------------------------------------------- releasing

    /// Returns every cached segment that is entirely free to the device, after completing all
    /// pending cross-stream frees (PyTorch's `empty_cache`). Segments holding any live block
    /// stay; their free parts remain as `inactive_split`. Counts one `num_sync_all_streams`.
    pub fn empty_cache(&mut self) -> Result<ReleasedMemory, AllocError> {
        self.release_cached_blocks()
    }

    fn release_cached_blocks(&mut self) -> Result<ReleasedMemory, AllocError> {
        self.stats.num_sync_all_streams += 1;
        self.synchronize();
        let mut released = ReleasedMemory::default();
        // Whole free segments, and every free block of an expandable segment (its whole
        // pages are unmapped).
        let mut victims: Vec<FreeKey> = self
            .free_entries()
            .filter(|k| {
                let n = &self.nodes[k.idx as usize];
                n.expandable || !n.is_split()
            })
            .collect();
        // Large pool first, as PyTorch releases large_blocks before small_blocks; within a
        // pool in the pool's order: (stream, size, address), whole segments before the pages
        // of expandable ones.
        victims.sort_by_key(|k| {
            let stream = self.pools[k.slot as usize].stream;
            let expandable = self.nodes[k.idx as usize].expandable;
            (
                k.pool == PoolKind::Small,
                expandable,
                stream,
                k.size,
                k.addr,
            )
        });
        for k in victims {
            if self.nodes[k.idx as usize].expandable {
                let (bytes, gone) = self.unmap_block(k.idx)?;
                released.bytes += bytes;
                released.segments += u64::from(gone);
            } else {
                self.release_block(k)?;
                released.bytes += k.size;
                released.segments += 1;
            }
        }
        released.segments += self.release_unmapped_segments()?;
        Ok(released)
    }

    /// Releases an unsplit free block (a whole segment) to the device.
    fn release_block(&mut self, k: FreeKey) -> Result<(), AllocError> {
        let pool = k.pool;
        self.device.free(k.addr, k.size)?;
        self.free_remove(k.slot, pool, k.size, k.addr);
        self.segments.remove(&k.addr);
        self.reserved -= k.size;
        self.stats.segment.decrease(pool, 1);
        self.stats.reserved_bytes.decrease(pool, k.size);
        if k.size >= self.config.max_split_size_or_max() {
            self.stats.oversize_segments.decrease(1);
        }
        self.stats.num_device_free += 1;
        self.trace.record(
            TraceAction::SegmentFree,
            k.addr,
            k.size,
            self.pools[k.slot as usize].stream,
            None,
        );
        self.vacate(k.idx);
        Ok(())
    }

    /// Frees cached oversize blocks (≥ max_split_size) on the request's stream: the smallest
    /// single one at least as large as the request, else several, largest first.
    fn release_available_cached_blocks(
        &mut self,
        size: u64,
        slot: u32,
        pool: PoolKind,
    ) -> Result<bool, AllocError> {
        let Some(max_split) = self.config.max_split_size() else {
            return Ok(false);
        };
        let key_size = size.max(max_split);
        let lo = fkey(key_size, 0);
        let map = &self.pools[slot as usize].free[pidx(pool)];
        // Blocks of expandable segments are never released whole.
        let whole = |n: &Node| !n.is_split() && !n.expandable;
        if let Some((k, idx)) = map.first_from(lo)
            && whole(&self.nodes[idx as usize])
        {
            self.release_block(FreeKey::from_entry(slot, pool, k, idx))?;
            return Ok(true);
        }
        let candidates: Vec<FreeKey> = map
            .below_rev(lo)
            .map(|(k, idx)| FreeKey::from_entry(slot, pool, k, idx))
            .take_while(|k| k.size >= max_split)
            .collect();
        let mut total = 0u64;
        for k in candidates {
            if total >= key_size {
                break;
            }
            if whole(&self.nodes[k.idx as usize]) {
                self.release_block(k)?;
                total += k.size;
            }
        }
        Ok(total >= key_size)
    }

    /// Frees old unsplit large cached blocks once reserved memory passes the threshold.
    fn garbage_collect_cached_blocks(&mut self) -> Result<(), AllocError> {
        let (Some(allowed), Some(threshold)) =
            (self.allowed_max, self.config.garbage_collection_threshold())
        else {
            return Ok(());
        };
        let gc_threshold = (threshold * allowed as f64) as u64;
        if self.reserved <= gc_threshold {
            return Ok(());
        }
        let target = self.reserved - gc_threshold;
        let p = pidx(PoolKind::Large);
        let calls = self.pool_calls[p];
        let age = |n: &Node| calls - n.gc_base;
        let mut total_age: u64 = 0;
        let mut count: u64 = 0;
        for k in self.free_entries().filter(|k| k.pool == PoolKind::Large) {
            let n = &self.nodes[k.idx as usize];
            if !n.is_split() {
                total_age += age(n);
                count += 1;
            }
        }
        let mut reclaimed = 0u64;
        let mut freed_any = true;
        while reclaimed < target && freed_any && count > 0 {
            let threshold_age = total_age as f64 / count as f64;
            freed_any = false;
            let victims: Vec<(FreeKey, u64)> = self
                .free_entries()
                .filter(|k| k.pool == PoolKind::Large)
                .filter_map(|k| {
                    let n = &self.nodes[k.idx as usize];
                    (!n.is_split() && !n.expandable && age(n) as f64 >= threshold_age)
                        .then(|| (k, age(n)))
                })
                .collect();
            for (k, a) in victims {
                self.release_block(k)?;
                freed_any = true;
                reclaimed += k.size;
                total_age -= a;
                count -= 1;
            }
        }
        Ok(())
    }

    /// Limits this allocator to `fraction` of the device capacity (PyTorch's
    /// `set_per_process_memory_fraction`): a segment that would take reserved memory past it
    /// is refused (and the out-of-memory ladder runs). Also enables garbage collection when a
    /// `garbage_collection_threshold` is configured. `0 ≤ fraction ≤ 1`.
    pub fn set_memory_fraction(&mut self, fraction: f64) -> Result<(), ConfigError> {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(ConfigError::InvalidValue {
                key: "memory_fraction".into(),
                value: fraction.to_string(),
                reason: "must be between 0 and 1".into(),
            });
        }
        self.fraction = Some(fraction);
        self.allowed_max = Some((fraction * self.device.capacity() as f64) as u64);
        Ok(())
    }

    /// The memory fraction, if one was set.
    pub fn memory_fraction(&self) -> Option<f64> {
        self.fraction
    }

    /// The byte limit implied by the memory fraction, if one was set.
    pub fn allowed_memory(&self) -> Option<u64> {
        self.allowed_max
    }

    // ----------------------------------------------------------------- queries

    /// Statistics (PyTorch's `memory_stats()` as a struct).
    pub fn stats(&self) -> &MemoryStats {
        &self.stats
    }

    /// The flattened statistics map with PyTorch keys (`"allocated_bytes.all.current"`, …).
    pub fn memory_stats(&self) -> BTreeMap<String, i64> {
        self.stats.to_map()
    }

    /// Sets every peak statistic to its current value.
    pub fn reset_peak_stats(&mut self) {
        self.stats.reset_peak();
    }

    /// Zeroes the cumulative parts of the statistics and the event counters.
    pub fn reset_accumulated_stats(&mut self) {
        self.stats.reset_accumulated();
    }

    /// Bytes allocated to clients (`allocated_bytes.all.current`).
    #[inline]
    pub fn memory_allocated(&self) -> u64 {
        self.stats.memory_allocated()
    }

    /// Peak of [`memory_allocated`](Self::memory_allocated).
    pub fn max_memory_allocated(&self) -> u64 {
        self.stats.max_memory_allocated()
    }

    /// Bytes held in segments (`reserved_bytes.all.current`).
    #[inline]
    pub fn memory_reserved(&self) -> u64 {
        self.reserved
    }

    /// Peak of [`memory_reserved`](Self::memory_reserved).
    pub fn max_memory_reserved(&self) -> u64 {
        self.stats.max_memory_reserved()
    }

    /// The live allocation with this id, if it is live.
    pub fn block(&self, id: BlockId) -> Option<Block> {
        let idx = self.resolve(id).ok()??;
        let n = &self.nodes[idx as usize];
        Some(Block {
            id,
            address: n.addr,
            size: n.size,
            requested_size: n.requested,
            stream: self.pools[n.slot as usize].stream,
        })
    }

    /// Size of the largest cached free block, across streams and pools (0 when none): the
    /// largest request the cache can serve without a new segment.
    pub fn largest_free_block(&self) -> u64 {
        self.pools
            .iter()
            .flat_map(|sp| sp.free.iter())
            .filter_map(|set| set.below_rev(u128::MAX).next())
            .map(|(key, _)| (key >> 64) as u64)
            .max()
            .unwrap_or(0)
    }

    /// Number of device segments held: segments allocated whole, plus the address ranges
    /// of expandable segments.
    pub fn segment_count(&self) -> usize {
        self.segments.len() + self.expandable.len()
    }

    /// A text table of the statistics in the spirit of PyTorch's `memory_summary()`.
    pub fn memory_summary(&self) -> String {
        crate::summary::memory_summary(&self.stats, &self.device.name())
    }

    /// The allocator state: every segment with its blocks (address order), the trace (if
    /// enabled) and the settings. Serialises as PyTorch's snapshot dict.
    pub fn snapshot(&self) -> Snapshot {
        let mut heads: HashMap<u64, u32> =
            HashMap::with_capacity(self.segments.len() + self.expandable.len());
        for (i, n) in self.nodes.iter().enumerate() {
            if n.state != NodeState::Vacant && n.prev == NONE {
                heads.insert(n.addr, i as u32);
            }
        }
        let mut segments = Vec::with_capacity(self.segments.len());
        for &addr in self.segments.keys() {
            if let Some(&head) = heads.get(&addr) {
                segments.push(self.segment_info(head, false));
            }
        }
        // An expandable segment is reported as one segment per run of mapped blocks.
        for &base in self.expandable.keys() {
            let mut cur = heads.get(&base).copied().unwrap_or(NONE);
            while cur != NONE {
                let n = &self.nodes[cur as usize];
                if n.state == NodeState::Unmapped {
                    cur = n.next;
                    continue;
                }
                let seg = self.segment_info(cur, true);
                cur = self.nodes[cur as usize].next;
                for _ in 1..seg.blocks.len() {
                    cur = self.nodes[cur as usize].next;
                }
                segments.push(seg);
            }
        }
        if !self.expandable.is_empty() {
            segments.sort_by_key(|s| s.address);
        }
        Snapshot {
            segments,
            device_traces: vec![self.trace.entries().iter().cloned().collect()],
            allocator_settings: Some(AllocatorSettings::from_config(&self.config)),
        }
    }

    /// The segment (or, with `expandable`, the mapped run) starting at block `head`.
    fn segment_info(&self, head: u32, expandable: bool) -> SegmentInfo {
        let hn = &self.nodes[head as usize];
        let mut seg = SegmentInfo {
            device: 0,
            address: hn.addr,
            total_size: 0,
            allocated_size: 0,
            active_size: 0,
            requested_size: 0,
            stream: self.pools[hn.slot as usize].stream,
            segment_type: hn.pool,
            segment_pool_id: (0, 0),
            is_expandable: expandable,
            frames: Vec::new(),
            blocks: Vec::new(),
        };
        let mut cur = head;
        while cur != NONE && self.nodes[cur as usize].state != NodeState::Unmapped {
            let n = &self.nodes[cur as usize];
            let state = match n.state {
                NodeState::Allocated => BlockState::ActiveAllocated,
                NodeState::Pending => BlockState::ActivePendingFree,
                _ => BlockState::Inactive,
            };
            if state == BlockState::ActiveAllocated {
                seg.allocated_size += n.size;
            }
            if state != BlockState::Inactive {
                seg.active_size += n.size;
                seg.requested_size += n.requested;
            }
            seg.total_size += n.size;
            seg.blocks.push(BlockInfo {
                address: n.addr,
                size: n.size,
                requested_size: n.requested,
                state,
                frames: Vec::new(),
                category: self.labels[cur as usize].clone(),
            });
            cur = n.next;
        }
        seg
    }

    // ----------------------------------------------------------------- tracing

    /// Starts recording trace entries, keeping at most `max_entries` (the oldest are dropped;
    /// `None` = unbounded). Entries already recorded are kept (trimmed to the new bound).
    pub fn enable_trace(&mut self, max_entries: Option<usize>) {
        self.trace.enable(max_entries);
    }

    /// Stops recording (recorded entries are kept).
    pub fn disable_trace(&mut self) {
        self.trace.disable();
    }

    /// True while recording.
    pub fn trace_enabled(&self) -> bool {
        self.trace.enabled
    }

    /// The recorded entries, oldest first.
    pub fn trace(&self) -> Vec<TraceEntry> {
        self.trace.entries().iter().cloned().collect()
    }

    /// Removes and returns the recorded entries.
    pub fn take_trace(&mut self) -> Vec<TraceEntry> {
        self.trace.take()
    }

    /// Discards the recorded entries.
    pub fn clear_trace(&mut self) {
        self.trace.clear();
    }

    /// Switches trace times from the logical clock (each entry one tick after the previous) to
    /// caller time: entries from now on carry `time` (e.g. microseconds, a step number) until
    /// the next call. Time never goes backwards: an earlier value is raised to the latest one.
    pub fn set_time(&mut self, time: u64) {
        self.trace.set_time(time);
    }

    /// The current trace time (the latest entry's time, or the caller's last `set_time`).
    pub fn time(&self) -> u64 {
        self.trace.time()
    }
}

impl CachingAllocator<HostDevice> {
    fn host_range(&self, id: BlockId, allow_owned: bool) -> Result<Option<(u64, u64)>, AllocError> {
        let Some(idx) = self.resolve(id)? else {
            return Ok(None);
        };
        let n = &self.nodes[idx as usize];
        if n.raii && !allow_owned {
            return Err(AllocError::OwnedByHandle { sequence: n.seq });
        }
        debug_assert!(self.device.contains(n.addr, n.size));
        Ok(Some((n.addr, n.size)))
    }

    fn slice(&self, id: BlockId, allow_owned: bool) -> Result<&[u8], AllocError> {
        match self.host_range(id, allow_owned)? {
            None => Ok(&[]),
            Some((addr, size)) => {
                // SAFETY: the block is allocated, so `[addr, addr+size)` lies inside a live
                // segment of `self.device` (host memory from `alloc_zeroed`, hence initialised),
                // which is only released through `&mut self`; no other live block overlaps it.
                // The slice borrows `self`, so the block cannot be freed or handed out as `&mut`
                // while it exists.
                Ok(unsafe { std::slice::from_raw_parts(addr as *const u8, size as usize) })
            }
        }
    }

    fn slice_mut(&mut self, id: BlockId, allow_owned: bool) -> Result<&mut [u8], AllocError> {
        match self.host_range(id, allow_owned)? {
            None => Ok(&mut []),
            Some((addr, size)) => {
                // SAFETY: as in `slice`; in addition the slice borrows `self` mutably, so no
                // other slice of this allocator's memory can exist at the same time.
                Ok(unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, size as usize) })
            }
        }
    }

    /// The bytes of a live block (empty for the null block). Blocks owned by an RAII
    /// [`Allocation`](crate::Allocation) are refused ([`AllocError::OwnedByHandle`]); use
    /// [`Allocation::with_bytes`](crate::Allocation::with_bytes) for them; a freed block is
    /// [`AllocError::AlreadyFreed`].
    pub fn block_bytes(&self, id: BlockId) -> Result<&[u8], AllocError> {
        self.slice(id, false)
    }

    /// The bytes of a live block, writable (empty for the null block).
    pub fn block_bytes_mut(&mut self, id: BlockId) -> Result<&mut [u8], AllocError> {
        self.slice_mut(id, false)
    }

    pub(crate) fn owned_block_bytes(&self, id: BlockId) -> Result<&[u8], AllocError> {
        self.slice(id, true)
    }

    pub(crate) fn owned_block_bytes_mut(&mut self, id: BlockId) -> Result<&mut [u8], AllocError> {
        self.slice_mut(id, true)
    }
}

impl<D: DeviceMemory> Drop for CachingAllocator<D> {
    /// Returns every segment to the device (live blocks included: their ids become invalid
    /// together with the allocator).
    fn drop(&mut self) {
        self.drop_expandable();
        for (&addr, &size) in &self.segments {
            let _ = self.device.free(addr, size);
        }
    }
}

#[cfg(test)]
mod expandable_tests;
#[cfg(test)]
mod tests;
