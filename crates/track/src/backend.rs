//! The `Tracked<B>` backend type and its `Backend` implementation.

use std::marker::PhantomData;

use burn::tensor::backend::{Backend, BackendTypes, DTypeUsageSet, ExecutionError};
use burn::tensor::{DType, TensorData};

use crate::buffer::TrackableBackend;
use crate::tensor::TrackedTensor;

/// A burn backend that runs every op on `B` and counts every buffer `B` holds, per category.
///
/// Use it wherever `B` would go (`Autodiff<Tracked<Flex>>`, `Autodiff<Tracked<Cuda>>`, with
/// either checkpointing strategy); the device is `B`'s. Read the counts with
/// [`crate::snapshot`].
pub struct Tracked<B>(PhantomData<B>);

impl<B> Clone for Tracked<B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B> Copy for Tracked<B> {}

impl<B> Default for Tracked<B> {
    fn default() -> Self {
        Tracked(PhantomData)
    }
}

impl<B> std::fmt::Debug for Tracked<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tracked<{}>", std::any::type_name::<B>())
    }
}

impl<B: TrackableBackend> BackendTypes for Tracked<B> {
    type Device = B::Device;

    type FloatTensorPrimitive = TrackedTensor<B::FloatTensorPrimitive>;
    type FloatElem = B::FloatElem;

    type IntTensorPrimitive = TrackedTensor<B::IntTensorPrimitive>;
    type IntElem = B::IntElem;

    type BoolTensorPrimitive = TrackedTensor<B::BoolTensorPrimitive>;
    type BoolElem = B::BoolElem;

    type QuantizedTensorPrimitive = TrackedTensor<B::QuantizedTensorPrimitive>;
}

/// What the inner backend allocates on the host in these calls (syncing, seeding, cleaning
/// up, staging uploads) is the backend's, as in its ops ([`trainmem_probe::BackendScope`]);
/// the closure of `memory_persistent_allocations` is the caller's code and stays outside.
impl<B: TrackableBackend> Backend for Tracked<B> {
    fn ad_enabled(device: &Self::Device) -> bool {
        B::ad_enabled(device)
    }

    fn memory_persistent_allocations<
        Output: Send,
        Input: Send,
        Func: Fn(Input) -> Output + Send,
    >(
        device: &Self::Device,
        input: Input,
        func: Func,
    ) -> Output {
        B::memory_persistent_allocations(device, input, func)
    }

    fn memory_cleanup(device: &Self::Device) {
        let _backend = trainmem_probe::BackendScope::enter();
        B::memory_cleanup(device)
    }

    fn name(device: &Self::Device) -> String {
        format!("tracked {}", B::name(device))
    }

    fn seed(device: &Self::Device, seed: u64) {
        let _backend = trainmem_probe::BackendScope::enter();
        B::seed(device, seed)
    }

    fn sync(device: &Self::Device) -> Result<(), ExecutionError> {
        let _backend = trainmem_probe::BackendScope::enter();
        B::sync(device)
    }

    fn staging<'a, Iter>(data: Iter, device: &Self::Device)
    where
        Iter: Iterator<Item = &'a mut TensorData>,
    {
        let _backend = trainmem_probe::BackendScope::enter();
        B::staging(data, device)
    }

    fn supports_dtype(device: &Self::Device, dtype: DType) -> bool {
        B::supports_dtype(device, dtype)
    }

    fn dtype_usage(device: &Self::Device, dtype: DType) -> DTypeUsageSet {
        B::dtype_usage(device, dtype)
    }

    fn device_count(type_id: u16) -> usize {
        B::device_count(type_id)
    }
}
