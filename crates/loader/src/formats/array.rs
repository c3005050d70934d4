//! [`MappedArray`]: one memory-mapped file (a `.npy` array or a raw record file), validated at
//! open, with zero-copy byte and typed views of its samples.
//!
//! # Files that change while mapped
//!
//! A mapping reads the file's pages directly. If another process truncates the file while it is
//! mapped, touching a page past the new end raises SIGBUS, which kills the process; no library
//! can turn that into an error after the fact. trainmem keeps the file open, re-checks its length
//! with [`MappedArray::check_unchanged`] (the loader does so at the start of every epoch), and
//! reports a shrink as [`FileProblem::Shrunk`] before any page is read. A shrink in the middle of
//! an epoch cannot be caught: do not rewrite data sets in place while training reads them (write
//! a new file and rename it over the old one instead; the open mapping keeps the old inode).
//! Changing bytes without changing the length is not detected and yields the new bytes.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use serde::{Deserialize, Serialize};

use crate::dtype::Element;

use crate::error::{DataError, FileProblem};
use crate::formats::mapped::check_not_shrunk;
use crate::formats::npy::{self, HeaderError};
use trainmem_core::Dtype;

/// Which kind of file an array came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileFormat {
    /// A `.npy` file of this `(major, minor)` version.
    Npy {
        /// Major version (1, 2 or 3).
        major: u8,
        /// Minor version (0).
        minor: u8,
    },
    /// Fixed-size records described by a sidecar.
    Raw,
    /// One tensor of a safetensors file (its first dimension = samples).
    Safetensors,
}

impl std::fmt::Display for FileFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FileFormat::Npy { major, minor } => write!(f, "npy v{major}.{minor}"),
            FileFormat::Raw => f.write_str("raw records"),
            FileFormat::Safetensors => f.write_str("safetensors"),
        }
    }
}

/// The sidecar that describes a raw record file, stored as JSON next to it at
/// `<file>.json`, for example `{"dtype": "<f4", "sample_shape": [3, 32, 32], "offset": 0}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSidecar {
    /// numpy-style `descr` of the element type.
    pub dtype: String,
    /// Shape of one record (empty for one scalar per record).
    pub sample_shape: Vec<usize>,
    /// Bytes to skip at the start of the file (a multiple of the element size).
    #[serde(default)]
    pub offset: usize,
}

/// Where the sidecar of a raw file lives: the data path with `.json` appended.
pub fn sidecar_path(data: &Path) -> PathBuf {
    let mut s = data.as_os_str().to_owned();
    s.push(".json");
    PathBuf::from(s)
}

/// Where an array's bytes live.
#[derive(Debug)]
enum Storage {
    /// The file mapped read-only (`None` for an empty file): pages come from the page cache
    /// as they are touched (RssFile).
    Map(Option<Mmap>),
    /// The data bytes read into anonymous heap memory (RssAnon), held as `u64`s so every
    /// typed view up to 8-byte elements is aligned.
    Owned(Vec<u64>),
}

/// A validated array whose first axis is the sample axis: memory-mapped, or read into memory
/// with [`MappedArray::preload`].
#[derive(Debug)]
pub struct MappedArray {
    path: PathBuf,
    file: File,
    map: Storage,
    format: FileFormat,
    dtype: Dtype,
    shape: Vec<usize>,
    data_offset: usize,
    data_len: usize,
    sample_bytes: usize,
    file_len: u64,
}

fn io(path: &Path, e: std::io::Error) -> DataError {
    DataError::file(path, FileProblem::Io(e))
}

