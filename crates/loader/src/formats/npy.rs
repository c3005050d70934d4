//! The `.npy` header: magic, version, and the Python-literal dict `{'descr', 'fortran_order',
//! 'shape'}`.
//!
//! Versions 1.0 (u16 header length), 2.0 (u32) and 3.0 (u32, UTF-8 header) are accepted. The
//! parser is pure (bytes in, header out) so every malformed case is a unit test.

use crate::dtype::DTypeError;

use trainmem_core::Dtype;

/// The six magic bytes.
pub const MAGIC: &[u8; 6] = b"\x93NUMPY";

/// The largest header accepted (numpy itself refuses headers over 10000 bytes by default).
pub const MAX_HEADER_LEN: usize = 1 << 20;

/// What a header says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NpyHeader {
    /// `(major, minor)` format version.
    pub version: (u8, u8),
    /// Element type.
    pub dtype: Dtype,
    /// Shape; the first axis is the sample axis.
    pub shape: Vec<usize>,
    /// Byte offset of the data from the start of the file.
    pub data_offset: usize,
}

/// A header that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// Fewer bytes than a header needs.
    #[error("truncated header: {0}")]
    Truncated(String),
    /// Not `\x93NUMPY`.
    #[error("not a .npy file (bad magic bytes)")]
    BadMagic,
    /// A format version other than 1, 2 or 3.
    #[error("unsupported .npy format version {0}.{1}")]
    Version(u8, u8),
    /// The header length field is absurd.
    #[error("header length {0} exceeds the {MAX_HEADER_LEN}-byte limit")]
    TooLong(usize),
    /// The dict cannot be parsed or lacks a key.
    #[error("malformed header: {0}")]
    Malformed(String),
    /// The dtype is not accepted.
    #[error(transparent)]
    Dtype(#[from] DTypeError),
    /// Column-major data.
    #[error(
        "Fortran-order (column-major) array: a sample is not contiguous; re-save it in C order (np.ascontiguousarray)"
    )]
    FortranOrder,
    /// A 0-d array.
    #[error("0-dimensional array: no sample axis")]
    NoSampleAxis,
}

/// Bytes of the fixed prefix before the dict for a version: magic, version, length field.
fn prefix_len(major: u8) -> Option<usize> {
    match major {
        1 => Some(10),
        2 | 3 => Some(12),
        _ => None,
    }
}

/// Reads the header length from the first bytes; returns `(prefix, dict length)`, so the caller
/// knows how many bytes to read before calling [`parse_header`].
pub fn header_extent(bytes: &[u8]) -> Result<(usize, usize), HeaderError> {
    if bytes.len() < 8 {
        return Err(HeaderError::Truncated(format!(
            "{} bytes, the magic and version need 8",
            bytes.len()
        )));
    }
    if &bytes[..6] != MAGIC {
        return Err(HeaderError::BadMagic);
    }
    let (major, minor) = (bytes[6], bytes[7]);
    let prefix = prefix_len(major).ok_or(HeaderError::Version(major, minor))?;
    if minor != 0 {
        return Err(HeaderError::Version(major, minor));
    }
    if bytes.len() < prefix {
        return Err(HeaderError::Truncated(format!(
            "{} bytes, the length field ends at {prefix}",
            bytes.len()
        )));
    }
    let len = if major == 1 {
        usize::from(u16::from_le_bytes([bytes[8], bytes[9]]))
    } else {
        u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize
    };
    if len > MAX_HEADER_LEN {
        return Err(HeaderError::TooLong(len));
    }
    Ok((prefix, len))
}

