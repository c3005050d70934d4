//! Real burn training runs with memory probes, beside their simulated twin.
//!
//! trainmem-burn trains the network a trainmem plan describes on burn 0.21.0 (the Flex CPU
//! backend by default; CUDA with the `cuda` feature), samples memory at every phase boundary
//! after a device sync, and returns the same [`Timeline`](trainmem_core::timeline::Timeline)
//! type the simulator produces, so the two can be laid side by side.
//!
//! * [`run_measured`] / [`run_measured_detailed`]: train a [`Plan`](trainmem_core::plan::Plan)
//!   for real and measure it (see [`run`] for the knobs honoured and the category tags).
//! * [`Net`]: burn-nn networks built from the plan's model spec (MLP, CNN, transformer).
//! * [`Probe`]: samples host bytes per category (trainmem-probe's counting allocator, when the
//!   binary installs it), the `/proc` RSS breakdown, and device pools on CUDA.
//! * [`BatchSource`]: where batches come from.
//!
//! Host bytes per category need the counting allocator as the binary's global allocator:
//!
//! ```
//! use trainmem_burn::{RunOptions, run_measured_detailed};
//! use trainmem_core::{Category, Phase, Plan, Source};
//!
//! #[global_allocator]
//! static ALLOC: trainmem_probe::CountingAlloc = trainmem_probe::CountingAlloc::new();
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let plan = Plan::from_toml_str(r#"
//!     framework = "burn"
//!     [model.mlp]
//!     input = 16
//!     hidden = [32]
//!     output = 4
//!     loss = "cross_entropy"
//!     [training]
//!     batch_size = 8
//!     epochs = 1
//!     steps_per_epoch = 2
//!     [optimizer]
//!     kind = "adam"
//!     [loader]
//!     workers = 0
//!     [device]
//!     kind = "cpu"
//! "#)?;
//! let run = run_measured_detailed(&plan, RunOptions::default())?;
//! let t = &run.timeline;
//! assert_eq!(t.source, Source::Measured);
//! // A sample at every phase boundary of both steps, from `start` to `end`.
//! assert_eq!(t.indices_at(Phase::OptimizerStep).len(), 2);
//! // The real model's parameters: (16 x 32 + 32) + (32 x 4 + 4) f32 values.
//! assert_eq!(run.parameter_bytes, (16 * 32 + 32 + 32 * 4 + 4) * 4);
//! // Counted per category: Adam's two moments appear at the first step.
//! assert!(run.host_counted);
//! let params = t.samples[t.indices_at(Phase::ModelInit)[0]].host.categories.get(Category::Parameter);
//! let adam = t.samples[t.indices_at(Phase::OptimizerStep)[0]].host.categories.get(Category::OptimizerState);
//! assert!(params >= run.parameter_bytes);
//! assert!(adam >= 2 * run.parameter_bytes);
//! # Ok(())
//! # }
//! ```
//!
//! Without the counting allocator a run still works; its host categories are reported as
//! unavailable (`host_counted` is false).
//!
//! What burn 0.21 does with memory, as these runs measure it (optimizer state created at the
//! first step, kept graphs that leak linearly, parameters updated in place, gemm's packing
//! buffer, ...), is written up with its figures in the repository's `RESULTS.md` and
//! re-checked by the `burn_measured` tests; `cargo run -p trainmem-burn --example burn_facts`
//! measures it again.

#![forbid(unsafe_code)]

pub mod agreement;
pub mod data;
mod error;
pub mod model;
pub mod probe;
pub mod run;
pub mod timeline;
mod train;

pub use agreement::{TrackerAgreement, tracker_vs_host};
pub use data::{BatchSource, HostBatch, SyntheticSource};
pub use error::BurnRunError;
pub use model::{Batch, BatchInput, BatchTarget, ExampleShape, Net, example_shape};
pub use probe::{Probe, ProbeSample, host_counting_available};
pub use run::{
    BackendChoice, MeasuredRun, Progress, RunOptions, run_measured, run_measured_detailed,
    run_on_backend, run_predicted, supports_dtype,
};

/// `Ok` when CUDA device `index` can train (the driver library loads and has the device), or
/// what is missing, in words (trainmem-track's check, before burn's CUDA backend is touched:
/// without a driver it panics).
#[cfg(feature = "cuda")]
pub fn cuda_device_available(index: usize) -> Result<(), String> {
    trainmem_track::cuda::device_available(index)
}

/// Whether this build trains on burn's cubecl backends fused (burn's `fusion` feature, which
/// trainmem-track's `fusion` feature turns on): [`BackendChoice::Cuda`] and
/// [`BackendChoice::Wgpu`] then run `Fusion<CubeBackend<…>>`.
pub const FUSION: bool = trainmem_track::FUSION;

/// The adapter burn's default wgpu device trains on, or why there is none, in words
/// (trainmem-track's check, before burn's wgpu backend is touched: without an adapter it
/// panics).
#[cfg(feature = "wgpu")]
pub fn wgpu_adapter() -> Result<trainmem_track::wgpu::Adapter, String> {
    trainmem_track::wgpu::adapter()
}
