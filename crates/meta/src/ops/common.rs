//! Shape-and-storage rules shared by the float, int and bool op families.

use burn::tensor::backend::ExecutionError;
use burn::tensor::{DType, Shape, Slice, TensorData, TensorMetadata};

use crate::device::MetaDevice;
use crate::shape;
use crate::tensor::MetaTensor;

/// Element-wise op of two tensors whose result has the left operand's dtype.
pub(crate) fn binary(op: &str, lhs: MetaTensor, rhs: MetaTensor) -> MetaTensor {
    let out = shape::broadcast(op, &lhs.shape(), &rhs.shape());
    let dtype = lhs.dtype();
    // Whether the left operand is uniquely owned is judged while the right one is still alive
    // (`x * x` shares one buffer between the two and so is not written in place).
    let result = lhs.map_into(out, dtype);
    drop(rhs);
    result
}

/// Comparison of two tensors: a fresh bool tensor of the broadcast shape.
pub(crate) fn compare(op: &str, lhs: MetaTensor, rhs: MetaTensor, out: DType) -> MetaTensor {
    let shape = shape::broadcast(op, &lhs.shape(), &rhs.shape());
    lhs.fresh(shape, out)
}

/// Comparison with a scalar: a fresh bool tensor of the same shape.
pub(crate) fn compare_scalar(lhs: MetaTensor, out: DType) -> MetaTensor {
    lhs.fresh(lhs.shape(), out)
}

/// Reduction along `dim` (kept with size 1).
pub(crate) fn reduce_dim(op: &str, tensor: MetaTensor, dim: usize, dtype: DType) -> MetaTensor {
    tensor.fresh(shape::with_dim(op, &tensor.shape(), dim, 1), dtype)
}

/// Reduction of every element to a one-element tensor.
pub(crate) fn reduce_all(tensor: MetaTensor) -> MetaTensor {
    tensor.fresh(Shape::new([1]), tensor.dtype())
}

/// A fresh tensor with the input's shape and dtype (cumulative ops and other non-in-place
/// element-wise ops).
pub(crate) fn same(tensor: MetaTensor) -> MetaTensor {
    tensor.fresh(tensor.shape(), tensor.dtype())
}

/// Gather along `dim`: a fresh tensor of the indices' shape.
pub(crate) fn gather(op: &str, dim: usize, tensor: MetaTensor, indices: MetaTensor) -> MetaTensor {
    let out = shape::gather(op, &tensor.shape(), dim, &indices.shape());
    tensor.fresh(out, tensor.dtype())
}

/// Scatter / select-add style updates: written into `tensor` when it can be.
pub(crate) fn update(tensor: MetaTensor, value: MetaTensor) -> MetaTensor {
    let (shape, dtype) = (tensor.shape(), tensor.dtype());
    let result = tensor.map_into(shape, dtype);
    drop(value);
    result
}

/// Select along `dim`.
pub(crate) fn select(op: &str, tensor: MetaTensor, dim: usize, indices: MetaTensor) -> MetaTensor {
    let out = shape::select(op, &tensor.shape(), dim, &indices.shape());
    tensor.fresh(out, tensor.dtype())
}

/// Writes `value` into a region of `tensor`.
pub(crate) fn slice_assign(
    op: &str,
    tensor: MetaTensor,
    slices: &[Slice],
    value: MetaTensor,
) -> MetaTensor {
    shape::slice_assign(op, &tensor.shape(), slices, &value.shape());
    update(tensor, value)
}

/// `mask_where`: the broadcast of the three shapes, written into `tensor` when it can be.
pub(crate) fn mask_where(
    op: &str,
    tensor: MetaTensor,
    mask: MetaTensor,
    value: MetaTensor,
) -> MetaTensor {
    let out = shape::broadcast(op, &tensor.shape(), &mask.shape());
    let out = shape::broadcast(op, &out, &value.shape());
    let dtype = tensor.dtype();
    tensor.map_into(out, dtype)
}

