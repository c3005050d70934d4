//! The shared memory timeline: samples taken at named phase boundaries of a training run.
//!
//! One [`Timeline`] type serves both sides of trainmem: the simulator produces it from a plan
//! ([`Source::Simulated`]) and real training runs produce it from probes ([`Source::Measured`]).
//! It is backend-neutral: it knows phases, categories and bytes, nothing about burn or the
//! allocator.
//!
//! Each [`Sample`] is taken at the *end* of a [`Phase`] (after `forward`, after `backward`, ...)
//! and carries bytes per [`Category`] for two domains:
//!
//! * **host**: per-category bytes plus the RSS split the OS reports (anonymous and file-backed);
//! * **device**: per-category bytes plus the caching allocator's `allocated` and `reserved`
//!   totals, and the peak allocated since the previous sample (so a peak inside a phase is not
//!   lost between boundaries).
//!
//! The JSON form (serde) is the exchange format between the simulator, real runs and the
//! comparison.
//!
//! # Finding samples
//!
//! Several samples can share a step and a phase: under gradient accumulation a step has one
//! `forward` and one `backward` sample per micro-batch, and the phases of a step that spans
//! an epoch boundary repeat. A lookup by step and phase therefore says which one it means:
//! [`Timeline::first_index`] is the first in time (the step's first micro-batch),
//! [`Timeline::last_index`] and [`Timeline::find`] the last (the state the step leaves once
//! all its micro-batches are done). [`Timeline::indices_at`] lists them all, in time order.
//! The peaks ([`Timeline::peak_of`], ...) report the earliest sample when several reach the
//! same value.

use std::collections::BTreeMap;
use std::fmt;

use crate::category::Category;
use serde::de::{MapAccess, SeqAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Where a timeline came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// Predicted by the simulator from a plan.
    Simulated,
    /// Measured on a real training run.
    Measured,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Source::Simulated => "simulated",
            Source::Measured => "measured",
        })
    }
}

/// A named boundary in a training run. A sample tagged with a phase is taken when that phase
/// has just completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Before anything was built (process baseline).
    Start,
    /// The model (parameters) and, if eager, the optimizer state exist.
    ModelInit,
    /// An epoch begins: loader workers (re)started, prefetch queue filled.
    EpochStart,
    /// A (micro-)batch has been taken from the loader and moved to the device.
    BatchLoaded,
    /// Forward pass (including the loss) completed.
    Forward,
    /// Backward pass completed.
    Backward,
    /// Optimizer step completed.
    OptimizerStep,
    /// Gradients were zeroed or dropped.
    ZeroGrad,
    /// Per-step metrics were recorded.
    Metrics,
    /// A checkpoint was written (sampled at its peak, while the serialised copy exists).
    CheckpointSave,
    /// The allocator's cache was emptied.
    EmptyCache,
    /// An epoch ended (loader workers shut down unless persistent).
    EpochEnd,
    /// The run finished.
    End,
    /// The run stopped because an allocation failed.
    OutOfMemory,
}

impl Phase {
    /// Every phase, in the order they happen within a run.
    pub const ALL: [Phase; 14] = [
        Phase::Start,
        Phase::ModelInit,
        Phase::EpochStart,
        Phase::BatchLoaded,
        Phase::Forward,
        Phase::Backward,
        Phase::OptimizerStep,
        Phase::ZeroGrad,
        Phase::Metrics,
        Phase::CheckpointSave,
        Phase::EmptyCache,
        Phase::EpochEnd,
        Phase::End,
        Phase::OutOfMemory,
    ];

    /// The snake_case name used in JSON and reports.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Start => "start",
            Phase::ModelInit => "model_init",
            Phase::EpochStart => "epoch_start",
            Phase::BatchLoaded => "batch_loaded",
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::OptimizerStep => "optimizer_step",
            Phase::ZeroGrad => "zero_grad",
            Phase::Metrics => "metrics",
            Phase::CheckpointSave => "checkpoint_save",
            Phase::EmptyCache => "empty_cache",
            Phase::EpochEnd => "epoch_end",
            Phase::End => "end",
            Phase::OutOfMemory => "out_of_memory",
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Bytes per [`Category`], a dense array indexed by [`Category::index`].
///
/// Serialised as a JSON object with one key per category name (`{"parameter": 123, ...}`);
/// missing keys read as zero, unknown keys are an error. Reading also accepts eight numbers in
/// [`Category::index`] order (the form measured runs were recorded in before the object form).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CategoryBytes(pub [u64; 8]);

impl CategoryBytes {
    /// All zero.
    pub const ZERO: CategoryBytes = CategoryBytes([0; 8]);

