//! Gradient-checkpointing policies and the segments they produce.
//!
//! A [`Segment`] is a run of consecutive layers. A checkpointed segment keeps only the tensors
//! that enter it during forward and recomputes its activations during backward. Only layers
//! marked checkpointable (repeated blocks) are ever checkpointed.
//!
//! Policies ([`CheckpointPolicy`]):
//! * `None`: nothing is recomputed.
//! * `Every(k)`: blocks in segments of `k`.
//! * `Sqrt`: segments of ⌈√n⌉ blocks (Chen et al. 2016: O(√n) memory for one extra forward).
//! * `Budget(bytes)`: the configuration that recomputes the fewest blocks while the
//!   activation peak stays within `bytes`, found by running the graph over a counting memory:
//!   the last `kept` blocks are not checkpointed, the others in segments of `k`.
//!
//! burn checkpoints differently: no segments, but per op (compute-bound outputs kept,
//! memory-bound ones recomputed); see [`burn_balanced_tables`].

use serde::{Deserialize, Serialize};
use trainmem_core::Category;

use crate::graph::{GradMode, Graph, NoHooks};
use crate::op::{Saved, SavedTable};
use crate::program::{Program, ValueDtype};
use crate::store::{CountingMemory, TensorStore};
use trainmem_core::Dtype;
use trainmem_core::OpKind;

/// A run of layers `layers.0 .. layers.1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    /// Layer range.
    pub layers: (u32, u32),
    /// Whether its activations are dropped and recomputed.
    pub checkpointed: bool,
}

/// A checkpointing policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CheckpointPolicy {
    /// No checkpointing.
    None,
    /// Segments of `k` blocks.
    Every(u32),
    /// Segments of ⌈√n⌉ blocks.
    Sqrt,
    /// Least recomputation within an activation budget in bytes.
    Budget(u64),
}

/// The segments a policy resolved to, with what they cost.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResolvedCheckpointing {
    /// The segments.
    pub segments: Vec<Segment>,
    /// Blocks per checkpointed segment (0 when nothing is checkpointed).
    pub k: u32,
    /// Blocks left un-checkpointed (at the end of the network).
    pub kept: u32,
    /// Blocks recomputed during backward.
    pub recomputed: u32,
    /// Peak bytes of activations and backward temporaries per the counting run.
    pub activation_peak: u64,
    /// Whether `activation_peak` is within the budget (always true without a budget).
    pub fits: bool,
}

/// Builds segments: checkpointable blocks except the last `kept` go into checkpointed
/// segments of `k` blocks (`k = 0`: none checkpointed).
pub fn segments_with(program: &Program, k: u32, kept: u32) -> Vec<Segment> {
    let n_blocks = program.checkpointable.iter().filter(|&&c| c).count() as u32;
    let limit = n_blocks.saturating_sub(kept);
    let mut out: Vec<Segment> = Vec::new();
    let mut block = 0u32;
    let mut run = 0u32;
    for (l, &ck) in program.checkpointable.iter().enumerate() {
        let l = l as u32;
        let checkpointed = k > 0 && ck && block < limit;
        if ck {
            block += 1;
        }
        let extend = match out.last() {
            Some(last) if last.checkpointed == checkpointed => !checkpointed || run < k,
            _ => false,
        };
        if extend {
            out.last_mut().expect("checked").layers.1 = l + 1;
            run += 1;
        } else {
            out.push(Segment {
                layers: (l, l + 1),
                checkpointed,
            });
            run = 1;
        }
    }
    out
}

/// Segments for a per-layer list of checkpointed flags (empty = none checkpointed); each
/// maximal run of flagged layers becomes one segment.
pub fn segments(program: &Program, checkpointed: &[bool]) -> Vec<Segment> {
    let mut out: Vec<Segment> = Vec::new();
    for l in 0..program.layers.len() as u32 {
        let c = checkpointed.get(l as usize).copied().unwrap_or(false)
            && program
                .checkpointable
                .get(l as usize)
                .copied()
                .unwrap_or(false);
        match out.last_mut() {
            Some(last) if last.checkpointed == c => last.layers.1 = l + 1,
            _ => out.push(Segment {
                layers: (l, l + 1),
                checkpointed: c,
            }),
        }
    }
    out
}

