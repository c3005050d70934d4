//! trainmem-scenarios: the catalogue of training-memory patterns.
//!
//! Each [`Scenario`] is one pattern people lose days to (host memory spiking at every epoch
//! start, the optimizer doubling the footprint at step one, memory that creeps up per batch,
//! ...), defined once: a plan ([`plans`], compiled in), the runs it makes, and the rules that
//! judge them. A run is made on a real burn training run (host bytes per category from
//! trainmem-probe's counting allocator, or device bytes on CUDA), on trainmem-sim's prediction
//! of the same plan (the *twin*: the simulator run on the plan the real run trained), or both.
//! Every rule is applied to every timeline the run has, so the same sentence judges the
//! measurement and the prediction. A scenario also runs the setting that removes the pattern
//! (its *knob*, e.g. `loader.persistent_workers = true`) and judges that the pattern is gone.
//!
//! The library returns data: [`execute`] runs one scenario into a [`ScenarioReport`] (the
//! verdicts with their figures, the prediction's error per category at the peak from
//! trainmem-core's [`compare`](trainmem_core::compare), every run's timelines), and
//! [`output`] renders it (text with the measured timeline charted and the prediction overlaid,
//! JSON) and writes `report.md`, `timeline.json`, `timeline.svg`, `trace.json` (Chrome trace)
//! and `memory_viz.pickle`. The command around it (`trainmem scenario NAME`, `cargo xtask
//! scenario NAME`: arguments, printing, exit codes) is `trainmem::scenario_command`, in the
//! `trainmem` package.
//!
//! With `--meta` ([`Ctx::meta`]) every measured run's plan is also trained on trainmem-meta
//! (burn's code with tensors that have shapes and no data, through the same training loop), and
//! its tensor bytes per category are held to the measured run's at every phase boundary
//! ([`meta`]: within 1% + 16 KiB).
//!
//! Measured runs count host bytes per category only when the binary installs trainmem-probe's
//! counting allocator (`#[global_allocator] static A: trainmem_probe::CountingAlloc = ...`);
//! without it a measured run is an error that says so.
//!
//! ```
//! use trainmem_burn::BackendChoice;
//! use trainmem_scenarios::{Mode, execute, find};
//! let scenario = find("optimizer-jump").expect("in the catalogue");
//! let dir = std::env::temp_dir().join("trainmem-doc-optimizer-jump");
//! // The prediction only: fast, and no counting allocator needed.
//! let report = execute(scenario, Mode::Simulated, BackendChoice::Flex, dir, false)?;
//! assert!(report.all_reproduced());
//! # Ok::<(), trainmem_scenarios::ScenarioError>(())
//! ```
//!
//! Adding a scenario: write `src/catalogue/NAME.rs` (listed in `catalogue/mod.rs`) with `pub fn run(ctx: &mut Ctx) ->
//! Result<()>` and `pub const EXPLANATION: &[&str]`, add its plan as
//! `plans/NAME.toml` (and to [`plans::PLANS`]), and add one entry to [`SCENARIOS`].

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};

use trainmem_burn::BackendChoice;
use trainmem_core::Plan;

#[macro_use]
pub mod error;
pub mod checks;
pub mod ctx;
pub mod isolate;
pub mod meta;
pub mod output;
pub mod plans;
pub mod replay;
pub mod report;
mod twin_device;

mod catalogue;
use catalogue::*;

pub use ctx::{Ctx, Mode, Recorded, backend_available};
use error::Result;
pub use error::ScenarioError;
pub use isolate::{ChildCommand, Isolation, serve_child};
pub use report::ScenarioReport;
pub use twin_device::TwinDevice;

/// One registered scenario.
#[derive(Debug, Clone, Copy)]
pub struct Scenario {
    /// Name on the command line.
    pub name: &'static str,
    /// The pattern, in one line.
    pub description: &'static str,
    /// The published articles that document the pattern.
    pub sources: &'static str,
    /// Which bytes cause it and what removes it, in paragraphs.
    pub explanation: &'static [&'static str],
    /// Runs it.
    pub run: fn(&mut Ctx) -> Result<()>,
}

macro_rules! scenario {
    ($name:literal, $module:ident, $sources:literal, $description:literal) => {
        Scenario {
            name: $name,
            description: $description,
            sources: $sources,
            explanation: $module::EXPLANATION,
            run: $module::run,
        }
    };
}

/// empty-cache's plan as it runs on a GPU (`--backend cuda`): the plan trainmem-meta's cubecl
/// model is held to on the lent devices.
pub fn empty_cache_gpu_plan() -> Result<Plan> {
    let plan = plans::load("empty-cache").map_err(error::plan_error(
        "loading the plan `empty-cache`".to_string(),
    ))?;
    Ok(empty_cache::gpu_plan(&plan))
}

