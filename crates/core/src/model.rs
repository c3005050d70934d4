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
//! [model.transformer.lora]         # optional: LoRA adapters on a frozen base
//! rank = 8
//! alpha = 16.0
//! targets = ["q", "v"]             # q, k, v, qkv (a packed projection), o, up, gate, down,
//!                                  # gate_up (a packed gate and input projection)
//! dropout = 0.05                   # on the adapters' input
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
// a plan holds one model: the transformer's size beside the others' costs nothing
#[allow(clippy::large_enum_variant)]
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

/// How attention is computed. `sdpa` and `flash_attention_2` are the names `transformers`
/// gives its implementations (`attn_implementation`); the kernel they run depends on the
/// device, which [`AttentionImpl::kernel`] decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "snake_case")]
pub enum AttentionImpl {
    /// Matmul, softmax, dropout, matmul: saves the `heads × seq × seq` probabilities.
    #[default]
    Eager,
    /// A fused (flash-style) kernel: saves q, k, v, the output and one statistic per row.
    #[cfg_attr(feature = "clap", value(skip))]
    Fused,
    /// PyTorch's `scaled_dot_product_attention` (`transformers`' `sdpa`): a fused kernel
    /// (flash or memory-efficient) on a GPU, with or without dropout; on a CPU the fused
    /// kernel without dropout and the math path (eager attention's tensors) with it.
    Sdpa,
    /// The `flash-attn` package's kernel (`flash_attention_2`, CUDA only): fused, dropout
    /// included.
    #[serde(rename = "flash_attention_2")]
    #[cfg_attr(feature = "clap", value(name = "flash_attention_2"))]
    FlashAttention2,
}

impl AttentionImpl {
    /// The name in a plan (`eager`, `fused`, `sdpa`, `flash_attention_2`).
    pub fn name(self) -> &'static str {
        match self {
            AttentionImpl::Eager => "eager",
            AttentionImpl::Fused => "fused",
            AttentionImpl::Sdpa => "sdpa",
            AttentionImpl::FlashAttention2 => "flash_attention_2",
        }
    }

    /// The kernel that runs on a GPU (`gpu`) or a CPU, with attention dropout or without,
    /// for f32 queries with grouped keys and values handed to SDPA as they are (`f32_gqa`,
    /// `enable_gqa`) or not:
    /// [`AttentionImpl::Eager`] or [`AttentionImpl::Fused`].
    ///
    /// On a GPU, PyTorch's SDPA has no fused kernel for f32 grouped-query attention (its
    /// flash kernel takes half precision only, its memory-efficient kernel no `enable_gqa`),
    /// so it runs the math kernel, which saves what the eager attention saves (measured on an
    /// H100: LLaMA's activations with `sdpa` equal `eager`'s to the byte).
    pub fn kernel(self, gpu: bool, dropout: bool, f32_gqa: bool) -> AttentionImpl {
        match self {
            AttentionImpl::Eager => AttentionImpl::Eager,
            AttentionImpl::Fused | AttentionImpl::FlashAttention2 => AttentionImpl::Fused,
            AttentionImpl::Sdpa if !gpu && dropout => AttentionImpl::Eager,
            AttentionImpl::Sdpa if gpu && f32_gqa => AttentionImpl::Eager,
            AttentionImpl::Sdpa => AttentionImpl::Fused,
        }
    }
}

/// How a block arranges attention and the feed-forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum BlockLayout {
    /// Attention, then the feed-forward on the attention's residual sum, each after its own
    /// norm (GPT-2, LLaMA).
    #[default]
    Sequential,
    /// Attention and the feed-forward both read the block's input, each through its own
    /// norm, and their outputs are added to it together (GPT-NeoX's parallel residual).
    Parallel,
    /// As `parallel`, with one norm whose output both read (GPT-J, Phi, Falcon-7B).
    ParallelSharedNorm,
}

