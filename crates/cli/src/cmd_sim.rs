//! `trainmem simulate`, `fit` and `explain`: the simulator's commands.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use trainmem_alloc::pytorch::pickle;
use trainmem_core::Plan;
use trainmem_core::bytes::{human, parse_bytes};
use trainmem_core::export::{chrome, files, svg, timeline_json};
use trainmem_sim::{FitTarget, Machine, SimOptions, SimResult};

use crate::progress::{ProgressFlags, Reporter};

/// Arguments of `trainmem simulate`.
#[derive(Debug, clap::Args)]
pub struct SimulateArgs {
    /// The plan file (TOML).
    pub plan: PathBuf,
    /// Print the report and the timeline as JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Write exports to this directory: timeline.json, report.json, report.txt,
    /// trace.json (Chrome/Perfetto counters), timeline.svg, memory_viz.pickle.
    #[arg(short, long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Simulate at most this many optimizer steps (at least 1).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub steps: Option<u64>,
    /// Allocator trace entries kept for memory_viz.pickle (most recent).
    #[arg(long, default_value_t = 200_000)]
    pub trace_entries: usize,
    /// Show no progress (by default: a bar on a terminal, else a line on stderr every few
    /// seconds of a long simulation).
    #[arg(long, conflicts_with = "progress")]
    pub quiet: bool,
    /// Print a progress line on stderr every few seconds, on a terminal too.
    #[arg(long)]
    pub progress: bool,
}

/// Arguments of `trainmem fit`.
#[derive(Debug, clap::Args)]
pub struct FitArgs {
    /// The plan file (TOML).
    pub plan: PathBuf,
    /// Device capacity to fit, e.g. `24GiB` (default: the plan's).
    #[arg(long, value_parser = parse_capacity)]
    pub capacity: Option<u64>,
    /// What to search: `batch`, or `micro-batch` (keeping the accumulation steps). Default:
    /// micro-batch when the plan accumulates gradients, else batch.
    #[arg(long, value_enum)]
    pub what: Option<FitWhat>,
    /// Largest size to try (at least 1).
    #[arg(long, default_value_t = 1 << 16, value_parser = parse_limit)]
    pub max: u64,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Show no progress (by default a line on stderr every few seconds of a long search).
    #[arg(long, conflicts_with = "progress")]
    pub quiet: bool,
    /// Print a progress line on stderr every few seconds.
    #[arg(long)]
    pub progress: bool,
}

/// What `fit` varies.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum FitWhat {
    /// The batch size (no accumulation).
    Batch,
    /// The micro-batch size.
    MicroBatch,
}

/// Arguments of `trainmem explain`.
#[derive(Debug, clap::Args)]
pub struct ExplainArgs {
    /// The plan file (TOML), or a PyTorch memory snapshot pickle
    /// (`torch.cuda.memory._dump_snapshot()`): named *.pickle or *.pkl, or recognised by its first
    /// bytes.
    pub plan: PathBuf,
    /// Snapshots: write report.txt, report.json, the timeline exports `simulate --out` writes
    /// (timeline.json, trace.json, timeline.svg) and the snapshot annotated with categories
    /// (snapshot.annotated.pickle, for pytorch.org/memory_viz) to this directory.
    #[arg(short, long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// The device capacity the remedies are judged on, e.g. `24GiB`. Snapshots: default the
    /// capacity the run ran out of memory on, if it did; plans: default the plan's.
    #[arg(long, value_parser = parse_capacity)]
    pub capacity: Option<u64>,
    /// Snapshots: which device's trace to explain (default: the first with a trace).
    #[arg(long, value_name = "N")]
    pub device: Option<usize>,
    /// Snapshots: allocation sites listed per moment.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// Plans: leave out the "what would fit" section (each of the plan's knobs simulated
    /// when it does not fit or comes within 10% of the capacity).
    #[arg(long)]
    pub no_remedies: bool,
    /// Simulate at most this many optimizer steps (at least 1).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub steps: Option<u64>,
    /// Print JSON: for a plan, `{"findings": [...], "what_would_fit": {...} or null}` (the
    /// section the text ends with when the plan does not fit); for a snapshot, the report.
    #[arg(long)]
    pub json: bool,
    /// Show no progress (by default: a bar on a terminal, else a line on stderr every few
    /// seconds of a long simulation).
    #[arg(long, conflicts_with = "progress")]
    pub quiet: bool,
    /// Print a progress line on stderr every few seconds, on a terminal too.
    #[arg(long)]
    pub progress: bool,
}

fn parse_capacity(s: &str) -> Result<u64, String> {
    match parse_bytes(s)? {
        0 => Err("capacity must be more than 0 bytes".into()),
        b => Ok(b),
    }
}

fn parse_limit(s: &str) -> Result<u64, String> {
    match s.parse::<u64>().map_err(|e| e.to_string())? {
        0 => Err("the largest size to try must be at least 1".into()),
        n => Ok(n),
    }
}

fn load(path: &PathBuf) -> anyhow::Result<Plan> {
    Ok(Plan::load(path)?)
}

