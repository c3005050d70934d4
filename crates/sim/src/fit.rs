//! `fit`: the largest batch (or micro-batch) that fits a device capacity, by search.
//!
//! A size *fits* when the plan at that size ([`full_plan`]: its own epochs, steps,
//! checkpoints and everything else, on the capacity) is a valid plan and simulates without
//! running out of memory: what `trainmem simulate` predicts for the plan at that size. (A
//! plan whose steps follow from its data set, with `drop_last`, is not valid at a batch
//! larger than the data.) The search has two parts:
//!
//! 1. Probes find a candidate fast. Each probe simulates a few optimizer steps
//!    ([`probe_steps`]: enough for lazily created optimizer state and one steady step) with
//!    the size; the search doubles until a probe fails, then bisects.
//! 2. Full runs of the plan confirm it. A probe is not the plan: the plan may run more steps
//!    (a leak, the cache fragmenting as it goes, a checkpoint's copy, an epoch boundary),
//!    and memory does not rise monotonically with the size near the limit (the caching
//!    allocator rounds and splits blocks: bert-base at sequence 512 in mixed f16 on 24 GiB
//!    fits at batch 142, not at 143, and at 144 over two steps but not three). So from the
//!    candidate the search walks down (or up) with full runs, doubling its stride, bisects to
//!    a size that fits next to one that does not, then runs the [`ABOVE`] sizes above it in
//!    full, moving up to any that fits.
//!
//! What the answer ([`FitResult`]) guarantees:
//!
//! - the size reported fits: its full run does not run out of memory (the peaks and step
//!   count reported are that run's);
//! - it is the largest of the sizes `fit` ran in full that fit;
//! - each of the [`ABOVE`] sizes above it (fewer where the search limit is closer) was run in
//!   full and does not fit; [`FitResult::first_failing`] is the first of them;
//! - "none fits" means that size 1 and the sizes after it up to [`ABOVE`] were run in full
//!   and none fits.
//!
//! Sizes further above are not all tried: with memory not monotonic in the size, a larger
//! one may still fit. A typical plan costs about a dozen probes and five full runs. Every
//! simulation is for the same [`Machine`].

use std::collections::HashMap;

use serde::Serialize;

use crate::SimError;
use crate::engine::{SimOptions, When, simulate};
use crate::machine::Machine;
use trainmem_core::plan::Plan;

/// Sizes above the answer that `fit` runs in full and finds not fitting (fewer where the
/// search limit is closer).
pub const ABOVE: u64 = 4;

/// What `fit` varies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FitTarget {
    /// The batch size, without gradient accumulation.
    Batch,
    /// The micro-batch size, keeping the number of accumulation steps.
    MicroBatch,
}

/// The answer of `fit` (see the [module docs](self) for what it guarantees).
#[derive(Debug, Clone, Serialize)]
pub struct FitResult {
    /// What was varied.
    pub target: FitTarget,
    /// The capacity tested.
    pub capacity: u64,
    /// The largest size that fits: the plan at this size, run in full on `capacity`, does not
    /// run out of memory, and no larger size run in full did fit (`None`: size 1 does not
    /// fit, nor any other size up to [`ABOVE`]).
    pub largest: Option<u64>,
    /// Peak allocated of the full run at the largest size.
    pub peak_allocated: u64,
    /// Peak reserved of the full run at the largest size.
    pub peak_reserved: u64,
    /// Optimizer steps the plan runs at the largest size (0 when none fits).
    pub steps: u64,
    /// The size just above the largest (1 when none fits), which does not fit, with the
    /// allocator's message from its full run, or why the plan at that size is not valid
    /// (`None` if the largest is the search limit).
    pub first_failing: Option<(u64, String)>,
    /// When the first failing size's full run ran out of memory (`None` also when the plan
    /// at that size is not valid).
    pub first_failing_when: Option<When>,
    /// Every size from the first failing one up to this one was run in full and does not
    /// fit ([`ABOVE`] sizes, fewer where the search limit is closer).
    pub failing_up_to: Option<u64>,
    /// Simulations run, probes and full runs together (a size at which the plan is not valid
    /// is not simulated).
    pub probes: u32,
    /// Of those, full runs of the plan.
    pub full_runs: u32,
}

/// One simulation of `fit`'s search, as [`fit_with_progress`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Simulated {
    /// The size simulated.
    pub size: u64,
    /// A full run of the plan at that size (else a probe of [`probe_steps`] steps).
    pub full: bool,
    /// Whether it ran without running out of memory.
    pub fits: bool,
}

/// Steps each probe simulates.
pub fn probe_steps(plan: &Plan) -> u64 {
    (2 * plan.accumulation_steps().max(1))
        .min(plan.total_steps())
        .max(2)
}

