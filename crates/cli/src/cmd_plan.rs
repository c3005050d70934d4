//! `trainmem plan`: write plans from descriptions users already have.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use trainmem_core::hf_config::{HfOptions, HfPrecision, plan_from_hf};
use trainmem_core::model::{LoraSpec, LoraTarget};
use trainmem_core::optimizer::OptimizerKind;
use trainmem_sim::params::{param_groups, total_elems, trainable_groups};

/// `trainmem plan ...`.
#[derive(Debug, clap::Subcommand)]
pub enum PlanCommand {
    /// Write a plan for the model a Hugging Face `config.json` describes (gpt2, bert, llama,
    /// mistral, qwen2, opt), trained under PyTorch's rules.
    FromHf(FromHfArgs),
}

/// The optimizer of a plan written from a configuration.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum OptimizerArg {
    /// Plain SGD (no state).
    Sgd,
    /// SGD with momentum (one buffer).
    Momentum,
    /// Adam (two moments).
    Adam,
    /// AdamW (two moments).
    Adamw,
    /// Adafactor (factored second moments, as `transformers` has it).
    Adafactor,
    /// 8-bit AdamW as bitsandbytes keeps it (`AdamW8bit`: one byte per element and moment
    /// with an f32 maximum per 256-element block; f32 moments under 4096 elements).
    #[value(name = "adamw8bit")]
    Adamw8bit,
}

/// The precision of a plan written from a configuration.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum PrecisionArg {
    /// Everything in f32.
    F32,
    /// bf16 compute with f32 master weights.
    MixedBf16,
    /// fp16 compute with f32 master weights.
    MixedF16,
    /// Everything in bf16.
    Bf16,
    /// `torch.autocast` to bf16: f32 parameters, gradients and optimizer state; bf16 weight
    /// copies and activations where autocast runs an op in bf16.
    AutocastBf16,
    /// `torch.autocast` to fp16, likewise.
    AutocastF16,
}

/// Arguments of `trainmem plan from-hf`.
#[derive(Debug, clap::Args)]
pub struct FromHfArgs {
    /// The model's `config.json`.
    pub config: PathBuf,
    /// Samples per optimizer step.
    #[arg(long)]
    pub batch: u64,
    /// Tokens per sample.
    #[arg(long)]
    pub seq: u64,
    /// The optimizer.
    #[arg(long, value_enum, default_value = "adamw")]
    pub optimizer: OptimizerArg,
    /// Parameter and activation precision.
    #[arg(long, value_enum, default_value = "f32")]
    pub precision: PrecisionArg,
    /// Checkpoint every block (Hugging Face's gradient checkpointing).
    #[arg(long)]
    pub checkpointing: bool,
    /// Optimizer steps the plan runs.
    #[arg(long, default_value_t = 3)]
    pub steps: u64,
    /// Train LoRA adapters of this rank on a frozen base (as peft does).
    #[arg(long, value_name = "R")]
    pub lora_rank: Option<u64>,
    /// The projections adapted, comma-separated: q, k, v, qkv, o, up, gate, down (GPT-2's
    /// packed `c_attn` takes q, k and v as one).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "q,v",
        requires = "lora_rank"
    )]
    pub lora_targets: Vec<String>,
    /// The adapters' `alpha` (default: the rank).
    #[arg(long, requires = "lora_rank")]
    pub lora_alpha: Option<f64>,
    /// Dropout on the adapters' input.
    #[arg(long, default_value_t = 0.0, requires = "lora_rank")]
    pub lora_dropout: f64,
    /// The plan's name (default: the config file's directory or stem).
    #[arg(long)]
    pub name: Option<String>,
    /// Write the plan here instead of standard output.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

/// Runs `trainmem plan ...`.
pub fn run(cmd: PlanCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        PlanCommand::FromHf(args) => from_hf(args),
    }
}

