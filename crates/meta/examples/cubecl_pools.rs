//! The empty-cache scenario's GPU plan (an MLP 1024 → 8192 → 1024, batch 256, SGD, 2 epochs of
//! 3 steps, `memory_cleanup` at every epoch end) trained with trainmem-burn's loop on Meta
//! through cubecl's memory management, configured as burn 0.21's CUDA backend configures it on
//! an H100 80GB (85,017,493,504 bytes): bytes in use and reserved at every epoch end and after
//! every cleanup, beside what burn on a real H100 reported for the same plan.
//!
//! `cargo run -p trainmem-meta --example cubecl_pools`

use trainmem_burn::{RunOptions, run_predicted};
use trainmem_core::Category;
use trainmem_core::plan::{DeviceKind, EmptyCachePolicy, Plan};
use trainmem_core::timeline::Phase;
use trainmem_meta::{AllocationHook, CubeclModel, DeviceTotals, Meta, MetaDevice, PRODUCER};

/// The H100's memory as cubecl-cuda read it (RESULTS.md, "The devices: memory, CUDA context,
/// cubecl's pools", the H100 of 2026-11-24).
const H100_BYTES: u64 = 85_017_493_504;

/// burn 0.21 on that H100, after the first epoch of this plan (RESULTS.md, the same section):
/// cubecl's bytes reserved and in use, in MiB as printed there.
const H100_AFTER_EPOCH_0: (f64, f64) = (543.76, 64.04);
/// And after burn's `memory_cleanup`: reserved, in MiB.
const H100_AFTER_CLEANUP: f64 = 64.04;

/// The same pools with burn's persistent section ignored (every buffer in mode `Auto`), to show
/// what the persistent pool changes.
#[derive(Debug)]
struct NoPersistentPool(CubeclModel);

impl AllocationHook for NoPersistentPool {
    fn allocated(&mut self, id: u64, bytes: u64, category: Category) {
        self.0.allocated(id, bytes, category);
    }
    fn freed(&mut self, id: u64, bytes: u64, category: Category) {
        self.0.freed(id, bytes, category);
    }
    fn device_totals(&mut self) -> Option<DeviceTotals> {
        self.0.device_totals()
    }
    fn empty_cache(&mut self) {
        self.0.empty_cache();
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut plan = Plan::from_toml_str(include_str!("../../scenarios/plans/empty-cache.toml"))?;
    plan.device.kind = DeviceKind::Cuda;
    plan.training.empty_cache = EmptyCachePolicy::EveryEpoch;
    let (device, model) = MetaDevice::cubecl(H100_BYTES);
    let run = run_predicted::<Meta>(&plan, RunOptions::default(), device, PRODUCER)?;
    println!(
        "{:<26} {:>12} {:>12}",
        "point", "in use MiB", "reserved MiB"
    );
    for s in &run.timeline.samples {
        if matches!(s.phase, Phase::EpochEnd | Phase::EmptyCache | Phase::End) {
            let point = format!("e{} s{} {}", s.epoch, s.step, s.phase.name());
            println!(
                "{point:<26} {:>12.2} {:>12.2}   ({} B in use, {} B reserved)",
                mib(s.device.allocated),
                mib(s.device.reserved),
                s.device.allocated,
                s.device.reserved
            );
        }
    }
    let figures = model.figures();
    println!(
        "peak reserved {} B ({:.2} MiB), peak in use {} B ({:.2} MiB), {} pages allocated",
        figures.peak_reserved,
        mib(figures.peak_reserved),
        figures.peak_in_use,
        mib(figures.peak_in_use),
        figures.pages_allocated
    );
    let at = |phase: Phase| {
        run.timeline
            .samples
            .iter()
            .find(|s| s.phase == phase && s.epoch == 0)
            .map(|s| (mib(s.device.reserved), mib(s.device.allocated)))
    };
    let err = |model: f64, measured: f64| (model - measured) / measured * 100.0;
    if let (Some((reserved, in_use)), Some((after, _))) =
        (at(Phase::EpochEnd), at(Phase::EmptyCache))
    {
        let (h_reserved, h_in_use) = H100_AFTER_EPOCH_0;
        println!("\nafter the first epoch      cubecl model   burn on the H100   error");
        println!(
            "  reserved MiB             {reserved:>12.2} {h_reserved:>18.2} {:>+7.1}%",
            err(reserved, h_reserved)
        );
        println!(
            "  in use MiB               {in_use:>12.2} {h_in_use:>18.2} {:>+7.1}%",
            err(in_use, h_in_use)
        );
        println!(
            "  reserved after cleanup   {after:>12.2} {H100_AFTER_CLEANUP:>18.2} {:>+7.1}%",
            err(after, H100_AFTER_CLEANUP)
        );
    }
    let auto = CubeclModel::cuda(H100_BYTES);
    let device = MetaDevice::with_hook(Box::new(NoPersistentPool(auto.clone())));
    let run = run_predicted::<Meta>(&plan, RunOptions::default(), device, PRODUCER)?;
    if let Some(s) = run
        .timeline
        .samples
        .iter()
        .find(|s| s.phase == Phase::EpochEnd && s.epoch == 0)
    {
        println!(
            "\nwithout the persistent pool (parameters in mode Auto): after the first epoch \
             {:.2} MiB reserved, {:.2} MiB in use",
            mib(s.device.reserved),
            mib(s.device.allocated)
        );
    }
    if let Some(s) = run
        .timeline
        .samples
        .iter()
        .find(|s| s.phase == Phase::EmptyCache)
    {
        println!("  reserved after cleanup {:.2} MiB", mib(s.device.reserved));
    }
    Ok(())
}
