//! Plans: a TOML file describing a training run whose memory the simulator predicts.
//!
//! Every section except `[model]` is optional and has documented defaults. Unknown keys are
//! errors naming the key and its line; so are inconsistent values (a micro-batch that does not
//! divide the batch, a ZeRO stage above 3, heads that do not divide the hidden size, ...).
//!
//! ```toml
//! name = "gpt2-small on one 24 GiB GPU"
//!
//! [model.transformer]
//! layers = 12
//! hidden = 768
//! heads = 12
//! seq_len = 1024
//! vocab = 50257
//!
//! [training]
//! batch_size = 16
//! micro_batch_size = 4      # gradient accumulation over 4 micro-batches
//! epochs = 1
//! steps_per_epoch = 50
//!
//! [precision]
//! compute = "bf16"
//! master_weights = true
//!
//! [optimizer]
//! kind = "adamw"
//!
//! [device]
//! capacity = "24GiB"
//! allocator = "max_split_size_mb:128"
//! context = "527MiB"        # the CUDA context, outside the allocator (default 526.81 MiB)
//! ```
//!
//! `[precision]` has three forms. `compute = "f32"` (the default) keeps everything in f32.
//! `compute = "bf16"` (or `"f16"`) holds parameters and activations in half precision, with
//! an f32 master copy of the weights beside them unless `master_weights = false`. `autocast =
//! "bf16"` (or `"f16"`, with `compute = "f32"`) is `torch.autocast`: parameters, gradients and
//! optimizer state stay f32; the ops on the device's lower-precision list (linear layers,
//! convolutions, matmuls, attention) cast their inputs and weights to half precision each
//! forward pass, the ops on its f32 list (losses everywhere; softmax and the norms on CUDA) run
//! in f32, and the rest run in the widest dtype of their inputs. trainmem-sim's `autocast`
//! module holds the rules per device.
//!
//! `[optimizer]` names the algorithm with `kind`: `sgd`, `momentum`, `adam`, `adamw` (PyTorch's
//! and burn's), `adafactor` (`transformers`' Adafactor, its second moment factored per matrix)
//! or `adamw8bit` (bitsandbytes' `AdamW8bit`: each moment one byte per element plus an f32
//! absolute maximum per block of 256 elements for parameters of at least 4096 elements, f32
//! moments for smaller ones, and two 1 KiB quantization maps shared by all parameters; its
//! step runs the CPU backend's kernel on a CPU device, which dequantizes both moments to f32
//! one parameter at a time, and the fused CUDA kernel, without scratch, on a GPU).
//! `implementation` (`for_loop`, `foreach`, `fused`) says how PyTorch's step runs, which sets
//! its scratch; `state` (`lazy`, `eager`) when the state is made.
//!
//! `[host]` has `capacity` (reported against, not enforced), `baseline` (resident bytes before
//! training, under `other`) and `kernel_scratch` (bytes a compute library keeps for the
//! training thread's life, under `other` from `start` to `end`; by default gemm's L2-sized
//! packing buffer for framework `burn` on a CPU device, 0 otherwise; trainmem-sim's framework
//! profile applies the rule).
//!
//! The loader section is trainmem-sim's own [`LoaderPlan`] (worker count, prefetch factor,
//! persistence, pinning); it mirrors the knobs of trainmem-loader's configuration.

use std::path::Path;

pub use crate::dtype::Dtype;
pub use crate::framework::Framework;
pub use crate::optimizer::{OptimizerKind, StateAllocation, StepImpl};
use serde::{Deserialize, Serialize};

pub use crate::bytes::ByteSize;
pub use crate::model::*;

/// A whole plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    /// A short name for reports.
    #[serde(default)]
    pub name: String,
    /// Seed of the deterministic pseudo-random sizes (augmentation size variation).
    #[serde(default)]
    pub seed: u64,
    /// Whose autograd rules decide what forward saves for backward (`pytorch` or `burn`).
    #[serde(default)]
    pub framework: Framework,
    /// The network.
    pub model: ModelSpec,
    /// Batch, accumulation, epochs, steps, checkpoints, `empty_cache`.
    #[serde(default)]
    pub training: TrainingPlan,
    /// Parameter and activation dtypes.
    #[serde(default)]
    pub precision: PrecisionPlan,
    /// Optimizer and its state.
    #[serde(default)]
    pub optimizer: OptimizerPlan,
    /// Gradient checkpointing.
    #[serde(default)]
    pub checkpointing: CheckpointingPlan,
    /// The data set.
    #[serde(default)]
    pub data: DataPlan,
    /// The data loader.
    #[serde(default)]
    pub loader: LoaderPlan,
    /// What is kept of per-step metrics.
    #[serde(default)]
    pub metrics: MetricsPlan,
    /// Deliberate retention of outputs across steps (a leak, for study).
    #[serde(default)]
    pub leak: LeakPlan,
    /// The accelerator (or CPU) the tensors live on.
    #[serde(default)]
    pub device: DevicePlan,
    /// The host.
    #[serde(default)]
    pub host: HostPlan,
    /// Data-parallel and pipeline layout.
    #[serde(default)]
    pub parallel: ParallelPlan,
}

/// When `empty_cache` is called.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum EmptyCachePolicy {
    /// Never.
    #[default]
    Never,
    /// After every optimizer step.
    EveryStep,
    /// At the end of every epoch.
    EveryEpoch,
}

/// `[training]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainingPlan {
    /// Samples per optimizer step on each data-parallel rank (the effective batch).
    pub batch_size: u64,
    /// Samples per forward/backward; must divide `batch_size`. Default: `batch_size`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub micro_batch_size: Option<u64>,
    /// Alternative to `micro_batch_size`: micro-batches per optimizer step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grad_accumulation: Option<u64>,
    /// Epochs.
    pub epochs: u64,
    /// Optimizer steps per epoch; default: data set samples / batch_size (rounded per
    /// `loader.drop_last`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps_per_epoch: Option<u64>,
    /// Stop after this many optimizer steps in total.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_steps: Option<u64>,
    /// Save a checkpoint every this many steps (0 = never).
    pub checkpoint_every: u64,
    /// When `empty_cache` is called.
    pub empty_cache: EmptyCachePolicy,
    /// `zero_grad(set_to_none=True)`: gradients are freed after each step (PyTorch ≥ 2.0 and
    /// burn). With `false` they stay allocated and are zeroed in place.
    pub grads_to_none: bool,
}

impl Default for TrainingPlan {
    fn default() -> Self {
        TrainingPlan {
            batch_size: 32,
            micro_batch_size: None,
            grad_accumulation: None,
            epochs: 1,
            steps_per_epoch: None,
            max_steps: None,
            checkpoint_every: 0,
            empty_cache: EmptyCachePolicy::Never,
            grads_to_none: true,
        }
    }
}

/// `[precision]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PrecisionPlan {
    /// Dtype of parameters and activations (`f32`, `f16`, `bf16`).
    pub compute: Dtype,
    /// Under `f16`/`bf16`: keep f32 master weights beside the half-precision parameters
    /// (mixed precision). Ignored for f32.
    pub master_weights: bool,
    /// Dtype of gradients; default = `compute`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grads: Option<Dtype>,
    /// `torch.autocast` to this half-precision dtype (`bf16` or `f16`) around forward and
    /// the loss: f32 parameters, gradients and optimizer state, half-precision copies of the
    /// weights made during forward, and each op in the dtype autocast gives it. Needs
    /// `compute = "f32"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autocast: Option<Dtype>,
}

impl Default for PrecisionPlan {
    fn default() -> Self {
        PrecisionPlan {
            compute: Dtype::F32,
            master_weights: true,
            grads: None,
            autocast: None,
        }
    }
}

/// `[optimizer]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OptimizerPlan {
    /// `sgd`, `momentum`, `adam`, `adamw`, `adafactor`, `adamw8bit`.
    pub kind: OptimizerKind,
    /// `lazy` (state created at the first step, as PyTorch and burn do) or `eager`.
    pub state: StateAllocation,
    /// How the step is computed, which sets its temporaries: `foreach` (~1× parameter bytes
    /// of scratch), `for_loop` (one parameter's worth at a time) or `fused` (none).
    pub implementation: StepImpl,
    /// Dtype of the optimizer state.
    pub state_dtype: Dtype,
    /// AMSGrad keeps a third Adam buffer (max of the second moment).
    pub amsgrad: bool,
}

impl Default for OptimizerPlan {
    fn default() -> Self {
        OptimizerPlan {
            kind: OptimizerKind::Adam,
            state: StateAllocation::Lazy,
            implementation: StepImpl::ForLoop,
            state_dtype: Dtype::F32,
            amsgrad: false,
        }
    }
}

