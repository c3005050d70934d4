//! Measured burn runs: the memory patterns trainmem explains, reproduced on real burn 0.21
//! training (Flex CPU backend) and checked against byte counts from the counting allocator.
//!
//! Every assertion compares byte counts, never time, and every margin is derived from the
//! model's own parameter bytes (or the activation bytes the same run measured), so the tests
//! do not depend on the machine's speed or load.

use std::sync::{Mutex, MutexGuard};

use trainmem_burn::{MeasuredRun, RunOptions, run_measured_detailed};
use trainmem_core::Category;
use trainmem_core::plan::{OptimizerKind, Plan};
use trainmem_core::timeline::Phase;
use trainmem_probe::CountingAlloc;

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
                // Every batch of the epoch was consumed and the epoch closed. Respawned workers
                // were joined: nothing is left in flight. Persistent workers already build the
                // next epoch's first batches, within the same P x W bound.
                let carried = if r.loader_threads_spawned == Some(workers) {
                    (prefetch * workers) as usize * batch
                } else {
                    0
                };
                assert!(
                    input(s) as usize <= baseline as usize + carried + 16 * 1024,
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
    p.precision.compute = trainmem_core::plan::Dtype::F16;
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
    p.model = trainmem_core::plan::ModelSpec::Mlp(trainmem_core::plan::MlpSpec {
        input: 256,
        hidden: vec![512, 512, 512],
        output: 256,
        activation: trainmem_core::plan::Activation::Gelu,
        dropout: 0.0,
        bias: true,
        loss: trainmem_core::plan::Loss::Mse,
    });
    p.validate().expect("valid plan");
    let plain = forward_activations(&run(&p));
    p.checkpointing.policy = trainmem_core::plan::CheckpointPolicyKind::Sqrt;
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

fn run_with(plan: &Plan, opts: RunOptions<'_>) -> MeasuredRun {
    let run = run_measured_detailed(plan, opts).expect("measured run");
    assert!(run.host_counted, "the counting allocator is installed");
    run
}

/// Bytes of one batch's features: `batch × input floats × 4`.
fn feature_batch_bytes(p: &Plan) -> u64 {
    p.micro_batch_size() * 256 * 4
}

#[test]
fn augmentation_scratch_peaks_in_the_first_batches_of_every_respawned_epoch() {
    let _turn = serial();
    let mut p = plan(4);
    p.training.epochs = 2;
    p.data.samples = 32 * 4;
    p.data.augmentation_scratch = 2.0;
    p.data.size_variation = 0.25;
    p.loader.workers = 2;
    p.loader.prefetch_factor = 2;
    p.loader.persistent_workers = false;
    let r = run(&p);
    assert_eq!(
        r.loader_threads_spawned,
        Some(4),
        "2 workers respawned per epoch"
    );
    assert_eq!(r.loader_memory.len(), r.samples.len());
    let batch = feature_batch_bytes(&p);
    // One worker's scratch for one batch is 2 × (1 ± 0.25) × the batch's features (rounded
    // per sample); at most both workers hold one each.
    let peak = r.loader_peak.expect("loader used").scratch as u64;
    assert!(
        peak >= batch * 3 / 2,
        "scratch peak {peak} vs batch {batch}"
    );
    assert!(
        peak <= 2 * (batch * 5 / 2 + 4 * 32 * 4),
        "scratch peak {peak}"
    );
    // (That the scratch differs from batch to batch is checked deterministically by
    // trainmem-loader's own tests.)
    // Input bytes (peak since the previous sample) at each batch of each epoch: the first
    // two batches (workers filling their queues through augmentation scratch) are above the
    // last one (nothing left in flight) by at least one batch of scratch.
    for epoch in 0..2 {
        let per_batch: Vec<u64> = r
            .samples
            .iter()
            .filter(|s| s.epoch == epoch && s.phase == Phase::BatchLoaded)
            .map(|s| s.host_peak_bytes(Category::Input).expect("counted"))
            .collect();
        assert_eq!(per_batch.len(), 4);
        let first = per_batch[0].max(per_batch[1]);
        let last = per_batch[3];
        assert!(
            first >= last + batch,
            "epoch {epoch}: input peaks per batch {per_batch:?}"
        );
    }
}

/// The 256-sample data set read for `steps` steps by two workers, memory-mapped and then
/// preloaded, and its bytes (256 samples of 256 f32 features and one i64 label).
fn mapped_and_preloaded(steps: u64) -> (MeasuredRun, MeasuredRun, u64) {
    let mut p = plan(steps);
    p.data.samples = 256;
    p.loader.workers = 2;
    let mapped = run(&p);
    p.data.storage = trainmem_core::plan::DataStorage::Preload;
    let pre = run(&p);
    (mapped, pre, 256 * (256 * 4 + 8))
}

#[test]
fn preloaded_data_is_input_bytes_from_the_start_and_mmap_is_not() {
    let _turn = serial();
    let (mapped, pre, data) = mapped_and_preloaded(4);
    assert_eq!(pre.preloaded_bytes, data);
    assert_eq!(mapped.preloaded_bytes, 0);
    let input_at_start =
        |r: &MeasuredRun| r.samples[0].host_bytes(Category::Input).expect("counted");
    assert!(input_at_start(&pre) >= data, "{}", input_at_start(&pre));
    assert!(
        input_at_start(&mapped) < data / 4,
        "{}",
        input_at_start(&mapped)
    );
    // It stays resident to the end.
    let end = pre.samples.last().expect("end").host_bytes(Category::Input);
    assert!(end.expect("counted") >= data);
    // Each run records the process as it found it, before building anything: the preloaded
    // data is in the start sample's counted input bytes and not in the baseline's.
    for r in [&mapped, &pre] {
        let base = r.timeline.meta.baseline.expect("baseline recorded");
        assert!(base.anon_rss > 0, "RssAnon read at the run's start");
        assert!(base.categories.get(Category::Input) < data / 4);
    }
    let base = pre.timeline.meta.baseline.expect("baseline");
    let start = pre.timeline.samples[0].host;
    assert!(
        start.categories.get(Category::Input) - base.categories.get(Category::Input) >= data,
        "input over the baseline at start"
    );
}

#[test]
fn the_data_sets_own_mapped_pages_are_measured_and_a_host_backend_hands_nothing_over() {
    let _turn = serial();
    let (mapped, pre, data) = mapped_and_preloaded(8);
    let data_rss = |r: &MeasuredRun| -> Vec<u64> {
        r.timeline
            .samples
            .iter()
            .map(|s| s.host.data_file_rss.expect("the data files are watched"))
            .collect()
    };
    // Mapped: the data set's own pages start (near) empty and reach the bytes read (all 256
    // samples); every page of the two files at most (the .npy headers round each file up).
    let m = data_rss(&mapped);
    let grown = m.iter().max().expect("samples") - m[0];
    assert!(m[0] < data / 4, "resident at start: {}", m[0]);
    assert!(
        grown as f64 >= 0.9 * data as f64,
        "grew {grown} for {data} bytes read"
    );
    assert!(
        grown <= data + 3 * 4096,
        "grew {grown}: more than the files"
    );
    // It is a part of RssFile, never more.
    for s in &mapped.timeline.samples {
        assert!(s.host.data_file_rss <= Some(s.host.file_rss));
    }
    // Preloaded: the pages read while loading are not touched again as the epoch goes.
    let q = data_rss(&pre);
    let spread = q.iter().max().expect("samples") - q.iter().min().expect("samples");
    assert!(
        spread < data / 10,
        "preloaded: mapped pages moved by {spread}"
    );
    // Flex keeps a batch's host buffers as its tensors: nothing is handed to a device.
    for r in [&mapped, &pre] {
        for s in &r.timeline.samples {
            assert!(
                s.host.handed_to_device.is_zero(),
                "{:?}",
                s.host.handed_to_device
            );
        }
    }
}

#[test]
fn a_batch_uploaded_to_a_device_marks_its_host_buffers_handed_over_until_freed() {
    use trainmem_burn::{Batch, ExampleShape};
    let _turn = serial();
    let device = Default::default();
    let shape = ExampleShape::Regression {
        input: 100,
        output: 10,
    };
    let handed = || trainmem_probe::handed_to_device_bytes(Category::Input);
    let before = handed();
    let build = |uploads: bool| {
        let _tag = trainmem_probe::CategoryScope::enter(Category::Input);
        Batch::<burn::backend::Flex>::from_host(
            &shape,
            4,
            vec![0.5; 400],
            vec![0.25; 40],
            &device,
            uploads,
        )
        .expect("a well-formed batch")
    };
    // As if uploaded: Flex keeps the very buffers, so they stay marked while the batch lives.
    let batch = build(true);
    assert_eq!(handed(), before + 4 * (400 + 40));
    drop(batch);
    assert_eq!(handed(), before, "freed: no longer counted apart");
    // A host backend's batch is not marked.
    let batch = build(false);
    assert_eq!(handed(), before);
    drop(batch);
}

#[test]
fn pinned_staging_bytes_are_reported_pinned_or_failed() {
    let _turn = serial();
    let mut p = plan(4);
    p.loader.workers = 2;
    p.loader.prefetch_factor = 2;
    p.loader.pin_memory = true;
    let r = run(&p);
    let peak = r.loader_peak.expect("loader used");
    let batch = feature_batch_bytes(&p);
    // Every batch in flight sits in a staging block (page-rounded).
    assert!(peak.staging as u64 >= 2 * batch, "{peak:?}");
    match r.staging_pinned {
        Some(true) => {
            assert_eq!(peak.pin_failures, 0);
            assert_eq!(peak.staging_pinned, peak.staging, "{peak:?}");
        }
        Some(false) => assert!(peak.pin_failures > 0, "{peak:?}"),
        None => panic!("pin_memory was asked for"),
    }
    assert_eq!(r.loader_memory.len(), r.samples.len());
    p.loader.pin_memory = false;
    let plain = run(&p);
    assert_eq!(plain.staging_pinned, None);
    assert_eq!(plain.loader_peak.expect("loader").staging, 0);
}

#[test]
fn lazy_parameters_appear_at_the_first_forward() {
    let _turn = serial();
    let p = plan(2);
    let eager = run(&p);
    let lazy = run_with(
        &p,
        RunOptions {
            lazy_parameters: true,
            ..RunOptions::default()
        },
    );
    let params = eager.parameter_bytes;
    assert_eq!(lazy.parameter_bytes, params);
    assert_eq!(eager.lazy_parameters_at_init, 0);
    // 2 weights + 2 biases, not created yet.
    assert_eq!(lazy.lazy_parameters_at_init, 4);
    let param_at = |r: &MeasuredRun, phase: Phase| {
        r.samples
            .iter()
            .find(|s| s.phase == phase)
            .and_then(|s| s.host_bytes(Category::Parameter))
            .expect("sample")
    };
    assert!(param_at(&eager, Phase::ModelInit) >= params);
    assert!(param_at(&lazy, Phase::ModelInit) < params / 10);
    // Created inside the first forward, so tagged as that phase's bytes.
    let act = |r: &MeasuredRun| {
        r.samples
            .iter()
            .find(|s| s.phase == Phase::Forward)
            .and_then(|s| s.host_bytes(Category::Activation))
            .expect("forward")
    };
    assert!(act(&lazy) >= act(&eager) + params * 9 / 10);
}

#[test]
fn allocation_trace_records_the_runs_tensor_sizes() {
    let _turn = serial();
    let p = plan(2);
    let r = run_with(
        &p,
        RunOptions {
            trace_allocations: Some(4096),
            ..RunOptions::default()
        },
    );
    use trainmem_probe::TraceKind;
    assert_eq!(r.allocation_trace_dropped, 0);
    assert!(r.allocation_trace.iter().all(|e| e.size >= 4096));
    let allocs: Vec<_> = r
        .allocation_trace
        .iter()
        .filter(|e| e.kind == TraceKind::Alloc)
        .collect();
    // The 256 × 512 weight matrices (524,288 bytes) are among the traced sizes.
    assert!(allocs.iter().any(|e| e.size == 256 * 512 * 4));
    assert!(allocs.iter().any(|e| e.thread == r.training_thread));
    // Every free of a block allocated during the trace comes after its allocation, with the
    // same size.
    let mut live = std::collections::HashMap::new();
    for e in &r.allocation_trace {
        match e.kind {
            TraceKind::Alloc => {
                live.insert(e.addr, e.size);
            }
            TraceKind::Free => {
                if let Some(size) = live.remove(&e.addr) {
                    assert_eq!(size, e.size);
                }
            }
        }
    }
    // Every sample marks where it falls in the trace, in order, within the trace.
    let marks: Vec<usize> = r.samples.iter().filter_map(|s| s.trace_events).collect();
    assert_eq!(
        marks.len(),
        r.samples.len(),
        "every sample has a trace mark"
    );
    assert!(marks.windows(2).all(|w| w[0] <= w[1]), "{marks:?}");
    assert!(marks.last().is_some_and(|&m| m <= r.allocation_trace.len()));
    assert!(
        marks.first() < marks.last(),
        "the run's events fall between samples"
    );
    let untraced = run(&p);
    assert!(untraced.allocation_trace.is_empty());
    assert!(untraced.samples.iter().all(|s| s.trace_events.is_none()));
}

/// The measured burn transformer holds exactly the parameters the simulator lowers for it
/// (`lower_for` with framework `burn`: no final norm, a head with a bias), for encoders and
/// decoders of several shapes: position embeddings, a class count, a feed-forward size and an
/// activation other than the defaults, more than one block.
#[test]
fn transformer_parameters_match_the_simulators_lowering_exactly() {
    let _turn = serial();
    let shapes = [
        (
            "encoder",
            "layers = 1\nhidden = 8\nheads = 2\nseq_len = 5\nvocab = 11\n",
        ),
        (
            "decoder",
            "layers = 1\nhidden = 8\nheads = 2\nseq_len = 5\nvocab = 11\n",
        ),
        (
            "encoder",
            "layers = 2\nhidden = 12\nheads = 3\nseq_len = 6\nvocab = 17\nclasses = 5\n\
             learned_positions = true\nffn = 20\nactivation = \"relu\"\n",
        ),
        (
            "decoder",
            "layers = 3\nhidden = 16\nheads = 4\nseq_len = 7\nvocab = 23\nlearned_positions = true\n",
        ),
    ];
    for (kind, shape) in shapes {
        let mut p = Plan::from_toml_str(&format!(
            "framework = \"burn\"\n[model.transformer]\nkind = \"{kind}\"\n{shape}"
        ))
        .expect("plan");
        p.training.batch_size = 4;
        p.training.steps_per_epoch = Some(1);
        p.data.samples = 4;
        p.validate().expect("valid plan");
        let program = trainmem_sim::lower::lower_for(&p.model, p.framework).expect("lowering");
        let elems: u64 = program.params.iter().map(|q| q.elems).sum();
        let r = run(&p);
        // f32 parameters (the plan's default precision).
        assert_eq!(p.precision.compute.size(), 4);
        assert_eq!(
            r.parameter_bytes,
            elems * 4,
            "{kind} {shape:?}: measured {} parameters, the lowering has {elems}",
            r.parameter_bytes / 4
        );

        // The framework matters: PyTorch's layout adds a final LayerNorm (weight and bias) and
        // drops the language-model head's bias.
        let trainmem_core::model::ModelSpec::Transformer(t) = &p.model else {
            unreachable!("a transformer plan")
        };
        let torch: u64 =
            trainmem_sim::lower::lower_for(&p.model, trainmem_core::plan::Framework::Pytorch)
                .expect("lowering")
                .params
                .iter()
                .map(|q| q.elems)
                .sum();
        let lm_bias = if kind == "decoder" { t.vocab } else { 0 };
        assert_eq!(torch + lm_bias, elems + 2 * t.hidden, "{kind} {shape:?}");
    }
}
