//! Property tests: for any data-set length, batch size, worker count, prefetch factor,
//! drop_last, order and shard split, each epoch delivers every sample of the shard exactly once
//! (or the documented drop_last subset), in sampler order, and the ranks together cover the
//! data set exactly once.

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use trainmem_loader::{
    BoxError, Loader, LoaderConfig, Order, Shard, WorkerContext, epoch_order, mix,
};

fn jittered(x: &u64, _: &mut WorkerContext) -> Result<u64, BoxError> {
    // Make batches finish out of order across workers.
    let spin = mix(&[*x]) % 4;
    if spin == 0 {
        std::thread::sleep(Duration::from_micros(50));
    }
    Ok(*x)
}

fn collect(items: Vec<u64>, _: &mut WorkerContext) -> Result<Vec<u64>, BoxError> {
    Ok(items)
}

/// The expected batches, computed from the definition: the epoch order, positions
/// `rank, rank + world, ...`, cut into `batch` chunks, the short tail dropped with drop_last.
fn expected(len: usize, c: &LoaderConfig, epoch: u64) -> Vec<Vec<u64>> {
    let full = epoch_order(len, c.order, epoch);
    let (rank, world) = c.shard.map_or((0, 1), |s| (s.rank, s.world_size));
    let mine: Vec<u64> = full
        .iter()
        .enumerate()
        .filter(|(pos, _)| pos % world == rank)
        .map(|(_, &i)| i as u64)
        .collect();
    mine.chunks(c.batch_size)
        .filter(|ch| !c.drop_last || ch.len() == c.batch_size)
        .map(<[u64]>::to_vec)
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn every_sample_once_in_sampler_order(
        len in 0usize..70,
        batch in 1usize..9,
        workers in 0usize..4,
        prefetch in 1usize..4,
        drop_last: bool,
        seed in proptest::option::of(0u64..1000),
        world in 1usize..4,
        persistent: bool,
    ) {
        let data: Arc<Vec<u64>> = Arc::new((0..len as u64).collect());
        let order = seed.map_or(Order::Sequential, |seed| Order::Shuffled { seed });
        for epoch in 0..2u64 {
            let mut union = Vec::new();
            for rank in 0..world {
                let config = LoaderConfig {
                    batch_size: batch,
                    drop_last,
                    order,
                    shard: Some(Shard { rank, world_size: world }),
                    workers,
                    prefetch_factor: prefetch,
                    persistent_workers: persistent,
                    ..LoaderConfig::default()
                };
                let mut loader = Loader::with_transform(Arc::clone(&data), config.clone(), jittered, collect)
                    .expect("valid config");
                let got: Vec<Vec<u64>> = loader
                    .epoch_at(epoch)
                    .expect("epoch")
                    .map(|b| b.expect("no failures"))
                    .collect();
                prop_assert_eq!(&got, &expected(len, &config, epoch));
                prop_assert_eq!(got.len(), config.batches_per_epoch(len));
                for b in &got {
                    prop_assert!(b.len() == batch || (!drop_last && b.len() < batch));
                }
                union.extend(got.into_iter().flatten());
            }
            union.sort_unstable();
            let before = union.len();
            union.dedup();
            prop_assert_eq!(union.len(), before, "a sample was delivered twice");
            if !drop_last {
                prop_assert_eq!(union, (0..len as u64).collect::<Vec<_>>());
            } else {
                // Each rank drops less than one batch.
                prop_assert!(union.len() + world * batch > len || len == 0 || union.len() == len);
            }
        }
    }
}