impl MappedArray {
    /// Opens a `.npy` file, or a raw record file when it has a sidecar, telling them apart by
    /// the `.npy` magic bytes.
    pub fn open(path: impl AsRef<Path>) -> Result<MappedArray, DataError> {
        let path = path.as_ref();
        let mut file = File::open(path).map_err(|e| io(path, e))?;
        let mut magic = [0u8; 6];
        let n = read_up_to(&mut file, &mut magic).map_err(|e| io(path, e))?;
        if n == 6 && &magic == npy::MAGIC {
            return MappedArray::open_npy(path);
        }
        let sidecar = sidecar_path(path);
        if sidecar.exists() {
            return MappedArray::open_raw(path);
        }
        if path.extension().is_some_and(|e| e == "npy") {
            // A .npy name with a bad magic: say what is wrong with it as a .npy file.
            return MappedArray::open_npy(path);
        }
        Err(DataError::file(path, FileProblem::Unrecognised { sidecar }))
    }

    /// Opens and validates a `.npy` file.
    pub fn open_npy(path: impl AsRef<Path>) -> Result<MappedArray, DataError> {
        let path = path.as_ref();
        let mut file = File::open(path).map_err(|e| io(path, e))?;
        let file_len = file.metadata().map_err(|e| io(path, e))?.len();
        let mut head = vec![0u8; 12];
        let n = read_up_to(&mut file, &mut head).map_err(|e| io(path, e))?;
        head.truncate(n);
        let (prefix, dict_len) = npy::header_extent(&head).map_err(|e| DataError::file(path, e))?;
        let total = prefix + dict_len;
        if (total as u64) > file_len {
            return Err(DataError::file(
                path,
                HeaderError::Truncated(format!(
                    "header says {total} bytes, the file holds {file_len}"
                )),
            ));
        }
        let mut header = vec![0u8; total];
        header[..n].copy_from_slice(&head);
        file.read_exact(&mut header[n..]).map_err(|e| io(path, e))?;
        let h = npy::parse_header(&header).map_err(|e| DataError::file(path, e))?;
        MappedArray::finish(
            path,
            file,
            file_len,
            FileFormat::Npy {
                major: h.version.0,
                minor: h.version.1,
            },
            h.dtype,
            h.shape,
            h.data_offset,
            true,
        )
    }

    /// Opens a raw record file described by its sidecar ([`sidecar_path`]).
    pub fn open_raw(path: impl AsRef<Path>) -> Result<MappedArray, DataError> {
        let path = path.as_ref();
        let sidecar = sidecar_path(path);
        let bad = |source: crate::BoxError| {
            DataError::file(
                path,
                FileProblem::Sidecar {
                    sidecar: sidecar.clone(),
                    source,
                },
            )
        };
        let text = std::fs::read_to_string(&sidecar).map_err(|e| bad(e.into()))?;
        let meta: RawSidecar = serde_json::from_str(&text).map_err(|e| bad(e.into()))?;
        MappedArray::open_raw_with(path, &meta)
    }

    /// Opens a raw record file with an explicit layout (no sidecar needed). The bytes after
    /// `offset` (which must lie within the file) are a whole number of records; records of
    /// no bytes (a 0 in `sample_shape`) are refused, as their number could not be told.
    pub fn open_raw_with(
        path: impl AsRef<Path>,
        layout: &RawSidecar,
    ) -> Result<MappedArray, DataError> {
        let path = path.as_ref();
        let dtype = crate::dtype::from_descr(&layout.dtype)
            .map_err(|e| DataError::file(path, HeaderError::Dtype(e)))?;
        let file = File::open(path).map_err(|e| io(path, e))?;
        let file_len = file.metadata().map_err(|e| io(path, e))?.len();
        let record_elems = checked_prod(&layout.sample_shape).ok_or_else(|| {
            DataError::file(path, FileProblem::Overflow(layout.sample_shape.clone()))
        })?;
        let record_bytes = record_elems
            .checked_mul(dtype.size() as usize)
            .ok_or_else(|| {
                DataError::file(path, FileProblem::Overflow(layout.sample_shape.clone()))
            })?;
        if record_bytes == 0 {
            return Err(DataError::file(
                path,
                FileProblem::EmptyRecord(layout.sample_shape.clone()),
            ));
        }
        let data_bytes = file_len.checked_sub(layout.offset as u64).ok_or_else(|| {
            DataError::file(
                path,
                FileProblem::OffsetPastEnd {
                    offset: layout.offset as u64,
                    file_len,
                },
            )
        })?;
        if data_bytes % record_bytes as u64 != 0 {
            return Err(DataError::file(
                path,
                FileProblem::PartialRecord {
                    data_bytes,
                    record_bytes: record_bytes as u64,
                },
            ));
        }
        let samples = usize::try_from(data_bytes / record_bytes as u64).map_err(|_| {
            DataError::file(path, FileProblem::Overflow(layout.sample_shape.clone()))
        })?;
        let mut shape = vec![samples];
        shape.extend_from_slice(&layout.sample_shape);
        MappedArray::finish(
            path,
            file,
            file_len,
            FileFormat::Raw,
            dtype,
            shape,
            layout.offset,
            false,
        )
    }

