//! What a scenario hands back, and how it is shown: a terminal chart of the measured timeline
//! with the twin overlaid, verdicts with their figures, the twin's error per category at the
//! peak, a markdown report and a JSON document.

use std::fmt::Write as _;
use trainmem_core::compare::CategoryError;

use serde::Serialize;
use trainmem_core::Category;
use trainmem_core::timeline::{Domain, Sample, Source, Timeline};

use super::ctx::Mode;
use super::meta::MetaComparison;
use trainmem_burn::BackendChoice;

/// A number behind a verdict.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Figure {
    /// What it is.
    pub name: String,
    /// Its value.
    pub value: f64,
    /// `bytes`, `count` or `ratio`.
    pub unit: &'static str,
}

impl Figure {
    /// A byte count.
    pub fn bytes(name: impl Into<String>, value: u64) -> Self {
        Self {
            name: name.into(),
            value: value as f64,
            unit: "bytes",
        }
    }

    /// A signed byte count (a difference).
    pub fn delta(name: impl Into<String>, value: i64) -> Self {
        Self {
            name: name.into(),
            value: value as f64,
            unit: "bytes",
        }
    }

    /// A plain count.
    pub fn count(name: impl Into<String>, value: u64) -> Self {
        Self {
            name: name.into(),
            value: value as f64,
            unit: "count",
        }
    }

    /// A ratio.
    pub fn ratio(name: impl Into<String>, value: f64) -> Self {
        Self {
            name: name.into(),
            value,
            unit: "ratio",
        }
    }

    /// The value for people.
    pub fn display_value(&self) -> String {
        match self.unit {
            "bytes" => human(self.value),
            "ratio" => format!("{:.3}", self.value),
            _ => format!("{}", self.value),
        }
    }
}

/// Bytes for people: B, KiB or MiB, signed.
pub fn human(bytes: f64) -> String {
    let a = bytes.abs();
    if a >= (1u64 << 20) as f64 {
        format!("{:.2} MiB", bytes / (1u64 << 20) as f64)
    } else if a >= 1024.0 {
        format!("{:.1} KiB", bytes / 1024.0)
    } else {
        format!("{bytes:.0} B")
    }
}

/// Bytes as MiB with one decimal.
pub fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

/// Is it a pattern the scenario must show, or a knob that must remove it?
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum VerdictKind {
    /// The pattern appears.
    Pattern,
    /// A knob (setting or code change) removes the pattern.
    Knob,
}

/// The outcome of one check on one source.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Verdict {
    /// Pattern or knob.
    pub kind: VerdictKind,
    /// Short name of what is checked.
    pub name: String,
    /// Measured run or the twin.
    pub source: Source,
    /// Whether it showed.
    pub reproduced: bool,
    /// The condition checked, in words, with the numbers.
    pub detail: String,
    /// The figures behind it.
    pub figures: Vec<Figure>,
}

/// One run in a report.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    /// What this run is.
    pub label: String,
    /// The plan as run.
    pub plan: trainmem_core::Plan,
    /// The memory that holds the tensors (host on a CPU backend).
    pub domain: Domain,
    /// The measured timeline.
    pub measured: Option<Timeline>,
    /// The twin's timeline.
    pub simulated: Option<Timeline>,
    /// Why no measured run was made, when the mode asked for one.
    pub not_measured: Option<String>,
    /// Why the twin's accuracy targets do not apply to this run, when they do not.
    pub no_targets: Option<String>,
    /// The twin's error per category (both sources present).
    pub twin: Vec<CategoryError>,
    /// The plan trained on trainmem-meta (`--meta`), its tensors in the device categories.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub meta_run: Option<Timeline>,
    /// Meta against the measured run at every phase boundary (`--meta`, with a measured run).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub meta_check: Option<MetaComparison>,
    /// Why the Meta run failed, when it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub meta_failed: Option<String>,
    /// Why this run has no Meta run although it has a measured side.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub no_meta: Option<String>,
}

impl RunReport {
    /// The timeline the chart is drawn from (measured when present).
    pub fn primary(&self) -> Option<&Timeline> {
        self.measured.as_ref().or(self.simulated.as_ref())
    }
}

