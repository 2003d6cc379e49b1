//! Fixed-size message records: what flows through the tier's rings.
//!
//! Every record is `Copy + Default` so a ring can pre-allocate and initialise its slots up
//! front and copy messages in and out without touching the heap. Records that arrive from
//! outside ([`InboundOrder`]) keep their enums as raw `u8` codes: hygiene validation in the
//! pre-process decodes them, so a malformed code is a reject with a reason, never a panic.
//! Records past the pre-process ([`SequencedInput`], [`CoreOutput`], [`Response`]) carry typed
//! enums because they can only hold valid values.

/// Prices are integers in the instrument's price unit (for example 1/10 000 of a currency unit).
pub type Price = i64;
/// Quantities are integers in shares/contracts.
pub type Qty = u32;
/// An order id, unique per tier run (assigned by the connection tier).
pub type OrderId = u64;
/// An instrument id in the master data.
pub type InstrumentId = u32;
/// A client (trading member) id in the master data.
pub type ClientId = u32;

/// Order side.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize)]
#[repr(u8)]
pub enum Side {
    /// Buys: matches asks at or below its price.
    #[default]
    Buy = 0,
    /// Sells: matches bids at or above its price.
    Sell = 1,
}

/// Order type.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize)]
#[repr(u8)]
pub enum OrderType {
    /// Matches at its price or better; a Day remainder rests.
    #[default]
    Limit = 0,
    /// Matches at any price; never rests (its remainder is cancelled).
    Market = 1,
}

/// Time in force.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize)]
#[repr(u8)]
pub enum TimeInForce {
    /// Rests on the book until cancelled.
    #[default]
    Day = 0,
    /// Immediate or cancel: matches what it can, the remainder is cancelled.
    Ioc = 1,
    /// Fill or kill: fully filled at once, or cancelled without any fill.
    Fok = 2,
}

impl Side {
    /// Decodes a raw wire code.
    pub fn from_code(code: u8) -> Option<Side> {
        match code {
            0 => Some(Side::Buy),
            1 => Some(Side::Sell),
            _ => None,
        }
    }
}

impl OrderType {
    /// Decodes a raw wire code.
    pub fn from_code(code: u8) -> Option<OrderType> {
        match code {
            0 => Some(OrderType::Limit),
            1 => Some(OrderType::Market),
            _ => None,
        }
    }
}

impl TimeInForce {
    /// Decodes a raw wire code.
    pub fn from_code(code: u8) -> Option<TimeInForce> {
        match code {
            0 => Some(TimeInForce::Day),
            1 => Some(TimeInForce::Ioc),
            2 => Some(TimeInForce::Fok),
            _ => None,
        }
    }
}

/// Why a request was rejected (or an order cancelled by the engine). One code space for the
/// pre-process and the core so reports and counters use one table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize)]
#[repr(u8)]
pub enum Reason {
    /// No reason: the record is not a reject or cancel.
    #[default]
    None = 0,
    // --- hygiene (pre-process) ---
    /// The request kind code is unknown.
    BadRequestKind,
    /// Side, order type or time-in-force code is unknown.
    BadEnum,
    /// Quantity is zero.
    ZeroQuantity,
    /// A limit order has a price <= 0, or a market order carries a price.
    BadPrice,
    /// A market order with time in force Day (markets never rest).
    MarketDay,
    // --- enrichment (pre-process) ---
    /// The instrument is not in the master data.
    UnknownInstrument,
    /// The client is not in the master data.
    UnknownClient,
    // --- business checks (pre-process) ---
    /// The instrument is not active (not listed for trading).
    InstrumentInactive,
    /// The instrument is halted (halt or circuit breaker).
    InstrumentHalted,
    /// The price is not a multiple of the tick size.
    PriceOffTick,
    /// The price is outside the instrument's price band.
    PriceOutsideBand,
    /// The quantity is not a multiple of the lot size.
    QuantityOffLot,
    /// The quantity is above the instrument's maximum order quantity.
    QuantityOverMax,
    /// The client is disabled.
    ClientDisabled,
    /// The order's value is above the client's per-order value limit.
    ClientLimitExceeded,
    // --- core ---
    /// Cancel/replace of an order that is not resting (unknown, filled or cancelled).
    UnknownOrder,
    /// A new order reuses the id of a resting order.
    DuplicateOrderId,
    /// The shard's order pool is full.
    OrderPoolFull,
    /// A replace or cancel from a client that does not own the order.
    NotOrderOwner,
    // --- engine cancels (not rejects) ---
    /// Cancelled on the client's request.
    CancelRequested,
    /// The unfilled remainder of an IOC or market order.
    ImmediateRemainder,
    /// A fill-or-kill order that could not be filled in full.
    FillOrKillUnfilled,
    /// Cancelled because its owner's session was gone past the gateway's grace window
    /// (cancel-on-disconnect), not on a request the client sent.
    CancelOnDisconnect,
}

