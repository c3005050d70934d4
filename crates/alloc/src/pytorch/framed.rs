//! A memory snapshot read with every stack it recorded: the trace events and blocks of
//! [`Snapshot`] plus, for each of them, the stack of its allocation as an id into a
//! table of distinct stacks over a table of distinct frames. PyTorch shares each frame
//! between all the entries that have it; the tables keep that sharing, so a snapshot of a
//! million events with fifty frames each costs its distinct frames, not fifty million.
//!
//! The pickle is read in one pass by the safe pickle reader (the machine behind
//! [`read_tree`]): nothing in it is executed, code-running opcodes are refused, nesting is
//! capped and cycles are refused. Each `frames` list becomes a stack id as it is read, and
//! the trace entries are read straight from the reader's flat arena into [`TraceEntry`]s; no
//! tree is kept. [`FramedSnapshot::annotated`] writes the same file back (given its bytes)
//! with a category set on every trace event and block and everything else as recorded
//! (frames, `external_annotations`, `compile_context`, ...).

use std::collections::BTreeMap;
use std::rc::Rc;

use serde_pickle::{HashableValue, Value};

use super::pickle::arena::{Arena, Kind, Val, read_arena};
use super::pickle::tree::{PyValue, TreeError, read_tree};
use super::pickle::tree_write::write_tree;
use super::pickle::{ADDED_KEY, PickleError, from_value};
use crate::{Frame, Label, Snapshot, StreamId, TraceAction, TraceEntry, UNKNOWN_CATEGORY};

/// Reading a snapshot with its stacks failed.
#[derive(Debug, thiserror::Error)]
pub enum FramedError {
    /// The bytes are not a readable pickle, or it would run code.
    #[error(transparent)]
    Pickle(#[from] TreeError),
    /// The pickle is not a snapshot, or a field is malformed.
    #[error(transparent)]
    Snapshot(#[from] PickleError),
    /// The bytes given to [`FramedSnapshot::annotated`] are not those the snapshot was read
    /// from.
    #[error(
        "the pickle to annotate is not the snapshot that was explained: its traces hold \
         {found:?} entries per device, the snapshot read {read:?}"
    )]
    NotTheSnapshotRead {
        /// Trace entries per device in the bytes given.
        found: Vec<usize>,
        /// Trace entries per device in the snapshot read.
        read: Vec<usize>,
    },
}

/// The id of the empty stack (an entry recorded without frames).
pub const NO_STACK: u32 = 0;

/// A snapshot with the stacks of its trace events and blocks.
pub struct FramedSnapshot {
    /// The snapshot (trace events and blocks without frames: see the stack tables).
    pub snapshot: Snapshot,
    /// The distinct frames.
    pub frames: Vec<Frame>,
    /// The distinct stacks, as frame ids, innermost frame first; stack [`NO_STACK`] is empty.
    pub stacks: Vec<Vec<u32>>,
    /// Per device, per trace event: the event's stack id.
    pub event_stacks: Vec<Vec<u32>>,
    /// Per segment, per block: the block's stack id.
    pub block_stacks: Vec<Vec<u32>>,
    /// Frames in a form not read (not a dict with a string `filename` and `name`, counted
    /// once per dict; anything else, once per list it is in): left out.
    pub unreadable_frames: u64,
}

const MAX_DEPTH: usize = 64;

