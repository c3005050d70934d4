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

use serde::{Deserialize, Serialize};
use trainmem_probe::Category;

use crate::dtype::Dtype;
use crate::graph::{GradMode, Graph, NoHooks};
use crate::op::SavedTable;
use crate::program::{Program, ValueDtype};
use crate::store::{CountingMemory, TensorStore};

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
/// forward + backward with the given segments, measured over a counting memory.
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
        let b = info.elems(batch, scale) * size;
        input_bytes += b;
        inputs.push(store.alloc(b, Category::Input).expect("unlimited memory"));
    }
    let mut hooks = NoHooks;
    let mut tape = g
        .forward(
            &mut store,
            &inputs,
            batch,
            scale,
            GradMode::Train,
            &[],
            &mut hooks,
        )
        .expect("unlimited memory");
    g.backward(&mut store, &mut tape, false, &mut hooks)
        .expect("unlimited memory, fresh tape");
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
    let n = program.checkpointable.iter().filter(|&&c| c).count() as u32;
    let measure = |k: u32, kept: u32| {
        activation_peak(
            program,
            table,
            compute,
            batch,
            1.0,
            segments_with(program, k, kept),
        )
    };
    let make = |k: u32, kept: u32, peak: u64, fits: bool| {
        let k = if kept >= n { 0 } else { k };
        let kept = if k == 0 { n } else { kept };
        ResolvedCheckpointing {
            segments: segments_with(program, k, kept),
            k,
            kept,
            recomputed: n - kept,
            activation_peak: peak,
            fits,
        }
    };
    match policy {
        CheckpointPolicy::None => make(0, n, measure(0, n), true),
        CheckpointPolicy::Every(k) => {
            let k = k.max(1);
            make(k, 0, measure(k, 0), true)
        }
        CheckpointPolicy::Sqrt => {
            let k = ((n as f64).sqrt().ceil() as u32).max(1);
            make(k, 0, measure(k, 0), true)
        }
        CheckpointPolicy::Budget(budget) => {
            let none = measure(0, n);
            if none <= budget || n == 0 {
                return make(0, n, none, none <= budget);
            }
            // best = (kept, -peak) maximal among fitting configurations
            let mut best: Option<(u32, u64, u32)> = None;
            let mut lowest: (u64, u32, u32) = (none, 0, n);
            for k in 1..=n {
                let p0 = measure(k, 0);
                if p0 < lowest.0 {
                    lowest = (p0, k, 0);
                }
                if p0 > budget {
                    continue;
                }
                // largest kept in [0, n) with peak ≤ budget (peak grows with kept)
                let (mut lo, mut hi) = (0u32, n - 1);
                let mut lo_peak = p0;
                while lo < hi {
                    let mid = (lo + hi).div_ceil(2);
                    let pm = measure(k, mid);
                    if pm <= budget {
                        lo = mid;
                        lo_peak = pm;
                    } else {
                        hi = mid - 1;
                    }
                }
                let better = match best {
                    None => true,
                    Some((bk, bp, _)) => lo > bk || (lo == bk && lo_peak < bp),
                };
                if better {
                    best = Some((lo, lo_peak, k));
                }
            }
            match best {
                Some((kept, peak, k)) => make(k, kept, peak, true),
                None => make(lowest.1, lowest.2, lowest.0, false),
            }
        }
    }
}
