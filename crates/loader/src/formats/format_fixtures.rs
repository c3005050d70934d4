//! Deterministic token files and Arrow files written on demand, for benchmarks, examples and
//! tests that need more data than the committed fixtures: every value is a pure function of
//! `(seed, position)`.

use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::Arc;

use arrow_array::{Int32Array, Int64Array, ListArray, RecordBatch};
use arrow_buffer::{OffsetBuffer, ScalarBuffer};
use arrow_ipc::writer::{FileWriter, StreamWriter};
use arrow_schema::{DataType, Field, Schema};

use crate::error::DataError;
use crate::rng::mix;

/// Token `k` of [`write_tokens`]'s file.
pub fn token_value(seed: u64, k: usize, vocab: u32) -> u16 {
    (mix(&[seed, k as u64]) % u64::from(vocab.clamp(1, 65536))) as u16
}

fn write_err(path: &Path) -> impl Fn(std::io::Error) -> DataError + '_ {
    move |source| DataError::Write {
        path: path.to_path_buf(),
        source,
    }
}

/// Writes `tokens` `u16` ids below `vocab` (at most 65,536) to `path`, no header.
pub fn write_tokens(path: &Path, tokens: usize, vocab: u32, seed: u64) -> Result<(), DataError> {
    let file = std::fs::File::create(path).map_err(write_err(path))?;
    let mut w = BufWriter::with_capacity(1 << 20, file);
    for k in 0..tokens {
        w.write_all(&token_value(seed, k, vocab).to_le_bytes())
            .map_err(write_err(path))?;
    }
    w.flush().map_err(write_err(path))
}

/// The length of row `i` of [`write_arrow_lists`]' file: in `min_len..=max_len`.
pub fn list_len(seed: u64, i: usize, min_len: usize, max_len: usize) -> usize {
    let span = max_len.saturating_sub(min_len) as u64 + 1;
    min_len + (mix(&[seed, i as u64, 1]) % span) as usize
}

/// Element `j` of row `i` of [`write_arrow_lists`]' `input_ids`.
pub fn list_value(i: usize, j: usize) -> i32 {
    ((i * 31 + j * 17) % 50257) as i32
}

/// Writes an Arrow IPC stream (or, with `file`, an IPC file) of `rows` rows with an
/// `input_ids` `list<int32>` column (row `i`: [`list_len`] ids, [`list_value`]) and a `label`
/// int64 column (`i mod 10`), in record batches of `batch_rows`: the layout of a tokenized
/// Hugging Face `datasets` cache.
pub fn write_arrow_lists(
    path: &Path,
    rows: usize,
    (min_len, max_len): (usize, usize),
    batch_rows: usize,
    seed: u64,
    file: bool,
) -> Result<(), DataError> {
    let arrow = |e: arrow_schema::ArrowError| DataError::Write {
        path: path.to_path_buf(),
        source: std::io::Error::other(e),
    };
    let item = Arc::new(Field::new("item", DataType::Int32, true));
    let schema = Arc::new(Schema::new(vec![
        Field::new("input_ids", DataType::List(item.clone()), true),
        Field::new("label", DataType::Int64, true),
    ]));
    let out = BufWriter::new(std::fs::File::create(path).map_err(write_err(path))?);
    enum W<O: Write> {
        S(StreamWriter<O>),
        F(FileWriter<O>),
    }
    let mut w = if file {
        W::F(FileWriter::try_new(out, &schema).map_err(arrow)?)
    } else {
        W::S(StreamWriter::try_new(out, &schema).map_err(arrow)?)
    };
    let mut start = 0;
    while start < rows {
        let end = (start + batch_rows.max(1)).min(rows);
        let mut offsets = vec![0i32];
        let mut values = Vec::new();
        for i in start..end {
            let n = list_len(seed, i, min_len, max_len);
            values.extend((0..n).map(|j| list_value(i, j)));
            offsets.push(i32::try_from(values.len()).map_err(|_| {
                arrow(arrow_schema::ArrowError::InvalidArgumentError(
                    "a record batch over 2^31 values".into(),
                ))
            })?);
        }
        let ids = ListArray::new(
            item.clone(),
            OffsetBuffer::new(ScalarBuffer::from(offsets)),
            Arc::new(Int32Array::from(values)),
            None,
        );
        let labels = Int64Array::from_iter_values((start..end).map(|i| (i % 10) as i64));
        let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(ids), Arc::new(labels)])
            .map_err(arrow)?;
        match &mut w {
            W::S(s) => s.write(&batch).map_err(arrow)?,
            W::F(f) => f.write(&batch).map_err(arrow)?,
        }
        start = end;
    }
    match &mut w {
        W::S(s) => s.finish().map_err(arrow),
        W::F(f) => f.finish().map_err(arrow),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ArrowDataset, Dataset, TokenFile};
    use trainmem_core::Dtype;

    #[test]
    fn written_files_read_back() {
        let dir =
            std::env::temp_dir().join(format!("trainmem-format-fixtures-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let t = dir.join("t.bin");
        write_tokens(&t, 1000, 300, 4).expect("tokens");
        let f = TokenFile::open(&t, Dtype::U16, Some(300)).expect("open");
        let want: Vec<u16> = (0..1000).map(|k| token_value(4, k, 300)).collect();
        assert_eq!(f.view::<u16>().expect("u16"), &want[..]);
        for file in [false, true] {
            let a = dir.join(format!("a-{file}.arrow"));
            write_arrow_lists(&a, 50, (2, 9), 16, 3, file).expect("arrow");
            let ds = ArrowDataset::open(&a).expect("open");
            assert_eq!((ds.len(), ds.record_batches()), (50, 4));
            for i in 0..50 {
                let r = ds.sample(i).expect("row");
                let ids = r.get::<i32>(0).expect("ids");
                assert_eq!(ids.len(), list_len(3, i, 2, 9));
                assert!(ids.iter().enumerate().all(|(j, &v)| v == list_value(i, j)));
                assert_eq!(r.get::<i64>(1).expect("label"), &[(i % 10) as i64]);
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
