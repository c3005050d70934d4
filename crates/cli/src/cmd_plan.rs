//! `trainmem plan`: write plans from descriptions users already have.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use trainmem_core::hf_config::peft::{lora_targets, read_adapter_config};
use trainmem_core::hf_config::{
    HfOptions, HfPrecision, model_from_hf, model_type_of, plan_from_hf,
};
use trainmem_core::model::{AttentionImpl, LoraSpec};
use trainmem_core::optimizer::{OptimizerKind, StepImpl};
use trainmem_sim::params::{param_groups, total_elems, trainable_groups};

/// `trainmem plan ...`.
#[derive(Debug, clap::Subcommand)]
pub enum PlanCommand {
    /// Write a plan for the model a Hugging Face `config.json` describes (gpt2, bert, llama,
    /// mistral, qwen2, opt, phi, phi3, gpt_neox, stablelm, gemma, gemma2, gemma3_text,
    /// falcon, mixtral, qwen2_moe, starcoder2, gptj, bloom), trained under PyTorch's rules.
    FromHf(FromHfArgs),
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
    pub optimizer: OptimizerKind,
    /// Parameter and activation precision.
    #[arg(long, value_enum, default_value = "f32")]
    pub precision: HfPrecision,
    /// Checkpoint every block (Hugging Face's gradient checkpointing).
    #[arg(long)]
    pub checkpointing: bool,
    /// Optimizer steps the plan runs.
    #[arg(long, default_value_t = 3)]
    pub steps: u64,
    /// The attention implementation (default: what transformers picks for the model, sdpa
    /// for most, eager where it has no other).
    #[arg(long, value_enum)]
    pub attn_implementation: Option<AttentionImpl>,
    /// How torch.optim runs the step (default: what it picks on a CUDA device, foreach for
    /// SGD and Adam(W)).
    #[arg(long, value_enum)]
    pub optimizer_impl: Option<StepImpl>,
    /// Train LoRA adapters of this rank on a frozen base (as peft does).
    #[arg(long, value_name = "R", conflicts_with = "peft")]
    pub lora_rank: Option<u64>,
    /// The modules adapted, comma-separated, as a peft LoraConfig's target_modules names
    /// them (q_proj, v_proj, query_key_value, c_attn, ..., or all-linear); the plan's own
    /// names (q, k, v, qkv, o, up, gate, down, gate_up) read too. Default: peft's default
    /// for the model.
    #[arg(long, value_delimiter = ',', requires = "lora_rank")]
    pub lora_targets: Vec<String>,
    /// Read the LoRA adapters (rank, alpha, dropout, target modules) from a peft
    /// adapter_config.json.
    #[arg(long, value_name = "ADAPTER_CONFIG")]
    pub peft: Option<PathBuf>,
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
    #[arg(short, long, value_name = "FILE")]
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
        optimizer_impl: args.optimizer_impl,
        attention: args.attn_implementation,
        batch: args.batch,
        seq: args.seq,
        optimizer: args.optimizer,
        precision: args.precision,
        checkpointing: args.checkpointing,
        steps: args.steps,
        lora: lora_of(&args, &text)?,
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
        command_line(&args),
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

/// The arguments as given, for the plan's header: every flag shows in the written plan.
fn command_line(args: &FromHfArgs) -> String {
    let mut line = format!(
        "{} --batch {} --seq {}",
        args.config.display(),
        args.batch,
        args.seq
    );
    let mut flag = |name: &str, value: String| line.push_str(&format!(" --{name} {value}"));
    flag("optimizer", value_name(args.optimizer));
    flag("precision", value_name(args.precision));
    if let Some(a) = args.attn_implementation {
        flag("attn-implementation", value_name(a));
    }
    if let Some(i) = args.optimizer_impl {
        flag("optimizer-impl", value_name(i));
    }
    flag("steps", args.steps.to_string());
    if let Some(r) = args.lora_rank {
        flag("lora-rank", r.to_string());
        if !args.lora_targets.is_empty() {
            flag("lora-targets", args.lora_targets.join(","));
        }
        if let Some(a) = args.lora_alpha {
            flag("lora-alpha", a.to_string());
        }
        if args.lora_dropout > 0.0 {
            flag("lora-dropout", args.lora_dropout.to_string());
        }
    }
    if let Some(p) = &args.peft {
        flag("peft", p.display().to_string());
    }
    if args.checkpointing {
        line.push_str(" --checkpointing");
    }
    line
}

/// The name a value has on the command line (`mixed-bf16`, `for-loop`, `flash_attention_2`).
fn value_name(v: impl clap::ValueEnum) -> String {
    v.to_possible_value()
        .map(|p| p.get_name().to_string())
        .unwrap_or_default()
}

/// The LoRA adapters the arguments ask for: from `--peft`'s adapter_config.json, or from
/// `--lora-rank` and `--lora-targets` (`None` with neither).
fn lora_of(args: &FromHfArgs, config: &str) -> anyhow::Result<Option<LoraSpec>> {
    if args.peft.is_none() && args.lora_rank.is_none() {
        return Ok(None);
    }
    let model_type = model_type_of(config)?;
    let model = model_from_hf(config, 1)?;
    if let Some(path) = &args.peft {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let adapter = read_adapter_config(&text).with_context(|| path.display().to_string())?;
        return Ok(Some(adapter.lora(&model_type, &model)?));
    }
    let Some(rank) = args.lora_rank else {
        return Ok(None);
    };
    let targets = if args.lora_targets.is_empty() {
        LoraSpec::new(rank).targets
    } else {
        lora_targets(&model_type, &model, &args.lora_targets).context("--lora-targets")?
    };
    Ok(Some(LoraSpec {
        rank,
        alpha: args.lora_alpha,
        targets,
        dropout: args.lora_dropout,
    }))
}

/// `N parameters, T trainable, F frozen` (the frozen part only when there is one).
fn counts_line(total: Option<u64>, trainable: Option<u64>) -> String {
    let show = |n: Option<u64>| n.map_or("?".to_string(), trainmem_core::count::grouped);
    match (total, trainable) {
        (Some(t), Some(tr)) if tr < t => format!(
            "{} parameters, {} trainable, {} frozen",
            trainmem_core::count::grouped(t),
            trainmem_core::count::grouped(tr),
            trainmem_core::count::grouped(t - tr)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_written_as_typed() {
        use clap::ValueEnum;
        assert_eq!(value_name(HfPrecision::MixedBf16), "mixed-bf16");
        assert_eq!(value_name(HfPrecision::AutocastF16), "autocast-f16");
        assert_eq!(value_name(HfPrecision::Bf16), "bf16");
        assert_eq!(value_name(StepImpl::ForLoop), "for-loop");
        assert_eq!(value_name(OptimizerKind::AdamW), "adamw");
        assert_eq!(value_name(OptimizerKind::AdamW8bit), "adamw8bit");
        assert_eq!(
            value_name(AttentionImpl::FlashAttention2),
            "flash_attention_2"
        );
        // A plan-only value is not offered on the command line.
        assert!(!AttentionImpl::value_variants().contains(&AttentionImpl::Fused));
        for p in HfPrecision::value_variants() {
            assert_eq!(HfPrecision::from_str(&value_name(*p), false), Ok(*p));
        }
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
