//! Categories from phases and lifetimes.
//!
//! An allocation's phase is its own stack's when that names one, else the window it was made
//! in. Then its lifetime decides: made in setup and kept: parameter; moving a batch: input;
//! made in forward and freed in the backward of the same cycle: activation; made in backward
//! and kept past it: gradient; made in an optimizer step and kept past it: optimizer state;
//! made and freed in one window: temporary; in a run that ran out of memory, made in the last
//! cycle's forward and still held: activation (its backward never ran). Blocks live before recording began and never freed
//! are model state: parameters, one per gradient of their size (the gradients made in backward
//! say how many tensors of each size the model has, or, without them, the optimizer state made
//! in the step does, two per parameter when every count is even); what the evidence leaves
//! over of those sizes is the gradients kept between steps and the optimizer state, when the
//! trace made none of its own; the rest is `other` (buffers, frozen weights, kept data).
//! Whole copies of the parameters' sizes that the user's own code makes in setup and keeps
//! beside a model a module's machinery made are optimizer state: state kept per parameter (a
//! gradient estimator's, an optimizer written by hand), not more models.

use std::collections::BTreeMap;

use trainmem_core::Category;

use super::frames::StackPhase;
use super::lifetimes::{Allocation, Lifetimes, Window};

/// How the model state was counted, for the report.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ModelStateEvidence {
    /// Parameter tensors found, by the evidence used.
    pub parameter_tensors: u64,
    /// `gradients`, `optimizer state (k per parameter)` or `none`.
    pub counted_from: String,
    /// Optimizer-state tensors per parameter assumed when the state counted the parameters.
    pub state_per_parameter: Option<u64>,
    /// Gradients kept for leaf tensors that are not parameters (tensors made with
    /// `requires_grad=True` outside any module), over all cycles.
    pub leaf_gradients: u64,
    /// Tensors the user's own code made in setup as whole copies of the parameters' sizes
    /// and kept (a hand-written optimizer's or gradient estimator's state per parameter),
    /// counted as optimizer state, over the trace.
    pub state_made_by_user_code: u64,
}

/// Gives every allocation of `lt` its category, phase and `by_frames`.
pub fn categorize(lt: &mut Lifetimes) -> ModelStateEvidence {
    let windows = lt.windows.clone();
    let has_backward = windows
        .iter()
        .any(|w| w.phase == Some(StackPhase::Backward));
    let has_optimizer = windows
        .iter()
        .any(|w| w.phase == Some(StackPhase::Optimizer));
    let made = categorize_by_phase(lt, &windows);
    if lt.oom_at.is_some() {
        held_for_the_backward_an_oom_stopped(lt, &windows);
    }
    let state_made_by_user_code = state_kept_per_parameter(lt);
    let g = per_size(&made.grads);
    let o = per_size(&made.states);
    let (params, mut evidence) = parameters_counted(&g, &o);
    let shares = ModelStateShares {
        params,
        grads_missing: g.is_empty() && has_backward,
        states_missing: o.is_empty() && has_optimizer,
        k_state: evidence.state_per_parameter.unwrap_or(2),
    };
    let param_total = shares.assign(lt);
    let leaf_gradients = demote_unowned_gradients(lt, &windows, &param_total);
    evidence.parameter_tensors = param_total.values().sum();
    evidence.leaf_gradients = leaf_gradients;
    evidence.state_made_by_user_code = state_made_by_user_code;
    evidence
}

/// A run that ran out of memory stopped inside its last cycle: what that cycle's forward
/// made and still held when the trace ended was waiting for a backward that never ran. Those
/// tensors are activations (saved for backward; the forward's output among them), where a
/// finished trace calls a forward tensor never freed `other`.
fn held_for_the_backward_an_oom_stopped(lt: &mut Lifetimes, windows: &[Window]) {
    let Some(last) = windows.last().map(|w| w.cycle) else {
        return;
    };
    for a in lt.allocations.iter_mut() {
        let in_last_cycle = a
            .alloc_at
            .and_then(|at| windows.get(lt.window_of[at] as usize))
            .is_some_and(|w| w.cycle == last);
        if a.free_at.is_none()
            && in_last_cycle
            && a.phase == Some(StackPhase::Forward)
            && a.category == Category::Other
            && !a.workspace
        {
            a.category = Category::Activation;
        }
    }
}