/// An arena value as a serde-pickle value (for the existing field readers), without
/// `frames` keys (the stacks are read separately).
fn to_serde(a: &Arena<'_>, v: Val, depth: usize) -> Value {
    if depth > MAX_DEPTH {
        return Value::None;
    }
    match v {
        Val::None | Val::Bytes(_) => Value::None,
        Val::Bool(b) => Value::Bool(b),
        Val::Int(i) => Value::I64(i),
        Val::Big(_) => a
            .as_int(v)
            .and_then(|i| i64::try_from(i).ok())
            .map_or(Value::None, Value::I64),
        Val::Float(f) => Value::F64(f),
        Val::Str(_) => Value::String(a.as_str(v).unwrap_or_default().to_string()),
        Val::Node(_) => {
            let Some(node) = a.node(v) else {
                return Value::None;
            };
            let items = node.items.iter().map(|&x| to_serde(a, x, depth + 1));
            match node.kind {
                Kind::List => Value::List(items.collect()),
                Kind::Tuple => Value::Tuple(items.collect()),
                Kind::Dict => {
                    let mut m = BTreeMap::new();
                    for p in node.items.chunks_exact(2) {
                        let key = match p[0] {
                            k @ Val::Str(_) => match a.as_str(k) {
                                Some("frames") => continue,
                                Some(s) => HashableValue::String(s.to_string()),
                                None => continue,
                            },
                            k @ (Val::Int(_) | Val::Big(_)) => {
                                match a.as_int(k).and_then(|i| i64::try_from(i).ok()) {
                                    Some(i) => HashableValue::I64(i),
                                    None => continue,
                                }
                            }
                            Val::Bool(b) => HashableValue::Bool(b),
                            _ => continue,
                        };
                        m.insert(key, to_serde(a, p[1], depth + 1));
                    }
                    Value::Dict(m)
                }
            }
        }
    }
}

fn invalid(at: &str, message: impl Into<String>) -> PickleError {
    PickleError::Invalid {
        at: at.to_string(),
        message: message.into(),
    }
}

/// The keys of a trace entry that are read.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Key {
    Other,
    TraceAction,
    Addr,
    DeviceFree,
    Size,
    Stream,
    TimeUs,
    Category,
    Frames,
}

impl Key {
    fn of(s: &str) -> Key {
        match s {
            "action" => Key::TraceAction,
            "addr" => Key::Addr,
            "device_free" => Key::DeviceFree,
            "size" => Key::Size,
            "stream" => Key::Stream,
            "time_us" => Key::TimeUs,
            "category" => Key::Category,
            "frames" => Key::Frames,
            _ => Key::Other,
        }
    }
}

/// Reads trace entries out of an arena.
struct Entries<'x, 'a> {
    arena: &'x Arena<'a>,
    /// The key each of the arena's strings is.
    keys: Vec<Key>,
}

/// The fields of one entry, each the last value under its key.
#[derive(Default)]
struct Fields {
    action: Option<Val>,
    addr: Option<Val>,
    device_free: Option<Val>,
    size: Option<Val>,
    stream: Option<Val>,
    time_us: Option<Val>,
    category: Option<Val>,
    frames: Option<Val>,
}

impl Entries<'_, '_> {
    fn fields(&self, pairs: &[Val]) -> Fields {
        let mut f = Fields::default();
        for p in pairs.chunks_exact(2) {
            let Val::Str(k) = p[0] else { continue };
            let slot = match self.keys.get(k as usize).copied().unwrap_or(Key::Other) {
                Key::Other => continue,
                Key::TraceAction => &mut f.action,
                Key::Addr => &mut f.addr,
                Key::DeviceFree => &mut f.device_free,
                Key::Size => &mut f.size,
                Key::Stream => &mut f.stream,
                Key::TimeUs => &mut f.time_us,
                Key::Category => &mut f.category,
                Key::Frames => &mut f.frames,
            };
            *slot = Some(p[1]);
        }
        f
    }

    fn uint(
        &self,
        v: Option<Val>,
        key: &str,
        at: &str,
        required: bool,
    ) -> Result<u64, PickleError> {
        match v {
            None | Some(Val::None) if !required => Ok(0),
            None => Err(invalid(&format!("{at}.{key}"), "missing")),
            Some(v) => self
                .arena
                .as_int(v)
                .and_then(|i| u64::try_from(i).ok())
                .ok_or_else(|| {
                    invalid(
                        &format!("{at}.{key}"),
                        format!(
                            "expected an integer from 0 to 2^64-1, found {}",
                            self.arena.kind(v)
                        ),
                    )
                }),
        }
    }

