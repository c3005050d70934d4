//! `cargo xtask scenario` (being built).

use std::process::ExitCode;

/// Arguments of `scenario`.
#[derive(Debug, clap::Args)]
pub struct ScenarioArgs {}

/// Runs a scenario.
pub fn run(_args: ScenarioArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("scenarios are not built yet")
}
