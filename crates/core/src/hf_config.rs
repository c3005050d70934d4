//! Plans from the `config.json` a Hugging Face model ships with.
//!
//! [`plan_from_hf`] reads the architecture from the configuration a user already has (the file
//! `transformers` saves beside the weights) and writes a [`Plan`] under PyTorch's autograd
//! rules, so nobody re-types layer counts and widths by hand. The families read, by
//! `model_type`, each as the plan features that describe it (not a special case per family):
//!
//! | `model_type` | as | what the plan carries |
//! |---|---|---|
//! | `gpt2` | decoder | learned positions (`n_positions` rows), biases, layer norm, tied head, one packed query-key-value projection |
//! | `bert` | encoder classifier | token-type embeddings, embedding norm, pooler, `num_labels` classes, no final norm |
//! | `llama`, `mistral` | decoder | RMS norm, SwiGLU, grouped-query attention, biases per `attention_bias` and `mlp_bias` |
//! | `qwen2` | decoder | as LLaMA, with biases on the query, key and value projections |
//! | `opt` | decoder | learned positions with OPT's offset of 2 rows, biases, ReLU |
//! | `phi` | decoder | one layer norm feeding attention and feed-forward side by side (`block = "parallel_shared_norm"`), biases, a biased untied head |
//! | `phi3` | decoder | as LLaMA with packed `qkv_proj` and `gate_up_proj` (`fused_gate_up`) |
//! | `gpt_neox` | decoder | packed query-key-value, biases, parallel residual with two norms (`block = "parallel"`) |
//! | `stablelm` | decoder | layer norms, SwiGLU, biases on query, key and value (`use_qkv_bias`) |
//! | `gemma`, `gemma2`, `gemma3_text` | decoder | GeGLU, tied 256k-row embeddings, heads of `head_dim`; 2 and 3: norms on each sub-layer's output (`post_norms`); 2: soft-capped scores and logits; 3: norms over the heads' queries and keys (`qk_norm`) |
//! | `falcon` | decoder | packed multi-query projection, layer norm, attention beside the feed-forward, tied head |
//! | `mixtral` | decoder | as Mistral with a mixture of experts (`[model.transformer.moe]`: experts, top-k) |
//! | `qwen2_moe` | decoder | as Qwen2 with a mixture of experts and a gated shared expert |
//! | `starcoder2` | decoder | layer norm, grouped-query attention, biases, a plain feed-forward |
//! | `gptj` | decoder | one norm feeding attention and feed-forward side by side, feed-forward and head biases |
//! | `bloom` | decoder | embedding norm, packed query-key-value, biases, ALiBi (eager attention) |
//!
//! Rotary positions, full or partial, have no parameters and keep what the attention keeps
//! either way, so a plan has no field for them.
//!
//! Attention is written as `transformers` names it (`attn_implementation`): by default what
//! it picks for the family (`sdpa`; `eager` for BLOOM and Gemma 2, which have no other), or
//! [`HfOptions::attention`]. The simulator runs `sdpa` as the fused kernel on a GPU and, on a
//! CPU, as the math path (eager attention's tensors) when there is attention dropout.
//!
//! The parameter count of the plan equals the real model's for every configuration in the
//! workspace's `fixtures/hf/` (tests hold each). A missing field, an unknown `model_type`, or a
//! variant the plan cannot describe (OPT's projected embeddings, StableLM's per-head query
//! and key norms) is an [`HfConfigError`] naming the field.
//!
//! ```
//! use trainmem_core::hf_config::{HfOptions, plan_from_hf};
//! let config = r#"{"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12,
//!                  "vocab_size": 50257, "n_positions": 1024}"#;
//! let plan = plan_from_hf(config, &HfOptions::new(8, 1024))?;
//! assert_eq!(plan.training.batch_size, 8);
//! # Ok::<(), trainmem_core::hf_config::HfConfigError>(())
//! ```

use serde_json::Value;

use crate::model::{AttentionImpl, LoraSpec, ModelSpec, TransformerSpec};
use crate::optimizer::{OptimizerKind, StepImpl};
use crate::plan::{CheckpointPolicyKind, Plan, PlanError};
use crate::{Dtype, Framework};

mod families;
pub mod peft;

use families::Fields;
pub use peft::lora_target_of_module;

/// The `model_type`s [`plan_from_hf`] reads.
pub const FAMILIES: &[&str] = &[
    "gpt2",
    "bert",
    "llama",
    "mistral",
    "qwen2",
    "opt",
    "phi",
    "phi3",
    "gpt_neox",
    "stablelm",
    "gemma",
    "gemma2",
    "gemma3_text",
    "falcon",
    "mixtral",
    "qwen2_moe",
    "starcoder2",
    "gptj",
    "bloom",
];

