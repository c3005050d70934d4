//! Scenarios run end to end: every scenario of the catalogue simulated, and every scenario that
//! is measured on the CPU trained for real on burn's Flex backend, with the twin held to its
//! accuracy targets (epoch-spike, optimizer-jump, retained-leak) and trainmem-meta (the same
//! plan and training loop on `Autodiff<Meta>`) held to the measured tensor bytes per category
//! at every phase boundary (all of them).
//!
//! This is a test binary of its own, and its tests run one at a time for their whole length:
//! a measured run reads trainmem-probe's process-wide counters, so no other test may allocate
//! in the process while one is running.

use std::sync::{Mutex, MutexGuard};

use trainmem_burn::BackendChoice;
use trainmem_scenarios::report::{self, VerdictKind};
use trainmem_scenarios::{
    ChildCommand, Ctx, Isolation, Mode, SCENARIOS, ScenarioReport, execute_in, find, output,
};

#[global_allocator]
static ALLOC: trainmem_probe::CountingAlloc = trainmem_probe::CountingAlloc::new();

/// Held by each test for its whole run.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The name of the test that serves measured runs in child processes.
const CHILD_TEST: &str = "measured_run_child";

/// Not a check: the entry point of the child processes the measured tests start, so that each
/// measured run is made in a fresh process whatever ran before it in this one. Run without
/// trainmem-scenarios' child variable (as in a plain `cargo test`) it does nothing.
#[test]
fn measured_run_child() {
    if let Some(status) = trainmem_scenarios::isolate::serve_child_status() {
        std::process::exit(status);
    }
}

/// Runs scenario `name` with every measured run in a child process of its own.
fn execute_isolated(
    name: &str,
    mode: Mode,
    dir: std::path::PathBuf,
) -> Result<ScenarioReport, trainmem_scenarios::ScenarioError> {
    let scenario = find(name).unwrap_or_else(|| panic!("scenario {name} registered"));
    let mut ctx = Ctx::new(mode, BackendChoice::Flex, dir, false);
    ctx.isolation = Isolation::Child(ChildCommand::test_harness(CHILD_TEST).expect("test binary"));
    // Every measured run is made on trainmem-meta too, and compared.
    ctx.meta = mode.measured();
    execute_in(scenario, ctx)
}

fn run_one(name: &str, mode: Mode) -> ScenarioReport {
    run_with_json(name, mode).0
}

