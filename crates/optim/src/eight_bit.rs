//! 8-bit AdamW as bitsandbytes keeps it (`bnb.optim.AdamW8bit`, checked against
//! bitsandbytes 0.50.2 by trainmem's recordings of real runs).
//!
//! The state of one parameter of `n` elements:
//!
//! * `n` ≥ [`MIN_8BIT_SIZE`] (bitsandbytes' `min_8bit_size`): both moments as `u8` tensors of
//!   the parameter's shape (`n` bytes each) and, for each, an f32 absolute maximum per block
//!   of [`BLOCK`] elements (`absmax1`, `absmax2`: `4 · ceil(n / 256)` bytes each);
//! * smaller parameters: both moments in f32 (`4 · n` bytes each), as the 32-bit optimizer;
//! * the step count is a Python integer (no tensor);
//! * two 256-entry f32 quantization maps (signed for the first moment, unsigned for the
//!   second; [`QUANTIZATION_MAPS_BYTES`]) are made with the optimizer and shared by every
//!   parameter.
//!
//! The step, one parameter at a time ([`cpu_step_buffers`]): the CPU backend dequantizes both
//! moments into new f32 tensors, makes `grad · gnorm_scale`, `sqrt(v)` and `sqrt(v) / c₂`
//! (the denominator, `sqrt(v)` freed after it), updates the parameter in place and quantizes
//! the moments back (a `u8` tensor and block maxima, copied in and freed): five
//! parameter-sized f32 tensors at its highest. The CUDA kernel does all of it in registers
//! (no scratch).

/// Parameters with fewer elements keep f32 moments (bitsandbytes' `min_8bit_size` default).
pub const MIN_8BIT_SIZE: u64 = 4096;

/// Elements per quantization block (one f32 absolute maximum each).
pub const BLOCK: u64 = 256;

/// The two quantization maps (256 f32 entries each) shared by all parameters.
pub const QUANTIZATION_MAPS_BYTES: u64 = 2 * 256 * 4;

/// Bytes of each state tensor of one parameter of `elems` elements: `[m, v, absmax₁,
/// absmax₂]` when quantized, `[m, v]` in f32 otherwise.
///
/// ```
/// use trainmem_optim::eight_bit::state_bytes;
/// // a 1024 × 784 weight: two u8 moments and 3,136 block maxima each
/// assert_eq!(state_bytes(1024 * 784), vec![802_816, 802_816, 12_544, 12_544]);
/// // a bias stays f32
/// assert_eq!(state_bytes(1024), vec![4096, 4096]);
/// ```
pub fn state_bytes(elems: u64) -> Vec<u64> {
    if elems < MIN_8BIT_SIZE {
        return vec![4 * elems, 4 * elems];
    }
    let absmax = 4 * elems.div_ceil(BLOCK);
    vec![elems, elems, absmax, absmax]
}

/// Parameter-sized f32 tensors bitsandbytes' CPU step holds at once for one parameter of
/// `elems` elements, whose parameters are half precision when `half_params`:
///
/// * quantized state: the two dequantized moments, the scaled gradient, `sqrt(v)` and the
///   denominator made from it (5), plus the parameter's f32 copy for half-precision
///   parameters (for f32 ones `p.float()` is the parameter itself);
/// * f32 state: the scaled gradient, `sqrt(v) + ε` and the update (3), plus the parameter's
///   f32 copy for half-precision parameters.
pub fn cpu_step_buffers(elems: u64, half_params: bool) -> usize {
    let base = if elems < MIN_8BIT_SIZE { 3 } else { 5 };
    base + usize::from(half_params)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantizes_from_min_8bit_size_on_and_rounds_blocks_up() {
        assert_eq!(state_bytes(4095), vec![4 * 4095, 4 * 4095]);
        // 4096 elements: 16 blocks
        assert_eq!(state_bytes(4096), vec![4096, 4096, 64, 64]);
        // a partial last block has its own maximum
        assert_eq!(state_bytes(4097), vec![4097, 4097, 68, 68]);
        // about 2.03 bytes per element for large tensors, against 8 in f32
        let n = 1 << 20;
        let total: u64 = state_bytes(n).iter().sum();
        assert_eq!(total, 2 * n + 2 * 4 * n / 256);
    }

    #[test]
    fn cpu_step_holds_five_buffers_for_quantized_state() {
        assert_eq!(cpu_step_buffers(1 << 20, false), 5);
        assert_eq!(cpu_step_buffers(100, false), 3);
        assert_eq!(cpu_step_buffers(1 << 20, true), 6);
    }
}
