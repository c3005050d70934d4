//! The twin against real PyTorch runs recorded on CPU (`fixtures/pytorch/`, written by
//! `validation/pytorch/record.py`; `cargo xtask validate pytorch` prints the whole table).
//!
//! Every recorded run: the plan has the real model's parameter count; parameters, gradients
//! and optimizer state are within 0.1%, activations, input and temporaries within 3%, and the
//! total peak within 2% (the targets) — but for the [`KNOWN_MISSES`], which must stay
//! exactly those.

use std::path::PathBuf;

use trainmem_sim::validation::{Comparison, compare, load};

fn comparisons() -> Vec<Comparison> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/pytorch");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("fixtures/pytorch")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    let out: Vec<Comparison> = paths
        .iter()
        .map(|p| compare(&load(p).expect("recording reads")).expect("recording simulates"))
        .collect();
    assert!(out.len() >= 8, "{} recordings", out.len());
    out
}

fn row<'a>(c: &'a Comparison, what: &str) -> &'a trainmem_sim::validation::Row {
    c.rows
        .iter()
        .find(|r| r.what == what)
        .unwrap_or_else(|| panic!("{}: no row {what}", c.name))
}

#[test]
fn plans_from_recordings_have_the_recorded_parameter_counts() {
    for c in comparisons() {
        assert_eq!(c.plan_parameters, c.parameters, "{}", c.name);
        assert_eq!(c.plan_trainable, c.trainable, "{}", c.name);
    }
}

/// Under LoRA (peft, the base frozen) only the adapters have gradients and optimizer state:
/// the recorded gradients are the adapters' bytes, a small fraction of the parameters, and
/// the twin predicts them (within the model-state target, checked above) from a plan whose
/// frozen parameters have none.
#[test]
fn lora_runs_keep_gradients_and_state_for_the_adapters_alone() {
    let lora: Vec<Comparison> = comparisons()
        .into_iter()
        .filter(|c| c.name.starts_with("lora-"))
        .collect();
    assert!(lora.len() >= 5, "{} LoRA recordings", lora.len());
    for c in &lora {
        assert!(c.trainable * 10 < c.parameters, "{}", c.name);
        let grads = row(c, "gradient");
        assert_eq!(grads.measured, 4 * c.trainable, "{}", c.name);
        assert_eq!(grads.predicted, 4 * c.plan_trainable, "{}", c.name);
        let state = row(c, "optimizer_state");
        if c.name.contains("adamw8bit") {
            // every adapter is under bitsandbytes' min_8bit_size (4096 elements): f32
            // moments, beside the two 1 KiB quantization maps
            assert_eq!(
                state.predicted,
                2 * 4 * c.plan_trainable + 2048,
                "{}",
                c.name
            );
        } else if c.name.contains("adamw") {
            assert_eq!(state.predicted, 2 * 4 * c.plan_trainable, "{}", c.name);
        } else {
            assert_eq!(state.predicted, 0, "{}", c.name);
        }
    }
}

#[test]
fn model_state_is_within_a_tenth_of_a_percent_on_every_recorded_run() {
    for c in comparisons() {
        for what in ["parameter", "gradient", "optimizer_state"] {
            let r = row(&c, what);
            assert!(
                r.within(),
                "{} {what}: PyTorch {} twin {} ({:+.3}%)",
                c.name,
                r.measured,
                r.predicted,
                100.0 * r.error()
            );
        }
        // the recorded state is there to be matched: AdamW holds two moments of every
        // trainable parameter (4 bytes each, 2 in a model cast to bf16; bitsandbytes' 8-bit
        // AdamW one byte each for tensors of at least 4096 elements)
        let width = if c.name.starts_with("bf16-") { 2 } else { 4 };
        if c.name.contains("adamw8bit") {
            assert!(row(&c, "optimizer_state").measured >= 2 * c.trainable);
        } else if c.name.contains("adamw") {
            assert!(row(&c, "optimizer_state").measured >= 2 * width * c.trainable);
        }
    }
}

/// transformers' Adafactor keeps a row and a column vector per matrix (a full-size second
/// moment per vector, and each parameter's RMS as a 0-dim tensor): a state of about 1% of the
/// parameters here, predicted to the byte from the parameters' shapes (LLaMA's query, key and
/// value as three matrices, GPT-2's packed `c_attn` as one).
#[test]
fn adafactor_state_is_factored_and_predicted_to_the_byte() {
    let runs: Vec<Comparison> = comparisons()
        .into_iter()
        .filter(|c| c.name.contains("adafactor"))
        .collect();
    assert!(runs.len() >= 3, "{} Adafactor recordings", runs.len());
    for c in &runs {
        let state = row(c, "optimizer_state");
        assert_eq!(state.predicted, state.measured, "{}", c.name);
        assert!(
            state.measured * 50 < row(c, "parameter").measured,
            "{}",
            c.name
        );
    }
}

