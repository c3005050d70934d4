//! A program: the op list of one forward pass over abstract tensors, built once per model and
//! run every step.
//!
//! Tensor sizes are given per sample; a run multiplies them by the (micro-)batch and an
//! optional size factor (variable image sizes or sequence lengths).

use serde::{Deserialize, Serialize};

use trainmem_core::Dtype;
use trainmem_core::OpKind;

/// Index of a value (an abstract tensor) in a [`Program`].
pub type ValueId = u32;
/// Index of a parameter in a [`Program`].
pub type ParamId = u32;

/// Which dtype a value has, resolved when the program is run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ValueDtype {
    /// The run's compute dtype (f32, or f16/bf16 under mixed precision).
    Compute,
    /// A fixed dtype (token ids are i64, losses f32, ...).
    Fixed(Dtype),
}

/// An abstract tensor of the program.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ValueInfo {
    /// Elements per sample (scaled by the batch and the size factor).
    pub per_sample: u64,
    /// Elements independent of the batch (e.g. a scalar loss).
    pub fixed: u64,
    /// Dtype.
    pub dtype: ValueDtype,
    /// Whether gradients flow into it.
    pub requires_grad: bool,
}

impl ValueInfo {
    /// Elements for a batch of `batch` samples with size factor `scale`, saturating at
    /// `u64::MAX` when they do not fit 64 bits ([`ValueInfo::checked_elems`] says when; a
    /// caller that may meet such sizes checks them first, e.g. with
    /// [`crate::Graph::check_sizes`]).
    pub fn elems(&self, batch: u64, scale: f64) -> u64 {
        self.checked_elems(batch, scale).unwrap_or(u64::MAX)
    }

    /// Elements per sample at size factor `scale` (`round(per_sample × scale)`), `None` when
    /// they do not fit 64 bits.
    pub fn checked_per_sample(&self, scale: f64) -> Option<u64> {
        if scale == 1.0 {
            Some(self.per_sample)
        } else {
            scaled_count(self.per_sample, scale)
        }
    }

    /// Elements for a batch of `batch` samples with size factor `scale`, `None` when they do
    /// not fit 64 bits.
    pub fn checked_elems(&self, batch: u64, scale: f64) -> Option<u64> {
        self.checked_per_sample(scale)?
            .checked_mul(batch)?
            .checked_add(self.fixed)
    }
}

/// `round(n × scale)`, `None` when it does not fit 64 bits (or is not a number).
pub(crate) fn scaled_count(n: u64, scale: f64) -> Option<u64> {
    // 2^64: the first f64 a u64 cannot hold (`as` would saturate)
    const LIMIT: f64 = 18_446_744_073_709_551_616.0;
    let x = (n as f64 * scale).round();
    (0.0..LIMIT).contains(&x).then_some(x as u64)
}

/// A parameter tensor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParamInfo {
    /// Elements.
    pub elems: u64,
    /// Name for reports (`layers.3.attn.qkv.weight`).
    pub name: String,
    /// Layer it belongs to.
    pub layer: u32,
    /// Frozen (`requires_grad = False`): no gradient, no optimizer state, and ops save
    /// nothing for its gradient.
    #[serde(default)]
    pub frozen: bool,
    /// `(rows, cols)` of a matrix parameter whose shape is not the one its op implies (one
    /// of several weights of a packed projection); `None` otherwise.
    #[serde(default)]
    pub matrix: Option<(u64, u64)>,
}

/// One op of the program.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Op {
    /// The kind (indexes the saved-tensor table).
    pub kind: OpKind,
    /// Activation inputs (`inputs[..arity]`).
    pub inputs: [ValueId; 2],
    /// Number of inputs used.
    pub arity: u8,
    /// The output value.
    pub output: ValueId,
    /// Parameters used: `params_start .. params_start + params_len` into [`Program::op_params`].
    pub params_start: u32,
    /// Number of parameters used.
    pub params_len: u32,
    /// Normalisation rows per sample (for row statistics).
    pub rows_per_sample: u64,
    /// Channels (for per-channel statistics).
    pub channels: u64,
    /// Layer index (checkpoint segments are ranges of layers).
    pub layer: u32,
}