/// Peak bytes of activations and backward temporaries (parameter gradients excluded) of one
/// forward + backward with the given segments, measured over a counting memory;
/// `u64::MAX` when they do not fit 64 bits (more than any budget: a size that overflows is
/// named by [`Graph::check_sizes`]).
pub fn activation_peak(
    program: &Program,
    table: &SavedTable,
    compute: Dtype,
    batch: u64,
    scale: f64,
    segs: Vec<Segment>,
) -> u64 {
    let mut store = TensorStore::new(CountingMemory::new());
    let mut g = Graph::new(program, table, compute);
    g.set_segments(segs);
    for b in g.param_grad_bytes.iter_mut() {
        *b = 0;
    }
    let mut inputs = Vec::new();
    let mut input_bytes = 0;
    for &v in &program.inputs {
        let info = program.values[v as usize];
        let size = match info.dtype {
            ValueDtype::Compute => compute.size(),
            ValueDtype::Fixed(d) => d.size(),
        };
        // the counting memory is unlimited but for sizes that do not fit 64 bits
        let Some(b) = info
            .checked_elems(batch, scale)
            .and_then(|e| e.checked_mul(size))
        else {
            return u64::MAX;
        };
        input_bytes += b;
        match store.alloc(b, Category::Input) {
            Ok(t) => inputs.push(t),
            Err(_) => return u64::MAX,
        }
    }
    let mut hooks = NoHooks;
    let Ok(mut tape) = g.forward(
        &mut store,
        &inputs,
        batch,
        scale,
        GradMode::Train,
        &[],
        &mut hooks,
    ) else {
        return u64::MAX;
    };
    if g.backward(&mut store, &mut tape, false, &mut hooks)
        .is_err()
    {
        return u64::MAX;
    }
    tape.release(&mut store);
    g.drop_param_grads(&mut store);
    store.peak().0.saturating_sub(input_bytes)
}

/// Resolves a policy for a program at a batch size.
pub fn resolve(
    program: &Program,
    policy: CheckpointPolicy,
    table: &SavedTable,
    compute: Dtype,
    batch: u64,
) -> ResolvedCheckpointing {
    let r = Resolver {
        program,
        table,
        compute,
        batch,
        n: program.checkpointable.iter().filter(|&&c| c).count() as u32,
    };
    let n = r.n;
    match policy {
        CheckpointPolicy::None => r.make(0, n, r.measure(0, n), true),
        CheckpointPolicy::Every(k) => {
            let k = k.max(1);
            r.make(k, 0, r.measure(k, 0), true)
        }
        CheckpointPolicy::Sqrt => {
            let k = ((n as f64).sqrt().ceil() as u32).max(1);
            r.make(k, 0, r.measure(k, 0), true)
        }
        CheckpointPolicy::Budget(budget) => r.least_recomputation_within(budget),
    }
}

/// A program at a batch size whose checkpointing configurations are measured and resolved.
struct Resolver<'a> {
    program: &'a Program,
    table: &'a SavedTable,
    compute: Dtype,
    batch: u64,
    /// Checkpointable blocks.
    n: u32,
}

impl Resolver<'_> {
    /// The activation peak with `kept` last blocks plain and the others in segments of `k`.
    fn measure(&self, k: u32, kept: u32) -> u64 {
        activation_peak(
            self.program,
            self.table,
            self.compute,
            self.batch,
            1.0,
            segments_with(self.program, k, kept),
        )
    }

    /// The resolution for `k` and `kept` (all kept when `k` is 0 or `kept` covers all).
    fn make(&self, k: u32, kept: u32, peak: u64, fits: bool) -> ResolvedCheckpointing {
        let n = self.n;
        let k = if kept >= n { 0 } else { k };
        let kept = if k == 0 { n } else { kept };
        ResolvedCheckpointing {
            segments: segments_with(self.program, k, kept),
            k,
            kept,
            recomputed: n - kept,
            activation_peak: peak,
            fits,
        }
    }

    /// The configuration recomputing the fewest blocks within `budget`, else the lowest peak.
    fn least_recomputation_within(&self, budget: u64) -> ResolvedCheckpointing {
        let n = self.n;
        let none = self.measure(0, n);
        if none <= budget || n == 0 {
            return self.make(0, n, none, none <= budget);
        }
        // best = (kept, -peak) maximal among fitting configurations
        let mut best: Option<(u32, u64, u32)> = None;
        let mut lowest: (u64, u32, u32) = (none, 0, n);
        for k in 1..=n {
            let p0 = self.measure(k, 0);
            if p0 < lowest.0 {
                lowest = (p0, k, 0);
            }
            if p0 > budget {
                continue;
            }
            let (lo, lo_peak) = self.most_kept_within(k, p0, budget);
            let better = match best {
                None => true,
                Some((bk, bp, _)) => lo > bk || (lo == bk && lo_peak < bp),
            };
            if better {
                best = Some((lo, lo_peak, k));
            }
        }
        match best {
            Some((kept, peak, k)) => self.make(k, kept, peak, true),
            None => self.make(lowest.1, lowest.2, lowest.0, false),
        }
    }

    /// The largest `kept` in [0, n) with segments of `k` and peak ≤ `budget`, and its peak.
    fn most_kept_within(&self, k: u32, p0: u64, budget: u64) -> (u32, u64) {
        // peak grows with kept; `p0` (kept = 0) is within the budget
        let (mut lo, mut hi) = (0u32, self.n - 1);
        let mut lo_peak = p0;
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            let pm = self.measure(k, mid);
            if pm <= budget {
                lo = mid;
                lo_peak = pm;
            } else {
                hi = mid - 1;
            }
        }
        (lo, lo_peak)
    }
}

