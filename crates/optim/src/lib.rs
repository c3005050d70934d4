//! Optimizer-state sizing and lifetime: what an optimizer keeps, how many bytes, and from when.
//!
//! trainmem-optim is the arithmetic behind the "optimizer jump" (memory that grows by one or
//! two model sizes at the first step) and behind ZeRO's per-rank figures. trainmem-sim uses it
//! to allocate the optimizer's state, its step scratch and, when it simulates a burn run,
//! burn's per-parameter bookkeeping ([`burn_step_bookkeeping_bytes`]); on its own it answers
//! "how many bytes of model state does this optimizer need per rank" for a list of parameter
//! sizes.
//!
//! # The parts
//!
//! * [`OptimizerConfig`]: the algorithm ([`OptimizerKind`]), the dtypes of parameters and
//!   state, AMSGrad, f32 master weights, when the state is created ([`StateAllocation`]) and
//!   how the step runs ([`StepImpl`]). It gives the state tensors of one parameter
//!   ([`OptimizerConfig::state_tensors`], each a [`StateTensor`] with a [`StateRole`]), their
//!   bytes ([`OptimizerConfig::state_bytes`], [`OptimizerConfig::master_bytes`]) and the
//!   step's scratch ([`OptimizerConfig::step_temporaries`],
//!   [`OptimizerConfig::step_temporary_peak`]).
//! * [`Sharding`]: data-parallel ranks and the ZeRO stage, and what each rank keeps of a
//!   tensor.
//! * [`model_state_bytes`]: parameters, master weights, gradients and optimizer state of one
//!   rank for a list of parameter tensors ([`ModelStateBytes`]).
//! * [`burn_step_bookkeeping_bytes`]: the host bytes burn-optim 0.21 keeps per parameter
//!   tensor besides the moments (measured, see its docs).
//!
//! # The rules
//!
//! What an optimizer keeps per parameter element, in the state dtype:
//!
//! | optimizer | state buffers per parameter | notes |
//! |---|---|---|
//! | `sgd` | 0 | plain SGD keeps nothing |
//! | `momentum` | 1 (velocity) | burn's first step aliases the gradient, later steps allocate |
//! | `adam`, `adamw` | 2 (first and second moment) | +1 with AMSGrad (max of the second moment) |
//! | `adafactor` | a row and a column vector per matrix, a full vector per vector | plus the RMS scalar |
//! | `adamw8bit` | 2 of one byte per element, plus an f32 maximum per block of 256 | f32 under 4,096 elements |
//!
//! So with f32 state a model of Ψ parameter elements gets 0, 4Ψ, 8Ψ (12Ψ with AMSGrad) bytes of
//! optimizer state.
//!
//! Under mixed precision (half-precision parameters) an f32 **master copy** of every
//! parameter is kept as well (ZeRO's accounting: 2Ψ half weights + 2Ψ half gradients + 12Ψ
//! for f32 master, momentum and variance with Adam: 16Ψ). trainmem counts master weights as
//! `parameter` bytes.
//!
//! **Lifetime**: PyTorch and burn both create the state *lazily*, inside the first `step`
//! (the "optimizer jump"); [`StateAllocation::Eager`] creates it with the optimizer. Once
//! created the state lives as long as the optimizer, so memory is flat after the first step.
//!
//! **Step temporaries** ([`StepImpl`]): a `foreach` step works on the whole parameter list at
//! once and needs about one parameter-sized scratch buffer per parameter at the same time
//! (PyTorch documents "~ sizeof(params) more peak memory"); a `for_loop` step needs one
//! parameter's scratch at a time (two buffers for Adam: `sqrt(v) + eps` and the update); a
//! `fused` kernel needs none, and plain SGD updates in place.
//!
//! **Data parallelism** ([`Sharding`]): ZeRO stage 1 shards optimizer state (and master
//! weights) across ranks, stage 2 also gradients, stage 3 also parameters; each rank keeps
//! `ceil(elements / world_size)` of a sharded tensor. Stage 0, or a world of one rank, shards
//! nothing.
//!
//! # Example: Adam against SGD and momentum, then sharded
//!
//! ```
//! use trainmem_core::{Dtype, OptimizerKind, StepImpl};
//! use trainmem_optim::{OptimizerConfig, Sharding, model_state_bytes};
//!
//! // A 4096 → 4096 → 1024 MLP: two weights and two biases.
//! let params = [4096 * 4096, 4096, 4096 * 1024, 1024];
//! let psi: u64 = params.iter().sum(); // 20,976,640 elements
//!
//! // Optimizer state in f32: nothing for SGD, one model size for momentum, two for Adam.
//! let state = |kind| model_state_bytes(
//!     &OptimizerConfig::new(kind), Dtype::F32, Sharding::default(), &params,
//! ).optimizer_state;
//! assert_eq!(state(OptimizerKind::Sgd), 0);
//! assert_eq!(state(OptimizerKind::Momentum), 4 * psi);
//! assert_eq!(state(OptimizerKind::Adam), 8 * psi);
//! assert_eq!(state(OptimizerKind::AdamW), 8 * psi);
//!
//! // Adam's tensors for one parameter: `exp_avg` and `exp_avg_sq`, each the parameter's size.
//! let adam = OptimizerConfig::new(OptimizerKind::Adam);
//! let names: Vec<_> = adam.state_tensors(1024).iter().map(|t| t.role.name()).collect();
//! assert_eq!(names, ["exp_avg", "exp_avg_sq"]);
//!
//! // f32 training with Adam: parameters + gradients + two moments = 16 bytes a parameter.
//! let full = model_state_bytes(&adam, Dtype::F32, Sharding::default(), &params);
//! assert_eq!(full.total(), 16 * psi);
//!
//! // Mixed precision: f16 weights and gradients, an f32 master copy: still 16 bytes a
//! // parameter (2 + 2 + 4 + 4 + 4), of which the master weights count as parameter bytes.
//! let mut mixed = adam;
//! mixed.param_dtype = Dtype::F16;
//! mixed.master_weights = true;
//! let m = model_state_bytes(&mixed, Dtype::F16, Sharding::default(), &params);
//! assert_eq!((m.parameters, m.master_weights, m.gradients), (6 * psi, 4 * psi, 2 * psi));
//! assert_eq!(m.total(), 16 * psi);
//!
//! // ZeRO over 8 ranks (every tensor here divides by 8): stage 1 divides the optimizer
//! // state and master weights, stage 2 the gradients too, stage 3 everything.
//! let zero = |stage| model_state_bytes(
//!     &mixed, Dtype::F16, Sharding { world_size: 8, zero_stage: stage }, &params,
//! );
//! assert_eq!(zero(1).optimizer_state, 8 * psi / 8);
//! assert_eq!(zero(1).total(), 2 * psi + 2 * psi + 12 * psi / 8);
//! assert_eq!(zero(2).total(), 2 * psi + (2 + 12) * psi / 8);
//! assert_eq!(zero(3).total(), 16 * psi / 8);
//!
//! // The step's scratch: foreach holds one buffer per parameter at once, for_loop two of
//! // the largest parameter's size, fused none.
//! let mut step = OptimizerConfig::new(OptimizerKind::Adam);
//! step.implementation = StepImpl::Foreach;
//! assert_eq!(step.step_temporary_peak(&params), 4 * psi);
//! step.implementation = StepImpl::ForLoop;
//! assert_eq!(step.step_temporary_peak(&params), 2 * 4 * 4096 * 4096);
//! step.implementation = StepImpl::Fused;
//! assert_eq!(step.step_temporary_peak(&params), 0);
//! ```