/// Number of [`Reason`] codes (for counter arrays).
pub const REASON_COUNT: usize = Reason::CancelOnDisconnect as usize + 1;

impl Reason {
    /// Every reason, in code order (index = code).
    pub const ALL: [Reason; REASON_COUNT] = [
        Reason::None,
        Reason::BadRequestKind,
        Reason::BadEnum,
        Reason::ZeroQuantity,
        Reason::BadPrice,
        Reason::MarketDay,
        Reason::UnknownInstrument,
        Reason::UnknownClient,
        Reason::InstrumentInactive,
        Reason::InstrumentHalted,
        Reason::PriceOffTick,
        Reason::PriceOutsideBand,
        Reason::QuantityOffLot,
        Reason::QuantityOverMax,
        Reason::ClientDisabled,
        Reason::ClientLimitExceeded,
        Reason::UnknownOrder,
        Reason::DuplicateOrderId,
        Reason::OrderPoolFull,
        Reason::NotOrderOwner,
        Reason::CancelRequested,
        Reason::ImmediateRemainder,
        Reason::FillOrKillUnfilled,
        Reason::CancelOnDisconnect,
    ];

    /// The reason's name as written (`PriceOffTick`): what reports and FIX Text (58) show.
    ///
    /// ```
    /// use matching::msg::Reason;
    /// assert_eq!(Reason::PriceOffTick.name(), "PriceOffTick");
    /// assert!(Reason::ALL.iter().all(|r| r.name() == format!("{r:?}")));
    /// ```
    pub fn name(self) -> &'static str {
        const NAMES: [&str; REASON_COUNT] = [
            "None",
            "BadRequestKind",
            "BadEnum",
            "ZeroQuantity",
            "BadPrice",
            "MarketDay",
            "UnknownInstrument",
            "UnknownClient",
            "InstrumentInactive",
            "InstrumentHalted",
            "PriceOffTick",
            "PriceOutsideBand",
            "QuantityOffLot",
            "QuantityOverMax",
            "ClientDisabled",
            "ClientLimitExceeded",
            "UnknownOrder",
            "DuplicateOrderId",
            "OrderPoolFull",
            "NotOrderOwner",
            "CancelRequested",
            "ImmediateRemainder",
            "FillOrKillUnfilled",
            "CancelOnDisconnect",
        ];
        NAMES[self as usize]
    }

    /// True for the reasons of the pre-process's checks (hygiene, enrichment, business).
    /// The core also answers halts and bands from its own sequenced state.
    pub fn is_invalid_input(self) -> bool {
        (self as u8) >= Reason::BadRequestKind as u8
            && (self as u8) <= Reason::ClientLimitExceeded as u8
    }
}

/// What a request asks for: the typed form of [`InboundOrder::kind`], which stays a raw code
/// because a request must be able to carry an unknown one (to be rejected with
/// [`Reason::BadRequestKind`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[repr(u8)]
pub enum RequestKind {
    /// A new order.
    New = 1,
    /// Cancel a resting order.
    Cancel = 2,
    /// Replace (price and/or quantity) a resting order.
    Replace = 3,
    /// Cancel a resting order because its owner's session is gone (sent by the gateway, not
    /// the client; answered with [`Reason::CancelOnDisconnect`]).
    CancelOnDisconnect = 4,
}

