//! What would have saved memory at the peak, in bytes: allocator settings replayed through
//! the caching allocator on the recorded trace (exact), and changes to the training estimated
//! from the category breakdown at the peak (with the figures behind each).

use serde::Serialize;
use trainmem_alloc::AllocatorConfig;
use trainmem_alloc::pytorch::replay::{PreparedTrace, Scenario, run_prepared};
use trainmem_core::Category;

use super::SnapshotExplanation;
use super::frames::StackPhase;

/// How a remedy's saving was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RemedyKind {
    /// Replayed through the caching allocator on the recorded trace: exact.
    Replayed,
    /// Estimated from the category breakdown at the peak.
    Estimated,
}

/// One remedy.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Remedy {
    /// What to change.
    pub name: String,
    /// Replayed or estimated.
    pub kind: RemedyKind,
    /// Bytes saved at the peak: peak reserved bytes for replayed ones, live tensor bytes for
    /// estimated ones.
    pub saved_bytes: u64,
    /// The figures behind it.
    pub detail: String,
    /// For a replayed setting: the recording's peak reserved bytes with it (more than the
    /// recording's own when the setting costs memory; its saving is then 0).
    pub peak_reserved: Option<u64>,
    /// Whether the run fits the capacity with it (None without a capacity); for a trace
    /// that ran out of memory, whether it gets past the allocation that failed (what the run
    /// needed after it is not in the trace).
    pub fits: Option<bool>,
}

fn bytes_of(ex: &SnapshotExplanation, c: Category) -> u64 {
    ex.peak
        .by_category
        .iter()
        .find(|(k, _)| *k == c)
        .map_or(0, |(_, b)| *b)
}

fn human(b: u64) -> String {
    trainmem_core::bytes::human(b)
}

/// The remedies, most bytes saved first; the allocator settings are replayed on `prepared`
/// (the explained device's trace, prepared for replays) when given.
pub fn remedies(ex: &SnapshotExplanation, prepared: Option<&PreparedTrace>) -> Vec<Remedy> {
    let mut out = Vec::new();
    // what the settings are held against: the recording's peak reserved bytes; for one that
    // ran out of memory, its replay on a device with room, the failed request served (the
    // recording's own peak stops short of it)
    let peak_reserved = match ex.oom_request {
        Some(o) => o.needed_reserved,
        None => ex.allocator.map(|a| a.peak_reserved),
    };
    if let (Some(p), Some(recorded_peak)) = (prepared, peak_reserved) {
        out = replayed(ex, p, recorded_peak);
    }
    estimated(ex, peak_reserved, &mut out);
    out.sort_by(|a, b| b.saved_bytes.cmp(&a.saved_bytes).then(a.name.cmp(&b.name)));
    out
}

/// The allocator settings to replay, by name.
fn allocator_tries(p: &PreparedTrace) -> Vec<(String, Scenario)> {
    let mut tries: Vec<(String, Scenario)> = Vec::new();
    for conf in [
        "expandable_segments:True",
        "max_split_size_mb:128",
        "max_split_size_mb:512",
        "garbage_collection_threshold:0.6",
    ] {
        if let Ok(c) = AllocatorConfig::parse(conf) {
            let mut s = Scenario::with_config(conf, c);
            if conf.starts_with("garbage") {
                s.memory_fraction = Some(1.0);
            }
            tries.push((conf.to_string(), s));
        }
    }
    if !p.snapshot_points.is_empty() {
        let mut s = Scenario::recorded();
        s.name = "empty_cache() at each recorded snapshot point".into();
        s.empty_cache_at_snapshots = true;
        tries.push((s.name.clone(), s));
    }
    tries
}

/// The allocator settings replayed on `p`, against the recording's peak reserved bytes.
fn replayed(ex: &SnapshotExplanation, p: &PreparedTrace, recorded_peak: u64) -> Vec<Remedy> {
    // savings on a device with room to spare (a capped replay would cap its peak too);
    // fitting on the capacity asked about, in a second replay
    let unbounded = super::ROOM;
    let tries = allocator_tries(p);
    // each setting is a full replay of its own: they run side by side
    let replay = |s: &Scenario| {
        run_prepared(p, unbounded, s).map(|o| {
            let fits = ex
                .capacity
                .map(|c| run_prepared(p, c, s).is_ok_and(|o| o.fits()));
            (o, fits)
        })
    };
    let outcomes: Vec<_> = std::thread::scope(|scope| {
        let running: Vec<_> = tries
            .iter()
            .map(|(_, s)| scope.spawn(|| replay(s)))
            .collect();
        running
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    });
    let mut out = Vec::new();
    for ((name, _), outcome) in tries.into_iter().zip(outcomes) {
        let (o, fits) = match outcome {
            Ok(done) => done,
            Err(e) => {
                // said, not left out: a setting the replay could not run saves nothing known
                out.push(Remedy {
                    name,
                    kind: RemedyKind::Replayed,
                    saved_bytes: 0,
                    detail: format!("could not be replayed: {e}"),
                    peak_reserved: None,
                    fits: None,
                });
                continue;
            }
        };
        {
            let saved = recorded_peak.saturating_sub(o.peak_reserved);
            let room = if ex.oom_request.is_some() {
                ", on a device with room, up to the failed allocation"
            } else {
                ""
            };
            out.push(Remedy {
                name,
                kind: RemedyKind::Replayed,
                saved_bytes: saved,
                detail: format!(
                    "peak reserved {} instead of {}{room} ({} cudaMalloc calls)",
                    human(o.peak_reserved),
                    human(recorded_peak),
                    o.cuda_mallocs
                ),
                peak_reserved: Some(o.peak_reserved),
                fits,
            });
        }
    }
    out
}

