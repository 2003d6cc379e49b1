//! The matching core of one shard: price-time priority over the books of the shard's
//! instruments, driven only by its sequenced input.
//!
//! The core is a pure function of (listings, limits, sequenced input): no clocks, no randomness,
//! no I/O, no allocation after [`MatchingCore::new`]. That is what makes replay reproduce
//! byte-identical output. Each input produces its output records in a fixed order:
//! the request's answer first (accepted / replaced / cancelled / rejected), then per match a
//! fill for the aggressor, a fill for the resting order and a trade, then an engine cancel of
//! an immediate order's remainder, and last a top-of-book record if the top changed.

use crate::book::{Book, LADDER_LEVELS_MAX, Listing, opposite};
use crate::msg::{
    ClientId, Command, CoreOutput, InstrumentId, OrderId, OrderType, OutputKind, Price, Qty,
    Reason, SequencedInput, Side, TimeInForce,
};
use crate::store::{EndedOrders, NONE, OrderIndex, OrderPool, OrderSlot};

mod snapshot;
pub use crate::store::{
    ENDED_ORDER_IDS_DEFAULT, ENDED_ORDER_IDS_MAX, ORDER_POOL_SLOTS_DEFAULT, ORDER_POOL_SLOTS_MAX,
};
pub use snapshot::{BOOK_SNAPSHOT_BYTES, ENDED_ID_SNAPSHOT_BYTES, ORDER_SNAPSHOT_BYTES};

/// Instrument ids a shard can address (the id -> book table is sized by it).
pub const INSTRUMENT_IDS_MAX: u32 = 1 << 16;

/// Sizes of a shard's pre-allocated store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CoreLimits {
    /// Resting orders the shard can hold; a Day order that would need a slot beyond it is
    /// rejected with [`Reason::OrderPoolFull`].
    pub order_pool_slots: u32,
    /// Ended orders (the newest this many) whose ids a new order may not take: a resend of
    /// one is rejected with [`Reason::DuplicateOrderId`], as a resend of a resting order is.
    #[serde(default)]
    pub ended_order_ids: u32,
}

impl Default for CoreLimits {
    fn default() -> Self {
        CoreLimits {
            order_pool_slots: ORDER_POOL_SLOTS_DEFAULT,
            ended_order_ids: ENDED_ORDER_IDS_DEFAULT,
        }
    }
}

/// Counters the core keeps about itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CoreCounters {
    /// Inputs processed.
    pub inputs: u64,
    /// Trades made.
    pub trades: u64,
    /// Inputs that failed a check the pre-process must have made (zero quantity, price off the
    /// ladder or off tick, unknown instrument). Must stay zero: the core never sees invalid
    /// input.
    pub invalid_inputs: u64,
}

/// The matching core of one shard.
///
/// ```
/// use matching::book::Listing;
/// use matching::core::{CoreLimits, MatchingCore};
/// use matching::msg::{Command, OrderType, OutputKind, SequencedInput, Side, TimeInForce};
///
/// let listing = Listing { instrument: 1, ladder_low: 90, tick: 1, levels: 21 };
/// let mut core = MatchingCore::new(&[listing], CoreLimits { order_pool_slots: 16, ..CoreLimits::default() });
/// let order = |order_id, side, qty| Command::New {
///     order_id,
///     client: 7,
///     side,
///     order_type: OrderType::Limit,
///     time_in_force: TimeInForce::Day,
///     price: 100,
///     qty,
/// };
/// let mut trades = Vec::new();
/// for (seq, command) in [(1, order(1, Side::Sell, 5)), (2, order(2, Side::Buy, 3))] {
///     let input = SequencedInput { seq, instrument: 1, command, ..Default::default() };
///     core.process(&input, &mut |output| {
///         if output.kind == OutputKind::Trade {
///             trades.push((output.qty, output.price));
///         }
///     });
/// }
/// assert_eq!(trades, [(3, 100)]);
/// assert_eq!(core.resting_qty(1), Some(2));
/// assert_eq!(core.book(1).unwrap().top().ask_qty, 2);
/// ```
pub struct MatchingCore {
    books: Vec<Book>,
    /// Instrument id -> index in `books`, or [`NONE`].
    book_of: Vec<u32>,
    pool: OrderPool,
    index: OrderIndex,
    ended: EndedOrders,
    counters: CoreCounters,
}

