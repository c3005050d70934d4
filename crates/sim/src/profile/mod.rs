//! Framework profiles: what differs between frameworks, as data the simulator asks.
//!
//! The engine knows one mechanism — lower a model, allocate what forward saves, free it in
//! backward, step the optimizer, sample — and no framework. Everything a framework does its
//! own way, as far as memory goes, is a field of its [`FrameworkProfile`]: the module layout
//! and dtypes of lowering, the saved-tensor table, who owns the batch, what checkpointing
//! and `retain_graph` mean, when a dropped graph is freed, the optimizer state's dtype and
//! lifetime, the bookkeeping bytes a framework keeps beside parameters and optimizer state,
//! when metrics are recorded, what a CPU backend changes on the host, and the words
//! [`explain`](mod@crate::explain) uses.
//!
//! Two profiles ship, one module each: [`pytorch::PROFILE`] and [`burn::PROFILE`];
//! [`FrameworkProfile::of`] picks a plan's. The numbers in them were measured (each field
//! says where); the profile is where they live, not where they were derived.

pub mod burn;
pub mod pytorch;

use trainmem_autograd::{SavedTable, ValueDtype};

use trainmem_core::Dtype;
use trainmem_core::OptimizerKind;

use crate::machine::Machine;
use trainmem_core::plan::{DeviceKind, Framework, Plan};

/// Everything the simulator needs to know about one framework.
#[derive(Debug, Clone, Copy)]
pub struct FrameworkProfile {
    /// The framework's name as plans spell it (also the timeline's `framework` note).
    pub name: &'static str,
    /// How a model is lowered to a program.
    pub lowering: Lowering,
    /// What the autograd graph keeps, and for how long.
    pub autograd: AutogradRules,
    /// How the optimizer step treats state, gradients and parameters.
    pub optimizer: OptimizerRules,
    /// Bytes the framework keeps beside the tensors it computes with.
    pub bookkeeping: Bookkeeping,
    /// When metrics are recorded and what the training loop holds for them.
    pub metrics: MetricsRules,
    /// What a checkpoint save holds while the file is written.
    pub checkpoint: CheckpointRecord,
    /// What changes when the tensors live on a CPU device.
    pub cpu: CpuRules,
    /// What changes when the tensors live on a GPU.
    pub gpu: GpuRules,
    /// The framework's words, for explanations.
    pub vocabulary: Vocabulary,
}

/// Module layout and dtypes of lowering ([`crate::lower`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lowering {
    /// The element type of integer tensors (token ids, class targets).
    pub int_dtype: Dtype,
    /// The element type of value targets (the MSE target).
    pub value_target: ValueDtype,
    /// A transformer ends with a norm after its last block.
    pub transformer_final_norm: bool,
    /// A decoder's language-model head has a bias.
    pub lm_head_bias: bool,
    /// An encoder's first token is taken as a view of the last hidden states (`h[:, 0]`), so
    /// the layer that saves it keeps the whole tensor alive; otherwise it is a copy.
    pub first_token_is_view: bool,
}

/// What the autograd graph keeps, and for how long.
#[derive(Debug, Clone, Copy)]
pub struct AutogradRules {
    /// What each op saves for backward (the tables are data in trainmem-autograd).
    pub saved_table: fn() -> SavedTable,
    /// Forward takes the batch over: an input tensor is freed at its last use unless an op
    /// saved it, and the training loop does not free the batch after backward.
    pub forward_owns_batch: bool,
    /// Cross-entropy's backward makes the log-probabilities' gradient, then the logits'
    /// gradient while the first is alive (PyTorch's `nll_loss` and `log_softmax` backward).
    pub cross_entropy_two_step: bool,
    /// What gradient checkpointing does.
    pub checkpointing: Checkpointing,
    /// What keeping an output with its graph (`leak.retain_graph`) means.
    pub retain_graph: RetainGraph,
    /// When the graphs of kept outputs the loop drops (`leak.clear_every`) are freed.
    pub dropped_graphs: DroppedGraphs,
}

/// What gradient checkpointing does under a framework.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checkpointing {
    /// The plan's policy resolved into segments of blocks whose activations are dropped and
    /// recomputed in backward (trainmem-autograd `checkpoint::resolve`).
    Segments,
    /// burn-autodiff's `BalancedCheckpointing`, whatever the policy (but `none`): per op, not
    /// per segment — compute-bound outputs are kept, memory-bound (element-wise) ones
    /// recomputed in backward (trainmem-autograd `checkpoint::burn_balanced_tables`).
    Balanced,
}

/// What keeping an output with its graph means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetainGraph {
    /// Backward runs with `retain_graph`: the loss graph's saved tensors survive it, and the
    /// kept output keeps them alive.
    BackwardKeepsSaved,
    /// There is no `retain_graph`: the kept output comes from a forward pass of its own that
    /// is never backwarded (its graph saves no loss tensors); the loss forward is backwarded
    /// and freed as usual.
    SeparateForward,
}