/// Everything a scenario produces.
#[derive(Debug, Clone, Serialize)]
pub struct ScenarioReport {
    /// Registry name.
    pub name: String,
    /// One-line description of the pattern.
    pub title: String,
    /// Which source articles document the pattern.
    pub sources: String,
    /// Which runs were made.
    pub mode: Mode,
    /// The backend of the measured runs.
    pub backend: BackendChoice,
    /// The runs, the first being the pattern's own.
    pub runs: Vec<RunReport>,
    /// The checks, per source.
    pub verdicts: Vec<Verdict>,
    /// Which bytes cause the pattern and which knob removes it.
    pub explanation: Vec<String>,
    /// Remarks about how it was run.
    pub notes: Vec<String>,
    /// Files written.
    pub files: Vec<String>,
    /// The memory_viz pickle built from a measured run, and the note saying what it is
    /// (written as a file, not part of the JSON).
    #[serde(skip)]
    pub memory_viz: Option<(Vec<u8>, String)>,
}

impl ScenarioReport {
    /// True when every pattern and knob check came out as expected.
    pub fn all_reproduced(&self) -> bool {
        !self.verdicts.is_empty() && self.verdicts.iter().all(|v| v.reproduced)
    }

    /// The runs where trainmem-meta disagrees with the measured run (a category outside 1% +
    /// 16 KiB at some phase boundary, timelines that do not line up, or a Meta run that
    /// failed), as `(run, what)`.
    pub fn meta_disagreements(&self) -> Vec<(&str, String)> {
        let mut out = Vec::new();
        for r in &self.runs {
            if let Some(why) = &r.meta_failed {
                out.push((r.label.as_str(), format!("the Meta run failed: {why}")));
            }
            let Some(c) = &r.meta_check else { continue };
            if let Some(why) = &c.mismatch {
                out.push((r.label.as_str(), why.clone()));
            }
            for row in c.misses() {
                out.push((
                    r.label.as_str(),
                    format!(
                        "{} outside at {} of {} boundaries (e.g. {}: measured {}, Meta {})",
                        row.category.name(),
                        row.outside,
                        row.boundaries,
                        row.point,
                        row.measured,
                        row.meta
                    ),
                ));
            }
        }
        out
    }

    /// The twin errors outside their targets, as `(run, row)`.
    pub fn twin_misses(&self) -> Vec<(&str, &CategoryError)> {
        self.runs
            .iter()
            .flat_map(|r| {
                r.twin
                    .iter()
                    .filter(|e| !e.within())
                    .map(move |e| (r.label.as_str(), e))
            })
            .collect()
    }
}

/// Width of the bars in the chart.
const BAR: usize = 44;

/// At most this many rows in a chart; phases inside a step are dropped first.
const MAX_ROWS: usize = 48;

/// One letter per category in the stacked bars.
pub fn letter(c: Category) -> char {
    match c {
        Category::Parameter => 'P',
        Category::Gradient => 'G',
        Category::OptimizerState => 'O',
        Category::Activation => 'A',
        Category::Input => 'I',
        Category::Temporary => 'T',
        Category::Cache => 'c',
        Category::Other => 'x',
    }
}

fn row_label(s: &Sample) -> String {
    let mut l = format!("e{} s{:<3} {}", s.epoch, s.step, s.phase.name());
    if let Some(m) = s.micro_batch {
        let _ = write!(l, " mb{m}");
    }
    l
}

fn same_point(a: &Sample, b: &Sample) -> bool {
    a.phase == b.phase && a.step == b.step && a.epoch == b.epoch && a.micro_batch == b.micro_batch
}

/// Which rows of `t` the chart shows.
fn chart_rows(t: &Timeline, domain: Domain) -> Vec<usize> {
    use trainmem_core::timeline::Phase;
    let all: Vec<usize> = (0..t.samples.len()).collect();
    if all.len() <= MAX_ROWS {
        return all;
    }
    let minor = [Phase::BatchLoaded, Phase::ZeroGrad, Phase::Metrics];
    let kept: Vec<usize> = all
        .into_iter()
        .filter(|&i| !minor.contains(&t.samples[i].phase))
        .collect();
    if kept.len() <= MAX_ROWS {
        return kept;
    }
    let peak = kept
        .iter()
        .copied()
        .max_by_key(|&i| t.categories(i, domain).total())
        .unwrap_or(0);
    let stride = kept.len().div_ceil(MAX_ROWS);
    let mut rows: Vec<usize> = kept.iter().copied().step_by(stride).collect();
    if !rows.contains(&peak) {
        rows.push(peak);
        rows.sort_unstable();
    }
    rows
}

