//! Why a scenario could not run.
//!
//! A pattern that does not reproduce is not an error: it is a verdict in the report (and exit
//! code 1 from the `scenario` command). A [`ScenarioError`] means the scenario could not be
//! judged at all: its plan is unreadable or lacks what its rules need, the simulator or the measured run
//! failed, or its files could not be written. Each variant names what was being done; the
//! underlying error is its [`std::error::Error::source`], and [`ScenarioError::chain`] (or
//! anyhow's `{:#}`) prints the whole chain on one line.

use std::path::PathBuf;

use trainmem_alloc::pytorch::replay::ReplayError;
use trainmem_alloc::{AllocError, ConfigError};
use trainmem_burn::BurnRunError;
use trainmem_core::PlanError;
use trainmem_core::export::ExportError;
use trainmem_sim::SimError;
use trainmem_sim::lower::LowerError;

/// The error of running a scenario.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// A plan could not be read or failed its checks.
    #[error("{context}")]
    Plan {
        /// Which plan (`loading the plan `epoch-spike``, `--plan FILE`).
        context: String,
        /// What is wrong with it.
        #[source]
        source: PlanError,
    },
    /// The plan parses but lacks what this scenario's rules need (a model of the wrong kind,
    /// a batch too small to halve, ...).
    #[error("{0}")]
    UnsuitedPlan(String),
    /// The plan's model could not be lowered to the simulator's ops.
    #[error("lowering the plan's model")]
    Lower(#[source] LowerError),
    /// The simulator failed (a predicted out-of-memory is a result, not this).
    #[error("simulating `{label}`")]
    Simulation {
        /// The run being simulated.
        label: String,
        /// The simulator's error.
        #[source]
        source: SimError,
    },
    /// The real training run failed.
    #[error("measured run `{label}`")]
    Measured {
        /// The run being measured.
        label: String,
        /// trainmem-burn's error.
        #[source]
        source: BurnRunError,
    },
    /// A measured run made in a child process ([`crate::isolate`]) could not be started,
    /// failed, or sent back nothing readable.
    #[error("measured run `{label}` in a child process: {detail}")]
    Child {
        /// The run being measured.
        label: String,
        /// What went wrong, with the child's own error message when it gave one.
        detail: String,
    },
    /// A measured run on the host needs trainmem-probe's counting allocator, and the binary
    /// does not install it.
    #[error(
        "measured run `{label}`: no counting allocator is installed, so host bytes per category \
         cannot be measured (install `trainmem_probe::CountingAlloc` as the #[global_allocator])"
    )]
    NotCounting {
        /// The run that could not be measured.
        label: String,
    },
    /// `--backend cuda` or `--backend wgpu` in a build without that feature.
    #[error(
        "--backend {backend} needs a build with it: `cargo run -p xtask --features {backend} -- \
         scenario ...` or `cargo install --path crates/cli --features {backend}`"
    )]
    BackendNotBuilt {
        /// The backend's name (`cuda`, `wgpu`).
        backend: &'static str,
    },
    /// A device backend on a machine where it cannot run.
    #[error("--backend {backend}: {detail}")]
    NoDevice {
        /// The backend's name (`cuda`, `wgpu`).
        backend: &'static str,
        /// What is missing.
        detail: String,
    },
    /// A recorded measured run could not be written or read back.
    #[error("the recorded run {}", path.display())]
    Recorded {
        /// The run's file.
        path: std::path::PathBuf,
        /// The I/O or JSON error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The caching allocator refused an operation of an allocator-level scenario.
    #[error("{context}")]
    Allocator {
        /// The operation.
        context: String,
        /// The allocator's error.
        #[source]
        source: AllocError,
    },
    /// An allocator configuration a scenario builds was refused.
    #[error("allocator configuration `{context}`")]
    AllocatorConfig {
        /// The configuration.
        context: String,
        /// Why it was refused.
        #[source]
        source: ConfigError,
    },
    /// A measured run's allocations could not be replayed through the caching allocator.
    #[error("{context}")]
    Replay {
        /// The step of the replay.
        context: String,
        /// The replay engine's error.
        #[source]
        source: ReplayError,
    },
    /// A measured run's allocation trace cannot be replayed as it stands (incomplete, or a
    /// request the allocator could not place).
    #[error("{0}")]
    Replayed(String),
    /// A file could not be written.
    #[error("writing {}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// The report could not be serialised.
    #[error("the report as JSON")]
    Json(#[from] serde_json::Error),
    /// A timeline export (Chrome trace) could not be written.
    #[error("the timeline export")]
    Export(#[source] ExportError),
    /// The memory_viz pickle could not be written.
    #[error("the memory_viz export")]
    Pickle(#[source] trainmem_alloc::pytorch::pickle::PickleError),
    /// A step of the runner found the state it relies on missing (a bug in trainmem).
    #[error("internal error: {0}")]
    Internal(&'static str),
    /// An error inside the named scenario.
    #[error("scenario {name}")]
    InScenario {
        /// The scenario.
        name: &'static str,
        /// What went wrong.
        #[source]
        source: Box<ScenarioError>,
    },
}

/// Returns [`ScenarioError::UnsuitedPlan`] with a formatted message from the enclosing
/// function.
macro_rules! unsuited {
    ($($arg:tt)*) => {
        return Err($crate::error::ScenarioError::UnsuitedPlan(format!($($arg)*)))
    };
}

/// The result of a scenario step.
pub type Result<T, E = ScenarioError> = std::result::Result<T, E>;

impl ScenarioError {
    /// The error and its causes on one line, outermost first, joined by `: `.
    pub fn chain(&self) -> String {
        let mut text = self.to_string();
        let mut cause = std::error::Error::source(self);
        while let Some(c) = cause {
            text.push_str(": ");
            text.push_str(&c.to_string());
            cause = c.source();
        }
        text
    }
}

/// A plan error with the plan it came from.
pub(crate) fn plan_error(context: impl Into<String>) -> impl FnOnce(PlanError) -> ScenarioError {
    let context = context.into();
    move |source| ScenarioError::Plan { context, source }
}

/// An allocator error with the operation that failed.
pub(crate) fn alloc_error(context: impl Into<String>) -> impl FnOnce(AllocError) -> ScenarioError {
    let context = context.into();
    move |source| ScenarioError::Allocator { context, source }
}

/// A replay error with the replay step that failed.
pub(crate) fn replay_error(
    context: impl Into<String>,
) -> impl FnOnce(ReplayError) -> ScenarioError {
    let context = context.into();
    move |source| ScenarioError::Replay { context, source }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chain_names_every_cause_once() {
        let io = std::io::Error::new(std::io::ErrorKind::PermissionDenied, "denied");
        let e = ScenarioError::InScenario {
            name: "epoch-spike",
            source: Box::new(ScenarioError::Io {
                path: PathBuf::from("/x/report.md"),
                source: io,
            }),
        };
        assert_eq!(
            e.chain(),
            "scenario epoch-spike: writing /x/report.md: denied"
        );
    }

    #[test]
    fn a_missing_counting_allocator_says_how_to_install_it() {
        let e = ScenarioError::NotCounting {
            label: "adam".into(),
        };
        let text = e.to_string();
        assert!(
            text.contains("`adam`") && text.contains("#[global_allocator]"),
            "{text}"
        );
    }
}
