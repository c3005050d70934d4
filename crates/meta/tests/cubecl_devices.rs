//! cubecl's pools predicted for the device at hand: the same plan on the two GPUs lent so far
//! gives the reserved bytes burn really held on each (RESULTS.md, "The devices: memory, CUDA
//! context, cubecl's pools": the H100 of 2026-11-24 and the H200 of 2026-11-26). cubecl-cuda
//! sizes its pools from the device's total memory (`cuDeviceTotalMem`: the largest page is a
//! quarter of it), which is all it reads of the device for them. cubecl-wgpu sizes them from the
//! adapter's limits instead, held on the lavapipe adapter of 2026-11-29.

use trainmem_burn::{RunOptions, run_predicted};
use trainmem_core::plan::{DeviceKind, EmptyCachePolicy, Plan};
use trainmem_core::timeline::Phase;
use trainmem_meta::cubecl::{H100_80GB_BYTES, H200_BYTES};
use trainmem_meta::{CubeclConfig, Meta, MetaDevice, PRODUCER};

/// Reserved and in-use bytes after the first epoch of empty-cache's GPU plan on a device of
/// `bytes`.
fn after_first_epoch(bytes: u64) -> (u64, u64) {
    after_first_epoch_on(CubeclConfig::cuda(bytes))
}

/// The same on cubecl's memory management set up as `config`.
fn after_first_epoch_on(config: CubeclConfig) -> (u64, u64) {
    let mut plan = Plan::from_toml_str(include_str!("../../scenarios/plans/empty-cache.toml"))
        .expect("the scenario's plan parses");
    plan.device.kind = DeviceKind::Cuda;
    plan.training.empty_cache = EmptyCachePolicy::EveryEpoch;
    let (device, _pools) = MetaDevice::cubecl_with(config);
    let run = run_predicted::<Meta>(&plan, RunOptions::default(), device, PRODUCER)
        .expect("the plan trains on Meta");
    let s = run
        .timeline
        .samples
        .iter()
        .find(|s| s.phase == Phase::EpochEnd && s.epoch == 0)
        .expect("a first epoch end");
    (s.device.reserved, s.device.allocated)
}

/// MiB to two decimals, as the lent runs printed them.
fn mib(bytes: u64) -> String {
    format!("{:.2}", bytes as f64 / (1u64 << 20) as f64)
}

#[test]
fn the_h100_and_the_h200_get_the_reserved_bytes_burn_held_on_each() {
    let (h100_reserved, h100_in_use) = after_first_epoch(H100_80GB_BYTES);
    let (h200_reserved, h200_in_use) = after_first_epoch(H200_BYTES);
    eprintln!(
        "H100: {} MiB reserved for {} in use; H200: {} MiB for {}",
        mib(h100_reserved),
        mib(h100_in_use),
        mib(h200_reserved),
        mib(h200_in_use)
    );
    assert_eq!(
        (mib(h100_reserved), mib(h100_in_use)),
        ("543.76".into(), "64.04".into())
    );
    assert_eq!(
        (mib(h200_reserved), mib(h200_in_use)),
        ("329.03".into(), "64.04".into())
    );
    // The H200's total was printed to the hundredth of a GiB: across that rounding the
    // prediction moves by less than 0.02 MiB (cubecl's page sizes follow the total).
    for bytes in [H200_BYTES - (5 << 20), H200_BYTES + (5 << 20)] {
        let reserved = after_first_epoch(bytes).0;
        assert!(
            reserved.abs_diff(h200_reserved) < 20 << 10,
            "{bytes} B: {reserved} B"
        );
    }
}

/// burn on wgpu over Mesa's lavapipe (`fixtures/gpu-check/llvmpipe-llvm-15-0-6-256-bits/`):
/// cubecl-wgpu takes its largest page from the adapter's largest storage-buffer binding
/// (134,217,728 B there) and its alignment from the uniform offset alignment (32 B); burn held
/// 167,845,888 B reserved after the first epoch, 64.04 MiB in use.
#[test]
fn lavapipe_gets_the_reserved_bytes_burn_held_there() {
    let (reserved, in_use) = after_first_epoch_on(CubeclConfig::wgpu(134_217_728, 32));
    assert_eq!(reserved, 167_845_888);
    assert_eq!(mib(in_use), "64.04");
}
