//! `cargo xtask bench sim` (being built).

use std::process::ExitCode;

/// Arguments of `bench sim`.
#[derive(Debug, clap::Args)]
pub struct SimBenchArgs {}

/// Runs the benchmark.
pub fn run(_args: SimBenchArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("bench sim is not built yet")
}
