//! The matching core's state as snapshot bytes, and back.
//!
//! Layout (little-endian): magic, pool capacity, kept-ended-ids capacity, the books (listing,
//! halt, band, last published top), the counters, then every resting order as `(book, side,
//! level, order id, client, qty)` — per book and side from the best level to the worst, each
//! level in time priority — and last the kept ended order ids, oldest first (a count, then
//! the ids). A version-1 snapshot (magic `LTXCORE1`: no ended ids) restores with none kept.
//! Pool slot numbers are NOT written: they are an artefact of allocation order. Restoring
//! re-rests the orders in that same order, so every queue keeps its time priority and the
//! restored core produces the same output for the same input (its slots may differ).
//!
//! Cost: one pass over the resting orders and the occupied levels (found through the ladders'
//! bitmaps), [`ORDER_SNAPSHOT_BYTES`] per order: linear in resting orders, independent of the
//! ladder size.

use super::{CoreCounters, CoreLimits, MatchingCore};
use crate::book::{LADDER_LEVELS_MAX, Listing, TopOfBook};
use crate::msg::Side;
use crate::store::{ENDED_ORDER_IDS_MAX, NONE, ORDER_POOL_SLOTS_MAX, OrderSlot};
use crate::wire::Fields;

const CORE_SNAPSHOT_MAGIC: [u8; 8] = *b"LTXCORE2";
/// The layout before the kept ended ids: still restored.
const CORE_SNAPSHOT_MAGIC_V1: [u8; 8] = *b"LTXCORE1";
/// Bytes per kept ended order id.
pub const ENDED_ID_SNAPSHOT_BYTES: usize = 8;
/// Bytes per book: listing (4 + 8 + 8 + 4), halted, band (2 x 4), last top (4 x 8).
pub const BOOK_SNAPSHOT_BYTES: usize = 24 + 1 + 8 + 32;
/// Bytes per resting order: book, side, level, order id, client, quantity.
pub const ORDER_SNAPSHOT_BYTES: usize = 4 + 1 + 4 + 8 + 4 + 4;
const FIXED_SNAPSHOT_BYTES: usize = 8 + 4 + 4 + 4 + 3 * 8 + 4 + 4;

impl MatchingCore {
    /// The most bytes [`MatchingCore::write_snapshot`] writes for this core (a full pool):
    /// what a snapshot buffer is pre-allocated to.
    pub fn snapshot_bytes_max(&self) -> usize {
        FIXED_SNAPSHOT_BYTES
            + self.books.len() * BOOK_SNAPSHOT_BYTES
            + self.pool.capacity_slots() as usize * ORDER_SNAPSHOT_BYTES
            + self.ended.capacity() as usize * ENDED_ID_SNAPSHOT_BYTES
    }

    /// The store limits the core was built with.
    pub fn limits(&self) -> CoreLimits {
        CoreLimits {
            order_pool_slots: self.pool.capacity_slots(),
            ended_order_ids: self.ended.capacity(),
        }
    }

    /// The listings of the core's books, in book order.
    pub fn listings(&self) -> Vec<Listing> {
        self.books.iter().map(|book| book.listing).collect()
    }

