//! `cargo xtask bench loader`: trainmem's loader against a memcpy of the same bytes (the same
//! rows in the same shuffled batches, on as many threads as the loader has workers, each thread
//! reusing one destination), burn 0.21's own data loader, and PyTorch's DataLoader, measured
//! side by side in one run (median, min and max of several epochs); then a streaming run over a data set far larger
//! than the loader's in-flight bound, checking that anonymous RSS grows by no more than that
//! bound — optionally in a child process under a cgroup v1 memory limit smaller than the data
//! set (`--stream-under-limit`), so that the data set cannot fit in the memory it may use.

use super::on_threads;
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use burn::backend::Flex;
use burn::data::dataloader::DataLoaderBuilder;
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::InMemDataset;
use trainmem_loader::fixtures::{FixturePaths, FixtureSpec};
use trainmem_loader::{
    Dataset, EpochPlan, Loader, LoaderConfig, MmapDataset, Order, StackColumns, prefetch_pages,
};
use trainmem_probe::rss;

use crate::gen_data::write_fixture_with_progress;

mod cgroup;
pub(super) mod timing;

use timing::{Spread, timed};

/// Arguments of `bench loader`.
#[derive(Debug, clap::Args)]
pub struct LoaderBenchArgs {
    /// Where fixtures are written (reused when already there).
    #[arg(long, default_value = "target/bench-loader")]
    pub dir: PathBuf,
    /// Samples of the throughput fixture.
    #[arg(long, default_value_t = 16384)]
    pub samples: usize,
    /// f32 features per sample (16384 = 64 KiB samples: "large samples").
    #[arg(long, default_value_t = 16384)]
    pub dim: usize,
    /// Batch size.
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    /// trainmem's prefetch factor in the throughput rows (batches in flight per worker; 2 is
    /// PyTorch's default, used for the comparison).
    #[arg(long, default_value_t = 2)]
    pub prefetch: usize,
    /// Timed epochs per pipeline, after one warm-up epoch (median, min and max are printed).
    #[arg(long, default_value_t = 5)]
    pub repeats: usize,
    /// Size of the streaming data set in GiB (0 skips the streaming run).
    #[arg(long, default_value_t = 2.0)]
    pub stream_gib: f64,
    /// Python interpreter with torch and numpy for the PyTorch column.
    #[arg(long, default_value = "python3")]
    pub python: String,
    /// Skip PyTorch.
    #[arg(long)]
    pub no_torch: bool,
    /// Skip burn.
    #[arg(long)]
    pub no_burn: bool,
    /// Run the streaming epoch in a child process inside a new cgroup v1 memory cgroup with
    /// this limit (e.g. `1GiB` with `--stream-gib 2`: the data set is twice what the process
    /// may hold, page cache included). Needs root and a cgroup v1 memory controller.
    #[arg(long, value_parser = cgroup::parse_size)]
    pub stream_under_limit: Option<u64>,
    /// Worker counts of the throughput rows (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "0,1,2,4")]
    pub workers: Vec<usize>,
    /// Only the streaming run (skip the throughput table).
    #[arg(long)]
    pub stream_only: bool,
    /// Internal: the streaming child, joining the memory cgroup at this directory first.
    #[arg(long, hide = true)]
    pub stream_child: Option<PathBuf>,
}

fn fixture(dir: &Path, samples: usize, dim: usize) -> anyhow::Result<FixturePaths> {
    let spec = FixtureSpec {
        samples,
        dim,
        classes: 10,
        seed: 1,
        ..FixtureSpec::default()
    };
    let out = dir.join(format!("n{samples}-d{dim}"));
    let paths = FixturePaths {
        features: out.join("features.npy"),
        labels: out.join("labels.npy"),
    };
    // Reuse a fixture that opens with the right shape.
    if let Ok(ds) = MmapDataset::open(&[&paths.features, &paths.labels])
        && ds.len() == samples
        && ds.array(0).sample_shape() == [dim]
    {
        return Ok(paths);
    }
    write_fixture_with_progress(&out, &spec)
}

/// Copies every column in file order, `batch` rows at a time, each batch as one contiguous
/// copy into a reused destination; the batches split between `dst.len()` threads like
/// [`memcpy_epoch`]'s. The same amount of bytes as an epoch, but long sequential runs: a
/// reference, not the loader's work (which copies shuffled rows).
fn memcpy_contiguous(ds: &MmapDataset, batch: usize, dst: &mut [Vec<Vec<u8>>]) {
    let threads = dst.len().max(1);
    let copy = |t: usize, mine: &mut Vec<Vec<u8>>| {
        for (col, out) in ds.columns().iter().zip(mine.iter_mut()) {
            let bps = col.array.bytes_per_sample();
            let chunks: Vec<&[u8]> = col.array.data().chunks(batch * bps).collect();
            let share = chunks.len().div_ceil(threads);
            for chunk in chunks.iter().skip(t * share).take(share) {
                out[..chunk.len()].copy_from_slice(chunk);
                black_box(&out);
            }
        }
    };
    on_threads(dst, copy);
}

