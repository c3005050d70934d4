//! Running a [`Program`]: forward records what each op saves, backward walks in reverse,
//! allocating gradients and freeing each op's saved tensors as it completes.
//!
//! * A **no-grad** forward saves nothing and frees each intermediate after its last use.
//! * **Checkpointed** segments run forward without saving (keeping only the tensors that
//!   enter the segment); backward re-runs the segment's forward, saving, just before it needs
//!   the saved tensors, then frees them as usual.
//! * **`retain_graph`** keeps the saved tensors after backward; they stay alive as long as the
//!   caller keeps the [`Tape`] (the classic leak when outputs are kept across steps).
//! * A tensor the caller holds (a kept output, [`Tape::held`]) stays alive until released.
//!
//! Gradients of intermediate values are [`Category::Temporary`]; parameter gradients are
//! [`Category::Gradient`] and stay in [`Graph::param_grads`] (accumulating across
//! micro-batches) until the caller drops them after the optimizer step.

use trainmem_core::Category;

use crate::checkpoint::Segment;
use crate::op::{Saved, SavedTable};
use crate::program::{LossChunks, Op, Program, ValueDtype, ValueId, scaled_count};
use crate::store::{TensorId, TensorMemory, TensorStore};
use trainmem_core::Dtype;
use trainmem_core::OpKind;

/// Which pass a layer hook is called in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pass {
    /// The forward pass.
    Forward,
    /// Re-running a checkpointed segment's forward during backward.
    Recompute,
    /// The backward pass.
    Backward,
}

/// Called at layer boundaries, e.g. to gather ZeRO-3 parameter shards before a layer and
/// free them after, or to reduce-scatter a layer's gradients.
pub trait LayerHooks<M: TensorMemory> {
    /// Before the first op of `layer` in `pass`.
    fn before_layer(
        &mut self,
        _store: &mut TensorStore<M>,
        _layer: u32,
        _pass: Pass,
    ) -> Result<(), M::Error> {
        Ok(())
    }
    /// After the last op of `layer` in `pass`; `param_grads` are the graph's parameter
    /// gradients (backward only; the hook may replace them, e.g. by shards).
    fn after_layer(
        &mut self,
        _store: &mut TensorStore<M>,
        _layer: u32,
        _pass: Pass,
        _param_grads: &mut [Option<TensorId>],
    ) -> Result<(), M::Error> {
        Ok(())
    }
}

/// Hooks that do nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoHooks;
impl<M: TensorMemory> LayerHooks<M> for NoHooks {}

/// What one forward pass left behind for backward.
#[derive(Debug)]
pub struct Tape {
    saved: Vec<TensorId>,
    ranges: Vec<(u32, u32)>,
    checkpoints: Vec<Vec<TensorId>>,
    loss: Option<TensorId>,
    held: Vec<TensorId>,
    batch: u64,
    scale: f64,
    grad: bool,
    consumed: bool,
}

impl Tape {
    /// The loss tensor (held until the tape is released).
    pub fn loss(&self) -> Option<TensorId> {
        self.loss
    }
    /// Tensors the caller asked to hold (kept outputs).
    pub fn held(&self) -> &[TensorId] {
        &self.held
    }
    /// Number of saved-tensor references still on the tape.
    pub fn saved_count(&self) -> usize {
        self.saved.len() + self.checkpoints.iter().map(Vec::len).sum::<usize>()
    }
    /// Releases everything the tape still references: saved tensors, checkpoints, the loss
    /// and held tensors.
    pub fn release<M: TensorMemory>(mut self, store: &mut TensorStore<M>) {
        self.release_saved(store);
        if let Some(l) = self.loss.take() {
            store.release(l);
        }
        for h in self.held.drain(..) {
            store.release(h);
        }
    }
    /// Releases only the held tensors (the kept outputs), keeping the loss and whatever the
    /// tape still saves: a caller that keeps the step's loss but not its outputs.
    pub fn release_held<M: TensorMemory>(&mut self, store: &mut TensorStore<M>) {
        for h in self.held.drain(..) {
            store.release(h);
        }
    }
    /// Releases the tensors op `op` (an index into the program's ops) saved for backward,
    /// leaving the rest of the tape as it is.
    pub fn release_saved_of<M: TensorMemory>(&mut self, store: &mut TensorStore<M>, op: usize) {
        let Some(&(s, e)) = self.ranges.get(op) else {
            return;
        };
        for k in s..e {
            let t = std::mem::replace(&mut self.saved[k as usize], TAPE_HOLE);
            if t != TAPE_HOLE {
                store.release(t);
            }
        }
        self.ranges[op] = (0, 0);
    }
    fn release_saved<M: TensorMemory>(&mut self, store: &mut TensorStore<M>) {
        for t in self.saved.drain(..) {
            if t != TensorId::HOLE {
                store.release(t);
            }
        }
        for r in self.ranges.iter_mut() {
            *r = (0, 0);
        }
        for c in self.checkpoints.iter_mut() {
            for t in c.drain(..) {
                store.release(t);
            }
        }
    }
}

