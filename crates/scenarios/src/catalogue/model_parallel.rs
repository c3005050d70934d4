//! `model-parallel` (simulated only): splitting a transformer's layers across pipeline stages
//! divides the parameters, gradients and optimizer state per device (the first device also
//! holds the embedding, the last the head), while 1F1B scheduling leaves earlier stages
//! holding more micro-batches of activations.

use trainmem_core::Category;
use trainmem_core::Plan;
use trainmem_core::timeline::{Source, Timeline};
use trainmem_sim::Summary;

use crate::checks::{param_bytes, peak};
use crate::ctx::{Ctx, Judgement};
use crate::error::{Result, ScenarioError};
use crate::report::{Figure, VerdictKind};

/// Which bytes cause the pattern and what removes it.
pub const EXPLANATION: &[&str] = &[
    "With the layers split across pipeline stages, each device holds only its own layers' \
     parameters, and so only their gradients and optimizer state: with the transformer's \
     repeated blocks split evenly over 4 devices, a middle device holds a quarter of the \
     blocks' model state. The split is not even overall: the token embedding lives on the \
     first device and the output head on the last, and with a large vocabulary each of them is \
     as big as several blocks, so the end devices carry the most model state.",
    "Activations are uneven too. Under a 1F1B schedule the first stage starts as many \
     micro-batches as there are stages before its first backward, the last stage only one, so \
     stage s holds (stages - s) micro-batches of its layers' activations at its peak. A \
     device's peak is its model state plus that many micro-batches' activations.",
    "Knob: `parallel.pipeline_stages = 1` puts every layer on one device, which then holds all \
     of the model state. This scenario is simulated only: a measured burn run trains on one \
     device.",
];

/// Why the runs are simulated only.
const REASON: &str = "a measured burn run trains on one device; pipeline stages are simulated";

/// How the plan's parameters fall into the transformer's repeated blocks and the layers
/// before and after them (embedding; final norm and head).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Layout {
    blocks: u64,
    block_params: u64,
    before: u64,
    after: u64,
}

impl Layout {
    fn of(plan: &Plan) -> Result<Layout> {
        // the module layout of the plan's framework (burn-nn's differs from PyTorch's), as the
        // twin lowers it
        let program = trainmem_sim::lower::lower_for(&plan.model, plan.framework)
            .map_err(ScenarioError::Lower)?;
        let blocks: Vec<usize> = (0..program.checkpointable.len())
            .filter(|&l| program.checkpointable[l])
            .collect();
        let (Some(&first), Some(&last)) = (blocks.first(), blocks.last()) else {
            unsuited!("the model has no repeated blocks to split");
        };
        let mut layout = Layout {
            blocks: blocks.len() as u64,
            block_params: 0,
            before: 0,
            after: 0,
        };
        for p in &program.params {
            let l = p.layer as usize;
            if l < first {
                layout.before += p.elems;
            } else if l > last {
                layout.after += p.elems;
            } else {
                layout.block_params += p.elems;
            }
        }
        Ok(layout)
    }

    fn total(&self) -> u64 {
        self.block_params + self.before + self.after
    }

    /// Parameters expected on stage `s` of `stages` (blocks split evenly).
    fn expected(&self, s: u64, stages: u64) -> u64 {
        let mut n = self.block_params / stages;
        if s == 0 {
            n += self.before;
        }
        if s + 1 == stages {
            n += self.after;
        }
        n
    }
}

