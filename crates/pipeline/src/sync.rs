//! One import point for every synchronisation primitive, so that `--cfg loom` swaps the whole
//! crate onto loom's model-checked versions (see `tests/loom.rs`).

#[cfg(loom)]
pub(crate) use loom::{
    hint::spin_loop,
    sync::{
        Arc, Condvar, Mutex, MutexGuard,
        atomic::{AtomicBool, AtomicUsize, Ordering, fence},
    },
    thread::yield_now,
};
#[cfg(not(loom))]
pub(crate) use std::{
    hint::spin_loop,
    sync::{
        Arc, Condvar, Mutex, MutexGuard,
        atomic::{AtomicBool, AtomicUsize, Ordering, fence},
    },
    thread::yield_now,
};

/// `UnsafeCell` with loom's closure-based access API, so loom can check every slot access for
/// data races. Without loom the closures compile down to a raw pointer access.
#[derive(Debug)]
pub(crate) struct UnsafeCell<T>(
    #[cfg(loom)] loom::cell::UnsafeCell<T>,
    #[cfg(not(loom))] std::cell::UnsafeCell<T>,
);

impl<T> UnsafeCell<T> {
    pub(crate) fn new(value: T) -> Self {
        #[cfg(loom)]
        return Self(loom::cell::UnsafeCell::new(value));
        #[cfg(not(loom))]
        return Self(std::cell::UnsafeCell::new(value));
    }

    #[inline(always)]
    pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        #[cfg(loom)]
        return self.0.with(f);
        #[cfg(not(loom))]
        return f(self.0.get());
    }

    #[inline(always)]
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        #[cfg(loom)]
        return self.0.with_mut(f);
        #[cfg(not(loom))]
        return f(self.0.get());
    }
}

/// Aligns a value to 128 bytes: two 64-byte lines, because Intel's adjacent-line prefetcher
/// pulls cache lines in pairs and would otherwise re-create false sharing.
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct CachePadded<T>(pub(crate) T);

impl<T> std::ops::Deref for CachePadded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// Locks a mutex, ignoring poisoning: the data our mutexes guard stays consistent even if a
/// holder panicked (every critical section is a few plain stores), and a panic is reported by
/// the stage runtime, not by a second panic here.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
