//! Allocator statistics with PyTorch's names and meanings (`torch.cuda.memory_stats()`).

use std::collections::BTreeMap;

use crate::size::PoolKind;

/// One statistic: its current value, its peak since the last peak reset, and the cumulative
/// increases (`allocated`) and decreases (`freed`) since the last accumulated reset.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Stat {
    /// Current value.
    pub current: i64,
    /// Highest value since creation or [`CachingAllocator::reset_peak_stats`](crate::CachingAllocator::reset_peak_stats).
    pub peak: i64,
    /// Sum of all increases since creation or the last accumulated reset.
    pub allocated: i64,
    /// Sum of all decreases since creation or the last accumulated reset.
    pub freed: i64,
}

impl Stat {
    #[inline]
    pub(crate) fn increase(&mut self, amount: u64) {
        let a = amount as i64;
        self.current += a;
        self.allocated += a;
        // `max` rather than a branch: compiles to a conditional move on the hot path.
        self.peak = self.peak.max(self.current);
    }

    #[inline]
    pub(crate) fn decrease(&mut self, amount: u64) {
        let a = amount as i64;
        self.current -= a;
        self.freed += a;
    }

    /// Adds a signed change (positive = increase).
    #[inline]
    pub(crate) fn change(&mut self, delta: i64) {
        if delta >= 0 {
            self.increase(delta as u64)
        } else {
            self.decrease(delta.unsigned_abs())
        }
    }

    fn reset_peak(&mut self) {
        self.peak = self.current;
    }

    fn reset_accumulated(&mut self) {
        self.allocated = 0;
        self.freed = 0;
    }
}

/// A statistic kept for all memory and separately for the small and large pools.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct StatArray {
    /// Both pools together (PyTorch's `all`).
    pub all: Stat,
    /// The small pool (requests of at most 1 MiB).
    pub small_pool: Stat,
    /// The large pool.
    pub large_pool: Stat,
}

impl StatArray {
    /// The pool's statistic.
    pub fn pool(&self, pool: PoolKind) -> &Stat {
        match pool {
            PoolKind::Small => &self.small_pool,
            PoolKind::Large => &self.large_pool,
        }
    }

    #[inline]
    pub(crate) fn increase(&mut self, pool: PoolKind, amount: u64) {
        self.all.increase(amount);
        match pool {
            PoolKind::Small => self.small_pool.increase(amount),
            PoolKind::Large => self.large_pool.increase(amount),
        }
    }

    #[inline]
    pub(crate) fn decrease(&mut self, pool: PoolKind, amount: u64) {
        self.all.decrease(amount);
        match pool {
            PoolKind::Small => self.small_pool.decrease(amount),
            PoolKind::Large => self.large_pool.decrease(amount),
        }
    }

    #[inline]
    pub(crate) fn change(&mut self, pool: PoolKind, delta: i64) {
        if delta != 0 {
            self.all.change(delta);
            match pool {
                PoolKind::Small => self.small_pool.change(delta),
                PoolKind::Large => self.large_pool.change(delta),
            }
        }
    }

    fn each(&mut self, f: impl Fn(&mut Stat)) {
        f(&mut self.all);
        f(&mut self.small_pool);
        f(&mut self.large_pool);
    }

    fn entries(&self) -> [(&'static str, &Stat); 3] {
        [
            ("all", &self.all),
            ("small_pool", &self.small_pool),
            ("large_pool", &self.large_pool),
        ]
    }
}

/// All allocator statistics. Field names are PyTorch's `memory_stats()` keys; see
/// [`MemoryStats::to_map`] for the flattened `"allocated_bytes.all.current"` form.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct MemoryStats {
    /// Number of live client allocations (`allocation.*`).
    pub allocation: StatArray,
    /// Number of device segments held (`segment.*`).
    pub segment: StatArray,
    /// Number of active blocks: allocated, or freed but waiting on other streams (`active.*`).
    pub active: StatArray,
    /// Number of inactive (free) blocks inside segments that also hold other blocks; they
    /// cannot be released by `empty_cache` (`inactive_split.*`).
    pub inactive_split: StatArray,
    /// Bytes of live allocations after rounding (`allocated_bytes.*`).
    pub allocated_bytes: StatArray,
    /// Bytes of all segments held, used or cached (`reserved_bytes.*`).
    pub reserved_bytes: StatArray,
    /// Bytes of active blocks (`active_bytes.*`).
    pub active_bytes: StatArray,
    /// Bytes of inactive split blocks ("Non-releasable memory", `inactive_split_bytes.*`).
    pub inactive_split_bytes: StatArray,
    /// Bytes the clients asked for before rounding, for active blocks (`requested_bytes.*`).
    pub requested_bytes: StatArray,
    /// Live allocations served by a block of at least `max_split_size` (`oversize_allocations`).
    pub oversize_allocations: Stat,
    /// Segments of at least `max_split_size` (`oversize_segments`).
    pub oversize_segments: Stat,
    /// Device allocations retried after releasing every free segment (`num_alloc_retries`).
    pub num_alloc_retries: i64,
    /// Allocations that failed with out-of-memory (`num_ooms`).
    pub num_ooms: i64,
    /// Times all outstanding cross-stream frees were waited for, i.e. each `empty_cache` and
    /// each full flush in the out-of-memory ladder (`num_sync_all_streams`).
    pub num_sync_all_streams: i64,
    /// Segments allocated from the device (`num_device_alloc`).
    pub num_device_alloc: i64,
    /// Segments returned to the device (`num_device_free`).
    pub num_device_free: i64,
    /// The split limit in bytes; `i64::MAX` when unlimited (`max_split_size`).
    pub max_split_size: i64,
}

