//! `empty-cache`: cached-but-unused device memory after an epoch, what `empty_cache` gives back,
//! and a fragmentation out-of-memory error while the total free memory would suffice.
//!
//! The pattern lives in a GPU caching allocator, so on the CPU it is reproduced through
//! trainmem-alloc's caching allocator (PyTorch's rules) over its host device, driven by the real
//! burn run's own tensor allocations: the run is traced (every allocation and free of at least
//! [`MIN_TRACE`] bytes made by the training thread, cut at the run's phase boundaries) and the
//! trace is replayed. The twin simulates the same plan on a GPU. On CUDA, burn's device memory
//! comes from cubecl's own pools and the measured timeline shows its figures directly.

use trainmem_alloc::{
    AllocError, AllocatorConfig, CachingAllocator, HostDevice, LARGE_BUFFER, OutOfMemory, StreamId,
    TraceAction, allocation_size,
};
use trainmem_burn::MeasuredRun;
use trainmem_core::Plan;
use trainmem_core::plan::{DeviceKind, EmptyCachePolicy};
use trainmem_core::timeline::{Phase, Source, Timeline};
use trainmem_probe::TraceKind;
use trainmem_sim::SimResult;

use crate::ctx::{Ctx, Judgement};
use crate::error::alloc_error;
use crate::error::{Result, ScenarioError};
use crate::replay::{EmptyCacheCheck, MIN_TRACE, replay};
use crate::report::{Figure, VerdictKind, mib};

const MIB: u64 = 1 << 20;

/// Which bytes cause the pattern and what removes it.
pub const EXPLANATION: &[&str] = &[
    "A caching allocator (PyTorch's, cubecl's pools) keeps freed blocks for reuse instead of \
     returning them to the driver. After an epoch the activations and gradients of the last \
     step are freed but stay reserved: nvidia-smi and memory_reserved show far more than the \
     live tensors (memory_allocated). Nothing leaks; the next step reuses the cache.",
    "empty_cache returns only segments with no live block. A segment that still holds one live \
     tensor (a kept metric, a tensor carved out of a larger cached block) stays reserved with \
     its free bytes, which nothing can return. The same splitting causes fragmentation: a large \
     cached block split by smaller tensors, one of which stays alive, cannot serve the large \
     request again, and a new segment does not fit, so the allocation fails although free \
     device memory plus cached free memory exceeds it. empty_cache does not help there.",
    "Knobs: free what pins the segment (the kept tensor) before the large request or before \
     empty_cache; max_split_size_mb below the large size keeps large blocks from being split \
     for smaller requests, so they stay whole for the next large request.",
];

/// Allocation sizes of a source: the measured trace (training thread) or the twin's allocator
/// trace.
fn sizes_measured(run: &MeasuredRun) -> Vec<u64> {
    run.allocation_trace
        .iter()
        .filter(|e| e.thread == run.training_thread && e.kind == TraceKind::Alloc)
        .map(|e| e.size)
        .collect()
}

fn sizes_simulated(sim: &SimResult) -> Vec<u64> {
    sim.snapshot
        .iter()
        .flat_map(|s| s.device_traces.iter().flatten())
        .filter(|e| e.action == TraceAction::Alloc && e.size >= MIN_TRACE)
        .map(|e| e.size)
        .collect()
}

/// The fragmentation experiment's sizes from a run's tensors: the largest tensor, and the
/// largest tensor of at most a quarter of it (at least 1 MiB, so it is served from the large
/// pool and splits cached large blocks).
fn frag_sizes(sizes: &[u64]) -> Option<(u64, u64)> {
    let big = sizes.iter().copied().max()?;
    let small = sizes
        .iter()
        .copied()
        .filter(|&s| s <= big / 4 && s > MIB)
        .max()?;
    // max_split_size_mb must be at least 20 and below the large size for the knob, and the
    // device must hold the large segment beside a small tensor's own 20 MiB segment.
    (big >= 24 * MIB).then_some((big, small))
}

/// What the fragmentation experiment saw.
struct Frag {
    oom: Option<OutOfMemory>,
    capacity: u64,
}

