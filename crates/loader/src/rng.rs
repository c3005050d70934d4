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
        loop {
            let x = self.next_u64();
            // `x` is accepted when below `u64::MAX - u64::MAX % n`; as `u64::MAX % n < n`,
            // every `x <= u64::MAX - n` is, and only the top `n` values need the division that
            // finds the limit (the same numbers come out either way, one division sooner).
            if x <= u64::MAX - n || x < u64::MAX - (u64::MAX % n) {
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

    /// `below` as first written: the rejection limit computed for every draw.
    fn below_reference(r: &mut Rng, n: u64) -> u64 {
        let zone = u64::MAX - (u64::MAX % n);
        loop {
            let x = r.next_u64();
            if x < zone {
                return x % n;
            }
        }
    }

    #[test]
    fn below_draws_the_same_numbers_as_the_reference_formula() {
        for seed in 0..200u64 {
            let (mut a, mut b) = (Rng::new(seed), Rng::new(seed));
            for n in [
                1,
                2,
                3,
                7,
                1000,
                65_536,
                (1 << 63) + 1,
                u64::MAX - 1,
                u64::MAX,
            ] {
                assert_eq!(a.below(n), below_reference(&mut b, n), "seed {seed}, n {n}");
            }
        }
        // Near the top of the range (where rejections happen) the two agree value by value.
        let n = (u64::MAX / 3) * 2;
        let (mut a, mut b) = (Rng::new(5), Rng::new(5));
        for _ in 0..10_000 {
            assert_eq!(a.below(n), below_reference(&mut b, n));
        }
    }

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

    // Known answers. SplitMix64 is Vigna's `splitmix64.c` (state += 0x9E3779B97F4A7C15, then
    // the two xor-shift-multiply rounds). The values below were computed by an independent
    // Python implementation of that definition; the seed-1234567 stream is also the published
    // reference sequence (Rosetta Code, "Pseudo-random numbers/Splitmix64"), and 0xe220a8397b1dcdaf
    // is the well-known first output for seed 0. Any change to the stream (constants, shifts,
    // increment order, the float or bounded-integer mapping, the seed mixing) fails here, and
    // with it every recorded shuffle order and augmentation draw.

    fn first<const N: usize>(seed: u64) -> [u64; N] {
        let mut r = Rng::new(seed);
        std::array::from_fn(|_| r.next_u64())
    }

    #[test]
    fn splitmix64_matches_the_published_reference_stream() {
        assert_eq!(
            first::<5>(1234567),
            [
                6457827717110365317,
                3203168211198807973,
                9817491932198370423,
                4593380528125082431,
                16408922859458223821,
            ]
        );
        assert_eq!(
            first::<5>(0),
            [
                0xe220_a839_7b1d_cdaf,
                0x6e78_9e6a_a1b9_65f4,
                0x06c4_5d18_8009_454f,
                0xf88b_b8a8_724c_81ec,
                0x1b39_896a_51a8_749b,
            ]
        );
        // The state wraps around 2^64.
        assert_eq!(
            first::<3>(u64::MAX),
            [
                0xe4d9_7177_1b65_2c20,
                0xe99f_f867_dbf6_82c9,
                0x382f_f84c_b272_81e9
            ]
        );
    }

    #[test]
    fn floats_bounded_integers_and_mixing_match_known_answers() {
        // next_f64: the top 53 bits times 2^-53.
        let mut r = Rng::new(7);
        let f: Vec<f64> = (0..3).map(|_| r.next_f64()).collect();
        assert_eq!(
            f,
            [0.3898297483912715, 0.01678829452815611, 0.9007606806068834]
        );
        // below: rejection above the largest multiple of n, then modulo.
        let mut r = Rng::new(9);
        let b: Vec<u64> = (0..10).map(|_| r.below(10)).collect();
        assert_eq!(b, [8, 6, 8, 4, 1, 0, 8, 5, 7, 3]);
        // A bound just above 2^63 rejects almost half of all draws: the rejection path is
        // exercised (the first draw of seed 9 is rejected).
        let mut r = Rng::new(9);
        let b: Vec<u64> = (0..4).map(|_| r.below((1 << 63) + 1)).collect();
        assert_eq!(
            b,
            [
                4894335158745139638,
                4843255778055325601,
                2114146066760625150,
                4040493311852077417
            ]
        );
        // mix: a fixed generator whose state absorbs each part plus the previous output.
        assert_eq!(mix(&[]), 0);
        assert_eq!(mix(&[1, 2]), 0xf9c2_ba58_34b6_9665);
        assert_eq!(mix(&[2, 1]), 0x6b9e_3666_b6e8_9fb5);
        assert_eq!(mix(&[42, 0]), 0x644d_31f1_64a3_19f9);
    }
}
