//! Prints the measurements behind the crate's `burn_facts` docs: one small MLP trained on
//! burn 0.21 + Flex under several plans, with live host bytes per category at every phase.
//!
//! `cargo run -p trainmem-burn --example burn_facts [all|sgd|momentum|adam|leak|ckpt|half|balanced|epoch|storage|pin|lazy|trace]`

use trainmem_burn::{MeasuredRun, RunOptions, run_measured_detailed};
use trainmem_core::Category;
use trainmem_core::plan::{
    Activation, CheckpointPolicyKind, DataStorage, Dtype, Loss, MlpSpec, ModelSpec, OptimizerKind,
    Plan,
};
use trainmem_core::timeline::Phase;
use trainmem_probe::CountingAlloc;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc::new();

fn base(kind: OptimizerKind) -> Plan {
    let mut p = Plan::from_toml_str("[model.mlp]\ninput = 256\nhidden = [512]\noutput = 256\n")
        .expect("plan");
    p.training.batch_size = 32;
    p.training.steps_per_epoch = Some(4);
    p.data.samples = 128;
    p.optimizer.kind = kind;
    p
}

fn show(name: &str, r: &MeasuredRun) {
    println!("== {name}: parameter bytes {}", r.parameter_bytes);
    print!("{:<16}{:>4}", "phase", "step");
    for c in Category::ALL {
        let n = c.name();
        print!("{:>13}", &n[..n.len().min(12)]);
    }
    println!("{:>12}{:>12}", "total", "peak");
    for s in &r.samples {
        if s.phase == Phase::BatchLoaded {
            continue;
        }
        print!("{:<16}{:>4}", s.phase.name(), s.step);
        for c in Category::ALL {
            print!("{:>13}", s.host_bytes(c).unwrap_or(0));
        }
        println!(
            "{:>12}{:>12}",
            s.host_total().unwrap_or(0),
            s.host_total_peak.unwrap_or(0)
        );
    }
    let steps: Vec<u64> = r
        .samples
        .iter()
        .filter(|s| s.phase == Phase::OptimizerStep)
        .filter_map(|s| s.host_total())
        .collect();
    if let Some(init) = r
        .samples
        .iter()
        .find(|s| s.phase == Phase::ModelInit)
        .and_then(|s| s.host_total())
    {
        let deltas: Vec<i64> = std::iter::once(steps[0] as i64 - init as i64)
            .chain(steps.windows(2).map(|w| w[1] as i64 - w[0] as i64))
            .collect();
        println!("growth per step (first: since model init): {deltas:?}\n");
    }
}

/// Input bytes (live, and peak since the previous sample), RSS and loader terms at every
/// batch and epoch boundary.
fn show_input(name: &str, r: &MeasuredRun) {
    println!(
        "== {name}: threads spawned {:?}, pinned {:?}, preloaded {}",
        r.loader_threads_spawned, r.staging_pinned, r.preloaded_bytes
    );
    println!(
        "{:<14}{:>3}{:>5}{:>12}{:>12}{:>11}{:>11}{:>11}{:>10}{:>10}",
        "phase",
        "ep",
        "step",
        "input",
        "input_peak",
        "rss_anon",
        "rss_file",
        "scratch",
        "staging",
        "pinned"
    );
    for (i, s) in r.samples.iter().enumerate() {
        if !matches!(
            s.phase,
            Phase::Start
                | Phase::ModelInit
                | Phase::EpochStart
                | Phase::BatchLoaded
                | Phase::EpochEnd
                | Phase::End
        ) {
            continue;
        }
        let l = r.loader_memory.get(i).copied().unwrap_or_default();
        let rss = s.rss.as_ref();
        println!(
            "{:<14}{:>3}{:>5}{:>12}{:>12}{:>11}{:>11}{:>11}{:>10}{:>10}",
            s.phase.name(),
            s.epoch,
            s.step,
            s.host_bytes(Category::Input).unwrap_or(0),
            s.host_peak_bytes(Category::Input).unwrap_or(0),
            rss.map_or(0, |r| r.rss_anon),
            rss.map_or(0, |r| r.rss_file),
            l.scratch,
            l.staging,
            l.staging_pinned,
        );
    }
    println!("loader peak: {:?}\n", r.loader_peak);
}

fn run_with(name: &str, p: &Plan, opts: RunOptions<'_>, input: bool) {
    match run_measured_detailed(p, opts) {
        Ok(r) if input => show_input(name, &r),
        Ok(r) => show(name, &r),
        Err(e) => println!("== {name}: {e}\n"),
    }
}

