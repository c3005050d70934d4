//! Allocator configuration: the PyTorch-style option string and a programmatic builder.
//!
//! ```
//! use trainmem_alloc::AllocatorConfig;
//! let c: AllocatorConfig = "max_split_size_mb:128,roundup_power2_divisions:4".parse().unwrap();
//! assert_eq!(c.max_split_size(), Some(128 << 20));
//! let d = AllocatorConfig::default().with_garbage_collection_threshold(0.8).unwrap();
//! assert_eq!(d.garbage_collection_threshold(), Some(0.8));
//! ```

use std::fmt;
use std::str::FromStr;

use crate::size::{LARGE_BUFFER, MIB};

/// Number of power-of-two size intervals that carry their own division count
/// (1 MiB, 2 MiB, … up to 64 GiB; sizes below 1 MiB use the first, above use the last).
pub const ROUNDUP_INTERVALS: usize = 16;

/// An error in an allocator configuration string or value. Every variant names the key and
/// the offending value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// The key is not one trainmem understands.
    #[error(
        "unknown allocator option `{key}` (known: max_split_size_mb, max_non_split_rounding_mb, roundup_power2_divisions, garbage_collection_threshold, expandable_segments, backend)"
    )]
    UnknownKey {
        /// The key as written.
        key: String,
    },
    /// The value is malformed or out of range for the key.
    #[error("invalid value `{value}` for allocator option `{key}`: {reason}")]
    InvalidValue {
        /// The key.
        key: String,
        /// The value as written.
        value: String,
        /// Why it was rejected.
        reason: String,
    },
    /// The option is valid in PyTorch but trainmem does not implement that setting.
    #[error("allocator option `{key}:{value}` is not supported by trainmem: {reason}")]
    Unsupported {
        /// The key.
        key: String,
        /// The value.
        value: String,
        /// What is missing.
        reason: String,
    },
    /// The string is not a list of `key:value` pairs.
    #[error("malformed allocator configuration `{input}`: {reason}")]
    Syntax {
        /// The fragment that could not be read.
        input: String,
        /// What was expected.
        reason: String,
    },
}

fn invalid(key: &str, value: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::InvalidValue {
        key: key.to_string(),
        value: value.to_string(),
        reason: reason.into(),
    }
}

/// Per-interval `roundup_power2_divisions`: how many equal steps each power-of-two interval is
/// cut into when rounding a request (0 or 1 = plain 512 B rounding).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize)]
pub struct RoundupPower2Divisions([u64; ROUNDUP_INTERVALS]);

impl RoundupPower2Divisions {
    /// The same division count for every size (the single-value form, e.g. `4`).
    ///
    /// # Panics
    /// If `divisions` is neither 0 nor a power of two (a programmer error; strings go through
    /// [`AllocatorConfig::parse`], which returns an error instead).
    pub fn uniform(divisions: u64) -> Self {
        assert!(
            divisions == 0 || divisions.is_power_of_two(),
            "roundup divisions must be 0 or a power of two, got {divisions}"
        );
        RoundupPower2Divisions([divisions; ROUNDUP_INTERVALS])
    }

    /// Division counts per interval: entry `i` covers sizes in `[2^i MiB, 2^(i+1) MiB)`
    /// (entry 0 also covers everything below 1 MiB, entry 15 everything from 32 GiB).
    /// Each entry must be 0 or a power of two.
    pub fn from_intervals(intervals: [u64; ROUNDUP_INTERVALS]) -> Result<Self, ConfigError> {
        for d in intervals {
            if d != 0 && !d.is_power_of_two() {
                return Err(invalid(
                    "roundup_power2_divisions",
                    &d.to_string(),
                    "divisions must be 0 or a power of two",
                ));
            }
        }
        Ok(RoundupPower2Divisions(intervals))
    }

    /// The division count per interval.
    pub fn intervals(&self) -> &[u64; ROUNDUP_INTERVALS] {
        &self.0
    }

    /// The division count applying to a request of `size` bytes.
    #[inline]
    pub fn divisions_for(&self, size: u64) -> u64 {
        let log = 63u32.saturating_sub(size.leading_zeros()) as i64;
        let index = (log - 20).clamp(0, ROUNDUP_INTERVALS as i64 - 1) as usize;
        self.0[index]
    }

