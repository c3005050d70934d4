//! The loader's knobs, serde-serialisable so plans (and the simulator) can carry them.
//!
//! The names and defaults follow PyTorch's `DataLoader` where one exists: `workers` is
//! `num_workers`, `prefetch_factor` is per worker (at most `prefetch_factor × workers` batches in
//! flight), `persistent_workers` keeps the worker threads across epochs, `pin_memory` builds
//! batches in page-locked staging buffers.

use serde::{Deserialize, Serialize};

/// The most worker threads a loader accepts ([`LoaderConfig::workers`]): far more than any
/// machine has CPUs, low enough that the per-worker bookkeeping made at
/// [`Loader::new`](crate::Loader::new) (a few KiB a worker) stays bounded.
/// The same limit a plan's `loader.workers` is held to ([`trainmem_core::plan::LOADER_MAX_WORKERS`]).
pub const MAX_WORKERS: usize = trainmem_core::plan::LOADER_MAX_WORKERS as usize;

/// The most batches a loader keeps in flight, `prefetch_factor × workers`
/// ([`LoaderConfig::max_batches_in_flight`]): a larger product is refused by
/// [`LoaderConfig::validate`] rather than left to overflow the loader's counts.
/// The same limit a plan's loader is held to
/// ([`trainmem_core::plan::LOADER_MAX_BATCHES_IN_FLIGHT`]).
pub const MAX_BATCHES_IN_FLIGHT: usize = trainmem_core::plan::LOADER_MAX_BATCHES_IN_FLIGHT as usize;

/// How the sample order of an epoch is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Order {
    /// `0, 1, 2, ...` every epoch.
    #[default]
    Sequential,
    /// A permutation drawn from `seed` and the epoch number: a new order every epoch, the same
    /// order for the same `(seed, epoch)` on every run and every rank.
    Shuffled {
        /// The seed of the permutation.
        seed: u64,
    },
}

/// How a [`Shard`] evens out the ranks when the data set length is not a multiple of
/// `world_size` (PyTorch `DistributedSampler`'s `drop_last`). Either way every rank reads the
/// same number of samples, so every rank runs the same number of batches and steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ShardTail {
    /// Extend the epoch order by repeating it from its start (wrapping around as often as
    /// needed) up to the next multiple of `world_size`: every sample at least once, the first
    /// `padded - len` positions of the order twice. PyTorch's default.
    #[default]
    Pad,
    /// Cut the epoch order down to the largest multiple of `world_size`: the last
    /// `len % world_size` positions of the order are skipped this epoch.
    Drop,
}

/// One rank's share of a data set split across `world_size` ranks, as PyTorch's
/// `DistributedSampler` draws it: the epoch order (the same on every rank for a given seed and
/// epoch) is padded or cut to a multiple of `world_size` ([`ShardTail`]), then rank `r` takes
/// positions `r, r + world_size, r + 2·world_size, ...` of it. Every rank gets
/// `ceil(len / world_size)` samples when padding, `floor(len / world_size)` when dropping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    /// This rank, `0..world_size`.
    pub rank: usize,
    /// The number of ranks.
    pub world_size: usize,
    /// Pad (default, also when absent from a serialised config) or drop the tail.
    #[serde(default)]
    pub tail: ShardTail,
}

impl Shard {
    /// Rank `rank` of `world_size`, padding the tail (PyTorch's default).
    pub fn new(rank: usize, world_size: usize) -> Shard {
        Shard {
            rank,
            world_size,
            tail: ShardTail::Pad,
        }
    }

    /// Samples every rank reads in an epoch over `len` samples.
    pub fn samples_per_rank(&self, len: usize) -> usize {
        let w = self.world_size.max(1);
        match self.tail {
            ShardTail::Pad => len.div_ceil(w),
            ShardTail::Drop => len / w,
        }
    }
}

