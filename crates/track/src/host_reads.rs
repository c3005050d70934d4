//! Host buffers a device backend hands back when a tensor is read (`into_data`) that Rust's
//! allocator never sees: cubecl's page-locked read buffers on CUDA, wgpu's mapped staging
//! buffers. While the caller holds such data its bytes are host memory the program holds (a
//! checkpoint written from the parameters read back holds one model's worth), but a counting
//! allocator cannot count them.
//!
//! [`watch`] wraps the data's buffer in a controller that counts its bytes under the calling
//! thread's category from the read until the buffer is dropped ([`live`]); the bytes, their
//! alignment and their [`AllocationProperty`] are the inner buffer's, so no value and no
//! decision a consumer makes from the property changes. Data in Rust's own allocations
//! (`Native`: what Flex, Meta and cubecl's reads above 100 MB return) and file-backed data are
//! left as they are: the counting allocator already sees the first, and the second is the page
//! cache.

use std::collections::HashSet;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex};

use burn::tensor::TensorData;
use burn::tensor::ops::TransactionPrimitiveData;
use burn_std::{AllocationController, AllocationProperty, Bytes};
use trainmem_core::Category;
use trainmem_core::timeline::CategoryBytes;
use trainmem_probe::CategoryScope;

/// Live watched bytes per category.
static LIVE: [AtomicU64; 8] = [const { AtomicU64::new(0) }; 8];

/// The addresses of the buffers being watched, so data read twice through nested tracked
/// layers (a transaction whose default body reads each tensor) is counted once.
static WATCHED: LazyLock<Mutex<HashSet<usize>>> = LazyLock::new(|| Mutex::new(HashSet::new()));

fn watched() -> std::sync::MutexGuard<'static, HashSet<usize>> {
    WATCHED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Host bytes of read-back data outside Rust's allocator that the program holds now, per
/// category (the category of the thread that read the tensor).
pub fn live() -> CategoryBytes {
    CategoryBytes(std::array::from_fn(|i| LIVE[i].load(Ordering::Relaxed)))
}

/// Whether data in a buffer of this kind is host memory outside Rust's allocator.
fn outside_allocator(property: AllocationProperty) -> bool {
    matches!(
        property,
        AllocationProperty::Pinned | AllocationProperty::Other
    )
}

/// `data` with its buffer counted while it lives, when that buffer is host memory outside
/// Rust's allocator; otherwise `data` unchanged.
pub fn watch(mut data: TensorData) -> TensorData {
    let property = data.bytes.property();
    let len = data.bytes.len();
    if !outside_allocator(property) || len == 0 {
        return data;
    }
    let addr = data.bytes.as_ptr() as usize;
    let category = trainmem_probe::current_category();
    // the set's own allocations are the tracker's, not the program's
    let _own = CategoryScope::enter(Category::Other);
    if !watched().insert(addr) {
        return data;
    }
    let inner = std::mem::replace(&mut data.bytes, Bytes::from_bytes_vec(Vec::new()));
    let controller = Box::new(Watched::new(inner, category, addr));
    // SAFETY: the controller's memory is exactly the inner buffer's `len` bytes, all of them
    // initialized (they are the inner `Bytes`' initialized bytes).
    data.bytes = unsafe { Bytes::from_controller(controller, len) };
    data
}

/// Every tensor's data of a transaction's reads, each [`watch`]ed.
pub fn watch_transaction(mut data: TransactionPrimitiveData) -> TransactionPrimitiveData {
    for list in [
        &mut data.read_floats,
        &mut data.read_qfloats,
        &mut data.read_ints,
        &mut data.read_bools,
    ] {
        *list = std::mem::take(list).into_iter().map(watch).collect();
    }
    data
}

/// A read-back buffer counted while it lives.
struct Watched {
    inner: Bytes,
    bytes: u64,
    category: Category,
    addr: usize,
}

