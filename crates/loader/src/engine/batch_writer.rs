//! [`BatchWriter`]: fills a batch buffer front to back in one pass — copied rows, runs of one
//! byte (an attention mask), a repeated element (padding, separators) — so a collate writes
//! every byte of its output once, with no zeroing first.

use std::sync::Arc;

use crate::engine::staging::{BatchBuffer, StagingPool};

/// A batch buffer being written front to back: the bytes before the cursor are written, the
/// rest not yet (so the buffer is only handed out by [`BatchWriter::finish`], which zeroes
/// whatever the collate left unwritten). Taken from the loader's pool like every batch
/// buffer ([`crate::WorkerContext::writer`]), and written with non-temporal stores when it is
/// large enough (see [`BatchBuffer`]).
#[derive(Debug)]
pub struct BatchWriter {
    /// `len` bytes of which `[0, off)` are initialised.
    buf: BatchBuffer,
    off: usize,
    stream: bool,
}

impl BatchWriter {
    /// A writer of a `len`-byte buffer from `pool` (or the heap).
    pub(crate) fn new(pool: Option<&Arc<StagingPool>>, len: usize) -> BatchWriter {
        let buf = BatchBuffer::uninit(pool, len);
        BatchWriter {
            stream: buf.streams(),
            buf,
            off: 0,
        }
    }

    /// Bytes of the buffer.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Whether the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Bytes of memory the buffer holds (its block size, at least `len`).
    pub fn capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// Bytes written so far.
    pub fn written(&self) -> usize {
        self.off
    }

