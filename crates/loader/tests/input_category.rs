//! With trainmem-probe's counting allocator installed, the bytes of batches built by worker
//! threads (or in the caller's thread) are counted under `Category::Input`.

use std::sync::Arc;

use trainmem_core::Category;
use trainmem_loader::{BoxError, HeldBytes, Loader, LoaderConfig, WorkerContext};
use trainmem_probe::{CountingAlloc, live_bytes};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc::new();

#[test]
fn worker_batches_are_input_bytes() {
    let data: Arc<Vec<u64>> = Arc::new((0..64).collect());
    for workers in [0, 2] {
        let config = LoaderConfig {
            batch_size: 16,
            workers,
            ..LoaderConfig::default()
        };
        let mut loader = Loader::with_transform(
            Arc::clone(&data),
            config,
            |x: &u64, _: &mut WorkerContext| -> Result<u64, BoxError> { Ok(*x) },
            |items: Vec<u64>, _: &mut WorkerContext| -> Result<Vec<f32>, BoxError> {
                // A big batch so it dominates any other input-tagged bytes.
                Ok(items
                    .iter()
                    .flat_map(|&x| std::iter::repeat_n(x as f32, 100_000))
                    .collect())
            },
        )
        .expect("loader");
        let before = live_bytes(Category::Input);
        let held: Vec<Vec<f32>> = loader
            .epoch()
            .expect("epoch")
            .map(|b| b.expect("batch"))
            .collect();
        let held_bytes: usize = held.iter().map(HeldBytes::byte_size).sum();
        assert_eq!(held_bytes, 4 * 16 * 100_000 * 4);
        let during = live_bytes(Category::Input);
        assert!(
            during >= before + held_bytes,
            "input {before} -> {during}, held {held_bytes}"
        );
        drop(held);
        assert!(live_bytes(Category::Input) < during - held_bytes / 2);
    }
}