/// A mixture of experts in place of each block's feed-forward: a router (`hidden ×
/// experts`, no bias) picks `top_k` experts per token, and each expert is a feed-forward of
/// its own (gated when the model's is). The experts' weights are kept as `transformers`
/// keeps them: one tensor of every expert's (packed, when gated) input projections and one
/// of their output projections per block.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MoeSpec {
    /// Experts per block.
    pub experts: u64,
    /// Experts each token is routed to.
    pub top_k: u64,
    /// Each expert's inner size; default the model's `ffn`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expert_ffn: Option<u64>,
    /// The inner size of a shared expert every token passes through (Qwen-MoE), none by
    /// default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_expert_ffn: Option<u64>,
    /// A sigmoid gate (`hidden × 1`) on the shared expert's output.
    #[serde(default, skip_serializing_if = "is_false")]
    pub shared_expert_gate: bool,
    /// The top-k routing weights are divided by their sum (Mixtral always; Qwen2-MoE with
    /// `norm_topk_prob`): `transformers` divides in place, which keeps a copy of the weights
    /// and their sum per token for backward.
    #[serde(default, skip_serializing_if = "is_false")]
    pub normalize_top_k: bool,
    /// Capacity factor: each expert processes `capacity_factor × tokens × top_k / experts`
    /// rows (padded or dropped to that); default none, as `transformers` routes (every
    /// routed token, no padding).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_factor: Option<f64>,
}

impl MoeSpec {
    /// Rows the experts process together per `tokens` tokens: `tokens × top_k`, or under a
    /// capacity factor `experts × ⌈capacity_factor × tokens × top_k / experts⌉`.
    /// Saturates at `u64::MAX` when the rows do not fit 64 bits
    /// ([`MoeSpec::checked_routed_rows`] says when).
    pub fn routed_rows(&self, tokens: u64) -> u64 {
        self.checked_routed_rows(tokens).unwrap_or(u64::MAX)
    }