    fn parse(value: &str) -> Result<Self, ConfigError> {
        const KEY: &str = "roundup_power2_divisions";
        let v = value.trim();
        if let Some(inner) = v.strip_prefix('[') {
            let inner = inner
                .strip_suffix(']')
                .ok_or_else(|| invalid(KEY, value, "a list must end with `]`"))?;
            let mut out = [0u64; ROUNDUP_INTERVALS];
            let mut first = true;
            let mut last_index = 0usize;
            for entry in inner.split(',') {
                let entry = entry.trim();
                let (bound, div) = entry.split_once(':').ok_or_else(|| {
                    invalid(
                        KEY,
                        value,
                        format!("list entry `{entry}` is not `MB:divisions`"),
                    )
                })?;
                let div: u64 = div.trim().parse().map_err(|_| {
                    invalid(
                        KEY,
                        value,
                        format!("`{}` is not a whole number", div.trim()),
                    )
                })?;
                if div != 0 && !div.is_power_of_two() {
                    return Err(invalid(
                        KEY,
                        value,
                        format!("divisions {div} must be 0 or a power of two"),
                    ));
                }
                let bound = bound.trim();
                if bound == ">" {
                    for slot in out.iter_mut().skip(last_index + 1) {
                        *slot = div;
                    }
                } else {
                    let mb: u64 = bound.parse().map_err(|_| {
                        invalid(
                            KEY,
                            value,
                            format!("interval `{bound}` is not a whole number"),
                        )
                    })?;
                    if !mb.is_power_of_two() {
                        return Err(invalid(
                            KEY,
                            value,
                            format!("interval {mb} (MB) must be a power of two"),
                        ));
                    }
                    let index = (mb.trailing_zeros() as usize).min(ROUNDUP_INTERVALS - 1);
                    if first {
                        for slot in out.iter_mut().take(index) {
                            *slot = div;
                        }
                        first = false;
                    }
                    out[index] = div;
                    last_index = index;
                }
            }
            Ok(RoundupPower2Divisions(out))
        } else {
            let div: u64 = v.parse().map_err(|_| {
                invalid(
                    KEY,
                    value,
                    "expected a power of two or a `[MB:div,...]` list",
                )
            })?;
            if !div.is_power_of_two() {
                return Err(invalid(KEY, value, "divisions must be a power of two"));
            }
            Ok(RoundupPower2Divisions([div; ROUNDUP_INTERVALS]))
        }
    }
}

/// Allocator settings (PyTorch's `PYTORCH_ALLOC_CONF` knobs that trainmem implements).
///
/// Build it from a string with [`AllocatorConfig::parse`] / `str::parse`, or from code with
/// the `with_*` methods. The defaults are PyTorch's: no split limit, 20 MiB non-split rounding,
/// no power-of-two divisions, no garbage collection, no expandable segments.
#[derive(Clone, Debug, PartialEq)]
pub struct AllocatorConfig {
    max_split_size: Option<u64>,
    max_non_split_rounding: u64,
    roundup_power2_divisions: RoundupPower2Divisions,
    garbage_collection_threshold: Option<f64>,
    expandable_segments: bool,
}

impl Default for AllocatorConfig {
    fn default() -> Self {
        AllocatorConfig {
            max_split_size: None,
            max_non_split_rounding: LARGE_BUFFER,
            roundup_power2_divisions: RoundupPower2Divisions::default(),
            garbage_collection_threshold: None,
            expandable_segments: false,
        }
    }
}

impl AllocatorConfig {
    /// Parses `key:value` pairs separated by commas, e.g.
    /// `max_split_size_mb:128,roundup_power2_divisions:[256:1,512:2,>:8],garbage_collection_threshold:0.8`.
    ///
    /// Keys: `max_split_size_mb` (≥ 20), `max_non_split_rounding_mb` (≥ 20),
    /// `roundup_power2_divisions` (a power of two, or a `[MB:div,...,>:div]` list),
    /// `garbage_collection_threshold` (0 < x < 1), `expandable_segments` (`True` or `False`),
    /// `backend` (`native` only). An empty string gives the defaults.
    pub fn parse(input: &str) -> Result<Self, ConfigError> {
        let mut cfg = AllocatorConfig::default();
        for entry in split_top_level(input)? {
            let entry = entry.trim();
            if entry.is_empty() {
                continue;
            }
            let (key, value) = entry.split_once(':').ok_or_else(|| ConfigError::Syntax {
                input: entry.to_string(),
                reason: "expected `key:value`".into(),
            })?;
            cfg.set(key.trim(), value.trim())?;
        }
        Ok(cfg)
    }

