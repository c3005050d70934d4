//! Lays a real burn training run beside its simulated twin, category by category.
//!
//! For every plan given on the command line this trains the plan for real on burn's Flex CPU
//! backend (host bytes per category from trainmem-probe's counting allocator, tagged at
//! allocation time; see `trainmem_burn::run`) and simulates it with `trainmem_sim::simulate`,
//! then prints the peak bytes per category over each timeline (host domain: on a CPU backend
//! every tensor is host memory) and the simulator's error relative to the measurement, judged by
//! `trainmem_core::compare` as the scenarios judge it.
//!
//! ```text
//! cargo build -p xtask --example twin_check
//! ./target/debug/examples/twin_check fixtures/scenarios/*.toml
//! ./target/debug/examples/twin_check --series fixtures/scenarios/optimizer-jump.toml
//! ```
//!
//! `--series` also prints both timelines sample by sample (phase, step, micro-batch and the
//! bytes of each tensor category, then anonymous and file-backed RSS; measured above
//! simulated), to see at which phase boundary
//! the two part. Samples are paired in order of (step, micro-batch, phase), so a phase only
//! one side samples shows up on its own line.
//!
//! Plans a burn run cannot honour are reported as refused and skipped.

use std::process::ExitCode;

use trainmem_burn::{RunOptions, run_measured_detailed};
use trainmem_core::Category;
use trainmem_core::compare::{category_errors, comparison_domain};
use trainmem_core::plan::Plan;
use trainmem_core::timeline::{Sample, Timeline};
use trainmem_probe::CountingAlloc;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc::new();

/// Categories shown in the `--series` view (the ones a training step moves, and `other`:
/// kernel scratch and runtime bookkeeping).
const SERIES: [Category; 7] = [
    Category::Parameter,
    Category::Gradient,
    Category::OptimizerState,
    Category::Activation,
    Category::Input,
    Category::Temporary,
    Category::Other,
];

/// Heap bytes a vector reserved (capacity × element size).
fn reserved_bytes<T>(v: &Vec<T>) -> u64 {
    (v.capacity() * std::mem::size_of::<T>()) as u64
}

fn sample_row(tag: &str, s: &Sample) -> String {
    let mut row = format!(
        "{tag} {:<15} step {:>3} mb {:>2}",
        s.phase.name(),
        s.step,
        s.micro_batch.map_or("-".to_string(), |m| m.to_string())
    );
    for c in SERIES {
        row.push_str(&format!(" {:>11}", s.host.categories.get(c)));
    }
    row.push_str(&format!(" {:>11} {:>11}", s.host.anon_rss, s.host.file_rss));
    row
}

/// Prints both timelines in step order, measured rows marked `m`, simulated rows `s`.
fn print_series(measured: &Timeline, simulated: &Timeline) {
    let mut header = format!("  {:<15} {:>8} {:>5}", "phase", "step", "mb");
    for c in SERIES {
        header.push_str(&format!(" {:>11}", c.name()));
    }
    header.push_str(&format!(" {:>11} {:>11}", "anon_rss", "file_rss"));
    println!("{header}");
    let key = |s: &Sample| (s.epoch, s.step, s.micro_batch.map_or(0, |m| m + 1));
    let (mut i, mut j) = (0, 0);
    let (m, s) = (&measured.samples, &simulated.samples);
    while i < m.len() || j < s.len() {
        let same = i < m.len() && j < s.len() && m[i].phase == s[j].phase;
        if same {
            println!("{}", sample_row("m", &m[i]));
            println!("{}", sample_row("s", &s[j]));
            i += 1;
            j += 1;
        } else if j >= s.len() || (i < m.len() && key(&m[i]) <= key(&s[j])) {
            // A phase the simulator does not sample here: advance the measured side until
            // the phases line up again.
            let sim_has_it = s[j..]
                .iter()
                .take_while(|x| key(x) == key(&m[i]))
                .any(|x| x.phase == m[i].phase);
            if sim_has_it {
                println!("{}", sample_row("s", &s[j]));
                j += 1;
            } else {
                println!("{}", sample_row("m", &m[i]));
                i += 1;
            }
        } else {
            println!("{}", sample_row("s", &s[j]));
            j += 1;
        }
    }
}

