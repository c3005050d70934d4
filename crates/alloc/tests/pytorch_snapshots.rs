//! Real memory snapshots recorded by PyTorch on GPUs (the project's shared
//! `pytorch-snapshots/` directory, beside the workspace: `../shared` from the workspace
//! root). Skipped, with a message, where that directory is absent.

use std::path::PathBuf;

use trainmem_alloc::AllocatorConfig;
use trainmem_alloc::pytorch::pickle;
use trainmem_alloc::pytorch::replay::{Replayer, TraceFormat, replay_trace};
use trainmem_alloc::{Snapshot, TraceAction};

/// What a file holds, counted with Python's own unpickler.
struct Expected {
    file: &'static str,
    segments: usize,
    blocks: usize,
    reserved: u64,
    /// Entries per device trace.
    traces: &'static [usize],
    /// `segment_alloc` entries.
    segment_allocs: usize,
}

const FILES: &[Expected] = &[
    Expected {
        file: "JasperSolt+EoR_NN/6686e9f_snapshot.pickle",
        segments: 10,
        blocks: 54,
        reserved: 134217728,
        traces: &[5803],
        segment_allocs: 7,
    },
    Expected {
        file: "Maphsge4+select_n/04d383c_snapshot.pickle",
        segments: 136,
        blocks: 204,
        reserved: 18566086656,
        traces: &[10327, 0, 0, 0],
        segment_allocs: 584,
    },
    Expected {
        file: "Wedsonlin+assignment2-systems/8630bcf/results_medium_128_training_memory_snapshot.pickle",
        segments: 377,
        blocks: 918,
        reserved: 7235174400,
        traces: &[19136],
        segment_allocs: 0,
    },
    Expected {
        file: "ZidongLiu+DeComFL/edd30e0/memory.pickle",
        segments: 61,
        blocks: 468,
        reserved: 1897922560,
        traces: &[23105],
        segment_allocs: 61,
    },
    Expected {
        file: "bcrafton+assignment2-systems/0c0e8a7/memory_snapshot.pickle",
        segments: 96,
        blocks: 550,
        reserved: 4238344192,
        traces: &[6486],
        segment_allocs: 0,
    },
    Expected {
        file: "cranberrii+ftcourse/9f4902c/memory_snapshot.pickle",
        segments: 215,
        blocks: 1079,
        reserved: 6471811072,
        traces: &[10307],
        segment_allocs: 152,
    },
    Expected {
        file: "kkaitlyn111+cs336-a2-systems/221ecab/memory_files_memory_ctx128_fullstep.pickle",
        segments: 1010,
        blocks: 1525,
        reserved: 61111009280,
        traces: &[19342],
        segment_allocs: 783,
    },
    Expected {
        file: "silmont2000+assignment2-systems/133f064/mem_snapshot.pickle",
        segments: 9,
        blocks: 20,
        reserved: 3781165056,
        traces: &[97],
        segment_allocs: 9,
    },
];

fn snapshots_dir() -> Option<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/pytorch-snapshots");
    if dir.is_dir() {
        Some(dir)
    } else {
        println!(
            "skipped: {} is absent (the real PyTorch snapshots live there)",
            dir.display()
        );
        None
    }
}

fn read(dir: &std::path::Path, file: &str) -> Option<(Vec<u8>, Snapshot)> {
    let path = dir.join(file);
    let Ok(bytes) = std::fs::read(&path) else {
        println!("skipped: {} is absent", path.display());
        return None;
    };
    let snap = pickle::from_bytes(&bytes).unwrap_or_else(|e| panic!("{file}: {e}"));
    Some((bytes, snap))
}

#[test]
fn real_snapshots_read_with_the_counts_in_the_files() {
    let Some(dir) = snapshots_dir() else { return };
    for e in FILES {
        let (file, segments, blocks, reserved) = (e.file, e.segments, e.blocks, e.reserved);
        let (traces, segment_allocs) = (e.traces, e.segment_allocs);
        let Some((_, snap)) = read(&dir, file) else {
            continue;
        };
        assert_eq!(snap.segments.len(), segments, "{file}: segments");
        let n_blocks: usize = snap.segments.iter().map(|s| s.blocks.len()).sum();
        assert_eq!(n_blocks, blocks, "{file}: blocks");
        assert_eq!(snap.total_reserved(), reserved, "{file}: reserved");
        let lens: Vec<usize> = snap.device_traces.iter().map(Vec::len).collect();
        assert_eq!(lens, traces, "{file}: trace entries per device");
        let n_seg = snap
            .device_traces
            .iter()
            .flatten()
            .filter(|e| e.action == TraceAction::SegmentAlloc)
            .count();
        assert_eq!(n_seg, segment_allocs, "{file}: segment_alloc entries");
        for s in &snap.segments {
            let mut addr = s.address;
            for b in &s.blocks {
                assert_eq!(
                    b.address, addr,
                    "{file}: blocks tile segment {:#x}",
                    s.address
                );
                addr += b.size;
            }
            assert_eq!(
                addr - s.address,
                s.total_size,
                "{file}: segment {:#x}",
                s.address
            );
        }
        // PyTorch's snapshots carry no categories, so nothing needs adding for the viewer.
        assert!(!snap.needs_unknown_category(), "{file}");
    }
}

/// The two traces recorded from an empty allocator replay to the same `segment_alloc` sizes in
/// the same order: trainmem's allocator follows PyTorch's rules on real workloads.
#[test]
fn traces_from_an_empty_allocator_replay_to_the_recorded_segments() {
    let Some(dir) = snapshots_dir() else { return };
    for file in [
        "silmont2000+assignment2-systems/133f064/mem_snapshot.pickle",
        "ZidongLiu+DeComFL/edd30e0/memory.pickle",
    ] {
        let Some((bytes, snap)) = read(&dir, file) else {
            continue;
        };
        let recorded: Vec<u64> = snap.device_traces[0]
            .iter()
            .filter(|e| e.action == TraceAction::SegmentAlloc)
            .map(|e| e.size)
            .collect();
        let mut r = Replayer::simulated(80 << 30, AllocatorConfig::default());
        r.allocator_mut().enable_trace(None);
        let format = replay_trace(&bytes[..], &mut r, 0, |_| {}).unwrap();
        let TraceFormat::Snapshot(info) = format else {
            panic!("{file}: read as a snapshot")
        };
        assert_eq!(info.frees_of_unknown_blocks, 0, "{file}");
        assert!(r.ooms().is_empty(), "{file}");
        let replayed: Vec<u64> = r
            .allocator()
            .trace()
            .iter()
            .filter(|e| e.action == TraceAction::SegmentAlloc)
            .map(|e| e.size)
            .collect();
        assert_eq!(replayed, recorded, "{file}: segment_alloc sizes in order");
    }
}

/// A real snapshot written back by trainmem's writer reads back the same.
#[test]
fn real_snapshot_survives_a_write_and_read() {
    let Some(dir) = snapshots_dir() else { return };
    let Some((_, snap)) = read(
        &dir,
        "silmont2000+assignment2-systems/133f064/mem_snapshot.pickle",
    ) else {
        return;
    };
    let bytes = pickle::to_bytes(&snap).unwrap();
    assert_eq!(pickle::first_unsupported_opcode(&bytes), None);
    assert_eq!(pickle::from_bytes(&bytes).unwrap(), snap);
}
