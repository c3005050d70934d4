//! The element types a data set may hold (little-endian, fixed-size numbers): trainmem-core's
//! [`Dtype`], mapped to and from numpy's `descr` strings, and the Rust types that view them.

use trainmem_core::Dtype;

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

/// numpy's `descr` for an element type (`'<f4'`, `'|u1'`, ...); `None` for `bf16`, which
/// numpy has no type for.
pub fn descr(dtype: Dtype) -> Option<&'static str> {
    Some(match dtype {
        Dtype::Bool => "|b1",
        Dtype::U8 => "|u1",
        Dtype::I8 => "|i1",
        Dtype::U16 => "<u2",
        Dtype::I16 => "<i2",
        Dtype::U32 => "<u4",
        Dtype::I32 => "<i4",
        Dtype::U64 => "<u8",
        Dtype::I64 => "<i8",
        Dtype::F16 => "<f2",
        Dtype::F32 => "<f4",
        Dtype::F64 => "<f8",
        Dtype::Bf16 => return None,
    })
}

/// Parses a numpy `descr`. One-byte types accept `|`, `<` or `=`; wider ones need `<` (or
/// `=`, native, on a little-endian machine).
pub fn from_descr(descr: &str) -> Result<Dtype, DTypeError> {
    let mut chars = descr.chars();
    let order = chars.next().unwrap_or(' ');
    let code = chars.as_str();
    if code.starts_with('O') || descr == "O" {
        return Err(DTypeError::Object(descr.to_string()));
    }
    let dtype = Dtype::ALL
        .into_iter()
        .find(|&d| self::descr(d).is_some_and(|x| &x[1..] == code))
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

/// A Rust type that is the element of a [`Dtype`], for typed zero-copy views.
pub trait Element: bytemuck::Pod {
    /// The matching dtype.
    const DTYPE: Dtype;
}

macro_rules! element {
    ($($t:ty => $d:ident),*) => { $(impl Element for $t { const DTYPE: Dtype = Dtype::$d; })* };
}
element!(u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, u64 => U64,
         i64 => I64, f32 => F32, f64 => F64);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descr_round_trips() {
        for d in Dtype::ALL {
            match descr(d) {
                Some(text) => assert_eq!(from_descr(text), Ok(d)),
                None => assert_eq!(d, Dtype::Bf16, "only bf16 lacks a numpy type"),
            }
        }
        assert_eq!(from_descr("<u1"), Ok(Dtype::U8));
    }

    #[test]
    fn rejects_big_endian_object_and_others() {
        assert!(matches!(from_descr(">f4"), Err(DTypeError::BigEndian(_))));
        assert!(matches!(from_descr("|O"), Err(DTypeError::Object(_))));
        for bad in ["<U10", "|S3", "<c8", "<M8[ns]", "", "f4"] {
            assert!(
                matches!(from_descr(bad), Err(DTypeError::Unsupported(_))),
                "{bad}"
            );
        }
    }
}
