//! The step loop.

use std::collections::VecDeque;

use trainmem_autograd::checkpoint::{self, CheckpointPolicy};
use trainmem_autograd::{
    Dtype, GradMode, Graph, LayerHooks, OpKind, ParamId, Pass, Program, Tape, TensorId,
    TensorStore, ValueDtype,
};
use trainmem_optim::{OptimizerConfig, OptimizerKind, Sharding, model_state_bytes};
use trainmem_probe::Category;

use super::host::{HostModel, HostMoment};
use super::memory::{SimMemory, SimOom};
use super::{Fragmentation, OomReport, SimOptions, SimResult, Summary, When};
use crate::SimError;
use crate::plan::{CheckpointPolicyKind, DeviceKind, EmptyCachePolicy, MetricRetention, Plan};
use crate::profile::{
    Checkpointing, DroppedGraphs, FrameworkProfile, ParamUpdate, RetainGraph, StateDtype,
};
use crate::timeline::{CategoryBytes, DeviceBytes, Phase, Sample, Source, Timeline, TimelineMeta};

/// ZeRO layer hooks: gather sharded parameters around each layer (stage 3) and
/// reduce-scatter fresh gradients into shards after each layer's backward (stage ≥ 2).
struct ZeroHooks {
    sharding: Sharding,
    layer_params: Vec<Vec<ParamId>>,
    param_full_bytes: Vec<u64>,
    param_shard_bytes: Vec<u64>,
    grad_shard_bytes: Vec<u64>,
    gathered: Vec<TensorId>,
    grad_is_shard: Vec<bool>,
}

impl LayerHooks<SimMemory> for ZeroHooks {
    fn before_layer(
        &mut self,
        store: &mut TensorStore<SimMemory>,
        layer: u32,
        _pass: Pass,
    ) -> Result<(), SimOom> {
        if self.sharding.shards_params() {
            for &p in &self.layer_params[layer as usize] {
                let extra = self.param_full_bytes[p as usize] - self.param_shard_bytes[p as usize];
                let t = store.alloc(extra, Category::Parameter)?;
                self.gathered.push(t);
            }
        }
        Ok(())
    }

    fn after_layer(
        &mut self,
        store: &mut TensorStore<SimMemory>,
        layer: u32,
        pass: Pass,
        grads: &mut [Option<TensorId>],
    ) -> Result<(), SimOom> {
        for t in self.gathered.drain(..) {
            store.release(t);
        }
        if pass == Pass::Backward && self.sharding.shards_grads() {
            for &p in &self.layer_params[layer as usize] {
                let p = p as usize;
                if let Some(full) = grads[p]
                    && !self.grad_is_shard[p]
                {
                    let shard = store.alloc(self.grad_shard_bytes[p], Category::Gradient)?;
                    store.release(full);
                    grads[p] = Some(shard);
                    self.grad_is_shard[p] = true;
                }
            }
        }
        Ok(())
    }
}

struct Runner<'p> {
    plan: &'p Plan,
    program: &'p Program,
    stage: u64,
    stages: u64,
    graph: Graph<'p>,
    store: TensorStore<SimMemory>,
    hooks: ZeroHooks,
    host: HostModel,
    moment: HostMoment,
    timeline: Timeline,
    opt: OptimizerConfig,
    sharding: Sharding,
    grad_dtype: Dtype,
    params: Vec<TensorId>,
    model_state: Vec<TensorId>,
    optimizer_state: Vec<TensorId>,
    state_ready: bool,
    ddp_buckets: Vec<TensorId>,
    kept_tapes: Vec<Tape>,
    metric_tapes: Vec<Tape>,
    hold: Vec<u32>,
    step: u64,
    epoch: u64,
    micro: Option<u32>,
    in_phase: Phase,
    last_peak: u64,
    peak_when: Option<When>,
    peak_breakdown: CategoryBytes,
    rng: u64,
    resolved: Option<(u32, u32)>,
    /// The framework's rules.
    profile: &'static FrameworkProfile,
    /// The tensors live on a CPU device.
    cpu: bool,
    /// Per parameter: a graph kept without backward references it (the weight of a linear
    /// layer whose input requires grad).
    saved_by_graph: Vec<bool>,
    /// Old parameter buffers still referenced by kept graphs, with the layer of the
    /// parameter (the layer whose graph node references them).
    pinned: Vec<(u32, TensorId)>,
    /// Kept graphs dropped by the loop but not yet freed (see [`OrphanedGraphs`]).
    orphans: Vec<OrphanedGraphs>,
    /// The optimizer's bookkeeping, from the first step on.
    optimizer_records: Option<TensorId>,
}

