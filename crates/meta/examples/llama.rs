//! A LLaMA-style decoder written with burn's modules, trained for one AdamW step on Meta.
//!
//! ```text
//! cargo run -p trainmem-meta --release --example llama -- [f32|bf16] [layers] [hidden] [heads] [ffn] [seq] [batch] [vocab]
//! ```
//!
//! Defaults are LLaMA-7B's shape (32 layers, hidden 4096, 32 heads, ffn 11008, sequence 2048,
//! batch 1, vocabulary 32000). Prints the parameter count, the per-category peaks and the bytes
//! after each phase, the wall time and the process's peak resident memory.

use std::time::Instant;

use burn::backend::Autodiff;
use burn::module::Module;
use burn::nn::{
    Embedding, EmbeddingConfig, Linear, LinearConfig, RmsNorm, RmsNormConfig, RotaryEncoding,
    RotaryEncodingConfig, SwiGlu, SwiGluConfig,
};
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::activation::{log_softmax, softmax};
use burn::tensor::backend::Backend;
use burn::tensor::{DType, FloatDType, Int, IntDType, Tensor};
use trainmem_core::Category;
use trainmem_core::timeline::Phase;
use trainmem_meta::{Meta, MetaDevice, materialize, predict_on};

/// The decoder's shape.
#[derive(Debug, Clone, Copy)]
struct Shape {
    layers: usize,
    hidden: usize,
    heads: usize,
    ffn: usize,
    seq: usize,
    batch: usize,
    vocab: usize,
}

#[derive(Module, Debug)]
struct Block<B: Backend> {
    attn_norm: RmsNorm<B>,
    q: Linear<B>,
    k: Linear<B>,
    v: Linear<B>,
    o: Linear<B>,
    mlp_norm: RmsNorm<B>,
    gate_up: SwiGlu<B>,
    down: Linear<B>,
}

#[derive(Module, Debug)]
struct Decoder<B: Backend> {
    embed: Embedding<B>,
    blocks: Vec<Block<B>>,
    norm: RmsNorm<B>,
    head: Linear<B>,
    rope: RotaryEncoding<B>,
    heads: usize,
}

fn linear<B: Backend>(d_in: usize, d_out: usize, device: &B::Device) -> Linear<B> {
    LinearConfig::new(d_in, d_out).with_bias(false).init(device)
}

impl<B: Backend> Decoder<B> {
    fn new(s: Shape, device: &B::Device) -> Self {
        let block = || Block {
            attn_norm: RmsNormConfig::new(s.hidden).init(device),
            q: linear(s.hidden, s.hidden, device),
            k: linear(s.hidden, s.hidden, device),
            v: linear(s.hidden, s.hidden, device),
            o: linear(s.hidden, s.hidden, device),
            mlp_norm: RmsNormConfig::new(s.hidden).init(device),
            gate_up: SwiGluConfig::new(s.hidden, s.ffn)
                .with_bias(false)
                .init(device),
            down: linear(s.ffn, s.hidden, device),
        };
        Decoder {
            embed: EmbeddingConfig::new(s.vocab, s.hidden).init(device),
            blocks: (0..s.layers).map(|_| block()).collect(),
            norm: RmsNormConfig::new(s.hidden).init(device),
            head: linear(s.hidden, s.vocab, device),
            rope: RotaryEncodingConfig::new(s.seq, s.hidden / s.heads).init(device),
            heads: s.heads,
        }
    }

    fn attention(&self, b: &Block<B>, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let [batch, seq, hidden] = x.dims();
        let head_dim = hidden / self.heads;
        let split = |t: Tensor<B, 3>| {
            t.reshape([batch, seq, self.heads, head_dim])
                .swap_dims(1, 2)
        };
        let q = self.rope.forward(split(b.q.forward(x.clone())));
        let k = self.rope.forward(split(b.k.forward(x.clone())));
        let v = split(b.v.forward(x));
        let scores = q
            .matmul(k.swap_dims(2, 3))
            .div_scalar((head_dim as f64).sqrt());
        let causal = Tensor::<B, 2>::ones([seq, seq], &scores.device())
            .triu(1)
            .bool()
            .unsqueeze::<4>();
        let scores = scores.mask_fill(causal, f32::NEG_INFINITY);
        let out = softmax(scores, 3).matmul(v);
        b.o.forward(out.swap_dims(1, 2).reshape([batch, seq, hidden]))
    }