/// bitsandbytes' 8-bit AdamW (`bnb.optim.AdamW8bit`, its CPU backend): one byte per element
/// and per moment with an f32 maximum per block of 256 for tensors of at least 4096 elements,
/// f32 moments for the smaller ones, and two 1 KiB quantization maps shared by all: the
/// state, a quarter of AdamW's and a little more, is predicted to the byte. Sized as AdamW's
/// it would miss by far more than the target.
#[test]
fn adamw8bit_state_follows_bitsandbytes_layout_to_the_byte() {
    use trainmem_sim::validation::plan_of;
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/pytorch");
    for name in ["mlp", "gpt2-tiny", "llama-tiny"] {
        let rec = load(&dir.join(format!("{name}-adamw8bit.json"))).expect("recorded");
        let f32_run = load(&dir.join(format!("{name}-adamw.json"))).expect("recorded");
        let c = compare(&rec).expect("simulates");
        let state = row(&c, "optimizer_state");
        assert_eq!(state.predicted, state.measured, "{name}");
        // the steady-state figure (trainmem-optim's arithmetic) is the simulated one
        let plan = plan_of(&rec).expect("plan");
        let r = trainmem_sim::simulate(&plan, Default::default()).expect("simulates");
        assert_eq!(
            r.summary.model_state.optimizer_state, state.measured,
            "{name}"
        );
        let adamw_state = row(&compare(&f32_run).expect("simulates"), "optimizer_state").measured;
        // a quarter of AdamW's and the block maxima, f32 biases and norms, the maps
        assert!(
            4 * state.measured > adamw_state && 3 * state.measured < adamw_state,
            "{name}: {} against {adamw_state}",
            state.measured
        );
        // the same run sized as AdamW's f32 state misses the model-state target
        let mut plan = plan_of(&rec).expect("plan");
        plan.optimizer.kind = trainmem_core::optimizer::OptimizerKind::AdamW;
        let r = trainmem_sim::simulate(&plan, Default::default()).expect("simulates");
        let as_adamw = r
            .timeline
            .peak_of(
                trainmem_core::timeline::Domain::Device,
                trainmem_core::Category::OptimizerState,
            )
            .map_or(0, |p| p.bytes);
        assert!(as_adamw > 3 * state.measured, "{name}: {as_adamw}");
    }
}

/// The 8-bit step on the CPU dequantizes both moments of one parameter into f32 tensors and
/// holds five parameter-sized f32 tensors at its highest: for the MLP (a 1024 × 1024 weight,
/// 20 MiB of scratch against 3.8 MB of state) that is the run's peak. Without the scratch
/// (the fused CUDA kernel's step) the twin misses the recorded peak by far more than 2%.
#[test]
fn adamw8bit_cpu_step_scratch_sets_the_mlps_peak() {
    use trainmem_sim::validation::plan_of;
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/pytorch");
    let rec = load(&dir.join("mlp-adamw8bit.json")).expect("recorded");
    // the recorded peak is at an optimizer step
    let at_step = rec
        .samples
        .iter()
        .filter(|s| s.phase == "optimizer_step")
        .map(|s| s.peak_since_previous)
        .max()
        .unwrap_or(0);
    let c = compare(&rec).expect("simulates");
    let peak = row(&c, "total peak");
    assert_eq!(at_step, peak.measured);
    assert!(peak.within(), "{:+.3}", peak.error());
    let mut plan = plan_of(&rec).expect("plan");
    plan.optimizer.implementation = trainmem_core::optimizer::StepImpl::Fused;
    let r = trainmem_sim::simulate(&plan, Default::default()).expect("simulates");
    let fused = r.summary.peak_allocated;
    // without the scratch the peak falls back to backward's, under the step's by more than
    // the 20 MiB of scratch less the freed gradients
    assert!(
        peak.predicted > fused + 16 * 1024 * 1024,
        "{} {fused}",
        peak.predicted
    );
    let error = (fused as f64 - peak.measured as f64) / peak.measured as f64;
    assert!(error < -0.02, "{error:+.3}");
}

