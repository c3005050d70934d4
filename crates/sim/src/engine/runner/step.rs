//! One optimizer step: its micro-batches in the stage's 1F1B order, the optimizer step,
//! and what follows it.

use std::collections::VecDeque;

use trainmem_autograd::{Tape, TensorId};

use super::Runner;
use crate::engine::memory::SimOom;

/// A micro-batch whose forward ran and whose backward has not: its tape, its batch, its
/// index within the step.
type Pending = (Tape, Vec<TensorId>, u32);

impl Runner<'_> {
    /// One optimizer step's worth of micro-batches, in the stage's 1F1B order: a stage
    /// runs ahead by as many forwards as stages follow it, then alternates.
    pub(super) fn train_step(&mut self) -> Result<(), SimOom> {
        let m = self.spec.plan.accumulation_steps();
        let in_flight = (self.spec.stages - self.spec.stage).min(m).max(1);
        let mut pending: VecDeque<Pending> = VecDeque::new();
        let mut next_f = 0u64;
        let mut done_b = 0u64;
        // only the first stage reads data
        let samples_per_micro = if self.spec.stages > 1 && self.spec.stage > 0 {
            0
        } else {
            self.spec.plan.micro_batch_size()
        };
        while done_b < m {
            if next_f < m && (pending.len() as u64) < in_flight {
                let mi = next_f as u32;
                self.clock.micro = (m > 1).then_some(mi);
                let (tape, inputs) = self.forward_micro_batch(samples_per_micro)?;
                pending.push_back((tape, inputs, mi));
                next_f += 1;
                continue;
            }
            let (tape, inputs, mi) = pending.pop_front().expect("a forward is pending");
            self.clock.micro = (m > 1).then_some(mi);
            self.backward_micro_batch(tape, inputs)?;
            done_b += 1;
        }
        self.clock.micro = None;
        self.optimizer_step()?;
        self.after_step()?;
        Ok(())
    }
}
