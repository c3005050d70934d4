//! The twin against real PyTorch: recorded ledgers of PyTorch training runs and the
//! per-category comparison with the simulator's prediction of the same run.
//!
//! `validation/pytorch/record.py` trains real models on the CPU (where PyTorch allocates every
//! storage at its exact size) and writes one [`Recording`] per run under `fixtures/pytorch/`:
//! the model (a Hugging Face configuration, or a plan's model table), the batch, the
//! optimizer, and the live bytes per category at every phase boundary with the peak of all
//! live bytes in between. [`compare`] builds the plan of the same run (for Hugging Face models
//! through [`trainmem_core::hf_config`]), simulates it on a CPU device (exact allocations, no
//! caching allocator) and sets the peak of each category, and the total peak, beside the
//! recorded ones with the accuracy target of each.
//!
//! GPU recordings (`fixtures/pytorch-cuda/<device>/`) are simulated on a CUDA device of the
//! recorded memory and compute capability: their categories are set beside the tensors'
//! own bytes ([`crate::Summary::tensor_peaks`], what the ledger's `nbytes` counts), and the
//! allocator's peak allocated and reserved bytes beside the twin's, which count its blocks,
//! the BLAS library's workspaces and the model's buffers as PyTorch's allocator does.
//!
//! Fake-CUDA recordings (`fixtures/pytorch-fake-cuda/`, `record.py --device fake-cuda`) run
//! CUDA's dispatch on PyTorch's fake tensors on any machine: autocast's CUDA op lists, the
//! CUDA kernels' outputs and what autograd saves, for one forward pass (backward needs a
//! GPU), at any model size. They are compared on what a forward pass holds: parameters,
//! activations and the batch.

use std::path::Path;

use serde::Deserialize;
use trainmem_core::Category;
use trainmem_core::hf_config::{HfOptions, HfPrecision, lora_target_of_module, plan_from_hf};
use trainmem_core::model::LoraSpec;
use trainmem_core::optimizer::{OptimizerKind, StepImpl};

use crate::{SimOptions, Summary, simulate};
use trainmem_core::model::ModelSpec;
use trainmem_core::plan::{DeviceKind, Plan};

/// One recorded PyTorch run.
#[derive(Debug, Clone, Deserialize)]
pub struct Recording {
    /// The run's name (`gpt2-tiny-adamw`, ...).
    pub name: String,
    /// `sgd`, `adamw` or `adamw-for-loop`.
    pub optimizer: String,
    /// Samples per step.
    pub batch: u64,
    /// Samples per micro-batch under gradient accumulation (`None`: one micro-batch).
    #[serde(default)]
    pub micro_batch: Option<u64>,
    /// Whether Hugging Face's gradient checkpointing was on (every block).
    #[serde(default)]
    pub checkpointing: bool,
    /// Tokens per sample (0 for models without a sequence).
    pub seq: u64,
    /// Optimizer steps recorded.
    pub steps: u64,
    /// `sum(p.numel())` of the real model.
    pub parameters: u64,
    /// Library versions it was recorded with.
    pub versions: serde_json::Value,
    /// The Hugging Face configuration of the model, when it is one.
    #[serde(default)]
    pub hf_config: Option<serde_json::Value>,
    /// The plan's model table, when the model is not a Hugging Face one.
    #[serde(default)]
    pub plan_model: Option<serde_json::Value>,
    /// The `torch.autocast` region forward and the loss ran in, when they did.
    #[serde(default)]
    pub autocast: Option<AutocastRegion>,
    /// The GPU the run was recorded on (`record.py --device cuda`); `None`: the CPU.
    #[serde(default)]
    pub device: Option<RecordedDevice>,
    /// `transformers`' `attn_implementation` the model was built with, when named.
    #[serde(default)]
    pub attn_implementation: Option<String>,
    /// The dtype the model was cast to before training (`bfloat16`, `float16`: pure half
    /// precision, `model.to(dtype)`, no master weights), when it was.
    #[serde(default)]
    pub dtype: Option<String>,
    /// The LoRA adapters peft put on the model (its base frozen), when it did.
    #[serde(default)]
    pub lora: Option<RecordedLora>,
    /// Parameters with `requires_grad` (recorded for LoRA runs; otherwise all of them).
    #[serde(default)]
    pub trainable_parameters: Option<u64>,
    /// Phase-boundary samples.
    pub samples: Vec<LedgerSample>,
}

