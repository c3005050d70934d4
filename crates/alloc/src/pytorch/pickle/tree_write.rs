//! Writing a [`PyValue`] tree back as a pickle that PyTorch's viewers read: every list, dict
//! and tuple shared in the tree is written once and referred back to through the memo (as
//! Python writes it), so a snapshot's shared frames stay small; only opcodes the web
//! viewer's unpickler accepts are used ([`VIEWER_OPCODES`](super::VIEWER_OPCODES)). Bytes
//! (which the viewer cannot read) are written as None.

use std::collections::HashMap;
use std::rc::Rc;

use super::tree::{PyValue, TreeError};

/// Containers nested deeper than this are refused (the writer recurses).
pub const MAX_DEPTH: usize = 2_000;

struct Writer {
    out: Vec<u8>,
    /// Memo key of each shared node written, by its address.
    memo: HashMap<usize, u32>,
    next: u32,
}

impl Writer {
    fn memoize(&mut self, ptr: usize) {
        let k = self.next;
        self.next += 1;
        self.memo.insert(ptr, k);
        if k < 256 {
            self.out.extend_from_slice(&[b'q', k as u8]);
        } else {
            self.out.push(b'r');
            self.out.extend_from_slice(&k.to_le_bytes());
        }
    }

    /// Writes a reference to `ptr` if it was written before.
    fn recall(&mut self, ptr: usize) -> bool {
        match self.memo.get(&ptr) {
            Some(&k) if k < 256 => self.out.extend_from_slice(&[b'h', k as u8]),
            Some(&k) => {
                self.out.push(b'j');
                self.out.extend_from_slice(&k.to_le_bytes());
            }
            None => return false,
        }
        true
    }

    fn int(&mut self, v: i128) {
        if (0..256).contains(&v) {
            self.out.extend_from_slice(&[b'K', v as u8]);
        } else if (0..65536).contains(&v) {
            self.out.push(b'M');
            self.out.extend_from_slice(&(v as u16).to_le_bytes());
        } else if (i128::from(i32::MIN)..=i128::from(i32::MAX)).contains(&v) {
            self.out.push(b'J');
            self.out.extend_from_slice(&(v as i32).to_le_bytes());
        } else {
            // two's complement, shortest form that keeps the sign
            let bytes = v.to_le_bytes();
            let mut n = 16;
            while n > 1 {
                let top = bytes[n - 1];
                let below_sign = bytes[n - 2] & 0x80;
                if (top == 0 && below_sign == 0) || (top == 0xff && below_sign != 0) {
                    n -= 1;
                } else {
                    break;
                }
            }
            self.out.extend_from_slice(&[0x8a, n as u8]);
            self.out.extend_from_slice(&bytes[..n]);
        }
    }

    fn string(&mut self, s: &Rc<str>) {
        let ptr = Rc::as_ptr(s) as *const u8 as usize;
        if self.recall(ptr) {
            return;
        }
        let b = s.as_bytes();
        if b.len() < 256 {
            self.out.extend_from_slice(&[0x8c, b.len() as u8]);
        } else {
            self.out.push(b'X');
            self.out.extend_from_slice(&(b.len() as u32).to_le_bytes());
        }
        self.out.extend_from_slice(b);
        self.memoize(ptr);
    }

    fn value(&mut self, v: &PyValue, depth: usize) -> Result<(), TreeError> {
        if depth > MAX_DEPTH {
            return Err(TreeError::TooDeep { limit: MAX_DEPTH });
        }
        match v {
            PyValue::None | PyValue::Bytes(_) => self.out.push(b'N'),
            PyValue::Bool(true) => self.out.push(0x88),
            PyValue::Bool(false) => self.out.push(0x89),
            PyValue::Int(i) => self.int(*i),
            PyValue::Float(f) => {
                self.out.push(b'G');
                self.out.extend_from_slice(&f.to_be_bytes());
            }
            PyValue::Str(s) => self.string(s),
            PyValue::List(l) => {
                let ptr = Rc::as_ptr(l) as usize;
                if self.recall(ptr) {
                    return Ok(());
                }
                self.out.push(b']');
                self.memoize(ptr);
                let items = l.borrow();
                for chunk in items.chunks(1000) {
                    self.out.push(b'(');
                    for x in chunk {
                        self.value(x, depth + 1)?;
                    }
                    self.out.push(b'e');
                }
            }
            PyValue::Dict(d) => {
                let ptr = Rc::as_ptr(d) as usize;
                if self.recall(ptr) {
                    return Ok(());
                }
                self.out.push(b'}');
                self.memoize(ptr);
                let items = d.borrow();
                for chunk in items.chunks(1000) {
                    self.out.push(b'(');
                    for (k, x) in chunk {
                        self.value(k, depth + 1)?;
                        self.value(x, depth + 1)?;
                    }
                    self.out.push(b'u');
                }
            }
            PyValue::Tuple(t) => {
                let ptr = Rc::as_ptr(t) as *const PyValue as usize;
                if self.recall(ptr) {
                    return Ok(());
                }
                self.out.push(b'(');
                for x in t.iter() {
                    self.value(x, depth + 1)?;
                }
                self.out.push(b't');
                self.memoize(ptr);
            }
        }
        Ok(())
    }
}

