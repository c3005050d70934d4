//! [`HostDevice`]: a device backed by real host memory, so blocks can be read and written.

use std::alloc::Layout;
use std::collections::HashMap;

use crate::device::{DeviceError, DeviceMemory};

/// A device whose segments are real, zero-initialised host memory from the system allocator,
/// aligned to [`HostDevice::ALIGNMENT`] bytes. Reach a block's bytes with
/// [`CachingAllocator::block_bytes`](crate::CachingAllocator::block_bytes) /
/// [`block_bytes_mut`](crate::CachingAllocator::block_bytes_mut), or
/// [`Allocation::with_bytes`](crate::Allocation::with_bytes) on a shared allocator.
///
/// `capacity` is a budget: allocations beyond it fail with
/// [`DeviceError::OutOfMemory`] even if the system has more memory.
#[derive(Debug)]
pub struct HostDevice {
    capacity: u64,
    used: u64,
    live: HashMap<u64, Layout>,
}

impl HostDevice {
    /// Alignment of every segment (and, since block sizes are multiples of 512, of every block).
    pub const ALIGNMENT: usize = 512;

    /// A host-memory device with a budget of `capacity` bytes.
    pub fn new(capacity: u64) -> Self {
        HostDevice {
            capacity,
            used: 0,
            live: HashMap::new(),
        }
    }

    /// Bytes currently handed out.
    pub fn used_bytes(&self) -> u64 {
        self.used
    }

    /// True when `[address, address + len)` lies inside one live segment.
    pub(crate) fn contains(&self, address: u64, len: u64) -> bool {
        // Segments are few; a linear scan keeps this simple and is only used on checked access.
        self.live.iter().any(|(&base, layout)| {
            address >= base
                && address
                    .checked_add(len)
                    .is_some_and(|end| end <= base + layout.size() as u64)
        })
    }
}

impl DeviceMemory for HostDevice {
    fn allocate(&mut self, size: u64) -> Result<u64, DeviceError> {
        let free = self.free_bytes();
        let oom = DeviceError::OutOfMemory {
            requested: size,
            free,
        };
        if size == 0 || size > free {
            return Err(oom);
        }
        let bytes = usize::try_from(size).map_err(|_| oom.clone())?;
        let layout = Layout::from_size_align(bytes, Self::ALIGNMENT).map_err(|_| oom.clone())?;
        // SAFETY: `layout` has a non-zero size (checked above) and a valid power-of-two alignment.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(oom);
        }
        let address = ptr as u64;
        self.live.insert(address, layout);
        self.used += size;
        Ok(address)
    }

    fn free(&mut self, address: u64, size: u64) -> Result<(), DeviceError> {
        match self.live.get(&address) {
            Some(layout) if layout.size() as u64 == size => {
                let layout = *layout;
                self.live.remove(&address);
                self.used -= size;
                // SAFETY: `address` was returned by `alloc_zeroed` with exactly `layout` (looked up
                // in `live`, which holds each live allocation once) and is removed from `live`
                // before this call, so it is freed once.
                unsafe { std::alloc::dealloc(address as *mut u8, layout) };
                Ok(())
            }
            _ => Err(DeviceError::UnknownAddress { address }),
        }
    }

    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn free_bytes(&self) -> u64 {
        self.capacity.saturating_sub(self.used)
    }

    fn name(&self) -> String {
        "host device".to_string()
    }
}

impl Drop for HostDevice {
    fn drop(&mut self) {
        for (address, layout) in self.live.drain() {
            // SAFETY: every entry of `live` is a distinct live allocation made by `alloc_zeroed`
            // with that layout; draining guarantees each is freed once.
            unsafe { std::alloc::dealloc(address as *mut u8, layout) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_device_allocates_aligned_zeroed_memory() {
        let mut d = HostDevice::new(8 << 20);
        let a = d.allocate(2 << 20).unwrap();
        assert_eq!(a % HostDevice::ALIGNMENT as u64, 0);
        assert!(d.contains(a, 2 << 20));
        assert!(!d.contains(a, (2 << 20) + 1));
        assert_eq!(d.free_bytes(), 6 << 20);
        assert!(matches!(
            d.allocate(7 << 20),
            Err(DeviceError::OutOfMemory { .. })
        ));
        assert!(d.free(a + 512, 2 << 20).is_err());
        d.free(a, 2 << 20).unwrap();
        assert!(d.free(a, 2 << 20).is_err());
        // Leave one allocation for Drop to release.
        d.allocate(2 << 20).unwrap();
        assert_eq!(d.used_bytes(), 2 << 20);
    }
}
