//! Reading a memory-snapshot pickle (`torch.cuda.memory._dump_snapshot()`, or one trainmem
//! wrote) into a [`Snapshot`].
//!
//! Only plain data is read: dicts, lists, tuples, strings, numbers, booleans and None. A pickle
//! that refers to Python classes or functions has them replaced by None (nothing is ever
//! executed). PyTorch shares frame objects between trace entries; serde-pickle cannot rebuild
//! every shared value and gives None for some of them, so frames that come back as None are
//! left out. Keys the model does not hold are ignored; missing optional keys take PyTorch's
//! defaults.

use std::collections::BTreeMap;

use serde_pickle::{DeOptions, HashableValue, Value};

use super::PickleError;
use super::write::{ADDED_CATEGORY, ADDED_ENTRY, ADDED_KEY};
use crate::size::PoolKind;
use crate::{AllocatorSettings, BlockState, Label, StreamId};
use crate::{BlockInfo, Frame, SegmentInfo, Snapshot, TraceAction, TraceEntry};

type Dict = BTreeMap<HashableValue, Value>;

/// Reads a snapshot pickle. What [`to_bytes`](super::to_bytes) added for
/// pytorch.org/memory_viz (the `"unknown"` category, or a `snapshot` entry carrying it; see
/// [`to_value`](super::to_value)) is taken out again, so `from_bytes(&to_bytes(&s)?)` gives
/// back `s`'s segments and events. [`from_bytes_verbatim`] keeps it.
pub fn from_bytes(bytes: &[u8]) -> Result<Snapshot, PickleError> {
    read(bytes, false)
}

/// Reads a snapshot pickle as the viewers see it: like [`from_bytes`], but what
/// [`to_bytes`](super::to_bytes) added for pytorch.org/memory_viz stays (e.g. to check that a
/// written pickle has the `"unknown"` category the viewer needs).
pub fn from_bytes_verbatim(bytes: &[u8]) -> Result<Snapshot, PickleError> {
    read(bytes, true)
}

fn read(bytes: &[u8], verbatim: bool) -> Result<Snapshot, PickleError> {
    let options = DeOptions::new()
        .replace_unresolved_globals()
        .replace_recursive_structures();
    let value =
        serde_pickle::value_from_slice(bytes, options).map_err(|e| match bytes.first() {
            Some(&super::PICKLE_MAGIC) => PickleError::Decode(e),
            first => PickleError::NotAPickle {
                first_byte: first.copied(),
                source: e,
            },
        })?;
    read_value(&value, verbatim)
}

/// Reads a snapshot from an unpickled value: a dict with `device_traces` (required) and
/// `segments` and `allocator_settings` (optional). Takes out what the writer added for the
/// viewer, as [`from_bytes`] does.
pub fn from_value(value: &Value) -> Result<Snapshot, PickleError> {
    read_value(value, false)
}

fn read_value(value: &Value, verbatim: bool) -> Result<Snapshot, PickleError> {
    let Value::Dict(top) = value else {
        return Err(PickleError::NotASnapshot);
    };
    let traces = match get(top, "device_traces") {
        Some(v) => list(v, "device_traces")?,
        None => return Err(PickleError::NoDeviceTraces),
    };
    let device_traces = traces
        .iter()
        .enumerate()
        .map(|(d, trace)| {
            let at = format!("device_traces[{d}]");
            let mut events = Vec::new();
            for (k, e) in list(trace, &at)?.iter().enumerate() {
                let mut ev = event(e, &format!("{at}[{k}]"))?;
                match (verbatim, added_by_writer(e)) {
                    (false, Some(ADDED_ENTRY)) => continue,
                    (false, Some(ADDED_CATEGORY)) => ev.category = None,
                    _ => {}
                }
                events.push(ev);
            }
            Ok(events)
        })
        .collect::<Result<_, _>>()?;
    let segments = match get(top, "segments") {
        Some(v) => list(v, "segments")?
            .iter()
            .enumerate()
            .map(|(k, s)| segment(s, &format!("segments[{k}]")))
            .collect::<Result<_, _>>()?,
        None => Vec::new(),
    };
    let allocator_settings = match get(top, "allocator_settings") {
        Some(v) => Some(settings(v)?),
        None => None,
    };
    Ok(Snapshot {
        segments,
        device_traces,
        allocator_settings,
    })
}

/// The [`ADDED_KEY`] mark of a trace entry, if the writer put one there.
fn added_by_writer(v: &Value) -> Option<&str> {
    let Value::Dict(m) = v else { return None };
    match get(m, ADDED_KEY) {
        Some(Value::String(s)) => Some(s),
        _ => None,
    }
}

fn invalid(at: &str, message: impl Into<String>) -> PickleError {
    PickleError::Invalid {
        at: at.to_string(),
        message: message.into(),
    }
}

