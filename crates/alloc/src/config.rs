//! Allocator configuration: the PyTorch-style option string and a programmatic builder.
//!
//! ```
//! use trainmem_alloc::AllocatorConfig;
//! let c: AllocatorConfig = "max_split_size_mb:128,roundup_power2_divisions:4".parse().unwrap();
//! assert_eq!(c.max_split_size(), Some(128 << 20));
//! let d = AllocatorConfig::default().with_garbage_collection_threshold(0.8).unwrap();
//! assert_eq!(d.garbage_collection_threshold(), Some(0.8));
//! ```
//!
//! Every key PyTorch's CUDA allocator accepts is read, with PyTorch's checks of its value
//! (see [`AllocatorConfig::parse`]), so a real `PYTORCH_CUDA_ALLOC_CONF` / `PYTORCH_ALLOC_CONF`
//! can be pasted as it is. The keys that only steer the host (pinned-memory) allocator, the
//! allocator's locking or CUDA-graph capture are kept, so that [`AllocatorConfig`]'s `Display`
//! writes them back, but change nothing in the device allocator trainmem models. The two
//! settings trainmem cannot model, `backend:cudaMallocAsync` and a `large_segment_size_mb`
//! other than 20, are [`ConfigError::Unsupported`], saying why.
//!
//! `Display` writes an option string that parses back to an equal configuration.

use std::fmt;
use std::str::FromStr;

use crate::size::{LARGE_BUFFER, MIB};

/// Number of power-of-two size intervals that carry their own division count
/// (1 MiB, 2 MiB, … up to 64 GiB; sizes below 1 MiB use the first, above use the last).
pub const ROUNDUP_INTERVALS: usize = 16;

/// The environment variables PyTorch reads its allocator configuration from, in the order it
/// looks at them; the first one that is set is used (see [`AllocatorConfig::from_env`]).
pub const ALLOC_CONF_ENV_VARS: [&str; 3] = [
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_HIP_ALLOC_CONF",
    "PYTORCH_ALLOC_CONF",
];

/// The keys [`AllocatorConfig::parse`] reads (ROCm spellings aside).
const KNOWN_KEYS: [&str; 16] = [
    "max_split_size_mb",
    "max_non_split_rounding_mb",
    "roundup_power2_divisions",
    "garbage_collection_threshold",
    "expandable_segments",
    "backend",
    "per_process_memory_fraction",
    "large_segment_size_mb",
    "release_lock_on_cudamalloc",
    "pinned_use_cuda_host_register",
    "pinned_num_register_threads",
    "pinned_use_background_threads",
    "pinned_reserve_segment_size_mb",
    "pinned_max_round_threshold_mb",
    "pinned_max_cached_size_mb",
    "graph_capture_record_stream_reuse",
];

/// The largest MB count PyTorch keeps for a size option: it clamps larger values to
/// `SIZE_MAX / 1 MiB` before multiplying, so the byte size is always a whole number of MiB.
const MAX_MB: u64 = u64::MAX / MIB;

/// PyTorch's upper bound for `pinned_num_register_threads`.
const MAX_REGISTER_THREADS: u64 = 128;

/// An error in an allocator configuration string or value. Every variant names the key and
/// the offending value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// The key is not one PyTorch's CUDA allocator accepts.
    #[error("unknown allocator option `{key}` (known: {})", KNOWN_KEYS.join(", "))]
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