/// When the graphs of dropped kept outputs are freed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DroppedGraphs {
    /// With the output: dropping it frees its graph and the weights it pinned at once.
    Immediately,
    /// The output's own buffer at once; its graph's saved tensors and pinned weights one
    /// layer per later backward pass, from the input side.
    OneLayerPerBackward,
}

/// How the optimizer step treats state, gradients and parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptimizerRules {
    /// The dtype optimizer state takes.
    pub state_dtype: StateDtype,
    /// Momentum's first velocity is the gradient tensor itself (a reference that keeps its
    /// `gradient` tag); a velocity of its own replaces it at the second step.
    pub momentum_first_velocity_is_gradient: bool,
    /// Whether the step updates parameters in place.
    pub param_update: ParamUpdate,
    /// The step consumes the gradients (frees them): there is no `zero_grad`, and
    /// `training.grads_to_none` has nothing to do.
    pub step_consumes_grads: bool,
}

/// The dtype optimizer state takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateDtype {
    /// The plan's `optimizer.state_dtype`.
    Plan,
    /// The gradients' dtype (the state is built from the gradient tensors).
    Gradients,
}

/// Whether the optimizer step updates parameters in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamUpdate {
    /// Always in place.
    InPlace,
    /// In place only when the parameter's buffer is uniquely owned. AdamW's decoupled decay
    /// starts from a clone, so every step writes every parameter into a new buffer
    /// (allocated inside the step, `optimizer_state`) and frees the old one; a graph kept
    /// without backward still references the weights its matmuls saved (the weight of
    /// every linear layer whose input is tracked), so those are copied too and the old
    /// buffers stay with the kept graph.
    WhenUniquelyOwned,
    /// Never in place: every step writes every trainable parameter into a new buffer
    /// (allocated inside the step, `optimizer_state`) and frees the old one, whatever the
    /// optimizer (burn's fusion, whose fused kernels write new tensors); the weights a kept
    /// graph references stay with it, as under [`ParamUpdate::WhenUniquelyOwned`].
    NewBuffer,
}

/// Bytes a framework keeps beside the tensors it computes with.
#[derive(Debug, Clone, Copy)]
pub struct Bookkeeping {
    /// Bytes per parameter tensor kept from model construction on, tagged `parameter`.
    pub per_param_tensor: u64,
    /// The optimizer's bookkeeping, made at the first optimizer step and kept for the
    /// optimizer's life (`optimizer_state`), if the framework has any.
    pub optimizer_records: Option<OptimizerRecords>,
}

/// An optimizer's bookkeeping beside its state.
#[derive(Debug, Clone, Copy)]
pub struct OptimizerRecords {
    /// What it is, in words (for explanations).
    pub what: &'static str,
    /// Its bytes for an optimizer kind and a number of parameter tensors.
    pub bytes: fn(OptimizerKind, u64) -> u64,
}

/// When metrics are recorded and what the training loop holds for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricsRules {
    /// When the step's metrics are recorded (and sampled).
    pub recorded: MetricsAt,
    /// The training loop holds every micro-batch's outputs (the logits) until its metrics
    /// are recorded, whether or not the plan keeps them.
    pub loop_holds_outputs: bool,
}

/// When metrics are recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricsAt {
    /// Once per step, after the optimizer step.
    AfterOptimizerStep,
    /// Per micro-batch, right after its backward pass, before the optimizer step.
    AfterEachBackward,
}

/// What a checkpoint save holds in host memory while it writes the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointRecord {
    /// An f32 copy of every parameter (no optimizer state), `temporary` while the recorder
    /// writes it: burn's record of the module at full precision. On a CPU device it is a
    /// tensor-sized block beside the tensors; on a GPU it is the host side of reading every
    /// parameter back (cubecl's page-locked read buffers on CUDA), and the device holds
    /// nothing more.
    F32ParameterCopy,
    /// Parameters and optimizer state serialised on the host (`other`): a `state_dict`
    /// pickled by `torch.save`.
    SerialisedState,
}

/// What changes when a run's tensors live on a CPU device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuRules {
    /// The batch tensors are the loader's host batch (one copy, counted with the tensors),
    /// not a host copy beside a device copy.
    pub batch_is_host_batch: bool,
    /// Vector and image models read their data through trainmem-loader (its epoch order,
    /// pinned staging pool and queue shape: [`crate::engine::host::HostModel`]), on a GPU
    /// too: the host side is the same whatever device holds the tensors; token models read a
    /// synthetic source without a sampler.
    pub trainmem_loader: bool,
    /// Kernel scratch the compute library keeps for the training thread's life, unless the
    /// plan gives `host.kernel_scratch`.
    pub kernel_scratch: KernelScratch,
    /// Dropout keeps a noise tensor of the input's dtype for backward (the CPU kernel is
    /// `input · noise`), not the 1-byte mask of the device kernel.
    pub dropout_float_noise: bool,
}

