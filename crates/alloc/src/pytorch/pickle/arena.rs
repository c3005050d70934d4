//! The one pickle machine behind [`read_tree`](super::read_tree) and the snapshot reader
//! [`FramedSnapshot`](crate::pytorch::framed::FramedSnapshot): a pickle read in one pass into
//! a flat arena of plain values. Values are small copies (a string is its index, a list or
//! dict the index of its node), so a value Python shares is shared here by index, and reading
//! costs no reference counting and no nested drops.
//!
//! Only data opcodes are run: dicts, lists, tuples, sets (read as lists), strings, bytes,
//! integers, floats, booleans and None, with the memo. An opcode that would import or call
//! Python code (`GLOBAL`, `STACK_GLOBAL`, `REDUCE`, `BUILD`, `INST`, `OBJ`, `NEWOBJ`, ...,
//! persistent ids, out-of-band buffers) stops the reading with [`TreeError::Refused`]: nothing
//! in the pickle is ever executed. A truncated pickle or one whose stack does not add up is an
//! error naming the byte offset. Containers nested deeper than [`MAX_NESTING`] are refused,
//! and so is a list or dict filled after it was put in another container (the only way a
//! pickle makes a cycle).
//!
//! With stacks interned ([`read_arena`]'s `intern_stacks`), every list under a `frames` key
//! becomes a stack id the moment its dict takes it (a list is final then: filling it later is
//! refused), and its items are let go: the frames of a million trace entries cost their
//! distinct stacks, not a million lists. A frame dict is interned once per node (PyTorch
//! shares each frame between every entry that has it, through the memo), a stack once per
//! list node (an allocation and its frees share one).

use super::tree::{MAX_NESTING, TreeError};
use crate::Frame;
use crate::fast_hash::FastMap;

/// One value: a scalar, or the index of a string, bytes, a wide integer or a container.
/// (A word of tag and a word of payload: every payload starts at byte 8, so a copy is two
/// whole words; with payloads at bytes 1 and 4 a copy stalls the processor on every GET.)
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(u64)]
pub(crate) enum Val {
    /// `None`.
    None,
    /// `True` / `False`.
    Bool(bool),
    /// An integer that fits 64 bits.
    Int(i64),
    /// A wider integer: its index in [`Arena::bigs`].
    Big(u32),
    /// A float.
    Float(f64),
    /// A string: its index in [`Arena::strs`].
    Str(u32),
    /// Bytes: their index in [`Arena::bytes`].
    Bytes(u32),
    /// A list, tuple or dict: its index in [`Arena::nodes`].
    Node(u32),
}

/// What a container is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A list (or a set).
    List,
    /// A tuple.
    Tuple,
    /// A dict.
    Dict,
}

/// No tag: a list not interned as a stack, a dict not read as a frame.
pub(crate) const NO_TAG: u32 = u32::MAX;
/// The tag of a dict that is not a readable frame.
const UNREADABLE: u32 = u32::MAX - 1;

/// A container.
pub(crate) struct Node {
    /// List, tuple or dict.
    pub kind: Kind,
    /// Put in another container (so never filled again).
    contained: bool,
    /// Containers nested in it, itself included.
    height: u32,
    /// An interned list's stack id; a dict's frame id (or [`UNREADABLE`]); else [`NO_TAG`].
    pub tag: u32,
    /// The items; a dict's keys and values alternate. An interned list keeps none.
    pub items: Vec<Val>,
}

/// The stacks interned while reading: distinct frames, distinct stacks over them.
pub(crate) struct Stacks<'a> {
    /// The distinct frames.
    pub frames: Vec<Frame>,
    frame_ids: FastMap<(&'a str, i64, &'a str), u32>,
    /// The distinct stacks as frame ids; stack 0 is empty.
    pub stacks: Vec<Vec<u32>>,
    stack_ids: FastMap<Box<[u32]>, u32>,
    /// Frames not read: items that are not dicts, dicts without a string `filename` and
    /// `name` (each such dict counted once).
    pub unreadable: u64,
    /// Per frame: the first dict read as it.
    frame_nodes: Vec<u32>,
    /// The stack being interned, as frame ids.
    scratch: Vec<u32>,
}

