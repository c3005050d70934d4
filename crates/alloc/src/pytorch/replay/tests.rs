//! The replay engine: counts, out-of-memory, id policies, labels, whole files.

use super::*;
use crate::{AllocatorConfig, CachingAllocator, HostDevice, Label, StreamId};

const MIB: u64 = 1 << 20;

fn alloc(id: u64, size: u64) -> Op {
    Op::alloc(id, size, 0)
}

fn labelled(id: u64, size: u64, label: &'static str) -> Op {
    Op::Alloc {
        id,
        size,
        stream: 0,
        label: Some(Label::from(label)),
    }
}

#[test]
fn replays_and_counts() {
    let mut r = Replayer::simulated(1 << 30, AllocatorConfig::default());
    let ops = [
        alloc(1, 3 * MIB),
        alloc(2, 100),
        Op::Free { id: 1 },
        Op::EmptyCache,
    ];
    for (i, op) in ops.into_iter().enumerate() {
        r.apply(Origin::Line(i as u64 + 1), op).unwrap();
    }
    let c = r.counts();
    assert_eq!(
        (c.ops, c.allocs, c.frees, c.empty_cache_calls, c.live_at_end),
        (4, 2, 1, 1, 1)
    );
    // The 3 MiB block lived in a 20 MiB segment, fully free after the free: released.
    assert_eq!(c.empty_cache_released_bytes, 20 * MIB);
    assert_eq!(r.allocator().memory_allocated(), 512);
    assert_eq!(r.allocator().memory_reserved(), 2 * MIB);
}

#[test]
fn oom_is_recorded_and_the_replay_goes_on() {
    let mut r = Replayer::simulated(64 * MIB, AllocatorConfig::default());
    r.apply(Origin::Line(1), alloc(1, 40 * MIB)).unwrap();
    let applied = r.apply(Origin::Line(2), alloc(2, 40 * MIB)).unwrap();
    assert_eq!(applied, Applied::OutOfMemory);
    assert_eq!(
        r.apply(Origin::Line(3), Op::Free { id: 2 }).unwrap(),
        Applied::Skipped
    );
    r.apply(Origin::Line(4), alloc(3, 10 * MIB)).unwrap();
    assert_eq!(r.ooms().len(), 1);
    assert_eq!(r.ooms()[0].line, Some(2));
    assert!(
        r.ooms()[0].message.contains("Tried to allocate 40.00 MiB"),
        "{}",
        r.ooms()[0].message
    );
    let c = r.counts();
    assert_eq!(
        (c.frees, c.frees_of_failed_allocs, c.live_at_end),
        (0, 1, 2)
    );
}

#[test]
fn bad_ids_name_the_line() {
    let mut r = Replayer::simulated(1 << 30, AllocatorConfig::default());
    let err = r.apply(Origin::Line(9), Op::Free { id: 5 }).unwrap_err();
    assert!(
        err.to_string().contains("line 9: free of unknown id 5"),
        "{err}"
    );
    r.apply(Origin::Line(10), alloc(5, 1)).unwrap();
    let err = r.apply(Origin::Line(11), alloc(5, 1)).unwrap_err();
    assert!(
        err.to_string()
            .contains("line 11: alloc of id 5, which is still live")
    );
}

#[test]
fn recorded_policy_skips_unknown_frees_and_orphans_reused_ids() {
    let mut r = Replayer::simulated(1 << 30, AllocatorConfig::default())
        .with_policy(ReplayPolicy::RECORDED);
    r.apply(Origin::Event(0), Op::Free { id: 77 }).unwrap();
    r.apply(Origin::Event(1), labelled(1, 4 * MIB, "activation"))
        .unwrap();
    r.apply(Origin::Event(2), labelled(1, 2 * MIB, "gradient"))
        .unwrap();
    r.apply(Origin::Event(3), Op::Free { id: 1 }).unwrap();
    let c = r.counts();
    assert_eq!(
        (c.frees_of_unknown_ids, c.orphaned_blocks, c.frees),
        (1, 1, 1)
    );
    // The orphaned 4 MiB block is still allocated; the trace can no longer free it.
    assert_eq!(r.allocator().memory_allocated(), 4 * MIB);
    assert_eq!(r.live_bytes_by_label()["activation"], 0);
    assert_eq!(r.live_bytes_by_label()["gradient"], 0);
    // Zero counts stay out of the JSON form.
    let json = serde_json::to_value(Counts::default()).unwrap();
    assert!(json.get("orphaned_blocks").is_none());
    assert!(json.get("frees_of_unknown_ids").is_none());
}

