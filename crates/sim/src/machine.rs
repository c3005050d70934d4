//! Facts of the machine a run is predicted for.
//!
//! A simulation reads nothing of the machine it runs on: what it needs to know about the
//! target machine comes in here, through [`SimOptions::machine`](crate::SimOptions). A
//! plan's figures therefore depend only on the plan and these facts, and the same plan
//! simulated anywhere with the same facts gives the same timeline.
//!
//! [`Machine::default`] is a documented machine (gemm's defaults). [`Machine::detect`] reads
//! the machine running the code, for callers outside the simulation that predict a run on
//! this very machine (the CLI, and the scenarios, which compare the twin with real runs
//! made here).

use serde::{Deserialize, Serialize};

use crate::engine::kernel_scratch::{DEFAULT_L2_BYTES, gemm_l2_slab_bytes};

/// Facts of the machine a run is predicted for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Machine {
    /// L2 cache bytes the `gemm` crate attributes to one CPU (an L2 shared by two
    /// hyperthreads counts half for each; the rule is in [`crate::engine::kernel_scratch`]).
    /// Default: gemm's own default when it cannot read the cache,
    /// [`DEFAULT_L2_BYTES`] (256 KiB on x86 and x86-64, 512 KiB elsewhere).
    pub l2_bytes_per_cpu: u64,
}

impl Machine {
    /// The documented default machine: gemm's default L2 size ([`DEFAULT_L2_BYTES`]).
    pub const DEFAULT: Machine = Machine {
        l2_bytes_per_cpu: DEFAULT_L2_BYTES,
    };

    /// The machine running this code, as gemm sees it (on Linux from
    /// `/sys/devices/system/cpu`, read once per process; the default elsewhere).
    pub fn detect() -> Machine {
        Machine {
            l2_bytes_per_cpu: gemm_l2_slab_bytes(),
        }
    }

    /// Bytes of gemm's thread-local packing buffer (`L2_SLAB`): one allocation of exactly
    /// the L2 bytes of one CPU, kept for the life of a thread that multiplied matrices.
    pub fn gemm_packing_bytes(&self) -> u64 {
        self.l2_bytes_per_cpu
    }
}

impl Default for Machine {
    fn default() -> Machine {
        Machine::DEFAULT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_is_gemms_default_and_detect_reads_this_machine() {
        assert_eq!(Machine::default().gemm_packing_bytes(), DEFAULT_L2_BYTES);
        assert_eq!(
            Machine::detect().gemm_packing_bytes(),
            crate::engine::kernel_scratch::gemm_l2_slab_bytes()
        );
    }
}
