//! Samplers: the order of one epoch (sequential, shuffled, sharded) cut into batches.

use crate::engine::config::{LoaderConfig, Order, Shard};
use crate::engine::loader::LoaderError;
use crate::rng::{Rng, mix};

/// The most samples an epoch may range over: 2³² (or `usize::MAX` where `usize` is
/// narrower). Each epoch's order is an index list of 8 bytes a sample (the full order, then
/// this rank's share of it), so this bounds it at 32 GiB; [`Loader::new`](crate::Loader::new)
/// refuses a larger data set ([`LoaderError::EpochTooLarge`]) instead of trying to allocate
/// its order.
pub const MAX_EPOCH_SAMPLES: usize = (u32::MAX as usize).saturating_add(1);

/// The sample order of one epoch and its batches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EpochPlan {
    order: Vec<usize>,
    batch_size: usize,
    batches: usize,
}

/// The full order of an epoch before sharding: `0..len`, or a permutation drawn from
/// `(seed, epoch)` (Fisher–Yates).
pub fn epoch_order(len: usize, order: Order, epoch: u64) -> Vec<usize> {
    let mut v: Vec<usize> = (0..len).collect();
    shuffle(&mut v, order, epoch);
    v
}

/// Permutes `v` (holding `0..len`) into the epoch order.
fn shuffle(v: &mut [usize], order: Order, epoch: u64) {
    if let Order::Shuffled { seed } = order {
        let mut rng = Rng::new(mix(&[seed, epoch]));
        for i in (1..v.len()).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            v.swap(i, j);
        }
    }
}

/// `items`, collected into a vector of exactly `n` elements allocated up front, or `None`
/// when the allocation fails (instead of aborting the process).
fn try_collect(n: usize, items: impl Iterator<Item = usize>) -> Option<Vec<usize>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).ok()?;
    v.extend(items.take(n));
    Some(v)
}

/// This rank's share of an epoch order `full` (PyTorch `DistributedSampler`): positions
/// `rank, rank + world_size, ...` of `full` padded by wrapping around to a multiple of
/// `world_size`, or cut to one ([`crate::ShardTail`]). Every rank gets
/// [`Shard::samples_per_rank`] indices.
pub fn shard_order(full: &[usize], shard: Shard) -> Vec<usize> {
    shard_indices(full, shard).collect()
}

/// The indices [`shard_order`] collects.
fn shard_indices(full: &[usize], shard: Shard) -> impl ExactSizeIterator<Item = usize> + '_ {
    let len = full.len();
    let n = if len == 0 || shard.world_size == 0 {
        0
    } else {
        shard.samples_per_rank(len)
    };
    (0..n).map(move |k| full[(shard.rank + k * shard.world_size) % len])
}

impl EpochPlan {
    /// The plan of `epoch` over a data set of `len` samples: the epoch order, this rank's shard
    /// of it ([`shard_order`]), cut into batches of `batch_size`, the last one shorter unless
    /// `drop_last` drops it.
    ///
    /// # Panics
    ///
    /// Where [`Self::try_new`] errs: over [`MAX_EPOCH_SAMPLES`], or when the index list cannot
    /// be allocated. The loader uses [`Self::try_new`].
    pub fn new(len: usize, config: &LoaderConfig, epoch: u64) -> EpochPlan {
        EpochPlan::try_new(len, config, epoch).unwrap_or_else(|e| panic!("{e}"))
    }

