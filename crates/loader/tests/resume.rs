//! Resumption: a run stopped at any batch and resumed from its saved [`LoaderState`] (through
//! JSON, as a checkpoint would carry it) delivers exactly the batches an uninterrupted run
//! delivers after that point, in order, with any worker count, prefetch factor and worker
//! lifetime on either side, whether the state is read from the epoch or from the loader, and
//! whether a fresh loader resumes or the same loader is restored.

use std::sync::Arc;

use proptest::prelude::*;
use trainmem_loader::{
    BoxError, Loader, LoaderConfig, LoaderError, LoaderState, Order, ResumeError, Shard, ShardTail,
    WorkerContext, mix,
};

/// A transform that makes batches finish out of order across workers.
fn jittered(x: &u64, _: &mut WorkerContext) -> Result<u64, BoxError> {
    for _ in 0..mix(&[*x]) % 3 {
        std::thread::yield_now();
    }
    Ok(*x)
}

/// The batch's samples, then a draw from the batch's generator (which must continue too).
fn collate(mut items: Vec<u64>, ctx: &mut WorkerContext) -> Result<Vec<u64>, BoxError> {
    items.push(ctx.rng().next_u64());
    Ok(items)
}

type Batches = Vec<(u64, Vec<u64>)>;

/// The knobs that decide the batches: drawn once per case, shared by both runs.
fn content() -> impl Strategy<Value = LoaderConfig> {
    (
        1usize..5,
        any::<bool>(),
        proptest::option::of(0u64..1000),
        (1usize..4, 0usize..3, any::<bool>()),
    )
        .prop_map(
            |(batch, drop_last, seed, (world, rank, pad))| LoaderConfig {
                batch_size: batch,
                drop_last,
                order: seed.map_or(Order::Sequential, |seed| Order::Shuffled { seed }),
                shard: (world > 1).then(|| Shard {
                    rank: rank % world,
                    world_size: world,
                    tail: if pad { ShardTail::Pad } else { ShardTail::Drop },
                }),
                seed: 5,
                ..LoaderConfig::default()
            },
        )
}

/// The knobs that decide only how batches are built: drawn separately for each run.
#[derive(Debug, Clone, Copy)]
struct Build {
    workers: usize,
    prefetch: usize,
    persistent: bool,
}

fn build() -> impl Strategy<Value = Build> {
    (0usize..=3, 1usize..4, any::<bool>()).prop_map(|(workers, prefetch, persistent)| Build {
        workers,
        prefetch,
        persistent,
    })
}

fn with(content: &LoaderConfig, b: Build) -> LoaderConfig {
    LoaderConfig {
        workers: b.workers,
        prefetch_factor: b.prefetch,
        persistent_workers: b.persistent,
        ..content.clone()
    }
}

type TestLoader = Loader<
    Vec<u64>,
    trainmem_loader::MapCollate<
        fn(&u64, &mut WorkerContext) -> Result<u64, BoxError>,
        fn(Vec<u64>, &mut WorkerContext) -> Result<Vec<u64>, BoxError>,
    >,
>;

fn loader(data: &Arc<Vec<u64>>, config: LoaderConfig) -> TestLoader {
    Loader::with_transform(
        Arc::clone(data),
        config,
        jittered as fn(&u64, &mut WorkerContext) -> Result<u64, BoxError>,
        collate as fn(Vec<u64>, &mut WorkerContext) -> Result<Vec<u64>, BoxError>,
    )
    .expect("valid config")
}