/// How the plan trains the model.
#[derive(Debug, Clone, PartialEq)]
pub struct HfOptions {
    /// Samples per optimizer step.
    pub batch: u64,
    /// Tokens per sample.
    pub seq: u64,
    /// The optimizer (default AdamW).
    pub optimizer: OptimizerKind,
    /// How `torch.optim` runs the step; default what it picks for CUDA tensors
    /// ([`default_step_impl`]).
    pub optimizer_impl: Option<StepImpl>,
    /// The attention implementation (`transformers`' `attn_implementation`); default what
    /// `transformers` picks for the family.
    pub attention: Option<AttentionImpl>,
    /// Parameter and activation precision (default f32).
    pub precision: HfPrecision,
    /// Checkpoint every block's activations (Hugging Face's `gradient_checkpointing_enable`).
    pub checkpointing: bool,
    /// Optimizer steps to simulate (default 3: the first step's jump and the steady state).
    pub steps: u64,
    /// LoRA adapters on a frozen base (default none: every parameter trains). For a model
    /// whose query, key and value projections are one packed module (`gpt2`'s `c_attn`),
    /// `q`, `k` and `v` adapt that module as a whole, as peft does.
    pub lora: Option<LoraSpec>,
}

impl HfOptions {
    /// AdamW in f32, no checkpointing, 3 steps, at batch `batch` and sequence `seq`; the
    /// attention and optimizer implementations `transformers` and `torch.optim` pick.
    pub fn new(batch: u64, seq: u64) -> HfOptions {
        HfOptions {
            batch,
            seq,
            optimizer: OptimizerKind::AdamW,
            optimizer_impl: None,
            attention: None,
            precision: HfPrecision::F32,
            checkpointing: false,
            steps: 3,
            lora: None,
        }
    }
}

/// The step `torch.optim` (or the optimizer's own package) runs on CUDA tensors when not
/// told: `foreach` for SGD, momentum, Adam and AdamW (PyTorch's default once every
/// parameter is on a GPU), the for-loop for `transformers`' Adafactor, bitsandbytes' fused
/// kernel for its 8-bit AdamW.
pub fn default_step_impl(kind: OptimizerKind) -> StepImpl {
    match kind {
        OptimizerKind::Sgd
        | OptimizerKind::Momentum
        | OptimizerKind::Adam
        | OptimizerKind::AdamW => StepImpl::Foreach,
        OptimizerKind::Adafactor => StepImpl::ForLoop,
        OptimizerKind::AdamW8bit => StepImpl::Fused,
    }
}

/// The precision a plan from a configuration trains in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum HfPrecision {
    /// Everything in f32.
    #[default]
    F32,
    /// bf16 compute with f32 master weights.
    MixedBf16,
    /// fp16 compute with f32 master weights.
    MixedF16,
    /// Everything in bf16, no master weights (`model.to(torch.bfloat16)`): the optimizer
    /// state in bf16 too, as `torch.optim` keeps it in the parameters' dtype.
    Bf16,
    /// Everything in fp16, likewise.
    F16,
    /// `torch.autocast` to bf16: f32 parameters, gradients and optimizer state; bf16 copies
    /// of the weights and bf16 activations where autocast runs an op in bf16.
    AutocastBf16,
    /// `torch.autocast` to fp16, likewise.
    AutocastF16,
}