/// The order being matched.
struct Aggressor {
    order_id: OrderId,
    client: ClientId,
    side: Side,
    qty: Qty,
}

impl MatchingCore {
    /// Allocates the whole store for `listings` up front.
    pub fn new(listings: &[Listing], limits: CoreLimits) -> MatchingCore {
        let mut book_of = vec![NONE; INSTRUMENT_IDS_MAX as usize];
        let mut books = Vec::with_capacity(listings.len());
        for listing in listings {
            assert!(
                listing.instrument < INSTRUMENT_IDS_MAX,
                "instrument id over INSTRUMENT_IDS_MAX"
            );
            assert!(listing.levels <= LADDER_LEVELS_MAX);
            book_of[listing.instrument as usize] = books.len() as u32;
            books.push(Book::new(*listing));
        }
        MatchingCore {
            books,
            book_of,
            pool: OrderPool::new(limits.order_pool_slots),
            index: OrderIndex::new(limits.order_pool_slots),
            ended: EndedOrders::new(limits.ended_order_ids),
            counters: CoreCounters::default(),
        }
    }

    /// What the core has counted so far.
    pub fn counters(&self) -> CoreCounters {
        self.counters
    }

    /// Resting orders in the shard.
    pub fn resting_orders(&self) -> u32 {
        self.pool.used_slots()
    }

    /// The book of an instrument (for inspection and tests).
    pub fn book(&self, instrument: InstrumentId) -> Option<&Book> {
        let at = *self.book_of.get(instrument as usize)?;
        (at != NONE).then(|| &self.books[at as usize])
    }

    /// Remaining quantity of a resting order.
    pub fn resting_qty(&self, order_id: OrderId) -> Option<Qty> {
        self.index.get(order_id).map(|slot| self.pool.get(slot).qty)
    }

    /// Processes one sequenced input, emitting its output records in order.
    pub fn process(&mut self, input: &SequencedInput, emit: &mut impl FnMut(&CoreOutput)) {
        self.counters.inputs += 1;
        let book_at = self.book_of.get(input.instrument as usize).copied().unwrap_or(NONE);
        let template = CoreOutput {
            seq: input.seq,
            instrument: input.instrument,
            stamps: input.stamps,
            ..CoreOutput::default()
        };
        if book_at == NONE {
            if !matches!(input.command, Command::Nop) {
                self.counters.invalid_inputs += 1;
                emit(&CoreOutput {
                    kind: OutputKind::Rejected,
                    reason: Reason::UnknownInstrument,
                    ..template
                });
            }
            return;
        }
        match input.command {
            Command::Nop => {}
            Command::New { order_id, client, side, order_type, time_in_force, price, qty } => {
                let out = CoreOutput { client, order_id, side, price, ..template };
                self.new_order(book_at, out, order_type, time_in_force, qty, emit);
            }
            Command::Cancel { order_id, client } => {
                let out = CoreOutput { client, order_id, ..template };
                self.cancel(book_at, out, Reason::CancelRequested, emit)
            }
            Command::CancelOnDisconnect { order_id, client } => {
                let out = CoreOutput { client, order_id, ..template };
                self.cancel(book_at, out, Reason::CancelOnDisconnect, emit)
            }
            Command::Replace { order_id, client, price, qty } => {
                let out = CoreOutput { client, order_id, price, ..template };
                self.replace(book_at, out, qty, emit);
            }
            Command::Halt => self.books[book_at as usize].halted = true,
            Command::Resume => self.books[book_at as usize].halted = false,
            Command::SetBand { low, high } => self.set_band(book_at, low, high),
        }
        self.publish_top(book_at, &template, emit);
    }

