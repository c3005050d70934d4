//! Explanations: the memory patterns a simulated (or measured) timeline shows, each with its
//! size and its cause, in words.

use serde::{Deserialize, Serialize};
use trainmem_probe::Category;

use crate::bytes::{human, human_signed};
use crate::engine::Summary;
use crate::plan::{DataStorage, DeviceKind, MetricRetention, Plan};
use crate::profile::{FrameworkProfile, OptimizerRecords, ParamUpdate, StateDtype};
use crate::timeline::{Domain, Phase, Timeline};

/// The kind of a pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PatternKind {
    /// Memory taken before the first step (parameters, eager state, data set).
    Startup,
    /// A one-time jump (the optimizer state at the first step).
    Jump,
    /// Activations held from forward until backward.
    ActivationRetention,
    /// Memory returns to the same level every step.
    Plateau,
    /// Memory grows every step.
    GrowthPerStep,
    /// Host memory peaks at the start of each epoch.
    EpochSpike,
    /// A short spike while a checkpoint is written.
    CheckpointSpike,
    /// Reserved memory well above allocated (the allocator's cache).
    CacheOverhead,
    /// The run does not fit.
    OutOfMemory,
}

/// One pattern found, with its size and cause.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    /// The pattern.
    pub kind: PatternKind,
    /// Memory domain.
    pub domain: Domain,
    /// Size of the effect in bytes (signed: growth per step, jump, spike height).
    pub bytes: i128,
    /// Where it shows (step), if at one place.
    pub step: Option<u64>,
    /// The explanation.
    pub text: String,
}

/// What the `optimizer_state` bytes of the first optimizer step are under a framework that
/// keeps optimizer bookkeeping (see its [`FrameworkProfile`]): the optimizer's state proper,
/// the bookkeeping records, and parameters the step writes into new buffers
/// ([`ParamUpdate::WhenUniquelyOwned`]: allocated inside the step, so tagged
/// `optimizer_state`): every parameter under AdamW (its decoupled decay clones the tensor),
/// and the weights that graphs kept without backward still reference, whose old buffers stay
/// with those graphs.
fn first_step_breakdown_text(
    plan: &Plan,
    profile: &FrameworkProfile,
    records: OptimizerRecords,
    s: &Summary,
    b: u64,
    step: u64,
) -> String {
    use trainmem_optim::OptimizerKind;
    let kind = plan.optimizer.kind;
    let tensors = crate::lower::lower_for(&plan.model, plan.framework)
        .map(|p| p.params.len() as u64)
        .unwrap_or(0);
    let record_bytes = (records.bytes)(kind, tensors).min(b);
    // the first velocity may be the gradient itself (tagged `gradient`)
    let first_velocity_aliased = profile.optimizer.momentum_first_velocity_is_gradient
        && kind == OptimizerKind::Momentum
        && step == 0;
    let state = if first_velocity_aliased {
        0
    } else {
        s.model_state.optimizer_state.min(b - record_bytes)
    };
    let rewritten = b - record_bytes - state;
    let buffers = match kind {
        OptimizerKind::Sgd => 0,
        OptimizerKind::Momentum => 1,
        _ => 2 + plan.optimizer.amsgrad as u64,
    };
    let dtype = match profile.optimizer.state_dtype {
        StateDtype::Gradients => "the parameters' dtype".to_string(),
        StateDtype::Plan => plan.optimizer.state_dtype.to_string(),
    };
    let mut text = format!(
        "+{} under optimizer_state at the first optimizer step (step {step}): {} of {} state ({buffers} buffer(s) per parameter, in {dtype}), {} of {}",
        human(b),
        human(state),
        kind.name(),
        human(record_bytes),
        records.what,
    );
    if rewritten > 0 && profile.optimizer.param_update == ParamUpdate::WhenUniquelyOwned {
        let adamw = kind == OptimizerKind::AdamW;
        let kept = plan.leak.retain_outputs && plan.leak.retain_graph;
        let why = match (adamw, kept) {
            (true, true) => {
                "AdamW's decoupled decay clones every parameter, and the graphs kept without backward still reference the weights their matmuls saved, whose old buffers stay with those graphs"
            }
            (true, false) => {
                "AdamW's decoupled decay clones every parameter, so the step cannot update in place; the old buffers are freed"
            }
            (false, _) => {
                "re-allocated weights, not optimizer state: graphs kept without backward still reference the weights their matmuls saved, so the step cannot update those in place and the old buffers stay pinned by the kept graphs"
            }
        };
        text.push_str(&format!(
            ", and {} of parameters the step writes into new buffers: {why}",
            human(rewritten)
        ));
    }
    if first_velocity_aliased {
        text.push_str("; momentum's first velocity is the gradient tensor itself (still `gradient`), a velocity of its own appears at the second step");
    }
    text.push('.');
    text
}

