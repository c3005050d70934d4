//! Blocks allocated inside a backend op: counted under their category as always, and as the
//! backend's until freed, whichever thread frees them; a realloc outside any op takes the
//! block out of the backend's count; handed-over marks and backend marks live side by side.

use std::hint::black_box;

use trainmem_core::Category;
use trainmem_probe::{
    BackendScope, CategoryScope, CountingAlloc, backend_bytes, block_category,
    handed_to_device_bytes, live_bytes, mark_handed_to_device, snapshot,
};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc::new();

// One test only: the counters are process-wide and each assertion is exact.
#[test]
fn blocks_made_inside_a_backend_op_are_counted_apart_until_freed() {
    let c = Category::Activation;
    let (live0, backend0) = (live_bytes(c), backend_bytes(c));
    let _tag = CategoryScope::enter(c);

    // Outside any op: a record, not the backend's.
    let record: Vec<u8> = Vec::with_capacity(300);
    assert_eq!(live_bytes(c), live0 + 300);
    assert_eq!(backend_bytes(c), backend0);

    // Inside an op (scopes nest): the backend's, under the thread's category.
    let buffer: Vec<f32> = {
        let _op = BackendScope::enter();
        let _inner = BackendScope::enter();
        Vec::with_capacity(1000)
    };
    let scratch_left = {
        let _op = BackendScope::enter();
        black_box(vec![0u8; 64]).len()
    };
    assert_eq!(scratch_left, 64, "scratch made and freed inside the op");
    assert_eq!(live_bytes(c), live0 + 4300);
    assert_eq!(backend_bytes(c), backend0 + 4000);
    assert_eq!(snapshot().in_backend[c.index()], backend0 + 4000);
    // SAFETY: `buffer`'s block is live and was handed out by the installed allocator.
    assert_eq!(unsafe { block_category(buffer.as_ptr().cast()) }, c);

    // Both marks at once: handed to a device and made in an op.
    assert!(mark_handed_to_device(&buffer));
    let handed = handed_to_device_bytes(c);
    assert!(handed >= 4000, "the handed-over count sees the block too");

    // Freed on another thread, outside any op: both counts drop.
    std::thread::spawn(move || drop(black_box(buffer)))
        .join()
        .expect("the freeing thread");
    assert_eq!(backend_bytes(c), backend0);
    assert_eq!(live_bytes(c), live0 + 300);

    // A block made in an op and grown outside one becomes a record.
    let mut grown: Vec<u8> = {
        let _op = BackendScope::enter();
        Vec::with_capacity(100)
    };
    assert_eq!(backend_bytes(c), backend0 + 100);
    grown.reserve_exact(10_000);
    assert_eq!(backend_bytes(c), backend0);
    assert_eq!(live_bytes(c), live0 + 300 + grown.capacity());
    drop((grown, record));
    assert_eq!(live_bytes(c), live0);
    assert_eq!(backend_bytes(c), backend0);
}
