//! Allocation traces: JSON lines written by people or tools, and PyTorch memory snapshots.
//!
//! Both formats are turned into the same [`Op`] sequence, each op tagged with the place it came
//! from (a line number, or an entry of a snapshot's `device_traces`) so errors can point at it.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::fmt;
use std::io::BufRead;

use anyhow::{Context, bail};
use serde::Deserialize;
use serde_pickle::{HashableValue, Value};

/// First byte of every pickle of protocol 2 or later (the PROTO opcode).
pub const PICKLE_MAGIC: u8 = 0x80;

/// One allocator operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Op {
    /// Allocate `size` bytes on `stream` and call the block `id`.
    Alloc {
        /// Name of the block, used by a later `free`.
        id: u64,
        /// Requested bytes (unrounded).
        size: u64,
        /// Stream the block is allocated on.
        #[serde(default)]
        stream: u64,
    },
    /// Free the live block `id`.
    Free {
        /// Name the block was given at `alloc`.
        id: u64,
    },
    /// Release every fully free cached segment (`torch.cuda.empty_cache()`).
    EmptyCache,
}

/// Where an op came from, for messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// 1-based line of a JSON-lines trace.
    Line(u64),
    /// 0-based entry of `device_traces[device]` in a snapshot.
    Entry {
        /// Device index.
        device: usize,
        /// Entry index.
        index: usize,
    },
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Line(line) => write!(f, "line {line}"),
            Origin::Entry { device, index } => {
                write!(f, "device_traces[{device}] entry {index}")
            }
        }
    }
}

/// Parses one line of a JSON-lines trace. Blank lines and lines starting with `#` give `None`.
pub fn parse_line(line: &str, line_no: u64) -> anyhow::Result<Option<Op>> {
    let text = line.trim();
    if text.is_empty() || text.starts_with('#') {
        return Ok(None);
    }
    match serde_json::from_str::<Op>(text) {
        Ok(op) => Ok(Some(op)),
        Err(err) => {
            let shown: String = text.chars().take(120).collect();
            bail!(
                "malformed trace at line {line_no}: {}: `{shown}` (expected e.g. \
                 {{\"op\":\"alloc\",\"id\":7,\"size\":3145728,\"stream\":0}}, \
                 {{\"op\":\"free\",\"id\":7}} or {{\"op\":\"empty_cache\"}})",
                strip_position(&err.to_string())
            )
        }
    }
}

/// serde_json appends " at line 1 column N", which is about the one-line string, not the file.
fn strip_position(msg: &str) -> &str {
    match msg.rfind(" at line ") {
        Some(at) => &msg[..at],
        None => msg,
    }
}

