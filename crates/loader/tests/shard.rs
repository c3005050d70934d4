//! Ranks in step: for any data-set length, world size, batch size, `drop_last`, shard tail
//! policy, order and run of epochs, every rank of a world gets the same number of samples and
//! of batches, and together the ranks read every sample of the epoch exactly once, plus the
//! documented repeats when padding (the first `padded - len` positions of the epoch order, read
//! again) or minus the documented tail when dropping (its last `len % world` positions).

use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::prelude::*;
use trainmem_loader::{
    BoxError, EpochPlan, Loader, LoaderConfig, Order, Shard, ShardTail, WorkerContext, epoch_order,
};

fn counts(items: impl IntoIterator<Item = usize>) -> BTreeMap<usize, usize> {
    let mut m = BTreeMap::new();
    for i in items {
        *m.entry(i).or_insert(0) += 1;
    }
    m
}

fn config(batch: usize, drop_last: bool, seed: Option<u64>, shard: Shard) -> LoaderConfig {
    LoaderConfig {
        batch_size: batch,
        drop_last,
        order: seed.map_or(Order::Sequential, |seed| Order::Shuffled { seed }),
        shard: Some(shard),
        ..LoaderConfig::default()
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn every_rank_gets_the_same_batches_and_the_world_reads_each_sample_once(
        len in 0usize..300,
        world in 1usize..10,
        batch in 1usize..12,
        drop_last: bool,
        pad: bool,
        seed in proptest::option::of(any::<u64>()),
        first_epoch in 0u64..1000,
        epochs in 1u64..4,
    ) {
        let tail = if pad { ShardTail::Pad } else { ShardTail::Drop };
        for epoch in first_epoch..first_epoch + epochs {
            let full = epoch_order(len, config(1, false, seed, Shard::new(0, 1)).order, epoch);
            let mut per_rank = Vec::new();
            let mut read = Vec::new();
            let mut batches = Vec::new();
            for rank in 0..world {
                let c = config(batch, drop_last, seed, Shard { rank, world_size: world, tail });
                let plan = EpochPlan::new(len, &c, epoch);
                per_rank.push(plan.order().len());
                batches.push(plan.len());
                prop_assert_eq!(plan.len(), c.batches_per_epoch(len));
                prop_assert_eq!(plan.order().len(), c.samples_per_epoch(len));
                // The batches cover the rank's order in sequence (all of it, or all but a
                // short last batch with drop_last).
                let covered: Vec<usize> =
                    (0..plan.len()).flat_map(|k| plan.batch(k).to_vec()).collect();
                let whole = plan.order().len() / batch * batch;
                prop_assert_eq!(
                    covered.len(),
                    if drop_last { whole } else { plan.order().len() }
                );
                prop_assert_eq!(&covered[..], &plan.order()[..covered.len()]);
                prop_assert!((0..plan.len()).all(|k| plan.batch(k).len() == batch
                    || (!drop_last && k + 1 == plan.len())));
                read.extend_from_slice(plan.order());
            }
            // Ranks in step: the same sample count and batch count on every rank.
            prop_assert!(per_rank.iter().all(|&n| n == per_rank[0]), "{:?}", per_rank);
            prop_assert!(batches.iter().all(|&n| n == batches[0]), "{:?}", batches);
            let n = per_rank[0];
            let read = counts(read);
            if pad {
                prop_assert_eq!(n, len.div_ceil(world));
                // The epoch order repeated from its start up to `n·world` positions: every
                // sample once, and the first `n·world − len` positions once more (cycling
                // again when the world is larger than the data set).
                let padded = n * world;
                prop_assert!(padded - len < world);
                let want = counts(full.iter().copied().cycle().take(padded));
                prop_assert_eq!(&read, &want);
                // So every sample is read, and no sample more than once beyond any other.
                prop_assert_eq!(read.len(), len);
                if let Some(lo) = padded.checked_div(len) {
                    let hi = padded.div_ceil(len);
                    prop_assert!(read.values().all(|&c| c == lo || c == hi), "{:?}", read);
                }
            } else {
                prop_assert_eq!(n, len / world);
                // Every sample at most once; the ones left out are the last `len % world`
                // positions of the epoch order.
                let kept = n * world;
                prop_assert_eq!(read, counts(full[..kept].iter().copied()));
                prop_assert_eq!(len - kept, len % world);
            }
        }
    }
}

fn identity(x: &u64, _: &mut WorkerContext) -> Result<u64, BoxError> {
    Ok(*x)
}

fn collect(items: Vec<u64>, _: &mut WorkerContext) -> Result<Vec<u64>, BoxError> {
    Ok(items)
}

#[test]
fn loaders_of_every_rank_run_the_same_number_of_steps() {
    // 10 samples, 4 ranks, batch 2: 3 samples each when padding (2 batches), 2 when dropping
    // the tail (1 batch); the uneven split of old (3, 3, 2, 2) would leave ranks 2 and 3 a
    // step short.
    let data: Arc<Vec<u64>> = Arc::new((0..10).collect());
    for (tail, steps, samples) in [(ShardTail::Pad, 2, 12), (ShardTail::Drop, 1, 8)] {
        let mut seen = Vec::new();
        for rank in 0..4 {
            let c = LoaderConfig {
                workers: rank % 3,
                ..config(
                    2,
                    false,
                    Some(5),
                    Shard {
                        rank,
                        world_size: 4,
                        tail,
                    },
                )
            };
            let mut loader =
                Loader::with_transform(Arc::clone(&data), c, identity, collect).expect("loader");
            let got: Vec<Vec<u64>> = loader
                .epoch()
                .expect("epoch")
                .map(|b| b.expect("batch"))
                .collect();
            assert_eq!(got.len(), steps, "rank {rank} with {tail:?}");
            seen.extend(got.into_iter().flatten());
        }
        assert_eq!(seen.len(), samples);
        let distinct = counts(seen.iter().map(|&x| x as usize)).len();
        assert_eq!(distinct, if tail == ShardTail::Pad { 10 } else { 8 });
    }
}
