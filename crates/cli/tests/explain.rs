//! `trainmem explain` end to end: which patterns it names for the pattern plans, in which
//! words and with which figures.

mod common;

use std::path::Path;

use common::{empty_dir, fixture_plan, fixture_text, s, stderr, stdout, trainmem, write};
use serde_json::Value;
use trainmem_core::Plan;
use trainmem_core::bytes::{human, human_signed};
use trainmem_core::timeline::Phase;
use trainmem_sim::{Finding, PatternKind, SimOptions, SimResult};

fn library(path: &Path) -> (Plan, SimResult, Vec<Finding>) {
    let plan = Plan::load(path).expect("the plan loads");
    let opts = SimOptions {
        machine: trainmem_sim::Machine::detect(),
        ..SimOptions::default()
    };
    let r = trainmem_sim::simulate(&plan, opts).expect("the plan simulates");
    let f = trainmem_sim::explain(&plan, &r.timeline, &r.summary);
    (plan, r, f)
}

/// Runs `explain`, expects `code`, and returns the bullet texts after the title line.
fn explain(path: &Path, code: i32) -> (String, Vec<String>) {
    let out = trainmem(&["explain", s(path)]);
    assert_eq!(out.status.code(), Some(code), "{}", stderr(&out));
    let text = stdout(&out);
    // the findings, without the "what would fit" section a plan that does not fit ends with
    let text = text.split("What would fit in ").next().unwrap_or_default();
    let (title, rest) = text.split_once("\n\n").expect("a title line");
    let bullets = rest
        .split("\n\n")
        .filter(|b| !b.trim().is_empty())
        .map(|b| {
            b.strip_prefix("* ")
                .unwrap_or_else(|| panic!("a bullet: {b:?}"))
                .to_string()
        })
        .collect();
    (title.to_string(), bullets)
}

/// The bullets are the library's findings for the same plan, in order.
fn same_as_library(bullets: &[String], findings: &[Finding]) {
    let texts: Vec<&str> = findings.iter().map(|f| f.text.as_str()).collect();
    assert_eq!(bullets, texts);
}

fn kinds(findings: &[Finding]) -> Vec<PatternKind> {
    findings.iter().map(|f| f.kind).collect()
}

#[test]
fn retained_leak_names_growth_per_step_and_its_cause() {
    let path = fixture_plan("retained-leak");
    let (title, bullets) = explain(&path, 0);
    assert_eq!(title, "retained-leak: what memory does, and why");
    let (_, r, findings) = library(&path);
    same_as_library(&bullets, &findings);
    assert_eq!(
        kinds(&findings),
        [
            PatternKind::Startup,
            PatternKind::Jump,
            PatternKind::ActivationRetention,
            PatternKind::GrowthPerStep,
            PatternKind::CacheOverhead
        ]
    );
    // 512→2048→2048→512 with biases: 6,296,064 parameters, 4 bytes each
    let params: u64 = 512 * 2048 + 2048 + 2048 * 2048 + 2048 + 2048 * 512 + 512;
    assert_eq!(params, 6_296_064);
    assert_eq!(
        bullets[0],
        format!(
            "{} of parameters exist before the first step ({} elements in f32).",
            human(params * 4),
            trainmem_core::count::grouped(params)
        )
    );
    assert_eq!(
        bullets[1],
        "Plain SGD keeps no state: no jump at the first step."
    );
    // The growth: what allocated memory gains from one step's end to the next. Every step
    // keeps the same tensors, so every difference is the same and is the figure named.
    let ends: Vec<u64> = r
        .timeline
        .samples
        .iter()
        .filter(|x| x.phase == Phase::OptimizerStep)
        .map(|x| x.device.allocated)
        .collect();
    assert_eq!(ends.len(), 12);
    let per_step: Vec<u64> = ends.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(per_step.iter().all(|&d| d == per_step[0]), "{per_step:?}");
    assert!(per_step[0] > 0);
    let growth = bullets
        .iter()
        .find(|b| b.starts_with("Memory grows by "))
        .expect("growth is named");
    assert!(
        growth.starts_with(&format!(
            "Memory grows by {} per step: each step's output is kept and backward ran with retain_graph, so every step's saved activations stay alive with it.",
            human_signed(per_step[0] as i128)
        )),
        "{growth}"
    );
    assert!(growth.contains("`loss.item()`"), "{growth}");
    assert!(
        !bullets.iter().any(|b| b.contains("flat")),
        "no plateau: {bullets:?}"
    );
}

#[test]
fn clearing_the_leak_names_the_sawtooth() {
    let dir = empty_dir("explain-clear");
    let plan = write(
        &dir,
        "clear.toml",
        fixture_text("retained-leak").replace(
            "retain_graph = true\n",
            "retain_graph = true\nclear_every = 4\n",
        ),
    );
    let (_, bullets) = explain(&plan, 0);
    let (_, _, findings) = library(&plan);
    same_as_library(&bullets, &findings);
    let growth = bullets
        .iter()
        .find(|b| b.starts_with("Memory grows by "))
        .expect("growth within each period is named");
    assert!(
        growth.contains("Clearing them every 4 steps drops it back (a sawtooth)."),
        "{growth}"
    );
}

