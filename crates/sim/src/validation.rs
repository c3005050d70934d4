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

use std::path::Path;

use serde::Deserialize;
use trainmem_core::Category;
use trainmem_core::hf_config::{HfOptions, lora_target_of_module, plan_from_hf};
use trainmem_core::model::LoraSpec;
use trainmem_core::optimizer::{OptimizerKind, StepImpl};

use crate::model::ModelSpec;
use crate::plan::{DeviceKind, Plan};
use crate::{SimOptions, simulate};

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
    /// The LoRA adapters peft put on the model (its base frozen), when it did.
    #[serde(default)]
    pub lora: Option<RecordedLora>,
    /// Parameters with `requires_grad` (recorded for LoRA runs; otherwise all of them).
    #[serde(default)]
    pub trainable_parameters: Option<u64>,
    /// Phase-boundary samples.
    pub samples: Vec<LedgerSample>,
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
}

/// Why a recording could not be compared.
#[derive(Debug, thiserror::Error)]
pub enum ValidationError {
    /// The file could not be read or parsed.
    #[error("{path}: {detail}")]
    File {
        /// The file.
        path: String,
        /// What went wrong.
        detail: String,
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

/// The targets: model state exact to 0.1%, activations and temporaries to 3%, the total peak to
/// 2%.
pub fn target(what: &str) -> f64 {
    match what {
        "parameter" | "gradient" | "optimizer_state" => 0.001,
        "total peak" => 0.02,
        _ => 0.03,
    }
}

/// Reads a recording.
pub fn load(path: &Path) -> Result<Recording, ValidationError> {
    let err = |detail: String| ValidationError::File {
        path: path.display().to_string(),
        detail,
    };
    let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    serde_json::from_str(&text).map_err(|e| err(e.to_string()))
}

/// The plan of the recorded run: the same model, batch, optimizer and steps under PyTorch's
/// rules on a CPU device.
pub fn plan_of(rec: &Recording) -> Result<Plan, ValidationError> {
    let fail = |detail: String| ValidationError::Plan {
        name: rec.name.clone(),
        detail,
    };
    // PyTorch's default step on CPU tensors is the for-loop one
    let (optimizer, implementation) = match rec.optimizer.as_str() {
        "sgd" => (OptimizerKind::Sgd, StepImpl::ForLoop),
        "adamw" => (OptimizerKind::AdamW, StepImpl::ForLoop),
        "adamw-foreach" => (OptimizerKind::AdamW, StepImpl::Foreach),
        "adafactor" => (OptimizerKind::Adafactor, StepImpl::ForLoop),
        other => return Err(fail(format!("optimizer `{other}` has no plan counterpart"))),
    };
    let mut plan = match (&rec.hf_config, &rec.plan_model) {
        (Some(config), _) => {
            let mut opts = HfOptions::new(rec.batch, rec.seq);
            opts.optimizer = optimizer;
            opts.steps = rec.steps;
            opts.checkpointing = rec.checkpointing;
            opts.lora = rec
                .lora
                .as_ref()
                .map(|l| lora_of(config, l))
                .transpose()
                .map_err(fail)?;
            plan_from_hf(&config.to_string(), &opts).map_err(|e| fail(e.to_string()))?
        }
        (None, Some(model)) => {
            let model: ModelSpec =
                serde_json::from_value(model.clone()).map_err(|e| fail(e.to_string()))?;
            let mut plan = Plan::from_toml_str("[model.mlp]\ninput = 1\nhidden = []\noutput = 1\n")
                .map_err(|e| fail(e.to_string()))?;
            plan.model = model;
            plan.framework = trainmem_core::Framework::Pytorch;
            plan.training.batch_size = rec.batch;
            plan.training.epochs = 1;
            plan.training.steps_per_epoch = Some(rec.steps);
            plan.data.samples = rec.batch * rec.steps;
            plan.loader.workers = 0;
            plan.optimizer.kind = optimizer;
            plan
        }
        (None, None) => return Err(fail("neither hf_config nor plan_model".into())),
    };
    plan.name = rec.name.clone();
    plan.optimizer.implementation = implementation;
    plan.training.micro_batch_size = rec.micro_batch;
    plan.device.kind = DeviceKind::Cpu;
    plan.device.capacity = crate::ByteSize(1 << 40);
    plan.validate().map_err(|e| fail(e.to_string()))?;
    Ok(plan)
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
    let result = simulate(&plan, SimOptions::default()).map_err(|e| ValidationError::Plan {
        name: rec.name.clone(),
        detail: e.to_string(),
    })?;
    let samples = &result.timeline.samples;
    let mut rows = Vec::new();
    // the tensor categories: a CPU ledger has no allocator cache, and no `other`
    let tensors = Category::ALL
        .into_iter()
        .filter(|c| !matches!(c, Category::Cache | Category::Other));
    for category in tensors {
        let name = category.name();
        let measured = rec
            .samples
            .iter()
            .map(|s| s.categories.get(name).copied().unwrap_or(0))
            .max()
            .unwrap_or(0);
        let predicted = samples
            .iter()
            .map(|s| s.device.categories.get(category))
            .max()
            .unwrap_or(0);
        rows.push(Row {
            what: name.to_string(),
            measured,
            predicted,
            target: target(name),
        });
    }
    rows.push(Row {
        what: "total peak".to_string(),
        measured: rec
            .samples
            .iter()
            .map(|s| s.peak_since_previous)
            .max()
            .unwrap_or(0),
        predicted: result.summary.peak_allocated,
        target: target("total peak"),
    });
    Ok(Comparison {
        name: rec.name.clone(),
        plan_parameters,
        parameters: rec.parameters,
        plan_trainable,
        trainable: rec.trainable_parameters.unwrap_or(rec.parameters),
        rows,
    })
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