/// The chart's legend line and column headings.
fn chart_header(
    out: &mut String,
    t: &Timeline,
    domain: Domain,
    twin: bool,
    show_rss: bool,
    scale: u64,
) {
    let legend: Vec<String> = Category::ALL
        .iter()
        .map(|&c| format!("{}={}", letter(c), c.name()))
        .collect();
    let _ = writeln!(
        out,
        "{} memory, {} ({}){}; full scale {}",
        domain.name(),
        t.source,
        legend.join(" "),
        if twin { ", | = twin" } else { "" },
        mib(scale)
    );
    let _ = write!(
        out,
        "{:<22} {:BAR$} {:>10}",
        "point",
        "",
        t.source.to_string()
    );
    if twin {
        let _ = write!(out, " {:>10} {:>7}", "twin", "error");
    }
    if show_rss {
        let _ = write!(out, " {:>10} {:>10}", "RssAnon", "RssFile");
    }
    out.push('\n');
}

/// One row's bar: `BAR` cells stacked by category, with `|` where the twin's total falls.
fn chart_bar(
    cats: &trainmem_core::CategoryBytes,
    twin_total: Option<u64>,
    cells: &dyn Fn(u64) -> usize,
) -> String {
    let mut bar: Vec<char> = Vec::with_capacity(BAR);
    let mut acc = 0u64;
    for c in Category::ALL {
        let before = cells(acc);
        acc += cats.get(c);
        let after = cells(acc);
        bar.extend(std::iter::repeat_n(letter(c), after.saturating_sub(before)));
    }
    bar.resize(BAR, ' ');
    if let Some(v) = twin_total {
        let pos = cells(v).saturating_sub(1).min(BAR - 1);
        bar[pos] = '|';
    }
    bar.into_iter().collect()
}

/// The run's timeline as a text chart: one row per phase boundary, a bar stacked by category
/// (`P` parameters, `G` gradients, `O` optimizer state, `A` activations, `I` input, `T`
/// temporaries, `c` cache, `x` other), `|` where the twin puts the total at the same point, and
/// the figures beside it.
pub fn chart(run: &RunReport) -> String {
    let Some(t) = run.primary() else {
        return "(no timeline)\n".to_string();
    };
    let twin = if run.measured.is_some() {
        run.simulated.as_ref()
    } else {
        None
    };
    let domain = run.domain;
    let rows = chart_rows(t, domain);
    // The twin's total at each shown row's point (same phase, step, epoch, micro-batch).
    let twin_totals: Vec<Option<u64>> = rows
        .iter()
        .map(|&i| {
            let tw = twin?;
            tw.samples
                .iter()
                .position(|x| same_point(x, &t.samples[i]))
                .map(|j| tw.categories(j, domain).total())
        })
        .collect();
    let scale = rows
        .iter()
        .zip(&twin_totals)
        .map(|(&i, tw)| t.categories(i, domain).total().max(tw.unwrap_or(0)))
        .max()
        .unwrap_or(0)
        .max(1);
    let cells =
        |bytes: u64| ((bytes as u128 * BAR as u128).div_ceil(scale as u128) as usize).min(BAR);
    let show_rss = domain == Domain::Host && t.source == Source::Measured;
    let mut out = String::new();
    chart_header(&mut out, t, domain, twin.is_some(), show_rss, scale);
    for (k, &i) in rows.iter().enumerate() {
        let s = &t.samples[i];
        let cats = t.categories(i, domain);
        let total = cats.total();
        let tw = twin_totals[k];
        let bar = chart_bar(&cats, tw, &cells);
        let _ = write!(out, "{:<22} {bar} {:>10}", row_label(s), mib(total));
        if twin.is_some() {
            match tw {
                Some(v) => {
                    let err = if total > 0 {
                        format!("{:+.1}%", (v as f64 - total as f64) / total as f64 * 100.0)
                    } else {
                        "-".into()
                    };
                    let _ = write!(out, " {:>10} {:>7}", mib(v), err);
                }
                None => {
                    let _ = write!(out, " {:>10} {:>7}", "-", "");
                }
            }
        }
        if show_rss {
            let _ = write!(
                out,
                " {:>10} {:>10}",
                mib(s.host.anon_rss),
                mib(s.host.file_rss)
            );
        }
        out.push('\n');
    }
    if rows.len() < t.samples.len() {
        let _ = writeln!(
            out,
            "({} of {} points shown; every point is in timeline.json)",
            rows.len(),
            t.samples.len()
        );
    }
    out
}

