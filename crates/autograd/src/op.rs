//! Ops and the saved-tensor table: what each op keeps from forward for its backward.
//!
//! The table is data ([`SavedTable`]), not code: it can be inspected, printed and corrected
//! per framework. Two tables ship: [`SavedTable::pytorch`] and [`SavedTable::burn`].
//!
//! | op | PyTorch saves | burn (autodiff) saves | note |
//! |---|---|---|---|
//! | `linear` | input | input | the weight is a parameter, already alive; the output is not saved |
//! | `matmul` | both inputs | both inputs | attention `q·kᵀ` and `p·v` |
//! | `conv2d` | input | input | |
//! | `relu` | output | input | PyTorch `threshold_backward(grad, result)`; burn-autodiff checkpoints the relu's *input* node and builds the mask from it |
//! | `gelu` | input | input | |
//! | `silu` | input | input | |
//! | `tanh`, `sigmoid` | output | output | |
//! | `softmax` | output | two input-sized tensors (`shifted`, `exp`) + sum (per row) + output | burn composes softmax from `sub`, `exp`, `sum_dim`, `div` |
//! | `log_softmax` | output | output | |
//! | `dropout` | bool mask (1 B/elem) | input + float mask | burn multiplies by a random float tensor |
//! | `layer_norm` | input + mean, rstd (f32 per row) | two input-sized tensors (`centered`, `normalized`) + var, denom (per row) + output | burn composes LayerNorm from element-wise ops (see [`SavedTable::burn`]); the input itself is not saved |
//! | `rms_norm` | input + rstd (f32 per row) + the normalized input when the weight trains | input + output | PyTorch's eager RMS norm (`torch.nn.RMSNorm`, Hugging Face's LLaMA) is composed: `x · rsqrt(mean(x²) + ε)`, then `· weight`, which keeps the normalized tensor for the weight's gradient |
//! | `batch_norm` | input + mean, invstd (f32 per channel) | input + output | |
//! | `max_pool2d` | input + indices (i64 per output elem) | input + indices | |
//! | `avg_pool2d` | input | nothing | burn's backward needs only the shape |
//! | `global_avg_pool` | nothing | nothing | a mean: the shape suffices |
//! | `add` | nothing | nothing | residual connections |
//! | `mul` | both inputs | both inputs | gated FFN (SwiGLU) |
//! | `scale` | nothing | nothing | multiply by a constant |
//! | `embedding` | indices (the input) | indices | the batch's token ids stay alive |
//! | `view` | nothing (aliases its input) | nothing | reshape, flatten, split heads |
//! | `copy` | nothing | nothing | contiguous copies, transposes that copy |
//! | `fused_attention` | q,k,v input + output + logsumexp (f32 per row) | same | flash-style kernels |
//! | `cross_entropy` | log-probabilities (input-sized) + target | same | log_softmax + nll |
//! | `layer_norm_composed` | the centered input (input-sized) + the normalized input when the weight trains + rstd (f32 per row) | as `layer_norm` | a hand-written layer norm: `x − mean` (kept by its square and its product with rstd), `rsqrt` keeps its output, `normalized · weight` keeps `normalized`; `x` itself is not kept |
//! | `softmax_composed` | `exp`'s output (input-sized) + output + the row sums (f32) and the maximum's indices (i64) per row | as `softmax` | a hand-written softmax: `x − max(x)` (`max` keeps its indices), `exp` keeps its output, `e / sum(e)` keeps `e` and the sums |
//! | `mse_loss` | both inputs | the difference (input-sized, input dtype) | burn-nn's MSE is `(logits - targets).square().mean()`: `square` keeps the difference, the target is freed after the subtraction |
//!
//! Sources: PyTorch's `derivatives.yaml` (what each backward formula reads) and burn-autodiff's
//! op implementations (`ops/tensor.rs`, `ops/activation.rs`, `ops/module.rs`); see
//! reference/burn-0.22-notes.md §2.

use serde::{Deserialize, Serialize};
use trainmem_core::OpKind;

