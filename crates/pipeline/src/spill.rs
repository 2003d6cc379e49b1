//! A single-producer, single-consumer queue whose producer never waits: a [`crate::ring`]
//! for the steady state and, when the ring is full, an overflow list behind a mutex that the
//! consumer empties after the ring. Order is kept across the two.
//!
//! For a producer that must not block on its consumer, because the consumer may be waiting
//! for the producer's thread: the exchange tier's R-Senders hand replies to the network
//! gateway's I/O thread this way, and on a host with few CPUs that I/O thread runs the
//! R-Senders itself. Memory is bounded by what the consumer's own work puts in flight (the
//! gateway's replies answer orders it admitted), not by the queue.
//!
//! # Why the order holds
//!
//! `spilled` is raised by the producer, under the lock, whenever it puts an item into the
//! overflow, and lowered by the consumer, under the lock, only when it has emptied the overflow.
//! The producer writes to the ring only after reading `spilled` lowered (Acquire, pairing with
//! the consumer's Release), that is after every earlier overflow item was taken. So every
//! ring item older than an overflow item was written before it, and every ring item newer than
//! an overflow item was written after that item was taken; the consumer reads the ring before
//! the overflow in each pass, and again once it has seen `spilled` raised (a ring item written
//! just before the spill may have been invisible to its first read), so it sees them in the
//! order sent. `tests/loom.rs` checks it
//! (`a_spill_queue_keeps_order_across_ring_and_overflow`).
//!
//! ```
//! use pipeline::spill;
//! let (mut tx, mut rx) = spill::queue::<u32>(2).unwrap();
//! for value in 1..=5 {
//!     tx.send(value); // never waits: 3, 4 and 5 go to the overflow
//! }
//! let mut seen = Vec::new();
//! while rx.read(8, |value| seen.push(*value)) > 0 {}
//! assert_eq!(seen, [1, 2, 3, 4, 5]);
//! assert!(spill::queue::<u32>(3).is_err(), "the ring's size is a power of two");
//! ```

use std::collections::VecDeque;

use crate::WaitStrategy;
use crate::ring::{self, Consumer, Producer, RingConfig, RingError};
use crate::sync::{Arc, AtomicBool, Mutex, Ordering};

/// What both ends share besides the ring.
struct Overflow<T> {
    items: Mutex<VecDeque<T>>,
    /// Whether `items` may hold something (see the module docs).
    spilled: AtomicBool,
}

/// The producing end.
pub struct SpillSender<T> {
    ring: Producer<T>,
    overflow: Arc<Overflow<T>>,
}

/// The consuming end.
pub struct SpillReceiver<T> {
    ring: Consumer<T>,
    overflow: Arc<Overflow<T>>,
}

/// A queue whose ring has `ring_slots` slots (a power of two).
pub fn queue<T: Copy + Default + Send>(
    ring_slots: usize,
) -> Result<(SpillSender<T>, SpillReceiver<T>), RingError> {
    let config = RingConfig {
        capacity_slots: ring_slots,
        batch_slots_max: ring_slots.min(256),
        wait: WaitStrategy::Park,
    };
    let (producer, consumer) = ring::spsc(&config)?;
    let overflow =
        Arc::new(Overflow { items: Mutex::new(VecDeque::new()), spilled: AtomicBool::new(false) });
    Ok((
        SpillSender { ring: producer, overflow: overflow.clone() },
        SpillReceiver { ring: consumer, overflow },
    ))
}

impl<T: Copy> SpillSender<T> {
    /// Queues `item` without waiting: into the ring when it has room and nothing waits in the
    /// overflow, else into the overflow. Returns whether the item spilled.
    ///
    /// ```
    /// let (mut tx, _rx) = pipeline::spill::queue::<u8>(1).unwrap();
    /// assert!(!tx.send(1), "room in the ring");
    /// assert!(tx.send(2), "the ring is full: spilled");
    /// ```
    pub fn send(&mut self, item: T) -> bool {
        // Acquire: pairs with the consumer's Release when it lowered the flag, so the items
        // it took from the overflow were taken before this one goes into the ring.
        if !self.overflow.spilled.load(Ordering::Acquire)
            && self.ring.try_write_batch(1, |_, slot| *slot = item).is_ok()
        {
            return false;
        }
        let mut items = self.overflow.items.lock().unwrap_or_else(|e| e.into_inner());
        items.push_back(item);
        // Release (and under the lock): the consumer that sees it raised finds the item.
        self.overflow.spilled.store(true, Ordering::Release);
        true
    }
}

impl<T: Copy> SpillReceiver<T> {
    /// Hands `f` up to `max` items in the order sent (the ring's, then the overflow's);
    /// returns how many. Never waits.
    ///
    /// ```
    /// let (mut tx, mut rx) = pipeline::spill::queue::<u8>(4).unwrap();
    /// assert_eq!(rx.read(8, |_| {}), 0, "empty");
    /// tx.send(7);
    /// let mut got = None;
    /// assert_eq!(rx.read(8, |value| got = Some(*value)), 1);
    /// assert_eq!(got, Some(7));
    /// ```
    pub fn read(&mut self, max: usize, mut f: impl FnMut(&T)) -> usize {
        let mut from_ring = self.ring.read_batch(max, &mut f);
        // Acquire: pairs with the producer's Release after it pushed into the overflow.
        if from_ring == max || !self.overflow.spilled.load(Ordering::Acquire) {
            return from_ring;
        }
        // The ring items written before the overflow's first are visible now (the flag's
        // Acquire), though the read above may have missed them: they go first.
        from_ring += self.ring.read_batch(max - from_ring, &mut f);
        if from_ring == max {
            return from_ring;
        }
        let mut items = self.overflow.items.lock().unwrap_or_else(|e| e.into_inner());
        let take = (max - from_ring).min(items.len());
        for item in items.drain(..take) {
            f(&item);
        }
        if items.is_empty() {
            // Release: see `SpillSender::send`.
            self.overflow.spilled.store(false, Ordering::Release);
        }
        from_ring + take
    }

    /// Items waiting in the ring (the overflow not counted: it holds items only while the
    /// ring is full).
    pub fn ring_len(&self) -> usize {
        self.ring.len()
    }
}