    /// Whether every category holds zero bytes.
    pub fn is_zero(&self) -> bool {
        self.0.iter().all(|&b| b == 0)
    }

    /// Bytes of one category.
    pub fn get(&self, c: Category) -> u64 {
        self.0[c.index()]
    }

    /// Sets the bytes of one category.
    pub fn set(&mut self, c: Category, bytes: u64) {
        self.0[c.index()] = bytes;
    }

    /// Adds bytes to one category.
    pub fn add(&mut self, c: Category, bytes: u64) {
        self.0[c.index()] += bytes;
    }

    /// Sum over all categories.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }

    /// Sum over all categories except [`Category::Cache`] (bytes held by live tensors).
    pub fn live(&self) -> u64 {
        self.total() - self.get(Category::Cache)
    }

    /// `(category, bytes)` pairs in display order.
    pub fn iter(&self) -> impl Iterator<Item = (Category, u64)> + '_ {
        Category::ALL.into_iter().map(|c| (c, self.get(c)))
    }

    /// Element-wise maximum.
    pub fn max(&self, other: &CategoryBytes) -> CategoryBytes {
        let mut out = *self;
        for i in 0..8 {
            out.0[i] = out.0[i].max(other.0[i]);
        }
        out
    }
}

impl Serialize for CategoryBytes {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(8))?;
        for (c, b) in self.iter() {
            m.serialize_entry(c.name(), &b)?;
        }
        m.end()
    }
}

impl<'de> Deserialize<'de> for CategoryBytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = CategoryBytes;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map from category name to bytes, or eight byte counts")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<CategoryBytes, A::Error> {
                let mut out = CategoryBytes::ZERO;
                for (i, slot) in out.0.iter_mut().enumerate() {
                    *slot = seq
                        .next_element()?
                        .ok_or_else(|| serde::de::Error::invalid_length(i, &self))?;
                }
                if seq.next_element::<u64>()?.is_some() {
                    return Err(serde::de::Error::invalid_length(9, &self));
                }
                Ok(out)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<CategoryBytes, A::Error> {
                let mut out = CategoryBytes::ZERO;
                while let Some(key) = map.next_key::<String>()? {
                    let c = Category::from_name(&key).ok_or_else(|| {
                        serde::de::Error::custom(format!("unknown category `{key}`"))
                    })?;
                    out.set(c, map.next_value()?);
                }
                Ok(out)
            }
        }
        d.deserialize_any(V)
    }
}

/// Host memory at one sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostBytes {
    /// Live bytes per category as a counting allocator sees them (file-backed pages excluded).
    pub categories: CategoryBytes,
    /// Anonymous resident memory (RssAnon): heap, preloaded data, pinned buffers.
    pub anon_rss: u64,
    /// File-backed resident memory (RssFile): page cache of memory-mapped files.
    pub file_rss: u64,
    /// Live bytes per category of buffers handed to a device backend for an upload and not yet
    /// freed by it; already included in `categories`. A device backend may keep the host side
    /// of an upload alive after the copy (cubecl-cuda holds it until the copy is fenced, up to
    /// 64 uploads or 64 MiB later), which the program no longer holds. Zero on host backends.
    #[serde(default, skip_serializing_if = "CategoryBytes::is_zero")]
    pub handed_to_device: CategoryBytes,
    /// The part of `categories` that is records kept beside the tensors, not tensors: a
    /// framework's graph nodes, optimizer and module records, a loader's queues (host bytes
    /// allocated outside any op of the tensor backend). Zero where it was not measured.
    #[serde(default, skip_serializing_if = "CategoryBytes::is_zero")]
    pub records: CategoryBytes,
    /// Live bytes per category of tensor data read back from a device into host buffers
    /// outside Rust's allocator (cubecl's page-locked read buffers on CUDA, wgpu's mapped
    /// staging buffers) that the program holds, under the category of the thread that read
    /// them; already included in `categories`. A checkpoint written from a GPU's parameters
    /// holds one model's worth while it writes. Zero on host backends, whose reads are in
    /// Rust's allocator.
    #[serde(default, skip_serializing_if = "CategoryBytes::is_zero")]
    pub device_reads: CategoryBytes,
    /// Resident bytes of the memory-mapped data set's own mappings: its share of `file_rss`,
    /// without the binary's and libraries' pages. `Some(0)` when the data set is not mapped;
    /// `None` where it was not measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_file_rss: Option<u64>,
}

