//! Synthetic PyTorch memory snapshots of a training loop whose categories are known, written
//! with the stacks PyTorch records (module calls, the autograd engine, an optimizer,
//! `zero_grad`, a batch moved to the device, native frames under each) and no category
//! anywhere: the ground truth of the categorizer's tests and the input of
//! `cargo xtask bench explain`.
//!
//! The pickle is written directly as PyTorch's is laid out: each stack frame is a dict
//! written once and referred back to through the memo by every entry that has it; each
//! allocation has a frames list of its own, which the `free_requested` and `free_completed`
//! entries of its free share; dict keys and actions are memoized strings.

use std::collections::HashMap;

use trainmem_alloc::{
    BlockId, CachingAllocator, SegmentInfo, SimulatedDevice, StreamId, TraceAction,
};
use trainmem_core::Category;

/// A training loop to write as a snapshot: the model moved to the device, then `steps` steps
/// of `zero_grad` (set to none), a batch moved, forward (one saved activation and one scratch
/// tensor per layer), backward (a scratch tensor and a gradient per parameter, the saved
/// activations freed), AdamW (two moments per parameter made at the first step, a scratch
/// tensor per parameter).
#[derive(Debug, Clone)]
pub struct SyntheticLoop {
    /// Parameter sizes in bytes.
    pub params: Vec<u64>,
    /// Saved activation sizes in bytes, one per layer.
    pub activations: Vec<u64>,
    /// Bytes of a batch.
    pub batch: u64,
    /// Training steps.
    pub steps: usize,
    /// Record stacks (false: every `frames` list is empty).
    pub with_frames: bool,
    /// Native (C++) frames under the Python frames of each stack, as a `stacks="all"`
    /// recording has them.
    pub native_frames: usize,
    /// Frees record the stack they ran in (as PyTorch records them); false: only
    /// `zero_grad`'s do, the others have an empty `frames` list.
    pub free_frames: bool,
    /// A leak: a tensor of this many bytes made in forward at [`LEAK_SITE`] and kept alive
    /// by every step.
    pub leak: Option<u64>,
    /// The model code lines forward's tensors are made at.
    pub forward_lines: ForwardLines,
    /// A device of this many bytes (None: one that never runs out): the first allocation
    /// the caching allocator cannot serve ends the recording with its `oom` entry, as a
    /// snapshot dumped where a training script catches `torch.cuda.OutOfMemoryError` does.
    pub capacity: Option<u64>,
}

/// The model code lines a [`SyntheticLoop`]'s forward makes its tensors at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ForwardLines {
    /// Layer `i` at `model.py` line `20 + i`, its saved activation and its scratch tensor on
    /// that one line.
    #[default]
    PerLayer,
    /// Every layer runs one block's code: the saved activation at [`BLOCK_LINE`], the
    /// scratch tensor on the next line, as a transformer's layers share their module's lines.
    OneBlock,
    /// The model is `torch.nn` layers in a `Sequential`, called from one line of the training
    /// step ([`CALL_LINE`]): no line of the model's own code shows in the stacks.
    TorchLayers,
}

/// The block line of [`ForwardLines::OneBlock`] (`file`, `line`, `function`), in the file
/// [`LEAK_SITE`] names.
pub const BLOCK_LINE: (&str, i64, &str) = ("/home/me/model.py", 30, "forward");

/// The line of the training step that calls a [`ForwardLines::TorchLayers`] model.
pub const CALL_LINE: (&str, i64, &str) = ("/home/me/train.py", 70, "train_step");

/// The source line the leaked tensors are made at (`file`, `line`, `function`).
pub const LEAK_SITE: (&str, i64, &str) = ("/home/me/model.py", 47, "forward");

/// A written synthetic snapshot.
#[derive(Debug, Clone)]
pub struct SyntheticSnapshot {
    /// The pickle.
    pub bytes: Vec<u8>,
    /// Every allocation: the trace entry of its `alloc`, its bytes and its true category.
    pub truth: Vec<(usize, u64, Category)>,
    /// Trace entries written.
    pub events: usize,
}

