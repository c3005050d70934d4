//! Model specifications: what a plan says about the network being trained.
//!
//! Four kinds, written in TOML as a sub-table of `[model]`:
//!
//! ```toml
//! [model.mlp]                      # a multilayer perceptron
//! input = 1024
//! hidden = [4096]
//! output = 1024
//!
//! [model.cnn]                      # conv / pool / norm / linear stack over an image
//! image = [3, 32, 32]
//! classes = 10
//! layers = [ { op = "conv", out = 32, kernel = 3, padding = 1 }, { op = "relu" },
//!            { op = "max_pool", kernel = 2 }, { op = "flatten" } ]
//!
//! [model.transformer]              # encoder or decoder stack
//! layers = 12
//! hidden = 768
//! heads = 12
//! seq_len = 512
//! vocab = 50257
//!
//! [model.layers]                   # anything else: a raw list of ops
//! input = [512]
//! layers = [ { op = "linear", out = [512], params = [262144, 512] }, { op = "relu" } ]
//! ```
//!
//! The types here only describe; `crate::lower` turns a spec into the op program the
//! autograd graph runs.

use serde::{Deserialize, Serialize};

/// The network being trained.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelSpec {
    /// A multilayer perceptron.
    Mlp(MlpSpec),
    /// A convolutional network over images.
    Cnn(CnnSpec),
    /// A transformer encoder or decoder.
    Transformer(TransformerSpec),
    /// A raw list of ops, for anything the other kinds cannot express.
    Layers(LayersSpec),
}

impl ModelSpec {
    /// The kind's TOML name (`mlp`, `cnn`, `transformer`, `layers`).
    pub fn kind_name(&self) -> &'static str {
        match self {
            ModelSpec::Mlp(_) => "mlp",
            ModelSpec::Cnn(_) => "cnn",
            ModelSpec::Transformer(_) => "transformer",
            ModelSpec::Layers(_) => "layers",
        }
    }
}

/// Element-wise activation functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    /// max(x, 0); backward needs its output (or a mask).
    #[default]
    Relu,
    /// GELU; backward needs its input.
    Gelu,
    /// SiLU / swish; backward needs its input.
    Silu,
    /// tanh; backward needs its output.
    Tanh,
    /// logistic sigmoid; backward needs its output.
    Sigmoid,
    /// GELU's tanh approximation composed of element-wise ops, as Hugging Face's `gelu_new`
    /// runs it (`0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`): backward keeps four tensors of
    /// the input's size (the input, tanh's output, `1 + tanh`, `0.5·x`).
    #[serde(rename = "gelu_new")]
    GeluNew,
}

/// Loss functions at the end of the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Loss {
    /// Mean squared error against a target of the output's shape.
    Mse,
    /// Cross-entropy over classes (log-softmax saved for backward).
    #[default]
    CrossEntropy,
}

/// A multilayer perceptron: `input → hidden[0] → ... → output`, activation between layers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MlpSpec {
    /// Input features per sample.
    pub input: u64,
    /// Hidden layer widths.
    #[serde(default)]
    pub hidden: Vec<u64>,
    /// Output features per sample.
    pub output: u64,
    /// Activation after each hidden layer.
    #[serde(default)]
    pub activation: Activation,
    /// Dropout probability after each activation (0 = no dropout op).
    #[serde(default)]
    pub dropout: f64,
    /// Whether linear layers have a bias.
    #[serde(default = "yes")]
    pub bias: bool,
    /// Loss at the end.
    #[serde(default = "mse")]
    pub loss: Loss,
}

fn yes() -> bool {
    true
}
fn mse() -> Loss {
    Loss::Mse
}

/// A CNN over `image = [channels, height, width]` with a classifier head.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CnnSpec {
    /// `[channels, height, width]` of one input image.
    pub image: [u64; 3],
    /// The layer stack, in order. A `linear` head to `classes` is appended after the last
    /// layer (flattening first if the stack did not).
    pub layers: Vec<CnnLayer>,
    /// Number of output classes.
    pub classes: u64,
    /// Loss at the end.
    #[serde(default)]
    pub loss: Loss,
}

