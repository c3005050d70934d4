//! The training loop of a measured run: one plan trained for real on a burn backend, with a
//! memory sample at every phase boundary.
//!
//! The loop is cut by what each part owns: [`Setup`] makes what a run trains with (the batches'
//! source, the probe, the model and its optimizer) in the order its bytes must be counted;
//! [`Trainer`] runs the steps (micro-batches, the optimizer step, what happens after a step:
//! releasing kept outputs, checkpoints, `empty_cache`); [`Kept`] holds what the plan keeps
//! alive across steps on purpose (its leaks and metrics); [`Trainer::finish`] releases it all
//! and assembles the [`MeasuredRun`]. Each allocation is tagged with the category of the phase
//! that makes it (`CategoryScope`), so the order of the statements is part of what is
//! measured: moving a line can move bytes between categories.

use std::path::{Path, PathBuf};

use burn::module::{Module, ModuleMapper, Param};
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::momentum::MomentumConfig;
use burn::optim::{
    Adam, AdamConfig, AdamW, AdamWConfig, GradientsAccumulator, GradientsParams, Optimizer, Sgd,
    SgdConfig,
};
use burn::prelude::{Backend, Tensor};
use burn::record::{BinFileRecorder, BurnRecord, FullPrecisionSettings, Record, Recorder};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{ElementConversion, FloatDType};
use trainmem_core::Category;
use trainmem_core::model::Loss;
use trainmem_core::plan::{Dtype, EmptyCachePolicy, MetricRetention, OptimizerKind, Plan};
use trainmem_core::timeline::Phase;
use trainmem_probe::CategoryScope;

use crate::BurnRunError;
use crate::data::{BatchSource, FixtureData, HostBatch, SyntheticSource, host_batch};
use crate::model::{
    Batch, BatchInput, BatchTarget, ExampleShape, Net, example_shape, lazy_parameter_bytes,
    parameter_bytes,
};
use crate::probe::Probe;
use crate::run::{MeasuredRun, Progress, RunOptions, WorkDir, work_dir};
use crate::timeline::to_timeline;
use trainmem_track::MemoryBackend;
use trainmem_track::materialize;

/// What a run trains with, made in the order the run's bytes are counted.
struct Setup<'a, B: AutodiffBackend + MemoryBackend> {
    data: Data<'a>,
    probe: Probe<B>,
    trace: TraceGuard,
    model: Net<B>,
    optim: AnyOptimizer<B>,
    /// Parameter bytes, counted without touching lazy parameters.
    param_bytes: u64,
    /// Parameters still uninitialised at `model_init`.
    lazy_at_init: usize,
}

/// The fixed settings of a run's steps.
struct StepSettings {
    shape: ExampleShape,
    loss_kind: Loss,
    half: Option<FloatDType>,
    micro: usize,
    accumulation: u64,
    steps_per_epoch: u64,
    total_steps: u64,
    lr: f64,
    /// Where the fixture data set and checkpoints go (removed at the run's end when it is
    /// the run's own).
    dir: WorkDir,
}

impl StepSettings {
    fn new(plan: &Plan, opts: &RunOptions<'_>) -> Result<StepSettings, BurnRunError> {
        let (shape, loss_kind) = example_shape(&plan.model)?;
        Ok(StepSettings {
            shape,
            loss_kind,
            half: half_dtype(plan),
            micro: usize::try_from(plan.micro_batch_size())
                .map_err(|_| BurnRunError::Unsupported("micro-batch size too large".into()))?,
            accumulation: plan.accumulation_steps().max(1),
            steps_per_epoch: plan.steps_per_epoch(),
            total_steps: plan.total_steps(),
            lr: opts.learning_rate,
            dir: work_dir(opts)?,
        })
    }
}

/// What the plan keeps alive across steps on purpose: outputs held with or without their
/// graph (its leak), and per-step metrics as tensors or scalars.
struct Kept<B: AutodiffBackend> {
    outputs: Vec<Tensor<B, 2>>,
    metric_tensors: Vec<Tensor<B, 1>>,
    metric_outputs: Vec<Tensor<B, 2>>,
    metric_scalars: Vec<f32>,
}

