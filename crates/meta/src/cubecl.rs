//! A device memory model for Meta: cubecl's own memory management (cubecl-runtime 0.10.0, the
//! pools burn 0.21's CUDA backend allocates tensors from) over a storage that counts pages
//! instead of allocating them.
//!
//! The manager is built as cubecl-cuda 0.10 builds its main GPU memory
//! ([`CubeclConfig::cuda`]): the `SubSlices` pool configuration (cubecl-runtime's default unless
//! built exclusive-only), a largest page of a quarter of the device's memory, 512-byte alignment
//! (the pitch `cuMemAllocPitch` returns, which cubecl-cuda hard-codes), allocation mode `Auto`.
//! Each Meta buffer becomes one `reserve` of its bytes rounded up to the alignment (a contiguous
//! buffer's size under cubecl's layout policies); dropping the last tensor using it drops the
//! handle, which is how cubecl frees. burn creates parameters inside
//! `Backend::memory_persistent_allocations`, which on CUDA switches cubecl to its persistent
//! pool; Meta forwards that switch to the model ([`AllocationHook::persistent`]).
//! `Backend::memory_cleanup` runs cubecl's explicit cleanup.
//!
//! [`CubeclModel`] is a cloneable handle like [`crate::CachingModel`]: give one clone to the
//! device ([`CubeclModel::device`], or [`MetaDevice::cubecl`]) and keep another to read the
//! figures. Reported: bytes in use (cubecl's `bytes_in_use`: the requested, aligned sizes of live
//! slices), padding, bytes reserved (the pages, counted by [`Tracked`]) and their peaks.
//!
//! Not modelled: the row pitch burn's `Optimized` tensor layouts may add to a 2-D buffer whose
//! rows are not aligned, kernel scratch, the buffers burn's fusion never materialises, and
//! cubecl's pinned host staging pool.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use cubecl_ir::MemoryDeviceProperties;
use cubecl_runtime::logging::ServerLogger;
use cubecl_runtime::memory_management::{
    ManagedMemoryHandle, MemoryAllocationMode, MemoryConfiguration, MemoryManagement,
    MemoryManagementOptions, MemoryUsage,
};
use cubecl_runtime::server::IoError;
use cubecl_runtime::storage::{ComputeStorage, StorageHandle, StorageId, StorageUtilization};
use trainmem_core::Category;

use crate::device::MetaDevice;
use crate::memory::{AllocationHook, DeviceTotals};

/// The memory alignment cubecl-cuda 0.10 sets for device memory.
pub const CUDA_ALIGNMENT: u64 = 512;

/// Total memory of the H100 80GB HBM3 lent on 2026-11-24, as the driver reported it
/// (`cuMemGetInfo`'s total, which is what cubecl-cuda's `cuDeviceTotalMem` reads).
pub const H100_80GB_BYTES: u64 = 85_017_493_504;

/// Total memory of the H200 lent on 2026-11-26: the driver reported 139.80 GiB (to the
/// hundredth printed); the exact byte count was not recorded, so this is 139.80 GiB. Across the
/// printed rounding (± 5 MiB) cubecl's predicted reserved bytes move by under 0.02 MiB
/// (`tests/cubecl_devices.rs`).
pub const H200_BYTES: u64 = 150_108_633_088;

/// How a cubecl memory manager is set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CubeclConfig {
    /// The largest page in bytes, from which cubecl sizes its pools.
    pub max_page_size: u64,
    /// The allocation alignment in bytes.
    pub alignment: u64,
}

impl CubeclConfig {
    /// burn 0.21's CUDA backend on a device of `capacity` bytes: the largest page is a quarter
    /// of the device's memory (see the module docs).
    pub fn cuda(capacity: u64) -> CubeclConfig {
        CubeclConfig {
            max_page_size: capacity / 4,
            alignment: CUDA_ALIGNMENT,
        }
    }

