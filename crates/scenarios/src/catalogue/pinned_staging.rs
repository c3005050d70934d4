//! `pinned-staging`: with `loader.pin_memory` the loader builds batches in page-locked
//! staging blocks rounded up to whole pages, keeps them in a pool after the batches are
//! consumed (resident until the loader goes away), and locks no more than `RLIMIT_MEMLOCK`
//! allows; without pinning nothing stays behind.

use trainmem_core::Plan;
use trainmem_core::timeline::{Phase, Source, Timeline};

use crate::checks::{host_input, index_of};
use crate::ctx::{Ctx, Judgement};
use crate::error::Result;
use crate::report::{Figure, VerdictKind};

/// Which bytes cause the pattern and what removes it.
pub const EXPLANATION: &[&str] = &[
    "With loader.pin_memory = true trainmem-loader's workers build every batch column directly \
     in a staging block taken from a pool: page aligned, rounded up to a whole number of 4 KiB \
     pages, and locked in RAM with mlock so a device copy could DMA from it. A column of \
     64 x 3000 f32 (768,000 bytes) takes 188 pages (770,048 bytes) and a column of 64 i64 \
     labels (512 bytes) takes a whole page, eight times its size. When the training loop is \
     done with a batch its blocks go back to the pool instead of being freed, so the pool \
     grows to the most blocks ever in use at once (the batches in flight plus the one being \
     consumed) and stays resident, locked, until the loader is dropped: after the epoch ends \
     the host still holds several batches of staging. PyTorch's pinned host allocator caches \
     its blocks the same way but rounds each request up to a power of two instead of a page.",
    "Locked memory is limited per process by RLIMIT_MEMLOCK (ulimit -l). A block that would \
     exceed it is not locked: the loader uses it unpinned and counts it in pin_failures, so the \
     run goes on with fewer pinned bytes than staging bytes. Knob: loader.pin_memory = false \
     builds batches in ordinary heap buffers that are freed with the batch: no pinned bytes, \
     and nothing stays behind after the epoch.",
];

const PAGE: u64 = 4096;

/// Bytes of one micro-batch (the model's input and target per sample).
fn batch_bytes(plan: &Plan) -> u64 {
    trainmem_sim::lower::input_bytes_per_sample(&plan.model) * plan.micro_batch_size()
}

/// One batch's staging as the loader allocates it: every column rounded up to whole pages
/// (features as f32, class labels as one i64 per sample).
fn staged_batch_bytes(plan: &Plan) -> (u64, u64) {
    let n = plan.micro_batch_size();
    let per = trainmem_sim::lower::input_bytes_per_sample(&plan.model);
    let label = 8;
    let columns = [n * (per - label), n * label];
    let exact = columns.iter().sum();
    let rounded = columns.iter().map(|c| c.div_ceil(PAGE) * PAGE).sum();
    (exact, rounded)
}

/// The soft `Max locked memory` limit from `/proc/self/limits` text: `Some(None)` when
/// unlimited, `None` when the line is missing.
fn parse_memlock(limits: &str) -> Option<Option<u64>> {
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max locked memory"))?;
    let soft = line
        .trim_start_matches("Max locked memory")
        .split_whitespace()
        .next()?;
    if soft == "unlimited" {
        Some(None)
    } else {
        soft.parse().ok().map(Some)
    }
}

/// `input` bytes after the last epoch ended minus after model construction.
fn left_after_epoch(t: &Timeline) -> Option<i64> {
    let init = index_of(t, 0, Phase::ModelInit)?;
    let end = t.samples.iter().rposition(|s| s.phase == Phase::EpochEnd)?;
    Some(host_input(t, end) as i64 - host_input(t, init) as i64)
}

/// Judges the measured staging pool at its peak: whole pages, at least one page-rounded batch,
/// and locked as far as `RLIMIT_MEMLOCK` (`limit`: `Some(None)` unlimited, `None` unknown)
/// allows.
fn staging_judgement(
    peak: &trainmem_loader::LoaderMemory,
    limit: Option<Option<u64>>,
    exact: u64,
    rounded: u64,
) -> Judgement {
    let (staging, locked) = (peak.staging as u64, peak.staging_pinned as u64);
    let whole_pages = staging.is_multiple_of(PAGE) && locked.is_multiple_of(PAGE);
    let holds_a_batch = staging >= rounded;
    let (ok_lock, lock_text) = match limit {
        Some(Some(l)) if staging > l => (
            locked <= l && peak.pin_failures > 0,
            format!(
                "the pool ({staging} bytes) exceeds RLIMIT_MEMLOCK ({l} bytes): \
                 {locked} bytes locked, {} blocks left unpinned",
                peak.pin_failures
            ),
        ),
        Some(l) => (
            locked == staging && peak.pin_failures == 0,
            format!(
                "all {locked} of {staging} staging bytes locked, {} pin failures \
                 (RLIMIT_MEMLOCK {})",
                peak.pin_failures,
                l.map_or("unlimited".to_string(), |l| format!("{l} bytes"))
            ),
        ),
        None => (
            locked > 0 || peak.pin_failures > 0,
            format!(
                "{locked} of {staging} staging bytes locked, {} pin failures \
                 (RLIMIT_MEMLOCK unknown)",
                peak.pin_failures
            ),
        ),
    };
    Judgement::new(
        whole_pages && holds_a_batch && ok_lock,
        format!(
            "staging peaks at {staging} bytes, whole pages and at least one batch \
             rounded up to pages ({exact} -> {rounded} bytes); {lock_text}"
        ),
        vec![
            Figure::bytes("staging peak", staging),
            Figure::bytes("pinned peak", locked),
            Figure::count("pin failures", peak.pin_failures as u64),
            Figure::bytes("one batch, exact", exact),
            Figure::bytes("one batch, page-rounded", rounded),
            Figure::ratio("staging peak / page-rounded batch", {
                staging as f64 / rounded.max(1) as f64
            }),
        ],
    )
}

