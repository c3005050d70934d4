//! Real burn training runs with memory probes, beside their simulated twin.
//!
//! trainmem-burn trains the network a trainmem plan describes on burn 0.21.0 (the Flex CPU
//! backend by default; CUDA with the `cuda` feature), samples memory at every phase boundary
//! after a device sync, and returns the same [`Timeline`](trainmem_sim::timeline::Timeline)
//! type the simulator produces, so the two can be laid side by side.
//!
//! * [`run_measured`] / [`run_measured_detailed`]: train a [`Plan`](trainmem_sim::plan::Plan)
//!   for real and measure it (see [`run`] for the knobs honoured and the category tags).
//! * [`Net`]: burn-nn networks built from the plan's model spec (MLP, CNN, transformer).
//! * [`Probe`]: samples host bytes per category (trainmem-probe's counting allocator, when the
//!   binary installs it), the `/proc` RSS breakdown, and device pools on CUDA.
//! * [`BatchSource`]: where batches come from.
//!
//! Host bytes per category need the counting allocator as the binary's global allocator:
//!
//! ```ignore
//! #[global_allocator]
//! static ALLOC: trainmem_probe::CountingAlloc = trainmem_probe::CountingAlloc::new();
//! ```
//!
//! Without it a run still works; its host categories are reported as unavailable.
//!
//! # burn_facts
//!
//! What burn 0.21.0 does with memory, measured on `Autodiff<Flex>` with the counting allocator
//! (tests/tests/burn_measured.rs re-checks each of these on every CI run):
//!
//! BURN_FACTS_PLACEHOLDER

#![warn(missing_docs)]

#[cfg(feature = "cuda")]
pub mod cuda;
pub mod data;
mod error;
pub mod model;
pub mod probe;
pub mod run;
pub mod timeline;

pub use data::{BatchSource, HostBatch, SyntheticSource};
pub use error::BurnRunError;
pub use model::{Batch, BatchInput, BatchTarget, ExampleShape, Net, example_shape};
pub use probe::{DeviceMemory, MemoryBackend, Probe, ProbeSample, host_counting_available};
pub use run::{BackendChoice, MeasuredRun, Progress, RunOptions, run_measured, run_measured_detailed};
