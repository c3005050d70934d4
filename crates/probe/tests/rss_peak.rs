//! `rss::reset_peak` against the real kernel. This file holds one test so that it runs in a
//! process of its own: no other test allocates while it watches `VmHWM`.
//!
//! Which branch applies is decided independently of the function under test, by opening
//! `/proc/self/clear_refs` for writing (which resets nothing): where that works, `reset_peak`
//! must succeed and must lower `VmHWM` below a peak made on purpose; where it does not, it must
//! fail with the documented [`RssError::Reset`] and the peak must keep counting from the
//! process start.
#![cfg(target_os = "linux")]

use std::fs::OpenOptions;
use std::hint::black_box;

use trainmem_probe::RssError;
use trainmem_probe::rss::{self, CLEAR_REFS_PATH};

/// The buffer that makes the peak: large enough that counter lag (a few pages) and the rest
/// of the process do not matter, and that the system allocator maps and unmaps it whole.
const BUF: u64 = 128 << 20;

/// A fresh buffer of `len` bytes with every page written, so all of it is resident.
fn touched(len: u64) -> Vec<u8> {
    let mut v = vec![0u8; len as usize];
    for page in v.chunks_mut(4096) {
        page[0] = 1;
    }
    black_box(v)
}

#[test]
fn reset_peak_lowers_vm_hwm_or_fails_as_documented() {
    let writable = OpenOptions::new()
        .write(true)
        .open(CLEAR_REFS_PATH)
        .map(drop);

    let base = rss::read().expect("linux /proc");
    let buf = touched(BUF);
    let high = rss::read().expect("linux /proc");
    assert!(
        high.vm_hwm >= base.vm_rss + BUF * 3 / 4,
        "touching {BUF} bytes did not raise the peak: {base:?} -> {high:?}"
    );
    drop(black_box(buf));
    let low = rss::read().expect("linux /proc");
    // Preconditions for the check below: the buffer went back to the system, and without a
    // reset the peak still remembers it.
    assert!(
        low.vm_rss + BUF / 2 <= high.vm_hwm,
        "freeing the buffer did not lower RSS: {high:?} -> {low:?}"
    );
    // (Not `>= high.vm_hwm`: the kernel's counters lag by a few pages, so the recorded mark
    // can come out a little below the RSS read while the buffer was live.)
    assert!(
        low.vm_hwm >= base.vm_rss + BUF * 3 / 4,
        "the peak forgot the buffer without a reset: {high:?} -> {low:?}"
    );

    let result = rss::reset_peak();
    let after = rss::read().expect("linux /proc");
    match writable {
        Ok(()) => {
            result.expect("clear_refs opens for writing, so reset_peak must succeed");
            // VmHWM is now the RSS at the reset, far below the peak the buffer made.
            assert!(
                after.vm_hwm + BUF / 2 <= high.vm_hwm,
                "reset_peak did not lower VmHWM: peak {high:?}, after reset {after:?}"
            );
            assert!(after.vm_hwm >= after.vm_rss, "{after:?}");
            // The peak counts again from the reset: a smaller buffer raises it, to below the old
            // peak.
            let small = touched(BUF / 4);
            let again = rss::read().expect("linux /proc");
            drop(black_box(small));
            assert!(
                again.vm_hwm >= after.vm_rss + BUF / 8,
                "the peak did not follow new memory after the reset: {after:?} -> {again:?}"
            );
            assert!(
                again.vm_hwm + BUF / 4 <= high.vm_hwm,
                "the old peak came back: peak {high:?}, now {again:?}"
            );
        }
        Err(open_error) => {
            match result
                .expect_err("clear_refs cannot be opened for writing, so reset_peak must fail")
            {
                RssError::Reset { path, source } => {
                    assert_eq!(path, std::path::Path::new(CLEAR_REFS_PATH));
                    assert_eq!(source.kind(), open_error.kind());
                }
                other => panic!("expected RssError::Reset, got {other:?}"),
            }
            // The documented fallback: the peak keeps counting from the process start.
            assert!(
                after.vm_hwm >= base.vm_rss + BUF * 3 / 4,
                "a failed reset lowered the peak: {high:?} -> {after:?}"
            );
        }
    }
}
