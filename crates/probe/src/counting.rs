//! [`CountingAlloc`]: a global allocator that keeps live bytes per [`Category`].
//!
//! Every block handed out carries a one-byte category tag in a small header placed just before
//! the pointer the program sees. The tag is the allocating thread's category (see
//! [`crate::set_thread_category`]) at the moment of allocation; deallocation reads the tag back
//! and decrements that same category, whichever thread frees the block. A `realloc` moves the
//! whole block to the category of the thread that reallocates it: the old category loses the
//! old size and the current one gains the new size.
//!
//! Counts are the sizes the program asked for (`Layout::size`). The header (at least 8 bytes,
//! or the requested alignment when that is larger) and the system allocator's own overhead are
//! not counted.
//!
//! The counters are process-wide atomics, so the readers ([`live_bytes`], [`snapshot`], ...)
//! are free functions. They read zero until a binary installs the allocator:
//!
//! ```ignore
//! #[global_allocator]
//! static ALLOC: trainmem_probe::CountingAlloc = trainmem_probe::CountingAlloc::new();
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};

use serde::{Deserialize, Serialize};

use crate::tag::{category_from_u8, current_tag_byte, in_backend};
use trainmem_core::Category;

/// Number of categories.
const N: usize = Category::ALL.len();

/// Smallest header in front of each block; the tag byte is its last byte.
const HEADER: usize = 8;

/// Bit of the tag byte set on a block handed to a device backend ([`mark_handed_to_device`]);
/// the low bits keep the category.
const HANDED: u8 = 0x80;

/// Bit of the tag byte set on a block allocated inside a backend op ([`crate::BackendScope`]).
const BACKEND: u8 = 0x40;

/// The bits of the tag byte that hold the category.
const CATEGORY_BITS: u8 = 0x3f;

/// The slot of a tag byte's category.
fn slot(tag: u8) -> usize {
    usize::from(tag & CATEGORY_BITS).min(N - 1)
}

/// The tag a block allocated now carries: the thread's category, and whether it is inside a
/// backend op.
fn block_tag() -> u8 {
    let tag = current_tag_byte();
    if in_backend() { tag | BACKEND } else { tag }
}

static LIVE: [AtomicUsize; N] = [const { AtomicUsize::new(0) }; N];
static PEAK: [AtomicUsize; N] = [const { AtomicUsize::new(0) }; N];
static ALLOCATED: [AtomicU64; N] = [const { AtomicU64::new(0) }; N];
static COUNT: [AtomicU64; N] = [const { AtomicU64::new(0) }; N];
static HANDED_LIVE: [AtomicUsize; N] = [const { AtomicUsize::new(0) }; N];
static BACKEND_LIVE: [AtomicUsize; N] = [const { AtomicUsize::new(0) }; N];
static TOTAL_LIVE: AtomicUsize = AtomicUsize::new(0);
static TOTAL_PEAK: AtomicUsize = AtomicUsize::new(0);
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// A `GlobalAlloc` over [`System`] that counts live bytes per category.
///
/// It never allocates itself, and reading the thread's tag inside `alloc` touches only a
/// `const`-initialised thread-local cell, so there is no recursion.
#[derive(Debug, Default, Clone, Copy)]
pub struct CountingAlloc {
    _private: (),
}

impl CountingAlloc {
    /// A counting allocator, ready to be a `static` `#[global_allocator]`.
    pub const fn new() -> CountingAlloc {
        CountingAlloc { _private: () }
    }
}

/// The header offset for an alignment and the layout of the whole block (header + data), or
/// `None` when the enlarged size overflows.
fn outer_layout(layout: Layout) -> Option<(Layout, usize)> {
    // The offset is a multiple of the alignment (both are powers of two and the offset is the
    // larger of them), so the pointer after the header keeps the requested alignment.
    let offset = layout.align().max(HEADER);
    let size = layout.size().checked_add(offset)?;
    let outer = Layout::from_size_align(size, layout.align()).ok()?;
    Some((outer, offset))
}

