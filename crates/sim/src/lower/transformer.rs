//! A transformer stack as PyTorch's modules run it: embeddings, `layers` blocks, the final
//! norm and the head.
//!
//! A block is attention and a feed-forward, each after a norm, arranged as the plan's
//! [`BlockLayout`] says: one after the other (each with its residual sum), or side by side
//! reading the block's input (through two norms, or one they share) with both outputs added
//! to it. Around that the plan's settings add what each model family has:
//!
//! - the query, key and value projections packed in one matrix or as three, with heads of
//!   `head_dim` and `kv_heads` key/value heads (grouped-query attention);
//! - norms over each head's queries and keys (`qk_norm`): the attention then reads new
//!   queries and keys beside the values, one tensor of the packed width;
//! - norms on the attention's and the feed-forward's outputs (`post_norms`);
//! - a gated feed-forward with its gate and input projections as two matrices or one
//!   (`fused_gate_up`: two views of one output);
//! - a mixture of experts in place of the feed-forward ([`MoeSpec`]): a router and its
//!   softmax over every token, then the routed rows (`tokens × top_k`) gathered, passed
//!   through the experts' projections as one stack of rows (each expert's share of the rows
//!   adds up to the same tensors), weighted and summed back, the gathers keeping an i64
//!   index per routed row as `transformers`' `grouped_mm` path does; and a shared expert every
//!   token passes through, optionally gated;
//! - soft-capping of eager attention's scores and of the logits: a division, a tanh (its
//!   output kept) and a multiplication of the capped tensor's size.
//!
//! Rotary positions, full or partial, have no parameters and keep no more than the
//! attention keeps: the rotated queries and keys take the place of the projections' own,
//! which the rotation frees. They are not in the program. Neither is Gemma's scaling of the
//! embeddings by `√hidden`, which replaces the embedding's output by a tensor of the same size.
//!
//! Every size is checked: a product of the plan's sizes that does not fit 64 bits is a
//! [`LowerError`] naming it and its factors (and the plan's sizes), never an overflow.

use trainmem_autograd::{LossChunks, Program, ProgramBuilder, Saved, ValueDtype, ValueId};

use trainmem_core::{Dtype, OpKind};

use super::{LowerError, activation, lora, product, sum};
use crate::profile::Lowering;
use trainmem_core::model::*;

/// The sizes a transformer's ops share, and how its linear layers and norms are built.
struct TransformerDims {
    /// Sequence length.
    s: u64,
    /// Hidden size.
    h: u64,
    /// Query width (heads × head size), the attention's output width.
    q: u64,
    /// Key/value width (head size × key/value heads).
    kv: u64,
    /// Feed-forward size.
    f: u64,
    /// Tokens × hidden: the residual stream per sample.
    sh: u64,
    /// The packed projection's width (`q + 2 × kv`).
    qkv: u64,
    /// The attention's output per sample (`seq_len × q`).
    sq: u64,
    /// The attention's rows per sample (`heads × seq_len`).
    head_rows: u64,
    /// The attention's output projection has a bias.
    linear_bias: bool,
    /// The query, key and value projections have biases.
    qkv_bias: bool,
    /// The feed-forward's linear layers have biases.
    ffn_bias: bool,
    /// The norms have biases (layer norm).
    norm_bias: bool,
    norm_op: OpKind,
    /// Eager attention's softmax (composed of plain ops in a hand-written model).
    softmax_op: OpKind,
    /// The attention kernel that runs (eager or fused).
    kernel: AttentionImpl,
    /// Whose code runs the model.
    implementation: Implementation,
    /// On a GPU (else a CPU).
    gpu: bool,
}