/// Parses a complete header (`bytes` must hold at least the prefix and the dict).
pub fn parse_header(bytes: &[u8]) -> Result<NpyHeader, HeaderError> {
    let (prefix, len) = header_extent(bytes)?;
    let end = prefix + len;
    if bytes.len() < end {
        return Err(HeaderError::Truncated(format!(
            "header says {len} bytes of dict, only {} present",
            bytes.len().saturating_sub(prefix)
        )));
    }
    let raw = &bytes[prefix..end];
    let text: String = if bytes[6] == 3 {
        std::str::from_utf8(raw)
            .map_err(|_| HeaderError::Malformed("header is not UTF-8".into()))?
            .to_string()
    } else {
        // latin-1: every byte is the code point of the same value.
        raw.iter().map(|&b| char::from(b)).collect()
    };
    let dict = parse_dict(&text)?;
    let descr = dict
        .descr
        .ok_or_else(|| HeaderError::Malformed("no 'descr' key".into()))?;
    let fortran = dict
        .fortran
        .ok_or_else(|| HeaderError::Malformed("no 'fortran_order' key".into()))?;
    let shape = dict
        .shape
        .ok_or_else(|| HeaderError::Malformed("no 'shape' key".into()))?;
    let dtype = crate::dtype::from_descr(&descr)?;
    if fortran && shape.len() > 1 {
        return Err(HeaderError::FortranOrder);
    }
    if shape.is_empty() {
        return Err(HeaderError::NoSampleAxis);
    }
    Ok(NpyHeader {
        version: (bytes[6], bytes[7]),
        dtype,
        shape,
        data_offset: end,
    })
}

#[derive(Default)]
struct Dict {
    descr: Option<String>,
    fortran: Option<bool>,
    shape: Option<Vec<usize>>,
}

/// A tiny parser for the dict literal numpy writes.
struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn skip_ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }
    fn peek(&mut self) -> Option<u8> {
        self.skip_ws();
        self.s.get(self.i).copied()
    }
    fn expect(&mut self, c: u8) -> Result<(), HeaderError> {
        if self.peek() == Some(c) {
            self.i += 1;
            Ok(())
        } else {
            Err(self.err(&format!("expected '{}'", char::from(c))))
        }
    }
    fn err(&self, what: &str) -> HeaderError {
        HeaderError::Malformed(format!("{what} at byte {}", self.i))
    }
    fn string(&mut self) -> Result<String, HeaderError> {
        let q = self.peek().ok_or_else(|| self.err("expected a string"))?;
        if q != b'\'' && q != b'"' {
            return Err(self.err("expected a quoted string"));
        }
        self.i += 1;
        let start = self.i;
        while self.i < self.s.len() && self.s[self.i] != q {
            self.i += 1;
        }
        if self.i >= self.s.len() {
            return Err(self.err("unterminated string"));
        }
        let out = String::from_utf8_lossy(&self.s[start..self.i]).into_owned();
        self.i += 1;
        Ok(out)
    }
    fn word(&mut self) -> String {
        self.skip_ws();
        let start = self.i;
        while self.i < self.s.len() && (self.s[self.i].is_ascii_alphanumeric()) {
            self.i += 1;
        }
        String::from_utf8_lossy(&self.s[start..self.i]).into_owned()
    }
    /// The text up to the next `,`, `)`, `}` or whitespace (a dimension as written, whatever
    /// it holds), and the byte it starts at.
    fn item(&mut self) -> (String, usize) {
        self.skip_ws();
        let start = self.i;
        while self.i < self.s.len()
            && !matches!(self.s[self.i], b',' | b')' | b'}')
            && !self.s[self.i].is_ascii_whitespace()
        {
            self.i += 1;
        }
        let text = String::from_utf8_lossy(&self.s[start..self.i]).into_owned();
        (text, start)
    }
    fn shape(&mut self) -> Result<Vec<usize>, HeaderError> {
        self.expect(b'(')?;
        let mut dims = Vec::new();
        loop {
            if self.peek() == Some(b')') {
                self.i += 1;
                return Ok(dims);
            }
            let (w, at) = self.item();
            let digits = w.strip_suffix('L').unwrap_or(&w);
            let d: usize = digits.parse().map_err(|_| {
                let why = if digits.starts_with('-') {
                    "negative dimension"
                } else if digits.is_empty() {
                    "missing dimension"
                } else if digits.bytes().all(|b| b.is_ascii_digit()) {
                    "dimension too large:"
                } else {
                    "bad dimension"
                };
                HeaderError::Malformed(format!("{why} {w:?} in shape at byte {at}"))
            })?;
            dims.push(d);
            match self.peek() {
                Some(b',') => self.i += 1,
                Some(b')') => {}
                _ => return Err(self.err("expected ',' or ')' in shape")),
            }
        }
    }
}