fn main() -> ExitCode {
    let mut series = false;
    let mut paths = Vec::new();
    for arg in std::env::args().skip(1) {
        if arg == "--series" {
            series = true;
        } else {
            paths.push(arg);
        }
    }
    if paths.is_empty() {
        eprintln!("usage: twin_check [--series] PLAN.toml...");
        return ExitCode::FAILURE;
    }
    let mut failed = false;
    for path in paths {
        let plan = match std::fs::read_to_string(&path)
            .map_err(|e| e.to_string())
            .and_then(|text| Plan::from_toml_str(&text).map_err(|e| e.to_string()))
        {
            Ok(p) => p,
            Err(e) => {
                println!("{path}: cannot read the plan: {e}");
                failed = true;
                continue;
            }
        };
        let started = std::time::Instant::now();
        let measured = match run_measured_detailed(&plan, RunOptions::default()) {
            Ok(m) => m,
            Err(e) => {
                println!("{path}: refused by the measured run: {e}");
                continue;
            }
        };
        let elapsed = started.elapsed();
        let simulated = match trainmem_sim::simulate(&plan, Default::default()) {
            Ok(s) => s,
            Err(e) => {
                println!("{path}: simulation failed: {e}");
                failed = true;
                continue;
            }
        };
        let domain = comparison_domain(&plan, Some(&measured.timeline));
        let rows = category_errors(&measured.timeline, &simulated.timeline, domain);
        println!(
            "== {path} (measured in {:.1}s; samples measured {} simulated {})",
            elapsed.as_secs_f64(),
            measured.timeline.samples.len(),
            simulated.timeline.samples.len()
        );
        let sim_params = trainmem_sim::lower::lower_for(&plan.model, plan.framework)
            .map(|p| p.param_elems() * plan.precision.compute.size())
            .unwrap_or(0);
        println!(
            "  parameter tensor bytes: measured run {} sim program {} (the rest of the \
             measured `parameter` category is burn-nn's module bookkeeping)",
            measured.parameter_bytes, sim_params
        );
        println!("  {} domain", domain.name());
        for r in &rows {
            let err = r
                .error
                .map_or("    n/a".to_string(), |e| format!("{:>6.1}%", e * 100.0));
            let target = r
                .tolerance
                .map_or(String::new(), |t| format!(" (target ±{:.0}%)", t * 100.0));
            println!(
                "{:>16} measured {:>12} sim {:>12} err {err}{target} {}",
                r.category.name(),
                r.measured,
                r.simulated,
                if r.within() { "ok" } else { "MISS" }
            );
        }
        // `other` in detail: the twin's kernel scratch, and what the measured run holds there
        // that the twin does not model (the probe's own sample buffers, reserved before
        // `start`: the returned vectors are those very allocations).
        let probe_own = reserved_bytes(&measured.samples) + reserved_bytes(&measured.loader_memory);
        let other_at = |t: &Timeline, phase: &str| {
            t.samples
                .iter()
                .find(|s| s.phase.name() == phase)
                .map_or(0, |s| s.host.categories.get(Category::Other))
        };
        let m_start = other_at(&measured.timeline, "start");
        let scratch = trainmem_sim::profile::FrameworkProfile::for_plan(&plan)
            .kernel_scratch_bytes(&plan, &trainmem_sim::Machine::detect());
        let rest = m_start as i64 - scratch as i64 - probe_own as i64;
        println!(
            "  other at start: measured {m_start} = kernel scratch {} (twin: {}) + probe's own \
             buffers {probe_own} (not modelled) + rest {rest}",
            scratch,
            other_at(&simulated.timeline, "start"),
        );
        if series {
            print_series(&measured.timeline, &simulated.timeline);
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