/// Whether every stage holds its share of the parameters (within 1%) and they add up to the
/// single device's.
fn split_judgement(stages: &[Summary], single: &Summary, layout: Layout) -> Judgement {
    let n = stages.len() as u64;
    let got: Vec<u64> = stages.iter().map(|s| s.parameters).collect();
    let want: Vec<u64> = (0..n).map(|s| layout.expected(s, n)).collect();
    let sum: u64 = got.iter().sum();
    let each = got
        .iter()
        .zip(&want)
        .all(|(&g, &w)| (g as f64 - w as f64).abs() <= 0.01 * w as f64);
    let ok = n > 1 && each && sum == single.parameters && single.parameters == layout.total();
    Judgement::new(
        ok,
        format!(
            "parameters per stage {got:?}, expected {want:?} (a 1/{n} share of the {} block \
             parameters, plus {} embedding parameters on the first and {} head parameters on \
             the last stage; each within 1%); together {sum} = {} on one device",
            layout.block_params, layout.before, layout.after, single.parameters
        ),
        vec![
            Figure::count("parameters, one device", single.parameters),
            Figure::count(
                "parameters, busiest stage",
                got.iter().copied().max().unwrap_or(0),
            ),
            Figure::count(
                "parameters, lightest stage",
                got.iter().copied().min().unwrap_or(0),
            ),
        ],
    )
}

/// Whether each stage's model state (parameters, gradients, optimizer state) is its parameter
/// share of the single device's (within 2%).
fn state_judgement(stages: &[Summary], single: &Summary) -> Judgement {
    let whole = single.model_state.total();
    let mut worst: f64 = 0.0;
    let mut busiest = 0;
    for s in stages {
        let share = s.parameters as f64 / single.parameters.max(1) as f64;
        let got = s.model_state.total() as f64 / whole.max(1) as f64;
        worst = worst.max((got - share).abs() / share.max(f64::MIN_POSITIVE));
        busiest = busiest.max(s.model_state.total());
    }
    let ok = stages.len() > 1 && worst <= 0.02 && busiest < whole;
    Judgement::new(
        ok,
        format!(
            "model state per stage (parameters + gradients + optimizer state) over the one \
             device's {whole} bytes equals the stage's parameter share within {:.2}% (at most \
             2%); the busiest stage holds {busiest} bytes = {:.3} of it",
            worst * 100.0,
            busiest as f64 / whole.max(1) as f64
        ),
        vec![
            Figure::bytes("model state, one device", whole),
            Figure::bytes("model state, busiest stage", busiest),
            Figure::ratio("busiest / one device", busiest as f64 / whole.max(1) as f64),
        ],
    )
}

/// Two middle stages holding the same layers: under 1F1B their peak activation bytes are in
/// the ratio of the micro-batches each has in flight, (stages - a) / (stages - b).
fn in_flight_judgement(stages: &[Summary], micro_batches: u64) -> Judgement {
    let n = stages.len();
    if n < 4 {
        return Judgement::new(false, "needs at least 4 stages (two middle ones)", vec![]);
    }
    let (a, b) = (&stages[1], &stages[2]);
    let act = |s: &Summary| s.peak_breakdown.get(Category::Activation);
    let (xa, xb) = (act(a), act(b));
    let expected = (n as f64 - 1.0) / (n as f64 - 2.0);
    let ratio = xa as f64 / xb.max(1) as f64;
    let ok = a.parameters == b.parameters
        && micro_batches >= n as u64
        && (ratio / expected - 1.0).abs() <= 0.1;
    Judgement::new(
        ok,
        format!(
            "stages 1 and 2 hold the same layers ({} parameters each); activation bytes at \
             their peaks {xa} and {xb} = {ratio:.3} (1F1B: {} against {} micro-batches in \
             flight = {expected:.3}, within 10%; {micro_batches} micro-batches per step)",
            a.parameters,
            n - 1,
            n - 2
        ),
        vec![
            Figure::bytes("activation at peak, stage 1", xa),
            Figure::bytes("activation at peak, stage 2", xb),
            Figure::ratio("stage 1 / stage 2", ratio),
        ],
    )
}

