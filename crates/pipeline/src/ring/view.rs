//! The ring's slots and batch headers seen through raw pointers that each side keeps in its
//! own struct, so that reaching a slot or a header is one masked index from a pointer the
//! side already holds: no load through the shared `Arc`, no bounds check, per message. Every
//! unsafe index computation of the ring lives here, behind one invariant: an index is masked
//! into `0..capacity`, and both arrays hold `capacity` entries that outlive the view.

use std::ptr::NonNull;

use crate::sync::{AtomicUsize, Ordering, UnsafeCell};

/// Pointers to a ring's `capacity` slots and `capacity` batch headers.
///
/// `Copy`, so that a loop can hold the view in registers: through a reference, the compiler
/// reloads its fields after every Acquire load of a header. A copy is valid exactly as long
/// as the view it was copied from (see [`RingView::new`]); none leaves the ring's sides.
pub(super) struct RingView<T> {
    slots: NonNull<UnsafeCell<T>>,
    batch_ends: NonNull<AtomicUsize>,
    mask: usize,
}

impl<T> Clone for RingView<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for RingView<T> {}

impl<T> RingView<T> {
    /// A view of `slots` and `batch_ends`, which must have the same power-of-two length.
    ///
    /// # Safety
    /// Both slices must stay allocated, at the same address, for as long as the view (or
    /// anything it hands out) is used: the side holding the view also holds the `Arc` that
    /// owns them, and boxed slices never move.
    pub(super) unsafe fn new(slots: &[UnsafeCell<T>], batch_ends: &[AtomicUsize]) -> Self {
        assert!(slots.len().is_power_of_two(), "ring capacity {} is a power of two", slots.len());
        assert_eq!(slots.len(), batch_ends.len(), "one batch header per slot");
        RingView {
            slots: NonNull::from(slots).cast(),
            batch_ends: NonNull::from(batch_ends).cast(),
            mask: slots.len() - 1,
        }
    }

    /// Slots in the ring.
    #[inline(always)]
    pub(super) fn capacity(&self) -> usize {
        self.mask + 1
    }

    /// The batch header beside the slot of `index` (masked).
    #[inline(always)]
    pub(super) fn header(&self, index: usize) -> &AtomicUsize {
        // SAFETY: `index & mask` < capacity, the headers' length; `new`'s contract keeps them
        // allocated while `self` is borrowed.
        unsafe { &*self.batch_ends.as_ptr().add(index & self.mask) }
    }

    /// The slot of `index` (masked).
    #[inline(always)]
    pub(super) fn slot(&self, index: usize) -> &UnsafeCell<T> {
        // SAFETY: as in `header`, for the slots.
        unsafe { &*self.slots.as_ptr().add(index & self.mask) }
    }

    /// The end of the batch published starting at index `start`, if the producer has
    /// published it; `None` while the header beside `start`'s slot is one from an earlier lap
    /// (or the initial 0), whose end lies at or before `start`.
    #[inline(always)]
    pub(super) fn published_batch_end(&self, start: usize) -> Option<usize> {
        // Acquire: the producer's writes of the batch's slots happen before we read them.
        let end = self.header(start).load(Ordering::Acquire);
        // `end - start` in 1..=capacity, as one unsigned comparison.
        (end.wrapping_sub(start).wrapping_sub(1) <= self.mask).then_some(end)
    }

    /// Whether the `SPAN` batches starting at `start`, `start + 1`, … are all published and
    /// one message each: every header loaded (Acquire, as in `published_batch_end`) and
    /// compared, with no branch between them, so the loads go out together.
    #[inline(always)]
    pub(super) fn single_slot_batches<const SPAN: usize>(&self, start: usize) -> bool {
        (0..SPAN).fold(true, |all, i| {
            let index = start.wrapping_add(i);
            // Acquire: the producer's write of the slot happens before we read it.
            all & (self.header(index).load(Ordering::Acquire) == index.wrapping_add(1))
        })
    }

    /// The `n` slots from index `start` as at most two contiguous runs (before and after the
    /// wrap), so the copy loops run over plain slices: no masking or bounds check per message.
    ///
    /// # Safety
    /// `n` must not exceed the capacity (callers pass at most `batch_slots_max`, which the
    /// ring's configuration bounds by the capacity).
    #[inline(always)]
    pub(super) unsafe fn runs(&self, start: usize, n: usize) -> [&[UnsafeCell<T>]; 2] {
        debug_assert!(n <= self.capacity());
        let index = start & self.mask;
        let first_len = n.min(self.capacity() - index);
        let first = self.slots.as_ptr();
        // SAFETY: `[index, index + first_len)` ends at or before the capacity, and
        // `[0, n - first_len)` too since `n` ≤ capacity (the caller's contract); `new`'s
        // contract keeps the slots allocated while `self` is borrowed.
        unsafe {
            [
                std::slice::from_raw_parts(first.add(index), first_len),
                std::slice::from_raw_parts(first, n - first_len),
            ]
        }
    }
}