impl SyntheticLoop {
    /// A loop of `layers` layers (a parameter and an activation each) of a few MiB, with
    /// stacks of about 30 frames, and as many steps as make about `events` trace entries (of
    /// tensors: the few `segment_alloc` entries come on top).
    pub fn with_events(layers: usize, events: usize) -> SyntheticLoop {
        let layers = layers.max(1);
        let mut l = SyntheticLoop {
            params: (0..layers).map(|i| (1 << 20) + 4096 * i as u64).collect(),
            activations: (0..layers).map(|i| (2 << 20) + 512 * i as u64).collect(),
            batch: 1 << 16,
            steps: 1,
            with_frames: true,
            native_frames: 18,
            free_frames: true,
            leak: None,
            forward_lines: ForwardLines::PerLayer,
            capacity: None,
        };
        l.steps = events.div_ceil(l.events_per_step()).max(1);
        l
    }

    /// Trace entries of tensors (allocs and frees) of one step after the first.
    pub fn events_per_step(&self) -> usize {
        let (p, a) = (self.params.len(), self.activations.len());
        // zero_grad frees, batch alloc, forward (alloc + scratch alloc/free), backward
        // (scratch alloc/free + gradient alloc), activation frees, batch free, optimizer
        // scratch alloc/free, the leak
        2 * p + 1 + 4 * a + 4 * p + 2 * a + 2 + 3 * p + usize::from(self.leak.is_some())
    }

    /// The loop's allocations and frees, in order.
    fn ops(&self, st: &StackIds) -> Vec<LoopOp> {
        let mut ops = Vec::new();
        let mut next = 0usize;
        let mut alloc = |ops: &mut Vec<LoopOp>, size: u64, stack: usize, cat: Category| {
            next += 1;
            ops.push(LoopOp::Alloc {
                id: next - 1,
                size,
                stack,
                category: cat,
            });
            next - 1
        };
        // the stack a free records
        let at = |stack: usize| self.free_frames.then_some(stack);
        let free = |ops: &mut Vec<LoopOp>, id: usize, stack: Option<usize>| {
            ops.push(LoopOp::Free { id, stack });
        };
        for &p in &self.params {
            alloc(&mut ops, p, st.setup, Category::Parameter);
        }
        let mut grads: Vec<usize> = Vec::new();
        for step in 0..self.steps {
            for g in grads.drain(..) {
                free(&mut ops, g, Some(st.zero_grad));
            }
            let x = alloc(&mut ops, self.batch, st.data, Category::Input);
            let mut saved = Vec::new();
            for (i, &s) in self.activations.iter().enumerate() {
                saved.push(alloc(&mut ops, s, st.forward[i], Category::Activation));
                let t = alloc(&mut ops, s / 2 + 1, st.scratch[i], Category::Temporary);
                free(&mut ops, t, at(st.scratch[i]));
            }
            if let Some(leak) = self.leak {
                alloc(&mut ops, leak, st.leak, Category::Activation);
            }
            for (i, &p) in self.params.iter().enumerate().rev() {
                let t = alloc(&mut ops, p, st.backward, Category::Temporary);
                free(&mut ops, t, at(st.backward));
                grads.push(alloc(&mut ops, p, st.backward, Category::Gradient));
                if let Some(&a) = saved.get(i) {
                    free(&mut ops, a, at(st.backward));
                }
            }
            for &a in saved.iter().skip(self.params.len()) {
                free(&mut ops, a, at(st.backward));
            }
            free(&mut ops, x, at(st.step));
            for &p in &self.params {
                if step == 0 {
                    alloc(&mut ops, p, st.optimizer, Category::OptimizerState);
                    alloc(&mut ops, p, st.optimizer, Category::OptimizerState);
                }
                let t = alloc(&mut ops, p, st.optimizer, Category::Temporary);
                free(&mut ops, t, at(st.optimizer));
            }
        }
        ops
    }