fn parse_dict(text: &str) -> Result<Dict, HeaderError> {
    let mut p = Parser {
        s: text.as_bytes(),
        i: 0,
    };
    let mut dict = Dict::default();
    p.expect(b'{')?;
    loop {
        if p.peek() == Some(b'}') {
            break;
        }
        let key = p.string()?;
        p.expect(b':')?;
        match key.as_str() {
            "descr" => {
                if p.peek() == Some(b'[') {
                    return Err(HeaderError::Dtype(DTypeError::Unsupported(
                        "structured dtype".into(),
                    )));
                }
                dict.descr = Some(p.string()?);
            }
            "fortran_order" => {
                dict.fortran = Some(match p.word().as_str() {
                    "True" => true,
                    "False" => false,
                    other => return Err(p.err(&format!("fortran_order is {other:?}"))),
                })
            }
            "shape" => dict.shape = Some(p.shape()?),
            other => return Err(p.err(&format!("unexpected key {other:?}"))),
        }
        match p.peek() {
            Some(b',') => p.i += 1,
            Some(b'}') => {}
            _ => return Err(p.err("expected ',' or '}'")),
        }
    }
    Ok(dict)
}

/// Builds a complete header (magic to padding) for a C-order array, choosing the oldest version
/// that fits, padded so the data starts at a multiple of 64 bytes. `bf16` has no numpy type
/// and is refused ([`DTypeError::Unsupported`]).
pub fn write_header(dtype: Dtype, shape: &[usize]) -> Result<Vec<u8>, DTypeError> {
    let descr = crate::dtype::descr(dtype)
        .ok_or_else(|| DTypeError::Unsupported(format!("{dtype} (numpy has no such type)")))?;
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    let shape_text = if dims.len() == 1 {
        format!("({},)", dims[0])
    } else {
        format!("({})", dims.join(", "))
    };
    let dict = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}",
        descr, shape_text
    );
    let build = |prefix: usize| {
        let unpadded = prefix + dict.len() + 1;
        let total = unpadded.div_ceil(64) * 64;
        let mut text = dict.clone().into_bytes();
        text.resize(total - prefix - 1, b' ');
        text.push(b'\n');
        text
    };
    let text = build(10);
    let mut out = Vec::with_capacity(text.len() + 12);
    out.extend_from_slice(MAGIC);
    if let Ok(len) = u16::try_from(text.len()) {
        out.extend_from_slice(&[1, 0]);
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&text);
    } else {
        let text = build(12);
        out.extend_from_slice(&[2, 0]);
        out.extend_from_slice(&(text.len() as u32).to_le_bytes());
        out.extend_from_slice(&text);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_dict(major: u8, dict: &str) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&[major, 0]);
        if major == 1 {
            out.extend_from_slice(&(dict.len() as u16).to_le_bytes());
        } else {
            out.extend_from_slice(&(dict.len() as u32).to_le_bytes());
        }
        out.extend_from_slice(dict.as_bytes());
        out
    }

    #[test]
    fn bf16_has_no_numpy_header() {
        assert!(matches!(
            write_header(Dtype::Bf16, &[2]),
            Err(DTypeError::Unsupported(_))
        ));
    }

    #[test]
    fn written_headers_parse_back_aligned() {
        for (dtype, shape) in [
            (Dtype::F32, vec![10, 3]),
            (Dtype::I64, vec![7]),
            (Dtype::U8, vec![0, 2, 2, 2]),
        ] {
            let h = write_header(dtype, &shape).expect("a numpy type");
            assert_eq!(h.len() % 64, 0);
            let parsed = parse_header(&h).expect("parses");
            assert_eq!(parsed.dtype, dtype);
            assert_eq!(parsed.shape, shape);
            assert_eq!(parsed.data_offset, h.len());
            assert_eq!(parsed.version, (1, 0));
        }
    }

    #[test]
    fn versions_two_and_three() {
        let d = "{'descr': '<f8', 'fortran_order': False, 'shape': (4, 5), }\n";
        assert_eq!(parse_header(&with_dict(2, d)).expect("v2").version, (2, 0));
        let d3 = "{\"descr\": \"<i4\", \"fortran_order\": False, \"shape\": (3,)} \u{e9}\n";
        let h = parse_header(&with_dict(3, d3)).expect("v3");
        assert_eq!((h.dtype, h.shape), (Dtype::I32, vec![3]));
        assert!(matches!(
            parse_header(&with_dict(4, d)),
            Err(HeaderError::Version(4, 0))
        ));
    }

    #[test]
    fn rejects_each_bad_header() {
        let ok = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
        assert!(matches!(
            parse_header(b"\x93NUMP"),
            Err(HeaderError::Truncated(_))
        ));
        assert!(matches!(
            parse_header(b"PK\x03\x04zipfile!"),
            Err(HeaderError::BadMagic)
        ));
        let mut cut = with_dict(1, ok);
        cut.truncate(30);
        assert!(matches!(parse_header(&cut), Err(HeaderError::Truncated(_))));
        let fortran = ok.replace("False", "True");
        assert_eq!(
            parse_header(&with_dict(1, &fortran)),
            Err(HeaderError::FortranOrder)
        );
        let be = ok.replace("<f4", ">f4");
        assert!(matches!(
            parse_header(&with_dict(1, &be)),
            Err(HeaderError::Dtype(DTypeError::BigEndian(_)))
        ));
        let obj = ok.replace("<f4", "|O");
        assert!(matches!(
            parse_header(&with_dict(1, &obj)),
            Err(HeaderError::Dtype(DTypeError::Object(_)))
        ));
        let scalar = ok.replace("(2, 3)", "()");
        assert_eq!(
            parse_header(&with_dict(1, &scalar)),
            Err(HeaderError::NoSampleAxis)
        );
        for broken in [
            "{'descr': '<f4', 'shape': (2,)}",
            "{'descr': '<f4', 'fortran_order': Maybe, 'shape': (2,)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (2, x)}",
            "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'extra': 1}",
            "not a dict",
        ] {
            assert!(parse_header(&with_dict(1, broken)).is_err(), "{broken}");
        }
        let mut huge = MAGIC.to_vec();
        huge.extend_from_slice(&[2, 0]);
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(parse_header(&huge), Err(HeaderError::TooLong(_))));
    }

    #[test]
    fn a_bad_dimension_is_quoted_as_written() {
        let with_shape = |shape: &str| {
            let d = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}");
            match parse_header(&with_dict(1, &d)) {
                Err(HeaderError::Malformed(m)) => m,
                other => panic!("{shape}: {other:?}"),
            }
        };
        // The dict text starts at byte 0 of what the parser sees; "(" is at byte 50.
        assert_eq!(
            with_shape("(-5, 4)"),
            "negative dimension \"-5\" in shape at byte 51"
        );
        assert_eq!(
            with_shape("(5, -1)"),
            "negative dimension \"-1\" in shape at byte 54"
        );
        assert_eq!(
            with_shape("(5a, 4)"),
            "bad dimension \"5a\" in shape at byte 51"
        );
        assert_eq!(
            with_shape("(9e9, 4)"),
            "bad dimension \"9e9\" in shape at byte 51"
        );
        assert_eq!(
            with_shape("(5,, 4)"),
            "missing dimension \"\" in shape at byte 53"
        );
        assert_eq!(
            with_shape("(99999999999999999999999,)"),
            "dimension too large: \"99999999999999999999999\" in shape at byte 51"
        );
        // Python 2's long suffix is still read.
        let d = "{'descr': '<f4', 'fortran_order': False, 'shape': (5L, 4L), }";
        assert_eq!(parse_header(&with_dict(1, d)).expect("5L").shape, [5, 4]);
    }

    #[test]
    fn one_dimensional_fortran_is_c_order() {
        let d = "{'descr': '<f4', 'fortran_order': True, 'shape': (5,), }";
        assert!(parse_header(&with_dict(1, d)).is_ok());
    }
}