/// The twin's error table for one run (empty when the run lacks either source).
pub fn twin_table(run: &RunReport) -> String {
    if run.twin.is_empty() {
        return String::new();
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<16} {:>14} {:>14} {:>9} {:>8}",
        "category", "measured peak", "twin peak", "error", "target"
    );
    for e in &run.twin {
        let err = e
            .error
            .map(|x| format!("{:+.2}%", x * 100.0))
            .unwrap_or_else(|| "-".into());
        let target = match e.tolerance {
            Some(t) => format!(
                "{}{:.0}%{}",
                if e.within() { "ok ±" } else { "MISS ±" },
                t * 100.0,
                if e.slack > 0 {
                    if e.slack > trainmem_core::compare::HOST_RESOLUTION {
                        format!(" + {} (loader scheduling)", mib(e.slack))
                    } else {
                        format!(
                            " + {} (measurement resolution)",
                            trainmem_core::ByteSize(e.slack)
                        )
                    }
                } else {
                    String::new()
                }
            ),
            None => "".into(),
        };
        let _ = writeln!(
            out,
            "{:<16} {:>14} {:>14} {:>9} {:>8}",
            e.category.name(),
            e.measured,
            e.simulated,
            err,
            target
        );
    }
    out
}

/// Meta against the measured run for one run: per category, one phase boundary (see
/// [`crate::meta::MetaRow::point`]), with the number of boundaries compared and outside; then
/// the categories left out and why. Empty without a comparison.
pub fn meta_table(run: &RunReport) -> String {
    let mut out = String::new();
    if let Some(why) = &run.meta_failed {
        let _ = writeln!(out, "DISAGREES: the Meta run failed: {why}");
    }
    if let Some(why) = &run.no_meta {
        let _ = writeln!(out, "(not run on Meta: {why})");
    }
    let Some(c) = &run.meta_check else {
        return out;
    };
    if let Some(why) = &c.mismatch {
        let _ = writeln!(out, "DISAGREES: the timelines do not line up: {why}");
        return out;
    }
    let _ = writeln!(
        out,
        "{:<26} {:<24} {:>12} {:>12} {:>8} {:>13} {:>11}",
        "category", "boundary shown", "measured", "Meta", "error", "largest diff", "within"
    );
    let tensors = c.rows.iter().map(|r| (r, ""));
    let records = c.records.iter().map(|r| (r, "records: "));
    for (r, what) in tensors.chain(records) {
        let err = r
            .error
            .map(|x| format!("{:+.2}%", x * 100.0))
            .unwrap_or_else(|| "-".into());
        let within = format!(
            "{}{}/{}",
            if r.within() { "ok " } else { "MISS " },
            r.boundaries - r.outside,
            r.boundaries
        );
        let _ = writeln!(
            out,
            "{:<26} {:<24} {:>12} {:>12} {:>8} {:>13} {:>11}",
            format!("{what}{}", r.category.name()),
            r.point,
            r.measured,
            r.meta,
            err,
            human(r.largest_difference as f64),
            within
        );
    }
    for e in &c.excluded {
        let _ = writeln!(out, "({} not compared: {})", e.category.name(), e.reason);
    }
    out
}

/// The heading over [`meta_table`].
pub const META_HEADING: &str = "trainmem-meta against the measured run, tensor bytes per \
category at every phase boundary, then the records beside the tensors per category (within 1% + \
16 KiB; shown: the boundary furthest outside it, else the category's measured peak; largest \
diff: over all boundaries):";

fn mark(v: &Verdict) -> &'static str {
    match (v.kind, v.reproduced) {
        (VerdictKind::Pattern, true) => "REPRODUCED    ",
        (VerdictKind::Pattern, false) => "NOT REPRODUCED",
        (VerdictKind::Knob, true) => "KNOB WORKS    ",
        (VerdictKind::Knob, false) => "KNOB FAILED   ",
    }
}

