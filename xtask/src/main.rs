//! `cargo xtask`: trainmem's task runner.
//!
//! * `cargo xtask scenario NAME|all|--list`: run a memory scenario (see `scenario`).
//! * `cargo xtask bench alloc|loader|sim`: side-by-side benchmarks that print ratios.
//! * `cargo xtask gen-data`: write deterministic fixture data sets.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod bench;
mod gen_data;
mod scenario;

/// Host bytes per category for measured scenario runs (trainmem-probe's counting allocator).
#[global_allocator]
static ALLOC: trainmem_probe::CountingAlloc = trainmem_probe::CountingAlloc::new();

#[derive(Debug, Parser)]
#[command(name = "cargo xtask", about = "trainmem's task runner")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a memory scenario: the pattern reproduced, with its simulated twin.
    Scenario(scenario::ScenarioArgs),
    /// Run a side-by-side benchmark and print ratios.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Write deterministic fixture data sets.
    GenData(gen_data::GenDataArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Scenario(args) => scenario::run(args),
        Command::Bench(cmd) => bench::run(cmd),
        Command::GenData(args) => gen_data::run(args),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
