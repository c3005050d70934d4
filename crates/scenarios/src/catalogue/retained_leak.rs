//! `retained-leak`: keeping each step's graph-holding output grows memory linearly; dropping
//! the kept outputs (or clearing them periodically) stops it.

use trainmem_core::timeline::{Phase, Timeline};

use crate::checks::{param_bytes, series_at, steps_of};
use crate::ctx::{Ctx, Judgement};
use crate::error::Result;
use crate::report::{Figure, VerdictKind};

/// Which bytes cause the pattern and what removes it.
pub const EXPLANATION: &[&str] = &[
    "Each step keeps its forward output in a list, and that output's graph is never backwarded: \
     the graph holds every activation the forward saved for backward (and the batch the first \
     layer saved). In burn the kept graph also references the weights it read, so the optimizer \
     cannot update them in place and allocates new ones: the old weights stay with the graph. \
     Live memory grows by the same amount every step until the process runs out.",
    "Knob: keep a detached value (or a scalar) instead of the graph-holding tensor, or clear \
     the list. Without retention live memory is flat from step to step.",
];

/// Live bytes after every optimizer step.
fn per_step(t: &Timeline) -> Vec<u64> {
    series_at(t, Phase::OptimizerStep, None)
}

/// Pattern: the live bytes after every step grow, each step by at least half the largest
/// growth (linear growth, one kept graph per step).
fn grows_linearly(t: &Timeline) -> Judgement {
    let s = per_step(t);
    let diffs = steps_of(&s);
    let min = diffs.iter().copied().min().unwrap_or(0);
    let max = diffs.iter().copied().max().unwrap_or(0);
    let total = s.last().copied().unwrap_or(0) as i64 - s.first().copied().unwrap_or(0) as i64;
    let ok = diffs.len() >= 3 && min > 0 && min as f64 >= 0.5 * max as f64;
    Judgement::new(
        ok,
        format!(
            "live bytes after each of {} steps grow by {min}..{max} bytes per step \
             (every step positive, smallest at least half the largest: linear)",
            s.len()
        ),
        vec![
            Figure::delta("smallest growth per step", min),
            Figure::delta("largest growth per step", max),
            Figure::delta("growth over the run", total),
            Figure::bytes("parameter bytes", param_bytes(t)),
        ],
    )
}

/// Knob: with the outputs not kept (`b`), the live bytes from step 2 on grow by at most 1% of
/// the parameter bytes, where the leaking run (`a`) grows.
fn flat_with_the_fix(a: &Timeline, b: &Timeline) -> Judgement {
    let grown =
        |s: &[u64]| s.last().copied().unwrap_or(0) as i64 - s.get(1).copied().unwrap_or(0) as i64;
    let (ga, gb) = (grown(&per_step(a)), grown(&per_step(b)));
    let params = param_bytes(b);
    let ok = (gb.unsigned_abs() as f64) <= 0.01 * params as f64 && ga > 0;
    Judgement::new(
        ok,
        format!(
            "growth from step 2 to the last step: {ga} bytes kept, {gb} bytes with the \
             fix (at most 1% of the parameter bytes)"
        ),
        vec![
            Figure::delta("growth, outputs kept", ga),
            Figure::delta("growth, fixed", gb),
        ],
    )
}

/// Knob: with the kept outputs cleared every 2 steps (`b`), the second half of the run holds
/// no more than the first (+1%) and stays below the leaking run's (`a`) peak.
fn bounded_by_clearing(a: &Timeline, b: &Timeline) -> Judgement {
    let (sa, sb) = (per_step(a), per_step(b));
    let half = sb.len() / 2;
    let first = sb[..half].iter().copied().max().unwrap_or(0);
    let second = sb[half..].iter().copied().max().unwrap_or(0);
    let peak_a = sa.iter().copied().max().unwrap_or(0);
    let ok = half >= 2 && second as f64 <= first as f64 * 1.01 && second < peak_a;
    Judgement::new(
        ok,
        format!(
            "with clearing, the highest live bytes in the second half of the run \
             ({second}) are no higher than in the first half ({first}) (+1%), against \
             a peak of {peak_a} without clearing"
        ),
        vec![
            Figure::bytes("max, first half", first),
            Figure::bytes("max, second half", second),
            Figure::bytes("peak without clearing", peak_a),
        ],
    )
}

/// Runs the scenario.
pub fn run(ctx: &mut Ctx) -> Result<()> {
    let plan = ctx.plan("retained-leak")?;
    let base = ctx.run("outputs kept with their graph", &plan)?;
    ctx.check(
        base,
        VerdictKind::Pattern,
        "memory grows linearly with the kept graphs",
        grows_linearly,
    );

    let mut fixed = plan.clone();
    fixed.leak.retain_outputs = false;
    fixed.leak.retain_graph = false;
    let f = ctx.run("with the fix: outputs not kept", &fixed)?;
    ctx.compare(
        base,
        f,
        VerdictKind::Knob,
        "not keeping the outputs makes memory flat",
        flat_with_the_fix,
    );

    let mut cleared = plan.clone();
    cleared.leak.clear_every = 2;
    let c = ctx.run("outputs cleared every 2 steps", &cleared)?;
    ctx.compare(
        base,
        c,
        VerdictKind::Knob,
        "clearing the kept outputs every 2 steps bounds memory",
        bounded_by_clearing,
    );
    Ok(())
}