fn record_alloc(tag: u8, size: usize) {
    let i = slot(tag);
    if tag & BACKEND != 0 {
        BACKEND_LIVE[i].fetch_add(size, Ordering::Relaxed);
    }
    let now = LIVE[i]
        .fetch_add(size, Ordering::Relaxed)
        .wrapping_add(size);
    PEAK[i].fetch_max(now, Ordering::Relaxed);
    ALLOCATED[i].fetch_add(size as u64, Ordering::Relaxed);
    COUNT[i].fetch_add(1, Ordering::Relaxed);
    let total = TOTAL_LIVE
        .fetch_add(size, Ordering::Relaxed)
        .wrapping_add(size);
    TOTAL_PEAK.fetch_max(total, Ordering::Relaxed);
    if !INSTALLED.load(Ordering::Relaxed) {
        INSTALLED.store(true, Ordering::Relaxed);
    }
}

fn record_dealloc(tag: u8, size: usize) {
    let i = slot(tag);
    if tag & HANDED != 0 {
        HANDED_LIVE[i].fetch_sub(size, Ordering::Relaxed);
    }
    if tag & BACKEND != 0 {
        BACKEND_LIVE[i].fetch_sub(size, Ordering::Relaxed);
    }
    LIVE[i].fetch_sub(size, Ordering::Relaxed);
    TOTAL_LIVE.fetch_sub(size, Ordering::Relaxed);
}

/// Writes the calling thread's category tag into the header of a fresh block and counts it;
/// returns the caller's pointer, or null if `base` is null.
///
/// # Safety
/// `base` is null or a block just returned by `System` for `outer_layout(layout)`, whose
/// offset is `offset`.
unsafe fn tag_block(base: *mut u8, offset: usize, layout: Layout) -> *mut u8 {
    if base.is_null() {
        return base;
    }
    let tag = block_tag();
    // SAFETY: `offset < outer.size()`, so `base + offset` and the byte before it are inside
    // the block `System` just returned (the caller's contract).
    unsafe {
        let user = base.add(offset);
        if PROBING.load(Ordering::Relaxed) {
            LAST_PROBED.store(user as usize, Ordering::Relaxed);
        }
        user.sub(1).write(tag);
        record_alloc(tag, layout.size());
        crate::trace::record(user, layout.size(), false, tag & CATEGORY_BITS);
        user
    }
}

