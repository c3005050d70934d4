//! Every bad file is a clear error that names the file and the problem; good files in every
//! accepted form open with the right shape and zero-copy views.

mod common;

use std::sync::Arc;

use common::{TempDir, npy_with_dict};
use trainmem_core::Dtype;
use trainmem_loader::fixtures::{
    FixtureSpec, feature_value, label_value, write_fixture, write_npy, write_raw,
};
use trainmem_loader::npy::HeaderError;
use trainmem_loader::{
    DTypeError, DataError, Dataset, FileFormat, FileProblem, Loader, LoaderConfig, LoaderError,
    MappedArray, MmapDataset, RawSidecar, StackColumns,
};

fn problem(err: &DataError) -> &FileProblem {
    match err {
        DataError::File { problem, .. } => problem,
        other => panic!("expected a file error, got {other}"),
    }
}

fn open_err(dir: &TempDir, name: &str, bytes: &[u8]) -> DataError {
    let p = dir.join(name);
    std::fs::write(&p, bytes).expect("write");
    let err = MappedArray::open(&p).expect_err("must be rejected");
    let text = err.to_string();
    assert!(text.contains(name), "error does not name the file: {text}");
    err
}

fn f32_bytes(n: usize) -> Vec<u8> {
    (0..n).flat_map(|i| (i as f32).to_le_bytes()).collect()
}

#[test]
fn good_npy_files_of_every_version_open() {
    let dir = TempDir::new("good");
    let p = dir.join("a.npy");
    let data: Vec<f32> = (0..12).map(|i| i as f32).collect();
    write_npy(&p, &[4, 3], &data).expect("write");
    let a = MappedArray::open(&p).expect("open");
    assert_eq!(a.format(), FileFormat::Npy { major: 1, minor: 0 });
    assert_eq!(
        (a.dtype(), a.shape(), a.len()),
        (Dtype::F32, &[4usize, 3][..], 4)
    );
    assert_eq!(a.bytes_per_sample(), 12);
    assert_eq!(a.view::<f32>().expect("view"), &data[..]);
    assert_eq!(a.sample_view::<f32>(2).expect("row"), &[6.0, 7.0, 8.0]);
    assert!(a.view::<i32>().is_err(), "wrong type must not view");
    assert_eq!(a.data().as_ptr() as usize % 64, 0, "data aligned");

    for major in [2u8, 3] {
        let dict = "{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }";
        let bytes: Vec<u8> = [5i64, 6, 7].iter().flat_map(|x| x.to_le_bytes()).collect();
        let p = dir.join(&format!("v{major}.npy"));
        std::fs::write(&p, npy_with_dict(major, dict, &bytes)).expect("write");
        let a = MappedArray::open(&p).expect("open");
        assert_eq!(a.format(), FileFormat::Npy { major, minor: 0 });
        assert_eq!(a.view::<i64>().expect("view"), &[5, 6, 7]);
    }

    let empty = dir.join("empty.npy");
    write_npy::<f32>(&empty, &[0, 5], &[]).expect("write");
    let e = MappedArray::open(&empty).expect("zero samples is fine");
    assert!(e.is_empty());
    assert_eq!(e.bytes_per_sample(), 20);
}

#[test]
fn truncated_file() {
    let dir = TempDir::new("trunc");
    let dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (10, 4), }";
    let full = npy_with_dict(1, dict, &f32_bytes(40));
    let err = open_err(&dir, "trunc.npy", &full[..full.len() - 7]);
    assert!(
        matches!(
            problem(&err),
            FileProblem::Truncated {
                expected: 160,
                actual: 153,
                ..
            }
        ),
        "{err}"
    );
    // Cut inside the header.
    let err = open_err(&dir, "cut-header.npy", &full[..40]);
    assert!(
        matches!(
            problem(&err),
            FileProblem::Header(HeaderError::Truncated(_))
        ),
        "{err}"
    );
    let err = open_err(&dir, "tiny.npy", b"\x93NU");
    assert!(
        matches!(
            problem(&err),
            FileProblem::Header(HeaderError::Truncated(_))
        ),
        "{err}"
    );
}