#![forbid(unsafe_code)]

pub mod eight_bit;

use serde::{Deserialize, Serialize};
use trainmem_core::{Dtype, OptimizerKind, StateAllocation, StepImpl};

/// The role of one optimizer-state tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StateRole {
    /// f32 master copy of a half-precision parameter.
    MasterWeight,
    /// SGD momentum velocity.
    Velocity,
    /// Adam's first moment (`exp_avg`).
    FirstMoment,
    /// Adam's second moment (`exp_avg_sq`).
    SecondMoment,
    /// AMSGrad's running maximum of the second moment.
    MaxSecondMoment,
}

impl StateRole {
    /// The snake_case name.
    pub fn name(self) -> &'static str {
        match self {
            StateRole::MasterWeight => "master_weight",
            StateRole::Velocity => "velocity",
            StateRole::FirstMoment => "exp_avg",
            StateRole::SecondMoment => "exp_avg_sq",
            StateRole::MaxSecondMoment => "max_exp_avg_sq",
        }
    }
}

/// An optimizer configuration, as far as memory is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct OptimizerConfig {
    /// The algorithm.
    pub kind: OptimizerKind,
    /// When the state is created.
    pub allocation: StateAllocation,
    /// How the step is computed.
    pub implementation: StepImpl,
    /// Dtype of the state buffers.
    pub state_dtype: Dtype,
    /// AMSGrad (Adam/AdamW only).
    pub amsgrad: bool,
    /// Dtype of the parameters.
    pub param_dtype: Dtype,
    /// Keep an f32 master copy when the parameters are half precision.
    pub master_weights: bool,
}