/// Runs the scenario.
pub fn run(ctx: &mut Ctx) -> Result<()> {
    let plan = ctx.plan("model-parallel")?;
    let n = plan.parallel.pipeline_stages;
    if n < 2 {
        unsuited!("model-parallel needs pipeline_stages > 1 in its plan");
    }
    let layout = Layout::of(&plan)?;
    if layout.blocks % n != 0 {
        unsuited!(
            "model-parallel expects the {} blocks to split evenly over {n} stages",
            layout.blocks
        );
    }
    let micro_batches = plan.accumulation_steps();
    let split = ctx.run_simulated_only(&format!("{n} pipeline stages"), &plan, REASON)?;
    let mut one = plan.clone();
    one.parallel.pipeline_stages = 1;
    let single = ctx.run_simulated_only("one device (knob)", &one, REASON)?;

    let sim = |ctx: &Ctx, i: usize| {
        ctx.record(i)
            .simulated
            .clone()
            .ok_or(ScenarioError::Internal(
                "a simulated-only run has the twin's result",
            ))
    };
    let (split_r, single_r) = (sim(ctx, split)?, sim(ctx, single)?);
    let single_s = single_r.summary.clone();
    ctx.push_verdict(
        VerdictKind::Pattern,
        "each stage holds its layers' parameters: a quarter of the blocks, plus embedding / head",
        Source::Simulated,
        split_judgement(&split_r.stages, &single_s, layout),
    );
    ctx.push_verdict(
        VerdictKind::Pattern,
        "model state per device follows its parameter share",
        Source::Simulated,
        state_judgement(&split_r.stages, &single_s),
    );
    ctx.push_verdict(
        VerdictKind::Pattern,
        "1F1B: earlier stages hold more micro-batches of activations",
        Source::Simulated,
        in_flight_judgement(&split_r.stages, micro_batches),
    );

    // The compared timeline of the split run is its busiest stage's.
    let busiest = split_r.summary.stage;
    let share = layout.expected(busiest, n) as f64 / layout.total() as f64;
    ctx.compare(
        split,
        single,
        VerdictKind::Knob,
        "pipeline_stages = 1: one device holds every layer's state and a higher peak",
        move |s, o| knob_judgement(s, o, busiest, share),
    );
    Ok(())
}

/// The busiest stage's timeline `s` against the single device's `o`: its parameter bytes are
/// its share of the single device's (within 3%: allocator rounding), and its peak is lower.
fn knob_judgement(s: &Timeline, o: &Timeline, stage: u64, share: f64) -> Judgement {
    let (ps, po) = (param_bytes(s), param_bytes(o));
    let ratio = ps as f64 / po.max(1) as f64;
    let ((peak_s, _), (peak_o, _)) = (peak(s, None), peak(o, None));
    let ok = po > 0 && (ratio / share - 1.0).abs() <= 0.03 && peak_s < peak_o;
    Judgement::new(
        ok,
        format!(
            "one device holds {po} parameter bytes against {ps} on the busiest stage ({stage}) = \
             {ratio:.3} (its share {share:.3}, within 3%); peak live bytes {peak_o} on one \
             device against {peak_s} on the busiest stage ({:.3} x)",
            peak_s as f64 / peak_o.max(1) as f64
        ),
        vec![
            Figure::bytes("parameters, one device", po),
            Figure::bytes("parameters, busiest stage", ps),
            Figure::bytes("peak, one device", peak_o),
            Figure::bytes("peak, busiest stage", peak_s),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_splits_blocks_evenly_and_puts_embedding_and_head_at_the_ends() {
        let plan = crate::plans::load("model-parallel").expect("plan");
        let l = Layout::of(&plan).expect("layout");
        assert_eq!(l.blocks, 8);
        assert!(l.before > 0 && l.after > 0);
        let parts: Vec<u64> = (0..4).map(|s| l.expected(s, 4)).collect();
        assert_eq!(parts[1], parts[2]);
        assert_eq!(parts[0] - parts[1], l.before);
        assert_eq!(parts[3] - parts[1], l.after);
        assert_eq!(parts.iter().sum::<u64>(), l.total());
    }
}
