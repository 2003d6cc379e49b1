//! Fair shares of a node-wide memory budget (frame buffers, owed replies).
//!
//! A plain node-wide budget can be starved: a few connections that hold as much as they may
//! (partial frames never finished, large replies never read) leave nothing for the next
//! client, whose every request is then refused. So each budget is split in two:
//!
//! - a part reserved for each connection ([`SharedBudget::reserved_per_connection`]), set aside
//!   for every connection the node may hold (`connections_max` of them), so a connection can
//!   always use its reserved bytes whatever the others hold: a small frame is always read and a
//!   small reply (a send's) always admitted;
//! - the shared rest, of which one connection may hold at most
//!   `max(floor, shared / open connections)`, the floor being the largest single charge (one
//!   largest frame or reply), so any request can still be served one at a time.
//!
//! The cap is taken when a connection charges, against the connections open then; bytes
//! already held are not taken back when more connections arrive, so holders older than a
//! newcomer may keep more than its share until they release (read their replies, finish their
//! frame) or are closed by the write or idle timeout. The reserved part is what no holder can
//! take.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Bytes that all connections together may hold for one purpose: frame buffers, or replies
/// owed but not yet written (see the `connection` module).
#[derive(Debug)]
pub struct MemoryBudget {
    used: AtomicUsize,
    /// Most bytes ever charged at once.
    peak: AtomicUsize,
    max: usize,
}

impl MemoryBudget {
    pub fn new(max: usize) -> MemoryBudget {
        MemoryBudget { used: AtomicUsize::new(0), peak: AtomicUsize::new(0), max }
    }

    /// Most bytes charged at once since the budget was made.
    pub fn peak(&self) -> usize {
        // Relaxed: a statistic.
        self.peak.load(Ordering::Relaxed)
    }

    /// The bound.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Bytes charged now.
    pub fn used(&self) -> usize {
        // Relaxed: a statistic; the budget orders no other memory.
        self.used.load(Ordering::Relaxed)
    }

    pub(crate) fn try_charge(&self, bytes: usize) -> bool {
        // Relaxed: the counter is its own only datum; fetch_update makes check-and-add atomic.
        let charged = self.used.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
            used.checked_add(bytes).filter(|&after| after <= self.max)
        });
        if let Ok(before) = charged {
            self.note_peak(before + bytes);
        }
        charged.is_ok()
    }

    fn note_peak(&self, used: usize) {
        // A plain load first: the peak rarely moves, and a read keeps its cache line shared
        // between the cores charging the budget.
        if used > self.peak.load(Ordering::Relaxed) {
            self.peak.fetch_max(used, Ordering::Relaxed);
        }
    }

    /// Charges bytes that already exist and must be kept, even past the budget (see
    /// `connection::ReplyCharge::settle`).
    pub(crate) fn charge_over(&self, bytes: usize) {
        let before = self.used.fetch_add(bytes, Ordering::Relaxed);
        self.note_peak(before + bytes);
    }

    pub(crate) fn release(&self, bytes: usize) {
        let before = self.used.fetch_sub(bytes, Ordering::Relaxed);
        assert!(before >= bytes, "memory budget released more than was charged");
    }
}

/// Something frame buffers and replies charge their bytes to.
pub trait Charge: Sync {
    /// Charges `bytes` unless that passes a bound; whether it was charged.
    fn try_charge(&self, bytes: usize) -> bool;
    /// Charges bytes that already exist and must be kept, even past the bound.
    fn charge_over(&self, bytes: usize);
    /// Gives back bytes charged before.
    fn release(&self, bytes: usize);
}

impl Charge for MemoryBudget {
    fn try_charge(&self, bytes: usize) -> bool {
        MemoryBudget::try_charge(self, bytes)
    }

    fn charge_over(&self, bytes: usize) {
        MemoryBudget::charge_over(self, bytes);
    }

    fn release(&self, bytes: usize) {
        MemoryBudget::release(self, bytes);
    }
}

/// A node-wide budget split into per-connection reserved parts and a shared rest (module docs).
#[derive(Debug)]
pub struct SharedBudget {
    reserved_per_connection: usize,
    /// The least of the shared part one connection may hold (if it is free).
    share_floor: usize,
    shared: MemoryBudget,
    /// Everything charged, reserved parts included: what Stats reports.
    total: MemoryBudget,
}

impl SharedBudget {
    /// `max` bytes in all, `reserved_per_connection` of them set aside for each of
    /// `connections_max` connections; `share_floor` as in the module docs.
    pub fn new(
        max: usize,
        connections_max: usize,
        reserved_per_connection: usize,
        share_floor: usize,
    ) -> SharedBudget {
        let reserved = connections_max.saturating_mul(reserved_per_connection);
        SharedBudget {
            reserved_per_connection,
            share_floor,
            shared: MemoryBudget::new(max.saturating_sub(reserved)),
            total: MemoryBudget::new(max),
        }
    }