/// Where the `>` entry of a `roundup_power2_divisions` list starts filling the table. PyTorch
/// changed this rule, so the two readings of one string differ in a single interval.
///
/// ```
/// use trainmem_alloc::{GreaterThanFill, RoundupPower2Divisions, MIB, round_size};
/// let list = "[256:1,512:2,1024:4,>:8]";
/// let now = RoundupPower2Divisions::parse(list)?;
/// let old = RoundupPower2Divisions::parse_with(list, GreaterThanFill::FromLastListed)?;
/// // [1 GiB, 2 GiB): 4 divisions today (steps of 256 MiB), 8 in older releases (128 MiB).
/// assert_eq!(now.divisions_for(1100 * MIB), 4);
/// assert_eq!(round_size(1100 * MIB, &now), Some(1280 * MIB));
/// assert_eq!(old.divisions_for(1100 * MIB), 8);
/// assert_eq!(round_size(1100 * MIB, &old), Some(1152 * MIB));
/// // Both agree everywhere else.
/// assert_eq!(now.divisions_for(600 * MIB), old.divisions_for(600 * MIB));
/// assert_eq!(now.divisions_for(3000 * MIB), 8);
/// # Ok::<(), trainmem_alloc::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum GreaterThanFill {
    /// Current PyTorch (the shared `c10/core/AllocatorConfig.cpp` parser, whose unit test
    /// checks it): `>` fills the intervals *after* the last numbered entry, which keeps its own
    /// value. With no numbered entry before it, `>` fills every interval but the first
    /// (`[>:8]` leaves sizes below 2 MiB at 0 divisions).
    #[default]
    AfterLastListed,
    /// Older PyTorch (the parser in `c10/cuda/CUDAAllocatorConfig.cpp` before the shared one,
    /// i.e. 2.8 and earlier; around 2.9 the fix was reverted and landed again,
    /// pytorch/pytorch#161594 and #165304): `>` fills *from* the last numbered entry's own
    /// interval, so that entry's value is overwritten — a quirk: `[256:1,512:2,1024:4,>:8]`
    /// gives [1 GiB, 2 GiB) 8 divisions, not the 4 written, and 1100 MiB rounds to 1152 MiB
    /// instead of 1280 MiB. With no numbered entry before it, `>` fills all 16 intervals.
    FromLastListed,
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

    /// Reads the value of `roundup_power2_divisions` as current PyTorch does (see
    /// [`GreaterThanFill::AfterLastListed`]): a power of two for every interval, or a list
    /// `[MB:divisions,...,>:divisions]`.
    pub fn parse(value: &str) -> Result<Self, ConfigError> {
        Self::parse_with(value, GreaterThanFill::default())
    }

    /// Reads the value of `roundup_power2_divisions` with the given rule for `>`.
    ///
    /// PyTorch's reading of a list, entry by entry: a numbered entry `MB:d` (MB a power of two)
    /// sets the interval `log2(MB)` (at most 15) to `d`, and the first numbered entry also sets
    /// every interval below it; `>:d` sets the intervals from the last numbered one on, as
    /// `fill` says. Divisions must be 0 or a power of two (0 turns rounding off); the single
    /// value form must be a power of two. `[]` (all 0) and a trailing comma are accepted.
    pub fn parse_with(value: &str, fill: GreaterThanFill) -> Result<Self, ConfigError> {
        const KEY: &str = "roundup_power2_divisions";
        // PyTorch's tokenizer drops every whitespace character, wherever it is.
        let compact: String = value.chars().filter(|c| !c.is_ascii_whitespace()).collect();
        let v = compact.as_str();
        let Some(inner) = v.strip_prefix('[') else {
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
            return Ok(RoundupPower2Divisions([div; ROUNDUP_INTERVALS]));
        };
        let inner = inner
            .strip_suffix(']')
            .ok_or_else(|| invalid(KEY, value, "a list must end with `]`"))?;
        let mut out = [0u64; ROUNDUP_INTERVALS];
        let mut first = true;
        let mut last_index = 0usize;
        let entries: Vec<&str> = inner.split(',').map(str::trim).collect();
        for (k, &entry) in entries.iter().enumerate() {
            // `[]` and a trailing comma read as nothing, as PyTorch's tokenizer reads them.
            if entry.is_empty() && k + 1 == entries.len() {
                continue;
            }
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
                let from = match fill {
                    GreaterThanFill::AfterLastListed => last_index + 1,
                    GreaterThanFill::FromLastListed => last_index,
                };
                for slot in out.iter_mut().skip(from) {
                    *slot = div;
                }
                continue;
            }
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
        Ok(RoundupPower2Divisions(out))
    }
}

