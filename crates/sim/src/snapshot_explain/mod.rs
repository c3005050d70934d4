//! Explaining a PyTorch memory snapshot: what filled the device, by category and by source
//! line, and what would have saved it.
//!
//! [`explain_snapshot`] reads one device's trace ([`lifetimes`]), names the phase of every
//! allocation from its recorded stack ([`frames`]), gives each a category from its phase and
//! lifetime ([`categorize`]), and reports the moment of the peak (and of the first
//! out-of-memory): bytes per category, the allocation sites holding the most, the steps found
//! and what grows per step, the allocator's share (replayed through trainmem-alloc's caching
//! allocator from the rebuilt start state), and remedies ranked by bytes saved
//! ([`remedies`]). [`annotate`] writes the user's snapshot back with those categories set.
//! [`render_text`](render::render_text) writes it for people; the types
//! serialize to JSON.

mod annotate;
pub mod categorize;
pub mod frames;
pub mod lifetimes;
pub mod profiler_truth;
pub mod remedies;
pub mod render;
pub mod repeated;
pub mod shape;
mod steps;
pub mod synthetic;
pub mod timeline;

use std::collections::HashMap;

use serde::Serialize;
use trainmem_alloc::pytorch::framed::FramedSnapshot;
use trainmem_alloc::pytorch::replay::{PreparedTrace, Scenario, prepare_trace, run_prepared};
use trainmem_alloc::{TraceAction, TraceEntry};
use trainmem_core::Category;
use trainmem_core::timeline::{Timeline, TimelineMeta};

pub use annotate::annotate;
pub use categorize::ModelStateEvidence;
pub use lifetimes::{Allocation, Lifetimes, Window};
pub use remedies::{Remedy, RemedyKind};
pub use repeated::RepeatedLine;
pub use steps::{Growth, StepInfo};

/// The device a replay runs on when it must not run out: 1 PiB. Larger than any recording
/// needs, and small enough that expandable segments, each of which reserves address space
/// for 1.125 × the device's memory as PyTorch's do, leave the simulated address space room
/// (`u64::MAX / 4` did not: a replay with expandable segments failed at its second segment).
pub const ROOM: u64 = 1 << 50;

/// Site names already worked out, by stack, whether live before recording, and category.
pub(crate) type SiteNames = HashMap<(u32, bool, Category), String>;

use frames::{StackPhase, site_label};

/// What to explain and how.
#[derive(Debug, Clone)]
pub struct ExplainOptions {
    /// The device whose trace is explained (None: the first with a trace).
    pub device: Option<usize>,
    /// Device capacity the remedies are judged on (None: the capacity the run ran out of
    /// memory on, else no judgement).
    pub capacity: Option<u64>,
    /// Sites listed per moment.
    pub top_sites: usize,
    /// Replay the allocator-setting remedies (each is a full replay of the trace).
    pub replay_remedies: bool,
}

impl Default for ExplainOptions {
    fn default() -> Self {
        ExplainOptions {
            device: None,
            capacity: None,
            top_sites: 10,
            replay_remedies: true,
        }
    }
}

/// Explaining failed.
#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    /// The snapshot has no trace to explain.
    #[error(
        "the snapshot has no trace events on any device (only its segments): record it with \
         torch.cuda.memory._record_memory_history() before the run and dump it after"
    )]
    NoTrace,
    /// The device asked for has no trace.
    #[error("device {device} has no trace events (the snapshot has {devices} device trace(s))")]
    NoSuchDevice {
        /// The device.
        device: usize,
        /// Devices in the snapshot.
        devices: usize,
    },
}

/// Bytes at one site.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SiteBytes {
    /// `file:line function` (the user's own innermost frame where there is one).
    pub site: String,
    /// The category of these bytes (a line that made tensors of several categories has a
    /// [`SiteBytes`] for each).
    pub category: Category,
    /// Tensor bytes live there.
    pub bytes: u64,
    /// Allocations live there.
    pub count: u64,
}

/// One moment of the trace.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Moment {
    /// The trace entry (after it was applied).
    pub entry: usize,
    /// The phase there.
    pub phase: Option<StackPhase>,
    /// The cycle (step) there.
    pub cycle: usize,
    /// Tensor bytes live (requested sizes).
    pub live_bytes: u64,
    /// Tensor bytes per category (categories with none left out).
    pub by_category: Vec<(Category, u64)>,
    /// The sites holding the most bytes.
    pub top_sites: Vec<SiteBytes>,
}