/// Copies the bytes a loader epoch copies: for every batch of `plan`, each column's rows in
/// sampler order into that column's destination, with the loader's hint (the next row's pages
/// are prefetched while a row is copied). The batches are split between `dst.len()`
/// threads (thread `t` takes a contiguous `1 / threads` share), each reusing its own one
/// destination per column for every batch (the fewest buffers any loader could use).
fn memcpy_epoch(ds: &MmapDataset, plan: &EpochPlan, dst: &mut [Vec<Vec<u8>>]) {
    let threads = dst.len().max(1);
    let share = plan.len().div_ceil(threads);
    let copy = |t: usize, mine: &mut Vec<Vec<u8>>| {
        for k in (t * share..(t + 1) * share).take_while(|&k| k < plan.len()) {
            for (col, out) in ds.columns().iter().zip(mine.iter_mut()) {
                let bps = col.array.bytes_per_sample();
                let rows = plan.batch(k);
                for (row, &i) in rows.iter().enumerate() {
                    let src = col.array.samples(i..i + 1).unwrap_or(&[]);
                    // The loader's hint: the next row's pages start loading during this copy.
                    if let Some(&next) = rows.get(row + 1) {
                        prefetch_pages(col.array.samples(next..next + 1).unwrap_or(&[]));
                    }
                    out[row * bps..(row + 1) * bps].copy_from_slice(src);
                }
                black_box(&out);
            }
        }
    };
    on_threads(dst, copy);
}

#[derive(Clone, Debug)]
struct ConcatBatcher;

impl<B: burn::tensor::backend::Backend> Batcher<B, (Vec<f32>, i64), (Vec<f32>, Vec<i64>)>
    for ConcatBatcher
{
    fn batch(
        &self,
        items: Vec<(Vec<f32>, i64)>,
        _device: &burn::tensor::Device<B>,
    ) -> (Vec<f32>, Vec<i64>) {
        // The same collate as trainmem's column stacker: rows back to back, labels apart.
        let dim = items.first().map_or(0, |i| i.0.len());
        let mut x = Vec::with_capacity(items.len() * dim);
        let mut y = Vec::with_capacity(items.len());
        for (f, l) in items {
            x.extend_from_slice(&f);
            y.push(l);
        }
        (x, y)
    }
}

const TORCH_SCRIPT: &str = r#"
import json, sys, time
try:
    import numpy as np
    import torch
    from torch.utils.data import DataLoader, Dataset
except Exception as e:
    print(json.dumps({"error": f"{type(e).__name__}: {e}"})); sys.exit(0)
feat_path, label_path, batch, repeats = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
workers = [int(w) for w in sys.argv[5].split(",")]
class Mapped(Dataset):
    def __init__(self):
        self.x = np.load(feat_path, mmap_mode="r")
        self.y = np.load(label_path, mmap_mode="r")
    def __len__(self):
        return self.x.shape[0]
    def __getitem__(self, i):
        return torch.from_numpy(np.array(self.x[i])), int(self.y[i])
out = {"torch": torch.__version__, "times": {}}
for w in workers:
    kw = dict(batch_size=batch, shuffle=True, num_workers=w)
    if w > 0:
        kw["persistent_workers"] = True
    dl = DataLoader(Mapped(), **kw)
    def epoch():
        n = 0
        for xb, yb in dl:
            n += xb.shape[0]
        return n
    epoch()
    times = []
    for _ in range(max(1, repeats)):
        t = time.perf_counter(); epoch(); times.append(time.perf_counter() - t)
    out["times"][str(w)] = times
    del dl
print(json.dumps(out))
"#;

/// Seconds of each timed epoch for each worker count, or why PyTorch could not run.
fn torch_times(
    args: &LoaderBenchArgs,
    paths: &FixturePaths,
) -> Result<(String, Vec<Vec<f64>>), String> {
    let script = args.dir.join("torch_loader_bench.py");
    std::fs::write(&script, TORCH_SCRIPT).map_err(|e| e.to_string())?;
    let workers: Vec<String> = args.workers.iter().map(usize::to_string).collect();
    let out = Command::new(&args.python)
        .arg(&script)
        .arg(&paths.features)
        .arg(&paths.labels)
        .arg(args.batch.to_string())
        .arg(args.repeats.to_string())
        .arg(workers.join(","))
        .output()
        .map_err(|e| format!("cannot run {}: {e}", args.python))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().unwrap_or("");
    let v: serde_json::Value = serde_json::from_str(line).map_err(|_| {
        format!(
            "no result from {} (stderr: {})",
            args.python,
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
        )
    })?;
    if let Some(e) = v.get("error").and_then(|e| e.as_str()) {
        return Err(format!("PyTorch not importable with {}: {e}", args.python));
    }
    let version = v["torch"].as_str().unwrap_or("?").to_string();
    let times = args
        .workers
        .iter()
        .map(|w| {
            v["times"][w.to_string()]
                .as_array()
                .map_or_else(Vec::new, |a| a.iter().filter_map(|t| t.as_f64()).collect())
        })
        .collect();
    Ok((version, times))
}

