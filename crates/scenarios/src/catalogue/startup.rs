//! `startup`: what memory a training run holds before its first step. The parameters exist
//! once the model is built (eager) or only from the first forward pass (lazy); the autograd
//! graph and the activations it saves appear at the first forward; the optimizer's state at
//! the first step.

use trainmem_core::Category;
use trainmem_core::Plan;
use trainmem_core::model::ModelSpec;
use trainmem_core::plan::StateAllocation;
use trainmem_core::timeline::{Phase, Source, Timeline};

use crate::checks::{bytes_at, index_of};
use crate::ctx::{Ctx, Judgement};
use crate::error::{Result, ScenarioError};
use crate::report::{Figure, VerdictKind};

/// Which bytes cause the pattern and what removes it.
pub const EXPLANATION: &[&str] = &[
    "Memory rises in three stages before training is steady. Building the model makes its \
     parameters: trainmem-burn materialises every burn parameter at construction, so the \
     `model_init` sample already holds the full parameter bytes. The first forward pass builds \
     the autograd graph: every op that needs its input for the backward pass keeps it, so the \
     activations saved for backward appear only then. The optimizer's state (AdamW's two \
     moments, 2x the parameter bytes) is created inside the first `step`, so it appears only \
     after the first optimizer step.",
    "Knob (measured): burn 0.21 parameters are lazy until first read. Leaving them lazy at \
     construction (`RunOptions::lazy_parameters`) makes the constructed model cost almost \
     nothing: the parameter bytes are paid inside the first forward pass instead, and from \
     then on the run holds exactly what the eager run holds. Peak memory does not change; \
     only when it is reached.",
    "Knob (simulated): an optimizer that creates its state eagerly, with the model, moves the \
     2x parameter bytes from the first step to construction; after the first step both hold \
     the same. burn-optim cannot do this (its state is always created at the first step), so \
     only the twin runs it.",
];

/// Bytes of the model's parameters as the plan describes them (elements × compute dtype).
pub(super) fn model_parameter_bytes(plan: &Plan) -> Result<u64> {
    let program = trainmem_sim::lower::lower(&plan.model).map_err(ScenarioError::Lower)?;
    let elems: u64 = program.params.iter().map(|p| p.elems).sum();
    Ok(elems * plan.precision.compute.size())
}

/// A lower bound on the activations one forward of an MLP saves: the output of every hidden
/// layer is the input of the next layer's matrix product, which keeps it for the weight
/// gradient (f32, one value per hidden unit per sample).
fn mlp_saved_floor(plan: &Plan) -> Result<u64> {
    let ModelSpec::Mlp(m) = &plan.model else {
        unsuited!("the startup plan must describe an MLP (its activation floor is an MLP's)");
    };
    Ok(plan.micro_batch_size() * m.hidden.iter().sum::<u64>() * 4)
}

/// The samples of the start of a run: start, model_init, the first batch, the first forward,
/// the first backward, the first optimizer step.
struct Startup {
    start: usize,
    init: usize,
    loaded: usize,
    forward: usize,
    backward: usize,
    step: usize,
}

fn startup_points(t: &Timeline) -> Option<Startup> {
    Some(Startup {
        start: index_of(t, 0, Phase::Start)?,
        init: index_of(t, 0, Phase::ModelInit)?,
        loaded: index_of(t, 0, Phase::BatchLoaded)?,
        forward: index_of(t, 0, Phase::Forward)?,
        backward: index_of(t, 0, Phase::Backward)?,
        step: index_of(t, 0, Phase::OptimizerStep)?,
    })
}

/// Parameter plus optimizer-state bytes: what the optimizer's state adds to, independent of
/// the category the optimizer writes updated parameters under (burn's AdamW writes every
/// updated parameter into a new buffer allocated inside the step).
fn model_state(t: &Timeline, i: usize) -> u64 {
    bytes_at(t, i, Some(Category::Parameter)) + bytes_at(t, i, Some(Category::OptimizerState))
}

fn missing() -> Judgement {
    Judgement::new(
        false,
        "no start / model_init / first batch / forward / backward / step samples",
        vec![],
    )
}

/// The live bytes at the start-up samples, as figures.
fn stage_figures(t: &Timeline, p: &Startup) -> Vec<Figure> {
    vec![
        Figure::bytes("live at start", bytes_at(t, p.start, None)),
        Figure::bytes("live after model_init", bytes_at(t, p.init, None)),
        Figure::bytes("live after the first forward", bytes_at(t, p.forward, None)),
        Figure::bytes("live after the first step", bytes_at(t, p.step, None)),
    ]
}