impl Stacks<'_> {
    fn new() -> Self {
        let mut s = Stacks {
            frames: Vec::new(),
            frame_ids: FastMap::default(),
            stacks: vec![Vec::new()],
            stack_ids: FastMap::default(),
            unreadable: 0,
            frame_nodes: Vec::new(),
            scratch: Vec::new(),
        };
        s.stack_ids.insert(Box::from([]), 0);
        s
    }

    /// The id of the stack in `scratch`, interned.
    fn stack_id(&mut self) -> u32 {
        if let Some(&id) = self.stack_ids.get(self.scratch.as_slice()) {
            return id;
        }
        let id = self.stacks.len() as u32;
        self.stack_ids
            .insert(Box::from(self.scratch.as_slice()), id);
        self.stacks.push(self.scratch.clone());
        id
    }
}

/// A pickle read into an arena.
pub(crate) struct Arena<'a> {
    /// Strings, borrowed from the pickle.
    pub strs: Vec<&'a str>,
    /// Bytes, borrowed from the pickle.
    pub bytes: Vec<&'a [u8]>,
    /// Integers wider than 64 bits.
    pub bigs: Vec<i128>,
    /// Containers.
    pub nodes: Vec<Node>,
    /// The stacks, when they were interned.
    pub stacks: Option<Stacks<'a>>,
}

impl<'a> Arena<'a> {
    /// The container `v` is, if it is one.
    pub fn node(&self, v: Val) -> Option<&Node> {
        match v {
            Val::Node(n) => self.nodes.get(n as usize),
            _ => None,
        }
    }

    /// The items of a list or tuple.
    pub fn items(&self, v: Val) -> Option<&[Val]> {
        self.node(v)
            .filter(|n| n.kind != Kind::Dict)
            .map(|n| n.items.as_slice())
    }

    /// The key-value pairs of a dict, flat (key, value, key, value, ...).
    pub fn pairs(&self, v: Val) -> Option<&[Val]> {
        self.node(v)
            .filter(|n| n.kind == Kind::Dict)
            .map(|n| n.items.as_slice())
    }

    /// The value under the string key `key`, if `v` is a dict that has it (a repeated key:
    /// the last one counts).
    pub fn get(&self, v: Val, key: &str) -> Option<Val> {
        self.pairs(v)?
            .chunks_exact(2)
            .rev()
            .find(|p| self.as_str(p[0]) == Some(key))
            .map(|p| p[1])
    }