/// `torch.autocast("cpu", dtype=torch.float16)` runs the same ops in half precision as bf16
/// does on the CPU (one lower-precision list for both dtypes): the fp16 ledgers hold the same
/// bytes as the bf16 ones at every phase boundary, and the twin's `autocast = "f16"`
/// predicts the same figures as its `"bf16"`.
#[test]
fn autocast_f16_on_the_cpu_holds_the_bytes_of_bf16() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/pytorch");
    for name in ["mlp-adamw", "gpt2-tiny-adamw", "llama-tiny-adamw"] {
        let f16 = load(&dir.join(format!("autocast-f16-{name}.json"))).expect("recorded");
        let bf16 = load(&dir.join(format!("autocast-{name}.json"))).expect("recorded");
        assert_eq!(
            f16.autocast.as_ref().map(|a| a.dtype.as_str()),
            Some("float16")
        );
        assert_eq!(f16.samples.len(), bf16.samples.len(), "{name}");
        for (a, b) in f16.samples.iter().zip(&bf16.samples) {
            assert_eq!(a.categories, b.categories, "{name} {} {}", a.phase, a.step);
            assert_eq!(a.peak_since_previous, b.peak_since_previous, "{name}");
        }
        let (cf, cb) = (
            compare(&f16).expect("simulates"),
            compare(&bf16).expect("simulates"),
        );
        for (rf, rb) in cf.rows.iter().zip(&cb.rows) {
            assert_eq!(rf.predicted, rb.predicted, "{name} {}", rf.what);
            assert!(rf.within(), "autocast-f16-{name} {}", rf.what);
        }
    }
}

/// torchvision's own `torchvision.models.resnet18` (the `tv-resnet18-*` recordings, made
/// with torchvision 0.29.2) holds the same bytes as the plain-nn replica (`resnet18-*`) at
/// every phase boundary, with SGD and AdamW: the same plan, the same twin figures, all within
/// target.
#[test]
fn torchvisions_resnet18_holds_the_bytes_of_the_plain_nn_replica() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/pytorch");
    for opt in ["sgd", "adamw"] {
        let tv = load(&dir.join(format!("tv-resnet18-{opt}.json"))).expect("recorded");
        let nn = load(&dir.join(format!("resnet18-{opt}.json"))).expect("recorded");
        assert!(
            tv.versions["torchvision"]
                .as_str()
                .is_some_and(|v| v.starts_with("0.29.2")),
            "{:?}",
            tv.versions
        );
        assert!(nn.versions.get("torchvision").is_none(), "{opt}");
        assert_eq!(tv.optimizer, opt);
        assert_eq!(tv.parameters, nn.parameters, "{opt}");
        assert_eq!(tv.plan_model, nn.plan_model, "{opt}");
        assert_eq!(tv.samples.len(), nn.samples.len(), "{opt}");
        for (a, b) in tv.samples.iter().zip(&nn.samples) {
            assert_eq!(a.categories, b.categories, "{opt} {} {}", a.phase, a.step);
            assert_eq!(a.peak_since_previous, b.peak_since_previous, "{opt}");
        }
        let (ct, cn) = (
            compare(&tv).expect("simulates"),
            compare(&nn).expect("simulates"),
        );
        assert_eq!(ct.rows.len(), 7, "{opt}");
        for (rt, rn) in ct.rows.iter().zip(&cn.rows) {
            assert_eq!(
                (rt.measured, rt.predicted),
                (rn.measured, rn.predicted),
                "{opt} {}",
                rt.what
            );
            assert!(rt.within(), "tv-resnet18-{opt} {}", rt.what);
        }
    }
}

/// Figures not yet within target, with why (none now). LLaMA under Hugging Face's
/// checkpointing missed its activation target (−8.7%) while the twin ran LLaMA's attention
/// eagerly and its RMS norm without the normalized tensor the weight's gradient reads (one
/// hidden-sized f32 tensor per norm; the final norm's stays under checkpointing); with the
/// fused (SDPA) attention Hugging Face runs and that tensor it is −1.1%: what is left are the
/// few tensors made outside the blocks (rotary cos/sin tables, shifted labels).
const KNOWN_MISSES: &[(&str, &str)] = &[];

#[test]
fn every_figure_of_every_recorded_run_is_within_its_target() {
    let mut misses = Vec::new();
    for c in comparisons() {
        for r in &c.rows {
            let known = KNOWN_MISSES.contains(&(c.name.as_str(), r.what.as_str()));
            if r.within() == known {
                misses.push(format!(
                    "{}{} {}: PyTorch {} twin {} ({:+.2}%, target {:.1}%)",
                    if known {
                        "(listed as a known miss, now within) "
                    } else {
                        ""
                    },
                    c.name,
                    r.what,
                    r.measured,
                    r.predicted,
                    100.0 * r.error(),
                    100.0 * r.target
                ));
            }
        }
    }
    assert!(misses.is_empty(), "{}", misses.join("\n"));
}

