//! The backing device: where segments come from. [`DeviceMemory`] is the trait;
//! [`SimulatedDevice`] is the fast, memory-less implementation used by the simulator.

use std::collections::{BTreeMap, VecDeque};

/// An error reported by a [`DeviceMemory`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    /// Not enough device memory for the request. The caching allocator answers this by
    /// freeing cached segments and retrying.
    #[error("device out of memory: requested {requested} bytes, {free} bytes free")]
    OutOfMemory {
        /// Bytes asked for.
        requested: u64,
        /// Bytes the device reported free.
        free: u64,
    },
    /// `free` was given an address the device did not hand out (or already took back).
    #[error("address {address:#x} is not a live allocation of this device")]
    UnknownAddress {
        /// The address.
        address: u64,
    },
    /// The driver failed for a reason other than lack of memory.
    #[error("device driver error: {0}")]
    Driver(String),
    /// The device cannot be used here (e.g. the CUDA driver library is missing).
    #[error("device unavailable: {0}")]
    Unavailable(String),
}

/// A source of device memory segments.
///
/// The caching allocator calls [`allocate`](DeviceMemory::allocate) for each new segment and
/// [`free`](DeviceMemory::free) when it releases one (empty_cache, the out-of-memory ladder,
/// garbage collection, or when the allocator is dropped). Addresses are plain `u64`s; a device
/// must never hand out overlapping ranges.
pub trait DeviceMemory: Send {
    /// Allocates `size` bytes (a multiple of 2 MiB when called by the allocator) and returns
    /// the address of the first byte. Lack of memory must be reported as
    /// [`DeviceError::OutOfMemory`].
    fn allocate(&mut self, size: u64) -> Result<u64, DeviceError>;
    /// Frees a range returned by [`allocate`](DeviceMemory::allocate); `size` is the size
    /// that was requested then.
    fn free(&mut self, address: u64, size: u64) -> Result<(), DeviceError>;
    /// Total memory of the device in bytes.
    fn capacity(&self) -> u64;
    /// Free memory as the device reports it (includes use by anything else on the device).
    fn free_bytes(&self) -> u64;
    /// A short name for messages, e.g. `"simulated device"` or `"CUDA device 0"`.
    fn name(&self) -> String {
        "device".to_string()
    }
    /// Takes over a range that was allocated before this allocator existed (seeding an
    /// allocator with a recorded state, [`CachingAllocator::from_state`](crate::CachingAllocator::from_state)):
    /// from now on it counts as allocated and is given back with [`free`](DeviceMemory::free).
    /// Devices that cannot do this (the default) answer [`DeviceError::Unavailable`].
    fn adopt(&mut self, address: u64, size: u64) -> Result<(), DeviceError> {
        let _ = (address, size);
        Err(DeviceError::Unavailable(format!(
            "{} cannot take over ranges allocated elsewhere",
            self.name()
        )))
    }

    /// Reserves `size` bytes of address space with no memory behind it (expandable
    /// segments; CUDA's `cuMemAddressReserve`) and returns its first address. Pages are then
    /// backed with [`map`](DeviceMemory::map). Devices without virtual memory management
    /// (the default) answer [`DeviceError::Unavailable`].
    fn reserve_address_space(&mut self, size: u64) -> Result<u64, DeviceError> {
        let _ = size;
        Err(no_virtual_memory(&self.name(), "reserve address space"))
    }
    /// Backs `[address, address + size)`, inside a reserved range and not backed yet, with
    /// memory. Lack of memory must be reported as [`DeviceError::OutOfMemory`].
    fn map(&mut self, address: u64, size: u64) -> Result<(), DeviceError> {
        let _ = (address, size);
        Err(no_virtual_memory(&self.name(), "map pages"))
    }
    /// Gives back the memory behind `[address, address + size)`, a backed part of a
    /// reserved range; the addresses stay reserved.
    fn unmap(&mut self, address: u64, size: u64) -> Result<(), DeviceError> {
        let _ = (address, size);
        Err(no_virtual_memory(&self.name(), "unmap pages"))
    }
    /// Gives back a reserved range (nothing in it may be backed any more).
    fn release_address_space(&mut self, address: u64, size: u64) -> Result<(), DeviceError> {
        let _ = (address, size);
        Err(no_virtual_memory(&self.name(), "release address space"))
    }
}

