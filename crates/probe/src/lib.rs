//! Host-memory probes shared by every trainmem crate: bytes per category, exactly, and the
//! resident set as the OS sees it.
//!
//! trainmem-probe is how a measured run knows which host bytes are parameters, gradients,
//! optimizer state, activations or batches in flight. trainmem-loader tags its worker threads
//! with it, trainmem-burn tags the phases of a training step and samples the counters at every
//! phase boundary, and the `trainmem` binary installs the counting allocator. Any Rust program
//! can use it alone to see where its own heap goes, category by category.
//!
//! # The parts
//!
//! * [`Category`](trainmem_core::Category) (from trainmem-core): the names bytes are counted under, the same ones PyTorch's memory timeline
//!   uses (parameter, gradient, optimizer state, activation, input, temporary, cache, other).
//! * [`set_thread_category`], [`CategoryScope`], [`current_category`]: the thread-local tag
//!   that says what the calling thread's allocations are for.
//! * [`CountingAlloc`]: a `#[global_allocator]` wrapper over the system allocator that keeps
//!   live and peak bytes per category ([`live_bytes`], [`peak_bytes`], [`total_live_bytes`],
//!   [`snapshot`], [`reset_peaks`]).
//! * [`mark_handed_to_device`], [`handed_to_device_bytes`]: a buffer handed to a device
//!   backend for an upload stays counted under its category and is also counted apart until
//!   the backend frees it, so a backend's hold on uploaded host data shows on its own.
//! * [`BackendScope`], [`backend_bytes`]: blocks allocated while a tensor backend runs one
//!   of its ops are also counted as the backend's, so a run tells its tensors from the records
//!   the framework keeps beside them (whatever was allocated outside any op).
//! * [`start_trace`] / [`stop_trace`]: an optional, bounded, allocation-free record of
//!   allocations and frees above a size threshold (address, size, category, thread), for
//!   replaying a real run's allocation sizes through a caching-allocator model.
//! * [`heap::retain_freed_heap`]: keep the memory a process frees in its heap for reuse
//!   (glibc's trim and mmap thresholds), for binaries that build and free large structures
//!   repeatedly.
//! * [`mapped::mapped_rss`]: the resident bytes of particular mapped files (a data set's share
//!   of `RssFile`), from `/proc/self/smaps`.
//! * [`rss`]: the resident-set breakdown the OS reports (`/proc/self/status`: VmRSS, RssAnon,
//!   RssFile, RssShmem, VmHWM, VmPeak) and the VmHWM reset.
//!
//! # The rules
//!
//! * **Tags are per thread.** Every thread starts tagged [`Category::Other`](trainmem_core::Category::Other); an allocation is
//!   counted under the tag its thread carries at that moment. [`CategoryScope::enter`] sets a
//!   tag until the guard is dropped, then restores the previous one; scopes nest, and the guard
//!   cannot leave its thread. Reading the tag never allocates.
//! * **A block keeps its category.** Each block carries its tag in a header just before the
//!   pointer the program sees; a free decrements that category whichever thread frees it. A
//!   `realloc` moves the whole block to the reallocating thread's category (the old one loses
//!   the old size, the current one gains the new size).
//! * **What is counted** is the size the program asked for (`Layout::size`). The header (8
//!   bytes, or the alignment when larger) and the system allocator's own overhead are not.
//! * **Opt-in.** The counters are process-wide and read zero until a binary installs
//!   [`CountingAlloc`] as its `#[global_allocator]` ([`is_installed`] tells). A library can
//!   tag and read without knowing whether the binary installed it.
//! * **Traces** hold at most [`TRACE_CAPACITY`] (2¹⁷) events of 24 bytes in static memory;
//!   events past that are dropped and counted. One trace runs at a time ([`TraceBusy`]).
//! * **RSS** values are in bytes (the kernel's kB × 1024), with `VmRSS = RssAnon + RssFile +
//!   RssShmem`: a memory-mapped data set shows up as RssFile, owned buffers as RssAnon.
//!   [`rss::reset_peak`] resets VmHWM by writing `5` to `/proc/self/clear_refs` (Linux 4.0
//!   and later; it fails where /proc is read-only). Elsewhere than Linux [`rss::read`] returns
//!   [`RssError::Unavailable`].
//!
//! # Example: tagging a thread and counting its allocations
//!
//! A binary opts in to exact per-category counting by declaring the allocator; this example is
//! such a binary.
//!
//! ```standalone_crate
//! use trainmem_core::Category;
//! use trainmem_probe::{CategoryScope, current_category, is_installed, live_bytes};
//!
//! #[global_allocator]
//! static ALLOC: trainmem_probe::CountingAlloc = trainmem_probe::CountingAlloc::new();
//!
//! fn main() {
//!     assert_eq!(current_category(), Category::Other);
//!     let before = live_bytes(Category::Activation);
//!
//!     // Everything this thread allocates inside the scope is an activation.
//!     let saved = {
//!         let _tag = CategoryScope::enter(Category::Activation);
//!         assert_eq!(current_category(), Category::Activation);
//!         vec![0u8; 1 << 20]
//!     };
//!     assert_eq!(current_category(), Category::Other, "the scope restored the tag");
//!     assert!(is_installed());
//!     assert_eq!(live_bytes(Category::Activation), before + (1 << 20));
//!
//!     // Freed on another thread (tagged `other`), the block still leaves `activation`.
//!     std::thread::spawn(move || drop(saved)).join().unwrap();
//!     assert_eq!(live_bytes(Category::Activation), before);
//!
//!     // What the OS sees: the resident set, split by kind of page.
//!     #[cfg(target_os = "linux")]
//!     {
//!         let status = trainmem_probe::rss::read().expect("/proc/self/status");
//!         assert_eq!(status.vm_rss, status.rss_anon + status.rss_file + status.rss_shmem);
//!         assert!(status.vm_hwm >= status.vm_rss);
//!     }
//! }
//! ```
//!
//! Without the allocator installed, tags still work and every counter reads zero:
//!
//! ```
//! use trainmem_core::Category;
//! use trainmem_probe::{CategoryScope, current_category, is_installed, live_bytes};
//!
//! {
//!     let _outer = CategoryScope::enter(Category::Gradient);
//!     let inner = CategoryScope::enter(Category::Temporary);
//!     assert_eq!(inner.previous(), Category::Gradient);
//!     assert_eq!(current_category(), Category::Temporary);
//!     let _scratch = vec![0f32; 1024];
//!     drop(inner);
//!     assert_eq!(current_category(), Category::Gradient);
//! }
//! assert_eq!(current_category(), Category::Other);
//! assert!(!is_installed());
//! assert_eq!(live_bytes(Category::Temporary), 0);
//! ```

mod counting;
pub mod heap;
pub mod mapped;
pub mod rss;
mod tag;
mod trace;

pub use counting::{
    AllocSnapshot, CountingAlloc, backend_bytes, block_category, handed_to_device_bytes,
    is_installed, live_bytes, mark_handed_to_device, peak_bytes, reset_peak, reset_peaks, snapshot,
    total_live_bytes,
};
pub use rss::{ProcStatus, RssError};
pub use tag::{BackendScope, CategoryScope, current_category, set_thread_category};
pub use trace::{
    TRACE_CAPACITY, TraceBusy, TraceEvent, TraceKind, TraceResult, start_trace, stop_trace,
    trace_enabled, trace_position, trace_thread_id,
};