/// How the categories were decided.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Coverage {
    /// Trace entries with a recorded stack, of all entries.
    pub entries_with_frames: usize,
    /// Trace entries.
    pub entries: usize,
    /// Share of the peak's bytes whose category the allocation's own stack decided.
    pub peak_share_by_frames: f64,
    /// Share of the peak's bytes decided by lifetime alone (no stack, or a stack that names
    /// no phase; blocks live before recording began).
    pub peak_share_by_lifetime: f64,
}

/// The allocator at the peak, from the replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct AllocatorShare {
    /// Reserved bytes then.
    pub reserved: u64,
    /// Allocated (rounded block) bytes then.
    pub allocated: u64,
    /// The largest cached free block then.
    pub largest_free_block: u64,
    /// What `torch.cuda.empty_cache()` would have released then (wholly free segments).
    pub empty_cache_would_release: u64,
    /// The peak reserved bytes of the whole recording.
    pub peak_reserved: u64,
}

/// The allocation that failed, in a trace that ran out of memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct OomRequest {
    /// The trace entry of the `oom`.
    pub entry: usize,
    /// Bytes asked for, as the allocator rounded them.
    pub requested: u64,
    /// Bytes the device reported free then.
    pub device_free: u64,
    /// The device's memory as the recording shows it: the allocator's reserved bytes then
    /// plus what the device had free (None when the trace could not be replayed).
    pub capacity: Option<u64>,
    /// The peak reserved bytes of the recording on a device with room, the failed request
    /// served: what it needed up to that point (None when the trace could not be replayed).
    pub needed_reserved: Option<u64>,
}

/// The explanation of one device's trace.
#[derive(Debug, Clone, Serialize)]
pub struct SnapshotExplanation {
    /// The device explained.
    pub device: usize,
    /// Devices with a trace.
    pub devices_with_traces: usize,
    /// How the categories were decided.
    pub coverage: Coverage,
    /// How the model state was counted.
    pub model_state: ModelStateEvidence,
    /// At the peak of live tensor bytes.
    pub peak: Moment,
    /// At the first out-of-memory entry, when the trace has one.
    pub oom: Option<Moment>,
    /// The allocation that failed there.
    pub oom_request: Option<OomRequest>,
    /// When the snapshot was taken (the trace's last entry).
    pub end: Moment,
    /// The training steps found (an optimizer step or a backward ends each).
    pub steps: Vec<StepInfo>,
    /// What grows from step to step, when anything does.
    pub growth: Option<Growth>,
    /// The line of the model's code behind most activation bytes at the peak, and how many
    /// times it ran (the blocks activation checkpointing would recompute).
    pub repeated: Option<RepeatedLine>,
    /// The allocator at the peak (None when the trace could not be replayed).
    pub allocator: Option<AllocatorShare>,
    /// Remedies, most bytes saved first.
    pub remedies: Vec<Remedy>,
    /// The capacity the remedies were judged on.
    pub capacity: Option<u64>,
    /// What could not be used, in words.
    pub notes: Vec<String>,
    /// Every allocation with its category (not serialized: the annotated pickle carries them).
    #[serde(skip)]
    pub allocations: Vec<Allocation>,
    /// Per trace entry, the index in `allocations` of the block it allocates or frees.
    #[serde(skip)]
    pub entry_allocation: Vec<Option<u32>>,
    /// Bytes per category at the end of each phase window, with the replayed allocator's
    /// totals: what `--out` exports as `simulate` exports its timeline (not serialized with
    /// the report).
    #[serde(skip)]
    pub timeline: Timeline,
}

/// Bytes live after each entry (tensor bytes).
fn live_curve(allocs: &[Allocation], entries: usize) -> Vec<u64> {
    let mut delta = vec![0i128; entries + 1];
    let mut start: i128 = 0;
    for a in allocs {
        match a.alloc_at {
            Some(k) => delta[k] += i128::from(a.size),
            None => start += i128::from(a.size),
        }
        if let Some(f) = a.free_at {
            delta[f] -= i128::from(a.size);
        }
    }
    let mut out = Vec::with_capacity(entries);
    let mut cur = start;
    for d in delta.iter().take(entries) {
        cur += d;
        out.push(cur.max(0) as u64);
    }
    out
}

