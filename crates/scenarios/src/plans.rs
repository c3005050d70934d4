//! The scenarios' plans, compiled into the library so a scenario runs from an installed
//! `trainmem` outside any checkout. The files are `crates/scenarios/plans/NAME.toml`; each
//! opens with a comment saying what the plan is built to show.

use super::error::Result;
use trainmem_core::{Plan, PlanError};

/// Every scenario plan: `(name, TOML text)`.
pub const PLANS: &[(&str, &str)] = &[
    (
        "activation-retention",
        include_str!("../plans/activation-retention.toml"),
    ),
    (
        "checkpoint-save",
        include_str!("../plans/checkpoint-save.toml"),
    ),
    ("empty-cache", include_str!("../plans/empty-cache.toml")),
    ("epoch-spike", include_str!("../plans/epoch-spike.toml")),
    (
        "grad-accumulation",
        include_str!("../plans/grad-accumulation.toml"),
    ),
    (
        "grad-checkpointing",
        include_str!("../plans/grad-checkpointing.toml"),
    ),
    (
        "logging-growth",
        include_str!("../plans/logging-growth.toml"),
    ),
    (
        "memmap-vs-preload",
        include_str!("../plans/memmap-vs-preload.toml"),
    ),
    (
        "mixed-precision",
        include_str!("../plans/mixed-precision.toml"),
    ),
    (
        "model-parallel",
        include_str!("../plans/model-parallel.toml"),
    ),
    (
        "optimizer-jump",
        include_str!("../plans/optimizer-jump.toml"),
    ),
    (
        "per-batch-plateau",
        include_str!("../plans/per-batch-plateau.toml"),
    ),
    (
        "pinned-staging",
        include_str!("../plans/pinned-staging.toml"),
    ),
    ("retained-leak", include_str!("../plans/retained-leak.toml")),
    ("startup", include_str!("../plans/startup.toml")),
];

/// The TOML text of the plan called `name`.
pub fn text(name: &str) -> Option<&'static str> {
    PLANS.iter().find(|(n, _)| *n == name).map(|(_, t)| *t)
}

/// Parses and checks the plan called `name`; errors name it as `plans/NAME.toml`.
pub fn load(name: &str) -> Result<Plan, PlanError> {
    let origin = format!("plans/{name}.toml");
    match text(name) {
        Some(t) => Plan::parse(t, &origin),
        None => Err(PlanError::Io {
            path: origin,
            cause: std::io::Error::new(std::io::ErrorKind::NotFound, "no such scenario plan"),
        }),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_plan_parses() {
        assert!(super::PLANS.len() >= 15);
        for (name, _) in super::PLANS {
            super::load(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        assert!(super::load("nope").is_err());
    }
}
