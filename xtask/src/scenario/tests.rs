//! The scenario runner's tests: every scenario's simulated mode, and the measured subset CI
//! runs (epoch-spike, optimizer-jump, retained-leak) on burn's Flex backend.

use super::report::VerdictKind;
use super::*;

/// Scenarios run one at a time: measured runs count the whole process's allocations.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn run_one(name: &str, mode: Mode) -> ScenarioReport {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let scenario = find(name).unwrap_or_else(|| panic!("scenario {name} registered"));
    let dir = std::env::temp_dir().join(format!(
        "trainmem-scenario-test-{}-{name}-{mode:?}",
        std::process::id()
    ));
    let mut report = execute(scenario, mode, Backend::Flex, dir.clone(), false)
        .unwrap_or_else(|e| panic!("{name}: {e:#}"));
    output::write_outputs(&mut report, &dir).unwrap_or_else(|e| panic!("{name}: {e:#}"));
    for f in ["report.md", "timeline.json", "timeline.svg", "trace.json"] {
        assert!(dir.join(f).is_file(), "{name}: {f} written");
    }
    let _ = std::fs::remove_dir_all(&dir);
    report
}

fn assert_reproduced(report: &ScenarioReport, mode: Mode) {
    assert!(
        report.all_reproduced(),
        "{} ({mode:?}) not reproduced:\n{}",
        report.name,
        report::verdict_lines(&report.verdicts)
    );
    let wanted = match mode {
        Mode::Measured => trainmem_sim::timeline::Source::Measured,
        _ => trainmem_sim::timeline::Source::Simulated,
    };
    assert!(
        report.verdicts.iter().any(|v| v.source == wanted),
        "{}: no verdict from the {wanted} timeline",
        report.name
    );
    assert!(
        report.verdicts.iter().any(|v| v.kind == VerdictKind::Knob),
        "{}: the knob that removes the pattern was not run",
        report.name
    );
}

#[test]
fn registry_names_are_unique_and_findable() {
    let mut names: Vec<&str> = SCENARIOS.iter().map(|s| s.name).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), SCENARIOS.len());
    assert_eq!(SCENARIOS.len(), 15, "the catalogue has fifteen scenarios");
    assert!(!names.contains(&"all"), "`all` is reserved");
    for s in SCENARIOS {
        assert_eq!(find(s.name).map(|f| f.description), Some(s.description));
        assert!(!s.explanation.is_empty(), "{}: explanation", s.name);
        assert!(
            ctx::plans_dir().join(format!("{}.toml", s.name)).is_file(),
            "{}: plan file",
            s.name
        );
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

#[test]
fn every_scenario_reproduces_in_simulated_mode() {
    for s in SCENARIOS {
        let report = run_one(s.name, Mode::Simulated);
        assert_reproduced(&report, Mode::Simulated);
    }
}

#[test]
fn measured_optimizer_jump() {
    let report = run_one("optimizer-jump", Mode::Both);
    assert_reproduced(&report, Mode::Measured);
}

#[test]
fn measured_retained_leak() {
    let report = run_one("retained-leak", Mode::Both);
    assert_reproduced(&report, Mode::Measured);
}

#[test]
fn measured_epoch_spike() {
    let report = run_one("epoch-spike", Mode::Both);
    assert_reproduced(&report, Mode::Measured);
}

#[test]
fn measured_grad_accumulation_checkpoint_save_and_empty_cache() {
    for name in ["grad-accumulation", "checkpoint-save", "empty-cache"] {
        let report = run_one(name, Mode::Both);
        assert_reproduced(&report, Mode::Measured);
    }
}
