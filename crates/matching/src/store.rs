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
/// Largest pool a shard may ask for (slot indexes are `u32`, `u32::MAX` marks "no slot").
pub const ORDER_POOL_SLOTS_MAX: u32 = 1 << 28;
/// Order-index entries per order it can hold: the table is at most half full, so every probe
/// sequence ends at an empty entry within a few steps.
pub const INDEX_ENTRIES_PER_ORDER: usize = 2;

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
    /// Set by [`OrderPool::alloc`], cleared by [`OrderPool::free`]: what catches a double free.
    in_use: bool,
}

/// The double-free flag fits in the slot's padding: a slot stays 40 bytes.
const _: () = assert!(std::mem::size_of::<OrderSlot>() == 40);

impl OrderSlot {
    /// A new resting order, not yet linked into a level.
    pub fn resting(order_id: OrderId, client: ClientId, qty: Qty, book: u32, side: Side) -> Self {
        OrderSlot { order_id, client, qty, book, side, ..OrderSlot::default() }
    }
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
            in_use: false,
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

    /// Takes a free slot and stores `order` in it, or `None` when the pool is full.
    pub fn alloc(&mut self, order: OrderSlot) -> Option<u32> {
        let slot = self.free_head;
        if slot == NONE {
            return None;
        }
        let entry = &mut self.slots[slot as usize];
        assert!(!entry.in_use, "order pool slot {slot} on the free list while in use");
        self.free_head = entry.next;
        *entry = OrderSlot { in_use: true, ..order };
        self.used_slots += 1;
        Some(slot)
    }

