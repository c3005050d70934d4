//! The tracker against the counting allocator: on a host backend (Flex) both see the same
//! tensors, so a tracked run can check the one against the other at every phase boundary.
//!
//! The tracker counts the buffers burn's tensors hold and each tensor's own shape and strides
//! ([`trainmem_track::TrackedBytes::handles`]); the counting allocator counts every heap byte
//! of the training thread. The difference is burn's other bookkeeping (autodiff graph nodes,
//! optimizer records, the modules' `Param` shells), which trainmem does not yet name per
//! category. The tensor categories are compared; `input` is not (the loader's own memory —
//! epoch orders, queues, staging — is host memory under `input` that holds no tensor).

use serde::{Deserialize, Serialize};
use trainmem_core::Category;

use crate::MeasuredRun;

/// The categories the comparison covers.
pub const TRACKER_COMPARED: [Category; 4] = [
    Category::Parameter,
    Category::Gradient,
    Category::OptimizerState,
    Category::Activation,
];

/// The tolerance: 1% of the counting allocator's bytes plus this many bytes (the host count's
/// resolution, as for trainmem-meta's comparison).
pub const TRACKER_SLACK: u64 = 16 << 10;

/// How the tracker and the counting allocator agree on one category over a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrackerAgreement {
    /// The category.
    pub category: Category,
    /// Phase boundaries compared.
    pub boundaries: u64,
    /// Boundaries where the two differ by more than 1% + [`TRACKER_SLACK`].
    pub outside: u64,
    /// The largest difference.
    pub max_diff: u64,
    /// The counting allocator's bytes where the difference is largest.
    pub host_at_max: u64,
    /// The tracker's bytes (buffers and handles) there.
    pub tracked_at_max: u64,
}

impl TrackerAgreement {
    /// Whether every boundary is within the tolerance.
    pub fn within(&self) -> bool {
        self.outside == 0
    }
}

/// Whether `tracked` is within 1% + [`TRACKER_SLACK`] of `host`.
pub fn tracker_within(host: u64, tracked: u64) -> bool {
    host.abs_diff(tracked) <= host / 100 + TRACKER_SLACK
}

/// One row per [`TRACKER_COMPARED`] category, or `None` when the run was not both counted and
/// tracked.
pub fn tracker_vs_host(run: &MeasuredRun) -> Option<Vec<TrackerAgreement>> {
    let mut rows: Vec<TrackerAgreement> = TRACKER_COMPARED
        .iter()
        .map(|&category| TrackerAgreement {
            category,
            boundaries: 0,
            outside: 0,
            max_diff: 0,
            host_at_max: 0,
            tracked_at_max: 0,
        })
        .collect();
    for s in &run.samples {
        let (host, tracked) = (s.host?, s.tracked?);
        for row in &mut rows {
            let h = host[row.category.index()];
            let t = tracked.live.get(row.category) + tracked.handles.get(row.category);
            row.boundaries += 1;
            if !tracker_within(h, t) {
                row.outside += 1;
            }
            let diff = h.abs_diff(t);
            if diff >= row.max_diff {
                (row.max_diff, row.host_at_max, row.tracked_at_max) = (diff, h, t);
            }
        }
    }
    Some(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tolerance_is_one_percent_plus_the_slack() {
        assert!(tracker_within(
            1_000_000,
            1_000_000 + 10_000 + TRACKER_SLACK
        ));
        assert!(!tracker_within(
            1_000_000,
            1_000_000 + 10_001 + TRACKER_SLACK
        ));
        assert!(tracker_within(0, TRACKER_SLACK));
        assert!(!tracker_within(0, TRACKER_SLACK + 1));
    }
}
