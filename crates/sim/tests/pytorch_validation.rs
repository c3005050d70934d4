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
        if c.name.contains("adamw") {
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
        // trainable parameter (4 bytes each)
        if c.name.contains("adamw") {
            assert!(row(&c, "optimizer_state").measured >= 2 * 4 * c.trainable);
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

/// Figures not yet within target, with why (none now). LLaMA under Hugging Face's
/// checkpointing missed its activation target (−8.7%) while the twin ran LLaMA's attention
/// eagerly and its RMS norm without the normalized tensor the weight's gradient reads; with
/// the fused (SDPA) attention Hugging Face runs and that tensor it is −1.1%: what is left are
/// the few tensors made outside the blocks (rotary cos/sin tables, shifted labels).
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
