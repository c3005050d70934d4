//! `trainmem ... | head -1`: a standard output closed before trainmem writes ends the process
//! quietly (by SIGPIPE, as it ends `cat`), never with a panic and its backtrace.

#![cfg(unix)]

mod common;

use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};

use common::{empty_dir, fixture_plan, s, write};

/// SIGPIPE's number (13 on Linux and macOS).
const SIGPIPE: i32 = 13;

/// Runs trainmem with `args` and its stdout a pipe whose reading end is closed before
/// trainmem can write to it; asserts it ended quietly.
fn ends_quietly_on_a_closed_stdout(args: &[&str]) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_trainmem"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running trainmem");
    // the reader goes away at once, as `head` does after its line
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("waiting for trainmem");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{args:?}: {err}");
    assert!(!err.contains("Broken pipe"), "{args:?}: {err}");
    assert_ne!(out.status.code(), Some(101), "{args:?}: {err}");
    // killed by SIGPIPE, or (if it wrote everything before the pipe closed) done
    assert!(
        out.status.signal() == Some(SIGPIPE) || out.status.success(),
        "{args:?}: {:?}: {err}",
        out.status
    );
}

#[test]
fn simulate_and_explain_a_plan_end_quietly() {
    let plan = fixture_plan("gpt2-small");
    ends_quietly_on_a_closed_stdout(&["simulate", s(&plan)]);
    ends_quietly_on_a_closed_stdout(&["explain", s(&plan), "--capacity", "24GiB"]);
    ends_quietly_on_a_closed_stdout(&["fit", s(&plan), "--max", "4"]);
}

#[test]
fn scenario_list_replay_and_data_check_end_quietly() {
    ends_quietly_on_a_closed_stdout(&["scenario", "--list"]);
    let dir = empty_dir("broken-pipe");
    let trace = write(
        &dir,
        "t.jsonl",
        "{\"op\":\"alloc\",\"id\":1,\"size\":1048576}\n{\"op\":\"free\",\"id\":1}\n",
    );
    ends_quietly_on_a_closed_stdout(&["replay", s(&trace)]);
    ends_quietly_on_a_closed_stdout(&["replay", s(&trace), "--json"]);
    let tokens = write(&dir, "train.bin", [0u8; 64]);
    ends_quietly_on_a_closed_stdout(&["data", "check", s(&tokens), "--token-dtype", "u16"]);
}
