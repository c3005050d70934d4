//! Setting a runner up: the run's spec, the simulated device memory, the host model and the
//! timeline's description, beside the autograd side and the model state.

use std::collections::BTreeMap;

use trainmem_autograd::{Program, TensorStore};

use super::autograd::Autograd;
use super::clock::Clock;
use super::model_state::ModelState;
use super::retention::Retention;
use super::sampling::Recorder;
use super::{HostSide, RunSpec, Runner};
use crate::SimError;
use crate::engine::SimOptions;
use crate::engine::host::{HostModel, HostMoment};
use crate::engine::memory::SimMemory;
use crate::machine::Machine;
use crate::profile::FrameworkProfile;
use trainmem_core::model::ModelSpec;
use trainmem_core::plan::{DeviceKind, Plan};
use trainmem_core::timeline::{Source, Timeline, TimelineMeta};

impl<'p> Runner<'p> {
    /// A runner for `program`, stage `stage` of `stages` of `plan`, before anything ran.
    pub(super) fn new(
        plan: &'p Plan,
        program: &'p Program,
        stage: u64,
        stages: u64,
        opts: &SimOptions,
    ) -> Result<Runner<'p>, SimError> {
        let spec = RunSpec {
            plan,
            program,
            profile: FrameworkProfile::for_plan(plan),
            stage,
            stages,
            cpu: plan.device.kind == DeviceKind::Cpu,
        };
        let state = ModelState::new(&spec);
        let autograd = Autograd::new(&spec, state.sharding, state.grad_dtype);
        let mem = device_memory(plan, opts)?;
        let host = HostSide {
            model: host_model(&spec, &opts.machine),
            moment: HostMoment::at_start(),
        };
        let timeline = timeline(&spec, &mem);
        Ok(Runner {
            autograd,
            store: TensorStore::new(mem),
            state,
            host,
            clock: Clock::new(plan.seed, stage),
            recorder: Recorder::new(timeline),
            retention: Retention::default(),
            spec,
        })
    }
}

/// The simulated device: PyTorch's caching allocator on a GPU (its tensors counted at
/// cubecl's sizes for burn with `device.alignment` or `device.fusion`), exact counting on a
/// CPU; recording its trace when asked.
fn device_memory(plan: &Plan, opts: &SimOptions) -> Result<SimMemory, SimError> {
    let mut mem = match plan.device.kind {
        DeviceKind::Cuda => {
            let mem = SimMemory::caching(plan.device.capacity.0, &plan.device.allocator).map_err(
                |e| SimError::Config {
                    key: "device.allocator".into(),
                    message: e.to_string(),
                },
            )?;
            // burn's cubecl backends: trainmem-track counts fusion tensors at their dense
            // size, and an unfused buffer at cubecl's size (the runtime's alignment)
            match (plan.device.fusion, plan.device.alignment) {
                (true, _) => mem.with_granularity(1),
                (false, Some(a)) => mem.with_granularity(a.0),
                (false, None) => mem,
            }
        }
        DeviceKind::Cpu => SimMemory::exact(plan.device.capacity.0),
    };
    if let Some(n) = opts.trace_entries {
        mem.enable_trace(n);
    }
    Ok(mem)
}

/// The host model of the run on `machine`: the plan's loader, the framework's kernel
/// scratch, and trainmem-loader's shape where the framework reads through it.
fn host_model(spec: &RunSpec<'_>, machine: &Machine) -> HostModel {
    let (plan, profile) = (spec.plan, spec.profile);
    let sample_bytes = plan.data.sample_bytes.map_or_else(
        || crate::lower::input_bytes_per_sample_for(&plan.model, plan.framework),
        |b| b.0,
    );
    let kernel_scratch = profile.kernel_scratch_bytes(plan, machine);
    let host = HostModel::new(plan, sample_bytes, kernel_scratch);
    if profile.cpu.trainmem_loader && !matches!(plan.model, ModelSpec::Transformer(_)) {
        // vector and image models are read through trainmem-loader, whatever device holds
        // the tensors (token models from a synthetic source without a sampler)
        with_trainmem_loader(host, plan)
    } else {
        host
    }
}

/// `host` reading through trainmem-loader: the epoch's sample order, the pinned staging
/// pool of its two-column batches, its queue shape.
fn with_trainmem_loader(host: HostModel, plan: &Plan) -> HostModel {
    let micro = plan.micro_batch_size();
    let host = host.with_epoch_order(plan.data.samples);
    // trainmem-loader's batches are two columns: f32 features and i64 labels
    // (trainmem-burn `data.rs`), pooled in page-rounded blocks when pinned
    let features = match &plan.model {
        ModelSpec::Mlp(m) => m.input * 4,
        ModelSpec::Cnn(c) => c.image.iter().product::<u64>() * 4,
        ModelSpec::Layers(l) => l.input.iter().product::<u64>() * 4,
        ModelSpec::Transformer(_) => 0,
    };
    let host = host.with_staging_pool(&[features, 8], micro);
    let per_epoch = if plan.loader.drop_last {
        plan.data.samples / micro.max(1)
    } else {
        plan.data.samples.div_ceil(micro.max(1))
    };
    host.with_trainmem_loader(per_epoch)
}

/// The (empty) simulated timeline of the run, with its description and notes.
fn timeline(spec: &RunSpec<'_>, mem: &SimMemory) -> Timeline {
    let plan = spec.plan;
    let mut notes = BTreeMap::new();
    notes.insert("batch_size".into(), plan.training.batch_size.to_string());
    notes.insert(
        "micro_batch_size".into(),
        plan.micro_batch_size().to_string(),
    );
    notes.insert("allocator".into(), plan.device.allocator.clone());
    notes.insert("framework".into(), spec.profile.name.to_string());
    if spec.stages > 1 {
        notes.insert(
            "pipeline_stage".into(),
            format!("{} of {}", spec.stage, spec.stages),
        );
    }
    Timeline::new(
        Source::Simulated,
        TimelineMeta {
            name: plan.name.clone(),
            producer: format!("trainmem-sim {}", env!("CARGO_PKG_VERSION")),
            device: format!(
                "simulated {} ({})",
                match plan.device.kind {
                    DeviceKind::Cuda => "cuda",
                    DeviceKind::Cpu => "cpu",
                },
                mem.describe()
            ),
            device_capacity: Some(plan.device.capacity.0),
            host_capacity: plan.host.capacity.map(|b| b.0),
            notes,
            baseline: None,
        },
    )
}
