//! [`HostDevice`]: a device backed by real host memory, so blocks can be read and written.

use std::alloc::Layout;
use std::collections::HashMap;

use crate::device::{DeviceError, DeviceMemory};

/// A device whose segments are real, zero-initialised host memory from the system allocator,
/// aligned to [`HostDevice::ALIGNMENT`] bytes. Segments are obtained with the allocator's
/// zeroed allocation at its natural alignment and then aligned by hand, so large segments come
/// from fresh, lazily zeroed pages instead of being zero-filled up front. Reach a block's bytes with
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
    /// Aligned segment address → the raw allocation behind it.
    live: HashMap<u64, RawSegment>,
}

/// One system allocation backing a segment: the raw pointer and layout to free, and the
/// usable (aligned) size handed out.
#[derive(Debug, Clone, Copy)]
struct RawSegment {
    raw: u64,
    layout: Layout,
    size: u64,
}

impl RawSegment {
    fn release(self) {
        // SAFETY: `raw` was returned by `alloc_zeroed` with exactly `layout`; callers take the
        // segment out of `live` (which holds each allocation once) before releasing it, so it
        // is freed exactly once.
        unsafe { std::alloc::dealloc(self.raw as *mut u8, self.layout) };
    }
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
        self.live.iter().any(|(&base, segment)| {
            address >= base
                && address
                    .checked_add(len)
                    .is_some_and(|end| end <= base + segment.size)
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
        // Over-allocate by the alignment at the allocator's natural alignment: a zeroed
        // allocation at natural alignment maps fresh pages lazily, while one at 512-byte
        // alignment would be zero-filled eagerly.
        let padded = bytes
            .checked_add(Self::ALIGNMENT)
            .ok_or_else(|| oom.clone())?;
        let layout = Layout::from_size_align(padded, 16).map_err(|_| oom.clone())?;
        // SAFETY: `layout` has a non-zero size (checked above) and a valid power-of-two alignment.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(oom);
        }
        let raw = ptr as u64;
        let align = Self::ALIGNMENT as u64;
        let address = raw.div_ceil(align) * align;
        // `address - raw < ALIGNMENT`, so `[address, address + size)` lies inside the allocation.
        self.live.insert(address, RawSegment { raw, layout, size });
        self.used += size;
        Ok(address)
    }

    fn free(&mut self, address: u64, size: u64) -> Result<(), DeviceError> {
        match self.live.get(&address) {
            Some(segment) if segment.size == size => {
                let segment = *segment;
                self.live.remove(&address);
                self.used -= size;
                segment.release();
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
        for (_, segment) in self.live.drain() {
            segment.release();
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
        // Memory is really zeroed and writable over the whole segment.
        let b = d.allocate(4 << 20).unwrap();
        // SAFETY: `b` is a live 4 MiB segment of this device, valid for reads and writes.
        let bytes = unsafe { std::slice::from_raw_parts_mut(b as *mut u8, 4 << 20) };
        assert!(bytes.iter().all(|&x| x == 0));
        bytes[0] = 1;
        bytes[(4 << 20) - 1] = 2;
        d.free(b, 4 << 20).unwrap();
        // Leave one allocation for Drop to release.
        d.allocate(2 << 20).unwrap();
        assert_eq!(d.used_bytes(), 2 << 20);
    }
}
