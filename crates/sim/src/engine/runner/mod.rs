//! The step loop: one pipeline stage's program run step by step through the allocator.
//!
//! A [`Runner`] is built once per stage ([`setup`]) and then walks the run: model
//! construction and the epochs ([`epochs`]), each optimizer step's micro-batches in the
//! stage's 1F1B order ([`step`]), a micro-batch's forward and backward ([`micro_batch`]),
//! the optimizer step ([`optimizer_step`]) and what follows it ([`after_step`]), sampling at
//! every phase boundary ([`sampling`]), and the figures at the end ([`summary`]). The
//! framework's rules come from its [`FrameworkProfile`]; the runner holds no framework
//! knowledge of its own.
//!
//! Its state is grouped by concept: the run being simulated ([`RunSpec`]), the autograd
//! graph ([`autograd::Autograd`]), the tensor store over the simulated memory, the model
//! state ([`model_state::ModelState`]), the host model ([`HostSide`]), where the run is
//! ([`clock::Clock`]), the timeline and peak ([`sampling::Recorder`]) and what outlives a
//! step ([`retention::Retention`]).

mod after_step;
mod autograd;
mod blas;
mod clock;
mod epochs;
mod micro_batch;
mod model_state;
mod optimizer_step;
mod retention;
mod sampling;
mod setup;
mod state_check;
mod step;
mod summary;
mod zero;

pub use model_state::HostRecords;

use trainmem_autograd::{Program, TensorStore};

use super::host::{HostModel, HostMoment};
use super::memory::SimMemory;
use super::{SimOptions, SimResult, Summary};
use crate::SimError;
use crate::profile::FrameworkProfile;
use trainmem_core::plan::Plan;
use trainmem_core::timeline::Timeline;

/// What is simulated: the plan, this stage's program and the framework's rules.
struct RunSpec<'p> {
    plan: &'p Plan,
    program: &'p Program,
    /// The framework's rules.
    profile: &'static FrameworkProfile,
    /// Pipeline stage this runner simulates, of `stages`.
    stage: u64,
    stages: u64,
    /// The tensors live on a CPU device.
    cpu: bool,
}

/// The host-memory model and the moment it is sampled at.
struct HostSide {
    model: HostModel,
    moment: HostMoment,
}

/// One pipeline stage's simulation.
struct Runner<'p> {
    spec: RunSpec<'p>,
    autograd: autograd::Autograd<'p>,
    /// The tensors, over the simulated device memory (the allocator's state).
    store: TensorStore<SimMemory>,
    state: model_state::ModelState,
    host: HostSide,
    clock: clock::Clock,
    recorder: sampling::Recorder,
    retention: retention::Retention,
}

/// Simulates one pipeline stage's program (`stage` of `stages`).
pub fn simulate_stage(
    plan: &Plan,
    program: &Program,
    stage: u64,
    stages: u64,
    opts: &mut SimOptions,
) -> Result<(Timeline, Summary, Option<trainmem_alloc::Snapshot>), SimError> {
    let mut r = Runner::new(plan, program, stage, stages, opts)?;
    let total = opts
        .max_steps
        .map_or(plan.total_steps(), |m| m.min(plan.total_steps()));
    let outcome = r.run(total, &mut opts.progress);
    Ok(r.finish(outcome, total, opts.trace_entries.is_some()))
}

/// Simulates a plan.
///
/// The model state is worked out first, from the plan alone: a model whose construction
/// alone exceeds the device is reported at once as an out-of-memory at `model_init`, without
/// lowering it; one whose byte count overflows 64 bits is a [`SimError::Overflow`].
pub fn simulate(plan: &Plan, mut opts: SimOptions) -> Result<SimResult, SimError> {
    if let Some(r) = state_check::construction_oom(plan, &mut opts)? {
        return Ok(r);
    }
    simulate_lowered(plan, opts)
}

/// Lowers the plan's model and simulates every stage (no model-state check first).
fn simulate_lowered(plan: &Plan, mut opts: SimOptions) -> Result<SimResult, SimError> {
    let program = crate::lower::lower_plan(plan).map_err(|e| SimError::Model(e.0))?;
    let stages = plan.parallel.pipeline_stages.max(1);
    if stages == 1 {
        let (timeline, summary, snapshot) = simulate_stage(plan, &program, 0, 1, &mut opts)?;
        return Ok(SimResult {
            timeline,
            stages: vec![summary.clone()],
            summary,
            snapshot,
        });
    }
    let parts = crate::lower::split_stages(&program, stages).map_err(|e| SimError::Model(e.0))?;
    let mut best: Option<(Timeline, Summary, Option<trainmem_alloc::Snapshot>)> = None;
    let mut all = Vec::new();
    for (i, part) in parts.iter().enumerate() {
        let r = simulate_stage(plan, part, i as u64, stages, &mut opts)?;
        all.push(r.1.clone());
        if best
            .as_ref()
            .is_none_or(|b| r.1.peak_allocated > b.1.peak_allocated)
        {
            best = Some(r);
        }
    }
    let (timeline, summary, snapshot) = best.expect("at least one stage");
    Ok(SimResult {
        timeline,
        summary,
        stages: all,
        snapshot,
    })
}
