//! Every allocation of one device's trace with its lifetime, and the phase windows of the
//! trace: runs of entries between the points where a recorded stack names a new phase.

use std::collections::HashMap;

use trainmem_alloc::BlockState;
use trainmem_alloc::pytorch::framed::{FramedSnapshot, NO_STACK};
use trainmem_alloc::pytorch::replay::free_action;
use trainmem_alloc::{Snapshot, TraceAction, TraceEntry};
use trainmem_core::Category;

use super::frames::{StackPhase, is_module_machinery, is_workspace, phase_of};

/// One allocation (a tensor's block) and what it was found to be.
#[derive(Debug, Clone, PartialEq)]
pub struct Allocation {
    /// Block address.
    pub addr: u64,
    /// Requested (tensor) bytes.
    pub size: u64,
    /// Trace entry of its `alloc`; None when it was live before recording began.
    pub alloc_at: Option<usize>,
    /// Trace entry of its free; None when still live when the snapshot was taken.
    pub free_at: Option<usize>,
    /// Stack of its allocation ([`NO_STACK`] when none was recorded).
    pub stack: u32,
    /// The category.
    pub category: Category,
    /// The phase it was made in (its own stack's, else the window it was made in).
    pub phase: Option<StackPhase>,
    /// True when its own stack named its phase; false when its lifetime and the phase
    /// around it decided.
    pub by_frames: bool,
    /// True when its stack shows a library's scratch buffer (cuBLAS's workspace), not a
    /// tensor: never counted as model state.
    pub workspace: bool,
    /// True when its stack shows a module's own machinery made it (a module's construction,
    /// `Module._apply` behind `.to()`, loading a state dict, `from_pretrained`): a
    /// parameter's or buffer's block, not state the user's code keeps per parameter.
    pub by_module: bool,
}

impl Allocation {
    /// Live just after trace entry `e`.
    pub fn live_after(&self, e: usize) -> bool {
        self.alloc_at.is_none_or(|a| a <= e) && self.free_at.is_none_or(|f| f > e)
    }
}

/// A run of trace entries in one phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// The phase (None before any stack named one).
    pub phase: Option<StackPhase>,
    /// First entry.
    pub start: usize,
    /// One past the last entry.
    pub end: usize,
    /// Training cycle: counts up at each forward (or data) window that follows backward,
    /// an optimizer step or `zero_grad`.
    pub cycle: usize,
}

/// A device's trace as allocations and windows.
#[derive(Debug, Clone, Default)]
pub struct Lifetimes {
    /// Every allocation, in order of allocation (those live at the start first).
    pub allocations: Vec<Allocation>,
    /// The windows, in order, covering every entry.
    pub windows: Vec<Window>,
    /// Window index of every entry.
    pub window_of: Vec<u32>,
    /// Own phase of each entry's stack.
    pub own_phase: Vec<Option<StackPhase>>,
    /// Entries that recorded a stack.
    pub entries_with_frames: usize,
    /// Allocs at an address already live (its free was not recorded): closed there.
    pub unmatched_allocs: u64,
    /// The windows' phases were inferred from the trace's shape (no stack named any).
    pub phases_inferred: bool,
    /// The first `oom` entry: the run ran out of memory there (a snapshot dumped where the
    /// error was caught ends soon after).
    pub oom_at: Option<usize>,
}

impl Lifetimes {
    /// Replaces the windows (in order, covering every entry) and each entry's window.
    pub fn set_windows(&mut self, windows: Vec<Window>) {
        let len = self.window_of.len();
        self.window_of = vec![0; len];
        for (i, w) in windows.iter().enumerate() {
            for k in w.start..w.end.min(len) {
                self.window_of[k] = i as u32;
            }
        }
        self.windows = windows;
    }
}

fn trains(p: Option<StackPhase>) -> bool {
    matches!(
        p,
        Some(StackPhase::Backward | StackPhase::Optimizer | StackPhase::ZeroGrad)
    )
}

/// Builds the allocations and windows of `device`'s trace.
pub fn lifetimes(f: &FramedSnapshot, device: usize) -> Lifetimes {
    let snap: &Snapshot = &f.snapshot;
    let Some(trace) = snap.device_traces.get(device) else {
        return Lifetimes::default();
    };
    let stacks = f.event_stacks.get(device).map(Vec::as_slice);
    let mut out = Lifetimes {
        own_phase: Vec::with_capacity(trace.len()),
        window_of: Vec::with_capacity(trace.len()),
        ..Lifetimes::default()
    };
    out.oom_at = trace.iter().position(|e| e.action == TraceAction::Oom);
    phase_windows(f, trace.len(), stacks, &mut out);
    let mut maker = AllocationMaker {
        f,
        stack_cache: HashMap::new(),
    };
    let traced = traced_allocations(trace, stacks, &mut maker, &mut out);
    let mut start_live = traced.start_live;
    live_at_snapshot(f, device, &traced.live, &mut maker, &mut start_live);
    start_live.sort_by_key(|a| a.addr);
    start_live.extend(traced.allocs);
    out.allocations = start_live;
    out
}

