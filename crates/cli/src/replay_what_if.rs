//! `trainmem replay SNAPSHOT --what-if CONF --capacity SIZE`: the recorded run and each
//! configuration side by side (peak reserved and allocated, the unused reserve and the
//! largest free block at the peak, cudaMalloc/cudaFree calls, the first out-of-memory), and,
//! when the run ran out of memory or the capacity is below its peak, the standard remedies
//! that make it fit and those that do not, in words.

use anyhow::Context;
use trainmem_alloc::pytorch::replay::{Outcome, RecordedFigures, Scenario, run_scenario};
use trainmem_alloc::{AllocatorConfig, Snapshot, TraceAction, format_size};

use crate::cmd_replay::ReplayArgs;

/// The what-if replays and the answer.
pub struct WhatIf {
    /// The recorded run first, then each configuration.
    pub outcomes: Vec<Outcome>,
    /// The answer in words (empty when there is no question: it fits and nothing ran out).
    pub answer: Vec<String>,
}

/// trainmem's key for `torch.cuda.set_per_process_memory_fraction` in a `--what-if` string.
const FRACTION_KEY: &str = "per_process_memory_fraction";
/// trainmem's key for calling `empty_cache` at the recorded `snapshot` points.
const EMPTY_CACHE_KEY: &str = "empty_cache_at_snapshots";

/// Splits `text` at commas outside `[...]`.
fn split_top_level(text: &str) -> Vec<&str> {
    let (mut depth, mut start, mut out) = (0i32, 0usize, Vec::new());
    for (i, ch) in text.char_indices() {
        match ch {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&text[start..]);
    out
}

/// A `--what-if` string as a scenario: PYTORCH_ALLOC_CONF keys, plus
/// `per_process_memory_fraction:F` (0 ≤ F ≤ 1, as `torch.cuda.set_per_process_memory_fraction`
/// takes) and `empty_cache_at_snapshots:True`. A garbage-collection threshold without a
/// fraction gets fraction 1 (the whole capacity), as GC needs one. Every error names the
/// `--what-if` string.
pub fn parse_scenario(text: &str) -> anyhow::Result<Scenario> {
    let flag = format!("--what-if {text:?}");
    anyhow::ensure!(
        split_top_level(text)
            .iter()
            .any(|part| !part.trim().is_empty()),
        "{flag}: empty; give a configuration, e.g. \"max_split_size_mb:128\" or \
         \"expandable_segments:True\""
    );
    let mut conf = Vec::new();
    let mut scenario = Scenario::with_config(text, AllocatorConfig::default());
    for part in split_top_level(text) {
        match part.trim().split_once(':') {
            Some((FRACTION_KEY, v)) => {
                let v = v.trim();
                let f: f64 = v.parse().map_err(|_| {
                    anyhow::anyhow!(
                        "{flag}: {FRACTION_KEY} must be a number between 0 and 1, not {v:?}"
                    )
                })?;
                // the key is named when the string holds more than it
                let key = if part.trim() == text.trim() {
                    String::new()
                } else {
                    format!(" ({FRACTION_KEY}:{v})")
                };
                anyhow::ensure!(
                    (0.0..=1.0).contains(&f),
                    "{flag}: must be between 0 and 1{key}"
                );
                scenario.memory_fraction = Some(f);
            }
            Some((EMPTY_CACHE_KEY, v)) => {
                scenario.empty_cache_at_snapshots = match v.trim() {
                    "True" | "true" => true,
                    "False" | "false" => false,
                    other => anyhow::bail!(
                        "{flag}: {EMPTY_CACHE_KEY} must be True or False, not {other:?}"
                    ),
                };
            }
            _ => conf.push(part),
        }
    }
    let config = AllocatorConfig::parse(&conf.join(",")).with_context(|| flag.clone())?;
    if config.garbage_collection_threshold().is_some() && scenario.memory_fraction.is_none() {
        scenario.memory_fraction = Some(1.0);
    }
    scenario.config = Some(config);
    Ok(scenario)
}

/// The remedies tried when the run does not fit.
fn standard_remedies(snapshot: &Snapshot, device: usize) -> Vec<&'static str> {
    let mut out = vec![
        "max_split_size_mb:128",
        "max_split_size_mb:512",
        "roundup_power2_divisions:4",
        "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
        "garbage_collection_threshold:0.6",
        "expandable_segments:True",
    ];
    let has_snapshots = snapshot
        .device_traces
        .get(device)
        .is_some_and(|t| t.iter().any(|e| e.action == TraceAction::Snapshot));
    if has_snapshots {
        out.push("empty_cache_at_snapshots:True");
    }
    out
}