impl HostBytes {
    /// Total resident memory (anonymous + file-backed).
    pub fn rss(&self) -> u64 {
        self.anon_rss + self.file_rss
    }

    /// Live bytes of `category` the program itself holds: those handed to a device backend for
    /// an upload taken out.
    pub fn held(&self, category: Category) -> u64 {
        self.categories
            .get(category)
            .saturating_sub(self.handed_to_device.get(category))
    }

    /// Resident bytes of the memory-mapped data set: [`HostBytes::data_file_rss`] where
    /// measured, else the whole `file_rss`.
    pub fn data_rss(&self) -> u64 {
        self.data_file_rss.unwrap_or(self.file_rss)
    }
}

/// Device memory at one sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceBytes {
    /// Bytes per category. `cache` holds `reserved - allocated`.
    pub categories: CategoryBytes,
    /// Bytes in allocated blocks (PyTorch's `memory_allocated`).
    pub allocated: u64,
    /// Bytes in segments obtained from the device (PyTorch's `memory_reserved`).
    pub reserved: u64,
    /// Highest `allocated` seen since the previous sample (inclusive of this one).
    #[serde(default)]
    pub peak_allocated: u64,
    /// Highest `reserved` seen since the previous sample (inclusive of this one).
    #[serde(default)]
    pub peak_reserved: u64,
}

/// One sample of a timeline, taken when `phase` has just completed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sample {
    /// The phase that just completed.
    pub phase: Phase,
    /// Optimizer step index (0-based; the step in progress or just finished).
    pub step: u64,
    /// Epoch index (0-based).
    pub epoch: u64,
    /// Micro-batch index within the step under gradient accumulation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub micro_batch: Option<u32>,
    /// Wall-clock time since the start of the run in microseconds (measured runs), or a
    /// synthetic monotonic clock (simulated runs).
    #[serde(default)]
    pub time_us: f64,
    /// Host memory.
    pub host: HostBytes,
    /// Device memory.
    pub device: DeviceBytes,
}

impl Sample {
    /// A sample taken after `phase` of optimizer step `step` (epoch 0, no micro-batch, time 0)
    /// with no bytes yet.
    pub fn new(phase: Phase, step: u64) -> Sample {
        Sample {
            phase,
            step,
            epoch: 0,
            micro_batch: None,
            time_us: 0.0,
            host: HostBytes::default(),
            device: DeviceBytes::default(),
        }
    }
}

/// Which memory a series or peak refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Domain {
    /// Host memory.
    Host,
    /// Device memory.
    Device,
}

impl Domain {
    /// The snake_case name.
    pub fn name(self) -> &'static str {
        match self {
            Domain::Host => "host",
            Domain::Device => "device",
        }
    }
}

/// Descriptive metadata of a timeline.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimelineMeta {
    /// A short name (the plan or scenario name).
    pub name: String,
    /// What produced the timeline ("trainmem-sim 0.1.0", "burn 0.21.0 flex", ...).
    #[serde(default)]
    pub producer: String,
    /// The device the bytes refer to ("simulated cuda 24 GiB", "cpu", ...).
    #[serde(default)]
    pub device: String,
    /// Device capacity in bytes, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_capacity: Option<u64>,
    /// Host capacity in bytes, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_capacity: Option<u64>,
    /// Free-form key/value notes (plan path, allocator config, batch size, ...).
    #[serde(default)]
    pub notes: BTreeMap<String, String>,
    /// Measured runs: the process's own host memory when the run began, before it built
    /// anything (the runtime, its thread pools, the probe's buffers, and whatever earlier work
    /// in the same process left resident). Figures read from the OS (RssAnon, RssFile) are
    /// relative to this; `None` for simulated timelines and for older files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline: Option<HostBytes>,
}

