//! Hand-computed byte counts for small graphs, and invariants.

use proptest::prelude::*;
use trainmem_core::{Category, Dtype, OpKind};

use crate::checkpoint::{self, CheckpointPolicy};
use crate::*;

/// x[4] → linear → relu → linear → out[2]; mse against t[2].
fn mlp() -> Program {
    let mut b = ProgramBuilder::new();
    let x = b.input(4, ValueDtype::Compute);
    let t = b.input(2, ValueDtype::Compute);
    b.begin_layer("l0");
    let w1 = b.param(32, "w1");
    let b1 = b.param(8, "b1");
    let h = b.op(OpKind::Linear, &[x], 8, &[w1, b1]);
    let a = b.op(OpKind::Relu, &[h], 8, &[]);
    b.begin_layer("l1");
    let w2 = b.param(16, "w2");
    let b2 = b.param(2, "b2");
    let o = b.op(OpKind::Linear, &[a], 2, &[w2, b2]);
    b.loss(OpKind::MseLoss, &[o, t]);
    b.finish().unwrap()
}

fn inputs(store: &mut TensorStore<CountingMemory>, p: &Program, batch: u64) -> Vec<TensorId> {
    p.inputs
        .iter()
        .map(|&v| {
            store
                .alloc(p.values[v as usize].elems(batch, 1.0) * 4, Category::Input)
                .unwrap()
        })
        .collect()
}

#[test]
fn mlp_forward_backward_bytes_by_hand() {
    let p = mlp();
    let mut s = TensorStore::new(CountingMemory::new());
    let mut g = Graph::new(&p, &SavedTable::pytorch(), Dtype::F32);
    let ins = inputs(&mut s, &p, 2);
    assert_eq!(s.live_total(), 48);
    let mut tape = g
        .forward(&mut s, &ins, 2, 1.0, GradMode::Train, &[], &mut NoHooks)
        .unwrap();
    // relu output a (64, saved by relu and linear 2), out (16, saved by mse), loss (4)
    assert_eq!(s.live_of(Category::Activation), 84);
    g.backward(&mut s, &mut tape, false, &mut NoHooks).unwrap();
    // peak: inputs 48 + loss 4 + param grads (128+32+64+8) + grad of h 64 + grad of a 64 ... see module docs
    assert_eq!(s.peak().0, 348);
    assert_eq!(s.live_of(Category::Gradient), 232);
    assert_eq!(s.live_of(Category::Temporary), 0);
    assert_eq!(
        s.live_of(Category::Activation),
        4,
        "only the loss stays on the tape"
    );
    tape.release(&mut s);
    g.drop_param_grads(&mut s);
    assert_eq!(s.live_total(), 48);
}

#[test]
fn no_grad_forward_saves_nothing() {
    let p = mlp();
    let mut s = TensorStore::new(CountingMemory::new());
    let mut g = Graph::new(&p, &SavedTable::pytorch(), Dtype::F32);
    let ins = inputs(&mut s, &p, 2);
    let mut tape = g
        .forward(&mut s, &ins, 2, 1.0, GradMode::NoGrad, &[], &mut NoHooks)
        .unwrap();
    assert_eq!(s.live_of(Category::Activation), 4);
    assert!(matches!(
        g.backward(&mut s, &mut tape, false, &mut NoHooks),
        Err(BackwardError::NoGraph)
    ));
    tape.release(&mut s);
    assert_eq!(s.live_total(), 48);
}

#[test]
fn retain_graph_keeps_saved_tensors_until_the_tape_goes() {
    let p = mlp();
    let mut s = TensorStore::new(CountingMemory::new());
    let mut g = Graph::new(&p, &SavedTable::pytorch(), Dtype::F32);
    let ins = inputs(&mut s, &p, 2);
    let out_value = p.ops[2].output;
    let mut tape = g
        .forward(
            &mut s,
            &ins,
            2,
            1.0,
            GradMode::Train,
            &[out_value],
            &mut NoHooks,
        )
        .unwrap();
    g.backward(&mut s, &mut tape, true, &mut NoHooks).unwrap();
    assert_eq!(
        s.live_of(Category::Activation),
        84,
        "saved tensors retained"
    );
    // a second backward is allowed with a retained graph
    g.backward(&mut s, &mut tape, false, &mut NoHooks).unwrap();
    assert!(matches!(
        g.backward(&mut s, &mut tape, false, &mut NoHooks),
        Err(BackwardError::Consumed)
    ));
    // the held output (16) and loss (4) remain
    assert_eq!(s.live_of(Category::Activation), 20);
    tape.release(&mut s);
    g.drop_param_grads(&mut s);
    assert_eq!(s.live_total(), 48);
}