/// The comparison can fail: a prediction one logits-sized tensor short is outside the 2%
/// total-peak target of a small decoder, and a count off by one parameter tensor is outside
/// the 0.1% model-state target (one 128 × 128 weight of the tiny GPT-2).
#[test]
fn the_targets_catch_the_errors_they_are_meant_to() {
    use trainmem_sim::validation::{Row, target};
    let peak = Row {
        what: "total peak".into(),
        measured: 15_168_008,
        predicted: 15_168_008 - 4 * 64 * 1024 * 4,
        target: target("total peak"),
    };
    assert!(!peak.within(), "{:+.3}", peak.error());
    let state = Row {
        what: "parameter".into(),
        measured: 2_177_024,
        predicted: 2_177_024 - 128 * 128 * 4,
        target: target("parameter"),
    };
    assert!(!state.within(), "{:+.4}", state.error());
}

/// The `torch.autocast` recordings: the MLP, GPT-2, BERT and the LLaMA-style decoder with AdamW,
/// the MLP and GPT-2 with SGD. The transformers hold fewer activation bytes than the same runs
/// in f32 (their linear layers and feed-forward activations run in bf16); the MLP at batch 32
/// holds more (the bf16 copies of its weights that backward reads outweigh its activations).
/// The twin's autocast mode is what brings each within target: the same recording simulated
/// as an f32 run misses its activations by more than 3%.
#[test]
fn autocast_recordings_need_the_twins_autocast_mode() {
    use trainmem_sim::validation::plan_of;
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/pytorch");
    for name in [
        "mlp-adamw",
        "mlp-sgd",
        "gpt2-tiny-adamw",
        "gpt2-tiny-sgd",
        "bert-tiny-adamw",
        "llama-tiny-adamw",
    ] {
        let autocast = load(&dir.join(format!("autocast-{name}.json"))).expect("recorded");
        let f32_run = load(&dir.join(format!("{name}.json"))).expect("recorded");
        assert_eq!(autocast.parameters, f32_run.parameters, "{name}");
        let c = compare(&autocast).expect("simulates");
        let f = compare(&f32_run).expect("simulates");
        let act = |c: &Comparison| row(c, "activation").measured;
        if name.starts_with("mlp") {
            assert!(
                act(&c) > 4 * act(&f),
                "autocast-{name}: {} vs {}",
                act(&c),
                act(&f)
            );
        } else {
            assert!(
                act(&c) < act(&f),
                "autocast-{name}: {} ≥ {}",
                act(&c),
                act(&f)
            );
        }
        for what in ["parameter", "gradient", "optimizer_state"] {
            assert_eq!(
                row(&c, what).measured,
                row(&f, what).measured,
                "{name} {what}"
            );
        }
        assert!(row(&c, "activation").within(), "autocast-{name}");
        // the same recording, simulated as if it had run in f32
        let mut plan = plan_of(&autocast).expect("plan");
        plan.precision.autocast = None;
        let r = trainmem_sim::simulate(&plan, Default::default()).expect("simulates");
        let predicted = r
            .timeline
            .samples
            .iter()
            .map(|s| s.device.categories.get(trainmem_core::Category::Activation))
            .max()
            .unwrap_or(0);
        let error = (predicted as f64 - act(&c) as f64) / act(&c) as f64;
        assert!(error.abs() > 0.03, "autocast-{name} as f32: {error:+.3}");
    }
}

/// The twin's side of `record.py --explain`: the MLP's forward peak under autocast falls in
/// its second layer, with the bf16 copies of the first two weights live, each made by its
/// layer: the second kept for backward, the first only in autocast's cache (its layer's input
/// needs no gradient). By backward's peak the cached copy is gone; the first weight's f32
/// gradient is being made from its bf16 one.
#[test]
fn the_twins_live_tensors_at_a_peak_name_their_layers() {
    use trainmem_core::Category::{Activation, Gradient};
    use trainmem_sim::validation::twin_peaks;
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/pytorch");
    let rec = load(&dir.join("autocast-mlp-sgd.json")).expect("recorded");
    let peaks = twin_peaks(&rec).expect("runs");
    assert_eq!(peaks.len(), 2);
    let has = |peak: usize, bytes: u64, layer: &str| {
        peaks[peak]
            .tensors
            .iter()
            .any(|t| t.bytes == bytes && t.layer == layer && t.category == Activation)
    };
    assert!(has(0, 1024 * 1024 * 2, "fc1"), "{:?}", peaks[0].tensors);
    assert!(has(0, 784 * 1024 * 2, "fc0"), "{:?}", peaks[0].tensors);
    assert!(!has(1, 784 * 1024 * 2, "fc0"), "{:?}", peaks[1].tensors);
    // the peak is at the first layer's weight gradient: f32, made from a bf16 scratch
    let made_in_fc0 = |category, bytes| {
        peaks[1]
            .tensors
            .iter()
            .any(|t| t.category == category && t.bytes == bytes && t.layer == "fc0")
    };
    assert!(made_in_fc0(Gradient, 784 * 1024 * 4));
    assert!(made_in_fc0(
        trainmem_core::Category::Temporary,
        784 * 1024 * 2
    ));
}