    fn reject(&mut self, out: CoreOutput, reason: Reason, emit: &mut impl FnMut(&CoreOutput)) {
        emit(&CoreOutput { kind: OutputKind::Rejected, reason, ..out });
    }

    /// The ladder level of a limit order (`None` for a market order: the far end of the
    /// ladder), or the reject reason, counted as invalid input, if the pre-process let a zero
    /// quantity or an off-tick or off-ladder price through.
    fn checked_level(
        &mut self,
        book_at: u32,
        price: Option<Price>,
        qty: Qty,
    ) -> Result<u32, Reason> {
        let listing = &self.books[book_at as usize].listing;
        let level = match price {
            _ if qty == 0 => Err(Reason::ZeroQuantity),
            None => Ok(listing.levels - 1),
            Some(price) => listing.level_of(price).ok_or(Reason::BadPrice),
        };
        if level.is_err() {
            self.counters.invalid_inputs += 1;
        }
        level
    }

    /// Business state checks the core owns: halt and the band set by external events.
    fn state_reject(&self, book_at: u32, level: u32) -> Option<Reason> {
        let book = &self.books[book_at as usize];
        if book.halted {
            Some(Reason::InstrumentHalted)
        } else if level < book.band_low || level > book.band_high {
            Some(Reason::PriceOutsideBand)
        } else {
            None
        }
    }

    fn new_order(
        &mut self,
        book_at: u32,
        out: CoreOutput,
        order_type: OrderType,
        time_in_force: TimeInForce,
        qty: Qty,
        emit: &mut impl FnMut(&CoreOutput),
    ) {
        let price = (order_type == OrderType::Limit).then_some(out.price);
        let limit = match self.checked_level(book_at, price, qty) {
            // A market buy may take every ask (limit: top of the ladder), a market sell every bid.
            Ok(_) if price.is_none() && out.side == Side::Sell => 0,
            Ok(level) => level,
            Err(reason) => return self.reject(out, reason, emit),
        };
        let rests = order_type == OrderType::Limit && time_in_force == TimeInForce::Day;
        let business_reject = if order_type == OrderType::Market {
            self.books[book_at as usize].halted.then_some(Reason::InstrumentHalted)
        } else {
            self.state_reject(book_at, limit)
        };
        let reason = business_reject
            .or_else(|| self.is_taken(out.order_id).then_some(Reason::DuplicateOrderId))
            .or_else(|| (rests && self.pool.is_full()).then_some(Reason::OrderPoolFull));
        if let Some(reason) = reason {
            return self.reject(out, reason, emit);
        }
        emit(&CoreOutput { kind: OutputKind::Accepted, leaves_qty: qty, ..out });
        if time_in_force == TimeInForce::Fok
            && self.books[book_at as usize].available_against(out.side, limit, qty) < u64::from(qty)
        {
            let kill = CoreOutput {
                kind: OutputKind::Cancelled,
                reason: Reason::FillOrKillUnfilled,
                qty,
                ..out
            };
            self.ended.push(out.order_id);
            return emit(&kill);
        }
        let mut aggressor =
            Aggressor { order_id: out.order_id, client: out.client, side: out.side, qty };
        self.match_against(book_at, &mut aggressor, limit, &out, emit);
        if aggressor.qty == 0 {
            return self.ended.push(out.order_id);
        }
        if rests {
            self.rest(book_at, &aggressor, limit);
        } else {
            let remainder = CoreOutput {
                kind: OutputKind::Cancelled,
                reason: Reason::ImmediateRemainder,
                qty: aggressor.qty,
                ..out
            };
            self.ended.push(out.order_id);
            emit(&remainder);
        }
    }

    /// Whether a new order may not take `order_id`: it names a resting order, or one of the
    /// kept ended ones.
    #[inline]
    fn is_taken(&self, order_id: OrderId) -> bool {
        self.index.get(order_id).is_some() || self.ended.contains(order_id)
    }

