//! Measured burn runs: the memory patterns trainmem explains, reproduced on real burn 0.21
//! training (Flex CPU backend) and checked against byte counts from the counting allocator.
//!
//! Every assertion compares byte counts, never time, and every margin is derived from the
//! model's own parameter bytes (or the activation bytes the same run measured), so the tests
//! do not depend on the machine's speed or load.

use std::sync::{Mutex, MutexGuard};

use trainmem_burn::{MeasuredRun, RunOptions, run_measured_detailed};
use trainmem_probe::{Category, CountingAlloc};
use trainmem_sim::plan::{OptimizerKind, Plan};
use trainmem_sim::timeline::Phase;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc::new();

/// The allocator's counters are process-wide: the tests of this binary run one at a time, so
/// one test's allocations (building plans, dropping results) never land inside another's
/// measured run.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A small MLP (256 → 512 → 256, 262,912 f32 parameters ≈ 1 MiB), batch 32, SGD, `steps`
/// optimizer steps in one epoch.
fn plan(steps: u64) -> Plan {
    let mut p = Plan::from_toml_str(
        "name = \"burn-measured\"\n[model.mlp]\ninput = 256\nhidden = [512]\noutput = 256\n",
    )
    .expect("test plan parses");
    p.training.batch_size = 32;
    p.training.epochs = 1;
    p.training.steps_per_epoch = Some(steps);
    p.optimizer.kind = OptimizerKind::Sgd;
    // Exactly the samples the run reads (the fixture is generated on first use).
    p.data.samples = 32 * steps;
    p
}

fn run(plan: &Plan) -> MeasuredRun {
    let run = run_measured_detailed(plan, RunOptions::default()).expect("measured run");
    assert!(
        run.host_counted,
        "the counting allocator is installed in this binary"
    );
    run
}

/// Total live host bytes at the end of each optimizer step, in step order.
fn after_steps(run: &MeasuredRun) -> Vec<u64> {
    run.samples
        .iter()
        .filter(|s| s.phase == Phase::OptimizerStep)
        .map(|s| s.host_total().expect("host counted"))
        .collect()
}

fn at(run: &MeasuredRun, phase: Phase) -> u64 {
    run.samples
        .iter()
        .find(|s| s.phase == phase)
        .and_then(|s| s.host_total())
        .expect("phase sampled")
}

fn optimizer_jump(kind: OptimizerKind) -> (MeasuredRun, i64, Vec<i64>) {
    let mut p = plan(5);
    p.optimizer.kind = kind;
    p.validate().expect("valid plan");
    let r = run(&p);
    let base = at(&r, Phase::ModelInit) as i64;
    let steps = after_steps(&r);
    let jump = steps[0] as i64 - base;
    let later: Vec<i64> = steps
        .windows(2)
        .skip(1)
        .map(|w| w[1] as i64 - w[0] as i64)
        .collect();
    (r, jump, later)
}

#[test]
fn optimizer_jump_adam_adds_two_parameter_copies_at_the_first_step_then_stays_flat() {
    let _serial = serial();
    for (kind, copies) in [
        (OptimizerKind::Adam, 2i64),
        (OptimizerKind::AdamW, 2),
        (OptimizerKind::Momentum, 1),
        (OptimizerKind::Sgd, 0),
    ] {
        let (r, jump, later) = optimizer_jump(kind);
        let p = r.parameter_bytes as i64;
        assert_eq!(p, 262_912 * 4);
        // Margin: 2% of the parameter bytes. Measured besides the state tensors: a few KiB of
        // optimizer bookkeeping (per-parameter records) and graph registry entries.
        let margin = p / 50;
        assert!(
            (jump - copies * p).abs() <= margin,
            "{kind:?}: first step added {jump} bytes, expected {copies} x {p} ± {margin}"
        );
        for (i, d) in later.iter().enumerate() {
            assert!(
                d.abs() <= margin,
                "{kind:?}: step {} changed live bytes by {d} (flat expected, ± {margin})",
                i + 2
            );
        }
    }
}

