//! `trainmem replay` end to end: the built binary on small traces.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_pickle::{HashableValue, Value};
use trainmem_alloc::{CachingAllocator, SimulatedDevice, StreamId};

const MIB: i64 = 1 << 20;

fn temp_file(name: &str, bytes: &[u8]) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("replay-cli");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

fn trainmem(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_trainmem"))
        .args(args)
        .output()
        .expect("running trainmem")
}

fn replay_json(path: &Path, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["replay", path.to_str().unwrap(), "--json"];
    args.extend_from_slice(extra);
    let out = trainmem(&args);
    assert!(
        out.status.success(),
        "trainmem failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("--json prints one JSON object")
}

fn stat(v: &serde_json::Value, key: &str) -> i64 {
    v.get(key)
        .and_then(|x| x.as_i64())
        .unwrap_or_else(|| panic!("no integer key {key}"))
}

#[test]
fn small_trace_gives_exact_stats() {
    let trace = b"{\"op\":\"alloc\",\"id\":1,\"size\":3145728}\n\
{\"op\":\"alloc\",\"id\":2,\"size\":100,\"stream\":0}\n\
\n\
# a comment\n\
{\"op\":\"free\",\"id\":1}\n\
{\"op\":\"empty_cache\"}\n";
    let path = temp_file("small.jsonl", trace);
    let v = replay_json(&path, &[]);
    // 3 MiB goes to a 20 MiB large-pool segment, 100 B to a 2 MiB small-pool segment (512 B).
    assert_eq!(stat(&v, "allocated_bytes.all.current"), 512);
    assert_eq!(stat(&v, "allocated_bytes.all.peak"), 3 * MIB + 512);
    assert_eq!(stat(&v, "requested_bytes.all.current"), 100);
    assert_eq!(stat(&v, "reserved_bytes.all.current"), 2 * MIB);
    assert_eq!(stat(&v, "reserved_bytes.all.peak"), 22 * MIB);
    assert_eq!(stat(&v, "reserved_bytes.large_pool.freed"), 20 * MIB);
    assert_eq!(stat(&v, "inactive_split_bytes.all.current"), 2 * MIB - 512);
    assert_eq!(stat(&v, "segment.all.current"), 1);
    assert_eq!(stat(&v, "num_device_alloc"), 2);
    assert_eq!(stat(&v, "num_device_free"), 1);
    assert_eq!(stat(&v, "num_alloc_retries"), 0);
    assert_eq!(stat(&v, "num_ooms"), 0);
    let counts = &v["replay"]["counts"];
    assert_eq!(counts["ops"], 4);
    assert_eq!(counts["allocs"], 2);
    assert_eq!(counts["frees"], 1);
    assert_eq!(counts["empty_cache_calls"], 1);
    assert_eq!(counts["empty_cache_released_bytes"], 20 * MIB);
    assert_eq!(counts["live_at_end"], 1);
    assert_eq!(v["replay"]["format"], "jsonl");
}

#[test]
fn allocator_conf_changes_the_result() {
    // Two 30 MiB blocks, both freed, then 25 MiB: by default it reuses a cached 30 MiB block
    // (split: 5 MiB remainder > 1 MiB). With max_split_size_mb:20 the 30 MiB blocks are oversize:
    // a 25 MiB request may use one only whole (30 < 25 + 20), so nothing is split.
    let trace = b"{\"op\":\"alloc\",\"id\":1,\"size\":31457280}\n\
{\"op\":\"alloc\",\"id\":2,\"size\":31457280}\n\
{\"op\":\"free\",\"id\":1}\n\
{\"op\":\"free\",\"id\":2}\n\
{\"op\":\"alloc\",\"id\":3,\"size\":26214400}\n";
    let path = temp_file("conf.jsonl", trace);
    let default = replay_json(&path, &[]);
    assert_eq!(stat(&default, "inactive_split_bytes.all.current"), 5 * MIB);
    assert_eq!(stat(&default, "allocated_bytes.all.current"), 25 * MIB);
    let limited = replay_json(&path, &["--allocator-conf", "max_split_size_mb:20"]);
    assert_eq!(stat(&limited, "inactive_split_bytes.all.current"), 0);
    assert_eq!(stat(&limited, "allocated_bytes.all.current"), 30 * MIB);
    assert_eq!(stat(&limited, "max_split_size"), 20 * MIB);
    assert_eq!(stat(&limited, "oversize_allocations.current"), 1);
}

#[test]
fn malformed_line_is_an_error_naming_the_line() {
    let trace = b"{\"op\":\"alloc\",\"id\":1,\"size\":10}\n{\"op\":\"free\",\"id\":1}\n{\"op\":\"alloc\",\"id\":2}\n";
    let path = temp_file("malformed.jsonl", trace);
    let out = trainmem(&["replay", path.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 3"), "{err}");
    assert!(err.contains("missing field `size`"), "{err}");
}

/// The JSON parser's words appear once, not again as the error's cause.
#[test]
fn a_malformed_line_says_what_the_parser_said_once() {
    let path = temp_file("hello.jsonl", b"hello world\n");
    let out = trainmem(&["replay", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("malformed trace at line 1: expected value"),
        "{err}"
    );
    assert_eq!(err.matches("expected value").count(), 1, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn unknown_id_on_free_is_an_error_naming_the_line() {
    let trace = b"{\"op\":\"alloc\",\"id\":1,\"size\":10}\n{\"op\":\"free\",\"id\":2}\n";
    let path = temp_file("unknown.jsonl", trace);
    let out = trainmem(&["replay", path.to_str().unwrap(), "--json"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 2: free of unknown id 2"), "{err}");
    assert!(out.stdout.is_empty(), "no partial report on error");
}

#[test]
fn oom_is_reported_and_the_replay_goes_on() {
    // 64 MiB device: the second 40 MiB request cannot be served; its free is skipped; the
    // 10 MiB request after it succeeds.
    let trace = b"{\"op\":\"alloc\",\"id\":1,\"size\":41943040}\n\
{\"op\":\"alloc\",\"id\":2,\"size\":41943040}\n\
{\"op\":\"free\",\"id\":2}\n\
{\"op\":\"alloc\",\"id\":3,\"size\":10485760}\n";
    let path = temp_file("oom.jsonl", trace);
    let v = replay_json(&path, &["--capacity", "64MiB"]);
    assert_eq!(stat(&v, "num_ooms"), 1);
    assert_eq!(stat(&v, "num_alloc_retries"), 1);
    assert_eq!(stat(&v, "allocated_bytes.all.current"), 50 * MIB);
    assert_eq!(stat(&v, "reserved_bytes.all.current"), 50 * MIB);
    let ooms = v["replay"]["ooms"].as_array().unwrap();
    assert_eq!(ooms.len(), 1);
    assert_eq!(ooms[0]["line"], 2);
    assert_eq!(ooms[0]["size"], 40 * MIB);
    assert!(
        ooms[0]["message"]
            .as_str()
            .unwrap()
            .contains("Tried to allocate 40.00 MiB")
    );
    assert_eq!(v["replay"]["counts"]["frees_of_failed_allocs"], 1);

    let out = trainmem(&["replay", path.to_str().unwrap(), "--capacity", "67108864"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("OOMs: 1"), "{text}");
    assert!(
        text.contains("line 2: alloc id 2 of 41943040 bytes"),
        "{text}"
    );
    assert!(
        text.contains("Allocated memory"),
        "the memory summary follows: {text}"
    );
}

#[test]
fn bad_capacity_and_conf_are_rejected() {
    let path = temp_file("empty.jsonl", b"");
    let out = trainmem(&["replay", path.to_str().unwrap(), "--capacity", "12 parsecs"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("parsecs"));
    let out = trainmem(&[
        "replay",
        path.to_str().unwrap(),
        "--allocator-conf",
        "max_split_size_mb:1",
    ]);
    assert!(!out.status.success());
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
        ("time_us", Value::I64(0)),
        ("frames", Value::List(vec![])),
    ])
}

#[test]
fn pytorch_snapshot_pickle_replays_by_address() {
    let base = 0x7f00_0000_0000i64;
    let trace = vec![
        entry("segment_alloc", base, 20 * MIB),
        entry("alloc", base, 3 * MIB),
        entry("alloc", base + 3 * MIB, 5 * MIB),
        entry("free_requested", base, 3 * MIB),
        entry("free_completed", base, 3 * MIB),
        entry("alloc", base, MIB / 2), // address reused: a new block (small pool here)
        entry("free_completed", base + 99, 7), // never allocated in the trace: skipped
        dict(vec![
            ("action", Value::String("oom".into())),
            ("device_free", Value::I64(0)),
            ("size", Value::I64(MIB)),
            ("stream", Value::I64(0)),
        ]),
    ];
    let snapshot = dict(vec![
        ("segments", Value::List(vec![])),
        ("device_traces", Value::List(vec![Value::List(trace)])),
    ]);
    let bytes = serde_pickle::value_to_vec(&snapshot, serde_pickle::SerOptions::new()).unwrap();
    let path = temp_file("snapshot.pickle", &bytes);
    let v = replay_json(&path, &[]);
    assert_eq!(v["replay"]["format"], "pytorch_snapshot");
    assert_eq!(v["replay"]["counts"]["allocs"], 3);
    assert_eq!(v["replay"]["counts"]["frees"], 1);
    assert_eq!(v["replay"]["snapshot"]["frees_of_unknown_blocks"], 1);
    assert_eq!(v["replay"]["snapshot"]["recorded_ooms"], 1);
    assert_eq!(v["replay"]["snapshot"]["free_action"], "free_completed");
    assert_eq!(stat(&v, "allocated_bytes.all.current"), 5 * MIB + MIB / 2);
    assert_eq!(stat(&v, "allocation.small_pool.current"), 1);
    assert_eq!(stat(&v, "reserved_bytes.all.current"), 22 * MIB);

    let out = trainmem(&["replay", path.to_str().unwrap(), "--device", "1"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("device 1"));
}

#[test]
fn a_snapshot_dumped_by_trainmem_replays_to_the_same_stats() {
    // Record a run with trainmem-alloc, dump its snapshot as a pickle, replay it: the replay
    // must end in the same state as the original allocator.
    let mut alloc = CachingAllocator::new(SimulatedDevice::new(8 << 30));
    alloc.enable_trace(None);
    let mut live = Vec::new();
    for i in 0..200u64 {
        let size = (i * 7919 % 50) * 300_000 + 1 + i * 13;
        let stream = StreamId(i % 2);
        live.push(alloc.malloc(size, stream).unwrap());
        if i % 3 == 0 {
            let victim = live.remove((i as usize * 31) % live.len());
            alloc.free(victim).unwrap();
        }
    }
    let snapshot = alloc.snapshot();
    let bytes = serde_pickle::to_vec(&snapshot, serde_pickle::SerOptions::new()).unwrap();
    let path = temp_file("roundtrip.pickle", &bytes);
    let v = replay_json(&path, &[]);
    let original = alloc.memory_stats();
    for key in [
        "allocated_bytes.all.current",
        "allocated_bytes.all.peak",
        "reserved_bytes.all.current",
        "reserved_bytes.all.peak",
        "inactive_split_bytes.all.current",
        "requested_bytes.all.current",
        "segment.all.current",
        "allocation.all.current",
    ] {
        assert_eq!(stat(&v, key), original[key], "{key}");
    }
}
