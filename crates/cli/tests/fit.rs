//! `trainmem fit` end to end: the size it reports fits when the plan at that size is
//! simulated (`trainmem simulate`, all the plan's steps, on the capacity), and the sizes it
//! names above it do not, each checked by writing the plan at that size and simulating it.

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use common::{empty_dir, fixture_plan, fixture_text, s, stderr, stdout, trainmem, write};
use serde_json::Value;
use trainmem_core::Plan;
use trainmem_core::bytes::{human, parse_bytes};
use trainmem_sim::FitTarget;

/// What the text of `fit` says: the largest size, and the failing sizes above it
/// (`(first, last, message)`).
struct Said {
    n: u64,
    failing: Option<(u64, u64, String)>,
}

/// Parses `largest {what} that fits {cap}: {n} (...)`, then `{what} {m} does not fit; ...:`
/// or `{what}s {m} to {up} do not fit; ...:`, then `  {msg}`.
fn parse_text(text: &str, what: &str) -> Said {
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
        let (sizes, _) = l.split_once(';')?;
        let (m, up) = if let Some(one) = sizes
            .strip_prefix(&format!("{what} "))
            .and_then(|r| r.strip_suffix(" does not fit"))
        {
            (one, one)
        } else {
            sizes
                .strip_prefix(&format!("{what}s "))?
                .strip_suffix(" do not fit")?
                .split_once(" to ")?
        };
        let msg = lines.next()?.strip_prefix("  ")?.to_string();
        Some((m.parse().expect("a size"), up.parse().expect("a size"), msg))
    });
    Said { n, failing }
}

/// `trainmem simulate` of the plan at `path` with size `n` of `target` on `capacity`:
/// `Ok((peak allocated, peak reserved, steps))` (exit 0), or `Err(the allocator's message)`
/// (exit 2).
fn simulate_at(
    path: &Path,
    target: FitTarget,
    n: u64,
    capacity: u64,
) -> Result<(u64, u64, u64), String> {
    let plan = Plan::load(path).unwrap();
    let mut p = match target {
        FitTarget::Batch => plan.with_batch(n, None),
        FitTarget::MicroBatch => plan.with_batch(n * plan.accumulation_steps(), Some(n)),
    };
    p.device.capacity.0 = capacity;
    // a directory of each call's own: the tests run at once
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let dir = empty_dir(&format!(
        "fit-simulate-at-{}",
        CALLS.fetch_add(1, Ordering::Relaxed)
    ));
    let at = write(&dir, &format!("at-{n}.toml"), p.to_toml().unwrap());
    let out = trainmem(&["simulate", s(&at), "--json", "--quiet"]);
    let v: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", stderr(&out)));
    let sum = &v["report"]["summary"];
    match out.status.code() {
        Some(0) => Ok((
            sum["peak_allocated"].as_u64().unwrap(),
            sum["peak_reserved"].as_u64().unwrap(),
            sum["steps"].as_u64().unwrap(),
        )),
        Some(2) => Err(sum["oom"]["message"].as_str().unwrap().to_string()),
        c => panic!("exit {c:?}: {}", stderr(&out)),
    }
}

fn check_largest_fits_and_the_next_do_not(
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
    let Said { n, failing } = parse_text(&text, what);
    let (m, up, msg) = failing.unwrap_or_else(|| panic!("failing sizes are named: {text}"));
    assert_eq!((m, up), (n + 1, n + trainmem_sim::fit::ABOVE), "{text}");
    let (pa, pr, steps) = simulate_at(path, target, n, cap)
        .unwrap_or_else(|e| panic!("{what} {n} fits {capacity}, yet: {e}"));
    assert!(pr <= cap && pa <= pr);
    assert!(
        text.contains(&format!(
            "(peak allocated {}, peak reserved {} over the plan's {steps} steps;",
            human(pa),
            human(pr)
        )),
        "the peaks of size {n}: {text}"
    );
    for k in m..=up {
        let e = simulate_at(path, target, k, cap).expect_err("the sizes above do not fit");
        if k == m {
            assert_eq!(msg, e, "the allocator's message for size {m}");
        }
    }
    assert!(msg.starts_with("trainmem out of memory."), "{msg}");
    n
}

