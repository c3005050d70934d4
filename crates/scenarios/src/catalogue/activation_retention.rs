//! `activation-retention`: the activations a forward pass saves for backward stay alive from
//! the forward until the backward pass frees them, every step, and their amount follows the
//! batch.

use trainmem_core::Category;
use trainmem_core::Plan;
use trainmem_core::model::ModelSpec;
use trainmem_core::timeline::{Phase, Timeline};

use crate::checks::bytes_at;
use crate::ctx::{Ctx, Judgement};
use crate::error::Result;
use crate::report::{Figure, VerdictKind};

/// Which bytes cause the pattern and what removes it.
pub const EXPLANATION: &[&str] = &[
    "During the forward pass burn-autodiff records every op in a graph, and an op whose \
     backward needs its input (a matrix product, layer norm, softmax, GELU) keeps that input \
     alive in the graph. Those saved tensors are the activations: they pile up through the \
     forward pass and stay alive until `backward` walks the graph and drops each one once its \
     gradient has been computed. After backward only the logits and the loss remain (the run \
     still holds them for its metrics), and they are dropped before the optimizer step.",
    "The saved tensors are per sample: every one of them has the batch as its first dimension, \
     so the memory held between forward and backward is proportional to the batch. Knob: \
     halving the batch halves the activations held (gradient accumulation and gradient \
     checkpointing are the ways to keep the effective batch while holding less).",
];

/// One micro-batch's samples: after its batch was loaded, after its forward, after its
/// backward.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Pass {
    /// Optimizer step.
    pub step: u64,
    /// `batch_loaded` sample.
    pub loaded: usize,
    /// `forward` sample.
    pub forward: usize,
    /// `backward` sample.
    pub backward: usize,
}

/// Every (batch_loaded, forward, backward) triple of a timeline, in order.
pub(super) fn passes(t: &Timeline) -> Vec<Pass> {
    let mut out = Vec::new();
    let (mut loaded, mut forward) = (None, None);
    for (i, s) in t.samples.iter().enumerate() {
        match s.phase {
            Phase::BatchLoaded => (loaded, forward) = (Some(i), None),
            Phase::Forward => forward = Some(i),
            Phase::Backward => {
                if let (Some(l), Some(f)) = (loaded, forward) {
                    out.push(Pass {
                        step: s.step,
                        loaded: l,
                        forward: f,
                        backward: i,
                    });
                }
                (loaded, forward) = (None, None);
            }
            _ => {}
        }
    }
    out
}

/// Activation bytes at sample `i`.
pub(super) fn act(t: &Timeline, i: usize) -> u64 {
    bytes_at(t, i, Some(Category::Activation))
}

/// What the model legitimately still holds after backward: its logits (f32), until the
/// run's metrics have read them.
fn logits_bytes(plan: &Plan) -> Result<u64> {
    let ModelSpec::Transformer(m) = &plan.model else {
        unsuited!("the activation-retention plan must describe a transformer");
    };
    Ok(plan.micro_batch_size() * m.seq_len * m.vocab * 4)
}

/// A lower bound on what one forward saves (f32): in every block the attention and the
/// feed-forward each keep their input (batch × sequence × hidden) for the backward of their
/// first matrix product, and the attention keeps its softmax output (batch × heads ×
/// sequence × sequence); the logits (batch × sequence × vocabulary) are alive once the
/// forward has produced them.
pub(super) fn transformer_saved_floor(plan: &Plan) -> Result<u64> {
    let ModelSpec::Transformer(m) = &plan.model else {
        unsuited!("the plan must describe a transformer");
    };
    let b = plan.micro_batch_size();
    let per_block = 2 * m.seq_len * m.hidden + m.heads * m.seq_len * m.seq_len;
    Ok(m.layers * b * per_block * 4 + logits_bytes(plan)?)
}

/// Per pass: activations added by the forward, and freed by the backward.
fn added_and_freed(t: &Timeline, p: &Pass) -> (i64, i64) {
    let added = act(t, p.forward) as i64 - act(t, p.loaded) as i64;
    let freed = act(t, p.forward) as i64 - act(t, p.backward) as i64;
    (added, freed)
}

/// Every pass holds at least `floor` from forward to backward, and backward frees all of it
/// but the logits.
fn held_until_backward(t: &Timeline, floor: u64, logits: u64) -> Judgement {
    let ps = passes(t);
    let mut worst_added = i64::MAX;
    let mut worst_left = i64::MIN;
    for p in &ps {
        let (added, freed) = added_and_freed(t, p);
        worst_added = worst_added.min(added);
        worst_left = worst_left.max(added - freed);
    }
    let allowed = (1.1 * logits as f64) as i64;
    let ok = ps.len() >= 2 && worst_added >= floor as i64 && worst_left <= allowed;
    Judgement::new(
        ok,
        format!(
            "in each of {} forward/backward passes the forward adds at least {worst_added} \
             activation bytes (floor {floor}: every block's saved inputs and attention \
             scores, and the logits) and backward frees all but at most {worst_left} of \
             them (at most 1.1 x the {logits} bytes of logits the run still holds)",
            ps.len()
        ),
        vec![
            Figure::bytes("saved-activation floor", floor),
            Figure::delta("smallest added by a forward", worst_added),
            Figure::delta("largest left after backward", worst_left),
            Figure::bytes("logits bytes", logits),
        ],
    )
}

