//! Errors of data-set files and of the loader.

use std::path::PathBuf;

use crate::formats::npy::HeaderError;

/// What is wrong with one file.
#[derive(Debug, thiserror::Error)]
pub enum FileProblem {
    /// The file could not be opened, read, or mapped.
    #[error("cannot read: {0}")]
    Io(#[source] std::io::Error),
    /// The `.npy` header is not usable.
    #[error(transparent)]
    Header(#[from] HeaderError),
    /// Fewer data bytes than the header describes.
    #[error(
        "truncated: shape {shape:?} of {dtype} needs {expected} data bytes, the file holds {actual}"
    )]
    Truncated {
        /// Shape from the header.
        shape: Vec<usize>,
        /// Element type.
        dtype: trainmem_core::Dtype,
        /// Bytes needed.
        expected: u64,
        /// Bytes present.
        actual: u64,
    },
    /// More bytes than the header describes.
    #[error("{extra} bytes after the {expected} data bytes the header describes (corrupt file?)")]
    TrailingBytes {
        /// Bytes the header describes.
        expected: u64,
        /// Bytes beyond them.
        extra: u64,
    },
    /// `prod(shape) × itemsize` overflows.
    #[error("shape {0:?} is too large to address")]
    Overflow(Vec<usize>),
    /// The data does not start on a multiple of the element size.
    #[error("data offset {offset} is not a multiple of the {align}-byte element size")]
    Misaligned {
        /// Data offset in the file.
        offset: usize,
        /// Required alignment.
        align: usize,
    },
    /// The raw-record sidecar is missing or wrong.
    #[error("raw sidecar {}: {source}", sidecar.display())]
    Sidecar {
        /// The sidecar path.
        sidecar: PathBuf,
        /// What is wrong: the I/O error reading it or the JSON error parsing it.
        #[source]
        source: crate::BoxError,
    },
    /// A raw record file's data offset (from its sidecar) lies past the end of the file.
    #[error("data offset {offset} is past the end of the file ({file_len} bytes)")]
    OffsetPastEnd {
        /// The data offset.
        offset: u64,
        /// The file's length.
        file_len: u64,
    },
    /// Raw records of no bytes (a 0 in the sidecar's `sample_shape`): the number of records in
    /// the file cannot be told from its length.
    #[error(
        "records of shape {0:?} hold no bytes, so the file's length cannot tell how many there are"
    )]
    EmptyRecord(Vec<usize>),
    /// The raw data length is not a whole number of records.
    #[error("{data_bytes} data bytes are not a whole number of {record_bytes}-byte records")]
    PartialRecord {
        /// Bytes after the offset.
        data_bytes: u64,
        /// Bytes per record.
        record_bytes: u64,
    },
    /// The file is shorter now than when it was opened.
    #[error(
        "file shrank from {opened} to {now} bytes while mapped (reading it could crash with SIGBUS)"
    )]
    Shrunk {
        /// Length at open.
        opened: u64,
        /// Length now.
        now: u64,
    },
    /// A header or index field that cannot be right (bad magic, unknown version or code,
    /// counts that do not add up), at this byte offset of the file.
    #[error("at byte {offset}: {message}")]
    Malformed {
        /// Byte offset of the field in the file.
        offset: u64,
        /// What is wrong.
        message: String,
    },
    /// A token id at or above the declared vocabulary size (or negative).
    #[error(
        "token id {token} at position {position} (byte {offset}) is not in the vocabulary 0..{vocab}"
    )]
    TokenOutOfVocab {
        /// The id found.
        token: i128,
        /// Its position in tokens.
        position: u64,
        /// Its byte offset in the file.
        offset: u64,
        /// The declared vocabulary size.
        vocab: u64,
    },
    /// A part of an Arrow IPC file or stream (a block, a message) that the `arrow` reader
    /// rejects, at this byte offset of the file.
    #[error("at byte {offset}: {message}")]
    ArrowRejected {
        /// Byte offset of the part in the file.
        offset: u64,
        /// What was being read, with the reader's error.
        message: String,
        /// The reader's error.
        #[source]
        source: arrow_schema::ArrowError,
    },
    /// An Arrow IPC file or stream the `arrow` reader rejects.
    #[error("arrow: {0}")]
    Arrow(#[source] arrow_schema::ArrowError),
    /// The `arrow` reader panicked on the file (a reader bug on a corrupt file), caught.
    #[error("arrow: the arrow reader failed on this file (corrupt?)")]
    ArrowPanicked,
    /// A safetensors file the `safetensors` reader rejects.
    #[error("safetensors: {0}")]
    Safetensors(#[source] safetensors::SafeTensorError),
    /// No column of that name.
    #[error("no column {column:?} (columns: {})", available.join(", "))]
    MissingColumn {
        /// The name asked for.
        column: String,
        /// The names there are.
        available: Vec<String>,
    },
    /// A column whose type is not the kind asked for (a list where a fixed width is needed,
    /// strings, nested lists, nulls...).
    #[error("column {column:?} is {found}; {wanted}")]
    ColumnType {
        /// The column.
        column: String,
        /// Its type.
        found: String,
        /// What was needed.
        wanted: String,
    },
    /// A raw file without a sidecar and without the `.npy` magic.
    #[error("not a .npy file (no \\x93NUMPY magic) and no raw sidecar {}", sidecar.display())]
    Unrecognised {
        /// The sidecar that was looked for.
        sidecar: PathBuf,
    },
}

/// An error about a data set.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// A file cannot be used.
    #[error("{}: {problem}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// The problem.
        problem: FileProblem,
    },
    /// Columns of one data set disagree on the number of samples.
    #[error("columns have different sample counts: {0}")]
    LengthMismatch(String),
    /// A data set needs at least one column.
    #[error("a data set needs at least one column")]
    NoColumns,
    /// A sample index past the end.
    #[error("sample {index} is out of range (data set has {len})")]
    OutOfRange {
        /// The index.
        index: usize,
        /// The length.
        len: usize,
    },
    /// A typed view of the wrong type.
    #[error("column {column} holds {actual}, not {requested}")]
    DTypeMismatch {
        /// The column.
        column: String,
        /// Its dtype.
        actual: trainmem_core::Dtype,
        /// The dtype asked for.
        requested: trainmem_core::Dtype,
    },
    /// A bytemuck cast failed (misaligned or wrong length).
    #[error("cannot view column {column} as {requested}: {reason}")]
    Cast {
        /// The column.
        column: String,
        /// The type asked for.
        requested: trainmem_core::Dtype,
        /// bytemuck's reason.
        reason: String,
    },
    /// Writing a fixture or sidecar failed.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

impl DataError {
    /// A [`FileProblem::Malformed`] error about `path` at byte `offset`.
    pub(crate) fn malformed(
        path: &std::path::Path,
        offset: u64,
        message: impl Into<String>,
    ) -> DataError {
        DataError::file(
            path,
            FileProblem::Malformed {
                offset,
                message: message.into(),
            },
        )
    }

    /// A [`FileProblem::ArrowRejected`] error about `path` at byte `offset`: `message` (which
    /// quotes the reader's error) for reading, the reader's error as the source.
    pub(crate) fn arrow_rejected(
        path: &std::path::Path,
        offset: u64,
        message: String,
        source: arrow_schema::ArrowError,
    ) -> DataError {
        DataError::file(
            path,
            FileProblem::ArrowRejected {
                offset,
                message,
                source,
            },
        )
    }

    pub(crate) fn file(path: &std::path::Path, problem: impl Into<FileProblem>) -> DataError {
        DataError::File {
            path: path.to_path_buf(),
            problem: problem.into(),
        }
    }
}
