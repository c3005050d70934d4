//! Explanations: the memory patterns a simulated (or measured) timeline shows, each with its
//! size and its cause, in words.
//!
//! One finder per pattern, each in the module of its concept: what happens before and at
//! the first step (`first_step`: startup, the optimizer jump), what happens in every step
//! (`per_step`: activation retention, plateau or growth), on the host (`host`: the epoch
//! spike, the checkpoint spike, host capacity) and on the device (`device`: cache overhead,
//! out of memory). [`explain`] runs them one after the other, in the report's order. What a
//! framework does its own way (the first step's bookkeeping, `retain_graph`, the words of a
//! remedy) comes from its [`FrameworkProfile`](crate::profile::FrameworkProfile).

mod device;
mod first_step;
mod host;
mod per_step;

use serde::{Deserialize, Serialize};

use crate::engine::Summary;
use trainmem_core::plan::Plan;
use trainmem_core::timeline::{Domain, Timeline};

/// The kind of a pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PatternKind {
    /// Memory taken before the first step (parameters, eager state, data set).
    Startup,
    /// A one-time jump (the optimizer state at the first step).
    Jump,
    /// Activations held from forward until backward.
    ActivationRetention,
    /// Memory returns to the same level every step.
    Plateau,
    /// Memory grows every step.
    GrowthPerStep,
    /// Host memory peaks at the start of each epoch.
    EpochSpike,
    /// A short spike while a checkpoint is written.
    CheckpointSpike,
    /// Reserved memory well above allocated (the allocator's cache).
    CacheOverhead,
    /// The run does not fit.
    OutOfMemory,
}

/// One pattern found, with its size and cause.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    /// The pattern.
    pub kind: PatternKind,
    /// Memory domain.
    pub domain: Domain,
    /// Size of the effect in bytes (signed: growth per step, jump, spike height).
    pub bytes: i128,
    /// Where it shows (step), if at one place.
    pub step: Option<u64>,
    /// The explanation.
    pub text: String,
}

/// A pattern finder: adds the findings of its pattern, if the timeline shows it.
type Finder = fn(&Plan, &Timeline, &Summary, &mut Vec<Finding>);

/// The finders, in the order their findings are reported.
const FINDERS: [Finder; 9] = [
    first_step::startup,
    first_step::optimizer_jump,
    per_step::activation_retention,
    per_step::plateau_or_growth,
    host::epoch_spike,
    host::checkpoint_spike,
    device::cache_overhead,
    host::host_over_capacity,
    device::out_of_memory,
];