impl<B: AutodiffBackend> Kept<B> {
    fn new() -> Kept<B> {
        Kept {
            outputs: Vec::new(),
            metric_tensors: Vec::new(),
            metric_outputs: Vec::new(),
            metric_scalars: Vec::new(),
        }
    }

    /// After backward: the outputs and metrics the plan keeps from this micro-batch.
    fn record(&mut self, plan: &Plan, logits: &Tensor<B, 2>, loss: &Tensor<B, 1>) {
        if plan.leak.retain_outputs && !plan.leak.retain_graph {
            self.outputs.push(logits.clone());
        }
        match plan.metrics.retention {
            MetricRetention::None => {}
            MetricRetention::Scalars => {
                let value: f32 = loss.clone().into_scalar().elem();
                for _ in 0..plan.metrics.per_step {
                    self.metric_scalars.push(value);
                }
            }
            MetricRetention::Tensors => {
                for _ in 0..plan.metrics.per_step {
                    self.metric_tensors.push(loss.clone().detach());
                }
                if plan.metrics.keep_outputs {
                    self.metric_outputs.push(logits.clone().detach());
                }
            }
        }
    }

    /// Releases the kept outputs (the plan's `leak.clear_every`).
    fn clear_outputs(&mut self) {
        self.outputs.clear();
        self.outputs.shrink_to_fit();
    }
}

/// A step's parameter gradients: the last micro-batch's, or their sum under accumulation.
struct StepGrads<B: AutodiffBackend> {
    accumulate: bool,
    accumulator: GradientsAccumulator<Net<B>>,
    last: Option<GradientsParams>,
}

impl<B: AutodiffBackend> StepGrads<B> {
    fn new(accumulation: u64) -> StepGrads<B> {
        StepGrads {
            accumulate: accumulation > 1,
            accumulator: GradientsAccumulator::new(),
            last: None,
        }
    }

    fn add(&mut self, model: &Net<B>, grads: GradientsParams) {
        if self.accumulate {
            self.accumulator.accumulate(model, grads);
        } else {
            self.last = Some(grads);
        }
    }

    fn take(mut self) -> GradientsParams {
        match self.last.take() {
            Some(g) => g,
            None => self.accumulator.grads(),
        }
    }
}

/// Makes what the run trains with: the batches' source, kernel scratch and stale graphs out
/// of the way, the probe and its `start` sample, then the model and its optimizer and the
/// `model_init` sample.
fn set_up<'a, B>(
    plan: &Plan,
    opts: &mut RunOptions<'a>,
    settings: &StepSettings,
    device: &B::Device,
) -> Result<Setup<'a, B>, BurnRunError>
where
    B: AutodiffBackend + MemoryBackend,
{
    let data = match opts.source.take() {
        Some(s) => Data::Source(s),
        None => match settings.shape {
            ExampleShape::Tokens { .. } => Data::Source(Box::new(SyntheticSource::new(
                settings.shape.clone(),
                plan.seed,
            ))),
            _ => {
                let _tag = CategoryScope::enter(Category::Input);
                Data::Loader(Box::new(FixtureData::open(
                    plan,
                    &settings.shape,
                    settings.micro,
                    settings.dir.path(),
                )?))
            }
        },
    };
    {
        // Kernel scratch that lives as long as the thread (see `warm_up_kernels`) is made
        // before the baseline, under `other`, so it is not mistaken for activations.
        let _tag = CategoryScope::enter(Category::Other);
        warm_up_kernels::<B>(device);
    }
    flush_orphaned_graphs::<B>(device);
    let expected_samples =
        (settings.total_steps * (settings.accumulation * 4 + 4) + plan.training.epochs * 3 + 8)
            .min(1 << 20) as usize;
    let mut probe = Probe::<B>::with_capacity(device, expected_samples);
    if let Data::Loader(f) = &data {
        probe.watch_loader(f.loader().memory_watch());
        probe.watch_data_files(f.files());
    }
    B::seed(device, plan.seed);
    let trace = TraceGuard::start(opts.trace_allocations)?;
    probe.sample(Phase::Start, 0, 0, None)?;

    let model = {
        let _tag = CategoryScope::enter(Category::Parameter);
        let mut model = Net::<B>::from_spec(&plan.model, device)?;
        if let Some(dt) = settings.half {
            model = model.map(&mut CastParams(dt));
        }
        if !opts.lazy_parameters {
            materialize(&model);
        }
        model
    };
    // Counted without touching lazy parameters (reading one would create it).
    let (param_bytes, lazy_at_init) = lazy_parameter_bytes(&model);
    let optim = {
        let _tag = CategoryScope::enter(Category::OptimizerState);
        AnyOptimizer::<B>::new(plan)
    };
    probe.sample(Phase::ModelInit, 0, 0, None)?;
    Ok(Setup {
        data,
        probe,
        trace,
        model,
        optim,
        param_bytes,
        lazy_at_init,
    })
}

