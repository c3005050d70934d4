//! [`ArrowDataset`]: named columns of a memory-mapped Arrow IPC file or stream as a
//! [`Dataset`] — primitive columns, fixed-size lists (a fixed-width row per sample) and lists
//! (a variable-length row per sample, such as `datasets`' `input_ids`). Rows are zero-copy
//! views into the mapping.

use std::fs::File;
use std::path::{Path, PathBuf};

use arrow_array::{Array, RecordBatch};
use arrow_buffer::Buffer;
use arrow_data::ArrayData;
use arrow_schema::{DataType, SchemaRef};

use crate::dataset::Dataset;
use crate::dtype::Element;
use crate::error::{DataError, FileProblem};
use crate::formats::arrow_ipc_file::{ArrowFormat, decode};
use crate::formats::mapped::{MappedFile, check_not_shrunk};
use trainmem_core::Dtype;

/// The shape of one row of an Arrow column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ColumnKind {
    /// One number per row.
    Scalar,
    /// A fixed-size list: this many numbers per row.
    Fixed(usize),
    /// A list (or large list): a variable number per row.
    List,
}

impl ColumnKind {
    /// Elements per row when fixed.
    pub fn width(self) -> Option<usize> {
        match self {
            ColumnKind::Scalar => Some(1),
            ColumnKind::Fixed(n) => Some(n),
            ColumnKind::List => None,
        }
    }
}

/// The dtype of an Arrow primitive type trainmem can view without conversion.
pub fn dtype_of_arrow(t: &DataType) -> Option<Dtype> {
    Some(match t {
        DataType::Int8 => Dtype::I8,
        DataType::Int16 => Dtype::I16,
        DataType::Int32 => Dtype::I32,
        DataType::Int64 => Dtype::I64,
        DataType::UInt8 => Dtype::U8,
        DataType::UInt16 => Dtype::U16,
        DataType::UInt32 => Dtype::U32,
        DataType::UInt64 => Dtype::U64,
        DataType::Float16 => Dtype::F16,
        DataType::Float32 => Dtype::F32,
        DataType::Float64 => Dtype::F64,
        _ => return None,
    })
}

/// One record batch's part of a column: the values (and the row offsets of a list).
#[derive(Debug, Clone)]
struct Chunk {
    values: Buffer,
    offsets: Offsets,
}

#[derive(Debug, Clone)]
enum Offsets {
    None,
    I32(Buffer),
    I64(Buffer),
}

/// A selected column of an [`ArrowDataset`].
#[derive(Debug, Clone)]
pub struct ArrowColumn {
    name: String,
    kind: ColumnKind,
    dtype: Dtype,
    arrow_type: DataType,
    chunks: Vec<Chunk>,
}

impl ArrowColumn {
    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Row shape.
    pub fn kind(&self) -> ColumnKind {
        self.kind
    }
    /// Element type.
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }
    /// The Arrow type, as the schema has it.
    pub fn arrow_type(&self) -> &DataType {
        &self.arrow_type
    }

    /// The bytes the column's rows span in each record batch (zero-copy).
    pub fn value_bytes(&self) -> Vec<&[u8]> {
        let size = self.dtype.size() as usize;
        self.chunks
            .iter()
            .map(|c| {
                let span = match &c.offsets {
                    Offsets::None => return c.values.as_slice(),
                    Offsets::I32(o) => bytemuck::try_cast_slice::<u8, i32>(o.as_slice())
                        .ok()
                        .and_then(|o| Some((i64::from(*o.first()?), i64::from(*o.last()?)))),
                    Offsets::I64(o) => bytemuck::try_cast_slice::<u8, i64>(o.as_slice())
                        .ok()
                        .and_then(|o| Some((*o.first()?, *o.last()?))),
                };
                span.and_then(|(a, b)| {
                    let a = usize::try_from(a).ok()?.checked_mul(size)?;
                    let b = usize::try_from(b).ok()?.checked_mul(size)?;
                    c.values.as_slice().get(a..b)
                })
                .unwrap_or(&[])
            })
            .collect()
    }

    /// Row `row` of record batch `chunk` as raw bytes.
    fn row(&self, chunk: usize, row: usize) -> Option<&[u8]> {
        let c = self.chunks.get(chunk)?;
        let size = self.dtype.size() as usize;
        let (start, end) = match (&c.offsets, self.kind.width()) {
            (Offsets::None, Some(w)) => (row.checked_mul(w)?, (row + 1).checked_mul(w)?),
            (Offsets::I32(o), _) => {
                let o: &[i32] = bytemuck::try_cast_slice(o.as_slice()).ok()?;
                (
                    usize::try_from(*o.get(row)?).ok()?,
                    usize::try_from(*o.get(row + 1)?).ok()?,
                )
            }
            (Offsets::I64(o), _) => {
                let o: &[i64] = bytemuck::try_cast_slice(o.as_slice()).ok()?;
                (
                    usize::try_from(*o.get(row)?).ok()?,
                    usize::try_from(*o.get(row + 1)?).ok()?,
                )
            }
            (Offsets::None, None) => return None,
        };
        c.values
            .as_slice()
            .get(start.checked_mul(size)?..end.checked_mul(size)?)
    }
}

