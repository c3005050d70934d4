//! Loader behaviour: contents, order, failures, shutdown, timeouts, worker lifetime, staging
//! and the in-flight memory bound.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::TempDir;
use trainmem_loader::fixtures::{FixtureSpec, feature_value, write_fixture};
use trainmem_loader::{
    BoxError, ColumnBatch, HeldBytes, Loader, LoaderConfig, LoaderError, MmapDataset, Order,
    RandomResize, ResizeColumns, ScratchResize, StackColumns, WorkerContext,
};

fn identity(x: &u64, _: &mut WorkerContext) -> Result<u64, BoxError> {
    Ok(*x)
}

fn collect(items: Vec<u64>, _: &mut WorkerContext) -> Result<Vec<u64>, BoxError> {
    Ok(items)
}

fn numbers(n: u64) -> Arc<Vec<u64>> {
    Arc::new((0..n).collect())
}

fn cfg(batch: usize, workers: usize) -> LoaderConfig {
    LoaderConfig {
        batch_size: batch,
        workers,
        ..LoaderConfig::default()
    }
}

#[test]
fn stacked_columns_hold_the_fixture_values_in_order() {
    let dir = TempDir::new("stack");
    let spec = FixtureSpec {
        samples: 103,
        dim: 5,
        classes: 3,
        seed: 4,
        ..FixtureSpec::default()
    };
    let paths = write_fixture(dir.path(), &spec, |_, _| {}).expect("fixture");
    let ds = Arc::new(MmapDataset::open(&[&paths.features, &paths.labels]).expect("open"));
    for (workers, order) in [(0, Order::Sequential), (2, Order::Shuffled { seed: 9 })] {
        let config = LoaderConfig {
            order,
            ..cfg(10, workers)
        };
        let mut loader = Loader::new(Arc::clone(&ds), config, StackColumns).expect("loader");
        let mut seen = Vec::new();
        for batch in loader.epoch().expect("epoch") {
            let b: ColumnBatch = batch.expect("batch");
            assert_eq!(b.shapes[0], vec![b.len(), 5]);
            let f = b.column::<f32>(0).expect("f32 column");
            for (row, &i) in b.indices.iter().enumerate() {
                for j in 0..5 {
                    assert_eq!(f[row * 5 + j], feature_value(4, i, j));
                }
            }
            assert_eq!(b.column::<i64>(1).expect("labels").len(), b.len());
            seen.extend_from_slice(&b.indices);
        }
        seen.sort_unstable();
        assert_eq!(seen, (0..103).collect::<Vec<_>>());
    }
}

#[test]
fn a_panicking_transform_names_the_sample_and_the_epoch_goes_on() {
    for workers in [0, 1, 3] {
        let mut loader = Loader::with_transform(
            numbers(40),
            cfg(4, workers),
            |x: &u64, _ctx: &mut WorkerContext| -> Result<u64, BoxError> {
                if *x == 17 {
                    panic!("bad sample {x}");
                }
                if *x == 30 {
                    return Err("cannot decode".into());
                }
                Ok(*x)
            },
            collect,
        )
        .expect("loader");
        let results: Vec<_> = loader.epoch().expect("epoch").collect();
        assert_eq!(results.len(), 10, "no batch lost");
        for (k, r) in results.iter().enumerate() {
            match (k, r) {
                (
                    4,
                    Err(
                        e @ LoaderError::Panic {
                            sample: Some(17),
                            batch: 4,
                            ..
                        },
                    ),
                ) => {
                    assert!(e.to_string().contains("sample 17"), "{e}");
                    assert!(e.to_string().contains("bad sample 17"), "{e}");
                }
                (
                    7,
                    Err(
                        e @ LoaderError::Sample {
                            sample: Some(30), ..
                        },
                    ),
                ) => {
                    assert!(e.to_string().contains("cannot decode"), "{e}");
                }
                (_, Ok(b)) => {
                    assert_eq!(b, &((k as u64 * 4)..(k as u64 * 4 + 4)).collect::<Vec<_>>())
                }
                (_, other) => panic!("batch {k} with {workers} workers: {other:?}"),
            }
        }
        // The loader is still usable.
        assert_eq!(loader.epoch().expect("epoch").count(), 10);
    }
}