#[test]
fn retained_leak_largest_batch_fits_and_the_next_do_not() {
    // no accumulation: the command searches the batch size
    let path = fixture_plan("retained-leak");
    let n = check_largest_fits_and_the_next_do_not(
        &path,
        "200MiB",
        &[],
        "batch size",
        FitTarget::Batch,
    );
    // 24 MiB of weights, 24 MiB of gradients, and per sample well under 200 KiB a step; but
    // each of the plan's 12 steps keeps its outputs and graph (the leak), so fewer samples
    // fit than over the probe's two steps (which found more than 256)
    assert!((128..=256).contains(&n), "{n}");
}

#[test]
fn gpt2_small_searches_the_micro_batch_and_keeps_the_accumulation() {
    // the plan accumulates 4 micro-batches: the micro-batch is what varies
    let path = fixture_plan("gpt2-small");
    let n = check_largest_fits_and_the_next_do_not(
        &path,
        "24GiB",
        &[],
        "micro-batch size",
        FitTarget::MicroBatch,
    );
    // the plan's own micro-batch of 4 fits 24 GiB (its simulation peaks near 7 GiB)
    assert!(n >= 4, "{n}");
    // asked for the batch, without accumulation, on a smaller device
    check_largest_fits_and_the_next_do_not(
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
    assert_eq!(v["failing_up_to"], n + trainmem_sim::fit::ABOVE);
    let (pa, pr, steps) = simulate_at(&path, FitTarget::Batch, n, 200 << 20).expect("n fits");
    assert_eq!(
        (&v["peak_allocated"], &v["peak_reserved"], &v["steps"]),
        (&Value::from(pa), &Value::from(pr), &Value::from(steps))
    );
    // over the plan's 12 steps, each keeping its outputs
    assert_eq!(steps, 12);
    let e = simulate_at(&path, FitTarget::Batch, n + 1, 200 << 20).expect_err("n + 1 does not");
    assert_eq!(v["first_failing"][1], e.as_str());
    // the leak runs out of memory after the probe's two steps
    assert!(
        v["first_failing_when"]["step"].as_u64().unwrap() >= 2,
        "{v}"
    );
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
    // a probe and a full run of each size from 1 to 4, each stopping at the model's
    // construction
    let above = trainmem_sim::fit::ABOVE;
    assert_eq!(v["failing_up_to"], above);
    assert_eq!(
        (&v["probes"], &v["full_runs"]),
        (&Value::from(1 + above), &Value::from(above))
    );
    assert_eq!(v["first_failing_when"]["phase"], "model_init");

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
    let Said { n, failing } = parse_text(&text, "batch size");
    assert_eq!(n, 12);
    assert!(failing.is_none(), "{text}");
    assert!(
        text.contains("(12 is --max, the largest size searched)"),
        "{text}"
    );
    assert!(simulate_at(&path, FitTarget::Batch, 12, 8 << 30).is_ok());
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
    // It searched 1 anyway and said that every size up to --max 0 fits.
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
        stdout(&out).contains("(1 is --max, the largest size searched)"),
        "{}",
        stdout(&out)
    );
}

/// The case a user hit: bert-base at sequence 512 in mixed f16, whose batch 144 `fit` said
/// fits 24 GiB over its probe's two steps, while the plan at 144 runs out of memory at its
/// third step (and at 143 at its second): the answer now simulates, and the four sizes above
/// it do not.
#[test]
fn bert_base_from_hf_answers_a_batch_that_simulates() {
    let dir = empty_dir("fit-bert");
    let config =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/hf/bert-base-uncased.json");
    let path = dir.join("bb.toml");
    let out = trainmem(&[
        "plan",
        "from-hf",
        s(&config),
        "--batch",
        "32",
        "--seq",
        "512",
        "--precision",
        "mixed-f16",
        "-o",
        s(&path),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let n =
        check_largest_fits_and_the_next_do_not(&path, "24GiB", &[], "batch size", FitTarget::Batch);
    assert!(n < 144, "{n}");
    // the fit's first line counts the full runs
    let out = trainmem(&["fit", s(&path), "--capacity", "24GiB", "--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["steps"], 3);
    assert!(
        v["full_runs"].as_u64().unwrap() > trainmem_sim::fit::ABOVE,
        "{v}"
    );
}
