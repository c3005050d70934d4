//! `checkpoint-save`: live host memory spikes by about the model size while a checkpoint is
//! being written, and falls back right after; with no saves there is no spike. The copy is
//! host memory on every backend: on a GPU the device holds nothing more during a save.

use trainmem_core::Category;
use trainmem_core::timeline::{Phase, Timeline};

use crate::checks::{
    close, delta, host_bytes_at, host_series_at, index_of, param_bytes, place, points, spread,
};
use crate::ctx::{Ctx, Judgement};
use crate::error::Result;
use crate::report::{Figure, VerdictKind};

/// Which bytes cause the pattern and what removes it.
pub const EXPLANATION: &[&str] = &[
    "To write a checkpoint, burn turns the module into a record and the record into a \
     serialisable item (full precision) before `BinFileRecorder` streams it to the file. That \
     item owns a host copy of every parameter, so while the save runs the live bytes are the \
     training state plus one more model: a spike of the parameter bytes at every save. The \
     copy is dropped as soon as the file is written, so the level after the save is the level \
     before it. The copy is host memory whatever device trains: on a GPU every parameter is \
     read back into host buffers (page-locked ones on CUDA), so host RAM spikes while device \
     memory stays flat.",
    "Knob: `training.checkpoint_every = 0` (no saves) removes the spike. With saves, budget one \
     extra model copy of headroom at each save point; saving less often only makes the spikes \
     rarer, not smaller.",
];

/// The largest relative difference allowed between the spike and the parameter bytes: the
/// record also holds each parameter's name and shape, a few hundred bytes per tensor.
const SPIKE_MARGIN: f64 = 0.05;

/// One save: the live host bytes after the optimizer step it follows, during the save, and at
/// the next sample, with the `temporary` bytes during the save. Host bytes whatever device
/// trains: the copy a checkpoint is written from is host memory (on a CPU device, host memory
/// is where the tensors are too; on a GPU the device holds nothing more during a save).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Save {
    step: u64,
    before: u64,
    during: u64,
    after: u64,
    temporary: u64,
}

impl Save {
    fn spike(&self) -> i64 {
        delta(self.before, self.during)
    }

    fn fall(&self) -> i64 {
        delta(self.after, self.during)
    }
}

/// Every checkpoint save in `t`.
fn saves(t: &Timeline) -> Vec<Save> {
    points(t, Phase::CheckpointSave)
        .into_iter()
        .filter_map(|i| {
            let step = t.samples[i].step;
            let before = index_of(t, step, Phase::OptimizerStep)?;
            let after = (i + 1 < t.samples.len()).then_some(i + 1)?;
            Some(Save {
                step,
                before: host_bytes_at(t, before, None),
                during: host_bytes_at(t, i, None),
                after: host_bytes_at(t, after, None),
                temporary: host_bytes_at(t, i, Some(Category::Temporary)),
            })
        })
        .collect()
}

/// Whether every save spikes by the parameter bytes (within [`SPIKE_MARGIN`]) and falls back by
/// at least 90% of them at the next sample (which may already hold the next batch).
fn spikes_by_model_size(t: &Timeline, expected_saves: u64) -> Judgement {
    let params = param_bytes(t);
    let s = saves(t);
    let spikes: Vec<i64> = s.iter().map(Save::spike).collect();
    let falls: Vec<i64> = s.iter().map(Save::fall).collect();
    let spike_ok = spikes
        .iter()
        .all(|&d| d > 0 && close(d as u64, params, SPIKE_MARGIN));
    let fall_ok = falls.iter().all(|&f| f as f64 >= 0.9 * params as f64);
    let ok = s.len() as u64 == expected_saves && expected_saves > 0 && spike_ok && fall_ok;
    let min_spike = spikes.iter().copied().min().unwrap_or(0);
    let max_spike = spikes.iter().copied().max().unwrap_or(0);
    let min_fall = falls.iter().copied().min().unwrap_or(0);
    Judgement::new(
        ok,
        format!(
            "{} saves (expected {expected_saves}); live bytes at checkpoint_save minus after the \
             step's optimizer_step: {min_spike}..{max_spike} bytes = {:.3}..{:.3} x parameter \
             bytes (expected 1 +/- {SPIKE_MARGIN}); at the next sample they fall by at least \
             {min_fall} bytes (at least 0.9 x parameter bytes)",
            s.len(),
            min_spike as f64 / params.max(1) as f64,
            max_spike as f64 / params.max(1) as f64,
        ),
        vec![
            Figure::bytes("parameter bytes", params),
            Figure::count("saves", s.len() as u64),
            Figure::delta("smallest spike", min_spike),
            Figure::delta("largest spike", max_spike),
            Figure::delta("smallest fall after the save", min_fall),
        ],
    )
}

/// Whether the copy is tagged `temporary` (burn's save runs under that tag) and is about the
/// parameter bytes.
fn copy_is_temporary(t: &Timeline) -> Judgement {
    let params = param_bytes(t);
    let s = saves(t);
    let temps: Vec<u64> = s.iter().map(|x| x.temporary).collect();
    let ok = !s.is_empty() && temps.iter().all(|&b| close(b, params, SPIKE_MARGIN));
    let at = points(t, Phase::CheckpointSave)
        .first()
        .map(|&i| place(&t.samples[i]))
        .unwrap_or_else(|| "no checkpoint_save sample".into());
    let first = s.first().copied();
    Judgement::new(
        ok,
        format!(
            "`temporary` bytes during each save: {:?} (each expected 1 +/- {SPIKE_MARGIN} x the \
             {params} parameter bytes; first save {at}, step {})",
            temps,
            first.map_or(0, |x| x.step)
        ),
        vec![
            Figure::bytes("parameter bytes", params),
            Figure::bytes(
                "temporary at the first save",
                temps.first().copied().unwrap_or(0),
            ),
        ],
    )
}