    /// Sets one option from its string form (the same keys as [`AllocatorConfig::parse`]).
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), ConfigError> {
        match key {
            "max_split_size_mb" => {
                let mb = parse_mb(key, value)?;
                self.max_split_size = Some(mb.saturating_mul(MIB));
            }
            "max_non_split_rounding_mb" => {
                let mb = parse_mb(key, value)?;
                self.max_non_split_rounding = mb.saturating_mul(MIB);
            }
            "roundup_power2_divisions" => {
                self.roundup_power2_divisions = RoundupPower2Divisions::parse(value)?;
            }
            "garbage_collection_threshold" => {
                let t: f64 = value
                    .parse()
                    .map_err(|_| invalid(key, value, "expected a number between 0 and 1"))?;
                *self = std::mem::take(self)
                    .with_garbage_collection_threshold(t)
                    .map_err(|_| {
                        invalid(key, value, "must be greater than 0.0 and less than 1.0")
                    })?;
            }
            "expandable_segments" => match value {
                "False" | "false" => self.expandable_segments = false,
                "True" | "true" => self.expandable_segments = true,
                _ => return Err(invalid(key, value, "expected True or False")),
            },
            "backend" => match value {
                "native" => {}
                "cudaMallocAsync" => {
                    return Err(ConfigError::Unsupported {
                        key: key.into(),
                        value: value.into(),
                        reason: "only the native caching allocator is modelled".into(),
                    });
                }
                _ => return Err(invalid(key, value, "expected native")),
            },
            _ => return Err(ConfigError::UnknownKey { key: key.into() }),
        }
        Ok(())
    }

    /// Blocks of at least this size are never split, and are not used for smaller requests.
    pub fn with_max_split_size_mb(mut self, mb: u64) -> Result<Self, ConfigError> {
        if mb < LARGE_BUFFER / MIB {
            return Err(invalid(
                "max_split_size_mb",
                &mb.to_string(),
                "must be at least 20",
            ));
        }
        self.max_split_size = Some(mb.saturating_mul(MIB));
        Ok(self)
    }

    /// How far an oversize request may be over-served by a cached oversize block (≥ 20 MiB).
    pub fn with_max_non_split_rounding_mb(mut self, mb: u64) -> Result<Self, ConfigError> {
        if mb < LARGE_BUFFER / MIB {
            return Err(invalid(
                "max_non_split_rounding_mb",
                &mb.to_string(),
                "must be at least 20",
            ));
        }
        self.max_non_split_rounding = mb.saturating_mul(MIB);
        Ok(self)
    }

    /// Sets the power-of-two rounding divisions.
    pub fn with_roundup_power2_divisions(mut self, divisions: RoundupPower2Divisions) -> Self {
        self.roundup_power2_divisions = divisions;
        self
    }

    /// Enables garbage collection of cached blocks once reserved memory exceeds
    /// `threshold` × the allowed memory (needs a memory fraction, see
    /// [`CachingAllocator::set_memory_fraction`](crate::CachingAllocator::set_memory_fraction)).
    /// `0 < threshold < 1`.
    pub fn with_garbage_collection_threshold(
        mut self,
        threshold: f64,
    ) -> Result<Self, ConfigError> {
        if !(threshold > 0.0 && threshold < 1.0) {
            return Err(invalid(
                "garbage_collection_threshold",
                &threshold.to_string(),
                "must be greater than 0.0 and less than 1.0",
            ));
        }
        self.garbage_collection_threshold = Some(threshold);
        Ok(self)
    }

    /// Turns expandable segments on or off: with them on, each stream and pool has one
    /// segment that grows by mapping pages (2 MiB in the small pool, 20 MiB in the large one)
    /// instead of a new segment per miss, and gives whole free pages back on `empty_cache`.
    /// The device must support address reservation and page mapping (see
    /// [`DeviceMemory::map`](crate::DeviceMemory::map)).
    pub fn with_expandable_segments(mut self, on: bool) -> Self {
        self.expandable_segments = on;
        self
    }

    /// True when expandable segments are on.
    #[inline]
    pub fn expandable_segments(&self) -> bool {
        self.expandable_segments
    }

    /// The split limit in bytes (`None` = unlimited).
    pub fn max_split_size(&self) -> Option<u64> {
        self.max_split_size
    }

    /// The split limit in bytes, `u64::MAX` when unlimited (the form the rules compare with).
    #[inline]
    pub fn max_split_size_or_max(&self) -> u64 {
        self.max_split_size.unwrap_or(u64::MAX)
    }

    /// The largest over-serve allowed for an oversize request, in bytes (default 20 MiB).
    pub fn max_non_split_rounding(&self) -> u64 {
        self.max_non_split_rounding
    }

    /// The power-of-two rounding divisions.
    pub fn roundup_power2_divisions(&self) -> &RoundupPower2Divisions {
        &self.roundup_power2_divisions
    }

    /// The garbage-collection threshold, if enabled.
    pub fn garbage_collection_threshold(&self) -> Option<f64> {
        self.garbage_collection_threshold
    }
}

