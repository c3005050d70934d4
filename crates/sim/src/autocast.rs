//! `torch.autocast`: a lowered program rewritten with the dtype autocast gives each op.
//!
//! Under autocast the parameters, their gradients and the optimizer state stay f32; what
//! changes is the dtype each op of forward runs in, and the casts autocast makes to get
//! there. [`apply`] takes a program lowered in f32 and returns the same program with
//!
//! * every activation in the dtype its op produces under autocast (fixed per value);
//! * a cast (a `copy` op) before each op that autocast runs in another dtype than its input
//!   has, one per consumer: autocast does not cache casts of activations (two linear layers
//!   reading one f32 tensor make two half-precision copies, each kept for backward);
//! * the half-precision copy of each weight an op on the lower-precision list makes: kept for
//!   backward ([`Saved::ParamCopy`]) when the op's input needs a gradient (the matmul's
//!   backward reads the weight), otherwise held in autocast's weight cache until the region
//!   ends with the forward pass ([`Program::forward_cache`]; biases always so);
//! * a half-precision scratch gradient per such parameter in backward (the matmul's gradient
//!   is made in half precision and cast into the f32 gradient).
//!
//! What autocast does with each op depends on the device ([`policy`]). Checked against torch
//! 2.15 on the CPU (output dtypes of each op inside `torch.autocast("cpu",
//! dtype=torch.bfloat16)`) and PyTorch's autocast op reference for CUDA:
//!
//! | op | CPU | CUDA |
//! |---|---|---|
//! | `linear`, `conv2d`, `fused_attention` | half | half |
//! | `matmul` | f32 (see below) | half |
//! | `cross_entropy`, `mse_loss` | f32 | f32 |
//! | `softmax`, `log_softmax`, `layer_norm`, `rms_norm` | input's dtype | f32 |
//! | `pow` (GELU-tanh's cube, lowered as `x · x`) | widest | f32 |
//! | `embedding` | f32 (the weight's) | f32 |
//! | everything else | the widest input dtype (f32 + half is f32) | same |
//!
//! On the CPU the twin's eager attention stands for PyTorch's `scaled_dot_product_attention`
//! math path, which Hugging Face models run there with attention dropout: it upcasts
//! half-precision queries, keys and values to f32 and computes scores, softmax and dropout in
//! f32, returning the input's dtype. So its matmuls take one f32 copy of their inputs (shared
//! by both matmuls) and the copy after them casts back. Without dropout the fused CPU kernel
//! runs, in half precision: the `fused_attention` op (plans from a Hugging Face
//! configuration choose it then).

use std::collections::HashMap;

use trainmem_autograd::{Op, Program, Saved, ValueDtype, ValueId, ValueInfo};

use trainmem_core::{Dtype, OpKind};

use trainmem_core::plan::DeviceKind;

/// What autocast does with an op on a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// On the lower-precision list: inputs and weights cast to the half dtype, output half.
    Half,
    /// On the f32 list: half inputs cast to f32, output f32.
    F32,
    /// The CPU's `scaled_dot_product_attention` math path: half inputs upcast to f32 once,
    /// output f32.
    AttentionMath,
    /// Not autocast: runs in the widest dtype of its inputs (an embedding in its weight's).
    Widest,
}

/// What autocast does with `kind` on `device`.
pub fn policy(kind: OpKind, device: DeviceKind) -> Policy {
    use OpKind::*;
    match (kind, device) {
        (Linear | Conv2d | FusedAttention, _) => Policy::Half,
        (Matmul, DeviceKind::Cuda) => Policy::Half,
        (Matmul, DeviceKind::Cpu) => Policy::AttentionMath,
        (CrossEntropy | MseLoss, _) => Policy::F32,
        (Softmax | LogSoftmax | LayerNorm | RmsNorm, DeviceKind::Cuda) => Policy::F32,
        _ => Policy::Widest,
    }
}

/// The rewrite in progress: the new program and each value's dtype.
struct Rewrite<'a> {
    src: &'a Program,
    out: Program,
    dtype: Vec<Dtype>,
    half: Dtype,
    /// The attention math path's f32 copies, one per value.
    upcast: HashMap<ValueId, ValueId>,
    /// Values later ops read in place of a source value (its cast back to the model's
    /// dtype).
    replaced: HashMap<ValueId, ValueId>,
}

