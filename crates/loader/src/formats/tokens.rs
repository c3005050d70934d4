//! Token streams for language-model training: [`TokenFile`], one flat memory-mapped file of
//! little-endian token ids (the nanoGPT `train.bin` layout: no header, `u16` or `u32`), and
//! [`TokenWindows`], a [`Dataset`] of fixed-length windows of `seq + 1` tokens cut from it (or
//! from the documents of an indexed data set, [`crate::IndexedTokens`]): the first `seq` are
//! the input, the last `seq` the shifted target.
//!
//! Windows are zero-copy: a [`Window`] is a view into the mapping; [`StackWindows`] copies a
//! batch of them into one buffer (the only copy).

use std::path::Path;

use crate::dataset::Dataset;
use crate::dtype::Element;
use crate::engine::builder::{BatchBuilder, BoxError, HeldBytes};
use crate::engine::context::WorkerContext;
use crate::engine::staging::BatchBuffer;
use crate::error::{DataError, FileProblem};
use crate::formats::mapped::MappedFile;
use crate::rng::mix;
use trainmem_core::Dtype;

/// The element types a token file may hold.
pub const TOKEN_DTYPES: [Dtype; 5] = [Dtype::U8, Dtype::U16, Dtype::U32, Dtype::I32, Dtype::I64];

/// Token `i` of `bytes` (little-endian `dtype`), widened; `None` past the end.
pub(crate) fn token_at(bytes: &[u8], dtype: Dtype, i: usize) -> Option<i128> {
    let size = dtype.size() as usize;
    let b = bytes.get(i.checked_mul(size)?..i.checked_add(1)?.checked_mul(size)?)?;
    Some(match dtype {
        Dtype::U8 => i128::from(b[0]),
        Dtype::U16 => i128::from(u16::from_le_bytes([b[0], b[1]])),
        Dtype::U32 => i128::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        Dtype::I32 => i128::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        Dtype::I64 => i128::from(i64::from_le_bytes(b.try_into().ok()?)),
        _ => return None,
    })
}

/// The first token of `bytes` outside `0..vocab`, as `(position, id)`.
fn first_out_of_vocab(bytes: &[u8], dtype: Dtype, vocab: u64) -> Option<(usize, i128)> {
    let v = i128::from(vocab);
    macro_rules! scan {
        ($t:ty) => {
            bytes
                .chunks_exact(std::mem::size_of::<$t>())
                .map(|c| i128::from(<$t>::from_le_bytes(c.try_into().unwrap_or_default())))
                .enumerate()
                .find(|&(_, t)| t < 0 || t >= v)
        };
    }
    match dtype {
        Dtype::U8 => scan!(u8),
        Dtype::U16 => scan!(u16),
        Dtype::U32 => scan!(u32),
        Dtype::I32 => scan!(i32),
        Dtype::I64 => scan!(i64),
        _ => None,
    }
}

/// A flat file of token ids, memory-mapped.
#[derive(Debug)]
pub struct TokenFile {
    file: MappedFile,
    dtype: Dtype,
    tokens: usize,
    vocab: Option<u64>,
}

impl TokenFile {
    /// Opens `path` as tokens of `dtype` (one of [`TOKEN_DTYPES`]). With `vocab`, every id is
    /// checked to be below it (one pass over the file at open).
    pub fn open(
        path: impl AsRef<Path>,
        dtype: Dtype,
        vocab: Option<u64>,
    ) -> Result<TokenFile, DataError> {
        let file = MappedFile::open(path)?;
        TokenFile::from_mapped(file, dtype, vocab)
    }

    pub(crate) fn from_mapped(
        file: MappedFile,
        dtype: Dtype,
        vocab: Option<u64>,
    ) -> Result<TokenFile, DataError> {
        if !TOKEN_DTYPES.contains(&dtype) {
            return Err(DataError::malformed(
                file.path(),
                0,
                format!("{dtype} is not a token type (u8, u16, u32, i32 or i64)"),
            ));
        }
        let size = dtype.size();
        if !file.len().is_multiple_of(size) {
            return Err(DataError::file(
                file.path(),
                FileProblem::PartialRecord {
                    data_bytes: file.len(),
                    record_bytes: size,
                },
            ));
        }
        let tokens = usize::try_from(file.len() / size)
            .map_err(|_| DataError::malformed(file.path(), 0, "too large to address"))?;
        let t = TokenFile {
            file,
            dtype,
            tokens,
            vocab,
        };
        if let Some(vocab) = vocab {
            t.check_vocab(0, tokens, vocab)?;
        }
        Ok(t)
    }

