//! `cargo xtask bench alloc [--steps N] [--quick] [--reps N]`: one transformer-like training
//! allocation trace replayed, in one run, through trainmem's caching allocator, cubecl's memory
//! manager (cubecl-runtime 0.10.0, burn 0.21's) and a naive first-fit arena, side by side.
//!
//! Every replayer gets the same ops and the same dense slot table; throughput is the median of
//! several repetitions (a fresh allocator each time; construction and final teardown are not
//! timed). Peaks come from the same timed runs: trainmem keeps peak statistics itself, cubecl
//! reports none so its pages are counted by a storage wrapper, and the first-fit arena counts
//! its own.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::bail;

mod cubecl;
mod first_fit;
pub(super) mod workload;

use workload::{Op, Workload, WorkloadConfig};

/// Arguments of `bench alloc`.
#[derive(Debug, clap::Args)]
pub struct AllocBenchArgs {
    /// Training steps in the generated trace.
    #[arg(long, default_value_t = 1000)]
    steps: u32,
    /// A short run (100 steps, 3 repetitions) to check that everything works.
    #[arg(long)]
    quick: bool,
    /// Timed repetitions per allocator (the median is reported).
    #[arg(long, default_value_t = 5)]
    reps: u32,
    /// Also replay through trainmem on a HostDevice (real host memory). Off by default: each new
    /// segment is zero-filled host memory, so that run measures page faults, not the allocator.
    #[arg(long)]
    host: bool,
    /// Simulated device capacity in GiB.
    #[arg(long, default_value_t = 80)]
    capacity_gib: u64,
}

/// A replayer's view of the trace: allocate into a slot, free a slot, report peaks.
trait Replayer {
    /// Allocates `size` bytes into `slot`; false when the allocator ran out of memory.
    fn alloc(&mut self, slot: u32, size: u64) -> bool;
    /// Frees the block of `size` requested bytes in `slot` (present: the trace is balanced).
    fn free(&mut self, slot: u32, size: u64);
    /// (peak allocated, peak reserved) as the allocator accounts them.
    fn peaks(&mut self) -> (u64, u64);
    /// After a run: checks the replayer's own figures against the allocator's report.
    fn check(&mut self) -> Result<(), String> {
        Ok(())
    }
}

/// trainmem's caching allocator over any device.
struct Trainmem<D: trainmem_alloc::DeviceMemory> {
    alloc: trainmem_alloc::CachingAllocator<D>,
    slots: Vec<trainmem_alloc::BlockId>,
}

impl<D: trainmem_alloc::DeviceMemory> Trainmem<D> {
    fn new(device: D, slots: usize) -> Self {
        Self {
            alloc: trainmem_alloc::CachingAllocator::new(device),
            slots: vec![trainmem_alloc::BlockId::NULL; slots],
        }
    }
}

impl<D: trainmem_alloc::DeviceMemory> Replayer for Trainmem<D> {
    #[inline]
    fn alloc(&mut self, slot: u32, size: u64) -> bool {
        match self.alloc.malloc(size, trainmem_alloc::StreamId::DEFAULT) {
            Ok(block) => {
                self.slots[slot as usize] = block.id;
                true
            }
            Err(_) => false,
        }
    }

    #[inline]
    fn free(&mut self, slot: u32, _size: u64) {
        let id = std::mem::replace(
            &mut self.slots[slot as usize],
            trainmem_alloc::BlockId::NULL,
        );
        // The trace is balanced and the ids come from this allocator: an error is a bug.
        if let Err(err) = self.alloc.free(id) {
            panic!("trainmem free failed on a balanced trace: {err}");
        }
    }

    fn peaks(&mut self) -> (u64, u64) {
        (
            self.alloc.max_memory_allocated(),
            self.alloc.max_memory_reserved(),
        )
    }
}

