//! burn networks built from the simulator's model specification.
//!
//! The same [`ModelSpec`] the simulator reads is turned into a burn-nn module here, so the
//! measured run and its twin train the same network: an MLP of [`Linear`] layers, a CNN of
//! [`Conv2d`] / [`BatchNorm`] / pooling layers with a linear head, or a transformer encoder
//! (token [`Embedding`], burn-nn's [`TransformerEncoder`], a linear head).
//!
//! Parameters in burn 0.21 are lazy: `Config::init` records an initializer and the tensor is
//! created on first use. [`materialize`](trainmem_track::materialize) touches every parameter so that they exist (and are
//! counted under the thread's current category) before the first forward pass.

use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::loss::{CrossEntropyLossConfig, MseLoss, Reduction};
use burn::nn::pool::{
    AdaptiveAvgPool2d, AdaptiveAvgPool2dConfig, AvgPool2d, AvgPool2dConfig, MaxPool2d,
    MaxPool2dConfig,
};
use burn::nn::transformer::{
    TransformerEncoder, TransformerEncoderConfig, TransformerEncoderInput,
};
use burn::nn::{
    BatchNorm, BatchNormConfig, Dropout, DropoutConfig, Embedding, EmbeddingConfig, Linear,
    LinearConfig, PaddingConfig2d,
};
use burn::prelude::{Backend, Int, Tensor};
use burn::tensor::{TensorData, activation};
use trainmem_core::model::{
    Activation as ActKind, AttentionImpl, CnnLayer, CnnOp, CnnSpec, Loss, MlpSpec, ModelSpec,
    NormKind, TransformerKind, TransformerSpec,
};

use crate::BurnRunError;

/// An element-wise activation, as a plain value the module carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Act {
    Relu,
    Gelu,
    Silu,
    Tanh,
    Sigmoid,
}

impl Act {
    fn from_spec(a: ActKind) -> Act {
        match a {
            ActKind::Relu => Act::Relu,
            ActKind::Gelu => Act::Gelu,
            ActKind::Silu => Act::Silu,
            ActKind::Tanh => Act::Tanh,
            ActKind::Sigmoid => Act::Sigmoid,
            // refused before a model is built (run::check_supported): burn has no composed
            // tanh-approximated GELU
            ActKind::GeluNew => Act::Gelu,
        }
    }

    fn apply<B: Backend, const D: usize>(self, x: Tensor<B, D>) -> Tensor<B, D> {
        match self {
            Act::Relu => activation::relu(x),
            Act::Gelu => activation::gelu(x),
            Act::Silu => activation::silu(x),
            Act::Tanh => activation::tanh(x),
            Act::Sigmoid => activation::sigmoid(x),
        }
    }
}

/// What one training example looks like to the network: the shape of its input and target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExampleShape {
    /// A feature vector of `input` floats and a regression target of `output` floats.
    Regression {
        /// Input features.
        input: usize,
        /// Target features.
        output: usize,
    },
    /// A feature vector (or image, flattened `[c, h, w]`) and one class index.
    Classification {
        /// Input dimensions without the batch (`[features]` or `[c, h, w]`).
        input: Vec<usize>,
        /// Number of classes.
        classes: usize,
    },
    /// A sequence of `seq_len` token ids; the target is one class (encoder) or the next token at
    /// every position (decoder).
    Tokens {
        /// Sequence length.
        seq_len: usize,
        /// Vocabulary size.
        vocab: usize,
        /// Classes of the head (the vocabulary for a decoder).
        classes: usize,
        /// Whether there is one target per position (decoder) or one per sequence (encoder).
        per_position: bool,
    },
}

impl ExampleShape {
    /// Floats per example of input (token ids count as one float each when stored in a
    /// data set file).
    pub fn input_len(&self) -> usize {
        match self {
            ExampleShape::Regression { input, .. } => *input,
            ExampleShape::Classification { input, .. } => input.iter().product(),
            ExampleShape::Tokens { seq_len, .. } => *seq_len,
        }
    }

    /// Floats per example of target.
    pub fn target_len(&self) -> usize {
        match self {
            ExampleShape::Regression { output, .. } => *output,
            ExampleShape::Classification { .. } => 1,
            ExampleShape::Tokens {
                seq_len,
                per_position,
                ..
            } => {
                if *per_position {
                    *seq_len
                } else {
                    1
                }
            }
        }
    }
}

