//! Expandable segments (`expandable_segments:True`): per stream and pool, one segment that
//! reserves a large address range and grows by mapping pages, PyTorch's semantics.
//!
//! * A segment reserves address space for 9/8 of the device's capacity, in pages of 2 MiB
//!   (small pool) or 20 MiB (large pool); nothing is mapped at first. Its blocks tile the whole
//!   range: mapped blocks (free, allocated, pending) and unmapped blocks (whole pages).
//! * A request that no cached block fits maps pages at the lowest address of the stream's
//!   segments where free and unmapped blocks together have room (normally the end of the
//!   mapped part; a hole left by an earlier unmap first), just enough whole pages to cover
//!   the request. Each mapping counts as one device allocation (`segment_map` in the trace);
//!   reserved memory is the mapped pages.
//! * Best fit treats a free block followed by unmapped space as being as large as it could
//!   grow, so it prefers other blocks of similar size to the growing end.
//! * Both pools split off any remainder of 512 B or more; expandable blocks stay out of the
//!   inactive-split statistics and are never released whole by the oversize or garbage
//!   collection rules.
//! * `empty_cache` (and the flush before an out-of-memory error) unmaps every whole page
//!   inside a free block (at the end or in the middle), one device free (`segment_unmap`)
//!   each; a segment with nothing mapped left gives its address range back.

use super::{CachingAllocator, NONE, Node, NodeState, fkey, pidx};
use crate::device::{DeviceError, DeviceMemory};
use crate::error::AllocError;
use crate::label::Label;
use crate::size::{LARGE_BUFFER, PoolKind, SMALL_BUFFER};
use crate::trace::TraceAction;

use super::free_set::{Found, FreeSet};

/// The page size of an expandable segment of `pool`: 2 MiB (small) or 20 MiB (large).
pub const fn expandable_page_size(pool: PoolKind) -> u64 {
    match pool {
        PoolKind::Small => SMALL_BUFFER,
        PoolKind::Large => LARGE_BUFFER,
    }
}

impl<D: DeviceMemory> CachingAllocator<D> {
    /// The size a free block could grow to: its own size plus the unmapped block after it.
    #[inline]
    fn expandable_size(&self, idx: u32) -> u64 {
        let n = &self.nodes[idx as usize];
        let grow = match n.next {
            NONE => 0,
            next => {
                let nn = &self.nodes[next as usize];
                if nn.state == NodeState::Unmapped {
                    nn.size
                } else {
                    0
                }
            }
        };
        n.size + grow
    }

    /// Best fit with expandable segments on: from the first block of at least `size`, move
    /// on while the next block could grow to less than this one could (so that the growing
    /// end of a segment is kept for requests that need it), then apply the oversize rules
    /// (`limit`: the size bound they give).
    pub(super) fn best_fit_expandable(
        &self,
        set: &FreeSet,
        size: u64,
        limit: u64,
    ) -> Option<Found> {
        let mut it = set.first_in(fkey(size, 0), u128::MAX)?;
        while self.nodes[it.idx as usize].expandable {
            match set.next(it) {
                Some(next) if self.expandable_size(next.idx) < self.expandable_size(it.idx) => {
                    it = next;
                }
                _ => break,
            }
        }
        (set.key_of(it) < fkey(limit, 0)).then_some(it)
    }

    /// The miss path with expandable segments on: maps pages so that a free block of at
    /// least `size` bytes exists and returns it (out of its free set). `Ok(None)` = the
    /// device has no memory for the pages.
    pub(super) fn alloc_expandable(
        &mut self,
        size: u64,
        slot: u32,
        pool: PoolKind,
        label: Option<&Label>,
    ) -> Result<Option<u32>, AllocError> {
        let mut cand = self.find_expandable_block(size, slot, pool)?;
        if self.nodes[cand as usize].state == NodeState::Unmapped {
            let want = size.min(self.nodes[cand as usize].size);
            match self.map_block(cand, want, label)? {
                Some(i) => cand = i,
                None => return Ok(None),
            }
        }
        // A free block followed by unmapped space: map the pages it still lacks.
        while self.nodes[cand as usize].size < size {
            let next = self.nodes[cand as usize].next;
            let want = (size - self.nodes[cand as usize].size).min(self.nodes[next as usize].size);
            match self.map_block(next, want, label)? {
                Some(i) => cand = i,
                None => return Ok(None),
            }
        }
        let n = &self.nodes[cand as usize];
        let (nsize, addr) = (n.size, n.addr);
        self.free_remove(slot, pool, nsize, addr);
        Ok(Some(cand))
    }

