//! Module ops: convolutions, pooling, interpolation, attention, FFTs.
//!
//! Each op allocates its outputs only; the scratch a CPU kernel uses inside the op (im2col
//! buffers, attention scores of a fused kernel) is not modelled.

use burn::tensor::ops::conv::{
    calculate_conv_output_shape, calculate_conv_output_size, calculate_conv_transpose_output_shape,
    calculate_pool_output_shape,
};
use burn::tensor::ops::{
    AttentionModuleOptions, BoolTensor, ConvOptions, ConvTransposeOptions, DeformConv2dBackward,
    DeformConvOptions, FloatTensor, IntTensor, InterpolateOptions, MaxPool2dBackward,
    MaxPool2dWithIndices, ModuleOps,
};
use burn::tensor::{DType, Shape, TensorMetadata};

use crate::backend::Meta;
use crate::shape::with_dim;
use crate::tensor::MetaTensor;

fn fail(op: &str, why: impl std::fmt::Display) -> ! {
    panic!("trainmem-meta: {op}: {why}")
}

/// A fresh float tensor shaped like `like`.
fn like(like: &MetaTensor) -> MetaTensor {
    like.fresh(like.shape(), like.dtype())
}

/// Output of a 2-d pool over `x`.
fn pool2d(
    op: &str,
    x: &MetaTensor,
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
    ceil_mode: bool,
) -> MetaTensor {
    let out =
        calculate_pool_output_shape(&x.shape(), &kernel, &stride, &padding, &dilation, ceil_mode)
            .unwrap_or_else(|e| fail(op, format!("{e:?}")));
    x.fresh(out, x.dtype())
}

/// `x` with its two trailing (spatial) dimensions set to `size`.
fn spatial2d(op: &str, x: &MetaTensor, size: [usize; 2]) -> MetaTensor {
    let shape = x.shape();
    if shape.num_dims() != 4 {
        fail(op, format!("expected a 4-d input, got {shape:?}"));
    }
    let out = Shape::new([shape[0], shape[1], size[0], size[1]]);
    x.fresh(out, x.dtype())
}

/// Output shape of a convolution `x ⊛ weight`.
fn conv<const N: usize>(
    op: &str,
    x: &MetaTensor,
    weight: &MetaTensor,
    o: &ConvOptions<N>,
) -> MetaTensor {
    let out = calculate_conv_output_shape(
        &x.shape(),
        &weight.shape(),
        &o.stride,
        &o.padding,
        &o.dilation,
    )
    .unwrap_or_else(|e| fail(op, format!("{e:?}")));
    x.fresh(out, x.dtype())
}

/// Output shape of a transposed convolution.
fn conv_transpose<const N: usize>(
    op: &str,
    x: &MetaTensor,
    weight: &MetaTensor,
    o: &ConvTransposeOptions<N>,
) -> MetaTensor {
    let out = calculate_conv_transpose_output_shape(
        &x.shape(),
        &weight.shape(),
        &o.stride,
        &o.padding,
        &o.padding_out,
        &o.dilation,
        o.groups,
    )
    .unwrap_or_else(|e| fail(op, format!("{e:?}")));
    x.fresh(out, x.dtype())
}

impl ModuleOps<Self> for Meta {
    fn conv2d(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        _bias: Option<FloatTensor<Self>>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        conv("conv2d", &x, &weight, &options)
    }

    fn deform_conv2d(
        x: FloatTensor<Self>,
        _offset: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        _mask: Option<FloatTensor<Self>>,
        _bias: Option<FloatTensor<Self>>,
        o: DeformConvOptions<2>,
    ) -> FloatTensor<Self> {
        let (xs, ws) = (x.shape(), weight.shape());
        if xs.num_dims() != 4 || ws.num_dims() != 4 {
            fail("deform_conv2d", format!("input {xs:?}, weight {ws:?}"));
        }
        let h = calculate_conv_output_size(ws[2], o.stride[0], o.padding[0], o.dilation[0], xs[2]);
        let w = calculate_conv_output_size(ws[3], o.stride[1], o.padding[1], o.dilation[1], xs[3]);
        x.fresh(Shape::new([xs[0], ws[0], h, w]), x.dtype())
    }

    fn deform_conv2d_backward(
        x: FloatTensor<Self>,
        offset: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        mask: Option<FloatTensor<Self>>,
        bias: Option<FloatTensor<Self>>,
        _output_grad: FloatTensor<Self>,
        _options: DeformConvOptions<2>,
    ) -> DeformConv2dBackward<Self> {
        DeformConv2dBackward::new(
            like(&x),
            like(&offset),
            like(&weight),
            mask.as_ref().map(like),
            bias.as_ref().map(like),
        )
    }

    fn conv3d(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        _bias: Option<FloatTensor<Self>>,
        options: ConvOptions<3>,
    ) -> FloatTensor<Self> {
        conv("conv3d", &x, &weight, &options)
    }

    fn conv_transpose2d(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        _bias: Option<FloatTensor<Self>>,
        options: ConvTransposeOptions<2>,
    ) -> FloatTensor<Self> {
        conv_transpose("conv_transpose2d", &x, &weight, &options)
    }

