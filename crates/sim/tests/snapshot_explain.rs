//! `explain` on real PyTorch snapshots (the project's shared `pytorch-snapshots/`, beside
//! the workspace; skipped with a message where absent): at the end of the recorded step,
//! the parameter, gradient and AdamW-state bytes equal the sizes derived from each model's
//! shapes.
//!
//! Ground truth held per snapshot (each file's source is in `SOURCES.txt`):
//! - Wedsonlin, kkaitlyn111, bcrafton: the CS336 decoder's shapes (below), AdamW.
//! - cranberrii (`Instrumenting_a_training_step_napkin_math.ipynb`): TinyLlama-1.1B in 8-bit
//!   with PEFT's `LoraConfig(r=16)` and no `target_modules`, so PEFT's default for LLaMA,
//!   `q_proj` and `v_proj`: per layer A 16×2048 and B 2048×16 (q), A 16×2048 and B 256×16
//!   (v: 4 key-value heads of 64), 22 layers, f32 (prepare_model_for_kbit_training); forward
//!   and backward, no optimizer. The frozen 8-bit base is "other" by design (frozen weights
//!   are not model state that trains).
//! - silmont2000 (`cs336_systems/trace_peak_memory.py`): attention over three leaf tensors
//!   Q, K, V (8, 4096, 16) f32 made with `requires_grad=True` outside any module: no
//!   parameters and no optimizer; after `loss.backward()` three gradients of 2 MiB.
//! - JasperSolt (`counterfactuals.py` at the snapshot's commit, `generate_counterfactuals`):
//!   Adam over one input image `x_prime` (1, 30, 256, 256) f32 through a frozen CNN
//!   (`requires_grad = False` on every weight, loaded before recording began): its gradient,
//!   two Adam moments, then `zero_grad()` (set to none), ten iterations, the snapshot dumped
//!   after the tenth.
//! - Maphsge4 (`llama/llama_select_n.py`, `validate`): LLaMA inference, no backward and no
//!   optimizer: no gradient or optimizer-state bytes. Its parameter bytes are not held: the
//!   script moves decoder layers between host and device as it goes, and which layers were
//!   on the device when the snapshot was taken was not established from the repository.
//! - ZidongLiu (DeComFL, zeroth-order federated fine-tuning of OPT-125m, f32): forward passes
//!   only. OPT-125m has 196 parameter tensors of 125,239,296 elements (500,957,184 B), which
//!   `Module.to` makes at `reset_model`; the gradient estimator (`adam_forward.py`) keeps a
//!   state tensor per parameter of the same sizes, made by its own code: optimizer state. At
//!   the snapshot's end both are exact; the parameters also hold two token tensors of the
//!   script's own `to` (1.56 KiB each), counted apart.

use std::path::PathBuf;

use trainmem_alloc::pytorch::framed::FramedSnapshot;
use trainmem_core::Category;
use trainmem_sim::snapshot_explain::frames::StackPhase;
use trainmem_sim::snapshot_explain::{ExplainOptions, explain_snapshot};

fn dir() -> Option<PathBuf> {
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/pytorch-snapshots");
    if d.is_dir() {
        Some(d)
    } else {
        eprintln!("skipped: {} is absent", d.display());
        None
    }
}

/// The CS336 (assignment 1) decoder LM: untied token embeddings and output layer, per layer
/// two RMSNorm weights, four d×d attention projections and a SwiGLU (w1, w3: d_ff×d; w2:
/// d×d_ff), a final RMSNorm; no biases. Parameters in elements.
fn cs336_parameters(vocab: u64, d: u64, layers: u64, d_ff: u64) -> u64 {
    2 * vocab * d + layers * (2 * d + 4 * d * d + 3 * d * d_ff) + d
}

