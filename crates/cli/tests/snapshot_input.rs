//! What `explain` and `replay` take for a snapshot, and which device they read: a file named
//! `*.pickle`/`*.pkl` or starting like a pickle (protocol 2+ by its 0x80, protocols 0 and 1 by
//! their first opcodes) is read as a snapshot, with a snapshot's error when it is empty or
//! not a pickle; `replay` defaults to the first device with a trace, as `explain` does, and
//! both say so when the snapshot has more than one.

mod common;

use common::{dict, empty_dir, s, stderr, stdout, trainmem, write};
use serde_pickle::{HashableValue, SerOptions, Value};

const MIB: i64 = 1 << 20;

/// A small snapshot: on each device of `traced`, one 20 MiB segment with a 4 MiB block
/// allocated and freed (`devices` device traces in all, the others empty).
fn snapshot(devices: usize, traced: &[usize]) -> Value {
    let base = |d: usize| (1i64 << 30) + (d as i64) * (1 << 28);
    let segment = |d: usize| {
        let block = dict(vec![
            ("address", Value::I64(base(d))),
            ("size", Value::I64(20 * MIB)),
            ("requested_size", Value::I64(0)),
            ("state", Value::String("inactive".into())),
        ]);
        dict(vec![
            ("device", Value::I64(d as i64)),
            ("address", Value::I64(base(d))),
            ("total_size", Value::I64(20 * MIB)),
            ("stream", Value::I64(0)),
            ("segment_type", Value::String("large".into())),
            ("blocks", Value::List(vec![block])),
        ])
    };
    let entry = |d: usize, action: &str| {
        dict(vec![
            ("action", Value::String(action.into())),
            ("addr", Value::I64(base(d))),
            ("size", Value::I64(4 * MIB)),
            ("stream", Value::I64(0)),
        ])
    };
    let traces = (0..devices)
        .map(|d| {
            Value::List(if traced.contains(&d) {
                vec![
                    entry(d, "alloc"),
                    entry(d, "free_requested"),
                    entry(d, "free_completed"),
                ]
            } else {
                Vec::new()
            })
        })
        .collect();
    dict(vec![
        (
            "segments",
            Value::List(traced.iter().map(|&d| segment(d)).collect()),
        ),
        ("device_traces", Value::List(traces)),
    ])
}

/// Protocol 3, as serde-pickle writes (first byte 0x80).
fn pickle(v: &Value) -> Vec<u8> {
    serde_pickle::value_to_vec(v, SerOptions::new()).expect("pickling")
}

/// Protocol 0, as Python's `pickle.dumps(v, 0)` writes it (text opcodes: MARK DICT, UNICODE,
/// INT, SETITEM, MARK LIST, APPEND), without the memo.
fn pickle_protocol_0(v: &Value) -> Vec<u8> {
    fn go(v: &Value, out: &mut Vec<u8>) {
        match v {
            Value::Dict(d) => {
                out.extend_from_slice(b"(d");
                for (k, v) in d {
                    let HashableValue::String(k) = k else {
                        panic!("string keys only")
                    };
                    go(&Value::String(k.clone()), out);
                    go(v, out);
                    out.push(b's');
                }
            }
            Value::List(items) => {
                out.extend_from_slice(b"(l");
                for v in items {
                    go(v, out);
                    out.push(b'a');
                }
            }
            Value::String(t) => out.extend_from_slice(format!("V{t}\n").as_bytes()),
            Value::I64(n) => out.extend_from_slice(format!("I{n}\n").as_bytes()),
            other => panic!("not written: {other:?}"),
        }
    }
    let mut out = Vec::new();
    go(v, &mut out);
    out.push(b'.');
    out
}

/// Protocol 1, as Python's `pickle.dumps(v, 1)` writes it (binary opcodes: EMPTY_DICT MARK
/// ... SETITEMS, EMPTY_LIST MARK ... APPENDS, BINUNICODE, BININT), without the memo.
fn pickle_protocol_1(v: &Value) -> Vec<u8> {
    fn go(v: &Value, out: &mut Vec<u8>) {
        match v {
            Value::Dict(d) => {
                out.extend_from_slice(b"}(");
                for (k, v) in d {
                    let HashableValue::String(k) = k else {
                        panic!("string keys only")
                    };
                    go(&Value::String(k.clone()), out);
                    go(v, out);
                }
                out.push(b'u');
            }
            Value::List(items) => {
                out.extend_from_slice(b"](");
                for v in items {
                    go(v, out);
                }
                out.push(b'e');
            }
            Value::String(t) => {
                out.push(b'X');
                out.extend_from_slice(&(t.len() as u32).to_le_bytes());
                out.extend_from_slice(t.as_bytes());
            }
            Value::I64(n) => {
                out.push(b'J');
                out.extend_from_slice(&i32::try_from(*n).expect("fits i32").to_le_bytes());
            }
            other => panic!("not written: {other:?}"),
        }
    }
    let mut out = Vec::new();
    go(v, &mut out);
    out.push(b'.');
    out
}