impl RequestKind {
    /// Decodes a raw wire code.
    ///
    /// ```
    /// use matching::msg::{RequestKind, request_kind};
    ///
    /// assert_eq!(RequestKind::from_code(request_kind::CANCEL), Some(RequestKind::Cancel));
    /// assert_eq!(RequestKind::from_code(0), None);
    /// ```
    pub fn from_code(code: u8) -> Option<RequestKind> {
        match code {
            1 => Some(RequestKind::New),
            2 => Some(RequestKind::Cancel),
            3 => Some(RequestKind::Replace),
            4 => Some(RequestKind::CancelOnDisconnect),
            _ => None,
        }
    }
}

/// Raw request codes of [`InboundOrder::kind`], as they travel on the wire ([`RequestKind`]
/// decodes them).
pub mod request_kind {
    use super::RequestKind;

    /// A new order.
    pub const NEW: u8 = RequestKind::New as u8;
    /// Cancel a resting order.
    pub const CANCEL: u8 = RequestKind::Cancel as u8;
    /// Replace (price and/or quantity) a resting order.
    pub const REPLACE: u8 = RequestKind::Replace as u8;
    /// Cancel a resting order because its owner's session is gone.
    pub const CANCEL_ON_DISCONNECT: u8 = RequestKind::CancelOnDisconnect as u8;
}

/// Nanosecond timestamps stamped as a message crosses the tier (a monotonic clock, see
/// `pipeline::metrics::now_ns`). They ride along for latency measurement and are not part of the
/// deterministic output.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stamps {
    /// When the load generator intended to send the message (latency is measured from here).
    pub intended_ns: u64,
    /// When the pre-process took it off its ring.
    pub preprocess_in_ns: u64,
    /// When the core shard took it off its ring.
    pub core_in_ns: u64,
    /// When the response's content was final (the core emitted it, or the pre-process built
    /// a reject): the end of the critical path, before any wait for the journal's fsync.
    pub ready_ns: u64,
    /// When the R-Processor took the core's output off its ring.
    pub rprocess_in_ns: u64,
    /// When an R-Sender took the response off its ring.
    pub sender_in_ns: u64,
}

/// A request as it arrives from the connection tier: raw codes, not yet validated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InboundOrder {
    /// One of [`request_kind`].
    pub kind: u8,
    /// Raw [`Side`] code.
    pub side: u8,
    /// Raw [`OrderType`] code.
    pub order_type: u8,
    /// Raw [`TimeInForce`] code.
    pub time_in_force: u8,
    /// The instrument it trades.
    pub instrument: InstrumentId,
    /// The client who sent it.
    pub client: ClientId,
    /// The new order's id, or the id of the order to cancel/replace.
    pub order_id: OrderId,
    /// Limit price (new) or new price (replace); 0 for market orders and cancels.
    pub price: Price,
    /// Quantity (new) or new remaining quantity (replace); 0 for cancels.
    pub qty: Qty,
    /// Latency stamps; not part of the request.
    pub stamps: Stamps,
}

