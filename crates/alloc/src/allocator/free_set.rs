//! [`FreeSet`]: the cached free blocks of one (stream, pool), ordered by (size, address).
//!
//! The allocator's hot path is "best fit": the first block whose key `size << 64 | address` is
//! at or after `request << 64`, then a removal; frees do one insertion and one removal per
//! merged neighbour. A free set holds a few hundred blocks in most training workloads, and
//! for sets of that size a sorted array beats a B-tree: a lookup is a branch-free binary
//! search over one contiguous array (no per-node linear scans, no pointer chasing) and an
//! insertion or removal is one `memmove` of the tail. Keys and block indices are kept in two
//! parallel vectors so that the searched array holds keys only (16 bytes each, no padding). A
//! split or a merge re-files one entry in place of another ([`FreeSet::replace`]), moving only
//! the entries between the two positions.
//!
//! Deep models hold tens of thousands of cached blocks in one set, where one array would move
//! too much per insertion. The set is therefore a sequence of sorted arrays (chunks) of at
//! most [`CHUNK_MAX`] entries, with the first key of each chunk in a small array of its own
//! that is searched first: every operation is two binary searches and a move of at most one
//! chunk, so its cost hardly grows with the set (a set of up to [`CHUNK_MAX`] blocks is one
//! chunk, the plain sorted array). A chunk that fills up splits in two; one that drops below
//! [`CHUNK_MIN`] entries joins a neighbour.

/// A chunk that grows past this many entries splits in two.
const CHUNK_MAX: usize = 128;
/// A chunk that shrinks below this many entries joins a neighbour (`CHUNK_MAX / 8`, so that
/// a chunk just split needs many removals before it joins again).
const CHUNK_MIN: usize = CHUNK_MAX / 8;

/// A sorted array of keys `size << 64 | address` with each block's slab index beside its key.
#[derive(Debug, Default)]
struct SortedArray {
    keys: Vec<u128>,
    idxs: Vec<u32>,
}

impl SortedArray {
    /// Position of the first key `>= key`.
    #[inline]
    fn lower_bound(&self, key: u128) -> usize {
        self.keys.partition_point(|&k| k < key)
    }

    /// Number of blocks in the set.
    fn len(&self) -> usize {
        self.keys.len()
    }

    /// Files block `idx` under `key` (the key must not be present: keys are unique because
    /// addresses are).
    #[inline]
    fn insert(&mut self, key: u128, idx: u32) {
        let i = self.lower_bound(key);
        debug_assert!(self.keys.get(i) != Some(&key), "duplicate free-set key");
        self.keys.insert(i, key);
        self.idxs.insert(i, idx);
    }

    /// Removes `key`, returning its block index if it was present.
    #[inline]
    fn remove(&mut self, key: u128) -> Option<u32> {
        let i = self.lower_bound(key);
        if self.keys.get(i) == Some(&key) {
            self.keys.remove(i);
            Some(self.idxs.remove(i))
        } else {
            None
        }
    }

    /// Re-files an entry: removes `old` (which must be present) and files `idx` under `new`
    /// (which must not be), moving only the entries between the two positions. This is the
    /// common shape of a split (the found block leaves, its remainder arrives) and of a merge
    /// (a free neighbour leaves, the merged block arrives).
    #[inline]
    fn replace(&mut self, old: u128, new: u128, idx: u32) {
        let i = self.lower_bound(old);
        debug_assert!(
            self.keys.get(i) == Some(&old),
            "replaced key not in the set"
        );
        self.replace_at(i, new, idx);
    }

    /// [`replace`](Self::replace) for the entry at position `pos`.
    #[inline]
    fn replace_at(&mut self, pos: usize, new: u128, idx: u32) {
        let (i, old) = (pos, self.keys[pos]);
        // Search only the side of `i` where `new` belongs.
        let j = if new > old {
            i + 1 + self.keys[i + 1..].partition_point(|&k| k < new)
        } else {
            self.keys[..i].partition_point(|&k| k < new)
        };
        // (`new == old` finds `old` itself at `j == i`: re-filing under the same key is fine.)
        debug_assert!(
            new == old || self.keys.get(j) != Some(&new),
            "duplicate free-set key"
        );
        // `j` is the insertion point with `old` still present. Entries strictly between the
        // two positions shift by one towards the hole left by `old`.
        let at = if j > i {
            self.keys.copy_within(i + 1..j, i);
            self.idxs.copy_within(i + 1..j, i);
            j - 1
        } else {
            self.keys.copy_within(j..i, j + 1);
            self.idxs.copy_within(j..i, j + 1);
            j
        };
        self.keys[at] = new;
        self.idxs[at] = idx;
    }

