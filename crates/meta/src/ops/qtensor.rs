//! Quantized tensor ops. Values are modelled as one i8 per element (as the CPU backend stores
//! them); the per-tensor or per-block scales, kept outside the tensor buffer, are not counted.

use std::future::Future;

use burn::tensor::backend::ExecutionError;
use burn::tensor::ops::{FloatTensor, IntTensor, QTensorOps, QuantizedTensor};
use burn::tensor::quantization::{
    QuantLevel, QuantScheme, QuantStore, QuantizationParametersPrimitive,
};
use burn::tensor::{DType, FloatDType, Shape, Slice, TensorData, TensorMetadata};

use crate::backend::Meta;
use crate::device::MetaDevice;
use crate::ops::common;
use crate::tensor::{MetaQTensor, MetaTensor};

use burn::tensor::ops::IntTensorOps;

fn quantized(values: MetaTensor, scheme: QuantScheme) -> MetaQTensor {
    MetaQTensor {
        values,
        scheme: scheme.with_store(QuantStore::Native),
    }
}

impl QTensorOps<Self> for Meta {
    fn q_from_data(data: TensorData, device: &MetaDevice) -> QuantizedTensor<Self> {
        let DType::QFloat(scheme) = data.dtype else {
            panic!(
                "trainmem-meta: q_from_data: expected quantized data, got {:?}",
                data.dtype
            )
        };
        quantized(MetaTensor::new(data.shape, DType::I8, *device), scheme)
    }

    fn quantize(
        tensor: FloatTensor<Self>,
        scheme: &QuantScheme,
        _qparams: QuantizationParametersPrimitive<Self>,
    ) -> QuantizedTensor<Self> {
        quantized(tensor.fresh(tensor.shape(), DType::I8), *scheme)
    }

    fn dequantize(tensor: QuantizedTensor<Self>, dtype: FloatDType) -> FloatTensor<Self> {
        tensor.values.fresh(tensor.values.shape(), dtype.into())
    }

    fn q_device(tensor: &QuantizedTensor<Self>) -> MetaDevice {
        tensor.values.device()
    }

    fn q_to_device(tensor: QuantizedTensor<Self>, device: &MetaDevice) -> QuantizedTensor<Self> {
        tensor.map_values(|v| v.moved_to(*device))
    }

    fn q_reshape(tensor: QuantizedTensor<Self>, shape: Shape) -> QuantizedTensor<Self> {
        tensor.map_values(|v| Meta::int_reshape(v, shape))
    }

    /// Zeros with one scale of 1.0 per tensor; reading back block-quantized tensors panics.
    fn q_into_data(
        tensor: QuantizedTensor<Self>,
    ) -> impl Future<Output = Result<TensorData, ExecutionError>> + Send {
        let shape = tensor.values.shape();
        let scheme = tensor.scheme;
        if !matches!(scheme.level, QuantLevel::Tensor) {
            panic!("trainmem-meta: q_into_data: block-quantized read-back is not modelled");
        }
        drop(tensor);
        let values = vec![0i8; shape.num_elements()];
        let data = Ok(TensorData::quantized(values, shape, scheme, &[1.0]));
        async move { data }
    }

    fn q_expand(tensor: QuantizedTensor<Self>, shape: Shape) -> QuantizedTensor<Self> {
        tensor.map_values(|v| Meta::int_expand(v, shape))
    }

    fn q_swap_dims(
        tensor: QuantizedTensor<Self>,
        dim1: usize,
        dim2: usize,
    ) -> QuantizedTensor<Self> {
        tensor.map_values(|v| Meta::int_swap_dims(v, dim1, dim2))
    }

    fn q_permute(tensor: QuantizedTensor<Self>, axes: &[usize]) -> QuantizedTensor<Self> {
        tensor.map_values(|v| Meta::int_permute(v, axes))
    }

    fn q_flip(tensor: QuantizedTensor<Self>, axes: &[usize]) -> QuantizedTensor<Self> {
        tensor.map_values(|v| Meta::int_flip(v, axes))
    }

    fn q_select(
        tensor: QuantizedTensor<Self>,
        dim: usize,
        indices: IntTensor<Self>,
    ) -> QuantizedTensor<Self> {
        tensor.map_values(|v| common::select("q_select", v, dim, indices))
    }

    fn q_slice(tensor: QuantizedTensor<Self>, slices: &[Slice]) -> QuantizedTensor<Self> {
        tensor.map_values(|v| Meta::int_slice(v, slices))
    }
}