fn check(file: &str, vocab: u64, d: u64, layers: u64, d_ff: u64) {
    let Some(dir) = dir() else { return };
    let bytes = std::fs::read(dir.join(file)).expect("read the snapshot");
    let f = FramedSnapshot::read(&bytes).expect("a snapshot");
    let opts = ExplainOptions {
        replay_remedies: false,
        ..ExplainOptions::default()
    };
    let ex = explain_snapshot(&f, &opts).expect("explained");
    // the recording ends with the optimizer step
    assert_eq!(ex.end.phase, Some(StackPhase::Optimizer), "{file}");
    let at_end = |c: Category| {
        ex.end
            .by_category
            .iter()
            .find(|(k, _)| *k == c)
            .map_or(0, |x| x.1)
    };
    let params = 4 * cs336_parameters(vocab, d, layers, d_ff); // f32
    assert_eq!(at_end(Category::Parameter), params, "{file}: parameters");
    assert_eq!(at_end(Category::Gradient), params, "{file}: gradients");
    assert_eq!(
        at_end(Category::OptimizerState),
        2 * params,
        "{file}: AdamW's two moments"
    );
    assert!(!ex.steps.is_empty());
}

#[test]
fn cs336_medium_steady_step_model_state_is_exact() {
    // d=1024, 24 layers, d_ff=4096, vocab 10000 (the run's "medium" configuration)
    check(
        "Wedsonlin+assignment2-systems/8630bcf/results_medium_128_training_memory_snapshot.pickle",
        10_000,
        1024,
        24,
        4096,
    );
}

#[test]
fn cs336_first_full_step_of_a_3b_model_is_exact() {
    // d=2560, 32 layers, d_ff=10240, vocab 10000; AdamW state made inside the trace
    check(
        "kkaitlyn111+cs336-a2-systems/221ecab/memory_files_memory_ctx128_fullstep.pickle",
        10_000,
        2560,
        32,
        10_240,
    );
}

#[test]
fn gpt2_small_shaped_compiled_step_is_exact() {
    // 768/12 layers/3072, vocab 50257, torch.compile; gradients kept between steps
    check(
        "bcrafton+assignment2-systems/0c0e8a7/memory_snapshot.pickle",
        50_257,
        768,
        12,
        3072,
    );
}

#[test]
fn every_shared_snapshot_is_explained_with_sites_and_remedies() {
    let Some(dir) = dir() else { return };
    for file in [
        "JasperSolt+EoR_NN/6686e9f_snapshot.pickle",
        "Maphsge4+select_n/04d383c_snapshot.pickle",
        "ZidongLiu+DeComFL/edd30e0/memory.pickle",
        "cranberrii+ftcourse/9f4902c/memory_snapshot.pickle",
        "silmont2000+assignment2-systems/133f064/mem_snapshot.pickle",
    ] {
        let bytes = std::fs::read(dir.join(file)).expect("read");
        let f = FramedSnapshot::read(&bytes).expect("a snapshot");
        let opts = ExplainOptions {
            replay_remedies: false,
            ..ExplainOptions::default()
        };
        let ex = explain_snapshot(&f, &opts).expect("explained");
        assert!(ex.peak.live_bytes > 0, "{file}");
        assert!(!ex.peak.top_sites.is_empty(), "{file}");
        assert!(
            ex.coverage.entries_with_frames * 10 > ex.coverage.entries * 9,
            "{file}"
        );
        let sum: u64 = ex.peak.by_category.iter().map(|x| x.1).sum();
        assert_eq!(sum, ex.peak.live_bytes, "{file}");
    }
}

fn explained(file: &str) -> Option<trainmem_sim::snapshot_explain::SnapshotExplanation> {
    let dir = dir()?;
    let bytes = std::fs::read(dir.join(file)).expect("read the snapshot");
    let f = FramedSnapshot::read(&bytes).expect("a snapshot");
    let opts = ExplainOptions {
        replay_remedies: false,
        ..ExplainOptions::default()
    };
    Some(explain_snapshot(&f, &opts).expect("explained"))
}

fn bytes_at(m: &trainmem_sim::snapshot_explain::Moment, c: Category) -> u64 {
    m.by_category
        .iter()
        .find(|(k, _)| *k == c)
        .map_or(0, |x| x.1)
}

