//! Holds what every committed `cargo xtask gpu-check` showed (`fixtures/gpu-check/<device>/`):
//! the files are written on the lent machines (CUDA) and by the dry run on the CPU (Flex);
//! CI reads them between lent sessions.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// The scenarios that train (every one but model-parallel, which is simulated only).
const TRAINING_SCENARIOS: usize = 14;

/// empty-cache's GPU plan on an H100 80GB: cubecl reserved 543.76 MiB after the first epoch
/// (RESULTS.md, the lent H100 of 2026-11-24), which trainmem-meta's cubecl model predicts.
const H100_BYTES: u64 = 85_017_493_504;
const H100_RESERVED: u64 = 570_172_416;

fn files() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/gpu-check");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&root).expect("fixtures/gpu-check exists") {
        let path = entry
            .expect("a directory entry")
            .path()
            .join("gpu-check.json");
        if path.is_file() {
            out.push(path);
        }
    }
    out.sort();
    out
}

fn u64_at(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("`{key}` is a number in {v}"))
}

#[test]
fn every_committed_gpu_check_holds() {
    let files = files();
    assert!(
        !files.is_empty(),
        "at least the CPU dry run of the GPU check is committed"
    );
    for path in files {
        let text = std::fs::read_to_string(&path).expect("readable");
        let check: Value = serde_json::from_str(&text).expect("the file parses");
        let backend = check["device"]["backend"].as_str().expect("a backend");
        let scenarios = check["scenarios"].as_array().expect("scenarios");
        let where_ = path.display();
        assert_eq!(
            scenarios.len(),
            TRAINING_SCENARIOS,
            "{where_}: every training scenario"
        );
        for s in scenarios {
            let name = s["name"].as_str().expect("a name");
            assert!(s["error"].is_null(), "{where_} {name}: {}", s["error"]);
            assert_eq!(s["reproduced"], Value::Bool(true), "{where_} {name}");
            assert_eq!(
                s["twin_misses"].as_array().map(Vec::len),
                Some(0),
                "{where_} {name}: the twin within its targets: {}",
                s["twin_misses"]
            );
            let tracker = &s["tracker"];
            assert!(
                u64_at(tracker, "boundaries") > 0,
                "{where_} {name}: compared"
            );
            if backend == "cuda" {
                assert_eq!(
                    u64_at(tracker, "outside"),
                    0,
                    "{where_} {name}: the tracker within 1% + 64 KiB of cubecl's bytes in use"
                );
            }
        }
        let pools = check["pools"].as_array().expect("pools");
        assert!(!pools.is_empty(), "{where_}: a pool prediction");
        for p in pools {
            let predicted = u64_at(p, "predicted_reserved");
            if u64_at(p, "device_bytes") == H100_BYTES {
                assert_eq!(predicted, H100_RESERVED, "{where_}: the H100's pools");
            }
            if let Some(measured) = p["measured_reserved"].as_u64() {
                assert!(
                    predicted.abs_diff(measured) <= measured / 100,
                    "{where_}: cubecl's pools predicted {predicted} B, burn reserved {measured} B"
                );
            }
        }
    }
}
