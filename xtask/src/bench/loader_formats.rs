//! `cargo xtask bench loader-formats`: trainmem's loader on token windows (a flat `u16` token
//! file cut into `seq + 1` windows) and on an Arrow list column (a tokenized `datasets`-style
//! stream, padded to the batch's longest row, and packed), at 0, 1, 2 and 4 workers, each
//! beside the memcpy bound of the same bytes measured in the same run: the bytes copied in
//! batch-sized chunks on `max(W, 1)` threads, as `bench loader` measures its bound. Every
//! figure is the median of `--reps` timed epochs after one warm-up, with the min and max.

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use trainmem_loader::format_fixtures::{write_arrow_lists, write_tokens};
use trainmem_loader::{
    ArrowDataset, BatchBuilder, Dataset, Dtype, HeldBytes, Loader, LoaderConfig, Order,
    PackCollate, PadCollate, PadTo, StackWindows, TokenFile, TokenWindows, WindowSpec,
};

/// Arguments of `bench loader-formats`.
#[derive(Debug, clap::Args)]
pub struct LoaderFormatsBenchArgs {
    /// Where the token and Arrow files are written (reused when already there).
    #[arg(long, default_value = "target/bench-loader-formats")]
    pub dir: PathBuf,
    /// Tokens in the token file (u16).
    #[arg(long, default_value_t = 64 << 20)]
    pub tokens: usize,
    /// Window length (a window holds seq + 1 tokens).
    #[arg(long, default_value_t = 1024)]
    pub seq: usize,
    /// Rows of the Arrow file.
    #[arg(long, default_value_t = 1 << 16)]
    pub rows: usize,
    /// Shortest and longest Arrow row, in ids.
    #[arg(long, num_args = 2, default_values_t = [256, 768])]
    pub row_len: Vec<usize>,
    /// Batch size.
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    /// Prefetch factor (batches in flight per worker).
    #[arg(long, default_value_t = 2)]
    pub prefetch: usize,
    /// Timed epochs per row (the median, min and max are printed).
    #[arg(long, default_value_t = 5)]
    pub reps: usize,
    /// Read samples in order instead of shuffled (to separate the cost of random access).
    #[arg(long)]
    pub sequential: bool,
}

const WORKERS: [usize; 4] = [0, 1, 2, 4];

/// Seconds of `reps` timed runs after one warm-up, sorted.
fn timed(reps: usize, mut run: impl FnMut() -> anyhow::Result<()>) -> anyhow::Result<Vec<f64>> {
    run()?;
    let mut out = Vec::with_capacity(reps);
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        run()?;
        out.push(t.elapsed().as_secs_f64());
    }
    out.sort_by(f64::total_cmp);
    Ok(out)
}

fn median(t: &[f64]) -> f64 {
    t[t.len() / 2]
}

/// Copies `src` in `chunk`-byte pieces, the pieces split in contiguous shares between
/// `threads` threads, each into its own buffer.
fn memcpy_chunks(src: &[&[u8]], chunk: usize, threads: usize) {
    let pieces: Vec<&[u8]> = src.iter().flat_map(|s| s.chunks(chunk.max(1))).collect();
    let share = pieces.len().div_ceil(threads.max(1));
    std::thread::scope(|scope| {
        for mine in pieces.chunks(share.max(1)) {
            scope.spawn(move || {
                let mut dst = vec![0u8; chunk];
                for p in mine {
                    dst[..p.len()].copy_from_slice(p);
                    black_box(&dst);
                }
            });
        }
    });
}

/// One table row: a pipeline's sorted epoch times.
struct Row {
    name: String,
    times: Vec<f64>,
    bound: Option<f64>,
}

/// Rows for `bytes` of source data: the memcpy bound and the loader at every worker count.
fn measure<D: Dataset, B: BatchBuilder<D> + Clone>(
    args: &LoaderFormatsBenchArgs,
    data: &Arc<D>,
    builder: &B,
    src: &[&[u8]],
    label: &str,
) -> anyhow::Result<Vec<Row>> {
    let n = data.len();
    let batches = n.div_ceil(args.batch);
    let bytes: usize = src.iter().map(|s| s.len()).sum();
    let chunk = bytes.div_ceil(batches.max(1));
    let mut rows = Vec::new();
    for w in WORKERS {
        let threads = w.max(1);
        let bound = timed(args.reps, || {
            memcpy_chunks(src, chunk, threads);
            Ok(())
        })?;
        let config = LoaderConfig {
            batch_size: args.batch,
            workers: w,
            prefetch_factor: args.prefetch,
            persistent_workers: true,
            order: if args.sequential {
                Order::Sequential
            } else {
                Order::Shuffled { seed: 7 }
            },
            ..LoaderConfig::default()
        };
        let mut loader = Loader::new(Arc::clone(data), config, builder.clone())?;
        let mut held = 0;
        let ours = timed(args.reps, || {
            let mut count = 0;
            held = 0;
            for b in loader.epoch()? {
                let b = b?;
                count += 1;
                held += black_box(b.byte_size());
            }
            anyhow::ensure!(count == batches, "{label}: {count} of {batches} batches");
            Ok(())
        })?;
        let m = median(&bound);
        rows.push(Row {
            name: format!(
                "memcpy, {threads} thread{}",
                if threads > 1 { "s" } else { "" }
            ),
            times: bound,
            bound: None,
        });
        if w == 0 {
            println!(
                "{label}: batches hold {:.1} MiB per epoch (the bound copies the source bytes)",
                held as f64 / f64::from(1u32 << 20)
            );
        }
        rows.push(Row {
            name: format!("{label}, {w} workers"),
            times: ours,
            bound: Some(m),
        });
    }
    Ok(rows)
}

