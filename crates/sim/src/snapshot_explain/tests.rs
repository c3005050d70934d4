//! Synthetic snapshots of a training loop whose categories are known, written with the
//! stacks PyTorch records (module calls, the autograd engine, an optimizer, a batch moved to
//! the device) and no category anywhere; and bad input.

use std::cell::RefCell;
use std::rc::Rc;

use proptest::prelude::*;
use trainmem_alloc::pytorch::framed::FramedSnapshot;
use trainmem_alloc::pytorch::pickle::{PyValue, write_tree};
use trainmem_core::Category;

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

fn frame(file: &str, line: i64, name: &str) -> PyValue {
    dict(vec![
        ("filename", PyValue::str(file)),
        ("line", PyValue::Int(i128::from(line))),
        ("name", PyValue::str(name)),
    ])
}

/// The stacks of each phase (shared, as PyTorch shares them).
struct Stacks {
    setup: PyValue,
    data: PyValue,
    forward: Vec<PyValue>,
    backward: PyValue,
    optimizer: PyValue,
    zero_grad: PyValue,
    none: PyValue,
}

fn stacks(layers: usize, with_frames: bool) -> Stacks {
    let lib = "/env/lib/python3.12/site-packages/torch";
    let train = frame("/home/me/train.py", 40, "<module>");
    let module = frame(&format!("{lib}/nn/modules/module.py"), 1750, "_call_impl");
    let s = |v: Vec<PyValue>| if with_frames { list(v) } else { list(vec![]) };
    Stacks {
        setup: s(vec![
            frame(&format!("{lib}/nn/modules/module.py"), 1158, "convert"),
            frame(&format!("{lib}/nn/modules/module.py"), 833, "_apply"),
            train.clone(),
        ]),
        data: s(vec![
            frame(
                "python_variable_methods.cpp",
                0,
                "torch::autograd::THPVariable_to(_object*)",
            ),
            train.clone(),
        ]),
        forward: (0..layers)
            .map(|i| {
                s(vec![
                    frame("/home/me/model.py", 20 + i as i64, "forward"),
                    module.clone(),
                    train.clone(),
                ])
            })
            .collect(),
        backward: s(vec![
            frame(
                "??",
                0,
                "torch::autograd::generated::MmBackward0::apply(std::vector)",
            ),
            frame(
                "??",
                0,
                "torch::autograd::Engine::thread_main(std::shared_ptr)",
            ),
        ]),
        optimizer: s(vec![
            frame(
                &format!("{lib}/optim/adamw.py"),
                377,
                "_single_tensor_adamw",
            ),
            train.clone(),
        ]),
        zero_grad: s(vec![
            frame(&format!("{lib}/optim/optimizer.py"), 990, "zero_grad"),
            train.clone(),
        ]),
        none: list(vec![]),
    }
}

/// A training loop: model moved to the device, then `steps` steps of zero_grad
/// (set_to_none), a batch moved, forward (one saved activation and one scratch tensor per
/// layer), backward (a gradient per parameter, activations freed), AdamW (two moments per
/// parameter made at the first step, scratch per parameter).
struct Loop {
    params: Vec<u64>,
    act: Vec<u64>,
    batch: u64,
    steps: usize,
}

struct Built {
    bytes: Vec<u8>,
    /// Category of each allocation, by address.
    truth: Vec<(u64, u64, Category)>,
}

