//! Buffers handed to a device backend: still counted under their category, counted apart until
//! freed, whichever thread frees them, and released from the count by a realloc.

use std::hint::black_box;

use trainmem_probe::{
    CategoryScope, CountingAlloc, block_category, handed_to_device_bytes, live_bytes,
    mark_handed_to_device, snapshot,
};

use trainmem_core::Category;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc::new();

// One test only: the handed-over counters are process-wide and each assertion is exact.
#[test]
fn handed_buffers_are_counted_apart_until_freed() {
    let c = Category::Input;
    let (live0, handed0) = (live_bytes(c), handed_to_device_bytes(c));
    let batch: Vec<f32> = {
        let _s = CategoryScope::enter(c);
        Vec::with_capacity(1000)
    };
    assert!(mark_handed_to_device(&batch), "the global allocator counts");
    assert!(!mark_handed_to_device(&batch), "a block is marked once");
    assert_eq!(handed_to_device_bytes(c), handed0 + 4000);
    assert_eq!(live_bytes(c), live0 + 4000, "still counted as input");
    assert_eq!(snapshot().handed_to_device[c.index()], handed0 + 4000);
    // SAFETY: `batch`'s buffer is a live block of the installed allocator.
    let tagged = unsafe { block_category(batch.as_ptr().cast()) };
    assert_eq!(tagged, c, "the tag keeps its category");

    // A backend's queue frees it later, on another thread.
    std::thread::spawn(move || drop(black_box(batch)))
        .join()
        .expect("the freeing thread");
    assert_eq!(handed_to_device_bytes(c), handed0);
    assert_eq!(live_bytes(c), live0);

    // A realloc moves the block to the reallocating thread's category, unmarked.
    let mut grown: Vec<u8> = {
        let _s = CategoryScope::enter(c);
        Vec::with_capacity(100)
    };
    assert!(mark_handed_to_device(&grown));
    assert_eq!(handed_to_device_bytes(c), handed0 + 100);
    {
        let _s = CategoryScope::enter(c);
        grown.reserve_exact(10_000);
    }
    assert_eq!(handed_to_device_bytes(c), handed0);
    assert_eq!(live_bytes(c), live0 + grown.capacity());
    drop(grown);

    // Nothing to mark for an empty vector or zero-sized elements.
    assert!(!mark_handed_to_device(&Vec::<u32>::new()));
    assert!(!mark_handed_to_device(&vec![(); 10]));
    assert_eq!(live_bytes(c), live0);
}
