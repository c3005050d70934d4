//! A device memory model for Meta: trainmem-alloc's caching allocator (PyTorch's rules) fed
//! with every tensor buffer a Meta device creates and releases.
//!
//! [`CachingModel`] is a cloneable handle: give one clone to the device
//! ([`CachingModel::device`]) and keep another to read the allocator's figures, its
//! statistics and its PyTorch-format snapshot while or after the run. Each buffer becomes one
//! `malloc` on the default stream, labelled with its category's name; dropping the last tensor
//! using it frees the block back to the cache. `Backend::memory_cleanup` on the device runs the
//! allocator's `empty_cache`.
//!
//! An allocation the modelled device cannot hold does not abort the burn program (ops cannot
//! fail); the buffer is left out of the allocator, and the first such out-of-memory report is
//! kept ([`CachingModel::out_of_memory`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use trainmem_alloc::{BlockId, CachingAllocator, DeviceMemory, Snapshot, StreamId};
use trainmem_core::Category;

use crate::device::MetaDevice;
use crate::memory::{AllocationHook, DeviceTotals};

#[derive(Debug)]
struct State<D: DeviceMemory> {
    allocator: CachingAllocator<D>,
    blocks: HashMap<u64, BlockId>,
    out_of_memory: Option<String>,
}

/// A caching-allocator memory model shared between a Meta device and its observer.
#[derive(Debug)]
pub struct CachingModel<D: DeviceMemory> {
    state: Arc<Mutex<State<D>>>,
}

impl<D: DeviceMemory> Clone for CachingModel<D> {
    fn clone(&self) -> Self {
        CachingModel {
            state: Arc::clone(&self.state),
        }
    }
}

impl<D: DeviceMemory + std::fmt::Debug + 'static> CachingModel<D> {
    /// A model over `allocator` (configure it, or set its memory fraction, before the run).
    pub fn new(allocator: CachingAllocator<D>) -> CachingModel<D> {
        CachingModel {
            state: Arc::new(Mutex::new(State {
                allocator,
                blocks: HashMap::new(),
                out_of_memory: None,
            })),
        }
    }

    /// A fresh Meta device whose buffers go through this model.
    pub fn device(&self) -> MetaDevice {
        MetaDevice::with_hook(Box::new(self.clone()))
    }

    fn lock(&self) -> MutexGuard<'_, State<D>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the allocator (statistics, snapshot, summary, configuration).
    pub fn with_allocator<R>(&self, f: impl FnOnce(&mut CachingAllocator<D>) -> R) -> R {
        f(&mut self.lock().allocator)
    }

    /// The allocator's snapshot in PyTorch's format (for memory_viz).
    pub fn snapshot(&self) -> Snapshot {
        self.lock().allocator.snapshot()
    }

    /// The first out-of-memory report, if an allocation did not fit.
    pub fn out_of_memory(&self) -> Option<String> {
        self.lock().out_of_memory.clone()
    }
}

impl<D: DeviceMemory + std::fmt::Debug + 'static> AllocationHook for CachingModel<D> {
    fn allocated(&mut self, id: u64, bytes: u64, category: Category) {
        let mut state = self.lock();
        match state
            .allocator
            .malloc_labeled(bytes, StreamId::DEFAULT, category.name())
        {
            Ok(block) => {
                state.blocks.insert(id, block.id);
            }
            Err(error) => {
                if state.out_of_memory.is_none() {
                    state.out_of_memory = Some(error.to_string());
                }
            }
        }
    }

    fn freed(&mut self, id: u64, _bytes: u64, _category: Category) {
        let mut state = self.lock();
        if let Some(block) = state.blocks.remove(&id) {
            // The id came from this allocator and is freed once, so this cannot fail; a
            // failure would mean a bookkeeping bug, reported rather than ignored.
            if let Err(error) = state.allocator.free(block) {
                panic!("trainmem-meta: caching model: freeing block {block:?}: {error}");
            }
        }
    }

    fn device_totals(&mut self) -> Option<DeviceTotals> {
        let mut state = self.lock();
        let a = &mut state.allocator;
        let totals = DeviceTotals {
            allocated: a.memory_allocated(),
            reserved: a.memory_reserved(),
            peak_allocated: a.max_memory_allocated(),
            peak_reserved: a.max_memory_reserved(),
        };
        a.reset_peak_stats();
        Some(totals)
    }

    fn empty_cache(&mut self) {
        let mut state = self.lock();
        if let Err(error) = state.allocator.empty_cache() {
            panic!("trainmem-meta: caching model: empty_cache: {error}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Meta;
    use burn::tensor::backend::Backend;
    use burn::tensor::{Distribution, Tensor};
    use trainmem_alloc::SimulatedDevice;

    #[test]
    fn tensors_become_rounded_blocks_that_stay_cached_until_empty_cache() {
        let model = CachingModel::new(CachingAllocator::new(SimulatedDevice::new(1 << 30)));
        let device = model.device();
        // 1000 f32 = 4000 B → 4096 B in a 2 MiB small-pool segment.
        let small = Tensor::<Meta, 1>::random([1000], Distribution::Default, &device);
        // 3 MiB → a 20 MiB large-pool segment.
        let large = Tensor::<Meta, 2>::random([768, 1024], Distribution::Default, &device);
        let (allocated, reserved) =
            model.with_allocator(|a| (a.memory_allocated(), a.memory_reserved()));
        assert_eq!(allocated, 4096 + (3 << 20));
        assert_eq!(reserved, (2 << 20) + (20 << 20));
        drop(large);
        let (allocated, reserved) =
            model.with_allocator(|a| (a.memory_allocated(), a.memory_reserved()));
        assert_eq!((allocated, reserved), (4096, (2 << 20) + (20 << 20)));
        Meta::memory_cleanup(&device);
        assert_eq!(model.with_allocator(|a| a.memory_reserved()), 2 << 20);
        drop(small);
        assert_eq!(model.snapshot().segments.len(), 1);
        assert!(model.out_of_memory().is_none());
    }

    #[test]
    fn an_allocation_that_does_not_fit_is_reported() {
        let model = CachingModel::new(CachingAllocator::new(SimulatedDevice::new(8 << 20)));
        let device = model.device();
        let too_big = Tensor::<Meta, 2>::random([4096, 1024], Distribution::Default, &device);
        let report = model.out_of_memory().unwrap_or_default();
        assert!(report.contains("out of memory"), "{report}");
        assert_eq!(
            device.stats().total_live,
            16 << 20,
            "Meta still counts the tensor"
        );
        drop(too_big);
    }
}