#[test]
fn tinyllama_lora_forward_backward_model_state_is_exact() {
    let Some(ex) = explained("cranberrii+ftcourse/9f4902c/memory_snapshot.pickle") else {
        return;
    };
    // PEFT's default LLaMA targets q_proj and v_proj at r=16: 22 layers of
    // (16×2048 + 2048×16) + (16×2048 + 256×16) f32 weights
    let lora = 4 * 22 * ((16 * 2048 + 2048 * 16) + (16 * 2048 + 256 * 16));
    assert_eq!(lora, 9_011_200);
    assert_eq!(
        bytes_at(&ex.end, Category::Parameter),
        lora,
        "trainable parameters"
    );
    assert_eq!(
        bytes_at(&ex.end, Category::Gradient),
        lora,
        "their gradients"
    );
    assert_eq!(
        bytes_at(&ex.end, Category::OptimizerState),
        0,
        "no optimizer ran"
    );
    assert_eq!(ex.model_state.parameter_tensors, 2 * 2 * 22);
}

/// The notebook calls the model from one cell line, and transformers, peft and bitsandbytes
/// live in site-packages, so every activation's own line is that cell: 556 allocations there
/// once passed for 556 blocks, crediting checkpointing with 3.11 of 3.12 GiB. The model's own
/// line behind most activations is bitsandbytes' 8-bit matmul, run for the two projections
/// LoRA trains (q and v, whose inputs it saves) in each of the 22 layers; and the cell's line,
/// which made activations and tensors kept as "other", shows once per category.
#[test]
fn tinyllama_lora_blocks_are_counted_by_the_model_line_s_executions() {
    let Some(ex) = explained("cranberrii+ftcourse/9f4902c/memory_snapshot.pickle") else {
        return;
    };
    let r = ex
        .repeated
        .as_ref()
        .expect("a model line made the activations");
    assert_eq!(r.line, "autograd/_functions.py:509 forward");
    assert_eq!(r.runs, 2 * 22);
    let acts = bytes_at(&ex.peak, Category::Activation);
    assert!(
        r.bytes * 4 > acts,
        "the line made a quarter or more of them"
    );
    let c = ex
        .remedies
        .iter()
        .find(|c| c.name == "activation checkpointing per block")
        .expect("checkpointing estimated");
    assert_eq!(c.saved_bytes, acts - acts * 2 / 44);
    let cell: Vec<_> = ex
        .peak
        .top_sites
        .iter()
        .filter(|s| s.site == "ipykernel_114/3105878423.py:21 <module>")
        .collect();
    assert_eq!(cell.len(), 2, "{cell:?}");
    for s in cell {
        assert!(s.bytes <= bytes_at(&ex.peak, s.category), "{s:?}");
    }
}

#[test]
fn attention_over_leaf_tensors_has_no_parameters_and_no_optimizer_state() {
    let Some(ex) = explained("silmont2000+assignment2-systems/133f064/mem_snapshot.pickle") else {
        return;
    };
    for m in [&ex.peak, &ex.end] {
        assert_eq!(bytes_at(m, Category::Parameter), 0);
        assert_eq!(bytes_at(m, Category::OptimizerState), 0);
    }
    assert_eq!(ex.model_state.parameter_tensors, 0);
    // Q, K and V: randn(8, 4096, 16) f32 each with requires_grad=True; after
    // `loss.backward()` each holds a gradient of its shape
    let leaf = 4 * 8 * 4096 * 16;
    assert_eq!(leaf, 2 << 20);
    assert_eq!(bytes_at(&ex.end, Category::Gradient), 3 * leaf);
    assert_eq!(ex.model_state.leaf_gradients, 3);
    // one 2 MiB gradient live at a 3 GiB peak: bf16 gradients would save 1 MiB, under 1% of
    // the peak and within the estimate's own error, so it is not offered
    assert_eq!(bytes_at(&ex.peak, Category::Gradient), leaf);
    assert!(
        ex.remedies
            .iter()
            .all(|r| r.name != "bf16 gradients" && r.saved_bytes * 100 >= ex.peak.live_bytes),
        "{:?}",
        ex.remedies
    );
}

