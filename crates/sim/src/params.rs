//! The parameter tensors a model has, counted without lowering it.
//!
//! [`param_groups`] gives the sizes of the parameter tensors [`crate::lower`] creates, as
//! groups of equal tensors with their counts: a transformer's blocks repeat, so its count
//! costs the same for 10 layers as for 10⁹. Every product is checked: a model whose element
//! count overflows 64 bits is an [`ParamOverflow`], named with the figures that overflowed.
//! The simulator works the model state out from these groups before it lowers or simulates
//! anything (`engine`'s model-state check).

use trainmem_core::Framework;

use crate::profile::{FrameworkProfile, Lowering};
use trainmem_core::model::{BlockLayout, ModelSpec, TransformerKind, TransformerSpec};

/// `count` parameter tensors of `elems` elements each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParamGroup {
    /// Elements of each tensor.
    pub elems: u64,
    /// How many tensors of that size.
    pub count: u64,
}

/// A parameter count does not fit a 64-bit integer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ParamOverflow(pub String);

/// `a × b`, or an overflow naming `what`.
pub(crate) fn mul(a: u64, b: u64, what: &str) -> Result<u64, ParamOverflow> {
    a.checked_mul(b)
        .ok_or_else(|| ParamOverflow(format!("{what}: {a} × {b} overflows a 64-bit count")))
}

/// `a + b`, or an overflow naming `what`.
pub(crate) fn add(a: u64, b: u64, what: &str) -> Result<u64, ParamOverflow> {
    a.checked_add(b)
        .ok_or_else(|| ParamOverflow(format!("{what}: {a} + {b} overflows a 64-bit count")))
}

/// The parameter tensors `model` has under `framework`'s module layout, grouped by size
/// (`Ok(None)`: the model is invalid; lowering it reports why).
pub fn param_groups(
    model: &ModelSpec,
    framework: Framework,
) -> Result<Option<Vec<ParamGroup>>, ParamOverflow> {
    let layout = &FrameworkProfile::of(framework).lowering;
    let one = |elems| ParamGroup { elems, count: 1 };
    Ok(Some(match model {
        ModelSpec::Transformer(t) => return transformer_groups(t, layout),
        ModelSpec::Mlp(m) => {
            let mut out = Vec::new();
            let mut width = m.input;
            for &h in m.hidden.iter().chain([&m.output]) {
                out.push(one(mul(width, h, "mlp weight")?));
                if m.bias {
                    out.push(one(h));
                }
                width = h;
            }
            out
        }
        ModelSpec::Layers(l) => {
            if trainmem_core::model_check::check_layers(l).is_err() {
                return Ok(None);
            }
            l.layers
                .iter()
                .flat_map(|layer| layer.params.iter().map(|&e| one(e)))
                .collect()
        }
        // a CNN's layers are listed one by one in the plan: lowering it costs no more than
        // reading it
        ModelSpec::Cnn(_) => match crate::lower::lower_for(model, framework) {
            Ok(p) => p.params.iter().map(|p| one(p.elems)).collect(),
            Err(_) => return Ok(None),
        },
    }))
}

/// The tensors of one norm over `width` elements (a weight, and a bias under layer norm).
fn norm_tensors(t: &TransformerSpec, width: u64) -> Vec<u64> {
    if t.norm_bias() {
        vec![width, width]
    } else {
        vec![width]
    }
}

/// A linear layer's tensors: its `fin × fout` weight, and a bias when `bias`.
fn linear_tensors(fin: u64, fout: u64, bias: bool, what: &str) -> Result<Vec<u64>, ParamOverflow> {
    let mut out = vec![mul(fin, fout, what)?];
    if bias {
        out.push(fout);
    }
    Ok(out)
}

/// A dense feed-forward's tensors at inner size `f`.
fn dense_ffn_tensors(t: &TransformerSpec, f: u64) -> Result<Vec<u64>, ParamOverflow> {
    let (h, bias) = (t.hidden, t.ffn_has_bias());
    let mut out = Vec::new();
    if t.gated_ffn && t.fused_gate_up {
        out.extend(linear_tensors(
            h,
            mul(2, f, "gate and input width")?,
            bias,
            "feed-forward",
        )?);
    } else {
        out.extend(linear_tensors(h, f, bias, "feed-forward")?);
        if t.gated_ffn {
            out.extend(linear_tensors(h, f, bias, "feed-forward")?);
        }
    }
    out.extend(linear_tensors(f, h, bias, "feed-forward")?);
    Ok(out)
}

