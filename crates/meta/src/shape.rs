//! Output shapes of tensor ops. Each function panics, naming the op, when its inputs do not fit
//! together (the same programs fail on a real backend).

use burn::tensor::{Shape, Slice};

fn fail(op: &str, why: impl std::fmt::Display) -> ! {
    panic!("trainmem-meta: {op}: {why}")
}

/// The broadcast of two shapes (numpy rules, equal ranks as burn requires).
pub(crate) fn broadcast(op: &str, a: &Shape, b: &Shape) -> Shape {
    a.broadcast(b).unwrap_or_else(|e| {
        fail(
            op,
            format!("shapes {a:?} and {b:?} do not broadcast: {e:?}"),
        )
    })
}

/// `[.., m, k] × [.., k, n] → [.., m, n]`, batch dims broadcast.
pub(crate) fn matmul(op: &str, a: &Shape, b: &Shape) -> Shape {
    burn::tensor::calculate_matmul_output(a, b)
        .unwrap_or_else(|e| fail(op, format!("shapes {a:?} and {b:?}: {e:?}")))
}

/// `shape` with dimension `dim` set to `size`.
pub(crate) fn with_dim(op: &str, shape: &Shape, dim: usize, size: usize) -> Shape {
    if dim >= shape.num_dims() {
        fail(op, format!("dim {dim} out of range for shape {shape:?}"));
    }
    let mut out = shape.clone();
    out[dim] = size;
    out
}

/// Reshape target, checked for the same number of elements.
pub(crate) fn reshape(op: &str, from: &Shape, to: Shape) -> Shape {
    if from.num_elements() != to.num_elements() {
        fail(op, format!("cannot reshape {from:?} into {to:?}"));
    }
    to
}

/// `shape` with two dimensions swapped.
pub(crate) fn swap(op: &str, shape: &Shape, dim1: usize, dim2: usize) -> Shape {
    shape
        .clone()
        .swapped(dim1, dim2)
        .unwrap_or_else(|e| fail(op, format!("{shape:?} dims {dim1},{dim2}: {e:?}")))
}

/// `shape` with its dimensions reordered.
pub(crate) fn permute(op: &str, shape: &Shape, axes: &[usize]) -> Shape {
    shape
        .clone()
        .permuted(axes)
        .unwrap_or_else(|e| fail(op, format!("{shape:?} axes {axes:?}: {e:?}")))
}

/// `shape` broadcast to `target`.
pub(crate) fn expand(op: &str, shape: &Shape, target: Shape) -> Shape {
    shape
        .expand(target.clone())
        .unwrap_or_else(|e| fail(op, format!("{shape:?} to {target:?}: {e:?}")))
}

/// The shape of `shape[slices]`; missing trailing slices take the whole dimension.
pub(crate) fn slice(op: &str, shape: &Shape, slices: &[Slice]) -> Shape {
    if slices.len() > shape.num_dims() {
        fail(op, format!("{} slices for shape {shape:?}", slices.len()));
    }
    let mut out = shape.clone();
    for (d, s) in slices.iter().enumerate() {
        out[d] = s.output_size(shape[d]);
    }
    out
}

/// Whether slicing keeps the row-major layout contiguous (only the outermost sliced dimension
/// may be narrowed, with step 1) and whether the view starts at the buffer's first element.
pub(crate) fn slice_layout(shape: &Shape, slices: &[Slice]) -> (bool, bool) {
    let mut at_origin = true;
    let mut narrowed: Option<usize> = None;
    let mut contiguous = true;
    for (d, s) in slices.iter().enumerate() {
        let range = s.to_range(shape[d]);
        if range.start != 0 {
            at_origin = false;
        }
        let full = range.start == 0 && range.end >= shape[d] && s.step() == 1;
        if !full {
            if narrowed.is_some() || s.step() != 1 {
                contiguous = false;
            }
            narrowed = Some(d);
        }
    }
    // A dimension narrowed after an earlier full one with size > 1 breaks contiguity.
    if let Some(d) = narrowed
        && shape.iter().take(d).any(|&n| n > 1)
    {
        contiguous = false;
    }
    (contiguous, at_origin)
}

/// Sliding windows: dimension `dim` becomes the number of windows, a trailing dimension of
/// `size` is appended.
pub(crate) fn unfold(op: &str, shape: &Shape, dim: usize, size: usize, step: usize) -> Shape {
    if dim >= shape.num_dims() || step == 0 || size > shape[dim] {
        fail(
            op,
            format!("shape {shape:?} dim {dim} size {size} step {step}"),
        );
    }
    let mut out = with_dim(op, shape, dim, (shape[dim] - size) / step + 1);
    out.push(size);
    out
}

/// Concatenation along `dim`.
pub(crate) fn cat<'a>(op: &str, shapes: impl IntoIterator<Item = &'a Shape>, dim: usize) -> Shape {
    Shape::cat(shapes, dim).unwrap_or_else(|e| fail(op, format!("dim {dim}: {e:?}")))
}

/// Index shape checks for gather (output has the indices' shape).
pub(crate) fn gather(op: &str, shape: &Shape, dim: usize, indices: &Shape) -> Shape {
    if indices.num_dims() != shape.num_dims() || dim >= shape.num_dims() {
        fail(
            op,
            format!("tensor {shape:?}, indices {indices:?}, dim {dim}"),
        );
    }
    indices.clone()
}

/// `shape` with dimension `dim` replaced by the number of indices.
pub(crate) fn select(op: &str, shape: &Shape, dim: usize, indices: &Shape) -> Shape {
    if indices.num_dims() != 1 {
        fail(op, format!("indices must be 1-d, got {indices:?}"));
    }
    with_dim(op, shape, dim, indices[0])
}

/// Checks that `value` fits the region `slices` selects in `shape`.
pub(crate) fn slice_assign(op: &str, shape: &Shape, slices: &[Slice], value: &Shape) {
    let region = slice(op, shape, slices);
    if &region != value {
        fail(
            op,
            format!("value {value:?} does not fit the region {region:?}"),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matmul_broadcasts_batch_dims() {
        let out = matmul("m", &Shape::new([2, 1, 4, 8]), &Shape::new([1, 3, 8, 5]));
        assert_eq!(out, Shape::new([2, 3, 4, 5]));
    }

    #[test]
    #[should_panic(expected = "float_matmul")]
    fn a_mismatch_names_the_op() {
        matmul("float_matmul", &Shape::new([4, 8]), &Shape::new([7, 5]));
    }

    #[test]
    fn slices_of_the_outer_dim_stay_contiguous() {
        let shape = Shape::new([6, 4]);
        let rows = [Slice::new(2, Some(4), 1)];
        assert_eq!(slice("s", &shape, &rows), Shape::new([2, 4]));
        assert_eq!(slice_layout(&shape, &rows), (true, false));
        let cols = [Slice::new(0, None, 1), Slice::new(0, Some(2), 1)];
        assert_eq!(slice_layout(&shape, &cols), (false, true));
    }
}
