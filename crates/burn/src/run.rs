//! A real, measured burn training run driven by a plan.
//!
//! [`run_measured`] trains the plan's model on a burn backend (Flex on the CPU by default, CUDA
//! with the `cuda` feature) and samples memory with a [`Probe`](crate::Probe) at every phase boundary. The
//! training thread carries a category tag the counting allocator reads:
//!
//! | phase | tag |
//! |---|---|
//! | building the model (parameters materialised eagerly unless `lazy_parameters`) | `parameter` |
//! | pulling a batch and moving it to the device | `input` |
//! | forward pass and loss | `activation` |
//! | backward pass (gradients, and the graph's frees) | `gradient` |
//! | optimizer step | `optimizer_state` |
//! | checkpoint serialisation | `temporary` |
//! | everything else (metrics, bookkeeping) | `other` |
//!
//! Bytes are attributed **at allocation time** and released from the category they were
//! allocated under, whoever frees them. On a CPU backend the backward pass both frees the
//! activations saved by forward (they leave `activation`) and allocates gradients (they join
//! `gradient`); temporaries made and dropped inside backward cancel out. A buffer keeps its
//! tag for life: see the crate docs (`burn_facts`) for where that shows (momentum's first
//! velocity is the gradient buffer itself, so it stays under `gradient`).
//!
//! Plan knobs honoured: model, batch and micro-batch (accumulation through burn-optim's
//! `GradientsAccumulator`), epochs, steps per epoch, max steps, the data set size and the
//! loader (trainmem-loader over the fixture: workers, prefetch factor, persistent workers,
//! drop_last, `pin_memory` — page-locked staging buffers whose bytes and pin status are in
//! [`MeasuredRun::loader_memory`], [`MeasuredRun::loader_peak`] and
//! [`MeasuredRun::staging_pinned`]), `data.storage` (`mmap`: the files are mapped and show as
//! RssFile as the epoch touches them; `preload`: read into heap memory under `input` before
//! the `start` sample, RssAnon), `data.augmentation_scratch` and `data.size_variation` (the
//! workers resize every sample through scratch of about `augmentation_scratch × (1 ±
//! size_variation)` × the sample's bytes, the factor drawn per batch, held until the batch is
//! built, so a busy worker holds about `augmentation_scratch × batch bytes`; batches keep the
//! model's input shape; see [`crate::data::augmentation`]), optimizer kind (`sgd`,
//! `momentum`, `adam`, `adamw`, amsgrad), gradient checkpointing (burn's
//! `BalancedCheckpointing` for any policy other than `none`), half precision (`f16`/`bf16`
//! parameters and inputs, where the backend supports the dtype), checkpoint saving through
//! burn's `BinFileRecorder` (full precision) into the run's work directory, metric retention
//! (scalars vs tensors), output retention (the leak: outputs kept across steps, with their
//! graph when `retain_graph`), `empty_cache` (`Backend::memory_cleanup`). Knobs burn cannot
//! express (eager optimizer state, f32 master weights, gradients kept between steps,
//! data/pipeline parallelism, a streamed data set, `size_variation` without
//! `augmentation_scratch` (batches keep the model's shape), augmentation of token models,
//! a raw `layers` model) are refused with [`BurnRunError::Unsupported`], never silently
//! ignored.
//!
//! Run options beyond the plan: [`RunOptions::lazy_parameters`] leaves burn's lazy
//! parameters to be created at the first forward (then tagged `activation`, the phase that
//! allocates them), and [`RunOptions::trace_allocations`] records every host allocation and
//! free above a size from the `start` to the `end` sample ([`MeasuredRun::allocation_trace`],
//! trainmem-probe's allocation-free recorder) for replaying the real sizes through a
//! caching-allocator model.
//!
//! Each run trains on a thread of its own (joined before the run returns) and runs one at a
//! time per process, because the counting allocator's counters are process-wide.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::Mutex;

use trainmem_core::plan::{CheckpointPolicyKind, Dtype, Plan, StateAllocation};
use trainmem_core::timeline::Timeline;
use trainmem_loader::LoaderMemory;
use trainmem_probe::TraceEvent;

use crate::BurnRunError;
use crate::data::BatchSource;
use crate::probe::ProbeSample;
use trainmem_track::{MemoryBackend, TrackableBackend, Tracked};

