//! Each family's fields, read into a [`TransformerSpec`]: which `config.json` keys say
//! what, and the module layout `transformers` builds from them.

use serde_json::{Map, Value};

use super::HfConfigError;
use crate::model::{
    Activation, AttentionImpl, BlockLayout, MoeSpec, NormKind, TransformerKind, TransformerSpec,
};

/// Reads one family's fields, naming the family in every error.
pub(super) struct Fields<'a> {
    pub(super) model_type: &'a str,
    pub(super) map: &'a Map<String, Value>,
}

impl Fields<'_> {
    pub(super) fn field_error(&self, field: &str, problem: impl Into<String>) -> HfConfigError {
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
    pub(super) fn opt_count(&self, field: &str) -> Result<Option<u64>, HfConfigError> {
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

    /// A positive number, or `None` when absent or null.
    fn opt_positive(&self, field: &str) -> Result<Option<f64>, HfConfigError> {
        match self.map.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => match v.as_f64() {
                Some(x) if x > 0.0 && x.is_finite() => Ok(Some(x)),
                _ => Err(self.field_error(field, format!("must be a positive number, not {v}"))),
            },
        }
    }

    /// The first of `fields` that is present, as a positive integer.
    fn count_of(&self, fields: &[&str]) -> Result<u64, HfConfigError> {
        for field in fields {
            if let Some(n) = self.opt_count(field)? {
                return Ok(n);
            }
        }
        Err(self.field_error(fields[0], "is missing"))
    }

    /// An activation by its `transformers` name.
    fn activation(&self, field: &str, default: Activation) -> Result<Activation, HfConfigError> {
        let Some(v) = self.map.get(field) else {
            return Ok(default);
        };
        match v.as_str() {
            Some("gelu" | "gelu_pytorch_tanh" | "gelu_fast" | "gelu_python") => {
                Ok(Activation::Gelu)
            }
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

    pub(super) fn unsupported(&self, what: impl Into<String>) -> HfConfigError {
        HfConfigError::Unsupported {
            model_type: self.model_type.to_string(),
            what: what.into(),
        }
    }
}

pub(super) fn gpt2(f: &Fields<'_>) -> Result<TransformerSpec, HfConfigError> {
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
    t.attention_dropout = Some(f.dropout("attn_pdrop")?);
    // `GPT2Attention` registers its causal mask (`bias`, n_positions² booleans) as a
    // buffer, whatever the attention implementation
    t.mask_buffer = Some(true);
    // eager attention's softmax in the scores' dtype
    t.softmax_f32 = Some(false);
    Ok(t)
}

pub(super) fn bert(f: &Fields<'_>) -> Result<TransformerSpec, HfConfigError> {
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
    t.attention_dropout = Some(f.dropout("attention_probs_dropout_prob")?);
    let labels = match f.map.get("id2label") {
        Some(Value::Object(m)) if !m.is_empty() => Some(m.len() as u64),
        _ => None,
    };
    t.classes = Some(f.opt_count("num_labels")?.or(labels).unwrap_or(2));
    // eager attention's softmax in the scores' dtype
    t.softmax_f32 = Some(false);
    Ok(t)
}

pub(super) fn opt(f: &Fields<'_>) -> Result<TransformerSpec, HfConfigError> {
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
    t.attention_dropout = Some(f.dropout("attention_dropout")?);
    Ok(t)
}

/// Heads of `head_dim` when the configuration gives a width other than `hidden / heads`.
fn head_dim(f: &Fields<'_>, t: &mut TransformerSpec) -> Result<(), HfConfigError> {
    if let Some(d) = f.opt_count("head_dim")?
        && d * t.heads != t.hidden
    {
        t.head_dim = Some(d);
    }
    Ok(())
}

/// The decoders built like LLaMA: RMS norm, a gated feed-forward, grouped-query attention,
/// three projections for the query, key and value, rotary positions. Mistral, Qwen2 (biases
/// on the query, key and value), Gemma 1, 2 and 3 (wider heads, tied embeddings; 2 and 3 with
/// norms on the sub-layers' outputs, 2 with soft-capping, 3 with norms over the heads'
/// queries and keys), Mixtral and Qwen2-MoE (mixtures of experts).
pub(super) fn llama_like(f: &Fields<'_>) -> Result<TransformerSpec, HfConfigError> {
    let ty = f.model_type;
    let gemma = ty.starts_with("gemma");
    let mut t = f.standard(TransformerKind::Decoder)?;
    head_dim(f, &mut t)?;
    t.kv_heads = f.opt_count("num_key_value_heads")?;
    t.ffn = Some(f.count("intermediate_size")?);
    t.separate_qkv = true;
    t.gated_ffn = true;
    t.activation = if gemma && f.map.contains_key("hidden_activation") {
        f.activation("hidden_activation", Activation::Gelu)?
    } else {
        f.activation(
            "hidden_act",
            if gemma {
                Activation::Gelu
            } else {
                Activation::Silu
            },
        )?
    };
    t.norm = NormKind::RmsNorm;
    t.tied_embeddings = f.flag("tie_word_embeddings", gemma)?;
    t.final_norm = Some(true);
    llama_like_biases(f, &mut t)?;
    if matches!(ty, "gemma2" | "gemma3_text") {
        t.post_norms = true;
        t.attn_softcap = f.opt_positive("attn_logit_softcapping")?;
        t.logit_softcap = f.opt_positive("final_logit_softcapping")?;
    }
    t.qk_norm = ty == "gemma3_text";
    t.norm_weight_f32 = gemma;
    llama_like_moe(f, &mut t)?;
    // no dropout on the residuals: only on the attention's probabilities
    t.dropout = 0.0;
    t.attention_dropout = Some(f.dropout("attention_dropout")?);
    Ok(t)
}

/// The biases of a LLaMA-like decoder's attention and feed-forward projections.
fn llama_like_biases(f: &Fields<'_>, t: &mut TransformerSpec) -> Result<(), HfConfigError> {
    match f.model_type {
        // the query, key and value projections carry biases, the output projection none
        "qwen2" => t.qkv_bias = Some(f.flag("attention_bias", true)?),
        "qwen2_moe" => t.qkv_bias = Some(f.flag("qkv_bias", true)?),
        // `attention_bias` puts biases on all four attention projections, `mlp_bias` on the
        // feed-forward's
        _ => {
            let attention_bias = f.flag("attention_bias", false)?;
            t.bias = Some(attention_bias);
            t.qkv_bias = Some(attention_bias);
        }
    }
    t.bias.get_or_insert(false);
    t.ffn_bias = Some(f.flag("mlp_bias", false)?);
    Ok(())
}

/// The mixture of experts of Mixtral and Qwen2-MoE.
fn llama_like_moe(f: &Fields<'_>, t: &mut TransformerSpec) -> Result<(), HfConfigError> {
    match f.model_type {
        "mixtral" => {
            t.moe = Some(MoeSpec {
                experts: f.count("num_local_experts")?,
                top_k: f.count("num_experts_per_tok")?,
                expert_ffn: None,
                shared_expert_ffn: None,
                shared_expert_gate: false,
                normalize_top_k: true,
                capacity_factor: None,
            });
        }
        "qwen2_moe" => {
            if f.opt_count("decoder_sparse_step")?.unwrap_or(1) != 1 {
                return Err(f.unsupported(
                    "decoder_sparse_step other than 1: dense blocks between sparse ones are \
                     not modelled (every block of a plan is alike)",
                ));
            }
            if let Some(Value::Array(layers)) = f.map.get("mlp_only_layers")
                && !layers.is_empty()
            {
                return Err(f.unsupported(
                    "mlp_only_layers: dense blocks among sparse ones are not modelled (every \
                     block of a plan is alike)",
                ));
            }
            let shared = f.count("shared_expert_intermediate_size")?;
            t.moe = Some(MoeSpec {
                experts: f.count("num_experts")?,
                top_k: f.count("num_experts_per_tok")?,
                expert_ffn: Some(f.count("moe_intermediate_size")?),
                shared_expert_ffn: Some(shared),
                shared_expert_gate: true,
                normalize_top_k: f.flag("norm_topk_prob", false)?,
                capacity_factor: None,
            });
        }
        _ => {}
    }
    Ok(())
}

/// Phi-1, Phi-1.5 and Phi-2: one layer norm feeding attention and the feed-forward side by
/// side, biases everywhere (the head's too), partial rotary positions, an untied head.
pub(super) fn phi(f: &Fields<'_>) -> Result<TransformerSpec, HfConfigError> {
    let mut t = f.standard(TransformerKind::Decoder)?;
    t.kv_heads = f.opt_count("num_key_value_heads")?;
    t.ffn = Some(f.count("intermediate_size")?);
    t.separate_qkv = true;
    t.activation = f.activation("hidden_act", Activation::GeluNew)?;
    t.block = BlockLayout::ParallelSharedNorm;
    t.qk_norm = f.flag("qk_layernorm", false)?;
    t.bias = Some(true);
    t.head_bias = Some(true);
    t.final_norm = Some(true);
    t.tied_embeddings = f.flag("tie_word_embeddings", false)?;
    t.dropout = f.dropout("resid_pdrop")?;
    t.attention_dropout = Some(f.dropout("attention_dropout")?);
    // rotary positions over part of each head (0.5 unless the config says)
    t.partial_rotary = f.opt_positive("partial_rotary_factor")?.unwrap_or(0.5) < 1.0;
    Ok(t)
}

/// Phi-3: as LLaMA with the query, key and value in one packed projection (`qkv_proj`) and
/// the gate and input projections in another (`gate_up_proj`).
pub(super) fn phi3(f: &Fields<'_>) -> Result<TransformerSpec, HfConfigError> {
    let mut t = f.standard(TransformerKind::Decoder)?;
    t.kv_heads = f.opt_count("num_key_value_heads")?;
    t.ffn = Some(f.count("intermediate_size")?);
    t.gated_ffn = true;
    t.fused_gate_up = true;
    t.activation = f.activation("hidden_act", Activation::Silu)?;
    t.norm = NormKind::RmsNorm;
    let attention_bias = f.flag("attention_bias", false)?;
    t.bias = Some(attention_bias);
    t.qkv_bias = Some(attention_bias);
    t.ffn_bias = Some(false);
    t.final_norm = Some(true);
    t.tied_embeddings = f.flag("tie_word_embeddings", false)?;
    t.dropout = f.dropout("resid_pdrop")?;
    t.attention_dropout = Some(f.dropout("attention_dropout")?);
    Ok(t)
}

/// GPT-NeoX and Pythia: one packed query-key-value projection, biases, layer norm, partial
/// rotary positions, and the parallel residual (attention and feed-forward side by side,
/// each with its own norm) unless `use_parallel_residual` is false.
pub(super) fn gpt_neox(f: &Fields<'_>) -> Result<TransformerSpec, HfConfigError> {
    let mut t = f.standard(TransformerKind::Decoder)?;
    t.ffn = Some(f.count("intermediate_size")?);
    t.activation = f.activation("hidden_act", Activation::Gelu)?;
    if f.flag("use_parallel_residual", true)? {
        t.block = BlockLayout::Parallel;
    }
    t.bias = Some(f.flag("attention_bias", true)?);
    t.ffn_bias = Some(true);
    t.final_norm = Some(true);
    t.tied_embeddings = f.flag("tie_word_embeddings", false)?;
    t.dropout = f.dropout("hidden_dropout")?;
    t.attention_dropout = Some(f.dropout("attention_dropout")?);
    // rotary positions over part of each head (0.25 unless the config says)
    t.partial_rotary = f.opt_positive("rotary_pct")?.unwrap_or(0.25) < 1.0;
    Ok(t)
}

/// StableLM (1 and 2): layer norms, a gated feed-forward without biases, biases on the
/// query, key and value when `use_qkv_bias`, partial rotary positions; with
/// `use_parallel_residual` one norm feeding attention and feed-forward side by side.
pub(super) fn stablelm(f: &Fields<'_>) -> Result<TransformerSpec, HfConfigError> {
    let mut t = f.standard(TransformerKind::Decoder)?;
    t.kv_heads = f.opt_count("num_key_value_heads")?;
    t.ffn = Some(f.count("intermediate_size")?);
    t.separate_qkv = true;
    t.gated_ffn = true;
    t.activation = f.activation("hidden_act", Activation::Silu)?;
    if f.flag("qk_layernorm", false)? {
        return Err(f.unsupported(
            "qk_layernorm = true: StableLM's norms over queries and keys have weights per \
             head, which a plan's `qk_norm` (one weight shared by the heads) does not express",
        ));
    }
    if f.flag("use_parallel_residual", false)? {
        t.block = BlockLayout::ParallelSharedNorm;
    }
    t.bias = Some(false);
    t.qkv_bias = Some(f.flag("use_qkv_bias", false)?);
    t.final_norm = Some(true);
    t.tied_embeddings = f.flag("tie_word_embeddings", false)?;
    t.dropout = f.dropout("hidden_dropout")?;
    t.attention_dropout = Some(f.dropout("attention_dropout")?);
    // rotary positions over part of each head (0.25 unless the config says)
    t.partial_rotary = f.opt_positive("partial_rotary_factor")?.unwrap_or(0.25) < 1.0;
    Ok(t)
}

/// Falcon: one packed query-key-value projection (multi-query: one key/value head; the new
/// decoder architecture: `num_kv_heads`), layer norms, biases when `bias`, a tied head, and
/// attention beside the feed-forward when `parallel_attn` (one norm; two in the new
/// architecture).
pub(super) fn falcon(f: &Fields<'_>) -> Result<TransformerSpec, HfConfigError> {
    let mut t = TransformerSpec::new(
        TransformerKind::Decoder,
        f.count_of(&["num_hidden_layers", "n_layer"])?,
        f.count("hidden_size")?,
        f.count_of(&["num_attention_heads", "n_head"])?,
        1,
        f.count("vocab_size")?,
    );
    let new_arch = f.flag("new_decoder_architecture", false)?;
    t.kv_heads = if new_arch {
        Some(f.count_of(&["num_kv_heads", "n_head_kv"])?)
    } else if f.flag("multi_query", true)? {
        Some(1)
    } else {
        None
    };
    t.ffn = f.opt_count("ffn_hidden_size")?;
    t.activation = Activation::Gelu;
    let parallel = f.flag("parallel_attn", true)?;
    t.block = match (parallel || new_arch, new_arch) {
        (false, _) => BlockLayout::Sequential,
        (true, true) => match f.opt_count("num_ln_in_parallel_attn")?.unwrap_or(2) {
            1 => BlockLayout::ParallelSharedNorm,
            _ => BlockLayout::Parallel,
        },
        (true, false) => BlockLayout::ParallelSharedNorm,
    };
    t.bias = Some(f.flag("bias", false)?);
    t.final_norm = Some(true);
    t.tied_embeddings = f.flag("tie_word_embeddings", true)?;
    t.dropout = f.dropout("hidden_dropout")?;
    t.attention_dropout = Some(f.dropout("attention_dropout")?);
    // eager attention's softmax in the scores' dtype
    t.softmax_f32 = Some(false);
    // the model hands the attention a materialized causal mask, always; its eager
    // attention lets the matmuls broadcast the shared keys and values
    t.materialized_mask = true;
    t.repeat_kv = Some(false);
    Ok(t)
}

/// StarCoder2: layer norms, grouped-query attention, biases everywhere when `use_bias`, a
/// plain two-layer feed-forward, a tied head.
pub(super) fn starcoder2(f: &Fields<'_>) -> Result<TransformerSpec, HfConfigError> {
    let mut t = f.standard(TransformerKind::Decoder)?;
    t.kv_heads = f.opt_count("num_key_value_heads")?;
    t.ffn = Some(f.count("intermediate_size")?);
    t.separate_qkv = true;
    t.activation = f.activation("hidden_act", Activation::Gelu)?;
    t.bias = Some(f.flag("use_bias", true)?);
    t.final_norm = Some(true);
    t.tied_embeddings = f.flag("tie_word_embeddings", true)?;
    t.dropout = f.dropout("residual_dropout")?;
    t.attention_dropout = Some(f.dropout("attention_dropout")?);
    Ok(t)
}

/// GPT-J: one layer norm feeding attention and the feed-forward side by side, attention
/// projections without biases, a feed-forward and an untied head with them, partial rotary
/// positions.
pub(super) fn gptj(f: &Fields<'_>) -> Result<TransformerSpec, HfConfigError> {
    let mut t = TransformerSpec::new(
        TransformerKind::Decoder,
        f.count("n_layer")?,
        f.count("n_embd")?,
        f.count("n_head")?,
        1,
        f.count("vocab_size")?,
    );
    t.ffn = f.opt_count("n_inner")?;
    t.separate_qkv = true;
    t.activation = f.activation("activation_function", Activation::GeluNew)?;
    t.block = BlockLayout::ParallelSharedNorm;
    t.bias = Some(false);
    t.ffn_bias = Some(true);
    t.head_bias = Some(true);
    t.final_norm = Some(true);
    t.tied_embeddings = f.flag("tie_word_embeddings", false)?;
    t.dropout = f.dropout("resid_pdrop")?;
    t.attention_dropout = Some(f.dropout("attn_pdrop")?);
    // eager attention's softmax in the scores' dtype
    t.softmax_f32 = Some(false);
    Ok(t)
}

/// BLOOM: ALiBi positions (no table), a layer norm over the embeddings, one packed
/// query-key-value projection, biases, a feed-forward of 4 × hidden, a tied head. Its
/// attention is eager only in `transformers`.
pub(super) fn bloom(f: &Fields<'_>) -> Result<TransformerSpec, HfConfigError> {
    let mut t = TransformerSpec::new(
        TransformerKind::Decoder,
        f.count_of(&["n_layer", "num_hidden_layers"])?,
        f.count_of(&["hidden_size", "n_embed"])?,
        f.count_of(&["n_head", "num_attention_heads"])?,
        1,
        f.count("vocab_size")?,
    );
    t.activation = Activation::Gelu;
    t.embedding_norm = true;
    t.bias = Some(true);
    t.final_norm = Some(true);
    t.tied_embeddings = f.flag("tie_word_embeddings", true)?;
    t.dropout = f.dropout("hidden_dropout")?;
    t.attention_dropout = Some(f.dropout("attention_dropout")?);
    t.attention = AttentionImpl::Eager;
    // ALiBi positions: no embeddings, no rotation
    t.alibi = true;
    Ok(t)
}