/// The GPU a run was recorded on.
#[derive(Debug, Clone, Deserialize)]
pub struct RecordedDevice {
    /// `cuda`.
    #[serde(rename = "type")]
    pub kind: String,
    /// `torch.cuda.get_device_properties(0).name`.
    pub name: String,
    /// Its memory, bytes.
    pub total_memory: u64,
    /// Its compute capability (`[major, minor]`), where recorded (older recordings: the
    /// plan's default, the H100's 9.0, which is the card they were made on).
    #[serde(default)]
    pub capability: Option<[u32; 2]>,
    /// How a fake-tensor recording stood in for the GPU (`record.py --device fake-cuda`:
    /// CUDA's dispatch on PyTorch's fake tensors, one forward pass); `None`: a real GPU.
    #[serde(default)]
    pub fake_tensors: Option<String>,
}

/// The caching allocator's figures at a phase boundary of a GPU run.
#[derive(Debug, Clone, Copy, Deserialize)]
pub struct CudaSample {
    /// `torch.cuda.memory_allocated()`.
    pub allocated: u64,
    /// `torch.cuda.memory_reserved()`.
    pub reserved: u64,
    /// `torch.cuda.max_memory_allocated()` since the previous sample.
    pub peak_allocated: u64,
    /// `torch.cuda.max_memory_reserved()` since the previous sample.
    pub peak_reserved: u64,
}

/// A recorded run's `torch.autocast` region.
#[derive(Debug, Clone, Deserialize)]
pub struct AutocastRegion {
    /// `cpu` (or `cuda`).
    pub device_type: String,
    /// `bfloat16` or `float16`.
    pub dtype: String,
}

/// The `LoraConfig` of a recorded run.
#[derive(Debug, Clone, Deserialize)]
pub struct RecordedLora {
    /// `r`.
    pub rank: u64,
    /// `lora_alpha`.
    pub alpha: f64,
    /// `lora_dropout`.
    pub dropout: f64,
    /// `target_modules`, as peft names them (`c_attn`, `q_proj`, ...).
    pub targets: Vec<String>,
}

/// Live bytes at one phase boundary of a recorded run.
#[derive(Debug, Clone, Deserialize)]
pub struct LedgerSample {
    /// The phase that just ended.
    pub phase: String,
    /// The optimizer step.
    pub step: u64,
    /// Live bytes per category (`parameter`, `gradient`, `optimizer_state`, `activation`,
    /// `input`, `temporary`).
    pub categories: std::collections::BTreeMap<String, u64>,
    /// All live bytes.
    pub total: u64,
    /// The highest total since the previous sample.
    pub peak_since_previous: u64,
    /// The caching allocator's figures (GPU runs).
    #[serde(default)]
    pub cuda: Option<CudaSample>,
}

/// Why a recording could not be compared.
#[derive(Debug, thiserror::Error)]
pub enum ValidationError {
    /// The file could not be read or parsed.
    #[error("{path}")]
    File {
        /// The file.
        path: String,
        /// The I/O or JSON error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The plan for the recorded run could not be made, or not simulated.
    #[error("{name}")]
    PlanFailed {
        /// The run.
        name: String,
        /// The error of the step that failed (the configuration reader, the plan's checks,
        /// the simulator).
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The recording describes a run no plan can be made for.
    #[error("{name}: {detail}")]
    Plan {
        /// The run.
        name: String,
        /// Why.
        detail: String,
    },
}

/// One line of the comparison: a category's peak (or the total peak), recorded and predicted.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// The category's name, or `total peak`.
    pub what: String,
    /// Recorded peak bytes.
    pub measured: u64,
    /// Predicted peak bytes.
    pub predicted: u64,
    /// The accuracy target (a fraction of the recorded peak).
    pub target: f64,
}

impl Row {
    /// (predicted − measured) / measured; 0 when both are 0.
    pub fn error(&self) -> f64 {
        if self.measured == 0 {
            return if self.predicted == 0 {
                0.0
            } else {
                f64::INFINITY
            };
        }
        (self.predicted as f64 - self.measured as f64) / self.measured as f64
    }

