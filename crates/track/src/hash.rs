//! A hasher for buffer keys (addresses and ids): splitmix64's finaliser, no per-process seed.
//! The keys are chosen by backends, not by users, so flooding is no concern here; addresses are
//! aligned, so every bit of the key must reach the low bits the map indexes by.

use std::hash::{BuildHasherDefault, Hasher};

/// Hashes one `u64` with splitmix64's finaliser.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_u64(&mut self, key: u64) {
        let mut z = self.0 ^ key;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        self.0 = z ^ (z >> 31);
    }
}

/// The `BuildHasher` of the ledger's key map.
pub(crate) type KeyHash = BuildHasherDefault<KeyHasher>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn aligned_addresses_spread_over_the_low_bits() {
        let h = KeyHash::default();
        // 256 addresses 64 bytes apart fill at least 140 of 256 low-byte buckets (a random hash
        // fills about 162; an identity-like hash of aligned keys fills 4).
        let mut seen = [false; 256];
        for i in 0..256u64 {
            seen[(h.hash_one(0x7f00_0000_0000 + i * 64) & 0xff) as usize] = true;
        }
        assert!(seen.iter().filter(|s| **s).count() >= 140);
    }
}