/// The state the steps change: the model and its optimizer, what the plan keeps, the
/// checkpoints written, and the probe that samples it all.
struct Trainer<'p, B: AutodiffBackend + MemoryBackend> {
    plan: &'p Plan,
    device: B::Device,
    settings: StepSettings,
    probe: Probe<B>,
    model: Option<Net<B>>,
    optim: AnyOptimizer<B>,
    kept: Kept<B>,
    checkpoints: Vec<PathBuf>,
    checkpoint_sizes: Vec<u64>,
    step: u64,
    /// The backend keeps tensors in device memory (it reports device figures): a batch's host
    /// buffers are handed to it for an upload, not kept as the tensors.
    uploads: bool,
}

impl<B: AutodiffBackend + MemoryBackend> Trainer<'_, B> {
    fn model(&self) -> &Net<B> {
        self.model
            .as_ref()
            .expect("the model is only taken out inside a step")
    }

    /// One micro-batch: load it, run forward (and the plan's graph-keeping forward), backward
    /// (its gradients go to `grads` before the `backward` sample), and record what the plan
    /// keeps.
    fn micro_batch(
        &mut self,
        feed: &mut Feed<'_, '_>,
        epoch: u64,
        mb: Option<u32>,
        grads: &mut StepGrads<B>,
    ) -> Result<(), BurnRunError> {
        let (plan, step) = (self.plan, self.step);
        let batch = {
            let _tag = CategoryScope::enter(Category::Input);
            let host = feed.next(self.settings.micro, &self.settings.shape)?;
            let batch = Batch::<B>::from_host(
                &self.settings.shape,
                host.batch,
                host.inputs,
                host.targets,
                &self.device,
                self.uploads,
            )?;
            cast_batch(batch, self.settings.half)
        };
        self.probe.sample(Phase::BatchLoaded, step, epoch, mb)?;

        let (logits, loss) = {
            let _tag = CategoryScope::enter(Category::Activation);
            if plan.leak.retain_outputs && plan.leak.retain_graph {
                // The kept output's graph is never backwarded: its saved activations stay
                // alive with it (burn has no retain_graph; this is its analogue).
                let kept = self.model().forward(batch.input.clone())?;
                self.kept.outputs.push(kept);
            }
            self.model().loss(batch, self.settings.loss_kind)?
        };
        self.probe.sample(Phase::Forward, step, epoch, mb)?;

        {
            let _tag = CategoryScope::enter(Category::Gradient);
            let step_grads = loss.backward();
            grads.add(
                self.model(),
                GradientsParams::from_grads(step_grads, self.model()),
            );
        }
        self.probe.sample(Phase::Backward, step, epoch, mb)?;

        {
            let _tag = CategoryScope::enter(Category::Other);
            self.kept.record(plan, &logits, &loss);
        }
        drop((logits, loss));
        if plan.metrics.retention != MetricRetention::None {
            self.probe.sample(Phase::Metrics, step, epoch, mb)?;
        }
        Ok(())
    }

    /// One optimizer step: its micro-batches (gradients accumulated when there are several),
    /// then the update.
    fn train_step(&mut self, feed: &mut Feed<'_, '_>, epoch: u64) -> Result<(), BurnRunError> {
        let accumulation = self.settings.accumulation;
        let mut grads = StepGrads::new(accumulation);
        for m in 0..accumulation {
            let mb = (accumulation > 1).then_some(m as u32);
            self.micro_batch(feed, epoch, mb, &mut grads)?;
        }
        {
            let _tag = CategoryScope::enter(Category::OptimizerState);
            let grads = grads.take();
            let model = self
                .model
                .take()
                .expect("the model is in place between steps");
            self.model = Some(self.optim.step(self.settings.lr, model, grads));
        }
        self.probe
            .sample(Phase::OptimizerStep, self.step, epoch, None)?;
        Ok(())
    }

    /// What follows a step: releasing kept outputs, a checkpoint, `empty_cache`, as the plan
    /// says.
    fn after_step(&mut self, epoch: u64) -> Result<(), BurnRunError> {
        let (plan, step) = (self.plan, self.step);
        if plan.leak.clear_every > 0 && (step + 1).is_multiple_of(plan.leak.clear_every) {
            self.kept.clear_outputs();
        }
        if plan.training.checkpoint_every > 0
            && (step + 1).is_multiple_of(plan.training.checkpoint_every)
        {
            let path = self
                .settings
                .dir
                .path()
                .join(format!("checkpoint-step{}.bin", step + 1));
            let model = self
                .model
                .as_ref()
                .expect("the model is in place between steps");
            save_checkpoint(model, &path, &mut self.probe, step, epoch)?;
            let size = std::fs::metadata(&path)
                .map_err(|source| BurnRunError::Io {
                    what: "reading the size of checkpoint",
                    path: path.clone(),
                    source,
                })?
                .len();
            self.checkpoints.push(path);
            self.checkpoint_sizes.push(size);
        }
        if plan.training.empty_cache == EmptyCachePolicy::EveryStep {
            self.empty_cache(step, epoch)?;
        }
        Ok(())
    }

    /// Syncs the device, releases its cached memory and samples.
    fn empty_cache(&mut self, step: u64, epoch: u64) -> Result<(), BurnRunError> {
        B::sync(&self.device).map_err(|e| BurnRunError::Backend(e.to_string()))?;
        B::empty_cache(&self.device);
        self.probe.sample(Phase::EmptyCache, step, epoch, None)?;
        Ok(())
    }

    /// One epoch over `data`: its steps, then the loader's end of epoch.
    fn epoch(
        &mut self,
        data: &mut Data<'_>,
        epoch: u64,
        progress: &mut Option<&mut (dyn FnMut(Progress) + Send)>,
    ) -> Result<(), BurnRunError> {
        let mut feed = {
            let _tag = CategoryScope::enter(Category::Input);
            match data {
                Data::Source(s) => {
                    s.start_epoch(epoch)?;
                    Feed::Source(s.as_mut())
                }
                Data::Loader(f) => {
                    Feed::Epoch(f.loader_mut().epoch().map_err(|e| BurnRunError::Loader {
                        what: "starting an epoch",
                        source: e.into(),
                    })?)
                }
            }
        };
        self.probe
            .sample(Phase::EpochStart, self.step, epoch, None)?;
        for _ in 0..self.settings.steps_per_epoch {
            if self.step >= self.settings.total_steps {
                break;
            }
            self.train_step(&mut feed, epoch)?;
            self.after_step(epoch)?;
            self.step += 1;
            if let Some(cb) = progress.as_mut() {
                cb(Progress {
                    step: self.step,
                    total_steps: self.settings.total_steps,
                    epoch,
                });
            }
        }
        {
            let _tag = CategoryScope::enter(Category::Input);
            feed.finish()?;
        }
        let last = self.step.saturating_sub(1);
        self.probe.sample(Phase::EpochEnd, last, epoch, None)?;
        if self.plan.training.empty_cache == EmptyCachePolicy::EveryEpoch {
            self.empty_cache(last, epoch)?;
        }
        Ok(())
    }
}

