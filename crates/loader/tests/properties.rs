//! Property test: one loader runs several epochs, for any data-set length, batch size, worker
//! count, prefetch factor, drop_last, order, shard, persistent or per-epoch workers, batch type
//! (plain vectors, or buffers from the loader's staging pool), and any pattern of epochs
//! dropped early (after `k` batches) or started out of turn. Every epoch delivers exactly the
//! expected batches in sampler order (a prefix of them when dropped early); the loader never
//! holds more than `prefetch_factor × workers` batches; per-epoch workers leave nothing behind
//! at the end of each epoch; worker threads are spawned once when persistent and once per epoch
//! otherwise; and once the loader is dropped its memory accounting is back to its baseline
//! (every term zero), whatever work was in flight or built ahead.

use std::sync::Arc;

use proptest::prelude::*;
use trainmem_loader::{
    BatchBuffer, BoxError, HeldBytes, Loader, LoaderConfig, LoaderMemory, Order, Shard,
    WorkerContext, epoch_order, mix,
};

fn jittered(x: &u64, _: &mut WorkerContext) -> Result<u64, BoxError> {
    // Make batches finish out of order across workers (without sleeping: a few yields).
    for _ in 0..mix(&[*x]) % 3 {
        std::thread::yield_now();
    }
    Ok(*x)
}

/// A batch either as a plain vector or as a buffer from the loader (the staging pool when
/// `reuse_buffers` is on, a heap buffer otherwise), so both kinds of accounting are exercised.
enum Batch {
    Plain(Vec<u64>),
    Buffer(BatchBuffer),
}

impl HeldBytes for Batch {
    fn byte_size(&self) -> usize {
        match self {
            Batch::Plain(v) => v.byte_size(),
            Batch::Buffer(b) => b.byte_size(),
        }
    }
}

impl Batch {
    fn values(&self) -> Vec<u64> {
        match self {
            Batch::Plain(v) => v.clone(),
            Batch::Buffer(b) => b
                .as_bytes()
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
                .collect(),
        }
    }
}

fn plain(items: Vec<u64>, _: &mut WorkerContext) -> Result<Batch, BoxError> {
    Ok(Batch::Plain(items))
}

fn buffered(items: Vec<u64>, ctx: &mut WorkerContext) -> Result<Batch, BoxError> {
    let bytes: Vec<[u8; 8]> = items.iter().map(|x| x.to_le_bytes()).collect();
    let len = bytes.len() * 8;
    Ok(Batch::Buffer(
        ctx.alloc_concat(len, bytes.iter().map(|b| &b[..])),
    ))
}

/// The expected batches, computed from the definition: the epoch order, cycled to a multiple
/// of the world size (PyTorch's padding), positions `rank, rank + world, ...`, cut into `batch`
/// chunks, the short tail dropped with drop_last.
fn expected(len: usize, c: &LoaderConfig, epoch: u64) -> Vec<Vec<u64>> {
    let full = epoch_order(len, c.order, epoch);
    let (rank, world) = c.shard.map_or((0, 1), |s| (s.rank, s.world_size));
    let padded = len.div_ceil(world) * world;
    let mine: Vec<u64> = full
        .iter()
        .cycle()
        .take(padded)
        .enumerate()
        .filter(|(pos, _)| pos % world == rank)
        .map(|(_, &i)| i as u64)
        .collect();
    mine.chunks(c.batch_size)
        .filter(|ch| !c.drop_last || ch.len() == c.batch_size)
        .map(<[u64]>::to_vec)
        .collect()
}

/// One epoch of a run: which epoch to start, and how many batches to take before dropping it.
#[derive(Debug, Clone)]
struct Step {
    /// `None`: the next epoch (`Loader::epoch`); `Some(e)`: `Loader::epoch_at(e)`.
    jump: Option<u64>,
    /// Batches taken before the epoch is dropped (beyond the epoch's length: run to the end,
    /// and call `next` once more after `None`).
    take: usize,
}

fn step() -> impl Strategy<Value = Step> {
    (
        prop_oneof![4 => Just(None), 1 => (0u64..5).prop_map(Some)],
        prop_oneof![2 => 0usize..6, 1 => Just(usize::MAX)],
    )
        .prop_map(|(jump, take)| Step { jump, take })
}