// SAFETY: every method forwards to `System` with a layout that is valid and at least as large
// as the caller's, and returns a pointer `offset` bytes into the block, where `offset` is a
// multiple of the requested alignment and at least `HEADER`; so the returned pointer is aligned
// as asked, has `layout.size()` usable bytes after it, and the tag byte just before it lies
// inside the same block. `dealloc`/`realloc` recompute the same offset and outer layout from the
// caller's layout (which the `GlobalAlloc` contract says is the one used to allocate), so the
// pointer given back to `System` is the one `System` returned, with its layout.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let Some((outer, offset)) = outer_layout(layout) else {
            return std::ptr::null_mut();
        };
        // SAFETY: `outer` has a non-zero size (it includes the header); `base` is what
        // `System` returned for `outer`, as `tag_block` requires.
        unsafe { tag_block(System.alloc(outer), offset, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let Some((outer, offset)) = outer_layout(layout) else {
            return std::ptr::null_mut();
        };
        // SAFETY: as in `alloc`; the tag byte is in the header, the user bytes stay zero.
        unsafe { tag_block(System.alloc_zeroed(outer), offset, layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let Some((outer, offset)) = outer_layout(layout) else {
            // Unreachable for a block this allocator handed out: `alloc` succeeded with the
            // same layout, so `outer_layout` succeeded then too.
            return;
        };
        // SAFETY: `ptr` came from `alloc`/`realloc` with this layout, so the header byte before
        // it holds the tag and `ptr - offset` is the block `System` returned for `outer`.
        unsafe {
            let tag = ptr.sub(1).read();
            record_dealloc(tag, layout.size());
            crate::trace::record(ptr, layout.size(), true, tag & CATEGORY_BITS);
            System.dealloc(ptr.sub(offset), outer);
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let Some((outer, offset)) = outer_layout(layout) else {
            return std::ptr::null_mut();
        };
        let Some(new_outer_size) = new_size.checked_add(offset) else {
            return std::ptr::null_mut();
        };
        if Layout::from_size_align(new_outer_size, layout.align()).is_err() {
            return std::ptr::null_mut();
        }
        // SAFETY: `ptr - offset` is the block `System` returned for `outer` (see `dealloc`);
        // `new_outer_size` is non-zero and valid for the alignment (checked just above).
        let base = unsafe { System.realloc(ptr.sub(offset), outer, new_outer_size) };
        if base.is_null() {
            // The old block is untouched and still counted where it was.
            return base;
        }
        let tag = block_tag();
        // SAFETY: `System.realloc` copied the header with the data, so the old tag is at
        // `base + offset - 1`, inside the new block of `new_outer_size > offset` bytes.
        unsafe {
            let user = base.add(offset);
            let old_tag = user.sub(1).read();
            record_dealloc(old_tag, layout.size());
            crate::trace::record(ptr, layout.size(), true, old_tag & CATEGORY_BITS);
            user.sub(1).write(tag);
            record_alloc(tag, new_size);
            crate::trace::record(user, new_size, false, tag & CATEGORY_BITS);
            user
        }
    }
}

/// Whether a [`CountingAlloc`] is installed and has counted at least one allocation; while it
/// is false every reader returns zero.
pub fn is_installed() -> bool {
    INSTALLED.load(Ordering::Relaxed)
}

/// Bytes currently allocated under `category`.
pub fn live_bytes(category: Category) -> usize {
    LIVE[category.index()].load(Ordering::Relaxed)
}

/// The largest value [`live_bytes`] reached for `category` since the start or the last reset.
pub fn peak_bytes(category: Category) -> usize {
    PEAK[category.index()].load(Ordering::Relaxed)
}

/// Bytes currently allocated, all categories together.
pub fn total_live_bytes() -> usize {
    TOTAL_LIVE.load(Ordering::Relaxed)
}

/// Lowers the peak of `category` to its current live bytes.
pub fn reset_peak(category: Category) {
    let i = category.index();
    PEAK[i].store(LIVE[i].load(Ordering::Relaxed), Ordering::Relaxed);
}

/// Lowers every per-category peak, and the total peak, to the current live bytes.
pub fn reset_peaks() {
    for c in Category::ALL {
        reset_peak(c);
    }
    TOTAL_PEAK.store(TOTAL_LIVE.load(Ordering::Relaxed), Ordering::Relaxed);
}

/// A copy of every counter, indexed by [`Category::index`].
///
/// The counters are read one by one while other threads may be allocating, so the fields are
/// each exact but not necessarily taken at the same instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocSnapshot {
    /// Live bytes per category.
    pub live: [usize; N],
    /// Peak live bytes per category since the start or the last reset.
    pub peak: [usize; N],
    /// Bytes ever allocated per category (cumulative, never reset).
    pub allocated: [u64; N],
    /// Number of allocations per category (cumulative, never reset).
    pub allocations: [u64; N],
    /// Live bytes per category whose block was handed to a device backend
    /// ([`mark_handed_to_device`]); already included in `live`.
    #[serde(default)]
    pub handed_to_device: [usize; N],
    /// Live bytes per category allocated inside a backend op ([`crate::BackendScope`]); already
    /// included in `live`. The rest of `live` was allocated outside any backend op.
    #[serde(default)]
    pub in_backend: [usize; N],
    /// Live bytes, all categories together.
    pub total_live: usize,
    /// Peak of `total_live` since the start or the last [`reset_peaks`].
    pub total_peak: usize,
}

impl AllocSnapshot {
    /// Live bytes of one category.
    pub fn live(&self, category: Category) -> usize {
        self.live[category.index()]
    }

    /// Peak bytes of one category.
    pub fn peak(&self, category: Category) -> usize {
        self.peak[category.index()]
    }

    /// Live bytes of one category allocated outside any backend op ([`crate::BackendScope`]).
    pub fn outside_backend(&self, category: Category) -> usize {
        let i = category.index();
        self.live[i].saturating_sub(self.in_backend[i])
    }
}

/// Reads every counter.
pub fn snapshot() -> AllocSnapshot {
    let mut s = AllocSnapshot {
        live: [0; N],
        peak: [0; N],
        allocated: [0; N],
        allocations: [0; N],
        handed_to_device: [0; N],
        in_backend: [0; N],
        total_live: TOTAL_LIVE.load(Ordering::Relaxed),
        total_peak: TOTAL_PEAK.load(Ordering::Relaxed),
    };
    for i in 0..N {
        s.live[i] = LIVE[i].load(Ordering::Relaxed);
        s.peak[i] = PEAK[i].load(Ordering::Relaxed);
        s.allocated[i] = ALLOCATED[i].load(Ordering::Relaxed);
        s.allocations[i] = COUNT[i].load(Ordering::Relaxed);
        s.handed_to_device[i] = HANDED_LIVE[i].load(Ordering::Relaxed);
        s.in_backend[i] = BACKEND_LIVE[i].load(Ordering::Relaxed);
    }
    s
}

/// The category recorded in a block's header (for tests and debugging).
///
/// # Safety
/// `ptr` must point to a live block allocated by [`CountingAlloc`] (the installed global
/// allocator) and not yet freed.
pub unsafe fn block_category(ptr: *const u8) -> Category {
    // SAFETY: the caller guarantees `ptr` is a live block from this allocator, whose header
    // byte just before `ptr` holds the tag.
    category_from_u8(unsafe { ptr.sub(1).read() } & CATEGORY_BITS)
}

/// Set while [`counting_is_global`] checks which allocator serves the global heap: every
/// block [`CountingAlloc`] hands out meanwhile stores its address in [`LAST_PROBED`].
static PROBING: AtomicBool = AtomicBool::new(false);
static LAST_PROBED: AtomicUsize = AtomicUsize::new(0);
/// 0: not checked yet, 1: the global allocator is a [`CountingAlloc`], 2: it is not.
static GLOBAL: AtomicU8 = AtomicU8::new(0);

/// Whether the process's `#[global_allocator]` is a [`CountingAlloc`], so that every `Vec`'s
/// buffer carries a tag header. Checked once by allocating a probe box and seeing whether a
/// `CountingAlloc` handed out its address (a concurrent allocation can only make the check
/// answer "no", never a wrong "yes": two live blocks never share an address).
fn counting_is_global() -> bool {
    match GLOBAL.load(Ordering::Relaxed) {
        1 => return true,
        2 => return false,
        _ => {}
    }
    let mut yes = false;
    for _ in 0..8 {
        PROBING.store(true, Ordering::SeqCst);
        let probe = std::hint::black_box(Box::new(0u64));
        PROBING.store(false, Ordering::SeqCst);
        let addr = std::ptr::from_ref::<u64>(&probe) as usize;
        if LAST_PROBED.load(Ordering::SeqCst) == addr {
            yes = true;
            break;
        }
    }
    GLOBAL.store(if yes { 1 } else { 2 }, Ordering::Relaxed);
    yes
}

/// Marks the buffer of `v` as handed to a device backend for an upload: its bytes stay counted
/// under their category, and are also counted in [`handed_to_device_bytes`] until the block is
/// freed (or reallocated), by whichever thread.
///
/// This is how a measured run tells a device backend's hold on uploaded host data apart from
/// the bytes the program itself keeps: cubecl-cuda, for one, keeps the host buffer of every
/// upload alive in a pending-drop queue until its copy is fenced, up to 64 uploads or 64 MiB
/// later. Call it just before moving the vector into the backend (e.g. into burn's
/// `TensorData`). It does nothing when no [`CountingAlloc`] is the global allocator, for an
/// empty or zero-sized-element vector, and for a block already marked. Returns whether it
/// marked the block.
pub fn mark_handed_to_device<T>(v: &Vec<T>) -> bool {
    let size = v.capacity() * std::mem::size_of::<T>();
    if size == 0 || !counting_is_global() {
        return false;
    }
    let user = v.as_ptr().cast::<u8>().cast_mut();
    // SAFETY: the global allocator is a `CountingAlloc` (checked above), so the vector's
    // buffer (non-empty: `size > 0`) is a live block it handed out, with the tag byte just
    // before the pointer, inside the same block; `&v` keeps the block alive and unshared by
    // other writers while the byte is read and rewritten.
    unsafe {
        let tag_at = user.sub(1);
        let tag = tag_at.read();
        if tag & HANDED != 0 {
            return false;
        }
        let i = slot(tag);
        HANDED_LIVE[i].fetch_add(size, Ordering::Relaxed);
        tag_at.write(tag | HANDED);
    }
    true
}

/// Live bytes under `category` allocated inside a backend op ([`crate::BackendScope`]) and not
/// freed yet.
pub fn backend_bytes(category: Category) -> usize {
    BACKEND_LIVE[category.index()].load(Ordering::Relaxed)
}

/// Live bytes under `category` whose block was marked [`mark_handed_to_device`] and is not
/// freed yet.
pub fn handed_to_device_bytes(category: Category) -> usize {
    HANDED_LIVE[category.index()].load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_offset_keeps_alignment_and_room_for_the_tag() {
        for align in [1usize, 2, 4, 8, 16, 64, 4096] {
            for size in [1usize, 7, 100, 5000] {
                let layout = Layout::from_size_align(size, align).expect("layout");
                let (outer, offset) = outer_layout(layout).expect("fits");
                assert_eq!(offset % align, 0);
                assert!(offset >= HEADER);
                assert_eq!(outer.size(), size + offset);
                assert_eq!(outer.align(), align);
            }
        }
        let huge = Layout::from_size_align(isize::MAX as usize - 2, 1).expect("layout");
        assert!(outer_layout(huge).is_none());
    }

    #[test]
    fn allocator_counts_when_called_directly() {
        // Not installed in this unit-test binary: call it directly, under a category no other
        // unit test uses.
        // A trace test running beside this one would see these blocks.
        let _turn = crate::trace::tests::TRACE_TEST
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let a = CountingAlloc::new();
        let _scope = crate::CategoryScope::enter(Category::Cache);
        let before = live_bytes(Category::Cache);
        let layout = Layout::from_size_align(300, 32).expect("layout");
        // SAFETY: non-zero layout; the block is freed below with the same layout.
        unsafe {
            let p = a.alloc(layout);
            assert!(!p.is_null());
            assert_eq!(p as usize % 32, 0);
            assert_eq!(block_category(p), Category::Cache);
            assert_eq!(live_bytes(Category::Cache), before + 300);
            let q = a.realloc(p, layout, 1000);
            assert!(!q.is_null());
            assert_eq!(live_bytes(Category::Cache), before + 1000);
            a.dealloc(q, Layout::from_size_align(1000, 32).expect("layout"));
        }
        assert_eq!(live_bytes(Category::Cache), before);
        assert!(is_installed());
    }

    #[test]
    fn nothing_is_marked_when_the_global_allocator_does_not_count() {
        // This unit-test binary does not install `CountingAlloc` globally (other tests here
        // call one directly), so a `Vec`'s buffer has no tag header to mark.
        let v = vec![1u8; 64];
        assert!(!mark_handed_to_device(&v));
        assert_eq!(handed_to_device_bytes(Category::Other), 0);
    }
}
