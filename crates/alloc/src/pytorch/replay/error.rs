//! What can go wrong reading a trace or replaying it.

use crate::allocator::SeedError;
use crate::config::ConfigError;
use crate::error::AllocError;
use crate::pytorch::pickle::PickleError;

use super::op::Origin;
use super::start_state::StartStateError;

/// Reading a trace or applying one of its ops failed. Out-of-memory is not an error: it is
/// recorded ([`OomEvent`](super::OomEvent)) and the replay goes on.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The trace could not be read.
    #[error("reading the trace: {0}")]
    Io(std::io::Error),
    /// A line of a JSON-lines trace could not be read.
    #[error("reading line {line}: {error}")]
    ReadLine {
        /// 1-based line number.
        line: u64,
        /// The I/O error.
        error: std::io::Error,
    },
    /// A line of a JSON-lines trace is not an op.
    #[error(
        "malformed trace at line {line}: {message}: `{text}` (expected e.g. \
         {{\"op\":\"alloc\",\"id\":7,\"size\":3145728,\"stream\":0}}, \
         {{\"op\":\"free\",\"id\":7}} or {{\"op\":\"empty_cache\"}})"
    )]
    Malformed {
        /// 1-based line number.
        line: u64,
        /// What the JSON parser said (without its position in the one-line string).
        message: String,
        /// The line's first 120 characters.
        text: String,
        /// The JSON parser's error.
        #[source]
        source: serde_json::Error,
    },
    /// The snapshot pickle could not be read.
    #[error(transparent)]
    Pickle(#[from] PickleError),
    /// The snapshot has no trace for the requested device.
    #[error("the snapshot has traces for {devices} device(s); device {device} is not among them")]
    NoSuchDevice {
        /// The requested device.
        device: usize,
        /// How many device traces there are.
        devices: usize,
    },
    /// A snapshot trace allocates at an address that is still live.
    #[error("{at}: alloc at address {addr:#x}, which is already live")]
    AddressAlreadyLive {
        /// The trace entry.
        at: Origin,
        /// The address.
        addr: u64,
    },
    /// An `alloc` names an id that is still live (with [`LiveIdAlloc::Error`](super::LiveIdAlloc)).
    #[error("{at}: alloc of id {id}, which is still live (free it first)")]
    AllocOfLiveId {
        /// The op.
        at: Origin,
        /// The id.
        id: u64,
    },
    /// A `free` names an id that is not live (with [`UnknownFree::Error`](super::UnknownFree)).
    #[error("{at}: free of unknown id {id} (never allocated, or already freed)")]
    FreeOfUnknownId {
        /// The op.
        at: Origin,
        /// The id.
        id: u64,
    },
    /// The allocator refused an allocation for a reason other than lack of memory.
    #[error("{at}: alloc of {size} bytes")]
    Alloc {
        /// The op.
        at: Origin,
        /// Requested bytes.
        size: u64,
        /// The allocator's error.
        #[source]
        source: AllocError,
    },
    /// The allocator refused a free.
    #[error("{at}: free of id {id}")]
    Free {
        /// The op.
        at: Origin,
        /// The id.
        id: u64,
        /// The allocator's error.
        #[source]
        source: AllocError,
    },
    /// `empty_cache` failed (the device refused to free a segment).
    #[error("{at}: empty_cache")]
    EmptyCache {
        /// The op.
        at: Origin,
        /// The allocator's error.
        #[source]
        source: AllocError,
    },
    /// The snapshot's `allocator_settings` are not a configuration trainmem can replay.
    #[error("the snapshot's allocator_settings: {0}")]
    Settings(#[source] ConfigError),
    /// The state at the start of recording could not be rebuilt from the trace and the final
    /// segments.
    #[error("rebuilding the state when recording began: {0}")]
    StartState(#[from] StartStateError),
    /// The rebuilt start state is not one the allocator can be in.
    #[error("seeding the allocator with the state when recording began: {0}")]
    Seed(#[from] SeedError),
}
