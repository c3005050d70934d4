//! Batch buffers: 64-byte-aligned heap blocks, or reusable (optionally page-locked) blocks
//! from a pool.
//!
//! With `reuse_buffers` (the default) or `pin_memory`, batches are built directly in blocks
//! taken from a pool: page aligned, a whole number of pages, and with `pin_memory` locked in RAM
//! with `mlock` so a device copy can DMA from them. A block returns to the pool when its batch is dropped and is reused by a later batch,
//! so the steady state allocates nothing. If `mlock` fails (for example `RLIMIT_MEMLOCK` is
//! low) the block is used unpinned and [`crate::LoaderMemory::pin_failures`] counts it. The
//! CUDA host allocator is not used: trainmem-loader has no CUDA dependency; a device crate can
//! register these blocks with the driver if it needs to.

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use crate::dtype::Element;
use crate::engine::batch_writer::BatchWriter;
use crate::engine::memory::{MemoryCounters, Term};
use crate::engine::pacing::current_cpu;

const PAGE: usize = 4096;
const HEAP_ALIGN: usize = 64;

/// How much of the next part [`BatchBuffer::concat`] (or the next row `copy_rows`) asks the
/// CPU to start loading while it copies the current one: the pages of one typical sample row.
const PREFETCH_AHEAD: usize = 64 * 1024;

