//! `trainmem explain SNAPSHOT.pickle` end to end, through the built binary: on a shared real
//! snapshot (where `../shared` exists beside the workspace, or `$TRAINMEM_SHARED_DIR`;
//! skipped with a message where absent) the text, `--json` and `--out DIR` carry the
//! category breakdown, the top sites and the ranked remedies; and on bad input (a pickle
//! that is not a snapshot, a truncated file, a snapshot with only segments) it fails with a
//! clear message and a non-zero exit, never a panic, and writes nothing under `--out`.

mod common;

use std::path::{Path, PathBuf};

use common::{dict, empty_dir, s, stderr, stdout, trainmem, write};
use serde_pickle::{SerOptions, Value};

const MIB: i64 = 1 << 20;

/// The silmont2000 snapshot (attention over three 2 MiB leaf tensors, one backward), if the
/// shared folder is there.
fn silmont() -> Option<PathBuf> {
    let shared = std::env::var_os("TRAINMEM_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared"));
    let p = shared
        .join("pytorch-snapshots/silmont2000+assignment2-systems/133f064/mem_snapshot.pickle");
    if p.is_file() {
        Some(p)
    } else {
        println!(
            "skipped: {} is absent (set TRAINMEM_SHARED_DIR)",
            p.display()
        );
        None
    }
}

fn bytes_of(moment: &serde_json::Value, category: &str) -> u64 {
    moment["by_category"]
        .as_array()
        .expect("by_category is a list")
        .iter()
        .find(|pair| pair[0] == category)
        .map_or(0, |pair| pair[1].as_u64().expect("bytes"))
}

