//! Structural checks of model specs: the fields that apply to each CNN layer, the shapes a
//! CNN walks through, and the consistency of a raw layer list. A plan is validated with these
//! when it is read, so a model that cannot be built is an error naming its layer.

use crate::model::{CnnOp, CnnSpec, LayersSpec};
use crate::op_kind::OpKind;

/// The shape of one sample's activation between two CNN layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// Channels, height, width.
    Image(u64, u64, u64),
    /// A flat vector of features.
    Flat(u64),
}

impl Shape {
    /// Elements per sample. Saturates at `u64::MAX` when they do not fit 64 bits (the
    /// shapes [`cnn_shapes`] returns fit; [`Shape::checked_elems`] says when).
    pub fn elems(self) -> u64 {
        self.checked_elems().unwrap_or(u64::MAX)
    }

    /// Elements per sample, `None` when they do not fit 64 bits.
    pub fn checked_elems(self) -> Option<u64> {
        match self {
            Shape::Image(c, h, w) => c.checked_mul(h)?.checked_mul(w),
            Shape::Flat(f) => Some(f),
        }
    }
}

/// The product of `shape`'s sizes, `None` when it does not fit 64 bits.
fn shape_product(shape: &[u64]) -> Option<u64> {
    shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d))
}

/// A pooling or convolution window's output size; `Err(())` when the padded input does not
/// fit 64 bits, `Ok(None)` when the window is larger than it.
fn pool_out(size: u64, kernel: u64, stride: u64, padding: u64) -> Result<Option<u64>, ()> {
    let padded = padding
        .checked_mul(2)
        .and_then(|p| p.checked_add(size))
        .ok_or(())?;
    Ok(padded.checked_sub(kernel).map(|r| r / stride.max(1) + 1))
}

/// Walks a CNN's shapes; `Err` names the first layer that does not fit.
///
/// Every shape's elements per sample (and the image's) fit 64 bits: one that does not is an
/// error naming its layer.
pub fn cnn_shapes(c: &CnnSpec) -> Result<Vec<Shape>, String> {
    let mut shape = Shape::Image(c.image[0], c.image[1], c.image[2]);
    if shape.checked_elems().is_none() {
        return Err(format!(
            "the image {}×{}×{} has more elements than 64 bits count",
            c.image[0], c.image[1], c.image[2]
        ));
    }
    let mut out = Vec::new();
    for (i, l) in c.layers.iter().enumerate() {
        let allowed: &[&str] = match l.op {
            CnnOp::Conv => &["out", "kernel", "stride", "padding", "bias"],
            CnnOp::MaxPool | CnnOp::AvgPool => &["kernel", "stride", "padding"],
            CnnOp::Dropout => &["p"],
            CnnOp::Linear => &["out", "bias"],
            _ => &[],
        };
        for (name, present) in [
            ("out", l.out.is_some()),
            ("kernel", l.kernel.is_some()),
            ("stride", l.stride.is_some()),
            ("padding", l.padding.is_some()),
            ("p", l.p.is_some()),
            ("bias", l.bias.is_some()),
        ] {
            if present && !allowed.contains(&name) {
                return Err(format!("layer {i} ({:?}): `{name}` does not apply", l.op));
            }
        }
        let need = |v: Option<u64>, name: &str| {
            v.filter(|&x| x > 0)
                .ok_or_else(|| format!("layer {i} ({:?}): needs `{name}` ≥ 1", l.op))
        };
        shape = match (l.op, shape) {
            (CnnOp::Conv, Shape::Image(_, h, w)) => {
                let o = need(l.out, "out")?;
                let k = need(l.kernel, "kernel")?;
                let s = l.stride.unwrap_or(1).max(1);
                let p = l.padding.unwrap_or(0);
                match (pool_out(h, k, s, p), pool_out(w, k, s, p)) {
                    (Err(()), _) | (_, Err(())) => return Err(padding_overflow(i, l.op, h, w, p)),
                    (Ok(Some(h2)), Ok(Some(w2))) => Shape::Image(o, h2, w2),
                    _ => {
                        return Err(format!(
                            "layer {i} (conv): kernel {k} is larger than the {h}×{w} input"
                        ));
                    }
                }
            }
            (CnnOp::MaxPool | CnnOp::AvgPool, Shape::Image(ch, h, w)) => {
                let k = need(l.kernel, "kernel")?;
                let s = l.stride.unwrap_or(k).max(1);
                let p = l.padding.unwrap_or(0);
                match (pool_out(h, k, s, p), pool_out(w, k, s, p)) {
                    (Err(()), _) | (_, Err(())) => return Err(padding_overflow(i, l.op, h, w, p)),
                    (Ok(Some(h2)), Ok(Some(w2))) => Shape::Image(ch, h2, w2),
                    _ => {
                        return Err(format!(
                            "layer {i} (pool): kernel {k} is larger than the {h}×{w} input"
                        ));
                    }
                }
            }
            (CnnOp::GlobalAvgPool, Shape::Image(ch, _, _)) => Shape::Image(ch, 1, 1),
            (CnnOp::Flatten, s) => Shape::Flat(s.elems()),
            (CnnOp::Linear, s) => {
                let _ = s;
                Shape::Flat(need(l.out, "out")?)
            }
            (CnnOp::Dropout, s) => {
                if let Some(p) = l.p
                    && !(0.0..1.0).contains(&p)
                {
                    return Err(format!("layer {i} (dropout): p = {p} is outside 0 ≤ p < 1"));
                }
                s
            }
            (CnnOp::BatchNorm | CnnOp::Relu | CnnOp::Gelu | CnnOp::Silu, s) => s,
            (op, Shape::Flat(_)) => {
                return Err(format!(
                    "layer {i} ({op:?}) needs an image, but the input was flattened"
                ));
            }
        };
        if shape.checked_elems().is_none() {
            return Err(format!(
                "layer {i} ({:?}): its output ({shape:?}) has more elements per sample than 64 \
                 bits count",
                l.op
            ));
        }
        out.push(shape);
    }
    Ok(out)
}

