//! LoRA adapters beside a frozen projection, as peft runs them: `y = W·x + B·(A·drop(x)) ·
//! alpha / rank`.
//!
//! Each adapter is two trainable linear layers without biases (`A`: `rank × in`, `B`:
//! `out × rank`). What they keep for backward follows from the ops: `A` keeps its input (the
//! dropout's output, or the projection's input itself without dropout), `B` keeps the
//! `rank`-wide output of `A`, the dropout (on a CPU device) its noise when its input needs a
//! gradient; the scaling and the sum keep nothing. The frozen projection keeps nothing for its
//! weight (its input is saved only by the adapter).

use trainmem_autograd::{ProgramBuilder, ValueId};

use trainmem_core::OpKind;

use trainmem_core::model::{LoraSpec, LoraTarget, TransformerSpec};

use super::{LowerError, product};

/// The parameter groups of `t`'s adapters (`(elements, count)` per tensor: `A` and `B` of
/// each target in each block), empty without LoRA.
///
/// A validated plan's adapters fit 64 bits (`LoraSpec::check`); an adapter of an
/// unvalidated model that does not is counted as `u64::MAX` elements, more than any
/// parameter's bytes can hold, which the model-state check reports as an overflow.
pub(crate) fn adapter_tensors(t: &TransformerSpec) -> Vec<(u64, u64)> {
    let Some(lora) = &t.lora else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for &target in &lora.targets {
        let Some((fin, fout)) = LoraSpec::checked_dims(t, target) else {
            return vec![(u64::MAX, t.layers)];
        };
        let elems = |width: u64| lora.rank.saturating_mul(width);
        out.push((elems(fin), t.layers));
        out.push((elems(fout), t.layers));
    }
    out
}

/// Adds the adapter of `target` (when `t` has one) to `base`, the output of a projection
/// of `x` named `name` whose output is `base_width` per token (the packed projection's when
/// `target` is one of its parts), `s` tokens per sample; returns the sum (or `base`).
/// `keep_up`: the adapter's up-projection output is kept for backward (litgpt's zero padding
/// of a packed projection's adapted parts).
#[allow(clippy::too_many_arguments)] // one adapter: where it reads, where it adds, its sizes
pub(crate) fn adapt(
    b: &mut ProgramBuilder,
    t: &TransformerSpec,
    target: LoraTarget,
    x: ValueId,
    base: ValueId,
    base_width: u64,
    s: u64,
    name: &str,
    keep_up: bool,
) -> Result<ValueId, LowerError> {
    let Some(lora) = t.lora.as_ref().filter(|l| l.targets.contains(&target)) else {
        return Ok(base);
    };
    let (fin, fout) = LoraSpec::checked_dims(t, target).ok_or_else(|| {
        LowerError(format!(
            "the width of the projection `{}` LoRA adapts overflows a 64-bit count",
            target.name()
        ))
    })?;
    let r = lora.rank;
    let input = if lora.dropout > 0.0 {
        let n = product(
            &[s, fin],
            "a LoRA adapter's dropout per sample (seq_len × in)",
        )?;
        b.op(OpKind::Dropout, &[x], n, &[])
    } else {
        x
    };
    let tag = target.name();
    let a = b.trainable_param(
        product(&[r, fin], "a LoRA adapter's A (rank × in)")?,
        format!("{name}.lora_{tag}.a"),
    );
    let bw = b.trainable_param(
        product(&[fout, r], "a LoRA adapter's B (out × rank)")?,
        format!("{name}.lora_{tag}.b"),
    );
    let low_n = product(
        &[s, r],
        "a LoRA adapter's low-rank output per sample (seq_len × rank)",
    )?;
    let up_n = product(
        &[s, fout],
        "a LoRA adapter's output per sample (seq_len × out)",
    )?;
    let sum_n = product(
        &[s, base_width],
        "an adapted projection's output per sample (seq_len × out)",
    )?;
    let low = b.op(OpKind::Linear, &[input], low_n, &[a]);
    let up = b.op(OpKind::Linear, &[low], up_n, &[bw]);
    if keep_up {
        b.save_extra(trainmem_autograd::Saved::Output);
    }
    let scaled = b.op(OpKind::Scale, &[up], up_n, &[]);
    Ok(b.op(OpKind::Add, &[base, scaled], sum_n, &[]))
}