/// How a forward pass runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GradMode {
    /// Record for backward.
    Train,
    /// `no_grad`: save nothing.
    NoGrad,
}

/// Executes a [`Program`] over a [`TensorStore`].
#[derive(Debug)]
pub struct Graph<'p> {
    program: &'p Program,
    table: Vec<Vec<Saved>>,
    last_use: Vec<u32>,
    compute: Dtype,
    value_bytes: Vec<u64>,
    bytes_for: (u64, f64),
    value_tensor: Vec<Option<TensorId>>,
    grads: Vec<Option<TensorId>>,
    /// Tensors made for [`Program::forward_cache`], released when the pass ends.
    cache: Vec<TensorId>,
    segments: Vec<Segment>,
    boundaries: Vec<Vec<ValueId>>,
    /// Parameter gradients, one slot per parameter of the program.
    pub param_grads: Vec<Option<TensorId>>,
    /// Bytes of each parameter's gradient (set by the caller: dtype, sharding).
    pub param_grad_bytes: Vec<u64>,
    /// Whether [`Graph::forward`] takes over the caller's references to the program inputs
    /// (the batch is moved into the model, as burn's `forward(batch)` does): an input is then
    /// freed at its last use unless an op saved it. Otherwise (PyTorch, the default) the
    /// caller keeps its references and the inputs live until it releases them.
    pub owns_inputs: bool,
    /// Whether cross-entropy's backward runs in two steps (PyTorch: `nll_loss` backward makes
    /// a gradient of the log-probabilities, then `log_softmax` backward the gradient of the
    /// logits while the first is still alive, so two logits-sized tensors exist at once).
    /// Otherwise one logits-sized gradient is made.
    pub cross_entropy_two_step: bool,
    /// Whether the graph's own records ([`Saved::Nodes`]) are host memory beside tensors on
    /// a GPU ([`TensorStore::alloc_host`]) rather than memory of the store's device (a CPU
    /// backend's, where the tensors are host memory too).
    pub records_on_host: bool,
}

impl<'p> Graph<'p> {
    /// A graph over `program` with the saved-tensor `table` and activations in `compute`.
    pub fn new(program: &'p Program, table: &SavedTable, compute: Dtype) -> Graph<'p> {
        let mut table: Vec<Vec<Saved>> = program
            .ops
            .iter()
            .map(|o| table.get(o.kind).to_vec())
            .collect();
        for &(op, s) in &program.extra_saved {
            if let Some(t) = table.get_mut(op as usize) {
                t.push(s);
            }
        }
        let n = program.values.len();
        let mut g = Graph {
            program,
            table,
            last_use: program.last_uses(),
            compute,
            value_bytes: vec![0; n],
            bytes_for: (u64::MAX, 0.0),
            value_tensor: vec![None; n],
            grads: vec![None; n],
            cache: Vec::new(),
            segments: Vec::new(),
            boundaries: Vec::new(),
            param_grads: vec![None; program.params.len()],
            // (a size that does not fit 64 bits is u64::MAX bytes, which no memory holds;
            // `check_sizes` names it)
            param_grad_bytes: program
                .params
                .iter()
                .map(|p| p.elems.saturating_mul(compute.size()))
                .collect(),
            owns_inputs: false,
            cross_entropy_two_step: false,
            records_on_host: false,
        };
        g.set_segments(crate::checkpoint::segments(program, &[]));
        g
    }

    /// Replaces what each op saves, one entry list per op of the program (e.g.
    /// [`crate::checkpoint::burn_balanced_tables`]).
    ///
    /// # Panics
    /// When `tables` does not hold one list per op.
    pub fn set_op_tables(&mut self, tables: Vec<Vec<Saved>>) {
        assert_eq!(tables.len(), self.program.ops.len(), "one table per op");
        self.table = tables;
    }

    /// The program.
    pub fn program(&self) -> &'p Program {
        self.program
    }

    /// Sets the checkpoint segments (see [`crate::checkpoint`]).
    pub fn set_segments(&mut self, segments: Vec<Segment>) {
        self.boundaries = segment_boundaries(self.program, &segments);
        self.segments = segments;
    }

    /// The current segments.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// Bytes of a value for a batch and size factor.
    pub fn value_bytes(&mut self, v: ValueId, batch: u64, scale: f64) -> u64 {
        self.prepare(batch, scale);
        self.value_bytes[v as usize]
    }