    /// [`MoeSpec::routed_rows`], `None` when the rows do not fit 64 bits.
    pub fn checked_routed_rows(&self, tokens: u64) -> Option<u64> {
        let routed = tokens.checked_mul(self.top_k)?;
        match self.capacity_factor {
            None => Some(routed),
            Some(c) => {
                let per_expert = (c * routed as f64 / self.experts.max(1) as f64).ceil();
                // 2^64: the first f64 a u64 cannot hold (`as` would saturate)
                if per_expert.is_nan() || per_expert >= 18_446_744_073_709_551_616.0 {
                    return None;
                }
                (per_expert as u64).checked_mul(self.experts)
            }
        }
    }
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
    /// Dropout probability on the embeddings and on each sub-layer's output (0 = no dropout
    /// ops), and on the attention's probabilities unless [`attention_dropout`] says otherwise.
    ///
    /// [`attention_dropout`]: TransformerSpec::attention_dropout
    #[serde(default)]
    pub dropout: f64,
    /// Dropout probability on the attention's probabilities (`attention_dropout`,
    /// `attn_pdrop`), when it differs from [`dropout`]: OPT and Phi drop their residuals but
    /// not their attention. Default: `dropout`.
    ///
    /// [`dropout`]: TransformerSpec::dropout
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention_dropout: Option<f64>,
    /// Eager attention computes its softmax in f32 and casts the probabilities back to the
    /// model's dtype (`softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)`, as
    /// `transformers`' LLaMA-style families and BLOOM write it): in a half-precision model
    /// both the f32 probabilities and their half copy are kept for backward. Default:
    /// `transformers`' models do; GPT-2, GPT-J, Falcon and BERT (softmax in the scores'
    /// dtype) and other implementations do not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub softmax_f32: Option<bool>,
    /// The RMS norms multiply their weight in f32 before casting back to the model's dtype
    /// (Gemma's `(1 + weight.float())`): in a half-precision model the normalized input the
    /// weight's gradient reads is kept in f32.
    #[serde(default, skip_serializing_if = "is_false")]
    pub norm_weight_f32: bool,
    /// Rotary positions over part of each head, the rotated part concatenated with the
    /// unrotated one into new queries and keys laid out head by head (GPT-NeoX's
    /// `rotary_pct`, Phi's and StableLM's `partial_rotary_factor` below 1): a fused attention
    /// kernel lays its output out as its queries are, so returning it to the tokens' layout
    /// copies it.
    #[serde(default, skip_serializing_if = "is_false")]
    pub partial_rotary: bool,
    /// The attention's window: each position attends to at most this many before it
    /// (Mistral's, Phi-3's `sliding_window`). A layer whose window is shorter than the
    /// sequence hands the attention a materialized mask.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sliding_window: Option<u64>,
    /// Every n-th layer attends to the whole sequence, the others within
    /// [`sliding_window`] (Gemma 2's 2, Gemma 3's `sliding_window_pattern`, 6). Default:
    /// every layer uses the window.
    ///
    /// [`sliding_window`]: TransformerSpec::sliding_window
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global_every: Option<u64>,
    /// Every layer hands the attention a materialized causal mask (Falcon's code does,
    /// `allow_is_causal_skip=False`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub materialized_mask: bool,
    /// Eager attention repeats grouped keys and values to every query head first
    /// (`transformers`' `repeat_kv`: two new tensors of the queries' width, kept by the
    /// matmuls). Default: `transformers`' models do; Falcon's code lets the matmul broadcast
    /// them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repeat_kv: Option<bool>,
    /// Positions as ALiBi's per-head biases on the attention scores (BLOOM): no position
    /// embeddings and no rotation, so the queries and keys stay views of their projection;
    /// BLOOM's eager attention (`baddbmm`, `bmm`) reads them as they are.
    #[serde(default, skip_serializing_if = "is_false")]
    pub alibi: bool,
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
    /// Biases on the blocks' linear layers (the attention's output projection, and the
    /// feed-forward's unless `ffn_bias` says otherwise); default: with layer norm, not with
    /// RMS norm (a layer norm's own bias follows the norm kind, not this).
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
    /// (Hugging Face's LLaMA, BERT, OPT) rather than one packed matrix (GPT-2's `c_attn`):
    /// the same elements, and in f32 the same activations, but three weights (and biases),
    /// which an optimizer that factors its state by matrix (Adafactor) sizes differently;
    /// under autocast each of the three casts its input to half precision and keeps its copy
    /// for backward.
    #[serde(default, skip_serializing_if = "is_false")]
    pub separate_qkv: bool,
    /// Width of one attention head; default `hidden / heads`. The queries are `heads ×
    /// head_dim` wide, the keys and values `kv_heads × head_dim`, and the attention output
    /// projection maps the queries' width back to `hidden` (Gemma's heads are wider than
    /// `hidden / heads`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<u64>,
    /// How attention and the feed-forward are arranged in a block.
    #[serde(default, skip_serializing_if = "is_sequential")]
    pub block: BlockLayout,
    /// Biases on the feed-forward's linear layers; default `bias`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ffn_bias: Option<bool>,
    /// A bias on a decoder's language-model head; default: the framework's module layout
    /// decides (none under PyTorch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_bias: Option<bool>,
    /// A norm on the attention's output and one on the feed-forward's output, each before
    /// its residual sum, beside the norms on their inputs (Gemma 2 and 3: four per block).
    #[serde(default, skip_serializing_if = "is_false")]
    pub post_norms: bool,
    /// A norm over each head's queries and one over its keys (weights of `head_dim`
    /// elements shared by the heads), of the model's norm kind (Gemma 3, Phi's
    /// `qk_layernorm`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub qk_norm: bool,
    /// A gated feed-forward's gate and input projections are one packed matrix (`hidden →
    /// 2 × ffn`; Phi-3's `gate_up_proj`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub fused_gate_up: bool,
    /// Soft-capping of the logits (`cap · tanh(logits / cap)`, Gemma 2): three
    /// logits-sized tensors, tanh's output kept for backward.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logit_softcap: Option<f64>,
    /// Soft-capping of eager attention's scores, likewise over `heads × seq × seq` (Gemma 2;
    /// fused kernels take it inside).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attn_softcap: Option<f64>,
    /// A mixture of experts in place of each block's feed-forward
    /// (`[model.transformer.moe]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe: Option<MoeSpec>,
    /// LoRA adapters (`[model.transformer.lora]`): every parameter of the model above is
    /// frozen, and the adapters are the only trainable parameters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora: Option<LoraSpec>,
    /// Whose code the model runs: `transformers`' modules (the default), a hand-written
    /// model of plain tensor ops (`handwritten`) or litgpt's (`litgpt`). Same parameters;
    /// what forward keeps differs ([`Implementation`]).
    #[serde(default, skip_serializing_if = "Implementation::is_default")]
    pub implementation: Implementation,
    /// Each block keeps a causal mask of `max_positions × max_positions` booleans as a
    /// buffer on the device (`transformers`' GPT-2 registers one per attention module, the
    /// hand-written GPT of trainmem's validation suite one per block): device memory from
    /// construction on that is neither a parameter nor an activation. Default: a
    /// hand-written model keeps one, `transformers`' and litgpt's do not unless set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mask_buffer: Option<bool>,
    /// Positions per chunk of the LM head and its loss (litgpt's `lm_head_chunk_size`):
    /// backward makes the loss's gradients one chunk at a time. `0`: the head at once.
    /// Default: 128 for litgpt's models under LoRA (its LoRA fine-tuning script chunks the
    /// head), none otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_chunk: Option<u64>,
    /// The model keeps a key/value cache while it trains (`transformers`' `use_cache`, on
    /// in its decoders' configurations unless set off): each block copies its keys and
    /// values into the cache, and a fused attention kernel keeps those copies. Where the
    /// queries are views of a packed projection (no rotary positions to make new ones),
    /// the kernel keeps the packed projection beside them. Default: `transformers`'
    /// decoders do, other models do not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache: Option<bool>,
}

