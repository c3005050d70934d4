//! Host-memory probes shared by every trainmem crate.
//!
//! * [`Category`]: the names bytes are counted under, the same ones PyTorch's memory timeline
//!   uses (parameter, gradient, optimizer state, activation, input, temporary, cache, other).
//! * [`set_thread_category`], [`CategoryScope`], [`current_category`]: the thread-local tag
//!   that says what the calling thread's allocations are for.
//! * [`CountingAlloc`]: a `#[global_allocator]` wrapper over the system allocator that keeps
//!   live and peak bytes per category ([`live_bytes`], [`peak_bytes`], [`snapshot`],
//!   [`reset_peaks`]).
//! * [`start_trace`] / [`stop_trace`]: an optional, bounded, allocation-free record of
//!   allocations and frees above a size threshold (address, size, category, thread), for
//!   replaying a real run's allocation sizes through a caching-allocator model.
//! * [`rss`]: the resident-set breakdown the OS reports (`/proc/self/status`: VmRSS, RssAnon,
//!   RssFile, RssShmem, VmHWM, VmPeak) and the VmHWM reset.
//!
//! A binary opts in to exact per-category counting with
//!
//! ```ignore
//! #[global_allocator]
//! static ALLOC: trainmem_probe::CountingAlloc = trainmem_probe::CountingAlloc::new();
//! ```

mod counting;
pub mod rss;
mod tag;
mod trace;

pub use counting::{
    AllocSnapshot, CountingAlloc, block_category, is_installed, live_bytes, peak_bytes, reset_peak,
    reset_peaks, snapshot, total_live_bytes,
};
pub use rss::{ProcStatus, RssError};
pub use tag::{CategoryScope, current_category, set_thread_category};
pub use trace::{
    TRACE_CAPACITY, TraceBusy, TraceEvent, TraceKind, TraceResult, start_trace, stop_trace,
    trace_enabled, trace_position, trace_thread_id,
};
pub use trainmem_core::Category;