    /// Bytes charged now, all connections together.
    pub fn used(&self) -> usize {
        self.total.used()
    }

    /// Most bytes charged at once.
    pub fn peak(&self) -> usize {
        self.total.peak()
    }

    /// Bytes of the shared part charged now.
    pub fn shared_used(&self) -> usize {
        self.shared.used()
    }

    /// A connection's account; `open` counts the node's open connections (for the cap).
    pub fn connection<'a>(&'a self, open: &'a AtomicU64) -> ConnectionShare<'a> {
        ConnectionShare { budget: self, open, held: AtomicUsize::new(0) }
    }

    fn cap(&self, open: &AtomicU64) -> usize {
        // Relaxed: the count of open connections is a statistic; a stale one moves the cap by
        // a share, which the module docs allow for anyway.
        let open = usize::try_from(open.load(Ordering::Relaxed)).unwrap_or(usize::MAX).max(1);
        self.share_floor.max(self.shared.max() / open)
    }
}

/// One connection's bytes in a [`SharedBudget`]. Charged and released from the connection's
/// one task, so `held` changes only in program order.
#[derive(Debug)]
pub struct ConnectionShare<'a> {
    budget: &'a SharedBudget,
    open: &'a AtomicU64,
    held: AtomicUsize,
}

impl ConnectionShare<'_> {
    /// Bytes this connection holds.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// The part of `held` bytes above the reserved part.
    fn shared_part(&self, held: usize) -> usize {
        held.saturating_sub(self.budget.reserved_per_connection)
    }

    /// Adds `bytes` to `held`; the shared part it adds.
    fn add(&self, bytes: usize) -> usize {
        // Relaxed: one task (see the type's docs).
        let before = self.held.fetch_add(bytes, Ordering::Relaxed);
        self.budget.total.charge_over(bytes);
        self.shared_part(before + bytes) - self.shared_part(before)
    }
}

impl Charge for ConnectionShare<'_> {
    fn try_charge(&self, bytes: usize) -> bool {
        let held = self.held();
        let shared_after = self.shared_part(held.saturating_add(bytes));
        let extra = shared_after - self.shared_part(held);
        if extra > 0
            && (shared_after > self.budget.cap(self.open) || !self.budget.shared.try_charge(extra))
        {
            return false;
        }
        self.add(bytes);
        true
    }

    fn charge_over(&self, bytes: usize) {
        let extra = self.add(bytes);
        self.budget.shared.charge_over(extra);
    }

    fn release(&self, bytes: usize) {
        let before = self.held.fetch_sub(bytes, Ordering::Relaxed);
        assert!(before >= bytes, "a connection released more than it holds");
        self.budget.shared.release(self.shared_part(before) - self.shared_part(before - bytes));
        self.budget.total.release(bytes);
    }
}

impl Drop for ConnectionShare<'_> {
    fn drop(&mut self) {
        // Whatever is still held (the charges' owners release first; this is a backstop).
        let held = self.held();
        if held > 0 {
            self.release(held);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserved_part_stays_available_when_others_fill_the_shared_rest() {
        // 4 connections × 100 reserved, 600 shared, floor 200.
        let budget = SharedBudget::new(1000, 4, 100, 200);
        let open = AtomicU64::new(2);
        let hog = budget.connection(&open);
        assert!(hog.try_charge(100), "the reserved part");
        assert!(hog.try_charge(300), "up to shared / open = 300 of the shared part");
        assert!(!hog.try_charge(1), "past its share");
        let other = budget.connection(&open);
        assert!(other.try_charge(400));
        assert!(budget.shared_used() == 600 && !other.try_charge(1), "the shared part is full");
        let late = budget.connection(&open);
        assert!(late.try_charge(100), "a newcomer still has its reserved part");
        assert!(!late.try_charge(1));
        late.release(60);
        assert_eq!((late.held(), budget.used()), (40, 840));
        hog.release(400);
        assert_eq!(budget.shared_used(), 300, "the hog's shared bytes are back");
    }

    #[test]
    fn the_cap_shrinks_with_open_connections_but_never_below_the_floor() {
        let budget = SharedBudget::new(10_000, 10, 0, 500);
        let open = AtomicU64::new(100);
        let share = budget.connection(&open);
        assert!(share.try_charge(500) && !share.try_charge(1), "the floor");
        open.store(2, Ordering::Relaxed);
        assert!(share.try_charge(4500) && !share.try_charge(1), "shared / open");
        share.charge_over(10);
        assert_eq!((budget.used(), budget.shared_used()), (5010, 5010), "charged past the cap");
        drop(share);
        assert_eq!((budget.used(), budget.shared_used()), (0, 0), "released on drop");
    }
}
