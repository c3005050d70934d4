//! `epoch-spike`: host input bytes peak in the first batches of every epoch, when the loader
//! (re)starts its workers and refills its prefetch slots, and fall as the epoch's last batches
//! are taken; persistent workers stop the per-epoch respawn; loading in the training loop
//! (no workers) removes the refill.

use trainmem_core::Plan;
use trainmem_core::timeline::{Phase, Source, Timeline};

use crate::checks::host_input;
use crate::ctx::{Ctx, Judgement};
use crate::error::Result;
use crate::report::{Figure, VerdictKind};

/// Which bytes cause the pattern and what removes it.
pub const EXPLANATION: &[&str] = &[
    "trainmem-loader hands out batches built by worker threads and keeps at most \
     prefetch_factor x workers of them in flight. At the start of every epoch it queues that \
     many batch tasks at once; every worker starts building at the same time, each holding a \
     full output buffer and, with augmentation, a random-resize scratch of about \
     augmentation_scratch x the batch bytes. So within the epoch's first step the input bytes \
     climb from the epoch-end baseline to several batches. Mid-epoch one new task is queued per \
     batch taken, and in the epoch's last prefetch_factor x workers batches nothing new is \
     queued: the in-flight bytes drain to zero by the last batch. Without persistent workers \
     the worker threads are also joined at every epoch end and spawned again at the next \
     start, so the burst and the respawn repeat every epoch.",
    "Knobs: loader.persistent_workers = true spawns the workers once (workers threads instead \
     of epochs x workers) and keeps the pipeline full across the epoch boundary: once every \
     task of an epoch is handed out, each batch taken frees a slot that goes to the next \
     epoch's first batches. The epoch therefore ends with the next epoch's batches already \
     built (up to prefetch_factor x workers of them, held even after the last epoch until the \
     loader is dropped), and the next epoch starts from a full pipeline, refilled one batch at \
     a time at the training pace, instead of every worker building at once into an empty one. \
     loader.workers = 0 (each batch built in the training loop when asked for) removes the \
     refill altogether: the first and the last step of an epoch hold the same single batch.",
];

/// Bytes of one micro-batch as the loader hands it out (the model's input and target per
/// sample, times the micro-batch size).
fn batch_bytes(plan: &Plan) -> u64 {
    trainmem_sim::lower::input_bytes_per_sample(&plan.model) * plan.micro_batch_size()
}

/// Input bytes of one epoch: the highest value over the samples of its first step and over
/// those of its last step (batch loaded to optimizer step).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct EpochInput {
    epoch: u64,
    first: u64,
    last: u64,
    /// At the epoch's end sample, if it has one.
    end: Option<u64>,
    steps: usize,
}

impl EpochInput {
    /// First-step peak minus last-step peak.
    fn spike(&self) -> i64 {
        self.first as i64 - self.last as i64
    }
}

/// Groups `(epoch, step, phase, input bytes)` points into epochs. Only the phases of a training
/// step count (epoch start and end samples are left out).
fn epoch_windows(points: &[(u64, u64, Phase, u64)]) -> Vec<EpochInput> {
    let in_step = |p: Phase| {
        matches!(
            p,
            Phase::BatchLoaded
                | Phase::Forward
                | Phase::Backward
                | Phase::Metrics
                | Phase::OptimizerStep
        )
    };
    let mut epochs: Vec<u64> = points.iter().map(|p| p.0).collect();
    epochs.sort_unstable();
    epochs.dedup();
    epochs
        .into_iter()
        .filter_map(|e| {
            let own: Vec<&(u64, u64, Phase, u64)> =
                points.iter().filter(|p| p.0 == e && in_step(p.2)).collect();
            let first_step = own.iter().map(|p| p.1).min()?;
            let last_step = own.iter().map(|p| p.1).max()?;
            let max_at = |s: u64| {
                own.iter()
                    .filter(|p| p.1 == s)
                    .map(|p| p.3)
                    .max()
                    .unwrap_or(0)
            };
            let end = points
                .iter()
                .rfind(|p| p.0 == e && p.2 == Phase::EpochEnd)
                .map(|p| p.3);
            Some(EpochInput {
                epoch: e,
                first: max_at(first_step),
                last: max_at(last_step),
                end,
                steps: (last_step - first_step + 1) as usize,
            })
        })
        .collect()
}