impl FromStr for RoundupPower2Divisions {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        RoundupPower2Divisions::parse(s)
    }
}

impl fmt::Display for RoundupPower2Divisions {
    /// The value as `roundup_power2_divisions` takes it: the single number when every interval
    /// has the same non-zero count, else the list of all 16 intervals (`[1:a,2:b,…,32768:p]`,
    /// which both [`GreaterThanFill`] rules read alike; `[]` when all are 0).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = &self.0;
        if d.iter().all(|&x| x == 0) {
            return f.write_str("[]");
        }
        if d.iter().all(|&x| x == d[0]) {
            return write!(f, "{}", d[0]);
        }
        f.write_str("[")?;
        for (i, v) in d.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{}:{}", 1u64 << i, v)?;
        }
        f.write_str("]")
    }
}

/// Allocator settings: PyTorch's `PYTORCH_ALLOC_CONF` / `PYTORCH_CUDA_ALLOC_CONF` options.
///
/// Build it from a string with [`AllocatorConfig::parse`] / `str::parse` (or the environment,
/// [`AllocatorConfig::from_env`]), or from code with the `with_*` methods. The defaults are
/// PyTorch's: no split limit, 20 MiB non-split rounding, no power-of-two divisions, no garbage
/// collection, no expandable segments, no memory fraction.
#[derive(Clone, Debug, PartialEq)]
pub struct AllocatorConfig {
    max_split_size: Option<u64>,
    max_non_split_rounding: u64,
    roundup_power2_divisions: RoundupPower2Divisions,
    garbage_collection_threshold: Option<f64>,
    expandable_segments: bool,
    per_process_memory_fraction: f64,
    unmodelled: Unmodelled,
}

/// The options PyTorch accepts that do not change the device allocator's caching: they are
/// kept so that `Display` writes them back.
#[derive(Clone, Debug, PartialEq)]
struct Unmodelled {
    release_lock_on_cudamalloc: bool,
    pinned_use_cuda_host_register: bool,
    pinned_num_register_threads: u64,
    pinned_use_background_threads: bool,
    pinned_reserve_segment_size_mb: u64,
    pinned_max_round_threshold_mb: Option<u64>,
    pinned_max_cached_size_mb: Option<u64>,
    graph_capture_record_stream_reuse: bool,
}

impl Default for Unmodelled {
    fn default() -> Self {
        Unmodelled {
            release_lock_on_cudamalloc: false,
            pinned_use_cuda_host_register: false,
            pinned_num_register_threads: 1,
            pinned_use_background_threads: false,
            pinned_reserve_segment_size_mb: 0,
            pinned_max_round_threshold_mb: None,
            pinned_max_cached_size_mb: None,
            graph_capture_record_stream_reuse: false,
        }
    }
}

impl Default for AllocatorConfig {
    fn default() -> Self {
        AllocatorConfig {
            max_split_size: None,
            max_non_split_rounding: LARGE_BUFFER,
            roundup_power2_divisions: RoundupPower2Divisions::default(),
            garbage_collection_threshold: None,
            expandable_segments: false,
            per_process_memory_fraction: 1.0,
            unmodelled: Unmodelled::default(),
        }
    }
}