fn config() -> impl Strategy<Value = LoaderConfig> {
    (
        (1usize..6, any::<bool>(), proptest::option::of(0u64..1000)),
        (1usize..4, 0usize..3),
        (0usize..4, 1usize..4, any::<bool>(), any::<bool>()),
    )
        .prop_map(
            |((batch, drop_last, seed), (world, rank), (workers, prefetch, persistent, reuse))| {
                LoaderConfig {
                    batch_size: batch,
                    drop_last,
                    order: seed.map_or(Order::Sequential, |seed| Order::Shuffled { seed }),
                    // World 1 stands for "no shard".
                    shard: (world > 1).then(|| Shard::new(rank % world, world)),
                    workers,
                    prefetch_factor: prefetch,
                    persistent_workers: persistent,
                    reuse_buffers: reuse,
                    seed: 11,
                    ..LoaderConfig::default()
                }
            },
        )
}

/// `memory` with nothing in flight: no batch queued, reordered, being built or ready, no
/// scratch, no index list; staging blocks only idle in the pool (no batch holds one).
fn assert_quiet(m: &LoaderMemory) -> Result<(), TestCaseError> {
    prop_assert_eq!(
        (
            m.queue,
            m.reorder,
            m.building,
            m.scratch,
            m.sampler,
            m.ready_batches
        ),
        (0, 0, 0, 0, 0, 0),
        "{:?}",
        m
    );
    prop_assert_eq!(m.staging, m.staging_idle, "{:?}", m);
    prop_assert_eq!(m.total, m.staging_idle, "{:?}", m);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    #[test]
    fn epochs_of_one_loader_deliver_the_sampler_order_and_leak_nothing(
        len in 0usize..40,
        config in config(),
        buffers: bool,
        steps in proptest::collection::vec(step(), 1..6),
    ) {
        let data: Arc<Vec<u64>> = Arc::new((0..len as u64).collect());
        let collate = if buffers { buffered } else { plain };
        let mut loader = Loader::with_transform(Arc::clone(&data), config.clone(), jittered, collate)
            .expect("valid config");
        let watch = loader.memory_watch();
        let baseline = watch.current();
        prop_assert_eq!(baseline, LoaderMemory::default());
        let in_flight = config.max_batches_in_flight();
        let per_epoch_workers = config.workers > 0 && !config.persistent_workers;

        // Persistent workers are not joined when an epoch ends: a worker that had passed its
        // last cancellation check when an epoch was dropped early (or the next epoch's work
        // built ahead was discarded by a jump) still finishes that batch, and it is counted for
        // a moment (then dropped) while the next epoch already has its P·W batches in flight.
        // Each worker holds at most one such batch, so from then on the bound is P·W + W.
        // Everywhere else it is exactly P·W.
        let stale_bound = in_flight + config.workers;
        let mut bound = in_flight;
        let mut next_epoch = 0u64;
        for (i, s) in steps.iter().enumerate() {
            let number = s.jump.unwrap_or(next_epoch);
            if config.persistent_workers && i > 0 && number != next_epoch {
                bound = stale_bound;
            }
            let want = expected(len, &config, number);
            prop_assert_eq!(want.len(), config.batches_per_epoch(len));
            let mut epoch = match s.jump {
                Some(e) => loader.epoch_at(e).expect("epoch"),
                None => loader.epoch().expect("epoch"),
            };
            prop_assert_eq!(epoch.number(), number);
            let mut got = Vec::new();
            while got.len() < s.take {
                let Some(b) = epoch.next() else { break };
                got.push(b.expect("no failures").values());
                let m = watch.current();
                prop_assert!(m.ready_batches <= bound, "{:?}", m);
            }
            if s.take > want.len() {
                // Ran to the end: the epoch stays finished.
                prop_assert!(epoch.next().is_none());
            }
            drop(epoch);
            // Exactly the first `take` batches of the expected epoch, in order.
            prop_assert_eq!(&got[..], &want[..s.take.min(want.len())], "epoch {}", number);
            if config.persistent_workers && got.len() < want.len() {
                bound = stale_bound;
            }
            let m = watch.current();
            prop_assert!(m.ready_batches <= bound, "{:?}", m);
            if config.workers == 0 || !config.persistent_workers {
                // Per-epoch workers are joined when the epoch is dropped (and without workers
                // nothing runs between batches): nothing of the epoch is left.
                assert_quiet(&m)?;
            }
            next_epoch = number + 1;
        }

        let spawned = loader.threads_spawned();
        if per_epoch_workers {
            prop_assert_eq!(spawned, (config.workers * steps.len()) as u64);
        } else {
            // Persistent workers are spawned once, at the first epoch (none at all without
            // workers).
            prop_assert_eq!(spawned, config.workers as u64);
        }
        // (Without workers a batch is counted for a moment in the caller's thread.)
        prop_assert!(watch.peaks().ready_batches <= bound.max(1), "{:?}", watch.peaks());
        drop(loader);
        // Everything the loader counted is released with it: batches built ahead for the
        // next epoch, its index list, the staging pool.
        prop_assert_eq!(watch.current(), baseline);
    }
}
