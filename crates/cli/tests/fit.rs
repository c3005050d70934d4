//! `trainmem fit` end to end: the size it reports fits and the next one does not, each
//! checked by simulating that size through the library (the same probe the command's rule
//! is stated in: `n` fits and `n + 1` does not, over the probe's steps).

mod common;

use std::path::Path;

use common::{empty_dir, fixture_plan, fixture_text, s, stderr, stdout, trainmem, write};
use serde_json::Value;
use trainmem_core::Plan;
use trainmem_core::bytes::{human, parse_bytes};
use trainmem_sim::FitTarget;
use trainmem_sim::fit::probe;

/// Parses `largest {what} that fits {cap}: {n} (...)` and `{what} {m} does not fit:\n  {msg}`.
fn parse_text(text: &str, what: &str) -> (u64, Option<(u64, String)>) {
    let head = format!("largest {what} that fits ");
    let first = text
        .lines()
        .next()
        .filter(|l| l.starts_with(&head))
        .unwrap_or_else(|| panic!("`{head}...`: {text}"));
    let n: u64 = first
        .split(": ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("a size: {first}"));
    let mut lines = text.lines().skip(1);
    let failing = lines.next().and_then(|l| {
        let m = l
            .strip_prefix(&format!("{what} "))?
            .strip_suffix(" does not fit:")?;
        let msg = lines.next()?.strip_prefix("  ")?.to_string();
        Some((m.parse().expect("a failing size"), msg))
    });
    (n, failing)
}

/// Simulates size `n` the way `fit` probes it: `Ok` when nothing fails to allocate, else the
/// allocator's message.
fn probe_fits(plan: &Plan, target: FitTarget, n: u64, capacity: u64) -> Result<(u64, u64), String> {
    probe(plan, target, n, capacity, trainmem_sim::Machine::detect()).expect("the probe simulates")
}

fn check_largest_fits_and_next_does_not(
    path: &Path,
    capacity: &str,
    extra: &[&str],
    what: &str,
    target: FitTarget,
) -> u64 {
    let mut args = vec!["fit", s(path), "--capacity", capacity];
    args.extend_from_slice(extra);
    let out = trainmem(&args);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    let cap = parse_bytes(capacity).unwrap();
    assert!(
        text.contains(&format!("that fits {}: ", human(cap))),
        "{text}"
    );
    let (n, failing) = parse_text(&text, what);
    let (m, msg) = failing.unwrap_or_else(|| panic!("a failing size is named: {text}"));
    assert_eq!(m, n + 1, "{text}");
    let plan = Plan::load(path).unwrap();
    let (pa, pr) = probe_fits(&plan, target, n, cap)
        .unwrap_or_else(|e| panic!("{what} {n} fits {capacity}, yet: {e}"));
    assert!(pr <= cap && pa <= pr);
    assert!(
        text.contains(&format!(
            "(peak allocated {}, peak reserved {};",
            human(pa),
            human(pr)
        )),
        "the peaks of size {n}: {text}"
    );
    let e = probe_fits(&plan, target, n + 1, cap).expect_err("the next size up does not fit");
    assert_eq!(msg, e, "the allocator's message for size {}", n + 1);
    assert!(msg.starts_with("trainmem out of memory."), "{msg}");
    n
}

#[test]
fn retained_leak_largest_batch_fits_and_the_next_does_not() {
    // no accumulation: the command searches the batch size
    let path = fixture_plan("retained-leak");
    let n =
        check_largest_fits_and_next_does_not(&path, "200MiB", &[], "batch size", FitTarget::Batch);
    // 24 MiB of weights, 24 MiB of gradients, and per sample well under 200 KiB
    assert!(n > 256, "{n}");
}

#[test]
fn gpt2_small_searches_the_micro_batch_and_keeps_the_accumulation() {
    // the plan accumulates 4 micro-batches: the micro-batch is what varies
    let path = fixture_plan("gpt2-small");
    let n = check_largest_fits_and_next_does_not(
        &path,
        "24GiB",
        &[],
        "micro-batch size",
        FitTarget::MicroBatch,
    );
    // the plan's own micro-batch of 4 fits 24 GiB (its simulation peaks near 7 GiB)
    assert!(n >= 4, "{n}");
    // asked for the batch, without accumulation, on a smaller device
    check_largest_fits_and_next_does_not(
        &path,
        "12GiB",
        &["--what", "batch"],
        "batch size",
        FitTarget::Batch,
    );
}

#[test]
fn json_reports_the_same_answer() {
    let path = fixture_plan("retained-leak");
    let out = trainmem(&["fit", s(&path), "--capacity", "200MiB", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let plan = Plan::load(&path).unwrap();
    let r = trainmem_sim::fit(
        &plan,
        FitTarget::Batch,
        200 << 20,
        1 << 16,
        trainmem_sim::Machine::detect(),
    )
    .unwrap();
    assert_eq!(v, serde_json::to_value(&r).unwrap());
    let n = v["largest"].as_u64().expect("a size fits");
    assert_eq!(v["target"], "batch");
    assert_eq!(v["capacity"], 200u64 << 20);
    assert_eq!(v["first_failing"][0], n + 1);
    assert!(probe_fits(&plan, FitTarget::Batch, n, 200 << 20).is_ok());
    assert!(probe_fits(&plan, FitTarget::Batch, n + 1, 200 << 20).is_err());
}

#[test]
fn a_plan_that_never_fits_exits_2() {
    let dir = empty_dir("fit-never");
    let plan = fixture_plan("gpt2-small");
    // 712 MiB of weights alone do not fit 100 MiB
    let out = trainmem(&["fit", s(&plan), "--capacity", "100MiB"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let text = stdout(&out);
    // said at once, with the figures: 124,439,808 parameters of bf16 weights (2 B) and f32
    // master weights (4 B)
    assert!(
        text.starts_with(&format!(
            "even a micro-batch size of 1 does not fit 100.00 MiB:\n  model state alone exceeds \
             the device: constructing the model allocates {} ({} bytes",
            human(124_439_808 * 6),
            124_439_808u64 * 6
        )),
        "{text}"
    );
    let out = trainmem(&["fit", s(&plan), "--capacity", "100MiB", "--json"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["largest"], Value::Null);
    assert_eq!(v["first_failing"][0], 1);
    assert_eq!(v["probes"], 1);

    // the plan's own capacity is the default
    let small = write(
        &dir,
        "tiny.toml",
        fixture_text("gpt2-small").replace("capacity = \"24GiB\"", "capacity = \"256MiB\""),
    );
    let out = trainmem(&["fit", s(&small)]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stdout(&out).starts_with("even a micro-batch size of 1 does not fit 256.00 MiB:"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn a_search_limit_that_fits_says_so() {
    let path = fixture_plan("retained-leak");
    let out = trainmem(&["fit", s(&path), "--capacity", "8GiB", "--max", "12"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    let (n, failing) = parse_text(&text, "batch size");
    assert_eq!(n, 12);
    assert!(failing.is_none(), "{text}");
    assert!(text.contains("(every size up to --max 12 fits)"), "{text}");
}

#[test]
fn a_zero_capacity_is_a_usage_error() {
    let path = fixture_plan("retained-leak");
    let out = trainmem(&["fit", s(&path), "--capacity", "0"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    assert!(
        stderr(&out).contains("capacity must be more than 0 bytes"),
        "{}",
        stderr(&out)
    );
    let out = trainmem(&["fit", s(&path), "--capacity", "lots"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--capacity"), "{}", stderr(&out));
}

#[test]
fn a_search_limit_of_0_is_a_usage_error() {
    // It searched 1 anyway and said "every size up to --max 0 fits".
    let path = fixture_plan("retained-leak");
    let out = trainmem(&["fit", s(&path), "--max", "0"]);
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    assert!(out.stdout.is_empty(), "{}", stdout(&out));
    assert!(stderr(&out).contains("--max"), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("must be at least 1"),
        "{}",
        stderr(&out)
    );
    let out = trainmem(&["fit", s(&path), "--max", "1"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("(every size up to --max 1 fits)"),
        "{}",
        stdout(&out)
    );
}
