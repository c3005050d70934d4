//! The one operation type every replay is made of, and where each op came from.

use std::fmt;

use serde::Deserialize;

use crate::label::Label;

/// One allocator operation. As a JSON line: `{"op":"alloc","id":7,"size":3145728,"stream":0}`
/// (`stream` and `label` optional), `{"op":"free","id":7}`, `{"op":"empty_cache"}`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Op {
    /// Allocate `size` bytes on `stream` and call the block `id`.
    Alloc {
        /// Name of the block, used by a later `free` (any number the trace chooses, e.g. an
        /// address).
        id: u64,
        /// Requested bytes (unrounded).
        size: u64,
        /// Stream the block is allocated on.
        #[serde(default)]
        stream: u64,
        /// The block's label (a category such as `"activation"`), kept in the allocator's
        /// snapshot and trace.
        #[serde(default)]
        label: Option<Label>,
    },
    /// Free the live block `id`.
    Free {
        /// Name the block was given at `alloc`.
        id: u64,
    },
    /// Release every fully free cached segment (`torch.cuda.empty_cache()`).
    EmptyCache,
}

impl Op {
    /// An unlabelled allocation.
    pub fn alloc(id: u64, size: u64, stream: u64) -> Self {
        Op::Alloc {
            id,
            size,
            stream,
            label: None,
        }
    }
}

/// Where an op came from, for messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// 1-based line of a JSON-lines trace.
    Line(u64),
    /// 0-based entry of `device_traces[device]` in a snapshot.
    Entry {
        /// Device index.
        device: usize,
        /// Entry index.
        index: usize,
    },
    /// 0-based position in a sequence of ops the caller built (e.g. a measured run's events).
    Event(u64),
}

impl Origin {
    /// The line number, for ops from a JSON-lines trace.
    pub fn line(self) -> Option<u64> {
        match self {
            Origin::Line(line) => Some(line),
            _ => None,
        }
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Line(line) => write!(f, "line {line}"),
            Origin::Entry { device, index } => {
                write!(f, "device_traces[{device}] entry {index}")
            }
            Origin::Event(n) => write!(f, "event {n}"),
        }
    }
}