/// Pure half precision (`bf16-*`: the model cast with `.to(torch.bfloat16)`, `torch.optim`'s
/// AdamW): parameters, gradients and both moments in bf16, half the f32 run's bytes but for
/// the f32 scalar `step` tensor each parameter keeps; the twin's plan keeps its optimizer
/// state in the parameters' dtype and predicts it within the model-state target, where f32
/// state would double it. The activations are within target because the twin takes to f32
/// what `transformers`' modules and the CPU kernels do (an RMS norm's input, the logits
/// before the loss, the attention math path's queries, keys and values:
/// `trainmem_sim::autocast::cast_model`).
#[test]
fn pure_bf16_runs_keep_optimizer_state_in_bf16() {
    use trainmem_sim::validation::plan_of;
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/pytorch");
    for name in ["mlp-adamw", "gpt2-tiny-adamw", "llama-tiny-adamw"] {
        let bf16 = load(&dir.join(format!("bf16-{name}.json"))).expect("recorded");
        let f32_run = load(&dir.join(format!("{name}.json"))).expect("recorded");
        assert_eq!(bf16.dtype.as_deref(), Some("bfloat16"));
        let (c, f) = (
            compare(&bf16).expect("simulates"),
            compare(&f32_run).expect("simulates"),
        );
        for what in ["parameter", "gradient"] {
            assert_eq!(
                2 * row(&c, what).measured,
                row(&f, what).measured,
                "{name} {what}"
            );
        }
        // two bf16 moments per element, and one f32 `step` per parameter tensor in both
        let (state, f32_state) = (
            row(&c, "optimizer_state").measured,
            row(&f, "optimizer_state").measured,
        );
        let steps = f32_state - 8 * f32_run.parameters;
        assert_eq!(state, 4 * bf16.parameters + steps, "{name}");
        for r in &c.rows {
            assert!(r.within(), "bf16-{name} {}: {:+.3}", r.what, r.error());
        }
        let plan = plan_of(&bf16).expect("plan");
        assert_eq!(plan.optimizer.state_dtype, trainmem_core::Dtype::Bf16);
        assert!(!plan.precision.master_weights);
        // the same run with f32 optimizer state: twice the moments
        let mut as_f32 = plan.clone();
        as_f32.optimizer.state_dtype = trainmem_core::Dtype::F32;
        let r = trainmem_sim::simulate(&as_f32, Default::default()).expect("simulates");
        assert!(
            r.summary.model_state.optimizer_state > 19 * state / 10,
            "{name}"
        );
    }
}

/// The hand-written GPT (`validation/pytorch/handwritten_gpt.py`, nanoGPT's layout with its
/// layer norm and softmax composed of plain tensor ops), eager and with
/// `scaled_dot_product_attention`, and litgpt's own `GPT` (full fine-tune and LoRA, its
/// chunked cross-entropy), each within target as a plan with its `implementation`. The
/// hand-written layer norm keeps the centered and the normalized input (where `F.layer_norm`
/// keeps the input), its softmax `exp`'s output beside the probabilities; litgpt's attention
/// keeps rotated queries and keys repeated to every head, and its LoRA on the packed
/// projection the adapted parts' output. The same models as `transformers`' modules run them
/// miss the recorded activations by more than 3%.
#[test]
fn handwritten_and_litgpt_models_keep_what_their_code_keeps() {
    use trainmem_core::model::Implementation;
    use trainmem_sim::validation::plan_of;
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/pytorch");
    let runs: Vec<Comparison> = comparisons()
        .into_iter()
        .filter(|c| c.name.contains("handwritten-") || c.name.contains("litgpt-"))
        .collect();
    assert_eq!(runs.len(), 8);
    for c in &runs {
        for r in &c.rows {
            assert!(r.within(), "{} {}: {:+.3}", c.name, r.what, r.error());
        }
        let rec = load(&dir.join(format!("{}.json", c.name))).expect("recorded");
        let mut plan = plan_of(&rec).expect("plan");
        let trainmem_core::ModelSpec::Transformer(t) = &mut plan.model else {
            panic!("{}: not a transformer", c.name);
        };
        let expected = if c.name.contains("litgpt") {
            Implementation::Litgpt
        } else {
            Implementation::Handwritten
        };
        assert_eq!(t.implementation, expected);
        t.implementation = Implementation::Transformers;
        // the modules' layout alone: without the key/value cache `transformers`' decoders
        // keep in training, which these models do not have
        t.kv_cache = Some(false);
        let r = trainmem_sim::simulate(&plan, Default::default()).expect("simulates");
        let act = r
            .timeline
            .samples
            .iter()
            .map(|s| s.device.categories.get(trainmem_core::Category::Activation))
            .max()
            .unwrap_or(0);
        let measured = row(c, "activation").measured;
        let error = (act as f64 - measured as f64) / measured as f64;
        assert!(
            error < -0.03,
            "{} as transformers' modules: {error:+.3}",
            c.name
        );
    }
}

