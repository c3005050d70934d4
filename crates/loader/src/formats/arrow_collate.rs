//! Batch builders for an [`ArrowDataset`]: [`StackArrowColumns`] (fixed-width columns stacked
//! into a [`ColumnBatch`]), [`PadCollate`] (a list column padded to the batch's longest row
//! or to a fixed length, with an attention mask) and [`PackCollate`] (rows of a list column
//! packed into sequences of a fixed length, with separators and document boundaries).

use crate::dtype::Element;

use crate::engine::batch_writer::BatchWriter;
use crate::engine::builder::{BatchBuilder, BoxError, ColumnBatch, HeldBytes};
use crate::engine::context::WorkerContext;
use crate::engine::staging::{BatchBuffer, prefetch_pages};
use crate::error::DataError;
use crate::formats::arrow_dataset::{ArrowDataset, ColumnKind};
use trainmem_core::Dtype;

/// `v` as one little-endian element of `dtype` (`None` for `f16`/`bf16`/`bool`, or when it
/// does not fit).
pub fn scalar_bytes(dtype: Dtype, v: i64) -> Option<Vec<u8>> {
    Some(match dtype {
        Dtype::U8 => u8::try_from(v).ok()?.to_le_bytes().to_vec(),
        Dtype::I8 => i8::try_from(v).ok()?.to_le_bytes().to_vec(),
        Dtype::U16 => u16::try_from(v).ok()?.to_le_bytes().to_vec(),
        Dtype::I16 => i16::try_from(v).ok()?.to_le_bytes().to_vec(),
        Dtype::U32 => u32::try_from(v).ok()?.to_le_bytes().to_vec(),
        Dtype::I32 => i32::try_from(v).ok()?.to_le_bytes().to_vec(),
        Dtype::U64 => u64::try_from(v).ok()?.to_le_bytes().to_vec(),
        Dtype::I64 => v.to_le_bytes().to_vec(),
        Dtype::F32 => (v as f32).to_le_bytes().to_vec(),
        Dtype::F64 => (v as f64).to_le_bytes().to_vec(),
        _ => return None,
    })
}

/// Stacks the fixed-width columns (numbers and fixed-size lists) of an [`ArrowDataset`] into
/// one buffer per column, like `StackColumns` does for `.npy` columns.
#[derive(Debug, Clone, Copy, Default)]
pub struct StackArrowColumns;

impl StackArrowColumns {
    /// Checks that every selected column of `data` has a fixed width.
    pub fn new(data: &ArrowDataset) -> Result<StackArrowColumns, DataError> {
        for c in data.columns() {
            data.fixed_column(c.name())?;
        }
        Ok(StackArrowColumns)
    }
}

impl BatchBuilder<ArrowDataset> for StackArrowColumns {
    type Batch = ColumnBatch;

    fn build(
        &self,
        data: &ArrowDataset,
        indices: &[usize],
        ctx: &mut WorkerContext,
    ) -> Result<ColumnBatch, BoxError> {
        let n = indices.len();
        let mut batch = ColumnBatch {
            indices: indices.to_vec(),
            columns: Vec::with_capacity(data.columns().len()),
            dtypes: Vec::with_capacity(data.columns().len()),
            shapes: Vec::with_capacity(data.columns().len()),
        };
        for (k, c) in data.columns().iter().enumerate() {
            let width = c
                .kind()
                .width()
                .ok_or_else(|| format!("column {:?} has no fixed width", c.name()))?;
            let mut parts = Vec::with_capacity(n);
            for &i in indices {
                ctx.set_sample(i);
                parts.push(data.row_bytes(k, i).ok_or("row out of range")?);
            }
            let buf = ctx.alloc_concat(n * width * c.dtype().size() as usize, parts);
            batch.columns.push(buf);
            batch.dtypes.push(c.dtype());
            batch.shapes.push(match c.kind() {
                ColumnKind::Fixed(w) => vec![n, w],
                _ => vec![n],
            });
        }
        ctx.clear_sample();
        Ok(batch)
    }
}

/// The length rows are padded to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PadTo {
    /// The longest row of each batch.
    Longest,
    /// This many elements; longer rows are cut to it.
    Fixed(usize),
}

/// A padded batch of one list column: `[batch, width]` ids and a `[batch, width]` mask.
#[derive(Debug)]
pub struct PaddedBatch {
    /// The sample indices, in order.
    pub indices: Vec<usize>,
    /// `batch × width` elements, each row's values then the padding id.
    pub ids: BatchBuffer,
    /// `batch × width` bytes: 1 over a row's values, 0 over its padding.
    pub mask: BatchBuffer,
    /// Each row's length before padding (after cutting to a fixed width).
    pub lengths: Vec<usize>,
    /// Elements per row.
    pub width: usize,
    /// Element type of `ids`.
    pub dtype: Dtype,
}