    /// Appends the core's state to `out` (see the module docs for the layout).
    pub fn write_snapshot(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&CORE_SNAPSHOT_MAGIC);
        out.extend_from_slice(&self.pool.capacity_slots().to_le_bytes());
        out.extend_from_slice(&self.ended.capacity().to_le_bytes());
        out.extend_from_slice(&(self.books.len() as u32).to_le_bytes());
        for book in &self.books {
            let listing = &book.listing;
            out.extend_from_slice(&listing.instrument.to_le_bytes());
            out.extend_from_slice(&listing.ladder_low.to_le_bytes());
            out.extend_from_slice(&listing.tick.to_le_bytes());
            out.extend_from_slice(&listing.levels.to_le_bytes());
            out.push(u8::from(book.halted));
            out.extend_from_slice(&book.band_low.to_le_bytes());
            out.extend_from_slice(&book.band_high.to_le_bytes());
            let top = book.last_top;
            out.extend_from_slice(&top.bid.to_le_bytes());
            out.extend_from_slice(&top.bid_qty.to_le_bytes());
            out.extend_from_slice(&top.ask.to_le_bytes());
            out.extend_from_slice(&top.ask_qty.to_le_bytes());
        }
        let counters = self.counters;
        for counter in [counters.inputs, counters.trades, counters.invalid_inputs] {
            out.extend_from_slice(&counter.to_le_bytes());
        }
        out.extend_from_slice(&self.pool.used_slots().to_le_bytes());
        let orders_at = out.len();
        for (book_at, book) in self.books.iter().enumerate() {
            for side in [Side::Buy, Side::Sell] {
                let ladder = book.ladder(side);
                let mut level = ladder.best();
                while level != NONE {
                    let mut slot = ladder.head(level);
                    while slot != NONE {
                        let order = self.pool.get(slot);
                        out.extend_from_slice(&encode_order(book_at as u32, level, order));
                        slot = order.next;
                    }
                    level = ladder.next_worse(level);
                }
            }
        }
        debug_assert_eq!(
            out.len() - orders_at,
            self.pool.used_slots() as usize * ORDER_SNAPSHOT_BYTES,
            "every resting order is on exactly one level queue"
        );
        let ended_at = out.len();
        out.extend_from_slice(&0u32.to_le_bytes());
        let mut ended = 0u32;
        for order_id in self.ended.oldest_first() {
            out.extend_from_slice(&order_id.to_le_bytes());
            ended += 1;
        }
        out[ended_at..ended_at + 4].copy_from_slice(&ended.to_le_bytes());
    }

    /// Rebuilds a core from [`MatchingCore::write_snapshot`]'s bytes at the front of `bytes`;
    /// returns it and the bytes after it. Damaged content is an `Err` naming why, never a
    /// panic (the snapshot's CRC makes that unlikely, but a restore must not trust it).
    pub fn restore(bytes: &[u8]) -> Result<(MatchingCore, &[u8]), String> {
        let mut fields = Fields::new(bytes);
        let with_ended_ids = match fields.take::<8>()? {
            CORE_SNAPSHOT_MAGIC => true,
            CORE_SNAPSHOT_MAGIC_V1 => false,
            _ => return Err("not a core snapshot (bad magic)".into()),
        };
        let order_pool_slots = fields.u32()?;
        if order_pool_slots == 0 || order_pool_slots > ORDER_POOL_SLOTS_MAX {
            return Err(format!("order pool of {order_pool_slots} slots is out of range"));
        }
        let ended_order_ids = if with_ended_ids { fields.u32()? } else { 0 };
        if ended_order_ids > ENDED_ORDER_IDS_MAX {
            return Err(format!("{ended_order_ids} kept ended ids is over ENDED_ORDER_IDS_MAX"));
        }
        let book_count = fields.u32()?;
        if book_count > super::INSTRUMENT_IDS_MAX {
            return Err(format!("{book_count} books is over INSTRUMENT_IDS_MAX"));
        }
        let (listings, book_states) = read_books(&mut fields, book_count)?;
        let mut core =
            MatchingCore::new(&listings, CoreLimits { order_pool_slots, ended_order_ids });
        for (book, (halted, band_low, band_high, last_top)) in
            core.books.iter_mut().zip(book_states)
        {
            (book.halted, book.band_low, book.band_high, book.last_top) =
                (halted, band_low, band_high, last_top);
        }
        core.counters = CoreCounters {
            inputs: fields.u64()?,
            trades: fields.u64()?,
            invalid_inputs: fields.u64()?,
        };
        let resting = fields.u32()?;
        if resting > order_pool_slots {
            return Err(format!("{resting} resting orders in a pool of {order_pool_slots}"));
        }
        for _ in 0..resting {
            core.rest_restored(&mut fields)?;
        }
        if with_ended_ids {
            core.restore_ended(&mut fields)?;
        }
        // The core asserts after every input that no book is crossed; refuse such a state here.
        if let Some(book) = core.books.iter().find(|book| book.is_crossed()) {
            return Err(format!("book of instrument {} is crossed", book.listing.instrument));
        }
        Ok((core, fields.rest()))
    }

    /// Reads the kept ended ids (oldest first) back into the ring, in their order.
    fn restore_ended(&mut self, fields: &mut Fields) -> Result<(), String> {
        let ended = fields.u32()?;
        if ended > self.ended.capacity() {
            return Err(format!("{ended} ended ids kept for {}", self.ended.capacity()));
        }
        for _ in 0..ended {
            let order_id = fields.u64()?;
            if self.index.get(order_id).is_some() || self.ended.contains(order_id) {
                return Err(format!("ended order id {order_id} rests or is kept twice"));
            }
            self.ended.push(order_id);
        }
        Ok(())
    }

    /// Re-rests one order read from a snapshot at the tail of its level's queue.
    fn rest_restored(&mut self, fields: &mut Fields) -> Result<(), String> {
        let book_at = fields.u32()?;
        let side = Side::from_code(fields.u8()?).ok_or("bad side code in a resting order")?;
        let (level, order_id, client, qty) =
            (fields.u32()?, fields.u64()?, fields.u32()?, fields.u32()?);
        let book = self.books.get(book_at as usize).ok_or("resting order of an unknown book")?;
        if level >= book.listing.levels || qty == 0 || self.index.get(order_id).is_some() {
            return Err(format!("resting order {order_id}: bad level, zero quantity or duplicate"));
        }
        let order = OrderSlot::resting(order_id, client, qty, book_at, side);
        let slot = self.pool.alloc(order).ok_or("more resting orders than pool slots")?;
        self.index.insert(order_id, slot);
        self.books[book_at as usize].ladder_mut(side).push_back(&mut self.pool, level, slot);
        Ok(())
    }
}