/// A large tensor is allocated and freed (its block stays cached), four smaller ones of the
/// next iteration are carved out of it, three freed and one kept; then the large size is asked
/// for again on a device with room for the large size plus a bit more.
fn fragmentation(
    big: u64,
    small: u64,
    config: AllocatorConfig,
    free_pin_first: bool,
    empty_cache_first: bool,
) -> Result<Frag> {
    // Room for the large segment plus the segment a smaller tensor gets of its own (or half
    // the large size, if more) and 2 MiB: less than two large segments, so the large request
    // cannot get a second segment while the first is pinned, but enough for it once the small
    // tensors live elsewhere (the max_split_size_mb knob).
    let own_segment = allocation_size(small).unwrap_or(LARGE_BUFFER);
    let capacity = (big + own_segment.max(big / 2) + 2 * MIB).div_ceil(2 * MIB) * 2 * MIB;
    let mut a = CachingAllocator::with_config(HostDevice::new(capacity), config);
    let s = StreamId::DEFAULT;
    let b = a
        .malloc(big, s)
        .map_err(alloc_error("first large tensor"))?;
    a.free(b.id).map_err(alloc_error("free"))?;
    let mut smalls = Vec::new();
    for _ in 0..4 {
        smalls.push(a.malloc(small, s).map_err(alloc_error("smaller tensor"))?);
    }
    let pin = smalls.remove(1);
    for b in smalls {
        a.free(b.id).map_err(alloc_error("free"))?;
    }
    if free_pin_first {
        a.free(pin.id).map_err(alloc_error("free"))?;
    }
    if empty_cache_first {
        a.empty_cache().map_err(alloc_error("empty_cache"))?;
    }
    let oom = match a.malloc(big, s) {
        Ok(_) => None,
        Err(AllocError::OutOfMemory(report)) => Some(*report),
        Err(other) => return Err(alloc_error("the second large request")(other)),
    };
    Ok(Frag { oom, capacity })
}

fn split_config(big: u64) -> Result<AllocatorConfig> {
    let mb = (big / MIB).saturating_sub(1).max(20);
    AllocatorConfig::default()
        .with_max_split_size_mb(mb)
        .map_err(|source| ScenarioError::AllocatorConfig {
            context: format!("max_split_size_mb:{mb}"),
            source,
        })
}

/// Pattern: the second request for the large size fails although the device's free bytes
/// and the cache's free bytes together would hold it (a kept small tensor split the cached
/// large block).
fn oom_despite_free_memory(base: &Frag, big: u64, small: u64) -> Judgement {
    let sizes_fig = vec![
        Figure::bytes("large tensor (the run's largest)", big),
        Figure::bytes("smaller tensor (the run's, <= 1/4)", small),
        Figure::bytes("device capacity", base.capacity),
    ];
    match &base.oom {
        Some(o) => {
            let free_total = o.device_free + o.reserved_unallocated();
            let mut figs = sizes_fig;
            figs.push(Figure::bytes("device free at the OOM", o.device_free));
            figs.push(Figure::bytes("cached but free", o.reserved_unallocated()));
            Judgement::new(
                free_total >= big,
                format!(
                    "asking for {} again fails: the device has {} free and the cache {} free \
                     ({} together, at least the request), but the cached large block was split \
                     by a kept {} tensor",
                    mib(big),
                    mib(o.device_free),
                    mib(o.reserved_unallocated()),
                    mib(free_total),
                    mib(small)
                ),
                figs,
            )
        }
        None => Judgement::new(false, "the second large request succeeded", sizes_fig),
    }
}

/// The fragmentation verdicts for one source's tensor sizes.
fn fragmentation_verdicts(ctx: &mut Ctx, source: Source, sizes: &[u64]) -> Result<()> {
    let Some((big, small)) = frag_sizes(sizes) else {
        ctx.push_verdict(
            VerdictKind::Pattern,
            "fragmentation OOM although total free memory suffices",
            source,
            Judgement::new(
                false,
                "the run has no tensor of at least 24 MiB with one of 1 MiB..1/4 of it: \
                 enlarge the plan",
                vec![],
            ),
        );
        return Ok(());
    };
    let base = fragmentation(big, small, AllocatorConfig::default(), false, false)?;
    let j = oom_despite_free_memory(&base, big, small);
    ctx.push_verdict(
        VerdictKind::Pattern,
        "fragmentation OOM although total free memory suffices",
        source,
        j,
    );
    let with_empty = fragmentation(big, small, AllocatorConfig::default(), false, true)?;
    ctx.push_verdict(
        VerdictKind::Pattern,
        "empty_cache does not cure the fragmentation OOM",
        source,
        Judgement::new(
            with_empty.oom.is_some() && base.oom.is_some(),
            "calling empty_cache before the large request still fails: the split segment holds \
             a live tensor, so it cannot be returned",
            vec![],
        ),
    );
    let split = fragmentation(big, small, split_config(big)?, false, false)?;
    let mb = (big / MIB).saturating_sub(1).max(20);
    ctx.push_verdict(
        VerdictKind::Knob,
        &format!("max_split_size_mb below the large size ({mb})"),
        source,
        Judgement::new(
            split.oom.is_none() && base.oom.is_some(),
            format!(
                "with max_split_size_mb:{mb} the cached {} block is not split for the smaller \
                 tensors, which get their own segment; the second large request is served",
                mib(big)
            ),
            vec![],
        ),
    );
    let freed = fragmentation(big, small, AllocatorConfig::default(), true, false)?;
    ctx.push_verdict(
        VerdictKind::Knob,
        "free the kept tensor before the large request",
        source,
        Judgement::new(
            freed.oom.is_none() && base.oom.is_some(),
            "with the pinning tensor freed the split blocks merge back and the large request \
             reuses the cached block",
            vec![],
        ),
    );
    Ok(())
}