    /// Writes the snapshot. The addresses are those trainmem-alloc's caching allocator (with
    /// PyTorch's default settings, on an unbounded simulated device) gives the loop's
    /// allocations, with its `segment_alloc` entries and the segments it holds at the end, so
    /// the snapshot replays as a recorded one does.
    pub fn build(&self) -> SyntheticSnapshot {
        let mut w = Writer::new(self.with_frames);
        let st = StackIds::new(
            &mut w,
            self.activations.len(),
            self.native_frames,
            self.forward_lines,
        );
        let ops = self.ops(&st);
        let mut a = CachingAllocator::new(SimulatedDevice::new(self.capacity.unwrap_or(1 << 50)));
        a.enable_trace(None);
        let mut blocks: Vec<Option<BlockId>> = Vec::new();
        // per alloc / free entry the allocator records: the stack, and the truth of allocs
        let mut log: Vec<LogEntry> = Vec::new();
        for op in &ops {
            match *op {
                LoopOp::Alloc {
                    id,
                    size,
                    stack,
                    category,
                } => {
                    let Ok(b) = a.malloc(size, StreamId::DEFAULT) else {
                        // the `oom` entry, with the stack of the allocation that failed
                        log.push((Some(stack), None));
                        break;
                    };
                    if blocks.len() <= id {
                        blocks.resize(id + 1, None);
                    }
                    blocks[id] = Some(b.id);
                    log.push((Some(stack), Some((size, category))));
                }
                LoopOp::Free { id, stack } => {
                    if let Some(b) = blocks.get_mut(id).and_then(Option::take) {
                        let _ = a.free(b);
                        log.push((stack, None));
                        log.push((stack, None));
                    }
                }
            }
        }
        let snap = a.snapshot();
        let trace = snap.device_traces.first().map_or(&[][..], Vec::as_slice);
        let mut truth = Vec::new();
        let mut log = log.into_iter();
        w.begin(&snap.segments);
        for e in trace {
            let (stack, t) = match e.action {
                TraceAction::Alloc
                | TraceAction::FreeRequested
                | TraceAction::FreeCompleted
                | TraceAction::Oom => log.next().unwrap_or((None, None)),
                _ => (None, None),
            };
            if let Some((size, category)) = t {
                truth.push((w.events, size, category));
            }
            let frames = match stack {
                None => Frames::Empty,
                // the two entries of a free share one list, as PyTorch's do
                Some(s) if e.action == TraceAction::FreeCompleted => match w.last_list {
                    Some(k) => Frames::Recall(k),
                    None => Frames::Stack(s),
                },
                Some(s) => Frames::Stack(s),
            };
            w.entry(e.action.as_str(), e.addr, e.size, frames);
        }
        let events = w.events;
        SyntheticSnapshot {
            bytes: w.finish(),
            truth,
            events,
        }
    }
}

/// The stack of an alloc or free entry, and an alloc's bytes and category.
type LogEntry = (Option<usize>, Option<(u64, Category)>);

/// One step of the loop.
enum LoopOp {
    Alloc {
        id: usize,
        size: u64,
        stack: usize,
        category: Category,
    },
    Free {
        id: usize,
        stack: Option<usize>,
    },
}

/// The stacks of each phase, as ids into the writer's table.
struct StackIds {
    setup: usize,
    data: usize,
    step: usize,
    forward: Vec<usize>,
    scratch: Vec<usize>,
    leak: usize,
    backward: usize,
    optimizer: usize,
    zero_grad: usize,
}

type F = (String, i64, String);

fn fr(file: &str, line: i64, name: &str) -> F {
    (file.to_string(), line, name.to_string())
}

/// Where the synthetic torch is installed.
const TORCH: &str = "/env/lib/python3.12/site-packages/torch";