/// The tree as pickle bytes (protocol 4 header, viewer opcodes only).
pub fn write_tree(v: &PyValue) -> Result<Vec<u8>, TreeError> {
    let mut w = Writer {
        out: vec![0x80, 0x04],
        memo: HashMap::new(),
        next: 0,
    };
    w.value(v, 0)?;
    w.out.push(b'.');
    Ok(w.out)
}

#[cfg(test)]
mod tests {
    use super::super::first_unsupported_opcode;
    use super::super::tree::read_tree;
    use super::*;
    use proptest::prelude::*;
    use std::cell::RefCell;

    fn same(a: &PyValue, b: &PyValue) -> bool {
        match (a, b) {
            (PyValue::None, PyValue::None) | (PyValue::Bytes(_), PyValue::None) => true,
            (PyValue::Bool(x), PyValue::Bool(y)) => x == y,
            (PyValue::Int(x), PyValue::Int(y)) => x == y,
            (PyValue::Float(x), PyValue::Float(y)) => x.to_bits() == y.to_bits(),
            (PyValue::Str(x), PyValue::Str(y)) => x == y,
            (PyValue::List(x), PyValue::List(y)) => {
                let (x, y) = (x.borrow(), y.borrow());
                x.len() == y.len() && x.iter().zip(y.iter()).all(|(a, b)| same(a, b))
            }
            (PyValue::Tuple(x), PyValue::Tuple(y)) => {
                x.len() == y.len() && x.iter().zip(y.iter()).all(|(a, b)| same(a, b))
            }
            (PyValue::Dict(x), PyValue::Dict(y)) => {
                let (x, y) = (x.borrow(), y.borrow());
                x.len() == y.len()
                    && x.iter()
                        .zip(y.iter())
                        .all(|((a, b), (c, d))| same(a, c) && same(b, d))
            }
            _ => false,
        }
    }

    fn leaf() -> impl Strategy<Value = PyValue> {
        prop_oneof![
            Just(PyValue::None),
            any::<bool>().prop_map(PyValue::Bool),
            any::<i64>().prop_map(|i| PyValue::Int(i128::from(i))),
            any::<u64>().prop_map(|i| PyValue::Int(i128::from(i))),
            any::<f64>().prop_map(PyValue::Float),
            "[a-z/_.]{0,12}".prop_map(|s| PyValue::str(&s)),
        ]
    }

    fn tree() -> impl Strategy<Value = PyValue> {
        leaf().prop_recursive(4, 64, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6)
                    .prop_map(|v| PyValue::List(Rc::new(RefCell::new(v)))),
                prop::collection::vec(inner.clone(), 0..4)
                    .prop_map(|v| PyValue::Tuple(Rc::from(v))),
                prop::collection::vec(("[a-z]{1,6}", inner), 0..5).prop_map(|v| {
                    PyValue::Dict(Rc::new(RefCell::new(
                        v.into_iter().map(|(k, x)| (PyValue::str(&k), x)).collect(),
                    )))
                }),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]
        /// Any tree written and read back is the same tree, in viewer opcodes only, and a
        /// node referred to twice is written once.
        #[test]
        fn trees_round_trip(v in tree()) {
            let shared = PyValue::List(Rc::new(RefCell::new(vec![v.clone(), v])));
            let bytes = write_tree(&shared).unwrap();
            prop_assert_eq!(first_unsupported_opcode(&bytes), None);
            let back = read_tree(&bytes).unwrap();
            prop_assert!(same(&shared, &back));
            if let (PyValue::List(l), PyValue::List(_)) = (&back, &shared) {
                let l = l.borrow();
                if let (PyValue::List(a), PyValue::List(b)) = (&l[0], &l[1]) {
                    prop_assert!(Rc::ptr_eq(a, b));
                }
            }
        }
    }
}