    fn forward(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let mut x = self.embed.forward(tokens);
        for b in &self.blocks {
            x = x.clone() + self.attention(b, b.attn_norm.forward(x));
            x = x.clone() + b.down.forward(b.gate_up.forward(b.mlp_norm.forward(x)));
        }
        self.head.forward(self.norm.forward(x))
    }
}

/// Mean next-token cross-entropy, written with tensor ops.
fn loss<B: Backend>(logits: Tensor<B, 3>, targets: Tensor<B, 2, Int>) -> Tensor<B, 1> {
    let [batch, seq, vocab] = logits.dims();
    let logp = log_softmax(logits.reshape([batch * seq, vocab]), 1);
    let picked = logp.gather(1, targets.reshape([batch * seq, 1]));
    picked.mean().neg()
}

fn parse(args: &[String]) -> Result<(FloatDType, Shape), String> {
    let dtype = match args.first().map(String::as_str) {
        None | Some("f32") => FloatDType::F32,
        Some("bf16") => FloatDType::BF16,
        Some(other) => return Err(format!("unknown dtype `{other}` (f32 or bf16)")),
    };
    let defaults = [32, 4096, 32, 11008, 2048, 1, 32000];
    let mut v = defaults;
    for (i, slot) in v.iter_mut().enumerate() {
        if let Some(text) = args.get(i + 1) {
            *slot = text
                .parse()
                .map_err(|_| format!("argument {} is not a number: `{text}`", i + 2))?;
        }
    }
    let shape = Shape {
        layers: v[0],
        hidden: v[1],
        heads: v[2],
        ffn: v[3],
        seq: v[4],
        batch: v[5],
        vocab: v[6],
    };
    if shape.heads == 0 || !shape.hidden.is_multiple_of(shape.heads) {
        return Err("hidden must be a multiple of heads".into());
    }
    Ok((dtype, shape))
}

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (dtype, s) = parse(&args)?;
    type B = Autodiff<Meta>;
    let device = MetaDevice::new();
    burn::tensor::set_default_dtypes::<Meta>(&device, dtype, IntDType::I32)
        .map_err(|e| format!("{e:?}"))?;
    let started = Instant::now();
    let mut params = 0;
    let run = predict_on("llama", device, |rec| {
        let model = rec.phase(Phase::ModelInit, Category::Parameter, || {
            let model = Decoder::<B>::new(s, &device);
            materialize(&model);
            model
        });
        params = model.num_params();
        let mut optim = AdamWConfig::new().init();
        let (tokens, targets) = rec.phase(Phase::BatchLoaded, Category::Input, || {
            let ids = |_| Tensor::<B, 2, Int>::zeros([s.batch, s.seq], &device);
            (ids(0), ids(1))
        });
        let loss = rec.phase(Phase::Forward, Category::Activation, || {
            loss(model.forward(tokens), targets)
        });
        let grads = rec.phase(Phase::Backward, Category::Gradient, || {
            GradientsParams::from_grads(loss.backward(), &model)
        });
        let model = rec.phase(Phase::OptimizerStep, Category::OptimizerState, || {
            optim.step(1e-4, model, grads)
        });
        drop((model, optim));
        rec.sample(Phase::End);
    });
    let elapsed = started.elapsed();
    let rss = trainmem_probe::rss::read().map_err(|e| e.to_string())?;
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let float = DType::from(dtype);
    println!("LLaMA-style decoder {s:?}, {float:?}: {params} parameters");
    println!("phase            parameter   gradient  optimizer  activation (GiB)");
    for sample in &run.timeline.samples {
        let c = &sample.host.categories;
        println!(
            "{:<15} {:>10.2} {:>10.2} {:>10.2} {:>11.2}",
            sample.phase.name(),
            gib(c.get(Category::Parameter)),
            gib(c.get(Category::Gradient)),
            gib(c.get(Category::OptimizerState)),
            gib(c.get(Category::Activation)),
        );
    }
    println!("peak per category (GiB):");
    for (category, bytes) in run.peak.iter().filter(|(_, b)| *b > 0) {
        println!("  {:<16} {:>8.2}", category.name(), gib(bytes));
    }
    println!("peak total (GiB): {:.2}", gib(run.total_peak));
    println!(
        "step on Meta: {:.2} s wall, peak RSS (VmHWM) {:.1} MiB",
        elapsed.as_secs_f64(),
        rss.vm_hwm as f64 / (1u64 << 20) as f64
    );
    Ok(())
}