/// One tensor an op saves for backward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Saved {
    /// A reference to input `i` (no new memory while the input is alive anyway; keeps it
    /// alive until backward otherwise).
    Input(u8),
    /// A reference to the op's output.
    Output,
    /// A new boolean mask, one byte per output element.
    Mask,
    /// A new mask in the compute dtype, one element per output element.
    FloatMask,
    /// New i64 indices, one per output element.
    Indices,
    /// New i32 indices, one per output element (burn's integer element on cubecl backends:
    /// `CubeBackend<R, f32, i32, u8>`).
    IndicesI32,
    /// A new tensor the size of input `i` (e.g. log-probabilities), in f32.
    InputSized(u8),
    /// A new tensor with the size and dtype of input `i` (burn's MSE keeps `logits −
    /// targets` for its `square`).
    InputCopy(u8),
    /// `n` new f32 values per normalisation row (mean, rstd, logsumexp).
    RowStats(u8),
    /// `n` new i64 indices per row of the op (its `rows_per_sample`): the positions a gather
    /// read its rows from, or a permutation of them, kept for the scatter of its backward.
    RowIndices(u8),
    /// `n` new f32 values per channel (batch-norm statistics; not batch-scaled).
    ChannelStats(u8),
    /// A new tensor of the output's size in the compute dtype that only the op's parameters'
    /// gradients read (a composed RMS norm's normalized input, which the weight multiplies):
    /// kept only when a parameter of the op trains.
    ForParams,
    /// burn-autodiff's graph bookkeeping for `n` recorded ops ([`BURN_NODE_BYTES`] each):
    /// not batch-scaled, freed with the op's other saved tensors.
    Nodes(u8),
    /// A new copy of the op's parameter `k` (a weight; the op's `k`-th parameter) at `n` bytes
    /// per element: the half-precision weight `torch.autocast` makes and the op keeps for its
    /// input's gradient. Not batch-scaled.
    ParamCopy {
        /// Which of the op's parameters.
        k: u8,
        /// Bytes per element of the copy.
        n: u8,
    },
}

/// Host bytes burn-autodiff 0.21 keeps per op it records on the graph (its node, the boxed
/// backward step and its entries in the autodiff server's maps: steps, checkpointer
/// actions, node tree, memory-management statuses), from the forward pass until backward
/// consumes the op.
///
/// A *measured* per-structure constant, not derived from burn's types: the `activation`
/// category trainmem-burn measures minus the simulated tensors, divided by the burn ops
/// recorded (see [`burn_recorded_ops`]), is 860–1,440 bytes per op over MLPs with MSE and
/// cross-entropy losses (6 to 18 ops, batch 8 to 128: independent of the batch) and a
/// two-block transformer (≈ 105 ops); the spread is the stepwise growth of the hash maps
/// behind it.
pub const BURN_NODE_BYTES: u64 = 1_000;

/// How many ops burn-autodiff records for one [`OpKind`] (burn 0.21's compositions):
/// composed ops (the backend traits' default `layer_norm`, `softmax`, `log_softmax`, and
/// burn-nn's losses and dropout) record each tracked element-wise op and reduction; a max
/// taken on a detached tensor is not recorded.
pub fn burn_recorded_ops(kind: OpKind) -> u8 {
    match kind {
        // mean, sub, mul, mean, add_scalar, sqrt, div, reshape γ, mul, reshape β, add
        OpKind::LayerNorm | OpKind::LayerNormComposed => 11,
        // mul, mean, add_scalar, sqrt, div, reshape γ, mul
        OpKind::RmsNorm => 7,
        // mean, sub, mul, mean, add_scalar, sqrt, div, mul, add (per-channel reshapes)
        OpKind::BatchNorm => 11,
        // sub (detached max), exp, sum, div
        OpKind::Softmax | OpKind::SoftmaxComposed => 4,
        // sub (detached max), exp, sum, log, sub
        OpKind::LogSoftmax => 5,
        // log_softmax (5), gather, reshape, mean, neg
        OpKind::CrossEntropy => 9,
        // sub, square, mean
        OpKind::MseLoss => 3,
        // x · mask, · 1/(1 − p)
        OpKind::Dropout => 2,
        // x · sigmoid(x)
        OpKind::Silu => 2,
        // swap_dims, reshape
        OpKind::Copy => 2,
        // attention is not composed by burn-nn from a fused kernel; counted as one op
        _ => 1,
    }
}

/// The saved-tensor table: for each [`OpKind`], the tensors its forward keeps for backward.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedTable {
    entries: Vec<Vec<Saved>>,
}