/// Gradient-checkpointing policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum CheckpointPolicyKind {
    /// Keep every activation.
    #[default]
    None,
    /// Checkpoint segments of `every` layers.
    Every,
    /// Segments of about √n layers (Chen et al. 2016).
    Sqrt,
    /// The segment length whose predicted peak is lowest while activations fit in `budget`.
    Budget,
}

/// `[checkpointing]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct CheckpointingPlan {
    /// The policy.
    pub policy: CheckpointPolicyKind,
    /// Segment length in layers, for `every`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every: Option<u64>,
    /// Activation budget, for `budget`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<ByteSize>,
}

/// How the data set is held on the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum DataStorage {
    /// Memory-mapped file: costs page cache (file RSS) up to the bytes touched.
    #[default]
    Mmap,
    /// Read fully into memory at start: costs anonymous RSS equal to the data set.
    Preload,
    /// Read per batch and dropped: no resident data set.
    Stream,
    /// A memory-mapped flat token file (nanoGPT `train.bin`): page cache, like `mmap`.
    Tokens,
    /// A memory-mapped Megatron-LM indexed data set (`.bin` + `.idx`): page cache, like
    /// `mmap`.
    Indexed,
    /// A memory-mapped Arrow IPC file or stream (a Hugging Face `datasets` cache): page
    /// cache, like `mmap`.
    Arrow,
    /// A memory-mapped safetensors file: page cache, like `mmap`.
    Safetensors,
}

impl DataStorage {
    /// Whether the data set is read through a memory map: it costs page cache (file RSS) up
    /// to the bytes touched, and no anonymous memory.
    pub fn is_memory_mapped(self) -> bool {
        !matches!(self, DataStorage::Preload | DataStorage::Stream)
    }
}

/// `[data]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DataPlan {
    /// Bytes of one decoded sample on the host; default: what the model takes per sample.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample_bytes: Option<ByteSize>,
    /// Bytes of one stored sample (what a memory map touches); default = `sample_bytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stored_sample_bytes: Option<ByteSize>,
    /// Samples in the data set.
    pub samples: u64,
    /// How the data set is held.
    pub storage: DataStorage,
    /// Scratch a worker needs while augmenting, as a multiple of the batch's bytes.
    pub augmentation_scratch: f64,
    /// ± fraction by which the per-sample size varies from batch to batch (random crops,
    /// variable sequence lengths). 0 = every batch the same size.
    pub size_variation: f64,
}

impl Default for DataPlan {
    fn default() -> Self {
        DataPlan {
            sample_bytes: None,
            stored_sample_bytes: None,
            samples: 10_000,
            storage: DataStorage::Mmap,
            augmentation_scratch: 0.0,
            size_variation: 0.0,
        }
    }
}

/// The most loader workers a plan may have, and trainmem-loader's `MAX_WORKERS`: far more
/// than any machine has CPUs.
pub const LOADER_MAX_WORKERS: u64 = 1 << 16;

/// The most batches a plan's loader may keep in flight (`workers × prefetch_factor`), and
/// trainmem-loader's `MAX_BATCHES_IN_FLIGHT`.
pub const LOADER_MAX_BATCHES_IN_FLIGHT: u64 = 1 << 20;

/// `[loader]`: trainmem-sim's model of a multi-worker prefetching loader.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoaderPlan {
    /// Worker processes/threads (0 = load in the training loop).
    pub workers: u64,
    /// Batches each worker keeps ready.
    pub prefetch_factor: u64,
    /// Keep workers (and their queues) alive across epochs.
    pub persistent_workers: bool,
    /// Copy batches into page-locked staging buffers (rounded up to a power of two).
    pub pin_memory: bool,
    /// Drop the last incomplete batch of an epoch.
    pub drop_last: bool,
    /// Private memory of each worker once started (interpreter, copied pages, ...).
    pub worker_overhead: ByteSize,
}

impl Default for LoaderPlan {
    fn default() -> Self {
        LoaderPlan {
            workers: 0,
            prefetch_factor: 2,
            persistent_workers: false,
            pin_memory: false,
            drop_last: true,
            worker_overhead: ByteSize(0),
        }
    }
}

/// What is kept of per-step metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum MetricRetention {
    /// Nothing is kept.
    #[default]
    None,
    /// A host float per metric per step (`loss.item()`).
    Scalars,
    /// The device tensors themselves (loss and outputs), detached from the graph.
    Tensors,
}

/// `[metrics]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsPlan {
    /// What is kept per step.
    pub retention: MetricRetention,
    /// Metrics recorded per step.
    pub per_step: u64,
    /// With `tensors`: the model outputs are kept too (for accuracy at epoch end).
    pub keep_outputs: bool,
}

impl Default for MetricsPlan {
    fn default() -> Self {
        MetricsPlan {
            retention: MetricRetention::None,
            per_step: 1,
            keep_outputs: false,
        }
    }
}

/// `[leak]`: deliberately keeping graph-holding outputs across steps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct LeakPlan {
    /// Keep each step's model output (still attached to its graph).
    pub retain_outputs: bool,
    /// Backward with `retain_graph`: the saved tensors stay with the kept output.
    pub retain_graph: bool,
    /// Drop the kept outputs every this many steps (0 = never).
    pub clear_every: u64,
}

/// What kind of memory tensors live in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum DeviceKind {
    /// A GPU behind a caching allocator (PyTorch semantics).
    #[default]
    Cuda,
    /// The host: tensors are host memory (burn's CPU backends), and count in host RSS too.
    Cpu,
}

/// `[device]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DevicePlan {
    /// Where tensors live.
    pub kind: DeviceKind,
    /// Memory the allocator may obtain.
    pub capacity: ByteSize,
    /// Allocator configuration string (`PYTORCH_CUDA_ALLOC_CONF` syntax, e.g.
    /// `max_split_size_mb:128`).
    pub allocator: String,
    /// Device memory the CUDA context holds (driver state, loaded kernels), outside the
    /// allocator: counted in what `nvidia-smi` reports, not in `capacity` (the memory the
    /// allocator may obtain). Default: [`DEFAULT_CUDA_CONTEXT`] on a CUDA device, 0 on a CPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<ByteSize>,
    /// The GPU's compute capability as `"major.minor"` (`"9.0"`: H100/H200, `"8.0"`: A100),
    /// which decides defaults that depend on the architecture, such as PyTorch's cuBLAS
    /// workspace. Default [`DEFAULT_COMPUTE_CAPABILITY`], the card the other defaults were
    /// measured on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_capability: Option<String>,
    /// The workspace a framework gives each thread's BLAS handle (PyTorch:
    /// `CUBLAS_WORKSPACE_CONFIG`, the sum of its `:SIZE_KiB:COUNT` pairs), when not the
    /// framework's default for the compute capability.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blas_workspace: Option<ByteSize>,
    /// burn on a GPU only (`framework = "burn"`, `kind = "cuda"`): the bytes cubecl rounds
    /// each buffer up to, when the runtime's is not the caching allocator's 512 B (cubecl-cuda's
    /// pitch). cubecl-wgpu takes the adapter's uniform offset alignment (32 B on Mesa's
    /// lavapipe; at most 256 B under WebGPU's limits). With it, the twin counts each device
    /// tensor at its bytes rounded up to this, as cubecl does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alignment: Option<ByteSize>,
    /// burn on a GPU only: the run uses burn's `fusion` feature (`burn::backend::Cuda` and
    /// `Wgpu` are then `Fusion<CubeBackend<…>>`). Fused kernels write their results into new
    /// buffers: every optimizer step writes each parameter anew, and element-wise ops write
    /// no operand in place. trainmem-track counts each fusion tensor at its dense size.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fusion: bool,
}

/// The compute capability a plan's GPU has when `device.compute_capability` is absent: 9.0,
/// the NVIDIA H100 80GB HBM3 that [`DEFAULT_CUDA_CONTEXT`] and the GPU recordings come from
/// (and the default `capacity`'s size).
pub const DEFAULT_COMPUTE_CAPABILITY: (u32, u32) = (9, 0);

/// The CUDA context's bytes when a plan does not give `device.context`: 552,402,944 B
/// (526.8 MiB), measured on an NVIDIA H100 80GB HBM3 with driver 580.159.04 as the driver's
/// total minus free memory (`cuMemGetInfo`) right after trainmem-alloc's `CudaDevice` opened
/// the device's primary context (trainmem's RESULTS.md, "The devices: memory, CUDA context,
/// cubecl's pools", the H100 of 2026-11-24: 85,017,493,504 B total, 84,465,090,560 B free).
/// PyTorch's context is of the same order and grows as kernels are loaded lazily (CUDA ≥
/// 11.7); before lazy loading it exceeded 1 GB (Hugging Face measured 1,343 MB on a V100
/// after `torch.ones((1, 1)).cuda()`).
pub const DEFAULT_CUDA_CONTEXT: ByteSize = ByteSize(552_402_944);

