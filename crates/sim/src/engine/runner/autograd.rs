//! The autograd side of a runner: the graph over the stage's program with the framework's
//! saved table and checkpointing, the ZeRO layer hooks, and what forward holds beside the
//! loss.

use trainmem_autograd::checkpoint::{self, CheckpointPolicy};
use trainmem_autograd::{GradMode, Graph, LayerHooks, Pass, Tape, TensorId, TensorStore};
use trainmem_core::Category;
use trainmem_core::Dtype;
use trainmem_optim::Sharding;

use super::RunSpec;
use super::blas::Workspaces;
use super::zero::ZeroHooks;
use crate::engine::memory::{SimMemory, SimOom};
use crate::profile::{Checkpointing, RetainGraph};
use trainmem_core::plan::{CheckpointPolicyKind, Plan};

/// The graph, its hooks and what forward holds.
pub(super) struct Autograd<'p> {
    pub(super) graph: Graph<'p>,
    pub(super) hooks: RunHooks,
    /// Values forward keeps beside the loss (the logits), for kept outputs and metrics.
    hold: Vec<u32>,
    /// Backward keeps the saved tensors (`retain_graph`).
    retain_graph: bool,
    /// Checkpointing resolved into segments: blocks per segment, blocks recomputed.
    pub(super) checkpointing: Option<(u32, u32)>,
}

/// The plan's checkpointing policy.
fn policy(plan: &Plan) -> CheckpointPolicy {
    match plan.checkpointing.policy {
        CheckpointPolicyKind::None => CheckpointPolicy::None,
        CheckpointPolicyKind::Every => {
            CheckpointPolicy::Every(plan.checkpointing.every.unwrap_or(1) as u32)
        }
        CheckpointPolicyKind::Sqrt => CheckpointPolicy::Sqrt,
        CheckpointPolicyKind::Budget => {
            CheckpointPolicy::Budget(plan.checkpointing.budget.map_or(0, |b| b.0))
        }
    }
}

impl<'p> Autograd<'p> {
    /// The autograd side of `spec`'s run: gradients in `grad_dtype`, state sharded by
    /// `sharding`.
    pub(super) fn new(spec: &RunSpec<'p>, sharding: Sharding, grad_dtype: Dtype) -> Autograd<'p> {
        let (plan, program, profile) = (spec.plan, spec.program, spec.profile);
        let compute = plan.precision.compute;
        let table = profile.saved_table_on(plan.device.kind);
        let mut graph = Graph::new(program, &table, compute);
        graph.owns_inputs = profile.autograd.forward_owns_batch;
        graph.cross_entropy_two_step = profile.autograd.cross_entropy_two_step;
        // burn-autodiff's graph nodes are host memory: beside tensors on a GPU, not in it
        graph.records_on_host = !spec.cpu;
        let policy = policy(plan);
        let mut checkpointing = None;
        if policy != CheckpointPolicy::None {
            match profile.autograd.checkpointing {
                Checkpointing::Balanced => {
                    graph.set_op_tables(checkpoint::burn_balanced_tables(program, &table));
                }
                Checkpointing::Segments => {
                    let micro = plan.micro_batch_size();
                    let r = checkpoint::resolve(program, policy, &table, compute, micro);
                    checkpointing = Some((r.k, r.recomputed));
                    graph.set_segments(r.segments);
                }
            }
        }
        for (i, p) in program.params.iter().enumerate() {
            graph.param_grad_bytes[i] = p.elems * grad_dtype.size();
        }
        let hold = program
            .ops
            .last()
            .filter(|_| {
                plan.leak.retain_outputs
                    || plan.metrics.keep_outputs
                    || profile.metrics.loop_holds_outputs
            })
            .map(|op| vec![op.inputs[0]])
            .unwrap_or_default();
        Autograd {
            graph,
            hooks: RunHooks {
                zero: ZeroHooks::new(program, sharding, compute, grad_dtype),
                blas: Workspaces::new(plan, profile, program),
            },
            hold,
            retain_graph: plan.leak.retain_graph
                && profile.autograd.retain_graph == RetainGraph::BackwardKeepsSaved,
            checkpointing,
        }
    }

    /// The training forward of a micro-batch of `micro` samples at size factor `scale`.
    pub(super) fn forward(
        &mut self,
        store: &mut TensorStore<SimMemory>,
        inputs: &[TensorId],
        micro: u64,
        scale: f64,
    ) -> Result<Tape, SimOom> {
        self.graph.forward(
            store,
            inputs,
            micro,
            scale,
            GradMode::Train,
            &self.hold,
            &mut self.hooks,
        )
    }

    /// The forward of an output kept with its graph ([`RetainGraph::SeparateForward`]: no
    /// loss; the caller's references to `inputs` are taken over).
    pub(super) fn forward_kept(
        &mut self,
        store: &mut TensorStore<SimMemory>,
        inputs: &[TensorId],
        micro: u64,
        scale: f64,
    ) -> Result<Tape, SimOom> {
        self.graph
            .forward_without_loss(store, inputs, micro, scale, &self.hold, &mut self.hooks)
    }

    /// Backward through `tape` (keeping its saved tensors under `retain_graph`).
    pub(super) fn backward(
        &mut self,
        store: &mut TensorStore<SimMemory>,
        tape: &mut Tape,
    ) -> Result<(), SimOom> {
        match self
            .graph
            .backward(store, tape, self.retain_graph, &mut self.hooks)
        {
            Ok(()) => Ok(()),
            Err(trainmem_autograd::BackwardError::Memory(e)) => Err(e),
            Err(other) => Err(SimOom {
                message: other.to_string(),
                requested: 0,
                category: Category::Other,
            }),
        }
    }

    /// Frees the parameters' gradients.
    pub(super) fn drop_grads(&mut self, store: &mut TensorStore<SimMemory>) {
        self.graph.drop_param_grads(store);
    }

    /// `zero_grad(set_to_none=True)`: frees the parameters' gradients, and the next ones
    /// start full again, not as shards.
    pub(super) fn grads_to_none(&mut self, store: &mut TensorStore<SimMemory>) {
        self.graph.drop_param_grads(store);
        self.hooks.zero.grads_dropped();
    }
}

/// The layer hooks of a run: the BLAS library's workspaces made at its first matmuls, and
/// ZeRO's gathers and reduce-scatters.
pub(super) struct RunHooks {
    pub(super) zero: ZeroHooks,
    pub(super) blas: Workspaces,
}

impl LayerHooks<SimMemory> for RunHooks {
    fn before_layer(
        &mut self,
        store: &mut TensorStore<SimMemory>,
        layer: u32,
        pass: Pass,
    ) -> Result<(), SimOom> {
        self.blas.before_layer(store, layer, pass)?;
        self.zero.before_layer(store, layer, pass)
    }

    fn after_layer(
        &mut self,
        store: &mut TensorStore<SimMemory>,
        layer: u32,
        pass: Pass,
        grads: &mut [Option<TensorId>],
    ) -> Result<(), SimOom> {
        self.zero.after_layer(store, layer, pass, grads)
    }
}
