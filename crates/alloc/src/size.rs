//! Size rules: request rounding, pool choice, segment sizes and human-readable sizes.
//!
//! The constants and functions mirror PyTorch's CUDA caching allocator byte for byte, so a
//! trace replayed through trainmem reserves the same number of bytes.

use crate::config::RoundupPower2Divisions;

/// Every request is rounded up to at least this many bytes, and to a multiple of it.
pub const MIN_BLOCK_SIZE: u64 = 512;
/// The largest request served from the small pool (1 MiB).
pub const SMALL_SIZE: u64 = 1 << 20;
/// Segment size for small-pool requests (2 MiB).
pub const SMALL_BUFFER: u64 = 2 << 20;
/// Requests below this size (10 MiB) that miss the cache get a [`LARGE_BUFFER`] segment.
pub const MIN_LARGE_ALLOC: u64 = 10 << 20;
/// Segment size for requests between 1 MiB and 10 MiB (20 MiB).
pub const LARGE_BUFFER: u64 = 20 << 20;
/// Segments for requests of 10 MiB or more are rounded up to a multiple of this (2 MiB).
pub const ROUND_LARGE: u64 = 2 << 20;
/// One mebibyte.
pub const MIB: u64 = 1 << 20;

/// Which block pool a request (or a segment) belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PoolKind {
    /// Rounded requests of at most 1 MiB, packed into 2 MiB segments.
    Small,
    /// Rounded requests above 1 MiB.
    Large,
}

impl PoolKind {
    /// The pool serving a request of `rounded_size` bytes (already rounded).
    #[inline]
    pub fn for_size(rounded_size: u64) -> Self {
        if rounded_size <= SMALL_SIZE {
            PoolKind::Small
        } else {
            PoolKind::Large
        }
    }

    /// `"small"` or `"large"`, as a snapshot's `segment_type` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            PoolKind::Small => "small",
            PoolKind::Large => "large",
        }
    }
}

/// Rounds a request up to a multiple of [`MIN_BLOCK_SIZE`] (at least 512 B), or to the next
/// power-of-two division when `divisions` asks for it. Returns `None` when the rounded size
/// does not fit in a `u64`.
///
/// Rule: below 512 B → 512 B; else if the interval's divisions `d > 1` and `size > 512·d`,
/// round up to the next of `d` equal steps between the surrounding powers of two (5000 B with
/// 4 divisions → 5120 B; 300 MiB with 4 divisions → 320 MiB); else round up to a multiple of
/// 512 B. The `size > 512·d` guard is PyTorch's: with 4 divisions, 1200 B is not above 2048 B
/// and rounds to 1536 B (PyTorch's documentation example of 1200 → 1280 leaves the guard out;
/// trainmem follows the code so reserved bytes match).
#[inline]
pub fn round_size(size: u64, divisions: &RoundupPower2Divisions) -> Option<u64> {
    if size < MIN_BLOCK_SIZE {
        return Some(MIN_BLOCK_SIZE);
    }
    let d = divisions.divisions_for(size);
    if d > 1 && size > MIN_BLOCK_SIZE.saturating_mul(d) {
        return roundup_power2_next_division(size, d);
    }
    round_up(size, MIN_BLOCK_SIZE)
}

/// Rounds `size` up to the next of `divisions` equal steps between the power of two below it
/// and the one above it. A power of two is returned unchanged.
fn roundup_power2_next_division(size: u64, divisions: u64) -> Option<u64> {
    if size.is_power_of_two() {
        return Some(size);
    }
    let floor = 1u64 << (63 - size.leading_zeros());
    // `divisions` is a power of two (the configuration enforces it).
    let step = floor >> (63 - divisions.leading_zeros());
    if step == 0 {
        return floor.checked_mul(2);
    }
    let down = size & !(step - 1);
    if down == size {
        Some(size)
    } else {
        down.checked_add(step)
    }
}

/// Rounds `value` up to a multiple of `multiple` (a power of two), or `None` on overflow.
#[inline]
pub(crate) fn round_up(value: u64, multiple: u64) -> Option<u64> {
    value
        .checked_add(multiple - 1)
        .map(|v| v / multiple * multiple)
}

/// The segment (device allocation) size used when a rounded request misses the cache:
/// 2 MiB for small requests, 20 MiB for requests below 10 MiB, otherwise the request rounded
/// up to a multiple of 2 MiB. `None` on overflow.
#[inline]
pub fn allocation_size(rounded_size: u64) -> Option<u64> {
    if rounded_size <= SMALL_SIZE {
        Some(SMALL_BUFFER)
    } else if rounded_size < MIN_LARGE_ALLOC {
        Some(LARGE_BUFFER)
    } else {
        round_up(rounded_size, ROUND_LARGE)
    }
}

