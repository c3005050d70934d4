//! How a worker turns sample indices into a batch: the [`BatchBuilder`] trait, the user's
//! per-sample transform plus collate ([`MapCollate`]), and the zero-copy-to-one-copy column
//! stacker for memory-mapped data sets ([`StackColumns`] → [`ColumnBatch`]).

use crate::dataset::{Dataset, MmapDataset};
use crate::dtype::Element;
use crate::engine::context::WorkerContext;
use crate::engine::staging::{BatchBuffer, prefetch_pages};
use crate::formats::array::MappedArray;
use trainmem_core::Dtype;

/// The error type builders and transforms return.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Bytes of memory a batch holds, as the loader accounts it.
pub trait HeldBytes {
    /// Bytes held (allocated capacity, not just the used length).
    fn byte_size(&self) -> usize;
}

impl<T: bytemuck::Pod> HeldBytes for Vec<T> {
    fn byte_size(&self) -> usize {
        self.capacity() * std::mem::size_of::<T>()
    }
}

impl<A: HeldBytes, B: HeldBytes> HeldBytes for (A, B) {
    fn byte_size(&self) -> usize {
        self.0.byte_size() + self.1.byte_size()
    }
}

impl HeldBytes for BatchBuffer {
    fn byte_size(&self) -> usize {
        self.capacity()
    }
}

/// Builds one batch from sample indices, inside a worker (or the caller's thread).
pub trait BatchBuilder<D: Dataset>: Send + Sync + 'static {
    /// The batch type.
    type Batch: HeldBytes + Send + 'static;

    /// Builds the batch of `indices` (in sampler order). Call [`WorkerContext::set_sample`]
    /// before touching each sample so failures are reported against it.
    fn build(
        &self,
        dataset: &D,
        indices: &[usize],
        ctx: &mut WorkerContext,
    ) -> Result<Self::Batch, BoxError>;
}

/// A per-sample transform followed by a collate step, both supplied by the user.
#[derive(Debug, Clone)]
pub struct MapCollate<F, C> {
    transform: F,
    collate: C,
}

impl<F, C> MapCollate<F, C> {
    /// `transform(sample, ctx)` runs on every sample, then `collate(items, ctx)` makes the
    /// batch.
    pub fn new(transform: F, collate: C) -> MapCollate<F, C> {
        MapCollate { transform, collate }
    }
}

impl<D, F, C, T, B> BatchBuilder<D> for MapCollate<F, C>
where
    D: Dataset,
    F: for<'a> Fn(D::Sample<'a>, &mut WorkerContext) -> Result<T, BoxError> + Send + Sync + 'static,
    C: Fn(Vec<T>, &mut WorkerContext) -> Result<B, BoxError> + Send + Sync + 'static,
    B: HeldBytes + Send + 'static,
{
    type Batch = B;

    fn build(
        &self,
        dataset: &D,
        indices: &[usize],
        ctx: &mut WorkerContext,
    ) -> Result<B, BoxError> {
        let mut items = Vec::with_capacity(indices.len());
        for &i in indices {
            if ctx.is_cancelled() {
                return Err("epoch cancelled".into());
            }
            ctx.set_sample(i);
            let sample = dataset.sample(i)?;
            items.push((self.transform)(sample, ctx)?);
        }
        ctx.clear_sample();
        (self.collate)(items, ctx)
    }
}

/// A batch of a [`MmapDataset`]: one contiguous buffer per column, rows in sampler order.
#[derive(Debug)]
pub struct ColumnBatch {
    /// The sample indices, in order.
    pub indices: Vec<usize>,
    /// One buffer per column.
    pub columns: Vec<BatchBuffer>,
    /// Element type per column.
    pub dtypes: Vec<Dtype>,
    /// Shape per column, `[batch, sample shape...]`.
    pub shapes: Vec<Vec<usize>>,
}

