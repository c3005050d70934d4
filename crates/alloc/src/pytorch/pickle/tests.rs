//! Pickles: the round trip, what PyTorch's viewers read, the "unknown" category, PyTorch's own
//! encoding (shared frames), bad input.

use std::collections::BTreeMap;

use serde_pickle::{HashableValue, Value};

use super::*;
use crate::{
    BlockState, CachingAllocator, Frame, Label, SimulatedDevice, Snapshot, StreamId, TraceAction,
    TraceEntry, UNKNOWN_CATEGORY,
};

const MIB: u64 = 1 << 20;

/// A traced allocator state with labelled and unlabelled blocks on two streams, a pending
/// free, an empty_cache (unlabelled segment_free) and an OOM.
fn traced_snapshot() -> Snapshot {
    let mut a = CachingAllocator::new(SimulatedDevice::new(256 * MIB));
    a.enable_trace(None);
    let s0 = StreamId::DEFAULT;
    let x = a.malloc_labeled(3 * MIB, s0, "activation").unwrap();
    let _p = a.malloc_labeled(1000, s0, "parameter").unwrap();
    let _u = a.malloc(25 * MIB, StreamId(7)).unwrap();
    a.free(x.id).unwrap();
    let big = a.malloc(30 * MIB, StreamId(7)).unwrap();
    a.free(big.id).unwrap();
    a.empty_cache().unwrap();
    assert!(a.malloc_labeled(1 << 40, s0, "activation").is_err());
    let y = a.malloc_labeled(2 * MIB, s0, "temporary").unwrap();
    a.record_stream(y.id, StreamId(7)).unwrap();
    a.free(y.id).unwrap(); // pending until stream 7 is synchronised
    a.snapshot()
}

#[test]
fn round_trip_keeps_segments_blocks_and_traces() {
    let snap = traced_snapshot();
    let bytes = to_bytes(&snap).unwrap();
    let back = from_bytes(&bytes).unwrap();
    // as written: each label as its one trainmem frame; the "unknown" category the writer
    // added for the viewer is taken out again on reading
    let mut written = snap.clone();
    let frames = |label: Option<&str>| label.map(|l| vec![Frame::for_label(l)]);
    for e in written.device_traces.iter_mut().flatten() {
        e.frames = frames(e.label()).unwrap_or_default();
    }
    for b in written.segments.iter_mut().flat_map(|s| &mut s.blocks) {
        b.frames = frames(b.label()).unwrap_or_default();
    }
    assert_eq!(back, written);
    // as the viewer sees it: with "unknown" on every entry that had no category
    let mut viewed = written.clone();
    viewed.add_unknown_category();
    assert_ne!(viewed, written, "the fixture needs the viewer's category");
    assert_eq!(from_bytes_verbatim(&bytes).unwrap(), viewed);

    assert_eq!(back.segments.len(), snap.segments.len());
    for (r, s) in back.segments.iter().zip(&snap.segments) {
        assert_eq!(
            (
                r.address,
                r.total_size,
                r.allocated_size,
                r.active_size,
                r.stream
            ),
            (
                s.address,
                s.total_size,
                s.allocated_size,
                s.active_size,
                s.stream
            )
        );
        assert_eq!(r.segment_type, s.segment_type);
        assert_eq!(r.blocks.len(), s.blocks.len());
        for (rb, sb) in r.blocks.iter().zip(&s.blocks) {
            assert_eq!(
                (rb.address, rb.size, rb.requested_size, rb.state),
                (sb.address, sb.size, sb.requested_size, sb.state)
            );
            assert_eq!(rb.label(), sb.label());
        }
    }
    assert!(
        back.segments
            .iter()
            .flat_map(|s| &s.blocks)
            .any(|b| b.state == BlockState::ActivePendingFree)
    );
    assert_eq!(back.device_traces.len(), 1);
    let (trace, original) = (&back.device_traces[0], &snap.device_traces[0]);
    assert_eq!(trace.len(), original.len());
    for (e, o) in trace.iter().zip(original) {
        assert_eq!(e.action, o.action);
        assert_eq!((e.addr, e.size, e.stream), (o.addr, o.size, o.stream));
        assert_eq!(e.time_us, o.time_us);
        assert_eq!(e.label(), o.label());
    }
    assert!(trace.iter().any(|e| e.action == TraceAction::Oom));
    assert_eq!(back.allocator_settings, snap.allocator_settings);
    // Written again, the same bytes.
    assert_eq!(to_bytes(&back).unwrap(), bytes);
}

