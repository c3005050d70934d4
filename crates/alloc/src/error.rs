//! Errors returned by the allocator, including the structured out-of-memory report.

use crate::device::DeviceError;
use crate::size::format_size;
use crate::stream::StreamId;

/// An allocator operation failed. The allocator's state is consistent after every error.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AllocError {
    /// No memory for the request, even after releasing cached segments. Boxed to keep
    /// `Result<Block, AllocError>` small.
    #[error(transparent)]
    OutOfMemory(Box<OutOfMemory>),
    /// The request's rounded size (or its segment size) does not fit in a `u64`.
    #[error("cannot allocate {size} bytes: the rounded size overflows u64")]
    SizeOverflow {
        /// The requested size.
        size: u64,
    },
    /// A free of a block that was already freed (the id is stale).
    #[error("double free: allocation #{sequence} was already freed")]
    DoubleFree {
        /// The allocation's sequence number ([`BlockId::sequence`](crate::BlockId::sequence)).
        sequence: u64,
    },
    /// An operation other than a free (`record_stream`, reading or writing the block's bytes,
    /// …) on a block that was already freed (the id is stale).
    #[error("allocation #{sequence} was already freed and can no longer be used")]
    AlreadyFreed {
        /// The allocation's sequence number ([`BlockId::sequence`](crate::BlockId::sequence)).
        sequence: u64,
    },
    /// The id was issued by another allocator.
    #[error("block id belongs to another allocator")]
    ForeignBlock,
    /// The id was never issued by this allocator.
    #[error("unknown block id (never issued by this allocator)")]
    UnknownBlock,
    /// No live allocation starts at this address.
    #[error(
        "address {address:#x} is not a live allocation of this allocator (already freed, or a foreign pointer)"
    )]
    UnknownAddress {
        /// The address.
        address: u64,
    },
    /// The block belongs to an RAII [`Allocation`](crate::Allocation); drop the handle instead.
    #[error("allocation #{sequence} is owned by an RAII handle; drop the handle to free it")]
    OwnedByHandle {
        /// The allocation's sequence number.
        sequence: u64,
    },
    /// The device failed for a reason other than lack of memory.
    #[error("device error: {0}")]
    Device(#[from] DeviceError),
}

impl AllocError {
    /// The out-of-memory report, if this is an out-of-memory error.
    pub fn as_out_of_memory(&self) -> Option<&OutOfMemory> {
        match self {
            AllocError::OutOfMemory(o) => Some(o),
            _ => None,
        }
    }
}

/// What the allocator knew when a request could not be served (PyTorch's
/// `OutOfMemoryError` text, as data). All sizes in bytes; `allocated`/`reserved` are taken
/// after the out-of-memory ladder released what it could.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutOfMemory {
    /// The caller's request.
    pub requested_size: u64,
    /// The request after rounding.
    pub rounded_size: u64,
    /// The segment size that would have been allocated from the device ("Tried to allocate").
    pub allocation_size: u64,
    /// The request's stream.
    pub stream: StreamId,
    /// The device's name.
    pub device: String,
    /// The device's total capacity.
    pub capacity: u64,
    /// Free bytes as the device reported them.
    pub device_free: u64,
    /// The per-process limit set with `set_memory_fraction`, if any.
    pub allowed: Option<u64>,
    /// Bytes allocated to clients (`allocated_bytes.all.current`).
    pub allocated: u64,
    /// Bytes held in segments (`reserved_bytes.all.current`).
    pub reserved: u64,
}

impl OutOfMemory {
    /// Reserved but unallocated bytes (cached blocks that could not be used or released).
    pub fn reserved_unallocated(&self) -> u64 {
        self.reserved.saturating_sub(self.allocated)
    }
}

impl std::fmt::Display for OutOfMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "trainmem out of memory. Tried to allocate {}. {} has a total capacity of {} of which {} is free. ",
            format_size(self.allocation_size),
            self.device,
            format_size(self.capacity),
            format_size(self.device_free)
        )?;
        if let Some(a) = self.allowed {
            write!(f, "{} allowed; ", format_size(a))?;
        }
        write!(
            f,
            "Of the allocated memory {} is allocated by trainmem, and {} is reserved by trainmem but unallocated. \
             If reserved but unallocated memory is large, the cache is fragmented: try setting \
             max_split_size_mb (e.g. max_split_size_mb:128) so large cached blocks are not split, \
             or expandable_segments:True to avoid fragmentation.",
            format_size(self.allocated),
            format_size(self.reserved_unallocated())
        )
    }
}

impl std::error::Error for OutOfMemory {}