#[test]
fn optimizer_jump_names_adams_two_buffers_per_parameter() {
    let path = fixture_plan("optimizer-jump");
    let (title, bullets) = explain(&path, 0);
    assert_eq!(title, "optimizer-jump: what memory does, and why");
    let (_, _, findings) = library(&path);
    same_as_library(&bullets, &findings);
    assert_eq!(
        kinds(&findings),
        [
            PatternKind::Startup,
            PatternKind::Jump,
            PatternKind::ActivationRetention,
            PatternKind::Plateau
        ]
    );
    // 1024→4096→1024 with biases, f32, on a CPU device (exact bytes): Adam keeps two f32
    // moments per parameter, created at the first step.
    let params: u64 = 1024 * 4096 + 4096 + 4096 * 1024 + 1024;
    assert_eq!(
        bullets[0],
        format!(
            "{} of parameters exist before the first step ({} elements in f32).",
            human(params * 4),
            trainmem_core::count::grouped(params)
        )
    );
    assert_eq!(
        bullets[1],
        format!(
            "+{} of optimizer state appears at the first optimizer step (step 0): adam keeps 2 buffer(s) per parameter in f32 (2.00× the parameter count in that dtype), created lazily on first use; it stays flat afterwards.",
            human(2 * params * 4)
        )
    );
    assert_eq!(human(2 * params * 4), "64.04 MiB");
    assert!(
        bullets[3].starts_with("After the first step, memory per step is flat")
            && bullets[3].contains("varying by 0 B at most"),
        "{}",
        bullets[3]
    );
}

#[test]
fn epoch_spike_names_the_epochs_and_the_knob() {
    let path = fixture_plan("epoch-spike");
    let (_, bullets) = explain(&path, 0);
    let (_, _, findings) = library(&path);
    same_as_library(&bullets, &findings);
    let spike = findings
        .iter()
        .find(|f| f.kind == PatternKind::EpochSpike)
        .expect("the spike is named");
    assert!(spike.bytes > 0);
    assert_eq!(
        spike.text,
        format!(
            "Host memory (anonymous RSS) peaks in the first batches of epoch(s) 0, 1, 2 by up to {} above the steady state: 4 worker(s) start together, each filling 2 prefetch slot(s) and holding augmentation scratch at once. Workers are respawned every epoch (persistent_workers = false), so the spike repeats; persistent workers flatten later epochs.",
            human(spike.bytes as u64)
        )
    );

    // the knob: persistent workers spike in the first epoch only
    let dir = empty_dir("explain-persistent");
    let plan = write(
        &dir,
        "persistent.toml",
        fixture_text("epoch-spike")
            .replace("persistent_workers = false", "persistent_workers = true"),
    );
    let (_, bullets) = explain(&plan, 0);
    let spike = bullets
        .iter()
        .find(|b| b.starts_with("Host memory (anonymous RSS) peaks"))
        .expect("the first epoch still spikes");
    assert!(
        spike.contains("in the first batches of epoch(s) 0 by up to"),
        "{spike}"
    );
    assert!(
        spike.contains(
            "Persistent workers keep their queues across epochs, so later epochs stay flat."
        ),
        "{spike}"
    );
}

