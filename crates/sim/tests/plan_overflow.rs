//! Absurd but accepted plan sizes: a size whose element or byte count overflows 64 bits is an
//! error naming the tensor and the plan's figures, from `simulate`, `fit` and what `explain`
//! runs (`simulate`, `explain`, `plan_remedies`), never a panic; a size that only looks
//! absurd but fits (a billion tokens under a fused attention kernel) is simulated and runs
//! out of memory.

use proptest::prelude::*;
use trainmem_core::Plan;
use trainmem_core::hf_config::{HfOptions, plan_from_hf};
use trainmem_core::model::{AttentionImpl, ModelSpec};
use trainmem_sim::{FitTarget, Machine, SimError, SimOptions, simulate};

/// `trainmem plan from-hf fixtures/hf/llama-2-7b.json --batch BATCH --seq SEQ`.
fn llama(batch: u64, seq: u64) -> Plan {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/hf/llama-2-7b.json");
    let config =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    plan_from_hf(&config, &HfOptions::new(batch, seq)).expect("an accepted plan")
}

/// The message of a simulation error that is an overflow (no panic, no out-of-memory).
fn overflow_message(r: Result<impl std::fmt::Debug, SimError>) -> String {
    let e = r.expect_err("an overflow is an error");
    let msg = e.to_string();
    assert!(msg.contains("overflows a 64-bit"), "{msg}");
    assert!(
        msg.contains("is the batch size or a model size mistyped?")
            || msg.contains("is a size mistyped?"),
        "{msg}"
    );
    msg
}

/// What `trainmem explain PLAN` runs through the library: the simulation, its findings and
/// the plan's remedies.
fn explain(plan: &Plan) -> Result<(), SimError> {
    let r = simulate(plan, SimOptions::default())?;
    let _ = trainmem_sim::explain(plan, &r.timeline, &r.summary);
    trainmem_sim::plan_remedies(plan, Machine::DEFAULT, &mut |_| {})?;
    Ok(())
}

/// `--batch 99999999999 --seq 4096`: the first projection's output alone is 5 × 10¹⁸
/// elements, 2 × 10¹⁹ bytes in f32.
#[test]
fn a_batch_of_a_hundred_billion_samples_is_an_overflow_naming_the_tensor() {
    let plan = llama(99_999_999_999, 4096);
    let expected = "the output of op 2 (`linear` of `block0.attn.q.weight`) in layer `block0`: \
                    5033164799949668352 elements (50331648 per sample × batch 99999999999) × 4 \
                    bytes overflows a 64-bit byte count";
    let msg = overflow_message(simulate(&plan, SimOptions::default()));
    assert!(
        msg.contains("micro-batch 99999999999, seq_len 4096"),
        "{msg}"
    );
    assert!(msg.contains(expected), "{msg}");
    // what `explain` runs
    let msg = overflow_message(explain(&plan));
    assert!(msg.contains(expected), "{msg}");
    // `fit` searches the batch from 1, where nothing overflows
    let r = trainmem_sim::fit(&plan, FitTarget::Batch, 80 << 30, 4, Machine::DEFAULT);
    assert!(r.is_ok(), "{r:?}");
}

/// `--batch 1 --seq 1000000000` under `sdpa` (a fused kernel on a GPU): nothing the run
/// makes overflows (the scores are never materialized), so it is simulated and the first
/// activation of 15 TiB does not fit.
#[test]
fn a_billion_tokens_under_a_fused_kernel_is_simulated_and_runs_out_of_memory() {
    let plan = llama(1, 1_000_000_000);
    let r = simulate(&plan, SimOptions::default()).expect("simulated");
    let oom = r.summary.oom.as_ref().expect("out of memory");
    assert!(oom.message.contains("Tried to allocate"), "{}", oom.message);
    explain(&plan).expect("explained");
    let r = trainmem_sim::fit(&plan, FitTarget::Batch, 80 << 30, 4, Machine::DEFAULT)
        .expect("searched");
    assert_eq!(r.largest, None);
}

/// The same billion tokens under eager attention: its `heads × seq × seq` scores overflow,
/// an error naming them, their factors and the model's sizes from every command.
#[test]
fn a_billion_tokens_under_eager_attention_is_an_overflow_naming_the_scores() {
    let mut plan = llama(1, 1_000_000_000);
    let ModelSpec::Transformer(t) = &mut plan.model else {
        unreachable!("a transformer");
    };
    t.attention = AttentionImpl::Eager;
    let expected = "eager attention's scores per sample (heads × seq_len × seq_len): 32 × \
                    1000000000 × 1000000000 overflows a 64-bit count (the model's seq_len \
                    1000000000, hidden 4096, heads 32, ffn 11008, vocab 32000)";
    let msg = overflow_message(simulate(&plan, SimOptions::default()));
    assert!(msg.contains(expected), "{msg}");
    let msg = overflow_message(explain(&plan));
    assert!(msg.contains(expected), "{msg}");
    let fit = trainmem_sim::fit(&plan, FitTarget::Batch, 80 << 30, 4, Machine::DEFAULT);
    let msg = overflow_message(fit);
    assert!(msg.contains(expected), "{msg}");
}