    /// Whether the prediction is within the target.
    pub fn within(&self) -> bool {
        self.error().abs() <= self.target
    }
}

/// A recorded run beside its prediction.
#[derive(Debug, Clone)]
pub struct Comparison {
    /// The run's name.
    pub name: String,
    /// The plan's parameter count, for the recorded one to be checked against.
    pub plan_parameters: u64,
    /// The recorded model's parameter count.
    pub parameters: u64,
    /// The plan's trainable parameter count.
    pub plan_trainable: u64,
    /// The recorded model's trainable parameter count.
    pub trainable: u64,
    /// One row per category with bytes, then the total peak.
    pub rows: Vec<Row>,
}

/// The targets: model state exact to 0.1%, activations and temporaries to 3%, the total peak
/// (and on a GPU the allocator's peak allocated bytes) to 2%, the GPU's peak reserved bytes to
/// 5%.
pub fn target(what: &str) -> f64 {
    match what {
        "parameter" | "gradient" | "optimizer_state" => 0.001,
        "total peak" | "peak allocated" => 0.02,
        "peak reserved" => 0.05,
        _ => 0.03,
    }
}

impl Recording {
    /// Whether the run was recorded on a GPU (or on fake tensors standing for one).
    pub fn on_cuda(&self) -> bool {
        self.device.as_ref().is_some_and(|d| d.kind == "cuda")
    }

    /// Whether the run was recorded on fake CUDA tensors (`record.py --device fake-cuda`).
    pub fn on_fake_cuda(&self) -> bool {
        self.device
            .as_ref()
            .is_some_and(|d| d.fake_tensors.is_some())
    }

