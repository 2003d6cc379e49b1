//! One import point for the synchronisation primitives of the hand-made concurrency in this
//! crate ([`crate::master::SnapshotCell`]), so that `--cfg loom` swaps them for loom's
//! model-checked versions (see `tests/loom.rs`).

#[cfg(loom)]
pub(crate) use loom::sync::{
    Mutex,
    atomic::{AtomicPtr, AtomicU64, Ordering},
};
#[cfg(not(loom))]
pub(crate) use std::sync::{
    Mutex,
    atomic::{AtomicPtr, AtomicU64, Ordering},
};

/// Immutable data shared through raw pointers and freed by hand. Without loom it is the value
/// itself. Under loom every read ([`Tracked::get`]) and the free ([`free`]) are accesses of a
/// `loom::cell::UnsafeCell`, so loom reports a read that is not ordered after the value was
/// built (torn data) or not ordered before its free (a use after free).
pub(crate) struct Tracked<T> {
    #[cfg(loom)]
    cell: loom::cell::UnsafeCell<T>,
    #[cfg(not(loom))]
    value: T,
}

impl<T> Tracked<T> {
    pub(crate) fn new(value: T) -> Self {
        #[cfg(loom)]
        return Tracked { cell: loom::cell::UnsafeCell::new(value) };
        #[cfg(not(loom))]
        return Tracked { value };
    }

    /// The value; the caller keeps it alive for as long as the reference is used.
    #[inline(always)]
    pub(crate) fn get(&self) -> &T {
        #[cfg(loom)]
        // SAFETY: the value is never written after `new`; loom checks this read's ordering.
        return self.cell.with(|value| unsafe { &*value });
        #[cfg(not(loom))]
        return &self.value;
    }
}

/// Frees a value made with `Box::into_raw(Box::new(Tracked::new(..)))`.
///
/// # Safety
/// `tracked` is such a pointer, freed once, and no reader uses it any more. Under loom the free
/// is a tracked write and the memory is leaked rather than freed, so a reader that breaks the
/// rule is reported by loom instead of reading freed memory.
pub(crate) unsafe fn free<T>(tracked: *mut Tracked<T>) {
    #[cfg(loom)]
    // SAFETY: per the contract; the write stands for the free.
    unsafe {
        (*tracked).cell.with_mut(|_| ())
    };
    #[cfg(not(loom))]
    // SAFETY: per the contract.
    drop(unsafe { Box::from_raw(tracked) });
}