    fn prepare(&mut self, batch: u64, scale: f64) {
        if self.bytes_for == (batch, scale) {
            return;
        }
        for (i, v) in self.program.values.iter().enumerate() {
            // a size that does not fit 64 bits is u64::MAX bytes, which no memory holds
            // (`check_sizes` names it)
            self.value_bytes[i] = v
                .checked_elems(batch, scale)
                .and_then(|e| e.checked_mul(self.dtype_size(v.dtype)))
                .unwrap_or(u64::MAX);
        }
        self.bytes_for = (batch, scale);
    }

    /// Bytes per element of a value of `dtype` in this run.
    fn dtype_size(&self, dtype: ValueDtype) -> u64 {
        match dtype {
            ValueDtype::Compute => self.compute.size(),
            ValueDtype::Fixed(d) => d.size(),
        }
    }

    fn saved_bytes(&self, op_index: usize, s: Saved, batch: u64, scale: f64) -> u64 {
        // a size that does not fit 64 bits is u64::MAX bytes, which no memory holds
        // (`check_sizes` names it)
        self.checked_saved_bytes(op_index, s, batch, scale, &self.value_bytes)
            .unwrap_or(u64::MAX)
    }

    /// Bytes of what op `op_index` saves as `s` at `batch` and `scale`, given the bytes of
    /// every value (`value_bytes`); `Err` is the product that does not fit 64 bits.
    fn checked_saved_bytes(
        &self,
        op_index: usize,
        s: Saved,
        batch: u64,
        scale: f64,
        value_bytes: &[u64],
    ) -> Result<u64, String> {
        let p = self.program;
        let op = &p.ops[op_index];
        // `n` things of `k` bytes each
        let times = |n: u64, what: &str, k: u64| {
            n.checked_mul(k)
                .ok_or_else(|| format!("{n} {what} × {k} bytes"))
        };
        let elems_of = |v: ValueId| {
            let info = &p.values[v as usize];
            info.checked_elems(batch, scale).ok_or_else(|| {
                format!(
                    "{} elements per sample × batch {batch}{}",
                    info.per_sample,
                    scale_note(scale)
                )
            })
        };
        // `n` values of `k` bytes per row of the batch (rows at the size factor, rounded)
        let per_row = |n: u8, what: &str, k: u64| {
            let rows = scaled_count(op.rows_per_sample, scale)
                .and_then(|r| r.checked_mul(batch))
                .ok_or_else(|| {
                    format!(
                        "{} rows per sample × batch {batch}{}",
                        op.rows_per_sample,
                        scale_note(scale)
                    )
                })?;
            rows.checked_mul(u64::from(n) * k)
                .ok_or_else(|| format!("{rows} rows × {n} {what} × {k} bytes"))
        };
        Ok(match s {
            Saved::Mask => elems_of(op.output)?,
            // in the output's dtype (the compute dtype unless the program fixes another)
            Saved::FloatMask => value_bytes[op.output as usize],
            Saved::ForParams => value_bytes[op.output as usize],
            Saved::Indices => times(elems_of(op.output)?, "i64 indices", 8)?,
            Saved::IndicesI32 => times(elems_of(op.output)?, "i32 indices", 4)?,
            Saved::InputSized(i) => times(elems_of(op.inputs[i as usize])?, "f32 elements", 4)?,
            Saved::InputCopy(i) => value_bytes[op.inputs[i as usize] as usize],
            Saved::RowStats(n) => per_row(n, "f32 statistics", 4)?,
            Saved::RowIndices(n) => per_row(n, "i64 indices", 8)?,
            Saved::ChannelStats(n) => {
                op.channels.checked_mul(u64::from(n) * 4).ok_or_else(|| {
                    format!("{} channels × {n} f32 statistics × 4 bytes", op.channels)
                })?
            }
            Saved::Nodes(n) => u64::from(n) * crate::op::BURN_NODE_BYTES,
            Saved::ParamCopy { k, n } => match p.params_of(op).get(k as usize) {
                Some(&w) => times(p.params[w as usize].elems, "weight elements", u64::from(n))?,
                None => 0,
            },
            Saved::Input(_) | Saved::Output => 0,
        })
    }

