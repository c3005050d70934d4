//! The library entry point: run a user's own training code on a fresh Meta device and get its
//! memory timeline.
//!
//! [`predict`] makes a fresh [`MetaDevice`], hands the closure a [`Recorder`] for it, and
//! returns a [`MetaRun`]: a `trainmem_core::Timeline` with one sample per phase the closure
//! marked, plus the per-category peaks over the whole run (including peaks inside phases,
//! which boundary samples alone would miss).
//!
//! With exact accounting, Meta models burn's CPU backend, whose tensors are host memory, so the
//! bytes go to each sample's host categories (as a measured run on Flex with the counting
//! allocator reports them) and the device domain stays zero. With a device memory model
//! ([`crate::CachingModel`]) the bytes go to the device categories instead, with the model's
//! allocated and reserved totals and `cache = reserved − allocated`. RSS stays zero.
//!
//! Where the process counts its heap (trainmem-probe's `CountingAlloc` is the global
//! allocator, as in trainmem's binaries), every sample also carries the records the closure's
//! training code keeps beside its tensors — burn's autodiff graph nodes, its optimizers' and
//! modules' records — per category, in `host.records` and added to `host.categories`: burn
//! runs that code unchanged on Meta, and Meta's own structures are allocated inside its ops
//! ([`trainmem_probe::BackendScope`]), so what is left outside them is those records, at the
//! sizes a measured run has ([`crate::tensor::MEASURED_PRIMITIVE_SIZE`]). The timeline's source is
//! [`Source::Simulated`] (it is a prediction) with producer `trainmem-meta`.

use std::time::Instant;

use trainmem_core::Category;
use trainmem_core::timeline::{CategoryBytes, Phase, Sample, Source, Timeline, TimelineMeta};
use trainmem_probe::CategoryScope;

use crate::device::MetaDevice;
use crate::memory::MemoryStats;

/// What [`predict`] returns.
#[derive(Debug, Clone)]
pub struct MetaRun {
    /// One sample per marked phase.
    pub timeline: Timeline,
    /// Highest live bytes each category reached during the run (each on its own).
    pub peak: CategoryBytes,
    /// Highest live bytes of all categories together.
    pub total_peak: u64,
    /// The device's final figures (live bytes left when the closure returned, counts).
    pub end: MemoryStats,
}

/// Marks the phases of a run on a Meta device; handed to the closure given to [`predict`].
#[derive(Debug)]
pub struct Recorder {
    device: MetaDevice,
    timeline: Timeline,
    step: u64,
    epoch: u64,
    start: Instant,
}

impl Recorder {
    fn new(name: &str, device: MetaDevice) -> Recorder {
        let meta = TimelineMeta {
            name: name.to_string(),
            producer: format!("trainmem-meta {} (burn 0.21.0)", env!("CARGO_PKG_VERSION")),
            device: "meta (cpu tensor bytes)".to_string(),
            ..TimelineMeta::default()
        };
        Recorder {
            device,
            timeline: Timeline::new(Source::Simulated, meta),
            step: 0,
            epoch: 0,
            start: Instant::now(),
        }
    }

    /// The Meta device to build the model and tensors on.
    pub fn device(&self) -> MetaDevice {
        self.device
    }

    /// Sets the optimizer step the next samples belong to.
    pub fn set_step(&mut self, step: u64) {
        self.step = step;
    }

    /// Sets the epoch the next samples belong to.
    pub fn set_epoch(&mut self, epoch: u64) {
        self.epoch = epoch;
    }

    /// Records a sample: `phase` has just completed.
    pub fn sample(&mut self, phase: Phase) {
        let stats = self.device.stats();
        let mut sample = Sample::new(phase, self.step);
        sample.epoch = self.epoch;
        sample.time_us = self.start.elapsed().as_secs_f64() * 1e6;
        match self.device.ledger().device_totals() {
            // A device model (a caching allocator): tensors are device memory.
            Some(totals) => {
                let device = &mut sample.device;
                for category in Category::ALL {
                    device.categories.set(category, stats.live_bytes(category));
                }
                let cached = totals.reserved.saturating_sub(totals.allocated);
                device.categories.set(Category::Cache, cached);
                device.allocated = totals.allocated;
                device.reserved = totals.reserved;
                device.peak_allocated = totals.peak_allocated;
                device.peak_reserved = totals.peak_reserved;
            }
            // Exact accounting of the CPU backend: tensors are host memory.
            None => {
                let host = &mut sample.host;
                for category in Category::ALL {
                    host.categories.set(category, stats.live_bytes(category));
                }
            }
        }
        // The records the training code keeps beside its tensors (burn's graph, optimizer and
        // module records), where the process counts its heap: host memory with any memory
        // model, added to the host categories as a counting allocator would see them.
        if trainmem_probe::is_installed() {
            let heap = trainmem_probe::snapshot();
            let host = &mut sample.host;
            for category in Category::ALL {
                let records = heap.outside_backend(category) as u64;
                host.records.set(category, records);
                host.categories
                    .set(category, host.categories.get(category) + records);
            }
        }
        self.timeline.push(sample);
    }