    /// Puts the aggressor's remainder on the book in a fresh slot (the caller checked the pool).
    fn rest(&mut self, book_at: u32, aggressor: &Aggressor, level: u32) {
        let order = OrderSlot::resting(
            aggressor.order_id,
            aggressor.client,
            aggressor.qty,
            book_at,
            aggressor.side,
        );
        let slot = self.pool.alloc(order).expect("pool checked before matching");
        self.index.insert(aggressor.order_id, slot);
        self.books[book_at as usize].ladder_mut(aggressor.side).push_back(
            &mut self.pool,
            level,
            slot,
        );
    }

    /// Matches the aggressor against the contra side, best price first and, within a price,
    /// oldest order first, down to (and including) `limit`.
    fn match_against(
        &mut self,
        book_at: u32,
        aggressor: &mut Aggressor,
        limit: u32,
        out: &CoreOutput,
        emit: &mut impl FnMut(&CoreOutput),
    ) {
        let book = &mut self.books[book_at as usize];
        let listing = book.listing;
        let contra = book.ladder_mut(opposite(aggressor.side));
        while aggressor.qty > 0
            && contra.best() != NONE
            && contra.at_least_as_good(contra.best(), limit)
        {
            let level = contra.best();
            let slot = contra.head(level);
            let resting = *self.pool.get(slot);
            let fill = aggressor.qty.min(resting.qty);
            let price = listing.price_of(level);
            aggressor.qty -= fill;
            self.counters.trades += 1;
            emit(&fill_report(
                out,
                aggressor.order_id,
                aggressor.client,
                aggressor.side,
                price,
                fill,
                aggressor.qty,
            ));
            let resting_leaves = resting.qty - fill;
            emit(&fill_report(
                out,
                resting.order_id,
                resting.client,
                resting.side,
                price,
                fill,
                resting_leaves,
            ));
            emit(&CoreOutput {
                kind: OutputKind::Trade,
                side: aggressor.side,
                client: 0,
                order_id: aggressor.order_id,
                contra_order_id: resting.order_id,
                price,
                qty: fill,
                ..*out
            });
            if resting_leaves == 0 {
                contra.unlink(&mut self.pool, slot);
                self.index.remove(resting.order_id);
                self.ended.push(resting.order_id);
                self.pool.free(slot);
            } else {
                contra.reduce(&mut self.pool, slot, fill);
            }
        }
    }

    /// Looks up a resting order for cancel/replace: unknown (never seen, filled or cancelled)
    /// and foreign orders are rejected.
    fn owned_order(&self, book_at: u32, out: &CoreOutput) -> Result<u32, Reason> {
        let slot = self.index.get(out.order_id).ok_or(Reason::UnknownOrder)?;
        let order = self.pool.get(slot);
        if order.book != book_at {
            return Err(Reason::UnknownOrder);
        }
        if order.client != out.client {
            return Err(Reason::NotOrderOwner);
        }
        Ok(slot)
    }

    fn cancel(
        &mut self,
        book_at: u32,
        out: CoreOutput,
        why: Reason,
        emit: &mut impl FnMut(&CoreOutput),
    ) {
        let slot = match self.owned_order(book_at, &out) {
            Ok(slot) => slot,
            Err(reason) => return self.reject(out, reason, emit),
        };
        let order = *self.pool.get(slot);
        self.books[book_at as usize].ladder_mut(order.side).unlink(&mut self.pool, slot);
        self.index.remove(order.order_id);
        self.ended.push(order.order_id);
        self.pool.free(slot);
        let price = self.books[book_at as usize].listing.price_of(order.level);
        emit(&CoreOutput {
            kind: OutputKind::Cancelled,
            reason: why,
            side: order.side,
            price,
            qty: order.qty,
            leaves_qty: 0,
            ..out
        });
    }