/// Hints the CPU to start loading one cache line of each page in the first 64 KiB of `part`.
/// With shuffled samples every row starts on pages whose translations and lines are cold;
/// touching them one row ahead overlaps those misses with the current copy, which raises the
/// copy bandwidth with shuffled rows. No effect on contents. The loader calls it on the next
/// row while it copies the current one; it is public so that a baseline copy can do the same.
#[inline]
pub fn prefetch_pages(part: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        let n = part.len().min(PREFETCH_AHEAD);
        let mut off = 0;
        while off < n {
            // SAFETY: `_mm_prefetch` needs only SSE, part of every x86_64 target's baseline. A
            // prefetch is a hint: it never faults and reads nothing architecturally, and
            // `off < part.len()` keeps the address inside the live slice `part` anyway.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(part.as_ptr().add(off).cast()) };
            off += PAGE;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = part;
}

/// Writes `n` bytes of value `byte` at `dst`: runs of up to 16 bytes (a separator, a short
/// pad) as one or two overlapping stores, longer ones with `write_bytes` (`memset`). A
/// collate writes such short runs for every row, and a `memset` call costs more than the run.
///
/// # Safety
///
/// `dst..dst + n` must be valid for writes.
#[inline]
unsafe fn fill_bytes(dst: *mut u8, byte: u8, n: usize) {
    let w8 = u64::from_ne_bytes([byte; 8]);
    // SAFETY: (every arm) the caller makes `dst..dst + n` writable; each store covers bytes
    // inside it (the second store of a pair ends exactly at `dst + n`), unaligned stores are
    // allowed by `write_unaligned`.
    unsafe {
        match n {
            0 => {}
            1..=3 => {
                dst.write(byte);
                dst.add(n / 2).write(byte);
                dst.add(n - 1).write(byte);
            }
            4..=7 => {
                dst.cast::<u32>().write_unaligned(w8 as u32);
                dst.add(n - 4).cast::<u32>().write_unaligned(w8 as u32);
            }
            8..=16 => {
                dst.cast::<u64>().write_unaligned(w8);
                dst.add(n - 8).cast::<u64>().write_unaligned(w8);
            }
            _ => std::ptr::write_bytes(dst, byte, n),
        }
    }
}

/// Copies `n` bytes from `src` to `dst`: up to 16 bytes (a separator, a short row) as one or
/// two overlapping loads and stores, longer runs with `copy_nonoverlapping` (`memcpy`), whose
/// call costs more than such a short run.
///
/// # Safety
///
/// `src..src + n` must be valid for reads, `dst..dst + n` for writes, and the two must not
/// overlap.
#[inline]
unsafe fn copy_bytes(src: *const u8, dst: *mut u8, n: usize) {
    // SAFETY: (every arm) the caller makes both ranges valid and disjoint; each load and store
    // covers bytes inside them (the second of a pair ends exactly at `n`); unaligned accesses
    // are allowed by `read_unaligned` and `write_unaligned`. Both loads of a pair happen before
    // either store, though with disjoint ranges the order does not matter.
    unsafe {
        if n > 16 {
            // Rows: the common case, tested first.
            return std::ptr::copy_nonoverlapping(src, dst, n);
        }
        match n {
            0 => {}
            1..=3 => {
                let (a, b, c) = (src.read(), src.add(n / 2).read(), src.add(n - 1).read());
                dst.write(a);
                dst.add(n / 2).write(b);
                dst.add(n - 1).write(c);
            }
            4..=7 => {
                let a = src.cast::<u32>().read_unaligned();
                let b = src.add(n - 4).cast::<u32>().read_unaligned();
                dst.cast::<u32>().write_unaligned(a);
                dst.add(n - 4).cast::<u32>().write_unaligned(b);
            }
            // 8..=16.
            _ => {
                let a = src.cast::<u64>().read_unaligned();
                let b = src.add(n - 8).cast::<u64>().read_unaligned();
                dst.cast::<u64>().write_unaligned(a);
                dst.add(n - 8).cast::<u64>().write_unaligned(b);
            }
        }
    }
}

/// Batch buffers smaller than this are never filled with non-temporal (cache-bypassing)
/// stores; a buffer from a pool whose rotation is known streams only when the buffers in
/// rotation would not fit in the last-level cache ([`stream_threshold`]), and a buffer with no
/// pool streams from this size on. Streaming pays when the pool rotates more buffer bytes than
/// the cache holds: ordinary stores would then read every destination line from memory (a
/// write-allocate) only to overwrite it, and evict the rows being read next. When the rotation
/// fits, ordinary stores leave each batch in cache, where the next batch written into the same
/// buffer (and a consumer reading it) finds it: on the 2-CPU benchmark machine, 4 MiB `.npy`
/// batches with 2 workers (5 buffers, 20 MiB, in a 32 MiB cache) went from 0.75 to 0.88–0.91
/// of the copy bound without streaming, while with 4 workers (9 buffers, 36 MiB) streaming
/// stayed ahead (0.79–0.84 against 0.72–0.78).
const STREAM_MIN_BATCH: usize = 1 << 20;

/// The smallest buffer that streams when `rotation` batch buffers take turns and the
/// last-level cache holds `cache` bytes (`None`: not known): the size at which the rotation
/// would fill three quarters of the cache, and never below [`STREAM_MIN_BATCH`].
pub(crate) fn stream_threshold(rotation: usize, cache: Option<usize>) -> usize {
    match cache {
        Some(c) => STREAM_MIN_BATCH.max((c / 4 * 3) / rotation.max(1)),
        None => STREAM_MIN_BATCH,
    }
}

/// The size of the largest data or unified CPU cache, read from
/// `/sys/devices/system/cpu/cpu0/cache` (Linux) once per process; `None` elsewhere or when it
/// cannot be read.
pub(crate) fn last_level_cache_bytes() -> Option<usize> {
    static CACHE: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *CACHE.get_or_init(read_last_level_cache)
}

fn read_last_level_cache() -> Option<usize> {
    let dir = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache").ok()?;
    let mut best: Option<(u32, usize)> = None;
    for entry in dir.flatten() {
        let read = |name: &str| std::fs::read_to_string(entry.path().join(name)).ok();
        let (Some(level), Some(kind), Some(size)) = (read("level"), read("type"), read("size"))
        else {
            continue;
        };
        if let Some(c) = cache_entry(&level, &kind, &size)
            && best.is_none_or(|b| c.0 > b.0)
        {
            best = Some(c);
        }
    }
    best.map(|(_, bytes)| bytes)
}

/// One cache's `(level, bytes)` from its sysfs `level`, `type` and `size` files (`size` as
/// `32768K`, `1M` or bytes); `None` for instruction caches and unreadable values.
fn cache_entry(level: &str, kind: &str, size: &str) -> Option<(u32, usize)> {
    if !matches!(kind.trim(), "Data" | "Unified") {
        return None;
    }
    let level = level.trim().parse().ok()?;
    let size = size.trim();
    let (digits, unit) = match size.char_indices().last()? {
        (i, 'K') => (&size[..i], 1usize << 10),
        (i, 'M') => (&size[..i], 1 << 20),
        (i, 'G') => (&size[..i], 1 << 30),
        _ => (size, 1),
    };
    let bytes = digits.parse::<usize>().ok()?.checked_mul(unit)?;
    Some((level, bytes))
}

/// Parts shorter than this are copied as usual even into a streamed buffer.
const STREAM_MIN_PART: usize = 1024;

/// Copies `n` bytes from `src` to `dst` with non-temporal stores for the 16-byte-aligned body
/// of the destination (ordinary copies for the unaligned head and the tail). The caller must
/// issue a store fence ([`store_fence`]) before the bytes are read by another thread.
///
/// # Safety
///
/// `src` must be valid for `n` bytes of reads, `dst` for `n` bytes of writes, and the two
/// ranges must not overlap.
#[cfg(target_arch = "x86_64")]
unsafe fn copy_streaming(src: *const u8, dst: *mut u8, n: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
    let head = dst.align_offset(32).min(n);
    // SAFETY: (this block and the three below) all offsets stay below `n`, inside both ranges
    // the caller vouches for; `dst + off` is 32-byte aligned after `head` (16-byte aligned is
    // what `_mm_stream_si128` requires); `_mm_loadu_si128` accepts any alignment; SSE2 is part
    // of every x86_64 target's baseline, and AVX is used only where the CPU reports it.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
    let mut off = head;
    if std::arch::is_x86_feature_detected!("avx") {
        // SAFETY: as above; the CPU reports AVX and `dst + off` is 32-byte aligned.
        off += unsafe { stream_avx(src.add(off), dst.add(off), n - off) };
    }
    while off + 16 <= n {
        // SAFETY: as above; `off + 16 <= n` keeps both 16-byte accesses inside the ranges.
        unsafe {
            let v = _mm_loadu_si128(src.add(off).cast::<__m128i>());
            _mm_stream_si128(dst.add(off).cast::<__m128i>(), v);
        }
        off += 16;
    }
    // SAFETY: as above; the tail `off..n` lies inside both ranges.
    unsafe { std::ptr::copy_nonoverlapping(src.add(off), dst.add(off), n - off) };
}

/// The 128-byte steps of [`copy_streaming`] with 32-byte AVX loads and non-temporal stores;
/// returns the bytes copied (a multiple of 128, at most `n`).
///
/// # Safety
///
/// As [`copy_streaming`], with `dst` 32-byte aligned and a CPU that supports AVX.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn stream_avx(src: *const u8, dst: *mut u8, n: usize) -> usize {
    use std::arch::x86_64::{__m256i, _mm256_loadu_si256, _mm256_stream_si256};
    let mut off = 0;
    while off + 128 <= n {
        // SAFETY: `off + 128 <= n` keeps both accesses in range; `dst + off` stays 32-byte
        // aligned (`dst` is, and `off` is a multiple of 128); AVX is enabled for this function
        // and its caller checked the CPU has it.
        unsafe {
            let s = src.add(off).cast::<__m256i>();
            let d = dst.add(off).cast::<__m256i>();
            let (a, b) = (_mm256_loadu_si256(s), _mm256_loadu_si256(s.add(1)));
            let (c, e) = (_mm256_loadu_si256(s.add(2)), _mm256_loadu_si256(s.add(3)));
            _mm256_stream_si256(d, a);
            _mm256_stream_si256(d.add(1), b);
            _mm256_stream_si256(d.add(2), c);
            _mm256_stream_si256(d.add(3), e);
        }
        off += 128;
    }
    off
}

