//! Host-memory model of the data pipeline: loader queues, worker scratch and overhead,
//! pinned staging, the data set (memory-mapped or preloaded), checkpoint serialisation.
//!
//! * In flight with `w > 0` workers: `w × prefetch_factor` batches (+ a pinned copy of each,
//!   rounded up to a power of two as a pinned host caching allocator does, when pinning).
//! * Augmentation scratch: each *busy* worker holds `augmentation_scratch × batch` bytes.
//!   Freshly started workers are all busy filling their queues (busy = `w` at the first
//!   batch of an epoch, one fewer per batch after, at least one); afterwards one worker
//!   refills at a time. Non-persistent workers are respawned every epoch, so every epoch
//!   starts with the burst: the epoch spike. Persistent workers keep their queues full
//!   across the epoch boundary, so only the first epoch bursts.
//! * Each live worker costs `worker_overhead` (its own interpreter, copied pages, ...).
//! * A memory-mapped data set costs page cache (file RSS) up to the bytes touched; a
//!   preloaded one costs anonymous RSS equal to its size from the start.

use trainmem_probe::Category;

use crate::plan::{DataStorage, Plan};
use crate::timeline::{CategoryBytes, HostBytes};

/// The state the host model needs at a sample.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HostMoment {
    /// Workers (and their queues) are alive.
    pub workers_alive: bool,
    /// Batches taken from the loader in this worker generation (0 right after start).
    pub batches_since_start: u64,
    /// Samples read so far (drives the page cache of a memory map).
    pub samples_read: u64,
    /// Size factor of the current batch.
    pub scale: f64,
    /// The current batch is on the host (being collated / copied).
    pub batch_on_host: bool,
    /// Extra bytes of a checkpoint being serialised.
    pub checkpoint_bytes: u64,
    /// Metric scalars kept so far.
    pub scalars: u64,
}

/// Host-memory model of one plan.
#[derive(Debug, Clone)]
pub struct HostModel {
    batch_bytes: u64,
    stored_sample: u64,
    dataset_bytes: u64,
    stored_dataset_bytes: u64,
    storage: DataStorage,
    workers: u64,
    prefetch: u64,
    pin: bool,
    scratch: f64,
    overhead: u64,
    baseline: u64,
}

/// Rounds up to a power of two (pinned host allocations).
pub fn pinned_size(bytes: u64) -> u64 {
    if bytes == 0 {
        0
    } else {
        bytes.next_power_of_two()
    }
}

impl HostModel {
    /// The model of a plan; `sample_bytes` is the host bytes of one decoded sample.
    pub fn new(plan: &Plan, sample_bytes: u64) -> HostModel {
        let stored_sample = plan.data.stored_sample_bytes.map_or(sample_bytes, |b| b.0);
        HostModel {
            batch_bytes: sample_bytes * plan.micro_batch_size(),
            stored_sample,
            dataset_bytes: sample_bytes * plan.data.samples,
            stored_dataset_bytes: stored_sample * plan.data.samples,
            storage: plan.data.storage,
            workers: plan.loader.workers,
            prefetch: plan.loader.prefetch_factor,
            pin: plan.loader.pin_memory,
            scratch: plan.data.augmentation_scratch,
            overhead: plan.loader.worker_overhead.0,
            baseline: plan.host.baseline.0,
        }
    }

    /// Bytes of one (micro-)batch on the host at size factor 1.
    pub fn batch_bytes(&self) -> u64 {
        self.batch_bytes
    }

    /// Batches in flight in the loader's queues while workers are alive.
    pub fn queued_batches(&self) -> u64 {
        if self.workers == 0 {
            0
        } else {
            self.workers * self.prefetch
        }
    }

    /// Host memory at a moment. `device_tensors` are added when tensors live on the host
    /// (CPU backends).
    pub fn at(&self, m: &HostMoment, device_tensors: Option<&CategoryBytes>) -> HostBytes {
        let mut c = CategoryBytes::ZERO;
        c.add(Category::Other, self.baseline);
        let batch = (self.batch_bytes as f64 * m.scale).round() as u64;
        if m.workers_alive && self.workers > 0 {
            let queued = self.queued_batches();
            c.add(Category::Input, queued * batch);
            if self.pin {
                c.add(Category::Input, queued * pinned_size(batch));
            }
            let busy = self.workers.saturating_sub(m.batches_since_start).max(1);
            c.add(
                Category::Input,
                (busy as f64 * self.scratch * batch as f64).round() as u64,
            );
            c.add(Category::Other, self.workers * self.overhead);
        }
        if m.batch_on_host {
            c.add(Category::Input, batch);
            if self.workers == 0 {
                c.add(
                    Category::Input,
                    (self.scratch * batch as f64).round() as u64,
                );
                if self.pin {
                    c.add(Category::Input, pinned_size(batch));
                }
            }
        }
        if self.storage == DataStorage::Preload {
            c.add(Category::Input, self.dataset_bytes);
        }
        c.add(Category::Other, m.checkpoint_bytes + 8 * m.scalars);
        if let Some(d) = device_tensors {
            for (cat, b) in d.iter() {
                if cat != Category::Cache {
                    c.add(cat, b);
                }
            }
        }
        let file_rss = match self.storage {
            DataStorage::Mmap => {
                (m.samples_read.saturating_mul(self.stored_sample)).min(self.stored_dataset_bytes)
            }
            _ => 0,
        };
        HostBytes {
            anon_rss: c.total(),
            file_rss,
            categories: c,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinned_rounds_to_powers_of_two() {
        assert_eq!(pinned_size(3 << 20), 4 << 20);
        assert_eq!(pinned_size(4 << 20), 4 << 20);
        assert_eq!(pinned_size(0), 0);
    }
}
