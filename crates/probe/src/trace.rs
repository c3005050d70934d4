//! An optional, bounded, allocation-free trace of large allocations made through
//! [`crate::CountingAlloc`].
//!
//! While a trace is on ([`start_trace`]), every allocation and free of at least `min_bytes`
//! (the size the program asked for) that goes through the counting allocator is appended to a
//! fixed-size static buffer of [`TRACE_CAPACITY`] slots: its address (the pointer the program
//! sees), size, whether it was an allocation or a free, the block's category tag, and a small
//! per-thread id ([`trace_thread_id`]). A `realloc` of a traced size is recorded as a free of
//! the old block followed by an allocation of the new one.
//!
//! Nothing here allocates: a slot is claimed with one atomic `fetch_add` on the global index
//! (which also fixes the events' order), written with atomic stores and published by its last
//! store. Once the buffer is full further events are dropped and counted
//! ([`TraceResult::dropped`]). [`stop_trace`] turns recording off, then copies the slots out
//! (the only allocation, made after recording stopped) and clears them for the next trace.
//!
//! One trace runs at a time per process; [`start_trace`] refuses a second one. The buffer is
//! static (BSS): its pages become resident only as slots are written, and as static memory
//! they are not counted by the counting allocator (they do show in RssAnon).

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use serde::{Deserialize, Serialize};

use crate::tag::category_from_u8;
use trainmem_core::Category;

/// Number of events one trace can hold (24 bytes each: 3 MiB of static memory at most).
pub const TRACE_CAPACITY: usize = 1 << 17;

/// One slot: `meta` is written last and is non-zero once the slot is complete.
struct Slot {
    addr: AtomicU64,
    size: AtomicU64,
    meta: AtomicU64,
}

static SLOTS: [Slot; TRACE_CAPACITY] = [const {
    Slot {
        addr: AtomicU64::new(0),
        size: AtomicU64::new(0),
        meta: AtomicU64::new(0),
    }
}; TRACE_CAPACITY];
static NEXT: AtomicUsize = AtomicUsize::new(0);
static DROPPED: AtomicU64 = AtomicU64::new(0);
static ENABLED: AtomicBool = AtomicBool::new(false);
static ACTIVE: AtomicBool = AtomicBool::new(false);
static MIN_BYTES: AtomicUsize = AtomicUsize::new(usize::MAX);
static THREAD_IDS: AtomicU64 = AtomicU64::new(1);

thread_local! {
    // `const`-initialised, no destructor: readable from inside the allocator.
    static THREAD_ID: Cell<u64> = const { Cell::new(0) };
}

const READY: u64 = 1 << 63;
const FREE_BIT: u64 = 1;

/// A small id of the calling thread, unique in this process (never reused), the one trace
/// events carry. Allocation-free.
pub fn trace_thread_id() -> u64 {
    THREAD_ID
        .try_with(|c| {
            let id = c.get();
            if id != 0 {
                return id;
            }
            let id = THREAD_IDS.fetch_add(1, Ordering::Relaxed);
            c.set(id);
            id
        })
        .unwrap_or(0)
}

/// Whether an event is an allocation or a free.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TraceKind {
    /// A block was allocated.
    Alloc,
    /// A block was freed.
    Free,
}

/// One traced allocation or free.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceEvent {
    /// The block's address (as the program sees it).
    pub addr: u64,
    /// The block's size in bytes (the size the program asked for).
    pub size: u64,
    /// Allocation or free.
    pub kind: TraceKind,
    /// The block's category: the allocating thread's tag (for a free, the tag the block was
    /// allocated under).
    pub category: Category,
    /// The [`trace_thread_id`] of the thread that allocated or freed it.
    pub thread: u64,
}

/// What a finished trace recorded.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceResult {
    /// Events in the order their slots were claimed.
    pub events: Vec<TraceEvent>,
    /// Events not recorded because the buffer was full.
    pub dropped: u64,
    /// The trace's size threshold.
    pub min_bytes: u64,
}