#[test]
fn release_held_keeps_the_loss() {
    let p = mlp();
    let mut s = TensorStore::new(CountingMemory::new());
    let mut g = Graph::new(&p, &SavedTable::pytorch(), Dtype::F32);
    let ins = inputs(&mut s, &p, 2);
    let out_value = p.ops[2].output;
    let mut tape = g
        .forward(
            &mut s,
            &ins,
            2,
            1.0,
            GradMode::Train,
            &[out_value],
            &mut NoHooks,
        )
        .unwrap();
    g.backward(&mut s, &mut tape, false, &mut NoHooks).unwrap();
    // the held output (16) and the loss (4)
    assert_eq!(s.live_of(Category::Activation), 20);
    tape.release_held(&mut s);
    assert!(tape.held().is_empty());
    assert_eq!(s.live_of(Category::Activation), 4, "only the loss is kept");
    tape.release(&mut s);
    g.drop_param_grads(&mut s);
    assert_eq!(s.live_total(), 48);
}

#[test]
fn release_saved_of_frees_one_op_at_a_time() {
    let p = mlp();
    let mut s = TensorStore::new(CountingMemory::new());
    let mut g = Graph::new(&p, &SavedTable::pytorch(), Dtype::F32);
    let ins = inputs(&mut s, &p, 2);
    let mut tape = g
        .forward(&mut s, &ins, 2, 1.0, GradMode::Train, &[], &mut NoHooks)
        .unwrap();
    // relu saves its output a (64), which linear 2 saves too: still live after relu's go
    tape.release_saved_of(&mut s, 1);
    assert_eq!(s.live_of(Category::Activation), 84);
    // linear 2's references go: a is freed (the mse still saves out and the loss remains)
    tape.release_saved_of(&mut s, 2);
    assert_eq!(s.live_of(Category::Activation), 20);
    // releasing an op twice, or one out of range, is a no-op
    tape.release_saved_of(&mut s, 2);
    tape.release_saved_of(&mut s, 99);
    assert_eq!(s.live_of(Category::Activation), 20);
    tape.release(&mut s);
    for t in ins {
        s.release(t);
    }
    assert_eq!(s.live_total(), 0);
}

/// `n` residual blocks of width `w`: h = h + linear(relu(linear(h))).
fn deep(n: usize, w: u64) -> Program {
    let mut b = ProgramBuilder::new();
    let x = b.input(w, ValueDtype::Compute);
    let t = b.input(w, ValueDtype::Compute);
    b.begin_layer("in");
    let wi = b.param(w * w, "in");
    let mut h = b.op(OpKind::Linear, &[x], w, &[wi]);
    for i in 0..n {
        b.begin_block(format!("block{i}"));
        let w1 = b.param(w * 4 * w, "w1");
        let w2 = b.param(w * 4 * w, "w2");
        let a = b.op(OpKind::Linear, &[h], 4 * w, &[w1]);
        let r = b.op(OpKind::Gelu, &[a], 4 * w, &[]);
        let o = b.op(OpKind::Linear, &[r], w, &[w2]);
        h = b.op(OpKind::Add, &[h, o], w, &[]);
    }
    b.begin_layer("head");
    b.loss(OpKind::MseLoss, &[h, t]);
    b.finish().unwrap()
}

fn run_step(p: &Program, segs: Vec<Segment>, batch: u64) -> (u64, u64, u64) {
    let mut s = TensorStore::new(CountingMemory::new());
    let mut g = Graph::new(p, &SavedTable::pytorch(), Dtype::F32);
    g.set_segments(segs);
    let ins = inputs(&mut s, p, batch);
    let base = s.live_total();
    let mut tape = g
        .forward(&mut s, &ins, batch, 1.0, GradMode::Train, &[], &mut NoHooks)
        .unwrap();
    let after_fwd = s.live_of(Category::Activation);
    g.backward(&mut s, &mut tape, false, &mut NoHooks).unwrap();
    let grads = s.live_of(Category::Gradient);
    tape.release(&mut s);
    g.drop_param_grads(&mut s);
    assert_eq!(s.live_total(), base, "everything freed");
    (after_fwd, s.peak().0, grads)
}

