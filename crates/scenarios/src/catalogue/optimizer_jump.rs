//! `optimizer-jump`: the optimizer's state appears at the first step — +2× the parameter bytes
//! for Adam, +1× for momentum, nothing for SGD — and stays flat afterwards.

use trainmem_core::Category;
use trainmem_core::plan::OptimizerKind;
use trainmem_core::timeline::{Phase, Timeline};

use crate::checks::{bytes_at, index_of, series_at, spread};
use crate::ctx::{Ctx, Judgement};
use crate::error::Result;
use crate::report::{Figure, VerdictKind};

/// Which bytes cause the pattern and what removes it.
pub const EXPLANATION: &[&str] = &[
    "burn-optim creates an optimizer's state lazily, inside the first `step`: Adam and AdamW \
     allocate two moments per parameter (first and second), so live memory jumps by twice the \
     parameter bytes at step 1; SGD with momentum keeps one velocity per parameter (+1x); plain \
     SGD keeps nothing. After the first step the state is updated, not re-created, so memory is \
     flat from step to step.",
    "Knob: a stateless optimizer (SGD) removes the jump; momentum halves it. With a fixed memory \
     budget, plan for parameters x (1 + 1 gradient + 2 Adam moments) before the first step, not \
     after it.",
];

/// Live bytes after the first optimizer step minus after model construction, over parameter
/// bytes.
fn jump_ratio(t: &Timeline) -> Option<(i64, u64, f64)> {
    let init = index_of(t, 0, Phase::ModelInit)?;
    let step = index_of(t, 0, Phase::OptimizerStep)?;
    let params = bytes_at(t, init, Some(Category::Parameter));
    let jump = bytes_at(t, step, None) as i64 - bytes_at(t, init, None) as i64;
    Some((jump, params, jump as f64 / params.max(1) as f64))
}

fn expect_jump(t: &Timeline, kind: &str, expected: f64) -> Judgement {
    let Some((jump, params, ratio)) = jump_ratio(t) else {
        return Judgement::new(
            false,
            "no model_init or first optimizer_step sample",
            vec![],
        );
    };
    let after = series_at(t, Phase::OptimizerStep, None);
    let later = after.get(1..).unwrap_or(&[]);
    let flat = spread(later);
    let ok = (ratio - expected).abs() <= 0.05 && (flat as f64) <= 0.01 * params as f64;
    Judgement::new(
        ok,
        format!(
            "{kind}: live bytes after the first step minus after construction = {ratio:.3} x \
             parameter bytes (expected {expected} +/- 0.05); after later steps they vary by \
             {flat} bytes (at most 1% of the parameter bytes)"
        ),
        vec![
            Figure::bytes("parameter bytes", params),
            Figure::delta("jump at the first step", jump),
            Figure::ratio("jump / parameter bytes", ratio),
            Figure::bytes("spread over later steps", flat),
        ],
    )
}

/// Runs the scenario.
pub fn run(ctx: &mut Ctx) -> Result<()> {
    let adam = ctx.plan("optimizer-jump")?;
    let base = ctx.run("adam", &adam)?;
    ctx.check(
        base,
        VerdictKind::Pattern,
        "Adam: +2x parameter bytes at the first step, flat afterwards",
        |t| expect_jump(t, "adam", 2.0),
    );
    let mut momentum = adam.clone();
    momentum.optimizer.kind = OptimizerKind::Momentum;
    let m = ctx.run("momentum", &momentum)?;
    ctx.check(
        m,
        VerdictKind::Pattern,
        "momentum: +1x parameter bytes at the first step",
        |t| expect_jump(t, "momentum", 1.0),
    );
    let mut sgd = adam.clone();
    sgd.optimizer.kind = OptimizerKind::Sgd;
    let s = ctx.run("sgd (knob)", &sgd)?;
    ctx.compare(
        base,
        s,
        VerdictKind::Knob,
        "a stateless optimizer (SGD) removes the jump",
        |a, b| {
            let (Some((ja, params, _)), Some((jb, _, rb))) = (jump_ratio(a), jump_ratio(b)) else {
                return Judgement::new(false, "missing samples", vec![]);
            };
            Judgement::new(
                rb.abs() <= 0.05,
                format!(
                    "first-step jump with SGD is {rb:.3} x parameter bytes (at most 0.05), against \
                     {ja} bytes with Adam"
                ),
                vec![
                    Figure::bytes("parameter bytes", params),
                    Figure::delta("jump with Adam", ja),
                    Figure::delta("jump with SGD", jb),
                ],
            )
        },
    );
    Ok(())
}
