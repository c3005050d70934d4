//! Byte accounting: every live tensor buffer of a Meta device, per category, now and at peak.
//!
//! A [`Ledger`] belongs to one [`crate::MetaDevice`]. Each buffer a tensor op creates is
//! registered with the ledger under the category the calling thread carries at that moment
//! (trainmem-probe's thread-local tag, the same tag measured runs set around their phases), and
//! is released when the last tensor sharing it is dropped. The ledger keeps live bytes and peaks
//! per category and in total; an optional [`AllocationHook`] sees the same events in order, so a
//! further memory model (a caching allocator, a pool) can be driven by them.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use trainmem_core::{Category, CategoryBytes};

/// A further memory model fed with every allocation and free of a device, in order.
///
/// The exact per-tensor accounting of the [`Ledger`] is always kept; a hook adds a model on top
/// (for example one that rounds sizes and caches freed blocks the way a caching allocator does).
pub trait AllocationHook: Send + fmt::Debug {
    /// A buffer of `bytes` bytes was created under `category`; `id` is unique per ledger.
    fn allocated(&mut self, id: u64, bytes: u64, category: Category);
    /// The buffer `id` (of `bytes` bytes, created under `category`) was released.
    fn freed(&mut self, id: u64, bytes: u64, category: Category);

    /// Device totals for models that have them (a caching allocator's allocated and reserved
    /// bytes, with their peaks since the previous call); `None` by default.
    fn device_totals(&mut self) -> Option<DeviceTotals> {
        None
    }

    /// Releases cached, unused memory (`empty_cache`); nothing by default.
    fn empty_cache(&mut self) {}

    /// burn is entering (`true`) or leaving (`false`) `Backend::memory_persistent_allocations`
    /// (where it creates parameters): buffers made in between are meant to live for the whole
    /// run. Nothing by default; cubecl's pools keep them apart.
    fn persistent(&mut self, _on: bool) {}
}

/// Device figures of a memory model at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceTotals {
    /// Bytes in allocated blocks (after the model's rounding).
    pub allocated: u64,
    /// Bytes the model holds from the device (allocated plus cached).
    pub reserved: u64,
    /// Highest `allocated` since the previous reading.
    pub peak_allocated: u64,
    /// Highest `reserved` since the previous reading.
    pub peak_reserved: u64,
}

/// Live and peak bytes of one device, per category and in total.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Live bytes per category.
    pub live: CategoryBytes,
    /// Highest live bytes each category reached since the last peak reset (each category's peak
    /// is taken on its own, so they need not be simultaneous).
    pub peak: CategoryBytes,
    /// Live bytes, all categories together.
    pub total_live: u64,
    /// Highest total live bytes since the last peak reset.
    pub total_peak: u64,
    /// Buffers created so far.
    pub allocations: u64,
    /// Buffers released so far.
    pub frees: u64,
    /// Live buffers per category, indexed by [`Category::index`].
    pub buffers_per_category: [u64; 8],
}

impl MemoryStats {
    /// Live bytes of one category.
    pub fn live_bytes(&self, category: Category) -> u64 {
        self.live.get(category)
    }

    /// Peak bytes of one category.
    pub fn peak_bytes(&self, category: Category) -> u64 {
        self.peak.get(category)
    }

    /// Buffers alive now.
    pub fn live_buffers(&self) -> u64 {
        self.allocations - self.frees
    }

    /// The host bytes burn's CPU backend (Flex) holds for the live buffers of `category`: their
    /// data, and the storage header Flex allocates with every buffer
    /// ([`trainmem_track::buffer::FLEX_STORAGE_HEADER`]). Flex's strides (8 bytes per dimension
    /// of every tensor object) are not counted.
    pub fn flex_host_bytes(&self, category: Category) -> u64 {
        let i = category.index();
        self.live.0[i] + self.buffers_per_category[i] * trainmem_track::buffer::FLEX_STORAGE_HEADER
    }
}

#[derive(Debug, Default)]
struct LedgerState {
    stats: MemoryStats,
    next_id: u64,
    hook: Option<Box<dyn AllocationHook>>,
}

/// The accounting of one Meta device (see the module docs).
#[derive(Debug, Default)]
pub struct Ledger {
    state: Mutex<LedgerState>,
}

impl Ledger {
    /// A ledger with exact per-tensor accounting only.
    pub fn new() -> Ledger {
        Ledger::default()
    }