/// Makes optimizer state the per-parameter state the user's own code keeps: where a module's
/// machinery made the model (tensors kept to the end, at least as many bytes as every other
/// kept setup tensor together) and the user's code made, in setup, whole copies of its sizes
/// (each size `k` times as often, `k` ≥ 1) that it keeps too, those copies are state kept per
/// parameter (a gradient estimator's, an optimizer written by hand), not more models. Every
/// setup tensor of the user's code with a parameter's size becomes optimizer state then.
/// Returns how many.
fn state_kept_per_parameter(lt: &mut Lifetimes) -> u64 {
    let kept = |a: &&Allocation| {
        a.alloc_at.is_some()
            && a.free_at.is_none()
            && !a.workspace
            && a.category == Category::Parameter
    };
    let mut model: BTreeMap<u64, u64> = BTreeMap::new();
    let mut user: BTreeMap<u64, u64> = BTreeMap::new();
    let mut model_bytes = 0u64;
    let mut user_bytes = 0u64;
    for a in lt.allocations.iter().filter(kept) {
        if a.by_module {
            *model.entry(a.size).or_default() += 1;
            model_bytes += a.size;
        } else {
            *user.entry(a.size).or_default() += 1;
            user_bytes += a.size;
        }
    }
    let Some((&size, &n)) = model.iter().next() else {
        return 0;
    };
    let k = user.get(&size).copied().unwrap_or(0) / n;
    let copies = k >= 1
        && model
            .iter()
            .all(|(s, &n)| user.get(s).copied().unwrap_or(0) == k * n);
    // the copies' bytes are k times the model's; what else the user's code keeps is less
    // than the model
    let rest = user_bytes.saturating_sub(k.saturating_mul(model_bytes));
    if !copies || rest >= model_bytes {
        return 0;
    }
    let mut moved = 0;
    for a in lt.allocations.iter_mut() {
        if a.category == Category::Parameter
            && a.alloc_at.is_some()
            && !a.by_module
            && !a.workspace
            && model.contains_key(&a.size)
        {
            a.category = Category::OptimizerState;
            moved += 1;
        }
    }
    moved
}

/// Tensors counted per (cycle, size).
type PerCycle = BTreeMap<(usize, u64), u64>;

/// The phase of window `w`, if any.
fn phase_of_window(windows: &[Window], w: usize) -> Option<StackPhase> {
    windows.get(w).and_then(|w| w.phase)
}

/// Gives each allocation its category from its phase and lifetime.
fn categorize_by_phase(lt: &mut Lifetimes, windows: &[Window]) -> Made {
    let mut made = Made::default();
    let next_forward = next_forward_windows(windows);
    for a in lt.allocations.iter_mut() {
        if a.workspace {
            // a library's scratch buffer, named by its own stack
            a.by_frames = true;
            a.phase = a.alloc_at.and_then(|at| lt.own_phase[at]);
            a.category = Category::Other;
            continue;
        }
        let Some(at) = a.alloc_at else {
            // live before recording began
            a.by_frames = false;
            a.category = freed_preexisting(
                a.free_at
                    .map(|f| phase_of_window(windows, lt.window_of[f] as usize)),
            );
            continue;
        };
        let wa = lt.window_of[at] as usize;
        let own = lt.own_phase[at];
        a.by_frames = own.is_some();
        let phase = own.or(phase_of_window(windows, wa));
        a.phase = phase;
        let freed = a.free_at.map(|f| lt.window_of[f] as usize);
        if own.is_none() && made_for_one_forward(windows, &next_forward, wa, freed) {
            // the user's own code made it between steps (no stack of a module, autograd, an
            // optimizer or a loader) for the next forward pass, which it outlived, and it was
            // gone before the forward after: the batch, made in place (`torch.randint`, a
            // collate function of the user's) rather than moved to the device
            a.phase = Some(StackPhase::Data);
            a.category = Category::Input;
            continue;
        }
        a.category = made.category(phase, windows, wa, freed, a.size);
    }
    made
}

/// For every window, the first forward window at or after it (None: no forward follows).
fn next_forward_windows(windows: &[Window]) -> Vec<Option<usize>> {
    let mut out = vec![None; windows.len() + 1];
    for w in (0..windows.len()).rev() {
        out[w] = if windows[w].phase == Some(StackPhase::Forward) {
            Some(w)
        } else {
            out[w + 1]
        };
    }
    out
}