fn key<'a>(map: &'a BTreeMap<HashableValue, Value>, k: &str) -> &'a Value {
    map.get(&HashableValue::String(k.into()))
        .unwrap_or_else(|| panic!("no key {k:?} in {:?}", map.keys().collect::<Vec<_>>()))
}

fn as_dict(v: &Value) -> &BTreeMap<HashableValue, Value> {
    match v {
        Value::Dict(d) => d,
        other => panic!("not a dict: {other:?}"),
    }
}

fn as_list(v: &Value) -> &[Value] {
    match v {
        Value::List(l) => l,
        other => panic!("not a list: {other:?}"),
    }
}

fn as_int(v: &Value) -> i64 {
    match v {
        Value::I64(x) => *x,
        other => panic!("not an int: {other:?}"),
    }
}

/// Everything `python -m torch.cuda._memory_viz` and pytorch.org/memory_viz read is in the
/// written pickle, with the types they expect, in the opcodes the web viewer can parse.
#[test]
fn written_pickle_holds_what_the_viewers_read() {
    let snap = traced_snapshot();
    let bytes = to_bytes(&snap).unwrap();
    assert_eq!(bytes[0], PICKLE_MAGIC);
    assert_eq!(first_unsupported_opcode(&bytes), None);
    let top: Value = serde_pickle::value_from_slice(&bytes, Default::default()).unwrap();
    let top = as_dict(&top);

    let settings = as_dict(key(top, "allocator_settings"));
    for k in [
        "PYTORCH_CUDA_ALLOC_CONF",
        "max_split_size",
        "garbage_collection_threshold",
        "expandable_segments",
        "roundup_power2_divisions",
    ] {
        key(settings, k);
    }

    let segments = as_list(key(top, "segments"));
    assert_eq!(segments.len(), snap.segments.len());
    for seg in segments {
        let seg = as_dict(seg);
        for k in [
            "device",
            "stream",
            "segment_type",
            "frames",
            "allocated_size",
        ] {
            key(seg, k);
        }
        let total = as_int(key(seg, "total_size"));
        let mut addr = as_int(key(seg, "address"));
        let mut sum = 0;
        for b in as_list(key(seg, "blocks")) {
            let b = as_dict(b);
            assert_eq!(as_int(key(b, "address")), addr, "blocks tile the segment");
            let size = as_int(key(b, "size"));
            addr += size;
            sum += size;
            as_int(key(b, "requested_size"));
            as_list(key(b, "frames"));
            let Value::String(state) = key(b, "state") else {
                panic!("state is a string")
            };
            assert!(
                ["active_allocated", "active_pending_free", "inactive"].contains(&state.as_str())
            );
        }
        assert_eq!(sum, total);
    }

    let traces = as_list(key(top, "device_traces"));
    assert_eq!(traces.len(), 1);
    let mut categories = Vec::new();
    for e in as_list(&traces[0]) {
        let e = as_dict(e);
        let Value::String(action) = key(e, "action") else {
            panic!("action is a string")
        };
        if action == "oom" {
            as_int(key(e, "device_free"));
        } else {
            as_int(key(e, "addr"));
        }
        as_int(key(e, "size"));
        as_int(key(e, "stream"));
        as_int(key(e, "time_us"));
        for f in as_list(key(e, "frames")) {
            let f = as_dict(f);
            key(f, "filename");
            key(f, "line");
            key(f, "name");
        }
        if let Some(Value::String(c)) = e.get(&HashableValue::String("category".into()))
            && !categories.contains(c)
        {
            categories.push(c.clone());
        }
    }
    for c in ["activation", "parameter", "temporary", UNKNOWN_CATEGORY] {
        assert!(categories.iter().any(|x| x == c), "{c} in {categories:?}");
    }
}

fn event(action: TraceAction, category: Option<&str>) -> TraceEntry {
    TraceEntry {
        action,
        addr: 0x1000,
        size: 512,
        stream: StreamId::DEFAULT,
        time_us: Some(5),
        frames: category
            .map(|c| vec![Frame::for_label(c)])
            .unwrap_or_default(),
        category: category.map(|c| Label::from(c.to_string())),
    }
}

