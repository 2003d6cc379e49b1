//! A FIX client's persistent session state: sequence numbers and every message sent, in an
//! append-only file per session so a restarted server resends what a client missed; and the
//! client's orders (ClOrdID ↔ tier order), from which execution reports get their FIX fields.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

use crate::credentials::Credential;
use crate::fix::{self, Builder, Message, tag};
// Where the load client (`crate::load`) looks for it; public as `gateway::fix::unix_ns`.
pub(crate) use crate::fix::unix_ns;
use crate::link::Link;
use crate::native::reason_name;
use crate::native::{Event, event_kind};
use crate::settings::Settings;
use crate::store::{FixRecovered, Log, UNKEPT_SEQ_RESERVE, kind};
use exchange::instruments::InstrumentTable;

/// Longest ClOrdID accepted (FIX leaves it open; real ones are short).
pub const CL_ORD_ID_BYTES_MAX: usize = 32;

/// One FIX session's part of the gateway store ([`crate::store`]): its sequence numbers and
/// where each message it sent is, for resends.
pub struct Store {
    log: Rc<RefCell<Log>>,
    client: u32,
    /// (MsgSeqNum, payload offset, length) of every stored message, in order.
    index: Vec<(u64, u64, u32)>,
    pub next_out: u64,
    pub next_in: u64,
    /// The `next_in` last put in the store.
    saved_next_in: u64,
    /// Outbound MsgSeqNums below this are covered by the store (kept there, or reserved by a
    /// [`kind::FIX_NEXT_OUT`] record) so a restart never numbers a message twice.
    reserved_out: u64,
}

impl Store {
    /// The session's view of `log`, resuming where `past` (what the store held) left off.
    pub fn open(log: Rc<RefCell<Log>>, client: u32, past: FixRecovered) -> Store {
        let kept_next = past.index.last().map_or(1, |&(seq, _, _)| seq + 1);
        let next_out = kept_next.max(past.next_out_reserved);
        let next_in = past.next_in.max(1);
        let index = past.index;
        let saved_next_in = next_in;
        Store { log, client, index, next_out, next_in, saved_next_in, reserved_out: next_out }
    }

    /// Appends a sent message to the store's batch (on disk at the next commit, before the
    /// message reaches the socket).
    pub fn append(&mut self, seq: u64, bytes: &[u8]) {
        let parts: [&[u8]; 2] = [&seq.to_le_bytes(), bytes];
        let offset = self.log.borrow_mut().append(kind::FIX_SENT, self.client, &parts);
        self.index.push((seq, offset + 8, bytes.len() as u32));
        self.reserved_out = self.reserved_out.max(seq + 1);
    }

    /// Brings the reservation down to what was used (a stopping server: its successor numbers
    /// on without a skip).
    pub fn settle(&mut self) {
        if self.next_out < self.reserved_out {
            self.reserved_out = self.next_out;
            let bytes = self.next_out.to_le_bytes();
            self.log.borrow_mut().append(kind::FIX_NEXT_OUT, self.client, &[&bytes]);
        }
    }

    /// Covers `seq`, used by a message the store does not keep: a [`kind::FIX_NEXT_OUT`]
    /// record reserves [`UNKEPT_SEQ_RESERVE`] numbers at a time, in the batch the message is
    /// held for (it reaches the socket only once the reservation is on disk).
    pub fn reserve(&mut self, seq: u64) {
        if seq >= self.reserved_out {
            self.reserved_out = seq + UNKEPT_SEQ_RESERVE;
            let bytes = self.reserved_out.to_le_bytes();
            self.log.borrow_mut().append(kind::FIX_NEXT_OUT, self.client, &[&bytes]);
        }
    }

    /// Holds bytes for the session's link until the store's next commit is durable.
    pub fn hold(&self, link: &Rc<Link>, bytes: &[u8], limit: usize) {
        self.log.borrow_mut().hold(link, bytes, limit);
    }

    /// Puts the next expected inbound sequence number in the store's batch, if it changed.
    pub fn save_next_in(&mut self) {
        if self.next_in != self.saved_next_in {
            let bytes = self.next_in.to_le_bytes();
            self.log.borrow_mut().append(kind::FIX_NEXT_IN, self.client, &[&bytes]);
            self.saved_next_in = self.next_in;
        }
    }

