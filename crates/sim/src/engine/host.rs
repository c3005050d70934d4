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
//! * Kernel scratch (given to [`HostModel::new`]: by default gemm's thread-local packing
//!   buffer for burn on a CPU device, sized for the target machine, [`super::kernel_scratch`])
//!   is `other` at every sample, `start` to `end`: the training thread makes it before the
//!   `start` sample and keeps it.
//!   Not modelled under `other`: the measuring probe's own sample buffers (reserved before
//!   `start`, about 0.3 KiB per expected sample; `twin_check` prints them) and a few hundred
//!   bytes of runtime bookkeeping freed between `start` and the first forward.
//! * Each live worker costs `worker_overhead` (its own interpreter, copied pages, ...).
//! * A memory-mapped data set costs page cache (file RSS) up to the bytes touched; a
//!   preloaded one costs anonymous RSS equal to its size from the start.
//! * The epoch's sample order, when the loader is trainmem-loader (burn runs of vector and
//!   image models): its sampler materialises the order of the whole epoch as one `usize`
//!   (8 bytes) per sample of the data set when the epoch starts, and frees it when the epoch
//!   ends ([`HostModel::with_epoch_order`]).
//! * Pinned staging, when the loader is trainmem-loader ([`HostModel::with_staging_pool`]):
//!   with `pin_memory` its batches are built directly in page-locked blocks from a pool
//!   (each column rounded up to whole 4 KiB pages), not copied into pinned memory after
//!   collation. A block returns to the pool when its batch is dropped and is reused; the pool
//!   only grows when no idle block fits, and keeps its blocks for the loader's life. So it
//!   grows to the most batches ever alive at once — `workers × prefetch_factor` in flight
//!   plus the one the training loop holds — and stays that size across epoch ends.
//! * trainmem-loader's batches in flight ([`HostModel::with_trainmem_loader`], measured on
//!   burn runs with trainmem-burn's `twin_check --series`): workers spawned for an epoch have
//!   built nothing yet when the epoch starts; each builds one batch at a time, so `w`
//!   batches exist when the first is taken and the queues are full (`w × prefetch_factor`)
//!   from the second on. Only the epoch's batches are built: as its last ones are taken
//!   the batches in flight fall to zero at its end (`batches per epoch − batches taken`).
//!   Workers are busy (holding augmentation scratch) only while filling their queues at the
//!   start of a worker generation (`w` at the first batch, one fewer per batch after); once
//!   the queues are full a worker refills a freed slot within the step. Persistent workers
//!   keep their queues full across the epoch boundary (they build the next epoch's first
//!   batches ahead), so only the first epoch starts empty.

use trainmem_core::Category;

use trainmem_core::plan::{DataStorage, Plan};
use trainmem_core::timeline::{CategoryBytes, HostBytes};

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
    /// Extra bytes of a checkpoint being serialised (`other`).
    pub checkpoint_bytes: u64,
    /// The host copy of the parameters a checkpoint is written from while a GPU holds the
    /// tensors (`temporary`).
    pub checkpoint_copy: u64,
    /// Metric scalars kept so far.
    pub scalars: u64,
    /// The framework's records held in host memory (the tensors are on a GPU).
    pub records: crate::engine::runner::HostRecords,
    /// The autograd graph's records held in host memory beside tensors on a GPU, per
    /// category (burn-autodiff's nodes, alive from the op until backward frees them).
    pub graph_records: CategoryBytes,
    /// An epoch is in progress (between its start and its end).
    pub epoch_open: bool,
    /// Batches taken from the loader since the run started (all epochs).
    pub batches_loaded: u64,
    /// Batches taken from the loader in the current epoch, the one being loaded included.
    pub epoch_batches_taken: u64,
}

impl HostMoment {
    /// The moment before anything ran: no workers, nothing read, no epoch open, batch scale 1.
    pub fn at_start() -> HostMoment {
        HostMoment {
            workers_alive: false,
            batches_since_start: 0,
            samples_read: 0,
            scale: 1.0,
            batch_on_host: false,
            checkpoint_bytes: 0,
            checkpoint_copy: 0,
            scalars: 0,
            records: crate::engine::runner::HostRecords::default(),
            graph_records: CategoryBytes::ZERO,
            epoch_open: false,
            batches_loaded: 0,
            epoch_batches_taken: 0,
        }
    }
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
    kernel_scratch: u64,
    epoch_order: u64,
    staging_block: Option<u64>,
    loader_epoch_batches: Option<u64>,
    persistent: bool,
    micro_batch: u64,
}

