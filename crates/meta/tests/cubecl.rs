//! A training run of a scenario plan on Meta through cubecl's memory management: the pools
//! reserve at least what is in use at every phase boundary, the peak of the buffers' bytes is
//! the exact model's peak, and the bytes in use are those buffers each rounded up to cubecl's
//! 512-byte alignment.

use trainmem_burn::{RunOptions, run_predicted};
use trainmem_core::Category;
use trainmem_core::plan::{DeviceKind, EmptyCachePolicy, Plan};
use trainmem_core::timeline::Phase;
use trainmem_meta::cubecl::CUDA_ALIGNMENT;
use trainmem_meta::{Meta, MetaDevice, PRODUCER};

fn plan() -> Plan {
    let mut plan = Plan::from_toml_str(include_str!("../../scenarios/plans/optimizer-jump.toml"))
        .expect("plan");
    plan.device.kind = DeviceKind::Cuda;
    plan.training.empty_cache = EmptyCachePolicy::EveryEpoch;
    plan
}

#[test]
fn a_training_run_through_cubecls_pools_reserves_at_least_what_is_in_use() {
    let plan = plan();
    let exact_device = MetaDevice::new();
    let exact = run_predicted::<Meta>(&plan, RunOptions::default(), exact_device, PRODUCER)
        .expect("exact run");
    let (device, model) = MetaDevice::cubecl(80 << 30);
    let pooled =
        run_predicted::<Meta>(&plan, RunOptions::default(), device, PRODUCER).expect("cubecl run");
    assert!(model.error().is_none(), "{:?}", model.error());
    assert_eq!(exact.timeline.samples.len(), pooled.timeline.samples.len());

    for (e, p) in exact.timeline.samples.iter().zip(&pooled.timeline.samples) {
        assert_eq!((e.phase, e.step, e.epoch), (p.phase, p.step, p.epoch));
        let point = format!("e{} s{} {}", p.epoch, p.step, p.phase.name());
        // The same tensors, per category, whatever the memory model (`cache` is the model's
        // reserved bytes less those in use).
        let tensors = |c: &trainmem_core::CategoryBytes| {
            let mut c = *c;
            c.set(Category::Cache, 0);
            c
        };
        assert_eq!(
            tensors(&e.device.categories),
            tensors(&p.device.categories),
            "{point}"
        );
        let exact_total: u64 = tensors(&e.device.categories).total();
        let (in_use, reserved) = (p.device.allocated, p.device.reserved);
        assert!(
            reserved >= in_use,
            "{point}: reserved {reserved} < in use {in_use}"
        );
        assert!(
            in_use >= exact_total,
            "{point}: in use {in_use} < exact {exact_total}"
        );
        assert!(p.device.peak_reserved >= p.device.peak_allocated, "{point}");
        if p.phase == Phase::EmptyCache {
            // cubecl's cleanup keeps only pages holding live slices.
            assert!(
                reserved < in_use + (64 << 20),
                "{point}: {reserved} after cleanup"
            );
        }
    }
    let figures = model.figures();
    let exact_peak = exact_device.stats().total_peak;
    // Every buffer went through the pools: the peak of their bytes is the exact model's peak.
    assert_eq!(figures.peak_requested, exact_peak);
    assert_eq!(figures.requested, exact_device.stats().total_live);
    assert!(figures.peak_reserved >= figures.peak_in_use);
    // Peak in use: the exact peak, each live buffer rounded up to 512 B.
    assert!(figures.peak_in_use >= exact_peak);
    let live_at_most = exact_device.stats().allocations;
    assert!(figures.peak_in_use <= exact_peak + live_at_most * (CUDA_ALIGNMENT - 1));
    // The pools hold more than the tensors (pages of 16 MiB and up).
    assert!(figures.peak_reserved > figures.peak_in_use);
}
