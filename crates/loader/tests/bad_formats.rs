//! Bad token, indexed, Arrow and safetensors files are typed errors naming the file, the
//! column and the byte offset — never a panic or a read out of bounds; random truncations and
//! corruptions of the committed fixtures open as an error or as valid data.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::TempDir;
use proptest::prelude::*;
use trainmem_core::Dtype;
use trainmem_loader::{
    ArrowDataset, DataError, Dataset, FileProblem, IndexedTokens, Loader, LoaderConfig, PadCollate,
    PadTo, StackArrowColumns, TokenFile, TokenWindows, WindowSpec, open_safetensors,
};

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/data")
        .join(name)
}

fn problem(err: &DataError) -> &FileProblem {
    match err {
        DataError::File { problem, .. } => problem,
        other => panic!("expected a file error, got {other}"),
    }
}

/// Copies fixture `name` into `dir`, changed by `edit`.
fn altered(dir: &TempDir, name: &str, edit: impl FnOnce(&mut Vec<u8>)) -> PathBuf {
    let mut bytes = std::fs::read(data(name)).expect("fixture");
    edit(&mut bytes);
    let p = dir.join(name);
    std::fs::write(&p, bytes).expect("write");
    p
}

fn names(err: &DataError, what: &str) {
    let text = err.to_string();
    assert!(text.contains(what), "{text:?} does not name {what:?}");
}

#[test]
fn a_truncated_token_file_is_a_partial_record() {
    let dir = TempDir::new("tok-trunc");
    let p = altered(&dir, "tokens_u16.bin", |b| b.truncate(1001));
    let err = TokenFile::open(&p, Dtype::U16, None).expect_err("odd length");
    names(&err, "tokens_u16.bin");
    assert!(matches!(
        problem(&err),
        FileProblem::PartialRecord {
            data_bytes: 1001,
            record_bytes: 2
        }
    ));
}

#[test]
fn token_ids_above_the_vocabulary_name_their_offset() {
    // Token k = 7919 k mod 50257: token 1 (7919) is the first at or above 5000.
    let err = TokenFile::open(data("tokens_u16.bin"), Dtype::U16, Some(5000)).expect_err("vocab");
    names(&err, "tokens_u16.bin");
    names(&err, "byte 2");
    assert!(matches!(
        problem(&err),
        FileProblem::TokenOutOfVocab {
            token: 7919,
            position: 1,
            offset: 2,
            vocab: 5000
        }
    ));
    let err = IndexedTokens::open(data("indexed_u16"), Some(1000)).expect_err("vocab");
    names(&err, "indexed_u16.bin");
    assert!(matches!(
        problem(&err),
        FileProblem::TokenOutOfVocab { token: 1000, .. }
    ));
}

#[test]
fn an_idx_pointing_past_its_bin_names_the_pointer() {
    let dir = TempDir::new("idx-past");
    std::fs::copy(data("indexed_u16.bin"), dir.join("indexed_u16.bin")).expect("bin");
    // 12 sequences: pointers start at 34 + 4 * 12 = 82; the last one at 82 + 8 * 11 = 170.
    let idx = altered(&dir, "indexed_u16.idx", |b| {
        b[170..178].copy_from_slice(&10_000u64.to_le_bytes());
    });
    let err = IndexedTokens::open(&idx, None).expect_err("past the bin");
    names(&err, "indexed_u16.idx");
    names(&err, "at byte 170");
    names(&err, "past the end");
    // A .bin cut short makes the same (unchanged) .idx point past it.
    let dir2 = TempDir::new("bin-short");
    std::fs::copy(data("indexed_u16.idx"), dir2.join("indexed_u16.idx")).expect("idx");
    altered(&dir2, "indexed_u16.bin", |b| b.truncate(b.len() - 2));
    let err = IndexedTokens::open(dir2.join("indexed_u16"), None).expect_err("short bin");
    assert!(
        matches!(problem(&err), FileProblem::Malformed { offset: 170, .. }),
        "{err}"
    );
}