/// The knob: `pin_memory = false` leaves nothing behind after the epoch and locks nothing.
fn unpinned_knob(ctx: &mut Ctx, plan: &Plan, pinned: usize, batch: u64) -> Result<()> {
    let mut unpinned = plan.clone();
    unpinned.loader.pin_memory = false;
    let un = ctx.run("pin_memory = false (knob)", &unpinned)?;
    ctx.compare(
        pinned,
        un,
        VerdictKind::Knob,
        "without pinning nothing stays behind after the epoch",
        |a, b| {
            let (Some(la), Some(lb)) = (left_after_epoch(a), left_after_epoch(b)) else {
                return Judgement::new(false, "missing samples", vec![]);
            };
            let ok = 2 * lb.unsigned_abs() < batch && la - lb >= batch as i64;
            Judgement::new(
                ok,
                format!(
                    "input left after the epoch: {lb} bytes unpinned (under half a batch, {} \
                     bytes) against {la} bytes pinned (at least one batch more)",
                    batch / 2
                ),
                vec![
                    Figure::delta("left after the epoch, pinned", la),
                    Figure::delta("left after the epoch, unpinned", lb),
                ],
            )
        },
    );
    if let Some(m) = &ctx.record(un).measured {
        let locked = m.loader_peak.map(|p| p.staging_pinned as u64);
        let j = Judgement::new(
            locked == Some(0) && m.staging_pinned.is_none(),
            format!(
                "pinned staging peak without pin_memory: {} bytes",
                locked.map_or("no loader".to_string(), |l| l.to_string())
            ),
            vec![Figure::bytes("pinned peak", locked.unwrap_or(0))],
        );
        ctx.push_verdict(
            VerdictKind::Knob,
            "pin_memory = false locks no memory",
            Source::Measured,
            j,
        );
    }
    Ok(())
}

/// Runs the scenario.
pub fn run(ctx: &mut Ctx) -> Result<()> {
    let plan = ctx.plan("pinned-staging")?;
    if !(plan.loader.pin_memory && plan.loader.workers > 0) {
        unsuited!("the pinned-staging plan needs pin_memory with workers");
    }
    let batch = batch_bytes(&plan);
    let (exact, rounded) = staged_batch_bytes(&plan);
    let pinned = ctx.run("pinned staging", &plan)?;
    ctx.check(
        pinned,
        VerdictKind::Pattern,
        "the staging pool stays resident after the epoch",
        |t| {
            let Some(left) = left_after_epoch(t) else {
                return Judgement::new(false, "no model_init or epoch_end sample", vec![]);
            };
            Judgement::new(
                left >= batch as i64,
                format!(
                    "input bytes after the epoch ended exceed those after model construction by \
                     {left} bytes (at least one batch, {batch} bytes: staging blocks kept by the \
                     pool)"
                ),
                vec![
                    Figure::delta("input left after the epoch", left),
                    Figure::bytes("batch bytes", batch),
                ],
            )
        },
    );

    let limit = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|s| parse_memlock(&s));
    if let Some(m) = &ctx.record(pinned).measured {
        let j = match m.loader_peak {
            None => Judgement::new(false, "the measured run used no loader", vec![]),
            Some(peak) => staging_judgement(&peak, limit, exact, rounded),
        };
        ctx.push_verdict(
            VerdictKind::Pattern,
            "staging blocks are page-rounded and locked (within RLIMIT_MEMLOCK)",
            Source::Measured,
            j,
        );
    }

    unpinned_knob(ctx, &plan, pinned, batch)?;
    ctx.note(format!(
        "One batch is {exact} bytes of columns, {rounded} bytes page-rounded in staging; a \
         power-of-two pinned allocator would take {} bytes per column set.",
        {
            let n = plan.micro_batch_size();
            let per = trainmem_sim::lower::input_bytes_per_sample(&plan.model);
            (n * (per - 8)).next_power_of_two() + (n * 8).next_power_of_two()
        }
    ));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memlock_limit_is_read_from_proc_limits() {
        let text = "Limit                     Soft Limit           Hard Limit           Units     \n\
                    Max locked memory         8388608              8388608              bytes     \n";
        assert_eq!(parse_memlock(text), Some(Some(8_388_608)));
        let unl = "Max locked memory         unlimited            unlimited            bytes\n";
        assert_eq!(parse_memlock(unl), Some(None));
        assert_eq!(parse_memlock("Max open files 1024 1024 files\n"), None);
    }

    #[test]
    fn staged_batches_round_each_column_to_pages() {
        let plan = Plan::from_toml_str(
            "[model.mlp]\ninput = 3000\nhidden = [8]\noutput = 10\nloss = \"cross_entropy\"\n\
             [training]\nbatch_size = 64\n",
        )
        .expect("plan");
        assert_eq!(batch_bytes(&plan), 64 * 3000 * 4 + 64 * 8);
        // 768,000 bytes -> 188 pages; 512 label bytes -> 1 page.
        assert_eq!(
            staged_batch_bytes(&plan),
            (768_000 + 512, 188 * 4096 + 4096)
        );
    }
}
