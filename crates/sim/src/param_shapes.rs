//! The matrix shape of each parameter, read from the ops that use it.
//!
//! A program knows its parameters' element counts, not their shapes; an optimizer that
//! factors its state (Adafactor: a row and a column vector per matrix) needs them. They
//! follow from the ops: a linear layer's weight maps `in` features to `out` per row of its
//! input (`in · out` elements, its input and output `in` and `out` per row), and an
//! embedding's tables have as many columns as its output has per token. Biases, norm weights
//! and parameters of other ops are vectors.

use trainmem_autograd::Program;

use trainmem_core::OpKind;

/// For each parameter of `program`, `Some((rows, cols))` for a matrix, `None` for a vector.
pub fn matrix_shapes(program: &Program) -> Vec<Option<(u64, u64)>> {
    // shapes the lowering recorded come first
    let mut out: Vec<Option<(u64, u64)>> = program.params.iter().map(|p| p.matrix).collect();
    for op in &program.ops {
        let params = program.params_of(op);
        let input = &program.values[op.inputs[0] as usize];
        let output = &program.values[op.output as usize];
        let (fin, fout) = (input.per_sample, output.per_sample);
        match op.kind {
            OpKind::Linear => {
                let Some(&w) = params.first() else { continue };
                let elems = program.params[w as usize].elems;
                // in · out = elems and in / out = fin / fout (rows of the input alike)
                if fin == 0 || fout == 0 {
                    continue;
                }
                let out_features = exact_sqrt(elems as u128 * fout as u128 / fin as u128);
                if let Some(o) = out_features
                    && o > 0
                    && elems.is_multiple_of(o)
                {
                    out[w as usize].get_or_insert((o, elems / o));
                }
            }
            OpKind::Embedding => {
                // tokens per sample in, `width` per token out
                if fin == 0 || !fout.is_multiple_of(fin) {
                    continue;
                }
                let width = fout / fin;
                for &p in params {
                    let elems = program.params[p as usize].elems;
                    if width > 0 && elems.is_multiple_of(width) {
                        out[p as usize].get_or_insert((elems / width, width));
                    }
                }
            }
            _ => {}
        }
    }
    out
}

/// `√n` when `n` is a perfect square.
fn exact_sqrt(n: u128) -> Option<u64> {
    let r = (n as f64).sqrt().round() as u128;
    (r.saturating_sub(1)..=r + 1)
        .find(|c| c * c == n)
        .and_then(|c| u64::try_from(c).ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use trainmem_core::model::{ModelSpec, TransformerKind, TransformerSpec};

    #[test]
    fn a_transformer_s_matrices_are_its_weights_and_tables() {
        let mut t = TransformerSpec::new(TransformerKind::Decoder, 2, 64, 4, 16, 100);
        t.kv_heads = Some(2);
        t.learned_positions = true;
        t.max_positions = Some(32);
        let p = crate::lower::lower(&ModelSpec::Transformer(t)).expect("lowers");
        let shapes = matrix_shapes(&p);
        let by_name = |n: &str| {
            let i = p.params.iter().position(|x| x.name == n).expect(n);
            shapes[i]
        };
        assert_eq!(by_name("embed.tokens"), Some((100, 64)));
        assert_eq!(by_name("embed.positions"), Some((32, 64)));
        // q (64) + k, v (2 heads of 16 each): 128 out of 64
        assert_eq!(by_name("block0.attn.qkv.weight"), Some((128, 64)));
        assert_eq!(by_name("block1.ffn.down.weight"), Some((64, 256)));
        assert_eq!(by_name("lm_head.weight"), Some((100, 64)));
        assert_eq!(by_name("block0.norm1.weight"), None);
        assert_eq!(by_name("block0.ffn.up.bias"), None);
    }
}