    fn replace(
        &mut self,
        book_at: u32,
        out: CoreOutput,
        qty: Qty,
        emit: &mut impl FnMut(&CoreOutput),
    ) {
        let level = match self.checked_level(book_at, Some(out.price), qty) {
            Ok(level) => level,
            Err(reason) => return self.reject(out, reason, emit),
        };
        let slot = match self.owned_order(book_at, &out) {
            Ok(slot) => slot,
            Err(reason) => return self.reject(out, reason, emit),
        };
        if let Some(reason) = self.state_reject(book_at, level) {
            return self.reject(out, reason, emit);
        }
        let order = *self.pool.get(slot);
        let out = CoreOutput { side: order.side, ..out };
        let ladder = self.books[book_at as usize].ladder_mut(order.side);
        if level == order.level && qty <= order.qty {
            // Same price, smaller quantity: keeps its place in the queue.
            ladder.reduce(&mut self.pool, slot, order.qty - qty);
            return emit(&CoreOutput { kind: OutputKind::Replaced, leaves_qty: qty, ..out });
        }
        // Any other change loses time priority: out of the queue, re-entered as an aggressor.
        ladder.unlink(&mut self.pool, slot);
        emit(&CoreOutput { kind: OutputKind::Replaced, leaves_qty: qty, ..out });
        let mut aggressor =
            Aggressor { order_id: order.order_id, client: order.client, side: order.side, qty };
        self.match_against(book_at, &mut aggressor, level, &out, emit);
        if aggressor.qty == 0 {
            self.index.remove(order.order_id);
            self.ended.push(order.order_id);
            self.pool.free(slot);
        } else {
            self.pool.get_mut(slot).qty = aggressor.qty;
            self.books[book_at as usize].ladder_mut(order.side).push_back(
                &mut self.pool,
                level,
                slot,
            );
        }
    }

    fn set_band(&mut self, book_at: u32, low: Price, high: Price) {
        let book = &mut self.books[book_at as usize];
        let listing = book.listing;
        // The external events process only sends bands on the ladder; clamp defensively so a
        // bad band can narrow trading but never index outside the ladder.
        let clamp = |price: Price| {
            let offset = (price - listing.ladder_low).div_euclid(listing.tick);
            offset.clamp(0, Price::from(listing.levels - 1)) as u32
        };
        book.band_low = clamp(low);
        book.band_high = clamp(high).max(book.band_low);
    }

    fn publish_top(
        &mut self,
        book_at: u32,
        template: &CoreOutput,
        emit: &mut impl FnMut(&CoreOutput),
    ) {
        let book = &mut self.books[book_at as usize];
        // Release build, once per input: matching runs until the book no longer crosses, so a
        // crossed book means corrupt ladders, and every later match would be wrong. Costs a
        // compare of the two best levels, which `top` reads anyway.
        assert!(!book.is_crossed(), "book of instrument {} crossed", book.listing.instrument);
        let top = book.top();
        if top == book.last_top {
            return;
        }
        book.last_top = top;
        emit(&CoreOutput::with_top_of_book(&top, template));
    }
}