    /// A ledger that also feeds every event to `hook`.
    pub fn with_hook(hook: Box<dyn AllocationHook>) -> Ledger {
        Ledger {
            state: Mutex::new(LedgerState {
                hook: Some(hook),
                ..LedgerState::default()
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, LedgerState> {
        // A panic inside an op (an op Meta cannot model) must not poison later accounting: the
        // state is updated with plain additions, so it is consistent whenever the lock is free.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The current figures.
    pub fn stats(&self) -> MemoryStats {
        self.lock().stats
    }

    /// Sets every peak to the current live value.
    pub fn reset_peaks(&self) {
        let mut state = self.lock();
        let stats = &mut state.stats;
        stats.peak = stats.live;
        stats.total_peak = stats.total_live;
    }

    /// Runs `f` on the hook, if there is one.
    pub fn with_hook_mut<R>(&self, f: impl FnOnce(&mut dyn AllocationHook) -> R) -> Option<R> {
        let mut state = self.lock();
        let hook: Option<&mut Box<dyn AllocationHook>> = state.hook.as_mut();
        hook.map(|h| f(h.as_mut()))
    }

    /// The hook's device totals, when it has any (see [`AllocationHook::device_totals`]).
    pub fn device_totals(&self) -> Option<DeviceTotals> {
        self.with_hook_mut(|h| h.device_totals()).flatten()
    }

    /// Tells the hook that persistent allocations begin or end (see
    /// [`AllocationHook::persistent`]).
    pub fn persistent(&self, on: bool) {
        self.with_hook_mut(|h| h.persistent(on));
    }

    /// Asks the hook to release cached memory (see [`AllocationHook::empty_cache`]).
    pub fn empty_cache(&self) {
        self.with_hook_mut(|h| h.empty_cache());
    }

    fn allocate(&self, bytes: u64, category: Category) -> u64 {
        let mut state = self.lock();
        let id = state.next_id;
        state.next_id += 1;
        let stats = &mut state.stats;
        let i = category.index();
        stats.live.0[i] += bytes;
        stats.peak.0[i] = stats.peak.0[i].max(stats.live.0[i]);
        stats.total_live += bytes;
        stats.total_peak = stats.total_peak.max(stats.total_live);
        stats.allocations += 1;
        stats.buffers_per_category[i] += 1;
        if let Some(hook) = state.hook.as_deref_mut() {
            hook.allocated(id, bytes, category);
        }
        id
    }

    fn free(&self, id: u64, bytes: u64, category: Category) {
        let mut state = self.lock();
        let stats = &mut state.stats;
        let i = category.index();
        stats.live.0[i] = stats.live.0[i].saturating_sub(bytes);
        stats.total_live = stats.total_live.saturating_sub(bytes);
        stats.frees += 1;
        stats.buffers_per_category[i] = stats.buffers_per_category[i].saturating_sub(1);
        if let Some(hook) = state.hook.as_deref_mut() {
            hook.freed(id, bytes, category);
        }
    }
}

/// One tensor buffer: registered with its ledger while it lives, released on drop.
///
/// Tensors that share storage (views, clones) share one `Buffer` through an `Arc`, so the bytes
/// are counted once and released when the last of them is dropped.
pub(crate) struct Buffer {
    ledger: Arc<Ledger>,
    id: u64,
    bytes: u64,
    category: Category,
}

impl Buffer {
    /// Registers a buffer of `bytes` bytes under the calling thread's category.
    pub(crate) fn new(ledger: Arc<Ledger>, bytes: u64) -> Buffer {
        let category = trainmem_probe::current_category();
        let id = ledger.allocate(bytes, category);
        Buffer {
            ledger,
            id,
            bytes,
            category,
        }
    }

    /// Size in bytes.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The category the buffer was created under.
    pub(crate) fn category(&self) -> Category {
        self.category
    }
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buffer")
            .field("id", &self.id)
            .field("bytes", &self.bytes)
            .field("category", &self.category)
            .finish()
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        self.ledger.free(self.id, self.bytes, self.category);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use trainmem_probe::CategoryScope;

    #[derive(Debug, Default)]
    struct Events(Vec<(bool, u64, u64)>);

    impl AllocationHook for Events {
        fn allocated(&mut self, id: u64, bytes: u64, _category: Category) {
            self.0.push((true, id, bytes));
        }
        fn freed(&mut self, id: u64, bytes: u64, _category: Category) {
            self.0.push((false, id, bytes));
        }
    }

    #[test]
    fn buffers_count_under_the_thread_tag_until_dropped() {
        let ledger = Arc::new(Ledger::new());
        let a = {
            let _tag = CategoryScope::enter(Category::Parameter);
            Buffer::new(ledger.clone(), 100)
        };
        let b = {
            let _tag = CategoryScope::enter(Category::Activation);
            Buffer::new(ledger.clone(), 40)
        };
        let s = ledger.stats();
        assert_eq!(s.live_bytes(Category::Parameter), 100);
        assert_eq!(s.live_bytes(Category::Activation), 40);
        assert_eq!(s.total_live, 140);
        drop(b);
        let s = ledger.stats();
        assert_eq!(s.live_bytes(Category::Activation), 0);
        assert_eq!(s.peak_bytes(Category::Activation), 40);
        assert_eq!(s.total_peak, 140);
        assert_eq!(s.live_buffers(), 1);
        ledger.reset_peaks();
        assert_eq!(ledger.stats().total_peak, 100);
        drop(a);
        assert_eq!(ledger.stats().total_live, 0);
    }

    #[test]
    fn the_hook_sees_every_event_in_order() {
        let ledger = Arc::new(Ledger::with_hook(Box::new(Events::default())));
        let a = Buffer::new(ledger.clone(), 8);
        let b = Buffer::new(ledger.clone(), 16);
        drop(a);
        drop(b);
        let seen = ledger.with_hook_mut(|h| format!("{h:?}"));
        assert_eq!(
            seen.as_deref(),
            Some("Events([(true, 0, 8), (true, 1, 16), (false, 0, 8), (false, 1, 16)])")
        );
    }
}
