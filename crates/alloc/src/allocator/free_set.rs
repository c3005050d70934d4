//! [`FreeSet`]: the cached free blocks of one (stream, pool), ordered by (size, address).
//!
//! The allocator's hot path is "best fit": the first block whose key `size << 64 | address` is
//! at or after `request << 64`, then a removal; frees do one insertion and one removal per
//! merged neighbour. A free set holds a few hundred blocks in most training workloads, and
//! for sets of that size a sorted array beats a B-tree: a lookup is a binary search over one
//! contiguous array (no per-node linear scans, no pointer chasing) and an insertion or
//! removal is one `memmove` of the tail. Keys and block indices are kept in two parallel
//! arrays so that the searched array holds keys only. A split or a merge re-files one entry in
//! place of another ([`FreeSet::replace`]), moving only the entries between the two positions.
//!
//! Deep models hold tens of thousands of cached blocks in one set, where one array would move
//! too much per insertion. The set is therefore a sequence of sorted arrays (chunks) of at
//! most [`CHUNK_MAX`] entries, each in one allocation of fixed size, with the first key of
//! each chunk in a small array of its own that is searched first: every operation is two
//! binary searches and a move within one chunk, so its cost hardly grows with the set (a set
//! of up to [`CHUNK_MAX`] blocks is one chunk, the plain sorted array). A chunk that fills up
//! splits in two; one that drops below [`CHUNK_MIN`] entries joins a neighbour.
//!
//! Keys are 8 bytes where they can be ([`Narrow`]: sizes and addresses in 512-byte units from
//! a base), 16 otherwise: half the bytes to search and to move.

/// A chunk that grows past this many entries splits in two.
const CHUNK_MAX: usize = 64;
/// A chunk that shrinks below this many entries joins a neighbour (`CHUNK_MAX / 8`, so that
/// a chunk just split needs many removals before it joins again).
const CHUNK_MIN: usize = CHUNK_MAX / 8;

/// Entries a chunk has room for: a chunk past [`CHUNK_MAX`] splits at once, and a join adds
/// fewer than [`CHUNK_MIN`] entries to a chunk of at most [`CHUNK_MAX`] before it splits.
const CAP: usize = CHUNK_MAX + CHUNK_MIN;

/// A chunk's storage: keys and block indices side by side, in one allocation of fixed size
/// (no growth, no capacity checks on the hot path).
#[derive(Debug)]
struct Entries<K> {
    keys: [K; CAP],
    idxs: [u32; CAP],
}

/// A sorted array of keys `in order, with each block's slab index beside its key,
/// holding at most [`CAP`] entries.
#[derive(Debug)]
struct SortedArray<K> {
    len: usize,
    e: Box<Entries<K>>,
}

impl<K: Key> Default for SortedArray<K> {
    fn default() -> Self {
        SortedArray {
            len: 0,
            e: Box::new(Entries {
                keys: [K::default(); CAP],
                idxs: [0; CAP],
            }),
        }
    }
}

impl<K: Key> SortedArray<K> {
    /// The keys in order.
    #[inline(always)]
    fn keys(&self) -> &[K] {
        &self.e.keys[..self.len]
    }

    /// The key at position `pos` (`pos < len`).
    #[inline(always)]
    fn key(&self, pos: usize) -> K {
        self.keys()[pos]
    }

    /// The block index at position `pos` (`pos < len`).
    #[inline(always)]
    fn idx(&self, pos: usize) -> u32 {
        self.e.idxs[..self.len][pos]
    }

    /// The smallest key (the array must not be empty).
    #[inline(always)]
    fn first(&self) -> K {
        self.key(0)
    }

    /// Position of the first key `>= key`.
    #[inline]
    fn lower_bound(&self, key: K) -> usize {
        below(self.keys(), key)
    }

    /// Number of blocks in the set.
    #[inline(always)]
    fn len(&self) -> usize {
        self.len
    }

    /// Files block `idx` under `key` (the key must not be present: keys are unique because
    /// addresses are). The array must have room (`len < CAP`).
    #[inline]
    fn insert(&mut self, key: K, idx: u32) {
        let i = self.lower_bound(key);
        debug_assert!(self.keys().get(i) != Some(&key), "duplicate free-set key");
        self.insert_at(i, key, idx);
    }

    /// Files block `idx` under `key` at position `i`.
    #[inline]
    fn insert_at(&mut self, i: usize, key: K, idx: u32) {
        let n = self.len;
        let e = &mut *self.e;
        e.keys.copy_within(i..n, i + 1);
        e.idxs.copy_within(i..n, i + 1);
        e.keys[i] = key;
        e.idxs[i] = idx;
        self.len = n + 1;
    }

    /// Removes `key`, returning its block index if it was present.
    #[inline]
    fn remove(&mut self, key: K) -> Option<u32> {
        let i = self.lower_bound(key);
        if self.keys().get(i) == Some(&key) {
            let idx = self.idx(i);
            self.remove_at(i);
            Some(idx)
        } else {
            None
        }
    }