/// One resting order's snapshot record, built on the stack so the buffer grows once per order.
#[inline]
fn encode_order(book_at: u32, level: u32, order: &OrderSlot) -> [u8; ORDER_SNAPSHOT_BYTES] {
    let mut record = [0u8; ORDER_SNAPSHOT_BYTES];
    record[0..4].copy_from_slice(&book_at.to_le_bytes());
    record[4] = order.side as u8;
    record[5..9].copy_from_slice(&level.to_le_bytes());
    record[9..17].copy_from_slice(&order.order_id.to_le_bytes());
    record[17..21].copy_from_slice(&order.client.to_le_bytes());
    record[21..25].copy_from_slice(&order.qty.to_le_bytes());
    record
}

/// A book's state in a snapshot, beside its listing: halted, band (ladder levels), last top.
type BookState = (bool, u32, u32, TopOfBook);

/// Reads `book_count` listings and their books' states, refusing a listing that is out of
/// range or listed twice and a band off its ladder.
fn read_books(
    fields: &mut Fields,
    book_count: u32,
) -> Result<(Vec<Listing>, Vec<BookState>), String> {
    let mut listings = Vec::with_capacity(book_count as usize);
    let mut book_states = Vec::with_capacity(book_count as usize);
    for _ in 0..book_count {
        let listing = Listing {
            instrument: fields.u32()?,
            ladder_low: fields.i64()?,
            tick: fields.i64()?,
            levels: fields.u32()?,
        };
        let listed = listing.instrument < super::INSTRUMENT_IDS_MAX
            && listing.tick > 0
            && (1..=LADDER_LEVELS_MAX).contains(&listing.levels)
            && listings.iter().all(|l: &Listing| l.instrument != listing.instrument);
        if !listed {
            return Err(format!("bad or duplicate listing {listing:?}"));
        }
        let halted = fields.u8()? != 0;
        let (band_low, band_high) = (fields.u32()?, fields.u32()?);
        if band_low > band_high || band_high >= listing.levels {
            return Err(format!("band {band_low}..={band_high} off the ladder"));
        }
        let last_top = TopOfBook {
            bid: fields.i64()?,
            bid_qty: fields.u64()?,
            ask: fields.i64()?,
            ask_qty: fields.u64()?,
        };
        listings.push(listing);
        book_states.push((halted, band_low, band_high, last_top));
    }
    Ok((listings, book_states))
}