/// An instruction to the matching core, enriched and valid (hygiene and business checks passed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Command {
    /// Placeholder of pre-allocated ring slots; the core ignores it.
    #[default]
    Nop,
    /// A new order.
    New {
        /// Its id, unique among resting orders.
        order_id: OrderId,
        /// Its owner.
        client: ClientId,
        /// Buy or sell.
        side: Side,
        /// Limit or market.
        order_type: OrderType,
        /// How long it may rest.
        time_in_force: TimeInForce,
        /// Limit price (on tick, in band); ignored for market orders.
        price: Price,
        /// Quantity, at least 1.
        qty: Qty,
    },
    /// Cancel a resting order.
    Cancel {
        /// The order to cancel.
        order_id: OrderId,
        /// Who asks: must own the order.
        client: ClientId,
    },
    /// Cancel a resting order because its owner's session is gone (answered with
    /// [`Reason::CancelOnDisconnect`]).
    CancelOnDisconnect {
        /// The order to cancel.
        order_id: OrderId,
        /// Its owner, whose session is gone.
        client: ClientId,
    },
    /// Replace: a smaller quantity at the same price keeps time priority; any other change
    /// loses it (the order is re-entered and may match).
    Replace {
        /// The order to replace.
        order_id: OrderId,
        /// Who asks: must own the order.
        client: ClientId,
        /// The new price.
        price: Price,
        /// The new remaining quantity.
        qty: Qty,
    },
    /// External event: stop matching the instrument (halt or circuit breaker).
    Halt,
    /// External event: resume matching.
    Resume,
    /// External event: a new price band (inclusive); resting orders outside stay.
    SetBand {
        /// Lowest price accepted.
        low: Price,
        /// Highest price accepted.
        high: Price,
    },
}

/// One record of the core's sequenced input: the journaling boundary. The sequencer in front
/// of each core shard assigns `seq`; replaying the same records into a fresh core reproduces
/// byte-identical output.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SequencedInput {
    /// Position in the shard's input stream (1-based, gap-free).
    pub seq: u64,
    /// The instrument whose book it addresses.
    pub instrument: InstrumentId,
    /// What to do.
    pub command: Command,
    /// Latency stamps; not part of the deterministic input.
    pub stamps: Stamps,
}

/// What an output record reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize)]
#[repr(u8)]
pub enum OutputKind {
    /// A new order was accepted (it may match in the records that follow).
    #[default]
    Accepted = 0,
    /// An order traded part of its quantity; `leaves_qty` is still open.
    PartiallyFilled,
    /// An order traded its whole quantity.
    Filled,
    /// `reason` says why (requested, IOC remainder, FOK unfilled).
    Cancelled,
    /// A replace took effect.
    Replaced,
    /// `reason` says why.
    Rejected,
    /// Market data: a trade (`order_id` = aggressor, `contra_order_id` = resting order).
    Trade,
    /// Market data: the best bid and offer changed.
    TopOfBook,
}

impl OutputKind {
    /// Every kind, in code order (index = code).
    pub const ALL: [OutputKind; 8] = [
        OutputKind::Accepted,
        OutputKind::PartiallyFilled,
        OutputKind::Filled,
        OutputKind::Cancelled,
        OutputKind::Replaced,
        OutputKind::Rejected,
        OutputKind::Trade,
        OutputKind::TopOfBook,
    ];
}

/// One record of the core's output stream: an execution report or market data.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CoreOutput {
    /// The input record that produced it (0: a pre-process reject, which no input caused).
    pub seq: u64,
    /// The core shard whose sequence `seq` belongs to (routing only; not hashed).
    pub shard: u32,
    /// What the record reports.
    pub kind: OutputKind,
    /// Why, for rejects and cancels.
    pub reason: Reason,
    /// The order's side.
    pub side: Side,
    /// The instrument.
    pub instrument: InstrumentId,
    /// The client the record is for (the aggressor's, for a trade).
    pub client: ClientId,
    /// The order reported on (the aggressor, for a trade).
    pub order_id: OrderId,
    /// Execution price (fills, trades), order price (accepted, replaced, cancelled), best bid
    /// (top of book: build and read those with [`CoreOutput::with_top_of_book`] and
    /// [`CoreOutput::top_of_book`]).
    pub price: Price,
    /// Executed quantity (fills, trades), best bid quantity (top of book).
    pub qty: Qty,
    /// Quantity still open on the order; best ask quantity (top of book).
    pub leaves_qty: Qty,
    /// Resting order of a trade; unused otherwise.
    pub contra_order_id: OrderId,
    /// Best ask (top of book); unused otherwise.
    pub best_ask: Price,
    /// Latency stamps; not part of the deterministic output.
    pub stamps: Stamps,
}

