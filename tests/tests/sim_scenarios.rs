//! Every scenario of the catalogue has a plan in fixtures/plans/ (GPU-scale, PyTorch) whose
//! simulated timeline shows the pattern.
//!
//! Where the catalogue's rules state the pattern in terms that hold for any framework, the
//! test runs the catalogue itself on these plans (`trainmem scenario NAME --plan FILE`), so the
//! pattern is defined once, in trainmem-scenarios. The other six scenarios' rules state burn's
//! own facts (live bytes at burn's first step, burn's momentum aliasing the gradient, burn's
//! checkpoint record, the Flex CPU backend's halves, burn-nn's lazy parameters, trainmem-loader's
//! staging pool), so their PyTorch-plan tests below say what the pattern is on PyTorch.

use trainmem_core::Category;
use trainmem_core::Plan;
use trainmem_core::plan::{CheckpointPolicyKind, OptimizerKind};
use trainmem_core::timeline::{Phase, Timeline};
use trainmem_sim::{SimOptions, SimResult, simulate};

/// The catalogue's scenarios whose rules hold on the GPU-scale PyTorch plans.
const CATALOGUE_ON_FIXTURE_PLANS: [&str; 9] = [
    "epoch-spike",
    "activation-retention",
    "per-batch-plateau",
    "retained-leak",
    "grad-accumulation",
    "empty-cache",
    "logging-growth",
    "memmap-vs-preload",
    "model-parallel",
];

#[test]
fn the_catalogues_rules_hold_on_the_fixture_plans() {
    for name in CATALOGUE_ON_FIXTURE_PLANS {
        let scenario = trainmem_scenarios::find(name).expect("in the catalogue");
        let dir =
            std::env::temp_dir().join(format!("trainmem-fixture-{name}-{}", std::process::id()));
        let report = trainmem_scenarios::execute_on(
            scenario,
            Some(plan(name)),
            trainmem_scenarios::Mode::Simulated,
            trainmem_burn::BackendChoice::Flex,
            dir.clone(),
            false,
        )
        .unwrap_or_else(|e| panic!("{name}: {}", e.chain()));
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            report.all_reproduced(),
            "{name} on fixtures/plans/{name}.toml:\n{}",
            trainmem_scenarios::report::verdict_lines(&report.verdicts)
        );
        assert!(
            report
                .verdicts
                .iter()
                .any(|v| v.kind == trainmem_scenarios::report::VerdictKind::Knob),
            "{name}: the knob ran"
        );
    }
}

fn plan(name: &str) -> Plan {
    let path = format!(
        "{}/../fixtures/plans/{name}.toml",
        env!("CARGO_MANIFEST_DIR")
    );
    Plan::load(&path).unwrap_or_else(|e| panic!("{e}"))
}

fn run(p: &Plan) -> SimResult {
    let r = simulate(p, SimOptions::default()).unwrap();
    assert!(r.summary.oom.is_none(), "{:?}", r.summary.oom);
    r
}

fn dev(t: &Timeline, step: u64, phase: Phase, c: Category) -> u64 {
    t.find(step, phase)
        .unwrap_or_else(|| panic!("no sample at step {step} {phase}"))
        .device
        .categories
        .get(c)
}

#[test]
fn optimizer_jump() {
    let p = plan("optimizer-jump");
    let params = 1024 * 4096 + 4096 + 4096 * 1024 + 1024;
    for (kind, mult) in [
        (OptimizerKind::Adam, 2),
        (OptimizerKind::Momentum, 1),
        (OptimizerKind::Sgd, 0),
    ] {
        let mut q = p.clone();
        q.optimizer.kind = kind;
        let r = run(&q);
        let t = &r.timeline;
        assert_eq!(
            dev(t, 0, Phase::Backward, Category::OptimizerState),
            0,
            "{kind:?}: lazy"
        );
        assert_eq!(
            dev(t, 0, Phase::OptimizerStep, Category::OptimizerState),
            mult * params * 4,
            "{kind:?}"
        );
        for s in 1..4 {
            assert_eq!(
                dev(t, s, Phase::OptimizerStep, Category::OptimizerState),
                mult * params * 4,
                "flat afterwards"
            );
        }
    }
}

#[test]
fn startup() {
    let p = plan("startup");
    let r = run(&p);
    let init = r.timeline.at_phase(Phase::ModelInit).next().unwrap();
    assert!(init.device.categories.get(Category::Parameter) > 0);
    assert_eq!(
        init.device.categories.get(Category::OptimizerState),
        2 * init.device.categories.get(Category::Parameter)
    );
    assert_eq!(
        init.device.categories.get(Category::Activation),
        0,
        "no graph before the first forward"
    );
    assert!(dev(&r.timeline, 0, Phase::Forward, Category::Activation) > 0);
    let mut lazy = p.clone();
    lazy.optimizer.state = trainmem_core::plan::StateAllocation::Lazy;
    let r = run(&lazy);
    let init = r.timeline.at_phase(Phase::ModelInit).next().unwrap();
    assert_eq!(init.device.categories.get(Category::OptimizerState), 0);
}

