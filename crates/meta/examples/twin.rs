//! A transformer plan run two ways: trainmem-burn's own model and training loop on Meta, and
//! the plan-based simulator. Prints the per-category peaks of both side by side.
//!
//! ```text
//! cargo run -p trainmem-meta --example twin -- [layers] [hidden] [heads] [ffn] [seq] [vocab] [norm] [gated] [activation]
//! ```
//! Defaults: LLaMA-7B's sizes in the blocks trainmem-burn's model builds (burn-nn's transformer
//! with a causal mask: LayerNorm, a plain GELU feed-forward), batch 1, AdamW, one step.

use trainmem_burn::{RunOptions, run_predicted};
use trainmem_core::plan::Plan;
use trainmem_core::timeline::{Domain, Timeline};
use trainmem_core::{Category, CategoryBytes};
use trainmem_meta::{Meta, MetaDevice, PRODUCER};
use trainmem_sim::SimOptions;

fn plan_text(args: &[String]) -> String {
    let arg = |i: usize, default: &str| args.get(i).cloned().unwrap_or_else(|| default.into());
    format!(
        "name = \"twin\"\nframework = \"burn\"\n\
         [model.transformer]\nkind = \"decoder\"\nlayers = {}\nhidden = {}\nheads = {}\n\
         ffn = {}\nseq_len = {}\nvocab = {}\nnorm = \"{}\"\ngated_ffn = {}\nactivation = \"{}\"\n\
         [training]\nbatch_size = 1\nepochs = 1\nsteps_per_epoch = 1\n\
         [optimizer]\nkind = \"adamw\"\n\
         [device]\nkind = \"cpu\"\ncapacity = \"1TiB\"\n",
        arg(0, "32"),
        arg(1, "4096"),
        arg(2, "32"),
        arg(3, "11008"),
        arg(4, "2048"),
        arg(5, "32000"),
        arg(6, "layer_norm"),
        arg(7, "false"),
        arg(8, "gelu"),
    )
}

/// Peak per category over both domains (a CPU plan's bytes are host bytes in the simulator,
/// Meta's are device bytes).
fn peaks(t: &Timeline) -> CategoryBytes {
    let host = t.peak_per_category(Domain::Host);
    let device = t.peak_per_category(Domain::Device);
    host.max(&device)
}

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let plan = Plan::from_toml_str(&plan_text(&args)).map_err(|e| e.to_string())?;
    let started = std::time::Instant::now();
    let meta = run_predicted::<Meta>(&plan, RunOptions::default(), MetaDevice::new(), PRODUCER)
        .map_err(|e| e.to_string())?;
    let meta_s = started.elapsed().as_secs_f64();
    let sim = trainmem_sim::simulate(&plan, SimOptions::default()).map_err(|e| e.to_string())?;
    let (m, s) = (peaks(&meta.timeline), peaks(&sim.timeline));
    println!(
        "meta run {meta_s:.2} s; parameter bytes {}",
        meta.parameter_bytes
    );
    println!(
        "{:<16} {:>16} {:>16} {:>8}",
        "category", "meta", "simulated", "diff %"
    );
    for c in Category::ALL {
        let (m, s) = (m.get(c), s.get(c));
        let diff = if s > 0 {
            100.0 * (m as f64 - s as f64) / s as f64
        } else {
            0.0
        };
        println!("{:<16} {:>16} {:>16} {:>8.2}", c.name(), m, s, diff);
    }
    Ok(())
}