/// Fields laid one after another into a fixed-size array.
struct FixedWriter<'a, const N: usize> {
    bytes: &'a mut [u8; N],
    at: usize,
}

impl<const N: usize> FixedWriter<'_, N> {
    #[inline(always)]
    fn put<const L: usize>(&mut self, field: [u8; L]) {
        self.bytes[self.at..self.at + L].copy_from_slice(&field);
        self.at += L;
    }
}

/// Size of [`CoreOutput::canonical_bytes`].
pub const CANONICAL_OUTPUT_BYTES: usize = 8 + 1 + 1 + 1 + 4 + 4 + 8 + 8 + 4 + 4 + 8 + 8;

impl CoreOutput {
    /// Whether this is the core's answer to a request (accepted, replaced, rejected, or
    /// cancelled on request), the first response a client gets for it; fills and engine
    /// cancels that follow are not answers.
    pub fn answers_request(&self) -> bool {
        match self.kind {
            OutputKind::Accepted | OutputKind::Replaced | OutputKind::Rejected => true,
            OutputKind::Cancelled => {
                matches!(self.reason, Reason::CancelRequested | Reason::CancelOnDisconnect)
            }
            _ => false,
        }
    }

    /// The deterministic content (everything but the latency stamps), little-endian, in a
    /// fixed layout: what the output hash covers.
    pub fn canonical_bytes(&self) -> [u8; CANONICAL_OUTPUT_BYTES] {
        let mut bytes = [0u8; CANONICAL_OUTPUT_BYTES];
        self.write_canonical(&mut bytes);
        bytes
    }

    /// Reads [`CoreOutput::canonical_bytes`] back (shard and stamps zero): what a process
    /// that receives outputs from another (a gateway on its own host) routes and encodes.
    /// `None` when a code is none of its enum's.
    ///
    /// ```
    /// use matching::msg::{CoreOutput, OutputKind, Reason};
    /// let output = CoreOutput { seq: 9, kind: OutputKind::Cancelled, reason: Reason::CancelOnDisconnect, client: 4, price: -5, ..CoreOutput::default() };
    /// assert_eq!(CoreOutput::from_canonical(&output.canonical_bytes()), Some(output));
    /// let mut bad = output.canonical_bytes();
    /// bad[8] = 200; // no such output kind
    /// assert_eq!(CoreOutput::from_canonical(&bad), None);
    /// ```
    pub fn from_canonical(bytes: &[u8; CANONICAL_OUTPUT_BYTES]) -> Option<CoreOutput> {
        let mut fields = crate::wire::Fields::new(bytes);
        let seq = fields.u64().ok()?;
        let kind = OutputKind::ALL.get(usize::from(fields.u8().ok()?)).copied()?;
        let reason = Reason::ALL.get(usize::from(fields.u8().ok()?)).copied()?;
        let side = Side::from_code(fields.u8().ok()?)?;
        Some(CoreOutput {
            seq,
            shard: 0,
            kind,
            reason,
            side,
            instrument: fields.u32().ok()?,
            client: fields.u32().ok()?,
            order_id: fields.u64().ok()?,
            price: fields.i64().ok()?,
            qty: fields.u32().ok()?,
            leaves_qty: fields.u32().ok()?,
            contra_order_id: fields.u64().ok()?,
            best_ask: fields.i64().ok()?,
            stamps: Stamps::default(),
        })
    }

    /// Writes [`CoreOutput::canonical_bytes`] into `bytes` in place. Every offset is a
    /// constant once inlined, so this is a few stores (it runs for every output the core
    /// produces, for the output hash).
    #[inline]
    pub fn write_canonical(&self, bytes: &mut [u8; CANONICAL_OUTPUT_BYTES]) {
        let mut writer = FixedWriter { bytes, at: 0 };
        writer.put(self.seq.to_le_bytes());
        writer.put([self.kind as u8, self.reason as u8, self.side as u8]);
        writer.put(self.instrument.to_le_bytes());
        writer.put(self.client.to_le_bytes());
        writer.put(self.order_id.to_le_bytes());
        writer.put(self.price.to_le_bytes());
        writer.put(self.qty.to_le_bytes());
        writer.put(self.leaves_qty.to_le_bytes());
        writer.put(self.contra_order_id.to_le_bytes());
        writer.put(self.best_ask.to_le_bytes());
        debug_assert_eq!(writer.at, CANONICAL_OUTPUT_BYTES);
    }