/// Page size of trainmem-loader's staging blocks.
const STAGING_PAGE: u64 = 4096;

/// Rounds up to a power of two (pinned host allocations).
pub fn pinned_size(bytes: u64) -> u64 {
    if bytes == 0 {
        0
    } else {
        bytes.next_power_of_two()
    }
}

impl HostModel {
    /// The model of a plan; `sample_bytes` is the host bytes of one decoded sample,
    /// `kernel_scratch` the bytes of kernel scratch kept from `start` to `end` (`other`).
    pub fn new(plan: &Plan, sample_bytes: u64, kernel_scratch: u64) -> HostModel {
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
            kernel_scratch,
            epoch_order: 0,
            staging_block: None,
            loader_epoch_batches: None,
            persistent: plan.loader.persistent_workers,
            micro_batch: plan.micro_batch_size(),
        }
    }

    /// The same model with trainmem-loader's queue shape (see the module docs): the loader
    /// serves `batches_per_epoch` batches an epoch.
    pub fn with_trainmem_loader(mut self, batches_per_epoch: u64) -> HostModel {
        self.loader_epoch_batches = Some(batches_per_epoch);
        self
    }

    /// Batches in flight (built or being built, not yet taken) and busy workers at a moment.
    fn in_flight(&self, m: &HostMoment) -> (u64, u64) {
        if !m.workers_alive || self.workers == 0 {
            return (0, 0);
        }
        let queued = self.queued_batches();
        let Some(per_epoch) = self.loader_epoch_batches else {
            let busy = self.workers.saturating_sub(m.batches_since_start).max(1);
            return (queued, busy);
        };
        let started = m.batches_since_start;
        if started == 0 && m.epoch_batches_taken == 0 {
            // workers just spawned: nothing built yet
            return (0, 0);
        }
        let left = if self.persistent {
            u64::MAX
        } else {
            per_epoch.saturating_sub(m.epoch_batches_taken)
        };
        let filled = self.workers.saturating_mul(started + 1);
        let in_flight = queued.min(left).min(filled);
        let busy = self.workers.saturating_sub(started).min(in_flight);
        (in_flight, busy)
    }

    /// The same model with trainmem-loader's staging pool: with `pin_memory`, batches are
    /// built in pooled page-locked blocks of `columns` (bytes per sample of each column of
    /// the batch, e.g. features and labels), each column rounded up to whole pages
    /// (trainmem-loader `engine/staging.rs`: `size.div_ceil(PAGE) * PAGE`). Without `pin_memory`
    /// the model is unchanged (fresh buffers per batch).
    pub fn with_staging_pool(mut self, columns: &[u64], micro_batch: u64) -> HostModel {
        let block = columns
            .iter()
            .map(|c| (c * micro_batch).max(1).div_ceil(STAGING_PAGE) * STAGING_PAGE)
            .sum();
        self.staging_block = Some(block);
        self
    }

    /// Bytes of the staging pool at a moment (0 without a pinned staging pool): the blocks
    /// of the batches in flight before the first batch is taken, then the most batches
    /// alive at once (in flight plus the one held), kept for the rest of the run.
    pub fn staging_pool_bytes(&self, m: &HostMoment) -> u64 {
        match self.staging_block {
            Some(block) if self.pin => {
                let blocks = if m.batches_loaded > 0 {
                    self.queued_batches() + 1
                } else if m.workers_alive {
                    self.queued_batches()
                } else {
                    0
                };
                blocks * block
            }
            _ => 0,
        }
    }

    /// The same model with the loader's per-epoch sample order counted: `samples × 8` input
    /// bytes while an epoch is open (trainmem-loader's sampler builds a `Vec<usize>` of the
    /// epoch's order at the epoch's start).
    pub fn with_epoch_order(mut self, samples: u64) -> HostModel {
        self.epoch_order = samples * std::mem::size_of::<u64>() as u64;
        self
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
        c.add(Category::Other, self.baseline + self.kernel_scratch);
        let batch = (self.batch_bytes as f64 * m.scale).round() as u64;
        let pooled = self.pin && self.staging_block.is_some();
        c.add(Category::Input, self.staging_pool_bytes(m));
        if m.workers_alive && self.workers > 0 {
            let (queued, busy) = self.in_flight(m);
            // counts within the loader's limits, but a batch's bytes are only bounded by u64:
            // beyond it, more than any memory holds
            if !pooled {
                c.add(Category::Input, queued.saturating_mul(batch));
            }
            if self.pin && !pooled {
                c.add(Category::Input, queued.saturating_mul(pinned_size(batch)));
            }
            c.add(
                Category::Input,
                (busy as f64 * self.scratch * batch as f64).round() as u64,
            );
            c.add(Category::Other, self.workers.saturating_mul(self.overhead));
        }
        if m.batch_on_host {
            c.add(Category::Input, batch);
            if self.workers == 0 {
                c.add(
                    Category::Input,
                    (self.scratch * batch as f64).round() as u64,
                );
                if self.pin && !pooled {
                    c.add(Category::Input, pinned_size(batch));
                }
            }
        }
        if m.epoch_open {
            c.add(Category::Input, self.epoch_order);
        }
        if self.storage == DataStorage::Preload {
            c.add(Category::Input, self.dataset_bytes);
        }
        c.add(Category::Other, m.checkpoint_bytes + 8 * m.scalars);
        c.add(Category::Temporary, m.checkpoint_copy);
        c.add(Category::Parameter, m.records.param_records);
        c.add(Category::OptimizerState, m.records.optimizer_records);
        for (cat, b) in m.graph_records.iter() {
            c.add(cat, b);
        }
        if let Some(d) = device_tensors {
            for (cat, b) in d.iter() {
                if cat != Category::Cache {
                    c.add(cat, b);
                }
            }
        }
        // trainmem-loader's workers read the batches in flight ahead of the training loop:
        // their pages are touched too
        let read_ahead = match self.loader_epoch_batches {
            Some(_) => self.in_flight(m).0 * self.micro_batch,
            None => 0,
        };
        let file_rss = match self.storage {
            s if s.is_memory_mapped() => ((m.samples_read + read_ahead)
                .saturating_mul(self.stored_sample))
            .min(self.stored_dataset_bytes),
            _ => 0,
        };
        HostBytes {
            anon_rss: c.total(),
            file_rss,
            categories: c,
            // The host side of uploads is not modelled: what the program holds is the twin's.
            handed_to_device: CategoryBytes::ZERO,
            records: CategoryBytes::ZERO,
            // a checkpoint's copy of a GPU's parameters is read back into the device
            // backend's own host buffers
            device_reads: {
                let mut r = CategoryBytes::ZERO;
                r.set(Category::Temporary, m.checkpoint_copy);
                r
            },
            // The only file pages the twin maps are the data set's.
            data_file_rss: Some(file_rss),
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

    #[test]
    fn kernel_scratch_is_other_at_every_moment_beside_the_baseline() {
        let text = "[model.mlp]\ninput = 4\nhidden = [8]\noutput = 2\n[host]\nbaseline = 1000\n";
        let plan = Plan::from_toml_str(text).expect("plan");
        let h = HostModel::new(&plan, 24, 2 << 20);
        let other = |m: &HostMoment| h.at(m, None).categories.get(Category::Other);
        let mut m = HostMoment::at_start();
        assert_eq!(other(&m), (2 << 20) + 1000);
        m.epoch_open = true;
        m.batch_on_host = true;
        assert_eq!(other(&m), (2 << 20) + 1000);
        // none given, none counted
        assert_eq!(
            HostModel::new(&plan, 24, 0)
                .at(&m, None)
                .categories
                .get(Category::Other),
            1000
        );
    }

    #[test]
    fn the_epoch_order_is_input_while_an_epoch_is_open() {
        let plan = Plan::from_toml_str("[model.mlp]\ninput = 4\nhidden = [8]\noutput = 2\n")
            .expect("plan");
        let h = HostModel::new(&plan, 24, 0).with_epoch_order(plan.data.samples);
        let mut m = HostMoment {
            epoch_open: true,
            ..HostMoment::at_start()
        };
        assert_eq!(
            h.at(&m, None).categories.get(Category::Input),
            plan.data.samples * 8
        );
        m.epoch_open = false;
        assert_eq!(h.at(&m, None).categories.get(Category::Input), 0);
        // without the loader's order (the default) nothing is added
        m.epoch_open = true;
        let plain = HostModel::new(&plan, 24, 0);
        assert_eq!(plain.at(&m, None).categories.get(Category::Input), 0);
    }

    #[test]
    fn pinned_staging_pool_grows_to_the_batches_alive_and_stays() {
        let text = "[model.mlp]\ninput = 3000\nhidden = [8]\noutput = 10\n\
                    [training]\nbatch_size = 64\n\
                    [loader]\nworkers = 2\nprefetch_factor = 2\npin_memory = true\n";
        let plan = Plan::from_toml_str(text).expect("plan");
        // features 64 × 3000 f32 = 768,000 B → 188 pages; labels 64 × 8 = 512 B → 1 page
        let h = HostModel::new(&plan, 12_008, 0).with_staging_pool(&[12_000, 8], 64);
        let block = 189 * 4096;
        let mut m = HostMoment {
            workers_alive: true,
            ..HostMoment::at_start()
        };
        // before the first batch: the four batches in flight, built in pooled blocks
        assert_eq!(h.at(&m, None).categories.get(Category::Input), 4 * block);
        // from the first batch on: in flight plus the one held, also after the workers stop
        m.batches_loaded = 1;
        assert_eq!(h.at(&m, None).categories.get(Category::Input), 5 * block);
        m.workers_alive = false;
        assert_eq!(h.at(&m, None).categories.get(Category::Input), 5 * block);
        // without pin_memory the pool is not used: the batches in flight only
        let mut unpinned = plan.clone();
        unpinned.loader.pin_memory = false;
        let u = HostModel::new(&unpinned, 12_008, 0).with_staging_pool(&[12_000, 8], 64);
        m.workers_alive = true;
        assert_eq!(
            u.at(&m, None).categories.get(Category::Input),
            4 * 64 * 12_008
        );
    }

    #[test]
    fn trainmem_loader_queues_fill_then_drain_with_the_epoch() {
        let text = "[model.mlp]\ninput = 4\nhidden = [8]\noutput = 2\n\
                    [data]\nsamples = 384\naugmentation_scratch = 2.0\n\
                    [training]\nbatch_size = 64\n\
                    [loader]\nworkers = 2\nprefetch_factor = 2\n";
        let plan = Plan::from_toml_str(text).expect("plan");
        let h = HostModel::new(&plan, 100, 0).with_trainmem_loader(6);
        let batch = 64 * 100;
        let input = |m: &HostMoment| h.at(m, None).categories.get(Category::Input);
        let mut m = HostMoment {
            workers_alive: true,
            ..HostMoment::at_start()
        };
        // epoch start: fresh workers have built nothing
        assert_eq!(input(&m), 0);
        // first batch taken: one batch per worker in flight, both busy (2 × scratch each)
        m.epoch_batches_taken = 1;
        assert_eq!(input(&m), 2 * batch + 2 * 2 * batch);
        // after it: queues full (4), one worker still filling
        m.batches_since_start = 1;
        assert_eq!(input(&m), 4 * batch + 2 * batch);
        // the epoch's last batches drain the queues
        m.batches_since_start = 3;
        m.epoch_batches_taken = 4;
        assert_eq!(input(&m), 2 * batch);
        m.epoch_batches_taken = 6;
        assert_eq!(input(&m), 0);
        // persistent workers build ahead into the next epoch: the queues stay full
        let mut p = plan.clone();
        p.loader.persistent_workers = true;
        let hp = HostModel::new(&p, 100, 0).with_trainmem_loader(6);
        assert_eq!(hp.at(&m, None).categories.get(Category::Input), 4 * batch);
        // a memory map's pages are touched by the batches taken and those in flight
        m.samples_read = 4 * 64;
        m.epoch_batches_taken = 4;
        assert_eq!(h.at(&m, None).file_rss, (4 + 2) * 64 * 100);
    }
}