fn at(t: &Timeline, step: u64, phase: Phase) -> Option<&crate::timeline::Sample> {
    t.find(step, phase)
}

/// Finds the patterns of a timeline produced from `plan`.
pub fn explain(plan: &Plan, t: &Timeline, s: &Summary) -> Vec<Finding> {
    let profile = FrameworkProfile::of(plan.framework);
    let mut out = Vec::new();
    let dev = Domain::Device;
    if let Some(init) = t.at_phase(Phase::ModelInit).next() {
        let c = init.device.categories;
        let p = c.get(Category::Parameter);
        let o = c.get(Category::OptimizerState);
        let mut text = format!(
            "{} of parameters exist before the first step ({} elements{}).",
            human(p),
            s.parameters,
            if plan.precision.compute.is_half() && plan.precision.master_weights {
                format!(", in {} plus f32 master weights", plan.precision.compute)
            } else {
                format!(" in {}", plan.precision.compute)
            }
        );
        if o > 0 {
            text.push_str(&format!(
                " The optimizer state ({}) is allocated eagerly, with the optimizer.",
                human(o)
            ));
        }
        if plan.data.storage == DataStorage::Preload {
            text.push_str(&format!(
                " The data set is preloaded into host memory: {} of anonymous RSS from the start.",
                human(init.host.categories.get(Category::Input))
            ));
        }
        out.push(Finding {
            kind: PatternKind::Startup,
            domain: dev,
            bytes: (p + o) as i128,
            step: None,
            text,
        });
    }
    // optimizer jump
    let first_state = t
        .samples
        .iter()
        .position(|x| x.device.categories.get(Category::OptimizerState) > 0);
    if let Some(i) = first_state {
        let x = &t.samples[i];
        if x.phase == Phase::OptimizerStep {
            let b = x.device.categories.get(Category::OptimizerState);
            let shard_elems = (s.model_state.parameters - s.model_state.master_weights)
                / plan.precision.compute.size().max(1);
            let per = shard_elems * plan.optimizer.state_dtype.size();
            let ratio = if per > 0 { b as f64 / per as f64 } else { 0.0 };
            if let Some(records) = profile.bookkeeping.optimizer_records {
                out.push(Finding {
                    kind: PatternKind::Jump,
                    domain: dev,
                    bytes: b as i128,
                    step: Some(x.step),
                    text: first_step_breakdown_text(plan, profile, records, s, b, x.step),
                });
            } else {
                out.push(Finding {
                kind: PatternKind::Jump,
                domain: dev,
                bytes: b as i128,
                step: Some(x.step),
                text: format!(
                    "+{} of optimizer state appears at the first optimizer step (step {}): {} keeps {} buffer(s) per parameter in {} ({:.2}× the parameter count in that dtype), created lazily on first use; it stays flat afterwards.",
                    human(b),
                    x.step,
                    plan.optimizer.kind.name(),
                    match plan.optimizer.kind {
                        trainmem_optim::OptimizerKind::Sgd => 0,
                        trainmem_optim::OptimizerKind::Momentum => 1,
                        _ => 2 + plan.optimizer.amsgrad as u64,
                    },
                    plan.optimizer.state_dtype,
                    ratio
                ),
            });
            }
        }
    } else if plan.optimizer.kind == trainmem_optim::OptimizerKind::Sgd {
        out.push(Finding {
            kind: PatternKind::Jump,
            domain: dev,
            bytes: 0,
            step: Some(0),
            text: "Plain SGD keeps no state: no jump at the first step.".into(),
        });
    }
    // activation retention
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
            text.push_str(&format!(
                " Gradient checkpointing ({k} blocks per segment, {r} blocks recomputed) keeps only segment inputs and recomputes the rest during backward."
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
    // plateau vs growth: allocated at the last phase of each step
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
    // epoch spike (host)
    let host: Vec<u64> = t.samples.iter().map(|x| x.host.anon_rss).collect();
    let starts = t.indices_at(Phase::EpochStart);
    if !starts.is_empty() && plan.loader.workers > 0 {
        let spikes: Vec<(u64, u64, u64)> = starts
            .iter()
            .map(|&i| {
                let epoch = t.samples[i].epoch;
                let in_epoch: Vec<u64> = t
                    .samples
                    .iter()
                    .enumerate()
                    .filter(|(_, x)| x.epoch == epoch && x.phase == Phase::BatchLoaded)
                    .map(|(j, _)| host[j])
                    .collect();
                let first = in_epoch.first().copied().unwrap_or(0);
                let last = in_epoch.last().copied().unwrap_or(0);
                (epoch, first, last)
            })
            .collect();
        let spiking: Vec<&(u64, u64, u64)> = spikes.iter().filter(|s| s.1 > s.2).collect();
        if !spiking.is_empty() {
            let h = spiking.iter().map(|s| s.1 - s.2).max().unwrap_or(0);
            let which: Vec<String> = spiking.iter().map(|s| s.0.to_string()).collect();
            let mut text = format!(
                "Host memory (anonymous RSS) peaks in the first batches of epoch(s) {} by up to {} above the steady state: {} worker(s) start together, each filling {} prefetch slot(s) and holding augmentation scratch at once.",
                which.join(", "),
                human(h),
                plan.loader.workers,
                plan.loader.prefetch_factor
            );
            if plan.loader.persistent_workers {
                text.push_str(" Persistent workers keep their queues across epochs, so later epochs stay flat.");
            } else {
                text.push_str(" Workers are respawned every epoch (persistent_workers = false), so the spike repeats; persistent workers flatten later epochs.");
            }
            out.push(Finding {
                kind: PatternKind::EpochSpike,
                domain: Domain::Host,
                bytes: h as i128,
                step: None,
                text,
            });
        }
    }
    // checkpoint spike
    if let Some(c) = t.at_phase(Phase::CheckpointSave).next() {
        let ckpt = c.host.categories.get(Category::Other);
        let i = t
            .samples
            .iter()
            .position(|x| std::ptr::eq(x, c))
            .unwrap_or(0);
        let before = i
            .checked_sub(1)
            .map_or(0, |j| t.samples[j].host.categories.get(Category::Other));
        out.push(Finding {
            kind: PatternKind::CheckpointSpike,
            domain: Domain::Host,
            bytes: ckpt as i128 - before as i128,
            step: Some(c.step),
            text: format!(
                "Every {} steps a checkpoint is serialised: host memory spikes by {} (parameters and optimizer state copied out) and drops back when it is written.",
                plan.training.checkpoint_every,
                human(ckpt.saturating_sub(before))
            ),
        });
    }
    // cache overhead
    if plan.device.kind == DeviceKind::Cuda {
        let f = &s.fragmentation;
        if s.peak_reserved > 0 && f.cached_unallocated > s.peak_reserved / 20 {
            out.push(Finding {
                kind: PatternKind::CacheOverhead,
                domain: dev,
                bytes: f.cached_unallocated as i128,
                step: None,
                text: format!(
                    "At the end {} is reserved by the caching allocator but not allocated (largest free block {}). empty_cache() would return {} (segments with no live block); {} sits in segments that still hold live tensors and cannot be returned.{}",
                    human(f.cached_unallocated),
                    human(f.largest_free_block),
                    human(f.releasable),
                    human(f.non_releasable),
                    if plan.data.size_variation > 0.0 {
                        " Batch sizes that vary from step to step leave blocks of odd sizes behind: setting max_split_size_mb limits how large cached blocks are split."
                    } else {
                        ""
                    }
                ),
            });
        }
    }
    if let Some(cap) = plan.host.capacity
        && s.peak_host_rss > cap.0
    {
        out.push(Finding {
            kind: PatternKind::OutOfMemory,
            domain: Domain::Host,
            bytes: s.peak_host_rss as i128 - cap.0 as i128,
            step: t.peak_host_rss().map(|p| t.samples[p.sample].step),
            text: format!(
                "Host memory peaks at {}, above the host capacity of {}: the process would be killed or swap. The largest host category at the peak decides the remedy (fewer workers or prefetch slots, persistent workers, memory-mapped data).",
                human(s.peak_host_rss),
                human(cap.0)
            ),
        });
    }
    if let Some(o) = &s.oom {
        let top = s
            .peak_breakdown
            .iter()
            .filter(|(c, _)| *c != Category::Cache)
            .max_by_key(|(_, b)| *b)
            .map(|(c, b)| format!("{c} ({})", human(b)))
            .unwrap_or_default();
        out.push(Finding {
            kind: PatternKind::OutOfMemory,
            domain: dev,
            bytes: o.requested as i128,
            step: Some(o.when.step),
            text: format!(
                "Out of memory at step {} during {} allocating {} of {}. The largest category at the peak was {top}. {}",
                o.when.step,
                o.when.phase,
                human(o.requested),
                o.category,
                o.message
            ),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{SimOptions, simulate};

    const LEAK: &str = "name = \"leak\"\nframework = \"burn\"\n\
        [model.mlp]\ninput = 64\nhidden = [128]\noutput = 32\n\
        [training]\nbatch_size = 8\nepochs = 1\nsteps_per_epoch = 3\n\
        [optimizer]\nkind = \"sgd\"\n\
        [leak]\nretain_outputs = true\nretain_graph = true\n\
        [device]\nkind = \"cpu\"\ncapacity = \"1GiB\"\n";

    fn jump(text: &str) -> Finding {
        let plan = Plan::from_toml_str(text).expect("plan");
        let r = simulate(&plan, SimOptions::default()).expect("simulate");
        explain(&plan, &r.timeline, &r.summary)
            .into_iter()
            .find(|f| f.kind == PatternKind::Jump)
            .expect("a jump finding")
    }

    #[test]
    fn burn_kept_graphs_show_rewritten_weights_not_optimizer_state() {
        let f = jump(LEAK);
        // SGD keeps no state: the jump is the records plus the weights the kept graphs pin
        // (the second linear layer's weight, 128 × 32 f32, saved by its matmul)
        assert!(f.text.contains("0 B of sgd state"), "{}", f.text);
        assert!(
            f.text.contains("re-allocated weights, not optimizer state"),
            "{}",
            f.text
        );
        assert!(f.text.contains("pinned by the kept graphs"), "{}", f.text);
        assert!(!f.text.contains("× the parameter count"), "{}", f.text);
        let records =
            trainmem_optim::burn_step_bookkeeping_bytes(trainmem_optim::OptimizerKind::Sgd, 4);
        assert!(f.bytes as u64 > records, "{}", f.bytes);
        // without the leak nothing is rewritten under SGD
        let plain = LEAK.replace("retain_outputs = true\nretain_graph = true\n", "");
        let f = jump(&plain);
        assert_eq!(f.bytes as u64, records);
        assert!(!f.text.contains("new buffers"), "{}", f.text);
    }

    #[test]
    fn leak_growth_advice_speaks_the_frameworks_language() {
        let growth = |text: &str| {
            let plan = Plan::from_toml_str(text).expect("plan");
            let r = simulate(&plan, SimOptions::default()).expect("simulate");
            explain(&plan, &r.timeline, &r.summary)
                .into_iter()
                .find(|f| f.kind == PatternKind::GrowthPerStep)
                .expect("a growth finding")
                .text
        };
        let leak = LEAK.replace("steps_per_epoch = 3", "steps_per_epoch = 8");
        let burn = growth(&leak);
        assert!(burn.contains("never backwarded"), "{burn}");
        assert!(burn.contains("into_scalar"), "{burn}");
        assert!(!burn.contains("retain_graph"), "{burn}");
        let pytorch = growth(&leak.replace("framework = \"burn\"\n", ""));
        assert!(pytorch.contains("retain_graph"), "{pytorch}");
        assert!(pytorch.contains("loss.item()"), "{pytorch}");
    }

    #[test]
    fn burn_adamw_names_the_clones_and_pytorch_keeps_the_state_ratio() {
        let adamw = LEAK
            .replace("kind = \"sgd\"", "kind = \"adamw\"")
            .replace("retain_outputs = true\nretain_graph = true\n", "");
        let f = jump(&adamw);
        assert!(f.text.contains("2 buffer(s) per parameter"), "{}", f.text);
        assert!(
            f.text
                .contains("AdamW's decoupled decay clones every parameter"),
            "{}",
            f.text
        );
        // PyTorch: the optimizer state proper, 2× the parameters under Adam
        let torch = "[model.mlp]\ninput = 64\nhidden = [128]\noutput = 32\n\
            [training]\nbatch_size = 8\nepochs = 1\nsteps_per_epoch = 2\n\
            [optimizer]\nkind = \"adam\"\n";
        let f = jump(torch);
        assert!(
            f.text
                .contains("adam keeps 2 buffer(s) per parameter in f32 (2.0"),
            "{}",
            f.text
        );
    }
}