#[test]
fn a_panicking_collate_and_init_hook_are_errors() {
    let mut loader = Loader::with_transform(
        numbers(8),
        cfg(4, 2),
        identity,
        |items: Vec<u64>, _: &mut WorkerContext| -> Result<Vec<u64>, BoxError> {
            if items[0] == 4 {
                panic!("collate broke");
            }
            Ok(items)
        },
    )
    .expect("loader");
    let r: Vec<_> = loader.epoch().expect("epoch").collect();
    assert!(r[0].is_ok());
    match &r[1] {
        Err(
            e @ LoaderError::Panic {
                sample: None,
                batch: 1,
                ..
            },
        ) => {
            assert!(e.to_string().contains("collate of batch 1"), "{e}")
        }
        other => panic!("{other:?}"),
    }

    let mut loader = Loader::with_transform(numbers(8), cfg(2, 2), identity, collect)
        .expect("loader")
        .with_worker_init(|info| {
            if info.id == 1 {
                panic!("no GPU for worker 1");
            }
        });
    let r: Vec<_> = loader.epoch().expect("epoch").collect();
    assert_eq!(r.len(), 4);
    assert!(r.iter().all(|b| match b {
        Ok(_) => true,
        Err(LoaderError::WorkerInit { worker: 1, message }) => message.contains("no GPU"),
        Err(_) => false,
    }));
}

#[test]
fn init_hooks_get_per_worker_seeds_and_lifetimes_differ() {
    for persistent in [false, true] {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s2 = Arc::clone(&seen);
        let config = LoaderConfig {
            persistent_workers: persistent,
            prefetch_factor: 3,
            ..cfg(3, 3)
        };
        let mut loader = Loader::with_transform(numbers(30), config, identity, collect)
            .expect("loader")
            .with_worker_init(move |info| s2.lock().expect("lock").push((info.id, info.seed)));
        for _ in 0..3 {
            let got: Vec<u64> = loader
                .epoch()
                .expect("epoch")
                .flat_map(|b| b.expect("batch"))
                .collect();
            assert_eq!(got, (0..30).collect::<Vec<_>>());
        }
        let expected_spawns = if persistent { 3 } else { 9 };
        assert_eq!(loader.threads_spawned(), expected_spawns);
        // Dropping the loader joins persistent workers, so every init hook has run.
        drop(loader);
        let seen = seen.lock().expect("lock").clone();
        assert_eq!(seen.len(), expected_spawns as usize);
        let mut seeds: Vec<u64> = seen.iter().map(|s| s.1).collect();
        seeds.sort_unstable();
        seeds.dedup();
        assert_eq!(
            seeds.len(),
            seen.len(),
            "every worker (and respawn) has its own seed"
        );
    }
}

#[test]
fn dropping_an_epoch_stops_and_joins_workers() {
    for persistent in [false, true] {
        let calls = Arc::new(AtomicUsize::new(0));
        let active = Arc::new(AtomicUsize::new(0));
        let (c2, a2) = (Arc::clone(&calls), Arc::clone(&active));
        let config = LoaderConfig {
            persistent_workers: persistent,
            ..cfg(8, 3)
        };
        let mut loader = Loader::with_transform(
            numbers(100_000),
            config,
            move |x: &u64, _: &mut WorkerContext| -> Result<u64, BoxError> {
                a2.fetch_add(1, Ordering::SeqCst);
                c2.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(Duration::from_micros(200));
                a2.fetch_sub(1, Ordering::SeqCst);
                Ok(*x)
            },
            collect,
        )
        .expect("loader");
        {
            let mut epoch = loader.epoch().expect("epoch");
            assert!(epoch.next().expect("first").is_ok());
        }
        if !persistent {
            // Joined: no transform can still be running.
            assert_eq!(active.load(Ordering::SeqCst), 0);
        }
        // Workers only ever get the tasks the credit scheme handed out: the first P·W batches,
        // plus one for the batch taken. Cancelled, they build nothing more.
        let handed_out = (loader.config().max_batches_in_flight() + 1) * 8;
        let after_drop = calls.load(Ordering::SeqCst);
        assert!(
            after_drop <= handed_out,
            "workers kept going: {after_drop} samples, {handed_out} handed out"
        );
        // The next epoch starts cleanly and delivers in order.
        let first: Vec<u64> = loader
            .epoch()
            .expect("epoch")
            .next()
            .expect("batch")
            .expect("ok");
        assert_eq!(first, (0..8).collect::<Vec<_>>());
        let m = loader.memory();
        drop(loader);
        assert_eq!(active.load(Ordering::SeqCst), 0);
        if !persistent {
            // Per-epoch workers are joined, so nothing of the dropped epochs is left.
            assert_eq!(
                (m.queue, m.reorder, m.ready_batches, m.building),
                (0, 0, 0, 0),
                "{m:?}"
            );
        }
    }
}

