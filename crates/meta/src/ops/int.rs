//! Int tensor ops.

use std::future::Future;

use burn::tensor::backend::ExecutionError;
use burn::tensor::ops::{BoolTensor, FloatTensor, IntTensor, IntTensorOps};
use burn::tensor::{
    BoolDType, DType, Distribution, FloatDType, IntDType, Scalar, Shape, Slice, TensorData,
    TensorMetadata,
};

use crate::backend::Meta;
use crate::device::MetaDevice;
use crate::ops::common::{self, layout_ops};
use crate::shape;
use crate::tensor::MetaTensor;

macro_rules! unary {
    ($($name:ident),* $(,)?) => {
        $(fn $name(tensor: IntTensor<Meta>) -> IntTensor<Meta> {
            let dtype = tensor.dtype();
            tensor.map(dtype)
        })*
    };
}

macro_rules! with_scalar {
    ($($name:ident),* $(,)?) => {
        $(fn $name(lhs: IntTensor<Meta>, _rhs: Scalar) -> IntTensor<Meta> {
            let dtype = lhs.dtype();
            lhs.map(dtype)
        })*
    };
}

macro_rules! binary {
    ($($name:ident),* $(,)?) => {
        $(fn $name(lhs: IntTensor<Meta>, rhs: IntTensor<Meta>) -> IntTensor<Meta> {
            common::binary(stringify!($name), lhs, rhs)
        })*
    };
}

macro_rules! compare {
    ($($name:ident),* $(,)?) => {
        $(fn $name(lhs: IntTensor<Meta>, rhs: IntTensor<Meta>, out_dtype: BoolDType) -> BoolTensor<Meta> {
            common::compare(stringify!($name), lhs, rhs, out_dtype.into())
        })*
    };
}

macro_rules! compare_scalar {
    ($($name:ident),* $(,)?) => {
        $(fn $name(lhs: IntTensor<Meta>, _rhs: Scalar, out_dtype: BoolDType) -> BoolTensor<Meta> {
            common::compare_scalar(lhs, out_dtype.into())
        })*
    };
}

macro_rules! reduce_dim {
    ($($name:ident),* $(,)?) => {
        $(fn $name(tensor: IntTensor<Meta>, dim: usize) -> IntTensor<Meta> {
            let dtype = tensor.dtype();
            common::reduce_dim(stringify!($name), tensor, dim, dtype)
        })*
    };
}

macro_rules! along_dim_same_shape {
    ($($name:ident),* $(,)?) => {
        $(fn $name(tensor: IntTensor<Meta>, _dim: usize) -> IntTensor<Meta> {
            common::same(tensor)
        })*
    };
}

impl IntTensorOps<Self> for Meta {
    // burn's defaults build filled tensors from host data of the full size; Meta allocates the
    // counted buffer only, so no host memory of the tensor's size is ever made.
    fn int_zeros(shape: Shape, device: &MetaDevice, dtype: IntDType) -> IntTensor<Self> {
        MetaTensor::new(shape, dtype.into(), *device)
    }

    fn int_ones(shape: Shape, device: &MetaDevice, dtype: IntDType) -> IntTensor<Self> {
        MetaTensor::new(shape, dtype.into(), *device)
    }

    fn int_full(
        shape: Shape,
        _fill_value: Scalar,
        device: &MetaDevice,
        dtype: IntDType,
    ) -> IntTensor<Self> {
        MetaTensor::new(shape, dtype.into(), *device)
    }

    fn int_empty(shape: Shape, device: &MetaDevice, dtype: IntDType) -> IntTensor<Self> {
        MetaTensor::new(shape, dtype.into(), *device)
    }

    fn int_into_data(
        tensor: IntTensor<Self>,
    ) -> impl Future<Output = Result<TensorData, ExecutionError>> + Send {
        let data = common::into_data(tensor);
        async move { data }
    }

    fn int_from_data(data: TensorData, device: &MetaDevice) -> IntTensor<Self> {
        common::from_data(data, device)
    }

    layout_ops!(
        reshape: int_reshape, swap_dims: int_swap_dims, permute: int_permute,
        flip: int_flip, expand: int_expand, slice: int_slice, unfold: int_unfold,
        device: int_device, to_device: int_to_device, cat: int_cat
    );

    fn int_slice_assign(
        tensor: IntTensor<Self>,
        slices: &[Slice],
        value: IntTensor<Self>,
    ) -> IntTensor<Self> {
        common::slice_assign("int_slice_assign", tensor, slices, value)
    }