/// After every optimizer step no activation is left (the logits were dropped too).
fn none_between_steps(t: &Timeline, floor: u64) -> Judgement {
    let left: Vec<u64> = t
        .indices_at(Phase::OptimizerStep)
        .into_iter()
        .map(|i| act(t, i))
        .collect();
    let before = t
        .indices_at(Phase::ModelInit)
        .first()
        .map(|&i| act(t, i))
        .unwrap_or(0);
    let most = left.iter().copied().max().unwrap_or(u64::MAX);
    let ok = !left.is_empty() && most.saturating_sub(before) as f64 <= 0.01 * floor as f64;
    Judgement::new(
        ok,
        format!(
            "after each of {} optimizer steps at most {most} activation bytes are live \
             ({before} at model_init; at most 1% of the floor above that)",
            left.len()
        ),
        vec![
            Figure::bytes("activations after a step, most", most),
            Figure::bytes("activations at model_init", before),
        ],
    )
}

/// The mean activation bytes a backward frees, over the run's passes.
fn mean_freed(t: &Timeline) -> f64 {
    let ps = passes(t);
    let sum: i64 = ps.iter().map(|p| added_and_freed(t, p).1).sum();
    sum as f64 / ps.len().max(1) as f64
}

/// Runs the scenario.
pub fn run(ctx: &mut Ctx) -> Result<()> {
    let plan = ctx.plan("activation-retention")?;
    let floor = transformer_saved_floor(&plan)?;
    let logits = logits_bytes(&plan)?;
    let base = ctx.run(&format!("batch {}", plan.training.batch_size), &plan)?;
    ctx.check(
        base,
        VerdictKind::Pattern,
        "activations are held from forward until backward frees them",
        |t| held_until_backward(t, floor, logits),
    );
    ctx.check(
        base,
        VerdictKind::Pattern,
        "no activations survive the step",
        |t| none_between_steps(t, floor),
    );

    let half_batch = plan.training.batch_size / 2;
    if half_batch == 0 {
        unsuited!("the plan's batch must be at least 2 to halve it");
    }
    let half = plan.with_batch(half_batch, None);
    let h = ctx.run(&format!("batch {half_batch} (knob)"), &half)?;
    let half_floor = transformer_saved_floor(&half)?;
    let half_logits = logits_bytes(&half)?;
    ctx.check(
        h,
        VerdictKind::Pattern,
        "half the batch: still held until backward",
        |t| held_until_backward(t, half_floor, half_logits),
    );
    ctx.compare(
        base,
        h,
        VerdictKind::Knob,
        "halving the batch halves the activations held",
        |a, b| {
            let (fa, fb) = (mean_freed(a), mean_freed(b));
            let ratio = fb / fa.max(1.0);
            Judgement::new(
                (ratio - 0.5).abs() <= 0.05,
                format!(
                    "backward frees {fb:.0} activation bytes per pass with half the batch \
                     against {fa:.0} with the full batch: {ratio:.3} (0.5 +/- 0.05)"
                ),
                vec![
                    Figure::bytes("freed per pass, full batch", fa as u64),
                    Figure::bytes("freed per pass, half batch", fb as u64),
                    Figure::ratio("half / full", ratio),
                ],
            )
        },
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checks::testing::{sample, timeline as of};
    use trainmem_core::timeline::Source;

    fn timeline(phases: &[(Phase, u64, u64)]) -> Timeline {
        of(
            Source::Simulated,
            phases
                .iter()
                .map(|&(phase, step, act)| sample(phase, step, 0, &[(Category::Activation, act)])),
        )
    }

    #[test]
    fn passes_pair_each_forward_with_its_backward() {
        use Phase::*;
        let t = timeline(&[
            (ModelInit, 0, 0),
            (BatchLoaded, 0, 0),
            (Forward, 0, 100),
            (Backward, 0, 10),
            (OptimizerStep, 0, 0),
            (BatchLoaded, 1, 0),
            (Forward, 1, 90),
            (Backward, 1, 0),
            (BatchLoaded, 2, 0),
        ]);
        let ps = passes(&t);
        assert_eq!(ps.len(), 2);
        assert_eq!((ps[0].loaded, ps[0].forward, ps[0].backward), (1, 2, 3));
        assert_eq!(ps[1].step, 1);
        assert_eq!(added_and_freed(&t, &ps[0]), (100, 90));
        assert!((mean_freed(&t) - 90.0).abs() < 1e-9);
        assert!(held_until_backward(&t, 90, 10).ok);
        assert!(
            !held_until_backward(&t, 95, 10).ok,
            "a forward below the floor"
        );
        assert!(
            !held_until_backward(&t, 90, 5).ok,
            "too much left after backward"
        );
    }
}