/// The catalogue, in the order the reports list it (ARCHITECTURE.md says how to add one).
pub const SCENARIOS: &[Scenario] = &[
    scenario!(
        "epoch-spike",
        epoch_spike,
        "000",
        "host memory peaks in the first batches of each epoch (workers restarted, prefetch \
         refilled, augmentation scratch); persistent workers flatten later epochs"
    ),
    scenario!(
        "optimizer-jump",
        optimizer_jump,
        "001, 000",
        "+2x parameter bytes at the first Adam step, +1x for momentum, 0 for SGD; flat afterwards"
    ),
    scenario!(
        "startup",
        startup,
        "002",
        "parameter bytes at construction (eager) vs at first forward (lazy); the graph is built \
         on the first forward"
    ),
    scenario!(
        "activation-retention",
        activation_retention,
        "002, 004",
        "activations are held from forward until backward frees them"
    ),
    scenario!(
        "per-batch-plateau",
        per_batch_plateau,
        "004",
        "after the first step, memory per step is flat"
    ),
    scenario!(
        "retained-leak",
        retained_leak,
        "004, 003",
        "keeping graph-holding outputs across steps grows memory linearly; clearing stops it"
    ),
    scenario!(
        "grad-accumulation",
        grad_accumulation,
        "002, 003, 001",
        "peak activation memory scales with the micro-batch, not the effective batch"
    ),
    scenario!(
        "empty-cache",
        empty_cache,
        "003",
        "after an epoch reserved >> allocated; empty_cache returns only fully free segments; a \
         fragmentation OOM while total free memory would suffice (caching allocator over the \
         run's tensor sizes)"
    ),
    scenario!(
        "checkpoint-save",
        checkpoint_save,
        "001",
        "a spike of about the model size while a checkpoint is written"
    ),
    scenario!(
        "logging-growth",
        logging_growth,
        "001",
        "keeping per-step metric tensors grows memory; keeping scalars does not"
    ),
    scenario!(
        "mixed-precision",
        mixed_precision,
        "004",
        "half precision halves parameter and activation bytes"
    ),
    scenario!(
        "grad-checkpointing",
        grad_checkpointing,
        "004, 001",
        "recomputation trades activation memory for compute"
    ),
    scenario!(
        "memmap-vs-preload",
        memmap_vs_preload,
        "001, 002",
        "a memory-mapped data set costs page cache (RssFile); a preloaded one costs RssAnon = \
         data size"
    ),
    scenario!(
        "pinned-staging",
        pinned_staging,
        "003",
        "pinned host staging buffers and their rounding"
    ),
    scenario!(
        "model-parallel",
        model_parallel,
        "003",
        "per-device memory when layers are split across devices (simulated)"
    ),
];

/// Looks a scenario up by name.
pub fn find(name: &str) -> Option<&'static Scenario> {
    SCENARIOS.iter().find(|s| s.name == name)
}

/// Runs one scenario into its report (no files written).
pub fn execute(
    scenario: &Scenario,
    mode: Mode,
    backend: BackendChoice,
    work_dir: PathBuf,
    progress: bool,
) -> Result<ScenarioReport> {
    execute_on(scenario, None, mode, backend, work_dir, progress)
}

/// Runs one scenario on `plan` instead of its own (when `Some`): the same runs, knobs and
/// rules, judged on another model or setting (no files written).
pub fn execute_on(
    scenario: &Scenario,
    plan: Option<Plan>,
    mode: Mode,
    backend: BackendChoice,
    work_dir: PathBuf,
    progress: bool,
) -> Result<ScenarioReport> {
    let mut ctx = Ctx::new(mode, backend, work_dir, progress);
    ctx.plan_override = plan;
    execute_in(scenario, ctx)
}

/// Runs one scenario in a context the caller set up (its plan override, and where measured
/// runs are made: [`Ctx::isolation`]) into its report (no files written).
pub fn execute_in(scenario: &Scenario, mut ctx: Ctx) -> Result<ScenarioReport> {
    (scenario.run)(&mut ctx).map_err(|e| ScenarioError::InScenario {
        name: scenario.name,
        source: Box::new(e),
    })?;
    Ok(output::build_report(scenario, ctx))
}

/// Judges `scenario` again on measured runs recorded elsewhere (`runs/<label>.json`, as
/// [`Recorded::Save`] wrote them, for instance by `cargo xtask gpu-check` on a lent GPU):
/// nothing is trained, the twin is simulated for `backend` on `device` (a GPU plan when it is
/// CUDA or wgpu, with the recording's fusion and alignment) and the verdicts are today's.
/// `work_dir` takes whatever the scenario writes. The recorded runs carry no allocation trace
/// when they were trimmed for committing, and their checkpoint files stay where they were
/// written.
pub fn judge_recorded(
    scenario: &Scenario,
    runs: &Path,
    backend: BackendChoice,
    device: TwinDevice,
    work_dir: PathBuf,
) -> Result<ScenarioReport> {
    let mut ctx = Ctx::new(Mode::Both, backend, work_dir, false);
    ctx.twin_device = device;
    ctx.recorded = Some(Recorded::Load(runs.to_path_buf()));
    execute_in(scenario, ctx)
}

#[cfg(test)]
mod tests;
