//! `grad-checkpointing`: with burn's balanced checkpointing the forward pass keeps fewer
//! activation bytes for backward (the element-wise activations' outputs are recomputed in
//! backward instead of saved); without checkpointing they are all held.

use trainmem_core::Category;
use trainmem_core::Plan;
use trainmem_core::model::ModelSpec;
use trainmem_core::plan::CheckpointPolicyKind;
use trainmem_core::timeline::{Phase, Timeline};

use crate::checks::{bytes_at, index_of, param_bytes, points};
use crate::ctx::{Ctx, Judgement};
use crate::error::Result;
use crate::report::{Figure, VerdictKind};

/// Which bytes cause the pattern and what removes it.
pub const EXPLANATION: &[&str] = &[
    "Without checkpointing, burn's autodiff saves for backward both the input of every matrix \
     product and the input of every element-wise activation (GELU here), so each hidden layer \
     keeps two hidden-sized tensors from forward until backward. With checkpointing (any policy \
     other than `none` becomes burn's `BalancedCheckpointing` in a measured run) operations \
     marked memory-bound, the element-wise ones, are not kept: their outputs are recomputed in \
     backward from the tensor before them, while compute-bound ones (matrix products) keep \
     their inputs. Each hidden layer then keeps one hidden-sized tensor instead of two: the \
     activation bytes after forward drop by one batch x hidden tensor per activation, paid for \
     with the recomputation in backward.",
    "Knob: `checkpointing.policy = \"none\"` keeps everything again. Gradients, parameters and \
     the level after the optimizer step do not depend on the policy; only what the forward pass \
     holds does.",
];

/// Bytes burn's balanced checkpointing stops saving: one batch x width tensor per hidden layer
/// (the element-wise activation's output, recomputed in backward).
fn recomputed_bytes(plan: &Plan) -> Result<u64> {
    let ModelSpec::Mlp(mlp) = &plan.model else {
        unsuited!("grad-checkpointing expects an MLP plan (its hidden widths size the saving)");
    };
    let per_sample: u64 = mlp.hidden.iter().sum();
    Ok(plan.micro_batch_size() * per_sample * plan.precision.compute.size())
}

/// Activation bytes after the forward pass of the second step (the first step's when the run
/// has only one).
fn activation_after_forward(t: &Timeline) -> Option<u64> {
    let i =
        index_of(t, 1, Phase::Forward).or_else(|| points(t, Phase::Forward).first().copied())?;
    Some(bytes_at(t, i, Some(Category::Activation)))
}

/// Live bytes after the last optimizer step.
fn after_step(t: &Timeline) -> u64 {
    points(t, Phase::OptimizerStep)
        .last()
        .map(|&i| bytes_at(t, i, None))
        .unwrap_or(0)
}

/// Whether checkpointing (`ckpt`) keeps `expected` fewer activation bytes after forward than
/// no checkpointing (`none`), within `margin`.
fn drop_matches(none: &Timeline, ckpt: &Timeline, expected: u64, margin: f64) -> Judgement {
    let (Some(a), Some(b)) = (
        activation_after_forward(none),
        activation_after_forward(ckpt),
    ) else {
        return Judgement::new(false, "no forward sample", vec![]);
    };
    let drop = a as i64 - b as i64;
    let ratio = drop as f64 / expected.max(1) as f64;
    let ok = expected > 0 && (ratio - 1.0).abs() <= margin;
    Judgement::new(
        ok,
        format!(
            "activation bytes after forward: {a} without checkpointing, {b} with (-{:.0}%); the \
             drop of {drop} bytes is {ratio:.3} x the {expected} bytes of element-wise outputs \
             (batch x hidden widths; expected 1 +/- {margin})",
            100.0 * drop as f64 / a.max(1) as f64
        ),
        vec![
            Figure::bytes("activation, no checkpointing", a),
            Figure::bytes("activation, checkpointing", b),
            Figure::delta("drop", drop),
            Figure::bytes("element-wise outputs (batch x hidden)", expected),
            Figure::ratio("drop / element-wise outputs", ratio),
        ],
    )
}

/// Runs the scenario.
pub fn run(ctx: &mut Ctx) -> Result<()> {
    let plan = ctx.plan("grad-checkpointing")?;
    let expected = recomputed_bytes(&plan)?;
    let policy = format!("{:?}", plan.checkpointing.policy).to_lowercase();
    let ckpt = ctx.run(&format!("checkpointing ({policy}; burn: balanced)"), &plan)?;
    let mut off = plan.clone();
    off.checkpointing.policy = CheckpointPolicyKind::None;
    let none = ctx.run("no checkpointing (knob)", &off)?;

    ctx.compare(
        none,
        ckpt,
        VerdictKind::Pattern,
        "checkpointing drops one batch x hidden tensor per element-wise activation after forward",
        move |a, b| drop_matches(a, b, expected, 0.1),
    );
    ctx.compare(
        ckpt,
        none,
        VerdictKind::Knob,
        "policy = \"none\": the activations are held again; the rest is unchanged",
        move |c, n| {
            let (Some(ac), Some(an)) = (activation_after_forward(c), activation_after_forward(n))
            else {
                return Judgement::new(false, "no forward sample", vec![]);
            };
            let (sc, sn) = (after_step(c), after_step(n));
            let params = param_bytes(n);
            let back = an as f64 >= ac as f64 + 0.5 * expected as f64;
            let same = (sc as f64 - sn as f64).abs() <= 0.01 * params as f64;
            Judgement::new(
                back && same,
                format!(
                    "without checkpointing {an} activation bytes after forward against {ac} \
                     (at least half the {expected} element-wise bytes more); live bytes after \
                     the last optimizer step {sn} against {sc} (equal within 1% of the \
                     parameter bytes)"
                ),
                vec![
                    Figure::bytes("activation, no checkpointing", an),
                    Figure::bytes("activation, checkpointing", ac),
                    Figure::bytes("after the step, no checkpointing", sn),
                    Figure::bytes("after the step, checkpointing", sc),
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

    fn timeline(activation: u64) -> Timeline {
        of(
            Source::Simulated,
            (0..2).map(|step| {
                sample(
                    Phase::Forward,
                    step,
                    0,
                    &[(Category::Activation, activation + step)],
                )
            }),
        )
    }

    #[test]
    fn the_drop_is_read_at_the_second_forward_and_judged_against_the_expected_bytes() {
        let none = timeline(1000);
        assert_eq!(activation_after_forward(&none), Some(1001));
        assert!(drop_matches(&none, &timeline(600), 400, 0.1).ok);
        assert!(!drop_matches(&none, &timeline(400), 400, 0.1).ok);
        assert!(!drop_matches(&none, &none, 400, 0.1).ok);
    }

    #[test]
    fn the_saving_is_one_hidden_tensor_per_hidden_layer() {
        let mut plan = crate::plans::load("grad-checkpointing").expect("plan");
        plan.model = ModelSpec::Mlp(trainmem_core::model::MlpSpec {
            input: 8,
            hidden: vec![16, 32],
            output: 4,
            activation: Default::default(),
            dropout: 0.0,
            bias: true,
            loss: trainmem_core::model::Loss::Mse,
        });
        plan.training.batch_size = 2;
        plan.training.micro_batch_size = None;
        assert_eq!(recomputed_bytes(&plan).expect("mlp"), 2 * 48 * 4);
    }
}