fn moment(
    f: &FramedSnapshot,
    lt: &Lifetimes,
    entry: usize,
    top: usize,
    site_names: &mut SiteNames,
) -> Moment {
    let mut by_cat = [0u64; Category::ALL.len()];
    // one line per site and category: a line that made activations and tensors of another
    // category shows each apart, so no site line claims more of a category than it holds
    let mut sites: HashMap<(String, Category), (u64, u64)> = HashMap::new();
    let mut live = 0;
    for a in lt.allocations.iter().filter(|a| a.live_after(entry)) {
        live += a.size;
        by_cat[a.category.index()] += a.size;
        let key = (a.stack, a.alloc_at.is_none(), a.category);
        let name = site_names
            .entry(key)
            .or_insert_with(|| site_label(f.stack(a.stack), key.1, a.category.name()))
            .clone();
        let s = sites.entry((name, a.category)).or_insert((0, 0));
        s.0 += a.size;
        s.1 += 1;
    }
    let mut top_sites: Vec<SiteBytes> = sites
        .into_iter()
        .map(|((site, category), (bytes, count))| SiteBytes {
            site,
            category,
            bytes,
            count,
        })
        .collect();
    top_sites.sort_by(|a, b| {
        b.bytes
            .cmp(&a.bytes)
            .then(a.site.cmp(&b.site))
            .then(a.category.index().cmp(&b.category.index()))
    });
    top_sites.truncate(top);
    let w = lt.window_of.get(entry).map(|&w| lt.windows[w as usize]);
    Moment {
        entry,
        phase: w.and_then(|w| w.phase),
        cycle: w.map_or(0, |w| w.cycle),
        live_bytes: live,
        by_category: Category::ALL
            .into_iter()
            .filter(|c| by_cat[c.index()] > 0)
            .map(|c| (c, by_cat[c.index()]))
            .collect(),
        top_sites,
    }
}

/// The allocator at entry `at` of a replay from the rebuilt start state (with the
/// recording's peak reserved bytes), and after each entry of `ends` (ascending).
fn allocator_share(
    prepared: &PreparedTrace,
    at: usize,
    ends: &[usize],
) -> Result<(AllocatorShare, Vec<timeline::ReplayedAt>), String> {
    let mut rep = prepared.replayer(ROOM, None).map_err(|e| e.to_string())?;
    let mut share = None;
    let mut samples = Vec::with_capacity(ends.len());
    let mut peak = timeline::ReplayedAt::default();
    let sample = |a: &trainmem_alloc::CachingAllocator<_>, peak: &mut timeline::ReplayedAt| {
        let now = timeline::ReplayedAt {
            allocated: a.memory_allocated(),
            reserved: a.memory_reserved(),
            peak_allocated: peak.peak_allocated.max(a.memory_allocated()),
            peak_reserved: peak.peak_reserved.max(a.memory_reserved()),
        };
        *peak = timeline::ReplayedAt::default();
        now
    };
    for (origin, op) in prepared.ops.iter().cloned() {
        let index = match origin {
            trainmem_alloc::pytorch::replay::Origin::Entry { index, .. } => index,
            _ => 0,
        };
        if share.is_none() && index > at {
            share = Some(snapshot_share(rep.allocator()));
        }
        while samples.len() < ends.len() && index > ends[samples.len()] {
            samples.push(sample(rep.allocator(), &mut peak));
        }
        rep.apply(origin, op).map_err(|e| e.to_string())?;
        let a = rep.allocator();
        peak.peak_allocated = peak.peak_allocated.max(a.memory_allocated());
        peak.peak_reserved = peak.peak_reserved.max(a.memory_reserved());
    }
    while samples.len() < ends.len() {
        samples.push(sample(rep.allocator(), &mut peak));
    }
    let mut s = share.unwrap_or_else(|| snapshot_share(rep.allocator()));
    s.peak_reserved = prepared.recorded.peak_reserved;
    Ok((s, samples))
}

fn snapshot_share<D: trainmem_alloc::DeviceMemory>(
    a: &trainmem_alloc::CachingAllocator<D>,
) -> AllocatorShare {
    let snap = a.snapshot();
    let reserved = a.memory_reserved();
    let held: u64 = snap
        .segments
        .iter()
        .filter(|s| !s.is_free())
        .map(|s| s.total_size)
        .sum();
    AllocatorShare {
        reserved,
        allocated: a.memory_allocated(),
        largest_free_block: a.largest_free_block(),
        empty_cache_would_release: reserved.saturating_sub(held),
        peak_reserved: 0,
    }
}

