//! `cargo xtask bench loader-formats`: trainmem's loader on token windows (a flat `u16` token
//! file cut into `seq + 1` windows) and on an Arrow list column (a tokenized `datasets`-style
//! stream, padded to the batch's longest row, and packed), at 0, 1, 2 and 4 workers, each
//! beside its copy bound measured in the same rounds.
//!
//! The bound of a format is the least work that produces the loader's batches: for every batch
//! of the loader's next epoch (the same samples in the same order, [`EpochPlan`]), each source
//! row copied with `memcpy` from the mapping into a destination of the batch's shape, and every
//! other byte of that destination (padding, separators, the attention mask) written once with
//! `memset`. The batches are split between `max(W, 1)` threads, each reusing one destination
//! (the fewest buffers any loader could use). Before timing, the bound's first batch is checked
//! to be byte for byte the loader's, so both do the same work. Rates are the source bytes per
//! second (the bytes read from the mapping). A reference column copies the same source bytes
//! contiguously in file order, in batch-sized chunks (long sequential runs, no shuffling, no
//! padding): the bound this bench used before, kept for comparison.
//!
//! With workers, worker `j` and the bound's thread `j` are pinned to the same CPU (the `j`-th
//! this process may use, counted from the one after the caller's; `--no-pin` leaves them to
//! the scheduler): on a virtual machine one vCPU can copy up to 1.75× faster than another at
//! the same moment, and a 1-worker row whose bound ran on the caller's CPU while the worker
//! built on the other one measured that difference, in either direction (see `pinning`). The
//! caller itself is never pinned; the 0-worker row runs the bound and the loader on the
//! caller's thread.
//!
//! Every configuration is timed in rounds (the bound, the reference and the loader back to
//! back, on the same epoch's batches, with an untimed copy of the source before the bound so
//! that the bound and the loader each start right after the same streaming copy), one warm-up
//! round then `--reps`; the ratio is the median
//! of the per-round ratios, with its min and max. Beside it, to show where the time goes: the
//! process's minor page faults during each loader epoch (`/proc/self/stat`), the time the
//! caller's thread and the workers spent on a CPU and runnable but waiting for one
//! (`/proc/self/task/*/schedstat`; on a shared machine the waiting is other processes' load),
//! the process's CPU time during the bound over that during the loader's epoch
//! (`getrusage`), and the 10th, 50th and 90th percentiles of the time each of the epoch's
//! batches took to build ([`Loader::build_times`]): with workers, build times above the
//! 0-worker row's mean the workers' CPUs were slower, equal ones with a slower epoch mean the
//! time went in the hand-over.

use super::{on_threads, spawn_each};
use std::collections::BTreeSet;
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use trainmem_core::Dtype;
use trainmem_loader::format_fixtures::{write_arrow_lists, write_tokens};
use trainmem_loader::{
    ArrowDataset, BatchBuilder, Dataset, EpochPlan, Loader, LoaderConfig, Order, PackCollate,
    PackedBatch, PadCollate, PadTo, PaddedBatch, StackWindows, TokenBatch, TokenFile, TokenWindows,
    WindowSpec, current_cpu, mapped_pages, prefetch_pages, read_in_huge_pages,
};

use super::handover;
use super::loader::timing::Spread;
use super::loader::{BoundVerdict, bound_target, cpus, report_bound_target};
use super::pinning::{self, Pinned};

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
    /// Timed rounds (the median, min and max are printed), after one warm-up round.
    #[arg(long, default_value_t = 5)]
    pub reps: usize,
    /// Worker counts to run.
    #[arg(long, num_args = 1.., default_values_t = [0, 1, 2, 4])]
    pub workers: Vec<usize>,
    /// Formats to run.
    #[arg(long, num_args = 1.., value_enum, default_values_t = [Format::Tokens, Format::Pad, Format::Pack])]
    pub formats: Vec<Format>,
    /// Read samples in order instead of shuffled (to separate the cost of random access).
    #[arg(long)]
    pub sequential: bool,
    /// How the data files sit in the page cache while they are read: `huge` drops each file
    /// from the page cache and reads it back through a mapping advised `MADV_HUGEPAGE`
    /// (`trainmem_loader::read_in_huge_pages`), so that where the kernel and the file system
    /// allow it every run reads them through 2 MiB pages; `as-cached` leaves them as they are
    /// (a file the bench has just written is usually cached in 4 KiB pages).
    #[arg(long, value_enum, default_value_t = Pages::Huge)]
    pub pages: Pages,
    /// Leave the workers and the bound's threads where the scheduler puts them. By default,
    /// with workers, worker `j` and the bound's thread `j` are both pinned to the `j`-th CPU
    /// this process may use, so that each row's bound runs on the CPUs its workers build on
    /// (see the `pinning` module).
    #[arg(long)]
    pub no_pin: bool,
}

