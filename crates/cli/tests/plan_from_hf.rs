//! `trainmem plan from-hf` end to end: a real model's configuration becomes a plan that
//! simulates with the model's parameter count; bad configurations fail naming the field.

mod common;

use std::path::PathBuf;
use std::process::Output;

use common::{empty_dir, s, stderr, stdout, trainmem, write};
use trainmem_core::Plan;

/// `trainmem plan from-hf CONFIG --batch BATCH --seq SEQ` followed by `rest`.
fn from_hf(config: &str, batch: &str, seq: &str, rest: &[&str]) -> Output {
    let mut args = vec!["plan", "from-hf", config, "--batch", batch, "--seq", seq];
    args.extend_from_slice(rest);
    trainmem(&args)
}

fn hf(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/hf")
        .join(name)
}

#[test]
fn a_gpt2_config_becomes_a_plan_that_simulates() {
    let dir = empty_dir("plan-from-hf");
    let plan_path = dir.join("gpt2.toml");
    let out = from_hf(
        s(&hf("gpt2.json")),
        "2",
        "128",
        &["--optimizer", "sgd", "--out", s(&plan_path)],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("124,439,808 parameters"),
        "{}",
        stderr(&out)
    );
    let plan = Plan::load(&plan_path).expect("the written plan loads");
    assert_eq!(plan.name, "gpt2");
    assert_eq!(plan.training.batch_size, 2);
    let sim = trainmem(&["simulate", s(&plan_path), "--quiet"]);
    assert_eq!(sim.status.code(), Some(0), "{}", stderr(&sim));
    assert!(
        stdout(&sim).contains("124,439,808 parameters"),
        "{}",
        stdout(&sim)
    );
}

/// LoRA through the command line: the adapters' parameters are what peft 0.21.2 counts for
/// the same configuration (`get_peft_model` with `LoraConfig(r=8, target_modules=...)`,
/// summed over `requires_grad` parameters: 294,912 for GPT-2's `c_attn`, 4,194,304 for
/// LLaMA-2-7B's `q_proj` and `v_proj`, 4,399,104 for every projection of Qwen2-0.5B), and
/// the frozen rest is the base model's count.
#[test]
fn lora_plans_count_trainable_and_frozen_parameters_as_peft_does() {
    let dir = empty_dir("plan-from-hf-lora");
    for (config, targets, trainable, frozen) in [
        ("gpt2.json", "q,v", "294,912", "124,439,808"),
        ("llama-2-7b.json", "q,v", "4,194,304", "6,738,415,616"),
        (
            "qwen2-0.5b.json",
            "q,k,v,o,gate,up,down",
            "4,399,104",
            "494,032,768",
        ),
    ] {
        let plan_path = dir.join(config.replace(".json", ".toml"));
        let out = from_hf(
            s(&hf(config)),
            "1",
            "64",
            &[
                "--lora-rank",
                "8",
                "--lora-targets",
                targets,
                "--out",
                s(&plan_path),
            ],
        );
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains(&format!("{trainable} trainable")), "{err}");
        assert!(err.contains(&format!("{frozen} frozen")), "{err}");
        let plan = Plan::load(&plan_path).expect("the written plan loads");
        let sim = trainmem(&["simulate", s(&plan_path), "--quiet"]);
        assert_eq!(sim.status.code(), Some(0), "{}", stderr(&sim));
        let trainmem_core::model::ModelSpec::Transformer(t) = &plan.model else {
            panic!("not a transformer");
        };
        assert_eq!(t.lora.as_ref().map(|l| l.rank), Some(8));
    }
    let bad = from_hf(
        s(&hf("gpt2.json")),
        "1",
        "64",
        &["--lora-rank", "8", "--lora-targets", "q,attn"],
    );
    assert_ne!(bad.status.code(), Some(0));
    assert!(stderr(&bad).contains("`attn`"), "{}", stderr(&bad));
}

#[test]
fn the_plan_goes_to_standard_output_without_out() {
    let out = from_hf(s(&hf("qwen2-0.5b.json")), "1", "64", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.starts_with("# Written by `trainmem plan from-hf"),
        "{text}"
    );
    assert!(text.contains("494,032,768 parameters"), "{text}");
    Plan::from_toml_str(&text).expect("standard output is a plan");
}

#[test]
fn a_bad_config_fails_naming_the_field_and_writes_nothing() {
    let dir = empty_dir("plan-from-hf-bad");
    let config = write(
        &dir,
        "config.json",
        r#"{"model_type": "llama", "hidden_size": 64}"#,
    );
    let plan_path = dir.join("out.toml");
    let out = from_hf(s(&config), "1", "8", &["--out", s(&plan_path)]);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        stderr(&out).contains("field `num_hidden_layers` is missing"),
        "{}",
        stderr(&out)
    );
    assert!(!plan_path.exists(), "no plan written");
    let unknown = write(&dir, "t5.json", r#"{"model_type": "t5"}"#);
    let out = from_hf(s(&unknown), "1", "8", &[]);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        stderr(&out).contains("trainmem reads gpt2, bert"),
        "{}",
        stderr(&out)
    );
}