fn input_epochs(t: &Timeline) -> Vec<EpochInput> {
    let points: Vec<(u64, u64, Phase, u64)> = t
        .samples
        .iter()
        .enumerate()
        .map(|(i, s)| (s.epoch, s.step, s.phase, host_input(t, i)))
        .collect();
    epoch_windows(&points)
}

fn spikes_text(epochs: &[EpochInput]) -> String {
    epochs
        .iter()
        .map(|e| format!("epoch {}: {:+}", e.epoch, e.spike()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The pattern: in every epoch, the first step's input peak exceeds the last step's by at
/// least one batch.
fn expect_spike(t: &Timeline, plan: &Plan) -> Judgement {
    let batch = batch_bytes(plan);
    let epochs = input_epochs(t);
    let all = epochs.len() as u64 == plan.training.epochs
        && epochs
            .iter()
            .all(|e| e.steps >= 2 && e.spike() >= batch as i64);
    let smallest = epochs.iter().map(EpochInput::spike).min().unwrap_or(0);
    let mut figures = vec![
        Figure::bytes("batch bytes", batch),
        Figure::delta("smallest first-step minus last-step input", smallest),
    ];
    for e in &epochs {
        figures.push(Figure::bytes(
            format!("epoch {} first-step input peak", e.epoch),
            e.first,
        ));
        figures.push(Figure::bytes(
            format!("epoch {} last-step input peak", e.epoch),
            e.last,
        ));
    }
    Judgement::new(
        all,
        format!(
            "in each of {} epochs ({} expected) input bytes at the first step exceed those at \
             the last step by at least one batch ({batch} bytes): {}",
            epochs.len(),
            plan.training.epochs,
            spikes_text(&epochs)
        ),
        figures,
    )
}

/// The persistent-workers knob, judged against the respawned run: at every epoch end the
/// persistent loader already holds batches of the next epoch (at least one batch more input
/// than the respawned run, whose pipeline is empty there), so the next epoch starts from a
/// full pipeline instead of an empty one.
fn persistent_judgement(base: &[EpochInput], pers: &[EpochInput], batch: u64) -> Judgement {
    let carried: Vec<i64> = base
        .iter()
        .zip(pers)
        .map(|(x, y)| match (x.end, y.end) {
            (Some(a), Some(b)) => b as i64 - a as i64,
            _ => i64::MIN,
        })
        .collect();
    let least = carried.iter().copied().min().unwrap_or(i64::MIN);
    let ok = base.len() == pers.len() && !pers.is_empty() && least >= batch as i64;
    let text = carried
        .iter()
        .zip(pers)
        .map(|(c, e)| {
            if *c == i64::MIN {
                format!("epoch {}: no epoch_end sample", e.epoch)
            } else {
                format!("epoch {}: {c:+}", e.epoch)
            }
        })
        .collect::<Vec<_>>()
        .join(", ");
    Judgement::new(
        ok,
        format!(
            "input at every epoch end is at least one batch ({batch} bytes) above the respawned \
             run's (the next epoch's batches are already prefetched): {text}"
        ),
        vec![
            Figure::delta(
                "smallest carry-over at an epoch end",
                least.max(i64::MIN + 1),
            ),
            Figure::bytes("batch bytes", batch),
        ],
    )
}

/// Loader threads spawned in a measured run, judged against `expected`.
fn threads_judgement(spawned: Option<u64>, expected: u64, what: &str) -> Judgement {
    let Some(n) = spawned else {
        return Judgement::new(false, "the measured run used no loader", vec![]);
    };
    Judgement::new(
        n == expected,
        format!("{what}: {n} loader threads spawned (expected {expected})"),
        vec![
            Figure::count("threads spawned", n),
            Figure::count("expected", expected),
        ],
    )
}

fn push_threads(ctx: &mut Ctx, run: usize, name: &str, kind: VerdictKind, expected: u64) {
    let Some(m) = &ctx.record(run).measured else {
        return;
    };
    let j = threads_judgement(m.loader_threads_spawned, expected, name);
    ctx.push_verdict(kind, name, Source::Measured, j);
}

/// Knob: with no workers (`b`) the first and last steps of every epoch hold the same input
/// bytes (within half a batch), where respawned workers (`a`) refill at every epoch start.
fn inline_loading_has_no_refill(a: &Timeline, b: &Timeline, batch: u64) -> Judgement {
    let (ea, eb) = (input_epochs(a), input_epochs(b));
    let worst = eb
        .iter()
        .map(|e| e.spike().unsigned_abs())
        .max()
        .unwrap_or(u64::MAX);
    let ok = eb.len() == ea.len() && !eb.is_empty() && 2 * worst < batch;
    Judgement::new(
        ok,
        format!(
            "without workers, first-step and last-step input differ by at most {worst} \
             bytes in every epoch (less than half a batch, {} bytes), against {} with \
             respawned workers",
            batch / 2,
            spikes_text(&ea)
        ),
        vec![
            Figure::bytes("largest first/last difference, no workers", worst),
            Figure::bytes("batch bytes", batch),
        ],
    )
}

/// Runs the scenario.
pub fn run(ctx: &mut Ctx) -> Result<()> {
    let plan = ctx.plan("epoch-spike")?;
    let epochs = plan.training.epochs;
    let workers = plan.loader.workers;
    if !(workers > 0 && !plan.loader.persistent_workers && epochs >= 2) {
        unsuited!("the epoch-spike plan needs workers respawned over at least two epochs");
    }
    let base = ctx.run("workers respawned every epoch", &plan)?;
    let p = plan.clone();
    ctx.check(
        base,
        VerdictKind::Pattern,
        "input bytes peak in the first batches of every epoch",
        |t| expect_spike(t, &p),
    );
    push_threads(
        ctx,
        base,
        "the workers are respawned at every epoch start",
        VerdictKind::Pattern,
        epochs * workers,
    );

    let mut persistent = plan.clone();
    persistent.loader.persistent_workers = true;
    let pers = ctx.run("persistent workers (knob)", &persistent)?;
    push_threads(
        ctx,
        pers,
        "persistent workers are spawned once",
        VerdictKind::Knob,
        workers,
    );
    let batch = batch_bytes(&plan);
    ctx.compare(
        base,
        pers,
        VerdictKind::Knob,
        "persistent workers carry the next epoch's batches across the epoch boundary",
        |a, b| persistent_judgement(&input_epochs(a), &input_epochs(b), batch),
    );

    let mut inline = plan.clone();
    inline.loader.workers = 0;
    let inl = ctx.run("no workers: batches built in the loop (knob)", &inline)?;
    ctx.compare(
        base,
        inl,
        VerdictKind::Knob,
        "loading in the training loop removes the epoch-start refill",
        |a, b| inline_loading_has_no_refill(a, b, batch),
    );
    ctx.note(format!(
        "At an epoch's first batch up to prefetch_factor x workers = {} batches of {batch} bytes \
         are in flight; the last {} batches of an epoch queue no new task.",
        plan.loader.prefetch_factor * workers,
        plan.loader.prefetch_factor * workers,
    ));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_take_the_first_and_last_step_of_each_epoch() {
        let pts = vec![
            (0, 0, Phase::EpochStart, 999),
            (0, 0, Phase::BatchLoaded, 50),
            (0, 0, Phase::Forward, 70),
            (0, 1, Phase::BatchLoaded, 40),
            (0, 2, Phase::BatchLoaded, 10),
            (0, 2, Phase::Forward, 20),
            (0, 2, Phase::EpochEnd, 999),
            (1, 3, Phase::BatchLoaded, 60),
            (1, 4, Phase::OptimizerStep, 5),
        ];
        let w = epoch_windows(&pts);
        assert_eq!(
            w,
            vec![
                EpochInput {
                    epoch: 0,
                    first: 70,
                    last: 20,
                    end: Some(999),
                    steps: 3
                },
                EpochInput {
                    epoch: 1,
                    first: 60,
                    last: 5,
                    end: None,
                    steps: 2
                },
            ]
        );
        assert_eq!(w[0].spike(), 50);
    }

    #[test]
    fn persistence_is_judged_on_the_epoch_end_carry_over() {
        let e = |end| EpochInput {
            epoch: 0,
            first: 100,
            last: 10,
            end: Some(end),
            steps: 6,
        };
        // Two batches of 50 carried over the boundary: the knob works.
        assert!(persistent_judgement(&[e(5)], &[e(105)], 50).ok);
        // An empty pipeline at the epoch end, or a missing sample: it does not.
        assert!(!persistent_judgement(&[e(5)], &[e(30)], 50).ok);
        let missing = EpochInput { end: None, ..e(5) };
        assert!(!persistent_judgement(&[e(5)], &[missing], 50).ok);
    }

    #[test]
    fn threads_are_judged_exactly() {
        assert!(threads_judgement(Some(6), 6, "x").ok);
        assert!(!threads_judgement(Some(2), 6, "x").ok);
        assert!(!threads_judgement(None, 6, "x").ok);
    }
}