/// The frames of a module call (`module(x)`), innermost first.
fn module_call() -> Vec<F> {
    vec![
        fr(&format!("{TORCH}/nn/modules/module.py"), 1750, "_call_impl"),
        fr(
            &format!("{TORCH}/nn/modules/module.py"),
            1739,
            "_wrapped_call_impl",
        ),
    ]
}

/// The frames of `name` at `line` of the model, inside its forward in the training step.
fn forward_at(line: i64, name: &str) -> Vec<F> {
    let mut s = vec![fr("/home/me/model.py", line, name)];
    s.extend(module_call());
    s.push(fr("/home/me/model.py", 80, "forward"));
    s.extend(module_call());
    s.push(fr("/home/me/train.py", 70, "train_step"));
    s
}

/// The frames every stack shares: native ones innermost, the script's outermost.
struct SharedFrames {
    natives: Vec<F>,
    outer: [F; 3],
}

impl SharedFrames {
    fn new(native: usize) -> SharedFrames {
        SharedFrames {
            natives: (0..native)
                .map(|i| fr("??", 0, &format!("c10::native_frame_{i}(void*)")))
                .collect(),
            outer: [
                fr("/home/me/train.py", 88, "train"),
                fr("/home/me/train.py", 120, "main"),
                fr("/home/me/train.py", 130, "<module>"),
            ],
        }
    }

    /// Writes the stack of `inner` within the shared frames; returns its id.
    fn stack(&self, w: &mut Writer, inner: Vec<F>, with_outer: bool) -> usize {
        let mut s = self.natives.clone();
        s.extend(inner);
        if with_outer {
            s.extend(self.outer.iter().cloned());
        }
        w.stack(s)
    }
}

impl StackIds {
    fn new(w: &mut Writer, layers: usize, native: usize, lines: ForwardLines) -> StackIds {
        let frames = SharedFrames::new(native);
        let mut stack = |inner: Vec<F>, with_outer: bool| frames.stack(w, inner, with_outer);
        let (forward, scratch) = match lines {
            ForwardLines::PerLayer => {
                let each: Vec<usize> = (0..layers)
                    .map(|i| stack(forward_at(20 + i as i64, "forward"), true))
                    .collect();
                (each.clone(), each)
            }
            ForwardLines::OneBlock => {
                let (_, line, name) = BLOCK_LINE;
                let saved = stack(forward_at(line, name), true);
                let scratch = stack(forward_at(line + 1, name), true);
                (vec![saved; layers], vec![scratch; layers])
            }
            ForwardLines::TorchLayers => {
                let mut s = vec![fr(&format!("{TORCH}/nn/modules/linear.py"), 125, "forward")];
                s.extend(module_call());
                s.push(fr(
                    &format!("{TORCH}/nn/modules/container.py"),
                    250,
                    "forward",
                ));
                s.extend(module_call());
                let (file, line, name) = CALL_LINE;
                s.push(fr(file, line, name));
                let one = stack(s, true);
                (vec![one; layers], vec![one; layers])
            }
        };
        StackIds {
            forward,
            scratch,
            setup: stack(
                vec![
                    fr(&format!("{TORCH}/nn/modules/module.py"), 1158, "convert"),
                    fr(&format!("{TORCH}/nn/modules/module.py"), 833, "_apply"),
                ],
                true,
            ),
            data: stack(
                vec![fr(
                    "python_variable_methods.cpp",
                    0,
                    "torch::autograd::THPVariable_to(_object*)",
                )],
                true,
            ),
            step: stack(vec![fr("/home/me/train.py", 75, "train_step")], true),
            leak: stack(forward_at(LEAK_SITE.1, LEAK_SITE.2), true),
            backward: stack(
                vec![
                    fr(
                        "??",
                        0,
                        "torch::autograd::generated::MmBackward0::apply(std::vector)",
                    ),
                    fr(
                        "??",
                        0,
                        "torch::autograd::Engine::thread_main(std::shared_ptr)",
                    ),
                ],
                false,
            ),
            optimizer: stack(
                vec![
                    fr(
                        &format!("{TORCH}/optim/adamw.py"),
                        377,
                        "_single_tensor_adamw",
                    ),
                    fr(&format!("{TORCH}/optim/optimizer.py"), 487, "wrapper"),
                ],
                true,
            ),
            zero_grad: stack(
                vec![fr(&format!("{TORCH}/optim/optimizer.py"), 990, "zero_grad")],
                true,
            ),
        }
    }
}

