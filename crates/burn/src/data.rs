//! Where a measured run's batches come from.
//!
//! A [`BatchSource`] hands out host batches (flat `f32` inputs and targets) one optimizer
//! micro-step at a time and is told when epochs start and end, so a multi-worker loader can
//! (re)start its workers there. Host buffers a source allocates are counted under
//! [`trainmem_core::Category::Input`]: the run tags its own thread while it pulls a batch, and
//! a loader's worker threads tag themselves.
//!
//! * [`FixtureData`]: trainmem-loader's multi-worker prefetching [`Loader`] over a
//!   memory-mapped (or, with `data.storage = "preload"`, read-into-memory) `.npy` fixture
//!   data set (`features.npy`, `labels.npy`), generated on first use into the run's work
//!   directory. This is what a measured run of a vector or image model reads, with the plan's
//!   workers, prefetch factor, persistence, pinned staging and augmentation
//!   ([`FixtureBuilder`]).
//! * [`SyntheticSource`]: deterministic pseudo-random examples generated on the training
//!   thread (no worker, no file), for token models (the fixture holds float features) and for
//!   callers that do not study the loader.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use trainmem_core::Dtype;
use trainmem_core::plan::{DataStorage, Plan};
use trainmem_loader::fixtures::{FixtureSpec, write_fixture};
use trainmem_loader::{
    BatchBuilder, BoxError, ColumnBatch, Loader, LoaderConfig, MmapDataset, ScratchResize,
    StackColumns, WorkerContext,
};

use crate::BurnRunError;
use crate::model::ExampleShape;

/// How the fixture loader's workers build a batch: rows stacked as stored, or each sample
/// augmented through [`ScratchResize`] (a plan's `data.augmentation_scratch` and
/// `data.size_variation`) and then stacked, keeping the model's input shape.
#[derive(Debug, Clone, Copy)]
pub enum FixtureBuilder {
    /// Rows copied as stored.
    Stack(StackColumns),
    /// Rows resized through variable-size worker scratch, then cropped back.
    Augment(ScratchResize),
}

impl BatchBuilder<MmapDataset> for FixtureBuilder {
    type Batch = ColumnBatch;

    fn build(
        &self,
        dataset: &MmapDataset,
        indices: &[usize],
        ctx: &mut WorkerContext,
    ) -> Result<ColumnBatch, BoxError> {
        match self {
            FixtureBuilder::Stack(b) => b.build(dataset, indices, ctx),
            FixtureBuilder::Augment(b) => b.build(dataset, indices, ctx),
        }
    }
}

/// The augmentation a plan asks for on examples of `shape`, or `None` without
/// `data.augmentation_scratch`. Images (`[c, h, w]` inputs) are resized in both axes, flat
/// feature vectors along their length.
pub fn augmentation(
    plan: &Plan,
    shape: &ExampleShape,
) -> Result<Option<ScratchResize>, BurnRunError> {
    let d = &plan.data;
    if d.augmentation_scratch == 0.0 {
        if d.size_variation != 0.0 {
            return Err(BurnRunError::Unsupported(
                "data.size_variation without data.augmentation_scratch: the batch handed to \
                 the model keeps the model's input shape, so only augmentation scratch can vary \
                 in size; give data.augmentation_scratch > 0"
                    .into(),
            ));
        }
        return Ok(None);
    }
    let (channels, height, width) = match shape {
        ExampleShape::Classification { input, .. } if input.len() == 3 => {
            (input[0], input[1], input[2])
        }
        ExampleShape::Tokens { .. } => {
            return Err(BurnRunError::Unsupported(
                "data.augmentation_scratch with a token model: token batches come from the \
                 synthetic source, which has no workers to augment in"
                    .into(),
            ));
        }
        other => (1, 1, other.input_len()),
    };
    Ok(Some(ScratchResize {
        column: 0,
        channels,
        height,
        width,
        scratch_factor: d.augmentation_scratch,
        size_variation: d.size_variation,
    }))
}

