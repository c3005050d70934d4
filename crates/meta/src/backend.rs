//! The `Meta` backend type and its `Backend` implementation.

use burn::tensor::DType;
use burn::tensor::backend::{Backend, BackendTypes, DTypeUsage, DTypeUsageSet};

use crate::device::MetaDevice;
use crate::tensor::{MetaQTensor, MetaTensor};

/// A burn backend whose tensors have shapes, dtypes and counted buffers, but no data.
///
/// Use it like any burn backend (`Tensor<Meta, 2>`, `Autodiff<Meta>`); read the memory figures
/// from the device ([`MetaDevice::stats`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Meta;

impl BackendTypes for Meta {
    type Device = MetaDevice;

    type FloatTensorPrimitive = MetaTensor;
    type FloatElem = f32;

    type IntTensorPrimitive = MetaTensor;
    type IntElem = i32;

    type BoolTensorPrimitive = MetaTensor;
    type BoolElem = bool;

    type QuantizedTensorPrimitive = MetaQTensor;
}

impl Backend for Meta {
    fn name(_device: &Self::Device) -> String {
        "meta".into()
    }

    /// Random values are never drawn, so the seed has no effect.
    fn seed(_device: &Self::Device, _seed: u64) {}

    fn dtype_usage(_device: &Self::Device, dtype: DType) -> DTypeUsageSet {
        match dtype {
            DType::QFloat(_) => DTypeUsage::Storage.into(),
            DType::Bool(burn::tensor::BoolStore::U32) => DTypeUsageSet::empty(),
            _ => DTypeUsage::Storage | DTypeUsage::Arithmetic,
        }
    }

    fn device_count(_type_id: u16) -> usize {
        1
    }

    /// Runs `func`, telling the device's memory model that its allocations are persistent (burn
    /// creates parameters this way; on CUDA cubecl then serves them from its persistent pool).
    fn memory_persistent_allocations<
        Output: Send,
        Input: Send,
        Func: Fn(Input) -> Output + Send,
    >(
        device: &Self::Device,
        input: Input,
        func: Func,
    ) -> Output {
        let ledger = device.ledger();
        ledger.persistent(true);
        let output = func(input);
        ledger.persistent(false);
        output
    }

    /// Runs the device's memory model's `empty_cache` (nothing for exact accounting).
    fn memory_cleanup(device: &Self::Device) {
        device.ledger().empty_cache();
    }
}