impl DevicePlan {
    /// The CUDA context's bytes: `context` when given; otherwise [`DEFAULT_CUDA_CONTEXT`] on
    /// a CUDA device and 0 on a CPU.
    pub fn context_bytes(&self) -> u64 {
        match (self.context, self.kind) {
            (Some(b), _) => b.0,
            (None, DeviceKind::Cuda) => DEFAULT_CUDA_CONTEXT.0,
            (None, DeviceKind::Cpu) => 0,
        }
    }

    /// The GPU's compute capability (`major`, `minor`): `compute_capability` when given
    /// and well formed, otherwise [`DEFAULT_COMPUTE_CAPABILITY`].
    pub fn capability(&self) -> (u32, u32) {
        self.compute_capability
            .as_deref()
            .and_then(parse_capability)
            .unwrap_or(DEFAULT_COMPUTE_CAPABILITY)
    }
}

/// `"9.0"` as (9, 0); `None` for anything else than two numbers joined by a dot.
pub fn parse_capability(text: &str) -> Option<(u32, u32)> {
    let (major, minor) = text.trim().split_once('.')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

impl Default for DevicePlan {
    fn default() -> Self {
        DevicePlan {
            kind: DeviceKind::Cuda,
            capacity: ByteSize(80 << 30),
            allocator: String::new(),
            context: None,
            compute_capability: None,
            blas_workspace: None,
            alignment: None,
            fusion: false,
        }
    }
}

/// `[host]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct HostPlan {
    /// Host memory; reported against, not enforced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<ByteSize>,
    /// Resident memory of the process before training (interpreter, libraries).
    pub baseline: ByteSize,
    /// Kernel scratch the compute library keeps for the training thread's whole life,
    /// counted under `other` from `start` to `end` (e.g. `"1MiB"`). Absent: for framework
    /// `burn` on a CPU device, the `gemm` crate's thread-local packing buffer as gemm sizes
    /// it on the machine the run is predicted for (a machine fact trainmem-sim takes as an
    /// input: its `Machine`); otherwise 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_scratch: Option<ByteSize>,
}

/// `[parallel]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ParallelPlan {
    /// Data-parallel ranks.
    pub world_size: u64,
    /// ZeRO stage: 0 none, 1 optimizer state sharded, 2 + gradients, 3 + parameters.
    pub zero_stage: u8,
    /// Devices the layers are split across (pipeline / model parallel).
    pub pipeline_stages: u64,
}

impl Default for ParallelPlan {
    fn default() -> Self {
        ParallelPlan {
            world_size: 1,
            zero_stage: 0,
            pipeline_stages: 1,
        }
    }
}

/// Errors loading or validating a plan.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The file could not be read.
    #[error("cannot read plan {path}: {cause}")]
    Io {
        /// The path.
        path: String,
        /// The cause.
        cause: std::io::Error,
    },
    /// TOML syntax, an unknown key or a value of the wrong type. The message names the key
    /// and its line.
    #[error("{origin}: {message}")]
    Parse {
        /// File name (or `<plan>`).
        origin: String,
        /// The parser's message, with line and column.
        message: String,
    },
    /// A value that parses but is inconsistent.
    #[error("{origin}{}: `{key}`: {message}", line.map(|l| format!(":{l}")).unwrap_or_default())]
    Invalid {
        /// File name (or `<plan>`).
        origin: String,
        /// Dotted key, e.g. `training.micro_batch_size`.
        key: String,
        /// 1-based line of the key in the source, when found.
        line: Option<usize>,
        /// What is wrong.
        message: String,
    },
    /// The plan could not be written as TOML.
    #[error("cannot write the plan as TOML")]
    Write(#[source] toml::ser::Error),
}