#[test]
fn a_shared_snapshot_is_explained_as_text_json_and_files() {
    let Some(snap) = silmont() else { return };
    let p = s(&snap);

    // text: the three answers, in words
    let out = trainmem(&["explain", p]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    for want in [
        "peak: ",
        "when the snapshot was taken: ",
        "top sites:",
        "trace_peak_memory.py:7 custom_softmax",
        "remedies, most bytes saved at the peak first",
        "[replayed] max_split_size_mb:128",
        // a setting that saves nothing is not ranked as a remedy: it is named, with what the
        // replay found it does instead
        "replayed, saving nothing here: expandable_segments:True (peak reserved 16.00 MiB more)",
        "[estimated]",
        "allocator at the peak: reserved ",
    ] {
        assert!(text.contains(want), "{want:?} missing from:\n{text}");
    }
    // the end of the step: Q, K and V's three gradients, randn(8, 4096, 16) f32 each
    let end = text
        .split("when the snapshot was taken")
        .nth(1)
        .expect("the end moment");
    assert!(end.contains("gradient             6.00 MiB"), "{end}");

    // JSON: the same figures, as numbers
    let out = trainmem(&["explain", p, "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let json = stdout(&out);
    let v: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    assert_eq!(bytes_of(&v["end"], "gradient"), 3 * 4 * 8 * 4096 * 16);
    assert_eq!(bytes_of(&v["end"], "parameter"), 0);
    assert_eq!(bytes_of(&v["end"], "optimizer_state"), 0);
    let peak: u64 = v["peak"]["by_category"]
        .as_array()
        .unwrap()
        .iter()
        .map(|pair| pair[1].as_u64().unwrap())
        .sum();
    assert_eq!(peak, v["peak"]["live_bytes"].as_u64().unwrap());
    // the peak's largest site is a backward temporary of 4 × 512 MiB
    let top = &v["peak"]["top_sites"][0];
    assert_eq!(top["category"], "temporary");
    assert_eq!(top["bytes"].as_u64(), Some(4 * (512 << 20)));
    // remedies ranked by bytes saved, each labelled replayed or estimated
    let remedies = v["remedies"].as_array().expect("remedies");
    assert!(remedies.len() >= 2);
    let saved: Vec<u64> = remedies
        .iter()
        .map(|r| r["saved_bytes"].as_u64().unwrap())
        .collect();
    assert!(saved.windows(2).all(|w| w[0] >= w[1]), "{saved:?}");
    for kind in ["replayed", "estimated"] {
        assert!(
            remedies.iter().any(|r| r["kind"] == kind),
            "no {kind} remedy"
        );
    }

    // --out: the report twice, the timeline exports, the annotated snapshot
    let dir = empty_dir("explain-snapshot-out").join("out");
    let out = trainmem(&["explain", p, "--json", "--out", s(&dir)]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), json, "--out does not change the report");
    let written: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("report.json")).unwrap()).unwrap();
    assert_eq!(written, v);
    let report = std::fs::read_to_string(dir.join("report.txt")).unwrap();
    assert!(report.contains("top sites:"));
    for f in ["timeline.json", "trace.json", "timeline.svg"] {
        assert!(
            std::fs::metadata(dir.join(f)).unwrap().len() > 0,
            "{f} written"
        );
    }
    // the annotated snapshot is a snapshot still, with the same trace, and explains the same
    let annotated = dir.join("snapshot.annotated.pickle");
    let original = std::fs::read(&snap).unwrap();
    let again = std::fs::read(&annotated).unwrap();
    assert_ne!(again, original, "categories were written into it");
    let out = trainmem(&["explain", s(&annotated), "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let w: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(w["end"]["by_category"], v["end"]["by_category"]);
    assert_eq!(w["peak"]["by_category"], v["peak"]["by_category"]);
}

fn pickle(v: &Value) -> Vec<u8> {
    serde_pickle::value_to_vec(v, SerOptions::new()).expect("pickling")
}

/// A small valid snapshot: one 20 MiB segment with a 4 MiB block allocated and freed.
fn snapshot(with_trace: bool) -> Value {
    let block = dict(vec![
        ("address", Value::I64(1 << 30)),
        ("size", Value::I64(20 * MIB)),
        ("requested_size", Value::I64(0)),
        ("state", Value::String("inactive".into())),
    ]);
    let segment = dict(vec![
        ("device", Value::I64(0)),
        ("address", Value::I64(1 << 30)),
        ("total_size", Value::I64(20 * MIB)),
        ("stream", Value::I64(0)),
        ("segment_type", Value::String("large".into())),
        ("blocks", Value::List(vec![block])),
    ]);
    let entry = |action: &str| {
        dict(vec![
            ("action", Value::String(action.into())),
            ("addr", Value::I64(1 << 30)),
            ("size", Value::I64(4 * MIB)),
            ("stream", Value::I64(0)),
        ])
    };
    let trace = if with_trace {
        vec![
            entry("alloc"),
            entry("free_requested"),
            entry("free_completed"),
        ]
    } else {
        Vec::new()
    };
    dict(vec![
        ("segments", Value::List(vec![segment])),
        ("device_traces", Value::List(vec![Value::List(trace)])),
    ])
}

/// Runs `explain FILE --out DIR` and `explain FILE --json`: both fail with a message that
/// contains `want`, exit 1, no panic, and `DIR` is never made.
fn fails_cleanly(dir: &Path, file: &Path, want: &str) {
    let out_dir = dir.join("never");
    for extra in [vec!["--out", s(&out_dir)], vec!["--json"]] {
        let mut args = vec!["explain", s(file)];
        args.extend(extra.iter().copied());
        let out = trainmem(&args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {want:?} missing from {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(stdout(&out).is_empty(), "{args:?}: nothing on stdout");
        assert!(!out_dir.exists(), "{args:?}: nothing written under --out");
    }
}

#[test]
fn bad_input_is_a_clear_error_and_writes_nothing() {
    let dir = empty_dir("explain-snapshot-bad");
    // the valid snapshot the bad ones are cut from explains
    let good = pickle(&snapshot(true));
    let path = write(&dir, "good.pickle", &good);
    let out = trainmem(&["explain", s(&path), "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["peak"]["live_bytes"].as_u64(), Some(4 << 20));

    // a pickle, but of a list
    let list = pickle(&Value::List(vec![Value::I64(1), Value::I64(2)]));
    let p = write(&dir, "list.pickle", list);
    fails_cleanly(&dir, &p, "PyTorch memory snapshot");

    // a snapshot cut short, at several places
    for cut in [2, good.len() / 3, good.len() / 2, good.len() - 1] {
        let p = write(&dir, &format!("cut{cut}.pickle"), &good[..cut]);
        fails_cleanly(&dir, &p, "PyTorch memory snapshot");
    }

    // only segments: nothing to explain, and the message says how to record one
    let p = write(&dir, "segments.pickle", pickle(&snapshot(false)));
    fails_cleanly(&dir, &p, "_record_memory_history");
}
