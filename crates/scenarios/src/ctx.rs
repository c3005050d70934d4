//! What a scenario works with: its plans, its runs (measured on burn, simulated by the twin, or
//! both, as the command line asks) and the verdicts it reaches.
//!
//! A scenario body loads a plan ([`Ctx::plan`]), runs it ([`Ctx::run`] — measured and/or
//! simulated with a progress bar), then states what it checks with [`Ctx::check`] (one run) or
//! [`Ctx::compare`] (a knob: the base run against the run with the knob set). Each check is a
//! closure over a [`Timeline`], so the same rule judges the measured run and the twin's
//! prediction, and a verdict is recorded per source.

use std::path::PathBuf;

use indicatif::{ProgressBar, ProgressStyle};
use trainmem_burn::{BackendChoice, MeasuredRun, RunOptions, run_measured_detailed};
use trainmem_core::Plan;
use trainmem_core::compare::comparison_domain;
use trainmem_core::plan::DeviceKind;
use trainmem_core::timeline::{Domain, Source, Timeline};
use trainmem_sim::{Machine, SimOptions, SimResult, simulate};

use super::error::plan_error;
use super::error::{Result, ScenarioError};
use super::isolate::{self, Isolation};
use super::report::{Figure, Verdict, VerdictKind};
use super::twin_device::TwinDevice;

/// Which runs a scenario makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Real burn training runs only.
    Measured,
    /// The simulated twin only (fast; what CI runs for every scenario).
    Simulated,
    /// Both, side by side, with the twin's error per category.
    Both,
}

impl Mode {
    /// Whether real runs are made.
    pub fn measured(self) -> bool {
        matches!(self, Mode::Measured | Mode::Both)
    }

    /// Whether the twin runs.
    pub fn simulated(self) -> bool {
        matches!(self, Mode::Simulated | Mode::Both)
    }
}

/// Whether measured runs can train on `backend` in this build and on this machine.
pub fn backend_available(backend: BackendChoice) -> Result<()> {
    match backend {
        BackendChoice::Flex => Ok(()),
        #[cfg(feature = "cuda")]
        BackendChoice::Cuda => {
            trainmem_burn::cuda_device_available(0).map_err(|detail| ScenarioError::NoDevice {
                backend: "cuda",
                detail,
            })
        }
        #[cfg(feature = "wgpu")]
        BackendChoice::Wgpu => {
            trainmem_burn::wgpu_adapter()
                .map(|_| ())
                .map_err(|detail| ScenarioError::NoDevice {
                    backend: "wgpu",
                    detail,
                })
        }
        #[cfg(any(not(feature = "cuda"), not(feature = "wgpu")))]
        other => Err(ScenarioError::BackendNotBuilt {
            backend: other.name(),
        }),
    }
}

/// One plan, run measured and/or simulated.
#[derive(Debug)]
pub struct RunRecord {
    /// What this run is (`respawned workers`, `with the fix`, ...).
    pub label: String,
    /// The plan as run.
    pub plan: Plan,
    /// The real run, when measured.
    pub measured: Option<MeasuredRun>,
    /// The twin's prediction, when simulated.
    pub simulated: Option<SimResult>,
    /// Why a measured run was not made although the mode asks for one.
    pub not_measured: Option<String>,
    /// Why the twin's accuracy targets do not apply to this run (its measured side is not a
    /// full count of the run's bytes), when they do not.
    pub no_targets: Option<String>,
    /// The same plan trained on trainmem-meta with the measured run's options (with
    /// [`Ctx::meta`], beside every measured run).
    pub meta_run: Option<MeasuredRun>,
    /// Why the Meta run failed, when it did (a disagreement with the measured run).
    pub meta_failed: Option<String>,
    /// Why a run with a measured side has no Meta run (it is not a training run of its own).
    pub no_meta: Option<String>,
}

impl RunRecord {
    /// The timelines this run has: measured first, then simulated.
    pub fn timelines(&self) -> Vec<&Timeline> {
        let mut out = Vec::new();
        if let Some(m) = &self.measured {
            out.push(&m.timeline);
        }
        if let Some(s) = &self.simulated {
            out.push(&s.timeline);
        }
        out
    }

    /// The timeline from `source`, if this run has it.
    pub fn timeline(&self, source: Source) -> Option<&Timeline> {
        match source {
            Source::Measured => self.measured.as_ref().map(|m| &m.timeline),
            Source::Simulated => self.simulated.as_ref().map(|s| &s.timeline),
        }
    }