    /// Errors on the first token of `start..end` outside `0..vocab`.
    pub(crate) fn check_vocab(
        &self,
        start: usize,
        end: usize,
        vocab: u64,
    ) -> Result<(), DataError> {
        let size = self.dtype.size() as usize;
        let bytes = self.bytes(start, end - start).unwrap_or(&[]);
        match first_out_of_vocab(bytes, self.dtype, vocab) {
            None => Ok(()),
            Some((i, token)) => Err(DataError::file(
                self.path(),
                FileProblem::TokenOutOfVocab {
                    token,
                    position: (start + i) as u64,
                    offset: ((start + i) * size) as u64,
                    vocab,
                },
            )),
        }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// Element type of the ids.
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.tokens
    }

    /// Whether there are no tokens.
    pub fn is_empty(&self) -> bool {
        self.tokens == 0
    }

    /// The vocabulary bound checked at open, if any.
    pub fn vocab(&self) -> Option<u64> {
        self.vocab
    }

    /// The raw bytes of tokens `start..start + count`, or `None` past the end.
    pub fn bytes(&self, start: usize, count: usize) -> Option<&[u8]> {
        let size = self.dtype.size() as usize;
        self.file
            .get(start.checked_mul(size)?, count.checked_mul(size)?)
    }

    /// Token `i`, widened (`None` past the end).
    pub fn get(&self, i: usize) -> Option<i128> {
        token_at(self.file.bytes(), self.dtype, i)
    }

    /// All tokens as `T` (zero-copy; `T` must match the dtype).
    pub fn view<T: Element>(&self) -> Result<&[T], DataError> {
        cast(self.file.bytes(), self.dtype, self.path())
    }

    pub(crate) fn mapped(&self) -> &MappedFile {
        &self.file
    }
}

fn cast<'a, T: Element>(bytes: &'a [u8], dtype: Dtype, path: &Path) -> Result<&'a [T], DataError> {
    let name = path.display().to_string();
    if T::DTYPE != dtype {
        return Err(DataError::DTypeMismatch {
            column: name,
            actual: dtype,
            requested: T::DTYPE,
        });
    }
    bytemuck::try_cast_slice(bytes).map_err(|e| DataError::Cast {
        column: name,
        requested: T::DTYPE,
        reason: e.to_string(),
    })
}

/// Where windows start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WindowOrder {
    /// One window every `stride` tokens from the start (`stride = seq` tiles the stream
    /// without overlap, the target of one window's last token being the next one's first
    /// input).
    Strided {
        /// Tokens between window starts (at least 1).
        stride: usize,
    },
    /// `count` windows at start offsets drawn uniformly from every valid start, from `seed`
    /// (window `i`'s offset depends only on `(seed, i)`, nanoGPT's `get_batch` made
    /// addressable).
    Random {
        /// Number of windows.
        count: usize,
        /// The seed.
        seed: u64,
    },
}

/// How [`TokenWindows`] cuts a token stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WindowSpec {
    /// Input length: a window holds `seq + 1` tokens.
    pub seq: usize,
    /// Where windows start.
    pub order: WindowOrder,
}

impl WindowSpec {
    /// Non-overlapping windows: stride `seq`.
    pub fn tiled(seq: usize) -> WindowSpec {
        WindowSpec {
            seq,
            order: WindowOrder::Strided { stride: seq },
        }
    }
}

/// Token spans windows may be cut from: one span for a flat stream (or an indexed data set
/// whose windows cross documents), one per document otherwise. `starts[k]` is the first token
/// of span `k`; `prefix[k]` is the number of window positions in spans before `k`.
#[derive(Debug, Clone)]
struct Spans {
    starts: Vec<usize>,
    prefix: Vec<u64>,
    total: u64,
}

impl Spans {
    fn new(spans: &[(usize, usize)], window: usize, step: usize) -> Spans {
        let mut starts = Vec::new();
        let mut prefix = Vec::new();
        let mut total = 0u64;
        for &(start, len) in spans {
            if len < window {
                continue;
            }
            starts.push(start);
            prefix.push(total);
            total += ((len - window) / step + 1) as u64;
        }
        Spans {
            starts,
            prefix,
            total,
        }
    }

    /// The first token of window position `p` (`p < total`).
    fn start(&self, p: u64, step: usize) -> usize {
        let k = self.prefix.partition_point(|&q| q <= p) - 1;
        self.starts[k] + (p - self.prefix[k]) as usize * step
    }
}

/// A [`Dataset`] of windows of `seq + 1` tokens.
#[derive(Debug)]
pub struct TokenWindows {
    tokens: TokenFile,
    spec: WindowSpec,
    spans: Spans,
    step: usize,
    len: usize,
}

