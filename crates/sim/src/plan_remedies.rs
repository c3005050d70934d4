//! What would make a plan fit its device: the plan's own knobs, changed one at a time and all
//! together, each change simulated.
//!
//! A plan that runs out of memory (or comes close) is answered with the changes a user would
//! try, in the plan's own keys, each with the peak it would reach: activation checkpointing, a
//! fused attention kernel in place of eager attention, a smaller micro-batch with gradient
//! accumulation (the batch the optimizer sees kept), 8-bit AdamW, autocast in place of f32,
//! and the caching allocator's expandable segments. A change that does not apply to the plan
//! (no layers to checkpoint, attention already fused, a framework without the option) is not
//! listed. Every figure is a simulation of the changed plan over [`fit`](mod@crate::fit)'s probe
//! steps, at the plan's capacity (does it fit) and, when it does not, without a limit (how
//! much it needs).

use serde::Serialize;

use crate::SimError;
use crate::engine::{SimOptions, simulate};
use crate::fit::{probe_steps, shortened};
use crate::machine::Machine;
use trainmem_core::dtype::Dtype;
use trainmem_core::framework::Framework;
use trainmem_core::model::{AttentionImpl, ModelSpec};
use trainmem_core::optimizer::{OptimizerKind, StepImpl};
use trainmem_core::plan::{CheckpointPolicyKind, DeviceKind, Plan};
use trainmem_core::timeline::Phase;

/// A capacity no plan reaches: the peak a plan needs when nothing stops it.
const UNLIMITED: u64 = 1 << 60;

/// A plan's peak reserved bytes as a share of its capacity above which the remedies are worth
/// showing although it fits: the caching allocator's cache and a longer run can take the rest.
pub const CLOSE_TO_CAPACITY: f64 = 0.9;

/// What a plan needs: its peaks at its capacity, or without a limit when it does not fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Need {
    /// Whether the plan runs without running out of memory at its capacity.
    pub fits: bool,
    /// Peak allocated bytes (the tensors in the allocator's blocks): what must fit at once,
    /// the same at any capacity the plan fits in.
    pub peak_allocated: u64,
    /// Peak reserved bytes at the capacity when it fits; without a limit when it does not
    /// (then the cache an allocator under pressure would free is counted too).
    pub peak_reserved: u64,
}

/// One change to the plan and what it would need.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlanRemedy {
    /// The change in the plan's own keys, e.g. `checkpointing.policy = "sqrt"`.
    pub change: String,
    /// Why it saves memory, in a few words.
    pub why: String,
    /// What the changed plan needs.
    pub need: Need,
}

/// The remedies of a plan, beside what the plan itself needs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlanRemedies {
    /// The capacity judged against (the plan's).
    pub capacity: u64,
    /// What the plan as written needs.
    pub plan: Need,
    /// The model's parameters (and what is made with them) exceed the device before the
    /// first step: none of the knobs below is tried (they change what a step holds).
    pub model_state_exceeds: bool,
    /// Each applicable change alone, in the order a user would try them, the micro-batch,
    /// then the changes that each need less than the plan together, at the largest
    /// micro-batch that fits with them when the plan's own does not.
    pub remedies: Vec<PlanRemedy>,
}

impl PlanRemedies {
    /// Whether they are worth showing: the plan does not fit, or its peak is close to the
    /// capacity ([`CLOSE_TO_CAPACITY`]).
    pub fn worth_showing(&self) -> bool {
        !self.plan.fits || close_to_capacity(self.plan.peak_reserved, self.capacity)
    }
}

/// Whether `peak_reserved` is above [`CLOSE_TO_CAPACITY`] of `capacity`.
pub fn close_to_capacity(peak_reserved: u64, capacity: u64) -> bool {
    peak_reserved as f64 > CLOSE_TO_CAPACITY * capacity as f64
}