impl<D: DeviceMemory + ?Sized> DeviceMemory for Box<D> {
    fn allocate(&mut self, size: u64) -> Result<u64, DeviceError> {
        (**self).allocate(size)
    }
    fn free(&mut self, address: u64, size: u64) -> Result<(), DeviceError> {
        (**self).free(address, size)
    }
    fn capacity(&self) -> u64 {
        (**self).capacity()
    }
    fn free_bytes(&self) -> u64 {
        (**self).free_bytes()
    }
    fn name(&self) -> String {
        (**self).name()
    }
    fn adopt(&mut self, address: u64, size: u64) -> Result<(), DeviceError> {
        (**self).adopt(address, size)
    }
    fn reserve_address_space(&mut self, size: u64) -> Result<u64, DeviceError> {
        (**self).reserve_address_space(size)
    }
    fn map(&mut self, address: u64, size: u64) -> Result<(), DeviceError> {
        (**self).map(address, size)
    }
    fn unmap(&mut self, address: u64, size: u64) -> Result<(), DeviceError> {
        (**self).unmap(address, size)
    }
    fn release_address_space(&mut self, address: u64, size: u64) -> Result<(), DeviceError> {
        (**self).release_address_space(address, size)
    }
}

/// A device made of arithmetic: it has a capacity and hands out addresses, but owns no
/// memory. Allocation is O(1) (a bump pointer; addresses are never reused), so replaying
/// millions of operations costs only the allocator's own bookkeeping.
///
/// ```
/// use trainmem_alloc::{DeviceMemory, SimulatedDevice};
/// let mut d = SimulatedDevice::new(1 << 30);
/// let a = d.allocate(2 << 20).unwrap();
/// assert_eq!(d.free_bytes(), (1 << 30) - (2 << 20));
/// d.free(a, 2 << 20).unwrap();
/// assert_eq!(d.free_bytes(), 1 << 30);
/// ```
#[derive(Debug, Clone)]
pub struct SimulatedDevice {
    capacity: u64,
    used: u64,
    external: u64,
    next_address: u64,
    live: BTreeMap<u64, u64>,
    /// Reserved address ranges (expandable segments): base → (size, bytes mapped).
    spaces: BTreeMap<u64, (u64, u64)>,
    planned: VecDeque<(u64, u64)>,
    name: String,
}

impl SimulatedDevice {
    /// An out-of-memory error unless `size` more bytes fit the capacity left.
    fn check_room(&self, size: u64) -> Result<(), DeviceError> {
        let free = self.free_bytes();
        if size > free {
            return Err(DeviceError::OutOfMemory {
                requested: size,
                free,
            });
        }
        Ok(())
    }

    /// The first address handed out unless changed with
    /// [`with_base_address`](SimulatedDevice::with_base_address).
    pub const DEFAULT_BASE_ADDRESS: u64 = 0x7f00_0000_0000;

    /// A device of `capacity` bytes.
    pub fn new(capacity: u64) -> Self {
        SimulatedDevice {
            capacity,
            used: 0,
            external: 0,
            next_address: Self::DEFAULT_BASE_ADDRESS,
            live: BTreeMap::new(),
            spaces: BTreeMap::new(),
            planned: VecDeque::new(),
            name: "simulated device".to_string(),
        }
    }

    /// Starts handing out addresses at `base` (rounded up to 512 B).
    pub fn with_base_address(mut self, base: u64) -> Self {
        self.next_address = base.div_ceil(512).saturating_mul(512);
        self
    }

    /// Plans the addresses of the next allocations: each `(size, address)` in order is used
    /// by the next [`allocate`](DeviceMemory::allocate) of exactly `size` bytes whose range is
    /// free (a replay that gives its segments the recorded addresses, so that best fit breaks
    /// ties between equal blocks as the recording did). An allocation of another size, or one
    /// whose planned range is taken, drops the plan that failed to match and takes a fresh
    /// address above every planned one. Bump addresses start above the planned ranges.
    pub fn with_planned_addresses(mut self, plan: impl IntoIterator<Item = (u64, u64)>) -> Self {
        self.planned = plan.into_iter().collect();
        let end = self
            .planned
            .iter()
            .map(|&(size, addr)| addr.saturating_add(size))
            .max()
            .unwrap_or(0);
        self.next_address = self.next_address.max(end.div_ceil(512).saturating_mul(512));
        self
    }

    /// The address the next unplanned allocation gets.
    pub fn next_address(&self) -> u64 {
        self.next_address
    }

    /// Planned addresses not used yet.
    pub fn planned_left(&self) -> usize {
        self.planned.len()
    }

    /// True when `[address, address + size)` overlaps no live range.
    fn range_is_free(&self, address: u64, size: u64) -> bool {
        let end = address.saturating_add(size);
        let before = self.live.range(..end).next_back();
        before.is_none_or(|(&a, &s)| a.saturating_add(s) <= address)
    }