/// Whether burn-autodiff marks the op producing an [`OpKind`]'s output *memory bound*
/// (cheap to recompute) rather than *compute bound*.
///
/// From burn-autodiff 0.21 `ops/activation.rs`, `ops/module.rs` and `ops/tensor.rs`: every
/// activation (`gelu`, `relu`, `sigmoid`, `tanh`; SiLU composes `mul` and `sigmoid`) and
/// every element-wise arithmetic op (`float_add`, `float_mul`, `float_sub`,
/// `float_mul_scalar`, `float_div_scalar`, `float_exp`, ...) is memory bound; `linear`,
/// `float_matmul`, `conv2d`, the pools, `embedding` and the reductions (`float_mean_dim`,
/// `float_sum_dim`) are compute bound. LayerNorm and softmax are compositions whose last op
/// (`add` / `div`) is element-wise.
pub fn burn_memory_bound(kind: OpKind) -> bool {
    matches!(
        kind,
        OpKind::Relu
            | OpKind::Gelu
            | OpKind::Silu
            | OpKind::Tanh
            | OpKind::Sigmoid
            | OpKind::Add
            | OpKind::Mul
            | OpKind::Scale
            | OpKind::LayerNorm
            | OpKind::LayerNormComposed
            | OpKind::RmsNorm
            | OpKind::Softmax
            | OpKind::SoftmaxComposed
    )
}

/// The per-op saved-tensor entries of burn-autodiff's `BalancedCheckpointing` strategy, from
/// burn's no-checkpointing `table` (what [`Graph::set_op_tables`] takes).
///
/// What burn 0.21 does (burn-autodiff `checkpoint/strategy.rs`, `checkpoint/builder.rs`,
/// `ops/base.rs`):
///
/// * A memory-bound op's output is never kept: a later op that checkpoints it records a
///   `Recompute` action (its retro-forward), so the value is rebuilt from its parents in
///   backward.
/// * To make that possible a memory-bound op backs up *all its parents*
///   (`checkpoint_parents`): a compute-bound parent's tensor is kept (a `Computed` action),
///   a memory-bound parent is itself recomputed (and already backed up its own parents).
///   New tensors the element-wise op would save (softmax's `exp`, LayerNorm's `centered`)
///   are recomputed too; only compute-bound reductions inside a composition (per-row
///   statistics) stay.
/// * A memory-bound op with an untracked parent (the batch, a target, a detached max)
///   cannot back it up and falls back to compute bound (`Err(UntrackedParent)` →
///   `ComputingProperty::ComputeBound`): its output is kept like any compute-bound one.
///   Softmax starts with `x − detach(max)`, so its shifted input is compute bound and kept
///   (exp saves it) while the softmax input itself is not backed up; LayerNorm starts with
///   `x − mean(x)` (tracked), so it backs up `x` and the row means.
/// * Compute-bound ops save what they save without checkpointing; a saved reference to a
///   memory-bound value costs nothing (it is recomputed).
///
/// Dropout (`x · mask` with an untracked random mask, then `· 1/(1−p)`) keeps the mask and
/// its (compute-bound) product; copies and views are treated as compute bound.
pub fn burn_balanced_tables(program: &Program, table: &SavedTable) -> Vec<Vec<Saved>> {
    let untracked_parent = |op: &crate::program::Op| {
        op.input_ids()
            .iter()
            .any(|&v| program.inputs.contains(&v) && !program.values[v as usize].requires_grad)
    };
    // values whose tensor burn recomputes instead of keeping
    let mut recomputed = vec![false; program.values.len()];
    for op in &program.ops {
        if burn_memory_bound(op.kind) && !untracked_parent(op) {
            recomputed[op.output as usize] = true;
        }
    }
    program
        .ops
        .iter()
        .map(|op| {
            let own: Vec<Saved> = if !burn_memory_bound(op.kind) || untracked_parent(op) {
                match op.kind {
                    OpKind::Dropout => vec![Saved::FloatMask, Saved::Output],
                    k => table.get(k).to_vec(),
                }
            } else {
                match op.kind {
                    // shifted = x − detach(max) is compute bound: exp keeps it; the row sums
                    OpKind::Softmax | OpKind::SoftmaxComposed => {
                        vec![Saved::InputCopy(0), Saved::RowStats(1)]
                    }
                    // backs up x and the row means; sqrt keeps the (compute-bound) variance
                    OpKind::LayerNorm | OpKind::LayerNormComposed => {
                        vec![Saved::Input(0), Saved::RowStats(2)]
                    }
                    OpKind::RmsNorm => vec![Saved::Input(0), Saved::RowStats(1)],
                    // backup of every parent
                    k => (0..k.arity() as u8).map(Saved::Input).collect(),
                }
            };
            // the recorded ops' graph bookkeeping exists with or without checkpointing
            let nodes = table
                .get(op.kind)
                .iter()
                .filter(|s| matches!(s, Saved::Nodes(_)));
            let mut own = own;
            for n in nodes {
                if !own.contains(n) {
                    own.push(*n);
                }
            }
            own.into_iter()
                .filter(|s| match *s {
                    Saved::Input(j) => !recomputed[op.inputs[j as usize] as usize],
                    Saved::Output => !recomputed[op.output as usize],
                    _ => true,
                })
                .collect()
        })
        .collect()
}