    /// Bytes of value `v` at `batch` and `scale`, or the figures that do not fit 64 bits.
    fn checked_value_bytes(&self, v: ValueId, batch: u64, scale: f64) -> Result<u64, SizeOverflow> {
        let p = self.program;
        let info = &p.values[v as usize];
        let size = self.dtype_size(info.dtype);
        let overflow = |figures: String, count: &str| {
            SizeOverflow(format!(
                "{}: {figures} overflows a 64-bit {count}",
                describe_value(p, v)
            ))
        };
        let per = info.checked_per_sample(scale).ok_or_else(|| {
            overflow(
                format!(
                    "{} elements per sample × size factor {scale}",
                    info.per_sample
                ),
                "element count",
            )
        })?;
        let elems = per
            .checked_mul(batch)
            .and_then(|e| e.checked_add(info.fixed))
            .ok_or_else(|| {
                overflow(
                    format!(
                        "{per} elements per sample × batch {batch}{}",
                        scale_note(scale)
                    ),
                    "element count",
                )
            })?;
        elems.checked_mul(size).ok_or_else(|| {
            overflow(
                format!(
                    "{elems} elements ({per} per sample × batch {batch}{}) × {size} bytes",
                    scale_note(scale)
                ),
                "byte count",
            )
        })
    }

    /// Checks that every size of a run at `batch` samples and size factor `scale` fits 64
    /// bits: each value's elements and bytes (and so its gradient's), what each op's table
    /// entries save for backward, each parameter's gradient. A run whose sizes pass never
    /// overflows in the graph; one whose sizes do not would make such a tensor `u64::MAX`
    /// bytes, which no memory holds: a caller that may meet absurd sizes checks first and
    /// reports the error, which names the tensor and the figures that overflowed.
    pub fn check_sizes(&self, batch: u64, scale: f64) -> Result<(), SizeOverflow> {
        let p = self.program;
        let bytes = (0..p.values.len())
            .map(|v| self.checked_value_bytes(v as ValueId, batch, scale))
            .collect::<Result<Vec<u64>, _>>()?;
        for (i, entries) in self.table.iter().enumerate() {
            for &s in entries {
                self.checked_saved_bytes(i, s, batch, scale, &bytes)
                    .map_err(|figures| {
                        SizeOverflow(format!(
                            "what {} saves for backward ({s:?}): {figures} overflows a 64-bit \
                             byte count",
                            describe_op(p, i)
                        ))
                    })?;
            }
        }
        let size = self.compute.size();
        for param in &p.params {
            if param.elems.checked_mul(size).is_none() {
                return Err(SizeOverflow(format!(
                    "the gradient of parameter `{}`: {} elements × {size} bytes overflows a \
                     64-bit byte count",
                    param.name, param.elems
                )));
            }
        }
        Ok(())
    }

    /// Runs forward. `inputs` are the tensors of [`Program::inputs`] (the caller keeps its
    /// references); `hold` lists values whose tensors the caller wants to keep (returned in
    /// [`Tape::held`]). The loss tensor is kept on the tape.
    #[allow(clippy::too_many_arguments)] // each argument is a distinct knob of one forward pass
    pub fn forward<M: TensorMemory>(
        &mut self,
        store: &mut TensorStore<M>,
        inputs: &[TensorId],
        batch: u64,
        scale: f64,
        mode: GradMode,
        hold: &[ValueId],
        hooks: &mut dyn LayerHooks<M>,
    ) -> Result<Tape, M::Error> {
        self.forward_until(store, inputs, batch, scale, mode, hold, hooks, false)
    }

    /// Runs a recording forward pass that stops before the loss op: the model's output is
    /// computed (and held when listed in `hold`), the loss and what it would save are not.
    /// This is the graph of an output kept without ever being backwarded (burn's analogue of
    /// `retain_graph`: a forward of its own). The returned tape has no loss.
    pub fn forward_without_loss<M: TensorMemory>(
        &mut self,
        store: &mut TensorStore<M>,
        inputs: &[TensorId],
        batch: u64,
        scale: f64,
        hold: &[ValueId],
        hooks: &mut dyn LayerHooks<M>,
    ) -> Result<Tape, M::Error> {
        self.forward_until(
            store,
            inputs,
            batch,
            scale,
            GradMode::Train,
            hold,
            hooks,
            true,
        )
    }

    #[allow(clippy::too_many_arguments)] // forward's knobs plus where to stop
    fn forward_until<M: TensorMemory>(
        &mut self,
        store: &mut TensorStore<M>,
        inputs: &[TensorId],
        batch: u64,
        scale: f64,
        mode: GradMode,
        hold: &[ValueId],
        hooks: &mut dyn LayerHooks<M>,
        skip_loss: bool,
    ) -> Result<Tape, M::Error> {
        self.prepare(batch, scale);
        let p = self.program;
        let mut tape = Tape {
            saved: Vec::new(),
            ranges: vec![(0, 0); p.ops.len()],
            checkpoints: vec![Vec::new(); self.segments.len()],
            loss: None,
            held: Vec::new(),
            batch,
            scale,
            grad: mode == GradMode::Train,
            consumed: false,
        };
        for (&v, &t) in p.inputs.iter().zip(inputs) {
            self.value_tensor[v as usize] = Some(t);
        }
        let result = self.forward_inner(store, &mut tape, mode, hold, hooks, skip_loss);
        // program inputs are the caller's references: forget them without releasing, unless
        // the graph took them over (then a reference still here is released now)
        for &v in &p.inputs {
            if let Some(t) = self.value_tensor[v as usize].take()
                && self.owns_inputs
            {
                store.release(t);
            }
        }
        match result {
            Ok(()) => Ok(tape),
            Err(e) => {
                self.drop_values(store);
                tape.release(store);
                Err(e)
            }
        }
    }