    /// Maps the `shape` array of `dtype` at `offset` of `path` (one tensor of a container
    /// file, validated by the caller's parser; bounds are checked again here).
    pub(crate) fn open_region(
        path: &Path,
        format: FileFormat,
        dtype: Dtype,
        shape: Vec<usize>,
        offset: usize,
    ) -> Result<MappedArray, DataError> {
        let file = File::open(path).map_err(|e| io(path, e))?;
        let file_len = file.metadata().map_err(|e| io(path, e))?.len();
        MappedArray::finish(path, file, file_len, format, dtype, shape, offset, false)
    }

    #[allow(clippy::too_many_arguments)]
    fn finish(
        path: &Path,
        file: File,
        file_len: u64,
        format: FileFormat,
        dtype: Dtype,
        shape: Vec<usize>,
        data_offset: usize,
        exact_len: bool,
    ) -> Result<MappedArray, DataError> {
        let (data_len, needed) =
            data_extent(path, file_len, dtype, &shape, data_offset, exact_len)?;
        let map = map_data(path, &file, file_len, needed)?;
        // Per-sample bytes from the sample shape, so it is right even with zero samples.
        let sample_bytes = checked_prod(&shape[1..]).unwrap_or(0) * (dtype.size() as usize);
        Ok(MappedArray {
            path: path.to_path_buf(),
            file,
            map: Storage::Map(map),
            format,
            dtype,
            shape,
            data_offset,
            data_len,
            sample_bytes,
            file_len,
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }
    /// What kind of file it is.
    pub fn format(&self) -> FileFormat {
        self.format
    }
    /// Element type.
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }
    /// Full shape; `shape()[0]` is the number of samples.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    /// Shape of one sample.
    pub fn sample_shape(&self) -> &[usize] {
        &self.shape[1..]
    }
    /// Number of samples.
    pub fn len(&self) -> usize {
        self.shape[0]
    }
    /// Whether there are no samples.
    pub fn is_empty(&self) -> bool {
        self.shape[0] == 0
    }
    /// Bytes per sample.
    pub fn bytes_per_sample(&self) -> usize {
        self.sample_bytes
    }
    /// Byte offset of the data in the file.
    pub fn data_offset(&self) -> usize {
        self.data_offset
    }

    /// All data bytes.
    pub fn data(&self) -> &[u8] {
        match &self.map {
            Storage::Map(Some(m)) => &m[self.data_offset..self.data_offset + self.data_len],
            Storage::Map(None) => &[],
            Storage::Owned(words) => &bytemuck::cast_slice(words)[..self.data_len],
        }
    }

    /// Reads the data bytes into anonymous memory allocated by the calling thread (so a
    /// counting allocator attributes them to its tag) and drops the mapping: every later read
    /// comes from that copy. Costs the data size in RssAnon at once, instead of RssFile as
    /// pages are touched.
    pub fn preload(mut self) -> Result<MappedArray, DataError> {
        use std::io::{Seek, SeekFrom};
        if matches!(self.map, Storage::Owned(_)) {
            return Ok(self);
        }
        let mut words = vec![0u64; self.data_len.div_ceil(8)];
        {
            let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut words);
            let mut f = &self.file;
            f.seek(SeekFrom::Start(self.data_offset as u64))
                .map_err(|e| io(&self.path, e))?;
            f.read_exact(&mut bytes[..self.data_len])
                .map_err(|e| io(&self.path, e))?;
        }
        self.map = Storage::Owned(words);
        Ok(self)
    }

