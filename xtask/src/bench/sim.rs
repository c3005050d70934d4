//! `cargo xtask bench sim [--plan PLAN] [--steps N]`: the simulator's speed on a large plan.
//!
//! Simulates every step of the plan through the caching allocator (no step is skipped) and,
//! in the same run, the same plan over exact byte counting (no allocator), and prints the
//! wall time, allocator events per second, and the ratio between the two.
//!
//! `cargo xtask bench sim --scaling`: how the simulator's cost grows. Three series in one
//! run, side by side: the model's depth doubled (transformer blocks, 2 steps), the steps
//! doubled (a fixed model), the micro-batches per step doubled (gradient accumulation);
//! each row prints the time and its ratio to the row before. Linear cost is 2× per
//! doubling. The times are the simulating thread's processor time (on Linux), so that a
//! machine shared with other work inflates them less than wall time.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use trainmem_core::Plan;
use trainmem_core::plan::DeviceKind;
use trainmem_sim::{SimOptions, simulate};

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
    /// Measure how the cost grows with depth, steps and micro-batches instead.
    #[arg(long)]
    scaling: bool,
    /// Deepest model of the depth series (`--scaling`; starts at 1,000 layers).
    #[arg(long, default_value_t = 16_000)]
    max_layers: u64,
    /// Most steps of the steps series (`--scaling`; starts at 500 steps).
    #[arg(long, default_value_t = 4_000)]
    max_steps: u64,
    /// Most micro-batches per step of the accumulation series (`--scaling`; starts at 1).
    #[arg(long, default_value_t = 64)]
    max_micro_batches: u64,
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
    // As the `trainmem` commands that simulate do: what one simulation frees stays in the
    // heap for the next (without it, past glibc's 64 MiB trim threshold, each simulation
    // faults its heap in again).
    trainmem_probe::heap::retain_freed_heap();
    if args.scaling {
        return scaling(&args);
    }
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

/// A transformer plan (hidden 256) of `layers` blocks, `steps` steps of `micro` micro-batches
/// of one sample, on a device large enough for any of them.
fn scaling_plan(layers: u64, steps: u64, micro: u64) -> anyhow::Result<Plan> {
    let src = format!(
        "name = \"scaling\"\n[model.transformer]\nlayers = {layers}\nhidden = 256\nheads = 4\n\
         seq_len = 128\nvocab = 1000\n[training]\nbatch_size = {micro}\nmicro_batch_size = 1\n\
         epochs = 1\nsteps_per_epoch = {steps}\n[device]\ncapacity = \"100TiB\"\n"
    );
    Ok(Plan::from_toml_str(&src)?)
}

/// Processor time a timed sample gathers at least: the small sizes are simulated several
/// times per sample (the time is per simulation), because the processor time the kernel
/// reports here advances in ticks of a few milliseconds, a tenth of a 1,000-layer run.
const MIN_SAMPLE_SECS: f64 = 0.25;

/// One series: sizes from `first` doubling up to `last`, each timed (fastest of `reps`
/// samples, each sample at least [`MIN_SAMPLE_SECS`] long). The repetitions go round the
/// whole series (every size once, then again), so that a machine that slows down for a
/// while slows every size, not one.
fn series(
    first: u64,
    last: u64,
    reps: u32,
    plan: &dyn Fn(u64) -> anyhow::Result<Plan>,
) -> anyhow::Result<Vec<(u64, f64)>> {
    let mut plans = Vec::new();
    let mut n = first;
    while n <= last {
        plans.push((n, plan(n)?));
        n *= 2;
    }
    let mut best = vec![f64::INFINITY; plans.len()];
    for _ in 0..reps.max(1) {
        for (i, (_, p)) in plans.iter().enumerate() {
            let (wall, cpu0) = (Instant::now(), thread_cpu());
            let mut runs = 0u32;
            let secs = loop {
                let r = simulate(p, SimOptions::default())?;
                if let Some(oom) = &r.summary.oom {
                    anyhow::bail!("the scaling plan ran out of memory: {}", oom.message);
                }
                runs += 1;
                let secs = match (cpu0, thread_cpu()) {
                    (Some(a), Some(b)) => (b - a).as_secs_f64(),
                    _ => wall.elapsed().as_secs_f64(),
                };
                if secs >= MIN_SAMPLE_SECS {
                    break secs;
                }
            };
            best[i] = best[i].min(secs / f64::from(runs));
        }
    }
    Ok(plans.iter().map(|(n, _)| *n).zip(best).collect())
}

