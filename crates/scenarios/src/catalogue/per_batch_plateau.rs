//! `per-batch-plateau`: after the first step, the live bytes at every phase boundary are the
//! same from step to step — across epochs too — because every step allocates and frees the
//! same tensors; only the first step differs (the optimizer's state appears in it).

use trainmem_core::Category;
use trainmem_core::Plan;
use trainmem_core::model::ModelSpec;
use trainmem_core::plan::{MetricRetention, OptimizerKind};
use trainmem_core::timeline::{Phase, Timeline};

use super::startup::model_parameter_bytes;
use crate::checks::{bytes_at, index_of, spread, steps_of};
use crate::ctx::{Ctx, Judgement};
use crate::error::Result;
use crate::report::{Figure, VerdictKind};

/// Which bytes cause the pattern and what removes it.
pub const EXPLANATION: &[&str] = &[
    "A training step loads a batch, runs forward (saving activations), backward (freeing them \
     and making gradients) and the optimizer step (consuming the gradients). Nothing a step \
     makes outlives it except the updated parameters and the optimizer's state, which are \
     updated in place or replaced by buffers of the same size. So once the state exists, the \
     live bytes at each phase boundary are the same every step, whatever the epoch: memory \
     does not grow per batch.",
    "The first step is the exception: with momentum the velocity (1x the parameter bytes) is \
     created in the first optimizer step, so every later step carries it. A plateau that creeps \
     instead means something outlives its step. Knob: keeping each step's (detached) outputs \
     for an epoch-end metric makes the live bytes grow by one batch of logits per step, and the \
     plateau is gone; with half the batch the plateau holds, at a lower level.",
];

/// Phases a step passes through whose live bytes must repeat.
const STEP_PHASES: [Phase; 5] = [
    Phase::BatchLoaded,
    Phase::Forward,
    Phase::Backward,
    Phase::Metrics,
    Phase::OptimizerStep,
];

/// Bytes of one batch of logits (f32): the smallest thing a step could leave behind.
fn logits_bytes(plan: &Plan) -> Result<u64> {
    let ModelSpec::Cnn(c) = &plan.model else {
        unsuited!("the per-batch-plateau plan must describe a CNN");
    };
    Ok(plan.micro_batch_size() * c.classes * 4)
}

/// Live bytes at `phase` for every step from `from` on.
fn series_from(t: &Timeline, phase: Phase, from: u64) -> Vec<u64> {
    t.samples
        .iter()
        .enumerate()
        .filter(|(_, s)| s.phase == phase && s.step >= from)
        .map(|(i, _)| bytes_at(t, i, None))
        .collect()
}

/// Steps (optimizer_step samples) in the timeline, and the epochs they span.
fn steps_and_epochs(t: &Timeline) -> (usize, u64) {
    let steps = t.indices_at(Phase::OptimizerStep);
    let epochs = steps
        .iter()
        .map(|&i| t.samples[i].epoch)
        .max()
        .map_or(0, |e| e + 1);
    (steps.len(), epochs)
}

/// Mean of the second half of `values` minus the mean of the first half: a trend, which
/// bookkeeping jitter (up and down) does not have and a per-step leftover does.
fn creep(values: &[u64]) -> f64 {
    let half = values.len() / 2;
    if half == 0 {
        return 0.0;
    }
    let mean = |v: &[u64]| v.iter().sum::<u64>() as f64 / v.len() as f64;
    mean(&values[values.len() - half..]) - mean(&values[..half])
}

/// How many steps apart the two halves [`creep`] compares are, for `n` values: a leak of
/// `x` bytes per step shows as a creep of `x` times this.
fn creep_distance(n: usize) -> u64 {
    (n - n / 2) as u64
}

/// The first step whose live bytes the plateau holds: momentum's first velocity is the
/// gradient buffers themselves (step 0), the second step makes the velocity's own buffers,
/// and from the step after that every step carries the same state. On Flex the two velocities
/// have the same size, so step 1 already sits on the plateau; on CUDA the gradient buffers the
/// first velocity reuses are a few KiB smaller than the velocity's own (cubecl's buffer sizes:
/// 6,656 bytes on the plan's CNN), so the level settles one step later.
const PLATEAU_FROM: u64 = 2;

