//! `grad-accumulation`: with gradient accumulation the activation peak follows the
//! micro-batch, not the effective batch; the gradients are the same size either way.

use trainmem_core::Category;
use trainmem_core::timeline::Timeline;

use super::activation_retention::{act, passes};
use super::startup::model_parameter_bytes;
use crate::checks::{bytes_at, peak, spread};
use crate::ctx::{Ctx, Judgement};
use crate::error::Result;
use crate::report::{Figure, VerdictKind};

/// Which bytes cause the pattern and what removes it.
pub const EXPLANATION: &[&str] = &[
    "Activations are saved per sample and live from a forward pass to its backward pass. With \
     gradient accumulation a step runs forward and backward once per micro-batch, and each \
     backward frees its micro-batch's activations before the next forward starts, so at no \
     time are more than one micro-batch's activations alive: the activation peak is that of a \
     run whose batch is the micro-batch. The gradients are per parameter, not per sample: \
     burn-optim's `GradientsAccumulator` adds each micro-batch's gradients into one set, so \
     they cost the parameter bytes whatever the batch.",
    "Knob: the same effective batch in one go (micro-batch = batch) holds the activations of \
     the whole batch at once: batch / micro-batch times the peak. Accumulation trades that \
     memory for more, smaller passes (the optimizer still steps once per effective batch).",
];

/// The activation peak over the run's forward passes.
fn activation_peak(t: &Timeline) -> u64 {
    peak(t, Some(Category::Activation)).0
}

/// Gradient bytes after the last backward pass of the first step (the gradients the
/// optimizer receives).
fn step_gradients(t: &Timeline) -> u64 {
    passes(t)
        .iter()
        .rev()
        .find(|p| p.step == 0)
        .map(|p| bytes_at(t, p.backward, Some(Category::Gradient)))
        .unwrap_or(0)
}

/// In the accumulating run: every micro-batch's forward holds the same activations (no
/// growth across micro-batches), and the gradients stay one set of parameter-sized buffers.
fn one_micro_batch_at_a_time(t: &Timeline, micro_batches: u64, params: u64) -> Judgement {
    let ps = passes(t);
    let first_step: Vec<_> = ps.iter().filter(|p| p.step == 0).collect();
    let fwd: Vec<u64> = ps.iter().map(|p| act(t, p.forward)).collect();
    let grads: Vec<u64> = ps
        .iter()
        .map(|p| bytes_at(t, p.backward, Some(Category::Gradient)))
        .collect();
    let top = fwd.iter().copied().max().unwrap_or(0);
    let fwd_spread = spread(&fwd);
    let grad_max = grads.iter().copied().max().unwrap_or(0);
    let grad_min = grads.iter().copied().min().unwrap_or(0);
    let p = params as f64;
    let ok = first_step.len() as u64 == micro_batches
        && (fwd_spread as f64) <= 0.02 * top as f64
        && grad_min as f64 >= 0.98 * p
        && grad_max as f64 <= 1.05 * p;
    Judgement::new(
        ok,
        format!(
            "{} forward/backward passes per step ({micro_batches} expected); activations after \
             every micro-batch's forward vary by {fwd_spread} bytes (at most 2% of {top}: the \
             graphs do not pile up), and gradients after each backward stay within \
             {grad_min}..{grad_max} bytes (-2%..+5% of the {params} parameter bytes: one \
             accumulated set)",
            first_step.len()
        ),
        vec![
            Figure::count("passes in the first step", first_step.len() as u64),
            Figure::bytes("activations after forward, most", top),
            Figure::bytes("spread over micro-batches", fwd_spread),
            Figure::bytes("gradients after backward, least", grad_min),
            Figure::bytes("gradients after backward, most", grad_max),
        ],
    )
}

/// `a / b` as a float.
fn ratio(a: u64, b: u64) -> f64 {
    a as f64 / b.max(1) as f64
}