/// Made in window `wa`, outside forward and backward, and freed in window `freed`, after the
/// next forward window began and before the forward after it: it served one forward pass.
fn made_for_one_forward(
    windows: &[Window],
    next_forward: &[Option<usize>],
    wa: usize,
    freed: Option<usize>,
) -> bool {
    let between_steps = !matches!(
        windows[wa].phase,
        Some(StackPhase::Forward | StackPhase::Backward)
    );
    let (Some(fwd), Some(freed)) = (next_forward[wa], freed) else {
        return false;
    };
    if !between_steps || freed <= fwd {
        return false;
    }
    // a forward that ends only at the window after it is the same forward's continuation
    // (a window of the loss between module calls): the next *other* forward
    let after = (fwd + 1..windows.len()).find(|&w| {
        windows[w].phase == Some(StackPhase::Forward) && windows[w].cycle != windows[fwd].cycle
    });
    after.is_none_or(|next| freed < next)
}

/// The category of a block live before recording began, by the phase that freed it.
fn freed_preexisting(freed_in: Option<Option<StackPhase>>) -> Category {
    match freed_in {
        None => Category::Parameter, // refined below
        Some(Some(StackPhase::Optimizer)) => Category::OptimizerState,
        Some(Some(StackPhase::ZeroGrad)) => Category::Gradient,
        Some(Some(StackPhase::Backward)) => Category::Activation,
        Some(_) => Category::Other,
    }
}

/// Gradient and optimizer-state candidates made, per cycle and size.
#[derive(Default)]
struct Made {
    grads: PerCycle,
    states: PerCycle,
}

impl Made {
    /// The category of an allocation made in window `wa` and freed in window `freed`.
    fn category(
        &mut self,
        phase: Option<StackPhase>,
        windows: &[Window],
        wa: usize,
        freed: Option<usize>,
        size: u64,
    ) -> Category {
        let same_window = freed == Some(wa);
        let same_cycle_phase = |want: &[StackPhase]| {
            freed.is_some_and(|w| {
                windows[w].cycle == windows[wa].cycle
                    && windows[w].phase.is_some_and(|p| want.contains(&p))
            })
        };
        match phase {
            Some(StackPhase::Setup) if same_window => Category::Temporary,
            Some(StackPhase::Setup) => Category::Parameter,
            Some(StackPhase::Data) => Category::Input,
            Some(StackPhase::Forward) => {
                if same_cycle_phase(&[StackPhase::Backward]) {
                    Category::Activation
                } else if same_cycle_phase(&[
                    StackPhase::Forward,
                    StackPhase::Data,
                    StackPhase::Setup,
                ]) {
                    Category::Temporary
                } else {
                    Category::Other
                }
            }
            Some(StackPhase::Backward) => {
                if same_cycle_phase(&[StackPhase::Backward]) {
                    Category::Temporary
                } else {
                    *self.grads.entry((windows[wa].cycle, size)).or_default() += 1;
                    Category::Gradient
                }
            }
            Some(StackPhase::Optimizer) if same_window => Category::Temporary,
            Some(StackPhase::Optimizer) => {
                *self.states.entry((windows[wa].cycle, size)).or_default() += 1;
                Category::OptimizerState
            }
            Some(StackPhase::ZeroGrad) if same_window => Category::Temporary,
            Some(StackPhase::ZeroGrad) => Category::Other,
            // made before any stack named a phase and freed by backward: saved for it
            None if same_cycle_phase(&[StackPhase::Backward]) => Category::Activation,
            None if freed.is_some() => Category::Temporary,
            None => Category::Other,
        }
    }
}

/// Tensors per size: the most any one cycle made.
fn per_size(m: &PerCycle) -> BTreeMap<u64, u64> {
    let mut out: BTreeMap<u64, u64> = BTreeMap::new();
    for (&(_, size), &n) in m {
        let e = out.entry(size).or_default();
        *e = (*e).max(n);
    }
    out
}