/// The op of one CNN layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CnnOp {
    /// 2-D convolution (`out` channels, `kernel`, `stride`, `padding`).
    Conv,
    /// Batch normalisation over channels.
    BatchNorm,
    /// ReLU.
    Relu,
    /// GELU.
    Gelu,
    /// SiLU.
    Silu,
    /// Max pooling (`kernel`, `stride` defaulting to `kernel`).
    MaxPool,
    /// Average pooling (`kernel`, `stride` defaulting to `kernel`).
    AvgPool,
    /// Global average pooling to `[channels, 1, 1]`.
    GlobalAvgPool,
    /// Dropout with probability `p`.
    Dropout,
    /// Flatten to a vector (a view: no memory).
    Flatten,
    /// Fully connected layer to `out` features (flattens first if needed).
    Linear,
}

/// One layer of a CNN stack. Which fields apply depends on `op`; the plan validator rejects
/// fields that do not apply and missing ones that are required.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CnnLayer {
    /// The op.
    pub op: CnnOp,
    /// Output channels (`conv`) or features (`linear`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub out: Option<u64>,
    /// Kernel size (`conv`, `max_pool`, `avg_pool`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<u64>,
    /// Stride (default 1 for `conv`, `kernel` for pools).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stride: Option<u64>,
    /// Zero padding on each side (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub padding: Option<u64>,
    /// Dropout probability (`dropout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p: Option<f64>,
    /// Whether `conv`/`linear` have a bias (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bias: Option<bool>,
}

/// Encoder (bidirectional) or decoder (causal, language-model head).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum TransformerKind {
    /// Encoder with a classification head on the first token.
    Encoder,
    /// Decoder with a language-model head over the vocabulary at every position.
    #[default]
    Decoder,
}

/// Normalisation used in transformer blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum NormKind {
    /// LayerNorm (weight and bias; saves mean and rstd).
    #[default]
    LayerNorm,
    /// RMSNorm (weight; saves rstd).
    RmsNorm,
}

/// How attention is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum AttentionImpl {
    /// Matmul, softmax, dropout, matmul: saves the `heads × seq × seq` probabilities.
    #[default]
    Eager,
    /// A fused (flash-style) kernel: saves q, k, v, the output and one statistic per row.
    Fused,
}

/// A transformer encoder or decoder stack.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransformerSpec {
    /// Encoder or decoder.
    #[serde(default)]
    pub kind: TransformerKind,
    /// Number of blocks.
    pub layers: u64,
    /// Hidden size (model width).
    pub hidden: u64,
    /// Attention heads (must divide `hidden`).
    pub heads: u64,
    /// Key/value heads (grouped-query attention); default = `heads`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_heads: Option<u64>,
    /// Feed-forward inner size; default 4 × hidden.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ffn: Option<u64>,
    /// Gated feed-forward (SwiGLU-style: two input projections and an element-wise product).
    #[serde(default)]
    pub gated_ffn: bool,
    /// Sequence length in tokens.
    pub seq_len: u64,
    /// Vocabulary size.
    pub vocab: u64,
    /// Output head shares the embedding matrix.
    #[serde(default)]
    pub tied_embeddings: bool,
    /// Feed-forward activation.
    #[serde(default = "gelu")]
    pub activation: Activation,
    /// Normalisation.
    #[serde(default)]
    pub norm: NormKind,
    /// Dropout probability (0 = no dropout ops).
    #[serde(default)]
    pub dropout: f64,
    /// Attention implementation.
    #[serde(default)]
    pub attention: AttentionImpl,
    /// Learned absolute position embeddings (`seq_len × hidden` parameters).
    #[serde(default)]
    pub learned_positions: bool,
    /// Classes of the encoder's classification head (encoder only; default 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub classes: Option<u64>,
    /// Rows of the learned position table (the model's maximum positions, which can exceed
    /// the sequence trained on); default `seq_len`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_positions: Option<u64>,
    /// Biases on the blocks' linear layers; default: with layer norm, not with RMS norm (a
    /// layer norm's own bias follows the norm kind, not this).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bias: Option<bool>,
    /// Biases on the query, key and value projections alone; default `bias` (some decoders
    /// without biases keep them here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qkv_bias: Option<bool>,
    /// A norm after the last block; default: the framework's module layout decides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_norm: Option<bool>,
    /// A norm over the summed embeddings (encoders such as BERT).
    #[serde(default, skip_serializing_if = "is_false")]
    pub embedding_norm: bool,
    /// Rows of a token-type (segment) embedding added to the token embedding; 0 = none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub token_types: u64,
    /// A pooler before an encoder's classifier: a `hidden × hidden` linear layer with a bias
    /// and a tanh, applied to the first token.
    #[serde(default, skip_serializing_if = "is_false")]
    pub pooler: bool,
    /// The query, key and value projections are three linear layers reading the same input
    /// (BERT, LLaMA), not one fused projection (GPT-2's `c_attn`). The same parameters, and in
    /// f32 the same bytes; under autocast each of the three casts its input to half precision
    /// and keeps its copy for backward.
    #[serde(default, skip_serializing_if = "is_false")]
    pub separate_qkv: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn gelu() -> Activation {
    Activation::Gelu
}