impl Plan {
    /// Reads and validates a plan file.
    pub fn load(path: impl AsRef<Path>) -> Result<Plan, PlanError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|cause| PlanError::Io {
            path: path.display().to_string(),
            cause,
        })?;
        Plan::parse(&text, &path.display().to_string())
    }

    /// Parses and validates TOML text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Plan, PlanError> {
        let plan: Plan = toml::from_str(text).map_err(|e| PlanError::Parse {
            origin: origin.to_string(),
            message: e.to_string().trim_end().to_string(),
        })?;
        plan.validate_in(text, origin)?;
        Ok(plan)
    }

    /// Parses without an origin name.
    pub fn from_toml_str(text: &str) -> Result<Plan, PlanError> {
        Plan::parse(text, "<plan>")
    }

    /// Writes the plan as TOML.
    pub fn to_toml(&self) -> Result<String, PlanError> {
        toml::to_string(self).map_err(PlanError::Write)
    }

    /// Checks consistency; errors carry no line (see [`Plan::parse`] for located errors).
    pub fn validate(&self) -> Result<(), PlanError> {
        self.validate_in("", "<plan>")
    }

    fn validate_in(&self, src: &str, origin: &str) -> Result<(), PlanError> {
        let err = |key: &str, message: String| PlanError::Invalid {
            origin: origin.to_string(),
            key: key.to_string(),
            line: locate_key(src, key),
            message,
        };
        self.validate_training(&err)?;
        self.validate_precision(&err)?;
        self.validate_optimizer(&err)?;
        self.validate_checkpointing(&err)?;
        self.validate_data(&err)?;
        self.validate_retention(&err)?;
        self.validate_layout(&err)?;
        self.validate_device(&err)?;
        self.validate_model(&err)?;
        self.validate_input_sizes(&err)
    }

    /// The bytes of a micro-batch's and of the data set's inputs fit 64 bits (every count
    /// the loader and the device make of them is a product of these), at most 8 bytes an
    /// input element (i64 token ids and classes, f32 features and value targets).
    fn validate_input_sizes(
        &self,
        err: &dyn Fn(&str, String) -> PlanError,
    ) -> Result<(), PlanError> {
        let product = |shape: &[u64]| shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
        let (key, elems) = match &self.model {
            ModelSpec::Mlp(m) => ("model.mlp.input", m.input.checked_add(m.output)),
            ModelSpec::Cnn(c) => (
                "model.cnn.image",
                product(&c.image).and_then(|e| e.checked_add(c.classes)),
            ),
            ModelSpec::Transformer(t) => ("model.transformer.seq_len", t.seq_len.checked_mul(2)),
            ModelSpec::Layers(l) => (
                "model.layers.input",
                product(&l.input).and_then(|e| {
                    e.checked_add(crate::model_check::layer_out(l, l.layers.len() - 1))
                }),
            ),
        };
        let Some(per_sample) = elems.and_then(|e| e.checked_mul(8)) else {
            return Err(err(
                key,
                "one sample's input and target have more bytes than 64 bits count".into(),
            ));
        };
        let micro_key = if self.training.micro_batch_size.is_some() {
            "training.micro_batch_size"
        } else {
            "training.batch_size"
        };
        for (key, count, what) in [
            (micro_key, self.micro_batch_size(), "a micro-batch"),
            ("data.samples", self.data.samples, "the data set"),
        ] {
            if per_sample.checked_mul(count).is_none() {
                return Err(err(
                    key,
                    format!(
                        "{what} of {count} samples of up to {per_sample} input bytes each (8 \
                         bytes an input element) overflows a 64-bit byte count; is a size \
                         mistyped?"
                    ),
                ));
            }
        }
        if let Some(b) = self.data.stored_sample_bytes
            && b.0.checked_mul(self.data.samples).is_none()
        {
            return Err(err(
                "data.stored_sample_bytes",
                format!(
                    "{} samples of {} bytes overflow a 64-bit byte count",
                    self.data.samples, b.0
                ),
            ));
        }
        Ok(())
    }

    /// `[device]`: the cubecl-only settings need burn on a GPU; an alignment is a power of two
    /// up to 512.
    fn validate_device(&self, err: &dyn Fn(&str, String) -> PlanError) -> Result<(), PlanError> {
        let d = &self.device;
        let on_cubecl = self.framework == Framework::Burn && d.kind == DeviceKind::Cuda;
        for (key, set) in [
            ("device.alignment", d.alignment.is_some()),
            ("device.fusion", d.fusion),
        ] {
            if set && !on_cubecl {
                return Err(err(
                    key,
                    "is a setting of burn's cubecl backends: it needs framework = \"burn\" and \
                     device.kind = \"cuda\""
                        .into(),
                ));
            }
        }
        if let Some(a) = d.alignment
            && !(a.0.is_power_of_two() && a.0 <= 512)
        {
            return Err(err(
                "device.alignment",
                format!(
                    "{} bytes: give a power of two up to 512 (cubecl-cuda's 512, wgpu's 256 at \
                     most)",
                    a.0
                ),
            ));
        }
        Ok(())
    }

    /// `[training]`: batch, accumulation, epochs and steps, and enough samples for a batch.
    fn validate_training(&self, err: &dyn Fn(&str, String) -> PlanError) -> Result<(), PlanError> {
        let t = &self.training;
        if t.batch_size == 0 {
            return Err(err("training.batch_size", "must be at least 1".into()));
        }
        if t.micro_batch_size.is_some() && t.grad_accumulation.is_some() {
            return Err(err(
                "training.grad_accumulation",
                "give either micro_batch_size or grad_accumulation, not both".into(),
            ));
        }
        if let Some(m) = t.micro_batch_size
            && (m == 0 || !t.batch_size.is_multiple_of(m))
        {
            return Err(err(
                "training.micro_batch_size",
                format!("{m} does not divide batch_size {}", t.batch_size),
            ));
        }
        if let Some(a) = t.grad_accumulation
            && (a == 0 || !t.batch_size.is_multiple_of(a))
        {
            return Err(err(
                "training.grad_accumulation",
                format!("{a} does not divide batch_size {}", t.batch_size),
            ));
        }
        if t.epochs == 0 {
            return Err(err("training.epochs", "must be at least 1".into()));
        }
        if t.steps_per_epoch == Some(0) {
            return Err(err("training.steps_per_epoch", "must be at least 1".into()));
        }
        if t.max_steps == Some(0) {
            return Err(err("training.max_steps", "must be at least 1".into()));
        }
        if self.steps_per_epoch() == 0 {
            return Err(err(
                "data.samples",
                format!(
                    "{} samples make no batch of {} (with drop_last); give more samples or training.steps_per_epoch",
                    self.data.samples, t.batch_size
                ),
            ));
        }
        Ok(())
    }

    /// `[precision]` and the optimizer's state dtype: float dtypes, and autocast's terms.
    fn validate_precision(&self, err: &dyn Fn(&str, String) -> PlanError) -> Result<(), PlanError> {
        let p = &self.precision;
        if !p.compute.is_float() {
            return Err(err(
                "precision.compute",
                format!(
                    "`{}` is not a float dtype (use f32, f16 or bf16)",
                    p.compute
                ),
            ));
        }
        if let Some(g) = p.grads
            && !g.is_float()
        {
            return Err(err(
                "precision.grads",
                format!("`{g}` is not a float dtype"),
            ));
        }
        if !self.optimizer.state_dtype.is_float() {
            return Err(err(
                "optimizer.state_dtype",
                format!("`{}` is not a float dtype", self.optimizer.state_dtype),
            ));
        }
        if let Some(a) = p.autocast {
            if !a.is_half() {
                return Err(err(
                    "precision.autocast",
                    format!("`{a}` is not a half-precision dtype (use bf16 or f16)"),
                ));
            }
            if self.framework != Framework::Pytorch {
                return Err(err(
                    "precision.autocast",
                    format!("autocast is PyTorch's; framework is {:?}", self.framework),
                ));
            }
            if p.compute != Dtype::F32 {
                return Err(err(
                    "precision.autocast",
                    format!(
                        "autocast keeps f32 parameters: it needs compute = \"f32\", not \"{}\"",
                        p.compute
                    ),
                ));
            }
        }
        Ok(())
    }

    /// `[optimizer]`: AMSGrad only for Adam, and where Adafactor and 8-bit AdamW are modelled.
    fn validate_optimizer(&self, err: &dyn Fn(&str, String) -> PlanError) -> Result<(), PlanError> {
        if self.optimizer.amsgrad && !self.optimizer.kind.is_adam() {
            return Err(err(
                "optimizer.amsgrad",
                format!(
                    "amsgrad applies to adam and adamw, not {}",
                    self.optimizer.kind.name()
                ),
            ));
        }
        if self.optimizer.kind == OptimizerKind::Adafactor {
            // the factored state needs each parameter's matrix shape, which trainmem knows for
            // MLPs and transformers; burn has no Adafactor; ZeRO does not shard factored state
            let why = if self.framework != Framework::Pytorch {
                Some("Adafactor is modelled under framework = \"pytorch\" only")
            } else if !matches!(self.model, ModelSpec::Mlp(_) | ModelSpec::Transformer(_)) {
                Some("Adafactor is modelled for mlp and transformer models only")
            } else if self.parallel.zero_stage > 0 {
                Some("Adafactor's factored state is not sharded by ZeRO here")
            } else {
                None
            };
            if let Some(why) = why {
                return Err(err("optimizer.kind", why.into()));
            }
        }
        if self.optimizer.kind == OptimizerKind::AdamW8bit {
            // bitsandbytes' 8-bit AdamW: a PyTorch optimizer with its own state layout (one
            // byte per element and f32 block maxima; f32 for small tensors) and two step
            // kernels (the CPU backend's composed one, CUDA's fused one)
            let why = if self.framework != Framework::Pytorch {
                Some("adamw8bit (bitsandbytes) is modelled under framework = \"pytorch\" only")
            } else if self.parallel.zero_stage > 0 {
                Some("adamw8bit's block-quantized state is not sharded by ZeRO here")
            } else if self.optimizer.implementation == StepImpl::Foreach {
                Some(
                    "adamw8bit steps one parameter at a time: implementation = \"for_loop\" (its CPU kernel) or \"fused\" (its CUDA kernel)",
                )
            } else {
                None
            };
            if let Some(why) = why {
                return Err(err("optimizer.kind", why.into()));
            }
            if self.optimizer.state_dtype != Dtype::F32 {
                return Err(err(
                    "optimizer.state_dtype",
                    "adamw8bit keeps its own state dtypes (u8 moments with f32 block maxima, f32 moments for tensors under 4096 elements): leave state_dtype = \"f32\"".into(),
                ));
            }
        }
        Ok(())
    }

    /// `[checkpointing]`: each policy with the one setting it needs.
    fn validate_checkpointing(
        &self,
        err: &dyn Fn(&str, String) -> PlanError,
    ) -> Result<(), PlanError> {
        let c = &self.checkpointing;
        match c.policy {
            CheckpointPolicyKind::Every => match c.every {
                None | Some(0) => {
                    return Err(err(
                        "checkpointing.every",
                        "policy \"every\" needs every = k (layers per segment, ≥ 1)".into(),
                    ));
                }
                Some(_) => {}
            },
            CheckpointPolicyKind::Budget if c.budget.is_none() => {
                return Err(err(
                    "checkpointing.budget",
                    "policy \"budget\" needs budget = \"<bytes>\"".into(),
                ));
            }
            _ => {}
        }
        if c.every.is_some() && c.policy != CheckpointPolicyKind::Every {
            return Err(err(
                "checkpointing.every",
                "only applies to policy = \"every\"".into(),
            ));
        }
        if c.budget.is_some() && c.policy != CheckpointPolicyKind::Budget {
            return Err(err(
                "checkpointing.budget",
                "only applies to policy = \"budget\"".into(),
            ));
        }
        Ok(())
    }

    /// `[data]` and `[loader]`: samples, augmentation ranges, workers and prefetch (within
    /// [`LOADER_MAX_WORKERS`] and [`LOADER_MAX_BATCHES_IN_FLIGHT`]).
    fn validate_data(&self, err: &dyn Fn(&str, String) -> PlanError) -> Result<(), PlanError> {
        let d = &self.data;
        if d.samples == 0 {
            return Err(err("data.samples", "must be at least 1".into()));
        }
        if !(0.0..=16.0).contains(&d.augmentation_scratch) || d.augmentation_scratch.is_nan() {
            return Err(err(
                "data.augmentation_scratch",
                format!("{} is outside 0..=16", d.augmentation_scratch),
            ));
        }
        if !(0.0..1.0).contains(&d.size_variation) || d.size_variation.is_nan() {
            return Err(err(
                "data.size_variation",
                format!("{} is outside 0 ≤ v < 1", d.size_variation),
            ));
        }
        if self.loader.workers > 0 && self.loader.prefetch_factor == 0 {
            return Err(err(
                "loader.prefetch_factor",
                "must be at least 1 when workers > 0".into(),
            ));
        }
        // trainmem-loader's own limits (`MAX_WORKERS`, `MAX_BATCHES_IN_FLIGHT`): a plan the
        // loader would refuse is not simulated either
        if self.loader.workers > LOADER_MAX_WORKERS {
            return Err(err(
                "loader.workers",
                format!(
                    "{} is more than the {LOADER_MAX_WORKERS} workers a loader accepts",
                    self.loader.workers
                ),
            ));
        }
        let in_flight = self.loader.workers.checked_mul(self.loader.prefetch_factor);
        if in_flight.is_none_or(|n| n > LOADER_MAX_BATCHES_IN_FLIGHT) {
            return Err(err(
                "loader.prefetch_factor",
                format!(
                    "{} × {} workers is more than the {LOADER_MAX_BATCHES_IN_FLIGHT} batches in \
                     flight a loader accepts",
                    self.loader.prefetch_factor, self.loader.workers
                ),
            ));
        }
        if self.loader.persistent_workers && self.loader.workers == 0 {
            return Err(err(
                "loader.persistent_workers",
                "needs workers > 0 (there are no workers to keep)".into(),
            ));
        }
        Ok(())
    }

    /// `[metrics]` and `[leak]`: settings that need another one.
    fn validate_retention(&self, err: &dyn Fn(&str, String) -> PlanError) -> Result<(), PlanError> {
        if self.metrics.keep_outputs && self.metrics.retention != MetricRetention::Tensors {
            return Err(err(
                "metrics.keep_outputs",
                "only applies to retention = \"tensors\"".into(),
            ));
        }
        if self.leak.retain_graph && !self.leak.retain_outputs {
            return Err(err(
                "leak.retain_graph",
                "needs retain_outputs = true (a graph is kept alive only through an output)".into(),
            ));
        }
        Ok(())
    }

    /// `[device]` and `[parallel]`: capacity, world size, ZeRO stage, pipeline stages.
    fn validate_layout(&self, err: &dyn Fn(&str, String) -> PlanError) -> Result<(), PlanError> {
        if let Some(cc) = &self.device.compute_capability
            && parse_capability(cc).is_none()
        {
            return Err(err(
                "device.compute_capability",
                format!("`{cc}` is not `major.minor` (e.g. \"9.0\")"),
            ));
        }
        if self.device.capacity.0 == 0 {
            return Err(err("device.capacity", "must be more than 0 bytes".into()));
        }
        let par = &self.parallel;
        if par.world_size == 0 {
            return Err(err("parallel.world_size", "must be at least 1".into()));
        }
        if par.zero_stage > 3 {
            return Err(err(
                "parallel.zero_stage",
                format!("{} is not a ZeRO stage (0, 1, 2 or 3)", par.zero_stage),
            ));
        }
        if par.zero_stage > 0 && par.world_size == 1 {
            return Err(err(
                "parallel.zero_stage",
                "sharding needs world_size > 1".into(),
            ));
        }
        if par.pipeline_stages == 0 {
            return Err(err("parallel.pipeline_stages", "must be at least 1".into()));
        }
        Ok(())
    }

    /// `[model]`: each kind's sizes and settings.
    fn validate_model(&self, err: &dyn Fn(&str, String) -> PlanError) -> Result<(), PlanError> {
        match &self.model {
            ModelSpec::Mlp(m) => {
                if m.input == 0 || m.output == 0 || m.hidden.contains(&0) {
                    return Err(err(
                        "model.mlp.hidden",
                        "layer widths must be at least 1".into(),
                    ));
                }
                check_prob(m.dropout, "model.mlp.dropout", err)?;
            }
            ModelSpec::Cnn(c) => {
                if c.image.contains(&0) {
                    return Err(err(
                        "model.cnn.image",
                        "dimensions must be at least 1".into(),
                    ));
                }
                if c.classes == 0 {
                    return Err(err("model.cnn.classes", "must be at least 1".into()));
                }
                crate::model_check::check_cnn(c).map_err(|m| err("model.cnn.layers", m))?;
            }
            ModelSpec::Transformer(t) => self.validate_transformer(t, err)?,
            ModelSpec::Layers(l) => {
                crate::model_check::check_layers(l).map_err(|m| err("model.layers.layers", m))?;
            }
        }
        Ok(())
    }

    /// `[model.transformer]`: sizes, head layout, features, LoRA and pipeline stages.
    fn validate_transformer(
        &self,
        t: &TransformerSpec,
        err: &dyn Fn(&str, String) -> PlanError,
    ) -> Result<(), PlanError> {
        let k = "model.transformer";
        for (name, v) in [
            ("layers", t.layers),
            ("hidden", t.hidden),
            ("heads", t.heads),
            ("seq_len", t.seq_len),
            ("vocab", t.vocab),
        ] {
            if v == 0 {
                return Err(err(&format!("{k}.{name}"), "must be at least 1".into()));
            }
        }
        match t.head_dim {
            Some(0) => {
                return Err(err(&format!("{k}.head_dim"), "must be at least 1".into()));
            }
            None if !t.hidden.is_multiple_of(t.heads) => {
                return Err(err(
                    &format!("{k}.heads"),
                    format!(
                        "{} heads do not divide hidden {} (give head_dim for heads of \
                         another width)",
                        t.heads, t.hidden
                    ),
                ));
            }
            _ => {}
        }
        self.validate_transformer_features(t, err)?;
        let kv = t.kv_head_count();
        if kv == 0 || !t.heads.is_multiple_of(kv) {
            return Err(err(
                &format!("{k}.kv_heads"),
                format!("{kv} key/value heads do not divide {} heads", t.heads),
            ));
        }
        if t.ffn == Some(0) {
            return Err(err(&format!("{k}.ffn"), "must be at least 1".into()));
        }
        self.validate_transformer_widths(t, err)?;
        if t.classes.is_some() && t.kind != TransformerKind::Encoder {
            return Err(err(
                &format!("{k}.classes"),
                "only applies to kind = \"encoder\"".into(),
            ));
        }
        check_prob(t.dropout, &format!("{k}.dropout"), err)?;
        if let Some(p) = t.attention_dropout {
            check_prob(p, &format!("{k}.attention_dropout"), err)?;
        }
        for (name, value) in [
            ("sliding_window", t.sliding_window),
            ("global_every", t.global_every),
        ] {
            if value == Some(0) {
                return Err(err(&format!("{k}.{name}"), "must be at least 1".into()));
            }
        }
        if let Some(lora) = &t.lora {
            lora.check(t).map_err(|m| err(&format!("{k}.lora"), m))?;
            for &target in &lora.targets {
                let fits = LoraSpec::checked_dims(t, target)
                    .is_some_and(|(fin, fout)| lora.rank.checked_mul(fin.max(fout)).is_some());
                if !fits {
                    return Err(err(
                        &format!("{k}.lora.rank"),
                        format!(
                            "the adapter of rank {} on `{}` has more elements than 64 bits count",
                            lora.rank,
                            target.name()
                        ),
                    ));
                }
            }
        }
        if self.parallel.pipeline_stages > t.layers {
            return Err(err(
                "parallel.pipeline_stages",
                format!(
                    "{} stages for {} layers: each stage needs at least one layer",
                    self.parallel.pipeline_stages, t.layers
                ),
            ));
        }
        Ok(())
    }

    /// The widths the model's sizes imply fit 64 bits: the queries' (`heads × head size`),
    /// the keys' and values' (`kv_heads × head size`), the packed projection's (`q + 2 ×
    /// kv`), the feed-forward's (`4 × hidden` by default; twice that packed with its gate).
    fn validate_transformer_widths(
        &self,
        t: &TransformerSpec,
        err: &dyn Fn(&str, String) -> PlanError,
    ) -> Result<(), PlanError> {
        let k = "model.transformer";
        let d = t.head_size();
        let too_wide = |key: &str, what: String| {
            err(
                &format!("{k}.{key}"),
                format!("{what} overflows a 64-bit count; is a size mistyped?"),
            )
        };
        let q = t.checked_q_width().ok_or_else(|| {
            too_wide(
                "heads",
                format!("the query width: {} heads × head size {d}", t.heads),
            )
        })?;
        let kv = t.checked_kv_width().ok_or_else(|| {
            too_wide(
                "kv_heads",
                format!(
                    "the key/value width: {} heads × head size {d}",
                    t.kv_head_count()
                ),
            )
        })?;
        if kv.checked_mul(2).and_then(|w| w.checked_add(q)).is_none() {
            return Err(too_wide(
                "heads",
                format!("the packed projection's width: {q} + 2 × {kv}"),
            ));
        }
        let f = t.checked_ffn_size().ok_or_else(|| {
            too_wide(
                "hidden",
                format!("the default feed-forward size: 4 × hidden {}", t.hidden),
            )
        })?;
        if t.fused_gate_up && f.checked_mul(2).is_none() {
            return Err(too_wide(
                "ffn",
                format!("the packed gate and input width: 2 × {f}"),
            ));
        }
        Ok(())
    }

    /// The transformer settings beyond the classic stack: soft-caps, a gated packed
    /// feed-forward, a mixture of experts; and which of them burn's run cannot take.
    fn validate_transformer_features(
        &self,
        t: &TransformerSpec,
        err: &dyn Fn(&str, String) -> PlanError,
    ) -> Result<(), PlanError> {
        let k = "model.transformer";
        for (name, cap) in [
            ("logit_softcap", t.logit_softcap),
            ("attn_softcap", t.attn_softcap),
        ] {
            if let Some(c) = cap
                && !(c.is_finite() && c > 0.0)
            {
                return Err(err(
                    &format!("{k}.{name}"),
                    format!("{c} is not a positive cap"),
                ));
            }
        }
        if t.fused_gate_up && !t.gated_ffn {
            return Err(err(
                &format!("{k}.fused_gate_up"),
                "packs a gated feed-forward's gate and input projections: needs gated_ffn".into(),
            ));
        }
        if let Some(m) = &t.moe {
            self.validate_moe(m, err)?;
        }
        if self.framework == Framework::Burn {
            check_burn_transformer(t, err)?;
        }
        Ok(())
    }

    /// `[model.transformer.moe]`: experts, routing, expert sizes and capacity.
    fn validate_moe(
        &self,
        m: &MoeSpec,
        err: &dyn Fn(&str, String) -> PlanError,
    ) -> Result<(), PlanError> {
        let km = "model.transformer.moe";
        if m.experts == 0 {
            return Err(err(&format!("{km}.experts"), "must be at least 1".into()));
        }
        if m.top_k == 0 || m.top_k > m.experts {
            return Err(err(
                &format!("{km}.top_k"),
                format!("{} is not between 1 and the {} experts", m.top_k, m.experts),
            ));
        }
        if m.expert_ffn == Some(0) || m.shared_expert_ffn == Some(0) {
            return Err(err(km, "expert sizes must be at least 1".into()));
        }
        if m.shared_expert_gate && m.shared_expert_ffn.is_none() {
            return Err(err(
                &format!("{km}.shared_expert_gate"),
                "gates a shared expert: needs shared_expert_ffn".into(),
            ));
        }
        if let Some(c) = m.capacity_factor
            && !(c.is_finite() && c > 0.0)
        {
            return Err(err(
                &format!("{km}.capacity_factor"),
                format!("{c} is not a positive factor"),
            ));
        }
        if self.optimizer.kind == OptimizerKind::Adafactor {
            return Err(err(
                "optimizer.kind",
                "Adafactor's factored state of the experts' 3-D weights is not modelled".into(),
            ));
        }
        Ok(())
    }

    /// Samples per forward/backward.
    pub fn micro_batch_size(&self) -> u64 {
        let t = &self.training;
        match (t.micro_batch_size, t.grad_accumulation) {
            (Some(m), _) => m,
            (None, Some(a)) => t.batch_size / a.max(1),
            (None, None) => t.batch_size,
        }
    }

    /// Micro-batches per optimizer step.
    pub fn accumulation_steps(&self) -> u64 {
        self.training.batch_size / self.micro_batch_size().max(1)
    }

    /// Optimizer steps per epoch.
    pub fn steps_per_epoch(&self) -> u64 {
        if let Some(s) = self.training.steps_per_epoch {
            return s;
        }
        let b = self.training.batch_size.max(1);
        if self.loader.drop_last {
            self.data.samples / b
        } else {
            self.data.samples.div_ceil(b)
        }
    }

    /// Optimizer steps in the whole run.
    pub fn total_steps(&self) -> u64 {
        let all = self.steps_per_epoch().saturating_mul(self.training.epochs);
        self.training.max_steps.map_or(all, |m| m.min(all))
    }

    /// A copy with another effective batch size, keeping the accumulation structure (used
    /// by `fit`).
    pub fn with_batch(&self, batch_size: u64, micro_batch_size: Option<u64>) -> Plan {
        let mut p = self.clone();
        p.training.batch_size = batch_size;
        p.training.micro_batch_size = micro_batch_size;
        p.training.grad_accumulation = None;
        p
    }
}