    /// Re-files an entry: removes `old` (which must be present) and files `idx` under `new`
    /// (which must not be), moving only the entries between the two positions. This is the
    /// common shape of a split (the found block leaves, its remainder arrives) and of a merge
    /// (a free neighbour leaves, the merged block arrives).
    #[inline]
    fn replace(&mut self, old: K, new: K, idx: u32) {
        let i = self.lower_bound(old);
        debug_assert!(
            self.keys().get(i) == Some(&old),
            "replaced key not in the set"
        );
        self.replace_at(i, new, idx);
    }

    /// [`replace`](Self::replace) for the entry at position `pos`.
    #[inline]
    fn replace_at(&mut self, pos: usize, new: K, idx: u32) {
        let n = self.len;
        let e = &mut *self.e;
        let keys = &mut e.keys[..n];
        let (i, old) = (pos, keys[pos]);
        // Search only the side of `i` where `new` belongs.
        let j = if new > old {
            i + 1 + below(&keys[i + 1..], new)
        } else {
            below(&keys[..i], new)
        };
        // (`new == old` finds `old` itself at `j == i`: re-filing under the same key is fine.)
        debug_assert!(
            new == old || keys.get(j) != Some(&new),
            "duplicate free-set key"
        );
        // `j` is the insertion point with `old` still present. Entries strictly between the
        // two positions shift by one towards the hole left by `old`.
        let idxs = &mut e.idxs[..n];
        let at = if j > i {
            keys.copy_within(i + 1..j, i);
            idxs.copy_within(i + 1..j, i);
            j - 1
        } else {
            keys.copy_within(j..i, j + 1);
            idxs.copy_within(j..i, j + 1);
            j
        };
        keys[at] = new;
        idxs[at] = idx;
    }

    /// Removes the entry at position `pos`.
    #[inline]
    fn remove_at(&mut self, pos: usize) {
        let n = self.len;
        let e = &mut *self.e;
        e.keys[..n].copy_within(pos + 1..n, pos);
        e.idxs[..n].copy_within(pos + 1..n, pos);
        self.len = n - 1;
    }

    /// Moves the entries from position `at` on into a new array.
    fn split_off(&mut self, at: usize) -> SortedArray<K> {
        let mut tail = SortedArray::default();
        let n = self.len;
        tail.e.keys[..n - at].copy_from_slice(&self.e.keys[at..n]);
        tail.e.idxs[..n - at].copy_from_slice(&self.e.idxs[at..n]);
        tail.len = n - at;
        self.len = at;
        tail
    }

    /// Appends every entry of `other`, whose keys are all above this array's (room for them
    /// is the caller's to ensure).
    fn append(&mut self, other: &SortedArray<K>) {
        let (n, m) = (self.len, other.len);
        self.e.keys[n..n + m].copy_from_slice(other.keys());
        self.e.idxs[n..n + m].copy_from_slice(&other.e.idxs[..m]);
        self.len = n + m;
    }

    /// The block index filed under `key`.
    fn get(&self, key: &K) -> Option<&u32> {
        let i = self.lower_bound(*key);
        if self.keys().get(i) == Some(key) {
            self.e.idxs.get(i)
        } else {
            None
        }
    }

    /// Entries with key `< hi`, largest key first.
    fn below_rev(&self, hi: K) -> impl Iterator<Item = (K, u32)> + '_ {
        let i = self.lower_bound(hi);
        self.e.keys[..i]
            .iter()
            .copied()
            .zip(self.e.idxs[..i].iter().copied())
            .rev()
    }

    /// Every entry in key order.
    fn iter(&self) -> impl Iterator<Item = (K, u32)> + '_ {
        self.keys()
            .iter()
            .copied()
            .zip(self.e.idxs[..self.len].iter().copied())
    }
}

/// A key type of the chunks: wide keys `size << 64 | address`, or narrow ones (see
/// [`Narrow`]).
trait Key: Copy + Ord + Default + std::fmt::Debug {
    /// The largest key.
    const MAX: Self;
}

impl Key for u64 {
    const MAX: Self = u64::MAX;
}

impl Key for u128 {
    const MAX: Self = u128::MAX;
}