    fn drop_values<M: TensorMemory>(&mut self, store: &mut TensorStore<M>) {
        let inputs = &self.program.inputs;
        for (v, t) in self.value_tensor.iter_mut().enumerate() {
            if let Some(t) = t.take()
                && (self.owns_inputs || !inputs.contains(&(v as ValueId)))
            {
                store.release(t);
            }
        }
        for g in self.grads.iter_mut() {
            if let Some(t) = g.take() {
                store.release(t);
            }
        }
        self.release_cache(store);
    }

    fn forward_inner<M: TensorMemory>(
        &mut self,
        store: &mut TensorStore<M>,
        tape: &mut Tape,
        mode: GradMode,
        hold: &[ValueId],
        hooks: &mut dyn LayerHooks<M>,
        skip_loss: bool,
    ) -> Result<(), M::Error> {
        let p = self.program;
        for si in 0..self.segments.len() {
            let seg = self.segments[si];
            let save = mode == GradMode::Train && !seg.checkpointed;
            if mode == GradMode::Train && seg.checkpointed {
                for &v in &self.boundaries[si] {
                    if let Some(t) = self.value_tensor[v as usize] {
                        store.retain(t);
                        tape.checkpoints[si].push(t);
                    }
                }
            }
            for layer in seg.layers.0..seg.layers.1 {
                hooks.before_layer(store, layer, Pass::Forward)?;
                let (s, e) = p.layers[layer as usize];
                for i in s as usize..e as usize {
                    if skip_loss && Some(p.ops[i].output) == p.loss {
                        // the loss op's inputs were last used here: drop the forward's own
                        // references (held ones stay with the tape)
                        for &v in p.ops[i].input_ids() {
                            if let Some(t) = self.value_tensor[v as usize].take() {
                                if p.inputs.contains(&v) && !self.owns_inputs {
                                    continue;
                                }
                                store.release(t);
                            }
                        }
                        continue;
                    }
                    self.run_op(store, tape, i, save, true)?;
                    let out = p.ops[i].output;
                    if hold.contains(&out)
                        && let Some(t) = self.value_tensor[out as usize]
                    {
                        store.retain(t);
                        tape.held.push(t);
                    }
                }
                hooks.after_layer(store, layer, Pass::Forward, &mut self.param_grads)?;
            }
        }
        if let Some(l) = p.loss {
            tape.loss = self.value_tensor[l as usize].take();
        }
        self.release_cache(store);
        Ok(())
    }

    /// Releases what [`Program::forward_cache`] made during the pass (autocast's cache is
    /// cleared when its region ends).
    fn release_cache<M: TensorMemory>(&mut self, store: &mut TensorStore<M>) {
        for t in self.cache.drain(..) {
            store.release(t);
        }
    }

    /// The program's loss chunks when `op` is the chunked loss (its cross-entropy).
    fn chunks_of(&self, op: &Op) -> Option<LossChunks> {
        let p = self.program;
        p.loss_chunks
            .filter(|_| op.kind == OpKind::CrossEntropy && Some(op.output) == p.loss)
    }

    /// The copy a chunked loss makes of part of its logits while it runs forward (litgpt's
    /// reshape of the last chunk's slice), when the loss is recorded for backward.
    fn chunk_copy<M: TensorMemory>(
        &self,
        store: &mut TensorStore<M>,
        op: &Op,
        save: bool,
    ) -> Result<Option<TensorId>, M::Error> {
        match self.chunks_of(op) {
            Some(c) if save && c.copied > 0 => {
                let logits = self.value_bytes[op.inputs[0] as usize];
                Ok(Some(
                    store.alloc(c.share(logits, c.copied), Category::Temporary)?,
                ))
            }
            _ => Ok(None),
        }
    }

