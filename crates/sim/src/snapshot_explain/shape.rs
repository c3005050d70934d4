//! Phases from the trace's shape alone, for a trace that recorded no stacks.
//!
//! A training loop repeats itself: every step allocates and frees the same sizes in the same
//! order. [`infer_windows`] finds that period in the trace's entries and puts a step boundary
//! where the live bytes are lowest between two peaks (the last free of one step, before the
//! next batch). Entries before the first step are setup.
//!
//! Each step is split by its gradients: blocks of a parameter's size (the sizes of the
//! blocks made before the first step and kept) that the step makes and frees after its last
//! allocation, as `zero_grad` frees them. Its forward pass ends before the first gradient is
//! made, at the loss: the last block of the smallest size made before that point that
//! outlives backward, made once the forward pass holds most of its bytes. A step that frees
//! no gradient (they are kept between steps) looks for the loss before the point where the
//! bytes it makes and frees itself are highest instead. What the forward pass made and a
//! later entry of the step frees was saved for backward; backward ends when 99% of those
//! bytes are gone, and the optimizer step follows. The categories then follow from those
//! windows by the same lifetime rules as with frames (`categorize`), and the report says
//! the phases were inferred.
//!
//! Gradient accumulation runs the forward pass and backward several times a step: where a
//! step's first entries occur again after its first backward, each occurrence starts another
//! micro-batch, whose forward pass ends at its loss before the peak of the bytes the step
//! makes and frees itself.
//!
//! Where it can be wrong: a loss that is not a small block outliving backward leaves the
//! split at the first gradient (or the peak), so what backward made until then (the logits'
//! gradient) counts as forward's; activation checkpointing's recompute in backward is taken
//! for backward's own; a batch made at the start of a step is named with the forward pass
//! that reads it. A trace that does not repeat (fewer than two steps, or steps that differ),
//! or that shows no training (no step frees a gradient, and the first keeps nothing of a
//! parameter's size: inference repeats itself too), gets no phases, as before.

use std::collections::HashSet;
use std::hash::{Hash, Hasher};

use trainmem_alloc::pytorch::replay::free_action;
use trainmem_alloc::{TraceAction, TraceEntry};

use super::frames::StackPhase;
use super::lifetimes::{Allocation, Window};

/// Tokens compared at a time to find a repetition.
const W: usize = 16;
/// Share of a period's entries that must repeat for it to be the loop's.
const REPEATS: f64 = 0.97;
/// Periods checked at most.
const CANDIDATES: usize = 32;
/// Share of the bytes the forward pass made that backward has freed when backward ends.
const BACKWARD_FREES: f64 = 0.99;

/// The entries a loop repeats, the allocations and frees of blocks (the allocator's own
/// `segment_*` entries come only while its pool grows), as (trace index, token: what the
/// entry does and to how many bytes).
fn tokens(trace: &[TraceEntry]) -> (Vec<usize>, Vec<u64>) {
    let free = free_action(trace);
    trace
        .iter()
        .enumerate()
        .filter(|(_, e)| e.action == TraceAction::Alloc || e.action == free)
        .map(|(k, e)| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            (e.action == TraceAction::Alloc).hash(&mut h);
            e.size.hash(&mut h);
            (k, h.finish())
        })
        .unzip()
}

/// Positions where the `W` tokens at `at` occur again (`at` included), in order.
fn occurrences(tok: &[u64], at: usize) -> Vec<usize> {
    let key = &tok[at..at + W];
    (0..=tok.len() - W)
        .filter(|&q| tok[q] == key[0] && &tok[q..q + W] == key)
        .collect()
}

/// The share of the entries from `from` that the entries a period later repeat, over a
/// period or an eighth of the trace, whichever is longer (a layer's or a parameter group's
/// repetition inside one step is not the loop's), as far as the trace goes: at least half
/// of that.
fn repeated(tok: &[u64], from: usize, period: usize) -> f64 {
    let span = period.max(tok.len() / 8);
    let end = (from + span).min(tok.len().saturating_sub(period));
    if end < from + span / 2 {
        return 0.0;
    }
    let same = (from..end).filter(|&i| tok[i] == tok[i + period]).count();
    same as f64 / (end - from) as f64
}

/// The shortest period at which the `W` entries at `at` occur again and the entries repeat
/// for a whole period: (period, where the earlier of the two occurrences is).
fn period_at(tok: &[u64], at: usize) -> Option<(usize, usize)> {
    let mut periods: Vec<(usize, usize)> = occurrences(tok, at)
        .into_iter()
        .filter(|&q| q != at)
        .map(|q| (q.abs_diff(at), q.min(at)))
        .collect();
    periods.sort_unstable();
    // the nearest few (checking each costs a period's entries)
    periods
        .into_iter()
        .filter(|&(p, _)| p >= W)
        .take(CANDIDATES)
        .find(|&(p, from)| repeated(tok, from, p) >= REPEATS)
}

