//! A LLaMA-style decoder written with burn's modules, trained for one AdamW step on Meta
//! (`trainmem_meta::llama`; `cargo xtask meta` runs the same with named options).
//!
//! ```text
//! cargo run -p trainmem-meta --release --example llama -- [f32|bf16] [layers] [hidden] [heads] [ffn] [seq] [batch] [vocab]
//! ```
//!
//! Defaults are LLaMA-7B's shape (32 layers, hidden 4096, 32 heads, ffn 11008, sequence 2048,
//! batch 1, vocabulary 32000). Prints the parameter count, the per-category peaks and the bytes
//! after each phase, the wall time and the process's peak resident memory.

use std::time::Instant;

use burn::tensor::{DType, FloatDType};
use trainmem_meta::llama::{LlamaShape, predict_step};

fn parse(args: &[String]) -> Result<(FloatDType, LlamaShape), String> {
    let dtype = match args.first().map(String::as_str) {
        None | Some("f32") => FloatDType::F32,
        Some("bf16") => FloatDType::BF16,
        Some(other) => return Err(format!("unknown dtype `{other}` (f32 or bf16)")),
    };
    let d = LlamaShape::LLAMA_7B;
    let mut v = [d.layers, d.hidden, d.heads, d.ffn, d.seq, d.batch, d.vocab];
    for (i, slot) in v.iter_mut().enumerate() {
        if let Some(text) = args.get(i + 1) {
            *slot = text
                .parse()
                .map_err(|_| format!("argument {} is not a number: `{text}`", i + 2))?;
        }
    }
    let shape = LlamaShape {
        layers: v[0],
        hidden: v[1],
        heads: v[2],
        ffn: v[3],
        seq: v[4],
        batch: v[5],
        vocab: v[6],
    };
    Ok((dtype, shape))
}

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (dtype, s) = parse(&args)?;
    let started = Instant::now();
    let (run, params) = predict_step(s, dtype)?;
    let elapsed = started.elapsed();
    let rss = trainmem_probe::rss::read().map_err(|e| e.to_string())?;
    println!(
        "LLaMA-style decoder {s:?}, {:?}: {params} parameters",
        DType::from(dtype)
    );
    print!("{}", trainmem_meta::llama::render(&run));
    println!(
        "step on Meta: {:.2} s wall, peak RSS (VmHWM) {:.1} MiB",
        elapsed.as_secs_f64(),
        rss.vm_hwm as f64 / (1u64 << 20) as f64
    );
    Ok(())
}
