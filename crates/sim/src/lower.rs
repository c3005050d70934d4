//! Lowering: a [`ModelSpec`] becomes an autograd [`Program`] (values per sample, ops, layers,
//! parameters). Built once per plan; the simulator runs it every step.
//!
//! Every size is checked: a model whose size per sample does not fit 64 bits is a
//! [`LowerError`] naming the size and its factors, and [`lower_plan`] checks every tensor of
//! the plan's micro-batch (its elements and bytes, what each op saves, the parameters' bytes)
//! the same way, so a plan it lowers never overflows when it is simulated.

use trainmem_autograd::{Program, ProgramBuilder, ValueDtype, ValueId};

use trainmem_core::{Dtype, Framework, OpKind};

use crate::profile::{FrameworkProfile, Lowering};
use trainmem_core::model::*;
use trainmem_core::model_check::{Shape, check_layers, cnn_shapes, layer_out};

pub(crate) mod lora;
mod transformer;

/// Errors lowering a model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct LowerError(pub String);

/// The product of `factors`, or an overflow naming `what` and the factors.
pub(crate) fn product(factors: &[u64], what: &str) -> Result<u64, LowerError> {
    factors
        .iter()
        .try_fold(1u64, |acc, &f| acc.checked_mul(f))
        .ok_or_else(|| overflow(factors, " × ", what))
}

/// The sum of `terms`, or an overflow naming `what` and the terms.
pub(crate) fn sum(terms: &[u64], what: &str) -> Result<u64, LowerError> {
    terms
        .iter()
        .try_fold(0u64, |acc, &t| acc.checked_add(t))
        .ok_or_else(|| overflow(terms, " + ", what))
}

fn overflow(figures: &[u64], op: &str, what: &str) -> LowerError {
    let shown: Vec<String> = figures.iter().map(u64::to_string).collect();
    LowerError(format!(
        "{what}: {} overflows a 64-bit count",
        shown.join(op)
    ))
}

/// Activation `a` over `x` (`n` elements): one op, or for [`Activation::GeluNew`] the
/// element-wise ops it is composed of, each saving what its backward reads.
fn activation(b: &mut ProgramBuilder, a: Activation, x: ValueId, n: u64) -> ValueId {
    let one = |b: &mut ProgramBuilder, kind| b.op(kind, &[x], n, &[]);
    match a {
        Activation::Relu => one(b, OpKind::Relu),
        Activation::Gelu => one(b, OpKind::Gelu),
        Activation::Silu => one(b, OpKind::Silu),
        Activation::Tanh => one(b, OpKind::Tanh),
        Activation::Sigmoid => one(b, OpKind::Sigmoid),
        Activation::GeluNew => {
            // x³ (pow keeps x; lowered as `x · x`, the one `mul` of a value by itself,
            // which autocast reads as `pow`), · 0.044715, x + ·, · √(2/π), tanh (keeps its
            // output), 1 + ·, 0.5 · x, and the product (keeps both factors)
            let cube = b.op(OpKind::Mul, &[x, x], n, &[]);
            let scaled = b.op(OpKind::Scale, &[cube], n, &[]);
            let inner = b.op(OpKind::Add, &[x, scaled], n, &[]);
            let arg = b.op(OpKind::Scale, &[inner], n, &[]);
            let t = b.op(OpKind::Tanh, &[arg], n, &[]);
            let one_plus = b.op(OpKind::Scale, &[t], n, &[]);
            let half = b.op(OpKind::Scale, &[x], n, &[]);
            b.op(OpKind::Mul, &[half, one_plus], n, &[])
        }
    }
}

/// Bytes of one sample's model input as the device receives it (features as f32, token ids
/// as i64), plus its target.
pub fn input_bytes_per_sample(model: &ModelSpec) -> u64 {
    input_bytes_per_sample_for(model, Framework::Pytorch)
}

/// The element type of integer tensors (token ids, class targets) under `framework` (its
/// profile's [`Lowering::int_dtype`]: `int64` under PyTorch, `i32` under burn on Flex).
pub fn int_dtype(framework: Framework) -> Dtype {
    FrameworkProfile::of(framework).lowering.int_dtype
}

/// [`input_bytes_per_sample`] under `framework`: token ids take [`int_dtype`] (under burn
/// the synthetic token source's host values are `f32` and its tensors `i32`: 4 bytes
/// either way).
///
/// Saturates at `u64::MAX` when the bytes do not fit 64 bits (a validated plan's do:
/// [`checked_input_bytes_per_sample_for`] says when).
pub fn input_bytes_per_sample_for(model: &ModelSpec, framework: Framework) -> u64 {
    checked_input_bytes_per_sample_for(model, framework).unwrap_or(u64::MAX)
}

/// [`input_bytes_per_sample_for`], `None` when the bytes do not fit 64 bits.
pub fn checked_input_bytes_per_sample_for(model: &ModelSpec, framework: Framework) -> Option<u64> {
    let id = int_dtype(framework).size();
    let elems = |shape: &[u64]| shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d));
    match model {
        ModelSpec::Mlp(m) => m
            .input
            .checked_mul(4)?
            .checked_add(target_bytes(m.loss, m.output)?),
        ModelSpec::Cnn(c) => elems(&c.image)?
            .checked_mul(4)?
            .checked_add(target_bytes(c.loss, c.classes)?),
        ModelSpec::Transformer(t) => {
            let tokens = t.seq_len.checked_mul(id)?;
            tokens.checked_add(match t.kind {
                TransformerKind::Decoder => tokens,
                TransformerKind::Encoder => id,
            })
        }
        ModelSpec::Layers(l) => elems(&l.input)?.checked_mul(4),
    }
}

