//! The optimizer a plan names: its algorithm, when its state is created, and how its update
//! is computed. Sizing the state is trainmem-optim's work.

use serde::{Deserialize, Serialize};

/// The optimizer algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OptimizerKind {
    /// Plain stochastic gradient descent: no state.
    Sgd,
    /// SGD with momentum: one velocity buffer.
    Momentum,
    /// Adam: first and second moments.
    Adam,
    /// AdamW (decoupled weight decay): first and second moments.
    #[serde(rename = "adamw")]
    AdamW,
    /// Adafactor (as `transformers` implements it, without a first moment): the second
    /// moment factored into a row and a column vector per matrix parameter, a full-size one
    /// per vector parameter.
    Adafactor,
}

impl OptimizerKind {
    /// The snake_case name.
    pub fn name(self) -> &'static str {
        match self {
            OptimizerKind::Sgd => "sgd",
            OptimizerKind::Momentum => "momentum",
            OptimizerKind::Adam => "adam",
            OptimizerKind::AdamW => "adamw",
            OptimizerKind::Adafactor => "adafactor",
        }
    }

    /// Adam or AdamW.
    pub fn is_adam(self) -> bool {
        matches!(self, OptimizerKind::Adam | OptimizerKind::AdamW)
    }
}

/// When optimizer state is created.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum StateAllocation {
    /// At the first `step` (PyTorch and burn).
    #[default]
    Lazy,
    /// When the optimizer is constructed.
    Eager,
}

/// How the update is computed; sets the step's temporaries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum StepImpl {
    /// One parameter at a time: one parameter-sized scratch buffer live at once.
    #[default]
    ForLoop,
    /// Whole parameter list per kernel: a scratch buffer for every parameter at once.
    Foreach,
    /// A fused kernel: no scratch.
    Fused,
}