    /// The lowest-addressed place in the stream's segments of `pool` where free and
    /// unmapped blocks in a row have `size` bytes of room (starting at the free block before
    /// an unmapped one, if there is one); a new segment when there is none.
    fn find_expandable_block(
        &mut self,
        size: u64,
        slot: u32,
        pool: PoolKind,
    ) -> Result<u32, AllocError> {
        let usable = |n: &Node| matches!(n.state, NodeState::Free | NodeState::Unmapped);
        let found = self.pools[slot as usize].unmapped[pidx(pool)]
            .values()
            .map(|&idx| {
                let prev = self.nodes[idx as usize].prev;
                if prev != NONE && self.nodes[prev as usize].state == NodeState::Free {
                    prev
                } else {
                    idx
                }
            })
            .find(|&start| {
                let (mut bytes, mut cur) = (0u64, start);
                while bytes < size && cur != NONE && usable(&self.nodes[cur as usize]) {
                    bytes += self.nodes[cur as usize].size;
                    cur = self.nodes[cur as usize].next;
                }
                bytes >= size
            });
        if let Some(start) = found {
            return Ok(start);
        }
        let page = expandable_page_size(pool);
        let capacity = self.device.capacity();
        let span = capacity
            .saturating_add(capacity / 8)
            .div_ceil(page)
            .max(1)
            .saturating_mul(page);
        let base = self
            .device
            .reserve_address_space(span)
            .map_err(AllocError::Device)?;
        let mut node = Node::free_block(base, span, pool, slot, 0, NONE, NONE);
        node.state = NodeState::Unmapped;
        node.expandable = true;
        let idx = self.new_node(node);
        self.expandable.insert(base, span);
        self.pools[slot as usize].unmapped[pidx(pool)].insert(base, idx);
        Ok(idx)
    }

    /// Maps the whole pages covering the first `want` bytes of unmapped block `idx`; the
    /// mapped part becomes a free block merged with free neighbours (returned, filed in its
    /// free set), the rest stays unmapped. `Ok(None)` = no memory for the pages.
    fn map_block(
        &mut self,
        idx: u32,
        want: u64,
        label: Option<&Label>,
    ) -> Result<Option<u32>, AllocError> {
        let n = &self.nodes[idx as usize];
        let (addr, size, pool, slot, stream, next) = (
            n.addr,
            n.size,
            n.pool,
            n.slot,
            self.pools[n.slot as usize].stream,
            n.next,
        );
        debug_assert_eq!(n.state, NodeState::Unmapped);
        let page = expandable_page_size(pool);
        let bytes = want.div_ceil(page).saturating_mul(page).min(size);
        match self.device.map(addr, bytes) {
            Ok(()) => {}
            Err(DeviceError::OutOfMemory { .. }) => return Ok(None),
            Err(e) => return Err(AllocError::Device(e)),
        }
        let p = pidx(pool);
        self.pools[slot as usize].unmapped[p].remove(&addr);
        if bytes < size {
            let mut rest = Node::free_block(addr + bytes, size - bytes, pool, slot, 0, idx, next);
            rest.state = NodeState::Unmapped;
            rest.expandable = true;
            let r = self.new_node(rest);
            if next != NONE {
                self.nodes[next as usize].prev = r;
            }
            self.nodes[idx as usize].next = r;
            self.pools[slot as usize].unmapped[p].insert(addr + bytes, r);
        }
        let n = &mut self.nodes[idx as usize];
        n.size = bytes;
        n.state = NodeState::Free;
        n.gc_base = self.pool_calls[p];
        self.absorb_neighbours(idx);
        let n = &self.nodes[idx as usize];
        let key = fkey(n.size, n.addr);
        self.pools[slot as usize].free[p].insert(key, idx);
        self.reserved += bytes;
        self.stats.reserved_bytes.increase(pool, bytes);
        self.stats.num_device_alloc += 1;
        self.trace
            .record(TraceAction::SegmentMap, addr, bytes, stream, label);
        Ok(Some(idx))
    }

    /// Merges into block `idx` its neighbours in the same state (free with free, unmapped
    /// with unmapped), taking them out of their free set or unmapped set.
    fn absorb_neighbours(&mut self, idx: u32) {
        let state = self.nodes[idx as usize].state;
        for before in [true, false] {
            let n = &self.nodes[idx as usize];
            let other = if before { n.prev } else { n.next };
            if other == NONE || self.nodes[other as usize].state != state {
                continue;
            }
            let o = &self.nodes[other as usize];
            let (oaddr, osize, oprev, onext, slot, p) =
                (o.addr, o.size, o.prev, o.next, o.slot, pidx(o.pool));
            let sp = &mut self.pools[slot as usize];
            if state == NodeState::Free {
                sp.free[p].remove(fkey(osize, oaddr));
            } else {
                sp.unmapped[p].remove(&oaddr);
            }
            let n = &mut self.nodes[idx as usize];
            n.size += osize;
            if before {
                n.addr = oaddr;
                n.prev = oprev;
                if oprev != NONE {
                    self.nodes[oprev as usize].next = idx;
                }
            } else {
                n.next = onext;
                if onext != NONE {
                    self.nodes[onext as usize].prev = idx;
                }
            }
            self.vacate(other);
        }
    }