/// Kept graphs the training loop dropped (`leak.clear_every`) that are not freed yet
/// ([`DroppedGraphs::OneLayerPerBackward`]): each later backward pass frees one more layer
/// of them, from the input side.
#[derive(Debug)]
struct OrphanedGraphs {
    /// The dropped graphs (their held outputs already released).
    tapes: Vec<Tape>,
    /// Old parameter buffers they reference, with the parameter's layer.
    pinned: Vec<(u32, TensorId)>,
    /// The next layer a backward pass frees.
    next_layer: u32,
}

impl OrphanedGraphs {
    fn release(self, store: &mut TensorStore<SimMemory>) {
        for t in self.tapes {
            t.release(store);
        }
        for (_, t) in self.pinned {
            store.release(t);
        }
    }
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl<'p> Runner<'p> {
    fn new(
        plan: &'p Plan,
        program: &'p Program,
        stage: u64,
        stages: u64,
        opts: &SimOptions,
    ) -> Result<Runner<'p>, SimError> {
        let profile = FrameworkProfile::of(plan.framework);
        let cpu = plan.device.kind == DeviceKind::Cpu;
        let compute = plan.precision.compute;
        let table = profile.saved_table();
        let mut graph = Graph::new(program, &table, compute);
        let mut saved_by_graph = vec![false; program.params.len()];
        for op in &program.ops {
            if op.kind == OpKind::Linear
                && program.values[op.inputs[0] as usize].requires_grad
                && let Some(&w) = program.params_of(op).first()
            {
                saved_by_graph[w as usize] = true;
            }
        }
        graph.owns_inputs = profile.autograd.forward_owns_batch;
        let micro = plan.micro_batch_size();
        let policy = match plan.checkpointing.policy {
            CheckpointPolicyKind::None => CheckpointPolicy::None,
            CheckpointPolicyKind::Every => {
                CheckpointPolicy::Every(plan.checkpointing.every.unwrap_or(1) as u32)
            }
            CheckpointPolicyKind::Sqrt => CheckpointPolicy::Sqrt,
            CheckpointPolicyKind::Budget => {
                CheckpointPolicy::Budget(plan.checkpointing.budget.map_or(0, |b| b.0))
            }
        };
        let mut resolved = None;
        if policy != CheckpointPolicy::None {
            match profile.autograd.checkpointing {
                Checkpointing::Balanced => {
                    graph.set_op_tables(checkpoint::burn_balanced_tables(program, &table));
                }
                Checkpointing::Segments => {
                    let r = checkpoint::resolve(program, policy, &table, compute, micro);
                    resolved = Some((r.k, r.recomputed));
                    graph.set_segments(r.segments);
                }
            }
        }
        let sharding = Sharding {
            world_size: plan.parallel.world_size,
            zero_stage: plan.parallel.zero_stage,
        };
        let grad_dtype = plan.precision.grads.unwrap_or(compute);
        for (i, p) in program.params.iter().enumerate() {
            graph.param_grad_bytes[i] = p.elems * grad_dtype.size();
        }
        let mut mem = match plan.device.kind {
            DeviceKind::Cuda => SimMemory::caching(plan.device.capacity.0, &plan.device.allocator)
                .map_err(|e| SimError::Config {
                    key: "device.allocator".into(),
                    message: e.to_string(),
                })?,
            DeviceKind::Cpu => SimMemory::exact(plan.device.capacity.0),
        };
        if let Some(n) = opts.trace_entries {
            mem.enable_trace(n);
        }
        let mut layer_params = vec![Vec::new(); program.layers.len()];
        for (i, p) in program.params.iter().enumerate() {
            if let Some(l) = layer_params.get_mut(p.layer as usize) {
                l.push(i as ParamId);
            }
        }
        let hooks = ZeroHooks {
            sharding,
            layer_params,
            param_full_bytes: program
                .params
                .iter()
                .map(|p| p.elems * compute.size())
                .collect(),
            param_shard_bytes: program
                .params
                .iter()
                .map(|p| sharding.param_elems(p.elems) * compute.size())
                .collect(),
            grad_shard_bytes: program
                .params
                .iter()
                .map(|p| sharding.grad_elems(p.elems) * grad_dtype.size())
                .collect(),
            gathered: Vec::new(),
            grad_is_shard: vec![false; program.params.len()],
        };
        let opt = OptimizerConfig {
            kind: plan.optimizer.kind,
            allocation: plan.optimizer.state,
            implementation: plan.optimizer.implementation,
            state_dtype: match profile.optimizer.state_dtype {
                StateDtype::Gradients => grad_dtype,
                StateDtype::Plan => plan.optimizer.state_dtype,
            },
            amsgrad: plan.optimizer.amsgrad,
            param_dtype: compute,
            master_weights: plan.precision.master_weights,
        };
        let sample_bytes = plan.data.sample_bytes.map_or_else(
            || crate::lower::input_bytes_per_sample_for(&plan.model, plan.framework),
            |b| b.0,
        );
        let kernel_scratch = profile.kernel_scratch_bytes(plan, &opts.machine);
        let mut host = HostModel::new(plan, sample_bytes, kernel_scratch);
        if profile.cpu.trainmem_loader
            && cpu
            && !matches!(plan.model, crate::model::ModelSpec::Transformer(_))
        {
            // vector and image models are read through trainmem-loader (token models from a
            // synthetic source without a sampler)
            host = host.with_epoch_order(plan.data.samples);
            // trainmem-loader's batches are two columns: f32 features and i64 labels
            // (trainmem-burn `data.rs`), pooled in page-rounded blocks when pinned
            let features = match &plan.model {
                crate::model::ModelSpec::Mlp(m) => m.input * 4,
                crate::model::ModelSpec::Cnn(c) => c.image.iter().product::<u64>() * 4,
                crate::model::ModelSpec::Layers(l) => l.input.iter().product::<u64>() * 4,
                crate::model::ModelSpec::Transformer(_) => 0,
            };
            host = host.with_staging_pool(&[features, 8], micro);
            let per_epoch = if plan.loader.drop_last {
                plan.data.samples / micro.max(1)
            } else {
                plan.data.samples.div_ceil(micro.max(1))
            };
            host = host.with_trainmem_loader(per_epoch);
        }
        let mut notes = std::collections::BTreeMap::new();
        notes.insert("batch_size".into(), plan.training.batch_size.to_string());
        notes.insert("micro_batch_size".into(), micro.to_string());
        notes.insert("allocator".into(), plan.device.allocator.clone());
        notes.insert("framework".into(), profile.name.to_string());
        if stages > 1 {
            notes.insert("pipeline_stage".into(), format!("{stage} of {stages}"));
        }
        let timeline = Timeline::new(
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
            },
        );
        let hold = program
            .ops
            .last()
            .filter(|_| {
                plan.leak.retain_outputs
                    || plan.metrics.keep_outputs
                    || profile.metrics.loop_holds_outputs
            })
            .map(|op| vec![op.inputs[0]])
            .unwrap_or_default();
        Ok(Runner {
            plan,
            program,
            stage,
            stages,
            graph,
            store: TensorStore::new(mem),
            hooks,
            host,
            moment: HostMoment::at_start(),
            timeline,
            opt,
            sharding,
            grad_dtype,
            params: Vec::new(),
            model_state: Vec::new(),
            optimizer_state: Vec::new(),
            state_ready: false,
            ddp_buckets: Vec::new(),
            kept_tapes: Vec::new(),
            metric_tapes: Vec::new(),
            hold,
            step: 0,
            epoch: 0,
            micro: None,
            in_phase: Phase::Start,
            last_peak: 0,
            peak_when: None,
            peak_breakdown: CategoryBytes::ZERO,
            rng: plan.seed ^ 0x5EED_0000_0000_0000 ^ stage,
            resolved,
            profile,
            cpu,
            saved_by_graph,
            pinned: Vec::new(),
            orphans: Vec::new(),
            optimizer_records: None,
        })
    }

    fn sample(&mut self, phase: Phase) {
        let mem = self.store.memory();
        let allocated = mem.allocated();
        let reserved = mem.reserved();
        let mut cats = CategoryBytes(self.store.live_by_category());
        cats.set(Category::Cache, reserved.saturating_sub(allocated));
        let peak_allocated = self.store.take_window_peak();
        let peak_reserved = self.store.memory_mut().take_reserved_peak().max(reserved);
        let (peak, breakdown) = self.store.peak();
        if peak > self.last_peak {
            self.last_peak = peak;
            self.peak_when = Some(When {
                step: self.step,
                epoch: self.epoch,
                micro_batch: self.micro,
                phase,
            });
            let mut b = CategoryBytes(breakdown);
            b.set(Category::Cache, peak_reserved.saturating_sub(peak));
            self.peak_breakdown = b;
        }
        let device_on_host = (self.plan.device.kind == DeviceKind::Cpu).then_some(&cats);
        let host = self.host.at(&self.moment, device_on_host);
        let time = self.store.allocation_count();
        self.timeline.push(Sample {
            phase,
            step: self.step,
            epoch: self.epoch,
            micro_batch: self.micro,
            time_us: time as f64,
            host,
            device: DeviceBytes {
                categories: cats,
                allocated,
                reserved,
                peak_allocated,
                peak_reserved,
            },
        });
        self.store.memory_mut().set_time(time);
    }

    fn begin(&mut self, phase: Phase) {
        self.in_phase = phase;
    }

    fn init(&mut self) -> Result<(), SimOom> {
        self.sample(Phase::Start);
        self.begin(Phase::ModelInit);
        let compute = self.plan.precision.compute;
        for p in &self.program.params {
            let t = self.store.alloc(
                self.sharding.param_elems(p.elems) * compute.size(),
                Category::Parameter,
            )?;
            self.params.push(t);
            let master = self.opt.master_bytes(self.sharding.state_elems(p.elems));
            if master > 0 {
                let t = self.store.alloc(master, Category::Parameter)?;
                self.model_state.push(t);
            }
        }
        let per_tensor = self.profile.bookkeeping.per_param_tensor;
        if per_tensor > 0 && !self.program.params.is_empty() {
            let b = per_tensor * self.program.params.len() as u64;
            let t = self.store.alloc(b, Category::Parameter)?;
            self.model_state.push(t);
        }
        if self.opt.allocation == trainmem_optim::StateAllocation::Eager {
            self.alloc_state()?;
        }
        self.sample(Phase::ModelInit);
        Ok(())
    }

    fn alloc_state(&mut self) -> Result<(), SimOom> {
        if self.profile.optimizer.momentum_first_velocity_is_gradient
            && self.opt.kind == OptimizerKind::Momentum
            && self.optimizer_state.is_empty()
        {
            // the first velocity is the gradient tensor itself (a reference, tagged
            // `gradient`); the next step replaces it with a new tensor (below).
            for g in self.graph.param_grads.iter().flatten() {
                self.store.retain(*g);
                self.optimizer_state.push(*g);
            }
            return Ok(());
        }
        let aliased: Vec<TensorId> = self.optimizer_state.drain(..).collect();
        for p in &self.program.params {
            for st in self.opt.state_roles() {
                let _ = st;
                let b = self.sharding.state_elems(p.elems) * self.opt.state_dtype.size();
                let t = self.store.alloc(b, Category::OptimizerState)?;
                self.optimizer_state.push(t);
            }
        }
        for t in aliased {
            self.store.release(t);
        }
        self.state_ready = true;
        Ok(())
    }

    /// Parameters the step writes into new buffers ([`ParamUpdate::WhenUniquelyOwned`]):
    /// every parameter under AdamW, and the weights a graph kept without backward
    /// references. The new buffer is allocated inside the step (`optimizer_state`); the old
    /// one is freed, or stays with the kept graphs until they are released.
    fn rewrite_params(&mut self) -> Result<(), SimOom> {
        if self.profile.optimizer.param_update != ParamUpdate::WhenUniquelyOwned {
            return Ok(());
        }
        let adamw = self.opt.kind == OptimizerKind::AdamW;
        let kept_graphs = self.keeps_graphs_without_backward();
        let pinned_now: Vec<bool> = self
            .saved_by_graph
            .iter()
            .map(|&saved| kept_graphs && saved)
            .collect();
        for (i, pinned) in pinned_now.into_iter().enumerate() {
            if !(adamw || pinned) {
                continue;
            }
            let old = self.params[i];
            let new = self
                .store
                .alloc(self.store.size(old), Category::OptimizerState)?;
            self.params[i] = new;
            if pinned {
                self.pinned.push((self.program.params[i].layer, old));
            } else {
                self.store.release(old);
            }
        }
        Ok(())
    }

    fn next_scale(&mut self) -> f64 {
        let v = self.plan.data.size_variation;
        if v == 0.0 {
            return 1.0;
        }
        let u = (splitmix(&mut self.rng) >> 11) as f64 / (1u64 << 53) as f64;
        1.0 + v * (2.0 * u - 1.0)
    }

    fn load_batch(&mut self, scale: f64) -> Result<Vec<TensorId>, SimOom> {
        let micro = self.plan.micro_batch_size();
        let mut out = Vec::with_capacity(self.program.inputs.len());
        for &v in &self.program.inputs {
            let info = self.program.values[v as usize];
            let size = match info.dtype {
                ValueDtype::Compute => self.plan.precision.compute.size(),
                ValueDtype::Fixed(d) => d.size(),
            };
            let cat = if info.requires_grad {
                Category::Activation
            } else {
                Category::Input
            };
            out.push(self.store.alloc(info.elems(micro, scale) * size, cat)?);
        }
        Ok(out)
    }

    fn forward(&mut self, inputs: &[TensorId], scale: f64) -> Result<Tape, SimOom> {
        let micro = self.plan.micro_batch_size();
        self.graph.forward(
            &mut self.store,
            inputs,
            micro,
            scale,
            GradMode::Train,
            &self.hold,
            &mut self.hooks,
        )
    }

    /// The forward of an output kept with its graph ([`RetainGraph::SeparateForward`]: no
    /// loss; the caller's references to `inputs` are taken over).
    fn forward_kept(&mut self, inputs: &[TensorId], scale: f64) -> Result<Tape, SimOom> {
        let micro = self.plan.micro_batch_size();
        self.graph.forward_without_loss(
            &mut self.store,
            inputs,
            micro,
            scale,
            &self.hold,
            &mut self.hooks,
        )
    }

    /// Outputs are kept with a graph of their own that is never backwarded.
    fn keeps_graphs_without_backward(&self) -> bool {
        self.plan.leak.retain_outputs
            && self.plan.leak.retain_graph
            && self.profile.kept_graph_is_separate_forward()
    }

    fn backward(&mut self, tape: &mut Tape) -> Result<(), SimOom> {
        // without retain_graph (a kept graph is a forward of its own) the loss graph is
        // backwarded and freed as usual
        let retain = self.plan.leak.retain_graph
            && self.profile.autograd.retain_graph == RetainGraph::BackwardKeepsSaved;
        match self
            .graph
            .backward(&mut self.store, tape, retain, &mut self.hooks)
        {
            Ok(()) => Ok(()),
            Err(trainmem_autograd::BackwardError::Memory(e)) => Err(e),
            Err(other) => Err(SimOom {
                message: other.to_string(),
                requested: 0,
                category: Category::Other,
            }),
        }
    }

    /// After a backward pass one more layer of every dropped kept graph is freed (see
    /// [`OrphanedGraphs`]).
    fn free_orphaned_layer(&mut self) {
        let layers = self.program.layers.len() as u32;
        let mut left = Vec::with_capacity(self.orphans.len());
        for mut o in std::mem::take(&mut self.orphans) {
            let layer = o.next_layer;
            for (i, op) in self.program.ops.iter().enumerate() {
                if op.layer == layer {
                    for t in &mut o.tapes {
                        t.release_saved_of(&mut self.store, i);
                    }
                }
            }
            let (now, later): (Vec<_>, Vec<_>) = o.pinned.into_iter().partition(|p| p.0 == layer);
            for (_, t) in now {
                self.store.release(t);
            }
            o.pinned = later;
            o.next_layer += 1;
            if o.next_layer >= layers {
                o.release(&mut self.store);
            } else {
                left.push(o);
            }
        }
        self.orphans = left;
    }

    /// Records the metrics the plan keeps (scalars or tensors already kept by the caller)
    /// and samples `metrics`.
    fn record_metrics(&mut self) {
        match self.plan.metrics.retention {
            MetricRetention::None => {}
            MetricRetention::Scalars => {
                self.begin(Phase::Metrics);
                self.moment.scalars += self.plan.metrics.per_step;
                self.sample(Phase::Metrics);
            }
            MetricRetention::Tensors => {
                self.begin(Phase::Metrics);
                self.sample(Phase::Metrics);
            }
        }
    }

    /// One optimizer step's worth of micro-batches, in the stage's 1F1B order.
    fn train_step(&mut self) -> Result<(), SimOom> {
        let m = self.plan.accumulation_steps();
        let in_flight = (self.stages - self.stage).min(m).max(1);
        let mut pending: VecDeque<(Tape, Vec<TensorId>, u32)> = VecDeque::new();
        let mut next_f = 0u64;
        let mut done_b = 0u64;
        let mut samples_per_micro = self.plan.micro_batch_size();
        if self.stages > 1 && self.stage > 0 {
            samples_per_micro = 0; // only the first stage reads data
        }
        while done_b < m {
            if next_f < m && (pending.len() as u64) < in_flight {
                let mi = next_f as u32;
                self.micro = (m > 1).then_some(mi);
                self.begin(Phase::BatchLoaded);
                let scale = self.next_scale();
                self.moment.scale = scale;
                // on a CPU backend the batch tensors may be the loader's host batch (one
                // copy, counted by the store), not a host copy beside a device copy
                self.moment.batch_on_host = !(self.cpu && self.profile.cpu.batch_is_host_batch);
                self.moment.samples_read += samples_per_micro;
                self.moment.batches_loaded += 1;
                self.moment.epoch_batches_taken += 1;
                let inputs = self.load_batch(scale)?;
                self.sample(Phase::BatchLoaded);
                self.moment.batch_on_host = false;
                self.moment.batches_since_start += 1;
                self.begin(Phase::Forward);
                if self.keeps_graphs_without_backward() {
                    // the kept output comes from a forward of its own, never backwarded
                    for &t in &inputs {
                        self.store.retain(t);
                    }
                    let kept = self.forward_kept(&inputs, scale)?;
                    self.kept_tapes.push(kept);
                }
                let tape = self.forward(&inputs, scale)?;
                self.sample(Phase::Forward);
                pending.push_back((tape, inputs, mi));
                next_f += 1;
                continue;
            }
            let (mut tape, inputs, mi) = pending.pop_front().expect("a forward is pending");
            self.micro = (m > 1).then_some(mi);
            self.begin(Phase::Backward);
            self.backward(&mut tape)?;
            if self.profile.autograd.dropped_graphs == DroppedGraphs::OneLayerPerBackward {
                self.free_orphaned_layer();
            }
            if self.ddp_buckets.is_empty()
                && self.plan.parallel.world_size > 1
                && self.plan.parallel.zero_stage == 0
            {
                // DDP's gradient buckets (25 MiB each), allocated at the first backward
                let total: u64 = self
                    .program
                    .params
                    .iter()
                    .map(|p| p.elems * self.grad_dtype.size())
                    .sum();
                let bucket = 25u64 << 20;
                let mut left = total;
                while left > 0 {
                    let b = left.min(bucket);
                    let t = self.store.alloc(b, Category::Gradient)?;
                    self.ddp_buckets.push(t);
                    left -= b;
                }
            }
            if !self.profile.autograd.forward_owns_batch {
                // (otherwise the forward pass took the batch over)
                for t in inputs {
                    self.store.release(t);
                }
            }
            self.sample(Phase::Backward);
            let kept_separately =
                self.profile.kept_graph_is_separate_forward() && self.plan.leak.retain_graph;
            if self.plan.leak.retain_outputs && !kept_separately {
                self.kept_tapes.push(tape);
            } else if self.plan.metrics.retention == MetricRetention::Tensors {
                // the loss is kept per step; the outputs only with `keep_outputs`
                if !self.plan.metrics.keep_outputs {
                    tape.release_held(&mut self.store);
                }
                self.metric_tapes.push(tape);
            } else {
                tape.release(&mut self.store);
            }
            if self.profile.metrics_after_backward() {
                // per micro-batch right after its backward pass, before the optimizer step
                // (the held logits are dropped then)
                self.record_metrics();
            }
            done_b += 1;
        }
        self.micro = None;
        self.begin(Phase::OptimizerStep);
        if !self.state_ready {
            self.alloc_state()?;
        }
        if let Some(records) = self.profile.bookkeeping.optimizer_records
            && self.optimizer_records.is_none()
        {
            // the optimizer's bookkeeping, made at the first step and kept for the
            // optimizer's life
            let b = (records.bytes)(self.opt.kind, self.program.params.len() as u64);
            self.optimizer_records = Some(self.store.alloc(b, Category::OptimizerState)?);
        }
        self.rewrite_params()?;
        let elems: Vec<u64> = self
            .program
            .params
            .iter()
            .map(|p| self.sharding.state_elems(p.elems))
            .collect();
        let temps = self.opt.step_temporaries(&elems);
        let size = temps.dtype.size();
        if temps.all_at_once {
            let mut live = Vec::with_capacity(temps.buffers.len());
            for &e in &temps.buffers {
                live.push(self.store.alloc(e * size, Category::Temporary)?);
            }
            for t in live {
                self.store.release(t);
            }
        } else if temps.per_param > 0 {
            for chunk in temps.buffers.chunks(temps.per_param) {
                let mut live = [None, None, None];
                for (k, &e) in chunk.iter().enumerate().take(3) {
                    live[k] = Some(self.store.alloc(e * size, Category::Temporary)?);
                }
                for t in live.into_iter().flatten() {
                    self.store.release(t);
                }
            }
        }
        let consumes_grads = self.profile.optimizer.step_consumes_grads;
        if consumes_grads {
            // the step consumed the gradients (there is no zero_grad)
            self.graph.drop_param_grads(&mut self.store);
        }
        self.sample(Phase::OptimizerStep);
        if self.plan.training.grads_to_none && !consumes_grads {
            self.begin(Phase::ZeroGrad);
            self.graph.drop_param_grads(&mut self.store);
            for s in self.hooks.grad_is_shard.iter_mut() {
                *s = false;
            }
            self.sample(Phase::ZeroGrad);
        }
        if !self.profile.metrics_after_backward() {
            // once per step, after the optimizer step
            self.record_metrics();
        }
        let ce = self.plan.leak.clear_every;
        if ce > 0 && (self.step + 1).is_multiple_of(ce) {
            if self.profile.autograd.dropped_graphs == DroppedGraphs::OneLayerPerBackward {
                // dropping the outputs frees their buffers now; their graphs go later, one
                // layer per backward pass (see `OrphanedGraphs`)
                let mut tapes: Vec<Tape> = self.kept_tapes.drain(..).collect();
                for t in &mut tapes {
                    t.release_held(&mut self.store);
                }
                let pinned: Vec<(u32, TensorId)> = self.pinned.drain(..).collect();
                if !tapes.is_empty() || !pinned.is_empty() {
                    self.orphans.push(OrphanedGraphs {
                        tapes,
                        pinned,
                        next_layer: 0,
                    });
                }
            } else {
                for t in self.kept_tapes.drain(..) {
                    t.release(&mut self.store);
                }
                for (_, t) in self.pinned.drain(..) {
                    self.store.release(t);
                }
            }
        }
        let every = self.plan.training.checkpoint_every;
        if every > 0 && (self.step + 1).is_multiple_of(every) {
            self.begin(Phase::CheckpointSave);
            let compute = self.plan.precision.compute;
            let ms = model_state_bytes(
                &self.opt,
                self.grad_dtype,
                self.sharding,
                &self
                    .program
                    .params
                    .iter()
                    .map(|p| p.elems)
                    .collect::<Vec<_>>(),
            );
            let _ = compute;
            if self.cpu && self.profile.cpu.checkpoint_record_f32 {
                // a host copy of every parameter in f32 (no optimizer state) while the
                // recorder writes it
                let elems: u64 = self.program.params.iter().map(|p| p.elems).sum();
                let t = self
                    .store
                    .alloc(elems * Dtype::F32.size(), Category::Temporary)?;
                self.sample(Phase::CheckpointSave);
                self.store.release(t);
            } else {
                self.moment.checkpoint_bytes = ms.parameters + ms.optimizer_state;
                self.sample(Phase::CheckpointSave);
                self.moment.checkpoint_bytes = 0;
            }
        }
        if self.plan.training.empty_cache == EmptyCachePolicy::EveryStep {
            self.begin(Phase::EmptyCache);
            self.store.memory_mut().empty_cache();
            self.sample(Phase::EmptyCache);
        }
        Ok(())
    }

    fn run(
        &mut self,
        total_steps: u64,
        progress: &mut Option<&mut dyn FnMut(u64, u64)>,
    ) -> Result<(), SimOom> {
        self.init()?;
        let per_epoch = self.plan.steps_per_epoch();
        let persistent = self.plan.loader.persistent_workers;
        'epochs: for epoch in 0..self.plan.training.epochs {
            self.epoch = epoch;
            self.begin(Phase::EpochStart);
            self.moment.epoch_open = true;
            self.moment.epoch_batches_taken = 0;
            if !(persistent && self.moment.workers_alive) {
                self.moment.workers_alive = true;
                self.moment.batches_since_start = 0;
            }
            self.sample(Phase::EpochStart);
            for _ in 0..per_epoch {
                if self.step >= total_steps {
                    break 'epochs;
                }
                self.train_step()?;
                self.step += 1;
                if let Some(p) = progress.as_mut() {
                    p(self.step, total_steps);
                }
            }
            self.step = self.step.saturating_sub(1);
            self.begin(Phase::EpochEnd);
            self.moment.epoch_open = false;
            if !persistent {
                self.moment.workers_alive = false;
            }
            self.sample(Phase::EpochEnd);
            if self.plan.training.empty_cache == EmptyCachePolicy::EveryEpoch {
                self.begin(Phase::EmptyCache);
                self.store.memory_mut().empty_cache();
                self.sample(Phase::EmptyCache);
            }
            self.step += 1;
        }
        self.step = self.step.saturating_sub(1);
        self.moment.workers_alive = false;
        self.sample(Phase::End);
        Ok(())
    }

    fn teardown(&mut self) -> bool {
        for t in self.kept_tapes.drain(..).chain(self.metric_tapes.drain(..)) {
            t.release(&mut self.store);
        }
        for o in std::mem::take(&mut self.orphans) {
            o.release(&mut self.store);
        }
        for t in self
            .pinned
            .drain(..)
            .map(|(_, t)| t)
            .chain(self.optimizer_records.take())
        {
            self.store.release(t);
        }
        self.graph.drop_param_grads(&mut self.store);
        for t in self
            .params
            .drain(..)
            .chain(self.model_state.drain(..))
            .chain(self.optimizer_state.drain(..))
            .chain(self.ddp_buckets.drain(..))
        {
            self.store.release(t);
        }
        self.store.live_total() == 0 && self.store.memory().allocated() == 0
    }
}