/// Eager parameters: the parameter bytes are all there at `model_init`, and construction adds
/// nothing else of note.
fn parameters_at_init(t: &Timeline, params: u64) -> Judgement {
    let Some(p) = startup_points(t) else {
        return missing();
    };
    let at_init = bytes_at(t, p.init, Some(Category::Parameter));
    let added = bytes_at(t, p.init, None) as i64 - bytes_at(t, p.start, None) as i64;
    let ok = at_init as f64 >= 0.99 * params as f64
        && at_init as f64 <= 1.02 * params as f64
        && added as f64 >= 0.99 * params as f64
        && added as f64 <= 1.05 * params as f64;
    let mut figures = vec![
        Figure::bytes("model parameter bytes (plan)", params),
        Figure::bytes("parameter bytes at model_init", at_init),
        Figure::delta("construction added", added),
    ];
    figures.extend(stage_figures(t, &p));
    Judgement::new(
        ok,
        format!(
            "after model_init the parameter category holds {at_init} bytes (the plan's \
             {params} bytes, -1%..+2%) and construction added {added} live bytes (-1%..+5% of \
             the parameter bytes: nothing but the model)"
        ),
        figures,
    )
}

/// The graph: no activations until the first forward, at least the floor after it.
fn graph_at_first_forward(t: &Timeline, floor: u64) -> Judgement {
    let Some(p) = startup_points(t) else {
        return missing();
    };
    let act = |i| bytes_at(t, i, Some(Category::Activation));
    let before = act(p.init).max(act(p.loaded));
    let after = act(p.forward);
    let ok = (before as f64) <= 0.05 * floor as f64 && after >= floor;
    Judgement::new(
        ok,
        format!(
            "activation bytes are {before} before the first forward (at most 5% of the floor) \
             and {after} after it (at least the floor of {floor} bytes: every hidden layer's \
             output for the batch, f32)"
        ),
        vec![
            Figure::bytes("saved-activation floor", floor),
            Figure::bytes("activations before the first forward", before),
            Figure::bytes("activations after the first forward", after),
        ],
    )
}

/// Optimizer state: none before the first step, 2x the parameter bytes after it.
fn state_at_first_step(t: &Timeline, params: u64) -> Judgement {
    let Some(p) = startup_points(t) else {
        return missing();
    };
    let state_before = [p.init, p.loaded, p.forward, p.backward]
        .into_iter()
        .map(|i| bytes_at(t, i, Some(Category::OptimizerState)))
        .max()
        .unwrap_or(0);
    let grown = model_state(t, p.step) as i64 - model_state(t, p.backward) as i64;
    let ratio = grown as f64 / params.max(1) as f64;
    let ok = (state_before as f64) <= 0.01 * params as f64 && (ratio - 2.0).abs() <= 0.03;
    Judgement::new(
        ok,
        format!(
            "optimizer-state bytes before the first step are at most {state_before} (1% of \
             the parameter bytes at most); parameter + optimizer-state bytes grow by \
             {ratio:.3} x the parameter bytes in the first step (AdamW: 2 +/- 0.03)"
        ),
        vec![
            Figure::bytes("optimizer state before the first step", state_before),
            Figure::delta("grown in the first step", grown),
            Figure::ratio("grown / parameter bytes", ratio),
        ],
    )
}

/// Runs the scenario.
pub fn run(ctx: &mut Ctx) -> Result<()> {
    let plan = ctx.plan("startup")?;
    let params = model_parameter_bytes(&plan)?;
    let floor = mlp_saved_floor(&plan)?;

    let base = ctx.run("eager parameters, lazy optimizer state", &plan)?;
    ctx.check(
        base,
        VerdictKind::Pattern,
        "parameters exist once the model is built",
        |t| parameters_at_init(t, params),
    );
    ctx.check(
        base,
        VerdictKind::Pattern,
        "saved activations appear at the first forward",
        |t| graph_at_first_forward(t, floor),
    );
    ctx.check(
        base,
        VerdictKind::Pattern,
        "optimizer state appears at the first step (+2x parameter bytes)",
        |t| state_at_first_step(t, params),
    );

    // A burn run option, not a plan knob: the twin has no lazy parameters.
    if let Some(lazy) = ctx.run_measured_only(
        "lazy parameters (burn)",
        &plan,
        "lazy parameter materialisation is a burn run option the twin does not model",
        |o| o.lazy_parameters = true,
    )? {
        let judgement = match (
            ctx.record(base).timeline(Source::Measured),
            ctx.record(lazy).measured.as_ref(),
        ) {
            (Some(eager), Some(run)) => {
                lazy_moves_parameters(eager, &run.timeline, params, run.lazy_parameters_at_init)
            }
            _ => missing(),
        };
        ctx.push_verdict(
            VerdictKind::Knob,
            "lazy parameters move the parameter bytes to the first forward",
            Source::Measured,
            judgement,
        );
        ctx.note(
            "a lazily created parameter is tagged `activation`: it is allocated in the forward \
             pass (RunOptions::lazy_parameters)",
        );
    }

    let mut eager_state = plan.clone();
    eager_state.optimizer.state = StateAllocation::Eager;
    let eager = ctx.run_simulated_only(
        "eager optimizer state (twin)",
        &eager_state,
        "burn-optim creates an optimizer's state inside the first step; a plan with \
         optimizer.state = \"eager\" is refused by the measured run",
    )?;
    ctx.compare(
        base,
        eager,
        VerdictKind::Knob,
        "eager optimizer state moves the 2x parameter bytes to construction",
        |a, b| eager_state_moves_jump(a, b, params),
    );
    Ok(())
}