/// From step [`PLATEAU_FROM`] on, every step phase's live bytes repeat: they vary by at most
/// `jitter` bytes, and the second half of the run sits no more than `max_creep` bytes above
/// the first half.
fn plateau(t: &Timeline, jitter: u64, max_creep: u64) -> Judgement {
    let (steps, epochs) = steps_and_epochs(t);
    let mut worst_spread = (Phase::Start, 0u64);
    let mut worst_creep = (Phase::Start, f64::MIN);
    let mut figures = Vec::new();
    let mut phases = 0;
    for phase in STEP_PHASES {
        let s = series_from(t, phase, PLATEAU_FROM);
        if s.is_empty() {
            continue;
        }
        phases += 1;
        let sp = spread(&s);
        let cr = creep(&s);
        if sp >= worst_spread.1 {
            worst_spread = (phase, sp);
        }
        if cr >= worst_creep.1 {
            worst_creep = (phase, cr);
        }
        figures.push(Figure::bytes(
            format!("level after {}", phase.name()),
            s.iter().copied().max().unwrap_or(0),
        ));
        figures.push(Figure::bytes(format!("spread after {}", phase.name()), sp));
    }
    figures.push(Figure::delta("largest creep", worst_creep.1 as i64));
    let ok = steps >= 4
        && epochs >= 2
        && phases >= 4
        && worst_spread.1 <= jitter
        && worst_creep.1 <= max_creep as f64;
    Judgement::new(
        ok,
        format!(
            "over {steps} steps in {epochs} epochs, from the third step on the live bytes at \
             each of {phases} phase boundaries vary by at most {} bytes (after {}; at most \
             {jitter}: 1% of the parameter bytes) and the second half of the run sits {:.0} \
             bytes above the first (after {}; at most {max_creep}: one batch of logits, \
             what leaving {} bytes behind per step would add)",
            worst_spread.1,
            worst_spread.0.name(),
            worst_creep.1,
            worst_creep.0.name(),
            max_creep / creep_distance(steps.saturating_sub(PLATEAU_FROM as usize)).max(1),
        ),
        figures,
    )
}

/// The first step differs: with momentum, one velocity per parameter is carried from the
/// first step on.
fn first_step_differs(t: &Timeline, params: u64) -> Judgement {
    let (Some(f0), Some(f1)) = (
        index_of(t, 0, Phase::Forward),
        index_of(t, 1, Phase::Forward),
    ) else {
        return Judgement::new(false, "no forward samples at steps 0 and 1", vec![]);
    };
    let grown = bytes_at(t, f1, None) as i64 - bytes_at(t, f0, None) as i64;
    let ratio = grown as f64 / params.max(1) as f64;
    Judgement::new(
        (ratio - 1.0).abs() <= 0.03,
        format!(
            "live bytes after the second step's forward exceed the first step's by {ratio:.3} \
             x the parameter bytes (momentum's velocity: 1 +/- 0.03)"
        ),
        vec![
            Figure::bytes("parameter bytes", params),
            Figure::bytes("after forward, step 0", bytes_at(t, f0, None)),
            Figure::bytes("after forward, step 1", bytes_at(t, f1, None)),
            Figure::delta("difference", grown),
        ],
    )
}

/// Growth of the live bytes after each optimizer step, from step 1 on.
fn growth_per_step(t: &Timeline) -> Vec<i64> {
    steps_of(&series_from(t, Phase::OptimizerStep, 1))
}

/// Knob: with each step's outputs kept for an epoch-end metric, the live bytes grow by at
/// least one batch of logits per step and the flat-plateau rule fails.
fn outputs_kept_break_the_plateau(t: &Timeline, params: u64, logits: u64) -> Judgement {
    let g = growth_per_step(t);
    let min = g.iter().copied().min().unwrap_or(0);
    let flat = plateau(t, params / 100, logits).ok;
    let ok = g.len() >= 3 && min >= logits as i64 && !flat;
    Judgement::new(
        ok,
        format!(
            "live bytes after each of {} later steps grow by at least {min} bytes (at \
             least one batch of logits, {logits} bytes), so the flat-plateau rule \
             fails",
            g.len()
        ),
        vec![
            Figure::delta("smallest growth per step", min),
            Figure::bytes("one batch of logits", logits),
        ],
    )
}

/// Knob: with half the batch (`b`) the plateau holds, below the full batch's (`a`) by at
/// least half the activation difference.
fn half_batch_holds_lower(a: &Timeline, b: &Timeline, params: u64, half_logits: u64) -> Judgement {
    let flat = plateau(b, params / 100, half_logits);
    let level = |t: &Timeline| {
        series_from(t, Phase::Forward, 1)
            .into_iter()
            .max()
            .unwrap_or(0)
    };
    let act = |t: &Timeline| {
        index_of(t, 1, Phase::Forward)
            .map(|i| bytes_at(t, i, Some(Category::Activation)))
            .unwrap_or(0)
    };
    let (la, lb) = (level(a), level(b));
    let (aa, ab) = (act(a), act(b));
    let ok = flat.ok && lb < la && la - lb >= (aa - aa.min(ab)) / 2;
    Judgement::new(
        ok,
        format!(
            "with half the batch the plateau holds ({}) at {lb} live bytes after \
             forward against {la}: lower by at least half the activation difference \
             ({aa} vs {ab} bytes)",
            flat.detail
        ),
        vec![
            Figure::bytes("plateau after forward, full batch", la),
            Figure::bytes("plateau after forward, half batch", lb),
            Figure::bytes("activations, full batch", aa),
            Figure::bytes("activations, half batch", ab),
        ],
    )
}

