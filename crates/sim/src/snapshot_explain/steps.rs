//! The steps of a trace (a cycle of forward, backward and optimizer step), the peak and the
//! bytes left live at the end of each, and what grows from step to step.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use trainmem_alloc::pytorch::framed::FramedSnapshot;

use super::frames::{StackPhase, site_label};
use super::lifetimes::Lifetimes;

/// One step found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StepInfo {
    /// The cycle number (as in the moments).
    pub cycle: usize,
    /// First trace entry.
    pub start: usize,
    /// Last trace entry.
    pub end: usize,
    /// Most tensor bytes live within it.
    pub peak_bytes: u64,
    /// Tensor bytes live at its end.
    pub end_bytes: u64,
}

/// Memory that grows from step to step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Growth {
    /// Average bytes added per step, over the steps that grew.
    pub bytes_per_step: u64,
    /// Steps in a row that ended higher than the one before.
    pub steps_growing: usize,
    /// The site whose allocations, made in one step and still live at the end of the trace,
    /// hold the most bytes.
    pub site: Option<String>,
    /// Bytes those allocations hold at the end.
    pub site_bytes: u64,
}

/// The steps and the growth, if any.
pub fn steps(
    f: &FramedSnapshot,
    lt: &Lifetimes,
    curve: &[u64],
    names: &mut super::SiteNames,
) -> (Vec<StepInfo>, Option<Growth>) {
    let mut by_cycle: BTreeMap<usize, (usize, usize, bool)> = BTreeMap::new();
    for w in &lt.windows {
        let e = by_cycle.entry(w.cycle).or_insert((w.start, w.end, false));
        e.0 = e.0.min(w.start);
        e.1 = e.1.max(w.end);
        if matches!(w.phase, Some(StackPhase::Backward | StackPhase::Optimizer)) {
            e.2 = true;
        }
    }
    let steps: Vec<StepInfo> = by_cycle
        .into_iter()
        .filter(|(_, (s, e, trains))| *trains && e > s)
        .map(|(cycle, (start, end, _))| StepInfo {
            cycle,
            start,
            end: end - 1,
            peak_bytes: curve[start..end].iter().copied().max().unwrap_or(0),
            end_bytes: curve[end - 1],
        })
        .collect();
    let mut growing = 0;
    let mut added = 0u64;
    for pair in steps.windows(2).rev() {
        if pair[1].end_bytes > pair[0].end_bytes {
            growing += 1;
            added += pair[1].end_bytes - pair[0].end_bytes;
        } else {
            break;
        }
    }
    if growing < 2 {
        return (steps, None);
    }
    // allocations made in a step (not the first) and alive at the end of the trace, by site
    let first_end = steps[0].end;
    let mut sites: HashMap<String, u64> = HashMap::new();
    for a in &lt.allocations {
        if a.free_at.is_none() && a.alloc_at.is_some_and(|k| k > first_end) {
            let key = (a.stack, false, a.category);
            let name = names
                .entry(key)
                .or_insert_with(|| site_label(f.stack(a.stack), false, a.category.name()))
                .clone();
            *sites.entry(name).or_default() += a.size;
        }
    }
    let top = sites
        .into_iter()
        .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)));
    let growth = Growth {
        bytes_per_step: added / growing as u64,
        steps_growing: growing,
        site_bytes: top.as_ref().map_or(0, |t| t.1),
        site: top.map(|t| t.0),
    };
    (steps, Some(growth))
}