/// `--optimizer adamw8bit`: bitsandbytes' 8-bit AdamW in the plan. For GPT-2 small nearly every
/// parameter is a tensor of at least 4096 elements, quantized to one byte per element and
/// moment plus an f32 maximum per 256 elements: the state is a little over a quarter of
/// AdamW's (the f32 biases and norms, the 1 KiB maps). Simulated on a CPU device (exact
/// bytes), it is bitsandbytes' rule applied to transformers' own GPT-2 parameters: 253,494,680
/// bytes (transformers 5.24.0, `GPT2LMHeadModel` of `fixtures/hf/gpt2.json` on the meta device,
/// each parameter `8·n` bytes under 4096 elements, `2·n + 8·ceil(n / 256)` otherwise, plus
/// 2,048).
#[test]
fn an_adamw8bit_plan_keeps_about_a_quarter_of_adamws_state() {
    let dir = empty_dir("plan-from-hf-adamw8bit");
    let mut state = Vec::new();
    for optimizer in ["adamw", "adamw8bit"] {
        let plan_path = dir.join(format!("gpt2-{optimizer}.toml"));
        let out = from_hf(
            s(&hf("gpt2.json")),
            "2",
            "128",
            &["--optimizer", optimizer, "--out", s(&plan_path)],
        );
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let mut plan = Plan::load(&plan_path).expect("the written plan loads");
        assert_eq!(plan.optimizer.kind.name(), optimizer);
        plan.device.kind = trainmem_core::plan::DeviceKind::Cpu;
        let r = trainmem_sim::simulate(&plan, Default::default()).expect("simulates");
        let peak = r
            .timeline
            .peak_of(
                trainmem_core::timeline::Domain::Device,
                trainmem_core::Category::OptimizerState,
            )
            .map_or(0, |p| p.bytes);
        state.push(peak);
    }
    assert_eq!(state[1], 253_494_680);
    let ratio = state[1] as f64 / state[0] as f64;
    assert!(ratio > 0.25 && ratio < 0.26, "{state:?}: {ratio}");
}

/// The flags in users' words: a peft `adapter_config.json`, `--attn-implementation`,
/// `--optimizer-impl` and `--precision bf16` each show in the written plan (as its settings
/// and in its header line). Mistral-7B with rank-16 adapters on `q_proj`, `k_proj`, `v_proj`
/// and `o_proj` trains 13,631,488 parameters (32 blocks × (16·4096 + 4096·16 for q and o,
/// 16·4096 + 1024·16 for k and v)).
#[test]
fn users_words_become_the_plan_s_settings() {
    let dir = empty_dir("plan-from-hf-words");
    let adapter = write(
        &dir,
        "adapter_config.json",
        r#"{"peft_type": "LORA", "r": 16, "lora_alpha": 32, "lora_dropout": 0.05,
            "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"], "bias": "none"}"#,
    );
    let plan_path = dir.join("mistral.toml");
    let out = from_hf(
        s(&hf("mistral-7b.json")),
        "1",
        "512",
        &[
            "--peft",
            s(&adapter),
            "--attn-implementation",
            "flash_attention_2",
            "--optimizer-impl",
            "fused",
            "--precision",
            "bf16",
            "--out",
            s(&plan_path),
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("13,631,488 trainable"),
        "{}",
        stderr(&out)
    );
    let text = std::fs::read_to_string(&plan_path).expect("written");
    let header = text.lines().next().expect("a header");
    for words in [
        "--peft",
        "--attn-implementation flash_attention_2",
        "--optimizer-impl fused",
        "--precision bf16",
    ] {
        assert!(header.contains(words), "{header}");
    }
    let plan = Plan::load(&plan_path).expect("loads");
    let trainmem_core::model::ModelSpec::Transformer(t) = &plan.model else {
        panic!("not a transformer");
    };
    assert_eq!(t.attention.name(), "flash_attention_2");
    let lora = t.lora.as_ref().expect("adapters");
    assert_eq!(
        (lora.rank, lora.alpha, lora.dropout),
        (16, Some(32.0), 0.05)
    );
    assert_eq!(
        plan.optimizer.implementation,
        trainmem_core::StepImpl::Fused
    );
    assert_eq!(plan.optimizer.state_dtype, trainmem_core::Dtype::Bf16);
}

/// A peft target that matches no module names the model's modules; an adapter that is not
/// LoRA says what it is; nothing is written either way.
#[test]
fn peft_mistakes_name_the_modules_and_write_nothing() {
    let dir = empty_dir("plan-from-hf-peft-bad");
    let plan_path = dir.join("out.toml");
    let out = from_hf(
        s(&hf("pythia-1b.json")),
        "1",
        "64",
        &[
            "--lora-rank",
            "8",
            "--lora-targets",
            "q_proj,v_proj",
            "--out",
            s(&plan_path),
        ],
    );
    assert_ne!(out.status.code(), Some(0));
    assert!(
        stderr(&out).contains("query_key_value, dense"),
        "{}",
        stderr(&out)
    );
    let ia3 = write(
        &dir,
        "ia3.json",
        r#"{"peft_type": "IA3", "target_modules": ["k_proj"]}"#,
    );
    let out = from_hf(
        s(&hf("llama-2-7b.json")),
        "1",
        "64",
        &["--peft", s(&ia3), "--out", s(&plan_path)],
    );
    assert_ne!(out.status.code(), Some(0));
    assert!(stderr(&out).contains("IA3 adapter"), "{}", stderr(&out));
    assert!(!plan_path.exists(), "no plan written");
}
