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
//! | `relu` | output | output | PyTorch `threshold_backward(grad, result)` |
//! | `gelu` | input | input | |
//! | `silu` | input | input | |
//! | `tanh`, `sigmoid` | output | output | |
//! | `softmax` | output | output | |
//! | `log_softmax` | output | output | |
//! | `dropout` | bool mask (1 B/elem) | input + float mask | burn multiplies by a random float tensor |
//! | `layer_norm` | input + mean, rstd (f32 per row) | input + output | burn composes LayerNorm from element-wise ops; approximate |
//! | `rms_norm` | input + rstd (f32 per row) | input + output | as above |
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
//! | `mse_loss` | both inputs | both inputs | |
//!
//! Sources: PyTorch's `derivatives.yaml` (what each backward formula reads) and burn-autodiff's
//! op implementations (`ops/tensor.rs`, `ops/activation.rs`, `ops/module.rs`); see
//! reference/burn-0.22-notes.md §2.

use serde::{Deserialize, Serialize};

/// The kind of an op.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpKind {
    /// `x·Wᵀ + b`.
    Linear,
    /// Product of two activations.
    Matmul,
    /// 2-D convolution.
    Conv2d,
    /// max(x, 0).
    Relu,
    /// GELU.
    Gelu,
    /// SiLU.
    Silu,
    /// tanh.
    Tanh,
    /// Logistic sigmoid.
    Sigmoid,
    /// Softmax over the last dimension.
    Softmax,
    /// Log-softmax over the last dimension.
    LogSoftmax,
    /// Dropout.
    Dropout,
    /// LayerNorm.
    LayerNorm,
    /// RMSNorm.
    RmsNorm,
    /// BatchNorm.
    BatchNorm,
    /// Max pooling.
    MaxPool2d,
    /// Average pooling.
    AvgPool2d,
    /// Global average pooling (a mean over the spatial dimensions).
    GlobalAvgPool,
    /// Element-wise sum.
    Add,
    /// Element-wise product.
    Mul,
    /// Multiplication by a constant.
    Scale,
    /// Embedding lookup.
    Embedding,
    /// A view: reshape, flatten, split; aliases its input.
    View,
    /// A copy into a new tensor.
    Copy,
    /// A fused attention kernel.
    FusedAttention,
    /// Cross-entropy loss (log-softmax + negative log-likelihood).
    CrossEntropy,
    /// Mean squared error.
    MseLoss,
}

impl OpKind {
    /// Every op kind.
    pub const ALL: [OpKind; 26] = [
        OpKind::Linear,
        OpKind::Matmul,
        OpKind::Conv2d,
        OpKind::Relu,
        OpKind::Gelu,
        OpKind::Silu,
        OpKind::Tanh,
        OpKind::Sigmoid,
        OpKind::Softmax,
        OpKind::LogSoftmax,
        OpKind::Dropout,
        OpKind::LayerNorm,
        OpKind::RmsNorm,
        OpKind::BatchNorm,
        OpKind::MaxPool2d,
        OpKind::AvgPool2d,
        OpKind::GlobalAvgPool,
        OpKind::Add,
        OpKind::Mul,
        OpKind::Scale,
        OpKind::Embedding,
        OpKind::View,
        OpKind::Copy,
        OpKind::FusedAttention,
        OpKind::CrossEntropy,
        OpKind::MseLoss,
    ];

    /// The snake_case name.
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Linear => "linear",
            OpKind::Matmul => "matmul",
            OpKind::Conv2d => "conv2d",
            OpKind::Relu => "relu",
            OpKind::Gelu => "gelu",
            OpKind::Silu => "silu",
            OpKind::Tanh => "tanh",
            OpKind::Sigmoid => "sigmoid",
            OpKind::Softmax => "softmax",
            OpKind::LogSoftmax => "log_softmax",
            OpKind::Dropout => "dropout",
            OpKind::LayerNorm => "layer_norm",
            OpKind::RmsNorm => "rms_norm",
            OpKind::BatchNorm => "batch_norm",
            OpKind::MaxPool2d => "max_pool2d",
            OpKind::AvgPool2d => "avg_pool2d",
            OpKind::GlobalAvgPool => "global_avg_pool",
            OpKind::Add => "add",
            OpKind::Mul => "mul",
            OpKind::Scale => "scale",
            OpKind::Embedding => "embedding",
            OpKind::View => "view",
            OpKind::Copy => "copy",
            OpKind::FusedAttention => "fused_attention",
            OpKind::CrossEntropy => "cross_entropy",
            OpKind::MseLoss => "mse_loss",
        }
    }

    /// Parses a snake_case name.
    pub fn from_name(name: &str) -> Option<OpKind> {
        OpKind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Number of activation inputs the op takes.
    pub fn arity(self) -> usize {
        match self {
            OpKind::Matmul | OpKind::Add | OpKind::Mul | OpKind::CrossEntropy | OpKind::MseLoss => {
                2
            }
            _ => 1,
        }
    }

    /// Whether the output aliases the input (no new memory).
    pub fn is_view(self) -> bool {
        self == OpKind::View
    }
}

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
    /// A new tensor the size of input `i` (e.g. log-probabilities).
    InputSized(u8),
    /// `n` new f32 values per normalisation row (mean, rstd, logsumexp).
    RowStats(u8),
    /// `n` new f32 values per channel (batch-norm statistics; not batch-scaled).
    ChannelStats(u8),
}

/// Which framework's table to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Framework {
    /// PyTorch eager autograd.
    #[default]
    Pytorch,
    /// burn-autodiff without checkpointing.
    Burn,
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
            (OpKind::RmsNorm, vec![Input(0), RowStats(1)]),
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
        ] {
            t.set(k, s);
        }
        t
    }

    /// burn-autodiff (no checkpointing). Differs from PyTorch for dropout (a float mask
    /// multiply), normalisation (composed of element-wise ops) and average pooling.
    pub fn burn() -> SavedTable {
        use Saved::*;
        let mut t = SavedTable::pytorch();
        t.set(OpKind::Dropout, vec![Input(0), FloatMask]);
        t.set(OpKind::LayerNorm, vec![Input(0), Output]);
        t.set(OpKind::RmsNorm, vec![Input(0), Output]);
        t.set(OpKind::BatchNorm, vec![Input(0), Output]);
        t.set(OpKind::AvgPool2d, vec![]);
        t
    }

    /// The table of a framework.
    pub fn for_framework(f: Framework) -> SavedTable {
        match f {
            Framework::Pytorch => SavedTable::pytorch(),
            Framework::Burn => SavedTable::burn(),
        }
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
        assert_eq!(b.get(OpKind::Dropout), &[Saved::Input(0), Saved::FloatMask]);
        assert_eq!(b.get(OpKind::Linear), p.get(OpKind::Linear));
        // every input reference is within the op's arity
        for t in [&p, &b] {
            for k in OpKind::ALL {
                for s in t.get(k) {
                    if let Saved::Input(i) | Saved::InputSized(i) = s {
                        assert!((*i as usize) < k.arity(), "{k:?}");
                    }
                }
            }
        }
        assert!(p.to_markdown().contains("| linear | Input(0) |"));
    }
}
