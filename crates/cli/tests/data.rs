//! `trainmem data check` end to end, on files the tests write: `.npy` files built byte by
//! byte from numpy's format description (not with trainmem-loader's writer), the loader's
//! fixture pair, raw record files, and broken ones.

mod common;

use std::path::{Path, PathBuf};

use common::{empty_dir, s, stderr, stdout, trainmem};
use serde_json::Value;
use trainmem_loader::RawSidecar;
use trainmem_loader::fixtures::{FixtureSpec, write_fixture, write_raw};

/// A `.npy` file as numpy writes it: magic, version, header length (u16 in v1, u32 in v2),
/// the header dict padded with spaces to a multiple of 64 and ended by `\n`, then the data.
fn npy(descr: &str, fortran: bool, shape: &str, data: &[u8], version: u8) -> Vec<u8> {
    let dict = format!(
        "{{'descr': '{descr}', 'fortran_order': {}, 'shape': {shape}, }}",
        if fortran { "True" } else { "False" }
    );
    let prefix = if version == 1 { 10 } else { 12 };
    let pad = (64 - (prefix + dict.len() + 1) % 64) % 64;
    let header = format!("{dict}{}\n", " ".repeat(pad));
    let mut out = b"\x93NUMPY".to_vec();
    out.extend_from_slice(&[version, 0]);
    if version == 1 {
        out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    } else {
        out.extend_from_slice(&(header.len() as u32).to_le_bytes());
    }
    out.extend_from_slice(header.as_bytes());
    assert_eq!(out.len() % 64, 0, "numpy aligns the data to 64 bytes");
    out.extend_from_slice(data);
    out
}