/// What the GPU recordings show that the twin does not predict yet, one `run figure` per
/// line (`fixtures/pytorch-cuda/nvidia-h100-80gb-hbm3/`, recorded on a lent H100 on
/// 2026-11-27). The list must be exactly what the comparison finds: a figure brought within
/// target, or a new miss, changes it. Modelled since: cuBLAS's workspaces (32 MiB per
/// thread on compute capability 9.0: forward's and the autograd engine's), cuBLASLt's 1 MiB
/// for linear layers with biases, the causal-mask buffers of GPT-2 and the hand-written
/// GPT, `pow` on CUDA autocast's f32 list, no autocast input copies for frozen key and value
/// projections (LoRA), and the categories compared in the tensors' own bytes (the ledger's
/// `nbytes`), not the allocator's blocks; and, found with `record.py --device fake-cuda`
/// (the same runs' forward on fake CUDA tensors, their storages listed), CUDA autocast's
/// cross-entropy on half-precision logits (the hand-written GPT: `log_softmax` in bf16 and
/// `nll_loss`'s f32 copy, both kept) and the key/value cache `transformers`' GPT-2 fills in
/// training (copies of the keys and values beside the packed projection the fused kernel's
/// queries view). Left: the allocator's placement (reserved).
const GPU_MISSES: &[&str] = &[
    "autocast-gpt2-small-sdpa-adamw-fused peak reserved",
    "autocast-llama-small-sdpa-adamw-fused peak reserved",
    "bf16-llama-small-sdpa-adamw peak reserved",
    "litgpt-llama-small-adamw-fused peak reserved",
    "lora-autocast-llama-small-sdpa-adamw peak reserved",
];

/// The GPU recordings (`fixtures/pytorch-cuda/<device>/`, written by
/// `validation/pytorch/record_cuda.sh` on a lent GPU), where any have been made: every figure
/// within its target (model state 0.1%, activations 3%, the allocator's peak allocated bytes
/// 2% and peak reserved bytes 5%) but those [`GPU_MISSES`] lists, each recording with the
/// allocator's figures at every phase boundary and its parameters counted exactly.
#[test]
fn every_figure_of_every_gpu_recording_is_within_its_target_or_listed() {
    use std::collections::BTreeSet;
    use trainmem_sim::validation::ledger_paths;
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/pytorch-cuda");
    let mut misses = BTreeSet::new();
    let mut recordings = 0;
    for path in ledger_paths(&dir).expect("readable") {
        let rec = load(&path).expect("recording reads");
        assert!(rec.on_cuda(), "{}", rec.name);
        assert!(rec.samples.iter().all(|s| s.cuda.is_some()), "{}", rec.name);
        let c = compare(&rec).expect("recording simulates");
        assert_eq!(c.plan_parameters, c.parameters, "{}", c.name);
        for what in ["peak allocated", "peak reserved"] {
            assert!(c.rows.iter().any(|r| r.what == what), "{}: {what}", c.name);
        }
        recordings += 1;
        for r in c.rows.iter().filter(|r| !r.within()) {
            misses.insert(format!("{} {}", c.name, r.what));
        }
    }
    assert!(
        recordings >= 13,
        "the H100's suite is committed ({recordings})"
    );
    let listed: BTreeSet<String> = GPU_MISSES.iter().map(|s| s.to_string()).collect();
    let closed: Vec<_> = listed.difference(&misses).collect();
    let new: Vec<_> = misses.difference(&listed).collect();
    assert!(
        closed.is_empty() && new.is_empty(),
        "within target now (remove from GPU_MISSES): {closed:#?}\nnew misses: {new:#?}"
    );
}