    /// The string, if `v` is one.
    pub fn as_str(&self, v: Val) -> Option<&'a str> {
        match v {
            Val::Str(s) => self.strs.get(s as usize).copied(),
            _ => None,
        }
    }

    /// The integer, if `v` is one (booleans count as 0 and 1, as in Python).
    pub fn as_int(&self, v: Val) -> Option<i128> {
        match v {
            Val::Int(i) => Some(i128::from(i)),
            Val::Big(b) => self.bigs.get(b as usize).copied(),
            Val::Bool(b) => Some(i128::from(b)),
            _ => None,
        }
    }

    /// A short name of the value's type, for messages.
    pub fn kind(&self, v: Val) -> &'static str {
        match v {
            Val::None => "None",
            Val::Bool(_) => "a bool",
            Val::Int(_) | Val::Big(_) => "an integer",
            Val::Float(_) => "a float",
            Val::Str(_) => "a string",
            Val::Bytes(_) => "bytes",
            Val::Node(_) => match self.node(v).map(|n| n.kind) {
                Some(Kind::List) => "a list",
                Some(Kind::Tuple) => "a tuple",
                _ => "a dict",
            },
        }
    }

    /// The stack id of a `frames` value: an interned list's, else the empty stack (0).
    pub fn stack_of(&self, v: Val) -> u32 {
        match self.node(v) {
            Some(n) if n.kind == Kind::List && n.tag != NO_TAG => n.tag,
            _ => 0,
        }
    }

    fn height(&self, v: Val) -> u32 {
        self.node(v).map_or(0, |n| n.height)
    }

    fn add_node(&mut self, kind: Kind, height: u32, items: Vec<Val>) -> Result<Val, TreeError> {
        let id = u32::try_from(self.nodes.len())
            .ok()
            .filter(|&i| i < NO_TAG)
            .ok_or(TreeError::Malformed {
                offset: 0,
                message: "more than 4 billion containers".into(),
            })?;
        self.nodes.push(Node {
            kind,
            contained: false,
            height,
            tag: NO_TAG,
            items,
        });
        Ok(Val::Node(id))
    }

    /// Marks the containers among `items` as put in another one.
    fn contain(&mut self, items: &[Val]) {
        for v in items {
            if let Val::Node(n) = *v
                && let Some(node) = self.nodes.get_mut(n as usize)
            {
                node.contained = true;
            }
        }
    }

    /// The frame id of the dict `n` (None: not a readable frame).
    fn frame(&mut self, n: u32) -> Option<u32> {
        let node = self.nodes.get(n as usize)?;
        match node.tag {
            UNREADABLE => return None,
            NO_TAG => {}
            id => return Some(id),
        }
        let (mut file, mut line, mut name) = (None, None, None);
        for p in node.items.chunks_exact(2) {
            match self.as_str(p[0]) {
                Some("filename") => file = Some(p[1]),
                Some("name") => name = Some(p[1]),
                Some("line") => line = Some(p[1]),
                _ => {}
            }
        }
        let text = |v: Option<Val>| v.and_then(|v| self.as_str(v));
        let key = match (text(file), text(name)) {
            (Some(f), Some(nm)) => {
                let line = line
                    .and_then(|l| self.as_int(l))
                    .and_then(|l| i64::try_from(l).ok())
                    .unwrap_or(0);
                Some((f, line, nm))
            }
            _ => None,
        };
        let stacks = self.stacks.as_mut()?;
        let id = match key {
            Some(key) => {
                let next = stacks.frames.len() as u32;
                let id = *stacks.frame_ids.entry(key).or_insert(next);
                if id == next {
                    stacks.frames.push(Frame {
                        filename: key.0.to_string(),
                        line: key.1,
                        name: key.2.to_string(),
                    });
                    stacks.frame_nodes.push(n);
                }
                Some(id)
            }
            None => {
                stacks.unreadable += 1;
                None
            }
        };
        self.nodes[n as usize].tag = id.unwrap_or(UNREADABLE);
        id
    }

    /// Interns the list `n` as a stack and lets its items go.
    fn intern(&mut self, n: u32) {
        let Some(node) = self.nodes.get_mut(n as usize) else {
            return;
        };
        if node.kind != Kind::List || node.tag != NO_TAG || self.stacks.is_none() {
            return;
        }
        let items = std::mem::take(&mut node.items);
        let mut ids = Vec::with_capacity(items.len());
        let mut odd = 0;
        for v in &items {
            match *v {
                Val::Node(d) if self.nodes[d as usize].kind == Kind::Dict => {
                    if let Some(id) = self.frame(d) {
                        ids.push(id);
                    }
                }
                _ => odd += 1,
            }
        }
        let Some(stacks) = self.stacks.as_mut() else {
            return;
        };
        stacks.unreadable += odd;
        stacks.scratch = ids;
        self.nodes[n as usize].tag = stacks.stack_id();
    }

    /// Gives the list `n`, interned as it was filled ([`Machine::append_frames`]), its items
    /// back (its frames, as the first dict read for each) so that more can be put in it.
    fn unintern(&mut self, n: u32) {
        let Some(stacks) = self.stacks.as_ref() else {
            return;
        };
        let Some(node) = self.nodes.get(n as usize) else {
            return;
        };
        if node.kind != Kind::List || node.tag == NO_TAG {
            return;
        }
        let items = stacks
            .stacks
            .get(node.tag as usize)
            .into_iter()
            .flatten()
            .filter_map(|&f| stacks.frame_nodes.get(f as usize))
            .map(|&d| Val::Node(d))
            .collect();
        let node = &mut self.nodes[n as usize];
        node.items = items;
        node.tag = NO_TAG;
    }
}

/// The height of a container holding values `inner` high.
fn nest(inner: u32) -> Result<u32, TreeError> {
    if inner >= MAX_NESTING {
        return Err(TreeError::TooDeep {
            limit: MAX_NESTING as usize,
        });
    }
    Ok(inner + 1)
}

