//! Hand-computed bytes for small plans.

use trainmem_core::Category;

use super::*;
use trainmem_core::plan::Plan;
use trainmem_core::timeline::Phase;

const TINY: &str = r#"
[model.mlp]
input = 4
hidden = [8]
output = 2

[training]
batch_size = 2
epochs = 1
steps_per_epoch = 3

[optimizer]
kind = "adam"

[device]
kind = "cpu"
capacity = "1MiB"
"#;

#[test]
fn tiny_mlp_bytes_by_hand() {
    let plan = Plan::from_toml_str(TINY).unwrap();
    let r = simulate(&plan, SimOptions::default()).unwrap();
    let t = &r.timeline;
    let init = t.at_phase(Phase::ModelInit).next().unwrap();
    // parameters: 4·8 + 8 + 8·2 + 2 = 58 f32
    assert_eq!(init.device.categories.get(Category::Parameter), 232);
    let loaded = t.find(0, Phase::BatchLoaded).unwrap();
    // x: 2·4 f32, target: 2·2 f32
    assert_eq!(loaded.device.categories.get(Category::Input), 48);
    let fwd = t.find(0, Phase::Forward).unwrap();
    // relu output 2·8 f32 (saved twice, one tensor), output 2·2 f32, loss 1 f32
    assert_eq!(fwd.device.categories.get(Category::Activation), 84);
    let bwd = t.find(0, Phase::Backward).unwrap();
    assert_eq!(bwd.device.categories.get(Category::Gradient), 232);
    assert_eq!(bwd.device.peak_allocated, 232 + 348);
    let step0 = t.find(0, Phase::OptimizerStep).unwrap();
    assert_eq!(
        step0.device.categories.get(Category::OptimizerState),
        464,
        "Adam: 2× parameters at the first step"
    );
    assert_eq!(
        fwd.device.categories.get(Category::OptimizerState),
        0,
        "lazy state"
    );
    let z = t.find(2, Phase::ZeroGrad).unwrap();
    assert_eq!(z.device.allocated, 232 + 464);
    // the peak is the optimizer step: parameters, gradients, moments, and for-loop Adam's two
    // scratch buffers for the largest parameter (32 elements)
    assert_eq!(r.summary.peak_allocated, 232 + 232 + 464 + 2 * 32 * 4);
    assert_eq!(r.summary.peak_when.unwrap().phase, Phase::OptimizerStep);
    assert_eq!(r.summary.peak_breakdown.get(Category::Temporary), 256);
    assert!(r.summary.all_freed_at_teardown);
    assert_eq!(r.summary.retained_at_end, 0);
    assert!(r.summary.oom.is_none());
    // CPU device: tensors are host memory too
    assert_eq!(z.host.categories.get(Category::Parameter), 232);
}

#[test]
fn tiny_capacity_predicts_oom_with_message() {
    let plan = Plan::from_toml_str(&TINY.replace("1MiB", "700")).unwrap();
    let r = simulate(&plan, SimOptions::default()).unwrap();
    let oom = r.summary.oom.expect("oom");
    assert_eq!(oom.when.phase, Phase::OptimizerStep);
    assert!(oom.message.contains("out of memory"), "{}", oom.message);
    assert_eq!(r.timeline.samples.last().unwrap().phase, Phase::OutOfMemory);
}

mod properties {
    use proptest::prelude::*;
    use trainmem_core::Category;

    use crate::{SimOptions, simulate};
    use trainmem_core::plan::Plan;