impl Op {
    /// The inputs actually used.
    pub fn input_ids(&self) -> &[ValueId] {
        &self.inputs[..self.arity as usize]
    }
}

/// A forward program: values, ops in execution order, parameters, and layer boundaries.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Program {
    /// Every value.
    pub values: Vec<ValueInfo>,
    /// Ops in forward order.
    pub ops: Vec<Op>,
    /// Every parameter.
    pub params: Vec<ParamInfo>,
    /// Parameter ids referenced by ops (flattened).
    pub op_params: Vec<ParamId>,
    /// Values supplied by the caller (the batch and targets); the program never frees them.
    pub inputs: Vec<ValueId>,
    /// The value backward starts from (the loss).
    pub loss: Option<ValueId>,
    /// For each layer, the range of ops it covers (`start..end`). Layers are contiguous.
    pub layers: Vec<(u32, u32)>,
    /// Display name of each layer.
    pub layer_names: Vec<String>,
    /// Whether each layer may be checkpointed (repeated blocks; not embeddings or heads).
    pub checkpointable: Vec<bool>,
    /// Saved tensors some ops keep beyond their kind's entry in the saved-tensor table, as
    /// `(op index, saved)`: the weight copies autocast makes, the extra input casts of
    /// separate projections.
    #[serde(default)]
    pub extra_saved: Vec<(u32, crate::op::Saved)>,
    /// Bytes an op makes that live until the forward pass ends, as `(op index, bytes)`, not
    /// batch-scaled: autocast's cache of half-precision weight copies nothing saved.
    #[serde(default)]
    pub forward_cache: Vec<(u32, u64)>,
    /// Per parameter (or empty: none), the bytes of a scratch gradient backward makes before
    /// the parameter's gradient and frees after it: the half-precision gradient of an
    /// autocast weight copy, cast into the f32 gradient.
    #[serde(default)]
    pub param_grad_scratch: Vec<u64>,
    /// The loss computed over chunks of positions rather than all at once (litgpt's
    /// `lm_head_chunk_size`): backward makes one chunk's gradients at a time.
    #[serde(default)]
    pub loss_chunks: Option<LossChunks>,
}

/// A cross-entropy loss computed chunk by chunk over a sequence's positions, as litgpt's
/// fine-tuning computes its LM head (`lm_head_chunk_size`) and `chunked_cross_entropy`: the
/// logits of every chunk exist together (the script holds the list) and forward saves every
/// chunk's log-probabilities, but backward makes the log-probabilities' and the logits'
/// gradients one chunk at a time, so a chunk's share of the logits is what those
/// gradients take instead of the whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LossChunks {
    /// Positions per chunk.
    pub positions: u64,
    /// Positions in all (the sequence).
    pub of: u64,
    /// Positions of a chunk copied while its loss is computed (litgpt drops the last
    /// position of the last chunk, and the reshape of that slice copies it): a temporary
    /// during the loss's forward.
    pub copied: u64,
}

impl LossChunks {
    /// The share of `bytes` (all positions) that `positions` of them take, rounded up.
    pub fn share(&self, bytes: u64, positions: u64) -> u64 {
        if self.of == 0 {
            return bytes;
        }
        (u128::from(bytes) * u128::from(positions.min(self.of))).div_ceil(u128::from(self.of))
            as u64
    }
}

