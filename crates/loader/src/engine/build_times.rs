//! How long the loader's batches took to build: a histogram of the time each call of the
//! [`crate::BatchBuilder`] took, kept per thread that builds (the caller with no workers, or
//! each worker) and merged when read ([`crate::Loader::build_times`]).
//!
//! A loader slower than expected is either building slowly or handing batches over slowly;
//! the two look the same from the training loop. The build times tell them apart: with workers,
//! a median build time well above the 0-worker one means the workers' CPUs are slower or
//! busier (another process, a neighbour on a virtual machine's host), while build times equal
//! to the 0-worker ones with a slower epoch mean the time is lost between the threads.
//!
//! Buckets are 1/8 of a power of two wide (every nanosecond count below 16 has its own), so a
//! quantile read back is within 1/16 of a recorded value. Each builder thread writes only its
//! own slot, on cache lines of its own, with one relaxed add per batch for the bucket and one
//! for the total: recording never makes two threads wait on one cache line.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Values below this have a bucket each.
const EXACT: u64 = 16;
/// Buckets per power of two above [`EXACT`].
const SUB: u64 = 8;
/// Buckets in all: the exact ones, then 8 for each power of two from 2⁴ to 2⁶³.
const BUCKETS: usize = (EXACT + (64 - 4) * SUB) as usize;

/// The bucket of a nanosecond count.
fn bucket(ns: u64) -> usize {
    if ns < EXACT {
        return ns as usize;
    }
    let e = 63 - u64::from(ns.leading_zeros()); // floor(log2 ns) >= 4
    let sub = (ns >> (e - 3)) & (SUB - 1);
    (EXACT + (e - 4) * SUB + sub) as usize
}

/// The values `[low, high)` of bucket `b` (the last one ends at `u64::MAX`, included).
fn bounds(b: usize) -> (u64, u64) {
    let b = b as u64;
    if b < EXACT {
        return (b, b + 1);
    }
    let (e, sub) = (4 + (b - EXACT) / SUB, (b - EXACT) % SUB);
    let low = (SUB + sub) << (e - 3);
    // Only the last bucket's end, 2⁶⁴, does not fit: it ends at `u64::MAX`.
    let high = (u128::from(SUB + sub + 1) << (e - 3)).min(u128::from(u64::MAX)) as u64;
    (low, high)
}

/// One builder thread's histogram.
#[derive(Debug)]
#[repr(align(64))]
struct Slot {
    counts: Box<[AtomicU64]>,
    total_ns: AtomicU64,
}

impl Slot {
    fn new() -> Slot {
        Slot {
            counts: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            total_ns: AtomicU64::new(0),
        }
    }
}

/// The build-time histograms of one loader: slot 0 for batches built in the caller (no
/// workers), slot `1 + id` for worker `id`.
#[derive(Debug)]
pub(crate) struct BuildClock {
    slots: Box<[Slot]>,
}

impl BuildClock {
    /// Slots for the caller and `workers` workers.
    pub(crate) fn new(workers: usize) -> BuildClock {
        BuildClock {
            slots: (0..=workers).map(|_| Slot::new()).collect(),
        }
    }

    /// Records one batch built in `took` by worker `worker` (`None`: the caller).
    pub(crate) fn record(&self, worker: Option<usize>, took: Duration) {
        let i = worker.map_or(0, |w| w + 1);
        let Some(slot) = self.slots.get(i) else {
            return;
        };
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        slot.counts[bucket(ns)].fetch_add(1, Ordering::Relaxed);
        slot.total_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Every slot merged.
    pub(crate) fn read(&self) -> BuildTimes {
        let mut counts = vec![0u64; BUCKETS];
        let mut total_ns = 0u64;
        for s in self.slots.iter() {
            for (c, a) in counts.iter_mut().zip(s.counts.iter()) {
                *c += a.load(Ordering::Relaxed);
            }
            total_ns = total_ns.saturating_add(s.total_ns.load(Ordering::Relaxed));
        }
        BuildTimes { counts, total_ns }
    }
}

/// A reading of a loader's batch build times ([`crate::Loader::build_times`]): how many
/// batches were built, their total time, and quantiles within 1/16 of the recorded values.
/// Readings are cumulative since the loader was created; [`BuildTimes::since`] gives the
/// batches built between two readings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildTimes {
    counts: Vec<u64>,
    total_ns: u64,
}

