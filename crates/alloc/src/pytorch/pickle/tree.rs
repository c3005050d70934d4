//! A pickle read as a tree of plain values that keeps Python's sharing: a value the pickle
//! refers to twice (PyTorch shares each stack frame between every trace entry that has it)
//! is one shared node here, so a snapshot's frames cost their distinct count, not their
//! total count, and come back whole.
//!
//! Only data opcodes are run: dicts, lists, tuples, sets (read as lists), strings, bytes,
//! integers, floats, booleans and None, with the memo. An opcode that would import or call
//! Python code (`GLOBAL`, `STACK_GLOBAL`, `REDUCE`, `BUILD`, `INST`, `OBJ`, `NEWOBJ`, ...,
//! persistent ids, out-of-band buffers) stops the reading with [`TreeError::Refused`]: nothing
//! in the pickle is ever executed. A truncated pickle or one whose stack does not add up is an
//! error naming the byte offset.

use std::cell::RefCell;
use std::rc::Rc;

/// A list or dict shared by reference, as Python shares it.
pub type Shared<T> = Rc<RefCell<T>>;

/// One value of a pickle.
#[derive(Clone, Debug)]
pub enum PyValue {
    /// `None`.
    None,
    /// `True` / `False`.
    Bool(bool),
    /// An integer (pickles of up to 16 bytes).
    Int(i128),
    /// A float.
    Float(f64),
    /// A string.
    Str(Rc<str>),
    /// Bytes.
    Bytes(Rc<[u8]>),
    /// A list (or a set, read as a list).
    List(Shared<Vec<PyValue>>),
    /// A tuple.
    Tuple(Rc<[PyValue]>),
    /// A dict, in insertion order (a repeated key: the last one counts).
    Dict(Shared<Vec<(PyValue, PyValue)>>),
}

/// Reading or writing a pickle tree failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TreeError {
    /// The data ended before the pickle's STOP.
    #[error("the pickle is truncated: it ends at byte {offset} before its STOP opcode")]
    Truncated {
        /// Length of the data.
        offset: usize,
    },
    /// An opcode that imports or calls Python code; such pickles are not read.
    #[error(
        "byte {offset}: opcode {name} (0x{opcode:02x}) would run Python code; a memory \
         snapshot holds plain data only, so this pickle is not read"
    )]
    Refused {
        /// Byte offset of the opcode.
        offset: usize,
        /// The opcode.
        opcode: u8,
        /// Its name.
        name: &'static str,
    },
    /// An opcode the reader does not know.
    #[error("byte {offset}: unknown pickle opcode 0x{opcode:02x}")]
    UnknownOpcode {
        /// Byte offset.
        offset: usize,
        /// The opcode.
        opcode: u8,
    },
    /// The opcodes do not add up (an empty stack, a missing mark, a memo key never stored,
    /// text that is not UTF-8, ...).
    #[error("byte {offset}: malformed pickle: {message}")]
    Malformed {
        /// Byte offset.
        offset: usize,
        /// What is wrong.
        message: String,
    },
    /// Containers nested deeper than the reader or the writer follows.
    #[error("the value is nested more than {limit} containers deep")]
    TooDeep {
        /// The limit.
        limit: usize,
    },
}

impl PyValue {
    /// A string value.
    pub fn str(s: &str) -> PyValue {
        PyValue::Str(Rc::from(s))
    }

    /// The value under the string key `key`, if this is a dict that has it.
    pub fn get(&self, key: &str) -> Option<PyValue> {
        let PyValue::Dict(d) = self else { return None };
        d.borrow()
            .iter()
            .rev()
            .find(|(k, _)| matches!(k, PyValue::Str(s) if &**s == key))
            .map(|(_, v)| v.clone())
    }

    /// Sets `key` to `value` in a dict (replacing the key's value if present); does nothing
    /// to other values.
    pub fn set(&self, key: &str, value: PyValue) {
        let PyValue::Dict(d) = self else { return };
        let mut d = d.borrow_mut();
        match d
            .iter_mut()
            .rev()
            .find(|(k, _)| matches!(k, PyValue::Str(s) if &**s == key))
        {
            Some(slot) => slot.1 = value,
            None => d.push((PyValue::str(key), value)),
        }
    }

