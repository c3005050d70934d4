//! Output shapes and dtypes of every op family on Meta, against the Flex backend's actual outputs
//! for the same tensor program on small random inputs.

use burn::backend::Flex;
use burn::tensor::backend::Backend;
use burn::tensor::module;
use burn::tensor::ops::{
    AttentionModuleOptions, ConvOptions, ConvTransposeOptions, DeformConvOptions, InterpolateMode,
    InterpolateOptions,
};
use burn::tensor::{Bool, DType, Distribution, IndexingUpdateOp, Int, Tensor, s};
use trainmem_meta::{Meta, MetaDevice};

/// A tensor's shape and dtype.
type Sig = (Vec<usize>, DType);

macro_rules! sig {
    ($t:expr) => {{
        let t = &$t;
        (t.shape().to_vec(), t.dtype())
    }};
}

/// Runs one generic tensor program on Flex and on a fresh Meta device; the shapes and dtypes it
/// reports must agree, and once the program's tensors are dropped the Meta device holds nothing.
macro_rules! same_on_flex {
    ($name:ident, |$dev:ident| $body:block) => {
        #[test]
        fn $name() {
            fn program<B: Backend>($dev: &B::Device) -> Vec<Sig> $body
            let expected = program::<Flex>(&Default::default());
            let device = MetaDevice::new();
            let got = program::<Meta>(&device);
            assert!(!expected.is_empty());
            assert_eq!(got, expected);
            assert_eq!(device.stats().total_live, 0, "buffers left after the program");
        }
    };
}

fn rand<B: Backend, const D: usize>(shape: [usize; D], device: &B::Device) -> Tensor<B, D> {
    Tensor::random(shape, Distribution::Default, device)
}

same_on_flex!(elementwise_and_broadcasting, |d| {
    let a = rand::<B, 3>([2, 3, 4], d);
    let b = rand::<B, 3>([1, 3, 1], d);
    let c = rand::<B, 2>([3, 4], d).unsqueeze::<3>();
    vec![
        sig!(a.clone() + b.clone()),
        sig!(a.clone() * c.clone()),
        sig!(b.clone() / a.clone()),
        sig!(a.clone() - 1.5),
        sig!(a.clone().powf(b.clone())),
        sig!(a.clone().powf_scalar(2.0)),
        sig!(
            a.clone()
                .exp()
                .log()
                .sqrt()
                .abs()
                .tanh()
                .sin()
                .cos()
                .erf()
                .recip()
        ),
        sig!(a.clone().floor().ceil().round()),
        sig!(a.clone().atan2(b.clone())),
        sig!(a.clone().remainder_scalar(2.0)),
        sig!(a.clone().clamp(0.1, 0.9)),
        sig!(burn::tensor::activation::softmax(a.clone(), 2)),
        sig!(burn::tensor::activation::gelu(a.clone())),
        sig!(burn::tensor::activation::relu(a.clone())),
        sig!(burn::tensor::activation::sigmoid(a.clone())),
        sig!(burn::tensor::activation::silu(a)),
    ]
});

same_on_flex!(comparisons_and_masks, |d| {
    let a = rand::<B, 2>([4, 5], d);
    let b = rand::<B, 2>([1, 5], d);
    let mask = a.clone().greater(b.clone());
    vec![
        sig!(mask),
        sig!(a.clone().lower_equal_elem(0.5)),
        sig!(a.clone().equal(b.clone())),
        sig!(a.clone().mask_fill(mask.clone(), 0.0)),
        sig!(a.clone().mask_where(mask.clone(), b.clone().expand([4, 5]))),
        sig!(mask.clone().bool_not()),
        sig!(mask.clone().bool_and(a.clone().greater_elem(0.2))),
        sig!(mask.clone().int()),
        sig!(mask.float()),
        sig!(a.clone().is_nan()),
    ]
});

