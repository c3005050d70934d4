//! Live tensors: reference counts over allocations, with bytes per category.
//!
//! A [`TensorStore`] hands out [`TensorId`]s for allocations made through a
//! [`TensorMemory`] (the caching allocator in the simulator, a plain counter in tests). A
//! tensor is freed when its last reference is released: the forward pass, saved-tensor
//! lists, the caller, each hold references. The store keeps live bytes per
//! [`Category`] and the breakdown at the highest total seen.

use trainmem_core::Category;

/// A successful allocation: the memory's handle and the bytes it occupies (after rounding).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allocated<H> {
    /// The memory's handle, passed back to [`TensorMemory::free`].
    pub handle: H,
    /// Bytes the allocation occupies (what `allocated` counts).
    pub size: u64,
}

/// Where tensor bytes come from.
///
/// A memory refuses an allocation it cannot hold, and so never has more live bytes than 64
/// bits count: the [`TensorStore`]'s sums over its live tensors cannot overflow.
pub trait TensorMemory {
    /// Handle of one allocation.
    type Handle: Copy;
    /// Allocation failure (out of memory).
    type Error;
    /// Allocates `bytes` for a tensor of `category`.
    fn allocate(
        &mut self,
        bytes: u64,
        category: Category,
    ) -> Result<Allocated<Self::Handle>, Self::Error>;
    /// Frees an allocation.
    fn free(&mut self, handle: Self::Handle);
}

/// A plain counting memory: no rounding, optional capacity. For tests and quick estimates.
#[derive(Debug, Clone, Default)]
pub struct CountingMemory {
    /// Live bytes.
    pub live: u64,
    /// Highest live bytes.
    pub peak: u64,
    /// Capacity (`None` = unlimited).
    pub capacity: Option<u64>,
    sizes: Vec<u64>,
    free_ids: Vec<u32>,
}

/// Out of memory in a [`CountingMemory`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("out of memory: tried to allocate {requested} bytes with {live} of {capacity} in use")]
pub struct CountingOom {
    /// Bytes asked for.
    pub requested: u64,
    /// Bytes in use.
    pub live: u64,
    /// Capacity.
    pub capacity: u64,
}

impl CountingMemory {
    /// Unlimited memory.
    pub fn new() -> CountingMemory {
        CountingMemory::default()
    }
    /// Memory of a given capacity.
    pub fn with_capacity(capacity: u64) -> CountingMemory {
        CountingMemory {
            capacity: Some(capacity),
            ..Default::default()
        }
    }
}

impl TensorMemory for CountingMemory {
    type Handle = u32;
    type Error = CountingOom;
    fn allocate(&mut self, bytes: u64, _category: Category) -> Result<Allocated<u32>, CountingOom> {
        // unlimited memory still holds no more than 64 bits count
        let cap = self.capacity.unwrap_or(u64::MAX);
        let Some(live) = self.live.checked_add(bytes).filter(|&l| l <= cap) else {
            return Err(CountingOom {
                requested: bytes,
                live: self.live,
                capacity: cap,
            });
        };
        self.live = live;
        self.peak = self.peak.max(self.live);
        let id = match self.free_ids.pop() {
            Some(i) => {
                self.sizes[i as usize] = bytes;
                i
            }
            None => {
                self.sizes.push(bytes);
                (self.sizes.len() - 1) as u32
            }
        };
        Ok(Allocated {
            handle: id,
            size: bytes,
        })
    }
    fn free(&mut self, handle: u32) {
        self.live -= self.sizes[handle as usize];
        self.free_ids.push(handle);
    }
}

/// Names a live tensor of a [`TensorStore`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TensorId(u32);

impl TensorId {
    /// A placeholder that names no tensor.
    pub(crate) const HOLE: TensorId = TensorId(u32::MAX);
}

#[derive(Debug, Clone, Copy)]
struct Slot<H> {
    handle: Option<H>,
    size: u64,
    /// The bytes asked for (before the memory's rounding).
    requested: u64,
    category: Category,
    refs: u32,
    /// Host memory beside the tensors ([`TensorStore::alloc_host`]): not in the memory.
    on_host: bool,
}

/// Reference-counted tensors over a [`TensorMemory`], with per-category accounting.
#[derive(Debug)]
pub struct TensorStore<M: TensorMemory> {
    mem: M,
    slots: Vec<Slot<M::Handle>>,
    free_slots: Vec<u32>,
    live: [u64; 8],
    /// Live bytes per category as asked for (a framework's `nbytes`), before rounding.
    requested: [u64; 8],
    total: u64,
    peak: u64,
    peak_breakdown: [u64; 8],
    window_peak: u64,
    allocations: u64,
    /// Live bytes per category of [`TensorStore::alloc_host`]'s records.
    host_live: [u64; 8],
}

