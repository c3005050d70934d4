//! `trainmem simulate` end to end: the built binary on the fixture plans and on small plans
//! written by the tests, checked against the simulator library run on the same plan.

mod common;

use std::path::Path;

use common::{empty_dir, fixture_plan, fixture_text, s, stderr, stdout, trainmem, write};
use serde_json::Value;
use trainmem_alloc::pytorch::pickle;
use trainmem_core::Category;
use trainmem_core::bytes::human;
use trainmem_core::export::{chrome, svg, timeline_json};
use trainmem_core::timeline::Phase;
use trainmem_core::{Plan, Timeline};
use trainmem_sim::{SimOptions, SimResult};

/// The library's result for the plan file, as the CLI runs it (with the allocator trace
/// when `trace` is set, as `--out` does).
fn library(path: &Path, trace: bool) -> (Plan, SimResult) {
    let plan = Plan::load(path).expect("the plan loads through the library");
    let opts = SimOptions {
        trace_entries: trace.then_some(200_000),
        machine: trainmem_sim::Machine::detect(),
        ..SimOptions::default()
    };
    let r = trainmem_sim::simulate(&plan, opts).expect("the library simulates the plan");
    (plan, r)
}

/// GPT-2 small as the HuggingFace checkpoint counts it (tied input and output embeddings,
/// learned positions): 124,439,808 parameters.
const GPT2_SMALL_PARAMETERS: u64 = 124_439_808;

