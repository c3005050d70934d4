//! A PyTorch memory snapshot as a pickle that pytorch.org/memory_viz opens.
//!
//! The writer lives in trainmem-alloc ([`trainmem_alloc::pytorch::pickle`]), beside the
//! reader and the replay engine; these are the names the simulator has always exported. Every
//! block and trace entry carries the trainmem category (the allocation's label) in `category`
//! and as a one-frame stack, so the viewer colours the timeline by category, and the trace
//! always includes the `"unknown"` category the web viewer needs to draw anything.

use serde_pickle::Value;
use trainmem_alloc::Snapshot;
use trainmem_alloc::pytorch::pickle;

pub use trainmem_alloc::pytorch::pickle::{VIEWER_OPCODES, first_unsupported_opcode};

use super::ExportError;

/// Builds the snapshot dict as a pickle value.
pub fn snapshot_value(snap: &Snapshot) -> Value {
    pickle::to_value(snap)
}

/// The snapshot pickle bytes (protocol 3).
pub fn snapshot_pickle(snap: &Snapshot) -> Result<Vec<u8>, ExportError> {
    pickle::to_bytes(snap).map_err(|e| ExportError::Pickle(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use trainmem_alloc::{CachingAllocator, SimulatedDevice, StreamId};

    #[test]
    fn snapshot_pickle_opens_in_the_viewer_with_its_categories() {
        let mut a = CachingAllocator::new(SimulatedDevice::new(1 << 30));
        a.enable_trace(None);
        let x = a
            .malloc_labeled(3 << 20, StreamId::DEFAULT, "activation")
            .unwrap();
        let _y = a
            .malloc_labeled(1000, StreamId::DEFAULT, "parameter")
            .unwrap();
        a.free(x.id).unwrap();
        let bytes = snapshot_pickle(&a.snapshot()).unwrap();
        assert_eq!(first_unsupported_opcode(&bytes), None);
        let back = pickle::from_bytes(&bytes).unwrap();
        let cats = back.categories();
        for c in ["activation", "parameter", "unknown"] {
            assert!(cats.contains(&c), "{c} in {cats:?}");
        }
        assert!(matches!(snapshot_value(&a.snapshot()), Value::Dict(_)));
    }
}
