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
//! [`run`] is the command (`trainmem scenario NAME`, `cargo xtask scenario NAME`): it prints
//! the measured timeline as a chart with the prediction overlaid, the verdicts with their
//! figures, the prediction's error per category at the peak (trainmem-core's
//! [`compare`](trainmem_core::compare)), and writes `report.md`, `timeline.json`,
//! `timeline.svg`, `trace.json` (Chrome trace) and `memory_viz.pickle` per scenario.
//!
//! With `--meta` ([`Ctx::meta`]) every measured run's plan is also trained on trainmem-meta
//! (burn's code with tensors that have shapes and no data, through the same training loop), and
//! its tensor bytes per category are held to the measured run's at every phase boundary
//! ([`meta`]: within 1% + 16 KiB).
//!
//! Exit codes of [`run`]: 0 when every pattern and knob came out as expected; 1 when one did
//! not ([`EXIT_NOT_REPRODUCED`]); 3 with `--strict-twin` when the prediction missed its
//! accuracy target but every pattern reproduced ([`EXIT_TWIN_MISSED`]); 2 for an unknown
//! scenario name ([`EXIT_USAGE`], as for other usage errors); 4 with `--meta` when trainmem-meta
//! disagrees with a measured run but every pattern reproduced ([`EXIT_META_DISAGREES`]).
//!
//! Measured runs count host bytes per category only when the binary installs trainmem-probe's
//! counting allocator (`#[global_allocator] static A: trainmem_probe::CountingAlloc = ...`);
//! without it a measured run is an error that says so.
//!
//! ```
//! use trainmem_scenarios::{Backend, Mode, execute, find};
//! let scenario = find("optimizer-jump").expect("in the catalogue");
//! let dir = std::env::temp_dir().join("trainmem-doc-optimizer-jump");
//! // The prediction only: fast, and no counting allocator needed.
//! let report = execute(scenario, Mode::Simulated, Backend::Flex, dir, false)?;
//! assert!(report.all_reproduced());
//! # Ok::<(), trainmem_scenarios::ScenarioError>(())
//! ```
//!
//! Adding a scenario: write `src/NAME.rs` with `pub fn run(ctx: &mut Ctx) ->
//! Result<()>` and `pub const EXPLANATION: &[&str]`, add its plan as
//! `plans/NAME.toml` (and to [`plans::PLANS`]), and add one entry to [`SCENARIOS`].

#![forbid(unsafe_code)]

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

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

mod activation_retention;
mod checkpoint_save;
mod empty_cache;
mod epoch_spike;
mod grad_accumulation;
mod grad_checkpointing;
mod logging_growth;
mod memmap_vs_preload;
mod mixed_precision;
mod model_parallel;
mod optimizer_jump;
mod per_batch_plateau;
mod pinned_staging;
mod retained_leak;
mod startup;

pub use ctx::{Backend, Ctx, Mode, Recorded};
use error::Result;
pub use error::ScenarioError;
pub use isolate::{ChildCommand, Isolation, serve_child};
pub use report::ScenarioReport;

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

/// Arguments of `scenario`.
#[derive(Debug, clap::Args)]
pub struct ScenarioArgs {
    /// Scenario to run, or `all`.
    #[arg(required_unless_present = "list")]
    pub name: Option<String>,
    /// List the scenarios with a one-line description.
    #[arg(long)]
    pub list: bool,
    /// Backend of the measured runs.
    #[arg(long, value_enum, default_value = "flex")]
    pub backend: Backend,
    /// Real runs, the simulated twin, or both side by side.
    #[arg(long, value_enum, default_value = "both")]
    pub mode: Mode,
    /// Print the report as one JSON object instead of the text view (with `all`:
    /// `{"scenarios": [...]}`).
    #[arg(long)]
    pub json: bool,
    /// Output directory (default `target/scenarios/NAME/` from `cargo xtask`,
    /// `trainmem-scenarios/NAME/` from `trainmem`; with `all`, one subdirectory per
    /// scenario under DIR).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Also fail when the twin misses its accuracy target (2% for parameters, gradients and
    /// optimizer state; 10% for activations and input, plus the loader's scheduling slack for
    /// input under a multi-worker loader).
    #[arg(long)]
    pub strict_twin: bool,
    /// Run the scenario on this plan file instead of its own: the same runs, knobs and rules,
    /// judged on your model and settings (one scenario only, not `all`).
    #[arg(long, value_name = "FILE")]
    pub plan: Option<PathBuf>,
    /// Make the measured runs in this process instead of each in a fresh child process. The
    /// figures read from the OS (RssAnon, RssFile) then include what earlier runs left
    /// resident, so verdicts can depend on the order the scenarios ran in.
    #[arg(long)]
    pub in_process: bool,
    /// Also train every measured run's plan on trainmem-meta (burn's code on a backend whose
    /// tensors have shapes and no data, with the same training loop) and compare its tensor
    /// bytes per category with the measured run's at every phase boundary; exit 4 when they
    /// differ by more than 1% + 16 KiB anywhere. Needs measured runs on Flex.
    #[arg(long)]
    pub meta: bool,
}