/// Errors building a program.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProgramError {
    /// An op referenced a value that does not exist yet.
    #[error("op {op} ({kind}) reads value {value}, which is not defined before it")]
    UndefinedValue {
        /// Op index.
        op: usize,
        /// Op kind name.
        kind: &'static str,
        /// The value.
        value: ValueId,
    },
    /// An op got the wrong number of inputs.
    #[error("{kind} takes {expected} input(s), got {got}")]
    Arity {
        /// Op kind name.
        kind: &'static str,
        /// Inputs it takes.
        expected: usize,
        /// Inputs given.
        got: usize,
    },
    /// A program without a loss cannot be run backward.
    #[error("the program has no loss")]
    NoLoss,
    /// Layers must cover every op, contiguously and in order.
    #[error("layers do not cover the ops contiguously")]
    Layers,
    /// A size of the program (a parameter's elements) does not fit 64 bits.
    #[error("{0}")]
    Overflow(String),
    /// Loss chunks must be non-empty, no longer than the sequence, and copy at most a chunk.
    #[error(
        "loss chunks of {positions} of {of} positions copying {copied} are not a chunking \
         (each chunk at least one position, at most the sequence; at most a chunk copied)"
    )]
    LossChunks {
        /// Positions per chunk.
        positions: u64,
        /// Positions in all.
        of: u64,
        /// Positions copied.
        copied: u64,
    },
}

impl Program {
    /// Total parameter elements, saturating at `u64::MAX` when they do not fit 64 bits
    /// ([`Program::checked_param_elems`] says when).
    pub fn param_elems(&self) -> u64 {
        self.checked_param_elems().unwrap_or(u64::MAX)
    }

    /// Total parameter elements, `None` when they do not fit 64 bits.
    pub fn checked_param_elems(&self) -> Option<u64> {
        self.params
            .iter()
            .try_fold(0u64, |acc, p| acc.checked_add(p.elems))
    }

    /// Elements of the trainable (not frozen) parameters, saturating at `u64::MAX` when they
    /// do not fit 64 bits.
    pub fn trainable_elems(&self) -> u64 {
        self.params
            .iter()
            .filter(|p| !p.frozen)
            .try_fold(0u64, |acc, p| acc.checked_add(p.elems))
            .unwrap_or(u64::MAX)
    }

    /// Whether any parameter of `op` is trainable (its gradient is computed).
    pub fn has_trainable_param(&self, op: &Op) -> bool {
        self.params_of(op)
            .iter()
            .any(|&p| !self.params[p as usize].frozen)
    }

    /// The parameter ids used by an op.
    pub fn params_of(&self, op: &Op) -> &[ParamId] {
        let s = op.params_start as usize;
        &self.op_params[s..s + op.params_len as usize]
    }

    /// Checks that every op reads defined values and that a loss exists.
    pub fn validate(&self) -> Result<(), ProgramError> {
        let mut defined = vec![false; self.values.len()];
        for &v in &self.inputs {
            defined[v as usize] = true;
        }
        for (i, op) in self.ops.iter().enumerate() {
            if op.arity as usize != op.kind.arity() {
                return Err(ProgramError::Arity {
                    kind: op.kind.name(),
                    expected: op.kind.arity(),
                    got: op.arity as usize,
                });
            }
            for &v in op.input_ids() {
                if !defined.get(v as usize).copied().unwrap_or(false) {
                    return Err(ProgramError::UndefinedValue {
                        op: i,
                        kind: op.kind.name(),
                        value: v,
                    });
                }
            }
            defined[op.output as usize] = true;
        }
        if self.loss.is_none() {
            return Err(ProgramError::NoLoss);
        }
        if let Some(c) = self.loss_chunks
            && (c.positions == 0 || c.positions > c.of || c.copied > c.positions)
        {
            return Err(ProgramError::LossChunks {
                positions: c.positions,
                of: c.of,
                copied: c.copied,
            });
        }
        let mut next = 0u32;
        for &(s, e) in &self.layers {
            if s != next || e < s {
                return Err(ProgramError::Layers);
            }
            next = e;
        }
        if next as usize != self.ops.len() {
            return Err(ProgramError::Layers);
        }
        Ok(())
    }

