//! [`LoaderState`]: where a run stands (epoch and batches delivered), small and
//! serde-serialisable, so a stopped run continues with exactly the batches it had not seen.
//!
//! The state names the position and the knobs that decide which samples each batch holds
//! (data set length, batch size, `drop_last`, order and seed, shard); a loader resumed from it
//! must agree on all of them, or the resume is refused with a [`ResumeError`] naming the knob.
//! The knobs that only decide how batches are built (workers, prefetch factor, persistent
//! workers, buffers, timeout) may differ: batches are the same whoever builds them.

use serde::{Deserialize, Serialize};

use crate::engine::config::{LoaderConfig, Order, Shard};

/// A loader's position in its run: the next batch it delivers is batch `batches_delivered` of
/// epoch `epoch`. Saved with a training checkpoint, it restarts the data stream where the
/// checkpoint was taken (see [`crate::Loader::resume`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoaderState {
    /// The epoch the next batch belongs to.
    pub epoch: u64,
    /// Batches of that epoch already delivered (0 at an epoch start).
    pub batches_delivered: usize,
    /// Samples in the data set.
    pub dataset_len: usize,
    /// Samples per batch.
    pub batch_size: usize,
    /// Whether a short last batch is dropped.
    pub drop_last: bool,
    /// The sample order (with its seed when shuffled).
    pub order: Order,
    /// The rank's shard, if any.
    pub shard: Option<Shard>,
    /// The loader's seed (per-batch generators).
    pub seed: u64,
}

/// A [`LoaderState`] that does not fit the loader it is given to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResumeError {
    /// A knob that decides the batches' samples differs between the state and the loader.
    #[error(
        "cannot resume: the saved state has {field} = {saved}, this loader has {current} (the batches would differ)"
    )]
    Mismatch {
        /// The knob (`dataset_len`, `batch_size`, `drop_last`, `order`, `shard`, `seed`).
        field: &'static str,
        /// Its value in the state.
        saved: String,
        /// Its value in the loader.
        current: String,
    },
    /// The state says more batches were delivered than its epoch has.
    #[error(
        "cannot resume: the saved state has {delivered} batches delivered in epoch {epoch}, which has only {batches}"
    )]
    PastEnd {
        /// The epoch.
        epoch: u64,
        /// Batches the state says were delivered.
        delivered: usize,
        /// Batches in that epoch.
        batches: usize,
    },
}

impl LoaderState {
    /// The state of a loader with `config` over `dataset_len` samples about to deliver batch
    /// `delivered` of `epoch`.
    pub fn at(config: &LoaderConfig, dataset_len: usize, epoch: u64, delivered: usize) -> Self {
        LoaderState {
            epoch,
            batches_delivered: delivered,
            dataset_len,
            batch_size: config.batch_size,
            drop_last: config.drop_last,
            order: config.order,
            shard: config.shard,
            seed: config.seed,
        }
    }

    /// Checks that a loader with `config` over `dataset_len` samples delivers the batches this
    /// state describes.
    pub fn check(&self, config: &LoaderConfig, dataset_len: usize) -> Result<(), ResumeError> {
        fn same<T: PartialEq + std::fmt::Debug>(
            field: &'static str,
            saved: T,
            current: T,
        ) -> Result<(), ResumeError> {
            if saved == current {
                Ok(())
            } else {
                Err(ResumeError::Mismatch {
                    field,
                    saved: format!("{saved:?}"),
                    current: format!("{current:?}"),
                })
            }
        }
        same("dataset_len", self.dataset_len, dataset_len)?;
        same("batch_size", self.batch_size, config.batch_size)?;
        same("drop_last", self.drop_last, config.drop_last)?;
        same("order", self.order, config.order)?;
        same("shard", self.shard, config.shard)?;
        same("seed", self.seed, config.seed)?;
        let batches = config.batches_per_epoch(dataset_len);
        if self.batches_delivered > batches {
            return Err(ResumeError::PastEnd {
                epoch: self.epoch,
                delivered: self.batches_delivered,
                batches,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> LoaderConfig {
        LoaderConfig {
            batch_size: 4,
            order: Order::Shuffled { seed: 3 },
            seed: 9,
            ..LoaderConfig::default()
        }
    }

    #[test]
    fn a_state_records_its_knobs() {
        let c = config();
        let mid = LoaderState::at(&c, 10, 2, 1);
        assert_eq!((mid.epoch, mid.batches_delivered), (2, 1));
        assert_eq!((mid.dataset_len, mid.batch_size, mid.seed), (10, 4, 9));
        assert_eq!(mid.order, Order::Shuffled { seed: 3 });
        assert_eq!(mid.check(&c, 10), Ok(()));
        // Every batch delivered is a valid (finished) position too.
        assert_eq!(LoaderState::at(&c, 10, 2, 3).check(&c, 10), Ok(()));
    }

    #[test]
    fn mismatches_name_the_knob() {
        let c = config();
        let s = LoaderState::at(&c, 10, 0, 1);
        let field = |r: Result<(), ResumeError>| match r {
            Err(ResumeError::Mismatch { field, .. }) => field,
            other => panic!("expected a mismatch, got {other:?}"),
        };
        assert_eq!(field(s.check(&c, 11)), "dataset_len");
        let other = LoaderConfig {
            batch_size: 5,
            ..c.clone()
        };
        assert_eq!(field(s.check(&other, 10)), "batch_size");
        let other = LoaderConfig {
            order: Order::Shuffled { seed: 4 },
            ..c.clone()
        };
        assert_eq!(field(s.check(&other, 10)), "order");
        let other = LoaderConfig {
            shard: Some(Shard::new(0, 2)),
            ..c.clone()
        };
        assert_eq!(field(s.check(&other, 10)), "shard");
        // Workers and prefetch do not change the batches.
        let other = LoaderConfig {
            workers: 3,
            prefetch_factor: 5,
            persistent_workers: true,
            ..c.clone()
        };
        assert_eq!(s.check(&other, 10), Ok(()));
        let past = LoaderState {
            batches_delivered: 4,
            ..s
        };
        assert_eq!(
            past.check(&c, 10),
            Err(ResumeError::PastEnd {
                epoch: 0,
                delivered: 4,
                batches: 3
            })
        );
        let text = ResumeError::Mismatch {
            field: "batch_size",
            saved: "4".into(),
            current: "5".into(),
        }
        .to_string();
        assert!(
            text.contains("batch_size = 4") && text.contains("has 5"),
            "{text}"
        );
    }

    #[test]
    fn serde_round_trip() {
        let s = LoaderState::at(&config(), 10, 7, 2);
        let text = serde_json::to_string(&s).expect("ser");
        assert!(text.len() < 200, "{text}");
        let back: LoaderState = serde_json::from_str(&text).expect("de");
        assert_eq!(back, s);
    }
}