    /// The items of a list or tuple (cloned handles; cheap).
    pub fn items(&self) -> Option<Vec<PyValue>> {
        match self {
            PyValue::List(l) => Some(l.borrow().clone()),
            PyValue::Tuple(t) => Some(t.to_vec()),
            _ => None,
        }
    }

    /// The integer, if this is one (booleans count as 0 and 1, as in Python).
    pub fn as_int(&self) -> Option<i128> {
        match self {
            PyValue::Int(i) => Some(*i),
            PyValue::Bool(b) => Some(i128::from(*b)),
            _ => None,
        }
    }

    /// The string, if this is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            PyValue::Str(s) => Some(s),
            _ => None,
        }
    }

    /// A short name of the value's type, for messages.
    pub fn kind(&self) -> &'static str {
        match self {
            PyValue::None => "None",
            PyValue::Bool(_) => "a bool",
            PyValue::Int(_) => "an integer",
            PyValue::Float(_) => "a float",
            PyValue::Str(_) => "a string",
            PyValue::Bytes(_) => "bytes",
            PyValue::List(_) => "a list",
            PyValue::Tuple(_) => "a tuple",
            PyValue::Dict(_) => "a dict",
        }
    }
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

/// Containers nested deeper than this are refused when reading (the code that walks or
/// drops a tree recurses; [`write_tree`](super::write_tree) follows deeper ones).
pub const MAX_NESTING: u32 = 1_000;

/// No memo key.
const NO_KEY: u32 = u32::MAX;

/// One item of the machine's stack: a MARK, or a value with its height (containers nested
/// in it, itself included) and the memo key it was stored under while on the stack.
enum Slot {
    Mark,
    Value(PyValue, u32, u32),
}

struct Machine<'a> {
    data: &'a [u8],
    pos: usize,
    /// Offset of the opcode being run, for messages.
    at: usize,
    stack: Vec<Slot>,
    /// Stored values with their heights.
    memo: Vec<Option<(PyValue, u32)>>,
}

/// The height of a value made of nothing: 1 for a container, 0 for a scalar.
fn own_height(v: &PyValue) -> u32 {
    u32::from(matches!(
        v,
        PyValue::List(_) | PyValue::Dict(_) | PyValue::Tuple(_)
    ))
}

/// The address of a list's or dict's shared node.
fn node(v: &PyValue) -> Option<(usize, usize)> {
    match v {
        PyValue::List(l) => Some((Rc::as_ptr(l) as *const u8 as usize, Rc::strong_count(l))),
        PyValue::Dict(d) => Some((Rc::as_ptr(d) as *const u8 as usize, Rc::strong_count(d))),
        _ => None,
    }
}