    /// Runs op `i` forward: allocates its output, records its saved tensors when `save`,
    /// and drops forward references of values past their last use (when `release_inputs`).
    fn run_op<M: TensorMemory>(
        &mut self,
        store: &mut TensorStore<M>,
        tape: &mut Tape,
        i: usize,
        save: bool,
        release_inputs: bool,
    ) -> Result<(), M::Error> {
        let p = self.program;
        let op = p.ops[i];
        let (batch, scale) = (tape.batch, tape.scale);
        if !p.forward_cache.is_empty() {
            for &(_, bytes) in p.forward_cache.iter().filter(|c| c.0 == i as u32) {
                let t = store.alloc(bytes, Category::Activation)?;
                self.cache.push(t);
            }
        }
        let out = if op.kind == OpKind::View {
            let t = self.value_tensor[op.inputs[0] as usize].expect("view of a dead value");
            store.retain(t);
            t
        } else {
            store.alloc(self.value_bytes[op.output as usize], Category::Activation)?
        };
        self.value_tensor[op.output as usize] = Some(out);
        let copied = self.chunk_copy(store, &op, save)?;
        // an op whose output needs no gradient is not recorded: it saves nothing
        if save && p.values[op.output as usize].requires_grad {
            let start = tape.saved.len() as u32;
            for k in 0..self.table[i].len() {
                let s = self.table[i][k];
                if !saved_is_needed(p, &op, s) {
                    continue;
                }
                match s {
                    Saved::Input(j) => {
                        if let Some(t) = self.value_tensor[op.inputs[j as usize] as usize] {
                            store.retain(t);
                            tape.saved.push(t);
                        }
                    }
                    Saved::Output => {
                        store.retain(out);
                        tape.saved.push(out);
                    }
                    Saved::Nodes(_) if self.records_on_host => {
                        let b = self.saved_bytes(i, s, batch, scale);
                        tape.saved.push(store.alloc_host(b, Category::Activation));
                    }
                    other => {
                        let b = self.saved_bytes(i, other, batch, scale);
                        let t = store.alloc(b, Category::Activation)?;
                        tape.saved.push(t);
                    }
                }
            }
            tape.ranges[i] = (start, tape.saved.len() as u32);
        }
        if let Some(t) = copied {
            store.release(t);
        }
        if release_inputs {
            for (k, &v) in op.input_ids().iter().enumerate() {
                if op.inputs[..k].contains(&v) {
                    continue;
                }
                if self.last_use[v as usize] == i as u32
                    && (self.owns_inputs || !p.inputs.contains(&v))
                    && let Some(t) = self.value_tensor[v as usize].take()
                {
                    store.release(t);
                }
            }
            if self.last_use[op.output as usize] == u32::MAX
                && Some(op.output) != p.loss
                && let Some(t) = self.value_tensor[op.output as usize].take()
            {
                store.release(t);
            }
        }
        Ok(())
    }

    /// Runs backward from the tape's loss. With `retain_graph`, saved tensors stay on the
    /// tape; otherwise each op's saved tensors are released as soon as its backward is done.
    pub fn backward<M: TensorMemory>(
        &mut self,
        store: &mut TensorStore<M>,
        tape: &mut Tape,
        retain_graph: bool,
        hooks: &mut dyn LayerHooks<M>,
    ) -> Result<(), BackwardError<M::Error>> {
        if !tape.grad {
            return Err(BackwardError::NoGraph);
        }
        if tape.consumed {
            return Err(BackwardError::Consumed);
        }
        let loss = tape.loss.ok_or(BackwardError::NoGraph)?;
        self.prepare(tape.batch, tape.scale);
        let r = self.backward_inner(store, tape, loss, retain_graph, hooks);
        if r.is_err() {
            self.drop_values(store);
        }
        r.map_err(BackwardError::Memory)?;
        if !retain_graph {
            tape.release_saved(store);
            tape.consumed = true;
        }
        Ok(())
    }

    fn backward_inner<M: TensorMemory>(
        &mut self,
        store: &mut TensorStore<M>,
        tape: &mut Tape,
        loss: TensorId,
        retain_graph: bool,
        hooks: &mut dyn LayerHooks<M>,
    ) -> Result<(), M::Error> {
        let p = self.program;
        let lv = p.loss.expect("validated program has a loss");
        let g = store.alloc(store.size(loss), Category::Temporary)?;
        self.grads[lv as usize] = Some(g);
        for si in (0..self.segments.len()).rev() {
            let seg = self.segments[si];
            if seg.checkpointed {
                self.recompute(store, tape, si, hooks)?;
            }
            for layer in (seg.layers.0..seg.layers.1).rev() {
                hooks.before_layer(store, layer, Pass::Backward)?;
                let (s, e) = p.layers[layer as usize];
                for i in (s as usize..e as usize).rev() {
                    self.backward_op(store, tape, i, retain_graph && !seg.checkpointed)?;
                }
                hooks.after_layer(store, layer, Pass::Backward, &mut self.param_grads)?;
            }
            if seg.checkpointed && !retain_graph {
                for t in tape.checkpoints[si].drain(..) {
                    store.release(t);
                }
            }
        }
        for g in self.grads.iter_mut() {
            if let Some(t) = g.take() {
                store.release(t);
            }
        }
        Ok(())
    }