/// The plan with size `n` of `target`, on a device of `capacity`, otherwise as written: what
/// a full run simulates (and what `trainmem simulate` runs for the plan at that size).
pub fn full_plan(plan: &Plan, target: FitTarget, n: u64, capacity: u64) -> Plan {
    let mut p = match target {
        FitTarget::Batch => plan.with_batch(n, None),
        FitTarget::MicroBatch => {
            let acc = plan.accumulation_steps();
            plan.with_batch(n.saturating_mul(acc), Some(n))
        }
    };
    p.device.capacity.0 = capacity;
    p
}

/// The plan with size `n` of `target` and capacity `capacity`, shortened to the probe.
pub fn probe_plan(plan: &Plan, target: FitTarget, n: u64, capacity: u64) -> Plan {
    shortened(
        &full_plan(plan, target, n, capacity),
        probe_steps(plan),
        capacity,
    )
}

/// `plan` at `capacity`, shortened to one epoch of `steps` optimizer steps with no checkpoint
/// written: what a probe simulates.
pub fn shortened(plan: &Plan, steps: u64, capacity: u64) -> Plan {
    let mut p = plan.clone();
    p.device.capacity.0 = capacity;
    p.training.epochs = 1;
    p.training.steps_per_epoch = Some(steps);
    p.training.max_steps = None;
    p.training.checkpoint_every = 0;
    p
}

/// What one simulation of the search found.
#[derive(Debug, Clone)]
struct Outcome {
    /// Peak allocated and peak reserved.
    peaks: (u64, u64),
    /// Optimizer steps simulated.
    steps: u64,
    /// Why it does not fit: the allocator's message and when it ran out of memory, or (with
    /// no when) why the plan at that size is not a valid plan.
    oom: Option<(String, Option<When>)>,
}

impl Outcome {
    /// `Ok((peak allocated, peak reserved))`, or `Err(why it does not fit)`.
    fn verdict(self) -> Result<(u64, u64), String> {
        match self.oom {
            None => Ok(self.peaks),
            Some((message, _)) => Err(message),
        }
    }

    fn fits(&self) -> bool {
        self.oom.is_none()
    }
}

fn run(p: &Plan, machine: Machine) -> Result<Outcome, SimError> {
    let opts = SimOptions {
        machine,
        ..SimOptions::default()
    };
    let r = simulate(p, opts)?;
    let s = r.summary;
    Ok(Outcome {
        peaks: (s.peak_allocated, s.peak_reserved),
        steps: s.steps,
        oom: s.oom.map(|o| (o.message, Some(o.when))),
    })
}

/// Outcome of one probe on `machine`: `Ok((peak allocated, peak reserved))` or
/// `Err(message)`.
pub fn probe(
    plan: &Plan,
    target: FitTarget,
    n: u64,
    capacity: u64,
    machine: Machine,
) -> Result<Result<(u64, u64), String>, SimError> {
    let o = run(&probe_plan(plan, target, n, capacity), machine)?;
    Ok(o.verdict())
}

/// The full run of the plan at size `n` on `machine` ([`full_plan`]), and whether it was
/// simulated: a plan that is not valid at that size is not, and does not fit.
fn full_outcome(
    plan: &Plan,
    target: FitTarget,
    n: u64,
    capacity: u64,
    machine: Machine,
) -> Result<(Outcome, bool), SimError> {
    let p = full_plan(plan, target, n, capacity);
    if let Err(e) = p.validate() {
        // a plan no one can run (its data makes no batch of the size, say)
        let o = Outcome {
            peaks: (0, 0),
            steps: 0,
            oom: Some((e.to_string(), None)),
        };
        return Ok((o, false));
    }
    Ok((run(&p, machine)?, true))
}

/// Outcome of the full run of the plan at size `n` on `machine` ([`full_plan`]):
/// `Ok((peak allocated, peak reserved))`, or `Err(message)`: the allocator's, or why the plan
/// is not valid at that size.
pub fn full_run(
    plan: &Plan,
    target: FitTarget,
    n: u64,
    capacity: u64,
    machine: Machine,
) -> Result<Result<(u64, u64), String>, SimError> {
    let (o, _) = full_outcome(plan, target, n, capacity, machine)?;
    Ok(o.verdict())
}

/// Finds the largest size of `target` that fits `capacity` on `machine`, searching up to
/// `limit` (see the [module docs](self) for what the answer guarantees).
pub fn fit(
    plan: &Plan,
    target: FitTarget,
    capacity: u64,
    limit: u64,
    machine: Machine,
) -> Result<FitResult, SimError> {
    fit_with_progress(plan, target, capacity, limit, machine, &mut |_| {})
}

/// The search's simulations, counted and reported.
struct Search<'a> {
    plan: &'a Plan,
    target: FitTarget,
    capacity: u64,
    machine: Machine,
    on_sim: &'a mut dyn FnMut(Simulated),
    probes: u32,
    full_runs: u32,
    /// Full runs by size (each size is run in full at most once).
    full: HashMap<u64, Outcome>,
}