/// A batch on the device, ready for [`Net::loss`].
#[derive(Debug, Clone)]
pub struct Batch<B: Backend> {
    /// The inputs.
    pub input: BatchInput<B>,
    /// The targets.
    pub target: BatchTarget<B>,
}

/// Inputs of a batch.
#[derive(Debug, Clone)]
pub enum BatchInput<B: Backend> {
    /// `[batch, features]`.
    Vector(Tensor<B, 2>),
    /// `[batch, channels, height, width]`.
    Image(Tensor<B, 4>),
    /// `[batch, seq_len]` token ids.
    Tokens(Tensor<B, 2, Int>),
}

/// Targets of a batch.
#[derive(Debug, Clone)]
pub enum BatchTarget<B: Backend> {
    /// `[batch, output]` regression targets (MSE).
    Values(Tensor<B, 2>),
    /// `[n]` class indices (cross-entropy); `n` is the batch, or batch × seq_len for a decoder.
    Classes(Tensor<B, 1, Int>),
}

impl<B: Backend> Batch<B> {
    /// Builds a batch from flat host data: `inputs` holds `batch × shape.input_len()` values,
    /// `targets` holds `batch × shape.target_len()` values (class and token ids as exact
    /// small non-negative floats).
    ///
    /// With `uploads` (the backend keeps tensors in device memory) each host buffer is marked
    /// as handed to the device backend ([`trainmem_probe::mark_handed_to_device`]) as it goes
    /// in, so the host bytes the backend keeps after the copy are told apart from the ones the
    /// program holds. On a host backend the buffers become the tensors and are not marked.
    pub fn from_host(
        shape: &ExampleShape,
        batch: usize,
        inputs: Vec<f32>,
        targets: Vec<f32>,
        device: &B::Device,
        uploads: bool,
    ) -> Result<Batch<B>, BurnRunError> {
        let want_in = batch * shape.input_len();
        let want_t = batch * shape.target_len();
        if inputs.len() != want_in || targets.len() != want_t {
            return Err(BurnRunError::Data(format!(
                "batch of {batch} needs {want_in} input and {want_t} target values, got {} and {}",
                inputs.len(),
                targets.len()
            )));
        }
        fn hand_over<T>(v: &Vec<T>, uploads: bool) {
            if uploads {
                trainmem_probe::mark_handed_to_device(v);
            }
        }
        let floats = |v: Vec<f32>| {
            let n = v.len();
            hand_over(&v, uploads);
            Tensor::<B, 1>::from_data(TensorData::new(v, [n]), device)
        };
        let ids = |v: Vec<f32>| {
            let n = v.len();
            let ids: Vec<i32> = v.into_iter().map(|x| x as i32).collect();
            hand_over(&ids, uploads);
            Tensor::<B, 1, Int>::from_data(TensorData::new(ids, [n]), device)
        };
        Ok(match shape {
            ExampleShape::Regression { input, output } => Batch {
                input: BatchInput::Vector(floats(inputs).reshape([batch, *input])),
                target: BatchTarget::Values(floats(targets).reshape([batch, *output])),
            },
            ExampleShape::Classification { input, .. } => {
                let flat = floats(inputs);
                let input = match input.as_slice() {
                    [c, h, w] => BatchInput::Image(flat.reshape([batch, *c, *h, *w])),
                    _ => BatchInput::Vector(flat.reshape([batch, shape.input_len()])),
                };
                Batch {
                    input,
                    target: BatchTarget::Classes(ids(targets)),
                }
            }
            ExampleShape::Tokens { seq_len, .. } => Batch {
                input: BatchInput::Tokens(ids(inputs).reshape([batch, *seq_len])),
                target: BatchTarget::Classes(ids(targets)),
            },
        })
    }
}

/// A multilayer perceptron of burn-nn linear layers.
#[derive(Module, Debug)]
pub struct Mlp<B: Backend> {
    layers: Vec<Linear<B>>,
    dropout: Option<Dropout>,
    #[module(skip)]
    act: Act,
}