impl OptimizerConfig {
    /// A config for f32 parameters.
    pub fn new(kind: OptimizerKind) -> OptimizerConfig {
        OptimizerConfig {
            kind,
            allocation: StateAllocation::Lazy,
            implementation: StepImpl::ForLoop,
            state_dtype: Dtype::F32,
            amsgrad: false,
            param_dtype: Dtype::F32,
            master_weights: false,
        }
    }

    /// The state buffers kept per parameter (excluding master weights).
    pub fn state_roles(&self) -> &'static [StateRole] {
        match self.kind {
            OptimizerKind::Sgd => &[],
            OptimizerKind::Momentum => &[StateRole::Velocity],
            OptimizerKind::Adam | OptimizerKind::AdamW if self.amsgrad => &[
                StateRole::FirstMoment,
                StateRole::SecondMoment,
                StateRole::MaxSecondMoment,
            ],
            OptimizerKind::Adam | OptimizerKind::AdamW => {
                &[StateRole::FirstMoment, StateRole::SecondMoment]
            }
            // one second moment, factored for matrices ([`OptimizerConfig::state_elems_of`])
            OptimizerKind::Adafactor => &[StateRole::SecondMoment],
            // both moments, quantized for large tensors ([`OptimizerConfig::state_bytes_of`])
            OptimizerKind::AdamW8bit => &[StateRole::FirstMoment, StateRole::SecondMoment],
        }
    }

    /// Elements of each state buffer of one parameter of `elems` elements, shaped `matrix`
    /// (`Some((rows, cols))` for a 2-D parameter). Adafactor keeps a row vector (`rows`) and
    /// a column vector (`cols`) for a matrix, a full-size second moment for a vector, and for
    /// either the parameter's RMS as a 0-dim tensor (one element); every other optimizer
    /// keeps [`OptimizerConfig::state_roles`] buffers of `elems` each.
    pub fn state_elems_of(&self, elems: u64, matrix: Option<(u64, u64)>) -> Vec<u64> {
        match (self.kind, matrix) {
            (OptimizerKind::Adafactor, Some((rows, cols))) => vec![rows, cols, 1],
            (OptimizerKind::Adafactor, None) => vec![elems, 1],
            _ => vec![elems; self.state_roles().len()],
        }
    }

    /// Bytes of each state buffer this rank keeps for one parameter of `elems` elements
    /// shaped `matrix` (see [`OptimizerConfig::state_elems_of`]) under `sharding`: each
    /// buffer's elements in the state dtype, except for `adamw8bit`, whose buffers follow
    /// [`eight_bit::state_bytes`] (bitsandbytes' layout) over this rank's elements.
    pub fn state_bytes_of(
        &self,
        elems: u64,
        matrix: Option<(u64, u64)>,
        sharding: Sharding,
    ) -> Vec<u64> {
        if self.kind == OptimizerKind::AdamW8bit {
            return eight_bit::state_bytes(sharding.state_elems(elems));
        }
        self.state_elems_of(elems, matrix)
            .into_iter()
            .map(|e| sharding.state_elems(e) * self.state_dtype.size())
            .collect()
    }

    /// Optimizer state shared by every parameter, made with the optimizer: `adamw8bit`'s
    /// two quantization maps ([`eight_bit::QUANTIZATION_MAPS_BYTES`]); 0 for the others.
    pub fn shared_state_bytes(&self) -> u64 {
        if self.kind == OptimizerKind::AdamW8bit {
            eight_bit::QUANTIZATION_MAPS_BYTES
        } else {
            0
        }
    }

    /// State buffers per parameter: 0 (SGD), 1 (momentum), 2 (Adam/AdamW), 3 (AMSGrad).
    pub fn state_multiplier(&self) -> u64 {
        self.state_roles().len() as u64
    }

    /// Whether f32 master weights are kept.
    pub fn has_master_weights(&self) -> bool {
        self.master_weights && self.param_dtype.is_half()
    }

    /// Every state tensor one parameter of `elems` elements gets, with its role, element
    /// count and dtype (master weights first).
    pub fn state_tensors(&self, elems: u64) -> Vec<StateTensor> {
        let mut out = Vec::new();
        if self.has_master_weights() {
            out.push(StateTensor {
                role: StateRole::MasterWeight,
                elems,
                dtype: Dtype::F32,
            });
        }
        for &role in self.state_roles() {
            out.push(StateTensor {
                role,
                elems,
                dtype: self.state_dtype,
            });
        }
        out
    }

    /// Optimizer-state bytes (moments, velocity) for one parameter of `elems` elements
    /// (`adamw8bit`: by its per-tensor rule, without the maps all parameters share).
    pub fn state_bytes(&self, elems: u64) -> u64 {
        if self.kind == OptimizerKind::AdamW8bit {
            return eight_bit::state_bytes(elems).iter().sum();
        }
        self.state_multiplier() * elems * self.state_dtype.size()
    }

    /// Master-weight bytes for `elems` parameter elements (0 without mixed precision).
    pub fn master_bytes(&self, elems: u64) -> u64 {
        if self.has_master_weights() {
            elems * Dtype::F32.size()
        } else {
            0
        }
    }

    /// Scratch buffers the step allocates for a parameter list: for each buffer its element
    /// count and dtype, and whether they are all live at once ([`StepImpl::Foreach`]) or one
    /// at a time ([`StepImpl::ForLoop`]). SGD without momentum updates in place.
    pub fn step_temporaries(&self, param_elems: &[u64]) -> StepTemporaries {
        let per_param = match (self.kind, self.implementation) {
            (_, StepImpl::Fused) | (OptimizerKind::Sgd, _) => 0,
            (OptimizerKind::Momentum, _) => 1,
            // denominator sqrt(v) + eps, and the update itself
            (OptimizerKind::Adam | OptimizerKind::AdamW, StepImpl::Foreach) => 1,
            (OptimizerKind::Adam | OptimizerKind::AdamW, StepImpl::ForLoop) => 2,
            // `grad² + ε`, then the update made while it is still referenced (and `-update`
            // while the update is): two parameter-sized tensors at once, one parameter at a
            // time
            (OptimizerKind::Adafactor, _) => 2,
            (OptimizerKind::AdamW8bit, _) => {
                // bitsandbytes' CPU kernel: f32 buffers one parameter at a time, fewer for
                // the tensors it keeps in f32 (their buffers padded with zero-sized ones)
                let half = self.param_dtype.is_half();
                let per = eight_bit::cpu_step_buffers(eight_bit::MIN_8BIT_SIZE, half);
                return StepTemporaries {
                    buffers: param_elems
                        .iter()
                        .flat_map(|&e| {
                            let n = eight_bit::cpu_step_buffers(e, half);
                            std::iter::repeat_n(e, n).chain(std::iter::repeat_n(0, per - n))
                        })
                        .collect(),
                    dtype: Dtype::F32,
                    all_at_once: false,
                    per_param: per,
                };
            }
        };
        let dtype = if self.has_master_weights() {
            Dtype::F32
        } else {
            self.state_dtype
        };
        StepTemporaries {
            buffers: param_elems
                .iter()
                .flat_map(|&e| std::iter::repeat_n(e, per_param))
                .collect(),
            dtype,
            all_at_once: self.implementation == StepImpl::Foreach,
            per_param,
        }
    }

    /// Peak bytes of the step's scratch for a parameter list.
    pub fn step_temporary_peak(&self, param_elems: &[u64]) -> u64 {
        let t = self.step_temporaries(param_elems);
        if t.all_at_once {
            t.buffers.iter().sum::<u64>() * t.dtype.size()
        } else {
            // one parameter's buffers at a time: the largest parameter's sum
            t.buffers
                .chunks(t.per_param.max(1))
                .map(|c| c.iter().sum::<u64>())
                .max()
                .unwrap_or(0)
                * t.dtype.size()
        }
    }
}

