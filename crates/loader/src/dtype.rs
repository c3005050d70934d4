//! The element types a data set may hold: little-endian, fixed-size numbers.

use serde::{Deserialize, Serialize};

/// A little-endian numeric element type, as numpy's `descr` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// `|b1`, one byte, 0 or 1.
    Bool,
    /// `|u1`.
    U8,
    /// `|i1`.
    I8,
    /// `<u2`.
    U16,
    /// `<i2`.
    I16,
    /// `<u4`.
    U32,
    /// `<i4`.
    I32,
    /// `<u8`.
    U64,
    /// `<i8`.
    I64,
    /// `<f2` (IEEE half; raw bytes only, no typed view).
    F16,
    /// `<f4`.
    F32,
    /// `<f8`.
    F64,
}

/// Why a `descr` string is not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DTypeError {
    /// `>` byte order.
    #[error("big-endian dtype {0:?} (only little-endian data can be viewed without a copy)")]
    BigEndian(String),
    /// `O`: Python objects, stored as a pickle.
    #[error("object dtype {0:?} (pickled Python objects cannot be memory-mapped)")]
    Object(String),
    /// Anything else: strings, structured, datetimes, complex...
    #[error(
        "unsupported dtype {0:?} (expected a little-endian number such as '<f4', '<i8', '|u1')"
    )]
    Unsupported(String),
}

impl DType {
    /// Every dtype.
    pub const ALL: [DType; 12] = [
        DType::Bool,
        DType::U8,
        DType::I8,
        DType::U16,
        DType::I16,
        DType::U32,
        DType::I32,
        DType::U64,
        DType::I64,
        DType::F16,
        DType::F32,
        DType::F64,
    ];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::Bool | DType::U8 | DType::I8 => 1,
            DType::U16 | DType::I16 | DType::F16 => 2,
            DType::U32 | DType::I32 | DType::F32 => 4,
            DType::U64 | DType::I64 | DType::F64 => 8,
        }
    }

    /// numpy's `descr` for this type (`'<f4'`, `'|u1'`, ...).
    pub fn descr(self) -> &'static str {
        match self {
            DType::Bool => "|b1",
            DType::U8 => "|u1",
            DType::I8 => "|i1",
            DType::U16 => "<u2",
            DType::I16 => "<i2",
            DType::U32 => "<u4",
            DType::I32 => "<i4",
            DType::U64 => "<u8",
            DType::I64 => "<i8",
            DType::F16 => "<f2",
            DType::F32 => "<f4",
            DType::F64 => "<f8",
        }
    }

    /// A short name (`f32`, `i64`, `bool`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::U8 => "u8",
            DType::I8 => "i8",
            DType::U16 => "u16",
            DType::I16 => "i16",
            DType::U32 => "u32",
            DType::I32 => "i32",
            DType::U64 => "u64",
            DType::I64 => "i64",
            DType::F16 => "f16",
            DType::F32 => "f32",
            DType::F64 => "f64",
        }
    }

    /// Parses a numpy `descr`. One-byte types accept `|`, `<` or `=`; wider ones need `<` (or
    /// `=`, native, on a little-endian machine).
    pub fn from_descr(descr: &str) -> Result<DType, DTypeError> {
        let mut chars = descr.chars();
        let order = chars.next().unwrap_or(' ');
        let code = chars.as_str();
        if code.starts_with('O') || descr == "O" {
            return Err(DTypeError::Object(descr.to_string()));
        }
        let dtype = DType::ALL
            .into_iter()
            .find(|d| &d.descr()[1..] == code)
            .ok_or_else(|| DTypeError::Unsupported(descr.to_string()))?;
        let native_le = cfg!(target_endian = "little");
        match order {
            '<' => Ok(dtype),
            '|' if dtype.size() == 1 => Ok(dtype),
            '=' if native_le || dtype.size() == 1 => Ok(dtype),
            '>' if dtype.size() == 1 => Ok(dtype),
            '>' => Err(DTypeError::BigEndian(descr.to_string())),
            _ => Err(DTypeError::Unsupported(descr.to_string())),
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A Rust type that is the element of a [`DType`], for typed zero-copy views.
pub trait Element: bytemuck::Pod {
    /// The matching dtype.
    const DTYPE: DType;
}

macro_rules! element {
    ($($t:ty => $d:ident),*) => { $(impl Element for $t { const DTYPE: DType = DType::$d; })* };
}
element!(u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, u64 => U64,
         i64 => I64, f32 => F32, f64 => F64);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descr_round_trips() {
        for d in DType::ALL {
            assert_eq!(DType::from_descr(d.descr()), Ok(d));
        }
        assert_eq!(DType::from_descr("<u1"), Ok(DType::U8));
    }

    #[test]
    fn rejects_big_endian_object_and_others() {
        assert!(matches!(
            DType::from_descr(">f4"),
            Err(DTypeError::BigEndian(_))
        ));
        assert!(matches!(
            DType::from_descr("|O"),
            Err(DTypeError::Object(_))
        ));
        for bad in ["<U10", "|S3", "<c8", "<M8[ns]", "", "f4"] {
            assert!(
                matches!(DType::from_descr(bad), Err(DTypeError::Unsupported(_))),
                "{bad}"
            );
        }
    }
}
