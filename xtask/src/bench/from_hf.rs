//! `cargo xtask bench from-hf`: how long a user waits for the memory of a 7B model with LoRA
//! adapters, from nothing but files they have: `trainmem plan from-hf` on LLaMA-2-7B's
//! `config.json` with a peft `adapter_config.json` and `--attn-implementation sdpa`, then
//! `trainmem simulate` of the plan it writes, each command its own process, as a user runs
//! them. The target: under 1 s for the two together (the median of `--reps` runs); the bench
//! exits 1 when it is missed, or when either command fails.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

use anyhow::{Context, bail};

/// Arguments of `bench from-hf`.
#[derive(Debug, clap::Args)]
pub struct FromHfBenchArgs {
    /// Timed runs of the two commands (the median is judged).
    #[arg(long, default_value_t = 5)]
    reps: u32,
    /// The `trainmem` binary (default: the one beside this xtask, built first when absent).
    #[arg(long)]
    bin: Option<PathBuf>,
}

/// A peft adapter as `LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05,
/// target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])` saves it.
const ADAPTER_CONFIG: &str = r#"{"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 16,
"lora_alpha": 32, "lora_dropout": 0.05,
"target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}"#;

/// The target for the two commands together, in seconds.
const TARGET_SECS: f64 = 1.0;

/// The `trainmem` binary: `given`, else the one beside this xtask (built with the same
/// profile when absent).
fn trainmem_bin(given: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    if let Some(b) = given {
        return Ok(b);
    }
    let exe = std::env::current_exe().context("locating the xtask binary")?;
    let dir = exe.parent().context("the xtask binary's folder")?;
    let bin = dir.join(format!("trainmem{}", std::env::consts::EXE_SUFFIX));
    if !bin.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut build = Command::new(cargo);
        build.args(["build", "-p", "trainmem"]);
        if dir.ends_with("release") {
            build.arg("--release");
        }
        eprintln!("building trainmem ({})", dir.display());
        let status = build.status().context("running cargo build -p trainmem")?;
        if !status.success() || !bin.exists() {
            bail!("cargo build -p trainmem failed; build it, or give --bin");
        }
    }
    Ok(bin)
}

/// Runs `bin` with `args`; fails with its standard error when it fails.
fn run_command(bin: &Path, args: &[&str]) -> anyhow::Result<std::process::Output> {
    let out = Command::new(bin)
        .args(args)
        .output()
        .with_context(|| format!("starting {}", bin.display()))?;
    if !out.status.success() {
        bail!(
            "trainmem {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(out)
}

/// Runs the benchmark.
pub fn run(args: FromHfBenchArgs) -> anyhow::Result<ExitCode> {
    let bin = trainmem_bin(args.bin)?;
    let config = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures/hf/llama-2-7b.json");
    let dir = std::env::temp_dir().join(format!("trainmem-bench-from-hf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let adapter = dir.join("adapter_config.json");
    std::fs::write(&adapter, ADAPTER_CONFIG)
        .with_context(|| format!("writing {}", adapter.display()))?;
    let plan = dir.join("llama-2-7b-lora.toml");
    let (config_s, adapter_s, plan_s) = (
        config.to_string_lossy().into_owned(),
        adapter.to_string_lossy().into_owned(),
        plan.to_string_lossy().into_owned(),
    );
    let from_hf = [
        "plan",
        "from-hf",
        &config_s,
        "--batch",
        "1",
        "--seq",
        "2048",
        "--peft",
        &adapter_s,
        "--attn-implementation",
        "sdpa",
        "--out",
        &plan_s,
    ];
    let simulate = ["simulate", &plan_s];
    println!("trainmem {}", from_hf.join(" "));
    println!("trainmem {}", simulate.join(" "));
    let mut times = Vec::new();
    let mut written = String::new();
    let mut peak = String::new();
    for _ in 0..args.reps.max(1) {
        let t = Instant::now();
        let planned = run_command(&bin, &from_hf)?;
        let simulated = run_command(&bin, &simulate)?;
        times.push(t.elapsed().as_secs_f64());
        written = String::from_utf8_lossy(&planned.stderr).trim().to_string();
        peak = String::from_utf8_lossy(&simulated.stdout)
            .lines()
            .find(|l| l.contains("peak"))
            .unwrap_or_default()
            .trim()
            .to_string();
    }
    let _ = std::fs::remove_dir_all(&dir);
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    println!("{written}");
    println!("{peak}");
    let shown: Vec<String> = times.iter().map(|t| format!("{:.3}", t)).collect();
    println!("runs (s): {}", shown.join(" "));
    let met = median < TARGET_SECS;
    println!(
        "from-hf + simulate: median {median:.3} s over {} runs, target under {TARGET_SECS} s: {}",
        times.len(),
        if met { "met" } else { "NOT met" }
    );
    Ok(if met {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
