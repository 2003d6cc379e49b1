//! The core's in-memory store: a pre-allocated order pool (an arena of slots linked into
//! intrusive FIFO lists by index) and an order-id index (open addressing, linear probing,
//! backward-shift deletion, so no tombstones ever force a rehash).
//!
//! Both are sized once at start-up from named limits; nothing here allocates afterwards. A full
//! pool is reported to the caller, who rejects the order cleanly.

use crate::msg::{ClientId, OrderId, Qty, Side};

/// "No slot": the end of an intrusive list, or an empty index entry.
pub const NONE: u32 = u32::MAX;

/// Default number of resting orders one core shard can hold.
pub const ORDER_POOL_SLOTS_DEFAULT: u32 = 1 << 18;
/// Largest pool a shard may ask for (slot indexes are `u32`, [`NONE`] is reserved).
pub const ORDER_POOL_SLOTS_MAX: u32 = 1 << 28;

/// One resting order. `next`/`prev` link it into its price level's FIFO queue; while the slot
/// is free, `next` links the free list.
#[derive(Clone, Copy, Debug)]
pub struct OrderSlot {
    pub order_id: OrderId,
    pub client: ClientId,
    /// Remaining (open) quantity.
    pub qty: Qty,
    /// Ladder index of the order's price level.
    pub level: u32,
    /// Index of the order's book in the shard.
    pub book: u32,
    pub next: u32,
    pub prev: u32,
    pub side: Side,
}

impl Default for OrderSlot {
    fn default() -> Self {
        OrderSlot {
            order_id: 0,
            client: 0,
            qty: 0,
            level: NONE,
            book: NONE,
            next: NONE,
            prev: NONE,
            side: Side::Buy,
        }
    }
}

/// The arena of order slots with a free list.
pub struct OrderPool {
    slots: Vec<OrderSlot>,
    free_head: u32,
    used_slots: u32,
}

impl OrderPool {
    /// Allocates all `capacity_slots` slots up front.
    pub fn new(capacity_slots: u32) -> OrderPool {
        assert!(capacity_slots > 0 && capacity_slots <= ORDER_POOL_SLOTS_MAX);
        let mut slots = vec![OrderSlot::default(); capacity_slots as usize];
        for (i, slot) in slots.iter_mut().enumerate() {
            let next = i as u32 + 1;
            slot.next = if next == capacity_slots { NONE } else { next };
        }
        OrderPool { slots, free_head: 0, used_slots: 0 }
    }

    /// Takes a free slot, or `None` when the pool is full.
    pub fn alloc(&mut self) -> Option<u32> {
        let slot = self.free_head;
        if slot == NONE {
            return None;
        }
        self.free_head = self.slots[slot as usize].next;
        self.used_slots += 1;
        Some(slot)
    }

    /// Returns a slot to the free list.
    pub fn free(&mut self, slot: u32) {
        debug_assert!(self.used_slots > 0);
        self.slots[slot as usize] = OrderSlot { next: self.free_head, ..OrderSlot::default() };
        self.free_head = slot;
        self.used_slots -= 1;
    }

    /// True when no slot is free.
    pub fn is_full(&self) -> bool {
        self.free_head == NONE
    }

    /// Slots the pool was sized with.
    pub fn capacity_slots(&self) -> u32 {
        self.slots.len() as u32
    }

    /// Slots in use (resting orders).
    pub fn used_slots(&self) -> u32 {
        self.used_slots
    }

    pub fn get(&self, slot: u32) -> &OrderSlot {
        &self.slots[slot as usize]
    }

    pub fn get_mut(&mut self, slot: u32) -> &mut OrderSlot {
        &mut self.slots[slot as usize]
    }
}

#[derive(Clone, Copy)]
struct IndexEntry {
    order_id: OrderId,
    slot: u32,
}

const EMPTY_ENTRY: IndexEntry = IndexEntry { order_id: 0, slot: NONE };

/// Order id -> pool slot. Capacity is twice the pool (rounded to a power of two), so the load
/// factor stays at or below 50% and probe sequences stay short.
pub struct OrderIndex {
    entries: Vec<IndexEntry>,
    mask: usize,
}

impl OrderIndex {
    /// Sizes the table for `pool_slots` live entries.
    pub fn new(pool_slots: u32) -> OrderIndex {
        let capacity = (pool_slots as usize * 2).next_power_of_two();
        OrderIndex { entries: vec![EMPTY_ENTRY; capacity], mask: capacity - 1 }
    }

    fn home(&self, order_id: OrderId) -> usize {
        // Fibonacci hashing: sequential ids spread over the table.
        (order_id.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize & self.mask
    }

    fn position(&self, order_id: OrderId) -> Option<usize> {
        let mut at = self.home(order_id);
        loop {
            let entry = self.entries[at];
            if entry.slot == NONE {
                return None;
            }
            if entry.order_id == order_id {
                return Some(at);
            }
            at = (at + 1) & self.mask;
        }
    }

    /// The slot of a resting order.
    pub fn get(&self, order_id: OrderId) -> Option<u32> {
        self.position(order_id).map(|at| self.entries[at].slot)
    }

    /// Inserts a new id (the caller checked it is absent; the pool bound keeps the table at
    /// most half full, so a free entry always exists).
    pub fn insert(&mut self, order_id: OrderId, slot: u32) {
        debug_assert!(self.get(order_id).is_none());
        let mut at = self.home(order_id);
        while self.entries[at].slot != NONE {
            at = (at + 1) & self.mask;
        }
        self.entries[at] = IndexEntry { order_id, slot };
    }

    /// Removes an id, shifting later entries of the probe run back so lookups never need
    /// tombstones.
    pub fn remove(&mut self, order_id: OrderId) {
        let Some(mut hole) = self.position(order_id) else {
            return;
        };
        let mut probe = hole;
        loop {
            probe = (probe + 1) & self.mask;
            let entry = self.entries[probe];
            if entry.slot == NONE {
                break;
            }
            let home = self.home(entry.order_id);
            // The entry may fill the hole if the hole lies on its probe path [home, probe).
            if (probe.wrapping_sub(home) & self.mask) >= (probe.wrapping_sub(hole) & self.mask) {
                self.entries[hole] = entry;
                hole = probe;
            }
        }
        self.entries[hole] = EMPTY_ENTRY;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    proptest! {
        #[test]
        fn index_agrees_with_a_hash_map(ops in proptest::collection::vec((any::<bool>(), 0u64..64), 1..400)) {
            let mut index = OrderIndex::new(64);
            let mut model = HashMap::new();
            for (slot, (insert, id)) in ops.into_iter().enumerate() {
                if insert && !model.contains_key(&id) && model.len() < 64 {
                    index.insert(id, slot as u32);
                    model.insert(id, slot as u32);
                } else {
                    index.remove(id);
                    model.remove(&id);
                }
                for probe in 0..64 {
                    prop_assert_eq!(index.get(probe), model.get(&probe).copied());
                }
            }
        }
    }

    #[test]
    fn pool_reports_full_and_reuses_freed_slots() {
        let mut pool = OrderPool::new(2);
        let a = pool.alloc().unwrap();
        let b = pool.alloc().unwrap();
        assert_ne!(a, b);
        assert!(pool.alloc().is_none());
        assert!(pool.is_full());
        pool.free(a);
        assert_eq!(pool.alloc(), Some(a));
        assert_eq!(pool.used_slots(), 2);
    }
}
