//! The processor time of one simulation of a plan, for comparing the simulator's cost between
//! two builds of trainmem (`cargo xtask bench sim` times the current build only).
//!
//! ```text
//! cargo run --release -p trainmem-sim --example sim_cost -- fixtures/plans/llama-7b-zero3.toml
//! ```
//!
//! prints the simulating thread's processor time (on Linux; wall time elsewhere), the peak and
//! the number of allocations, which must be equal between two builds for the times to compare
//! the same work. This file uses only `Plan::from_toml_str`, `simulate` and the summary's peak
//! and allocation count, so it also builds in a checkout of an older commit: copy it into
//! that checkout's `crates/sim/examples/`, build both, and time the two binaries in turn.

use std::time::Instant;

use trainmem_sim::{SimOptions, simulate};

use trainmem_core::Plan;

/// Processor seconds of the calling thread, where the OS reports them.
fn thread_cpu_seconds() -> Option<f64> {
    let t = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: f64 = t.split_whitespace().next()?.parse().ok()?;
    Some(ns / 1e9)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).ok_or("usage: sim_cost PLAN.toml")?;
    let plan = Plan::from_toml_str(&std::fs::read_to_string(&path)?)?;
    let (wall, cpu) = (Instant::now(), thread_cpu_seconds());
    let r = simulate(&plan, SimOptions::default())?;
    let secs = match (cpu, thread_cpu_seconds()) {
        (Some(a), Some(b)) => b - a,
        _ => wall.elapsed().as_secs_f64(),
    };
    println!(
        "{secs:.3} s, peak {} B, {} allocations",
        r.summary.peak_allocated, r.summary.allocations
    );
    Ok(())
}
