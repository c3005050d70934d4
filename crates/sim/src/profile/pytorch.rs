//! PyTorch's profile: eager autograd, `torch.optim`, a `DataLoader` feeding a device.

use trainmem_autograd::{SavedTable, ValueDtype};

use trainmem_core::Dtype;

use super::{
    AutogradRules, BlasWorkspaces, Bookkeeping, CheckpointRecord, Checkpointing, CpuRules,
    DroppedGraphs, FrameworkProfile, GpuRules, KernelScratch, Lowering, MetricsAt, MetricsRules,
    OptimizerRules, ParamUpdate, RetainGraph, StateDtype, Vocabulary,
};

/// PyTorch, as far as memory goes.
///
/// * Lowering: integer tensors (token ids, class targets) are `int64`; value targets are
///   f32 whatever the compute dtype; a transformer ends with a final norm and a bias-free
///   language-model head.
/// * Autograd: [`SavedTable::pytorch`]; the caller keeps its references to the batch until
///   it frees it after backward; checkpointing follows the plan's policy, per segment;
///   `retain_graph` keeps the loss graph's saved tensors through backward; dropping a kept
///   output frees its graph at once.
/// * Optimizer: the state takes `optimizer.state_dtype`, is made of tensors of its own and
///   updates parameters in place; gradients stay until `zero_grad` (or are set to `None`
///   with `training.grads_to_none`).
/// * No bookkeeping bytes are modelled; metrics are recorded once per step, after the
///   optimizer step; the loop holds outputs only when the plan keeps them.
pub const PROFILE: FrameworkProfile = FrameworkProfile {
    name: "pytorch",
    lowering: Lowering {
        int_dtype: Dtype::I64,
        value_target: ValueDtype::Fixed(Dtype::F32),
        transformer_final_norm: true,
        lm_head_bias: false,
        first_token_is_view: true,
    },
    autograd: AutogradRules {
        saved_table: SavedTable::pytorch,
        forward_owns_batch: false,
        cross_entropy_two_step: true,
        checkpointing: Checkpointing::Segments,
        retain_graph: RetainGraph::BackwardKeepsSaved,
        dropped_graphs: DroppedGraphs::Immediately,
    },
    optimizer: OptimizerRules {
        state_dtype: StateDtype::Plan,
        momentum_first_velocity_is_gradient: false,
        param_update: ParamUpdate::InPlace,
        step_consumes_grads: false,
    },
    bookkeeping: Bookkeeping {
        per_param_tensor: 0,
        optimizer_records: None,
    },
    metrics: MetricsRules {
        recorded: MetricsAt::AfterOptimizerStep,
        loop_holds_outputs: false,
    },
    checkpoint: CheckpointRecord::SerialisedState,
    cpu: CpuRules {
        batch_is_host_batch: false,
        trainmem_loader: false,
        kernel_scratch: KernelScratch::None,
        dropout_float_noise: true,
    },
    gpu: GpuRules {
        saved: &[],
        sgd_rewrite_in_gradient: false,
        // measured on an H100 (torch 2.11, CUDA 13): 32 MiB at the first forward, 32 MiB
        // more at the first backward, 1 MiB more in the first forward of a model whose
        // linear layers have biases, all kept from then on
        blas: BlasWorkspaces::PerThread { lt_bytes: 1 << 20 },
    },
    vocabulary: Vocabulary {
        stop_the_leak: " Keep scalars (`loss.item()`), detach, or clear the list to stop it.",
    },
};
