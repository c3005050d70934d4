//! `trainmem replay` (being built).

use std::process::ExitCode;

/// Arguments of `trainmem replay`.
#[derive(Debug, clap::Args)]
pub struct ReplayArgs {}

/// Runs `trainmem replay`.
pub fn run(_args: ReplayArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("trainmem replay is not built yet")
}
