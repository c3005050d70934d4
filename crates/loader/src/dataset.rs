//! The [`Dataset`] trait the loader reads from, and [`MmapDataset`]: several memory-mapped
//! arrays of equal length side by side (features, labels, ...).

use std::path::Path;

use crate::dtype::Element;
use crate::error::DataError;
use crate::formats::array::MappedArray;

/// A fixed-length, randomly accessible collection of samples, shared by the loader's workers.
pub trait Dataset: Send + Sync + 'static {
    /// What one sample looks like; it may borrow from the data set (zero-copy).
    type Sample<'a>
    where
        Self: 'a;

    /// Number of samples.
    fn len(&self) -> usize;

    /// Whether there are no samples.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sample `index` (`index < len()`).
    fn sample(&self, index: usize) -> Result<Self::Sample<'_>, DataError>;

    /// Re-validates the backing storage; the loader calls it at every epoch start.
    fn check(&self) -> Result<(), DataError> {
        Ok(())
    }

    /// Hints the access pattern of the coming epoch (sequential or random); the loader calls it
    /// at every epoch start. The default does nothing.
    fn advise(&self, sequential: bool) {
        let _ = sequential;
    }
}

/// An in-memory data set: sample `i` is `&self[i]`.
impl<T: Send + Sync + 'static> Dataset for Vec<T> {
    type Sample<'a> = &'a T;

    fn len(&self) -> usize {
        self.as_slice().len()
    }

    fn sample(&self, index: usize) -> Result<&T, DataError> {
        self.as_slice().get(index).ok_or(DataError::OutOfRange {
            index,
            len: self.as_slice().len(),
        })
    }
}

/// A named column of a [`MmapDataset`].
#[derive(Debug)]
pub struct Column {
    /// Its name (the file stem unless given).
    pub name: String,
    /// The mapped array.
    pub array: MappedArray,
}

/// Memory-mapped arrays of equal length, read side by side: sample `i` is row `i` of each.
#[derive(Debug)]
pub struct MmapDataset {
    columns: Vec<Column>,
    len: usize,
}

impl MmapDataset {
    /// Builds a data set from opened arrays; they must agree on the number of samples.
    pub fn new(columns: Vec<Column>) -> Result<MmapDataset, DataError> {
        let first = columns.first().ok_or(DataError::NoColumns)?;
        let len = first.array.len();
        if columns.iter().any(|c| c.array.len() != len) {
            let counts: Vec<String> = columns
                .iter()
                .map(|c| format!("{}={}", c.name, c.array.len()))
                .collect();
            return Err(DataError::LengthMismatch(counts.join(", ")));
        }
        Ok(MmapDataset { columns, len })
    }

    /// Opens files (`.npy` or raw with a sidecar); each column is named by its file stem.
    pub fn open<P: AsRef<Path>>(paths: &[P]) -> Result<MmapDataset, DataError> {
        let mut columns = Vec::with_capacity(paths.len());
        for p in paths {
            let p = p.as_ref();
            let name = p
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            columns.push(Column {
                name,
                array: MappedArray::open(p)?,
            });
        }
        MmapDataset::new(columns)
    }

    /// Reads every column into anonymous memory ([`MappedArray::preload`]); the data set
    /// then serves samples from memory and no longer maps its files.
    pub fn preload(self) -> Result<MmapDataset, DataError> {
        let columns = self
            .columns
            .into_iter()
            .map(|c| {
                Ok(Column {
                    name: c.name,
                    array: c.array.preload()?,
                })
            })
            .collect::<Result<Vec<_>, DataError>>()?;
        Ok(MmapDataset {
            columns,
            len: self.len,
        })
    }

    /// Bytes held in memory by preloaded columns (0 when every column is mapped).
    pub fn preloaded_bytes(&self) -> usize {
        self.columns
            .iter()
            .filter(|c| c.array.is_preloaded())
            .map(|c| c.array.data().len())
            .sum()
    }

    /// The columns.
    pub fn columns(&self) -> &[Column] {
        &self.columns
    }

    /// Column `k`'s array.
    pub fn array(&self, k: usize) -> &MappedArray {
        &self.columns[k].array
    }

    /// Bytes of one sample over all columns.
    pub fn bytes_per_sample(&self) -> usize {
        self.columns
            .iter()
            .map(|c| c.array.bytes_per_sample())
            .sum()
    }

    /// Advises the kernel of the access pattern on every column (see [`MappedArray::advise`]).
    pub fn advise(&self, sequential: bool) {
        for c in &self.columns {
            c.array.advise(sequential);
        }
    }
}

impl Dataset for MmapDataset {
    type Sample<'a> = SampleView<'a>;

    fn len(&self) -> usize {
        self.len
    }

    fn sample(&self, index: usize) -> Result<SampleView<'_>, DataError> {
        if index >= self.len {
            return Err(DataError::OutOfRange {
                index,
                len: self.len,
            });
        }
        Ok(SampleView {
            dataset: self,
            index,
        })
    }

    fn check(&self) -> Result<(), DataError> {
        self.columns
            .iter()
            .try_for_each(|c| c.array.check_unchanged())
    }

    fn advise(&self, sequential: bool) {
        MmapDataset::advise(self, sequential);
    }
}

/// One sample of a [`MmapDataset`]: borrowed rows, no copy.
#[derive(Debug, Clone, Copy)]
pub struct SampleView<'a> {
    dataset: &'a MmapDataset,
    index: usize,
}

impl<'a> SampleView<'a> {
    /// The sample index.
    pub fn index(&self) -> usize {
        self.index
    }

    /// Number of columns.
    pub fn num_fields(&self) -> usize {
        self.dataset.columns.len()
    }

    /// The raw bytes of column `k` for this sample.
    pub fn field_bytes(&self, k: usize) -> &'a [u8] {
        // In range: the index was checked against the common length at construction.
        self.dataset.columns[k]
            .array
            .sample(self.index)
            .unwrap_or(&[])
    }

    /// Column `k` as typed elements (zero-copy).
    pub fn field<T: Element>(&self, k: usize) -> Result<&'a [T], DataError> {
        self.dataset.columns[k].array.cast(self.field_bytes(k))
    }
}
