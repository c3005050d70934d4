//! Byte sizes as people write them (`24GiB`, `1.5 GB`, `512MiB`, `4096`), parsed and printed
//! with the one unit rule every trainmem command and file uses: `KiB`, `MiB`, `GiB`, `TiB`
//! are powers of 2, `KB`, `MB`, `GB`, `TB` powers of 10.

use std::fmt;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A number of bytes. Deserialises from an integer or a string with a unit (`B`, `KB`, `MB`,
/// `GB`, `TB` are powers of 1000; `KiB`, `MiB`, `GiB`, `TiB` powers of 1024; `K`/`M`/`G`/`T`
/// alone mean the binary units). Serialises as a string in the largest exact binary unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// The number of bytes.
    pub fn bytes(self) -> u64 {
        self.0
    }
}

/// Parses a byte size such as `24GiB`, `1.5 GB`, `512` (bytes).
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let num: String = num.chars().filter(|&c| c != '_').collect();
    if num.is_empty() {
        return Err(format!(
            "`{text}` is not a byte size (expected e.g. `24GiB` or `4096`)"
        ));
    }
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        other => {
            return Err(format!(
                "`{text}`: unknown unit `{other}` (use B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)"
            ));
        }
    };
    // Whole numbers are exact (no detour through f64, which loses bytes above 2^53).
    if let Ok(whole) = num.parse::<u64>() {
        return whole
            .checked_mul(mult)
            .ok_or_else(|| format!("`{text}` is out of range"));
    }
    let value: f64 = num
        .parse()
        .map_err(|_| format!("`{text}` is not a byte size (bad number `{num}`)"))?;
    let bytes = value * mult as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(format!("`{text}` is out of range"));
    }
    Ok(bytes.round() as u64)
}

/// Formats bytes for people: `1.50 GiB`, `512 B`.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

/// Formats a signed byte difference: `+1.00 GiB`, `-3 B`.
pub fn human_signed(delta: i128) -> String {
    let sign = if delta < 0 { "-" } else { "+" };
    format!(
        "{sign}{}",
        human(delta.unsigned_abs().min(u64::MAX as u128) as u64)
    )
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        for (unit, size) in [
            ("TiB", 1u64 << 40),
            ("GiB", 1 << 30),
            ("MiB", 1 << 20),
            ("KiB", 1 << 10),
        ] {
            if b >= size && b.is_multiple_of(size) {
                return write!(f, "{}{unit}", b / size);
            }
        }
        write!(f, "{b}B")
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = ByteSize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a byte size: an integer or a string like \"24GiB\"")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ByteSize, E> {
                u64::try_from(v)
                    .map(ByteSize)
                    .map_err(|_| E::custom(format!("byte size {v} is negative")))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<ByteSize, E> {
                if v.is_finite() && v >= 0.0 {
                    Ok(ByteSize(v.round() as u64))
                } else {
                    Err(E::custom(format!("byte size {v} is out of range")))
                }
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ByteSize, E> {
                parse_bytes(v).map(ByteSize).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse_bytes("24GiB").unwrap(), 24 << 30);
        assert_eq!(parse_bytes("1.5 GB").unwrap(), 1_500_000_000);
        assert_eq!(parse_bytes("4096").unwrap(), 4096);
        assert_eq!(parse_bytes("2M").unwrap(), 2 << 20);
        assert_eq!(parse_bytes("1_000kb").unwrap(), 1_000_000);
        assert!(
            parse_bytes("12 parsecs")
                .unwrap_err()
                .contains("unknown unit")
        );
        assert!(parse_bytes("GiB").is_err());
        assert_eq!(parse_bytes(" 512 ").unwrap(), 512);
        assert_eq!(parse_bytes("80GB").unwrap(), 80_000_000_000);
        assert_eq!(parse_bytes("4 kib").unwrap(), 4096);
        assert_eq!(parse_bytes("1.5GiB").unwrap(), 3 << 29);
        assert_eq!(parse_bytes("0.5KiB").unwrap(), 512);
        for bad in [
            "",
            "1.2.3GiB",
            "-5",
            "99999999999999999999TiB",
            "16777217TiB",
        ] {
            assert!(parse_bytes(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn whole_numbers_are_exact_beyond_f64_precision() {
        // 2^53 + 1 is not representable in f64.
        assert_eq!(
            parse_bytes("9007199254740993").unwrap(),
            9_007_199_254_740_993
        );
        assert_eq!(parse_bytes("8388607TiB").unwrap(), 8_388_607u64 << 40);
    }

    proptest::proptest! {
        /// Whole numbers with a unit parse to the exact product.
        #[test]
        fn whole_sizes_are_exact(n in 0u64..1_000_000, unit in 0usize..6) {
            let (suffix, mult) = [("", 1u64), ("KiB", 1 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30), ("MB", 1_000_000), ("GB", 1_000_000_000)][unit];
            proptest::prop_assert_eq!(parse_bytes(&format!("{n}{suffix}")).unwrap(), n * mult);
        }
    }

    #[test]
    fn display_round_trips() {
        for b in [0u64, 1, 1023, 1024, 3 << 30, (3 << 30) + 1] {
            assert_eq!(parse_bytes(&ByteSize(b).to_string()).unwrap(), b);
        }
        assert_eq!(human(1536), "1.50 KiB");
        assert_eq!(human_signed(-512), "-512 B");
    }
}