#[test]
fn a_slow_batch_times_out_and_ends_the_epoch() {
    // Deterministic, whatever the machine's speed: one worker and prefetch 3, so batches 0, 1
    // and 2 are handed out at the epoch start and built in that order by the same thread.
    // Sample 4 (the first of batch 2) reports that it started and then holds until the loader
    // cancels the epoch. When the test hears from it, batches 0 and 1 have already been sent
    // (same thread, earlier), so they are taken without waiting; batch 2 cannot arrive before
    // the consumer gives up on it. The timeout is the only way out for batch 2.
    let (started_tx, started_rx) = std::sync::mpsc::channel::<()>();
    let saw_cancel = Arc::new(AtomicBool::new(false));
    let saw = Arc::clone(&saw_cancel);
    let config = LoaderConfig {
        timeout_ms: Some(50),
        prefetch_factor: 3,
        ..cfg(2, 1)
    };
    let mut loader = Loader::with_transform(
        numbers(10),
        config,
        move |x: &u64, ctx: &mut WorkerContext| -> Result<u64, BoxError> {
            if *x == 4 {
                started_tx.send(()).expect("the test listens");
                // Poll the cancel flag; the deadline is only a guard that turns a loader
                // whose timeout never fires into a failed assertion below instead of a hang.
                let guard = Instant::now() + Duration::from_secs(120);
                while !ctx.is_cancelled() && Instant::now() < guard {
                    std::thread::sleep(Duration::from_millis(1));
                }
                saw.store(ctx.is_cancelled(), Ordering::SeqCst);
            }
            Ok(*x)
        },
        collect,
    )
    .expect("loader");
    let mut epoch = loader.epoch().expect("epoch");
    started_rx.recv().expect("batch 2 started");
    let r: Vec<_> = epoch.by_ref().collect();
    assert_eq!(r.len(), 3, "{r:?}");
    assert_eq!(r[0].as_ref().expect("batch 0"), &[0, 1]);
    assert_eq!(r[1].as_ref().expect("batch 1"), &[2, 3]);
    assert!(
        matches!(
            r[2],
            Err(LoaderError::Timeout {
                epoch: 0,
                batch: 2,
                timeout_ms: 50,
            })
        ),
        "{:?}",
        r[2]
    );
    // The epoch is over, and its worker was stopped by the cancellation. A timeout does not
    // join the worker: wait for it to exit (the deadline only turns a hang into a failure).
    assert!(epoch.next().is_none());
    drop(epoch);
    wait_for("the timed-out worker to exit", || {
        loader.abandoned_workers() == 0
    });
    assert!(saw_cancel.load(Ordering::SeqCst), "batch 2 was cancelled");
    let m = loader.memory();
    assert_eq!(
        (m.ready_batches, m.queue, m.reorder, m.total),
        (0, 0, 0, 0),
        "{m:?}"
    );
}

