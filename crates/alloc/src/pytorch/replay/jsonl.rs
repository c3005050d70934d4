//! JSON-lines traces: one [`Op`] a line, blank lines and `#` comments skipped.

use std::io::BufRead;

use super::error::ReplayError;
use super::op::{Op, Origin};

/// Parses one line of a JSON-lines trace. Blank lines and lines starting with `#` give `None`.
pub fn parse_line(line: &str, line_no: u64) -> Result<Option<Op>, ReplayError> {
    let text = line.trim();
    if text.is_empty() || text.starts_with('#') {
        return Ok(None);
    }
    serde_json::from_str::<Op>(text)
        .map(Some)
        .map_err(|err| ReplayError::Malformed {
            line: line_no,
            message: strip_position(&err.to_string()).to_string(),
            text: text.chars().take(120).collect(),
            source: err,
        })
}

/// serde_json appends " at line 1 column N", which is about the one-line string, not the file.
fn strip_position(msg: &str) -> &str {
    match msg.rfind(" at line ") {
        Some(at) => &msg[..at],
        None => msg,
    }
}

/// Streams a JSON-lines trace: yields each op with its line number, and counts the bytes read
/// so far (for progress reporting).
pub struct JsonLines<R> {
    reader: R,
    buf: String,
    line_no: u64,
    bytes_read: u64,
}

impl<R: BufRead> JsonLines<R> {
    /// Wraps a buffered reader.
    pub fn new(reader: R) -> Self {
        Self {
            reader,
            buf: String::new(),
            line_no: 0,
            bytes_read: 0,
        }
    }

    /// Bytes consumed so far.
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read
    }
}

impl<R: BufRead> Iterator for JsonLines<R> {
    type Item = Result<(Origin, Op), ReplayError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            self.buf.clear();
            self.line_no += 1;
            let n = match self.reader.read_line(&mut self.buf) {
                Ok(0) => return None,
                Ok(n) => n,
                Err(error) => {
                    return Some(Err(ReplayError::ReadLine {
                        line: self.line_no,
                        error,
                    }));
                }
            };
            self.bytes_read += n as u64;
            match parse_line(&self.buf, self.line_no) {
                Ok(Some(op)) => return Some(Ok((Origin::Line(self.line_no), op))),
                Ok(None) => continue,
                Err(err) => return Some(Err(err)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::label::Label;

    #[test]
    fn parses_the_three_ops() {
        assert_eq!(
            parse_line(r#"{"op":"alloc","id":7,"size":3145728,"stream":2}"#, 1).unwrap(),
            Some(Op::alloc(7, 3145728, 2))
        );
        assert_eq!(
            parse_line(r#"{"op":"alloc","id":7,"size":10}"#, 1).unwrap(),
            Some(Op::alloc(7, 10, 0))
        );
        assert_eq!(
            parse_line(r#"{"op":"alloc","id":7,"size":10,"label":"activation"}"#, 1).unwrap(),
            Some(Op::Alloc {
                id: 7,
                size: 10,
                stream: 0,
                label: Some(Label::from("activation"))
            })
        );
        assert_eq!(
            parse_line(r#" {"op":"free","id":7} "#, 1).unwrap(),
            Some(Op::Free { id: 7 })
        );
        assert_eq!(
            parse_line(r#"{"op":"empty_cache"}"#, 1).unwrap(),
            Some(Op::EmptyCache)
        );
        assert_eq!(parse_line("   ", 1).unwrap(), None);
        assert_eq!(parse_line("# a comment", 1).unwrap(), None);
    }

    #[test]
    fn malformed_lines_name_the_line_and_the_problem() {
        let cases = [
            (r#"{"op":"alloc","id":7}"#, "missing field `size`"),
            (
                r#"{"op":"mallocate","id":7}"#,
                "unknown variant `mallocate`",
            ),
            (r#"{"op":"free","id":-1}"#, "invalid value"),
            (r#"{"op":"free","id":1,"size":3}"#, "unknown field `size`"),
            (r#"{"id":1}"#, "missing field `op`"),
            ("not json", "expected"),
        ];
        for (line, expect) in cases {
            let msg = parse_line(line, 42).unwrap_err().to_string();
            assert!(msg.contains("line 42"), "{msg}");
            assert!(msg.contains(expect), "{line}: {msg}");
        }
    }

    #[test]
    fn streams_lines_with_numbers() {
        let text = "{\"op\":\"alloc\",\"id\":1,\"size\":8}\n\n{\"op\":\"free\",\"id\":1}\n{\"op\":\"empty_cache\"}";
        let mut lines = JsonLines::new(text.as_bytes());
        let got: Vec<_> = lines.by_ref().map(|r| r.unwrap()).collect();
        assert_eq!(
            got,
            vec![
                (Origin::Line(1), Op::alloc(1, 8, 0)),
                (Origin::Line(3), Op::Free { id: 1 }),
                (Origin::Line(4), Op::EmptyCache),
            ]
        );
        assert_eq!(lines.bytes_read(), text.len() as u64);

        let bad = "{\"op\":\"empty_cache\"}\n{\"op\":\"free\"}\n";
        let err = JsonLines::new(bad.as_bytes()).nth(1).unwrap().unwrap_err();
        assert!(err.to_string().contains("line 2"), "{err}");
    }

    proptest::proptest! {
        /// Every op written as a JSON line parses back to itself.
        #[test]
        fn json_lines_round_trip(kind in 0u8..3, id: u64, size: u64, stream: u64, default_stream: bool) {
            let (line, op) = match kind {
                0 if default_stream => (
                    format!("{{\"op\":\"alloc\",\"id\":{id},\"size\":{size}}}"),
                    Op::alloc(id, size, 0),
                ),
                0 => (
                    format!("{{\"size\":{size},\"stream\":{stream},\"op\":\"alloc\",\"id\":{id}}}"),
                    Op::alloc(id, size, stream),
                ),
                1 => (format!("{{\"op\":\"free\",\"id\":{id}}}"), Op::Free { id }),
                _ => ("{\"op\":\"empty_cache\"}".to_string(), Op::EmptyCache),
            };
            proptest::prop_assert_eq!(parse_line(&line, 1).unwrap(), Some(op));
        }
    }
}