fn scenario(file: &str) -> Plan {
    let path = format!("{}/../scenarios/plans/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).expect("scenario plan");
    Plan::from_toml_str(&text).expect("plan")
}

fn run(name: &str, p: &Plan) {
    match run_measured_detailed(p, RunOptions::default()) {
        Ok(r) => show(name, &r),
        Err(e) => println!("== {name}: {e}\n"),
    }
}

fn main() {
    let which: Vec<String> = std::env::args().skip(1).collect();
    let want = |k: &str| which.is_empty() || which.iter().any(|w| w == k || w == "all");
    for kind in [
        OptimizerKind::Sgd,
        OptimizerKind::Momentum,
        OptimizerKind::Adam,
    ] {
        if want(kind.name()) {
            run(kind.name(), &base(kind));
        }
    }
    if want("leak") {
        let mut p = base(OptimizerKind::Sgd);
        p.leak.retain_outputs = true;
        p.leak.retain_graph = true;
        run("kept outputs with their graph", &p);
        p.leak.retain_graph = false;
        run("kept outputs, graph backwarded", &p);
        p.leak.retain_graph = true;
        p.leak.clear_every = 2;
        p.training.steps_per_epoch = Some(6);
        p.data.samples = 192;
        run("kept graphs cleared every 2 steps", &p);
    }
    if want("ckpt") {
        let mut p = base(OptimizerKind::Sgd);
        p.training.checkpoint_every = 2;
        run("checkpoint every 2 steps", &p);
    }
    if want("half") {
        let mut p = base(OptimizerKind::Adam);
        p.precision.compute = Dtype::F16;
        p.precision.master_weights = false;
        run("f16, adam", &p);
    }
    if want("epoch") {
        let mut p = scenario("epoch-spike.toml");
        p.data.size_variation = 0.25;
        run_with(
            "epoch spike, workers respawned",
            &p,
            RunOptions::default(),
            true,
        );
        p.loader.persistent_workers = true;
        run_with(
            "epoch spike, persistent workers",
            &p,
            RunOptions::default(),
            true,
        );
        p.data.augmentation_scratch = 0.0;
        p.data.size_variation = 0.0;
        run_with(
            "no augmentation, persistent workers",
            &p,
            RunOptions::default(),
            true,
        );
    }
    if want("storage") {
        let mut p = scenario("memmap-vs-preload.toml");
        run_with("mmap", &p, RunOptions::default(), true);
        p.data.storage = DataStorage::Preload;
        run_with("preload", &p, RunOptions::default(), true);
    }
    if want("pin") {
        let mut p = scenario("pinned-staging.toml");
        run_with("pin_memory = true", &p, RunOptions::default(), true);
        p.loader.pin_memory = false;
        run_with("pin_memory = false", &p, RunOptions::default(), true);
    }
    if want("lazy") {
        let p = scenario("startup.toml");
        run("startup, eager parameters", &p);
        let opts = RunOptions {
            lazy_parameters: true,
            ..RunOptions::default()
        };
        match run_measured_detailed(&p, opts) {
            Ok(r) => {
                println!(
                    "lazy parameters pending at model_init: {}",
                    r.lazy_parameters_at_init
                );
                show("startup, lazy parameters", &r);
            }
            Err(e) => println!("== lazy: {e}"),
        }
    }
    if want("trace") {
        let p = scenario("empty-cache.toml");
        let opts = RunOptions {
            trace_allocations: Some(4096),
            ..RunOptions::default()
        };
        match run_measured_detailed(&p, opts) {
            Ok(r) => {
                let mine = r
                    .allocation_trace
                    .iter()
                    .filter(|e| e.thread == r.training_thread)
                    .count();
                let allocs = r
                    .allocation_trace
                    .iter()
                    .filter(|e| e.kind == trainmem_probe::TraceKind::Alloc)
                    .count();
                let largest = r.allocation_trace.iter().map(|e| e.size).max().unwrap_or(0);
                println!(
                    "== trace (>= 4 KiB): {} events ({allocs} allocations), {mine} on the training thread, {} dropped, largest {largest} bytes",
                    r.allocation_trace.len(),
                    r.allocation_trace_dropped
                );
            }
            Err(e) => println!("== trace: {e}"),
        }
    }
    if want("balanced") {
        let mut p = base(OptimizerKind::Sgd);
        p.model = ModelSpec::Mlp(MlpSpec {
            input: 256,
            hidden: vec![512, 512, 512],
            output: 256,
            activation: Activation::Gelu,
            dropout: 0.0,
            bias: true,
            loss: Loss::Mse,
        });
        run("gelu mlp, no checkpointing", &p);
        p.checkpointing.policy = CheckpointPolicyKind::Sqrt;
        run("gelu mlp, balanced checkpointing", &p);
    }
}