impl<B: Backend> Mlp<B> {
    fn new(spec: &MlpSpec, device: &B::Device) -> Result<Mlp<B>, BurnRunError> {
        let mut widths = vec![dim(spec.input, "mlp.input")?];
        for h in &spec.hidden {
            widths.push(dim(*h, "mlp.hidden")?);
        }
        widths.push(dim(spec.output, "mlp.output")?);
        let layers = widths
            .windows(2)
            .map(|w| {
                LinearConfig::new(w[0], w[1])
                    .with_bias(spec.bias)
                    .init(device)
            })
            .collect();
        Ok(Mlp {
            layers,
            dropout: dropout(spec.dropout)?,
            act: Act::from_spec(spec.activation),
        })
    }

    fn forward(&self, mut x: Tensor<B, 2>) -> Tensor<B, 2> {
        let last = self.layers.len().saturating_sub(1);
        for (i, layer) in self.layers.iter().enumerate() {
            x = layer.forward(x);
            if i < last {
                x = self.act.apply(x);
                if let Some(d) = &self.dropout {
                    x = d.forward(x);
                }
            }
        }
        x
    }
}

/// One step of a CNN program: which module (by index into the CNN's module lists) or which
/// stateless op runs next.
#[derive(Debug, Clone, Copy, PartialEq)]
enum CnnStep {
    Conv(usize),
    Norm(usize),
    Act(Act),
    MaxPool(usize),
    AvgPool(usize),
    GlobalAvgPool,
    Dropout(usize),
    Flatten,
    Linear(usize),
}

/// A convolutional network: the layer stack of a [`CnnSpec`] and a linear head.
#[derive(Module, Debug)]
pub struct Cnn<B: Backend> {
    convs: Vec<Conv2d<B>>,
    norms: Vec<BatchNorm<B>>,
    linears: Vec<Linear<B>>,
    max_pools: Vec<MaxPool2d>,
    avg_pools: Vec<AvgPool2d>,
    dropouts: Vec<Dropout>,
    global_pool: AdaptiveAvgPool2d,
    #[module(skip)]
    program: Vec<CnnStep>,
}

/// The running shape while a CNN is assembled.
#[derive(Debug, Clone, Copy)]
enum Shape {
    Image([usize; 3]),
    Flat(usize),
}

impl Shape {
    fn features(self) -> usize {
        match self {
            Shape::Image([c, h, w]) => c * h * w,
            Shape::Flat(n) => n,
        }
    }
}

fn need(layer: &CnnLayer, v: Option<u64>, field: &str) -> Result<usize, BurnRunError> {
    let v = v.ok_or_else(|| {
        BurnRunError::Unsupported(format!("cnn layer {:?} needs `{field}`", layer.op))
    })?;
    dim(v, field)
}

/// The image shape a layer needs as input, or the error for a layer after the flatten.
fn image_shape(shape: Shape, op: CnnOp) -> Result<[usize; 3], BurnRunError> {
    match shape {
        Shape::Image(s) => Ok(s),
        Shape::Flat(_) => Err(BurnRunError::Unsupported(format!(
            "cnn layer {op:?} after the stack was flattened"
        ))),
    }
}

impl<B: Backend> Cnn<B> {
    fn new(spec: &CnnSpec, device: &B::Device) -> Result<Cnn<B>, BurnRunError> {
        let [c, h, w] = spec.image;
        let mut shape = Shape::Image([dim(c, "image")?, dim(h, "image")?, dim(w, "image")?]);
        let mut cnn = Cnn {
            convs: Vec::new(),
            norms: Vec::new(),
            linears: Vec::new(),
            max_pools: Vec::new(),
            avg_pools: Vec::new(),
            dropouts: Vec::new(),
            global_pool: AdaptiveAvgPool2dConfig::new([1, 1]).init(),
            program: Vec::new(),
        };
        for layer in &spec.layers {
            shape = cnn.push_layer(layer, shape, device)?;
        }
        if let Shape::Image(_) = shape {
            cnn.program.push(CnnStep::Flatten);
        }
        let classes = dim(spec.classes, "classes")?;
        cnn.program.push(CnnStep::Linear(cnn.linears.len()));
        cnn.linears
            .push(LinearConfig::new(shape.features(), classes).init(device));
        Ok(cnn)
    }