/// Time this thread has spent on a processor (Linux: `/proc/thread-self/schedstat`), which
/// a busy machine does not inflate the way it inflates wall time (time spent waiting for a
/// processor is not counted); `None` elsewhere.
fn thread_cpu() -> Option<Duration> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: u64 = text.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(ns))
}

/// Cell `i` of a series: size, time and the ratio to the row before.
fn cell(s: &[(u64, f64)], i: usize) -> String {
    match s.get(i) {
        None => String::new(),
        Some(&(n, t)) => match i.checked_sub(1).and_then(|j| s.get(j)) {
            Some(&(_, prev)) if prev > 0.0 => format!("{n:>6}: {t:>7.3} s {:>5.2}x", t / prev),
            Some(_) => format!("{n:>6}: {t:>7.3} s     -"),
            None => format!("{n:>6}: {t:>7.3} s       "),
        },
    }
}

/// The largest ratio per doubling of a series.
fn worst(s: &[(u64, f64)]) -> f64 {
    s.windows(2)
        .filter(|w| w[0].1 > 0.0)
        .map(|w| w[1].1 / w[0].1)
        .fold(0.0, f64::max)
}

/// `--scaling`: the three series side by side.
fn scaling(args: &SimBenchArgs) -> anyhow::Result<ExitCode> {
    const STEPS_MODEL_LAYERS: u64 = 16;
    const MICRO_SERIES_STEPS: u64 = 200;
    println!(
        "simulator cost per doubling (transformer, hidden 256, seq 128; processor time of the \
         simulating thread where the OS reports it, else wall time, per simulation; fastest of {} \
         samples of at least {MIN_SAMPLE_SECS} s each)",
        args.reps.max(1)
    );
    let depth = series(1_000, args.max_layers, args.reps, &|l| {
        scaling_plan(l, 2, 1)
    })?;
    let steps = series(500, args.max_steps, args.reps, &|s| {
        scaling_plan(STEPS_MODEL_LAYERS, s, 1)
    })?;
    let micro = series(1, args.max_micro_batches, args.reps, &|m| {
        scaling_plan(STEPS_MODEL_LAYERS, MICRO_SERIES_STEPS, m)
    })?;
    let steps_title = format!("steps ({STEPS_MODEL_LAYERS} layers)");
    println!(
        "{:<28}{steps_title:<28}micro-batches ({MICRO_SERIES_STEPS} steps)",
        "depth (layers, 2 steps)"
    );
    for i in 0..depth.len().max(steps.len()).max(micro.len()) {
        println!(
            "{:<28}{:<28}{}",
            cell(&depth, i),
            cell(&steps, i),
            cell(&micro, i)
        );
    }
    let (d, s, m) = (worst(&depth), worst(&steps), worst(&micro));
    let verdict = if d <= 2.2 && s <= 2.2 {
        "met"
    } else {
        "not met"
    };
    println!(
        "largest ratio per doubling: depth {d:.2}x, steps {s:.2}x, micro-batches {m:.2}x; \
         target at most 2.2x for depth and steps: {verdict}"
    );
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scaling_plans_have_the_asked_shape() {
        let p = scaling_plan(3, 5, 4).expect("valid");
        assert_eq!(p.total_steps(), 5);
        assert_eq!(p.accumulation_steps(), 4);
        assert_eq!(p.micro_batch_size(), 1);
        let trainmem_core::ModelSpec::Transformer(t) = &p.model else {
            panic!("a transformer");
        };
        assert_eq!(t.layers, 3);
    }

    #[test]
    fn ratios_are_per_doubling() {
        let s = [(1, 1.0), (2, 2.5), (4, 4.0)];
        assert_eq!(worst(&s), 2.5);
        assert!(cell(&s, 1).ends_with("2.50x"), "{}", cell(&s, 1));
        assert!(cell(&s, 0).trim_end().ends_with("1.000 s"));
        assert_eq!(cell(&s, 3), "");
        // a time too short to measure has no ratio after it
        let z = [(1, 0.0), (2, 1.0)];
        assert!(cell(&z, 1).ends_with('-'), "{}", cell(&z, 1));
        assert_eq!(worst(&z), 0.0);
    }
}
