//! Comparing a prediction with a measurement: the simulator's error per category at the peak,
//! against the accuracy it is held to.
//!
//! The comparison reads both timelines in one [`Domain`]: the memory that holds the run's
//! tensors, which is decided by what was measured ([`comparison_domain`]), never by the
//! prediction.

use serde::Serialize;

use crate::category::Category;
use crate::plan::{DeviceKind, Plan};
use crate::timeline::{Domain, Timeline};

/// The prediction's error for one category: peak bytes over each whole timeline.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CategoryError {
    /// The category.
    pub category: Category,
    /// Measured peak bytes.
    pub measured: u64,
    /// Predicted peak bytes.
    pub simulated: u64,
    /// (predicted − measured) / measured; `None` when nothing was measured.
    pub error: Option<f64>,
    /// The accuracy target for this category, if it has one.
    pub tolerance: Option<f64>,
    /// Bytes the measurement itself is uncertain by, allowed on top of the target (0 unless
    /// set with [`CategoryError::with_slack`]): for `input` under a multi-worker loader, one
    /// batch, since a worker's refill may or may not have landed when a phase boundary is
    /// sampled, depending on how the run's threads were scheduled ([`loader_slack`]).
    #[serde(default)]
    pub slack: u64,
}

impl CategoryError {
    /// Whether the error is within the target. A category without a target is always within;
    /// a targeted category that was not measured is within only if nothing was predicted
    /// either (bytes predicted where none were measured are a miss, not a pass).
    pub fn within(&self) -> bool {
        match (self.tolerance, self.error) {
            (Some(tol), Some(_)) => {
                let off = self.simulated.abs_diff(self.measured) as f64;
                off <= tol * self.measured as f64 + self.slack as f64
            }
            (Some(_), None) => self.simulated <= self.slack,
            (None, _) => true,
        }
    }

    /// The same row with `slack` bytes of measurement uncertainty allowed on top of the target.
    pub fn with_slack(mut self, slack: u64) -> CategoryError {
        self.slack = slack;
        self
    }
}

/// The measurement uncertainty of the `input` category for a run of `plan` whose batches are
/// `batch_bytes` each. With loader worker threads, what is in flight when a phase boundary is
/// sampled depends on how the threads were scheduled, not on the plan: a refill may or may
/// not have landed (one batch), and the other workers may be in the middle of building a batch
/// at the same moment, each holding its augmentation scratch (`data.augmentation_scratch`
/// × batch), where the prediction assumes one busy worker once the queues are full. With no
/// workers, batches are built in the training loop and nothing is uncertain.
pub fn loader_slack(plan: &Plan, batch_bytes: u64) -> u64 {
    let workers = plan.loader.workers;
    if workers == 0 {
        return 0;
    }
    let scratch = (plan.data.augmentation_scratch * batch_bytes as f64).ceil() as u64;
    batch_bytes.saturating_add(scratch.saturating_mul(workers - 1))
}

/// The resolution of a host measurement per category, in bytes: allowed on top of the target of
/// every category measured on the host. The counting allocator tags each allocation with the
/// category its thread carries at that moment, so a few kilobytes of runtime state created
/// lazily (thread-local caches, one-time initialisation) land in whichever category the
/// training thread is in when it first needs them. Seen: 6,288 B under `optimizer_state` in
/// some runs of a plan whose stateless optimizer keeps 5,416 B of records, and not in others.
pub const HOST_RESOLUTION: u64 = 16 * 1024;

/// The accuracy target of a prediction for a category, as a fraction of the measured peak:
/// 2% for parameters, gradients and optimizer state (sizes fixed by the model), 10% for
/// activations and loader buffers (`input`), none for the rest (`temporary`, `cache` and
/// `other` depend on kernels and process history the plan does not describe).
pub fn tolerance(c: Category) -> Option<f64> {
    match c {
        Category::Parameter | Category::Gradient | Category::OptimizerState => Some(0.02),
        Category::Activation | Category::Input => Some(0.10),
        _ => None,
    }
}

/// The prediction's error per category, in `domain`: the peak of each category over the
/// whole measured timeline against the peak over the whole predicted one. Categories that
/// are zero on both sides are left out.
///
/// ```
/// use trainmem_core::compare::category_errors;
/// use trainmem_core::timeline::{Domain, Phase, Sample, Source, Timeline, TimelineMeta};
/// use trainmem_core::Category;
///
/// let timeline = |source, params| {
///     let mut t = Timeline::new(source, TimelineMeta::default());
///     let mut s = Sample::new(Phase::Forward, 0);
///     s.host.categories.set(Category::Parameter, params);
///     t.push(s);
///     t
/// };
/// let measured = timeline(Source::Measured, 1000);
/// let predicted = timeline(Source::Simulated, 1010);
/// let rows = category_errors(&measured, &predicted, Domain::Host);
/// assert_eq!(rows[0].category, Category::Parameter);
/// assert_eq!(rows[0].error, Some(0.01));
/// assert!(rows[0].within()); // 1% against the 2% target
/// ```
pub fn category_errors(
    measured: &Timeline,
    predicted: &Timeline,
    domain: Domain,
) -> Vec<CategoryError> {
    let m = measured.peak_per_category(domain);
    let s = predicted.peak_per_category(domain);
    Category::ALL
        .into_iter()
        .filter(|&c| m.get(c) > 0 || s.get(c) > 0)
        .map(|c| {
            let (mv, sv) = (m.get(c), s.get(c));
            CategoryError {
                category: c,
                measured: mv,
                simulated: sv,
                error: (mv > 0).then(|| (sv as f64 - mv as f64) / mv as f64),
                tolerance: tolerance(c),
                slack: 0,
            }
        })
        .collect()
}

