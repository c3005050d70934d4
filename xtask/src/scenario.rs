//! `cargo xtask scenario NAME|all|--list [--json] [--out DIR]`: run memory scenarios.
//!
//! A scenario is a function that runs a workload, samples memory at phase boundaries and checks
//! the pattern it is about; it returns a [`ScenarioReport`]. The runner prints the timeline as a
//! text chart with the verdicts and the explanation, writes `report.md` and `timeline.json` to
//! the output directory, and exits non-zero when a pattern (or a knob that should remove it) did
//! not come out as expected.
//!
//! Adding a scenario: write `scenario/NAME.rs` with a `pub fn run() -> anyhow::Result<ScenarioReport>`
//! and add one entry to [`SCENARIOS`].

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};

mod empty_cache;
pub mod report;

pub use report::ScenarioReport;

/// One registered scenario.
#[derive(Debug, Clone, Copy)]
pub struct Scenario {
    /// Name on the command line.
    pub name: &'static str,
    /// One line for `--list`.
    pub description: &'static str,
    /// Runs it.
    pub run: fn() -> anyhow::Result<ScenarioReport>,
}

/// The catalogue.
pub const SCENARIOS: &[Scenario] = &[Scenario {
    name: "empty-cache",
    description: "after an epoch reserved >> allocated; empty_cache returns only fully free \
                  segments; a fragmentation OOM while total free memory would suffice \
                  (allocator level, simulated device)",
    run: empty_cache::run,
}];

/// Arguments of `scenario`.
#[derive(Debug, clap::Args)]
pub struct ScenarioArgs {
    /// Scenario to run, or `all`.
    #[arg(required_unless_present = "list")]
    name: Option<String>,
    /// List the scenarios with a one-line description.
    #[arg(long)]
    list: bool,
    /// Print the report as one JSON object instead of the text view (with `all`:
    /// `{"scenarios": [...]}`).
    #[arg(long)]
    json: bool,
    /// Output directory (default `target/scenarios/NAME/`; with `all`, one subdirectory per
    /// scenario under DIR).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
}

/// Looks a scenario up by name.
pub fn find(name: &str) -> Option<&'static Scenario> {
    SCENARIOS.iter().find(|s| s.name == name)
}

/// Runs a scenario.
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

    let mut reports = Vec::new();
    let mut failed = Vec::new();
    for scenario in &selected {
        let report = (scenario.run)().with_context(|| format!("scenario {}", scenario.name))?;
        let dir = out_dir(args.out.as_deref(), scenario.name, name == "all");
        write_outputs(&report, &dir)?;
        if !args.json {
            print!("{}", report::render_text(&report));
            println!("wrote {}", dir.display());
        }
        if !report.all_reproduced() {
            failed.push(scenario.name);
        }
        reports.push(report);
    }
    if args.json {
        let value = if name != "all" && reports.len() == 1 {
            serde_json::to_value(&reports[0])?
        } else {
            serde_json::json!({ "scenarios": reports })
        };
        println!("{}", serde_json::to_string_pretty(&value)?);
    }
    if failed.is_empty() {
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!("not reproduced: {}", failed.join(", "));
        Ok(ExitCode::FAILURE)
    }
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

/// Writes `report.md` and `timeline.json`.
fn write_outputs(report: &ScenarioReport, dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let md = dir.join("report.md");
    std::fs::write(&md, report::render_markdown(report))
        .with_context(|| format!("writing {}", md.display()))?;
    let timeline = serde_json::json!({
        "scenario": report.name,
        "samples": report.timeline,
        "verdicts": report.verdicts,
    });
    let json = dir.join("timeline.json");
    std::fs::write(&json, serde_json::to_string_pretty(&timeline)?)
        .with_context(|| format!("writing {}", json.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_names_are_unique_and_findable() {
        let mut names: Vec<&str> = SCENARIOS.iter().map(|s| s.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), SCENARIOS.len());
        assert!(!names.contains(&"all"), "`all` is reserved");
        for s in SCENARIOS {
            assert_eq!(find(s.name).map(|f| f.description), Some(s.description));
            assert!(!s.description.is_empty());
        }
        assert!(find("nope").is_none());
    }

    #[test]
    fn out_dir_rules() {
        let dir = Path::new("/tmp/x");
        assert_eq!(out_dir(Some(dir), "a", false), PathBuf::from("/tmp/x"));
        assert_eq!(out_dir(Some(dir), "a", true), PathBuf::from("/tmp/x/a"));
        assert!(out_dir(None, "a", false).ends_with("scenarios/a"));
    }
}
