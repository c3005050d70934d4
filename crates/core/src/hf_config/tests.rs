use super::*;
use crate::model::{BlockLayout, LoraTarget, NormKind, TransformerKind};
use crate::optimizer::StepImpl;

fn fixture(name: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/hf")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn transformer(plan: &Plan) -> &TransformerSpec {
    match &plan.model {
        ModelSpec::Transformer(t) => t,
        other => panic!("not a transformer: {other:?}"),
    }
}

#[test]
fn gpt2_reads_as_a_tied_decoder_with_its_position_table() {
    let plan = plan_from_hf(&fixture("gpt2.json"), &HfOptions::new(4, 512)).expect("plan");
    let t = transformer(&plan);
    assert_eq!((t.layers, t.hidden, t.heads, t.vocab), (12, 768, 12, 50257));
    assert_eq!(t.kind, TransformerKind::Decoder);
    assert!(t.tied_embeddings && t.learned_positions);
    // the table has the model's 1024 rows although the plan trains at 512 tokens
    assert_eq!((t.seq_len, t.max_positions), (512, Some(1024)));
    // and each block's causal-mask buffer its 1024² booleans
    assert_eq!(t.mask_buffer_bytes(), 12 * 1024 * 1024);
    let llama = plan_from_hf(&fixture("llama-2-7b.json"), &HfOptions::new(1, 512)).expect("plan");
    assert_eq!(transformer(&llama).mask_buffer_bytes(), 0);
    let mut handwritten = t.clone();
    handwritten.mask_buffer = None;
    assert_eq!(handwritten.mask_buffer_bytes(), 0);
    handwritten.implementation = crate::model::Implementation::Handwritten;
    assert_eq!(handwritten.mask_buffer_bytes(), 12 * 1024 * 1024);
    assert_eq!(plan.framework, Framework::Pytorch);
    assert_eq!(plan.optimizer.kind, OptimizerKind::AdamW);
    assert_eq!(plan.training.batch_size, 4);
    // the decoder keeps its key/value cache in training, unless the config turns it off
    assert!(t.keeps_kv_cache() && t.attention_keeps_cache_copies());
    let off = fixture("gpt2.json").replacen('{', r#"{"use_cache": false, "#, 1);
    let off = plan_from_hf(&off, &HfOptions::new(4, 512)).expect("plan");
    assert_eq!(transformer(&off).kv_cache, Some(false));
    assert!(!transformer(&off).keeps_kv_cache());
    assert!(!transformer(&llama).attention_keeps_cache_copies());
}

#[test]
fn bert_reads_as_an_encoder_classifier_with_pooler_and_token_types() {
    let t = model_from_hf(&fixture("bert-base-uncased.json"), 128).expect("model");
    assert_eq!(t.kind, TransformerKind::Encoder);
    assert!(t.pooler && t.embedding_norm);
    assert_eq!(
        (t.token_types, t.classes, t.final_norm),
        (2, Some(2), Some(false))
    );
}

#[test]
fn decoders_without_biases_and_qwen_with_qkv_biases() {
    let llama = model_from_hf(&fixture("llama-2-7b.json"), 2048).expect("llama");
    assert_eq!((llama.linear_bias(), llama.qkv_has_bias()), (false, false));
    assert!(llama.gated_ffn && !llama.tied_embeddings);
    assert_eq!(llama.norm, NormKind::RmsNorm);
    let mistral = model_from_hf(&fixture("mistral-7b.json"), 4096).expect("mistral");
    assert_eq!(mistral.kv_head_count(), 8);
    let qwen = model_from_hf(&fixture("qwen2-0.5b.json"), 1024).expect("qwen2");
    assert_eq!((qwen.linear_bias(), qwen.qkv_has_bias()), (false, true));
    assert!(qwen.tied_embeddings);
}

#[test]
fn opt_positions_carry_the_offset_rows_but_not_for_the_sequence() {
    let t = model_from_hf(&fixture("opt-125m.json"), 2048).expect("opt");
    assert_eq!(t.max_positions, Some(2050));
    let err = model_from_hf(&fixture("opt-125m.json"), 2049).expect_err("too long");
    assert!(err.to_string().contains("2048 positions"), "{err}");
}

#[test]
fn errors_name_the_field_the_family_and_the_known_families() {
    let missing = model_from_hf(r#"{"model_type": "gpt2", "n_layer": 2}"#, 8).expect_err("missing");
    assert_eq!(
        missing.to_string(),
        "gpt2 config: field `n_embd` is missing"
    );
    let wrong = model_from_hf(r#"{"model_type": "llama", "num_hidden_layers": "32"}"#, 8)
        .expect_err("a string");
    assert!(
        wrong
            .to_string()
            .contains("`num_hidden_layers` must be a positive integer")
    );
    let unknown = model_from_hf(r#"{"model_type": "t5"}"#, 8).expect_err("unknown");
    assert!(unknown.to_string().contains("`t5`") && unknown.to_string().contains("qwen2"));
    let none = model_from_hf(r#"{"n_layer": 2}"#, 8).expect_err("no model_type");
    assert!(none.to_string().contains("missing"));
    let json = model_from_hf("{not json", 8).expect_err("not json");
    assert!(json.to_string().contains("does not parse"));
    assert!(
        std::error::Error::source(&json).is_some(),
        "the JSON error is kept as the source"
    );
    let projected = model_from_hf(
        &fixture("opt-125m.json").replace(
            "\"word_embed_proj_dim\": 768",
            "\"word_embed_proj_dim\": 512",
        ),
        8,
    )
    .expect_err("projected embeddings");
    assert!(projected.to_string().contains("word_embed_proj_dim"));
    let zero = plan_from_hf(&fixture("gpt2.json"), &HfOptions::new(0, 8)).expect_err("batch 0");
    assert!(zero.to_string().contains("at least 1"));
}

#[test]
fn a_plan_from_a_config_round_trips_through_toml() {
    let mut opts = HfOptions::new(2, 256);
    opts.precision = HfPrecision::MixedBf16;
    opts.checkpointing = true;
    let plan = plan_from_hf(&fixture("llama-2-7b.json"), &opts).expect("plan");
    let text = plan.to_toml().expect("toml");
    assert_eq!(Plan::from_toml_str(&text).expect("reads back"), plan);
    assert_eq!(plan.precision.compute, Dtype::Bf16);
    assert!(plan.precision.master_weights);
    assert_eq!(plan.checkpointing.policy, CheckpointPolicyKind::Every);
}

#[test]
fn an_autocast_plan_keeps_f32_state_and_names_the_half_dtype() {
    let mut opts = HfOptions::new(4, 64);
    opts.precision = HfPrecision::AutocastBf16;
    let plan = plan_from_hf(&fixture("gpt2.json"), &opts).expect("plan");
    assert_eq!(plan.precision.compute, Dtype::F32);
    assert!(!plan.precision.master_weights);
    assert_eq!(plan.precision.autocast, Some(Dtype::Bf16));
    let text = plan.to_toml().expect("toml");
    assert!(text.contains("autocast = \"bf16\""), "{text}");
    assert_eq!(Plan::from_toml_str(&text).expect("reads back"), plan);
    opts.precision = HfPrecision::AutocastF16;
    let plan = plan_from_hf(&fixture("gpt2.json"), &opts).expect("plan");
    assert_eq!(plan.precision.autocast, Some(Dtype::F16));
}

#[test]
fn separate_query_key_value_projections_follow_the_family() {
    let spec = |name: &str| model_from_hf(&fixture(name), 8).expect("model");
    assert!(
        !spec("gpt2.json").separate_qkv,
        "GPT-2's c_attn is one projection"
    );
    assert!(spec("llama-2-7b.json").separate_qkv);
    assert!(spec("opt-125m.json").separate_qkv);
}

#[test]
fn every_family_reads_its_layout_as_plan_features() {
    let spec = |name: &str| model_from_hf(&fixture(name), 64).expect(name);
    let phi = spec("phi-2.json");
    assert_eq!(phi.block, BlockLayout::ParallelSharedNorm);
    assert_eq!((phi.linear_bias(), phi.head_bias), (true, Some(true)));
    let phi3 = spec("phi-3-mini-4k.json");
    assert!(phi3.fused_gate_up && !phi3.separate_qkv);
    let neox = spec("pythia-1b.json");
    assert_eq!(neox.block, BlockLayout::Parallel);
    let stablelm = spec("stablelm-2-1_6b.json");
    assert_eq!(stablelm.norm, NormKind::LayerNorm);
    assert_eq!(
        (stablelm.linear_bias(), stablelm.qkv_has_bias()),
        (false, true)
    );
    let gemma = spec("gemma-2b.json");
    assert_eq!((gemma.head_dim, gemma.kv_head_count()), (None, 1));
    assert!(gemma.tied_embeddings);
    let gemma2 = spec("gemma-2-2b.json");
    assert_eq!(gemma2.head_dim, Some(256));
    assert!(gemma2.post_norms && !gemma2.qk_norm);
    assert_eq!(
        (gemma2.attn_softcap, gemma2.logit_softcap),
        (Some(50.0), Some(30.0))
    );
    assert_eq!(
        gemma2.attention,
        AttentionImpl::Eager,
        "transformers runs Gemma 2 eagerly"
    );
    let gemma3 = spec("gemma-3-1b.json");
    assert!(gemma3.post_norms && gemma3.qk_norm && gemma3.logit_softcap.is_none());
    let falcon = spec("falcon-7b.json");
    assert_eq!(falcon.block, BlockLayout::ParallelSharedNorm);
    assert_eq!(falcon.kv_head_count(), 1);
    let mixtral = spec("mixtral-8x7b.json");
    let moe = mixtral.moe.as_ref().expect("experts");
    assert_eq!((moe.experts, moe.top_k), (8, 2));
    // Mixtral renormalises its top-k weights always
    assert!(moe.normalize_top_k);
    let qwen_moe = spec("qwen1.5-moe-a2.7b.json");
    let moe = qwen_moe.moe.as_ref().expect("experts");
    assert_eq!(
        (moe.experts, moe.top_k, moe.expert_ffn),
        (60, 4, Some(1408))
    );
    assert!(moe.shared_expert_gate);
    // `norm_topk_prob: false`
    assert!(!moe.normalize_top_k);
    let gptj = spec("gpt-j-6b.json");
    assert_eq!((gptj.linear_bias(), gptj.ffn_has_bias()), (false, true));
    let bloom = spec("bloom-560m.json");
    assert!(bloom.embedding_norm && bloom.tied_embeddings);
    assert_eq!(bloom.attention, AttentionImpl::Eager);
    let starcoder = spec("starcoder2-3b.json");
    assert_eq!(
        (starcoder.kv_head_count(), starcoder.linear_bias()),
        (2, true)
    );
}

#[test]
fn unknown_families_and_missing_fields_are_named() {
    let unknown = model_from_hf(r#"{"model_type": "mamba"}"#, 8).expect_err("unknown");
    let m = unknown.to_string();
    for family in [
        "phi3",
        "gpt_neox",
        "mixtral",
        "qwen2_moe",
        "bloom",
        "gemma3_text",
    ] {
        assert!(m.contains(family), "{m}");
    }
    let no_experts = fixture("mixtral-8x7b.json").replace("\"num_local_experts\": 8,", "");
    let e = model_from_hf(&no_experts, 8).expect_err("no experts");
    assert_eq!(
        e.to_string(),
        "mixtral config: field `num_local_experts` is missing"
    );
    let per_head = fixture("stablelm-2-1_6b.json")
        .replace("\"qk_layernorm\": false", "\"qk_layernorm\": true");
    let e = model_from_hf(&per_head, 8).expect_err("per-head norms");
    assert!(e.to_string().contains("qk_layernorm"), "{e}");
}

#[test]
fn the_attention_and_optimizer_implementations_show_in_the_plan() {
    let plan = plan_from_hf(&fixture("llama-2-7b.json"), &HfOptions::new(1, 64)).expect("plan");
    assert_eq!(transformer(&plan).attention, AttentionImpl::Sdpa);
    assert_eq!(plan.optimizer.implementation, StepImpl::Foreach);
    let mut opts = HfOptions::new(1, 64);
    opts.attention = Some(AttentionImpl::FlashAttention2);
    opts.optimizer_impl = Some(StepImpl::Fused);
    let plan = plan_from_hf(&fixture("llama-2-7b.json"), &opts).expect("plan");
    let text = plan.to_toml().expect("toml");
    assert!(text.contains("attention = \"flash_attention_2\""), "{text}");
    assert!(text.contains("implementation = \"fused\""), "{text}");
    assert_eq!(Plan::from_toml_str(&text).expect("reads back"), plan);
    // BLOOM has eager attention alone in transformers
    opts.attention = Some(AttentionImpl::Sdpa);
    let e = plan_from_hf(&fixture("bloom-560m.json"), &opts).expect_err("no sdpa");
    assert!(e.to_string().contains("bloom with eager"), "{e}");
}

#[test]
fn pure_half_precision_keeps_the_optimizer_state_in_the_parameters_dtype() {
    for (precision, dtype, master) in [
        (HfPrecision::Bf16, Dtype::Bf16, false),
        (HfPrecision::F16, Dtype::F16, false),
        (HfPrecision::MixedBf16, Dtype::F32, true),
        (HfPrecision::F32, Dtype::F32, false),
    ] {
        let mut opts = HfOptions::new(1, 64);
        opts.precision = precision;
        let plan = plan_from_hf(&fixture("gpt2.json"), &opts).expect("plan");
        assert_eq!(plan.optimizer.state_dtype, dtype, "{precision:?}");
        assert_eq!(plan.precision.master_weights, master, "{precision:?}");
    }
}

#[test]
fn peft_targets_on_a_packed_projection_adapt_it_whole() {
    let mut opts = HfOptions::new(1, 64);
    opts.lora = Some(LoraSpec::new(8));
    let plan = plan_from_hf(&fixture("pythia-1b.json"), &opts).expect("plan");
    let lora = transformer(&plan).lora.as_ref().expect("lora");
    assert_eq!(lora.targets, vec![LoraTarget::Qkv]);
}

#[test]
fn each_family_says_where_it_drops_and_what_its_code_takes_to_f32() {
    let model = |name: &str| model_from_hf(&fixture(name), 512).expect("reads");
    // OPT and Phi-2 drop their residuals, not their attention's probabilities
    for name in ["opt-125m.json", "phi-2.json"] {
        let t = model(name);
        assert!(t.dropout > 0.0, "{name}");
        assert_eq!(t.attention_dropout_p(), 0.0, "{name}");
    }
    // GPT-2 drops both; LLaMA's residuals are never dropped
    let gpt2 = model("gpt2.json");
    assert_eq!((gpt2.dropout, gpt2.attention_dropout_p()), (0.1, 0.1));
    assert_eq!(model("llama-2-7b.json").dropout, 0.0);
    // eager attention's softmax in f32: LLaMA's and BLOOM's code, not GPT-2's or Falcon's
    for (name, f32) in [
        ("llama-2-7b.json", true),
        ("bloom-560m.json", true),
        ("gpt2.json", false),
        ("falcon-7b.json", false),
        ("gpt-j-6b.json", false),
    ] {
        assert_eq!(model(name).eager_softmax_in_f32(), f32, "{name}");
    }
    // Gemma's norms multiply their weight in f32
    for name in ["gemma-2b.json", "gemma-2-2b.json", "gemma-3-1b.json"] {
        assert!(model(name).norm_weight_f32, "{name}");
    }
    assert!(!model("llama-2-7b.json").norm_weight_f32);
    // rotary positions over part of each head
    for (name, partial) in [
        ("pythia-1b.json", true),
        ("phi-2.json", true),
        ("stablelm-2-1_6b.json", true),
        ("llama-2-7b.json", false),
        ("gpt-j-6b.json", false),
    ] {
        assert_eq!(model(name).partial_rotary, partial, "{name}");
    }
    // BLOOM's ALiBi; Falcon's materialized mask and broadcast keys; sliding windows
    assert!(model("bloom-560m.json").alibi);
    let falcon = model("falcon-7b.json");
    assert!(falcon.materialized_mask && falcon.repeat_kv == Some(false));
    let phi3 = model("phi-3-mini-4k.json");
    assert_eq!((phi3.sliding_window, phi3.global_every), (Some(2047), None));
    // a window masks only a sequence longer than itself
    assert!(!phi3.masked_attention(0));
    let long = model_from_hf(&fixture("phi-3-mini-4k.json"), 4096).expect("reads");
    assert!(long.masked_attention(0));
    let gemma3 = model_from_hf(&fixture("gemma-3-1b.json"), 2048).expect("reads");
    assert_eq!(
        (gemma3.sliding_window, gemma3.global_every),
        (Some(512), Some(6))
    );
    assert!(gemma3.masked_attention(0) && !gemma3.masked_attention(5));
    // Mistral's 4096 is longer than the 512 positions trained here; Qwen2 turns it off
    assert!(!model("mistral-7b.json").masked_attention(0));
    assert_eq!(model("qwen2-0.5b.json").sliding_window, None);
}

/// QLoRA's 4-bit base (bitsandbytes) and GPTQ checkpoints say so in `quantization_config`;
/// planned as bf16 they would be off by a factor of four, so the reader refuses them by name,
/// and a null `quantization_config` (as some exports write) is no quantization.
#[test]
fn a_quantized_checkpoint_is_refused_by_its_method() {
    let with = |q: &str| {
        let mut v: serde_json::Value =
            serde_json::from_str(&fixture("llama-2-7b.json")).expect("json");
        v["quantization_config"] = serde_json::from_str(q).expect("json");
        model_from_hf(&v.to_string(), 512)
    };
    let e = with(
        r#"{"quant_method": "bitsandbytes", "load_in_4bit": true, "bnb_4bit_quant_type": "nf4"}"#,
    )
    .expect_err("refused")
    .to_string();
    assert!(
        e.contains("`quantization_config` (bitsandbytes, load_in_4bit)"),
        "{e}"
    );
    let e = with(r#"{"quant_method": "gptq", "bits": 4}"#)
        .expect_err("refused")
        .to_string();
    assert!(e.contains("(gptq, 4 bits)"), "{e}");
    assert!(with("null").is_ok());
}