impl SavedTable {
    /// PyTorch eager autograd.
    pub fn pytorch() -> SavedTable {
        use Saved::*;
        let mut t = SavedTable {
            entries: vec![Vec::new(); OpKind::ALL.len()],
        };
        for (k, s) in [
            (OpKind::Linear, vec![Input(0)]),
            (OpKind::Matmul, vec![Input(0), Input(1)]),
            (OpKind::Conv2d, vec![Input(0)]),
            (OpKind::Relu, vec![Output]),
            (OpKind::Gelu, vec![Input(0)]),
            (OpKind::Silu, vec![Input(0)]),
            (OpKind::Tanh, vec![Output]),
            (OpKind::Sigmoid, vec![Output]),
            (OpKind::Softmax, vec![Output]),
            (OpKind::LogSoftmax, vec![Output]),
            (OpKind::Dropout, vec![Mask]),
            (OpKind::LayerNorm, vec![Input(0), RowStats(2)]),
            (OpKind::RmsNorm, vec![Input(0), RowStats(1), ForParams]),
            (OpKind::BatchNorm, vec![Input(0), ChannelStats(2)]),
            (OpKind::MaxPool2d, vec![Input(0), Indices]),
            (OpKind::AvgPool2d, vec![Input(0)]),
            (OpKind::GlobalAvgPool, vec![]),
            (OpKind::Add, vec![]),
            (OpKind::Mul, vec![Input(0), Input(1)]),
            (OpKind::Scale, vec![]),
            (OpKind::Embedding, vec![Input(0)]),
            (OpKind::View, vec![]),
            (OpKind::Copy, vec![]),
            (OpKind::FusedAttention, vec![Input(0), Output, RowStats(1)]),
            (OpKind::CrossEntropy, vec![InputSized(0), Input(1)]),
            (OpKind::MseLoss, vec![Input(0), Input(1)]),
            // RowStats(1): rstd; the normalized input, kept by `· weight`, only for it
            (
                OpKind::LayerNormComposed,
                vec![InputCopy(0), ForParams, RowStats(1)],
            ),
            // RowStats(3): a row sum (4 bytes) and the maximum's i64 index (8 bytes) per row
            (
                OpKind::SoftmaxComposed,
                vec![InputCopy(0), Output, RowStats(3)],
            ),
        ] {
            t.set(k, s);
        }
        t
    }

    /// burn-autodiff (no checkpointing). Differs from PyTorch for ReLU (burn keeps the
    /// input: its backward `relu_backward(input, grad)` rebuilds the mask from the
    /// checkpointed input node, so the pre-activation stays alive beside the output the next
    /// layer saves), the MSE loss (burn-nn composes it as `sub`, `square`, `mean`: only the
    /// difference is kept, and the target is freed during forward), dropout (a float mask
    /// multiply), normalisation (composed of element-wise ops) and average pooling.
    ///
    /// LayerNorm and softmax have no autodiff op of their own in burn 0.21: burn-autodiff
    /// does not override `layer_norm` / `softmax`, so the backend traits' default
    /// compositions run on tracked tensors (burn-backend `ops/modules/base.rs`
    /// `layer_norm`, `ops/activation.rs` `softmax`), and every element-wise op checkpoints
    /// what its backward reads (burn-autodiff `ops/tensor.rs`):
    ///
    /// * LayerNorm = `centered = x − mean(x)` (sub saves nothing), `var = mean(centered ·
    ///   centered)` (mul saves `centered`), `denom = sqrt(var + ε)` (sqrt saves its input: one
    ///   value per row), `normalized = centered / denom` (div saves both operands: `centered`
    ///   again and `denom`, per row), `normalized · γ` (mul saves `normalized`), `+ β`. Two
    ///   new input-sized tensors and two values per row are saved; `x` itself is not (the
    ///   residual stream is freed at its last use unless something else saves it).
    /// * softmax = `shifted = x − max(x)` (the max is detached), `e = exp(shifted)` (exp
    ///   saves its *input*, `shifted`), `e / sum(e)` (div saves `e` and the row sums). Two new
    ///   input-sized tensors and one value per row, besides the output the next op saves.
    pub fn burn() -> SavedTable {
        use Saved::*;
        let mut t = SavedTable::pytorch();
        t.set(OpKind::Relu, vec![Input(0)]);
        t.set(OpKind::MseLoss, vec![InputCopy(0)]);
        t.set(OpKind::Dropout, vec![Input(0), FloatMask]);
        t.set(
            OpKind::LayerNorm,
            vec![InputCopy(0), InputCopy(0), RowStats(2), Output],
        );
        t.set(
            OpKind::Softmax,
            vec![InputCopy(0), InputCopy(0), RowStats(1), Output],
        );
        t.set(OpKind::RmsNorm, vec![Input(0), Output]);
        // burn composes these itself, the same way
        t.set(OpKind::LayerNormComposed, t.get(OpKind::LayerNorm).to_vec());
        t.set(OpKind::SoftmaxComposed, t.get(OpKind::Softmax).to_vec());
        t.set(OpKind::BatchNorm, vec![Input(0), Output]);
        t.set(OpKind::AvgPool2d, vec![]);
        // every recorded op keeps its graph bookkeeping until backward
        for k in OpKind::ALL {
            let mut e = t.get(k).to_vec();
            e.push(Nodes(burn_recorded_ops(k)));
            t.set(k, e);
        }
        t
    }