same_on_flex!(reductions, |d| {
    let a = rand::<B, 3>([2, 3, 4], d);
    vec![
        sig!(a.clone().sum()),
        sig!(a.clone().sum_dim(1)),
        sig!(a.clone().mean_dim(2)),
        sig!(a.clone().mean()),
        sig!(a.clone().max_dim(0)),
        sig!(a.clone().min()),
        sig!(a.clone().argmax(1)),
        sig!(a.clone().argmin(2)),
        sig!(a.clone().prod_dim(1)),
        sig!(a.clone().var(1)),
        sig!(a.clone().cumsum(2)),
        sig!(a.clone().cumprod(1)),
        sig!(a.clone().cummax(0)),
        sig!(a.clone().topk(2, 2)),
        sig!(a.clone().argsort(1)),
        sig!(a.clone().sort(2)),
        sig!(a.max_dim_with_indices(2).1),
    ]
});

same_on_flex!(matmul_and_linear, |d| {
    let a = rand::<B, 2>([4, 8], d);
    let w = rand::<B, 2>([8, 5], d);
    let batched = rand::<B, 4>([2, 3, 4, 8], d);
    let shared = rand::<B, 4>([1, 3, 8, 6], d);
    let bias = rand::<B, 1>([5], d);
    vec![
        sig!(a.clone().matmul(w.clone())),
        sig!(batched.matmul(shared)),
        sig!(module::linear(a.clone(), w.clone(), None)),
        sig!(module::linear(a, w, Some(bias))),
        sig!(rand::<B, 3>([2, 3, 3], d).cross(rand::<B, 3>([2, 3, 3], d), 2)),
    ]
});

same_on_flex!(layout_ops, |d| {
    let a = rand::<B, 3>([2, 3, 4], d);
    vec![
        sig!(a.clone().reshape([6, 4])),
        sig!(a.clone().reshape([0, -1])),
        sig!(a.clone().swap_dims(0, 2)),
        sig!(a.clone().permute([2, 0, 1])),
        sig!(a.clone().transpose().reshape([2, 12])),
        sig!(a.clone().flip([0, 2])),
        sig!(a.clone().slice(s![.., 1..3, ..;2])),
        sig!(a.clone().slice(s![1, .., -2..])),
        sig!(a.clone().narrow(2, 1, 2)),
        sig!(a.clone().expand([5, 2, 3, 4])),
        sig!(a.clone().unsqueeze_dim::<4>(1)),
        sig!(a.clone().flatten::<2>(1, 2)),
        sig!(a.clone().unfold::<4, _>(2, 2, 1)),
        sig!(Tensor::cat(vec![a.clone(), a.clone()], 1)),
        sig!(Tensor::stack::<4>(vec![a.clone(), a.clone()], 0)),
        sig!(a.clone().repeat_dim(1, 3)),
        sig!(a.clone().chunk(2, 2)[1]),
        sig!(
            a.clone()
                .slice_assign(s![0..1, .., 0..2], rand::<B, 3>([1, 3, 2], d))
        ),
        sig!(a.clone().pad((1, 1, 0, 2), 0.0)),
        sig!(a.triu(0)),
    ]
});

same_on_flex!(indexing_ops, |d| {
    let a = rand::<B, 2>([5, 4], d);
    let idx1 = Tensor::<B, 1, Int>::from_data([0, 2, 4], d);
    let idx2 = Tensor::<B, 2, Int>::from_data([[0, 1, 2, 3], [3, 2, 1, 0]], d);
    vec![
        sig!(a.clone().select(0, idx1.clone())),
        sig!(a.clone().gather(0, idx2.clone())),
        sig!(a.clone().select_assign(
            0,
            idx1.clone(),
            rand::<B, 2>([3, 4], d),
            IndexingUpdateOp::Add
        )),
        sig!(a.clone().scatter(
            0,
            idx2.clone(),
            rand::<B, 2>([2, 4], d),
            IndexingUpdateOp::Add
        )),
        sig!(module::embedding(rand::<B, 2>([10, 6], d), idx2.clone())),
        sig!(idx2.clone().select(1, idx1.clone().slice(s![0..2]))),
        sig!(a.one_hot::<3>(3)),
    ]
});

