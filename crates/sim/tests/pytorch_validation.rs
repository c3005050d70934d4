//! The twin against real PyTorch runs recorded on CPU (`fixtures/pytorch/`, written by
//! `validation/pytorch/record.py`; `cargo xtask validate pytorch` prints the whole table).
//!
//! What holds today, and must keep holding: every plan made from a recording has the real
//! model's parameter count; parameters, gradients and optimizer state are within 0.1% on every
//! run; the MLP is within target in every category and in its total peak; the LLaMA-style
//! decoder's activations are within 3%. The transformers' other activations and total peaks
//! are not yet within target (cross-entropy's two-step backward, dropout's saved noise on CPU
//! and the small buffers are not modelled); the table shows by how much.

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
        // the recorded state is there to be matched: AdamW holds two moments
        if c.name.contains("adamw") {
            assert!(row(&c, "optimizer_state").measured >= 2 * row(&c, "parameter").measured);
        }
    }
}

#[test]
fn the_mlp_is_within_target_everywhere_and_llama_activations_within_three_percent() {
    let all = comparisons();
    let mut seen = 0;
    for c in &all {
        if c.name.starts_with("mlp-") {
            for r in &c.rows {
                assert!(
                    r.within(),
                    "{} {}: {:+.2}%",
                    c.name,
                    r.what,
                    100.0 * r.error()
                );
            }
            seen += 1;
        }
        if c.name.starts_with("llama-tiny-") {
            let r = row(c, "activation");
            assert!(
                r.within(),
                "{}: activations {:+.2}%",
                c.name,
                100.0 * r.error()
            );
            seen += 1;
        }
    }
    assert_eq!(seen, 4);
}