/// Reserved over allocated at the first epoch's end (before any empty_cache).
fn cache_ratio(t: &Timeline) -> Judgement {
    let Some(s) = t
        .samples
        .iter()
        .find(|s| s.phase == Phase::EpochEnd && s.epoch == 0)
    else {
        return Judgement::new(false, "no epoch_end sample", vec![]);
    };
    let (a, r) = (s.device.allocated, s.device.reserved);
    let ratio = r as f64 / a.max(1) as f64;
    Judgement::new(
        ratio >= 1.5,
        format!(
            "after the first epoch reserved/allocated = {ratio:.2} (at least 1.5): {} of freed \
             tensors stay cached beside {} of live ones",
            mib(r.saturating_sub(a)),
            mib(a)
        ),
        vec![
            Figure::bytes("allocated", a),
            Figure::bytes("reserved", r),
            Figure::ratio("reserved / allocated", ratio),
        ],
    )
}

/// empty_cache lowers reserved to at least allocated, never below.
fn empty_cache_effect(t: &Timeline) -> Judgement {
    let Some(i) = t.samples.iter().position(|s| s.phase == Phase::EmptyCache) else {
        return Judgement::new(false, "no empty_cache sample", vec![]);
    };
    let before = t.samples[..i]
        .iter()
        .rev()
        .find(|s| s.phase != Phase::EmptyCache)
        .map(|s| s.device.reserved)
        .unwrap_or(0);
    let s = &t.samples[i];
    let (after, allocated) = (s.device.reserved, s.device.allocated);
    Judgement::new(
        after < before && after >= allocated,
        format!(
            "empty_cache lowers reserved from {} to {} (allocated {}): the cache is returned, \
             live tensors stay",
            mib(before),
            mib(after),
            mib(allocated)
        ),
        vec![
            Figure::bytes("reserved before", before),
            Figure::bytes("reserved after", after),
            Figure::bytes("allocated", allocated),
        ],
    )
}

/// Pattern: `empty_cache` released exactly the segments that held no live block before the
/// call; the segments holding live tensors stay reserved.
fn releases_only_free_segments(c: &EmptyCacheCheck) -> Judgement {
    Judgement::new(
        c.released == c.fully_free_before && c.reserved_after == c.reserved_before - c.released,
        format!(
            "released {} = the segments with no live block before the call ({}); {} \
             segments holding live tensors stay ({} reserved after, {} allocated, {} \
             free but not releasable)",
            mib(c.released),
            mib(c.fully_free_before),
            c.segments_with_live_blocks,
            mib(c.reserved_after),
            mib(c.allocated),
            mib(c.non_releasable_after)
        ),
        vec![
            Figure::bytes("reserved before", c.reserved_before),
            Figure::bytes("released", c.released),
            Figure::bytes("fully free segments before", c.fully_free_before),
            Figure::bytes("reserved after", c.reserved_after),
            Figure::bytes("non-releasable after", c.non_releasable_after),
        ],
    )
}

/// The two cache rules every run of this scenario is judged by: the cache dwarfs the live
/// bytes after an epoch, and empty_cache returns the cache, not live tensors.
fn cache_verdicts(ctx: &mut Ctx, idx: usize) {
    ctx.check(
        idx,
        VerdictKind::Pattern,
        "reserved >> allocated after an epoch",
        cache_ratio,
    );
    ctx.check(
        idx,
        VerdictKind::Pattern,
        "empty_cache returns the cache, not live tensors",
        empty_cache_effect,
    );
}