#[test]
fn json_prints_the_librarys_findings() {
    let path = fixture_plan("retained-leak");
    let out = trainmem(&["explain", s(&path), "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let (_, _, findings) = library(&path);
    assert_eq!(v["findings"], serde_json::to_value(&findings).unwrap());
    assert_eq!(v["findings"][3]["kind"], "growth_per_step");
    // it fits with room: no section
    assert!(v["what_would_fit"].is_null(), "{v}");
}

#[test]
fn a_plan_that_does_not_fit_names_the_oom_and_exits_2() {
    let dir = empty_dir("explain-oom");
    let plan = write(
        &dir,
        "gpt2-1gib.toml",
        fixture_text("gpt2-small").replace("capacity = \"24GiB\"", "capacity = \"1GiB\""),
    );
    let (_, r, findings) = library(&plan);
    let oom = r.summary.oom.as_ref().expect("an OOM");
    let (_, bullets) = explain(&plan, 2);
    same_as_library(&bullets, &findings);
    let last = bullets.last().unwrap();
    assert!(
        last.starts_with(&format!(
            "Out of memory at step {} during {} allocating {} of {}.",
            oom.when.step,
            oom.when.phase,
            human(oom.requested),
            oom.category
        )),
        "{last}"
    );
    assert!(last.ends_with(&oom.message), "{last}");
    // --json too
    let out = trainmem(&["explain", s(&plan), "--json"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

/// A plan that does not fit ends with what its own knobs would need, each simulated: the
/// library's remedies, in the plan's keys, and `--capacity` judges the plan on another device.
#[test]
fn a_plan_that_does_not_fit_lists_what_would_fit() {
    let path = fixture_plan("gpt2-small");
    let out = trainmem(&["explain", s(&path), "--capacity", "6GiB"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let text = stdout(&out);
    let (_, section) = text
        .split_once("What would fit in 6.00 GiB (the plan as written does not fit: needs ")
        .unwrap_or_else(|| panic!("a what-would-fit section: {text}"));
    let lines: Vec<&str> = section.lines().skip(1).collect();
    assert!(lines.iter().all(|l| l.starts_with("  - ")), "{section}");
    // the same changes as the library, in its order, each with its verdict
    let mut plan = Plan::load(&path).expect("the fixture loads");
    plan.device.capacity.0 = 6 << 30;
    let r = trainmem_sim::plan_remedies(&plan, trainmem_sim::Machine::detect(), &mut |_| {})
        .expect("simulates");
    assert_eq!(lines.len(), r.remedies.len(), "{section}");
    for (line, x) in lines.iter().zip(&r.remedies) {
        let verdict = if x.need.fits { "fits" } else { "does not fit" };
        assert!(
            line.starts_with(&format!("  - {}: {verdict}", x.change)),
            "{line} vs {x:?}"
        );
    }
    // transformers' own checkpointing (every layer), and the expandable segments added to the
    // plan's own allocator settings, written whole as the plan would have them
    assert!(
        text.contains("checkpointing.policy = \"every\" (every = 1): fits"),
        "{section}"
    );
    assert!(
        text.contains(&format!(
            "device.allocator = \"{},expandable_segments:True\": ",
            plan.device.allocator
        )),
        "{section}"
    );
    // --json: the same section, as the library's figures
    let out = trainmem(&["explain", s(&path), "--capacity", "6GiB", "--json"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["what_would_fit"], serde_json::to_value(&r).unwrap());
    assert!(
        lines
            .last()
            .is_some_and(|l| l.starts_with("  - together: ")),
        "{section}"
    );
    // asked not to: no section
    let out = trainmem(&["explain", s(&path), "--capacity", "6GiB", "--no-remedies"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(!stdout(&out).contains("What would fit"), "{}", stdout(&out));
    // with room to spare: no section
    let out = trainmem(&["explain", s(&path), "--capacity", "80GiB"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!stdout(&out).contains("What would fit"), "{}", stdout(&out));
}

/// README's example: a LoRA fine-tune of Gemma-2-2B at batch 4 and sequence 2048 in bf16 fits
/// 24 GiB with no single change (checkpointing every layer alone still needs over 24 GiB: the
/// 256k-token logits), and with the changes that help together at a smaller micro-batch it
/// does.
#[test]
fn gemma_2_lora_fits_24_gib_only_with_its_changes_together() {
    let dir = empty_dir("explain-gemma");
    let config = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/hf/gemma-2-2b.json");
    let plan = dir.join("gemma.toml");
    let out = trainmem(&[
        "plan",
        "from-hf",
        s(&config),
        "--batch",
        "4",
        "--seq",
        "2048",
        "--lora-rank",
        "16",
        "--lora-targets",
        "all-linear",
        "--precision",
        "bf16",
        "-o",
        s(&plan),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = trainmem(&["explain", s(&plan), "--capacity", "24GiB"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let text = stdout(&out);
    let (_, section) = text
        .split_once("What would fit in 24.00 GiB")
        .expect("the section");
    let lines: Vec<&str> = section.lines().skip(1).collect();
    let (together, alone) = lines.split_last().expect("lines");
    assert!(
        alone.iter().all(|l| l.contains(": does not fit: needs ")
            && l.contains(" allocated, ")
            && l.contains(" reserved (")),
        "{section}"
    );
    let checkpointing = alone.iter().any(|l| {
        l.starts_with("  - checkpointing.policy = \"every\" (every = 1): does not fit: needs 33.")
    });
    assert!(checkpointing, "{section}");
    assert!(
        together.starts_with(
            "  - together: checkpointing.policy = \"every\", model.transformer.attention = \
             \"flash_attention_2\""
        ) && together.contains("training.micro_batch_size = 2 (2 micro-batches of 2 per step")
            && together.contains(": fits: peak allocated 19."),
        "{together}"
    );
    // 8-bit AdamW saves under 1% of a LoRA run's peak (its state is the adapters'): listed
    // alone, left out of the changes made together
    assert!(
        alone
            .iter()
            .any(|l| l.contains("optimizer.kind = \"adamw8bit\"")),
        "{section}"
    );
    assert!(!together.contains("adamw8bit"), "{together}");
}
