//! Memory-snapshot pickles: reading PyTorch's (and trainmem's) and writing ones that
//! PyTorch's viewers open.
//!
//! ```
//! use trainmem_alloc::{CachingAllocator, SimulatedDevice, StreamId};
//! use trainmem_alloc::pytorch::pickle;
//!
//! let mut alloc = CachingAllocator::new(SimulatedDevice::new(1 << 30));
//! alloc.enable_trace(None);
//! let x = alloc.malloc_labeled(3 << 20, StreamId::DEFAULT, "activation")?;
//! alloc.free(x.id)?;
//! let bytes = pickle::to_bytes(&alloc.snapshot())?;   // open at pytorch.org/memory_viz
//! let back = pickle::from_bytes(&bytes)?;
//! assert_eq!(back.segments.len(), 1);
//! assert_eq!(back.device_traces[0][1].label(), Some("activation"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub(crate) mod arena;
mod opcodes;
mod read;
pub mod tree;
pub mod tree_write;
mod write;

pub use opcodes::{VIEWER_OPCODES, first_unsupported_opcode};
pub use read::{from_bytes, from_bytes_verbatim, from_value};
pub use tree::{PyValue, TreeError, read_tree};
pub use tree_write::write_tree;
pub(crate) use write::ADDED_KEY;
pub use write::{to_bytes, to_value};

/// First byte of every pickle of protocol 2 or later (the PROTO opcode).
pub const PICKLE_MAGIC: u8 = 0x80;

/// Reading or writing a snapshot pickle failed.
#[derive(Debug, thiserror::Error)]
pub enum PickleError {
    /// The bytes start like a pickle (byte 0x80, the PROTO opcode) but could not be read as
    /// one (truncated or corrupt).
    #[error("the data starts like a pickle (byte 0x80) but could not be read as one: {0}")]
    Decode(serde_pickle::Error),
    /// The bytes could not be read as a pickle and do not start like one: empty, or a first
    /// byte other than 0x80.
    #[error("{}", not_a_pickle(*first_byte, source))]
    NotAPickle {
        /// The first byte (`None` for empty input).
        first_byte: Option<u8>,
        /// What the pickle reader said.
        source: serde_pickle::Error,
    },
    /// The pickle could not be written.
    #[error("writing the pickle: {0}")]
    Encode(serde_pickle::Error),
    /// The pickle holds something other than a snapshot dict (e.g. the segment list
    /// `torch.cuda.memory_snapshot()` returns).
    #[error("the pickle is not a memory snapshot: expected a dict with \"device_traces\"")]
    NotASnapshot,
    /// The dict has no `device_traces` key.
    #[error(
        "the snapshot has no \"device_traces\": record it with \
         torch.cuda.memory._record_memory_history(enabled=\"all\") before dumping"
    )]
    NoDeviceTraces,
    /// A value has the wrong type or is missing.
    #[error("{at}: {message}")]
    Invalid {
        /// Where in the snapshot (`segments[3].blocks[0].size`).
        at: String,
        /// What is wrong.
        message: String,
    },
}

fn not_a_pickle(first_byte: Option<u8>, source: &serde_pickle::Error) -> String {
    match first_byte {
        None => "the data is empty (0 bytes), not a pickle".to_string(),
        Some(b) => {
            let shown = if b.is_ascii_graphic() || b == b' ' {
                format!(" ({:?})", b as char)
            } else {
                String::new()
            };
            format!(
                "the data is not a pickle: it starts with byte {b:#04x}{shown}, not {PICKLE_MAGIC:#04x} \
                 as a pickle of protocol 2 or later does ({source})"
            )
        }
    }
}

#[cfg(test)]
mod tests;
