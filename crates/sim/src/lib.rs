//! trainmem-sim: predicts the memory timeline of a training run from a plan.
//!
//! * [`plan`]: the TOML plan ([`Plan`]) and model specs ([`ModelSpec`]).
//! * [`timeline`]: the shared [`Timeline`] (also produced by measured runs).

#![warn(missing_docs)]

pub mod bytes;
pub mod engine;
pub mod explain;
pub mod export;
pub mod fit;
pub mod lower;
pub mod model;
pub mod plan;
pub mod report;
pub mod timeline;

pub use bytes::ByteSize;
pub use engine::{SimOptions, SimResult, Summary, simulate};
pub use explain::{Finding, PatternKind, explain};
pub use fit::{FitResult, FitTarget, fit};
pub use model::ModelSpec;
pub use plan::{Plan, PlanError};
pub use report::{Report, render_text, report};
pub use timeline::{
    CategoryBytes, DeviceBytes, Domain, HostBytes, Phase, Sample, Source, Timeline, TimelineMeta,
};

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
    Plan(#[from] PlanError),
}