fn build(l: &Loop, with_frames: bool) -> Built {
    let st = stacks(l.act.len(), with_frames);
    let mut events = Vec::new();
    let mut truth = Vec::new();
    let mut next_addr: u64 = 0x7f00_0000_0000;
    let mut alloc = |events: &mut Vec<PyValue>, size: u64, stack: &PyValue, cat: Category| {
        let addr = next_addr;
        next_addr += size.div_ceil(512) * 512 + 512;
        events.push(dict(vec![
            ("action", PyValue::str("alloc")),
            ("addr", PyValue::Int(i128::from(addr))),
            ("size", PyValue::Int(i128::from(size))),
            ("stream", PyValue::Int(0)),
            ("frames", stack.clone()),
        ]));
        truth.push((addr, size, cat));
        addr
    };
    let free = |events: &mut Vec<PyValue>, addr: u64, size: u64, stack: &PyValue| {
        for action in ["free_requested", "free_completed"] {
            events.push(dict(vec![
                ("action", PyValue::str(action)),
                ("addr", PyValue::Int(i128::from(addr))),
                ("size", PyValue::Int(i128::from(size))),
                ("stream", PyValue::Int(0)),
                ("frames", stack.clone()),
            ]));
        }
    };
    for &p in &l.params {
        alloc(&mut events, p, &st.setup, Category::Parameter);
    }
    let mut grads: Vec<(u64, u64)> = Vec::new();
    for step in 0..l.steps {
        for (a, s) in grads.drain(..) {
            free(&mut events, a, s, &st.zero_grad);
        }
        let x = alloc(&mut events, l.batch, &st.data, Category::Input);
        let mut saved = Vec::new();
        for (i, &s) in l.act.iter().enumerate() {
            saved.push((
                alloc(&mut events, s, &st.forward[i], Category::Activation),
                s,
            ));
            let t = alloc(&mut events, s / 2 + 1, &st.forward[i], Category::Temporary);
            free(&mut events, t, s / 2 + 1, &st.none);
        }
        for (i, &p) in l.params.iter().enumerate().rev() {
            let t = alloc(&mut events, p, &st.backward, Category::Temporary);
            free(&mut events, t, p, &st.none);
            grads.push((alloc(&mut events, p, &st.backward, Category::Gradient), p));
            if let Some((a, s)) = saved.get(i).copied() {
                free(&mut events, a, s, &st.none);
            }
        }
        for &(a, s) in saved.iter().skip(l.params.len()) {
            free(&mut events, a, s, &st.none);
        }
        free(&mut events, x, l.batch, &st.none);
        for &p in &l.params {
            if step == 0 {
                alloc(&mut events, p, &st.optimizer, Category::OptimizerState);
                alloc(&mut events, p, &st.optimizer, Category::OptimizerState);
            }
            let t = alloc(&mut events, p, &st.optimizer, Category::Temporary);
            free(&mut events, t, p, &st.none);
        }
    }
    let top = dict(vec![
        ("segments", list(vec![])),
        ("device_traces", list(vec![list(events)])),
    ]);
    Built {
        bytes: write_tree(&top).expect("write"),
        truth,
    }
}

fn explain(bytes: &[u8]) -> SnapshotExplanation {
    let f = FramedSnapshot::read(bytes).expect("read");
    let opts = ExplainOptions {
        replay_remedies: false,
        ..ExplainOptions::default()
    };
    explain_snapshot(&f, &opts).expect("explain")
}

/// Share of bytes whose category was recovered.
fn recovered(b: &Built, ex: &SnapshotExplanation) -> f64 {
    let mut right = 0u64;
    let mut total = 0u64;
    for (addr, size, cat) in &b.truth {
        total += size;
        // addresses are never reused in these loops: one allocation per address
        if ex
            .allocations
            .iter()
            .any(|a| a.addr == *addr && a.category == *cat)
        {
            right += size;
        }
    }
    right as f64 / total as f64
}

fn a_loop() -> Loop {
    Loop {
        params: vec![4096, 1 << 20, 3 << 20, 4096],
        act: vec![2 << 20, 2 << 20, 8 << 20, 2 << 20],
        batch: 65536,
        steps: 3,
    }
}

#[test]
fn a_known_loop_is_recovered_with_frames() {
    let b = build(&a_loop(), true);
    let ex = explain(&b.bytes);
    assert_eq!(recovered(&b, &ex), 1.0);
    assert_eq!(ex.steps.len(), 3);
    assert!(ex.growth.is_none());
    assert!(ex.coverage.peak_share_by_frames > 0.99);
    let bytes = |c: Category| {
        ex.end
            .by_category
            .iter()
            .find(|(k, _)| *k == c)
            .map_or(0, |x| x.1)
    };
    let params: u64 = a_loop().params.iter().sum();
    assert_eq!(bytes(Category::Parameter), params);
    assert_eq!(bytes(Category::Gradient), params);
    assert_eq!(bytes(Category::OptimizerState), 2 * params);
    assert!(
        ex.peak
            .top_sites
            .iter()
            .any(|s| s.site == "me/model.py:22 forward"
                && s.category == Category::Activation
                && s.bytes >= 8 << 20),
        "{:?}",
        ex.peak.top_sites
    );
    assert!(!ex.remedies.is_empty());
}

