//! A memory snapshot read with every stack it recorded: the trace events and blocks of
//! [`MemorySnapshot`] plus, for each of them, the stack of its allocation as an id into a
//! table of distinct stacks over a table of distinct frames. PyTorch shares each frame
//! between all the entries that have it; the tables keep that sharing, so a snapshot of a
//! million events with fifty frames each costs its distinct frames, not fifty million.
//!
//! The pickle is read by the safe tree reader ([`read_tree`]): nothing in it is executed, and
//! code-running opcodes are refused. The tree is kept, so the same file can be written back
//! with a category set on every trace event and block ([`FramedSnapshot::annotated`], which
//! consumes it) and
//! everything else as recorded (frames, `external_annotations`, `compile_context`, ...).

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::rc::Rc;

use serde_pickle::{HashableValue, Value};

use super::model::{Action, Frame, MemorySnapshot, TraceEvent, UNKNOWN_CATEGORY};
use super::pickle::tree::{PyValue, TreeError, read_tree};
use super::pickle::tree_write::write_tree;
use super::pickle::{PickleError, from_value};

/// Reading a snapshot with its stacks failed.
#[derive(Debug, thiserror::Error)]
pub enum FramedError {
    /// The bytes are not a readable pickle, or it would run code.
    #[error(transparent)]
    Pickle(#[from] TreeError),
    /// The pickle is not a snapshot, or a field is malformed.
    #[error(transparent)]
    Snapshot(#[from] PickleError),
}

/// The id of the empty stack (an entry recorded without frames).
pub const NO_STACK: u32 = 0;

/// A snapshot with the stacks of its trace events and blocks.
pub struct FramedSnapshot {
    /// The snapshot (trace events and blocks without frames: see the stack tables).
    pub snapshot: MemorySnapshot,
    /// The distinct frames.
    pub frames: Vec<Frame>,
    /// The distinct stacks, as frame ids, innermost frame first; stack [`NO_STACK`] is empty.
    pub stacks: Vec<Vec<u32>>,
    /// Per device, per trace event: the event's stack id.
    pub event_stacks: Vec<Vec<u32>>,
    /// Per segment, per block: the block's stack id.
    pub block_stacks: Vec<Vec<u32>>,
    /// Frames in a form not read (not a dict with a string `filename` and `name`): left out.
    pub unreadable_frames: u64,
    tree: PyValue,
}

/// A hasher for the addresses of shared nodes (a multiply-xorshift mix of the one word).
#[derive(Default)]
struct PtrHasher(u64);

impl Hasher for PtrHasher {
    fn finish(&self) -> u64 {
        let mut x = self.0;
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
        x ^= x >> 33;
        x
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_usize(&mut self, n: usize) {
        self.0 = n as u64;
    }
}

/// Node address → what was found there.
type ByNode<V> = HashMap<usize, V, BuildHasherDefault<PtrHasher>>;

#[derive(Default)]
struct Interner {
    frames: Vec<Frame>,
    frame_ids: HashMap<(String, i64, String), u32>,
    by_node: ByNode<Option<u32>>,
    stacks: Vec<Vec<u32>>,
    stack_ids: HashMap<Vec<u32>, u32>,
    by_list: ByNode<u32>,
    unreadable: u64,
}

impl Interner {
    fn new() -> Self {
        let mut i = Interner::default();
        i.stacks.push(Vec::new());
        i.stack_ids.insert(Vec::new(), NO_STACK);
        i
    }

    fn frame(&mut self, f: &PyValue) -> Option<u32> {
        let PyValue::Dict(d) = f else {
            self.unreadable += 1;
            return None;
        };
        let ptr = Rc::as_ptr(d) as usize;
        if let Some(id) = self.by_node.get(&ptr) {
            return *id;
        }
        let text = |k: &str| f.get(k).and_then(|v| v.as_str().map(str::to_string));
        let id = match (text("filename"), text("name")) {
            (Some(filename), Some(name)) => {
                let line = f
                    .get("line")
                    .and_then(|l| l.as_int())
                    .and_then(|l| i64::try_from(l).ok())
                    .unwrap_or(0);
                let key = (filename, line, name);
                let next = self.frames.len() as u32;
                let id = *self.frame_ids.entry(key.clone()).or_insert(next);
                if id == next {
                    self.frames.push(Frame {
                        filename: key.0,
                        line: key.1,
                        name: key.2,
                    });
                }
                Some(id)
            }
            _ => None,
        };
        if id.is_none() {
            self.unreadable += 1;
        }
        self.by_node.insert(ptr, id);
        id
    }

    fn stack(&mut self, entry: &PyValue) -> u32 {
        let Some(PyValue::List(l)) = entry.get("frames") else {
            return NO_STACK;
        };
        let ptr = Rc::as_ptr(&l) as usize;
        if let Some(&id) = self.by_list.get(&ptr) {
            return id;
        }
        let ids: Vec<u32> = l.borrow().iter().filter_map(|f| self.frame(f)).collect();
        let next = self.stacks.len() as u32;
        let id = *self.stack_ids.entry(ids.clone()).or_insert(next);
        if id == next {
            self.stacks.push(ids);
        }
        self.by_list.insert(ptr, id);
        id
    }
}

const MAX_DEPTH: usize = 64;

/// A tree value as a serde-pickle value (for the existing field readers), without `frames`
/// keys (the stacks are read separately) below the top when `strip_frames`.
fn to_serde(v: &PyValue, depth: usize) -> Value {
    if depth > MAX_DEPTH {
        return Value::None;
    }
    match v {
        PyValue::None | PyValue::Bytes(_) => Value::None,
        PyValue::Bool(b) => Value::Bool(*b),
        PyValue::Int(i) => i64::try_from(*i).map_or(Value::None, Value::I64),
        PyValue::Float(f) => Value::F64(*f),
        PyValue::Str(s) => Value::String(s.to_string()),
        PyValue::List(l) => {
            Value::List(l.borrow().iter().map(|x| to_serde(x, depth + 1)).collect())
        }
        PyValue::Tuple(t) => Value::Tuple(t.iter().map(|x| to_serde(x, depth + 1)).collect()),
        PyValue::Dict(d) => {
            let mut m = BTreeMap::new();
            for (k, x) in d.borrow().iter() {
                let key = match k {
                    PyValue::Str(s) if &**s == "frames" => continue,
                    PyValue::Str(s) => HashableValue::String(s.to_string()),
                    PyValue::Int(i) => match i64::try_from(*i) {
                        Ok(i) => HashableValue::I64(i),
                        Err(_) => continue,
                    },
                    PyValue::Bool(b) => HashableValue::Bool(*b),
                    _ => continue,
                };
                m.insert(key, to_serde(x, depth + 1));
            }
            Value::Dict(m)
        }
    }
}

fn invalid(at: &str, message: impl Into<String>) -> PickleError {
    PickleError::Invalid {
        at: at.to_string(),
        message: message.into(),
    }
}

fn uint(e: &PyValue, key: &str, at: &str, required: bool) -> Result<u64, PickleError> {
    match e.get(key) {
        None | Some(PyValue::None) if !required => Ok(0),
        None => Err(invalid(&format!("{at}.{key}"), "missing")),
        Some(v) => v
            .as_int()
            .and_then(|i| u64::try_from(i).ok())
            .ok_or_else(|| {
                invalid(
                    &format!("{at}.{key}"),
                    format!("expected an integer from 0 to 2^64-1, found {}", v.kind()),
                )
            }),
    }
}

fn event(e: &PyValue, at: &str) -> Result<TraceEvent, PickleError> {
    if !matches!(e, PyValue::Dict(_)) {
        return Err(invalid(at, format!("expected a dict, found {}", e.kind())));
    }
    let action = match e.get("action") {
        Some(PyValue::Str(s)) => Action::parse(&s),
        Some(other) => {
            return Err(invalid(
                &format!("{at}.action"),
                format!("expected a string, found {}", other.kind()),
            ));
        }
        None => return Err(invalid(&format!("{at}.action"), "missing")),
    };
    let required = matches!(
        action,
        Action::Alloc | Action::FreeRequested | Action::FreeCompleted
    ) || action.is_segment_event();
    let addr_key = if action == Action::Oom {
        "device_free"
    } else {
        "addr"
    };
    let time_us = match e.get("time_us") {
        None | Some(PyValue::None) => None,
        Some(_) => Some(uint(e, "time_us", at, false)?),
    };
    Ok(TraceEvent {
        addr: uint(e, addr_key, at, required)?,
        size: uint(e, "size", at, required)?,
        stream: uint(e, "stream", at, false)?,
        time_us,
        frames: Vec::new(),
        category: e
            .get("category")
            .and_then(|c| c.as_str().map(str::to_string)),
        action,
    })
}

fn list_of(v: Option<PyValue>, at: &str) -> Result<Vec<PyValue>, PickleError> {
    match v {
        None => Ok(Vec::new()),
        Some(v) => v
            .items()
            .ok_or_else(|| invalid(at, format!("expected a list, found {}", v.kind()))),
    }
}

impl FramedSnapshot {
    /// Reads a snapshot pickle with its stacks.
    pub fn read(bytes: &[u8]) -> Result<Self, FramedError> {
        let tree = read_tree(bytes)?;
        if !matches!(tree, PyValue::Dict(_)) {
            return Err(PickleError::NotASnapshot.into());
        }
        let Some(traces) = tree.get("device_traces") else {
            return Err(PickleError::NoDeviceTraces.into());
        };
        let mut interner = Interner::new();
        let mut device_traces = Vec::new();
        let mut event_stacks = Vec::new();
        for (d, trace) in list_of(Some(traces), "device_traces")?.iter().enumerate() {
            let at = format!("device_traces[{d}]");
            let entries = list_of(Some(trace.clone()), &at)?;
            let mut events = Vec::with_capacity(entries.len());
            let mut stacks = Vec::with_capacity(entries.len());
            for (k, e) in entries.iter().enumerate() {
                // the entry's place is spelled out only for a message
                let ev = match event(e, "") {
                    Ok(ev) => ev,
                    Err(_) => event(e, &format!("{at}[{k}]"))?,
                };
                events.push(ev);
                stacks.push(interner.stack(e));
            }
            device_traces.push(events);
            event_stacks.push(stacks);
        }
        // segments and settings through the existing readers (frames are read here)
        let mut top = BTreeMap::new();
        top.insert(
            HashableValue::String("device_traces".into()),
            Value::List(Vec::new()),
        );
        for key in ["segments", "allocator_settings"] {
            if let Some(v) = tree.get(key) {
                top.insert(HashableValue::String(key.into()), to_serde(&v, 0));
            }
        }
        let mut snapshot = from_value(&Value::Dict(top))?;
        snapshot.device_traces = device_traces;
        let mut block_stacks = Vec::new();
        for seg in list_of(tree.get("segments"), "segments")? {
            let blocks = list_of(seg.get("blocks"), "segments[].blocks")?;
            block_stacks.push(blocks.iter().map(|b| interner.stack(b)).collect());
        }
        Ok(FramedSnapshot {
            snapshot,
            frames: interner.frames,
            stacks: interner.stacks,
            event_stacks,
            block_stacks,
            unreadable_frames: interner.unreadable,
            tree,
        })
    }

    /// The frames of stack `id`, innermost first (none for an unknown id).
    pub fn stack(&self, id: u32) -> impl Iterator<Item = &Frame> + Clone {
        self.stacks
            .get(id as usize)
            .into_iter()
            .flatten()
            .filter_map(|&f| self.frames.get(f as usize))
    }

    /// The snapshot as read, with `category` set on trace events and blocks: `event(device,
    /// index)` and `block(segment, index)` name each one's category (None: `"unknown"`).
    /// At least one event is `"unknown"` (the `snapshot`-time entry PyTorch's viewer needs is
    /// added when every event has a category), so pytorch.org/memory_viz draws it.
    pub fn annotated(
        self,
        mut event: impl FnMut(usize, usize) -> Option<String>,
        mut block: impl FnMut(usize, usize) -> Option<String>,
    ) -> Result<Vec<u8>, FramedError> {
        let mut any_unknown = false;
        let mut categorise = |v: &PyValue, c: Option<String>| {
            let c = c.unwrap_or_else(|| {
                any_unknown = true;
                UNKNOWN_CATEGORY.to_string()
            });
            v.set("category", PyValue::str(&c));
        };
        let traces = list_of(self.tree.get("device_traces"), "device_traces")?;
        for (d, trace) in traces.iter().enumerate() {
            for (k, e) in list_of(Some(trace.clone()), "device_traces[]")?
                .iter()
                .enumerate()
            {
                categorise(e, event(d, k));
            }
        }
        for (s, seg) in list_of(self.tree.get("segments"), "segments")?
            .iter()
            .enumerate()
        {
            for (k, b) in list_of(seg.get("blocks"), "segments[].blocks")?
                .iter()
                .enumerate()
            {
                categorise(b, block(s, k));
            }
        }
        if !any_unknown
            && let Some(PyValue::List(first)) = traces.iter().find_map(|t| match t {
                PyValue::List(l) if !l.borrow().is_empty() => Some(t.clone()),
                _ => None,
            })
        {
            let marker = PyValue::Dict(Rc::default());
            marker.set("action", PyValue::str("snapshot"));
            marker.set("addr", PyValue::Int(0));
            marker.set("size", PyValue::Int(0));
            marker.set("stream", PyValue::Int(0));
            marker.set("frames", PyValue::List(Rc::default()));
            marker.set("category", PyValue::str(UNKNOWN_CATEGORY));
            first.borrow_mut().push(marker);
        }
        Ok(write_tree(&self.tree)?)
    }
}