    /// `template` as a top-of-book record of `top`. A record is one flat layout whose canonical
    /// bytes every output hash covers, so the ask quantity travels in `leaves_qty`; this and
    /// [`CoreOutput::top_of_book`] are the only code that knows where each side goes.
    /// Quantities saturate at `Qty::MAX` (a level's total may exceed one order's).
    pub fn with_top_of_book(top: &TopOfBook, template: &CoreOutput) -> CoreOutput {
        CoreOutput {
            kind: OutputKind::TopOfBook,
            price: top.bid,
            qty: saturate_qty(top.bid_qty),
            best_ask: top.ask,
            leaves_qty: saturate_qty(top.ask_qty),
            ..*template
        }
    }

    /// The top of book a [`OutputKind::TopOfBook`] record carries (`None` for other kinds).
    pub fn top_of_book(&self) -> Option<TopOfBook> {
        (self.kind == OutputKind::TopOfBook).then_some(TopOfBook {
            bid: self.price,
            bid_qty: u64::from(self.qty),
            ask: self.best_ask,
            ask_qty: u64::from(self.leaves_qty),
        })
    }
}

/// Output records per block of the chained output hash.
pub const OUTPUT_HASH_BLOCK_RECORDS: usize = 256;
/// Bytes a record takes in a block: its canonical bytes, zero-padded to a power of two so a
/// block is whole blake3 chunks (1 KiB).
const OUTPUT_HASH_RECORD_STRIDE_BYTES: usize = CANONICAL_OUTPUT_BYTES.next_power_of_two();
const OUTPUT_HASH_BLOCK_BYTES: usize = OUTPUT_HASH_BLOCK_RECORDS * OUTPUT_HASH_RECORD_STRIDE_BYTES;
/// Whole chunks, 16 of them: blake3 hashes the chunks of one call side by side (16 lanes
/// with AVX-512), where a block of a few partial chunks went one 64-byte compression at a
/// time — a fifth of the fused tier thread's time (docs/benchmarks/tier-layout.md).
const _: () = assert!(OUTPUT_HASH_BLOCK_BYTES == 16 * 1024);
/// Bytes of [`OutputHash::write_to`] at most: records, chain value, pending length, a block.
pub const OUTPUT_HASH_STATE_BYTES_MAX: usize = 8 + 32 + 4 + OUTPUT_HASH_BLOCK_BYTES;

/// A blake3 hash over the canonical bytes of an output stream, in order, chained per block of
/// [`OUTPUT_HASH_BLOCK_RECORDS`]: `chain = blake3_keyed(chain, block)` (the chain value is the
/// key, so the block alone is hashed, in whole chunks), and the digest hashes the unfinished
/// block the same way.
///
/// Why chained and not one streaming hasher: a snapshot must carry the hash so a recovered
/// shard continues it, and a hasher's internal state cannot be saved; a 32-byte chain value
/// plus the bytes of the unfinished block can ([`OutputHash::write_to`]). Blocks are cut by
/// record count, never by snapshot, so a run with snapshots hashes exactly like one without.
#[derive(Clone)]
pub struct OutputHash {
    chain: [u8; 32],
    block: [u8; OUTPUT_HASH_BLOCK_BYTES],
    block_len: usize,
    records: u64,
}

impl Default for OutputHash {
    fn default() -> Self {
        OutputHash { chain: [0; 32], block: [0; OUTPUT_HASH_BLOCK_BYTES], block_len: 0, records: 0 }
    }
}