    /// burn 0.21's wgpu backend on an adapter whose largest storage-buffer binding is
    /// `max_storage_binding` bytes and whose uniform offset alignment is `alignment` bytes:
    /// cubecl-wgpu 0.10 takes the first as its largest page and the second as its alignment.
    pub fn wgpu(max_storage_binding: u64, alignment: u64) -> CubeclConfig {
        CubeclConfig {
            max_page_size: max_storage_binding,
            alignment,
        }
    }

    /// The bytes one buffer of `bytes` bytes asks cubecl for (rounded up to the alignment).
    pub fn request(&self, bytes: u64) -> u64 {
        bytes.next_multiple_of(self.alignment)
    }

    /// A cubecl memory manager over `storage` with this configuration (the `SubSlices` pools,
    /// mode `Auto`).
    pub fn manager<S: ComputeStorage>(&self, storage: S, name: &str) -> MemoryManagement<S> {
        let properties = MemoryDeviceProperties {
            max_page_size: self.max_page_size,
            alignment: self.alignment,
        };
        MemoryManagement::from_configuration(
            storage,
            &properties,
            MemoryConfiguration::SubSlices,
            Arc::new(ServerLogger::default()),
            MemoryManagementOptions::new(name).mode(MemoryAllocationMode::Auto),
        )
    }
}

/// Wraps a storage and counts the bytes of the pages a manager holds, with their peak (cubecl
/// reports no peak of its own).
#[derive(Debug, Default)]
pub struct Tracked<S> {
    inner: S,
    sizes: HashMap<StorageId, u64>,
    bytes: u64,
    peak: u64,
    pages: u64,
}

impl<S> Tracked<S> {
    /// Wraps `inner`.
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            sizes: HashMap::new(),
            bytes: 0,
            peak: 0,
            pages: 0,
        }
    }

    /// Bytes the manager currently holds.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Highest [`bytes`](Self::bytes) so far.
    pub fn peak(&self) -> u64 {
        self.peak
    }

    /// Sets the peak to the current bytes.
    pub fn reset_peak(&mut self) {
        self.peak = self.bytes;
    }

    /// Pages allocated so far (calls to the storage's `alloc`).
    pub fn pages_allocated(&self) -> u64 {
        self.pages
    }

    /// Pages the manager holds now.
    pub fn live_pages(&self) -> usize {
        self.sizes.len()
    }
}

impl<S: ComputeStorage> ComputeStorage for Tracked<S> {
    type Resource = S::Resource;

    fn alignment(&self) -> usize {
        self.inner.alignment()
    }

    fn get(&mut self, handle: &StorageHandle) -> Self::Resource {
        self.inner.get(handle)
    }

    fn alloc(&mut self, size: u64) -> Result<StorageHandle, IoError> {
        let handle = self.inner.alloc(size)?;
        self.sizes.insert(handle.id, size);
        self.bytes += size;
        self.pages += 1;
        self.peak = self.peak.max(self.bytes);
        Ok(handle)
    }

    fn dealloc(&mut self, id: StorageId) {
        if let Some(size) = self.sizes.remove(&id) {
            self.bytes -= size;
        }
        self.inner.dealloc(id);
    }

    fn flush(&mut self) {
        self.inner.flush();
    }
}

/// A storage that allocates nothing: it hands out fresh ids, so only the manager's decisions
/// (which pages, how large, when released) are observed.
#[derive(Debug, Clone, Copy)]
pub struct NullStorage {
    alignment: u64,
}

impl NullStorage {
    /// A storage reporting `alignment`.
    pub fn new(alignment: u64) -> NullStorage {
        NullStorage { alignment }
    }
}

impl ComputeStorage for NullStorage {
    type Resource = ();

    fn alignment(&self) -> usize {
        self.alignment as usize
    }

    fn get(&mut self, _handle: &StorageHandle) -> Self::Resource {}

    fn alloc(&mut self, size: u64) -> Result<StorageHandle, IoError> {
        Ok(StorageHandle::new(
            StorageId::new(),
            StorageUtilization { offset: 0, size },
        ))
    }

