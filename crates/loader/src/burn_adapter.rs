//! burn's `Dataset` trait over trainmem data sets (feature `burn`), so burn users can feed
//! memory-mapped `.npy` / raw files, safetensors files (a [`MmapDataset`] too), token windows
//! ([`TokenWindows`]: one field, the window's `seq + 1` ids) and Arrow columns
//! ([`ArrowDataset`]: one field per selected column, a list column's row as long as it is) to
//! burn's own data loader.
//!
//! burn 0.21's trait returns owned items (`get(&self, index) -> Option<I>`), so each access
//! copies the sample's rows out of the mapping: [`OwnedSample`] holds one byte vector per
//! column; [`BurnDataset`] maps each zero-copy [`SampleView`] through a function of your choice
//! to any item type instead.

use std::sync::Arc;

use burn::data::dataset::Dataset as BurnTrait;

use crate::dataset::{Dataset, MmapDataset, SampleView};
use crate::dtype::Element;
use crate::formats::arrow_dataset::ArrowDataset;
use crate::formats::tokens::TokenWindows;
use trainmem_core::Dtype;

/// One sample copied out of a [`MmapDataset`]: the rows of every column.
#[derive(Debug, Clone, PartialEq)]
pub struct OwnedSample {
    /// The sample index.
    pub index: usize,
    /// Row bytes per column.
    pub fields: Vec<Vec<u8>>,
    /// Element type per column.
    pub dtypes: Vec<Dtype>,
}

impl OwnedSample {
    /// Column `k` decoded as `T` (a copy; `None` on a dtype mismatch).
    pub fn field<T: Element>(&self, k: usize) -> Option<Vec<T>> {
        if self.dtypes.get(k) != Some(&T::DTYPE) {
            return None;
        }
        let bytes = self.fields.get(k)?;
        Some(bytemuck::pod_collect_to_vec(bytes))
    }
}

fn owned(view: SampleView<'_>, dataset: &MmapDataset) -> OwnedSample {
    OwnedSample {
        index: view.index(),
        fields: (0..view.num_fields())
            .map(|k| view.field_bytes(k).to_vec())
            .collect(),
        dtypes: dataset.columns().iter().map(|c| c.array.dtype()).collect(),
    }
}

impl BurnTrait<OwnedSample> for MmapDataset {
    fn get(&self, index: usize) -> Option<OwnedSample> {
        Dataset::sample(self, index).ok().map(|v| owned(v, self))
    }

    fn len(&self) -> usize {
        Dataset::len(self)
    }
}

impl BurnTrait<OwnedSample> for TokenWindows {
    fn get(&self, index: usize) -> Option<OwnedSample> {
        let w = Dataset::sample(self, index).ok()?;
        Some(OwnedSample {
            index,
            fields: vec![w.bytes.to_vec()],
            dtypes: vec![w.dtype],
        })
    }

    fn len(&self) -> usize {
        Dataset::len(self)
    }
}

impl BurnTrait<OwnedSample> for ArrowDataset {
    fn get(&self, index: usize) -> Option<OwnedSample> {
        let row = Dataset::sample(self, index).ok()?;
        let fields = (0..self.columns().len())
            .map(|k| row.bytes(k).map(<[u8]>::to_vec))
            .collect::<Result<Vec<_>, _>>()
            .ok()?;
        Some(OwnedSample {
            index,
            fields,
            dtypes: self.columns().iter().map(|c| c.dtype()).collect(),
        })
    }

    fn len(&self) -> usize {
        Dataset::len(self)
    }
}

/// A [`MmapDataset`] whose samples are turned into burn items by `map`.
pub struct BurnDataset<F> {
    dataset: Arc<MmapDataset>,
    map: F,
}

impl<F> std::fmt::Debug for BurnDataset<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BurnDataset")
            .field("dataset", &self.dataset)
            .finish_non_exhaustive()
    }
}

impl<F> BurnDataset<F> {
    /// Wraps `dataset`, converting each sample with `map`.
    pub fn new(dataset: Arc<MmapDataset>, map: F) -> BurnDataset<F> {
        BurnDataset { dataset, map }
    }
}

impl<I, F> BurnTrait<I> for BurnDataset<F>
where
    F: Fn(SampleView<'_>) -> I + Send + Sync,
{
    fn get(&self, index: usize) -> Option<I> {
        self.dataset.sample(index).ok().map(&self.map)
    }

    fn len(&self) -> usize {
        Dataset::len(&*self.dataset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::fixtures::{FixtureSpec, feature_value, write_fixture};

    #[test]
    fn burn_sees_the_same_samples() {
        let dir =
            std::env::temp_dir().join(format!("trainmem-burn-adapter-{}", std::process::id()));
        let spec = FixtureSpec {
            samples: 9,
            dim: 3,
            seed: 2,
            ..FixtureSpec::default()
        };
        let paths = write_fixture(&dir, &spec, |_, _| {}).expect("fixture");
        let ds = Arc::new(MmapDataset::open(&[&paths.features, &paths.labels]).expect("open"));
        let s: OwnedSample = BurnTrait::get(&*ds, 4).expect("sample");
        assert_eq!(
            s.field::<f32>(0).expect("f32"),
            (0..3).map(|j| feature_value(2, 4, j)).collect::<Vec<_>>()
        );
        assert!(BurnTrait::<OwnedSample>::get(&*ds, 9).is_none());
        let mapped = BurnDataset::new(Arc::clone(&ds), |v: SampleView<'_>| {
            v.field::<f32>(0).map(|f| f[0]).unwrap_or(f32::NAN)
        });
        assert_eq!(BurnTrait::len(&mapped), 9);
        assert_eq!(BurnTrait::get(&mapped, 2), Some(feature_value(2, 2, 0)));
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn fixture(name: &str) -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../fixtures/data")
            .join(name)
    }

    #[test]
    fn burn_serves_token_windows_arrow_rows_and_safetensors() {
        let t =
            crate::TokenFile::open(fixture("tokens_u16.bin"), Dtype::U16, None).expect("tokens");
        let w = TokenWindows::new(t, crate::WindowSpec::tiled(8)).expect("windows");
        let s: OwnedSample = BurnTrait::get(&w, 3).expect("window");
        let want: Vec<u16> = (24..33).map(|k: u64| ((7919 * k) % 50257) as u16).collect();
        assert_eq!(s.field::<u16>(0).expect("u16"), want);
        assert_eq!(BurnTrait::<OwnedSample>::len(&w), Dataset::len(&w));

        let a = ArrowDataset::open(fixture("hf_stream.arrow")).expect("arrow");
        let r: OwnedSample = BurnTrait::get(&a, 20).expect("row");
        let ids: Vec<i32> = (0..3 + (7 * 20) % 13)
            .map(|j| (31 * 20 + 17 * j) % 50257)
            .collect();
        assert_eq!(r.field::<i32>(0).expect("ids"), ids);
        assert_eq!(r.field::<i64>(3).expect("label"), vec![0]);
        assert!(BurnTrait::<OwnedSample>::get(&a, 40).is_none());

        let st = crate::open_safetensors(fixture("tensors.safetensors"), &["labels"]).expect("st");
        let l: OwnedSample = BurnTrait::get(&st, 7).expect("row");
        assert_eq!(l.field::<i64>(0).expect("labels"), vec![1]);
    }
}