/// The domain in which a run of `plan` is compared: the measured timeline's, when there is
/// one (a run on burn's CPU backend keeps its tensors on the host, a CUDA run on the device),
/// else the host for a CPU plan and the device otherwise. A prediction never decides it: the
/// simulator's model of a CPU plan fills its simulated device too.
pub fn comparison_domain(plan: &Plan, measured: Option<&Timeline>) -> Domain {
    match measured {
        Some(t) => t.tensor_domain(),
        None if plan.device.kind == DeviceKind::Cpu => Domain::Host,
        None => Domain::Device,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timeline::{Phase, Sample, Source, TimelineMeta};

    fn timeline(source: Source, host: &[(Category, u64)], device: &[(Category, u64)]) -> Timeline {
        let mut t = Timeline::new(source, TimelineMeta::default());
        let mut s = Sample::new(Phase::Forward, 0);
        for &(c, b) in host {
            s.host.categories.set(c, b);
        }
        for &(c, b) in device {
            s.device.categories.set(c, b);
        }
        t.push(s);
        t
    }

    #[test]
    fn errors_are_relative_to_the_measured_peak_and_judged_against_targets() {
        let m = timeline(
            Source::Measured,
            &[(Category::Parameter, 1000), (Category::Activation, 500)],
            &[],
        );
        let s = timeline(
            Source::Simulated,
            &[
                (Category::Parameter, 1030),
                (Category::Activation, 540),
                (Category::Temporary, 7),
            ],
            &[],
        );
        let rows = category_errors(&m, &s, Domain::Host);
        let get = |c| rows.iter().find(|r| r.category == c).expect("row");
        assert_eq!(get(Category::Parameter).error, Some(0.03));
        assert!(
            !get(Category::Parameter).within(),
            "3% misses the 2% target"
        );
        assert!(get(Category::Activation).within(), "8% is inside 10%");
        let tmp = get(Category::Temporary);
        assert_eq!((tmp.error, tmp.tolerance), (None, None));
        assert!(tmp.within());
        assert!(rows.iter().all(|r| r.category != Category::Gradient));
    }

    #[test]
    fn slack_widens_the_target_by_bytes() {
        let m = timeline(Source::Measured, &[(Category::Input, 1000)], &[]);
        let s = timeline(Source::Simulated, &[(Category::Input, 850)], &[]);
        let row = category_errors(&m, &s, Domain::Host).remove(0);
        assert!(!row.within(), "15% misses the 10% target");
        assert!(!row.clone().with_slack(49).within(), "100 + 49 < 150");
        assert!(row.with_slack(50).within(), "100 + 50 covers 150");
        let plan = |workers: u64, scratch: f64| {
            Plan::from_toml_str(&format!(
                "[model.mlp]\ninput = 4\nhidden = [8]\noutput = 2\n[loader]\nworkers = {workers}\n\
                 [data]\naugmentation_scratch = {scratch}\n"
            ))
            .expect("plan")
        };
        assert_eq!(loader_slack(&plan(2, 0.0), 4096), 4096, "one batch");
        assert_eq!(loader_slack(&plan(0, 2.0), 4096), 0, "no workers");
        assert_eq!(
            loader_slack(&plan(1, 2.0), 4096),
            4096,
            "one worker: the model already holds its scratch"
        );
        assert_eq!(
            loader_slack(&plan(3, 1.5), 4096),
            4096 + 2 * 6144,
            "a batch and two more busy workers' scratch"
        );
    }

    #[test]
    fn the_host_resolution_covers_runtime_state_not_a_broken_count() {
        let row = |measured: u64, simulated: u64| CategoryError {
            category: Category::OptimizerState,
            measured,
            simulated,
            error: (measured > 0).then(|| (simulated as f64 - measured as f64) / measured as f64),
            tolerance: tolerance(Category::OptimizerState),
            slack: 0,
        };
        // The case seen: a stateless optimizer's records plus lazily created runtime state.
        assert!(!row(11_704, 5_416).within(), "beyond 2% on its own");
        assert!(row(11_704, 5_416).with_slack(HOST_RESOLUTION).within());
        // A count that read nothing still misses megabytes predicted.
        assert!(!row(0, 16 << 20).with_slack(HOST_RESOLUTION).within());
        assert!(!row(16 << 20, 15 << 20).with_slack(HOST_RESOLUTION).within());
    }

    #[test]
    fn bytes_predicted_where_none_were_measured_miss() {
        let m = timeline(Source::Measured, &[], &[]);
        let s = timeline(Source::Simulated, &[(Category::Gradient, 10)], &[]);
        let rows = category_errors(&m, &s, Domain::Host);
        assert_eq!(rows.len(), 1);
        assert!(!rows[0].within());
    }

    #[test]
    fn the_measured_run_decides_the_domain() {
        let mut plan = Plan::from_toml_str(
            "[model.mlp]\ninput = 4\nhidden = [8]\noutput = 2\n[device]\nkind = \"cpu\"\n",
        )
        .expect("plan");
        let host_run = timeline(Source::Measured, &[(Category::Parameter, 64)], &[]);
        let device_run = timeline(Source::Measured, &[], &[(Category::Parameter, 64)]);
        assert_eq!(comparison_domain(&plan, Some(&host_run)), Domain::Host);
        assert_eq!(comparison_domain(&plan, Some(&device_run)), Domain::Device);
        assert_eq!(comparison_domain(&plan, None), Domain::Host);
        plan.device.kind = DeviceKind::Cuda;
        assert_eq!(comparison_domain(&plan, Some(&host_run)), Domain::Host);
        assert_eq!(comparison_domain(&plan, None), Domain::Device);
    }
}