    /// The entry `e` as an event with its stack id; `at` names it in messages.
    fn event(&self, e: Val, at: &str) -> Result<(TraceEntry, u32), PickleError> {
        let Some(pairs) = self.arena.pairs(e) else {
            return Err(invalid(
                at,
                format!("expected a dict, found {}", self.arena.kind(e)),
            ));
        };
        let f = self.fields(pairs);
        let action = match f.action {
            Some(v @ Val::Str(_)) => TraceAction::parse(self.arena.as_str(v).unwrap_or_default()),
            Some(other) => {
                return Err(invalid(
                    &format!("{at}.action"),
                    format!("expected a string, found {}", self.arena.kind(other)),
                ));
            }
            None => return Err(invalid(&format!("{at}.action"), "missing")),
        };
        let required = matches!(
            action,
            TraceAction::Alloc | TraceAction::FreeRequested | TraceAction::FreeCompleted
        ) || action.is_segment_event();
        let (addr, addr_key) = if action == TraceAction::Oom {
            (f.device_free, "device_free")
        } else {
            (f.addr, "addr")
        };
        let time_us = match f.time_us {
            None | Some(Val::None) => None,
            t => Some(self.uint(t, "time_us", at, false)?),
        };
        let ev = TraceEntry {
            addr: self.uint(addr, addr_key, at, required)?,
            size: self.uint(f.size, "size", at, required)?,
            stream: StreamId(self.uint(f.stream, "stream", at, false)?),
            time_us,
            frames: Vec::new(),
            category: f
                .category
                .and_then(|c| self.arena.as_str(c))
                .map(|c| Label::from(c.to_string())),
            action,
        };
        Ok((ev, f.frames.map_or(NO_STACK, |v| self.arena.stack_of(v))))
    }
}

