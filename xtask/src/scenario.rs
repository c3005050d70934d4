//! `cargo xtask scenario NAME|all|--list [--backend flex|cuda] [--mode measured|simulated|both]
//! [--json] [--out DIR]`: every documented memory pattern, reproduced on a real burn training
//! run beside its simulated twin.
//!
//! A scenario loads its plan from `fixtures/scenarios/NAME.toml`, runs it (measured on burn,
//! simulated by trainmem-sim, or both), checks the pattern on every timeline it has, runs the
//! knob that removes the pattern and checks that too. The runner prints the measured timeline
//! as a chart with the twin overlaid, the verdicts with their figures and the twin's error per
//! category at the peak, and writes `report.md`, `timeline.json`, `timeline.svg`, `trace.json`
//! (Chrome trace) and `memory_viz.pickle` to `target/scenarios/NAME/`. It exits non-zero when
//! a pattern or knob did not come out as expected (and, with `--strict-twin`, when the twin
//! misses its accuracy target).
//!
//! Adding a scenario: write `scenario/NAME.rs` with `pub fn run(ctx: &mut Ctx) ->
//! anyhow::Result<()>` and `pub const EXPLANATION: &[&str]`, add its plan to
//! `fixtures/scenarios/`, and add one entry to [`SCENARIOS`].

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};

pub mod checks;
pub mod ctx;
pub mod output;
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

pub use ctx::{Backend, Ctx, Mode};
pub use report::ScenarioReport;

/// One registered scenario.
#[derive(Debug, Clone, Copy)]
pub struct Scenario {
    /// Name on the command line.
    pub name: &'static str,
    /// The pattern, in one line.
    pub description: &'static str,
    /// The source articles (seeds/) that document it.
    pub sources: &'static str,
    /// Which bytes cause it and what removes it, in paragraphs.
    pub explanation: &'static [&'static str],
    /// Runs it.
    pub run: fn(&mut Ctx) -> anyhow::Result<()>,
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

/// The catalogue (DESIGN.md), in its order.
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
    name: Option<String>,
    /// List the scenarios with a one-line description.
    #[arg(long)]
    list: bool,
    /// Backend of the measured runs.
    #[arg(long, value_enum, default_value = "flex")]
    backend: Backend,
    /// Real runs, the simulated twin, or both side by side.
    #[arg(long, value_enum, default_value = "both")]
    mode: Mode,
    /// Print the report as one JSON object instead of the text view (with `all`:
    /// `{"scenarios": [...]}`).
    #[arg(long)]
    json: bool,
    /// Output directory (default `target/scenarios/NAME/`; with `all`, one subdirectory per
    /// scenario under DIR).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Also fail when the twin misses its accuracy target (2% for parameters, gradients and
    /// optimizer state; 10% for activations and input).
    #[arg(long)]
    strict_twin: bool,
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
) -> anyhow::Result<ScenarioReport> {
    let mut ctx = Ctx::new(mode, backend, work_dir, progress);
    (scenario.run)(&mut ctx).with_context(|| format!("scenario {}", scenario.name))?;
    Ok(output::build_report(scenario, ctx))
}

/// Runs the scenarios the arguments name.
pub fn run(args: ScenarioArgs) -> anyhow::Result<ExitCode> {
    if args.list {
        let width = SCENARIOS.iter().map(|s| s.name.len()).max().unwrap_or(0);
        for s in SCENARIOS {
            println!("{:width$}  {}", s.name, s.description);
        }
        return Ok(ExitCode::SUCCESS);
    }
    let name = args.name.as_deref().unwrap_or_default();
    let selected: Vec<&Scenario> = if name == "all" {
        SCENARIOS.iter().collect()
    } else {
        match find(name) {
            Some(s) => vec![s],
            None => {
                let names: Vec<&str> = SCENARIOS.iter().map(|s| s.name).collect();
                bail!(
                    "no scenario `{name}`; known: {} (or `all`)",
                    names.join(", ")
                )
            }
        }
    };
    args.backend.choice()?;

    let several = selected.len() > 1;
    let mut reports = Vec::new();
    let mut failed = Vec::new();
    let mut twin_missed = Vec::new();
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
        let dir = out_dir(args.out.as_deref(), scenario.name, several);
        let started = std::time::Instant::now();
        let mut report = execute(scenario, args.mode, args.backend, dir.clone(), !args.json)?;
        report
            .notes
            .push(format!("ran in {:.1} s", started.elapsed().as_secs_f64()));
        output::write_outputs(&mut report, &dir)?;
        if !args.json {
            print!("{}", report::render_text(&report));
            println!("wrote {}\n", dir.display());
        }
        if !report.all_reproduced() {
            failed.push(scenario.name);
        }
        if !report.twin_misses().is_empty() {
            twin_missed.push(scenario.name);
        }
        reports.push(report);
    }
    if several && !args.json {
        print!("{}", output::summary_table(&reports));
    }
    if args.json {
        let value = if !several {
            serde_json::to_value(&reports[0])?
        } else {
            serde_json::json!({ "scenarios": reports })
        };
        println!("{}", serde_json::to_string_pretty(&value)?);
    }
    let mut ok = true;
    if !failed.is_empty() {
        eprintln!("not reproduced: {}", failed.join(", "));
        ok = false;
    }
    if !twin_missed.is_empty() {
        eprintln!(
            "twin outside its accuracy target in: {}",
            twin_missed.join(", ")
        );
        if args.strict_twin {
            ok = false;
        }
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Where a scenario's files go.
fn out_dir(out: Option<&Path>, name: &str, several: bool) -> PathBuf {
    match out {
        Some(dir) if several => dir.join(name),
        Some(dir) => dir.to_path_buf(),
        None => target_dir().join("scenarios").join(name),
    }
}

/// The workspace's target directory (`CARGO_TARGET_DIR` when set).
fn target_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(dir);
    }
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(|root| root.join("target"))
        .unwrap_or_else(|| PathBuf::from("target"))
}

#[cfg(test)]
mod tests;