/// Memo keys above this are refused (a pickle names its memo keys densely from 0).
const MEMO_LIMIT: u64 = 1 << 28;

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

    fn text(&mut self, n: u64) -> Result<PyValue, TreeError> {
        let n = usize::try_from(n).map_err(|_| self.malformed("string too long"))?;
        let b = self.take(n)?;
        let s = std::str::from_utf8(b).map_err(|_| self.malformed("string is not UTF-8"))?;
        Ok(PyValue::Str(Rc::from(s)))
    }

    fn bytes(&mut self, n: u64) -> Result<PyValue, TreeError> {
        let n = usize::try_from(n).map_err(|_| self.malformed("bytes too long"))?;
        Ok(PyValue::Bytes(Rc::from(self.take(n)?)))
    }

    /// Pushes a scalar or a container made of nothing.
    fn push(&mut self, v: PyValue) {
        let h = own_height(&v);
        self.stack.push(Slot::Value(v, h, NO_KEY));
    }

    /// Pushes a container of `inner` height nested in it, if that is not too deep.
    fn push_container(&mut self, v: PyValue, inner: u32) -> Result<(), TreeError> {
        let h = self.nest(inner)?;
        self.stack.push(Slot::Value(v, h, NO_KEY));
        Ok(())
    }

    /// The height of a container holding values `inner` high.
    fn nest(&self, inner: u32) -> Result<u32, TreeError> {
        if inner >= MAX_NESTING {
            return Err(TreeError::TooDeep {
                limit: MAX_NESTING as usize,
            });
        }
        Ok(inner + 1)
    }

    fn pop_h(&mut self) -> Result<(PyValue, u32), TreeError> {
        match self.stack.pop() {
            Some(Slot::Value(v, h, _)) => Ok((v, h)),
            Some(Slot::Mark) => Err(self.malformed("a MARK where a value was expected")),
            None => Err(self.malformed("the stack is empty")),
        }
    }

    fn pop(&mut self) -> Result<PyValue, TreeError> {
        Ok(self.pop_h()?.0)
    }

    fn top(&self) -> Result<&PyValue, TreeError> {
        match self.stack.last() {
            Some(Slot::Value(v, _, _)) => Ok(v),
            _ => Err(self.malformed("no value on the stack")),
        }
    }

    /// The values above the topmost MARK, which is removed, and the greatest of their
    /// heights.
    fn pop_mark(&mut self) -> Result<(Vec<PyValue>, u32), TreeError> {
        let mark = self
            .stack
            .iter()
            .rposition(|s| matches!(s, Slot::Mark))
            .ok_or_else(|| self.malformed("no MARK on the stack"))?;
        let mut inner = 0;
        let items = self
            .stack
            .drain(mark + 1..)
            .map(|s| match s {
                Slot::Value(v, h, _) => {
                    inner = inner.max(h);
                    v
                }
                Slot::Mark => PyValue::None,
            })
            .collect();
        self.stack.pop();
        Ok((items, inner))
    }

    fn put(&mut self, key: u64) -> Result<(), TreeError> {
        if key > MEMO_LIMIT {
            return Err(self.malformed(format!("memo key {key} is too large")));
        }
        let k = key as usize;
        let (v, h) = match self.stack.last_mut() {
            Some(Slot::Value(v, h, slot_key)) => {
                *slot_key = key as u32;
                (v.clone(), *h)
            }
            _ => return Err(self.malformed("no value on the stack")),
        };
        if self.memo.len() <= k {
            self.memo.resize(k + 1, None);
        }
        self.memo[k] = Some((v, h));
        Ok(())
    }

    fn get(&mut self, key: u64) -> Result<(), TreeError> {
        let (v, h) = usize::try_from(key)
            .ok()
            .and_then(|k| self.memo.get(k).cloned().flatten())
            .ok_or_else(|| self.malformed(format!("memo key {key} was never stored")))?;
        self.stack.push(Slot::Value(v, h, key as u32));
        Ok(())
    }

    /// Before items `inner` high go into the list or dict on top of the stack: checks that
    /// nothing else holds it (only the stack and the memo key it was stored under: no
    /// container, so no height recorded elsewhere goes stale and no container holds
    /// itself) and records its new height, also in the memo.
    fn grow_top(&mut self, inner: u32) -> Result<(), TreeError> {
        let height = self.nest(inner)?;
        let Some(Slot::Value(v, h, key)) = self.stack.last() else {
            return Err(self.malformed("no value on the stack"));
        };
        let (h, key) = (*h, *key);
        let Some((ptr, count)) = node(v) else {
            return Ok(());
        };
        let in_memo = self
            .memo
            .get(key as usize)
            .and_then(Option::as_ref)
            .and_then(|(m, _)| node(m))
            .is_some_and(|(p, _)| p == ptr);
        if count != 1 + usize::from(in_memo) {
            return Err(self.malformed(
                "a list or dict is filled after it was put in another value (a cyclic \
                 pickle, which no memory snapshot is)",
            ));
        }
        let h = h.max(height);
        if let Some(Slot::Value(_, slot_h, _)) = self.stack.last_mut() {
            *slot_h = h;
        }
        if in_memo && let Some(Some((_, mh))) = self.memo.get_mut(key as usize) {
            *mh = h;
        }
        Ok(())
    }

    fn append(&mut self, items: Vec<PyValue>, inner: u32) -> Result<(), TreeError> {
        self.grow_top(inner)?;
        match self.top()? {
            PyValue::List(l) => {
                let mut l = l.borrow_mut();
                if l.is_empty() {
                    *l = items;
                } else {
                    l.extend(items);
                }
                Ok(())
            }
            other => Err(self.malformed(format!("APPEND to {}", other.kind()))),
        }
    }

    fn set_items(&mut self, items: Vec<PyValue>, inner: u32) -> Result<(), TreeError> {
        if !items.len().is_multiple_of(2) {
            return Err(self.malformed("SETITEMS with an odd number of values"));
        }
        self.grow_top(inner)?;
        match self.top()? {
            PyValue::Dict(d) => {
                let mut d = d.borrow_mut();
                d.reserve(items.len() / 2);
                let mut it = items.into_iter();
                while let (Some(k), Some(v)) = (it.next(), it.next()) {
                    d.push((k, v));
                }
                Ok(())
            }
            other => Err(self.malformed(format!("SETITEM on {}", other.kind()))),
        }
    }

    fn long(&mut self, n: u64) -> Result<PyValue, TreeError> {
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
        Ok(PyValue::Int(v))
    }

    fn run(mut self) -> Result<PyValue, TreeError> {
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
            match op {
                0x80 => {
                    self.take(1)?;
                }
                0x95 => {
                    self.take(8)?;
                }
                b'.' => {
                    let v = self.pop()?;
                    return Ok(v);
                }
                b'(' => self.stack.push(Slot::Mark),
                b'0' => {
                    self.stack
                        .pop()
                        .ok_or_else(|| self.malformed("POP of an empty stack"))?;
                }
                b'1' => {
                    self.pop_mark()?;
                }
                b'2' => {
                    let (v, h) = match self.stack.last() {
                        Some(Slot::Value(v, h, _)) => (v.clone(), *h),
                        _ => return Err(self.malformed("no value on the stack")),
                    };
                    self.stack.push(Slot::Value(v, h, NO_KEY));
                }
                b'N' => self.push(PyValue::None),
                0x88 => self.push(PyValue::Bool(true)),
                0x89 => self.push(PyValue::Bool(false)),
                b'J' => {
                    let v = self.le(4)? as u32 as i32;
                    self.push(PyValue::Int(i128::from(v)));
                }
                b'K' => {
                    let v = self.le(1)?;
                    self.push(PyValue::Int(i128::from(v)));
                }
                b'M' => {
                    let v = self.le(2)?;
                    self.push(PyValue::Int(i128::from(v)));
                }
                0x8a => {
                    let n = self.le(1)?;
                    let v = self.long(n)?;
                    self.push(v);
                }
                0x8b => {
                    let n = self.le(4)?;
                    let v = self.long(n)?;
                    self.push(v);
                }
                b'I' | b'L' => {
                    let t = self.line()?.trim_end_matches('L');
                    let v = match t {
                        "00" => PyValue::Bool(false),
                        "01" => PyValue::Bool(true),
                        _ => PyValue::Int(
                            t.parse()
                                .map_err(|_| self.malformed(format!("bad integer {t:?}")))?,
                        ),
                    };
                    self.push(v);
                }
                b'G' => {
                    let b = self.take(8)?;
                    let mut a = [0u8; 8];
                    a.copy_from_slice(b);
                    self.push(PyValue::Float(f64::from_be_bytes(a)));
                }
                b'F' => {
                    let t = self.line()?;
                    let v = t
                        .trim()
                        .parse()
                        .map_err(|_| self.malformed(format!("bad float {t:?}")))?;
                    self.push(PyValue::Float(v));
                }
                0x8c => {
                    let n = self.le(1)?;
                    let v = self.text(n)?;
                    self.push(v);
                }
                b'X' => {
                    let n = self.le(4)?;
                    let v = self.text(n)?;
                    self.push(v);
                }
                0x8d => {
                    let n = self.le(8)?;
                    let v = self.text(n)?;
                    self.push(v);
                }
                b'U' => {
                    let n = self.le(1)?;
                    let v = self.text(n)?;
                    self.push(v);
                }
                b'T' => {
                    let n = self.le(4)?;
                    let v = self.text(n)?;
                    self.push(v);
                }
                b'C' => {
                    let n = self.le(1)?;
                    let v = self.bytes(n)?;
                    self.push(v);
                }
                b'B' => {
                    let n = self.le(4)?;
                    let v = self.bytes(n)?;
                    self.push(v);
                }
                0x8e | 0x96 => {
                    let n = self.le(8)?;
                    let v = self.bytes(n)?;
                    self.push(v);
                }
                b'}' => self.push(PyValue::Dict(Rc::default())),
                b']' | 0x8f => self.push(PyValue::List(Rc::default())),
                b')' => self.push(PyValue::Tuple(Rc::from(Vec::new()))),
                b'd' => {
                    let (items, inner) = self.pop_mark()?;
                    self.push(PyValue::Dict(Rc::default()));
                    self.set_items(items, inner)?;
                }
                b'l' | 0x91 => {
                    let (items, inner) = self.pop_mark()?;
                    self.push_container(PyValue::List(Rc::new(RefCell::new(items))), inner)?;
                }
                b't' => {
                    let (items, inner) = self.pop_mark()?;
                    self.push_container(PyValue::Tuple(Rc::from(items)), inner)?;
                }
                0x85..=0x87 => {
                    let n = usize::from(op - 0x84);
                    if self.stack.len() < n {
                        return Err(self.malformed("TUPLE of too few values"));
                    }
                    let mut items = Vec::with_capacity(n);
                    let mut inner = 0;
                    for _ in 0..n {
                        let (v, h) = self.pop_h()?;
                        inner = inner.max(h);
                        items.push(v);
                    }
                    items.reverse();
                    self.push_container(PyValue::Tuple(Rc::from(items)), inner)?;
                }
                b'a' => {
                    let (v, h) = self.pop_h()?;
                    self.append(vec![v], h)?;
                }
                b'e' | 0x90 => {
                    let (items, inner) = self.pop_mark()?;
                    self.append(items, inner)?;
                }
                b's' => {
                    let (v, hv) = self.pop_h()?;
                    let (k, hk) = self.pop_h()?;
                    self.set_items(vec![k, v], hk.max(hv))?;
                }
                b'u' => {
                    let (items, inner) = self.pop_mark()?;
                    self.set_items(items, inner)?;
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
                b'h' => {
                    let k = self.le(1)?;
                    self.get(k)?;
                }
                b'j' => {
                    let k = self.le(4)?;
                    self.get(k)?;
                }
                b'g' => {
                    let t = self.line()?;
                    let k = t
                        .parse()
                        .map_err(|_| self.malformed(format!("bad memo key {t:?}")))?;
                    self.get(k)?;
                }
                other => {
                    return Err(TreeError::UnknownOpcode {
                        offset: self.at,
                        opcode: other,
                    });
                }
            }
        }
    }
}

