//! # trainmem-alloc
//!
//! A caching device allocator with the semantics of PyTorch's `CUDACachingAllocator`, over any
//! backing device ([`DeviceMemory`]): a fast arithmetic [`SimulatedDevice`], real host memory
//! ([`HostDevice`]), or CUDA (`CudaDevice`, cargo feature `cuda`).
//!
//! ## Quick start
//!
//! ```
//! use trainmem_alloc::{AllocatorConfig, CachingAllocator, SimulatedDevice, StreamId};
//!
//! let config: AllocatorConfig = "max_split_size_mb:128,roundup_power2_divisions:4".parse()?;
//! let mut alloc = CachingAllocator::with_config(SimulatedDevice::new(16 << 30), config);
//! let s = StreamId::DEFAULT;
//!
//! let a = alloc.malloc_labeled(3 << 20, s, "activation")?; // 3 MiB → a 20 MiB segment, split
//! let b = alloc.malloc(1000, s)?;                              // 1000 B → 1024 B, 2 MiB segment
//! assert_eq!(alloc.memory_allocated(), (3 << 20) + 1024);
//! assert_eq!(alloc.memory_reserved(), (20 << 20) + (2 << 20));
//!
//! alloc.free(a.id)?;                       // back to the cache, still reserved
//! let released = alloc.empty_cache()?;     // releases only entirely free segments
//! assert_eq!(released.bytes, 20 << 20);
//! assert_eq!(alloc.memory_stats()["reserved_bytes.all.current"], 2 << 20);
//! alloc.free(b)?;
//!
//! println!("{}", alloc.memory_summary());
//! let snapshot_json = serde_json::to_string(&alloc.snapshot())?; // PyTorch snapshot dict
//! # let _ = snapshot_json;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Thread-safe use with RAII handles goes through [`SharedAllocator`]:
//!
//! ```
//! use trainmem_alloc::{HostDevice, SharedAllocator, StreamId};
//! let alloc = SharedAllocator::new(HostDevice::new(64 << 20));
//! let mut x = alloc.alloc(4096, StreamId::DEFAULT)?;   // freed when `x` is dropped
//! x.with_bytes_mut(|bytes| bytes[0] = 7)?;
//! assert_eq!(x.with_bytes(|bytes| bytes[0])?, 7);
//! # Ok::<(), trainmem_alloc::AllocError>(())
//! ```
//!
//! ## The rules (PyTorch's, byte for byte)
//!
//! * **Rounding** ([`round_size`]): below 512 B → 512 B; otherwise a multiple of 512 B, or the
//!   next of `d` equal steps between powers of two when `roundup_power2_divisions` gives the
//!   size's interval `d > 1` divisions and the size exceeds `512·d`. With 4 divisions,
//!   1200 MiB → 1280 MiB (the power of two below is 1024 MiB, the step 256 MiB), while 1200 B
//!   is not above 512·4 = 2048 B and rounds to a multiple of 512 B, 1536 B:
//!
//!   ```
//!   use trainmem_alloc::{MIB, RoundupPower2Divisions, round_size};
//!   let four = RoundupPower2Divisions::uniform(4);
//!   assert_eq!(round_size(1200 * MIB, &four), Some(1280 * MIB));
//!   assert_eq!(round_size(1200, &four), Some(1536));
//!   ```
//! * **Pools**: rounded sizes ≤ 1 MiB use the small pool, larger ones the large pool.
//! * **Segments** ([`allocation_size`]): 2 MiB for small requests, 20 MiB for requests below
//!   10 MiB, else the size rounded up to 2 MiB.
//! * **Best fit** on the request's stream only: the free block with the smallest
//!   (size, address) at least as large as the request, from a set ordered by
//!   (stream, size, address). With `max_split_size` set, a block ≥ max_split_size is not used
//!   for a smaller request, and an oversize request is not served by a block ≥ request +
//!   `max_non_split_rounding` (20 MiB by default).
//! * **Split**: small pool when the remainder is ≥ 512 B; large pool only when the request is
//!   below max_split_size and the remainder exceeds 1 MiB (a smaller remainder stays inside the
//!   block). The request takes the front. **Merge**: a completed free merges with free
//!   neighbours.
//! * **Out-of-memory ladder** (on a cache miss): (0) garbage collection if enabled; (1) a new
//!   segment; (2) release cached oversize blocks on the stream and retry (only with
//!   max_split_size); (3) complete all pending frees and release every entirely free segment
//!   (like `empty_cache`; counts `num_alloc_retries` and `num_sync_all_streams`) and retry;
//!   (4) [`AllocError::OutOfMemory`] with an [`OutOfMemory`] report whose `Display` is
//!   PyTorch's message for trainmem. **What an OOM changes**: `num_ooms` (+1), an `oom` trace
//!   entry, plus whatever steps 0–3 legitimately did: entirely free cached segments released to
//!   the device (segment/reserved stats, `num_device_free`, `segment_free` trace entries),
//!   pending cross-stream frees completed, `num_alloc_retries` and `num_sync_all_streams`
//!   counted. Live blocks and their statistics never change.
//! * **`empty_cache`** completes pending frees and releases exactly the segments with no
//!   active block, returning [`ReleasedMemory`]. Free parts of segments that still hold a
//!   live block stay and count as `inactive_split` ("non-releasable").
//! * **Garbage collection** (`garbage_collection_threshold`, needs
//!   [`CachingAllocator::set_memory_fraction`]): before allocating a segment, if reserved
//!   memory exceeds threshold × allowed memory, release unsplit large cached blocks whose age
//!   (cache lookups since they were freed) is at least the average, repeating until enough is
//!   reclaimed or nothing more qualifies.
//! * **Expandable segments** (`expandable_segments:True`,
//!   [`AllocatorConfig::with_expandable_segments`]): per stream and pool, one segment
//!   reserves address space for 9/8 of the device and grows by mapping pages (2 MiB in the
//!   small pool, 20 MiB in the large) through [`DeviceMemory::reserve_address_space`] /
//!   [`DeviceMemory::map`] ([`SimulatedDevice`] implements them; [`HostDevice`] and
//!   `CudaDevice` (feature `cuda`) answer [`DeviceError::Unavailable`]). A miss maps just enough whole pages
//!   at the lowest place where free and unmapped blocks together have room (the growing end,
//!   or a hole an unmap left); best fit passes over a block at the growing end when the next
//!   block by size could grow to less; both pools split any remainder of 512 B or more.
//!   `empty_cache` and step 3 of the ladder unmap every whole page inside a free block (at
//!   the end or in the middle; `segment_unmap` trace entries); a segment with nothing mapped
//!   gives its address range back. Reserved bytes are the mapped pages; each mapping and
//!   unmapping counts in `num_device_alloc` / `num_device_free`; expandable segments count
//!   in neither the `segment` nor the `inactive_split` statistics, and the oversize and
//!   garbage-collection rules never release them. Snapshots report each mapped range as a
//!   segment with `is_expandable` set.
//! * **Streams**: a freed block is reused only on its stream. After
//!   [`record_stream`](CachingAllocator::record_stream), a free is *pending*
//!   (`active_pending_free`) until every recorded stream's work is declared complete with
//!   [`synchronize_stream`](CachingAllocator::synchronize_stream) /
//!   [`synchronize`](CachingAllocator::synchronize), or a flush (`empty_cache`, OOM ladder)
//!   waits for all streams.
//!
//! ## Bad input
//!
//! Size 0 returns the null block (address 0, no state change; freeing it is a no-op). A
//! size whose rounding overflows `u64` is [`AllocError::SizeOverflow`]. Double free, stale,
//! foreign or unknown ids and addresses are errors ([`AllocError::DoubleFree`] for a second
//! free, [`AllocError::AlreadyFreed`] for any other use of a freed block,
//! [`AllocError::ForeignBlock`], [`AllocError::UnknownBlock`], [`AllocError::UnknownAddress`]),
//! never corruption: the allocator is unchanged after every error except out-of-memory (see
//! above). Bad configuration strings are [`ConfigError`]s naming the key and value.
//!
//! ## Statistics, snapshots, traces
//!
//! [`MemoryStats`] has PyTorch's stat names and `{all, small_pool, large_pool} ×
//! {current, peak, allocated, freed}`; [`MemoryStats::to_map`] flattens it to
//! `"allocated_bytes.all.current"`-style keys.
//!
//! One model describes a PyTorch memory snapshot, whoever made it: [`Snapshot`] (segments
//! as [`SegmentInfo`] with their [`BlockInfo`]s in a [`BlockState`], one trace of
//! [`TraceEntry`]s per device, each a [`TraceAction`], stacks as [`Frame`]s, and the
//! [`AllocatorSettings`]). [`CachingAllocator::snapshot`] and [`CachingAllocator::trace`]
//! return it; it serialises with the field names of PyTorch's snapshot dict; the pickle
//! reader fills it from PyTorch's files and the replay engine replays it. The allocator
//! records a label as a block's and its events' category, with no stack and no allocation
//! per event.
//!
//! ## PyTorch's formats and replay
//!
//! [`pytorch`] holds PyTorch's memory-snapshot formats in one place: memory_viz pickles read
//! into a [`Snapshot`] and written from one ([`pytorch::pickle`]), and the one replay engine
//! ([`pytorch::replay::Replayer`]) that applies JSON-lines traces, a snapshot's
//! `device_traces`, or a caller's own events to a [`CachingAllocator`] over any device.
//!
//! ## Starting from a given state
//!
//! [`CachingAllocator::from_state`] builds an allocator in a [`SeedState`] (segments with
//! their allocated and cached blocks), refusing with a [`SeedError`] a state the allocator
//! cannot be in. A PyTorch snapshot's recording usually begins part-way through a run;
//! [`pytorch::replay::prepare`] rebuilds the state when it began
//! ([`pytorch::replay::start_state`]), seeds an allocator with it and replays the trace,
//! [`pytorch::replay::verify`] checks the replay against the recording, and
//! [`pytorch::replay::run_scenario`] replays it under another configuration or capacity.
//!
//! ## Threads
//!
//! [`CachingAllocator`] takes `&mut self` (no locking, the fastest form) and is `Send`.
//! [`SharedAllocator`] is `Arc<Mutex<CachingAllocator>>`: `Clone + Send + Sync`.
//!
//! ## Features
//!
//! * `cuda`: `CudaDevice` (cudarc, libcuda loaded at run time).
//! * `proptest`: the `testing` module (strategies, `testing::check_invariants`).