fn column_error(path: &Path, column: &str, found: &DataType, wanted: &str) -> DataError {
    DataError::file(
        path,
        FileProblem::ColumnType {
            column: column.to_string(),
            found: found.to_string(),
            wanted: wanted.to_string(),
        },
    )
}

/// The byte buffer of `data`'s values from its offset (`elems` elements of `size` bytes).
fn values(data: &ArrayData, size: usize, elems: usize) -> Option<Buffer> {
    let buf = data.buffers().first()?;
    let start = data.offset().checked_mul(size)?;
    let len = elems.checked_mul(size)?;
    (start.checked_add(len)? <= buf.len()).then(|| buf.slice_with_length(start, len))
}

/// The chunk of one array, or why the column cannot be served.
fn chunk(
    path: &Path,
    name: &str,
    array: &dyn Array,
    kind: ColumnKind,
    dtype: Dtype,
) -> Result<Chunk, DataError> {
    let data = array.to_data();
    let size = dtype.size() as usize;
    let t = array.data_type();
    let nulls = |d: &ArrayData| d.null_count() > 0;
    let broken = || column_error(path, name, t, "its buffers are shorter than its length");
    if nulls(&data) {
        return Err(column_error(
            path,
            name,
            t,
            "rows with nulls are not supported",
        ));
    }
    let n = data.len();
    let chunk = match kind {
        ColumnKind::Scalar => Chunk {
            values: values(&data, size, n).ok_or_else(broken)?,
            offsets: Offsets::None,
        },
        ColumnKind::Fixed(w) => {
            let child = data.child_data().first().ok_or_else(broken)?;
            if nulls(child) {
                return Err(column_error(path, name, t, "null values are not supported"));
            }
            let first = data.offset().checked_mul(w).ok_or_else(broken)?;
            let buf = child.buffers().first().ok_or_else(broken)?;
            let start = child
                .offset()
                .checked_add(first)
                .and_then(|e| e.checked_mul(size))
                .ok_or_else(broken)?;
            let len = n
                .checked_mul(w)
                .and_then(|e| e.checked_mul(size))
                .ok_or_else(broken)?;
            if start.checked_add(len).is_none_or(|e| e > buf.len()) {
                return Err(broken());
            }
            Chunk {
                values: buf.slice_with_length(start, len),
                offsets: Offsets::None,
            }
        }
        ColumnKind::List => {
            let child = data.child_data().first().ok_or_else(broken)?;
            if nulls(child) {
                return Err(column_error(path, name, t, "null values are not supported"));
            }
            let large = matches!(t, DataType::LargeList(_));
            let osize = if large { 8 } else { 4 };
            let offsets = values(&data, osize, n + 1).ok_or_else(broken)?;
            let cbuf = child.buffers().first().ok_or_else(broken)?;
            let cstart = child.offset().saturating_mul(size).min(cbuf.len());
            let values = cbuf.slice_with_length(cstart, cbuf.len() - cstart);
            Chunk {
                values,
                offsets: if large {
                    Offsets::I64(offsets)
                } else {
                    Offsets::I32(offsets)
                },
            }
        }
    };
    Ok(chunk)
}

