//! `cargo xtask bench replay [--snapshot FILE] [--reps N]`: how fast `trainmem replay` replays
//! a PyTorch snapshot, in trace events per second, measured in one run beside the previous
//! replay (from an empty allocator, frees of blocks allocated before the trace skipped) and
//! beside the allocator bench's generated training trace through the same replay engine.
//!
//! The snapshot defaults to the shared snapshot with the most trace events (the project's
//! `../shared/pytorch-snapshots`, or `$TRAINMEM_SHARED_DIR/pytorch-snapshots`). Reading the
//! pickle is not timed; rebuilding the start state and seeding the allocator is timed
//! separately from applying the ops. Each figure is the median of `--reps` runs.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use trainmem_alloc::AllocatorConfig;
use trainmem_alloc::Snapshot;
use trainmem_alloc::pytorch::replay::{Op, Origin, Replayer, ops_from_trace, prepare};

use super::alloc::workload::{self, WorkloadConfig};

/// The replay target, in trace events per second.
const TARGET_EVENTS_PER_S: f64 = 5e6;

/// Arguments of `bench replay`.
#[derive(Debug, clap::Args)]
pub struct ReplayBenchArgs {
    /// The snapshot pickle (default: the shared snapshot with the most trace events).
    #[arg(long)]
    snapshot: Option<PathBuf>,
    /// Timed repetitions per replay (the median is reported).
    #[arg(long, default_value_t = 51)]
    reps: u32,
    /// Steps of the allocator bench's generated trace.
    #[arg(long, default_value_t = 200)]
    steps: u32,
}

/// The shared snapshots, the one with the most events first.
fn largest_shared_snapshot() -> anyhow::Result<(PathBuf, Snapshot)> {
    let shared = std::env::var_os("TRAINMEM_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared"));
    let dir = shared.join("pytorch-snapshots");
    let mut best: Option<(usize, PathBuf, Snapshot)> = None;
    for path in pickles(&dir).with_context(|| format!("listing {}", dir.display()))? {
        let snap = read(&path)?;
        let events: usize = snap.device_traces.iter().map(Vec::len).sum();
        if best.as_ref().is_none_or(|(n, _, _)| events > *n) {
            best = Some((events, path, snap));
        }
    }
    match best {
        Some((_, path, snap)) => Ok((path, snap)),
        None => bail!(
            "no snapshot pickles under {}; pass --snapshot",
            dir.display()
        ),
    }
}

/// Every `*.pickle` under `dir`.
fn pickles(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            out.extend(pickles(&path)?);
        } else if path.extension().is_some_and(|e| e == "pickle") {
            out.push(path);
        }
    }
    out.sort();
    Ok(out)
}

fn read(path: &Path) -> anyhow::Result<Snapshot> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    trainmem_alloc::pytorch::pickle::from_bytes(&bytes)
        .with_context(|| format!("reading {}", path.display()))
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

/// The median of `reps` timings of `f`, which returns the time it measured.
fn measure(reps: u32, mut f: impl FnMut() -> anyhow::Result<Duration>) -> anyhow::Result<Duration> {
    let mut times = Vec::with_capacity(reps as usize);
    for _ in 0..reps.max(1) {
        times.push(f()?);
    }
    Ok(median(times))
}

fn rate(events: usize, t: Duration) -> f64 {
    events as f64 / t.as_secs_f64().max(1e-12)
}

/// Runs the benchmark.
pub fn run(args: ReplayBenchArgs) -> anyhow::Result<ExitCode> {
    let (path, snap) = match &args.snapshot {
        Some(p) => (p.clone(), read(p)?),
        None => largest_shared_snapshot()?,
    };
    let events = snap.device_traces.first().map_or(0, Vec::len);
    let capacity = 1u64 << 50;
    // Rebuilding the start state and seeding the allocator.
    let setup = measure(args.reps, || {
        let t = Instant::now();
        let r = prepare(&snap, 0, capacity, None)?;
        let took = t.elapsed();
        drop(r);
        Ok(took)
    })?;
    let mut ops = 0usize;
    let seeded = measure(args.reps, || {
        let mut r = prepare(&snap, 0, capacity, None)?;
        ops = r.ops.len();
        let todo = std::mem::take(&mut r.ops);
        let t = Instant::now();
        for (at, op) in todo {
            r.replayer.apply(at, op)?;
        }
        Ok(t.elapsed())
    })?;
    let previous = measure(args.reps, || {
        let (todo, _) = ops_from_trace(&snap, 0)?;
        let mut r = Replayer::simulated(capacity, AllocatorConfig::default());
        let t = Instant::now();
        r.apply_all(todo)?;
        Ok(t.elapsed())
    })?;
    let work = workload::generate(&WorkloadConfig::transformer(args.steps));
    let generated: Vec<(Origin, Op)> = work
        .ops
        .iter()
        .enumerate()
        .map(|(i, op)| {
            let op = match *op {
                workload::Op::Alloc { slot, size } => Op::alloc(u64::from(slot), size, 0),
                workload::Op::Free { slot } => Op::Free {
                    id: u64::from(slot),
                },
            };
            (Origin::Event(i as u64), op)
        })
        .collect();
    let bench_trace = measure(args.reps.min(11), || {
        let todo = generated.clone();
        let mut r = Replayer::simulated(capacity, AllocatorConfig::default());
        let t = Instant::now();
        r.apply_all(todo)?;
        Ok(t.elapsed())
    })?;
    println!(
        "snapshot: {} ({events} trace events, {ops} ops replayed)",
        path.display()
    );
    println!("median of {} runs:", args.reps);
    let rows = [
        ("rebuilt start, replay (trainmem replay)", events, seeded),
        ("empty start, replay (previous replay)", events, previous),
        (
            "allocator bench trace, replay engine",
            generated.len(),
            bench_trace,
        ),
    ];
    for (name, n, t) in rows {
        println!(
            "  {name:<42} {:>9.3} ms  {:>7.2} M events/s",
            t.as_secs_f64() * 1e3,
            rate(n, t) / 1e6
        );
    }
    println!(
        "  {:<42} {:>9.3} ms  (rebuilding the start state and seeding the allocator)",
        "start state",
        setup.as_secs_f64() * 1e3
    );
    let r = rate(events, seeded);
    let verdict = if r >= TARGET_EVENTS_PER_S {
        "meets"
    } else {
        "misses"
    };
    println!(
        "replay: {:.2} M trace events/s, {verdict} the target of {:.0} M/s",
        r / 1e6,
        TARGET_EVENTS_PER_S / 1e6
    );
    Ok(ExitCode::SUCCESS)
}