    /// Whether the data was read into memory ([`Self::preload`]) rather than mapped.
    pub fn is_preloaded(&self) -> bool {
        matches!(self.map, Storage::Owned(_))
    }

    /// The bytes of sample `index`, or `None` past the end.
    pub fn sample(&self, index: usize) -> Option<&[u8]> {
        if index >= self.len() {
            return None;
        }
        let start = index * self.sample_bytes;
        Some(&self.data()[start..start + self.sample_bytes])
    }

    /// The bytes of the contiguous samples `range` (for sequential batches), or `None` when
    /// the range is past the end.
    pub fn samples(&self, range: std::ops::Range<usize>) -> Option<&[u8]> {
        if range.start > range.end || range.end > self.len() {
            return None;
        }
        Some(&self.data()[range.start * self.sample_bytes..range.end * self.sample_bytes])
    }

    /// A typed zero-copy view of all elements.
    pub fn view<T: Element>(&self) -> Result<&[T], DataError> {
        self.cast(self.data())
    }

    /// A typed zero-copy view of one sample.
    pub fn sample_view<T: Element>(&self, index: usize) -> Result<&[T], DataError> {
        let bytes = self.sample(index).ok_or(DataError::OutOfRange {
            index,
            len: self.len(),
        })?;
        self.cast(bytes)
    }

    pub(crate) fn cast<'a, T: Element>(&self, bytes: &'a [u8]) -> Result<&'a [T], DataError> {
        if T::DTYPE != self.dtype {
            return Err(DataError::DTypeMismatch {
                column: self.path.display().to_string(),
                actual: self.dtype,
                requested: T::DTYPE,
            });
        }
        bytemuck::try_cast_slice(bytes).map_err(|e| DataError::Cast {
            column: self.path.display().to_string(),
            requested: T::DTYPE,
            reason: format!("{e:?}"),
        })
    }

    /// Re-checks that the file is still at least as long as when it was opened (see the module
    /// docs on files that change while mapped).
    pub fn check_unchanged(&self) -> Result<(), DataError> {
        if self.is_preloaded() {
            // Reads come from the in-memory copy; the file no longer matters.
            return Ok(());
        }
        check_not_shrunk(&self.file, &self.path, self.file_len)
    }

    /// Tells the kernel how the samples will be read: sequentially (aggressive read-ahead) or
    /// at random (no read-ahead, so neighbouring pages do not inflate RssFile). Advice is a
    /// hint; failures are ignored.
    pub fn advise(&self, sequential: bool) {
        #[cfg(unix)]
        if let Storage::Map(Some(m)) = &self.map {
            let advice = if sequential {
                memmap2::Advice::Sequential
            } else {
                memmap2::Advice::Random
            };
            let _ = m.advise(advice);
        }
        #[cfg(not(unix))]
        let _ = sequential;
    }
}

