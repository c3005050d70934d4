//! Plans from the `config.json` a Hugging Face model ships with.
//!
//! [`plan_from_hf`] reads the architecture from the configuration a user already has (the file
//! `transformers` saves beside the weights) and writes a [`Plan`] under PyTorch's autograd
//! rules, so nobody re-types layer counts and widths by hand. The families read, by
//! `model_type`:
//!
//! | `model_type` | as | what the plan carries |
//! |---|---|---|
//! | `gpt2` | decoder | learned positions (`n_positions` rows), biases, layer norm, tied head, one packed query-key-value projection (the others have three) |
//! | `bert` | encoder classifier | token-type embeddings, embedding norm, pooler, `num_labels` classes, no final norm |
//! | `llama`, `mistral` | decoder | RMS norm, SwiGLU, grouped-query attention, no biases (`attention_bias`) |
//! | `qwen2` | decoder | as LLaMA, with biases on the query, key and value projections |
//! | `opt` | decoder | learned positions with OPT's offset of 2 rows, biases, ReLU |
//!
//! Attention is the fused kernel (`attention = "fused"`) when the model has no attention
//! dropout, eager otherwise: `transformers` calls PyTorch's `scaled_dot_product_attention`,
//! which takes a fused kernel when there is no dropout and, with dropout in training on the
//! CPU, its math path (scores, softmax and dropout kept as eager attention keeps them).
//!
//! The parameter count of the plan equals the real model's: 124,439,808 for `gpt2`,
//! 109,483,778 for `bert-base-uncased` as a two-label classifier, 6,738,415,616 for
//! LLaMA-2-7B (tests hold each). A missing field, an unknown `model_type`, or a variant the plan
//! cannot describe (OPT's projected embeddings, a head size other than hidden / heads) is an
//! [`HfConfigError`] naming the field.
//!
//! ```
//! use trainmem_core::hf_config::{HfOptions, plan_from_hf};
//! let config = r#"{"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12,
//!                  "vocab_size": 50257, "n_positions": 1024}"#;
//! let plan = plan_from_hf(config, &HfOptions::new(8, 1024))?;
//! assert_eq!(plan.training.batch_size, 8);
//! # Ok::<(), trainmem_core::hf_config::HfConfigError>(())
//! ```

use serde_json::{Map, Value};

use crate::model::{
    Activation, AttentionImpl, LoraSpec, LoraTarget, ModelSpec, NormKind, TransformerKind,
    TransformerSpec,
};
use crate::optimizer::OptimizerKind;
use crate::plan::{CheckpointPolicyKind, Plan, PlanError};
use crate::{Dtype, Framework};

/// The `model_type`s [`plan_from_hf`] reads.
pub const FAMILIES: &[&str] = &["gpt2", "bert", "llama", "mistral", "qwen2", "opt"];

/// How the plan trains the model.
#[derive(Debug, Clone, PartialEq)]
pub struct HfOptions {
    /// Samples per optimizer step.
    pub batch: u64,
    /// Tokens per sample.
    pub seq: u64,
    /// The optimizer (default AdamW).
    pub optimizer: OptimizerKind,
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
    /// AdamW in f32, no checkpointing, 3 steps, at batch `batch` and sequence `seq`.
    pub fn new(batch: u64, seq: u64) -> HfOptions {
        HfOptions {
            batch,
            seq,
            optimizer: OptimizerKind::AdamW,
            precision: HfPrecision::F32,
            checkpointing: false,
            steps: 3,
            lora: None,
        }
    }
}

/// The precision a plan from a configuration trains in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HfPrecision {
    /// Everything in f32.
    #[default]
    F32,
    /// bf16 compute with f32 master weights.
    MixedBf16,
    /// fp16 compute with f32 master weights.
    MixedF16,
    /// Everything in bf16 (no master weights).
    Bf16,
    /// `torch.autocast` to bf16: f32 parameters, gradients and optimizer state; bf16 copies
    /// of the weights and bf16 activations where autocast runs an op in bf16.
    AutocastBf16,
    /// `torch.autocast` to fp16, likewise.
    AutocastF16,
}