    /// Sets the name used in messages.
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Declares `bytes` of the device as used by something other than the allocator (a
    /// driver context, another process). They reduce [`free_bytes`](DeviceMemory::free_bytes).
    pub fn set_external_usage(&mut self, bytes: u64) {
        self.external = bytes;
    }

    /// Bytes declared as used outside the allocator.
    pub fn external_usage(&self) -> u64 {
        self.external
    }

    /// Bytes currently handed out to the allocator.
    pub fn used_bytes(&self) -> u64 {
        self.used
    }

    /// Number of address ranges currently reserved (expandable segments).
    pub fn reserved_spaces(&self) -> usize {
        self.spaces.len()
    }

    /// The reserved range holding `[address, address + size)`: its base.
    fn space_of(&self, address: u64, size: u64) -> Result<u64, DeviceError> {
        match self.spaces.range(..=address).next_back() {
            Some((&base, &(len, _))) if address.saturating_add(size) <= base + len => Ok(base),
            _ => Err(DeviceError::UnknownAddress { address }),
        }
    }

    /// Number of ranges currently handed out.
    pub fn live_allocations(&self) -> usize {
        self.live.len()
    }
}

impl DeviceMemory for SimulatedDevice {
    fn allocate(&mut self, size: u64) -> Result<u64, DeviceError> {
        self.check_room(size)?;
        if let Some(&(planned_size, planned_addr)) = self.planned.front() {
            self.planned.pop_front();
            if planned_size == size && self.range_is_free(planned_addr, size) {
                self.used += size;
                self.live.insert(planned_addr, size);
                return Ok(planned_addr);
            }
        }
        let address = self.next_address;
        let next = size
            .div_ceil(512)
            .checked_mul(512)
            .and_then(|s| address.checked_add(s))
            .ok_or_else(|| DeviceError::Driver("simulated address space exhausted".into()))?;
        self.next_address = next;
        self.used += size;
        self.live.insert(address, size);
        Ok(address)
    }

    fn free(&mut self, address: u64, size: u64) -> Result<(), DeviceError> {
        match self.live.get(&address) {
            Some(&s) if s == size => {
                self.live.remove(&address);
                self.used -= size;
                Ok(())
            }
            _ => Err(DeviceError::UnknownAddress { address }),
        }
    }

    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn adopt(&mut self, address: u64, size: u64) -> Result<(), DeviceError> {
        let end = address
            .checked_add(size)
            .ok_or_else(|| DeviceError::Driver("range past the address space".into()))?;
        if size == 0 || !self.range_is_free(address, size) {
            return Err(DeviceError::Driver(format!(
                "cannot take over {size} bytes at {address:#x}: empty, or overlapping a live range"
            )));
        }
        self.check_room(size)?;
        self.used += size;
        self.live.insert(address, size);
        self.next_address = self.next_address.max(end.div_ceil(512).saturating_mul(512));
        Ok(())
    }

    fn free_bytes(&self) -> u64 {
        self.capacity
            .saturating_sub(self.used)
            .saturating_sub(self.external)
    }

    fn name(&self) -> String {
        self.name.clone()
    }

    /// Takes fresh addresses (above every planned and handed-out range); uses no capacity.
    fn reserve_address_space(&mut self, size: u64) -> Result<u64, DeviceError> {
        let address = self.next_address;
        self.next_address = size
            .div_ceil(512)
            .checked_mul(512)
            .and_then(|s| address.checked_add(s))
            .ok_or_else(|| DeviceError::Driver("simulated address space exhausted".into()))?;
        self.spaces.insert(address, (size, 0));
        Ok(address)
    }

    fn map(&mut self, address: u64, size: u64) -> Result<(), DeviceError> {
        let base = self.space_of(address, size)?;
        self.check_room(size)?;
        self.used += size;
        if let Some(space) = self.spaces.get_mut(&base) {
            space.1 += size;
        }
        Ok(())
    }

    fn unmap(&mut self, address: u64, size: u64) -> Result<(), DeviceError> {
        let base = self.space_of(address, size)?;
        let space = self.spaces.get_mut(&base).expect("found above");
        if space.1 < size {
            return Err(DeviceError::Driver(format!(
                "unmapping {size} bytes at {address:#x}, only {} mapped there",
                space.1
            )));
        }
        space.1 -= size;
        self.used -= size;
        Ok(())
    }

