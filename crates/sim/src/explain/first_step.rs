//! Patterns before and at the first step: memory taken at startup, the optimizer jump.

use trainmem_core::Category;
use trainmem_core::OptimizerKind;

use super::{Finding, PatternKind};
use crate::engine::Summary;
use crate::params::{total_elems, trainable_groups};
use crate::profile::{FrameworkProfile, OptimizerRecords, ParamUpdate, StateDtype};
use trainmem_core::bytes::human;
use trainmem_core::count::grouped;
use trainmem_core::plan::{DataStorage, DeviceKind, ModelSpec, Plan};
use trainmem_core::timeline::{Domain, Phase, Timeline};

/// Memory taken before the first step: parameters (and master weights), eagerly made
/// optimizer state, a preloaded data set.
pub(super) fn startup(plan: &Plan, t: &Timeline, s: &Summary, out: &mut Vec<Finding>) {
    let dev = Domain::Device;
    if let Some(init) = t.at_phase(Phase::ModelInit).next() {
        let c = init.device.categories;
        let p = c.get(Category::Parameter);
        let o = c.get(Category::OptimizerState);
        let mut text = format!(
            "{} of parameters exist before the first step ({} elements{}).",
            human(p),
            grouped(s.parameters),
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
}

/// The jump at the first optimizer step: the optimizer state appearing (with what else the
/// framework allocates inside the step), or none under plain SGD.
pub(super) fn optimizer_jump(plan: &Plan, t: &Timeline, s: &Summary, out: &mut Vec<Finding>) {
    let dev = Domain::Device;
    let profile = FrameworkProfile::for_plan(plan);
    // state made with the optimizer and shared by its parameters (adamw8bit's quantization
    // maps) is there from the start: the jump is what the first step adds to it
    let made_with_optimizer = t
        .samples
        .iter()
        .take_while(|x| x.phase != Phase::OptimizerStep)
        .map(|x| x.device.categories.get(Category::OptimizerState))
        .max()
        .unwrap_or(0)
        .min(if plan.optimizer.kind == OptimizerKind::AdamW8bit {
            trainmem_optim::eight_bit::QUANTIZATION_MAPS_BYTES
        } else {
            0
        });
    let first_state = t
        .samples
        .iter()
        .position(|x| x.device.categories.get(Category::OptimizerState) > made_with_optimizer);
    if let Some(i) = first_state {
        let x = &t.samples[i];
        if x.phase == Phase::OptimizerStep {
            let b = x.device.categories.get(Category::OptimizerState) - made_with_optimizer;
            // the parameters the optimizer keeps state for: under LoRA the adapters alone
            let trainable = adapter_elems(plan);
            let elems = trainable.unwrap_or(
                (s.model_state.parameters - s.model_state.master_weights)
                    / plan.precision.compute.size().max(1),
            );
            let per = elems * plan.optimizer.state_dtype.size();
            let ratio = if per > 0 { b as f64 / per as f64 } else { 0.0 };
            let text = match profile.bookkeeping.optimizer_records {
                Some(records) => first_step_breakdown_text(plan, profile, records, s, b, x.step),
                None => state_jump_text(plan, b, x.step, ratio, trainable),
            };
            out.push(Finding {
                kind: PatternKind::Jump,
                domain: dev,
                bytes: b as i128,
                step: Some(x.step),
                text,
            });
        }
    } else if plan.optimizer.kind == OptimizerKind::Sgd {
        out.push(Finding {
            kind: PatternKind::Jump,
            domain: dev,
            bytes: 0,
            step: Some(0),
            text: "Plain SGD keeps no state: no jump at the first step.".into(),
        });
    }
}

/// State buffers per parameter of the plan's optimizer.
fn state_buffers(plan: &Plan) -> u64 {
    match plan.optimizer.kind {
        OptimizerKind::Sgd => 0,
        OptimizerKind::Momentum | OptimizerKind::Adafactor => 1,
        _ => 2 + plan.optimizer.amsgrad as u64,
    }
}

/// Elements of the LoRA adapters, the only parameters that train, for a LoRA plan.
fn adapter_elems(plan: &Plan) -> Option<u64> {
    match &plan.model {
        ModelSpec::Transformer(t) if t.lora.is_some() => {
            let groups = trainable_groups(&plan.model, plan.framework).ok()??;
            total_elems(&groups).ok()
        }
        _ => None,
    }
}

/// The optimizer state proper appearing at the first optimizer `step` (`b` bytes, `ratio`
/// times the count of parameters it keeps state for in the state's dtype; `adapters`: under
/// LoRA, the adapters' elements, the only ones it keeps state for).
fn state_jump_text(plan: &Plan, b: u64, step: u64, ratio: f64, adapters: Option<u64>) -> String {
    let (each, of, frozen) = match adapters {
        Some(n) => (
            "trainable parameter",
            format!("the {} parameters of the LoRA adapters", grouped(n)),
            "; the frozen base has none",
        ),
        None => ("parameter", "the parameter count".to_string(), ""),
    };
    if plan.optimizer.kind == OptimizerKind::AdamW8bit {
        return format!(
            "+{} of optimizer state appears at the first optimizer step (step {}): adamw8bit keeps both Adam moments in one byte per element with an f32 maximum per block of 256 elements (f32 moments for tensors under 4,096 elements; {:.2}× {of} in f32, against 2× for adamw{frozen}), created lazily on first use; it stays flat afterwards.",
            human(b),
            step,
            ratio
        );
    }
    format!(
        "+{} of optimizer state appears at the first optimizer step (step {}): {} keeps {} buffer(s) per {each} in {} ({:.2}× {of} in that dtype{frozen}), created lazily on first use; it stays flat afterwards.",
        human(b),
        step,
        plan.optimizer.kind.name(),
        state_buffers(plan),
        plan.optimizer.state_dtype,
        ratio
    )
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
    let kind = plan.optimizer.kind;
    let tensors = crate::lower::lower_for(&plan.model, plan.framework)
        .map(|p| p.params.len() as u64)
        .unwrap_or(0);
    let all_records = (records.bytes)(kind, tensors);
    // on a GPU the records are host memory: none of the device's jump
    let on_host = plan.device.kind != DeviceKind::Cpu;
    let record_bytes = if on_host { 0 } else { all_records.min(b) };
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
    let buffers = state_buffers(plan);
    let dtype = match profile.optimizer.state_dtype {
        StateDtype::Gradients => "the parameters' dtype".to_string(),
        StateDtype::Plan => plan.optimizer.state_dtype.to_string(),
    };
    let records_text = if on_host {
        format!("{} ({}) in host memory", records.what, human(all_records))
    } else {
        format!("{} of {}", human(record_bytes), records.what)
    };
    let mut text = format!(
        "+{} under optimizer_state at the first optimizer step (step {step}): {} of {} state ({buffers} buffer(s) per parameter, in {dtype}), {records_text}",
        human(b),
        human(state),
        kind.name(),
    );
    if rewritten > 0 && profile.optimizer.param_update != ParamUpdate::InPlace {
        let adamw = kind == OptimizerKind::AdamW;
        let kept = plan.leak.retain_outputs && plan.leak.retain_graph;
        let fused = profile.optimizer.param_update == ParamUpdate::NewBuffer;
        let why = match (adamw, kept) {
            _ if fused => {
                "burn's fusion writes each updated parameter into a new buffer (a fused kernel's output), made by the step's ops; the old buffers are freed"
            }
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