/// Trains `plan` on autodiff backend `B` and measures it.
pub(crate) fn train<B>(
    plan: &Plan,
    mut opts: RunOptions<'_>,
    device: B::Device,
    producer: &str,
) -> Result<MeasuredRun, BurnRunError>
where
    B: AutodiffBackend + MemoryBackend,
{
    let settings = StepSettings::new(plan, &opts)?;
    if let Some(dt) = settings.half {
        let dtype: burn::tensor::DType = dt.into();
        if !B::supports_dtype(&device, dtype) {
            return Err(BurnRunError::Unsupported(format!(
                "{dtype:?} on this backend ({producer})"
            )));
        }
    }
    let Setup {
        mut data,
        probe,
        mut trace,
        model,
        optim,
        param_bytes,
        lazy_at_init,
    } = set_up::<B>(plan, &mut opts, &settings, &device)?;
    let uploads = B::device_memory(&device).is_some();
    let mut trainer = Trainer {
        uploads,
        plan,
        device,
        settings,
        probe,
        model: Some(model),
        optim,
        kept: Kept::new(),
        checkpoints: Vec::new(),
        checkpoint_sizes: Vec::new(),
        step: 0,
    };
    for epoch in 0..plan.training.epochs {
        if trainer.step >= trainer.settings.total_steps {
            break;
        }
        trainer.epoch(&mut data, epoch, &mut opts.progress)?;
    }
    let last_epoch = trainer.probe.samples().last().map_or(0, |s| s.epoch);
    let last_step = trainer.step.saturating_sub(1);
    trainer
        .probe
        .sample(Phase::End, last_step, last_epoch, None)?;
    let traced = trace.stop();
    trainer.finish(data, producer, param_bytes, lazy_at_init, traced)
}