fn target_bytes(loss: Loss, outputs: u64) -> Option<u64> {
    match loss {
        Loss::Mse => outputs.checked_mul(4),
        Loss::CrossEntropy => Some(8),
    }
}

/// Adds the loss. Value targets take the layout's [`Lowering::value_target`] dtype, class
/// targets its [`Lowering::int_dtype`].
fn add_loss(b: &mut ProgramBuilder, loss: Loss, logits: ValueId, outputs: u64, layout: &Lowering) {
    let target = match loss {
        Loss::Mse => b.input(outputs, layout.value_target),
        Loss::CrossEntropy => b.input(1, ValueDtype::Fixed(layout.int_dtype)),
    };
    let kind = match loss {
        Loss::Mse => OpKind::MseLoss,
        Loss::CrossEntropy => OpKind::CrossEntropy,
    };
    b.loss(kind, &[logits, target]);
}

/// Lowers a model to a program (PyTorch's module layout).
pub fn lower(model: &ModelSpec) -> Result<Program, LowerError> {
    lower_for(model, Framework::Pytorch)
}

/// Lowers a model to a program with the module layout of `framework`: its profile's
/// [`Lowering`] (integer and value-target dtypes, a transformer's final norm and head bias),
/// on a GPU (a plan's default device: what [`AttentionImpl::Sdpa`] runs there).
pub fn lower_for(model: &ModelSpec, framework: Framework) -> Result<Program, LowerError> {
    lower_on(model, framework, true)
}

/// [`lower_for`] on a GPU (`gpu`) or a CPU device: the attention kernel `sdpa` takes
/// depends on it ([`AttentionImpl::kernel`]).
pub fn lower_on(model: &ModelSpec, framework: Framework, gpu: bool) -> Result<Program, LowerError> {
    lower_in(model, framework, gpu, false)
}

/// [`lower_on`] with the attention's precision: `f32_attention` when the queries are f32
/// (no autocast, an f32 model), which decides SDPA's kernel on a GPU
/// ([`AttentionImpl::kernel`]).
pub fn lower_in(
    model: &ModelSpec,
    framework: Framework,
    gpu: bool,
    f32_attention: bool,
) -> Result<Program, LowerError> {
    let layout = &FrameworkProfile::of(framework).lowering;
    let built = |p: Result<Program, trainmem_autograd::ProgramError>| {
        p.map_err(|e| LowerError(e.to_string()))
    };
    let p = match model {
        ModelSpec::Mlp(m) => built(lower_mlp(m, layout)?),
        ModelSpec::Cnn(c) => built(lower_cnn(c, layout)?),
        ModelSpec::Transformer(t) => transformer::lower_transformer(t, layout, gpu, f32_attention),
        ModelSpec::Layers(l) => built(lower_layers(l, layout)?),
    };
    #[cfg(test)]
    if let Ok(p) = &p {
        LOWERED_LAYERS.with(|n| n.set(n.get() + p.layers.len() as u64));
    }
    p
}

/// Lowers a plan's model under its framework and precision: under `precision.autocast`, the
/// program as `torch.autocast` runs it on the plan's device ([`crate::autocast`]).
///
/// Every size of the plan's run is checked ([`check_plan_sizes`]): a plan whose parameters,
/// micro-batch or any tensor of a step does not fit a 64-bit byte count is an error naming
/// it and the plan's figures, never an overflow in the simulation.
pub fn lower_plan(plan: &trainmem_core::plan::Plan) -> Result<Program, LowerError> {
    let gpu = plan.device.kind == trainmem_core::plan::DeviceKind::Cuda;
    let Some(half) = plan.precision.autocast else {
        let f32_attention = plan.precision.compute == Dtype::F32;
        let program = lower_in(&plan.model, plan.framework, gpu, f32_attention)?;
        check_param_sizes(&program)?;
        // a model cast to half precision: PyTorch's kernels and `transformers`' modules
        // still take some tensors to f32
        let compute = plan.precision.compute;
        let program = if plan.framework == Framework::Pytorch
            && compute != Dtype::F32
            && matches!(plan.model, ModelSpec::Transformer(_))
        {
            crate::autocast::cast_model(
                &program,
                plan.device.kind,
                compute,
                crate::autocast::ModelCode::of(&plan.model),
            )
        } else {
            program
        };
        check_plan_sizes(plan, &program)?;
        return Ok(program);
    };
    let program = lower_on(&plan.model, plan.framework, gpu)?;
    check_param_sizes(&program)?;
    let program = crate::autocast::apply(
        &program,
        plan.device.kind,
        half,
        crate::autocast::ModelCode::of(&plan.model),
    );
    check_plan_sizes(plan, &program)?;
    Ok(program)
}

/// Most bytes one parameter element takes in the model state (8-byte parameters, a master
/// copy and three state buffers), as the model-state check counts them.
const STATE_BYTES_PER_ELEM: u64 = 32;

