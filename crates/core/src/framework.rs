//! The framework a run is made with: its autograd decides what forward keeps for backward, its
//! integer type, its bookkeeping.

use serde::{Deserialize, Serialize};

/// The framework whose rules a run follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Framework {
    /// PyTorch eager autograd.
    #[default]
    Pytorch,
    /// burn-autodiff without checkpointing.
    Burn,
}