    /// Unmaps the whole pages inside free expandable block `idx` (the parts before the first
    /// and after the last whole page stay free blocks). Returns the bytes unmapped and
    /// whether the segment, left with nothing mapped, gave its address range back.
    pub(super) fn unmap_block(&mut self, idx: u32) -> Result<(u64, bool), AllocError> {
        let n = &self.nodes[idx as usize];
        let (addr, size, pool, slot, stream) = (
            n.addr,
            n.size,
            n.pool,
            n.slot,
            self.pools[n.slot as usize].stream,
        );
        let page = expandable_page_size(pool);
        let base = self.expandable_base(addr);
        let begin = base + (addr - base).div_ceil(page) * page;
        let end = base + (addr + size - base) / page * page;
        if begin >= end {
            return Ok((0, false));
        }
        self.device
            .unmap(begin, end - begin)
            .map_err(AllocError::Device)?;
        let p = pidx(pool);
        self.free_remove(slot, pool, size, addr);
        if begin > addr {
            self.split_off_free(idx, addr, begin - addr, true);
        }
        if end < addr + size {
            self.split_off_free(idx, end, addr + size - end, false);
        }
        let n = &mut self.nodes[idx as usize];
        n.addr = begin;
        n.size = end - begin;
        n.state = NodeState::Unmapped;
        self.absorb_neighbours(idx);
        let n = &self.nodes[idx as usize];
        let (uaddr, usize_, lone) = (n.addr, n.size, !n.is_split());
        self.pools[slot as usize].unmapped[p].insert(uaddr, idx);
        let bytes = end - begin;
        self.reserved -= bytes;
        self.stats.reserved_bytes.decrease(pool, bytes);
        self.stats.num_device_free += 1;
        self.trace
            .record(TraceAction::SegmentUnmap, begin, bytes, stream, None);
        if lone {
            self.device
                .release_address_space(uaddr, usize_)
                .map_err(AllocError::Device)?;
            self.pools[slot as usize].unmapped[p].remove(&uaddr);
            self.expandable.remove(&uaddr);
            self.vacate(idx);
        }
        Ok((bytes, lone))
    }

    /// Makes `[addr, addr + size)`, the head (`before`) or tail of block `idx`, a free block
    /// of its own, filed in its free set; `idx` is re-linked around it by the caller's
    /// resizing.
    fn split_off_free(&mut self, idx: u32, addr: u64, size: u64, before: bool) {
        let n = &self.nodes[idx as usize];
        let (pool, slot, prev, next) = (n.pool, n.slot, n.prev, n.next);
        let p = pidx(pool);
        let (lp, ln) = if before { (prev, idx) } else { (idx, next) };
        let mut node = Node::free_block(addr, size, pool, slot, self.pool_calls[p], lp, ln);
        node.expandable = true;
        let r = self.new_node(node);
        if before {
            if prev != NONE {
                self.nodes[prev as usize].next = r;
            }
            self.nodes[idx as usize].prev = r;
        } else {
            if next != NONE {
                self.nodes[next as usize].prev = r;
            }
            self.nodes[idx as usize].next = r;
        }
        self.pools[slot as usize].free[p].insert(fkey(size, addr), r);
    }

    /// Gives back the address ranges of expandable segments with nothing mapped (a segment
    /// whose first mapping failed for lack of memory); they hold no memory. Returns how many.
    pub(super) fn release_unmapped_segments(&mut self) -> Result<u64, AllocError> {
        let lone: Vec<(u32, u64, u64)> = self
            .pools
            .iter()
            .flat_map(|sp| sp.unmapped.iter().flat_map(|m| m.values()))
            .map(|&i| (i, &self.nodes[i as usize]))
            .filter(|(_, n)| !n.is_split())
            .map(|(i, n)| (i, n.addr, n.size))
            .collect();
        for &(idx, addr, size) in &lone {
            self.device
                .release_address_space(addr, size)
                .map_err(AllocError::Device)?;
            let n = &self.nodes[idx as usize];
            let (slot, p) = (n.slot, pidx(n.pool));
            self.pools[slot as usize].unmapped[p].remove(&addr);
            self.expandable.remove(&addr);
            self.vacate(idx);
        }
        Ok(lone.len() as u64)
    }

    /// The base of the expandable segment holding `addr`.
    fn expandable_base(&self, addr: u64) -> u64 {
        let (&base, &span) = self
            .expandable
            .range(..=addr)
            .next_back()
            .expect("an expandable block lies in an expandable segment");
        debug_assert!(addr < base + span);
        base
    }

    /// Gives every expandable segment back to the device (the allocator is being dropped):
    /// unmaps its mapped blocks and releases its address range. Errors are ignored.
    pub(super) fn drop_expandable(&mut self) {
        let bases: Vec<(u64, u64)> = self.expandable.iter().map(|(&b, &s)| (b, s)).collect();
        let heads: std::collections::HashMap<u64, u32> = self
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.expandable && n.state != NodeState::Vacant && n.prev == NONE)
            .map(|(i, n)| (n.addr, i as u32))
            .collect();
        for (base, span) in bases {
            let mut cur = heads.get(&base).copied().unwrap_or(NONE);
            while cur != NONE {
                let n = &self.nodes[cur as usize];
                if n.state != NodeState::Unmapped {
                    let _ = self.device.unmap(n.addr, n.size);
                }
                cur = n.next;
            }
            let _ = self.device.release_address_space(base, span);
        }
    }
}
