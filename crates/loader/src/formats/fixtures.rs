//! Deterministic fixture data sets, written on demand so tests and scenarios never ship large
//! files: `features.npy` (f32 `[n, dim]`) and `labels.npy` (i64 or u8 `[n]`), every value a pure
//! function of `(seed, sample, column)`.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::dtype::Element;

use crate::error::DataError;
use crate::formats::array::{RawSidecar, sidecar_path};
use crate::formats::npy::write_header;
use crate::rng::mix;
use trainmem_core::Dtype;

/// What to generate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FixtureSpec {
    /// Number of samples.
    pub samples: usize,
    /// Features per sample.
    pub dim: usize,
    /// Number of label classes (labels are in `0..classes`).
    pub classes: u32,
    /// Seed of every value.
    pub seed: u64,
    /// Label element type: [`Dtype::I64`] or [`Dtype::U8`].
    pub label_dtype: Dtype,
}

impl Default for FixtureSpec {
    fn default() -> Self {
        FixtureSpec {
            samples: 1024,
            dim: 16,
            classes: 10,
            seed: 0,
            label_dtype: Dtype::I64,
        }
    }
}

impl FixtureSpec {
    /// Total bytes the two files will hold (data only, headers excluded).
    pub fn data_bytes(&self) -> u64 {
        self.samples as u64 * (self.dim as u64 * 4 + self.label_dtype.size())
    }
}

/// The files written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FixturePaths {
    /// `features.npy`.
    pub features: PathBuf,
    /// `labels.npy`.
    pub labels: PathBuf,
}

