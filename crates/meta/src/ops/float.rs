//! Float tensor ops.

use std::future::Future;

use burn::tensor::backend::ExecutionError;
use burn::tensor::ops::{BoolTensor, FloatTensor, FloatTensorOps, IntTensor};
use burn::tensor::{
    BoolDType, DType, Distribution, FloatDType, IntDType, Scalar, Shape, Slice, TensorData,
    TensorMetadata,
};

use crate::backend::Meta;
use crate::device::MetaDevice;
use crate::ops::common::{self, layout_ops};
use crate::shape;
use crate::tensor::MetaTensor;

/// Element-wise ops of one tensor: in place when the input is uniquely owned.
macro_rules! unary {
    ($($name:ident),* $(,)?) => {
        $(fn $name(tensor: FloatTensor<Meta>) -> FloatTensor<Meta> {
            let dtype = tensor.dtype();
            tensor.map(dtype)
        })*
    };
}

/// Element-wise ops of a tensor and a scalar: in place when the input is uniquely owned.
macro_rules! with_scalar {
    ($($name:ident),* $(,)?) => {
        $(fn $name(lhs: FloatTensor<Meta>, _rhs: Scalar) -> FloatTensor<Meta> {
            let dtype = lhs.dtype();
            lhs.map(dtype)
        })*
    };
}

/// Element-wise ops of two tensors (broadcast), written into the left operand when it can be.
macro_rules! binary {
    ($($name:ident),* $(,)?) => {
        $(fn $name(lhs: FloatTensor<Meta>, rhs: FloatTensor<Meta>) -> FloatTensor<Meta> {
            common::binary(stringify!($name), lhs, rhs)
        })*
    };
}

/// Comparisons of two tensors.
macro_rules! compare {
    ($($name:ident),* $(,)?) => {
        $(fn $name(
            lhs: FloatTensor<Meta>,
            rhs: FloatTensor<Meta>,
            out_dtype: BoolDType,
        ) -> BoolTensor<Meta> {
            common::compare(stringify!($name), lhs, rhs, out_dtype.into())
        })*
    };
}

/// Comparisons with a scalar.
macro_rules! compare_scalar {
    ($($name:ident),* $(,)?) => {
        $(fn $name(lhs: FloatTensor<Meta>, _rhs: Scalar, out_dtype: BoolDType) -> BoolTensor<Meta> {
            common::compare_scalar(lhs, out_dtype.into())
        })*
    };
}

/// Ops along a dimension whose output has the input's shape (cumulative ops), fresh buffer.
macro_rules! along_dim_same_shape {
    ($($name:ident),* $(,)?) => {
        $(fn $name(tensor: FloatTensor<Meta>, _dim: usize) -> FloatTensor<Meta> {
            common::same(tensor)
        })*
    };
}

/// Arg-reductions along a dimension: an int tensor with that dimension reduced to 1.
macro_rules! arg_reduce {
    ($($name:ident),* $(,)?) => {
        $(fn $name(tensor: FloatTensor<Meta>, dim: usize, out_dtype: IntDType) -> IntTensor<Meta> {
            common::reduce_dim(stringify!($name), tensor, dim, out_dtype.into())
        })*
    };
}

impl FloatTensorOps<Self> for Meta {
    fn float_from_data(data: TensorData, device: &MetaDevice) -> FloatTensor<Self> {
        common::from_data(data, device)
    }

    fn float_random(
        shape: Shape,
        _distribution: Distribution,
        device: &MetaDevice,
        dtype: FloatDType,
    ) -> FloatTensor<Self> {
        MetaTensor::new(shape, dtype.into(), *device)
    }

    fn float_into_data(
        tensor: FloatTensor<Self>,
    ) -> impl Future<Output = Result<TensorData, ExecutionError>> + Send {
        let data = common::into_data(tensor);
        async move { data }
    }

    fn float_into_int(tensor: FloatTensor<Self>, out_dtype: IntDType) -> IntTensor<Self> {
        tensor.fresh(tensor.shape(), out_dtype.into())
    }

    // burn's defaults build filled tensors from host data of the full size; Meta allocates the
    // counted buffer only, so no host memory of the tensor's size is ever made.
    fn float_zeros(shape: Shape, device: &MetaDevice, dtype: FloatDType) -> FloatTensor<Self> {
        MetaTensor::new(shape, dtype.into(), *device)
    }

    fn float_ones(shape: Shape, device: &MetaDevice, dtype: FloatDType) -> FloatTensor<Self> {
        MetaTensor::new(shape, dtype.into(), *device)
    }

    fn float_full(
        shape: Shape,
        _fill_value: Scalar,
        device: &MetaDevice,
        dtype: FloatDType,
    ) -> FloatTensor<Self> {
        MetaTensor::new(shape, dtype.into(), *device)
    }

    fn float_empty(shape: Shape, device: &MetaDevice, dtype: FloatDType) -> FloatTensor<Self> {
        MetaTensor::new(shape, dtype.into(), *device)
    }