/// Orders the non-temporal stores of [`copy_streaming`] before every later store (the hand-off
/// of the batch to another thread), as they are otherwise weakly ordered.
#[cfg(target_arch = "x86_64")]
fn store_fence() {
    // SAFETY: `sfence` needs only SSE, part of every x86_64 target's baseline; it reads and
    // writes no memory.
    unsafe { std::arch::x86_64::_mm_sfence() };
}

/// A block of raw memory with its layout.
#[derive(Debug)]
struct Block {
    ptr: NonNull<u8>,
    layout: Layout,
    pinned: bool,
    /// The CPU of the thread that last took the block to write a batch into it
    /// (`usize::MAX`: not known).
    cpu: usize,
}

// SAFETY: a `Block` exclusively owns its allocation (no aliasing pointers are kept anywhere
// else), so moving it to another thread is sound.
unsafe impl Send for Block {}

impl Block {
    /// A block of `size` bytes; zeroed when `zeroed`, otherwise uninitialised (the caller must
    /// initialise every byte it later exposes).
    fn alloc(size: usize, align: usize, zeroed: bool) -> Option<Block> {
        let layout = Layout::from_size_align(size.max(1), align).ok()?;
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe {
            if zeroed {
                std::alloc::alloc_zeroed(layout)
            } else {
                std::alloc::alloc(layout)
            }
        };
        let ptr = NonNull::new(raw)?;
        Some(Block {
            ptr,
            layout,
            pinned: false,
            cpu: usize::MAX,
        })
    }

    fn lock(&mut self) -> bool {
        #[cfg(unix)]
        {
            // SAFETY: `ptr..ptr+size` is a live allocation owned by this block; mlock only
            // changes residency, not contents. The block is page-aligned and page-sized, so no
            // other allocation shares its pages.
            let rc = unsafe { libc::mlock(self.ptr.as_ptr().cast(), self.layout.size()) };
            self.pinned = rc == 0;
        }
        self.pinned
    }