/// Streams a JSON-lines trace: yields each op with its line number, and the bytes read so far
/// (for progress reporting).
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
    type Item = anyhow::Result<(Origin, Op)>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            self.buf.clear();
            self.line_no += 1;
            let n = match self.reader.read_line(&mut self.buf) {
                Ok(0) => return None,
                Ok(n) => n,
                Err(err) => {
                    return Some(
                        Err(err).with_context(|| format!("reading line {}", self.line_no)),
                    );
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

/// What a snapshot's trace held besides the ops to replay.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// Number of devices with a trace.
    pub devices: usize,
    /// Entries in the replayed device's trace.
    pub entries: usize,
    /// Which free action was replayed: `free_completed` (preferred) or `free_requested`.
    pub free_action: &'static str,
    /// Frees of addresses whose `alloc` is not in the trace (the trace is a ring buffer, so its
    /// start can be cut off); they are skipped.
    pub frees_of_unknown_blocks: u64,
    /// `oom` entries recorded by PyTorch.
    pub recorded_ooms: u64,
    /// `segment_alloc`/`segment_free`/... entries (not replayed: the allocator makes its own).
    pub segment_entries: u64,
}

/// Reads a PyTorch memory snapshot (`torch.cuda.memory._dump_snapshot`) and turns the trace of
/// one device into ops. Blocks are keyed by address: an `alloc` at an address gets a fresh id,
/// the matching free (at the same address) frees it.
pub fn ops_from_snapshot(
    bytes: &[u8],
    device: usize,
) -> anyhow::Result<(Vec<(Origin, Op)>, SnapshotInfo)> {
    // PyTorch shares frame objects between trace entries (the pickle refers back to them);
    // serde-pickle cannot rebuild such shared values in every place and would fail with
    // "recursive structure found", so they are replaced by None. Only `frames` are shared that
    // way, and replay does not read them.
    let options = serde_pickle::DeOptions::new()
        .replace_unresolved_globals()
        .replace_recursive_structures();
    let value = serde_pickle::value_from_slice(bytes, options)
        .context("the trace starts like a pickle (byte 0x80) but could not be read as one")?;
    let Value::Dict(top) = value else {
        bail!("the pickle is not a memory snapshot: expected a dict with \"device_traces\"");
    };
    let traces = match dict_get(&top, "device_traces") {
        Some(Value::List(list)) => list,
        Some(_) => bail!("\"device_traces\" is not a list"),
        None => bail!(
            "the snapshot has no \"device_traces\": record it with \
             torch.cuda.memory._record_memory_history(enabled=\"all\") before dumping"
        ),
    };
    let mut info = SnapshotInfo {
        devices: traces.len(),
        ..SnapshotInfo::default()
    };
    let entries = match traces.get(device) {
        Some(Value::List(entries)) => entries,
        Some(_) => bail!("device_traces[{device}] is not a list"),
        None => bail!(
            "the snapshot has traces for {} device(s); device {device} is not among them",
            traces.len()
        ),
    };
    info.entries = entries.len();

    let mut parsed = Vec::with_capacity(entries.len());
    let mut has_completed = false;
    for (index, entry) in entries.iter().enumerate() {
        let origin = Origin::Entry { device, index };
        let Value::Dict(map) = entry else {
            bail!("{origin}: not a dict");
        };
        let action = match dict_get(map, "action") {
            Some(Value::String(s)) => s.as_str(),
            _ => bail!("{origin}: no \"action\" string"),
        };
        has_completed |= action == "free_completed";
        parsed.push((origin, action, map));
    }
    let free_action = if has_completed {
        "free_completed"
    } else {
        "free_requested"
    };
    info.free_action = free_action;

    let mut live: HashMap<u64, u64> = HashMap::new();
    let mut next_id = 0u64;
    let mut ops = Vec::new();
    for (origin, action, map) in parsed {
        match action {
            "alloc" => {
                let addr = int_field(map, "addr", origin)?;
                let size = int_field(map, "size", origin)?;
                let stream = match dict_get(map, "stream") {
                    Some(v) => to_u64(v).with_context(|| format!("{origin}: \"stream\""))?,
                    None => 0,
                };
                match live.entry(addr) {
                    Entry::Occupied(_) => {
                        bail!("{origin}: alloc at address {addr:#x}, which is already live")
                    }
                    Entry::Vacant(slot) => {
                        slot.insert(next_id);
                    }
                }
                ops.push((
                    origin,
                    Op::Alloc {
                        id: next_id,
                        size,
                        stream,
                    },
                ));
                next_id += 1;
            }
            a if a == free_action => {
                let addr = int_field(map, "addr", origin)?;
                match live.remove(&addr) {
                    Some(id) => ops.push((origin, Op::Free { id })),
                    None => info.frees_of_unknown_blocks += 1,
                }
            }
            "oom" => info.recorded_ooms += 1,
            a if a.starts_with("segment_") => info.segment_entries += 1,
            _ => {}
        }
    }
    Ok((ops, info))
}

fn dict_get<'a>(
    map: &'a std::collections::BTreeMap<HashableValue, Value>,
    key: &str,
) -> Option<&'a Value> {
    map.get(&HashableValue::String(key.to_owned()))
}

fn int_field(
    map: &std::collections::BTreeMap<HashableValue, Value>,
    key: &str,
    origin: Origin,
) -> anyhow::Result<u64> {
    let value = dict_get(map, key).with_context(|| format!("{origin}: no \"{key}\""))?;
    to_u64(value).with_context(|| format!("{origin}: \"{key}\""))
}