/// Positions per chunk of the LM head in litgpt's LoRA fine-tuning (`finetune/lora.py` calls
/// the model with `lm_head_chunk_size=128`).
pub const LITGPT_LORA_HEAD_CHUNK: u64 = 128;

/// Whose code runs a transformer: the parameters are the plan's either way, the tensors
/// forward keeps for backward are not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Implementation {
    /// `transformers`' modules: `torch.nn.functional`'s layer norm and softmax, an RMS norm
    /// composed in f32 (`x.to(float32)`, then back to the model's dtype), the logits upcast
    /// to f32 before a decoder's loss.
    #[default]
    Transformers,
    /// A model written by hand in the style of nanoGPT's `model.py` and the course models
    /// built like it: its layer norm composed of plain tensor ops (`x − mean`, `(x −
    /// mean)²`, `rsqrt`, products: the centered and the normalized input kept), its eager
    /// attention's softmax likewise (`max`, `exp`, `sum`, a division: `exp`'s output kept
    /// beside the probabilities), the loss `F.cross_entropy` on the logits as they are.
    Handwritten,
    /// litgpt's models (`litgpt.model.GPT`): attention through
    /// `scaled_dot_product_attention` on the rotated queries and keys (new tensors) with the
    /// keys and values repeated to every query head, its output copied back to the hidden
    /// layout; the loss `chunked_cross_entropy` of the shifted logits.
    Litgpt,
}

impl Implementation {
    /// The plan's default (`transformers`).
    pub fn is_default(&self) -> bool {
        *self == Implementation::Transformers
    }

    /// Whether the model's code takes half-precision tensors to f32 around its RMS norms
    /// and its loss (`transformers`' do; a hand-written model need not).
    pub fn hf_upcasts(self) -> bool {
        self != Implementation::Handwritten
    }
}