/// Checks that every parameter tensor, and all of them together, fit a 64-bit byte count at
/// [`STATE_BYTES_PER_ELEM`] bytes an element (what the model state, its half-precision
/// copies and the parameters' gradients are counted from).
fn check_param_sizes(program: &Program) -> Result<(), LowerError> {
    let limit = u64::MAX / STATE_BYTES_PER_ELEM;
    if let Some(p) = program.params.iter().find(|p| p.elems > limit) {
        return Err(LowerError(format!(
            "the parameter `{}` of {} elements overflows a 64-bit byte count (up to \
             {STATE_BYTES_PER_ELEM} bytes an element with its gradient and optimizer state); \
             is a size mistyped?",
            p.name, p.elems
        )));
    }
    match program.checked_param_elems() {
        Some(total) if total <= limit => Ok(()),
        total => Err(LowerError(format!(
            "the model's {} parameter elements in {} tensors overflow a 64-bit byte count (up \
             to {STATE_BYTES_PER_ELEM} bytes an element with their gradients and optimizer \
             state); is a size mistyped?",
            total.map_or_else(|| "more than 2^64".to_string(), |t| t.to_string()),
            program.params.len()
        ))),
    }
}

/// Checks that every size of `plan`'s run of `program` fits 64 bits: the micro-batch's
/// input bytes, and each tensor a step makes at the plan's micro-batch and its largest size
/// factor (`1 + data.size_variation`): values, what each op saves by the framework's
/// tables, parameter gradients ([`trainmem_autograd::Graph::check_sizes`]).
pub fn check_plan_sizes(
    plan: &trainmem_core::plan::Plan,
    program: &Program,
) -> Result<(), LowerError> {
    let micro = plan.micro_batch_size();
    let variation = plan.data.size_variation;
    let scale = if variation > 0.0 {
        1.0 + variation
    } else {
        1.0
    };
    let figures = match &plan.model {
        ModelSpec::Transformer(t) => format!("micro-batch {micro}, seq_len {}", t.seq_len),
        _ => format!("micro-batch {micro}"),
    };
    let at_scale = if scale == 1.0 {
        String::new()
    } else {
        format!(", size factor up to {scale}")
    };
    let fail = |what: String| {
        LowerError(format!(
            "a step of the plan ({figures}{at_scale}) overflows 64 bits: {what}; is the batch \
             size or a model size mistyped?"
        ))
    };
    let per_sample = checked_input_bytes_per_sample_for(&plan.model, plan.framework)
        .ok_or_else(|| fail("the bytes of one sample's input overflow a 64-bit count".into()))?;
    if per_sample.checked_mul(micro).is_none() {
        return Err(fail(format!(
            "the micro-batch's input: {per_sample} bytes per sample × {micro} samples \
             overflows a 64-bit byte count"
        )));
    }
    let profile = FrameworkProfile::for_plan(plan);
    let table = profile.saved_table_on(plan.device.kind);
    let mut graph = trainmem_autograd::Graph::new(program, &table, plan.precision.compute);
    if plan.checkpointing.policy != trainmem_core::plan::CheckpointPolicyKind::None
        && profile.autograd.checkpointing == crate::profile::Checkpointing::Balanced
    {
        graph.set_op_tables(trainmem_autograd::checkpoint::burn_balanced_tables(
            program, &table,
        ));
    }
    graph
        .check_sizes(micro, scale)
        .map_err(|e| fail(e.to_string()))
}

