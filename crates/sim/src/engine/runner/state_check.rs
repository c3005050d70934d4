//! The model state worked out before anything is lowered or simulated.
//!
//! Parameters, master weights, gradients and optimizer state follow from the parameter
//! tensors' sizes ([`crate::params::param_groups`]: counted, not lowered) and the plan's
//! optimizer, precision and sharding, with checked arithmetic. Model construction
//! allocates the parameters (with their master copies), the framework's per-tensor
//! bookkeeping and, when made eagerly, the optimizer state: when those bytes alone exceed
//! the device, the run runs out of memory at `model_init` whatever the allocator does (it
//! never hands out fewer bytes than asked), so the simulator says so at once, with the
//! figures, instead of lowering the model and allocating it tensor by tensor. A byte count
//! that overflows 64 bits is an error naming the figures.

use trainmem_autograd::{Program, ProgramBuilder, ValueDtype};

use trainmem_core::Category;
use trainmem_core::Dtype;
use trainmem_optim::{ModelStateBytes, tensor_state_bytes};

use super::Runner;
use super::model_state::{state_config, state_made_at_construction};
use crate::SimError;
use crate::engine::memory::SimOom;
use crate::engine::{SimOptions, SimResult};
use crate::params::{
    ParamGroup, ParamOverflow, add, mul, param_groups, total_elems, total_tensors, trainable_groups,
};
use crate::profile::FrameworkProfile;
use trainmem_core::bytes::human;
use trainmem_core::plan::Plan;
use trainmem_core::timeline::Phase;

/// One device's model state, worked out from the plan alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct StateFigures {
    /// Parameter elements (before sharding).
    pub(super) parameters: u64,
    /// Parameter tensors.
    pub(super) tensors: u64,
    /// Steady-state bytes: parameters (with master weights), gradients, optimizer state.
    pub(super) steady: ModelStateBytes,
    /// The framework's per-tensor bookkeeping made with the parameters (device bytes: 0 on
    /// a GPU, where the records are host memory).
    pub(super) bookkeeping: u64,
    /// Optimizer state made at construction (eager allocation).
    pub(super) eager_state: u64,
    /// Everything model construction allocates.
    pub(super) at_construction: u64,
}

/// Largest elements of one tensor whose state figures cannot overflow (a tensor's bytes
/// are at most 32 bytes per element: 8-byte parameters, master copy, three state buffers).
const MAX_TENSOR_ELEMS: u64 = u64::MAX / 32;

/// The model state of `plan` on one device (`Ok(None)`: the model is invalid and
/// lowering will say why).
pub(super) fn figures(plan: &Plan) -> Result<Option<StateFigures>, ParamOverflow> {
    let Some(groups) = param_groups(&plan.model, plan.framework)? else {
        return Ok(None);
    };
    if plan.optimizer.kind == trainmem_core::OptimizerKind::Adafactor {
        // the factored state follows the parameters' shapes, which only the lowered program
        // has: such plans are checked as they are simulated
        return Ok(None);
    }
    let profile = FrameworkProfile::for_plan(plan);
    let (opt, sharding, grad_dtype) = state_config(plan, profile);
    // frozen parameters (under LoRA) hold their bytes alone: the trainable ones are summed
    // in full, the rest for their parameter bytes
    let trainable = match trainable_groups(&plan.model, plan.framework)? {
        Some(t) if t != groups => Some(t),
        _ => None,
    };
    let mut steady = steady_bytes(&groups, trainable.as_deref(), |elems| {
        tensor_state_bytes(&opt, grad_dtype, sharding, elems)
    })?;
    // state the optimizer makes with itself and shares between its parameters (adamw8bit's
    // quantization maps), once
    steady.optimizer_state = add(
        steady.optimizer_state,
        opt.shared_state_bytes(),
        "optimizer-state bytes",
    )?;
    let tensors = total_tensors(&groups)?;
    // the framework's records are host memory: device bytes only on a CPU device
    let per_tensor = if plan.device.kind == trainmem_core::plan::DeviceKind::Cpu {
        profile.bookkeeping.per_param_tensor
    } else {
        0
    };
    let bookkeeping = mul(per_tensor, tensors, "bookkeeping bytes")?;
    let eager_state = if state_made_at_construction(&opt, profile) {
        steady.optimizer_state
    } else {
        0
    };
    let at_construction = add(
        add(steady.parameters, bookkeeping, "construction bytes")?,
        eager_state,
        "construction bytes",
    )?;
    let total = add(steady.parameters, steady.gradients, "model-state bytes")?;
    add(total, steady.optimizer_state, "model-state bytes")?;
    Ok(Some(StateFigures {
        parameters: total_elems(&groups)?,
        tensors,
        steady,
        bookkeeping,
        eager_state,
        at_construction,
    }))
}

