//! trainmem-burn's training loop on Meta against the same loop measured on Flex, for a
//! scenario plan: tensor bytes per category at every phase boundary.

use trainmem_burn::{RunOptions, run_measured_detailed};
use trainmem_core::Category;
use trainmem_core::plan::Plan;
use trainmem_meta::{MetaDevice, run_plan};
use trainmem_probe::CountingAlloc;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc::new();

const PLAN: &str = include_str!("../../scenarios/plans/optimizer-jump.toml");

#[test]
fn the_measured_loop_on_meta_matches_flex_per_category_at_every_phase() {
    let mut plan = Plan::from_toml_str(PLAN).expect("plan");
    plan.training.steps_per_epoch = Some(3);
    let flex = run_measured_detailed(&plan, RunOptions::default()).expect("flex run");
    let meta = run_plan(&plan, RunOptions::default(), MetaDevice::new()).expect("meta run");
    assert_eq!(flex.timeline.samples.len(), meta.timeline.samples.len());
    let mut failures = Vec::new();
    for (f, m) in flex.timeline.samples.iter().zip(&meta.timeline.samples) {
        assert_eq!((f.phase, f.step), (m.phase, m.step));
        for c in [
            Category::Parameter,
            Category::Gradient,
            Category::OptimizerState,
            Category::Activation,
        ] {
            // Flex: tensors are host memory. Meta: tensors are device bytes, the rest
            // (loader buffers, bookkeeping) host memory.
            let flex_bytes = f.host.categories.get(c);
            let meta_bytes = m.device.categories.get(c) + m.host.categories.get(c);
            let tolerance = flex_bytes / 100 + 16 * 1024;
            eprintln!(
                "{:>15} step {} {c:?}: flex {flex_bytes} meta {meta_bytes}",
                f.phase.name(),
                f.step
            );
            if flex_bytes.abs_diff(meta_bytes) > tolerance {
                failures.push(format!(
                    "{} step {} {c:?}: flex {flex_bytes}, meta {meta_bytes}",
                    f.phase.name(),
                    f.step
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