/// The tensors of one block of `t`, as `lower` builds it.
fn block_tensors(t: &TransformerSpec) -> Result<Vec<u64>, ParamOverflow> {
    let h = t.hidden;
    let d = t.head_size();
    let q = mul(t.heads, d, "query width")?;
    let kv = mul(t.kv_head_count(), d, "key/value width")?;
    let qkv_bias = t.qkv_has_bias();
    let mut out = norm_tensors(t, h);
    if t.separate_qkv {
        for w in [q, kv, kv] {
            out.push(mul(h, w, "block weight")?);
        }
        if qkv_bias {
            out.extend([q, kv, kv]);
        }
    } else {
        let width = add(q, mul(2, kv, "key/value width")?, "qkv width")?;
        out.extend(linear_tensors(h, width, qkv_bias, "block weight")?);
    }
    if t.qk_norm {
        out.extend(norm_tensors(t, d));
        out.extend(norm_tensors(t, d));
    }
    out.extend(linear_tensors(q, h, t.linear_bias(), "block weight")?);
    if t.post_norms {
        out.extend(norm_tensors(t, h));
        out.extend(norm_tensors(t, h));
    }
    if t.block != BlockLayout::ParallelSharedNorm {
        out.extend(norm_tensors(t, h));
    }
    match &t.moe {
        None => out.extend(dense_ffn_tensors(t, t.ffn_size())?),
        Some(m) => {
            let e = m.experts;
            let fe = m.expert_ffn.unwrap_or(t.ffn_size());
            let inner = if t.gated_ffn {
                mul(2, fe, "expert width")?
            } else {
                fe
            };
            out.push(mul(e, h, "router")?);
            out.push(mul(
                mul(e, inner, "experts")?,
                h,
                "experts' input projections",
            )?);
            out.push(mul(
                mul(e, h, "experts")?,
                fe,
                "experts' output projections",
            )?);
            if let Some(fs) = m.shared_expert_ffn {
                out.extend(dense_ffn_tensors(t, fs)?);
                if m.shared_expert_gate {
                    out.push(h);
                }
            }
        }
    }
    Ok(out)
}

/// A transformer's groups, as `lower` builds it: embeddings, `layers` identical blocks,
/// the final norm and the head.
fn transformer_groups(
    t: &TransformerSpec,
    layout: &Lowering,
) -> Result<Option<Vec<ParamGroup>>, ParamOverflow> {
    if t.head_size() == 0 {
        return Ok(None);
    }
    let h = t.hidden;
    let norm_bias = t.norm_bias();
    let once = |elems| ParamGroup { elems, count: 1 };
    let mut out = vec![once(mul(t.vocab, h, "token embedding")?)];
    if t.learned_positions {
        out.push(once(mul(t.position_rows(), h, "position embedding")?));
    }
    if t.token_types > 0 {
        out.push(once(mul(t.token_types, h, "token-type embedding")?));
    }
    if t.embedding_norm {
        out.push(once(h));
        if norm_bias {
            out.push(once(h));
        }
    }
    let per_block = block_tensors(t)?;
    let block_elems = per_block
        .iter()
        .try_fold(0u64, |acc, &e| add(acc, e, "parameters of one block"))?;
    // the whole stack's element count must fit too
    mul(
        t.layers,
        block_elems,
        "parameters of the blocks (layers × per block)",
    )?;
    out.extend(per_block.iter().map(|&elems| ParamGroup {
        elems,
        count: t.layers,
    }));
    for (elems, count) in crate::lower::lora::adapter_tensors(t) {
        out.push(ParamGroup { elems, count });
    }
    if t.final_norm.unwrap_or(layout.transformer_final_norm) {
        out.push(once(h));
        if norm_bias {
            out.push(once(h));
        }
    }
    match t.kind {
        TransformerKind::Decoder => {
            if !t.tied_embeddings {
                out.push(once(mul(t.vocab, h, "language-model head")?));
            }
            if t.head_bias.unwrap_or(layout.lm_head_bias) {
                out.push(once(t.vocab));
            }
        }
        TransformerKind::Encoder => {
            let classes = t.classes.unwrap_or(2);
            if t.pooler {
                out.push(once(mul(h, h, "pooler")?));
                out.push(once(h));
            }
            out.push(once(mul(h, classes, "classifier")?));
            out.push(once(classes));
        }
    }
    Ok(Some(out))
}

/// The trainable parameter tensors of `model` (those with gradients and optimizer state),
/// grouped by size: under LoRA the adapters alone, otherwise every parameter
/// ([`param_groups`]).
pub fn trainable_groups(
    model: &ModelSpec,
    framework: Framework,
) -> Result<Option<Vec<ParamGroup>>, ParamOverflow> {
    match model {
        ModelSpec::Transformer(t) if t.lora.is_some() => {
            if t.head_size() == 0 {
                return Ok(None);
            }
            let mut out = Vec::new();
            for (elems, count) in crate::lower::lora::adapter_tensors(t) {
                mul(elems, count, "adapter parameters")?;
                out.push(ParamGroup { elems, count });
            }
            Ok(Some(out))
        }
        _ => param_groups(model, framework),
    }
}