    /// The memory domain that holds this run's tensors: the measured run's tensor domain when
    /// the run was measured (burn's Flex keeps every tensor on the host, a CUDA run on the
    /// device), the plan's device otherwise. The twin of a CPU plan fills device bytes too (its
    /// simulated device is host memory), so the twin's timeline never decides the domain.
    pub fn domain(&self) -> Domain {
        comparison_domain(&self.plan, self.measured.as_ref().map(|m| &m.timeline))
    }
}

/// Measured runs kept in a folder (one JSON file per run, named by the run's label): written
/// as they are measured, or read back in their place so that a scenario is judged again on
/// runs made elsewhere (a lent GPU's, committed under `fixtures/gpu-check/<device>/runs/`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recorded {
    /// Write each measured run to `DIR/<label>.json` as well.
    Save(PathBuf),
    /// Read each measured run from `DIR/<label>.json` instead of training.
    Load(PathBuf),
}

impl Recorded {
    fn path(dir: &std::path::Path, label: &str) -> PathBuf {
        dir.join(format!("{}.json", crate::output::slug(label)))
    }

    fn save(dir: &std::path::Path, label: &str, run: &MeasuredRun) -> Result<()> {
        let path = Recorded::path(dir, label);
        let fail = |source: Box<dyn std::error::Error + Send + Sync>| ScenarioError::Recorded {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(|e| fail(e.into()))?;
        let text = serde_json::to_string(run).map_err(|e| fail(e.into()))?;
        std::fs::write(&path, text).map_err(|e| fail(e.into()))
    }

    fn load(dir: &std::path::Path, label: &str) -> Result<MeasuredRun> {
        let path = Recorded::path(dir, label);
        let fail = |source: Box<dyn std::error::Error + Send + Sync>| ScenarioError::Recorded {
            path: path.clone(),
            source,
        };
        let text = std::fs::read_to_string(&path).map_err(|e| fail(e.into()))?;
        serde_json::from_str(&text).map_err(|e| fail(e.into()))
    }
}

/// The Meta run beside a measured run: `None` without [`Ctx::meta`], the run, or its error in
/// words when it failed.
type MetaOutcome = Option<std::result::Result<MeasuredRun, String>>;

/// A scenario's working state.
pub struct Ctx {
    /// Which runs to make.
    pub mode: Mode,
    /// The backend of measured runs.
    pub backend: BackendChoice,
    /// Where fixture data and checkpoints go.
    pub work_dir: PathBuf,
    /// Whether to print progress (off for `--json` and in tests).
    pub progress: bool,
    /// A plan to run instead of the scenario's own (`--plan FILE`): the same runs, knobs and
    /// rules, on the user's model and settings.
    pub plan_override: Option<Plan>,
    /// Where measured runs are made: in this process (the default) or each in a fresh child
    /// process, so that no run measures what an earlier one left behind.
    pub isolation: Isolation,
    /// Also train every measured run's plan on trainmem-meta (in this process, with the same
    /// run options) and compare its tensor bytes per category at every phase boundary
    /// ([`crate::meta`]).
    pub meta: bool,
    /// Keep every measured run in a folder, or take them from one instead of training
    /// ([`Recorded`]).
    pub recorded: Option<Recorded>,
    /// The device the twin predicts a device backend's runs on (burn's fusion, cubecl's
    /// alignment): this build's by default ([`TwinDevice::of_build`]), a recording's when
    /// judging it again.
    pub twin_device: TwinDevice,
    runs: Vec<RunRecord>,
    verdicts: Vec<Verdict>,
    notes: Vec<String>,
}

impl std::fmt::Debug for Ctx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ctx")
            .field("mode", &self.mode)
            .field("backend", &self.backend)
            .field("isolation", &self.isolation)
            .field("meta", &self.meta)
            .field("runs", &self.runs.len())
            .field("verdicts", &self.verdicts.len())
            .finish()
    }
}