/// One optimizer-state tensor for one parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct StateTensor {
    /// What it is.
    pub role: StateRole,
    /// Elements.
    pub elems: u64,
    /// Dtype.
    pub dtype: Dtype,
}

impl StateTensor {
    /// Bytes.
    pub fn bytes(&self) -> u64 {
        self.elems * self.dtype.size()
    }
}

/// Scratch buffers of one optimizer step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepTemporaries {
    /// Element counts, in parameter order (`per_param` consecutive entries per parameter).
    pub buffers: Vec<u64>,
    /// Their dtype.
    pub dtype: Dtype,
    /// All live at once (foreach) or one parameter's at a time.
    pub all_at_once: bool,
    /// Buffers per parameter.
    pub per_param: usize,
}

/// Data-parallel sharding of model state (ZeRO).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Sharding {
    /// Ranks.
    pub world_size: u64,
    /// ZeRO stage 0–3.
    pub zero_stage: u8,
}

impl Default for Sharding {
    fn default() -> Self {
        Sharding {
            world_size: 1,
            zero_stage: 0,
        }
    }
}

impl Sharding {
    /// Elements of a tensor this rank keeps when the tensor is sharded.
    pub fn shard(&self, elems: u64) -> u64 {
        elems.div_ceil(self.world_size.max(1))
    }
    /// Optimizer state and master weights are sharded (stage ≥ 1).
    pub fn shards_state(&self) -> bool {
        self.zero_stage >= 1 && self.world_size > 1
    }
    /// Gradients are sharded (stage ≥ 2).
    pub fn shards_grads(&self) -> bool {
        self.zero_stage >= 2 && self.world_size > 1
    }
    /// Parameters are sharded (stage 3).
    pub fn shards_params(&self) -> bool {
        self.zero_stage >= 3 && self.world_size > 1
    }
    /// Elements of optimizer state (per buffer) this rank keeps for a parameter.
    pub fn state_elems(&self, elems: u64) -> u64 {
        if self.shards_state() {
            self.shard(elems)
        } else {
            elems
        }
    }
    /// Elements of gradient this rank keeps for a parameter after reduction.
    pub fn grad_elems(&self, elems: u64) -> u64 {
        if self.shards_grads() {
            self.shard(elems)
        } else {
            elems
        }
    }
    /// Elements of a parameter this rank keeps at rest.
    pub fn param_elems(&self, elems: u64) -> u64 {
        if self.shards_params() {
            self.shard(elems)
        } else {
            elems
        }
    }
}

