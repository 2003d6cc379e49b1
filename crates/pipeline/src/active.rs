//! Resizable stages: how many of a stage's spawned workers receive new messages.
//!
//! A resizable stage spawns `max` workers up front (each with its full mesh of inbound rings)
//! and keeps one [`ActiveWorkers`] count that every upstream worker reads when it routes a
//! message: routing only picks among the *active prefix* `0..active` of the workers.
//! Shrinking lowers the count; growing raises it. Nothing is started, stopped or rebuilt.
//!
//! # Why no message is lost or duplicated (the concurrency argument)
//! - A message is routed to exactly one ring of one worker, once, by the upstream worker that
//!   holds it: resizing changes *which* ring, never *how many*.
//! - Every worker `0..max` keeps draining all of its inbound rings until they are disconnected,
//!   whether it is active or not. Active only means "upstream routes new messages here". So a
//!   message routed to a worker a moment before (or, seeing a stale count, a moment after) the
//!   worker was deactivated is still handled, by that worker, in ring order.
//! - A deactivated worker whose rings are empty waits like any idle worker: it spins, yields,
//!   then parks on its parker (per its wait strategy). Activation needs no wake-up of its own:
//!   the first message routed to it is pushed through one of its rings, and the ring's publish
//!   protocol notifies the consumer's parker (model-checked in `tests/loom.rs`).
//! - Shutdown is unchanged: every worker exits once its rings are disconnected and drained.
//!
//! Hence the count needs no ordering with anything: any value in `1..=max` that a producer
//! reads names a live, draining worker, and the count guards no other data. `Relaxed` loads
//! and stores suffice; coherence makes producers see a new count within a few routing
//! decisions in practice, which is all a controller needs.
//!
//! # What resizing does not keep
//! [`crate::stage::Route::ByKey`] maps keys over the active prefix, so a resize moves keys
//! between workers: a key's messages already queued at its old worker may be handled after
//! newer ones at its new worker. Per-key order holds between resizes, not across one.

use crate::sync::{AtomicUsize, CachePadded, Ordering};

/// A resize outside `1..=max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{requested} active workers requested; this stage has 1..={max}")]
pub struct ResizeOutOfRange {
    /// The active count asked for.
    pub requested: usize,
    /// The stage's spawned workers: the most that can be active.
    pub max: usize,
}

/// The number of a stage's workers that receive new messages (see the module docs).
#[derive(Debug)]
pub struct ActiveWorkers {
    /// Padded: read on every routing decision by every upstream worker, written rarely, so it
    /// must not share a line with anything written often.
    active: CachePadded<AtomicUsize>,
    max: usize,
}

impl ActiveWorkers {
    /// `active` of `max` workers active; panics unless `1 <= active <= max` (callers validate).
    pub fn new(active: usize, max: usize) -> ActiveWorkers {
        assert!(1 <= active && active <= max, "active workers {active} outside 1..={max}");
        ActiveWorkers { active: CachePadded(AtomicUsize::new(active)), max }
    }

    /// Workers currently receiving new messages, in `1..=max`.
    #[inline]
    pub fn get(&self) -> usize {
        // Relaxed: any value ever stored is a valid routing target (module docs).
        self.active.load(Ordering::Relaxed)
    }

    /// Workers spawned, the most that can be active.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Routes new messages to workers `0..active` from now on.
    pub fn set(&self, active: usize) -> Result<(), ResizeOutOfRange> {
        if !(1..=self.max).contains(&active) {
            return Err(ResizeOutOfRange { requested: active, max: self.max });
        }
        // Relaxed: the count publishes no data; workers drain whatever reached them (module
        // docs), so no producer needs to see the store at any particular moment.
        self.active.store(active, Ordering::Relaxed);
        Ok(())
    }

    /// Round-robin over the active prefix: returns the worker for this message and advances
    /// `next` (the caller's private cursor). A cursor left beyond a shrunk prefix restarts at 0.
    #[inline]
    pub fn next_round_robin(&self, next: &mut usize) -> usize {
        let active = self.get();
        let worker = if *next >= active { 0 } else { *next };
        *next = if worker + 1 == active { 0 } else { worker + 1 };
        worker
    }

    /// The active worker for a 64-bit key: Fibonacci hashing spreads consecutive keys, and a
    /// multiply-shift maps the hash onto `0..active` without a division.
    #[inline]
    pub fn by_key(&self, key: u64) -> usize {
        let hash = key.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        ((u128::from(hash) * self.get() as u128) >> 64) as usize
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn round_robin_covers_the_active_prefix_and_follows_resizes() {
        let active = ActiveWorkers::new(3, 4);
        let mut next = 0;
        let picks: Vec<usize> = (0..6).map(|_| active.next_round_robin(&mut next)).collect();
        assert_eq!(picks, [0, 1, 2, 0, 1, 2]);
        active.set(4).unwrap();
        let picks: Vec<usize> = (0..4).map(|_| active.next_round_robin(&mut next)).collect();
        assert_eq!(picks, [0, 1, 2, 3]);
        next = 3;
        active.set(2).unwrap();
        let picks: Vec<usize> = (0..3).map(|_| active.next_round_robin(&mut next)).collect();
        assert_eq!(picks, [0, 1, 0], "a cursor beyond the shrunk prefix restarts at 0");
    }

    #[test]
    fn keys_map_into_the_active_prefix_and_bad_sizes_are_refused() {
        let active = ActiveWorkers::new(1, 8);
        assert!((0..100).all(|key| active.by_key(key) == 0));
        active.set(5).unwrap();
        assert!((0..1000).all(|key| active.by_key(key) < 5));
        assert_eq!(active.set(0), Err(ResizeOutOfRange { requested: 0, max: 8 }));
        assert_eq!(active.set(9), Err(ResizeOutOfRange { requested: 9, max: 8 }));
        assert_eq!(active.get(), 5, "a refused resize changes nothing");
    }
}