/// Why [`GPU_MISSES`] are left, in the recordings' own figures. The H100 suite was recorded in
/// one process, each run after `torch.cuda.empty_cache()`, which releases only the segments
/// with nothing live in them: an earlier run's cuBLAS workspaces (made in its forward and its
/// backward, inside segments cut from that run's activations) keep their segments, free space
/// and all. Each run so starts with a cache it did not make (reserved minus allocated when its
/// model is on the GPU: 97 to 124 MiB for the runs after the first), which it may reuse or
/// not, where a training script in a process of its own starts with none. Every miss is a
/// peak-reserved figure and smaller than that cache, and the runs that started with little
/// (the first of the suite, 10 MiB; the MoE runs, recorded in their own process) miss
/// nothing. `record_cuda.sh` now records each run in a process of its own
/// (`record.py --fresh-process`), for the next lent GPU.
#[test]
fn every_gpu_miss_is_smaller_than_the_cache_earlier_runs_left() {
    use trainmem_sim::validation::ledger_paths;
    const LITTLE: u64 = 16 << 20;
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/pytorch-cuda");
    let (mut misses, mut clean_starts) = (0, 0);
    for path in ledger_paths(&dir).expect("readable") {
        let rec = load(&path).expect("recording reads");
        let start = rec.samples[0]
            .cuda
            .as_ref()
            .expect("the allocator's figures");
        let left = start.reserved - start.allocated;
        let c = compare(&rec).expect("recording simulates");
        for r in c.rows.iter().filter(|r| !r.within()) {
            misses += 1;
            assert_eq!(r.what, "peak reserved", "{}: {}", c.name, r.what);
            let miss = r.predicted.abs_diff(r.measured);
            assert!(
                miss < left,
                "{}: the twin misses peak reserved by {miss} B, more than the {left} B of \
                 cache the run started with",
                c.name
            );
        }
        if left < LITTLE {
            clean_starts += 1;
            assert!(
                c.rows.iter().all(|r| r.within()),
                "{}: started with {left} B of cache and misses",
                c.name
            );
        }
    }
    assert_eq!(misses, GPU_MISSES.len(), "every listed miss was compared");
    assert!(clean_starts >= 5, "runs that started clean: {clean_starts}");
}

/// transformers' own mixtures of experts (Mixtral, Qwen2-MoE with its gated shared expert),
/// full fine-tunes and LoRA on their attention, are in the suite: every expert's weights,
/// gradients and optimizer state to the byte, the routed rows' activations within target.
#[test]
fn mixture_of_experts_recordings_are_in_the_suite_and_within_target() {
    let recordings = |family: &str| {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/pytorch");
        trainmem_sim::validation::ledger_paths(&dir)
            .expect("fixtures/pytorch")
            .iter()
            .map(|p| trainmem_sim::validation::load(p).expect("a recording"))
            .filter(|r| {
                r.hf_config
                    .as_ref()
                    .and_then(|c| c.get("model_type"))
                    .and_then(|t| t.as_str())
                    == Some(family)
            })
            .collect::<Vec<_>>()
    };
    for family in ["mixtral", "qwen2_moe"] {
        let runs = recordings(family);
        assert!(runs.len() >= 3, "{family}: {} recordings", runs.len());
        assert!(
            runs.iter().any(|r| r.lora.is_some()),
            "{family}: no LoRA run"
        );
        for rec in runs {
            let c = trainmem_sim::validation::compare(&rec).expect("comparable");
            for state in ["parameter", "gradient"] {
                let r = row(&c, state);
                assert_eq!(r.predicted, r.measured, "{} {state}", c.name);
            }
            for r in &c.rows {
                assert!(r.within(), "{} {}: {:+.3}", c.name, r.what, r.error());
            }
        }
    }
}

/// The H100 suite's forward pass recorded again on fake CUDA tensors (`record.py --suite
/// cuda --device fake-cuda`, `fixtures/pytorch-fake-cuda/gpu-suite/`): CUDA's dispatch without
/// a GPU (autocast's CUDA op lists, the kernels' outputs, what autograd saves, SDPA's kernel
/// as on compute capability 9.0) gives the GPU's ledger at the end of the first forward pass,
/// every category within 1 KiB of what the H100 recorded (the largest difference found:
/// 128 B; with the litgpt the H100 ran, 0.5.13: litgpt 0.5.9 differs by 24,512 B).
#[test]
fn fake_cuda_recordings_reproduce_the_gpus_forward_pass() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures");
    let gpu = root.join("pytorch-cuda/nvidia-h100-80gb-hbm3");
    let first_forward = |rec: &trainmem_sim::validation::Recording| {
        rec.samples
            .iter()
            .find(|s| s.phase == "forward")
            .map(|s| s.categories.clone())
            .expect("a forward sample")
    };
    let mut compared = 0;
    for path in trainmem_sim::validation::ledger_paths(&root.join("pytorch-fake-cuda/gpu-suite"))
        .expect("readable")
    {
        let fake = load(&path).expect("a recording");
        assert!(fake.on_fake_cuda() && fake.forward_only(), "{}", fake.name);
        let real = load(&gpu.join(path.file_name().expect("a file"))).expect("the H100's");
        assert!(!real.on_fake_cuda() && !real.forward_only());
        assert_eq!(fake.parameters, real.parameters, "{}", fake.name);
        let (f, r) = (first_forward(&fake), first_forward(&real));
        for (category, &measured) in &r {
            let got = f.get(category).copied().unwrap_or(0);
            assert!(
                got.abs_diff(measured) <= 1 << 10,
                "{} {category}: fake {got} B, H100 {measured} B",
                fake.name
            );
        }
        compared += 1;
    }
    assert_eq!(compared, 13, "the H100 suite, run for run");
}

