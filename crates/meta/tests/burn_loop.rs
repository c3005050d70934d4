//! trainmem-burn's training loop on Meta against the same loop measured on Flex, for every
//! scenario plan that runs on the CPU: tensor bytes per category at every phase boundary agree
//! within 1% + 16 KiB. The same Flex runs are tracked (trainmem-track's `Tracked<Flex>`, as
//! every measured run is): the tracker's bytes per category (buffers, the tensors' own records
//! and the records beside the tensors: burn's graph, optimizer and module records, the
//! loader's) agree with the counting allocator's within 1% + 16 KiB at every boundary too.
//! The records themselves, run on Meta, predict Flex's per category within 1% + 16 KiB at
//! every boundary too (burn runs the same graph, optimizer and module code on both).
//! (Each plan is cut to at most 2 epochs of 3 steps to keep the test short.)

use trainmem_burn::agreement::{TRACKER_COMPARED, TRACKER_SLACK, tracker_within};
use trainmem_burn::{RunOptions, run_measured_detailed, run_predicted};
use trainmem_core::Category;
use trainmem_core::plan::Plan;
use trainmem_meta::{Meta, MetaDevice, PRODUCER};
use trainmem_probe::CountingAlloc;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc::new();

/// The categories compared: the tensor categories, `input` last (left out with loader
/// workers).
const COMPARED: [Category; 5] = TRACKER_COMPARED;

/// Runs one plan on Flex and on Meta; returns a line per category (largest error over the
/// phases) and the phases outside the tolerance.
fn compare(name: &str, text: &str) -> (Vec<String>, Vec<String>) {
    let mut plan = Plan::from_toml_str(text).expect("plan");
    plan.training.epochs = plan.training.epochs.min(2);
    plan.training.steps_per_epoch = Some(plan.training.steps_per_epoch.unwrap_or(3).min(3));
    let flex = run_measured_detailed(&plan, RunOptions::default()).expect("flex run");
    let meta = run_predicted::<Meta>(&plan, RunOptions::default(), MetaDevice::new(), PRODUCER)
        .expect("meta run");
    assert_eq!(
        flex.timeline.samples.len(),
        meta.timeline.samples.len(),
        "{name}"
    );
    // With loader worker threads, how many batches sit in the prefetch queue at a phase
    // boundary depends on thread scheduling, in either run; input bytes are compared only for
    // loaders without workers.
    let compared = if plan.loader.workers == 0 { 5 } else { 4 };
    let mut worst = [(0u64, 0u64, 0u64); 5];
    let mut failures = Vec::new();
    let rows = trainmem_burn::tracker_vs_host(&flex, TRACKER_SLACK)
        .expect("measured runs are tracked by default");
    for row in &rows {
        eprintln!(
            "{name:>22} {:>16} tracker vs counting allocator: largest |diff| {} ({} vs {}), {} of {} boundaries outside",
            row.category.name(),
            row.max_diff,
            row.host_at_max,
            row.tracked_at_max,
            row.outside,
            row.boundaries
        );
        if !row.within() {
            failures.push(format!(
                "{name} {:?}: tracker outside 1% + 16 KiB of the counting allocator at {} of {} boundaries (largest: {} vs {})",
                row.category, row.outside, row.boundaries, row.host_at_max, row.tracked_at_max
            ));
        }
    }
    let mut worst_records = (0u64, 0u64, 0u64);
    for (f, m) in flex.timeline.samples.iter().zip(&meta.timeline.samples) {
        assert_eq!((f.phase, f.step), (m.phase, m.step), "{name}");
        for (i, c) in COMPARED.iter().enumerate().take(compared) {
            // Flex: tensors are host memory. Meta: tensors are device bytes, the rest (loader
            // buffers, bookkeeping) host memory.
            let flex_bytes = f.host.categories.get(*c);
            let meta_bytes = m.device.categories.get(*c) + m.host.categories.get(*c);
            let diff = flex_bytes.abs_diff(meta_bytes);
            if diff > worst[i].0 {
                worst[i] = (diff, flex_bytes, meta_bytes);
            }
            if !tracker_within(flex_bytes, meta_bytes, TRACKER_SLACK) {
                failures.push(format!(
                    "{name} {} step {} {c:?}: flex {flex_bytes}, meta {meta_bytes}",
                    f.phase.name(),
                    f.step
                ));
            }
            // The records beside the tensors: burn's code run on Meta keeps the same ones.
            let (flex_records, meta_records) = (f.host.records.get(*c), m.host.records.get(*c));
            if !tracker_within(flex_records, meta_records, TRACKER_SLACK) {
                failures.push(format!(
                    "{name} {} step {} {c:?}: flex records {flex_records}, meta records {meta_records}",
                    f.phase.name(),
                    f.step
                ));
            }
            if flex_records.abs_diff(meta_records) > worst_records.0 {
                worst_records = (
                    flex_records.abs_diff(meta_records),
                    flex_records,
                    meta_records,
                );
            }
        }
    }
    let mut lines: Vec<String> = COMPARED
        .iter()
        .zip(worst)
        .take(compared)
        .map(|(c, (diff, f, m))| format!("{name:>22} {:>16} {f:>12} {m:>12} {diff:>8}", c.name()))
        .collect();
    let (diff, f, m) = worst_records;
    lines.push(format!(
        "{name:>22} {:>16} {f:>12} {m:>12} {diff:>8}",
        "records"
    ));
    (lines, failures)
}