impl MemoryStats {
    /// `memory_allocated()`: `allocated_bytes.all.current`.
    pub fn memory_allocated(&self) -> u64 {
        self.allocated_bytes.all.current as u64
    }

    /// `max_memory_allocated()`: `allocated_bytes.all.peak`.
    pub fn max_memory_allocated(&self) -> u64 {
        self.allocated_bytes.all.peak as u64
    }

    /// `memory_reserved()`: `reserved_bytes.all.current`.
    pub fn memory_reserved(&self) -> u64 {
        self.reserved_bytes.all.current as u64
    }

    /// `max_memory_reserved()`: `reserved_bytes.all.peak`.
    pub fn max_memory_reserved(&self) -> u64 {
        self.reserved_bytes.all.peak as u64
    }

    /// Sets every peak to its current value.
    pub fn reset_peak(&mut self) {
        for a in self.arrays_mut() {
            a.each(Stat::reset_peak);
        }
        self.oversize_allocations.reset_peak();
        self.oversize_segments.reset_peak();
    }

    /// Zeroes the cumulative `allocated`/`freed` parts and the event counters.
    pub fn reset_accumulated(&mut self) {
        for a in self.arrays_mut() {
            a.each(Stat::reset_accumulated);
        }
        self.oversize_allocations.reset_accumulated();
        self.oversize_segments.reset_accumulated();
        self.num_alloc_retries = 0;
        self.num_ooms = 0;
        self.num_sync_all_streams = 0;
        self.num_device_alloc = 0;
        self.num_device_free = 0;
    }

    fn arrays_mut(&mut self) -> [&mut StatArray; 9] {
        [
            &mut self.allocation,
            &mut self.segment,
            &mut self.active,
            &mut self.inactive_split,
            &mut self.allocated_bytes,
            &mut self.reserved_bytes,
            &mut self.active_bytes,
            &mut self.inactive_split_bytes,
            &mut self.requested_bytes,
        ]
    }

    /// The stat arrays with their PyTorch names, in PyTorch's order.
    pub fn arrays(&self) -> [(&'static str, &StatArray); 9] {
        [
            ("allocation", &self.allocation),
            ("segment", &self.segment),
            ("active", &self.active),
            ("inactive_split", &self.inactive_split),
            ("allocated_bytes", &self.allocated_bytes),
            ("reserved_bytes", &self.reserved_bytes),
            ("active_bytes", &self.active_bytes),
            ("inactive_split_bytes", &self.inactive_split_bytes),
            ("requested_bytes", &self.requested_bytes),
        ]
    }

    /// The flattened form `torch.cuda.memory_stats()` returns: keys such as
    /// `"allocated_bytes.all.current"`, `"reserved_bytes.large_pool.peak"`,
    /// `"oversize_allocations.current"`, `"num_alloc_retries"`.
    pub fn to_map(&self) -> BTreeMap<String, i64> {
        let mut m = BTreeMap::new();
        let put_stat = |m: &mut BTreeMap<String, i64>, prefix: &str, s: &Stat| {
            m.insert(format!("{prefix}.current"), s.current);
            m.insert(format!("{prefix}.peak"), s.peak);
            m.insert(format!("{prefix}.allocated"), s.allocated);
            m.insert(format!("{prefix}.freed"), s.freed);
        };
        for (name, arr) in self.arrays() {
            for (pool, s) in arr.entries() {
                put_stat(&mut m, &format!("{name}.{pool}"), s);
            }
        }
        put_stat(&mut m, "oversize_allocations", &self.oversize_allocations);
        put_stat(&mut m, "oversize_segments", &self.oversize_segments);
        m.insert("num_alloc_retries".into(), self.num_alloc_retries);
        m.insert("num_ooms".into(), self.num_ooms);
        m.insert("num_sync_all_streams".into(), self.num_sync_all_streams);
        m.insert("num_device_alloc".into(), self.num_device_alloc);
        m.insert("num_device_free".into(), self.num_device_free);
        m.insert("max_split_size".into(), self.max_split_size);
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_tracks_peak_and_totals() {
        let mut s = StatArray::default();
        s.increase(PoolKind::Small, 10);
        s.increase(PoolKind::Large, 5);
        s.decrease(PoolKind::Small, 7);
        assert_eq!(
            s.all,
            Stat {
                current: 8,
                peak: 15,
                allocated: 15,
                freed: 7
            }
        );
        assert_eq!(
            s.small_pool,
            Stat {
                current: 3,
                peak: 10,
                allocated: 10,
                freed: 7
            }
        );
        assert_eq!(s.large_pool.current, 5);
        s.change(PoolKind::Large, -5);
        assert_eq!(s.all.current, 3);
    }

    #[test]
    fn map_has_pytorch_keys_and_resets() {
        let mut st = MemoryStats::default();
        st.allocated_bytes.increase(PoolKind::Large, 100);
        st.allocated_bytes.decrease(PoolKind::Large, 40);
        st.num_ooms = 2;
        let m = st.to_map();
        assert_eq!(m["allocated_bytes.all.current"], 60);
        assert_eq!(m["allocated_bytes.all.peak"], 100);
        assert_eq!(m["allocated_bytes.large_pool.freed"], 40);
        assert_eq!(m["reserved_bytes.all.peak"], 0);
        assert_eq!(m["num_ooms"], 2);
        assert!(m.contains_key("oversize_segments.current"));
        assert!(m.contains_key("num_alloc_retries"));
        assert_eq!(m.len(), 9 * 3 * 4 + 2 * 4 + 6);
        st.reset_peak();
        assert_eq!(st.allocated_bytes.all.peak, 60);
        st.reset_accumulated();
        assert_eq!(st.allocated_bytes.all.allocated, 0);
        assert_eq!(st.allocated_bytes.all.current, 60);
        assert_eq!(st.num_ooms, 0);
    }
}
