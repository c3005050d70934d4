//! Sampling: the timeline, one sample per phase boundary, and the allocated peak with when
//! it happened and what it held.

use trainmem_core::Category;

use super::Runner;
use crate::engine::When;
use trainmem_core::plan::DeviceKind;
use trainmem_core::timeline::{CategoryBytes, DeviceBytes, Phase, Sample, Timeline};

/// The timeline and the allocated peak so far.
pub(super) struct Recorder {
    pub(super) timeline: Timeline,
    /// The highest allocated peak seen at a sample.
    last_peak: u64,
    /// When it happened.
    pub(super) peak_when: Option<When>,
    /// Bytes per category then (`cache` = reserved − allocated).
    pub(super) peak_breakdown: CategoryBytes,
    /// Per category, the most bytes its tensors asked for at a sample (before rounding).
    pub(super) tensor_peaks: CategoryBytes,
}

impl Recorder {
    /// An empty record into `timeline`.
    pub(super) fn new(timeline: Timeline) -> Recorder {
        Recorder {
            timeline,
            last_peak: 0,
            peak_when: None,
            peak_breakdown: CategoryBytes::ZERO,
            tensor_peaks: CategoryBytes::ZERO,
        }
    }

    /// Notes the store's allocated `peak` (with its `breakdown` and the reserved peak) if it
    /// is higher than any before.
    fn note_peak(&mut self, peak: u64, breakdown: [u64; 8], peak_reserved: u64, when: When) {
        if peak > self.last_peak {
            self.last_peak = peak;
            self.peak_when = Some(when);
            let mut b = CategoryBytes(breakdown);
            b.set(Category::Cache, peak_reserved.saturating_sub(peak));
            self.peak_breakdown = b;
        }
    }
}

impl Runner<'_> {
    /// Enters `phase` (named by an out-of-memory report until the next one).
    pub(super) fn begin(&mut self, phase: Phase) {
        self.clock.begin(phase);
    }

    /// Samples device and host memory at the end of `phase`.
    pub(super) fn sample(&mut self, phase: Phase) {
        let mem = self.store.memory();
        let allocated = if mem.counts_tensor_sizes() {
            self.store.live_total()
        } else {
            mem.allocated()
        };
        let reserved = mem.reserved();
        let asked = self.store.live_requested_by_category();
        for (peak, now) in self.recorder.tensor_peaks.0.iter_mut().zip(asked) {
            *peak = (*peak).max(now);
        }
        let mut cats = CategoryBytes(self.store.live_by_category());
        cats.set(Category::Cache, reserved.saturating_sub(allocated));
        let peak_allocated = self.store.take_window_peak();
        let peak_reserved = self.store.memory_mut().take_reserved_peak().max(reserved);
        let (peak, breakdown) = self.store.peak();
        let when = self.clock.when(phase);
        self.recorder
            .note_peak(peak, breakdown, peak_reserved, when);
        self.host.moment.graph_records = CategoryBytes(self.store.live_host_by_category());
        let device_on_host = (self.spec.plan.device.kind == DeviceKind::Cpu).then_some(&cats);
        let host = self.host.model.at(&self.host.moment, device_on_host);
        let time = self.store.allocation_count();
        self.recorder.timeline.push(Sample {
            phase,
            step: self.clock.step,
            epoch: self.clock.epoch,
            micro_batch: self.clock.micro,
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
}