    fn conv_transpose3d(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        _bias: Option<FloatTensor<Self>>,
        options: ConvTransposeOptions<3>,
    ) -> FloatTensor<Self> {
        conv_transpose("conv_transpose3d", &x, &weight, &options)
    }

    fn avg_pool2d(
        x: FloatTensor<Self>,
        kernel_size: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        _count_include_pad: bool,
        ceil_mode: bool,
    ) -> FloatTensor<Self> {
        pool2d(
            "avg_pool2d",
            &x,
            kernel_size,
            stride,
            padding,
            [1, 1],
            ceil_mode,
        )
    }

    fn avg_pool2d_backward(
        x: FloatTensor<Self>,
        _grad: FloatTensor<Self>,
        _kernel_size: [usize; 2],
        _stride: [usize; 2],
        _padding: [usize; 2],
        _count_include_pad: bool,
        _ceil_mode: bool,
    ) -> FloatTensor<Self> {
        like(&x)
    }

    fn adaptive_avg_pool2d(x: FloatTensor<Self>, output_size: [usize; 2]) -> FloatTensor<Self> {
        spatial2d("adaptive_avg_pool2d", &x, output_size)
    }

    fn adaptive_avg_pool2d_backward(
        x: FloatTensor<Self>,
        _grad: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        like(&x)
    }

    fn max_pool2d(
        x: FloatTensor<Self>,
        kernel_size: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
        ceil_mode: bool,
    ) -> FloatTensor<Self> {
        pool2d(
            "max_pool2d",
            &x,
            kernel_size,
            stride,
            padding,
            dilation,
            ceil_mode,
        )
    }

    /// Indices are i64, as on the CPU backend; their values are not computed.
    fn max_pool2d_with_indices(
        x: FloatTensor<Self>,
        kernel_size: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
        ceil_mode: bool,
    ) -> MaxPool2dWithIndices<Self> {
        let output = pool2d(
            "max_pool2d_with_indices",
            &x,
            kernel_size,
            stride,
            padding,
            dilation,
            ceil_mode,
        );
        let indices = output.fresh(output.shape(), DType::I64);
        MaxPool2dWithIndices::new(output, indices)
    }

    fn max_pool2d_with_indices_backward(
        x: FloatTensor<Self>,
        _kernel_size: [usize; 2],
        _stride: [usize; 2],
        _padding: [usize; 2],
        _dilation: [usize; 2],
        _ceil_mode: bool,
        _output_grad: FloatTensor<Self>,
        _indices: IntTensor<Self>,
    ) -> MaxPool2dBackward<Self> {
        MaxPool2dBackward::new(like(&x))
    }

    fn interpolate(
        x: FloatTensor<Self>,
        output_size: [usize; 2],
        _options: InterpolateOptions,
    ) -> FloatTensor<Self> {
        spatial2d("interpolate", &x, output_size)
    }

    fn interpolate_backward(
        x: FloatTensor<Self>,
        _grad: FloatTensor<Self>,
        _output_size: [usize; 2],
        _options: InterpolateOptions,
    ) -> FloatTensor<Self> {
        like(&x)
    }

    /// `[.., q_len, d] × [.., k_len, d] × [.., k_len, d_v] → [.., q_len, d_v]`.
    fn attention(
        query: FloatTensor<Self>,
        key: FloatTensor<Self>,
        value: FloatTensor<Self>,
        _mask: Option<BoolTensor<Self>>,
        _attn_bias: Option<FloatTensor<Self>>,
        _options: AttentionModuleOptions,
    ) -> FloatTensor<Self> {
        let (q, k, v) = (query.shape(), key.shape(), value.shape());
        let rank = q.num_dims();
        if rank < 2 || k.num_dims() != rank || v.num_dims() != rank || k[rank - 2] != v[rank - 2] {
            fail("attention", format!("query {q:?}, key {k:?}, value {v:?}"));
        }
        let out = with_dim("attention", &q, rank - 1, v[rank - 1]);
        query.fresh(out, query.dtype())
    }

    /// Real and imaginary parts of the one-sided spectrum: `n / 2 + 1` bins along `dim`.
    fn rfft(
        signal: FloatTensor<Self>,
        dim: usize,
        n: Option<usize>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let shape = signal.shape();
        if dim >= shape.num_dims() {
            fail("rfft", format!("dim {dim} out of range for {shape:?}"));
        }
        let n = n.unwrap_or(shape[dim]);
        let out = with_dim("rfft", &shape, dim, n / 2 + 1);
        let re = signal.fresh(out.clone(), signal.dtype());
        let im = signal.fresh(out, signal.dtype());
        (re, im)
    }

    /// A real signal of `n` samples along `dim` (default `2 × (bins − 1)`).
    fn irfft(
        spectrum_re: FloatTensor<Self>,
        _spectrum_im: FloatTensor<Self>,
        dim: usize,
        n: Option<usize>,
    ) -> FloatTensor<Self> {
        let shape = spectrum_re.shape();
        if dim >= shape.num_dims() {
            fail("irfft", format!("dim {dim} out of range for {shape:?}"));
        }
        let n = n.unwrap_or(2 * shape[dim].saturating_sub(1));
        let out = with_dim("irfft", &shape, dim, n);
        spectrum_re.fresh(out, spectrum_re.dtype())
    }
}
