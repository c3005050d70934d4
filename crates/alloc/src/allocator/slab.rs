//! The block slab: every block's record, addressed by a `u32` index, stored in fixed-size
//! chunks instead of one growing array.
//!
//! One array would be copied whole each time it grows, and past glibc's mmap threshold
//! (32 MiB at most, reached by about 350,000 blocks) every allocator that reaches that size
//! maps fresh pages and faults them in, again for each simulation a process runs (`fit` runs
//! many). Chunks of [`CHUNK`] records stay below the threshold, are never moved, and are
//! reused by the process's heap from one allocator to the next. Indexing costs one extra load
//! from the small array of chunk pointers, which stays in cache, and one bounds check: a chunk
//! is a whole array, so the index within it is masked, not checked. An index past `len()` but
//! inside the last chunk reads a default record instead of panicking; the allocator only
//! indexes records it made.

use std::ops::{Index, IndexMut};

/// Records per chunk (a power of two).
const CHUNK_BITS: u32 = 10;
/// Records per chunk.
pub(super) const CHUNK: usize = 1 << CHUNK_BITS;

/// Records addressed by index, in chunks of [`CHUNK`]. A chunk is made whole, its unused
/// records at their default, so a masked index into it needs no bounds check.
#[derive(Debug)]
pub(super) struct Slab<T> {
    chunks: Vec<Box<[T; CHUNK]>>,
    len: usize,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab {
            chunks: Vec::new(),
            len: 0,
        }
    }
}

impl<T: Default> Slab<T> {
    /// Number of records.
    #[inline]
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Appends a record at index `len()`.
    #[inline]
    pub(super) fn push(&mut self, value: T) {
        if self.len.is_multiple_of(CHUNK) {
            self.chunks.push(new_chunk());
        }
        let i = self.len;
        self.len += 1;
        self[i] = value;
    }

    /// The record at `i`, if there is one.
    #[inline]
    pub(super) fn get(&self, i: usize) -> Option<&T> {
        (i < self.len).then(|| &self[i])
    }

    /// Every record in index order.
    pub(super) fn iter(&self) -> impl Iterator<Item = &T> {
        self.chunks.iter().flat_map(|c| c.iter()).take(self.len)
    }
}

/// A chunk of default records.
fn new_chunk<T: Default>() -> Box<[T; CHUNK]> {
    let records: Box<[T]> = (0..CHUNK).map(|_| T::default()).collect();
    match records.try_into() {
        Ok(chunk) => chunk,
        Err(_) => unreachable!("{CHUNK} records were made"),
    }
}

impl<T> Index<usize> for Slab<T> {
    type Output = T;

    #[inline]
    fn index(&self, i: usize) -> &T {
        &self.chunks[i >> CHUNK_BITS][i & (CHUNK - 1)]
    }
}

impl<T> IndexMut<usize> for Slab<T> {
    #[inline]
    fn index_mut(&mut self, i: usize) -> &mut T {
        &mut self.chunks[i >> CHUNK_BITS][i & (CHUNK - 1)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_keep_their_index_across_chunks() {
        let mut s = Slab::default();
        let n = 3 * CHUNK + 17;
        for i in 0..n {
            s.push(i as u64 * 7);
        }
        assert_eq!(s.len(), n);
        assert_eq!(s.chunks.len(), 4);
        for i in [0, 1, CHUNK - 1, CHUNK, 2 * CHUNK + 5, n - 1] {
            assert_eq!(s[i], i as u64 * 7);
            assert_eq!(s.get(i), Some(&(i as u64 * 7)));
        }
        assert_eq!(s.get(n), None);
        s[CHUNK] = 1;
        assert_eq!(s[CHUNK], 1);
        let all: Vec<u64> = s.iter().copied().collect();
        assert_eq!(all.len(), n);
        assert_eq!(all[CHUNK], 1);
        assert_eq!(all[n - 1], (n as u64 - 1) * 7);
    }
}
