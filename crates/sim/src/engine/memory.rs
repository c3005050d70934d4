//! The simulated device memory: PyTorch's caching allocator over a simulated device, or exact
//! byte counting for CPU backends (no caching, no rounding).

use trainmem_alloc::{
    AllocError, AllocatorConfig, BlockId, CacheFigures, CachingAllocator, SimulatedDevice, Snapshot,
};
use trainmem_autograd::{Allocated, AllocatorMemory, CountingMemory, CountingOom, TensorMemory};
use trainmem_core::Category;

/// An allocation that failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimOom {
    /// The allocator's message (PyTorch's wording for the caching allocator).
    pub message: String,
    /// Bytes requested.
    pub requested: u64,
    /// Category of the failed allocation.
    pub category: Category,
}

/// Device memory of a simulation.
// One value per simulation, on the hot path of every allocation: not boxed on purpose.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum SimMemory {
    /// PyTorch-semantics caching allocator over a simulated GPU; with a granularity, each
    /// tensor counts its own bytes rounded up to it (see [`SimMemory::with_granularity`])
    /// instead of its block.
    Caching(AllocatorMemory<SimulatedDevice>, Option<u64>),
    /// Exact bytes with a capacity (CPU backends allocate from the system allocator).
    Exact(CountingMemory),
}

/// Handle of a [`SimMemory`] allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimHandle {
    /// A caching-allocator block.
    Block(BlockId),
    /// A counting-memory slot.
    Slot(u32),
}

impl SimMemory {
    /// A caching allocator over `capacity` bytes with a config string.
    pub fn caching(capacity: u64, config: &str) -> Result<SimMemory, trainmem_alloc::ConfigError> {
        let cfg: AllocatorConfig = if config.trim().is_empty() {
            AllocatorConfig::default()
        } else {
            config.parse()?
        };
        let dev = SimulatedDevice::new(capacity).with_name("simulated device");
        Ok(SimMemory::Caching(
            AllocatorMemory::new(CachingAllocator::with_config(dev, cfg)),
            None,
        ))
    }

    /// Counts each tensor at its own bytes rounded up to `granularity` (a divisor of 512)
    /// instead of at the caching allocator's block, which still holds it and still makes
    /// `reserved`: a framework whose device runtime rounds each buffer to its own alignment
    /// (burn's cubecl backends: the runtime's alignment, 1 where trainmem-track counts dense
    /// sizes). What is allocated is then the tensors' sum (the runner's samples), never above
    /// the blocks. Nothing changes for exact counting.
    pub fn with_granularity(self, granularity: u64) -> SimMemory {
        match self {
            SimMemory::Caching(m, _) => SimMemory::Caching(m, Some(granularity.clamp(1, 512))),
            exact @ SimMemory::Exact(_) => exact,
        }
    }

    /// Exact counting with a capacity.
    pub fn exact(capacity: u64) -> SimMemory {
        SimMemory::Exact(CountingMemory::with_capacity(capacity))
    }

    /// `memory_allocated`.
    pub fn allocated(&self) -> u64 {
        match self {
            SimMemory::Caching(m, _) => m.allocator.memory_allocated(),
            SimMemory::Exact(c) => c.live,
        }
    }

    /// Whether each tensor counts its own rounded bytes rather than its block
    /// ([`SimMemory::with_granularity`]): the tensors' sum is then what is allocated.
    pub fn counts_tensor_sizes(&self) -> bool {
        matches!(self, SimMemory::Caching(_, Some(_)))
    }

    /// `memory_reserved` (= allocated without a cache).
    pub fn reserved(&self) -> u64 {
        match self {
            SimMemory::Caching(m, _) => m.allocator.memory_reserved(),
            SimMemory::Exact(c) => c.live,
        }
    }

    /// Highest reserved since the last call; resets the window.
    pub fn take_reserved_peak(&mut self) -> u64 {
        match self {
            SimMemory::Caching(m, _) => {
                let p = m.allocator.max_memory_reserved();
                m.allocator.reset_peak_stats();
                p
            }
            SimMemory::Exact(c) => {
                let p = c.peak;
                c.peak = c.live;
                p
            }
        }
    }

    /// `empty_cache`: bytes returned to the device.
    pub fn empty_cache(&mut self) -> u64 {
        match self {
            SimMemory::Caching(m, _) => m.allocator.empty_cache().map(|r| r.bytes).unwrap_or(0),
            SimMemory::Exact(_) => 0,
        }
    }

    /// The allocator's snapshot (caching allocator only).
    pub fn snapshot(&self) -> Option<Snapshot> {
        match self {
            SimMemory::Caching(m, _) => Some(m.allocator.snapshot()),
            SimMemory::Exact(_) => None,
        }
    }

    /// The caching allocator's fragmentation figures, read from its blocks without a
    /// snapshot (none for exact counting).
    pub fn cache_figures(&self) -> Option<CacheFigures> {
        match self {
            SimMemory::Caching(m, _) => Some(m.allocator.cache_figures()),
            SimMemory::Exact(_) => None,
        }
    }

    /// Turns on the allocator's event trace (for the memory_viz export).
    pub fn enable_trace(&mut self, max_entries: usize) {
        if let SimMemory::Caching(m, _) = self {
            m.allocator.enable_trace(Some(max_entries));
        }
    }

    /// Sets the allocator's trace clock.
    pub fn set_time(&mut self, t: u64) {
        if let SimMemory::Caching(m, _) = self {
            m.allocator.set_time(t);
        }
    }

    /// Allocator configuration string in effect.
    pub fn describe(&self) -> String {
        match self {
            SimMemory::Caching(..) => "caching allocator (PyTorch semantics)".into(),
            SimMemory::Exact(_) => "exact (no caching)".into(),
        }
    }
}

impl TensorMemory for SimMemory {
    type Handle = SimHandle;
    type Error = SimOom;

    #[inline]
    fn allocate(&mut self, bytes: u64, category: Category) -> Result<Allocated<SimHandle>, SimOom> {
        match self {
            SimMemory::Caching(m, granularity) => match m.allocate(bytes, category) {
                Ok(a) => Ok(Allocated {
                    handle: SimHandle::Block(a.handle),
                    size: granularity.map_or(a.size, |g| bytes.next_multiple_of(g)),
                }),
                Err(e) => Err(SimOom {
                    message: match &e {
                        AllocError::OutOfMemory(o) => o.to_string(),
                        other => other.to_string(),
                    },
                    requested: bytes,
                    category,
                }),
            },
            SimMemory::Exact(c) => match c.allocate(bytes, category) {
                Ok(a) => Ok(Allocated {
                    handle: SimHandle::Slot(a.handle),
                    size: a.size,
                }),
                Err(CountingOom {
                    requested,
                    live,
                    capacity,
                }) => Err(SimOom {
                    message: format!(
                        "out of memory: tried to allocate {} for {} with {} of {} in use",
                        trainmem_core::bytes::human(requested),
                        category,
                        trainmem_core::bytes::human(live),
                        trainmem_core::bytes::human(capacity)
                    ),
                    requested,
                    category,
                }),
            },
        }
    }

    #[inline]
    fn free(&mut self, handle: SimHandle) {
        match (self, handle) {
            (SimMemory::Caching(m, _), SimHandle::Block(b)) => m.free(b),
            (SimMemory::Exact(c), SimHandle::Slot(s)) => c.free(s),
            _ => debug_assert!(false, "handle from another memory"),
        }
    }
}