    fn dealloc(&mut self, _id: StorageId) {}

    fn flush(&mut self) {}
}

/// Counts pages without allocating them.
pub type CountingStorage = Tracked<NullStorage>;

/// A cubecl memory manager over a [`CountingStorage`] built with `config`.
pub fn counting_manager(config: CubeclConfig) -> MemoryManagement<CountingStorage> {
    config.manager(
        Tracked::new(NullStorage::new(config.alignment)),
        "trainmem-meta",
    )
}

/// The figures of a cubecl memory model at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CubeclFigures {
    /// cubecl's `bytes_in_use`: the aligned sizes of live slices.
    pub in_use: u64,
    /// cubecl's `bytes_padding` of live slices.
    pub padding: u64,
    /// Bytes of the pages held (cubecl's `bytes_reserved`).
    pub reserved: u64,
    /// Highest `in_use` since the model was made.
    pub peak_in_use: u64,
    /// Bytes of the live buffers as Meta counts them (before rounding to the alignment).
    pub requested: u64,
    /// Highest `requested` since the model was made: the exact model's total peak when every
    /// buffer went through the pools.
    pub peak_requested: u64,
    /// Highest `reserved` since the model was made.
    pub peak_reserved: u64,
    /// Pages allocated from the device so far.
    pub pages_allocated: u64,
    /// Pages held now.
    pub live_pages: u64,
}

#[derive(Debug)]
struct State {
    config: CubeclConfig,
    manager: MemoryManagement<CountingStorage>,
    handles: HashMap<u64, (ManagedMemoryHandle, u64)>,
    in_use: u64,
    peak_in_use: u64,
    requested: u64,
    peak_requested: u64,
    /// Highest in-use since the last [`AllocationHook::device_totals`] reading.
    interval_peak_in_use: u64,
    /// Highest reserved before the storage's peak was last reset.
    peak_reserved: u64,
    error: Option<String>,
}

/// cubecl's memory management as a Meta memory model (see the module docs).
#[derive(Debug, Clone)]
pub struct CubeclModel {
    state: Arc<Mutex<State>>,
}

impl CubeclModel {
    /// A model of burn's CUDA backend on a device of `capacity` bytes.
    pub fn cuda(capacity: u64) -> CubeclModel {
        CubeclModel::new(CubeclConfig::cuda(capacity))
    }

    /// A model with `config`.
    pub fn new(config: CubeclConfig) -> CubeclModel {
        CubeclModel {
            state: Arc::new(Mutex::new(State {
                config,
                manager: counting_manager(config),
                handles: HashMap::new(),
                in_use: 0,
                peak_in_use: 0,
                requested: 0,
                peak_requested: 0,
                interval_peak_in_use: 0,
                peak_reserved: 0,
                error: None,
            })),
        }
    }

    /// A fresh Meta device whose buffers go through this model.
    pub fn device(&self) -> MetaDevice {
        MetaDevice::with_hook(Box::new(self.clone()))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The model's figures now.
    pub fn figures(&self) -> CubeclFigures {
        let mut state = self.lock();
        let usage: MemoryUsage = state.manager.memory_usage();
        let (peak_in_use, requested, peak_requested) =
            (state.peak_in_use, state.requested, state.peak_requested);
        let peak_reserved = state.peak_reserved;
        let storage = state.manager.storage();
        CubeclFigures {
            in_use: usage.bytes_in_use,
            padding: usage.bytes_padding,
            reserved: usage.bytes_reserved,
            peak_in_use,
            requested,
            peak_requested,
            peak_reserved: peak_reserved.max(storage.peak()),
            pages_allocated: storage.pages_allocated(),
            live_pages: storage.live_pages() as u64,
        }
    }

    /// The first allocation cubecl refused (a buffer larger than its largest page), if any.
    pub fn error(&self) -> Option<String> {
        self.lock().error.clone()
    }
}

impl MetaDevice {
    /// A fresh device whose buffers go through cubecl's memory management configured as burn's
    /// CUDA backend configures it on a device of `capacity` bytes; the model is returned to read
    /// its figures ([`CubeclModel`]).
    pub fn cubecl(capacity: u64) -> (MetaDevice, CubeclModel) {
        MetaDevice::cubecl_with(CubeclConfig::cuda(capacity))
    }

