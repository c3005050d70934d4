//! `cargo xtask`: trainmem's task runner.
//!
//! * `cargo xtask scenario NAME|all|--list`: run a memory scenario (trainmem-scenarios; the
//!   same command as `trainmem scenario`, with files under `target/scenarios/`).
//! * `cargo xtask bench alloc|loader|sim|replay|explain`: side-by-side benchmarks that print ratios.
//! * `cargo xtask gen-data`: write deterministic fixture data sets.
//! * `cargo xtask gpu-check`: every GPU check in one command, one JSON file per device.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod bench;
mod gen_data;
mod gpu_check;
mod meta;
mod unused_deps;
mod validate;

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
    Scenario(trainmem::scenario_command::ScenarioArgs),
    /// Run a side-by-side benchmark and print ratios.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Write deterministic fixture data sets.
    GenData(gen_data::GenDataArgs),
    /// One training step of a LLaMA-style decoder of any size on trainmem-meta, with its bytes
    /// per category.
    Meta(meta::MetaArgs),
    /// Everything a lent GPU should show, written to one JSON file per device
    /// (`--backend flex` runs it end to end on the CPU).
    GpuCheck(gpu_check::GpuCheckArgs),
    /// Compare the twin with recorded real runs (`validate pytorch`).
    #[command(subcommand)]
    Validate(validate::ValidateCommand),
    /// Check that every dependency a workspace member declares is named in its code.
    UnusedDeps,
}

/// The workspace's target directory (`CARGO_TARGET_DIR` when set).
fn target_dir() -> std::path::PathBuf {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        return dir.into();
    }
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(|root| root.join("target"))
        .unwrap_or_else(|| "target".into())
}

fn main() -> ExitCode {
    // Started again to make one measured scenario run in a fresh process.
    if let Some(code) = trainmem_scenarios::serve_child() {
        return code;
    }
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Scenario(args) => {
            trainmem::scenario_command::run(args, &target_dir().join("scenarios"))
                .map_err(anyhow::Error::from)
        }
        Command::Bench(cmd) => bench::run(cmd),
        Command::GenData(args) => gen_data::run(args),
        Command::Validate(cmd) => validate::run(cmd),
        Command::Meta(args) => meta::run(args),
        Command::GpuCheck(args) => gpu_check::run(args),
        Command::UnusedDeps => {
            let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .parent()
                .unwrap_or_else(|| std::path::Path::new("."));
            unused_deps::run(root).map(|clean| {
                if clean {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::FAILURE
                }
            })
        }
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
