//! Turning a finished scenario into its report and its files: `report.md`, `timeline.json`,
//! SVG charts, a Chrome trace and a memory_viz pickle.

use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;
use trainmem_alloc::AllocatorConfig;
use trainmem_alloc::pytorch::pickle;
use trainmem_core::Category;
use trainmem_core::export::{chrome::chrome_trace, files, svg::render_svg};
use trainmem_core::plan::DeviceKind;
use trainmem_core::timeline::Source;
use trainmem_sim::{Machine, SimOptions, simulate};

use super::Scenario;
use super::ctx::{Ctx, RunRecord};
use super::error::{Result, ScenarioError};
use super::replay::{MIN_TRACE, replay};
use super::report::{self, RunReport, ScenarioReport};
use trainmem_core::compare::category_errors;

/// The report of a finished scenario.
pub fn build_report(scenario: &Scenario, ctx: Ctx) -> ScenarioReport {
    let (mode, backend) = (ctx.mode, ctx.backend);
    let (runs, verdicts, notes) = ctx.finish();
    let mut explanation: Vec<String> = scenario.explanation.iter().map(|p| p.to_string()).collect();
    if let Some(first) = runs.iter().find(|r| r.simulated.is_some())
        && let Some(sim) = &first.simulated
    {
        let findings = trainmem_sim::explain(&first.plan, &sim.timeline, &sim.summary);
        if !findings.is_empty() {
            let lines: Vec<String> = findings.iter().map(|f| format!("* {}", f.text)).collect();
            explanation.push(format!(
                "The twin's reading of `{}`:\n{}",
                first.label,
                lines.join("\n")
            ));
        }
    }
    let memory_viz = measured_memory_viz(&runs);
    ScenarioReport {
        memory_viz,
        name: scenario.name.to_string(),
        title: scenario.description.to_string(),
        sources: scenario.sources.to_string(),
        mode,
        backend,
        runs: runs.iter().map(run_report).collect(),
        verdicts,
        explanation,
        notes,
        files: Vec::new(),
    }
}

/// The memory_viz snapshot of the first measured run with an allocation trace: its tensors
/// replayed through the caching allocator. `None` when no run has a usable trace (then the
/// twin's snapshot is written instead).
fn measured_memory_viz(runs: &[RunRecord]) -> Option<(Vec<u8>, String)> {
    let (run, m) = runs.iter().find_map(|r| {
        r.measured
            .as_ref()
            .filter(|m| {
                !m.allocation_trace.is_empty()
                    && m.allocation_trace_dropped == 0
                    && m.samples.iter().all(|s| s.trace_events.is_some())
            })
            .map(|m| (r, m))
    })?;
    let replayed = replay(&run.plan, m, AllocatorConfig::default(), false).ok()?;
    let pickle = pickle::to_bytes(&replayed.snapshot).ok()?;
    Some((
        pickle,
        format!(
            "memory_viz.pickle: the measured run `{}`: its tensor allocations (at least {MIN_TRACE} \
             bytes, training thread, frames named by category) replayed through trainmem-alloc's \
             caching allocator, i.e. how a GPU caching allocator would hold them; open it at \
             pytorch.org/memory_viz",
            run.label
        ),
    ))
}

fn run_report(r: &RunRecord) -> RunReport {
    let domain = r.domain();
    let mut twin = match (&r.measured, &r.simulated) {
        (Some(m), Some(s)) => {
            let batch =
                trainmem_sim::lower::input_bytes_per_sample_for(&r.plan.model, r.plan.framework)
                    * r.plan.micro_batch_size();
            let slack = trainmem_core::compare::loader_slack(&r.plan, batch);
            // Host counts are exact to within a few kilobytes of runtime state (see
            // HOST_RESOLUTION); device figures come from the device's own counters.
            let floor = match domain {
                trainmem_core::Domain::Host => trainmem_core::compare::HOST_RESOLUTION,
                trainmem_core::Domain::Device => 0,
            };
            category_errors(&m.timeline, &s.timeline, domain)
                .into_iter()
                .map(|e| match e.category {
                    Category::Input => e.with_slack(slack.max(floor)),
                    _ => e.with_slack(floor),
                })
                .collect()
        }
        _ => Vec::new(),
    };
    if r.no_targets.is_some() {
        for e in &mut twin {
            e.tolerance = None;
        }
    }
    let meta_check = match (&r.measured, &r.meta_run) {
        (Some(m), Some(meta)) => Some(super::meta::compare(&r.plan, m, meta, domain)),
        _ => None,
    };
    RunReport {
        meta_run: r.meta_run.as_ref().map(|m| m.timeline.clone()),
        meta_check,
        meta_failed: r.meta_failed.clone(),
        no_meta: r.no_meta.clone(),
        label: r.label.clone(),
        plan: r.plan.clone(),
        domain,
        measured: r.measured.as_ref().map(|m| m.timeline.clone()),
        simulated: r.simulated.as_ref().map(|s| s.timeline.clone()),
        not_measured: r.not_measured.clone(),
        no_targets: r.no_targets.clone(),
        twin,
    }
}