/// What `plan` needs on `machine`: its probe (the steps `fit` simulates) at its capacity and,
/// when that runs out of memory, without a limit.
pub fn need(plan: &Plan, machine: Machine) -> Result<Need, SimError> {
    let (n, _) = probe_at(plan, plan.device.capacity.0, machine)?;
    if n.fits {
        return Ok(n);
    }
    Ok(Need {
        fits: false,
        ..probe_at(plan, UNLIMITED, machine)?.0
    })
}

/// `fit`'s probe of the plan as written (its batch and accumulation, a few steps) at
/// `capacity`: what it needs, and the phase it ran out of memory in, if it did.
fn probe_at(
    plan: &Plan,
    capacity: u64,
    machine: Machine,
) -> Result<(Need, Option<Phase>), SimError> {
    let p = shortened(plan, probe_steps(plan), capacity);
    let opts = SimOptions {
        machine,
        ..SimOptions::default()
    };
    let r = simulate(&p, opts)?;
    let need = Need {
        fits: r.summary.oom.is_none(),
        peak_allocated: r.summary.peak_allocated,
        peak_reserved: r.summary.peak_reserved,
    };
    Ok((need, r.summary.oom.map(|o| o.when.phase)))
}

/// How a change is made to a plan.
type Apply = fn(&mut Plan);

/// One change: its words, why it helps, and the plan changed.
struct Change {
    change: String,
    why: String,
    apply: Apply,
}

/// The single-knob changes that apply to `plan`, in the order a user would try them.
fn changes(plan: &Plan) -> Vec<Change> {
    let mut out = Vec::new();
    let pytorch = plan.framework == Framework::Pytorch;
    let gpu = plan.device.kind == DeviceKind::Cuda;
    if plan.checkpointing.policy == CheckpointPolicyKind::None {
        // transformers checkpoints every decoder layer (`gradient_checkpointing_enable()`,
        // what `plan from-hf --checkpointing` writes); elsewhere √n segments of layers
        let hf = pytorch && matches!(plan.model, ModelSpec::Transformer(_));
        out.push(if hf {
            Change {
                change: "checkpointing.policy = \"every\" (every = 1)".into(),
                why: "transformers' gradient checkpointing keeps each layer's input and \
                      recomputes the layer in backward"
                    .into(),
                apply: |p| {
                    p.checkpointing.policy = CheckpointPolicyKind::Every;
                    p.checkpointing.every = Some(1);
                    p.checkpointing.budget = None;
                },
            }
        } else {
            Change {
                change: "checkpointing.policy = \"sqrt\"".into(),
                why: "keeps about √n layers' activations and recomputes the rest in backward"
                    .into(),
                apply: |p| {
                    p.checkpointing.policy = CheckpointPolicyKind::Sqrt;
                    p.checkpointing.every = None;
                    p.checkpointing.budget = None;
                },
            }
        });
    }
    if let ModelSpec::Transformer(t) = &plan.model
        && gpu
        && t.attention == AttentionImpl::Eager
    {
        // SDPA's kernels cannot soft-cap the scores; flash-attn's can
        if t.attn_softcap.is_some() {
            out.push(Change {
                change: "model.transformer.attention = \"flash_attention_2\"".into(),
                why: "a fused kernel keeps one statistic per row, not the heads × seq × seq \
                      probabilities; flash-attn soft-caps the scores, SDPA cannot"
                    .into(),
                apply: |p| set_attention(p, AttentionImpl::FlashAttention2),
            });
        } else {
            out.push(Change {
                change: "model.transformer.attention = \"sdpa\"".into(),
                why: "a fused kernel keeps one statistic per row, not the heads × seq × seq \
                      probabilities"
                    .into(),
                apply: |p| set_attention(p, AttentionImpl::Sdpa),
            });
        }
    }
    if pytorch && gpu && plan.precision.compute == Dtype::F32 && plan.precision.autocast.is_none() {
        out.push(Change {
            change: "precision.autocast = \"bf16\"".into(),
            why: "torch.autocast keeps most activations in two bytes instead of four".into(),
            apply: |p| p.precision.autocast = Some(Dtype::Bf16),
        });
    }
    if pytorch
        && matches!(
            plan.optimizer.kind,
            OptimizerKind::Adam | OptimizerKind::AdamW
        )
    {
        out.push(Change {
            change: if gpu {
                "optimizer.kind = \"adamw8bit\" (implementation = \"fused\", state_dtype = \"f32\")"
            } else {
                "optimizer.kind = \"adamw8bit\" (implementation = \"for_loop\", state_dtype = \"f32\")"
            }
            .into(),
            why: format!(
                "bitsandbytes keeps both moments in one byte per element instead of {}",
                match plan.optimizer.state_dtype.size() {
                    2 => "two",
                    8 => "eight",
                    _ => "four",
                }
            ),
            apply: |p| {
                p.optimizer.kind = OptimizerKind::AdamW8bit;
                // its CUDA kernel on a GPU, its CPU kernel on the host; its own state dtypes
                p.optimizer.implementation = if p.device.kind == DeviceKind::Cuda {
                    StepImpl::Fused
                } else {
                    StepImpl::ForLoop
                };
                p.optimizer.state_dtype = Dtype::F32;
            },
        });
    }
    if pytorch && gpu && !plan.device.allocator.contains("expandable_segments:True") {
        let mut changed = plan.clone();
        with_expandable_segments(&mut changed);
        out.push(Change {
            // the whole setting, the plan's own options kept
            change: format!("device.allocator = \"{}\"", changed.device.allocator),
            why: "segments grow in place, so the cache holds no blocks too small to reuse".into(),
            apply: with_expandable_segments,
        });
    }
    out
}