/// Runs trainmem and asserts it failed with exit 1, `want` in its message, no panic, nothing
/// on stdout.
fn fails_with(args: &[&str], want: &str) -> String {
    let out = trainmem(args);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
    assert!(err.contains(want), "{args:?}: {want:?} missing from {err}");
    assert!(!err.contains("panicked"), "{args:?}: {err}");
    assert!(stdout(&out).is_empty(), "{args:?}: {}", stdout(&out));
    err
}

fn runs_ok(args: &[&str]) -> String {
    let out = trainmem(args);
    assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
    stdout(&out)
}

#[test]
fn an_empty_file_is_an_error_saying_so() {
    let dir = empty_dir("snapshot-input-empty");
    for name in ["empty.pickle", "empty.pkl"] {
        let p = write(&dir, name, b"");
        for cmd in ["explain", "replay"] {
            let err = fails_with(&[cmd, s(&p)], "is empty (0 bytes)");
            assert!(!err.contains("TOML"), "{err}");
        }
        fails_with(&["replay", s(&p), "--verify"], "is empty (0 bytes)");
    }
    // explain: an empty file of any name is neither a plan nor a snapshot
    let p = write(&dir, "afile", b"");
    let err = fails_with(&["explain", s(&p)], "is empty (0 bytes)");
    assert!(!err.contains("missing field"), "{err}");
    // replay: an empty JSON-lines trace (not named like a pickle) is a trace of no ops
    let p = write(&dir, "empty.jsonl", b"");
    assert!(runs_ok(&["replay", s(&p)]).contains("ops: 0"));
}

#[test]
fn a_text_file_named_like_a_pickle_is_not_a_pickle() {
    let dir = empty_dir("snapshot-input-text");
    let p = write(&dir, "x.pickle", b"hello world\n");
    let out_dir = dir.join("never");
    for args in [
        vec!["explain", s(&p)],
        vec!["explain", s(&p), "--out", s(&out_dir)],
        vec!["replay", s(&p)],
        vec!["replay", s(&p), "--verify"],
    ] {
        let err = fails_with(&args, "x.pickle is not a pickle");
        assert!(err.contains("hello world"), "{err}");
        assert!(!err.contains("TOML"), "{err}");
        assert!(!err.contains("JSON lines"), "{err}");
    }
    assert!(!out_dir.exists(), "nothing written under --out");
}

#[test]
fn protocol_0_and_1_pickles_are_read_as_snapshots() {
    let dir = empty_dir("snapshot-input-protocols");
    let snap = snapshot(1, &[0]);
    let p3 = write(&dir, "p3.pickle", pickle(&snap));
    // the names say nothing: the bytes are recognised
    let p0 = write(&dir, "p0.snapshot", pickle_protocol_0(&snap));
    let p1 = write(&dir, "p1.snapshot", pickle_protocol_1(&snap));

    // replay reads protocols 0 and 1 as it reads 3, --verify included
    let want = runs_ok(&["replay", s(&p3), "--json"]);
    let want: serde_json::Value = serde_json::from_str(&want).unwrap();
    for p in [&p0, &p1] {
        let text = runs_ok(&["replay", s(p), "--verify"]);
        assert!(text.contains("(PyTorch snapshot, device 0)"), "{text}");
        assert!(text.contains("no divergence"), "{text}");
        let v: serde_json::Value =
            serde_json::from_str(&runs_ok(&["replay", s(p), "--json"])).unwrap();
        assert_eq!(v["replay"]["counts"], want["replay"]["counts"], "{p:?}");
        assert_eq!(v["replay"]["format"], "pytorch_snapshot");
    }

    // explain reads protocol 1 as it reads 3
    let want = runs_ok(&["explain", s(&p3), "--json"]);
    let want: serde_json::Value = serde_json::from_str(&want).unwrap();
    let v: serde_json::Value =
        serde_json::from_str(&runs_ok(&["explain", s(&p1), "--json"])).unwrap();
    assert_eq!(v["peak"], want["peak"]);

    // explain's reader does not take protocol 0: it says so, and what to do
    let err = fails_with(&["explain", s(&p0)], "pickle protocol 0");
    assert!(
        err.contains("torch.cuda.memory._dump_snapshot"),
        "says how to re-dump: {err}"
    );
    assert!(!err.contains("TOML"), "{err}");
}

