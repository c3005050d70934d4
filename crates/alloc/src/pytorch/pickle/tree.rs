//! A pickle read as a tree of plain values that keeps Python's sharing: a value the pickle
//! refers to twice (PyTorch shares each stack frame between every trace entry that has it)
//! is one shared node here, so a snapshot's frames cost their distinct count, not their
//! total count, and come back whole. The pickle is read into a flat arena
//! (the reader `FramedSnapshot` uses too) and the tree built from it.
//!
//! Only data opcodes are run: dicts, lists, tuples, sets (read as lists), strings, bytes,
//! integers, floats, booleans and None, with the memo. An opcode that would import or call
//! Python code (`GLOBAL`, `STACK_GLOBAL`, `REDUCE`, `BUILD`, `INST`, `OBJ`, `NEWOBJ`, ...,
//! persistent ids, out-of-band buffers) stops the reading with [`TreeError::Refused`]: nothing
//! in the pickle is ever executed. A truncated pickle or one whose stack does not add up is an
//! error naming the byte offset.

use std::cell::RefCell;
use std::rc::Rc;

use super::arena::{Arena, Kind, Val, read_arena};

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

    /// Removes `key` from a dict; does nothing to other values.
    pub(crate) fn remove(&self, key: &str) {
        if let PyValue::Dict(d) = self {
            d.borrow_mut()
                .retain(|(k, _)| !matches!(k, PyValue::Str(s) if &**s == key));
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

/// Containers nested deeper than this are refused when reading (the code that walks or
/// drops a tree recurses; [`write_tree`](super::write_tree) follows deeper ones).
pub const MAX_NESTING: u32 = 1_000;

/// Builds the tree of an arena's values, keeping what the arena shares shared.
struct Build<'x, 'a> {
    arena: &'x Arena<'a>,
    nodes: Vec<Option<PyValue>>,
    strs: Vec<Option<Rc<str>>>,
}

impl Build<'_, '_> {
    /// The tree of `v` (nesting is capped by the reader, so the recursion is bounded).
    fn value(&mut self, v: Val) -> PyValue {
        match v {
            Val::None => PyValue::None,
            Val::Bool(b) => PyValue::Bool(b),
            Val::Int(i) => PyValue::Int(i128::from(i)),
            Val::Big(_) => self.arena.as_int(v).map_or(PyValue::None, PyValue::Int),
            Val::Float(f) => PyValue::Float(f),
            Val::Str(s) => {
                let s = s as usize;
                if let Some(Some(r)) = self.strs.get(s) {
                    return PyValue::Str(r.clone());
                }
                let r: Rc<str> = Rc::from(self.arena.strs.get(s).copied().unwrap_or(""));
                if let Some(slot) = self.strs.get_mut(s) {
                    *slot = Some(r.clone());
                }
                PyValue::Str(r)
            }
            Val::Bytes(b) => PyValue::Bytes(Rc::from(
                self.arena.bytes.get(b as usize).copied().unwrap_or(&[]),
            )),
            Val::Node(n) => {
                let n = n as usize;
                if let Some(Some(done)) = self.nodes.get(n) {
                    return done.clone();
                }
                let Some(node) = self.arena.nodes.get(n) else {
                    return PyValue::None;
                };
                let items = &node.items;
                let out = match node.kind {
                    Kind::List => PyValue::List(Rc::new(RefCell::new(
                        items.iter().map(|&x| self.value(x)).collect(),
                    ))),
                    Kind::Tuple => PyValue::Tuple(items.iter().map(|&x| self.value(x)).collect()),
                    Kind::Dict => PyValue::Dict(Rc::new(RefCell::new(
                        items
                            .chunks_exact(2)
                            .map(|p| (self.value(p[0]), self.value(p[1])))
                            .collect(),
                    ))),
                };
                if let Some(slot) = self.nodes.get_mut(n) {
                    *slot = Some(out.clone());
                }
                out
            }
        }
    }
}

/// Reads a pickle (any protocol) as a tree of plain values, keeping shared values shared.
pub fn read_tree(data: &[u8]) -> Result<PyValue, TreeError> {
    let (arena, root) = read_arena(data, false)?;
    let mut b = Build {
        nodes: vec![None; arena.nodes.len()],
        strs: vec![None; arena.strs.len()],
        arena: &arena,
    };
    Ok(b.value(root))
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