    #[allow(clippy::too_many_arguments)]
    fn plan_text(
        widths: &[u64],
        batch: u64,
        acc: u64,
        opt: &str,
        ckpt: bool,
        leak: bool,
        metrics: &str,
        cpu: bool,
        variation: f64,
        cubecl: Option<&str>,
    ) -> String {
        let hidden: Vec<String> = widths.iter().map(|w| w.to_string()).collect();
        // burn's plans name their framework; its cubecl settings apply on a GPU only
        let (framework, device) = match cubecl {
            Some(d) => ("framework = \"burn\"", if cpu { "" } else { d }),
            None => ("", ""),
        };
        format!(
            r#"
{framework}
[model.mlp]
input = 64
hidden = [{}]
output = 16
dropout = 0.1

[training]
batch_size = {}
micro_batch_size = {}
epochs = 2
steps_per_epoch = 3

[optimizer]
kind = "{opt}"

[checkpointing]
policy = "{}"

[data]
size_variation = {variation}

[metrics]
retention = "{metrics}"

[leak]
retain_outputs = {leak}

[device]
kind = "{}"
capacity = "1GiB"
{device}
"#,
            hidden.join(", "),
            batch * acc,
            batch,
            if ckpt { "sqrt" } else { "none" },
            if cpu { "cpu" } else { "cuda" }
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]

        #[test]
        fn samples_are_consistent_and_everything_is_freed(
            widths in prop::collection::vec(1u64..300, 1..5),
            batch in 1u64..48,
            acc in 1u64..4,
            opt in prop::sample::select(vec!["sgd", "momentum", "adam", "adamw"]),
            ckpt in any::<bool>(),
            leak in any::<bool>(),
            metrics in prop::sample::select(vec!["none", "scalars", "tensors"]),
            cpu in any::<bool>(),
            variation in prop::sample::select(vec![0.0, 0.3]),
            // PyTorch, or burn on cubecl: its default blocks, fused, or wgpu-aligned
            cubecl in prop::sample::select(vec![None, Some(""), Some("fusion = true"), Some("alignment = \"32\"")]),
        ) {
            let text = plan_text(&widths, batch, acc, opt, ckpt, leak, metrics, cpu, variation, cubecl);
            let plan = Plan::from_toml_str(&text).unwrap();
            let r = simulate(&plan, SimOptions::default()).unwrap();
            prop_assert!(r.summary.oom.is_none());
            for s in &r.timeline.samples {
                let live = s.device.categories.live();
                prop_assert_eq!(live, s.device.allocated, "categories add up to allocated at {:?}", s.phase);
                prop_assert_eq!(s.device.categories.get(Category::Cache), s.device.reserved - s.device.allocated);
                prop_assert!(s.device.peak_allocated >= s.device.allocated);
                prop_assert!(s.device.reserved >= s.device.allocated);
            }
            prop_assert!(r.summary.all_freed_at_teardown);
            // (burn on a CPU keeps its optimizer's records in the same memory)
            if !leak && metrics != "tensors" && !(cpu && cubecl.is_some()) {
                prop_assert_eq!(r.summary.retained_at_end, 0, "no deliberate retention, nothing left over");
            }
        }
    }
}

#[test]
fn zero_stages_shard_per_rank_bytes() {
    // parameters 32 + 8 + 16 + 2 elements; 4 ranks: shards of 8, 2, 4, 1 elements
    let base = format!("{TINY}\n[parallel]\nworld_size = 4\nzero_stage = STAGE\n");
    let run = |stage: u8| {
        let plan = Plan::from_toml_str(&base.replace("STAGE", &stage.to_string())).unwrap();
        simulate(&plan, SimOptions::default()).unwrap()
    };
    let shard_bytes = (8 + 2 + 4 + 1) * 4;
    let s1 = run(1);
    let t = &s1.timeline;
    assert_eq!(
        t.find(0, Phase::OptimizerStep)
            .unwrap()
            .device
            .categories
            .get(Category::OptimizerState),
        2 * shard_bytes
    );
    assert_eq!(
        t.find(0, Phase::Backward)
            .unwrap()
            .device
            .categories
            .get(Category::Gradient),
        232,
        "stage 1 keeps full gradients"
    );
    let s2 = run(2);
    assert_eq!(
        s2.timeline
            .find(0, Phase::Backward)
            .unwrap()
            .device
            .categories
            .get(Category::Gradient),
        shard_bytes,
        "stage 2 shards gradients"
    );
    let s3 = run(3);
    let init = s3.timeline.at_phase(Phase::ModelInit).next().unwrap();
    assert_eq!(
        init.device.categories.get(Category::Parameter),
        shard_bytes,
        "stage 3 shards parameters"
    );
    // layers are gathered one at a time during forward: the peak holds more than the shards
    assert!(s3.summary.peak_breakdown.get(Category::Parameter) >= shard_bytes);
    assert!(s3.summary.all_freed_at_teardown);
    // DDP without sharding: gradient buckets as large as the gradients, from the first backward
    let s0 = run(0);
    assert_eq!(
        s0.timeline
            .find(0, Phase::Backward)
            .unwrap()
            .device
            .categories
            .get(Category::Gradient),
        2 * 232
    );
}

