//! The scenario runner's unit tests: the registry, exit codes, output directories and the
//! comparison domain. Running scenarios (every one simulated, the measured subset on burn's Flex
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

#[test]
fn exit_codes() {
    assert_eq!(exit_code(false, false, false, false), 0);
    assert_eq!(
        exit_code(false, true, false, false),
        0,
        "a twin miss fails only when strict"
    );
    assert_eq!(exit_code(false, true, true, false), EXIT_TWIN_MISSED);
    assert_eq!(exit_code(true, true, true, false), EXIT_NOT_REPRODUCED);
    assert_eq!(exit_code(true, false, false, false), EXIT_NOT_REPRODUCED);
    assert_eq!(exit_code(false, false, false, true), EXIT_META_DISAGREES);
    assert_eq!(exit_code(false, true, true, true), EXIT_META_DISAGREES);
    assert_eq!(exit_code(true, false, false, true), EXIT_NOT_REPRODUCED);
    let codes = [
        EXIT_NOT_REPRODUCED,
        EXIT_USAGE,
        EXIT_TWIN_MISSED,
        EXIT_META_DISAGREES,
    ];
    assert!(codes.iter().all(|&c| c != 0));
    assert_eq!(
        codes.len(),
        codes
            .iter()
            .collect::<std::collections::BTreeSet<_>>()
            .len()
    );
}

#[test]
fn meta_needs_measured_runs_on_flex() {
    assert_eq!(meta_refused(true, Mode::Both, Backend::Flex), None);
    assert_eq!(meta_refused(true, Mode::Measured, Backend::Flex), None);
    assert_eq!(meta_refused(false, Mode::Simulated, Backend::Cuda), None);
    assert!(meta_refused(true, Mode::Simulated, Backend::Flex).is_some());
    assert!(meta_refused(true, Mode::Both, Backend::Cuda).is_some());
}

#[test]
fn out_dir_rules() {
    let dir = Path::new("/tmp/x");
    let default = Path::new("/tmp/d");
    assert_eq!(
        out_dir(Some(dir), default, "a", false),
        PathBuf::from("/tmp/x")
    );
    assert_eq!(
        out_dir(Some(dir), default, "a", true),
        PathBuf::from("/tmp/x/a")
    );
    assert_eq!(
        out_dir(None, default, "a", false),
        PathBuf::from("/tmp/d/a")
    );
}

/// A measured Flex run keeps every tensor on the host while the twin of the same CPU plan also
/// fills its simulated device: the comparison must read the host, where the measured bytes are.
#[test]
fn a_measured_host_run_is_compared_on_the_host_even_when_the_twin_fills_the_device() {
    use trainmem_sim::timeline::{DeviceBytes, Domain, Source};
    let plan = plans::load("epoch-spike").expect("epoch-spike plan");
    assert_eq!(plan.device.kind, trainmem_sim::plan::DeviceKind::Cpu);
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
    let domain = ctx::domain_of(&plan, Some(&measured));
    assert_eq!(domain, Domain::Host);
    let rows = report::twin_errors(&measured, &twin, domain);
    let params = rows
        .iter()
        .find(|r| r.category == trainmem_probe::Category::Parameter)
        .expect("a parameter row");
    assert!(params.measured > 0, "measured parameter bytes read as 0");
    assert!(
        rows.iter().all(|r| r.within()),
        "identical host bytes must agree: {rows:?}"
    );
    // Nothing measured: the plan's device decides.
    assert_eq!(ctx::domain_of(&plan, None), Domain::Host);
    let mut gpu = plan.clone();
    gpu.device.kind = trainmem_sim::plan::DeviceKind::Cuda;
    assert_eq!(ctx::domain_of(&gpu, None), Domain::Device);
}
