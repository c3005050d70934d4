//! [`TensorMemory`] over trainmem-alloc's [`CachingAllocator`]: every tensor is a block of the
//! caching allocator, labelled with its category (so snapshots and traces carry it).

use trainmem_alloc::{AllocError, BlockId, CachingAllocator, DeviceMemory, Label, StreamId};
use trainmem_core::Category;

use crate::store::{Allocated, TensorMemory};

/// A caching allocator used as tensor memory. Allocations go to the default stream and are
/// labelled with the category name (`"activation"`, `"gradient"`, ...).
#[derive(Debug)]
pub struct AllocatorMemory<D: DeviceMemory> {
    /// The allocator (public for stats, snapshots, `empty_cache`).
    pub allocator: CachingAllocator<D>,
    /// Frees the allocator rejected (a bug in the caller if ever non-zero).
    pub failed_frees: u64,
}

impl<D: DeviceMemory> AllocatorMemory<D> {
    /// Wraps an allocator.
    pub fn new(allocator: CachingAllocator<D>) -> AllocatorMemory<D> {
        AllocatorMemory {
            allocator,
            failed_frees: 0,
        }
    }
}

const LABELS: [Label; 8] = [
    Label::new_static("parameter"),
    Label::new_static("gradient"),
    Label::new_static("optimizer_state"),
    Label::new_static("activation"),
    Label::new_static("input"),
    Label::new_static("temporary"),
    Label::new_static("cache"),
    Label::new_static("other"),
];

impl<D: DeviceMemory> TensorMemory for AllocatorMemory<D> {
    type Handle = BlockId;
    type Error = AllocError;

    #[inline]
    fn allocate(
        &mut self,
        bytes: u64,
        category: Category,
    ) -> Result<Allocated<BlockId>, AllocError> {
        let label = LABELS[category.index()].clone();
        let b = self
            .allocator
            .malloc_labeled(bytes, StreamId::DEFAULT, label)?;
        Ok(Allocated {
            handle: b.id,
            size: b.size,
        })
    }

    #[inline]
    fn free(&mut self, handle: BlockId) {
        if self.allocator.free(handle).is_err() {
            self.failed_frees += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::TensorStore;
    use trainmem_alloc::SimulatedDevice;

    #[test]
    fn labels_match_category_names_and_sizes_are_rounded() {
        for c in Category::ALL {
            assert_eq!(LABELS[c.index()].as_str(), c.name());
        }
        let mem = AllocatorMemory::new(CachingAllocator::new(SimulatedDevice::new(1 << 30)));
        let mut s = TensorStore::new(mem);
        let t = s.alloc(1000, Category::Activation).unwrap();
        assert_eq!(s.size(t), 1024);
        assert_eq!(s.memory().allocator.memory_allocated(), 1024);
        s.release(t);
        assert_eq!(s.memory().allocator.memory_allocated(), 0);
        assert_eq!(s.memory().failed_frees, 0);
    }
}
