//! [`SharedAllocator`]: the thread-safe form (a mutex around a [`CachingAllocator`]) with
//! RAII [`Allocation`] handles.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::allocator::{CachingAllocator, ReleasedMemory};
use crate::block::{Block, BlockId};
use crate::config::{AllocatorConfig, ConfigError};
use crate::device::DeviceMemory;
use crate::error::AllocError;
use crate::host::HostDevice;
use crate::label::Label;
use crate::snapshot::Snapshot;
use crate::stats::MemoryStats;
use crate::stream::StreamId;
use crate::trace::TraceEntry;

/// A [`CachingAllocator`] behind an `Arc<Mutex<_>>`: `Clone`, `Send` and `Sync`; every method
/// takes the lock for its duration (like PyTorch's per-device mutex). Allocate with
/// [`alloc`](SharedAllocator::alloc) for an RAII [`Allocation`] that frees on drop, or with
/// [`malloc`](SharedAllocator::malloc) + [`free`](SharedAllocator::free) for explicit control.
/// [`lock`](SharedAllocator::lock) gives the whole `&mut CachingAllocator` API for a batch of
/// operations under one lock (do not drop an `Allocation` or call another method of this
/// allocator while holding the guard on the same thread: the mutex is not re-entrant).
pub struct SharedAllocator<D: DeviceMemory> {
    inner: Arc<Mutex<CachingAllocator<D>>>,
}

impl<D: DeviceMemory> Clone for SharedAllocator<D> {
    fn clone(&self) -> Self {
        SharedAllocator {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<D: DeviceMemory> std::fmt::Debug for SharedAllocator<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("SharedAllocator")
            .field(&*self.lock())
            .finish()
    }
}

impl<D: DeviceMemory> SharedAllocator<D> {
    /// A shared allocator with the default configuration.
    pub fn new(device: D) -> Self {
        Self::from_allocator(CachingAllocator::new(device))
    }

    /// A shared allocator with the given configuration.
    pub fn with_config(device: D, config: AllocatorConfig) -> Self {
        Self::from_allocator(CachingAllocator::with_config(device, config))
    }

    /// Wraps an existing allocator.
    pub fn from_allocator(allocator: CachingAllocator<D>) -> Self {
        SharedAllocator {
            inner: Arc::new(Mutex::new(allocator)),
        }
    }

    /// Locks the allocator. A panic in another thread while it held the lock does not make
    /// the allocator unusable (its state is consistent between operations).
    pub fn lock(&self) -> MutexGuard<'_, CachingAllocator<D>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Allocates `size` bytes on `stream`, returning a handle that frees the block when dropped.
    pub fn alloc(&self, size: u64, stream: StreamId) -> Result<Allocation<D>, AllocError> {
        let mut g = self.lock();
        let block = g.malloc(size, stream)?;
        g.set_raii(block.id, true)?;
        drop(g);
        Ok(Allocation {
            shared: Some(self.clone()),
            block,
        })
    }

    /// Like [`alloc`](Self::alloc), with a label.
    pub fn alloc_labeled(
        &self,
        size: u64,
        stream: StreamId,
        label: impl Into<Label>,
    ) -> Result<Allocation<D>, AllocError> {
        let mut g = self.lock();
        let block = g.malloc_labeled(size, stream, label)?;
        g.set_raii(block.id, true)?;
        drop(g);
        Ok(Allocation {
            shared: Some(self.clone()),
            block,
        })
    }

    /// Explicit allocation; see [`CachingAllocator::malloc`].
    pub fn malloc(&self, size: u64, stream: StreamId) -> Result<Block, AllocError> {
        self.lock().malloc(size, stream)
    }

    /// Explicit labelled allocation; see [`CachingAllocator::malloc_labeled`].
    pub fn malloc_labeled(
        &self,
        size: u64,
        stream: StreamId,
        label: impl Into<Label>,
    ) -> Result<Block, AllocError> {
        self.lock().malloc_labeled(size, stream, label)
    }

    /// Explicit free; see [`CachingAllocator::free`].
    pub fn free(&self, id: impl Into<BlockId>) -> Result<(), AllocError> {
        self.lock().free(id)
    }

    /// Free by address; see [`CachingAllocator::free_address`].
    pub fn free_address(&self, address: u64) -> Result<(), AllocError> {
        self.lock().free_address(address)
    }

    /// See [`CachingAllocator::record_stream`].
    pub fn record_stream(
        &self,
        id: impl Into<BlockId>,
        stream: StreamId,
    ) -> Result<(), AllocError> {
        self.lock().record_stream(id, stream)
    }