#[test]
fn replay_takes_the_first_device_with_a_trace_and_says_which() {
    let dir = empty_dir("snapshot-input-devices");
    let dev1 = write(&dir, "dev1only.pickle", pickle(&snapshot(2, &[1])));

    // by default, device 1, the only one with a trace
    let text = runs_ok(&["replay", s(&dev1)]);
    assert!(text.contains("(PyTorch snapshot, device 1)"), "{text}");
    assert!(
        text.contains("device 1 is the first device with a trace"),
        "{text}"
    );
    assert!(text.contains("ops: 2 "), "the trace was replayed: {text}");
    let v: serde_json::Value =
        serde_json::from_str(&runs_ok(&["replay", s(&dev1), "--json"])).unwrap();
    assert_eq!(v["replay"]["snapshot"]["device"], 1);
    assert_eq!(v["replay"]["snapshot"]["devices_with_traces"][0], 1);

    // --device 0 stays explicit, and the text says device 0 recorded nothing
    let text = runs_ok(&["replay", s(&dev1), "--device", "0"]);
    assert!(text.contains("(PyTorch snapshot, device 0)"), "{text}");
    assert!(
        text.contains("note: device 0 recorded no trace; devices with a trace: 1"),
        "{text}"
    );

    // two devices with a trace: device 0, and the line names the other
    let two = write(&dir, "two.pickle", pickle(&snapshot(2, &[0, 1])));
    let text = runs_ok(&["replay", s(&two)]);
    assert!(text.contains("(PyTorch snapshot, device 0)"), "{text}");
    assert!(text.contains("devices with a trace: 0, 1"), "{text}");
    let text = runs_ok(&["replay", s(&two), "--device", "1"]);
    assert!(text.contains("(PyTorch snapshot, device 1)"), "{text}");
    assert!(text.contains("devices with a trace: 0, 1"), "{text}");

    // one device: no such line
    let one = write(&dir, "one.pickle", pickle(&snapshot(1, &[0])));
    let text = runs_ok(&["replay", s(&one)]);
    assert!(!text.contains("with a trace"), "{text}");

    // --device is for snapshots
    let jsonl = write(
        &dir,
        "t.jsonl",
        "{\"op\":\"alloc\",\"id\":1,\"size\":512}\n",
    );
    fails_with(
        &["replay", s(&jsonl), "--device", "1"],
        "--device applies to PyTorch snapshot pickles",
    );
}

#[test]
fn explain_says_when_other_devices_have_a_trace() {
    let dir = empty_dir("snapshot-input-explain-devices");
    let two = write(&dir, "two.pickle", pickle(&snapshot(2, &[0, 1])));
    let text = runs_ok(&["explain", s(&two)]);
    let second = text.lines().nth(1).unwrap_or_default();
    assert_eq!(
        second, "device 0 of the 2 devices with a trace (0, 1); --device N explains another",
        "{text}"
    );
    let text = runs_ok(&["explain", s(&two), "--device", "1"]);
    assert!(
        text.starts_with(&format!(
            "{}: what filled device 1\ndevice 1 of the 2 devices",
            s(&two)
        )),
        "{text}"
    );
    // and --out's report.txt says it too
    let out = dir.join("out");
    runs_ok(&["explain", s(&two), "--out", s(&out)]);
    let report = std::fs::read_to_string(out.join("report.txt")).unwrap();
    assert!(
        report.contains("device 0 of the 2 devices with a trace"),
        "{report}"
    );

    let one = write(&dir, "one.pickle", pickle(&snapshot(2, &[1])));
    let text = runs_ok(&["explain", s(&one)]);
    assert!(text.contains("what filled device 1"), "{text}");
    assert!(!text.contains("devices with a trace"), "{text}");
}

/// The exit statuses are in `--help`, and hold.
#[test]
fn help_documents_the_exit_statuses() {
    let text = runs_ok(&["explain", "--help"]);
    for want in [
        "Exit status:",
        "  0  ",
        "  1  ",
        "  2  ",
        "ran out of memory",
        "*.pickle",
    ] {
        assert!(
            text.contains(want),
            "explain --help: {want:?} missing from {text}"
        );
    }
    let text = runs_ok(&["replay", "--help"]);
    for want in ["Exit status:", "--verify found a divergence", "OOMs: N"] {
        assert!(
            text.contains(want),
            "replay --help: {want:?} missing from {text}"
        );
    }
    let dir = empty_dir("snapshot-input-exit");
    // a recorded out-of-memory: explain exits 2
    let mut snap = snapshot(1, &[0]);
    if let Value::Dict(d) = &mut snap
        && let Some(Value::List(traces)) = d.get_mut(&HashableValue::String("device_traces".into()))
        && let Some(Value::List(trace)) = traces.first_mut()
    {
        trace.push(dict(vec![
            ("action", Value::String("oom".into())),
            ("addr", Value::I64(0)),
            ("size", Value::I64(64 * MIB)),
            ("stream", Value::I64(0)),
            ("device_free", Value::I64(MIB)),
        ]));
    }
    let p = write(&dir, "oom.pickle", pickle(&snap));
    let out = trainmem(&["explain", s(&p)]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    // replay: an out-of-memory on the simulated device is still exit 0, and the text says so
    let out = trainmem(&["replay", s(&p), "--capacity", "1MiB"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!stdout(&out).contains("OOMs: 0"), "{}", stdout(&out));
    assert!(stdout(&out).contains("OOMs: "), "{}", stdout(&out));
}