impl<M: TensorMemory> TensorStore<M> {
    /// A store over `mem`.
    pub fn new(mem: M) -> TensorStore<M> {
        TensorStore {
            mem,
            slots: Vec::new(),
            free_slots: Vec::new(),
            live: [0; 8],
            requested: [0; 8],
            total: 0,
            peak: 0,
            peak_breakdown: [0; 8],
            window_peak: 0,
            allocations: 0,
            host_live: [0; 8],
        }
    }

    /// The memory.
    pub fn memory(&self) -> &M {
        &self.mem
    }

    /// The memory, mutably (to call `empty_cache` on an allocator, ...).
    pub fn memory_mut(&mut self) -> &mut M {
        &mut self.mem
    }

    /// Allocates a tensor with one reference.
    pub fn alloc(&mut self, bytes: u64, category: Category) -> Result<TensorId, M::Error> {
        let a = self.mem.allocate(bytes, category)?;
        self.allocations += 1;
        let slot = Slot {
            handle: Some(a.handle),
            size: a.size,
            requested: bytes,
            category,
            refs: 1,
            on_host: false,
        };
        let id = self.place(slot);
        self.live[category.index()] += a.size;
        self.requested[category.index()] += bytes;
        self.total += a.size;
        if self.total > self.window_peak {
            self.window_peak = self.total;
        }
        if self.total > self.peak {
            self.peak = self.total;
            self.peak_breakdown = self.live;
        }
        Ok(id)
    }

    /// Puts `slot` in a free place (or a new one) and names it.
    fn place(&mut self, slot: Slot<M::Handle>) -> TensorId {
        let id = match self.free_slots.pop() {
            Some(i) => {
                self.slots[i as usize] = slot;
                i
            }
            None => {
                self.slots.push(slot);
                (self.slots.len() - 1) as u32
            }
        };
        TensorId(id)
    }

    /// Records `bytes` of host memory under `category` that live and die like a tensor
    /// (referenced, released) but are not in the memory: a framework's own records beside
    /// tensors that live on a GPU (burn-autodiff's graph nodes). Counted apart
    /// ([`TensorStore::live_host_by_category`]), never in the live, total or peak bytes.
    pub fn alloc_host(&mut self, bytes: u64, category: Category) -> TensorId {
        let slot = Slot {
            handle: None,
            size: bytes,
            requested: bytes,
            category,
            refs: 1,
            on_host: true,
        };
        self.host_live[category.index()] += bytes;
        self.place(slot)
    }

    /// Live bytes per category of [`TensorStore::alloc_host`]'s records.
    pub fn live_host_by_category(&self) -> [u64; 8] {
        self.host_live
    }

    /// Adds a reference.
    pub fn retain(&mut self, id: TensorId) {
        let s = &mut self.slots[id.0 as usize];
        debug_assert!(s.refs > 0, "retain of a freed tensor");
        s.refs += 1;
    }

    /// Drops a reference; frees the tensor when it was the last.
    pub fn release(&mut self, id: TensorId) {
        let s = &mut self.slots[id.0 as usize];
        debug_assert!(s.refs > 0, "release of a freed tensor");
        s.refs -= 1;
        if s.refs == 0 && s.on_host {
            self.host_live[s.category.index()] -= s.size;
            self.free_slots.push(id.0);
        } else if s.refs == 0 {
            if let Some(h) = s.handle.take() {
                self.mem.free(h);
            }
            self.live[s.category.index()] -= s.size;
            self.requested[s.category.index()] -= s.requested;
            self.total -= s.size;
            self.free_slots.push(id.0);
        }
    }

    /// Bytes of a live tensor.
    pub fn size(&self, id: TensorId) -> u64 {
        self.slots[id.0 as usize].size
    }

    /// References held on a live tensor.
    pub fn refs(&self, id: TensorId) -> u32 {
        self.slots[id.0 as usize].refs
    }

    /// Live bytes per category, indexed by [`Category::index`].
    pub fn live_by_category(&self) -> [u64; 8] {
        self.live
    }

    /// Live bytes per category as the tensors asked for them (a framework's `nbytes`:
    /// before the memory rounds them to its blocks), indexed by [`Category::index`].
    pub fn live_requested_by_category(&self) -> [u64; 8] {
        self.requested
    }