    /// The plan of [`Self::new`], or an error when `len` is over [`MAX_EPOCH_SAMPLES`]
    /// ([`LoaderError::EpochTooLarge`]) or the index list cannot be allocated
    /// ([`LoaderError::EpochAlloc`]).
    pub fn try_new(
        len: usize,
        config: &LoaderConfig,
        epoch: u64,
    ) -> Result<EpochPlan, LoaderError> {
        check_epoch_len(len)?;
        let no_memory = || LoaderError::EpochAlloc { samples: len };
        let mut full = try_collect(len, 0..len).ok_or_else(no_memory)?;
        shuffle(&mut full, config.order, epoch);
        let order: Vec<usize> = match config.shard {
            Some(shard) => {
                let n = shard_indices(&full, shard).len();
                try_collect(n, shard_indices(&full, shard)).ok_or_else(no_memory)?
            }
            None => full,
        };
        let batch_size = config.batch_size.max(1);
        let batches = if config.drop_last {
            order.len() / batch_size
        } else {
            order.len().div_ceil(batch_size)
        };
        Ok(EpochPlan {
            order,
            batch_size,
            batches,
        })
    }

    /// Number of batches.
    pub fn len(&self) -> usize {
        self.batches
    }

    /// Whether the epoch has no batches.
    pub fn is_empty(&self) -> bool {
        self.batches == 0
    }

    /// The sample indices of batch `k` (`k < len()`).
    pub fn batch(&self, k: usize) -> &[usize] {
        let start = (k * self.batch_size).min(self.order.len());
        let end = (start + self.batch_size).min(self.order.len());
        &self.order[start..end]
    }

    /// The shard's order (all samples of this rank, including any dropped by `drop_last`).
    pub fn order(&self) -> &[usize] {
        &self.order
    }

    /// Bytes held by the index list.
    pub fn bytes(&self) -> usize {
        self.order.capacity() * std::mem::size_of::<usize>()
    }
}

