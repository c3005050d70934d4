//! `memmap-vs-preload`: a memory-mapped data set costs page cache mapped into the process
//! (RssFile), growing with the bytes read; a preloaded one costs anonymous memory (RssAnon,
//! heap bytes under `input`) equal to the data set from the start.

use trainmem_core::Plan;
use trainmem_core::plan::DataStorage;
use trainmem_core::timeline::{Phase, Timeline};

use crate::checks::{host_input, index_of};
use crate::ctx::{Ctx, Judgement};
use crate::error::Result;
use crate::report::{Figure, VerdictKind};

/// Which bytes cause the pattern and what removes it.
pub const EXPLANATION: &[&str] = &[
    "With data.storage = \"mmap\" the measured run maps the fixture's .npy files and the loader's \
     workers copy rows straight out of the mapping. Nothing is read up front: each page is \
     brought into the page cache and mapped into the process when a worker first touches it, so \
     the process's file-backed resident memory (RssFile) grows with the bytes read and reaches \
     the data set's size once the epoch has read every sample. Those pages belong to the page \
     cache: the kernel can drop and re-read them under pressure, and other processes mapping \
     the same file share them. The heap never holds the data set: the input bytes stay at a \
     few batches.",
    "With data.storage = \"preload\" the files are read into heap buffers before training \
     starts, so anonymous resident memory (RssAnon) and the `input` category carry the whole \
     data set from the first sample on, and reading batches maps no file pages. Preloading \
     trades page cache that grows and can be reclaimed for private memory that is paid in full \
     at once and cannot be.",
];

/// Bytes of the data set as the fixture stores it: per sample, the model's input and target.
fn dataset_bytes(plan: &Plan) -> u64 {
    trainmem_sim::lower::input_bytes_per_sample(&plan.model) * plan.data.samples
}

/// Bytes of the samples a run reads (every step reads one micro-batch per micro-step).
fn bytes_read(plan: &Plan) -> u64 {
    let per = trainmem_sim::lower::input_bytes_per_sample(&plan.model);
    let samples = (plan.total_steps() * plan.accumulation_steps().max(1) * plan.micro_batch_size())
        .min(plan.data.samples);
    samples * per
}

/// RSS figures of one timeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RssView {
    /// The data set's resident mapped bytes at the start sample: its own mappings' share of
    /// RssFile where the run measured it ([`HostBytes::data_rss`]), else the whole RssFile.
    ///
    /// [`HostBytes::data_rss`]: trainmem_core::timeline::HostBytes::data_rss
    file_start: u64,
    /// The same after the first batch was loaded, minus at start.
    file_first_batch: i64,
    /// Its highest value up to the last epoch end, minus at start.
    file_growth: i64,
    /// RssAnon at the start sample, over the process's RssAnon when the run began (its
    /// baseline, when recorded): what the run itself made resident before training.
    anon_start: i64,
    /// `input` bytes at the start sample.
    input_start: u64,
    /// Highest `input` bytes over the run.
    input_peak: u64,
}

fn rss_view(t: &Timeline) -> Option<RssView> {
    let start = index_of(t, 0, Phase::Start)?;
    let first = t
        .samples
        .iter()
        .position(|s| s.phase == Phase::BatchLoaded)?;
    let end = t.samples.iter().rposition(|s| s.phase == Phase::EpochEnd)?;
    let file_start = t.samples[start].host.data_rss();
    let file_max = t.samples[start..=end]
        .iter()
        .map(|s| s.host.data_rss())
        .max()
        .unwrap_or(0);
    let input_peak = (0..t.samples.len())
        .map(|i| host_input(t, i))
        .max()
        .unwrap_or(0);
    Some(RssView {
        file_start,
        file_first_batch: t.samples[first].host.data_rss() as i64 - file_start as i64,
        file_growth: file_max as i64 - file_start as i64,
        anon_start: t.samples[start].host.anon_rss as i64
            - t.meta.baseline.map_or(0, |b| b.anon_rss) as i64,
        input_start: host_input(t, start),
        input_peak,
    })
}

