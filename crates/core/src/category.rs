//! The categories that every byte in a timeline is named by.

use serde::{Deserialize, Serialize};

/// What a piece of memory is for. The names follow PyTorch's memory timeline so users can map
/// a trainmem report onto what they already know.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    /// Model weights (and f32 master weights under mixed precision).
    Parameter,
    /// Gradients of the parameters.
    Gradient,
    /// Optimizer state: momentum buffers, Adam moments.
    OptimizerState,
    /// Tensors saved by forward for backward.
    Activation,
    /// Batches in flight: loader queues, reorder buffers, worker scratch, staging.
    Input,
    /// Short-lived scratch inside an op or a step.
    Temporary,
    /// Memory reserved by a caching allocator but not allocated to any tensor.
    Cache,
    /// Everything else.
    Other,
}

impl Category {
    /// Every category, in display order.
    pub const ALL: [Category; 8] = [
        Category::Parameter,
        Category::Gradient,
        Category::OptimizerState,
        Category::Activation,
        Category::Input,
        Category::Temporary,
        Category::Cache,
        Category::Other,
    ];

    /// The snake_case name used in reports and exports.
    pub fn name(self) -> &'static str {
        match self {
            Category::Parameter => "parameter",
            Category::Gradient => "gradient",
            Category::OptimizerState => "optimizer_state",
            Category::Activation => "activation",
            Category::Input => "input",
            Category::Temporary => "temporary",
            Category::Cache => "cache",
            Category::Other => "other",
        }
    }

    /// A dense index in `0..Category::ALL.len()`, for per-category arrays.
    pub fn index(self) -> usize {
        self as usize
    }

    /// Parses a snake_case name as written by [`Category::name`].
    pub fn from_name(name: &str) -> Option<Category> {
        Category::ALL.into_iter().find(|c| c.name() == name)
    }
}

impl std::fmt::Display for Category {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_indices_are_dense() {
        for (i, c) in Category::ALL.into_iter().enumerate() {
            assert_eq!(c.index(), i);
            assert_eq!(Category::from_name(c.name()), Some(c));
        }
        assert_eq!(Category::from_name("weights"), None);
    }
}