fn refused_name(op: u8) -> Option<&'static str> {
    Some(match op {
        b'c' => "GLOBAL",
        0x93 => "STACK_GLOBAL",
        b'R' => "REDUCE",
        b'b' => "BUILD",
        b'i' => "INST",
        b'o' => "OBJ",
        0x81 => "NEWOBJ",
        0x92 => "NEWOBJ_EX",
        0x82 => "EXT1",
        0x83 => "EXT2",
        0x84 => "EXT4",
        b'P' => "PERSID",
        b'Q' => "BINPERSID",
        0x97 => "NEXT_BUFFER",
        0x98 => "READONLY_BUFFER",
        _ => return None,
    })
}

/// The items Python's pickler puts in one APPENDS or SETITEMS.
const PYTHON_BATCH: usize = 1_000;

/// Memo keys above this are refused (a pickle names its memo keys densely from 0).
const MEMO_LIMIT: u64 = 1 << 28;

struct Machine<'a> {
    data: &'a [u8],
    pos: usize,
    /// Offset of the opcode being run, for messages.
    at: usize,
    /// The values on the stack.
    stack: Vec<Val>,
    /// The stack's MARKs: the height of the stack when each was pushed.
    marks: Vec<usize>,
    memo: Vec<Option<Val>>,
    arena: Arena<'a>,
    /// `frames` lists a SETITEMS is putting in a dict, to intern after.
    pending: Vec<u32>,
}

impl<'a> Machine<'a> {
    fn malformed(&self, message: impl Into<String>) -> TreeError {
        TreeError::Malformed {
            offset: self.at,
            message: message.into(),
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], TreeError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.data.len())
            .ok_or(TreeError::Truncated {
                offset: self.data.len(),
            })?;
        let s = &self.data[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn le(&mut self, n: usize) -> Result<u64, TreeError> {
        let b = self.take(n)?;
        Ok(b.iter()
            .rev()
            .fold(0u64, |acc, &x| (acc << 8) | u64::from(x)))
    }

    fn line(&mut self) -> Result<&'a str, TreeError> {
        let rest = &self.data[self.pos..];
        let n = rest
            .iter()
            .position(|&b| b == b'\n')
            .ok_or(TreeError::Truncated {
                offset: self.data.len(),
            })?;
        let s = std::str::from_utf8(&rest[..n]).map_err(|_| self.malformed("text is not UTF-8"))?;
        self.pos += n + 1;
        Ok(s)
    }

    fn text(&mut self, n: u64) -> Result<Val, TreeError> {
        let n = usize::try_from(n).map_err(|_| self.malformed("string too long"))?;
        let b = self.take(n)?;
        let s = std::str::from_utf8(b).map_err(|_| self.malformed("string is not UTF-8"))?;
        let id = self.arena.strs.len() as u32;
        self.arena.strs.push(s);
        Ok(Val::Str(id))
    }

    fn bytes(&mut self, n: u64) -> Result<Val, TreeError> {
        let n = usize::try_from(n).map_err(|_| self.malformed("bytes too long"))?;
        let b = self.take(n)?;
        let id = self.arena.bytes.len() as u32;
        self.arena.bytes.push(b);
        Ok(Val::Bytes(id))
    }

    fn int(&mut self, v: i128) -> Val {
        match i64::try_from(v) {
            Ok(i) => Val::Int(i),
            Err(_) => {
                let id = self.arena.bigs.len() as u32;
                self.arena.bigs.push(v);
                Val::Big(id)
            }
        }
    }

    /// True when the top of the stack is a MARK.
    fn mark_on_top(&self) -> bool {
        self.marks.last() == Some(&self.stack.len())
    }

    fn pop(&mut self) -> Result<Val, TreeError> {
        if self.mark_on_top() {
            return Err(self.malformed("a MARK where a value was expected"));
        }
        self.stack
            .pop()
            .ok_or_else(|| self.malformed("the stack is empty"))
    }

    fn top(&self) -> Result<Val, TreeError> {
        match self.stack.last() {
            Some(&v) if !self.mark_on_top() => Ok(v),
            _ => Err(self.malformed("no value on the stack")),
        }
    }

