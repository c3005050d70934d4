//! The tracker's ledger: every counted buffer's token, and live and peak bytes per category.
//!
//! A [`Token`] stands for one buffer of the inner backend. Every tracked tensor holding the
//! buffer holds an `Arc` of its token; the buffer's bytes are counted from the token's creation
//! until the last `Arc` is dropped. Tokens of buffers the backend can name are also kept in a
//! map from the buffer's key to a weak reference, so an op output that holds a buffer already
//! counted (a view, an in-place result, a handle the backend shares) joins the existing token
//! instead of counting the bytes again.
//!
//! The ledger is process-wide, like trainmem-probe's counting allocator: measured runs take
//! turns. The tracker's own allocations (tokens, the key map) are made under the `other`
//! category, so they never inflate a tensor category of the counting allocator.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, Weak};

use serde::{Deserialize, Serialize};
use trainmem_core::Category;
use trainmem_core::timeline::CategoryBytes;
use trainmem_probe::CategoryScope;

use crate::buffer::BufferInfo;
use crate::hash::KeyHash;

/// One counted buffer.
#[derive(Debug)]
pub struct Token {
    key: Option<u64>,
    bytes: u64,
    category: Category,
    /// Of `bytes`, those taken over from the caller's host data (see
    /// [`BufferInfo::adoptable`]).
    adopted: u64,
}

impl Token {
    /// The buffer's bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The category the buffer is counted under (the creating thread's tag).
    pub fn category(&self) -> Category {
        self.category
    }
}

/// A tensor's share of its buffer: the buffer's bytes stay counted while any is alive.
pub type Keep = Arc<Token>;

/// Bytes the tracker counts, per category.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrackedBytes {
    /// Live bytes per category.
    pub live: CategoryBytes,
    /// The largest live bytes of each category since the last [`reset_peaks`].
    pub peak: CategoryBytes,
    /// The largest live bytes of all categories together since the last [`reset_peaks`].
    pub total_peak: u64,
    /// Live buffers.
    pub buffers: u64,
    /// Buffers counted since the process started (a new buffer of a view or an in-place
    /// result is not one).
    pub buffers_created: u64,
    /// The tensors' own host records per category, beside their buffers: every live tensor's
    /// shape and strides where the backend keeps them on the heap (a view or a clone has its
    /// own). Host memory on every backend, never device memory.
    #[serde(default)]
    pub handles: CategoryBytes,
    /// The records the run keeps on the host beside its tensors, per category: host bytes
    /// allocated outside any op of the backend (burn's autodiff graph, its optimizers' and
    /// modules' records, the program's own, the loader's), less the host data a tensor took
    /// over as its buffer. Measured by trainmem-probe's counting allocator
    /// ([`trainmem_probe::BackendScope`] marks the backend's ops); zero when it is not the
    /// global allocator. Host memory on every backend, never device memory.
    #[serde(default)]
    pub records: CategoryBytes,
}

impl TrackedBytes {
    /// What the tracker accounts for under `category` on a host backend: the buffers, the
    /// tensors' own records and the records beside them.
    pub fn host_accounted(&self, category: Category) -> u64 {
        self.live.get(category) + self.handles.get(category) + self.records.get(category)
    }
}

#[derive(Default)]
struct State {
    by_key: HashMap<u64, Weak<Token>, KeyHash>,
    live: [u64; 8],
    peak: [u64; 8],
    total: u64,
    total_peak: u64,
    buffers: u64,
    buffers_created: u64,
    /// Live bytes per category of buffers taken over from the caller's host data.
    adopted: [u64; 8],
}

impl State {
    fn add(&mut self, category: Category, bytes: u64) {
        let i = category.index();
        self.live[i] += bytes;
        self.peak[i] = self.peak[i].max(self.live[i]);
        self.total += bytes;
        self.total_peak = self.total_peak.max(self.total);
        self.buffers += 1;
        self.buffers_created += 1;
    }

    fn remove(&mut self, category: Category, bytes: u64) {
        let i = category.index();
        self.live[i] = self.live[i].saturating_sub(bytes);
        self.total = self.total.saturating_sub(bytes);
        self.buffers = self.buffers.saturating_sub(1);
    }
}

/// Live handle bytes per category (atomics: every tensor's drop updates them, without the lock).
static HANDLES: [AtomicU64; 8] = [const { AtomicU64::new(0) }; 8];

/// One tensor's record beside its buffer: its bytes are counted while it lives, under the
/// category of the thread that made the tensor.
#[derive(Debug)]
pub(crate) struct Handle {
    bytes: u32,
    category: u8,
}

