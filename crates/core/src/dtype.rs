//! Element types: the one list of tensor and data-set element types every part of trainmem
//! uses (plans, the simulator, measured runs, the loader's files).

use serde::{Deserialize, Serialize};

/// The element type of a tensor or of a data-set column. Memory depends only on its
/// [`size`](Dtype::size); the loader also maps it to numpy's `descr` strings.
///
/// ```
/// use trainmem_core::Dtype;
/// assert_eq!(Dtype::Bf16.size(), 2);
/// assert_eq!(Dtype::ALL.iter().filter(|d| d.is_half()).count(), 2);
/// assert_eq!("i64".parse::<Dtype>(), Ok(Dtype::I64));
/// ```
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
    /// 64-bit signed integer (token ids, max-pool indices).
    I64,
    /// 32-bit signed integer.
    I32,
    /// 16-bit signed integer.
    I16,
    /// 8-bit signed integer.
    I8,
    /// 64-bit unsigned integer.
    U64,
    /// 32-bit unsigned integer.
    U32,
    /// 16-bit unsigned integer.
    U16,
    /// 8-bit unsigned integer (images).
    U8,
    /// Boolean, one byte per element (masks).
    Bool,
}

impl Dtype {
    /// Every element type.
    pub const ALL: [Dtype; 13] = [
        Dtype::F32,
        Dtype::F16,
        Dtype::Bf16,
        Dtype::F64,
        Dtype::I64,
        Dtype::I32,
        Dtype::I16,
        Dtype::I8,
        Dtype::U64,
        Dtype::U32,
        Dtype::U16,
        Dtype::U8,
        Dtype::Bool,
    ];

    /// Bytes per element.
    pub fn size(self) -> u64 {
        match self {
            Dtype::F64 | Dtype::I64 | Dtype::U64 => 8,
            Dtype::F32 | Dtype::I32 | Dtype::U32 => 4,
            Dtype::F16 | Dtype::Bf16 | Dtype::I16 | Dtype::U16 => 2,
            Dtype::U8 | Dtype::I8 | Dtype::Bool => 1,
        }
    }

    /// Whether this is a floating-point type (f64, f32, f16, bf16).
    pub fn is_float(self) -> bool {
        matches!(self, Dtype::F32 | Dtype::F16 | Dtype::Bf16 | Dtype::F64)
    }

    /// Whether this is a 16-bit float.
    pub fn is_half(self) -> bool {
        matches!(self, Dtype::F16 | Dtype::Bf16)
    }

    /// The snake_case name (`f32`, `bf16`, `i64`, `bool`, ...), as plans write it.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::F16 => "f16",
            Dtype::Bf16 => "bf16",
            Dtype::F64 => "f64",
            Dtype::I64 => "i64",
            Dtype::I32 => "i32",
            Dtype::I16 => "i16",
            Dtype::I8 => "i8",
            Dtype::U64 => "u64",
            Dtype::U32 => "u32",
            Dtype::U16 => "u16",
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

/// A name that is not an element type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown element type `{0}` (known: f32, f16, bf16, f64, i64, i32, i16, i8, u64, u32, u16, u8, bool)"
)]
pub struct UnknownDtype(pub String);

impl std::str::FromStr for Dtype {
    type Err = UnknownDtype;

    fn from_str(s: &str) -> Result<Dtype, UnknownDtype> {
        Dtype::ALL
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| UnknownDtype(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_text_and_serde() {
        for d in Dtype::ALL {
            assert_eq!(d.name().parse::<Dtype>(), Ok(d));
            let json = serde_json::to_string(&d).expect("serialises");
            assert_eq!(json, format!("\"{}\"", d.name()));
            assert_eq!(serde_json::from_str::<Dtype>(&json).expect("parses"), d);
        }
        assert!("float".parse::<Dtype>().is_err());
    }

    #[test]
    fn sizes() {
        let total: u64 = Dtype::ALL.iter().map(|d| d.size()).sum();
        assert_eq!(total, 8 * 3 + 4 * 3 + 2 * 4 + 3);
    }
}
