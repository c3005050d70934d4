//! `mixed-precision`: training in bf16 (no f32 master copy) halves the parameter, gradient,
//! optimizer-state and activation bytes of the same plan in f32.

use trainmem_core::Category;
use trainmem_core::plan::Dtype;
use trainmem_core::timeline::{Phase, Timeline};

use crate::checks::{bytes_at, index_of, peak, points};
use crate::ctx::{Ctx, Judgement};
use crate::error::Result;
use crate::report::{Figure, VerdictKind};

/// Which bytes cause the pattern and what removes it.
pub const EXPLANATION: &[&str] = &[
    "Every tensor of a training step is sized by its element count times its dtype's width. \
     Casting the model to bf16 (2 bytes) stores the parameters in half the bytes; burn's \
     gradients take the parameters' dtype, Adam's two moments are built from the gradients and \
     so are bf16 too, and the forward pass computes (and saves for backward) bf16 activations. \
     Without an f32 master copy, parameters, gradients, optimizer state and activations all \
     halve against the same plan in f32. Only dtype-independent bytes (loader staging, \
     per-tensor bookkeeping) stay the same.",
    "Knob/contrast: the same plan with `precision.compute = \"f32\"` doubles those bytes. \
     Mixed precision with f32 master weights (the PyTorch AMP recipe) would keep an f32 copy \
     of every parameter and give back part of the saving; burn keeps no master copy, so this \
     plan trains purely in bf16.",
];

/// Allowed distance of a category's bf16/f32 ratio from 0.5: per-tensor bookkeeping (names,
/// shapes, records) does not halve and is well under 1% of these sizes.
const STATE_MARGIN: f64 = 0.03;
/// Activations also hold the loss scalar and per-op records: a little more room.
const ACTIVATION_MARGIN: f64 = 0.05;

/// Where a category is read: the phase where it is fully live, at the second step (after the
/// first step's lazy state exists), falling back to the last sample of the phase.
fn sample_for(t: &Timeline, phase: Phase) -> Option<usize> {
    if phase == Phase::ModelInit {
        return index_of(t, 0, phase);
    }
    index_of(t, 1, phase).or_else(|| points(t, phase).last().copied())
}

/// The bf16/f32 ratio of `category` at `phase`.
fn halves(
    half: &Timeline,
    full: &Timeline,
    category: Category,
    phase: Phase,
    margin: f64,
) -> Judgement {
    let (Some(ih), Some(if_)) = (sample_for(half, phase), sample_for(full, phase)) else {
        return Judgement::new(false, format!("no {} sample", phase.name()), vec![]);
    };
    let h = bytes_at(half, ih, Some(category));
    let f = bytes_at(full, if_, Some(category));
    let ratio = h as f64 / f.max(1) as f64;
    let ok = f > 0 && (ratio - 0.5).abs() <= margin;
    Judgement::new(
        ok,
        format!(
            "`{}` after {}: {h} bytes in bf16 against {f} in f32 = {ratio:.3} (expected 0.5 +/- \
             {margin})",
            category.name(),
            phase.name()
        ),
        vec![
            Figure::bytes("bf16", h),
            Figure::bytes("f32", f),
            Figure::ratio("bf16 / f32", ratio),
        ],
    )
}

/// Whether the measured runs' backend can train in `dtype` (true where that cannot be asked
/// without starting a device: the run then says so itself).
fn trainable_in(ctx: &Ctx, dtype: Dtype) -> bool {
    trainmem_burn::supports_dtype(ctx.backend, dtype).unwrap_or(true)
}

/// Runs the scenario.
pub fn run(ctx: &mut Ctx) -> Result<()> {
    let mut plan = ctx.plan("mixed-precision")?;
    if ctx.mode.measured() && !trainable_in(ctx, plan.precision.compute) {
        for other in [Dtype::Bf16, Dtype::F16] {
            if other != plan.precision.compute && trainable_in(ctx, other) {
                ctx.note(format!(
                    "burn's {} backend here has no {}: the scenario trains in {other}, the other \
                     2-byte float, whose bytes per element (and so every verdict) are the same",
                    ctx.backend, plan.precision.compute
                ));
                plan.precision.compute = other;
                break;
            }
        }
    }
    let half_name = plan.precision.compute.to_string();
    let half = ctx.run(&format!("{half_name}, no master weights"), &plan)?;
    let mut f32_plan = plan.clone();
    f32_plan.precision.compute = Dtype::F32;
    let full = ctx.run("f32 (knob)", &f32_plan)?;

    for (category, phase, margin) in [
        (Category::Parameter, Phase::ModelInit, STATE_MARGIN),
        (Category::Gradient, Phase::Backward, STATE_MARGIN),
        (Category::OptimizerState, Phase::OptimizerStep, STATE_MARGIN),
        (Category::Activation, Phase::Forward, ACTIVATION_MARGIN),
    ] {
        ctx.compare(
            half,
            full,
            VerdictKind::Pattern,
            &format!("{half_name} halves `{}` bytes", category.name()),
            move |h, f| halves(h, f, category, phase, margin),
        );
    }

    ctx.compare(
        half,
        full,
        VerdictKind::Knob,
        "f32 doubles the peak live bytes",
        |h, f| {
            let ((ph, ih), (pf, i_f)) = (peak(h, None), peak(f, None));
            let ratio = pf as f64 / ph.max(1) as f64;
            // Everything at the peak halves except dtype-independent bytes (input staging,
            // bookkeeping): at most 10% of the f32 peak here, so the ratio is 1.8..2.
            let ok = (1.8..=2.02).contains(&ratio);
            Judgement::new(
                ok,
                format!(
                    "peak live bytes {pf} in f32 ({}) against {ph} in bf16 ({}) = {ratio:.3} x \
                     (expected 1.8..2.02)",
                    crate::checks::place(&f.samples[i_f]),
                    crate::checks::place(&h.samples[ih]),
                ),
                vec![
                    Figure::bytes("peak, bf16", ph),
                    Figure::bytes("peak, f32", pf),
                    Figure::ratio("f32 / bf16", ratio),
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

    fn timeline(params: u64) -> Timeline {
        of(
            Source::Simulated,
            [sample(
                Phase::ModelInit,
                0,
                0,
                &[(Category::Parameter, params)],
            )],
        )
    }

    #[test]
    fn halving_is_judged_against_the_f32_run() {
        let full = timeline(1000);
        let j = |h| {
            halves(
                &timeline(h),
                &full,
                Category::Parameter,
                Phase::ModelInit,
                0.03,
            )
            .ok
        };
        assert!(j(500) && j(520));
        assert!(!j(1000) && !j(400));
        assert!(!halves(&full, &full, Category::Gradient, Phase::Backward, 0.03).ok);
    }
}