impl<B: AutodiffBackend + MemoryBackend> Trainer<'_, B> {
    /// Releases everything the run kept (after the last sample), frees the graphs that
    /// orphans, and assembles the measured run.
    fn finish(
        self,
        data: Data<'_>,
        producer: &str,
        param_bytes: u64,
        lazy_at_init: usize,
        traced: trainmem_probe::TraceResult,
    ) -> Result<MeasuredRun, BurnRunError> {
        let Trainer {
            plan,
            device,
            probe,
            model,
            optim,
            kept,
            checkpoints,
            checkpoint_sizes,
            ..
        } = self;
        let model = model.expect("the model is in place after the last step");
        // Every parameter exists by now (the forward pass read them all).
        let param_bytes = if lazy_at_init > 0 {
            parameter_bytes(&model)
        } else {
            param_bytes
        };
        // Everything the run kept is released only now, after the last sample; graphs
        // orphaned by the release are freed before returning, so the next run starts clean.
        drop((
            kept.outputs,
            kept.metric_tensors,
            kept.metric_outputs,
            kept.metric_scalars,
            model,
            optim,
        ));
        flush_orphaned_graphs::<B>(&device);

        let (loader_threads_spawned, loader_peak, preloaded_bytes) = match &data {
            Data::Loader(f) => (
                Some(f.loader().threads_spawned()),
                Some(f.loader().memory_peak()),
                f.preloaded_bytes(),
            ),
            Data::Source(_) => (None, None, 0),
        };
        let staging_pinned = loader_peak
            .filter(|_| plan.loader.pin_memory)
            .map(|p| p.pin_failures == 0);
        drop(data);
        let host_counted = probe.counts_host();
        let (samples, loader_memory) = probe.into_parts();
        let timeline = to_timeline(plan, producer, param_bytes, &samples);
        Ok(MeasuredRun {
            timeline,
            samples,
            parameter_bytes: param_bytes,
            host_counted,
            checkpoints,
            checkpoint_sizes,
            loader_threads_spawned,
            loader_memory,
            loader_peak,
            staging_pinned,
            preloaded_bytes,
            lazy_parameters_at_init: lazy_at_init,
            allocation_trace: traced.events,
            allocation_trace_dropped: traced.dropped,
            training_thread: trainmem_probe::trace_thread_id(),
        })
    }
}

