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

/// The target tolerance: 1% of the counting allocator's bytes plus this many bytes (the host
/// count's resolution, as for trainmem-meta's comparison).
pub const TRACKER_SLACK: u64 = 16 << 10;

/// The tolerance the tracker is held to today, while burn's bookkeeping is not yet named: 1%
/// plus this many bytes. The records burn keeps beside its tensors (optimizer maps, autodiff
/// nodes, `Param` shells) come to 9–24 KB per category on the CPU scenario plans, and vary by
/// a few hundred bytes from run to run (a map's capacity), so the 16 KiB target would flake.
pub const BOOKKEEPING_SLACK: u64 = 32 << 10;

/// How the tracker and the counting allocator agree on one category over a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrackerAgreement {
    /// The category.
    pub category: Category,
    /// Phase boundaries compared.
    pub boundaries: u64,
    /// Boundaries where the two differ by more than 1% + the slack asked for.
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

/// Whether `tracked` is within 1% + `slack` bytes of `host`.
pub fn tracker_within(host: u64, tracked: u64, slack: u64) -> bool {
    host.abs_diff(tracked) <= host / 100 + slack
}

/// One row per [`TRACKER_COMPARED`] category, boundaries judged against 1% + `slack` bytes, or
/// `None` when the run was not both counted and tracked.
pub fn tracker_vs_host(run: &MeasuredRun, slack: u64) -> Option<Vec<TrackerAgreement>> {
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
            let h = host.get(row.category);
            let t = tracked.live.get(row.category) + tracked.handles.get(row.category);
            row.boundaries += 1;
            if !tracker_within(h, t, slack) {
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
        let slack = TRACKER_SLACK;
        assert!(tracker_within(1_000_000, 1_000_000 + 10_000 + slack, slack));
        assert!(!tracker_within(
            1_000_000,
            1_000_000 + 10_001 + slack,
            slack
        ));
        assert!(tracker_within(0, slack, slack));
        assert!(!tracker_within(0, slack + 1, slack));
    }
}