/// A size that overflows in the model alone (a token embedding of `vocab × hidden`) is the
/// model-state check's overflow, before anything is lowered.
#[test]
fn a_model_too_large_to_count_is_an_overflow_before_lowering() {
    let plan = Plan::from_toml_str(
        "[model.transformer]\nlayers = 1\nhidden = 4294967296\nheads = 1\nseq_len = 1\n\
         vocab = 4294967296\n[training]\nbatch_size = 1\nsteps_per_epoch = 1\n",
    )
    .expect("accepted");
    let e = simulate(&plan, SimOptions::default()).expect_err("overflows");
    assert!(matches!(e, SimError::Overflow(_)), "{e}");
    assert!(e.to_string().contains("4294967296 × 4294967296"), "{e}");
}

/// A size at most `bits` bits wide, drawn log-uniformly: 1 to 2^bits − 1, often near a power
/// of two whose products with others overflow.
fn size(bits: u32) -> impl Strategy<Value = u64> {
    (0..bits, any::<u64>()).prop_map(|(b, r)| {
        let low = 1u64 << b;
        low | (r & (low - 1))
    })
}

/// A sequence length and a batch size whose tokens mostly fit 64 bits of bytes (up to 2⁶⁶
/// of them), however they split between the two.
fn tokens() -> impl Strategy<Value = (u64, u64)> {
    (1u32..48).prop_flat_map(|bits| (size(bits), size((66 - bits).min(64))))
}

/// Mostly a width whose parameters a device can hold (up to `bits` bits), sometimes any.
fn width(bits: u32) -> impl Strategy<Value = u64> {
    prop_oneof![4 => size(bits), 1 => size(64)]
}

prop_compose! {
    /// A small transformer (one or two blocks) with huge random sizes: sequence and batch
    /// anywhere up to 2⁶⁴, widths mostly such that the parameters fit a device (so the
    /// activations are lowered and simulated) and sometimes any; and the settings that
    /// change what is lowered (attention kernel, packed or separate projections, gated and
    /// packed feed-forward, query-key norms, a sliding window, experts, adapters, litgpt's
    /// code, checkpointing, precision, framework, device, size variation).
    fn transformer_plan()(
        layers in 1u64..3,
        (seq, batch) in tokens(),
        hidden in width(22), heads in proptest::sample::select(&[1u64, 2, 4, 8][..]),
        head_dim in prop_oneof![4 => Just(None), 1 => width(16).prop_map(Some)],
        kv_div in proptest::sample::select(&[1u64, 2][..]),
        ffn in prop_oneof![Just(None), width(24).prop_map(Some)],
        vocab in width(24),
        attention in proptest::sample::select(&["eager", "sdpa", "fused"][..]),
        separate in any::<bool>(), gated in any::<bool>(), fused_gate_up in any::<bool>(),
        qk_norm in any::<bool>(), window in prop_oneof![3 => Just(None), 1 => size(64).prop_map(Some)],
        moe in prop_oneof![
            3 => Just(None),
            1 => (width(6), width(6), any::<bool>(), prop_oneof![Just(None), Just(Some(1.25))])
                .prop_map(Some),
        ],
        lora in prop_oneof![3 => Just(None), 1 => width(12).prop_map(Some)],
        litgpt in any::<bool>(),
        checkpointing in proptest::sample::select(&["none", "every", "budget"][..]),
        precision in 0u8..3,
        burn in prop_oneof![4 => Just(false), 1 => Just(true)],
        cpu in any::<bool>(), variation in any::<bool>(),
        capacity in proptest::sample::select(&["1GiB", "80GiB", "1024TiB"][..]),
    ) -> String {
        // heads divide the hidden size unless a head size is given
        let hidden = if head_dim.is_some() { hidden } else { (hidden / heads).max(1) * heads };
        let mut t = format!(
            "[model.transformer]\nlayers = {layers}\nhidden = {hidden}\nheads = {heads}\n\
             seq_len = {seq}\nvocab = {vocab}\nseparate_qkv = {separate}\n\
             gated_ffn = {gated}\nkv_heads = {}\n",
            (heads / kv_div).max(1)
        );
        if let Some(f) = ffn {
            t += &format!("ffn = {f}\n");
        }
        // burn runs a plain stack
        if !burn {
            t += &format!("attention = \"{attention}\"\nqk_norm = {qk_norm}\n");
            if let Some(d) = head_dim {
                t += &format!("head_dim = {d}\n");
            }
            if gated && fused_gate_up {
                t += "fused_gate_up = true\n";
            }
            if let Some(w) = window {
                t += &format!("sliding_window = {w}\n");
            }
            if litgpt {
                t += "implementation = \"litgpt\"\n";
            }
            if let Some((experts, top_k, normalize, capacity)) = moe {
                t += &format!(
                    "[model.transformer.moe]\nexperts = {experts}\ntop_k = {}\n\
                     normalize_top_k = {normalize}\n",
                    top_k.min(experts)
                );
                if let Some(c) = capacity {
                    t += &format!("capacity_factor = {c}\n");
                }
            }
            if let Some(rank) = lora {
                t += &format!(
                    "[model.transformer.lora]\nrank = {rank}\ntargets = [\"q\", \"v\"]\n"
                );
            }
        }
        t += &format!(
            "[training]\nbatch_size = {batch}\nepochs = 1\nsteps_per_epoch = 1\n\
             [data]\nsamples = 1\nsize_variation = {}\n\
             [checkpointing]\npolicy = \"{checkpointing}\"\n",
            if variation { 0.5 } else { 0.0 }
        );
        t += match checkpointing {
            "every" => "every = 1\n",
            "budget" => "budget = \"1GiB\"\n",
            _ => "",
        };
        t += match precision {
            0 => "",
            1 => "[precision]\ncompute = \"bf16\"\n",
            _ if burn => "",
            _ => "[precision]\nautocast = \"bf16\"\n",
        };
        if burn {
            t = format!("framework = \"burn\"\n{t}");
        }
        t + &format!(
            "[device]\nkind = \"{}\"\ncapacity = \"{capacity}\"\n",
            if cpu { "cpu" } else { "cuda" }
        )
    }
}