/// Total elements of `groups` (checked).
pub fn total_elems(groups: &[ParamGroup]) -> Result<u64, ParamOverflow> {
    groups.iter().try_fold(0u64, |acc, g| {
        add(
            acc,
            mul(g.elems, g.count, "parameter elements")?,
            "parameter elements",
        )
    })
}

/// Total tensors of `groups` (checked).
pub fn total_tensors(groups: &[ParamGroup]) -> Result<u64, ParamOverflow> {
    groups
        .iter()
        .try_fold(0u64, |acc, g| add(acc, g.count, "parameter tensors"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use trainmem_core::model::*;

    /// The sizes `lower` gives, sorted.
    fn lowered(model: &ModelSpec, fw: Framework) -> Vec<u64> {
        let p = crate::lower::lower_for(model, fw).expect("lowers");
        let mut v: Vec<u64> = p.params.iter().map(|p| p.elems).collect();
        v.sort_unstable();
        v
    }

    /// The sizes of `param_groups`, expanded and sorted.
    fn counted(model: &ModelSpec, fw: Framework) -> Vec<u64> {
        let groups = param_groups(model, fw)
            .expect("no overflow")
            .expect("valid");
        let mut v: Vec<u64> = groups
            .iter()
            .flat_map(|g| std::iter::repeat_n(g.elems, g.count as usize))
            .collect();
        v.sort_unstable();
        v
    }

    fn framework() -> impl Strategy<Value = Framework> {
        prop_oneof![Just(Framework::Pytorch), Just(Framework::Burn)]
    }

    prop_compose! {
        fn transformer()(
            layers in 1u64..5, head_dim in 1u64..9, kv in 1u64..4, group in 1u64..3,
            ffn in proptest::option::of(1u64..40), gated in any::<bool>(),
            s in 1u64..20, vocab in 1u64..50, tied in any::<bool>(),
            rms in any::<bool>(), positions in any::<bool>(), encoder in any::<bool>(),
            classes in proptest::option::of(1u64..7), grouped in any::<bool>(),
            lora in proptest::option::of((1u64..5, 1u8..=127)), separate_qkv in any::<bool>(),
            extra in (
                proptest::option::of(1u64..30), proptest::option::of(any::<bool>()),
                proptest::option::of(any::<bool>()), proptest::option::of(any::<bool>()),
                any::<bool>(), 0u64..3, any::<bool>(),
            ),
            features in (
                proptest::option::of(1u64..9), 0u8..3, proptest::option::of(any::<bool>()),
                proptest::option::of(any::<bool>()), any::<bool>(), any::<bool>(),
                any::<bool>(), any::<bool>(), any::<bool>(),
            ),
            moe in proptest::option::of((
                1u64..5, 1u64..5, proptest::option::of(1u64..20),
                proptest::option::of(1u64..20), any::<bool>(), proptest::option::of(0.5f64..2.0),
                any::<bool>(),
            )),
        ) -> TransformerSpec {
            let (max_positions, bias, qkv_bias, final_norm, embedding_norm, token_types, pooler) =
                extra;
            let (own_head_dim, block, ffn_bias, head_bias, post_norms, qk_norm, fused_gate_up,
                 logit_softcap, attn_softcap) = features;
            let heads = kv * group;
            let moe = moe.map(|(experts, k, expert_ffn, shared, gate, capacity, normalize)| MoeSpec {
                experts,
                top_k: k.min(experts),
                expert_ffn,
                shared_expert_ffn: shared,
                shared_expert_gate: gate && shared.is_some(),
                normalize_top_k: normalize,
                capacity_factor: capacity,
            });
            // adapters on the feed-forward of a mixture of experts are not modelled
            let lora = lora.map(|(rank, mask)| {
                let mut l = lora_spec(rank, mask, gated, gated && fused_gate_up);
                if moe.is_some() {
                    l.targets.retain(|t| matches!(t, LoraTarget::Q | LoraTarget::K
                        | LoraTarget::V | LoraTarget::Qkv | LoraTarget::O));
                    if l.targets.is_empty() {
                        l.targets.push(LoraTarget::O);
                    }
                }
                l
            });
            TransformerSpec {
                kind: if encoder { TransformerKind::Encoder } else { TransformerKind::Decoder },
                layers,
                hidden: head_dim * heads,
                heads,
                kv_heads: grouped.then_some(kv),
                ffn,
                gated_ffn: gated,
                seq_len: s,
                vocab,
                tied_embeddings: tied,
                activation: Activation::Gelu,
                norm: if rms { NormKind::RmsNorm } else { NormKind::LayerNorm },
                dropout: 0.0,
                attention: AttentionImpl::Eager,
                learned_positions: positions,
                classes,
                max_positions,
                bias,
                qkv_bias,
                final_norm,
                embedding_norm,
                token_types,
                pooler,
                separate_qkv,
                head_dim: own_head_dim,
                block: [BlockLayout::Sequential, BlockLayout::Parallel,
                        BlockLayout::ParallelSharedNorm][block as usize],
                ffn_bias,
                head_bias,
                post_norms,
                qk_norm,
                fused_gate_up: gated && fused_gate_up,
                logit_softcap: logit_softcap.then_some(30.0),
                attn_softcap: attn_softcap.then_some(50.0),
                moe,
                lora,
                // the rest (the implementation and what its code does) as a plan leaves it
                ..TransformerSpec::new(TransformerKind::Decoder, layers, head_dim * heads, heads, s, vocab)
            }
        }
    }

    /// Rank-`rank` adapters on the projections `mask` picks (q, k, v, o, up, gate, down by
    /// bit; or the packed qkv in place of q, k, v when bit 7's place is taken by q, k and v
    /// together), skipping `gate` without a gated feed-forward, and the packed `gate_up` in
    /// place of `up` and `gate` when they are one matrix (`packed_gate_up`).
    fn lora_spec(rank: u64, mask: u8, gated: bool, packed_gate_up: bool) -> LoraSpec {
        use LoraTarget::*;
        let mut targets: Vec<LoraTarget> = [Q, K, V, O, Up, Gate, Down]
            .into_iter()
            .enumerate()
            .filter(|&(i, t)| mask & (1 << i) != 0 && (t != Gate || gated))
            .map(|(_, t)| t)
            .collect();
        if packed_gate_up && targets.iter().any(|t| matches!(t, Up | Gate)) {
            targets.retain(|t| !matches!(t, Up | Gate));
            targets.push(GateUp);
        }
        if mask & 0b111 == 0b111 {
            targets.retain(|t| !matches!(t, Q | K | V));
            targets.insert(0, Qkv);
        }
        if targets.is_empty() {
            targets.push(O);
        }
        LoraSpec {
            rank,
            alpha: None,
            targets,
            dropout: if mask & 1 == 0 { 0.0 } else { 0.1 },
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]
        #[test]
        fn transformer_counts_match_lowering(t in transformer(), fw in framework()) {
            let m = ModelSpec::Transformer(t);
            prop_assert_eq!(counted(&m, fw), lowered(&m, fw));
            // the trainable tensors are the lowered program's unfrozen ones
            let p = crate::lower::lower_for(&m, fw).expect("lowers");
            let trainable = trainable_groups(&m, fw).expect("no overflow").expect("valid");
            prop_assert_eq!(total_elems(&trainable).expect("fits"), p.trainable_elems());
            prop_assert_eq!(
                total_tensors(&trainable).expect("fits"),
                p.params.iter().filter(|p| !p.frozen).count() as u64
            );
        }

        #[test]
        fn mlp_counts_match_lowering(
            input in 1u64..50, hidden in proptest::collection::vec(1u64..50, 0..5),
            output in 1u64..20, bias in any::<bool>(), fw in framework(),
        ) {
            let m = ModelSpec::Mlp(MlpSpec {
                input, hidden, output, activation: Activation::Relu, dropout: 0.0, bias,
                loss: Loss::Mse,
            });
            prop_assert_eq!(counted(&m, fw), lowered(&m, fw));
        }
    }

    #[test]
    fn every_plan_of_the_repository_counts_as_it_lowers() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let mut seen = 0;
        for dir in ["fixtures/plans", "crates/scenarios/plans"] {
            for entry in std::fs::read_dir(root.join(dir)).expect("plans directory") {
                let path = entry.expect("entry").path();
                if path.extension().is_none_or(|e| e != "toml") {
                    continue;
                }
                let plan = trainmem_core::Plan::load(&path).expect("plan loads");
                let (c, l) = (
                    counted(&plan.model, plan.framework),
                    lowered(&plan.model, plan.framework),
                );
                assert_eq!(c, l, "{}", path.display());
                seen += 1;
            }
        }
        assert!(seen >= 30, "{seen} plans");
    }

    #[test]
    fn a_billion_wide_layers_overflow_naming_the_figures() {
        let t = TransformerSpec::new(
            TransformerKind::Decoder,
            1_000_000_000,
            1_000_000,
            8,
            128,
            1000,
        );
        let e = param_groups(&ModelSpec::Transformer(t), Framework::Pytorch).unwrap_err();
        // a block of hidden h: 12h² + 13h elements
        let block = 12 * 1_000_000u64.pow(2) + 13 * 1_000_000;
        assert!(e.0.contains("1000000000 × "), "{e}");
        assert!(e.0.contains(&block.to_string()), "{e}");
    }
}