fn run_sim(
    plan: &Plan,
    steps: Option<u64>,
    trace: Option<usize>,
    flags: ProgressFlags,
) -> anyhow::Result<SimResult> {
    let total = steps.map_or(plan.total_steps(), |s| s.min(plan.total_steps()));
    let mut reporter = Reporter::new("simulating", flags, total);
    let mut tick = |done: u64, total: u64| reporter.step(done, total);
    let opts = SimOptions {
        // the run is predicted for the machine the command runs on
        machine: Machine::detect(),
        trace_entries: trace,
        progress: Some(&mut tick),
        max_steps: steps,
    };
    let r = trainmem_sim::simulate(plan, opts).context("simulation failed")?;
    reporter.finish();
    Ok(r)
}

/// The simulating commands build and free the model's whole simulated state, once per
/// simulation (`fit` runs many): keep what they free in the heap for the next one instead of
/// faulting it in again (`trainmem_probe::heap`). These commands measure no host memory, so
/// memory kept resident changes no figure they print.
fn keep_freed_heap() {
    trainmem_probe::heap::retain_freed_heap();
}

/// Writes a timeline's exports through `write(name, bytes)`: the timeline JSON, the Chrome
/// trace and the SVG chart (`simulate --out`, and `explain SNAPSHOT.pickle --out`).
pub(crate) fn write_timeline_exports(
    write: &impl Fn(&str, &[u8]) -> anyhow::Result<()>,
    t: &trainmem_core::timeline::Timeline,
) -> anyhow::Result<()> {
    write(files::TIMELINE_JSON, timeline_json(t)?.as_bytes())?;
    write(files::TRACE_JSON, chrome::chrome_trace(t)?.as_bytes())?;
    write(files::TIMELINE_SVG, svg::render_svg(t).as_bytes())
}

/// Runs `trainmem simulate`.
pub fn simulate(args: SimulateArgs) -> anyhow::Result<ExitCode> {
    keep_freed_heap();
    let plan = load(&args.plan)?;
    let trace = args.out.as_ref().map(|_| args.trace_entries);
    let flags = ProgressFlags {
        quiet: args.quiet,
        lines: args.progress,
        no_bar: args.json,
    };
    let r = run_sim(&plan, args.steps, trace, flags)?;
    let rep = trainmem_sim::report(&plan, &r);
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let write = |name: &str, bytes: &[u8]| -> anyhow::Result<()> {
            let p = dir.join(name);
            std::fs::write(&p, bytes).with_context(|| format!("writing {}", p.display()))
        };
        write_timeline_exports(&write, &r.timeline)?;
        write(
            files::REPORT_JSON,
            trainmem_sim::report::report_json(&rep)?.as_bytes(),
        )?;
        write(
            files::REPORT_TXT,
            trainmem_sim::render_text(&plan, &rep).as_bytes(),
        )?;
        if let Some(snap) = &r.snapshot {
            write(files::MEMORY_VIZ_PICKLE, &pickle::to_bytes(snap)?)?;
        }
        if !args.json {
            eprintln!(
                "wrote {}/{{timeline.json, report.json, report.txt, trace.json, timeline.svg{}}}",
                dir.display(),
                if r.snapshot.is_some() {
                    ", memory_viz.pickle"
                } else {
                    ""
                }
            );
        }
    }
    if args.json {
        let v = serde_json::json!({ "report": rep, "timeline": r.timeline });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!("{}", trainmem_sim::render_text(&plan, &rep));
    }
    Ok(if r.summary.oom.is_some() {
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    })
}