/// A trace is already running.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("an allocation trace is already running in this process")]
pub struct TraceBusy;

/// Starts recording allocations and frees of at least `min_bytes` (at least 1) bytes.
pub fn start_trace(min_bytes: u64) -> Result<(), TraceBusy> {
    if ACTIVE
        .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return Err(TraceBusy);
    }
    NEXT.store(0, Ordering::Relaxed);
    DROPPED.store(0, Ordering::Relaxed);
    MIN_BYTES.store(
        usize::try_from(min_bytes.max(1)).unwrap_or(usize::MAX),
        Ordering::Relaxed,
    );
    ENABLED.store(true, Ordering::Release);
    Ok(())
}

/// Whether a trace is recording.
pub fn trace_enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// How many events the running trace has claimed so far (0 when none runs): the index the
/// next event will get, so a caller can mark where in the trace a moment falls.
pub fn trace_position() -> usize {
    if ENABLED.load(Ordering::Acquire) {
        NEXT.load(Ordering::Acquire)
    } else {
        0
    }
}

/// Stops the running trace and returns what it recorded (an empty result when none runs).
pub fn stop_trace() -> TraceResult {
    if !ACTIVE.load(Ordering::Acquire) {
        return TraceResult::default();
    }
    ENABLED.store(false, Ordering::SeqCst);
    let min_bytes = MIN_BYTES.swap(usize::MAX, Ordering::Relaxed) as u64;
    let claimed = NEXT.load(Ordering::Acquire).min(TRACE_CAPACITY);
    let mut dropped = DROPPED.load(Ordering::Relaxed);
    let mut events = Vec::with_capacity(claimed);
    for slot in &SLOTS[..claimed] {
        // A writer that claimed a slot just before recording stopped finishes within a few
        // stores; wait briefly for it, then count the slot as dropped.
        let mut meta = slot.meta.load(Ordering::Acquire);
        let mut spins = 0;
        while meta & READY == 0 && spins < 10_000 {
            std::hint::spin_loop();
            spins += 1;
            meta = slot.meta.load(Ordering::Acquire);
        }
        if meta & READY == 0 {
            dropped += 1;
            continue;
        }
        events.push(TraceEvent {
            addr: slot.addr.load(Ordering::Relaxed),
            size: slot.size.load(Ordering::Relaxed),
            kind: if meta & FREE_BIT != 0 {
                TraceKind::Free
            } else {
                TraceKind::Alloc
            },
            category: category_from_u8(((meta >> 1) & 0xFF) as u8),
            thread: (meta >> 9) & ((1 << 54) - 1),
        });
        slot.meta.store(0, Ordering::Relaxed);
    }
    NEXT.store(0, Ordering::Relaxed);
    ACTIVE.store(false, Ordering::Release);
    TraceResult {
        events,
        dropped,
        min_bytes,
    }
}

/// Records one event if a trace is on and `size` reaches its threshold. Called from inside
/// the global allocator: it must not allocate, and does not.
#[inline]
pub(crate) fn record(addr: *const u8, size: usize, free: bool, tag: u8) {
    if !ENABLED.load(Ordering::Relaxed) || size < MIN_BYTES.load(Ordering::Relaxed) {
        return;
    }
    let i = NEXT.fetch_add(1, Ordering::Relaxed);
    let Some(slot) = SLOTS.get(i) else {
        DROPPED.fetch_add(1, Ordering::Relaxed);
        return;
    };
    slot.addr.store(addr as u64, Ordering::Relaxed);
    slot.size.store(size as u64, Ordering::Relaxed);
    let thread = trace_thread_id() & ((1 << 54) - 1);
    let meta = READY | (thread << 9) | (u64::from(tag) << 1) | u64::from(free);
    slot.meta.store(meta, Ordering::Release);
}

#[cfg(test)]
pub(crate) mod tests {
    use std::alloc::{GlobalAlloc, Layout};
    use std::sync::Mutex;