/// The feature value at `(sample, column)`: uniform in `[-1, 1)`.
pub fn feature_value(seed: u64, sample: usize, column: usize) -> f32 {
    let bits = mix(&[seed, sample as u64, column as u64]);
    ((bits >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

/// The label of `sample`, in `0..classes`.
pub fn label_value(seed: u64, sample: usize, classes: u32) -> u32 {
    (mix(&[seed ^ 0x1AB7, sample as u64]) % u64::from(classes.max(1))) as u32
}

/// Writes `features.npy` and `labels.npy` into `dir` (created if needed). `progress` is called
/// with `(bytes written, total bytes)` every few MiB.
pub fn write_fixture(
    dir: &Path,
    spec: &FixtureSpec,
    mut progress: impl FnMut(u64, u64),
) -> Result<FixturePaths, DataError> {
    let werr = |path: &Path| {
        let path = path.to_path_buf();
        move |source| DataError::Write { path, source }
    };
    std::fs::create_dir_all(dir).map_err(werr(dir))?;
    if spec.label_dtype != Dtype::I64 && spec.label_dtype != Dtype::U8 {
        return Err(DataError::Write {
            path: dir.join("labels.npy"),
            source: std::io::Error::other("labels must be i64 or u8"),
        });
    }
    let total = spec.data_bytes();
    let features = dir.join("features.npy");
    let mut out = BufWriter::with_capacity(
        1 << 20,
        std::fs::File::create(&features).map_err(werr(&features))?,
    );
    let header = write_header(Dtype::F32, &[spec.samples, spec.dim])
        .map_err(|e| header_err(&features, e))?;
    out.write_all(&header).map_err(werr(&features))?;
    let mut row = Vec::with_capacity(spec.dim * 4);
    let mut done = 0u64;
    let mut last = 0u64;
    for i in 0..spec.samples {
        row.clear();
        for j in 0..spec.dim {
            row.extend_from_slice(&feature_value(spec.seed, i, j).to_le_bytes());
        }
        out.write_all(&row).map_err(werr(&features))?;
        done += row.len() as u64;
        if done - last >= 8 << 20 {
            progress(done, total);
            last = done;
        }
    }
    out.flush().map_err(werr(&features))?;
    let labels = dir.join("labels.npy");
    let mut out = BufWriter::new(std::fs::File::create(&labels).map_err(werr(&labels))?);
    let header =
        write_header(spec.label_dtype, &[spec.samples]).map_err(|e| header_err(&labels, e))?;
    out.write_all(&header).map_err(werr(&labels))?;
    for i in 0..spec.samples {
        let l = label_value(spec.seed, i, spec.classes);
        let r = if spec.label_dtype == Dtype::U8 {
            out.write_all(&[l as u8])
        } else {
            out.write_all(&i64::from(l).to_le_bytes())
        };
        r.map_err(werr(&labels))?;
    }
    out.flush().map_err(werr(&labels))?;
    progress(total, total);
    Ok(FixturePaths { features, labels })
}

/// Writes a C-order `.npy` file holding `data` with `shape`. `data` must hold exactly as many
/// elements as `shape` describes (their product; 1 for `[]`): otherwise the error says so and
/// nothing is written (an existing file at `path` is left as it was).
pub fn write_npy<T: Element>(path: &Path, shape: &[usize], data: &[T]) -> Result<(), DataError> {
    let elements = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
    if elements != Some(data.len()) {
        let holds = elements.map_or_else(|| "too many".to_string(), |n| n.to_string());
        return Err(DataError::Write {
            path: path.to_path_buf(),
            source: std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "shape {shape:?} holds {holds} elements, the data {}",
                    data.len()
                ),
            ),
        });
    }
    let mut bytes = write_header(T::DTYPE, shape).map_err(|e| header_err(path, e))?;
    bytes.extend_from_slice(bytemuck::cast_slice(data));
    std::fs::write(path, bytes).map_err(|source| DataError::Write {
        path: path.to_path_buf(),
        source,
    })
}

/// Writes a raw record file and its sidecar.
pub fn write_raw(path: &Path, sidecar: &RawSidecar, bytes: &[u8]) -> Result<(), DataError> {
    let werr = |path: &Path| {
        let path = path.to_path_buf();
        move |source| DataError::Write { path, source }
    };
    std::fs::write(path, bytes).map_err(werr(path))?;
    let side = sidecar_path(path);
    let text = serde_json::to_string_pretty(sidecar).map_err(|e| DataError::Write {
        path: side.clone(),
        source: std::io::Error::other(e),
    })?;
    std::fs::write(&side, text).map_err(werr(&side))
}

/// A header that cannot be written (an element type numpy has no name for), as a write error.
fn header_err(path: &Path, e: crate::DTypeError) -> DataError {
    DataError::Write {
        path: path.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::array::MappedArray;

    #[test]
    fn write_npy_refuses_data_that_does_not_fill_the_shape() {
        let dir = std::env::temp_dir().join(format!("trainmem-fixtures-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let fresh = dir.join("fresh.npy");
        let _ = std::fs::remove_file(&fresh);
        let err = write_npy(&fresh, &[10, 4], &[1.0f32; 3]).expect_err("3 of 40");
        assert_eq!(
            err.to_string(),
            format!(
                "cannot write {}: shape [10, 4] holds 40 elements, the data 3",
                fresh.display()
            )
        );
        assert!(!fresh.exists(), "nothing written");
        // An existing file is left as it was, also for too much data and overflowing shapes.
        let kept = dir.join("kept.npy");
        write_npy(&kept, &[2, 2], &[1i64, 2, 3, 4]).expect("a whole array");
        let before = std::fs::read(&kept).expect("read");
        assert!(write_npy(&kept, &[2, 2], &[1i64; 5]).is_err());
        assert!(write_npy(&kept, &[2], &[1i64]).is_err());
        let err = write_npy(&kept, &[usize::MAX, 2], &[1i64; 2]).expect_err("overflow");
        assert!(err.to_string().contains("too many elements"), "{err}");
        assert_eq!(std::fs::read(&kept).expect("read"), before);
        let a = MappedArray::open(&kept).expect("still valid");
        assert_eq!(a.view::<i64>().expect("i64"), [1, 2, 3, 4]);
        // A scalar holds one element, an empty axis none.
        let scalar = dir.join("scalar.npy");
        write_npy(&scalar, &[], &[3.0f32]).expect("one element");
        assert!(write_npy(&scalar, &[], &[] as &[f32]).is_err());
        write_npy::<f32>(&dir.join("empty.npy"), &[0, 4], &[]).expect("no elements");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
