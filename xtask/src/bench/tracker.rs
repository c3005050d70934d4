//! `cargo xtask bench tracker`: what trainmem-track's `Tracked<B>` layer costs a measured run.
//!
//! Trains each CPU scenario plan for real (Flex, in this process) with the tracker and without
//! it, alternating the two, and prints per plan the median of the per-pair ratios
//! (tracked / bare wall time). The target: every plan's median at most 1.1. Exits 1 when one
//! is above it.

use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
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
    /// Steps per epoch and epochs are cut to these, to keep a pair short.
    #[arg(long, default_value_t = 4)]
    steps: u64,
    /// The largest median ratio a plan may show.
    #[arg(long, default_value_t = 1.1)]
    target: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn time_run(plan: &Plan, tracked: bool) -> anyhow::Result<f64> {
    let opts = RunOptions {
        track_tensors: tracked,
        ..RunOptions::default()
    };
    let t = Instant::now();
    let run = run_measured_detailed(plan, opts)?;
    let secs = t.elapsed().as_secs_f64();
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
        "tracked / bare wall time of a measured Flex run, {} alternated pairs per plan (the \
         order flips every pair)",
        args.pairs
    );
    println!("| plan | bare, median ms | tracked, median ms | ratio, median (min–max) |");
    println!("|---|---:|---:|---:|");
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
        let (mut bare, mut tracked, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for pair in 0..args.pairs {
            let (b, t) = if pair % 2 == 0 {
                let b = time_run(&plan, false)?;
                (b, time_run(&plan, true)?)
            } else {
                let t = time_run(&plan, true)?;
                (time_run(&plan, false)?, t)
            };
            bare.push(b);
            tracked.push(t);
            ratios.push(t / b);
        }
        let lo = ratios.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = ratios.iter().copied().fold(0.0, f64::max);
        let m = median(ratios);
        println!(
            "| {name} | {:.1} | {:.1} | {m:.3} ({lo:.3}–{hi:.3}) |",
            median(bare) * 1e3,
            median(tracked) * 1e3
        );
        medians.push(m);
    }
    let worst = medians.iter().copied().fold(0.0, f64::max);
    let pass = worst <= args.target;
    println!(
        "\nlargest median ratio {worst:.3}, median over the plans {:.3} (target: every plan ≤ {}): {}",
        median(medians),
        args.target,
        if pass { "PASS" } else { "FAIL" }
    );
    Ok(if pass {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