impl BuildTimes {
    /// Batches built.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Their build times added up.
    pub fn total(&self) -> Duration {
        Duration::from_nanos(self.total_ns)
    }

    /// The mean build time, or `None` when no batch was built.
    pub fn mean(&self) -> Option<Duration> {
        let n = self.count();
        (n > 0).then(|| Duration::from_nanos(self.total_ns / n))
    }

    /// The build time below which a share `q` (0 to 1) of the batches took, as the middle of
    /// its bucket (within 1/16 of a recorded time); `None` when no batch was built.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        let n = self.count();
        if n == 0 {
            return None;
        }
        // The rank of the wanted batch, 1-based: the smallest that covers a share `q`.
        let rank = ((q.clamp(0.0, 1.0) * n as f64).ceil() as u64).clamp(1, n);
        let mut seen = 0;
        for (b, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                let (low, high) = bounds(b);
                return Some(Duration::from_nanos(low + (high - 1 - low) / 2));
            }
        }
        None
    }

    /// The batches built after `earlier` (a reading of the same loader taken before this one).
    pub fn since(&self, earlier: &BuildTimes) -> BuildTimes {
        BuildTimes {
            counts: self
                .counts
                .iter()
                .zip(&earlier.counts)
                .map(|(a, b)| a.saturating_sub(*b))
                .collect(),
            total_ns: self.total_ns.saturating_sub(earlier.total_ns),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn buckets_cover_every_value_in_order() {
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(15), 15);
        assert_eq!(bucket(16), 16);
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
        let mut last_high = 0;
        for b in 0..BUCKETS {
            let (low, high) = bounds(b);
            assert_eq!(
                low,
                last_high,
                "bucket {b} starts where {} ended",
                b.max(1) - 1
            );
            assert!(high > low);
            assert_eq!(bucket(low), b);
            assert_eq!(bucket(high - 1), b);
            last_high = high;
        }
        assert_eq!(last_high, u64::MAX);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(10_000))]

        #[test]
        fn a_value_lies_in_its_bucket_within_a_sixteenth(ns in any::<u64>()) {
            let (low, high) = bounds(bucket(ns));
            prop_assert!(low <= ns && (ns < high || high == u64::MAX));
            let mid = low + (high - 1 - low) / 2;
            prop_assert!(mid.abs_diff(ns) as f64 <= ns as f64 / 16.0 + 0.5);
        }
    }

    #[test]
    fn quantiles_and_totals_of_known_times() {
        let clock = BuildClock::new(2);
        assert_eq!(clock.read().quantile(0.5), None);
        assert_eq!(clock.read().mean(), None);
        // 100 batches of 10 µs on worker 0, 100 of 30 µs on worker 1, one of 1 ms inline.
        for _ in 0..100 {
            clock.record(Some(0), Duration::from_micros(10));
            clock.record(Some(1), Duration::from_micros(30));
        }
        clock.record(None, Duration::from_millis(1));
        clock.record(Some(9), Duration::from_millis(5)); // no such worker: ignored
        let t = clock.read();
        assert_eq!(t.count(), 201);
        assert_eq!(t.total(), Duration::from_micros(100 * 10 + 100 * 30 + 1000));
        let near = |d: Option<Duration>, us: f64| {
            let d = d.expect("batches were built").as_secs_f64() * 1e6;
            (d - us).abs() <= us / 16.0
        };
        assert!(near(t.quantile(0.1), 10.0));
        assert!(near(t.quantile(0.49), 10.0));
        assert!(near(t.quantile(0.51), 30.0));
        assert!(near(t.quantile(0.99), 30.0));
        assert!(near(t.quantile(1.0), 1000.0));
        assert!(near(t.quantile(0.0), 10.0));
        let before = t;
        clock.record(Some(1), Duration::from_micros(200));
        let after = clock.read().since(&before);
        assert_eq!(after.count(), 1);
        assert_eq!(after.mean(), Some(Duration::from_micros(200)));
        assert!(near(after.quantile(0.5), 200.0));
    }
}