/// Which burn backend a run trains on: the one name for a backend choice everywhere in
/// trainmem (arguments, requests to child processes, recorded reports).
///
/// Written and read as `flex`, `cuda` or `wgpu`. Choosing a device backend in a build without
/// its feature is allowed; a run on it fails with [`BurnRunError::Unsupported`].
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum BackendChoice {
    /// burn's Flex CPU backend (always available).
    #[default]
    Flex,
    /// burn's CUDA backend on device 0 (feature `cuda`; fails at run time without a GPU).
    Cuda,
    /// burn's wgpu backend on its default device (feature `wgpu`): Vulkan, Metal or DirectX
    /// 12, and on a machine with no GPU a software Vulkan (Mesa's lavapipe), which runs burn's
    /// cubecl code, pools and fusion for real on the CPU.
    Wgpu,
}

impl BackendChoice {
    /// Every choice, in the order `--help` lists them.
    pub const ALL: [BackendChoice; 3] = [
        BackendChoice::Flex,
        BackendChoice::Cuda,
        BackendChoice::Wgpu,
    ];

    /// The name written and read (`flex`, `cuda`, `wgpu`).
    pub fn name(self) -> &'static str {
        match self {
            BackendChoice::Flex => "flex",
            BackendChoice::Cuda => "cuda",
            BackendChoice::Wgpu => "wgpu",
        }
    }

    /// Whether the backend keeps tensors in device memory (a GPU's, or a software device's),
    /// beside the host memory of the program.
    pub fn on_device(self) -> bool {
        !matches!(self, BackendChoice::Flex)
    }
}

impl std::fmt::Display for BackendChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for BackendChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        BackendChoice::ALL
            .into_iter()
            .find(|b| b.name() == s)
            .ok_or_else(|| format!("unknown backend `{s}`: expected `flex`, `cuda` or `wgpu`"))
    }
}

/// Where a run is, for a progress bar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Optimizer steps finished.
    pub step: u64,
    /// Optimizer steps in the run.
    pub total_steps: u64,
    /// Current epoch (0-based).
    pub epoch: u64,
}

/// How to run a plan for real (what the plan itself does not say).
pub struct RunOptions<'a> {
    /// The backend.
    pub backend: BackendChoice,
    /// Directory for checkpoints (and any generated files), created if missing and kept;
    /// when `None`, a fresh directory of the run's own under the system temporary directory,
    /// removed with what the run wrote there when the run ends.
    pub work_dir: Option<PathBuf>,
    /// Learning rate of every optimizer.
    pub learning_rate: f64,
    /// Called after every optimizer step.
    pub progress: Option<&'a mut (dyn FnMut(Progress) + Send)>,
    /// The batch source. When `None`, vector and image models read a memory-mapped fixture
    /// data set through trainmem-loader ([`FixtureData`](crate::data::FixtureData), generated on first use in the work
    /// directory), and token models read a [`SyntheticSource`](crate::SyntheticSource) seeded from the plan.
    pub source: Option<Box<dyn BatchSource + Send + 'a>>,
    /// Leave burn's lazily initialised parameters alone at model construction (default
    /// `false`: every parameter is materialised under `parameter` before the `model_init`
    /// sample). When `true`, a parameter is created when first read, which is inside the
    /// first forward pass, and its bytes are then tagged as that phase's (`activation`):
    /// allocation-time tags are kept honest. With half precision the cast reads (and so
    /// creates) every parameter at construction anyway.
    pub lazy_parameters: bool,
    /// Record every host allocation and free of at least this many bytes made through the
    /// counting allocator from the `start` sample to the `end` sample
    /// ([`MeasuredRun::allocation_trace`]); `None` (default) records nothing. Needs the
    /// counting allocator installed (otherwise the trace is empty).
    pub trace_allocations: Option<u64>,
    /// Train under trainmem-track's [`Tracked`] layer (default `true`): every buffer the
    /// backend holds is counted under the category of the phase that created it, sampled into
    /// [`ProbeSample::tracked`] at every boundary; on a device backend (CUDA) these are the
    /// device bytes per category. `false` trains on the bare backend (the overhead bench's
    /// baseline).
    pub track_tensors: bool,
}