/// The memory-mapped run: RssFile grows with the bytes read, lazily, and the heap does not
/// hold the data set.
fn expect_mapped(t: &Timeline, plan: &Plan) -> Judgement {
    let (data, read) = (dataset_bytes(plan), bytes_read(plan));
    let Some(v) = rss_view(t) else {
        return Judgement::new(false, "no start, batch_loaded or epoch_end sample", vec![]);
    };
    let grows = v.file_growth as f64 >= 0.9 * read as f64;
    let lazy = (v.file_first_batch as f64) < 0.5 * data as f64;
    let not_heap = (v.input_peak as f64) < 0.5 * data as f64;
    Judgement::new(
        grows && lazy && not_heap,
        format!(
            "the data set's RssFile grows by {} bytes over the epoch (at least 90% of the {read} bytes read), \
             by {} bytes at the first batch (under half of the {data}-byte data set: mapped as \
             read, not up front); input bytes peak at {} (under half the data set)",
            v.file_growth, v.file_first_batch, v.input_peak
        ),
        vec![
            Figure::bytes("data set bytes", data),
            Figure::bytes("bytes read", read),
            Figure::bytes("data set RssFile at start", v.file_start),
            Figure::delta(
                "data set RssFile growth at the first batch",
                v.file_first_batch,
            ),
            Figure::delta("data set RssFile growth over the epoch", v.file_growth),
            Figure::bytes("input peak", v.input_peak),
        ],
    )
}

/// The preloaded run: the data set is heap (`input`) from the start, and reading maps no file
/// pages.
fn expect_preloaded(t: &Timeline, plan: &Plan) -> Judgement {
    let data = dataset_bytes(plan);
    let Some(v) = rss_view(t) else {
        return Judgement::new(false, "no start, batch_loaded or epoch_end sample", vec![]);
    };
    let heap = v.input_start as f64 >= 0.95 * data as f64;
    let no_cache = (v.file_growth as f64) < 0.1 * data as f64;
    Judgement::new(
        heap && no_cache,
        format!(
            "input bytes at start are {} (at least 95% of the {data}-byte data set); the data \
             set's RssFile grows by {} bytes over the epoch (under 10% of the data set)",
            v.input_start, v.file_growth
        ),
        vec![
            Figure::bytes("data set bytes", data),
            Figure::bytes("input at start", v.input_start),
            Figure::delta("RssAnon at start, over the run's baseline", v.anon_start),
            Figure::delta("data set RssFile growth over the epoch", v.file_growth),
        ],
    )
}

/// Runs the scenario.
pub fn run(ctx: &mut Ctx) -> Result<()> {
    let plan = ctx.plan("memmap-vs-preload")?;
    if !(plan.data.storage == DataStorage::Mmap) {
        unsuited!("the memmap-vs-preload plan starts from data.storage = \"mmap\"");
    }
    let mapped = ctx.run("memory-mapped data set", &plan)?;
    let p = plan.clone();
    ctx.check(
        mapped,
        VerdictKind::Pattern,
        "mmap: page cache (RssFile) grows with the bytes read",
        |t| expect_mapped(t, &p),
    );

    let mut preload = plan.clone();
    preload.data.storage = DataStorage::Preload;
    let pre = ctx.run("preloaded data set (knob)", &preload)?;
    let p = preload.clone();
    ctx.check(
        pre,
        VerdictKind::Pattern,
        "preload: anonymous memory holds the data set from the start",
        |t| expect_preloaded(t, &p),
    );
    let data = dataset_bytes(&plan);
    ctx.compare(
        mapped,
        pre,
        VerdictKind::Knob,
        "preloading moves the data set from page cache to anonymous memory",
        |a, b| {
            let (Some(m), Some(p)) = (rss_view(a), rss_view(b)) else {
                return Judgement::new(false, "missing samples", vec![]);
            };
            let anon = p.anon_start - m.anon_start;
            let file = m.file_growth - p.file_growth;
            let ok = anon as f64 >= 0.9 * data as f64 && file as f64 >= 0.9 * data as f64;
            Judgement::new(
                ok,
                format!(
                    "RssAnon at start (over each run's baseline) is {anon} bytes higher preloaded \
                     than mapped, and the data set's RssFile grows {file} bytes more mapped than \
                     preloaded (each at least 90% of the {data}-byte data set)"
                ),
                vec![
                    Figure::bytes("data set bytes", data),
                    Figure::delta("RssAnon at start, preload - mmap", anon),
                    Figure::delta("data set RssFile growth, mmap - preload", file),
                ],
            )
        },
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_come_from_the_model() {
        let plan = Plan::from_toml_str(
            "[model.mlp]\ninput = 4\nhidden = [8]\noutput = 2\nloss = \"cross_entropy\"\n\
             [training]\nbatch_size = 2\nepochs = 1\nsteps_per_epoch = 3\n[data]\nsamples = 10\n",
        )
        .expect("plan");
        // 4 f32 features + one i64 label per sample.
        assert_eq!(dataset_bytes(&plan), 10 * 24);
        assert_eq!(bytes_read(&plan), 6 * 24);
    }
}