/// Errors when an epoch over `len` samples is over [`MAX_EPOCH_SAMPLES`].
pub(crate) fn check_epoch_len(len: usize) -> Result<(), LoaderError> {
    if len > MAX_EPOCH_SAMPLES {
        return Err(LoaderError::EpochTooLarge {
            samples: len,
            limit: MAX_EPOCH_SAMPLES,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(batch: usize, drop_last: bool, order: Order) -> LoaderConfig {
        LoaderConfig {
            batch_size: batch,
            drop_last,
            order,
            ..LoaderConfig::default()
        }
    }

    #[test]
    fn sequential_batches_like_pytorch() {
        let p = EpochPlan::new(10, &cfg(3, false, Order::Sequential), 0);
        let got: Vec<&[usize]> = (0..p.len()).map(|k| p.batch(k)).collect();
        assert_eq!(got, vec![&[0, 1, 2][..], &[3, 4, 5], &[6, 7, 8], &[9]]);
        let p = EpochPlan::new(10, &cfg(3, true, Order::Sequential), 0);
        assert_eq!(p.len(), 3);
        assert!(EpochPlan::new(0, &cfg(3, false, Order::Sequential), 0).is_empty());
        assert_eq!(
            EpochPlan::new(2, &cfg(5, false, Order::Sequential), 0).len(),
            1
        );
        assert!(EpochPlan::new(2, &cfg(5, true, Order::Sequential), 0).is_empty());
    }

    #[test]
    fn an_epoch_over_the_limit_is_an_error_not_an_allocation() {
        let c = cfg(8, false, Order::Sequential);
        // Refused before any index list is allocated (8 bytes a sample would be 32 GiB + 8).
        let err = EpochPlan::try_new(MAX_EPOCH_SAMPLES + 1, &c, 0).expect_err("too large");
        assert!(
            matches!(
                err,
                LoaderError::EpochTooLarge { samples, limit: MAX_EPOCH_SAMPLES }
                    if samples == MAX_EPOCH_SAMPLES + 1
            ),
            "{err}"
        );
        assert!(
            err.to_string().contains(&MAX_EPOCH_SAMPLES.to_string()),
            "{err}"
        );
        assert!(matches!(
            EpochPlan::try_new(usize::MAX, &c, 0),
            Err(LoaderError::EpochTooLarge { .. })
        ));
        // Within the limit it is the plan `new` makes, sharded or not.
        for shard in [None, Some(Shard::new(2, 3))] {
            let c = LoaderConfig {
                shard,
                order: Order::Shuffled { seed: 9 },
                ..cfg(4, false, Order::Sequential)
            };
            let plan = EpochPlan::try_new(50, &c, 3).expect("plan");
            assert_eq!(plan, EpochPlan::new(50, &c, 3));
            let full = epoch_order(50, c.order, 3);
            let want = shard.map_or_else(|| full.clone(), |s| shard_order(&full, s));
            assert_eq!(plan.order(), want);
            assert_eq!(plan.bytes(), want.len() * 8);
        }
    }

    #[test]
    fn shuffles_differ_per_epoch_and_reproduce() {
        let o = Order::Shuffled { seed: 42 };
        let a0 = epoch_order(100, o, 0);
        let a1 = epoch_order(100, o, 1);
        assert_ne!(a0, a1);
        assert_eq!(a0, epoch_order(100, o, 0));
        let mut s = a0.clone();
        s.sort_unstable();
        assert_eq!(s, (0..100).collect::<Vec<_>>());
        assert_ne!(a0, epoch_order(100, Order::Shuffled { seed: 43 }, 0));
    }

    #[test]
    fn shards_partition_the_epoch() {
        let mut seen = Vec::new();
        for rank in 0..3 {
            let c = LoaderConfig {
                shard: Some(Shard::new(rank, 3)),
                order: Order::Shuffled { seed: 1 },
                ..LoaderConfig::default()
            };
            let p = EpochPlan::new(11, &c, 5);
            assert_eq!(p.order().len(), 4, "every rank gets ceil(11 / 3)");
            seen.extend_from_slice(p.order());
        }
        // 12 positions: all 11 samples, and the epoch's first sample once more.
        let first = epoch_order(11, Order::Shuffled { seed: 1 }, 5)[0];
        seen.sort_unstable();
        let mut want: Vec<usize> = (0..11).collect();
        want.push(first);
        want.sort_unstable();
        assert_eq!(seen, want);
    }

    #[test]
    fn shuffle_permutations_match_known_answers() {
        // Computed by an independent Python implementation of the definition: a SplitMix64
        // generator seeded with `mix(&[seed, epoch])`, then Fisher–Yates from the last position
        // down, swapping position `i` with `below(i + 1)`.
        let o = |seed| Order::Shuffled { seed };
        assert_eq!(epoch_order(10, o(42), 0), [8, 9, 7, 0, 6, 2, 4, 3, 5, 1]);
        assert_eq!(epoch_order(10, o(42), 1), [7, 2, 3, 5, 0, 4, 8, 1, 9, 6]);
        assert_eq!(
            epoch_order(16, o(7), 3),
            [7, 14, 0, 10, 1, 2, 12, 6, 3, 15, 11, 5, 9, 4, 13, 8]
        );
        assert_eq!(epoch_order(1, o(42), 0), [0]);
        assert!(epoch_order(0, o(42), 0).is_empty());
        // The shard of rank 1 of 3 takes positions 1, 4, 7 of the epoch order.
        // Padded to 12 by wrapping around: position 10 is position 0 again (sample 8).
        let mut c = LoaderConfig {
            shard: Some(Shard::new(1, 3)),
            batch_size: 2,
            order: o(42),
            ..LoaderConfig::default()
        };
        let p = EpochPlan::new(10, &c, 0);
        assert_eq!(p.order(), [9, 6, 3, 8]);
        assert_eq!((p.batch(0), p.batch(1)), (&[9, 6][..], &[3, 8][..]));
        c.shard = Some(Shard::new(2, 3));
        assert_eq!(EpochPlan::new(10, &c, 0).order(), [7, 2, 5, 9]);
        c.shard = Some(Shard {
            tail: crate::ShardTail::Drop,
            ..Shard::new(1, 3)
        });
        assert_eq!(EpochPlan::new(10, &c, 0).order(), [9, 6, 3]);
    }
}