    /// Forgets everything (ResetSeqNumFlag): both sequence numbers back to 1.
    pub fn reset(&mut self) {
        self.log.borrow_mut().append(kind::FIX_RESET, self.client, &[]);
        self.index.clear();
        self.next_out = 1;
        self.next_in = 1;
        self.saved_next_in = 1;
        self.reserved_out = 1;
    }

    /// Where the session's kept messages are after the store was compacted (older ones are
    /// gone: a resend gap-fills them).
    pub fn replace_index(&mut self, index: crate::store::FixIndex) {
        self.index = index;
    }

    /// The stored messages with MsgSeqNum in `begin..=end`, at most `max` of them.
    pub fn range(&self, begin: u64, end: u64, max: usize) -> std::io::Result<Vec<(u64, Vec<u8>)>> {
        let log = self.log.borrow();
        let first = self.index.partition_point(|m| m.0 < begin);
        self.index[first..]
            .iter()
            .take_while(|m| m.0 <= end)
            .take(max)
            .map(|&(seq, offset, len)| Ok((seq, log.read_at(offset, len as usize)?)))
            .collect()
    }
}

/// A ClOrdID, inline.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct ClOrdId {
    bytes: [u8; CL_ORD_ID_BYTES_MAX],
    len: u8,
}

impl ClOrdId {
    pub fn new(value: &[u8]) -> Option<ClOrdId> {
        let mut id = ClOrdId::default();
        id.bytes.get_mut(..value.len())?.copy_from_slice(value);
        id.len = value.len() as u8;
        Some(id)
    }
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

/// A pending cancel or replace of an order.
#[derive(Clone, Copy, Default)]
pub enum Pending {
    #[default]
    None,
    Cancel(ClOrdId),
    Replace {
        cl_ord_id: ClOrdId,
        order_qty: u32,
        price: i64,
    },
}

/// What a FIX execution report needs that the tier does not carry.
#[derive(Clone, Copy, Default)]
pub struct Order {
    pub cl_ord_id: ClOrdId,
    pub orig_cl_ord_id: Option<ClOrdId>,
    pub pending: Pending,
    /// FIX Side ('1' buy, '2' sell).
    pub side: u8,
    pub order_qty: u32,
    pub price: i64,
    pub instrument: u32,
    pub cum_qty: u32,
    /// Σ price × qty of the fills, for AvgPx.
    pub notional: i128,
}

/// One FIX client's state.
/// ClOrdIDs of ended orders a FIX session keeps refusing (the newest, per session).
pub const ENDED_CL_ORD_IDS_MAX: usize = 1 << 14;

/// The ClOrdIDs of a session's newest ended orders, oldest out first: a NewOrderSingle under
/// one of them is refused as a duplicate (a FIX engine's resend after a restart is never
/// booked again). Rebuilt from the stored reports at start; a ResetSeqNumFlag logon (a new
/// FIX session) forgets them.
#[derive(Default)]
pub struct EndedClOrdIds {
    oldest_first: std::collections::VecDeque<ClOrdId>,
    kept: std::collections::HashSet<ClOrdId>,
}

impl EndedClOrdIds {
    /// Keeps `cl_ord_id`, forgetting the oldest past [`ENDED_CL_ORD_IDS_MAX`].
    pub fn push(&mut self, cl_ord_id: ClOrdId) {
        if !self.kept.insert(cl_ord_id) {
            return;
        }
        self.oldest_first.push_back(cl_ord_id);
        if self.oldest_first.len() > ENDED_CL_ORD_IDS_MAX
            && let Some(oldest) = self.oldest_first.pop_front()
        {
            self.kept.remove(&oldest);
        }
    }

    /// Whether `cl_ord_id` named an order that ended.
    pub fn contains(&self, cl_ord_id: &ClOrdId) -> bool {
        self.kept.contains(cl_ord_id)
    }