    fn int_into_float(tensor: IntTensor<Self>, out_dtype: FloatDType) -> FloatTensor<Self> {
        tensor.fresh(tensor.shape(), out_dtype.into())
    }

    fn int_mask_where(
        tensor: IntTensor<Self>,
        mask: BoolTensor<Self>,
        value: IntTensor<Self>,
    ) -> IntTensor<Self> {
        common::mask_where("int_mask_where", tensor, mask, value)
    }

    fn int_mask_fill(
        tensor: IntTensor<Self>,
        mask: BoolTensor<Self>,
        _value: Scalar,
    ) -> IntTensor<Self> {
        common::mask_fill("int_mask_fill", tensor, mask)
    }

    fn int_gather(
        dim: usize,
        tensor: IntTensor<Self>,
        indices: IntTensor<Self>,
    ) -> IntTensor<Self> {
        common::gather("int_gather", dim, tensor, indices)
    }

    fn int_scatter_add(
        _dim: usize,
        tensor: IntTensor<Self>,
        _indices: IntTensor<Self>,
        value: IntTensor<Self>,
    ) -> IntTensor<Self> {
        common::update(tensor, value)
    }

    fn int_select(
        tensor: IntTensor<Self>,
        dim: usize,
        indices: IntTensor<Self>,
    ) -> IntTensor<Self> {
        common::select("int_select", tensor, dim, indices)
    }

    fn int_select_add(
        tensor: IntTensor<Self>,
        _dim: usize,
        _indices: IntTensor<Self>,
        value: IntTensor<Self>,
    ) -> IntTensor<Self> {
        common::update(tensor, value)
    }

    compare!(
        int_equal,
        int_greater,
        int_greater_equal,
        int_lower,
        int_lower_equal
    );
    compare_scalar!(
        int_equal_elem,
        int_greater_elem,
        int_greater_equal_elem,
        int_lower_elem,
        int_lower_equal_elem
    );
    binary!(
        int_add,
        int_sub,
        int_mul,
        int_div,
        int_remainder,
        bitwise_and,
        bitwise_or,
        bitwise_xor,
        bitwise_left_shift,
        bitwise_right_shift
    );
    with_scalar!(
        int_add_scalar,
        int_sub_scalar,
        int_mul_scalar,
        int_div_scalar,
        int_remainder_scalar,
        bitwise_and_scalar,
        bitwise_or_scalar,
        bitwise_xor_scalar,
        bitwise_left_shift_scalar,
        bitwise_right_shift_scalar
    );
    unary!(int_abs, bitwise_not);

    fn int_matmul(lhs: IntTensor<Self>, rhs: IntTensor<Self>) -> IntTensor<Self> {
        let out = shape::matmul("int_matmul", &lhs.shape(), &rhs.shape());
        lhs.fresh(out, lhs.dtype())
    }

    fn int_sum(tensor: IntTensor<Self>) -> IntTensor<Self> {
        common::reduce_all(tensor)
    }

    fn int_prod(tensor: IntTensor<Self>) -> IntTensor<Self> {
        common::reduce_all(tensor)
    }

    reduce_dim!(int_sum_dim, int_prod_dim, int_mean_dim);

    /// Indices are i64, as on the CPU backend.
    fn int_argmax(tensor: IntTensor<Self>, dim: usize) -> IntTensor<Self> {
        common::reduce_dim("int_argmax", tensor, dim, DType::I64)
    }

    /// Indices are i64, as on the CPU backend.
    fn int_argmin(tensor: IntTensor<Self>, dim: usize) -> IntTensor<Self> {
        common::reduce_dim("int_argmin", tensor, dim, DType::I64)
    }
    along_dim_same_shape!(int_cumsum, int_cumprod, int_cummin, int_cummax);

    fn int_argtopk(tensor: IntTensor<Self>, dim: usize, k: usize) -> IntTensor<Self> {
        let out = shape::with_dim("int_argtopk", &tensor.shape(), dim, k);
        tensor.fresh(out, tensor.dtype())
    }

    fn int_random(
        shape: Shape,
        _distribution: Distribution,
        device: &MetaDevice,
        dtype: IntDType,
    ) -> IntTensor<Self> {
        MetaTensor::new(shape, dtype.into(), *device)
    }

    fn int_cast(tensor: IntTensor<Self>, dtype: IntDType) -> IntTensor<Self> {
        let dtype: DType = dtype.into();
        if dtype == tensor.dtype() {
            tensor
        } else {
            tensor.fresh(tensor.shape(), dtype)
        }
    }
}
