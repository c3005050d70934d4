//! `heap::retain_freed_heap`: memory one round of large allocations frees is reused by the
//! next round without being faulted in again. A test binary of its own without the test
//! harness (`harness = false`): the setting and the page-fault counts are per process, and
//! the rounds run on the main thread, whose heap (glibc's main arena) the setting governs.

#[cfg(all(target_os = "linux", target_env = "gnu"))]
use std::hint::black_box;

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn main() {
    assert!(
        !trainmem_probe::heap::retain_freed_heap(),
        "only glibc takes the setting"
    );
}

/// Allocates and writes 96 blocks of 1 MiB, frees them, and returns the faults it took.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn round() -> u64 {
    let faults = || trainmem_probe::rss::minor_faults().expect("/proc/self/stat");
    let f0 = faults();
    let blocks: Vec<Vec<u8>> = (0..96).map(|i| vec![i as u8 | 1; 1 << 20]).collect();
    black_box(&blocks);
    drop(blocks);
    faults() - f0
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn main() {
    assert!(
        trainmem_probe::heap::retain_freed_heap(),
        "glibc takes the setting"
    );
    let first = round();
    let later = [round(), round(), round()];
    // 96 MiB is 24,576 pages of 4 KiB; the first round faults (nearly) all of them in.
    assert!(first > 12_000, "the first round faulted {first} pages in");
    for (i, &f) in later.iter().enumerate() {
        assert!(
            f < first / 10,
            "round {} faulted {f} pages in again (the first: {first})",
            i + 2
        );
    }
    println!("heap retention: first round {first} page faults, then {later:?}");
}