/// Why a configuration could not become a plan.
#[derive(Debug, thiserror::Error)]
pub enum HfConfigError {
    /// The text is not JSON, or not a JSON object.
    #[error("config.json does not parse: {0}")]
    Json(String),
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
    /// The options do not fit the model (a sequence longer than its positions, a zero batch).
    #[error("{0}")]
    Options(String),
    /// The assembled plan is not valid.
    #[error("the plan made from config.json is not valid")]
    Plan(#[source] PlanError),
}

/// Reads one family's fields, naming the family in every error.
struct Fields<'a> {
    model_type: &'a str,
    map: &'a Map<String, Value>,
}

impl Fields<'_> {
    fn field_error(&self, field: &str, problem: impl Into<String>) -> HfConfigError {
        HfConfigError::Field {
            model_type: self.model_type.to_string(),
            field: field.to_string(),
            problem: problem.into(),
        }
    }

    /// A positive integer that must be present.
    fn count(&self, field: &str) -> Result<u64, HfConfigError> {
        self.opt_count(field)?
            .ok_or_else(|| self.field_error(field, "is missing"))
    }

    /// A positive integer, or `None` when absent or null.
    fn opt_count(&self, field: &str) -> Result<Option<u64>, HfConfigError> {
        match self.map.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if n > 0 => Ok(Some(n)),
                _ => Err(self.field_error(field, format!("must be a positive integer, not {v}"))),
            },
        }
    }

    /// A boolean, `default` when absent.
    fn flag(&self, field: &str, default: bool) -> Result<bool, HfConfigError> {
        match self.map.get(field) {
            None | Some(Value::Null) => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => Err(self.field_error(field, format!("must be true or false, not {v}"))),
        }
    }

    /// A probability in [0, 1), 0 when absent.
    fn dropout(&self, field: &str) -> Result<f64, HfConfigError> {
        match self.map.get(field) {
            None | Some(Value::Null) => Ok(0.0),
            Some(v) => match v.as_f64() {
                Some(p) if (0.0..1.0).contains(&p) => Ok(p),
                _ => Err(self.field_error(field, format!("must be in [0, 1), not {v}"))),
            },
        }
    }

    /// An activation by its `transformers` name.
    fn activation(&self, field: &str, default: Activation) -> Result<Activation, HfConfigError> {
        let Some(v) = self.map.get(field) else {
            return Ok(default);
        };
        match v.as_str() {
            Some("gelu" | "gelu_pytorch_tanh") => Ok(Activation::Gelu),
            Some("gelu_new") => Ok(Activation::GeluNew),
            Some("relu") => Ok(Activation::Relu),
            Some("silu" | "swish") => Ok(Activation::Silu),
            Some("tanh") => Ok(Activation::Tanh),
            Some("sigmoid") => Ok(Activation::Sigmoid),
            _ => Err(self.field_error(
                field,
                format!("names an activation trainmem does not model: {v}"),
            )),
        }
    }

    /// A `kind` stack from the field names most families share (`num_hidden_layers`,
    /// `hidden_size`, `num_attention_heads`, `vocab_size`); the sequence is set later.
    fn standard(&self, kind: TransformerKind) -> Result<TransformerSpec, HfConfigError> {
        Ok(TransformerSpec::new(
            kind,
            self.count("num_hidden_layers")?,
            self.count("hidden_size")?,
            self.count("num_attention_heads")?,
            1,
            self.count("vocab_size")?,
        ))
    }

    fn unsupported(&self, what: impl Into<String>) -> HfConfigError {
        HfConfigError::Unsupported {
            model_type: self.model_type.to_string(),
            what: what.into(),
        }
    }
}

fn gpt2(f: &Fields<'_>) -> Result<TransformerSpec, HfConfigError> {
    let mut t = TransformerSpec::new(
        TransformerKind::Decoder,
        f.count("n_layer")?,
        f.count("n_embd")?,
        f.count("n_head")?,
        1,
        f.count("vocab_size")?,
    );
    t.ffn = f.opt_count("n_inner")?;
    t.activation = f.activation("activation_function", Activation::Gelu)?;
    t.tied_embeddings = f.flag("tie_word_embeddings", true)?;
    t.learned_positions = true;
    t.max_positions = Some(match f.opt_count("n_positions")? {
        Some(n) => n,
        None => f.count("n_ctx")?,
    });
    t.bias = Some(true);
    t.final_norm = Some(true);
    t.dropout = f.dropout("resid_pdrop")?;
    Ok(t)
}

