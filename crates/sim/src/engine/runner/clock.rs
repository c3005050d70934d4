//! Where the run is: step, epoch, micro-batch, the phase in progress, and the seeded
//! generator of batch-size variation.

use crate::engine::When;
use trainmem_core::timeline::Phase;

/// Where the run is.
pub(super) struct Clock {
    /// Optimizer step.
    pub(super) step: u64,
    /// Epoch.
    pub(super) epoch: u64,
    /// Micro-batch within the step (with gradient accumulation only).
    pub(super) micro: Option<u32>,
    /// The phase in progress (named by an out-of-memory report).
    pub(super) in_phase: Phase,
    /// State of the batch-size generator.
    rng: u64,
}

impl Clock {
    /// Before the run, with the generator seeded from the plan's seed and the stage.
    pub(super) fn new(seed: u64, stage: u64) -> Clock {
        Clock {
            step: 0,
            epoch: 0,
            micro: None,
            in_phase: Phase::Start,
            rng: seed ^ 0x5EED_0000_0000_0000 ^ stage,
        }
    }

    /// Enters `phase`.
    pub(super) fn begin(&mut self, phase: Phase) {
        self.in_phase = phase;
    }

    /// Where the run is, in `phase`.
    pub(super) fn when(&self, phase: Phase) -> When {
        When {
            step: self.step,
            epoch: self.epoch,
            micro_batch: self.micro,
            phase,
        }
    }

    /// The size factor of the next batch: uniform in `1 ± variation` (1 without variation,
    /// drawing nothing).
    pub(super) fn next_scale(&mut self, variation: f64) -> f64 {
        if variation == 0.0 {
            return 1.0;
        }
        let u = (splitmix(&mut self.rng) >> 11) as f64 / (1u64 << 53) as f64;
        1.0 + variation * (2.0 * u - 1.0)
    }
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
