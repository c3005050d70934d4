//! Handles to allocations: [`BlockId`] names one allocation, [`Block`] describes it.

use crate::stream::StreamId;

/// Names one allocation of one allocator. Ids are never reused: freeing an id twice, or an
/// id from another allocator, is detected and reported as an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockId {
    pub(crate) owner: u32,
    pub(crate) index: u32,
    pub(crate) seq: u64,
}

impl BlockId {
    /// The id of the zero-byte allocation (freeing it is a no-op).
    pub const NULL: BlockId = BlockId {
        owner: 0,
        index: u32::MAX,
        seq: 0,
    };

    /// True for the zero-byte allocation's id.
    pub fn is_null(&self) -> bool {
        *self == BlockId::NULL
    }

    /// A number unique to this allocation within its allocator (its allocation sequence
    /// number, starting at 1; 0 for the null allocation).
    pub fn sequence(&self) -> u64 {
        self.seq
    }
}

/// A live allocation as returned by `malloc`: its id, address and sizes. Plain data (`Copy`);
/// freeing goes through the allocator (`free(block.id)`), or use the RAII
/// [`Allocation`](crate::Allocation) of a [`SharedAllocator`](crate::SharedAllocator).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Block {
    /// The allocation's id.
    pub id: BlockId,
    /// Device address of the first byte (0 for a zero-byte allocation).
    pub address: u64,
    /// Bytes reserved for it after rounding (0 for a zero-byte allocation).
    pub size: u64,
    /// Bytes the caller asked for.
    pub requested_size: u64,
    /// The stream it was allocated on.
    pub stream: StreamId,
}

impl Block {
    /// The zero-byte allocation on `stream`: address 0, size 0, id [`BlockId::NULL`].
    pub fn null(stream: StreamId) -> Self {
        Block {
            id: BlockId::NULL,
            address: 0,
            size: 0,
            requested_size: 0,
            stream,
        }
    }

    /// True for a zero-byte allocation.
    pub fn is_null(&self) -> bool {
        self.id.is_null()
    }
}

impl From<Block> for BlockId {
    fn from(b: Block) -> Self {
        b.id
    }
}

impl From<&Block> for BlockId {
    fn from(b: &Block) -> Self {
        b.id
    }
}