/// What the fake-CUDA recordings show that the twin does not predict yet, one `run figure`
/// per line. Found with them and modelled since: CUDA autocast's cross-entropy on half
/// logits, `transformers`' key/value cache in training, and the experts of a mixture run as
/// `torch._grouped_mm` (on none of autocast's lists: f32, no half-precision copies of the
/// experts' weights), which Mixtral-8x7B's and Qwen1.5-MoE's published sizes showed (the
/// twin had said +161% and +115%); the attention's own dropout probability (OPT and Phi-2
/// drop their residuals only: eager +80% and +61%); eager attention's softmax in f32 in a
/// bf16 model (BLOOM −49%, Gemma 2 −23%); Gemma's RMS norms multiplying their weight in f32
/// (Gemma −3.5% to −5.3% in bf16); partial rotary positions, whose concatenated queries lay
/// the fused kernel's output out head by head, copied back (Pythia −5.2%, StableLM −4.1%,
/// Phi-2 −3.4% in bf16); the materialized mask a fused kernel keeps as its bias (Falcon
/// always, Phi-3's and Gemma 3's sliding windows shorter than the sequence: Falcon −3.4%);
/// query and key norms reading their own part of the projection (Gemma 3 +4.5%); BLOOM's
/// eager attention on views of its packed projection beside the cache's copies (−3.3%);
/// eager attention without copies of a single key/value head (Gemma's `repeat_kv` reshapes
/// a view, Falcon's matmuls broadcast: +3.1%, +4.4%); grouped keys and values repeated to
/// every head when a mask keeps `transformers` from handing SDPA the groups (Mistral-7B at
/// 8192 positions, its window masking: −3.7%).
const FAKE_CUDA_MISSES: &[&str] = &[];

/// The twin on the fake-CUDA recordings (`fixtures/pytorch-fake-cuda/`): the H100 suite's
/// forward and every model family of `fixtures/hf/` at its published size (LLaMA-2-7B,
/// Mistral-7B, Falcon-7B, GPT-J-6B, Mixtral-8x7B, Phi-2, Phi-3, Gemma 1, 2 and 3, ...;
/// batch 1, sequence 2048: under autocast to bf16 and cast to bf16, each with the attention
/// `transformers` picks, and in f32 with eager attention; LLaMA-2-7B under LoRA, five
/// families under activation checkpointing, and Mistral-7B at 8192 positions, Phi-3 at 4096
/// and LLaMA-2-7B at batch 4 too), each
/// model's parameters counted exactly and its parameters, activations and batch within
/// target (0.1%, 3%, 3%) but those [`FAKE_CUDA_MISSES`] lists.
#[test]
fn every_fake_cuda_recording_is_within_its_target_or_listed() {
    use std::collections::BTreeSet;
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/pytorch-fake-cuda");
    let mut misses = BTreeSet::new();
    let mut families = 0;
    let paths = trainmem_sim::validation::ledger_paths(&dir).expect("readable");
    for path in &paths {
        let rec = load(path).expect("recording reads");
        assert!(rec.on_fake_cuda() && rec.forward_only(), "{}", rec.name);
        let c = compare(&rec).expect("recording simulates");
        assert_eq!(c.plan_parameters, c.parameters, "{}", c.name);
        let figures: Vec<&str> = c.rows.iter().map(|r| r.what.as_str()).collect();
        assert_eq!(figures, ["parameter", "activation", "input"], "{}", c.name);
        if path.parent().is_some_and(|p| p.ends_with("families")) {
            families += 1;
        }
        for r in c.rows.iter().filter(|r| !r.within()) {
            misses.insert(format!("{} {}", c.name, r.what));
        }
    }
    assert_eq!((paths.len(), families), (76, 63));
    let listed: BTreeSet<String> = FAKE_CUDA_MISSES.iter().map(|s| s.to_string()).collect();
    assert_eq!(
        misses, listed,
        "the misses found (left) against FAKE_CUDA_MISSES (right)"
    );
}