impl TokenWindows {
    /// Windows over the whole of `tokens`. A window longer than the file (`seq + 1` tokens
    /// or more) is an error, as is a `seq` of 0 or a stride of 0.
    pub fn new(tokens: TokenFile, spec: WindowSpec) -> Result<TokenWindows, DataError> {
        let n = tokens.len();
        TokenWindows::over(tokens, spec, &[(0, n)])
    }

    /// Windows within each of `spans` (`(first token, tokens)`; none crosses a span's end).
    /// Spans shorter than a window hold none; an error when no span holds one.
    pub(crate) fn over(
        tokens: TokenFile,
        spec: WindowSpec,
        spans: &[(usize, usize)],
    ) -> Result<TokenWindows, DataError> {
        let bad = |m: &str| DataError::malformed(tokens.path(), 0, m);
        if spec.seq == 0 {
            return Err(bad("window length seq must be at least 1"));
        }
        let step = match spec.order {
            WindowOrder::Strided { stride: 0 } => {
                return Err(bad("window stride must be at least 1"));
            }
            WindowOrder::Strided { stride } => stride,
            WindowOrder::Random { .. } => 1,
        };
        let window = spec.seq.checked_add(1).ok_or_else(|| {
            bad(&format!(
                "window length seq = {} is more than any token file holds",
                spec.seq
            ))
        })?;
        // A window that fits nowhere would leave a data set of no windows: say so instead.
        let longest = spans.iter().map(|&(_, n)| n).max().unwrap_or(0);
        if longest < window {
            let within = match spans {
                [(0, n)] if *n == tokens.len() => format!("the file's {n} tokens"),
                [_] => format!("the {longest} tokens to cut windows from"),
                _ => format!("every document (the longest holds {longest} tokens)"),
            };
            return Err(bad(&format!(
                "a window of seq + 1 = {window} tokens is longer than {within}"
            )));
        }
        // At least one window position from here on (`window_start` divides by the count).
        let spans = Spans::new(spans, window, step);
        let len = match spec.order {
            WindowOrder::Strided { .. } => spans.total,
            WindowOrder::Random { count, .. } => count as u64,
        };
        let len = usize::try_from(len).map_err(|_| bad("too many windows"))?;
        Ok(TokenWindows {
            tokens,
            spec,
            spans,
            step,
            len,
        })
    }

    /// The token file.
    pub fn tokens(&self) -> &TokenFile {
        &self.tokens
    }

    /// How windows are cut.
    pub fn spec(&self) -> WindowSpec {
        self.spec
    }

    /// Tokens per window (`seq + 1`).
    pub fn window_tokens(&self) -> usize {
        self.spec.seq + 1
    }

    /// Bytes of one window.
    pub fn bytes_per_sample(&self) -> usize {
        self.window_tokens() * self.tokens.dtype().size() as usize
    }

    /// The first token of window `index` (`None` past the end).
    pub fn window_start(&self, index: usize) -> Option<usize> {
        if index >= self.len {
            return None;
        }
        let p = match self.spec.order {
            WindowOrder::Strided { .. } => index as u64,
            WindowOrder::Random { seed, .. } => mix(&[seed, index as u64]) % self.spans.total,
        };
        Some(self.spans.start(p, self.step))
    }
}

/// One window: `seq + 1` tokens, borrowed from the mapping.
#[derive(Debug, Clone, Copy)]
pub struct Window<'a> {
    /// The window's index in the data set.
    pub index: usize,
    /// Its first token's position in the file.
    pub start: usize,
    /// Its raw bytes.
    pub bytes: &'a [u8],
    /// Element type.
    pub dtype: Dtype,
}

impl<'a> Window<'a> {
    /// The tokens as `T` (zero-copy; `T` must match the dtype).
    pub fn tokens<T: Element>(&self) -> Result<&'a [T], DataError> {
        if T::DTYPE != self.dtype {
            return Err(DataError::DTypeMismatch {
                column: "tokens".into(),
                actual: self.dtype,
                requested: T::DTYPE,
            });
        }
        bytemuck::try_cast_slice(self.bytes).map_err(|e| DataError::Cast {
            column: "tokens".into(),
            requested: T::DTYPE,
            reason: e.to_string(),
        })
    }

    /// Token `i` of the window, widened.
    pub fn get(&self, i: usize) -> Option<i128> {
        token_at(self.bytes, self.dtype, i)
    }
}

impl Dataset for TokenWindows {
    type Sample<'a> = Window<'a>;

    fn len(&self) -> usize {
        self.len
    }