/// Looks a scenario up by name.
pub fn find(name: &str) -> Option<&'static Scenario> {
    SCENARIOS.iter().find(|s| s.name == name)
}

/// Runs one scenario into its report (no files written).
pub fn execute(
    scenario: &Scenario,
    mode: Mode,
    backend: Backend,
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
    backend: Backend,
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
/// nothing is trained, the twin is simulated for `backend` (a GPU plan when it is CUDA) and
/// the verdicts are today's. `work_dir` takes whatever the scenario writes. The recorded runs
/// carry no allocation trace when they were trimmed for committing, and their checkpoint files
/// stay where they were written.
pub fn judge_recorded(
    scenario: &Scenario,
    runs: &Path,
    backend: Backend,
    work_dir: PathBuf,
) -> Result<ScenarioReport> {
    let mut ctx = Ctx::new(Mode::Both, backend, work_dir, false);
    ctx.recorded = Some(Recorded::Load(runs.to_path_buf()));
    execute_in(scenario, ctx)
}

/// Exit code when a pattern or knob did not come out as expected.
pub const EXIT_NOT_REPRODUCED: u8 = 1;
/// Exit code for an unknown scenario name (clap uses 2 for other usage errors too).
pub const EXIT_USAGE: u8 = 2;
/// Exit code with `--strict-twin` when every pattern reproduced but the prediction missed its
/// accuracy target.
pub const EXIT_TWIN_MISSED: u8 = 3;
/// Exit code with `--meta` when every pattern reproduced but trainmem-meta's tensor bytes
/// disagree with a measured run's (beyond 1% + 16 KiB of a category at a phase boundary).
pub const EXIT_META_DISAGREES: u8 = 4;

/// Runs the scenarios the arguments name; files go under `default_out/NAME/` unless `--out`
/// says otherwise.
///
/// Measured runs are made each in a fresh child process, the running binary started again
/// (unless `--in-process`): the binary must call [`serve_child`] first thing in `main` and
/// return its exit code when it gives one.
pub fn run(args: ScenarioArgs, default_out: &Path) -> Result<ExitCode> {
    if args.list {
        print_list();
        return Ok(ExitCode::SUCCESS);
    }
    let Some(selected) = select(args.name.as_deref().unwrap_or_default()) else {
        return Ok(ExitCode::from(EXIT_USAGE));
    };
    args.backend.choice()?;
    if let Some(why) = meta_refused(args.meta, args.mode, args.backend) {
        eprintln!("error: {why}");
        return Ok(ExitCode::from(EXIT_USAGE));
    }
    let plan = match &args.plan {
        Some(_) if selected.len() > 1 => {
            eprintln!("error: --plan applies to one scenario, not `all`");
            return Ok(ExitCode::from(EXIT_USAGE));
        }
        Some(path) => Some(
            Plan::load(path).map_err(error::plan_error(format!("--plan {}", path.display())))?,
        ),
        None => None,
    };
    let reports = run_selected(&args, &selected, plan, default_out)?;
    finish(&args, &reports)
}

/// Why `--meta` cannot be used with this mode and backend, when it cannot: Meta is compared
/// with measured runs on Flex.
fn meta_refused(meta: bool, mode: Mode, backend: Backend) -> Option<&'static str> {
    (meta && (!mode.measured() || backend != Backend::Flex)).then_some(
        "--meta compares trainmem-meta with measured runs on Flex; use it with --mode both or \
         --mode measured, and --backend flex",
    )
}

/// `--list`: one line per scenario.
fn print_list() {
    let width = SCENARIOS.iter().map(|s| s.name.len()).max().unwrap_or(0);
    let mut out = std::io::stdout().lock();
    for s in SCENARIOS {
        // A closed pipe (`--list | head`) ends the listing, not the program.
        if writeln!(out, "{:width$}  {}", s.name, s.description).is_err() {
            break;
        }
    }
}

/// The scenarios `name` selects (`all`, or one by name); `None` after saying on stderr that
/// there is no such scenario and which there are.
fn select(name: &str) -> Option<Vec<&'static Scenario>> {
    if name == "all" {
        return Some(SCENARIOS.iter().collect());
    }
    let found = find(name);
    if found.is_none() {
        let names: Vec<&str> = SCENARIOS.iter().map(|s| s.name).collect();
        eprintln!(
            "error: no scenario `{name}`; known: {} (or `all`; `--list` describes them)",
            names.join(", ")
        );
    }
    found.map(|s| vec![s])
}

