//! One instrument's limit order book: a price ladder per side, indexed by tick offset from the
//! instrument's lowest listed price, each level a FIFO queue of order slots (intrusive, linked
//! by pool index), plus a bitmap of non-empty levels so the next best level is found with a few
//! word scans instead of a walk over empty levels.

use crate::msg::{InstrumentId, Price, Qty, Side};
pub use crate::msg::{TopOfBook, saturate_qty};
use crate::store::{NONE, OrderPool};

/// Default number of price levels per side (the ladder spans `levels` ticks).
pub const LADDER_LEVELS_DEFAULT: u32 = 4096;
/// Largest ladder an instrument may list.
pub const LADDER_LEVELS_MAX: u32 = 1 << 20;

/// How an instrument is listed in the core: its ladder geometry and the initial price band.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Listing {
    /// The instrument listed.
    pub instrument: InstrumentId,
    /// Price of ladder level 0.
    pub ladder_low: Price,
    /// Price step between adjacent levels; prices off it are refused.
    pub tick: Price,
    /// Number of levels (ticks) in the ladder.
    pub levels: u32,
}

impl Listing {
    /// Highest price on the ladder.
    pub fn ladder_high(&self) -> Price {
        self.ladder_low + self.tick * Price::from(self.levels - 1)
    }

    /// The ladder index of a price, if it is on tick and on the ladder.
    pub fn level_of(&self, price: Price) -> Option<u32> {
        let offset = price.checked_sub(self.ladder_low)?;
        if offset < 0 || offset % self.tick != 0 {
            return None;
        }
        let level = offset / self.tick;
        (level < Price::from(self.levels)).then_some(level as u32)
    }

    /// The price of ladder level `level`.
    pub fn price_of(&self, level: u32) -> Price {
        self.ladder_low + self.tick * Price::from(level)
    }
}

/// A price level: the FIFO queue of resting orders at one price.
#[derive(Clone, Copy, Debug)]
struct Level {
    head: u32,
    tail: u32,
    /// Total open quantity at this level: changed only by [`Ladder::push_back`],
    /// [`Ladder::unlink`] and [`Ladder::reduce`], together with the orders' own quantities.
    qty: u64,
}

impl Default for Level {
    fn default() -> Self {
        Level { head: NONE, tail: NONE, qty: 0 }
    }
}

/// One side of a book. Read-only outside the core: its levels' quantities, occupancy bits and
/// best level move together, so only the core (through the crate-private mutators) changes
/// them, and the core asserts they agree.
pub struct Ladder {
    levels: Vec<Level>,
    /// Bit `i` set = level `i` holds orders.
    occupied: Vec<u64>,
    /// Best level (highest bid / lowest ask), or [`NONE`].
    best: u32,
    side: Side,
}

impl Ladder {
    fn new(side: Side, levels: u32) -> Ladder {
        Ladder {
            levels: vec![Level::default(); levels as usize],
            occupied: vec![0; (levels as usize).div_ceil(64)],
            best: NONE,
            side,
        }
    }

    /// Best level (highest bid / lowest ask), or `u32::MAX` when the side is empty.
    pub fn best(&self) -> u32 {
        self.best
    }

    /// The oldest order slot at `level`, or [`NONE`].
    pub(crate) fn head(&self, level: u32) -> u32 {
        self.levels[level as usize].head
    }

    /// True if `level` is at least as good as `other` from this side's point of view.
    pub fn at_least_as_good(&self, level: u32, other: u32) -> bool {
        match self.side {
            Side::Buy => level >= other,
            Side::Sell => level <= other,
        }
    }

    /// The next occupied level strictly worse than `level`, or `u32::MAX` when there is none.
    pub fn next_worse(&self, level: u32) -> u32 {
        match self.side {
            Side::Buy => self.highest_occupied_below(level),
            Side::Sell => self.lowest_occupied_above(level),
        }
    }

    fn highest_occupied_below(&self, level: u32) -> u32 {
        if level == 0 {
            return NONE;
        }
        let below = level - 1;
        let mut word = (below / 64) as usize;
        let mut bits = self.occupied[word] & (u64::MAX >> (63 - below % 64));
        loop {
            if bits != 0 {
                return word as u32 * 64 + 63 - bits.leading_zeros();
            }
            if word == 0 {
                return NONE;
            }
            word -= 1;
            bits = self.occupied[word];
        }
    }

    fn lowest_occupied_above(&self, level: u32) -> u32 {
        let above = level + 1;
        let mut word = (above / 64) as usize;
        if word >= self.occupied.len() {
            return NONE;
        }
        let mut bits = self.occupied[word] & (u64::MAX << (above % 64));
        loop {
            if bits != 0 {
                return word as u32 * 64 + bits.trailing_zeros();
            }
            word += 1;
            if word == self.occupied.len() {
                return NONE;
            }
            bits = self.occupied[word];
        }
    }

    /// Appends an order slot to the tail of a level's queue (time priority).
    pub(crate) fn push_back(&mut self, pool: &mut OrderPool, level: u32, slot: u32) {
        let qty = u64::from(pool.get(slot).qty);
        let entry = &mut self.levels[level as usize];
        let old_tail = entry.tail;
        {
            let order = pool.get_mut(slot);
            order.level = level;
            order.prev = old_tail;
            order.next = NONE;
        }
        if old_tail == NONE {
            entry.head = slot;
            self.occupied[(level / 64) as usize] |= 1 << (level % 64);
            if self.best == NONE || !self.at_least_as_good(self.best, level) {
                self.best = level;
            }
        } else {
            pool.get_mut(old_tail).next = slot;
        }
        let entry = &mut self.levels[level as usize];
        entry.tail = slot;
        entry.qty += qty;
    }

