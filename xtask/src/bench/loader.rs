//! `cargo xtask bench loader` (being built).

use std::process::ExitCode;

/// Arguments of `bench loader`.
#[derive(Debug, clap::Args)]
pub struct LoaderBenchArgs {}

/// Runs the benchmark.
pub fn run(_args: LoaderBenchArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("bench loader is not built yet")
}