/// Reads a pickle (any protocol) as a tree of plain values, keeping shared values shared.
pub fn read_tree(data: &[u8]) -> Result<PyValue, TreeError> {
    Machine {
        data,
        pos: 0,
        at: 0,
        stack: Vec::new(),
        memo: Vec::new(),
    }
    .run()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_values_stay_shared_and_data_round_trips() {
        // {'a': [1, -2, 2**40], 'b': <the same list>, 'c': ('x', None, True, 1.5)}
        let mut b = vec![0x80, 0x04, b'}', 0x94, b'('];
        b.extend_from_slice(&[0x8c, 1, b'a', 0x94, b']', 0x94, b'(', b'K', 1]);
        b.extend_from_slice(&[b'J', 0xfe, 0xff, 0xff, 0xff, 0x8a, 6, 0, 0, 0, 0, 0, 1]);
        b.extend_from_slice(&[b'e', 0x8c, 1, b'b', 0x94, b'h', 2]);
        b.extend_from_slice(&[0x8c, 1, b'c', 0x94, b'(', 0x8c, 1, b'x', b'N', 0x88]);
        b.push(b'G');
        b.extend_from_slice(&1.5f64.to_be_bytes());
        b.extend_from_slice(b"tu.");
        let v = read_tree(&b).unwrap();
        let (Some(PyValue::List(x)), Some(PyValue::List(y))) = (v.get("a"), v.get("b")) else {
            panic!("lists expected")
        };
        assert!(Rc::ptr_eq(&x, &y));
        let ints: Vec<i128> = x.borrow().iter().filter_map(PyValue::as_int).collect();
        assert_eq!(ints, vec![1, -2, 1 << 40]);
        let c = v.get("c").and_then(|c| c.items()).unwrap();
        assert_eq!(c.len(), 4);
        assert_eq!(c[0].as_str(), Some("x"));
        assert!(matches!(c[1], PyValue::None));
        assert_eq!(c[2].as_int(), Some(1));
        assert!(matches!(c[3], PyValue::Float(f) if f == 1.5));
        v.set("d", PyValue::Int(4));
        v.set("a", PyValue::None);
        assert_eq!(v.get("d").and_then(|d| d.as_int()), Some(4));
        assert!(matches!(v.get("a"), Some(PyValue::None)));
    }

    #[test]
    fn code_running_opcodes_are_refused_and_truncation_is_an_error() {
        // cos\nsystem\n(S'echo hi'\ntR.  (protocol 0: a call of os.system)
        let evil = b"cos\nsystem\n(S'echo hi'\ntR.";
        match read_tree(evil) {
            Err(TreeError::Refused { name, offset, .. }) => {
                assert_eq!((name, offset), ("GLOBAL", 0));
            }
            other => panic!("{other:?}"),
        }
        let stack_global = [0x80, 0x04, 0x8c, 1, b'o', 0x8c, 1, b's', 0x93, b'.'];
        assert!(matches!(
            read_tree(&stack_global),
            Err(TreeError::Refused {
                name: "STACK_GLOBAL",
                ..
            })
        ));
        let good = [0x80, 0x04, b']', b'K', 7, b'a', b'.'];
        assert!(read_tree(&good).is_ok());
        for cut in 0..good.len() {
            let e = read_tree(&good[..cut]).unwrap_err();
            assert!(
                matches!(e, TreeError::Truncated { .. } | TreeError::Malformed { .. }),
                "{cut}: {e:?}"
            );
        }
        assert!(matches!(
            read_tree(&[0x80, 0x04, b'h', 9, b'.']),
            Err(TreeError::Malformed { .. })
        ));
        assert!(matches!(
            read_tree(&[0xff]),
            Err(TreeError::UnknownOpcode { opcode: 0xff, .. })
        ));
    }

    #[test]
    fn negative_and_wide_longs() {
        let v = read_tree(&[0x8a, 2, 0x00, 0xff, b'.']).unwrap();
        assert_eq!(v.as_int(), Some(-256));
        let v = read_tree(&[0x8a, 8, 0, 0, 0, 0, 0, 0, 0, 0x80, b'.']).unwrap();
        assert_eq!(v.as_int(), Some(i128::from(i64::MIN)));
        assert!(read_tree(&[0x8a, 17]).is_err());
    }

    /// `depth` lists, each in the one before.
    fn nested(depth: usize) -> Vec<u8> {
        let mut b = vec![0x80, 0x04];
        b.extend(std::iter::repeat_n(b']', depth));
        b.extend(std::iter::repeat_n(b'a', depth - 1));
        b.push(b'.');
        b
    }

    #[test]
    fn nesting_is_capped_and_cycles_are_refused() {
        // as deep as allowed reads; one deeper, or a million deeper, is a clear error (never
        // a stack overflow, in reading or in dropping what was read)
        assert!(read_tree(&nested(MAX_NESTING as usize)).is_ok());
        for depth in [MAX_NESTING as usize + 1, 1_000_000] {
            let e = read_tree(&nested(depth)).unwrap_err();
            assert_eq!(
                e,
                TreeError::TooDeep {
                    limit: MAX_NESTING as usize
                }
            );
            assert!(e.to_string().contains("nested more than 1000"), "{e}");
        }
        // the same through tuples, lists and dicts built at once: level k wraps the value
        // in a TUPLE1, a MARK ... LIST or a MARK None ... DICT
        let (mut open, mut close) = (Vec::new(), Vec::new());
        for k in 0..2_000 {
            match k % 3 {
                0 => close.push(0x85),
                1 => {
                    open.push(vec![b'(']);
                    close.push(b'l');
                }
                _ => {
                    open.push(vec![b'(', b'N']);
                    close.push(b'd');
                }
            }
        }
        let mut b = vec![0x80, 0x04];
        b.extend(open.into_iter().rev().flatten());
        b.extend_from_slice(&[b'K', 1]);
        b.extend(close);
        b.push(b'.');
        assert!(matches!(read_tree(&b), Err(TreeError::TooDeep { .. })));
        // a list deepened after it was nested, through the memo: still counted
        // l0 = [] (memo 0); l1 = [l0]; l0.append([[[]]]) -> refused, l0 is inside l1
        let sneaky = [
            0x80, 0x04, b']', b'q', 0, b']', b'h', 0, b'a', b'h', 0, b']', b']', b'a', b'a', b'.',
        ];
        let e = read_tree(&sneaky).unwrap_err();
        assert!(e.to_string().contains("cyclic"), "{e}");
        // a list that holds itself
        let cycle = [0x80, 0x04, b']', b'q', 0, b'h', 0, b'a', b'.'];
        let e = read_tree(&cycle).unwrap_err();
        assert!(e.to_string().contains("cyclic"), "{e}");
    }
}
