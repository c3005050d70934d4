//! The measurement side of a real run: samples taken at phase boundaries, after a sync.
//!
//! A [`Probe`] reads three sources each time a phase completes:
//!
//! * **host, exact**: live bytes per [`Category`] from trainmem-probe's counting global
//!   allocator, and the peak of each category since the previous sample (so a spike inside a
//!   phase, e.g. while a checkpoint is serialised, is not lost between boundaries). The
//!   allocator is installed by the *binary* (`#[global_allocator]`); when it is not, the probe
//!   notices ([`trainmem_probe::is_installed`]) and reports host categories as unavailable
//!   (`None`) rather than as zeros.
//! * **host, as the OS sees it**: the `/proc/self/status` breakdown (VmRSS, RssAnon, RssFile,
//!   RssShmem, VmHWM), `None` where `/proc` is absent.
//! * **device**: whatever the backend can report through [`MemoryBackend`] (trainmem-track). On CUDA (feature
//!   `cuda`) that is cubecl's `memory_usage()` (bytes in use ≈ PyTorch's `memory_allocated`,
//!   bytes reserved ≈ `memory_reserved`) and the driver's free and total. CPU backends (Flex)
//!   keep tensors in ordinary heap memory, so they report `None` here and everything shows up
//!   in the host counts.
//!
//! Every sample first calls `B::sync(&device)`, so queued work has finished and the numbers
//! describe the phase that just completed, never a timer on another thread.

use std::time::Instant;

use serde::{Deserialize, Serialize};
use trainmem_core::Category;
use trainmem_core::CategoryBytes;
use trainmem_core::timeline::Phase;
use trainmem_probe::ProcStatus;
use trainmem_track::{DeviceFigures, MemoryBackend, TrackedBytes};

use crate::BurnRunError;

/// One measurement, taken when `phase` has just completed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProbeSample {
    /// The phase that just completed.
    pub phase: Phase,
    /// Optimizer step index (0-based).
    pub step: u64,
    /// Epoch index (0-based).
    pub epoch: u64,
    /// Micro-batch within the step under gradient accumulation.
    pub micro_batch: Option<u32>,
    /// Microseconds since the probe was created.
    pub time_us: f64,
    /// Live host bytes per category; `None` when no counting allocator is installed.
    pub host: Option<CategoryBytes>,
    /// Peak live host bytes per category since the previous sample (this one included);
    /// `None` when no counting allocator is installed.
    pub host_peak: Option<CategoryBytes>,
    /// Peak of all host categories together since the previous sample.
    pub host_total_peak: Option<u64>,
    /// Live host bytes per category handed to a device backend for an upload and not freed by
    /// it yet (part of `host`; see [`trainmem_probe::mark_handed_to_device`]); `None` when no
    /// counting allocator is installed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_handed_to_device: Option<CategoryBytes>,
    /// Live host bytes per category that are records beside the tensors, not tensors (part of
    /// `host`): allocated outside any op of the backend, less the host data tensors took over
    /// ([`trainmem_track::records_beside`]); `None` when no counting allocator is installed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_records: Option<CategoryBytes>,
    /// Live host bytes per category of tensor data read back from the device into buffers
    /// outside Rust's allocator, which the counting allocator does not see
    /// ([`trainmem_track::host_reads`]: cubecl's page-locked read buffers); not part of `host`.
    #[serde(default, skip_serializing_if = "CategoryBytes::is_zero")]
    pub host_device_reads: CategoryBytes,
    /// Resident bytes of the data set's memory-mapped files (their mappings' share of RssFile,
    /// [`trainmem_probe::mapped::mapped_rss`]); `None` when the run reads no data files or
    /// `/proc/self/smaps` is unavailable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_file_rss: Option<u64>,
    /// The OS view of this process's memory; `None` where `/proc` is unavailable.
    pub rss: Option<ProcStatus>,
    /// Device figures; `None` on CPU backends.
    pub device: Option<DeviceFigures>,
    /// The buffers the run's tensors hold per category, as trainmem-track's [`Tracked`] layer
    /// counts them (live at the sample, and peaks since the previous sample); `None` when the
    /// run was not tracked.
    ///
    /// [`Tracked`]: trainmem_track::Tracked
    #[serde(default)]
    pub tracked: Option<TrackedBytes>,
    /// With an allocation trace running ([`crate::RunOptions::trace_allocations`]): how many
    /// trace events precede this sample, so the trace can be cut at phase boundaries.
    pub trace_events: Option<usize>,
}

impl ProbeSample {
    /// Live host bytes of one category (`None` without the counting allocator).
    pub fn host_bytes(&self, category: Category) -> Option<u64> {
        self.host.map(|h| h.get(category))
    }

    /// Peak host bytes of one category since the previous sample.
    pub fn host_peak_bytes(&self, category: Category) -> Option<u64> {
        self.host_peak.map(|h| h.get(category))
    }

    /// Live host bytes, all categories together.
    pub fn host_total(&self) -> Option<u64> {
        self.host.map(|h| h.total())
    }
}