/// The plan's allocator settings with `expandable_segments:True` added.
fn with_expandable_segments(p: &mut Plan) {
    p.device.allocator = if p.device.allocator.trim().is_empty() {
        "expandable_segments:True".into()
    } else {
        format!("{},expandable_segments:True", p.device.allocator)
    }
}

fn set_attention(p: &mut Plan, attention: AttentionImpl) {
    if let ModelSpec::Transformer(t) = &mut p.model {
        t.attention = attention;
    }
}

/// The remedies of `plan` on `machine`; `on_probe` is told each change as it is simulated.
pub fn plan_remedies(
    plan: &Plan,
    machine: Machine,
    on_probe: &mut dyn FnMut(&str),
) -> Result<PlanRemedies, SimError> {
    on_probe("the plan as written");
    let (first, phase) = probe_at(plan, plan.device.capacity.0, machine)?;
    if phase == Some(Phase::ModelInit) {
        // the model's own state exceeds the device before the first step: no knob of a
        // step helps, and the plan is not simulated again without a limit
        return Ok(PlanRemedies {
            capacity: plan.device.capacity.0,
            plan: first,
            model_state_exceeds: true,
            remedies: Vec::new(),
        });
    }
    let base = if first.fits {
        first
    } else {
        // it ran out of memory at its capacity already: only the run without a limit is new
        Need {
            fits: false,
            ..probe_at(plan, UNLIMITED, machine)?.0
        }
    };
    let mut remedies = Vec::new();
    let mut helped: Vec<(String, Apply)> = Vec::new();
    for c in changes(plan) {
        let mut p = plan.clone();
        (c.apply)(&mut p);
        // a change the plan's own rules refuse (a model without layers to checkpoint, an
        // optimizer the framework lacks) is not a remedy for it
        if p.validate().is_err() {
            continue;
        }
        on_probe(&c.change);
        let need = need(&p, machine)?;
        // a change that saves under 1% of the plan's peak is not worth its dependency or
        // its cost in the changes made together
        if need.peak_allocated + base.peak_allocated / 100 < base.peak_allocated {
            // the setting without its notes: `optimizer.kind = "adamw8bit" (implementation =
            // ...)` -> `optimizer.kind = "adamw8bit"`
            let key = c.change.split(" (").next().unwrap_or(&c.change).to_string();
            helped.push((key, c.apply));
        }
        remedies.push(PlanRemedy {
            change: c.change,
            why: c.why,
            need,
        });
    }
    if let Some((_, r)) = smaller_micro_batch(plan, machine, on_probe)? {
        remedies.push(r);
    }
    if !helped.is_empty() {
        // the changes that help, together, at the largest micro-batch that fits with them
        let mut p = plan.clone();
        for (_, apply) in &helped {
            apply(&mut p);
        }
        if p.validate().is_ok() {
            on_probe("the changes that help, together");
            let whole = need(&p, machine)?;
            let (change, need) = if whole.fits {
                (String::new(), whole)
            } else {
                match smaller_micro_batch(&p, machine, on_probe)? {
                    Some((m, r)) if r.need.peak_allocated < whole.peak_allocated => (
                        format!(", {}", micro_words(m, plan.training.batch_size)),
                        r.need,
                    ),
                    _ => (String::new(), whole),
                }
            };
            if helped.len() > 1 || !change.is_empty() {
                remedies.push(PlanRemedy {
                    change: format!(
                        "together: {}{change}",
                        helped
                            .iter()
                            .map(|(key, _)| key.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    why: "all at once".into(),
                    need,
                });
            }
        }
    }
    Ok(PlanRemedies {
        capacity: plan.device.capacity.0,
        plan: base,
        model_state_exceeds: false,
        remedies,
    })
}

/// `training.micro_batch_size = m` with the accumulation it implies.
fn micro_words(m: u64, batch: u64) -> String {
    format!(
        "training.micro_batch_size = {m} ({} micro-batches of {m} per step, batch {batch})",
        batch / m
    )
}

/// The largest micro-batch that divides the batch and fits, with accumulation keeping the
/// batch the optimizer sees; the smallest micro-batch with what it needs when none fits.
/// `None` when the micro-batch is already 1.
fn smaller_micro_batch(
    plan: &Plan,
    machine: Machine,
    on_probe: &mut dyn FnMut(&str),
) -> Result<Option<(u64, PlanRemedy)>, SimError> {
    let batch = plan.training.batch_size;
    let micro = plan.micro_batch_size();
    let candidates: Vec<u64> = (1..micro)
        .rev()
        .filter(|m| batch.is_multiple_of(*m))
        .collect();
    let Some(&smallest) = candidates.last() else {
        return Ok(None);
    };
    let why = "activations scale with the micro-batch; gradients add up over the micro-batches";
    for m in candidates {
        let p = plan.with_batch(batch, Some(m));
        if p.validate().is_err() {
            continue;
        }
        let change = micro_words(m, batch);
        on_probe(&change);
        let need = need(&p, machine)?;
        if need.fits || m == smallest {
            return Ok(Some((
                m,
                PlanRemedy {
                    change,
                    why: why.into(),
                    need,
                },
            )));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpt(capacity: &str, attention: &str) -> Plan {
        let text = format!(
            r#"
name = "gpt"
[model.transformer]
kind = "decoder"
layers = 12
hidden = 768
heads = 12
ffn = 3072
seq_len = 1024
vocab = 50257
attention = "{attention}"
[training]
batch_size = 8
steps_per_epoch = 3
[optimizer]
kind = "adamw"
[device]
capacity = "{capacity}"
"#
        );
        Plan::from_toml_str(&text).expect("a valid plan")
    }

    fn remedies(plan: &Plan) -> PlanRemedies {
        plan_remedies(plan, Machine::default(), &mut |_| {}).expect("simulates")
    }

    #[test]
    fn an_oom_plan_gets_each_knob_with_what_it_needs_and_checkpointing_fits() {
        let plan = gpt("12GiB", "eager");
        let r = remedies(&plan);
        assert!(!r.plan.fits && r.worth_showing());
        assert!(r.plan.peak_allocated > r.capacity, "{r:?}");
        let change = |prefix: &str| {
            r.remedies
                .iter()
                .find(|x| x.change.starts_with(prefix))
                .unwrap_or_else(|| panic!("{prefix} in {r:#?}"))
        };
        for prefix in [
            "checkpointing.policy",
            "model.transformer.attention = \"sdpa\"",
            "precision.autocast",
            "optimizer.kind",
            "device.allocator",
            "training.micro_batch_size",
            "together",
        ] {
            let x = change(prefix);
            // what fits stays within the capacity, cache and all
            assert!(!x.need.fits || x.need.peak_reserved <= r.capacity, "{x:?}");
            assert!(x.need.peak_allocated <= x.need.peak_reserved, "{x:?}");
        }
        // the ones that cut activations need less than the plan (autocast need not: under
        // eager attention it keeps f32 probabilities beside half-precision copies)
        for prefix in [
            "checkpointing.policy",
            "model.transformer.attention",
            "training.micro_batch_size",
            "together",
        ] {
            let x = change(prefix);
            assert!(
                x.need.peak_allocated < r.plan.peak_allocated,
                "{x:?} vs {r:?}"
            );
        }
        assert!(change("checkpointing.policy").need.fits, "{r:#?}");
        // the ones that help, together, need less than any one alone
        let all = change("together").need.peak_allocated;
        for x in r.remedies.iter().filter(|x| {
            !x.change.starts_with("together") && x.need.peak_allocated < r.plan.peak_allocated
        }) {
            assert!(all <= x.need.peak_allocated, "{x:?} vs all {all}");
        }
    }

    #[test]
    fn the_micro_batch_found_is_the_largest_that_fits() {
        let plan = gpt("12GiB", "eager");
        let r = remedies(&plan);
        let x = r
            .remedies
            .iter()
            .find(|x| x.change.starts_with("training.micro_batch_size"))
            .expect("a micro-batch");
        let m: u64 = x.change["training.micro_batch_size = ".len()..]
            .split(' ')
            .next()
            .and_then(|s| s.parse().ok())
            .expect("a number");
        assert!(x.need.fits, "{x:?}");
        // the next larger divisor of 8 does not fit
        let larger = (m + 1..8).find(|d| 8u64.is_multiple_of(*d)).unwrap_or(8);
        let p = plan.with_batch(8, Some(larger));
        assert!(!need(&p, Machine::default()).expect("simulates").fits);
    }

    #[test]
    fn only_the_changes_that_apply_are_listed() {
        // attention already fused, checkpointing on, 8-bit state: none of those again
        let mut plan = gpt("12GiB", "sdpa");
        plan.checkpointing.policy = CheckpointPolicyKind::Sqrt;
        plan.optimizer.kind = OptimizerKind::AdamW8bit;
        let r = remedies(&plan);
        for x in &r.remedies {
            for refused in [
                "checkpointing",
                "model.transformer.attention",
                "optimizer.kind",
            ] {
                assert!(!x.change.starts_with(refused), "{x:?}");
            }
        }
        // burn has no autocast, 8-bit AdamW or PyTorch's allocator settings
        let mut burn = gpt("12GiB", "eager");
        burn.framework = Framework::Burn;
        let r = remedies(&burn);
        for x in &r.remedies {
            for refused in ["precision.autocast", "optimizer.kind", "device.allocator"] {
                assert!(!x.change.starts_with(refused), "{x:?}");
            }
        }
    }

    #[test]
    fn a_plan_with_room_to_spare_is_not_worth_remedies() {
        let r = remedies(&gpt("80GiB", "sdpa"));
        assert!(r.plan.fits && !r.worth_showing(), "{r:?}");
    }

    #[test]
    fn a_model_too_large_to_build_gets_no_step_knobs() {
        let r = remedies(&gpt("256MiB", "eager"));
        assert!(
            r.model_state_exceeds && !r.plan.fits && r.remedies.is_empty(),
            "{r:?}"
        );
        assert!(r.worth_showing());
    }
}
