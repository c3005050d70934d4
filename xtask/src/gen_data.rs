//! `cargo xtask gen-data` (being built).

use std::process::ExitCode;

/// Arguments of `gen-data`.
#[derive(Debug, clap::Args)]
pub struct GenDataArgs {}

/// Writes fixture data sets.
pub fn run(_args: GenDataArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("gen-data is not built yet")
}