/// Finds the patterns of a timeline produced from `plan`.
pub fn explain(plan: &Plan, t: &Timeline, s: &Summary) -> Vec<Finding> {
    let mut out = Vec::new();
    for find in FINDERS {
        find(plan, t, s, &mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{SimOptions, simulate};

    const LEAK: &str = "name = \"leak\"\nframework = \"burn\"\n\
        [model.mlp]\ninput = 64\nhidden = [128]\noutput = 32\n\
        [training]\nbatch_size = 8\nepochs = 1\nsteps_per_epoch = 3\n\
        [optimizer]\nkind = \"sgd\"\n\
        [leak]\nretain_outputs = true\nretain_graph = true\n\
        [device]\nkind = \"cpu\"\ncapacity = \"1GiB\"\n";

    fn jump(text: &str) -> Finding {
        let plan = Plan::from_toml_str(text).expect("plan");
        let r = simulate(&plan, SimOptions::default()).expect("simulate");
        explain(&plan, &r.timeline, &r.summary)
            .into_iter()
            .find(|f| f.kind == PatternKind::Jump)
            .expect("a jump finding")
    }

    #[test]
    fn burn_kept_graphs_show_rewritten_weights_not_optimizer_state() {
        let f = jump(LEAK);
        // SGD keeps no state: the jump is the records plus the weights the kept graphs pin
        // (the second linear layer's weight, 128 × 32 f32, saved by its matmul)
        assert!(f.text.contains("0 B of sgd state"), "{}", f.text);
        assert!(
            f.text.contains("re-allocated weights, not optimizer state"),
            "{}",
            f.text
        );
        assert!(f.text.contains("pinned by the kept graphs"), "{}", f.text);
        assert!(!f.text.contains("× the parameter count"), "{}", f.text);
        let records =
            trainmem_optim::burn_step_bookkeeping_bytes(trainmem_core::OptimizerKind::Sgd, 4);
        assert!(f.bytes as u64 > records, "{}", f.bytes);
        // without the leak nothing is rewritten under SGD
        let plain = LEAK.replace("retain_outputs = true\nretain_graph = true\n", "");
        let f = jump(&plain);
        assert_eq!(f.bytes as u64, records);
        assert!(!f.text.contains("new buffers"), "{}", f.text);
    }

    #[test]
    fn burn_fused_on_a_gpu_names_the_rewritten_parameters_and_keeps_records_on_the_host() {
        // 64·128 + 128 + 128·32 + 32 f32 parameters, Adam's two moments of them
        let params = (64 * 128 + 128 + 128 * 32 + 32) * 4;
        let plain = LEAK
            .replace("retain_outputs = true\nretain_graph = true\n", "")
            .replace("kind = \"sgd\"", "kind = \"adam\"")
            .replace("kind = \"cpu\"", "kind = \"cuda\"\nfusion = true");
        let f = jump(&plain);
        assert_eq!(f.bytes as u64, 3 * params, "moments and parameters, dense");
        assert!(
            f.text.contains(&format!(
                "{} of parameters the step writes into new buffers: burn's fusion",
                trainmem_core::bytes::human(params)
            )),
            "{}",
            f.text
        );
        assert!(f.text.contains("records ("), "{}", f.text);
        assert!(f.text.contains(") in host memory"), "{}", f.text);
    }

    #[test]
    fn a_lora_jump_is_counted_against_the_adapters_not_the_frozen_base() {
        // per layer q and v adapters of rank 4 on a 64-wide model with 4 key-value heads of
        // 16: A 4 × 64 and B 64 × 4 each, 2 × 512 elements; two layers: 2,048 elements, and
        // AdamW's two f32 moments of them
        let plan = "framework = \"pytorch\"\n\
            [model.transformer]\nkind = \"decoder\"\nlayers = 2\nhidden = 64\nheads = 4\n\
            ffn = 128\nseq_len = 16\nvocab = 100\n\
            [model.transformer.lora]\nrank = 4\ntargets = [\"q\", \"v\"]\n\
            [training]\nbatch_size = 2\nepochs = 1\nsteps_per_epoch = 2\n\
            [optimizer]\nkind = \"adamw\"\n[device]\nkind = \"cpu\"\n";
        let f = jump(plan);
        assert_eq!(f.bytes, 2 * 4 * 2_048, "{}", f.text);
        assert!(
            f.text.contains(
                "2 buffer(s) per trainable parameter in f32 (2.00× the 2,048 parameters of the \
                 LoRA adapters in that dtype; the frozen base has none)"
            ),
            "{}",
            f.text
        );
    }

    #[test]
    fn adamw8bit_jump_is_the_quantized_state_beside_the_maps_made_with_the_optimizer() {
        // two 4096 × 64 weights and their biases: 2 · 262,144 + 8 · 1,024 per weight (one byte
        // per element and moment, an f32 maximum per 256); the 64-element bias keeps f32
        // moments, the 4096-element one is quantized (4096 is bitsandbytes' min_8bit_size)
        let plan = "[model.mlp]\ninput = 4096\nhidden = [64]\noutput = 4096\n\
            [training]\nbatch_size = 8\nepochs = 1\nsteps_per_epoch = 2\n\
            [optimizer]\nkind = \"adamw8bit\"\n[device]\nkind = \"cpu\"\n";
        let f = jump(plan);
        let weights = 2 * (2 * 262_144 + 8 * 1_024);
        let biases = 8 * 64 + (2 * 4096 + 8 * 16);
        assert_eq!(f.bytes as u64, weights + biases, "{}", f.text);
        assert!(f.text.contains("one byte per element"), "{}", f.text);
        assert!(
            f.text.contains("0.51× the parameter count in f32"),
            "{}",
            f.text
        );
    }

    #[test]
    fn leak_growth_advice_speaks_the_frameworks_language() {
        let growth = |text: &str| {
            let plan = Plan::from_toml_str(text).expect("plan");
            let r = simulate(&plan, SimOptions::default()).expect("simulate");
            explain(&plan, &r.timeline, &r.summary)
                .into_iter()
                .find(|f| f.kind == PatternKind::GrowthPerStep)
                .expect("a growth finding")
                .text
        };
        let leak = LEAK.replace("steps_per_epoch = 3", "steps_per_epoch = 8");
        let burn = growth(&leak);
        assert!(burn.contains("never backwarded"), "{burn}");
        assert!(burn.contains("into_scalar"), "{burn}");
        assert!(!burn.contains("retain_graph"), "{burn}");
        let pytorch = growth(&leak.replace("framework = \"burn\"\n", ""));
        assert!(pytorch.contains("retain_graph"), "{pytorch}");
        assert!(pytorch.contains("loss.item()"), "{pytorch}");
    }

    #[test]
    fn burn_adamw_names_the_clones_and_pytorch_keeps_the_state_ratio() {
        let adamw = LEAK
            .replace("kind = \"sgd\"", "kind = \"adamw\"")
            .replace("retain_outputs = true\nretain_graph = true\n", "");
        let f = jump(&adamw);
        assert!(f.text.contains("2 buffer(s) per parameter"), "{}", f.text);
        assert!(
            f.text
                .contains("AdamW's decoupled decay clones every parameter"),
            "{}",
            f.text
        );
        // PyTorch: the optimizer state proper, 2× the parameters under Adam
        let torch = "[model.mlp]\ninput = 64\nhidden = [128]\noutput = 32\n\
            [training]\nbatch_size = 8\nepochs = 1\nsteps_per_epoch = 2\n\
            [optimizer]\nkind = \"adam\"\n";
        let f = jump(torch);
        assert!(
            f.text
                .contains("adam keeps 2 buffer(s) per parameter in f32 (2.0"),
            "{}",
            f.text
        );
    }
}