#[test]
fn checkpointing_trades_activation_memory() {
    let p = deep(16, 8);
    // a large batch so that activations, not parameter gradients, set the peak
    let bs = 256;
    let none = run_step(&p, checkpoint::segments_with(&p, 0, 16), bs);
    let every4 = run_step(&p, checkpoint::segments_with(&p, 4, 0), bs);
    let every1 = run_step(&p, checkpoint::segments_with(&p, 1, 0), bs);
    assert!(every4.0 < none.0 / 3, "{every4:?} vs {none:?}");
    // more segments keep more segment inputs after forward, but far less than no checkpointing
    assert!(every1.0 > every4.0 && every1.0 < none.0 / 2);
    assert!(every4.1 < none.1);
    assert_eq!(none.2, every4.2, "same gradients");
    // per block without checkpointing: linear saves h (32B/sample), gelu saves a (128), linear 2 saves r (128)
    let block = (8 + 32 + 32) * 4 * bs;
    let one_block_less = run_step(&p, checkpoint::segments_with(&p, 1, 15), bs);
    assert_eq!(
        none.0 - one_block_less.0,
        block - 8 * 4 * bs,
        "checkpoint keeps the block input"
    );
}

#[test]
fn segments_group_blocks() {
    let p = deep(5, 2);
    let s = checkpoint::segments_with(&p, 2, 1);
    let ck: Vec<_> = s.iter().map(|s| (s.layers, s.checkpointed)).collect();
    assert_eq!(
        ck,
        vec![
            ((0, 1), false),
            ((1, 3), true),
            ((3, 5), true),
            ((5, 7), false)
        ]
    );
    let r = checkpoint::resolve(
        &p,
        CheckpointPolicy::Sqrt,
        &SavedTable::pytorch(),
        Dtype::F32,
        2,
    );
    assert_eq!(r.k, 3);
    assert_eq!(r.recomputed, 5);
}

#[test]
fn budget_policy_finds_least_recompute_that_fits() {
    let p = deep(12, 8);
    let t = SavedTable::pytorch();
    let none = checkpoint::resolve(&p, CheckpointPolicy::None, &t, Dtype::F32, 4);
    let sqrt = checkpoint::resolve(&p, CheckpointPolicy::Sqrt, &t, Dtype::F32, 4);
    let budget = (none.activation_peak + sqrt.activation_peak) / 2;
    let r = checkpoint::resolve(&p, CheckpointPolicy::Budget(budget), &t, Dtype::F32, 4);
    assert!(r.fits);
    assert!(r.activation_peak <= budget);
    assert!(r.recomputed > 0 && r.recomputed < 12, "{r:?}");
    // one block fewer recomputed would exceed the budget for every k
    for k in 1..=12 {
        let more = checkpoint::activation_peak(
            &p,
            &t,
            Dtype::F32,
            4,
            1.0,
            checkpoint::segments_with(&p, k, r.kept + 1),
        );
        assert!(more > budget || r.kept + 1 > 12, "k={k}");
    }
    let tiny = checkpoint::resolve(&p, CheckpointPolicy::Budget(1), &t, Dtype::F32, 4);
    assert!(!tiny.fits);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn every_step_frees_everything(n in 1usize..6, w in 1u64..16, batch in 1u64..8, k in 0u32..4, kept in 0u32..6) {
        let p = deep(n, w);
        let (_, peak, grads) = run_step(&p, checkpoint::segments_with(&p, k, kept), batch);
        prop_assert!(peak > 0);
        prop_assert_eq!(grads, p.param_elems() * 4);
    }
}