    /// Removes the entry at position `pos`.
    #[inline]
    fn remove_at(&mut self, pos: usize) {
        self.keys.remove(pos);
        self.idxs.remove(pos);
    }

    /// The block index filed under `key`.
    fn get(&self, key: &u128) -> Option<&u32> {
        let i = self.lower_bound(*key);
        if self.keys.get(i) == Some(key) {
            self.idxs.get(i)
        } else {
            None
        }
    }

    /// Entries with key `< hi`, largest key first.
    fn below_rev(&self, hi: u128) -> impl Iterator<Item = (u128, u32)> + '_ {
        let i = self.lower_bound(hi);
        self.keys[..i]
            .iter()
            .copied()
            .zip(self.idxs[..i].iter().copied())
            .rev()
    }

    /// Every entry in key order.
    fn iter(&self) -> impl Iterator<Item = (u128, u32)> + '_ {
        self.keys.iter().copied().zip(self.idxs.iter().copied())
    }
}

/// The free blocks of one (stream, pool), ordered by key `size << 64 | address`, each with
/// its slab index: sorted chunks, each chunk's keys above the previous chunk's.
#[derive(Debug)]
pub(super) struct FreeSet {
    /// The first key of each chunk (`firsts[c] == chunks[c].keys[0]`).
    firsts: Vec<u128>,
    /// Never empty chunks, in key order.
    chunks: Vec<SortedArray>,
    max: usize,
    min: usize,
}