/// trainmem-loader over the fixture data set, memory-mapped or preloaded.
#[derive(Debug)]
pub struct FixtureData {
    loader: Loader<MmapDataset, FixtureBuilder>,
    preloaded_bytes: u64,
    shape: ExampleShape,
    dir: PathBuf,
}

/// The fixture a plan needs: one feature row per example (`shape.input_len()` floats) and a
/// label in `0..classes`.
pub fn fixture_spec(plan: &Plan, shape: &ExampleShape) -> Result<FixtureSpec, BurnRunError> {
    let classes = match shape {
        ExampleShape::Classification { classes, .. } => *classes,
        ExampleShape::Regression { input, output } => {
            if output > input {
                return Err(BurnRunError::Unsupported(format!(
                    "a regression model reading the fixture predicts its own first features: \
                     output ({output}) must not exceed input ({input})"
                )));
            }
            1
        }
        ExampleShape::Tokens { .. } => {
            return Err(BurnRunError::Unsupported(
                "token models read synthetic data (the fixture holds float features)".into(),
            ));
        }
    };
    Ok(FixtureSpec {
        samples: usize::try_from(plan.data.samples)
            .map_err(|_| BurnRunError::Unsupported("data.samples too large".into()))?,
        dim: shape.input_len(),
        classes: u32::try_from(classes)
            .map_err(|_| BurnRunError::Unsupported("too many classes".into()))?,
        seed: plan.seed,
        label_dtype: Dtype::I64,
    })
}

impl FixtureData {
    /// Opens (generating on first use, under `work_dir`) the fixture for `plan` and builds a
    /// loader over it with the plan's loader knobs and `micro_batch` samples per batch.
    ///
    /// `data.storage = "mmap"` maps the files; `"preload"` reads them into anonymous memory
    /// here, allocated by the calling thread (the run tags it `input`); `"stream"` is refused.
    /// With `data.augmentation_scratch` the workers build batches through [`ScratchResize`].
    pub fn open(
        plan: &Plan,
        shape: &ExampleShape,
        micro_batch: usize,
        work_dir: &Path,
    ) -> Result<FixtureData, BurnRunError> {
        if plan.data.storage == DataStorage::Stream {
            return Err(BurnRunError::Unsupported(
                "data.storage = \"stream\": the measured run reads a memory-mapped (\"mmap\") \
                 or preloaded (\"preload\") fixture; a streamed data set is not implemented"
                    .into(),
            ));
        }
        let builder = match augmentation(plan, shape)? {
            Some(a) => FixtureBuilder::Augment(a),
            None => FixtureBuilder::Stack(StackColumns),
        };
        let spec = fixture_spec(plan, shape)?;
        let dir = work_dir.join(format!(
            "fixture-n{}-d{}-c{}-s{}",
            spec.samples, spec.dim, spec.classes, spec.seed
        ));
        let features = dir.join("features.npy");
        let labels = dir.join("labels.npy");
        if !(features.exists() && labels.exists()) {
            write_fixture(&dir, &spec, |_, _| {}).map_err(|e| BurnRunError::Loader {
                what: "writing the data set",
                source: e.into(),
            })?;
        }
        let mut dataset =
            MmapDataset::open(&[&features, &labels]).map_err(|e| BurnRunError::Loader {
                what: "opening the data set",
                source: e.into(),
            })?;
        if plan.data.storage == DataStorage::Preload {
            dataset = dataset.preload().map_err(|e| BurnRunError::Loader {
                what: "preloading the data set",
                source: e.into(),
            })?;
        }
        let preloaded_bytes = dataset.preloaded_bytes() as u64;
        let config =
            LoaderConfig::from_plan(&plan.loader, micro_batch, plan.seed).map_err(|e| {
                BurnRunError::Loader {
                    what: "the plan's loader",
                    source: e.into(),
                }
            })?;
        let loader =
            Loader::new(Arc::new(dataset), config, builder).map_err(|e| BurnRunError::Loader {
                what: "starting the loader",
                source: e.into(),
            })?;
        Ok(FixtureData {
            loader,
            preloaded_bytes,
            shape: shape.clone(),
            dir,
        })
    }

