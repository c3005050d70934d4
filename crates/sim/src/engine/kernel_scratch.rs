//! Kernel scratch that a CPU backend keeps for a thread's whole life.
//!
//! burn's Flex backend multiplies matrices with the `gemm` crate (0.19). With its `std`
//! feature, gemm keeps one thread-local packing buffer (`L2_SLAB`) per thread that ever ran a
//! matrix product: a single allocation of exactly the L2 cache bytes gemm attributes to one
//! CPU (128-byte aligned, no rounding), made at the thread's first product and freed when the
//! thread exits. trainmem-burn's run makes it on its training thread before the `start`
//! sample, under `other`, so a burn run on a CPU device carries it from `start` to `end`.
//!
//! How gemm derives "the L2 cache bytes of one CPU" (gemm-common `cache.rs`), and how
//! [`gemm_l2_slab_bytes`] reproduces it on the machine running the code (the detector behind
//! [`crate::Machine::detect`]; a simulation takes the size as an input, [`crate::Machine`]):
//!
//! * **Linux**: every `/sys/devices/system/cpu/cpu*/cache/index*` directory whose `type` is
//!   `Data` or `Unified` and whose `level` is 2 gives `size` (suffix `K`, `M` or `G` in powers
//!   of 1024, or plain bytes) divided by the number of CPUs in its `shared_cpu_list` (an L2
//!   shared by two hyperthreads counts half for each). Entries are visited in directory order
//!   and the last one whose `coherency_line_size` is at least the line size recorded so far
//!   (64 to begin with) wins; on a machine whose cores all have the same L2 that is simply
//!   `cpu0/cache/index2/size` over its sharers. A result of 0 falls back to the default.
//! * **Elsewhere, or when the Linux files cannot be read**: the default below. (gemm itself
//!   asks `lscpu`, `sysctl` on Apple machines or `cpuid` on x86 before falling back; the
//!   twin does not, so on those machines give `host.kernel_scratch` explicitly.)
//! * **Defaults** (gemm's `CACHE_INFO_DEFAULT` for L2): 256 KiB on x86 and x86-64, 512 KiB on
//!   every other architecture.

use std::path::Path;
use std::sync::OnceLock;

/// gemm's default L2 size when the cache cannot be read: 256 KiB on x86 and x86-64.
#[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
pub const DEFAULT_L2_BYTES: u64 = 256 * 1024;

/// gemm's default L2 size when the cache cannot be read: 512 KiB off x86.
#[cfg(not(any(target_arch = "x86", target_arch = "x86_64")))]
pub const DEFAULT_L2_BYTES: u64 = 512 * 1024;

/// The bytes of gemm's thread-local packing buffer on this machine (see the module docs),
/// read once per process.
pub fn gemm_l2_slab_bytes() -> u64 {
    static BYTES: OnceLock<u64> = OnceLock::new();
    *BYTES.get_or_init(|| {
        slab_bytes(cfg!(target_os = "linux").then(|| Path::new("/sys/devices/system/cpu")))
    })
}

/// The slab bytes from a sysfs CPU directory (`None` off Linux): its L2 bytes per CPU, or
/// [`DEFAULT_L2_BYTES`] when there is no directory, nothing can be read or the result is 0.
fn slab_bytes(cpu_root: Option<&Path>) -> u64 {
    cpu_root
        .and_then(l2_bytes_per_cpu)
        .filter(|&b| b > 0)
        .unwrap_or(DEFAULT_L2_BYTES)
}

/// The L2 bytes of one CPU from a sysfs CPU directory laid out like
/// `/sys/devices/system/cpu` (gemm's rule, module docs); `None` when nothing can be read.
pub fn l2_bytes_per_cpu(cpu_root: &Path) -> Option<u64> {
    let mut best: Option<u64> = None;
    let mut line = 64u64;
    for cpu in std::fs::read_dir(cpu_root).ok()?.flatten() {
        let name = cpu.file_name();
        if !name.to_str().is_some_and(|n| n.starts_with("cpu")) {
            continue;
        }
        let Ok(indices) = std::fs::read_dir(cpu.path().join("cache")) else {
            continue;
        };
        for index in indices.flatten() {
            let dir = index.path();
            if !index
                .file_name()
                .to_str()
                .is_some_and(|n| n.starts_with("index"))
                || !dir.is_dir()
            {
                continue;
            }
            let read = |file: &str| {
                std::fs::read_to_string(dir.join(file))
                    .ok()
                    .map(|s| s.trim().to_string())
            };
            if !matches!(read("type").as_deref(), Some("Data" | "Unified")) {
                continue;
            }
            if read("level").and_then(|l| l.parse::<u32>().ok()) != Some(2) {
                continue;
            }
            let Some(size) = read("size").as_deref().and_then(parse_cache_size) else {
                continue;
            };
            let sharers = read("shared_cpu_list")
                .as_deref()
                .map_or(0, count_cpu_list)
                .max(1);
            let this_line = read("coherency_line_size")
                .and_then(|l| l.parse::<u64>().ok())
                .unwrap_or(64);
            if this_line >= line {
                line = this_line;
                best = Some(size / sharers);
            }
        }
    }
    best
}