struct Row {
    name: String,
    seconds: Spread,
}

/// Runs the benchmark.
pub fn run(args: LoaderBenchArgs) -> anyhow::Result<ExitCode> {
    if let Some(dir) = &args.stream_child {
        return stream_child(&args, dir);
    }
    std::fs::create_dir_all(&args.dir)?;
    if args.stream_under_limit.is_some() && args.stream_gib > 0.0 {
        // Fail before minutes of throughput runs rather than after them.
        cgroup::preflight()?;
    }
    // A missed copy-bound target fails the command, after the streaming run has run too.
    let bound_met = args.stream_only || throughput(&args)?;
    if args.stream_gib > 0.0 {
        let ok = match args.stream_under_limit {
            Some(limit) => stream_limited(&args, limit)?,
            None => stream(&args)?,
        };
        if !ok {
            return Ok(ExitCode::FAILURE);
        }
    }
    Ok(if bound_met {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The memcpy bound for `workers` workers: a memcpy on as many threads (at least one).
fn bound_threads(workers: usize) -> usize {
    workers.max(1)
}

/// Seconds of trainmem's epochs with one worker count and of its memcpy bound, timed in pairs
/// (the bound, then the loader, on the same epoch's batches) so both see the same machine.
#[derive(Debug, Default)]
struct Paired {
    bound: Vec<f64>,
    /// The copy of contiguous batches in file order (the bound this bench used before; a
    /// different copy: long sequential runs instead of the shuffled rows the loader copies).
    contiguous: Vec<f64>,
    ours: Vec<f64>,
}

impl Paired {
    /// trainmem's rate over a bound's (`bound` or `contiguous`), one ratio per round.
    fn ratios(&self, bound: &[f64]) -> Vec<f64> {
        bound.iter().zip(&self.ours).map(|(b, o)| b / o).collect()
    }
}

type BenchLoader = Loader<MmapDataset, StackColumns>;

/// Waits (untimed) until persistent workers have finished the next epoch's first batches,
/// which they start while an epoch ends, so that work never overlaps the next timing.
fn settle(loader: &BenchLoader) {
    let c = loader.config();
    let want = c.max_batches_in_flight().min(loader.batches_per_epoch());
    let deadline = Instant::now() + Duration::from_secs(2);
    while c.persistent_workers && loader.memory().ready_batches < want && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// One loader epoch, returning the samples delivered.
fn loader_epoch(loader: &mut BenchLoader) -> anyhow::Result<usize> {
    let mut count = 0;
    for b in loader.epoch()? {
        let b = b?;
        count += b.len();
        black_box(&b);
    }
    Ok(count)
}

/// trainmem with every worker count beside its memcpy bound: one warm-up round, then
/// `repeats` rounds, each timing every pair once.
fn paired_runs(args: &LoaderBenchArgs, ds: &Arc<MmapDataset>) -> anyhow::Result<Vec<Paired>> {
    let n = ds.len();
    let mut loaders = Vec::new();
    let mut dst = Vec::new();
    for &w in &args.workers {
        let config = LoaderConfig {
            batch_size: args.batch,
            workers: w,
            prefetch_factor: args.prefetch,
            persistent_workers: true,
            order: Order::Shuffled { seed: 7 },
            ..LoaderConfig::default()
        };
        loaders.push(Loader::new(Arc::clone(ds), config, StackColumns)?);
        let buffers = || -> Vec<Vec<u8>> {
            ds.columns()
                .iter()
                .map(|c| vec![0u8; args.batch * c.array.bytes_per_sample()])
                .collect()
        };
        dst.push((0..bound_threads(w)).map(|_| buffers()).collect::<Vec<_>>());
    }
    let mut out: Vec<Paired> = args.workers.iter().map(|_| Paired::default()).collect();
    for round in 0..=args.repeats.max(1) {
        for (i, loader) in loaders.iter_mut().enumerate() {
            // The loader's next epoch, and the same batches for the bound: the same bytes.
            let plan = EpochPlan::new(n, loader.config(), loader.state().epoch);
            let t = Instant::now();
            memcpy_epoch(ds, &plan, &mut dst[i]);
            let bound = t.elapsed().as_secs_f64();
            let t = Instant::now();
            memcpy_contiguous(ds, args.batch, &mut dst[i]);
            let contiguous = t.elapsed().as_secs_f64();
            let t = Instant::now();
            let count = loader_epoch(loader)?;
            let ours = t.elapsed().as_secs_f64();
            anyhow::ensure!(count == n, "trainmem delivered {count} of {n} samples");
            settle(loader);
            if round > 0 {
                out[i].bound.push(bound);
                out[i].contiguous.push(contiguous);
                out[i].ours.push(ours);
            }
        }
    }
    Ok(out)
}

/// burn's loader over an in-memory copy of the data set, for every worker count.
fn burn_runs(args: &LoaderBenchArgs, ds: &MmapDataset) -> anyhow::Result<Vec<Vec<f64>>> {
    let n = ds.len();
    let items: Vec<(Vec<f32>, i64)> = (0..n)
        .map(|i| {
            let s = ds.sample(i).map_err(anyhow::Error::from)?;
            Ok((s.field::<f32>(0)?.to_vec(), s.field::<i64>(1)?[0]))
        })
        .collect::<anyhow::Result<_>>()?;
    // One in-memory copy of the data set, shared by every worker count.
    let shared = Arc::new(InMemDataset::new(items));
    let mut out = Vec::new();
    for &w in &args.workers {
        let mut b = DataLoaderBuilder::<Flex, _, _>::new(ConcatBatcher)
            .batch_size(args.batch)
            .shuffle(7);
        if w > 0 {
            b = b.num_workers(w);
        }
        let dl = b.build(Arc::clone(&shared));
        out.push(timed(args.repeats, || {
            let mut count = 0;
            for (x, _y) in dl.iter() {
                count += x.len() / args.dim;
                black_box(&x);
            }
            anyhow::ensure!(count == n, "burn delivered {count} of {n} samples");
            Ok(())
        })?);
    }
    Ok(out)
}

/// The throughput tables; whether trainmem reached [`BOUND_TARGET`] of its copy bound (median)
/// at every worker count.
fn throughput(args: &LoaderBenchArgs) -> anyhow::Result<bool> {
    let paths = fixture(&args.dir, args.samples, args.dim)?;
    let ds = Arc::new(MmapDataset::open(&[&paths.features, &paths.labels])?);
    let n = ds.len();
    let bps = ds.bytes_per_sample();
    let total_bytes = (n * bps) as f64;
    println!(
        "loader bench: {n} samples x {bps} B ({:.2} GiB; f32[{}] + i64 label), batch {}, trainmem prefetch {}, persistent workers, shuffled, page cache warm, median of {} epochs after a warm-up, {} CPUs",
        total_bytes / f64::from(1u32 << 30),
        args.dim,
        args.batch,
        args.prefetch,
        args.repeats.max(1),
        std::thread::available_parallelism().map_or(0, usize::from)
    );

    let paired = paired_runs(args, &ds)?;
    let mut rows = Vec::new();
    for (w, p) in args.workers.iter().zip(&paired) {
        rows.push(Row {
            name: format!(
                "memcpy of the same batches, {} thread(s)",
                bound_threads(*w)
            ),
            seconds: Spread::of(&p.bound),
        });
        rows.push(Row {
            name: format!("trainmem, {w} workers"),
            seconds: Spread::of(&p.ours),
        });
        rows.push(Row {
            name: format!(
                "(reference) memcpy of contiguous batches in file order, {} thread(s)",
                bound_threads(*w)
            ),
            seconds: Spread::of(&p.contiguous),
        });
    }
    let burn = if args.no_burn {
        Vec::new()
    } else {
        burn_runs(args, &ds)?
    };
    for (w, t) in args.workers.iter().zip(&burn) {
        rows.push(Row {
            name: format!("burn 0.21 DataLoader, {w} workers (in-memory)"),
            seconds: Spread::of(t),
        });
    }
    let torch = if args.no_torch {
        Err("skipped (--no-torch)".to_string())
    } else {
        torch_times(args, &paths)
    };
    match &torch {
        Ok((version, times)) => {
            for (w, t) in args.workers.iter().zip(times) {
                rows.push(Row {
                    name: format!("PyTorch {version} DataLoader, {w} workers (np.memmap)"),
                    seconds: Spread::of(t),
                });
            }
        }
        Err(why) => println!("PyTorch column: {why}"),
    }
    print_tables(&args.workers, n, total_bytes, &rows, &paired, &burn, &torch);
    let medians: Vec<f64> = paired
        .iter()
        .map(|p| Spread::of(&p.ratios(&p.bound)).median)
        .collect();
    Ok(report_bound_target(
        ".npy columns",
        &args.workers,
        &medians,
        cpus(),
    ))
}

/// The share of the copy bound trainmem's loader must reach (median per-round ratio) at every
/// worker count up to the machine's CPUs, in this bench and in `bench loader-formats`.
pub(super) const BOUND_TARGET: f64 = 0.8;

/// The share it must reach when the workers outnumber the CPUs: the workers and the training
/// thread then take turns on the cores, which the bound's threads (one per worker, nothing
/// else to run) do not.
pub(super) const OVERSUBSCRIBED_TARGET: f64 = 0.7;

/// Above this ratio the "bound" was slower than the loader doing more work: it was not
/// measured as a bound (the machine was disturbed while it ran), and no verdict is given.
pub(super) const NOT_A_BOUND_ABOVE: f64 = 1.2;

/// The CPUs this process may run on.
pub(super) fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

/// The target for `workers` workers on a machine of `cpus` CPUs (0 workers: the training
/// thread builds the batches, one thread).
pub(super) fn bound_target(workers: usize, cpus: usize) -> f64 {
    if workers.max(1) <= cpus {
        BOUND_TARGET
    } else {
        OVERSUBSCRIBED_TARGET
    }
}

/// How one worker count's median ratio (trainmem / its copy bound) stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum BoundVerdict {
    /// At or above the target, and the bound is a bound.
    Met,
    /// Below the target (or no figure).
    Missed,
    /// Above [`NOT_A_BOUND_ABOVE`]: the bound was not measured as one.
    NotABound,
}

impl BoundVerdict {
    /// The verdict for a median ratio at `workers` workers on `cpus` CPUs (a NaN, no figure,
    /// is missed).
    pub(super) fn of(median: f64, workers: usize, cpus: usize) -> BoundVerdict {
        if median > NOT_A_BOUND_ABOVE {
            BoundVerdict::NotABound
        } else if median >= bound_target(workers, cpus) {
            BoundVerdict::Met
        } else {
            BoundVerdict::Missed
        }
    }

    /// The table cell.
    pub(super) fn cell(self) -> &'static str {
        match self {
            BoundVerdict::Met => "yes",
            BoundVerdict::Missed => "NO",
            BoundVerdict::NotABound => "not a bound",
        }
    }
}

/// Prints whether every median ratio of `what` (one per worker count) reaches its target on a
/// machine of `cpus` CPUs, naming the worker counts that miss it and those whose bound was not
/// a bound; returns whether every count met its target.
pub(super) fn report_bound_target(
    what: &str,
    workers: &[usize],
    medians: &[f64],
    cpus: usize,
) -> bool {
    let with = |v: BoundVerdict| -> Vec<String> {
        workers
            .iter()
            .zip(medians)
            .filter(|&(&w, &m)| BoundVerdict::of(m, w, cpus) == v)
            .map(|(w, m)| format!("{w} workers ({m:.2})"))
            .collect()
    };
    let (missed, unbound) = (with(BoundVerdict::Missed), with(BoundVerdict::NotABound));
    let rule = format!(
        "at least {BOUND_TARGET:.2} of the copy bound up to {cpus} workers (this machine's CPUs), \
         {OVERSUBSCRIBED_TARGET:.2} above"
    );
    if missed.is_empty() && unbound.is_empty() {
        println!("{what}: {rule}: met");
    } else {
        if !missed.is_empty() {
            println!("{what}: {rule}: MISSED at {}", missed.join(", "));
        }
        if !unbound.is_empty() {
            println!(
                "{what}: the bound was not measured as a bound (trainmem above {NOT_A_BOUND_ABOVE:.1} \
                 x it) at {}: no verdict, run the bench again on a quiet machine",
                unbound.join(", ")
            );
        }
    }
    missed.is_empty() && unbound.is_empty()
}

/// The pipeline table, the ratios against the bound, and the other targets against it.
fn print_tables(
    workers: &[usize],
    n: usize,
    total_bytes: f64,
    rows: &[Row],
    paired: &[Paired],
    burn: &[Vec<f64>],
    torch: &Result<(String, Vec<Vec<f64>>), String>,
) {
    let gbs = |s: f64| total_bytes / s / 1e9;
    println!();
    println!("| pipeline | samples/s (median) | GB/s median | GB/s min | GB/s max |");
    println!("|---|---:|---:|---:|---:|");
    for r in rows {
        let g = r.seconds.map_decreasing(gbs);
        println!(
            "| {} | {:.0} | {:.2} | {:.2} | {:.2} |",
            r.name,
            n as f64 / r.seconds.median,
            g.median,
            g.min,
            g.max
        );
    }
    println!();
    println!(
        "trainmem against its memcpy bound (the same rows of the same batches, on max(W, 1) threads, each reusing one destination), per pair of epochs timed back to back; target >= {BOUND_TARGET:.2} up to {} workers (this machine's CPUs), >= {OVERSUBSCRIBED_TARGET:.2} above; a ratio above {NOT_A_BOUND_ABOVE:.1} is no bound:",
        cpus()
    );
    println!(
        "| workers | bound GB/s (median) | trainmem GB/s (median) | trainmem / bound: median | min | max | target | met | trainmem / contiguous memcpy (median) | trainmem / burn | trainmem / PyTorch |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|");
    for (i, (w, p)) in workers.iter().zip(paired).enumerate() {
        let r = Spread::of(&p.ratios(&p.bound));
        let contiguous = Spread::of(&p.ratios(&p.contiguous)).median;
        let ours = Spread::of(&p.ours).median;
        let vs = |t: Option<&Vec<f64>>| {
            t.filter(|t| !t.is_empty()).map_or("n/a".to_string(), |t| {
                format!("{:.2}x", Spread::of(t).median / ours)
            })
        };
        println!(
            "| {w} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {contiguous:.2} | {} | {} |",
            gbs(Spread::of(&p.bound).median),
            gbs(ours),
            r.median,
            r.min,
            r.max,
            bound_target(*w, cpus()),
            BoundVerdict::of(r.median, *w, cpus()).cell(),
            vs(burn.get(i)),
            vs(torch.as_ref().ok().and_then(|(_, t)| t.get(i)))
        );
    }

    // Can any loader that copies the bytes reach the burn and PyTorch targets? Compare each
    // target rate with the memcpy bound on as many threads as the loader has workers.
    println!();
    println!(
        "targets against the physical bound (a target above the memcpy bound cannot be met by a loader that copies every byte once):"
    );
    println!(
        "| workers | target | target rate GB/s | memcpy bound GB/s (threads) | target / bound | trainmem GB/s |"
    );
    println!("|---:|---|---:|---:|---:|---:|");
    let mut targets: Vec<(&str, f64, &[Vec<f64>])> = Vec::new();
    if !burn.is_empty() {
        targets.push(("3x burn", 3.0, burn));
    }
    if let Ok((_, t)) = torch {
        targets.push(("5x PyTorch", 5.0, t));
    }
    for (name, k, times) in targets {
        for (i, w) in workers.iter().enumerate() {
            let target = k * gbs(Spread::of(&times[i]).median);
            let bound = gbs(Spread::of(&paired[i].bound).median);
            println!(
                "| {w} | {name} | {target:.2} | {bound:.2} ({}) | {:.2} | {:.2} |",
                bound_threads(*w),
                target / bound,
                gbs(Spread::of(&paired[i].ours).median)
            );
        }
    }
}

/// The streaming data set (written on first use) and its sample count.
fn stream_fixture(args: &LoaderBenchArgs) -> anyhow::Result<(FixturePaths, usize)> {
    let bytes_per_sample = args.dim * 4 + 8;
    let samples = ((args.stream_gib * f64::from(1u32 << 30)) / bytes_per_sample as f64) as usize;
    Ok((fixture(&args.dir, samples, args.dim)?, samples))
}

/// What one streamed epoch measured.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct StreamOutcome {
    samples: usize,
    delivered: usize,
    data_bytes: u64,
    secs: f64,
    anon_growth: u64,
    bound: u64,
    loader_peak: u64,
    file_growth: u64,
}

impl StreamOutcome {
    fn anon_ok(&self) -> bool {
        self.anon_growth as f64 <= self.bound as f64 * 1.05
    }
}

/// Streams one shuffled epoch with 2 workers, sampling RSS after every batch.
fn stream_epoch(
    args: &LoaderBenchArgs,
    paths: &FixturePaths,
    samples: usize,
) -> anyhow::Result<StreamOutcome> {
    let ds = Arc::new(MmapDataset::open(&[&paths.features, &paths.labels])?);
    let config = LoaderConfig {
        batch_size: args.batch,
        workers: 2,
        prefetch_factor: 2,
        persistent_workers: true,
        order: Order::Shuffled { seed: 11 },
        ..LoaderConfig::default()
    };
    // Pooled buffers are page-rounded per column; plus the batch's index list.
    let page = |b: usize| b.div_ceil(4096) * 4096;
    let batch_bytes: usize = ds
        .columns()
        .iter()
        .map(|c| page(args.batch * c.array.bytes_per_sample()))
        .sum::<usize>()
        + args.batch * 8;
    let sampler_bytes = samples * 8;
    // P·W batches inside the loader, the one the consumer holds and one being handed over
    // (the buffer pool never holds more), plus the epoch's index list.
    let bound = config.in_flight_bound(batch_bytes, 0) + 2 * batch_bytes + sampler_bytes;
    let mut loader = Loader::new(Arc::clone(&ds), config, StackColumns)?;
    let before = rss::read().context("reading /proc/self/status")?;
    let (mut max_anon, mut max_file) = (before.rss_anon, before.rss_file);
    let t = Instant::now();
    let mut delivered = 0;
    for b in loader.epoch()? {
        let b = b?;
        delivered += b.len();
        black_box(&b);
        drop(b);
        let now = rss::read()?;
        max_anon = max_anon.max(now.rss_anon);
        max_file = max_file.max(now.rss_file);
    }
    let secs = t.elapsed().as_secs_f64();
    Ok(StreamOutcome {
        samples,
        delivered,
        data_bytes: (samples * ds.bytes_per_sample()) as u64,
        secs,
        anon_growth: max_anon.saturating_sub(before.rss_anon),
        bound: bound as u64,
        loader_peak: loader.memory_peak().total as u64,
        file_growth: max_file.saturating_sub(before.rss_file),
    })
}

fn mib(b: u64) -> f64 {
    b as f64 / f64::from(1u32 << 20)
}

fn gib(b: u64) -> f64 {
    b as f64 / f64::from(1u32 << 30)
}

/// Streams one shuffled epoch over a large data set in this process and reports anonymous RSS
/// growth against the loader's in-flight bound. Returns whether the checks passed.
fn stream(args: &LoaderBenchArgs) -> anyhow::Result<bool> {
    let (paths, samples) = stream_fixture(args)?;
    let o = stream_epoch(args, &paths, samples)?;
    println!();
    println!(
        "streaming: {samples} samples, {:.2} GiB on disk (page cache cold or warm as the OS has it), 2 workers, prefetch 2, shuffled, {:.2} GB/s",
        gib(o.data_bytes),
        o.data_bytes as f64 / o.secs / 1e9
    );
    println!(
        "| anon RSS growth | in-flight bound (+5%) | loader total peak (own accounting) | RssFile peak growth |"
    );
    println!("|---:|---:|---:|---:|");
    println!(
        "| {:.1} MiB | {:.1} MiB ({:.1} MiB) | {:.1} MiB | {:.1} MiB |",
        mib(o.anon_growth),
        mib(o.bound),
        mib(o.bound) * 1.05,
        mib(o.loader_peak),
        mib(o.file_growth)
    );
    println!(
        "anon RSS growth within the bound: {} ({:.1}% of it; data set is {:.0}x the bound); epoch complete: {} ({} of {} samples)",
        if o.anon_ok() { "yes" } else { "NO" },
        100.0 * o.anon_growth as f64 / o.bound as f64,
        o.data_bytes as f64 / o.bound as f64,
        if o.delivered == o.samples {
            "yes"
        } else {
            "NO"
        },
        o.delivered,
        o.samples
    );
    Ok(o.anon_ok() && o.delivered == o.samples)
}

/// The streaming child: joins the memory cgroup at `dir`, drops the data set's pages from the
/// page cache (so that every page it reads is charged inside the cgroup), streams one epoch
/// and prints the outcome as one JSON line.
fn stream_child(args: &LoaderBenchArgs, dir: &Path) -> anyhow::Result<ExitCode> {
    cgroup::join(dir)?;
    let (paths, samples) = stream_fixture(args)?;
    for p in [&paths.features, &paths.labels] {
        trainmem_loader::evict_page_cache(p)
            .with_context(|| format!("dropping {} from the page cache", p.display()))?;
    }
    let o = stream_epoch(args, &paths, samples)?;
    println!("{}", serde_json::to_string(&o)?);
    Ok(ExitCode::SUCCESS)
}

/// Streams one epoch in a child process under a new memory cgroup limited to `limit` bytes
/// (page cache included), and reports the cgroup's own accounting next to the RSS check.
/// Returns whether the checks passed; the cgroup is removed in every case.
fn stream_limited(args: &LoaderBenchArgs, limit: u64) -> anyhow::Result<bool> {
    // Written (if needed) before the cgroup exists, by this process.
    let (paths, _) = stream_fixture(args)?;
    let on_disk: u64 = [&paths.features, &paths.labels]
        .iter()
        .map(|p| std::fs::metadata(p).map(|m| m.len()))
        .sum::<std::io::Result<u64>>()?;
    let cg = cgroup::MemCgroup::create(
        &format!("trainmem-loader-stream-{}", std::process::id()),
        limit,
    )?;
    let limit_set = cg.read_u64("memory.limit_in_bytes")?;
    let exe = std::env::current_exe().context("locating the xtask binary")?;
    let t = Instant::now();
    let out = Command::new(exe)
        .args(["bench", "loader", "--stream-child"])
        .arg(cg.dir())
        .arg("--dir")
        .arg(&args.dir)
        .args(["--dim", &args.dim.to_string()])
        .args(["--batch", &args.batch.to_string()])
        .args(["--stream-gib", &args.stream_gib.to_string()])
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("starting the streaming child process")?;
    let wall = t.elapsed().as_secs_f64();
    let max_usage = cg.read_u64("memory.max_usage_in_bytes")?;
    let failcnt = cg.read_u64("memory.failcnt")?;
    let stat = cg.stat()?;
    let stat_of = |k: &str| stat.get(k).copied().unwrap_or(0);
    let oom_kills = std::fs::read_to_string(cg.dir().join("memory.oom_control"))
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse::<u64>().ok())
        });
    let cg_dir = cg.dir().to_path_buf();
    drop(cg);
    let removed = !cg_dir.exists();

    println!();
    println!(
        "streaming under a memory limit: child process in cgroup v1 {} (removed afterwards: {}), memory.limit_in_bytes = {:.2} GiB; data set {:.2} GiB on disk = {:.2}x the limit, dropped from the page cache before the epoch (posix_fadvise DONTNEED), so its pages are read and charged inside the cgroup; 2 workers, prefetch 2, shuffled, {wall:.1} s",
        cg_dir.display(),
        if removed { "yes" } else { "NO" },
        gib(limit_set),
        gib(on_disk),
        on_disk as f64 / limit_set as f64
    );
    if !out.status.success() {
        anyhow::bail!(
            "the streaming child failed ({}) under a {:.2} GiB limit: memory.max_usage_in_bytes {:.1} MiB, memory.failcnt {failcnt}, OOM kills {}",
            out.status,
            gib(limit_set),
            mib(max_usage),
            oom_kills.map_or("unknown".into(), |k| k.to_string())
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let o: StreamOutcome = serde_json::from_str(text.lines().last().unwrap_or(""))
        .with_context(|| format!("no result from the streaming child (stdout: {text:?})"))?;
    println!(
        "| data set | limit | anon RSS growth | in-flight bound (+5%) | RssFile peak growth | memory.max_usage_in_bytes | memory.failcnt | paged in (memory.stat pgpgin) | OOM kills | samples delivered | GB/s |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    println!(
        "| {:.2} GiB | {:.2} GiB | {:.1} MiB | {:.1} MiB ({:.1} MiB) | {:.1} MiB | {:.1} MiB | {failcnt} | {:.2} GiB | {} | {} of {} | {:.2} |",
        gib(on_disk),
        gib(limit_set),
        mib(o.anon_growth),
        mib(o.bound),
        mib(o.bound) * 1.05,
        mib(o.file_growth),
        mib(max_usage),
        gib(stat_of("pgpgin") * 4096),
        oom_kills.map_or("unknown".into(), |k| k.to_string()),
        o.delivered,
        o.samples,
        o.data_bytes as f64 / o.secs / 1e9
    );
    let complete = o.delivered == o.samples;
    let within_limit = max_usage <= limit_set;
    println!(
        "epoch completed: {} ({} of {} samples); anon RSS growth within the bound: {} ({:.1}% of it); peak cgroup usage within the limit: {} ({:.1}% of it); page cache reclaimed under the limit: {} (paged in {:.2}x the limit, failcnt {failcnt})",
        if complete { "yes" } else { "NO" },
        o.delivered,
        o.samples,
        if o.anon_ok() { "yes" } else { "NO" },
        100.0 * o.anon_growth as f64 / o.bound as f64,
        if within_limit { "yes" } else { "NO" },
        100.0 * max_usage as f64 / limit_set as f64,
        if stat_of("pgpgin") * 4096 > limit_set {
            "yes"
        } else {
            "no (the data set never filled the limit)"
        },
        (stat_of("pgpgin") * 4096) as f64 / limit_set as f64
    );
    Ok(complete && o.anon_ok() && within_limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_target_is_met_only_when_every_worker_count_reaches_it() {
        assert!(report_bound_target(
            "x",
            &[0, 1, 2, 4],
            &[1.1, 0.8, 0.95, 0.81],
            4
        ));
        assert!(!report_bound_target(
            "x",
            &[0, 1, 2, 4],
            &[1.1, 0.79, 0.95, 0.81],
            4
        ));
        assert!(
            !report_bound_target("x", &[0, 1], &[0.9, f64::NAN], 4),
            "no figure is no pass"
        );
        assert!(report_bound_target("x", &[], &[], 4));
    }

    #[test]
    fn oversubscribed_workers_are_held_to_the_lower_target() {
        // Two CPUs: 4 workers oversubscribe them.
        assert_eq!(bound_target(0, 2), BOUND_TARGET);
        assert_eq!(bound_target(2, 2), BOUND_TARGET);
        assert_eq!(bound_target(4, 2), OVERSUBSCRIBED_TARGET);
        assert_eq!(BoundVerdict::of(0.75, 4, 2), BoundVerdict::Met);
        assert_eq!(BoundVerdict::of(0.75, 2, 2), BoundVerdict::Missed);
        assert_eq!(BoundVerdict::of(0.69, 4, 2), BoundVerdict::Missed);
        assert!(report_bound_target("x", &[1, 2, 4], &[0.85, 0.8, 0.72], 2));
        assert!(!report_bound_target(
            "x",
            &[1, 2, 4],
            &[0.85, 0.78, 0.72],
            2
        ));
    }

    #[test]
    fn a_ratio_above_the_bound_is_no_verdict_and_no_pass() {
        assert_eq!(BoundVerdict::of(1.21, 1, 2), BoundVerdict::NotABound);
        assert_eq!(BoundVerdict::of(1.2, 1, 2), BoundVerdict::Met);
        assert_eq!(BoundVerdict::of(f64::NAN, 1, 2), BoundVerdict::Missed);
        assert!(!report_bound_target("x", &[1, 2], &[0.9, 1.5], 2));
    }
}
