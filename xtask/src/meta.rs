//! `cargo xtask meta`: one training step of a built-in LLaMA-style decoder on trainmem-meta, at
//! any size, with its bytes per category (no memory of that size is allocated).

use std::process::ExitCode;
use std::time::Instant;

use burn::tensor::FloatDType;
use trainmem_meta::llama::{LlamaShape, predict_step, render};

/// Parameter and activation dtype of `cargo xtask meta`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum DtypeArg {
    /// 32-bit floats.
    F32,
    /// bfloat16.
    Bf16,
}

/// Arguments of `cargo xtask meta` (defaults: LLaMA-2-7B's shape, batch 1, sequence 2048).
#[derive(Debug, clap::Args)]
pub struct MetaArgs {
    /// Blocks.
    #[arg(long, default_value_t = LlamaShape::LLAMA_7B.layers)]
    pub layers: usize,
    /// Hidden size.
    #[arg(long, default_value_t = LlamaShape::LLAMA_7B.hidden)]
    pub hidden: usize,
    /// Attention heads.
    #[arg(long, default_value_t = LlamaShape::LLAMA_7B.heads)]
    pub heads: usize,
    /// SwiGLU inner size.
    #[arg(long, default_value_t = LlamaShape::LLAMA_7B.ffn)]
    pub ffn: usize,
    /// Tokens per sample.
    #[arg(long, default_value_t = LlamaShape::LLAMA_7B.seq)]
    pub seq: usize,
    /// Samples per step.
    #[arg(long, default_value_t = LlamaShape::LLAMA_7B.batch)]
    pub batch: usize,
    /// Vocabulary size.
    #[arg(long, default_value_t = LlamaShape::LLAMA_7B.vocab)]
    pub vocab: usize,
    /// Parameter and activation dtype.
    #[arg(long, value_enum, default_value = "f32")]
    pub dtype: DtypeArg,
}

/// Runs `cargo xtask meta`.
pub fn run(args: MetaArgs) -> anyhow::Result<ExitCode> {
    let shape = LlamaShape {
        layers: args.layers,
        hidden: args.hidden,
        heads: args.heads,
        ffn: args.ffn,
        seq: args.seq,
        batch: args.batch,
        vocab: args.vocab,
    };
    let dtype = match args.dtype {
        DtypeArg::F32 => FloatDType::F32,
        DtypeArg::Bf16 => FloatDType::BF16,
    };
    let started = Instant::now();
    let (run, params) = predict_step(shape, dtype).map_err(anyhow::Error::msg)?;
    let elapsed = started.elapsed();
    println!(
        "LLaMA-style decoder {shape:?}, {:?}: {params} parameters",
        args.dtype
    );
    print!("{}", render(&run));
    let rss = trainmem_probe::rss::read()
        .map(|r| {
            format!(
                ", peak RSS (VmHWM) {:.1} MiB",
                r.vm_hwm as f64 / (1 << 20) as f64
            )
        })
        .unwrap_or_default();
    println!("one step on Meta: {:.2} s{rss}", elapsed.as_secs_f64());
    Ok(ExitCode::SUCCESS)
}