/// Steady-state bytes summed over the groups, from `one` tensor's bytes by its elements.
fn steady_bytes(
    groups: &[ParamGroup],
    trainable: Option<&[ParamGroup]>,
    one: impl Fn(u64) -> ModelStateBytes,
) -> Result<ModelStateBytes, ParamOverflow> {
    let mut steady = ModelStateBytes::default();
    let all_frozen = trainable.is_some();
    for (&ParamGroup { elems, count }, frozen) in groups
        .iter()
        .map(|g| (g, all_frozen))
        .chain(trainable.into_iter().flatten().map(|g| (g, false)))
    {
        if elems > MAX_TENSOR_ELEMS {
            return Err(ParamOverflow(format!(
                "a parameter tensor of {elems} elements overflows a 64-bit byte count"
            )));
        }
        let mut one = one(elems);
        if frozen {
            // counted as frozen here; the adapters among them come again as trainable,
            // less their parameter bytes
            one = ModelStateBytes {
                parameters: one.parameters - one.master_weights,
                ..ModelStateBytes::default()
            };
        } else if all_frozen {
            one.parameters = one.master_weights;
        }
        add_tensors(&mut steady, one, count)?;
    }
    Ok(steady)
}

/// Adds `count` tensors of `one`'s bytes each to `steady`.
fn add_tensors(
    steady: &mut ModelStateBytes,
    one: ModelStateBytes,
    count: u64,
) -> Result<(), ParamOverflow> {
    let sum = |acc: u64, per: u64, what: &str| add(acc, mul(per, count, what)?, what);
    steady.parameters = sum(steady.parameters, one.parameters, "parameter bytes")?;
    steady.master_weights = sum(steady.master_weights, one.master_weights, "master weights")?;
    steady.gradients = sum(steady.gradients, one.gradients, "gradient bytes")?;
    steady.optimizer_state = sum(
        steady.optimizer_state,
        one.optimizer_state,
        "optimizer-state bytes",
    )?;
    Ok(())
}

/// What the out-of-memory report says when construction alone exceeds `capacity`.
fn message(plan: &Plan, f: &StateFigures, capacity: u64) -> String {
    let s = &f.steady;
    let mut parts = vec![format!(
        "parameters {}",
        human(s.parameters - s.master_weights)
    )];
    if s.master_weights > 0 {
        parts.push(format!("f32 master weights {}", human(s.master_weights)));
    }
    if f.eager_state > 0 {
        parts.push(format!("optimizer state {}", human(f.eager_state)));
    }
    if f.bookkeeping > 0 {
        parts.push(format!("bookkeeping {}", human(f.bookkeeping)));
    }
    let par = &plan.parallel;
    let sharded = if par.world_size > 1 && par.zero_stage > 0 {
        format!(
            " per rank (ZeRO stage {} over {} ranks)",
            par.zero_stage, par.world_size
        )
    } else {
        String::new()
    };
    format!(
        "model state alone exceeds the device: constructing the model allocates {} ({} bytes: \
         {}){sharded} for {} parameter elements in {} tensors, more than the device's {} \
         ({capacity} bytes); gradients would add {} and optimizer state {} (model state {})",
        human(f.at_construction),
        f.at_construction,
        parts.join(", "),
        trainmem_core::count::grouped(f.parameters),
        trainmem_core::count::grouped(f.tensors),
        human(capacity),
        human(s.gradients),
        human(s.optimizer_state),
        human(
            s.parameters
                .saturating_add(s.gradients)
                .saturating_add(s.optimizer_state)
        ),
    )
}

/// A program with no parameters and nothing to lower: what the runner samples with when
/// the model is never built.
fn stand_in() -> Program {
    let mut b = ProgramBuilder::new();
    let x = b.input(1, ValueDtype::Fixed(Dtype::F32));
    b.begin_layer("loss");
    b.loss(trainmem_core::OpKind::MseLoss, &[x, x]);
    b.finish().expect("a loss over an input is a valid program")
}