/// Appends to `out` the changes to the training estimated from the categories at the peak.
fn estimated(ex: &SnapshotExplanation, peak_reserved: Option<u64>, out: &mut Vec<Remedy>) {
    let fits = |saved: u64| match (ex.capacity, peak_reserved) {
        (Some(c), Some(p)) => Some(p.saturating_sub(saved) <= c),
        _ => None,
    };
    // an estimate under 1% of the live bytes at the peak is within the estimate's own error
    let worth = ex.peak.live_bytes.div_ceil(100).max(1);
    let mut estimate = |name: &str, saved: u64, detail: String| {
        if saved >= worth {
            out.push(Remedy {
                name: name.to_string(),
                kind: RemedyKind::Estimated,
                saved_bytes: saved,
                detail,
                peak_reserved: None,
                fits: fits(saved),
            });
        }
    };
    let grads = bytes_of(ex, Category::Gradient);
    let state = bytes_of(ex, Category::OptimizerState);
    let acts = bytes_of(ex, Category::Activation);
    let input = bytes_of(ex, Category::Input);
    let temp = bytes_of(ex, Category::Temporary);
    if matches!(
        ex.peak.phase,
        Some(StackPhase::Forward | StackPhase::Data | StackPhase::ZeroGrad)
    ) {
        estimate(
            "zero_grad(set_to_none=True) before forward",
            grads,
            format!(
                "the peak is in {}, where the {} of gradients live are not needed yet",
                ex.peak.phase.map_or("?", StackPhase::name),
                human(grads)
            ),
        );
    }
    // 8-bit state: one byte per element plus an f32 maximum per 256 elements, from f32
    let eight_bit = state - state * 1028 / 4096;
    estimate(
        "8-bit optimizer state (bitsandbytes AdamW8bit)",
        eight_bit,
        format!(
            "{} of optimizer state at the peak, assumed f32: 1 byte per element and an f32 \
             maximum per 256 elements keep 25.1% of it",
            human(state)
        ),
    );
    estimate(
        "bf16 gradients",
        grads / 2,
        format!(
            "{} of gradients at the peak, assumed f32: half of it",
            human(grads)
        ),
    );
    if let Some(r) = ex.repeated.as_ref().filter(|r| r.runs >= 3) {
        let blocks = r.runs;
        let kept = acts * 2 / blocks;
        estimate(
            "activation checkpointing per block",
            acts.saturating_sub(kept),
            format!(
                "{} of activations at the peak; the line that made most of them ({}, {}) ran \
                 {blocks} separate times, taken as once per block: recomputing each block \
                 keeps about one block's activations plus every block's input, taken as \
                 2/{blocks} of them",
                human(acts),
                r.line,
                human(r.bytes)
            ),
        );
    }
    // with no backward in a finished trace there is no gradient to accumulate: an evaluation
    // or a forward-only method, whose batch is simply smaller (a run that ran out of memory
    // may have stopped before its first backward)
    let name = if ex.steps.is_empty() && ex.oom_request.is_none() {
        "halve the batch"
    } else {
        "halve the micro-batch (accumulate twice as many)"
    };
    // a peak in the optimizer step (or zero_grad, or setup) holds scratch sized by the
    // parameters: only forward's, backward's and the batch's own scratch scale with the batch
    let batch_scratch = !matches!(
        ex.peak.phase,
        Some(StackPhase::Optimizer | StackPhase::ZeroGrad | StackPhase::Setup)
    );
    let (temp_scaled, detail) = if batch_scratch {
        (
            temp,
            format!(
                "activations {}, inputs {} and temporaries {} at the peak scale with the batch",
                human(acts),
                human(input),
                human(temp)
            ),
        )
    } else {
        (
            0,
            format!(
                "activations {} and inputs {} at the peak scale with the batch; the {} of \
                 temporaries there do not (the peak is in the {}: its scratch is sized by the \
                 parameters)",
                human(acts),
                human(input),
                human(temp),
                ex.peak.phase.map_or("?", StackPhase::name)
            ),
        )
    };
    estimate(name, (acts + input + temp_scaled) / 2, detail);
}