/// On CUDA the measured run's device memory is cubecl's own (bytes in use and reserved by its
/// pools, `memory_cleanup` as empty_cache at every epoch end), beside the twin on a GPU; the
/// fragmentation experiment uses the twin's tensor sizes (host traces are not device tensors).
fn run_on_device(ctx: &mut Ctx, gpu: &Plan) -> Result<()> {
    let idx = ctx.run("on the GPU (cubecl's pools)", gpu)?;
    ctx.note(format!(
        "on {} the measured figures are cubecl's memory_usage (bytes in use / reserved) and \
         empty_cache is burn's memory_cleanup, sampled at every epoch end",
        ctx.backend
    ));
    cache_verdicts(ctx, idx);
    let sizes = ctx.record(idx).simulated.as_ref().map(sizes_simulated);
    if let Some(sizes) = sizes {
        fragmentation_verdicts(ctx, Source::Simulated, &sizes)?;
    }
    Ok(())
}

/// The scenario's plan on a GPU, with `empty_cache` at every epoch end: what it measures with
/// `--backend cuda` or `wgpu`.
pub fn gpu_plan(plan: &Plan) -> Plan {
    let mut gpu = plan.clone();
    gpu.device.kind = DeviceKind::Cuda;
    gpu.training.empty_cache = EmptyCachePolicy::EveryEpoch;
    gpu
}

/// Runs the scenario.
pub fn run(ctx: &mut Ctx) -> Result<()> {
    let plan = ctx.plan("empty-cache")?;
    let gpu = gpu_plan(&plan);

    if ctx.backend.on_device() {
        return run_on_device(ctx, &gpu);
    }
    let mut traced = None;
    if ctx.mode.measured() {
        // Measured runs are traced (`Ctx::run` asks for allocations of at least MIN_TRACE).
        let host = ctx.run("training run (host view)", &plan)?;
        traced = ctx.record(host).measured.clone();
    }
    let twin = if ctx.mode.simulated() {
        Some(ctx.simulate("caching allocator", &gpu)?)
    } else {
        None
    };

    let mut replayed = None;
    let mut check = None;
    if let Some(m) = &traced {
        let r = replay(&plan, m, AllocatorConfig::default(), true)?;
        if r.unmatched_frees > 0 {
            ctx.note(format!(
                "{} traced frees had no traced allocation (blocks made before the trace \
                 started) and were skipped",
                r.unmatched_frees
            ));
        }
        check = r.check;
        let mut run = m.clone();
        run.timeline = r.timeline;
        replayed = Some(run);
    }
    let sizes_twin = twin.as_ref().map(sizes_simulated);
    let sizes_real = traced.as_ref().map(sizes_measured);
    ctx.note(
        "the measured side of `through the caching allocator` is the real burn run's tensor \
         allocations replayed through trainmem-alloc over host memory; its twin is the same \
         plan simulated on a GPU with empty_cache at every epoch end",
    );
    let idx = ctx.add_run("through the caching allocator", &gpu, replayed, twin);
    ctx.without_twin_targets(
        idx,
        "the replay counts only allocations of at least 4 KiB; the twin's accuracy is judged on \
         the host view of the same run",
    );
    ctx.without_meta(
        idx,
        "its measured side replays the host-view run's allocations, which is compared with Meta",
    );

    cache_verdicts(ctx, idx);
    if let Some(c) = check {
        ctx.push_verdict(
            VerdictKind::Pattern,
            "empty_cache returns only fully free segments",
            Source::Measured,
            releases_only_free_segments(&c),
        );
    }
    if let Some(sizes) = sizes_real {
        fragmentation_verdicts(ctx, Source::Measured, &sizes)?;
    }
    if let Some(sizes) = sizes_twin {
        fragmentation_verdicts(ctx, Source::Simulated, &sizes)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fragmentation_fails_only_without_a_knob() {
        let (big, small) = (32 * MIB, 8 * MIB);
        let base =
            fragmentation(big, small, AllocatorConfig::default(), false, false).expect("run");
        let oom = base
            .oom
            .expect("the split cached block cannot serve the large request");
        assert!(oom.device_free + oom.reserved_unallocated() >= big);
        assert!(
            fragmentation(big, small, AllocatorConfig::default(), false, true)
                .expect("run")
                .oom
                .is_some()
        );
        let cfg = split_config(big).expect("config");
        assert!(
            fragmentation(big, small, cfg, false, false)
                .expect("run")
                .oom
                .is_none()
        );
        assert!(
            fragmentation(big, small, AllocatorConfig::default(), true, false)
                .expect("run")
                .oom
                .is_none()
        );
    }

    #[test]
    fn fragmentation_sizes_come_from_the_run() {
        let sizes = [4096, 3 * MIB, 8 * MIB, 9 * MIB, 32 * MIB];
        assert_eq!(frag_sizes(&sizes), Some((32 * MIB, 8 * MIB)));
        assert_eq!(
            frag_sizes(&[16 * MIB, 4 * MIB]),
            None,
            "largest below 24 MiB"
        );
        assert_eq!(frag_sizes(&[]), None);
    }
}
