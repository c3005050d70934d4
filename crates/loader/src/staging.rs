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

use crate::batch_writer::BatchWriter;
use crate::dtype::Element;
use crate::memory::{MemoryCounters, Term};

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

/// Batch buffers at least this large are filled with non-temporal (cache-bypassing) stores.
/// A batch this size is not read back from cache before it is handed out, and the pool
/// rotates several such buffers (one per batch in flight), so ordinary stores would first read
/// every destination line from memory (a write-allocate) only to overwrite it, and evict the
/// rows being read next. Smaller batches, which fit in cache, are copied as usual.
const STREAM_MIN_BATCH: usize = 1 << 20;

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
    // SAFETY (every block below): all offsets stay below `n`, inside both ranges the caller
    // vouches for; `dst + off` is 32-byte aligned after `head` (16-byte aligned is what
    // `_mm_stream_si128` requires); `_mm_loadu_si128` accepts any alignment; SSE2 is part of
    // every x86_64 target's baseline, and AVX is used only where the CPU reports it.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
    let mut off = head;
    if std::arch::is_x86_feature_detected!("avx") {
        off += unsafe { stream_avx(src.add(off), dst.add(off), n - off) };
    }
    while off + 16 <= n {
        unsafe {
            let v = _mm_loadu_si128(src.add(off).cast::<__m128i>());
            _mm_stream_si128(dst.add(off).cast::<__m128i>(), v);
        }
        off += 16;
    }
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
}

impl StagingPool {
    pub(crate) fn new(pin: bool, max_idle: usize, memory: Arc<MemoryCounters>) -> StagingPool {
        StagingPool {
            pin,
            idle: Mutex::new(Vec::new()),
            max_idle,
            memory,
        }
    }

    fn take(&self, size: usize) -> Option<Block> {
        let rounded = size.max(1).div_ceil(PAGE) * PAGE;
        {
            let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            // Best fit among idle blocks at least as large; among equal fits the most recently
            // returned one (`idle` is kept in return order), whose lines are most likely still
            // in cache: a batch is written into it right away, and a block written a few
            // batches ago has been evicted by the sample reads since. Taking the oldest instead
            // rotates through every idle block, which lowers the copy bandwidth measurably.
            let best = idle
                .iter()
                .enumerate()
                .rev()
                .filter(|(_, b)| b.layout.size() >= rounded)
                .min_by_key(|(_, b)| b.layout.size())
                .map(|(i, _)| i);
            if let Some(i) = best {
                // `remove`, not `swap_remove`: keeps the return order (the list is short).
                let b = idle.remove(i);
                self.memory.sub(Term::StagingIdle, b.layout.size());
                return Some(b);
            }
        }
        // Uninitialised: `BatchBuffer` initialises the bytes it exposes (zeroing or copying).
        let mut b = Block::alloc(rounded, PAGE, false)?;
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

    /// Whether this buffer is large enough to be written with non-temporal stores.
    pub(crate) fn streams(&self) -> bool {
        cfg!(target_arch = "x86_64") && self.len >= STREAM_MIN_BATCH
    }

    /// Copies `part` to byte `off` (with non-temporal stores when `stream` and the part is
    /// long enough; [`Self::finish_at`] then fences them).
    ///
    /// # Safety
    ///
    /// `off + part.len() <= self.len()`, and `part` must not lie inside this buffer.
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
            std::ptr::copy_nonoverlapping(part.as_ptr(), dst, n);
        }
    }

    /// Writes `n` bytes of value `byte` from byte `off`.
    ///
    /// # Safety
    ///
    /// `off + n <= self.len()`.
    pub(crate) unsafe fn fill_at(&mut self, off: usize, byte: u8, n: usize) {
        let Some(b) = &self.block else { return };
        debug_assert!(off + n <= self.len);
        // SAFETY: the caller keeps the range within the block's `len` bytes.
        unsafe { std::ptr::write_bytes(b.ptr.as_ptr().add(off), byte, n) };
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