    fn release_address_space(&mut self, address: u64, size: u64) -> Result<(), DeviceError> {
        match self.spaces.get(&address) {
            Some(&(len, 0)) if len == size => {
                self.spaces.remove(&address);
                Ok(())
            }
            Some(&(_, mapped)) if mapped > 0 => Err(DeviceError::Driver(format!(
                "releasing address space at {address:#x} with {mapped} bytes still mapped"
            ))),
            _ => Err(DeviceError::UnknownAddress { address }),
        }
    }
}

/// The refusal of a device without virtual memory management to `what` (expandable
/// segments need it).
fn no_virtual_memory(device: &str, what: &str) -> DeviceError {
    DeviceError::Unavailable(format!("{device} cannot {what} (expandable segments)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simulated_device_accounts_and_rejects() {
        let mut d = SimulatedDevice::new(10 << 20).with_base_address(4096);
        let a = d.allocate(4 << 20).unwrap();
        let b = d.allocate(4 << 20).unwrap();
        assert_eq!(a, 4096);
        assert_eq!(b, 4096 + (4 << 20));
        assert_eq!(d.free_bytes(), 2 << 20);
        assert!(matches!(
            d.allocate(4 << 20),
            Err(DeviceError::OutOfMemory { requested, free }) if requested == 4 << 20 && free == 2 << 20
        ));
        d.set_external_usage(1 << 20);
        assert_eq!(d.external_usage(), 1 << 20);
        assert_eq!(d.free_bytes(), 1 << 20);
        assert_eq!(
            d.free(a, 1),
            Err(DeviceError::UnknownAddress { address: a })
        );
        d.free(a, 4 << 20).unwrap();
        assert_eq!(
            d.free(a, 4 << 20),
            Err(DeviceError::UnknownAddress { address: a })
        );
        assert_eq!(d.used_bytes(), 4 << 20);
        assert_eq!(d.live_allocations(), 1);
        assert!(d.allocate(u64::MAX).is_err());
    }

    #[test]
    fn planned_addresses_are_used_in_order_when_the_size_matches() {
        let mut d = SimulatedDevice::new(1 << 30)
            .with_base_address(4096)
            .with_planned_addresses([(2 << 20, 0x10_0000_0000), (20 << 20, 0x20_0000_0000)]);
        // Bump addresses start above every planned range.
        assert_eq!(d.next_address(), 0x20_0000_0000 + (20 << 20));
        assert_eq!(d.allocate(2 << 20), Ok(0x10_0000_0000));
        // A different size drops the plan it failed to match and takes a fresh address.
        assert_eq!(d.allocate(4 << 20), Ok(0x20_0000_0000 + (20 << 20)));
        assert_eq!(d.planned_left(), 0);
        assert_eq!(d.used_bytes(), 6 << 20);
    }

    #[test]
    fn reserved_ranges_cost_nothing_until_mapped() {
        let mut d = SimulatedDevice::new(8 << 20).with_base_address(4096);
        let base = d.reserve_address_space(64 << 20).unwrap();
        assert_eq!(base, 4096);
        assert_eq!(d.free_bytes(), 8 << 20);
        d.map(base, 4 << 20).unwrap();
        d.map(base + (60 << 20), 2 << 20).unwrap();
        assert_eq!(d.free_bytes(), 2 << 20);
        assert!(matches!(
            d.map(base + (4 << 20), 4 << 20),
            Err(DeviceError::OutOfMemory { requested, free }) if requested == 4 << 20 && free == 2 << 20
        ));
        // Outside the reservation, or past its end.
        assert!(d.map(base + (63 << 20), 2 << 20).is_err());
        assert!(d.map(base + (64 << 20), 2 << 20).is_err());
        // A segment allocated now lies above the reservation.
        assert_eq!(d.allocate(2 << 20), Ok(base + (64 << 20)));
        assert!(
            d.release_address_space(base, 64 << 20).is_err(),
            "still mapped"
        );
        d.unmap(base, 4 << 20).unwrap();
        d.unmap(base + (60 << 20), 2 << 20).unwrap();
        assert!(d.unmap(base, 2 << 20).is_err(), "nothing left to unmap");
        d.release_address_space(base, 64 << 20).unwrap();
        assert_eq!(d.reserved_spaces(), 0);
        assert_eq!(d.free_bytes(), 6 << 20);
    }

    #[test]
    fn adopted_ranges_count_as_allocated_and_cannot_overlap() {
        let mut d = SimulatedDevice::new(64 << 20);
        d.adopt(0x1000_0000, 20 << 20).unwrap();
        assert_eq!(d.free_bytes(), 44 << 20);
        assert!(
            d.adopt(0x1000_0000 + (10 << 20), 20 << 20).is_err(),
            "overlap"
        );
        assert!(matches!(
            d.adopt(0x9000_0000, 60 << 20),
            Err(DeviceError::OutOfMemory { .. })
        ));
        d.free(0x1000_0000, 20 << 20).unwrap();
        assert_eq!(d.free_bytes(), 64 << 20);
    }
}