/// A projection of a transformer block that a LoRA adapter can be put on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LoraTarget {
    /// The query projection (`hidden → hidden`; LLaMA's `q_proj`).
    Q,
    /// The key projection (`hidden → key/value width`).
    K,
    /// The value projection (`hidden → key/value width`).
    V,
    /// The packed query, key and value projection as one module (GPT-2's `c_attn`).
    Qkv,
    /// The attention output projection (`o_proj`, GPT-2's `attn.c_proj`).
    O,
    /// The feed-forward input projection (`up_proj`, GPT-2's `c_fc`).
    Up,
    /// The gate projection of a gated feed-forward (`gate_proj`).
    Gate,
    /// The feed-forward output projection (`down_proj`, GPT-2's `mlp.c_proj`).
    Down,
    /// The packed gate and input projection as one module (Phi-3's `gate_up_proj`).
    GateUp,
}

impl LoraTarget {
    /// The target's name in a plan.
    pub fn name(self) -> &'static str {
        match self {
            LoraTarget::Q => "q",
            LoraTarget::K => "k",
            LoraTarget::V => "v",
            LoraTarget::Qkv => "qkv",
            LoraTarget::O => "o",
            LoraTarget::Up => "up",
            LoraTarget::Gate => "gate",
            LoraTarget::Down => "down",
            LoraTarget::GateUp => "gate_up",
        }
    }

    /// The target named `name` in a plan (`None` when no target has it).
    pub fn from_name(name: &str) -> Option<LoraTarget> {
        [
            LoraTarget::Q,
            LoraTarget::K,
            LoraTarget::V,
            LoraTarget::Qkv,
            LoraTarget::O,
            LoraTarget::Up,
            LoraTarget::Gate,
            LoraTarget::Down,
            LoraTarget::GateUp,
        ]
        .into_iter()
        .find(|t| t.name() == name)
    }
}

/// LoRA (low-rank adaptation) as peft applies it: the base model frozen, and beside each
/// targeted projection `W` (`in → out`) an adapter `B·A` with `A` of `rank × in` and `B` of
/// `out × rank` (no biases), added to the projection's output scaled by `alpha / rank`, with
/// dropout on the adapter's input when `dropout > 0`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoraSpec {
    /// The adapters' rank `r`.
    pub rank: u64,
    /// The scaling numerator (`alpha / rank` scales the adapter's output); no effect on
    /// memory. Default: the rank.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alpha: Option<f64>,
    /// The projections adapted in every block; default `["q", "v"]`.
    #[serde(default = "default_lora_targets")]
    pub targets: Vec<LoraTarget>,
    /// Dropout probability on the adapters' input (0 = none).
    #[serde(default)]
    pub dropout: f64,
}

fn default_lora_targets() -> Vec<LoraTarget> {
    vec![LoraTarget::Q, LoraTarget::V]
}

impl LoraSpec {
    /// Rank `rank` on the query and value projections, no dropout.
    pub fn new(rank: u64) -> LoraSpec {
        LoraSpec {
            rank,
            alpha: None,
            targets: default_lora_targets(),
            dropout: 0.0,
        }
    }