    fn sample(&self, index: usize) -> Result<Window<'_>, DataError> {
        let out = || DataError::OutOfRange {
            index,
            len: self.len,
        };
        let start = self.window_start(index).ok_or_else(out)?;
        let bytes = self
            .tokens
            .bytes(start, self.window_tokens())
            .ok_or_else(out)?;
        Ok(Window {
            index,
            start,
            bytes,
            dtype: self.tokens.dtype(),
        })
    }

    fn check(&self) -> Result<(), DataError> {
        self.tokens.mapped().check_unchanged()
    }

    fn advise(&self, sequential: bool) {
        let seq = sequential && matches!(self.spec.order, WindowOrder::Strided { .. });
        self.tokens.mapped().advise(seq);
    }
}

/// A batch of token windows: `[batch, seq + 1]` ids in one buffer.
#[derive(Debug)]
pub struct TokenBatch {
    /// The window indices, in order.
    pub indices: Vec<usize>,
    /// `batch × (seq + 1)` ids, row-major.
    pub tokens: BatchBuffer,
    /// Element type.
    pub dtype: Dtype,
    /// Tokens per row (`seq + 1`).
    pub row: usize,
}

impl TokenBatch {
    /// Number of windows.
    pub fn len(&self) -> usize {
        self.indices.len()
    }

    /// Whether the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.indices.is_empty()
    }

    /// All ids as `T`, or `None` on a dtype mismatch.
    pub fn ids<T: Element>(&self) -> Option<&[T]> {
        if T::DTYPE != self.dtype {
            return None;
        }
        self.tokens.typed()
    }

    /// Row `r`'s input (`seq` tokens) and target (the same shifted by one).
    pub fn input_target<T: Element>(&self, r: usize) -> Option<(&[T], &[T])> {
        let row = self.ids::<T>()?.get(r * self.row..(r + 1) * self.row)?;
        Some((&row[..self.row - 1], &row[1..]))
    }
}

impl HeldBytes for TokenBatch {
    fn byte_size(&self) -> usize {
        self.tokens.capacity() + self.indices.capacity() * std::mem::size_of::<usize>()
    }
}

/// Copies a batch of windows into one `[batch, seq + 1]` buffer.
#[derive(Debug, Clone, Copy, Default)]
pub struct StackWindows;

impl BatchBuilder<TokenWindows> for StackWindows {
    type Batch = TokenBatch;