    fn recompute<M: TensorMemory>(
        &mut self,
        store: &mut TensorStore<M>,
        tape: &mut Tape,
        si: usize,
        hooks: &mut dyn LayerHooks<M>,
    ) -> Result<(), M::Error> {
        let p = self.program;
        let seg = self.segments[si];
        for (k, &v) in self.boundaries[si].iter().enumerate() {
            let t = tape.checkpoints[si][k];
            store.retain(t);
            self.value_tensor[v as usize] = Some(t);
        }
        let (start, end) = (
            p.layers[seg.layers.0 as usize].0,
            p.layers[seg.layers.1 as usize - 1].1,
        );
        for layer in seg.layers.0..seg.layers.1 {
            hooks.before_layer(store, layer, Pass::Recompute)?;
            let (s, e) = p.layers[layer as usize];
            for i in s as usize..e as usize {
                self.run_op(store, tape, i, true, true)?;
            }
            hooks.after_layer(store, layer, Pass::Recompute, &mut self.param_grads)?;
        }
        self.release_cache(store);
        // values produced inside the segment and still referenced (the segment's outputs)
        for op in &p.ops[start as usize..end as usize] {
            if let Some(t) = self.value_tensor[op.output as usize].take() {
                store.release(t);
            }
        }
        for &v in &self.boundaries[si] {
            if let Some(t) = self.value_tensor[v as usize].take() {
                store.release(t);
            }
        }
        Ok(())
    }

    fn backward_op<M: TensorMemory>(
        &mut self,
        store: &mut TensorStore<M>,
        tape: &mut Tape,
        i: usize,
        keep_saved: bool,
    ) -> Result<(), M::Error> {
        let p = self.program;
        let op = p.ops[i];
        let gout = self.grads[op.output as usize].take();
        if let Some(gout) = gout {
            // a chunked loss makes its gradients one chunk at a time
            let chunk = self.chunks_of(&op);
            let grad_bytes = |v: ValueId, k: usize| {
                let bytes = self.value_bytes[v as usize];
                match chunk {
                    Some(c) if k == 0 => c.share(bytes, c.positions),
                    _ => bytes,
                }
            };
            // the log-probabilities' gradient, alive while the logits' gradient is made
            let two_step = match op.input_ids().first() {
                Some(&logits) if op.kind == OpKind::CrossEntropy && self.cross_entropy_two_step => {
                    Some(store.alloc(grad_bytes(logits, 0), Category::Temporary)?)
                }
                _ => None,
            };
            for (k, &v) in op.input_ids().iter().enumerate() {
                if !p.values[v as usize].requires_grad {
                    continue;
                }
                if op.kind == OpKind::View && self.grads[v as usize].is_none() {
                    store.retain(gout);
                    self.grads[v as usize] = Some(gout);
                    continue;
                }
                let bytes = grad_bytes(v, k);
                let t = store.alloc(bytes, Category::Temporary)?;
                match self.grads[v as usize] {
                    None => self.grads[v as usize] = Some(t),
                    // accumulate into the existing gradient: the new part is a temporary
                    Some(_) => store.release(t),
                }
            }
            if let Some(t) = two_step {
                store.release(t);
            }
            for &pid in p.params_of(&op) {
                if p.params[pid as usize].frozen {
                    continue;
                }
                let bytes = self.param_grad_bytes[pid as usize];
                // a half-precision gradient first, cast into the parameter's gradient
                let scratch = match p.param_grad_scratch.get(pid as usize) {
                    Some(&b) if b > 0 => Some(store.alloc(b, Category::Temporary)?),
                    _ => None,
                };
                match self.param_grads[pid as usize] {
                    None => {
                        let t = store.alloc(bytes, Category::Gradient)?;
                        self.param_grads[pid as usize] = Some(t);
                    }
                    Some(_) => {
                        let t = store.alloc(bytes, Category::Temporary)?;
                        store.release(t);
                    }
                }
                if let Some(t) = scratch {
                    store.release(t);
                }
            }
            store.release(gout);
        }
        if !keep_saved {
            let (s, e) = tape.ranges[i];
            for k in s..e {
                store.release(tape.saved[k as usize]);
            }
            // mark released so the tape does not release them again
            for k in s..e {
                tape.saved[k as usize] = TAPE_HOLE;
            }
            tape.ranges[i] = (0, 0);
        }
        Ok(())
    }