    /// See [`CachingAllocator::synchronize_stream`].
    pub fn synchronize_stream(&self, stream: StreamId) -> usize {
        self.lock().synchronize_stream(stream)
    }

    /// See [`CachingAllocator::synchronize`].
    pub fn synchronize(&self) -> usize {
        self.lock().synchronize()
    }

    /// See [`CachingAllocator::empty_cache`].
    pub fn empty_cache(&self) -> Result<ReleasedMemory, AllocError> {
        self.lock().empty_cache()
    }

    /// See [`CachingAllocator::set_memory_fraction`].
    pub fn set_memory_fraction(&self, fraction: f64) -> Result<(), ConfigError> {
        self.lock().set_memory_fraction(fraction)
    }

    /// A copy of the statistics.
    pub fn stats(&self) -> MemoryStats {
        self.lock().stats().clone()
    }

    /// The flattened statistics map with PyTorch keys.
    pub fn memory_stats(&self) -> BTreeMap<String, i64> {
        self.lock().memory_stats()
    }

    /// `allocated_bytes.all.current`.
    pub fn memory_allocated(&self) -> u64 {
        self.lock().memory_allocated()
    }

    /// `reserved_bytes.all.current`.
    pub fn memory_reserved(&self) -> u64 {
        self.lock().memory_reserved()
    }

    /// `allocated_bytes.all.peak`.
    pub fn max_memory_allocated(&self) -> u64 {
        self.lock().max_memory_allocated()
    }

    /// `reserved_bytes.all.peak`.
    pub fn max_memory_reserved(&self) -> u64 {
        self.lock().max_memory_reserved()
    }

    /// See [`CachingAllocator::reset_peak_stats`].
    pub fn reset_peak_stats(&self) {
        self.lock().reset_peak_stats()
    }

    /// See [`CachingAllocator::reset_accumulated_stats`].
    pub fn reset_accumulated_stats(&self) {
        self.lock().reset_accumulated_stats()
    }

    /// See [`CachingAllocator::snapshot`].
    pub fn snapshot(&self) -> Snapshot {
        self.lock().snapshot()
    }

    /// See [`CachingAllocator::memory_summary`].
    pub fn memory_summary(&self) -> String {
        self.lock().memory_summary()
    }

    /// See [`CachingAllocator::enable_trace`].
    pub fn enable_trace(&self, max_entries: Option<usize>) {
        self.lock().enable_trace(max_entries)
    }

    /// See [`CachingAllocator::disable_trace`].
    pub fn disable_trace(&self) {
        self.lock().disable_trace()
    }

    /// See [`CachingAllocator::trace`].
    pub fn trace(&self) -> Vec<TraceEntry> {
        self.lock().trace()
    }

    /// See [`CachingAllocator::take_trace`].
    pub fn take_trace(&self) -> Vec<TraceEntry> {
        self.lock().take_trace()
    }

    /// See [`CachingAllocator::set_time`].
    pub fn set_time(&self, time: u64) {
        self.lock().set_time(time)
    }
}

/// An RAII allocation: the block is freed (through the allocator's normal `free`, so
/// `record_stream` uses still delay it) when the handle is dropped. While the handle lives,
/// explicit `free`/`free_address` of its block fail with [`AllocError::OwnedByHandle`].
pub struct Allocation<D: DeviceMemory> {
    shared: Option<SharedAllocator<D>>,
    block: Block,
}

impl<D: DeviceMemory> std::fmt::Debug for Allocation<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Allocation")
            .field("block", &self.block)
            .finish()
    }
}

impl<D: DeviceMemory> Allocation<D> {
    /// The block.
    pub fn block(&self) -> Block {
        self.block
    }

    /// The block's id.
    pub fn id(&self) -> BlockId {
        self.block.id
    }

    /// Address of the first byte (0 for a zero-byte allocation).
    pub fn address(&self) -> u64 {
        self.block.address
    }

    /// Size after rounding.
    pub fn size(&self) -> u64 {
        self.block.size
    }

    /// The requested size.
    pub fn requested_size(&self) -> u64 {
        self.block.requested_size
    }

    /// The allocation stream.
    pub fn stream(&self) -> StreamId {
        self.block.stream
    }

    /// Marks the block as used by `stream`; see [`CachingAllocator::record_stream`].
    pub fn record_stream(&self, stream: StreamId) -> Result<(), AllocError> {
        match &self.shared {
            Some(s) => s.lock().record_stream(self.block.id, stream),
            None => Ok(()),
        }
    }

    /// Gives up RAII ownership: the block stays allocated and must be freed explicitly with
    /// `free(block.id)`.
    pub fn into_block(mut self) -> Block {
        if let Some(s) = self.shared.take() {
            // The block is live (we own it), so this cannot fail unless the allocator inside
            // the mutex was replaced, in which case there is nothing to release.
            let _ = s.lock().set_raii(self.block.id, false);
        }
        self.block
    }
}