    /// For each value, the index of the last op that reads it (`u32::MAX` if none).
    pub fn last_uses(&self) -> Vec<u32> {
        let mut last = vec![u32::MAX; self.values.len()];
        for (i, op) in self.ops.iter().enumerate() {
            for &v in op.input_ids() {
                last[v as usize] = i as u32;
            }
        }
        last
    }
}

/// Builds a [`Program`] op by op.
#[derive(Debug, Default)]
pub struct ProgramBuilder {
    p: Program,
    layer_start: u32,
    layer: u32,
    in_layer: bool,
    freeze: bool,
    /// The first size that overflowed while building ([`ProgramBuilder::param_matrix`]),
    /// reported by [`ProgramBuilder::finish`].
    overflow: Option<String>,
}

impl ProgramBuilder {
    /// An empty builder.
    pub fn new() -> ProgramBuilder {
        ProgramBuilder::default()
    }

    /// Declares a caller-supplied input (batch or target).
    pub fn input(&mut self, per_sample: u64, dtype: ValueDtype) -> ValueId {
        let id = self.value(ValueInfo {
            per_sample,
            fixed: 0,
            dtype,
            requires_grad: false,
        });
        self.p.inputs.push(id);
        id
    }

    fn value(&mut self, v: ValueInfo) -> ValueId {
        self.p.values.push(v);
        (self.p.values.len() - 1) as ValueId
    }

    /// Adds a parameter (frozen while [`ProgramBuilder::freeze_params`] is on).
    pub fn param(&mut self, elems: u64, name: impl Into<String>) -> ParamId {
        let frozen = self.freeze;
        self.push_param(elems, name.into(), frozen)
    }

    /// Adds a `rows × cols` matrix parameter (frozen while [`ProgramBuilder::freeze_params`]
    /// is on), its shape recorded in [`ParamInfo::matrix`]. When `rows × cols` does not fit
    /// 64 bits, [`ProgramBuilder::finish`] is a [`ProgramError::Overflow`] naming it.
    pub fn param_matrix(&mut self, rows: u64, cols: u64, name: impl Into<String>) -> ParamId {
        let name = name.into();
        let elems = match rows.checked_mul(cols) {
            Some(e) => e,
            None => {
                self.overflow.get_or_insert_with(|| {
                    format!("parameter `{name}`: {rows} × {cols} elements overflows a 64-bit count")
                });
                u64::MAX
            }
        };
        let id = self.param(elems, name);
        self.p.params[id as usize].matrix = Some((rows, cols));
        id
    }

    /// Adds a trainable parameter, whether or not parameters are being frozen (an adapter
    /// beside a frozen base).
    pub fn trainable_param(&mut self, elems: u64, name: impl Into<String>) -> ParamId {
        self.push_param(elems, name.into(), false)
    }

    /// From now on, [`ProgramBuilder::param`] adds frozen parameters (`on`) or trainable
    /// ones.
    pub fn freeze_params(&mut self, on: bool) {
        self.freeze = on;
    }

    fn push_param(&mut self, elems: u64, name: String, frozen: bool) -> ParamId {
        self.p.params.push(ParamInfo {
            elems,
            name,
            layer: self.layer,
            frozen,
            matrix: None,
        });
        (self.p.params.len() - 1) as ParamId
    }

    /// Starts a new layer (closing the current one) that is never checkpointed.
    pub fn begin_layer(&mut self, name: impl Into<String>) {
        self.begin(name.into(), false);
    }

    /// Starts a new layer that gradient checkpointing may drop and recompute.
    pub fn begin_block(&mut self, name: impl Into<String>) {
        self.begin(name.into(), true);
    }

    fn begin(&mut self, name: String, checkpointable: bool) {
        self.end_layer();
        self.layer_start = self.p.ops.len() as u32;
        self.in_layer = true;
        self.p.layer_names.push(name);
        self.p.checkpointable.push(checkpointable);
    }