impl OutputHash {
    /// Adds one record.
    pub fn update(&mut self, output: &CoreOutput) {
        let start = self.block_len;
        let record = &mut self.block[start..start + CANONICAL_OUTPUT_BYTES];
        output.write_canonical(record.try_into().expect("a record's span"));
        // The padding after each record is never written, so it stays zero (a restored
        // state brings back the zeros it saved).
        self.block_len = start + OUTPUT_HASH_RECORD_STRIDE_BYTES;
        self.records += 1;
        if self.block_len == OUTPUT_HASH_BLOCK_BYTES {
            self.chain = self.chained(&self.block);
            self.block_len = 0;
        }
    }

    fn chained(&self, block: &[u8]) -> [u8; 32] {
        *blake3::keyed_hash(&self.chain, block).as_bytes()
    }

    /// Records hashed so far.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// The hash so far.
    pub fn digest(&self) -> [u8; 32] {
        self.chained(&self.block[..self.block_len])
    }

    /// The hash so far, as hex.
    pub fn hex(&self) -> String {
        self.digest().iter().map(|byte| format!("{byte:02x}")).collect()
    }

    /// Appends the hash's state (records, chain value, unfinished block) to `out`.
    pub fn write_to(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.records.to_le_bytes());
        out.extend_from_slice(&self.chain);
        out.extend_from_slice(&(self.block_len as u32).to_le_bytes());
        out.extend_from_slice(&self.block[..self.block_len]);
    }

    /// Reads a state written by [`OutputHash::write_to`] from the front of `bytes`; returns
    /// it and the bytes after it.
    pub fn read_from(bytes: &[u8]) -> Result<(OutputHash, &[u8]), String> {
        const FIXED_BYTES: usize = 8 + 32 + 4;
        let fixed = bytes.get(..FIXED_BYTES).ok_or("output hash state is truncated")?;
        let records = u64::from_le_bytes(fixed[..8].try_into().expect("8 bytes"));
        let block_len = u32::from_le_bytes(fixed[40..44].try_into().expect("4 bytes")) as usize;
        let consistent = block_len < OUTPUT_HASH_BLOCK_BYTES
            && block_len
                == (records % OUTPUT_HASH_BLOCK_RECORDS as u64) as usize
                    * OUTPUT_HASH_RECORD_STRIDE_BYTES;
        if !consistent {
            return Err(format!("output hash block of {block_len} bytes after {records} records"));
        }
        let rest = &bytes[FIXED_BYTES..];
        let block_bytes = rest.get(..block_len).ok_or("output hash block is truncated")?;
        let mut hash = OutputHash { records, block_len, ..OutputHash::default() };
        hash.chain.copy_from_slice(&fixed[8..40]);
        hash.block[..block_len].copy_from_slice(block_bytes);
        Ok((hash, &rest[block_len..]))
    }
}

/// Who a response goes to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Audience {
    /// An execution report for one client.
    #[default]
    Client,
    /// Market data for everyone subscribed to the instrument's topic.
    MarketData,
}

/// A response ready for delivery by an R-Sender to one of the tier's outlets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Response {
    /// A client's report or market data.
    pub audience: Audience,
    /// The outlet (subscriber slot) it is routed to.
    pub outlet: u32,
    /// True for the first response to a request (the one whose latency is measured).
    pub answers_request: bool,
    /// The core's record.
    pub output: CoreOutput,
}
/// The best bid and offer of a book, with the total quantity at each (zeros for an empty side).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TopOfBook {
    /// Best bid price (0: no bid).
    pub bid: Price,
    /// Open quantity at the best bid.
    pub bid_qty: u64,
    /// Best ask price (0: no ask).
    pub ask: Price,
    /// Open quantity at the best ask.
    pub ask_qty: u64,
}

/// Convenience: `u64` quantities on a level as a `Qty` for reports (a level may exceed `Qty`
/// in total, so the report saturates).
pub fn saturate_qty(qty: u64) -> Qty {
    Qty::try_from(qty).unwrap_or(Qty::MAX)
}