    /// Runs `f` with the thread tagged `category` (the way measured runs tag their phases),
    /// then records a sample for `phase`.
    pub fn phase<R>(&mut self, phase: Phase, category: Category, f: impl FnOnce() -> R) -> R {
        let out = {
            let _tag = CategoryScope::enter(category);
            f()
        };
        self.sample(phase);
        out
    }

    /// The timeline so far.
    pub fn timeline(&self) -> &Timeline {
        &self.timeline
    }
}

/// Runs `run` on a fresh Meta device and returns its timeline and peaks (see the module docs).
pub fn predict(name: &str, run: impl FnOnce(&mut Recorder)) -> MetaRun {
    predict_on(name, MetaDevice::new(), run)
}

/// Like [`predict`], on a device the caller made (e.g. with an [`crate::AllocationHook`]).
pub fn predict_on(name: &str, device: MetaDevice, run: impl FnOnce(&mut Recorder)) -> MetaRun {
    let mut recorder = Recorder::new(name, device);
    recorder.sample(Phase::Start);
    run(&mut recorder);
    let end = device.stats();
    let mut peak = CategoryBytes::ZERO;
    for category in Category::ALL {
        peak.set(category, end.peak_bytes(category));
    }
    MetaRun {
        timeline: recorder.timeline,
        peak,
        total_peak: end.total_peak,
        end,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Meta;
    use burn::tensor::{Distribution, Tensor};

    #[test]
    fn samples_carry_the_step_and_epoch_the_recorder_was_given() {
        let run = predict("steps", |rec| {
            for step in 0..3 {
                rec.set_epoch(step / 2);
                rec.set_step(step);
                rec.sample(Phase::OptimizerStep);
            }
        });
        let at: Vec<(u64, u64)> = run.timeline.samples[1..]
            .iter()
            .map(|s| (s.step, s.epoch))
            .collect();
        assert_eq!(at, [(0, 0), (1, 0), (2, 1)]);
    }

    #[test]
    fn phases_become_samples_with_the_bytes_of_their_category() {
        let run = predict("two tensors", |rec| {
            let device = rec.device();
            let w = rec.phase(Phase::ModelInit, Category::Parameter, || {
                Tensor::<Meta, 2>::random([8, 8], Distribution::Default, &device)
            });
            let y = rec.phase(Phase::Forward, Category::Activation, || {
                let scratch = w.clone().exp();
                w.clone().matmul(scratch)
            });
            drop((w, y));
            rec.sample(Phase::End);
        });
        let phases: Vec<Phase> = run.timeline.samples.iter().map(|s| s.phase).collect();
        assert_eq!(
            phases,
            [Phase::Start, Phase::ModelInit, Phase::Forward, Phase::End]
        );
        let forward = &run.timeline.samples[2].host.categories;
        assert_eq!(forward.get(Category::Parameter), 256);
        assert_eq!(
            forward.get(Category::Activation),
            256,
            "exp's scratch was freed"
        );
        assert_eq!(
            run.peak.get(Category::Activation),
            512,
            "but it counts at the peak"
        );
        assert_eq!(run.timeline.samples[3].host.categories.total(), 0);
        assert_eq!(run.total_peak, 768);
    }

    #[test]
    fn with_a_caching_model_the_bytes_are_device_bytes_with_the_cache() {
        use crate::CachingModel;
        use trainmem_alloc::{CachingAllocator, SimulatedDevice};
        let model = CachingModel::new(CachingAllocator::new(SimulatedDevice::new(1 << 30)));
        let run = predict_on("cached", model.device(), |rec| {
            let device = rec.device();
            let big = rec.phase(Phase::Forward, Category::Activation, || {
                Tensor::<Meta, 2>::random([768, 1024], Distribution::Default, &device)
            });
            drop(big);
            rec.sample(Phase::Backward);
        });
        let forward = &run.timeline.samples[1].device;
        assert_eq!(forward.categories.get(Category::Activation), 3 << 20);
        assert_eq!((forward.allocated, forward.reserved), (3 << 20, 20 << 20));
        assert_eq!(forward.categories.get(Category::Cache), 17 << 20);
        let backward = &run.timeline.samples[2].device;
        assert_eq!((backward.allocated, backward.reserved), (0, 20 << 20));
        // Peaks cover the interval since the previous sample, which began with the block live.
        assert_eq!(backward.peak_allocated, 3 << 20);
        assert_eq!(run.timeline.samples[0].device.peak_allocated, 0);
        assert_eq!(run.timeline.samples[1].host.categories.total(), 0);
    }
}