/// What changes when a run's tensors live on a GPU (the framework's GPU backend's kernels).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuRules {
    /// Ops whose GPU kernels save something else than the framework's table says: each
    /// replaces the op's entry on a GPU device.
    pub saved: &'static [(trainmem_core::OpKind, &'static [trainmem_autograd::Saved])],
    /// Plain SGD writes a parameter it cannot update in place (a kept graph references the
    /// old one) into its gradient's buffer, which keeps its `gradient` tag (otherwise: a new
    /// buffer made inside the step, [`OptimizerRules::param_update`]).
    pub sgd_rewrite_in_gradient: bool,
    /// The workspaces the framework's BLAS library keeps through the caching allocator.
    pub blas: BlasWorkspaces,
}

/// The workspaces a framework's BLAS library takes from the caching allocator and keeps for
/// the process's life (`empty_cache` does not return them): device memory the allocator
/// counts as allocated and no tensor owns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlasWorkspaces {
    /// None (a backend with matmul kernels of its own).
    None,
    /// PyTorch's cuBLAS handles: one handle per thread, and one workspace per handle and
    /// stream, allocated at the handle's first cuBLAS call (`setWorkspaceForHandle` in
    /// ATen's `CublasHandlePool.cpp`): the training thread's at the first matmul of forward,
    /// the autograd engine's device thread's at the first matmul of backward (or of a
    /// checkpointed segment's recomputation, which runs there). Each is
    /// [`pytorch_cublas_workspace`] bytes. A linear layer with a bias runs as `addmm`
    /// through cuBLASLt, whose workspace is another allocation of `lt_bytes` per handle
    /// and stream (`getCUDABlasLtWorkspace`: `CUBLASLT_WORKSPACE_SIZE`, 1024 KiB by
    /// default); only forward calls it (backward's gradients are plain matmuls and sums).
    PerThread {
        /// cuBLASLt's workspace per handle and stream.
        lt_bytes: u64,
    },
}

/// PyTorch's cuBLAS workspace per handle and stream on `device`: `device.blas_workspace`
/// when given (`CUBLAS_WORKSPACE_CONFIG`), otherwise ATen's default for the compute
/// capability: 4096 KiB × 8 = 32 MiB on 9.0 (Hopper), `:4096:2:16:8` = 4096 KiB × 2 +
/// 16 KiB × 8 = 8,519,680 B on any other (`parseChosenWorkspaceSize`, which tests
/// `major == 9 && minor == 0`).
pub fn pytorch_cublas_workspace(device: &trainmem_core::plan::DevicePlan) -> u64 {
    if let Some(b) = device.blas_workspace {
        return b.0;
    }
    if device.capability() == (9, 0) {
        4096 * 8 * 1024
    } else {
        4096 * 1024 * 2 + 16 * 1024 * 8
    }
}

/// Kernel scratch a CPU backend keeps for a thread's whole life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelScratch {
    /// None.
    None,
    /// gemm's thread-local packing buffer ([`Machine::gemm_packing_bytes`],
    /// [`crate::engine::kernel_scratch`]).
    GemmPacking,
}

/// The framework's words, for explanations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Vocabulary {
    /// How to stop a leak of kept tensors (a sentence, with its leading space).
    pub stop_the_leak: &'static str,
}

