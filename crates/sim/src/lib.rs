//! trainmem-sim: predicts the memory timeline of a training run from a plan.
//!
//! A [`Plan`](trainmem_core::Plan) (TOML, [`trainmem_core::plan`]; plans, model specs and
//! timelines live in trainmem-core) names a model ([`ModelSpec`](trainmem_core::ModelSpec)), batch and accumulation, dtypes,
//! optimizer, checkpointing, data and loader, retention, device and parallel layout.
//! [`simulate`] lowers the model to an autograd program ([`lower`]) and runs every step
//! through trainmem-alloc's caching allocator on a simulated device (or exact counting for a
//! CPU device), with a host-memory model of the loader ([`engine::host`]). The result is the
//! shared [`Timeline`](trainmem_core::Timeline) ([`trainmem_core::timeline`]: bytes per category at every phase boundary, host and
//! device) plus a [`Summary`] (peaks and when, the breakdown at the peak, fragmentation, a
//! predicted OOM with the allocator's message). What differs between frameworks (PyTorch,
//! burn) is data in one [`FrameworkProfile`] per framework ([`profile`]), which the engine,
//! lowering and explanations ask. The facts of the machine the run is predicted
//! for come in [`SimOptions::machine`] ([`Machine`]): a simulation reads nothing of the
//! machine it runs on. [`explain`](mod@explain) names the patterns in words,
//! [`fit`](mod@fit) searches the largest batch that fits; a simulation's timeline is exported
//! like any other ([`trainmem_core::export`]), its allocator snapshot as a memory_viz pickle by
//! trainmem-alloc, and its report as JSON by [`report::report_json`].
//! [`snapshot_explain`] explains a PyTorch memory snapshot the user recorded: bytes per
//! category and per source line at the peak, steps and growth, and remedies in bytes.
//!
//! ```
//! use trainmem_core::Plan;
//! use trainmem_sim::{SimOptions, simulate};
//! let plan = Plan::from_toml_str(r#"
//!     [model.mlp]
//!     input = 784
//!     hidden = [1024]
//!     output = 10
//!     loss = "cross_entropy"
//!     [training]
//!     batch_size = 64
//!     epochs = 1
//!     steps_per_epoch = 3
//!     [device]
//!     capacity = "8GiB"
//! "#)?;
//! let r = simulate(&plan, SimOptions::default())?;
//! assert!(r.summary.oom.is_none());
//! assert!(r.summary.peak_allocated > 0);
//! for f in trainmem_sim::explain(&plan, &r.timeline, &r.summary) {
//!     println!("{}", f.text);
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! A simulation's cost grows about linearly with the model's depth, the steps and the
//! micro-batches. A deep model's simulation builds and frees a heap of tens to hundreds of
//! megabytes; a program that simulates many times in one process (as [`fit`](mod@fit) does)
//! and runs on glibc gives that heap back to the OS after each run and faults it in again,
//! unless its binary calls `trainmem_probe::heap::retain_freed_heap` first (the `trainmem`
//! commands do).

#![forbid(unsafe_code)]

pub mod autocast;
pub mod engine;
pub mod explain;

pub mod fit;
pub mod lower;
pub mod machine;
pub mod param_shapes;
pub mod params;
pub mod plan_remedies;
pub mod profile;
pub mod report;
pub mod snapshot_explain;
pub mod validation;

pub use engine::{SimOptions, SimResult, Summary, simulate};
pub use explain::{Finding, PatternKind, explain};
pub use fit::{FitResult, FitTarget, fit, fit_with_progress};
pub use machine::Machine;
pub use plan_remedies::{PlanRemedies, PlanRemedy, plan_remedies};
pub use profile::FrameworkProfile;
pub use report::{Report, render_text, report};

/// Errors of a simulation (beyond a predicted out-of-memory, which is a result).
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The model cannot be lowered to ops.
    #[error("model: {0}")]
    Model(String),
    /// A configuration value the simulator cannot use.
    #[error("`{key}`: {message}")]
    Config {
        /// The plan key.
        key: String,
        /// What is wrong.
        message: String,
    },
    /// The plan is invalid.
    #[error(transparent)]
    Plan(#[from] trainmem_core::PlanError),
    /// A byte count of the plan's model state does not fit 64 bits (a mistyped size?).
    #[error("{0}")]
    Overflow(String),
}