impl ColumnBatch {
    /// An empty batch of `indices` with room for `columns` columns.
    pub(crate) fn start(indices: &[usize], columns: usize) -> Self {
        ColumnBatch {
            indices: indices.to_vec(),
            columns: Vec::with_capacity(columns),
            dtypes: Vec::with_capacity(columns),
            shapes: Vec::with_capacity(columns),
        }
    }

    /// Appends `buf`, this batch's samples of `array` (same dtype and sample shape).
    pub(crate) fn push_column(&mut self, buf: BatchBuffer, array: &MappedArray) {
        let mut shape = Vec::with_capacity(1 + array.sample_shape().len());
        shape.push(self.indices.len());
        shape.extend_from_slice(array.sample_shape());
        self.columns.push(buf);
        self.dtypes.push(array.dtype());
        self.shapes.push(shape);
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.indices.len()
    }

    /// Whether the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.indices.is_empty()
    }

    /// Column `k` as typed elements, or `None` on a dtype mismatch.
    pub fn column<T: Element>(&self, k: usize) -> Option<&[T]> {
        if self.dtypes.get(k) != Some(&T::DTYPE) {
            return None;
        }
        self.columns[k].typed()
    }
}

impl HeldBytes for ColumnBatch {
    fn byte_size(&self) -> usize {
        self.columns
            .iter()
            .map(BatchBuffer::capacity)
            .sum::<usize>()
            + self.indices.capacity() * std::mem::size_of::<usize>()
    }
}

/// Copies each sample's rows of every column into one buffer per column (the only copy:
/// page cache → batch buffer). Runs of consecutive indices are copied with one `memcpy`.
#[derive(Debug, Clone, Copy, Default)]
pub struct StackColumns;

/// Runs of consecutive indices: `(first, length)`.
struct Runs<'a> {
    indices: &'a [usize],
    pos: usize,
}

impl Iterator for Runs<'_> {
    type Item = (usize, usize);

    fn next(&mut self) -> Option<(usize, usize)> {
        let start = *self.indices.get(self.pos)?;
        let mut run = 1;
        while self.indices.get(self.pos + run) == Some(&(start + run)) {
            run += 1;
        }
        self.pos += run;
        Some((start, run))
    }
}

/// Copies rows of `array` for `indices` into `out`, one memcpy per run of consecutive indices.
pub(crate) fn copy_rows(
    array: &crate::MappedArray,
    indices: &[usize],
    out: &mut [u8],
    ctx: &mut WorkerContext,
) -> Result<(), BoxError> {
    let bps = array.bytes_per_sample();
    let mut row = 0;
    while row < indices.len() {
        let start = indices[row];
        let mut run = 1;
        while row + run < indices.len() && indices[row + run] == start + run {
            run += 1;
        }
        ctx.set_sample(start);
        let src = array
            .samples(start..start + run)
            .ok_or_else(|| format!("sample {start} out of range"))?;
        if let Some(next) = indices
            .get(row + run)
            .and_then(|&i| array.samples(i..i + 1))
        {
            prefetch_pages(next);
        }
        out[row * bps..(row + run) * bps].copy_from_slice(src);
        row += run;
    }
    Ok(())
}

impl BatchBuilder<MmapDataset> for StackColumns {
    type Batch = ColumnBatch;

    fn build(
        &self,
        dataset: &MmapDataset,
        indices: &[usize],
        ctx: &mut WorkerContext,
    ) -> Result<ColumnBatch, BoxError> {
        let n = indices.len();
        let mut batch = ColumnBatch::start(indices, dataset.columns().len());
        for c in dataset.columns() {
            let a = &c.array;
            if let Some(&bad) = indices.iter().find(|&&i| i >= a.len()) {
                ctx.set_sample(bad);
                return Err(format!("sample {bad} out of range ({} samples)", a.len()).into());
            }
            let runs = Runs { indices, pos: 0 };
            let buf = ctx.alloc_concat(
                n * a.bytes_per_sample(),
                runs.map(|(start, run)| a.samples(start..start + run).unwrap_or(&[])),
            );
            batch.push_column(buf, a);
        }
        ctx.clear_sample();
        Ok(batch)
    }
}