/// Lazy parameters (`lazy`) against eager ones (`eager`): construction costs (almost)
/// nothing, the first forward costs the parameter bytes more, and after the first step the
/// two runs hold the same.
fn lazy_moves_parameters(
    eager: &Timeline,
    lazy: &Timeline,
    params: u64,
    lazy_count: usize,
) -> Judgement {
    let (Some(e), Some(l)) = (startup_points(eager), startup_points(lazy)) else {
        return missing();
    };
    let live = |t: &Timeline, i| bytes_at(t, i, None) as i64;
    let init_added = live(lazy, l.init) - live(lazy, l.start);
    let param_at_init = bytes_at(lazy, l.init, Some(Category::Parameter));
    let fwd_eager = live(eager, e.forward) - live(eager, e.loaded);
    let fwd_lazy = live(lazy, l.forward) - live(lazy, l.loaded);
    let extra = fwd_lazy - fwd_eager;
    let after_step = live(lazy, l.step) - live(eager, e.step);
    let p = params as f64;
    let ok = lazy_count > 0
        && (init_added as f64) <= 0.05 * p
        && (param_at_init as f64) <= 0.05 * p
        && (extra as f64 - p).abs() <= 0.03 * p
        && (after_step.unsigned_abs() as f64) <= 0.02 * p;
    Judgement::new(
        ok,
        format!(
            "with {lazy_count} lazy parameters, construction adds {init_added} live bytes \
             (parameter category {param_at_init}; at most 5% of the {params} parameter \
             bytes), the first forward adds {extra} bytes more than with eager parameters \
             (the parameter bytes +/- 3%), and after the first step the runs differ by \
             {after_step} bytes (at most 2%)"
        ),
        vec![
            Figure::count("lazy parameters at model_init", lazy_count as u64),
            Figure::delta("construction added (lazy)", init_added),
            Figure::delta("first forward added (eager)", fwd_eager),
            Figure::delta("first forward added (lazy)", fwd_lazy),
            Figure::delta("lazy minus eager after the first step", after_step),
        ],
    )
}

/// Eager optimizer state (`eager`) against lazy (`lazy`): +2x parameter bytes at
/// construction, nothing added by the first step, the same after it.
fn eager_state_moves_jump(lazy: &Timeline, eager: &Timeline, params: u64) -> Judgement {
    let (Some(l), Some(e)) = (startup_points(lazy), startup_points(eager)) else {
        return missing();
    };
    let at_init = model_state(eager, e.init) as i64 - model_state(lazy, l.init) as i64;
    let in_step = model_state(eager, e.step) as i64 - model_state(eager, e.backward) as i64;
    let after = model_state(eager, e.step) as i64 - model_state(lazy, l.step) as i64;
    let p = params as f64;
    let ratio = at_init as f64 / p.max(1.0);
    let ok = (ratio - 2.0).abs() <= 0.03
        && (in_step.unsigned_abs() as f64) <= 0.01 * p
        && (after.unsigned_abs() as f64) <= 0.01 * p;
    Judgement::new(
        ok,
        format!(
            "eager state holds {ratio:.3} x the parameter bytes more at model_init (2 +/- \
             0.03), its first step adds {in_step} parameter + state bytes and after the first \
             step it holds {after} bytes more than lazy state (both at most 1% of the \
             parameter bytes)"
        ),
        vec![
            Figure::delta("eager minus lazy at model_init", at_init),
            Figure::delta("added by the first step (eager)", in_step),
            Figure::delta("eager minus lazy after the first step", after),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameter_bytes_and_activation_floor_follow_the_plan() {
        let plan = Plan::from_toml_str(
            "[model.mlp]\ninput = 4\nhidden = [8, 6]\noutput = 2\n\n[training]\nbatch_size = 5\n",
        )
        .expect("plan");
        // 4*8+8 + 8*6+6 + 6*2+2 = 108 f32 parameters.
        assert_eq!(model_parameter_bytes(&plan).expect("lowered"), 108 * 4);
        assert_eq!(mlp_saved_floor(&plan).expect("mlp"), 5 * (8 + 6) * 4);
    }
}
