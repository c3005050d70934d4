//! `trainmem explain`'s categories held against PyTorch's own: the runs of
//! `fixtures/pytorch-profiled/<device>/` were profiled by torch.profiler's memory profiler
//! (`validation/pytorch/profile_truth.py`), which names every storage from the run's data
//! flow; the snapshot of the same run is explained as a user's is, and the two are compared by
//! bytes (`snapshot_explain::profiler_truth`).

use std::path::PathBuf;

use trainmem_sim::snapshot_explain::profiler_truth::{
    ProfiledRun, ProfilerCategory, compare, compare_without_frames, profiled_runs,
};

/// The share of bytes each run must agree on: all allocations, at the peak, and the
/// allocations the profiler's data flow names. The lowest measured: 99.89%, litgpt's model at
/// its peak, where its rotary tables (buffers the size of a parameter, 16 KiB) are counted as
/// parameters, as the hand-written GPT's two 4 KiB causal masks are (99.95%).
const AGREEMENT: f64 = 0.998;

fn runs() -> Vec<ProfiledRun> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/pytorch-profiled");
    profiled_runs(&dir).expect("the profiled runs read")
}

#[test]
fn explain_agrees_with_torch_profiler_on_every_profiled_run() {
    let runs = runs();
    let on_cpu = runs.iter().filter(|r| r.truth.device == "cpu").count();
    assert!(on_cpu >= 19, "the CPU runs are committed ({on_cpu})");
    for run in &runs {
        let c = compare(&run.snapshot, &run.truth).expect("compares");
        let name = format!("{} ({})", c.name, c.device);
        // the profiler decided a good share of the bytes, so the comparison says something
        // (the least: 47.7% of ResNet-18's, whose convolutions' scratch it leaves undecided)
        assert!(
            c.all.compared as f64 >= 0.4 * c.total as f64,
            "{name}: compared {} of {} B",
            c.all.compared,
            c.total
        );
        for (what, a) in [
            ("all", &c.all),
            ("at the peak", &c.at_peak),
            ("by data flow", &c.by_data_flow),
        ] {
            assert!(
                a.share() >= AGREEMENT,
                "{name} {what}: {:.3}% of {} B agreed; disagreements (entry, bytes, profiler, expected, trainmem): {:?}",
                100.0 * a.share(),
                a.compared,
                &c.disagreements[..c.disagreements.len().min(20)]
            );
        }
        // every category of model state the run has is found and agreed on
        for p in [ProfilerCategory::Parameter, ProfilerCategory::Gradient] {
            assert!(
                c.confusion.iter().any(|(q, _, b)| *q == p && *b > 0),
                "{name}: the profiler named no {}",
                p.name()
            );
        }
    }
}

/// The comparison can fail: the same explanation held against a truth with the profiler's
/// gradients renamed optimizer state (or its activations renamed parameters) falls far below
/// the bar.
#[test]
fn a_wrong_category_is_caught() {
    let run = runs()
        .into_iter()
        .find(|r| r.truth.name == "gpt2-tiny-adamw")
        .expect("gpt2-tiny-adamw is profiled");
    for (from, to) in [
        (ProfilerCategory::Gradient, ProfilerCategory::OptimizerState),
        (ProfilerCategory::Activation, ProfilerCategory::Parameter),
    ] {
        let mut truth = run.truth.clone();
        for e in &mut truth.entries {
            for c in e.categories.iter_mut().flatten() {
                if *c == from {
                    *c = to;
                }
            }
        }
        let c = compare(&run.snapshot, &truth).expect("compares");
        assert!(
            c.by_data_flow.share() < 0.95,
            "{} renamed {}: {:.2}%",
            from.name(),
            to.name(),
            100.0 * c.by_data_flow.share()
        );
    }
}

/// Without frames, lifetimes alone decide, in the phases inferred from the trace's shape
/// (`snapshot_explain::shape`): what they get right of the peak's bytes on real runs, held
/// so it does not fall. Measured over the 19 runs: 99.3% or more in 17; the two with
/// activation checkpointing lower, whose backward runs the forward pass again (LLaMA 98.9%,
/// BERT 48.5%).
#[test]
fn without_frames_lifetimes_alone_decide() {
    let mut shares = Vec::new();
    for run in runs().iter().filter(|r| r.truth.device == "cpu") {
        let c = compare_without_frames(&run.snapshot, &run.truth).expect("compares");
        assert!(
            c.at_peak.share() >= 0.45,
            "{}: {:.2}%",
            c.name,
            100.0 * c.at_peak.share()
        );
        shares.push(c.at_peak.share());
    }
    let good = shares.iter().filter(|&&s| s >= 0.99).count();
    assert!(
        good * 100 >= shares.len() * 85,
        "{good} of {} runs at 99% or more: {shares:?}",
        shares.len()
    );
}
