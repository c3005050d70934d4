//! The Meta device: an index into a process-wide table of [`Ledger`]s.
//!
//! burn rebuilds devices from a small numeric id, so a device cannot own its ledger directly;
//! instead each device is an index and the ledgers live in a registry for the life of the
//! process. Index 0 (the [`Default`] device) is shared; [`MetaDevice::new`] and
//! [`MetaDevice::with_hook`] register a fresh ledger, so separate runs (and parallel tests) keep
//! separate accounts. At most 65,536 devices can be created in one process (burn's device ids
//! are 16-bit).

use std::sync::{Arc, LazyLock, Mutex};

use burn::tensor::backend::{DeviceId, DeviceOps};

use crate::memory::{AllocationHook, Ledger, MemoryStats};

/// The type id Meta devices report to burn.
const META_TYPE_ID: u16 = 0x4d45;

static LEDGERS: LazyLock<Mutex<Vec<Arc<Ledger>>>> =
    LazyLock::new(|| Mutex::new(vec![Arc::new(Ledger::new())]));

fn ledgers() -> std::sync::MutexGuard<'static, Vec<Arc<Ledger>>> {
    LEDGERS.lock().unwrap_or_else(|e| e.into_inner())
}

/// A device of the Meta backend: tensors on it have shapes and dtypes but no data, and their
/// bytes are counted by the device's [`Ledger`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct MetaDevice {
    index: u16,
}

impl MetaDevice {
    /// A device with a fresh ledger (exact per-tensor accounting).
    pub fn new() -> MetaDevice {
        MetaDevice::register(Ledger::new())
    }

    /// A device with a fresh ledger that also feeds every allocation and free to `hook`.
    pub fn with_hook(hook: Box<dyn AllocationHook>) -> MetaDevice {
        MetaDevice::register(Ledger::with_hook(hook))
    }

    fn register(ledger: Ledger) -> MetaDevice {
        let mut all = ledgers();
        let index = u16::try_from(all.len())
            .unwrap_or_else(|_| panic!("trainmem-meta: more than 65,536 Meta devices created"));
        all.push(Arc::new(ledger));
        MetaDevice { index }
    }

    /// The device's index (its burn device id).
    pub fn index(&self) -> u16 {
        self.index
    }

    /// The device's ledger.
    pub fn ledger(&self) -> Arc<Ledger> {
        let all = ledgers();
        // Indices are only handed out by `register` (or are 0), so they are always in range;
        // an id forged through `from_id` falls back to the shared ledger.
        all.get(usize::from(self.index)).unwrap_or(&all[0]).clone()
    }

    /// The device's current figures.
    pub fn stats(&self) -> MemoryStats {
        self.ledger().stats()
    }

    /// Sets the device's peaks to its current live bytes.
    pub fn reset_peaks(&self) {
        self.ledger().reset_peaks();
    }
}

impl burn::tensor::backend::Device for MetaDevice {
    fn from_id(device_id: DeviceId) -> Self {
        MetaDevice {
            index: device_id.index_id,
        }
    }

    fn to_id(&self) -> DeviceId {
        DeviceId {
            type_id: META_TYPE_ID,
            index_id: self.index,
        }
    }
}

impl DeviceOps for MetaDevice {}

impl std::fmt::Display for MetaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "meta:{}", self.index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::backend::Device;

    #[test]
    fn fresh_devices_have_separate_ledgers_and_round_trip_their_id() {
        let a = MetaDevice::new();
        let b = MetaDevice::new();
        assert_ne!(a, b);
        assert!(!Arc::ptr_eq(&a.ledger(), &b.ledger()));
        assert_eq!(MetaDevice::from_id(a.to_id()), a);
        assert_eq!(MetaDevice::default().index(), 0);
    }
}