/// Steady-state model-state bytes of one rank (no activations).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ModelStateBytes {
    /// Parameters at rest (including master weights).
    pub parameters: u64,
    /// Of which f32 master weights.
    pub master_weights: u64,
    /// Gradients after the backward pass.
    pub gradients: u64,
    /// Optimizer state.
    pub optimizer_state: u64,
}

impl ModelStateBytes {
    /// Sum of parameters (incl. master), gradients and optimizer state.
    pub fn total(&self) -> u64 {
        self.parameters + self.gradients + self.optimizer_state
    }
}

/// Per-rank model-state bytes of one parameter tensor of `elems` elements, without the
/// state the optimizer shares between its parameters
/// ([`OptimizerConfig::shared_state_bytes`]).
pub fn tensor_state_bytes(
    cfg: &OptimizerConfig,
    grad_dtype: Dtype,
    sharding: Sharding,
    elems: u64,
) -> ModelStateBytes {
    let master = cfg.master_bytes(sharding.state_elems(elems));
    ModelStateBytes {
        parameters: sharding.param_elems(elems) * cfg.param_dtype.size() + master,
        master_weights: master,
        gradients: sharding.grad_elems(elems) * grad_dtype.size(),
        optimizer_state: cfg.state_bytes(sharding.state_elems(elems)),
    }
}

