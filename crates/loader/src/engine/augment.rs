//! [`RandomResize`]: an augmentation whose scratch memory changes size at random, batch to
//! batch — the resize example of the "RAM spikes at the start of each epoch" pattern.
//!
//! With probability `probability`, an image `[C, H, W]` (f32) is resized bilinearly by a random
//! factor in `[1 − max_delta, 1 + max_delta]` per axis into worker scratch (`C·H'·W'` floats,
//! a different size each time), then centre-cropped or zero-padded back to `[C, H, W]` so
//! batches stay stackable. Other columns are copied unchanged. [`ResizeColumns`] is the batch
//! builder that applies it to one column of a [`MmapDataset`].

use crate::dataset::MmapDataset;
use crate::engine::builder::{BatchBuilder, BoxError, ColumnBatch, copy_rows};
use crate::engine::context::WorkerContext;
use trainmem_core::Dtype;

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
        resize_into(src, (c, h, w), (nh, nw), scratch);
        crop_into(scratch, (c, h, w), (nh, nw), out);
        Ok((nh, nw))
    }
}

/// Bilinear resize of `src` (`c` planes of `h × w`) into `scratch` (`c` planes of
/// `nh × nw`, at least `c·nh·nw` floats).
fn resize_into(
    src: &[f32],
    (c, h, w): (usize, usize, usize),
    (nh, nw): (usize, usize),
    scratch: &mut [f32],
) {
    for ch in 0..c {
        let plane = &src[ch * h * w..(ch + 1) * h * w];
        for y in 0..nh {
            let sy = ((y as f64 + 0.5) * h as f64 / nh as f64 - 0.5).clamp(0.0, (h - 1) as f64);
            let (y0, ty) = (sy.floor() as usize, (sy - sy.floor()) as f32);
            let y1 = (y0 + 1).min(h - 1);
            for x in 0..nw {
                let sx = ((x as f64 + 0.5) * w as f64 / nw as f64 - 0.5).clamp(0.0, (w - 1) as f64);
                let (x0, tx) = (sx.floor() as usize, (sx - sx.floor()) as f32);
                let x1 = (x0 + 1).min(w - 1);
                let top = plane[y0 * w + x0] * (1.0 - tx) + plane[y0 * w + x1] * tx;
                let bot = plane[y1 * w + x0] * (1.0 - tx) + plane[y1 * w + x1] * tx;
                scratch[ch * nh * nw + y * nw + x] = top * (1.0 - ty) + bot * ty;
            }
        }
    }
}

