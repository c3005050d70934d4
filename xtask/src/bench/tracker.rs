//! `cargo xtask bench tracker`: what trainmem-track's `Tracked<B>` layer costs a measured run.
//!
//! Trains each CPU scenario plan for real (Flex, in this process) with the tracker and without
//! it, alternating the two, and prints per plan the median of the per-pair ratios of the
//! process's CPU time (user + system, all threads: the training thread and the loader's
//! workers), which other work on a shared machine disturbs far less than wall time; the wall
//! time's median ratio is printed beside it. The target: every plan's median CPU-time ratio at
//! most 1.1. Exits 1 when one is above it.

use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;

use super::loader::timing::Spread;
use trainmem_burn::{RunOptions, run_measured_detailed};
use trainmem_core::Plan;

/// Arguments of `bench tracker`.
#[derive(Debug, clap::Args)]
pub struct TrackerBenchArgs {
    /// Alternated pairs of runs per plan (at least 5).
    #[arg(long, default_value_t = 5)]
    pairs: u32,
    /// Scenario plans to run (default: every plan that trains on the CPU).
    #[arg(long)]
    plan: Vec<String>,
    /// Steps per epoch are cut to this (and epochs to 2), to keep a pair short.
    #[arg(long, default_value_t = 8)]
    steps: u64,
    /// The largest median ratio a plan may show.
    #[arg(long, default_value_t = 1.1)]
    target: f64,
}

/// The process's CPU time so far (user + system, every thread), in seconds.
fn cpu_seconds() -> f64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `getrusage` writes a `rusage` into the pointer it is given, which points to
    // enough zeroed memory for one; RUSAGE_SELF is always a valid target.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) };
    if rc != 0 {
        return f64::NAN;
    }
    // SAFETY: `getrusage` returned 0, so it filled the struct (and it was zeroed before).
    let usage = unsafe { usage.assume_init() };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

/// One run's (CPU seconds, wall seconds).
fn time_run(plan: &Plan, tracked: bool) -> anyhow::Result<(f64, f64)> {
    let opts = RunOptions {
        track_tensors: tracked,
        ..RunOptions::default()
    };
    let (cpu, t) = (cpu_seconds(), Instant::now());
    let run = run_measured_detailed(plan, opts)?;
    let secs = (cpu_seconds() - cpu, t.elapsed().as_secs_f64());
    anyhow::ensure!(
        run.samples.iter().all(|s| s.tracked.is_some() == tracked),
        "the run's samples do not say tracked = {tracked}"
    );
    Ok(secs)
}

/// Runs the benchmark.
pub fn run(args: TrackerBenchArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(args.pairs >= 5, "--pairs must be at least 5");
    let plans: Vec<(&str, &str)> = trainmem_scenarios::plans::PLANS
        .iter()
        .filter(|(name, _)| *name != "model-parallel")
        .filter(|(name, _)| args.plan.is_empty() || args.plan.iter().any(|p| p == name))
        .copied()
        .collect();
    anyhow::ensure!(
        !plans.is_empty(),
        "no scenario plan matches {:?}",
        args.plan
    );
    println!(
        "tracked / bare CPU time of a measured Flex run, {} alternated pairs per plan (the \
         order flips every pair)",
        args.pairs
    );
    println!(
        "| plan | bare CPU, median ms | tracked CPU, median ms | CPU ratio, median (min–max) | wall ratio, median |"
    );
    println!("|---|---:|---:|---:|---:|");
    let mut medians = Vec::new();
    for (name, text) in plans {
        let mut plan = Plan::from_toml_str(text).with_context(|| format!("plan {name}"))?;
        plan.training.epochs = plan.training.epochs.min(2);
        plan.training.steps_per_epoch = Some(
            plan.training
                .steps_per_epoch
                .unwrap_or(args.steps)
                .min(args.steps),
        );
        // One untimed run of each warms the fixture files and the page cache.
        time_run(&plan, false)?;
        time_run(&plan, true)?;
        let (mut bare, mut tracked, mut ratios, mut wall) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for pair in 0..args.pairs {
            let (b, t) = if pair % 2 == 0 {
                let b = time_run(&plan, false)?;
                (b, time_run(&plan, true)?)
            } else {
                let t = time_run(&plan, true)?;
                (time_run(&plan, false)?, t)
            };
            bare.push(b.0);
            tracked.push(t.0);
            ratios.push(t.0 / b.0);
            wall.push(t.1 / b.1);
        }
        let r = Spread::of(&ratios);
        println!(
            "| {name} | {:.1} | {:.1} | {:.3} ({:.3}–{:.3}) | {:.3} |",
            Spread::of(&bare).median * 1e3,
            Spread::of(&tracked).median * 1e3,
            r.median,
            r.min,
            r.max,
            Spread::of(&wall).median
        );
        let m = r.median;
        medians.push(m);
    }
    let worst = medians.iter().copied().fold(0.0, f64::max);
    let pass = worst <= args.target;
    println!(
        "\nlargest median ratio {worst:.3}, median over the plans {:.3} (target: every plan ≤ {}): {}",
        Spread::of(&medians).median,
        args.target,
        if pass { "PASS" } else { "FAIL" }
    );
    Ok(if pass {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