/// Every knob of a loader.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoaderConfig {
    /// Samples per batch (at least 1).
    pub batch_size: usize,
    /// Drop the last batch of an epoch when it is shorter than `batch_size`.
    pub drop_last: bool,
    /// Sample order.
    pub order: Order,
    /// The distributed shard this process reads, or `None` for the whole data set.
    pub shard: Option<Shard>,
    /// Worker threads; 0 builds batches in the caller's thread when it asks for them.
    pub workers: usize,
    /// Batches in flight per worker (at least 1; ignored when `workers == 0`).
    pub prefetch_factor: usize,
    /// Keep worker threads alive across epochs (otherwise they are spawned at the start of each
    /// epoch and joined at its end, as PyTorch does by default).
    pub persistent_workers: bool,
    /// Build batches in reusable page-locked (mlock'ed) staging buffers.
    pub pin_memory: bool,
    /// Reuse the buffers of dropped batches for new batches (a pool, so the steady state
    /// allocates nothing and never faults fresh pages in). Off: every batch gets fresh heap
    /// buffers, which the allocator may hand back to the OS and fault in again. Implied by
    /// `pin_memory`.
    pub reuse_buffers: bool,
    /// Give up on a batch that takes longer than this many milliseconds to arrive.
    pub timeout_ms: Option<u64>,
    /// Seed of the workers' seeds and of each batch's random generator (augmentation).
    pub seed: u64,
}

impl Default for LoaderConfig {
    fn default() -> Self {
        LoaderConfig {
            batch_size: 1,
            drop_last: false,
            order: Order::Sequential,
            shard: None,
            workers: 0,
            prefetch_factor: 2,
            persistent_workers: false,
            pin_memory: false,
            reuse_buffers: true,
            timeout_ms: None,
            seed: 0,
        }
    }
}

/// A configuration that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// `batch_size` is 0.
    #[error("batch_size must be at least 1")]
    ZeroBatchSize,
    /// `prefetch_factor` is 0 with workers.
    #[error("prefetch_factor must be at least 1 when workers > 0")]
    ZeroPrefetch,
    /// The shard is outside its world.
    #[error("shard rank {rank} is not below world_size {world_size}")]
    BadShard {
        /// The rank.
        rank: usize,
        /// The world size.
        world_size: usize,
    },
    /// A timeout of 0 ms.
    #[error("timeout_ms must be positive when set")]
    ZeroTimeout,
    /// More workers than [`MAX_WORKERS`].
    #[error("workers = {workers} is more than the {MAX_WORKERS} worker threads a loader accepts")]
    TooManyWorkers {
        /// The workers asked for.
        workers: usize,
    },
    /// `prefetch_factor × workers` is more than [`MAX_BATCHES_IN_FLIGHT`].
    #[error(
        "prefetch_factor = {prefetch_factor} with workers = {workers} would keep more than the \
         {MAX_BATCHES_IN_FLIGHT} batches in flight a loader accepts (prefetch_factor × workers)"
    )]
    TooManyInFlight {
        /// The workers.
        workers: usize,
        /// The prefetch factor.
        prefetch_factor: usize,
    },
    /// A plan's count does not fit this machine's `usize`.
    #[error("loader.{key} = {value} is too large for this machine")]
    TooLarge {
        /// The plan key.
        key: &'static str,
        /// Its value.
        value: u64,
    },
}