fn get<'a>(map: &'a Dict, key: &str) -> Option<&'a Value> {
    map.get(&HashableValue::String(key.to_owned()))
}

fn dict<'a>(v: &'a Value, at: &str) -> Result<&'a Dict, PickleError> {
    match v {
        Value::Dict(d) => Ok(d),
        other => Err(invalid(
            at,
            format!("expected a dict, found {}", kind(other)),
        )),
    }
}

fn list<'a>(v: &'a Value, at: &str) -> Result<&'a [Value], PickleError> {
    match v {
        Value::List(l) | Value::Tuple(l) => Ok(l),
        other => Err(invalid(
            at,
            format!("expected a list, found {}", kind(other)),
        )),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::None => "None",
        Value::Bool(_) => "a bool",
        Value::I64(_) | Value::Int(_) => "an integer",
        Value::F64(_) => "a float",
        Value::Bytes(_) => "bytes",
        Value::String(_) => "a string",
        Value::List(_) => "a list",
        Value::Tuple(_) => "a tuple",
        Value::Set(_) | Value::FrozenSet(_) => "a set",
        Value::Dict(_) => "a dict",
    }
}

fn int_value(v: &Value, at: &str) -> Result<i64, PickleError> {
    match v {
        Value::I64(x) => Ok(*x),
        Value::Bool(b) => Ok(i64::from(*b)),
        Value::Int(big) => big
            .to_string()
            .parse()
            .map_err(|_| invalid(at, "integer does not fit in 64 bits")),
        other => Err(invalid(
            at,
            format!("expected an integer, found {}", kind(other)),
        )),
    }
}

fn uint_value(v: &Value, at: &str) -> Result<u64, PickleError> {
    match v {
        Value::Int(big) => big
            .to_string()
            .parse()
            .map_err(|_| invalid(at, "expected an integer from 0 to 2^64-1")),
        _ => u64::try_from(int_value(v, at)?).map_err(|_| invalid(at, "negative integer")),
    }
}

/// A required unsigned integer field.
fn uint(map: &Dict, key: &str, at: &str) -> Result<u64, PickleError> {
    let at = format!("{at}.{key}");
    let v = get(map, key).ok_or_else(|| invalid(&at, "missing"))?;
    uint_value(v, &at)
}

/// An optional unsigned integer field (None when absent or None).
fn opt_uint(map: &Dict, key: &str, at: &str) -> Result<Option<u64>, PickleError> {
    match get(map, key) {
        None | Some(Value::None) => Ok(None),
        Some(v) => uint_value(v, &format!("{at}.{key}")).map(Some),
    }
}

fn string<'a>(map: &'a Dict, key: &str, at: &str) -> Result<&'a str, PickleError> {
    let at = format!("{at}.{key}");
    match get(map, key) {
        Some(Value::String(s)) => Ok(s),
        Some(other) => Err(invalid(
            &at,
            format!("expected a string, found {}", kind(other)),
        )),
        None => Err(invalid(&at, "missing")),
    }
}

fn opt_string(map: &Dict, key: &str, at: &str) -> Result<Option<String>, PickleError> {
    match get(map, key) {
        None | Some(Value::None) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(invalid(
            &format!("{at}.{key}"),
            format!("expected a string, found {}", kind(other)),
        )),
    }
}

fn flag(map: &Dict, key: &str) -> bool {
    matches!(get(map, key), Some(Value::Bool(true)))
}

/// A frames list; None (a shared value serde-pickle could not rebuild) and malformed frames
/// are left out.
fn frames(map: &Dict) -> Vec<Frame> {
    let Some(Value::List(items)) = get(map, "frames") else {
        return Vec::new();
    };
    items
        .iter()
        .filter_map(|f| {
            let Value::Dict(f) = f else { return None };
            let text = |k: &str| match get(f, k) {
                Some(Value::String(s)) => Some(s.clone()),
                _ => None,
            };
            Some(Frame {
                filename: text("filename")?,
                line: get(f, "line")
                    .and_then(|l| int_value(l, "").ok())
                    .unwrap_or(0),
                name: text("name")?,
            })
        })
        .collect()
}