#[test]
fn burn_balanced_checkpointing_recomputes_element_wise_outputs() {
    // x → linear → relu → linear → mse(t): the relu is memory bound, so the second linear's
    // saved input (the relu output) is recomputed and the relu backs up its input instead
    let p = mlp();
    let burn = SavedTable::burn();
    let tables = checkpoint::burn_balanced_tables(&p, &burn);
    assert_eq!(tables[0], burn.get(OpKind::Linear)); // x: a batch input, kept
    // relu: backup of the linear output (and its recorded op)
    assert_eq!(tables[1], vec![Saved::Input(0), Saved::Nodes(1)]);
    // linear 2: its input is recomputed; only its graph bookkeeping stays
    assert_eq!(tables[2], vec![Saved::Nodes(1)]);
    assert_eq!(tables[3], burn.get(OpKind::MseLoss)); // untracked target: compute bound
    let mut s = TensorStore::new(CountingMemory::new());
    let mut g = Graph::new(&p, &burn, Dtype::F32);
    g.set_op_tables(tables);
    let ins = inputs(&mut s, &p, 2);
    let mut tape = g
        .forward(&mut s, &ins, 2, 1.0, GradMode::Train, &[], &mut NoHooks)
        .unwrap();
    // h (64, kept), the mse difference (16) and the loss (4); not the relu output; plus the
    // graph bookkeeping of 1 + 1 + 1 + 3 recorded ops
    assert_eq!(
        s.live_of(Category::Activation),
        84 + 6 * crate::op::BURN_NODE_BYTES
    );
    g.backward(&mut s, &mut tape, false, &mut NoHooks).unwrap();
    tape.release(&mut s);
}

/// The values each segment reads without producing them, by searching what the segment
/// produced so far (the definition [`crate::graph::segment_boundaries`] must match).
fn boundaries_by_search(p: &Program, segments: &[Segment]) -> Vec<Vec<ValueId>> {
    segments
        .iter()
        .map(|s| {
            let start = p.layers[s.layers.0 as usize].0 as usize;
            let end = p.layers[s.layers.1 as usize - 1].1 as usize;
            let mut produced = Vec::new();
            let mut b = Vec::new();
            for op in &p.ops[start..end] {
                for &v in op.input_ids() {
                    if !produced.contains(&v) && !b.contains(&v) {
                        b.push(v);
                    }
                }
                produced.push(op.output);
            }
            b
        })
        .collect()
}

/// A program of `links.len()` blocks; block `i` adds its running value to the output of
/// block `i - 1 - links[i]` (a skip connection across blocks, and so across segments).
fn skip_net(links: &[usize]) -> Program {
    let mut b = ProgramBuilder::new();
    let x = b.input(4, ValueDtype::Compute);
    let t = b.input(4, ValueDtype::Compute);
    b.begin_layer("in");
    let w = b.param(16, "in");
    let mut h = b.op(OpKind::Linear, &[x], 4, &[w]);
    let mut outs = vec![h];
    for (i, &back) in links.iter().enumerate() {
        b.begin_block(format!("block{i}"));
        let r = b.op(OpKind::Relu, &[h], 4, &[]);
        let skip = outs[outs.len() - 1 - back.min(outs.len() - 1)];
        h = b.op(OpKind::Add, &[r, skip], 4, &[]);
        h = b.op(OpKind::Mul, &[h, h], 4, &[]);
        outs.push(h);
    }
    b.begin_layer("head");
    b.loss(OpKind::MseLoss, &[h, t]);
    b.finish().unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]
    #[test]
    fn segment_boundaries_are_the_values_read_from_outside(
        links in proptest::collection::vec(0usize..6, 1..24),
        k in 0u32..5,
        kept in 0u32..6,
    ) {
        let p = skip_net(&links);
        let segs = checkpoint::segments_with(&p, k, kept);
        prop_assert_eq!(
            crate::graph::segment_boundaries(&p, &segs),
            boundaries_by_search(&p, &segs)
        );
    }
}

/// x[4] → linear (w1, b1; frozen when `freeze_first`) → gelu → linear (w2, b2; frozen when
/// `freeze_second`) → out[2]; mse against t[2].
fn partly_frozen(freeze_first: bool, freeze_second: bool) -> Program {
    let mut b = ProgramBuilder::new();
    let x = b.input(4, ValueDtype::Compute);
    let t = b.input(2, ValueDtype::Compute);
    b.begin_layer("l0");
    b.freeze_params(freeze_first);
    let w1 = b.param(32, "w1");
    let b1 = b.param(8, "b1");
    let h = b.op(OpKind::Linear, &[x], 8, &[w1, b1]);
    let a = b.op(OpKind::Gelu, &[h], 8, &[]);
    b.begin_layer("l1");
    b.freeze_params(freeze_second);
    let w2 = b.param(16, "w2");
    let b2 = b.param(2, "b2");
    let o = b.op(OpKind::Linear, &[a], 2, &[w2, b2]);
    b.loss(OpKind::MseLoss, &[o, t]);
    b.finish().unwrap()
}