/// Whether host bytes per category can be measured in this process: a
/// [`trainmem_probe::CountingAlloc`] is the global allocator.
///
/// The counters only move once the installed allocator has served an allocation, so this
/// allocates a small probe block first.
pub fn host_counting_available() -> bool {
    let probe = std::hint::black_box(vec![0u8; 64]);
    drop(probe);
    trainmem_probe::is_installed()
}

/// Samples memory at phase boundaries of one run.
#[derive(Debug)]
pub struct Probe<B: MemoryBackend> {
    device: B::Device,
    start: Instant,
    counting: bool,
    samples: Vec<ProbeSample>,
    loader: Option<trainmem_loader::MemoryWatch>,
    loader_samples: Vec<trainmem_loader::LoaderMemory>,
    data_files: Option<Vec<std::path::PathBuf>>,
}

impl<B: MemoryBackend> Probe<B> {
    /// A probe for `device`; resets the per-category peaks so the first sample's peaks start
    /// here.
    pub fn new(device: &B::Device) -> Probe<B> {
        Probe::with_capacity(device, 0)
    }

    /// A probe with room for `samples` samples reserved up front, so that growing its own
    /// sample vector does not show up as memory growth between the run's phases.
    pub fn with_capacity(device: &B::Device, samples: usize) -> Probe<B> {
        let counting = host_counting_available();
        if counting {
            trainmem_probe::reset_peaks();
        }
        if B::tracked_bytes().is_some() {
            trainmem_track::reset_peaks();
        }
        Probe {
            device: device.clone(),
            start: Instant::now(),
            counting,
            samples: Vec::with_capacity(samples),
            loader: None,
            loader_samples: Vec::new(),
            data_files: None,
        }
    }

    /// Reads trainmem-loader's own accounting at every later sample too
    /// ([`Self::loader_samples`]); call it before the first sample so the two lists line up.
    pub fn watch_loader(&mut self, watch: trainmem_loader::MemoryWatch) {
        self.loader = Some(watch);
        self.loader_samples.reserve(self.samples.capacity());
    }

    /// Reads the resident bytes of the data set's files (their own mappings) at every later
    /// sample too ([`ProbeSample::data_file_rss`]).
    pub fn watch_data_files(&mut self, files: Vec<std::path::PathBuf>) {
        self.data_files = Some(files);
    }

    /// The loader readings, one per sample since [`Self::watch_loader`].
    pub fn loader_samples(&self) -> &[trainmem_loader::LoaderMemory] {
        &self.loader_samples
    }

    /// Consumes the probe, returning its samples and the loader readings.
    pub fn into_parts(self) -> (Vec<ProbeSample>, Vec<trainmem_loader::LoaderMemory>) {
        (self.samples, self.loader_samples)
    }

    /// Whether host categories are measured (a counting allocator is installed).
    pub fn counts_host(&self) -> bool {
        self.counting
    }

    /// Syncs the device, then records a sample for the phase that just completed.
    pub fn sample(
        &mut self,
        phase: Phase,
        step: u64,
        epoch: u64,
        micro_batch: Option<u32>,
    ) -> Result<&ProbeSample, BurnRunError> {
        B::sync(&self.device).map_err(|e| BurnRunError::Backend(e.to_string()))?;
        let snap = self.counting.then(trainmem_probe::snapshot);
        let host_records = snap.as_ref().map(trainmem_track::records_beside);
        // The tracker's figures right after the host's, and its records from the same host
        // snapshot: a loader's workers may allocate meanwhile.
        let tracked = B::tracked_bytes().map(|mut t| {
            if let Some(records) = host_records {
                t.records = records;
            }
            t
        });
        let (host, host_peak, host_total_peak, host_handed_to_device) = match snap {
            Some(snap) => {
                trainmem_probe::reset_peaks();
                (
                    Some(CategoryBytes(snap.live.map(|v| v as u64))),
                    Some(CategoryBytes(snap.peak.map(|v| v as u64))),
                    Some(snap.total_peak as u64),
                    Some(CategoryBytes(snap.handed_to_device.map(|v| v as u64))),
                )
            }
            None => (None, None, None, None),
        };
        let data_file_rss = self
            .data_files
            .as_deref()
            .and_then(|files| trainmem_probe::mapped::mapped_rss(files).ok());
        if tracked.is_some() {
            trainmem_track::reset_peaks();
        }
        let sample = ProbeSample {
            phase,
            step,
            epoch,
            micro_batch,
            time_us: self.start.elapsed().as_secs_f64() * 1e6,
            host,
            host_peak,
            host_total_peak,
            host_handed_to_device,
            host_records,
            host_device_reads: trainmem_track::host_reads::live(),
            data_file_rss,
            rss: trainmem_probe::rss::read().ok(),
            device: B::device_memory(&self.device),
            tracked,
            trace_events: trainmem_probe::trace_enabled().then(trainmem_probe::trace_position),
        };
        self.samples.push(sample);
        if let Some(w) = &self.loader {
            self.loader_samples.push(w.current());
        }
        let last = self.samples.len() - 1;
        Ok(&self.samples[last])
    }

    /// The samples so far.
    pub fn samples(&self) -> &[ProbeSample] {
        &self.samples
    }
}
