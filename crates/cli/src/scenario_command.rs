//! `scenario`: the command around trainmem-scenarios' catalogue, shared by the `trainmem`
//! binary (`trainmem scenario NAME`) and `cargo xtask scenario NAME`.
//!
//! It parses the arguments, runs the selected scenarios (each measured run in a fresh child
//! process unless `--in-process`), writes each scenario's files, prints the reports (text, or
//! one JSON object with `--json`) and turns the verdicts into an exit code: 0 when every
//! pattern and knob came out as expected; [`EXIT_NOT_REPRODUCED`] (1) when one did not;
//! [`EXIT_USAGE`] (2) for an unknown scenario name, as for other usage errors;
//! [`EXIT_TWIN_MISSED`] (3) with `--strict-twin` when the prediction missed its accuracy target
//! but every pattern reproduced; [`EXIT_META_DISAGREES`] (4) with `--meta` when trainmem-meta
//! disagrees with a measured run but every pattern reproduced.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use trainmem_burn::BackendChoice;
use trainmem_core::Plan;
use trainmem_scenarios::{
    ChildCommand, Ctx, Isolation, Mode, SCENARIOS, Scenario, ScenarioError, ScenarioReport,
    backend_available, execute_in, find, output, report,
};

type Result<T> = std::result::Result<T, ScenarioError>;

/// Which runs a scenario makes, as `--mode` names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ModeArg {
    /// Real burn training runs only.
    Measured,
    /// The simulated twin only (fast; what CI runs for every scenario).
    Simulated,
    /// Both, side by side, with the twin's error per category.
    Both,
}

impl From<ModeArg> for Mode {
    fn from(m: ModeArg) -> Mode {
        match m {
            ModeArg::Measured => Mode::Measured,
            ModeArg::Simulated => Mode::Simulated,
            ModeArg::Both => Mode::Both,
        }
    }
}

/// Arguments of `scenario`.
#[derive(Debug, clap::Args)]
pub struct ScenarioArgs {
    /// Scenario to run, or `all`.
    #[arg(required_unless_present = "list")]
    pub name: Option<String>,
    /// List the scenarios with a one-line description.
    #[arg(long)]
    pub list: bool,
    /// Backend of the measured runs: `flex`, `cuda` or `wgpu` (the last two need a build with
    /// that feature).
    #[arg(long, default_value = "flex")]
    pub backend: BackendChoice,
    /// Real runs, the simulated twin, or both side by side.
    #[arg(long, value_enum, default_value = "both")]
    pub mode: ModeArg,
    /// Print the report as one JSON object instead of the text view (with `all`:
    /// `{"scenarios": [...]}`).
    #[arg(long)]
    pub json: bool,
    /// Output directory (default `target/scenarios/NAME/` from `cargo xtask`,
    /// `trainmem-scenarios/NAME/` from `trainmem`; with `all`, one subdirectory per
    /// scenario under DIR).
    #[arg(short, long, value_name = "DIR")]
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
/// (unless `--in-process`): the binary must call [`serve_child`](trainmem_scenarios::serve_child) first thing in `main` and
/// return its exit code when it gives one.
pub fn run(args: ScenarioArgs, default_out: &Path) -> Result<ExitCode> {
    let mode = Mode::from(args.mode);
    if args.list {
        print_list();
        return Ok(ExitCode::SUCCESS);
    }
    let Some(selected) = select(args.name.as_deref().unwrap_or_default()) else {
        return Ok(ExitCode::from(EXIT_USAGE));
    };
    backend_available(args.backend)?;
    if let Some(why) = meta_refused(args.meta, mode, args.backend) {
        eprintln!("error: {why}");
        return Ok(ExitCode::from(EXIT_USAGE));
    }
    let plan = match &args.plan {
        Some(_) if selected.len() > 1 => {
            eprintln!("error: --plan applies to one scenario, not `all`");
            return Ok(ExitCode::from(EXIT_USAGE));
        }
        Some(path) => Some(Plan::load(path).map_err(|source| ScenarioError::Plan {
            context: format!("--plan {}", path.display()),
            source,
        })?),
        None => None,
    };
    let reports = run_selected(&args, &selected, plan, default_out)?;
    finish(&args, &reports)
}

/// Why `--meta` cannot be used with this mode and backend, when it cannot: Meta is compared
/// with measured runs on Flex.
fn meta_refused(meta: bool, mode: Mode, backend: BackendChoice) -> Option<&'static str> {
    (meta && (!mode.measured() || backend != BackendChoice::Flex)).then_some(
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
        let mut ctx = Ctx::new(args.mode.into(), args.backend, dir.clone(), !args.json);
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
    if args.in_process || !Mode::from(args.mode).measured() {
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
mod tests {
    use super::*;

    #[test]
    fn exit_codes() {
        assert_eq!(exit_code(false, false, false, false), 0);
        assert_eq!(
            exit_code(false, true, false, false),
            0,
            "a twin miss fails only when strict"
        );
        assert_eq!(exit_code(false, true, true, false), EXIT_TWIN_MISSED);
        assert_eq!(exit_code(true, true, true, false), EXIT_NOT_REPRODUCED);
        assert_eq!(exit_code(true, false, false, false), EXIT_NOT_REPRODUCED);
        assert_eq!(exit_code(false, false, false, true), EXIT_META_DISAGREES);
        assert_eq!(exit_code(false, true, true, true), EXIT_META_DISAGREES);
        assert_eq!(exit_code(true, false, false, true), EXIT_NOT_REPRODUCED);
        let codes = [
            EXIT_NOT_REPRODUCED,
            EXIT_USAGE,
            EXIT_TWIN_MISSED,
            EXIT_META_DISAGREES,
        ];
        assert!(codes.iter().all(|&c| c != 0));
        assert_eq!(
            codes.len(),
            codes
                .iter()
                .collect::<std::collections::BTreeSet<_>>()
                .len()
        );
    }

    #[test]
    fn meta_needs_measured_runs_on_flex() {
        assert_eq!(meta_refused(true, Mode::Both, BackendChoice::Flex), None);
        assert_eq!(
            meta_refused(true, Mode::Measured, BackendChoice::Flex),
            None
        );
        assert_eq!(
            meta_refused(false, Mode::Simulated, BackendChoice::Cuda),
            None
        );
        assert!(meta_refused(true, Mode::Simulated, BackendChoice::Flex).is_some());
        assert!(meta_refused(true, Mode::Both, BackendChoice::Cuda).is_some());
    }

    #[test]
    fn out_dir_rules() {
        let dir = Path::new("/tmp/x");
        let default = Path::new("/tmp/d");
        assert_eq!(
            out_dir(Some(dir), default, "a", false),
            PathBuf::from("/tmp/x")
        );
        assert_eq!(
            out_dir(Some(dir), default, "a", true),
            PathBuf::from("/tmp/x/a")
        );
        assert_eq!(
            out_dir(None, default, "a", false),
            PathBuf::from("/tmp/d/a")
        );
    }
}