/// Polls `done` until it holds; panics naming `what` after a minute (a guard against a hang,
/// never a measurement: every caller expects `done` to hold within milliseconds).
fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let guard = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < guard, "still waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_timeout_does_not_wait_for_a_transform_that_hangs() {
    // Sample 4 (the first of batch 2) blocks until the test releases it, ignoring the cancel
    // flag, as a transform stuck in I/O would. The test releases it only after the timeout
    // error has arrived, the next epoch has run, and the loader has been dropped: a loader that
    // waits for its workers at any of these points holds until the guard in the transform runs
    // out, which the transform reports and the test fails on. No duration is measured.
    for persistent in [false, true] {
        let (started_tx, started_rx) = std::sync::mpsc::channel::<()>();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let release_rx = Mutex::new(release_rx);
        let hang_once = Arc::new(AtomicBool::new(true));
        let released = Arc::new(AtomicBool::new(false));
        let (hang, rel) = (Arc::clone(&hang_once), Arc::clone(&released));
        let data = numbers(10);
        let config = LoaderConfig {
            timeout_ms: Some(50),
            prefetch_factor: 3,
            persistent_workers: persistent,
            ..cfg(2, 1)
        };
        let mut loader = Loader::with_transform(
            Arc::clone(&data),
            config,
            move |x: &u64, _: &mut WorkerContext| -> Result<u64, BoxError> {
                if *x == 4 && hang.swap(false, Ordering::SeqCst) {
                    started_tx.send(()).expect("the test listens");
                    let rx = release_rx.lock().expect("one hanging sample");
                    let by_test = rx.recv_timeout(Duration::from_secs(60)).is_ok();
                    rel.store(by_test, Ordering::SeqCst);
                }
                Ok(*x)
            },
            collect,
        )
        .expect("loader");
        let mut epoch = loader.epoch().expect("epoch");
        started_rx.recv().expect("batch 2 started");
        let r: Vec<_> = epoch.by_ref().collect();
        assert_eq!(r.len(), 3, "persistent={persistent}: {r:?}");
        assert!(
            matches!(r[2], Err(LoaderError::Timeout { batch: 2, .. })),
            "persistent={persistent}: {:?}",
            r[2]
        );
        assert!(epoch.next().is_none());
        drop(epoch);
        // The worker is still in the transform: the error did not wait for it.
        assert_eq!(loader.abandoned_workers(), 1, "persistent={persistent}");
        // The loader goes on: a hook can be set, and the next epoch runs on fresh workers.
        let inits = Arc::new(AtomicUsize::new(0));
        let i2 = Arc::clone(&inits);
        let mut loader = loader.with_worker_init(move |_| {
            i2.fetch_add(1, Ordering::SeqCst);
        });
        let next: Vec<Vec<u64>> = loader
            .epoch()
            .expect("next epoch")
            .collect::<Result<_, _>>()
            .expect("every batch of the next epoch");
        assert_eq!(next.concat(), (0..10).collect::<Vec<_>>());
        assert_eq!(inits.load(Ordering::SeqCst), 1, "one fresh worker");
        assert_eq!(loader.threads_spawned(), 2, "persistent={persistent}");
        assert_eq!(loader.abandoned_workers(), 1);
        // Dropping the loader does not wait for it either.
        drop(loader);
        assert!(!released.load(Ordering::SeqCst));
        release_tx.send(()).expect("the transform still waits");
        // Released, the worker returns, builds nothing more and exits: it was the last holder
        // of the data set besides the test.
        wait_for("the retired worker to exit", || {
            Arc::strong_count(&data) == 1
        });
        assert!(
            released.load(Ordering::SeqCst),
            "persistent={persistent}: the loader waited for the hanging transform"
        );
    }
}

#[test]
fn empty_data_set_and_oversized_batch() {
    for workers in [0, 2] {
        let mut l =
            Loader::with_transform(numbers(0), cfg(4, workers), identity, collect).expect("loader");
        assert_eq!(l.epoch().expect("epoch").count(), 0);
        let mut l = Loader::with_transform(numbers(3), cfg(10, workers), identity, collect)
            .expect("loader");
        let b: Vec<_> = l.epoch().expect("epoch").map(|b| b.expect("ok")).collect();
        assert_eq!(b, vec![vec![0, 1, 2]]);
        let config = LoaderConfig {
            drop_last: true,
            ..cfg(10, workers)
        };
        let mut l = Loader::with_transform(numbers(3), config, identity, collect).expect("loader");
        assert_eq!(l.epoch().expect("epoch").count(), 0);
    }
    let bad = Loader::with_transform(numbers(3), cfg(0, 0), identity, collect);
    assert!(matches!(bad, Err(LoaderError::Config(_))));
}