/// Rejects the transformer settings burn's run does not model.
fn check_burn_transformer(
    t: &TransformerSpec,
    err: &dyn Fn(&str, String) -> PlanError,
) -> Result<(), PlanError> {
    let k = "model.transformer";
    let beyond = [
        ("head_dim", t.head_dim.is_some()),
        ("block", t.block != BlockLayout::Sequential),
        ("ffn_bias", t.ffn_bias.is_some()),
        ("head_bias", t.head_bias.is_some()),
        ("post_norms", t.post_norms),
        ("qk_norm", t.qk_norm),
        ("fused_gate_up", t.fused_gate_up),
        ("logit_softcap", t.logit_softcap.is_some()),
        ("attn_softcap", t.attn_softcap.is_some()),
        ("moe", t.moe.is_some()),
        (
            "attention",
            matches!(
                t.attention,
                AttentionImpl::Sdpa | AttentionImpl::FlashAttention2
            ),
        ),
        // what a PyTorch model's own code does
        ("attention_dropout", t.attention_dropout.is_some()),
        ("softmax_f32", t.softmax_f32.is_some()),
        ("norm_weight_f32", t.norm_weight_f32),
        ("partial_rotary", t.partial_rotary),
        ("sliding_window", t.sliding_window.is_some()),
        ("global_every", t.global_every.is_some()),
        ("materialized_mask", t.materialized_mask),
        ("repeat_kv", t.repeat_kv.is_some()),
        ("alibi", t.alibi),
        ("kv_cache", t.kv_cache.is_some()),
    ];
    if let Some((name, _)) = beyond.iter().find(|(_, on)| *on) {
        return Err(err(
            &format!("{k}.{name}"),
            "is modelled under framework = \"pytorch\" only".into(),
        ));
    }
    Ok(())
}