/// How the bench's data files are cached (see `--pages`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Pages {
    /// Read back in 2 MiB pages where the kernel can.
    Huge,
    /// As the page cache holds them.
    AsCached,
}

/// A format row of the bench.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Token windows stacked into `[batch, seq + 1]`.
    Tokens,
    /// An Arrow list column padded to each batch's longest row, with a mask.
    Pad,
    /// An Arrow list column packed into rows of twice the longest row, with a mask.
    Pack,
}

impl Format {
    fn title(self) -> &'static str {
        match self {
            Format::Tokens => "token windows",
            Format::Pad => "Arrow list, pad to longest",
            Format::Pack => "Arrow list, packed",
        }
    }
}

/// The padding id and the packing separator of the Arrow rows (the bound writes it too).
const PAD_ID: i64 = 0;

/// Nanoseconds the live threads of this process have spent on a CPU and waiting runnable for
/// one (the first two fields of `/proc/self/task/*/schedstat`), summed separately over the
/// loader's worker threads (named `trainmem-loader-*`) and over every other thread. Threads
/// that already exited are not counted: read it around work done by threads that outlive it.
#[derive(Debug, Default, Clone, Copy)]
struct ThreadTimes {
    worker_run: u64,
    worker_wait: u64,
    other_run: u64,
    other_wait: u64,
}

fn thread_times() -> anyhow::Result<ThreadTimes> {
    let mut sum = ThreadTimes::default();
    for task in std::fs::read_dir("/proc/self/task").context("listing /proc/self/task")? {
        let dir = task?.path();
        // A thread that exited meanwhile has no files left: skip it.
        let (Ok(s), Ok(comm)) = (
            std::fs::read_to_string(dir.join("schedstat")),
            std::fs::read_to_string(dir.join("comm")),
        ) else {
            continue;
        };
        let mut f = s.split_whitespace().map(str::parse::<u64>);
        if let (Some(Ok(run)), Some(Ok(wait))) = (f.next(), f.next()) {
            if comm.starts_with("trainmem-loader") {
                sum.worker_run += run;
                sum.worker_wait += wait;
            } else {
                sum.other_run += run;
                sum.other_wait += wait;
            }
        }
    }
    Ok(sum)
}

/// How one batch of a format is laid out by the bound: writes the batch of `rows` into `dst`
/// and returns the bytes written.
trait BoundBatch: Sync {
    /// The largest destination a batch of `batch` samples can need.
    fn max_bytes(&self, batch: usize) -> usize;
    /// Writes the batch of samples `rows` into `dst`; the bytes written.
    fn write(&self, rows: &[usize], dst: &mut [u8]) -> usize;
}

/// Token windows: each window copied back to back.
struct WindowsBound<'a>(&'a TokenWindows);

/// `rows` in order, each one's successor given the loader's page hint ([`prefetch_pages`]) as
/// it is handed out to be copied.
fn copy_rows<'a>(rows: impl Iterator<Item = &'a [u8]> + Clone) -> impl Iterator<Item = &'a [u8]> {
    let mut ahead = rows.clone().skip(1);
    rows.inspect(move |_| {
        if let Some(next) = ahead.next() {
            prefetch_pages(next);
        }
    })
}

impl BoundBatch for WindowsBound<'_> {
    fn max_bytes(&self, batch: usize) -> usize {
        batch * self.0.bytes_per_sample()
    }

    fn write(&self, rows: &[usize], dst: &mut [u8]) -> usize {
        let w = self.0;
        let src = rows
            .iter()
            .map(|&i| w.sample(i).map(|s| s.bytes).unwrap_or(&[]));
        let mut off = 0;
        for s in copy_rows(src) {
            dst[off..off + s.len()].copy_from_slice(s);
            off += s.len();
        }
        off
    }
}

/// An Arrow list column: the source rows of one batch.
fn arrow_rows<'a>(data: &'a ArrowDataset, rows: &[usize]) -> Vec<&'a [u8]> {
    rows.iter()
        .map(|&i| data.row_bytes(0, i).unwrap_or(&[]))
        .collect()
}

/// Padded to the batch's longest row: `[batch, width]` ids (rows then padding), then the
/// `[batch, width]` mask (1 over a row, 0 over its padding).
struct PadBound<'a> {
    data: &'a ArrowDataset,
    size: usize,
    longest: usize,
}

impl BoundBatch for PadBound<'_> {
    fn max_bytes(&self, batch: usize) -> usize {
        batch * self.longest * (self.size + 1)
    }

    fn write(&self, rows: &[usize], dst: &mut [u8]) -> usize {
        let src = arrow_rows(self.data, rows);
        let width = src.iter().map(|r| r.len() / self.size).max().unwrap_or(0);
        let row_bytes = width * self.size;
        let (ids, mask) = dst.split_at_mut(rows.len() * row_bytes);
        for (r, s) in copy_rows(src.iter().copied()).enumerate() {
            let out = &mut ids[r * row_bytes..(r + 1) * row_bytes];
            out[..s.len()].copy_from_slice(s);
            out[s.len()..].fill(PAD_ID as u8);
            let m = &mut mask[r * width..(r + 1) * width];
            m[..s.len() / self.size].fill(1);
            m[s.len() / self.size..].fill(0);
        }
        rows.len() * (row_bytes + width)
    }
}