#[test]
fn counterfactual_search_holds_one_gradient_and_two_adam_moments_of_the_image() {
    let Some(ex) = explained("JasperSolt+EoR_NN/6686e9f_snapshot.pickle") else {
        return;
    };
    // x_prime: one lightcone of zlength 30 × boxlength 256 × 256 (configs/lcnn_unenc_config.yaml),
    // f32, with a batch dimension of 1
    let image = 4 * 30 * 256 * 256;
    assert_eq!(image, 7_864_320);
    // at the end of the last step (its last optimizer-step allocation): the image's gradient
    // and Adam's exp_avg and exp_avg_sq (its `step` counter stays on the host)
    let last_step = ex
        .allocations
        .iter()
        .filter(|a| a.phase == Some(StackPhase::Optimizer))
        .filter_map(|a| a.alloc_at)
        .max()
        .expect("an optimizer step");
    let at = |c: Category| -> u64 {
        ex.allocations
            .iter()
            .filter(|a| a.live_after(last_step) && a.category == c)
            .map(|a| a.size)
            .sum()
    };
    assert_eq!(at(Category::Gradient), image, "x_prime.grad");
    assert_eq!(
        at(Category::OptimizerState),
        2 * image,
        "Adam's two moments"
    );
    assert_eq!(at(Category::Parameter), 0, "the CNN is frozen");
    // when the snapshot was taken, zero_grad() had set the gradient to None
    assert_eq!(ex.end.phase, Some(StackPhase::ZeroGrad));
    assert_eq!(bytes_at(&ex.end, Category::Gradient), 0);
    assert_eq!(bytes_at(&ex.end, Category::OptimizerState), 2 * image);
    // one gradient per iteration, of a leaf that is not a module's parameter
    assert_eq!(ex.model_state.leaf_gradients, 10);
    assert_eq!(ex.steps.len(), 10);
}

#[test]
fn llama_inference_has_no_gradient_and_no_optimizer_state() {
    let Some(ex) = explained("Maphsge4+select_n/04d383c_snapshot.pickle") else {
        return;
    };
    for m in [&ex.peak, &ex.end] {
        assert_eq!(bytes_at(m, Category::Gradient), 0);
        assert_eq!(bytes_at(m, Category::OptimizerState), 0);
        assert_eq!(
            bytes_at(m, Category::Activation),
            0,
            "no backward saves any"
        );
    }
    assert!(ex.steps.is_empty(), "no backward, no optimizer step");
    // nothing to accumulate without a backward: the batch itself is what shrinks
    let names: Vec<&str> = ex.remedies.iter().map(|r| r.name.as_str()).collect();
    assert!(names.contains(&"halve the batch"), "{names:?}");
    assert!(
        !names.iter().any(|n| n.contains("micro-batch")),
        "{names:?}"
    );
}

/// Recorded without frames (every stack left out), the steps are inferred from the trace's
/// shape where it trains, and only there: the counterfactual search's ten Adam iterations
/// are found, the LLaMA inference that moves layers on and off the device (weights of a
/// parameter's size made and freed every pass, as gradients are) gets no training steps.
#[test]
fn without_frames_training_steps_are_found_and_inference_gets_none() {
    let bare = |file: &str| {
        let dir = dir()?;
        let bytes = std::fs::read(dir.join(file)).expect("read the snapshot");
        let f = FramedSnapshot::read(&bytes)
            .expect("a snapshot")
            .without_stacks();
        Some(explain_snapshot(&f, &ExplainOptions::default()).expect("explains"))
    };
    let Some(search) = bare("JasperSolt+EoR_NN/6686e9f_snapshot.pickle") else {
        return;
    };
    assert_eq!(search.coverage.entries_with_frames, 0);
    assert_eq!(search.steps.len(), 10);
    let inference = bare("Maphsge4+select_n/04d383c_snapshot.pickle").expect("beside it");
    assert!(inference.steps.is_empty());
    assert!(!inference.notes.iter().any(|n| n.contains("inferred")));
}

/// OPT-125m's parameters: embeddings 50,272 × 768 and 2,050 × 768, twelve layers of four
/// 768 × 768 projections and two 768 × 3,072 feed-forward matrices with their biases and two
/// layer norms, and a final layer norm.
const OPT_125M_PARAMETERS: u64 = 50_272 * 768
    + 2_050 * 768
    + 12 * (4 * (768 * 768 + 768) + (768 * 3_072 + 3_072) + (3_072 * 768 + 768) + 2 * 2 * 768)
    + 2 * 768;