    /// The loader.
    pub fn loader(&self) -> &Loader<MmapDataset, FixtureBuilder> {
        &self.loader
    }

    /// Bytes of the data set read into memory (`data.storage = "preload"`; 0 when mapped).
    pub fn preloaded_bytes(&self) -> u64 {
        self.preloaded_bytes
    }

    /// The loader, mutably (to start an epoch).
    pub fn loader_mut(&mut self) -> &mut Loader<MmapDataset, FixtureBuilder> {
        &mut self.loader
    }

    /// The data set's files (features, then labels).
    pub fn files(&self) -> Vec<PathBuf> {
        vec![self.dir.join("features.npy"), self.dir.join("labels.npy")]
    }

    /// The directory holding the fixture files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The example shape batches are converted for.
    pub fn shape(&self) -> &ExampleShape {
        &self.shape
    }
}

/// Converts a loader batch (features `[n, dim]` f32, labels `[n]` i64) into host vectors for
/// `shape`: class labels as targets, or (regression) the first `output` features of each row.
pub fn host_batch(shape: &ExampleShape, batch: &ColumnBatch) -> Result<HostBatch, BurnRunError> {
    let n = batch.len();
    let features = batch
        .column::<f32>(0)
        .ok_or_else(|| BurnRunError::Data("fixture features are not f32".into()))?;
    let dim = shape.input_len();
    if features.len() != n * dim {
        return Err(BurnRunError::Data(format!(
            "fixture rows hold {} floats, the model takes {dim}",
            features.len() / n.max(1)
        )));
    }
    let targets = match shape {
        ExampleShape::Regression { output, .. } => features
            .chunks_exact(dim)
            .flat_map(|row| row[..*output].iter().copied())
            .collect(),
        _ => batch
            .column::<i64>(1)
            .ok_or_else(|| BurnRunError::Data("fixture labels are not i64".into()))?
            .iter()
            .map(|&l| l as f32)
            .collect(),
    };
    Ok(HostBatch {
        batch: n,
        inputs: features.to_vec(),
        targets,
    })
}

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
        assert!(
            b.inputs
                .iter()
                .all(|&t| (0.0..7.0).contains(&t) && t.fract() == 0.0)
        );
        let again = SyntheticSource::new(s.shape.clone(), 3)
            .next_batch(4)
            .expect("batch");
        assert_eq!(again, b, "same seed, same data");
    }

    proptest::proptest! {
        #[test]
        fn synthetic_batches_fit_any_shape(
            batch in 1usize..9,
            seq_len in 1usize..7,
            vocab in 1usize..20,
            classes in 1usize..5,
            per_position: bool,
            seed: u64,
        ) {
            let shape = ExampleShape::Tokens { seq_len, vocab, classes, per_position };
            let b = SyntheticSource::new(shape.clone(), seed).next_batch(batch).expect("batch");
            proptest::prop_assert_eq!(b.inputs.len(), batch * shape.input_len());
            proptest::prop_assert_eq!(b.targets.len(), batch * shape.target_len());
            proptest::prop_assert!(b.inputs.iter().all(|&t| (t as usize) < vocab));
            proptest::prop_assert!(b.targets.iter().all(|&t| (t as usize) < classes));
        }
    }

    #[test]
    fn regression_values_are_in_unit_range() {
        let mut s = SyntheticSource::new(
            ExampleShape::Regression {
                input: 3,
                output: 2,
            },
            1,
        );
        let b = s.next_batch(10).expect("batch");
        assert_eq!((b.inputs.len(), b.targets.len()), (30, 20));
        assert!(
            b.inputs
                .iter()
                .chain(&b.targets)
                .all(|v| (-1.0..1.0).contains(v))
        );
    }
}