    /// Unlinks an order slot from its level (any position); keeps `best` current.
    pub(crate) fn unlink(&mut self, pool: &mut OrderPool, slot: u32) {
        let order = *pool.get(slot);
        let level = order.level;
        if order.prev == NONE {
            self.levels[level as usize].head = order.next;
        } else {
            pool.get_mut(order.prev).next = order.next;
        }
        if order.next == NONE {
            self.levels[level as usize].tail = order.prev;
        } else {
            pool.get_mut(order.next).prev = order.prev;
        }
        let entry = &mut self.levels[level as usize];
        entry.qty -= u64::from(order.qty);
        if entry.head == NONE {
            // Release build: an empty level with a quantity left means the level totals and
            // the orders disagree (every later top of book would be wrong). One branch per
            // emptied level.
            assert_eq!(entry.qty, 0, "level {level} emptied with quantity left");
            self.occupied[(level / 64) as usize] &= !(1 << (level % 64));
            if self.best == level {
                self.best = self.next_worse(level);
            }
        }
    }

    /// Takes `by` off a resting order's quantity in place (it keeps its time priority), and
    /// off its level's total; `by` is less than the order's quantity (a full fill unlinks).
    pub(crate) fn reduce(&mut self, pool: &mut OrderPool, slot: u32, by: Qty) {
        let order = pool.get_mut(slot);
        debug_assert!(by < order.qty, "reducing order {} by its whole quantity", order.order_id);
        order.qty -= by;
        self.levels[order.level as usize].qty -= u64::from(by);
    }

    /// Best price and total quantity there, or `(0, 0)` when the side is empty.
    pub fn top(&self, listing: &Listing) -> (Price, u64) {
        if self.best == NONE {
            return (0, 0);
        }
        (listing.price_of(self.best), self.levels[self.best as usize].qty)
    }
}

/// The state the core keeps per instrument. Its fields are the core's alone: the ladders'
/// quantities and best levels, the band and the last published top must move together, so
/// callers read them through methods and change them only by feeding the core input.
pub struct Book {
    pub(crate) listing: Listing,
    pub(crate) bids: Ladder,
    pub(crate) asks: Ladder,
    pub(crate) halted: bool,
    /// Inclusive price band, as ladder levels.
    pub(crate) band_low: u32,
    pub(crate) band_high: u32,
    /// Last published top of book.
    pub(crate) last_top: TopOfBook,
}

impl Book {
    /// An empty book for `listing`, open for trading with its whole ladder as the band.
    pub(crate) fn new(listing: Listing) -> Book {
        assert!(listing.tick > 0 && listing.levels > 0 && listing.levels <= LADDER_LEVELS_MAX);
        Book {
            listing,
            bids: Ladder::new(Side::Buy, listing.levels),
            asks: Ladder::new(Side::Sell, listing.levels),
            halted: false,
            band_low: 0,
            band_high: listing.levels - 1,
            last_top: TopOfBook::default(),
        }
    }

    pub(crate) fn ladder_mut(&mut self, side: Side) -> &mut Ladder {
        match side {
            Side::Buy => &mut self.bids,
            Side::Sell => &mut self.asks,
        }
    }

    /// One side of the book, to read.
    pub fn ladder(&self, side: Side) -> &Ladder {
        match side {
            Side::Buy => &self.bids,
            Side::Sell => &self.asks,
        }
    }

    /// How the instrument is listed.
    pub fn listing(&self) -> &Listing {
        &self.listing
    }

    /// Whether matching is halted (an external halt or circuit breaker).
    pub fn is_halted(&self) -> bool {
        self.halted
    }

    /// The inclusive price band new orders must lie in, as prices.
    pub fn band(&self) -> (Price, Price) {
        (self.listing.price_of(self.band_low), self.listing.price_of(self.band_high))
    }

    /// Current top of book.
    pub fn top(&self) -> TopOfBook {
        let (bid, bid_qty) = self.bids.top(&self.listing);
        let (ask, ask_qty) = self.asks.top(&self.listing);
        TopOfBook { bid, bid_qty, ask, ask_qty }
    }

    /// True when the best bid is at or above the best ask.
    pub fn is_crossed(&self) -> bool {
        self.bids.best != NONE && self.asks.best != NONE && self.bids.best >= self.asks.best
    }

    /// Open quantity on the side opposite to `side` at prices at least as good as `limit`,
    /// counting only until `wanted` is reached (the FOK feasibility check).
    pub(crate) fn available_against(&self, side: Side, limit: u32, wanted: Qty) -> u64 {
        let contra = self.ladder(opposite(side));
        let mut level = contra.best;
        let mut available = 0u64;
        while level != NONE
            && contra.at_least_as_good(level, limit)
            && available < u64::from(wanted)
        {
            available += contra.levels[level as usize].qty;
            level = contra.next_worse(level);
        }
        available
    }
}

/// The other side.
pub fn opposite(side: Side) -> Side {
    match side {
        Side::Buy => Side::Sell,
        Side::Sell => Side::Buy,
    }
}