    use super::*;
    use crate::{CategoryScope, CountingAlloc};

    /// Traces are process-wide: tests that start one take turns.
    pub(crate) static TRACE_TEST: Mutex<()> = Mutex::new(());

    fn mine(r: &TraceResult) -> Vec<TraceEvent> {
        let me = trace_thread_id();
        r.events
            .iter()
            .copied()
            .filter(|e| e.thread == me)
            .collect()
    }

    #[test]
    fn events_are_recorded_in_order_with_matching_frees() {
        let _turn = TRACE_TEST.lock().unwrap_or_else(|p| p.into_inner());
        let a = CountingAlloc::new();
        let big = Layout::from_size_align(8192, 64).expect("layout");
        let small = Layout::from_size_align(100, 8).expect("layout");
        start_trace(4096).expect("no other trace");
        assert!(start_trace(1).is_err(), "one trace at a time");
        let (p, q, s);
        {
            let _tag = CategoryScope::enter(Category::Activation);
            // SAFETY: non-zero layouts; every block is freed below with its own layout.
            unsafe {
                p = a.alloc(big);
                s = a.alloc(small);
                q = a.alloc_zeroed(big);
            }
        }
        // SAFETY: `p`, `q`, `s` are live blocks of this allocator with these layouts; `r` is
        // the block `realloc` returns, freed with its new size.
        unsafe {
            let r = a.realloc(p, big, 16384);
            a.dealloc(q, big);
            a.dealloc(s, small);
            a.dealloc(r, Layout::from_size_align(16384, 64).expect("layout"));
            let ev = mine(&stop_trace());
            let want = [
                (p as u64, 8192, TraceKind::Alloc, Category::Activation),
                (q as u64, 8192, TraceKind::Alloc, Category::Activation),
                (p as u64, 8192, TraceKind::Free, Category::Activation),
                (r as u64, 16384, TraceKind::Alloc, Category::Other),
                (q as u64, 8192, TraceKind::Free, Category::Activation),
                (r as u64, 16384, TraceKind::Free, Category::Other),
            ];
            let got: Vec<_> = ev
                .iter()
                .map(|e| (e.addr, e.size, e.kind, e.category))
                .collect();
            assert_eq!(got, want);
        }
        // Off again: nothing is recorded and stopping twice is harmless.
        // SAFETY: freed right away with the same layout.
        unsafe { a.dealloc(a.alloc(big), big) };
        assert_eq!(stop_trace(), TraceResult::default());
    }

    #[test]
    fn a_full_buffer_drops_and_counts() {
        let _turn = TRACE_TEST.lock().unwrap_or_else(|p| p.into_inner());
        start_trace(1).expect("no other trace");
        let extra = 10usize;
        let me = trace_thread_id();
        // Fill every slot straight through the recorder (no allocation needed).
        for i in 0..TRACE_CAPACITY + extra {
            record((i * 64) as *const u8, 64, i % 2 == 1, Category::Input as u8);
        }
        let r = stop_trace();
        assert_eq!(r.events.len(), TRACE_CAPACITY);
        assert_eq!(r.dropped, extra as u64);
        assert_eq!(r.min_bytes, 1);
        assert!(r.events.iter().all(|e| e.thread == me));
        assert_eq!(r.events[3].addr, 3 * 64);
        assert_eq!(r.events[3].kind, TraceKind::Free);
        assert_eq!(r.events[3].category, Category::Input);
        // The next trace starts empty.
        start_trace(1).expect("free again");
        assert!(stop_trace().events.is_empty());
    }

    #[test]
    fn thread_ids_differ_between_threads_and_stay_fixed() {
        let here = trace_thread_id();
        assert_eq!(here, trace_thread_id());
        let there = std::thread::spawn(trace_thread_id).join().expect("thread");
        assert_ne!(here, there);
        assert_ne!(there, 0);
    }
}
