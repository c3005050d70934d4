//! Reading an Arrow IPC file or stream (what Hugging Face `datasets` keeps in its cache, e.g.
//! `data-00000-of-00001.arrow`, a stream) from a memory mapping with the `arrow` crates: the
//! record batches' buffers are views into the mapping (aligned data is not copied).

use std::panic::AssertUnwindSafe;
use std::path::Path;

use arrow_array::RecordBatch;
use arrow_buffer::Buffer;
use arrow_ipc::reader::{FileDecoder, StreamDecoder, read_footer_length};
use arrow_schema::{ArrowError, SchemaRef};

use crate::error::{DataError, FileProblem};

/// Which Arrow IPC container a file is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ArrowFormat {
    /// The random-access file format (`ARROW1` magic, footer).
    File,
    /// The streaming format (a schema message, then record batches; `datasets`' cache files).
    Stream,
}

impl std::fmt::Display for ArrowFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ArrowFormat::File => "arrow ipc file",
            ArrowFormat::Stream => "arrow ipc stream",
        })
    }
}

/// The Arrow file magic.
pub const ARROW_MAGIC: &[u8; 6] = b"ARROW1";

/// The schema and record batches of an Arrow IPC buffer.
pub(crate) struct Decoded {
    pub format: ArrowFormat,
    pub schema: SchemaRef,
    pub batches: Vec<RecordBatch>,
}

fn arrow_err(path: &Path, e: ArrowError) -> DataError {
    DataError::file(path, FileProblem::Arrow(e))
}

/// Decodes `buf` (a whole file) as an Arrow IPC file or stream. The `arrow` readers check
/// what they parse; this also bounds every block against the buffer before slicing, and turns
/// a panic inside `arrow` (a reader bug on a corrupt file) into an error.
pub(crate) fn decode(path: &Path, buf: Buffer) -> Result<Decoded, DataError> {
    let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
        if buf.len() >= 8 && buf[..6] == ARROW_MAGIC[..] {
            decode_file(path, &buf)
        } else {
            decode_stream(path, buf.clone())
        }
    }));
    result.unwrap_or_else(|_| Err(DataError::file(path, FileProblem::ArrowPanicked)))
}

fn decode_file(path: &Path, buf: &Buffer) -> Result<Decoded, DataError> {
    let len = buf.len();
    let bad = |at: usize, m: String| DataError::malformed(path, at as u64, m);
    if len < 6 + 2 + 10 {
        return Err(bad(len, "truncated: too short for an Arrow file".into()));
    }
    let trailer: [u8; 10] = buf[len - 10..].try_into().unwrap_or_default();
    let rejected =
        |at: usize, e: ArrowError| DataError::arrow_rejected(path, at as u64, e.to_string(), e);
    let footer_len = read_footer_length(trailer).map_err(|e| rejected(len - 10, e))?;
    let footer_start = (len - 10)
        .checked_sub(footer_len)
        .filter(|&s| s >= 8)
        .ok_or_else(|| {
            bad(
                len - 10,
                format!("footer of {footer_len} bytes does not fit (truncated?)"),
            )
        })?;
    let footer = arrow_ipc::root_as_footer(&buf[footer_start..len - 10])
        // flatbuffers' error is no `std::error::Error` here (no `std` feature): keep its text.
        .map_err(|e| bad(footer_start, format!("footer: {e}")))?;
    let fb_schema = footer
        .schema()
        .ok_or_else(|| bad(footer_start, "footer has no schema".into()))?;
    let schema = std::sync::Arc::new(
        arrow_ipc::convert::try_fb_to_schema(fb_schema).map_err(|e| arrow_err(path, e))?,
    );
    let mut decoder = FileDecoder::new(schema.clone(), footer.version());
    let block_buf = |b: &arrow_ipc::Block| -> Result<Buffer, DataError> {
        let start = usize::try_from(b.offset()).ok();
        let size = usize::try_from(b.metaDataLength())
            .ok()
            .zip(usize::try_from(b.bodyLength()).ok())
            .and_then(|(m, body)| m.checked_add(body));
        match (start, size) {
            (Some(s), Some(n)) if s.checked_add(n).is_some_and(|e| e <= footer_start) => {
                Ok(buf.slice_with_length(s, n))
            }
            _ => Err(bad(
                footer_start,
                format!(
                    "a block at byte {} of {} + {} bytes lies outside the {len}-byte file (truncated?)",
                    b.offset(),
                    b.metaDataLength(),
                    b.bodyLength()
                ),
            )),
        }
    };
    for block in footer.dictionaries().iter().flatten() {
        let data = block_buf(block)?;
        decoder
            .read_dictionary(block, &data)
            .map_err(|e| rejected(block.offset() as usize, e))?;
    }
    let mut batches = Vec::new();
    for block in footer.recordBatches().iter().flatten() {
        let data = block_buf(block)?;
        if let Some(b) = decoder
            .read_record_batch(block, &data)
            .map_err(|e| rejected(block.offset() as usize, e))?
        {
            batches.push(b);
        }
    }
    Ok(Decoded {
        format: ArrowFormat::File,
        schema,
        batches,
    })
}

fn decode_stream(path: &Path, mut buf: Buffer) -> Result<Decoded, DataError> {
    let total = buf.len();
    let mut decoder = StreamDecoder::new();
    let mut batches = Vec::new();
    let at = |buf: &Buffer| (total - buf.len()) as u64;
    let stream_err = |buf: &Buffer, e: ArrowError| {
        DataError::arrow_rejected(path, at(buf), format!("arrow stream: {e}"), e)
    };
    while !buf.is_empty() {
        match decoder.decode(&mut buf) {
            Ok(Some(b)) => batches.push(b),
            Ok(None) => {}
            Err(e) => return Err(stream_err(&buf, e)),
        }
    }
    decoder.finish().map_err(|e| {
        DataError::arrow_rejected(
            path,
            total as u64,
            format!("arrow stream: {e} (truncated?)"),
            e,
        )
    })?;
    let schema = decoder.schema().ok_or_else(|| {
        DataError::malformed(path, 0, "no Arrow schema (not an Arrow file or stream)")
    })?;
    Ok(Decoded {
        format: ArrowFormat::Stream,
        schema,
        batches,
    })
}