impl<'a> Rewrite<'a> {
    /// A rewrite of `src` into `out`, its values of the compute dtype in `compute`.
    fn new(src: &'a Program, out: Program, compute: Dtype, half: Dtype) -> Rewrite<'a> {
        Rewrite {
            src,
            out,
            dtype: src
                .values
                .iter()
                .map(|v| match v.dtype {
                    ValueDtype::Compute => compute,
                    ValueDtype::Fixed(d) => d,
                })
                .collect(),
            half,
            upcast: HashMap::new(),
            replaced: HashMap::new(),
        }
    }

    /// Rewrites every op of the source, layer by layer, with `rewrite` (which pushes it).
    fn each_op(mut self, mut rewrite: impl FnMut(&mut Self, usize, &Op)) -> Program {
        let src = self.src;
        for &(s, e) in &src.layers {
            let start = self.out.ops.len() as u32;
            for (src_at, src_op) in src.ops.iter().enumerate().take(e as usize).skip(s as usize) {
                rewrite(&mut self, src_at, src_op);
            }
            self.out.layers.push((start, self.out.ops.len() as u32));
        }
        self.out
    }

    /// A cast of `v` to `to`, as a `copy` op in `layer`; returns the new value.
    fn cast(&mut self, v: ValueId, to: Dtype, layer: u32) -> ValueId {
        let info = self.out.values[v as usize];
        self.out.values.push(ValueInfo {
            dtype: ValueDtype::Fixed(to),
            ..info
        });
        self.dtype.push(to);
        let id = (self.out.values.len() - 1) as ValueId;
        self.out.ops.push(Op {
            kind: OpKind::Copy,
            inputs: [v, 0],
            arity: 1,
            output: id,
            params_start: self.out.op_params.len() as u32,
            params_len: 0,
            rows_per_sample: 0,
            channels: 0,
            layer,
        });
        id
    }

    /// Casts every float input of `op` whose dtype is not `to` (one cast each; a value read
    /// twice, `pow`'s `x · x`, once).
    fn cast_inputs(&mut self, op: &mut Op, to: Dtype) {
        let original = op.inputs;
        for k in 0..op.arity as usize {
            let v = original[k];
            let d = self.dtype[v as usize];
            if d.is_float() && d != to {
                op.inputs[k] = match (0..k).find(|&j| original[j] == v) {
                    Some(j) => op.inputs[j],
                    None => self.cast(v, to, op.layer),
                };
            }
        }
    }

    /// Makes `op` read the values that replaced its inputs.
    fn read_replacements(&self, op: &mut Op) {
        for k in 0..op.arity as usize {
            if let Some(&v) = self.replaced.get(&op.inputs[k]) {
                op.inputs[k] = v;
            }
        }
    }

    /// Upcasts a half-precision input `k` of `op` once per value; returns its dtype then.
    fn upcast_input(&mut self, op: &mut Op, k: usize) -> Option<Dtype> {
        let v = op.inputs[k];
        let d = self.dtype[v as usize];
        if !(d.is_float() && d != Dtype::F32) {
            return None;
        }
        op.inputs[k] = match self.upcast.get(&v) {
            Some(&c) => c,
            None => {
                let c = self.cast(v, Dtype::F32, op.layer);
                self.upcast.insert(v, c);
                c
            }
        };
        Some(d)
    }

    /// The weight and bias copies of a half-precision op (index `at` in the new program),
    /// and the half-precision scratch gradient of each of its parameters.
    fn weight_copies(&mut self, op: &Op, at: u32) {
        let params = self.src.params_of(op).to_vec();
        let input_needs_grad = self.out.values[op.inputs[0] as usize].requires_grad;
        let h = self.half.size();
        for (k, &pid) in params.iter().enumerate() {
            let param = &self.src.params[pid as usize];
            let elems = param.elems;
            // the weights (the first parameter, or each of separate query/key/value weights
            // lowered as one op) are kept; biases only cached
            let weight = k == 0 || param.name.ends_with(".weight");
            if weight && input_needs_grad {
                let (k, n) = (k as u8, h as u8);
                self.out.extra_saved.push((at, Saved::ParamCopy { k, n }));
            } else {
                self.out.forward_cache.push((at, elems * h));
            }
            self.out.param_grad_scratch[pid as usize] = elems * h;
        }
    }

    /// The input copies the key and value projections keep when lowered with the query's.
    fn qkv_input_copies(&mut self, op: &Op, at: u32, separate_qkv: bool) {
        let first = self.src.params_of(op).first();
        let named = |suffix: &str| {
            first.is_some_and(|&w| self.src.params[w as usize].name.ends_with(suffix))
        };
        // three projections lowered as one op: their three weights, or one packed
        // weight standing for three layers
        let three_layers = named(".attn.q.weight") || (separate_qkv && named(".attn.qkv.weight"));
        if three_layers {
            // the key and value projections cast the input again and keep their
            // copies for their weights' gradients: none for a frozen weight (LoRA's
            // base), whose projection keeps nothing of its input
            let src = self.src;
            let params = src.params_of(op);
            let trains = |k: usize| {
                params
                    .get(k)
                    .is_some_and(|&w| !src.params[w as usize].frozen)
            };
            let (key, value) = if named(".attn.q.weight") {
                (trains(1), trains(2))
            } else {
                (trains(0), trains(0))
            };
            for keeps in [key, value] {
                if keeps {
                    self.out.extra_saved.push((at, Saved::InputCopy(0)));
                }
            }
        }
    }

    /// Carries over what source op `src_at` keeps beyond its table entry to new op `at`.
    fn carry_extra_saved(&mut self, src_at: usize, at: u32) {
        for &(i, saved) in &self.src.extra_saved {
            if i as usize == src_at {
                self.out.extra_saved.push((at, saved));
            }
        }
    }

    /// Fixes the dtype of `op`'s output to `produced` when it was the compute dtype.
    fn fix_output_dtype(&mut self, op: &Op, produced: Option<Dtype>) {
        let out_v = op.output as usize;
        if let (ValueDtype::Compute, Some(d)) = (self.src.values[out_v].dtype, produced) {
            self.out.values[out_v].dtype = ValueDtype::Fixed(d);
            self.dtype[out_v] = d;
        }
    }

    /// Appends `op` with the parameters of `src_op`.
    fn push(&mut self, mut op: Op, src_op: &Op) {
        op.params_start = self.out.op_params.len() as u32;
        self.out
            .op_params
            .extend_from_slice(self.src.params_of(src_op));
        self.out.ops.push(op);
    }
}

/// What autocast does with `op` on `device`.
fn op_policy(op: &Op, device: DeviceKind) -> Policy {
    // GELU's tanh approximation lowers `pow(x, 3)` as `x · x` (a `mul` of a value by
    // itself, which nothing else lowers to): `pow` is on CUDA's f32 list
    if op.kind == OpKind::Mul
        && op.arity == 2
        && op.inputs[0] == op.inputs[1]
        && device == DeviceKind::Cuda
    {
        Policy::F32
    } else {
        policy(op.kind, device)
    }
}

/// Whether `op` is a cross-entropy that CUDA's autocast runs on half-precision logits:
/// `cross_entropy` is not on CUDA's f32 list, so its `log_softmax` runs in the logits' half
/// dtype (its output kept for backward), and `nll_loss`, which is, reads an f32 copy of the
/// log-probabilities (kept too). On the CPU `cross_entropy` itself is on the f32 list (the
/// logits are cast first); a model that takes its logits to f32 itself (`upcasts_logits`)
/// hands the loss f32 logits either way.
fn half_precision_loss(op: &Op, device: DeviceKind, upcasts_logits: bool, dtype: &[Dtype]) -> bool {
    op.kind == OpKind::CrossEntropy
        && device == DeviceKind::Cuda
        && !upcasts_logits
        && dtype[op.inputs[0] as usize] != Dtype::F32
}

/// Whether `op` is a mixture's experts' projection on a GPU: `transformers` runs the stacked
/// experts as `torch._grouped_mm` on compute capability 8.0 and above, which is on none of
/// autocast's lists, so they run in their input's dtype (f32 in an autocast region, with no
/// half-precision copies of the experts' weights).
fn grouped_experts(src: &Program, op: &Op, device: DeviceKind) -> bool {
    device == DeviceKind::Cuda
        && op.kind == OpKind::Linear
        && src
            .params_of(op)
            .first()
            .is_some_and(|&w| src.params[w as usize].name.contains(".experts."))
}

/// The dtype an op autocast leaves alone produces.
fn widest(
    op: &Op,
    dtype: &[Dtype],
    half: Dtype,
    returns_to: &HashMap<ValueId, Dtype>,
) -> Option<Dtype> {
    match op.kind {
        OpKind::Embedding => Some(Dtype::F32),
        OpKind::Copy if returns_to.contains_key(&op.inputs[0]) => Some(returns_to[&op.inputs[0]]),
        _ => {
            let floats: Vec<Dtype> = op
                .input_ids()
                .iter()
                .map(|&v| dtype[v as usize])
                .filter(|&d| d.is_float())
                .collect();
            if floats.is_empty() {
                None
            } else if floats.iter().all(|&d| d == half) {
                Some(half)
            } else {
                Some(Dtype::F32)
            }
        }
    }
}

/// `program` (lowered in f32) as it runs under `torch.autocast` to `half` on `device`.
/// `code` says how the model's code is written where that changes what autocast does: its
/// separate query/key/value projections ([`ModelCode::separate_qkv`]) and whether it takes
/// its logits to f32 itself ([`ModelCode::upcasts_logits`]).
pub fn apply(program: &Program, device: DeviceKind, half: Dtype, code: ModelCode) -> Program {
    let out = Program {
        values: program.values.clone(),
        params: program.params.clone(),
        inputs: program.inputs.clone(),
        loss: program.loss,
        layer_names: program.layer_names.clone(),
        checkpointable: program.checkpointable.clone(),
        param_grad_scratch: vec![0; program.params.len()],
        ..Program::default()
    };
    // what the attention math path's outputs return to
    let mut returns_to: HashMap<ValueId, Dtype> = HashMap::new();
    Rewrite::new(program, out, Dtype::F32, half).each_op(|r, src_at, src_op| {
        let mut op = *src_op;
        let half_loss = half_precision_loss(&op, device, code.upcasts_logits, &r.dtype);
        let policy = if grouped_experts(r.src, &op, device) {
            Policy::Widest
        } else {
            op_policy(&op, device)
        };
        let produced = match policy {
            Policy::F32 if half_loss => Some(Dtype::F32),
            Policy::Half => {
                r.cast_inputs(&mut op, half);
                Some(half)
            }
            Policy::F32 => {
                r.cast_inputs(&mut op, Dtype::F32);
                Some(Dtype::F32)
            }
            Policy::AttentionMath => {
                let mut origin = Dtype::F32;
                for k in 0..op.arity as usize {
                    let v = op.inputs[k];
                    if let Some(d) = r.upcast_input(&mut op, k) {
                        origin = d;
                    } else if let Some(&o) = returns_to.get(&v) {
                        origin = o;
                    }
                }
                returns_to.insert(op.output, origin);
                Some(Dtype::F32)
            }
            Policy::Widest => widest(&op, &r.dtype, half, &returns_to),
        };
        let at = r.out.ops.len() as u32;
        r.carry_extra_saved(src_at, at);
        if half_loss {
            // the half-precision log-probabilities, beside the f32 copy of them the table's
            // entry stands for
            r.out.extra_saved.push((at, Saved::InputCopy(0)));
        }
        if policy == Policy::Half {
            r.weight_copies(&op, at);
            r.qkv_input_copies(&op, at, code.separate_qkv);
        }
        r.fix_output_dtype(&op, produced);
        r.push(op, src_op);
    })
}

/// `program` (lowered in the compute dtype) as it runs with the model itself cast to `half`
/// (`model.to(torch.bfloat16)`, or half-precision weights beside f32 master copies): every op
/// in `half` but where the code around it, or the kernel, goes to f32:
///
/// * on the CPU, eager attention is `scaled_dot_product_attention`'s math path, which upcasts
///   half-precision queries, keys and values to f32 once and casts its output back (as under
///   autocast: [`Policy::AttentionMath`]);
/// * `transformers`' modules ([`ModelCode::hf_upcasts`]): an RMS norm upcasts its input
///   (`x.to(float32)`,
///   the f32 copy its backward reads) and returns its normalized input in the model's dtype;
///   a decoder's loss upcasts the logits (`logits.float()`) before the cross-entropy.
///
/// Hand-written models that call `F.layer_norm` and `F.cross_entropy` on half-precision
/// tensors make no such copies.
///
/// `code` says what else the model's own code takes to f32 ([`ModelCode`]).
pub fn cast_model(program: &Program, device: DeviceKind, half: Dtype, code: ModelCode) -> Program {
    // a program lowered without autocast caches nothing; what its ops keep beyond their
    // table entries is carried over below
    debug_assert!(program.forward_cache.is_empty());
    let mut out = program.clone();
    out.extra_saved.clear();
    out.ops.clear();
    out.op_params.clear();
    out.layers.clear();
    let mut math_outputs: HashMap<ValueId, ()> = HashMap::new();
    Rewrite::new(program, out, half, half).each_op(|r, src_at, src_op| {
        let mut op = *src_op;
        r.read_replacements(&mut op);
        let mut produced = None;
        let f32_norm = code.f32_norm_weight && op.kind == OpKind::RmsNorm;
        if f32_norm {
            // the whole norm in f32, its weight too: the normalized input its weight's
            // gradient reads is f32; the output is cast back below
            produced = Some(Dtype::F32);
        }
        match op.kind {
            OpKind::Matmul if device == DeviceKind::Cpu => {
                for k in 0..op.arity as usize {
                    r.upcast_input(&mut op, k);
                }
                math_outputs.insert(op.output, ());
                produced = Some(Dtype::F32);
            }
            OpKind::RmsNorm if code.hf_upcasts => r.cast_inputs(&mut op, Dtype::F32),
            OpKind::CrossEntropy if code.hf_upcasts => r.cast_inputs(&mut op, Dtype::F32),
            // inside the math path: the widest dtype of the inputs (f32)
            OpKind::Copy if math_outputs.contains_key(&op.inputs[0]) => {}
            _ if op.input_ids().iter().any(|v| math_outputs.contains_key(v)) => {
                math_outputs.insert(op.output, ());
                produced = Some(Dtype::F32);
            }
            _ => {}
        }
        r.fix_output_dtype(&op, produced);
        let at = r.out.ops.len() as u32;
        r.carry_extra_saved(src_at, at);
        let in_model_dtype = r.src.values[op.output as usize].dtype == ValueDtype::Compute;
        if code.f32_softmax && op.kind == OpKind::Softmax && in_model_dtype {
            // the f32 probabilities (kept by the softmax), beside the half copy the next
            // matmul keeps (the op's output here)
            r.out.extra_saved.push((at, Saved::InputSized(0)));
        }
        r.push(op, src_op);
        if f32_norm {
            let back = r.cast(op.output, half, op.layer);
            r.replaced.insert(op.output, back);
        }
    })
}

/// How a model's own code is written, where that changes what autocast or a model cast to
/// half precision does ([`apply`], [`cast_model`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ModelCode {
    /// The fused query/key/value projection stands for three linear layers, each casting
    /// its input ([`trainmem_core::model::TransformerSpec::separate_qkv`]).
    pub separate_qkv: bool,
    /// `transformers`' modules: an RMS norm upcasts its input, a decoder's loss its logits,
    /// in a model cast to half precision
    /// ([`trainmem_core::model::Implementation::hf_upcasts`]).
    pub hf_upcasts: bool,
    /// The model takes its logits to f32 before the cross-entropy (`transformers`'
    /// causal-LM loss); otherwise, on CUDA under autocast, the cross-entropy reads them in
    /// half precision: `log_softmax` in the half dtype and an f32 copy of its output for
    /// `nll_loss`, both kept.
    pub upcasts_logits: bool,
    /// Eager attention computes its softmax in f32 and casts the probabilities back
    /// ([`trainmem_core::model::TransformerSpec::softmax_f32`]): each softmax in the model's
    /// dtype keeps an f32 tensor of its size beside its half output.
    pub f32_softmax: bool,
    /// The RMS norms multiply their weight in f32 and cast the result back
    /// ([`trainmem_core::model::TransformerSpec::norm_weight_f32`], Gemma's): the normalized
    /// input the weight's gradient reads is kept in f32.
    pub f32_norm_weight: bool,
}

