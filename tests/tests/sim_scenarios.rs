//! Every scenario of the catalogue has a plan in fixtures/plans/ whose simulated timeline
//! shows the pattern; each test asserts it.

use trainmem_probe::Category;
use trainmem_sim::plan::{CheckpointPolicyKind, DataStorage, MetricRetention, OptimizerKind};
use trainmem_sim::timeline::{Phase, Timeline};
use trainmem_sim::{Plan, SimOptions, SimResult, simulate};

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

/// Anonymous host RSS at each epoch's first and last batch.
fn host_first_last(t: &Timeline, epoch: u64) -> (u64, u64) {
    let v: Vec<u64> = t
        .samples
        .iter()
        .filter(|s| s.epoch == epoch && s.phase == Phase::BatchLoaded)
        .map(|s| s.host.anon_rss)
        .collect();
    (v[0], *v.last().unwrap())
}

#[test]
fn epoch_spike() {
    let p = plan("epoch-spike");
    let r = run(&p);
    for e in 0..3 {
        let (first, last) = host_first_last(&r.timeline, e);
        assert!(first > last + (40 << 20), "epoch {e}: {first} vs {last}");
    }
    // between epochs the respawned workers are gone
    let end0 = r.timeline.at_phase(Phase::EpochEnd).next().unwrap();
    assert!(end0.host.anon_rss < host_first_last(&r.timeline, 0).1);
    let mut q = p.clone();
    q.loader.persistent_workers = true;
    let r = run(&q);
    let (f0, l0) = host_first_last(&r.timeline, 0);
    assert!(f0 > l0, "the first epoch still starts all workers");
    for e in 1..3 {
        let (first, last) = host_first_last(&r.timeline, e);
        assert_eq!(first, last, "persistent workers flatten epoch {e}");
    }
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
    lazy.optimizer.state = trainmem_sim::plan::StateAllocation::Lazy;
    let r = run(&lazy);
    let init = r.timeline.at_phase(Phase::ModelInit).next().unwrap();
    assert_eq!(init.device.categories.get(Category::OptimizerState), 0);
}

#[test]
fn activation_retention() {
    let r = run(&plan("activation-retention"));
    let t = &r.timeline;
    for s in 0..3 {
        let fwd = dev(t, s, Phase::Forward, Category::Activation);
        let bwd = dev(t, s, Phase::Backward, Category::Activation);
        assert!(fwd > 100 << 20, "forward holds activations: {fwd}");
        assert!(bwd <= 512, "backward freed them: {bwd}");
        assert_eq!(dev(t, s, Phase::BatchLoaded, Category::Activation), 0);
    }
}

#[test]
fn per_batch_plateau() {
    let r = run(&plan("per-batch-plateau"));
    let t = &r.timeline;
    let ends: Vec<u64> = t
        .at_phase(Phase::ZeroGrad)
        .map(|s| s.device.allocated)
        .collect();
    assert!(ends.len() >= 8);
    assert!(ends[1..].iter().all(|&x| x == ends[1]), "{ends:?}");
    let reserved: Vec<u64> = t
        .at_phase(Phase::ZeroGrad)
        .map(|s| s.device.reserved)
        .collect();
    assert!(
        reserved[2..].iter().all(|&x| x == reserved[2]),
        "the cache stops growing: {reserved:?}"
    );
    assert!(r.summary.all_freed_at_teardown);
}

#[test]
fn retained_leak() {
    let p = plan("retained-leak");
    let r = run(&p);
    let ends: Vec<u64> = r
        .timeline
        .at_phase(Phase::ZeroGrad)
        .map(|s| s.device.allocated)
        .collect();
    let deltas: Vec<i64> = ends.windows(2).map(|w| w[1] as i64 - w[0] as i64).collect();
    // linear growth: the same increment every step, about one step's activations
    assert!(
        deltas.iter().all(|&d| d == deltas[0] && d > (1 << 20)),
        "{deltas:?}"
    );
    assert!(r.summary.retained_at_end > 10 * (1 << 20));
    let mut q = p.clone();
    q.leak.clear_every = 4;
    let r2 = run(&q);
    let ends2: Vec<u64> = r2
        .timeline
        .at_phase(Phase::ZeroGrad)
        .map(|s| s.device.allocated)
        .collect();
    assert!(ends2.iter().max() < ends.iter().max());
    assert_eq!(ends2[3], ends2[7], "clearing stops the growth (sawtooth)");
    let mut fixed = p.clone();
    fixed.leak = Default::default();
    let r3 = run(&fixed);
    assert_eq!(r3.summary.retained_at_end, 0);
}

