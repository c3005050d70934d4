//! Real burn training code on `Autodiff<Meta>`: a small MLP, burn's optimizers and checkpointing
//! strategies, with the bytes of each category after the step checked against known answers.

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::strategy::{BalancedCheckpointing, CheckpointStrategy};
use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::loss::{MseLoss, Reduction};
use burn::nn::{Linear, LinearConfig, Relu};
use burn::optim::momentum::MomentumConfig;
use burn::optim::{AdamConfig, AdamWConfig, GradientsParams, Optimizer, SgdConfig};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Distribution, Tensor};
use trainmem_core::{Category, CategoryBytes};
use trainmem_meta::{Meta, MetaDevice};
use trainmem_probe::CategoryScope;

#[derive(Module, Debug)]
struct Mlp<B: Backend> {
    first: Linear<B>,
    act: Relu,
    second: Linear<B>,
}

impl<B: Backend> Mlp<B> {
    fn new(device: &B::Device) -> Self {
        Mlp {
            first: LinearConfig::new(16, 32).init(device),
            act: Relu::new(),
            second: LinearConfig::new(32, 4).init(device),
        }
    }

    fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        self.second.forward(self.act.forward(self.first.forward(x)))
    }
}

/// Parameter bytes of the MLP: (16·32 + 32 + 32·4 + 4) f32 values.
const PARAM_BYTES: u64 = (16 * 32 + 32 + 32 * 4 + 4) * 4;

/// One training step with phases tagged the way measured runs tag them.
fn train_step<B: AutodiffBackend, O: Optimizer<Mlp<B>, B>>(
    model: Mlp<B>,
    optim: &mut O,
    device: &B::Device,
) -> Mlp<B> {
    let (x, y) = {
        let _tag = CategoryScope::enter(Category::Input);
        (
            Tensor::<B, 2>::random([8, 16], Distribution::Default, device),
            Tensor::<B, 2>::random([8, 4], Distribution::Default, device),
        )
    };
    let loss = {
        let _tag = CategoryScope::enter(Category::Activation);
        MseLoss::new().forward(model.forward(x), y, Reduction::Mean)
    };
    let grads = {
        let _tag = CategoryScope::enter(Category::Gradient);
        GradientsParams::from_grads(loss.backward(), &model)
    };
    let _tag = CategoryScope::enter(Category::OptimizerState);
    optim.step(1e-3, model, grads)
}

/// Creates every lazily initialised parameter now.
fn touch_parameters<B: Backend, M: Module<B>>(module: &M) {
    struct Touch;
    impl<B: Backend> ModuleVisitor<B> for Touch {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let _ = param.val();
        }
    }
    module.visit(&mut Touch);
}

/// Builds the model under the parameter tag, runs two steps, returns the device's live bytes
/// per category after them (the model and optimizer still alive).
fn two_steps<C: CheckpointStrategy, O: Optimizer<Mlp<Autodiff<Meta, C>>, Autodiff<Meta, C>>>(
    device: &MetaDevice,
    mut optim: O,
) -> CategoryBytes {
    let model = {
        let _tag = CategoryScope::enter(Category::Parameter);
        let model = Mlp::<Autodiff<Meta, C>>::new(device);
        // burn creates parameters lazily: nothing exists until they are first touched.
        assert_eq!(device.stats().total_live, 0);
        touch_parameters(&model);
        model
    };
    assert_eq!(device.stats().live_bytes(Category::Parameter), PARAM_BYTES);
    let model = train_step(model, &mut optim, device);
    let model = train_step(model, &mut optim, device);
    let live = device.stats().live;
    drop((model, optim));
    assert_eq!(
        device.stats().total_live,
        0,
        "everything released at the end"
    );
    live
}

#[test]
fn adam_keeps_two_moments_per_parameter_and_updates_in_place() {
    let device = MetaDevice::new();
    let after = two_steps::<burn::backend::autodiff::checkpoint::strategy::NoCheckpointing, _>(
        &device,
        AdamConfig::new().init(),
    );
    assert_eq!(after.get(Category::Parameter), PARAM_BYTES);
    assert_eq!(after.get(Category::OptimizerState), 2 * PARAM_BYTES);
    for gone in [Category::Activation, Category::Gradient, Category::Input] {
        assert_eq!(after.get(gone), 0, "{gone:?}");
    }
    let peaks = device.stats();
    assert!(peaks.peak_bytes(Category::Activation) > 0);
    assert!(peaks.peak_bytes(Category::Gradient) >= PARAM_BYTES);
}

#[test]
fn sgd_momentum_and_adamw_keep_their_state_sizes() {
    let device = MetaDevice::new();
    let sgd = two_steps::<BalancedCheckpointing, _>(&device, SgdConfig::new().init());
    assert_eq!(sgd.get(Category::OptimizerState), 0);
    assert_eq!(sgd.get(Category::Parameter), PARAM_BYTES);

    let device = MetaDevice::new();
    let momentum = SgdConfig::new().with_momentum(Some(MomentumConfig::new()));
    let after = two_steps::<BalancedCheckpointing, _>(&device, momentum.init());
    assert_eq!(after.get(Category::OptimizerState), PARAM_BYTES);

    let device = MetaDevice::new();
    let after = two_steps::<BalancedCheckpointing, _>(&device, AdamWConfig::new().init());
    // AdamW's weight decay reads the parameter while the update is computed, so the parameter
    // is not written in place: the updated parameters are new buffers made during the step
    // (as on Flex, where the counting allocator tags them optimizer_state too).
    assert_eq!(after.get(Category::Parameter), 0);
    assert_eq!(after.get(Category::OptimizerState), 3 * PARAM_BYTES);
}

#[test]
fn a_matmul_output_has_its_exact_size_and_dropping_frees_it() {
    let device = MetaDevice::new();
    let a = Tensor::<Meta, 2>::random([4, 16], Distribution::Default, &device);
    let b = Tensor::<Meta, 2>::random([16, 8], Distribution::Default, &device);
    let before = device.stats().total_live;
    assert_eq!(before, (4 * 16 + 16 * 8) * 4);
    let c = a.clone().matmul(b.clone());
    assert_eq!(
        device.stats().total_live,
        before + 128,
        "[4, 8] f32 is 128 B"
    );
    drop((a, b, c));
    assert_eq!(device.stats().total_live, 0);
    assert_eq!(device.stats().total_peak, before + 128);
}

#[test]
fn tensors_of_any_size_cost_no_host_memory() {
    let device = MetaDevice::new();
    let before = trainmem_probe::rss::read().map(|r| r.rss_anon);
    // 16 GiB each.
    let zeros = Tensor::<Meta, 2>::zeros([65536, 65536], &device);
    let ones = Tensor::<Meta, 2>::ones([65536, 65536], &device);
    let sum = zeros.clone() + ones.clone();
    assert_eq!(device.stats().total_live, 3 << 34);
    if let (Ok(before), Ok(after)) = (before, trainmem_probe::rss::read().map(|r| r.rss_anon)) {
        assert!(
            after.saturating_sub(before) < 64 << 20,
            "{before} → {after}"
        );
    }
    drop((zeros, ones, sum));
    assert_eq!(device.stats().total_live, 0);
}
