//! A PyTorch memory snapshot as a pickle that pytorch.org/memory_viz opens.
//!
//! The dict has PyTorch's keys (`segments`, `device_traces`, `allocator_settings`); every
//! block and trace entry carries the trainmem category (the allocation's label) in
//! `category` and as a one-frame stack, so the viewer colours the timeline by category. It is
//! written with serde-pickle (protocol 3) from strings, integers, booleans, lists, tuples and
//! dicts only: no bytes or sets, which the viewer's unpickler does not read.

use std::collections::BTreeMap;

use serde_pickle::{HashableValue, SerOptions, Value};
use trainmem_alloc::{Snapshot, TraceAction};

use super::ExportError;

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
fn frames(label: Option<&str>) -> Value {
    match label {
        Some(l) => Value::List(vec![dict(vec![
            ("filename", s("trainmem")),
            ("line", i(0)),
            ("name", s(l)),
        ])]),
        None => Value::List(vec![]),
    }
}

/// Builds the snapshot dict as a pickle value.
pub fn snapshot_value(snap: &Snapshot) -> Value {
    let segments = snap
        .segments
        .iter()
        .map(|seg| {
            let blocks = seg
                .blocks
                .iter()
                .map(|b| {
                    let label = b.label.as_ref().map(|l| l.as_str());
                    let mut e = vec![
                        ("address", i(b.address)),
                        ("size", i(b.size)),
                        ("requested_size", i(b.requested_size)),
                        ("state", s(b.state.as_str())),
                        ("frames", frames(label)),
                    ];
                    if let Some(l) = label {
                        e.push(("category", s(l)));
                    }
                    dict(e)
                })
                .collect();
            dict(vec![
                ("device", i(0)),
                ("address", i(seg.address)),
                ("total_size", i(seg.total_size)),
                ("allocated_size", i(seg.allocated_size)),
                ("active_size", i(seg.active_size)),
                ("requested_size", i(seg.requested_size)),
                ("stream", i(seg.stream.0)),
                ("segment_type", s(seg.segment_type.as_str())),
                ("segment_pool_id", Value::Tuple(vec![i(0), i(0)])),
                ("is_expandable", Value::Bool(false)),
                ("frames", frames(None)),
                ("blocks", Value::List(blocks)),
            ])
        })
        .collect();
    let traces = snap
        .device_traces
        .iter()
        .map(|dev| {
            Value::List(
                dev.iter()
                    .map(|t| {
                        let label = t.label.as_ref().map(|l| l.as_str());
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
                            ("time_us", i(t.time)),
                            ("frames", frames(label)),
                        ];
                        if let Some(l) = label {
                            e.push(("category", s(l)));
                        }
                        dict(e)
                    })
                    .collect(),
            )
        })
        .collect();
    let st = &snap.allocator_settings;
    let divisions = st
        .roundup_power2_divisions
        .iter()
        .map(|(k, v)| (HashableValue::String(k.clone()), i(*v)))
        .collect();
    dict(vec![
        ("segments", Value::List(segments)),
        ("device_traces", Value::List(traces)),
        (
            "allocator_settings",
            dict(vec![
                ("PYTORCH_CUDA_ALLOC_CONF", s(&st.conf)),
                ("max_split_size", Value::I64(st.max_split_size)),
                (
                    "garbage_collection_threshold",
                    Value::F64(st.garbage_collection_threshold),
                ),
                ("expandable_segments", Value::Bool(st.expandable_segments)),
                ("roundup_power2_divisions", Value::Dict(divisions)),
            ]),
        ),
    ])
}

/// The snapshot pickle bytes (protocol 3).
pub fn snapshot_pickle(snap: &Snapshot) -> Result<Vec<u8>, ExportError> {
    serde_pickle::value_to_vec(&snapshot_value(snap), SerOptions::new())
        .map_err(|e| ExportError::Pickle(e.to_string()))
}

/// Opcodes memory_viz's unpickler accepts (reference/simulator.md §3.1).
pub const VIEWER_OPCODES: &[u8] = &[
    0x80, // PROTO
    0x95, // FRAME
    b'(', // MARK
    b'.', // STOP
    b'}', // EMPTY_DICT
    b']', // EMPTY_LIST
    b')', // EMPTY_TUPLE
    b'd', // DICT
    b'l', // LIST
    b't', // TUPLE
    0x85, 0x86, 0x87, // TUPLE1-3
    b's', b'u', // SETITEM(S)
    b'a', b'e', // APPEND(S)
    b'J', b'K', b'M', // BININT, BININT1, BININT2
    0x8a, // LONG1
    b'G', // BINFLOAT
    b'X', 0x8c, // BINUNICODE, SHORT_BINUNICODE
    b'N', // NONE
    0x88, 0x89, // NEWTRUE, NEWFALSE
    0x94, // MEMOIZE
    b'q', b'r', // BINPUT, LONG_BINPUT
    b'h', b'j', // BINGET, LONG_BINGET
];

/// Walks a pickle's opcodes and returns the first one the viewer would reject, if any.
pub fn first_unsupported_opcode(data: &[u8]) -> Option<(usize, u8)> {
    let mut p = 0usize;
    while p < data.len() {
        let op = data[p];
        if !VIEWER_OPCODES.contains(&op) {
            return Some((p, op));
        }
        let le = |n: usize| -> usize {
            let mut v = 0usize;
            for k in 0..n {
                v |= (data.get(p + 1 + k).copied().unwrap_or(0) as usize) << (8 * k);
            }
            v
        };
        p += 1 + match op {
            0x80 => 1,
            0x95 => 8,
            b'J' => 4,
            b'K' => 1,
            b'M' => 2,
            0x8a => 1 + le(1),
            b'G' => 8,
            b'X' => 4 + le(4),
            0x8c => 1 + le(1),
            b'q' | b'h' => 1,
            b'r' | b'j' => 4,
            b'.' => return None,
            _ => 0,
        };
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use trainmem_alloc::{CachingAllocator, SimulatedDevice, StreamId};

    #[test]
    fn snapshot_pickle_uses_only_viewer_opcodes_and_round_trips() {
        let mut a = CachingAllocator::new(SimulatedDevice::new(1 << 30));
        a.enable_trace(None);
        let x = a
            .malloc_labeled(3 << 20, StreamId::DEFAULT, "activation")
            .unwrap();
        let _y = a
            .malloc_labeled(1000, StreamId::DEFAULT, "parameter")
            .unwrap();
        a.free(x.id).unwrap();
        let bytes = snapshot_pickle(&a.snapshot()).unwrap();
        assert_eq!(first_unsupported_opcode(&bytes), None);
        let back: Value = serde_pickle::value_from_slice(&bytes, Default::default()).unwrap();
        let Value::Dict(top) = back else {
            panic!("not a dict")
        };
        let traces = &top[&HashableValue::String("device_traces".into())];
        let Value::List(devs) = traces else { panic!() };
        let Value::List(entries) = &devs[0] else {
            panic!()
        };
        let cats: Vec<String> = entries
            .iter()
            .filter_map(|e| match e {
                Value::Dict(d) => match d.get(&HashableValue::String("category".into())) {
                    Some(Value::String(c)) => Some(c.clone()),
                    _ => None,
                },
                _ => None,
            })
            .collect();
        assert!(
            cats.contains(&"activation".to_string()) && cats.contains(&"parameter".to_string()),
            "{cats:?}"
        );
    }
}
