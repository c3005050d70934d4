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
        if cfg!(target_os = "linux") {
            l2_bytes_per_cpu(Path::new("/sys/devices/system/cpu"))
                .filter(|&b| b > 0)
                .unwrap_or(DEFAULT_L2_BYTES)
        } else {
            DEFAULT_L2_BYTES
        }
    })
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

    #[test]
    fn sizes_and_cpu_lists_parse_like_sysfs() {
        assert_eq!(parse_cache_size("1024K"), Some(1 << 20));
        assert_eq!(parse_cache_size("2M"), Some(2 << 20));
        assert_eq!(parse_cache_size("1G"), Some(1 << 30));
        assert_eq!(parse_cache_size("49152"), Some(49152));
        assert_eq!(parse_cache_size("big"), None);
        assert_eq!(count_cpu_list("0"), 1);
        assert_eq!(count_cpu_list("0-1"), 2);
        assert_eq!(count_cpu_list("0,4-5\n"), 3);
    }

    #[test]
    fn the_l2_of_one_cpu_is_divided_among_its_sharers() {
        let root = temp_root("shared");
        for cpu in ["cpu0", "cpu1"] {
            // an L1 data cache and an instruction cache are ignored, so is L3
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
                &[("type", "Instruction"), ("level", "2"), ("size", "64K")],
            );
            write_index(
                &root,
                cpu,
                "index2",
                &[
                    ("type", "Unified"),
                    ("level", "2"),
                    ("size", "2048K"),
                    ("shared_cpu_list", "0-1"),
                    ("coherency_line_size", "64"),
                ],
            );
            write_index(
                &root,
                cpu,
                "index3",
                &[("type", "Unified"), ("level", "3"), ("size", "32M")],
            );
        }
        // cpufreq and friends have no cache directory
        std::fs::create_dir_all(root.join("cpufreq")).expect("mkdir");
        assert_eq!(l2_bytes_per_cpu(&root), Some(1 << 20));
        std::fs::remove_dir_all(&root).expect("cleanup");
    }

    #[test]
    fn no_readable_l2_gives_none() {
        let root = temp_root("none");
        write_index(
            &root,
            "cpu0",
            "index0",
            &[("type", "Data"), ("level", "1"), ("size", "32K")],
        );
        assert_eq!(l2_bytes_per_cpu(&root), None);
        assert_eq!(l2_bytes_per_cpu(&root.join("missing")), None);
        std::fs::remove_dir_all(&root).expect("cleanup");
    }

    #[test]
    fn this_machine_gives_a_plausible_size() {
        let b = gemm_l2_slab_bytes();
        assert!((16 << 10..=256 << 20).contains(&b), "{b}");
        if cfg!(target_os = "linux") {
            let read = l2_bytes_per_cpu(Path::new("/sys/devices/system/cpu"));
            assert_eq!(b, read.filter(|&r| r > 0).unwrap_or(DEFAULT_L2_BYTES));
        }
    }
}