#[test]
fn in_flight_bytes_never_exceed_the_bound() {
    let dir = TempDir::new("bound");
    let (c, h, w) = (3, 16, 16);
    let spec = FixtureSpec {
        samples: 300,
        dim: c * h * w,
        ..FixtureSpec::default()
    };
    let paths = write_fixture(dir.path(), &spec, |_, _| {}).expect("fixture");
    let ds = Arc::new(MmapDataset::open(&[&paths.features, &paths.labels]).expect("open"));
    let resize = RandomResize {
        channels: c,
        height: h,
        width: w,
        probability: 0.7,
        max_delta: 0.3,
    };
    for (workers, prefetch, pin) in [(1, 1, false), (2, 2, false), (3, 2, true), (0, 2, false)] {
        let config = LoaderConfig {
            workers,
            prefetch_factor: prefetch,
            pin_memory: pin,
            // Fresh buffers per batch for the strict total check; pooled with pinning.
            reuse_buffers: pin,
            order: Order::Shuffled { seed: 3 },
            ..cfg(16, workers)
        };
        let mut loader = Loader::new(
            Arc::clone(&ds),
            config.clone(),
            ResizeColumns { column: 0, resize },
        )
        .expect("loader");
        let in_flight = config.max_batches_in_flight();
        let mut batch_bytes = 0;
        let mut held = Vec::new();
        let mut in_loader = (0, None);
        let mut epoch = loader.epoch().expect("epoch");
        let mut k = 0;
        while let Some(b) = epoch.next() {
            let b = b.expect("batch");
            batch_bytes = batch_bytes.max(b.byte_size());
            let m = epoch.memory();
            // Batches inside the loader (building, queued, reordered) never exceed P·W.
            assert!(m.ready_batches <= in_flight, "{m:?}");
            // Their bytes are judged after the epoch, against the largest batch of the whole
            // epoch: with pooled buffers a batch's capacity depends on the buffer it got, so a
            // batch still queued may be larger than every batch delivered so far.
            if m.building + m.queue + m.reorder > in_loader.0 {
                in_loader = (m.building + m.queue + m.reorder, Some(m));
            }
            // Hold a few batches, like a training loop that keeps the previous one.
            held.push(b);
            if held.len() > 2 {
                held.remove(0);
            }
            if k % 3 == 0 {
                std::thread::sleep(Duration::from_millis(2));
            }
            k += 1;
        }
        drop(epoch);
        drop(held);
        if workers > 0 {
            assert!(
                in_loader.0 <= in_flight * batch_bytes,
                "{} bytes inside the loader > {in_flight} x {batch_bytes}: {:?}",
                in_loader.0,
                in_loader.1
            );
        }
        let peak = loader.memory_peak();
        assert!(peak.ready_batches <= in_flight.max(1), "{peak:?}");
        let scratch_bytes = resize.max_scratch_floats() * 4;
        assert!(
            peak.scratch <= config.workers.max(1) * scratch_bytes,
            "{peak:?}"
        );
        assert!(peak.scratch > 0, "the resize used scratch");
        // The documented bound: P·W batches + W scratches (one of each in the caller's thread
        // with no workers), plus the index list.
        let bound = config.in_flight_bound(batch_bytes, scratch_bytes) + peak.sampler;
        if !pin {
            assert!(peak.total <= bound, "{peak:?} > {bound}");
        }
        let now = loader.memory();
        assert_eq!(
            (
                now.queue,
                now.reorder,
                now.building,
                now.scratch,
                now.sampler
            ),
            (0, 0, 0, 0, 0),
            "{now:?}"
        );
        if pin {
            // The pool grows only when no idle block fits: P·W in the loader, at most 2 held
            // here (3 for a moment), and one being handed over.
            assert!(peak.staging <= (in_flight + 4) * batch_bytes, "{peak:?}");
            assert!(
                now.staging > 0 && now.staging == now.staging_idle,
                "{now:?}"
            );
            assert!(
                now.staging_pinned > 0 || now.pin_failures > 0,
                "pinning reported: {now:?}"
            );
        }
    }
}