impl TransformerDims {
    fn new(
        t: &TransformerSpec,
        gpu: bool,
        f32_attention: bool,
    ) -> Result<TransformerDims, LowerError> {
        let (s, h) = (t.seq_len, t.hidden);
        let d = t.head_size();
        let q = match t.checked_q_width() {
            Some(q) => q,
            None => product(&[t.heads, d], "the query width (heads × head size)")?,
        };
        let kv = match t.checked_kv_width() {
            Some(kv) => kv,
            None => product(
                &[t.kv_head_count(), d],
                "the key/value width (kv_heads × head size)",
            )?,
        };
        let f = match t.checked_ffn_size() {
            Some(f) => f,
            None => product(&[4, h], "the feed-forward size (4 × hidden)")?,
        };
        let qkv = sum(
            &[
                q,
                product(&[2, kv], "the keys' and values' width (2 × kv width)")?,
            ],
            "the packed query-key-value width (q + 2 × kv)",
        )?;
        if t.gated_ffn && t.fused_gate_up {
            product(&[2, f], "the packed gate and input width (2 × ffn)")?;
        }
        Ok(TransformerDims {
            s,
            h,
            q,
            kv,
            f,
            sh: product(&[s, h], "the residual stream per sample (seq_len × hidden)")?,
            qkv,
            sq: product(
                &[s, q],
                "the attention's output per sample (seq_len × query width)",
            )?,
            head_rows: product(
                &[t.heads, s],
                "the attention's rows per sample (heads × seq_len)",
            )?,
            linear_bias: t.linear_bias(),
            qkv_bias: t.qkv_has_bias(),
            ffn_bias: t.ffn_has_bias(),
            norm_bias: t.norm_bias(),
            // a hand-written RMS norm is what `rms_norm` already stands for (PyTorch's eager
            // one is composed too)
            norm_op: match (t.norm, t.implementation) {
                (NormKind::LayerNorm, Implementation::Handwritten) => OpKind::LayerNormComposed,
                (NormKind::LayerNorm, _) => OpKind::LayerNorm,
                (NormKind::RmsNorm, _) => OpKind::RmsNorm,
            },
            softmax_op: match t.implementation {
                Implementation::Handwritten => OpKind::SoftmaxComposed,
                _ => OpKind::Softmax,
            },
            kernel: t.attention.kernel(
                gpu,
                t.attention_dropout_p() > 0.0,
                // transformers hands grouped keys and values to SDPA (`enable_gqa`); litgpt
                // repeats them to every query head first, which the fused kernels take
                f32_attention
                    && t.kv_head_count() < t.heads
                    && t.implementation == Implementation::Transformers,
            ),
            implementation: t.implementation,
            gpu,
        })
    }

    /// `seq_len × width`: a tensor of `width` per token, per sample (`what` names it).
    fn per_token(&self, width: u64, what: &str) -> Result<u64, LowerError> {
        product(&[self.s, width], what)
    }

    /// A linear layer `fin → fout` per token, with a bias when `bias`.
    fn linear_with(
        &self,
        b: &mut ProgramBuilder,
        x: ValueId,
        (fin, fout): (u64, u64),
        bias: bool,
        name: String,
    ) -> Result<ValueId, LowerError> {
        let weight = product(&[fin, fout], "a linear layer's weight (in × out features)")?;
        let out = self.per_token(
            fout,
            "a linear layer's output per sample (seq_len × out features)",
        )?;
        let mut ps = vec![b.param(weight, format!("{name}.weight"))];
        if bias {
            ps.push(b.param(fout, format!("{name}.bias")));
        }
        Ok(b.op(OpKind::Linear, &[x], out, &ps))
    }

    /// [`TransformerDims::linear_with`] for the projection `target` of a block, with its
    /// LoRA adapter when `t` puts one on it (`parts`: the adapters that add into this
    /// projection's output, for a packed one).
    #[allow(clippy::too_many_arguments)] // a projection and the adapters on it
    fn projection(
        &self,
        b: &mut ProgramBuilder,
        t: &TransformerSpec,
        x: ValueId,
        (fin, fout): (u64, u64),
        bias: bool,
        name: String,
        parts: &[LoraTarget],
    ) -> Result<ValueId, LowerError> {
        let mut y = self.linear_with(b, x, (fin, fout), bias, name.clone())?;
        // litgpt's adapter on a packed query-key-value projection (`LoRAQKVLinear`) computes
        // the adapted parts as one tensor and, unless all three are adapted, pads it with
        // zeros to the projection's width (`index_copy_`, whose backward keeps that tensor)
        let packed_subset = self.implementation == Implementation::Litgpt
            && t.lora.as_ref().is_some_and(|l| {
                let adapted = |p: &LoraTarget| l.targets.contains(p);
                parts.contains(&LoraTarget::Qkv)
                    && !adapted(&LoraTarget::Qkv)
                    && parts.iter().any(adapted)
                    && !parts[1..].iter().all(adapted)
            });
        for &target in parts {
            y = lora::adapt(b, t, target, x, y, fout, self.s, &name, packed_subset)?;
        }
        Ok(y)
    }