    /// Bytes left to write.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.off
    }

    /// Appends `part`, cut to what is left; returns the bytes written.
    #[inline(always)]
    pub fn copy(&mut self, part: &[u8]) -> usize {
        let n = part.len().min(self.remaining());
        // SAFETY: `off + n <= len`: the range lies within the buffer's block, which the writer
        // owns exclusively, and a block the writer owns cannot overlap the borrowed `part`.
        unsafe { self.buf.write_at(self.off, &part[..n], self.stream) };
        self.off += n;
        n
    }

    /// Appends `n` bytes of value `byte`, cut to what is left.
    #[inline(always)]
    pub fn fill(&mut self, byte: u8, n: usize) {
        let n = n.min(self.remaining());
        // SAFETY: as in `copy`, `off + n <= len`.
        unsafe { self.buf.fill_at(self.off, byte, n) };
        self.off += n;
    }

    /// Appends `count` copies of `pattern` (one element, such as a padding id), cut to what is
    /// left.
    #[inline(always)]
    pub fn repeat(&mut self, pattern: &[u8], count: usize) {
        let n = pattern.len().saturating_mul(count).min(self.remaining());
        match pattern.first() {
            None => {}
            // One copy (a separator after a row): a short store, written like a row.
            _ if n == pattern.len() => {
                self.copy(pattern);
            }
            Some(&b) if pattern.iter().all(|&x| x == b) => self.fill(b, n),
            Some(_) => self.repeat_doubling(pattern, n),
        }
    }

    /// Appends `n` bytes of `pattern` repeated (`n` not above what is left), by doubling.
    #[inline(never)]
    fn repeat_doubling(&mut self, pattern: &[u8], n: usize) {
        let start = self.off;
        self.copy(&pattern[..pattern.len().min(n)]);
        // Doubling: the bytes written so far are whole periods of the pattern, so copying
        // them after themselves keeps it periodic.
        while self.off < start + n {
            let done = self.off - start;
            let k = done.min(start + n - self.off);
            // SAFETY: `[start, start + k)` is written (k <= done), `[off, off + k)` lies within
            // the buffer (off + k <= start + n <= len), and the two do not overlap
            // (start + k <= start + done = off).
            unsafe { self.buf.copy_within_at(start, self.off, k) };
            self.off += k;
        }
    }

    /// The finished buffer: bytes not written are zeroed.
    pub fn finish(self) -> BatchBuffer {
        let BatchWriter {
            mut buf,
            off,
            stream,
        } = self;
        // SAFETY: `[off, len)` lies within the buffer; after it every byte is initialised.
        unsafe { buf.finish_at(off, stream) };
        buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::memory::MemoryCounters;

    fn pools() -> [Option<Arc<StagingPool>>; 2] {
        let mem = Arc::new(MemoryCounters::default());
        [None, Some(Arc::new(StagingPool::new(false, 4, mem)))]
    }

    #[test]
    fn writes_every_kind_of_run_in_order_and_zeroes_the_rest() {
        for pool in pools() {
            let mut w = BatchWriter::new(pool.as_ref(), 24);
            assert_eq!((w.len(), w.written(), w.remaining()), (24, 0, 24));
            assert_eq!(w.copy(&[1, 2, 3]), 3);
            w.fill(7, 2);
            w.repeat(&[0xA, 0xB, 0xC], 3);
            w.repeat(&[5, 5], 2);
            w.repeat(&[], 9);
            assert_eq!(w.written(), 18);
            let b = w.finish();
            assert_eq!(
                b.as_bytes(),
                &[
                    1, 2, 3, 7, 7, 0xA, 0xB, 0xC, 0xA, 0xB, 0xC, 0xA, 0xB, 0xC, 5, 5, 5, 5, 0, 0,
                    0, 0, 0, 0
                ]
            );
        }
    }

    #[test]
    fn a_single_element_is_copied_whatever_its_bytes() {
        for pool in pools() {
            let mut w = BatchWriter::new(pool.as_ref(), 16);
            w.copy(&[9, 9, 9]);
            // One copy each: a non-uniform element, a uniform one, a one-byte one, none, a
            // five-byte one, and a two-byte one cut to the last byte left.
            w.repeat(&[1, 2, 3, 4], 1);
            w.repeat(&[7, 7], 1);
            w.repeat(&[5], 1);
            w.repeat(&[0xA, 0xB], 0);
            w.repeat(&[6, 0xC, 0xD, 0xE, 0xF], 1);
            assert_eq!(w.remaining(), 1);
            w.repeat(&[8, 3], 1);
            assert_eq!(w.remaining(), 0);
            assert_eq!(
                w.finish().as_bytes(),
                &[9, 9, 9, 1, 2, 3, 4, 7, 7, 5, 6, 0xC, 0xD, 0xE, 0xF, 8]
            );
        }
    }

    #[test]
    fn every_run_is_cut_to_the_buffer() {
        for pool in pools() {
            let mut w = BatchWriter::new(pool.as_ref(), 7);
            w.repeat(&[1, 2], 3);
            assert_eq!(w.remaining(), 1);
            w.repeat(&[3, 4], 5);
            assert_eq!(w.copy(&[9, 9]), 0);
            w.fill(8, 4);
            assert_eq!(w.finish().as_bytes(), &[1, 2, 1, 2, 1, 2, 3]);
            let mut w = BatchWriter::new(pool.as_ref(), 3);
            assert_eq!(w.copy(&[1, 2, 3, 4]), 3);
            w.fill(5, 1);
            assert_eq!(w.finish().as_bytes(), &[1, 2, 3]);
            let w = BatchWriter::new(pool.as_ref(), 0);
            assert!(w.is_empty());
            assert!(w.finish().is_empty());
        }
    }

    #[test]
    fn long_patterns_repeat_exactly_in_large_streamed_buffers() {
        // A buffer above the streaming threshold; a 3-byte pattern over an odd count and a
        // long row at an odd offset, so every doubling step and the stream path are exercised.
        let row: Vec<u8> = (0..70_001).map(|i| (i % 251) as u8).collect();
        let len = 1 << 21;
        for pool in pools() {
            let mut w = BatchWriter::new(pool.as_ref(), len);
            w.fill(1, 5);
            w.copy(&row);
            w.repeat(&[7, 8, 9], 100_003);
            w.copy(&row);
            let at = w.written();
            let b = w.finish();
            let bytes = b.as_bytes();
            assert_eq!(&bytes[..5], &[1; 5]);
            assert_eq!(&bytes[5..70_006], &row[..]);
            let pad = &bytes[70_006..70_006 + 300_009];
            assert!(pad.chunks_exact(3).all(|c| c == [7, 8, 9]));
            assert_eq!(&bytes[370_015..at], &row[..]);
            assert!(bytes[at..].iter().all(|&x| x == 0));
        }
    }

    #[test]
    fn a_reused_block_comes_back_without_the_old_bytes() {
        let mem = Arc::new(MemoryCounters::default());
        let pool = Arc::new(StagingPool::new(false, 4, mem));
        let mut w = BatchWriter::new(Some(&pool), 4096);
        w.fill(0xFF, 4096);
        let ptr = {
            let b = w.finish();
            b.as_bytes().as_ptr()
        };
        let mut w = BatchWriter::new(Some(&pool), 4000);
        w.copy(&[1, 2]);
        let b = w.finish();
        assert_eq!(b.as_bytes().as_ptr(), ptr, "the block was reused");
        assert_eq!(&b.as_bytes()[..2], &[1, 2]);
        assert!(b.as_bytes()[2..].iter().all(|&x| x == 0));
    }
}
