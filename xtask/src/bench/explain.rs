//! `cargo xtask bench explain [--events N] [--times K] [--reps R]`: how fast
//! `trainmem explain SNAPSHOT.pickle` explains a snapshot, and how its cost grows with the
//! trace. A synthetic training loop (trainmem-sim's `snapshot_explain::synthetic`: a model
//! moved to the device, then steps of zero_grad, a batch, forward, backward and AdamW, every
//! entry with a stack of about 30 frames shared as PyTorch shares them) is written as a
//! pickle of `--events` trace entries and of `--times` as many, and both are explained in
//! one run: reading the pickle with its stacks and explaining it with the replayed
//! remedies, as the command does (writing the pickle is not timed). Each figure is the
//! median of `--reps` runs; the ratio of the two totals is about `--times` when the cost is
//! linear in the entries.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use trainmem_alloc::pytorch::framed::FramedSnapshot;
use trainmem_sim::snapshot_explain::synthetic::SyntheticLoop;
use trainmem_sim::snapshot_explain::{ExplainOptions, explain_snapshot};

/// The target for a snapshot of a million trace entries.
const TARGET_1M: Duration = Duration::from_secs(2);

/// Arguments of `bench explain`.
#[derive(Debug, clap::Args)]
pub struct ExplainBenchArgs {
    /// Trace entries of the smaller snapshot.
    #[arg(long, default_value_t = 1_000_000)]
    events: usize,
    /// How many times as many entries the larger snapshot has.
    #[arg(long, default_value_t = 4)]
    times: usize,
    /// Layers of the synthetic model.
    #[arg(long, default_value_t = 24)]
    layers: usize,
    /// Timed repetitions per snapshot (the median is reported).
    #[arg(long, default_value_t = 3)]
    reps: u32,
}

/// One snapshot's timings.
struct Timing {
    events: usize,
    pickle_bytes: usize,
    read: Duration,
    explain: Duration,
}

impl Timing {
    fn total(&self) -> Duration {
        self.read + self.explain
    }
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn measure(layers: usize, events: usize, reps: u32) -> anyhow::Result<Timing> {
    let snap = SyntheticLoop::with_events(layers, events).build();
    let opts = ExplainOptions::default();
    let (mut reads, mut explains) = (Vec::new(), Vec::new());
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        let f = FramedSnapshot::read(&snap.bytes)?;
        let read = t.elapsed();
        let t = Instant::now();
        let ex = explain_snapshot(&f, &opts)?;
        let explain = t.elapsed();
        // the whole explanation was made: the steps, the allocator's replay, the remedies
        anyhow::ensure!(
            ex.steps.len() > 1 && ex.allocator.is_some() && !ex.remedies.is_empty(),
            "the synthetic loop was not explained in full: {:?}",
            ex.notes
        );
        reads.push(read);
        explains.push(explain);
        // the tree and the explanation are dropped outside the timed parts
        drop((f, ex));
    }
    Ok(Timing {
        events: snap.events,
        pickle_bytes: snap.bytes.len(),
        read: median(reads),
        explain: median(explains),
    })
}

/// Runs the benchmark.
pub fn run(args: ExplainBenchArgs) -> anyhow::Result<ExitCode> {
    let small = measure(args.layers, args.events, args.reps)?;
    let large = measure(args.layers, args.events * args.times.max(1), args.reps)?;
    println!(
        "synthetic training loop, {} layers, median of {} runs (read: the pickle with its \
         stacks; explain: categories, moments, steps, allocator replay, replayed remedies):",
        args.layers, args.reps
    );
    for t in [&small, &large] {
        println!(
            "  {:>9} events  {:>7.1} MB pickle  read {:>8.1} ms  explain {:>8.1} ms  total \
             {:>8.1} ms  {:>5.2} M events/s",
            t.events,
            t.pickle_bytes as f64 / 1e6,
            t.read.as_secs_f64() * 1e3,
            t.explain.as_secs_f64() * 1e3,
            t.total().as_secs_f64() * 1e3,
            t.events as f64 / t.total().as_secs_f64().max(1e-12) / 1e6,
        );
    }
    let ratio = large.total().as_secs_f64() / small.total().as_secs_f64().max(1e-12);
    let events_ratio = large.events as f64 / small.events.max(1) as f64;
    println!(
        "ratio {events_ratio:.2}x events / 1x: {ratio:.2} (linear: {events_ratio:.2}; read \
         {:.2}, explain {:.2})",
        large.read.as_secs_f64() / small.read.as_secs_f64().max(1e-12),
        large.explain.as_secs_f64() / small.explain.as_secs_f64().max(1e-12),
    );
    // the target is for a million entries: scale the smaller run to it
    let per_million = small.total().as_secs_f64() * 1e6 / small.events.max(1) as f64;
    let verdict = if per_million <= TARGET_1M.as_secs_f64() {
        "meets"
    } else {
        "misses"
    };
    println!(
        "explain: {per_million:.2} s per million trace events, {verdict} the target of {} s",
        TARGET_1M.as_secs()
    );
    Ok(ExitCode::SUCCESS)
}