/// Explains one device's trace of a snapshot.
pub fn explain_snapshot(
    f: &FramedSnapshot,
    opts: &ExplainOptions,
) -> Result<SnapshotExplanation, ExplainError> {
    let traces = &f.snapshot.device_traces;
    let (device, devices) = pick_device(traces, opts.device)?;
    let trace = &traces[device];
    let mut lt = lifetimes::lifetimes(f, device);
    let curve = live_curve(&lt.allocations, trace.len());
    if lt.windows.iter().all(|w| w.phase.is_none())
        && let Some(windows) = shape::infer_windows(trace, &lt.allocations, &curve)
    {
        lt.set_windows(windows);
        lt.phases_inferred = true;
    }
    let model_state = categorize::categorize(&mut lt);
    let mut notes = reading_notes(f, &lt, devices, device);
    let peak_at = peak_entry(&curve);
    let mut names = HashMap::new();
    let peak = moment(f, &lt, peak_at, opts.top_sites, &mut names);
    let end = moment(
        f,
        &lt,
        trace.len().saturating_sub(1),
        opts.top_sites,
        &mut names,
    );
    let oom = trace
        .iter()
        .position(|e| e.action == TraceAction::Oom)
        .map(|k| moment(f, &lt, k, opts.top_sites, &mut names));
    let coverage = coverage(&lt, peak_at, trace.len());
    let (steps, growth) = steps::steps(f, &lt, &curve, &mut names);
    let repeated = repeated::repeated_line(f, &lt, peak_at);
    // the trace is prepared for replays once: the allocator's share and every replayed
    // remedy start from it
    let prepared = prepare_trace(&f.snapshot, device).map_err(|e| e.to_string());
    let recorded_capacity = prepared.as_ref().ok().and_then(|p| p.recorded.oom_capacity);
    let capacity = opts.capacity.or(recorded_capacity);
    let ends = timeline::sample_ends(&lt);
    let (allocator, replayed) = replayed_share(&prepared, peak_at, &ends, &mut notes);
    let oom_request = lt.oom_at.map(|k| OomRequest {
        entry: k,
        requested: trace[k].size,
        device_free: trace[k].addr,
        capacity: recorded_capacity,
        needed_reserved: prepared
            .as_ref()
            .ok()
            .and_then(|p| run_prepared(p, ROOM, &Scenario::recorded()).ok())
            .map(|o| o.peak_reserved),
    });
    let timeline = timeline::timeline(
        &lt,
        &curve,
        &ends,
        replayed.as_deref(),
        |k| trace.get(k).and_then(|e| e.time_us),
        TimelineMeta {
            name: format!("PyTorch memory snapshot, device {device}"),
            producer: format!("trainmem-sim {} explain", env!("CARGO_PKG_VERSION")),
            device: format!("cuda:{device} (recorded)"),
            device_capacity: opts.capacity.or(recorded_capacity),
            ..TimelineMeta::default()
        },
    );
    let entry_allocation = entry_allocations(&lt, trace);
    let mut ex = SnapshotExplanation {
        device,
        devices_with_traces: devices,
        coverage,
        model_state,
        peak,
        oom,
        oom_request,
        end,
        steps,
        growth,
        repeated,
        allocator,
        remedies: Vec::new(),
        capacity,
        notes,
        allocations: lt.allocations,
        entry_allocation,
        timeline,
    };
    ex.remedies = remedies::remedies(&ex, prepared.as_ref().ok().filter(|_| opts.replay_remedies));
    Ok(ex)
}

/// The device to explain and how many devices have a trace.
fn pick_device(
    traces: &[Vec<TraceEntry>],
    asked: Option<usize>,
) -> Result<(usize, usize), ExplainError> {
    let devices = traces.iter().filter(|t| !t.is_empty()).count();
    if devices == 0 {
        return Err(ExplainError::NoTrace);
    }
    let device = match asked {
        Some(d) if traces.get(d).is_some_and(|t| !t.is_empty()) => d,
        Some(d) => {
            return Err(ExplainError::NoSuchDevice {
                device: d,
                devices: traces.len(),
            });
        }
        None => traces.iter().position(|t| !t.is_empty()).unwrap_or(0),
    };
    Ok((device, devices))
}