impl Handle {
    /// A record of `bytes` under the calling thread's category (nothing counted for 0 bytes).
    pub(crate) fn new(bytes: u64) -> Handle {
        let bytes = u32::try_from(bytes).unwrap_or(u32::MAX);
        let category = trainmem_probe::current_category();
        if bytes > 0 {
            HANDLES[category.index()].fetch_add(u64::from(bytes), Ordering::Relaxed);
        }
        Handle {
            bytes,
            category: category.index() as u8,
        }
    }

    /// Whether the record counts any bytes.
    pub(crate) fn counts(&self) -> bool {
        self.bytes > 0
    }
}

impl Clone for Handle {
    /// A clone's record is its own, made by the cloning thread (the inner tensor's clone
    /// allocates its shape and strides anew under that thread's tag).
    fn clone(&self) -> Handle {
        Handle::new(u64::from(self.bytes))
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        if self.bytes > 0 {
            let slot = &HANDLES[usize::from(self.category) % HANDLES.len()];
            slot.fetch_sub(u64::from(self.bytes), Ordering::Relaxed);
        }
    }
}

thread_local! {
    /// The address of the host data a `*_from_data` op of this thread is turning into a tensor
    /// (0 outside such an op).
    static ADOPTING: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Tells the tracker that the op running on this thread makes a tensor from host data at
/// `addr`, until [`adopting_done`]: a new buffer at that address took the data over.
pub(crate) fn adopting(addr: u64) {
    let _ = ADOPTING.try_with(|a| a.set(addr));
}

/// Ends [`adopting`].
pub(crate) fn adopting_done() {
    let _ = ADOPTING.try_with(|a| a.set(0));
}

/// The bytes of a new buffer `info` taken over from the caller's data, if the running op is
/// turning data at the buffer's address into a tensor.
fn adopted(info: &BufferInfo) -> u64 {
    let addr = ADOPTING.try_with(std::cell::Cell::get).unwrap_or(0);
    if addr != 0 && addr == info.key {
        info.adoptable.min(info.bytes)
    } else {
        0
    }
}

static STATE: LazyLock<Mutex<State>> = LazyLock::new(|| Mutex::new(State::default()));

fn state() -> MutexGuard<'static, State> {
    // A panic while the lock was held leaves plain counters behind: keep counting.
    STATE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The token of an op output: the existing token of the buffer `info` names (unless `fresh`:
/// a new buffer at the address of one the op freed, which replaces that key's entry), a new
/// one, the `view_of` token when the backend names no buffer and the op is a view, or a new
/// token of `fallback_bytes()` bytes. `None` for a buffer of no bytes.
pub(crate) fn track(
    info: Option<BufferInfo>,
    view_of: Option<&Keep>,
    fresh: bool,
    fallback_bytes: impl FnOnce() -> u64,
) -> Option<Keep> {
    let category = trainmem_probe::current_category();
    match info {
        Some(info @ BufferInfo { key, bytes, .. }) => {
            if bytes == 0 {
                return None;
            }
            let _own = CategoryScope::enter(Category::Other);
            let mut s = state();
            if !fresh && let Some(token) = s.by_key.get(&key).and_then(Weak::upgrade) {
                return Some(token);
            }
            let adopted = adopted(&info);
            let token = Arc::new(Token {
                key: Some(key),
                bytes,
                category,
                adopted,
            });
            s.by_key.insert(key, Arc::downgrade(&token));
            s.add(category, bytes);
            s.adopted[category.index()] += adopted;
            Some(token)
        }
        None => {
            if let Some(token) = view_of {
                return Some(Arc::clone(token));
            }
            let bytes = fallback_bytes();
            if bytes == 0 {
                return None;
            }
            let _own = CategoryScope::enter(Category::Other);
            let token = Arc::new(Token {
                key: None,
                bytes,
                category,
                adopted: 0,
            });
            state().add(category, bytes);
            Some(token)
        }
    }
}

impl Drop for Token {
    fn drop(&mut self) {
        let mut s = state();
        if let Some(key) = self.key {
            // Another token may hold the key by now (a buffer created again at the address
            // after this one's count reached zero): remove the entry only if it is this one.
            let mine = s
                .by_key
                .get(&key)
                .is_some_and(|w| std::ptr::eq(w.as_ptr(), self as *const Token));
            if mine {
                s.by_key.remove(&key);
            }
        }
        s.remove(self.category, self.bytes);
        let slot = &mut s.adopted[self.category.index()];
        *slot = slot.saturating_sub(self.adopted);
    }
}

/// What the tracker counts now, and the peaks since the last [`reset_peaks`].
pub fn snapshot() -> TrackedBytes {
    let host = trainmem_probe::is_installed().then(trainmem_probe::snapshot);
    let s = state();
    let records = host.map_or([0; 8], |h| records_of(&h, &s.adopted));
    TrackedBytes {
        live: CategoryBytes(s.live),
        peak: CategoryBytes(s.peak),
        total_peak: s.total_peak,
        buffers: s.buffers,
        buffers_created: s.buffers_created,
        handles: CategoryBytes(std::array::from_fn(|i| HANDLES[i].load(Ordering::Relaxed))),
        records: CategoryBytes(records),
    }
}

/// The records beside the tensors ([`TrackedBytes::records`]) in the counting allocator's
/// snapshot `host`: its bytes allocated outside any backend op, less the host data tensors took
/// over. A probe that reads `host` for its own figures passes it here, so both describe one
/// instant even while other threads (a loader's workers) allocate.
pub fn records_beside(host: &trainmem_probe::AllocSnapshot) -> CategoryBytes {
    CategoryBytes(records_of(host, &state().adopted))
}

fn records_of(host: &trainmem_probe::AllocSnapshot, adopted: &[u64; 8]) -> [u64; 8] {
    std::array::from_fn(|i| {
        let outside = host.outside_backend(Category::ALL[i]) as u64;
        outside.saturating_sub(adopted[i])
    })
}

/// Starts new peaks from the live bytes (a probe calls it at every sample, so each sample's
/// peaks cover the phase that just ended).
pub fn reset_peaks() {
    let mut s = state();
    s.peak = s.live;
    s.total_peak = s.total;
}

#[cfg(test)]
mod tests {
    use super::*;

    // The ledger is process-wide: the tests that read totals serialise on this lock.
    pub(crate) static SERIAL: Mutex<()> = Mutex::new(());

    #[test]
    fn a_named_buffer_is_counted_once_and_released_with_its_last_holder() {
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let before = snapshot();
        let info = BufferInfo {
            key: 0xdead_0000,
            bytes: 4096,
            handle_bytes: 0,
            handle_key: 0,
            adoptable: 0,
        };
        let a = {
            let _tag = CategoryScope::enter(Category::Gradient);
            track(Some(info), None, false, || {
                unreachable!("the backend named the buffer")
            })
        };
        // A second output holding the same buffer, under another tag, joins the first token.
        let b = {
            let _tag = CategoryScope::enter(Category::Activation);
            track(Some(info), None, false, || 0)
        };
        let now = snapshot();
        assert_eq!(now.live.total() - before.live.total(), 4096);
        assert_eq!(
            now.live.get(Category::Gradient) - before.live.get(Category::Gradient),
            4096
        );
        assert_eq!(now.buffers - before.buffers, 1);
        drop(a);
        assert_eq!(snapshot().live.total() - before.live.total(), 4096);
        drop(b);
        assert_eq!(snapshot().live.total(), before.live.total());
        assert_eq!(snapshot().buffers, before.buffers);
    }

    #[test]
    fn unnamed_buffers_follow_the_view_rule() {
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let before = snapshot().live.total();
        let base = track(None, None, false, || 100).expect("100 bytes are a buffer");
        let view = track(None, Some(&base), false, || {
            unreachable!("a view counts nothing")
        });
        assert_eq!(snapshot().live.total() - before, 100);
        let other = track(None, None, false, || 28);
        assert_eq!(snapshot().live.total() - before, 128);
        drop((base, other));
        assert_eq!(
            snapshot().live.total() - before,
            100,
            "the view keeps its buffer"
        );
        drop(view);
        assert_eq!(snapshot().live.total(), before);
        assert!(
            track(None, None, false, || 0).is_none(),
            "no bytes, no token"
        );
    }

    #[test]
    fn a_key_reused_after_release_starts_a_new_buffer() {
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let before = snapshot().live.total();
        let info = BufferInfo {
            key: 0xbeef_0000,
            bytes: 64,
            handle_bytes: 0,
            handle_key: 0,
            adoptable: 0,
        };
        let first = track(Some(info), None, false, || 0);
        drop(first);
        let second = track(Some(BufferInfo { bytes: 32, ..info }), None, false, || 0);
        assert_eq!(snapshot().live.total() - before, 32);
        drop(second);
        assert_eq!(snapshot().live.total(), before);
    }
}