mod allocator;
mod block;
mod config;
#[cfg(feature = "cuda")]
mod cuda;
mod device;
mod error;
mod fast_hash;
mod host;
mod label;
pub mod pytorch;
mod shared;
mod size;
mod snapshot;
mod stats;
mod stream;
mod summary;
mod trace;

#[cfg(any(test, feature = "proptest"))]
pub mod testing;

pub use allocator::{
    CacheFigures, CachingAllocator, ReleasedMemory, SeedBlock, SeedError, SeedSegment, SeedState,
};
pub use block::{Block, BlockId};
pub use config::{
    ALLOC_CONF_ENV_VARS, AllocatorConfig, ConfigError, GreaterThanFill, ROUNDUP_INTERVALS,
    RoundupPower2Divisions,
};
#[cfg(feature = "cuda")]
pub use cuda::CudaDevice;
pub use device::{DeviceError, DeviceMemory, SimulatedDevice};
pub use error::{AllocError, OutOfMemory};
pub use host::HostDevice;
pub use label::Label;
pub use shared::{Allocation, SharedAllocator};
pub use size::{
    LARGE_BUFFER, MIB, MIN_BLOCK_SIZE, MIN_LARGE_ALLOC, PoolKind, ROUND_LARGE, SMALL_BUFFER,
    SMALL_SIZE, allocation_size, format_size, round_size,
};
pub use snapshot::{
    AllocatorSettings, BlockInfo, BlockState, Frame, SegmentInfo, Snapshot, TRAINMEM_FRAME_FILE,
    UNKNOWN_CATEGORY,
};
pub use stats::{MemoryStats, Stat, StatArray};
pub use stream::StreamId;
pub use trace::{TraceAction, TraceEntry};