prop_compose! {
    /// A small MLP, CNN or layer list with huge random widths, images and batches.
    fn other_plan()(
        kind in 0u8..3,
        a in width(40), b in width(24), c in width(16), batch in size(64),
        side in width(32), small in 1u64..64,
        capacity in proptest::sample::select(&["1GiB", "1024TiB"][..]),
    ) -> String {
        let model = match kind {
            0 => format!(
                "[model.mlp]\ninput = {a}\nhidden = [{b}]\noutput = {c}\nloss = \"cross_entropy\"\n"
            ),
            1 => format!(
                "[model.cnn]\nimage = [{small}, {side}, {side}]\nclasses = {c}\n\
                 [[model.cnn.layers]]\nop = \"conv\"\nout = {c}\nkernel = 1\n\
                 [[model.cnn.layers]]\nop = \"relu\"\n"
            ),
            _ => format!(
                "[model.layers]\ninput = [{a}, {small}]\nloss = \"mse\"\n\
                 [[model.layers.layers]]\nop = \"linear\"\nout = [{b}]\nparams = [{c}]\n\
                 [[model.layers.layers]]\nop = \"relu\"\n"
            ),
        };
        format!(
            "{model}[training]\nbatch_size = {batch}\nepochs = 1\nsteps_per_epoch = 1\n\
             [data]\nsamples = 1\n[device]\ncapacity = \"{capacity}\"\n"
        )
    }
}

/// Reads `toml` and, when it is an accepted plan, simulates it and explains the result: an
/// overflow anywhere is an error, never a panic.
fn simulate_or_refuse(toml: &str) {
    let Ok(plan) = Plan::from_toml_str(toml) else {
        return;
    };
    if let Ok(r) = simulate(&plan, SimOptions::default()) {
        let _ = trainmem_sim::explain(&plan, &r.timeline, &r.summary);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    /// Lowering and simulating a transformer at any sizes returns a result or an error.
    #[test]
    fn a_transformer_at_any_size_is_simulated_or_refused(toml in transformer_plan()) {
        simulate_or_refuse(&toml);
    }

    /// Lowering and simulating an MLP, a CNN or a layer list at any sizes returns a result or
    /// an error.
    #[test]
    fn other_models_at_any_size_are_simulated_or_refused(toml in other_plan()) {
        simulate_or_refuse(&toml);
    }
}

/// The same at the lowering alone: every transformer lowers or is a [`LowerError`], at the
/// plan's micro-batch too ([`trainmem_sim::lower::lower_plan`] checks every tensor of a
/// step).
///
/// [`LowerError`]: trainmem_sim::lower::LowerError
#[test]
fn lowering_alone_never_panics() {
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(1000));
    runner
        .run(&transformer_plan(), |toml| {
            if let Ok(plan) = Plan::from_toml_str(&toml) {
                let _ = trainmem_sim::lower::lower_plan(&plan);
                let _ = trainmem_sim::lower::lower(&plan.model);
            }
            Ok(())
        })
        .expect("no panic");
}