    /// Forgets every kept ClOrdID (a new FIX session).
    pub fn clear(&mut self) {
        self.oldest_first.clear();
        self.kept.clear();
    }
}

pub struct FixState {
    store: Store,
    comp_id: String,
    our_comp_id: String,
    /// ClOrdID → token of every order of this server run.
    tokens: HashMap<ClOrdId, u32>,
    /// ClOrdIDs of the session's newest ended orders.
    ended: EndedClOrdIds,
    orders: HashMap<u32, Order>,
    next_token: u32,
    builder: Builder,
    /// Symbols and the price scale of Symbol (55), Price (44), LastPx (31) and AvgPx (6).
    instruments: Arc<InstrumentTable>,
}

impl FixState {
    pub fn open(
        settings: &Settings,
        credential: &Credential,
        log: Rc<RefCell<Log>>,
        past: FixRecovered,
    ) -> FixState {
        let next_token = past.order_id_max + 1;
        let mut state = FixState {
            store: Store::open(log, credential.client, past),
            comp_id: credential.comp_id.clone(),
            our_comp_id: settings.fix_comp_id.clone(),
            tokens: HashMap::with_capacity(settings.open_orders_max),
            ended: EndedClOrdIds::default(),
            orders: HashMap::with_capacity(settings.open_orders_max),
            next_token,
            builder: Builder::default(),
            instruments: settings.instruments.clone(),
        };
        state.rebuild_orders();
        state
    }

    /// The client's CompID (its SenderCompID).
    pub fn comp_id(&self) -> &str {
        &self.comp_id
    }