fn print(title: &str, bytes: usize, rows: &[Row]) {
    println!();
    println!(
        "{title}: {:.1} MiB per epoch",
        bytes as f64 / f64::from(1u32 << 20)
    );
    println!("| pipeline | median s | min s | max s | GB/s (median) | vs memcpy bound (median) |");
    println!("|---|---:|---:|---:|---:|---:|");
    for r in rows {
        let m = median(&r.times);
        let ratio = r
            .bound
            .map_or(String::from("bound"), |b| format!("{:.2}", b / m));
        println!(
            "| {} | {:.4} | {:.4} | {:.4} | {:.2} | {} |",
            r.name,
            m,
            r.times[0],
            r.times[r.times.len() - 1],
            bytes as f64 / m / 1e9,
            ratio
        );
    }
}

fn token_file(args: &LoaderFormatsBenchArgs) -> anyhow::Result<PathBuf> {
    let p = args.dir.join(format!("tokens-{}.bin", args.tokens));
    if std::fs::metadata(&p).map(|m| m.len()).ok() != Some(2 * args.tokens as u64) {
        write_tokens(&p, args.tokens, 50257, 1)?;
    }
    Ok(p)
}

fn arrow_file(args: &LoaderFormatsBenchArgs) -> anyhow::Result<PathBuf> {
    let (lo, hi) = (args.row_len[0], args.row_len[1].max(args.row_len[0]));
    let p = args
        .dir
        .join(format!("lists-{}-{lo}-{hi}.arrow", args.rows));
    if !Path::new(&p).exists() {
        write_arrow_lists(&p, args.rows, (lo, hi), 1000, 1, false)?;
    }
    Ok(p)
}

/// Runs the benchmark.
pub fn run(args: LoaderFormatsBenchArgs) -> anyhow::Result<ExitCode> {
    std::fs::create_dir_all(&args.dir)?;
    println!(
        "loader-formats bench: batch {}, prefetch {}, {}, persistent workers, page cache warm, median of {} (min, max), {} CPUs",
        args.batch,
        args.prefetch,
        if args.sequential {
            "in order"
        } else {
            "shuffled"
        },
        args.reps,
        std::thread::available_parallelism().map_or(0, usize::from)
    );
    let tokens = TokenFile::open(token_file(&args)?, Dtype::U16, Some(50257))?;
    let windows = Arc::new(TokenWindows::new(tokens, WindowSpec::tiled(args.seq))?);
    let wbytes = windows.len() * windows.bytes_per_sample();
    let file = windows
        .tokens()
        .bytes(0, windows.tokens().len())
        .unwrap_or(&[]);
    let src = [&file[..wbytes.min(file.len())]];
    let rows = measure(
        &args,
        &windows,
        &StackWindows,
        &src,
        "trainmem token windows",
    )?;
    print(
        &format!(
            "token windows: {} windows of {} u16 tokens",
            windows.len(),
            args.seq + 1
        ),
        wbytes,
        &rows,
    );

    let arrow = Arc::new(ArrowDataset::open_columns(
        arrow_file(&args)?,
        &["input_ids"],
    )?);
    // The rows lie back to back in each record batch: the bound copies those regions.
    let regions = arrow.columns()[0].value_bytes();
    let abytes: usize = regions.iter().map(|v| v.len()).sum();
    let pad = PadCollate::new(&arrow, "input_ids", 0, PadTo::Longest)?;
    let rows = measure(
        &args,
        &arrow,
        &pad,
        &regions,
        "trainmem arrow list, pad to longest",
    )?;
    print(
        &format!(
            "arrow list<int32>: {} rows of {}..={} ids",
            arrow.len(),
            args.row_len[0],
            args.row_len[1]
        ),
        abytes,
        &rows,
    );
    let pack = PackCollate::new(&arrow, "input_ids", 0, args.row_len[1] * 2)?;
    let rows = measure(
        &args,
        &arrow,
        &pack,
        &regions,
        "trainmem arrow list, packed",
    )?;
    print(
        "arrow list<int32>, packed into rows of 2 x the longest",
        abytes,
        &rows,
    );
    Ok(ExitCode::SUCCESS)
}