fn check_prob(p: f64, key: &str, err: &dyn Fn(&str, String) -> PlanError) -> Result<(), PlanError> {
    if !(0.0..1.0).contains(&p) || p.is_nan() {
        return Err(err(key, format!("probability {p} is outside 0 ≤ p < 1")));
    }
    Ok(())
}

/// Finds the 1-based line where a dotted key (`training.batch_size`) is written in TOML text:
/// under its `[table]` header (or `[a.b]` for `a.b.key`), or as a dotted key.
pub fn locate_key(src: &str, key: &str) -> Option<usize> {
    let (table, leaf) = match key.rfind('.') {
        Some(i) => (&key[..i], &key[i + 1..]),
        None => ("", key),
    };
    let mut current = String::new();
    let mut table_line = None;
    for (i, raw) in src.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.starts_with("[[") {
            current = line
                .trim_matches(|c| c == '[' || c == ']')
                .trim()
                .to_string();
            continue;
        }
        if line.starts_with('[') {
            current = line
                .trim_matches(|c| c == '[' || c == ']')
                .trim()
                .to_string();
            if current == table {
                table_line = Some(i + 1);
            }
            continue;
        }
        let Some((k, _)) = line.split_once('=') else {
            continue;
        };
        let k = k.trim().trim_matches('"');
        let full = if current.is_empty() {
            k.to_string()
        } else {
            format!("{current}.{k}")
        };
        if full == key || (current == table && k == leaf) {
            return Some(i + 1);
        }
    }
    table_line
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINI: &str = r#"
name = "mini"
[model.mlp]
input = 4
hidden = [8]
output = 2