/// Writes a snapshot pickle (protocol 4 opcodes) entry by entry.
struct Writer {
    out: Vec<u8>,
    next_memo: u32,
    with_frames: bool,
    /// Memo keys of strings written.
    strings: HashMap<String, u32>,
    /// Frames: content and memo key once written.
    frames: Vec<(F, Option<u32>)>,
    frame_ids: HashMap<F, usize>,
    /// Stacks as frame ids.
    stacks: Vec<Vec<usize>>,
    events: usize,
    time_us: u64,
    /// Memo key of the last frames list written.
    last_list: Option<u32>,
}

const APPENDS_BATCH: usize = 1000;

impl Writer {
    fn new(with_frames: bool) -> Writer {
        Writer {
            out: vec![0x80, 0x04],
            next_memo: 0,
            with_frames,
            strings: HashMap::new(),
            frames: Vec::new(),
            frame_ids: HashMap::new(),
            stacks: Vec::new(),
            events: 0,
            time_us: 1_700_000_000_000_000,
            last_list: None,
        }
    }

    fn stack(&mut self, frames: Vec<F>) -> usize {
        let ids = frames
            .into_iter()
            .map(|f| {
                let next = self.frames.len();
                *self.frame_ids.entry(f.clone()).or_insert_with(|| {
                    self.frames.push((f, None));
                    next
                })
            })
            .collect();
        self.stacks.push(ids);
        self.stacks.len() - 1
    }

    fn memoize(&mut self) -> u32 {
        let k = self.next_memo;
        self.next_memo += 1;
        if k < 256 {
            self.out.extend_from_slice(&[b'q', k as u8]);
        } else {
            self.out.push(b'r');
            self.out.extend_from_slice(&k.to_le_bytes());
        }
        k
    }

    fn get(&mut self, k: u32) {
        if k < 256 {
            self.out.extend_from_slice(&[b'h', k as u8]);
        } else {
            self.out.push(b'j');
            self.out.extend_from_slice(&k.to_le_bytes());
        }
    }

    fn raw_str(&mut self, s: &str) {
        let b = s.as_bytes();
        if b.len() < 256 {
            self.out.extend_from_slice(&[0x8c, b.len() as u8]);
        } else {
            self.out.push(b'X');
            self.out.extend_from_slice(&(b.len() as u32).to_le_bytes());
        }
        self.out.extend_from_slice(b);
    }

    /// A string written once and recalled after.
    fn key(&mut self, s: &str) {
        match self.strings.get(s) {
            Some(&k) => self.get(k),
            None => {
                self.raw_str(s);
                let k = self.memoize();
                self.strings.insert(s.to_string(), k);
            }
        }
    }

    fn int(&mut self, v: u64) {
        if v < 256 {
            self.out.extend_from_slice(&[b'K', v as u8]);
        } else if v < 65536 {
            self.out.push(b'M');
            self.out.extend_from_slice(&(v as u16).to_le_bytes());
        } else if v < (1 << 31) {
            self.out.push(b'J');
            self.out.extend_from_slice(&(v as u32).to_le_bytes());
        } else {
            // LONG1 of 9 bytes: the top byte keeps the sign positive
            self.out.extend_from_slice(&[0x8a, 9]);
            self.out.extend_from_slice(&v.to_le_bytes());
            self.out.push(0);
        }
    }