#[test]
fn augmentation_is_reproducible_whatever_the_worker_count() {
    let dir = TempDir::new("aug");
    let spec = FixtureSpec {
        samples: 40,
        dim: 2 * 8 * 8,
        ..FixtureSpec::default()
    };
    let paths = write_fixture(dir.path(), &spec, |_, _| {}).expect("fixture");
    let ds = Arc::new(MmapDataset::open(&[&paths.features]).expect("open"));
    let resize = RandomResize {
        channels: 2,
        height: 8,
        width: 8,
        probability: 0.5,
        max_delta: 0.25,
    };
    let run = |workers: usize| -> Vec<Vec<f32>> {
        let config = LoaderConfig {
            seed: 5,
            ..cfg(6, workers)
        };
        let mut l = Loader::new(Arc::clone(&ds), config, ResizeColumns { column: 0, resize })
            .expect("loader");
        l.epoch()
            .expect("epoch")
            .map(|b| b.expect("batch").column::<f32>(0).expect("f32").to_vec())
            .collect()
    };
    let a = run(0);
    assert_eq!(a, run(3));
    let plain: Vec<f32> = (0..6 * 128)
        .map(|k| feature_value(0, k / 128, k % 128))
        .collect();
    assert_ne!(a[0], plain, "some samples were resized");
}

#[test]
fn scratch_resize_keeps_the_shape_and_its_scratch_follows_the_factor_per_batch() {
    let dir = TempDir::new("scratch-resize");
    let dim = 64;
    let spec = FixtureSpec {
        samples: 64,
        dim,
        classes: 3,
        ..FixtureSpec::default()
    };
    let paths = write_fixture(dir.path(), &spec, |_, _| {}).expect("fixture");
    let ds = Arc::new(MmapDataset::open(&[&paths.features, &paths.labels]).expect("open"));
    let aug = ScratchResize {
        column: 0,
        channels: 1,
        height: 1,
        width: dim,
        scratch_factor: 2.0,
        size_variation: 0.5,
    };
    let batch = 8;
    let sample_bytes = dim * 4;
    let mut scratch_peaks = Vec::new();
    let mut loader = Loader::new(Arc::clone(&ds), cfg(batch, 0), aug).expect("loader");
    let watch = loader.memory_watch();
    let mut epoch = loader.epoch().expect("epoch");
    while let Some(b) = epoch.next() {
        let b = b.expect("batch");
        // The model's shape is kept: [batch, dim] f32 and the labels unchanged.
        assert_eq!(b.shapes[0], vec![batch, dim]);
        assert_eq!(b.column::<f32>(0).expect("f32").len(), batch * dim);
        assert_eq!(b.column::<i64>(1).expect("labels").len(), batch);
        let peak = epoch.memory();
        assert_eq!(peak.scratch, 0, "scratch is freed at the end of each batch");
        // Built in this thread by `next`: the peak since the last reset is this batch's.
        scratch_peaks.push(watch.peaks().scratch);
        watch.reset_peaks();
    }
    // Each batch's scratch is factor × (1 ± variation) × batch bytes (rounded per sample).
    let batch_bytes = (batch * sample_bytes) as f64;
    for &p in &scratch_peaks {
        let ratio = p as f64 / batch_bytes;
        assert!((1.0..=3.0 + 0.05).contains(&ratio), "{ratio}");
    }
    let distinct: std::collections::BTreeSet<usize> = scratch_peaks.iter().copied().collect();
    assert!(
        distinct.len() > 1,
        "the scratch varies per batch: {scratch_peaks:?}"
    );
}

#[test]
fn a_preloaded_data_set_serves_the_same_batches_without_its_files() {
    let dir = TempDir::new("preload");
    let spec = FixtureSpec {
        samples: 30,
        dim: 7,
        classes: 4,
        ..FixtureSpec::default()
    };
    let paths = write_fixture(dir.path(), &spec, |_, _| {}).expect("fixture");
    let mapped = Arc::new(MmapDataset::open(&[&paths.features, &paths.labels]).expect("open"));
    let pre = MmapDataset::open(&[&paths.features, &paths.labels])
        .expect("open")
        .preload()
        .expect("preload");
    assert_eq!(pre.preloaded_bytes(), 30 * 7 * 4 + 30 * 8);
    assert_eq!(mapped.preloaded_bytes(), 0);
    // The files can go: reads come from memory, and the epoch-start check does not fail.
    std::fs::remove_file(&paths.features).expect("rm");
    std::fs::write(&paths.labels, b"").expect("truncate");
    let pre = Arc::new(pre);
    let batches = |ds: &Arc<MmapDataset>| -> Vec<(Vec<f32>, Vec<i64>)> {
        let mut l = Loader::new(Arc::clone(ds), cfg(4, 2), StackColumns).expect("loader");
        l.epoch()
            .expect("epoch")
            .map(|b| {
                let b = b.expect("batch");
                (
                    b.column::<f32>(0).expect("f32").to_vec(),
                    b.column::<i64>(1).expect("i64").to_vec(),
                )
            })
            .collect()
    };
    assert_eq!(batches(&pre).len(), 8);
    assert_eq!(
        batches(&pre)[0].0[..7],
        (0..7).map(|k| feature_value(0, 0, k)).collect::<Vec<_>>()[..]
    );
}