impl Default for FreeSet {
    fn default() -> Self {
        FreeSet::with_limits(CHUNK_MAX, CHUNK_MIN)
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

impl FreeSet {
    /// A set whose chunks split above `max` entries and join a neighbour below `min`.
    fn with_limits(max: usize, min: usize) -> Self {
        debug_assert!(2 <= max && min < max / 2);
        FreeSet {
            firsts: Vec::new(),
            chunks: Vec::new(),
            max,
            min,
        }
    }

    /// Number of blocks in the set.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.chunks.iter().map(SortedArray::len).sum()
    }

    /// The chunk where `key` belongs: the last one whose first key is at most `key` (chunk 0
    /// for keys below every chunk, and for an empty set).
    #[inline(always)]
    fn chunk_for(&self, key: u128) -> usize {
        if self.firsts.len() <= 1 {
            return 0;
        }
        self.firsts.partition_point(|&f| f <= key).saturating_sub(1)
    }

    /// Splits chunk `c` in two if it grew past the limit.
    #[inline(always)]
    fn after_grow(&mut self, c: usize) {
        let chunk = &self.chunks[c];
        self.firsts[c] = chunk.keys[0];
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
        let tail = SortedArray {
            keys: chunk.keys.split_off(half),
            idxs: chunk.idxs.split_off(half),
        };
        self.firsts.insert(c + 1, tail.keys[0]);
        self.chunks.insert(c + 1, tail);
    }

    /// Drops chunk `c` if it emptied, or joins it to a neighbour if it is too small.
    #[inline(always)]
    fn after_shrink(&mut self, c: usize) {
        let len = self.chunks[c].len();
        if len == 0 || (len < self.min && self.chunks.len() > 1) {
            self.shrink(c);
        } else {
            self.firsts[c] = self.chunks[c].keys[0];
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
        self.firsts[c] = self.chunks[c].keys[0];
        let a = if c + 1 < self.chunks.len() { c } else { c - 1 };
        let b = self.chunks.remove(a + 1);
        self.firsts.remove(a + 1);
        let chunk = &mut self.chunks[a];
        chunk.keys.extend_from_slice(&b.keys);
        chunk.idxs.extend_from_slice(&b.idxs);
        self.after_grow(a);
    }

    /// Files block `idx` under `key` (the key must not be present: keys are unique because
    /// addresses are).
    #[inline(always)]
    pub(super) fn insert(&mut self, key: u128, idx: u32) {
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
    pub(super) fn remove(&mut self, key: u128) -> Option<u32> {
        let c = self.chunk_for(key);
        let r = self.chunks.get_mut(c)?.remove(key);
        if r.is_some() {
            self.after_shrink(c);
        }
        r
    }

    /// Removes `old` (which must be present) and files `idx` under `new` (which must not be).
    #[inline]
    pub(super) fn replace(&mut self, old: u128, new: u128, idx: u32) {
        let c = self.chunk_for(old);
        if self.chunk_for(new) == c {
            self.chunks[c].replace(old, new, idx);
            self.firsts[c] = self.chunks[c].keys[0];
        } else {
            let was = self.remove(old);
            debug_assert!(was.is_some(), "replaced key not in the set");
            self.insert(new, idx);
        }
    }

    /// The first entry with key `>= lo`: its chunk and position.
    #[inline(always)]
    fn lower_bound(&self, lo: u128) -> Option<(usize, usize)> {
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
    pub(super) fn first_in(&self, lo: u128, hi: u128) -> Option<Found> {
        let (chunk, pos) = self.lower_bound(lo)?;
        let a = &self.chunks[chunk];
        (a.keys[pos] < hi).then(|| Found {
            idx: a.idxs[pos],
            chunk,
            pos,
        })
    }

    /// The key of the entry `found`.
    #[inline]
    pub(super) fn key_of(&self, found: Found) -> u128 {
        self.chunks[found.chunk].keys[found.pos]
    }

    /// The entry after `found` in key order.
    #[inline]
    pub(super) fn next(&self, found: Found) -> Option<Found> {
        let (chunk, pos) = if found.pos + 1 < self.chunks[found.chunk].len() {
            (found.chunk, found.pos + 1)
        } else if found.chunk + 1 < self.chunks.len() {
            (found.chunk + 1, 0)
        } else {
            return None;
        };
        Some(Found {
            idx: self.chunks[chunk].idxs[pos],
            chunk,
            pos,
        })
    }

    /// Re-files the entry `found` under `new` with block index `idx`.
    #[inline(always)]
    pub(super) fn replace_found(&mut self, found: Found, new: u128, idx: u32) {
        let c = found.chunk;
        if self.chunk_for(new) == c {
            self.chunks[c].replace_at(found.pos, new, idx);
            self.firsts[c] = self.chunks[c].keys[0];
        } else {
            self.remove_found(found);
            self.insert(new, idx);
        }
    }

    /// Removes the entry `found`.
    #[inline(always)]
    pub(super) fn remove_found(&mut self, found: Found) {
        self.chunks[found.chunk].remove_at(found.pos);
        self.after_shrink(found.chunk);
    }

    /// The block index filed under `key`.
    pub(super) fn get(&self, key: &u128) -> Option<&u32> {
        self.chunks.get(self.chunk_for(*key))?.get(key)
    }

    /// The first entry with key `>= lo`.
    pub(super) fn first_from(&self, lo: u128) -> Option<(u128, u32)> {
        let (c, pos) = self.lower_bound(lo)?;
        let a = &self.chunks[c];
        Some((a.keys[pos], a.idxs[pos]))
    }

    /// Entries with key `< hi`, largest key first.
    pub(super) fn below_rev(&self, hi: u128) -> impl Iterator<Item = (u128, u32)> + '_ {
        let c = self.chunk_for(hi);
        let first = self.chunks.get(c).map(|a| a.below_rev(hi));
        let rest = self.chunks[..c.min(self.chunks.len())]
            .iter()
            .rev()
            .flat_map(|a| a.below_rev(u128::MAX));
        first.into_iter().flatten().chain(rest)
    }

    /// Every entry in key order.
    pub(super) fn iter(&self) -> impl Iterator<Item = (u128, u32)> + '_ {
        self.chunks.iter().flat_map(SortedArray::iter)
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

    /// The sorted array answers every query exactly as an ordered map would, over a long
    /// pseudo-random sequence of insertions, removals and best-fit takes.
    #[test]
    fn agrees_with_an_ordered_map() {
        // Small chunks, so that chunks split and join many times during the run.
        let (splits, joins) = agree(FreeSet::with_limits(8, 2));
        assert!(
            splits >= 4 && joins >= 4,
            "only {splits} splits and {joins} joins"
        );
        agree(FreeSet::default());
    }

    /// Runs the comparison; returns how many times the set gained and lost chunks.
    fn agree(mut s: FreeSet) -> (u32, u32) {
        let mut m: BTreeMap<u128, u32> = BTreeMap::new();
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let (mut splits, mut joins) = (0, 0);
        let mut chunks = 0;
        for step in 0..20_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let key = u128::from(x % 16) << 64 | u128::from((x >> 8) % 16);
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
                    let hi = key + (u128::from((x >> 20) % 8) << 64);
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
                        let new = u128::from((x >> 30) % 16) << 64 | u128::from((x >> 40) % 16);
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
            assert_eq!(s.len(), m.len());
            assert!(
                s.chunks
                    .iter()
                    .all(|c| !c.keys.is_empty() && c.len() <= s.max)
            );
            assert_eq!(
                s.firsts,
                s.chunks.iter().map(|c| c.keys[0]).collect::<Vec<_>>()
            );
            splits += u32::from(s.chunks.len() > chunks);
            joins += u32::from(s.chunks.len() < chunks);
            chunks = s.chunks.len();
        }
        assert_eq!(
            s.iter().collect::<Vec<_>>(),
            m.iter().map(|(&k, &v)| (k, v)).collect::<Vec<_>>()
        );
        (splits, joins)
    }
}