/// The number of keys of the sorted `keys` below `key` (the position of the first key
/// `>= key`). A plain binary search with branches, not the standard library's branch-free
/// one: the simulator asks for the same sizes step after step, so the branches are predicted
/// and the search runs ahead of its loads, where a branch-free search waits on each load in
/// turn (about 10% of a 7B plan's simulation). It and [`at_most`] are written out rather than
/// made one search over a predicate: that form simulated the 7B plan 6% slower.
#[inline(always)]
fn below<K: Key>(keys: &[K], key: K) -> usize {
    let (mut lo, mut hi) = (0, keys.len());
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if keys[mid] < key {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

/// The number of keys of the sorted `keys` at or below `key`, searched as [`below`] does.
#[inline(always)]
fn at_most<K: Key>(keys: &[K], key: K) -> usize {
    let (mut lo, mut hi) = (0, keys.len());
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if keys[mid] <= key {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

/// Block sizes and addresses are multiples of this in every set that stays narrow.
const UNIT_BITS: u32 = 9;
/// Narrow keys hold the address as an offset from a base aligned to this many bytes (1 TiB),
/// chosen when the set receives its first block.
const BASE_ALIGN: u64 = 1 << 40;

/// The narrow form of a set's keys: `(size / 512) << 32 | (address - base) / 512`, in one
/// `u64`. It orders blocks exactly as the wide key does, while sizes and addresses are
/// multiples of 512 B (the allocator rounds every block to 512 B) and both quotients stay
/// below 2^32 (blocks under 2 TiB, within 2 TiB of the base). Half the bytes per key: the
/// binary searches compare one word and insertions move 12 bytes per entry instead of 20.
#[derive(Clone, Copy, Debug)]
struct Narrow {
    base: u64,
}

impl Narrow {
    const LOW: u64 = u32::MAX as u64;

    /// The narrow key of a block, if it has one.
    #[inline(always)]
    fn encode(self, key: u128) -> Option<u64> {
        let (size, addr) = ((key >> 64) as u64, key as u64);
        let unit = (1u64 << UNIT_BITS) - 1;
        if (size | addr) & unit != 0 || addr < self.base {
            return None;
        }
        let (s, o) = (size >> UNIT_BITS, (addr - self.base) >> UNIT_BITS);
        // `s < LOW` keeps every stored key below `u64::MAX`, which `bound` uses as "above all".
        (s < Self::LOW && o <= Self::LOW).then_some((s << 32) | o)
    }

    /// The smallest narrow key whose wide key is `>= key` (`u64::MAX` when none is): for every
    /// stored block `k`, `k >= key` exactly when `encode(k) >= bound(key)`, and `k < key`
    /// exactly when `encode(k) < bound(key)`.
    #[inline(always)]
    fn bound(self, key: u128) -> u64 {
        let (size, addr) = ((key >> 64) as u64, key as u64);
        let unit = 1u64 << UNIT_BITS;
        let (s, o) = if !size.is_multiple_of(unit) {
            (size.div_ceil(unit), 0)
        } else if addr <= self.base {
            (size >> UNIT_BITS, 0)
        } else {
            match (addr - self.base).div_ceil(unit) {
                o if o <= Self::LOW => (size >> UNIT_BITS, o),
                _ => ((size >> UNIT_BITS) + 1, 0),
            }
        };
        if s < Self::LOW {
            (s << 32) | o
        } else {
            u64::MAX
        }
    }

    /// The wide key of a narrow one.
    #[inline(always)]
    fn decode(self, key: u64) -> u128 {
        let size = (key >> 32) << UNIT_BITS;
        let addr = self.base + ((key & Self::LOW) << UNIT_BITS);
        (u128::from(size) << 64) | u128::from(addr)
    }
}

/// The free blocks of one (stream, pool), ordered by key `size << 64 | address`, each with
/// its slab index. A set keeps narrow keys while every block it holds has one, and turns
/// wide for good (until it empties) when a block without one arrives: a device whose
/// addresses span more than 2 TiB, or blocks not aligned to 512 B.
#[derive(Debug)]
pub(super) struct FreeSet {
    repr: Repr,
}

#[derive(Debug)]
enum Repr {
    Narrow(Narrow, Chunks<u64>),
    Wide(Chunks<u128>),
}

impl Default for FreeSet {
    fn default() -> Self {
        FreeSet::with_limits(CHUNK_MAX, CHUNK_MIN)
    }
}

impl FreeSet {
    /// A set whose chunks split above `max` entries and join a neighbour below `min`.
    fn with_limits(max: usize, min: usize) -> Self {
        FreeSet {
            repr: Repr::Narrow(Narrow { base: 0 }, Chunks::with_limits(max, min)),
        }
    }

    /// Number of blocks in the set.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        match &self.repr {
            Repr::Narrow(_, c) => c.len(),
            Repr::Wide(c) => c.len(),
        }
    }

    /// Whether the set holds wide keys.
    #[cfg(test)]
    fn is_wide(&self) -> bool {
        matches!(self.repr, Repr::Wide(_))
    }

    /// Number of chunks; panics unless every chunk is non-empty, within the limit, and
    /// listed under its first key.
    #[cfg(test)]
    fn checked_chunks(&self) -> usize {
        fn check<K: Key>(c: &Chunks<K>) -> usize {
            assert!(c.chunks.iter().all(|a| a.len() > 0 && a.len() <= c.max));
            assert_eq!(
                c.firsts,
                c.chunks.iter().map(|a| a.first()).collect::<Vec<_>>()
            );
            c.chunks.len()
        }
        match &self.repr {
            Repr::Narrow(_, c) => check(c),
            Repr::Wide(c) => check(c),
        }
    }

    /// Turns the set wide, keeping every entry (rare: the first block without a narrow key).
    #[cold]
    #[inline(never)]
    fn widen(&mut self) {
        if let Repr::Narrow(n, c) = &self.repr {
            let mut wide = c.empty_like();
            for (k, idx) in c.iter() {
                wide.push_last(n.decode(k), idx);
            }
            self.repr = Repr::Wide(wide);
        }
    }

    /// Files block `idx` under `key` (the key must not be present: keys are unique because
    /// addresses are).
    #[inline(always)]
    pub(super) fn insert(&mut self, key: u128, idx: u32) {
        match &mut self.repr {
            Repr::Narrow(n, c) => {
                if c.is_empty() {
                    n.base = (key as u64) & !(BASE_ALIGN - 1);
                }
                match n.encode(key) {
                    Some(k) => c.insert(k, idx),
                    None => {
                        self.widen();
                        if let Repr::Wide(c) = &mut self.repr {
                            c.insert(key, idx);
                        }
                    }
                }
            }
            Repr::Wide(c) => {
                let narrow = Narrow {
                    base: (key as u64) & !(BASE_ALIGN - 1),
                };
                // An emptied set turns narrow again when its next block allows.
                match c.is_empty().then(|| narrow.encode(key)).flatten() {
                    Some(k) => {
                        let mut chunks = c.empty_like();
                        chunks.insert(k, idx);
                        self.repr = Repr::Narrow(narrow, chunks);
                    }
                    None => c.insert(key, idx),
                }
            }
        }
    }

    /// Removes `key`, returning its block index if it was present.
    #[inline(always)]
    pub(super) fn remove(&mut self, key: u128) -> Option<u32> {
        match &mut self.repr {
            Repr::Narrow(n, c) => c.remove(n.encode(key)?),
            Repr::Wide(c) => c.remove(key),
        }
    }

    /// Removes `old` (which must be present) and files `idx` under `new` (which must not be).
    #[inline]
    pub(super) fn replace(&mut self, old: u128, new: u128, idx: u32) {
        match &mut self.repr {
            Repr::Narrow(n, c) => match (n.encode(old), n.encode(new)) {
                (Some(o), Some(k)) => c.replace(o, k, idx),
                _ => {
                    let was = self.remove(old);
                    debug_assert!(was.is_some(), "replaced key not in the set");
                    self.insert(new, idx);
                }
            },
            Repr::Wide(c) => c.replace(old, new, idx),
        }
    }

    /// The first entry with `lo <= key < hi` (best fit), left in the set.
    #[inline(always)]
    pub(super) fn first_in(&self, lo: u128, hi: u128) -> Option<Found> {
        match &self.repr {
            Repr::Narrow(n, c) => c.first_in(n.bound(lo), n.bound(hi)),
            Repr::Wide(c) => c.first_in(lo, hi),
        }
    }

    /// The key of the entry `found`.
    #[inline]
    pub(super) fn key_of(&self, found: Found) -> u128 {
        match &self.repr {
            Repr::Narrow(n, c) => n.decode(c.key_of(found)),
            Repr::Wide(c) => c.key_of(found),
        }
    }

    /// The entry after `found` in key order.
    #[inline]
    pub(super) fn next(&self, found: Found) -> Option<Found> {
        match &self.repr {
            Repr::Narrow(_, c) => c.next(found),
            Repr::Wide(c) => c.next(found),
        }
    }

    /// Re-files the entry `found` under `new` with block index `idx`.
    #[inline(always)]
    pub(super) fn replace_found(&mut self, found: Found, new: u128, idx: u32) {
        match &mut self.repr {
            Repr::Narrow(n, c) => match n.encode(new) {
                Some(k) => c.replace_found(found, k, idx),
                None => {
                    c.remove_found(found);
                    self.insert(new, idx);
                }
            },
            Repr::Wide(c) => c.replace_found(found, new, idx),
        }
    }

    /// Removes the entry `found`.
    #[inline(always)]
    pub(super) fn remove_found(&mut self, found: Found) {
        match &mut self.repr {
            Repr::Narrow(_, c) => c.remove_found(found),
            Repr::Wide(c) => c.remove_found(found),
        }
    }

    /// The block index filed under `key`.
    pub(super) fn get(&self, key: &u128) -> Option<&u32> {
        match &self.repr {
            Repr::Narrow(n, c) => c.get(&n.encode(*key)?),
            Repr::Wide(c) => c.get(key),
        }
    }

    /// The first entry with key `>= lo`.
    pub(super) fn first_from(&self, lo: u128) -> Option<(u128, u32)> {
        match &self.repr {
            Repr::Narrow(n, c) => c.first_from(n.bound(lo)).map(|(k, i)| (n.decode(k), i)),
            Repr::Wide(c) => c.first_from(lo),
        }
    }

    /// Entries with key `< hi`, largest key first.
    pub(super) fn below_rev(&self, hi: u128) -> Box<dyn Iterator<Item = (u128, u32)> + '_> {
        match &self.repr {
            Repr::Narrow(n, c) => {
                let n = *n;
                Box::new(c.below_rev(n.bound(hi)).map(move |(k, i)| (n.decode(k), i)))
            }
            Repr::Wide(c) => Box::new(c.below_rev(hi)),
        }
    }

    /// Every entry in key order.
    pub(super) fn iter(&self) -> Box<dyn Iterator<Item = (u128, u32)> + '_> {
        match &self.repr {
            Repr::Narrow(n, c) => {
                let n = *n;
                Box::new(c.iter().map(move |(k, i)| (n.decode(k), i)))
            }
            Repr::Wide(c) => Box::new(c.iter()),
        }
    }
}

