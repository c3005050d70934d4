//! `cargo xtask bench alloc` (being built).

use std::process::ExitCode;

/// Arguments of `bench alloc`.
#[derive(Debug, clap::Args)]
pub struct AllocBenchArgs {}

/// Runs the benchmark.
pub fn run(_args: AllocBenchArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("bench alloc is not built yet")
}