/// Centre crop (zoom in) or zero pad (zoom out) of `scratch` (`c` planes of `nh × nw`) back
/// to `out` (`c` planes of `h × w`).
fn crop_into(
    scratch: &[f32],
    (c, h, w): (usize, usize, usize),
    (nh, nw): (usize, usize),
    out: &mut [f32],
) {
    out.fill(0.0);
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
                if a.dtype() != Dtype::F32 {
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

/// A resize augmentation whose scratch is a set multiple of the sample size, varying batch to
/// batch: the loader-side half of a plan's `data.augmentation_scratch` and
/// `data.size_variation`.
///
/// For each batch a size factor `s = 1 + size_variation × (2u − 1)` is drawn from the batch's
/// generator (`u` uniform in `[0, 1)`; the same draw whichever worker builds the batch). Every
/// sample of the `image` column (f32, `[C, H, W]`; a flat vector is `[1, 1, len]`) is resized
/// bilinearly to `C·H'·W' ≈ scratch_factor × s × C·H·W` floats (both sides scaled by
/// `√(scratch_factor × s)` for images, the width alone when `H = 1`) into worker scratch, and
/// then centre-cropped or zero-padded back to `[C, H, W]`, so the batch keeps its shape.
/// Each sample has its own region of the scratch, which lives until the batch is finished (as
/// when a batch's augmented samples are all held until collate): a worker building a batch of
/// `n` samples holds `n × C·H'·W' × 4 ≈ scratch_factor × s × batch bytes` of scratch, freed
/// at the end of the batch. Other columns are copied unchanged.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScratchResize {
    /// The image column.
    pub column: usize,
    /// Channels.
    pub channels: usize,
    /// Height (1 for a flat vector).
    pub height: usize,
    /// Width.
    pub width: usize,
    /// Scratch floats per sample float (a plan's `augmentation_scratch`), `> 0`.
    pub scratch_factor: f64,
    /// ± relative change of the scratch from batch to batch, in `[0, 1)`.
    pub size_variation: f64,
}

impl ScratchResize {
    /// The resized `(H', W')` for a batch whose size factor is `scale`.
    pub fn resized_shape(&self, scale: f64) -> (usize, usize) {
        let target = (self.scratch_factor * scale).max(0.0);
        let (h, w) = (self.height, self.width);
        if h <= 1 {
            (h.max(1), ((w as f64 * target).round() as usize).max(1))
        } else {
            let f = target.sqrt();
            (
                ((h as f64 * f).round() as usize).max(1),
                ((w as f64 * f).round() as usize).max(1),
            )
        }
    }

    /// The size factor of the batch whose generator is `ctx.rng()` (draws once).
    fn draw_scale(&self, ctx: &mut WorkerContext) -> f64 {
        let v = self.size_variation.clamp(0.0, 0.999);
        1.0 + v * (2.0 * ctx.rng().next_f64() - 1.0)
    }

    /// The most scratch bytes one batch of `n` samples can take.
    pub fn max_scratch_bytes(&self, n: usize) -> usize {
        let (nh, nw) = self.resized_shape(1.0 + self.size_variation.clamp(0.0, 0.999));
        n * self.channels * nh * nw * 4
    }
}

impl BatchBuilder<MmapDataset> for ScratchResize {
    type Batch = ColumnBatch;

    fn build(
        &self,
        dataset: &MmapDataset,
        indices: &[usize],
        ctx: &mut WorkerContext,
    ) -> Result<ColumnBatch, BoxError> {
        let n = indices.len();
        let (c, h, w) = (self.channels, self.height, self.width);
        let (nh, nw) = self.resized_shape(self.draw_scale(ctx));
        let per = c * nh * nw;
        let mut batch = ColumnBatch::start(indices, dataset.columns().len());
        for (k, col) in dataset.columns().iter().enumerate() {
            let a = &col.array;
            if let Some(&bad) = indices.iter().find(|&&i| i >= a.len()) {
                ctx.set_sample(bad);
                return Err(format!("sample {bad} out of range ({} samples)", a.len()).into());
            }
            let bps = a.bytes_per_sample();
            let mut buf = ctx.alloc_buffer(n * bps);
            if k != self.column {
                copy_rows(a, indices, buf.as_bytes_mut(), ctx)?;
                batch.push_column(buf, a);
                continue;
            }
            if a.dtype() != Dtype::F32 || bps != c * h * w * 4 {
                return Err(format!(
                    "ScratchResize needs f32 samples of {c}x{h}x{w}, column {} holds {} bytes \
                     of {}",
                    col.name,
                    bps,
                    a.dtype()
                )
                .into());
            }
            let floats = c * h * w;
            for (row, &i) in indices.iter().enumerate() {
                if ctx.is_cancelled() {
                    return Err("epoch cancelled".into());
                }
                ctx.set_sample(i);
                let src = a.sample_view::<f32>(i)?;
                // The scratch grows by one sample's region per row and is held until the end
                // of the batch.
                let scratch = &mut ctx.scratch_f32((row + 1) * per)[row * per..];
                resize_into(src, (c, h, w), (nh, nw), scratch);
                let out = buf
                    .typed_mut::<f32>()
                    .ok_or("batch buffer is not a whole number of f32")?;
                crop_into(
                    scratch,
                    (c, h, w),
                    (nh, nw),
                    &mut out[row * floats..(row + 1) * floats],
                );
            }
            batch.push_column(buf, a);
        }
        ctx.clear_sample();
        Ok(batch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resized_shapes_follow_the_factor() {
        let img = ScratchResize {
            column: 0,
            channels: 3,
            height: 32,
            width: 32,
            scratch_factor: 2.0,
            size_variation: 0.5,
        };
        let (h, w) = img.resized_shape(1.0);
        // √2 × 32 = 45.25 → 45 per side: 3·45·45 floats ≈ 1.98 × 3·32·32.
        assert_eq!((h, w), (45, 45));
        let vec = ScratchResize {
            height: 1,
            width: 3072,
            channels: 1,
            ..img
        };
        assert_eq!(vec.resized_shape(1.0), (1, 6144));
        assert_eq!(vec.resized_shape(0.5), (1, 3072));
        assert_eq!(vec.max_scratch_bytes(2), 2 * 9216 * 4);
    }

    #[test]
    fn crop_and_pad_keep_the_centre() {
        // A 1x4x4 ramp resized to 8x8 and cropped back keeps its shape; resizing to the same
        // size is the identity.
        let src: Vec<f32> = (0..16).map(|v| v as f32).collect();
        let mut scratch = vec![0.0; 16];
        let mut out = vec![0.0; 16];
        resize_into(&src, (1, 4, 4), (4, 4), &mut scratch);
        crop_into(&scratch, (1, 4, 4), (4, 4), &mut out);
        assert_eq!(out, src);
        let mut big = vec![0.0; 64];
        resize_into(&src, (1, 4, 4), (8, 8), &mut big);
        crop_into(&big, (1, 4, 4), (8, 8), &mut out);
        assert!(out.iter().all(|v| (0.0..=15.0).contains(v)));
        let mut small = vec![0.0; 4];
        resize_into(&src, (1, 4, 4), (2, 2), &mut small);
        crop_into(&small, (1, 4, 4), (2, 2), &mut out);
        // Zoomed out: the 2x2 sits in the centre of zeros.
        assert_eq!(out.iter().filter(|&&v| v != 0.0).count(), 4);
        assert_eq!(out[0], 0.0);
    }
}