/// Runs the table's replays and, when there is a question, the remedies (the `--what-if`
/// configurations and the standard ones) and the answer.
/// `None` when neither `--what-if` nor a question asks for any.
pub fn evaluate(
    snapshot: &Snapshot,
    args: &ReplayArgs,
    recorded: &RecordedFigures,
) -> anyhow::Result<Option<WhatIf>> {
    let question = recorded.ooms > 0 || args.capacity() < recorded.peak_reserved;
    if args.what_if.is_empty() && !question {
        return Ok(None);
    }
    let run = |s: &Scenario| run_scenario(snapshot, args.device(), args.capacity(), s);
    let mut outcomes = vec![run(&Scenario::recorded())?];
    for text in &args.what_if {
        outcomes.push(run(&parse_scenario(text)?)?);
    }
    let mut answer = Vec::new();
    if question {
        let mut remedies: Vec<Outcome> = outcomes[1..].to_vec();
        for text in standard_remedies(snapshot, args.device()) {
            if args.what_if.iter().any(|w| w == text) {
                continue;
            }
            match parse_scenario(text) {
                Ok(s) => remedies.push(run(&s)?),
                Err(e) => answer.push(format!("({text} cannot be replayed: {e:#})")),
            }
        }
        let unlimited = run_scenario(snapshot, args.device(), 1 << 50, &Scenario::recorded())?;
        answer.splice(
            0..0,
            words(
                &outcomes[0],
                &unlimited,
                &remedies,
                recorded,
                args.capacity(),
            ),
        );
    }
    Ok(Some(WhatIf { outcomes, answer }))
}

/// How a scenario ended, in a few words.
fn ending(o: &Outcome) -> String {
    if o.start_does_not_fit {
        return "the state when recording began does not fit".to_string();
    }
    match (o.first_oom_entry, o.first_oom_request) {
        (Some(e), Some(r)) => format!(
            "runs out of memory at entry {e} (a request of {}), {} OOM(s) in all",
            format_size(r),
            o.ooms
        ),
        _ => format!("fits, peak reserved {}", format_size(o.peak_reserved)),
    }
}

/// The answer: does the recorded run fit, could any allocator setting make it fit, and which
/// remedies do.
fn words(
    run: &Outcome,
    unlimited: &Outcome,
    remedies: &[Outcome],
    recorded: &RecordedFigures,
    capacity: u64,
) -> Vec<String> {
    let cap = format_size(capacity);
    let mut out = Vec::new();
    if recorded.ooms > 0 {
        out.push(format!(
            "The recorded run ran out of memory {} time(s) on its own card.",
            recorded.ooms
        ));
    }
    out.push(format!(
        "On {cap} the recorded run {}; unconstrained it reserves {} at its peak while its live blocks peak at {}.",
        ending(run),
        format_size(unlimited.peak_reserved),
        format_size(unlimited.peak_allocated)
    ));
    if unlimited.peak_allocated > capacity {
        out.push(format!(
            "No allocator setting can make it fit: the live blocks alone need {}, more than {cap}.",
            format_size(unlimited.peak_allocated)
        ));
    }
    let (fit, miss): (Vec<&Outcome>, Vec<&Outcome>) = remedies.iter().partition(|o| o.fits());
    if fit.is_empty() {
        out.push("None of the standard remedies makes it fit.".to_string());
    } else {
        out.push("These make it fit:".to_string());
    }
    for o in fit {
        out.push(format!(
            "  {}: peak reserved {} ({} unused at the peak), {} cudaMalloc calls",
            o.name,
            format_size(o.peak_reserved),
            format_size(o.unused_at_peak),
            o.cuda_mallocs
        ));
    }
    if !miss.is_empty() {
        out.push("These do not:".to_string());
    }
    for o in miss {
        out.push(format!("  {}: {}", o.name, ending(o)));
    }
    out
}

/// The side-by-side table.
pub fn table(outcomes: &[Outcome], capacity: u64) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(out, "what-if on {}:", format_size(capacity));
    let width = outcomes
        .iter()
        .map(|o| o.name.len())
        .max()
        .unwrap_or(8)
        .max(8);
    let _ = writeln!(
        out,
        "{:<width$}  {:>14}  {:>14}  {:>16}  {:>14}  {:>10}  {:>8}  out of memory",
        "config",
        "peak reserved",
        "peak allocated",
        "unused at peak",
        "largest free",
        "cudaMalloc",
        "cudaFree"
    );
    for o in outcomes {
        let oom = if o.start_does_not_fit {
            "start does not fit".to_string()
        } else {
            match o.first_oom_entry {
                Some(e) => format!("at entry {e} ({} in all)", o.ooms),
                None => "no".to_string(),
            }
        };
        let _ = writeln!(
            out,
            "{:<width$}  {:>14}  {:>14}  {:>16}  {:>14}  {:>10}  {:>8}  {oom}",
            o.name,
            format_size(o.peak_reserved),
            format_size(o.peak_allocated),
            format_size(o.unused_at_peak),
            format_size(o.largest_free_at_peak),
            o.cuda_mallocs,
            o.cuda_frees
        );
    }
    out
}