/// A memory timeline: samples at phase boundaries, from a simulation or a measured run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Timeline {
    /// Simulated or measured.
    pub source: Source,
    /// Metadata.
    pub meta: TimelineMeta,
    /// Samples in time order.
    pub samples: Vec<Sample>,
}

/// The highest value a quantity reached, and the sample where it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeakAt {
    /// The peak value in bytes.
    pub bytes: u64,
    /// Index of the sample in [`Timeline::samples`].
    pub sample: usize,
}

/// Errors reading or writing a timeline.
#[derive(Debug, thiserror::Error)]
pub enum TimelineError {
    /// The JSON was malformed or did not match the schema.
    #[error("timeline JSON: {0}")]
    Json(#[from] serde_json::Error),
}

impl Timeline {
    /// The domain that holds this timeline's tensors: the device when any sample recorded
    /// device bytes (a category, or reserved memory), the host otherwise (a CPU backend).
    pub fn tensor_domain(&self) -> Domain {
        let on_device = self
            .samples
            .iter()
            .any(|s| s.device.categories.total() > 0 || s.device.reserved > 0);
        if on_device {
            Domain::Device
        } else {
            Domain::Host
        }
    }

    /// An empty timeline.
    pub fn new(source: Source, meta: TimelineMeta) -> Timeline {
        Timeline {
            source,
            meta,
            samples: Vec::new(),
        }
    }

    /// Appends a sample.
    pub fn push(&mut self, sample: Sample) {
        self.samples.push(sample);
    }

    /// Per-category bytes of a sample in a domain.
    pub fn categories(&self, sample: usize, domain: Domain) -> CategoryBytes {
        let s = &self.samples[sample];
        match domain {
            Domain::Host => s.host.categories,
            Domain::Device => s.device.categories,
        }
    }

    /// The series of one category: one value per sample.
    pub fn series(&self, domain: Domain, category: Category) -> Vec<u64> {
        (0..self.samples.len())
            .map(|i| self.categories(i, domain).get(category))
            .collect()
    }

    /// The total series of a domain: device `reserved` (allocated + cache), or host RSS.
    pub fn total_series(&self, domain: Domain) -> Vec<u64> {
        self.samples
            .iter()
            .map(|s| match domain {
                Domain::Host => s.host.rss(),
                Domain::Device => s.device.reserved,
            })
            .collect()
    }

    /// The peak of each category over the whole timeline (each category's own maximum, which
    /// may fall at different samples).
    pub fn peak_per_category(&self, domain: Domain) -> CategoryBytes {
        (0..self.samples.len()).fold(CategoryBytes::ZERO, |acc, i| {
            acc.max(&self.categories(i, domain))
        })
    }

    /// Peak of a category and where it happened; `None` for an empty timeline.
    pub fn peak_of(&self, domain: Domain, category: Category) -> Option<PeakAt> {
        peak_of_series(&self.series(domain, category))
    }

    /// Peak device `allocated`, counting the in-phase peaks recorded in each sample.
    pub fn peak_allocated(&self) -> Option<PeakAt> {
        peak_of_series(
            &self
                .samples
                .iter()
                .map(|s| s.device.peak_allocated.max(s.device.allocated))
                .collect::<Vec<_>>(),
        )
    }

    /// Peak device `reserved`, counting the in-phase peaks recorded in each sample.
    pub fn peak_reserved(&self) -> Option<PeakAt> {
        peak_of_series(
            &self
                .samples
                .iter()
                .map(|s| s.device.peak_reserved.max(s.device.reserved))
                .collect::<Vec<_>>(),
        )
    }

    /// Peak host RSS (anonymous + file-backed).
    pub fn peak_host_rss(&self) -> Option<PeakAt> {
        peak_of_series(&self.total_series(Domain::Host))
    }

    /// Indices of the samples taken at a phase, in time order.
    pub fn indices_at(&self, phase: Phase) -> Vec<usize> {
        self.samples
            .iter()
            .enumerate()
            .filter(|(_, s)| s.phase == phase)
            .map(|(i, _)| i)
            .collect()
    }