    /// The values above the topmost MARK, which is removed, and the greatest of their
    /// heights.
    fn pop_mark(&mut self) -> Result<(Vec<Val>, u32), TreeError> {
        let mark = self
            .marks
            .pop()
            .ok_or_else(|| self.malformed("no MARK on the stack"))?;
        let items = self
            .stack
            .get(mark..)
            .map(<[Val]>::to_vec)
            .unwrap_or_default();
        self.stack.truncate(mark);
        let inner = items
            .iter()
            .map(|&v| self.arena.height(v))
            .max()
            .unwrap_or(0);
        Ok((items, inner))
    }

    /// Pushes a new container of `items`, `inner` high.
    fn push_container(&mut self, kind: Kind, items: Vec<Val>, inner: u32) -> Result<(), TreeError> {
        let h = nest(inner)?;
        self.arena.contain(&items);
        let v = self.arena.add_node(kind, h, items)?;
        self.stack.push(v);
        Ok(())
    }

    fn put(&mut self, key: u64) -> Result<(), TreeError> {
        if key > MEMO_LIMIT {
            return Err(self.malformed(format!("memo key {key} is too large")));
        }
        let v = self.top()?;
        let k = key as usize;
        if self.memo.len() <= k {
            self.memo.resize(k + 1, None);
        }
        self.memo[k] = Some(v);
        Ok(())
    }

    fn get(&mut self, key: u64) -> Result<(), TreeError> {
        let v = usize::try_from(key)
            .ok()
            .and_then(|k| self.memo.get(k).copied().flatten())
            .ok_or_else(|| self.malformed(format!("memo key {key} was never stored")))?;
        self.stack.push(v);
        Ok(())
    }

    /// Puts `items` (`inner` high) in the list or dict on top of the stack, which must not
    /// be in another container yet (else nested heights would go stale, or it could come to
    /// hold itself), and returns its node.
    fn fill_top(
        &mut self,
        kind: Kind,
        items: Vec<Val>,
        inner: u32,
        what: &str,
    ) -> Result<usize, TreeError> {
        let height = nest(inner)?;
        let top = self.top()?;
        let n = match top {
            Val::Node(n) if self.arena.nodes[n as usize].kind == kind => n as usize,
            _ => return Err(self.malformed(format!("{what} {}", self.arena.kind(top)))),
        };
        self.arena.contain(&items);
        if self.arena.nodes[n].tag != NO_TAG {
            self.arena.unintern(n as u32);
        }
        let node = &mut self.arena.nodes[n];
        if node.contained {
            return Err(self.malformed(
                "a list or dict is filled after it was put in another value (a cyclic \
                 pickle, which no memory snapshot is)",
            ));
        }
        node.height = node.height.max(height);
        if node.items.is_empty() {
            node.items = items;
        } else {
            node.items.extend_from_slice(&items);
        }
        Ok(n)
    }

    /// APPENDS of frames into a new list, the way every stack of a snapshot is written:
    /// when each item above the MARK is a dict already read as a frame, the list below it
    /// is empty and the batch is not a full one of Python's, the list is interned as a stack
    /// at once (its items never copied out of the stack); it holds its stack id and no
    /// items (given back if it is filled further). Returns false (nothing done) otherwise,
    /// or when stacks are not interned.
    fn append_frames(&mut self) -> Result<bool, TreeError> {
        let Arena { nodes, stacks, .. } = &mut self.arena;
        let Some(stacks) = stacks.as_mut() else {
            return Ok(false);
        };
        let Some(&mark) = self.marks.last() else {
            return Ok(false);
        };
        let (Some(Val::Node(target)), Some(items)) = (
            mark.checked_sub(1).map(|t| self.stack[t]),
            self.stack.get(mark..),
        ) else {
            return Ok(false);
        };
        // Python's pickler appends in batches of 1,000: after a full one more may follow,
        // and a stack interned now would be one no entry has
        match nodes.get(target as usize) {
            Some(t)
                if t.kind == Kind::List
                    && !t.contained
                    && t.tag == NO_TAG
                    && t.items.is_empty()
                    && (1..PYTHON_BATCH).contains(&items.len()) => {}
            _ => return Ok(false),
        }
        stacks.scratch.clear();
        let mut inner = 0;
        for v in items {
            let Val::Node(d) = *v else {
                return Ok(false);
            };
            match nodes.get(d as usize) {
                Some(f) if f.kind == Kind::Dict && f.tag < UNREADABLE => {
                    inner = inner.max(f.height);
                    stacks.scratch.push(f.tag);
                }
                _ => return Ok(false),
            }
        }
        let height = nest(inner)?;
        for v in items {
            if let Val::Node(d) = *v {
                nodes[d as usize].contained = true;
            }
        }
        let id = stacks.stack_id();
        let t = &mut nodes[target as usize];
        t.tag = id;
        t.height = t.height.max(height);
        self.stack.truncate(mark);
        self.marks.pop();
        Ok(true)
    }