#[test]
fn retained_leak_grows_linearly_with_kept_graphs_and_clearing_stops_it() {
    let _serial = serial();
    let steps = 6;
    let mut leak = plan(steps);
    leak.leak.retain_outputs = true;
    leak.leak.retain_graph = true;
    leak.validate().expect("valid plan");
    let clean = plan(steps);
    let r_leak = run(&leak);
    let r_clean = run(&clean);
    let p = r_leak.parameter_bytes as i64;

    // What one forward keeps alive for backward, measured in the clean run: the activation
    // bytes the first training forward added.
    let sample = |r: &MeasuredRun, phase: Phase| {
        r.samples
            .iter()
            .find(|s| s.phase == phase)
            .and_then(|s| s.host_bytes(Category::Activation))
            .expect("phase sampled, host counted") as i64
    };
    let act = sample(&r_clean, Phase::Forward) - sample(&r_clean, Phase::BatchLoaded);
    assert!(act > 0, "a forward keeps activations alive ({act})");

    let growth = |r: &MeasuredRun| -> Vec<i64> {
        after_steps(r)
            .windows(2)
            .map(|w| w[1] as i64 - w[0] as i64)
            .collect()
    };
    let leak_growth = growth(&r_leak);
    // Each kept output holds its forward's saved tensors (at least one forward's
    // activations) and, because those pin the weights they saw, the old weight values the
    // optimizer could not update in place. The growth is the same at every step: linear.
    let first = leak_growth[0];
    assert!(
        first >= act,
        "leak: a step must keep at least {act} bytes, kept {first}"
    );
    for (i, d) in leak_growth.iter().enumerate() {
        assert!(
            (*d - first).abs() <= first / 50,
            "leak: step {} grew by {d}, step 1 by {first}: growth must be linear",
            i + 2
        );
    }
    for d in growth(&r_clean) {
        assert!(
            d.abs() <= p / 100,
            "no retention: live bytes must stay flat, changed by {d}"
        );
    }

    // Kept outputs whose graph was backwarded hold only their own values.
    let mut outputs = plan(steps);
    outputs.leak.retain_outputs = true;
    outputs.validate().expect("valid plan");
    let logits = 32 * 256 * 4;
    for d in growth(&run(&outputs)) {
        assert!(
            (d - logits).abs() <= logits / 10,
            "kept outputs without graph: grew {d}, one batch of logits is {logits}"
        );
    }

    // Clearing the kept outputs every 2 steps bounds the growth.
    let mut cleared = leak.clone();
    cleared.leak.clear_every = 2;
    let ends = after_steps(&run(&cleared));
    let leaked = after_steps(&r_leak);
    let last = steps as usize - 1;
    assert!(
        ends[last] + 2 * first as u64 <= leaked[last],
        "clearing every 2 steps keeps at most 2 graphs: {ends:?} vs {leaked:?}"
    );
    assert!(
        ends[last] <= ends[1] + first as u64 / 10,
        "bounded: {ends:?}"
    );
}

#[test]
fn loader_epochs_respawn_workers_unless_persistent_and_bound_batches_in_flight() {
    let _serial = serial();
    let steps = 4;
    let epochs = 3;
    let workers = 2;
    let prefetch = 2;
    let mut p = plan(steps);
    p.training.epochs = epochs;
    p.loader.workers = workers;
    p.loader.prefetch_factor = prefetch;
    p.validate().expect("valid plan");
    let respawned = run(&p);
    p.loader.persistent_workers = true;
    p.validate().expect("valid plan");
    let persistent = run(&p);

    // Worker threads: a fresh set every epoch, or one set for the run.
    assert_eq!(respawned.loader_threads_spawned, Some(epochs * workers));
    assert_eq!(persistent.loader_threads_spawned, Some(workers));

    // One loader batch: 32 rows of 256 f32 features and an i64 label, plus its index list.
    let batch = 32 * (256 * 4 + 8) + 32 * 8;
    for (name, r) in [("respawned", &respawned), ("persistent", &persistent)] {
        let input =
            |s: &trainmem_burn::ProbeSample| s.host_bytes(Category::Input).expect("counted");
        let baseline = input(&r.samples[0]);
        // The credit scheme bounds what is in flight: at most prefetch x workers batches
        // queued or being built, plus the batch the step holds (the loader's buffers, the host
        // vectors and the two tensors made from them: 5 batches' worth at most).
        let bound = (prefetch * workers) as usize * batch + 5 * batch + 16 * 1024;
        for s in &r.samples {
            let peak = s.host_peak_bytes(Category::Input).expect("counted") as usize;
            assert!(
                peak <= baseline as usize + bound,
                "{name}: input peaked at {peak} in {:?} (bound {bound})",
                s.phase
            );
            if s.phase == Phase::BatchLoaded {
                // The batch just taken is on the device (inputs and targets as tensors).
                assert!(
                    input(s) >= baseline + 2 * 32 * 256 * 4,
                    "{name}: {}",
                    input(s)
                );
            }
            if s.phase == Phase::EpochEnd {
                // Every batch of the epoch was consumed and the epoch closed: nothing is left
                // in flight, whether the workers were joined or kept.
                assert!(
                    input(s) <= baseline + 16 * 1024,
                    "{name}: {} input bytes left at the end of epoch {}",
                    input(s),
                    s.epoch
                );
            }
        }
    }
}