/// The stack of trace entry `k` ([`NO_STACK`] when none was recorded).
fn stack_at(stacks: Option<&[u32]>, k: usize) -> u32 {
    stacks.and_then(|s| s.get(k)).copied().unwrap_or(NO_STACK)
}

/// Sets the own phase and window of each of the trace's `len` entries, and the windows.
fn phase_windows(f: &FramedSnapshot, len: usize, stacks: Option<&[u32]>, out: &mut Lifetimes) {
    let mut phase_cache: HashMap<u32, Option<StackPhase>> = HashMap::new();
    let mut current: Option<StackPhase> = None;
    let mut cycle = 0usize;
    let mut seen_training = false;
    for k in 0..len {
        let stack = stack_at(stacks, k);
        if stack != NO_STACK {
            out.entries_with_frames += 1;
        }
        let own = *phase_cache
            .entry(stack)
            .or_insert_with(|| phase_of(f.stack(stack)));
        out.own_phase.push(own);
        if let Some(p) = own
            && Some(p) != current
        {
            if matches!(p, StackPhase::Forward | StackPhase::Data) && seen_training {
                cycle += 1;
                seen_training = false;
            }
            if let Some(w) = out.windows.last_mut() {
                w.end = k;
            }
            out.windows.push(Window {
                phase: Some(p),
                start: k,
                end: len,
                cycle,
            });
            current = Some(p);
        }
        if out.windows.is_empty() {
            out.windows.push(Window {
                phase: None,
                start: 0,
                end: len,
                cycle: 0,
            });
        }
        if trains(own) {
            seen_training = true;
        }
        out.window_of.push((out.windows.len() - 1) as u32);
    }
}

/// Makes allocations, telling a library's scratch buffers by their stacks.
struct AllocationMaker<'a> {
    f: &'a FramedSnapshot,
    /// Per stack: (a library's scratch buffer, made by a module's machinery).
    stack_cache: HashMap<u32, (bool, bool)>,
}

impl AllocationMaker<'_> {
    /// An allocation not yet freed or categorized.
    fn make(&mut self, addr: u64, size: u64, alloc_at: Option<usize>, stack: u32) -> Allocation {
        let f = self.f;
        let (workspace, by_module) = if stack == NO_STACK {
            (false, false)
        } else {
            *self.stack_cache.entry(stack).or_insert_with(|| {
                (
                    is_workspace(f.stack(stack)),
                    is_module_machinery(f.stack(stack)),
                )
            })
        };
        Allocation {
            addr,
            size,
            alloc_at,
            free_at: None,
            stack,
            category: Category::Other,
            phase: None,
            by_frames: false,
            workspace,
            by_module,
        }
    }
}

/// The allocations the trace records.
struct Traced {
    /// Those it allocates, in order.
    allocs: Vec<Allocation>,
    /// Those it frees without having allocated them: live before recording began.
    start_live: Vec<Allocation>,
    /// Index in `allocs` of each block still live at its end, by address.
    live: HashMap<u64, usize>,
}

/// The trace's allocations and frees as allocations.
fn traced_allocations(
    trace: &[TraceEntry],
    stacks: Option<&[u32]>,
    maker: &mut AllocationMaker,
    out: &mut Lifetimes,
) -> Traced {
    let free = free_action(trace);
    let mut live: HashMap<u64, usize> = HashMap::new();
    let mut allocs: Vec<Allocation> = Vec::new();
    let mut start_live: Vec<Allocation> = Vec::new();
    for (k, e) in trace.iter().enumerate() {
        let stack = stack_at(stacks, k);
        match &e.action {
            TraceAction::Alloc => {
                if let Some(old) = live.insert(e.addr, allocs.len()) {
                    allocs[old].free_at = Some(k);
                    out.unmatched_allocs += 1;
                }
                allocs.push(maker.make(e.addr, e.size, Some(k), stack));
            }
            a if *a == free => match live.remove(&e.addr) {
                Some(i) => allocs[i].free_at = Some(k),
                None => {
                    let mut a = maker.make(e.addr, e.size, None, NO_STACK);
                    a.free_at = Some(k);
                    start_live.push(a);
                }
            },
            _ => {}
        }
    }
    Traced {
        allocs,
        start_live,
        live,
    }
}

/// Appends the blocks live at the snapshot that the trace never allocated.
fn live_at_snapshot(
    f: &FramedSnapshot,
    device: usize,
    live: &HashMap<u64, usize>,
    maker: &mut AllocationMaker,
    start_live: &mut Vec<Allocation>,
) {
    let snap = &f.snapshot;
    for (s, seg) in snap.segments.iter().enumerate() {
        if seg.device as usize != device && snap.device_traces.len() > 1 {
            continue;
        }
        for (b, block) in seg.blocks.iter().enumerate() {
            if block.state == BlockState::ActiveAllocated && !live.contains_key(&block.address) {
                let stack = f
                    .block_stacks
                    .get(s)
                    .and_then(|v| v.get(b))
                    .copied()
                    .unwrap_or(NO_STACK);
                start_live.push(maker.make(block.address, block.requested_size, None, stack));
            }
        }
    }
}