impl Default for RunOptions<'_> {
    fn default() -> Self {
        RunOptions {
            backend: BackendChoice::Flex,
            work_dir: None,
            learning_rate: 1e-3,
            progress: None,
            source: None,
            lazy_parameters: false,
            trace_allocations: None,
            track_tensors: true,
        }
    }
}

impl std::fmt::Debug for RunOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunOptions")
            .field("backend", &self.backend)
            .field("work_dir", &self.work_dir)
            .field("learning_rate", &self.learning_rate)
            .field("progress", &self.progress.is_some())
            .field("source", &self.source.is_some())
            .field("lazy_parameters", &self.lazy_parameters)
            .field("trace_allocations", &self.trace_allocations)
            .field("track_tensors", &self.track_tensors)
            .finish()
    }
}

/// Everything a measured run produced (serialisable, so a run made in a child process can be
/// sent back whole).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MeasuredRun {
    /// The shared timeline (source = measured).
    pub timeline: Timeline,
    /// The raw probe samples, with per-phase peaks and the full `/proc` breakdown.
    pub samples: Vec<ProbeSample>,
    /// Bytes of the model's parameters (element count × dtype size).
    pub parameter_bytes: u64,
    /// Whether host categories were measured (a counting allocator is installed).
    pub host_counted: bool,
    /// Checkpoint files written (gone with the run's own temporary directory when
    /// [`RunOptions::work_dir`] was `None`; their sizes are in `checkpoint_sizes`).
    pub checkpoints: Vec<PathBuf>,
    /// The size of each checkpoint file, in bytes, read right after it was written (index
    /// for index with `checkpoints`): what the run wrote, even once the files are gone (a
    /// run recorded on a lent machine and judged again elsewhere). Empty in runs recorded
    /// before it was kept.
    #[serde(default)]
    pub checkpoint_sizes: Vec<u64>,
    /// Loader worker threads started during the run (`None` when no loader was used).
    pub loader_threads_spawned: Option<u64>,
    /// trainmem-loader's own accounting ([`LoaderMemory`]) read at every sample, index for
    /// index with `samples`; empty when no loader was used. Its `staging` and
    /// `staging_pinned` terms are the staging pool (with `loader.pin_memory`), `scratch` the
    /// augmentation scratch of batches being built at that instant.
    pub loader_memory: Vec<LoaderMemory>,
    /// The largest value each loader term reached during the run (`None` without a loader).
    pub loader_peak: Option<LoaderMemory>,
    /// With `loader.pin_memory`: `Some(true)` when every staging buffer was page-locked,
    /// `Some(false)` when at least one `mlock` failed (for example under a low
    /// `RLIMIT_MEMLOCK`): the loader then used that buffer unpinned and counted it in
    /// `pin_failures`. `None` without `pin_memory` or without a loader.
    pub staging_pinned: Option<bool>,
    /// Bytes of the data set read into memory at start (`data.storage = "preload"`; 0 when
    /// memory-mapped). They are heap bytes under `input`.
    pub preloaded_bytes: u64,
    /// Parameters still uninitialised (lazy) at the `model_init` sample: 0 unless
    /// [`RunOptions::lazy_parameters`] is set and burn deferred them.
    pub lazy_parameters_at_init: usize,
    /// With [`RunOptions::trace_allocations`]: every traced allocation and free, of every
    /// thread (training thread and loader workers; filter on
    /// [`TraceEvent::thread`] with [`Self::training_thread`]), in the order they happened.
    pub allocation_trace: Vec<TraceEvent>,
    /// Trace events lost because the trace buffer
    /// ([`trainmem_probe::TRACE_CAPACITY`] events) was full.
    pub allocation_trace_dropped: u64,
    /// The training thread's [`trainmem_probe::trace_thread_id`].
    pub training_thread: u64,
}

/// The counters of the counting allocator are process-wide, so measured runs in one process
/// take turns.
static RUN_LOCK: Mutex<()> = Mutex::new(());

/// Trains `plan` for real and returns the measured timeline.
pub fn run_measured(plan: &Plan, opts: RunOptions<'_>) -> Result<Timeline, BurnRunError> {
    Ok(run_measured_detailed(plan, opts)?.timeline)
}