/// Parameter tensors per size from the gradients, else the optimizer state, and how.
fn parameters_counted(
    g: &BTreeMap<u64, u64>,
    o: &BTreeMap<u64, u64>,
) -> (BTreeMap<u64, u64>, ModelStateEvidence) {
    if !g.is_empty() {
        (
            g.clone(),
            ModelStateEvidence {
                counted_from: "gradients".into(),
                ..Default::default()
            },
        )
    } else if !o.is_empty() {
        let k = if o.values().all(|n| n.is_multiple_of(2)) {
            2
        } else {
            1
        };
        (
            o.iter().map(|(&s, &n)| (s, n / k)).collect(),
            ModelStateEvidence {
                counted_from: format!("optimizer state ({k} per parameter)"),
                state_per_parameter: Some(k),
                ..Default::default()
            },
        )
    } else {
        (
            BTreeMap::new(),
            ModelStateEvidence {
                counted_from: "none".into(),
                ..Default::default()
            },
        )
    }
}

/// How the blocks live from the start and never freed are shared out as model state.
struct ModelStateShares {
    /// Parameter tensors per size, by the evidence.
    params: BTreeMap<u64, u64>,
    /// The trace ran backward but made no gradient of its own.
    grads_missing: bool,
    /// The trace ran an optimizer step but made no state of its own.
    states_missing: bool,
    /// Optimizer-state tensors per parameter.
    k_state: u64,
}

impl ModelStateShares {
    /// Categorizes the blocks live throughout; returns parameter tensors per size.
    fn assign(&self, lt: &mut Lifetimes) -> BTreeMap<u64, u64> {
        // parameters made in setup count first
        let mut known: BTreeMap<u64, u64> = BTreeMap::new();
        for a in &lt.allocations {
            if a.alloc_at.is_some() && a.category == Category::Parameter {
                *known.entry(a.size).or_default() += 1;
            }
        }
        let mut used: BTreeMap<u64, u64> = BTreeMap::new();
        let mut param_total: BTreeMap<u64, u64> = known.clone();
        for a in lt.allocations.iter_mut() {
            if a.alloc_at.is_some() || a.free_at.is_some() || a.workspace {
                continue;
            }
            if self.params.is_empty() {
                a.category = Category::Parameter;
                *param_total.entry(a.size).or_default() += 1;
                continue;
            }
            let p = self.params.get(&a.size).copied().unwrap_or(0);
            let k = known.get(&a.size).copied().unwrap_or(0);
            let n = used.entry(a.size).or_default();
            let as_param = p.saturating_sub(k);
            let as_grad = if self.grads_missing { p } else { 0 };
            let as_state = if self.states_missing {
                self.k_state * p
            } else {
                0
            };
            a.category = if *n < as_param {
                *param_total.entry(a.size).or_default() += 1;
                Category::Parameter
            } else if *n < as_param + as_grad {
                Category::Gradient
            } else if *n < as_param + as_grad + as_state {
                Category::OptimizerState
            } else {
                Category::Other
            };
            *n += 1;
        }
        param_total
    }
}

/// Makes `other` the gradients no tensor of their size can be the gradient of.
fn demote_unowned_gradients(
    lt: &mut Lifetimes,
    windows: &[Window],
    param_total: &BTreeMap<u64, u64>,
) -> u64 {
    // a gradient needs a tensor of its size to be the gradient of: at most one per parameter,
    // or per other leaf tensor the backward can have differentiated, per cycle
    let mut leaves = Leaves::new(lt);
    let mut per_cycle: PerCycle = BTreeMap::new();
    let mut leaf_gradients = 0;
    let mut demote = Vec::new();
    for (i, a) in lt.allocations.iter().enumerate() {
        if a.category != Category::Gradient {
            continue;
        }
        let Some(at) = a.alloc_at else { continue };
        let cycle = windows[lt.window_of[at] as usize].cycle;
        let n = per_cycle.entry((cycle, a.size)).or_default();
        *n += 1;
        let of_params = param_total.get(&a.size).copied().unwrap_or(0);
        if *n <= of_params {
            continue;
        }
        if *n > of_params + leaves.count(lt, cycle, a.size) {
            demote.push(i);
        } else {
            leaf_gradients += 1;
        }
    }
    for i in demote {
        lt.allocations[i].category = Category::Other;
    }
    leaf_gradients
}