    /// The query, key and value projections as three weights (and biases) computed as one
    /// packed output, with the adapters `parts` names.
    fn separate_qkv(
        &self,
        b: &mut ProgramBuilder,
        t: &TransformerSpec,
        x: ValueId,
        i: u64,
        parts: &[LoraTarget],
    ) -> Result<ValueId, LowerError> {
        let (h, q, kv) = (self.h, self.q, self.kv);
        let widths = [("q", q), ("k", kv), ("v", kv)];
        let mut ps: Vec<_> = widths
            .iter()
            .map(|&(n, w)| b.param_matrix(w, h, format!("block{i}.attn.{n}.weight")))
            .collect();
        if self.qkv_bias {
            for &(n, w) in &widths {
                ps.push(b.param(w, format!("block{i}.attn.{n}.bias")));
            }
        }
        let out = self.qkv;
        let packed = self.per_token(
            out,
            "the packed projection's output per sample (seq_len × (q + 2 × kv))",
        )?;
        let mut y = b.op(OpKind::Linear, &[x], packed, &ps);
        for &target in parts {
            y = lora::adapt(
                b,
                t,
                target,
                x,
                y,
                out,
                self.s,
                &format!("block{i}.attn.qkv"),
                false,
            )?;
        }
        Ok(y)
    }

    /// A norm over `width` elements per row, `rows` rows per sample.
    fn norm_over(
        &self,
        b: &mut ProgramBuilder,
        x: ValueId,
        (width, rows): (u64, u64),
        name: String,
    ) -> Result<ValueId, LowerError> {
        let out = product(&[rows, width], "a norm's output per sample (rows × width)")?;
        let mut ps = vec![b.param(width, format!("{name}.weight"))];
        if self.norm_bias {
            ps.push(b.param(width, format!("{name}.bias")));
        }
        Ok(b.op_rows(self.norm_op, &[x], out, &ps, rows))
    }

    /// A norm over the hidden size, per token.
    fn norm(
        &self,
        b: &mut ProgramBuilder,
        x: ValueId,
        name: String,
    ) -> Result<ValueId, LowerError> {
        self.norm_over(b, x, (self.h, self.s), name)
    }

    /// `cap · tanh(x / cap)` over `n` elements: tanh keeps its output.
    fn softcap(b: &mut ProgramBuilder, x: ValueId, n: u64) -> ValueId {
        let scaled = b.op(OpKind::Scale, &[x], n, &[]);
        let t = b.op(OpKind::Tanh, &[scaled], n, &[]);
        b.op(OpKind::Scale, &[t], n, &[])
    }

    /// A tensor of `n` elements per sample in the dtype of the projection `qkv`, which the
    /// attention keeps until backward beside what its table keeps (the key/value cache's
    /// copies, a mask's bias): a copy of the projection whose output is saved.
    fn kept_beside(b: &mut ProgramBuilder, qkv: ValueId, n: u64) {
        b.op(OpKind::Copy, &[qkv], n, &[]);
        b.save_extra(Saved::Output);
    }

    /// The keys and values per sample (`seq_len × 2 × kv`): the key/value cache's copies.
    fn cache_copies(&self) -> Result<u64, LowerError> {
        product(
            &[self.s, 2, self.kv],
            "the key/value cache's copies per sample (seq_len × 2 × kv width)",
        )
    }

