//! Device patterns: the caching allocator's cache at the end, a predicted out-of-memory
//! error.

use trainmem_core::Category;

use super::{Finding, PatternKind};
use crate::engine::Summary;
use trainmem_core::bytes::human;
use trainmem_core::plan::{DeviceKind, Plan};
use trainmem_core::timeline::{Domain, Timeline};

/// On a GPU, reserved memory well above allocated at the end: what `empty_cache` would
/// return and what it cannot.
pub(super) fn cache_overhead(plan: &Plan, _t: &Timeline, s: &Summary, out: &mut Vec<Finding>) {
    let dev = Domain::Device;
    if plan.device.kind == DeviceKind::Cuda {
        let f = &s.fragmentation;
        if s.peak_reserved > 0 && f.cached_unallocated > s.peak_reserved / 20 {
            out.push(Finding {
                kind: PatternKind::CacheOverhead,
                domain: dev,
                bytes: f.cached_unallocated as i128,
                step: None,
                text: format!(
                    "At the end {} is reserved by the caching allocator but not allocated (largest free block {}). empty_cache() would return {} (segments with no live block); {} sits in segments that still hold live tensors and cannot be returned.{}",
                    human(f.cached_unallocated),
                    human(f.largest_free_block),
                    human(f.releasable),
                    human(f.non_releasable),
                    if plan.data.size_variation > 0.0 {
                        " Batch sizes that vary from step to step leave blocks of odd sizes behind: setting max_split_size_mb limits how large cached blocks are split."
                    } else {
                        ""
                    }
                ),
            });
        }
    }
}

/// The predicted out-of-memory error, with the largest category at the peak.
pub(super) fn out_of_memory(_plan: &Plan, _t: &Timeline, s: &Summary, out: &mut Vec<Finding>) {
    let dev = Domain::Device;
    if let Some(o) = &s.oom {
        // the largest category at the peak; none when nothing was allocated yet (a model
        // whose first parameters do not fit)
        let top = s
            .peak_breakdown
            .iter()
            .filter(|(c, b)| *c != Category::Cache && *b > 0)
            .max_by_key(|(_, b)| *b)
            .map_or("Nothing was allocated before it.".to_string(), |(c, b)| {
                format!("The largest category at the peak was {c} ({}).", human(b))
            });
        out.push(Finding {
            kind: PatternKind::OutOfMemory,
            domain: dev,
            bytes: o.requested as i128,
            step: Some(o.when.step),
            text: format!(
                "Out of memory at step {} during {} allocating {} of {}. {top} {}",
                o.when.step,
                o.when.phase,
                human(o.requested),
                o.category,
                o.message
            ),
        });
    }
}