impl Search<'_> {
    fn probe(&mut self, n: u64) -> Result<Outcome, SimError> {
        self.probes += 1;
        let o = run(
            &probe_plan(self.plan, self.target, n, self.capacity),
            self.machine,
        )?;
        (self.on_sim)(Simulated {
            size: n,
            full: false,
            fits: o.fits(),
        });
        Ok(o)
    }

    /// Whether size `n` fits, by its full run.
    fn fits(&mut self, n: u64) -> Result<bool, SimError> {
        if let Some(o) = self.full.get(&n) {
            return Ok(o.fits());
        }
        let (o, simulated) = full_outcome(self.plan, self.target, n, self.capacity, self.machine)?;
        let fits = o.fits();
        if simulated {
            self.probes += 1;
            self.full_runs += 1;
            (self.on_sim)(Simulated {
                size: n,
                full: true,
                fits,
            });
        }
        self.full.insert(n, o);
        Ok(fits)
    }

    /// The probes' candidate: a size whose probe fits next to one whose probe does not (or
    /// the limit), by doubling and bisection; 0 when size 1's probe does not fit.
    fn candidate(&mut self, limit: u64) -> Result<u64, SimError> {
        let mut good = 0u64;
        let mut bad = None;
        let mut n = 1u64;
        loop {
            if self.probe(n)?.fits() {
                good = n;
                if n >= limit {
                    break;
                }
                n = n.saturating_mul(2).min(limit);
            } else {
                bad = Some(n);
                break;
            }
        }
        if let Some(mut hi) = bad {
            let mut lo = good;
            if lo > 0 {
                while hi - lo > 1 {
                    let mid = lo + (hi - lo) / 2;
                    if self.probe(mid)?.fits() {
                        lo = mid;
                    } else {
                        hi = mid;
                    }
                }
            }
            good = lo;
        }
        Ok(good)
    }

    /// From the candidate, full runs: a size that fits (`None`: not even 1) next to one
    /// that does not (or the limit), every size run in full that fits at most it.
    fn confirm(&mut self, candidate: u64, limit: u64) -> Result<Option<u64>, SimError> {
        let start = candidate.clamp(1, limit);
        // `lo` fits (or is 0: nothing fits), `hi` does not (or is None: the limit fits)
        let (mut lo, mut hi);
        if self.fits(start)? {
            lo = start;
            hi = None;
            let mut stride = 1u64;
            while lo < limit {
                let k = lo.saturating_add(stride).min(limit);
                if self.fits(k)? {
                    lo = k;
                    stride = stride.saturating_mul(2);
                } else {
                    hi = Some(k);
                    break;
                }
            }
        } else {
            hi = Some(start);
            lo = 0;
            let mut stride = 1u64;
            while let Some(h) = hi.filter(|&h| h > 1) {
                let k = h.saturating_sub(stride).max(1);
                if self.fits(k)? {
                    lo = k;
                    break;
                }
                hi = Some(k);
                stride = stride.saturating_mul(2);
            }
        }
        if let Some(mut h) = hi {
            // lo == 0 here only when hi == 1
            while h - lo > 1 {
                let mid = lo + (h - lo) / 2;
                if self.fits(mid)? {
                    lo = mid;
                } else {
                    h = mid;
                }
            }
        }
        // the sizes just above, moving up to any that fits
        let mut k = lo;
        while k < limit.min(lo.saturating_add(ABOVE)) {
            k += 1;
            if self.fits(k)? {
                lo = k;
            }
        }
        Ok((lo > 0).then_some(lo))
    }
}

/// [`fit`], telling `on_sim` the size, whether it was a probe or a full run, and whether it
/// fits after each simulation.
pub fn fit_with_progress(
    plan: &Plan,
    target: FitTarget,
    capacity: u64,
    limit: u64,
    machine: Machine,
    on_sim: &mut dyn FnMut(Simulated),
) -> Result<FitResult, SimError> {
    let limit = limit.max(1);
    let mut s = Search {
        plan,
        target,
        capacity,
        machine,
        on_sim,
        probes: 0,
        full_runs: 0,
        full: HashMap::new(),
    };
    let candidate = s.candidate(limit)?;
    let largest = s.confirm(candidate, limit)?;
    let mut result = FitResult {
        target,
        capacity,
        largest,
        peak_allocated: 0,
        peak_reserved: 0,
        steps: 0,
        first_failing: None,
        first_failing_when: None,
        failing_up_to: None,
        probes: s.probes,
        full_runs: s.full_runs,
    };
    let base = largest.unwrap_or(0);
    if let Some(o) = largest.and_then(|n| s.full.get(&n)) {
        (result.peak_allocated, result.peak_reserved) = o.peaks;
        result.steps = o.steps;
    }
    if base < limit {
        let first = base + 1;
        if let Some((message, when)) = s.full.get(&first).and_then(|o| o.oom.clone()) {
            result.first_failing = Some((first, message));
            result.first_failing_when = when;
        }
        result.failing_up_to = Some(limit.min(base.saturating_add(ABOVE)));
    }
    Ok(result)
}
