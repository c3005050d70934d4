//! What outlives a step: outputs kept with their graphs, metric tensors, old weight
//! buffers kept graphs still reference, and dropped graphs not freed yet.

use trainmem_autograd::{Program, Tape, TensorId, TensorStore};

use crate::engine::memory::SimMemory;
use crate::profile::{DroppedGraphs, FrameworkProfile};
use trainmem_core::plan::{MetricRetention, Plan};

/// Tensors kept across steps.
#[derive(Default)]
pub(super) struct Retention {
    /// Outputs kept with their graphs (`leak.retain_outputs`).
    kept_tapes: Vec<Tape>,
    /// Per-step metric tensors (`metrics.retention = "tensors"`).
    metric_tapes: Vec<Tape>,
    /// Old parameter buffers still referenced by kept graphs, with the layer of the
    /// parameter (the layer whose graph node references them).
    pinned: Vec<(u32, TensorId)>,
    /// Kept graphs dropped by the loop but not yet freed (see [`OrphanedGraphs`]).
    orphans: Vec<OrphanedGraphs>,
}

/// Kept graphs the training loop dropped (`leak.clear_every`) that are not freed yet
/// ([`DroppedGraphs::OneLayerPerBackward`]): each later backward pass frees one more layer
/// of them, from the input side.
#[derive(Debug)]
struct OrphanedGraphs {
    /// The dropped graphs (their held outputs already released).
    tapes: Vec<Tape>,
    /// Old parameter buffers they reference, with the parameter's layer, in layer order
    /// (in the order they were pinned within a layer).
    pinned: Vec<(u32, TensorId)>,
    /// How many of `pinned` are freed already.
    pinned_done: usize,
    /// The next layer a backward pass frees.
    next_layer: u32,
}

impl OrphanedGraphs {
    fn release(self, store: &mut TensorStore<SimMemory>) {
        for t in self.tapes {
            t.release(store);
        }
        for &(_, t) in &self.pinned[self.pinned_done..] {
            store.release(t);
        }
    }
}

impl Retention {
    /// Keeps an output that comes from a forward of its own, with its graph.
    pub(super) fn keep_graph(&mut self, tape: Tape) {
        self.kept_tapes.push(tape);
    }

    /// Keeps old weight buffers (with their parameters' layers) for the kept graphs.
    pub(super) fn pin(&mut self, buffers: Vec<(u32, TensorId)>) {
        self.pinned.extend(buffers);
    }

    /// A micro-batch's tape after its backward: kept with the output (`leak.retain_outputs`,
    /// unless the kept output has a forward of its own), kept as the step's metric tensors
    /// (the loss; the outputs only with `metrics.keep_outputs`), or freed.
    pub(super) fn after_backward(
        &mut self,
        store: &mut TensorStore<SimMemory>,
        mut tape: Tape,
        plan: &Plan,
        profile: &FrameworkProfile,
    ) {
        let kept_separately = profile.kept_graph_is_separate_forward() && plan.leak.retain_graph;
        if plan.leak.retain_outputs && !kept_separately {
            self.kept_tapes.push(tape);
        } else if plan.metrics.retention == MetricRetention::Tensors {
            // the loss is kept per step; the outputs only with `keep_outputs`
            if !plan.metrics.keep_outputs {
                tape.release_held(store);
            }
            self.metric_tapes.push(tape);
        } else {
            tape.release(store);
        }
    }

    /// The loop drops its kept outputs (`leak.clear_every`): their graphs and the weights
    /// they pinned go at once, or (dropped [`DroppedGraphs::OneLayerPerBackward`]) the
    /// outputs' buffers now and their graphs later.
    pub(super) fn clear(&mut self, store: &mut TensorStore<SimMemory>, dropped: DroppedGraphs) {
        match dropped {
            DroppedGraphs::OneLayerPerBackward => {
                let mut tapes: Vec<Tape> = self.kept_tapes.drain(..).collect();
                for t in &mut tapes {
                    t.release_held(store);
                }
                let mut pinned: Vec<(u32, TensorId)> = self.pinned.drain(..).collect();
                // stable: within a layer, buffers are freed in the order they were pinned
                pinned.sort_by_key(|p| p.0);
                if !tapes.is_empty() || !pinned.is_empty() {
                    self.orphans.push(OrphanedGraphs {
                        tapes,
                        pinned,
                        pinned_done: 0,
                        next_layer: 0,
                    });
                }
            }
            DroppedGraphs::Immediately => {
                for t in self.kept_tapes.drain(..) {
                    t.release(store);
                }
                for (_, t) in self.pinned.drain(..) {
                    store.release(t);
                }
            }
        }
    }

    /// After a backward pass: one more layer of every dropped graph is freed (its saved
    /// tensors and the weights pinned by that layer); a graph whose last layer went is gone.
    pub(super) fn free_orphaned_layer(
        &mut self,
        store: &mut TensorStore<SimMemory>,
        program: &Program,
    ) {
        let layers = program.layers.len() as u32;
        let mut left = Vec::with_capacity(self.orphans.len());
        for mut o in std::mem::take(&mut self.orphans) {
            let layer = o.next_layer;
            // the layer's ops only (layers are contiguous op ranges), not every op
            let (start, end) = program.layers[layer as usize];
            for i in start as usize..end as usize {
                for t in &mut o.tapes {
                    t.release_saved_of(store, i);
                }
            }
            // the pinned buffers are in layer order: this layer's lead the rest
            let now = o.pinned[o.pinned_done..]
                .iter()
                .take_while(|p| p.0 == layer)
                .count();
            for &(_, t) in &o.pinned[o.pinned_done..o.pinned_done + now] {
                store.release(t);
            }
            o.pinned_done += now;
            o.next_layer += 1;
            if o.next_layer >= layers {
                o.release(store);
            } else {
                left.push(o);
            }
        }
        self.orphans = left;
    }

    /// Frees everything kept (at teardown): kept outputs, metric tensors, dropped graphs,
    /// pinned weights.
    pub(super) fn release(&mut self, store: &mut TensorStore<SimMemory>) {
        for t in self.kept_tapes.drain(..).chain(self.metric_tapes.drain(..)) {
            t.release(store);
        }
        for o in std::mem::take(&mut self.orphans) {
            o.release(store);
        }
        for (_, t) in self.pinned.drain(..) {
            store.release(t);
        }
    }
}