/// Knob: with no checkpoints (`b`) there is no save sample and the step levels stay flat, while
/// the run with saves (`a`) climbs at least 0.9 x the parameter bytes above them at a save.
fn no_saves_no_spike(a: &Timeline, b: &Timeline) -> Judgement {
    let params = param_bytes(b);
    let saves_b = points(b, Phase::CheckpointSave).len();
    let steps_b = host_series_at(b, Phase::OptimizerStep, None);
    let flat = spread(&steps_b);
    let top_b = steps_b.iter().copied().max().unwrap_or(0);
    let top_a = saves(a).iter().map(|s| s.during).max().unwrap_or(0);
    let ok = saves_b == 0
        && (flat as f64) <= 0.01 * params as f64
        && top_a as f64 >= top_b as f64 + 0.9 * params as f64;
    Judgement::new(
        ok,
        format!(
            "without saves: {saves_b} checkpoint_save samples, live bytes after the \
             optimizer steps vary by {flat} bytes (at most 1% of the parameter bytes); \
             with saves the save level ({top_a}) is at least 0.9 x parameter bytes above \
             that ({top_b})"
        ),
        vec![
            Figure::bytes("parameter bytes", params),
            Figure::bytes("highest save level, with saves", top_a),
            Figure::bytes("highest step level, no saves", top_b),
            Figure::bytes("spread over steps, no saves", flat),
        ],
    )
}

/// Pattern: every checkpoint file the run wrote (`sizes`, in bytes) holds the parameter
/// bytes, and there is one per save.
fn files_hold_the_parameters(sizes: &[u64], expected: u64, params: u64) -> Judgement {
    let ok = sizes.len() as u64 == expected
        && expected > 0
        && sizes.iter().all(|&b| close(b, params, SPIKE_MARGIN));
    Judgement::new(
        ok,
        format!(
            "{} checkpoint files (expected {expected}) of {sizes:?} bytes, each expected \
             1 +/- {SPIKE_MARGIN} x the {params} parameter bytes",
            sizes.len()
        ),
        vec![
            Figure::bytes("parameter bytes", params),
            Figure::bytes("first file", sizes.first().copied().unwrap_or(0)),
        ],
    )
}

/// Runs the scenario.
pub fn run(ctx: &mut Ctx) -> Result<()> {
    let plan = ctx.plan("checkpoint-save")?;
    let every = plan.training.checkpoint_every;
    let expected = plan.total_steps().checked_div(every).unwrap_or(0);
    let base = ctx.run(&format!("checkpoint every {every} steps"), &plan)?;
    ctx.check(
        base,
        VerdictKind::Pattern,
        "each save spikes live memory by the parameter bytes, gone right after",
        move |t| spikes_by_model_size(t, expected),
    );
    ctx.check(
        base,
        VerdictKind::Pattern,
        "the checkpoint copy is tagged `temporary`",
        copy_is_temporary,
    );
    if let Some(m) = &ctx.record(base).measured {
        // the sizes the run read right after writing each file; a run recorded before they
        // were kept is read from its files, where they still exist
        let sizes: Vec<u64> = if m.checkpoint_sizes.is_empty() {
            m.checkpoints
                .iter()
                .filter_map(|p| std::fs::metadata(p).ok().map(|md| md.len()))
                .collect()
        } else {
            m.checkpoint_sizes.clone()
        };
        let params = m.parameter_bytes;
        ctx.push_verdict(
            VerdictKind::Pattern,
            "each checkpoint file holds the parameter bytes (the spike is the file's content)",
            trainmem_core::timeline::Source::Measured,
            files_hold_the_parameters(&sizes, expected, params),
        );
    }

    let mut off = plan.clone();
    off.training.checkpoint_every = 0;
    let knob = ctx.run("no checkpoints (knob)", &off)?;
    ctx.compare(
        base,
        knob,
        VerdictKind::Knob,
        "checkpoint_every = 0: no save, no spike",
        no_saves_no_spike,
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checks::testing::{sample, timeline as of};
    use trainmem_core::timeline::Source;

    fn timeline(spike: u64) -> Timeline {
        let at = |phase, step, temp: u64| {
            sample(
                phase,
                step,
                0,
                &[(Category::Parameter, 1000), (Category::Temporary, temp)],
            )
        };
        of(
            Source::Simulated,
            [
                at(Phase::ModelInit, 0, 0),
                at(Phase::OptimizerStep, 0, 0),
                at(Phase::CheckpointSave, 0, spike),
                at(Phase::OptimizerStep, 1, 0),
            ],
        )
    }

    #[test]
    fn a_spike_of_the_parameter_bytes_passes_and_others_fail() {
        let t = timeline(1010);
        assert_eq!(saves(&t).len(), 1);
        assert_eq!(saves(&t)[0].spike(), 1010);
        assert!(spikes_by_model_size(&t, 1).ok);
        assert!(copy_is_temporary(&t).ok);
        assert!(!spikes_by_model_size(&t, 2).ok);
        assert!(!spikes_by_model_size(&timeline(500), 1).ok);
        assert!(!copy_is_temporary(&timeline(2000)).ok);
    }
}