fn burn_peaks(optimizer: &str, extra: &str) -> (trainmem_core::timeline::CategoryBytes, u64) {
    let text = format!(
        "framework = \"burn\"\n{}\n{extra}",
        TINY.replace("kind = \"adam\"", &format!("kind = \"{optimizer}\""))
    );
    let plan = Plan::from_toml_str(&text).unwrap();
    let r = simulate(&plan, SimOptions::default()).unwrap();
    // 4·8 + 8 + 8·2 + 2 = 58 f32 parameters
    (
        r.timeline
            .peak_per_category(trainmem_core::timeline::Domain::Host),
        58 * 4,
    )
}

/// burn-optim's per-parameter bookkeeping for the tiny MLP's 4 parameter tensors.
fn burn_records(kind: trainmem_core::OptimizerKind) -> u64 {
    trainmem_optim::burn_step_bookkeeping_bytes(kind, 4)
}

#[test]
fn burn_adamw_writes_parameters_into_new_buffers_inside_the_step() {
    use trainmem_core::OptimizerKind;
    let (peaks, params) = burn_peaks("adamw", "");
    // two moments plus the parameters rewritten under `optimizer_state`
    assert_eq!(
        peaks.get(Category::OptimizerState),
        3 * params + burn_records(OptimizerKind::AdamW)
    );
    let (peaks, _) = burn_peaks("adam", "");
    assert_eq!(
        peaks.get(Category::OptimizerState),
        2 * params + burn_records(OptimizerKind::Adam)
    );
}

#[test]
fn burn_momentum_first_velocity_is_the_gradient() {
    let (peaks, params) = burn_peaks("momentum", "");
    // step 1's velocity (a gradient buffer) beside step 2's gradients
    assert_eq!(peaks.get(Category::Gradient), 2 * params);
    assert_eq!(
        peaks.get(Category::OptimizerState),
        params + burn_records(trainmem_core::OptimizerKind::Momentum)
    );
}

#[test]
fn burn_kept_graphs_pin_the_weights_they_saved() {
    let extra = "[leak]\nretain_outputs = true\nretain_graph = true\n";
    let (peaks, _) = burn_peaks("sgd", extra);
    // the head's weight (8·2 f32) is copied at each of the 3 steps
    assert_eq!(
        peaks.get(Category::OptimizerState),
        3 * 16 * 4 + burn_records(trainmem_core::OptimizerKind::Sgd)
    );
}

/// Device peaks per category of the tiny MLP under burn on a GPU, with `device` settings.
fn burn_gpu_peaks(optimizer: &str, device: &str) -> trainmem_core::timeline::CategoryBytes {
    let text = format!(
        "framework = \"burn\"\n{}",
        TINY.replace("kind = \"adam\"", &format!("kind = \"{optimizer}\""))
            .replace(
                "kind = \"cpu\"\ncapacity = \"1MiB\"",
                &format!("kind = \"cuda\"\ncapacity = \"1GiB\"\n{device}")
            )
    );
    let plan = Plan::from_toml_str(&text).unwrap();
    let r = simulate(&plan, SimOptions::default()).unwrap();
    r.timeline
        .peak_per_category(trainmem_core::timeline::Domain::Device)
}