/// The result of a run whose model construction alone exceeds the device, worked out
/// without lowering the model (`Ok(None)`: it may fit, or the plan is pipelined — each
/// stage then builds only its part — and is simulated). A byte count that overflows is a
/// [`SimError::Overflow`].
pub(super) fn construction_oom(
    plan: &Plan,
    opts: &mut SimOptions,
) -> Result<Option<SimResult>, SimError> {
    let f = match figures(plan) {
        Ok(Some(f)) => f,
        Ok(None) => return Ok(None),
        Err(e) => {
            return Err(SimError::Overflow(format!(
                "the model's size overflows a 64-bit byte count ({e}); is a size mistyped?"
            )));
        }
    };
    let capacity = plan.device.capacity.0;
    if plan.parallel.pipeline_stages > 1 || f.at_construction <= capacity {
        return Ok(None);
    }
    let program = stand_in();
    let mut r = Runner::new(plan, &program, 0, 1, opts)?;
    r.sample(Phase::Start);
    r.begin(Phase::ModelInit);
    let oom = SimOom {
        message: message(plan, &f, capacity),
        requested: f.at_construction,
        category: Category::Parameter,
    };
    let total = opts
        .max_steps
        .map_or(plan.total_steps(), |m| m.min(plan.total_steps()));
    let (timeline, mut summary, snapshot) = r.finish(Err(oom), total, opts.trace_entries.is_some());
    summary.parameters = f.parameters;
    summary.model_state = f.steady;
    Ok(Some(SimResult {
        timeline,
        stages: vec![summary.clone()],
        summary,
        snapshot,
    }))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::lower::{LOWERED_LAYERS, lower_for};
    use trainmem_core::model::ModelSpec;

    /// A transformer plan of `layers` blocks of width `hidden` on a `capacity` device.
    fn deep(layers: u64, hidden: u64, capacity: &str) -> Plan {
        Plan::from_toml_str(&format!(
            "[model.transformer]\nlayers = {layers}\nhidden = {hidden}\nheads = 8\n\
             seq_len = 128\nvocab = 1000\n[training]\nbatch_size = 1\nepochs = 1\n\
             steps_per_epoch = 2\n[device]\ncapacity = \"{capacity}\"\n"
        ))
        .expect("valid plan")
    }

    /// Parameter elements of `plan`'s model with `layers` blocks, by lowering it.
    fn lowered_elems(plan: &Plan, layers: u64) -> u64 {
        let mut model = plan.model.clone();
        if let ModelSpec::Transformer(t) = &mut model {
            t.layers = layers;
        }
        lower_for(&model, plan.framework)
            .expect("lowers")
            .param_elems()
    }

    fn lowered_layers() -> u64 {
        LOWERED_LAYERS.with(|n| n.get())
    }

    #[test]
    fn a_model_that_cannot_be_built_is_reported_before_lowering() {
        let plan = deep(100_000, 1024, "80GiB");
        // the stack's elements from two small lowerings: base + layers × one block
        let (one, two) = (lowered_elems(&plan, 1), lowered_elems(&plan, 2));
        let elems = one + 99_999 * (two - one);
        let before = lowered_layers();
        let r = crate::simulate(&plan, SimOptions::default()).expect("a result");
        assert_eq!(lowered_layers(), before, "nothing lowered");
        let oom = r.summary.oom.as_ref().expect("out of memory");
        assert_eq!(oom.when.phase, Phase::ModelInit);
        assert_eq!(oom.when.step, 0);
        assert_eq!(oom.category, "parameter");
        // f32 parameters, Adam's state made lazily: construction allocates 4 bytes each
        assert_eq!(oom.requested, 4 * elems);
        assert!(
            oom.message.contains(&trainmem_core::count::grouped(elems)),
            "{}",
            oom.message
        );
        assert!(
            oom.message.contains(&(4 * elems).to_string()),
            "{}",
            oom.message
        );
        assert_eq!(r.summary.parameters, elems);
        assert_eq!(r.summary.model_state.parameters, 4 * elems);
        assert_eq!(r.summary.model_state.gradients, 4 * elems);
        assert_eq!(r.summary.allocations, 0, "nothing simulated");
        let phases: Vec<Phase> = r.timeline.samples.iter().map(|s| s.phase).collect();
        assert_eq!(phases, vec![Phase::Start, Phase::OutOfMemory]);
    }

    #[test]
    fn a_mistyped_size_is_an_overflow_naming_the_figures() {
        let plan = deep(1_000_000_000, 1_000_000, "80GiB");
        let before = lowered_layers();
        let e = crate::simulate(&plan, SimOptions::default()).expect_err("overflows");
        assert_eq!(lowered_layers(), before, "nothing lowered");
        let SimError::Overflow(msg) = &e else {
            panic!("not an overflow: {e}");
        };
        let small = deep(1, 1_000_000, "80GiB");
        let block = lowered_elems(&small, 2) - lowered_elems(&small, 1);
        assert!(msg.contains("1000000000 × "), "{msg}");
        assert!(msg.contains(&block.to_string()), "{msg}");
    }

    #[test]
    fn a_model_that_fits_is_lowered_and_simulated() {
        let plan = deep(3, 64, "8GiB");
        let before = lowered_layers();
        let r = crate::simulate(&plan, SimOptions::default()).expect("a result");
        assert!(lowered_layers() > before);
        assert!(r.summary.oom.is_none());
        assert_eq!(r.summary.steps, 2);
    }

    prop_compose! {
        /// A small plan: framework, optimizer, state allocation, precision, sharding and
        /// device drawn at random; `capacity` as a fraction of what construction needs.
        fn small_plan()(
            burn in any::<bool>(), opt in 0usize..4, eager in any::<bool>(),
            half in any::<bool>(), master in any::<bool>(), zero in 0u8..4,
            world in 1u64..5, cpu in any::<bool>(), mlp in any::<bool>(),
            width in 1u64..300, depth in 1u64..4, lora in any::<bool>(),
        ) -> String {
            let model = if mlp {
                format!("[model.mlp]\ninput = {width}\nhidden = [{width}, 7]\noutput = 3\n")
            } else {
                let adapters = if lora {
                    "[model.transformer.lora]\nrank = 2\ntargets = [\"q\", \"v\", \"down\"]\n"
                } else {
                    ""
                };
                format!("[model.transformer]\nlayers = {depth}\nhidden = {}\nheads = 2\n\
                         seq_len = 4\nvocab = {width}\n{adapters}", 2 * (width % 40 + 1))
            };
            let kind = ["sgd", "momentum", "adam", "adamw"][opt];
            format!(
                "framework = \"{}\"\n{model}[training]\nbatch_size = 2\nepochs = 1\n\
                 steps_per_epoch = 2\n[optimizer]\nkind = \"{kind}\"\nstate = \"{}\"\n\
                 [precision]\ncompute = \"{}\"\nmaster_weights = {master}\n\
                 [parallel]\nworld_size = {world}\nzero_stage = {}\n\
                 [device]\nkind = \"{}\"\ncapacity = \"64GiB\"\n",
                if burn { "burn" } else { "pytorch" },
                if eager { "eager" } else { "lazy" },
                if half { "bf16" } else { "f32" },
                // sharding needs more than one rank
                if world > 1 { zero } else { 0 },
                if cpu { "cpu" } else { "cuda" },
            )
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]
        /// The figures are what construction allocates (exactly, on a counting CPU device),
        /// and a device smaller than that runs out of memory at `model_init` when simulated
        /// tensor by tensor too.
        #[test]
        fn construction_figures_match_the_simulation(src in small_plan(), frac in 0.0f64..1.5) {
            let mut plan = Plan::from_toml_str(&src).expect("a valid plan");
            let f = figures(&plan).expect("no overflow").expect("valid model");
            let r = simulate_lowered_for_test(&plan);
            let init = r.timeline.at_phase(Phase::ModelInit).next().expect("model_init");
            if plan.device.kind == trainmem_core::plan::DeviceKind::Cpu {
                prop_assert_eq!(init.device.allocated, f.at_construction);
            } else {
                prop_assert!(init.device.allocated >= f.at_construction);
            }
            prop_assert_eq!(r.summary.model_state, f.steady);
            prop_assert_eq!(r.summary.parameters, f.parameters);
            plan.device.capacity.0 = ((f.at_construction as f64) * frac) as u64;
            let early = crate::simulate(&plan, SimOptions::default()).expect("a result");
            let full = simulate_lowered_for_test(&plan);
            if f.at_construction > plan.device.capacity.0 {
                let (e, o) = (early.summary.oom.expect("early"), full.summary.oom.expect("full"));
                prop_assert_eq!(e.when, o.when);
                prop_assert_eq!(e.when.phase, Phase::ModelInit);
            } else {
                prop_assert_eq!(early.summary, full.summary);
                prop_assert_eq!(early.timeline, full.timeline);
            }
        }
    }

    fn simulate_lowered_for_test(plan: &Plan) -> SimResult {
        super::super::simulate_lowered(plan, SimOptions::default()).expect("a result")
    }
}
