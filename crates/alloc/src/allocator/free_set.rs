//! [`FreeSet`]: the cached free blocks of one (stream, pool), ordered by (size, address).
//!
//! The allocator's hot path is "best fit": the first block whose key `size << 64 | address` is
//! at or after `request << 64`, then a removal; frees do one insertion and one removal per
//! merged neighbour. A free set holds a few hundred blocks in training workloads, and for
//! sets of that size a sorted array beats a B-tree: a lookup is a branch-free binary search
//! over one contiguous array (no per-node linear scans, no pointer chasing) and an insertion
//! or removal is one `memmove` of the tail. Keys and block indices are kept in two parallel
//! vectors so that the searched array holds keys only (16 bytes each, no padding). A split or
//! a merge re-files one entry in place of another ([`FreeSet::replace`]), moving only the
//! entries between the two positions.
//!
//! Insertion and removal in an array are O(n) moves, so a set that grows past
//! [`TO_TREE`] entries switches to a B-tree (O(log n) per operation), and switches back
//! below [`TO_ARRAY`] (the gap keeps a set near the boundary from switching back and forth).
//! Both forms give the same answers; only the cost differs.

use std::collections::BTreeMap;

/// Above this many entries a free set becomes a B-tree.
const TO_TREE: usize = 2048;
/// Below this many entries a B-tree free set becomes an array again.
const TO_ARRAY: usize = 512;

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

    /// [`replace`](Self::replace) for the entry at position `pos` (as returned by
    /// [`first_in`](Self::first_in), with no change to the set in between).
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

    /// The first entry with `lo <= key < hi` (best fit), left in the set: its block index
    /// and its position (valid for [`replace_at`](Self::replace_at) and
    /// [`remove_at`](Self::remove_at) until the set next changes).
    #[inline]
    fn first_in(&self, lo: u128, hi: u128) -> Option<(u32, usize)> {
        let i = self.lower_bound(lo);
        match self.keys.get(i) {
            Some(&k) if k < hi => Some((self.idxs[i], i)),
            _ => None,
        }
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

    /// The first entry with key `>= lo`.
    fn first_from(&self, lo: u128) -> Option<(u128, u32)> {
        let i = self.lower_bound(lo);
        Some((*self.keys.get(i)?, self.idxs[i]))
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

/// The form a free set currently has.
#[derive(Debug)]
enum Repr {
    Array(SortedArray),
    Tree(BTreeMap<u128, u32>),
}

/// The free blocks of one (stream, pool), ordered by key `size << 64 | address`, each with
/// its slab index.
#[derive(Debug)]
pub(super) struct FreeSet {
    repr: Repr,
    to_tree: usize,
    to_array: usize,
}

impl Default for FreeSet {
    fn default() -> Self {
        FreeSet::with_limits(TO_TREE, TO_ARRAY)
    }
}

/// A best-fit entry found by [`FreeSet::first_in`], still in the set: valid for
/// [`FreeSet::replace_found`] and [`FreeSet::remove_found`] until the set next changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Found {
    /// The block's slab index.
    pub(super) idx: u32,
    key: u128,
    /// Position in the array form (unused in the tree form).
    pos: usize,
}

impl FreeSet {
    /// A set that becomes a tree above `to_tree` entries and an array below `to_array`.
    fn with_limits(to_tree: usize, to_array: usize) -> Self {
        debug_assert!(to_array < to_tree);
        FreeSet {
            repr: Repr::Array(SortedArray::default()),
            to_tree,
            to_array,
        }
    }

    /// Number of blocks in the set.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        match &self.repr {
            Repr::Array(a) => a.len(),
            Repr::Tree(t) => t.len(),
        }
    }

    /// Switches an array that grew too large to a tree.
    #[inline]
    fn after_grow(&mut self) {
        if let Repr::Array(a) = &mut self.repr
            && a.len() > self.to_tree
        {
            let a = std::mem::take(a);
            self.repr = Repr::Tree(a.iter().collect());
        }
    }

    /// Switches a tree that shrank enough back to an array.
    #[inline]
    fn after_shrink(&mut self) {
        if let Repr::Tree(t) = &mut self.repr
            && t.len() < self.to_array
        {
            let t = std::mem::take(t);
            self.repr = Repr::Array(SortedArray {
                keys: t.keys().copied().collect(),
                idxs: t.values().copied().collect(),
            });
        }
    }

    /// Files block `idx` under `key` (the key must not be present: keys are unique because
    /// addresses are).
    #[inline]
    pub(super) fn insert(&mut self, key: u128, idx: u32) {
        match &mut self.repr {
            Repr::Array(a) => a.insert(key, idx),
            Repr::Tree(t) => {
                let old = t.insert(key, idx);
                debug_assert!(old.is_none(), "duplicate free-set key");
            }
        }
        self.after_grow();
    }

    /// Removes `key`, returning its block index if it was present.
    #[inline]
    pub(super) fn remove(&mut self, key: u128) -> Option<u32> {
        let r = match &mut self.repr {
            Repr::Array(a) => a.remove(key),
            Repr::Tree(t) => t.remove(&key),
        };
        self.after_shrink();
        r
    }

    /// Removes `old` (which must be present) and files `idx` under `new` (which must not be).
    #[inline]
    pub(super) fn replace(&mut self, old: u128, new: u128, idx: u32) {
        match &mut self.repr {
            Repr::Array(a) => a.replace(old, new, idx),
            Repr::Tree(t) => {
                let was = t.remove(&old);
                debug_assert!(was.is_some(), "replaced key not in the set");
                t.insert(new, idx);
            }
        }
    }

    /// The first entry with `lo <= key < hi` (best fit), left in the set.
    #[inline]
    pub(super) fn first_in(&self, lo: u128, hi: u128) -> Option<Found> {
        match &self.repr {
            Repr::Array(a) => a.first_in(lo, hi).map(|(idx, pos)| Found {
                idx,
                key: a.keys[pos],
                pos,
            }),
            Repr::Tree(t) => t
                .range(lo..hi)
                .next()
                .map(|(&key, &idx)| Found { idx, key, pos: 0 }),
        }
    }

    /// Re-files the entry `found` under `new` with block index `idx`.
    #[inline]
    pub(super) fn replace_found(&mut self, found: Found, new: u128, idx: u32) {
        match &mut self.repr {
            Repr::Array(a) => a.replace_at(found.pos, new, idx),
            Repr::Tree(_) => self.replace(found.key, new, idx),
        }
    }

    /// Removes the entry `found`.
    #[inline]
    pub(super) fn remove_found(&mut self, found: Found) {
        match &mut self.repr {
            Repr::Array(a) => a.remove_at(found.pos),
            Repr::Tree(t) => {
                t.remove(&found.key);
            }
        }
        self.after_shrink();
    }

    /// The block index filed under `key`.
    pub(super) fn get(&self, key: &u128) -> Option<&u32> {
        match &self.repr {
            Repr::Array(a) => a.get(key),
            Repr::Tree(t) => t.get(key),
        }
    }

    /// The first entry with key `>= lo`.
    pub(super) fn first_from(&self, lo: u128) -> Option<(u128, u32)> {
        match &self.repr {
            Repr::Array(a) => a.first_from(lo),
            Repr::Tree(t) => t.range(lo..).next().map(|(&k, &v)| (k, v)),
        }
    }

    /// Entries with key `< hi`, largest key first.
    pub(super) fn below_rev(&self, hi: u128) -> impl Iterator<Item = (u128, u32)> + '_ {
        let (a, t) = match &self.repr {
            Repr::Array(a) => (Some(a.below_rev(hi)), None),
            Repr::Tree(t) => (None, Some(t.range(..hi).rev().map(|(&k, &v)| (k, v)))),
        };
        a.into_iter().flatten().chain(t.into_iter().flatten())
    }

    /// Every entry in key order.
    pub(super) fn iter(&self) -> impl Iterator<Item = (u128, u32)> + '_ {
        let (a, t) = match &self.repr {
            Repr::Array(a) => (Some(a.iter()), None),
            Repr::Tree(t) => (None, Some(t.iter().map(|(&k, &v)| (k, v)))),
        };
        a.into_iter().flatten().chain(t.into_iter().flatten())
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
        // Small limits, so that the set changes form many times during the run.
        let switches = agree(FreeSet::with_limits(40, 24));
        assert!(switches >= 4, "only {switches} changes of form");
        agree(FreeSet::default());
    }

    /// Runs the comparison; returns how many times the set changed form.
    fn agree(mut s: FreeSet) -> u32 {
        let mut m: BTreeMap<u128, u32> = BTreeMap::new();
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut switches = 0;
        let mut was_tree = false;
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
            let is_tree = matches!(s.repr, Repr::Tree(_));
            switches += u32::from(is_tree != was_tree);
            was_tree = is_tree;
        }
        assert_eq!(
            s.iter().collect::<Vec<_>>(),
            m.iter().map(|(&k, &v)| (k, v)).collect::<Vec<_>>()
        );
        switches
    }
}
