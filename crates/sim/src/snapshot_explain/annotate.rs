//! The user's snapshot written back with every trace event's and block's category set, so
//! PyTorch's own viewer colours the recorded run by category.

use trainmem_alloc::pytorch::framed::{FramedError, FramedSnapshot};

use super::SnapshotExplanation;

/// The annotated pickle: `bytes` (the pickle `f` was read from) with the events of the
/// explained device given their allocation's category and the blocks live at the end
/// theirs; everything else (other devices, segment events) is `"unknown"`. Frames and every
/// other key are kept as recorded.
pub fn annotate(
    f: &FramedSnapshot,
    bytes: &[u8],
    ex: &SnapshotExplanation,
) -> Result<Vec<u8>, FramedError> {
    let mut at_end = std::collections::HashMap::new();
    for a in ex.allocations.iter().filter(|a| a.free_at.is_none()) {
        at_end.insert(a.addr, a.category.name().to_string());
    }
    let addrs: Vec<Vec<u64>> = f
        .snapshot
        .segments
        .iter()
        .map(|s| s.blocks.iter().map(|b| b.address).collect())
        .collect();
    let device = ex.device;
    f.annotated(
        bytes,
        |d, k| {
            if d != device {
                return None;
            }
            ex.entry_allocation
                .get(k)
                .copied()
                .flatten()
                .and_then(|i| ex.allocations.get(i as usize))
                .map(|a| a.category.name().to_string())
        },
        |s, b| {
            addrs
                .get(s)
                .and_then(|v| v.get(b))
                .and_then(|addr| at_end.get(addr).cloned())
        },
    )
}
