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
    /// The last steps in a row that each left more live after their optimizer step (else
    /// their backward, else their end) than the step before at the same point.
    pub steps_growing: usize,
    /// The site whose allocations, made by at least two steps after the first and still live
    /// at the end of the trace, hold the most bytes (None when no site keeps allocations of
    /// two steps).
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
    let (steps, settled) = find_steps(lt, curve);
    // live bytes after each step's optimizer step (else backward, else end): a point that
    // is the same in every step, also in the last one, which no zero_grad follows
    let points: Vec<u64> = steps
        .iter()
        .map(|s| {
            let (opt, bwd) = settled.get(&s.cycle).copied().unwrap_or_default();
            curve[opt.or(bwd).unwrap_or(s.end)]
        })
        .collect();
    let (growing, added) = last_growing(&points);
    if growing < 2 {
        return (steps, None);
    }
    let top = top_kept_site(f, lt, steps[0].end, names);
    let growth = Growth {
        bytes_per_step: added / growing as u64,
        steps_growing: growing,
        site_bytes: top.as_ref().map_or(0, |t| t.1),
        site: top.map(|t| t.0),
    };
    (steps, Some(growth))
}

/// Per cycle, the last entry of its last optimizer window and of its last backward window.
type Settled = BTreeMap<usize, (Option<usize>, Option<usize>)>;

/// The cycles that train, as steps, and the points they settle at.
fn find_steps(lt: &Lifetimes, curve: &[u64]) -> (Vec<StepInfo>, Settled) {
    // per cycle: first entry, one past the last, whether it trains, and the last entry of
    // its last optimizer window and of its last backward window (the point steps are
    // compared at)
    let mut by_cycle: BTreeMap<usize, (usize, usize, bool)> = BTreeMap::new();
    let mut settled: Settled = BTreeMap::new();
    for w in &lt.windows {
        let e = by_cycle.entry(w.cycle).or_insert((w.start, w.end, false));
        e.0 = e.0.min(w.start);
        e.1 = e.1.max(w.end);
        if matches!(w.phase, Some(StackPhase::Backward | StackPhase::Optimizer)) {
            e.2 = true;
        }
        if w.end > w.start {
            let s = settled.entry(w.cycle).or_default();
            match w.phase {
                Some(StackPhase::Optimizer) => s.0 = Some(w.end - 1),
                Some(StackPhase::Backward) => s.1 = Some(w.end - 1),
                _ => {}
            }
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
    (steps, settled)
}

/// The last steps in a row that grew, and the bytes they added.
fn last_growing(points: &[u64]) -> (usize, u64) {
    let mut growing = 0;
    let mut added = 0u64;
    for pair in points.windows(2).rev() {
        if pair[1] > pair[0] {
            growing += 1;
            added += pair[1] - pair[0];
        } else {
            break;
        }
    }
    (growing, added)
}

/// The site keeping the most bytes made by two or more steps after the first.
fn top_kept_site(
    f: &FramedSnapshot,
    lt: &Lifetimes,
    first_end: usize,
    names: &mut super::SiteNames,
) -> Option<(String, u64)> {
    // by site: bytes, steps that made them, the last such step
    let mut sites: HashMap<String, (u64, usize, usize)> = HashMap::new();
    for a in &lt.allocations {
        let Some(at) = a.alloc_at else { continue };
        if a.free_at.is_none() && at > first_end {
            let key = (a.stack, false, a.category);
            let name = names
                .entry(key)
                .or_insert_with(|| site_label(f.stack(a.stack), false, a.category.name()))
                .clone();
            let cycle = lt
                .window_of
                .get(at)
                .and_then(|&w| lt.windows.get(w as usize))
                .map_or(0, |w| w.cycle);
            let s = sites.entry(name).or_insert((0, 0, usize::MAX));
            s.0 += a.size;
            if s.2 != cycle {
                s.1 += 1;
                s.2 = cycle;
            }
        }
    }
    sites
        .into_iter()
        .filter(|(_, (_, steps, _))| *steps >= 2)
        .map(|(name, (bytes, _, _))| (name, bytes))
        .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))
}