    /// Attention over the packed `qkv` projection: eager (scores, softmax, context) or
    /// fused.
    fn attention(
        &self,
        b: &mut ProgramBuilder,
        t: &TransformerSpec,
        qkv: ValueId,
        i: u64,
    ) -> Result<ValueId, LowerError> {
        let (s, q) = (self.s, self.q);
        let sq = self.sq;
        Ok(match self.kernel {
            AttentionImpl::Eager => {
                // only eager attention makes the `heads × seq × seq` scores
                let scores_n = product(
                    &[t.heads, s, s],
                    "eager attention's scores per sample (heads × seq_len × seq_len)",
                )?;
                // with fewer key/value heads than query heads, `transformers` repeats the
                // keys and values to every query head (`repeat_kv`: two new tensors of the
                // queries' width the matmuls keep; the projection's own are freed)
                let repeats = t
                    .repeat_kv
                    .unwrap_or(self.implementation == Implementation::Transformers);
                if t.alibi && t.attention_keeps_cache_copies() {
                    // BLOOM's matmuls read the queries as views of the packed projection and
                    // the cache's copies of the keys and values
                    Self::kept_beside(b, qkv, self.cache_copies()?);
                }
                // (with one key/value head the repeat reshapes a broadcast view into a view:
                // nothing is copied, the matmuls keep the projection's own)
                let qkv = if repeats && self.kv < q && t.kv_head_count() > 1 {
                    let repeated = product(
                        &[s, 3, q],
                        "the repeated queries, keys and values per sample (seq_len × 3 × q)",
                    )?;
                    b.op(OpKind::Copy, &[qkv], repeated, &[])
                } else {
                    qkv
                };
                let scores = b.op(OpKind::Matmul, &[qkv, qkv], scores_n, &[]);
                let mut scaled = b.op(OpKind::Scale, &[scores], scores_n, &[]);
                if t.attn_softcap.is_some() {
                    scaled = Self::softcap(b, scaled, scores_n);
                }
                let mut probs =
                    b.op_rows(self.softmax_op, &[scaled], scores_n, &[], self.head_rows);
                if t.attention_dropout_p() > 0.0 {
                    probs = b.op(OpKind::Dropout, &[probs], scores_n, &[]);
                }
                let ctx = b.op(OpKind::Matmul, &[probs, qkv], sq, &[]);
                b.op(OpKind::Copy, &[ctx], sq, &[])
            }
            _ if self.implementation == Implementation::Litgpt => {
                // litgpt rotates the queries and keys into new tensors (`torch.cat` of the
                // rotated and the unrotated part) and, with fewer key/value heads than query
                // heads, repeats the keys and values to every query head
                // (`repeat_interleave`): the kernel keeps three new tensors of the queries'
                // width, the packed projection is freed. With as many key/value heads as
                // query heads the values stay a view of the packed projection, which the
                // kernel keeps alive beside the rotated queries and keys: one value of both
                // sizes stands for them.
                let kv = self.kv;
                let read = if kv < q {
                    product(&[3, q], "the repeated queries, keys and values (3 × q)")?
                } else {
                    // q + kv ≤ q + 2 × kv, which fits
                    sum(
                        &[q + kv, self.qkv],
                        "the rotated queries and keys beside the projection",
                    )?
                };
                let read =
                    self.per_token(read, "the tensors litgpt's attention keeps per sample")?;
                let qkv = b.op(OpKind::Copy, &[qkv], read, &[]);
                let y = b.op_rows(OpKind::FusedAttention, &[qkv], sq, &[], self.head_rows);
                if self.gpu {
                    y
                } else {
                    // the CPU kernel's output is laid out as its (contiguous) queries are:
                    // back to the hidden layout takes a copy
                    b.op(OpKind::Copy, &[y], sq, &[])
                }
            }
            _ => {
                if t.attention_keeps_cache_copies() {
                    // the keys and values copied into the key/value cache (`torch.cat`),
                    // which the kernel keeps beside the packed projection its queries view
                    Self::kept_beside(b, qkv, self.cache_copies()?);
                }
                if t.masked_attention(i) {
                    // the materialized mask as the kernel's additive bias, in the queries'
                    // dtype, kept for backward
                    let mask =
                        product(&[s, s], "the attention mask per sample (seq_len × seq_len)")?;
                    Self::kept_beside(b, qkv, mask);
                    // `transformers` hands SDPA grouped keys and values only without a mask
                    // (`use_gqa_in_sdpa`); with one it repeats them to every query head first
                    // (`repeat_kv`, a copy unless there is a single key/value head), and the
                    // kernel keeps the repeated ones in place of the grouped
                    if self.implementation == Implementation::Transformers
                        && self.kv < q
                        && t.kv_head_count() > 1
                    {
                        let repeated = product(
                            &[s, 2, q - self.kv],
                            "the repeated keys and values per sample (seq_len × 2 × (q − kv))",
                        )?;
                        Self::kept_beside(b, qkv, repeated);
                    }
                }
                let y = b.op_rows(OpKind::FusedAttention, &[qkv], sq, &[], self.head_rows);
                if t.partial_rotary {
                    // laid out head by head, as the concatenated queries are: back to the
                    // tokens' layout is a copy
                    b.op(OpKind::Copy, &[y], sq, &[])
                } else {
                    y
                }
            }
        })
    }

