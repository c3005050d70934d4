//! `fit`: the largest batch (or micro-batch) that fits a device capacity, by search.
//!
//! Each probe simulates a few optimizer steps (enough for lazily created optimizer state and
//! one steady step) with the candidate size; a probe fits when no allocation fails. The
//! search doubles until a size fails, then bisects, so the answer `n` fits and `n + 1` does
//! not (given the probe's steps). Every probe is simulated for the same [`Machine`].

use serde::Serialize;

use crate::SimError;
use crate::engine::{SimOptions, simulate};
use crate::machine::Machine;
use trainmem_core::plan::Plan;

/// What `fit` varies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FitTarget {
    /// The batch size, without gradient accumulation.
    Batch,
    /// The micro-batch size, keeping the number of accumulation steps.
    MicroBatch,
}

/// The answer of `fit`.
#[derive(Debug, Clone, Serialize)]
pub struct FitResult {
    /// What was varied.
    pub target: FitTarget,
    /// The capacity tested.
    pub capacity: u64,
    /// The largest size that fits (`None`: not even 1).
    pub largest: Option<u64>,
    /// Peak allocated at the largest size.
    pub peak_allocated: u64,
    /// Peak reserved at the largest size.
    pub peak_reserved: u64,
    /// The first size that does not fit, with the allocator's message (`None` if the search
    /// limit fits).
    pub first_failing: Option<(u64, String)>,
    /// Simulations run.
    pub probes: u32,
}

/// Steps each probe simulates.
pub fn probe_steps(plan: &Plan) -> u64 {
    (2 * plan.accumulation_steps().max(1))
        .min(plan.total_steps())
        .max(2)
}

/// The plan with size `n` of `target` and capacity `capacity`, shortened to the probe.
pub fn probe_plan(plan: &Plan, target: FitTarget, n: u64, capacity: u64) -> Plan {
    let sized = match target {
        FitTarget::Batch => plan.with_batch(n, None),
        FitTarget::MicroBatch => {
            let acc = plan.accumulation_steps();
            plan.with_batch(n * acc, Some(n))
        }
    };
    shortened(&sized, probe_steps(plan), capacity)
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

/// Outcome of one probe on `machine`: `Ok((peak allocated, peak reserved))` or
/// `Err(message)`.
pub fn probe(
    plan: &Plan,
    target: FitTarget,
    n: u64,
    capacity: u64,
    machine: Machine,
) -> Result<Result<(u64, u64), String>, SimError> {
    let p = probe_plan(plan, target, n, capacity);
    let opts = SimOptions {
        machine,
        ..SimOptions::default()
    };
    let r = simulate(&p, opts)?;
    Ok(match r.summary.oom {
        None => Ok((r.summary.peak_allocated, r.summary.peak_reserved)),
        Some(o) => Err(o.message),
    })
}

/// Finds the largest size of `target` that fits `capacity` on `machine`, searching up to
/// `limit`.
pub fn fit(
    plan: &Plan,
    target: FitTarget,
    capacity: u64,
    limit: u64,
    machine: Machine,
) -> Result<FitResult, SimError> {
    fit_with_progress(plan, target, capacity, limit, machine, &mut |_, _| {})
}

/// [`fit`], telling `on_probe` the size and whether it fits after each probe.
pub fn fit_with_progress(
    plan: &Plan,
    target: FitTarget,
    capacity: u64,
    limit: u64,
    machine: Machine,
    on_probe: &mut dyn FnMut(u64, bool),
) -> Result<FitResult, SimError> {
    let mut probes = 0u32;
    let mut run = |n: u64| {
        probes += 1;
        let r = probe(plan, target, n, capacity, machine);
        if let Ok(outcome) = &r {
            on_probe(n, outcome.is_ok());
        }
        r
    };
    let mut result = FitResult {
        target,
        capacity,
        largest: None,
        peak_allocated: 0,
        peak_reserved: 0,
        first_failing: None,
        probes: 0,
    };
    let mut good: Option<(u64, (u64, u64))> = None;
    let mut bad: Option<(u64, String)> = None;
    let mut n = 1u64;
    loop {
        match run(n)? {
            Ok(peaks) => {
                good = Some((n, peaks));
                if n >= limit {
                    break;
                }
                n = (n * 2).min(limit);
            }
            Err(msg) => {
                bad = Some((n, msg));
                break;
            }
        }
    }
    if let (Some((mut lo, mut lo_peaks)), Some((mut hi, mut hi_msg))) = (good, bad.clone()) {
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            match run(mid)? {
                Ok(p) => {
                    lo = mid;
                    lo_peaks = p;
                }
                Err(m) => {
                    hi = mid;
                    hi_msg = m;
                }
            }
        }
        good = Some((lo, lo_peaks));
        bad = Some((hi, hi_msg));
    }
    if let Some((n, (pa, pr))) = good {
        result.largest = Some(n);
        result.peak_allocated = pa;
        result.peak_reserved = pr;
    }
    result.first_failing = bad;
    result.probes = probes;
    Ok(result)
}
