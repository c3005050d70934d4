//! The replay engine: allocation traces applied to a [`CachingAllocator`](crate::CachingAllocator).
//!
//! Every trace becomes a sequence of [`Op`]s (alloc, free, empty_cache on a stream), each
//! tagged with its [`Origin`] for messages: JSON lines ([`JsonLines`]), a snapshot's
//! `device_traces` ([`ops_from_trace`]), or ops a caller builds from its own events. A
//! [`Replayer`] applies them one at a time to an allocator over any device, so the caller can
//! read statistics or take snapshots between ops; out-of-memory is recorded and the replay
//! goes on.
//!
//! ```
//! use trainmem_alloc::AllocatorConfig;
//! use trainmem_alloc::pytorch::replay::{JsonLines, Replayer};
//!
//! let trace = "{\"op\":\"alloc\",\"id\":1,\"size\":3145728}\n{\"op\":\"free\",\"id\":1}\n";
//! let mut r = Replayer::simulated(1 << 30, AllocatorConfig::default());
//! for op in JsonLines::new(trace.as_bytes()) {
//!     let (at, op) = op?;
//!     r.apply(at, op)?;
//! }
//! assert_eq!(r.counts().frees, 1);
//! assert_eq!(r.allocator().memory_reserved(), 20 << 20);
//! # Ok::<(), trainmem_alloc::pytorch::replay::ReplayError>(())
//! ```

mod engine;
mod error;
mod file;
mod from_snapshot;
mod jsonl;
mod op;
#[cfg(test)]
mod seeded_tests;
mod snapshot_replay;
mod start_state;
#[cfg(test)]
mod tests;
mod verify;
mod what_if;

pub use engine::{Applied, Counts, LiveIdAlloc, OomEvent, ReplayPolicy, Replayer, UnknownFree};
pub use error::ReplayError;
pub use file::{Progress, TraceFormat, replay_trace};
pub use from_snapshot::{SnapshotTraceInfo, free_action, ops_from_trace, seeded_ops};
pub use jsonl::{JsonLines, parse_line};
pub use op::{Op, Origin};
pub use snapshot_replay::{
    PreparedTrace, RecordedFigures, SnapshotReplay, device_trace, prepare, prepare_trace, recorded,
    run_config,
};
pub use start_state::{StartState, StartStateError, start_state};
pub use verify::{Agreement, Divergence, Verification, verify};
pub use what_if::{Outcome, Scenario, run_prepared, run_scenario};
