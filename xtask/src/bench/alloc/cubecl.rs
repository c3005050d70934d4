//! Drives cubecl's `MemoryManagement` (cubecl-runtime 0.10.0, the version burn 0.21 uses)
//! standalone on the host, configured as burn's CUDA backend configures it.
//!
//! The configuration and the counting storage are trainmem-meta's ([`trainmem_meta::cubecl`]),
//! the same ones Meta's cubecl memory model uses: the `SubSlices` preset (the default unless
//! cubecl is built exclusive-only), a largest page of a quarter of the device (what cubecl's
//! CUDA runtime sets) and 512-byte alignment (cubecl-cuda's). Freeing in cubecl is dropping the
//! handle; there is no `free` call.

use cubecl_runtime::memory_management::{ManagedMemoryHandle, MemoryManagement, MemoryUsage};
use cubecl_runtime::storage::ComputeStorage;
use trainmem_meta::cubecl::{CUDA_ALIGNMENT, CubeclConfig};
pub use trainmem_meta::cubecl::{NullStorage, Tracked};

/// Alignment cubecl uses on CUDA devices.
pub const ALIGNMENT: u64 = CUDA_ALIGNMENT;

/// Builds a manager over `storage` for a device of `capacity` bytes.
pub fn manager<S: ComputeStorage>(storage: S, capacity: u64) -> MemoryManagement<S> {
    CubeclConfig::cuda(capacity).manager(storage, "trainmem-bench")
}

/// A storage that allocates nothing, reporting cubecl's CUDA alignment.
pub fn null_storage() -> NullStorage {
    NullStorage::new(ALIGNMENT)
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
/// A manager over trainmem-meta's counting storage.
pub fn counting_manager(capacity: u64) -> MemoryManagement<trainmem_meta::cubecl::CountingStorage> {
    trainmem_meta::cubecl::counting_manager(CubeclConfig::cuda(capacity))
}

/// Reserved/allocated figures in the same sense as the other allocators: allocated is the bytes
/// of live slices including their padding, reserved the bytes of the pages.
pub fn usage_figures(usage: &MemoryUsage) -> (u64, u64) {
    (
        usage.bytes_in_use + usage.bytes_padding,
        usage.bytes_reserved,
    )
}

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