/// cubecl's memory manager over a (tracked) storage.
struct Cubecl<S: cubecl_runtime::storage::ComputeStorage> {
    mm: cubecl_runtime::memory_management::MemoryManagement<cubecl::Tracked<S>>,
    slots: Vec<Option<cubecl::Handle>>,
    /// Live bytes including the padding to the alignment, and their peak.
    allocated: u64,
    peak_allocated: u64,
}

impl<S: cubecl_runtime::storage::ComputeStorage> Cubecl<S> {
    fn new(storage: S, capacity: u64, slots: usize) -> Self {
        Self {
            mm: cubecl::manager(cubecl::Tracked::new(storage), capacity),
            slots: (0..slots).map(|_| None).collect(),
            allocated: 0,
            peak_allocated: 0,
        }
    }
}

impl<S: cubecl_runtime::storage::ComputeStorage> Replayer for Cubecl<S> {
    #[inline]
    fn alloc(&mut self, slot: u32, size: u64) -> bool {
        match self.mm.reserve(size) {
            Ok(handle) => {
                self.slots[slot as usize] = Some(handle);
                self.allocated += size.next_multiple_of(cubecl::ALIGNMENT);
                self.peak_allocated = self.peak_allocated.max(self.allocated);
                true
            }
            Err(_) => false,
        }
    }

    #[inline]
    fn free(&mut self, slot: u32, size: u64) {
        // Freeing is dropping the handle.
        self.slots[slot as usize] = None;
        self.allocated -= size.next_multiple_of(cubecl::ALIGNMENT);
    }

    fn peaks(&mut self) -> (u64, u64) {
        (self.peak_allocated, self.mm.storage().peak())
    }

    fn check(&mut self) -> Result<(), String> {
        let (allocated, reserved) = cubecl::usage_figures(&self.mm.memory_usage());
        let counted = self.mm.storage().bytes();
        if allocated == self.allocated && reserved == counted {
            Ok(())
        } else {
            Err(format!(
                "cubecl reports allocated {allocated} / reserved {reserved}, the bench counted \
                 {} / {counted}",
                self.allocated
            ))
        }
    }
}

/// The first-fit arena.
struct FirstFitReplayer {
    arena: first_fit::FirstFit,
    slots: Vec<first_fit::Range>,
    peak_allocated: u64,
    peak_top: u64,
}

impl FirstFitReplayer {
    fn new(capacity: u64, slots: usize) -> Self {
        Self {
            arena: first_fit::FirstFit::new(capacity),
            slots: vec![first_fit::Range { offset: 0, len: 0 }; slots],
            peak_allocated: 0,
            peak_top: 0,
        }
    }
}

impl Replayer for FirstFitReplayer {
    #[inline]
    fn alloc(&mut self, slot: u32, size: u64) -> bool {
        match self.arena.alloc(size) {
            Some(range) => {
                self.slots[slot as usize] = range;
                self.peak_allocated = self.peak_allocated.max(self.arena.allocated());
                self.peak_top = self.peak_top.max(self.arena.top());
                true
            }
            None => false,
        }
    }

    #[inline]
    fn free(&mut self, slot: u32, _size: u64) {
        self.arena.free(self.slots[slot as usize]);
    }

    fn peaks(&mut self) -> (u64, u64) {
        (self.peak_allocated, self.peak_top)
    }
}

/// What one timed replay measured.
struct Run {
    elapsed: Duration,
    ooms: u64,
    peak_allocated: u64,
    peak_reserved: u64,
}