/// Runs the scenario.
pub fn run(ctx: &mut Ctx) -> Result<()> {
    let plan = ctx.plan("per-batch-plateau")?;
    if plan.optimizer.kind != OptimizerKind::Momentum {
        unsuited!(
            "the per-batch-plateau plan must use momentum (its first-step rule is momentum's)"
        );
    }
    let params = model_parameter_bytes(&plan)?;
    let logits = logits_bytes(&plan)?;
    let base = ctx.run(&format!("batch {}", plan.training.batch_size), &plan)?;
    ctx.check(
        base,
        VerdictKind::Pattern,
        "after the first step, memory per step is flat",
        |t| plateau(t, params / 100, logits),
    );
    ctx.check(
        base,
        VerdictKind::Pattern,
        "the first step differs: the velocity appears in it",
        |t| first_step_differs(t, params),
    );

    let mut kept = plan.clone();
    kept.metrics.retention = MetricRetention::Tensors;
    kept.metrics.keep_outputs = true;
    let k = ctx.run("outputs kept for an epoch-end metric (knob)", &kept)?;
    ctx.check(
        k,
        VerdictKind::Knob,
        "keeping each step's outputs breaks the plateau",
        |t| outputs_kept_break_the_plateau(t, params, logits),
    );

    let half_batch = plan.training.batch_size / 2;
    if half_batch == 0 {
        unsuited!("the plan's batch must be at least 2 to halve it");
    }
    let half = plan.with_batch(half_batch, None);
    let half_logits = logits_bytes(&half)?;
    let h = ctx.run(&format!("batch {half_batch} (knob)"), &half)?;
    ctx.compare(
        base,
        h,
        VerdictKind::Knob,
        "half the batch: the plateau holds, lower",
        |a, b| half_batch_holds_lower(a, b, params, half_logits),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checks::testing::{sample, timeline as of};
    use trainmem_core::timeline::Source;

    fn timeline(levels: &[(Phase, u64, u64, u64)]) -> Timeline {
        of(
            Source::Simulated,
            levels.iter().map(|&(phase, step, epoch, live)| {
                // Any tagged category: the rules read the run's own bytes, which leave out
                // `other` (untagged).
                sample(phase, step, epoch, &[(Category::Activation, live)])
            }),
        )
    }

    fn steps(creep: u64) -> Timeline {
        let mut rows = Vec::new();
        for step in 0..6u64 {
            let epoch = step / 3;
            let base = if step == 0 { 0 } else { 50 } + creep * step;
            rows.push((Phase::BatchLoaded, step, epoch, 100 + base));
            rows.push((Phase::Forward, step, epoch, 200 + base));
            rows.push((Phase::Backward, step, epoch, 150 + base));
            rows.push((Phase::OptimizerStep, step, epoch, 120 + base));
        }
        timeline(&rows)
    }

    #[test]
    fn plateau_ignores_the_first_step_and_catches_creep() {
        let flat = steps(0);
        assert!(plateau(&flat, 5, 2).ok);
        assert_eq!(series_from(&flat, Phase::Forward, 1), vec![250; 5]);
        assert_eq!(steps_and_epochs(&flat), (6, 2));
        assert_eq!(growth_per_step(&flat), vec![0; 4]);
        let creeping = steps(4);
        assert!(!plateau(&creeping, 100, 2).ok, "creeping by 4 bytes a step");
        assert!(creep(&[10, 12, 10, 12, 10, 12]) < 1.0, "jitter is no creep");
        assert_eq!(creep(&[1, 2, 3, 4]), 2.0);
        // 11 values: the halves are values 0..5 and 6..11, their centres 6 apart.
        let leak: Vec<u64> = (0..11).map(|i| 7 * i).collect();
        assert_eq!(creep(&leak), 7.0 * creep_distance(11) as f64);
        assert_eq!(growth_per_step(&creeping), vec![4; 4]);
        assert!(first_step_differs(&flat, 50).ok);
        assert!(!first_step_differs(&flat, 40).ok);
    }
}
