//! A hasher for the crate's own small keys (addresses, ids, short id lists and strings),
//! which SipHash would make the largest cost of reading or replaying a long trace: words
//! folded FxHash's way (rotate, xor, multiply) and finished with a murmur3 mix, so keys that
//! differ only in high bits (512-byte-aligned addresses) still spread over the buckets. Not
//! for keys an adversary picks to collide: the maps here hold a trace's own addresses and
//! ids, and a collision costs time, never a wrong answer.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// The hasher (see the module docs).
#[derive(Default, Clone, Copy)]
pub(crate) struct WordHasher(u64);

const SEED: u64 = 0x517c_c1b7_2722_0a95;

impl WordHasher {
    #[inline]
    fn add(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(SEED);
    }
}

impl Hasher for WordHasher {
    #[inline]
    fn finish(&self) -> u64 {
        let mut x = self.0;
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
        x ^= x >> 33;
        x
    }
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.add(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(w) ^ ((rest.len() as u64) << 59));
        }
    }
    #[inline]
    fn write_u8(&mut self, n: u8) {
        self.add(u64::from(n));
    }
    #[inline]
    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }
    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }
    #[inline]
    fn write_i64(&mut self, n: i64) {
        self.add(n as u64);
    }
    #[inline]
    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }
}

/// A map with [`WordHasher`].
pub(crate) type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<WordHasher>>;

/// A set with [`WordHasher`].
pub(crate) type FastSet<K> = std::collections::HashSet<K, BuildHasherDefault<WordHasher>>;

#[cfg(test)]
mod tests {
    use std::hash::BuildHasher;

    use super::*;

    fn hash<T: std::hash::Hash>(t: T) -> u64 {
        BuildHasherDefault::<WordHasher>::default().hash_one(t)
    }

    #[test]
    fn aligned_addresses_spread_over_the_low_bits_and_lists_differ() {
        // 4096 addresses 512 bytes apart fill most of 4096 buckets chosen by the low 12 bits
        let buckets: std::collections::HashSet<u64> = (0..4096u64)
            .map(|i| hash(0x7f00_0000_0000 + 512 * i) & 0xfff)
            .collect();
        assert!(buckets.len() > 2400, "{}", buckets.len());
        assert_ne!(hash([1u32, 2, 3].as_slice()), hash([1u32, 2].as_slice()));
        assert_ne!(hash([1u32, 2].as_slice()), hash([2u32, 1].as_slice()));
        assert_ne!(hash("frames"), hash("framez"));
    }
}