impl AllocatorConfig {
    /// Parses `key:value` pairs separated by commas, e.g.
    /// `max_split_size_mb:128,roundup_power2_divisions:[256:1,512:2,>:8],garbage_collection_threshold:0.8`,
    /// with PyTorch's checks of each value. Whitespace is ignored wherever it is (PyTorch's
    /// tokenizer drops it), a key given twice takes its last value, and an empty string gives
    /// the defaults.
    ///
    /// Keys that change what trainmem models:
    /// * `max_split_size_mb`, `max_non_split_rounding_mb`: whole MB, at least 20 (values above
    ///   `u64::MAX / 1 MiB` are clamped to it, as PyTorch clamps them);
    /// * `roundup_power2_divisions`: a power of two, or a `[MB:div,...,>:div]` list (see
    ///   [`RoundupPower2Divisions::parse_with`]);
    /// * `garbage_collection_threshold`: `0 < x < 1`;
    /// * `expandable_segments`: `True` or `False` (PyTorch takes no other spelling);
    /// * `per_process_memory_fraction`: `0 ≤ x ≤ 1`, applied by
    ///   [`CachingAllocator::with_config`](crate::CachingAllocator::with_config) as
    ///   [`set_memory_fraction`](crate::CachingAllocator::set_memory_fraction) when below 1
    ///   (1 is no limit, as in PyTorch);
    /// * `backend`: `native` (`cudaMallocAsync` is [`ConfigError::Unsupported`]);
    /// * `large_segment_size_mb`: more than 10; only PyTorch's default, 20, is supported.
    ///
    /// Keys that are checked and kept but change nothing trainmem models (the host allocator's
    /// pinned memory, the lock around `cudaMalloc`, CUDA-graph capture):
    /// `release_lock_on_cudamalloc`, `pinned_use_cuda_host_register`,
    /// `pinned_use_background_threads`, `graph_capture_record_stream_reuse` (`True`/`False`),
    /// `pinned_num_register_threads` (a power of two up to 128), `pinned_reserve_segment_size_mb`
    /// (more than 0), `pinned_max_round_threshold_mb`, `pinned_max_cached_size_mb` (whole MB).
    /// The ROCm spellings `release_lock_on_hipmalloc` and `pinned_use_hip_host_register` are
    /// read too.
    pub fn parse(input: &str) -> Result<Self, ConfigError> {
        Self::parse_with(input, GreaterThanFill::default())
    }

    /// [`parse`](Self::parse) with the given rule for a `>` entry of
    /// `roundup_power2_divisions` (older PyTorch releases read it differently, see
    /// [`GreaterThanFill`]).
    pub fn parse_with(input: &str, fill: GreaterThanFill) -> Result<Self, ConfigError> {
        // PyTorch's tokenizer drops every whitespace character, wherever it is.
        let input: String = input.chars().filter(|c| !c.is_ascii_whitespace()).collect();
        let mut cfg = AllocatorConfig::default();
        for entry in split_top_level(&input)? {
            let entry = entry.trim();
            if entry.is_empty() {
                continue;
            }
            let (key, value) = entry.split_once(':').ok_or_else(|| ConfigError::Syntax {
                input: entry.to_string(),
                reason: "expected `key:value`".into(),
            })?;
            cfg.set_with(key.trim(), value.trim(), fill)?;
        }
        Ok(cfg)
    }

