//! Byte sizes written by people: `24GiB`, `512MiB`, `80GB`, `1.5 GiB`, `1073741824`.

use anyhow::{Context, bail};

/// Parses a byte size.
///
/// Accepts a plain number of bytes, or a number (integer or decimal) followed by a unit:
/// `B`; binary `KiB MiB GiB TiB` (and the short forms `K M G T`, read as binary the way
/// PyTorch's tools print them); decimal `KB MB GB TB`. Units are case-insensitive and may be
/// separated from the number by spaces. Fractions are rounded down to whole bytes.
pub fn parse_size(text: &str) -> anyhow::Result<u64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number = number.replace('_', "");
    if number.is_empty() {
        bail!("`{text}` is not a size: it must start with a number (e.g. 24GiB, 512MiB, 80GB)");
    }
    let multiplier: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        other => {
            bail!("`{text}`: unknown unit `{other}` (use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)")
        }
    };
    if let Ok(whole) = number.parse::<u64>() {
        return whole
            .checked_mul(multiplier)
            .with_context(|| format!("`{text}` is too large"));
    }
    let value: f64 = number
        .parse()
        .with_context(|| format!("`{text}`: `{number}` is not a number"))?;
    let bytes = value * multiplier as f64;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        bail!("`{text}` is too large");
    }
    Ok(bytes as u64)
}

/// Formats bytes the way PyTorch's `format_size` does: `N bytes`, or KiB/MiB/GiB with two
/// decimals.
pub fn format_bytes(bytes: u64) -> String {
    const KIB: f64 = 1024.0;
    let b = bytes as f64;
    if bytes < 1024 {
        format!("{bytes} bytes")
    } else if b < KIB * KIB {
        format!("{:.2} KiB", b / KIB)
    } else if b < KIB * KIB * KIB {
        format!("{:.2} MiB", b / (KIB * KIB))
    } else {
        format!("{:.2} GiB", b / (KIB * KIB * KIB))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_bytes() {
        assert_eq!(parse_size("1073741824").unwrap(), 1 << 30);
        assert_eq!(parse_size(" 512 ").unwrap(), 512);
        assert_eq!(parse_size("1_000").unwrap(), 1000);
        assert_eq!(parse_size("64B").unwrap(), 64);
    }

    #[test]
    fn binary_and_decimal_units() {
        assert_eq!(parse_size("24GiB").unwrap(), 24 << 30);
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("80GB").unwrap(), 80_000_000_000);
        assert_eq!(parse_size("4 kib").unwrap(), 4096);
        assert_eq!(parse_size("2M").unwrap(), 2 << 20);
        assert_eq!(parse_size("1TB").unwrap(), 1_000_000_000_000);
    }

    #[test]
    fn fractions_round_down() {
        assert_eq!(parse_size("1.5GiB").unwrap(), 3 << 29);
        assert_eq!(parse_size("0.5KiB").unwrap(), 512);
        assert_eq!(parse_size("1.0001B").unwrap(), 1);
    }

    #[test]
    fn rejects_garbage() {
        for bad in [
            "",
            "GiB",
            "12 parsecs",
            "1.2.3GiB",
            "-5",
            "99999999999999999999TiB",
        ] {
            assert!(parse_size(bad).is_err(), "{bad:?} should be rejected");
        }
        let msg = format!("{:#}", parse_size("12 parsecs").unwrap_err());
        assert!(msg.contains("unknown unit `parsecs`"), "{msg}");
    }

    #[test]
    fn formats_like_pytorch() {
        assert_eq!(format_bytes(512), "512 bytes");
        assert_eq!(format_bytes(20 << 20), "20.00 MiB");
        assert_eq!(format_bytes(3 << 29), "1.50 GiB");
        assert_eq!(format_bytes(1536), "1.50 KiB");
    }

    proptest::proptest! {
        /// Whole numbers with a unit parse to the exact product.
        #[test]
        fn whole_sizes_are_exact(n in 0u64..1_000_000, unit in 0usize..6) {
            let (suffix, mult) = [("", 1u64), ("KiB", 1 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30), ("MB", 1_000_000), ("GB", 1_000_000_000)][unit];
            proptest::prop_assert_eq!(parse_size(&format!("{n}{suffix}")).unwrap(), n * mult);
        }
    }
}