    /// The attention sub-layer of block `i` on its normed input `n`: projections, the
    /// heads' query and key norms, attention and the output projection.
    fn attention_sublayer(
        &self,
        b: &mut ProgramBuilder,
        t: &TransformerSpec,
        n: ValueId,
        i: u64,
    ) -> Result<ValueId, LowerError> {
        let (s, h, q, kv) = (self.s, self.h, self.q, self.kv);
        let qkv_parts = [LoraTarget::Qkv, LoraTarget::Q, LoraTarget::K, LoraTarget::V];
        let mut qkv = if t.separate_qkv {
            self.separate_qkv(b, t, n, i, &qkv_parts)?
        } else {
            self.projection(
                b,
                t,
                n,
                (h, self.qkv),
                self.qkv_bias,
                format!("block{i}.attn.qkv"),
                &qkv_parts,
            )?
        };
        if t.qk_norm {
            let d = t.head_size();
            // each norm reads its part of the projection (a view): a copy its code makes
            // (an f32 upcast) is of that part alone
            let queries = b.op(OpKind::View, &[qkv], self.sq, &[]);
            let keys = b.op(
                OpKind::View,
                &[qkv],
                self.per_token(kv, "the keys per sample (seq_len × kv width)")?,
                &[],
            );
            let qn = self.norm_over(
                b,
                queries,
                (d, self.head_rows),
                format!("block{i}.attn.q_norm"),
            )?;
            let key_rows = product(
                &[s, t.kv_head_count()],
                "the key norm's rows per sample (seq_len × kv_heads)",
            )?;
            let kn = self.norm_over(b, keys, (d, key_rows), format!("block{i}.attn.k_norm"))?;
            // the normed (and rotated) queries and keys beside the values
            let packed = self.per_token(
                self.qkv,
                "the packed projection's output per sample (seq_len × (q + 2 × kv))",
            )?;
            qkv = b.op(OpKind::Add, &[qn, kn], packed, &[]);
        }
        let ctx = self.attention(b, t, qkv, i)?;
        self.projection(
            b,
            t,
            ctx,
            (q, h),
            self.linear_bias,
            format!("block{i}.attn.out"),
            &[LoraTarget::O],
        )
    }

    /// A dense feed-forward of inner size `f` over the `s` tokens of `x`, its projections
    /// named under `name` (with the block's LoRA adapters when `adapt`).
    fn dense_ffn(
        &self,
        b: &mut ProgramBuilder,
        t: &TransformerSpec,
        x: ValueId,
        f: u64,
        name: &str,
        adapt: bool,
    ) -> Result<ValueId, LowerError> {
        let (h, bias) = (self.h, self.ffn_bias);
        let targets = |target| if adapt { vec![target] } else { Vec::new() };
        let sf = self.per_token(
            f,
            "the feed-forward's inner activations per sample (seq_len × ffn)",
        )?;
        let g = if t.gated_ffn && t.fused_gate_up {
            let gu_targets = targets(LoraTarget::GateUp);
            let width = product(&[2, f], "the packed gate and input width (2 × ffn)")?;
            let gu = self.projection(
                b,
                t,
                x,
                (h, width),
                bias,
                format!("{name}.gate_up"),
                &gu_targets,
            )?;
            let gate = b.op(OpKind::View, &[gu], sf, &[]);
            let up = b.op(OpKind::View, &[gu], sf, &[]);
            let a = activation(b, t.activation, gate, sf);
            b.op(OpKind::Mul, &[a, up], sf, &[])
        } else {
            let up_targets = targets(LoraTarget::Up);
            let a = self.projection(b, t, x, (h, f), bias, format!("{name}.up"), &up_targets)?;
            let mut g = activation(b, t.activation, a, sf);
            if t.gated_ffn {
                let gate_targets = targets(LoraTarget::Gate);
                let gate =
                    self.projection(b, t, x, (h, f), bias, format!("{name}.gate"), &gate_targets)?;
                g = b.op(OpKind::Mul, &[g, gate], sf, &[]);
            }
            g
        };
        let down_targets = targets(LoraTarget::Down);
        self.projection(b, t, g, (f, h), bias, format!("{name}.down"), &down_targets)
    }

    /// A mixture of experts over the normed tokens `x` of block `i`.
    fn moe(
        &self,
        b: &mut ProgramBuilder,
        t: &TransformerSpec,
        m: &MoeSpec,
        x: ValueId,
        i: u64,
    ) -> Result<ValueId, LowerError> {
        let (s, h) = (self.s, self.h);
        let rows = routed_rows(m, s)?;
        let name = format!("block{i}.moe");
        let weights = self.router(b, m, x, &name)?;
        let out = self.routed_experts(b, t, m, x, &name)?;
        let rows_h = product(
            &[rows, h],
            "the routed rows' activations per sample (rows × hidden)",
        )?;
        let weighted = b.op(OpKind::Mul, &[out, weights], rows_h, &[]);
        // back to the tokens' order (a gather through the inverse permutation, which it
        // keeps: an i64 per routed row) and summed over each token's k rows
        let mut combined = b.op_full(
            OpKind::Copy,
            &[weighted],
            self.sh,
            0,
            ValueDtype::Compute,
            &[],
            rows,
            0,
        );
        b.save_extra(Saved::RowIndices(1));
        if let Some(fs) = m.shared_expert_ffn {
            let mut shared = self.dense_ffn(b, t, x, fs, &format!("{name}.shared"), false)?;
            if m.shared_expert_gate {
                let w = b.param_matrix(1, h, format!("{name}.shared_gate.weight"));
                let g = b.op(OpKind::Linear, &[x], s, &[w]);
                let g = b.op(OpKind::Sigmoid, &[g], s, &[]);
                shared = b.op(OpKind::Mul, &[shared, g], self.sh, &[]);
            }
            combined = b.op(OpKind::Add, &[combined, shared], self.sh, &[]);
        }
        Ok(combined)
    }

