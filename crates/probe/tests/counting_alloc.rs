//! The counting allocator installed as this test binary's global allocator: exact byte counts
//! per category, across threads, through realloc and with over-aligned blocks.
//!
//! Each test owns one category (the harness runs tests on parallel threads, which all start
//! tagged `Other`), so exact equalities hold.

use std::alloc::{Layout, alloc, alloc_zeroed, dealloc};
use std::hint::black_box;
use std::sync::mpsc;

use trainmem_probe::{
    CategoryScope, CountingAlloc, block_category, is_installed, live_bytes, peak_bytes, reset_peak,
    set_thread_category, snapshot,
};

use trainmem_core::Category;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc::new();

#[test]
fn exact_bytes_under_a_scope() {
    let c = Category::Parameter;
    let before = live_bytes(c);
    let v = {
        let _s = CategoryScope::enter(c);
        Vec::<u8>::with_capacity(1000)
    };
    assert!(is_installed());
    assert_eq!(live_bytes(c), before + 1000);
    // SAFETY: `v`'s buffer is a live block of the installed allocator.
    assert_eq!(unsafe { block_category(v.as_ptr()) }, c);
    let w = {
        let _s = CategoryScope::enter(c);
        vec![0u64; 250]
    };
    assert_eq!(live_bytes(c), before + 3000);
    drop(v);
    assert_eq!(live_bytes(c), before + 2000);
    drop(w);
    assert_eq!(live_bytes(c), before);
}

#[test]
fn freed_on_another_thread_decrements_the_allocating_category() {
    let c = Category::Input;
    let before = live_bytes(c);
    // A bounded channel allocates its slots here, so sending allocates nothing under `c`.
    let (tx, rx) = mpsc::sync_channel::<Vec<u8>>(16);
    let producer = std::thread::spawn(move || {
        set_thread_category(c);
        for i in 0..10usize {
            let mut v = Vec::with_capacity(4096 * (i + 1));
            v.push(i as u8);
            tx.send(v).expect("send");
        }
        set_thread_category(Category::Other);
    });
    producer.join().expect("producer");
    let received: Vec<Vec<u8>> = rx.iter().collect();
    let expected: usize = (1..=10).map(|i| 4096 * i).sum();
    // The receiving thread is tagged `Other`; the bytes still belong to `Input`. (The
    // `received` vector itself is allocated under `Other`.)
    assert_eq!(live_bytes(c), before + expected);
    drop(received);
    assert_eq!(live_bytes(c), before);
}

#[test]
fn realloc_moves_the_block_to_the_reallocating_category() {
    let (a, b) = (Category::Activation, Category::Temporary);
    let (a0, b0) = (live_bytes(a), live_bytes(b));
    let mut v: Vec<u8> = {
        let _s = CategoryScope::enter(a);
        Vec::with_capacity(100)
    };
    assert_eq!(live_bytes(a), a0 + 100);
    {
        let _s = CategoryScope::enter(b);
        v.reserve_exact(10_000);
    }
    let cap = v.capacity();
    assert!(cap >= 10_000);
    assert_eq!(live_bytes(a), a0);
    assert_eq!(live_bytes(b), b0 + cap);
    drop(v);
    assert_eq!(live_bytes(b), b0);
}

#[test]
fn over_aligned_and_zeroed_blocks() {
    let c = Category::OptimizerState;
    let before = live_bytes(c);
    let _s = CategoryScope::enter(c);
    for align in [1usize, 16, 64, 4096, 1 << 16] {
        let layout = Layout::from_size_align(3 * align + 5, align).expect("layout");
        // SAFETY: non-zero layout; freed below with the same layout.
        unsafe {
            let p = alloc_zeroed(layout);
            assert!(!p.is_null());
            assert_eq!(p as usize % align, 0, "alignment {align}");
            let bytes = std::slice::from_raw_parts(p, layout.size());
            assert!(bytes.iter().all(|&x| x == 0));
            assert_eq!(live_bytes(c), before + layout.size());
            dealloc(p, layout);
            let q = alloc(layout);
            assert_eq!(q as usize % align, 0);
            q.write_bytes(0xAB, layout.size());
            dealloc(q, layout);
        }
        assert_eq!(live_bytes(c), before);
    }
}

#[test]
fn peak_tracks_the_high_water_mark_and_resets() {
    let c = Category::Cache;
    reset_peak(c);
    let base = live_bytes(c);
    assert_eq!(peak_bytes(c), base);
    {
        let _s = CategoryScope::enter(c);
        let big = black_box(vec![1u8; 1 << 20]);
        drop(big);
        let small = black_box(vec![1u8; 1000]);
        drop(small);
    }
    assert_eq!(live_bytes(c), base);
    assert_eq!(peak_bytes(c), base + (1 << 20));
    reset_peak(c);
    assert_eq!(peak_bytes(c), base);
}

#[test]
fn many_threads_balance_to_zero() {
    let c = Category::Gradient;
    let before = snapshot();
    let handles: Vec<_> = (0..8)
        .map(|t| {
            std::thread::spawn(move || {
                let _s = CategoryScope::enter(c);
                let mut keep = Vec::new();
                for i in 0..500usize {
                    let v = black_box(vec![t as u8; 1 + (i * 37) % 3000]);
                    if i % 3 == 0 {
                        keep.push(v);
                    }
                }
                keep
            })
        })
        .collect();
    let kept: Vec<Vec<Vec<u8>>> = handles
        .into_iter()
        .map(|h| h.join().expect("worker"))
        .collect();
    let kept_bytes: usize = kept
        .iter()
        .map(|k| k.iter().map(Vec::capacity).sum::<usize>() + k.capacity() * 24)
        .sum();
    assert_eq!(live_bytes(c), before.live(c) + kept_bytes);
    drop(kept);
    let after = snapshot();
    assert_eq!(after.live(c), before.live(c));
    assert!(after.allocations[c.index()] >= before.allocations[c.index()] + 8 * 500);
}