/// Simulates one pipeline stage's program (`stage` of `stages`).
pub fn simulate_stage(
    plan: &Plan,
    program: &Program,
    stage: u64,
    stages: u64,
    opts: &mut SimOptions,
) -> Result<(Timeline, Summary, Option<trainmem_alloc::Snapshot>), SimError> {
    let mut r = Runner::new(plan, program, stage, stages, opts)?;
    let total = opts
        .max_steps
        .map_or(plan.total_steps(), |m| m.min(plan.total_steps()));
    let outcome = r.run(total, &mut opts.progress);
    let oom = match outcome {
        Ok(()) => None,
        Err(e) => {
            let when = When {
                step: r.step,
                epoch: r.epoch,
                micro_batch: r.micro,
                phase: r.in_phase,
            };
            r.sample(Phase::OutOfMemory);
            Some(OomReport {
                message: e.message,
                requested: e.requested,
                category: e.category.name().to_string(),
                when,
            })
        }
    };
    let end = r
        .timeline
        .samples
        .last()
        .map(|s| s.device.allocated)
        .unwrap_or(0);
    let elems: Vec<u64> = program.params.iter().map(|p| p.elems).collect();
    let ms = model_state_bytes(&r.opt, r.grad_dtype, r.sharding, &elems);
    let mem = r.store.memory();
    let (largest, non_rel) = mem.fragmentation();
    let cached = mem.reserved().saturating_sub(mem.allocated());
    let releasable = match mem.snapshot() {
        Some(s) => s
            .segments
            .iter()
            .filter(|seg| seg.is_free())
            .map(|seg| seg.total_size)
            .sum(),
        None => 0,
    };
    let snapshot = if opts.trace_entries.is_some() {
        mem.snapshot()
    } else {
        None
    };
    let fragmentation = Fragmentation {
        cached_unallocated: cached,
        largest_free_block: largest,
        non_releasable: non_rel,
        releasable,
    };
    let steady: u64 = r
        .params
        .iter()
        .chain(&r.model_state)
        .chain(&r.optimizer_state)
        .chain(&r.ddp_buckets)
        .map(|&t| r.store.size(t))
        .sum::<u64>()
        + r.graph
            .param_grads
            .iter()
            .flatten()
            .map(|&t| r.store.size(t))
            .sum::<u64>();
    let retained = end.saturating_sub(steady);
    let steps = if oom.is_some() { r.step } else { total };
    let peak_allocated = r.store.peak().0;
    let peak_reserved = r.timeline.peak_reserved().map_or(0, |p| p.bytes);
    let peak_host_rss = r.timeline.peak_host_rss().map_or(0, |p| p.bytes);
    let all_freed = r.teardown();
    let summary = Summary {
        stage,
        parameters: elems.iter().sum(),
        model_state: ms,
        peak_allocated,
        peak_when: r.peak_when,
        peak_breakdown: r.peak_breakdown,
        peak_reserved,
        peak_host_rss,
        fragmentation,
        oom,
        steps,
        allocations: r.store.allocation_count(),
        retained_at_end: if r
            .timeline
            .samples
            .last()
            .is_some_and(|s| s.phase == Phase::End)
        {
            retained
        } else {
            0
        },
        all_freed_at_teardown: all_freed,
        checkpointing: r.resolved,
    };
    Ok((r.timeline, summary, snapshot))
}