    /// The router of mixture `name` over the tokens `x`; returns the top-k weights.
    fn router(
        &self,
        b: &mut ProgramBuilder,
        m: &MoeSpec,
        x: ValueId,
        name: &str,
    ) -> Result<ValueId, LowerError> {
        let (s, h) = (self.s, self.h);
        let (e, k) = (m.experts, m.top_k);
        let router = b.param_matrix(e, h, format!("{name}.router.weight"));
        let se = self.per_token(e, "the router's logits per sample (seq_len × experts)")?;
        let logits = b.op(OpKind::Linear, &[x], se, &[router]);
        let f32 = ValueDtype::Fixed(Dtype::F32);
        let probs = b.op_full(OpKind::Softmax, &[logits], se, 0, f32, &[], s, 0);
        // the top-k weights in the routed rows' order; their backward scatters through i64
        // indices the forward keeps: top-k's own (k per token) and the permutation that
        // sorts the routed rows by expert
        let sk = self.per_token(k, "the top-k weights per sample (seq_len × top_k)")?;
        // with weights /= weights.sum(-1) in place, the division keeps the undivided
        // weights (k f32 per token) and their sum (one per token): `k + 1` statistics per
        // token, as one saved entry of up to 255 per row, else one per row of `k + 1` rows
        // per token
        let per_token = sum(
            &[k, 1],
            "the top-k weights and their sum per token (top_k + 1)",
        )?;
        let stat_rows = if m.normalize_top_k && per_token > u64::from(u8::MAX) {
            self.per_token(
                per_token,
                "the top-k weights' statistics per sample (seq_len × (top_k + 1))",
            )?
        } else {
            s
        };
        let weights = b.op_full(
            OpKind::Copy,
            &[probs],
            sk,
            0,
            ValueDtype::Compute,
            &[],
            stat_rows,
            0,
        );
        b.save_extra(Saved::Indices);
        b.save_extra(Saved::Indices);
        if m.normalize_top_k {
            let n = u8::try_from(per_token).unwrap_or(1);
            b.save_extra(Saved::RowStats(n));
        }
        Ok(weights)
    }

    /// The routed rows of the tokens `x` through the experts of mixture `name`.
    fn routed_experts(
        &self,
        b: &mut ProgramBuilder,
        t: &TransformerSpec,
        m: &MoeSpec,
        x: ValueId,
        name: &str,
    ) -> Result<ValueId, LowerError> {
        let h = self.h;
        let e = m.experts;
        let fe = m.expert_ffn.unwrap_or(self.f);
        let rows = routed_rows(m, self.s)?;
        let per_row = |width: u64, what: &str| product(&[rows, width], what);
        // a gather that keeps, per row, the i64 index of the token it read
        let gathered = b.op_full(
            OpKind::Copy,
            &[x],
            per_row(h, "the routed rows per sample (rows × hidden)")?,
            0,
            ValueDtype::Compute,
            &[],
            rows,
            0,
        );
        b.save_extra(Saved::RowIndices(1));
        let inner = if t.gated_ffn {
            product(
                &[2, fe],
                "an expert's packed gate and input width (2 × expert ffn)",
            )?
        } else {
            fe
        };
        let w_in = b.param_matrix(
            product(
                &[e, inner],
                "the experts' input projections' rows (experts × inner)",
            )?,
            h,
            format!("{name}.experts.gate_up"),
        );
        let projected = b.op(
            OpKind::Linear,
            &[gathered],
            per_row(
                inner,
                "the experts' inner activations per sample (rows × inner)",
            )?,
            &[w_in],
        );
        let rows_fe = per_row(
            fe,
            "the experts' inner activations per sample (rows × expert ffn)",
        )?;
        let mid = if t.gated_ffn {
            let gate = b.op(OpKind::View, &[projected], rows_fe, &[]);
            let up = b.op(OpKind::View, &[projected], rows_fe, &[]);
            let a = activation(b, t.activation, gate, rows_fe);
            b.op(OpKind::Mul, &[a, up], rows_fe, &[])
        } else {
            activation(b, t.activation, projected, rows_fe)
        };
        let w_out = b.param_matrix(
            product(
                &[e, h],
                "the experts' output projections' rows (experts × hidden)",
            )?,
            fe,
            format!("{name}.experts.down"),
        );
        Ok(b.op(
            OpKind::Linear,
            &[mid],
            per_row(h, "the experts' outputs per sample (rows × hidden)")?,
            &[w_out],
        ))
    }

