//! safetensors files as data sets: each tensor is a column whose first dimension is the sample
//! axis, memory-mapped through [`MappedArray`] and read side by side as a [`MmapDataset`]
//! (so [`crate::StackColumns`], the burn adapter and `trainmem data check` serve them as they
//! serve `.npy` columns). The header is parsed and checked by the `safetensors` crate.

use std::path::Path;

use safetensors::{Dtype as StDtype, SafeTensors};

use crate::dataset::{Column, MmapDataset};
use crate::error::{DataError, FileProblem};
use crate::formats::array::{FileFormat, MappedArray};
use crate::formats::mapped::MappedFile;
use trainmem_core::Dtype;

/// The dtype of a safetensors element type trainmem can view.
pub fn dtype_of_safetensors(d: StDtype) -> Option<Dtype> {
    Some(match d {
        StDtype::BOOL => Dtype::Bool,
        StDtype::U8 => Dtype::U8,
        StDtype::I8 => Dtype::I8,
        StDtype::I16 => Dtype::I16,
        StDtype::U16 => Dtype::U16,
        StDtype::F16 => Dtype::F16,
        StDtype::BF16 => Dtype::Bf16,
        StDtype::I32 => Dtype::I32,
        StDtype::U32 => Dtype::U32,
        StDtype::F32 => Dtype::F32,
        StDtype::I64 => Dtype::I64,
        StDtype::U64 => Dtype::U64,
        StDtype::F64 => Dtype::F64,
        _ => return None,
    })
}

/// Opens the named tensors of a safetensors file as columns (every tensor, in file order,
/// when `columns` is empty). Each must have at least one dimension, and all the same first.
pub fn open_safetensors(
    path: impl AsRef<Path>,
    columns: &[&str],
) -> Result<MmapDataset, DataError> {
    let path = path.as_ref();
    let file = MappedFile::open(path)?;
    let (n, meta) = SafeTensors::read_metadata(file.bytes())
        .map_err(|e| DataError::file(path, FileProblem::Safetensors(e)))?;
    let data_start = 8 + n;
    let tensors = meta.tensors();
    let names: Vec<String> = if columns.is_empty() {
        meta.offset_keys()
    } else {
        columns.iter().map(|c| c.to_string()).collect()
    };
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        let info = tensors.get(&name).ok_or_else(|| {
            DataError::file(
                path,
                FileProblem::MissingColumn {
                    column: name.clone(),
                    available: meta.offset_keys(),
                },
            )
        })?;
        let wrong = |wanted: &str| {
            DataError::file(
                path,
                FileProblem::ColumnType {
                    column: name.clone(),
                    found: format!("{:?} of shape {:?}", info.dtype, info.shape),
                    wanted: wanted.to_string(),
                },
            )
        };
        let dtype = dtype_of_safetensors(info.dtype)
            .ok_or_else(|| wrong("trainmem reads whole-byte numbers"))?;
        if info.shape.is_empty() {
            return Err(wrong("a column needs a first (sample) dimension"));
        }
        let array = MappedArray::open_region(
            path,
            FileFormat::Safetensors,
            dtype,
            info.shape.clone(),
            data_start + info.data_offsets.0,
        )?;
        out.push(Column { name, array });
    }
    MmapDataset::new(out)
}
