//! Placeholder while the scenario is being written (not registered as done).

use super::ctx::Ctx;

/// Which bytes cause the pattern and what removes it.
pub const EXPLANATION: &[&str] = &[];

/// Runs the scenario.
pub fn run(_ctx: &mut Ctx) -> anyhow::Result<()> {
    anyhow::bail!("not written yet")
}