/// A file-name-safe form of a run label or a device name: lower-case ASCII letters and digits,
/// every other run of characters one `-`.
pub fn slug(label: &str) -> String {
    let mut s: String = label
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    while s.contains("--") {
        s = s.replace("--", "-");
    }
    s.trim_matches('-').to_string()
}

/// Writes the report's files into `dir` and lists them in the report.
pub fn write_outputs(report: &mut ScenarioReport, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|source| ScenarioError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let write = |name: &str, bytes: &[u8]| -> Result<String> {
        let path = dir.join(name);
        std::fs::write(&path, bytes).map_err(|source| ScenarioError::Io { path, source })?;
        Ok(name.to_string())
    };
    let mut files = Vec::new();

    // SVG charts: the first run's primary timeline, then every timeline of every run.
    if let Some(t) = report.runs.first().and_then(|r| r.primary()) {
        files.push(write(files::TIMELINE_SVG, render_svg(t).as_bytes())?);
    }
    for (i, run) in report.runs.iter().enumerate() {
        for t in [&run.measured, &run.simulated].into_iter().flatten() {
            let name = format!("run{i}-{}-{}.svg", slug(&run.label), t.source);
            files.push(write(&name, render_svg(t).as_bytes())?);
        }
        if let Some(t) = &run.meta_run {
            let name = format!("run{i}-{}-meta.svg", slug(&run.label));
            files.push(write(&name, render_svg(t).as_bytes())?);
        }
    }

    let trace = combined_chrome_trace(report)?;
    files.push(write(
        files::TRACE_JSON,
        serde_json::to_string(&trace)
            .map_err(ScenarioError::Json)?
            .as_bytes(),
    )?);

    // memory_viz pickle: the measured run's tensors through the caching allocator, or else
    // the twin's caching-allocator snapshot of the first run's plan.
    let viz = match report.memory_viz.take() {
        Some(v) => Some(v),
        None => memory_viz(report)?,
    };
    if let Some((pickle, note)) = viz {
        files.push(write(files::MEMORY_VIZ_PICKLE, &pickle)?);
        report.notes.push(note);
    }

    files.push(files::REPORT_MD.into());
    files.push(files::TIMELINE_JSON.into());
    report.files = files;
    write(files::REPORT_MD, report::render_markdown(report).as_bytes())?;
    write(
        files::TIMELINE_JSON,
        serde_json::to_string_pretty(report)
            .map_err(ScenarioError::Json)?
            .as_bytes(),
    )?;
    Ok(())
}

/// One Chrome trace of every timeline of the report, each as its own pair of processes named
/// after its run.
fn combined_chrome_trace(report: &ScenarioReport) -> Result<Value> {
    let mut events: Vec<Value> = Vec::new();
    let mut pid_base = 0u64;
    for run in &report.runs {
        for t in [&run.measured, &run.simulated].into_iter().flatten() {
            let text = chrome_trace(t).map_err(ScenarioError::Export)?;
            let value: Value = serde_json::from_str(&text).map_err(ScenarioError::Json)?;
            if let Some(list) = value.get("traceEvents").and_then(Value::as_array) {
                for ev in list {
                    let mut ev = ev.clone();
                    if let Some(pid) = ev.get("pid").and_then(Value::as_u64) {
                        ev["pid"] = Value::from(pid_base + pid);
                    }
                    if ev.get("ph").and_then(Value::as_str) == Some("M")
                        && let Some(name) = ev["args"]["name"].as_str()
                    {
                        ev["args"]["name"] = Value::from(format!("{}: {name}", run.label));
                    }
                    events.push(ev);
                }
            }
            pid_base += 10;
        }
    }
    Ok(serde_json::json!({"traceEvents": events, "displayTimeUnit": "ms"}))
}