/// The scenario use: a host-memory allocator, labels per block, sampling between ops, an
/// empty_cache, and the snapshot with its trace at the end.
#[test]
fn labelled_replay_over_host_memory_samples_between_ops() {
    let mut alloc = CachingAllocator::with_config(HostDevice::new(256 * MIB), Default::default());
    alloc.enable_trace(Some(1000));
    let mut r = Replayer::new(alloc).with_policy(ReplayPolicy::RECORDED);
    let events = [
        labelled(0x1000, 3 * MIB, "parameter"),
        labelled(0x2000, 5 * MIB, "activation"),
        labelled(0x3000, 1000, "activation"),
    ];
    for (n, op) in events.into_iter().enumerate() {
        r.apply(Origin::Event(n as u64), op).unwrap();
    }
    let by_label = r.live_bytes_by_label().clone();
    assert_eq!(by_label["parameter"], 3 * MIB);
    assert_eq!(by_label["activation"], 5 * MIB + 1024);
    assert_eq!(r.allocator().memory_allocated(), 8 * MIB + 1024);
    r.apply(Origin::Event(3), Op::Free { id: 0x2000 }).unwrap();
    r.apply(Origin::Event(4), Op::Free { id: 0x3000 }).unwrap();
    let Applied::Released(released) = r.apply(Origin::Event(5), Op::EmptyCache).unwrap() else {
        panic!("empty_cache reports what it released")
    };
    // 3 MiB and 5 MiB share one 20 MiB segment (3 MiB still live); the 2 MiB small segment
    // is entirely free.
    assert_eq!(released.bytes, 2 * MIB);
    assert_eq!(r.live_bytes_by_label()["activation"], 0);
    let snap = r.allocator().snapshot();
    let labels: Vec<&str> = snap.device_traces[0]
        .iter()
        .filter_map(|e| e.label())
        .collect();
    assert!(labels.contains(&"parameter") && labels.contains(&"activation"));
    assert_eq!(r.into_allocator().memory_reserved(), 20 * MIB);
}

#[test]
fn replay_trace_reads_json_lines_and_reports_progress() {
    let text = "{\"op\":\"alloc\",\"id\":1,\"size\":8}\n# c\n{\"op\":\"free\",\"id\":1}\n";
    let mut r = Replayer::simulated(1 << 30, AllocatorConfig::default());
    let mut seen = Vec::new();
    let format = replay_trace(text.as_bytes(), &mut r, 0, |p| seen.push(p)).unwrap();
    assert_eq!(format, TraceFormat::JsonLines);
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1].bytes_read, text.len() as u64);
    assert_eq!(seen[1].total_ops, None);

    let bad = "{\"op\":\"alloc\",\"id\":1}\n";
    let err = replay_trace(bad.as_bytes(), &mut r, 0, |_| {}).unwrap_err();
    assert!(
        matches!(err, ReplayError::Malformed { line: 1, .. }),
        "{err}"
    );
}

/// A snapshot written by trainmem replays to the state of the allocator that wrote it.
#[test]
fn a_written_snapshot_replays_to_the_same_stats() {
    let mut alloc = CachingAllocator::new(crate::SimulatedDevice::new(8 << 30));
    alloc.enable_trace(None);
    let mut live = Vec::new();
    for i in 0..200u64 {
        let size = (i * 7919 % 50) * 300_000 + 1 + i * 13;
        let label = if i % 2 == 0 { "activation" } else { "gradient" };
        live.push(alloc.malloc_labeled(size, StreamId(i % 2), label).unwrap());
        if i % 3 == 0 {
            let victim = live.remove((i as usize * 31) % live.len());
            alloc.free(victim.id).unwrap();
        }
    }
    let bytes = crate::pytorch::pickle::to_bytes(&alloc.snapshot()).unwrap();
    let mut r = Replayer::simulated(8 << 30, AllocatorConfig::default());
    let mut last = None;
    let format = replay_trace(&bytes[..], &mut r, 0, |p| last = Some(p)).unwrap();
    let TraceFormat::Snapshot(info) = format else {
        panic!("a pickle is read as a snapshot")
    };
    assert_eq!(info.free_action, "free_completed");
    assert_eq!(info.frees_of_unknown_blocks, 0);
    let last = last.unwrap();
    assert_eq!(Some(last.ops), last.total_ops);
    let (a, b) = (alloc.memory_stats(), r.allocator().memory_stats());
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
        assert_eq!(a[key], b[key], "{key}");
    }
    // Labels travel through the pickle into the replaying allocator.
    let replayed = r.allocator().snapshot();
    let original = alloc.snapshot();
    let labels = |s: &crate::Snapshot| -> Vec<Option<String>> {
        s.segments
            .iter()
            .flat_map(|seg| seg.blocks.iter())
            .map(|b| b.label().map(str::to_string))
            .collect()
    };
    assert_eq!(labels(&replayed), labels(&original));
}
