//! Scenarios run end to end: every scenario of the catalogue simulated, and the measured subset
//! (epoch-spike, optimizer-jump, retained-leak, grad-accumulation, checkpoint-save,
//! empty-cache) trained for real on burn's Flex backend with the prediction held to its
//! accuracy targets.
//!
//! This is a test binary of its own, and its tests run one at a time for their whole length:
//! a measured run reads trainmem-probe's process-wide counters, so no other test may allocate
//! in the process while one is running.

use std::sync::{Mutex, MutexGuard};

use trainmem_scenarios::report::{self, VerdictKind};
use trainmem_scenarios::{Backend, Mode, SCENARIOS, ScenarioReport, execute, find, output};

#[global_allocator]
static ALLOC: trainmem_probe::CountingAlloc = trainmem_probe::CountingAlloc::new();

/// Held by each test for its whole run.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn run_one(name: &str, mode: Mode) -> ScenarioReport {
    run_with_json(name, mode).0
}

/// Runs a scenario, writes its files, and returns the report with its `timeline.json` as read
/// back from disk.
fn run_with_json(name: &str, mode: Mode) -> (ScenarioReport, serde_json::Value) {
    let scenario = find(name).unwrap_or_else(|| panic!("scenario {name} registered"));
    let dir = std::env::temp_dir().join(format!(
        "trainmem-scenario-test-{}-{name}-{mode:?}",
        std::process::id()
    ));
    let mut report = execute(scenario, mode, Backend::Flex, dir.clone(), false)
        .unwrap_or_else(|e| panic!("{name}: {}", e.chain()));
    output::write_outputs(&mut report, &dir).unwrap_or_else(|e| panic!("{name}: {}", e.chain()));
    for f in ["report.md", "timeline.json", "timeline.svg", "trace.json"] {
        assert!(dir.join(f).is_file(), "{name}: {f} written");
    }
    let pickle = std::fs::read(dir.join("memory_viz.pickle")).expect("memory_viz.pickle read");
    assert_viewer_can_draw(name, &pickle);
    let text = std::fs::read_to_string(dir.join("timeline.json")).expect("timeline.json read");
    let json: serde_json::Value = serde_json::from_str(&text).expect("timeline.json parses");
    let _ = std::fs::remove_dir_all(&dir);
    (report, json)
}

/// Checks a written memory_viz pickle for what PyTorch's viewers read: segments with their
/// blocks, a device trace, allocator settings, trace categories named after trainmem's, and
/// the `unknown` category without which the web page draws nothing.
fn assert_viewer_can_draw(name: &str, pickle: &[u8]) {
    let snap = trainmem_alloc::pytorch::pickle::from_bytes(pickle)
        .unwrap_or_else(|e| panic!("{name}: memory_viz.pickle does not read back: {e}"));
    assert!(!snap.segments.is_empty(), "{name}: no segments");
    for seg in &snap.segments {
        let tiled: u64 = seg.blocks.iter().map(|b| b.size).sum();
        assert_eq!(
            tiled, seg.total_size,
            "{name}: blocks tile segment {:#x}",
            seg.address
        );
    }
    assert!(
        snap.device_traces.iter().any(|t| !t.is_empty()),
        "{name}: no device trace"
    );
    assert!(
        snap.allocator_settings.is_some(),
        "{name}: no allocator_settings"
    );
    let categories = snap.categories();
    assert!(
        categories.contains(&"unknown"),
        "{name}: no `unknown` category: {categories:?}"
    );
    assert!(
        categories
            .iter()
            .any(|c| trainmem_probe::Category::ALL.iter().any(|k| k.name() == *c)),
        "{name}: no trainmem category in the trace: {categories:?}"
    );
}

/// Reads the twin-error rows of run `run` from a scenario's JSON report and checks that the
/// measured side counted real bytes (parameters above zero) and that every row with a target
/// is within it.
fn assert_twin_on_target(name: &str, json: &serde_json::Value, run: usize) {
    let r = &json["runs"][run];
    assert_eq!(
        r["domain"], "host",
        "{name}: a Flex run is compared on the host"
    );
    let rows = r["twin"].as_array().expect("twin rows");
    assert!(!rows.is_empty(), "{name}: no twin rows in the JSON report");
    let params = rows
        .iter()
        .find(|row| row["category"] == "parameter")
        .unwrap_or_else(|| panic!("{name}: no parameter row"));
    assert!(
        params["measured"].as_u64().unwrap_or(0) > 0,
        "{name}: measured parameter bytes are 0: {params}"
    );
    for row in rows {
        let (Some(tol), Some(measured)) = (row["tolerance"].as_f64(), row["measured"].as_u64())
        else {
            continue;
        };
        assert!(
            measured > 0,
            "{name}: measured {} is 0: {row}",
            row["category"]
        );
        let predicted = row["simulated"].as_u64().expect("predicted bytes");
        let slack = row["slack"].as_u64().expect("slack bytes");
        assert!(
            predicted.abs_diff(measured) as f64 <= tol * measured as f64 + slack as f64,
            "{name}: twin {predicted} against measured {measured} for {} beyond its {:.0}% \
             target (+ {slack} bytes of slack): {row}",
            row["category"],
            tol * 100.0
        );
    }
    // The measured series itself: every sample after a forward pass holds parameter bytes.
    let samples = r["measured"]["samples"]
        .as_array()
        .expect("measured samples");
    let forward: Vec<&serde_json::Value> =
        samples.iter().filter(|s| s["phase"] == "forward").collect();
    assert!(!forward.is_empty(), "{name}: no forward samples");
    for s in forward {
        assert!(
            s["host"]["categories"]["parameter"].as_u64().unwrap_or(0) > 0,
            "{name}: a measured forward sample without parameter bytes: {s}"
        );
    }
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
fn every_scenario_reproduces_in_simulated_mode() {
    let _one_at_a_time = serial();
    for s in SCENARIOS {
        let report = run_one(s.name, Mode::Simulated);
        assert_reproduced(&report, Mode::Simulated);
    }
}

/// Runs `name` measured and simulated: the pattern reproduces on the real run, and the twin is
/// within its target in every run, as the report says and as its JSON file says.
fn measured_with_the_twin_on_target(name: &str) {
    let _one_at_a_time = serial();
    let (report, json) = run_with_json(name, Mode::Both);
    assert_reproduced(&report, Mode::Measured);
    assert!(
        report.twin_misses().is_empty(),
        "{name}: {:?}",
        report.twin_misses()
    );
    for run in 0..report.runs.len() {
        assert_twin_on_target(name, &json, run);
    }
}

#[test]
fn measured_optimizer_jump() {
    measured_with_the_twin_on_target("optimizer-jump");
}

#[test]
fn measured_retained_leak() {
    measured_with_the_twin_on_target("retained-leak");
}

#[test]
fn measured_epoch_spike() {
    measured_with_the_twin_on_target("epoch-spike");
}

#[test]
fn measured_grad_accumulation_checkpoint_save_and_empty_cache() {
    let _one_at_a_time = serial();
    for name in ["grad-accumulation", "checkpoint-save", "empty-cache"] {
        let report = run_one(name, Mode::Both);
        assert_reproduced(&report, Mode::Measured);
    }
}
