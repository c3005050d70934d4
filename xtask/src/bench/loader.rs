//! `cargo xtask bench loader`: trainmem's loader against a single-threaded memcpy of the same
//! bytes, burn 0.21's own data loader, and PyTorch's DataLoader, measured side by side in one
//! run; then a streaming run over a data set far larger than the loader's in-flight bound,
//! checking that anonymous RSS grows by no more than that bound.

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use burn::backend::Flex;
use burn::data::dataloader::DataLoaderBuilder;
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::InMemDataset;
use trainmem_loader::fixtures::{FixturePaths, FixtureSpec};
use trainmem_loader::{Dataset, Loader, LoaderConfig, MmapDataset, Order, StackColumns};
use trainmem_probe::rss;

use crate::gen_data::write_fixture_with_progress;

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
    /// Timed epochs per pipeline (the best is kept).
    #[arg(long, default_value_t = 3)]
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
}

const WORKERS: [usize; 3] = [0, 1, 2];

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

/// Best (shortest) of `repeats` timed runs after one warm-up run.
fn best_of(repeats: usize, mut run: impl FnMut() -> anyhow::Result<()>) -> anyhow::Result<f64> {
    run()?;
    let mut best = f64::INFINITY;
    for _ in 0..repeats.max(1) {
        let t = Instant::now();
        run()?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    Ok(best)
}

fn memcpy_epoch(ds: &MmapDataset, batch: usize, dst: &mut [Vec<u8>]) {
    for (k, col) in ds.columns().iter().enumerate() {
        let bps = col.array.bytes_per_sample();
        for chunk in col.array.data().chunks(batch * bps) {
            dst[k][..chunk.len()].copy_from_slice(chunk);
            black_box(&dst[k]);
        }
    }
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
    best = float("inf")
    for _ in range(max(1, repeats)):
        t = time.perf_counter(); epoch(); best = min(best, time.perf_counter() - t)
    out["times"][str(w)] = best
    del dl
print(json.dumps(out))
"#;

/// Seconds per epoch for each worker count, or why PyTorch could not run.
fn torch_times(args: &LoaderBenchArgs, paths: &FixturePaths) -> Result<(String, Vec<f64>), String> {
    let script = args.dir.join("torch_loader_bench.py");
    std::fs::write(&script, TORCH_SCRIPT).map_err(|e| e.to_string())?;
    let workers: Vec<String> = WORKERS.iter().map(usize::to_string).collect();
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
    let times = WORKERS
        .iter()
        .map(|w| v["times"][w.to_string()].as_f64().unwrap_or(f64::NAN))
        .collect();
    Ok((version, times))
}

struct Row {
    name: String,
    seconds: f64,
}

/// Runs the benchmark.
pub fn run(args: LoaderBenchArgs) -> anyhow::Result<ExitCode> {
    std::fs::create_dir_all(&args.dir)?;
    let paths = fixture(&args.dir, args.samples, args.dim)?;
    let ds = Arc::new(MmapDataset::open(&[&paths.features, &paths.labels])?);
    let n = ds.len();
    let bps = ds.bytes_per_sample();
    let total_bytes = (n * bps) as f64;
    println!(
        "loader bench: {n} samples x {bps} B ({:.2} GiB; f32[{}] + i64 label), batch {}, shuffled, page cache warm, best of {}",
        total_bytes / f64::from(1u32 << 30),
        args.dim,
        args.batch,
        args.repeats
    );

    let mut rows = Vec::new();
    let mut dst: Vec<Vec<u8>> = ds
        .columns()
        .iter()
        .map(|c| vec![0u8; args.batch * c.array.bytes_per_sample()])
        .collect();
    let memcpy = best_of(args.repeats, || {
        memcpy_epoch(&ds, args.batch, &mut dst);
        Ok(())
    })?;
    rows.push(Row {
        name: "memcpy, 1 thread (bound)".into(),
        seconds: memcpy,
    });

    let mut ours = Vec::new();
    for w in WORKERS {
        let config = LoaderConfig {
            batch_size: args.batch,
            workers: w,
            prefetch_factor: 2,
            persistent_workers: true,
            order: Order::Shuffled { seed: 7 },
            ..LoaderConfig::default()
        };
        let mut loader = Loader::new(Arc::clone(&ds), config, StackColumns)?;
        let s = best_of(args.repeats, || {
            let mut count = 0;
            for b in loader.epoch()? {
                let b = b?;
                count += b.len();
                black_box(&b);
            }
            anyhow::ensure!(count == n, "trainmem delivered {count} of {n} samples");
            Ok(())
        })?;
        ours.push(s);
        rows.push(Row {
            name: format!("trainmem, {w} workers"),
            seconds: s,
        });
    }

    let mut burn = Vec::new();
    if !args.no_burn {
        let items: Vec<(Vec<f32>, i64)> = (0..n)
            .map(|i| {
                let s = ds.sample(i).map_err(anyhow::Error::from)?;
                Ok((s.field::<f32>(0)?.to_vec(), s.field::<i64>(1)?[0]))
            })
            .collect::<anyhow::Result<_>>()?;
        // One in-memory copy of the data set, shared by every worker count.
        let shared = Arc::new(InMemDataset::new(items));
        for w in WORKERS {
            let mut b = DataLoaderBuilder::<Flex, _, _>::new(ConcatBatcher)
                .batch_size(args.batch)
                .shuffle(7);
            if w > 0 {
                b = b.num_workers(w);
            }
            let dl = b.build(Arc::clone(&shared));
            let s = best_of(args.repeats, || {
                let mut count = 0;
                for (x, _y) in dl.iter() {
                    count += x.len() / args.dim;
                    black_box(&x);
                }
                anyhow::ensure!(count == n, "burn delivered {count} of {n} samples");
                Ok(())
            })?;
            burn.push(s);
            rows.push(Row {
                name: format!("burn 0.21 DataLoader, {w} workers (in-memory)"),
                seconds: s,
            });
        }
    }

    let torch = if args.no_torch {
        Err("skipped (--no-torch)".to_string())
    } else {
        torch_times(&args, &paths)
    };
    match &torch {
        Ok((version, times)) => {
            for (w, s) in WORKERS.iter().zip(times) {
                rows.push(Row {
                    name: format!("PyTorch {version} DataLoader, {w} workers (np.memmap)"),
                    seconds: *s,
                });
            }
        }
        Err(why) => println!("PyTorch column: {why}"),
    }

    println!();
    println!("| pipeline | samples/s | GB/s | vs memcpy |");
    println!("|---|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {:.0} | {:.2} | {:.2} |",
            r.name,
            n as f64 / r.seconds,
            total_bytes / r.seconds / 1e9,
            memcpy / r.seconds
        );
    }
    println!();
    println!("ratios, same run (targets: >= 0.80 of memcpy, >= 3x burn, >= 5x PyTorch):");
    println!("| workers | trainmem / memcpy | trainmem / burn | trainmem / PyTorch |");
    println!("|---:|---:|---:|---:|");
    for (i, w) in WORKERS.iter().enumerate() {
        let vs_burn = burn
            .get(i)
            .map_or("n/a".to_string(), |b| format!("{:.2}x", b / ours[i]));
        let vs_torch = match &torch {
            Ok((_, t)) => format!("{:.2}x", t[i] / ours[i]),
            Err(_) => "n/a".to_string(),
        };
        println!("| {w} | {:.2} | {vs_burn} | {vs_torch} |", memcpy / ours[i]);
    }

    if args.stream_gib > 0.0 {
        stream(&args)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Streams one shuffled epoch over a large data set and reports anonymous RSS growth against
/// the loader's in-flight bound.
fn stream(args: &LoaderBenchArgs) -> anyhow::Result<()> {
    let bytes_per_sample = args.dim * 4 + 8;
    let samples = ((args.stream_gib * f64::from(1u32 << 30)) / bytes_per_sample as f64) as usize;
    let paths = fixture(&args.dir, samples, args.dim)?;
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
    let mut count = 0;
    for b in loader.epoch()? {
        let b = b?;
        count += b.len();
        black_box(&b);
        drop(b);
        let now = rss::read()?;
        max_anon = max_anon.max(now.rss_anon);
        max_file = max_file.max(now.rss_file);
    }
    let secs = t.elapsed().as_secs_f64();
    anyhow::ensure!(count == samples, "streamed {count} of {samples} samples");
    let growth = max_anon.saturating_sub(before.rss_anon);
    let peak = loader.memory_peak();
    let mib = |b: u64| b as f64 / f64::from(1u32 << 20);
    println!();
    println!(
        "streaming: {samples} samples, {:.2} GiB on disk (page cache cold or warm as the OS has it), 2 workers, prefetch 2, shuffled, {:.2} GB/s",
        (samples * ds.bytes_per_sample()) as f64 / f64::from(1u32 << 30),
        (samples * ds.bytes_per_sample()) as f64 / secs / 1e9
    );
    println!(
        "| anon RSS growth | in-flight bound (+5%) | loader total peak (own accounting) | RssFile peak growth |"
    );
    println!("|---:|---:|---:|---:|");
    println!(
        "| {:.1} MiB | {:.1} MiB ({:.1} MiB) | {:.1} MiB | {:.1} MiB |",
        mib(growth),
        mib(bound as u64),
        mib(bound as u64) * 1.05,
        mib(peak.total as u64),
        mib(max_file.saturating_sub(before.rss_file))
    );
    let ok = (growth as f64) <= bound as f64 * 1.05;
    println!(
        "anon RSS growth within the bound: {} ({:.1}% of it; data set is {:.0}x the bound)",
        if ok { "yes" } else { "NO" },
        100.0 * growth as f64 / bound as f64,
        (samples * ds.bytes_per_sample()) as f64 / bound as f64
    );
    Ok(())
}