    /// What an op saves.
    pub fn get(&self, kind: OpKind) -> &[Saved] {
        &self.entries[kind as usize]
    }

    /// Replaces what an op saves (to correct the table against measurements).
    pub fn set(&mut self, kind: OpKind, saved: Vec<Saved>) {
        self.entries[kind as usize] = saved;
    }

    /// The table as markdown rows (`| op | saved |`), for documentation and reports.
    pub fn to_markdown(&self) -> String {
        let mut s = String::from("| op | saved for backward |\n|---|---|\n");
        for k in OpKind::ALL {
            let items: Vec<String> = self.get(k).iter().map(|x| format!("{x:?}")).collect();
            s.push_str(&format!("| {} | {} |\n", k.name(), items.join(", ")));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for k in OpKind::ALL {
            assert_eq!(OpKind::from_name(k.name()), Some(k));
        }
        assert_eq!(OpKind::from_name("bogus"), None);
    }

    #[test]
    fn tables_follow_the_documented_rules() {
        let p = SavedTable::pytorch();
        assert_eq!(p.get(OpKind::Linear), &[Saved::Input(0)]);
        assert_eq!(p.get(OpKind::Relu), &[Saved::Output]);
        assert_eq!(p.get(OpKind::Dropout), &[Saved::Mask]);
        assert!(p.get(OpKind::Add).is_empty());
        let b = SavedTable::burn();
        assert_eq!(
            b.get(OpKind::Dropout),
            &[Saved::Input(0), Saved::FloatMask, Saved::Nodes(2)]
        );
        assert_eq!(&b.get(OpKind::Linear)[..1], p.get(OpKind::Linear));
        // every input reference is within the op's arity
        for t in [&p, &b] {
            for k in OpKind::ALL {
                for s in t.get(k) {
                    if let Saved::Input(i) | Saved::InputSized(i) | Saved::InputCopy(i) = s {
                        assert!((*i as usize) < k.arity(), "{k:?}");
                    }
                }
            }
        }
        assert!(p.to_markdown().contains("| linear | Input(0) |"));
    }

    #[test]
    fn burn_relu_keeps_its_input_and_mse_its_difference() {
        let b = SavedTable::burn();
        assert_eq!(b.get(OpKind::Relu), &[Saved::Input(0), Saved::Nodes(1)]);
        assert_eq!(
            b.get(OpKind::MseLoss),
            &[Saved::InputCopy(0), Saved::Nodes(3)]
        );
        let p = SavedTable::pytorch();
        assert_eq!(p.get(OpKind::Relu), &[Saved::Output]);
        assert_eq!(p.get(OpKind::MseLoss), &[Saved::Input(0), Saved::Input(1)]);
    }

    #[test]
    fn burn_composed_layer_norm_and_softmax_save_two_input_sized_tensors() {
        let b = SavedTable::burn();
        for k in [OpKind::LayerNorm, OpKind::Softmax] {
            let copies = b
                .get(k)
                .iter()
                .filter(|s| **s == Saved::InputCopy(0))
                .count();
            assert_eq!(copies, 2, "{k:?}");
            // the composed op never keeps its input tensor itself
            assert!(!b.get(k).contains(&Saved::Input(0)), "{k:?}");
        }
        assert_eq!(SavedTable::pytorch().get(OpKind::Softmax), &[Saved::Output]);
    }
}