/// Per-rank model-state bytes for a list of parameter tensors (the optimizer's shared state
/// counted once).
pub fn model_state_bytes(
    cfg: &OptimizerConfig,
    grad_dtype: Dtype,
    sharding: Sharding,
    param_elems: &[u64],
) -> ModelStateBytes {
    let mut m = ModelStateBytes::default();
    for &e in param_elems {
        let t = tensor_state_bytes(cfg, grad_dtype, sharding, e);
        m.parameters += t.parameters;
        m.master_weights += t.master_weights;
        m.gradients += t.gradients;
        m.optimizer_state += t.optimizer_state;
    }
    if !param_elems.is_empty() {
        m.optimizer_state += cfg.shared_state_bytes();
    }
    m
}

/// Host bytes of burn-optim 0.21's per-parameter bookkeeping on `Autodiff<Flex>`, for a
/// model of `tensors` parameter tensors, allocated at the first optimizer step (besides
/// any moment or velocity buffers) and kept for the optimizer's life.
///
/// burn-optim's `OptimizerAdaptor` keeps its per-parameter state in a
/// `HashMap<ParamId, AdaptorRecord<O, B>>` (`optim/simple/adaptor.rs`): the step removes
/// each parameter's record and inserts the new one, so after the first step the map holds
/// one entry per parameter tensor, in a hashbrown table of `buckets × (entry + 1) + 16`
/// bytes (entries, one control byte per bucket, one 16-byte control group), with the
/// bucket count hashbrown grows to for that many insertions ([`hashbrown_buckets`]). Beside
/// the table, each parameter tensor costs a fixed number of bytes allocated inside the step
/// (the re-wrapped parameter's tensor handles and autodiff leaf).
///
/// The two sizes are properties of burn's Rust types on Flex and are *measured*, not
/// derived (with trainmem-burn's `twin_check` on MLPs of 4, 6, 8, 12 and 16 parameter
/// tensors; the table's bucket doublings separate them exactly):
///
/// | optimizer | map entry `(ParamId, AdaptorRecord)` | per parameter tensor |
/// |---|---|---|
/// | SGD | 192 B | 964 B |
/// | momentum | 192 B | 1,040 B |
/// | Adam | 552 B | 1,116 B |
/// | AdamW | 552 B | 1,180 B |
///
/// Adafactor and 8-bit AdamW, which burn-optim does not have, are 0.
///
/// E.g. plain SGD over 4 tensors: 8 buckets × 193 + 16 + 4 × 964 = 5,416 bytes.
pub fn burn_step_bookkeeping_bytes(kind: OptimizerKind, tensors: u64) -> u64 {
    if tensors == 0 {
        return 0;
    }
    let (entry, per_tensor) = match kind {
        OptimizerKind::Sgd => (192, 964),
        OptimizerKind::Momentum => (192, 1_040),
        OptimizerKind::Adam => (552, 1_116),
        OptimizerKind::AdamW => (552, 1_180),
        // burn-optim has no Adafactor (a plan cannot name it under burn): nothing measured
        OptimizerKind::Adafactor | OptimizerKind::AdamW8bit => return 0,
    };
    hashbrown_buckets(tensors) * (entry + 1) + 16 + tensors * per_tensor
}