    /// Adds one layer of the spec to the stack; returns the shape after it.
    fn push_layer(
        &mut self,
        layer: &CnnLayer,
        mut shape: Shape,
        device: &B::Device,
    ) -> Result<Shape, BurnRunError> {
        match layer.op {
            CnnOp::Conv => shape = self.push_conv(layer, shape, device)?,
            CnnOp::BatchNorm => {
                let [ci, ..] = image_shape(shape, layer.op)?;
                self.program.push(CnnStep::Norm(self.norms.len()));
                self.norms.push(BatchNormConfig::new(ci).init(device));
            }
            CnnOp::Relu => self.program.push(CnnStep::Act(Act::Relu)),
            CnnOp::Gelu => self.program.push(CnnStep::Act(Act::Gelu)),
            CnnOp::Silu => self.program.push(CnnStep::Act(Act::Silu)),
            CnnOp::MaxPool | CnnOp::AvgPool => shape = self.push_pool(layer, shape)?,
            CnnOp::GlobalAvgPool => {
                let [ci, ..] = image_shape(shape, layer.op)?;
                shape = Shape::Image([ci, 1, 1]);
                self.program.push(CnnStep::GlobalAvgPool);
            }
            CnnOp::Dropout => {
                let p = layer.p.unwrap_or(0.5);
                if let Some(d) = dropout(p)? {
                    self.program.push(CnnStep::Dropout(self.dropouts.len()));
                    self.dropouts.push(d);
                }
            }
            CnnOp::Flatten => {
                if let Shape::Image(_) = shape {
                    shape = Shape::Flat(shape.features());
                    self.program.push(CnnStep::Flatten);
                }
            }
            CnnOp::Linear => {
                if let Shape::Image(_) = shape {
                    shape = Shape::Flat(shape.features());
                    self.program.push(CnnStep::Flatten);
                }
                let out = need(layer, layer.out, "out")?;
                self.program.push(CnnStep::Linear(self.linears.len()));
                self.linears.push(
                    LinearConfig::new(shape.features(), out)
                        .with_bias(layer.bias.unwrap_or(true))
                        .init(device),
                );
                shape = Shape::Flat(out);
            }
        }
        Ok(shape)
    }

    /// Adds a convolution; returns the image shape after it.
    fn push_conv(
        &mut self,
        layer: &CnnLayer,
        shape: Shape,
        device: &B::Device,
    ) -> Result<Shape, BurnRunError> {
        let [ci, hi, wi] = image_shape(shape, layer.op)?;
        let out = need(layer, layer.out, "out")?;
        let k = need(layer, layer.kernel, "kernel")?;
        let s = dim(layer.stride.unwrap_or(1), "stride")?;
        let p = layer.padding.unwrap_or(0) as usize;
        let conv = Conv2dConfig::new([ci, out], [k, k])
            .with_stride([s, s])
            .with_padding(PaddingConfig2d::Explicit(p, p, p, p))
            .with_bias(layer.bias.unwrap_or(true))
            .init(device);
        let size = |n: usize| (n + 2 * p).checked_sub(k).map(|v| v / s + 1);
        let (Some(ho), Some(wo)) = (size(hi), size(wi)) else {
            return Err(BurnRunError::Unsupported(format!(
                "conv kernel {k} larger than its padded {hi}x{wi} input"
            )));
        };
        self.program.push(CnnStep::Conv(self.convs.len()));
        self.convs.push(conv);
        Ok(Shape::Image([out, ho, wo]))
    }

    /// Adds a max or average pool; returns the image shape after it.
    fn push_pool(&mut self, layer: &CnnLayer, shape: Shape) -> Result<Shape, BurnRunError> {
        let [ci, hi, wi] = image_shape(shape, layer.op)?;
        let k = need(layer, layer.kernel, "kernel")?;
        let s = dim(layer.stride.unwrap_or(k as u64), "stride")?;
        if k > hi || k > wi {
            return Err(BurnRunError::Unsupported(format!(
                "pool kernel {k} larger than its {hi}x{wi} input"
            )));
        }
        if layer.op == CnnOp::MaxPool {
            self.program.push(CnnStep::MaxPool(self.max_pools.len()));
            self.max_pools
                .push(MaxPool2dConfig::new([k, k]).with_strides([s, s]).init());
        } else {
            self.program.push(CnnStep::AvgPool(self.avg_pools.len()));
            self.avg_pools
                .push(AvgPool2dConfig::new([k, k]).with_strides([s, s]).init());
        }
        Ok(Shape::Image([ci, (hi - k) / s + 1, (wi - k) / s + 1]))
    }

    fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 2> {
        let mut img = Some(x);
        let mut flat: Option<Tensor<B, 2>> = None;
        for step in &self.program {
            match *step {
                CnnStep::Flatten => {
                    if let Some(t) = img.take() {
                        flat = Some(t.flatten(1, 3));
                    }
                }
                CnnStep::Linear(i) => {
                    let t = match (flat.take(), img.take()) {
                        (Some(f), _) => f,
                        (None, Some(t)) => t.flatten(1, 3),
                        (None, None) => unreachable_input(),
                    };
                    flat = Some(self.linears[i].forward(t));
                }
                CnnStep::Act(a) => {
                    img = img.map(|t| a.apply(t));
                    flat = flat.map(|t| a.apply(t));
                }
                CnnStep::Dropout(i) => {
                    img = img.map(|t| self.dropouts[i].forward(t));
                    flat = flat.map(|t| self.dropouts[i].forward(t));
                }
                CnnStep::Conv(i) => img = img.map(|t| self.convs[i].forward(t)),
                CnnStep::Norm(i) => img = img.map(|t| self.norms[i].forward(t)),
                CnnStep::MaxPool(i) => img = img.map(|t| self.max_pools[i].forward(t)),
                CnnStep::AvgPool(i) => img = img.map(|t| self.avg_pools[i].forward(t)),
                CnnStep::GlobalAvgPool => img = img.map(|t| self.global_pool.forward(t)),
            }
        }
        match (flat, img) {
            (Some(f), _) => f,
            (None, Some(t)) => t.flatten(1, 3),
            (None, None) => unreachable_input(),
        }
    }
}

/// The CNN program always ends with a linear head, so an input is always present; this is the
/// (unreachable) fallback that keeps `forward` total without a panic path in normal use.
fn unreachable_input() -> ! {
    panic!("cnn program lost its input tensor (a bug in the program builder)")
}

/// A transformer encoder (or causal decoder-style stack) from burn-nn, with token and position
/// embeddings and a linear head.
#[derive(Module, Debug)]
pub struct Transformer<B: Backend> {
    tokens: Embedding<B>,
    positions: Option<Embedding<B>>,
    encoder: TransformerEncoder<B>,
    head: Linear<B>,
    #[module(skip)]
    causal: bool,
}

impl<B: Backend> Transformer<B> {
    fn new(spec: &TransformerSpec, device: &B::Device) -> Result<Transformer<B>, BurnRunError> {
        if spec.kv_head_count() != spec.heads {
            return Err(BurnRunError::Unsupported(
                "grouped-query attention (kv_heads != heads): burn-nn's encoder has none".into(),
            ));
        }
        if spec.gated_ffn {
            return Err(BurnRunError::Unsupported(
                "gated feed-forward: burn-nn's encoder has a plain two-layer feed-forward".into(),
            ));
        }
        if spec.norm != NormKind::LayerNorm {
            return Err(BurnRunError::Unsupported(
                "RMSNorm: burn-nn's encoder uses LayerNorm".into(),
            ));
        }
        if spec.attention != AttentionImpl::Eager {
            return Err(BurnRunError::Unsupported(
                "fused attention: burn-nn's encoder computes attention eagerly".into(),
            ));
        }
        if spec.tied_embeddings {
            return Err(BurnRunError::Unsupported(
                "tied embeddings are not modelled in the burn run".into(),
            ));
        }
        let hidden = dim(spec.hidden, "hidden")?;
        let heads = dim(spec.heads, "heads")?;
        if hidden % heads != 0 {
            return Err(BurnRunError::Unsupported(format!(
                "heads ({heads}) must divide hidden ({hidden})"
            )));
        }
        let act = match spec.activation {
            ActKind::Gelu => burn::nn::activation::ActivationConfig::Gelu,
            ActKind::Relu => burn::nn::activation::ActivationConfig::Relu,
            other => {
                return Err(BurnRunError::Unsupported(format!(
                    "feed-forward activation {other:?} in the burn encoder (gelu or relu)"
                )));
            }
        };
        let vocab = dim(spec.vocab, "vocab")?;
        let seq = dim(spec.seq_len, "seq_len")?;
        let causal = spec.kind == TransformerKind::Decoder;
        let classes = if causal {
            vocab
        } else {
            dim(spec.classes.unwrap_or(2), "classes")?
        };
        let encoder = TransformerEncoderConfig::new(
            hidden,
            dim(spec.ffn_size(), "ffn")?,
            heads,
            dim(spec.layers, "layers")?,
        )
        .with_dropout(spec.dropout)
        .with_norm_first(true)
        .with_activation(act)
        .init(device);
        Ok(Transformer {
            tokens: EmbeddingConfig::new(vocab, hidden).init(device),
            positions: spec
                .learned_positions
                .then(|| EmbeddingConfig::new(seq, hidden).init(device)),
            encoder,
            head: LinearConfig::new(hidden, classes).init(device),
            causal,
        })
    }

