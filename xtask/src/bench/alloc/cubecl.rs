//! Drives cubecl's `MemoryManagement` (cubecl-runtime 0.10.0, the version burn 0.21 uses)
//! standalone on the host, the way burn's CUDA backend configures it.
//!
//! Freeing in cubecl is dropping the handle; there is no `free` call. The manager is built with
//! the `SubSlices` preset (the default unless cubecl is built exclusive-only), a page size of a
//! quarter of the device (what cubecl's CUDA runtime sets) and 256-byte alignment.

use std::collections::HashMap;
use std::sync::Arc;

use cubecl_ir::MemoryDeviceProperties;
use cubecl_runtime::logging::ServerLogger;
use cubecl_runtime::memory_management::{
    ManagedMemoryHandle, MemoryAllocationMode, MemoryConfiguration, MemoryManagement,
    MemoryManagementOptions, MemoryUsage,
};
use cubecl_runtime::server::IoError;
use cubecl_runtime::storage::{ComputeStorage, StorageHandle, StorageId, StorageUtilization};

/// Alignment cubecl uses on CUDA devices.
pub const ALIGNMENT: u64 = 256;

/// Builds a manager over `storage` for a device of `capacity` bytes.
pub fn manager<S: ComputeStorage>(storage: S, capacity: u64) -> MemoryManagement<S> {
    let properties = MemoryDeviceProperties {
        max_page_size: capacity / 4,
        alignment: ALIGNMENT,
    };
    MemoryManagement::from_configuration(
        storage,
        &properties,
        MemoryConfiguration::SubSlices,
        Arc::new(ServerLogger::default()),
        MemoryManagementOptions::new("trainmem-bench").mode(MemoryAllocationMode::Auto),
    )
}

#[cfg(test)]
/// A manager over real host memory (`BytesStorage`: zeroed allocations, touched lazily).
pub fn bytes_manager(
    capacity: u64,
) -> MemoryManagement<Tracked<cubecl_runtime::storage::BytesStorage>> {
    manager(
        Tracked::new(cubecl_runtime::storage::BytesStorage::default()),
        capacity,
    )
}

#[cfg(test)]
/// A manager over [`CountingStorage`].
pub fn counting_manager(capacity: u64) -> MemoryManagement<CountingStorage> {
    manager(CountingStorage::default(), capacity)
}

/// Reserved/allocated figures in the same sense as the other allocators: allocated is the bytes
/// of live slices including their padding, reserved the bytes of the pages.
pub fn usage_figures(usage: &MemoryUsage) -> (u64, u64) {
    (
        usage.bytes_in_use + usage.bytes_padding,
        usage.bytes_reserved,
    )
}

/// Wraps a storage and counts the bytes of the pages the manager holds, with their peak (the
/// reserved figures; cubecl reports no peak of its own).
#[derive(Debug, Default)]
pub struct Tracked<S> {
    inner: S,
    sizes: HashMap<StorageId, u64>,
    bytes: u64,
    peak: u64,
}

impl<S> Tracked<S> {
    /// Wraps `inner`.
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            sizes: HashMap::new(),
            bytes: 0,
            peak: 0,
        }
    }

    /// Bytes the manager currently holds.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Highest [`bytes`](Self::bytes) so far.
    pub fn peak(&self) -> u64 {
        self.peak
    }
}

impl<S: ComputeStorage> ComputeStorage for Tracked<S> {
    type Resource = S::Resource;

    fn alignment(&self) -> usize {
        self.inner.alignment()
    }

    fn get(&mut self, handle: &StorageHandle) -> Self::Resource {
        self.inner.get(handle)
    }

    fn alloc(&mut self, size: u64) -> Result<StorageHandle, IoError> {
        let handle = self.inner.alloc(size)?;
        self.sizes.insert(handle.id, size);
        self.bytes += size;
        self.peak = self.peak.max(self.bytes);
        Ok(handle)
    }

    fn dealloc(&mut self, id: StorageId) {
        if let Some(size) = self.sizes.remove(&id) {
            self.bytes -= size;
        }
        self.inner.dealloc(id);
    }

    fn flush(&mut self) {
        self.inner.flush();
    }
}

/// A storage that allocates nothing: it hands out fresh ids, so the manager's own bookkeeping
/// is all that is measured (the same footing as a simulated device).
#[derive(Debug, Default)]
pub struct NullStorage;

impl ComputeStorage for NullStorage {
    type Resource = ();

    fn alignment(&self) -> usize {
        ALIGNMENT as usize
    }

    fn get(&mut self, _handle: &StorageHandle) -> Self::Resource {}

    fn alloc(&mut self, size: u64) -> Result<StorageHandle, IoError> {
        Ok(StorageHandle::new(
            StorageId::new(),
            StorageUtilization { offset: 0, size },
        ))
    }

    fn dealloc(&mut self, _id: StorageId) {}

    fn flush(&mut self) {}
}

/// Counts pages without allocating them.
#[cfg(test)]
pub type CountingStorage = Tracked<NullStorage>;

/// A live cubecl allocation (dropping it frees the slice).
pub type Handle = ManagedMemoryHandle;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counting_storage_tracks_pages() {
        let mut mm = counting_manager(1 << 30);
        let a = mm.reserve(3 << 20).unwrap();
        let b = mm.reserve(100).unwrap();
        let (allocated, reserved) = usage_figures(&mm.memory_usage());
        assert!(allocated >= (3 << 20) + 100, "{allocated}");
        assert!(reserved >= allocated);
        assert_eq!(mm.storage().bytes(), reserved);
        drop(a);
        drop(b);
        mm.cleanup(true);
        let (allocated, _) = usage_figures(&mm.memory_usage());
        assert_eq!(allocated, 0);
    }

    #[test]
    fn bytes_storage_runs_the_same_policy() {
        let mut counted = counting_manager(1 << 30);
        let mut bytes = bytes_manager(1 << 30);
        let mut keep = Vec::new();
        for size in [100u64, 5 << 20, 40 << 20, 700, 2 << 20] {
            keep.push((counted.reserve(size).unwrap(), bytes.reserve(size).unwrap()));
        }
        keep.remove(1);
        assert_eq!(counted.memory_usage(), bytes.memory_usage());
    }
}