/// What a field's type is as a column, or why it is not one trainmem serves.
fn kind_of(path: &Path, name: &str, t: &DataType) -> Result<(ColumnKind, Dtype), DataError> {
    let unsupported = || {
        column_error(
            path,
            name,
            t,
            "trainmem serves numbers, fixed-size lists and lists of numbers",
        )
    };
    match t {
        DataType::FixedSizeList(f, n) => {
            let d = dtype_of_arrow(f.data_type()).ok_or_else(unsupported)?;
            let n = usize::try_from(*n).map_err(|_| unsupported())?;
            Ok((ColumnKind::Fixed(n), d))
        }
        DataType::List(f) | DataType::LargeList(f) => {
            let d = dtype_of_arrow(f.data_type()).ok_or_else(unsupported)?;
            Ok((ColumnKind::List, d))
        }
        other => Ok((
            ColumnKind::Scalar,
            dtype_of_arrow(other).ok_or_else(unsupported)?,
        )),
    }
}

/// Columns of an Arrow IPC file or stream, memory-mapped.
#[derive(Debug)]
pub struct ArrowDataset {
    path: PathBuf,
    file: File,
    file_len: u64,
    format: ArrowFormat,
    schema: SchemaRef,
    batch_starts: Vec<usize>,
    len: usize,
    columns: Vec<ArrowColumn>,
    /// Where the mapping lies in memory (addresses), to tell views from copies.
    mapping: std::ops::Range<usize>,
}

impl ArrowDataset {
    /// Opens every column of `path` (an Arrow IPC file or stream); a column of a type
    /// trainmem cannot serve (strings, nested lists, nulls...) is an error.
    pub fn open(path: impl AsRef<Path>) -> Result<ArrowDataset, DataError> {
        ArrowDataset::open_columns(path, &[])
    }

    /// Opens the named columns of `path` (all columns when `columns` is empty).
    pub fn open_columns(
        path: impl AsRef<Path>,
        columns: &[&str],
    ) -> Result<ArrowDataset, DataError> {
        let path = path.as_ref();
        let (file, file_len, bytes) = MappedFile::open(path)?.into_parts();
        let buf = Buffer::from(bytes.unwrap_or_default());
        let base = buf.as_ptr() as usize;
        let mapping = base..base + buf.len();
        let decoded = decode(path, buf)?;
        let schema = decoded.schema;
        let names: Vec<String> = if columns.is_empty() {
            schema.fields().iter().map(|f| f.name().clone()).collect()
        } else {
            columns.iter().map(|s| s.to_string()).collect()
        };
        let mut out = Vec::with_capacity(names.len());
        for name in &names {
            out.push(select(path, &schema, &decoded.batches, name)?);
        }
        let mut batch_starts = Vec::with_capacity(decoded.batches.len());
        let mut len = 0usize;
        for b in &decoded.batches {
            batch_starts.push(len);
            len += b.num_rows();
        }
        Ok(ArrowDataset {
            path: path.to_path_buf(),
            file,
            file_len,
            format: decoded.format,
            schema,
            batch_starts,
            len,
            columns: out,
            mapping,
        })
    }