/// Packed into rows of `length` ids: each source row then one separator, a row that does not
/// fit starting the next packed row, the rest of a packed row filled with the separator; then
/// the mask (1 over rows and their separators, 0 over the fill).
struct PackBound<'a> {
    data: &'a ArrowDataset,
    size: usize,
    length: usize,
}

impl BoundBatch for PackBound<'_> {
    fn max_bytes(&self, batch: usize) -> usize {
        batch * self.length * (self.size + 1)
    }

    fn write(&self, rows: &[usize], dst: &mut [u8]) -> usize {
        let src = arrow_rows(self.data, rows);
        // Packed rows: how many, from the lengths alone.
        let mut packed = 0;
        let mut used = 0;
        for s in &src {
            let len = (s.len() / self.size).min(self.length - 1);
            if used > 0 && used + len + 1 > self.length || packed == 0 {
                packed += 1;
                used = 0;
            }
            used += len + 1;
        }
        let row_bytes = self.length * self.size;
        let (ids, mask) = dst.split_at_mut(packed * row_bytes);
        let (mut row, mut used) = (0usize, 0usize);
        let close = |ids: &mut [u8], mask: &mut [u8], row: usize, used: usize| {
            ids[row * row_bytes + used * self.size..(row + 1) * row_bytes].fill(PAD_ID as u8);
            mask[row * self.length..row * self.length + used].fill(1);
            mask[row * self.length + used..(row + 1) * self.length].fill(0);
        };
        for s in copy_rows(src.iter().copied()) {
            let len = (s.len() / self.size).min(self.length - 1);
            if used > 0 && used + len + 1 > self.length {
                close(ids, mask, row, used);
                row += 1;
                used = 0;
            }
            let at = row * row_bytes + used * self.size;
            ids[at..at + len * self.size].copy_from_slice(&s[..len * self.size]);
            ids[at + len * self.size..at + (len + 1) * self.size].fill(PAD_ID as u8);
            used += len + 1;
        }
        if packed > 0 {
            close(ids, mask, row, used.min(self.length));
        }
        packed * (row_bytes + self.length)
    }
}

/// Nanoseconds of CPU time (user and system) this process has used so far, every thread
/// included, exited ones too (`getrusage(RUSAGE_SELF)`).
fn process_cpu_ns() -> u64 {
    let mut u = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `getrusage` writes one `rusage` through the pointer, which points to a live,
    // zeroed `rusage`; `RUSAGE_SELF` is a valid target and the call has no other effect.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, u.as_mut_ptr()) };
    if rc != 0 {
        return 0;
    }
    // SAFETY: zero-initialised and filled in by the successful call above.
    let u = unsafe { u.assume_init() };
    let ns = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
    ns(u.ru_utime) + ns(u.ru_stime)
}

/// Where the threads of one row run: thread `j` (worker `j`, and the bound's and the
/// reference's thread `j`) on the `j`-th CPU of the list, round robin; nowhere in particular
/// when the list is empty (no workers, `--no-pin`, or a platform that cannot pin).
struct Cpus(Vec<usize>);

impl Cpus {
    /// The allowed CPUs, starting after the one this thread (the loader's caller) is on, so
    /// that the first worker is pinned away from the caller.
    fn after_this_thread(mut allowed: Vec<usize>) -> Cpus {
        if let Some(here) = current_cpu().and_then(|c| allowed.iter().position(|&a| a == c)) {
            allowed.rotate_left(here + 1);
        }
        Cpus(allowed)
    }

    fn of(&self, j: usize) -> Option<usize> {
        (!self.0.is_empty()).then(|| self.0[j % self.0.len()])
    }

    /// `copy(t, dst[t])` for every thread `t`: unpinned as [`on_threads`] runs it, or, when
    /// pinned, each on a scoped thread of its own pinned to `self.of(t)`, the caller's thread
    /// included when there is one, so that the caller is never moved (starting the thread,
    /// tens of microseconds, counts in the bound's time: well under 1% of an epoch).
    fn run<T: Send>(&self, dst: &mut [T], copy: impl Fn(usize, &mut T) + Sync) {
        if self.0.is_empty() {
            return on_threads(dst, copy);
        }
        spawn_each(dst, |t, mine| {
            let _pin = Pinned::to(self.of(t));
            copy(t, mine)
        });
    }
}