#[test]
fn persistent_workers_prefetch_the_next_epoch_within_the_bound() {
    let data = numbers(40);
    let config = LoaderConfig {
        workers: 2,
        prefetch_factor: 2,
        persistent_workers: true,
        order: Order::Shuffled { seed: 9 },
        ..cfg(4, 2)
    };
    let in_flight = config.max_batches_in_flight();
    let orders = |persistent: bool, epochs: &[u64]| -> Vec<Vec<Vec<u64>>> {
        let c = LoaderConfig {
            persistent_workers: persistent,
            ..config.clone()
        };
        let mut loader =
            Loader::with_transform(Arc::clone(&data), c, identity, collect).expect("loader");
        epochs
            .iter()
            .map(|&e| {
                let epoch = loader.epoch_at(e).expect("epoch");
                epoch.map(|b| b.expect("batch")).collect()
            })
            .collect()
    };
    // Same batches, same order, whether or not the next epoch was started ahead of time, and
    // also when the caller jumps to another epoch (the work done ahead is discarded).
    for epochs in [&[0u64, 1, 2][..], &[0, 5, 6]] {
        assert_eq!(orders(true, epochs), orders(false, epochs), "{epochs:?}");
    }

    // Which batches get built, reported by the collate as (epoch, batch): the test waits on
    // these reports instead of on the clock.
    let (built_tx, built_rx) = std::sync::mpsc::channel::<(u64, usize)>();
    let mut loader = Loader::with_transform(
        Arc::clone(&data),
        config.clone(),
        identity,
        move |items: Vec<u64>, ctx: &mut WorkerContext| -> Result<Vec<u64>, BoxError> {
            built_tx
                .send((ctx.epoch(), ctx.batch_index()))
                .expect("the test listens");
            Ok(items)
        },
    )
    .expect("loader");
    let watch = loader.memory_watch();
    let mut epoch = loader.epoch().expect("epoch 0");
    let batches = epoch.plan().len();
    assert!(batches > in_flight);
    for _ in 0..batches {
        epoch.next().expect("a batch").expect("ok");
        let m = epoch.memory();
        assert!(m.ready_batches <= in_flight, "{m:?}");
    }
    assert!(epoch.next().is_none());
    // The workers were handed the next epoch's first P·W batches while this one ran: wait for
    // their builds to be reported (every batch of epoch 0 was taken, so its reports are all
    // in). The guard only turns a loader that never builds ahead into a failure, not a hang.
    let mut built: Vec<(u64, usize)> = Vec::new();
    while built.iter().filter(|b| b.0 == 1).count() < in_flight {
        built.push(
            built_rx
                .recv_timeout(Duration::from_secs(120))
                .expect("the next epoch's first batches are built before it starts"),
        );
    }
    let mut epoch0: Vec<usize> = built.iter().filter(|b| b.0 == 0).map(|b| b.1).collect();
    epoch0.sort_unstable();
    assert_eq!(
        epoch0,
        (0..batches).collect::<Vec<_>>(),
        "epoch 0 built once each"
    );
    let mut ahead: Vec<usize> = built.iter().filter(|b| b.0 == 1).map(|b| b.1).collect();
    ahead.sort_unstable();
    assert_eq!(ahead, (0..in_flight).collect::<Vec<_>>());
    // Each reported batch is counted as ready right after its collate returns.
    let guard = Instant::now() + Duration::from_secs(120);
    while watch.current().ready_batches < in_flight && Instant::now() < guard {
        std::thread::yield_now();
    }
    assert_eq!(
        epoch.memory().ready_batches,
        in_flight,
        "the next epoch's first P·W batches are ready before it starts"
    );
    drop(epoch);
    let epoch = loader.epoch().expect("epoch 1");
    assert_eq!(epoch.number(), 1);
    let got: Vec<Vec<u64>> = epoch.map(|b| b.expect("batch")).collect();
    assert_eq!(got, orders(false, &[0, 1])[1], "epoch 1 in its own order");
    assert_eq!(loader.threads_spawned(), 2);
    // The batches built ahead were used, not built again: epoch 1's batches are each built
    // exactly once. (Its remaining batches, and epoch 2's first P·W, were handed out while it
    // ran; their reports are in once those batches are taken or counted ready.)
    let later: Vec<(u64, usize)> = built_rx.try_iter().collect();
    let mut epoch1: Vec<usize> = ahead;
    epoch1.extend(later.iter().filter(|b| b.0 == 1).map(|b| b.1));
    epoch1.sort_unstable();
    assert_eq!(epoch1, (0..batches).collect::<Vec<_>>(), "{later:?}");
    assert!(
        watch.peaks().ready_batches <= in_flight,
        "{:?}",
        watch.peaks()
    );
    // After the last epoch run, the batches built ahead are released with the loader state.
    drop(loader);
}

