//! `trainmem data check` on the committed pyarrow, numpy and safetensors fixtures in
//! `fixtures/data/` (see `make_fixtures.py`), and on broken copies of them.

mod common;

use std::path::{Path, PathBuf};

use common::{empty_dir, s, stdout, trainmem};
use serde_json::Value;

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/data")
        .join(name)
}

fn check(files: &[&Path], extra: &[&str]) -> std::process::Output {
    let mut args = vec!["data", "check"];
    args.extend(files.iter().map(|p| s(p)));
    args.extend_from_slice(extra);
    trainmem(&args)
}

#[test]
fn every_fixture_format_is_recognised_and_described() {
    let files = [
        data("tokens_u16.bin"),
        data("indexed_u16.idx"),
        data("hf_stream.arrow"),
        data("hf_file.arrow"),
        data("tensors.safetensors"),
    ];
    let refs: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
    let out = check(&refs, &["--vocab", "50257", "--token-dtype", "u16"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 5, "{text}");
    assert!(
        lines[0].ends_with("ok  token file  u16  4096 tokens  2 bytes/token"),
        "{}",
        lines[0]
    );
    assert!(
        lines[1].contains("indexed tokens (12 sequences)  u16  266 tokens  12 documents"),
        "{}",
        lines[1]
    );
    for (line, kind) in [(lines[2], "arrow ipc stream"), (lines[3], "arrow ipc file")] {
        assert!(
            line.contains(&format!(
                "{kind} (3 record batches)  40 samples  variable bytes/sample"
            )),
            "{line}"
        );
        assert!(line.contains("columns: input_ids list<i32>, attention_mask list<i8>, pixels f32 [4], label i64 []"), "{line}");
    }
    assert!(
        lines[4].contains("safetensors  32 samples  48 bytes/sample"),
        "{}",
        lines[4]
    );

    let out = check(&refs, &["--json", "--token-dtype", "u16"]);
    let objs: Vec<Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect();
    assert_eq!(objs[0]["tokens"], 4096);
    assert_eq!(objs[0]["dtype"], "u16");
    assert_eq!(objs[2]["samples"], 40);
    assert_eq!(objs[2]["bytes_per_sample"], Value::Null);
    assert_eq!(objs[2]["columns"][2]["row_shape"], serde_json::json!([4]));
    assert_eq!(objs[4]["bytes_per_sample"], 48);
    assert!(objs.iter().all(|o| o["ok"] == true));
}

#[test]
fn broken_files_of_each_format_exit_1_naming_the_problem() {
    let dir = empty_dir("data-formats-broken");
    let cut = |name: &str, keep: usize| {
        let mut b = std::fs::read(data(name)).expect("fixture");
        b.truncate(keep);
        let p = dir.join(name);
        std::fs::write(&p, b).expect("write");
        p
    };
    let cases = [
        (cut("hf_file.arrow", 3000), "footer"),
        (cut("hf_stream.arrow", 4000), "arrow stream"),
        (cut("tensors.safetensors", 1000), "safetensors"),
        (cut("tokens_u16.bin", 1001), "records"),
    ];
    for (path, what) in &cases {
        let out = check(&[path], &["--token-dtype", "u16"]);
        let text = stdout(&out);
        assert_eq!(out.status.code(), Some(1), "{text}");
        assert!(
            text.starts_with("error  ") && text.contains(s(path)) && text.contains(what),
            "{text}"
        );
    }
    let out = check(
        &[&data("tokens_u16.bin")],
        &["--vocab", "5000", "--token-dtype", "u16"],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stdout(&out)
            .contains("token id 7919 at position 1 (byte 2) is not in the vocabulary 0..5000"),
        "{}",
        stdout(&out)
    );
    let out = check(&[&data("tokens_u16.bin")], &["--token-dtype", "f32"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "f32 is no token type: a usage error"
    );
}
