//! burn 0.21's profile (burn-autodiff, burn-nn, burn-optim; the Flex CPU backend), as
//! measured with trainmem-burn (see its `burn_facts` docs and `twin_check`).

use trainmem_autograd::{Saved, SavedTable, ValueDtype};

use trainmem_core::{Dtype, OpKind};

use super::{
    AutogradRules, BlasWorkspaces, Bookkeeping, CheckpointRecord, Checkpointing, CpuRules,
    DroppedGraphs, FrameworkProfile, GpuRules, KernelScratch, Lowering, MetricsAt, MetricsRules,
    OptimizerRecords, OptimizerRules, ParamUpdate, RetainGraph, StateDtype, Vocabulary,
};

/// Host bytes burn 0.21 keeps beside each parameter tensor's data on `Autodiff<Flex>`
/// (burn-nn's `Param` wrapper with its id and lazy-init state, the tensor handle and its
/// layout, the autodiff leaf node of a parameter that requires grad), tagged `parameter`
/// from model construction on.
///
/// This is a *measured* per-structure constant, not derived from burn's types: trainmem-burn's
/// `twin_check` reports the measured `parameter` category minus the parameter tensors'
/// bytes as 1,475–1,542 bytes per parameter tensor on MLPs of 4 to 16 tensors and 1,496 on
/// a 36-tensor transformer (burn-nn `TransformerEncoder`); some larger MLPs and the CNN
/// plan measure up to ≈ 2.2 KB per tensor (a few KB per model more, not per tensor, and not
/// modelled).
pub const PARAM_BOOKKEEPING: u64 = 1_500;

/// What burn 0.21 does differently from PyTorch around a step, as far as memory goes
/// (measured with trainmem-burn; see its `burn_facts` docs).
///
/// Lowering:
///
/// * burn's integer tensors take the backend's `IntElem`, which is `i32` on Flex
///   (burn-flex 0.21 `backend.rs`: `type IntElem = i32`), and a burn run builds its token
///   and class tensors as `i32` data (trainmem-burn `Batch::from_host`). (The synthetic
///   token source's host values are `f32` and its tensors `i32`: 4 bytes either way.)
/// * A burn run casts the whole batch (features and value targets) to the compute dtype, so
///   value targets take it.
/// * burn-nn's `TransformerEncoder` (pre-norm) has no final LayerNorm after its last block,
///   and its head is a `Linear` with a bias.
///
/// Autograd:
///
/// * [`SavedTable::burn`] (burn-autodiff's ops, with their graph nodes).
/// * The batch is moved into the model (`model.forward(batch)`): an input tensor is freed
///   at its last use unless an op saved it (the MSE target goes during forward, the first
///   layer keeps the features until backward).
/// * burn has one checkpointing strategy, `BalancedCheckpointing` (a measured run maps every
///   policy but `none` to it): per op, not per segment — compute-bound outputs are kept,
///   memory-bound (element-wise) ones recomputed in backward.
/// * There is no `retain_graph`: outputs kept with their graph come from a forward pass of
///   their own (the loss forward is backwarded as usual); that graph saves no loss tensors.
/// * Kept graphs the training loop drops (`leak.clear_every`) are freed late. burn-autodiff
///   keeps every graph in a process-wide registry. Dropping a kept output frees the
///   output's own buffer at once, but its graph's saved tensors (and the old weight buffers
///   the graph references) are freed only by the cleanup after a later backward pass, which
///   frees one layer of an orphaned graph per pass, from the input side: on the 2-layer MLP
///   (trainmem-burn `burn_facts`, "Dropping kept graphs frees them late", and the
///   retained-leak plan with `clear_every = 2`) the first backward after the drop frees the
///   first layer's saved batch and ReLU state, the second frees the second linear layer's
///   saved input and the pinned old weights.
///
/// Optimizer:
///
/// * Optimizer state takes the parameters' dtype (burn-optim builds the moments from the
///   gradient tensors).
/// * Momentum's first velocity is the gradient tensor itself (`grad.clone()`, a reference):
///   with allocation-time tags its bytes stay under `gradient` until the second step makes a
///   new velocity under `optimizer_state`.
/// * The optimizer updates a parameter in place only when its buffer is uniquely owned.
///   AdamW's decoupled decay starts from `tensor.clone()`, so every step writes the
///   parameter into a new buffer, allocated inside the step (`optimizer_state`), and frees
///   the old one. A graph kept without backward still references the weights its matmuls
///   saved (the right operand of every linear layer whose input is tracked), so those
///   weights are copied too and the old buffers stay with the kept graph.
/// * There is no `zero_grad`: the optimizer step consumes `GradientsParams`, so gradients
///   are freed inside the step.
///
/// Bookkeeping: [`PARAM_BOOKKEEPING`] per parameter tensor from construction on, and
/// burn-optim's per-parameter records from the first step on
/// ([`trainmem_optim::burn_step_bookkeeping_bytes`]).
///
/// Metrics: the training loop holds the logits (returned beside the loss) until the step's
/// metrics are recorded, after backward. Metrics are recorded (and sampled) per micro-batch
/// right after its backward pass, before the optimizer step; metric tensors keep the loss
/// (`loss.clone().detach()` shares its buffer) and, with `metrics.keep_outputs` only, the
/// logits.
///
/// On a CPU device (Flex):
///
/// * Tensors are host memory: the loaded batch is the one host copy.
/// * A burn run reads vector and image models through trainmem-loader (token models from a
///   synthetic source without a sampler).
/// * A checkpoint is `into_record().into_item::<FullPrecisionSettings>()`: it holds a host
///   copy of every parameter in f32 (no optimizer state) while the recorder writes it.
/// * gemm's thread-local packing buffer is kernel scratch for the whole run
///   ([`crate::engine::kernel_scratch`]).
///
/// On a GPU (burn's CUDA backend, `CubeBackend<CudaRuntime, f32, i32, u8>`; measured on a lent
/// H100 with trainmem-track, whose device bytes equal cubecl's bytes in use at every phase
/// boundary: fixtures/gpu-check/):
///
/// * A cubecl element-wise op writes its result into an operand it uniquely owns, the right
///   one too when the left is shared. burn-nn's MSE computes `logits - targets` while the
///   training loop holds the logits, so the difference is written into the target's buffer:
///   the target stays alive (`input`) as the tensor `square` saves, and no new difference is
///   made ([`GPU_SAVED`]).
/// * Max pooling keeps its indices as the backend's `i32` integers (4 bytes each; Flex's
///   kernel makes `i64`).
/// * Plain SGD's `param - grad · lr`, for a parameter a kept graph still references, is
///   written into the gradient's buffer (`grad · lr` was computed in place there): the new
///   parameter keeps the `gradient` tag.
/// * burn's own records (the `Param` wrappers, burn-optim's per-parameter records) are host
///   memory: on a GPU they are not device bytes.
pub const PROFILE: FrameworkProfile = FrameworkProfile {
    name: "burn",
    lowering: Lowering {
        int_dtype: Dtype::I32,
        value_target: ValueDtype::Compute,
        transformer_final_norm: false,
        lm_head_bias: true,
        first_token_is_view: false,
    },
    autograd: AutogradRules {
        saved_table: SavedTable::burn,
        forward_owns_batch: true,
        cross_entropy_two_step: false,
        checkpointing: Checkpointing::Balanced,
        retain_graph: RetainGraph::SeparateForward,
        dropped_graphs: DroppedGraphs::OneLayerPerBackward,
    },
    optimizer: OptimizerRules {
        state_dtype: StateDtype::Gradients,
        momentum_first_velocity_is_gradient: true,
        param_update: ParamUpdate::WhenUniquelyOwned,
        step_consumes_grads: true,
    },
    bookkeeping: Bookkeeping {
        per_param_tensor: PARAM_BOOKKEEPING,
        optimizer_records: Some(OptimizerRecords {
            what: "burn-optim's per-parameter records",
            bytes: trainmem_optim::burn_step_bookkeeping_bytes,
        }),
    },
    metrics: MetricsRules {
        recorded: MetricsAt::AfterEachBackward,
        loop_holds_outputs: true,
    },
    checkpoint: CheckpointRecord::F32ParameterCopy,
    cpu: CpuRules {
        batch_is_host_batch: true,
        trainmem_loader: true,
        kernel_scratch: KernelScratch::GemmPacking,
        dropout_float_noise: false,
    },
    gpu: GpuRules {
        saved: GPU_SAVED,
        sgd_rewrite_in_gradient: true,
        // cubecl's matmuls are kernels of its own: no cuBLAS handle
        blas: BlasWorkspaces::None,
    },
    vocabulary: Vocabulary {
        stop_the_leak: " Keep scalars (`loss.into_scalar()`), `detach()` what you keep, or clear \
                        the list to stop it.",
    },
};