fn fill_report(
    out: &CoreOutput,
    order_id: OrderId,
    client: ClientId,
    side: Side,
    price: Price,
    fill: Qty,
    leaves_qty: Qty,
) -> CoreOutput {
    let kind = if leaves_qty == 0 { OutputKind::Filled } else { OutputKind::PartiallyFilled };
    CoreOutput {
        kind,
        reason: Reason::None,
        order_id,
        client,
        side,
        price,
        qty: fill,
        leaves_qty,
        ..*out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LISTING: Listing = Listing { instrument: 3, ladder_low: 100, tick: 10, levels: 16 };

    fn process(core: &mut MatchingCore, command: Command) -> Vec<CoreOutput> {
        let mut outputs = Vec::new();
        let input = SequencedInput {
            seq: 1,
            instrument: LISTING.instrument,
            command,
            ..SequencedInput::default()
        };
        core.process(&input, &mut |o| outputs.push(*o));
        outputs
    }

    fn limit(order_id: OrderId, price: Price, qty: Qty) -> Command {
        Command::New {
            order_id,
            client: 1,
            side: Side::Buy,
            order_type: OrderType::Limit,
            time_in_force: TimeInForce::Day,
            price,
            qty,
        }
    }

    #[test]
    fn input_the_preprocess_must_have_stopped_is_counted_and_rejected() {
        let mut core = MatchingCore::new(
            &[LISTING],
            CoreLimits { order_pool_slots: 4, ..CoreLimits::default() },
        );
        let cases = [
            (limit(1, 105, 1), Reason::BadPrice),
            (limit(2, 100, 0), Reason::ZeroQuantity),
            (limit(3, 1_000, 1), Reason::BadPrice),
        ];
        for (command, reason) in cases {
            let outputs = process(&mut core, command);
            assert_eq!(outputs.len(), 1);
            assert_eq!((outputs[0].kind, outputs[0].reason), (OutputKind::Rejected, reason));
        }
        assert_eq!(core.counters().invalid_inputs, 3);
        assert_eq!(core.resting_orders(), 0);
    }

    #[test]
    fn an_ended_orders_id_is_refused_as_a_duplicate_and_a_snapshot_keeps_it() {
        let limits = CoreLimits { order_pool_slots: 4, ended_order_ids: 2 };
        let mut core = MatchingCore::new(&[LISTING], limits);
        process(&mut core, limit(1, 110, 5));
        process(&mut core, Command::Cancel { order_id: 1, client: 1 });
        let resent = process(&mut core, limit(1, 110, 5));
        assert_eq!(
            (resent[0].kind, resent[0].reason),
            (OutputKind::Rejected, Reason::DuplicateOrderId)
        );
        let mut bytes = Vec::new();
        core.write_snapshot(&mut bytes);
        assert!(bytes.len() <= core.snapshot_bytes_max());
        let (mut restored, rest) = MatchingCore::restore(&bytes).unwrap();
        assert!(rest.is_empty());
        assert_eq!(restored.limits(), limits);
        let after_restore = process(&mut restored, limit(1, 110, 5));
        assert_eq!(
            after_restore[0].reason,
            Reason::DuplicateOrderId,
            "the restored core refuses it"
        );
        for order_id in [2, 3] {
            process(&mut restored, limit(order_id, 110, 5));
            process(&mut restored, Command::Cancel { order_id, client: 1 });
        }
        let forgotten = process(&mut restored, limit(1, 110, 5));
        assert_eq!(forgotten[0].kind, OutputKind::Accepted, "past the kept ids an id is free");
        let v1 = [&b"LTXCORE1"[..], &bytes[8..12], &bytes[16..bytes.len() - 4 - 8]].concat();
        let (from_v1, _) = MatchingCore::restore(&v1).unwrap();
        assert_eq!(from_v1.limits().ended_order_ids, 0, "a version-1 snapshot keeps none");
    }

    #[test]
    fn full_pool_rejects_cleanly_and_band_and_halt_come_from_control_messages() {
        let mut core = MatchingCore::new(
            &[LISTING],
            CoreLimits { order_pool_slots: 1, ..CoreLimits::default() },
        );
        assert_eq!(process(&mut core, limit(1, 110, 5))[0].kind, OutputKind::Accepted);
        let full = process(&mut core, limit(2, 110, 5));
        assert_eq!((full[0].kind, full[0].reason), (OutputKind::Rejected, Reason::OrderPoolFull));
        process(&mut core, Command::SetBand { low: 100, high: 120 });
        let outside =
            process(&mut core, Command::Replace { order_id: 1, client: 1, price: 150, qty: 5 });
        assert_eq!(outside[0].reason, Reason::PriceOutsideBand);
        process(&mut core, Command::Halt);
        assert_eq!(process(&mut core, limit(3, 110, 1))[0].reason, Reason::InstrumentHalted);
        let cancel = process(&mut core, Command::Cancel { order_id: 1, client: 1 });
        assert_eq!(cancel[0].kind, OutputKind::Cancelled, "cancels pass while halted");
        assert_eq!(core.counters().invalid_inputs, 0);
    }
}