#[test]
fn corrupt_files() {
    let dir = TempDir::new("corrupt");
    let err = open_err(
        &dir,
        "zip.npy",
        b"PK\x03\x04 this is a zip, not an npy file at all",
    );
    assert!(
        matches!(problem(&err), FileProblem::Header(HeaderError::BadMagic)),
        "{err}"
    );
    let garbled = npy_with_dict(
        1,
        "{'descr': '<f4', 'fortran_order': Nope, 'shape': (2,)}",
        &f32_bytes(2),
    );
    let err = open_err(&dir, "garbled.npy", &garbled);
    assert!(
        matches!(
            problem(&err),
            FileProblem::Header(HeaderError::Malformed(_))
        ),
        "{err}"
    );
    let trailing = npy_with_dict(
        1,
        "{'descr': '<f4', 'fortran_order': False, 'shape': (2,)}",
        &f32_bytes(3),
    );
    let err = open_err(&dir, "trailing.npy", &trailing);
    assert!(
        matches!(problem(&err), FileProblem::TrailingBytes { extra: 4, .. }),
        "{err}"
    );
    let mut bad_version = npy_with_dict(
        1,
        "{'descr': '<f4', 'fortran_order': False, 'shape': (2,)}",
        &f32_bytes(2),
    );
    bad_version[6] = 9;
    let err = open_err(&dir, "v9.npy", &bad_version);
    assert!(
        matches!(
            problem(&err),
            FileProblem::Header(HeaderError::Version(9, 0))
        ),
        "{err}"
    );
    let huge = npy_with_dict(
        1,
        "{'descr': '<f8', 'fortran_order': False, 'shape': (4611686018427387904, 4)}",
        &[],
    );
    let err = open_err(&dir, "huge.npy", &huge);
    assert!(matches!(problem(&err), FileProblem::Overflow(_)), "{err}");
}

#[test]
fn big_endian_object_and_fortran_files() {
    let dir = TempDir::new("dtype");
    let be = npy_with_dict(
        1,
        "{'descr': '>f4', 'fortran_order': False, 'shape': (2,)}",
        &f32_bytes(2),
    );
    let err = open_err(&dir, "be.npy", &be);
    assert!(
        matches!(
            problem(&err),
            FileProblem::Header(HeaderError::Dtype(DTypeError::BigEndian(_)))
        ),
        "{err}"
    );
    assert!(err.to_string().contains("big-endian"));
    let obj = npy_with_dict(
        1,
        "{'descr': '|O', 'fortran_order': False, 'shape': (2,)}",
        b"\x80\x04pickle",
    );
    let err = open_err(&dir, "obj.npy", &obj);
    assert!(
        matches!(
            problem(&err),
            FileProblem::Header(HeaderError::Dtype(DTypeError::Object(_)))
        ),
        "{err}"
    );
    assert!(err.to_string().contains("object"));
    let fortran = npy_with_dict(
        1,
        "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3)}",
        &f32_bytes(6),
    );
    let err = open_err(&dir, "fortran.npy", &fortran);
    assert!(
        matches!(
            problem(&err),
            FileProblem::Header(HeaderError::FortranOrder)
        ),
        "{err}"
    );
    assert!(err.to_string().contains("Fortran"));
    let strings = npy_with_dict(
        1,
        "{'descr': '<U4', 'fortran_order': False, 'shape': (2,)}",
        &[0; 32],
    );
    let err = open_err(&dir, "strings.npy", &strings);
    assert!(
        matches!(
            problem(&err),
            FileProblem::Header(HeaderError::Dtype(DTypeError::Unsupported(_)))
        ),
        "{err}"
    );
}

#[test]
fn misaligned_data_offset() {
    let dir = TempDir::new("align");
    // A hand-made v1 header without numpy's 64-byte padding: the f8 data starts at byte 76,
    // which is not a multiple of 8.
    let dict = b"{'descr': '<f8', 'fortran_order': False, 'shape': (1,)}         \n";
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(dict.len() as u16).to_le_bytes());
    bytes.extend_from_slice(dict);
    assert_ne!(bytes.len() % 8, 0);
    bytes.extend_from_slice(&1.5f64.to_le_bytes());
    let err = open_err(&dir, "misaligned.npy", &bytes);
    assert!(
        matches!(problem(&err), FileProblem::Misaligned { align: 8, .. }),
        "{err}"
    );
}