/// Runs `trainmem fit`: the size it prints fits when the plan at that size is simulated with
/// all its own steps on the capacity (what `trainmem simulate` predicts for it), and the
/// sizes just above it that it names do not (`trainmem_sim::fit` says what is guaranteed).
pub fn fit(args: FitArgs) -> anyhow::Result<ExitCode> {
    keep_freed_heap();
    let plan = load(&args.plan)?;
    let capacity = args.capacity.unwrap_or(plan.device.capacity.0);
    let target = match args.what {
        Some(FitWhat::Batch) => FitTarget::Batch,
        Some(FitWhat::MicroBatch) => FitTarget::MicroBatch,
        None if plan.accumulation_steps() > 1 => FitTarget::MicroBatch,
        None => FitTarget::Batch,
    };
    let flags = ProgressFlags {
        quiet: args.quiet,
        lines: args.progress,
        // a search has no step count to fill a bar with
        no_bar: true,
    };
    let mut reporter = Reporter::new("fit", flags, 0);
    let mut on_sim = |x: trainmem_sim::fit::Simulated| {
        let verdict = if x.fits { "fits" } else { "does not fit" };
        let how = if x.full {
            "over the plan's own steps"
        } else {
            "over the probe's steps"
        };
        reporter.note(&format!("size {} {verdict} {how}", x.size));
    };
    let r = trainmem_sim::fit_with_progress(
        &plan,
        target,
        capacity,
        args.max,
        Machine::detect(),
        &mut on_sim,
    )?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(if r.largest.is_some() {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(2)
        });
    }
    let what = match target {
        FitTarget::Batch => "batch size",
        FitTarget::MicroBatch => "micro-batch size",
    };
    match r.largest {
        Some(n) => {
            println!(
                "largest {what} that fits {}: {n} (peak allocated {}, peak reserved {} over the \
                 plan's {} step{}; {} simulations, {} of them of the whole plan)",
                human(capacity),
                human(r.peak_allocated),
                human(r.peak_reserved),
                r.steps,
                if r.steps == 1 { "" } else { "s" },
                r.probes,
                r.full_runs,
            );
            match &r.first_failing {
                Some((m, msg)) => {
                    let sizes = match r.failing_up_to {
                        Some(up) if up > *m => format!("{what}s {m} to {up} do not fit"),
                        _ => format!("{what} {m} does not fit"),
                    };
                    // each simulated with the plan's own steps, as `simulate` would
                    let why = match r.first_failing_when {
                        Some(w) => {
                            format!("{m} runs out of memory at step {} ({})", w.step, w.phase)
                        }
                        None => format!("at {m} the plan is not valid"),
                    };
                    println!("{sizes}; {why}:\n  {msg}");
                }
                None => println!("({n} is --max, the largest size searched)"),
            }
            Ok(ExitCode::SUCCESS)
        }
        None => {
            println!("even a {what} of 1 does not fit {}:", human(capacity));
            if let Some((_, msg)) = &r.first_failing {
                println!("  {msg}");
            }
            println!(
                "`trainmem explain {} --capacity {}` simulates the plan's other knobs \
                 (checkpointing, attention, precision, optimizer, allocator, micro-batch) and \
                 what fits with them",
                args.plan.display(),
                human(capacity).replace(' ', "")
            );
            Ok(ExitCode::from(2))
        }
    }
}

/// Runs `trainmem explain` on a plan (`explain_snapshot::explain` has already told it from a
/// snapshot pickle).
pub fn explain_plan(args: ExplainArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        args.out.is_none() && args.device.is_none(),
        "--out and --device apply to snapshot pickles; {} is a plan",
        args.plan.display()
    );
    keep_freed_heap();
    let mut plan = load(&args.plan)?;
    if let Some(capacity) = args.capacity {
        plan.device.capacity.0 = capacity;
    }
    let flags = ProgressFlags {
        quiet: args.quiet,
        lines: args.progress,
        no_bar: args.json,
    };
    let r = run_sim(&plan, args.steps, None, flags)?;
    let findings = trainmem_sim::explain(&plan, &r.timeline, &r.summary);
    // a plan that does not fit, or barely: each of its knobs that would help, simulated
    let close = r.summary.oom.is_some()
        || trainmem_sim::plan_remedies::close_to_capacity(
            r.summary.peak_reserved,
            plan.device.capacity.0,
        );
    let remedies = if close && !args.no_remedies {
        let mut reporter = Reporter::new("what would fit", flags, 0);
        let remedies = trainmem_sim::plan_remedies(&plan, Machine::detect(), &mut |c| {
            reporter.note(&format!("simulating {c}"))
        })
        .context("simulating the plan's remedies")?;
        reporter.finish();
        Some(remedies).filter(trainmem_sim::PlanRemedies::worth_showing)
    } else {
        None
    };
    if args.json {
        let v = serde_json::json!({ "findings": findings, "what_would_fit": remedies });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        let name = if plan.name.is_empty() {
            args.plan.display().to_string()
        } else {
            plan.name.clone()
        };
        println!("{name}: what memory does, and why\n");
        for f in &findings {
            println!("* {}\n", f.text);
        }
        if let Some(remedies) = &remedies {
            print!("{}", render_remedies(remedies));
        }
    }
    // A plan that does not fit is a predicted OOM, exit code 2, as under `simulate` and `fit`.
    Ok(if r.summary.oom.is_some() {
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    })
}

/// `explain`'s "what would fit" section: the plan's need, then each change with its own.
fn render_remedies(r: &trainmem_sim::PlanRemedies) -> String {
    use std::fmt::Write as _;
    let need = |n: &trainmem_sim::plan_remedies::Need| {
        if n.fits {
            format!(
                "fits: peak allocated {}, reserved {}",
                human(n.peak_allocated),
                human(n.peak_reserved)
            )
        } else {
            format!(
                "does not fit: needs {} allocated, {} reserved",
                human(n.peak_allocated),
                human(n.peak_reserved)
            )
        }
    };
    let mut o = String::new();
    if r.model_state_exceeds {
        let _ = writeln!(
            o,
            "What would fit in {}: none of the plan's step knobs (checkpointing, attention, \
             micro-batch, allocator) helps, since the model's own state exceeds the device \
             before the first step; a smaller model, LoRA, half-precision weights or sharding \
             (`[parallel] zero_stage`) would.",
            human(r.capacity)
        );
        return o;
    }
    let _ = writeln!(
        o,
        "What would fit in {} (the plan as written {}; each change simulated over fit's probe \
         steps):",
        human(r.capacity),
        need(&r.plan)
    );
    for x in &r.remedies {
        let _ = writeln!(o, "  - {}: {} ({})", x.change, need(&x.need), x.why);
    }
    o
}