/// Why a configuration could not become a plan.
#[derive(Debug, thiserror::Error)]
pub enum HfConfigError {
    /// The text is not JSON.
    #[error("config.json does not parse")]
    Json(#[source] serde_json::Error),
    /// The text is JSON but not an object.
    #[error("config.json: the top level is not an object")]
    NotAnObject,
    /// `model_type` is missing or names a family this reader does not know.
    #[error("model_type {found}: trainmem reads {}", FAMILIES.join(", "))]
    UnknownModelType {
        /// What the file says (or `missing`).
        found: String,
    },
    /// A field the family needs is absent, or not a number where one is needed.
    #[error("{model_type} config: field `{field}` {problem}")]
    Field {
        /// The family.
        model_type: String,
        /// The field.
        field: String,
        /// What is wrong with it.
        problem: String,
    },
    /// The configuration describes a variant a plan cannot express.
    #[error("{model_type} config: {what}")]
    Unsupported {
        /// The family.
        model_type: String,
        /// What cannot be expressed, and which field says so.
        what: String,
    },
    /// The options do not fit the model (a sequence longer than its positions, a zero batch,
    /// an attention implementation the family does not have).
    #[error("{0}")]
    Options(String),
    /// A peft adapter configuration or a LoRA target that does not fit the model.
    #[error("{0}")]
    Peft(String),
    /// The assembled plan is not valid.
    #[error("the plan made from config.json is not valid")]
    Plan(#[source] PlanError),
}

/// The configuration as a JSON object and its `model_type`.
fn parse(config: &str) -> Result<(serde_json::Map<String, Value>, String), HfConfigError> {
    let value: Value = serde_json::from_str(config).map_err(HfConfigError::Json)?;
    let Value::Object(map) = value else {
        return Err(HfConfigError::NotAnObject);
    };
    let model_type = match map.get("model_type") {
        Some(Value::String(s)) => s.clone(),
        Some(other) => {
            return Err(HfConfigError::UnknownModelType {
                found: other.to_string(),
            });
        }
        None => {
            return Err(HfConfigError::UnknownModelType {
                found: "missing".into(),
            });
        }
    };
    Ok((map, model_type))
}

/// The `model_type` of a configuration.
pub fn model_type_of(config: &str) -> Result<String, HfConfigError> {
    parse(config).map(|(_, t)| t)
}

/// The attention implementations `transformers` has for `model_type` (the first is its
/// default).
fn attention_impls(model_type: &str) -> &'static [AttentionImpl] {
    use AttentionImpl::*;
    match model_type {
        "bloom" => &[Eager],
        "gemma2" => &[Eager, FlashAttention2],
        _ => &[Sdpa, Eager, FlashAttention2],
    }
}

/// The model a configuration describes, trained at sequence length `seq`, with the attention
/// implementation `transformers` picks for it.
pub fn model_from_hf(config: &str, seq: u64) -> Result<TransformerSpec, HfConfigError> {
    let (map, model_type) = parse(config)?;
    let f = Fields {
        model_type: &model_type,
        map: &map,
    };
    // a quantized checkpoint (QLoRA's 4-bit base, GPTQ, AWQ) stores its frozen weights in
    // fewer bits than any dtype a plan has: planned as written it would be wrong, not close
    if let Some(q) = map.get("quantization_config").filter(|q| !q.is_null()) {
        let method = q
            .get("quant_method")
            .and_then(Value::as_str)
            .unwrap_or("unnamed");
        let bits = ["load_in_4bit", "load_in_8bit"]
            .into_iter()
            .find(|k| q.get(*k).and_then(Value::as_bool) == Some(true))
            .map(|k| format!(", {k}"))
            .or_else(|| q.get("bits").map(|b| format!(", {b} bits")))
            .unwrap_or_default();
        return Err(f.unsupported(format!(
            "`quantization_config` ({method}{bits}): a quantized base is not modelled (its \
             weights take fewer bits than any dtype a plan has); remove the field from a copy \
             of config.json to plan the model unquantized"
        )));
    }
    let mut t = match model_type.as_str() {
        "gpt2" => families::gpt2(&f)?,
        "bert" => families::bert(&f)?,
        "llama" | "mistral" | "qwen2" | "gemma" | "gemma2" | "gemma3_text" | "mixtral"
        | "qwen2_moe" => families::llama_like(&f)?,
        "opt" => families::opt(&f)?,
        "phi" => families::phi(&f)?,
        "phi3" => families::phi3(&f)?,
        "gpt_neox" => families::gpt_neox(&f)?,
        "stablelm" => families::stablelm(&f)?,
        "falcon" => families::falcon(&f)?,
        "starcoder2" => families::starcoder2(&f)?,
        "gptj" => families::gptj(&f)?,
        "bloom" => families::bloom(&f)?,
        "gemma3" => {
            return Err(f.unsupported(
                "the multimodal Gemma 3 (its vision tower is not modelled): give the \
                 `text_config` part as a config of its own with model_type `gemma3_text`",
            ));
        }
        other => {
            return Err(HfConfigError::UnknownModelType {
                found: format!("`{other}`"),
            });
        }
    };
    if t.head_dim.is_none() && t.hidden % t.heads != 0 {
        return Err(f.unsupported(format!(
            "{} heads do not divide the hidden size {}",
            t.heads, t.hidden
        )));
    }
    if t.heads % t.kv_head_count() != 0 {
        return Err(f.unsupported(format!(
            "{} key/value heads do not divide the {} heads",
            t.kv_head_count(),
            t.heads
        )));
    }
    if let Some(rows) = t.max_positions {
        // OPT's two offset rows are not positions a sequence can use.
        let usable = if model_type == "opt" { rows - 2 } else { rows };
        if seq > usable {
            return Err(HfConfigError::Options(format!(
                "sequence {seq} is longer than the model's {usable} positions"
            )));
        }
    }
    t.seq_len = seq;
    t.attention = attention_impls(&model_type)[0];
    // a sliding window (unless `use_sliding_window` turns it off), on every layer or all
    // but every n-th (Gemma 2 alternates; Gemma 3's `sliding_window_pattern`)
    if map.get("use_sliding_window").and_then(Value::as_bool) != Some(false) {
        t.sliding_window = f.opt_count("sliding_window")?;
        t.global_every = match model_type.as_str() {
            "gemma2" => Some(2),
            "gemma3_text" => Some(f.opt_count("sliding_window_pattern")?.unwrap_or(6)),
            _ => None,
        };
    }
    // the decoders keep a key/value cache in training unless their configuration says
    // `use_cache: false`
    if map.get("use_cache").and_then(Value::as_bool) == Some(false) {
        t.kv_cache = Some(false);
    }
    Ok(t)
}

/// A plan training the model `config` describes, as `opts` asks, under PyTorch's rules.
pub fn plan_from_hf(config: &str, opts: &HfOptions) -> Result<Plan, HfConfigError> {
    if opts.batch == 0 || opts.seq == 0 || opts.steps == 0 {
        return Err(HfConfigError::Options(
            "batch, sequence and steps must be at least 1".into(),
        ));
    }
    let mut model = model_from_hf(config, opts.seq)?;
    let model_type = model_type_of(config)?;
    if let Some(attention) = opts.attention {
        let known = attention_impls(&model_type);
        if !known.contains(&attention) && attention != AttentionImpl::Fused {
            let names: Vec<_> = known.iter().map(|a| a.name()).collect();
            return Err(HfConfigError::Options(format!(
                "attn_implementation {}: transformers runs {model_type} with {}",
                attention.name(),
                names.join(" or ")
            )));
        }
        model.attention = attention;
    }
    let mut plan = Plan::from_toml_str("[model.mlp]\ninput = 1\nhidden = []\noutput = 1\n")
        .map_err(HfConfigError::Plan)?;
    plan.framework = Framework::Pytorch;
    plan.model = ModelSpec::Transformer(model);
    plan.training.batch_size = opts.batch;
    plan.training.epochs = 1;
    plan.training.steps_per_epoch = Some(opts.steps);
    plan.data.samples = opts.batch * opts.steps;
    plan.loader.workers = 0;
    plan.optimizer.kind = opts.optimizer;
    plan.optimizer.implementation = opts
        .optimizer_impl
        .unwrap_or_else(|| default_step_impl(opts.optimizer));
    let (compute, master) = match opts.precision {
        HfPrecision::F32 => (Dtype::F32, false),
        HfPrecision::MixedBf16 => (Dtype::Bf16, true),
        HfPrecision::MixedF16 => (Dtype::F16, true),
        HfPrecision::Bf16 => (Dtype::Bf16, false),
        HfPrecision::F16 => (Dtype::F16, false),
        HfPrecision::AutocastBf16 | HfPrecision::AutocastF16 => (Dtype::F32, false),
    };
    plan.precision.compute = compute;
    plan.precision.master_weights = master;
    // `torch.optim` keeps its state in each parameter's dtype: f32 beside f32 (or master)
    // weights, half precision when the model itself was cast to it
    plan.optimizer.state_dtype = if master { Dtype::F32 } else { compute };
    plan.precision.autocast = match opts.precision {
        HfPrecision::AutocastBf16 => Some(Dtype::Bf16),
        HfPrecision::AutocastF16 => Some(Dtype::F16),
        _ => None,
    };
    if opts.checkpointing {
        // Hugging Face checkpoints each block on its own.
        plan.checkpointing.policy = CheckpointPolicyKind::Every;
        plan.checkpointing.every = Some(1);
    }
    if let (Some(lora), ModelSpec::Transformer(t)) = (&opts.lora, &mut plan.model) {
        t.lora = Some(peft::lora_for(t, lora));
    }
    if opts.optimizer == OptimizerKind::AdamW8bit && plan.optimizer.state_dtype != Dtype::F32 {
        // bitsandbytes keeps its own state dtypes whatever the parameters'
        plan.optimizer.state_dtype = Dtype::F32;
    }
    plan.validate().map_err(HfConfigError::Plan)?;
    Ok(plan)
}

#[cfg(test)]
mod tests;