/// The memory_viz snapshot of the scenario's first plan, simulated on a caching allocator
/// (a CPU plan is re-simulated as if on a GPU, since burn's CPU tensors have no allocator to
/// snapshot).
fn memory_viz(report: &ScenarioReport) -> Result<Option<(Vec<u8>, String)>> {
    let Some(run) = report.runs.first() else {
        return Ok(None);
    };
    let mut plan = run.plan.clone();
    let on_gpu = plan.device.kind == DeviceKind::Cpu;
    plan.device.kind = DeviceKind::Cuda;
    let sim = simulate(
        &plan,
        SimOptions {
            machine: Machine::detect(),
            trace_entries: Some(20_000),
            progress: None,
            max_steps: None,
        },
    )
    .map_err(|source| ScenarioError::Simulation {
        label: format!("{} on a caching allocator", run.label),
        source,
    })?;
    let Some(snapshot) = sim.snapshot else {
        return Ok(None);
    };
    let note = if on_gpu {
        "memory_viz.pickle: the twin's caching-allocator snapshot of this plan as if it ran on a \
         GPU (burn's CPU tensors have no allocator to snapshot); open it at pytorch.org/memory_viz"
    } else {
        "memory_viz.pickle: the twin's caching-allocator snapshot of this plan; open it at \
         pytorch.org/memory_viz"
    };
    Ok(Some((
        pickle::to_bytes(&snapshot).map_err(ScenarioError::Pickle)?,
        note.to_string(),
    )))
}

/// The table printed after `scenario all`: verdicts and the twin's error per category for
/// every run with both sources.
pub fn summary_table(reports: &[ScenarioReport]) -> String {
    let cats = [
        Category::Parameter,
        Category::Gradient,
        Category::OptimizerState,
        Category::Activation,
        Category::Input,
    ];
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n== summary: verdicts, and the twin's error at the peak"
    );
    let _ = write!(out, "| scenario | run | verdicts |");
    for c in cats {
        let _ = write!(out, " {} |", c.name());
    }
    let _ = writeln!(out);
    let _ = write!(out, "|---|---|---|");
    for _ in cats {
        let _ = write!(out, "---|");
    }
    let _ = writeln!(out);
    for r in reports {
        let passed = r.verdicts.iter().filter(|v| v.reproduced).count();
        let verdicts = format!("{passed}/{}", r.verdicts.len());
        for (i, run) in r.runs.iter().enumerate() {
            let _ = write!(
                out,
                "| {} | {} | {} |",
                if i == 0 { r.name.as_str() } else { "" },
                run.label,
                if i == 0 { verdicts.as_str() } else { "" }
            );
            for c in cats {
                let cell = run
                    .twin
                    .iter()
                    .find(|e| e.category == c)
                    .map(|e| match e.error {
                        Some(x) => format!(
                            "{:+.1}%{}",
                            x * 100.0,
                            if e.within() { "" } else { " (miss)" }
                        ),
                        None => "-".into(),
                    })
                    .unwrap_or_else(|| match (&run.measured, &run.simulated) {
                        (None, Some(_)) => "sim only".into(),
                        (Some(_), None) => "measured only".into(),
                        (Some(_), Some(_)) => "0".into(),
                        (None, None) => "-".into(),
                    });
                let _ = write!(out, " {cell} |");
            }
            let _ = writeln!(out);
        }
    }
    let verdict_sources: Vec<Source> = reports
        .iter()
        .flat_map(|r| r.verdicts.iter().map(|v| v.source))
        .collect();
    let _ = writeln!(
        out,
        "\n{} verdicts ({} on measured runs, {} on the twin); errors are (twin - measured) / \
         measured of each category's peak; targets 2% (parameter, gradient, optimizer_state), \
         10% (activation, input).",
        verdict_sources.len(),
        verdict_sources
            .iter()
            .filter(|s| **s == Source::Measured)
            .count(),
        verdict_sources
            .iter()
            .filter(|s| **s == Source::Simulated)
            .count()
    );
    out.push_str(&meta_summary(reports));
    out
}