impl Watched {
    fn new(inner: Bytes, category: Category, addr: usize) -> Watched {
        let bytes = inner.len() as u64;
        LIVE[category.index()].fetch_add(bytes, Ordering::Relaxed);
        Watched {
            inner,
            bytes,
            category,
            addr,
        }
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        LIVE[self.category.index()].fetch_sub(self.bytes, Ordering::Relaxed);
        let _own = CategoryScope::enter(Category::Other);
        watched().remove(&self.addr);
    }
}

impl AllocationController for Watched {
    fn alloc_align(&self) -> usize {
        self.inner.align()
    }

    fn property(&self) -> AllocationProperty {
        self.inner.property()
    }

    unsafe fn memory_mut(&mut self) -> &mut [MaybeUninit<u8>] {
        let bytes: &mut [u8] = &mut self.inner;
        // SAFETY: `MaybeUninit<u8>` has the layout of `u8`, and the slice is the inner buffer's
        // initialized bytes; the trait's caller promises to write only initialized values.
        unsafe {
            std::slice::from_raw_parts_mut(
                bytes.as_mut_ptr().cast::<MaybeUninit<u8>>(),
                bytes.len(),
            )
        }
    }

    fn memory(&self) -> &[MaybeUninit<u8>] {
        let bytes: &[u8] = &self.inner;
        // SAFETY: `MaybeUninit<u8>` has the layout of `u8`; the slice borrows the inner buffer.
        unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<MaybeUninit<u8>>(), bytes.len()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A buffer that says it is page-locked host memory, as a device backend's read buffer
    /// does (a boxed slice standing in for it).
    struct FakePinned {
        memory: Box<[MaybeUninit<u8>]>,
    }

    impl AllocationController for FakePinned {
        fn alloc_align(&self) -> usize {
            1
        }

        fn property(&self) -> AllocationProperty {
            AllocationProperty::Pinned
        }

        unsafe fn memory_mut(&mut self) -> &mut [MaybeUninit<u8>] {
            &mut self.memory
        }

        fn memory(&self) -> &[MaybeUninit<u8>] {
            &self.memory
        }
    }

    fn pinned(values: &[f32]) -> TensorData {
        let raw: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let memory: Box<[MaybeUninit<u8>]> = raw.iter().map(|&b| MaybeUninit::new(b)).collect();
        let len = memory.len();
        // SAFETY: every byte of the boxed slice was written above.
        let bytes = unsafe { Bytes::from_controller(Box::new(FakePinned { memory }), len) };
        TensorData::from_bytes(bytes, [values.len()], burn::tensor::DType::F32)
    }

    // the counters are process-wide: the tests that read them take turns
    static SERIAL: Mutex<()> = Mutex::new(());

    #[test]
    fn pinned_data_is_counted_under_the_readers_category_until_dropped() {
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let before = live();
        let data = {
            let _tag = CategoryScope::enter(Category::Temporary);
            watch(pinned(&[1.0, 2.0, 3.0, 4.0]))
        };
        let during = live();
        assert_eq!(
            during.get(Category::Temporary) - before.get(Category::Temporary),
            16
        );
        assert_eq!(during.total() - before.total(), 16);
        // nothing about the data changes: values, property, length
        assert_eq!(data.bytes.property(), AllocationProperty::Pinned);
        assert_eq!(
            data.to_vec::<f32>().expect("f32 data"),
            vec![1.0, 2.0, 3.0, 4.0]
        );
        // a second watch of the same buffer counts nothing more
        let data = watch(data);
        assert_eq!(live().total() - before.total(), 16);
        // a clone is a copy in Rust's allocator, not counted here
        let copy = data.clone();
        assert_eq!(live().total() - before.total(), 16);
        drop(data);
        assert_eq!(live(), before, "released with the buffer");
        assert_eq!(copy.to_vec::<f32>().expect("f32"), vec![1.0, 2.0, 3.0, 4.0]);
    }

    #[test]
    fn data_in_rusts_allocator_is_left_alone() {
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let before = live();
        let data = watch(TensorData::new(vec![1.0f32; 64], [64]));
        assert_eq!(live(), before);
        assert_eq!(data.bytes.property(), AllocationProperty::Native);
        let empty = watch(pinned(&[]));
        assert_eq!(live(), before, "no bytes, nothing counted");
        drop(empty);
    }
}