#[test]
fn burn_fused_writes_every_parameter_anew_counted_at_its_dense_size() {
    // the tiny MLP's parameters: 32 + 8 + 16 + 2 f32
    let dense = 58 * 4;
    let unfused = burn_gpu_peaks("sgd", "");
    assert_eq!(unfused.get(Category::OptimizerState), 0, "updated in place");
    assert_eq!(
        unfused.get(Category::Parameter),
        4 * 512,
        "one 512-byte block each"
    );
    let fused = burn_gpu_peaks("sgd", "fusion = true");
    assert_eq!(fused.get(Category::Parameter), dense);
    assert_eq!(
        fused.get(Category::OptimizerState),
        dense,
        "every parameter written into a new buffer by the step"
    );
    let aligned = burn_gpu_peaks("sgd", "alignment = \"32\"");
    assert_eq!(aligned.get(Category::Parameter), 128 + 32 + 64 + 32);
    assert_eq!(aligned.get(Category::OptimizerState), 0);
}

#[test]
fn burn_graph_nodes_are_host_memory_beside_tensors_on_a_gpu() {
    use trainmem_core::timeline::Domain;
    let timeline = |device: &str| {
        let text = format!(
            "framework = \"burn\"\n{}",
            TINY.replace("kind = \"cpu\"\ncapacity = \"1MiB\"", device)
        );
        let plan = Plan::from_toml_str(&text).unwrap();
        simulate(&plan, SimOptions::default()).unwrap().timeline
    };
    let forward = |t: &trainmem_core::timeline::Timeline, d: Domain| {
        let i = t
            .samples
            .iter()
            .position(|s| s.phase == Phase::Forward)
            .expect("a forward sample");
        t.categories(i, d).get(Category::Activation)
    };
    let cpu = timeline("kind = \"cpu\"\ncapacity = \"1MiB\"");
    let gpu = timeline("kind = \"cuda\"\ncapacity = \"1GiB\"\nfusion = true");
    // the same graph: its nodes are the CPU's activations beyond the GPU's tensors (dense)
    let nodes = forward(&gpu, Domain::Host);
    assert!(
        nodes > 0 && nodes.is_multiple_of(trainmem_autograd::BURN_NODE_BYTES),
        "{nodes}"
    );
    assert_eq!(
        forward(&cpu, Domain::Device),
        forward(&gpu, Domain::Device) + nodes
    );
    // and backward frees them
    let after = gpu
        .samples
        .iter()
        .position(|s| s.phase == Phase::Backward)
        .unwrap();
    assert_eq!(
        gpu.categories(after, Domain::Host)
            .get(Category::Activation),
        0
    );
}

#[test]
fn burn_plain_sgd_keeps_only_the_optimizer_bookkeeping() {
    let (peaks, _) = burn_peaks("sgd", "");
    // 4 parameter tensors: 8 hash-table buckets × 193 + 16 + 4 × 964 (measured on burn 0.21)
    assert_eq!(peaks.get(Category::OptimizerState), 5_416);
}

#[test]
fn burn_balanced_checkpointing_keeps_pre_activations_only() {
    // 4 → 8 (gelu) → 8 (gelu) → 2: without checkpointing burn keeps each gelu's input and
    // output; balanced checkpointing recomputes the gelu outputs from their inputs
    let base = "framework = \"burn\"\n[model.mlp]\ninput = 4\nhidden = [8, 8]\noutput = 2\n\
                activation = \"gelu\"\n[training]\nbatch_size = 2\nepochs = 1\n\
                steps_per_epoch = 1\n[optimizer]\nkind = \"sgd\"\n\
                [device]\nkind = \"cpu\"\ncapacity = \"1GiB\"\n";
    let act = |text: &str| {
        let plan = Plan::from_toml_str(text).unwrap();
        let r = simulate(&plan, SimOptions::default()).unwrap();
        r.timeline
            .peak_per_category(trainmem_core::timeline::Domain::Host)
            .get(Category::Activation)
    };
    let plain = act(base);
    let balanced = act(&format!("{base}[checkpointing]\npolicy = \"sqrt\"\n"));
    // two gelu outputs of 2 × 8 f32 no longer kept
    assert_eq!(plain - balanced, 2 * 2 * 8 * 4);
}