    /// This acceptor's CompID.
    pub fn our_comp_id(&self) -> &str {
        &self.our_comp_id
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn store_mut(&mut self) -> &mut Store {
        &mut self.store
    }

    /// ResetSeqNumFlag: the session starts again at 1 both ways, its ended ClOrdIDs forgotten.
    pub fn reset_session(&mut self) {
        self.store.reset();
        self.ended.clear();
    }

    /// Forgets the session's orders (the tier's books were not recovered).
    pub fn forget_orders(&mut self) {
        self.tokens.clear();
        self.orders.clear();
    }

    /// Holds a message built outside the session's numbering (a resend, a gap fill) for
    /// `link` until the store has it: `build` gets the builder and this acceptor's and the
    /// client's CompIDs.
    pub fn hold_rebuilt(
        &mut self,
        link: &Rc<Link>,
        limit: usize,
        build: impl FnOnce(&mut Builder, &[u8], &[u8]),
    ) {
        build(&mut self.builder, self.our_comp_id.as_bytes(), self.comp_id.as_bytes());
        self.store.hold(link, self.builder.finish(), limit);
    }

    /// A fresh order token (never 0).
    pub fn take_token(&mut self) -> u32 {
        let token = self.next_token;
        self.next_token = self.next_token.wrapping_add(1).max(1);
        token
    }

    /// Tracks a new order under `token`: whether its ClOrdID was free (neither a live
    /// order's nor an ended one's) and now names it.
    pub fn open_order(&mut self, token: u32, order: Order) -> bool {
        self.orders.insert(token, order);
        let id = order.cl_ord_id;
        if self.tokens.contains_key(&id) || self.ended.contains(&id) {
            return false;
        }
        self.tokens.insert(id, token);
        true
    }

    /// The token of the live order a ClOrdID names.
    pub fn token_of(&self, cl_ord_id: &ClOrdId) -> Option<u32> {
        self.tokens.get(cl_ord_id).copied()
    }

    /// The order of `token` (one a live ClOrdID names).
    pub fn order_mut(&mut self, token: u32) -> &mut Order {
        self.orders.get_mut(&token).expect("every mapped ClOrdID has an order")
    }

    /// Rebuilds the session's open orders (ClOrdID ↔ order, quantities, fills) from the
    /// ExecutionReports in the store, so a client can cancel or replace after a restart an
    /// order the recovered books still hold.
    fn rebuild_orders(&mut self) {
        for at in 0..self.store.index.len() {
            let (_, offset, len) = self.store.index[at];
            let bytes = match self.store.log.borrow().read_at(offset, len as usize) {
                Ok(bytes) => bytes,
                Err(error) => {
                    tracing::error!(comp_id = %self.comp_id, %error, "FIX store: reading a report to rebuild orders failed");
                    return;
                }
            };
            if let Ok(message) = Message::parse(&bytes)
                && message.msg_type() == b"8"
            {
                self.rebuild_one(&message);
            }
        }
    }

    fn rebuild_one(&mut self, report: &Message) {
        let number = |t| report.get(t).and_then(fix::parse_whole);
        let small = |t| number(t).and_then(|n| u32::try_from(n).ok());
        let text = |t| report.get(t).and_then(|v| std::str::from_utf8(v).ok());
        let table = self.instruments.clone();
        let price = |t| text(t).and_then(|v| table.price_units(v).ok());
        let Some(token) = small(tag::ORDER_ID) else { return };
        let cl_ord_id = report.get(tag::CL_ORD_ID).and_then(ClOrdId::new);
        match (report.get(tag::EXEC_TYPE), cl_ord_id) {
            (Some(b"0"), Some(cl_ord_id)) => {
                let order = Order {
                    cl_ord_id,
                    side: report.get(tag::SIDE).and_then(|s| s.first().copied()).unwrap_or(b'1'),
                    order_qty: small(tag::ORDER_QTY).unwrap_or(0),
                    price: price(tag::PRICE).unwrap_or(0),
                    instrument: text(tag::SYMBOL).and_then(|s| table.id_of(s)).unwrap_or(0),
                    ..Order::default()
                };
                self.orders.insert(token, order);
                self.tokens.insert(cl_ord_id, token);
            }
            (Some(b"F"), _) => {
                if let Some(order) = self.orders.get_mut(&token) {
                    order.cum_qty = small(tag::CUM_QTY).unwrap_or(order.cum_qty);
                    let fill =
                        price(tag::LAST_PX).unwrap_or(0) * number(tag::LAST_QTY).unwrap_or(0);
                    order.notional += i128::from(fill);
                }
            }
            (Some(b"5"), Some(cl_ord_id)) => {
                if let Some(order) = self.orders.get_mut(&token) {
                    let old = std::mem::replace(&mut order.cl_ord_id, cl_ord_id);
                    order.orig_cl_ord_id = Some(old);
                    order.order_qty = small(tag::ORDER_QTY).unwrap_or(order.order_qty);
                    order.price = price(tag::PRICE).unwrap_or(order.price);
                    self.forget(Some(old), token);
                    self.tokens.insert(cl_ord_id, token);
                }
            }
            _ => {}
        }
        let closed = matches!(report.get(tag::EXEC_TYPE), Some(b"4" | b"8"));
        if (closed || small(tag::LEAVES_QTY) == Some(0))
            && let Some(order) = self.orders.remove(&token)
        {
            self.end(&order, token);
        }
    }

    /// Sends an application or session message: numbers it, stores it, holds it on the live
    /// link if any (sent once stored). `body` adds the fields after the standard header.
    pub fn send(
        &mut self,
        msg_type: &[u8],
        link: Option<&Rc<Link>>,
        limit: usize,
        body: impl FnOnce(&mut Builder),
    ) {
        let seq = self.store.next_out;
        self.store.next_out += 1;
        let now = fix::utc_timestamp(unix_ns());
        let builder = &mut self.builder;
        builder
            .begin(msg_type, self.our_comp_id.as_bytes(), self.comp_id.as_bytes(), seq)
            .field(tag::SENDING_TIME, &now);
        body(builder);
        let bytes = builder.finish();
        // Session messages are not kept: a resend answers them with a gap fill anyway, so a
        // chatty peer's heartbeats and test requests cost the disk nothing per message.
        if fix::is_session_type(msg_type) {
            self.store.reserve(seq);
        } else {
            self.store.append(seq, bytes);
        }
        if let Some(link) = link {
            self.store.hold(link, bytes, limit);
        }
    }

    /// Turns an engine event into an ExecutionReport (or an OrderCancelReject) and sends it,
    /// its ExecID from `exec_id`.
    pub fn report(
        &mut self,
        event: &Event,
        exec_id: ExecId,
        link: Option<&Rc<Link>>,
        limit: usize,
    ) {
        let Some(mut order) = self.orders.get(&event.token).copied() else { return };
        if event.kind == event_kind::REJECTED && !matches!(order.pending, Pending::None) {
            order.pending = Pending::None;
            self.orders.insert(event.token, order);
            let reason = u32::from(event.reason);
            return self.cancel_reject(event.token, &order, reason, link, limit);
        }
        let exec_type = apply(&mut order, event);
        self.orders.insert(event.token, order);
        let mut text = [0u8; EXEC_ID_BYTES_MAX];
        let exec_id = exec_id.text(self.store.next_out, &mut text);
        let instruments = self.instruments.clone();
        self.send(b"8", link, limit, |b| {
            execution_report(b, event, &order, exec_type, exec_id, &instruments)
        });
        if exec_type == b'5' {
            self.forget(order.orig_cl_ord_id, event.token);
            self.tokens.insert(order.cl_ord_id, event.token);
        }
        let done = exec_type == b'F' && order.cum_qty == order.order_qty;
        if matches!(exec_type, b'4' | b'8') || done {
            self.end(&order, event.token);
            self.orders.remove(&event.token);
        }
    }

    /// `order` (of `token`) ended: its ClOrdIDs stop naming it and are kept as ended.
    fn end(&mut self, order: &Order, token: u32) {
        for cl_ord_id in [Some(order.cl_ord_id), order.orig_cl_ord_id].into_iter().flatten() {
            self.forget(Some(cl_ord_id), token);
            self.ended.push(cl_ord_id);
        }
    }

    /// Drops a ClOrdID's mapping if it still names `token` (a refused duplicate ClOrdID must
    /// not unmap the live order that owns it).
    fn forget(&mut self, cl_ord_id: Option<ClOrdId>, token: u32) {
        if let Some(cl_ord_id) = cl_ord_id
            && self.tokens.get(&cl_ord_id) == Some(&token)
        {
            self.tokens.remove(&cl_ord_id);
        }
    }

    /// OrderCancelReject (9) for a pending cancel or replace.
    pub fn cancel_reject(
        &mut self,
        token: u32,
        order: &Order,
        reason: u32,
        link: Option<&Rc<Link>>,
        limit: usize,
    ) {
        let (cl_ord_id, response_to) = match order.pending {
            Pending::Replace { cl_ord_id, .. } => (cl_ord_id, b"2"),
            Pending::Cancel(cl_ord_id) => (cl_ord_id, b"1"),
            Pending::None => (order.cl_ord_id, b"1"),
        };
        let status = if order.cum_qty > 0 { b"1" } else { b"0" };
        self.send(b"9", link, limit, |b| {
            b.int(tag::ORDER_ID, i64::from(token))
                .field(tag::CL_ORD_ID, cl_ord_id.as_bytes())
                .field(tag::ORIG_CL_ORD_ID, order.cl_ord_id.as_bytes())
                .field(tag::ORD_STATUS, status)
                .field(tag::CXL_REJ_RESPONSE_TO, response_to)
                .int(tag::CXL_REJ_REASON, if reason == 16 { 1 } else { 99 })
                .field(tag::TEXT, reason_name(reason as u8).as_bytes());
        });
    }
}

/// Applies an event to the order; returns the ExecType.
fn apply(order: &mut Order, event: &Event) -> u8 {
    match event.kind {
        event_kind::ACCEPTED => b'0',
        event_kind::PARTIALLY_FILLED | event_kind::FILLED => {
            order.cum_qty += event.qty;
            order.notional += i128::from(event.price) * i128::from(event.qty);
            b'F'
        }
        event_kind::CANCELLED => {
            if let Pending::Cancel(cl_ord_id) = order.pending {
                order.orig_cl_ord_id = Some(order.cl_ord_id);
                order.cl_ord_id = cl_ord_id;
            }
            order.pending = Pending::None;
            b'4'
        }
        event_kind::REPLACED => {
            if let Pending::Replace { cl_ord_id, order_qty, price } = order.pending {
                order.orig_cl_ord_id = Some(order.cl_ord_id);
                order.cl_ord_id = cl_ord_id;
                order.order_qty = order_qty;
                order.price = price;
            }
            order.pending = Pending::None;
            b'5'
        }
        _ => b'8',
    }
}

/// Most bytes of an ExecID's text (`{shard}-{input}-{index}` at their widest).
const EXEC_ID_BYTES_MAX: usize = 10 + 1 + 20 + 1 + 10;

/// Where an ExecutionReport's ExecID (tag 17) comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExecId {
    /// A report of the engine: its core shard, the input that caused it and its place among
    /// that input's reports to this gateway. The same whoever routes it and however often (a
    /// report routed again after a restart is a true duplicate, which a FIX engine drops by
    /// its ExecID), and the same on every engine of a replicated group.
    Engine {
        /// The core shard.
        shard: u32,
        /// The core input sequence that caused it.
        input_seq: u64,
        /// Its place among that input's reports routed to this gateway, from 0.
        index: u32,
    },
    /// A report the session made itself (a refusal before the engine): the session's output
    /// sequence number, digits only, so it never equals an engine's.
    Session,
}

impl ExecId {
    /// The ExecID's text in `buffer` (no allocation), `session_seq` for [`ExecId::Session`].
    pub fn text(self, session_seq: u64, buffer: &mut [u8]) -> &[u8] {
        use std::io::Write;
        let mut cursor = std::io::Cursor::new(&mut *buffer);
        let written = match self {
            ExecId::Engine { shard, input_seq, index } => {
                write!(cursor, "{shard}-{input_seq}-{index}")
            }
            ExecId::Session => write!(cursor, "{session_seq}"),
        };
        written.expect("an ExecID fits EXEC_ID_BYTES_MAX");
        let end = cursor.position() as usize;
        &buffer[..end]
    }
}

fn execution_report(
    b: &mut Builder,
    event: &Event,
    order: &Order,
    exec_type: u8,
    exec_id: &[u8],
    instruments: &InstrumentTable,
) {
    let decimals = instruments.price_decimals();
    let leaves = if matches!(exec_type, b'4' | b'8') { 0 } else { event.leaves_qty };
    let status: &[u8] = match exec_type {
        b'8' => b"8",
        b'4' => b"4",
        _ if order.cum_qty == order.order_qty && order.cum_qty > 0 => b"2",
        _ if order.cum_qty > 0 => b"1",
        _ => b"0",
    };
    b.int(tag::ORDER_ID, i64::from(event.token)).field(tag::CL_ORD_ID, order.cl_ord_id.as_bytes());
    if let Some(orig) = order.orig_cl_ord_id.filter(|_| matches!(exec_type, b'4' | b'5')) {
        b.field(tag::ORIG_CL_ORD_ID, orig.as_bytes());
    }
    b.field(tag::EXEC_ID, exec_id)
        .field(tag::EXEC_TYPE, &[exec_type])
        .field(tag::ORD_STATUS, status)
        .field(tag::SIDE, &[order.side])
        .int(tag::ORDER_QTY, i64::from(order.order_qty))
        .decimal(tag::PRICE, order.price, decimals)
        .int(tag::LEAVES_QTY, i64::from(leaves))
        .int(tag::CUM_QTY, i64::from(order.cum_qty));
    put_avg_px(b, order, instruments);
    match instruments.symbol_of(order.instrument) {
        Some(symbol) => b.field(tag::SYMBOL, symbol.as_bytes()),
        None => b.int(tag::SYMBOL, i64::from(order.instrument)),
    };
    if exec_type == b'F' {
        b.int(tag::LAST_QTY, i64::from(event.qty)).decimal(tag::LAST_PX, event.price, decimals);
    }
    if exec_type == b'8' {
        let ord_rej_reason = match event.reason {
            6 => 1,  // unknown symbol
            9 => 2,  // exchange closed (halted)
            17 => 6, // duplicate order
            _ => 99,
        };
        let text = reason_name(event.reason);
        b.int(tag::ORD_REJ_REASON, ord_rej_reason).field(tag::TEXT, text.as_bytes());
    }
    // A cancel the client did not ask for says why (IOC remainder, FOK, cancel-on-disconnect).
    let unasked = event.reason != exchange::msg::Reason::CancelRequested as u8;
    if exec_type == b'4' && unasked {
        b.field(tag::TEXT, reason_name(event.reason).as_bytes());
    }
}

/// AvgPx, to [`AVG_PX_EXTRA_DECIMALS`] decimals beyond the price unit's (an average need not
/// fall on a tick).
fn put_avg_px(b: &mut Builder, order: &Order, instruments: &InstrumentTable) {
    let scale = 10i128.pow(AVG_PX_EXTRA_DECIMALS);
    let average = match order.cum_qty {
        0 => 0,
        filled => order.notional * scale / i128::from(filled),
    };
    let average = i64::try_from(average).unwrap_or(i64::MAX);
    b.decimal(tag::AVG_PX, average, instruments.price_decimals() + AVG_PX_EXTRA_DECIMALS);
}

/// Decimal places AvgPx carries beyond the price unit's.
const AVG_PX_EXTRA_DECIMALS: u32 = 4;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exec_id_reads_as_shard_input_and_index_or_the_session_number() {
        let mut buffer = [0u8; 48];
        let engine = ExecId::Engine { shard: 2, input_seq: 901, index: 1 };
        assert_eq!(engine.text(7, &mut buffer), b"2-901-1");
        assert_eq!(ExecId::Session.text(7, &mut buffer), b"7");
    }
}