#[test]
fn build_times_count_every_batch_and_see_a_slow_one() {
    // Batch 0 (samples 0 and 1) sleeps 300 ms in its transform, the other four take
    // microseconds: the slowest build is at least 300 ms (less the 1/16 the histogram may
    // round), the median far below it. (At 50 ms, a machine busy compiling once delayed
    // three fast builds past half of it.)
    let slow = Duration::from_millis(300);
    for workers in [0, 2] {
        let mut loader = Loader::with_transform(
            numbers(10),
            cfg(2, workers),
            move |x: &u64, _: &mut WorkerContext| -> Result<u64, BoxError> {
                if *x == 0 {
                    std::thread::sleep(slow);
                }
                Ok(*x)
            },
            collect,
        )
        .expect("loader");
        let before = loader.build_times();
        assert_eq!((before.count(), before.quantile(0.5)), (0, None));
        let n = loader.epoch().expect("epoch").count();
        assert_eq!(n, 5);
        let after = loader.build_times();
        assert_eq!(after.count(), 5, "{workers} workers: every batch once");
        let max = after.quantile(1.0).expect("batches were built");
        assert!(
            max >= slow - slow / 16,
            "{workers} workers: slowest {max:?}"
        );
        assert!(after.total() >= max);
        let median = after.quantile(0.5).expect("batches were built");
        assert!(median < slow / 2, "{workers} workers: median {median:?}");
        // A second epoch: `since` counts only its batches.
        let n = loader.epoch().expect("epoch").count();
        assert_eq!(n, 5);
        let second = loader.build_times().since(&after);
        assert_eq!(second.count(), 5);
        assert!(second.quantile(1.0).expect("built") >= slow - slow / 16);
    }
}

#[test]
fn with_more_workers_than_cpus_every_batch_arrives_in_order() {
    // More workers than CPUs on any machine: the caller looks for its batches between yields
    // of its CPU (the `pacing` module). Some batches build at once and some take longer than
    // the caller's polling budget (100 µs), so waits end both in a poll and in a sleep.
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let n = 600u64;
    let config = LoaderConfig {
        order: Order::Shuffled { seed: 3 },
        persistent_workers: true,
        ..cfg(4, cpus + 1)
    };
    let mut loader = Loader::with_transform(
        numbers(n),
        config,
        |x: &u64, _: &mut WorkerContext| -> Result<u64, BoxError> {
            if x.is_multiple_of(37) {
                std::thread::sleep(Duration::from_micros(300));
            }
            Ok(*x)
        },
        collect,
    )
    .expect("loader");
    for e in 0..3 {
        let mut epoch = loader.epoch().expect("epoch");
        let plan: Vec<Vec<u64>> = (0..epoch.plan().len())
            .map(|k| epoch.plan().batch(k).iter().map(|&i| i as u64).collect())
            .collect();
        let got: Vec<Vec<u64>> = epoch.by_ref().map(|b| b.expect("batch")).collect();
        assert_eq!(got, plan, "epoch {e}: the plan's batches, in its order");
        let mut all: Vec<u64> = got.concat();
        all.sort_unstable();
        assert_eq!(
            all,
            (0..n).collect::<Vec<_>>(),
            "epoch {e}: every sample once"
        );
    }
}