    /// Why the adapters cannot be put on `t` (a zero rank, a target twice, `qkv` beside `q`,
    /// `k` or `v`, `gate` without a gated feed-forward, a dropout outside [0, 1)).
    pub fn check(&self, t: &TransformerSpec) -> Result<(), String> {
        if self.rank == 0 {
            return Err("lora.rank must be at least 1".into());
        }
        if self.targets.is_empty() {
            return Err("lora.targets names no projection".into());
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(format!("lora.dropout {} is not in [0, 1)", self.dropout));
        }
        for (i, a) in self.targets.iter().enumerate() {
            if self.targets[..i].contains(a) {
                return Err(format!("lora.targets names `{}` twice", a.name()));
            }
        }
        let has = |x| self.targets.contains(&x);
        if has(LoraTarget::Qkv) && (has(LoraTarget::Q) || has(LoraTarget::K) || has(LoraTarget::V))
        {
            return Err(
                "lora.targets: `qkv` adapts the packed projection; it cannot be combined with \
                 `q`, `k` or `v`"
                    .into(),
            );
        }
        if has(LoraTarget::Gate) && !t.gated_ffn {
            return Err("lora.targets: `gate` needs a gated feed-forward (gated_ffn)".into());
        }
        if t.fused_gate_up && (has(LoraTarget::Gate) || has(LoraTarget::Up)) {
            return Err(
                "lora.targets: the gate and input projections are one packed matrix \
                 (fused_gate_up): adapt them as `gate_up`"
                    .into(),
            );
        }
        if has(LoraTarget::GateUp) && !t.fused_gate_up {
            return Err(
                "lora.targets: `gate_up` needs a packed gate and input projection \
                 (fused_gate_up)"
                    .into(),
            );
        }
        if t.moe.is_some()
            && self.targets.iter().any(|x| {
                matches!(
                    x,
                    LoraTarget::Up | LoraTarget::Gate | LoraTarget::Down | LoraTarget::GateUp
                )
            })
        {
            return Err(
                "lora.targets: adapters on a mixture of experts' feed-forward are not \
                 modelled (adapt the attention's projections)"
                    .into(),
            );
        }
        Ok(())
    }

    /// `(in, out)` of the projection `target` of a block of `t`; a width that does not fit
    /// 64 bits saturates at `u64::MAX` (a validated plan's fit; [`LoraSpec::checked_dims`]
    /// says when).
    pub fn dims(t: &TransformerSpec, target: LoraTarget) -> (u64, u64) {
        Self::checked_dims(t, target).unwrap_or((u64::MAX, u64::MAX))
    }