    /// Returns a slot to the free list.
    ///
    /// A release-build assertion: freeing a slot twice would put it on the free list twice,
    /// so two later orders would share it, silently corrupting both books. The slot is written
    /// right below anyway, so the check costs one predictable branch per free.
    pub fn free(&mut self, slot: u32) {
        let entry = &mut self.slots[slot as usize];
        assert!(entry.in_use, "order pool slot {slot} freed twice");
        *entry = OrderSlot { next: self.free_head, ..OrderSlot::default() };
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

/// log2 of the index entries in one cache line.
const INDEX_ENTRIES_PER_LINE_LOG2: u32 = 2;
const INDEX_ENTRIES_PER_LINE: usize = 1 << INDEX_ENTRIES_PER_LINE_LOG2;

/// One cache line of index entries (the table is an array of them, so a line's entries never
/// straddle two lines).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct IndexLine([IndexEntry; INDEX_ENTRIES_PER_LINE]);
const _: () = assert!(std::mem::size_of::<IndexLine>() == 64);

/// Order id -> pool slot. Capacity is [`INDEX_ENTRIES_PER_ORDER`] times the pool (rounded to
/// a power of two), so the load factor stays at or below 50% and probe sequences stay short.
///
/// The probe loops end at an empty entry; one always exists because the index never holds
/// more than `orders_max` ids, which `insert` asserts in release builds (a full table would make
/// every lookup of an absent id loop forever). The core never gets there: it rejects an order
/// with [`crate::msg::Reason::OrderPoolFull`] before it needs a pool slot, and the pool has
/// `orders_max` slots.
pub struct OrderIndex {
    lines: Box<[IndexLine]>,
    mask: usize,
    /// Ids held now.
    orders: u32,
    /// Most ids the index may hold (the pool's slots).
    orders_max: u32,
}

impl OrderIndex {
    /// Sizes the table for `pool_slots` live entries.
    pub fn new(pool_slots: u32) -> OrderIndex {
        let capacity = (pool_slots as usize * INDEX_ENTRIES_PER_ORDER)
            .next_power_of_two()
            .max(INDEX_ENTRIES_PER_LINE);
        OrderIndex {
            lines: vec![
                IndexLine([EMPTY_ENTRY; INDEX_ENTRIES_PER_LINE]);
                capacity / INDEX_ENTRIES_PER_LINE
            ]
            .into_boxed_slice(),
            mask: capacity - 1,
            orders: 0,
            orders_max: pool_slots,
        }
    }

    /// Ids that differ only in their lowest bits start in the same cache line, at their own
    /// entry in it; the lines are spread over the table by Fibonacci hashing of the rest of
    /// the id. A client's order ids are usually consecutive, so a new order's duplicate check
    /// and insert touch the line its predecessor just did, instead of a cold line each (89% of
    /// the lookup's time was that miss: docs/benchmarks/tier-layout.md).
    fn home(&self, order_id: OrderId) -> usize {
        let group = order_id >> INDEX_ENTRIES_PER_LINE_LOG2;
        let line = (group.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize;
        let within_line = order_id as usize & (INDEX_ENTRIES_PER_LINE - 1);
        ((line << INDEX_ENTRIES_PER_LINE_LOG2) | within_line) & self.mask
    }

    #[inline]
    fn entry(&self, at: usize) -> IndexEntry {
        self.lines[at >> INDEX_ENTRIES_PER_LINE_LOG2].0[at & (INDEX_ENTRIES_PER_LINE - 1)]
    }

    #[inline]
    fn set_entry(&mut self, at: usize, entry: IndexEntry) {
        self.lines[at >> INDEX_ENTRIES_PER_LINE_LOG2].0[at & (INDEX_ENTRIES_PER_LINE - 1)] = entry;
    }

    fn position(&self, order_id: OrderId) -> Option<usize> {
        let mut at = self.home(order_id);
        loop {
            let entry = self.entry(at);
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
        self.position(order_id).map(|at| self.entry(at).slot)
    }

    /// Inserts a new id (the caller checked it is absent and that the pool had a slot for it).
    pub fn insert(&mut self, order_id: OrderId, slot: u32) {
        debug_assert!(self.get(order_id).is_none());
        // Release-build backstop of the fill bound (see the type's docs): one compare per
        // resting order.
        assert!(
            self.orders < self.orders_max,
            "order index full: {} ids, sized for {}",
            self.orders,
            self.orders_max
        );
        self.orders += 1;
        let mut at = self.home(order_id);
        while self.entry(at).slot != NONE {
            at = (at + 1) & self.mask;
        }
        self.set_entry(at, IndexEntry { order_id, slot });
    }

    /// Removes an id, shifting later entries of the probe run back so lookups never need
    /// tombstones.
    pub fn remove(&mut self, order_id: OrderId) {
        let Some(mut hole) = self.position(order_id) else {
            return;
        };
        self.orders -= 1;
        let mut probe = hole;
        loop {
            probe = (probe + 1) & self.mask;
            let entry = self.entry(probe);
            if entry.slot == NONE {
                break;
            }
            let home = self.home(entry.order_id);
            // The entry may fill the hole if the hole lies on its probe path [home, probe).
            if (probe.wrapping_sub(home) & self.mask) >= (probe.wrapping_sub(hole) & self.mask) {
                self.set_entry(hole, entry);
                hole = probe;
            }
        }
        self.set_entry(hole, EMPTY_ENTRY);
    }
}

/// Default of [`crate::core::CoreLimits::ended_order_ids`]: the newest ended orders whose ids
/// a shard keeps refusing. At 8 bytes each (and the index's 2 entries of 16) it costs 2.5 MiB,
/// and covers a client's resends for as long as the shard ends fewer orders than this.
pub const ENDED_ORDER_IDS_DEFAULT: u32 = 1 << 16;
/// Largest [`crate::core::CoreLimits::ended_order_ids`] (positions in the ring are `u32`).
pub const ENDED_ORDER_IDS_MAX: u32 = 1 << 26;

/// The ids of the newest orders that ended (filled, cancelled, killed, expired), oldest out
/// first: a new order under one of them is refused as a duplicate, as one under a resting
/// order's id is. So a client that resends an order it has no answer for (its gateway
/// restarted) is never booked twice, whether the first copy still rests or already traded.
/// Part of the replicated state (the core's snapshot keeps it); capacity 0 keeps none.
pub struct EndedOrders {
    /// A ring of the kept ids; `next` is where the next one goes.
    ids: Box<[OrderId]>,
    next: usize,
    len: usize,
    /// Id -> its position in `ids`.
    index: OrderIndex,
}

impl EndedOrders {
    /// Room for `capacity` ids (allocated now, never after).
    pub fn new(capacity: u32) -> EndedOrders {
        let ids = vec![0; capacity as usize].into_boxed_slice();
        EndedOrders { ids, next: 0, len: 0, index: OrderIndex::new(capacity) }
    }

    /// Most ids kept.
    pub fn capacity(&self) -> u32 {
        self.ids.len() as u32
    }

    /// Whether `order_id` is one of the kept ended orders.
    #[inline]
    pub fn contains(&self, order_id: OrderId) -> bool {
        self.len > 0 && self.index.get(order_id).is_some()
    }

    /// Keeps `order_id`, forgetting the oldest kept id when full.
    pub fn push(&mut self, order_id: OrderId) {
        let capacity = self.ids.len();
        // An order ends once; the guard keeps the index's bound even if a caller repeated one.
        if capacity == 0 || self.contains(order_id) {
            return;
        }
        if self.len == capacity {
            self.index.remove(self.ids[self.next]);
        } else {
            self.len += 1;
        }
        self.ids[self.next] = order_id;
        self.index.insert(order_id, self.next as u32);
        self.next = (self.next + 1) % capacity;
    }

    /// The kept ids, oldest first (a snapshot writes them so; pushing them back in this
    /// order rebuilds the same ring).
    pub fn oldest_first(&self) -> impl Iterator<Item = OrderId> + '_ {
        let start = if self.len == self.ids.len() { self.next } else { 0 };
        (0..self.len).map(move |k| self.ids[(start + k) % self.ids.len()])
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

    fn order(order_id: OrderId) -> OrderSlot {
        OrderSlot::resting(order_id, 1, 10, 0, Side::Buy)
    }

    #[test]
    fn ended_orders_keep_the_newest_ids_and_rebuild_from_their_order() {
        let mut ended = EndedOrders::new(3);
        for id in [10, 11, 12, 11, 13] {
            ended.push(id);
        }
        assert!(!ended.contains(10), "the oldest is forgotten once full");
        assert!([11, 12, 13].iter().all(|&id| ended.contains(id)));
        assert_eq!(ended.oldest_first().collect::<Vec<_>>(), [11, 12, 13]);
        let mut rebuilt = EndedOrders::new(3);
        ended.oldest_first().for_each(|id| rebuilt.push(id));
        rebuilt.push(14);
        ended.push(14);
        assert_eq!(rebuilt.oldest_first().collect::<Vec<_>>(), [12, 13, 14]);
        assert_eq!(ended.oldest_first().collect::<Vec<_>>(), [12, 13, 14]);
        let mut none = EndedOrders::new(0);
        none.push(1);
        assert!(!none.contains(1), "capacity 0 keeps nothing");
    }

    #[test]
    fn pool_reports_full_and_reuses_freed_slots() {
        let mut pool = OrderPool::new(2);
        let a = pool.alloc(order(1)).unwrap();
        let b = pool.alloc(order(2)).unwrap();
        assert_ne!(a, b);
        assert_eq!(pool.get(b).order_id, 2);
        assert!(pool.alloc(order(3)).is_none());
        assert!(pool.is_full());
        pool.free(a);
        assert_eq!(pool.alloc(order(4)), Some(a));
        assert_eq!(pool.used_slots(), 2);
    }

    #[test]
    #[should_panic(expected = "order pool slot 0 freed twice")]
    fn a_double_free_is_caught() {
        let mut pool = OrderPool::new(2);
        let slot = pool.alloc(order(1)).unwrap();
        pool.free(slot);
        pool.free(slot);
    }

    #[test]
    #[should_panic(expected = "order index full: 2 ids, sized for 2")]
    fn an_index_over_its_bound_panics_with_a_named_message_instead_of_looping() {
        let mut index = OrderIndex::new(2);
        index.insert(1, 0);
        index.insert(2, 1);
        index.remove(2);
        index.insert(3, 1);
        assert_eq!((index.get(1), index.get(2), index.get(3)), (Some(0), None, Some(1)));
        index.insert(4, 2);
    }
}