impl PaddedBatch {
    /// The ids as `T`, or `None` on a dtype mismatch.
    pub fn ids<T: Element>(&self) -> Option<&[T]> {
        (T::DTYPE == self.dtype).then(|| self.ids.typed()).flatten()
    }
    /// The attention mask.
    pub fn mask(&self) -> &[u8] {
        self.mask.as_bytes()
    }
}

impl HeldBytes for PaddedBatch {
    fn byte_size(&self) -> usize {
        self.ids.capacity()
            + self.mask.capacity()
            + (self.indices.capacity() + self.lengths.capacity()) * std::mem::size_of::<usize>()
    }
}

fn list_column(data: &ArrowDataset, column: &str, pad: i64) -> Result<(usize, Vec<u8>), DataError> {
    let k = data.column_index(column)?;
    let dtype = data.columns()[k].dtype();
    let pad = scalar_bytes(dtype, pad).ok_or_else(|| {
        DataError::malformed(
            data.path(),
            0,
            format!("padding id {pad} is not a {dtype} value"),
        )
    })?;
    Ok((k, pad))
}

/// Pads one column (a list column, or any other) to a common width per batch.
#[derive(Debug, Clone)]
pub struct PadCollate {
    column: usize,
    pad: Vec<u8>,
    to: PadTo,
}

impl PadCollate {
    /// Pads `column` of `data` with `pad_id` to `to`.
    pub fn new(
        data: &ArrowDataset,
        column: &str,
        pad_id: i64,
        to: PadTo,
    ) -> Result<PadCollate, DataError> {
        let (column, pad) = list_column(data, column, pad_id)?;
        Ok(PadCollate { column, pad, to })
    }
}

impl BatchBuilder<ArrowDataset> for PadCollate {
    type Batch = PaddedBatch;

    fn build(
        &self,
        data: &ArrowDataset,
        indices: &[usize],
        ctx: &mut WorkerContext,
    ) -> Result<PaddedBatch, BoxError> {
        let size = self.pad.len();
        let mut rows = Vec::with_capacity(indices.len());
        for &i in indices {
            ctx.set_sample(i);
            rows.push(data.row_bytes(self.column, i).ok_or("row out of range")?);
        }
        ctx.clear_sample();
        let width = match self.to {
            PadTo::Longest => rows.iter().map(|r| r.len() / size).max().unwrap_or(0),
            PadTo::Fixed(n) => n,
        };
        let row_bytes = width * size;
        // Every byte written once, front to back: a row's values then its padding, and its
        // mask; the next row's pages are hinted while one is copied (rows are shuffled).
        let mut ids = ctx.writer(indices.len() * row_bytes);
        let mut mask = ctx.writer(indices.len() * width);
        let mut lengths = Vec::with_capacity(indices.len());
        for (r, row) in rows.iter().enumerate() {
            if let Some(next) = rows.get(r + 1) {
                prefetch_pages(next);
            }
            let n = row.len().min(row_bytes) / size;
            ids.copy(&row[..n * size]);
            ids.repeat(&self.pad, width - n);
            mask.fill(1, n);
            mask.fill(0, width - n);
            lengths.push(n);
        }
        let (ids, mask) = (ids.finish(), mask.finish());
        Ok(PaddedBatch {
            indices: indices.to_vec(),
            ids,
            mask,
            lengths,
            width,
            dtype: data.columns()[self.column].dtype(),
        })
    }
}

/// Where one sample sits in a packed sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// The sample index.
    pub sample: usize,
    /// Packed row it went to.
    pub row: usize,
    /// First element in that row.
    pub start: usize,
    /// Its elements (without the separator).
    pub len: usize,
}

/// Rows of a list column packed into sequences: `[rows, length]` ids, a mask and where each
/// sample went.
#[derive(Debug)]
pub struct PackedBatch {
    /// The sample indices, in order.
    pub indices: Vec<usize>,
    /// `rows × length` elements.
    pub ids: BatchBuffer,
    /// `rows × length` bytes: 1 over samples and their separators, 0 over the fill.
    pub mask: BatchBuffer,
    /// Document boundaries: one segment per sample, in order.
    pub segments: Vec<Segment>,
    /// Number of packed rows.
    pub rows: usize,
    /// Elements per packed row.
    pub length: usize,
    /// Element type.
    pub dtype: Dtype,
}