#[test]
fn gpt2_small_prints_the_known_model_state_and_the_librarys_figures() {
    let path = fixture_plan("gpt2-small");
    let out = trainmem(&["simulate", s(&path)]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);

    // Facts known without the simulator: the parameter count, the plan's batch layout
    // (16 = 4 micro-batches of 4), 2 epochs × 20 steps, and the model state that follows
    // from the count alone: bf16 weights (2 B) + f32 master weights (4 B), bf16 gradients,
    // AdamW's two f32 moments.
    let n = GPT2_SMALL_PARAMETERS;
    assert!(
        text.contains(&format!(
            "transformer ({} parameters)",
            trainmem_core::count::grouped(n)
        )),
        "{text}"
    );
    assert!(
        text.contains("batch 16 (micro-batch 4 × 4), bf16 with f32 master weights, adamw"),
        "{text}"
    );
    assert!(text.contains("40 step(s) simulated"), "{text}");
    assert!(
        text.contains(&format!(
            "model state per device: parameters {} (of which master weights {}), gradients {}, optimizer state {}",
            human(n * 6),
            human(n * 4),
            human(n * 2),
            human(n * 8)
        )),
        "{text}"
    );
    assert_eq!(human(n * 6), "712.05 MiB");

    // The figures the simulator computes, as the library gives them for the same plan.
    let (plan, r) = library(&path, false);
    let sm = &r.summary;
    assert_eq!(sm.parameters, n);
    assert!(sm.oom.is_none());
    let cap = plan.device.capacity.0;
    let pct = |b: u64| 100.0 * b as f64 / cap as f64;
    let w = sm.peak_when.expect("a peak");
    assert!(
        text.contains(&format!(
            "peak allocated {} ({:.1}% of capacity) at step {} ({}, micro-batch {})",
            human(sm.peak_allocated),
            pct(sm.peak_allocated),
            w.step,
            w.phase,
            w.micro_batch.expect("gpt2-small accumulates gradients")
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "peak reserved  {} ({:.1}% of capacity)",
            human(sm.peak_reserved),
            pct(sm.peak_reserved)
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!("peak host RSS  {}", human(sm.peak_host_rss))),
        "{text}"
    );
    assert!(
        text.contains(&format!("{} allocations", sm.allocations)),
        "{text}"
    );

    // The breakdown at the peak: one line per category that holds bytes, in the library's
    // figures, and none for a category that holds none.
    let section = text
        .split("at the peak (share of reserved):\n")
        .nth(1)
        .expect("a breakdown section")
        .split("\n\n")
        .next()
        .unwrap();
    let total: u64 = Category::ALL
        .into_iter()
        .map(|c| sm.peak_breakdown.get(c))
        .sum();
    let mut listed = 0;
    let mut pct_sum = 0.0;
    for c in Category::ALL {
        let b = sm.peak_breakdown.get(c);
        let line = section
            .lines()
            .find(|l| l.split_whitespace().next() == Some(c.name()));
        if b == 0 {
            assert!(line.is_none(), "{c} holds nothing yet is listed: {section}");
            continue;
        }
        let line = line.unwrap_or_else(|| panic!("{c} is listed: {section}"));
        listed += 1;
        let fields: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(format!("{} {}", fields[1], fields[2]), human(b), "{line}");
        let p: f64 = fields[3].trim_end_matches('%').parse().expect("a share");
        assert!(
            (p - 100.0 * b as f64 / total as f64).abs() < 0.051,
            "{line}"
        );
        pct_sum += p;
    }
    // parameters, gradients, optimizer state, activations, input, temporaries, cache
    assert!(listed >= 6, "{section}");
    assert!((pct_sum - 100.0).abs() < 0.5, "shares add up: {section}");
    // activations dominate the peak of a 1024-token transformer at micro-batch 4
    let act = sm.peak_breakdown.get(Category::Activation);
    assert!(
        Category::ALL
            .into_iter()
            .all(|c| sm.peak_breakdown.get(c) <= act),
        "{section}"
    );

    // The whole text is the library's report of the same run.
    let rep = trainmem_sim::report(&plan, &r);
    assert_eq!(text, trainmem_sim::render_text(&plan, &rep));
    assert!(text.contains("[plateau]"), "{text}");
    assert!(!text.contains("OUT OF MEMORY"), "{text}");
}

#[test]
fn a_small_generated_plan_gives_exact_parameter_bytes() {
    let dir = empty_dir("sim-small");
    // 100·200 + 200 + 200·10 + 10 = 22,210 parameters, 88,840 bytes in f32.
    let plan = write(
        &dir,
        "small.toml",
        "name = \"small\"\n\
         [model.mlp]\ninput = 100\nhidden = [200]\noutput = 10\n\
         [training]\nbatch_size = 8\nepochs = 1\nsteps_per_epoch = 3\n\
         [optimizer]\nkind = \"sgd\"\n\
         [device]\ncapacity = \"1GiB\"\n",
    );
    let out = trainmem(&["simulate", s(&plan)]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.starts_with("trainmem simulate: small\n"), "{text}");
    assert!(text.contains("mlp (22,210 parameters)"), "{text}");
    assert!(text.contains("3 step(s) simulated"), "{text}");
    assert!(text.contains("1.00 GiB capacity"), "{text}");
    assert!(
        text.contains(&format!(
            "model state per device: parameters {} (of which master weights 0 B), gradients {}, optimizer state 0 B",
            human(88_840),
            human(88_840)
        )),
        "{text}"
    );
    assert!(
        text.contains("Plain SGD keeps no state: no jump at the first step."),
        "{text}"
    );
    let (plan, r) = library(&plan, false);
    assert_eq!(
        text,
        trainmem_sim::render_text(&plan, &trainmem_sim::report(&plan, &r))
    );
}

#[test]
fn json_prints_the_report_and_the_timeline() {
    let path = fixture_plan("retained-leak");
    let out = trainmem(&["simulate", s(&path), "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).expect("--json prints one JSON object");
    let (plan, r) = library(&path, false);
    assert_eq!(v["report"]["name"], "retained-leak");
    assert_eq!(v["report"]["summary"]["parameters"], 6_296_064);
    assert_eq!(
        v["report"]["summary"]["peak_allocated"],
        r.summary.peak_allocated
    );
    assert_eq!(
        v["report"]["summary"]["peak_reserved"],
        r.summary.peak_reserved
    );
    assert_eq!(
        v["report"],
        serde_json::to_value(trainmem_sim::report(&plan, &r)).unwrap()
    );
    let t: Timeline = serde_json::from_value(v["timeline"].clone()).expect("a timeline");
    assert_eq!(t, r.timeline);
}

/// The JSON structure `timeline.json` promises: source, meta, and samples with phase, step,
/// and host and device bytes per category.
fn check_timeline_structure(v: &Value, name: &str, steps: u64) {
    assert_eq!(v["source"], "simulated");
    assert_eq!(v["meta"]["name"], name);
    assert!(
        v["meta"]["producer"]
            .as_str()
            .unwrap()
            .starts_with("trainmem-sim")
    );
    let samples = v["samples"].as_array().expect("samples");
    assert!(!samples.is_empty());
    let phases: Vec<&str> = Phase::ALL.iter().map(|p| p.name()).collect();
    let cats: Vec<&str> = Category::ALL.iter().map(|c| c.name()).collect();
    let mut last_step = 0;
    for x in samples {
        let phase = x["phase"].as_str().expect("a phase name");
        assert!(phases.contains(&phase), "{phase}");
        let step = x["step"].as_u64().expect("a step");
        assert!(step >= last_step, "steps in order");
        last_step = step;
        for domain in ["host", "device"] {
            let c = x[domain]["categories"].as_object().expect("categories");
            let mut keys: Vec<&str> = c.keys().map(|k| k.as_str()).collect();
            keys.sort_unstable();
            let mut want = cats.clone();
            want.sort_unstable();
            assert_eq!(keys, want, "{domain} categories");
            assert!(c.values().all(|b| b.is_u64()));
        }
        for key in ["allocated", "reserved", "peak_allocated", "peak_reserved"] {
            assert!(x["device"][key].is_u64(), "device.{key}");
        }
        for key in ["anon_rss", "file_rss"] {
            assert!(x["host"][key].is_u64(), "host.{key}");
        }
    }
    assert_eq!(samples.first().unwrap()["phase"], "start");
    assert_eq!(samples.last().unwrap()["phase"], "end");
    assert_eq!(last_step, steps - 1);
}

#[test]
fn out_writes_every_export_readme_lists() {
    let dir = empty_dir("sim-out");
    let path = fixture_plan("retained-leak");
    let outdir = dir.join("nested/out");
    let out = trainmem(&["simulate", s(&path), "--out", s(&outdir)]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains(
            "{timeline.json, report.json, report.txt, trace.json, timeline.svg, memory_viz.pickle}"
        ),
        "{err}"
    );
    let read = |name: &str| {
        std::fs::read(outdir.join(name)).unwrap_or_else(|e| panic!("{name} written: {e}"))
    };
    let (plan, r) = library(&path, true);
    let rep = trainmem_sim::report(&plan, &r);

    // timeline.json: the structure, and the library's timeline exactly
    let tj = read("timeline.json");
    let v: Value = serde_json::from_slice(&tj).expect("timeline.json is JSON");
    check_timeline_structure(&v, "retained-leak", 12);
    let t = Timeline::from_json(std::str::from_utf8(&tj).unwrap()).expect("a Timeline");
    assert_eq!(t, r.timeline);

    // report.json and report.txt
    let rj: Value = serde_json::from_slice(&read("report.json")).expect("report.json is JSON");
    assert_eq!(rj["name"], "retained-leak");
    assert_eq!(rj["summary"]["peak_allocated"], r.summary.peak_allocated);
    assert_eq!(rj, serde_json::to_value(&rep).unwrap());
    let txt = String::from_utf8(read("report.txt")).unwrap();
    assert_eq!(txt, trainmem_sim::render_text(&plan, &rep));
    assert_eq!(txt, stdout(&out), "report.txt is what the terminal shows");

    // trace.json: Chrome trace events, three per sample plus two process names
    let tr: Value = serde_json::from_slice(&read("trace.json")).expect("trace.json is JSON");
    let events = tr["traceEvents"].as_array().expect("traceEvents");
    assert_eq!(events.len(), 2 + 3 * r.timeline.samples.len());
    assert_eq!(
        tr,
        serde_json::from_str::<Value>(&chrome::chrome_trace(&t).unwrap()).unwrap()
    );

    // timeline.svg
    let svg_text = String::from_utf8(read("timeline.svg")).unwrap();
    assert!(svg_text.starts_with("<svg "), "{svg_text}");
    assert!(svg_text.trim_end().ends_with("</svg>"));
    assert_eq!(svg_text, svg::render_svg(&r.timeline));

    // memory_viz.pickle: memory_viz's top-level keys, and the library's snapshot
    let pk = read("memory_viz.pickle");
    let pv: serde_pickle::Value =
        serde_pickle::value_from_slice(&pk, Default::default()).expect("a pickle");
    let serde_pickle::Value::Dict(d) = &pv else {
        panic!("a dict: {pv:?}")
    };
    for key in ["segments", "device_traces", "allocator_settings"] {
        assert!(
            d.contains_key(&serde_pickle::HashableValue::String(key.into())),
            "{key}"
        );
    }
    assert_eq!(
        pk,
        pickle::to_bytes(r.snapshot.as_ref().expect("a snapshot")).unwrap()
    );

    // the timeline JSON export the library writes
    assert_eq!(tj, timeline_json(&r.timeline).unwrap().into_bytes());
}

#[test]
fn a_plan_that_cannot_fit_exits_2_with_the_allocators_message() {
    let dir = empty_dir("sim-oom");
    // GPT-2 small's 712 MiB of weights, and a micro-batch of 4 × 1024 tokens, on 1 GiB
    let text = fixture_text("gpt2-small").replace("capacity = \"24GiB\"", "capacity = \"1GiB\"");
    assert!(text.contains("\"1GiB\""));
    let plan = write(&dir, "gpt2-1gib.toml", text);
    let outdir = dir.join("out");
    let out = trainmem(&["simulate", s(&plan), "--out", s(&outdir)]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let text = stdout(&out);
    let (_, r) = library(&plan, true);
    let oom = r.summary.oom.as_ref().expect("the library predicts an OOM");
    assert!(
        oom.message
            .starts_with("trainmem out of memory. Tried to allocate"),
        "{}",
        oom.message
    );
    assert!(
        oom.message
            .contains("simulated device has a total capacity of 1024.00 MiB"),
        "{}",
        oom.message
    );
    assert!(
        text.contains(&format!(
            "PREDICTED OUT OF MEMORY at step {} ({}):\n  {}",
            oom.when.step, oom.when.phase, oom.message
        )),
        "{text}"
    );
    // the files are written all the same, the timeline ending at the failure
    let t = Timeline::from_json(&std::fs::read_to_string(outdir.join("timeline.json")).unwrap())
        .unwrap();
    assert_eq!(t.samples.last().unwrap().phase, Phase::OutOfMemory);
    assert!(outdir.join("timeline.svg").is_file());

    // --json too
    let out = trainmem(&["simulate", s(&plan), "--json"]);
    assert_eq!(out.status.code(), Some(2));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v["report"]["summary"]["oom"]["message"],
        oom.message.as_str()
    );
}

/// A plan that fits, with `extra` put into `[training]`.
fn small_plan(extra: &str) -> String {
    format!(
        "name = \"x\"\n\
         [model.mlp]\ninput = 8\nhidden = [16]\noutput = 4\n\
         [training]\nbatch_size = 4\nepochs = 1\nsteps_per_epoch = 2\n{extra}\
         [device]\ncapacity = \"1GiB\"\n"
    )
}

/// Runs `simulate` on a broken plan: it must fail without printing a report.
fn fails(plan: &Path) -> String {
    let out = trainmem(&["simulate", s(plan)]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "stdout: {}\nstderr: {}",
        stdout(&out),
        stderr(&out)
    );
    assert!(out.stdout.is_empty(), "no report: {}", stdout(&out));
    let err = stderr(&out);
    assert!(err.starts_with("error: "), "{err}");
    err
}

#[test]
fn the_control_plan_is_accepted() {
    // The broken plans below are this one with one change each.
    let dir = empty_dir("sim-ok");
    let out = trainmem(&["simulate", s(&write(&dir, "ok.toml", small_plan("")))]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[test]
fn an_unknown_key_is_an_error_naming_the_key_and_its_line() {
    let dir = empty_dir("sim-unknown");
    let plan = write(&dir, "typo.toml", small_plan("batchsize = 3\n"));
    let err = fails(&plan);
    assert!(err.contains("typo.toml"), "{err}");
    assert!(err.contains("line 10"), "{err}");
    assert!(err.contains("unknown field `batchsize`"), "{err}");
    assert!(
        err.contains("`batch_size`"),
        "the known keys are offered: {err}"
    );

    // an unknown section too
    let plan = write(
        &dir,
        "section.toml",
        small_plan("").replace("[device]", "[devices]"),
    );
    let err = fails(&plan);
    assert!(err.contains("unknown field `devices`"), "{err}");
    assert!(err.contains("line 10"), "{err}");
}

#[test]
fn an_inconsistent_value_names_the_key_and_its_line() {
    let dir = empty_dir("sim-invalid");
    let plan = write(
        &dir,
        "zero.toml",
        small_plan("").replace("batch_size = 4", "batch_size = 0"),
    );
    let err = fails(&plan);
    assert!(
        err.contains("zero.toml:7: `training.batch_size`: must be at least 1"),
        "{err}"
    );
}

#[test]
fn a_malformed_plan_is_an_error_with_its_line() {
    let dir = empty_dir("sim-malformed");
    let plan = write(&dir, "bad.toml", "name = \"x\"\n[model.mlp\ninput = 8\n");
    let err = fails(&plan);
    assert!(err.contains("bad.toml"), "{err}");
    assert!(err.contains("line 2"), "{err}");
    // a value of the wrong type
    let plan = write(
        &dir,
        "type.toml",
        small_plan("").replace("batch_size = 4", "batch_size = \"four\""),
    );
    let err = fails(&plan);
    assert!(err.contains("line 7"), "{err}");
    assert!(err.contains("batch_size"), "{err}");
}

#[test]
fn a_missing_plan_is_an_error_naming_the_file() {
    let dir = empty_dir("sim-missing");
    let err = fails(&dir.join("nope.toml"));
    assert!(err.contains("cannot read plan"), "{err}");
    assert!(err.contains("nope.toml"), "{err}");
}

#[test]
fn steps_limits_the_simulation() {
    let path = fixture_plan("retained-leak");
    let out = trainmem(&["simulate", s(&path), "--steps", "3", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["report"]["summary"]["steps"], 3);
    let last = v["timeline"]["samples"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|x| x["step"].as_u64())
        .max();
    assert_eq!(last, Some(2));
}

#[test]
fn a_cpu_device_has_no_allocator_snapshot_and_says_so() {
    // optimizer-jump runs on a CPU device: exact counting, no caching allocator to snapshot
    let dir = empty_dir("sim-cpu-out");
    let path = fixture_plan("optimizer-jump");
    let (_, r) = library(&path, true);
    assert!(r.snapshot.is_none());
    let out = trainmem(&["simulate", s(&path), "--out", s(&dir)]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("{timeline.json, report.json, report.txt, trace.json, timeline.svg}"),
        "{}",
        stderr(&out)
    );
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "report.json",
            "report.txt",
            "timeline.json",
            "timeline.svg",
            "trace.json"
        ]
    );
}