/// What the report's words mean, printed under its title.
pub const LEGEND: &str = "measured = a real burn training run on this machine; twin = \
trainmem-sim's prediction for the same plan; knob = the setting that should remove the pattern, \
run and judged the same way";

/// The reports a scenario's pattern was first described in, by number, as titles: the five
/// write-ups of training-memory trouble the catalogue was built from.
pub fn source_titles(sources: &str) -> String {
    sources
        .split(',')
        .map(str::trim)
        .map(|n| {
            let title = match n {
                "000" => "RAM that spikes at the start of every epoch",
                "001" => "memory against training iterations",
                "002" => "memory at the start of training",
                "003" => "GPU memory not released after an epoch",
                "004" => "GPU memory per batch",
                _ => return format!("[{n}]"),
            };
            format!("{title} [{n}]")
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The verdicts as lines for the terminal.
pub fn verdict_lines(verdicts: &[Verdict]) -> String {
    let mut out = String::new();
    for v in verdicts {
        let _ = writeln!(out, "[{}] {} ({})", mark(v), v.name, v.source);
        let _ = writeln!(out, "    {}", v.detail);
        let figures: Vec<String> = v
            .figures
            .iter()
            .map(|f| format!("{} = {}", f.name, f.display_value()))
            .collect();
        if !figures.is_empty() {
            let _ = writeln!(out, "    {}", figures.join("; "));
        }
    }
    out
}

/// The measured run's process at its own start, in words: the zero its OS figures are read
/// against (`None` without a measured run, or for a timeline recorded before baselines were).
pub fn baseline_line(run: &RunReport) -> Option<String> {
    let base = run.measured.as_ref()?.meta.baseline?;
    Some(format!(
        "process at the run's start: RssAnon {}, RssFile {}, counted {} (other {})",
        human(base.anon_rss as f64),
        human(base.file_rss as f64),
        human(base.categories.total() as f64),
        human(base.categories.get(Category::Other) as f64),
    ))
}

/// The records the measured run kept beside its tensors, at its largest point (the most host
/// bytes counted): burn's graph, optimizer and module records and the loader's own memory, per
/// category, measured outside the backend's ops. `None` when the run measured none.
pub fn records_line(run: &RunReport) -> Option<String> {
    let t = run.measured.as_ref()?;
    let s = t
        .samples
        .iter()
        .filter(|s| !s.host.records.is_zero())
        .max_by_key(|s| s.host.categories.total())?;
    let parts: Vec<String> = Category::ALL
        .iter()
        .filter(|&&c| s.host.records.get(c) > 0)
        .map(|&c| format!("{} {}", c.name(), human(s.host.records.get(c) as f64)))
        .collect();
    Some(format!(
        "records beside the tensors at {} (burn's graph, optimizer and module records, the \
         loader's memory; host bytes made outside the backend's ops): {} of {} counted: {}",
        row_label(s)
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" "),
        human(s.host.records.total() as f64),
        human(s.host.categories.total() as f64),
        parts.join(", ")
    ))
}

/// The whole report for the terminal.
pub fn render_text(report: &ScenarioReport) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "== scenario {}: {}", report.name, report.title);
    let _ = writeln!(
        out,
        "   as people report it: {}\n   mode {:?}, backend {:?}\n   {LEGEND}\n",
        source_titles(&report.sources),
        report.mode,
        report.backend
    );
    for run in &report.runs {
        let _ = writeln!(out, "-- run: {}", run.label);
        if let Some(line) = baseline_line(run) {
            let _ = writeln!(out, "   {line}");
        }
        out.push_str(&chart(run));
        if let Some(line) = records_line(run) {
            let _ = writeln!(out, "{line}");
        }
        let table = twin_table(run);
        if !table.is_empty() {
            let _ = writeln!(out, "\ntwin error per category at the peak:");
            out.push_str(&table);
            if let Some(why) = &run.no_targets {
                let _ = writeln!(out, "(no accuracy targets for this run: {why})");
            }
        }
        let meta = meta_table(run);
        if !meta.is_empty() {
            let _ = writeln!(out, "\n{META_HEADING}");
            out.push_str(&meta);
        }
        out.push('\n');
    }
    out.push_str(&verdict_lines(&report.verdicts));
    out.push('\n');
    for paragraph in &report.explanation {
        let _ = writeln!(out, "{paragraph}\n");
    }
    for note in &report.notes {
        let _ = writeln!(out, "note: {note}");
    }
    out
}

