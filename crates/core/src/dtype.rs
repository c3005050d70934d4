//! Element types of abstract tensors.

use serde::{Deserialize, Serialize};

/// The element type of a tensor; only its size matters to memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Dtype {
    /// 32-bit float.
    #[default]
    F32,
    /// 16-bit IEEE float.
    F16,
    /// 16-bit brain float.
    Bf16,
    /// 64-bit float.
    F64,
    /// 64-bit integer (token ids, max-pool indices).
    I64,
    /// 32-bit integer.
    I32,
    /// 8-bit unsigned integer (images).
    U8,
    /// Boolean, one byte per element (masks).
    Bool,
}

impl Dtype {
    /// Bytes per element.
    pub fn size(self) -> u64 {
        match self {
            Dtype::F64 | Dtype::I64 => 8,
            Dtype::F32 | Dtype::I32 => 4,
            Dtype::F16 | Dtype::Bf16 => 2,
            Dtype::U8 | Dtype::Bool => 1,
        }
    }

    /// Whether this is a 16-bit float.
    pub fn is_half(self) -> bool {
        matches!(self, Dtype::F16 | Dtype::Bf16)
    }

    /// The snake_case name.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::F16 => "f16",
            Dtype::Bf16 => "bf16",
            Dtype::F64 => "f64",
            Dtype::I64 => "i64",
            Dtype::I32 => "i32",
            Dtype::U8 => "u8",
            Dtype::Bool => "bool",
        }
    }
}

impl std::fmt::Display for Dtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