/// Per cycle and size, the tensors a backward of that cycle can have made a gradient for
/// besides the parameters: those made outside a module's forward (a leaf made with
/// `requires_grad=True` by the user's own code, such as the inputs of an attention test, or a
/// batch moved to the device) that are live when its first backward window begins and still
/// live when it ends, and are not model state or a library's scratch buffer. An upper bound:
/// a kept output counts too. A tensor a module's forward made is not one: its gradient (the
/// input embeddings' under PEFT's `enable_input_require_grads`) is not model state. Counted only where a gradient outnumbers
/// the parameters of its size, so the cost stays with the few gradients that need it.
struct Leaves {
    /// The first backward window of each cycle: (start, end).
    backward: BTreeMap<usize, (usize, usize)>,
    /// Candidate allocations by size.
    by_size: BTreeMap<u64, Vec<usize>>,
    counted: BTreeMap<(usize, u64), u64>,
}

impl Leaves {
    fn new(lt: &Lifetimes) -> Leaves {
        let mut backward = BTreeMap::new();
        for w in lt
            .windows
            .iter()
            .filter(|w| w.phase == Some(StackPhase::Backward))
        {
            backward.entry(w.cycle).or_insert((w.start, w.end));
        }
        let mut by_size: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
        for (i, a) in lt.allocations.iter().enumerate() {
            let candidate = !a.workspace
                && a.phase != Some(StackPhase::Forward)
                && matches!(
                    a.category,
                    Category::Other | Category::Input | Category::Temporary
                );
            if candidate {
                by_size.entry(a.size).or_default().push(i);
            }
        }
        Leaves {
            backward,
            by_size,
            counted: BTreeMap::new(),
        }
    }

    fn count(&mut self, lt: &Lifetimes, cycle: usize, size: u64) -> u64 {
        let Some(&(start, end)) = self.backward.get(&cycle) else {
            return 0;
        };
        let by_size = &self.by_size;
        *self.counted.entry((cycle, size)).or_insert_with(|| {
            by_size.get(&size).map_or(0, |v| {
                v.iter()
                    .map(|&i| &lt.allocations[i])
                    .filter(|a| a.alloc_at.is_none_or(|k| k < start))
                    .filter(|a| a.free_at.is_none_or(|f| f >= end))
                    .count() as u64
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kept setup tensor of `size` bytes, made by a module's machinery or by user code.
    fn kept(size: u64, by_module: bool) -> Allocation {
        Allocation {
            addr: 0,
            size,
            alloc_at: Some(0),
            free_at: None,
            stack: 0,
            category: Category::Parameter,
            phase: Some(StackPhase::Setup),
            by_frames: true,
            workspace: false,
            by_module,
        }
    }

    fn categories(allocations: Vec<Allocation>) -> (u64, Vec<Category>) {
        let mut lt = Lifetimes {
            allocations,
            ..Lifetimes::default()
        };
        let moved = state_kept_per_parameter(&mut lt);
        (moved, lt.allocations.iter().map(|a| a.category).collect())
    }

    #[test]
    fn whole_copies_of_the_parameters_made_by_user_code_are_optimizer_state() {
        use Category::{OptimizerState as S, Parameter as P};
        // a model of 100, 100 and 40 bytes; the user's code keeps one tensor per parameter
        // (a gradient estimator's state), and a small tensor of its own
        let model = [kept(100, true), kept(100, true), kept(40, true)];
        let mut a: Vec<Allocation> = model.to_vec();
        a.extend([
            kept(100, false),
            kept(100, false),
            kept(40, false),
            kept(8, false),
        ]);
        assert_eq!(categories(a), (3, vec![P, P, P, S, S, S, P]));
        // two state tensors per parameter (Adam's moments written by hand)
        let mut two: Vec<Allocation> = model.to_vec();
        for _ in 0..2 {
            two.extend([kept(100, false), kept(100, false), kept(40, false)]);
        }
        assert_eq!(categories(two).0, 6);
    }

    #[test]
    fn parameters_made_by_user_code_beside_module_made_ones_stay_parameters() {
        // not a whole copy: one of the two 100-byte sizes only
        let partial = vec![kept(100, true), kept(100, true), kept(100, false)];
        assert_eq!(categories(partial).0, 0);
        // a model built mostly by the user's code (matrices made on the device) with a few
        // module-made norms: the norms' sizes are covered, but the module's tensors are not
        // the model
        let mostly_user = vec![
            kept(16, true),
            kept(16, true),
            kept(16, false),
            kept(16, false),
            kept(4096, false),
            kept(4096, false),
        ];
        assert_eq!(categories(mostly_user).0, 0);
        // nothing made by a module: nothing to tell the model by
        assert_eq!(categories(vec![kept(100, false), kept(100, false)]).0, 0);
    }
}