    /// The feed-forward sub-layer of block `i` on its normed input `n`.
    fn ffn_sublayer(
        &self,
        b: &mut ProgramBuilder,
        t: &TransformerSpec,
        n: ValueId,
        i: u64,
    ) -> Result<ValueId, LowerError> {
        match &t.moe {
            Some(m) => self.moe(b, t, m, n, i),
            None => self.dense_ffn(b, t, n, self.f, &format!("block{i}.ffn"), true),
        }
    }

    /// A sub-layer's output on its way to the residual sum: its post-norm, its dropout.
    fn finish_sublayer(
        &self,
        b: &mut ProgramBuilder,
        t: &TransformerSpec,
        y: ValueId,
        name: String,
    ) -> Result<ValueId, LowerError> {
        let mut y = y;
        if t.post_norms {
            y = self.norm(b, y, name)?;
        }
        if t.dropout > 0.0 {
            y = b.op(OpKind::Dropout, &[y], self.sh, &[]);
        }
        Ok(y)
    }

    /// Block `i`: attention and feed-forward with their residual sums, as `t.block` lays
    /// them out.
    fn block(
        &self,
        b: &mut ProgramBuilder,
        t: &TransformerSpec,
        x: ValueId,
        i: u64,
    ) -> Result<ValueId, LowerError> {
        let sh = self.sh;
        let n1 = self.norm(b, x, format!("block{i}.norm1"))?;
        let a = self.attention_sublayer(b, t, n1, i)?;
        Ok(match t.block {
            BlockLayout::Sequential => {
                let a = self.finish_sublayer(b, t, a, format!("block{i}.attn.post_norm"))?;
                let x = b.op(OpKind::Add, &[x, a], sh, &[]);
                let n2 = self.norm(b, x, format!("block{i}.norm2"))?;
                let m = self.ffn_sublayer(b, t, n2, i)?;
                let m = self.finish_sublayer(b, t, m, format!("block{i}.ffn.post_norm"))?;
                b.op(OpKind::Add, &[x, m], sh, &[])
            }
            BlockLayout::Parallel | BlockLayout::ParallelSharedNorm => {
                let n2 = if t.block == BlockLayout::Parallel {
                    self.norm(b, x, format!("block{i}.norm2"))?
                } else {
                    n1
                };
                let m = self.ffn_sublayer(b, t, n2, i)?;
                let a = self.finish_sublayer(b, t, a, format!("block{i}.attn.post_norm"))?;
                let m = self.finish_sublayer(b, t, m, format!("block{i}.ffn.post_norm"))?;
                let both = b.op(OpKind::Add, &[a, m], sh, &[]);
                b.op(OpKind::Add, &[x, both], sh, &[])
            }
        })
    }
}

/// A mixture's routed rows for `tokens` tokens ([`MoeSpec::routed_rows`]), checked.
fn routed_rows(m: &MoeSpec, tokens: u64) -> Result<u64, LowerError> {
    m.checked_routed_rows(tokens).ok_or_else(|| {
        LowerError(format!(
            "the experts' routed rows per sample (seq_len × top_k{}): {tokens} × {}{} \
             overflows a 64-bit count",
            if m.capacity_factor.is_some() {
                " × capacity_factor"
            } else {
                ""
            },
            m.top_k,
            m.capacity_factor
                .map_or(String::new(), |c| format!(" × {c}")),
        ))
    })
}

/// Lowers `t` under `layout`, its attention the kernel it takes on a GPU (`gpu`) or a CPU,
/// in f32 (`f32_attention`) or half precision. A size that does not fit 64 bits is an error
/// naming it, its factors and the model's sizes.
pub(super) fn lower_transformer(
    t: &TransformerSpec,
    layout: &Lowering,
    gpu: bool,
    f32_attention: bool,
) -> Result<Program, LowerError> {
    build(t, layout, gpu, f32_attention).map_err(|e| {
        LowerError(format!(
            "{e} (the model's seq_len {}, hidden {}, heads {}, ffn {}, vocab {}); is a size \
             mistyped?",
            t.seq_len,
            t.hidden,
            t.heads,
            t.ffn
                .map_or_else(|| "4 × hidden".to_string(), |f| f.to_string()),
            t.vocab
        ))
    })
}