/// Runs each selected scenario, writes its files and (unless `--json`) prints its report.
fn run_selected(
    args: &ScenarioArgs,
    selected: &[&Scenario],
    plan: Option<Plan>,
    default_out: &Path,
) -> Result<Vec<ScenarioReport>> {
    let several = selected.len() > 1;
    let mut reports = Vec::new();
    for (i, scenario) in selected.iter().enumerate() {
        if !args.json {
            eprintln!(
                "[{}/{}] scenario {} ({:?})",
                i + 1,
                selected.len(),
                scenario.name,
                args.mode
            );
        }
        let dir = out_dir(args.out.as_deref(), default_out, scenario.name, several);
        let started = std::time::Instant::now();
        let mut ctx = Ctx::new(args.mode, args.backend, dir.clone(), !args.json);
        ctx.plan_override = plan.clone();
        ctx.isolation = isolation(args)?;
        ctx.meta = args.meta;
        let mut report = execute_in(scenario, ctx)?;
        report
            .notes
            .push(format!("ran in {:.1} s", started.elapsed().as_secs_f64()));
        output::write_outputs(&mut report, &dir)?;
        if !args.json {
            print!("{}", report::render_text(&report));
            println!("wrote {}\n", dir.display());
        }
        reports.push(report);
    }
    Ok(reports)
}

/// Where the command makes measured runs: each in a fresh child process (this binary,
/// re-executed), unless `--in-process` or nothing is measured.
fn isolation(args: &ScenarioArgs) -> Result<Isolation> {
    if args.in_process || !args.mode.measured() {
        return Ok(Isolation::InProcess);
    }
    let cmd = ChildCommand::this_binary().map_err(|e| ScenarioError::Child {
        label: "every measured run".to_string(),
        detail: format!("cannot find this binary to run it again: {e}"),
    })?;
    Ok(Isolation::Child(cmd))
}

/// Prints the summary table (several scenarios) or the JSON report, names the scenarios that
/// failed, and returns the exit code.
fn finish(args: &ScenarioArgs, reports: &[ScenarioReport]) -> Result<ExitCode> {
    let several = reports.len() > 1;
    if several && !args.json {
        print!("{}", output::summary_table(reports));
    }
    if args.json {
        let value = match reports {
            [one] => serde_json::to_value(one)?,
            _ => serde_json::json!({ "scenarios": reports }),
        };
        println!("{}", serde_json::to_string_pretty(&value)?);
    }
    let failed: Vec<&str> = reports
        .iter()
        .filter(|r| !r.all_reproduced())
        .map(|r| r.name.as_str())
        .collect();
    let twin_missed: Vec<&str> = reports
        .iter()
        .filter(|r| !r.twin_misses().is_empty())
        .map(|r| r.name.as_str())
        .collect();
    if !twin_missed.is_empty() {
        eprintln!(
            "twin outside its accuracy target in: {}",
            twin_missed.join(", ")
        );
    }
    let meta_disagrees: Vec<String> = reports
        .iter()
        .flat_map(|r| {
            r.meta_disagreements()
                .into_iter()
                .map(move |(run, what)| format!("{} / {run}: {what}", r.name))
        })
        .collect();
    for line in &meta_disagrees {
        eprintln!("trainmem-meta disagrees with the measured run: {line}");
    }
    if !failed.is_empty() {
        eprintln!("not reproduced: {}", failed.join(", "));
    }
    Ok(ExitCode::from(exit_code(
        !failed.is_empty(),
        !twin_missed.is_empty(),
        args.strict_twin,
        !meta_disagrees.is_empty(),
    )))
}

/// The exit code of a finished run: a pattern not reproduced outranks Meta disagreeing with a
/// measured run (`--meta`), which outranks a missed twin target, which counts only under
/// `--strict-twin`.
pub fn exit_code(
    not_reproduced: bool,
    twin_missed: bool,
    strict_twin: bool,
    meta_disagrees: bool,
) -> u8 {
    if not_reproduced {
        EXIT_NOT_REPRODUCED
    } else if meta_disagrees {
        EXIT_META_DISAGREES
    } else if twin_missed && strict_twin {
        EXIT_TWIN_MISSED
    } else {
        0
    }
}

/// Where a scenario's files go: `--out` itself for one scenario, `--out/NAME` for several,
/// `default_out/NAME` without `--out`.
fn out_dir(out: Option<&Path>, default_out: &Path, name: &str, several: bool) -> PathBuf {
    match out {
        Some(dir) if several => dir.join(name),
        Some(dir) => dir.to_path_buf(),
        None => default_out.join(name),
    }
}

#[cfg(test)]
mod tests;
