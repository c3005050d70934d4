//! `cargo xtask bench explain [--events N] [--times K] [--reps R]`: how fast
//! `trainmem explain SNAPSHOT.pickle` explains a snapshot, and how its cost grows with the
//! trace. A synthetic training loop (trainmem-sim's `snapshot_explain::synthetic`: a model
//! moved to the device, then steps of zero_grad, a batch, forward, backward and AdamW, every
//! entry with a stack of about 30 frames shared as PyTorch shares them) is written as a
//! pickle of `--events` trace entries and of `--times` as many, and both are explained in
//! one run: reading the pickle with its stacks and explaining it with the replayed
//! remedies, as the command does (writing the pickle is not timed). Each figure is the
//! median of `--reps` runs; the ratio of the two totals is about `--times` when the cost is
//! linear in the entries. Beside each wall time, the processor time of the process (all its
//! threads: the replayed remedies run side by side) says how much of it the machine's other
//! work took.
//!
//! `--without-frames` writes the same loops without stacks, so that the steps are inferred
//! from the trace's shape (`snapshot_explain::shape`), under the same targets.
//!
//! Exits 1 when the smaller snapshot, scaled to a million entries, takes more than 2 s, or
//! when the ratio is more than [`LINEAR_SLACK`] times `--times` (a cost that grows faster
//! than the entries).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use trainmem_alloc::pytorch::framed::FramedSnapshot;
use trainmem_sim::snapshot_explain::synthetic::SyntheticLoop;
use trainmem_sim::snapshot_explain::{ExplainOptions, explain_snapshot};

/// The target for a snapshot of a million trace entries.
const TARGET_1M: Duration = Duration::from_secs(2);

/// How far above `--times` the ratio may be and still count as linear (5 for 4×).
const LINEAR_SLACK: f64 = 1.25;

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
    /// Write the snapshots without stacks: the steps are then inferred from the trace's
    /// shape (`snapshot_explain::shape`).
    #[arg(long)]
    without_frames: bool,
}

/// One snapshot's timings.
struct Timing {
    events: usize,
    pickle_bytes: usize,
    read: Duration,
    explain: Duration,
    /// Processor time of the process over read and explain.
    cpu: Duration,
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

/// Processor time of the whole process so far (user and system, all threads).
fn process_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through the valid pointer it is given
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(
        ts.tv_sec.max(0) as u64,
        ts.tv_nsec.clamp(0, 999_999_999) as u32,
    )
}

fn measure(layers: usize, events: usize, reps: u32, frames: bool) -> anyhow::Result<Timing> {
    let snap = SyntheticLoop {
        with_frames: frames,
        ..SyntheticLoop::with_events(layers, events)
    }
    .build();
    let opts = ExplainOptions::default();
    let (mut reads, mut explains, mut cpus) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..reps.max(1) {
        let cpu = process_cpu();
        let t = Instant::now();
        let f = FramedSnapshot::read(&snap.bytes)?;
        let read = t.elapsed();
        let t = Instant::now();
        let ex = explain_snapshot(&f, &opts)?;
        let explain = t.elapsed();
        cpus.push(process_cpu().saturating_sub(cpu));
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
        cpu: median(cpus),
    })
}

/// Runs the benchmark.
pub fn run(args: ExplainBenchArgs) -> anyhow::Result<ExitCode> {
    let frames = !args.without_frames;
    let small = measure(args.layers, args.events, args.reps, frames)?;
    let large = measure(
        args.layers,
        args.events * args.times.max(1),
        args.reps,
        frames,
    )?;
    println!(
        "synthetic training loop, {} layers, {}, median of {} runs (read: the pickle with its \
         stacks; explain: categories, moments, steps, allocator replay, replayed remedies):",
        args.layers,
        if frames {
            "with stacks"
        } else {
            "without stacks (steps inferred from the trace's shape)"
        },
        args.reps
    );
    for t in [&small, &large] {
        println!(
            "  {:>9} events  {:>7.1} MB pickle  read {:>8.1} ms  explain {:>8.1} ms  total \
             {:>8.1} ms  {:>5.2} M events/s  (processor {:>8.1} ms)",
            t.events,
            t.pickle_bytes as f64 / 1e6,
            t.read.as_secs_f64() * 1e3,
            t.explain.as_secs_f64() * 1e3,
            t.total().as_secs_f64() * 1e3,
            t.events as f64 / t.total().as_secs_f64().max(1e-12) / 1e6,
            t.cpu.as_secs_f64() * 1e3,
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
    let fast = per_million <= TARGET_1M.as_secs_f64();
    let linear = ratio <= events_ratio * LINEAR_SLACK;
    println!(
        "explain: {per_million:.2} s per million trace events, {} the target of {} s; cost \
         {} in the entries (ratio {ratio:.2} for {events_ratio:.2}x, at most {:.2} allowed)",
        if fast { "meets" } else { "misses" },
        TARGET_1M.as_secs(),
        if linear { "linear" } else { "NOT linear" },
        events_ratio * LINEAR_SLACK,
    );
    Ok(if fast && linear {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