/// Every scenario plan that trains on the CPU.
const PLANS: [(&str, &str); 14] = [
    (
        "activation-retention",
        include_str!("../../scenarios/plans/activation-retention.toml"),
    ),
    (
        "checkpoint-save",
        include_str!("../../scenarios/plans/checkpoint-save.toml"),
    ),
    (
        "empty-cache",
        include_str!("../../scenarios/plans/empty-cache.toml"),
    ),
    (
        "epoch-spike",
        include_str!("../../scenarios/plans/epoch-spike.toml"),
    ),
    (
        "grad-accumulation",
        include_str!("../../scenarios/plans/grad-accumulation.toml"),
    ),
    (
        "grad-checkpointing",
        include_str!("../../scenarios/plans/grad-checkpointing.toml"),
    ),
    (
        "logging-growth",
        include_str!("../../scenarios/plans/logging-growth.toml"),
    ),
    (
        "memmap-vs-preload",
        include_str!("../../scenarios/plans/memmap-vs-preload.toml"),
    ),
    (
        "mixed-precision",
        include_str!("../../scenarios/plans/mixed-precision.toml"),
    ),
    (
        "optimizer-jump",
        include_str!("../../scenarios/plans/optimizer-jump.toml"),
    ),
    (
        "per-batch-plateau",
        include_str!("../../scenarios/plans/per-batch-plateau.toml"),
    ),
    (
        "pinned-staging",
        include_str!("../../scenarios/plans/pinned-staging.toml"),
    ),
    (
        "retained-leak",
        include_str!("../../scenarios/plans/retained-leak.toml"),
    ),
    (
        "startup",
        include_str!("../../scenarios/plans/startup.toml"),
    ),
];

#[test]
fn the_measured_loop_on_meta_matches_flex_per_category_on_every_cpu_scenario() {
    let mut failures = Vec::new();
    eprintln!(
        "{:>22} {:>16} {:>12} {:>12} {:>8}",
        "scenario", "category", "flex", "meta", "max |err|"
    );
    for (name, text) in PLANS {
        let (lines, fails) = compare(name, text);
        for line in lines {
            eprintln!("{line}");
        }
        failures.extend(fails);
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// `Tracked<Meta>`: the tracker, wrapped around Meta, counts Meta's own ledger to the byte at
/// every phase boundary of every CPU scenario plan (Meta names each tensor's buffer, so views,
/// in-place results and shared buffers are counted once, as Meta counts them).
#[test]
fn the_tracker_around_meta_counts_metas_own_ledger_to_the_byte() {
    for (name, text) in PLANS {
        let mut plan = Plan::from_toml_str(text).expect("plan");
        plan.training.epochs = plan.training.epochs.min(2);
        plan.training.steps_per_epoch = Some(plan.training.steps_per_epoch.unwrap_or(3).min(3));
        let opts = RunOptions {
            track_tensors: true,
            ..RunOptions::default()
        };
        let run = trainmem_burn::run_on_backend::<trainmem_meta::Meta>(
            &plan,
            opts,
            MetaDevice::new(),
            "tracked meta",
        )
        .expect("tracked meta run");
        assert!(!run.samples.is_empty(), "{name}");
        for s in &run.samples {
            let meta = s
                .device
                .and_then(|d| d.categories)
                .expect("Meta reports its ledger");
            let tracked = s.tracked.expect("the run is tracked");
            assert_eq!(
                tracked.live,
                meta,
                "{name} {} step {}: tracker vs Meta's ledger",
                s.phase.name(),
                s.step
            );
        }
    }
}