/// burn on a GPU with its `fusion` feature (`Fusion<CubeBackend<…>>`, plan `device.fusion`):
/// [`PROFILE`] but for what fused kernels change, measured with trainmem-track on a lent H100
/// and on wgpu over Mesa's lavapipe (fixtures/gpu-check/*-fusion/):
///
/// * A fused kernel writes its result into a new tensor, never into an operand: every
///   optimizer step writes each parameter into a new buffer, made by the step's ops
///   (`optimizer_state`), whatever the optimizer ([`ParamUpdate::NewBuffer`]); plain SGD does
///   not reuse the gradient's buffer; MSE's `logits - targets` is a difference of its own,
///   which `square` saves ([`SavedTable::burn`]'s entry, not [`GPU_SAVED`]'s).
/// * trainmem-track counts each fusion tensor at its dense size (a lazy id has no buffer to
///   measure yet), so the twin counts device tensors unrounded (`SimMemory`'s granularity 1).
pub const FUSED: FrameworkProfile = FrameworkProfile {
    optimizer: OptimizerRules {
        param_update: ParamUpdate::NewBuffer,
        ..PROFILE.optimizer
    },
    gpu: GpuRules {
        saved: FUSED_GPU_SAVED,
        sgd_rewrite_in_gradient: false,
        ..PROFILE.gpu
    },
    ..PROFILE
};

/// What burn's fused GPU kernels save differently from [`SavedTable::burn`] (see [`FUSED`]).
pub const FUSED_GPU_SAVED: &[(OpKind, &[Saved])] =
    &[(OpKind::MaxPool2d, &[Saved::Input(0), Saved::IndicesI32])];

/// What burn's CUDA kernels save differently from [`SavedTable::burn`] (see [`PROFILE`]).
pub const GPU_SAVED: &[(OpKind, &[Saved])] = &[
    // the difference lives in the target's buffer
    (OpKind::MseLoss, &[Saved::Input(1)]),
    (OpKind::MaxPool2d, &[Saved::Input(0), Saved::IndicesI32]),
];
