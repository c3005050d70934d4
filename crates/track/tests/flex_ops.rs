//! Random op sequences on `Tracked<Flex>`: after every op the tracker's live bytes per category
//! (buffers plus the tensors' own records, `handles`) equal the bytes the counting allocator
//! sees Flex hold, no record is left beside them (what the program allocated outside the ops and
//! Flex took over as a buffer, `from_data`'s block, is the buffer's), and everything returns to
//! zero when the tensors are dropped. Views, in-place element-wise ops, clones, cat, slice,
//! tensors made from host data and drops in random order.

use std::sync::Mutex;

use burn::backend::Flex;
use burn::tensor::{Distribution, Tensor, TensorData, s};
use proptest::prelude::*;
use trainmem_core::Category;
use trainmem_probe::{CategoryScope, CountingAlloc};
use trainmem_track::Tracked;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc::new();

type B = Tracked<Flex>;

/// The tests of this file share the process-wide counters.
static SERIAL: Mutex<()> = Mutex::new(());

/// The categories the ops are tagged with (never `other`, where the tracker's own bookkeeping
/// is counted).
const TAGS: [Category; 3] = [Category::Activation, Category::Gradient, Category::Input];

#[derive(Debug, Clone)]
enum Op {
    /// A new tensor of `rows × 64` f32 values (at least 4 KiB).
    New { rows: usize, tag: usize },
    /// A tensor of `rows × 64` f32 values made from a vector the program filled.
    FromData { rows: usize, tag: usize },
    /// A reshape view of tensor `i`.
    View { i: usize, tag: usize },
    /// A transposed view of tensor `i`.
    Transpose { i: usize, tag: usize },
    /// The first `rows` rows of tensor `i` (a view).
    Slice { i: usize, rows: usize, tag: usize },
    /// Tensor `i` plus a scalar, consuming it (in place when its buffer is not shared).
    AddScalar { i: usize, tag: usize },
    /// Tensor `i` times tensor `j` when their shapes match (a new buffer, or `i`'s in place).
    Mul { i: usize, j: usize, tag: usize },
    /// A clone of tensor `i` (shares its buffer).
    Clone { i: usize },
    /// Tensors `i` and `j` concatenated along rows when their widths match.
    Cat { i: usize, j: usize, tag: usize },
    /// Drops tensor `i`.
    Drop { i: usize },
}

fn op() -> impl Strategy<Value = Op> {
    let i = 0usize..64;
    let tag = 0usize..TAGS.len();
    prop_oneof![
        3 => (1usize..64, tag.clone()).prop_map(|(rows, tag)| Op::New { rows, tag }),
        1 => (1usize..64, tag.clone()).prop_map(|(rows, tag)| Op::FromData { rows, tag }),
        1 => (i.clone(), tag.clone()).prop_map(|(i, tag)| Op::View { i, tag }),
        1 => (i.clone(), tag.clone()).prop_map(|(i, tag)| Op::Transpose { i, tag }),
        1 => (i.clone(), 1usize..64, tag.clone()).prop_map(|(i, rows, tag)| Op::Slice { i, rows, tag }),
        2 => (i.clone(), tag.clone()).prop_map(|(i, tag)| Op::AddScalar { i, tag }),
        1 => (i.clone(), i.clone(), tag.clone()).prop_map(|(i, j, tag)| Op::Mul { i, j, tag }),
        1 => i.clone().prop_map(|i| Op::Clone { i }),
        1 => (i.clone(), i.clone(), tag).prop_map(|(i, j, tag)| Op::Cat { i, j, tag }),
        3 => i.prop_map(|i| Op::Drop { i }),
    ]
}

/// Live bytes per tagged category: (counting allocator, tracker's tensors, tracker's records).
fn counts() -> ([u64; 3], [u64; 3], [u64; 3]) {
    let tracked = trainmem_track::snapshot();
    let host = trainmem_probe::snapshot();
    let mut a = [0; 3];
    let mut t = [0; 3];
    let mut r = [0; 3];
    for (k, c) in TAGS.iter().enumerate() {
        a[k] = host.live[c.index()] as u64;
        t[k] = tracked.live.get(*c) + tracked.handles.get(*c);
        r[k] = tracked.records.get(*c);
    }
    (a, t, r)
}

