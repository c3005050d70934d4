//! The simulation engine: runs a plan step by step through the allocator.

pub mod host;
pub mod kernel_scratch;
pub mod memory;
mod runner;

pub use memory::{SimHandle, SimMemory, SimOom};
pub use runner::{simulate, simulate_stage};

use serde::{Deserialize, Serialize};
use trainmem_alloc::Snapshot;
use trainmem_optim::ModelStateBytes;

use crate::machine::Machine;
use trainmem_core::timeline::{CategoryBytes, Phase, Timeline};

/// Options of a simulation run.
#[derive(Default)]
pub struct SimOptions<'a> {
    /// Facts of the machine the run is predicted for (default: [`Machine::DEFAULT`]; the
    /// simulation reads nothing of the machine it runs on).
    pub machine: Machine,
    /// Record the allocator's event trace (for the memory_viz export), keeping at most this
    /// many entries (the most recent).
    pub trace_entries: Option<usize>,
    /// Called after every optimizer step with (steps done, total steps).
    pub progress: Option<&'a mut dyn FnMut(u64, u64)>,
    /// Simulate at most this many steps (overrides the plan; used by `fit`).
    pub max_steps: Option<u64>,
}

impl std::fmt::Debug for SimOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimOptions")
            .field("machine", &self.machine)
            .field("trace_entries", &self.trace_entries)
            .field("max_steps", &self.max_steps)
            .finish()
    }
}

/// Where in the run something happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct When {
    /// Optimizer step.
    pub step: u64,
    /// Epoch.
    pub epoch: u64,
    /// Micro-batch within the step.
    pub micro_batch: Option<u32>,
    /// The phase in progress.
    pub phase: Phase,
}

/// A predicted out-of-memory error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OomReport {
    /// The allocator's message.
    pub message: String,
    /// Bytes requested by the failing allocation.
    pub requested: u64,
    /// Category of the failing allocation.
    pub category: String,
    /// When.
    pub when: When,
}

/// Fragmentation of the caching allocator at the end of the run (or at the OOM).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Fragmentation {
    /// Reserved minus allocated.
    pub cached_unallocated: u64,
    /// The largest free cached block.
    pub largest_free_block: u64,
    /// Free bytes inside segments that still hold a live block (`empty_cache` cannot
    /// release them).
    pub non_releasable: u64,
    /// Bytes `empty_cache` would return right now.
    pub releasable: u64,
}

/// Headline figures of one simulated device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Pipeline stage this device runs (0 without pipeline parallelism).
    pub stage: u64,
    /// Parameter elements on this device (before sharding).
    pub parameters: u64,
    /// Steady-state model-state bytes (parameters, gradients, optimizer state).
    pub model_state: ModelStateBytes,
    /// Peak allocated bytes.
    pub peak_allocated: u64,
    /// When the allocated peak happened.
    pub peak_when: Option<When>,
    /// Bytes per category at the allocated peak (`cache` = reserved − allocated then).
    pub peak_breakdown: CategoryBytes,
    /// Peak reserved bytes.
    pub peak_reserved: u64,
    /// Peak host RSS (anonymous + file).
    pub peak_host_rss: u64,
    /// Fragmentation at the end.
    pub fragmentation: Fragmentation,
    /// The predicted OOM, if any.
    pub oom: Option<OomReport>,
    /// Optimizer steps simulated.
    pub steps: u64,
    /// Allocator calls (allocations; each is later freed).
    pub allocations: u64,
    /// Bytes still allocated at the end beyond model state: kept outputs, metric tensors.
    pub retained_at_end: u64,
    /// Whether every allocation was freed when the run was torn down.
    pub all_freed_at_teardown: bool,
    /// Checkpointing resolved: blocks per segment, blocks recomputed.
    pub checkpointing: Option<(u32, u32)>,
    /// Per category, the most bytes its tensors asked for at any phase boundary (what
    /// PyTorch's `untyped_storage().nbytes()` counts): the timeline's categories are the
    /// caching allocator's blocks, rounded and with the tails it did not split off; these
    /// are the tensors' own sizes (equal to the blocks on a CPU device). Not serialised.
    #[serde(skip)]
    pub tensor_peaks: CategoryBytes,
}

/// The result of simulating a plan.
#[derive(Debug, Clone)]
pub struct SimResult {
    /// The timeline of the device with the highest peak (stage 0 without pipelining).
    pub timeline: Timeline,
    /// Its summary.
    pub summary: Summary,
    /// One summary per pipeline stage (one entry without pipelining).
    pub stages: Vec<Summary>,
    /// The allocator's final snapshot with its trace (caching allocator only).
    pub snapshot: Option<Snapshot>,
}

#[cfg(test)]
mod tests;