    fn frame(&mut self, id: usize) {
        if let Some(k) = self.frames[id].1 {
            self.get(k);
            return;
        }
        let (file, line, name) = self.frames[id].0.clone();
        self.out.push(b'}');
        let k = self.memoize();
        self.out.push(b'(');
        self.key("filename");
        self.raw_str(&file);
        self.key("line");
        self.int(line.max(0) as u64);
        self.key("name");
        self.raw_str(&name);
        self.out.push(b'u');
        self.frames[id].1 = Some(k);
    }

    /// `{'segments': [...], 'device_traces': [[` and the first MARK of the entries.
    fn begin(&mut self, segments: &[SegmentInfo]) {
        self.out.push(b'}');
        self.out.push(b'(');
        self.key("segments");
        self.out.push(b']');
        if !segments.is_empty() {
            self.out.push(b'(');
            for seg in segments {
                self.segment(seg);
            }
            self.out.push(b'e');
        }
        self.key("device_traces");
        self.out.push(b']');
        self.out.push(b'(');
        self.out.push(b']');
        self.out.push(b'(');
    }

    fn segment(&mut self, seg: &SegmentInfo) {
        self.out.extend_from_slice(b"}(");
        for (k, v) in [
            ("device", 0),
            ("address", seg.address),
            ("total_size", seg.total_size),
            ("allocated_size", seg.allocated_size),
            ("active_size", seg.active_size),
            ("requested_size", seg.requested_size),
            ("stream", seg.stream.0),
        ] {
            self.key(k);
            self.int(v);
        }
        self.key("segment_type");
        self.raw_str(seg.segment_type.as_str());
        self.key("frames");
        self.out.push(b']');
        self.key("blocks");
        self.out.extend_from_slice(b"](");
        for b in &seg.blocks {
            self.out.extend_from_slice(b"}(");
            self.key("address");
            self.int(b.address);
            self.key("size");
            self.int(b.size);
            self.key("requested_size");
            self.int(b.requested_size);
            self.key("state");
            self.raw_str(b.state.as_str());
            self.key("frames");
            self.out.push(b']');
            self.out.push(b'u');
        }
        self.out.extend_from_slice(b"eu");
    }

    fn entry(&mut self, action: &str, addr: u64, size: u64, frames: Frames) -> u32 {
        if self.events > 0 && self.events.is_multiple_of(APPENDS_BATCH) {
            self.out.extend_from_slice(b"e(");
        }
        self.events += 1;
        self.time_us += 3;
        self.out.push(b'}');
        self.out.push(b'(');
        self.key("action");
        self.key(action);
        // an `oom` entry holds the bytes the device had free where others hold an address
        self.key(if action == "oom" {
            "device_free"
        } else {
            "addr"
        });
        self.int(addr);
        self.key("size");
        self.int(size);
        self.key("stream");
        self.int(0);
        self.key("time_us");
        self.int(self.time_us);
        self.key("frames");
        let list = match frames {
            Frames::Recall(k) => {
                self.get(k);
                k
            }
            Frames::Stack(s) => {
                self.out.push(b']');
                let k = self.memoize();
                if self.with_frames {
                    self.out.push(b'(');
                    for i in 0..self.stacks[s].len() {
                        let f = self.stacks[s][i];
                        self.frame(f);
                    }
                    self.out.push(b'e');
                }
                k
            }
            Frames::Empty => {
                self.out.push(b']');
                u32::MAX
            }
        };
        self.out.push(b'u');
        self.last_list = (list != u32::MAX).then_some(list);
        list
    }

    fn finish(mut self) -> Vec<u8> {
        // close the entries, the traces list, the top dict
        self.out.extend_from_slice(b"eeu.");
        self.out
    }
}

enum Frames {
    Stack(usize),
    Recall(u32),
    Empty,
}