/// Replays the whole trace once. The cubecl replayer needs the sizes at free time to keep its
/// allocated figure; they are tracked here for every replayer alike (a Vec write per op).
fn replay<R: Replayer>(replayer: &mut R, workload: &Workload, sizes: &mut [u64]) -> Run {
    let mut ooms = 0u64;
    let start = Instant::now();
    for op in &workload.ops {
        match *op {
            Op::Alloc { slot, size } => {
                if replayer.alloc(slot, size) {
                    sizes[slot as usize] = size;
                } else {
                    ooms += 1;
                    sizes[slot as usize] = u64::MAX;
                }
            }
            Op::Free { slot } => {
                let size = sizes[slot as usize];
                if size != u64::MAX {
                    replayer.free(slot, size);
                }
            }
        }
    }
    let elapsed = start.elapsed();
    if let Err(msg) = replayer.check() {
        panic!("figures disagree after the replay: {msg}");
    }
    let (peak_allocated, peak_reserved) = replayer.peaks();
    Run {
        elapsed,
        ooms,
        peak_allocated,
        peak_reserved,
    }
}

/// One row of the table.
struct Row {
    name: &'static str,
    note: &'static str,
    median: Duration,
    ooms: u64,
    peak_allocated: u64,
    peak_reserved: u64,
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort_unstable();
    times[times.len() / 2]
}

/// Times `reps` fresh replays built by `make`; teardown (dropping the allocator and its live
/// blocks) happens outside the timed region.
fn measure<R: Replayer>(
    name: &'static str,
    note: &'static str,
    reps: u32,
    workload: &Workload,
    mut make: impl FnMut() -> R,
) -> Row {
    let mut times = Vec::new();
    let mut last = None;
    let mut sizes = vec![0u64; workload.slots];
    for _ in 0..reps {
        let mut replayer = make();
        let run = replay(&mut replayer, workload, &mut sizes);
        times.push(run.elapsed);
        last = Some(run);
        drop(replayer);
    }
    let run = last.unwrap_or(Run {
        elapsed: Duration::ZERO,
        ooms: 0,
        peak_allocated: 0,
        peak_reserved: 0,
    });
    eprintln!("  {name:<28} done ({reps} reps)");
    Row {
        name,
        note,
        median: median(times),
        ooms: run.ooms,
        peak_allocated: run.peak_allocated,
        peak_reserved: run.peak_reserved,
    }
}

fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// Runs the benchmark.
pub fn run(args: AllocBenchArgs) -> anyhow::Result<ExitCode> {
    let (steps, reps) = if args.quick {
        (100, 3)
    } else {
        (args.steps, args.reps.max(1))
    };
    if steps == 0 {
        bail!("--steps must be at least 1");
    }
    let capacity = args.capacity_gib << 30;
    let config = WorkloadConfig::transformer(steps);
    let t = Instant::now();
    let workload = workload::generate(&config);
    eprintln!(
        "trace: {steps} steps, {} ops ({} allocations, {} of them <= 1 MiB), {} slots, \
         peak live requested {} (generated in {:.2?})",
        workload.ops.len(),
        workload.allocs,
        workload.small_allocs,
        workload.slots,
        gib(workload.peak_requested),
        t.elapsed()
    );
    if cfg!(debug_assertions) {
        eprintln!(
            "note: dev profile: workspace crates (trainmem) build at opt-level 1 and dependencies \
             (cubecl) at opt-level 2, which favours cubecl; for comparable figures run \
             `cargo run --release -p xtask -- bench alloc`"
        );
    }
    eprintln!("replaying, {reps} repetitions each (median reported):");

    let slots = workload.slots;
    let mut rows = vec![measure(
        "trainmem SimulatedDevice",
        "no memory behind segments",
        reps,
        &workload,
        || Trainmem::new(trainmem_alloc::SimulatedDevice::new(capacity), slots),
    )];
    if args.host {
        rows.push(measure(
            "trainmem HostDevice",
            "segments are real, zero-filled host memory (touched at once)",
            reps,
            &workload,
            || Trainmem::new(trainmem_alloc::HostDevice::new(capacity), slots),
        ));
    }
    rows.push(measure(
        "cubecl 0.10 counting storage",
        "pages are counted, not allocated",
        reps,
        &workload,
        || Cubecl::new(cubecl::null_storage(), capacity, slots),
    ));
    rows.push(measure(
        "cubecl 0.10 BytesStorage",
        "pages are real host memory (calloc: zero pages mapped lazily)",
        reps,
        &workload,
        || {
            Cubecl::new(
                cubecl_runtime::storage::BytesStorage::default(),
                capacity,
                slots,
            )
        },
    ));
    rows.push(measure(
        "first-fit arena (naive)",
        "one arena, no caching; reserved = arena top",
        reps,
        &workload,
        || FirstFitReplayer::new(capacity, slots),
    ));

    let ops = workload.ops.len() as f64;
    let cubecl_counting = rows
        .iter()
        .find(|r| r.name.starts_with("cubecl 0.10 counting"))
        .map(|r| r.median.as_secs_f64())
        .unwrap_or(f64::NAN);
    let cubecl_bytes = rows
        .iter()
        .find(|r| r.name.starts_with("cubecl 0.10 Bytes"))
        .map(|r| r.median.as_secs_f64())
        .unwrap_or(f64::NAN);
    println!();
    println!(
        "{:<29} {:>12} {:>10} {:>10} {:>11} {:>11} {:>7} {:>8} {:>5}",
        "allocator",
        "ops/s",
        "vs cubecl",
        "vs cubecl",
        "peak alloc",
        "peak resv",
        "frag",
        "frag/req",
        "OOMs"
    );
    println!(
        "{:<29} {:>12} {:>10} {:>10} {:>11} {:>11} {:>7} {:>8} {:>5}",
        "", "(median)", "counting", "bytes", "", "", "", "", ""
    );
    for r in &rows {
        let secs = r.median.as_secs_f64();
        let frag = 1.0 - r.peak_allocated as f64 / r.peak_reserved.max(1) as f64;
        let frag_req = 1.0 - workload.peak_requested as f64 / r.peak_reserved.max(1) as f64;
        println!(
            "{:<29} {:>12.0} {:>9.2}x {:>9.2}x {:>11} {:>11} {:>7.3} {:>8.3} {:>5}",
            r.name,
            ops / secs,
            cubecl_counting / secs,
            cubecl_bytes / secs,
            gib(r.peak_allocated),
            gib(r.peak_reserved),
            frag,
            frag_req,
            r.ooms
        );
    }
    println!();
    for r in &rows {
        println!("  {:<29} {}", r.name, r.note);
    }
    println!(
        "  frag     = 1 - peak allocated / peak reserved (each allocator's own allocated figure: \
         trainmem and cubecl round to 512 B, first-fit pads to 256 B)"
    );
    println!(
        "  frag/req = 1 - peak live requested bytes ({}) / peak reserved: the same numerator for all",
        gib(workload.peak_requested)
    );

    let trainmem = rows.iter().find(|r| r.name == "trainmem SimulatedDevice");
    let cubecl = rows
        .iter()
        .find(|r| r.name.starts_with("cubecl 0.10 counting"));
    if let (Some(t), Some(c)) = (trainmem, cubecl) {
        let speedup = c.median.as_secs_f64() / t.median.as_secs_f64();
        let t_frag = 1.0 - workload.peak_requested as f64 / t.peak_reserved.max(1) as f64;
        let c_frag = 1.0 - workload.peak_requested as f64 / c.peak_reserved.max(1) as f64;
        let met = speedup >= 3.0 && t_frag <= c_frag;
        println!(
            "\ntarget (trainmem >= 3x cubecl throughput at no more fragmentation, like for like: \
             simulated device vs counting storage): {speedup:.2}x, frag/req {t_frag:.3} vs {c_frag:.3} -> {}",
            if met { "MET" } else { "NOT MET" }
        );
    }
    if rows.iter().any(|r| r.ooms > 0) {
        eprintln!(
            "warning: some allocator ran out of memory; its figures do not cover the whole trace"
        );
    }
    Ok(ExitCode::SUCCESS)
}