/// Runs a scenario, writes its files, and returns the report with its `timeline.json` as read
/// back from disk.
fn run_with_json(name: &str, mode: Mode) -> (ScenarioReport, serde_json::Value) {
    let dir = std::env::temp_dir().join(format!(
        "trainmem-scenario-test-{}-{name}-{mode:?}",
        std::process::id()
    ));
    let mut report = execute_isolated(name, mode, dir.clone())
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

/// Checks a written memory_viz pickle for what PyTorch's viewers read (verbatim, with the
/// entries trainmem's writer adds for them): segments with their blocks, a device trace,
/// allocator settings, trace categories named after trainmem's, and the `unknown` category
/// without which the web page draws nothing.
fn assert_viewer_can_draw(name: &str, pickle: &[u8]) {
    let snap = trainmem_alloc::pytorch::pickle::from_bytes_verbatim(pickle)
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
            .any(|c| trainmem_core::Category::ALL.iter().any(|k| k.name() == *c)),
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

/// The scenarios measured on the CPU that have no Meta comparison, and why.
const NOT_ON_META: &[(&str, &str)] = &[(
    "model-parallel",
    "simulated only: burn 0.21 has no pipeline split across devices to measure",
)];

/// Runs of measured scenarios that are not a training run of their own (simulated only, or a
/// replay of another run's allocations), so nothing to hold Meta to, and why.
const RUNS_NOT_ON_META: &[(&str, &str, &str)] = &[
    (
        "startup",
        "eager optimizer state (twin)",
        "simulated only: burn-optim creates optimizer state inside the first step",
    ),
    (
        "empty-cache",
        "through the caching allocator",
        "the measured side is the host-view run's allocations replayed through trainmem-alloc, \
         not a training run; that run is compared",
    ),
];

/// Every run with a measured side was also trained on trainmem-meta, and Meta's tensor bytes
/// per category agree with the measured run's within 1% + 16 KiB at every phase boundary; a
/// run without a measured side must be listed in [`RUNS_NOT_ON_META`].
fn assert_meta_agrees(report: &ScenarioReport) {
    let name = report.name.as_str();
    let mut compared = 0;
    for run in &report.runs {
        let listed = RUNS_NOT_ON_META
            .iter()
            .any(|(s, r, _)| *s == name && *r == run.label);
        if listed || run.measured.is_none() {
            assert!(
                listed,
                "{name} / {}: a run without a measured side that is not listed in \
                 RUNS_NOT_ON_META",
                run.label
            );
            assert!(run.meta_check.is_none(), "{name} / {}", run.label);
            continue;
        }
        let check = run.meta_check.as_ref().unwrap_or_else(|| {
            panic!(
                "{name} / {}: measured but not compared with Meta ({:?})",
                run.label, run.meta_failed
            )
        });
        assert!(
            check.agrees(),
            "{name} / {}: trainmem-meta disagrees with the measured run:\n{}",
            run.label,
            report::meta_table(run)
        );
        assert!(
            check.rows.iter().all(|r| r.boundaries > 4),
            "{name} / {}: too few phase boundaries compared",
            run.label
        );
        compared += 1;
    }
    assert!(compared > 0, "{name}: no run compared with Meta");
    assert!(report.meta_disagreements().is_empty());
}

#[test]
fn every_scenario_is_compared_with_meta_or_says_why_not() {
    let mut covered: Vec<&str> = [MEASURED_ON_META_ELSEWHERE, MEASURED_ON_META_HERE].concat();
    covered.extend(NOT_ON_META.iter().map(|(s, _)| *s));
    covered.sort_unstable();
    let mut all: Vec<&str> = SCENARIOS.iter().map(|s| s.name).collect();
    all.sort_unstable();
    assert_eq!(covered, all);
}

/// The scenarios measured on the CPU that tests of their own run beside trainmem-meta.
const MEASURED_ON_META_ELSEWHERE: &[&str] = &[
    "optimizer-jump",
    "retained-leak",
    "epoch-spike",
    "grad-accumulation",
    "checkpoint-save",
    "empty-cache",
    "memmap-vs-preload",
];

/// The other scenarios measured on the CPU, run beside trainmem-meta by
/// `measured_on_meta_the_other_scenarios`.
const MEASURED_ON_META_HERE: &[&str] = &[
    "startup",
    "activation-retention",
    "per-batch-plateau",
    "logging-growth",
    "mixed-precision",
    "grad-checkpointing",
    "pinned-staging",
];

/// The measured scenarios no other test measures: the pattern reproduces on the real run, and
/// trainmem-meta agrees with it.
#[test]
fn measured_on_meta_the_other_scenarios() {
    let _one_at_a_time = serial();
    for &name in MEASURED_ON_META_HERE {
        let report = run_one(name, Mode::Measured);
        assert_reproduced(&report, Mode::Measured);
        assert_meta_agrees(&report);
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
        Mode::Measured => trainmem_core::timeline::Source::Measured,
        _ => trainmem_core::timeline::Source::Simulated,
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
    assert_meta_agrees(&report);
    assert!(
        json["runs"][0]["meta_run"]["samples"]
            .as_array()
            .is_some_and(|s| !s.is_empty()),
        "{name}: the Meta timeline in timeline.json"
    );
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
        assert_meta_agrees(&report);
    }
}

/// Whether two measured figures agree: within 5% of the larger, or within `slack` bytes.
fn figures_agree(a: f64, b: f64, slack: u64) -> bool {
    (a - b).abs() <= (0.05 * a.abs().max(b.abs())).max(slack as f64)
}

/// What two runs of a scenario may differ by in bytes whatever ran before them: the host
/// counts' resolution (a few kilobytes of runtime state land anywhere), and, with loader
/// workers, the batches the workers may hold in flight (how many they had read when a phase
/// boundary was sampled depends on how the threads were scheduled, not on process history:
/// anything from none to workers × prefetch batches, plus one being built).
fn run_to_run_slack(report: &ScenarioReport) -> u64 {
    let plan = &report.runs[0].plan;
    let batch = trainmem_sim::lower::input_bytes_per_sample_for(&plan.model, plan.framework)
        * plan.micro_batch_size();
    let in_flight = plan.loader.workers * plan.loader.prefetch_factor * batch;
    (in_flight + trainmem_core::compare::loader_slack(plan, batch))
        .max(trainmem_core::compare::HOST_RESOLUTION)
}

/// Process history shows first in a run's baseline: a fresh process starts with the same
/// resident memory every time, a reused one with whatever earlier runs left.
const BASELINE_AGREES: u64 = 1 << 20;

/// Asserts that two reports of the same scenario reached the same verdicts with the same
/// figures, and the same twin error per category on every run.
fn assert_same_outcome(a: &ScenarioReport, b: &ScenarioReport, orders: &str) {
    let name = &a.name;
    let slack = run_to_run_slack(a);
    let agree = |x: f64, y: f64, unit: &str| {
        if unit == "bytes" {
            figures_agree(x, y, slack)
        } else {
            figures_agree(x, y, 0)
        }
    };
    assert_eq!(
        a.verdicts.len(),
        b.verdicts.len(),
        "{name}: verdict count, {orders}"
    );
    for (x, y) in a.verdicts.iter().zip(&b.verdicts) {
        assert_eq!(
            (&x.name, x.source, x.reproduced),
            (&y.name, y.source, y.reproduced),
            "{name}: verdict, {orders}"
        );
        assert_eq!(x.figures.len(), y.figures.len(), "{name}: {}", x.name);
        for (f, g) in x.figures.iter().zip(&y.figures) {
            assert_eq!(f.name, g.name, "{name}: {}", x.name);
            assert!(
                agree(f.value, g.value, f.unit),
                "{name}: `{}` of `{}` is {} in one order and {} in the other ({orders})",
                f.name,
                x.name,
                f.value,
                g.value
            );
        }
    }
    for (ra, rb) in a.runs.iter().zip(&b.runs) {
        let (Some(ma), Some(mb)) = (&ra.measured, &rb.measured) else {
            continue;
        };
        let (Some(ba), Some(bb)) = (ma.meta.baseline, mb.meta.baseline) else {
            panic!("{name} / {}: a measured run without its baseline", ra.label);
        };
        for (what, x, y) in [
            ("RssAnon", ba.anon_rss, bb.anon_rss),
            ("RssFile", ba.file_rss, bb.file_rss),
            ("counted", ba.categories.total(), bb.categories.total()),
        ] {
            assert!(
                x.abs_diff(y) <= BASELINE_AGREES,
                "{name} / {}: {what} at the run's start is {x} in one order and {y} in the \
                 other ({orders}): the run did not start from a fresh process",
                ra.label
            );
        }
        for (ea, eb) in ra.twin.iter().zip(&rb.twin) {
            assert_eq!(ea.category, eb.category);
            assert!(
                agree(ea.measured as f64, eb.measured as f64, "bytes"),
                "{name} / {}: measured {:?} peak {} vs {} ({orders})",
                ra.label,
                ea.category,
                ea.measured,
                eb.measured
            );
        }
    }
}

/// Two measured scenarios, run in both orders in this one process: each reaches the same
/// verdicts with the same figures whether it ran first or second, because each measured run is
/// made in a fresh child process. memmap-vs-preload reads RssAnon and RssFile, which an
/// in-process run shares with everything that ran before it.
#[test]
fn measured_verdicts_do_not_depend_on_the_order_scenarios_run_in() {
    let _turn = serial();
    let pair = ["memmap-vs-preload", "optimizer-jump"];
    let forward: Vec<ScenarioReport> = pair.iter().map(|n| run_one(n, Mode::Both)).collect();
    let backward: Vec<ScenarioReport> = pair.iter().rev().map(|n| run_one(n, Mode::Both)).collect();
    for report in forward.iter().chain(&backward) {
        assert_reproduced(report, Mode::Measured);
        assert_meta_agrees(report);
    }
    assert_same_outcome(&forward[0], &backward[1], "first vs after optimizer-jump");
    assert_same_outcome(
        &forward[1],
        &backward[0],
        "after memmap-vs-preload vs first",
    );
}