/// Where a run's batches come from.
enum Data<'a> {
    Source(Box<dyn BatchSource + Send + 'a>),
    Loader(Box<FixtureData>),
}

/// The batches of one epoch.
enum Feed<'e, 'a> {
    Source(&'e mut (dyn BatchSource + 'a)),
    Epoch(trainmem_loader::Epoch<'e, trainmem_loader::MmapDataset, crate::data::FixtureBuilder>),
}

impl Feed<'_, '_> {
    fn next(
        &mut self,
        micro: usize,
        shape: &crate::model::ExampleShape,
    ) -> Result<HostBatch, BurnRunError> {
        match self {
            Feed::Source(s) => s.next_batch(micro),
            Feed::Epoch(e) => match e.next() {
                Some(Ok(batch)) => host_batch(shape, &batch),
                Some(Err(err)) => Err(BurnRunError::Data(err.to_string())),
                None => Err(BurnRunError::Data(
                    "the data set ran out of batches before the epoch's steps were done: give \
                     data.samples >= steps_per_epoch x batch_size"
                        .into(),
                )),
            },
        }
    }

    fn finish(self) -> Result<(), BurnRunError> {
        match self {
            Feed::Source(s) => s.end_epoch(),
            // Dropping the epoch joins per-epoch workers; persistent ones wait for the next.
            Feed::Epoch(e) => {
                drop(e);
                Ok(())
            }
        }
    }
}

/// One of burn-optim's optimizers, behind one type.
enum AnyOptimizer<B: AutodiffBackend> {
    Sgd(OptimizerAdaptor<Sgd<B::InnerBackend>, Net<B>, B>),
    Adam(OptimizerAdaptor<Adam, Net<B>, B>),
    AdamW(OptimizerAdaptor<AdamW, Net<B>, B>),
}

impl<B: AutodiffBackend> AnyOptimizer<B> {
    fn new(plan: &Plan) -> AnyOptimizer<B> {
        match plan.optimizer.kind {
            OptimizerKind::Sgd => AnyOptimizer::Sgd(SgdConfig::new().init()),
            OptimizerKind::Momentum => AnyOptimizer::Sgd(
                SgdConfig::new()
                    .with_momentum(Some(MomentumConfig::new()))
                    .init(),
            ),
            OptimizerKind::Adam => AnyOptimizer::Adam(
                AdamConfig::new()
                    .with_amsgrad(plan.optimizer.amsgrad)
                    .init(),
            ),
            OptimizerKind::AdamW => AnyOptimizer::AdamW(
                AdamWConfig::new()
                    .with_amsgrad(plan.optimizer.amsgrad)
                    .init(),
            ),
            OptimizerKind::Adafactor | OptimizerKind::AdamW8bit => {
                unreachable!("Plan::validate rejects Adafactor and adamw8bit under framework burn")
            }
        }
    }

    fn step(&mut self, lr: f64, model: Net<B>, grads: GradientsParams) -> Net<B> {
        match self {
            AnyOptimizer::Sgd(o) => o.step(lr, model, grads),
            AnyOptimizer::Adam(o) => o.step(lr, model, grads),
            AnyOptimizer::AdamW(o) => o.step(lr, model, grads),
        }
    }
}

/// Casts every float parameter to a dtype, keeping it a trainable leaf.
struct CastParams(FloatDType);

impl<B: AutodiffBackend> ModuleMapper<B> for CastParams {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let dtype = self.0;
        param.map(|t| t.cast(dtype).detach().require_grad())
    }
}

/// burn's float dtype for a plan's dtype (`None` for integers and dtypes burn does not train in).
pub(crate) fn float_dtype(dtype: Dtype) -> Option<FloatDType> {
    match dtype {
        Dtype::F32 => Some(FloatDType::F32),
        Dtype::F16 => Some(FloatDType::F16),
        Dtype::Bf16 => Some(FloatDType::BF16),
        _ => None,
    }
}

/// The half-precision dtype the plan trains in, if it does.
fn half_dtype(plan: &Plan) -> Option<FloatDType> {
    float_dtype(plan.precision.compute).filter(|d| *d != FloatDType::F32)
}