/// Notes on what reading the trace could not use or decide.
fn reading_notes(f: &FramedSnapshot, lt: &Lifetimes, devices: usize, device: usize) -> Vec<String> {
    let mut notes = Vec::new();
    if devices > 1 {
        notes.push(format!(
            "{devices} devices recorded a trace; device {device} is explained (--device N for another)"
        ));
    }
    let trace = f
        .snapshot
        .device_traces
        .get(device)
        .map_or(&[][..], Vec::as_slice);
    if f.snapshot.segments.is_empty() && !trace.is_empty() {
        notes.push(
            "the snapshot holds no segments: what was live when recording began and never \
             freed (the model's parameters, usually) is not seen, so the figures are of the \
             trace's own allocations and the blocks it freed"
                .into(),
        );
    }
    let unknown = trace
        .iter()
        .filter(|e| matches!(e.action, TraceAction::Other(_)))
        .count();
    if unknown > 0 {
        notes.push(format!(
            "{unknown} trace entr{} with an action trainmem does not know were left out",
            if unknown == 1 { "y" } else { "ies" }
        ));
    }
    if lt.entries_with_frames == 0 {
        notes.push(
            "the trace recorded no stacks: every category was decided by lifetime alone \
             (record with torch.cuda.memory._record_memory_history(stacks=\"all\") for frames)"
                .into(),
        );
    }
    if lt.phases_inferred {
        notes.push(format!(
            "no stack named a phase: {} training step(s) were inferred from the trace's \
             repeating shape and split into forward pass, backward and optimizer step by their \
             gradients; categories decided this way are less sure than by frames",
            lt.windows.iter().map(|w| w.cycle + 1).max().unwrap_or(0)
        ));
    }
    if f.unreadable_frames > 0 {
        notes.push(format!(
            "{} frame(s) in a form not seen before were left out",
            f.unreadable_frames
        ));
    }
    if lt.unmatched_allocs > 0 {
        notes.push(format!(
            "{} alloc(s) at an address already live (their free was not recorded)",
            lt.unmatched_allocs
        ));
    }
    let kept_other: u64 = lt
        .allocations
        .iter()
        .filter(|a| a.alloc_at.is_none() && a.free_at.is_none() && a.category == Category::Other)
        .map(|a| a.size)
        .sum();
    if kept_other > 0 {
        notes.push(format!(
            "{} were live throughout the recording with no gradient of their size: frozen \
             parameters (a frozen base under LoRA), buffers or data kept; counted as other",
            trainmem_core::bytes::human(kept_other)
        ));
    }
    notes
}

/// The entry with the most live bytes (the first of equals).
fn peak_entry(curve: &[u64]) -> usize {
    curve
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(&a.0)))
        .map_or(0, |(k, _)| k)
}

/// How much of the peak's bytes its own stacks categorized.
fn coverage(lt: &Lifetimes, peak_at: usize, entries: usize) -> Coverage {
    let (mut by_frames, mut total) = (0u64, 0u64);
    for a in lt.allocations.iter().filter(|a| a.live_after(peak_at)) {
        total += a.size;
        if a.by_frames {
            by_frames += a.size;
        }
    }
    let share = |x: u64| {
        if total == 0 {
            0.0
        } else {
            x as f64 / total as f64
        }
    };
    Coverage {
        entries_with_frames: lt.entries_with_frames,
        entries,
        peak_share_by_frames: share(by_frames),
        peak_share_by_lifetime: share(total - by_frames),
    }
}

/// The allocator's share at the peak and the replayed samples, or a note why not.
fn replayed_share(
    prepared: &Result<PreparedTrace, String>,
    peak_at: usize,
    ends: &[usize],
    notes: &mut Vec<String>,
) -> (Option<AllocatorShare>, Option<Vec<timeline::ReplayedAt>>) {
    let share = prepared
        .as_ref()
        .map_err(String::clone)
        .and_then(|p| allocator_share(p, peak_at, ends));
    match share {
        Ok((s, r)) => (Some(s), Some(r)),
        Err(e) => {
            notes.push(format!(
                "the trace could not be replayed for the allocator's share: {e}"
            ));
            (None, None)
        }
    }
}

/// Per trace entry, the allocation it allocates or frees (its free requests included).
fn entry_allocations(lt: &Lifetimes, trace: &[TraceEntry]) -> Vec<Option<u32>> {
    let mut entry_allocation = vec![None; trace.len()];
    for (i, a) in lt.allocations.iter().enumerate() {
        for k in [a.alloc_at, a.free_at].into_iter().flatten() {
            entry_allocation[k] = Some(i as u32);
        }
    }
    // free_requested entries of the same block too
    let mut live_by_addr: HashMap<u64, u32> = HashMap::new();
    for (k, e) in trace.iter().enumerate() {
        match e.action {
            TraceAction::Alloc => {
                if let Some(i) = entry_allocation[k] {
                    live_by_addr.insert(e.addr, i);
                }
            }
            TraceAction::FreeRequested | TraceAction::FreeCompleted
                if entry_allocation[k].is_none() =>
            {
                entry_allocation[k] = live_by_addr.get(&e.addr).copied();
            }
            _ => {}
        }
    }
    entry_allocation
}

#[cfg(test)]
mod tests;