    /// Releases every parameter gradient (`zero_grad(set_to_none=True)`).
    pub fn drop_param_grads<M: TensorMemory>(&mut self, store: &mut TensorStore<M>) {
        for g in self.param_grads.iter_mut() {
            if let Some(t) = g.take() {
                store.release(t);
            }
        }
    }
}

const TAPE_HOLE: TensorId = TensorId::HOLE;

/// A size of a program run (a tensor's elements or bytes at a batch size) that does not fit
/// 64 bits, named with the tensor and the figures that overflowed ([`Graph::check_sizes`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SizeOverflow(pub String);

/// `" at size factor {scale}"`, or nothing at 1.
fn scale_note(scale: f64) -> String {
    if scale == 1.0 {
        String::new()
    } else {
        format!(" at size factor {scale}")
    }
}

/// Op `i` of `p` in words: its index, kind, first parameter and layer.
fn describe_op(p: &Program, i: usize) -> String {
    let op = &p.ops[i];
    let param = match p.params_of(op).first() {
        Some(&w) => format!(" of `{}`", p.params[w as usize].name),
        None => String::new(),
    };
    match p.layer_names.get(op.layer as usize) {
        Some(layer) => format!("op {i} (`{}`{param}) in layer `{layer}`", op.kind.name()),
        None => format!("op {i} (`{}`{param})", op.kind.name()),
    }
}

/// Value `v` of `p` in words: the program input it is, or the op whose output it is.
fn describe_value(p: &Program, v: ValueId) -> String {
    if let Some(k) = p.inputs.iter().position(|&x| x == v) {
        return format!("input {k} of the program (a batch tensor)");
    }
    match p.ops.iter().position(|o| o.output == v) {
        Some(i) => format!("the output of {}", describe_op(p, i)),
        None => format!("value {v}"),
    }
}

/// Whether `op` keeps `s` for its backward, given which of its operands need gradients
/// (PyTorch saves an operand only for the gradients that read it): the input of a linear
/// layer, convolution or embedding is read only by its weight's gradient, so a layer whose
/// parameters are all frozen does not keep it; each operand of a product is read only by
/// the other operand's gradient; [`Saved::ForParams`] is kept only when a parameter trains.
/// Everything else is kept as the table says.
fn saved_is_needed(p: &Program, op: &crate::program::Op, s: Saved) -> bool {
    let j = match s {
        Saved::Input(j) => j,
        Saved::ForParams => return p.has_trainable_param(op),
        _ => return true,
    };
    match op.kind {
        OpKind::Linear | OpKind::Conv2d | OpKind::Embedding if j == 0 => p.has_trainable_param(op),
        OpKind::Matmul | OpKind::Mul if op.arity == 2 && j < 2 => {
            p.values[op.inputs[1 - j as usize] as usize].requires_grad
        }
        _ => true,
    }
}

/// For each segment, the values its ops read that were not produced inside it (in order of
/// first read, each once): the tensors a checkpointed segment keeps. Linear in the ops and
/// values of the program: each value is stamped with the last segment that produced or
/// listed it, instead of searching what the segment built so far.
pub(crate) fn segment_boundaries(p: &Program, segments: &[Segment]) -> Vec<Vec<ValueId>> {
    const NONE: u32 = u32::MAX;
    let mut produced_in = vec![NONE; p.values.len()];
    let mut listed_in = vec![NONE; p.values.len()];
    let mut out = Vec::with_capacity(segments.len());
    for (si, s) in segments.iter().enumerate() {
        let si = si as u32;
        let start = p.layers.get(s.layers.0 as usize).map_or(0, |l| l.0);
        let end = p.layers.get(s.layers.1 as usize - 1).map_or(0, |l| l.1);
        let mut b: Vec<ValueId> = vec![];
        for op in &p.ops[start as usize..end as usize] {
            for &v in op.input_ids() {
                let v_ix = v as usize;
                if produced_in[v_ix] != si && listed_in[v_ix] != si {
                    listed_in[v_ix] = si;
                    b.push(v);
                }
            }
            produced_in[op.output as usize] = si;
        }
        out.push(b);
    }
    out
}

/// Errors of [`Graph::backward`].
#[derive(Debug, thiserror::Error)]
pub enum BackwardError<E> {
    /// An allocation failed.
    #[error("allocation failed during backward")]
    Memory(E),
    /// The tape was recorded without grad (or has no loss).
    #[error("the forward pass was run without grad: there is no graph to run backward")]
    NoGraph,
    /// Backward already ran on this tape without `retain_graph`.
    #[error("backward already ran on this graph and freed its saved tensors (use retain_graph)")]
    Consumed,
}
