//! The scenario library's unit tests: the registry and the comparison domain. Running scenarios (every one simulated, the measured subset on burn's Flex
//! backend) is tested in `tests/scenarios.rs`, a process of its own, because a measured run
//! counts the whole process's allocations.

use super::*;

#[test]
fn registry_names_are_unique_and_findable() {
    let mut names: Vec<&str> = SCENARIOS.iter().map(|s| s.name).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), SCENARIOS.len());
    assert_eq!(SCENARIOS.len(), 15, "the catalogue has fifteen scenarios");
    assert!(!names.contains(&"all"), "`all` is reserved");
    for s in SCENARIOS {
        assert_eq!(find(s.name).map(|f| f.description), Some(s.description));
        assert!(!s.explanation.is_empty(), "{}: explanation", s.name);
        assert!(plans::text(s.name).is_some(), "{}: plan", s.name);
    }
    assert!(find("nope").is_none());
}

/// A measured Flex run keeps every tensor on the host while the twin of the same CPU plan also
/// fills its simulated device: the comparison must read the host, where the measured bytes are.
#[test]
fn a_measured_host_run_is_compared_on_the_host_even_when_the_twin_fills_the_device() {
    use trainmem_core::timeline::{DeviceBytes, Domain, Source};
    let plan = plans::load("epoch-spike").expect("epoch-spike plan");
    assert_eq!(plan.device.kind, trainmem_core::plan::DeviceKind::Cpu);
    let twin = trainmem_sim::simulate(&plan, Default::default())
        .expect("simulates")
        .timeline;
    // The premise: the twin of this CPU plan records device bytes.
    assert_eq!(checks::tensor_domain(&twin), Domain::Device);
    // A measured run as burn's Flex records it: the same host bytes, nothing on a device.
    let mut measured = twin.clone();
    measured.source = Source::Measured;
    for s in &mut measured.samples {
        s.device = DeviceBytes::default();
    }
    let domain = trainmem_core::compare::comparison_domain(&plan, Some(&measured));
    assert_eq!(domain, Domain::Host);
    let rows = trainmem_core::compare::category_errors(&measured, &twin, domain);
    let params = rows
        .iter()
        .find(|r| r.category == trainmem_core::Category::Parameter)
        .expect("a parameter row");
    assert!(params.measured > 0, "measured parameter bytes read as 0");
    assert!(
        rows.iter().all(|r| r.within()),
        "identical host bytes must agree: {rows:?}"
    );
    // Nothing measured: the plan's device decides.
    assert_eq!(
        trainmem_core::compare::comparison_domain(&plan, None),
        Domain::Host
    );
    let mut gpu = plan.clone();
    gpu.device.kind = trainmem_core::plan::DeviceKind::Cuda;
    assert_eq!(
        trainmem_core::compare::comparison_domain(&gpu, None),
        Domain::Device
    );
}

/// A device backend this build lacks is refused in words that say how to build it; Flex is
/// always there.
#[test]
fn a_backend_not_built_in_is_named_with_the_feature_to_build() {
    assert!(crate::ctx::backend_available(BackendChoice::Flex).is_ok());
    #[cfg(not(feature = "wgpu"))]
    {
        let e = crate::ctx::backend_available(BackendChoice::Wgpu).expect_err("not built");
        let text = e.to_string();
        assert!(
            text.contains("--backend wgpu") && text.contains("--features wgpu"),
            "{text}"
        );
    }
    #[cfg(not(feature = "cuda"))]
    {
        let e = crate::ctx::backend_available(BackendChoice::Cuda).expect_err("not built");
        assert!(e.to_string().contains("--features cuda"), "{e}");
    }
}