fn bert(f: &Fields<'_>) -> Result<TransformerSpec, HfConfigError> {
    let mut t = f.standard(TransformerKind::Encoder)?;
    t.ffn = Some(f.count("intermediate_size")?);
    t.activation = f.activation("hidden_act", Activation::Gelu)?;
    t.learned_positions = true;
    t.max_positions = Some(f.count("max_position_embeddings")?);
    t.token_types = f.opt_count("type_vocab_size")?.unwrap_or(2);
    t.embedding_norm = true;
    t.separate_qkv = true;
    t.pooler = true;
    t.separate_qkv = true;
    t.final_norm = Some(false);
    t.bias = Some(true);
    t.dropout = f.dropout("hidden_dropout_prob")?;
    let labels = match f.map.get("id2label") {
        Some(Value::Object(m)) if !m.is_empty() => Some(m.len() as u64),
        _ => None,
    };
    t.classes = Some(f.opt_count("num_labels")?.or(labels).unwrap_or(2));
    Ok(t)
}

/// LLaMA, Mistral and Qwen2: RMS norm, SwiGLU, grouped-query attention, rotary positions.
fn llama_like(f: &Fields<'_>) -> Result<TransformerSpec, HfConfigError> {
    let mut t = f.standard(TransformerKind::Decoder)?;
    if let Some(head_dim) = f.opt_count("head_dim")?
        && head_dim * t.heads != t.hidden
    {
        return Err(f.unsupported(format!(
            "head_dim {head_dim} × {} heads is not hidden_size {}: a plan's heads split the \
             hidden size",
            t.heads, t.hidden
        )));
    }
    t.kv_heads = f.opt_count("num_key_value_heads")?;
    t.ffn = Some(f.count("intermediate_size")?);
    t.separate_qkv = true;
    t.gated_ffn = true;
    t.separate_qkv = true;
    t.activation = f.activation("hidden_act", Activation::Silu)?;
    t.norm = NormKind::RmsNorm;
    t.tied_embeddings = f.flag("tie_word_embeddings", false)?;
    t.final_norm = Some(true);
    let attention_bias = f.flag("attention_bias", f.model_type == "qwen2")?;
    if f.flag("mlp_bias", false)? {
        return Err(f.unsupported(
            "mlp_bias = true: a plan gives the feed-forward the same bias setting as the \
             attention output projection",
        ));
    }
    t.bias = Some(false);
    t.qkv_bias = Some(attention_bias);
    if f.model_type != "qwen2" && attention_bias {
        // LLaMA's attention_bias puts a bias on the output projection as well.
        return Err(f.unsupported(
            "attention_bias = true: a bias on the output projection but not on the \
             feed-forward is not expressible in a plan",
        ));
    }
    t.dropout = f.dropout("attention_dropout")?;
    if t.dropout == 0.0 {
        t.attention = crate::model::AttentionImpl::Fused;
    }
    Ok(t)
}

fn opt(f: &Fields<'_>) -> Result<TransformerSpec, HfConfigError> {
    let mut t = f.standard(TransformerKind::Decoder)?;
    if let Some(proj) = f.opt_count("word_embed_proj_dim")?
        && proj != t.hidden
    {
        return Err(f.unsupported(format!(
            "word_embed_proj_dim {proj} differs from hidden_size {}: the projections in and \
             out of the embedding width are not modelled",
            t.hidden
        )));
    }
    if !f.flag("do_layer_norm_before", true)? {
        return Err(
            f.unsupported("do_layer_norm_before = false: post-norm blocks are not modelled")
        );
    }
    t.ffn = Some(f.count("ffn_dim")?);
    t.separate_qkv = true;
    t.activation = f.activation("activation_function", Activation::Relu)?;
    t.separate_qkv = true;
    t.learned_positions = true;
    // OPT's learned position table carries two extra rows (its position offset).
    t.max_positions = Some(f.count("max_position_embeddings")? + 2);
    t.tied_embeddings = f.flag("tie_word_embeddings", true)?;
    t.bias = Some(f.flag("enable_bias", true)?);
    t.final_norm = Some(!f.flag("_remove_final_layer_norm", false)?);
    t.dropout = f.dropout("dropout")?;
    Ok(t)
}

