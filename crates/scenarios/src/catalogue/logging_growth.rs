//! `logging-growth`: keeping every step's metric tensors and model outputs (to log or score
//! them later) grows live memory by about one batch of outputs per step; keeping scalars does
//! not grow it.

use trainmem_core::Plan;
use trainmem_core::model::ModelSpec;
use trainmem_core::plan::MetricRetention;
use trainmem_core::timeline::Timeline;

use crate::checks::growth_per_step;
use crate::ctx::{Ctx, Judgement};
use crate::error::Result;
use crate::report::{Figure, VerdictKind};

/// Which bytes cause the pattern and what removes it.
pub const EXPLANATION: &[&str] = &[
    "The loop keeps each step's loss tensor and a detached copy of the step's outputs in lists, \
     to compute epoch metrics later. Detaching drops the graph (backward already consumed it), \
     but the tensor still owns its buffer: one batch of logits (batch x outputs x 4 bytes in \
     f32) stays alive per step, plus a few hundred bytes per kept loss. Live memory climbs by \
     that much after every step for the whole epoch, which on a long run looks like a slow \
     leak.",
    "Knob: `metrics.retention = \"scalars\"` with `keep_outputs = false` reads the loss into a \
     host float and keeps nothing else, so memory is flat from step to step. Keeping only the \
     loss tensors (no outputs) costs almost nothing: the outputs are what grow.",
];

/// Bytes of one batch of model outputs (the kept logits), from the plan's sizes.
fn output_batch_bytes(plan: &Plan) -> Result<u64> {
    let ModelSpec::Mlp(mlp) = &plan.model else {
        unsuited!("logging-growth expects an MLP plan (its outputs size one kept batch)");
    };
    Ok(plan.micro_batch_size() * mlp.output * plan.precision.compute.size())
}

/// Whether every step grows live memory by one batch of outputs (within `margin`).
fn grows_by_one_batch(t: &Timeline, batch_out: u64, margin: f64) -> Judgement {
    let g = growth_per_step(t);
    let min = g.iter().copied().min().unwrap_or(0);
    let max = g.iter().copied().max().unwrap_or(0);
    let total: i64 = g.iter().sum();
    let near = |d: i64| (d as f64 - batch_out as f64).abs() <= margin * batch_out as f64;
    let ok = g.len() >= 3 && near(min) && near(max);
    Judgement::new(
        ok,
        format!(
            "live bytes after each optimizer step grow by {min}..{max} bytes per step over {} \
             steps; one batch of outputs is {batch_out} bytes (each step within +/- {:.0}%)",
            g.len(),
            margin * 100.0
        ),
        vec![
            Figure::bytes("one batch of outputs", batch_out),
            Figure::delta("smallest growth per step", min),
            Figure::delta("largest growth per step", max),
            Figure::delta("growth over the run", total),
        ],
    )
}

/// Whether live memory after the optimizer steps grows by at most `limit` bytes per step
/// (skipping the first step, which creates the lists).
fn at_most_per_step(t: &Timeline, what: &str, limit: f64, batch_out: u64) -> Judgement {
    let g = growth_per_step(t);
    let later = g.get(1..).unwrap_or(&[]);
    let max = later.iter().copied().max().unwrap_or(0);
    let total: i64 = later.iter().sum();
    let ok = later.len() >= 2 && (max as f64) <= limit;
    Judgement::new(
        ok,
        format!(
            "{what}: live bytes after the optimizer steps grow by at most {max} bytes per step \
             (limit {limit:.0} bytes, a small fraction of the {batch_out}-byte batch of outputs)"
        ),
        vec![
            Figure::bytes("one batch of outputs", batch_out),
            Figure::delta("largest growth per step", max),
            Figure::delta("growth from step 2 to the end", total),
        ],
    )
}

/// Runs the scenario.
pub fn run(ctx: &mut Ctx) -> Result<()> {
    let plan = ctx.plan("logging-growth")?;
    let batch_out = output_batch_bytes(&plan)?;
    let base = ctx.run("loss and outputs kept as tensors", &plan)?;
    ctx.check(
        base,
        VerdictKind::Pattern,
        "memory grows by one batch of outputs per step",
        |t| grows_by_one_batch(t, batch_out, 0.05),
    );

    let mut loss_only = plan.clone();
    loss_only.metrics.keep_outputs = false;
    let l = ctx.run("loss tensors only", &loss_only)?;
    ctx.check(
        l,
        VerdictKind::Pattern,
        "the loss tensors alone cost almost nothing: the outputs are what grow",
        |t| at_most_per_step(t, "loss tensors only", 0.05 * batch_out as f64, batch_out),
    );

    let mut scalars = plan.clone();
    scalars.metrics.retention = MetricRetention::Scalars;
    scalars.metrics.keep_outputs = false;
    let s = ctx.run("scalars, no outputs (knob)", &scalars)?;
    ctx.compare(
        base,
        s,
        VerdictKind::Knob,
        "retention = \"scalars\", keep_outputs = false: memory is flat",
        |a, b| {
            let mut j = at_most_per_step(b, "scalars", 0.01 * batch_out as f64, batch_out);
            let grown: i64 = growth_per_step(a).iter().sum();
            j.ok = j.ok && grown as f64 >= batch_out as f64;
            j.detail = format!(
                "{}; against {grown} bytes of growth with tensors kept",
                j.detail
            );
            j.figures.push(Figure::delta("growth, tensors kept", grown));
            j
        },
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checks::testing::{sample, timeline as of};
    use trainmem_core::Category;
    use trainmem_core::timeline::{Phase, Source};

    fn timeline(per_step: &[u64]) -> Timeline {
        of(
            Source::Simulated,
            per_step.iter().enumerate().map(|(step, &b)| {
                sample(
                    Phase::OptimizerStep,
                    step as u64,
                    0,
                    &[(Category::Activation, b)],
                )
            }),
        )
    }

    #[test]
    fn growth_rules_tell_linear_from_flat() {
        let linear = timeline(&[100, 200, 301, 400, 500]);
        assert_eq!(growth_per_step(&linear), vec![100, 101, 99, 100]);
        assert!(grows_by_one_batch(&linear, 100, 0.05).ok);
        assert!(!grows_by_one_batch(&linear, 200, 0.05).ok);
        assert!(!at_most_per_step(&linear, "x", 5.0, 100).ok);
        let flat = timeline(&[100, 104, 104, 105, 105]);
        assert!(at_most_per_step(&flat, "x", 5.0, 100).ok);
        assert!(!grows_by_one_batch(&flat, 100, 0.05).ok);
    }
}
