//! The `trainmem` command-line tool.
//!
//! Each subcommand lives in its own module; `main` only parses and dispatches.

// The one exception, `die_quietly_on_broken_pipe`, allows it for its one call.
#![deny(unsafe_code)]

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Host bytes per category for measured scenario runs (trainmem-probe's counting allocator).
#[global_allocator]
static ALLOC: trainmem_probe::CountingAlloc = trainmem_probe::CountingAlloc::new();

mod cmd_data;
mod cmd_plan;
mod cmd_replay;
mod cmd_sim;
mod data_describe;
mod explain_snapshot;
mod progress;
mod replay_snapshot;
mod replay_what_if;

/// Explain and predict the memory of deep-learning training.
#[derive(Debug, Parser)]
#[command(name = "trainmem", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Reproduce a memory pattern on a real burn training run beside its prediction
    /// (`--list` names the fifteen patterns; files go to `trainmem-scenarios/NAME/`).
    Scenario(trainmem::scenario_command::ScenarioArgs),
    /// Replay an allocation trace through the caching allocator and print its statistics.
    #[command(after_help = cmd_replay::EXIT_STATUS_HELP)]
    Replay(cmd_replay::ReplayArgs),
    /// Inspect data-set files (memory-mapped .npy and raw record files).
    #[command(subcommand)]
    Data(cmd_data::DataCommand),
    /// Simulate a training plan and print its memory timeline and report.
    Simulate(cmd_sim::SimulateArgs),
    /// Find the largest batch (or micro-batch) of a plan that fits a device capacity.
    Fit(cmd_sim::FitArgs),
    /// Explain a plan's memory patterns in words, or what filled the GPU in a PyTorch
    /// memory snapshot (by category and source line) and what would have saved it.
    #[command(after_help = explain_snapshot::EXPLAIN_HELP)]
    Explain(cmd_sim::ExplainArgs),
    /// Write plans from descriptions you already have (`from-hf config.json`).
    #[command(subcommand)]
    Plan(cmd_plan::PlanCommand),
}

fn main() -> ExitCode {
    // Started again to make one measured scenario run in a fresh process.
    if let Some(code) = trainmem_scenarios::serve_child() {
        return code;
    }
    die_quietly_on_broken_pipe();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Scenario(args) => {
            trainmem::scenario_command::run(args, std::path::Path::new("trainmem-scenarios"))
                .map_err(anyhow::Error::from)
        }
        Command::Replay(args) => cmd_replay::run(args),
        Command::Data(cmd) => cmd_data::run(cmd),
        Command::Simulate(args) => cmd_sim::simulate(args),
        Command::Fit(args) => cmd_sim::fit(args),
        Command::Explain(args) => explain_snapshot::explain(args),
        Command::Plan(cmd) => cmd_plan::run(cmd),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// Lets a closed standard output or error end the process quietly, as it ends `cat` or
/// `grep` (`trainmem simulate PLAN | head -1`): restores SIGPIPE's default action, which
/// Rust's runtime sets to "ignore" before `main`, so that a write to a closed pipe would
/// fail and `println!` panic with a backtrace. The process ends by the signal.
#[cfg(unix)]
#[allow(unsafe_code)]
fn die_quietly_on_broken_pipe() {
    // SAFETY: `signal` is given a valid signal number and the default action, not a handler,
    // so no code of ours ever runs in a signal context. It is called once, from `main` before
    // any thread is started, so no other thread changes signal dispositions at the same time.
    // Nothing in this process relies on SIGPIPE being ignored: it reads its children's output
    // and writes only to its own standard streams and to files. The result (the previous
    // action, or SIG_ERR, which cannot happen for SIGPIPE) is not needed. Held by the
    // `broken_pipe` tests, which close the reading end of stdout before trainmem writes.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Elsewhere a write to a closed pipe is an error like any other.
#[cfg(not(unix))]
fn die_quietly_on_broken_pipe() {}