    fn free(self) {
        #[cfg(unix)]
        if self.pinned {
            // SAFETY: the range was locked by `lock` on this same live allocation.
            unsafe { libc::munlock(self.ptr.as_ptr().cast(), self.layout.size()) };
        }
        // SAFETY: `ptr` was allocated by `Block::alloc` with exactly this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

/// The pool of staging blocks of one loader.
#[derive(Debug)]
pub(crate) struct StagingPool {
    pin: bool,
    idle: Mutex<Vec<Block>>,
    max_idle: usize,
    memory: Arc<MemoryCounters>,
    /// Buffers at least this large are written with non-temporal stores.
    stream_min: usize,
}

impl StagingPool {
    pub(crate) fn new(pin: bool, max_idle: usize, memory: Arc<MemoryCounters>) -> StagingPool {
        StagingPool {
            pin,
            idle: Mutex::new(Vec::new()),
            max_idle,
            memory,
            stream_min: STREAM_MIN_BATCH,
        }
    }

    /// This pool with `rotation` batch buffers taking turns (the batches in flight and the one
    /// the caller holds): buffers stream only from [`stream_threshold`] for this machine's
    /// last-level cache.
    pub(crate) fn with_rotation(mut self, rotation: usize) -> StagingPool {
        self.stream_min = stream_threshold(rotation, last_level_cache_bytes());
        self
    }

    fn take(&self, size: usize) -> Option<Block> {
        let rounded = size.max(1).div_ceil(PAGE) * PAGE;
        let here = current_cpu().unwrap_or(usize::MAX);
        {
            let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            let best = best_idle(&idle, rounded, here);
            if let Some(i) = best {
                // `remove`, not `swap_remove`: keeps the return order (the list is short).
                let mut b = idle.remove(i);
                self.memory.sub(Term::StagingIdle, b.layout.size());
                b.cpu = here;
                return Some(b);
            }
        }
        // Uninitialised: `BatchBuffer` initialises the bytes it exposes (zeroing or copying).
        let mut b = Block::alloc(rounded, PAGE, false)?;
        b.cpu = here;
        self.memory.add(Term::Staging, rounded);
        if self.pin {
            if b.lock() {
                self.memory.add(Term::StagingPinned, rounded);
            } else {
                self.memory.add(Term::PinFailures, 1);
            }
        }
        Some(b)
    }

    fn give_back(&self, b: Block) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < self.max_idle {
            self.memory.add(Term::StagingIdle, b.layout.size());
            idle.push(b);
        } else {
            drop(idle);
            self.release(b);
        }
    }

    fn release(&self, b: Block) {
        self.memory.sub(Term::Staging, b.layout.size());
        if b.pinned {
            self.memory.sub(Term::StagingPinned, b.layout.size());
        }
        b.free();
    }
}

/// The idle block to hand to a thread on CPU `here` for a buffer of `rounded` bytes: the
/// best fit among the blocks last written on `here` that are at least that large and less than
/// twice it, or else the best fit among all the blocks at least that large; among equal fits
/// the most recently returned (`idle` is kept in return order).
///
/// A block written on this CPU is likely still in this CPU's own cache (its L2), so the batch
/// written into it next stays there; a block last written on another CPU has its lines dirty in
/// that CPU's cache, and every line written here must first be fetched from there. Without the
/// preference, with several workers the blocks hop between CPUs on nearly every batch (the most
/// recently returned one was usually written by another worker), and collates whose batches
/// differ in size from batch to batch (padding to the longest row, packing) would rarely find
/// an equal fit on their own CPU: hence the range up to twice the size, which keeps a block far
/// larger than the batch for batches that need it. Among blocks with no CPU preference the most
/// recently returned one wins, for the same reason: a block written a few batches ago has been
/// evicted by the sample reads since, and taking the oldest instead rotates through every idle
/// block, which lowers the copy bandwidth measurably.
fn best_idle(idle: &[Block], rounded: usize, here: usize) -> Option<usize> {
    let fits = |b: &Block| b.layout.size() >= rounded;
    let near = |b: &Block| b.cpu == here && b.layout.size() / 2 < rounded;
    let best = |keep: &dyn Fn(&Block) -> bool| {
        idle.iter()
            .enumerate()
            .rev()
            .filter(|(_, b)| fits(b) && keep(b))
            .min_by_key(|(_, b)| b.layout.size())
            .map(|(i, _)| i)
    };
    best(&near).or_else(|| best(&|_| true))
}

impl Drop for StagingPool {
    fn drop(&mut self) {
        let idle = std::mem::take(self.idle.get_mut().unwrap_or_else(|p| p.into_inner()));
        for b in idle {
            self.memory.sub(Term::StagingIdle, b.layout.size());
            self.release(b);
        }
    }
}

/// A batch's byte buffer: `len` initialised (zeroed at allocation) bytes, 64-byte aligned on
/// the heap or page aligned in staging, so typed views of any numeric dtype are aligned.
#[derive(Debug)]
pub struct BatchBuffer {
    block: Option<Block>,
    len: usize,
    pool: Option<Arc<StagingPool>>,
}

impl BatchBuffer {
    /// A zeroed heap buffer of `len` bytes. Panics only if the allocation itself fails.
    pub fn heap(len: usize) -> BatchBuffer {
        BatchBuffer::heap_block(len, true)
    }

    fn heap_block(len: usize, zeroed: bool) -> BatchBuffer {
        let block = if len == 0 {
            None
        } else {
            Some(Block::alloc(len, HEAP_ALIGN, zeroed).unwrap_or_else(|| {
                std::alloc::handle_alloc_error(
                    Layout::from_size_align(len, HEAP_ALIGN).unwrap_or(Layout::new::<u8>()),
                )
            }))
        };
        BatchBuffer {
            block,
            len,
            pool: None,
        }
    }

    /// A staging buffer whose `len` bytes are zeroed.
    pub(crate) fn staged(pool: &Arc<StagingPool>, len: usize) -> BatchBuffer {
        let buf = BatchBuffer::staged_uninit(pool, len);
        if let Some(b) = &buf.block {
            // SAFETY: the block holds at least `len` bytes, exclusively owned by `buf`.
            unsafe { std::ptr::write_bytes(b.ptr.as_ptr(), 0, len) };
        }
        buf
    }

    /// A staging buffer whose bytes are not yet initialised; callers must initialise all
    /// `len` bytes before exposing them (see [`BatchBuffer::concat`]).
    fn staged_uninit(pool: &Arc<StagingPool>, len: usize) -> BatchBuffer {
        if len == 0 {
            return BatchBuffer::heap(0);
        }
        match pool.take(len) {
            Some(block) => BatchBuffer {
                block: Some(block),
                len,
                pool: Some(Arc::clone(pool)),
            },
            None => BatchBuffer::heap(len),
        }
    }