#[test]
fn a_truncated_or_foreign_idx_is_an_error_at_its_offset() {
    let dir = TempDir::new("idx-trunc");
    std::fs::copy(data("indexed_u16.bin"), dir.join("indexed_u16.bin")).expect("bin");
    let idx = altered(&dir, "indexed_u16.idx", |b| b.truncate(100));
    let err = IndexedTokens::open(&idx, None).expect_err("truncated");
    names(&err, "truncated");
    let idx = altered(&dir, "indexed_u16.idx", |b| b[0] = b'X');
    let err = IndexedTokens::open(&idx, None).expect_err("magic");
    assert!(matches!(
        problem(&err),
        FileProblem::Malformed { offset: 0, .. }
    ));
    let idx = altered(&dir, "indexed_u16.idx", |b| b[17] = 99);
    let err = IndexedTokens::open(&idx, None).expect_err("dtype code");
    assert!(matches!(
        problem(&err),
        FileProblem::Malformed { offset: 17, .. }
    ));
    // The document index running backwards (entry 3 at 178 + 24).
    let idx = altered(&dir, "indexed_u16.idx", |b| {
        b[202..210].copy_from_slice(&1u64.to_le_bytes())
    });
    let err = IndexedTokens::open(&idx, None).expect_err("doc index");
    assert!(
        matches!(problem(&err), FileProblem::Malformed { offset: 202, .. }),
        "{err}"
    );
}

#[test]
fn a_missing_arrow_column_lists_the_columns_there_are() {
    let err =
        ArrowDataset::open_columns(data("hf_stream.arrow"), &["labels"]).expect_err("no such");
    names(&err, "hf_stream.arrow");
    names(&err, "\"labels\"");
    match problem(&err) {
        FileProblem::MissingColumn { column, available } => {
            assert_eq!(column, "labels");
            assert!(available.contains(&"label".to_string()));
        }
        other => panic!("{other}"),
    }
    let ds = ArrowDataset::open(data("hf_stream.arrow")).expect("open");
    assert!(PadCollate::new(&ds, "token_ids", 0, PadTo::Longest).is_err());
}

#[test]
fn a_list_column_where_a_fixed_width_is_asked_is_an_error() {
    let ds = ArrowDataset::open(data("hf_file.arrow")).expect("open");
    let err = ds.fixed_column("input_ids").expect_err("list");
    names(&err, "input_ids");
    assert!(matches!(problem(&err), FileProblem::ColumnType { .. }));
    let err = StackArrowColumns::new(&ds).expect_err("has lists");
    names(&err, "fixed width");
    assert!(ds.fixed_column("pixels").is_ok());
}

#[test]
fn truncated_arrow_files_and_streams_are_errors() {
    let dir = TempDir::new("arrow-trunc");
    for name in ["hf_file.arrow", "hf_stream.arrow"] {
        let len = std::fs::metadata(data(name)).expect("meta").len() as usize;
        for cut in [0, 7, 100, len / 2, len - 9, len - 1] {
            let p = altered(&dir, name, |b| b.truncate(cut));
            match ArrowDataset::open(&p) {
                Err(e) => names(&e, name),
                // A stream cut exactly between messages is a shorter, valid stream.
                Ok(ds) => assert!(
                    name == "hf_stream.arrow" && ds.len() < 40,
                    "{name} cut at {cut}"
                ),
            }
        }
    }
    // A stream cut inside a message: the offset, and the arrow reader's error as the source.
    let p = altered(&dir, "hf_stream.arrow", |b| b.truncate(4000));
    let err = ArrowDataset::open(&p).expect_err("cut inside a message");
    names(&err, "arrow stream");
    assert!(
        matches!(problem(&err), FileProblem::ArrowRejected { .. }),
        "{err}"
    );
    let source = std::error::Error::source(problem(&err)).expect("a source");
    assert!(source.is::<arrow_schema::ArrowError>(), "{source:?}");
}

