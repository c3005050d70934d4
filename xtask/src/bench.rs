//! `cargo xtask bench` (being built).

use std::process::ExitCode;

/// Benchmarks.
#[derive(Debug, clap::Subcommand)]
pub enum BenchCommand {}

/// Runs a benchmark.
pub fn run(cmd: BenchCommand) -> anyhow::Result<ExitCode> {
    match cmd {}
}