#[test]
fn burn_parameters_carry_per_tensor_bookkeeping() {
    let (peaks, params) = burn_peaks("sgd", "");
    // 4 parameter tensors, each with burn's measured per-tensor bookkeeping
    assert_eq!(
        peaks.get(Category::Parameter),
        params + 4 * crate::profile::burn::PARAM_BOOKKEEPING
    );
}

fn burn_timeline(extra: &str, steps: u64) -> trainmem_core::timeline::Timeline {
    let text = format!(
        "framework = \"burn\"\n{}\n{extra}",
        TINY.replace("kind = \"adam\"", "kind = \"sgd\"")
            .replace("steps_per_epoch = 3", &format!("steps_per_epoch = {steps}"))
    );
    let plan = Plan::from_toml_str(&text).unwrap();
    simulate(&plan, SimOptions::default()).unwrap().timeline
}

fn activation_at(t: &trainmem_core::timeline::Timeline, step: u64, phase: Phase) -> u64 {
    t.find(step, phase)
        .unwrap()
        .device
        .categories
        .get(Category::Activation)
}

#[test]
fn burn_metric_tensors_keep_the_outputs_only_when_asked() {
    let growth = |keep: bool| {
        let t = burn_timeline(
            &format!("[metrics]\nretention = \"tensors\"\nkeep_outputs = {keep}\n"),
            3,
        );
        activation_at(&t, 2, Phase::OptimizerStep) - activation_at(&t, 1, Phase::OptimizerStep)
    };
    // the loss (1 f32) per step; with the outputs also one batch of logits (2 × 2 f32)
    assert_eq!(growth(false), 4);
    assert_eq!(growth(true), 4 + 2 * 2 * 4);
}

#[test]
fn burn_records_metrics_after_backward_before_the_optimizer_step() {
    let order = |framework: &str| {
        let text =
            format!("framework = \"{framework}\"\n{TINY}\n[metrics]\nretention = \"scalars\"\n");
        let plan = Plan::from_toml_str(&text).unwrap();
        let t = simulate(&plan, SimOptions::default()).unwrap().timeline;
        t.samples
            .iter()
            .filter(|s| s.step == 0)
            .map(|s| s.phase)
            .filter(|p| matches!(p, Phase::Backward | Phase::Metrics | Phase::OptimizerStep))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        order("burn"),
        [Phase::Backward, Phase::Metrics, Phase::OptimizerStep]
    );
    assert_eq!(
        order("pytorch"),
        [Phase::Backward, Phase::OptimizerStep, Phase::Metrics]
    );
}

#[test]
fn burn_frees_dropped_kept_graphs_one_layer_per_backward() {
    let t = burn_timeline(
        "[leak]\nretain_outputs = true\nretain_graph = true\nclear_every = 2\n",
        4,
    );
    let at = |step, phase, c| t.find(step, phase).unwrap().device.categories.get(c);
    // dropping the two kept outputs frees their logits (2 × 2 f32 each) at once
    assert_eq!(
        activation_at(&t, 1, Phase::OptimizerStep) - activation_at(&t, 2, Phase::BatchLoaded),
        2 * 2 * 2 * 4
    );
    // the first backward after the drop frees the first layer of both graphs: the second
    // layer's saved input (the relu output, 2 × 8 f32 each) and its graph nodes are still
    // there
    let head_nodes = u64::from(trainmem_autograd::burn_recorded_ops(
        trainmem_core::OpKind::Linear,
    )) * trainmem_autograd::BURN_NODE_BYTES;
    assert_eq!(
        activation_at(&t, 2, Phase::Backward) - activation_at(&t, 0, Phase::Backward),
        2 * (2 * 8 * 4 + head_nodes)
    );
    // ... and so are the old head weights the graphs pinned
    let weights = |step, phase| {
        at(step, phase, Category::Parameter) + at(step, phase, Category::OptimizerState)
    };
    assert_eq!(weights(2, Phase::Forward), weights(2, Phase::Backward));
    // the second backward frees them (the head's weight, 8 × 2 f32, pinned by each graph)
    assert_eq!(
        weights(3, Phase::Forward) - weights(3, Phase::Backward),
        2 * 16 * 4
    );
    // the second backward frees the rest: step 3 looks like step 1
    assert_eq!(
        activation_at(&t, 3, Phase::Backward),
        activation_at(&t, 1, Phase::Backward)
    );
}