fn apply(tensors: &mut Vec<Tensor<B, 2>>, op: &Op) {
    let device = Default::default();
    let pick = |i: usize, n: usize| (n > 0).then(|| i % n);
    match *op {
        Op::New { rows, tag } => {
            let _t = CategoryScope::enter(TAGS[tag]);
            tensors.push(Tensor::random([rows, 64], Distribution::Default, &device));
        }
        Op::FromData { rows, tag } => {
            let _t = CategoryScope::enter(TAGS[tag]);
            let values: Vec<f32> = (0..rows * 64).map(|v| v as f32).collect();
            let data = TensorData::new(values, [rows, 64]);
            tensors.push(Tensor::from_data(data, &device));
        }
        Op::View { i, tag } => {
            if let Some(i) = pick(i, tensors.len()) {
                let _t = CategoryScope::enter(TAGS[tag]);
                let [r, c] = tensors[i].dims();
                let v = tensors[i].clone().reshape([c, r]);
                tensors.push(v);
            }
        }
        Op::Transpose { i, tag } => {
            if let Some(i) = pick(i, tensors.len()) {
                let _t = CategoryScope::enter(TAGS[tag]);
                let v = tensors[i].clone().transpose();
                tensors.push(v);
            }
        }
        Op::Slice { i, rows, tag } => {
            if let Some(i) = pick(i, tensors.len()) {
                let _t = CategoryScope::enter(TAGS[tag]);
                let [r, _] = tensors[i].dims();
                let v = tensors[i].clone().slice(s![0..rows.min(r), ..]);
                tensors.push(v);
            }
        }
        Op::AddScalar { i, tag } => {
            if let Some(i) = pick(i, tensors.len()) {
                let _t = CategoryScope::enter(TAGS[tag]);
                let t = tensors.swap_remove(i);
                tensors.push(t.add_scalar(1.0));
            }
        }
        Op::Mul { i, j, tag } => {
            let n = tensors.len();
            if let (Some(i), Some(j)) = (pick(i, n), pick(j, n))
                && tensors[i].dims() == tensors[j].dims()
            {
                let _t = CategoryScope::enter(TAGS[tag]);
                let rhs = tensors[j].clone();
                let lhs = tensors.swap_remove(i);
                tensors.push(lhs.mul(rhs));
            }
        }
        Op::Clone { i } => {
            if let Some(i) = pick(i, tensors.len()) {
                let c = tensors[i].clone();
                tensors.push(c);
            }
        }
        Op::Cat { i, j, tag } => {
            let n = tensors.len();
            if let (Some(i), Some(j)) = (pick(i, n), pick(j, n))
                && tensors[i].dims()[1] == tensors[j].dims()[1]
            {
                let _t = CategoryScope::enter(TAGS[tag]);
                let c = Tensor::cat(vec![tensors[i].clone(), tensors[j].clone()], 0);
                tensors.push(c);
            }
        }
        Op::Drop { i } => {
            if let Some(i) = pick(i, tensors.len()) {
                drop(tensors.swap_remove(i));
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn the_tracker_counts_what_flex_holds(ops in proptest::collection::vec(op(), 1..40)) {
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        // The first random tensor of a thread seeds its generator (a few hundred bytes kept
        // for the thread's life): done before the baseline, under `other`.
        drop(Tensor::<B, 2>::random([1, 1], Distribution::Default, &Default::default()));
        let (a0, t0, r0) = counts();
        let mut tensors: Vec<Tensor<B, 2>> = Vec::with_capacity(64);
        for (n, op) in ops.iter().enumerate() {
            apply(&mut tensors, op);
            let (a, t, r) = counts();
            for k in 0..TAGS.len() {
                prop_assert_eq!(
                    a[k] - a0[k],
                    t[k] - t0[k],
                    "{:?} after op {} ({:?})", TAGS[k], n, op
                );
                prop_assert_eq!(r[k], r0[k], "{:?}: no record beside the tensors after op {} ({:?})", TAGS[k], n, op);
            }
        }
        drop(tensors);
        let (a, t, r) = counts();
        prop_assert_eq!(a, a0, "the allocator is back where it started");
        prop_assert_eq!(t, t0, "the tracker is back where it started");
        prop_assert_eq!(r, r0, "and so are the records");
    }
}
