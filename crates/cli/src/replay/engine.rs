//! Applies trace ops to trainmem's caching allocator on a simulated device, keeping the
//! counts a replay report needs.

use std::collections::{HashMap, HashSet};

use anyhow::{Context, bail};
use serde::Serialize;
use trainmem_alloc::{
    AllocError, AllocatorConfig, BlockId, CachingAllocator, SimulatedDevice, StreamId,
};

use super::trace::{Op, Origin};

/// An allocation that ran out of memory; the replay went on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OomEvent {
    /// Where the op is in the trace (`line 12`, `device_traces[0] entry 40`).
    pub at: String,
    /// Line number for JSON-lines traces.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<u64>,
    /// The block's id in the trace.
    pub id: u64,
    /// Requested bytes.
    pub size: u64,
    /// The allocator's out-of-memory message.
    pub message: String,
}

/// Counts of what was replayed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// Ops applied.
    pub ops: u64,
    /// `alloc` ops (including those that ran out of memory).
    pub allocs: u64,
    /// `free` ops applied to live blocks.
    pub frees: u64,
    /// `free` ops of blocks whose `alloc` ran out of memory (nothing to free; skipped).
    pub frees_of_failed_allocs: u64,
    /// `empty_cache` ops.
    pub empty_cache_calls: u64,
    /// Bytes `empty_cache` ops returned to the device.
    pub empty_cache_released_bytes: u64,
    /// Blocks still live when the trace ended.
    pub live_at_end: u64,
}

/// A replay in progress.
pub struct Replay {
    alloc: CachingAllocator<SimulatedDevice>,
    live: HashMap<u64, BlockId>,
    failed: HashSet<u64>,
    counts: Counts,
    ooms: Vec<OomEvent>,
}

impl Replay {
    /// A fresh allocator with `config` on a simulated device of `capacity` bytes.
    pub fn new(capacity: u64, config: AllocatorConfig) -> Self {
        Self {
            alloc: CachingAllocator::with_config(SimulatedDevice::new(capacity), config),
            live: HashMap::new(),
            failed: HashSet::new(),
            counts: Counts::default(),
            ooms: Vec::new(),
        }
    }

    /// Applies one op. Out-of-memory is recorded and is not an error; an alloc of a live id,
    /// a free of an unknown id and allocator errors other than out-of-memory are.
    pub fn apply(&mut self, origin: Origin, op: Op) -> anyhow::Result<()> {
        self.counts.ops += 1;
        match op {
            Op::Alloc { id, size, stream } => {
                self.counts.allocs += 1;
                if self.live.contains_key(&id) {
                    bail!("{origin}: alloc of id {id}, which is still live (free it first)");
                }
                self.failed.remove(&id);
                match self.alloc.malloc(size, StreamId(stream)) {
                    Ok(block) => {
                        self.live.insert(id, block.id);
                    }
                    Err(AllocError::OutOfMemory(report)) => {
                        self.failed.insert(id);
                        self.ooms.push(OomEvent {
                            at: origin.to_string(),
                            line: match origin {
                                Origin::Line(line) => Some(line),
                                Origin::Entry { .. } => None,
                            },
                            id,
                            size,
                            message: report.to_string(),
                        });
                    }
                    Err(err) => {
                        return Err(err)
                            .with_context(|| format!("{origin}: alloc of {size} bytes"));
                    }
                }
            }
            Op::Free { id } => match self.live.remove(&id) {
                Some(block) => {
                    self.alloc
                        .free(block)
                        .with_context(|| format!("{origin}: free of id {id}"))?;
                    self.counts.frees += 1;
                }
                None if self.failed.remove(&id) => self.counts.frees_of_failed_allocs += 1,
                None => {
                    bail!("{origin}: free of unknown id {id} (never allocated, or already freed)")
                }
            },
            Op::EmptyCache => {
                let released = self
                    .alloc
                    .empty_cache()
                    .with_context(|| format!("{origin}: empty_cache"))?;
                self.counts.empty_cache_calls += 1;
                self.counts.empty_cache_released_bytes += released.bytes;
            }
        }
        Ok(())
    }

    /// The counts so far (with `live_at_end` filled in).
    pub fn counts(&self) -> Counts {
        Counts {
            live_at_end: self.live.len() as u64,
            ..self.counts.clone()
        }
    }

    /// The out-of-memory events so far.
    pub fn ooms(&self) -> &[OomEvent] {
        &self.ooms
    }

    /// The allocator.
    pub fn allocator(&self) -> &CachingAllocator<SimulatedDevice> {
        &self.alloc
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn alloc(id: u64, size: u64) -> Op {
        Op::Alloc {
            id,
            size,
            stream: 0,
        }
    }

    #[test]
    fn replays_and_counts() {
        let mut r = Replay::new(1 << 30, AllocatorConfig::default());
        let ops = [
            alloc(1, 3 * MIB),
            alloc(2, 100),
            Op::Free { id: 1 },
            Op::EmptyCache,
        ];
        for (i, op) in ops.into_iter().enumerate() {
            r.apply(Origin::Line(i as u64 + 1), op).unwrap();
        }
        let c = r.counts();
        assert_eq!(
            (c.ops, c.allocs, c.frees, c.empty_cache_calls, c.live_at_end),
            (4, 2, 1, 1, 1)
        );
        // The 3 MiB block lived in a 20 MiB segment, fully free after the free: released.
        assert_eq!(c.empty_cache_released_bytes, 20 * MIB);
        assert_eq!(r.allocator().memory_allocated(), 512);
        assert_eq!(r.allocator().memory_reserved(), 2 * MIB);
    }

    #[test]
    fn oom_is_recorded_and_the_replay_goes_on() {
        let mut r = Replay::new(64 * MIB, AllocatorConfig::default());
        r.apply(Origin::Line(1), alloc(1, 40 * MIB)).unwrap();
        r.apply(Origin::Line(2), alloc(2, 40 * MIB)).unwrap();
        r.apply(Origin::Line(3), Op::Free { id: 2 }).unwrap();
        r.apply(Origin::Line(4), alloc(3, 10 * MIB)).unwrap();
        assert_eq!(r.ooms().len(), 1);
        assert_eq!(r.ooms()[0].line, Some(2));
        assert!(
            r.ooms()[0].message.contains("Tried to allocate 40.00 MiB"),
            "{}",
            r.ooms()[0].message
        );
        let c = r.counts();
        assert_eq!(
            (c.frees, c.frees_of_failed_allocs, c.live_at_end),
            (0, 1, 2)
        );
    }

    #[test]
    fn bad_ids_name_the_line() {
        let mut r = Replay::new(1 << 30, AllocatorConfig::default());
        let err = r.apply(Origin::Line(9), Op::Free { id: 5 }).unwrap_err();
        assert!(
            format!("{err:#}").contains("line 9: free of unknown id 5"),
            "{err:#}"
        );
        r.apply(Origin::Line(10), alloc(5, 1)).unwrap();
        let err = r.apply(Origin::Line(11), alloc(5, 1)).unwrap_err();
        assert!(format!("{err:#}").contains("line 11: alloc of id 5, which is still live"));
    }
}