#[test]
fn raw_record_files() {
    let dir = TempDir::new("raw");
    let p = dir.join("records.bin");
    let side = RawSidecar {
        dtype: "<f4".into(),
        sample_shape: vec![2, 2],
        offset: 16,
    };
    let mut bytes = vec![0xEEu8; 16];
    bytes.extend(f32_bytes(12));
    write_raw(&p, &side, &bytes).expect("write");
    let a = MappedArray::open(&p).expect("raw opens");
    assert_eq!(
        (a.format(), a.len(), a.sample_shape()),
        (FileFormat::Raw, 3, &[2usize, 2][..])
    );
    assert_eq!(a.sample_view::<f32>(1).expect("row"), &[4.0, 5.0, 6.0, 7.0]);

    let partial = dir.join("partial.bin");
    write_raw(&partial, &side, &bytes[..bytes.len() - 3]).expect("write");
    let err = MappedArray::open(&partial).expect_err("partial record");
    assert!(
        matches!(problem(&err), FileProblem::PartialRecord { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("partial.bin"));

    let bare = dir.join("bare.bin");
    std::fs::write(&bare, &bytes).expect("write");
    let err = MappedArray::open(&bare).expect_err("no sidecar");
    assert!(
        matches!(problem(&err), FileProblem::Unrecognised { .. }),
        "{err}"
    );

    let bad_side = dir.join("badside.bin");
    std::fs::write(&bad_side, &bytes).expect("write");
    std::fs::write(dir.join("badside.bin.json"), "{\"dtype\": \"<f4\"").expect("write");
    let err = MappedArray::open(&bad_side).expect_err("bad sidecar");
    assert!(
        matches!(problem(&err), FileProblem::Sidecar { .. }),
        "{err}"
    );
    // The JSON parser's error is kept as the source, not only its text.
    let source = std::error::Error::source(problem(&err)).expect("a source");
    assert!(source.is::<serde_json::Error>(), "{source:?}");
}

#[test]
fn columns_must_agree_and_fixture_values_round_trip() {
    let dir = TempDir::new("fixture");
    let spec = FixtureSpec {
        samples: 50,
        dim: 7,
        classes: 5,
        seed: 11,
        label_dtype: Dtype::U8,
    };
    let paths = write_fixture(dir.path(), &spec, |_, _| {}).expect("fixture");
    let ds = MmapDataset::open(&[&paths.features, &paths.labels]).expect("open");
    assert_eq!((ds.len(), ds.bytes_per_sample()), (50, 7 * 4 + 1));
    let s = ds.sample(13).expect("sample");
    let feats = s.field::<f32>(0).expect("features");
    for (j, &v) in feats.iter().enumerate() {
        assert_eq!(v, feature_value(11, 13, j));
        assert!((-1.0..1.0).contains(&v));
    }
    assert_eq!(
        u32::from(s.field::<u8>(1).expect("label")[0]),
        label_value(11, 13, 5)
    );

    let other = dir.join("short.npy");
    write_npy(&other, &[49], &vec![0i64; 49]).expect("write");
    let err = MmapDataset::open(&[&paths.features, &other]).expect_err("mismatch");
    assert!(matches!(err, DataError::LengthMismatch(_)), "{err}");
    assert!(err.to_string().contains("short=49"));
}

#[test]
fn a_file_that_shrinks_is_caught_at_the_next_epoch_start() {
    let dir = TempDir::new("shrink");
    let spec = FixtureSpec {
        samples: 64,
        dim: 1024,
        ..FixtureSpec::default()
    };
    let paths = write_fixture(dir.path(), &spec, |_, _| {}).expect("fixture");
    let ds = Arc::new(MmapDataset::open(&[&paths.features]).expect("open"));
    let config = LoaderConfig {
        batch_size: 16,
        ..LoaderConfig::default()
    };
    let mut loader = Loader::new(Arc::clone(&ds), config, StackColumns).expect("loader");
    assert_eq!(loader.epoch().expect("epoch").count(), 4);
    // Shrink the file behind the loader's back; nothing may touch the lost pages.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&paths.features)
        .expect("open rw");
    f.set_len(4096).expect("truncate");
    let err = loader.epoch().expect_err("must refuse to read");
    assert!(
        matches!(
            &err,
            LoaderError::Data(DataError::File {
                problem: FileProblem::Shrunk { .. },
                ..
            })
        ),
        "{err}"
    );
    assert!(err.to_string().contains("features.npy"));
}