/// Runs the scenario.
pub fn run(ctx: &mut Ctx) -> Result<()> {
    let plan = ctx.plan("grad-accumulation")?;
    let params = model_parameter_bytes(&plan)?;
    let batch = plan.training.batch_size;
    let micro = plan.micro_batch_size();
    let m = plan.accumulation_steps();
    if m < 2 {
        unsuited!("the grad-accumulation plan must accumulate (micro-batch < batch)");
    }
    let acc = ctx.run(&format!("batch {batch} as {m} x {micro}"), &plan)?;
    ctx.check(
        acc,
        VerdictKind::Pattern,
        "one micro-batch's activations at a time; one set of gradients",
        |t| one_micro_batch_at_a_time(t, m, params),
    );

    let small = plan.with_batch(micro, None);
    let s = ctx.run(&format!("batch {micro} in one go"), &small)?;
    ctx.compare(
        acc,
        s,
        VerdictKind::Pattern,
        "the activation peak is the micro-batch's",
        |a, b| {
            let (pa, pb) = (activation_peak(a), activation_peak(b));
            let r = ratio(pa, pb);
            Judgement::new(
                (r - 1.0).abs() <= 0.05,
                format!(
                    "activation peak with {m} x {micro} accumulated: {pa} bytes; with batch \
                     {micro} in one go: {pb} bytes; ratio {r:.3} (1 +/- 0.05)"
                ),
                vec![
                    Figure::bytes("activation peak, accumulated", pa),
                    Figure::bytes("activation peak, micro-batch alone", pb),
                    Figure::ratio("accumulated / micro-batch alone", r),
                ],
            )
        },
    );

    let full = plan.with_batch(batch, None);
    let f = ctx.run(&format!("batch {batch} in one go (knob)"), &full)?;
    ctx.compare(
        acc,
        f,
        VerdictKind::Knob,
        "the whole batch in one go holds batch / micro-batch times the activations",
        |a, b| {
            let (pa, pb) = (activation_peak(a), activation_peak(b));
            let r = ratio(pb, pa);
            let want = m as f64;
            let (ga, gb) = (step_gradients(a), step_gradients(b));
            let gdiff = ga as i64 - gb as i64;
            let ok = (r - want).abs() <= 0.1 * want
                && (gdiff.unsigned_abs() as f64) <= 0.02 * params as f64;
            Judgement::new(
                ok,
                format!(
                    "activation peak with batch {batch} in one go is {r:.2} x the accumulated \
                     run's ({pb} vs {pa} bytes; expected {want} +/- 10%), while the gradients \
                     the optimizer receives differ by {gdiff} bytes ({ga} vs {gb}; at most 2% \
                     of the parameter bytes)"
                ),
                vec![
                    Figure::bytes("activation peak, accumulated", pa),
                    Figure::bytes("activation peak, whole batch", pb),
                    Figure::ratio("whole / accumulated", r),
                    Figure::bytes("gradients, accumulated", ga),
                    Figure::bytes("gradients, whole batch", gb),
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
    use trainmem_core::timeline::{Phase, Sample, Source};

    /// One step of `m` micro-batches: activations `fwd[i]` after each forward, gradients
    /// `grad[i]` after each backward.
    fn step(fwd: &[u64], grad: &[u64]) -> Timeline {
        let at = |phase, mb: usize, a: u64, g: u64| Sample {
            micro_batch: Some(mb as u32),
            ..sample(
                phase,
                0,
                0,
                &[(Category::Activation, a), (Category::Gradient, g)],
            )
        };
        let mut samples = Vec::new();
        for (i, (&a, &g)) in fwd.iter().zip(grad).enumerate() {
            let before = if i == 0 { 0 } else { grad[i - 1] };
            samples.push(at(Phase::BatchLoaded, i, 0, before));
            samples.push(at(Phase::Forward, i, a, before));
            samples.push(at(Phase::Backward, i, 0, g));
        }
        of(Source::Simulated, samples)
    }

    #[test]
    fn accumulation_rule_catches_piled_up_graphs_and_growing_gradients() {
        let good = step(&[1000, 1000, 1000, 1000], &[400, 400, 400, 400]);
        assert!(one_micro_batch_at_a_time(&good, 4, 400).ok);
        assert_eq!(step_gradients(&good), 400);
        assert_eq!(activation_peak(&good), 1000);
        let piled = step(&[1000, 2000, 3000, 4000], &[400, 400, 400, 400]);
        assert!(!one_micro_batch_at_a_time(&piled, 4, 400).ok);
        let grown = step(&[1000, 1000, 1000, 1000], &[400, 800, 1200, 1600]);
        assert!(!one_micro_batch_at_a_time(&grown, 4, 400).ok);
        assert!(
            !one_micro_batch_at_a_time(&good, 2, 400).ok,
            "wrong pass count"
        );
        assert_eq!(ratio(8, 2), 4.0);
        assert_eq!(ratio(3, 0), 3.0);
    }
}