/// The verdicts section: a table of every check with its figures, then each check's detail.
fn markdown_verdicts(verdicts: &[Verdict]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "## Verdicts\n");
    let _ = writeln!(
        out,
        "| check | source | kind | result | figures |\n|---|---|---|---|---|"
    );
    for v in verdicts {
        let result = match (v.kind, v.reproduced) {
            (VerdictKind::Pattern, true) => "reproduced",
            (VerdictKind::Pattern, false) => "**not reproduced**",
            (VerdictKind::Knob, true) => "removes it",
            (VerdictKind::Knob, false) => "**does not remove it**",
        };
        let kind = match v.kind {
            VerdictKind::Pattern => "pattern",
            VerdictKind::Knob => "knob",
        };
        let figures: Vec<String> = v
            .figures
            .iter()
            .map(|f| format!("{} = {}", f.name, f.display_value()))
            .collect();
        let _ = writeln!(
            out,
            "| {} | {} | {kind} | {result} | {} |",
            v.name,
            v.source,
            figures.join("<br>")
        );
    }
    out.push('\n');
    for v in verdicts {
        let _ = writeln!(out, "* **{}** ({}): {}", v.name, v.source, v.detail);
    }
    out
}

/// One run's section: why it was not measured, its baseline, its chart, the twin's error
/// per category and Meta's table.
fn markdown_run(run: &RunReport) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "## Run: {}\n", run.label);
    if let Some(why) = &run.not_measured {
        let _ = writeln!(out, "Not measured: {why}\n");
    }
    if let Some(line) = baseline_line(run) {
        let _ = writeln!(out, "{line}\n");
    }
    let _ = writeln!(out, "```text\n{}```\n", chart(run));
    if let Some(line) = records_line(run) {
        let _ = writeln!(out, "{line}\n");
    }
    let table = twin_table(run);
    if !table.is_empty() {
        let _ = writeln!(
            out,
            "Twin error per category at the peak:\n\n```text\n{table}```\n"
        );
    }
    let meta = meta_table(run);
    if !meta.is_empty() {
        let _ = writeln!(out, "{META_HEADING}\n\n```text\n{meta}```\n");
    }
    out
}

