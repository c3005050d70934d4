//! What `trainmem data check` says about one data-set file: its format, recognised from the
//! name and the first bytes, and the samples, dtype, columns and bytes per sample the loader
//! would serve from it.

use std::io::Read;
use std::path::Path;

use trainmem_loader::{
    ARROW_MAGIC, ArrowDataset, ColumnKind, DataError, IDX_MAGIC, IndexedTokens, MappedArray,
    MmapDataset, TokenFile, sidecar_path,
};

use trainmem_core::Dtype;

/// One column of a multi-column file.
#[derive(Debug)]
pub struct ColumnInfo {
    /// Its name.
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// Shape of one row (`None` for a variable-length list).
    pub row: Option<Vec<usize>>,
}

/// What a file holds.
#[derive(Debug)]
pub struct Description {
    /// The format, in words.
    pub format: String,
    /// Element type (of the only column, or of the ids).
    pub dtype: Option<Dtype>,
    /// Shape of a single array.
    pub shape: Option<Vec<usize>>,
    /// Samples: rows, or documents of an indexed data set, or tokens of a token file.
    pub samples: usize,
    /// Bytes per sample (`None` when rows vary in length).
    pub bytes_per_sample: Option<usize>,
    /// The columns, for Arrow and safetensors.
    pub columns: Vec<ColumnInfo>,
    /// Tokens, for token files and indexed data sets.
    pub tokens: Option<usize>,
}

/// How token files are read.
#[derive(Debug, Clone, Copy)]
pub struct TokenOptions {
    /// Element type of a headerless token file; without it a `.bin` is not read as tokens.
    pub dtype: Option<Dtype>,
    /// Ids must be below this.
    pub vocab: Option<u64>,
}

fn first_bytes(path: &Path) -> Vec<u8> {
    let mut head = Vec::new();
    if let Ok(f) = std::fs::File::open(path) {
        let _ = f.take(9).read_to_end(&mut head);
    }
    head
}

fn has_ext(path: &Path, ext: &str) -> bool {
    path.extension().is_some_and(|e| e == ext)
}

fn sibling(path: &Path, ext: &str) -> std::path::PathBuf {
    path.with_extension(ext)
}

/// Opens `path` as whatever it is and describes it.
pub fn describe(path: &Path, tokens: TokenOptions) -> Result<Description, DataError> {
    let head = first_bytes(path);
    if head.starts_with(IDX_MAGIC)
        || has_ext(path, "idx")
        || (has_ext(path, "bin") && sibling(path, "idx").exists())
    {
        return indexed(path, tokens.vocab);
    }
    if has_ext(path, "safetensors") {
        return columns_of_mmap(trainmem_loader::open_safetensors(path, &[])?, "safetensors");
    }
    if head.starts_with(ARROW_MAGIC)
        || head.starts_with(&[0xff; 4])
        || ["arrow", "feather", "ipc"].iter().any(|e| has_ext(path, e))
    {
        return arrow(path);
    }
    if let Some(dtype) = tokens.dtype.filter(|_| !sidecar_path(path).exists()) {
        let t = TokenFile::open(path, dtype, tokens.vocab)?;
        return Ok(Description {
            format: "token file".into(),
            dtype: Some(t.dtype()),
            shape: None,
            samples: t.len(),
            bytes_per_sample: Some(t.dtype().size() as usize),
            columns: Vec::new(),
            tokens: Some(t.len()),
        });
    }
    let a = MappedArray::open(path)?;
    Ok(Description {
        format: a.format().to_string(),
        dtype: Some(a.dtype()),
        shape: Some(a.shape().to_vec()),
        samples: a.len(),
        bytes_per_sample: Some(a.bytes_per_sample()),
        columns: Vec::new(),
        tokens: None,
    })
}

fn indexed(path: &Path, vocab: Option<u64>) -> Result<Description, DataError> {
    let ix = IndexedTokens::open(path, vocab)?;
    let tokens: usize = ix.documents().iter().map(|d| d.1).sum();
    Ok(Description {
        format: format!("indexed tokens ({} sequences)", ix.sequences()),
        dtype: Some(ix.tokens().dtype()),
        shape: None,
        samples: ix.documents().len(),
        bytes_per_sample: None,
        columns: Vec::new(),
        tokens: Some(tokens),
    })
}