impl PackedBatch {
    /// The ids as `T`, or `None` on a dtype mismatch.
    pub fn ids<T: Element>(&self) -> Option<&[T]> {
        (T::DTYPE == self.dtype).then(|| self.ids.typed()).flatten()
    }
    /// The mask.
    pub fn mask(&self) -> &[u8] {
        self.mask.as_bytes()
    }
}

impl HeldBytes for PackedBatch {
    fn byte_size(&self) -> usize {
        self.ids.capacity()
            + self.mask.capacity()
            + self.indices.capacity() * std::mem::size_of::<usize>()
            + self.segments.capacity() * std::mem::size_of::<Segment>()
    }
}

/// Packs the batch's rows of a column, in order, into sequences of `length` elements: each
/// row is followed by the separator; a row that does not fit in what is left of the current
/// sequence starts the next one; a row longer than `length - 1` is cut to it; the rest of a
/// sequence is filled with the separator under a 0 mask.
#[derive(Debug, Clone)]
pub struct PackCollate {
    column: usize,
    separator: Vec<u8>,
    length: usize,
}

impl PackCollate {
    /// Packs `column` of `data` into sequences of `length` (at least 2) with `separator`.
    pub fn new(
        data: &ArrowDataset,
        column: &str,
        separator: i64,
        length: usize,
    ) -> Result<PackCollate, DataError> {
        let (column, separator) = list_column(data, column, separator)?;
        if length < 2 {
            return Err(DataError::malformed(
                data.path(),
                0,
                "a packed length must be at least 2",
            ));
        }
        Ok(PackCollate {
            column,
            separator,
            length,
        })
    }

    /// Where each row goes: its segment per sample, and the number of packed rows.
    fn layout(&self, lens: &[usize], indices: &[usize]) -> (Vec<Segment>, usize) {
        let mut segments = Vec::with_capacity(lens.len());
        let (mut row, mut used) = (0usize, 0usize);
        for (&len, &sample) in lens.iter().zip(indices) {
            let len = len.min(self.length - 1);
            if used > 0 && used + len + 1 > self.length {
                row += 1;
                used = 0;
            }
            segments.push(Segment {
                sample,
                row,
                start: used,
                len,
            });
            used += len + 1;
        }
        let rows = if lens.is_empty() { 0 } else { row + 1 };
        (segments, rows)
    }
}

impl BatchBuilder<ArrowDataset> for PackCollate {
    type Batch = PackedBatch;

    fn build(
        &self,
        data: &ArrowDataset,
        indices: &[usize],
        ctx: &mut WorkerContext,
    ) -> Result<PackedBatch, BoxError> {
        let size = self.separator.len();
        let mut rows = Vec::with_capacity(indices.len());
        for &i in indices {
            ctx.set_sample(i);
            rows.push(data.row_bytes(self.column, i).ok_or("row out of range")?);
        }
        ctx.clear_sample();
        let lens: Vec<usize> = rows.iter().map(|r| r.len() / size).collect();
        let (segments, packed) = self.layout(&lens, indices);
        // Every byte written once, front to back: in each packed row its samples, each then
        // a separator, then the separator as fill; the mask 1 over samples and separators, 0
        // over the fill. The next sample's pages are hinted while one is copied.
        let mut ids = ctx.writer(packed * self.length * size);
        let mut mask = ctx.writer(packed * self.length);
        let close = |ids: &mut BatchWriter, mask: &mut BatchWriter, used: usize| {
            ids.repeat(&self.separator, self.length - used);
            mask.fill(1, used);
            mask.fill(0, self.length - used);
        };
        let (mut row, mut used) = (0, 0);
        for (k, (s, src)) in segments.iter().zip(&rows).enumerate() {
            if let Some(next) = rows.get(k + 1) {
                prefetch_pages(next);
            }
            if s.row != row {
                close(&mut ids, &mut mask, used);
                (row, used) = (s.row, 0);
            }
            debug_assert_eq!(s.start, used, "segments follow each other in a packed row");
            ids.copy(&src[..s.len * size]);
            ids.repeat(&self.separator, 1);
            used += s.len + 1;
        }
        if packed > 0 {
            close(&mut ids, &mut mask, used);
        }
        let (ids, mask) = (ids.finish(), mask.finish());
        Ok(PackedBatch {
            indices: indices.to_vec(),
            ids,
            mask,
            segments,
            rows: packed,
            length: self.length,
            dtype: data.columns()[self.column].dtype(),
        })
    }
}
