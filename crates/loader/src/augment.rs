//! [`RandomResize`]: an augmentation whose scratch memory changes size at random, batch to
//! batch — the resize example of the "RAM spikes at the start of each epoch" pattern.
//!
//! With probability `probability`, an image `[C, H, W]` (f32) is resized bilinearly by a random
//! factor in `[1 − max_delta, 1 + max_delta]` per axis into worker scratch (`C·H'·W'` floats,
//! a different size each time), then centre-cropped or zero-padded back to `[C, H, W]` so
//! batches stay stackable. Other columns are copied unchanged. [`ResizeColumns`] is the batch
//! builder that applies it to one column of a [`MmapDataset`].

use crate::builder::{BatchBuilder, BoxError, ColumnBatch, copy_rows};
use crate::context::WorkerContext;
use crate::dataset::MmapDataset;
use crate::dtype::DType;

/// Random zoom in or out of an image, through variable-size scratch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RandomResize {
    /// Channels.
    pub channels: usize,
    /// Height.
    pub height: usize,
    /// Width.
    pub width: usize,
    /// Probability that a sample is resized (the others are copied).
    pub probability: f64,
    /// Largest relative change of each side (0.2 = ±20 %).
    pub max_delta: f64,
}

impl RandomResize {
    /// Scratch floats for the largest possible resize.
    pub fn max_scratch_floats(&self) -> usize {
        let f = 1.0 + self.max_delta.max(0.0);
        let h = (self.height as f64 * f).ceil() as usize;
        let w = (self.width as f64 * f).ceil() as usize;
        self.channels * h * w
    }

    /// Applies the augmentation to `src` (`C·H·W` floats) writing `out` (same size). Returns the
    /// resized `(H', W')`, equal to `(H, W)` when the sample was not resized.
    pub fn apply(
        &self,
        src: &[f32],
        out: &mut [f32],
        ctx: &mut WorkerContext,
    ) -> Result<(usize, usize), BoxError> {
        let (c, h, w) = (self.channels, self.height, self.width);
        if src.len() != c * h * w || out.len() != c * h * w {
            return Err(format!(
                "RandomResize expects {c}x{h}x{w} = {} floats, got {} in / {} out",
                c * h * w,
                src.len(),
                out.len()
            )
            .into());
        }
        if ctx.rng().next_f64() >= self.probability {
            out.copy_from_slice(src);
            return Ok((h, w));
        }
        let d = self.max_delta.max(0.0);
        let fh = 1.0 - d + 2.0 * d * ctx.rng().next_f64();
        let fw = 1.0 - d + 2.0 * d * ctx.rng().next_f64();
        let nh = ((h as f64 * fh).round() as usize).max(1);
        let nw = ((w as f64 * fw).round() as usize).max(1);
        let scratch = ctx.scratch_f32(c * nh * nw);
        for ch in 0..c {
            let plane = &src[ch * h * w..(ch + 1) * h * w];
            for y in 0..nh {
                let sy = ((y as f64 + 0.5) * h as f64 / nh as f64 - 0.5).clamp(0.0, (h - 1) as f64);
                let (y0, ty) = (sy.floor() as usize, (sy - sy.floor()) as f32);
                let y1 = (y0 + 1).min(h - 1);
                for x in 0..nw {
                    let sx =
                        ((x as f64 + 0.5) * w as f64 / nw as f64 - 0.5).clamp(0.0, (w - 1) as f64);
                    let (x0, tx) = (sx.floor() as usize, (sx - sx.floor()) as f32);
                    let x1 = (x0 + 1).min(w - 1);
                    let top = plane[y0 * w + x0] * (1.0 - tx) + plane[y0 * w + x1] * tx;
                    let bot = plane[y1 * w + x0] * (1.0 - tx) + plane[y1 * w + x1] * tx;
                    scratch[ch * nh * nw + y * nw + x] = top * (1.0 - ty) + bot * ty;
                }
            }
        }
        // Centre crop (zoom in) or zero pad (zoom out) back to H×W.
        out.fill(0.0);
        let scratch = ctx.scratch_f32(c * nh * nw);
        for ch in 0..c {
            for y in 0..h {
                let sy = y as isize + (nh as isize - h as isize) / 2;
                if sy < 0 || sy >= nh as isize {
                    continue;
                }
                for x in 0..w {
                    let sx = x as isize + (nw as isize - w as isize) / 2;
                    if sx < 0 || sx >= nw as isize {
                        continue;
                    }
                    out[ch * h * w + y * w + x] =
                        scratch[ch * nh * nw + sy as usize * nw + sx as usize];
                }
            }
        }
        Ok((nh, nw))
    }
}

/// Builds [`ColumnBatch`]es with [`RandomResize`] applied to one f32 image column.
#[derive(Debug, Clone, Copy)]
pub struct ResizeColumns {
    /// The image column.
    pub column: usize,
    /// The augmentation.
    pub resize: RandomResize,
}

impl BatchBuilder<MmapDataset> for ResizeColumns {
    type Batch = ColumnBatch;

    fn build(
        &self,
        dataset: &MmapDataset,
        indices: &[usize],
        ctx: &mut WorkerContext,
    ) -> Result<ColumnBatch, BoxError> {
        let n = indices.len();
        let mut batch = ColumnBatch::start(indices, dataset.columns().len());
        for (k, c) in dataset.columns().iter().enumerate() {
            let a = &c.array;
            let bps = a.bytes_per_sample();
            let mut buf = ctx.alloc_buffer(n * bps);
            if k == self.column {
                if a.dtype() != DType::F32 {
                    return Err(format!(
                        "RandomResize needs f32, column {} is {}",
                        c.name,
                        a.dtype()
                    )
                    .into());
                }
                let floats = bps / 4;
                for (row, &i) in indices.iter().enumerate() {
                    ctx.set_sample(i);
                    let src = a.sample_view::<f32>(i)?;
                    let out = buf
                        .typed_mut::<f32>()
                        .ok_or("batch buffer is not a whole number of f32")?;
                    self.resize
                        .apply(src, &mut out[row * floats..(row + 1) * floats], ctx)?;
                }
            } else {
                copy_rows(a, indices, buf.as_bytes_mut(), ctx)?;
            }
            batch.push_column(buf, a);
        }
        ctx.clear_sample();
        Ok(batch)
    }
}