#[test]
fn a_truncated_safetensors_file_is_an_error() {
    let dir = TempDir::new("st-trunc");
    let p = altered(&dir, "tensors.safetensors", |b| b.truncate(b.len() - 4));
    let err = open_safetensors(&p, &[]).expect_err("truncated");
    names(&err, "tensors.safetensors");
    assert!(matches!(problem(&err), FileProblem::Safetensors(_)));
    let source = std::error::Error::source(problem(&err)).expect("a source");
    assert!(source.is::<safetensors::SafeTensorError>(), "{source:?}");
    let err = open_safetensors(data("tensors.safetensors"), &["pixels"]).expect_err("missing");
    assert!(matches!(problem(&err), FileProblem::MissingColumn { .. }));
}

/// Opens a (possibly corrupt) copy of fixture `name` with its reader and touches every byte
/// of every sample it offers; `Err` is fine, a panic fails the property.
fn open_and_read(name: &str, path: &Path) {
    match name {
        "tokens_u16.bin" => {
            if let Ok(t) = TokenFile::open(path, Dtype::U16, Some(50257))
                && let Ok(w) = TokenWindows::new(t, WindowSpec::tiled(31))
            {
                for i in 0..w.len() {
                    let s = w.sample(i).expect("in range");
                    assert_eq!(s.bytes.len(), 64);
                }
            }
        }
        "indexed_u16.idx" => {
            if let Ok(ix) = IndexedTokens::open(path, Some(50257)) {
                for d in 0..ix.documents().len() {
                    assert!(ix.document_bytes(d).is_some());
                }
                if let Ok(w) = ix.windows(WindowSpec::tiled(7), false) {
                    (0..w.len()).for_each(|i| assert!(w.sample(i).is_ok()));
                }
            }
        }
        "tensors.safetensors" => {
            if let Ok(ds) = open_safetensors(path, &[]) {
                for i in 0..ds.len() {
                    let s = ds.sample(i).expect("in range");
                    (0..s.num_fields()).for_each(|k| assert!(!s.field_bytes(k).is_empty()));
                }
            }
        }
        _ => {
            if let Ok(ds) = ArrowDataset::open(path) {
                let ds = Arc::new(ds);
                for i in 0..ds.len() {
                    for k in 0..ds.columns().len() {
                        let _ = ds.row_bytes(k, i);
                    }
                }
                if let Ok(pad) = PadCollate::new(&ds, "input_ids", 0, PadTo::Longest) {
                    let cfg = LoaderConfig {
                        batch_size: 8,
                        ..LoaderConfig::default()
                    };
                    let mut loader = Loader::new(Arc::clone(&ds), cfg, pad).expect("loader");
                    for b in loader.epoch().expect("epoch") {
                        let _ = b;
                    }
                }
            }
        }
    }
}

const FIXTURES: [&str; 5] = [
    "tokens_u16.bin",
    "indexed_u16.idx",
    "tensors.safetensors",
    "hf_stream.arrow",
    "hf_file.arrow",
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    /// A random truncation, or up to four random bytes overwritten, of a random fixture.
    #[test]
    fn corrupt_fixtures_are_errors_or_data_never_panics(
        which in 0..FIXTURES.len(),
        cut in proptest::option::of(any::<prop::sample::Index>()),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
    ) {
        let name = FIXTURES[which];
        let dir = TempDir::new("prop");
        if name == "indexed_u16.idx" {
            std::fs::copy(data("indexed_u16.bin"), dir.join("indexed_u16.bin")).expect("bin");
        }
        let path = altered(&dir, name, |b| {
            for (at, v) in &flips {
                let i = at.index(b.len());
                b[i] = *v;
            }
            if let Some(c) = cut {
                b.truncate(c.index(b.len()));
            }
        });
        open_and_read(name, &path);
    }
}