/// Runs `loader` until the start of epoch `end`, collecting `(epoch, batch)`.
fn run_to(loader: &mut TestLoader, end: u64, out: &mut Batches) {
    while loader.state().epoch < end {
        let mut epoch = loader.epoch().expect("epoch");
        let number = epoch.number();
        for b in epoch.by_ref() {
            out.push((number, b.expect("no failures")));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn a_resumed_run_delivers_exactly_the_batches_not_yet_seen(
        len in 0usize..24,
        content in content(),
        first in build(),
        second in build(),
        epochs in 1u64..4,
        stop_frac in 0.0f64..=1.0,
        from_epoch: bool,
        same_loader: bool,
    ) {
        let data: Arc<Vec<u64>> = Arc::new((0..len as u64).collect());

        // The uninterrupted run.
        let mut whole = Vec::new();
        run_to(&mut loader(&data, with(&content, second)), epochs, &mut whole);
        prop_assert_eq!(
            whole.len(),
            epochs as usize * content.batches_per_epoch(len)
        );

        // The interrupted run: stop after `stop` batches (possibly at an epoch boundary, or
        // with none delivered), save the state through JSON, resume.
        let stop = (stop_frac * whole.len() as f64) as usize;
        let mut original = loader(&data, with(&content, first));
        let mut got: Batches = Vec::new();
        let saved = loop {
            let mut epoch = original.epoch().expect("epoch");
            let number = epoch.number();
            while got.len() < stop {
                let Some(b) = epoch.next() else { break };
                got.push((number, b.expect("no failures")));
            }
            let at_stop = got.len() == stop;
            let state = epoch.state();
            drop(epoch);
            // The epoch's view and the loader's agree.
            prop_assert_eq!(&state, &original.state());
            if at_stop {
                break if from_epoch { state } else { original.state() };
            }
        };
        let per_epoch = content.batches_per_epoch(len);
        if let Some(epoch) = stop.checked_div(per_epoch) {
            prop_assert_eq!(saved.epoch, epoch as u64);
            prop_assert_eq!(saved.batches_delivered, stop % per_epoch);
        }
        let text = serde_json::to_string(&saved).expect("serialise");
        let back: LoaderState = serde_json::from_str(&text).expect("deserialise");
        let mut resumed = if same_loader {
            original.restore(&back).expect("same knobs");
            original
        } else {
            drop(original);
            Loader::resume(
                Arc::clone(&data),
                with(&content, second),
                trainmem_loader::MapCollate::new(
                    jittered as fn(&u64, &mut WorkerContext) -> Result<u64, BoxError>,
                    collate as fn(Vec<u64>, &mut WorkerContext) -> Result<Vec<u64>, BoxError>,
                ),
                &back,
            )
            .expect("same knobs")
        };
        prop_assert_eq!(&resumed.state(), &saved);
        run_to(&mut resumed, epochs, &mut got);
        prop_assert_eq!(got, whole);
    }
}

#[test]
fn a_state_that_does_not_fit_is_refused_by_name() {
    let data: Arc<Vec<u64>> = Arc::new((0..20).collect());
    let base = LoaderConfig {
        batch_size: 4,
        order: Order::Shuffled { seed: 1 },
        ..LoaderConfig::default()
    };
    let mut l = loader(&data, base.clone());
    let mut epoch = l.epoch().expect("epoch");
    epoch.next();
    epoch.next();
    let state = epoch.state();
    drop(epoch);
    assert_eq!((state.epoch, state.batches_delivered), (0, 2));

    let shorter: Arc<Vec<u64>> = Arc::new((0..19).collect());
    let err = loader(&shorter, base.clone())
        .restore(&state)
        .expect_err("length differs");
    assert!(
        matches!(
            err,
            LoaderError::Resume(ResumeError::Mismatch {
                field: "dataset_len",
                ..
            })
        ),
        "{err}"
    );
    assert!(err.to_string().contains("dataset_len = 20"), "{err}");
    let bigger = LoaderConfig {
        batch_size: 5,
        ..base.clone()
    };
    let err = loader(&data, bigger)
        .restore(&state)
        .expect_err("batch differs");
    assert!(err.to_string().contains("batch_size"), "{err}");
    // A hand-edited state past the epoch's end.
    let past = LoaderState {
        batches_delivered: 6,
        ..state.clone()
    };
    let err = loader(&data, base.clone())
        .restore(&past)
        .expect_err("past the end");
    assert!(
        matches!(err, LoaderError::Resume(ResumeError::PastEnd { .. })),
        "{err}"
    );
    // Unknown fields in a saved state are refused, not ignored.
    assert!(
        serde_json::from_str::<LoaderState>(
            r#"{"epoch":0,"batches_delivered":0,"dataset_len":1,"batch_size":1,"drop_last":false,"order":{"kind":"sequential"},"shard":null,"seed":0,"extra":1}"#
        )
        .is_err()
    );
}

#[test]
fn persistent_workers_built_ahead_are_discarded_when_restoring_mid_epoch() {
    let data: Arc<Vec<u64>> = Arc::new((0..12).collect());
    let c = LoaderConfig {
        batch_size: 3,
        workers: 2,
        prefetch_factor: 2,
        persistent_workers: true,
        order: Order::Shuffled { seed: 8 },
        ..LoaderConfig::default()
    };
    let mut l = loader(&data, c.clone());
    // Epoch 0 to its end: the workers now hold epoch 1's first batches.
    let e0: Vec<Vec<u64>> = l.epoch().expect("epoch").map(|b| b.expect("ok")).collect();
    assert_eq!(l.state().epoch, 1);
    // Go back to the middle of epoch 0.
    let back = LoaderState::at(&c, 12, 0, 2);
    l.restore(&back).expect("fits");
    let rest: Vec<Vec<u64>> = l.epoch().expect("epoch").map(|b| b.expect("ok")).collect();
    assert_eq!(rest, e0[2..]);
    assert_eq!(l.state().epoch, 1);
    drop(l);
}