fn padding_overflow(i: usize, op: CnnOp, h: u64, w: u64, p: u64) -> String {
    format!("layer {i} ({op:?}): the {h}×{w} input padded by {p} on each side overflows 64 bits")
}

/// Checks a CNN spec (fields that apply, shapes that fit).
pub fn check_cnn(c: &CnnSpec) -> Result<(), String> {
    cnn_shapes(c).map(|_| ())
}

/// Checks a raw layer list.
pub fn check_layers(l: &LayersSpec) -> Result<(), String> {
    if l.input.is_empty() || l.input.contains(&0) {
        return Err("`input` must be a non-empty shape of positive sizes".into());
    }
    if l.layers.is_empty() {
        return Err("needs at least one layer".into());
    }
    if shape_product(&l.input).is_none() {
        return Err(format!(
            "`input` {:?} has more elements per sample than 64 bits count",
            l.input
        ));
    }
    for (i, layer) in l.layers.iter().enumerate() {
        if let Some(out) = &layer.out
            && shape_product(out).is_none()
        {
            return Err(format!(
                "layer {i}: `out` {out:?} has more elements per sample than 64 bits count"
            ));
        }
    }
    for (i, layer) in l.layers.iter().enumerate() {
        let kind = OpKind::from_name(&layer.op).ok_or_else(|| {
            let names: Vec<&str> = OpKind::ALL.iter().map(|k| k.name()).collect();
            format!(
                "layer {i}: unknown op `{}` (known: {})",
                layer.op,
                names.join(", ")
            )
        })?;
        if matches!(kind, OpKind::CrossEntropy | OpKind::MseLoss) {
            return Err(format!(
                "layer {i}: `{}` is a loss; set `loss` instead",
                layer.op
            ));
        }
        if let Some(w) = layer.with {
            if kind.arity() != 2 {
                return Err(format!(
                    "layer {i}: `with` applies only to two-input ops (add, mul, matmul)"
                ));
            }
            if w >= i {
                return Err(format!(
                    "layer {i}: `with = {w}` must name an earlier layer"
                ));
            }
        }
        if let Some(f) = layer.from
            && f >= i
        {
            return Err(format!(
                "layer {i}: `from = {f}` must name an earlier layer"
            ));
        }
        if layer
            .out
            .as_ref()
            .is_some_and(|o| o.is_empty() || o.contains(&0))
        {
            return Err(format!(
                "layer {i}: `out` must be a non-empty shape of positive sizes"
            ));
        }
        if kind == OpKind::View {
            let prev: u64 = if i == 0 {
                l.input.iter().product()
            } else {
                layer_out(l, i - 1)
            };
            if layer_out(l, i) != prev {
                return Err(format!("layer {i}: a view cannot change the element count"));
            }
        }
    }
    Ok(())
}

/// Elements per sample after layer `i` of a raw layer list. A shape whose elements do not
/// fit 64 bits counts `u64::MAX` ([`check_layers`] refuses such a list).
pub fn layer_out(l: &LayersSpec, i: usize) -> u64 {
    let elems = |shape: &[u64]| shape_product(shape).unwrap_or(u64::MAX);
    let mut outs: Vec<u64> = Vec::with_capacity(i + 1);
    let mut cur: u64 = elems(&l.input);
    for layer in &l.layers[..=i] {
        // an op without `out` keeps the shape of what it reads
        let read = layer.from.and_then(|f| outs.get(f).copied()).unwrap_or(cur);
        cur = layer.out.as_ref().map_or(read, |o| elems(o));
        outs.push(cur);
    }
    cur
}