fn to_u64(value: &Value) -> anyhow::Result<u64> {
    match value {
        Value::I64(v) => u64::try_from(*v).context("negative integer"),
        Value::Int(big) => big
            .to_string()
            .parse()
            .context("integer does not fit in 64 bits"),
        Value::Bool(b) => Ok(u64::from(*b)),
        other => bail!("expected an integer, found {other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn parses_the_three_ops() {
        assert_eq!(
            parse_line(r#"{"op":"alloc","id":7,"size":3145728,"stream":2}"#, 1).unwrap(),
            Some(Op::Alloc {
                id: 7,
                size: 3145728,
                stream: 2
            })
        );
        assert_eq!(
            parse_line(r#"{"op":"alloc","id":7,"size":10}"#, 1).unwrap(),
            Some(Op::Alloc {
                id: 7,
                size: 10,
                stream: 0
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
            let msg = format!("{:#}", parse_line(line, 42).unwrap_err());
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
                (
                    Origin::Line(1),
                    Op::Alloc {
                        id: 1,
                        size: 8,
                        stream: 0
                    }
                ),
                (Origin::Line(3), Op::Free { id: 1 }),
                (Origin::Line(4), Op::EmptyCache),
            ]
        );
        assert_eq!(lines.bytes_read(), text.len() as u64);

        let bad = "{\"op\":\"empty_cache\"}\n{\"op\":\"free\"}\n";
        let err = JsonLines::new(bad.as_bytes()).nth(1).unwrap().unwrap_err();
        assert!(format!("{err:#}").contains("line 2"), "{err:#}");
    }

    fn entry(action: &str, addr: i64, size: i64) -> Value {
        let mut map = BTreeMap::new();
        map.insert(
            HashableValue::String("action".into()),
            Value::String(action.into()),
        );
        map.insert(HashableValue::String("addr".into()), Value::I64(addr));
        map.insert(HashableValue::String("size".into()), Value::I64(size));
        map.insert(HashableValue::String("stream".into()), Value::I64(0));
        Value::Dict(map)
    }

    fn snapshot(traces: Vec<Vec<Value>>) -> Vec<u8> {
        let mut top = BTreeMap::new();
        top.insert(
            HashableValue::String("segments".into()),
            Value::List(vec![]),
        );
        top.insert(
            HashableValue::String("device_traces".into()),
            Value::List(traces.into_iter().map(Value::List).collect()),
        );
        serde_pickle::value_to_vec(&Value::Dict(top), serde_pickle::SerOptions::new()).unwrap()
    }

    #[test]
    fn snapshot_is_keyed_by_address() {
        let bytes = snapshot(vec![vec![
            entry("free_completed", 0x999, 64), // alloc cut off by the ring buffer
            entry("segment_alloc", 0x1000, 2 << 20),
            entry("alloc", 0x1000, 100),
            entry("alloc", 0x1200, 300),
            entry("free_requested", 0x1000, 100),
            entry("free_completed", 0x1000, 100),
            entry("alloc", 0x1000, 50), // the address is reused: a new block
            entry("oom", 0, 1 << 40),
        ]]);
        assert_eq!(bytes[0], PICKLE_MAGIC);
        let (ops, info) = ops_from_snapshot(&bytes, 0).unwrap();
        let ops: Vec<Op> = ops.into_iter().map(|(_, op)| op).collect();
        assert_eq!(
            ops,
            vec![
                Op::Alloc {
                    id: 0,
                    size: 100,
                    stream: 0
                },
                Op::Alloc {
                    id: 1,
                    size: 300,
                    stream: 0
                },
                Op::Free { id: 0 },
                Op::Alloc {
                    id: 2,
                    size: 50,
                    stream: 0
                },
            ]
        );
        assert_eq!(info.free_action, "free_completed");
        assert_eq!(info.frees_of_unknown_blocks, 1);
        assert_eq!(info.recorded_ooms, 1);
        assert_eq!(info.segment_entries, 1);
        assert_eq!(info.entries, 8);
    }

    #[test]
    fn snapshot_without_completed_frees_uses_requested() {
        let bytes = snapshot(vec![vec![
            entry("alloc", 0x10, 1),
            entry("free_requested", 0x10, 1),
        ]]);
        let (ops, info) = ops_from_snapshot(&bytes, 0).unwrap();
        assert_eq!(info.free_action, "free_requested");
        assert_eq!(ops.len(), 2);
        assert_eq!(ops[1].1, Op::Free { id: 0 });
    }

    /// A protocol-4 pickle as Python writes it: strings memoized and referred back to, and the
    /// `frames` list shared by both entries (as PyTorch shares frame objects).
    fn python_style_pickle() -> Vec<u8> {
        let mut b = vec![0x80, 0x04, b'}', 0x94, b'('];
        let s = |b: &mut Vec<u8>, text: &str| {
            b.push(0x8c);
            b.push(text.len() as u8);
            b.extend_from_slice(text.as_bytes());
            b.push(0x94);
        };
        s(&mut b, "device_traces"); // memo 1
        b.extend_from_slice(&[b']', 0x94, b']', 0x94, b'(']); // memo 2, 3
        b.extend_from_slice(&[b'}', 0x94, b'(']); // entry 1, memo 4
        s(&mut b, "action"); // 5
        s(&mut b, "alloc"); // 6
        s(&mut b, "addr"); // 7
        b.extend_from_slice(&[b'M', 0x00, 0x10]); // 4096
        s(&mut b, "size"); // 8
        b.extend_from_slice(&[b'K', 100]);
        s(&mut b, "stream"); // 9
        b.extend_from_slice(&[b'K', 0]);
        s(&mut b, "note"); // 10
        s(&mut b, "fwd"); // 11
        s(&mut b, "frames"); // 12
        b.extend_from_slice(&[b']', 0x94, b'(', b'h', 11, b'e']); // frames = ["fwd"], memo 13
        b.push(b'u');
        b.extend_from_slice(&[b'}', 0x94, b'(', b'h', 5]); // entry 2, memo 14
        s(&mut b, "free_completed"); // 15
        b.extend_from_slice(&[
            b'h', 7, b'M', 0x00, 0x10, b'h', 8, b'K', 100, b'h', 9, b'K', 0,
        ]);
        b.extend_from_slice(&[b'h', 12, b'h', 13, b'u']); // the same frames list
        b.extend_from_slice(b"eau."); // APPENDS, APPEND, SETITEMS, STOP
        b
    }

    #[test]
    fn python_pickles_with_shared_frames_replay() {
        let bytes = python_style_pickle();
        // Without replacing the shared values, serde-pickle rejects this pickle.
        assert!(serde_pickle::value_from_slice(&bytes, serde_pickle::DeOptions::new()).is_err());
        let (ops, info) = ops_from_snapshot(&bytes, 0).unwrap();
        let ops: Vec<Op> = ops.into_iter().map(|(_, op)| op).collect();
        assert_eq!(
            ops,
            vec![
                Op::Alloc {
                    id: 0,
                    size: 100,
                    stream: 0
                },
                Op::Free { id: 0 }
            ]
        );
        assert_eq!(info.free_action, "free_completed");
    }

    #[test]
    fn snapshot_errors() {
        let bytes = snapshot(vec![vec![entry("alloc", 0x10, 1)]]);
        assert!(format!("{:#}", ops_from_snapshot(&bytes, 3).unwrap_err()).contains("device 3"));

        let double = snapshot(vec![vec![entry("alloc", 0x10, 1), entry("alloc", 0x10, 1)]]);
        let msg = format!("{:#}", ops_from_snapshot(&double, 0).unwrap_err());
        assert!(
            msg.contains("entry 1") && msg.contains("already live"),
            "{msg}"
        );

        let not_dict =
            serde_pickle::value_to_vec(&Value::List(vec![]), Default::default()).unwrap();
        assert!(ops_from_snapshot(&not_dict, 0).is_err());
        assert!(ops_from_snapshot(&[0x80, 0x03, 0xff], 0).is_err());
    }

    proptest::proptest! {
        /// Every op written as a JSON line parses back to itself.
        #[test]
        fn json_lines_round_trip(kind in 0u8..3, id: u64, size: u64, stream: u64, default_stream: bool) {
            let (line, op) = match kind {
                0 if default_stream => (
                    format!("{{\"op\":\"alloc\",\"id\":{id},\"size\":{size}}}"),
                    Op::Alloc { id, size, stream: 0 },
                ),
                0 => (
                    format!("{{\"size\":{size},\"stream\":{stream},\"op\":\"alloc\",\"id\":{id}}}"),
                    Op::Alloc { id, size, stream },
                ),
                1 => (format!("{{\"op\":\"free\",\"id\":{id}}}"), Op::Free { id }),
                _ => ("{\"op\":\"empty_cache\"}".to_string(), Op::EmptyCache),
            };
            proptest::prop_assert_eq!(parse_line(&line, 1).unwrap(), Some(op));
        }
    }
}