/// Pins the worker threads a loader has just started (the `trainmem-loader` threads not in
/// `before`), the `j`-th on `cpus.of(j)`; how many were pinned.
fn pin_workers(before: &BTreeSet<i32>, cpus: &Cpus) -> usize {
    let started: Vec<i32> = pinning::threads_named("trainmem-loader")
        .difference(before)
        .copied()
        .collect();
    started
        .iter()
        .enumerate()
        .filter(|&(j, &tid)| cpus.of(j).is_some_and(|c| pinning::pin(tid, c)))
        .count()
}

/// The bound of one epoch: every batch of `plan` written by `bound`, the batches split in
/// contiguous shares between `dst.len()` threads, each reusing its one destination.
fn bound_epoch(bound: &dyn BoundBatch, plan: &EpochPlan, dst: &mut [Vec<u8>], cpus: &Cpus) {
    let share = plan.len().div_ceil(dst.len().max(1));
    cpus.run(dst, |t, mine| {
        for k in (t * share..(t + 1) * share).take_while(|&k| k < plan.len()) {
            bound.write(plan.batch(k), mine);
            black_box(&mut *mine);
        }
    });
}

/// The reference: the source regions copied in file order, in chunks of `chunk` bytes, the
/// chunks split in contiguous shares between `dst.len()` threads.
fn contiguous_epoch(src: &[&[u8]], chunk: usize, dst: &mut [Vec<u8>], cpus: &Cpus) {
    let pieces: Vec<&[u8]> = src.iter().flat_map(|s| s.chunks(chunk.max(1))).collect();
    let share = pieces.len().div_ceil(dst.len().max(1));
    cpus.run(dst, |t, mine| {
        for p in pieces.iter().skip(t * share).take(share) {
            mine[..p.len()].copy_from_slice(p);
            black_box(&mut *mine);
        }
    });
}

/// A batch's output bytes in order (ids then mask), to check the bound writes the same.
trait OutputBytes {
    fn output(&self) -> Vec<u8>;
}

impl OutputBytes for TokenBatch {
    fn output(&self) -> Vec<u8> {
        self.tokens.as_bytes().to_vec()
    }
}

impl OutputBytes for PaddedBatch {
    fn output(&self) -> Vec<u8> {
        [self.ids.as_bytes(), self.mask()].concat()
    }
}

impl OutputBytes for PackedBatch {
    fn output(&self) -> Vec<u8> {
        [self.ids.as_bytes(), self.mask()].concat()
    }
}

