//! `trainmem replay SNAPSHOT` on PyTorch snapshots: the shared real ones (where `../shared`
//! exists beside the workspace, or `$TRAINMEM_SHARED_DIR`) replay to the recorded peak and
//! segment count with no divergence, the what-if table runs on each, and hand-built ones
//! show `--verify`'s divergence report and the answer in words.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_pickle::{HashableValue, Value};

const MIB: i64 = 1 << 20;

fn trainmem(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_trainmem"))
        .args(args)
        .output()
        .expect("running trainmem")
}

fn run_ok(args: &[&str]) -> String {
    let out = trainmem(args);
    assert!(
        out.status.success(),
        "trainmem {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

fn snapshots() -> Vec<PathBuf> {
    let shared = std::env::var_os("TRAINMEM_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared"));
    let dir = shared.join("pytorch-snapshots");
    let Ok(sources) = std::fs::read_to_string(dir.join("SOURCES.txt")) else {
        println!(
            "skipped: {} is absent (set TRAINMEM_SHARED_DIR)",
            dir.display()
        );
        return Vec::new();
    };
    let mut files = Vec::new();
    for line in sources.lines().filter(|l| !l.starts_with('#')) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if let [owner_repo, commit, path, ..] = f[..] {
            let name = Path::new(path)
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("");
            let nested = dir
                .join(owner_repo)
                .join(&commit[..7])
                .join(path.replace('/', "_"));
            let flat = dir
                .join(owner_repo)
                .join(format!("{}_{name}", &commit[..7]));
            let plain = dir.join(owner_repo).join(&commit[..7]).join(name);
            files.extend([nested, flat, plain].into_iter().find(|p| p.is_file()));
        }
    }
    assert_eq!(
        files.len(),
        8,
        "eight snapshots listed in SOURCES.txt: {files:?}"
    );
    files
}

#[test]
fn shared_snapshots_replay_to_the_recorded_peak_with_no_divergence() {
    for path in snapshots() {
        let p = path.to_str().unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&run_ok(&["replay", p, "--json", "--verify"])).unwrap();
        let r = &v["replay"];
        assert_eq!(r["start_state"]["rebuilt"], true, "{p}");
        assert_eq!(
            v["reserved_bytes.all.peak"], r["recorded"]["peak_reserved"],
            "{p}"
        );
        assert_eq!(
            v["num_device_alloc"], r["recorded"]["segment_allocs"],
            "{p}"
        );
        assert_eq!(v["num_device_free"], r["recorded"]["segment_frees"], "{p}");
        assert!(
            r["verify"]["first_divergence"].is_null(),
            "{p}: {}",
            r["verify"]
        );
        for key in [
            "segment_allocs",
            "segment_frees",
            "allocs",
            "end_segments",
            "end_blocks",
        ] {
            let a = &r["verify"][key];
            assert_eq!(a["agreed"], a["recorded"], "{p}: {key}");
        }
    }
}

#[test]
fn what_if_table_runs_on_every_shared_snapshot() {
    for path in snapshots() {
        let p = path.to_str().unwrap();
        let args = [
            "replay",
            p,
            "--what-if",
            "max_split_size_mb:128",
            "--what-if",
            "roundup_power2_divisions:[256:1,512:2,>:8]",
            "--what-if",
            "garbage_collection_threshold:0.8",
            "--what-if",
            "expandable_segments:True",
        ];
        let text = run_ok(&args);
        assert!(text.contains("what-if on 80.00 GiB:"), "{p}: {text}");
        for name in [
            "recorded",
            "max_split_size_mb:128",
            "garbage_collection_threshold:0.8",
            "expandable_segments:True",
        ] {
            assert!(
                text.lines().any(|l| l.starts_with(name)),
                "{p}: no row {name}"
            );
        }
        let mut json_args = args.to_vec();
        json_args.push("--json");
        let v: serde_json::Value = serde_json::from_str(&run_ok(&json_args)).unwrap();
        let rows = v["replay"]["what_if"].as_array().unwrap();
        assert_eq!(rows.len(), 5, "{p}");
        assert_eq!(
            rows[0]["peak_reserved"], v["replay"]["recorded"]["peak_reserved"],
            "{p}"
        );
    }
}

