//! `cargo xtask bench sim [--plan PLAN] [--steps N]`: the simulator's speed on a large plan.
//!
//! Simulates every step of the plan through the caching allocator (no step is skipped) and,
//! in the same run, the same plan over exact byte counting (no allocator), and prints the
//! wall time, allocator events per second, and the ratio between the two.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use trainmem_sim::plan::DeviceKind;
use trainmem_sim::{Plan, SimOptions, simulate};

/// Arguments of `bench sim`.
#[derive(Debug, clap::Args)]
pub struct SimBenchArgs {
    /// The plan to simulate (default: fixtures/plans/llama-7b-zero3.toml).
    #[arg(long)]
    plan: Option<PathBuf>,
    /// Override the number of steps.
    #[arg(long)]
    steps: Option<u64>,
    /// Timed repetitions (the fastest is reported).
    #[arg(long, default_value_t = 3)]
    reps: u32,
}

fn time_run(plan: &Plan, reps: u32) -> anyhow::Result<(f64, trainmem_sim::SimResult)> {
    let mut best = f64::INFINITY;
    let mut last = None;
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        let r = simulate(plan, SimOptions::default())?;
        best = best.min(t.elapsed().as_secs_f64());
        last = Some(r);
    }
    Ok((best, last.expect("at least one repetition")))
}

/// Runs the benchmark.
pub fn run(args: SimBenchArgs) -> anyhow::Result<ExitCode> {
    let path = args.plan.unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures/plans/llama-7b-zero3.toml")
    });
    let mut plan = Plan::load(&path).with_context(|| format!("loading {}", path.display()))?;
    if let Some(s) = args.steps {
        plan.training.steps_per_epoch = Some(s);
        plan.training.epochs = 1;
        plan.training.max_steps = None;
    }
    let (secs, r) = time_run(&plan, args.reps)?;
    let s = &r.summary;
    if let Some(oom) = &s.oom {
        anyhow::bail!("the benchmark plan ran out of memory: {}", oom.message);
    }
    let events = 2 * s.allocations; // every allocation is freed
    println!(
        "plan: {} ({} parameters, {} steps)",
        path.display(),
        s.parameters,
        s.steps
    );
    println!(
        "caching allocator: {:.3} s, {} allocator events, {:.1} M events/s, {:.0} steps/s, {} samples",
        secs,
        events,
        events as f64 / secs / 1e6,
        s.steps as f64 / secs,
        r.timeline.samples.len()
    );
    let mut exact = plan.clone();
    exact.device.kind = DeviceKind::Cpu;
    let (secs_exact, r2) = time_run(&exact, args.reps)?;
    println!(
        "exact counting (no allocator): {:.3} s, {:.1} M events/s",
        secs_exact,
        2.0 * r2.summary.allocations as f64 / secs_exact / 1e6
    );
    println!(
        "ratio caching / exact: {:.2}x; target 1,000 steps of a 7B plan under 1 s: {}",
        secs / secs_exact,
        if s.steps >= 1000 && secs < 1.0 {
            "met"
        } else {
            "not met"
        }
    );
    Ok(ExitCode::SUCCESS)
}
