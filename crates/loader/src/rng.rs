//! A small, fast, seedable random generator (SplitMix64) and seed mixing, so every random
//! choice of the loader is reproducible from `(seed, epoch, batch)` without extra crates.

/// SplitMix64: 64 bits of state, statistically fine for shuffling and augmentation.
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform float in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// A uniform integer in `0..n` (`n > 0`), without modulo bias.
    pub fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0);
        let zone = u64::MAX - (u64::MAX % n);
        loop {
            let x = self.next_u64();
            if x < zone {
                return x % n;
            }
        }
    }
}

/// Mixes several values into one seed (order matters).
pub fn mix(parts: &[u64]) -> u64 {
    let mut r = Rng::new(0x5EED_0F7A_1A4E_u64);
    let mut acc = 0u64;
    for &p in parts {
        r.state ^= p.wrapping_add(acc);
        acc = r.next_u64();
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reproducible_and_spread() {
        let a: Vec<u64> = (0..5).map(|_| Rng::new(3).next_u64()).collect();
        assert!(a.windows(2).all(|w| w[0] == w[1]));
        let mut r = Rng::new(9);
        let mut hist = [0usize; 4];
        for _ in 0..4000 {
            hist[r.below(4) as usize] += 1;
        }
        assert!(hist.iter().all(|&h| (800..1200).contains(&h)), "{hist:?}");
        assert_ne!(mix(&[1, 2]), mix(&[2, 1]));
        assert_eq!(mix(&[1, 2]), mix(&[1, 2]));
        let f = Rng::new(1).next_f64();
        assert!((0.0..1.0).contains(&f));
    }
}