#[test]
fn kernel_scratch_comes_from_the_machine_given_not_the_one_running() {
    // burn on a CPU device keeps gemm's packing buffer (the L2 bytes of one CPU) as `other`
    // from `start` to `end`, sized for the machine in the options
    let text = format!("framework = \"burn\"\n{TINY}");
    let plan = Plan::from_toml_str(&text).unwrap();
    let other_at_start = |machine: crate::Machine| {
        let opts = SimOptions {
            machine,
            ..SimOptions::default()
        };
        let r = simulate(&plan, opts).unwrap();
        let first = r.timeline.samples.first().unwrap();
        assert_eq!(first.phase, Phase::Start);
        first.host.categories.get(Category::Other)
    };
    let big = crate::Machine {
        l2_bytes_per_cpu: 3 << 20,
    };
    assert_eq!(other_at_start(big), 3 << 20);
    assert_eq!(
        other_at_start(crate::Machine::default()),
        crate::engine::kernel_scratch::DEFAULT_L2_BYTES
    );
    // a plan that names its kernel scratch keeps it whatever the machine
    let explicit =
        Plan::from_toml_str(&format!("{text}\n[host]\nkernel_scratch = \"1KiB\"\n")).unwrap();
    let opts = SimOptions {
        machine: big,
        ..SimOptions::default()
    };
    let r = simulate(&explicit, opts).unwrap();
    assert_eq!(
        r.timeline.samples[0].host.categories.get(Category::Other),
        1024
    );
}

/// A plan's allocator string may turn expandable segments on: the simulation runs over one
/// growing segment per pool, which reserves no more than whole segments do (here the same:
/// this plan's tensors reuse their cached blocks exactly; trainmem-alloc's
/// `expandable_tests` works a trace where it reserves less by hand).
#[test]
fn plans_accept_expandable_segments() {
    let plan = |allocator: &str| {
        Plan::from_toml_str(&format!(
            "[model.transformer]\nlayers = 4\nhidden = 512\nheads = 8\nseq_len = 256\n\
             vocab = 8000\n[training]\nbatch_size = 4\nepochs = 1\nsteps_per_epoch = 3\n\
             [device]\ncapacity = \"8GiB\"\nallocator = \"{allocator}\"\n"
        ))
        .unwrap()
    };
    let whole = simulate(&plan(""), SimOptions::default()).unwrap().summary;
    let grown = simulate(&plan("expandable_segments:True"), SimOptions::default())
        .unwrap()
        .summary;
    assert!(whole.oom.is_none() && grown.oom.is_none());
    assert!(grown.all_freed_at_teardown);
    assert!(
        grown.peak_reserved <= whole.peak_reserved,
        "expandable {} vs whole segments {}",
        grown.peak_reserved,
        whole.peak_reserved
    );
    // Expandable segments split off every remainder of 512 B or more, so no block is larger
    // than with whole segments.
    assert!(grown.peak_allocated <= whole.peak_allocated);
    assert!(
        plan("expandable_segments:Maybe")
            .device
            .allocator
            .contains("Maybe")
    );
    assert!(simulate(&plan("expandable_segments:Maybe"), SimOptions::default()).is_err());
}