fn from_hf(args: FromHfArgs) -> anyhow::Result<ExitCode> {
    let text = std::fs::read_to_string(&args.config)
        .with_context(|| format!("reading {}", args.config.display()))?;
    let opts = HfOptions {
        batch: args.batch,
        seq: args.seq,
        optimizer: match args.optimizer {
            OptimizerArg::Sgd => OptimizerKind::Sgd,
            OptimizerArg::Momentum => OptimizerKind::Momentum,
            OptimizerArg::Adam => OptimizerKind::Adam,
            OptimizerArg::Adamw => OptimizerKind::AdamW,
            OptimizerArg::Adafactor => OptimizerKind::Adafactor,
            OptimizerArg::Adamw8bit => OptimizerKind::AdamW8bit,
        },
        precision: match args.precision {
            PrecisionArg::F32 => HfPrecision::F32,
            PrecisionArg::MixedBf16 => HfPrecision::MixedBf16,
            PrecisionArg::MixedF16 => HfPrecision::MixedF16,
            PrecisionArg::Bf16 => HfPrecision::Bf16,
            PrecisionArg::AutocastBf16 => HfPrecision::AutocastBf16,
            PrecisionArg::AutocastF16 => HfPrecision::AutocastF16,
        },
        checkpointing: args.checkpointing,
        steps: args.steps,
        lora: lora_of(&args)?,
    };
    let mut plan = plan_from_hf(&text, &opts).with_context(|| args.config.display().to_string())?;
    plan.name = args
        .name
        .clone()
        .unwrap_or_else(|| default_name(&args.config));
    let count = param_groups(&plan.model, plan.framework)
        .ok()
        .flatten()
        .and_then(|g| total_elems(&g).ok());
    let trainable = trainable_groups(&plan.model, plan.framework)
        .ok()
        .flatten()
        .and_then(|g| total_elems(&g).ok());
    let counts = counts_line(count, trainable);
    let header = format!(
        "# Written by `trainmem plan from-hf {}` ({counts}).\n",
        args.config.display(),
    );
    let toml = format!("{header}{}", plan.to_toml().context("the plan as TOML")?);
    match &args.out {
        Some(path) => {
            std::fs::write(path, &toml).with_context(|| format!("writing {}", path.display()))?;
            eprintln!(
                "{}: {counts}; plan written to {}",
                plan.name,
                path.display()
            );
        }
        None => print!("{toml}"),
    }
    Ok(ExitCode::SUCCESS)
}

/// The LoRA adapters the arguments ask for (`None` without `--lora-rank`).
fn lora_of(args: &FromHfArgs) -> anyhow::Result<Option<LoraSpec>> {
    let Some(rank) = args.lora_rank else {
        return Ok(None);
    };
    let targets = args
        .lora_targets
        .iter()
        .map(|t| {
            LoraTarget::from_name(t.trim()).with_context(|| {
                format!(
                    "--lora-targets: `{t}` is not a projection (q, k, v, qkv, o, up, gate, down)"
                )
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(Some(LoraSpec {
        rank,
        alpha: args.lora_alpha,
        targets,
        dropout: args.lora_dropout,
    }))
}

/// `N parameters, T trainable, F frozen` (the frozen part only when there is one).
fn counts_line(total: Option<u64>, trainable: Option<u64>) -> String {
    let show = |n: Option<u64>| n.map_or("?".to_string(), group_thousands);
    match (total, trainable) {
        (Some(t), Some(tr)) if tr < t => format!(
            "{} parameters, {} trainable, {} frozen",
            group_thousands(t),
            group_thousands(tr),
            group_thousands(t - tr)
        ),
        _ => format!("{} parameters, {} trainable", show(total), show(trainable)),
    }
}

/// The directory a `config.json` sits in (a model's name), else the file's stem.
fn default_name(path: &std::path::Path) -> String {
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("model");
    if stem == "config"
        && let Some(dir) = path
            .parent()
            .and_then(|p| p.file_name())
            .and_then(|d| d.to_str())
    {
        return dir.to_string();
    }
    stem.to_string()
}

/// `124439808` as `124,439,808`.
fn group_thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_are_grouped() {
        assert_eq!(group_thousands(124_439_808), "124,439,808");
        assert_eq!(group_thousands(999), "999");
        assert_eq!(group_thousands(1000), "1,000");
    }

    #[test]
    fn a_config_in_a_model_directory_is_named_after_it() {
        assert_eq!(default_name("models/gpt2/config.json".as_ref()), "gpt2");
        assert_eq!(
            default_name("fixtures/hf/opt-125m.json".as_ref()),
            "opt-125m"
        );
    }
}