impl Allocation<HostDevice> {
    /// Runs `f` on the block's bytes, holding the allocator lock meanwhile (so the memory
    /// cannot be released during the call).
    pub fn with_bytes<R>(&self, f: impl FnOnce(&[u8]) -> R) -> Result<R, AllocError> {
        let Some(s) = &self.shared else {
            return Ok(f(&[]));
        };
        let g = s.lock();
        Ok(f(g.owned_block_bytes(self.block.id)?))
    }

    /// Runs `f` on the block's bytes, writable, holding the allocator lock meanwhile.
    pub fn with_bytes_mut<R>(&mut self, f: impl FnOnce(&mut [u8]) -> R) -> Result<R, AllocError> {
        let Some(s) = &self.shared else {
            return Ok(f(&mut []));
        };
        let mut g = s.lock();
        Ok(f(g.owned_block_bytes_mut(self.block.id)?))
    }
}

impl<D: DeviceMemory> Drop for Allocation<D> {
    fn drop(&mut self) {
        if let Some(s) = self.shared.take() {
            // Errors are impossible for a handle's own live block; if the allocator inside the
            // mutex was replaced, the block is not ours to free.
            let _ = s.lock().free_owned(self.block.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::SimulatedDevice;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn shared_is_send_sync_and_raii_frees() {
        assert_send_sync::<SharedAllocator<SimulatedDevice>>();
        assert_send_sync::<CachingAllocator<SimulatedDevice>>();
        assert_send_sync::<CachingAllocator<HostDevice>>();
        assert_send_sync::<SharedAllocator<HostDevice>>();
        assert_send_sync::<Allocation<SimulatedDevice>>();
        let a = SharedAllocator::new(SimulatedDevice::new(1 << 30));
        {
            let h = a.alloc(1000, StreamId::DEFAULT).unwrap();
            assert_eq!(h.size(), 1024);
            assert_eq!(a.memory_allocated(), 1024);
            // Explicit free of an owned block is refused.
            assert_eq!(
                a.free(h.id()),
                Err(AllocError::OwnedByHandle {
                    sequence: h.id().sequence()
                })
            );
            assert!(a.free_address(h.address()).is_err());
        }
        assert_eq!(a.memory_allocated(), 0);
        assert_eq!(a.memory_reserved(), 2 << 20);
        let h = a
            .alloc_labeled(5000, StreamId::DEFAULT, "activation")
            .unwrap();
        let b = h.into_block();
        a.free(b.id).unwrap();
        assert_eq!(
            a.free(b.id),
            Err(AllocError::DoubleFree {
                sequence: b.id.sequence()
            })
        );
        assert_eq!(
            a.record_stream(b.id, StreamId(1)),
            Err(AllocError::AlreadyFreed {
                sequence: b.id.sequence()
            })
        );
        assert_eq!(a.empty_cache().unwrap().segments, 1);
    }

    #[test]
    fn threads_share_one_allocator() {
        let a = SharedAllocator::new(SimulatedDevice::new(1 << 32));
        let handles: Vec<_> = (0..4)
            .map(|t| {
                let a = a.clone();
                std::thread::spawn(move || {
                    for i in 0..500u64 {
                        let h = a.alloc(512 * (1 + (i + t) % 7), StreamId(t)).unwrap();
                        assert!(h.size() >= 512);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(a.memory_allocated(), 0);
        assert_eq!(a.stats().allocation.all.allocated, 2000);
        crate::testing::check_invariants(&a.lock()).unwrap();
    }

    #[test]
    fn host_memory_is_readable_and_writable() {
        let a = SharedAllocator::new(HostDevice::new(64 << 20));
        let mut x = a.alloc(4096, StreamId::DEFAULT).unwrap();
        let mut y = a.alloc(4096, StreamId::DEFAULT).unwrap();
        x.with_bytes_mut(|b| b.fill(0xAB)).unwrap();
        y.with_bytes_mut(|b| {
            for (i, v) in b.iter_mut().enumerate() {
                *v = (i % 251) as u8;
            }
        })
        .unwrap();
        assert!(x.with_bytes(|b| b.iter().all(|&v| v == 0xAB)).unwrap());
        assert_eq!(y.with_bytes(|b| b[300]).unwrap(), (300 % 251) as u8);
        assert_eq!(x.with_bytes(|b| b.len()).unwrap(), 4096);
        let z = a.alloc(0, StreamId::DEFAULT).unwrap();
        assert_eq!(z.with_bytes(|b| b.len()).unwrap(), 0);
    }
}