#[test]
fn checkpoint_save_spikes_by_about_the_model_size() {
    let _serial = serial();
    let mut p = plan(4);
    p.training.checkpoint_every = 2;
    p.validate().expect("valid plan");
    let r = run(&p);
    let params = r.parameter_bytes as i64;
    let saves: Vec<_> = r
        .samples
        .iter()
        .filter(|s| s.phase == Phase::CheckpointSave)
        .collect();
    assert_eq!(saves.len(), 2);
    assert_eq!(r.checkpoints.len(), 2);
    for s in saves {
        // The record item holds a host copy of every parameter while it is written.
        let copy = s.host_bytes(Category::Temporary).expect("counted") as i64;
        assert!(
            (copy - params).abs() <= params / 50,
            "checkpoint copy {copy} bytes, model {params}"
        );
    }
    // And it is gone once the file is written.
    let after = r
        .samples
        .iter()
        .filter(|s| s.phase == Phase::OptimizerStep)
        .map(|s| s.host_bytes(Category::Temporary).expect("counted"))
        .max()
        .expect("steps");
    assert!(after < 4096, "temporary bytes after saving: {after}");
}

/// Activation bytes the first training forward added (after forward minus batch loaded).
fn forward_activations(r: &MeasuredRun) -> i64 {
    let at = |phase: Phase| {
        r.samples
            .iter()
            .find(|s| s.phase == phase)
            .and_then(|s| s.host_bytes(Category::Activation))
            .expect("phase sampled, host counted") as i64
    };
    at(Phase::Forward) - at(Phase::BatchLoaded)
}

#[test]
fn half_precision_halves_parameters_state_and_activations() {
    let _serial = serial();
    let mut p = plan(2);
    p.optimizer.kind = OptimizerKind::Adam;
    p.validate().expect("valid plan");
    let full = run(&p);
    p.precision.compute = trainmem_sim::plan::Dtype::F16;
    p.precision.master_weights = false;
    p.validate().expect("valid plan");
    let half = run(&p);
    assert_eq!(half.parameter_bytes * 2, full.parameter_bytes);
    let state = |r: &MeasuredRun| {
        r.samples
            .iter()
            .rfind(|s| s.phase == Phase::OptimizerStep)
            .and_then(|s| s.host_bytes(Category::OptimizerState))
            .expect("counted") as i64
    };
    let (fs, hs) = (state(&full), state(&half));
    assert!(
        (2 * hs - fs).abs() <= fs / 50,
        "adam state f32 {fs}, f16 {hs}"
    );
    let (fa, ha) = (forward_activations(&full), forward_activations(&half));
    assert!(
        (2 * ha - fa).abs() <= fa / 20,
        "activations f32 {fa}, f16 {ha}"
    );
}

#[test]
fn balanced_checkpointing_keeps_fewer_activations_after_forward() {
    let _serial = serial();
    let mut p = plan(2);
    p.model = trainmem_sim::plan::ModelSpec::Mlp(trainmem_sim::plan::MlpSpec {
        input: 256,
        hidden: vec![512, 512, 512],
        output: 256,
        activation: trainmem_sim::plan::Activation::Gelu,
        dropout: 0.0,
        bias: true,
        loss: trainmem_sim::plan::Loss::Mse,
    });
    p.validate().expect("valid plan");
    let plain = forward_activations(&run(&p));
    p.checkpointing.policy = trainmem_sim::plan::CheckpointPolicyKind::Sqrt;
    p.validate().expect("valid plan");
    let balanced = forward_activations(&run(&p));
    // GELU's inputs are recomputed in backward instead of kept: three hidden layers of
    // 32 x 512 f32 (65,536 bytes each) fewer, the matmul inputs still kept.
    let gelu_inputs = 3 * 32 * 512 * 4;
    assert!(
        (plain - balanced - gelu_inputs).abs() <= gelu_inputs / 10,
        "no checkpointing {plain}, balanced {balanced}"
    );
}