    /// Whether column `k`'s values are views into the file's mapping in every record batch
    /// (`false` when the reader had to copy them, e.g. to align them).
    pub fn is_zero_copy(&self, k: usize) -> bool {
        self.columns.get(k).is_some_and(|c| {
            c.chunks.iter().all(|ch| {
                let r = ch.values.as_slice().as_ptr_range();
                self.mapping.contains(&(r.start as usize)) && r.end as usize <= self.mapping.end
            })
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }
    /// File or stream.
    pub fn format(&self) -> ArrowFormat {
        self.format
    }
    /// The file's whole schema.
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }
    /// Number of record batches.
    pub fn record_batches(&self) -> usize {
        self.batch_starts.len()
    }
    /// The selected columns.
    pub fn columns(&self) -> &[ArrowColumn] {
        &self.columns
    }

    /// The position of the selected column `name`.
    pub fn column_index(&self, name: &str) -> Result<usize, DataError> {
        self.columns
            .iter()
            .position(|c| c.name == name)
            .ok_or_else(|| {
                DataError::file(
                    &self.path,
                    FileProblem::MissingColumn {
                        column: name.to_string(),
                        available: self.columns.iter().map(|c| c.name.clone()).collect(),
                    },
                )
            })
    }

    /// The selected column `name`, required to have a fixed width per row.
    pub fn fixed_column(&self, name: &str) -> Result<usize, DataError> {
        let k = self.column_index(name)?;
        let c = &self.columns[k];
        if c.kind.width().is_none() {
            return Err(column_error(
                &self.path,
                name,
                &c.arrow_type,
                "a fixed width per row was asked (pad or pack it instead)",
            ));
        }
        Ok(k)
    }

    /// Bytes of one sample over all columns (`None` when a list column makes it vary).
    pub fn bytes_per_sample(&self) -> Option<usize> {
        self.columns
            .iter()
            .map(|c| c.kind.width().map(|w| w * c.dtype.size() as usize))
            .sum()
    }

    /// The record batch holding sample `index`, and its row there.
    fn locate(&self, index: usize) -> Option<(usize, usize)> {
        if index >= self.len {
            return None;
        }
        let b = self.batch_starts.partition_point(|&s| s <= index) - 1;
        Some((b, index - self.batch_starts[b]))
    }

    /// Column `k`'s row of sample `index` as raw bytes (zero-copy).
    pub fn row_bytes(&self, k: usize, index: usize) -> Option<&[u8]> {
        let (b, r) = self.locate(index)?;
        self.columns.get(k)?.row(b, r)
    }
}

fn select(
    path: &Path,
    schema: &SchemaRef,
    batches: &[RecordBatch],
    name: &str,
) -> Result<ArrowColumn, DataError> {
    let (i, field) = schema.column_with_name(name).ok_or_else(|| {
        DataError::file(
            path,
            FileProblem::MissingColumn {
                column: name.to_string(),
                available: schema.fields().iter().map(|f| f.name().clone()).collect(),
            },
        )
    })?;
    let t = field.data_type();
    let (kind, dtype) = kind_of(path, name, t)?;
    let chunks = batches
        .iter()
        .map(|b| chunk(path, name, b.column(i).as_ref(), kind, dtype))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(ArrowColumn {
        name: name.to_string(),
        kind,
        dtype,
        arrow_type: t.clone(),
        chunks,
    })
}

impl Dataset for ArrowDataset {
    type Sample<'a> = ArrowRow<'a>;

    fn len(&self) -> usize {
        self.len
    }

    fn sample(&self, index: usize) -> Result<ArrowRow<'_>, DataError> {
        if index >= self.len {
            return Err(DataError::OutOfRange {
                index,
                len: self.len,
            });
        }
        Ok(ArrowRow {
            dataset: self,
            index,
        })
    }

    fn check(&self) -> Result<(), DataError> {
        check_not_shrunk(&self.file, &self.path, self.file_len)
    }
}

/// One sample of an [`ArrowDataset`]: its row of each selected column, borrowed.
#[derive(Debug, Clone, Copy)]
pub struct ArrowRow<'a> {
    dataset: &'a ArrowDataset,
    index: usize,
}

impl<'a> ArrowRow<'a> {
    /// The sample index.
    pub fn index(&self) -> usize {
        self.index
    }

    /// Column `k`'s row as raw bytes.
    pub fn bytes(&self, k: usize) -> Result<&'a [u8], DataError> {
        self.dataset
            .row_bytes(k, self.index)
            .ok_or(DataError::OutOfRange {
                index: self.index,
                len: self.dataset.len,
            })
    }

    /// Column `k`'s row as `T` (zero-copy; `T` must match the column's dtype).
    pub fn get<T: Element>(&self, k: usize) -> Result<&'a [T], DataError> {
        let c = self.dataset.columns.get(k).ok_or(DataError::NoColumns)?;
        if c.dtype != T::DTYPE {
            return Err(DataError::DTypeMismatch {
                column: c.name.clone(),
                actual: c.dtype,
                requested: T::DTYPE,
            });
        }
        bytemuck::try_cast_slice(self.bytes(k)?).map_err(|e| DataError::Cast {
            column: c.name.clone(),
            requested: T::DTYPE,
            reason: e.to_string(),
        })
    }
}