    /// Live bytes of one category.
    pub fn live_of(&self, c: Category) -> u64 {
        self.live[c.index()]
    }

    /// Total live bytes.
    pub fn live_total(&self) -> u64 {
        self.total
    }

    /// Number of live tensors.
    pub fn live_tensors(&self) -> usize {
        self.slots.len() - self.free_slots.len()
    }

    /// Highest total live bytes, and the per-category breakdown at that moment.
    pub fn peak(&self) -> (u64, [u64; 8]) {
        (self.peak, self.peak_breakdown)
    }

    /// Highest total since the last [`take_window_peak`](Self::take_window_peak); resets
    /// the window to the current total.
    pub fn take_window_peak(&mut self) -> u64 {
        let p = self.window_peak.max(self.total);
        self.window_peak = self.total;
        p
    }

    /// Allocations made so far.
    pub fn allocation_count(&self) -> u64 {
        self.allocations
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_records_live_and_die_like_tensors_outside_the_memory() {
        let mut s = TensorStore::new(CountingMemory::new());
        let t = s.alloc(100, Category::Activation).unwrap();
        let h = s.alloc_host(1000, Category::Activation);
        s.retain(h);
        assert_eq!(s.live_total(), 100, "not in the memory's bytes");
        assert_eq!(s.memory().live, 100);
        assert_eq!(
            s.live_host_by_category()[Category::Activation.index()],
            1000
        );
        s.release(h);
        assert_eq!(
            s.live_host_by_category()[Category::Activation.index()],
            1000
        );
        s.release(h);
        assert_eq!(s.live_host_by_category(), [0; 8]);
        // its slot is reused by a tensor of the memory
        let u = s.alloc(60, Category::Gradient).unwrap();
        assert_eq!((s.size(u), s.live_total()), (60, 160));
        s.release(u);
        s.release(t);
        assert_eq!((s.live_tensors(), s.memory().live, s.peak().0), (0, 0, 160));
    }

    #[test]
    fn refcounts_free_on_last_release_and_track_categories() {
        let mut s = TensorStore::new(CountingMemory::new());
        let a = s.alloc(100, Category::Activation).unwrap();
        let g = s.alloc(40, Category::Gradient).unwrap();
        s.retain(a);
        assert_eq!(s.live_total(), 140);
        s.release(a);
        assert_eq!(s.live_of(Category::Activation), 100);
        s.release(a);
        assert_eq!(s.live_of(Category::Activation), 0);
        assert_eq!(s.memory().live, 40);
        assert_eq!(
            s.peak(),
            (140, {
                let mut b = [0; 8];
                b[Category::Activation.index()] = 100;
                b[Category::Gradient.index()] = 40;
                b
            })
        );
        s.release(g);
        assert_eq!(s.live_tensors(), 0);
        assert_eq!(s.take_window_peak(), 140);
        assert_eq!(s.take_window_peak(), 0);
    }

    /// A memory that rounds every allocation up to 512 bytes, as a caching allocator does.
    struct Rounding(CountingMemory);

    impl TensorMemory for Rounding {
        type Handle = u32;
        type Error = CountingOom;
        fn allocate(&mut self, bytes: u64, c: Category) -> Result<Allocated<u32>, CountingOom> {
            self.0.allocate(bytes.div_ceil(512) * 512, c)
        }
        fn free(&mut self, handle: u32) {
            self.0.free(handle)
        }
    }

    #[test]
    fn requested_bytes_are_kept_beside_the_rounded_ones() {
        let mut s = TensorStore::new(Rounding(CountingMemory::new()));
        let a = s.alloc(100, Category::Activation).unwrap();
        let g = s.alloc(1000, Category::Gradient).unwrap();
        assert_eq!(s.live_of(Category::Gradient), 1024);
        let asked = s.live_requested_by_category();
        assert_eq!(asked[Category::Gradient.index()], 1000);
        assert_eq!(asked[Category::Activation.index()], 100);
        s.release(a);
        s.release(g);
        assert_eq!(s.live_requested_by_category(), [0; 8]);
    }

    #[test]
    fn capacity_is_enforced() {
        let mut s = TensorStore::new(CountingMemory::with_capacity(100));
        s.alloc(60, Category::Parameter).unwrap();
        let e = s.alloc(60, Category::Parameter).unwrap_err();
        assert_eq!(e.requested, 60);
    }
}