    fn append(&mut self, items: Vec<Val>, inner: u32) -> Result<(), TreeError> {
        self.fill_top(Kind::List, items, inner, "APPEND to")?;
        Ok(())
    }

    fn set_items(&mut self, items: Vec<Val>, inner: u32) -> Result<(), TreeError> {
        if !items.len().is_multiple_of(2) {
            return Err(self.malformed("SETITEMS with an odd number of values"));
        }
        let mut pending = std::mem::take(&mut self.pending);
        pending.clear();
        if self.arena.stacks.is_some() {
            for p in items.chunks_exact(2) {
                if let (Some("frames"), Val::Node(n)) = (self.arena.as_str(p[0]), p[1]) {
                    pending.push(n);
                }
            }
        }
        self.fill_top(Kind::Dict, items, inner, "SETITEM on")?;
        for &n in &pending {
            self.arena.intern(n);
        }
        self.pending = pending;
        Ok(())
    }

    fn long(&mut self, n: u64) -> Result<Val, TreeError> {
        if n > 16 {
            return Err(self.malformed(format!("an integer of {n} bytes is too large")));
        }
        let b = self.take(n as usize)?;
        let mut v: i128 = 0;
        for (k, &x) in b.iter().enumerate() {
            v |= i128::from(x) << (8 * k);
        }
        if let Some(&last) = b.last()
            && last & 0x80 != 0
            && n < 16
        {
            v -= 1i128 << (8 * n);
        }
        Ok(self.int(v))
    }

    /// An integer written as text (protocol 0's `INT` and `LONG`; `00` and `01` are booleans).
    fn text_int(&mut self) -> Result<Val, TreeError> {
        let t = self.line()?.trim_end_matches('L');
        Ok(match t {
            "00" => Val::Bool(false),
            "01" => Val::Bool(true),
            _ => {
                let i = t
                    .parse()
                    .map_err(|_| self.malformed(format!("bad integer {t:?}")))?;
                self.int(i)
            }
        })
    }

    /// A float written as text (protocol 0's `FLOAT`).
    fn text_float(&mut self) -> Result<Val, TreeError> {
        let t = self.line()?;
        let v = t
            .trim()
            .parse()
            .map_err(|_| self.malformed(format!("bad float {t:?}")))?;
        Ok(Val::Float(v))
    }

    /// A tuple of the `n` values on top of the stack (`TUPLE1` to `TUPLE3`).
    fn small_tuple(&mut self, n: usize) -> Result<(), TreeError> {
        if self.stack.len() < n {
            return Err(self.malformed("TUPLE of too few values"));
        }
        let mut items = vec![Val::None; n];
        for slot in items.iter_mut().rev() {
            *slot = self.pop()?;
        }
        let inner = items
            .iter()
            .map(|&v| self.arena.height(v))
            .max()
            .unwrap_or(0);
        self.push_container(Kind::Tuple, items, inner)
    }

    /// A value read straight from the stream (none, booleans, integers, floats, text,
    /// bytes), or `None` when `op` is not such an opcode.
    fn scalar(&mut self, op: u8) -> Result<Option<Val>, TreeError> {
        Ok(match op {
            b'N' => Some(Val::None),
            0x88 => Some(Val::Bool(true)),
            0x89 => Some(Val::Bool(false)),
            b'J' => {
                let v = self.le(4)? as u32 as i32;
                Some(Val::Int(i64::from(v)))
            }
            b'K' => {
                let v = self.le(1)?;
                Some(Val::Int(v as i64))
            }
            b'M' => {
                let v = self.le(2)?;
                Some(Val::Int(v as i64))
            }
            0x8a | 0x8b => {
                let n = self.le(length_width(op))?;
                Some(self.long(n)?)
            }
            b'I' | b'L' => Some(self.text_int()?),
            b'G' => {
                let b = self.take(8)?;
                let mut a = [0u8; 8];
                a.copy_from_slice(b);
                Some(Val::Float(f64::from_be_bytes(a)))
            }
            b'F' => Some(self.text_float()?),
            0x8c | b'U' | b'X' | b'T' | 0x8d => {
                let n = self.le(length_width(op))?;
                Some(self.text(n)?)
            }
            b'C' | b'B' | 0x8e | 0x96 => {
                let n = self.le(length_width(op))?;
                Some(self.bytes(n)?)
            }
            _ => None,
        })
    }