impl Ctx {
    /// A context for one scenario.
    pub fn new(mode: Mode, backend: BackendChoice, work_dir: PathBuf, progress: bool) -> Ctx {
        Ctx {
            mode,
            backend,
            work_dir,
            progress,
            plan_override: None,
            isolation: Isolation::InProcess,
            meta: false,
            recorded: None,
            twin_device: TwinDevice::of_build(backend),
            runs: Vec::new(),
            verdicts: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// The scenario plan `NAME` (`crates/scenarios/plans/NAME.toml`, compiled in), or the
    /// plan given in its place ([`Ctx::plan_override`]).
    pub fn plan(&self, name: &str) -> Result<Plan> {
        if let Some(plan) = &self.plan_override {
            return Ok(plan.clone());
        }
        crate::plans::load(name).map_err(plan_error(format!("loading the plan `{name}`")))
    }

    /// Runs `plan` as the mode asks and records it; returns its index.
    pub fn run(&mut self, label: &str, plan: &Plan) -> Result<usize> {
        self.run_with(label, plan, |_| {})
    }

    /// Like [`Ctx::run`], with extra options for the measured run.
    pub fn run_with(
        &mut self,
        label: &str,
        plan: &Plan,
        configure: impl FnOnce(&mut RunOptions<'_>),
    ) -> Result<usize> {
        let simulated = if self.mode.simulated() {
            Some(self.simulate(label, plan)?)
        } else {
            None
        };
        let (measured, meta) = if self.mode.measured() {
            let (m, meta) = self.measure(label, plan, configure)?;
            (Some(m), meta)
        } else {
            (None, None)
        };
        let idx = self.add_run(label, plan, measured, simulated);
        self.set_meta(idx, meta);
        Ok(idx)
    }

    fn set_meta(&mut self, run: usize, meta: MetaOutcome) {
        match meta {
            Some(Ok(m)) => self.runs[run].meta_run = Some(m),
            Some(Err(why)) => self.runs[run].meta_failed = Some(why),
            None => {}
        }
    }

    /// Runs `plan` measured only (when the mode measures; `None` otherwise), for a run option
    /// the twin has no counterpart for; `reason` says why there is no twin, in the report.
    pub fn run_measured_only(
        &mut self,
        label: &str,
        plan: &Plan,
        reason: &str,
        configure: impl FnOnce(&mut RunOptions<'_>),
    ) -> Result<Option<usize>> {
        if !self.mode.measured() {
            return Ok(None);
        }
        let (measured, meta) = self.measure(label, plan, configure)?;
        self.note(format!("`{label}` is measured only: {reason}"));
        let idx = self.add_run(label, plan, Some(measured), None);
        self.set_meta(idx, meta);
        Ok(Some(idx))
    }

    /// Runs `plan` through the twin only, whatever the mode, and says why in the report
    /// (`reason`: what a measured run cannot do here).
    pub fn run_simulated_only(&mut self, label: &str, plan: &Plan, reason: &str) -> Result<usize> {
        let simulated = Some(self.simulate(label, plan)?);
        let not_measured = self.mode.measured().then(|| reason.to_string());
        if let Some(reason) = &not_measured {
            self.note(format!("`{label}` is simulated only: {reason}"));
        }
        let idx = self.add_run(label, plan, None, simulated);
        self.runs[idx].not_measured = not_measured;
        Ok(idx)
    }

    fn bar(&self, label: &str, what: &str, total: u64) -> ProgressBar {
        if !self.progress {
            return ProgressBar::hidden();
        }
        let bar = ProgressBar::new(total.max(1));
        bar.set_style(
            ProgressStyle::with_template("  {prefix:<34} [{bar:30}] {pos}/{len} steps {elapsed}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        bar.set_prefix(format!("{what}: {label}"));
        bar
    }

    /// Runs the twin on `plan` without recording a run (for a scenario that assembles its own
    /// runs with [`Ctx::add_run`]).
    pub fn simulate(&self, label: &str, plan: &Plan) -> Result<SimResult> {
        let bar = self.bar(label, "twin", plan.total_steps());
        let mut on_step = |done: u64, total: u64| {
            bar.set_length(total.max(1));
            bar.set_position(done);
        };
        let opts = SimOptions {
            // the twin predicts the run measured on this machine
            machine: Machine::detect(),
            trace_entries: Some(20_000),
            progress: Some(&mut on_step),
            max_steps: None,
        };
        // With measured runs on a device backend (CUDA, wgpu) the twin predicts the same plan
        // on a GPU (tensors in device memory), so the two are compared in the same domain.
        // burn's plans take the device's fusion and alignment there.
        let on_gpu;
        let plan = if self.backend.on_device() {
            let mut gpu = plan.clone();
            gpu.device.kind = DeviceKind::Cuda;
            self.twin_device.apply(&mut gpu);
            on_gpu = gpu;
            &on_gpu
        } else {
            plan
        };
        let result = simulate(plan, opts).map_err(|source| ScenarioError::Simulation {
            label: label.to_string(),
            source,
        });
        bar.finish_and_clear();
        result
    }

    /// Makes the measured run and, with [`Ctx::meta`], the Meta run of the same plan and
    /// options.
    fn measure(
        &self,
        label: &str,
        plan: &Plan,
        configure: impl FnOnce(&mut RunOptions<'_>),
    ) -> Result<(MeasuredRun, MetaOutcome)> {
        let bar = self.bar(label, "burn", plan.total_steps());
        let show = |step: u64, total: u64| {
            bar.set_length(total.max(1));
            bar.set_position(step);
        };
        let mut on_step = |p: trainmem_burn::Progress| show(p.step, p.total_steps);
        let replaying = matches!(self.recorded, Some(Recorded::Load(_)));
        let mut opts = RunOptions {
            // A replayed run trains nothing: its backend need not be built in.
            backend: if replaying {
                BackendChoice::Flex
            } else {
                backend_available(self.backend)?;
                self.backend
            },
            work_dir: Some(self.work_dir.join("work")),
            // Traced so the tensors can be replayed through the caching allocator (the
            // scenario's memory_viz snapshot), where they are host memory: on a device
            // backend the training thread's host allocations are the backend's own (wgpu's
            // command buffers), not the tensors.
            trace_allocations: (!self.backend.on_device()).then_some(super::replay::MIN_TRACE),
            ..RunOptions::default()
        };
        configure(&mut opts);
        let on_meta = self.meta.then(|| {
            (
                opts.work_dir.clone(),
                opts.learning_rate,
                opts.lazy_parameters,
                opts.source.is_some(),
            )
        });
        let result = match (&self.recorded, &self.isolation) {
            (Some(Recorded::Load(dir)), _) => Recorded::load(dir, label),
            (_, Isolation::InProcess) => {
                opts.progress = Some(&mut on_step);
                run_measured_detailed(plan, opts).map_err(|source| ScenarioError::Measured {
                    label: label.to_string(),
                    source,
                })
            }
            (_, Isolation::Child(cmd)) => {
                let request = isolate::request_from(label, plan, self.backend, &opts)?;
                isolate::measure_in_child(cmd, request, show)
            }
        };
        bar.finish_and_clear();
        let run = result?;
        if let Some(Recorded::Save(dir)) = &self.recorded {
            Recorded::save(dir, label, &run)?;
        }
        if !run.host_counted && self.backend == BackendChoice::Flex {
            return Err(ScenarioError::NotCounting {
                label: label.to_string(),
            });
        }
        let meta = on_meta.map(|(work_dir, learning_rate, lazy_parameters, has_source)| {
            if has_source {
                return Err(
                    "the measured run read a batch source object, which a second \
                            run cannot share"
                        .to_string(),
                );
            }
            self.meta_run(label, plan, work_dir, learning_rate, lazy_parameters)
        });
        Ok((run, meta))
    }

    /// The Meta run beside a measured one: `plan` trained on trainmem-meta with the measured
    /// run's options, or its error chain in words.
    fn meta_run(
        &self,
        label: &str,
        plan: &Plan,
        work_dir: Option<PathBuf>,
        learning_rate: f64,
        lazy_parameters: bool,
    ) -> std::result::Result<MeasuredRun, String> {
        let bar = self.bar(label, "meta", plan.total_steps());
        let mut on_step = |p: trainmem_burn::Progress| {
            bar.set_length(p.total_steps.max(1));
            bar.set_position(p.step);
        };
        let opts = RunOptions {
            work_dir,
            learning_rate,
            lazy_parameters,
            progress: Some(&mut on_step),
            ..RunOptions::default()
        };
        let result = trainmem_burn::run_predicted::<trainmem_meta::Meta>(
            plan,
            opts,
            trainmem_meta::MetaDevice::new(),
            trainmem_meta::PRODUCER,
        )
        .map_err(|e| isolate::error_chain(&e));
        bar.finish_and_clear();
        result
    }

    /// Records a run the scenario assembled itself (for instance a measured run's allocations
    /// replayed through the caching allocator, beside the twin of the same plan on a GPU);
    /// returns its index.
    pub fn add_run(
        &mut self,
        label: &str,
        plan: &Plan,
        measured: Option<MeasuredRun>,
        simulated: Option<SimResult>,
    ) -> usize {
        // On a device backend the bytes per category come from trainmem-track's tracker; a run
        // without them (made with `track_tensors` off) has only cubecl's pool totals.
        let untracked_device = |m: &MeasuredRun| {
            m.samples
                .iter()
                .any(|s| s.device.is_some_and(|d| d.categories.is_none()))
        };
        let no_targets = (self.backend.on_device()
            && measured.as_ref().is_some_and(untracked_device))
        .then(|| {
            format!(
                "measured on {} without the tracker: cubecl reports bytes in use and \
                 reserved, not bytes per category, so the per-category comparison has nothing \
                 measured to hold the twin to",
                self.backend
            )
        });
        self.runs.push(RunRecord {
            label: label.to_string(),
            plan: plan.clone(),
            measured,
            simulated,
            not_measured: None,
            no_targets,
            meta_run: None,
            meta_failed: None,
            no_meta: None,
        });
        self.runs.len() - 1
    }

    /// Marks a run whose measured side is not a full count of its bytes (so the twin's
    /// accuracy targets do not apply to it), saying why.
    pub fn without_twin_targets(&mut self, run: usize, reason: &str) {
        self.runs[run].no_targets = Some(reason.to_string());
    }

    /// Marks a run that has no Meta run of its own although it has a measured side (with
    /// [`Ctx::meta`]), saying why in the report.
    pub fn without_meta(&mut self, run: usize, reason: &str) {
        if self.meta && self.runs[run].measured.is_some() {
            self.runs[run].no_meta = Some(reason.to_string());
        }
    }

    /// A recorded run.
    pub fn record(&self, run: usize) -> &RunRecord {
        &self.runs[run]
    }

    /// Judges one run: `rule` is applied to each timeline the run has (measured and/or
    /// simulated) and returns whether the pattern shows, a sentence with the numbers, and the
    /// figures behind it.
    pub fn check(
        &mut self,
        run: usize,
        kind: VerdictKind,
        name: &str,
        rule: impl Fn(&Timeline) -> Judgement,
    ) {
        let judged: Vec<(Source, Judgement)> = self.runs[run]
            .timelines()
            .into_iter()
            .map(|t| (t.source, rule(t)))
            .collect();
        for (source, j) in judged {
            self.push_verdict(kind, name, source, j);
        }
    }

    /// Judges a knob: `rule(base, with_knob)` is applied per source where both runs have a
    /// timeline.
    pub fn compare(
        &mut self,
        base: usize,
        other: usize,
        kind: VerdictKind,
        name: &str,
        rule: impl Fn(&Timeline, &Timeline) -> Judgement,
    ) {
        let mut judged = Vec::new();
        for source in [Source::Measured, Source::Simulated] {
            if let (Some(a), Some(b)) = (
                self.runs[base].timeline(source),
                self.runs[other].timeline(source),
            ) {
                judged.push((source, rule(a, b)));
            }
        }
        for (source, j) in judged {
            self.push_verdict(kind, name, source, j);
        }
    }

    /// Records a verdict reached outside the timeline rules (from run extras such as the
    /// loader's thread count, or an allocator replay).
    pub fn push_verdict(&mut self, kind: VerdictKind, name: &str, source: Source, j: Judgement) {
        self.verdicts.push(Verdict {
            kind,
            name: name.to_string(),
            source,
            reproduced: j.ok,
            detail: j.detail,
            figures: j.figures,
        });
    }

    /// Adds a sentence to the report's notes.
    pub fn note(&mut self, text: impl Into<String>) {
        self.notes.push(text.into());
    }

    /// Consumes the context: runs, verdicts and notes.
    pub fn finish(self) -> (Vec<RunRecord>, Vec<Verdict>, Vec<String>) {
        (self.runs, self.verdicts, self.notes)
    }
}

/// The outcome of applying a rule to a timeline.
#[derive(Debug, Clone, PartialEq)]
pub struct Judgement {
    /// Whether the pattern (or the knob's effect) shows.
    pub ok: bool,
    /// The condition, in words, with its numbers.
    pub detail: String,
    /// The numbers behind it.
    pub figures: Vec<Figure>,
}

impl Judgement {
    /// A judgement.
    pub fn new(ok: bool, detail: impl Into<String>, figures: Vec<Figure>) -> Judgement {
        Judgement {
            ok,
            detail: detail.into(),
            figures,
        }
    }
}
