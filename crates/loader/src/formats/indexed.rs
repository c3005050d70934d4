//! The indexed token data set large pretraining runs use (Megatron-LM's memory-mapped indexed
//! data set): a `.bin` of token ids beside an `.idx` describing its sequences and documents.
//!
//! The `.idx` layout, all little-endian:
//!
//! | bytes | field |
//! |---|---|
//! | 9 | magic `MMIDIDX\x00\x00` |
//! | 8 | version, `u64` = 1 |
//! | 1 | dtype code: 1 `u8`, 2 `i8`, 3 `i16`, 4 `i32`, 5 `i64`, 6 `f64`, 7 `f32`, 8 `u16` |
//! | 8 | sequence count `S`, `u64` |
//! | 8 | document index count `D`, `u64` |
//! | 4·S | tokens per sequence, `i32` |
//! | 8·S | byte offset of each sequence in the `.bin`, `i64` |
//! | 8·D | document index: the first sequence of each document, then `S`, `i64` |
//! | S | (optional, multimodal files) one mode byte per sequence, ignored |
//!
//! Every field is validated at open: a sequence that points past the end of the `.bin`, a
//! document index that runs backwards or past `S`, a truncated or overlong `.idx` are errors
//! naming the file and the byte offset of the field.

use std::path::{Path, PathBuf};

use crate::error::DataError;
use crate::formats::mapped::MappedFile;
use crate::formats::tokens::{TokenFile, TokenWindows, WindowSpec};
use trainmem_core::Dtype;

/// The `.idx` magic.
pub const IDX_MAGIC: &[u8; 9] = b"MMIDIDX\x00\x00";
const HEADER: usize = 9 + 8 + 1 + 8 + 8;

/// The dtype an `.idx` code stands for.
pub fn dtype_of_code(code: u8) -> Option<Dtype> {
    Some(match code {
        1 => Dtype::U8,
        2 => Dtype::I8,
        3 => Dtype::I16,
        4 => Dtype::I32,
        5 => Dtype::I64,
        6 => Dtype::F64,
        7 => Dtype::F32,
        8 => Dtype::U16,
        _ => return None,
    })
}

/// The `.idx` code of a dtype.
pub fn code_of_dtype(dtype: Dtype) -> Option<u8> {
    (1..=8).find(|&c| dtype_of_code(c) == Some(dtype))
}

/// An indexed token data set: the `.bin`'s tokens and the documents the `.idx` lists.
#[derive(Debug)]
pub struct IndexedTokens {
    idx_path: PathBuf,
    tokens: TokenFile,
    /// `(first token, tokens)` of each document.
    documents: Vec<(usize, usize)>,
    sequences: usize,
}

fn read_u64(idx: &MappedFile, at: usize) -> Result<u64, DataError> {
    let b = idx.get(at, 8).ok_or_else(|| {
        DataError::malformed(
            idx.path(),
            at as u64,
            format!("truncated: the .idx ends at byte {}", idx.len()),
        )
    })?;
    Ok(u64::from_le_bytes(b.try_into().unwrap_or_default()))
}

fn count(idx: &MappedFile, at: usize, what: &str) -> Result<usize, DataError> {
    let v = read_u64(idx, at)?;
    usize::try_from(v)
        .ok()
        .filter(|&n| (n as u64) <= idx.len())
        .ok_or_else(|| {
            DataError::malformed(
                idx.path(),
                at as u64,
                format!("{what} {v} cannot fit in a {}-byte .idx", idx.len()),
            )
        })
}

impl IndexedTokens {
    /// Opens `prefix.idx` and `prefix.bin` (`prefix` may also name either file). With
    /// `vocab`, every id of the `.bin` is checked to be below it.
    pub fn open(prefix: impl AsRef<Path>, vocab: Option<u64>) -> Result<IndexedTokens, DataError> {
        let prefix = prefix.as_ref();
        let base = match prefix.extension().and_then(|e| e.to_str()) {
            Some("idx" | "bin") => prefix.with_extension(""),
            _ => prefix.to_path_buf(),
        };
        let mut idx_path = base.clone().into_os_string();
        idx_path.push(".idx");
        let mut bin_path = base.into_os_string();
        bin_path.push(".bin");
        let idx = MappedFile::open(PathBuf::from(idx_path))?;
        let bin = MappedFile::open(PathBuf::from(bin_path))?;
        IndexedTokens::parse(idx, bin, vocab)
    }

    fn parse(
        idx: MappedFile,
        bin: MappedFile,
        vocab: Option<u64>,
    ) -> Result<IndexedTokens, DataError> {
        let layout = IdxLayout::read(&idx)?;
        let tokens = TokenFile::from_mapped(bin, layout.dtype, None)?;
        let seqs = layout.sequences(&idx, &tokens)?;
        let documents = layout.documents(&idx, &seqs)?;
        let t = IndexedTokens {
            idx_path: idx.path().to_path_buf(),
            tokens,
            documents,
            sequences: layout.sequences,
        };
        if let Some(v) = vocab {
            for &(start, n) in &t.documents {
                t.tokens.check_vocab(start, start + n, v)?;
            }
        }
        Ok(t)
    }

