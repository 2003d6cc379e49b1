//! [`DurableSeq`]: the highest sequence number known to be on disk, published by the writer
//! and polled by whoever releases replies.
//!
//! Concurrency argument: one writer thread stores, any number of threads load. The value only
//! grows (the writer publishes the last sequence of each synced batch, in order), so a reader
//! that sees `n` may release every reply for a sequence `<= n`. The store happens after
//! `fdatasync` returned, so observing `n` implies the records up to `n` are durable.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use pipeline::{Parker, WaitStrategy, Waiter};

use crate::error::JournalError;

/// Keeps the hot, frequently read counter on its own cache lines (two, for the adjacent-line
/// prefetcher), so publishing it does not invalidate unrelated data of the reader.
#[repr(align(128))]
#[derive(Debug, Default)]
struct Padded(AtomicU64);

/// The durable sequence number plus the writer's failure flag.
#[derive(Debug, Default)]
pub struct DurableSeq {
    seq: Padded,
    failed: AtomicBool,
    parker: Arc<Parker>,
}

impl DurableSeq {
    /// Starts at `seq`: everything up to it was already durable when the writer started.
    pub fn new(seq: u64) -> Arc<DurableSeq> {
        Arc::new(DurableSeq { seq: Padded(AtomicU64::new(seq)), ..DurableSeq::default() })
    }

    /// The highest sequence number on disk.
    #[inline]
    pub fn get(&self) -> u64 {
        // Acquire: pairs with the writer's Release in `publish`, so anything the writer
        // recorded before publishing (its statistics, the failure flag) is visible with it.
        self.seq.0.load(Ordering::Acquire)
    }

    /// Whether the reply for `seq` may be released.
    #[inline]
    pub fn covers(&self, seq: u64) -> bool {
        self.get() >= seq
    }

    /// True once the writer stopped on an error: the durable sequence will not grow again.
    pub fn has_failed(&self) -> bool {
        // Acquire: pairs with the Release in `mark_failed`.
        self.failed.load(Ordering::Acquire)
    }

    /// Waits until `seq` is durable, per `strategy`; `Err` if the writer fails first.
    pub fn wait_for(&self, seq: u64, strategy: WaitStrategy) -> Result<(), JournalError> {
        if !self.covers(seq) {
            Waiter::new(strategy, Arc::clone(&self.parker))
                .wait_until(|| self.covers(seq) || self.has_failed());
        }
        if self.covers(seq) { Ok(()) } else { Err(JournalError::WriterStopped) }
    }

    /// Writer side: records up to `seq` are on disk.
    pub(crate) fn publish(&self, seq: u64) {
        debug_assert!(seq >= self.seq.0.load(Ordering::Relaxed), "the durable sequence only grows");
        // Release: see `get`. The store itself is ordered after fdatasync returned (a syscall
        // boundary), which is what makes the published value true.
        self.seq.0.store(seq, Ordering::Release);
        // No syscall unless a waiter sleeps (pipeline::wait's protocol).
        self.parker.notify();
    }

    /// Writer side: the writer stopped on an error.
    pub(crate) fn mark_failed(&self) {
        // Release: pairs with the Acquire in `has_failed`.
        self.failed.store(true, Ordering::Release);
        self.parker.notify();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiters_wake_on_publish_and_on_failure() {
        let durable = DurableSeq::new(5);
        assert!(durable.covers(5) && !durable.covers(6));
        let waiter = {
            let durable = Arc::clone(&durable);
            std::thread::spawn(move || durable.wait_for(9, WaitStrategy::Park))
        };
        durable.publish(9);
        assert!(waiter.join().unwrap().is_ok());
        let waiter = {
            let durable = Arc::clone(&durable);
            std::thread::spawn(move || durable.wait_for(10, WaitStrategy::Park))
        };
        durable.mark_failed();
        assert!(matches!(waiter.join().unwrap(), Err(JournalError::WriterStopped)));
    }
}