#[test]
fn grad_accumulation() {
    let p = plan("grad-accumulation");
    let r = run(&p);
    let mut full = p.clone();
    full.training.micro_batch_size = None;
    let rf = run(&full);
    let act = |r: &SimResult| {
        r.timeline
            .at_phase(Phase::Forward)
            .map(|s| s.device.categories.get(Category::Activation))
            .max()
            .unwrap()
    };
    let (a_micro, a_full) = (act(&r), act(&rf));
    let ratio = a_full as f64 / a_micro as f64;
    assert!(
        (3.8..4.2).contains(&ratio),
        "activations scale with the micro-batch: {ratio}"
    );
    assert!(r.summary.peak_allocated < rf.summary.peak_allocated);
    // four micro-batches per step, one optimizer step
    assert_eq!(
        r.timeline
            .samples
            .iter()
            .filter(|s| s.step == 1 && s.phase == Phase::Forward)
            .count(),
        4
    );
}

#[test]
fn empty_cache() {
    let p = plan("empty-cache");
    let r = run(&p);
    let t = &r.timeline;
    let end = t.at_phase(Phase::EpochEnd).next().unwrap();
    assert!(
        end.device.reserved > 2 * end.device.allocated,
        "reserved ≫ allocated after an epoch: {} vs {}",
        end.device.reserved,
        end.device.allocated
    );
    let i = t
        .samples
        .iter()
        .position(|s| s.phase == Phase::EmptyCache)
        .unwrap();
    let (before, after) = (&t.samples[i - 1], &t.samples[i]);
    assert_eq!(after.device.allocated, before.device.allocated);
    assert!(after.device.reserved < before.device.reserved);
    assert!(
        after.device.reserved > after.device.allocated,
        "only entirely free segments are returned"
    );
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
fn logging_growth() {
    let p = plan("logging-growth");
    let grow = |r: &SimResult| {
        let v: Vec<u64> = r
            .timeline
            .at_phase(Phase::Metrics)
            .map(|s| s.device.allocated)
            .collect();
        v.last().unwrap() - v[1]
    };
    let r = run(&p);
    // outputs 256 × 1000 f32 + the loss per step
    assert!(grow(&r) >= 14 * 256 * 1000 * 4, "{}", grow(&r));
    let mut q = p.clone();
    q.metrics.retention = MetricRetention::Scalars;
    q.metrics.keep_outputs = false;
    let r2 = run(&q);
    assert_eq!(grow(&r2), 0);
    let hs: Vec<u64> = r2
        .timeline
        .at_phase(Phase::Metrics)
        .map(|s| s.host.anon_rss)
        .collect();
    assert!(
        hs.last().unwrap() - hs[0] < 1024,
        "scalars cost a few bytes"
    );
}

#[test]
fn mixed_precision() {
    let p = plan("mixed-precision");
    let r = run(&p);
    let mut f = p.clone();
    f.precision.compute = trainmem_sim::plan::Dtype::F32;
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
    // masks, f32 norm statistics and the loss's f32 log-probabilities (vocab 16,000) do not halve
    assert!((1.5..2.05).contains(&ar), "activations about halve: {ar}");
    let peak = |r: &SimResult| r.summary.peak_allocated as f64;
    assert!(peak(&rf) / peak(&r) > 1.5);
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
fn memmap_vs_preload() {
    let p = plan("memmap-vs-preload");
    let data = 2000 * 12 * 1024;
    let r = run(&p);
    let t = &r.timeline;
    let files: Vec<u64> = t
        .at_phase(Phase::BatchLoaded)
        .map(|s| s.host.file_rss)
        .collect();
    assert!(
        files.windows(2).all(|w| w[1] >= w[0]),
        "page cache grows as data is touched"
    );
    assert_eq!(*files.last().unwrap(), data);
    assert!(t.samples.iter().all(|s| s.host.anon_rss < data));
    let mut q = p.clone();
    q.data.storage = DataStorage::Preload;
    let r = run(&q);
    let init = r.timeline.at_phase(Phase::ModelInit).next().unwrap();
    assert!(init.host.anon_rss >= data);
    assert!(r.timeline.samples.iter().all(|s| s.host.file_rss == 0));
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
fn model_parallel() {
    let p = plan("model-parallel");
    let r = run(&p);
    assert_eq!(r.stages.len(), 4);
    let mut single = p.clone();
    single.parallel.pipeline_stages = 1;
    let rs = run(&single);
    let total: u64 = rs.summary.parameters;
    for s in &r.stages {
        assert!(
            s.parameters < total / 2,
            "each device holds part of the model"
        );
        assert!(s.peak_allocated < rs.summary.peak_allocated);
    }
    // the first stage keeps the most micro-batches in flight (1F1B)
    let act0 = r.stages[0].peak_breakdown.get(Category::Activation);
    let act2 = r.stages[2].peak_breakdown.get(Category::Activation);
    assert!(act0 > act2, "{act0} vs {act2}");
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