[training]
batch_size = 8
micro_batch_size = 4
epochs = 2
steps_per_epoch = 3
"#;

    #[test]
    fn the_compute_capability_defaults_to_the_h100s_and_a_bad_one_is_named() {
        let p = Plan::from_toml_str(MINI).unwrap();
        assert_eq!(p.device.capability(), (9, 0));
        let p = Plan::from_toml_str(&format!("{MINI}[device]\ncompute_capability = \"8.6\"\n"))
            .unwrap();
        assert_eq!(p.device.capability(), (8, 6));
        let e = Plan::from_toml_str(&format!("{MINI}[device]\ncompute_capability = \"sm90\"\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("device.compute_capability"), "{e}");
        assert_eq!(parse_capability("10.0"), Some((10, 0)));
        assert_eq!(parse_capability("9"), None);
    }

    #[test]
    fn what_a_pytorch_model_s_code_does_is_checked_and_refused_on_burn() {
        let plan = |head: &str, keys: &str| {
            Plan::from_toml_str(&format!(
                "{head}\nname = \"t\"\n[model.transformer]\nlayers = 2\nhidden = 64\n\
                 heads = 4\nseq_len = 32\nvocab = 100\n{keys}\n[training]\nbatch_size = 2\n"
            ))
        };
        let keys = "attention_dropout = 0.0\nsliding_window = 16\nglobal_every = 2\n\
                    materialized_mask = true\nalibi = true\nkv_cache = false\n";
        let p = plan("", keys).expect("a PyTorch plan takes them");
        let ModelSpec::Transformer(t) = &p.model else {
            panic!("a transformer");
        };
        assert!(t.masked_attention(0) && t.alibi && !t.keeps_kv_cache());
        // written back as given
        let text = p.to_toml().unwrap();
        assert!(text.contains("sliding_window = 16"), "{text}");
        for (keys, says) in [
            ("attention_dropout = 1.5\n", "attention_dropout"),
            ("sliding_window = 0\n", "sliding_window"),
            ("global_every = 0\n", "global_every"),
        ] {
            let e = plan("", keys).unwrap_err().to_string();
            assert!(e.contains(says), "{keys}: {e}");
        }
        for key in [
            "partial_rotary = true",
            "repeat_kv = false",
            "softmax_f32 = true",
        ] {
            let e = plan("framework = \"burn\"", key).unwrap_err().to_string();
            assert!(e.contains("pytorch"), "{key}: {e}");
        }
    }

    #[test]
    fn cubecl_device_settings_need_burn_on_a_gpu_and_a_power_of_two() {
        let plan = |head: &str, device: &str| {
            Plan::from_toml_str(&format!(
                "{head}\n{MINI}[device]\nkind = \"cuda\"\n{device}"
            ))
        };
        let p = plan(
            "framework = \"burn\"",
            "fusion = true\nalignment = \"32\"\n",
        )
        .unwrap();
        assert!(p.device.fusion);
        assert_eq!(p.device.alignment, Some(ByteSize(32)));
        let text = p.to_toml().unwrap();
        assert!(text.contains("fusion = true"), "{text}");
        // absent, they are not written
        let p = plan("framework = \"burn\"", "").unwrap();
        assert!(!p.to_toml().unwrap().contains("fusion"));
        for (head, device, says) in [
            ("", "fusion = true\n", "device.fusion"),
            ("", "alignment = \"32\"\n", "device.alignment"),
            (
                "framework = \"burn\"",
                "alignment = \"48\"\n",
                "power of two",
            ),
        ] {
            let e = plan(head, device).unwrap_err().to_string();
            assert!(e.contains(says), "{device}: {e}");
        }
        let cpu = format!("framework = \"burn\"\n{MINI}[device]\nkind = \"cpu\"\nfusion = true\n");
        let e = Plan::from_toml_str(&cpu).unwrap_err().to_string();
        assert!(e.contains("cubecl"), "{e}");
    }

    #[test]
    fn a_lora_table_parses_and_bad_adapters_are_named() {
        let plan = |lora: &str| {
            Plan::from_toml_str(&format!(
                "[model.transformer]\nlayers = 2\nhidden = 64\nheads = 4\nseq_len = 16\n\
                 vocab = 100\n[model.transformer.lora]\n{lora}"
            ))
        };
        let p = plan("rank = 8\nalpha = 16.0\ntargets = [\"q\", \"v\", \"down\"]\n").unwrap();
        let ModelSpec::Transformer(t) = &p.model else {
            panic!("a transformer");
        };
        let lora = t.lora.as_ref().expect("lora");
        assert_eq!(lora.rank, 8);
        assert_eq!(
            lora.targets,
            vec![LoraTarget::Q, LoraTarget::V, LoraTarget::Down]
        );
        // the default targets are q and v
        let p = plan("rank = 4\n").unwrap();
        let ModelSpec::Transformer(t) = &p.model else {
            panic!("a transformer");
        };
        assert_eq!(t.lora, Some(LoraSpec::new(4)));
        for (bad, says) in [
            ("rank = 0\n", "rank"),
            ("rank = 8\ntargets = [\"qkv\", \"q\"]\n", "qkv"),
            ("rank = 8\ntargets = [\"gate\"]\n", "gated"),
            ("rank = 8\ntargets = [\"v\", \"v\"]\n", "twice"),
            ("rank = 8\ndropout = 1.5\n", "dropout"),
        ] {
            let e = plan(bad).unwrap_err().to_string();
            assert!(
                e.contains("model.transformer.lora") && e.contains(says),
                "{bad}: {e}"
            );
        }
        assert!(plan("rank = 8\ntargets = [\"attn\"]\n").is_err());
    }

    #[test]
    fn parses_a_small_plan_with_defaults() {
        let p = Plan::from_toml_str(MINI).unwrap();
        assert_eq!(p.micro_batch_size(), 4);
        assert_eq!(p.accumulation_steps(), 2);
        assert_eq!(p.total_steps(), 6);
        assert_eq!(p.optimizer.kind, OptimizerKind::Adam);
        assert!(matches!(p.model, ModelSpec::Mlp(ref m) if m.hidden == vec![8]));
        let again = Plan::from_toml_str(&p.to_toml().unwrap()).unwrap();
        assert_eq!(again, p);
    }

    #[test]
    fn unknown_key_names_key_and_line() {
        let text = MINI.replace("epochs = 2", "epochs = 2\nepoch_count = 3");
        let e = Plan::parse(&text, "x.toml").unwrap_err().to_string();
        assert!(e.contains("epoch_count"), "{e}");
        assert!(e.contains("line 12"), "{e}");
        assert!(e.starts_with("x.toml"), "{e}");
    }

    #[test]
    fn unknown_model_key_is_located() {
        let text = MINI.replace("output = 2", "output = 2\nwidth = 3");
        let e = Plan::from_toml_str(&text).unwrap_err().to_string();
        assert!(e.contains("width") && e.contains("line 7"), "{e}");
    }

    #[test]
    fn inconsistent_values_name_key_and_line() {
        let text = MINI.replace("micro_batch_size = 4", "micro_batch_size = 3");
        let e = Plan::parse(&text, "p.toml").unwrap_err();
        match &e {
            PlanError::Invalid { key, line, .. } => {
                assert_eq!(key, "training.micro_batch_size");
                assert_eq!(*line, Some(10));
            }
            other => panic!("{other}"),
        }
        assert!(
            e.to_string()
                .starts_with("p.toml:10: `training.micro_batch_size`: 3 does not divide")
        );
    }

    #[test]
    fn zero_stage_and_byte_sizes() {
        let text = format!("{MINI}\n[parallel]\nworld_size = 1\nzero_stage = 2\n");
        let e = Plan::from_toml_str(&text).unwrap_err().to_string();
        assert!(e.contains("parallel.zero_stage"), "{e}");
        let text = format!("{MINI}\n[device]\ncapacity = \"24GiB\"\n");
        assert_eq!(
            Plan::from_toml_str(&text).unwrap().device.capacity.0,
            24 << 30
        );
        let text = format!("{MINI}\n[device]\ncapacity = \"24 parsecs\"\n");
        let e = Plan::from_toml_str(&text).unwrap_err().to_string();
        assert!(e.contains("parsecs") && e.contains("line"), "{e}");
    }

    #[test]
    fn autocast_is_a_half_dtype_over_f32_parameters() {
        let p =
            Plan::from_toml_str(&format!("{MINI}\n[precision]\nautocast = \"bf16\"\n")).unwrap();
        assert_eq!(p.precision.autocast, Some(Dtype::Bf16));
        assert_eq!(p.precision.compute, Dtype::F32);
        let again = Plan::from_toml_str(&p.to_toml().unwrap()).unwrap();
        assert_eq!(again, p);
        let text = format!("{MINI}\n[precision]\ncompute = \"bf16\"\nautocast = \"bf16\"\n");
        let e = Plan::from_toml_str(&text).unwrap_err().to_string();
        assert!(e.contains("precision.autocast") && e.contains("f32"), "{e}");
        let text = format!("{MINI}\n[precision]\nautocast = \"f32\"\n");
        let e = Plan::from_toml_str(&text).unwrap_err().to_string();
        assert!(e.contains("half-precision"), "{e}");
        let text = format!("framework = \"burn\"\n{MINI}\n[precision]\nautocast = \"bf16\"\n");
        let e = Plan::from_toml_str(&text).unwrap_err().to_string();
        assert!(e.contains("PyTorch"), "{e}");
    }

    #[test]
    fn adamw8bit_is_a_pytorch_optimizer_with_its_own_state_dtypes() {
        let p =
            Plan::from_toml_str(&format!("{MINI}\n[optimizer]\nkind = \"adamw8bit\"\n")).unwrap();
        assert_eq!(p.optimizer.kind, OptimizerKind::AdamW8bit);
        let again = Plan::from_toml_str(&p.to_toml().unwrap()).unwrap();
        assert_eq!(again, p);
        for (extra, key) in [
            ("state_dtype = \"bf16\"\n", "optimizer.state_dtype"),
            ("implementation = \"foreach\"\n", "for_loop"),
        ] {
            let text = format!("{MINI}\n[optimizer]\nkind = \"adamw8bit\"\n{extra}");
            let e = Plan::from_toml_str(&text).unwrap_err().to_string();
            assert!(e.contains(key), "{e}");
        }
        let text = format!("framework = \"burn\"\n{MINI}\n[optimizer]\nkind = \"adamw8bit\"\n");
        let e = Plan::from_toml_str(&text).unwrap_err().to_string();
        assert!(e.contains("pytorch"), "{e}");
    }

    #[test]
    fn the_cuda_context_defaults_to_the_measured_h100_figure_and_is_zero_on_a_cpu() {
        let p = Plan::from_toml_str(MINI).unwrap();
        assert_eq!(p.device.context_bytes(), DEFAULT_CUDA_CONTEXT.0);
        let text = format!("{MINI}\n[device]\nkind = \"cpu\"\n");
        assert_eq!(
            Plan::from_toml_str(&text).unwrap().device.context_bytes(),
            0
        );
        let text = format!("{MINI}\n[device]\ncontext = \"300MiB\"\n");
        let p = Plan::from_toml_str(&text).unwrap();
        assert_eq!(p.device.context_bytes(), 300 << 20);
        assert_eq!(Plan::from_toml_str(&p.to_toml().unwrap()).unwrap(), p);
    }

    #[test]
    fn locate_key_handles_tables_and_dotted_keys() {
        let src = "a = 1\n[training]\nbatch_size = 3\n[model.transformer]\nheads = 5\n";
        assert_eq!(locate_key(src, "training.batch_size"), Some(3));
        assert_eq!(locate_key(src, "model.transformer.heads"), Some(5));
        assert_eq!(locate_key(src, "model.transformer.hidden"), Some(4));
        assert_eq!(locate_key(src, "a"), Some(1));
        assert_eq!(locate_key(src, "nope.x"), None);
    }

    /// The error of a plan that `toml` describes (which must be refused).
    fn refused(toml: &str) -> String {
        Plan::from_toml_str(toml).expect_err("refused").to_string()
    }

    /// A transformer plan with `extra` keys in its model and `training` as given.
    fn transformer(model: &str, training: &str) -> String {
        format!("[model.transformer]\nlayers = 1\nvocab = 100\n{model}\n[training]\n{training}\n")
    }

    #[test]
    fn widths_that_overflow_64_bits_are_refused_naming_the_key() {
        let cases = [
            (
                "hidden = 8\nheads = 8\nhead_dim = 4611686018427387904\nseq_len = 1",
                "model.transformer.heads",
                "the query width: 8 heads × head size 4611686018427387904",
            ),
            (
                "hidden = 4611686018427387904\nheads = 1\nseq_len = 1",
                "model.transformer.hidden",
                "the default feed-forward size: 4 × hidden 4611686018427387904",
            ),
            (
                "hidden = 8\nheads = 1\nffn = 9223372036854775808\ngated_ffn = true\n\
                 fused_gate_up = true\nseq_len = 1",
                "model.transformer.ffn",
                "the packed gate and input width: 2 × 9223372036854775808",
            ),
            (
                "hidden = 6148914691236517206\nheads = 1\nffn = 1\nseq_len = 1",
                "model.transformer.heads",
                "the packed projection's width",
            ),
            (
                "hidden = 64\nheads = 4\nseq_len = 1\n[model.transformer.lora]\n\
                 rank = 1152921504606846976\ntargets = [\"q\"]",
                "model.transformer.lora.rank",
                "the adapter of rank 1152921504606846976 on `q`",
            ),
        ];
        for (model, key, says) in cases {
            let e = refused(&transformer(model, "batch_size = 1"));
            assert!(e.contains(key) && e.contains(says), "{e}");
        }
    }

    #[test]
    fn inputs_that_overflow_64_bits_of_bytes_are_refused_naming_the_batch() {
        // 2³⁰ tokens a sample (and as many targets): 2³⁴ bytes at 8 an id; 2³⁰ samples more
        let e = refused(&transformer(
            "hidden = 8\nheads = 1\nseq_len = 1073741824",
            "batch_size = 1073741824\nsteps_per_epoch = 1",
        ));
        assert!(
            e.contains("training.batch_size")
                && e.contains(
                    "a micro-batch of 1073741824 samples of up to 17179869184 input bytes"
                ),
            "{e}"
        );
        let e = refused(&transformer(
            "hidden = 8\nheads = 1\nseq_len = 1073741824",
            "batch_size = 1\nsteps_per_epoch = 1\n[data]\nsamples = 1073741824",
        ));
        assert!(
            e.contains("data.samples") && e.contains("the data set of"),
            "{e}"
        );
        let e = refused(&transformer(
            "hidden = 8\nheads = 1\nseq_len = 9223372036854775807",
            "batch_size = 1",
        ));
        assert!(e.contains("model.transformer.seq_len"), "{e}");
        // the same tokens in a micro-batch of 2²⁰ fit
        Plan::from_toml_str(&transformer(
            "hidden = 8\nheads = 1\nseq_len = 1073741824",
            "batch_size = 1048576\nsteps_per_epoch = 1",
        ))
        .expect("fits 64 bits");
    }

    #[test]
    fn shapes_that_overflow_64_bits_are_refused_naming_the_layer() {
        let cnn = |image: &str, layers: &str| {
            format!(
                "[model.cnn]\nimage = {image}\nclasses = 2\n{layers}\n[training]\nbatch_size = 1\n"
            )
        };
        let e = refused(&cnn("[3, 4294967296, 4294967296]\nlayers = []", ""));
        assert!(e.contains("the image 3×4294967296×4294967296"), "{e}");
        let e = refused(&cnn(
            "[1, 1073741824, 1073741824]",
            "[[model.cnn.layers]]\nop = \"conv\"\nout = 64\nkernel = 1",
        ));
        assert!(
            e.contains("layer 0 (Conv)") && e.contains("more elements"),
            "{e}"
        );
        let e = refused(&cnn(
            "[1, 8, 8]",
            "[[model.cnn.layers]]\nop = \"max_pool\"\nkernel = 2\n\
             padding = 9223372036854775807",
        ));
        assert!(
            e.contains("padded by 9223372036854775807") && e.contains("overflows"),
            "{e}"
        );
        let e = refused(
            "[model.layers]\ninput = [4294967296, 4294967296]\nloss = \"mse\"\n\
             [[model.layers.layers]]\nop = \"relu\"\n[training]\nbatch_size = 1\n",
        );
        assert!(e.contains("`input` [4294967296, 4294967296]"), "{e}");
        let e = refused(
            "[model.layers]\ninput = [4]\nloss = \"mse\"\n[[model.layers.layers]]\n\
             op = \"linear\"\nout = [4294967296, 4294967296]\nparams = [4]\n\
             [training]\nbatch_size = 1\n",
        );
        assert!(e.contains("layer 0: `out` [4294967296, 4294967296]"), "{e}");
    }

    /// A loader the loader crate would refuse is refused in the plan, by key, before any
    /// simulation multiplies its counts (4·10⁹ workers with a prefetch of 4·10⁹ once
    /// overflowed the host model).
    #[test]
    fn absurd_loader_counts_are_refused_by_key() {
        let with = |workers: u64, prefetch: u64| {
            let mut p = Plan::from_toml_str(MINI).expect("mini");
            p.loader.workers = workers;
            p.loader.prefetch_factor = prefetch;
            p.validate().map_err(|e| e.to_string())
        };
        let e = with(4_000_000_000, 4_000_000_000).unwrap_err();
        assert!(e.contains("loader.workers"), "{e}");
        let e = with(4, 1 << 19).unwrap_err();
        assert!(
            e.contains("loader.prefetch_factor") && e.contains("1048576 batches in flight"),
            "{e}"
        );
        assert!(with(4, 1 << 18).is_ok());
        assert!(with(LOADER_MAX_WORKERS, 1).is_ok());
    }
}