    /// A buffer of `len` bytes whose bytes are not yet initialised, from `pool` or the heap;
    /// only [`BatchWriter`] uses it, and it initialises every byte before handing it out.
    pub(crate) fn uninit(pool: Option<&Arc<StagingPool>>, len: usize) -> BatchBuffer {
        match pool {
            Some(p) => BatchBuffer::staged_uninit(p, len),
            None => BatchBuffer::heap_block(len, false),
        }
    }

    /// Whether this buffer is written with non-temporal stores: large enough for its pool's
    /// rotation, or at least [`STREAM_MIN_BATCH`] without a pool.
    pub(crate) fn streams(&self) -> bool {
        let min = self
            .pool
            .as_ref()
            .map_or(STREAM_MIN_BATCH, |p| p.stream_min);
        cfg!(target_arch = "x86_64") && self.len >= min
    }

    /// Copies `part` to byte `off` (with non-temporal stores when `stream` and the part is
    /// long enough; [`Self::finish_at`] then fences them).
    ///
    /// # Safety
    ///
    /// `off + part.len() <= self.len()`, and `part` must not lie inside this buffer.
    #[inline(always)]
    pub(crate) unsafe fn write_at(&mut self, off: usize, part: &[u8], stream: bool) {
        let Some(b) = &self.block else { return };
        let n = part.len();
        debug_assert!(off + n <= self.len);
        // SAFETY: the caller keeps `off + n` within the block's `len` bytes and `part` outside
        // it; the block is owned by `self`, borrowed exclusively.
        unsafe {
            let dst = b.ptr.as_ptr().add(off);
            #[cfg(target_arch = "x86_64")]
            if stream && n >= STREAM_MIN_PART {
                copy_streaming(part.as_ptr(), dst, n);
                return;
            }
            let _ = stream;
            copy_bytes(part.as_ptr(), dst, n);
        }
    }

    /// Writes `n` bytes of value `byte` from byte `off`.
    ///
    /// # Safety
    ///
    /// `off + n <= self.len()`.
    #[inline(always)]
    pub(crate) unsafe fn fill_at(&mut self, off: usize, byte: u8, n: usize) {
        let Some(b) = &self.block else { return };
        debug_assert!(off + n <= self.len);
        // SAFETY: the caller keeps the range within the block's `len` bytes.
        unsafe { fill_bytes(b.ptr.as_ptr().add(off), byte, n) };
    }

    /// Copies the `n` bytes at `from` to `to`, within this buffer.
    ///
    /// # Safety
    ///
    /// `[from, from + n)` must be initialised, both ranges within `self.len()` bytes, and the
    /// two must not overlap.
    pub(crate) unsafe fn copy_within_at(&mut self, from: usize, to: usize, n: usize) {
        let Some(b) = &self.block else { return };
        debug_assert!(from + n <= to && to + n <= self.len);
        // SAFETY: the caller vouches for both ranges; they are within one live block.
        unsafe {
            let p = b.ptr.as_ptr();
            std::ptr::copy_nonoverlapping(p.add(from), p.add(to), n);
        }
    }

    /// Fences the non-temporal stores (when `stream`) and zeroes bytes `off..len`, after which
    /// every byte is initialised.
    ///
    /// # Safety
    ///
    /// `off <= self.len()`.
    pub(crate) unsafe fn finish_at(&mut self, off: usize, stream: bool) {
        #[cfg(target_arch = "x86_64")]
        if stream {
            store_fence();
        }
        let _ = stream;
        let len = self.len;
        // SAFETY: `off <= len` by the caller's promise.
        unsafe { self.fill_at(off, 0, len - off) };
    }

    /// A buffer of `len` bytes holding `parts` back to back (bytes past the last part are
    /// zeroed; parts beyond `len` are cut). One pass over the memory: no zeroing first. While
    /// a part is copied the next one's pages are hinted ([`prefetch_pages`]).
    pub(crate) fn concat<'a>(
        pool: Option<&Arc<StagingPool>>,
        len: usize,
        parts: impl IntoIterator<Item = &'a [u8]>,
    ) -> BatchBuffer {
        let mut w = BatchWriter::new(pool, len);
        let mut parts = parts.into_iter().peekable();
        while let Some(part) = parts.next() {
            if let Some(next) = parts.peek() {
                prefetch_pages(next);
            }
            w.copy(part);
        }
        w.finish()
    }

    /// Number of bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes of memory it holds (its block size, at least `len`).
    pub fn capacity(&self) -> usize {
        self.block.as_ref().map_or(0, |b| b.layout.size())
    }

    /// Whether the memory is page-locked.
    pub fn is_pinned(&self) -> bool {
        self.block.as_ref().is_some_and(|b| b.pinned)
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        match &self.block {
            // SAFETY: the block holds at least `len` initialised (zeroed or written) bytes and
            // is exclusively owned by `self`, borrowed shared here.
            Some(b) => unsafe { std::slice::from_raw_parts(b.ptr.as_ptr(), self.len) },
            None => &[],
        }
    }