#[cfg(test)]
thread_local! {
    /// Layers lowered on this thread (tests check what is never lowered).
    pub(crate) static LOWERED_LAYERS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

fn lower_mlp(
    m: &MlpSpec,
    layout: &Lowering,
) -> Result<Result<Program, trainmem_autograd::ProgramError>, LowerError> {
    let mut b = ProgramBuilder::new();
    let mut x = b.input(m.input, ValueDtype::Compute);
    let mut width = m.input;
    for (i, &h) in m.hidden.iter().enumerate() {
        b.begin_block(format!("fc{i}"));
        let w = b.param(
            product(&[width, h], "an MLP layer's weight (in × out)")?,
            format!("fc{i}.weight"),
        );
        let mut ps = vec![w];
        if m.bias {
            ps.push(b.param(h, format!("fc{i}.bias")));
        }
        x = b.op(OpKind::Linear, &[x], h, &ps);
        x = activation(&mut b, m.activation, x, h);
        if m.dropout > 0.0 {
            x = b.op(OpKind::Dropout, &[x], h, &[]);
        }
        width = h;
    }
    b.begin_layer("head");
    let w = b.param(
        product(&[width, m.output], "the MLP head's weight (in × outputs)")?,
        "head.weight",
    );
    let mut ps = vec![w];
    if m.bias {
        ps.push(b.param(m.output, "head.bias"));
    }
    let out = b.op(OpKind::Linear, &[x], m.output, &ps);
    add_loss(&mut b, m.loss, out, m.output, layout);
    Ok(b.finish())
}

fn lower_cnn(
    c: &CnnSpec,
    layout: &Lowering,
) -> Result<Result<Program, trainmem_autograd::ProgramError>, LowerError> {
    let shapes = cnn_shapes(c).map_err(LowerError)?;
    let mut b = ProgramBuilder::new();
    let mut x = b.input(
        product(&c.image, "the image (channels × height × width)")?,
        ValueDtype::Compute,
    );
    let mut shape = Shape::Image(c.image[0], c.image[1], c.image[2]);
    for (i, (l, &next)) in c.layers.iter().zip(&shapes).enumerate() {
        b.begin_block(format!("{i}.{:?}", l.op).to_lowercase());
        let out = shape_elems(next, i)?;
        x = match l.op {
            CnnOp::Conv => {
                let (cin, k) = match shape {
                    Shape::Image(ch, _, _) => (ch, l.kernel.unwrap_or(1)),
                    Shape::Flat(_) => unreachable!("checked by cnn_shapes"),
                };
                let o = l.out.unwrap_or(1);
                let weight = product(
                    &[o, cin, k, k],
                    "a convolution's weight (out × in × kernel²)",
                )?;
                let mut ps = vec![b.param(weight, format!("{i}.conv.weight"))];
                if l.bias.unwrap_or(true) {
                    ps.push(b.param(o, format!("{i}.conv.bias")));
                }
                b.op(OpKind::Conv2d, &[x], out, &ps)
            }
            CnnOp::BatchNorm => {
                let ch = match shape {
                    Shape::Image(ch, _, _) => ch,
                    Shape::Flat(f) => f,
                };
                let w = b.param(ch, format!("{i}.bn.weight"));
                let bias = b.param(ch, format!("{i}.bn.bias"));
                b.op_full(
                    OpKind::BatchNorm,
                    &[x],
                    out,
                    0,
                    ValueDtype::Compute,
                    &[w, bias],
                    0,
                    ch,
                )
            }
            CnnOp::Relu => b.op(OpKind::Relu, &[x], out, &[]),
            CnnOp::Gelu => b.op(OpKind::Gelu, &[x], out, &[]),
            CnnOp::Silu => b.op(OpKind::Silu, &[x], out, &[]),
            CnnOp::MaxPool => b.op(OpKind::MaxPool2d, &[x], out, &[]),
            CnnOp::AvgPool => b.op(OpKind::AvgPool2d, &[x], out, &[]),
            CnnOp::GlobalAvgPool => b.op(OpKind::GlobalAvgPool, &[x], out, &[]),
            CnnOp::Dropout => b.op(OpKind::Dropout, &[x], out, &[]),
            CnnOp::Flatten => b.op(OpKind::View, &[x], out, &[]),
            CnnOp::Linear => {
                let fin = shape_elems(shape, i)?;
                if let Shape::Image(..) = shape {
                    x = b.op(OpKind::View, &[x], fin, &[]);
                }
                let weight = product(&[fin, out], "a linear layer's weight (in × out)")?;
                let mut ps = vec![b.param(weight, format!("{i}.linear.weight"))];
                if l.bias.unwrap_or(true) {
                    ps.push(b.param(out, format!("{i}.linear.bias")));
                }
                b.op(OpKind::Linear, &[x], out, &ps)
            }
        };
        shape = next;
    }
    b.begin_layer("head");
    let fin = shape_elems(shape, c.layers.len())?;
    if let Shape::Image(..) = shape {
        x = b.op(OpKind::View, &[x], fin, &[]);
    }
    let w = b.param(
        product(&[fin, c.classes], "the CNN head's weight (in × classes)")?,
        "head.weight",
    );
    let bias = b.param(c.classes, "head.bias");
    let logits = b.op(OpKind::Linear, &[x], c.classes, &[w, bias]);
    add_loss(&mut b, c.loss, logits, c.classes, layout);
    Ok(b.finish())
}

/// Elements per sample of a CNN's activation `shape` after layer `i`, checked.
fn shape_elems(shape: Shape, i: usize) -> Result<u64, LowerError> {
    match shape {
        Shape::Image(c, h, w) => product(
            &[c, h, w],
            &format!("the activation after CNN layer {i} (channels × height × width)"),
        ),
        Shape::Flat(f) => Ok(f),
    }
}

fn lower_layers(
    l: &LayersSpec,
    layout: &Lowering,
) -> Result<Result<Program, trainmem_autograd::ProgramError>, LowerError> {
    check_layers(l).map_err(LowerError)?;
    let mut b = ProgramBuilder::new();
    let mut x = b.input(
        product(&l.input, "the input's elements per sample")?,
        ValueDtype::Compute,
    );
    let mut outs: Vec<ValueId> = Vec::new();
    for (i, layer) in l.layers.iter().enumerate() {
        let kind = OpKind::from_name(&layer.op).expect("checked");
        let name = layer
            .name
            .clone()
            .unwrap_or_else(|| format!("{i}.{}", layer.op));
        b.begin_block(name.clone());
        let ps: Vec<_> = layer
            .params
            .iter()
            .enumerate()
            .map(|(j, &e)| b.param(e, format!("{name}.p{j}")))
            .collect();
        let out = layer_out(l, i);
        let first = layer.from.map_or(x, |f| outs[f]);
        let inputs: Vec<ValueId> = if kind.arity() == 2 {
            vec![first, layer.with.map_or(first, |w| outs[w])]
        } else {
            vec![first]
        };
        // a batch norm's statistics are per channel: as many as its weight has elements
        let channels = match (kind, layer.params.first()) {
            (OpKind::BatchNorm, Some(&c)) => c,
            _ => 0,
        };
        x = b.op_full(kind, &inputs, out, 0, ValueDtype::Compute, &ps, 0, channels);
        outs.push(x);
    }
    b.begin_layer("loss");
    let out = layer_out(l, l.layers.len() - 1);
    add_loss(&mut b, l.loss, x, out, layout);
    Ok(b.finish())
}

/// Splits a program into `stages` consecutive pipeline stages with balanced block counts.
/// Values crossing a stage boundary become inputs of the later stage (keeping their
/// `requires_grad`, so backward produces the gradient sent back); each stage but the last
/// starts backward from its output.
pub fn split_stages(program: &Program, stages: u64) -> Result<Vec<Program>, LowerError> {
    let n_layers = program.layers.len();
    let blocks: Vec<usize> = (0..n_layers)
        .filter(|&l| program.checkpointable[l])
        .collect();
    if (blocks.len() as u64) < stages {
        return Err(LowerError(format!(
            "{stages} pipeline stages need at least {stages} repeated blocks; the model has {}",
            blocks.len()
        )));
    }
    let per = (blocks.len() as u64).div_ceil(stages) as usize;
    // layer index where each stage after the first begins
    let mut cuts = Vec::new();
    for s in 1..stages as usize {
        cuts.push(blocks[(s * per).min(blocks.len() - 1)]);
    }
    let mut bounds = vec![0];
    bounds.extend(cuts);
    bounds.push(n_layers);
    bounds.dedup();
    Ok(bounds
        .windows(2)
        .map(|w| slice(program, w[0], w[1]))
        .collect())
}

fn slice(p: &Program, l0: usize, l1: usize) -> Program {
    use std::collections::HashMap;
    let (o0, o1) = (p.layers[l0].0 as usize, p.layers[l1 - 1].1 as usize);
    let mut out = Program::default();
    let mut vmap: HashMap<ValueId, ValueId> = HashMap::new();
    let mut pmap: HashMap<u32, u32> = HashMap::new();
    let mut map_value = |out: &mut Program, v: ValueId, as_input: bool| -> ValueId {
        *vmap.entry(v).or_insert_with(|| {
            out.values.push(p.values[v as usize]);
            let id = (out.values.len() - 1) as ValueId;
            if as_input {
                out.inputs.push(id);
            }
            id
        })
    };
    for op in &p.ops[o0..o1] {
        let mut new = *op;
        for k in 0..op.arity as usize {
            new.inputs[k] = map_value(&mut out, op.inputs[k], true);
        }
        new.output = map_value(&mut out, op.output, false);
        new.params_start = out.op_params.len() as u32;
        for &pid in p.params_of(op) {
            let np = *pmap.entry(pid).or_insert_with(|| {
                let mut info = p.params[pid as usize].clone();
                info.layer -= l0 as u32;
                out.params.push(info);
                (out.params.len() - 1) as u32
            });
            out.op_params.push(np);
        }
        new.layer -= l0 as u32;
        out.ops.push(new);
    }
    for l in l0..l1 {
        let (s, e) = p.layers[l];
        out.layers.push((s - o0 as u32, e - o0 as u32));
        out.layer_names.push(p.layer_names[l].clone());
        out.checkpointable.push(p.checkpointable[l]);
    }
    // what autocast added per op and per parameter, renumbered into the stage
    let in_stage = |op: u32| (o0 as u32..o1 as u32).contains(&op);
    out.extra_saved = p
        .extra_saved
        .iter()
        .filter(|(op, _)| in_stage(*op))
        .map(|&(op, s)| (op - o0 as u32, s))
        .collect();
    out.forward_cache = p
        .forward_cache
        .iter()
        .filter(|(op, _)| in_stage(*op))
        .map(|&(op, b)| (op - o0 as u32, b))
        .collect();
    if !p.param_grad_scratch.is_empty() {
        out.param_grad_scratch = vec![0; out.params.len()];
        for (&old, &new) in &pmap {
            out.param_grad_scratch[new as usize] = p.param_grad_scratch[old as usize];
        }
    }
    out.loss = match p.loss {
        Some(l) if vmap.contains_key(&l) => vmap.get(&l).copied(),
        _ => out.ops.last().map(|o| o.output),
    };
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use trainmem_core::model_check::check_cnn;

    fn gpt(layers: u64, h: u64, heads: u64, s: u64, vocab: u64) -> TransformerSpec {
        TransformerSpec {
            tied_embeddings: true,
            dropout: 0.1,
            learned_positions: true,
            ..TransformerSpec::new(TransformerKind::Decoder, layers, h, heads, s, vocab)
        }
    }

    /// The model of a plan in the workspace's `fixtures/plans/`.
    fn fixture_model(name: &str) -> ModelSpec {
        let path = format!(
            "{}/../../fixtures/plans/{name}.toml",
            env!("CARGO_MANIFEST_DIR")
        );
        trainmem_core::plan::Plan::load(&path)
            .unwrap_or_else(|e| panic!("{e}"))
            .model
    }

    /// The copies `t`'s lowering keeps for backward beyond the saved-tensor table (a copy
    /// whose output is saved: the key/value cache's copies, a mask's bias), by elements per
    /// sample, in program order.
    fn kept_copies(t: &TransformerSpec) -> Vec<u64> {
        let p = lower(&ModelSpec::Transformer(t.clone())).expect("lowers");
        p.extra_saved
            .iter()
            .filter(|(at, s)| {
                *s == trainmem_autograd::Saved::Output && p.ops[*at as usize].kind == OpKind::Copy
            })
            .map(|(at, _)| p.values[p.ops[*at as usize].output as usize].per_sample)
            .collect()
    }

    /// GPT-2 small, as Hugging Face counts it: 124,439,808 parameters.
    const GPT2_SMALL_PARAMS: u64 = 124_439_808;

    /// LLaMA-7B, as Meta's checkpoint counts it: 6,738,415,616 parameters.
    const LLAMA_7B_PARAMS: u64 = 6_738_415_616;

    #[test]
    fn a_fused_kernel_keeps_the_key_value_cache_copies_beside_a_packed_projection() {
        // GPT-2's layout: packed projection, learned positions, no dropout (SDPA fused)
        let mut t = gpt(2, 64, 4, 32, 100);
        t.dropout = 0.0;
        t.attention = AttentionImpl::Sdpa;
        // what each block keeps beyond the table: copies of its keys and values (two of the
        // packed projection's three parts) per token
        let cache_copies = kept_copies;
        assert_eq!(cache_copies(&t), vec![32 * 2 * 64; 2]);
        // no cache (`use_cache = false`), or a hand-written model: none
        t.kv_cache = Some(false);
        assert!(cache_copies(&t).is_empty());
        t.kv_cache = None;
        t.implementation = Implementation::Handwritten;
        assert!(cache_copies(&t).is_empty());
        t.implementation = Implementation::Transformers;
        // rotary positions (the rotated queries are new tensors) or three projections (the
        // copies replace the projections' own outputs): nothing more is kept
        t.learned_positions = false;
        assert!(cache_copies(&t).is_empty());
        t.learned_positions = true;
        t.separate_qkv = true;
        assert!(cache_copies(&t).is_empty());
        t.separate_qkv = false;
        // eager attention's matmuls copy their operands anyway: the table has them
        t.attention = AttentionImpl::Eager;
        assert!(cache_copies(&t).is_empty());
    }

    #[test]
    fn a_fused_kernel_keeps_a_mask_bias_and_copies_a_head_major_output_back() {
        let mut t = TransformerSpec::new(TransformerKind::Decoder, 6, 64, 4, 32, 100);
        t.attention = AttentionImpl::Sdpa;
        t.separate_qkv = true;
        // copies kept for backward (`Saved::Output` on a copy), by size per sample
        let kept = kept_copies;
        let copies = |t: &TransformerSpec| {
            let p = lower(&ModelSpec::Transformer(t.clone())).expect("lowers");
            p.ops.iter().filter(|o| o.kind == OpKind::Copy).count()
        };
        assert!(kept(&t).is_empty());
        // a window as long as the sequence masks nothing; a shorter one every layer but
        // every third (a 32 × 32 bias per masked layer)
        t.sliding_window = Some(32);
        assert!(kept(&t).is_empty());
        t.sliding_window = Some(8);
        t.global_every = Some(3);
        assert_eq!(kept(&t), vec![32 * 32; 4]);
        assert!(!t.masked_attention(2) && !t.masked_attention(5) && t.masked_attention(4));
        // Falcon's code materializes the mask for every layer
        t.sliding_window = None;
        t.materialized_mask = true;
        assert_eq!(kept(&t), vec![32 * 32; 6]);
        // with a mask, grouped keys and values are repeated to every head first: the kernel
        // keeps two tensors of the queries' width in place of the groups (64 - 32 wider each)
        t.kv_heads = Some(2);
        assert_eq!(kept(&t), [32 * 32, 32 * 2 * (64 - 32)].repeat(6));
        // a single key/value head is repeated as a view
        t.kv_heads = Some(1);
        assert_eq!(kept(&t), vec![32 * 32; 6]);
        t.kv_heads = None;
        t.materialized_mask = false;
        // partial rotary: one copy of each layer's attention output back to the tokens'
        // layout (not kept: the output projection reads it)
        let before = copies(&t);
        t.partial_rotary = true;
        assert_eq!(copies(&t), before + 6);
        assert!(kept(&t).is_empty());
    }

    #[test]
    fn eager_attention_copies_grouped_keys_and_values_but_not_a_single_head() {
        let mut t = TransformerSpec::new(TransformerKind::Decoder, 1, 64, 4, 16, 100);
        t.separate_qkv = true;
        let repeat_copies = |t: &TransformerSpec| {
            let p = lower(&ModelSpec::Transformer(t.clone())).expect("lowers");
            p.ops
                .iter()
                .filter(|o| {
                    o.kind == OpKind::Copy && p.values[o.output as usize].per_sample == 16 * 3 * 64
                })
                .count()
        };
        t.kv_heads = Some(2);
        assert_eq!(repeat_copies(&t), 1);
        // one key/value head: `repeat_kv` reshapes a broadcast view, which is a view
        t.kv_heads = Some(1);
        assert_eq!(repeat_copies(&t), 0);
        // Falcon's code never repeats
        t.kv_heads = Some(2);
        t.repeat_kv = Some(false);
        assert_eq!(repeat_copies(&t), 0);
    }

    #[test]
    fn bloom_s_eager_attention_keeps_the_cache_s_copies() {
        let mut t = TransformerSpec::new(TransformerKind::Decoder, 2, 64, 4, 16, 100);
        let kept = |t: &TransformerSpec| kept_copies(t).len();
        assert_eq!(kept(&t), 0);
        t.alibi = true;
        assert_eq!(kept(&t), 2);
        t.kv_cache = Some(false);
        assert_eq!(kept(&t), 0);
    }

    #[test]
    fn query_and_key_norms_read_their_own_parts_of_the_projection() {
        let mut t = TransformerSpec::new(TransformerKind::Decoder, 1, 64, 4, 16, 100);
        t.norm = NormKind::RmsNorm;
        t.kv_heads = Some(1);
        t.qk_norm = true;
        let p = lower(&ModelSpec::Transformer(t)).expect("lowers");
        // the query norm over 4 heads of 16, the key norm over one head, each on a view
        let norms: Vec<(OpKind, u64)> = p
            .ops
            .iter()
            .filter(|o| o.kind == OpKind::RmsNorm)
            .filter_map(|o| {
                let input = p.ops.iter().find(|i| i.output == o.inputs[0])?;
                Some((input.kind, p.values[o.inputs[0] as usize].per_sample))
            })
            .filter(|(kind, _)| *kind == OpKind::View)
            .collect();
        assert_eq!(
            norms,
            vec![(OpKind::View, 16 * 64), (OpKind::View, 16 * 16)]
        );
    }

    #[test]
    fn litgpts_lora_head_is_lowered_in_chunks_with_its_last_chunk_copied() {
        use trainmem_autograd::LossChunks;
        let mut t = gpt(2, 64, 4, 1024, 100);
        let chunks = |t: &TransformerSpec| {
            lower(&ModelSpec::Transformer(t.clone()))
                .expect("lowers")
                .loss_chunks
        };
        assert_eq!(chunks(&t), None);
        t.implementation = Implementation::Litgpt;
        t.lora = Some(LoraSpec::new(8));
        let at = |positions, of, copied| {
            Some(LossChunks {
                positions,
                of,
                copied,
            })
        };
        // eight chunks of 128; the last loses its final position and is copied
        assert_eq!(chunks(&t), at(128, 1024, 127));
        t.seq_len = 1000;
        assert_eq!(
            chunks(&t),
            at(128, 1000, 103),
            "the last chunk has 104 positions"
        );
        t.implementation = Implementation::Transformers;
        t.head_chunk = Some(100);
        assert_eq!(
            chunks(&t),
            at(100, 1000, 0),
            "set by hand: no shift, no copy"
        );
    }

    #[test]
    fn gpt2_small_has_124_439_808_parameters() {
        // token embedding 50257·768 + learned positions 1024·768
        // + 12 blocks × (2 layer norms 2·2·768 + qkv 768·2304 + 2304 + out 768·768 + 768
        //                + fc 768·3072 + 3072 + proj 3072·768 + 768)
        // + final layer norm 2·768; the LM head is the (tied) token embedding.
        // = 38,597,376 + 786,432 + 12 × 7,087,872 + 1,536.
        let p = lower(&ModelSpec::Transformer(gpt(12, 768, 12, 1024, 50257))).unwrap();
        assert_eq!(p.param_elems(), GPT2_SMALL_PARAMS);
        let fixture = lower(&fixture_model("gpt2-small")).unwrap();
        assert_eq!(fixture.param_elems(), GPT2_SMALL_PARAMS);
    }

    #[test]
    fn burn_transformers_have_no_final_norm_and_a_biased_head() {
        let mut t = gpt(2, 128, 4, 64, 1000);
        t.tied_embeddings = false;
        t.learned_positions = false;
        let spec = ModelSpec::Transformer(t);
        let torch = lower(&spec).unwrap().param_elems();
        let burn = lower_for(&spec, Framework::Burn).unwrap().param_elems();
        // − final norm (weight and bias, 2 × 128) + head bias (vocab 1000)
        assert_eq!(burn, torch - 2 * 128 + 1000);
    }

    #[test]
    fn burn_token_ids_and_class_targets_are_i32() {
        let spec = ModelSpec::Transformer(gpt(1, 64, 4, 16, 100));
        // tokens and targets, 16 ids each: i64 under PyTorch, i32 under burn (Flex IntElem)
        assert_eq!(input_bytes_per_sample(&spec), 2 * 16 * 8);
        assert_eq!(
            input_bytes_per_sample_for(&spec, Framework::Burn),
            2 * 16 * 4
        );
        let p = lower_for(&spec, Framework::Burn).unwrap();
        for &v in &p.inputs {
            assert_eq!(p.values[v as usize].dtype, ValueDtype::Fixed(Dtype::I32));
        }
        let p = lower(&spec).unwrap();
        for &v in &p.inputs {
            assert_eq!(p.values[v as usize].dtype, ValueDtype::Fixed(Dtype::I64));
        }
    }

    #[test]
    fn llama_7b_has_6_738_415_616_parameters() {
        // token embedding 32000·4096 + 32 blocks × (2 RMS norms 2·4096 + q, k, v, o 4·4096²
        // + gate, up, down 3·4096·11008, no biases) + final RMS norm 4096 + untied LM head
        // 4096·32000; rotary positions have no parameters.
        // = 131,072,000 + 32 × 202,383,360 + 4,096 + 131,072,000.
        let mut t = gpt(32, 4096, 32, 2048, 32000);
        t.ffn = Some(11008);
        t.gated_ffn = true;
        t.norm = NormKind::RmsNorm;
        t.tied_embeddings = false;
        t.learned_positions = false;
        t.activation = Activation::Silu;
        let p = lower(&ModelSpec::Transformer(t)).unwrap();
        assert_eq!(p.param_elems(), LLAMA_7B_PARAMS);
        let fixture = lower(&fixture_model("llama-7b-zero3")).unwrap();
        assert_eq!(fixture.param_elems(), LLAMA_7B_PARAMS);
    }

    /// A residual block as a layer list: the shortcut projection reads the block's input
    /// (`from`), the sum adds the two branches (`from`, `with`).
    #[test]
    fn a_layer_reads_an_earlier_output_with_from() {
        let raw = |op: &str, out: u64, params: Vec<u64>, from, with| RawLayer {
            op: op.into(),
            out: Some(vec![out]),
            params,
            with,
            from,
            name: None,
        };
        let l = LayersSpec {
            input: vec![8],
            layers: vec![
                raw("relu", 8, vec![], None, None),          // 0: block input
                raw("linear", 16, vec![128], None, None),    // 1: main branch
                raw("linear", 16, vec![128], Some(0), None), // 2: shortcut from 0
                raw("add", 16, vec![], Some(1), Some(2)),    // 3: main + shortcut
            ],
            loss: Loss::Mse,
        };
        let p = lower(&ModelSpec::Layers(l.clone())).unwrap();
        let relu = p.ops[0].output;
        assert_eq!(
            p.ops[2].inputs[0], relu,
            "the shortcut reads the block input"
        );
        assert_eq!(&p.ops[3].inputs, &[p.ops[1].output, p.ops[2].output]);
        let mut bad = l;
        bad.layers[2].from = Some(2);
        assert!(check_layers(&bad).unwrap_err().contains("`from = 2`"));
    }

    #[test]
    fn cnn_shapes_and_errors() {
        let layer = |op, out, kernel| CnnLayer {
            op,
            out,
            kernel,
            stride: None,
            padding: None,
            p: None,
            bias: None,
        };
        let c = CnnSpec {
            image: [3, 32, 32],
            layers: vec![
                layer(CnnOp::Conv, Some(16), Some(3)),
                layer(CnnOp::Relu, None, None),
                layer(CnnOp::MaxPool, None, Some(2)),
            ],
            classes: 10,
            loss: Loss::CrossEntropy,
        };
        let p = lower(&ModelSpec::Cnn(c.clone())).unwrap();
        // conv 16·3·3·3 + 16, head 16·15·15·10 + 10
        assert_eq!(p.param_elems(), 16 * 27 + 16 + 16 * 15 * 15 * 10 + 10);
        let mut bad = c;
        bad.layers[2].kernel = Some(64);
        assert!(check_cnn(&bad).unwrap_err().contains("layer 2"));
    }

    /// The bytes the router's top-k division keeps per sample of `t`'s first block (the
    /// `RowStats` of the op that carries them, at batch 1).
    fn top_k_stats(t: &TransformerSpec) -> u64 {
        let p = lower(&ModelSpec::Transformer(t.clone())).expect("lowers");
        p.extra_saved
            .iter()
            .filter_map(|&(at, s)| match s {
                trainmem_autograd::Saved::RowStats(n) => {
                    Some(p.ops[at as usize].rows_per_sample * u64::from(n) * 4)
                }
                _ => None,
            })
            .next()
            .expect("the division's statistics")
    }

    #[test]
    fn a_normalized_top_k_keeps_its_weights_and_their_sum_at_any_k() {
        let mut t = TransformerSpec::new(TransformerKind::Decoder, 1, 16, 2, 8, 100);
        for k in [2, 254, 255, 300, 5000] {
            t.moe = Some(MoeSpec {
                experts: k,
                top_k: k,
                expert_ffn: Some(1),
                shared_expert_ffn: None,
                shared_expert_gate: false,
                normalize_top_k: true,
                capacity_factor: None,
            });
            // k + 1 f32 values per token, in one saved tensor
            assert_eq!(top_k_stats(&t), 8 * (k + 1) * 4, "top_k {k}");
        }
    }

    #[test]
    fn a_transformer_size_past_64_bits_is_an_error_naming_it() {
        let base = || TransformerSpec::new(TransformerKind::Decoder, 1, 1 << 30, 1, 1 << 40, 8);
        let err = |t: TransformerSpec| lower(&ModelSpec::Transformer(t)).unwrap_err().0;
        let e = err(base());
        assert!(
            e.starts_with(
                "the residual stream per sample (seq_len × hidden): 1099511627776 × 1073741824 \
                 overflows a 64-bit count (the model's seq_len 1099511627776, hidden 1073741824, \
                 heads 1, ffn 4 × hidden, vocab 8); is a size mistyped?"
            ),
            "{e}"
        );
        let mut t = TransformerSpec::new(TransformerKind::Decoder, 1, 8, 1, 1 << 40, 1 << 30);
        t.attention = AttentionImpl::Fused;
        let e = err(t.clone());
        assert!(
            e.contains("the logits per sample (seq_len × vocab): 1099511627776 × 1073741824"),
            "{e}"
        );
        t.vocab = 8;
        t.moe = Some(MoeSpec {
            experts: 1 << 30,
            top_k: 1 << 30,
            expert_ffn: Some(1),
            shared_expert_ffn: None,
            shared_expert_gate: false,
            normalize_top_k: false,
            capacity_factor: Some(1.5),
        });
        let e = err(t.clone());
        assert!(
            e.contains(
                "the experts' routed rows per sample (seq_len × top_k × capacity_factor): \
                 1099511627776 × 1073741824 × 1.5"
            ),
            "{e}"
        );
        // heads × seq × seq only under eager attention: the fused kernel never makes them
        let mut t = TransformerSpec::new(TransformerKind::Decoder, 1, 8, 8, 1 << 31, 8);
        t.attention = AttentionImpl::Eager;
        assert!(err(t.clone()).contains("eager attention's scores per sample"));
        t.attention = AttentionImpl::Fused;
        assert!(lower(&ModelSpec::Transformer(t)).is_ok());
        // an MLP or a CNN names the weight
        let mlp = MlpSpec {
            input: 1 << 40,
            hidden: vec![1 << 30],
            output: 2,
            activation: Activation::Relu,
            dropout: 0.0,
            bias: true,
            loss: Loss::Mse,
        };
        assert!(
            lower(&ModelSpec::Mlp(mlp))
                .unwrap_err()
                .0
                .contains("an MLP layer's weight (in × out)")
        );
    }
}