/// The model a configuration describes, trained at sequence length `seq`.
pub fn model_from_hf(config: &str, seq: u64) -> Result<TransformerSpec, HfConfigError> {
    let value: Value =
        serde_json::from_str(config).map_err(|e| HfConfigError::Json(e.to_string()))?;
    let Value::Object(map) = &value else {
        return Err(HfConfigError::Json("the top level is not an object".into()));
    };
    let model_type = match map.get("model_type") {
        Some(Value::String(s)) => s.as_str(),
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
    let f = Fields { model_type, map };
    let mut t = match model_type {
        "gpt2" => gpt2(&f)?,
        "bert" => bert(&f)?,
        "llama" | "mistral" | "qwen2" => llama_like(&f)?,
        "opt" => opt(&f)?,
        other => {
            return Err(HfConfigError::UnknownModelType {
                found: format!("`{other}`"),
            });
        }
    };
    if t.hidden % t.heads != 0 {
        return Err(f.unsupported(format!(
            "{} heads do not divide the hidden size {}",
            t.heads, t.hidden
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
    if t.dropout == 0.0 {
        t.attention = AttentionImpl::Fused;
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
    let model = model_from_hf(config, opts.seq)?;
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
    let (compute, master) = match opts.precision {
        HfPrecision::F32 => (Dtype::F32, false),
        HfPrecision::MixedBf16 => (Dtype::Bf16, true),
        HfPrecision::MixedF16 => (Dtype::F16, true),
        HfPrecision::Bf16 => (Dtype::Bf16, false),
        HfPrecision::AutocastBf16 | HfPrecision::AutocastF16 => (Dtype::F32, false),
    };
    plan.precision.compute = compute;
    plan.precision.master_weights = master;
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
        t.lora = Some(lora_for(config, lora)?);
    }
    plan.validate().map_err(HfConfigError::Plan)?;
    Ok(plan)
}

/// The projection a peft `target_modules` name (`q_proj`, `c_attn`, ...) stands for in a
/// block of the family `model_type` (`None` when the name is not one of its projections).
pub fn lora_target_of_module(model_type: &str, module: &str) -> Option<LoraTarget> {
    let t = match (model_type, module) {
        ("gpt2", "c_attn") => LoraTarget::Qkv,
        ("gpt2", "c_fc") => LoraTarget::Up,
        // GPT-2's `c_proj` names both the attention output and the feed-forward output
        ("gpt2", "attn.c_proj") => LoraTarget::O,
        ("gpt2", "mlp.c_proj") => LoraTarget::Down,
        ("bert", "query") => LoraTarget::Q,
        ("bert", "key") => LoraTarget::K,
        ("bert", "value") => LoraTarget::V,
        ("bert", "attention.output.dense") => LoraTarget::O,
        ("bert", "intermediate.dense") => LoraTarget::Up,
        ("opt", "fc1") => LoraTarget::Up,
        ("opt", "fc2") => LoraTarget::Down,
        ("opt", "out_proj") => LoraTarget::O,
        (_, "q_proj") => LoraTarget::Q,
        (_, "k_proj") => LoraTarget::K,
        (_, "v_proj") => LoraTarget::V,
        (_, "o_proj") => LoraTarget::O,
        (_, "gate_proj") => LoraTarget::Gate,
        (_, "up_proj") => LoraTarget::Up,
        (_, "down_proj") => LoraTarget::Down,
        _ => return None,
    };
    Some(t)
}

/// `lora` as the model of `config` runs it: GPT-2's packed projection takes the adapters of
/// any of `q`, `k`, `v` as one.
fn lora_for(config: &str, lora: &LoraSpec) -> Result<LoraSpec, HfConfigError> {
    let value: Value =
        serde_json::from_str(config).map_err(|e| HfConfigError::Json(e.to_string()))?;
    let packed = value.get("model_type").and_then(Value::as_str) == Some("gpt2");
    let mut out = lora.clone();
    if packed {
        let mut targets = Vec::new();
        for &t in &lora.targets {
            let t = match t {
                LoraTarget::Q | LoraTarget::K | LoraTarget::V => LoraTarget::Qkv,
                other => other,
            };
            if !targets.contains(&t) {
                targets.push(t);
            }
        }
        out.targets = targets;
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