impl TransformerSpec {
    /// A `kind` stack of `layers` blocks of width `hidden` with `heads` heads, at sequence
    /// `seq_len` over a vocabulary of `vocab`, with every other setting at its default (as a
    /// plan that names only these keys reads).
    pub fn new(
        kind: TransformerKind,
        layers: u64,
        hidden: u64,
        heads: u64,
        seq_len: u64,
        vocab: u64,
    ) -> TransformerSpec {
        TransformerSpec {
            kind,
            layers,
            hidden,
            heads,
            kv_heads: None,
            ffn: None,
            gated_ffn: false,
            seq_len,
            vocab,
            tied_embeddings: false,
            activation: gelu(),
            norm: NormKind::default(),
            dropout: 0.0,
            attention: AttentionImpl::default(),
            learned_positions: false,
            classes: None,
            max_positions: None,
            bias: None,
            qkv_bias: None,
            final_norm: None,
            embedding_norm: false,
            token_types: 0,
            pooler: false,
            separate_qkv: false,
        }
    }

    /// The feed-forward inner size.
    pub fn ffn_size(&self) -> u64 {
        self.ffn.unwrap_or(4 * self.hidden)
    }
    /// The key/value head count.
    pub fn kv_head_count(&self) -> u64 {
        self.kv_heads.unwrap_or(self.heads)
    }
    /// Whether the blocks' linear layers have biases.
    pub fn linear_bias(&self) -> bool {
        self.bias.unwrap_or(self.norm == NormKind::LayerNorm)
    }
    /// Whether the query, key and value projections have biases.
    pub fn qkv_has_bias(&self) -> bool {
        self.qkv_bias.unwrap_or_else(|| self.linear_bias())
    }
    /// Whether the norms have a bias (layer norm does, RMS norm does not).
    pub fn norm_bias(&self) -> bool {
        self.norm == NormKind::LayerNorm
    }
    /// Rows of the learned position table.
    pub fn position_rows(&self) -> u64 {
        self.max_positions.unwrap_or(self.seq_len)
    }
}

/// A raw list of ops. Each op reads the previous op's output (the first reads the input).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayersSpec {
    /// Shape of one input sample (without the batch dimension).
    pub input: Vec<u64>,
    /// The ops in order.
    pub layers: Vec<RawLayer>,
    /// Loss at the end.
    #[serde(default = "mse")]
    pub loss: Loss,
}

/// One op of a raw layer list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLayer {
    /// The op's name in the saved-tensor table (`linear`, `conv2d`, `relu`, `gelu`, `softmax`,
    /// `layer_norm`, `dropout`, `matmul`, `add`, `view`, ...; see `trainmem_autograd::OpKind`).
    pub op: String,
    /// Output shape per sample; default = the input shape.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub out: Option<Vec<u64>>,
    /// Element counts of the op's parameter tensors (e.g. `[in*out, out]` for a linear).
    #[serde(default)]
    pub params: Vec<u64>,
    /// For two-input ops (`add`, `mul`, `matmul`): the 0-based index of the earlier layer
    /// whose output is the second input (default: the previous layer's
    /// output is used for both inputs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub with: Option<usize>,
    /// A label for reports; default `op` and its index.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}