fn cast_batch<B: Backend>(batch: Batch<B>, dtype: Option<FloatDType>) -> Batch<B> {
    let Some(dt) = dtype else { return batch };
    Batch {
        input: match batch.input {
            BatchInput::Vector(x) => BatchInput::Vector(x.cast(dt)),
            BatchInput::Image(x) => BatchInput::Image(x.cast(dt)),
            tokens @ BatchInput::Tokens(_) => tokens,
        },
        target: match batch.target {
            BatchTarget::Values(t) => BatchTarget::Values(t.cast(dt)),
            classes @ BatchTarget::Classes(_) => classes,
        },
    }
}

/// Serialises the model through burn's file recorder, sampling while the serialised copy
/// (the record item: a host copy of every parameter) exists.
fn save_checkpoint<B: AutodiffBackend + MemoryBackend>(
    model: &Net<B>,
    path: &Path,
    probe: &mut Probe<B>,
    step: u64,
    epoch: u64,
) -> Result<(), BurnRunError> {
    let recorder = BinFileRecorder::<FullPrecisionSettings>::new();
    let _tag = CategoryScope::enter(Category::Temporary);
    let item = model
        .clone()
        .into_record()
        .into_item::<FullPrecisionSettings>();
    let item = BurnRecord::<_, B>::new::<BinFileRecorder<FullPrecisionSettings>>(item);
    probe.sample(Phase::CheckpointSave, step, epoch, None)?;
    Recorder::<B>::save_item(&recorder, item, path.to_path_buf()).map_err(|source| {
        BurnRunError::Checkpoint {
            path: path.to_path_buf(),
            source,
        }
    })?;
    Ok(())
}

/// The run's allocation trace: stopped when the run ends, or when it fails midway.
struct TraceGuard {
    on: bool,
}

impl TraceGuard {
    fn start(min_bytes: Option<u64>) -> Result<TraceGuard, BurnRunError> {
        match min_bytes {
            None => Ok(TraceGuard { on: false }),
            Some(m) => {
                trainmem_probe::start_trace(m)
                    .map_err(|e| BurnRunError::Unsupported(e.to_string()))?;
                Ok(TraceGuard { on: true })
            }
        }
    }

    fn stop(&mut self) -> trainmem_probe::TraceResult {
        if std::mem::take(&mut self.on) {
            trainmem_probe::stop_trace()
        } else {
            trainmem_probe::TraceResult::default()
        }
    }
}

impl Drop for TraceGuard {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// Frees autodiff graph state that no live tensor can reach any more.
///
/// burn-autodiff keeps every graph in a process-wide registry. When tracked outputs are
/// dropped without a backward pass, their nodes (and the tensors saved for backward) are not
/// freed at once: after each backward pass the registry frees the graph *roots* nobody
/// references, one layer of the orphaned graph per pass. This runs trivial backward passes
/// until the counting allocator sees no more bytes released (at most 256), or 8 passes when no
/// counting allocator is installed.
fn flush_orphaned_graphs<B: AutodiffBackend>(device: &B::Device) {
    let _tag = CategoryScope::enter(Category::Other);
    let counting = crate::probe::host_counting_available();
    let mut before = trainmem_probe::total_live_bytes();
    for pass in 0..256 {
        let x = Tensor::<B, 1>::ones([1], device).require_grad();
        let _ = x.sum().backward();
        let now = trainmem_probe::total_live_bytes();
        if (!counting && pass >= 7) || (counting && now >= before && pass >= 1) {
            break;
        }
        before = now;
    }
}

/// Runs one small matrix product on the calling thread.
///
/// Flex's matrix products go through the `gemm` crate, which keeps a thread-local packing
/// buffer the size of the CPU's L2 cache (1 MiB on the machine these facts were measured on),
/// allocated at the thread's first product and never freed. Without this warm-up it would be
/// allocated inside the first forward pass and counted as an activation that never goes away.
fn warm_up_kernels<B: Backend>(device: &B::Device) {
    let a = Tensor::<B, 2>::ones([64, 64], device);
    let _ = a.clone().matmul(a).into_data();
}