/// The Meta part of the summary (`--meta`): per run, Meta's error per category at the phase
/// boundary shown (see `meta::MetaRow::point`), and whether every boundary is within 1% + 16 KiB. Empty when
/// no run was compared.
pub fn meta_summary(reports: &[ScenarioReport]) -> String {
    let compared = reports.iter().any(|r| {
        r.runs
            .iter()
            .any(|run| run.meta_check.is_some() || run.meta_failed.is_some())
    });
    if !compared {
        return String::new();
    }
    let cats = super::meta::COMPARED;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n== trainmem-meta against the measured runs: tensor bytes per category at every phase \
         boundary"
    );
    let _ = write!(out, "| scenario | run | boundaries |");
    for c in cats {
        let _ = write!(out, " {} |", c.name());
    }
    let _ = writeln!(out, " records | agrees |");
    let _ = writeln!(out, "|---|---|---|{}---|---|", "---|".repeat(cats.len()));
    let (mut runs, mut agreeing) = (0, 0);
    for r in reports {
        let mut first = true;
        for run in &r.runs {
            let name = if first { r.name.as_str() } else { "" };
            let Some(c) = &run.meta_check else {
                // A run without a measured side has nothing to hold Meta to.
                if let Some(why) = &run.meta_failed {
                    first = false;
                    runs += 1;
                    let _ = writeln!(out, "| {name} | {} | Meta run failed: {why} |", run.label);
                }
                continue;
            };
            first = false;
            runs += 1;
            let boundaries = c.rows.first().map_or(0, |row| row.boundaries);
            let _ = write!(out, "| {name} | {} | {boundaries} |", run.label);
            for cat in cats {
                let cell = match c.rows.iter().find(|row| row.category == cat) {
                    Some(row) => {
                        let err = row
                            .error
                            .map(|x| format!("{:+.2}%", x * 100.0))
                            .unwrap_or_else(|| "-".into());
                        let diff = report::human(row.largest_difference as f64);
                        if row.within() {
                            format!("{err} (max {diff})")
                        } else {
                            format!("{err} (MISS at {})", row.outside)
                        }
                    }
                    None => "not compared".into(),
                };
                let _ = write!(out, " {cell} |");
            }
            let _ = write!(out, " {} |", records_cell(&c.records));
            let agrees = c.agrees();
            if agrees {
                agreeing += 1;
            }
            let _ = writeln!(out, " {} |", if agrees { "yes" } else { "**no**" });
        }
    }
    let _ = writeln!(
        out,
        "\n{agreeing} of {runs} runs agree. Each cell is (Meta - measured) / measured at the \
         category's measured peak (at the boundary furthest outside 1% + 16 KiB when one is), \
         and in brackets the largest |Meta - measured| over all boundaries; \
         `input` is not compared with loader workers (the prefetch queue's fill at a boundary \
         depends on thread scheduling). `records`: the records beside the tensors (burn's graph, \
         optimizer and module records, host bytes made outside the backend's ops), the compared \
         categories together: the largest |Meta - measured| of any of them at any boundary, \
         each held to 1% + 16 KiB."
    );
    out
}

/// The `records` cell of a run: the largest difference of any category's records, or the
/// categories outside the tolerance; `-` where the records were not compared.
fn records_cell(rows: &[super::meta::MetaRow]) -> String {
    if rows.is_empty() {
        return "-".into();
    }
    let missed: Vec<&str> = rows
        .iter()
        .filter(|r| !r.within())
        .map(|r| r.category.name())
        .collect();
    if missed.is_empty() {
        let largest = rows.iter().map(|r| r.largest_difference).max().unwrap_or(0);
        format!("max {}", report::human(largest as f64))
    } else {
        format!("MISS ({})", missed.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs_are_file_safe() {
        assert_eq!(slug("Persistent workers (knob)"), "persistent-workers-knob");
        assert_eq!(slug("a/b"), "a-b");
        // Device names, as `xtask gpu-check` names its folders.
        assert_eq!(slug("NVIDIA H100 80GB HBM3"), "nvidia-h100-80gb-hbm3");
        assert_eq!(slug("flex-cpu-x86_64"), "flex-cpu-x86-64");
    }
}