/// Simulates a plan.
pub fn simulate(plan: &Plan, mut opts: SimOptions) -> Result<SimResult, SimError> {
    let program =
        crate::lower::lower_for(&plan.model, plan.framework).map_err(|e| SimError::Model(e.0))?;
    let stages = plan.parallel.pipeline_stages.max(1);
    if stages == 1 {
        let (timeline, summary, snapshot) = simulate_stage(plan, &program, 0, 1, &mut opts)?;
        return Ok(SimResult {
            timeline,
            stages: vec![summary.clone()],
            summary,
            snapshot,
        });
    }
    let parts = crate::lower::split_stages(&program, stages).map_err(|e| SimError::Model(e.0))?;
    let mut best: Option<(Timeline, Summary, Option<trainmem_alloc::Snapshot>)> = None;
    let mut all = Vec::new();
    for (i, part) in parts.iter().enumerate() {
        let r = simulate_stage(plan, part, i as u64, stages, &mut opts)?;
        all.push(r.1.clone());
        if best
            .as_ref()
            .is_none_or(|b| r.1.peak_allocated > b.1.peak_allocated)
        {
            best = Some(r);
        }
    }
    let (timeline, summary, snapshot) = best.expect("at least one stage");
    Ok(SimResult {
        timeline,
        summary,
        stages: all,
        snapshot,
    })
}