    /// The samples taken at a phase.
    pub fn at_phase(&self, phase: Phase) -> impl Iterator<Item = &Sample> + '_ {
        self.samples.iter().filter(move |s| s.phase == phase)
    }

    /// The index of the first sample taken after `phase` of optimizer step `step` (see
    /// [Finding samples](self#finding-samples)).
    pub fn first_index(&self, step: u64, phase: Phase) -> Option<usize> {
        self.samples
            .iter()
            .position(|s| s.step == step && s.phase == phase)
    }

    /// The index of the last sample taken after `phase` of optimizer step `step` (see
    /// [Finding samples](self#finding-samples)).
    pub fn last_index(&self, step: u64, phase: Phase) -> Option<usize> {
        self.samples
            .iter()
            .rposition(|s| s.step == step && s.phase == phase)
    }

    /// The last sample taken after `phase` of optimizer step `step`: the state the step
    /// leaves once all its micro-batches are done (see [Finding samples](self#finding-samples)).
    pub fn find(&self, step: u64, phase: Phase) -> Option<&Sample> {
        self.last_index(step, phase).map(|i| &self.samples[i])
    }

    /// Serialises to pretty JSON.
    pub fn to_json(&self) -> Result<String, TimelineError> {
        Ok(serde_json::to_string_pretty(self)?)
    }

    /// Parses the JSON form.
    pub fn from_json(text: &str) -> Result<Timeline, TimelineError> {
        Ok(serde_json::from_str(text)?)
    }
}

#[cfg(test)]
mod lookup_tests {
    use super::*;

    /// Step 0 with two micro-batches (forward, backward each), then its optimizer step.
    fn accumulated() -> Timeline {
        let mut t = Timeline::new(Source::Simulated, TimelineMeta::default());
        for (phase, micro, act) in [
            (Phase::Forward, 0, 10),
            (Phase::Backward, 0, 1),
            (Phase::Forward, 1, 10),
            (Phase::Backward, 1, 2),
        ] {
            let mut s = Sample::new(phase, 0);
            s.micro_batch = Some(micro);
            s.host.categories.set(Category::Activation, act);
            t.push(s);
        }
        t.push(Sample::new(Phase::OptimizerStep, 0));
        t
    }

    #[test]
    fn first_last_and_find_say_which_micro_batch() {
        let t = accumulated();
        assert_eq!(t.first_index(0, Phase::Forward), Some(0));
        assert_eq!(t.last_index(0, Phase::Forward), Some(2));
        assert_eq!(
            t.find(0, Phase::Backward).and_then(|s| s.micro_batch),
            Some(1)
        );
        assert_eq!(t.indices_at(Phase::Backward), vec![1, 3]);
        assert_eq!(t.first_index(1, Phase::Forward), None);
        assert_eq!(t.find(0, Phase::OptimizerStep).map(|s| s.step), Some(0));
    }

    #[test]
    fn a_peak_reached_twice_is_reported_at_its_first_sample() {
        let t = accumulated();
        let peak = t
            .peak_of(Domain::Host, Category::Activation)
            .expect("a peak");
        assert_eq!((peak.bytes, peak.sample), (10, 0));
    }
}