    /// A fresh device whose buffers go through cubecl's memory management set up as `config`
    /// says (another runtime's, [`CubeclConfig::wgpu`]).
    pub fn cubecl_with(config: CubeclConfig) -> (MetaDevice, CubeclModel) {
        let model = CubeclModel::new(config);
        (model.device(), model)
    }
}

impl AllocationHook for CubeclModel {
    fn allocated(&mut self, id: u64, bytes: u64, _category: Category) {
        let mut state = self.lock();
        let request = state.config.request(bytes);
        match state.manager.reserve(request) {
            Ok(handle) => {
                state.handles.insert(id, (handle, request));
                state.requested += bytes;
                state.peak_requested = state.peak_requested.max(state.requested);
                state.in_use += request;
                state.peak_in_use = state.peak_in_use.max(state.in_use);
                state.interval_peak_in_use = state.interval_peak_in_use.max(state.in_use);
            }
            Err(error) => {
                if state.error.is_none() {
                    state.error = Some(format!("cubecl refused {request} bytes: {error}"));
                }
            }
        }
    }

    fn freed(&mut self, id: u64, bytes: u64, _category: Category) {
        let mut state = self.lock();
        if let Some((handle, request)) = state.handles.remove(&id) {
            drop(handle);
            state.in_use -= request;
            state.requested -= bytes;
        }
    }

    fn device_totals(&mut self) -> Option<DeviceTotals> {
        let mut state = self.lock();
        let reserved = state.manager.storage().bytes();
        let interval_peak = state.manager.storage().peak();
        let totals = DeviceTotals {
            allocated: state.in_use,
            reserved,
            peak_allocated: state.interval_peak_in_use,
            peak_reserved: interval_peak,
        };
        state.peak_reserved = state.peak_reserved.max(interval_peak);
        state.interval_peak_in_use = state.in_use;
        state.manager.storage().reset_peak();
        Some(totals)
    }

    fn empty_cache(&mut self) {
        self.lock().manager.cleanup(true);
    }

