//! Host patterns: the spike at the start of epochs, the spike while a checkpoint is
//! written, host memory above the host's capacity.

use trainmem_core::Category;

use super::{Finding, PatternKind};
use crate::engine::Summary;
use crate::profile::{CheckpointRecord, FrameworkProfile};
use trainmem_core::bytes::human;
use trainmem_core::plan::Plan;
use trainmem_core::timeline::{Domain, Phase, Timeline};

/// Host memory peaking in the first batches of epochs as workers start together.
pub(super) fn epoch_spike(plan: &Plan, t: &Timeline, _s: &Summary, out: &mut Vec<Finding>) {
    let host: Vec<u64> = t.samples.iter().map(|x| x.host.anon_rss).collect();
    let starts = t.indices_at(Phase::EpochStart);
    if !starts.is_empty() && plan.loader.workers > 0 {
        let spikes: Vec<(u64, u64, u64)> = starts
            .iter()
            .map(|&i| {
                let epoch = t.samples[i].epoch;
                let in_epoch: Vec<u64> = t
                    .samples
                    .iter()
                    .enumerate()
                    .filter(|(_, x)| x.epoch == epoch && x.phase == Phase::BatchLoaded)
                    .map(|(j, _)| host[j])
                    .collect();
                let first = in_epoch.first().copied().unwrap_or(0);
                let last = in_epoch.last().copied().unwrap_or(0);
                (epoch, first, last)
            })
            .collect();
        let spiking: Vec<&(u64, u64, u64)> = spikes.iter().filter(|s| s.1 > s.2).collect();
        if !spiking.is_empty() {
            let h = spiking.iter().map(|s| s.1 - s.2).max().unwrap_or(0);
            let which: Vec<String> = spiking.iter().map(|s| s.0.to_string()).collect();
            let mut text = format!(
                "Host memory (anonymous RSS) peaks in the first batches of epoch(s) {} by up to {} above the steady state: {} worker(s) start together, each filling {} prefetch slot(s) and holding augmentation scratch at once.",
                which.join(", "),
                human(h),
                plan.loader.workers,
                plan.loader.prefetch_factor
            );
            if plan.loader.persistent_workers {
                text.push_str(" Persistent workers keep their queues across epochs, so later epochs stay flat.");
            } else {
                text.push_str(" Workers are respawned every epoch (persistent_workers = false), so the spike repeats; persistent workers flatten later epochs.");
            }
            out.push(Finding {
                kind: PatternKind::EpochSpike,
                domain: Domain::Host,
                bytes: h as i128,
                step: None,
                text,
            });
        }
    }
}

/// A host spike while a checkpoint is written: the framework's record of what it writes
/// ([`CheckpointRecord`]), `temporary` or `other` host bytes above the sample before.
pub(super) fn checkpoint_spike(plan: &Plan, t: &Timeline, _s: &Summary, out: &mut Vec<Finding>) {
    let Some(i) = t
        .samples
        .iter()
        .position(|x| x.phase == Phase::CheckpointSave)
    else {
        return;
    };
    let held = |j: usize| {
        let c = &t.samples[j].host.categories;
        c.get(Category::Temporary) + c.get(Category::Other)
    };
    let (during, before) = (held(i), i.checked_sub(1).map_or(0, held));
    let what = match FrameworkProfile::for_plan(plan).checkpoint {
        CheckpointRecord::F32ParameterCopy => {
            "an f32 copy of every parameter, the record it writes"
        }
        CheckpointRecord::SerialisedState => "parameters and optimizer state serialised",
    };
    out.push(Finding {
        kind: PatternKind::CheckpointSpike,
        domain: Domain::Host,
        bytes: during as i128 - before as i128,
        step: Some(t.samples[i].step),
        text: format!(
            "Every {} steps a checkpoint is written: host memory spikes by {} ({what}) and drops back when the file is written.",
            plan.training.checkpoint_every,
            human(during.saturating_sub(before))
        ),
    });
}

/// Host memory above the plan's host capacity.
pub(super) fn host_over_capacity(plan: &Plan, t: &Timeline, s: &Summary, out: &mut Vec<Finding>) {
    if let Some(cap) = plan.host.capacity
        && s.peak_host_rss > cap.0
    {
        out.push(Finding {
            kind: PatternKind::OutOfMemory,
            domain: Domain::Host,
            bytes: s.peak_host_rss as i128 - cap.0 as i128,
            step: t.peak_host_rss().map(|p| t.samples[p.sample].step),
            text: format!(
                "Host memory peaks at {}, above the host capacity of {}: the process would be killed or swap. The largest host category at the peak decides the remedy (fewer workers or prefetch slots, persistent workers, memory-mapped data).",
                human(s.peak_host_rss),
                human(cap.0)
            ),
        });
    }
}