/// Parses a sysfs cache `size` (`1024K`, `2M`, `1G` in powers of 1024, or plain bytes).
pub fn parse_cache_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let (digits, unit) = match text.as_bytes().last()? {
        b'K' => (&text[..text.len() - 1], 1u64 << 10),
        b'M' => (&text[..text.len() - 1], 1 << 20),
        b'G' => (&text[..text.len() - 1], 1 << 30),
        _ => (text, 1),
    };
    digits.parse::<u64>().ok()?.checked_mul(unit)
}

/// Counts the CPUs of a sysfs CPU list such as `0`, `0-1` or `0,4-5`.
pub fn count_cpu_list(text: &str) -> u64 {
    text.trim()
        .split(',')
        .filter(|item| !item.is_empty())
        .map(|item| match item.split_once('-') {
            Some((a, b)) => match (a.parse::<u64>(), b.parse::<u64>()) {
                (Ok(a), Ok(b)) if b >= a => b - a + 1,
                _ => 0,
            },
            None => u64::from(item.parse::<u64>().is_ok()),
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_index(root: &Path, cpu: &str, index: &str, fields: &[(&str, &str)]) {
        let dir = root.join(cpu).join("cache").join(index);
        std::fs::create_dir_all(&dir).expect("mkdir");
        for (name, value) in fields {
            std::fs::write(dir.join(name), format!("{value}\n")).expect("write");
        }
    }

    fn temp_root(tag: &str) -> std::path::PathBuf {
        let root =
            std::env::temp_dir().join(format!("trainmem-sim-cache-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).expect("mkdir");
        root
    }

    /// gemm's `CACHE_INFO_DEFAULT` L2 for the architecture the tests run on.
    const EXPECTED_DEFAULT: u64 = if cfg!(any(target_arch = "x86", target_arch = "x86_64")) {
        262_144
    } else {
        524_288
    };

    /// A sysfs root where every CPU in `cpus` has an L1 data cache, an L1 instruction cache,
    /// the given L2 and a 32 MiB L3 (`shared` is the L2's `shared_cpu_list`).
    fn machine(tag: &str, cpus: &[&str], l2_size: &str, shared: &str) -> std::path::PathBuf {
        let root = temp_root(tag);
        for cpu in cpus {
            write_index(
                &root,
                cpu,
                "index0",
                &[("type", "Data"), ("level", "1"), ("size", "48K")],
            );
            write_index(
                &root,
                cpu,
                "index1",
                &[("type", "Instruction"), ("level", "1"), ("size", "32K")],
            );
            write_index(
                &root,
                cpu,
                "index2",
                &[
                    ("type", "Unified"),
                    ("level", "2"),
                    ("size", l2_size),
                    ("shared_cpu_list", shared),
                    ("coherency_line_size", "64"),
                ],
            );
            write_index(
                &root,
                cpu,
                "index3",
                &[
                    ("type", "Unified"),
                    ("level", "3"),
                    ("size", "32768K"),
                    ("shared_cpu_list", "0-15"),
                ],
            );
        }
        root
    }

    #[test]
    fn sizes_and_cpu_lists_parse_like_sysfs() {
        assert_eq!(parse_cache_size("1024K"), Some(1_048_576));
        assert_eq!(parse_cache_size("2M"), Some(2_097_152));
        assert_eq!(parse_cache_size("1G"), Some(1_073_741_824));
        assert_eq!(parse_cache_size("49152"), Some(49_152));
        assert_eq!(parse_cache_size(" 1280K\n"), Some(1_310_720));
        assert_eq!(parse_cache_size("big"), None);
        assert_eq!(parse_cache_size("K"), None);
        assert_eq!(parse_cache_size(""), None);
        assert_eq!(count_cpu_list("0"), 1);
        assert_eq!(count_cpu_list("0-1"), 2);
        assert_eq!(count_cpu_list("0,4-5\n"), 3);
        assert_eq!(count_cpu_list("0-3,8-11"), 8);
        assert_eq!(count_cpu_list(""), 0);
        assert_eq!(count_cpu_list("3-1"), 0);
    }

    /// Known answers: a per-core L2 over its sharers, in bytes. L1, instruction caches, L3 and
    /// directories that are not CPUs do not count.
    #[test]
    fn known_machines_give_known_slabs() {
        let cases: [(&str, &[&str], &str, &str, u64); 6] = [
            // one core, a private 1 MiB L2 (the VM these tests were written on)
            ("private-1m", &["cpu0"], "1024K", "0", 1_048_576),
            // Intel Ice Lake / Sapphire Rapids: 1.25 MiB / 2 MiB private per core
            ("icx", &["cpu0"], "1280K", "0", 1_310_720),
            ("spr", &["cpu0"], "2048K", "0", 2_097_152),
            // AMD Zen 4: 1 MiB per core shared by two hyperthreads -> half each
            ("zen4-smt", &["cpu0", "cpu1"], "1024K", "0-1", 524_288),
            // a 2 MiB L2 shared by four cores (Intel E-core cluster), size given in M
            (
                "ecore",
                &["cpu0", "cpu1", "cpu2", "cpu3"],
                "2M",
                "0-3",
                524_288,
            ),
            // size in plain bytes, sharers as a list with a gap
            ("bytes", &["cpu0", "cpu4"], "262144", "0,4", 131_072),
        ];
        for (tag, cpus, size, shared, expected) in cases {
            let root = machine(tag, cpus, size, shared);
            std::fs::create_dir_all(root.join("cpufreq")).expect("mkdir");
            std::fs::write(root.join("online"), "0-3\n").expect("write");
            assert_eq!(l2_bytes_per_cpu(&root), Some(expected), "{tag}");
            assert_eq!(slab_bytes(Some(&root)), expected, "{tag}");
            std::fs::remove_dir_all(&root).expect("cleanup");
        }
    }

    /// The line-size rule, with entries whose order does not change the answer: the L2 with
    /// the longer coherency line wins whichever directory is visited first.
    #[test]
    fn the_l2_with_the_longer_line_wins() {
        let root = temp_root("lines");
        write_index(
            &root,
            "cpu0",
            "index2",
            &[
                ("type", "Unified"),
                ("level", "2"),
                ("size", "512K"),
                ("coherency_line_size", "64"),
            ],
        );
        write_index(
            &root,
            "cpu1",
            "index2",
            &[
                ("type", "Data"),
                ("level", "2"),
                ("size", "1536K"),
                ("coherency_line_size", "128"),
            ],
        );
        assert_eq!(l2_bytes_per_cpu(&root), Some(1_572_864));
        // a shorter line than the default 64 never replaces the default-line entry
        write_index(
            &root,
            "cpu2",
            "index2",
            &[
                ("type", "Unified"),
                ("level", "2"),
                ("size", "4096K"),
                ("coherency_line_size", "32"),
            ],
        );
        assert_eq!(l2_bytes_per_cpu(&root), Some(1_572_864));
        std::fs::remove_dir_all(&root).expect("cleanup");
    }

    #[test]
    fn an_unknown_cache_size_falls_back_to_gemms_default() {
        assert_eq!(DEFAULT_L2_BYTES, EXPECTED_DEFAULT);
        // off Linux: no sysfs at all
        assert_eq!(slab_bytes(None), EXPECTED_DEFAULT);
        // no such directory
        let root = temp_root("fallback");
        assert_eq!(l2_bytes_per_cpu(&root.join("missing")), None);
        assert_eq!(slab_bytes(Some(&root.join("missing"))), EXPECTED_DEFAULT);
        // CPUs without any L2 (only L1 and L3)
        write_index(
            &root,
            "cpu0",
            "index0",
            &[("type", "Data"), ("level", "1"), ("size", "32K")],
        );
        write_index(
            &root,
            "cpu0",
            "index3",
            &[("type", "Unified"), ("level", "3"), ("size", "8M")],
        );
        // an L2 that is an instruction cache, and one whose size cannot be read
        write_index(
            &root,
            "cpu0",
            "index1",
            &[("type", "Instruction"), ("level", "2"), ("size", "64K")],
        );
        write_index(
            &root,
            "cpu0",
            "index2",
            &[("type", "Unified"), ("level", "2"), ("size", "unknown")],
        );
        assert_eq!(l2_bytes_per_cpu(&root), None);
        assert_eq!(slab_bytes(Some(&root)), EXPECTED_DEFAULT);
        std::fs::remove_dir_all(&root).expect("cleanup");
        // an L2 of 0 bytes
        let zero = machine("zero", &["cpu0"], "0K", "0");
        assert_eq!(l2_bytes_per_cpu(&zero), Some(0));
        assert_eq!(slab_bytes(Some(&zero)), EXPECTED_DEFAULT);
        std::fs::remove_dir_all(&zero).expect("cleanup");
    }
}