    /// Closes the current layer, if any.
    pub fn end_layer(&mut self) {
        if self.in_layer {
            self.p
                .layers
                .push((self.layer_start, self.p.ops.len() as u32));
            self.in_layer = false;
            self.layer += 1;
        }
    }

    /// The value's info.
    pub fn info(&self, v: ValueId) -> ValueInfo {
        self.p.values[v as usize]
    }

    /// Adds an op with full control; returns its output value.
    #[allow(clippy::too_many_arguments)]
    pub fn op_full(
        &mut self,
        kind: OpKind,
        inputs: &[ValueId],
        out_per_sample: u64,
        out_fixed: u64,
        out_dtype: ValueDtype,
        params: &[ParamId],
        rows_per_sample: u64,
        channels: u64,
    ) -> ValueId {
        let requires_grad = params
            .iter()
            .any(|&p| self.p.params.get(p as usize).is_some_and(|i| !i.frozen))
            || inputs.iter().any(|&v| {
                self.p
                    .values
                    .get(v as usize)
                    .is_some_and(|i| i.requires_grad)
            });
        let output = self.value(ValueInfo {
            per_sample: out_per_sample,
            fixed: out_fixed,
            dtype: out_dtype,
            requires_grad,
        });
        let mut ins = [0; 2];
        for (i, &v) in inputs.iter().take(2).enumerate() {
            ins[i] = v;
        }
        let params_start = self.p.op_params.len() as u32;
        self.p.op_params.extend_from_slice(params);
        self.p.ops.push(Op {
            kind,
            inputs: ins,
            arity: inputs.len().min(2) as u8,
            output,
            params_start,
            params_len: params.len() as u32,
            rows_per_sample,
            channels,
            layer: self.layer,
        });
        output
    }

    /// Adds an op whose output has `out_per_sample` elements in the compute dtype.
    pub fn op(
        &mut self,
        kind: OpKind,
        inputs: &[ValueId],
        out_per_sample: u64,
        params: &[ParamId],
    ) -> ValueId {
        self.op_full(
            kind,
            inputs,
            out_per_sample,
            0,
            ValueDtype::Compute,
            params,
            0,
            0,
        )
    }

    /// Adds a normalisation-like op with `rows_per_sample` rows (for row statistics).
    pub fn op_rows(
        &mut self,
        kind: OpKind,
        inputs: &[ValueId],
        out_per_sample: u64,
        params: &[ParamId],
        rows_per_sample: u64,
    ) -> ValueId {
        self.op_full(
            kind,
            inputs,
            out_per_sample,
            0,
            ValueDtype::Compute,
            params,
            rows_per_sample,
            0,
        )
    }

    /// Makes the last op added keep `saved` for backward beyond its kind's entry in the
    /// saved-tensor table (a model's code that keeps more than the op would).
    pub fn save_extra(&mut self, saved: crate::op::Saved) {
        let at = self.p.ops.len().saturating_sub(1) as u32;
        self.p.extra_saved.push((at, saved));
    }

    /// Makes the loss (a cross-entropy) computed in chunks ([`LossChunks`]).
    pub fn chunk_loss(&mut self, chunks: LossChunks) {
        self.p.loss_chunks = Some(chunks);
    }

    /// Adds a loss op (scalar f32 output) and marks it as the loss.
    pub fn loss(&mut self, kind: OpKind, inputs: &[ValueId]) -> ValueId {
        let v = self.op_full(kind, inputs, 0, 1, ValueDtype::Fixed(Dtype::F32), &[], 0, 0);
        self.p.loss = Some(v);
        v
    }

    /// Finishes (closing the open layer) and validates.
    pub fn finish(mut self) -> Result<Program, ProgramError> {
        if let Some(m) = self.overflow.take() {
            return Err(ProgramError::Overflow(m));
        }
        self.end_layer();
        self.p.validate()?;
        Ok(self.p)
    }
}