    fn persistent(&mut self, on: bool) {
        let mode = if on {
            MemoryAllocationMode::Persistent
        } else {
            MemoryAllocationMode::Auto
        };
        self.lock().manager.mode(mode);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Meta;
    use burn::tensor::Tensor;
    use burn::tensor::backend::Backend;

    const MIB: u64 = 1 << 20;

    /// `bytes` bytes of f32 on `device` (a multiple of 4).
    fn buffer(device: &MetaDevice, bytes: u64) -> Tensor<Meta, 1> {
        Tensor::empty([(bytes / 4) as usize], device)
    }

    /// The sequence worked out by hand from cubecl-runtime 0.10's rules, on a 1 GiB device:
    /// the largest page is 256 MiB, and `SubSlices` makes sliced pools of 16 MiB pages (slices up
    /// to 4 MiB, or above 12.8 MiB: less than 20% of the page unused), 64 MiB pages (up to
    /// 32 MiB) and 256 MiB pages; sizes are rounded up to 512 B.
    #[test]
    fn pages_reuse_and_cleanup_follow_cubecls_rules() {
        let (device, model) = MetaDevice::cubecl(1 << 30);
        let fig = || model.figures();
        // 1 MiB: a new 16 MiB page.
        let a = buffer(&device, MIB);
        assert_eq!(
            (fig().reserved, fig().in_use, fig().live_pages),
            (16 * MIB, MIB, 1)
        );
        // 1000 B → 1024 B, in the same page.
        let b = buffer(&device, 1000);
        assert_eq!((fig().reserved, fig().in_use), (16 * MIB, MIB + 1024));
        // 20 MiB: the 64 MiB-page pool.
        let c = buffer(&device, 20 * MIB);
        assert_eq!((fig().reserved, fig().live_pages), (80 * MIB, 2));
        // Freeing keeps the page; 1 MiB again reuses the freed slice; 14 MiB (more than
        // 12.8 MiB) fits in what is left of the first page.
        drop(a);
        assert_eq!((fig().reserved, fig().in_use), (80 * MIB, 20 * MIB + 1024));
        let d = buffer(&device, MIB);
        let e = buffer(&device, 14 * MIB);
        assert_eq!((fig().reserved, fig().pages_allocated), (80 * MIB, 2));
        assert_eq!(fig().in_use, 35 * MIB + 1024);
        // A second 14 MiB does not fit: a new 16 MiB page.
        let f = buffer(&device, 14 * MIB);
        assert_eq!((fig().reserved, fig().pages_allocated), (96 * MIB, 3));
        // memory_cleanup returns only pages with no live slice.
        drop((b, d, e));
        Meta::memory_cleanup(&device);
        assert_eq!((fig().reserved, fig().live_pages), (80 * MIB, 2));
        drop(f);
        Meta::memory_cleanup(&device);
        assert_eq!((fig().reserved, fig().live_pages), (64 * MIB, 1));
        assert_eq!(fig().peak_reserved, 96 * MIB);
        assert_eq!(fig().peak_in_use, 49 * MIB + 1024);
        drop(c);
        assert!(model.error().is_none());
    }

    /// Buffers made inside `memory_persistent_allocations` (burn's parameters) get pages of
    /// their own exact size, which later buffers of the same size reuse or, when all are in use,
    /// add to, whatever the mode.
    #[test]
    fn persistent_allocations_get_exact_pages_that_same_sized_buffers_share() {
        let (device, model) = MetaDevice::cubecl(1 << 30);
        let fig = || model.figures();
        let p = Meta::memory_persistent_allocations(&device, (), |_| buffer(&device, 3 * MIB));
        assert_eq!((fig().reserved, fig().live_pages), (3 * MIB, 1));
        drop(p);
        // Outside the persistent section, 3 MiB reuses the free 3 MiB page ...
        let q = buffer(&device, 3 * MIB);
        assert_eq!((fig().reserved, fig().pages_allocated), (3 * MIB, 1));
        // ... and a second 3 MiB gets another exact page, not a slice of a 16 MiB page.
        let r = buffer(&device, 3 * MIB);
        assert_eq!((fig().reserved, fig().pages_allocated), (6 * MIB, 2));
        // Another size goes to the sliced pools.
        let s = buffer(&device, 2 * MIB);
        assert_eq!(fig().reserved, 22 * MIB);
        drop((q, r, s));
        Meta::memory_cleanup(&device);
        assert_eq!(fig().reserved, 0);
    }

    #[test]
    fn device_totals_report_in_use_and_reserved_with_peaks_since_the_last_reading() {
        let (device, model) = MetaDevice::cubecl(1 << 30);
        // 5 MiB is above the 16 MiB pages' 4 MiB slices and leaves more than 20% of such a
        // page unused: a 64 MiB page.
        let a = buffer(&device, 5 * MIB);
        drop(a);
        let totals = device.ledger().device_totals().expect("cubecl totals");
        assert_eq!(totals.allocated, 0);
        assert_eq!(totals.reserved, 64 * MIB);
        assert_eq!(
            (totals.peak_allocated, totals.peak_reserved),
            (5 * MIB, 64 * MIB)
        );
        Meta::memory_cleanup(&device);
        let totals = device.ledger().device_totals().expect("cubecl totals");
        assert_eq!((totals.reserved, totals.peak_reserved), (0, 64 * MIB));
        let totals = device.ledger().device_totals().expect("cubecl totals");
        assert_eq!(totals.peak_reserved, 0);
        assert_eq!(model.figures().peak_reserved, 64 * MIB);
    }
}