/// Formats a byte count the way the out-of-memory message does: `"N bytes"` up to 1024 B,
/// then KiB, MiB or GiB with two decimals (`20.00 MiB`).
pub fn format_size(bytes: u64) -> String {
    const KIB: f64 = 1024.0;
    if bytes <= 1024 {
        format!("{bytes} bytes")
    } else if bytes <= 1 << 20 {
        format!("{:.2} KiB", bytes as f64 / KIB)
    } else if bytes <= 1 << 30 {
        format!("{:.2} MiB", bytes as f64 / (KIB * KIB))
    } else {
        format!("{:.2} GiB", bytes as f64 / (KIB * KIB * KIB))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn none() -> RoundupPower2Divisions {
        RoundupPower2Divisions::default()
    }

    #[test]
    fn rounds_to_512_multiples() {
        assert_eq!(round_size(0, &none()), Some(512));
        assert_eq!(round_size(1, &none()), Some(512));
        assert_eq!(round_size(512, &none()), Some(512));
        assert_eq!(round_size(513, &none()), Some(1024));
        assert_eq!(round_size(1200, &none()), Some(1536));
        assert_eq!(round_size(3 * MIB + 1, &none()), Some(3 * MIB + 512));
    }

    #[test]
    fn rounds_to_power2_divisions() {
        let four = RoundupPower2Divisions::uniform(4);
        // 1200 <= 512*4: the guard keeps plain 512 rounding (as PyTorch's code does).
        assert_eq!(round_size(1200, &four), Some(1536));
        // The next-division arithmetic itself gives 1280 for 1200 with 4 steps of 256.
        assert_eq!(roundup_power2_next_division(1200, 4), Some(1280));
        // 2 divisions: 1200 > 1024, steps of 512 in [1024, 2048) → 1536.
        assert_eq!(
            round_size(1200, &RoundupPower2Divisions::uniform(2)),
            Some(1536)
        );
        // Above the guard: 2100 in [2048, 4096) with 4 steps of 512 → 2560.
        assert_eq!(round_size(2100, &four), Some(2560));
        // 2048 is <= 512*4, so plain 512 rounding applies.
        assert_eq!(round_size(2000, &four), Some(2048));
        // Powers of two stay unchanged.
        assert_eq!(round_size(4096, &four), Some(4096));
        // 5000 lies in [4096, 8192) with steps of 1024 → 5120.
        assert_eq!(round_size(5000, &four), Some(5120));
        // 300 MiB with 4 divisions: [256 MiB, 512 MiB) in steps of 64 MiB → 320 MiB.
        assert_eq!(round_size(300 * MIB, &four), Some(320 * MIB));
        let eight = RoundupPower2Divisions::uniform(8);
        // [256 MiB, 512 MiB) in steps of 32 MiB → 320 MiB exactly for 300 MiB.
        assert_eq!(round_size(300 * MIB, &eight), Some(320 * MIB));
        assert_eq!(round_size(260 * MIB, &eight), Some(288 * MIB));
    }

    #[test]
    fn rounding_never_overflows() {
        assert_eq!(round_size(u64::MAX, &none()), None);
        assert_eq!(
            round_size(u64::MAX, &RoundupPower2Divisions::uniform(4)),
            None
        );
        assert_eq!(round_size(u64::MAX - 100, &none()), None);
        assert_eq!(allocation_size(u64::MAX), None);
        // The largest 512-multiple survives.
        let top = u64::MAX / 512 * 512;
        assert_eq!(round_size(top, &none()), Some(top));
    }

    #[test]
    fn segment_sizes() {
        assert_eq!(allocation_size(512), Some(2 * MIB));
        assert_eq!(allocation_size(MIB), Some(2 * MIB));
        assert_eq!(allocation_size(MIB + 512), Some(20 * MIB));
        assert_eq!(allocation_size(10 * MIB - 512), Some(20 * MIB));
        assert_eq!(allocation_size(10 * MIB), Some(10 * MIB));
        assert_eq!(allocation_size(11 * MIB), Some(12 * MIB));
        assert_eq!(allocation_size(12 * MIB), Some(12 * MIB));
        assert_eq!(allocation_size(100 * MIB + 512), Some(102 * MIB));
    }

    #[test]
    fn pools() {
        assert_eq!(PoolKind::for_size(MIB), PoolKind::Small);
        assert_eq!(PoolKind::for_size(MIB + 512), PoolKind::Large);
    }

    #[test]
    fn formats_sizes() {
        assert_eq!(format_size(0), "0 bytes");
        assert_eq!(format_size(1024), "1024 bytes");
        assert_eq!(format_size(1536), "1.50 KiB");
        assert_eq!(format_size(MIB), "1024.00 KiB");
        assert_eq!(format_size(20 * MIB), "20.00 MiB");
        assert_eq!(format_size(3 << 30), "3.00 GiB");
        assert_eq!(format_size(1 << 30), "1024.00 MiB");
    }
}