    /// Whether the recording stops after the forward pass (a fake-tensor recording: PyTorch's
    /// autograd engine cannot run backward without a GPU). Only what a forward pass holds
    /// is compared then: parameters, activations and the batch.
    pub fn forward_only(&self) -> bool {
        !self.samples.iter().any(|s| s.phase == "backward")
    }
}

/// Reads a recording.
pub fn load(path: &Path) -> Result<Recording, ValidationError> {
    let err = |source: Box<dyn std::error::Error + Send + Sync>| ValidationError::File {
        path: path.display().to_string(),
        source,
    };
    let text = std::fs::read_to_string(path).map_err(|e| err(e.into()))?;
    serde_json::from_str(&text).map_err(|e| err(e.into()))
}

/// The recordings under `dir`: its `*.json` files and those of its folders one level down
/// (`fixtures/pytorch-cuda/<device>/`), sorted; none when `dir` does not exist.
pub fn ledger_paths(dir: &Path) -> Result<Vec<std::path::PathBuf>, ValidationError> {
    let err = |source: std::io::Error| ValidationError::File {
        path: dir.display().to_string(),
        source: source.into(),
    };
    if !dir.exists() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    let mut folders = vec![dir.to_path_buf()];
    for entry in std::fs::read_dir(dir).map_err(err)? {
        let path = entry.map_err(err)?.path();
        if path.is_dir() {
            folders.push(path);
        }
    }
    for folder in folders {
        for entry in std::fs::read_dir(&folder).map_err(err)? {
            let path = entry.map_err(err)?.path();
            if path.is_file() && path.extension().is_some_and(|x| x == "json") {
                out.push(path);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The plan of the recorded run: the same model, batch, optimizer and steps under PyTorch's
/// rules on a CPU device.
pub fn plan_of(rec: &Recording) -> Result<Plan, ValidationError> {
    let (optimizer, implementation) = optimizer_of(rec).map_err(|d| fail(rec, d))?;
    let cast = cast_of(rec).map_err(|d| fail(rec, d))?;
    let mut plan = match (&rec.hf_config, &rec.plan_model) {
        (Some(config), _) => hf_plan(rec, config, cast, optimizer)?,
        (None, Some(model)) => table_plan(rec, model, cast, optimizer)?,
        (None, None) => return Err(fail(rec, "neither hf_config nor plan_model".into())),
    };
    plan.name = rec.name.clone();
    if let Some(region) = &rec.autocast {
        plan.precision.autocast = Some(autocast_of(rec, region).map_err(|d| fail(rec, d))?);
    }
    plan.optimizer.implementation = implementation;
    plan.training.micro_batch_size = rec.micro_batch;
    set_device(rec, &mut plan).map_err(|d| fail(rec, d))?;
    plan.validate().map_err(|e| failed(rec, e.into()))?;
    Ok(plan)
}

/// A recorded run no plan can be made for, and why.
fn fail(rec: &Recording, detail: String) -> ValidationError {
    ValidationError::Plan {
        name: rec.name.clone(),
        detail,
    }
}

/// Making or checking the recorded run's plan failed with `source`.
fn failed(rec: &Recording, source: Box<dyn std::error::Error + Send + Sync>) -> ValidationError {
    ValidationError::PlanFailed {
        name: rec.name.clone(),
        source,
    }
}

/// The plan's optimizer and step implementation for the recorded optimizer.
fn optimizer_of(rec: &Recording) -> Result<(OptimizerKind, StepImpl), String> {
    // PyTorch's default step on CPU tensors is the for-loop one, on CUDA tensors foreach
    let default = if rec.on_cuda() {
        StepImpl::Foreach
    } else {
        StepImpl::ForLoop
    };
    Ok(match rec.optimizer.as_str() {
        "sgd" => (OptimizerKind::Sgd, default),
        "adamw" => (OptimizerKind::AdamW, default),
        "adamw-foreach" => (OptimizerKind::AdamW, StepImpl::Foreach),
        "adamw-fused" => (OptimizerKind::AdamW, StepImpl::Fused),
        "adafactor" => (OptimizerKind::Adafactor, StepImpl::ForLoop),
        // bitsandbytes' AdamW8bit (its CPU kernel)
        "adamw8bit" => (OptimizerKind::AdamW8bit, StepImpl::ForLoop),
        other => return Err(format!("optimizer `{other}` has no plan counterpart")),
    })
}

/// The half-precision dtype the whole model was cast to, if any.
fn cast_of(rec: &Recording) -> Result<Option<trainmem_core::Dtype>, String> {
    // parameters, gradients and `torch.optim`'s state in that dtype
    match rec.dtype.as_deref() {
        None | Some("float32") => Ok(None),
        Some("bfloat16") => Ok(Some(trainmem_core::Dtype::Bf16)),
        Some("float16") => Ok(Some(trainmem_core::Dtype::F16)),
        Some(other) => Err(format!("a model in `{other}` has no plan counterpart")),
    }
}

/// The plan of a recorded Hugging Face model, from its configuration.
fn hf_plan(
    rec: &Recording,
    config: &serde_json::Value,
    cast: Option<trainmem_core::Dtype>,
    optimizer: OptimizerKind,
) -> Result<Plan, ValidationError> {
    let mut opts = HfOptions::new(rec.batch, rec.seq);
    opts.precision = match cast {
        None => HfPrecision::F32,
        Some(trainmem_core::Dtype::F16) => HfPrecision::F16,
        Some(_) => HfPrecision::Bf16,
    };
    opts.optimizer = optimizer;
    opts.steps = rec.steps;
    opts.checkpointing = rec.checkpointing;
    opts.attention = match rec.attn_implementation.as_deref() {
        None => None,
        Some(name) => Some(
            serde_json::from_value(serde_json::Value::String(name.into()))
                .map_err(|_| fail(rec, format!("attn_implementation `{name}` is unknown")))?,
        ),
    };
    opts.lora = rec
        .lora
        .as_ref()
        .map(|l| lora_of(config, l))
        .transpose()
        .map_err(|d| fail(rec, d))?;
    plan_from_hf(&config.to_string(), &opts).map_err(|e| failed(rec, e.into()))
}

/// The plan of a recorded model given as a plan's model table.
fn table_plan(
    rec: &Recording,
    model: &serde_json::Value,
    cast: Option<trainmem_core::Dtype>,
    optimizer: OptimizerKind,
) -> Result<Plan, ValidationError> {
    let model: ModelSpec =
        serde_json::from_value(model.clone()).map_err(|e| failed(rec, e.into()))?;
    let mut plan = Plan::from_toml_str("[model.mlp]\ninput = 1\nhidden = []\noutput = 1\n")
        .map_err(|e| failed(rec, e.into()))?;
    plan.model = model;
    plan.framework = trainmem_core::Framework::Pytorch;
    plan.training.batch_size = rec.batch;
    plan.training.epochs = 1;
    plan.training.steps_per_epoch = Some(rec.steps);
    plan.data.samples = rec.batch * rec.steps;
    plan.loader.workers = 0;
    plan.optimizer.kind = optimizer;
    if let Some(dtype) = cast {
        plan.precision.compute = dtype;
        plan.precision.master_weights = false;
        plan.optimizer.state_dtype = dtype;
    }
    Ok(plan)
}

/// The dtype of the recorded autocast region, checked to be on the run's device.
fn autocast_of(rec: &Recording, region: &AutocastRegion) -> Result<trainmem_core::Dtype, String> {
    let dtype = match region.dtype.as_str() {
        "bfloat16" => trainmem_core::Dtype::Bf16,
        "float16" => trainmem_core::Dtype::F16,
        other => return Err(format!("autocast to `{other}` has no plan counterpart")),
    };
    let device = if rec.on_cuda() { "cuda" } else { "cpu" };
    if region.device_type != device {
        return Err(format!(
            "autocast on `{}` in a run recorded on `{device}`",
            region.device_type
        ));
    }
    Ok(dtype)
}

/// Sets the plan's device to the recorded one (a CPU without a recorded device).
fn set_device(rec: &Recording, plan: &mut Plan) -> Result<(), String> {
    match &rec.device {
        Some(d) if rec.on_cuda() => {
            plan.device.kind = DeviceKind::Cuda;
            // fake tensors stand for a GPU of any size (a published model's full size)
            let memory = if rec.on_fake_cuda() {
                1 << 44
            } else {
                d.total_memory
            };
            plan.device.capacity = trainmem_core::ByteSize(memory);
            plan.device.compute_capability = d.capability.map(|[a, b]| format!("{a}.{b}"));
        }
        Some(d) => return Err(format!("a device of type `{}`", d.kind)),
        None => {
            plan.device.kind = DeviceKind::Cpu;
            plan.device.capacity = trainmem_core::ByteSize(1 << 40);
        }
    }
    Ok(())
}

/// The adapters of a recorded `LoraConfig`, peft's module names read for the family of
/// `config`.
fn lora_of(config: &serde_json::Value, l: &RecordedLora) -> Result<LoraSpec, String> {
    let family = config
        .get("model_type")
        .and_then(|v| v.as_str())
        .unwrap_or("");
    let targets = l
        .targets
        .iter()
        .map(|m| {
            lora_target_of_module(family, m)
                .ok_or_else(|| format!("LoRA target `{m}` is not a projection of a {family} block"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(LoraSpec {
        rank: l.rank,
        alpha: Some(l.alpha),
        targets,
        dropout: l.dropout,
    })
}

/// Simulates the recorded run and sets each category's peak beside the recorded one.
pub fn compare(rec: &Recording) -> Result<Comparison, ValidationError> {
    let plan = plan_of(rec)?;
    let plan_parameters = crate::params::param_groups(&plan.model, plan.framework)
        .ok()
        .flatten()
        .and_then(|g| crate::params::total_elems(&g).ok())
        .unwrap_or(0);
    let plan_trainable = crate::params::trainable_groups(&plan.model, plan.framework)
        .ok()
        .flatten()
        .and_then(|g| crate::params::total_elems(&g).ok())
        .unwrap_or(0);
    let result =
        simulate(&plan, SimOptions::default()).map_err(|e| ValidationError::PlanFailed {
            name: rec.name.clone(),
            source: e.into(),
        })?;
    let mut rows = category_rows(rec, &result.summary);
    rows.extend(peak_rows(rec, &result.summary));
    Ok(Comparison {
        name: rec.name.clone(),
        plan_parameters,
        parameters: rec.parameters,
        plan_trainable,
        trainable: rec.trainable_parameters.unwrap_or(rec.parameters),
        rows,
    })
}

/// One row per tensor category: its recorded peak beside the tensors' own predicted peak.
fn category_rows(rec: &Recording, summary: &Summary) -> Vec<Row> {
    let mut rows = Vec::new();
    // the tensor categories: a CPU ledger has no allocator cache, and no `other`
    let tensors = Category::ALL.into_iter().filter(|c| match c {
        Category::Cache | Category::Other => false,
        // a forward pass holds no gradients or optimizer state, and its temporaries are
        // backward's
        Category::Gradient | Category::OptimizerState | Category::Temporary => !rec.forward_only(),
        _ => true,
    });
    for category in tensors {
        let name = category.name();
        let measured = rec
            .samples
            .iter()
            .map(|s| s.categories.get(name).copied().unwrap_or(0))
            .max()
            .unwrap_or(0);
        // the ledger counts each storage's `nbytes`: the tensors' own sizes, not the
        // caching allocator's blocks (rounded, with the tails it keeps unsplit)
        let predicted = summary.tensor_peaks.get(category);
        rows.push(Row {
            what: name.to_string(),
            measured,
            predicted,
            target: target(name),
        });
    }
    rows
}

/// The peak rows: the allocator's peaks on a GPU, the total peak on the CPU.
fn peak_rows(rec: &Recording, summary: &Summary) -> Vec<Row> {
    let mut rows = Vec::new();
    if rec.forward_only() {
        // no allocator figures (fake tensors), and the run's peak is in backward
        return rows;
    }
    if rec.on_cuda() {
        // the allocator's own peaks: block sizes as it rounds them, the cuBLAS workspace,
        // and the segments it reserves
        let peak = |f: fn(&CudaSample) -> u64| {
            rec.samples
                .iter()
                .filter_map(|s| s.cuda.as_ref().map(f))
                .max()
                .unwrap_or(0)
        };
        for (what, measured, predicted) in [
            (
                "peak allocated",
                peak(|c| c.peak_allocated),
                summary.peak_allocated,
            ),
            (
                "peak reserved",
                peak(|c| c.peak_reserved),
                summary.peak_reserved,
            ),
        ] {
            rows.push(Row {
                what: what.to_string(),
                measured,
                predicted,
                target: target(what),
            });
        }
    } else {
        rows.push(Row {
            what: "total peak".to_string(),
            measured: rec
                .samples
                .iter()
                .map(|s| s.peak_since_previous)
                .max()
                .unwrap_or(0),
            // the ledger starts once the model is built: its buffers (`other`) are outside
            predicted: summary.peak_allocated - summary.peak_breakdown.get(Category::Other),
            target: target("total peak"),
        });
    }
    rows
}

/// The comparison as a text table.
pub fn render(c: &Comparison) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{}: {} parameters recorded, {} in the plan",
        c.name, c.parameters, c.plan_parameters
    );
    if c.trainable != c.parameters || c.plan_trainable != c.plan_parameters {
        let _ = writeln!(
            out,
            "  trainable: {} recorded, {} in the plan",
            c.trainable, c.plan_trainable
        );
    }
    let _ = writeln!(
        out,
        "  {:<16} {:>14} {:>14} {:>9} {:>7}",
        "category", "PyTorch", "twin", "error", "target"
    );
    for r in &c.rows {
        let _ = writeln!(
            out,
            "  {:<16} {:>14} {:>14} {:>+8.2}% {:>6.1}%{}",
            r.what,
            r.measured,
            r.predicted,
            100.0 * r.error(),
            100.0 * r.target,
            if r.within() { "" } else { "  MISS" }
        );
    }
    out
}

/// One tensor of the twin live at a pass's highest total ([`twin_peaks`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TwinTensor {
    /// Its bytes.
    pub bytes: u64,
    /// Its category.
    pub category: Category,
    /// The layer that made it.
    pub layer: String,
    /// The pass that made it (`forward`, `recompute`, `backward`).
    pub pass: &'static str,
}

/// The twin's live tensors at the highest total of one pass over one micro-batch.
#[derive(Debug, Clone)]
pub struct TwinPeak {
    /// `forward` or `backward`.
    pub pass: &'static str,
    /// The highest total during the pass (the batch and what forward left included; model
    /// state not).
    pub total: u64,
    /// The tensors live then, largest first.
    pub tensors: Vec<TwinTensor>,
}

/// A memory that remembers which layer made each tensor and the live set at its highest
/// total.
#[derive(Debug, Default)]
struct LedgerMemory {
    live: std::collections::HashMap<u32, TwinTensor>,
    next: u32,
    total: u64,
    highest: u64,
    at_highest: Vec<TwinTensor>,
    layer: String,
    pass: &'static str,
}

impl trainmem_autograd::TensorMemory for LedgerMemory {
    type Handle = u32;
    type Error = std::convert::Infallible;

    fn allocate(
        &mut self,
        bytes: u64,
        category: Category,
    ) -> Result<trainmem_autograd::Allocated<u32>, Self::Error> {
        self.next += 1;
        let t = TwinTensor {
            bytes,
            category,
            layer: self.layer.clone(),
            pass: self.pass,
        };
        self.live.insert(self.next, t);
        self.total += bytes;
        if self.total > self.highest {
            self.highest = self.total;
            self.at_highest = self.live.values().cloned().collect();
        }
        Ok(trainmem_autograd::Allocated {
            handle: self.next,
            size: bytes,
        })
    }

    fn free(&mut self, handle: u32) {
        if let Some(t) = self.live.remove(&handle) {
            self.total -= t.bytes;
        }
    }
}

/// Names each tensor after the layer running when it was made.
struct LayerNames<'a>(&'a [String]);

impl trainmem_autograd::LayerHooks<LedgerMemory> for LayerNames<'_> {
    fn before_layer(
        &mut self,
        store: &mut trainmem_autograd::TensorStore<LedgerMemory>,
        layer: u32,
        pass: trainmem_autograd::Pass,
    ) -> Result<(), std::convert::Infallible> {
        let m = store.memory_mut();
        m.layer = self.0.get(layer as usize).cloned().unwrap_or_default();
        m.pass = match pass {
            trainmem_autograd::Pass::Forward => "forward",
            trainmem_autograd::Pass::Recompute => "recompute",
            trainmem_autograd::Pass::Backward => "backward",
        };
        Ok(())
    }
}

/// The twin's side of `record.py --explain`: one micro-batch of the recorded run through the
/// plan's program and saved-tensor table (forward, then backward), and the tensors live at the
/// highest total of each pass, with the layer and pass that made each. Model state is left
/// out (parameters, the optimizer); parameter gradients are in.
pub fn twin_peaks(rec: &Recording) -> Result<Vec<TwinPeak>, ValidationError> {
    use trainmem_autograd::{GradMode, Graph, TensorStore};
    let plan = plan_of(rec)?;
    let program = crate::lower::lower_plan(&plan).map_err(|e| ValidationError::Plan {
        name: rec.name.clone(),
        detail: e.0,
    })?;
    let profile = crate::FrameworkProfile::for_plan(&plan);
    let table = profile.saved_table_on(plan.device.kind);
    let mut graph = Graph::new(&program, &table, plan.precision.compute);
    graph.owns_inputs = profile.autograd.forward_owns_batch;
    graph.cross_entropy_two_step = profile.autograd.cross_entropy_two_step;
    let micro = plan.micro_batch_size();
    let mut store = TensorStore::new(LedgerMemory {
        layer: "batch".into(),
        pass: "batch",
        ..LedgerMemory::default()
    });
    let mut hooks = LayerNames(&program.layer_names);
    let never = |e: std::convert::Infallible| match e {};
    let inputs = program
        .inputs
        .iter()
        .map(|&v| {
            let bytes = graph.value_bytes(v, micro, 1.0);
            store.alloc(bytes, Category::Input).map_err(never)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut out = Vec::new();
    let mut take = |store: &mut TensorStore<LedgerMemory>, pass: &'static str| {
        let m = store.memory_mut();
        let mut tensors = std::mem::take(&mut m.at_highest);
        tensors.sort_by_key(|t| std::cmp::Reverse(t.bytes));
        out.push(TwinPeak {
            pass,
            total: m.highest,
            tensors,
        });
        m.highest = m.total;
        m.at_highest = m.live.values().cloned().collect();
    };
    let mut tape = graph
        .forward(
            &mut store,
            &inputs,
            micro,
            1.0,
            GradMode::Train,
            &[],
            &mut hooks,
        )
        .map_err(never)?;
    take(&mut store, "forward");
    graph
        .backward(&mut store, &mut tape, false, &mut hooks)
        .map_err(|e| ValidationError::PlanFailed {
            name: rec.name.clone(),
            source: e.into(),
        })?;
    take(&mut store, "backward");
    Ok(out)
}