fn put(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

/// Runs `data check` on `files` with `extra` flags.
fn check(files: &[&Path], extra: &[&str]) -> std::process::Output {
    let mut args = vec!["data", "check"];
    args.extend(files.iter().map(|p| s(p)));
    args.extend_from_slice(extra);
    trainmem(&args)
}

/// The output line about `file`.
fn line_of(text: &str, file: &Path) -> String {
    text.lines()
        .find(|l| l.contains(s(file)))
        .unwrap_or_else(|| panic!("a line about {}: {text}", file.display()))
        .to_string()
}

#[test]
fn valid_npy_files_are_described_and_exit_0() {
    let dir = empty_dir("data-valid");
    let f = put(
        &dir,
        "features.npy",
        &npy("<f4", false, "(10, 4)", &[0; 160], 1),
    );
    let l = put(&dir, "labels.npy", &npy("<i8", false, "(10,)", &[0; 80], 1));
    let b = put(
        &dir,
        "bytes.npy",
        &npy("|u1", false, "(7, 3, 2)", &[1; 42], 2),
    );
    let out = check(&[&f, &l, &b], &["--same-length"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "7 ≠ 10 samples: {text}");
    assert_eq!(
        line_of(&text, &f),
        format!(
            "{}: ok  npy v1.0  f32  shape [10, 4]  10 samples  16 bytes/sample",
            f.display()
        )
    );
    assert_eq!(
        line_of(&text, &l),
        format!(
            "{}: ok  npy v1.0  i64  shape [10]  10 samples  8 bytes/sample",
            l.display()
        )
    );
    assert_eq!(
        line_of(&text, &b),
        format!(
            "{}: ok  npy v2.0  u8  shape [7, 3, 2]  7 samples  6 bytes/sample",
            b.display()
        )
    );

    // the two columns of one data set agree
    let out = check(&[&f, &l], &["--same-length"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert_eq!(stdout(&out).lines().count(), 2);
    assert!(out.stderr.is_empty(), "{}", stderr(&out));
    // without --same-length the counts may differ
    let out = check(&[&f, &b], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
}

#[test]
fn the_loaders_fixture_pair_is_usable() {
    let dir = empty_dir("data-fixture");
    let spec = FixtureSpec {
        samples: 33,
        dim: 5,
        ..FixtureSpec::default()
    };
    let paths = write_fixture(&dir, &spec, |_, _| {}).unwrap();
    let out = check(
        &[&paths.features, &paths.labels],
        &["--same-length", "--json"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    let text = stdout(&out);
    let v: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object a line"))
        .collect();
    assert_eq!(v.len(), 2);
    assert_eq!(v[0]["file"], s(&paths.features));
    assert_eq!(v[0]["ok"], true);
    assert_eq!(v[0]["format"], "npy v1.0");
    assert_eq!(v[0]["dtype"], "f32");
    assert_eq!(v[0]["shape"], serde_json::json!([33, 5]));
    assert_eq!(v[0]["samples"], 33);
    assert_eq!(v[0]["bytes_per_sample"], 20);
    assert_eq!(v[1]["dtype"], "i64");
    assert_eq!(v[1]["shape"], serde_json::json!([33]));
    assert_eq!(v[1]["bytes_per_sample"], 8);
}

#[test]
fn a_raw_record_file_with_its_sidecar_is_usable() {
    let dir = empty_dir("data-raw");
    let p = dir.join("images.bin");
    let side = RawSidecar {
        dtype: "|u1".into(),
        sample_shape: vec![3, 4, 4],
        offset: 0,
    };
    write_raw(&p, &side, &[0; 48 * 5]).unwrap();
    let out = check(&[&p], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert_eq!(
        stdout(&out).trim_end(),
        format!(
            "{}: ok  raw records  u8  shape [5, 3, 4, 4]  5 samples  48 bytes/sample",
            p.display()
        )
    );
    // a partial record
    write_raw(&p, &side, &[0; 48 * 5 + 7]).unwrap();
    let out = check(&[&p], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stdout(&out).contains("247 data bytes are not a whole number of 48-byte records"),
        "{}",
        stdout(&out)
    );
}

/// A single broken file: exit 1 and the error line names the file and says what is wrong.
fn broken(path: &Path, what: &str) {
    let out = check(&[path], &[]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert_eq!(
        text.trim_end(),
        format!("error  {}: {what}", path.display()),
        "{text}"
    );
    let out = check(&[path], &["--json"]);
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_str(stdout(&out).trim_end()).expect("one JSON object");
    assert_eq!(v["ok"], false);
    assert_eq!(v["file"], s(path));
    assert_eq!(v["error"], format!("{}: {what}", path.display()));
}

#[test]
fn a_truncated_npy_is_an_error_with_the_byte_counts() {
    let dir = empty_dir("data-truncated");
    let p = put(&dir, "cut.npy", &npy("<f4", false, "(10, 4)", &[0; 150], 1));
    broken(
        &p,
        "truncated: shape [10, 4] of f32 needs 160 data bytes, the file holds 150",
    );
    let p = put(
        &dir,
        "long.npy",
        &npy("<f4", false, "(10, 4)", &[0; 162], 1),
    );
    broken(
        &p,
        "2 bytes after the 160 data bytes the header describes (corrupt file?)",
    );
}

#[test]
fn a_malformed_npy_is_an_error() {
    let dir = empty_dir("data-malformed");
    // the magic, then a header length past the end of the file
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&1000u16.to_le_bytes());
    bytes.extend_from_slice(b"{'descr': '<f4'");
    let p = put(&dir, "header.npy", &bytes);
    broken(
        &p,
        "truncated header: header says 1010 bytes, the file holds 25",
    );

    // a header that is not numpy's dict: the shape's tuple is not closed
    let p = put(&dir, "dict.npy", &npy("<f4", false, "(10, 4", &[0; 160], 1));
    let out = check(&[&p], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stdout(&out).starts_with(&format!("error  {}: malformed header: ", p.display())),
        "{}",
        stdout(&out)
    );

    // Fortran order and big-endian data cannot be viewed as samples
    let p = put(
        &dir,
        "fortran.npy",
        &npy("<f4", true, "(3, 2)", &[0; 24], 1),
    );
    broken(
        &p,
        "Fortran-order (column-major) array: a sample is not contiguous; re-save it in C order (np.ascontiguousarray)",
    );
    let p = put(&dir, "big.npy", &npy(">i4", false, "(5,)", &[0; 20], 1));
    broken(
        &p,
        "big-endian dtype \">i4\" (only little-endian data can be viewed without a copy)",
    );

    // not a .npy file at all
    let p = put(&dir, "notes.npy", &[b'x'; 100]);
    broken(&p, "not a .npy file (bad magic bytes)");
    // nor a raw record file: no sidecar (and a .bin may be tokens: the hint says how)
    let p = put(&dir, "notes.bin", &[b'x'; 100]);
    broken(
        &p,
        &format!(
            "not a .npy file (no \\x93NUMPY magic) and no raw sidecar {}.json; for a token \
             file (nanoGPT's train.bin), pass --token-dtype u16|u32",
            p.display()
        ),
    );
}

#[test]
fn a_missing_file_is_an_error_naming_it() {
    let dir = empty_dir("data-missing");
    let good = put(&dir, "good.npy", &npy("<f4", false, "(2, 2)", &[0; 16], 1));
    let gone = dir.join("gone.npy");
    let out = check(&[&good, &gone], &[]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    // the usable file is still described
    assert!(
        line_of(&text, &good).contains(": ok  npy v1.0  f32"),
        "{text}"
    );
    assert!(
        line_of(&text, &gone).starts_with(&format!("error  {}: cannot read: ", gone.display())),
        "{text}"
    );
}

#[test]
fn differing_sample_counts_fail_with_same_length() {
    let dir = empty_dir("data-lengths");
    let f = put(&dir, "x.npy", &npy("<f4", false, "(10, 4)", &[0; 160], 1));
    let l = put(&dir, "y.npy", &npy("<i8", false, "(9,)", &[0; 72], 1));
    let out = check(&[&f, &l], &["--same-length"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains(&format!(
            "error: sample counts differ: {}=10, {}=9",
            f.display(),
            l.display()
        )),
        "{text}"
    );

    // --json keeps every line JSON, the mismatch included
    let out = check(&[&f, &l], &["--same-length", "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let lines: Vec<Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("JSON line {l:?}: {e}")))
        .collect();
    assert_eq!(lines.len(), 3, "{}", stdout(&out));
    assert_eq!(lines[0]["ok"], true);
    assert_eq!(lines[1]["ok"], true);
    assert_eq!(lines[2]["ok"], false);
    assert_eq!(
        lines[2]["error"],
        format!(
            "sample counts differ: {}=10, {}=9",
            f.display(),
            l.display()
        )
    );
}

#[test]
fn no_file_is_a_usage_error() {
    let out = trainmem(&["data", "check"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("<FILES>"), "{}", stderr(&out));
}

/// A `.bin` that is neither `.npy` nor described by a sidecar is most likely a token file:
/// the error says to pass `--token-dtype`; other files are pointed at the sidecar's format.
#[test]
fn an_unrecognised_file_gets_a_hint() {
    let dir = empty_dir("data-hint");
    let tokens = put(&dir, "tokens_u16.bin", &[1, 0, 2, 0, 3, 0]);
    let raw = put(&dir, "raw.dat", &[0; 12]);
    let out = check(&[&tokens, &raw], &[]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        line_of(&text, &tokens).ends_with(
            "tokens_u16.bin.json; for a token file (nanoGPT's train.bin), pass --token-dtype u16|u32"
        ),
        "{text}"
    );
    assert!(
        line_of(&text, &raw).contains("(`trainmem data check --help` describes the sidecar)"),
        "{text}"
    );
    // --json carries the hint too
    let out = check(&[&tokens], &["--json"]);
    let v: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("pass --token-dtype u16|u32"),
        "{v}"
    );
    // and with it the file is usable
    let out = check(&[&tokens], &["--token-dtype", "u16"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
}

/// `data check --help` gives the raw sidecar's format.
#[test]
fn help_describes_the_raw_sidecar() {
    let out = trainmem(&["data", "check", "--help"]);
    assert_eq!(out.status.code(), Some(0));
    let text = stdout(&out);
    for want in [
        "{\"dtype\": \"<f4\", \"sample_shape\": [3, 32, 32], \"offset\": 0}",
        "images.bin.json",
        "--token-dtype u16",
    ] {
        assert!(text.contains(want), "{want:?} missing from {text}");
    }
    // the example in the help is one the loader takes
    let dir = empty_dir("data-help-sidecar");
    let f = put(&dir, "images.bin", &[0; 3 * 32 * 32 * 4 * 2]);
    put(
        &dir,
        "images.bin.json",
        b"{\"dtype\": \"<f4\", \"sample_shape\": [3, 32, 32], \"offset\": 0}",
    );
    let out = check(&[&f], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert!(stdout(&out).contains("2 samples"), "{}", stdout(&out));
}