fn columns_of_mmap(ds: MmapDataset, format: &str) -> Result<Description, DataError> {
    let columns = ds
        .columns()
        .iter()
        .map(|c| ColumnInfo {
            name: c.name.clone(),
            dtype: c.array.dtype(),
            row: Some(c.array.sample_shape().to_vec()),
        })
        .collect();
    Ok(Description {
        format: format.into(),
        dtype: None,
        shape: None,
        samples: trainmem_loader::Dataset::len(&ds),
        bytes_per_sample: Some(ds.bytes_per_sample()),
        columns,
        tokens: None,
    })
}

fn arrow(path: &Path) -> Result<Description, DataError> {
    let ds = ArrowDataset::open(path)?;
    let columns = ds
        .columns()
        .iter()
        .map(|c| ColumnInfo {
            name: c.name().to_string(),
            dtype: c.dtype(),
            row: match c.kind() {
                ColumnKind::Scalar => Some(Vec::new()),
                ColumnKind::Fixed(n) => Some(vec![n]),
                ColumnKind::List => None,
            },
        })
        .collect();
    Ok(Description {
        format: format!("{} ({} record batches)", ds.format(), ds.record_batches()),
        dtype: None,
        shape: None,
        samples: trainmem_loader::Dataset::len(&ds),
        bytes_per_sample: ds.bytes_per_sample(),
        columns,
        tokens: None,
    })
}

impl Description {
    /// The text line `trainmem data check` prints for a usable file.
    pub fn line(&self, path: &Path) -> String {
        let mut out = format!("{}: ok  {}", path.display(), self.format);
        if let Some(d) = self.dtype {
            out.push_str(&format!("  {d}"));
        }
        if let Some(s) = &self.shape {
            out.push_str(&format!("  shape {s:?}"));
        }
        if let Some(t) = self.tokens {
            out.push_str(&format!("  {t} tokens"));
        }
        let unit = if self.tokens.is_some() && self.bytes_per_sample.is_some() {
            "tokens"
        } else if self.tokens.is_some() {
            "documents"
        } else {
            "samples"
        };
        if unit != "tokens" {
            out.push_str(&format!("  {} {unit}", self.samples));
        }
        match self.bytes_per_sample {
            Some(b) if unit == "tokens" => out.push_str(&format!("  {b} bytes/token")),
            Some(b) => out.push_str(&format!("  {b} bytes/sample")),
            None if unit == "documents" => out.push_str("  variable bytes/document"),
            None => out.push_str("  variable bytes/sample"),
        }
        if !self.columns.is_empty() {
            let cols: Vec<String> = self
                .columns
                .iter()
                .map(|c| match &c.row {
                    Some(r) => format!("{} {} {r:?}", c.name, c.dtype),
                    None => format!("{} list<{}>", c.name, c.dtype),
                })
                .collect();
            out.push_str(&format!("  columns: {}", cols.join(", ")));
        }
        out
    }

    /// The JSON object `trainmem data check --json` prints for a usable file.
    pub fn json(&self, path: &Path) -> serde_json::Value {
        let mut v = serde_json::json!({
            "file": path.display().to_string(),
            "ok": true,
            "format": self.format,
            "samples": self.samples,
            "bytes_per_sample": self.bytes_per_sample,
        });
        if let Some(d) = self.dtype {
            v["dtype"] = d.name().into();
        }
        if let Some(s) = &self.shape {
            v["shape"] = serde_json::json!(s);
        }
        if let Some(t) = self.tokens {
            v["tokens"] = t.into();
        }
        if !self.columns.is_empty() {
            v["columns"] = self
                .columns
                .iter()
                .map(|c| {
                    serde_json::json!({
                        "name": c.name,
                        "dtype": c.dtype.name(),
                        "row_shape": c.row,
                    })
                })
                .collect();
        }
        v
    }
}