impl ModelCode {
    /// How `model`'s code is written, as its plan says. `f32_softmax` holds for the model's
    /// own eager attention only, not for SDPA's math path, which a fused kernel falls back
    /// to.
    pub fn of(model: &trainmem_core::ModelSpec) -> ModelCode {
        match model {
            trainmem_core::ModelSpec::Transformer(t) => ModelCode {
                separate_qkv: t.separate_qkv,
                hf_upcasts: t.implementation.hf_upcasts(),
                upcasts_logits: t.upcasts_logits(),
                f32_softmax: t.attention == trainmem_core::model::AttentionImpl::Eager
                    && t.eager_softmax_in_f32(),
                f32_norm_weight: t.norm_weight_f32,
            },
            _ => ModelCode::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model whose code takes its logits to f32 before the loss (`transformers`').
    const LOGITS_UPCAST: ModelCode = ModelCode {
        separate_qkv: false,
        hf_upcasts: true,
        upcasts_logits: true,
        f32_softmax: false,
        f32_norm_weight: false,
    };

    /// `transformers`' modules in a model cast to half precision.
    const HF: ModelCode = LOGITS_UPCAST;
    use crate::lower::lower;
    use trainmem_core::model::{MlpSpec, ModelSpec, TransformerKind, TransformerSpec};

    fn mlp() -> Program {
        let spec: MlpSpec = serde_json::from_str(
            r#"{"input": 784, "hidden": [1024, 1024], "output": 10, "loss": "cross_entropy"}"#,
        )
        .unwrap();
        lower(&ModelSpec::Mlp(spec)).unwrap()
    }

    #[test]
    fn linear_layers_run_in_half_precision_and_the_loss_in_f32() {
        let p = apply(&mlp(), DeviceKind::Cpu, Dtype::Bf16, ModelCode::default());
        p.validate().unwrap();
        let dtype = |v: ValueId| p.values[v as usize].dtype;
        for op in &p.ops {
            match op.kind {
                OpKind::Linear => {
                    assert_eq!(dtype(op.inputs[0]), ValueDtype::Fixed(Dtype::Bf16));
                    assert_eq!(dtype(op.output), ValueDtype::Fixed(Dtype::Bf16));
                }
                OpKind::CrossEntropy => {
                    assert_eq!(dtype(op.inputs[0]), ValueDtype::Fixed(Dtype::F32))
                }
                _ => {}
            }
        }
        // the input and the logits are cast: two copies
        assert_eq!(p.ops.iter().filter(|o| o.kind == OpKind::Copy).count(), 2);
        // the first layer's input needs no gradient: its weight copy is only cached; the
        // other two weights are kept for backward; the biases are cached
        assert_eq!(p.extra_saved.len(), 2);
        let cached: u64 = p.forward_cache.iter().map(|c| c.1).sum();
        assert_eq!(cached, 2 * (784 * 1024 + 1024 + 1024 + 10));
        assert_eq!(
            p.param_grad_scratch.iter().sum::<u64>(),
            2 * p.param_elems()
        );
    }

    #[test]
    fn cuda_runs_the_cross_entropy_of_half_logits_in_half_and_keeps_an_f32_copy() {
        let loss = |p: &Program| {
            let at = p
                .ops
                .iter()
                .position(|o| o.kind == OpKind::CrossEntropy)
                .unwrap();
            let extra: Vec<Saved> = p
                .extra_saved
                .iter()
                .filter(|(i, _)| *i as usize == at)
                .map(|(_, s)| *s)
                .collect();
            (p.values[p.ops[at].inputs[0] as usize].dtype, extra)
        };
        let bf16 = ValueDtype::Fixed(Dtype::Bf16);
        let f32 = ValueDtype::Fixed(Dtype::F32);
        // CUDA, logits handed over as they are: `log_softmax` in bf16 (kept), `nll_loss`'s
        // f32 copy of its output (the table's entry)
        let p = apply(&mlp(), DeviceKind::Cuda, Dtype::Bf16, ModelCode::default());
        p.validate().unwrap();
        assert_eq!(loss(&p), (bf16, vec![Saved::InputCopy(0)]));
        assert_eq!(p.ops.iter().filter(|o| o.kind == OpKind::Copy).count(), 1);
        // the model takes its logits to f32 itself, or the CPU's list casts them: one f32
        // log-softmax
        for p in [
            apply(&mlp(), DeviceKind::Cuda, Dtype::Bf16, LOGITS_UPCAST),
            apply(&mlp(), DeviceKind::Cpu, Dtype::Bf16, ModelCode::default()),
        ] {
            assert_eq!(loss(&p), (f32, vec![]));
        }
    }

    #[test]
    fn a_gpus_grouped_experts_run_in_f32_without_weight_copies() {
        let mut t = TransformerSpec::new(TransformerKind::Decoder, 1, 64, 4, 16, 100);
        t.gated_ffn = true;
        t.moe = Some(trainmem_core::model::MoeSpec {
            experts: 4,
            top_k: 2,
            expert_ffn: None,
            shared_expert_ffn: None,
            shared_expert_gate: false,
            normalize_top_k: false,
            capacity_factor: None,
        });
        let program = lower(&ModelSpec::Transformer(t)).unwrap();
        let experts = |p: &Program| -> Vec<(ValueDtype, usize)> {
            p.ops
                .iter()
                .enumerate()
                .filter(|(_, o)| grouped_experts(&program, o, DeviceKind::Cuda))
                .map(|(at, o)| {
                    let copies = p.extra_saved.iter().filter(|(i, _)| *i as usize == at);
                    (p.values[o.output as usize].dtype, copies.count())
                })
                .collect()
        };
        // on a GPU: the input and output projections in f32, nothing copied for them
        let f32 = ValueDtype::Fixed(Dtype::F32);
        let gpu = apply(&program, DeviceKind::Cuda, Dtype::Bf16, LOGITS_UPCAST);
        assert_eq!(experts(&gpu), vec![(f32, 0); 2]);
        // the attention's projections still run in bf16
        let bf16 = ValueDtype::Fixed(Dtype::Bf16);
        assert!(
            gpu.ops
                .iter()
                .any(|o| o.kind == OpKind::Linear && gpu.values[o.output as usize].dtype == bf16)
        );
        // on the CPU the twin keeps them on autocast's list
        let cpu = apply(&program, DeviceKind::Cpu, Dtype::Bf16, LOGITS_UPCAST);
        assert!(experts(&cpu).iter().all(|&(d, _)| d == bf16));
    }

    #[test]
    fn cpu_attention_math_upcasts_once_and_returns_half_precision() {
        let mut t = TransformerSpec::new(TransformerKind::Decoder, 1, 64, 4, 16, 100);
        t.dropout = 0.1;
        let p = apply(
            &lower(&ModelSpec::Transformer(t)).unwrap(),
            DeviceKind::Cpu,
            Dtype::Bf16,
            LOGITS_UPCAST,
        );
        p.validate().unwrap();
        let matmuls: Vec<&Op> = p.ops.iter().filter(|o| o.kind == OpKind::Matmul).collect();
        // scores read the f32 copy of qkv twice; the context reads the same copy
        assert_eq!(matmuls[0].inputs[0], matmuls[0].inputs[1]);
        assert_eq!(matmuls[1].inputs[1], matmuls[0].inputs[0]);
        let f32 = ValueDtype::Fixed(Dtype::F32);
        assert_eq!(p.values[matmuls[0].inputs[0] as usize].dtype, f32);
        let softmax = p.ops.iter().find(|o| o.kind == OpKind::Softmax).unwrap();
        assert_eq!(p.values[softmax.output as usize].dtype, f32);
        // the copy after the context matmul casts back to bf16, which the output projection
        // reads without a cast of its own
        let back = p
            .ops
            .iter()
            .find(|o| o.kind == OpKind::Copy && o.inputs[0] == matmuls[1].output)
            .unwrap();
        assert_eq!(
            p.values[back.output as usize].dtype,
            ValueDtype::Fixed(Dtype::Bf16)
        );
        // on CUDA the matmuls run in bf16 and the softmax in f32
        let mut t = TransformerSpec::new(TransformerKind::Decoder, 1, 64, 4, 16, 100);
        t.dropout = 0.1;
        let p = apply(
            &lower(&ModelSpec::Transformer(t)).unwrap(),
            DeviceKind::Cuda,
            Dtype::F16,
            LOGITS_UPCAST,
        );
        let m = p.ops.iter().find(|o| o.kind == OpKind::Matmul).unwrap();
        assert_eq!(
            p.values[m.output as usize].dtype,
            ValueDtype::Fixed(Dtype::F16)
        );
        let softmax = p.ops.iter().find(|o| o.kind == OpKind::Softmax).unwrap();
        assert_eq!(p.values[softmax.output as usize].dtype, f32);
    }

    #[test]
    fn a_half_model_s_own_code_keeps_f32_probabilities_and_gemma_s_f32_norms() {
        let mut t = TransformerSpec::new(TransformerKind::Decoder, 1, 64, 4, 16, 100);
        t.norm = trainmem_core::model::NormKind::RmsNorm;
        t.attention = trainmem_core::model::AttentionImpl::Eager;
        let program = lower(&ModelSpec::Transformer(t)).unwrap();
        let cast = |code| cast_model(&program, DeviceKind::Cuda, Dtype::Bf16, code);
        let plain = cast(ModelCode::default());
        plain.validate().unwrap();
        let f32 = ValueDtype::Fixed(Dtype::F32);
        // the model's own dtype, bf16 here
        let bf16 = ValueDtype::Compute;
        // the softmax: one f32 tensor of its size kept beside its bf16 output
        let softmax = cast(ModelCode {
            f32_softmax: true,
            ..ModelCode::default()
        });
        let at = softmax
            .ops
            .iter()
            .position(|o| o.kind == OpKind::Softmax)
            .unwrap();
        assert!(
            softmax
                .extra_saved
                .contains(&(at as u32, Saved::InputSized(0)))
        );
        assert_eq!(softmax.values[softmax.ops[at].output as usize].dtype, bf16);
        assert_eq!(softmax.extra_saved.len(), plain.extra_saved.len() + 1);
        // Gemma's norms: f32 outputs (the normalized input their weight's gradient keeps is
        // f32), each cast back to bf16, which is what the next ops read
        let gemma = cast(ModelCode {
            f32_norm_weight: true,
            ..ModelCode::default()
        });
        gemma.validate().unwrap();
        let norms: Vec<&Op> = gemma
            .ops
            .iter()
            .filter(|o| o.kind == OpKind::RmsNorm)
            .collect();
        assert_eq!(norms.len(), 3);
        for norm in norms {
            assert_eq!(gemma.values[norm.output as usize].dtype, f32);
            let readers: Vec<&Op> = gemma
                .ops
                .iter()
                .filter(|o| o.input_ids().contains(&norm.output))
                .collect();
            assert_eq!(readers.len(), 1);
            assert_eq!(readers[0].kind, OpKind::Copy);
            assert_eq!(
                gemma.values[readers[0].output as usize].dtype,
                ValueDtype::Fixed(Dtype::Bf16)
            );
        }
        assert_eq!(
            gemma.ops.iter().filter(|o| o.kind == OpKind::Copy).count(),
            plain.ops.iter().filter(|o| o.kind == OpKind::Copy).count() + 3
        );
    }

    #[test]
    fn separate_projections_keep_three_input_copies() {
        let t = TransformerSpec::new(TransformerKind::Decoder, 2, 64, 4, 16, 100);
        let program = lower(&ModelSpec::Transformer(t)).unwrap();
        let fused = apply(&program, DeviceKind::Cpu, Dtype::Bf16, LOGITS_UPCAST);
        let separate = apply(
            &program,
            DeviceKind::Cpu,
            Dtype::Bf16,
            ModelCode {
                separate_qkv: true,
                ..LOGITS_UPCAST
            },
        );
        let copies = |p: &Program| {
            p.extra_saved
                .iter()
                .filter(|s| s.1 == Saved::InputCopy(0))
                .count()
        };
        assert_eq!(copies(&fused), 0);
        assert_eq!(copies(&separate), 2 * 2);
        // LoRA's frozen base: the key and value projections keep no copies (the adapters'
        // own linear layers keep theirs)
        let mut t = TransformerSpec::new(TransformerKind::Decoder, 2, 64, 4, 16, 100);
        t.separate_qkv = true;
        t.lora = Some(trainmem_core::model::LoraSpec {
            rank: 8,
            alpha: Some(16.0),
            targets: vec![
                trainmem_core::model::LoraTarget::Q,
                trainmem_core::model::LoraTarget::V,
            ],
            dropout: 0.0,
        });
        let lora = apply(
            &lower(&ModelSpec::Transformer(t)).unwrap(),
            DeviceKind::Cuda,
            Dtype::Bf16,
            ModelCode {
                separate_qkv: true,
                ..LOGITS_UPCAST
            },
        );
        assert_eq!(copies(&lora), 0);
    }

    #[test]
    fn a_cast_model_takes_to_f32_what_transformers_and_the_cpu_kernels_do() {
        let mut t = TransformerSpec::new(TransformerKind::Decoder, 1, 64, 4, 16, 100);
        t.norm = trainmem_core::model::NormKind::RmsNorm;
        t.dropout = 0.1;
        let program = lower(&ModelSpec::Transformer(t)).unwrap();
        let p = cast_model(&program, DeviceKind::Cpu, Dtype::Bf16, HF);
        p.validate().unwrap();
        let f32 = ValueDtype::Fixed(Dtype::F32);
        let dtype = |v: ValueId| p.values[v as usize].dtype;
        // every norm and the loss read an f32 copy; the norms' outputs stay in bf16
        for op in p
            .ops
            .iter()
            .filter(|o| matches!(o.kind, OpKind::RmsNorm | OpKind::CrossEntropy))
        {
            assert_eq!(dtype(op.inputs[0]), f32, "{:?}", op.kind);
            if op.kind == OpKind::RmsNorm {
                assert_eq!(dtype(op.output), ValueDtype::Compute);
            }
        }
        // the attention math path: one f32 copy for both matmuls, f32 softmax
        let m = p.ops.iter().find(|o| o.kind == OpKind::Matmul).unwrap();
        assert_eq!(dtype(m.inputs[0]), f32);
        let softmax = p.ops.iter().find(|o| o.kind == OpKind::Softmax).unwrap();
        assert_eq!(dtype(softmax.output), f32);
        // three norms (two in the block, the final one), the loss and the attention's copy
        let copies = |p: &Program| p.ops.iter().filter(|o| o.kind == OpKind::Copy).count();
        assert_eq!(copies(&p), copies(&program) + 5);
        // a hand-written model's norms and loss make no copies; on CUDA the kernels none
        let plain = cast_model(&program, DeviceKind::Cpu, Dtype::Bf16, ModelCode::default());
        assert_eq!(copies(&plain), copies(&program) + 1);
        let cuda = cast_model(
            &program,
            DeviceKind::Cuda,
            Dtype::Bf16,
            ModelCode::default(),
        );
        assert_eq!(copies(&cuda), copies(&program));
    }
}
