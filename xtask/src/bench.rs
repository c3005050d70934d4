//! `cargo xtask bench`: side-by-side benchmarks that print ratios measured in one run.

use std::process::ExitCode;

mod alloc;
mod explain;
mod from_hf;
mod handover;
mod loader;
mod loader_formats;
mod pinning;
mod replay;
mod sim;
mod tracker;

/// Benchmarks.
#[derive(Debug, clap::Subcommand)]
pub enum BenchCommand {
    /// The caching allocator against cubecl's memory manager and a naive first-fit baseline.
    Alloc(alloc::AllocBenchArgs),
    /// The memory-mapped prefetching loader against memcpy, burn's loader and PyTorch's.
    Loader(loader::LoaderBenchArgs),
    /// The loader on token windows and an Arrow list column against memcpy, 0/1/2/4 workers.
    LoaderFormats(loader_formats::LoaderFormatsBenchArgs),
    /// The simulator's speed on a large plan.
    Sim(sim::SimBenchArgs),
    /// `plan from-hf` of a 7B model with a peft adapter, then `simulate`, as processes: under
    /// 1 s together.
    FromHf(from_hf::FromHfBenchArgs),
    /// `trainmem explain SNAPSHOT.pickle`'s speed on synthetic snapshots of 1 M and 4 M trace
    /// events, and the ratio of the two.
    Explain(explain::ExplainBenchArgs),
    /// `trainmem replay`'s speed on the largest shared PyTorch snapshot, in events per second.
    Replay(replay::ReplayBenchArgs),
    /// What trainmem-track's `Tracked<B>` layer costs a measured run (tracked / bare).
    Tracker(tracker::TrackerBenchArgs),
}

/// Runs a benchmark.
pub fn run(cmd: BenchCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        BenchCommand::Alloc(args) => alloc::run(args),
        BenchCommand::Loader(args) => loader::run(args),
        BenchCommand::LoaderFormats(args) => loader_formats::run(args),
        BenchCommand::Sim(args) => sim::run(args),
        BenchCommand::FromHf(args) => from_hf::run(args),
        BenchCommand::Replay(args) => replay::run(args),
        BenchCommand::Tracker(args) => tracker::run(args),
        BenchCommand::Explain(args) => explain::run(args),
    }
}

/// Runs `copy(t, destination)` for each thread's destination `t`: on this thread when there is
/// one, else on one scoped thread each (the copy bounds of the loader benches).
fn on_threads<T: Send>(dst: &mut [T], copy: impl Fn(usize, &mut T) + Sync) {
    if dst.len() <= 1 {
        if let Some(mine) = dst.first_mut() {
            copy(0, mine);
        }
        return;
    }
    spawn_each(dst, copy);
}

/// Runs `copy(t, destination)` for each thread's destination `t`, each on a scoped thread of
/// its own (even a single one).
fn spawn_each<T: Send>(dst: &mut [T], copy: impl Fn(usize, &mut T) + Sync) {
    let copy = &copy;
    std::thread::scope(|scope| {
        for (t, mine) in dst.iter_mut().enumerate() {
            scope.spawn(move || copy(t, mine));
        }
    });
}