    /// The configuration PyTorch would read from this process's environment: the first of
    /// [`ALLOC_CONF_ENV_VARS`] that is set, parsed; the defaults when none is set.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_env_with(|name| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned()))
    }

    /// [`from_env`](Self::from_env) with `lookup` answering, for each variable name of
    /// [`ALLOC_CONF_ENV_VARS`] in turn, its value (`None` when unset). An empty value counts as
    /// set (and gives the defaults), as in PyTorch.
    ///
    /// The order is that of PyTorch's `c10/core/AllocatorConfig.cpp` at the time of writing
    /// (`PYTORCH_CUDA_ALLOC_CONF`, `PYTORCH_HIP_ALLOC_CONF`, `PYTORCH_ALLOC_CONF`); a release
    /// that read `PYTORCH_ALLOC_CONF` first (and called the CUDA name deprecated) differs only
    /// when both are set to different strings.
    ///
    /// ```
    /// use trainmem_alloc::AllocatorConfig;
    /// let env = |name: &str| (name == "PYTORCH_ALLOC_CONF").then(|| "max_split_size_mb:64".to_string());
    /// assert_eq!(AllocatorConfig::from_env_with(env)?.max_split_size(), Some(64 << 20));
    /// # Ok::<(), trainmem_alloc::ConfigError>(())
    /// ```
    pub fn from_env_with(
        mut lookup: impl FnMut(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        for name in ALLOC_CONF_ENV_VARS {
            if let Some(value) = lookup(name) {
                return Self::parse(&value);
            }
        }
        Ok(Self::default())
    }

    /// Sets one option from its string form (the keys of [`AllocatorConfig::parse`]).
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), ConfigError> {
        self.set_with(key, value, GreaterThanFill::default())
    }

    fn set_with(
        &mut self,
        key: &str,
        value: &str,
        fill: GreaterThanFill,
    ) -> Result<(), ConfigError> {
        let u = &mut self.unmodelled;
        match key {
            "max_split_size_mb" => {
                self.max_split_size = Some(parse_size_mb(key, value)? * MIB);
            }
            "max_non_split_rounding_mb" => {
                self.max_non_split_rounding = parse_size_mb(key, value)? * MIB;
            }
            "roundup_power2_divisions" => {
                self.roundup_power2_divisions = RoundupPower2Divisions::parse_with(value, fill)?;
            }
            "garbage_collection_threshold" => {
                let t = parse_f64(key, value)?;
                if !(t > 0.0 && t < 1.0) {
                    return Err(invalid(
                        key,
                        value,
                        "must be greater than 0.0 and less than 1.0",
                    ));
                }
                self.garbage_collection_threshold = Some(t);
            }
            "expandable_segments" => self.expandable_segments = parse_bool(key, value)?,
            "per_process_memory_fraction" => {
                let f = parse_f64(key, value)?;
                if !(0.0..=1.0).contains(&f) {
                    return Err(invalid(key, value, "must be between 0.0 and 1.0"));
                }
                self.per_process_memory_fraction = f;
            }
            "backend" => match value {
                "native" => {}
                "cudaMallocAsync" | "hipMallocAsync" => {
                    return Err(ConfigError::Unsupported {
                        key: key.into(),
                        value: value.into(),
                        reason: "only the native caching allocator is modelled".into(),
                    });
                }
                _ => return Err(invalid(key, value, "expected native or cudaMallocAsync")),
            },
            "large_segment_size_mb" => {
                let mb = parse_u64(key, value)?;
                if mb <= 10 {
                    return Err(invalid(key, value, "must be greater than 10"));
                }
                if mb != LARGE_BUFFER / MIB {
                    return Err(ConfigError::Unsupported {
                        key: key.into(),
                        value: value.into(),
                        reason: "trainmem models PyTorch's fixed 20 MiB large segment (the \
                                 segment of a 1-10 MiB request, the least max_split_size_mb \
                                 and the default max_non_split_rounding_mb); only 20 is accepted"
                            .into(),
                    });
                }
            }
            "release_lock_on_cudamalloc" | "release_lock_on_hipmalloc" => {
                u.release_lock_on_cudamalloc = parse_bool(key, value)?;
            }
            "pinned_use_cuda_host_register" | "pinned_use_hip_host_register" => {
                u.pinned_use_cuda_host_register = parse_bool(key, value)?;
            }
            "pinned_num_register_threads" => {
                let n = parse_u64(key, value)?;
                if !n.is_power_of_two() {
                    return Err(invalid(key, value, "must be a power of two"));
                }
                if n > MAX_REGISTER_THREADS {
                    return Err(invalid(key, value, "must be at most 128"));
                }
                u.pinned_num_register_threads = n;
            }
            "pinned_use_background_threads" => {
                u.pinned_use_background_threads = parse_bool(key, value)?;
            }
            "pinned_reserve_segment_size_mb" => {
                let mb = parse_u64(key, value)?;
                if mb == 0 {
                    return Err(invalid(key, value, "must be greater than 0"));
                }
                u.pinned_reserve_segment_size_mb = mb;
            }
            "pinned_max_round_threshold_mb" => {
                u.pinned_max_round_threshold_mb = Some(parse_u64(key, value)?.min(MAX_MB));
            }
            "pinned_max_cached_size_mb" => {
                u.pinned_max_cached_size_mb = Some(parse_u64(key, value)?.min(MAX_MB));
            }
            "graph_capture_record_stream_reuse" => {
                u.graph_capture_record_stream_reuse = parse_bool(key, value)?;
            }
            _ => return Err(ConfigError::UnknownKey { key: key.into() }),
        }
        Ok(())
    }

    /// Blocks of at least this size are never split, and are not used for smaller requests.
    /// At least 20; more than `u64::MAX / 1 MiB` is clamped to that, as PyTorch does.
    pub fn with_max_split_size_mb(mut self, mb: u64) -> Result<Self, ConfigError> {
        self.max_split_size = Some(check_size_mb("max_split_size_mb", mb)? * MIB);
        Ok(self)
    }

    /// How far an oversize request may be over-served by a cached oversize block (≥ 20 MiB;
    /// clamped like [`with_max_split_size_mb`](Self::with_max_split_size_mb)).
    pub fn with_max_non_split_rounding_mb(mut self, mb: u64) -> Result<Self, ConfigError> {
        self.max_non_split_rounding = check_size_mb("max_non_split_rounding_mb", mb)? * MIB;
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
                &format_f64(threshold),
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

    /// Sets `per_process_memory_fraction` (`0 ≤ fraction ≤ 1`; 1 is no limit): an allocator
    /// built with this configuration starts with
    /// [`set_memory_fraction`](crate::CachingAllocator::set_memory_fraction)`(fraction)` when
    /// it is below 1.
    pub fn with_per_process_memory_fraction(mut self, fraction: f64) -> Result<Self, ConfigError> {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(invalid(
                "per_process_memory_fraction",
                &format_f64(fraction),
                "must be between 0.0 and 1.0",
            ));
        }
        self.per_process_memory_fraction = fraction;
        Ok(self)
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

    /// `per_process_memory_fraction` (1 when not set: no limit).
    pub fn per_process_memory_fraction(&self) -> f64 {
        self.per_process_memory_fraction
    }

    /// `release_lock_on_cudamalloc`: PyTorch drops its allocator lock around `cudaMalloc`.
    /// Only locking changes, not what is cached or reserved; not modelled.
    pub fn release_lock_on_cudamalloc(&self) -> bool {
        self.unmodelled.release_lock_on_cudamalloc
    }

    /// `pinned_use_cuda_host_register`: the host (pinned-memory) allocator registers `malloc`ed
    /// memory instead of calling `cudaHostAlloc`. Not the device allocator; not modelled.
    pub fn pinned_use_cuda_host_register(&self) -> bool {
        self.unmodelled.pinned_use_cuda_host_register
    }

    /// `pinned_num_register_threads` (default 1): threads the host allocator registers pinned
    /// memory with. Not modelled.
    pub fn pinned_num_register_threads(&self) -> u64 {
        self.unmodelled.pinned_num_register_threads
    }

    /// `pinned_use_background_threads`: the host allocator processes its events on a
    /// background thread. Not modelled.
    pub fn pinned_use_background_threads(&self) -> bool {
        self.unmodelled.pinned_use_background_threads
    }

    /// `pinned_reserve_segment_size_mb` (0 when not set): memory the host allocator reserves
    /// up front. Not modelled.
    pub fn pinned_reserve_segment_size_mb(&self) -> u64 {
        self.unmodelled.pinned_reserve_segment_size_mb
    }

    /// `pinned_max_round_threshold_mb`, if set: the host allocator's rounding limit. Not
    /// modelled.
    pub fn pinned_max_round_threshold_mb(&self) -> Option<u64> {
        self.unmodelled.pinned_max_round_threshold_mb
    }

    /// `pinned_max_cached_size_mb`, if set: the host allocator's cache limit. Not modelled.
    pub fn pinned_max_cached_size_mb(&self) -> Option<u64> {
        self.unmodelled.pinned_max_cached_size_mb
    }

    /// `graph_capture_record_stream_reuse`: reuse of `record_stream` blocks during CUDA-graph
    /// capture, which trainmem does not model.
    pub fn graph_capture_record_stream_reuse(&self) -> bool {
        self.unmodelled.graph_capture_record_stream_reuse
    }
}