/// A best-fit entry found by [`FreeSet::first_in`], still in the set: valid for
/// [`FreeSet::replace_found`] and [`FreeSet::remove_found`] until the set next changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Found {
    /// The block's slab index.
    pub(super) idx: u32,
    chunk: usize,
    pos: usize,
}

/// Keys in order, each with a slab index: sorted chunks, each chunk's keys above the previous
/// chunk's.
#[derive(Debug)]
struct Chunks<K> {
    /// The first key of each chunk (`firsts[c] == chunks[c].keys[0]`).
    firsts: Vec<K>,
    /// Never empty chunks, in key order.
    chunks: Vec<SortedArray<K>>,
    max: usize,
    min: usize,
}

impl<K: Key> Chunks<K> {
    /// A set whose chunks split above `max` entries and join a neighbour below `min`.
    fn with_limits(max: usize, min: usize) -> Self {
        assert!(2 <= max && min < max / 2 && max + min <= CAP);
        Chunks {
            firsts: Vec::new(),
            chunks: Vec::new(),
            max,
            min,
        }
    }

    /// Whether the set is empty.
    #[inline(always)]
    fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// An empty set of another key type with the same chunk limits.
    fn empty_like<J: Key>(&self) -> Chunks<J> {
        Chunks::with_limits(self.max, self.min)
    }