fn dict(entries: Vec<(&str, Value)>) -> Value {
    Value::Dict(
        entries
            .into_iter()
            .map(|(k, v)| (HashableValue::String(k.to_string()), v))
            .collect::<BTreeMap<_, _>>(),
    )
}

fn entry(action: &str, addr: i64, size: i64) -> Value {
    dict(vec![
        ("action", Value::String(action.into())),
        ("addr", Value::I64(addr)),
        ("size", Value::I64(size)),
        ("stream", Value::I64(0)),
    ])
}

fn block(address: i64, size: i64, requested: i64) -> Value {
    let state = if requested > 0 {
        "active_allocated"
    } else {
        "inactive"
    };
    dict(vec![
        ("address", Value::I64(address)),
        ("size", Value::I64(size)),
        ("requested_size", Value::I64(requested)),
        ("state", Value::String(state.into())),
    ])
}

fn segment(address: i64, size: i64, blocks: Vec<Value>) -> Value {
    dict(vec![
        ("device", Value::I64(0)),
        ("address", Value::I64(address)),
        ("total_size", Value::I64(size)),
        ("stream", Value::I64(0)),
        ("segment_type", Value::String("large".into())),
        ("blocks", Value::List(blocks)),
    ])
}

fn write_snapshot(name: &str, segments: Vec<Value>, trace: Vec<Value>) -> PathBuf {
    let snapshot = dict(vec![
        ("segments", Value::List(segments)),
        ("device_traces", Value::List(vec![Value::List(trace)])),
    ]);
    let bytes = serde_pickle::value_to_vec(&snapshot, serde_pickle::SerOptions::new()).unwrap();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("replay-snapshots");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn verify_reports_the_first_divergence_with_both_sides() {
    // The "recording" put 4 MiB in a new 20 MiB segment although 17 MiB were free in the
    // first one; PyTorch's rules (and trainmem) place it at offset 3 MiB of the first.
    let (a, b) = (0x7000_0000i64, 0x7200_0000i64);
    let path = write_snapshot(
        "diverging.pickle",
        vec![
            segment(
                a,
                20 * MIB,
                vec![block(a, 3 * MIB, 3 * MIB), block(a + 3 * MIB, 17 * MIB, 0)],
            ),
            segment(
                b,
                20 * MIB,
                vec![block(b, 4 * MIB, 4 * MIB), block(b + 4 * MIB, 16 * MIB, 0)],
            ),
        ],
        vec![
            entry("segment_alloc", a, 20 * MIB),
            entry("alloc", a, 3 * MIB),
            entry("segment_alloc", b, 20 * MIB),
            entry("alloc", b, 4 * MIB),
        ],
    );
    // a divergence is exit 1, with the report on stdout
    let out = trainmem(&["replay", path.to_str().unwrap(), "--verify"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("utf-8");
    assert!(
        text.contains("segment_alloc (cudaMalloc): 1 of 2 agree"),
        "{text}"
    );
    assert!(
        text.contains("first divergence at entry 3: alloc of 4194304 bytes at 0x72000000"),
        "{text}"
    );
    assert!(
        text.contains("PyTorch:  cudaMalloc of 20971520 bytes at 0x72000000 (entry 2)"),
        "{text}"
    );
    assert!(text.contains("trainmem: no segment call"), "{text}");
}

/// A replay that agrees with its recording under `--verify` exits 0.
#[test]
fn verify_without_a_divergence_exits_0() {
    let a = 0x7000_0000i64;
    let path = write_snapshot(
        "agreeing.pickle",
        vec![segment(a, 20 * MIB, vec![block(a, 20 * MIB, 0)])],
        vec![
            entry("segment_alloc", a, 20 * MIB),
            entry("alloc", a, 3 * MIB),
            entry("free_requested", a, 3 * MIB),
            entry("free_completed", a, 3 * MIB),
        ],
    );
    let text = run_ok(&["replay", path.to_str().unwrap(), "--verify"]);
    assert!(text.contains("no divergence"), "{text}");
}

/// A `--what-if` the replay cannot take is refused before any replay, in the `--what-if`'s
/// own words: not blamed on the snapshot, said once; an empty one is refused too.
#[test]
fn a_bad_what_if_is_named_and_refused() {
    let a = 0x7000_0000i64;
    let path = write_snapshot(
        "what_if_errors.pickle",
        vec![segment(a, 20 * MIB, vec![block(a, 20 * MIB, 0)])],
        vec![
            entry("segment_alloc", a, 20 * MIB),
            entry("alloc", a, 3 * MIB),
        ],
    );
    let p = path.to_str().unwrap();
    for (what_if, want) in [
        (
            "per_process_memory_fraction:1.5",
            "--what-if \"per_process_memory_fraction:1.5\": must be between 0 and 1",
        ),
        (
            "per_process_memory_fraction:-0.1",
            "--what-if \"per_process_memory_fraction:-0.1\": must be between 0 and 1",
        ),
        (
            "max_split_size_mb:128,per_process_memory_fraction:2",
            "must be between 0 and 1 (per_process_memory_fraction:2)",
        ),
        (
            "per_process_memory_fraction:lots",
            "per_process_memory_fraction must be a number between 0 and 1, not \"lots\"",
        ),
        (
            "empty_cache_at_snapshots:yes",
            "empty_cache_at_snapshots must be True or False, not \"yes\"",
        ),
        ("", "--what-if \"\": empty"),
        (" , ", "--what-if \" , \": empty"),
        (
            "max_split_size_mb:abc",
            "--what-if \"max_split_size_mb:abc\": invalid value",
        ),
    ] {
        let out = trainmem(&[
            "replay",
            p,
            "--what-if",
            "max_split_size_mb:20",
            "--what-if",
            what_if,
        ]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{what_if:?}: {err}");
        assert!(
            err.contains(want),
            "{what_if:?}: {want:?} missing from {err}"
        );
        assert!(
            !err.contains("snapshot's allocator_settings"),
            "{what_if:?}: {err}"
        );
        assert_eq!(err.lines().count(), 1, "{what_if:?}: {err}");
        assert!(
            err.matches("between 0 and 1").count() <= 1,
            "said once: {err}"
        );
        assert!(out.stdout.is_empty(), "{what_if:?}: no report");
    }
    // the fraction's bounds are PyTorch's: 0 and 1 are accepted
    for what_if in [
        "per_process_memory_fraction:0",
        "per_process_memory_fraction:1",
    ] {
        run_ok(&["replay", p, "--what-if", what_if]);
    }
}

/// On a snapshot whose cache is fragmented (cranberrii+ftcourse: 654 MiB reserved but
/// unused at the peak), expandable segments reserve no more than the recorded configuration.
#[test]
fn expandable_segments_reserve_no_more_on_a_fragmented_shared_snapshot() {
    let Some(path) = snapshots()
        .into_iter()
        .find(|p| p.to_string_lossy().contains("cranberrii+ftcourse"))
    else {
        return;
    };
    let p = path.to_str().unwrap();
    let args = [
        "replay",
        p,
        "--what-if",
        "expandable_segments:True",
        "--json",
    ];
    let v: serde_json::Value = serde_json::from_str(&run_ok(&args)).unwrap();
    let rows = v["replay"]["what_if"].as_array().unwrap();
    assert_eq!(rows[1]["name"], "expandable_segments:True");
    let (default, expandable) = (&rows[0], &rows[1]);
    let reserved = |r: &serde_json::Value| r["peak_reserved"].as_u64().unwrap();
    let unused = |r: &serde_json::Value| r["unused_at_peak"].as_u64().unwrap();
    assert!(reserved(expandable) <= reserved(default), "{rows:?}");
    // The recorded run holds over 512 MiB unused at its peak; expandable segments far less.
    assert!(unused(default) > 512 * MIB as u64, "{rows:?}");
    assert!(unused(expandable) < unused(default) / 4, "{rows:?}");
}

/// The same fragmenting trace as below, replayed with expandable segments on 48 MiB (page
/// arithmetic by hand; the large pool maps 20 MiB pages, the address range is 9/8 of the
/// capacity = 54 MiB, i.e. 3 pages):
/// * alloc 30 MiB: nothing cached, map 2 pages [0, 40); the block is [0, 30), [30, 40) free;
/// * free: one free block [0, 40);
/// * alloc 12 MiB: [0, 12), free [12, 40) (28 MiB);
/// * alloc 25 MiB: fits the 28 MiB block: [12, 37), free [37, 40) (3 MiB).
///
/// Peak reserved 40 MiB (recorded: 56 MiB), peak allocated 37 MiB, 3 MiB unused at the peak
/// (the largest free block), one mapping, no out-of-memory.
#[test]
fn expandable_segments_what_if_gives_the_page_arithmetic() {
    let path = fragmenting_snapshot("fragmenting-expandable.pickle");
    let p = path.to_str().unwrap();
    let args = [
        "replay",
        p,
        "--capacity",
        "48MiB",
        "--what-if",
        "expandable_segments:True",
    ];
    let text = run_ok(&args);
    assert!(
        text.contains(
            "  expandable_segments:True: peak reserved 40.00 MiB (3.00 MiB unused at the peak), 1 cudaMalloc calls"
        ),
        "{text}"
    );
    let mut json_args = args.to_vec();
    json_args.push("--json");
    let v: serde_json::Value = serde_json::from_str(&run_ok(&json_args)).unwrap();
    let row = &v["replay"]["what_if"][1];
    assert_eq!(row["name"], "expandable_segments:True");
    assert_eq!(row["peak_reserved"], 40 * MIB);
    assert_eq!(row["peak_allocated"], 37 * MIB);
    assert_eq!(row["unused_at_peak"], 3 * MIB);
    assert_eq!(row["largest_free_at_peak"], 3 * MIB);
    assert_eq!(row["cuda_mallocs"], 1);
    assert_eq!(row["cuda_frees"], 0);
    assert_eq!(row["ooms"], 0);
}

/// 30 MiB allocated and freed, then 12 MiB and 25 MiB (see the test below).
fn fragmenting_snapshot(name: &str) -> PathBuf {
    let (a, b) = (0x7000_0000i64, 0x7400_0000i64);
    write_snapshot(
        name,
        vec![
            segment(
                a,
                30 * MIB,
                vec![
                    block(a, 12 * MIB, 12 * MIB),
                    block(a + 12 * MIB, 18 * MIB, 0),
                ],
            ),
            segment(b, 26 * MIB, vec![block(b, 26 * MIB, 25 * MIB)]),
        ],
        vec![
            entry("segment_alloc", a, 30 * MIB),
            entry("alloc", a, 30 * MIB),
            entry("free_requested", a, 30 * MIB),
            entry("free_completed", a, 30 * MIB),
            entry("alloc", a, 12 * MIB),
            entry("segment_alloc", b, 26 * MIB),
            entry("alloc", b, 25 * MIB),
        ],
    )
}

#[test]
fn the_answer_names_the_remedies_that_fit_with_their_figures() {
    // 30 MiB allocated and freed, then 12 MiB (served by splitting the cached 30 MiB block)
    // and 25 MiB (a new 26 MiB segment): 56 MiB reserved. On 48 MiB the 26 MiB segment does
    // not fit and nothing can be released (the 30 MiB segment is split): out of memory at
    // entry 6. With max_split_size_mb:20 the 30 MiB block is not split for 12 MiB (a new
    // 12 MiB segment) and serves 25 MiB whole: 42 MiB, it fits. max_split_size_mb:128 leaves
    // 30 MiB splittable: no help. (At the 42 MiB peak all of it is allocated: the 30 MiB
    // block serves the 25 MiB request whole.)
    let path = fragmenting_snapshot("fragmenting.pickle");
    let p = path.to_str().unwrap();
    let text = run_ok(&[
        "replay",
        p,
        "--capacity",
        "48MiB",
        "--what-if",
        "max_split_size_mb:20",
    ]);
    assert!(
        text.contains(
            "On 48.00 MiB the recorded run runs out of memory at entry 6 (a request of 25.00 MiB)"
        ),
        "{text}"
    );
    assert!(text.contains("unconstrained it reserves 56.00 MiB at its peak while its live blocks peak at 38.00 MiB"), "{text}");
    assert!(text.contains("These make it fit:\n  max_split_size_mb:20: peak reserved 42.00 MiB (0 bytes unused at the peak), 2 cudaMalloc calls"), "{text}");
    assert!(
        text.contains("  max_split_size_mb:128: runs out of memory at entry 6"),
        "{text}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&run_ok(&["replay", p, "--capacity", "48MiB", "--json"])).unwrap();
    let rows = v["replay"]["what_if"].as_array().unwrap();
    assert_eq!(rows[0]["first_oom_entry"], 6);
    assert!(v["replay"]["answer"].as_array().unwrap().len() > 3);
}

#[test]
fn a_recorded_out_of_memory_is_replayed_on_the_card_it_happened_on() {
    // PyTorch ran out of memory asking for 25 MiB with 30 MiB reserved and 18 MiB reported
    // free: the card had 48 MiB for it. Without --capacity the replay runs on 48 MiB, the
    // request fails there too, and the answer says what would have made it fit.
    let a = 0x7000_0000i64;
    let oom = dict(vec![
        ("action", Value::String("oom".into())),
        ("device_free", Value::I64(18 * MIB)),
        ("size", Value::I64(25 * MIB)),
        ("stream", Value::I64(0)),
    ]);
    let path = write_snapshot(
        "ran_out.pickle",
        vec![segment(
            a,
            30 * MIB,
            vec![
                block(a, 12 * MIB, 12 * MIB),
                block(a + 12 * MIB, 18 * MIB, 0),
            ],
        )],
        vec![
            entry("segment_alloc", a, 30 * MIB),
            entry("alloc", a, 30 * MIB),
            entry("free_requested", a, 30 * MIB),
            entry("free_completed", a, 30 * MIB),
            entry("alloc", a, 12 * MIB),
            oom,
        ],
    );
    let p = path.to_str().unwrap();
    let text = run_ok(&["replay", p, "--verify", "--what-if", "max_split_size_mb:20"]);
    assert!(
        text.contains("on a simulated device of 48.00 MiB"),
        "{text}"
    );
    assert!(
        text.contains("oom (out of memory here too): 1 of 1 agree"),
        "{text}"
    );
    assert!(text.contains("no divergence"), "{text}");
    assert!(
        text.contains("The recorded run ran out of memory 1 time(s) on its own card."),
        "{text}"
    );
    assert!(
        text.contains("These make it fit:\n  max_split_size_mb:20: peak reserved 42.00 MiB"),
        "{text}"
    );
    let v: serde_json::Value = serde_json::from_str(&run_ok(&["replay", p, "--json"])).unwrap();
    assert_eq!(v["replay"]["capacity"], 48 * MIB);
    assert_eq!(v["replay"]["recorded"]["oom_capacity"], 48 * MIB);
    assert_eq!(v["num_ooms"], 1);
    // An explicit capacity wins.
    let big: serde_json::Value =
        serde_json::from_str(&run_ok(&["replay", p, "--json", "--capacity", "1GiB"])).unwrap();
    assert_eq!(big["num_ooms"], 0);
}
