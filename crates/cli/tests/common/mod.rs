//! Helpers shared by the CLI's end-to-end tests: run the built binary, find the fixture
//! plans, write small plans and files into a directory of the test's own.

// Each test file uses its own subset.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Runs the built `trainmem` with `args` in `cwd` (the test's own directory when given).
pub fn trainmem_in(cwd: Option<&Path>, args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_trainmem"));
    cmd.args(args);
    if let Some(dir) = cwd {
        cmd.current_dir(dir);
    }
    cmd.output().expect("running trainmem")
}

/// Runs the built `trainmem` with `args`.
pub fn trainmem(args: &[&str]) -> Output {
    trainmem_in(None, args)
}

/// The process's standard output as text.
pub fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).expect("stdout is UTF-8")
}

/// The process's standard error as text.
pub fn stderr(out: &Output) -> String {
    String::from_utf8(out.stderr.clone()).expect("stderr is UTF-8")
}

/// A plan of `fixtures/plans/`.
pub fn fixture_plan(name: &str) -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/plans")
        .join(format!("{name}.toml"));
    assert!(p.is_file(), "fixture plan {} exists", p.display());
    p
}

/// The text of a fixture plan.
pub fn fixture_text(name: &str) -> String {
    std::fs::read_to_string(fixture_plan(name)).expect("reading a fixture plan")
}

/// An empty directory of the test's own (each test passes its own `tag`), under cargo's
/// temporary directory for integration tests; emptied at the start of each run.
pub fn empty_dir(tag: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("cli-tests")
        .join(tag);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("creating a test directory");
    dir
}

/// Writes `text` to `dir/name` and returns the path.
pub fn write(dir: &Path, name: &str, text: impl AsRef<[u8]>) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("writing a test file");
    p
}

/// The path as `&str` (every test path is UTF-8).
pub fn s(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

/// A pickle dict of `entries` (string keys), for snapshots written by hand.
pub fn dict(entries: Vec<(&str, serde_pickle::Value)>) -> serde_pickle::Value {
    serde_pickle::Value::Dict(
        entries
            .into_iter()
            .map(|(k, v)| (serde_pickle::HashableValue::String(k.to_string()), v))
            .collect(),
    )
}
