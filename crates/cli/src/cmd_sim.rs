//! `trainmem simulate`, `fit` and `explain` (being built).

use std::process::ExitCode;

/// Arguments of `trainmem simulate`.
#[derive(Debug, clap::Args)]
pub struct SimulateArgs {}
/// Arguments of `trainmem fit`.
#[derive(Debug, clap::Args)]
pub struct FitArgs {}
/// Arguments of `trainmem explain`.
#[derive(Debug, clap::Args)]
pub struct ExplainArgs {}

/// Runs `trainmem simulate`.
pub fn simulate(_args: SimulateArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("trainmem simulate is not built yet")
}
/// Runs `trainmem fit`.
pub fn fit(_args: FitArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("trainmem fit is not built yet")
}
/// Runs `trainmem explain`.
pub fn explain(_args: ExplainArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("trainmem explain is not built yet")
}
