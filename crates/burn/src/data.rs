//! Where a measured run's batches come from.
//!
//! A [`BatchSource`] hands out host batches (flat `f32` inputs and targets) one optimizer
//! micro-step at a time and is told when epochs start and end, so a multi-worker loader can
//! (re)start its workers there. Host buffers a source allocates are counted under
//! [`trainmem_probe::Category::Input`]: the run tags its own thread while it pulls a batch, and
//! a loader's worker threads tag themselves.
//!
//! [`SyntheticSource`] generates deterministic pseudo-random examples on the training thread
//! (no worker, no file): the smallest input pipeline, used when a run does not study the
//! loader.

use crate::BurnRunError;
use crate::model::ExampleShape;

/// One host batch: `batch × input_len` inputs and `batch × target_len` targets.
#[derive(Debug, Clone, PartialEq)]
pub struct HostBatch {
    /// Examples in the batch.
    pub batch: usize,
    /// Flat inputs.
    pub inputs: Vec<f32>,
    /// Flat targets (class and token ids as exact non-negative floats).
    pub targets: Vec<f32>,
}

/// A supplier of host batches for a run.
pub trait BatchSource {
    /// An epoch begins (a loader starts or reuses its workers and fills its queue).
    fn start_epoch(&mut self, epoch: u64) -> Result<(), BurnRunError>;
    /// The next batch of `batch` examples.
    fn next_batch(&mut self, batch: usize) -> Result<HostBatch, BurnRunError>;
    /// An epoch ended (a non-persistent loader stops its workers).
    fn end_epoch(&mut self) -> Result<(), BurnRunError>;
}

/// Deterministic pseudo-random examples generated on the calling thread.
#[derive(Debug, Clone)]
pub struct SyntheticSource {
    shape: ExampleShape,
    state: u64,
}

impl SyntheticSource {
    /// A source of examples of `shape`, reproducible from `seed`.
    pub fn new(shape: ExampleShape, seed: u64) -> SyntheticSource {
        SyntheticSource {
            shape,
            state: seed ^ 0x9E37_79B9_7F4A_7C15,
        }
    }

    fn next_u32(&mut self) -> u32 {
        // xorshift64*: cheap, deterministic, good enough for training data.
        let mut x = self.state;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.state = x;
        (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 32) as u32
    }

    fn uniform(&mut self) -> f32 {
        (self.next_u32() >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0
    }

    fn below(&mut self, n: usize) -> f32 {
        (self.next_u32() as usize % n.max(1)) as f32
    }
}

impl BatchSource for SyntheticSource {
    fn start_epoch(&mut self, _epoch: u64) -> Result<(), BurnRunError> {
        Ok(())
    }

    fn next_batch(&mut self, batch: usize) -> Result<HostBatch, BurnRunError> {
        let n_in = batch * self.shape.input_len();
        let n_t = batch * self.shape.target_len();
        let mut inputs = Vec::with_capacity(n_in);
        let mut targets = Vec::with_capacity(n_t);
        match self.shape.clone() {
            ExampleShape::Regression { .. } => {
                inputs.extend((0..n_in).map(|_| self.uniform()));
                targets.extend((0..n_t).map(|_| self.uniform()));
            }
            ExampleShape::Classification { classes, .. } => {
                inputs.extend((0..n_in).map(|_| self.uniform()));
                targets.extend((0..n_t).map(|_| self.below(classes)));
            }
            ExampleShape::Tokens { vocab, classes, .. } => {
                inputs.extend((0..n_in).map(|_| self.below(vocab)));
                targets.extend((0..n_t).map(|_| self.below(classes)));
            }
        }
        Ok(HostBatch {
            batch,
            inputs,
            targets,
        })
    }

    fn end_epoch(&mut self) -> Result<(), BurnRunError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthetic_batches_have_the_right_sizes_and_ranges() {
        let shape = ExampleShape::Tokens {
            seq_len: 5,
            vocab: 7,
            classes: 7,
            per_position: true,
        };
        let mut s = SyntheticSource::new(shape, 3);
        let b = s.next_batch(4).expect("batch");
        assert_eq!(b.inputs.len(), 20);
        assert_eq!(b.targets.len(), 20);
        assert!(b.inputs.iter().all(|&t| t >= 0.0 && t < 7.0 && t.fract() == 0.0));
        let again = SyntheticSource::new(s.shape.clone(), 3).next_batch(4).expect("batch");
        assert_eq!(again, b, "same seed, same data");
    }

    #[test]
    fn regression_values_are_in_unit_range() {
        let mut s = SyntheticSource::new(ExampleShape::Regression { input: 3, output: 2 }, 1);
        let b = s.next_batch(10).expect("batch");
        assert_eq!((b.inputs.len(), b.targets.len()), (30, 20));
        assert!(b.inputs.iter().chain(&b.targets).all(|v| (-1.0..1.0).contains(v)));
    }
}
