//! `trainmem data` (being built).

use std::process::ExitCode;

/// Subcommands of `trainmem data`.
#[derive(Debug, clap::Subcommand)]
pub enum DataCommand {}

/// Runs `trainmem data ...`.
pub fn run(cmd: DataCommand) -> anyhow::Result<ExitCode> {
    match cmd {}
}