    /// The memo's opcodes (store the top of the stack, push a stored value); `false` when `op`
    /// is not one of them.
    fn memo_op(&mut self, op: u8) -> Result<bool, TreeError> {
        match op {
            b'h' => {
                let k = self.le(1)?;
                self.get(k)?;
            }
            b'j' => {
                let k = self.le(4)?;
                self.get(k)?;
            }
            0x94 => {
                let k = self.memo.len() as u64;
                self.put(k)?;
            }
            b'q' => {
                let k = self.le(1)?;
                self.put(k)?;
            }
            b'r' => {
                let k = self.le(4)?;
                self.put(k)?;
            }
            b'p' => {
                let t = self.line()?;
                let k = t
                    .parse()
                    .map_err(|_| self.malformed(format!("bad memo key {t:?}")))?;
                self.put(k)?;
            }
            b'g' => {
                let t = self.line()?;
                let k = t
                    .parse()
                    .map_err(|_| self.malformed(format!("bad memo key {t:?}")))?;
                self.get(k)?;
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The opcodes that build containers and move values on the stack (marks, pops, empty and
    /// filled lists, tuples and dicts, appends and item settings), and the protocol's framing.
    fn structure(&mut self, op: u8) -> Result<(), TreeError> {
        match op {
            0x80 => {
                self.take(1)?;
            }
            0x95 => {
                self.take(8)?;
            }
            b'(' => self.marks.push(self.stack.len()),
            b'0' => {
                if self.mark_on_top() {
                    self.marks.pop();
                } else if self.stack.pop().is_none() {
                    return Err(self.malformed("POP of an empty stack"));
                }
            }
            b'1' => {
                self.pop_mark()?;
            }
            b'2' => {
                let v = self.top()?;
                self.stack.push(v);
            }
            b'}' => {
                let v = self.arena.add_node(Kind::Dict, 1, Vec::new())?;
                self.stack.push(v);
            }
            b']' | 0x8f => {
                let v = self.arena.add_node(Kind::List, 1, Vec::new())?;
                self.stack.push(v);
            }
            b')' => {
                let v = self.arena.add_node(Kind::Tuple, 1, Vec::new())?;
                self.stack.push(v);
            }
            b'd' => {
                let (items, inner) = self.pop_mark()?;
                let v = self.arena.add_node(Kind::Dict, 1, Vec::new())?;
                self.stack.push(v);
                self.set_items(items, inner)?;
            }
            b'l' | 0x91 => {
                let (items, inner) = self.pop_mark()?;
                self.push_container(Kind::List, items, inner)?;
            }
            b't' => {
                let (items, inner) = self.pop_mark()?;
                self.push_container(Kind::Tuple, items, inner)?;
            }
            0x85..=0x87 => self.small_tuple(usize::from(op - 0x84))?,
            b'a' => {
                let v = self.pop()?;
                let h = self.arena.height(v);
                self.append(vec![v], h)?;
            }
            b'e' | 0x90 => {
                if !self.append_frames()? {
                    let (items, inner) = self.pop_mark()?;
                    self.append(items, inner)?;
                }
            }
            b's' => {
                let v = self.pop()?;
                let k = self.pop()?;
                let h = self.arena.height(k).max(self.arena.height(v));
                self.set_items(vec![k, v], h)?;
            }
            b'u' => {
                let (items, inner) = self.pop_mark()?;
                self.set_items(items, inner)?;
            }
            other => {
                return Err(TreeError::UnknownOpcode {
                    offset: self.at,
                    opcode: other,
                });
            }
        }
        Ok(())
    }

    fn run(&mut self) -> Result<Val, TreeError> {
        loop {
            self.at = self.pos;
            let op = *self.take(1)?.first().unwrap_or(&b'.');
            if let Some(name) = refused_name(op) {
                return Err(TreeError::Refused {
                    offset: self.at,
                    opcode: op,
                    name,
                });
            }
            if op == b'.' {
                return self.pop();
            }
            if let Some(v) = self.scalar(op)? {
                self.stack.push(v);
            } else if !self.memo_op(op)? {
                self.structure(op)?;
            }
        }
    }
}

/// Bytes of the little-endian length before a length-prefixed value: 1 for the short forms
/// (`LONG1`, `SHORT_BINUNICODE`, `SHORT_BINSTRING`, `SHORT_BINBYTES`), 8 for the protocol-4
/// forms (`BINUNICODE8`, `BINBYTES8`, `BYTEARRAY8`), 4 for the rest (`LONG4`, `BINUNICODE`,
/// `BINSTRING`, `BINBYTES`).
fn length_width(op: u8) -> usize {
    match op {
        0x8a | 0x8c | b'U' | b'C' => 1,
        0x8d | 0x8e | 0x96 => 8,
        _ => 4,
    }
}

/// Reads a pickle (any protocol) into an arena and returns it with the pickled value; with
/// `intern_stacks`, every list under a `frames` key is interned as a stack of frames.
pub(crate) fn read_arena(data: &[u8], intern_stacks: bool) -> Result<(Arena<'_>, Val), TreeError> {
    let mut m = Machine {
        data,
        pos: 0,
        at: 0,
        stack: Vec::new(),
        marks: Vec::new(),
        memo: Vec::new(),
        arena: Arena {
            strs: Vec::new(),
            bytes: Vec::new(),
            bigs: Vec::new(),
            nodes: Vec::new(),
            stacks: intern_stacks.then(Stacks::new),
        },
        pending: Vec::new(),
    };
    let root = m.run()?;
    Ok((m.arena, root))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_is_two_words_and_so_is_a_memo_slot() {
        assert_eq!(std::mem::size_of::<Val>(), 16);
        assert_eq!(std::mem::size_of::<Option<Val>>(), 16);
    }

    #[test]
    fn a_list_interned_as_it_was_filled_is_filled_further_and_interned_again() {
        // [{f}, {g}] under "frames" makes f and g frames; then {"frames": l} with
        // l = [] ; l.extend([f, g]) (interned at once) ; l.append(f): three frames
        let mut b = vec![0x80, 0x04, b'}', b'('];
        let s = |b: &mut Vec<u8>, t: &str| {
            b.extend_from_slice(&[0x8c, t.len() as u8]);
            b.extend_from_slice(t.as_bytes());
        };
        let frame = |b: &mut Vec<u8>, name: &str, memo: u8| {
            b.extend_from_slice(b"}(");
            s(b, "filename");
            s(b, "x.py");
            s(b, "name");
            s(b, name);
            b.extend_from_slice(&[b'u', b'q', memo]);
        };
        s(&mut b, "frames");
        b.extend_from_slice(b"](");
        frame(&mut b, "f", 0);
        frame(&mut b, "g", 1);
        b.push(b'e');
        s(&mut b, "more");
        b.extend_from_slice(b"}(");
        s(&mut b, "frames");
        b.extend_from_slice(&[b']', b'(', b'h', 0, b'h', 1, b'e', b'h', 0, b'a']);
        b.extend_from_slice(b"uu.");
        let (arena, root) = read_arena(&b, true).unwrap();
        let stacks = arena.stacks.as_ref().unwrap();
        let stack = |v: Option<Val>| {
            let id = v.map_or(0, |v| arena.stack_of(v));
            stacks.stacks[id as usize].clone()
        };
        assert_eq!(stack(arena.get(root, "frames")), vec![0, 1]);
        let more = arena.get(root, "more").unwrap();
        assert_eq!(stack(arena.get(more, "frames")), vec![0, 1, 0]);
        // without interning, the same pickle keeps every list's items
        let (arena, root) = read_arena(&b, false).unwrap();
        let more = arena.get(root, "more").unwrap();
        let frames = arena.get(more, "frames").unwrap();
        assert_eq!(arena.items(frames).map(<[Val]>::len), Some(3));
    }
}