#[test]
fn zeroth_order_opt_125m_keeps_its_model_and_its_estimators_state() {
    assert_eq!(OPT_125M_PARAMETERS, 125_239_296);
    let Some(ex) = explained("ZidongLiu+DeComFL/edd30e0/memory.pickle") else {
        return;
    };
    let site = |needle: &str| {
        ex.end
            .top_sites
            .iter()
            .find(|s| s.site.contains(needle))
            .unwrap_or_else(|| panic!("no site {needle}: {:#?}", ex.end.top_sites))
    };
    let model = site("client.py:176 reset_model");
    assert_eq!((model.bytes, model.count), (OPT_125M_PARAMETERS * 4, 196));
    assert_eq!(model.category, Category::Parameter);
    let state = site("update_K_param_paramwise");
    assert_eq!((state.bytes, state.count), (OPT_125M_PARAMETERS * 4, 196));
    assert_eq!(state.category, Category::OptimizerState);
    assert_eq!(
        bytes_at(&ex.end, Category::OptimizerState),
        OPT_125M_PARAMETERS * 4
    );
    let tokens: u64 = ex
        .end
        .top_sites
        .iter()
        .filter(|s| s.site.contains("language_utils.py") && s.site.ends_with(" to"))
        .map(|s| s.bytes)
        .sum();
    assert_eq!(
        bytes_at(&ex.end, Category::Parameter),
        OPT_125M_PARAMETERS * 4 + tokens
    );
    assert!(tokens < 4096, "{tokens}");
    assert_eq!(ex.model_state.state_made_by_user_code, 392);
    assert_eq!(bytes_at(&ex.end, Category::Gradient), 0, "no backward");
    assert!(ex.steps.is_empty(), "forward passes only");
}

/// The LLaMA inference the select_n repository recorded grows its cache past what one
/// expandable segment maps, and `replay --what-if expandable_segments:True` reserves 359 MiB
/// less: `explain` replays the same setting on a device with room and ranks it (its replays
/// once ran on a device so large that the second expandable segment's address range did not
/// fit in 64 bits, and the setting was left out without a word).
#[test]
fn expandable_segments_are_replayed_on_a_device_with_room() {
    let Some(dir) = dir() else { return };
    let bytes = std::fs::read(dir.join("Maphsge4+select_n/04d383c_snapshot.pickle")).expect("read");
    let f = FramedSnapshot::read(&bytes).expect("a snapshot");
    let ex = explain_snapshot(&f, &ExplainOptions::default()).expect("explained");
    let r = ex
        .remedies
        .iter()
        .find(|r| r.name == "expandable_segments:True")
        .expect("replayed");
    let recorded = ex.allocator.expect("replayed").peak_reserved;
    let with = r.peak_reserved.expect("a replay");
    assert_eq!(r.saved_bytes, recorded - with);
    let mib = r.saved_bytes as f64 / (1u64 << 20) as f64;
    assert!((358.0..361.0).contains(&mib), "{mib} MiB");
}

/// The CS336 step bcrafton recorded peaks in its optimizer step, where the 441.71 MiB of
/// temporaries are the hand-written AdamW's parameter-sized scratch (`optimizer.py:78`): a
/// smaller batch shrinks none of it, and with no activation or batch live there, halving the
/// micro-batch is not offered (it once claimed 220.86 MiB).
#[test]
fn an_optimizer_step_peak_is_not_shrunk_by_a_smaller_batch() {
    let Some(ex) = explained("bcrafton+assignment2-systems/0c0e8a7/memory_snapshot.pickle") else {
        return;
    };
    assert_eq!(ex.peak.phase, Some(StackPhase::Optimizer));
    assert!(bytes_at(&ex.peak, Category::Temporary) > 400 << 20);
    assert!(
        ex.remedies.iter().all(|r| !r.name.starts_with("halve")),
        "{:?}",
        ex.remedies
    );
}
