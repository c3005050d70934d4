//! A naive first-fit allocator over one arena: the baseline with no caching at all.
//!
//! Free ranges are kept in a vector sorted by offset; an allocation takes the front of the first
//! range that is large enough, a free merges the range with its neighbours. There are no
//! segments, no pools and no size classes. Its "reserved" figure is the top of the arena (the
//! end of the highest live block), i.e. the memory a grow-only arena would have to back.

/// Alignment of every block, as on CUDA.
pub const ALIGN: u64 = 256;

/// The first-fit arena.
#[derive(Debug, Clone)]
pub struct FirstFit {
    capacity: u64,
    /// Free ranges `(offset, len)`, sorted by offset, never adjacent (always merged).
    free: Vec<(u64, u64)>,
    allocated: u64,
}

/// A block handed out by [`FirstFit::alloc`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    /// Offset in the arena.
    pub offset: u64,
    /// Length (rounded to [`ALIGN`]).
    pub len: u64,
}

impl FirstFit {
    /// An empty arena of `capacity` bytes.
    pub fn new(capacity: u64) -> Self {
        Self {
            capacity,
            free: vec![(0, capacity)],
            allocated: 0,
        }
    }

    /// Allocates `size` bytes, or `None` when no free range is large enough.
    pub fn alloc(&mut self, size: u64) -> Option<Range> {
        let len = size.max(1).next_multiple_of(ALIGN);
        let index = self.free.iter().position(|&(_, l)| l >= len)?;
        let (offset, free_len) = self.free[index];
        if free_len == len {
            self.free.remove(index);
        } else {
            self.free[index] = (offset + len, free_len - len);
        }
        self.allocated += len;
        Some(Range { offset, len })
    }

    /// Frees a block returned by [`alloc`](Self::alloc).
    pub fn free(&mut self, range: Range) {
        self.allocated -= range.len;
        let index = self.free.partition_point(|&(o, _)| o < range.offset);
        let merges_prev = index > 0 && {
            let (o, l) = self.free[index - 1];
            o + l == range.offset
        };
        let merges_next = index < self.free.len() && range.offset + range.len == self.free[index].0;
        match (merges_prev, merges_next) {
            (true, true) => {
                let next_len = self.free[index].1;
                self.free[index - 1].1 += range.len + next_len;
                self.free.remove(index);
            }
            (true, false) => self.free[index - 1].1 += range.len,
            (false, true) => {
                self.free[index].0 = range.offset;
                self.free[index].1 += range.len;
            }
            (false, false) => self.free.insert(index, (range.offset, range.len)),
        }
    }

    /// Bytes in live blocks (after rounding).
    pub fn allocated(&self) -> u64 {
        self.allocated
    }

    /// End of the highest live block.
    pub fn top(&self) -> u64 {
        match self.free.last() {
            Some(&(o, l)) if o + l == self.capacity => o,
            _ => self.capacity,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_fit_takes_the_lowest_hole_and_merges() {
        let mut a = FirstFit::new(10 * ALIGN);
        let x = a.alloc(ALIGN).unwrap();
        let y = a.alloc(2 * ALIGN).unwrap();
        let z = a.alloc(1).unwrap();
        assert_eq!((x.offset, y.offset, z.offset), (0, ALIGN, 3 * ALIGN));
        assert_eq!(a.top(), 4 * ALIGN);
        a.free(y);
        assert_eq!(a.free.len(), 2);
        // A small request lands in the hole left by y, not at the top.
        let w = a.alloc(ALIGN).unwrap();
        assert_eq!(w.offset, ALIGN);
        a.free(w);
        a.free(x);
        assert_eq!(a.free.len(), 2, "x and y's hole merged");
        a.free(z);
        assert_eq!(a.free.len(), 1);
        assert_eq!(a.top(), 0);
        assert_eq!(a.allocated(), 0);
        assert!(a.alloc(11 * ALIGN).is_none());
        assert_eq!(a.alloc(10 * ALIGN).unwrap().offset, 0);
    }

    proptest::proptest! {
        /// Any sequence of allocations and frees keeps the arena consistent: live blocks never
        /// overlap, free ranges are sorted, disjoint and never adjacent, and live plus free
        /// bytes cover the arena exactly.
        #[test]
        fn arena_invariants(ops in proptest::collection::vec((0u8..3, 1u64..20_000, 0usize..64), 1..300)) {
            let capacity = 1 << 20;
            let mut a = FirstFit::new(capacity);
            let mut live: Vec<Range> = Vec::new();
            for (kind, size, pick) in ops {
                if kind < 2 || live.is_empty() {
                    if let Some(r) = a.alloc(size) {
                        proptest::prop_assert_eq!(r.len, size.next_multiple_of(ALIGN));
                        live.push(r);
                    }
                } else {
                    let r = live.swap_remove(pick % live.len());
                    a.free(r);
                }
                let mut blocks = live.clone();
                blocks.sort_by_key(|r| r.offset);
                for w in blocks.windows(2) {
                    proptest::prop_assert!(w[0].offset + w[0].len <= w[1].offset);
                }
                for w in a.free.windows(2) {
                    proptest::prop_assert!(w[0].0 + w[0].1 < w[1].0);
                }
                let live_bytes: u64 = live.iter().map(|r| r.len).sum();
                let free_bytes: u64 = a.free.iter().map(|f| f.1).sum();
                proptest::prop_assert_eq!(live_bytes, a.allocated());
                proptest::prop_assert_eq!(live_bytes + free_bytes, capacity);
                let top = blocks.last().map_or(0, |r| r.offset + r.len);
                proptest::prop_assert_eq!(a.top(), top);
            }
        }
    }
}
