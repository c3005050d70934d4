//! [`CudaDevice`]: segments from the CUDA driver (`cuMemAlloc`), through cudarc. The driver
//! library is loaded at run time, so this compiles on machines without CUDA; constructing a
//! device there returns [`DeviceError::Unavailable`].

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{CudaContext, DriverError, result, sys};

use crate::device::{DeviceError, DeviceMemory};

/// A CUDA device. Each segment is one `cuMemAlloc`; `free` is `cuMemFree`; free bytes come
/// from `cuMemGetInfo`. The primary context is bound to the calling thread on every call, so
/// the allocator may move between threads.
pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    ordinal: usize,
    capacity: u64,
    live: HashMap<u64, u64>,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDevice")
            .field("ordinal", &self.ordinal)
            .field("capacity", &self.capacity)
            .field("live_segments", &self.live.len())
            .finish()
    }
}

fn driver_error(e: DriverError) -> DeviceError {
    DeviceError::Driver(format!("{e:?}"))
}

impl CudaDevice {
    /// Opens CUDA device `ordinal` (its primary context). Fails with
    /// [`DeviceError::Unavailable`] when the CUDA driver library cannot be loaded or there is
    /// no such device.
    pub fn new(ordinal: usize) -> Result<Self, DeviceError> {
        // SAFETY: `is_culib_present` only tries to open the library by name with libloading.
        if !unsafe { sys::is_culib_present() } {
            return Err(DeviceError::Unavailable(
                "the CUDA driver library (libcuda) could not be loaded; is an NVIDIA driver installed?".into(),
            ));
        }
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| DeviceError::Unavailable(format!("CUDA device {ordinal}: {e:?}")))?;
        let capacity = ctx.total_mem().map_err(driver_error)? as u64;
        Ok(CudaDevice {
            ctx,
            ordinal,
            capacity,
            live: HashMap::new(),
        })
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }
}

impl DeviceMemory for CudaDevice {
    fn allocate(&mut self, size: u64) -> Result<u64, DeviceError> {
        self.ctx.bind_to_thread().map_err(driver_error)?;
        let bytes = usize::try_from(size).map_err(|_| DeviceError::OutOfMemory {
            requested: size,
            free: self.free_bytes(),
        })?;
        // SAFETY: the context is bound to this thread; the returned pointer is recorded in
        // `live` and freed exactly once (by `free` or on drop).
        match unsafe { result::malloc_sync(bytes) } {
            Ok(ptr) => {
                self.live.insert(ptr, size);
                Ok(ptr)
            }
            Err(DriverError(sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY)) => {
                Err(DeviceError::OutOfMemory {
                    requested: size,
                    free: self.free_bytes(),
                })
            }
            Err(e) => Err(driver_error(e)),
        }
    }

    fn free(&mut self, address: u64, size: u64) -> Result<(), DeviceError> {
        match self.live.get(&address) {
            Some(&s) if s == size => {}
            _ => return Err(DeviceError::UnknownAddress { address }),
        }
        self.ctx.bind_to_thread().map_err(driver_error)?;
        // SAFETY: `address` came from `malloc_sync` on this context and is still live (checked
        // in `live` above); it is removed from `live` right after, so it is freed once.
        unsafe { result::free_sync(address) }.map_err(driver_error)?;
        self.live.remove(&address);
        Ok(())
    }

    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn free_bytes(&self) -> u64 {
        self.ctx
            .mem_get_info()
            .map(|(free, _total)| free as u64)
            .unwrap_or(0)
    }

    fn name(&self) -> String {
        format!("CUDA device {}", self.ordinal)
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_err() {
            return;
        }
        for (address, _) in self.live.drain() {
            // SAFETY: each entry is a live `malloc_sync` pointer of this context, freed once.
            let _ = unsafe { result::free_sync(address) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_device_opens_or_reports_unavailable() {
        match CudaDevice::new(0) {
            Ok(mut d) => {
                let a = d.allocate(2 << 20).unwrap();
                assert!(d.capacity() >= 2 << 20);
                d.free(a, 2 << 20).unwrap();
                assert!(d.free(a, 2 << 20).is_err());
                // Through the caching allocator: one 20 MiB segment, released by empty_cache.
                let mut alloc = crate::CachingAllocator::new(d);
                let b = alloc.malloc(3 << 20, crate::StreamId::DEFAULT).unwrap();
                assert_eq!(alloc.memory_reserved(), 20 << 20);
                alloc.free(b).unwrap();
                assert_eq!(alloc.empty_cache().unwrap().bytes, 20 << 20);
                crate::testing::check_invariants(&alloc).unwrap();
            }
            Err(e) => assert!(matches!(e, DeviceError::Unavailable(_)), "{e}"),
        }
    }
}