/// Forward's activation bytes of a one-block mixture-of-experts decoder on the CPU (batch 2,
/// 8 tokens, hidden 16, 4 experts of 32), routing each token to `top_k` experts.
fn moe_forward_activation(top_k: u64, normalize: bool) -> u64 {
    let text = format!(
        "[model.transformer]\nkind = \"decoder\"\nlayers = 1\nhidden = 16\nheads = 2\n\
         seq_len = 8\nvocab = 64\nffn = 32\ngated_ffn = true\nactivation = \"silu\"\n\
         norm = \"rms_norm\"\nattention = \"sdpa\"\n\
         [model.transformer.moe]\nexperts = 4\ntop_k = {top_k}\nnormalize_top_k = {normalize}\n\
         [training]\nbatch_size = 2\nepochs = 1\nsteps_per_epoch = 1\n\
         [optimizer]\nkind = \"sgd\"\n[device]\nkind = \"cpu\"\ncapacity = \"1GiB\"\n"
    );
    let plan = Plan::from_toml_str(&text).unwrap();
    let t = simulate(&plan, SimOptions::default()).unwrap().timeline;
    activation_at(&t, 0, Phase::Forward)
}

#[test]
fn routed_rows_keep_their_gather_and_scatter_indices() {
    // each token routed to one more expert adds a routed row per token (2 × 8 rows), and
    // backward keeps for each: the gathered input (16 f32), the experts' packed gate and up
    // projection (2 × 32 f32), the gate's activation and the gated product (32 f32 each),
    // the experts' output (16 f32), its routing weight (1 f32), and four i64 indices: top-k's
    // own, the permutation that sorts the rows by expert, the token each row gathers and
    // the inverse permutation that puts the rows back in the tokens' order
    let per_row = 16 * 4 + 2 * 32 * 4 + 32 * 4 + 32 * 4 + 16 * 4 + 4 + 4 * 8;
    assert_eq!(
        moe_forward_activation(2, false) - moe_forward_activation(1, false),
        2 * 8 * per_row
    );
}

#[test]
fn normalized_top_k_weights_keep_a_copy_and_their_sum() {
    // `weights /= weights.sum(-1)` in place keeps the undivided weights (top-k f32) and the
    // sum (1 f32) per token, 2 × 8 tokens
    for k in [1, 2, 3] {
        assert_eq!(
            moe_forward_activation(k, true) - moe_forward_activation(k, false),
            2 * 8 * (k + 1) * 4
        );
    }
}

/// `TINY` on a GPU under `framework`, its device table extended by `device`.
fn tiny_on_gpu(framework: &str, device: &str, bias: bool) -> SimResult {
    let text = TINY
        .replace(
            "kind = \"cpu\"\ncapacity = \"1MiB\"",
            &format!("capacity = \"1GiB\"\n{device}"),
        )
        .replace(
            "[model.mlp]",
            &format!("framework = \"{framework}\"\n[model.mlp]\nbias = {bias}"),
        );
    let plan = Plan::from_toml_str(&text).unwrap();
    simulate(&plan, SimOptions::default()).unwrap()
}

/// `other` bytes at each phase of step 0 (forward, backward) and at the end of the last step.
fn other_bytes(r: &SimResult) -> (u64, u64, u64) {
    let t = &r.timeline;
    let at = |step, phase| {
        t.find(step, phase)
            .unwrap()
            .device
            .categories
            .get(Category::Other)
    };
    (
        at(0, Phase::Forward),
        at(0, Phase::Backward),
        at(2, Phase::OptimizerStep),
    )
}