/// The items of a list or tuple (none for `None`).
fn items_of<'x>(a: &'x Arena<'_>, v: Option<Val>, at: &str) -> Result<&'x [Val], PickleError> {
    match v {
        None => Ok(&[]),
        Some(v) => a
            .items(v)
            .ok_or_else(|| invalid(at, format!("expected a list, found {}", a.kind(v)))),
    }
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
    /// The same snapshot with every stack left out, as a snapshot recorded without frames
    /// reads.
    pub fn without_stacks(&self) -> FramedSnapshot {
        let bare = |per: &Vec<Vec<u32>>| -> Vec<Vec<u32>> {
            per.iter().map(|s| vec![NO_STACK; s.len()]).collect()
        };
        FramedSnapshot {
            snapshot: self.snapshot.clone(),
            frames: Vec::new(),
            stacks: vec![Vec::new()],
            event_stacks: bare(&self.event_stacks),
            block_stacks: bare(&self.block_stacks),
            unreadable_frames: 0,
        }
    }

    /// Reads a snapshot pickle with its stacks.
    pub fn read(bytes: &[u8]) -> Result<Self, FramedError> {
        let (mut arena, root) = read_arena(bytes, true)?;
        let interned = arena.stacks.take();
        if arena.pairs(root).is_none() {
            return Err(PickleError::NotASnapshot.into());
        }
        let Some(traces) = arena.get(root, "device_traces") else {
            return Err(PickleError::NoDeviceTraces.into());
        };
        let entries = Entries {
            keys: arena.strs.iter().map(|s| Key::of(s)).collect(),
            arena: &arena,
        };
        let mut device_traces = Vec::new();
        let mut event_stacks = Vec::new();
        for (d, &trace) in items_of(&arena, Some(traces), "device_traces")?
            .iter()
            .enumerate()
        {
            let at = format!("device_traces[{d}]");
            let list = items_of(&arena, Some(trace), &at)?;
            let mut events = Vec::with_capacity(list.len());
            let mut stacks = Vec::with_capacity(list.len());
            for (k, &e) in list.iter().enumerate() {
                // the entry's place is spelled out only for a message
                let (ev, stack) = match entries.event(e, "") {
                    Ok(x) => x,
                    Err(_) => entries.event(e, &format!("{at}[{k}]"))?,
                };
                events.push(ev);
                stacks.push(stack);
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
            if let Some(v) = arena.get(root, key) {
                top.insert(HashableValue::String(key.into()), to_serde(&arena, v, 0));
            }
        }
        let mut snapshot = from_value(&Value::Dict(top))?;
        snapshot.device_traces = device_traces;
        let mut block_stacks = Vec::new();
        for &seg in items_of(&arena, arena.get(root, "segments"), "segments")? {
            let blocks = items_of(&arena, arena.get(seg, "blocks"), "segments[].blocks")?;
            block_stacks.push(
                blocks
                    .iter()
                    .map(|&b| {
                        arena
                            .get(b, "frames")
                            .map_or(NO_STACK, |f| arena.stack_of(f))
                    })
                    .collect(),
            );
        }
        let (frames, stacks, unreadable_frames) = match interned {
            Some(s) => (s.frames, s.stacks, s.unreadable),
            None => (Vec::new(), vec![Vec::new()], 0),
        };
        Ok(FramedSnapshot {
            snapshot,
            frames,
            stacks,
            event_stacks,
            block_stacks,
            unreadable_frames,
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

    /// The snapshot as read from `bytes` (the pickle this snapshot was read from; others are
    /// refused when their traces differ in length), with `category` set on trace events and
    /// blocks: `event(device, index)` and `block(segment, index)` name each one's category
    /// (None: `"unknown"`). At least one event is `"unknown"` (the `snapshot`-time entry
    /// PyTorch's viewer needs is added when every event has a category), so
    /// pytorch.org/memory_viz draws it. The pickle is read again, as a tree that keeps every
    /// key: explaining alone never pays for it.
    pub fn annotated(
        &self,
        bytes: &[u8],
        mut event: impl FnMut(usize, usize) -> Option<String>,
        mut block: impl FnMut(usize, usize) -> Option<String>,
    ) -> Result<Vec<u8>, FramedError> {
        let tree = read_tree(bytes)?;
        let mut any_unknown = false;
        let mut categorise = |v: &PyValue, c: Option<String>| {
            let c = c.unwrap_or_else(|| {
                any_unknown = true;
                UNKNOWN_CATEGORY.to_string()
            });
            v.set("category", PyValue::str(&c));
        };
        let traces = list_of(tree.get("device_traces"), "device_traces")?;
        let mut lists = Vec::with_capacity(traces.len());
        for trace in &traces {
            lists.push(list_of(Some(trace.clone()), "device_traces[]")?);
        }
        let found: Vec<usize> = lists.iter().map(Vec::len).collect();
        let read: Vec<usize> = self.snapshot.device_traces.iter().map(Vec::len).collect();
        if found != read {
            return Err(FramedError::NotTheSnapshotRead { found, read });
        }
        for (d, entries) in lists.iter().enumerate() {
            for (k, e) in entries.iter().enumerate() {
                categorise(e, event(d, k));
                // The category is the caller's now, not one trainmem's writer added.
                e.remove(ADDED_KEY);
            }
        }
        for (s, seg) in list_of(tree.get("segments"), "segments")?
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
        Ok(write_tree(&tree)?)
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;

    fn list(v: Vec<PyValue>) -> PyValue {
        PyValue::List(Rc::new(RefCell::new(v)))
    }

    fn dict(v: Vec<(&str, PyValue)>) -> PyValue {
        let d = PyValue::Dict(Rc::default());
        for (k, x) in v {
            d.set(k, x);
        }
        d
    }

    fn frame(line: i64) -> PyValue {
        dict(vec![
            ("filename", PyValue::str("model.py")),
            ("line", PyValue::Int(i128::from(line))),
            ("name", PyValue::str("forward")),
        ])
    }

    fn entry(addr: i128, frames: PyValue) -> PyValue {
        dict(vec![
            ("action", PyValue::str("alloc")),
            ("addr", PyValue::Int(addr)),
            ("size", PyValue::Int(512)),
            ("frames", frames),
        ])
    }

    fn lines(f: &FramedSnapshot, stack: u32) -> Vec<i64> {
        f.stack(stack).map(|fr| fr.line).collect()
    }

    #[test]
    fn stacks_written_in_several_batches_and_shared_lists_come_back_whole() {
        // three frames, first met in a short stack; then a stack of 2,500 of them, which the
        // writer appends in batches of 1,000 (the first interned as it is read, the others
        // added to it), shared by a second entry; and a stack of one frame (APPEND)
        let fs: Vec<PyValue> = (0..3).map(frame).collect();
        let long: Vec<PyValue> = (0..2_500).map(|i| fs[i % 3].clone()).collect();
        let shared = list(long);
        let top = dict(vec![(
            "device_traces",
            list(vec![list(vec![
                entry(0x1000, list(fs.clone())),
                entry(0x2000, shared.clone()),
                entry(0x3000, shared),
                entry(0x4000, list(vec![fs[2].clone()])),
                entry(0x5000, list(vec![])),
            ])]),
        )]);
        let f = FramedSnapshot::read(&write_tree(&top).unwrap()).unwrap();
        let s = &f.event_stacks[0];
        assert_eq!(lines(&f, s[0]), vec![0, 1, 2]);
        let want: Vec<i64> = (0..2_500).map(|i| i % 3).collect();
        assert_eq!(lines(&f, s[1]), want);
        assert_eq!(s[1], s[2]);
        assert_eq!(lines(&f, s[3]), vec![2]);
        assert_eq!(s[4], NO_STACK);
        assert_eq!((f.frames.len(), f.stacks.len()), (3, 4));
        assert_eq!(f.unreadable_frames, 0);
    }

    #[test]
    fn nesting_and_cycles_are_refused_while_stacks_are_interned() {
        // frames nested 1,500 lists deep
        let mut deep = frame(1);
        for _ in 0..1_500 {
            deep = list(vec![deep]);
        }
        let top = dict(vec![(
            "device_traces",
            list(vec![list(vec![entry(0x1000, deep)])]),
        )]);
        let bytes = write_tree(&top).unwrap();
        let e = FramedSnapshot::read(&bytes).err().unwrap().to_string();
        assert!(e.contains("nested more than 1000"), "{e}");
        // a frames list that holds itself: l = []; l.append(l)
        let cycle = [
            0x80, 0x04, b'}', b'(', 0x8c, 6, b'f', b'r', b'a', b'm', b'e', b's', b']', b'q', 0,
            b'h', 0, b'a', b'u', b'.',
        ];
        let e = FramedSnapshot::read(&cycle).err().unwrap().to_string();
        assert!(e.contains("cyclic"), "{e}");
    }

    #[test]
    fn only_the_bytes_read_are_annotated() {
        let one = |n: usize| {
            let entries = (0..n).map(|i| entry(0x1000 * (i as i128 + 1), list(vec![])));
            dict(vec![("device_traces", list(vec![list(entries.collect())]))])
        };
        let (a, b) = (write_tree(&one(2)).unwrap(), write_tree(&one(3)).unwrap());
        let f = FramedSnapshot::read(&a).unwrap();
        let out = f.annotated(&a, |_, _| None, |_, _| None).unwrap();
        let back = FramedSnapshot::read(&out).unwrap();
        assert_eq!(back.snapshot.device_traces[0].len(), 2);
        let e = f.annotated(&b, |_, _| None, |_, _| None).unwrap_err();
        assert!(
            matches!(&e, FramedError::NotTheSnapshotRead { found, read } if found == &[3] && read == &[2]),
            "{e}"
        );
    }

    #[test]
    fn annotating_a_pickle_trainmem_wrote_keeps_the_annotation() {
        // An unlabelled segment event and a labelled allocation: the writer gives the first
        // the viewer's "unknown" and marks it as its own addition.
        let mut a = crate::CachingAllocator::new(crate::SimulatedDevice::new(64 << 20));
        a.enable_trace(None);
        a.malloc_labeled(4096, StreamId::DEFAULT, "activation")
            .unwrap();
        let mut snap = a.snapshot();
        snap.device_traces[0][0].category = None;
        let bytes = crate::pytorch::pickle::to_bytes(&snap).unwrap();
        let f = FramedSnapshot::read(&bytes).unwrap();
        let out = f
            .annotated(&bytes, |_, k| Some(format!("cat{k}")), |_, _| None)
            .unwrap();
        // The annotator's categories are kept on reading, none is taken for the writer's.
        let back = crate::pytorch::pickle::from_bytes(&out).unwrap();
        let cats: Vec<_> = back.device_traces[0]
            .iter()
            .map(|e| e.category.as_ref().map(|c| c.as_str().to_string()))
            .collect();
        assert_eq!(cats, vec![Some("cat0".into()), Some("cat1".into())]);
    }
}