fn segment(v: &Value, at: &str) -> Result<SegmentInfo, PickleError> {
    let m = dict(v, at)?;
    let address = uint(m, "address", at)?;
    let segment_type = match string(m, "segment_type", at)? {
        "small" => PoolKind::Small,
        "large" => PoolKind::Large,
        other => {
            return Err(invalid(
                &format!("{at}.segment_type"),
                format!("expected \"small\" or \"large\", found {other:?}"),
            ));
        }
    };
    let segment_pool_id = match get(m, "segment_pool_id") {
        Some(Value::Tuple(p) | Value::List(p)) if p.len() == 2 => (
            uint_value(&p[0], &format!("{at}.segment_pool_id"))?,
            uint_value(&p[1], &format!("{at}.segment_pool_id"))?,
        ),
        _ => (0, 0),
    };
    let mut next = address;
    let blocks = match get(m, "blocks") {
        Some(b) => list(b, &format!("{at}.blocks"))?
            .iter()
            .enumerate()
            .map(|(k, b)| {
                let rec = block(b, &format!("{at}.blocks[{k}]"), next)?;
                next = rec.address.saturating_add(rec.size);
                Ok(rec)
            })
            .collect::<Result<_, PickleError>>()?,
        None => Vec::new(),
    };
    Ok(SegmentInfo {
        device: opt_uint(m, "device", at)?.unwrap_or(0),
        address,
        total_size: uint(m, "total_size", at)?,
        allocated_size: opt_uint(m, "allocated_size", at)?.unwrap_or(0),
        active_size: opt_uint(m, "active_size", at)?.unwrap_or(0),
        requested_size: opt_uint(m, "requested_size", at)?.unwrap_or(0),
        stream: StreamId(opt_uint(m, "stream", at)?.unwrap_or(0)),
        segment_type,
        segment_pool_id,
        is_expandable: flag(m, "is_expandable"),
        frames: frames(m),
        blocks,
    })
}

/// A block; `address` defaults to the end of the previous block (old snapshots omit it).
fn block(v: &Value, at: &str, address: u64) -> Result<BlockInfo, PickleError> {
    let m = dict(v, at)?;
    let size = uint(m, "size", at)?;
    let state = match string(m, "state", at)? {
        "active_allocated" => BlockState::ActiveAllocated,
        "active_pending_free" => BlockState::ActivePendingFree,
        "inactive" => BlockState::Inactive,
        other => {
            return Err(invalid(
                &format!("{at}.state"),
                format!("unknown block state {other:?}"),
            ));
        }
    };
    Ok(BlockInfo {
        address: opt_uint(m, "address", at)?.unwrap_or(address),
        size,
        requested_size: opt_uint(m, "requested_size", at)?.unwrap_or(size),
        state,
        frames: frames(m),
        category: opt_string(m, "category", at)?.map(Label::from),
    })
}

fn event(v: &Value, at: &str) -> Result<TraceEntry, PickleError> {
    let m = dict(v, at)?;
    let action = TraceAction::parse(string(m, "action", at)?);
    let block_or_segment = matches!(
        action,
        TraceAction::Alloc | TraceAction::FreeRequested | TraceAction::FreeCompleted
    ) || action.is_segment_event();
    let (addr, size) = if block_or_segment {
        (uint(m, "addr", at)?, uint(m, "size", at)?)
    } else {
        let addr_key = if action == TraceAction::Oom {
            "device_free"
        } else {
            "addr"
        };
        (
            opt_uint(m, addr_key, at)?.unwrap_or(0),
            opt_uint(m, "size", at)?.unwrap_or(0),
        )
    };
    Ok(TraceEntry {
        action,
        addr,
        size,
        stream: StreamId(opt_uint(m, "stream", at)?.unwrap_or(0)),
        time_us: opt_uint(m, "time_us", at)?,
        frames: frames(m),
        category: opt_string(m, "category", at)?.map(Label::from),
    })
}

fn settings(v: &Value) -> Result<AllocatorSettings, PickleError> {
    let at = "allocator_settings";
    let m = dict(v, at)?;
    let garbage_collection_threshold = match get(m, "garbage_collection_threshold") {
        Some(Value::F64(x)) => *x,
        Some(other @ (Value::I64(_) | Value::Int(_))) => {
            int_value(other, &format!("{at}.garbage_collection_threshold"))? as f64
        }
        _ => 0.0,
    };
    let mut roundup_power2_divisions = BTreeMap::new();
    if let Some(Value::Dict(d)) = get(m, "roundup_power2_divisions") {
        for (k, v) in d {
            let key = match k {
                HashableValue::String(s) => s.clone(),
                HashableValue::I64(x) => x.to_string(),
                _ => continue,
            };
            let at = format!("{at}.roundup_power2_divisions[{key}]");
            roundup_power2_divisions.insert(key, uint_value(v, &at)?);
        }
    }
    Ok(AllocatorSettings {
        conf: opt_string(m, "PYTORCH_CUDA_ALLOC_CONF", at)?.unwrap_or_default(),
        max_split_size: match get(m, "max_split_size") {
            Some(v) => int_value(v, &format!("{at}.max_split_size"))?,
            None => -1,
        },
        garbage_collection_threshold,
        expandable_segments: flag(m, "expandable_segments"),
        roundup_power2_divisions,
    })
}
