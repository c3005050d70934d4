//! A built-in LLaMA-style decoder, written with burn's modules, and one training step of it on
//! Meta: what `cargo xtask meta` and the `llama` example run at any size.

use burn::backend::Autodiff;
use burn::module::Module;
use burn::nn::{
    Embedding, EmbeddingConfig, Linear, LinearConfig, RmsNorm, RmsNormConfig, RotaryEncoding,
    RotaryEncodingConfig, SwiGlu, SwiGluConfig,
};
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::activation::{log_softmax, softmax};
use burn::tensor::backend::Backend;
use burn::tensor::{FloatDType, Int, IntDType, Tensor};
use trainmem_core::Category;
use trainmem_core::timeline::Phase;

use crate::{Meta, MetaDevice, MetaRun, predict_on};
use trainmem_track::materialize;

/// The decoder's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LlamaShape {
    /// Blocks.
    pub layers: usize,
    /// Hidden size.
    pub hidden: usize,
    /// Attention heads (they split `hidden`).
    pub heads: usize,
    /// SwiGLU inner size.
    pub ffn: usize,
    /// Tokens per sample.
    pub seq: usize,
    /// Samples per step.
    pub batch: usize,
    /// Vocabulary size.
    pub vocab: usize,
}

impl LlamaShape {
    /// LLaMA-2-7B's shape at batch 1 and sequence 2048.
    pub const LLAMA_7B: LlamaShape = LlamaShape {
        layers: 32,
        hidden: 4096,
        heads: 32,
        ffn: 11008,
        seq: 2048,
        batch: 1,
        vocab: 32000,
    };

    /// Why the shape cannot be built, if it cannot.
    pub fn check(&self) -> Result<(), String> {
        let dims = [
            self.layers,
            self.hidden,
            self.heads,
            self.ffn,
            self.seq,
            self.batch,
            self.vocab,
        ];
        if dims.contains(&0) {
            return Err("every dimension must be at least 1".into());
        }
        if !self.hidden.is_multiple_of(self.heads) {
            return Err(format!(
                "hidden {} is not a multiple of heads {}",
                self.hidden, self.heads
            ));
        }
        if !(self.hidden / self.heads).is_multiple_of(2) {
            return Err("the head size must be even (rotary positions rotate pairs)".into());
        }
        Ok(())
    }
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

/// A LLaMA-style decoder built from burn's modules: RMSNorm, rotary positions, SwiGLU, no
/// biases, an untied head.
#[derive(Module, Debug)]
pub struct Decoder<B: Backend> {
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
    /// A decoder of shape `s` on `device`.
    pub fn new(s: LlamaShape, device: &B::Device) -> Self {
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

    /// Logits for `tokens` (`[batch, seq]`).
    pub fn forward(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let mut x = self.embed.forward(tokens);
        for b in &self.blocks {
            x = x.clone() + self.attention(b, b.attn_norm.forward(x));
            x = x.clone() + b.down.forward(b.gate_up.forward(b.mlp_norm.forward(x)));
        }
        self.head.forward(self.norm.forward(x))
    }
}

/// Mean next-token cross-entropy, written with tensor ops.
pub fn loss<B: Backend>(logits: Tensor<B, 3>, targets: Tensor<B, 2, Int>) -> Tensor<B, 1> {
    let [batch, seq, vocab] = logits.dims();
    let logp = log_softmax(logits.reshape([batch * seq, vocab]), 1);
    let picked = logp.gather(1, targets.reshape([batch * seq, 1]));
    picked.mean().neg()
}

/// One AdamW training step of a decoder of shape `shape` with parameters and activations in
/// `dtype`, on a fresh Meta device: the run (timeline and peaks) and the parameter count.
pub fn predict_step(shape: LlamaShape, dtype: FloatDType) -> Result<(MetaRun, usize), String> {
    shape.check()?;
    type B = Autodiff<Meta>;
    let device = MetaDevice::new();
    burn::tensor::set_default_dtypes::<Meta>(&device, dtype, IntDType::I32)
        .map_err(|e| format!("{e:?}"))?;
    let s = shape;
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
    Ok((run, params))
}

/// The run as a table: bytes per category after each phase, then each category's peak and the
/// total peak, in GiB.
pub fn render(run: &MetaRun) -> String {
    use std::fmt::Write as _;
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "phase            parameter   gradient  optimizer  activation (GiB)"
    );
    for sample in &run.timeline.samples {
        let c = &sample.host.categories;
        let _ = writeln!(
            out,
            "{:<15} {:>10.2} {:>10.2} {:>10.2} {:>11.2}",
            sample.phase.name(),
            gib(c.get(Category::Parameter)),
            gib(c.get(Category::Gradient)),
            gib(c.get(Category::OptimizerState)),
            gib(c.get(Category::Activation)),
        );
    }
    let _ = writeln!(out, "peak per category (GiB):");
    for (category, bytes) in run.peak.iter().filter(|(_, b)| *b > 0) {
        let _ = writeln!(out, "  {:<16} {:>8.2}", category.name(), gib(bytes));
    }
    let _ = writeln!(out, "peak total (GiB): {:.2}", gib(run.total_peak));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small decoder's parameter count, worked by hand: embedding and head `vocab × hidden`
    /// each, per block 4 `hidden²` projections, 3 `hidden × ffn` SwiGLU matrices and 2 norms of
    /// `hidden`, and the final norm.
    #[test]
    fn a_small_step_counts_its_parameters_and_state() {
        let s = LlamaShape {
            layers: 2,
            hidden: 64,
            heads: 4,
            ffn: 160,
            seq: 16,
            batch: 2,
            vocab: 100,
        };
        let (run, params) = predict_step(s, FloatDType::F32).expect("runs");
        let per_block = 4 * 64 * 64 + 3 * 64 * 160 + 2 * 64;
        assert_eq!(params, 2 * 100 * 64 + 2 * per_block + 64);
        // the rotary encoding's tables (a few KiB here) are built with the parameters
        let parameter = run.peak.get(Category::Parameter);
        let rotary_bound = 4 * (s.seq * (s.hidden / s.heads)) as u64 * 4;
        assert!(
            parameter >= 4 * params as u64 && parameter <= 4 * params as u64 + rotary_bound,
            "{parameter} for {params} parameters"
        );
        assert!(run.peak.get(Category::Activation) > 0);
        // AdamW's two moments (and burn's new parameter tensors, counted with the state)
        assert!(run.peak.get(Category::OptimizerState) >= 2 * 4 * params as u64);
    }

    #[test]
    fn shapes_that_cannot_be_built_are_refused() {
        let mut s = LlamaShape::LLAMA_7B;
        s.heads = 3;
        assert!(
            predict_step(s, FloatDType::F32)
                .unwrap_err()
                .contains("multiple of heads")
        );
        s.heads = 32;
        s.seq = 0;
        assert!(
            predict_step(s, FloatDType::F32)
                .unwrap_err()
                .contains("at least 1")
        );
    }
}