impl FromStr for AllocatorConfig {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        AllocatorConfig::parse(s)
    }
}

impl fmt::Display for AllocatorConfig {
    /// Writes the configuration back as an option string that [`AllocatorConfig::parse`]
    /// reads into an equal configuration: every option that differs from its default, in a
    /// fixed order, numbers exactly (fractions in their shortest exact form, `1e-300` rather
    /// than three hundred digits).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let u = &self.unmodelled;
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
        if self.roundup_power2_divisions != RoundupPower2Divisions::default() {
            parts.push(format!(
                "roundup_power2_divisions:{}",
                self.roundup_power2_divisions
            ));
        }
        if let Some(t) = self.garbage_collection_threshold {
            parts.push(format!("garbage_collection_threshold:{}", format_f64(t)));
        }
        if self.expandable_segments {
            parts.push("expandable_segments:True".to_string());
        }
        if self.per_process_memory_fraction != 1.0 {
            parts.push(format!(
                "per_process_memory_fraction:{}",
                format_f64(self.per_process_memory_fraction)
            ));
        }
        let flags = [
            ("release_lock_on_cudamalloc", u.release_lock_on_cudamalloc),
            (
                "pinned_use_cuda_host_register",
                u.pinned_use_cuda_host_register,
            ),
            (
                "pinned_use_background_threads",
                u.pinned_use_background_threads,
            ),
            (
                "graph_capture_record_stream_reuse",
                u.graph_capture_record_stream_reuse,
            ),
        ];
        for (key, on) in flags {
            if on {
                parts.push(format!("{key}:True"));
            }
        }
        if u.pinned_num_register_threads != 1 {
            parts.push(format!(
                "pinned_num_register_threads:{}",
                u.pinned_num_register_threads
            ));
        }
        if u.pinned_reserve_segment_size_mb != 0 {
            parts.push(format!(
                "pinned_reserve_segment_size_mb:{}",
                u.pinned_reserve_segment_size_mb
            ));
        }
        if let Some(mb) = u.pinned_max_round_threshold_mb {
            parts.push(format!("pinned_max_round_threshold_mb:{mb}"));
        }
        if let Some(mb) = u.pinned_max_cached_size_mb {
            parts.push(format!("pinned_max_cached_size_mb:{mb}"));
        }
        f.write_str(&parts.join(","))
    }
}

