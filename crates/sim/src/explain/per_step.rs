//! Patterns of every step: activations held from forward to backward, and memory that
//! stays flat from step to step or grows.

use trainmem_core::Category;

use super::Finding;
use super::PatternKind;
use crate::engine::Summary;
use crate::profile::FrameworkProfile;
use trainmem_core::bytes::{human, human_signed};
use trainmem_core::plan::{MetricRetention, Plan};
use trainmem_core::timeline::{Domain, Phase, Sample, Timeline};

fn at(t: &Timeline, step: u64, phase: Phase) -> Option<&Sample> {
    t.find(step, phase)
}

/// Activations held from forward until backward frees them (in the second step when there
/// is one), with what accumulation and checkpointing change.
pub(super) fn activation_retention(plan: &Plan, t: &Timeline, s: &Summary, out: &mut Vec<Finding>) {
    let dev = Domain::Device;
    let step = if t.find(1, Phase::Forward).is_some() {
        1
    } else {
        0
    };
    if let (Some(f), Some(b)) = (at(t, step, Phase::Forward), at(t, step, Phase::Backward)) {
        let a = f.device.categories.get(Category::Activation);
        let after = b.device.categories.get(Category::Activation);
        let mut text = format!(
            "Forward holds {} of activations (tensors saved for backward, micro-batch {}); backward frees them as it goes ({} left after backward) while gradients ({}) appear.",
            human(a),
            plan.micro_batch_size(),
            human(after),
            human(b.device.categories.get(Category::Gradient))
        );
        if plan.accumulation_steps() > 1 {
            text.push_str(&format!(
                " With {} micro-batches per step only one micro-batch's activations are alive at a time: activation memory follows the micro-batch ({}), not the effective batch ({}).",
                plan.accumulation_steps(),
                plan.micro_batch_size(),
                plan.training.batch_size
            ));
        }
        if let Some((k, r)) = s.checkpointing {
            let segments = if k == 1 {
                "each block its own segment".to_string()
            } else {
                format!("{k} blocks per segment")
            };
            let recomputed = if r == 1 { "block" } else { "blocks" };
            text.push_str(&format!(
                " Gradient checkpointing ({segments}, {r} {recomputed} recomputed) keeps only segment inputs and recomputes the rest during backward."
            ));
        }
        out.push(Finding {
            kind: PatternKind::ActivationRetention,
            domain: dev,
            bytes: a as i128,
            step: Some(step),
            text,
        });
    }
}

/// After the first step: allocated memory at each optimizer step either flat (a plateau) or
/// growing, with the cause and the remedy in the framework's words.
pub(super) fn plateau_or_growth(plan: &Plan, t: &Timeline, _s: &Summary, out: &mut Vec<Finding>) {
    let dev = Domain::Device;
    let profile = FrameworkProfile::for_plan(plan);
    let ends: Vec<(u64, u64)> = t
        .samples
        .iter()
        .filter(|x| x.phase == Phase::OptimizerStep)
        .map(|x| (x.step, x.device.allocated))
        .collect();
    if ends.len() >= 3 {
        let tail = &ends[1..];
        let n = tail.len() as f64;
        let (mx, my) = (
            tail.iter().map(|e| e.0 as f64).sum::<f64>() / n,
            tail.iter().map(|e| e.1 as f64).sum::<f64>() / n,
        );
        let cov: f64 = tail
            .iter()
            .map(|e| (e.0 as f64 - mx) * (e.1 as f64 - my))
            .sum();
        let var: f64 = tail.iter().map(|e| (e.0 as f64 - mx).powi(2)).sum();
        let slope = if var > 0.0 { cov / var } else { 0.0 };
        let rises = tail.windows(2).filter(|w| w[1].1 > w[0].1).count();
        let growing =
            tail.len() >= 3 && rises * 5 >= (tail.len() - 1) * 4 && slope * n > 0.005 * my;
        let (lo, hi) = (
            tail.iter().map(|e| e.1).min().unwrap_or(0),
            tail.iter().map(|e| e.1).max().unwrap_or(0),
        );
        if growing {
            let cause = if plan.leak.retain_outputs {
                if plan.leak.retain_graph && profile.kept_graph_is_separate_forward() {
                    "each step's output is kept with its graph, which is never backwarded, so every step's saved activations (and the weights they reference) stay alive with it".to_string()
                } else if plan.leak.retain_graph {
                    "each step's output is kept and backward ran with retain_graph, so every step's saved activations stay alive with it".to_string()
                } else {
                    "each step's output tensor is kept across steps".to_string()
                }
            } else if plan.metrics.retention == MetricRetention::Tensors {
                "per-step metric tensors (the loss and outputs) are kept on the device instead of as scalars".to_string()
            } else {
                "tensors kept across steps".to_string()
            };
            let mut text = format!(
                "Memory grows by {} per step: {cause}.",
                human_signed(slope.round() as i128)
            );
            if plan.leak.clear_every > 0 {
                text.push_str(&format!(
                    " Clearing them every {} steps drops it back (a sawtooth).",
                    plan.leak.clear_every
                ));
            } else {
                text.push_str(profile.vocabulary.stop_the_leak);
            }
            out.push(Finding {
                kind: PatternKind::GrowthPerStep,
                domain: dev,
                bytes: slope.round() as i128,
                step: None,
                text,
            });
        } else {
            out.push(Finding {
                kind: PatternKind::Plateau,
                domain: dev,
                bytes: my as i128,
                step: Some(1),
                text: format!(
                    "After the first step, memory per step is flat (a plateau at {} allocated after each optimizer step, varying by {} at most): every step allocates and frees the same tensors, and the caching allocator reuses its blocks.",
                    human(my as u64),
                    human(hi - lo)
                ),
            });
        }
    }
}