/// Buckets of a hashbrown table (Rust's `HashMap`) after `items` insertions into an empty
/// map: a power of two, at least 4, whose capacity (`buckets − 1` below 8 buckets, 7/8 of
/// them from 8 on) holds `items`.
pub fn hashbrown_buckets(items: u64) -> u64 {
    let mut buckets = 4u64;
    loop {
        let capacity = if buckets < 8 {
            buckets - 1
        } else {
            buckets / 8 * 7
        };
        if capacity >= items {
            return buckets;
        }
        buckets *= 2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn multipliers_match_the_table() {
        let e = 1000;
        for (kind, mult) in [
            (OptimizerKind::Sgd, 0),
            (OptimizerKind::Momentum, 1),
            (OptimizerKind::Adam, 2),
            (OptimizerKind::AdamW, 2),
        ] {
            let c = OptimizerConfig::new(kind);
            assert_eq!(c.state_bytes(e), mult * 4 * e, "{kind:?}");
        }
        let mut c = OptimizerConfig::new(OptimizerKind::Adam);
        c.amsgrad = true;
        assert_eq!(c.state_bytes(e), 12 * e);
    }

    #[test]
    fn zero_paper_sixteen_bytes_per_parameter() {
        // Mixed-precision Adam: 2 (fp16 weights) + 2 (fp16 grads) + 12 (fp32 master, m, v).
        let mut c = OptimizerConfig::new(OptimizerKind::Adam);
        c.param_dtype = Dtype::F16;
        c.master_weights = true;
        let psi = 1_000_000;
        let m = model_state_bytes(&c, Dtype::F16, Sharding::default(), &[psi]);
        assert_eq!(m.total(), 16 * psi);
        assert_eq!(m.master_weights, 4 * psi);
        // ZeRO paper: 7.5B params at Nd = 64, stage 1 → 4Ψ + 12Ψ/64.
        let s1 = Sharding {
            world_size: 64,
            zero_stage: 1,
        };
        let m1 = model_state_bytes(&c, Dtype::F16, s1, &[64 * psi]);
        assert_eq!(m1.total(), (2 + 2) * 64 * psi + 12 * psi);
        let s3 = Sharding {
            world_size: 64,
            zero_stage: 3,
        };
        let m3 = model_state_bytes(&c, Dtype::F16, s3, &[64 * psi]);
        assert_eq!(m3.total(), 16 * psi);
    }

    #[test]
    fn step_temporaries_by_implementation() {
        let params = [10u64, 30, 20];
        let mut c = OptimizerConfig::new(OptimizerKind::Adam);
        c.implementation = StepImpl::Foreach;
        assert_eq!(c.step_temporary_peak(&params), 60 * 4);
        c.implementation = StepImpl::ForLoop;
        assert_eq!(c.step_temporary_peak(&params), 30 * 2 * 4);
        c.implementation = StepImpl::Fused;
        assert_eq!(c.step_temporary_peak(&params), 0);
        assert_eq!(
            OptimizerConfig::new(OptimizerKind::Sgd).step_temporary_peak(&params),
            0
        );
    }

    #[test]
    fn adamw8bit_state_and_step_follow_bitsandbytes() {
        let c = OptimizerConfig::new(OptimizerKind::AdamW8bit);
        // the MLP 784-1024-1024-10 of the recordings: three quantized weights (the 10 × 1024
        // head has 10,240 elements), three f32 biases, and the two shared maps
        let params = [1024 * 784, 1024, 1024 * 1024, 1024, 10 * 1024, 10];
        let m = model_state_bytes(&c, Dtype::F32, Sharding::default(), &params);
        assert_eq!(m.optimizer_state, 3_799_952);
        assert_eq!(
            c.state_bytes_of(10, None, Sharding::default()),
            vec![40, 40]
        );
        // the CPU kernel: five f32 buffers of the largest parameter at once
        assert_eq!(c.step_temporary_peak(&params), 5 * 4 * 1024 * 1024);
        // only small tensors: three buffers of the largest
        assert_eq!(c.step_temporary_peak(&[100, 4000]), 3 * 4 * 4000);
        // the fused (CUDA) kernel: none
        let mut fused = c;
        fused.implementation = StepImpl::Fused;
        assert_eq!(fused.step_temporary_peak(&params), 0);
    }

    #[test]
    fn burn_bookkeeping_follows_the_hash_table_growth() {
        // hashbrown: 3 items fit 4 buckets, 4–7 take 8, 8–14 take 16, 15–28 take 32
        assert_eq!(hashbrown_buckets(3), 4);
        assert_eq!(hashbrown_buckets(4), 8);
        assert_eq!(hashbrown_buckets(8), 16);
        assert_eq!(hashbrown_buckets(14), 16);
        assert_eq!(hashbrown_buckets(15), 32);
        assert_eq!(hashbrown_buckets(36), 64);
        // the measured SGD figures (MLPs of 4 and 8 parameter tensors)
        assert_eq!(burn_step_bookkeeping_bytes(OptimizerKind::Sgd, 4), 5_416);
        assert_eq!(burn_step_bookkeeping_bytes(OptimizerKind::Sgd, 8), 10_816);
        // 8 → 12 tensors stay in 16 buckets: only the per-tensor part grows
        let grow = burn_step_bookkeeping_bytes(OptimizerKind::Adam, 12)
            - burn_step_bookkeeping_bytes(OptimizerKind::Adam, 8);
        assert_eq!(grow, 4 * 1_116);
        assert_eq!(burn_step_bookkeeping_bytes(OptimizerKind::AdamW, 0), 0);
    }

    proptest! {
        #[test]
        fn shards_cover_the_tensor(elems in 0u64..1_000_000, world in 1u64..128) {
            let s = Sharding { world_size: world, zero_stage: 3 };
            let shard = s.shard(elems);
            prop_assert!(shard * world >= elems);
            prop_assert!(shard.saturating_sub(1) * world < elems.max(1));
        }

        #[test]
        fn sharding_never_increases_bytes(elems in 1u64..1_000_000, world in 1u64..64, stage in 0u8..4) {
            let c = OptimizerConfig::new(OptimizerKind::AdamW);
            let base = model_state_bytes(&c, Dtype::F32, Sharding::default(), &[elems]);
            let sh = model_state_bytes(&c, Dtype::F32, Sharding { world_size: world, zero_stage: stage }, &[elems]);
            prop_assert!(sh.total() <= base.total());
        }
    }

    #[test]
    fn adafactor_factors_matrices_and_keeps_vectors_whole() {
        let c = OptimizerConfig::new(OptimizerKind::Adafactor);
        // a 1024 × 784 weight: a row vector, a column vector and the RMS scalar
        assert_eq!(
            c.state_elems_of(1024 * 784, Some((1024, 784))),
            vec![1024, 784, 1]
        );
        // a bias: its full second moment and the RMS scalar
        assert_eq!(c.state_elems_of(1024, None), vec![1024, 1]);
        // other optimizers ignore the shape
        let adam = OptimizerConfig::new(OptimizerKind::Adam);
        assert_eq!(adam.state_elems_of(12, Some((3, 4))), vec![12, 12]);
        // two parameter-sized temporaries per parameter, one parameter at a time
        assert_eq!(c.step_temporary_peak(&[100, 50]), 2 * 100 * 4);
    }
}