/// Forward then backward at batch 2: (activations at the end of forward, gradients after
/// backward).
fn frozen_step(p: &Program) -> (u64, u64) {
    let mut s = TensorStore::new(CountingMemory::new());
    let mut g = Graph::new(p, &SavedTable::pytorch(), Dtype::F32);
    let ins = inputs(&mut s, p, 2);
    let mut tape = g
        .forward(&mut s, &ins, 2, 1.0, GradMode::Train, &[], &mut NoHooks)
        .unwrap();
    let activations = s.live_of(Category::Activation);
    g.backward(&mut s, &mut tape, false, &mut NoHooks).unwrap();
    let grads = s.live_of(Category::Gradient);
    assert_eq!(s.live_of(Category::Temporary), 0);
    (activations, grads)
}

#[test]
fn a_frozen_first_layer_keeps_nothing_and_gets_no_gradient() {
    // the trainable model keeps h (64, gelu's input), a (64, the second linear's input),
    // out (16, mse's input) and the loss (4); its gradients are 128 + 32 + 64 + 8 bytes
    assert_eq!(frozen_step(&partly_frozen(false, false)), (148, 232));
    let p = partly_frozen(true, false);
    assert_eq!(p.trainable_elems(), 18);
    // h needs no gradient: gelu keeps nothing, the second linear still keeps its input a
    // for its weight's gradient; gradients of w2 and b2 alone
    assert_eq!(frozen_step(&p), (84, 64 + 8));
}

#[test]
fn a_frozen_layer_on_the_path_keeps_no_input_for_its_weight() {
    // the second linear is frozen but the first trains: backward runs through it (it needs
    // its weight, a parameter, not its input), so `a` is not kept; gelu keeps h; only w1 and
    // b1 get gradients
    assert_eq!(frozen_step(&partly_frozen(false, true)), (84, 128 + 32));
    // everything frozen: no op records anything and nothing but the loss stays
    let p = partly_frozen(true, true);
    assert_eq!(p.trainable_elems(), 0);
    let mut s = TensorStore::new(CountingMemory::new());
    let mut g = Graph::new(&p, &SavedTable::pytorch(), Dtype::F32);
    let ins = inputs(&mut s, &p, 2);
    let _tape = g
        .forward(&mut s, &ins, 2, 1.0, GradMode::Train, &[], &mut NoHooks)
        .unwrap();
    assert_eq!(s.live_of(Category::Activation), 4, "the loss alone");
}

/// A product of two values of which only one needs a gradient keeps only the other (the
/// operand that gradient reads); a composed RMS norm keeps its normalized output only while
/// its weight trains.
#[test]
fn products_and_norms_keep_only_what_trainable_gradients_read() {
    let build = |freeze_norm: bool| {
        let mut b = ProgramBuilder::new();
        let x = b.input(8, ValueDtype::Compute);
        let t = b.input(8, ValueDtype::Compute);
        b.begin_layer("l0");
        b.freeze_params(true);
        let wf = b.param(64, "frozen");
        let frozen = b.op(OpKind::Linear, &[x], 8, &[wf]); // needs no gradient
        b.freeze_params(false);
        let w = b.param(64, "w");
        let y = b.op(OpKind::Linear, &[x], 8, &[w]);
        let prod = b.op(OpKind::Mul, &[y, frozen], 8, &[]);
        b.freeze_params(freeze_norm);
        let g = b.param(8, "norm.weight");
        let n = b.op_rows(OpKind::RmsNorm, &[prod], 8, &[g], 1);
        b.loss(OpKind::MseLoss, &[n, t]);
        b.finish().unwrap()
    };
    let activations = |p: &Program| {
        let mut s = TensorStore::new(CountingMemory::new());
        let mut g = Graph::new(p, &SavedTable::pytorch(), Dtype::F32);
        let ins = inputs(&mut s, p, 1);
        let _tape = g
            .forward(&mut s, &ins, 1, 1.0, GradMode::Train, &[], &mut NoHooks)
            .unwrap();
        s.live_of(Category::Activation)
    };
    // mul keeps `frozen` (32 B) for y's gradient, not y; the norm keeps its input prod (32),
    // rstd (4) and, with a trainable weight, the normalized tensor (32); mse keeps n (32);
    // the loss (4)
    assert_eq!(activations(&build(true)), 32 + 32 + 4 + 32 + 4);
    assert_eq!(activations(&build(false)), 32 + 32 + 4 + 32 + 32 + 4);
}