#[test]
fn a_fully_labelled_trace_gets_an_unknown_category() {
    // Every event labelled (as when every allocation has a category and no segment was
    // freed): the viewer would throw. The writer adds a `snapshot` event marked "unknown".
    let mut a = CachingAllocator::new(SimulatedDevice::new(64 * MIB));
    a.enable_trace(None);
    a.malloc_labeled(4096, StreamId::DEFAULT, "activation")
        .unwrap();
    let snap = a.snapshot();
    assert!(
        snap.device_traces[0].iter().all(|e| e.label().is_some()),
        "segment_alloc and alloc both carry the label"
    );
    let bytes = to_bytes(&snap).unwrap();
    let m = from_bytes_verbatim(&bytes).unwrap();
    assert!(!m.needs_unknown_category());
    let last = m.device_traces[0].last().unwrap();
    assert_eq!(last.action, TraceAction::Snapshot);
    assert_eq!(last.category.as_deref(), Some(UNKNOWN_CATEGORY));
    assert_eq!(last.size, 4096);
    assert_eq!(m.categories(), vec!["activation", UNKNOWN_CATEGORY]);
    // Read back, the added entry is gone again.
    let back = from_bytes(&bytes).unwrap();
    assert_eq!(back.device_traces[0].len(), snap.device_traces[0].len());
    assert_eq!(back.categories(), vec!["activation"]);

    // Built by hand without "unknown": the writer fixes it; the unlabelled event gets it.
    let hand = Snapshot {
        device_traces: vec![vec![
            event(TraceAction::SegmentAlloc, None),
            event(TraceAction::Alloc, Some("gradient")),
        ]],
        ..Default::default()
    };
    assert!(hand.needs_unknown_category());
    let bytes = to_bytes(&hand).unwrap();
    let viewed = from_bytes_verbatim(&bytes).unwrap();
    assert_eq!(viewed.device_traces[0].len(), 2);
    assert_eq!(
        viewed.device_traces[0][0].category.as_deref(),
        Some(UNKNOWN_CATEGORY)
    );
    // The category was invented for the viewer: reading back gives no category, as written.
    assert_eq!(from_bytes(&bytes).unwrap(), hand);

    // No categories at all (PyTorch's own snapshots): nothing is added.
    let plain = Snapshot {
        device_traces: vec![vec![event(TraceAction::Alloc, None)]],
        ..Default::default()
    };
    assert!(!plain.needs_unknown_category());
    assert_eq!(from_bytes(&to_bytes(&plain).unwrap()).unwrap(), plain);
}

/// A protocol-4 pickle as Python writes it: strings memoized and referred back to, and the
/// `frames` list shared by both entries (as PyTorch shares frame objects).
fn python_style_pickle() -> Vec<u8> {
    let mut b = vec![0x80, 0x04, b'}', 0x94, b'('];
    let s = |b: &mut Vec<u8>, text: &str| {
        b.push(0x8c);
        b.push(text.len() as u8);
        b.extend_from_slice(text.as_bytes());
        b.push(0x94);
    };
    s(&mut b, "device_traces"); // memo 1
    b.extend_from_slice(&[b']', 0x94, b']', 0x94, b'(']); // memo 2, 3
    b.extend_from_slice(&[b'}', 0x94, b'(']); // entry 1, memo 4
    s(&mut b, "action"); // 5
    s(&mut b, "alloc"); // 6
    s(&mut b, "addr"); // 7
    b.extend_from_slice(&[b'M', 0x00, 0x10]); // 4096
    s(&mut b, "size"); // 8
    b.extend_from_slice(&[b'K', 100]);
    s(&mut b, "stream"); // 9
    b.extend_from_slice(&[b'K', 0]);
    s(&mut b, "note"); // 10
    s(&mut b, "fwd"); // 11
    s(&mut b, "frames"); // 12
    b.extend_from_slice(&[b']', 0x94, b'(', b'h', 11, b'e']); // frames = ["fwd"], memo 13
    b.push(b'u');
    b.extend_from_slice(&[b'}', 0x94, b'(', b'h', 5]); // entry 2, memo 14
    s(&mut b, "free_completed"); // 15
    b.extend_from_slice(&[
        b'h', 7, b'M', 0x00, 0x10, b'h', 8, b'K', 100, b'h', 9, b'K', 0,
    ]);
    b.extend_from_slice(&[b'h', 12, b'h', 13, b'u']); // the same frames list
    b.extend_from_slice(b"eau."); // APPENDS, APPEND, SETITEMS, STOP
    b
}

#[test]
fn python_pickles_with_shared_frames_are_read() {
    let bytes = python_style_pickle();
    // Without replacing the shared values, serde-pickle rejects this pickle.
    assert!(serde_pickle::value_from_slice(&bytes, serde_pickle::DeOptions::new()).is_err());
    let snap = from_bytes(&bytes).unwrap();
    assert!(snap.segments.is_empty());
    let actions: Vec<_> = snap.device_traces[0]
        .iter()
        .map(|e| (e.action.clone(), e.addr, e.size))
        .collect();
    assert_eq!(
        actions,
        vec![
            (TraceAction::Alloc, 4096, 100),
            (TraceAction::FreeCompleted, 4096, 100)
        ]
    );
}

