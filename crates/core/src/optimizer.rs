//! The optimizer a plan names: its algorithm, when its state is created, and how its update
//! is computed. Sizing the state is trainmem-optim's work.

use serde::{Deserialize, Serialize};

/// The optimizer algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
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
    #[cfg_attr(feature = "clap", value(name = "adamw"))]
    AdamW,
    /// Adafactor (as `transformers` implements it, without a first moment): the second
    /// moment factored into a row and a column vector per matrix parameter, a full-size one
    /// per vector parameter.
    Adafactor,
    /// 8-bit AdamW as bitsandbytes implements it (`AdamW8bit`): both moments quantized to one
    /// byte per element with an f32 absolute maximum per block of 256 elements, for
    /// parameters of at least 4096 elements; smaller parameters keep f32 moments. Two
    /// 256-entry f32 quantization maps are shared by every parameter.
    #[serde(rename = "adamw8bit")]
    #[cfg_attr(feature = "clap", value(name = "adamw8bit"))]
    AdamW8bit,
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
            OptimizerKind::AdamW8bit => "adamw8bit",
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
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
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