impl FromStr for AllocatorConfig {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        AllocatorConfig::parse(s)
    }
}

impl fmt::Display for AllocatorConfig {
    /// Writes the configuration back as an option string that [`AllocatorConfig::parse`] reads.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts: Vec<String> = Vec::new();
        if let Some(m) = self.max_split_size {
            parts.push(format!("max_split_size_mb:{}", m / MIB));
        }
        if self.max_non_split_rounding != LARGE_BUFFER {
            parts.push(format!(
                "max_non_split_rounding_mb:{}",
                self.max_non_split_rounding / MIB
            ));
        }
        let d = self.roundup_power2_divisions.intervals();
        if d.iter().all(|&x| x == d[0]) {
            if d[0] != 0 {
                parts.push(format!("roundup_power2_divisions:{}", d[0]));
            }
        } else {
            let list: Vec<String> = d
                .iter()
                .enumerate()
                .map(|(i, v)| format!("{}:{}", 1u64 << i, v))
                .collect();
            parts.push(format!("roundup_power2_divisions:[{}]", list.join(",")));
        }
        if let Some(t) = self.garbage_collection_threshold {
            parts.push(format!("garbage_collection_threshold:{t}"));
        }
        if self.expandable_segments {
            parts.push("expandable_segments:True".to_string());
        }
        write!(f, "{}", parts.join(","))
    }
}

fn parse_mb(key: &str, value: &str) -> Result<u64, ConfigError> {
    let mb: u64 = value
        .parse()
        .map_err(|_| invalid(key, value, "expected a whole number of MB"))?;
    if mb < LARGE_BUFFER / MIB {
        return Err(invalid(key, value, "must be at least 20"));
    }
    Ok(mb)
}