impl FrameworkProfile {
    /// The profile of `framework`.
    pub fn of(framework: Framework) -> &'static FrameworkProfile {
        match framework {
            Framework::Pytorch => &pytorch::PROFILE,
            Framework::Burn => &burn::PROFILE,
        }
    }

    /// The profile a run of `plan` follows: its framework's, and burn's fused one on a GPU
    /// with `device.fusion`.
    pub fn for_plan(plan: &Plan) -> &'static FrameworkProfile {
        match plan.framework {
            Framework::Burn if plan.device.fusion && plan.device.kind != DeviceKind::Cpu => {
                &burn::FUSED
            }
            framework => FrameworkProfile::of(framework),
        }
    }

    /// The saved-tensor table.
    pub fn saved_table(&self) -> SavedTable {
        (self.autograd.saved_table)()
    }

    /// The saved-tensor table on a `device` of this kind: the framework's table, with the
    /// ops whose CPU kernels save something else ([`CpuRules::dropout_float_noise`]) changed
    /// on a CPU device, and those of [`GpuRules::saved`] on a GPU (where the graph's own
    /// records, [`trainmem_autograd::Saved::Nodes`], are host memory: the runner sets
    /// `Graph::records_on_host`).
    pub fn saved_table_on(&self, device: DeviceKind) -> SavedTable {
        let mut table = self.saved_table();
        if device == DeviceKind::Cpu && self.cpu.dropout_float_noise {
            table.set(
                trainmem_core::OpKind::Dropout,
                vec![trainmem_autograd::Saved::FloatMask],
            );
        }
        if device != DeviceKind::Cpu {
            for &(op, saved) in self.gpu.saved {
                table.set(op, saved.to_vec());
            }
        }
        table
    }

    /// Bytes of kernel scratch a run of `plan` keeps from `start` to `end` under `other` on
    /// `machine`: `host.kernel_scratch` when the plan gives it; otherwise the profile's
    /// [`CpuRules::kernel_scratch`] on a CPU device, 0 on a GPU.
    pub fn kernel_scratch_bytes(&self, plan: &Plan, machine: &Machine) -> u64 {
        if let Some(b) = plan.host.kernel_scratch {
            return b.0;
        }
        match (plan.device.kind, self.cpu.kernel_scratch) {
            (DeviceKind::Cpu, KernelScratch::GemmPacking) => machine.gemm_packing_bytes(),
            _ => 0,
        }
    }

    /// The optimizer's bookkeeping bytes for `tensors` parameter tensors (0 without any).
    pub fn optimizer_record_bytes(&self, kind: OptimizerKind, tensors: u64) -> u64 {
        self.bookkeeping
            .optimizer_records
            .map_or(0, |r| (r.bytes)(kind, tensors))
    }

    /// Whether the step's metrics are recorded after each backward pass.
    pub fn metrics_after_backward(&self) -> bool {
        self.metrics.recorded == MetricsAt::AfterEachBackward
    }

    /// Whether an output kept with its graph comes from a forward of its own.
    pub fn kept_graph_is_separate_forward(&self) -> bool {
        self.autograd.retain_graph == RetainGraph::SeparateForward
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(text: &str) -> Plan {
        Plan::from_toml_str(text).expect("plan")
    }

    #[test]
    fn each_framework_has_its_profile() {
        assert_eq!(FrameworkProfile::of(Framework::Pytorch).name, "pytorch");
        assert_eq!(FrameworkProfile::of(Framework::Burn).name, "burn");
        // the names are the plans' spelling
        for f in [Framework::Pytorch, Framework::Burn] {
            assert_eq!(
                format!("{f:?}").to_lowercase(),
                FrameworkProfile::of(f).name
            );
        }
    }

    #[test]
    fn kernel_scratch_follows_the_plan_the_profile_and_the_machine() {
        let base = "[model.mlp]\ninput = 4\nhidden = [8]\noutput = 2\n";
        let machine = Machine {
            l2_bytes_per_cpu: 3 << 20,
        };
        let scratch = |text: &str| {
            let p = plan(text);
            FrameworkProfile::of(p.framework).kernel_scratch_bytes(&p, &machine)
        };
        let burn_cuda = format!("framework = \"burn\"\n{base}");
        let burn_cpu = format!("{burn_cuda}[device]\nkind = \"cpu\"\n");
        let torch_cpu = format!("{base}[device]\nkind = \"cpu\"\n");
        // PyTorch plans (and burn on a GPU) carry none by default
        assert_eq!(scratch(base), 0);
        assert_eq!(scratch(&torch_cpu), 0);
        assert_eq!(scratch(&burn_cuda), 0);
        // burn on a CPU: gemm's packing buffer of the machine given, not of this one
        assert_eq!(scratch(&burn_cpu), 3 << 20);
        // an explicit size wins, for any framework
        assert_eq!(
            scratch(&format!("{burn_cpu}[host]\nkernel_scratch = \"2MiB\"\n")),
            2 << 20
        );
        assert_eq!(
            scratch(&format!("{base}[host]\nkernel_scratch = \"1KiB\"\n")),
            1024
        );
    }

    #[test]
    fn pytorch_keeps_no_bookkeeping_and_burn_measured_bytes() {
        let torch = FrameworkProfile::of(Framework::Pytorch);
        let burn = FrameworkProfile::of(Framework::Burn);
        assert_eq!(torch.bookkeeping.per_param_tensor, 0);
        assert_eq!(torch.optimizer_record_bytes(OptimizerKind::Adam, 8), 0);
        assert_eq!(burn.bookkeeping.per_param_tensor, burn::PARAM_BOOKKEEPING);
        // 4 tensors under SGD: 8 buckets × 193 + 16 + 4 × 964 (burn-optim 0.21, measured)
        assert_eq!(burn.optimizer_record_bytes(OptimizerKind::Sgd, 4), 5_416);
    }
}