/// x[8 positions × 4] → linear → logits[8 × 16] → cross-entropy over 8 targets, the loss
/// chunked as `chunks` says.
fn head_program(chunks: Option<LossChunks>) -> Result<Program, ProgramError> {
    let mut b = ProgramBuilder::new();
    let x = b.input(32, ValueDtype::Compute);
    let t = b.input(8, ValueDtype::Compute);
    b.begin_layer("head");
    let w = b.param(64, "w");
    let logits = b.op(OpKind::Linear, &[x], 128, &[w]);
    b.loss(OpKind::CrossEntropy, &[logits, t]);
    if let Some(c) = chunks {
        b.chunk_loss(c);
    }
    b.finish()
}

fn head(chunks: Option<LossChunks>) -> Program {
    head_program(chunks).unwrap()
}

/// (peak after forward, peak after backward) of one step of `p` at batch 1, two-step
/// cross-entropy (PyTorch's).
fn head_peaks(p: &Program) -> (u64, u64) {
    let mut s = TensorStore::new(CountingMemory::new());
    let mut g = Graph::new(p, &SavedTable::pytorch(), Dtype::F32);
    g.cross_entropy_two_step = true;
    let ins = inputs(&mut s, p, 1);
    let mut tape = g
        .forward(&mut s, &ins, 1, 1.0, GradMode::Train, &[], &mut NoHooks)
        .unwrap();
    let forward = s.peak().0;
    g.backward(&mut s, &mut tape, false, &mut NoHooks).unwrap();
    let backward = s.peak().0;
    tape.release(&mut s);
    (forward, backward)
}

#[test]
fn a_chunked_loss_makes_one_chunks_gradients_at_a_time() {
    // forward: inputs 128 + 32, logits 512, the loss 4, log-probabilities 512
    // backward: the loss's gradient 4, the log-probabilities' gradient and the logits'
    // gradient, 512 each at once (1,704 in all) or 128 each in chunks of 2 of 8 positions
    let whole = head_peaks(&head(None));
    assert_eq!(whole, (1188, 1704));
    let chunked = LossChunks {
        positions: 2,
        of: 8,
        copied: 0,
    };
    assert_eq!(head_peaks(&head(Some(chunked))), (1188, 1188));
    // forward copies one position of the last chunk (64 B) while the loss runs
    let copying = LossChunks {
        copied: 1,
        ..chunked
    };
    assert_eq!(head_peaks(&head(Some(copying))), (1252, 1252));
}

#[test]
fn loss_chunks_that_are_no_chunking_are_refused() {
    for (positions, of, copied) in [(0, 8, 0), (9, 8, 0), (2, 8, 3)] {
        let chunks = LossChunks {
            positions,
            of,
            copied,
        };
        assert!(
            matches!(
                head_program(Some(chunks)),
                Err(ProgramError::LossChunks { .. })
            ),
            "{positions} of {of}, {copied} copied"
        );
    }
}

/// x[2⁴⁰] → linear → relu → out[2⁴⁰]; mse against t[2⁴⁰]: one sample is 4 TiB of f32.
fn wide() -> Program {
    const W: u64 = 1 << 40;
    let mut b = ProgramBuilder::new();
    let x = b.input(W, ValueDtype::Compute);
    let t = b.input(W, ValueDtype::Compute);
    b.begin_layer("fc");
    let w = b.param(1, "fc.weight");
    let h = b.op_rows(OpKind::Linear, &[x], W, &[w], W);
    let o = b.op(OpKind::Relu, &[h], W, &[]);
    b.loss(OpKind::MseLoss, &[o, t]);
    b.finish().unwrap()
}

