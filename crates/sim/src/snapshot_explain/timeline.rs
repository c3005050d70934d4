//! The explained snapshot as the shared [`Timeline`] (measured: it is the user's own run), so
//! `trainmem explain SNAPSHOT.pickle --out DIR` writes the same timeline JSON, Chrome trace
//! and SVG chart as `trainmem simulate --out DIR`.
//!
//! One sample ends each phase window of the trace (a run of entries in one phase): the
//! tensor bytes live per category then (requested sizes), the allocator's allocated and
//! reserved bytes from the replay (`cache` is reserved − allocated, as the simulator counts
//! it), and the peaks within the window (the allocator's, or without a replay the most
//! tensor bytes live). Traces with more windows than [`MAX_SAMPLES`] have
//! runs of consecutive windows merged into one sample, which keeps the last window's phase
//! and the highest peaks of them all.

use trainmem_core::Category;
use trainmem_core::timeline::{
    CategoryBytes, DeviceBytes, Phase, Sample, Source, Timeline, TimelineMeta,
};

use super::frames::StackPhase;
use super::lifetimes::Lifetimes;

/// Samples at most in a timeline.
pub const MAX_SAMPLES: usize = 4096;

/// The allocator after a sample's last entry, from the replay.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ReplayedAt {
    pub allocated: u64,
    pub reserved: u64,
    /// Highest allocated bytes since the previous sample.
    pub peak_allocated: u64,
    /// Highest reserved bytes since the previous sample.
    pub peak_reserved: u64,
}

/// The last trace entry of each sample, in order.
pub(crate) fn sample_ends(lt: &Lifetimes) -> Vec<usize> {
    let n = lt.windows.len();
    let per = n.div_ceil(MAX_SAMPLES).max(1);
    lt.windows
        .chunks(per)
        .filter_map(|c| c.last())
        .filter(|w| w.end > w.start)
        .map(|w| w.end - 1)
        .collect()
}

fn phase(p: Option<StackPhase>) -> Phase {
    match p {
        None => Phase::Start,
        Some(StackPhase::Setup) => Phase::ModelInit,
        Some(StackPhase::Data) => Phase::BatchLoaded,
        Some(StackPhase::Forward) => Phase::Forward,
        Some(StackPhase::Backward) => Phase::Backward,
        Some(StackPhase::Optimizer) => Phase::OptimizerStep,
        Some(StackPhase::ZeroGrad) => Phase::ZeroGrad,
    }
}

/// The timeline of `lt`, sampled at `ends` (from [`sample_ends`]) with the allocator's state
/// there (`replayed`: one per end, or none when the trace could not be replayed). `curve` is
/// the tensor bytes live after each entry; `time_us` the entries' recorded times, if any.
pub(crate) fn timeline(
    lt: &Lifetimes,
    curve: &[u64],
    ends: &[usize],
    replayed: Option<&[ReplayedAt]>,
    time_us: impl Fn(usize) -> Option<u64>,
    meta: TimelineMeta,
) -> Timeline {
    // category bytes that appear (+) and go (-) with each sample
    let sample_of = |entry: usize| ends.partition_point(|&e| e < entry);
    let mut start = [0i128; 8];
    let mut delta = vec![[0i128; 8]; ends.len() + 1];
    for a in &lt.allocations {
        let c = a.category.index();
        match a.alloc_at {
            Some(k) => delta[sample_of(k)][c] += i128::from(a.size),
            None => start[c] += i128::from(a.size),
        }
        if let Some(f) = a.free_at {
            delta[sample_of(f)][c] -= i128::from(a.size);
        }
    }
    let first_time = time_us(0);
    let mut t = Timeline::new(Source::Measured, meta);
    let mut live = start;
    let mut from = 0;
    for (i, &end) in ends.iter().enumerate() {
        for (l, d) in live.iter_mut().zip(delta[i]) {
            *l += d;
        }
        let mut cats = CategoryBytes::ZERO;
        for c in Category::ALL {
            cats.set(c, live[c.index()].max(0) as u64);
        }
        let r = replayed.and_then(|r| r.get(i)).copied().unwrap_or_default();
        if replayed.is_some() {
            cats.set(Category::Cache, r.reserved.saturating_sub(r.allocated));
        }
        let w = lt
            .window_of
            .get(end)
            .and_then(|&w| lt.windows.get(w as usize));
        let mut s = Sample::new(
            phase(w.and_then(|w| w.phase)),
            w.map_or(0, |w| w.cycle) as u64,
        );
        s.time_us = match (first_time, time_us(end)) {
            (Some(a), Some(b)) => b.saturating_sub(a) as f64,
            _ => end as f64,
        };
        s.device = DeviceBytes {
            categories: cats,
            allocated: r.allocated,
            reserved: r.reserved,
            peak_allocated: match replayed {
                Some(_) => r.peak_allocated,
                None => curve
                    .get(from..=end)
                    .and_then(|c| c.iter().copied().max())
                    .unwrap_or(0),
            },
            peak_reserved: r.peak_reserved,
        };
        t.push(s);
        from = end + 1;
    }
    t
}