    fn forward(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 2> {
        let [batch, seq] = tokens.dims();
        let device = tokens.device();
        let mut x = self.tokens.forward(tokens);
        if let Some(pos) = &self.positions {
            let ids = Tensor::<B, 1, Int>::arange(0..seq as i64, &device)
                .reshape([1, seq])
                .repeat_dim(0, batch);
            x = x + pos.forward(ids);
        }
        let mut input = TransformerEncoderInput::new(x);
        if self.causal {
            input = input.mask_attn(burn::nn::attention::generate_autoregressive_mask(
                batch, seq, &device,
            ));
        }
        let h = self.encoder.forward(input);
        let [_, _, hidden] = h.dims();
        if self.causal {
            self.head.forward(h.reshape([batch * seq, hidden]))
        } else {
            let first: Tensor<B, 2> = h.narrow(1, 0, 1).reshape([batch, hidden]);
            self.head.forward(first)
        }
    }
}

/// A network built from a [`ModelSpec`].
///
/// One is built per run, so the size difference between the variants does not matter (and
/// burn's module derive does not see through a `Box`).
#[allow(clippy::large_enum_variant)]
#[derive(Module, Debug)]
pub enum Net<B: Backend> {
    /// A multilayer perceptron.
    Mlp(Mlp<B>),
    /// A convolutional network.
    Cnn(Cnn<B>),
    /// A transformer.
    Transformer(Transformer<B>),
}

impl<B: Backend> Net<B> {
    /// Builds the network of a spec on `device`. Parameters are lazy until
    /// [`materialize`](trainmem_track::materialize).
    pub fn from_spec(spec: &ModelSpec, device: &B::Device) -> Result<Net<B>, BurnRunError> {
        Ok(match spec {
            ModelSpec::Mlp(s) => Net::Mlp(Mlp::new(s, device)?),
            ModelSpec::Cnn(s) => Net::Cnn(Cnn::new(s, device)?),
            ModelSpec::Transformer(s) => Net::Transformer(Transformer::new(s, device)?),
            ModelSpec::Layers(_) => {
                return Err(BurnRunError::Unsupported(
                    "a raw `layers` model has no burn counterpart; use mlp, cnn or transformer"
                        .into(),
                ));
            }
        })
    }

    /// The forward pass to logits (`[batch, classes]`, or `[batch × seq, vocab]` for a
    /// decoder, or `[batch, output]` for an MLP).
    pub fn forward(&self, input: BatchInput<B>) -> Result<Tensor<B, 2>, BurnRunError> {
        match (self, input) {
            (Net::Mlp(m), BatchInput::Vector(x)) => Ok(m.forward(x)),
            (Net::Cnn(c), BatchInput::Image(x)) => Ok(c.forward(x)),
            (Net::Transformer(t), BatchInput::Tokens(x)) => Ok(t.forward(x)),
            (_, other) => Err(BurnRunError::Data(format!(
                "input {} does not fit this network",
                match other {
                    BatchInput::Vector(_) => "vector",
                    BatchInput::Image(_) => "image",
                    BatchInput::Tokens(_) => "tokens",
                }
            ))),
        }
    }

