//! The thread-local category tag that the counting allocator reads.
//!
//! Every thread carries one [`Category`]; an allocation made by the thread is counted under the
//! tag it carries at that moment. A thread starts tagged [`Category::Other`].
//!
//! The tag is a `const`-initialised `thread_local!` holding a `Cell<u8>`: reading it never
//! allocates and never registers a destructor, so the global allocator can read it without
//! recursing into itself.

use std::cell::Cell;
use std::marker::PhantomData;

use trainmem_core::Category;

thread_local! {
    static TAG: Cell<u8> = const { Cell::new(Category::Other as u8) };
    /// How many [`BackendScope`]s the thread is inside.
    static IN_BACKEND: Cell<u32> = const { Cell::new(0) };
}

/// Whether the calling thread is inside a [`BackendScope`]; `false` while the thread-local is
/// being torn down.
pub(crate) fn in_backend() -> bool {
    IN_BACKEND.try_with(|d| d.get() > 0).unwrap_or(false)
}

/// Converts a stored tag byte back into a category (bytes that are not a category read as
/// [`Category::Other`]).
pub(crate) fn category_from_u8(byte: u8) -> Category {
    Category::ALL
        .get(usize::from(byte))
        .copied()
        .unwrap_or(Category::Other)
}

/// The tag of the calling thread as a byte; `Other` while the thread-local is being torn down.
pub(crate) fn current_tag_byte() -> u8 {
    TAG.try_with(Cell::get).unwrap_or(Category::Other as u8)
}

/// Sets the calling thread's category; every later allocation by this thread is counted under
/// it until the tag changes again.
pub fn set_thread_category(category: Category) {
    // During thread teardown the slot may be gone; there is nothing left to tag then.
    let _ = TAG.try_with(|t| t.set(category as u8));
}

/// The calling thread's current category.
pub fn current_category() -> Category {
    category_from_u8(current_tag_byte())
}

/// A scope during which the calling thread carries a category; dropping it restores the tag the
/// thread had before. Scopes nest. The guard is tied to its thread (it is neither `Send` nor
/// `Sync`), so it always restores the tag of the thread that entered it.
#[derive(Debug)]
#[must_use = "the previous category is restored when the scope is dropped"]
pub struct CategoryScope {
    previous: Category,
    _not_send: PhantomData<*const ()>,
}

impl CategoryScope {
    /// Tags the calling thread with `category` until the returned guard is dropped.
    pub fn enter(category: Category) -> CategoryScope {
        let previous = current_category();
        set_thread_category(category);
        CategoryScope {
            previous,
            _not_send: PhantomData,
        }
    }

    /// The category that will be restored on drop.
    pub fn previous(&self) -> Category {
        self.previous
    }
}

impl Drop for CategoryScope {
    fn drop(&mut self) {
        set_thread_category(self.previous);
    }
}

/// A scope during which the calling thread runs a tensor backend's op: the blocks it allocates
/// meanwhile are counted under their category as usual, and also as the backend's
/// ([`crate::AllocSnapshot::in_backend`]) until they are freed, by whichever thread.
///
/// This is how a measured run tells the backend's tensors (buffers, shapes, strides, made
/// inside its ops) from the records the framework and the program keep beside them (graph
/// nodes, optimizer maps, module records, made outside any op). Scopes nest; the guard is tied
/// to its thread.
#[derive(Debug)]
#[must_use = "the thread leaves the backend when the scope is dropped"]
pub struct BackendScope {
    _not_send: PhantomData<*const ()>,
}

impl BackendScope {
    /// Marks the calling thread as inside a backend op until the guard is dropped.
    pub fn enter() -> BackendScope {
        let _ = IN_BACKEND.try_with(|d| d.set(d.get().saturating_add(1)));
        BackendScope {
            _not_send: PhantomData,
        }
    }
}

impl Drop for BackendScope {
    fn drop(&mut self) {
        let _ = IN_BACKEND.try_with(|d| d.set(d.get().saturating_sub(1)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_nest_and_restore() {
        set_thread_category(Category::Other);
        assert_eq!(current_category(), Category::Other);
        {
            let outer = CategoryScope::enter(Category::Activation);
            assert_eq!(outer.previous(), Category::Other);
            assert_eq!(current_category(), Category::Activation);
            {
                let _inner = CategoryScope::enter(Category::Gradient);
                assert_eq!(current_category(), Category::Gradient);
            }
            assert_eq!(current_category(), Category::Activation);
        }
        assert_eq!(current_category(), Category::Other);
    }

    #[test]
    fn tags_are_per_thread() {
        set_thread_category(Category::Parameter);
        let seen = std::thread::spawn(|| {
            let before = current_category();
            set_thread_category(Category::Input);
            (before, current_category())
        })
        .join()
        .expect("thread");
        assert_eq!(seen, (Category::Other, Category::Input));
        assert_eq!(current_category(), Category::Parameter);
        set_thread_category(Category::Other);
    }

    #[test]
    fn every_category_round_trips_through_its_byte() {
        for c in Category::ALL {
            assert_eq!(category_from_u8(c as u8), c);
        }
        assert_eq!(category_from_u8(200), Category::Other);
    }
}