    /// [`LoraSpec::dims`], `None` when a width does not fit 64 bits.
    pub fn checked_dims(t: &TransformerSpec, target: LoraTarget) -> Option<(u64, u64)> {
        let (h, f) = (t.hidden, t.checked_ffn_size()?);
        let (q, kv) = (t.checked_q_width()?, t.checked_kv_width()?);
        Some(match target {
            LoraTarget::Q => (h, q),
            LoraTarget::O => (q, h),
            LoraTarget::K | LoraTarget::V => (h, kv),
            LoraTarget::Qkv => (h, q.checked_add(kv.checked_mul(2)?)?),
            LoraTarget::Up | LoraTarget::Gate => (h, f),
            LoraTarget::GateUp => (h, f.checked_mul(2)?),
            LoraTarget::Down => (f, h),
        })
    }
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn is_sequential(b: &BlockLayout) -> bool {
    *b == BlockLayout::Sequential
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
            head_dim: None,
            block: BlockLayout::Sequential,
            ffn_bias: None,
            head_bias: None,
            post_norms: false,
            qk_norm: false,
            fused_gate_up: false,
            logit_softcap: None,
            attn_softcap: None,
            moe: None,
            lora: None,
            implementation: Implementation::Transformers,
            mask_buffer: None,
            head_chunk: None,
            kv_cache: None,
            attention_dropout: None,
            softmax_f32: None,
            norm_weight_f32: false,
            partial_rotary: false,
            sliding_window: None,
            global_every: None,
            materialized_mask: false,
            repeat_kv: None,
            alibi: false,
        }
    }

    /// Whether layer `i` hands its attention a materialized mask: the model always does
    /// ([`materialized_mask`]), or the layer's window is shorter than the sequence
    /// ([`sliding_window`]). A fused kernel then cannot be flash attention: the
    /// memory-efficient kernel takes the mask as an additive bias in the queries' dtype,
    /// one value per query and key position, and keeps it for backward.
    ///
    /// [`materialized_mask`]: TransformerSpec::materialized_mask
    /// [`sliding_window`]: TransformerSpec::sliding_window
    pub fn masked_attention(&self, i: u64) -> bool {
        let sliding = match self.global_every {
            Some(n) if n > 0 => !(i + 1).is_multiple_of(n),
            _ => true,
        };
        self.materialized_mask || (sliding && self.sliding_window.is_some_and(|w| w < self.seq_len))
    }

    /// Whether eager attention computes its softmax in f32 ([`softmax_f32`]).
    ///
    /// [`softmax_f32`]: TransformerSpec::softmax_f32
    pub fn eager_softmax_in_f32(&self) -> bool {
        self.softmax_f32
            .unwrap_or(self.implementation == Implementation::Transformers)
    }

    /// The dropout probability on the attention's probabilities ([`attention_dropout`]).
    ///
    /// [`attention_dropout`]: TransformerSpec::attention_dropout
    pub fn attention_dropout_p(&self) -> f64 {
        self.attention_dropout.unwrap_or(self.dropout)
    }

    /// The feed-forward inner size.
    ///
    /// Saturates at `u64::MAX` when `4 × hidden` does not fit 64 bits (a validated plan's
    /// does; [`TransformerSpec::checked_ffn_size`] says when).
    pub fn ffn_size(&self) -> u64 {
        self.checked_ffn_size().unwrap_or(u64::MAX)
    }
    /// [`TransformerSpec::ffn_size`], `None` when it does not fit 64 bits.
    pub fn checked_ffn_size(&self) -> Option<u64> {
        match self.ffn {
            Some(f) => Some(f),
            None => self.hidden.checked_mul(4),
        }
    }
    /// The key/value head count.
    pub fn kv_head_count(&self) -> u64 {
        self.kv_heads.unwrap_or(self.heads)
    }
    /// Width of one attention head (`head_dim`, default `hidden / heads`; 0 without heads).
    pub fn head_size(&self) -> u64 {
        self.head_dim
            .unwrap_or_else(|| self.hidden.checked_div(self.heads).unwrap_or(0))
    }
    /// Width of the queries (and of the attention's output): `heads × head_size`.
    /// Saturates at `u64::MAX` when it does not fit 64 bits (a validated plan's does;
    /// [`TransformerSpec::checked_q_width`] says when).
    pub fn q_width(&self) -> u64 {
        self.checked_q_width().unwrap_or(u64::MAX)
    }
    /// [`TransformerSpec::q_width`], `None` when it does not fit 64 bits.
    pub fn checked_q_width(&self) -> Option<u64> {
        self.heads.checked_mul(self.head_size())
    }
    /// Width of the keys (and of the values): `kv_heads × head_size`. Saturates at
    /// `u64::MAX` when it does not fit 64 bits (a validated plan's does;
    /// [`TransformerSpec::checked_kv_width`] says when).
    pub fn kv_width(&self) -> u64 {
        self.checked_kv_width().unwrap_or(u64::MAX)
    }
    /// [`TransformerSpec::kv_width`], `None` when it does not fit 64 bits.
    pub fn checked_kv_width(&self) -> Option<u64> {
        self.kv_head_count().checked_mul(self.head_size())
    }
    /// Whether the feed-forward's linear layers have biases.
    pub fn ffn_has_bias(&self) -> bool {
        self.ffn_bias.unwrap_or_else(|| self.linear_bias())
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

    /// Positions per chunk of the LM head and its loss ([`head_chunk`]), `None` when the
    /// head runs at once (no chunking, or chunks as long as the sequence).
    ///
    /// [`head_chunk`]: TransformerSpec::head_chunk
    pub fn head_chunk_positions(&self) -> Option<u64> {
        let chunk = match self.head_chunk {
            Some(c) => c,
            None if self.implementation == Implementation::Litgpt && self.lora.is_some() => {
                LITGPT_LORA_HEAD_CHUNK
            }
            None => 0,
        };
        (chunk > 0 && chunk < self.seq_len).then_some(chunk)
    }

    /// Whether the model's code takes its logits to f32 before the loss: `transformers`'
    /// causal-LM loss does (`logits.float()`); its classification heads, litgpt's and
    /// hand-written models hand their logits to `cross_entropy` as they are.
    pub fn upcasts_logits(&self) -> bool {
        self.implementation == Implementation::Transformers && self.kind == TransformerKind::Decoder
    }

    /// Whether the model keeps a key/value cache while it trains ([`kv_cache`]).
    ///
    /// [`kv_cache`]: TransformerSpec::kv_cache
    pub fn keeps_kv_cache(&self) -> bool {
        self.kv_cache.unwrap_or(
            self.implementation == Implementation::Transformers
                && self.kind == TransformerKind::Decoder,
        )
    }

    /// Whether a fused attention kernel keeps copies of the keys and values beside the
    /// packed projection their views would keep alive: a key/value cache ([`kv_cache`]) on a
    /// packed projection whose queries stay views of it (learned or ALiBi positions: no
    /// rotation; no norms over the heads). BLOOM's eager attention keeps them too
    /// ([`alibi`]).
    ///
    /// [`kv_cache`]: TransformerSpec::kv_cache
    /// [`alibi`]: TransformerSpec::alibi
    pub fn attention_keeps_cache_copies(&self) -> bool {
        self.keeps_kv_cache()
            && !self.separate_qkv
            && (self.learned_positions || self.alibi)
            && !self.qk_norm
    }

    /// Bytes of the causal-mask buffers the model keeps on its device ([`mask_buffer`]):
    /// one bool per position pair and block, or 0.
    ///
    /// [`mask_buffer`]: TransformerSpec::mask_buffer
    pub fn mask_buffer_bytes(&self) -> u64 {
        let keeps = self
            .mask_buffer
            .unwrap_or(self.implementation == Implementation::Handwritten);
        if keeps {
            self.layers * self.position_rows() * self.position_rows()
        } else {
            0
        }
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
    /// `layer_norm`, `dropout`, `matmul`, `add`, `view`, ...; see `trainmem_core::OpKind`).
    pub op: String,
    /// Output shape per sample; default = the input shape.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub out: Option<Vec<u64>>,
    /// Element counts of the op's parameter tensors (e.g. `[in*out, out]` for a linear).
    #[serde(default)]
    pub params: Vec<u64>,
    /// For two-input ops (`add`, `mul`, `matmul`): the 0-based index of the earlier layer
    /// whose output is the second input (default: the first input is used for both).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub with: Option<usize>,
    /// The 0-based index of the earlier layer whose output this op reads (default: the
    /// previous layer's): a residual network's shortcut projection reads its block's input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<usize>,
    /// A label for reports; default `op` and its index.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decoder(seq: u64) -> TransformerSpec {
        TransformerSpec::new(TransformerKind::Decoder, 2, 64, 4, seq, 100)
    }

    #[test]
    fn the_head_is_chunked_by_litgpts_lora_script_or_as_set() {
        let mut t = decoder(1024);
        assert_eq!(
            t.head_chunk_positions(),
            None,
            "transformers: the head at once"
        );
        t.implementation = Implementation::Litgpt;
        assert_eq!(t.head_chunk_positions(), None, "litgpt's full fine-tune");
        t.lora = Some(LoraSpec::new(8));
        assert_eq!(t.head_chunk_positions(), Some(LITGPT_LORA_HEAD_CHUNK));
        t.head_chunk = Some(0);
        assert_eq!(t.head_chunk_positions(), None, "0 turns it off");
        t.head_chunk = Some(256);
        assert_eq!(t.head_chunk_positions(), Some(256));
        t.head_chunk = Some(1024);
        assert_eq!(t.head_chunk_positions(), None, "one chunk is no chunking");
        let mut short = decoder(64);
        short.implementation = Implementation::Litgpt;
        short.lora = Some(LoraSpec::new(8));
        assert_eq!(
            short.head_chunk_positions(),
            None,
            "64 positions: one chunk"
        );
    }
}