fn build(
    t: &TransformerSpec,
    layout: &Lowering,
    gpu: bool,
    f32_attention: bool,
) -> Result<Program, LowerError> {
    let dims = TransformerDims::new(t, gpu, f32_attention)?;
    let (s, h, sh) = (dims.s, dims.h, dims.sh);
    let mut b = ProgramBuilder::new();
    // under LoRA every parameter but the adapters' is frozen
    b.freeze_params(t.lora.is_some());
    let ids = ValueDtype::Fixed(layout.int_dtype);
    let tokens = b.input(s, ids);
    b.begin_layer("embed");
    let tok = b.param(
        product(&[t.vocab, h], "the token embedding (vocab × hidden)")?,
        "embed.tokens",
    );
    let mut ps = vec![tok];
    if t.learned_positions {
        ps.push(b.param(
            product(
                &[t.position_rows(), h],
                "the position embedding (positions × hidden)",
            )?,
            "embed.positions",
        ));
    }
    if t.token_types > 0 {
        ps.push(b.param(
            product(
                &[t.token_types, h],
                "the token-type embedding (token types × hidden)",
            )?,
            "embed.token_types",
        ));
    }
    let mut x = b.op(OpKind::Embedding, &[tokens], sh, &ps);
    if t.embedding_norm {
        x = dims.norm(&mut b, x, "embed.norm".into())?;
    }
    if t.dropout > 0.0 {
        x = b.op(OpKind::Dropout, &[x], sh, &[]);
    }
    for i in 0..t.layers {
        b.begin_block(format!("block{i}"));
        x = dims.block(&mut b, t, x, i)?;
    }
    b.begin_layer("head");
    let n = if t.final_norm.unwrap_or(layout.transformer_final_norm) {
        dims.norm(&mut b, x, "final_norm".into())?
    } else {
        x
    };
    match t.kind {
        TransformerKind::Decoder => {
            let w = if t.tied_embeddings {
                tok
            } else {
                b.param(
                    product(&[t.vocab, h], "the language-model head (vocab × hidden)")?,
                    "lm_head.weight",
                )
            };
            let mut ps = vec![w];
            if t.head_bias.unwrap_or(layout.lm_head_bias) {
                ps.push(b.param(t.vocab, "lm_head.bias"));
            }
            let logits_n = dims.per_token(t.vocab, "the logits per sample (seq_len × vocab)")?;
            let mut logits = b.op(OpKind::Linear, &[n], logits_n, &ps);
            if t.logit_softcap.is_some() {
                logits = TransformerDims::softcap(&mut b, logits, logits_n);
            }
            let targets = b.input(s, ids);
            b.loss(OpKind::CrossEntropy, &[logits, targets]);
            if let Some(chunk) = t.head_chunk_positions() {
                b.chunk_loss(loss_chunks(chunk, s, t.implementation));
            }
        }
        TransformerKind::Encoder => {
            let classes = t.classes.unwrap_or(2);
            let take = if layout.first_token_is_view {
                OpKind::View
            } else {
                OpKind::Copy
            };
            let mut first = b.op(take, &[n], h, &[]);
            if t.pooler {
                let pw = b.param(
                    product(&[h, h], "the pooler (hidden × hidden)")?,
                    "pooler.weight",
                );
                let pb = b.param(h, "pooler.bias");
                let pooled = b.op(OpKind::Linear, &[first], h, &[pw, pb]);
                first = b.op(OpKind::Tanh, &[pooled], h, &[]);
            }
            let w = b.param(
                product(&[h, classes], "the classifier (hidden × classes)")?,
                "classifier.weight",
            );
            let bb = b.param(classes, "classifier.bias");
            let logits = b.op(OpKind::Linear, &[first], classes, &[w, bb]);
            let targets = b.input(1, ids);
            b.loss(OpKind::CrossEntropy, &[logits, targets]);
        }
    }
    b.finish().map_err(|e| LowerError(e.to_string()))
}

/// The chunks of a head computed `chunk` positions at a time over `s` positions: litgpt drops
/// the last position of the last chunk (the shift to next-token targets), and reshaping that
/// slice copies the chunk's remaining positions.
fn loss_chunks(chunk: u64, s: u64, implementation: Implementation) -> LossChunks {
    let last = s - (s - 1) / chunk * chunk;
    let copied = if implementation == Implementation::Litgpt {
        last - 1
    } else {
        0
    };
    LossChunks {
        positions: chunk,
        of: s,
        copied,
    }
}