#[test]
fn a_size_that_does_not_fit_64_bits_is_named_with_its_figures() {
    let p = wide();
    let g = Graph::new(&p, &SavedTable::pytorch(), Dtype::F32);
    assert_eq!(g.check_sizes(1 << 20, 1.0), Ok(()));
    // 2⁴⁰ × 2²² = 2⁶² elements fit; their 2⁶⁴ bytes do not
    let e = g.check_sizes(1 << 22, 1.0).unwrap_err().to_string();
    assert_eq!(
        e,
        "input 0 of the program (a batch tensor): 4611686018427387904 elements \
         (1099511627776 per sample × batch 4194304) × 4 bytes overflows a 64-bit byte count"
    );
    // past 2⁶⁴ elements
    let e = g.check_sizes(1 << 24, 1.0).unwrap_err().to_string();
    assert!(
        e.contains(
            "1099511627776 elements per sample × batch 16777216 overflows a 64-bit element count"
        ),
        "{e}"
    );
    // at a size factor, what the rounding scales first: 1.5 × 2⁴⁰ per sample
    let e = g.check_sizes(1 << 22, 1.5).unwrap_err().to_string();
    assert!(
        e.contains("(1649267441664 per sample × batch 4194304 at size factor 1.5) × 4 bytes"),
        "{e}"
    );
    // an op's output, named by its kind, its weight and its layer
    let mut f16 = Graph::new(&p, &SavedTable::pytorch(), Dtype::F16);
    f16.set_op_tables(vec![vec![Saved::RowStats(200)], vec![], vec![]]);
    let e = f16.check_sizes(1 << 17, 1.0).unwrap_err().to_string();
    assert_eq!(
        e,
        "what op 0 (`linear` of `fc.weight`) in layer `fc` saves for backward (RowStats(200)): \
         144115188075855872 rows × 200 f32 statistics × 4 bytes overflows a 64-bit byte count"
    );
}

#[test]
fn a_run_past_64_bits_is_refused_by_the_memory_not_overflowed() {
    let p = wide();
    let mut g = Graph::new(&p, &SavedTable::pytorch(), Dtype::F32);
    // the caller's inputs are its own (small here); the graph's first output would be
    // 2⁶⁴ bytes: u64::MAX, which an unlimited counting memory refuses
    let mut store = TensorStore::new(CountingMemory::new());
    let inputs = vec![
        store.alloc(8, Category::Input).unwrap(),
        store.alloc(8, Category::Input).unwrap(),
    ];
    let batch = 1 << 22;
    assert_eq!(g.value_bytes(p.ops[0].output, batch, 1.0), u64::MAX);
    let r = g.forward(
        &mut store,
        &inputs,
        batch,
        1.0,
        GradMode::Train,
        &[],
        &mut NoHooks,
    );
    let oom = r.expect_err("refused");
    assert_eq!(oom.requested, u64::MAX);
    // the sum of live bytes never passes 64 bits either
    let mut mem = CountingMemory::new();
    assert!(mem.allocate(u64::MAX - 1, Category::Input).is_ok());
    assert!(mem.allocate(2, Category::Input).is_err());
    // measuring a checkpointing configuration saturates instead of overflowing
    let peak = checkpoint::activation_peak(
        &p,
        &SavedTable::pytorch(),
        Dtype::F32,
        batch,
        1.0,
        checkpoint::segments(&p, &[]),
    );
    assert_eq!(peak, u64::MAX);
    assert!(
        checkpoint::activation_peak(
            &p,
            &SavedTable::pytorch(),
            Dtype::F32,
            1,
            1.0,
            checkpoint::segments(&p, &[])
        ) < u64::MAX
    );
}

#[test]
fn a_parameter_matrix_past_64_bits_is_an_error_of_the_program() {
    let mut b = ProgramBuilder::new();
    let x = b.input(1, ValueDtype::Compute);
    b.begin_layer("fc");
    let w = b.param_matrix(1 << 32, 1 << 32, "fc.weight");
    let o = b.op(OpKind::Linear, &[x], 1, &[w]);
    b.loss(OpKind::MseLoss, &[o, x]);
    assert_eq!(
        b.finish(),
        Err(ProgramError::Overflow(
            "parameter `fc.weight`: 4294967296 × 4294967296 elements overflows a 64-bit count"
                .into()
        ))
    );
}

#[test]
fn element_counts_are_checked_at_every_size_factor() {
    let v = ValueInfo {
        per_sample: 1 << 63,
        fixed: 1,
        dtype: ValueDtype::Compute,
        requires_grad: false,
    };
    assert_eq!(v.checked_elems(2, 1.0), None);
    assert_eq!(v.checked_elems(1, 1.0), Some((1 << 63) + 1));
    assert_eq!(v.checked_per_sample(2.5), None);
    assert_eq!(v.elems(3, 1.0), u64::MAX, "saturates");
    assert_eq!(v.checked_elems(0, 1.0), Some(1));
}