    fn build(
        &self,
        data: &TokenWindows,
        indices: &[usize],
        ctx: &mut WorkerContext,
    ) -> Result<TokenBatch, BoxError> {
        let mut parts = Vec::with_capacity(indices.len());
        for &i in indices {
            ctx.set_sample(i);
            parts.push(data.sample(i)?.bytes);
        }
        ctx.clear_sample();
        let tokens = ctx.alloc_concat(indices.len() * data.bytes_per_sample(), parts);
        Ok(TokenBatch {
            indices: indices.to_vec(),
            tokens,
            dtype: data.tokens.dtype(),
            row: data.window_tokens(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A fresh file of `n` `u16` tokens `0, 1, 2, ...` (mod 500) in the temp dir.
    fn token_file(n: usize) -> (PathBuf, TokenFile) {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "trainmem-tokens-{}-{}.bin",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let bytes: Vec<u8> = (0..n)
            .flat_map(|i| ((i % 500) as u16).to_le_bytes())
            .collect();
        std::fs::write(&path, bytes).expect("write");
        let t = TokenFile::open(&path, Dtype::U16, None).expect("open");
        (path, t)
    }

    fn message(e: &DataError) -> String {
        match e {
            DataError::File { problem, .. } => problem.to_string(),
            other => other.to_string(),
        }
    }

    #[test]
    fn a_huge_seq_is_an_error_not_an_overflow() {
        for seq in [usize::MAX, usize::MAX - 1, 1 << 40] {
            let (path, t) = token_file(1000);
            let err = TokenWindows::new(t, WindowSpec::tiled(seq)).expect_err("too long");
            let text = message(&err);
            assert!(text.contains("seq"), "{text}");
            if seq == usize::MAX {
                assert!(text.contains(&seq.to_string()), "{text}");
            } else {
                assert!(
                    text.ends_with("longer than the file's 1000 tokens"),
                    "{text}"
                );
            }
            let _ = std::fs::remove_file(path);
        }
    }

    #[test]
    fn a_window_longer_than_the_file_is_an_error() {
        let (path, t) = token_file(1000);
        let spec = WindowSpec {
            seq: 2000,
            order: WindowOrder::Strided { stride: 1 },
        };
        let err = TokenWindows::new(t, spec).expect_err("longer than the file");
        assert_eq!(
            message(&err),
            "at byte 0: a window of seq + 1 = 2001 tokens is longer than the file's 1000 tokens"
        );
        // Random windows too, and a window one token too long.
        for spec in [
            WindowSpec {
                seq: 1000,
                order: WindowOrder::Random { count: 4, seed: 1 },
            },
            WindowSpec::tiled(1000),
        ] {
            let t = TokenFile::open(&path, Dtype::U16, None).expect("open");
            assert!(TokenWindows::new(t, spec).is_err(), "{spec:?}");
        }
        // A window of exactly the file is the one window.
        let t = TokenFile::open(&path, Dtype::U16, None).expect("open");
        let w = TokenWindows::new(t, WindowSpec::tiled(999)).expect("one window");
        assert_eq!(w.len(), 1);
        // Nothing to cut from an empty file.
        let (empty, t) = token_file(0);
        assert!(TokenWindows::new(t, WindowSpec::tiled(1)).is_err());
        // Within documents: one at least must hold a window.
        let t = TokenFile::open(&path, Dtype::U16, None).expect("open");
        let err = TokenWindows::over(t, WindowSpec::tiled(30), &[(0, 10), (10, 20), (30, 5)])
            .expect_err("no document holds a window");
        assert!(
            message(&err).ends_with("every document (the longest holds 20 tokens)"),
            "{err}"
        );
        let t = TokenFile::open(&path, Dtype::U16, None).expect("open");
        let w = TokenWindows::over(t, WindowSpec::tiled(19), &[(0, 10), (10, 20), (30, 5)])
            .expect("the second document holds one");
        assert_eq!((w.len(), w.window_start(0)), (1, Some(10)));
        let _ = std::fs::remove_file(path);
        let _ = std::fs::remove_file(empty);
    }

    #[test]
    fn random_windows_are_addressable_however_many() {
        let (path, t) = token_file(1000);
        let count = 1usize << 40;
        let spec = WindowSpec {
            seq: 64,
            order: WindowOrder::Random { count, seed: 1 },
        };
        let w = std::sync::Arc::new(TokenWindows::new(t, spec).expect("windows"));
        assert_eq!(w.len(), count);
        let last = w.sample(count - 1).expect("the last window");
        assert_eq!(last.bytes.len(), 65 * 2);
        assert!(last.start + 65 <= 1000);
        // The loader cannot hold an epoch order of 2⁴⁰ indices: it says so, by name.
        let err = crate::Loader::new(
            std::sync::Arc::clone(&w),
            crate::LoaderConfig::default(),
            StackWindows,
        )
        .expect_err("epoch too large");
        assert!(
            matches!(err, crate::LoaderError::EpochTooLarge { samples, .. } if samples == count),
            "{err}"
        );
        assert!(err.to_string().contains("MAX_EPOCH_SAMPLES"), "{err}");
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn an_out_of_vocabulary_id_is_named_once() {
        let (path, t) = token_file(1000);
        drop(t);
        let err = TokenFile::open(&path, Dtype::U16, Some(400)).expect_err("id 400");
        assert_eq!(
            message(&err),
            "token id 400 at position 400 (byte 800) is not in the vocabulary 0..400"
        );
        let t = TokenFile::open(&path, Dtype::U16, None).expect("open");
        assert_eq!(
            (t.get(999), t.get(1000), t.get(usize::MAX)),
            (Some(499), None, None)
        );
        let _ = std::fs::remove_file(path);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]

        /// Any window length and stride over any small file: an error or windows that lie
        /// inside the file, `seq + 1` tokens each, as many as fit; never a panic.
        #[test]
        fn strided_windows_fit_or_are_refused(
            n in 0usize..64,
            seq in prop_oneof![0usize..80, any::<usize>()],
            stride in prop_oneof![0usize..80, any::<usize>()],
        ) {
            let (path, t) = token_file(n);
            let spec = WindowSpec { seq, order: WindowOrder::Strided { stride } };
            let r = TokenWindows::new(t, spec);
            let _ = std::fs::remove_file(&path);
            let fits = seq > 0 && stride > 0 && seq < n;
            prop_assert_eq!(r.is_ok(), fits, "{:?}", r.as_ref().err());
            if let Ok(w) = r {
                prop_assert_eq!(w.len(), (n - (seq + 1)) / stride + 1);
                for i in 0..w.len() {
                    let s = w.sample(i).expect("a window");
                    prop_assert_eq!(s.start, i * stride);
                    prop_assert_eq!(s.bytes.len(), (seq + 1) * 2);
                }
                prop_assert!(w.sample(w.len()).is_err());
            }
        }
    }
}