/// A float in its shortest form that parses back to the same value: plain decimals when short
/// (`0.8`), scientific notation otherwise (`1e-300`).
fn format_f64(x: f64) -> String {
    let plain = x.to_string();
    if plain.len() <= 24 {
        plain
    } else {
        format!("{x:e}")
    }
}

fn parse_u64(key: &str, value: &str) -> Result<u64, ConfigError> {
    value
        .parse()
        .map_err(|_| invalid(key, value, "expected a whole number"))
}

fn parse_f64(key: &str, value: &str) -> Result<f64, ConfigError> {
    value
        .parse()
        .map_err(|_| invalid(key, value, "expected a number"))
}

/// PyTorch's booleans: exactly `True` or `False`.
fn parse_bool(key: &str, value: &str) -> Result<bool, ConfigError> {
    match value {
        "True" => Ok(true),
        "False" => Ok(false),
        _ => Err(invalid(
            key,
            value,
            "expected True or False (PyTorch accepts no other spelling)",
        )),
    }
}

/// A size option in MB: a whole number, at least 20, clamped to [`MAX_MB`].
fn parse_size_mb(key: &str, value: &str) -> Result<u64, ConfigError> {
    let mb: u64 = value
        .parse()
        .map_err(|_| invalid(key, value, "expected a whole number of MB"))?;
    check_size_mb(key, mb).map_err(|_| invalid(key, value, "must be at least 20"))
}

fn check_size_mb(key: &str, mb: u64) -> Result<u64, ConfigError> {
    if mb < LARGE_BUFFER / MIB {
        return Err(invalid(key, &mb.to_string(), "must be at least 20"));
    }
    Ok(mb.min(MAX_MB))
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
mod tests;
