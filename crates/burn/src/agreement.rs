//! The tracker against the counting allocator: on a host backend (Flex) both see the same
//! tensors, so a tracked run can check the one against the other at every phase boundary.
//!
//! The tracker counts the buffers burn's tensors hold, each tensor's own shape and strides
//! ([`trainmem_track::TrackedBytes::handles`]), and the records the run keeps beside its
//! tensors ([`trainmem_track::TrackedBytes::records`]: burn's autodiff graph, its optimizers'
//! and modules' records, the loader's queues and orders, whatever was allocated outside the
//! backend's ops). The counting allocator counts every heap byte of the process. The records are
//! measured by that same allocator (blocks made outside any op), so what the comparison holds is
//! the tracker's tensors against the bytes the backend allocated inside its ops: a buffer
//! counted twice, freed early or missed shows as a difference.

use serde::{Deserialize, Serialize};
use trainmem_core::Category;

use crate::MeasuredRun;

/// The categories the comparison covers.
pub const TRACKER_COMPARED: [Category; 5] = [
    Category::Parameter,
    Category::Gradient,
    Category::OptimizerState,
    Category::Activation,
    Category::Input,
];

/// The target tolerance: 1% of the counting allocator's bytes plus this many bytes (the host
/// count's resolution, as for trainmem-meta's comparison).
pub const TRACKER_SLACK: u64 = 16 << 10;

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
    /// The tracker's bytes (buffers, handles and records) there.
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
            let t = tracked.host_accounted(row.category);
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