/// `mask_fill`: the broadcast of tensor and mask, written into `tensor` when it can be.
pub(crate) fn mask_fill(op: &str, tensor: MetaTensor, mask: MetaTensor) -> MetaTensor {
    let out = shape::broadcast(op, &tensor.shape(), &mask.shape());
    let dtype = tensor.dtype();
    tensor.map_into(out, dtype)
}

/// Concatenation into one fresh tensor.
pub(crate) fn cat(op: &str, tensors: Vec<MetaTensor>, dim: usize) -> MetaTensor {
    let shapes: Vec<Shape> = tensors.iter().map(TensorMetadata::shape).collect();
    let out = shape::cat(op, &shapes, dim);
    let first = tensors
        .first()
        .unwrap_or_else(|| panic!("trainmem-meta: {op}: no tensors to concatenate"));
    first.fresh(out, first.dtype())
}

/// Reading values back: zeros of the tensor's shape and dtype (Meta has no values).
pub(crate) fn into_data(tensor: MetaTensor) -> Result<TensorData, ExecutionError> {
    let shape = tensor.shape();
    let dtype = tensor.dtype();
    let len = shape.num_elements() * dtype.size();
    drop(tensor);
    Ok(TensorData::from_bytes_vec(vec![0; len], shape, dtype))
}

/// A tensor for uploaded data: its shape and dtype, a fresh buffer, the values dropped.
pub(crate) fn from_data(data: TensorData, device: &MetaDevice) -> MetaTensor {
    MetaTensor::new(data.shape.clone(), data.dtype, *device)
}

/// Generates the layout ops (views and moves) of one op family.
macro_rules! layout_ops {
    (
        reshape: $reshape:ident, swap_dims: $swap:ident, permute: $permute:ident,
        flip: $flip:ident, expand: $expand:ident, slice: $slice:ident, unfold: $unfold:ident,
        device: $device:ident, to_device: $to_device:ident, cat: $cat:ident
    ) => {
        fn $reshape(tensor: MetaTensor, shape: burn::tensor::Shape) -> MetaTensor {
            let shape = $crate::shape::reshape(stringify!($reshape), &tensor.shape(), shape);
            tensor.reshaped(shape)
        }

        fn $swap(tensor: MetaTensor, dim1: usize, dim2: usize) -> MetaTensor {
            let shape = $crate::shape::swap(stringify!($swap), &tensor.shape(), dim1, dim2);
            tensor.view(shape, false, true)
        }

        fn $permute(tensor: MetaTensor, axes: &[usize]) -> MetaTensor {
            let shape = $crate::shape::permute(stringify!($permute), &tensor.shape(), axes);
            let identity = axes.iter().enumerate().all(|(i, &a)| i == a);
            tensor.view(shape, identity, true)
        }

        fn $flip(tensor: MetaTensor, _axes: &[usize]) -> MetaTensor {
            let shape = tensor.shape();
            tensor.view(shape, false, false)
        }

        fn $expand(tensor: MetaTensor, shape: burn::tensor::Shape) -> MetaTensor {
            let shape = $crate::shape::expand(stringify!($expand), &tensor.shape(), shape);
            tensor.view(shape, false, true)
        }

        fn $slice(tensor: MetaTensor, slices: &[burn::tensor::Slice]) -> MetaTensor {
            let from = tensor.shape();
            let shape = $crate::shape::slice(stringify!($slice), &from, slices);
            let (contiguous, at_origin) = $crate::shape::slice_layout(&from, slices);
            tensor.view(shape, contiguous, at_origin)
        }

        fn $unfold(tensor: MetaTensor, dim: usize, size: usize, step: usize) -> MetaTensor {
            let shape =
                $crate::shape::unfold(stringify!($unfold), &tensor.shape(), dim, size, step);
            tensor.view(shape, false, true)
        }

        fn $device(tensor: &MetaTensor) -> $crate::MetaDevice {
            tensor.device()
        }

        fn $to_device(tensor: MetaTensor, device: &$crate::MetaDevice) -> MetaTensor {
            tensor.moved_to(*device)
        }

        fn $cat(tensors: Vec<MetaTensor>, dim: usize) -> MetaTensor {
            $crate::ops::common::cat(stringify!($cat), tensors, dim)
        }
    };
}

pub(crate) use layout_ops;
