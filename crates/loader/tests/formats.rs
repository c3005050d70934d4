//! The committed fixtures in `fixtures/data/` (written by `make_fixtures.py` with pyarrow,
//! numpy and safetensors) read back value for value through every format reader, the collates
//! and the loader; the formulas are the ones the script states.

use std::path::PathBuf;
use std::sync::Arc;

use trainmem_loader::{
    ArrowDataset, ArrowFormat, ColumnKind, Dataset, IndexedTokens, Loader, LoaderConfig, Order,
    PackCollate, PadCollate, PadTo, StackArrowColumns, StackColumns, StackWindows, TokenFile,
    TokenWindows, WindowOrder, WindowSpec, open_safetensors,
};

use trainmem_core::Dtype;

const VOCAB: u64 = 50257;

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/data")
        .join(name)
}

fn expected() -> serde_json::Value {
    let text = std::fs::read_to_string(data("expected.json")).expect("expected.json");
    serde_json::from_str(&text).expect("json")
}

fn token(k: usize) -> u16 {
    ((7919 * k as u64) % VOCAB) as u16
}

fn row_len(i: usize) -> usize {
    3 + (7 * i) % 13
}

fn input_id(i: usize, j: usize) -> i32 {
    ((31 * i + 17 * j) as u64 % VOCAB) as i32
}

fn doc_token(d: usize, j: usize) -> u16 {
    ((1000 * d + j) as u64 % VOCAB) as u16
}

fn config(batch_size: usize, workers: usize) -> LoaderConfig {
    LoaderConfig {
        batch_size,
        workers,
        ..LoaderConfig::default()
    }
}

#[test]
fn the_u16_token_file_reads_back_exactly() {
    let n = expected()["tokens_u16"]["tokens"].as_u64().expect("n") as usize;
    let t = TokenFile::open(data("tokens_u16.bin"), Dtype::U16, Some(VOCAB)).expect("open");
    assert_eq!(t.len(), n);
    let want: Vec<u16> = (0..n).map(token).collect();
    assert_eq!(t.view::<u16>().expect("u16"), &want[..]);
    assert!(t.view::<u32>().is_err(), "a u16 file is not viewed as u32");
}

#[test]
fn tiled_windows_cover_the_stream_in_order_through_the_loader() {
    let t = TokenFile::open(data("tokens_u16.bin"), Dtype::U16, Some(VOCAB)).expect("open");
    let seq = 64;
    let w = Arc::new(TokenWindows::new(t, WindowSpec::tiled(seq)).expect("windows"));
    assert_eq!(w.len(), (4096 - (seq + 1)) / seq + 1);
    assert_eq!(w.bytes_per_sample(), (seq + 1) * 2);
    let mut loader = Loader::new(Arc::clone(&w), config(7, 2), StackWindows).expect("loader");
    let mut seen = 0;
    for batch in loader.epoch().expect("epoch") {
        let batch = batch.expect("batch");
        for (r, &i) in batch.indices.iter().enumerate() {
            let (input, target) = batch.input_target::<u16>(r).expect("row");
            let want: Vec<u16> = (i * seq..i * seq + seq + 1).map(token).collect();
            assert_eq!(input, &want[..seq]);
            assert_eq!(target, &want[1..]);
            seen += 1;
        }
    }
    assert_eq!(seen, w.len());
}

#[test]
fn random_windows_are_seeded_and_in_bounds() {
    let open = || TokenFile::open(data("tokens_u16.bin"), Dtype::U16, None).expect("open");
    let spec = |seed| WindowSpec {
        seq: 100,
        order: WindowOrder::Random { count: 300, seed },
    };
    let a = TokenWindows::new(open(), spec(1)).expect("a");
    let b = TokenWindows::new(open(), spec(1)).expect("b");
    let c = TokenWindows::new(open(), spec(2)).expect("c");
    assert_eq!(a.len(), 300);
    let starts = |w: &TokenWindows| {
        (0..300)
            .map(|i| w.window_start(i).expect("start"))
            .collect::<Vec<_>>()
    };
    assert_eq!(starts(&a), starts(&b));
    assert_ne!(starts(&a), starts(&c));
    let mut distinct = starts(&a);
    distinct.sort_unstable();
    distinct.dedup();
    assert!(
        distinct.len() > 250,
        "offsets spread over the file: {}",
        distinct.len()
    );
    for i in 0..300 {
        let s = a.sample(i).expect("sample");
        assert!(s.start + 101 <= 4096);
        let want: Vec<u16> = (s.start..s.start + 101).map(token).collect();
        assert_eq!(s.tokens::<u16>().expect("u16"), &want[..]);
    }
}

