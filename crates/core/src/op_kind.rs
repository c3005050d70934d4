//! The op vocabulary: every kind of op a model is lowered to, with its name in plan files
//! (`[[model.layers.layers]] op = "..."`) and its number of activation inputs.

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
    /// Layer norm written in plain tensor ops, as hand-written models do (`centered = x −
    /// mean(x)`, `centered · rsqrt(mean(centered²) + ε)`, then `· weight + bias`).
    LayerNormComposed,
    /// Softmax written in plain tensor ops (`e = exp(x − max(x))`, `e / sum(e)`).
    SoftmaxComposed,
}

impl OpKind {
    /// Every op kind.
    pub const ALL: [OpKind; 28] = [
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
        OpKind::LayerNormComposed,
        OpKind::SoftmaxComposed,
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
            OpKind::LayerNormComposed => "layer_norm_composed",
            OpKind::SoftmaxComposed => "softmax_composed",
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
}
