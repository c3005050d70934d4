//! Bool tensor ops.

use std::future::Future;

use burn::tensor::backend::ExecutionError;
use burn::tensor::ops::{BoolTensor, BoolTensorOps, FloatTensor, IntTensor};
use burn::tensor::{
    BoolDType, FloatDType, IntDType, Scalar, Shape, Slice, TensorData, TensorMetadata,
};

use crate::backend::Meta;
use crate::device::MetaDevice;
use crate::ops::common::{self, layout_ops};
use crate::tensor::MetaTensor;

macro_rules! binary {
    ($($name:ident),* $(,)?) => {
        $(fn $name(lhs: BoolTensor<Meta>, rhs: BoolTensor<Meta>) -> BoolTensor<Meta> {
            common::binary(stringify!($name), lhs, rhs)
        })*
    };
}

macro_rules! filled {
    ($($name:ident),* $(,)?) => {
        $(fn $name(shape: Shape, device: &MetaDevice, dtype: BoolDType) -> BoolTensor<Meta> {
            MetaTensor::new(shape, dtype.into(), *device)
        })*
    };
}

impl BoolTensorOps<Self> for Meta {
    filled!(bool_empty, bool_zeros, bool_ones);

    fn bool_into_data(
        tensor: BoolTensor<Self>,
    ) -> impl Future<Output = Result<TensorData, ExecutionError>> + Send {
        let data = common::into_data(tensor);
        async move { data }
    }

    fn bool_from_data(data: TensorData, device: &MetaDevice) -> BoolTensor<Self> {
        common::from_data(data, device)
    }

    fn bool_into_int(tensor: BoolTensor<Self>, out_dtype: IntDType) -> IntTensor<Self> {
        tensor.fresh(tensor.shape(), out_dtype.into())
    }

    fn bool_into_float(tensor: BoolTensor<Self>, out_dtype: FloatDType) -> FloatTensor<Self> {
        tensor.fresh(tensor.shape(), out_dtype.into())
    }

    layout_ops!(
        reshape: bool_reshape, swap_dims: bool_swap_dims, permute: bool_permute,
        flip: bool_flip, expand: bool_expand, slice: bool_slice, unfold: bool_unfold,
        device: bool_device, to_device: bool_to_device, cat: bool_cat
    );

    fn bool_slice_assign(
        tensor: BoolTensor<Self>,
        slices: &[Slice],
        value: BoolTensor<Self>,
    ) -> BoolTensor<Self> {
        common::slice_assign("bool_slice_assign", tensor, slices, value)
    }

    fn bool_mask_where(
        tensor: BoolTensor<Self>,
        mask: BoolTensor<Self>,
        value: BoolTensor<Self>,
    ) -> BoolTensor<Self> {
        common::mask_where("bool_mask_where", tensor, mask, value)
    }

    fn bool_mask_fill(
        tensor: BoolTensor<Self>,
        mask: BoolTensor<Self>,
        _value: Scalar,
    ) -> BoolTensor<Self> {
        common::mask_fill("bool_mask_fill", tensor, mask)
    }

    fn bool_gather(
        dim: usize,
        tensor: BoolTensor<Self>,
        indices: IntTensor<Self>,
    ) -> BoolTensor<Self> {
        common::gather("bool_gather", dim, tensor, indices)
    }

    fn bool_scatter_or(
        _dim: usize,
        tensor: BoolTensor<Self>,
        _indices: IntTensor<Self>,
        value: BoolTensor<Self>,
    ) -> BoolTensor<Self> {
        common::update(tensor, value)
    }

    fn bool_select(
        tensor: BoolTensor<Self>,
        dim: usize,
        indices: IntTensor<Self>,
    ) -> BoolTensor<Self> {
        common::select("bool_select", tensor, dim, indices)
    }

    fn bool_select_or(
        tensor: BoolTensor<Self>,
        _dim: usize,
        _indices: IntTensor<Self>,
        value: BoolTensor<Self>,
    ) -> BoolTensor<Self> {
        common::update(tensor, value)
    }

    fn bool_equal(lhs: BoolTensor<Self>, rhs: BoolTensor<Self>) -> BoolTensor<Self> {
        let dtype = lhs.dtype();
        common::compare("bool_equal", lhs, rhs, dtype)
    }

    fn bool_equal_elem(lhs: BoolTensor<Self>, _rhs: Scalar) -> BoolTensor<Self> {
        let dtype = lhs.dtype();
        common::compare_scalar(lhs, dtype)
    }

    fn bool_not(tensor: BoolTensor<Self>) -> BoolTensor<Self> {
        let dtype = tensor.dtype();
        tensor.map(dtype)
    }

    binary!(bool_and, bool_or);
}