/// The data bytes `shape` of `dtype` take, and the file length they need from
/// `data_offset`, checked against the file's length `file_len` (enough bytes, and no more
/// with `exact_len`) and the element alignment.
fn data_extent(
    path: &Path,
    file_len: u64,
    dtype: Dtype,
    shape: &[usize],
    data_offset: usize,
    exact_len: bool,
) -> Result<(usize, u64), DataError> {
    let overflow = || DataError::file(path, FileProblem::Overflow(shape.to_vec()));
    let elems = checked_prod(shape).ok_or_else(overflow)?;
    let data_len = elems
        .checked_mul(dtype.size() as usize)
        .ok_or_else(overflow)?;
    let needed = (data_offset as u64)
        .checked_add(data_len as u64)
        .ok_or_else(overflow)?;
    if needed > file_len {
        return Err(DataError::file(
            path,
            FileProblem::Truncated {
                shape: shape.to_vec(),
                dtype,
                expected: data_len as u64,
                actual: file_len.saturating_sub(data_offset as u64),
            },
        ));
    }
    if exact_len && needed < file_len {
        return Err(DataError::file(
            path,
            FileProblem::TrailingBytes {
                expected: data_len as u64,
                extra: file_len - needed,
            },
        ));
    }
    if !data_offset.is_multiple_of(dtype.size() as usize) {
        return Err(DataError::file(
            path,
            FileProblem::Misaligned {
                offset: data_offset,
                align: (dtype.size() as usize),
            },
        ));
    }
    Ok((data_len, needed))
}

/// Maps `file` (`file_len` bytes at open; none for an empty file), refusing a mapping shorter
/// than the `needed` bytes the data ends at.
fn map_data(
    path: &Path,
    file: &File,
    file_len: u64,
    needed: u64,
) -> Result<Option<Mmap>, DataError> {
    if file_len == 0 {
        return Ok(None);
    }
    // SAFETY: mapping a file is unsafe because another process may truncate or modify it while
    // mapped. The length was validated by `data_extent`, the file stays open with the map, and
    // `check_unchanged` re-validates it at every epoch start; the module docs state the
    // remaining hazard (an in-place shrink mid-epoch) for users.
    let map = unsafe { Mmap::map(file) }.map_err(|e| io(path, e))?;
    if (map.len() as u64) < needed {
        return Err(DataError::file(
            path,
            FileProblem::Shrunk {
                opened: file_len,
                now: map.len() as u64,
            },
        ));
    }
    Ok(Some(map))
}

fn checked_prod(dims: &[usize]) -> Option<usize> {
    dims.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
}

fn read_up_to(file: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(dir: &Path, name: &str, len: usize, layout: &RawSidecar) -> Result<MappedArray, String> {
        let path = dir.join(name);
        std::fs::write(&path, vec![0u8; len]).expect("write");
        MappedArray::open_raw_with(&path, layout).map_err(|e| match e {
            DataError::File { problem, .. } => problem.to_string(),
            other => other.to_string(),
        })
    }

    fn layout(sample_shape: Vec<usize>, offset: usize) -> RawSidecar {
        RawSidecar {
            dtype: "<f4".into(),
            sample_shape,
            offset,
        }
    }

    #[test]
    fn a_raw_offset_past_the_end_says_so() {
        let dir = std::env::temp_dir().join(format!("trainmem-array-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        assert_eq!(
            raw(&dir, "past.bin", 30, &layout(vec![2], 64)).expect_err("past the end"),
            "data offset 64 is past the end of the file (30 bytes)"
        );
        // At the very end: no records.
        let at_end = raw(&dir, "end.bin", 32, &layout(vec![2], 32)).expect("at the end");
        assert_eq!(at_end.len(), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn raw_records_of_no_bytes_are_refused() {
        let dir = std::env::temp_dir().join(format!("trainmem-array0-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        for shape in [vec![0], vec![3, 0, 2]] {
            let err = raw(&dir, "zero.bin", 30, &layout(shape.clone(), 0)).expect_err("no bytes");
            assert_eq!(
                err,
                format!(
                    "records of shape {shape:?} hold no bytes, so the file's length cannot tell \
                     how many there are"
                )
            );
            // Even with no data to count.
            assert!(raw(&dir, "zero-empty.bin", 0, &layout(shape, 0)).is_err());
        }
        // A scalar record (shape []) is one element, not none.
        let scalars = raw(&dir, "scalars.bin", 32, &layout(vec![], 0)).expect("8 scalars");
        assert_eq!(scalars.len(), 8);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