/// Trains `plan` for real and returns the timeline with the raw samples.
pub fn run_measured_detailed(
    plan: &Plan,
    opts: RunOptions<'_>,
) -> Result<MeasuredRun, BurnRunError> {
    check_supported(plan)?;
    let _turn = RUN_LOCK
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    // What the process holds before the run builds anything: the run's own zero.
    let baseline = crate::timeline::host_now();
    // The run trains on a thread of its own, joined before the lock is released: memory the
    // thread keeps for its lifetime (kernel scratch, thread-locals) is freed when it exits,
    // inside this call, never in the middle of the next run's measurements.
    let mut run = std::thread::scope(|scope| {
        let worker = std::thread::Builder::new()
            .name("trainmem-burn-run".into())
            .stack_size(8 << 20)
            .spawn_scoped(scope, move || train_on_backend(plan, opts))
            .map_err(|e| BurnRunError::Backend(format!("cannot start the training thread: {e}")))?;
        match worker.join() {
            Ok(result) => result,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })?;
    run.timeline.meta.baseline = Some(baseline);
    Ok(run)
}

fn train_on_backend(plan: &Plan, opts: RunOptions<'_>) -> Result<MeasuredRun, BurnRunError> {
    match opts.backend {
        BackendChoice::Flex => train_on::<burn::backend::Flex>(
            plan,
            opts,
            burn::backend::flex::FlexDevice,
            "burn 0.21.0 flex",
        ),
        #[cfg(feature = "cuda")]
        BackendChoice::Cuda => train_on::<burn::backend::Cuda>(
            plan,
            opts,
            burn::backend::cuda::CudaDevice { index: 0 },
            "burn 0.21.0 cuda",
        ),
        #[cfg(not(feature = "cuda"))]
        BackendChoice::Cuda => Err(BurnRunError::Unsupported(
            "the CUDA backend: this build has no `cuda` feature".into(),
        )),
        #[cfg(feature = "wgpu")]
        BackendChoice::Wgpu => train_on::<burn::backend::Wgpu>(
            plan,
            opts,
            burn::backend::wgpu::WgpuDevice::DefaultDevice,
            "burn 0.21.0 wgpu",
        ),
        #[cfg(not(feature = "wgpu"))]
        BackendChoice::Wgpu => Err(BurnRunError::Unsupported(
            "the wgpu backend: this build has no `wgpu` feature".into(),
        )),
    }
}

/// Whether burn's `backend` can train in `dtype` here, where that can be told without starting
/// a device context in this process: Flex; wgpu's bf16, which it never has (burn 0.21's wgpu
/// backend compiles to WGSL, which has no bf16 type: known without an adapter, so a recorded
/// wgpu run is judged again the same way anywhere); wgpu's other dtypes where this build has
/// the backend and an adapter is found. `None` otherwise (CUDA, which would start a context). A
/// run in a dtype its backend lacks fails with [`BurnRunError::Unsupported`] whatever this
/// says.
pub fn supports_dtype(backend: BackendChoice, dtype: trainmem_core::Dtype) -> Option<bool> {
    use burn::tensor::backend::Backend;
    let dtype: burn::tensor::DType = crate::train::float_dtype(dtype)?.into();
    match backend {
        BackendChoice::Flex => Some(<burn::backend::Flex as Backend>::supports_dtype(
            &burn::backend::flex::FlexDevice,
            dtype,
        )),
        BackendChoice::Wgpu if dtype == burn::tensor::DType::BF16 => Some(false),
        #[cfg(feature = "wgpu")]
        BackendChoice::Wgpu => trainmem_track::wgpu::adapter().ok().map(|_| {
            <burn::backend::Wgpu as Backend>::supports_dtype(
                &burn::backend::wgpu::WgpuDevice::DefaultDevice,
                dtype,
            )
        }),
        _ => None,
    }
}

/// Trains `plan` on a backend the caller chooses (one outside [`BackendChoice`], such as
/// trainmem-meta's), under autodiff, with the same loop and probes as every measured run;
/// `producer` names the backend in the timeline. Runs on the calling thread.
pub fn run_on_backend<B: MemoryBackend + TrackableBackend>(
    plan: &Plan,
    opts: RunOptions<'_>,
    device: B::Device,
    producer: &str,
) -> Result<MeasuredRun, BurnRunError> {
    check_supported(plan)?;
    let _turn = RUN_LOCK
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    train_on::<B>(plan, opts, device, producer)
}

/// Trains `plan` on a backend that attributes its own tensors to categories (trainmem-meta's
/// `Meta`: no tracking layer on top) with the loop and probes every measured run uses. The
/// timeline is a prediction ([`Source::Simulated`](trainmem_core::Source::Simulated)), its
/// tensor bytes in the device domain; `producer` names the backend in it.
pub fn run_predicted<B: MemoryBackend + TrackableBackend>(
    plan: &Plan,
    opts: RunOptions<'_>,
    device: B::Device,
    producer: &str,
) -> Result<MeasuredRun, BurnRunError> {
    let opts = RunOptions {
        track_tensors: false,
        ..opts
    };
    let mut run = run_on_backend::<B>(plan, opts, device, producer)?;
    run.timeline.source = trainmem_core::Source::Simulated;
    Ok(run)
}

/// Trains on base backend `B` (under trainmem-track's [`Tracked`] layer unless
/// [`RunOptions::track_tensors`] is off) under autodiff.
fn train_on<B: MemoryBackend + TrackableBackend>(
    plan: &Plan,
    opts: RunOptions<'_>,
    device: B::Device,
    producer: &str,
) -> Result<MeasuredRun, BurnRunError> {
    if opts.track_tensors {
        train_autodiff::<Tracked<B>>(plan, opts, device, producer)
    } else {
        train_autodiff::<B>(plan, opts, device, producer)
    }
}

/// Trains on base backend `B` under autodiff, with burn's balanced checkpointing when the plan
/// asks for any checkpointing policy.
fn train_autodiff<B: MemoryBackend>(
    plan: &Plan,
    opts: RunOptions<'_>,
    device: B::Device,
    producer: &str,
) -> Result<MeasuredRun, BurnRunError> {
    use burn::backend::Autodiff;
    use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing;
    if plan.checkpointing.policy != CheckpointPolicyKind::None {
        let producer = format!("{producer} (balanced checkpointing)");
        crate::train::train::<Autodiff<B, BalancedCheckpointing>>(plan, opts, device, &producer)
    } else {
        crate::train::train::<Autodiff<B>>(plan, opts, device, producer)
    }
}

/// Refuses plan knobs a burn run cannot honour.
///
/// Plan values that describe rather than configure (the device capacity and allocator string,
/// the host baseline, `loader.worker_overhead`, `data.sample_bytes`) are the simulator's
/// business: a real run measures them instead.
fn check_supported(plan: &Plan) -> Result<(), BurnRunError> {
    let no = |m: &str| Err(BurnRunError::Unsupported(m.to_string()));
    if plan.optimizer.state == StateAllocation::Eager {
        return no("optimizer.state = \"eager\": burn-optim creates state at the first step");
    }
    if plan.optimizer.state_dtype != Dtype::F32 {
        return no(
            "optimizer.state_dtype other than f32: burn keeps state in the gradient's dtype",
        );
    }
    if !plan.training.grads_to_none {
        return no("training.grads_to_none = false: burn consumes gradients at every step");
    }
    if let trainmem_core::model::ModelSpec::Transformer(t) = &plan.model
        && (t.max_positions.is_some()
            || t.bias.is_some()
            || t.qkv_bias.is_some()
            || t.final_norm.is_some()
            || t.embedding_norm
            || t.token_types > 0
            || t.pooler)
    {
        return no(
            "a transformer with max_positions, bias, qkv_bias, final_norm, embedding_norm, \
             token_types or pooler set: the burn run builds burn-nn's transformer layout, \
             which has none of these settings",
        );
    }
    let activation = match &plan.model {
        trainmem_core::model::ModelSpec::Transformer(t) => Some(t.activation),
        trainmem_core::model::ModelSpec::Mlp(m) => Some(m.activation),
        _ => None,
    };
    if activation == Some(trainmem_core::model::Activation::GeluNew) {
        return no("activation = \"gelu_new\": burn has GELU as one op, not the composed form");
    }
    if plan.parallel.world_size != 1 || plan.parallel.pipeline_stages != 1 {
        return no("data or pipeline parallelism: a measured run trains on one device");
    }
    if plan.data.augmentation_scratch == 0.0 && plan.data.size_variation != 0.0 {
        return no(
            "data.size_variation without data.augmentation_scratch: the batch handed to the \
             model keeps the model's input shape, so only augmentation scratch varies in size",
        );
    }
    if plan.data.storage == trainmem_core::plan::DataStorage::Stream {
        return no(
            "data.storage = \"stream\": the measured run reads a memory-mapped or preloaded \
             fixture",
        );
    }
    match plan.precision.compute {
        Dtype::F32 => {}
        Dtype::F16 | Dtype::Bf16 => {
            if plan.precision.master_weights {
                return no(
                    "precision.master_weights = true: burn keeps no f32 master copy; set \
                     master_weights = false for a half-precision burn run",
                );
            }
        }
        other => {
            return Err(BurnRunError::Unsupported(format!(
                "precision.compute = {other}: the burn run trains in f32, f16 or bf16"
            )));
        }
    }
    if plan
        .precision
        .grads
        .is_some_and(|g| g != plan.precision.compute)
    {
        return no(
            "precision.grads different from compute: burn's gradients take the parameters' dtype",
        );
    }
    Ok(())
}

/// A run's work directory: the one its options name (kept), or a fresh one of its own under
/// the system temporary directory, removed with everything the run wrote there (the fixture
/// data set, checkpoints) when the run ends.
#[derive(Debug)]
pub(crate) struct WorkDir {
    path: PathBuf,
    owned: bool,
}

impl WorkDir {
    /// The directory.
    pub(crate) fn path(&self) -> &std::path::Path {
        &self.path
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if self.owned {
            // nothing to report to: a directory already gone is what was wanted
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// The run's work directory (created if missing; see [`WorkDir`]).
pub(crate) fn work_dir(opts: &RunOptions<'_>) -> Result<WorkDir, BurnRunError> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static RUNS: AtomicU64 = AtomicU64::new(0);
    let io = |path: &PathBuf, source| BurnRunError::Io {
        what: "creating work directory",
        path: path.clone(),
        source,
    };
    if let Some(d) = &opts.work_dir {
        std::fs::create_dir_all(d).map_err(|e| io(d, e))?;
        return Ok(WorkDir {
            path: d.clone(),
            owned: false,
        });
    }
    // a name no other run of this process has; one left by an earlier process that had the
    // same id is skipped, never written into
    loop {
        let path = std::env::temp_dir().join(format!(
            "trainmem-burn-{}-{}",
            std::process::id(),
            RUNS.fetch_add(1, Ordering::Relaxed)
        ));
        match std::fs::create_dir(&path) {
            Ok(()) => return Ok(WorkDir { path, owned: true }),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io(&path, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use trainmem_core::timeline::Phase;

    /// A 4 → 8 → 2 MLP, batch 4, two steps.
    fn base() -> Plan {
        let mut p = Plan::from_toml_str("[model.mlp]\ninput = 4\nhidden = [8]\noutput = 2\n")
            .expect("plan");
        p.training.batch_size = 4;
        p.training.steps_per_epoch = Some(2);
        p.validate().expect("valid");
        p
    }

    #[test]
    fn dtype_support_is_asked_only_where_no_device_starts() {
        // Flex trains in the three floats a plan names
        for d in [Dtype::F32, Dtype::F16, Dtype::Bf16] {
            assert_eq!(supports_dtype(BackendChoice::Flex, d), Some(true), "{d}");
        }
        // integers are not a training dtype
        assert_eq!(supports_dtype(BackendChoice::Flex, Dtype::I64), None);
        // CUDA is not asked: that would start a context in this process
        assert_eq!(supports_dtype(BackendChoice::Cuda, Dtype::Bf16), None);
        // wgpu's WGSL has no bf16, with or without an adapter
        assert_eq!(
            supports_dtype(BackendChoice::Wgpu, Dtype::Bf16),
            Some(false)
        );
        // `wgpu`, `cuda` and `flex` are written and read back
        for b in BackendChoice::ALL {
            assert_eq!(b.name().parse::<BackendChoice>(), Ok(b));
            assert_eq!(b.on_device(), b != BackendChoice::Flex);
        }
        assert!(
            "metal"
                .parse::<BackendChoice>()
                .unwrap_err()
                .contains("`wgpu`")
        );
    }

    #[test]
    fn refuses_knobs_burn_cannot_honour() {
        let mut p = base();
        p.optimizer.state = StateAllocation::Eager;
        assert!(
            matches!(check_supported(&p), Err(BurnRunError::Unsupported(m)) if m.contains("eager"))
        );
        let mut p = base();
        p.precision.compute = Dtype::F16;
        assert!(
            matches!(check_supported(&p), Err(BurnRunError::Unsupported(m)) if m.contains("master_weights"))
        );
        p.precision.master_weights = false;
        assert!(check_supported(&p).is_ok());
        let mut p = base();
        p.training.grads_to_none = false;
        assert!(check_supported(&p).is_err());
        let mut p = base();
        p.data.size_variation = 0.2;
        assert!(
            matches!(check_supported(&p), Err(BurnRunError::Unsupported(m)) if m.contains("size_variation"))
        );
        p.data.augmentation_scratch = 1.0;
        assert!(check_supported(&p).is_ok());
        let mut p = base();
        p.data.storage = trainmem_core::plan::DataStorage::Stream;
        assert!(
            matches!(check_supported(&p), Err(BurnRunError::Unsupported(m)) if m.contains("stream"))
        );
        p.data.storage = trainmem_core::plan::DataStorage::Preload;
        p.loader.pin_memory = true;
        assert!(check_supported(&p).is_ok());
        assert!(check_supported(&base()).is_ok());
    }

    #[test]
    fn a_tiny_run_produces_every_phase_in_order() {
        let p = base();
        let mut seen = Vec::new();
        let mut progress = |pr: Progress| seen.push(pr.step);
        let opts = RunOptions {
            progress: Some(&mut progress),
            ..RunOptions::default()
        };
        let run = run_measured_detailed(&p, opts).expect("run");
        assert_eq!(seen, vec![1, 2]);
        let phases: Vec<Phase> = run.samples.iter().map(|s| s.phase).collect();
        assert_eq!(phases[0], Phase::Start);
        assert_eq!(phases[1], Phase::ModelInit);
        assert_eq!(phases.last(), Some(&Phase::End));
        let steps = phases
            .iter()
            .filter(|p| **p == Phase::OptimizerStep)
            .count();
        assert_eq!(steps, 2);
        // 4*8 + 8 + 8*2 + 2 = 58 f32 parameters.
        assert_eq!(run.parameter_bytes, 58 * 4);
        assert_eq!(run.timeline.samples.len(), run.samples.len());
        // This unit-test binary has no counting allocator: host categories are unavailable,
        // not zero.
        assert!(!run.host_counted);
        assert!(run.samples.iter().all(|s| s.host.is_none()));
    }

    fn run_of(text: &str, tweak: impl FnOnce(&mut Plan)) -> MeasuredRun {
        let mut p = Plan::from_toml_str(text).expect("plan");
        p.training.batch_size = 4;
        p.training.steps_per_epoch = Some(2);
        p.data.samples = 8;
        tweak(&mut p);
        p.validate().expect("valid");
        run_measured_detailed(&p, RunOptions::default()).expect("run")
    }

    #[test]
    fn a_cnn_trains_from_its_spec() {
        let run = run_of(
            "[model.cnn]\nimage = [1, 8, 8]\nclasses = 3\nlayers = [\n  { op = \"conv\", out = 4, kernel = 3, padding = 1 },\n  { op = \"batch_norm\" },\n  { op = \"relu\" },\n  { op = \"max_pool\", kernel = 2 },\n  { op = \"flatten\" },\n]\n",
            |_| {},
        );
        // conv 1*4*3*3 + 4, batch norm 4 + 4 (gamma, beta) + 4 + 4 (running mean and
        // variance), head 4*4*4*3 + 3.
        assert_eq!(run.parameter_bytes, (36 + 4 + 8 + 8 + 192 + 3) * 4);
        assert_eq!(run.loader_threads_spawned, Some(0));
    }

    #[test]
    fn a_transformer_encoder_and_decoder_train_from_their_specs() {
        for kind in ["encoder", "decoder"] {
            let run = run_of(
                &format!(
                    "[model.transformer]\nkind = \"{kind}\"\nlayers = 1\nhidden = 8\nheads = 2\nseq_len = 5\nvocab = 11\n"
                ),
                |_| {},
            );
            // burn-nn's layout, counted by hand (hidden 8, feed-forward 4 × 8 = 32, vocab 11):
            // token embedding 11*8; one pre-norm block: query, key, value and output
            // projections 4 * (8*8 + 8), feed-forward 8*32 + 32 and 32*8 + 8, two LayerNorms
            // 2 * (8 + 8); no final norm; a linear head with bias to 2 classes (encoder) or to
            // the 11-token vocabulary (decoder). tests/tests/burn_measured.rs checks the same
            // figure against the simulator's lowering for more shapes.
            let block = 4 * (8 * 8 + 8) + (8 * 32 + 32) + (32 * 8 + 8) + 2 * (8 + 8);
            let head = if kind == "encoder" {
                8 * 2 + 2
            } else {
                8 * 11 + 11
            };
            assert_eq!(run.parameter_bytes, (11 * 8 + block + head) * 4, "{kind}");
            assert_eq!(
                run.loader_threads_spawned, None,
                "tokens come from the synthetic source"
            );
            let steps = run
                .samples
                .iter()
                .filter(|s| s.phase == Phase::OptimizerStep)
                .count();
            assert_eq!(steps, 2, "{kind}");
        }
    }

    #[test]
    fn accumulation_half_precision_checkpoints_and_checkpointing_run() {
        let dir = std::env::temp_dir().join(format!("trainmem-burn-unit-{}", std::process::id()));
        let mlp = "[model.mlp]\ninput = 4\nhidden = [8]\noutput = 2\n";
        let mut p = Plan::from_toml_str(mlp).expect("plan");
        p.training.batch_size = 4;
        p.training.grad_accumulation = Some(2);
        p.training.steps_per_epoch = Some(2);
        p.training.checkpoint_every = 1;
        p.data.samples = 8;
        p.precision.compute = Dtype::F16;
        p.precision.master_weights = false;
        p.checkpointing.policy = CheckpointPolicyKind::Sqrt;
        p.validate().expect("valid");
        let opts = RunOptions {
            work_dir: Some(dir.clone()),
            ..RunOptions::default()
        };
        let run = run_measured_detailed(&p, opts).expect("run");
        // f16 parameters: half of 58 f32 parameters.
        assert_eq!(run.parameter_bytes, 58 * 2);
        let micro: Vec<Option<u32>> = run
            .samples
            .iter()
            .filter(|s| s.phase == Phase::Backward)
            .map(|s| s.micro_batch)
            .collect();
        assert_eq!(micro, vec![Some(0), Some(1), Some(0), Some(1)]);
        assert_eq!(run.checkpoints.len(), 2);
        assert_eq!(run.checkpoint_sizes.len(), 2, "each file's size is kept");
        for (c, &size) in run.checkpoints.iter().zip(&run.checkpoint_sizes) {
            let on_disk = std::fs::metadata(c).expect("checkpoint written").len();
            assert!(on_disk > 0);
            assert_eq!(size, on_disk, "the kept size is the file's");
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    /// Without a work directory each run writes into one of its own and removes it when it
    /// ends: runs in tests, in `gpu-check` and in library callers once left a directory per
    /// process under the system temp dir, data set and checkpoints included, for good.
    #[test]
    fn a_run_without_a_work_directory_leaves_nothing_behind() {
        let mut p = base();
        p.training.checkpoint_every = 1;
        p.validate().expect("valid");
        let mut dirs = Vec::new();
        for _ in 0..2 {
            let run = run_measured_detailed(&p, RunOptions::default()).expect("run");
            assert_eq!(run.checkpoints.len(), 2);
            assert!(run.checkpoint_sizes.iter().all(|&b| b > 0));
            let dir = run.checkpoints[0].parent().expect("a folder").to_path_buf();
            assert!(dir.starts_with(std::env::temp_dir()), "{}", dir.display());
            assert!(!dir.exists(), "{} removed", dir.display());
            dirs.push(dir);
        }
        assert_ne!(dirs[0], dirs[1], "each run has its own");
    }
}