    /// The bytes, mutably.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        match &mut self.block {
            // SAFETY: as in `as_bytes`, borrowed exclusively through `&mut self`.
            Some(b) => unsafe { std::slice::from_raw_parts_mut(b.ptr.as_ptr(), self.len) },
            None => &mut [],
        }
    }

    /// A typed view (the buffer is aligned for every numeric type; `None` when `len` is not a
    /// multiple of the element size).
    pub fn typed<T: Element>(&self) -> Option<&[T]> {
        bytemuck::try_cast_slice(self.as_bytes()).ok()
    }

    /// A typed mutable view.
    pub fn typed_mut<T: Element>(&mut self) -> Option<&mut [T]> {
        bytemuck::try_cast_slice_mut(self.as_bytes_mut()).ok()
    }
}

impl Drop for BatchBuffer {
    fn drop(&mut self) {
        if let Some(b) = self.block.take() {
            match &self.pool {
                Some(pool) => pool.give_back(b),
                None => b.free(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An idle block of `pages` pages last written on `cpu`.
    fn idle_block(pages: usize, cpu: usize) -> Block {
        let mut b = Block::alloc(pages * PAGE, PAGE, false).expect("a small allocation");
        b.cpu = cpu;
        b
    }

    #[test]
    fn idle_blocks_go_back_to_the_cpu_that_wrote_them() {
        // Return order: oldest first.
        let idle = vec![
            idle_block(4, 0), // 0
            idle_block(4, 1), // 1
            idle_block(6, 0), // 2
            idle_block(2, 1), // 3
            idle_block(4, 1), // 4
            idle_block(9, 2), // 5
        ];
        let page = |n: usize| n * PAGE;
        // An equal fit on this CPU beats a more recent one from another CPU.
        assert_eq!(best_idle(&idle, page(4), 0), Some(0));
        // Among equal fits on this CPU, the most recently returned.
        assert_eq!(best_idle(&idle, page(4), 1), Some(4));
        // A block on this CPU less than twice the size beats an exact fit elsewhere ...
        assert_eq!(best_idle(&idle, page(4) - 100, 0), Some(0));
        assert_eq!(best_idle(&idle, page(5), 0), Some(2));
        assert_eq!(best_idle(&idle, page(3), 0), Some(0));
        // ... but not one twice the size or more: then the best fit anywhere.
        assert_eq!(best_idle(&idle, page(2), 0), Some(3));
        assert_eq!(best_idle(&idle, page(2), 1), Some(3));
        // A CPU with no blocks, or an unknown CPU: best fit, most recent first.
        assert_eq!(best_idle(&idle, page(4), 7), Some(4));
        assert_eq!(best_idle(&idle, page(1), usize::MAX), Some(3));
        assert_eq!(best_idle(&idle, page(7), 0), Some(5));
        // Nothing large enough.
        assert_eq!(best_idle(&idle, page(10), 2), None);
        assert_eq!(best_idle(&[], page(1), 0), None);
        for b in idle {
            b.free();
        }
    }

    #[test]
    fn a_taken_block_is_marked_with_the_takers_cpu() {
        let mem = Arc::new(MemoryCounters::default());
        let pool = Arc::new(StagingPool::new(false, 4, mem));
        let a = BatchBuffer::uninit(Some(&pool), 3 * PAGE);
        let cpu = a.block.as_ref().map(|b| b.cpu);
        #[cfg(target_os = "linux")]
        assert!(cpu.is_some_and(|c| c != usize::MAX), "{cpu:?}");
        drop(a);
        // Back in the pool, and handed out again with the same mark.
        let b = BatchBuffer::uninit(Some(&pool), 3 * PAGE);
        let again = b.block.as_ref().map(|b| b.cpu);
        assert!(again.is_some());
        #[cfg(not(target_os = "linux"))]
        assert_eq!(again, Some(usize::MAX));
    }

    #[test]
    fn buffers_stream_only_when_the_rotation_outgrows_the_cache() {
        let mib = 1usize << 20;
        // 32 MiB of cache: 24 MiB of rotating buffers before streaming pays.
        assert_eq!(stream_threshold(5, Some(32 * mib)), 24 * mib / 5);
        assert!(
            stream_threshold(5, Some(32 * mib)) > 4 * mib,
            "5 × 4 MiB fit"
        );
        assert!(
            stream_threshold(9, Some(32 * mib)) < 4 * mib,
            "9 × 4 MiB do not"
        );
        // Never below the floor, and the floor alone when the cache is unknown.
        assert_eq!(stream_threshold(1000, Some(32 * mib)), STREAM_MIN_BATCH);
        assert_eq!(
            stream_threshold(0, Some(2 * mib)),
            STREAM_MIN_BATCH.max(3 * mib / 2)
        );
        assert_eq!(stream_threshold(3, None), STREAM_MIN_BATCH);
        // The pool's rule decides for its buffers.
        let mem = Arc::new(MemoryCounters::default());
        let pool = Arc::new(StagingPool::new(false, 4, mem).with_rotation(3));
        let want = stream_threshold(3, last_level_cache_bytes());
        let below = BatchBuffer::uninit(Some(&pool), want - 4096);
        let at = BatchBuffer::uninit(Some(&pool), want);
        assert!(!below.streams());
        assert_eq!(at.streams(), cfg!(target_arch = "x86_64"));
        assert_eq!(
            BatchBuffer::uninit(None, STREAM_MIN_BATCH).streams(),
            cfg!(target_arch = "x86_64")
        );
    }

    #[test]
    fn cache_sizes_are_read_from_sysfs_text() {
        assert_eq!(
            cache_entry("3\n", "Unified\n", "32768K\n"),
            Some((3, 32 << 20))
        );
        assert_eq!(cache_entry("2", "Unified", "1M"), Some((2, 1 << 20)));
        assert_eq!(cache_entry("1", "Data", "49152"), Some((1, 49152)));
        assert_eq!(cache_entry("1", "Instruction", "32K"), None);
        assert_eq!(cache_entry("x", "Data", "32K"), None);
        assert_eq!(cache_entry("1", "Data", "lots"), None);
        assert_eq!(cache_entry("1", "Data", ""), None);
        #[cfg(target_os = "linux")]
        if let Some(c) = last_level_cache_bytes() {
            assert!(c >= 64 << 10, "a last-level cache of {c} bytes");
        }
    }

    #[test]
    fn short_and_long_fills_write_exactly_their_bytes() {
        for n in 0..=40 {
            for at in 0..8 {
                let mut buf = [0xEEu8; 64];
                // SAFETY: `at + n <= 48 < 64`, inside `buf`.
                unsafe { fill_bytes(buf.as_mut_ptr().add(at), 0x5A, n) };
                for (i, &x) in buf.iter().enumerate() {
                    let want = if (at..at + n).contains(&i) {
                        0x5A
                    } else {
                        0xEE
                    };
                    assert_eq!(x, want, "n {n}, at {at}, byte {i}");
                }
            }
        }
    }

    #[test]
    fn short_and_long_copies_write_exactly_their_bytes() {
        let src: Vec<u8> = (1..=64).collect();
        for n in 0..=40 {
            for from in 0..8 {
                for at in 0..8 {
                    let mut buf = [0xEEu8; 64];
                    // SAFETY: `from + n <= 48 <= 64` inside `src`, `at + n <= 48 < 64` inside
                    // `buf`; two different arrays do not overlap.
                    unsafe { copy_bytes(src.as_ptr().add(from), buf.as_mut_ptr().add(at), n) };
                    for (i, &x) in buf.iter().enumerate() {
                        let want = if (at..at + n).contains(&i) {
                            src[from + i - at]
                        } else {
                            0xEE
                        };
                        assert_eq!(x, want, "n {n}, from {from}, at {at}, byte {i}");
                    }
                }
            }
        }
    }

    #[test]
    fn heap_buffers_are_aligned_and_zeroed() {
        let mut b = BatchBuffer::heap(1004);
        assert_eq!(b.as_bytes().as_ptr() as usize % 64, 0);
        assert!(b.as_bytes().iter().all(|&x| x == 0));
        b.typed_mut::<f32>().expect("1004 = 251 f32")[3] = 2.5;
        assert_eq!(b.typed::<f32>().expect("view")[3], 2.5);
        assert!(b.typed::<f64>().is_none());
        assert!(BatchBuffer::heap(0).is_empty());
    }

    #[test]
    fn concat_fills_every_byte_and_reused_blocks_are_zeroed() {
        let mem = Arc::new(MemoryCounters::default());
        let pool = Arc::new(StagingPool::new(false, 4, Arc::clone(&mem)));
        for p in [None, Some(&pool)] {
            let b = BatchBuffer::concat(p, 10, [&[1u8, 2, 3][..], &[4, 5], &[6, 7, 8, 9, 10, 11]]);
            assert_eq!(b.as_bytes(), &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
            let short = BatchBuffer::concat(p, 6, [&[9u8, 9][..]]);
            assert_eq!(short.as_bytes(), &[9, 9, 0, 0, 0, 0]);
        }
        // A block that held data comes back zeroed through `staged`.
        let dirty = BatchBuffer::concat(Some(&pool), 4096, [&[0xFFu8; 4096][..]]);
        drop(dirty);
        let clean = BatchBuffer::staged(&pool, 4096);
        assert!(clean.as_bytes().iter().all(|&x| x == 0));
        assert_eq!(
            mem.current().pin_failures,
            0,
            "unpinned pools never try to pin"
        );
    }

    #[test]
    fn prefetch_hint_leaves_data_alone() {
        // Empty, sub-page, unaligned and longer-than-the-window slices: only hints, no change.
        let data: Vec<u8> = (0..3 * PREFETCH_AHEAD).map(|i| (i % 251) as u8).collect();
        for part in [&data[..0], &data[5..100], &data[1..], &data[..]] {
            prefetch_pages(part);
        }
        assert!(data.iter().enumerate().all(|(i, &x)| x == (i % 251) as u8));
        // Parts that each get the next one prefetched still land back to back.
        let rows: Vec<&[u8]> = data.chunks(PAGE + 3).collect();
        let b = BatchBuffer::concat(None, data.len(), rows.iter().copied());
        assert_eq!(b.as_bytes(), &data[..]);
    }

    #[test]
    fn streamed_batches_are_byte_exact() {
        // A batch above the streaming threshold, from parts of odd lengths at odd source
        // offsets (unaligned heads and tails, parts below and above the per-part threshold),
        // and a short fill so the zeroed tail is exercised too.
        let data: Vec<u8> = (0..STREAM_MIN_BATCH + 300_000)
            .map(|i| (i % 253) as u8)
            .collect();
        let cuts = [3usize, 1000, 1023, 1024, 4099, 70_001, 65_536, 17, 300_000];
        let mut parts = Vec::new();
        let mut at = 1;
        for n in cuts.iter().cycle().take(40) {
            if at + n > data.len() {
                break;
            }
            parts.push(&data[at..at + n]);
            at += n;
        }
        let want: Vec<u8> = parts.concat();
        let len = want.len() + 333;
        assert!(len >= STREAM_MIN_BATCH, "{len}");
        let mem = Arc::new(MemoryCounters::default());
        let pool = Arc::new(StagingPool::new(false, 4, Arc::clone(&mem)));
        for p in [None, Some(&pool)] {
            let b = BatchBuffer::concat(p, len, parts.iter().copied());
            assert_eq!(&b.as_bytes()[..want.len()], &want[..]);
            assert!(b.as_bytes()[want.len()..].iter().all(|&x| x == 0));
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn streaming_copy_handles_every_alignment() {
        // Every head misalignment, with lengths around the 16- and 128-byte steps.
        let data: Vec<u8> = (0..8192).map(|i| (i % 253) as u8).collect();
        for shift in 0..40 {
            for n in [0, 1, 15, 16, 31, 127, 128, 129, 300, 4096 + 5] {
                let mut out = vec![0xAAu8; n + 80];
                let src = &data[7 + shift..7 + shift + n];
                // SAFETY: `src` holds `n` bytes, `out[shift..]` at least `n`, and they are
                // separate allocations.
                unsafe { copy_streaming(src.as_ptr(), out.as_mut_ptr().add(shift), n) };
                store_fence();
                assert_eq!(&out[shift..shift + n], src, "shift {shift}, {n} bytes");
                assert!(out[..shift].iter().all(|&x| x == 0xAA));
                assert!(out[shift + n..].iter().all(|&x| x == 0xAA));
            }
        }
    }

    #[test]
    fn idle_blocks_are_taken_most_recent_first() {
        let mem = Arc::new(MemoryCounters::default());
        let pool = Arc::new(StagingPool::new(false, 8, Arc::clone(&mem)));
        let a = BatchBuffer::staged(&pool, 4096);
        let b = BatchBuffer::staged(&pool, 4096);
        let c = BatchBuffer::staged(&pool, 4096);
        let (pa, pb, pc) = (
            a.as_bytes().as_ptr(),
            b.as_bytes().as_ptr(),
            c.as_bytes().as_ptr(),
        );
        drop(a);
        drop(c);
        drop(b);
        // Equal fits come back in reverse return order, so a hot block is reused first.
        let x = BatchBuffer::staged(&pool, 4096);
        assert_eq!(x.as_bytes().as_ptr(), pb);
        let y = BatchBuffer::staged(&pool, 4096);
        assert_eq!(y.as_bytes().as_ptr(), pc);
        drop(y);
        let z = BatchBuffer::staged(&pool, 4096);
        assert_eq!(z.as_bytes().as_ptr(), pc);
        let w = BatchBuffer::staged(&pool, 4096);
        assert_eq!(w.as_bytes().as_ptr(), pa);
    }

    #[test]
    fn staging_blocks_are_reused_and_accounted() {
        let mem = Arc::new(MemoryCounters::default());
        let pool = Arc::new(StagingPool::new(true, 2, Arc::clone(&mem)));
        let a = BatchBuffer::staged(&pool, 5000);
        assert_eq!(a.capacity(), 8192);
        assert_eq!(a.as_bytes().as_ptr() as usize % PAGE, 0);
        let m = mem.current();
        assert_eq!(m.staging, 8192);
        // Pinned or a counted failure, never silent.
        assert_eq!(m.staging_pinned + m.pin_failures * 8192, 8192, "{m:?}");
        assert_eq!(a.is_pinned(), m.staging_pinned == 8192);
        let ptr = a.as_bytes().as_ptr();
        drop(a);
        assert_eq!(mem.current().staging_idle, 8192);
        let b = BatchBuffer::staged(&pool, 6000);
        assert_eq!(b.as_bytes().as_ptr(), ptr, "reused");
        assert_eq!(mem.current().staging_idle, 0);
        let c = BatchBuffer::staged(&pool, 100);
        let d = BatchBuffer::staged(&pool, 100);
        let e = BatchBuffer::staged(&pool, 100);
        assert_eq!(mem.current().staging, 8192 + 3 * 4096);
        drop((b, c, d, e));
        // Only two stay idle; the rest are freed.
        let m = mem.current();
        assert_eq!(m.staging_idle, m.staging);
        assert!(m.staging <= 8192 + 4096);
        drop(pool);
        let m = mem.current();
        assert_eq!((m.staging, m.staging_idle, m.staging_pinned), (0, 0, 0));
    }
}