    /// Appends `key`, which is above every key in the set (building a set in order).
    fn push_last(&mut self, key: K, idx: u32) {
        match self.chunks.last_mut() {
            Some(last) if last.len() < self.max => last.insert_at(last.len(), key, idx),
            _ => {
                let mut chunk = SortedArray::default();
                chunk.insert_at(0, key, idx);
                self.chunks.push(chunk);
                self.firsts.push(key);
            }
        }
    }

    /// Number of blocks in the set.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.chunks.iter().map(SortedArray::<K>::len).sum()
    }

    /// The chunk where `key` belongs: the last one whose first key is at most `key` (chunk 0
    /// for keys below every chunk, and for an empty set).
    #[inline(always)]
    fn chunk_for(&self, key: K) -> usize {
        if self.firsts.len() <= 1 {
            return 0;
        }
        at_most(&self.firsts, key).saturating_sub(1)
    }

    /// Splits chunk `c` in two if it grew past the limit.
    #[inline(always)]
    fn after_grow(&mut self, c: usize) {
        let chunk = &self.chunks[c];
        self.firsts[c] = chunk.first();
        if chunk.len() > self.max {
            self.split(c);
        }
    }

    /// Splits chunk `c` in two halves (rare: once per `max / 2` insertions at most).
    #[cold]
    #[inline(never)]
    fn split(&mut self, c: usize) {
        let chunk = &mut self.chunks[c];
        let half = chunk.len() / 2;
        let tail = chunk.split_off(half);
        self.firsts.insert(c + 1, tail.first());
        self.chunks.insert(c + 1, tail);
    }

    /// Drops chunk `c` if it emptied, or joins it to a neighbour if it is too small.
    #[inline(always)]
    fn after_shrink(&mut self, c: usize) {
        let len = self.chunks[c].len();
        if len == 0 || (len < self.min && self.chunks.len() > 1) {
            self.shrink(c);
        } else {
            self.firsts[c] = self.chunks[c].first();
        }
    }

    /// [`after_shrink`](Self::after_shrink)'s rare cases: drops an empty chunk, or joins a
    /// small one to a neighbour.
    #[cold]
    #[inline(never)]
    fn shrink(&mut self, c: usize) {
        let len = self.chunks[c].len();
        if len == 0 {
            self.chunks.remove(c);
            self.firsts.remove(c);
            return;
        }
        self.firsts[c] = self.chunks[c].first();
        let a = if c + 1 < self.chunks.len() { c } else { c - 1 };
        let b = self.chunks.remove(a + 1);
        self.firsts.remove(a + 1);
        let chunk = &mut self.chunks[a];
        chunk.append(&b);
        self.after_grow(a);
    }

    /// Files block `idx` under `key` (the key must not be present: keys are unique because
    /// addresses are).
    #[inline(always)]
    fn insert(&mut self, key: K, idx: u32) {
        if self.chunks.is_empty() {
            self.chunks.push(SortedArray::default());
            self.firsts.push(key);
        }
        let c = self.chunk_for(key);
        self.chunks[c].insert(key, idx);
        self.after_grow(c);
    }

    /// Removes `key`, returning its block index if it was present.
    #[inline(always)]
    fn remove(&mut self, key: K) -> Option<u32> {
        let c = self.chunk_for(key);
        let r = self.chunks.get_mut(c)?.remove(key);
        if r.is_some() {
            self.after_shrink(c);
        }
        r
    }

    /// Removes `old` (which must be present) and files `idx` under `new` (which must not be).
    #[inline]
    fn replace(&mut self, old: K, new: K, idx: u32) {
        let c = self.chunk_for(old);
        if self.chunk_for(new) == c {
            self.chunks[c].replace(old, new, idx);
            self.firsts[c] = self.chunks[c].first();
        } else {
            let was = self.remove(old);
            debug_assert!(was.is_some(), "replaced key not in the set");
            self.insert(new, idx);
        }
    }

    /// The first entry with key `>= lo`: its chunk and position.
    #[inline(always)]
    fn lower_bound(&self, lo: K) -> Option<(usize, usize)> {
        let c = self.chunk_for(lo);
        let chunk = self.chunks.get(c)?;
        let pos = chunk.lower_bound(lo);
        if pos < chunk.len() {
            Some((c, pos))
        } else if c + 1 < self.chunks.len() {
            Some((c + 1, 0))
        } else {
            None
        }
    }

    /// The first entry with `lo <= key < hi` (best fit), left in the set.
    #[inline(always)]
    fn first_in(&self, lo: K, hi: K) -> Option<Found> {
        let (chunk, pos) = self.lower_bound(lo)?;
        let a = &self.chunks[chunk];
        (a.key(pos) < hi).then(|| Found {
            idx: a.idx(pos),
            chunk,
            pos,
        })
    }

    /// The key of the entry `found`.
    #[inline]
    fn key_of(&self, found: Found) -> K {
        self.chunks[found.chunk].key(found.pos)
    }

    /// The entry after `found` in key order.
    #[inline]
    fn next(&self, found: Found) -> Option<Found> {
        let (chunk, pos) = if found.pos + 1 < self.chunks[found.chunk].len() {
            (found.chunk, found.pos + 1)
        } else if found.chunk + 1 < self.chunks.len() {
            (found.chunk + 1, 0)
        } else {
            return None;
        };
        Some(Found {
            idx: self.chunks[chunk].idx(pos),
            chunk,
            pos,
        })
    }

    /// Re-files the entry `found` under `new` with block index `idx`.
    #[inline(always)]
    fn replace_found(&mut self, found: Found, new: K, idx: u32) {
        let c = found.chunk;
        if self.chunk_for(new) == c {
            self.chunks[c].replace_at(found.pos, new, idx);
            self.firsts[c] = self.chunks[c].first();
        } else {
            self.remove_found(found);
            self.insert(new, idx);
        }
    }

    /// Removes the entry `found`.
    #[inline(always)]
    fn remove_found(&mut self, found: Found) {
        self.chunks[found.chunk].remove_at(found.pos);
        self.after_shrink(found.chunk);
    }

    /// The block index filed under `key`.
    fn get(&self, key: &K) -> Option<&u32> {
        self.chunks.get(self.chunk_for(*key))?.get(key)
    }

    /// The first entry with key `>= lo`.
    fn first_from(&self, lo: K) -> Option<(K, u32)> {
        let (c, pos) = self.lower_bound(lo)?;
        let a = &self.chunks[c];
        Some((a.key(pos), a.idx(pos)))
    }

    /// Entries with key `< hi`, largest key first.
    fn below_rev(&self, hi: K) -> impl Iterator<Item = (K, u32)> + '_ {
        let c = self.chunk_for(hi);
        let first = self.chunks.get(c).map(|a| a.below_rev(hi));
        let rest = self.chunks[..c.min(self.chunks.len())]
            .iter()
            .rev()
            .flat_map(|a| a.below_rev(K::MAX));
        first.into_iter().flatten().chain(rest)
    }

    /// Every entry in key order.
    fn iter(&self) -> impl Iterator<Item = (K, u32)> + '_ {
        self.chunks.iter().flat_map(SortedArray::<K>::iter)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn best_fit_and_removal() {
        let mut s = FreeSet::default();
        s.insert(30, 3);
        s.insert(10, 1);
        s.insert(20, 2);
        assert_eq!(s.len(), 3);
        assert_eq!(
            s.iter().collect::<Vec<_>>(),
            vec![(10, 1), (20, 2), (30, 3)]
        );
        let found = s.first_in(11, 30).expect("20 is in range");
        assert_eq!(found.idx, 2);
        assert_eq!(s.key_of(found), 20);
        let after = s.next(found).expect("30 follows");
        assert_eq!((after.idx, s.key_of(after)), (3, 30));
        assert_eq!(s.next(after), None);
        s.replace_found(found, 5, 2); // moves down past 10
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![(5, 2), (10, 1), (30, 3)]);
        s.replace(5, 40, 4); // moves up past 10 and 30
        assert_eq!(
            s.iter().collect::<Vec<_>>(),
            vec![(10, 1), (30, 3), (40, 4)]
        );
        s.replace(40, 20, 2); // moves down past 30
        s.replace(20, 25, 2); // stays in place
        assert_eq!(
            s.iter().collect::<Vec<_>>(),
            vec![(10, 1), (25, 2), (30, 3)]
        );
        assert_eq!(s.remove(25), Some(2));
        assert_eq!(s.first_in(11, 30), None);
        assert_eq!(s.first_from(11), Some((30, 3)));
        assert_eq!(s.first_from(31), None);
        assert_eq!(s.get(&10), Some(&1));
        assert_eq!(s.get(&11), None);
        assert_eq!(s.remove(11), None);
        assert_eq!(s.remove(10), Some(1));
        assert_eq!(s.below_rev(31).collect::<Vec<_>>(), vec![(30, 3)]);
        assert_eq!(s.below_rev(30).count(), 0);
    }

    /// Keys of small sizes and addresses: almost none has a narrow form, so the set is wide.
    fn tiny(size: u64, addr: u64) -> u128 {
        u128::from(size) << 64 | u128::from(addr)
    }

    /// Keys as the allocator makes them on a simulated device: 512-byte units from its base.
    fn aligned(size: u64, addr: u64) -> u128 {
        u128::from(size * 512) << 64 | u128::from(0x7f00_0000_0000 + addr * 512)
    }

    /// Aligned keys except one address in sixteen, which has no narrow form: the set turns
    /// wide when one arrives, and narrow again once it empties.
    fn mixed(size: u64, addr: u64) -> u128 {
        aligned(size, addr) + u128::from(addr == 15) * 8
    }

    /// The set answers every query exactly as an ordered map would, over a long pseudo-random
    /// sequence of insertions, removals and best-fit takes, with wide keys, narrow keys, and
    /// sets that change between the two.
    #[test]
    fn agrees_with_an_ordered_map() {
        for shape in [tiny, aligned, mixed] {
            // Small chunks, so that chunks split and join many times during the run.
            let (splits, joins, _) = agree(FreeSet::with_limits(8, 2), shape);
            assert!(
                splits >= 4 && joins >= 4,
                "only {splits} splits and {joins} joins"
            );
            agree(FreeSet::default(), shape);
        }
        let (_, _, ends) = agree(FreeSet::default(), aligned);
        assert_eq!(ends, (20_000, 0), "aligned keys stay narrow");
        let (_, _, (narrow, wide)) = agree(FreeSet::default(), mixed);
        assert!(
            narrow > 0 && wide > 1_000,
            "the mixed run spent {narrow} steps narrow and {wide} wide"
        );
    }

    /// A set turns wide when a block without a narrow key arrives, keeps every entry in
    /// order, and turns narrow again when it has emptied and the next block allows.
    #[test]
    fn turns_wide_and_back() {
        let mut s = FreeSet::default();
        for i in 0..100 {
            s.insert(aligned(i % 7 + 1, i), i as u32);
        }
        assert!(!s.is_wide());
        let odd = aligned(3, 200) + 8;
        s.insert(odd, 999);
        assert!(s.is_wide());
        assert_eq!(s.len(), 101);
        assert_eq!(s.get(&odd), Some(&999));
        let found = s
            .first_in(aligned(3, 0), aligned(4, 0))
            .expect("size 3 blocks");
        assert_eq!(s.key_of(found), aligned(3, 2));
        let keys: Vec<u128> = s.iter().map(|(k, _)| k).collect();
        assert!(keys.windows(2).all(|w| w[0] < w[1]));
        for k in keys {
            assert!(s.remove(k).is_some());
        }
        s.insert(aligned(5, 5), 1);
        assert!(!s.is_wide(), "an emptied set turns narrow again");
        s.replace(aligned(5, 5), aligned(5, 6) + 8, 2);
        assert!(
            s.is_wide(),
            "a re-filed block without a narrow key widens the set"
        );
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![(aligned(5, 6) + 8, 2)]);
    }

    /// A narrow key orders blocks as the wide one does, and a bound of any wide key (sizes
    /// and addresses not multiples of 512, below the base, past the narrow range) splits
    /// the blocks where the wide key does.
    #[test]
    fn narrow_keys_keep_the_order() {
        let n = Narrow {
            base: 0x7e00_0000_0000,
        };
        let blocks: Vec<u128> = [0u64, 512, 1024, 2 << 20, (1 << 41) - 1024]
            .iter()
            .flat_map(|&size| {
                [0u64, 512, 4096, (1 << 41) - 512]
                    .map(move |off| u128::from(size) << 64 | u128::from(n.base + off))
            })
            .collect();
        for &b in &blocks {
            let k = n
                .encode(b)
                .expect("an aligned block within 2 TiB of the base");
            assert_eq!(n.decode(k), b);
        }
        assert_eq!(n.encode(u128::from(n.base + (1 << 41)) | 512 << 64), None);
        assert_eq!(n.encode(u128::from(n.base + 8) | 512 << 64), None);
        assert_eq!(n.encode(u128::from(n.base - 512) | 512 << 64), None);
        assert_eq!(n.encode(u128::from(n.base) | 1 << 105), None);
        let mut probes = blocks.clone();
        for &b in &blocks {
            for d in [1u128, 511, 512, 513] {
                probes.push(b + d);
                probes.push(b.saturating_sub(d));
                probes.push(b + (d << 64));
                probes.push(b.saturating_sub(d << 64));
            }
        }
        probes.extend([0, u128::MAX, u128::from(u64::MAX) << 64]);
        for &q in &probes {
            let bound = n.bound(q);
            for &b in &blocks {
                let k = n.encode(b).expect("encodable");
                assert_eq!(b >= q, k >= bound, "block {b:#x} against probe {q:#x}");
            }
        }
    }

    /// Runs the comparison with keys made by `shape(size, address)` from small numbers;
    /// returns how many times the set gained and lost chunks, and how many steps it ended
    /// narrow and wide.
    fn agree(mut s: FreeSet, shape: fn(u64, u64) -> u128) -> (u32, u32, (u32, u32)) {
        let mut ends = (0, 0);
        let mut m: BTreeMap<u128, u32> = BTreeMap::new();
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let (mut splits, mut joins) = (0, 0);
        let mut chunks = 0;
        for step in 0..20_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let key = shape(x % 16, (x >> 8) % 16);
            // Alternate growing phases (half the operations insert) with draining ones (one
            // in eight), so the set grows and shrinks across both limits.
            let draining = (step / 500) % 2 == 1;
            let op = if draining {
                [0, 2, 2, 3, 3, 3, 3, 3][(x % 8) as usize]
            } else {
                x % 4
            };
            match op {
                0 | 1 => {
                    if let std::collections::btree_map::Entry::Vacant(e) = m.entry(key) {
                        e.insert(step);
                        s.insert(key, step);
                    }
                }
                2 => assert_eq!(s.remove(key), m.remove(&key)),
                _ => {
                    // Best fit, then re-file the found entry under a fresh key (a split or a
                    // merge), or take it out.
                    let hi = shape(x % 16 + (x >> 20) % 8, (x >> 8) % 16);
                    let want = m.range(key..hi).next().map(|(&k, &v)| (k, v));
                    let found = s.first_in(key, hi);
                    assert_eq!(found.map(|f| f.idx), want.map(|(_, v)| v));
                    if let (Some((k, _)), Some(f)) = (want, found) {
                        assert_eq!(s.key_of(f), k);
                        let after = m.range(k + 1..).next().map(|(&k, &v)| (k, v));
                        assert_eq!(s.next(f).map(|n| (s.key_of(n), n.idx)), after);
                    }
                    if let (Some((k, v)), Some(found)) = (want, found) {
                        m.remove(&k);
                        let new = shape((x >> 30) % 16, (x >> 40) % 16);
                        let refile = !draining && x & (1 << 50) != 0 && !m.contains_key(&new);
                        match (refile, x & (1 << 51) != 0) {
                            (true, true) => s.replace_found(found, new, step),
                            (true, false) => s.replace(k, new, step),
                            (false, true) => s.remove_found(found),
                            (false, false) => assert_eq!(s.remove(k), Some(v)),
                        }
                        if refile {
                            m.insert(new, step);
                        }
                    }
                }
            }
            assert_eq!(
                s.first_from(key),
                m.range(key..).next().map(|(&k, &v)| (k, v))
            );
            assert_eq!(
                s.below_rev(key).collect::<Vec<_>>(),
                m.range(..key)
                    .rev()
                    .map(|(&k, &v)| (k, v))
                    .collect::<Vec<_>>()
            );
            // A bound between keys (a byte past or before one, in size or in address).
            let q = match (x >> 56) % 4 {
                0 => key + 1,
                1 => key.saturating_sub(1),
                2 => key + (1 << 64),
                _ => key.saturating_sub(1 << 64),
            };
            assert_eq!(s.first_from(q), m.range(q..).next().map(|(&k, &v)| (k, v)));
            assert_eq!(
                s.below_rev(q).next(),
                m.range(..q).next_back().map(|(&k, &v)| (k, v))
            );
            assert_eq!(s.len(), m.len());
            if s.is_wide() {
                ends.1 += 1;
            } else {
                ends.0 += 1;
            }
            let now = s.checked_chunks();
            splits += u32::from(now > chunks);
            joins += u32::from(now < chunks);
            chunks = now;
        }
        assert_eq!(
            s.iter().collect::<Vec<_>>(),
            m.iter().map(|(&k, &v)| (k, v)).collect::<Vec<_>>()
        );
        (splits, joins, ends)
    }
}