#[test]
fn without_frames_the_report_says_lifetime_decided() {
    let b = build(&a_loop(), false);
    let ex = explain(&b.bytes);
    assert_eq!(ex.coverage.entries_with_frames, 0);
    assert_eq!(ex.coverage.peak_share_by_frames, 0.0);
    assert_eq!(ex.coverage.peak_share_by_lifetime, 1.0);
    assert!(
        ex.notes.iter().any(|n| n.contains("lifetime alone")),
        "{:?}",
        ex.notes
    );
    assert!(ex.steps.is_empty());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    /// Any such loop: at least 99% of bytes get their category back from the frames.
    #[test]
    fn loops_are_recovered(
        params in prop::collection::vec(1u64..(4 << 20), 1..6),
        act in prop::collection::vec(512u64..(8 << 20), 1..6),
        batch in 8u64..(1 << 20),
        steps in 1usize..4,
    ) {
        let l = Loop { params, act, batch, steps };
        let b = build(&l, true);
        let ex = explain(&b.bytes);
        prop_assert!(recovered(&b, &ex) >= 0.99, "{}", recovered(&b, &ex));
    }
}

#[test]
fn bad_input_is_a_clear_error_or_a_note() {
    // not a snapshot
    let not = write_tree(&list(vec![PyValue::Int(1)])).unwrap();
    let e = FramedSnapshot::read(&not).err().unwrap().to_string();
    assert!(e.contains("not a memory snapshot"), "{e}");
    // truncated
    let b = build(&a_loop(), true);
    let e = FramedSnapshot::read(&b.bytes[..b.bytes.len() / 2])
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("truncated"), "{e}");
    // a pickle that would run code
    let e = FramedSnapshot::read(b"cos\nsystem\n(S'true'\ntR.")
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("GLOBAL") && e.contains("not read"), "{e}");
    // no trace, only segments
    let segs = dict(vec![
        ("segments", list(vec![])),
        ("device_traces", list(vec![list(vec![])])),
    ]);
    let f = FramedSnapshot::read(&write_tree(&segs).unwrap()).unwrap();
    let e = explain_snapshot(&f, &ExplainOptions::default()).unwrap_err();
    assert!(e.to_string().contains("no trace events"), "{e}");
    // frees of blocks never allocated, and frames in an odd shape
    let odd = list(vec![
        PyValue::Int(3),
        frame("x.py", 1, "forward"),
        dict(vec![]),
    ]);
    let ev = |action: &str, addr: i128| {
        dict(vec![
            ("action", PyValue::str(action)),
            ("addr", PyValue::Int(addr)),
            ("size", PyValue::Int(1024)),
            ("frames", odd.clone()),
        ])
    };
    let top = dict(vec![(
        "device_traces",
        list(vec![list(vec![
            ev("free_requested", 0x10),
            ev("alloc", 0x20),
            ev("free_requested", 0x20),
            ev("mystery_action", 0),
        ])]),
    )]);
    let f = FramedSnapshot::read(&write_tree(&top).unwrap()).unwrap();
    assert_eq!(f.unreadable_frames, 2);
    let ex = explain_snapshot(&f, &ExplainOptions::default()).unwrap();
    assert!(
        ex.notes.iter().any(|n| n.contains("not seen before")),
        "{:?}",
        ex.notes
    );
    assert_eq!(ex.allocations.len(), 2);
    // a field of the wrong type names where
    let bad = dict(vec![(
        "device_traces",
        list(vec![list(vec![dict(vec![
            ("action", PyValue::str("alloc")),
            ("addr", PyValue::str("here")),
            ("size", PyValue::Int(1)),
        ])])]),
    )]);
    let e = FramedSnapshot::read(&write_tree(&bad).unwrap())
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("device_traces[0][0].addr"), "{e}");
    // a device that has no trace
    let e = explain_snapshot(
        &FramedSnapshot::read(&b.bytes).unwrap(),
        &ExplainOptions {
            device: Some(3),
            ..ExplainOptions::default()
        },
    )
    .unwrap_err();
    assert!(e.to_string().contains("device 3"), "{e}");
}

#[test]
fn the_annotated_pickle_carries_every_category_and_unknown() {
    let b = build(&a_loop(), true);
    let f = FramedSnapshot::read(&b.bytes).unwrap();
    let ex = explain_snapshot(
        &f,
        &ExplainOptions {
            replay_remedies: false,
            ..ExplainOptions::default()
        },
    )
    .unwrap();
    let out = annotate(f, &ex).unwrap();
    assert_eq!(
        trainmem_alloc::pytorch::pickle::first_unsupported_opcode(&out),
        None
    );
    let back = FramedSnapshot::read(&out).unwrap();
    let cats = back.snapshot.categories();
    for c in [
        "parameter",
        "gradient",
        "optimizer_state",
        "activation",
        "input",
        "temporary",
    ] {
        assert!(cats.contains(&c), "{c} missing from {cats:?}");
    }
    assert!(!back.snapshot.needs_unknown_category());
    // frames survive the round trip
    assert_eq!(
        back.frames.len(),
        FramedSnapshot::read(&b.bytes).unwrap().frames.len()
    );
}
