//! What a scenario hands back, and how it is shown: a terminal timeline chart, verdicts with
//! their figures, a markdown report and a JSON timeline.

use std::fmt::Write as _;

use serde::Serialize;

/// One sample of the timeline, taken at a phase boundary.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sample {
    /// Phase boundary name (`epoch_start`, `forward`, `backward`, `optimizer_step`,
    /// `empty_cache`, ...).
    pub phase: String,
    /// What happened, for people (`epoch 1, batch 3`).
    pub label: String,
    /// Bytes in live blocks (`allocated_bytes.all.current`).
    pub allocated: u64,
    /// Bytes held from the device (`reserved_bytes.all.current`).
    pub reserved: u64,
    /// Free bytes inside segments that also hold live blocks (`inactive_split_bytes.all.current`).
    pub inactive_split: u64,
}

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
            "bytes" => mib(self.value as u64),
            "ratio" => format!("{:.2}", self.value),
            _ => format!("{}", self.value),
        }
    }
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

/// The outcome of one check.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Verdict {
    /// Pattern or knob.
    pub kind: VerdictKind,
    /// Short name of what is checked.
    pub name: String,
    /// Whether the run showed it.
    pub reproduced: bool,
    /// The condition checked, in words, with the numbers.
    pub detail: String,
    /// The figures behind it.
    pub figures: Vec<Figure>,
}

/// Everything a scenario produces.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScenarioReport {
    /// Registry name.
    pub name: String,
    /// One-line title.
    pub title: String,
    /// What was run (model, sizes, device).
    pub setup: String,
    /// The timeline, one sample per phase boundary.
    pub timeline: Vec<Sample>,
    /// The checks.
    pub verdicts: Vec<Verdict>,
    /// Which bytes cause the pattern and which knob removes it (markdown paragraphs).
    pub explanation: Vec<String>,
}

impl ScenarioReport {
    /// True when every pattern and knob check came out as expected.
    pub fn all_reproduced(&self) -> bool {
        self.verdicts.iter().all(|v| v.reproduced)
    }
}

/// Bytes as MiB with one decimal.
pub fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

/// Width of the bars in the chart.
const BAR: usize = 40;

/// The timeline as a compact text chart: one row per sample, `█` allocated and `░` reserved
/// but not allocated (the cache), scaled to the largest reserved figure.
pub fn timeline_chart(samples: &[Sample]) -> String {
    let scale = samples
        .iter()
        .map(|s| s.reserved.max(s.allocated))
        .max()
        .unwrap_or(0)
        .max(1);
    let label_width = samples
        .iter()
        .map(|s| s.label.chars().count())
        .max()
        .unwrap_or(0)
        .max(5);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:label_width$}  {:BAR$}  {:>11} {:>11} {:>11}",
        "phase", "█ allocated  ░ cached", "allocated", "reserved", "inact.split"
    );
    for s in samples {
        let cells = |bytes: u64| ((bytes as u128 * BAR as u128).div_ceil(scale as u128)) as usize;
        let alloc_cells = cells(s.allocated).min(BAR);
        let reserved_cells = cells(s.reserved).clamp(alloc_cells, BAR);
        let bar: String = "█".repeat(alloc_cells)
            + &"░".repeat(reserved_cells - alloc_cells)
            + &" ".repeat(BAR - reserved_cells);
        let _ = writeln!(
            out,
            "{:label_width$}  {bar}  {:>11} {:>11} {:>11}",
            s.label,
            mib(s.allocated),
            mib(s.reserved),
            mib(s.inactive_split)
        );
    }
    out
}

/// The verdicts as lines for the terminal.
pub fn verdict_lines(verdicts: &[Verdict]) -> String {
    let mut out = String::new();
    for v in verdicts {
        let mark = match (v.kind, v.reproduced) {
            (VerdictKind::Pattern, true) => "REPRODUCED    ",
            (VerdictKind::Pattern, false) => "NOT REPRODUCED",
            (VerdictKind::Knob, true) => "KNOB WORKS    ",
            (VerdictKind::Knob, false) => "KNOB FAILED   ",
        };
        let _ = writeln!(out, "[{mark}] {}", v.name);
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

/// The whole report for the terminal.
pub fn render_text(report: &ScenarioReport) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "== scenario {}: {}", report.name, report.title);
    let _ = writeln!(out, "{}\n", report.setup);
    out.push_str(&timeline_chart(&report.timeline));
    out.push('\n');
    out.push_str(&verdict_lines(&report.verdicts));
    out.push('\n');
    for paragraph in &report.explanation {
        let _ = writeln!(out, "{paragraph}\n");
    }
    out
}

/// The whole report as markdown.
pub fn render_markdown(report: &ScenarioReport) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# Scenario `{}`: {}\n", report.name, report.title);
    let _ = writeln!(out, "{}\n", report.setup);
    let _ = writeln!(
        out,
        "## Timeline\n\n```text\n{}```\n",
        timeline_chart(&report.timeline)
    );
    let _ = writeln!(out, "## Verdicts\n");
    let _ = writeln!(
        out,
        "| check | kind | result | figures |\n|---|---|---|---|"
    );
    for v in &report.verdicts {
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
            "| {} | {kind} | {result} | {} |",
            v.name,
            figures.join("<br>")
        );
    }
    out.push('\n');
    for v in &report.verdicts {
        let _ = writeln!(out, "* **{}**: {}", v.name, v.detail);
    }
    let _ = writeln!(out, "\n## Why, and what removes it\n");
    for paragraph in &report.explanation {
        let _ = writeln!(out, "{paragraph}\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(label: &str, allocated: u64, reserved: u64) -> Sample {
        Sample {
            phase: "p".into(),
            label: label.into(),
            allocated,
            reserved,
            inactive_split: 0,
        }
    }

    #[test]
    fn chart_scales_bars_to_the_largest_reserved() {
        let chart = timeline_chart(&[sample("a", 10 << 20, 40 << 20), sample("b", 0, 0)]);
        let lines: Vec<&str> = chart.lines().collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[1].matches('█').count(), 10);
        assert_eq!(lines[1].matches('░').count(), 30);
        assert!(lines[1].contains("40.0 MiB"));
        assert_eq!(
            lines[2].matches('█').count() + lines[2].matches('░').count(),
            0
        );
    }

    #[test]
    fn markdown_flags_failures() {
        let report = ScenarioReport {
            name: "x".into(),
            title: "t".into(),
            setup: "s".into(),
            timeline: vec![sample("a", 1, 2)],
            verdicts: vec![Verdict {
                kind: VerdictKind::Pattern,
                name: "p".into(),
                reproduced: false,
                detail: "d".into(),
                figures: vec![Figure::bytes("f", 1 << 20)],
            }],
            explanation: vec!["e".into()],
        };
        assert!(!report.all_reproduced());
        let md = render_markdown(&report);
        assert!(md.contains("**not reproduced**"));
        assert!(md.contains("f = 1.0 MiB"));
        assert!(render_text(&report).contains("NOT REPRODUCED"));
    }
}