#[test]
fn pytorch_keeps_a_cublas_workspace_per_thread_from_its_first_matmul() {
    const HOPPER: u64 = 32 << 20;
    const OTHERS: u64 = 4096 * 1024 * 2 + 16 * 1024 * 8;
    const LT: u64 = 1 << 20;
    // forward's thread at the first forward, the autograd engine's at the first backward,
    // both kept; the biased linear layers run through cuBLASLt in forward (1 MiB more)
    let r = tiny_on_gpu("pytorch", "", true);
    assert_eq!(
        other_bytes(&r),
        (HOPPER + LT, 2 * HOPPER + LT, 2 * HOPPER + LT)
    );
    assert!(r.summary.peak_allocated >= 2 * HOPPER + LT);
    assert!(r.summary.all_freed_at_teardown);
    // no bias: no cuBLASLt workspace
    let r = tiny_on_gpu("pytorch", "", false);
    assert_eq!(other_bytes(&r), (HOPPER, 2 * HOPPER, 2 * HOPPER));
    assert_eq!(r.summary.tensor_peaks.get(Category::Other), 2 * HOPPER);
    // ATen's default off Hopper, and CUBLAS_WORKSPACE_CONFIG's size when the plan gives it
    let r = tiny_on_gpu("pytorch", "compute_capability = \"8.0\"", false);
    assert_eq!(other_bytes(&r), (OTHERS, 2 * OTHERS, 2 * OTHERS));
    let r = tiny_on_gpu("pytorch", "blas_workspace = \"4MiB\"", false);
    assert_eq!(other_bytes(&r).2, 2 * (4 << 20));
    // burn's matmuls are cubecl's own
    let r = tiny_on_gpu("burn", "", true);
    assert_eq!(other_bytes(&r), (0, 0, 0));
}

/// burn writes a checkpoint from an f32 copy of every parameter: on a CPU device a
/// `temporary` block beside the tensors, on a GPU the parameters read back into host
/// buffers (host `temporary`, counted as device reads) while the device holds nothing more;
/// PyTorch's `torch.save` serialises parameters and optimizer state on the host (`other`).
#[test]
fn a_checkpoint_copy_is_where_the_framework_writes_it_from() {
    const PARAMS: u64 = 58 * 4;
    let save = |r: &SimResult| {
        let t = &r.timeline;
        let at = t
            .find(0, Phase::CheckpointSave)
            .expect("a save after step 0");
        let before = t.find(0, Phase::OptimizerStep).expect("step 0");
        let after = t.find(1, Phase::BatchLoaded).expect("step 1");
        (at.clone(), before.clone(), after.clone())
    };
    let every_step = |text: String| {
        text.replace(
            "steps_per_epoch = 3",
            "steps_per_epoch = 3\ncheckpoint_every = 1",
        )
    };
    // burn on a GPU
    let text = every_step(
        TINY.replace("kind = \"cpu\"\ncapacity = \"1MiB\"", "capacity = \"1GiB\"")
            .replace("[model.mlp]", "framework = \"burn\"\n[model.mlp]"),
    );
    let r = simulate(&Plan::from_toml_str(&text).unwrap(), SimOptions::default()).unwrap();
    let (at, before, after) = save(&r);
    assert_eq!(at.host.categories.get(Category::Temporary), PARAMS);
    assert_eq!(at.host.device_reads.get(Category::Temporary), PARAMS);
    assert_eq!(
        at.device.categories, before.device.categories,
        "the device holds nothing more during the save"
    );
    assert_eq!(after.host.categories.get(Category::Temporary), 0);
    assert_eq!(after.host.device_reads.total(), 0);
    // burn on the CPU: the copy is a block beside the tensors
    let text = every_step(TINY.replace("[model.mlp]", "framework = \"burn\"\n[model.mlp]"));
    let r = simulate(&Plan::from_toml_str(&text).unwrap(), SimOptions::default()).unwrap();
    let (at, before, _) = save(&r);
    assert_eq!(
        at.device.categories.get(Category::Temporary)
            - before.device.categories.get(Category::Temporary),
        PARAMS
    );
    assert_eq!(at.host.device_reads.total(), 0);
    // PyTorch on a GPU: parameters and Adam's two moments, serialised (`other`)
    let text =
        every_step(TINY.replace("kind = \"cpu\"\ncapacity = \"1MiB\"", "capacity = \"1GiB\""));
    let r = simulate(&Plan::from_toml_str(&text).unwrap(), SimOptions::default()).unwrap();
    let (at, before, _) = save(&r);
    assert_eq!(
        at.host.categories.get(Category::Other) - before.host.categories.get(Category::Other),
        3 * PARAMS
    );
    assert_eq!(at.host.categories.get(Category::Temporary), 0);
}
