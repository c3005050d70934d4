//! Replaying a whole trace file: JSON lines, or a snapshot pickle recognised by its first byte.

use std::io::BufRead;

use super::engine::Replayer;
use super::error::ReplayError;
use super::from_snapshot::{SnapshotTraceInfo, ops_from_trace};
use super::jsonl::JsonLines;
use crate::device::DeviceMemory;
use crate::pytorch::pickle::{self, PICKLE_MAGIC};

/// Which format a trace had.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TraceFormat {
    /// JSON lines, one [`Op`](super::Op) a line.
    JsonLines,
    /// A PyTorch memory snapshot pickle, one device's trace replayed.
    Snapshot(SnapshotTraceInfo),
}

/// How far a replay has got, passed to the progress hook after every op.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Ops applied so far.
    pub ops: u64,
    /// Ops in the trace, when known in advance (snapshots).
    pub total_ops: Option<u64>,
    /// Bytes of the trace read so far (the whole file for snapshots).
    pub bytes_read: u64,
}

/// Reads a trace from `reader` and applies it to `replayer`: a snapshot pickle (first byte
/// 0x80) has the trace of `device` replayed by address
/// ([`ops_from_trace`]); anything else is read as JSON lines. `progress` is called after every
/// op.
pub fn replay_trace<R: BufRead, D: DeviceMemory>(
    mut reader: R,
    replayer: &mut Replayer<D>,
    device: usize,
    mut progress: impl FnMut(Progress),
) -> Result<TraceFormat, ReplayError> {
    let is_pickle = reader.fill_buf().map_err(ReplayError::Io)?.first() == Some(&PICKLE_MAGIC);
    if is_pickle {
        let mut bytes = Vec::new();
        reader.read_to_end(&mut bytes).map_err(ReplayError::Io)?;
        let snapshot = pickle::from_bytes(&bytes)?;
        let (ops, info) = ops_from_trace(&snapshot, device)?;
        drop(snapshot);
        let total_ops = Some(ops.len() as u64);
        let bytes_read = bytes.len() as u64;
        for (n, (at, op)) in ops.into_iter().enumerate() {
            replayer.apply(at, op)?;
            progress(Progress {
                ops: n as u64 + 1,
                total_ops,
                bytes_read,
            });
        }
        return Ok(TraceFormat::Snapshot(info));
    }
    let mut lines = JsonLines::new(reader);
    let mut ops = 0u64;
    while let Some(item) = lines.next() {
        let (at, op) = item?;
        replayer.apply(at, op)?;
        ops += 1;
        progress(Progress {
            ops,
            total_ops: None,
            bytes_read: lines.bytes_read(),
        });
    }
    Ok(TraceFormat::JsonLines)
}
