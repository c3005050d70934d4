//! Writing a [`Snapshot`] as a pickle PyTorch's viewers open.
//!
//! Written with serde-pickle (protocol 3) from strings, integers, floats, booleans, lists,
//! tuples and dicts only: no bytes, sets or globals, which the web viewer's unpickler does not
//! read (see [`first_unsupported_opcode`](super::first_unsupported_opcode)). Integers above
//! `i64::MAX` are written as `i64::MAX`.

use std::collections::BTreeMap;

use serde_pickle::{HashableValue, SerOptions, Value};

use super::PickleError;
use crate::snapshot::WrittenFrames;
use crate::{AllocatorSettings, BlockInfo, SegmentInfo, Snapshot, TraceAction, TraceEntry};

fn s(x: &str) -> Value {
    Value::String(x.to_string())
}

fn i(x: u64) -> Value {
    Value::I64(x.min(i64::MAX as u64) as i64)
}

fn dict(entries: Vec<(&str, Value)>) -> Value {
    let mut m = BTreeMap::new();
    for (k, v) in entries {
        m.insert(HashableValue::String(k.to_string()), v);
    }
    Value::Dict(m)
}

fn frames(frames: WrittenFrames<'_>) -> Value {
    Value::List(
        frames
            .each()
            .map(|(filename, line, name)| {
                dict(vec![
                    ("filename", s(filename)),
                    ("line", Value::I64(line)),
                    ("name", s(name)),
                ])
            })
            .collect(),
    )
}

fn block(b: &BlockInfo) -> Value {
    let mut e = vec![
        ("address", i(b.address)),
        ("size", i(b.size)),
        ("requested_size", i(b.requested_size)),
        ("state", s(b.state.as_str())),
        (
            "frames",
            frames(WrittenFrames::of(&b.frames, b.category.as_ref())),
        ),
    ];
    if let Some(c) = &b.category {
        e.push(("category", s(c.as_str())));
    }
    dict(e)
}

fn segment(seg: &SegmentInfo) -> Value {
    dict(vec![
        ("device", i(seg.device)),
        ("address", i(seg.address)),
        ("total_size", i(seg.total_size)),
        ("allocated_size", i(seg.allocated_size)),
        ("active_size", i(seg.active_size)),
        ("requested_size", i(seg.requested_size)),
        ("stream", i(seg.stream.0)),
        ("segment_type", s(seg.segment_type.as_str())),
        (
            "segment_pool_id",
            Value::Tuple(vec![i(seg.segment_pool_id.0), i(seg.segment_pool_id.1)]),
        ),
        ("is_expandable", Value::Bool(seg.is_expandable)),
        ("frames", frames(WrittenFrames::Recorded(&seg.frames))),
        (
            "blocks",
            Value::List(seg.blocks.iter().map(block).collect()),
        ),
    ])
}

/// What [`to_value`] added to a trace entry for pytorch.org/memory_viz, recorded in the entry
/// under [`ADDED_KEY`] so that [`from_bytes`](super::from_bytes) takes it out again.
#[derive(Clone, Copy)]
enum Added {
    /// The `"unknown"` category of an entry that had none.
    Category,
    /// The whole entry (the `snapshot` event carrying `"unknown"`).
    Entry,
}

/// The key of a trace entry that marks what the writer added (value `"category"` or
/// `"entry"`); viewers ignore it.
pub(crate) const ADDED_KEY: &str = "trainmem_added";
/// [`ADDED_KEY`]'s value for an added `"unknown"` category.
pub(super) const ADDED_CATEGORY: &str = "category";
/// [`ADDED_KEY`]'s value for an added entry.
pub(super) const ADDED_ENTRY: &str = "entry";

fn event(t: &TraceEntry, added: Option<Added>) -> Value {
    let addr_key = if t.action == TraceAction::Oom {
        "device_free"
    } else {
        "addr"
    };
    let mut e = vec![
        ("action", s(t.action.as_str())),
        (addr_key, i(t.addr)),
        ("size", i(t.size)),
        ("stream", i(t.stream.0)),
    ];
    if let Some(time) = t.time_us {
        e.push(("time_us", i(time)));
    }
    e.push((
        "frames",
        frames(WrittenFrames::of(&t.frames, t.category.as_ref())),
    ));
    if let Some(c) = &t.category {
        e.push(("category", s(c.as_str())));
    }
    match added {
        Some(Added::Category) => e.push((ADDED_KEY, s(ADDED_CATEGORY))),
        Some(Added::Entry) => e.push((ADDED_KEY, s(ADDED_ENTRY))),
        None => {}
    }
    dict(e)
}

fn settings(st: &AllocatorSettings) -> Value {
    let divisions = st
        .roundup_power2_divisions
        .iter()
        .map(|(k, v)| (HashableValue::String(k.clone()), i(*v)))
        .collect();
    dict(vec![
        ("PYTORCH_CUDA_ALLOC_CONF", s(&st.conf)),
        ("max_split_size", Value::I64(st.max_split_size)),
        (
            "garbage_collection_threshold",
            Value::F64(st.garbage_collection_threshold),
        ),
        ("expandable_segments", Value::Bool(st.expandable_segments)),
        ("roundup_power2_divisions", Value::Dict(divisions)),
    ])
}

/// The snapshot dict of `snap`; `original` is the snapshot before the writer added the
/// `"unknown"` category, when it did.
fn value_of(snap: &Snapshot, original: Option<&Snapshot>) -> Value {
    let added = |d: usize, k: usize, e: &TraceEntry| {
        let o = original?;
        match o.device_traces.get(d).and_then(|t| t.get(k)) {
            None => Some(Added::Entry),
            Some(was) if was.category.is_none() && e.category.is_some() => Some(Added::Category),
            Some(_) => None,
        }
    };
    let traces = snap
        .device_traces
        .iter()
        .enumerate()
        .map(|(d, trace)| {
            Value::List(
                trace
                    .iter()
                    .enumerate()
                    .map(|(k, e)| event(e, added(d, k, e)))
                    .collect(),
            )
        })
        .collect();
    let mut top = vec![
        (
            "segments",
            Value::List(snap.segments.iter().map(segment).collect()),
        ),
        ("device_traces", Value::List(traces)),
    ];
    if let Some(st) = &snap.allocator_settings {
        top.push(("allocator_settings", settings(st)));
    }
    dict(top)
}

/// The snapshot dict as a pickle value: keys `segments`, `device_traces` and (when present)
/// `allocator_settings`. A snapshot that
/// [needs an `"unknown"` category](Snapshot::needs_unknown_category) gets one
/// ([`Snapshot::add_unknown_category`]) so pytorch.org/memory_viz can draw it; each entry that
/// got it (or was added to carry it) is marked `"trainmem_added": "category"` (or `"entry"`),
/// which viewers ignore and [`from_bytes`](super::from_bytes) undoes, so that a snapshot reads
/// back as it was written.
pub fn to_value(snap: &Snapshot) -> Value {
    if snap.needs_unknown_category() {
        let mut fixed = snap.clone();
        fixed.add_unknown_category();
        value_of(&fixed, Some(snap))
    } else {
        value_of(snap, None)
    }
}

/// The snapshot as pickle bytes (protocol 3), as [`to_value`] builds it.
pub fn to_bytes(snap: &Snapshot) -> Result<Vec<u8>, PickleError> {
    serde_pickle::value_to_vec(&to_value(snap), SerOptions::new()).map_err(PickleError::Encode)
}