    /// Forward pass and loss of a batch: returns `(logits, loss)`.
    pub fn loss(
        &self,
        batch: Batch<B>,
        loss: Loss,
    ) -> Result<(Tensor<B, 2>, Tensor<B, 1>), BurnRunError> {
        let logits = self.forward(batch.input)?;
        let value = match (loss, batch.target) {
            (Loss::Mse, BatchTarget::Values(t)) => {
                MseLoss::new().forward(logits.clone(), t, Reduction::Mean)
            }
            (Loss::CrossEntropy, BatchTarget::Classes(t)) => CrossEntropyLossConfig::new()
                .init(&logits.device())
                .forward(logits.clone(), t),
            (l, _) => {
                return Err(BurnRunError::Data(format!(
                    "loss {l:?} does not fit the batch targets"
                )));
            }
        };
        Ok((logits, value))
    }
}

/// The shape of one example for a spec, and the loss it trains with.
pub fn example_shape(spec: &ModelSpec) -> Result<(ExampleShape, Loss), BurnRunError> {
    Ok(match spec {
        ModelSpec::Mlp(s) => {
            let input = dim(s.input, "mlp.input")?;
            let output = dim(s.output, "mlp.output")?;
            match s.loss {
                Loss::Mse => (ExampleShape::Regression { input, output }, Loss::Mse),
                Loss::CrossEntropy => (
                    ExampleShape::Classification {
                        input: vec![input],
                        classes: output,
                    },
                    Loss::CrossEntropy,
                ),
            }
        }
        ModelSpec::Cnn(s) => {
            if s.loss != Loss::CrossEntropy {
                return Err(BurnRunError::Unsupported(
                    "a cnn trains with cross-entropy in the burn run".into(),
                ));
            }
            let [c, h, w] = s.image;
            (
                ExampleShape::Classification {
                    input: vec![dim(c, "image")?, dim(h, "image")?, dim(w, "image")?],
                    classes: dim(s.classes, "classes")?,
                },
                Loss::CrossEntropy,
            )
        }
        ModelSpec::Transformer(s) => {
            let vocab = dim(s.vocab, "vocab")?;
            let decoder = s.kind == TransformerKind::Decoder;
            (
                ExampleShape::Tokens {
                    seq_len: dim(s.seq_len, "seq_len")?,
                    vocab,
                    classes: if decoder {
                        vocab
                    } else {
                        dim(s.classes.unwrap_or(2), "classes")?
                    },
                    per_position: decoder,
                },
                Loss::CrossEntropy,
            )
        }
        ModelSpec::Layers(_) => {
            return Err(BurnRunError::Unsupported(
                "a raw `layers` model has no burn counterpart".into(),
            ));
        }
    })
}

fn dim(v: u64, what: &str) -> Result<usize, BurnRunError> {
    if v == 0 {
        return Err(BurnRunError::Unsupported(format!(
            "{what} must be at least 1"
        )));
    }
    usize::try_from(v).map_err(|_| BurnRunError::Unsupported(format!("{what} = {v} is too large")))
}

fn dropout(p: f64) -> Result<Option<Dropout>, BurnRunError> {
    if !(0.0..1.0).contains(&p) {
        return Err(BurnRunError::Unsupported(format!(
            "dropout probability {p} outside [0, 1)"
        )));
    }
    Ok((p > 0.0).then(|| DropoutConfig::new(p).init()))
}

/// Like [`parameter_bytes`], without initialising lazy parameters: a parameter not yet
/// created counts its declared shape at the backend's default float element size. Also
/// returns how many parameters (float, int and bool) are still uninitialised.
pub fn lazy_parameter_bytes<B: Backend, M: Module<B>>(module: &M) -> (u64, usize) {
    use burn::tensor::Element;
    struct Count {
        bytes: u64,
        pending: usize,
    }
    impl<B: Backend> ModuleVisitor<B> for Count {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if param.is_initialized() {
                let t = param.val();
                self.bytes += (t.shape().num_elements() * t.dtype().size()) as u64;
            } else {
                self.pending += 1;
                let elem = <B::FloatElem as Element>::dtype().size();
                self.bytes += (param.lazy_shape().num_elements() * elem) as u64;
            }
        }
        fn visit_int<const D: usize>(&mut self, param: &Param<Tensor<B, D, Int>>) {
            self.pending += usize::from(!param.is_initialized());
        }
        fn visit_bool<const D: usize>(&mut self, param: &Param<Tensor<B, D, burn::tensor::Bool>>) {
            self.pending += usize::from(!param.is_initialized());
        }
    }
    let mut c = Count {
        bytes: 0,
        pending: 0,
    };
    module.visit(&mut c);
    (c.bytes, c.pending)
}

/// Bytes held by the float tensors of `module` (element count × element size of each):
/// trainable parameters and module state such as batch-norm running statistics.
pub fn parameter_bytes<B: Backend, M: Module<B>>(module: &M) -> u64 {
    struct Count(u64);
    impl<B: Backend> ModuleVisitor<B> for Count {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let t = param.val();
            self.0 += (t.shape().num_elements() * t.dtype().size()) as u64;
        }
    }
    let mut c = Count(0);
    module.visit(&mut c);
    c.0
}