    /// The `.idx` file.
    pub fn idx_path(&self) -> &Path {
        &self.idx_path
    }

    /// The `.bin`'s tokens.
    pub fn tokens(&self) -> &TokenFile {
        &self.tokens
    }

    /// Number of sequences the `.idx` lists.
    pub fn sequences(&self) -> usize {
        self.sequences
    }

    /// `(first token, tokens)` of each document.
    pub fn documents(&self) -> &[(usize, usize)] {
        &self.documents
    }

    /// The tokens of document `d` as raw bytes.
    pub fn document_bytes(&self, d: usize) -> Option<&[u8]> {
        let &(start, n) = self.documents.get(d)?;
        self.tokens.bytes(start, n)
    }

    /// Windows of `spec.seq + 1` tokens: within documents, or, with `cross_documents`, over
    /// the documents back to back (which must then be contiguous in the `.bin`).
    pub fn windows(
        self,
        spec: WindowSpec,
        cross_documents: bool,
    ) -> Result<TokenWindows, DataError> {
        if !cross_documents {
            return TokenWindows::over(self.tokens, spec, &self.documents);
        }
        let mut stream: Option<(usize, usize)> = None;
        for &(start, n) in &self.documents {
            stream = match stream {
                None => Some((start, n)),
                Some((s, len)) if s + len == start => Some((s, len + n)),
                Some(_) => {
                    return Err(DataError::malformed(
                        &self.idx_path,
                        0,
                        "documents are not back to back in the .bin, so windows cannot cross them",
                    ));
                }
            };
        }
        TokenWindows::over(self.tokens, spec, &[stream.unwrap_or((0, 0))])
    }
}

/// Where the tables of an `.idx` lie, from its header (validated: magic, version, dtype code,
/// counts, and a file length that holds the tables).
struct IdxLayout {
    dtype: Dtype,
    /// Sequence count `S`.
    sequences: usize,
    /// Document index count `D`.
    doc_entries: usize,
    sizes_at: usize,
    ptrs_at: usize,
    docs_at: usize,
    /// The end of the document index.
    end: usize,
}

fn bad(idx: &MappedFile, at: usize, message: String) -> DataError {
    DataError::malformed(idx.path(), at as u64, message)
}

impl IdxLayout {
    /// Reads and checks the header, and the `.idx` length against the tables it announces.
    fn read(idx: &MappedFile) -> Result<IdxLayout, DataError> {
        if idx.get(0, 9) != Some(&IDX_MAGIC[..]) {
            return Err(bad(
                idx,
                0,
                "no MMIDIDX magic (not a Megatron indexed data set .idx)".into(),
            ));
        }
        let version = read_u64(idx, 9)?;
        if version != 1 {
            return Err(bad(idx, 9, format!("version {version}, only 1 is known")));
        }
        let code = idx.get(17, 1).map_or(0, |b| b[0]);
        let dtype = dtype_of_code(code)
            .ok_or_else(|| bad(idx, 17, format!("unknown dtype code {code}")))?;
        let s = count(idx, 18, "sequence count")?;
        let d = count(idx, 26, "document index count")?;
        let sizes_at = HEADER;
        let ptrs_at = sizes_at + 4 * s;
        let docs_at = ptrs_at + 8 * s;
        let end = docs_at + 8 * d;
        let len = idx.len() as usize;
        if end > len {
            return Err(bad(
                idx,
                len,
                format!(
                    "truncated: {s} sequences and {d} document entries need {end} bytes, the .idx holds {len}"
                ),
            ));
        }
        if len != end && len != end + s {
            return Err(bad(
                idx,
                end,
                format!(
                    "{} bytes after the document index (corrupt .idx?)",
                    len - end
                ),
            ));
        }
        Ok(IdxLayout {
            dtype,
            sequences: s,
            doc_entries: d,
            sizes_at,
            ptrs_at,
            docs_at,
            end,
        })
    }