#[test]
fn bad_input_is_an_error_that_says_where() {
    let not_dict = serde_pickle::value_to_vec(&Value::List(vec![]), Default::default()).unwrap();
    assert!(matches!(
        from_bytes(&not_dict),
        Err(PickleError::NotASnapshot)
    ));
    assert!(matches!(
        from_bytes(&[0x80, 0x03, 0xff]),
        Err(PickleError::Decode(_))
    ));
    // The message names what the data starts with.
    let e = from_bytes(b"not a pickle").unwrap_err();
    assert!(
        matches!(
            e,
            PickleError::NotAPickle {
                first_byte: Some(b'n'),
                ..
            }
        ),
        "{e:?}"
    );
    let msg = e.to_string();
    assert!(!msg.contains("starts like a pickle"), "{msg}");
    assert!(
        msg.contains("0x6e ('n')") && msg.contains("not 0x80"),
        "{msg}"
    );
    let e = from_bytes(b"").unwrap_err();
    assert!(
        matches!(
            e,
            PickleError::NotAPickle {
                first_byte: None,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("empty"), "{e}");
    let e = from_bytes(&[0x00, 0x01]).unwrap_err().to_string();
    assert!(e.contains("0x00,") || e.contains("0x00 "), "{e}");
    let e = from_bytes(&[0x80, 0x04]).unwrap_err().to_string();
    assert!(e.contains("starts like a pickle"), "{e}");
    let no_traces = Snapshot::default();
    let mut v = to_value(&no_traces);
    if let Value::Dict(d) = &mut v {
        d.remove(&HashableValue::String("device_traces".into()));
    }
    let bytes = serde_pickle::value_to_vec(&v, Default::default()).unwrap();
    let err = from_bytes(&bytes).unwrap_err();
    assert!(err.to_string().contains("_record_memory_history"), "{err}");

    let mut m = traced_snapshot();
    m.segments.truncate(1);
    let mut v = to_value(&m);
    let Value::Dict(top) = &mut v else { panic!() };
    let Some(Value::List(segs)) = top.get_mut(&HashableValue::String("segments".into())) else {
        panic!()
    };
    let Value::Dict(seg) = &mut segs[0] else {
        panic!()
    };
    let Some(Value::List(blocks)) = seg.get_mut(&HashableValue::String("blocks".into())) else {
        panic!()
    };
    let Value::Dict(block) = &mut blocks[0] else {
        panic!()
    };
    block.insert(
        HashableValue::String("size".into()),
        Value::String("big".into()),
    );
    let bytes = serde_pickle::value_to_vec(&v, Default::default()).unwrap();
    let err = from_bytes(&bytes).unwrap_err().to_string();
    assert!(err.contains("segments[0].blocks[0].size"), "{err}");
    assert!(err.contains("expected an integer"), "{err}");
}

mod round_trip_property {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// Whatever mix of labelled and unlabelled events a trace has, the categories read back
        /// are the ones written: none invented, none lost, no entry added.
        #[test]
        fn categories_survive_the_round_trip(
            ops in proptest::collection::vec((1u64..(24 << 20), proptest::option::of(0usize..3), any::<bool>()), 1..24),
        ) {
            let mut a = CachingAllocator::new(SimulatedDevice::new(1 << 30));
            a.enable_trace(None);
            let labels = ["activation", "parameter", UNKNOWN_CATEGORY];
            let mut live = Vec::new();
            for (size, label, free_one) in ops {
                let b = match label {
                    Some(l) => a.malloc_labeled(size, StreamId::DEFAULT, labels[l]),
                    None => a.malloc(size, StreamId::DEFAULT),
                };
                if let Ok(b) = b {
                    live.push(b);
                }
                if free_one && !live.is_empty() {
                    a.free(live.swap_remove(0).id).unwrap();
                }
            }
            a.empty_cache().unwrap();
            let snap = a.snapshot();
            let back = from_bytes(&to_bytes(&snap).unwrap()).unwrap();
            let cats = |s: &Snapshot| -> Vec<Option<String>> {
                s.device_traces
                    .iter()
                    .flatten()
                    .map(|e| e.category.as_ref().map(|c| c.as_str().to_string()))
                    .collect()
            };
            prop_assert_eq!(cats(&back), cats(&snap));
            prop_assert_eq!(back.categories(), snap.categories());
        }
    }
}