impl LoaderConfig {
    /// The loader a plan's `[loader]` table describes (trainmem-core's
    /// [`LoaderPlan`](trainmem_core::plan::LoaderPlan): the knobs a plan shares with this
    /// configuration, in plan units), reading `batch_size` samples per batch with `seed`.
    ///
    /// Plans have no buffer-reuse knob: every batch gets fresh buffers, as PyTorch's DataLoader
    /// gives them, so the input bytes follow the batches in flight. A plan's prefetch factor of
    /// 0 reads as 1. The plan's `worker_overhead` is the twin's (a worker's private memory in
    /// another framework) and has no counterpart here.
    pub fn from_plan(
        plan: &trainmem_core::plan::LoaderPlan,
        batch_size: usize,
        seed: u64,
    ) -> Result<LoaderConfig, ConfigError> {
        let count = |key: &'static str, value: u64| {
            usize::try_from(value).map_err(|_| ConfigError::TooLarge { key, value })
        };
        Ok(LoaderConfig {
            batch_size,
            drop_last: plan.drop_last,
            workers: count("workers", plan.workers)?,
            prefetch_factor: count("prefetch_factor", plan.prefetch_factor)?.max(1),
            persistent_workers: plan.persistent_workers,
            pin_memory: plan.pin_memory,
            reuse_buffers: false,
            seed,
            ..LoaderConfig::default()
        })
    }

    /// Checks the knobs against each other, and against [`MAX_WORKERS`] and
    /// [`MAX_BATCHES_IN_FLIGHT`].
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.batch_size == 0 {
            return Err(ConfigError::ZeroBatchSize);
        }
        if self.workers > 0 && self.prefetch_factor == 0 {
            return Err(ConfigError::ZeroPrefetch);
        }
        if self.workers > MAX_WORKERS {
            return Err(ConfigError::TooManyWorkers {
                workers: self.workers,
            });
        }
        if self.workers > 0
            && self
                .prefetch_factor
                .checked_mul(self.workers)
                .is_none_or(|n| n > MAX_BATCHES_IN_FLIGHT)
        {
            return Err(ConfigError::TooManyInFlight {
                workers: self.workers,
                prefetch_factor: self.prefetch_factor,
            });
        }
        if let Some(Shard {
            rank, world_size, ..
        }) = self.shard
            && rank >= world_size
        {
            return Err(ConfigError::BadShard { rank, world_size });
        }
        if self.timeout_ms == Some(0) {
            return Err(ConfigError::ZeroTimeout);
        }
        Ok(())
    }

    /// The most batches that exist inside the loader at once (queued, being built, or waiting
    /// in the reorder buffer): `prefetch_factor × workers`, or 0 when `workers == 0` (the caller
    /// builds each batch on demand and owns it at once). Batches the caller still holds are
    /// outside this count.
    pub fn max_batches_in_flight(&self) -> usize {
        if self.workers == 0 {
            0
        } else {
            self.prefetch_factor.saturating_mul(self.workers)
        }
    }

    /// Number of samples this process reads in an epoch over `dataset_len` samples (after
    /// sharding: the same on every rank, see [`Shard`]).
    pub fn samples_per_epoch(&self, dataset_len: usize) -> usize {
        match self.shard {
            None => dataset_len,
            Some(s) if s.world_size > 0 && s.rank < s.world_size => s.samples_per_rank(dataset_len),
            Some(_) => 0,
        }
    }

    /// Number of batches in an epoch over `dataset_len` samples: `ceil(n / batch_size)`, or
    /// `floor(n / batch_size)` with `drop_last`, where `n` is [`Self::samples_per_epoch`].
    pub fn batches_per_epoch(&self, dataset_len: usize) -> usize {
        let n = self.samples_per_epoch(dataset_len);
        let b = self.batch_size.max(1);
        if self.drop_last { n / b } else { n.div_ceil(b) }
    }

    /// The bound on the loader's own bytes for batches of at most `batch_bytes` bytes and a
    /// per-worker scratch of at most `scratch_bytes`:
    /// `max_batches_in_flight × batch_bytes + workers × scratch_bytes` (plus the staging pool
    /// when `pin_memory`, see [`crate::LoaderMemory`]). With `workers == 0` it is one batch plus
    /// one scratch, both built in the caller's thread.
    pub fn in_flight_bound(&self, batch_bytes: usize, scratch_bytes: usize) -> usize {
        if self.workers == 0 {
            batch_bytes.saturating_add(scratch_bytes)
        } else {
            self.max_batches_in_flight()
                .saturating_mul(batch_bytes)
                .saturating_add(self.workers.saturating_mul(scratch_bytes))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_plans_loader_becomes_the_same_knobs() {
        let plan = trainmem_core::plan::LoaderPlan {
            workers: 3,
            prefetch_factor: 0,
            persistent_workers: true,
            pin_memory: true,
            drop_last: false,
            ..Default::default()
        };
        let c = LoaderConfig::from_plan(&plan, 16, 7).unwrap();
        assert_eq!(
            (c.batch_size, c.workers, c.prefetch_factor, c.seed),
            (16, 3, 1, 7)
        );
        assert!(c.persistent_workers && c.pin_memory && !c.drop_last && !c.reuse_buffers);
        assert!(c.validate().is_ok());
        if usize::BITS < 64 {
            let huge = trainmem_core::plan::LoaderPlan {
                workers: u64::MAX,
                ..Default::default()
            };
            assert!(matches!(
                LoaderConfig::from_plan(&huge, 1, 0),
                Err(ConfigError::TooLarge { key: "workers", .. })
            ));
        }
    }

    #[test]
    fn defaults_follow_pytorch_and_validate() {
        let c = LoaderConfig::default();
        assert_eq!((c.batch_size, c.workers, c.prefetch_factor), (1, 0, 2));
        assert!(!c.persistent_workers && !c.pin_memory && !c.drop_last);
        assert_eq!(c.validate(), Ok(()));
        assert_eq!(c.max_batches_in_flight(), 0);
    }

    #[test]
    fn invalid_configs_are_named() {
        let bad = |f: fn(&mut LoaderConfig)| {
            let mut c = LoaderConfig::default();
            f(&mut c);
            c.validate().expect_err("invalid")
        };
        assert_eq!(bad(|c| c.batch_size = 0), ConfigError::ZeroBatchSize);
        assert_eq!(
            bad(|c| {
                c.workers = 2;
                c.prefetch_factor = 0
            }),
            ConfigError::ZeroPrefetch
        );
        assert_eq!(
            bad(|c| c.shard = Some(Shard::new(2, 2))),
            ConfigError::BadShard {
                rank: 2,
                world_size: 2
            }
        );
        assert_eq!(bad(|c| c.timeout_ms = Some(0)), ConfigError::ZeroTimeout);
    }

    #[test]
    fn absurd_worker_and_prefetch_counts_are_refused_by_name() {
        let with = |workers, prefetch_factor| LoaderConfig {
            workers,
            prefetch_factor,
            ..LoaderConfig::default()
        };
        // A product that overflows `usize`, one that fits but is absurd, and the edge.
        assert_eq!(
            with(2, usize::MAX).validate(),
            Err(ConfigError::TooManyInFlight {
                workers: 2,
                prefetch_factor: usize::MAX
            })
        );
        let err = with(2, MAX_BATCHES_IN_FLIGHT)
            .validate()
            .expect_err("2 × limit");
        let text = err.to_string();
        assert!(
            text.contains("prefetch_factor") && text.contains(&MAX_BATCHES_IN_FLIGHT.to_string()),
            "{text}"
        );
        assert_eq!(with(1, MAX_BATCHES_IN_FLIGHT).validate(), Ok(()));
        assert_eq!(with(2, MAX_BATCHES_IN_FLIGHT / 2).validate(), Ok(()));
        // Without workers the prefetch factor is ignored, whatever its value.
        assert_eq!(with(0, usize::MAX).validate(), Ok(()));
        assert_eq!(
            with(usize::MAX, 1).validate(),
            Err(ConfigError::TooManyWorkers {
                workers: usize::MAX
            })
        );
        assert_eq!(
            with(MAX_WORKERS + 1, 1).validate(),
            Err(ConfigError::TooManyWorkers {
                workers: MAX_WORKERS + 1
            })
        );
        assert_eq!(with(MAX_WORKERS, 2).validate(), Ok(()));
        // Deserialised configs are checked the same way.
        let c: LoaderConfig = serde_json::from_str(&format!(
            r#"{{"workers": 2, "prefetch_factor": {}}}"#,
            u64::MAX
        ))
        .expect("de");
        assert!(matches!(
            c.validate(),
            Err(ConfigError::TooManyInFlight { .. })
        ));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]

        /// A configuration that validates keeps its batches in flight within the limit, so the
        /// loader's own arithmetic on that count (pool sizes, rotation, priming) cannot overflow.
        #[test]
        fn a_valid_config_bounds_the_batches_in_flight(
            workers in prop_oneof![0usize..=8, 0usize..=MAX_WORKERS + 8, any::<usize>()],
            prefetch_factor in prop_oneof![0usize..=8, any::<usize>()],
        ) {
            let c = LoaderConfig { workers, prefetch_factor, ..LoaderConfig::default() };
            match c.validate() {
                Ok(()) => {
                    prop_assert!(workers <= MAX_WORKERS);
                    prop_assert!(c.max_batches_in_flight() <= MAX_BATCHES_IN_FLIGHT);
                    let expected = if workers == 0 { 0 } else { workers * prefetch_factor };
                    prop_assert_eq!(c.max_batches_in_flight(), expected);
                }
                Err(ConfigError::ZeroPrefetch) => {
                    prop_assert!(workers > 0 && prefetch_factor == 0);
                }
                Err(ConfigError::TooManyWorkers { .. }) => {
                    prop_assert!(workers > MAX_WORKERS);
                }
                Err(ConfigError::TooManyInFlight { .. }) => {
                    prop_assert!(workers > 0 && workers <= MAX_WORKERS);
                    prop_assert!(
                        workers.checked_mul(prefetch_factor).is_none_or(|n| n > MAX_BATCHES_IN_FLIGHT)
                    );
                }
                Err(e) => prop_assert!(false, "unexpected {e}"),
            }
        }
    }

    #[test]
    fn counts_per_epoch() {
        let mut c = LoaderConfig {
            batch_size: 4,
            ..LoaderConfig::default()
        };
        assert_eq!(c.batches_per_epoch(10), 3);
        c.drop_last = true;
        assert_eq!(c.batches_per_epoch(10), 2);
        assert_eq!(c.batches_per_epoch(3), 0);
        // 10 samples over 3 ranks: 4 each when padding (12 = 10 + 2 repeats), 3 each when
        // dropping the tail (9 of the 10), like PyTorch's DistributedSampler.
        c.shard = Some(Shard::new(1, 3));
        assert_eq!(c.samples_per_epoch(10), 4);
        assert_eq!(c.batches_per_epoch(10), 1);
        for (tail, per_rank) in [(ShardTail::Pad, 4), (ShardTail::Drop, 3)] {
            for rank in 0..3 {
                let c = LoaderConfig {
                    shard: Some(Shard {
                        rank,
                        world_size: 3,
                        tail,
                    }),
                    ..LoaderConfig::default()
                };
                assert_eq!(c.samples_per_epoch(10), per_rank);
            }
        }
        // A world larger than the data set: padding gives every rank one sample, dropping none.
        assert_eq!(Shard::new(4, 5).samples_per_rank(2), 1);
        let drop = Shard {
            tail: ShardTail::Drop,
            ..Shard::new(4, 5)
        };
        assert_eq!(drop.samples_per_rank(2), 0);
    }

    #[test]
    fn bound_formula() {
        let c = LoaderConfig {
            workers: 3,
            prefetch_factor: 2,
            ..LoaderConfig::default()
        };
        assert_eq!(c.max_batches_in_flight(), 6);
        assert_eq!(c.in_flight_bound(100, 10), 630);
    }

    #[test]
    fn serde_round_trip_with_defaults() {
        let c = LoaderConfig {
            batch_size: 32,
            order: Order::Shuffled { seed: 7 },
            shard: Some(Shard {
                tail: ShardTail::Drop,
                ..Shard::new(0, 2)
            }),
            workers: 4,
            timeout_ms: Some(500),
            ..LoaderConfig::default()
        };
        let text = serde_json::to_string(&c).expect("ser");
        let back: LoaderConfig = serde_json::from_str(&text).expect("de");
        assert_eq!(back, c);
        let partial: LoaderConfig =
            serde_json::from_str(r#"{"batch_size": 8, "workers": 2}"#).expect("partial");
        assert_eq!(partial.prefetch_factor, 2);
        assert!(serde_json::from_str::<LoaderConfig>(r#"{"num_workers": 2}"#).is_err());
        // A shard written before the tail policy existed reads as padding.
        let old: LoaderConfig =
            serde_json::from_str(r#"{"shard": {"rank": 1, "world_size": 4}}"#).expect("old");
        assert_eq!(old.shard, Some(Shard::new(1, 4)));
        let dropping: LoaderConfig =
            serde_json::from_str(r#"{"shard": {"rank": 1, "world_size": 4, "tail": "drop"}}"#)
                .expect("drop");
        assert_eq!(dropping.shard.map(|s| s.tail), Some(ShardTail::Drop));
    }
}