    fn float_matmul(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
        let out = shape::matmul("float_matmul", &lhs.shape(), &rhs.shape());
        lhs.fresh(out, lhs.dtype())
    }

    fn float_cross(
        lhs: FloatTensor<Self>,
        rhs: FloatTensor<Self>,
        dim: usize,
    ) -> FloatTensor<Self> {
        let out = shape::broadcast("float_cross", &lhs.shape(), &rhs.shape());
        if out.num_dims() <= dim || out[dim] != 3 {
            panic!("trainmem-meta: float_cross: dimension {dim} of {out:?} must have size 3");
        }
        lhs.fresh(out, lhs.dtype())
    }

    layout_ops!(
        reshape: float_reshape, swap_dims: float_swap_dims, permute: float_permute,
        flip: float_flip, expand: float_expand, slice: float_slice, unfold: float_unfold,
        device: float_device, to_device: float_to_device, cat: float_cat
    );

    fn float_gather(
        dim: usize,
        tensor: FloatTensor<Self>,
        indices: IntTensor<Self>,
    ) -> FloatTensor<Self> {
        common::gather("float_gather", dim, tensor, indices)
    }

    fn float_scatter_add(
        _dim: usize,
        tensor: FloatTensor<Self>,
        _indices: IntTensor<Self>,
        value: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        common::update(tensor, value)
    }

    fn float_select(
        tensor: FloatTensor<Self>,
        dim: usize,
        indices: IntTensor<Self>,
    ) -> FloatTensor<Self> {
        common::select("float_select", tensor, dim, indices)
    }

    fn float_select_add(
        tensor: FloatTensor<Self>,
        _dim: usize,
        _indices: IntTensor<Self>,
        value: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        common::update(tensor, value)
    }

    fn float_slice_assign(
        tensor: FloatTensor<Self>,
        slices: &[Slice],
        value: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        common::slice_assign("float_slice_assign", tensor, slices, value)
    }

    fn float_mask_where(
        tensor: FloatTensor<Self>,
        mask: BoolTensor<Self>,
        value: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        common::mask_where("float_mask_where", tensor, mask, value)
    }

    fn float_mask_fill(
        tensor: FloatTensor<Self>,
        mask: BoolTensor<Self>,
        _value: Scalar,
    ) -> FloatTensor<Self> {
        common::mask_fill("float_mask_fill", tensor, mask)
    }

    compare!(
        float_equal,
        float_greater,
        float_greater_equal,
        float_lower,
        float_lower_equal
    );
    compare_scalar!(
        float_equal_elem,
        float_greater_elem,
        float_greater_equal_elem,
        float_lower_elem,
        float_lower_equal_elem
    );

    fn float_sum(tensor: FloatTensor<Self>) -> FloatTensor<Self> {
        common::reduce_all(tensor)
    }

    fn float_sum_dim(tensor: FloatTensor<Self>, dim: usize) -> FloatTensor<Self> {
        let dtype = tensor.dtype();
        common::reduce_dim("float_sum_dim", tensor, dim, dtype)
    }

    fn float_mean_dim(tensor: FloatTensor<Self>, dim: usize) -> FloatTensor<Self> {
        let dtype = tensor.dtype();
        common::reduce_dim("float_mean_dim", tensor, dim, dtype)
    }

    along_dim_same_shape!(float_cumsum, float_cumprod, float_cummin, float_cummax);

    fn float_cast(tensor: FloatTensor<Self>, dtype: FloatDType) -> FloatTensor<Self> {
        let dtype: DType = dtype.into();
        if dtype == tensor.dtype() {
            tensor
        } else {
            tensor.fresh(tensor.shape(), dtype)
        }
    }

    binary!(
        float_add,
        float_sub,
        float_mul,
        float_div,
        float_remainder,
        float_powf,
        float_atan2
    );
    with_scalar!(
        float_add_scalar,
        float_sub_scalar,
        float_mul_scalar,
        float_div_scalar,
        float_remainder_scalar,
        float_powf_scalar_impl
    );
    unary!(
        float_recip,
        float_exp,
        float_log,
        float_log1p,
        float_sqrt,
        float_abs,
        float_cos,
        float_sin,
        float_tan,
        float_cosh,
        float_sinh,
        float_tanh,
        float_acos,
        float_acosh,
        float_asin,
        float_asinh,
        float_atan,
        float_atanh,
        float_round,
        float_floor,
        float_ceil,
        float_trunc,
        float_erf
    );
    arg_reduce!(float_argmax, float_argmin);

    fn float_argtopk(
        tensor: FloatTensor<Self>,
        dim: usize,
        k: usize,
        out_dtype: IntDType,
    ) -> IntTensor<Self> {
        let out = shape::with_dim("float_argtopk", &tensor.shape(), dim, k);
        tensor.fresh(out, out_dtype.into())
    }
}