/// The whole report as markdown.
pub fn render_markdown(report: &ScenarioReport) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# Scenario `{}`\n\n{}\n", report.name, report.title);
    let _ = writeln!(
        out,
        "As people report it: {}. Mode: {:?}. Backend: {:?}.\n\n{LEGEND}.\n",
        source_titles(&report.sources),
        report.mode,
        report.backend
    );
    out.push_str(&markdown_verdicts(&report.verdicts));
    let _ = writeln!(out, "\n## Why, and what removes it\n");
    for paragraph in &report.explanation {
        let _ = writeln!(out, "{paragraph}\n");
    }
    for run in &report.runs {
        out.push_str(&markdown_run(run));
    }
    if !report.notes.is_empty() {
        let _ = writeln!(out, "## Notes\n");
        for note in &report.notes {
            let _ = writeln!(out, "* {note}");
        }
        out.push('\n');
    }
    if !report.files.is_empty() {
        let _ = writeln!(out, "## Files\n");
        for f in &report.files {
            let _ = writeln!(out, "* `{f}`");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::checks::testing::{sample, timeline as of};
    use super::*;
    use trainmem_core::compare::category_errors;
    use trainmem_core::timeline::Phase;

    fn timeline(source: Source, values: &[(Phase, u64, u64)]) -> Timeline {
        of(
            source,
            values.iter().map(|&(phase, step, act)| {
                sample(
                    phase,
                    step,
                    0,
                    &[(Category::Parameter, 1 << 20), (Category::Activation, act)],
                )
            }),
        )
    }

    #[test]
    fn twin_errors_use_the_peak_of_each_category() {
        let m = timeline(
            Source::Measured,
            &[(Phase::Forward, 0, 1000), (Phase::Backward, 0, 10)],
        );
        let s = timeline(
            Source::Simulated,
            &[(Phase::Forward, 0, 1050), (Phase::Backward, 0, 0)],
        );
        let rows = category_errors(&m, &s, Domain::Host);
        assert_eq!(rows.len(), 2);
        let act = rows
            .iter()
            .find(|r| r.category == Category::Activation)
            .expect("activation row");
        assert_eq!((act.measured, act.simulated), (1000, 1050));
        assert!((act.error.unwrap_or(0.0) - 0.05).abs() < 1e-9);
        assert!(act.within());
        let param = rows
            .iter()
            .find(|r| r.category == Category::Parameter)
            .expect("parameter row");
        assert_eq!(param.error, Some(0.0));
        let miss = CategoryError {
            category: Category::Gradient,
            measured: 100,
            simulated: 103,
            error: Some(0.03),
            tolerance: trainmem_core::compare::tolerance(Category::Gradient),
            slack: 0,
        };
        assert!(!miss.within());
    }

    /// A run of a 2 → 2 MLP compared in host memory, with these timelines and twin errors.
    fn host_run(
        measured: Option<Timeline>,
        simulated: Option<Timeline>,
        twin: Vec<CategoryError>,
    ) -> RunReport {
        RunReport {
            label: "x".into(),
            plan: trainmem_core::Plan::from_toml_str(
                "[model.mlp]\ninput = 2\nhidden = []\noutput = 2\n",
            )
            .expect("plan"),
            domain: Domain::Host,
            twin,
            measured,
            simulated,
            not_measured: None,
            no_targets: None,
            meta_run: None,
            meta_check: None,
            meta_failed: None,
            no_meta: None,
        }
    }

    #[test]
    fn chart_overlays_the_twin_and_stacks_categories() {
        let m = timeline(
            Source::Measured,
            &[(Phase::Forward, 0, 1 << 20), (Phase::Backward, 0, 0)],
        );
        let s = timeline(
            Source::Simulated,
            &[(Phase::Forward, 0, 1 << 20), (Phase::Backward, 0, 0)],
        );
        let twin = category_errors(&m, &s, Domain::Host);
        let run = host_run(Some(m), Some(s), twin);
        let text = chart(&run);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert!(lines[2].contains('P') && lines[2].contains('A'));
        assert!(lines[2].contains('|'));
        assert!(!lines[3].contains('A'));
        assert!(lines[2].contains("+0.0%"));
        assert!(twin_table(&run).contains("activation"));
        assert_eq!(records_line(&run), None, "no records measured");
    }

    #[test]
    fn the_records_are_named_at_the_largest_point() {
        let mut m = timeline(
            Source::Measured,
            &[(Phase::Forward, 0, 1 << 20), (Phase::Backward, 0, 4096)],
        );
        for s in &mut m.samples {
            s.host.records.set(Category::Activation, 3072);
        }
        let run = host_run(Some(m), None, Vec::new());
        let line = records_line(&run).expect("records measured");
        assert!(line.contains("forward"), "{line}");
        assert!(line.contains("activation 3.0 KiB"), "{line}");
    }

    #[test]
    fn source_numbers_are_shown_with_their_titles() {
        assert_eq!(
            source_titles("001, 000"),
            "memory against training iterations [001]; RAM that spikes at the start of every \
             epoch [000]"
        );
        assert_eq!(source_titles("042"), "[042]");
    }

    #[test]
    fn markdown_flags_failures() {
        let report = ScenarioReport {
            name: "x".into(),
            title: "t".into(),
            sources: "000".into(),
            mode: Mode::Simulated,
            backend: BackendChoice::Flex,
            runs: vec![],
            verdicts: vec![Verdict {
                kind: VerdictKind::Pattern,
                name: "p".into(),
                source: Source::Simulated,
                reproduced: false,
                detail: "d".into(),
                figures: vec![Figure::bytes("f", 1 << 20)],
            }],
            explanation: vec!["e".into()],
            notes: vec![],
            files: vec![],
            memory_viz: None,
        };
        assert!(!report.all_reproduced());
        let md = render_markdown(&report);
        assert!(md.contains("**not reproduced**"));
        assert!(md.contains("f = 1.00 MiB"));
        assert!(render_text(&report).contains("NOT REPRODUCED"));
    }
}