/// The training steps' windows, inferred from the trace's shape (see the module's doc), or
/// None when the trace does not repeat. `live`: the bytes live after each entry.
pub fn infer_windows(
    trace: &[TraceEntry],
    allocations: &[Allocation],
    live: &[u64],
) -> Option<Vec<Window>> {
    let n = trace.len();
    if live.len() != n {
        return None;
    }
    let (index, tok) = tokens(trace);
    let m = tok.len();
    if m < 4 * W {
        return None;
    }
    let live_at = |i: usize| live[index[i]];
    // the loop's period: the shortest distance at which the entries around a peak occur
    // again, and repeat for a whole period. The highest peak first; where that is the first
    // step's alone (an optimizer making its state), the highest of the trace's second half
    let highest = |from: usize| {
        (from..m)
            .max_by_key(|&i| (live_at(i), std::cmp::Reverse(i)))
            .unwrap_or(from)
    };
    let (period, first) = [highest(0), highest(m / 2)]
        .into_iter()
        .find_map(|at| period_at(&tok, at.clamp(W / 2, m - W) - W / 2))?;
    // a step boundary: the lowest live bytes between that peak and the next one
    let low = (first..first + period).min_by_key(|&i| (live_at(i), i))?;
    let boundary = (low + 1).min(m - W);
    let occurs = occurrences(&tok, boundary);
    let mut starts: Vec<usize> = Vec::new();
    for &q in &occurs {
        if starts.last().is_none_or(|&s| q >= s + period / 2) {
            starts.push(q);
        }
    }
    if starts.len() < 2 {
        return None;
    }
    // where each step's first entries (the same at every step's start) occur again inside
    // it: its micro-batches (gradient accumulation runs the forward pass and backward several
    // times a step)
    let repeats_in_step: Vec<Vec<usize>> = starts
        .iter()
        .enumerate()
        .map(|(c, &st)| {
            let end = starts.get(c + 1).copied().unwrap_or(m);
            let from = occurs.partition_point(|&q| q <= st + W);
            let to = occurs.partition_point(|&q| q < end);
            occurs[from..to.max(from)]
                .iter()
                .map(|&q| index[q])
                .collect()
        })
        .collect();
    // back to the trace's entries
    let starts: Vec<usize> = starts.into_iter().map(|i| index[i]).collect();
    let mut windows = Vec::new();
    let mut push = |phase: Option<StackPhase>, start: usize, end: usize, cycle: usize| {
        if end > start {
            windows.push(Window {
                phase,
                start,
                end,
                cycle,
            });
        }
    };
    let params = parameter_sizes(allocations, starts[0]);
    let ends = |cycle: usize| starts.get(cycle + 1).copied().unwrap_or(n);
    // each step's own allocations, so that each step reads only those
    let mut made: Vec<Vec<&Allocation>> = vec![Vec::new(); starts.len()];
    for a in allocations {
        if let Some(at) = a.alloc_at
            && at >= starts[0]
        {
            made[starts.partition_point(|&s| s <= at) - 1].push(a);
        }
    }
    let steps: Vec<Step> = (0..starts.len())
        .map(|c| Step::new(trace, starts[c], ends(c), &made[c], &params))
        .collect();
    let splits: Vec<(usize, bool)> = steps.iter().map(|st| st.forward_end(&params)).collect();
    // a loop that trains: its steps free gradients, or its first step makes and keeps blocks
    // of the parameters' sizes (gradients kept between steps, optimizer state); else it may
    // be inference, with no backward to find
    let keeps_model_state = made[0]
        .iter()
        .any(|a| a.free_at.is_none() && params.contains(&a.size));
    if splits.iter().all(|s| !s.1) && !keeps_model_state {
        return None;
    }
    push(Some(StackPhase::Setup), 0, starts[0], 0);
    for (cycle, step) in steps.iter().enumerate() {
        let (s, e) = (step.s, step.e);
        let mut forward_end = splits[cycle].0;
        let mut backward_end = step.backward_end(s, forward_end);
        // further micro-batches: each starts as the step does, after the first's backward;
        // each is split at the peak of the bytes it makes and frees itself
        let micro: Vec<usize> = repeats_in_step[cycle]
            .iter()
            .copied()
            .filter(|&q| q > backward_end)
            .collect();
        let own = &step.own;
        push(Some(StackPhase::Forward), s, forward_end + 1, cycle);
        for (i, &ms) in micro.iter().enumerate() {
            push(Some(StackPhase::Backward), forward_end + 1, ms, cycle);
            let me = micro.get(i + 1).copied().unwrap_or(e);
            let peak = (ms..me)
                .max_by_key(|&k| (own[k - s], std::cmp::Reverse(k)))
                .unwrap_or(ms);
            let fe = step.loss_before(peak, step.backward_end(ms, peak)).max(ms);
            push(Some(StackPhase::Forward), ms, fe + 1, cycle);
            forward_end = fe;
            backward_end = step.backward_end(ms, fe);
        }
        push(
            Some(StackPhase::Backward),
            forward_end + 1,
            backward_end + 1,
            cycle,
        );
        push(Some(StackPhase::Optimizer), backward_end + 1, e, cycle);
    }
    Some(windows)
}

