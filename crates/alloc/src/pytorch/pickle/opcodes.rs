//! The pickle opcodes pytorch.org/memory_viz's own unpickler (in MemoryViz.js) accepts, and a
//! walker that finds the first one it would reject.

/// Opcodes memory_viz's unpickler accepts.
pub const VIEWER_OPCODES: &[u8] = &[
    0x80, // PROTO
    0x95, // FRAME
    b'(', // MARK
    b'.', // STOP
    b'}', // EMPTY_DICT
    b']', // EMPTY_LIST
    b')', // EMPTY_TUPLE
    b'd', // DICT
    b'l', // LIST
    b't', // TUPLE
    0x85, 0x86, 0x87, // TUPLE1-3
    b's', b'u', // SETITEM(S)
    b'a', b'e', // APPEND(S)
    b'J', b'K', b'M', // BININT, BININT1, BININT2
    0x8a, // LONG1
    b'G', // BINFLOAT
    b'X', 0x8c, // BINUNICODE, SHORT_BINUNICODE
    b'N', // NONE
    0x88, 0x89, // NEWTRUE, NEWFALSE
    0x94, // MEMOIZE
    b'q', b'r', // BINPUT, LONG_BINPUT
    b'h', b'j', // BINGET, LONG_BINGET
];

/// Walks a pickle's opcodes and returns the position and value of the first one the viewer
/// would reject, if any.
pub fn first_unsupported_opcode(data: &[u8]) -> Option<(usize, u8)> {
    let mut p = 0usize;
    while p < data.len() {
        let op = data[p];
        if !VIEWER_OPCODES.contains(&op) {
            return Some((p, op));
        }
        let le = |n: usize| -> usize {
            let mut v = 0usize;
            for k in 0..n {
                v |= (data.get(p + 1 + k).copied().unwrap_or(0) as usize) << (8 * k);
            }
            v
        };
        p += 1 + match op {
            0x80 => 1,
            0x95 => 8,
            b'J' => 4,
            b'K' => 1,
            b'M' => 2,
            0x8a => 1 + le(1),
            b'G' => 8,
            b'X' => 4 + le(4),
            0x8c => 1 + le(1),
            b'q' | b'h' => 1,
            b'r' | b'j' => 4,
            b'.' => return None,
            _ => 0,
        };
    }
    None
}
