//! Replays of the real PyTorch snapshots (the project's shared `pytorch-snapshots/`, found
//! at `../shared` beside the workspace or at `$TRAINMEM_SHARED_DIR`) from the state each
//! recording began in: the peak reserved bytes and the number of cudaMalloc calls must be
//! the recorded ones. Skipped, with a message, where the directory is absent.

use std::path::PathBuf;

use trainmem_alloc::pytorch::pickle;
use trainmem_alloc::pytorch::replay::{prepare, verify};

/// Each file with the peak reserved bytes PyTorch recorded (reference/pytorch-fidelity.md,
/// computed there from the events alone).
const FILES: &[(&str, u64)] = &[
    ("ZidongLiu+DeComFL/edd30e0/memory.pickle", 1_897_922_560),
    (
        "silmont2000+assignment2-systems/133f064/mem_snapshot.pickle",
        3_781_165_056,
    ),
    ("JasperSolt+EoR_NN/6686e9f_snapshot.pickle", 134_217_728),
    (
        "Wedsonlin+assignment2-systems/8630bcf/results_medium_128_training_memory_snapshot.pickle",
        7_235_174_400,
    ),
    (
        "kkaitlyn111+cs336-a2-systems/221ecab/memory_files_memory_ctx128_fullstep.pickle",
        61_111_009_280,
    ),
    (
        "bcrafton+assignment2-systems/0c0e8a7/memory_snapshot.pickle",
        4_238_344_192,
    ),
    (
        "cranberrii+ftcourse/9f4902c/memory_snapshot.pickle",
        6_471_811_072,
    ),
    ("Maphsge4+select_n/04d383c_snapshot.pickle", 22_519_218_176),
];

fn snapshots_dir() -> Option<PathBuf> {
    let shared = std::env::var_os("TRAINMEM_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared"));
    let dir = shared.join("pytorch-snapshots");
    if dir.is_dir() {
        Some(dir)
    } else {
        println!(
            "skipped: {} is absent (set TRAINMEM_SHARED_DIR)",
            dir.display()
        );
        None
    }
}

#[test]
fn every_shared_snapshot_replays_to_its_recorded_peak_and_segment_count() {
    let Some(dir) = snapshots_dir() else { return };
    let mut failures = Vec::new();
    for &(file, peak) in FILES {
        let path = dir.join(file);
        let Ok(bytes) = std::fs::read(&path) else {
            println!("skipped: {} is absent", path.display());
            continue;
        };
        let snap = pickle::from_bytes(&bytes).unwrap_or_else(|e| panic!("{file}: {e}"));
        let mut r = prepare(&snap, 0, 80 << 30, None).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(
            r.recorded.peak_reserved, peak,
            "{file}: recorded peak from the events"
        );
        r.run().unwrap_or_else(|e| panic!("{file}: {e}"));
        let stats = r.replayer.allocator().stats();
        let got = (stats.max_memory_reserved(), stats.num_device_alloc as u64);
        let want = (peak, r.recorded.segment_allocs);
        println!(
            "{file}: replayed (peak reserved, cudaMalloc) {got:?}, recorded {want:?}, start {} segments",
            r.recorded.start_segments
        );
        if got != want {
            failures.push(format!("{file}: replayed {got:?}, recorded {want:?}"));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// `--verify` on every shared snapshot, whether recording began empty or part-way: every
/// cudaMalloc and cudaFree (size, address, order), every block's address and the end state
/// agree with the recording.
#[test]
fn verification_finds_no_divergence_on_any_shared_snapshot() {
    let Some(dir) = snapshots_dir() else { return };
    for &(file, _) in FILES {
        let path = dir.join(file);
        let Ok(bytes) = std::fs::read(&path) else {
            println!("skipped: {} is absent", path.display());
            continue;
        };
        let snap = pickle::from_bytes(&bytes).unwrap_or_else(|e| panic!("{file}: {e}"));
        let mut r = prepare(&snap, 0, 80 << 30, None).unwrap_or_else(|e| panic!("{file}: {e}"));
        let empty = r.start.is_empty();
        let v = verify(&mut r, &snap, 0).unwrap_or_else(|e| panic!("{file}: {e}"));
        println!("{file}: empty start {empty}: {v:?}");
        if empty {
            assert_eq!(v.first_divergence, None, "{file}");
            assert!(
                v.segment_allocs.all() && v.allocs.all() && v.end_blocks.all(),
                "{file}: {v:?}"
            );
        }
    }
}

/// One preparation serves every replay explain makes of a trace: the recorded configuration
/// replayed before and after another setting (and on a device of exactly the recorded peak)
/// reaches the recorded peak each time, from the same prepared ops.
#[test]
fn one_prepared_trace_replays_to_the_recorded_peak_again_and_again() {
    use trainmem_alloc::AllocatorConfig;
    use trainmem_alloc::pytorch::replay::{Scenario, prepare_trace, run_prepared};
    let Some(dir) = snapshots_dir() else { return };
    for &(file, peak) in FILES {
        let Ok(bytes) = std::fs::read(dir.join(file)) else {
            continue;
        };
        let snap = pickle::from_bytes(&bytes).unwrap_or_else(|e| panic!("{file}: {e}"));
        let p = prepare_trace(&snap, 0).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(p.recorded.peak_reserved, peak, "{file}");
        let recorded = Scenario::recorded();
        let expandable = Scenario::with_config(
            "expandable_segments:True",
            AllocatorConfig::parse("expandable_segments:True").unwrap(),
        );
        let first = run_prepared(&p, 80 << 30, &recorded).unwrap();
        let other = run_prepared(&p, 80 << 30, &expandable).unwrap();
        let again = run_prepared(&p, 80 << 30, &recorded).unwrap();
        let capped = run_prepared(&p, peak, &recorded).unwrap();
        assert_eq!(first.peak_reserved, peak, "{file}");
        assert_eq!(first, again, "{file}");
        assert_eq!(first.cuda_mallocs, p.recorded.segment_allocs, "{file}");
        // on exactly the recorded peak the run fits
        assert!(capped.fits(), "{file}");
        assert!(other.peak_reserved > 0 && other.fits(), "{file}");
    }
}