same_on_flex!(int_and_bool_ops, |d| {
    let i = Tensor::<B, 2, Int>::from_data([[1, 2, 3], [4, 5, 6]], d);
    let j = Tensor::<B, 2, Int>::from_data([[1], [2]], d);
    let b = Tensor::<B, 2, Bool>::from_data([[true, false, true], [false, true, true]], d);
    vec![
        sig!(i.clone() + j.clone()),
        sig!(i.clone() * 3),
        sig!(i.clone().sum_dim(1)),
        sig!(i.clone().argmax(0)),
        sig!(i.clone().float()),
        sig!(i.clone().cast(DType::I64)),
        sig!(i.clone().bitwise_and(j.clone())),
        sig!(i.clone().matmul(i.clone().transpose())),
        sig!(i.clone().cumsum(1)),
        sig!(i.clone().greater(j.clone())),
        sig!(i.clone().mask_fill(b.clone(), 0)),
        sig!(i.clone().reshape([3, 2]).swap_dims(0, 1)),
        sig!(Tensor::cat(vec![i.clone(), i.clone()], 0)),
        sig!(Tensor::<B, 1, Int>::arange(0..7, d)),
        sig!(b.clone().bool_or(b.clone())),
        sig!(b.clone().reshape([3, 2]).permute([1, 0])),
        sig!(Tensor::cat(vec![b.clone(), b.clone()], 1)),
        sig!(b.clone().expand([4, 2, 3])),
        sig!(b.any_dim(1)),
        sig!(Tensor::<B, 2, Bool>::full([2, 2], true, d)),
    ]
});

same_on_flex!(casts_and_creation, |d| {
    let a = rand::<B, 2>([3, 4], d);
    vec![
        sig!(a.clone().cast(DType::F16)),
        sig!(a.clone().cast(DType::BF16).cast(DType::F32)),
        sig!(a.clone().cast(DType::F64)),
        sig!(a.clone().int()),
        sig!(Tensor::<B, 2>::zeros([2, 5], d)),
        sig!(Tensor::<B, 2>::ones([2, 5], d)),
        sig!(Tensor::<B, 3>::full([1, 2, 3], 7.0, d)),
        sig!(Tensor::<B, 2>::empty([4, 4], d)),
        sig!(a.clone().zeros_like()),
        sig!(Tensor::<B, 2>::from_data([[1.0, 2.0], [3.0, 4.0]], d)),
        sig!(Tensor::<B, 2, Int>::random(
            [3, 3],
            Distribution::Uniform(0.0, 9.0),
            d
        )),
    ]
});

same_on_flex!(convolutions, |d| {
    let x = rand::<B, 4>([2, 3, 9, 8], d);
    let w = rand::<B, 4>([6, 3, 3, 3], d);
    let grouped = rand::<B, 4>([6, 1, 3, 3], d);
    let wt = rand::<B, 4>([3, 4, 3, 3], d);
    let x3 = rand::<B, 5>([1, 2, 5, 6, 7], d);
    let w3 = rand::<B, 5>([4, 2, 3, 3, 3], d);
    let offset = rand::<B, 4>([2, 18, 7, 6], d);
    vec![
        sig!(module::conv2d(
            x.clone(),
            w.clone(),
            None,
            ConvOptions::new([1, 1], [0, 0], [1, 1], 1)
        )),
        sig!(module::conv2d(
            x.clone(),
            w,
            Some(rand::<B, 1>([6], d)),
            ConvOptions::new([2, 1], [1, 2], [1, 2], 1)
        )),
        sig!(module::conv2d(
            x.clone(),
            grouped,
            None,
            ConvOptions::new([1, 1], [1, 1], [1, 1], 3)
        )),
        sig!(module::conv_transpose2d(
            x.clone(),
            wt,
            None,
            ConvTransposeOptions::new([2, 2], [1, 1], [1, 0], [1, 1], 1)
        )),
        sig!(module::conv3d(
            x3.clone(),
            w3.clone(),
            None,
            ConvOptions::new([1, 2, 1], [1, 0, 1], [1, 1, 1], 1)
        )),
        sig!(module::conv_transpose3d(
            x3,
            rand::<B, 5>([2, 3, 2, 2, 2], d),
            None,
            ConvTransposeOptions::new([2, 1, 1], [0, 0, 0], [0, 0, 0], [1, 1, 1], 1)
        )),
        sig!(module::conv1d(
            rand::<B, 3>([2, 3, 10], d),
            rand::<B, 3>([4, 3, 3], d),
            None,
            ConvOptions::new([2], [1], [1], 1)
        )),
        sig!(module::deform_conv2d(
            x,
            offset,
            rand::<B, 4>([5, 3, 3, 3], d),
            None,
            None,
            DeformConvOptions::new([1, 1], [0, 0], [1, 1], 1, 1)
        )),
    ]
});