fn peak_of_series(values: &[u64]) -> Option<PeakAt> {
    let mut best: Option<PeakAt> = None;
    for (i, &v) in values.iter().enumerate() {
        if best.is_none_or(|b| v > b.bytes) {
            best = Some(PeakAt {
                bytes: v,
                sample: i,
            });
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(phase: Phase, step: u64, act: u64, alloc: u64) -> Sample {
        let mut cats = CategoryBytes::ZERO;
        cats.set(Category::Activation, act);
        Sample {
            phase,
            step,
            epoch: 0,
            micro_batch: None,
            time_us: step as f64,
            host: HostBytes::default(),
            device: DeviceBytes {
                categories: cats,
                allocated: alloc,
                reserved: alloc,
                peak_allocated: alloc,
                peak_reserved: alloc,
            },
        }
    }

    #[test]
    fn json_round_trip_and_category_map_form() {
        let mut t = Timeline::new(
            Source::Simulated,
            TimelineMeta {
                name: "t".into(),
                ..Default::default()
            },
        );
        t.push(sample(Phase::Forward, 0, 10, 20));
        t.push(sample(Phase::Backward, 0, 3, 40));
        t.push(sample(Phase::OptimizerStep, 0, 0, 60));
        let json = t.to_json().unwrap();
        // The exchange format, field by field: snake_case phases and source, categories as a
        // map with every category's name, `micro_batch` left out when absent.
        assert!(json.contains("\"activation\": 10"), "{json}");
        assert!(json.contains("\"phase\": \"forward\""), "{json}");
        assert!(json.contains("\"phase\": \"backward\""), "{json}");
        assert!(json.contains("\"phase\": \"optimizer_step\""), "{json}");
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["source"], "simulated");
        let phases: Vec<&str> = v["samples"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["phase"].as_str().unwrap())
            .collect();
        assert_eq!(phases, ["forward", "backward", "optimizer_step"]);
        let cats = v["samples"][0]["device"]["categories"].as_object().unwrap();
        let mut names: Vec<&str> = cats.keys().map(String::as_str).collect();
        names.sort_unstable();
        let mut expected: Vec<&str> = Category::ALL.iter().map(|c| c.name()).collect();
        expected.sort_unstable();
        assert_eq!(names, expected);
        assert_eq!(cats["activation"], 10);
        assert_eq!(v["samples"][2]["device"]["allocated"], 60);
        assert!(v["samples"][0].get("micro_batch").is_none(), "{json}");
        let back = Timeline::from_json(&json).unwrap();
        assert_eq!(back, t);
    }

    /// Every phase's JSON name is its [`Phase::name`], both ways.
    #[test]
    fn phases_serialise_as_their_names() {
        for p in Phase::ALL {
            let json = serde_json::to_string(&p).unwrap();
            assert_eq!(json, format!("\"{}\"", p.name()));
            assert_eq!(serde_json::from_str::<Phase>(&json).unwrap(), p);
        }
        assert_eq!(Phase::OutOfMemory.name(), "out_of_memory");
        assert_eq!(Phase::CheckpointSave.to_string(), "checkpoint_save");
    }

    #[test]
    fn unknown_category_is_rejected() {
        let err = serde_json::from_str::<CategoryBytes>(r#"{"weights": 3}"#).unwrap_err();
        assert!(err.to_string().contains("weights"), "{err}");
        let ok: CategoryBytes = serde_json::from_str(r#"{"gradient": 3}"#).unwrap();
        assert_eq!(ok.get(Category::Gradient), 3);
        assert_eq!(ok.total(), 3);
    }

    #[test]
    fn category_bytes_read_as_eight_numbers_too() {
        let ok: CategoryBytes = serde_json::from_str("[1, 2, 3, 4, 5, 6, 7, 8]").unwrap();
        assert_eq!(ok.get(Category::Parameter), 1);
        assert_eq!(ok.total(), 36);
        let back: CategoryBytes =
            serde_json::from_str(&serde_json::to_string(&ok).unwrap()).unwrap();
        assert_eq!(back, ok);
        for bad in [
            "[1, 2, 3]",
            "[1, 2, 3, 4, 5, 6, 7, 8, 9]",
            "[-1, 2, 3, 4, 5, 6, 7, 8]",
        ] {
            assert!(serde_json::from_str::<CategoryBytes>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn peaks_and_series() {
        let mut t = Timeline::new(Source::Measured, TimelineMeta::default());
        t.push(sample(Phase::Forward, 0, 10, 20));
        t.push(sample(Phase::Backward, 0, 30, 15));
        t.push(sample(Phase::Forward, 1, 10, 50));
        assert_eq!(
            t.series(Domain::Device, Category::Activation),
            vec![10, 30, 10]
        );
        assert_eq!(
            t.peak_of(Domain::Device, Category::Activation),
            Some(PeakAt {
                bytes: 30,
                sample: 1
            })
        );
        assert_eq!(t.peak_allocated().unwrap().sample, 2);
        assert_eq!(t.indices_at(Phase::Forward), vec![0, 2]);
        assert_eq!(t.find(1, Phase::Forward).unwrap().device.allocated, 50);
        assert_eq!(
            t.peak_per_category(Domain::Device)
                .get(Category::Activation),
            30
        );
    }
}