#[test]
fn empty_cache_fragmentation_oom() {
    let p = plan("empty-cache-oom");
    let r = simulate(&p, SimOptions::default()).unwrap();
    let oom = r.summary.oom.as_ref().expect("the plan runs out of memory");
    assert!(
        oom.when.step >= 1,
        "step 0 fits; the failure comes from a fragmented cache"
    );
    let last = r.timeline.samples.last().unwrap();
    assert_eq!(last.phase, Phase::OutOfMemory);
    let free_total = p.device.capacity.0 - last.device.allocated;
    assert!(
        free_total >= oom.requested,
        "free device memory + cached free blocks would suffice: {free_total} vs {}",
        oom.requested
    );
    assert!(last.device.reserved > last.device.allocated);
    assert!(
        oom.message.contains("reserved by trainmem but unallocated"),
        "{}",
        oom.message
    );
}

#[test]
fn checkpoint_save() {
    let r = run(&plan("checkpoint-save"));
    let t = &r.timeline;
    let model = r.summary.model_state.parameters + r.summary.model_state.optimizer_state;
    let saves: Vec<usize> = t.indices_at(Phase::CheckpointSave);
    assert_eq!(saves.len(), 3);
    for i in saves {
        let spike = t.samples[i].host.anon_rss as i64 - t.samples[i - 1].host.anon_rss as i64;
        assert_eq!(spike as u64, model);
        let other = |j: usize| t.samples[j].host.categories.get(Category::Other);
        assert_eq!(other(i + 1), other(i - 1), "drops back");
    }
}

#[test]
fn mixed_precision() {
    let p = plan("mixed-precision");
    let r = run(&p);
    let mut f = p.clone();
    f.precision.compute = trainmem_core::plan::Dtype::F32;
    let rf = run(&f);
    let par = |r: &SimResult| {
        r.timeline
            .at_phase(Phase::ModelInit)
            .next()
            .unwrap()
            .device
            .categories
            .get(Category::Parameter)
    };
    let act = |r: &SimResult| dev(&r.timeline, 1, Phase::Forward, Category::Activation);
    let pr = par(&rf) as f64 / par(&r) as f64;
    let ar = act(&rf) as f64 / act(&r) as f64;
    assert!((1.95..2.05).contains(&pr), "parameters halve: {pr}");
    // the plan's eager attention is `transformers`' code, which computes its softmax in f32
    // and keeps those probabilities beside their bf16 copy: they do not halve
    assert!((1.2..1.5).contains(&ar), "activations: {ar}");
    // without that, masks, f32 norm statistics and the loss's f32 log-probabilities (vocab
    // 16,000) are what does not halve
    let mut plain = p.clone();
    let trainmem_core::ModelSpec::Transformer(t) = &mut plain.model else {
        panic!("a transformer plan");
    };
    t.softmax_f32 = Some(false);
    let rp = run(&plain);
    let ap = act(&rf) as f64 / act(&rp) as f64;
    assert!((1.5..2.05).contains(&ap), "activations about halve: {ap}");
    // the peak, at the loss's backward, less: `transformers`' loss upcasts the logits
    // (`logits.float()`), so the f32 log-probabilities and the two f32 logits-sized gradients
    // there are the same in both runs (fixtures/pytorch/bf16-*: a model cast to bf16)
    let peak = |r: &SimResult| r.summary.peak_allocated as f64;
    let ratio = peak(&rf) / peak(&rp);
    assert!((1.3..2.0).contains(&ratio), "peak ratio {ratio}");
    // and lower still with the f32 probabilities
    let ratio = peak(&rf) / peak(&r);
    assert!((1.1..1.3).contains(&ratio), "peak ratio {ratio}");
}

#[test]
fn grad_checkpointing() {
    let p = plan("grad-checkpointing");
    let r = run(&p);
    let mut none = p.clone();
    none.checkpointing.policy = CheckpointPolicyKind::None;
    let rn = run(&none);
    let a = dev(&r.timeline, 1, Phase::Forward, Category::Activation);
    let an = dev(&rn.timeline, 1, Phase::Forward, Category::Activation);
    assert!(
        a * 3 < an,
        "checkpointing keeps far fewer activations: {a} vs {an}"
    );
    assert!(r.summary.peak_allocated < rn.summary.peak_allocated);
    assert!(
        r.summary.allocations > rn.summary.allocations,
        "recomputation costs extra work"
    );
    assert_eq!(r.summary.checkpointing, Some((4, 16)));
}

#[test]
fn pinned_staging() {
    let p = plan("pinned-staging");
    let r = run(&p);
    let mut q = p.clone();
    q.loader.pin_memory = false;
    let ru = run(&q);
    let batch = 256u64 * 12 * 1024; // 3 MiB
    let queued = 2 * 2;
    let i = r
        .timeline
        .find(1, Phase::Forward)
        .unwrap()
        .host
        .categories
        .get(Category::Input);
    let iu = ru
        .timeline
        .find(1, Phase::Forward)
        .unwrap()
        .host
        .categories
        .get(Category::Input);
    assert_eq!(
        i - iu,
        queued * batch.next_power_of_two(),
        "each queued batch has a pinned copy rounded to 4 MiB"
    );
}

#[test]
fn every_fixture_plan_parses_and_runs_two_steps() {
    let dir = format!("{}/../fixtures/plans", env!("CARGO_MANIFEST_DIR"));
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("toml") {
            continue;
        }
        let p = Plan::load(&path).unwrap_or_else(|e| panic!("{e}"));
        let opts = SimOptions {
            max_steps: Some(2),
            ..Default::default()
        };
        let r = simulate(&p, opts).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(!r.timeline.samples.is_empty());
        assert!(r.summary.all_freed_at_teardown, "{}", path.display());
        n += 1;
    }
    assert!(n >= 16, "{n} plans");
}
