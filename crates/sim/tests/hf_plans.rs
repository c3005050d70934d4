//! Plans made from real models' Hugging Face configurations (`fixtures/hf/`) count exactly the
//! parameters the real models have, both as counted up front and as lowered, and simulate.

use trainmem_core::hf_config::{HfOptions, plan_from_hf};
use trainmem_sim::params::{param_groups, total_elems};

fn config(name: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/hf")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn parameters(name: &str, seq: u64) -> u64 {
    let plan = plan_from_hf(&config(name), &HfOptions::new(1, seq)).expect("plan");
    let groups = param_groups(&plan.model, plan.framework)
        .expect("no overflow")
        .expect("valid model");
    let counted = total_elems(&groups).expect("no overflow");
    let lowered = trainmem_sim::lower::lower_for(&plan.model, plan.framework).expect("lowers");
    let lowered: u64 = lowered.params.iter().map(|p| p.elems).sum();
    assert_eq!(counted, lowered, "{name}: counted and lowered agree");
    counted
}

/// The published parameter counts of each model (`sum(p.numel() for p in
/// model.parameters())` in `transformers`; BERT as `BertForSequenceClassification` with two
/// labels).
#[test]
fn plans_from_configs_have_the_real_models_parameter_counts() {
    assert_eq!(parameters("gpt2.json", 1024), 124_439_808);
    assert_eq!(parameters("bert-base-uncased.json", 512), 109_483_778);
    assert_eq!(parameters("bert-large-uncased.json", 512), 335_143_938);
    assert_eq!(parameters("llama-2-7b.json", 64), 6_738_415_616);
    assert_eq!(parameters("mistral-7b.json", 64), 7_241_732_096);
    assert_eq!(parameters("qwen2-0.5b.json", 64), 494_032_768);
    assert_eq!(parameters("opt-125m.json", 2048), 125_239_296);
}

/// The families beyond the first six, each at the count `validation/hf/param_counts.py`
/// printed for its configuration (a model built by `transformers` 5.24 on PyTorch's `meta`
/// device, tied tensors once; the figures in `validation/hf/param_counts.md`).
#[test]
fn every_family_has_the_real_model_s_parameter_count() {
    for (name, count) in [
        ("phi-2.json", 2_779_683_840),
        ("phi-3-mini-4k.json", 3_821_079_552),
        ("pythia-1b.json", 1_011_781_632),
        ("stablelm-2-1_6b.json", 1_644_515_328),
        ("gemma-2b.json", 2_506_172_416),
        ("gemma-2-2b.json", 2_614_341_888),
        ("gemma-3-1b.json", 999_885_952),
        ("falcon-7b.json", 6_921_720_704),
        ("mixtral-8x7b.json", 46_702_792_704),
        ("qwen1.5-moe-a2.7b.json", 14_315_784_192),
        ("starcoder2-3b.json", 3_030_371_328),
        ("gpt-j-6b.json", 6_050_882_784),
        ("bloom-560m.json", 559_214_592),
    ] {
        assert_eq!(parameters(name, 64), count, "{name}");
    }
}

/// Parameter tensors per model, as `transformers` builds them (the same table): the plan
/// keeps each tensor of the real model as one, so the caching allocator rounds the same
/// blocks.
#[test]
fn every_family_has_the_real_model_s_tensors() {
    for (name, tensors) in [
        ("gpt2.json", 148),
        ("llama-2-7b.json", 291),
        ("phi-2.json", 453),
        ("phi-3-mini-4k.json", 195),
        ("pythia-1b.json", 196),
        ("stablelm-2-1_6b.json", 340),
        ("gemma-2b.json", 164),
        ("gemma-2-2b.json", 288),
        ("gemma-3-1b.json", 340),
        ("falcon-7b.json", 195),
        ("mixtral-8x7b.json", 291),
        ("qwen1.5-moe-a2.7b.json", 387),
        ("starcoder2-3b.json", 483),
        ("gpt-j-6b.json", 285),
        ("bloom-560m.json", 293),
    ] {
        let plan = plan_from_hf(&config(name), &HfOptions::new(1, 64)).expect("plan");
        let groups = param_groups(&plan.model, plan.framework)
            .expect("no overflow")
            .expect("valid model");
        let counted = trainmem_sim::params::total_tensors(&groups).expect("fits");
        assert_eq!(counted, tensors, "{name}");
    }
}

/// The count does not depend on the sequence trained on (position tables keep their rows).
#[test]
fn the_count_does_not_depend_on_the_sequence() {
    assert_eq!(parameters("gpt2.json", 16), parameters("gpt2.json", 1024));
    assert_eq!(
        parameters("bert-base-uncased.json", 8),
        parameters("bert-base-uncased.json", 512)
    );
}

/// A plan from a configuration simulates: parameter bytes are 4 × the count in f32, and AdamW
/// adds two moments (each tensor's block rounded up by the caching allocator, so within 0.3%
/// above).
#[test]
fn a_plan_from_a_config_simulates() {
    let plan =
        plan_from_hf(&config("bert-base-uncased.json"), &HfOptions::new(2, 128)).expect("plan");
    let result = trainmem_sim::simulate(&plan, trainmem_sim::SimOptions::default()).expect("runs");
    let peak = |c| {
        result
            .timeline
            .samples
            .iter()
            .map(|s| s.device.categories.get(c))
            .max()
            .unwrap_or(0)
    };
    use trainmem_core::Category;
    let within =
        |got: u64, exact: u64| got >= exact && (got - exact) as f64 <= 0.003 * exact as f64;
    let params = 4 * 109_483_778;
    assert!(
        within(peak(Category::Parameter), params),
        "{}",
        peak(Category::Parameter)
    );
    assert!(
        within(peak(Category::OptimizerState), 2 * params),
        "{}",
        peak(Category::OptimizerState)
    );
}