/// Splits on commas that are not inside `[...]`.
fn split_top_level(input: &str) -> Result<Vec<&str>, ConfigError> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in input.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => {
                depth -= 1;
                if depth < 0 {
                    return Err(ConfigError::Syntax {
                        input: input.into(),
                        reason: "unbalanced `]`".into(),
                    });
                }
            }
            ',' if depth == 0 => {
                out.push(&input[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(ConfigError::Syntax {
            input: input.into(),
            reason: "unclosed `[`".into(),
        });
    }
    out.push(&input[start..]);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_split_rounding_builder_takes_mib_and_refuses_under_twenty() {
        let c = AllocatorConfig::default()
            .with_max_non_split_rounding_mb(64)
            .unwrap();
        assert_eq!(c.max_non_split_rounding(), 64 * MIB);
        assert!(
            AllocatorConfig::default()
                .with_max_non_split_rounding_mb(19)
                .is_err()
        );
    }

    #[test]
    fn parses_full_string() {
        let c = AllocatorConfig::parse(
            "max_split_size_mb:128,roundup_power2_divisions:4,garbage_collection_threshold:0.8",
        )
        .unwrap();
        assert_eq!(c.max_split_size(), Some(128 * MIB));
        assert_eq!(c.roundup_power2_divisions().divisions_for(1200), 4);
        assert_eq!(c.garbage_collection_threshold(), Some(0.8));
        assert_eq!(c.max_non_split_rounding(), 20 * MIB);
        let back = AllocatorConfig::parse(&c.to_string()).unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn empty_is_default() {
        assert_eq!(
            AllocatorConfig::parse("").unwrap(),
            AllocatorConfig::default()
        );
        assert_eq!(
            AllocatorConfig::parse("expandable_segments:False,backend:native").unwrap(),
            AllocatorConfig::default()
        );
    }

    #[test]
    fn parses_interval_list() {
        let c =
            AllocatorConfig::parse("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]").unwrap();
        let d = c.roundup_power2_divisions().intervals();
        // Entries below the first bound take its value; `>` fills after the last bound.
        assert_eq!(&d[..8], &[1; 8]);
        assert_eq!(d[8], 1);
        assert_eq!(d[9], 2);
        assert_eq!(d[10], 4);
        assert_eq!(&d[11..], &[8; 5]);
        let r = c.roundup_power2_divisions();
        assert_eq!(r.divisions_for(300 * MIB), 1);
        assert_eq!(r.divisions_for(600 * MIB), 2);
        assert_eq!(r.divisions_for(1500 * MIB), 4);
        assert_eq!(r.divisions_for(3000 * MIB), 8);
        let back = AllocatorConfig::parse(&c.to_string()).unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn expandable_segments_round_trip() {
        let c = AllocatorConfig::parse("max_split_size_mb:128,expandable_segments:True").unwrap();
        assert!(c.expandable_segments());
        assert_eq!(
            c.to_string(),
            "max_split_size_mb:128,expandable_segments:True"
        );
        assert_eq!(AllocatorConfig::parse(&c.to_string()).unwrap(), c);
        assert!(
            !AllocatorConfig::parse("expandable_segments:False")
                .unwrap()
                .expandable_segments()
        );
        assert!(
            AllocatorConfig::default()
                .with_expandable_segments(true)
                .expandable_segments()
        );
    }

    #[test]
    fn rejects_bad_input() {
        let e = AllocatorConfig::parse("max_split_size_mb:10").unwrap_err();
        assert!(
            matches!(&e, ConfigError::InvalidValue { key, value, .. } if key == "max_split_size_mb" && value == "10")
        );
        assert!(e.to_string().contains("max_split_size_mb"));
        let e = AllocatorConfig::parse("max_split_size_mb:abc").unwrap_err();
        assert!(e.to_string().contains("abc"));
        let e = AllocatorConfig::parse("frobnicate:3").unwrap_err();
        assert_eq!(
            e,
            ConfigError::UnknownKey {
                key: "frobnicate".into()
            }
        );
        let e = AllocatorConfig::parse("backend:cudaMallocAsync").unwrap_err();
        assert!(matches!(e, ConfigError::Unsupported { .. }));
        assert!(e.to_string().contains("not supported"));
        assert!(AllocatorConfig::parse("expandable_segments:maybe").is_err());
        assert!(AllocatorConfig::parse("garbage_collection_threshold:1.0").is_err());
        assert!(AllocatorConfig::parse("garbage_collection_threshold:0").is_err());
        assert!(AllocatorConfig::parse("garbage_collection_threshold:NaN").is_err());
        assert!(AllocatorConfig::parse("roundup_power2_divisions:3").is_err());
        assert!(AllocatorConfig::parse("roundup_power2_divisions:[300:2]").is_err());
        assert!(AllocatorConfig::parse("roundup_power2_divisions:[256:3]").is_err());
        assert!(AllocatorConfig::parse("roundup_power2_divisions:[256:2").is_err());
        assert!(AllocatorConfig::parse("max_split_size_mb").is_err());
        assert!(AllocatorConfig::parse("backend:cudaMallocAsync").is_err());
        assert!(AllocatorConfig::parse("max_split_size_mb:99999999999999999999999").is_err());
    }

    #[test]
    fn huge_mb_saturates() {
        let c = AllocatorConfig::parse(&format!("max_split_size_mb:{}", u64::MAX)).unwrap();
        assert_eq!(c.max_split_size(), Some(u64::MAX));
    }

    #[test]
    fn builder() {
        let c = AllocatorConfig::default()
            .with_max_split_size_mb(64)
            .unwrap()
            .with_roundup_power2_divisions(RoundupPower2Divisions::uniform(2));
        assert_eq!(c.max_split_size(), Some(64 * MIB));
        assert!(
            AllocatorConfig::default()
                .with_max_split_size_mb(19)
                .is_err()
        );
        assert!(
            AllocatorConfig::default()
                .with_garbage_collection_threshold(1.5)
                .is_err()
        );
        assert!(RoundupPower2Divisions::from_intervals([3; ROUNDUP_INTERVALS]).is_err());
    }
}