same_on_flex!(pooling_and_interpolation, |d| {
    let x = rand::<B, 4>([2, 3, 9, 8], d);
    let nearest = InterpolateOptions::new(InterpolateMode::Nearest);
    let bilinear = InterpolateOptions::new(InterpolateMode::Bilinear);
    let (pooled, indices) =
        module::max_pool2d_with_indices(x.clone(), [3, 3], [2, 2], [1, 1], [1, 1], false);
    vec![
        sig!(module::max_pool2d(
            x.clone(),
            [2, 2],
            [2, 2],
            [0, 0],
            [1, 1],
            false
        )),
        sig!(module::max_pool2d(
            x.clone(),
            [3, 2],
            [2, 2],
            [0, 0],
            [1, 1],
            true
        )),
        sig!(pooled),
        sig!(indices),
        sig!(module::avg_pool2d(
            x.clone(),
            [3, 3],
            [1, 2],
            [1, 1],
            true,
            false
        )),
        sig!(module::adaptive_avg_pool2d(x.clone(), [4, 3])),
        sig!(module::avg_pool1d(
            rand::<B, 3>([2, 3, 10], d),
            3,
            2,
            0,
            true,
            false
        )),
        sig!(module::interpolate(x.clone(), [12, 5], nearest)),
        sig!(module::interpolate(x, [4, 16], bilinear)),
    ]
});

same_on_flex!(attention_and_fft, |d| {
    let q = rand::<B, 4>([2, 4, 6, 8], d);
    let k = rand::<B, 4>([2, 4, 5, 8], d);
    let v = rand::<B, 4>([2, 4, 5, 3], d);
    let signal = rand::<B, 2>([3, 16], d);
    let (re, im) = burn::tensor::signal::rfft(signal.clone(), 1, None);
    vec![
        sig!(module::attention(
            q.clone(),
            k.clone(),
            v.clone(),
            None,
            None,
            AttentionModuleOptions::default()
        )),
        sig!(module::attention_fallback(
            q,
            k,
            v,
            None,
            None,
            AttentionModuleOptions::default()
        )),
        sig!(re.clone()),
        sig!(im.clone()),
        sig!(burn::tensor::signal::irfft(re, im, 1, None)),
        sig!(burn::tensor::signal::rfft(signal, 1, Some(8)).0),
    ]
});

same_on_flex!(quantized, |d| {
    use burn::tensor::quantization::QuantScheme;
    let scheme = QuantScheme::default();
    let a = rand::<B, 2>([6, 8], d);
    let q = a.clone().quantize_dynamic(&scheme);
    vec![
        sig!(q),
        sig!(q.clone().dequantize()),
        sig!(q.clone().reshape([8, 6])),
        sig!(q.clone().swap_dims(0, 1)),
        sig!(q.clone().slice(s![1..3, ..])),
        sig!(
            q.clone()
                .select(0, Tensor::<B, 1, Int>::from_data([0, 5], d))
        ),
        sig!(q.matmul(rand::<B, 2>([8, 3], d))),
    ]
});