#[test]
fn the_indexed_fixture_lists_its_documents() {
    let e = expected();
    let lens: Vec<usize> = e["indexed_u16"]["doc_lens"]
        .as_array()
        .expect("lens")
        .iter()
        .map(|v| v.as_u64().expect("len") as usize)
        .collect();
    let ix = IndexedTokens::open(data("indexed_u16"), Some(VOCAB)).expect("open");
    assert_eq!(ix.sequences(), lens.len());
    assert_eq!(ix.tokens().dtype(), Dtype::U16);
    for (d, &len) in lens.iter().enumerate() {
        let bytes = ix.document_bytes(d).expect("doc");
        let got: Vec<u16> = bytes
            .chunks(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        let want: Vec<u16> = (0..len).map(|j| doc_token(d, j)).collect();
        assert_eq!(got, want, "document {d}");
    }
    // Opening by either file name finds the pair.
    assert_eq!(
        IndexedTokens::open(data("indexed_u16.idx"), None)
            .expect("idx")
            .documents(),
        ix.documents()
    );
}

#[test]
fn indexed_windows_stay_inside_documents_unless_told_to_cross() {
    let seq = 15;
    let stride = 4;
    let spec = WindowSpec {
        seq,
        order: WindowOrder::Strided { stride },
    };
    let ix = IndexedTokens::open(data("indexed_u16"), None).expect("open");
    let docs = ix.documents().to_vec();
    let want_inside: usize = docs
        .iter()
        .filter(|d| d.1 > seq)
        .map(|d| (d.1 - seq - 1) / stride + 1)
        .sum();
    let inside = ix.windows(spec, false).expect("inside");
    assert_eq!(inside.len(), want_inside);
    for i in 0..inside.len() {
        let w = inside.sample(i).expect("window");
        let (d, (start, len)) = docs
            .iter()
            .enumerate()
            .find(|(_, (s, n))| (*s..s + n).contains(&w.start))
            .expect("in a document");
        assert!(
            w.start + seq < start + len,
            "window {i} crosses the end of document {d}"
        );
        let j = w.start - start;
        assert_eq!(w.get(0), Some(i128::from(doc_token(d, j))));
    }
    let total: usize = docs.iter().map(|d| d.1).sum();
    let ix = IndexedTokens::open(data("indexed_u16"), None).expect("open");
    let across = ix.windows(spec, true).expect("across");
    assert_eq!(across.len(), (total - seq - 1) / stride + 1);
    assert!(across.len() > inside.len());
}

fn check_arrow(name: &str, format: ArrowFormat) {
    let e = expected();
    let rows = e["arrow"]["rows"].as_u64().expect("rows") as usize;
    let ds = ArrowDataset::open(data(name)).expect("open");
    assert_eq!(ds.format(), format);
    assert_eq!(ds.len(), rows);
    assert_eq!(ds.record_batches(), rows.div_ceil(16));
    let kinds: Vec<(&str, ColumnKind, Dtype)> = ds
        .columns()
        .iter()
        .map(|c| (c.name(), c.kind(), c.dtype()))
        .collect();
    assert_eq!(
        kinds,
        [
            ("input_ids", ColumnKind::List, Dtype::I32),
            ("attention_mask", ColumnKind::List, Dtype::I8),
            ("pixels", ColumnKind::Fixed(4), Dtype::F32),
            ("label", ColumnKind::Scalar, Dtype::I64),
        ]
    );
    assert_eq!(ds.bytes_per_sample(), None, "list columns vary per sample");
    for k in 0..4 {
        assert!(ds.is_zero_copy(k), "column {k} is a view into the mapping");
    }
    for i in 0..rows {
        let r = ds.sample(i).expect("row");
        let want: Vec<i32> = (0..row_len(i)).map(|j| input_id(i, j)).collect();
        assert_eq!(r.get::<i32>(0).expect("ids"), &want[..], "row {i}");
        assert_eq!(r.get::<i8>(1).expect("mask"), &vec![1i8; row_len(i)][..]);
        let px: Vec<f32> = (0..4).map(|j| i as f32 + j as f32 / 4.0).collect();
        assert_eq!(r.get::<f32>(2).expect("pixels"), &px[..]);
        assert_eq!(r.get::<i64>(3).expect("label"), &[(i % 5) as i64]);
        assert!(r.get::<u8>(3).is_err(), "dtype is checked");
    }
    assert!(ds.sample(rows).is_err());
    // The rows of each record batch lie back to back: the column's value bytes are the rows
    // concatenated.
    let regions = ds.columns()[0].value_bytes();
    assert_eq!(regions.len(), ds.record_batches());
    let joined: Vec<u8> = regions.concat();
    let rows_joined: Vec<u8> = (0..rows)
        .flat_map(|i| ds.row_bytes(0, i).expect("row").to_vec())
        .collect();
    assert_eq!(joined, rows_joined);
}

#[test]
fn the_pyarrow_stream_reads_back_exactly() {
    check_arrow("hf_stream.arrow", ArrowFormat::Stream);
}

#[test]
fn the_pyarrow_file_reads_back_exactly() {
    check_arrow("hf_file.arrow", ArrowFormat::File);
}

#[test]
fn fixed_width_arrow_columns_stack_through_the_loader() {
    let ds =
        ArrowDataset::open_columns(data("hf_stream.arrow"), &["pixels", "label"]).expect("open");
    assert_eq!(ds.bytes_per_sample(), Some(4 * 4 + 8));
    let ds = Arc::new(ds);
    let builder = StackArrowColumns::new(&ds).expect("fixed");
    let mut cfg = config(6, 2);
    cfg.order = Order::Shuffled { seed: 3 };
    let mut loader = Loader::new(Arc::clone(&ds), cfg, builder).expect("loader");
    let mut seen = Vec::new();
    for batch in loader.epoch().expect("epoch") {
        let b = batch.expect("batch");
        assert_eq!(b.shapes[0], [b.len(), 4]);
        let px = b.column::<f32>(0).expect("f32");
        let labels = b.column::<i64>(1).expect("i64");
        for (r, &i) in b.indices.iter().enumerate() {
            assert_eq!(px[r * 4 + 3], i as f32 + 0.75);
            assert_eq!(labels[r], (i % 5) as i64);
        }
        seen.extend_from_slice(&b.indices);
    }
    seen.sort_unstable();
    assert_eq!(seen, (0..40).collect::<Vec<_>>());
}

#[test]
fn padding_to_the_longest_row_and_to_a_fixed_length() {
    let ds = Arc::new(ArrowDataset::open(data("hf_stream.arrow")).expect("open"));
    let cases = [
        (PadTo::Longest, 0, -1),
        (PadTo::Fixed(8), 2, -1),
        (PadTo::Longest, 2, 0),
    ];
    for (to, workers, pad_id) in cases {
        let pad = PadCollate::new(&ds, "input_ids", pad_id, to).expect("pad");
        let mut loader = Loader::new(Arc::clone(&ds), config(5, workers), pad).expect("loader");
        for batch in loader.epoch().expect("epoch") {
            let b = batch.expect("batch");
            let longest = b.indices.iter().map(|&i| row_len(i)).max().expect("rows");
            let width = match to {
                PadTo::Longest => longest,
                PadTo::Fixed(n) => n,
            };
            assert_eq!(b.width, width);
            let ids = b.ids::<i32>().expect("i32");
            for (r, &i) in b.indices.iter().enumerate() {
                let n = row_len(i).min(width);
                assert_eq!(b.lengths[r], n);
                for j in 0..width {
                    let (id, m) = (ids[r * width + j], b.mask()[r * width + j]);
                    if j < n {
                        assert_eq!((id, m), (input_id(i, j), 1));
                    } else {
                        assert_eq!((id, m), (pad_id as i32, 0));
                    }
                }
            }
        }
    }
    assert!(
        PadCollate::new(&ds, "attention_mask", 300, PadTo::Longest).is_err(),
        "300 is no i8"
    );
}

#[test]
fn packing_concatenates_rows_with_separators_and_returns_boundaries() {
    let ds = Arc::new(ArrowDataset::open(data("hf_file.arrow")).expect("open"));
    let length = 20;
    let pack = PackCollate::new(&ds, "input_ids", 0, length).expect("pack");
    let mut loader = Loader::new(Arc::clone(&ds), config(8, 1), pack).expect("loader");
    let mut samples = 0;
    for batch in loader.epoch().expect("epoch") {
        let b = batch.expect("batch");
        let ids = b.ids::<i32>().expect("i32");
        assert_eq!(b.segments.len(), b.indices.len());
        assert!(b.rows <= b.indices.len());
        let mut used = vec![0usize; b.rows];
        for s in &b.segments {
            let at = s.row * length + s.start;
            let want: Vec<i32> = (0..s.len).map(|j| input_id(s.sample, j)).collect();
            assert_eq!(&ids[at..at + s.len], &want[..]);
            assert_eq!(ids[at + s.len], 0, "separator after sample {}", s.sample);
            assert_eq!(s.len, row_len(s.sample).min(length - 1));
            assert!(s.start == used[s.row], "rows are packed back to back");
            used[s.row] = s.start + s.len + 1;
        }
        for (row, &u) in used.iter().enumerate() {
            let mask = &b.mask()[row * length..(row + 1) * length];
            assert!(mask[..u].iter().all(|&m| m == 1) && mask[u..].iter().all(|&m| m == 0));
        }
        samples += b.indices.len();
    }
    assert_eq!(samples, 40);
}

/// Every id of a padded batch and of a packed batch, padding and fill included, against a
/// layout built here element by element, with a padding id and a separator whose bytes differ
/// (so no fill can pass by being zero or one repeated byte), over two shuffled epochs (the
/// second one writes into reused pool blocks that still hold the first one's bytes).
#[test]
fn padding_and_packing_write_every_byte_of_the_batch() {
    let ds = Arc::new(ArrowDataset::open(data("hf_file.arrow")).expect("open"));
    let (pad_id, sep, length) = (0x0102_0304, 0x0A0B_0C0D, 20);
    for workers in [0, 2] {
        let mut cfg = config(7, workers);
        cfg.order = Order::Shuffled { seed: 5 };
        let pad = PadCollate::new(&ds, "input_ids", pad_id, PadTo::Fixed(12)).expect("pad");
        let mut loader = Loader::new(Arc::clone(&ds), cfg.clone(), pad).expect("loader");
        for _ in 0..2 {
            for batch in loader.epoch().expect("epoch") {
                let b = batch.expect("batch");
                let mut want = Vec::new();
                let mut mask = Vec::new();
                for &i in &b.indices {
                    let n = row_len(i).min(12);
                    want.extend(
                        (0..12).map(|j| if j < n { input_id(i, j) } else { pad_id as i32 }),
                    );
                    mask.extend((0..12).map(|j| u8::from(j < n)));
                }
                assert_eq!(b.ids::<i32>().expect("i32"), &want[..]);
                assert_eq!(b.mask(), &mask[..]);
            }
        }
        let pack = PackCollate::new(&ds, "input_ids", sep, length).expect("pack");
        let mut loader = Loader::new(Arc::clone(&ds), cfg, pack).expect("loader");
        for _ in 0..2 {
            for batch in loader.epoch().expect("epoch") {
                let b = batch.expect("batch");
                let mut want = vec![sep as i32; b.rows * length];
                let mut mask = vec![0u8; b.rows * length];
                for s in &b.segments {
                    let at = s.row * length + s.start;
                    for j in 0..s.len {
                        want[at + j] = input_id(s.sample, j);
                    }
                    mask[at..at + s.len + 1].fill(1);
                }
                assert_eq!(b.ids::<i32>().expect("i32"), &want[..]);
                assert_eq!(b.mask(), &mask[..]);
            }
        }
    }
}

#[test]
fn the_safetensors_file_reads_back_exactly() {
    let ds = Arc::new(open_safetensors(data("tensors.safetensors"), &[]).expect("open"));
    let names: Vec<&str> = ds.columns().iter().map(|c| c.name.as_str()).collect();
    let mut sorted = names.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, ["features", "labels", "mask"]);
    assert_eq!(ds.len(), 32);
    let k = |n: &str| names.iter().position(|&x| x == n).expect("column");
    let (f, l, m) = (k("features"), k("labels"), k("mask"));
    assert_eq!(ds.bytes_per_sample(), 8 * 4 + 8 + 8);
    let mut loader = Loader::new(Arc::clone(&ds), config(5, 2), StackColumns).expect("loader");
    for batch in loader.epoch().expect("epoch") {
        let b = batch.expect("batch");
        let feats = b.column::<f32>(f).expect("f32");
        let labels = b.column::<i64>(l).expect("i64");
        let mask = b.column::<u8>(m).expect("u8");
        for (r, &i) in b.indices.iter().enumerate() {
            for j in 0..8 {
                assert_eq!(feats[r * 8 + j], (8 * i + j) as f32 / 4.0);
                assert_eq!(mask[r * 8 + j], ((i + j) % 2) as u8);
            }
            assert_eq!(labels[r], (i % 3) as i64);
        }
    }
    let two = open_safetensors(data("tensors.safetensors"), &["labels", "mask"]).expect("two");
    assert_eq!(two.columns().len(), 2);
    assert_eq!(two.columns()[0].name, "labels");
}