/// The sizes of the blocks made before the first step (or live before recording began) and
/// never freed: the model's parameters and buffers.
fn parameter_sizes(allocations: &[Allocation], first_step: usize) -> HashSet<u64> {
    allocations
        .iter()
        .filter(|a| a.free_at.is_none() && a.alloc_at.is_none_or(|at| at < first_step))
        .map(|a| a.size)
        .collect()
}

/// A step `[s, e)` of the trace with the allocations it makes.
struct Step<'a> {
    s: usize,
    e: usize,
    /// Its last allocation.
    last_alloc: usize,
    /// The allocations it makes, in order.
    made: &'a [&'a Allocation],
    /// After each of its entries, the bytes live that it made and frees itself, its
    /// gradients left out.
    own: Vec<i128>,
}

impl<'a> Step<'a> {
    fn new(
        trace: &[TraceEntry],
        s: usize,
        e: usize,
        made: &'a [&'a Allocation],
        params: &HashSet<u64>,
    ) -> Step<'a> {
        let last_alloc = (s..e)
            .rev()
            .find(|&k| matches!(trace[k].action, TraceAction::Alloc))
            .unwrap_or(s);
        let mut step = Step {
            s,
            e,
            last_alloc,
            made,
            own: Vec::new(),
        };
        step.own = step.own_bytes(params);
        step
    }

    /// A gradient candidate: a block of a parameter's size that the step makes and frees
    /// after its last allocation, as `zero_grad` frees gradients.
    fn gradient(&self, a: &Allocation, params: &HashSet<u64>) -> bool {
        params.contains(&a.size)
            && a.alloc_at.is_some_and(|at| at > self.s)
            && a.free_at.is_some_and(|f| f > self.last_alloc && f < self.e)
    }

    /// [`Step::own`], counted.
    fn own_bytes(&self, params: &HashSet<u64>) -> Vec<i128> {
        let mut delta = vec![0i128; self.e - self.s + 1];
        for a in self.made {
            let (Some(at), Some(f)) = (a.alloc_at, a.free_at) else {
                continue;
            };
            if f < self.e && !self.gradient(a, params) {
                delta[at - self.s] += i128::from(a.size);
                delta[f - self.s] -= i128::from(a.size);
            }
        }
        let mut cur = 0i128;
        delta[..self.e - self.s]
            .iter()
            .map(|d| {
                cur += d;
                cur
            })
            .collect()
    }

    /// (the forward pass's last entry, whether the step's gradients decided it): the entry
    /// before its first gradient, where backward begins, when the step's own bytes there are
    /// at least half their highest until that backward would end (a block of a parameter's
    /// size made early in the step is a weight loaded for its forward pass, not a gradient);
    /// else the entry after which its own bytes are highest.
    fn forward_end(&self, params: &HashSet<u64>) -> (usize, bool) {
        let own = &self.own;
        let highest_until = |end: usize| {
            own[..end]
                .iter()
                .enumerate()
                .fold(
                    (0, i128::MIN),
                    |best, (i, &b)| if b > best.1 { (i, b) } else { best },
                )
        };
        let first = self
            .made
            .iter()
            .filter(|a| self.gradient(a, params))
            .filter_map(|a| a.alloc_at)
            .min();
        if let Some(g) = first {
            // backward, if it begins there, ends when the forward pass's bytes are freed
            let end = self.backward_end(self.s, g - 1);
            let (_, highest) = highest_until(end + 1 - self.s);
            if 2 * own[g - 1 - self.s] >= highest {
                return (self.loss_before(g - 1, end), true);
            }
        }
        let peak = self.s + highest_until(own.len()).0;
        (
            self.loss_before(peak, self.backward_end(self.s, peak)),
            false,
        )
    }

    /// The forward pass ends with the loss: the last block of the smallest size before
    /// `split` that outlives backward (ending at `end`), made when the step's own bytes
    /// ([`Step::own`]) were at least half what they are at `split` (a small block made
    /// early, such as a batch's labels, is not the loss). What backward makes before its
    /// first gradient (the logits' gradient) comes after it. `split` when there is none.
    fn loss_before(&self, split: usize, end: usize) -> usize {
        let own = &self.own;
        let smallest = self.made.iter().map(|a| a.size).min().unwrap_or(0);
        self.made
            .iter()
            .filter(|a| a.size <= smallest.max(512))
            .filter(|a| a.free_at.is_none_or(|f| f > end))
            .filter_map(|a| a.alloc_at)
            .filter(|&at| at <= split && 2 * own[at - self.s] >= own[split - self.s])
            .max()
            .unwrap_or(split)
    }

    /// The entry by which 99% of the bytes made from `from` until `pk` and freed after it,
    /// within the step, are freed: the end of backward when a forward pass runs from `from`
    /// to `pk`.
    fn backward_end(&self, from: usize, pk: usize) -> usize {
        let mut frees: Vec<(usize, u64)> = self
            .made
            .iter()
            .filter(|a| a.alloc_at.is_some_and(|at| at >= from && at <= pk))
            .filter_map(|a| {
                a.free_at
                    .filter(|&f| f > pk && f < self.e)
                    .map(|f| (f, a.size))
            })
            .collect();
        frees.sort_unstable();
        let total: u64 = frees.iter().map(|f| f.1).sum();
        let mut freed = 0u64;
        for (f, size) in frees {
            freed += size;
            if freed as f64 >= BACKWARD_FREES * total as f64 {
                return f;
            }
        }
        pk
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use trainmem_alloc::StreamId;

    fn entry(action: TraceAction, addr: u64, size: u64) -> TraceEntry {
        TraceEntry {
            action,
            addr,
            size,
            stream: StreamId::DEFAULT,
            time_us: None,
            frames: Vec::new(),
            category: None,
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(1000))]
        /// Any trace of allocations and frees (repeated or not, sizes of 0) is explained
        /// without a panic, and where steps are found their windows cover every entry, in
        /// order, none empty.
        #[test]
        fn any_trace_is_read_without_a_panic(
            ops in proptest::collection::vec((0u8..4, 0u64..6, 0usize..8), 0..400),
            repeat in 1usize..5,
        ) {
            use trainmem_alloc::pytorch::framed::FramedSnapshot;
            let mut trace = Vec::new();
            let mut live: Vec<u64> = Vec::new();
            let mut next = 0x1000u64;
            for _ in 0..repeat {
                for &(kind, size, pick) in &ops {
                    if kind < 2 || live.is_empty() {
                        trace.push(entry(TraceAction::Alloc, next, size * 512));
                        live.push(next);
                        next += 0x10000;
                    } else {
                        let addr = live.remove(pick % live.len());
                        trace.push(entry(TraceAction::FreeCompleted, addr, 512));
                    }
                }
            }
            let n = trace.len();
            let f = FramedSnapshot {
                snapshot: trainmem_alloc::Snapshot {
                    device_traces: vec![trace],
                    ..Default::default()
                },
                frames: Vec::new(),
                stacks: vec![Vec::new()],
                event_stacks: vec![vec![0; n]],
                block_stacks: Vec::new(),
                unreadable_frames: 0,
            };
            let opts = crate::snapshot_explain::ExplainOptions {
                replay_remedies: false,
                ..Default::default()
            };
            let lt = crate::snapshot_explain::lifetimes::lifetimes(&f, 0);
            let live = crate::snapshot_explain::live_curve(&lt.allocations, n);
            if let Some(ws) = infer_windows(&f.snapshot.device_traces[0], &lt.allocations, &live) {
                proptest::prop_assert_eq!(ws.first().map(|w| w.start), Some(0));
                proptest::prop_assert_eq!(ws.last().map(|w| w.end), Some(n));
                for pair in ws.windows(2) {
                    proptest::prop_assert_eq!(pair[0].end, pair[1].start);
                    proptest::prop_assert!(pair[0].cycle <= pair[1].cycle);
                }
                proptest::prop_assert!(ws.iter().all(|w| w.end > w.start));
            }
            let explained = crate::snapshot_explain::explain_snapshot(&f, &opts);
            proptest::prop_assert!(explained.is_ok() || n == 0);
        }
    }

    #[test]
    fn a_trace_that_does_not_repeat_gets_no_phases() {
        let trace: Vec<TraceEntry> = (0..200)
            .map(|i| entry(TraceAction::Alloc, i * 4096, 512 * (i + 1)))
            .collect();
        let live: Vec<u64> = (0..200u64).map(|i| i * 10).collect();
        assert!(infer_windows(&trace, &[], &live).is_none());
    }
}