/// Waits (untimed) until persistent workers have finished the next epoch's first batches,
/// which they start while an epoch ends, so that work never overlaps the next timing.
fn settle<D: Dataset, B: BatchBuilder<D>>(loader: &Loader<D, B>) {
    let c = loader.config();
    let want = c.max_batches_in_flight().min(loader.batches_per_epoch());
    let deadline = Instant::now() + Duration::from_secs(2);
    while c.workers > 0 && loader.memory().ready_batches < want && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The loader's configuration with `workers` workers.
fn config(args: &LoaderFormatsBenchArgs, workers: usize) -> LoaderConfig {
    LoaderConfig {
        batch_size: args.batch,
        workers,
        prefetch_factor: args.prefetch,
        persistent_workers: true,
        order: if args.sequential {
            Order::Sequential
        } else {
            Order::Shuffled { seed: 7 }
        },
        ..LoaderConfig::default()
    }
}

/// One format's seconds per round for one worker count.
#[derive(Debug, Default)]
struct Times {
    bound: Vec<f64>,
    contiguous: Vec<f64>,
    ours: Vec<f64>,
    faults: Vec<f64>,
    bound_faults: Vec<f64>,
    /// CPU seconds of the process per epoch: during the bound, during the loader's epoch.
    bound_cpu: Vec<f64>,
    ours_cpu: Vec<f64>,
    /// Seconds per epoch on a CPU: the caller's thread, the workers' (summed).
    main_cpu: Vec<f64>,
    worker_cpu: Vec<f64>,
    /// Seconds per epoch runnable but waiting for a CPU: the caller's, the workers'.
    main_runnable: Vec<f64>,
    worker_runnable: Vec<f64>,
    /// Seconds each batch of the epoch took to build (the loader's own reading): the 10th,
    /// 50th and 90th percentiles.
    build_p10: Vec<f64>,
    build_p50: Vec<f64>,
    build_p90: Vec<f64>,
}

/// One format at every worker count: one check-and-warm-up round, then `reps` timed rounds.
fn measure<D, B>(
    args: &LoaderFormatsBenchArgs,
    data: &Arc<D>,
    builder: &B,
    bound: &dyn BoundBatch,
    src: &[&[u8]],
) -> anyhow::Result<Vec<Times>>
where
    D: Dataset,
    B: BatchBuilder<D> + Clone,
    B::Batch: OutputBytes,
{
    let n = data.len();
    let batches = n.div_ceil(args.batch.max(1));
    let bytes: usize = src.iter().map(|s| s.len()).sum();
    let chunk = bytes.div_ceil(batches.max(1));
    let mut loaders = Vec::new();
    let mut dst = Vec::new();
    for &w in &args.workers {
        loaders.push(Loader::new(
            Arc::clone(data),
            config(args, w),
            builder.clone(),
        )?);
        let size = bound.max_bytes(args.batch).max(chunk);
        dst.push((0..w.max(1)).map(|_| vec![0u8; size]).collect::<Vec<_>>());
    }
    let mut out: Vec<Times> = args.workers.iter().map(|_| Times::default()).collect();
    // With workers (and unless `--no-pin`), each row's threads pinned one per CPU; with none
    // the bound and the loader both run on this thread, unpinned.
    let allowed = if args.no_pin {
        Vec::new()
    } else {
        pinning::allowed_cpus()
    };
    let cpus: Vec<Cpus> = args
        .workers
        .iter()
        .map(|&w| Cpus::after_this_thread(if w == 0 { Vec::new() } else { allowed.clone() }))
        .collect();
    for round in 0..=args.reps.max(1) {
        for (i, loader) in loaders.iter_mut().enumerate() {
            let cpus = &cpus[i];
            // The loader's next epoch, and the same batches for the bound.
            let plan = EpochPlan::new(n, loader.config(), loader.state().epoch);
            // The bound and the loader each start right after the same streaming copy of the
            // source (untimed here, timed below as the reference), so both find the caches in
            // the same state: with the bound run straight after the previous loader epoch
            // instead, the bound ran 3–4% faster than after the copy.
            contiguous_epoch(src, chunk, &mut dst[i], cpus);
            let f0 = trainmem_probe::rss::minor_faults()?;
            let c0 = process_cpu_ns();
            let t = Instant::now();
            bound_epoch(bound, &plan, &mut dst[i], cpus);
            let b = t.elapsed().as_secs_f64();
            let bcpu = process_cpu_ns().saturating_sub(c0);
            let bf = trainmem_probe::rss::minor_faults()? - f0;
            let t = Instant::now();
            contiguous_epoch(src, chunk, &mut dst[i], cpus);
            let c = t.elapsed().as_secs_f64();
            let mut count = 0;
            let mut first = None;
            let f0 = trainmem_probe::rss::minor_faults()?;
            let s0 = thread_times()?;
            let built0 = loader.build_times();
            let c0 = process_cpu_ns();
            // The workers start in the warm-up round's epoch (they persist): pinned after it.
            let before = if round == 0 {
                pinning::threads_named("trainmem-loader")
            } else {
                BTreeSet::new()
            };
            let t = Instant::now();
            for batch in loader.epoch()? {
                let batch = batch?;
                if round == 0 && count == 0 {
                    first = Some(batch.output());
                }
                count += 1;
                black_box(&batch);
            }
            let o = t.elapsed().as_secs_f64();
            let ocpu = process_cpu_ns().saturating_sub(c0);
            let s1 = thread_times()?;
            let built = loader.build_times().since(&built0);
            let f = trainmem_probe::rss::minor_faults()? - f0;
            anyhow::ensure!(count == batches, "{count} of {batches} batches");
            if let Some(first) = first {
                // The bound does the loader's work: its first batch is the loader's, byte for
                // byte (checked in the warm-up round, outside the timings).
                let mut mine = vec![0u8; bound.max_bytes(args.batch)];
                let len = bound.write(plan.batch(0), &mut mine);
                anyhow::ensure!(
                    mine[..len] == first[..],
                    "the bound's first batch differs from the loader's ({len} against {} bytes)",
                    first.len()
                );
            }
            if round == 0 && !cpus.0.is_empty() {
                let w = loader.config().workers;
                let pinned = pin_workers(&before, cpus);
                anyhow::ensure!(
                    pinned == w,
                    "pinned {pinned} of {w} worker threads (run with --no-pin to leave them)"
                );
            }
            settle(loader);
            if round > 0 {
                let t = &mut out[i];
                t.bound.push(b);
                t.contiguous.push(c);
                t.ours.push(o);
                t.faults.push(f as f64);
                t.bound_faults.push(bf as f64);
                let d = |a: u64, b: u64| a.saturating_sub(b) as f64 / 1e9;
                t.bound_cpu.push(bcpu as f64 / 1e9);
                t.ours_cpu.push(ocpu as f64 / 1e9);
                t.main_cpu.push(d(s1.other_run, s0.other_run));
                t.worker_cpu.push(d(s1.worker_run, s0.worker_run));
                t.main_runnable.push(d(s1.other_wait, s0.other_wait));
                t.worker_runnable.push(d(s1.worker_wait, s0.worker_wait));
                let q = |q: f64| built.quantile(q).map_or(f64::NAN, |d| d.as_secs_f64());
                t.build_p10.push(q(0.1));
                t.build_p50.push(q(0.5));
                t.build_p90.push(q(0.9));
            }
        }
    }
    Ok(out)
}

fn ratios(bound: &[f64], ours: &[f64]) -> Spread {
    let r: Vec<f64> = bound.iter().zip(ours).map(|(b, o)| b / o).collect();
    Spread::of(&r)
}

/// What the summary needs of one format's row at one worker count.
#[derive(Debug, Clone, Copy)]
struct Cell {
    /// trainmem / bound.
    ratio: Spread,
    /// The median over rounds of the batches' median build time, in seconds.
    build_p50: f64,
}

/// One format's table; returns its cell per worker count.
fn print(
    args: &LoaderFormatsBenchArgs,
    title: &str,
    src_bytes: usize,
    out_bytes: usize,
    times: &[Times],
) -> Vec<Cell> {
    let gbs = |s: f64| src_bytes as f64 / s / 1e9;
    println!();
    println!(
        "{title}: {:.1} MiB read from the mapping and {:.1} MiB of batches written per epoch",
        src_bytes as f64 / f64::from(1u32 << 20),
        out_bytes as f64 / f64::from(1u32 << 20),
    );
    println!(
        "| workers | bound GB/s median (min–max) | trainmem GB/s median (min–max) | trainmem / bound: median | min | max | target | met | trainmem / contiguous source copy (median) | minor faults per epoch: trainmem (bound) | trainmem epoch ms: wall; caller on CPU / runnable; workers on CPU / runnable (medians) | CPU time: bound / trainmem (median) | batch build µs: p10 / p50 / p90 (medians) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|");
    let mut spreads = Vec::new();
    for (w, t) in args.workers.iter().zip(times) {
        let build_p50 = Spread::of(&t.build_p50).median;
        let b = Spread::of(&t.bound).map_decreasing(gbs);
        let o = Spread::of(&t.ours).map_decreasing(gbs);
        let r = ratios(&t.bound, &t.ours);
        let c = ratios(&t.contiguous, &t.ours);
        println!(
            "| {w} | {:.2} ({:.2}–{:.2}) | {:.2} ({:.2}–{:.2}) | {:.2} | {:.2} | {:.2} | {:.2} | {} | {:.2} | {:.0} ({:.0}) | {:.1}; {:.1} / {:.1}; {:.1} / {:.1} | {:.2} | {:.1} / {:.1} / {:.1} |",
            b.median,
            b.min,
            b.max,
            o.median,
            o.min,
            o.max,
            r.median,
            r.min,
            r.max,
            bound_target(*w, cpus()),
            BoundVerdict::of(r.median, *w, cpus()).cell(),
            c.median,
            Spread::of(&t.faults).median,
            Spread::of(&t.bound_faults).median,
            Spread::of(&t.ours).median * 1e3,
            Spread::of(&t.main_cpu).median * 1e3,
            Spread::of(&t.main_runnable).median * 1e3,
            Spread::of(&t.worker_cpu).median * 1e3,
            Spread::of(&t.worker_runnable).median * 1e3,
            ratios(&t.bound_cpu, &t.ours_cpu).median,
            Spread::of(&t.build_p10).median * 1e6,
            build_p50 * 1e6,
            Spread::of(&t.build_p90).median * 1e6,
        );
        spreads.push(Cell {
            ratio: r,
            build_p50,
        });
    }
    spreads
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

/// Round trips per timed round of the hand-over measurement, and its rounds.
const HANDOVER_TRIPS: usize = 20_000;
const HANDOVER_ROUNDS: usize = 5;

/// With as many workers as CPUs or more, the cost of one hand-over between two threads sharing
/// a CPU (see `handover`), and what share it is of each such row's median build: the time every
/// batch of those rows pays outside its build, which the bound does not.
fn print_handover(args: &LoaderFormatsBenchArgs, summary: &[(Format, Vec<Cell>)]) {
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let full: Vec<usize> = (0..args.workers.len())
        .filter(|&k| args.workers[k] > 0 && args.workers[k] >= cpus)
        .collect();
    if full.is_empty() || summary.is_empty() {
        return;
    }
    let cpu = pinning::allowed_cpus().first().copied();
    let trips: Vec<f64> = (0..HANDOVER_ROUNDS)
        .map(|_| handover::round_trip(cpu, HANDOVER_TRIPS).as_secs_f64())
        .collect();
    let t = Spread::of(&trips);
    println!();
    println!(
        "hand-over round trip between two threads sharing {} (crossbeam channels, the caller looking between yields of its CPU and the worker yielding after each send: how they meet when the workers fill every CPU): {:.2} µs median ({:.2}–{:.2}) over {HANDOVER_ROUNDS} rounds of {HANDOVER_TRIPS}; each batch of these rows pays about one, the bound none. As a share of each row's median build:",
        cpu.map_or("a CPU (not pinned)".to_string(), |c| format!("CPU {c}")),
        t.median * 1e6,
        t.min * 1e6,
        t.max * 1e6,
    );
    let head: Vec<&str> = summary.iter().map(|(f, _)| f.title()).collect();
    println!("| workers | {} |", head.join(" | "));
    println!("|---:|{}", "---:|".repeat(head.len()));
    for k in full {
        let cells: Vec<String> = summary
            .iter()
            .map(|(_, c)| {
                let b = c[k].build_p50;
                format!("{:.0}% of {:.1} µs", 100.0 * t.median / b, b * 1e6)
            })
            .collect();
        println!("| {} | {} |", args.workers[k], cells.join(" | "));
    }
}

/// Output bytes of one epoch of `bound` (every batch of `plan`).
fn epoch_output(bound: &dyn BoundBatch, plan: &EpochPlan, batch: usize) -> usize {
    let mut dst = vec![0u8; bound.max_bytes(batch)];
    (0..plan.len())
        .map(|k| bound.write(plan.batch(k), &mut dst))
        .sum()
}

/// One line on how `path` is mapped in this process right now (Linux; nothing elsewhere): how
/// much of it is resident, and how much of that the kernel maps in 2 MiB pages. Shuffled rows
/// read through 4 KiB pages pay a page walk each, through 2 MiB pages they mostly do not, and
/// the page cache decides which the bench gets (see `--pages`).
fn print_mapping(path: &Path) {
    if let Some(m) = mapped_pages(path).filter(|m| m.resident_kib > 0) {
        println!(
            "mapping of {}: {:.1} MiB resident, {:.0}% of it in 2 MiB pages",
            path.display(),
            m.resident_kib as f64 / 1024.0,
            100.0 * m.huge_share()
        );
    }
}

/// The bench's data file at `path`, read into the page cache as `--pages` asks.
fn prepared(args: &LoaderFormatsBenchArgs, path: PathBuf) -> anyhow::Result<PathBuf> {
    if args.pages == Pages::Huge {
        read_in_huge_pages(&path).with_context(|| format!("reading {}", path.display()))?;
    }
    Ok(path)
}

/// Runs the benchmark.
pub fn run(args: LoaderFormatsBenchArgs) -> anyhow::Result<ExitCode> {
    std::fs::create_dir_all(&args.dir)?;
    println!(
        "loader-formats bench: batch {}, prefetch {}, {}, persistent workers{}, page cache warm ({}), {} timed rounds after a warm-up (median, min, max), {} CPUs",
        args.batch,
        args.prefetch,
        if args.sequential {
            "in order"
        } else {
            "shuffled"
        },
        if args.no_pin {
            " (not pinned)"
        } else {
            ", worker j and the bound's thread j pinned to the same CPU"
        },
        match args.pages {
            Pages::Huge => "files read back in 2 MiB pages where the kernel can",
            Pages::AsCached => "files as cached",
        },
        args.reps,
        std::thread::available_parallelism().map_or(0, usize::from)
    );
    // The batches of a first epoch, for the bytes the batches hold per epoch.
    let plan_of = |len: usize| EpochPlan::new(len, &config(&args, 0), 0);
    let mut summary: Vec<(Format, Vec<Cell>)> = Vec::new();
    for &format in &args.formats {
        let spreads = match format {
            Format::Tokens => {
                let path = prepared(&args, token_file(&args)?)?;
                let tokens = TokenFile::open(&path, Dtype::U16, Some(50257))?;
                let windows = Arc::new(TokenWindows::new(tokens, WindowSpec::tiled(args.seq))?);
                let wbytes = windows.len() * windows.bytes_per_sample();
                let file = windows
                    .tokens()
                    .bytes(0, windows.tokens().len())
                    .unwrap_or(&[]);
                let src = [&file[..wbytes.min(file.len())]];
                let bound = WindowsBound(&windows);
                let times = measure(&args, &windows, &StackWindows, &bound, &src)?;
                let title = format!(
                    "token windows: {} windows of {} u16 tokens",
                    windows.len(),
                    args.seq + 1
                );
                let out = epoch_output(&bound, &plan_of(windows.len()), args.batch);
                print_mapping(&path);
                print(&args, &title, wbytes, out, &times)
            }
            Format::Pad | Format::Pack => {
                let path = prepared(&args, arrow_file(&args)?)?;
                let arrow = Arc::new(ArrowDataset::open_columns(&path, &["input_ids"])?);
                let size = arrow.columns()[0].dtype().size() as usize;
                // The rows lie back to back in each record batch: the reference copies those.
                let regions = arrow.columns()[0].value_bytes();
                let abytes: usize = regions.iter().map(|v| v.len()).sum();
                let longest = (0..arrow.len())
                    .map(|i| arrow.row_bytes(0, i).map_or(0, |r| r.len() / size))
                    .max()
                    .unwrap_or(0);
                let title = format!(
                    "Arrow list<int32>, {} rows of {}..={} ids, {}",
                    arrow.len(),
                    args.row_len[0],
                    args.row_len[1],
                    if format == Format::Pad {
                        "padded to each batch's longest row".to_string()
                    } else {
                        format!("packed into rows of {} ids", args.row_len[1] * 2)
                    }
                );
                let plan = plan_of(arrow.len());
                print_mapping(&path);
                if format == Format::Pad {
                    let pad = PadCollate::new(&arrow, "input_ids", PAD_ID, PadTo::Longest)?;
                    let bound = PadBound {
                        data: &arrow,
                        size,
                        longest,
                    };
                    let times = measure(&args, &arrow, &pad, &bound, &regions)?;
                    let out = epoch_output(&bound, &plan, args.batch);
                    print(&args, &title, abytes, out, &times)
                } else {
                    let length = args.row_len[1] * 2;
                    let pack = PackCollate::new(&arrow, "input_ids", PAD_ID, length)?;
                    let bound = PackBound {
                        data: &arrow,
                        size,
                        length,
                    };
                    let times = measure(&args, &arrow, &pack, &bound, &regions)?;
                    let out = epoch_output(&bound, &plan, args.batch);
                    print(&args, &title, abytes, out, &times)
                }
            }
        };
        summary.push((format, spreads));
    }
    println!();
    println!("trainmem / bound, median (min–max) of the per-round ratios, side by side:");
    let head: Vec<&str> = summary.iter().map(|(f, _)| f.title()).collect();
    println!("| workers | {} |", head.join(" | "));
    println!("|---:|{}", "---:|".repeat(head.len()));
    for (k, w) in args.workers.iter().enumerate() {
        let cells: Vec<String> = summary
            .iter()
            .map(|(_, s)| {
                let r = s[k].ratio;
                format!("{:.2} ({:.2}–{:.2})", r.median, r.min, r.max)
            })
            .collect();
        println!("| {w} | {} |", cells.join(" | "));
    }
    print_handover(&args, &summary);
    let mut met = true;
    for (format, cells) in &summary {
        let medians: Vec<f64> = cells.iter().map(|c| c.ratio.median).collect();
        met &= report_bound_target(format.title(), &args.workers, &medians, cpus());
    }
    // A missed target fails the command, so a script that runs the bench sees it.
    Ok(if met {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_cpu_time_is_read() {
        let start = process_cpu_ns();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut spin = 0u64;
        while process_cpu_ns() <= start && Instant::now() < deadline {
            spin = black_box(spin.wrapping_add(1));
        }
        assert!(
            process_cpu_ns() > start,
            "CPU time grows while this thread spins"
        );
        let times = thread_times().expect("/proc/self/task");
        assert!(times.other_run > 0, "this thread has run");
    }

    #[test]
    fn row_threads_take_the_cpus_in_turn_from_the_one_after_the_callers() {
        let cpus = Cpus(vec![3, 5, 7]);
        let got: Vec<Option<usize>> = (0..5).map(|j| cpus.of(j)).collect();
        assert_eq!(got, [Some(3), Some(5), Some(7), Some(3), Some(5)]);
        assert_eq!(Cpus(Vec::new()).of(0), None, "no list: nothing pinned");
        assert!(Cpus::after_this_thread(Vec::new()).0.is_empty());
        #[cfg(target_os = "linux")]
        {
            // Pinned to its CPU, this thread is the caller: its CPU comes last, the next first.
            let allowed = pinning::allowed_cpus();
            let last = *allowed.last().expect("one CPU at least");
            std::thread::spawn(move || {
                let _pin = Pinned::to(Some(last));
                let order = Cpus::after_this_thread(allowed.clone()).0;
                assert_eq!(order.last(), Some(&last));
                assert_eq!(order.first(), allowed.first());
                let mut sorted = order.clone();
                sorted.sort_unstable();
                assert_eq!(sorted, allowed, "every allowed CPU once");
            })
            .join()
            .expect("the pinned thread");
        }
    }

    #[test]
    fn pinned_copies_run_on_their_cpus_and_leave_the_caller_alone() {
        let allowed = pinning::allowed_cpus();
        if allowed.is_empty() {
            return; // not Linux: nothing is pinned
        }
        let before = pinning::allowed_cpus();
        let cpus = Cpus(allowed.clone());
        let mut seen = vec![usize::MAX; 3];
        cpus.run(&mut seen, |t, cpu| {
            *cpu = current_cpu().expect("Linux says where a thread runs");
            assert_eq!(pinning::allowed_cpus(), vec![allowed[t % allowed.len()]]);
        });
        let want: Vec<usize> = (0..3).map(|t| allowed[t % allowed.len()]).collect();
        assert_eq!(seen, want);
        assert_eq!(
            pinning::allowed_cpus(),
            before,
            "the calling thread is not pinned"
        );
        // Unpinned, one destination runs on the calling thread itself.
        let mut one = [0usize];
        let me = std::thread::current().id();
        Cpus(Vec::new()).run(&mut one, |_, _| assert_eq!(std::thread::current().id(), me));
    }
}