    /// Each sequence's first token and length, checked to lie inside the `.bin` on its
    /// element grid.
    fn sequences(
        &self,
        idx: &MappedFile,
        tokens: &TokenFile,
    ) -> Result<Vec<(usize, usize)>, DataError> {
        let item = self.dtype.size() as usize;
        let bin_len = tokens.mapped().len();
        let mut seqs = Vec::with_capacity(self.sequences);
        for i in 0..self.sequences {
            let size_at = self.sizes_at + 4 * i;
            let size = idx
                .get(size_at, 4)
                .map_or(-1, |b| i32::from_le_bytes(b.try_into().unwrap_or([255; 4])));
            let ptr_at = self.ptrs_at + 8 * i;
            let ptr = read_u64(idx, ptr_at)?;
            let size = usize::try_from(size).map_err(|_| {
                bad(
                    idx,
                    size_at,
                    format!("sequence {i} has negative length {size}"),
                )
            })?;
            let end = ptr.checked_add((size * item) as u64);
            if end.is_none_or(|e| e > bin_len) || ptr % item as u64 != 0 {
                return Err(bad(
                    idx,
                    ptr_at,
                    format!(
                        "sequence {i} ({size} tokens at byte {ptr}) points past the end of the {bin_len}-byte .bin {} or off the {item}-byte grid",
                        tokens.path().display()
                    ),
                ));
            }
            seqs.push(((ptr / item as u64) as usize, size));
        }
        Ok(seqs)
    }

    /// Each document's token span, from the document index (which must start at 0, never run
    /// backwards, and end at the sequence count) over `seqs` (which must be contiguous within a
    /// document).
    fn documents(
        &self,
        idx: &MappedFile,
        seqs: &[(usize, usize)],
    ) -> Result<Vec<(usize, usize)>, DataError> {
        let (s, d) = (self.sequences, self.doc_entries);
        let mut documents = Vec::with_capacity(d.saturating_sub(1));
        let mut prev = 0usize;
        for k in 0..d {
            let at = self.docs_at + 8 * k;
            let v = read_u64(idx, at)?;
            let v = usize::try_from(v)
                .ok()
                .filter(|&v| v <= s && v >= prev && (k > 0 || v == 0));
            let v = v.ok_or_else(|| {
                bad(
                    idx,
                    at,
                    format!(
                        "document index entry {k} is not in {prev}..={s} (or the first is not 0)"
                    ),
                )
            })?;
            if k > 0 {
                documents.push(document_span(&seqs[prev..v]).ok_or_else(|| {
                    bad(
                        idx,
                        at,
                        format!(
                            "document {} has sequences that are not contiguous in the .bin",
                            k - 1
                        ),
                    )
                })?);
            }
            prev = v;
        }
        if d > 0 && prev != s {
            return Err(bad(
                idx,
                self.end - 8,
                format!(
                    "the document index ends at sequence {prev}, not at the sequence count {s}"
                ),
            ));
        }
        Ok(documents)
    }
}

/// The token span of a document's sequences, if they lie back to back.
fn document_span(seqs: &[(usize, usize)]) -> Option<(usize, usize)> {
    let Some(&(start, _)) = seqs.first() else {
        return Some((0, 0));
    };
    let mut end = start;
    for &(s, n) in seqs {
        if s != end {
            return None;
        }
        end += n;
    }
    Some((start, end - start))
}

/// Writes an indexed data set (`prefix.bin` and `prefix.idx`) of `documents`, each one
/// sequence, as `u16` or `i32` ids (the dtype codes 8 and 4): for tests, examples and
/// benchmarks.
pub fn write_indexed(
    prefix: impl AsRef<Path>,
    dtype: Dtype,
    documents: &[Vec<u32>],
) -> Result<(), DataError> {
    let prefix = prefix.as_ref();
    let code = code_of_dtype(dtype).filter(|_| matches!(dtype, Dtype::U16 | Dtype::I32));
    let code = code.ok_or_else(|| {
        DataError::malformed(
            prefix,
            0,
            format!("write_indexed writes u16 or i32, not {dtype}"),
        )
    })?;
    let mut bin = Vec::new();
    let mut idx = Vec::new();
    idx.extend_from_slice(IDX_MAGIC);
    idx.extend_from_slice(&1u64.to_le_bytes());
    idx.push(code);
    idx.extend_from_slice(&(documents.len() as u64).to_le_bytes());
    idx.extend_from_slice(&(documents.len() as u64 + 1).to_le_bytes());
    let mut ptrs = Vec::new();
    for doc in documents {
        idx.extend_from_slice(&(doc.len() as i32).to_le_bytes());
        ptrs.extend_from_slice(&(bin.len() as i64).to_le_bytes());
        for &t in doc {
            match dtype {
                Dtype::U16 => bin.extend_from_slice(&(t as u16).to_le_bytes()),
                _ => bin.extend_from_slice(&(t as i32).to_le_bytes()),
            }
        }
    }
    idx.extend_from_slice(&ptrs);
    for k in 0..=documents.len() as i64 {
        idx.extend_from_slice(&k.to_le_bytes());
    }
    let write = |ext: &str, bytes: &[u8]| {
        let mut p = prefix.as_os_str().to_owned();
        p.push(ext);
        let p = PathBuf::from(p);
        std::fs::write(&p, bytes).map_err(|source| DataError::Write { path: p, source })
    };
    write(".bin", &bin)?;
    write(".idx", &idx)
}
