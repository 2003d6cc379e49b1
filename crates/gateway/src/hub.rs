//! The gateway's shared state on its I/O thread: every client's session state, the tier's
//! order input, and the router that turns the tier's execution reports into each client's
//! protocol and hands them to its connection's bounded outbox.
//!
//! Everything here lives on one thread (a tokio current-thread runtime with a `LocalSet`), so
//! sessions share it through `Rc<RefCell<_>>` without locks.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::time::{Duration, Instant};

use exchange::msg::{ClientId, CoreOutput, InboundOrder, OrderId, OutputKind, REASON_COUNT};
use pipeline::metrics::now_ns;
use stats::LatencyHistogram;

use crate::credentials::{Credential, Protocol, Verifier};
use crate::fix_session::{ExecId, FixState};
use crate::link::{Cut, Link};
use crate::metrics::{Counters, LayoutInfo, Snapshot, StageMetrics, StoreCounts};
use crate::native::{self, Event, ServerMsg, event_kind, gateway_reason};
use crate::settings::Settings;
use crate::store::{self, Log, StoreError, track_open};

/// The tier order id of a client's order number: `client << 32 | token`, so a report names
/// its owner and the client's own order number without any lookup.
pub fn order_id(client: ClientId, token: u32) -> OrderId {
    (u64::from(client) << 32) | u64::from(token)
}

/// The client order number inside a tier order id.
pub fn token_of(order_id: OrderId) -> u32 {
    order_id as u32
}

/// Where admitted requests go without waiting: the I/O loop's staging buffer, which the tier
/// takes at the end of each turn (a full one answers "busy").
pub trait OrderEntry {
    /// Hands `request` to the tier now, or refuses it as [`Refused::Busy`] (no room).
    fn try_submit(&mut self, request: InboundOrder) -> Result<(), Refused>;

    /// Requests the entry takes between two of the loop's turns: the room the sessions share
    /// ([`Hub::submit`] gives each live session an equal part of it per turn).
    fn room_per_turn(&self) -> usize;
}

/// Refusals within a second below which a session is never cut for its rate (a burst over a
/// low throttle is answered, not punished).
pub const THROTTLE_BREACH_REFUSALS_MIN: f64 = 1_000.0;

/// Token bucket over one second, counting what it refuses per second.
struct Throttle {
    capacity: f64,
    tokens: f64,
    refilled: Instant,
    /// Refusals since `window`, which restarts every second.
    refused: f64,
    window: Instant,
}

impl Throttle {
    fn new(per_s: u32) -> Throttle {
        let capacity = f64::from(per_s);
        let now = Instant::now();
        Throttle { capacity, tokens: capacity, refilled: now, refused: 0.0, window: now }
    }

    fn admit(&mut self, now: Instant) -> bool {
        let elapsed = now.duration_since(self.refilled).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.capacity).min(self.capacity);
        self.refilled = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return true;
        }
        if now.duration_since(self.window) >= Duration::from_secs(1) {
            (self.refused, self.window) = (0.0, now);
        }
        self.refused += 1.0;
        false
    }

    /// Whether more than the rate itself (and at least [`THROTTLE_BREACH_REFUSALS_MIN`]) was
    /// refused within the current second: the sender goes over twice its rate, well past a
    /// burst.
    fn breached(&self) -> bool {
        self.refused > self.capacity.max(THROTTLE_BREACH_REFUSALS_MIN)
    }
}

/// One client's state; it outlives its connections.
pub struct Client {
    credential: Credential,
    counters: Counters,
    /// The live connection, if any.
    link: Option<Rc<Link>>,
    /// Bumped on every connect and disconnect (cancel-on-disconnect checks it).
    generation: u64,
    /// Native: sequenced events kept for replay, the oldest first.
    journal: VecDeque<Event>,
    /// Native: the sequence number of the next event.
    next_seq: u64,
    /// Native: sequence numbers below this are covered by the store (kept there, or reserved
    /// by a [`store::kind::NATIVE_RESERVED`] record), so a restart never numbers twice.
    reserved_seq: u64,
    /// Open orders (token → instrument), for cancel-on-disconnect.
    open: HashMap<u32, u32>,
    throttle: Throttle,
    fix: Option<FixState>,
    /// The turn of the requests counted in `staged_in_turn`.
    staged_turn: u64,
    /// Requests this client handed the entry in `staged_turn`.
    staged_in_turn: usize,
}

impl Client {
    pub fn credential(&self) -> &Credential {
        &self.credential
    }

    /// Its counters, for the sessions to count what they see.
    pub fn counters_mut(&mut self) -> &mut Counters {
        &mut self.counters
    }

    /// The live connection, if any.
    pub fn link(&self) -> Option<&Rc<Link>> {
        self.link.as_ref()
    }

    /// Bumped on every connect and disconnect (cancel-on-disconnect checks it).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// A FIX client's session state.
    pub fn fix_mut(&mut self) -> &mut FixState {
        self.fix.as_mut().expect("FIX client")
    }

    /// Native: the sequence number of the next event.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Sequence number of the oldest event still kept.
    pub fn first_kept_seq(&self) -> u64 {
        self.next_seq - self.journal.len() as u64
    }

    /// Native: the kept events from sequence number `from` on (at least
    /// [`Client::first_kept_seq`]), with their numbers.
    pub fn replay_from(&self, from: u64) -> impl Iterator<Item = (u64, Event)> + '_ {
        let first = self.first_kept_seq();
        let events = self.journal.iter().enumerate().skip((from - first) as usize);
        events.map(move |(offset, event)| (first + offset as u64, *event))
    }
}

/// How an append ended that a gateway without a tier gave up waiting on (its outcome was
/// unknown): what the input log told once it answered (`crate::remote`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// It is in the log: the engines answer its orders.
    LandedLate { orders: u64 },
    /// One of its orders, which the log does not hold: its client is answered with a reject.
    NotTaken(InboundOrder),
    /// The log can no longer tell (trimmed past it, or too far to search): no answer.
    Unknown { orders: u64 },
}

/// Why a request did not reach the tier.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    Throttled,
    Busy,
    /// The server is stopping (draining what it took).
    ShuttingDown,
}

impl Refused {
    pub fn reason(self) -> u8 {
        match self {
            Refused::Throttled => gateway_reason::THROTTLED,
            Refused::Busy => gateway_reason::BUSY,
            Refused::ShuttingDown => gateway_reason::SHUTTING_DOWN,
        }
    }
}

/// The shared state.
pub struct Hub {
    settings: Settings,
    clients: Vec<Client>,
    by_id: HashMap<u32, usize>,
    ingress: Box<dyn OrderEntry>,
    /// Reports for a client id not in the credentials (cannot happen unless the tier is
    /// fed from elsewhere); counted, never panics.
    unroutable: u64,
    /// Reused encoding buffer (no allocation on the routing path).
    scratch: Vec<u8>,
    /// Numbers each input's reports, for their FIX ExecIDs.
    exec_ids: ExecIds,
    /// The durable store every session's sequenced output goes through.
    log: Rc<RefCell<Log>>,
    /// Per-stage counters and latencies (the metrics listener prints them).
    stage: StageMetrics,
    /// Checks login secrets on a fixed pool of threads (shared by every session).
    verifier: Verifier,
    /// Set when the server stops: new requests are refused, those taken are answered.
    draining: bool,
    /// What the metrics listener's `/ready` says: set once the server serves, cleared when it
    /// drains (a draining server is alive but takes no new orders: a balancer must send it
    /// none).
    readiness: ops::Readiness,
    /// The tier's answers routed (one per request handed to it).
    answered: u64,
    /// Clients with a live connection: the entry's room per turn is shared among them.
    sessions_live: usize,
    /// The I/O loop's turn ([`Hub::next_turn`]): each live session's share renews with it.
    turn: u64,
}

/// A credential's session as the store recovered it: its FIX state, its native numbering (the
/// numbers reserved but not kept filled in as refusals), its replay journal and open orders.
fn restored_client(
    settings: &Settings,
    credential: Credential,
    log: &Rc<RefCell<Log>>,
    recovered: &mut store::Recovered,
) -> Client {
    let fix = match credential.protocol {
        Protocol::Fix => {
            let past = recovered.fix.remove(&credential.client).unwrap_or_default();
            Some(FixState::open(settings, &credential, log.clone(), past))
        }
        Protocol::Native => None,
    };
    let mut past = recovered.native.remove(&credential.client).unwrap_or_default();
    past.next_seq = past.next_seq.max(1);
    // Numbers reserved but not kept were skipped, or used by refusals now lost.
    past.fill_unkept(past.reserved, settings.replay_events_max);
    let mut journal = VecDeque::with_capacity(settings.replay_events_max);
    journal.extend(past.events);
    let mut open = HashMap::with_capacity(settings.open_orders_max);
    open.extend(recovered.open.remove(&credential.client).unwrap_or_default());
    Client {
        counters: Counters::default(),
        link: None,
        generation: 0,
        journal,
        next_seq: past.next_seq,
        reserved_seq: past.next_seq,
        open,
        throttle: Throttle::new(settings.throttle_msgs_per_s),
        fix,
        credential,
        staged_turn: 0,
        staged_in_turn: 0,
    }
}

impl Hub {
    pub fn new(
        settings: Settings,
        credentials: Vec<Credential>,
        ingress: Box<dyn OrderEntry>,
        verifier: Verifier,
    ) -> Result<Hub, StoreError> {
        let options = store::StoreOptions {
            sync: settings.store_sync,
            replay_events_max: settings.replay_events_max,
            bytes_max: settings.store_bytes_max,
            fix_resend_window: settings.fix_resend_window,
        };
        let (mut log, mut recovered) = Log::open(&settings.store_dir, options)?;
        let sessions = credentials.iter().map(|c| (c.client, c.protocol == Protocol::Fix));
        log.reserve_past_damage(&mut recovered, sessions);
        let log = Rc::new(RefCell::new(log));
        let mut clients = Vec::with_capacity(credentials.len());
        let mut by_id = HashMap::with_capacity(credentials.len());
        for credential in credentials {
            by_id.insert(credential.client, clients.len());
            clients.push(restored_client(&settings, credential, &log, &mut recovered));
        }
        let scratch = Vec::with_capacity(native::FRAME_BYTES_MAX);
        let stage = StageMetrics::default();
        let unroutable = 0;
        let (draining, answered) = (false, 0);
        Ok(Hub {
            settings,
            clients,
            by_id,
            ingress,
            unroutable,
            scratch,
            exec_ids: ExecIds::default(),
            log,
            stage,
            verifier,
            draining,
            readiness: ops::Readiness::default(),
            answered,
            sessions_live: 0,
            turn: 0,
        })
    }

    /// The session limits the server started with.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Client `at` (an index from [`Hub::client_index`] or a login).
    pub fn client(&self, at: usize) -> &Client {
        &self.clients[at]
    }

    pub fn client_mut(&mut self, at: usize) -> &mut Client {
        &mut self.clients[at]
    }

    /// The clients with open orders, each with its connection generation.
    pub fn with_open_orders(&self) -> Vec<(usize, u64)> {
        let clients = self.clients.iter().enumerate();
        clients.filter(|(_, c)| !c.open.is_empty()).map(|(at, c)| (at, c.generation)).collect()
    }

    /// The durable store every session's sequenced output goes through.
    pub fn log(&self) -> &RefCell<Log> {
        &self.log
    }

    /// The pool that checks login secrets.
    pub fn verifier(&self) -> &Verifier {
        &self.verifier
    }

    /// From now on new requests are refused ([`Refused::ShuttingDown`]); those taken are
    /// answered.
    pub fn start_draining(&mut self) {
        self.draining = true;
        self.readiness.set(false);
    }

    /// What `/ready` says (clones share it).
    pub fn readiness(&self) -> &ops::Readiness {
        &self.readiness
    }

    /// Requests handed to the tier, and how many of them it answered so far.
    pub fn taken_and_answered(&self) -> (u64, u64) {
        (self.stage.engine_in, self.answered)
    }

    /// The tier's thread layout, for the metrics page.
    pub fn set_layout(&mut self, layout: LayoutInfo) {
        self.stage.layout = Some(layout);
    }

    /// Reports waiting on the reply queues after a routing batch, for the metrics page.
    pub fn set_reply_depth(&mut self, depth: usize) {
        self.stage.egress_depth = depth;
    }

    /// The in-tier response times since the last call; a fresh histogram from now on.
    pub fn take_in_tier_latency(&mut self) -> LatencyHistogram {
        std::mem::take(&mut self.stage.in_tier)
    }

    /// Gives client `at` its new connection (its session is live: it takes a share of the
    /// entry's room).
    pub fn attach_link(&mut self, at: usize, link: Rc<Link>) {
        let client = &mut self.clients[at];
        if client.link.replace(link).is_none() {
            self.sessions_live += 1;
        }
        client.generation += 1;
    }

    /// Takes client `at`'s connection away (its share goes back to the other sessions).
    pub fn detach_link(&mut self, at: usize) {
        let client = &mut self.clients[at];
        if client.link.take().is_some() {
            self.sessions_live -= 1;
        }
        client.generation += 1;
    }

    /// The loop took what the sessions staged: every live session's share renews.
    pub fn next_turn(&mut self) {
        self.turn += 1;
    }

    /// Whether client `at` may stage one more request in this turn: each live session may
    /// take an equal part of the entry's room, so a flooding session meets "busy" while the
    /// others still find room (one session cannot hold what the others need).
    fn within_turn_share(&mut self, at: usize) -> bool {
        let share = (self.ingress.room_per_turn() / self.sessions_live.max(1)).max(1);
        let client = &mut self.clients[at];
        if client.staged_turn != self.turn {
            client.staged_turn = self.turn;
            client.staged_in_turn = 0;
        }
        if client.staged_in_turn >= share {
            return false;
        }
        client.staged_in_turn += 1;
        true
    }

    /// Forgets the open orders the store's reports listed (the tier's books were not
    /// recovered: those orders no longer exist).
    pub fn forget_open_orders(&mut self) {
        for client in &mut self.clients {
            client.open.clear();
            if let Some(fix) = client.fix.as_mut() {
                fix.forget_orders();
            }
        }
    }

    /// Ends a unit of work: writes the store's batch and releases what is durable.
    pub fn commit(&mut self) {
        self.log.borrow_mut().commit();
    }

    /// Compacts the store once it has passed its bound ([`store::Log::compact`]) and points
    /// each FIX session at where its kept messages now are. A failure is logged and the old
    /// file kept: the store is then only larger than its bound.
    pub fn compact_store_if_due(&mut self) {
        let compacted = {
            let mut log = self.log.borrow_mut();
            if !log.compaction_due() {
                return;
            }
            log.compact()
        };
        let mut indices = match compacted {
            Ok(indices) => indices,
            Err(error) => {
                tracing::error!(%error, "gateway store: compaction failed");
                return;
            }
        };
        for client in &mut self.clients {
            if let Some(fix) = client.fix.as_mut() {
                let index = indices.remove(&client.credential.client).unwrap_or_default();
                fix.store_mut().replace_index(index);
            }
        }
    }

    /// A copy of what the metrics page shows (no formatting: the page renders elsewhere).
    pub fn metrics_snapshot(&self) -> Snapshot {
        let log = self.log.borrow();
        let store = StoreCounts {
            commits: log.commits,
            bytes_written: log.bytes_written,
            already_routed: log.routed.dropped,
            failed: log.has_failed(),
            damaged_bytes: log.damaged_bytes,
            writes_refused: log.writes_refused,
        };
        let clients = self.clients.iter().map(|c| (c.credential.client, &c.counters));
        let per_client = self.settings.metrics_per_client;
        Snapshot::new(clients, per_client, &self.stage, self.unroutable, store)
    }

    pub fn client_index(&self, client: u32) -> Option<usize> {
        self.by_id.get(&client).copied()
    }

    pub fn fix_client_index(&self, comp_id: &[u8]) -> Option<usize> {
        self.clients.iter().position(|c| {
            c.credential.protocol == Protocol::Fix && c.credential.comp_id.as_bytes() == comp_id
        })
    }

    /// Whether a session-level request that makes the server work (a FIX TestRequest or
    /// ResendRequest) is within the client's throttle: such requests draw on the same
    /// budget as orders, so a session cannot make the server write without bound.
    pub fn admit_session_message(&mut self, at: usize) -> bool {
        let client = &mut self.clients[at];
        let admitted = client.throttle.admit(Instant::now());
        if !admitted {
            client.counters.throttled += 1;
        }
        admitted
    }

    /// Throttles, then hands a request to the tier without waiting.
    pub fn submit(&mut self, at: usize, mut request: InboundOrder) -> Result<(), Refused> {
        // The arrival time: the server-side order→report latency is measured from here.
        request.stamps.intended_ns = now_ns();
        let client = &mut self.clients[at];
        client.counters.orders_in += 1;
        if !client.throttle.admit(Instant::now()) {
            client.counters.throttled += 1;
            if client.throttle.breached()
                && let Some(link) = &client.link
            {
                link.end(Cut::ThrottleBreach);
            }
            return Err(Refused::Throttled);
        }
        if self.draining {
            return Err(Refused::ShuttingDown);
        }
        let opens = request.kind == exchange::msg::request_kind::NEW;
        if opens && client.open.len() >= self.settings.open_orders_max {
            client.counters.busy += 1;
            return Err(Refused::Busy);
        }
        if !self.within_turn_share(at) {
            self.clients[at].counters.busy += 1;
            return Err(Refused::Busy);
        }
        match self.ingress.try_submit(request) {
            Ok(()) => {
                self.stage.engine_in += 1;
                Ok(())
            }
            Err(refused) => {
                self.clients[at].counters.busy += 1;
                Err(refused)
            }
        }
    }

    /// Routes one of the tier's reports to its client, in its protocol. Its store record
    /// waits for the tier's journal to cover the input that caused it (where the store's
    /// syncer took over the reply hold, see [`crate::store::Log::wait_for_journals`]).
    pub fn route(&mut self, output: &CoreOutput) {
        if !self.log.borrow_mut().routed.admit(output) {
            return; // routed before this gateway restarted (`crate::routed`)
        }
        self.stage.on_report(output, now_ns());
        if output.answers_request() {
            self.answered += 1;
        }
        self.log.borrow_mut().require(output.shard, output.seq);
        let Some(at) = self.client_index(output.client) else {
            self.unroutable += 1;
            return;
        };
        let event = event_of(output);
        let exec_id = self.exec_ids.of(output);
        self.deliver(at, &event, exec_id);
    }

    /// What a gateway without a tier learned from the input log about an append whose
    /// acknowledgement it gave up on (`crate::remote`): counted, and an order the log did not
    /// take answered with a [`gateway_reason::NOT_LOGGED`] reject, as the engines would have
    /// answered it (an order of the operator's, no session's, is only counted).
    pub fn resolved(&mut self, resolution: &Resolution) {
        let order = match resolution {
            Resolution::LandedLate { .. } => return self.stage.appends_landed_late += 1,
            Resolution::Unknown { orders } => return self.stage.orders_unresolved += orders,
            Resolution::NotTaken(order) => order,
        };
        self.stage.orders_not_logged += 1;
        let Some(at) = self.client_index(order.client) else { return };
        self.answered += 1;
        let event = Event {
            kind: event_kind::REJECTED,
            reason: gateway_reason::NOT_LOGGED,
            side: order.side,
            instrument: order.instrument,
            token: token_of(order.order_id),
            price: order.price,
            ..Event::default()
        };
        self.deliver(at, &event, ExecId::Session);
    }

    /// Hands one of client `at`'s events to its session, in its protocol (stored, counted).
    fn deliver(&mut self, at: usize, event: &Event, exec_id: ExecId) {
        let limit = self.settings.outbox_bytes_max;
        let client = &mut self.clients[at];
        client.counters.reports_out += 1;
        if event.kind == event_kind::REJECTED {
            client.counters.rejects[usize::from(event.reason)] += 1;
        }
        track_open(&mut client.open, event);
        match client.fix.as_mut() {
            Some(fix) => fix.report(event, exec_id, client.link.as_ref(), limit),
            None => {
                let log = &mut self.log.borrow_mut();
                publish_native(client, *event, &self.settings, &mut self.scratch, log, true);
            }
        }
    }

    /// Answers a refused request locally, as the tier would have (a rejected event).
    pub fn refuse_native(&mut self, at: usize, order: &native::OrderRequest, reason: u8) {
        let client = &mut self.clients[at];
        client.counters.rejects[usize::from(reason)] += 1;
        let event = Event {
            kind: event_kind::REJECTED,
            reason,
            side: order.side,
            instrument: order.instrument,
            token: order.token,
            price: order.price,
            ..Event::default()
        };
        let log = &mut self.log.borrow_mut();
        // Not kept: a flood of refused orders must not cost the disk a record each.
        publish_native(client, event, &self.settings, &mut self.scratch, log, false);
    }

    /// The requests that cancel every open order of a client (cancel-on-disconnect).
    pub fn cancels_for(&self, at: usize) -> Vec<InboundOrder> {
        let client = &self.clients[at];
        let id = client.credential.client;
        client
            .open
            .iter()
            .map(|(&token, &instrument)| InboundOrder {
                kind: exchange::msg::request_kind::CANCEL_ON_DISCONNECT,
                instrument,
                client: id,
                order_id: order_id(id, token),
                ..InboundOrder::default()
            })
            .collect()
    }

    /// Whether everything handed to the tier is answered, nothing waits in the store, and
    /// every live session's outbox is written: what a stopping server waits for.
    pub fn drained(&self) -> bool {
        self.answered >= self.stage.engine_in
            && !self.log.borrow().is_holding()
            && self.clients.iter().filter_map(|c| c.link.as_ref()).all(|l| l.is_written())
    }

    /// Hands a request to the tier without throttling (cancel-on-disconnect).
    pub fn push_unthrottled(&mut self, mut request: InboundOrder) -> Result<(), Refused> {
        request.stamps.intended_ns = now_ns();
        self.ingress.try_submit(request)?;
        self.stage.engine_in += 1;
        Ok(())
    }
}

/// Per core shard, the last input whose reports were routed and how many of them so far: an
/// input's reports reach a gateway together and in order, so its place among them is stable.
#[derive(Default)]
struct ExecIds {
    by_shard: Vec<(u64, u32)>,
}

impl ExecIds {
    /// The ExecID of `output` (an engine refusal before the core, input 0, is numbered by the
    /// session like the gateway's own).
    fn of(&mut self, output: &CoreOutput) -> ExecId {
        if output.seq == 0 {
            return ExecId::Session;
        }
        let shard = output.shard as usize;
        if self.by_shard.len() <= shard {
            // Once per shard seen, not per report.
            self.by_shard.resize(shard + 1, (0, 0));
        }
        let (input_seq, next) = &mut self.by_shard[shard];
        if *input_seq != output.seq {
            (*input_seq, *next) = (output.seq, 0);
        }
        let index = *next;
        *next += 1;
        ExecId::Engine { shard: output.shard, input_seq: output.seq, index }
    }
}

fn event_of(output: &CoreOutput) -> Event {
    let kind = match output.kind {
        OutputKind::Accepted => event_kind::ACCEPTED,
        OutputKind::PartiallyFilled => event_kind::PARTIALLY_FILLED,
        OutputKind::Filled => event_kind::FILLED,
        OutputKind::Cancelled => event_kind::CANCELLED,
        OutputKind::Replaced => event_kind::REPLACED,
        OutputKind::Rejected | OutputKind::Trade | OutputKind::TopOfBook => event_kind::REJECTED,
    };
    const _: () = assert!(REASON_COUNT < gateway_reason::THROTTLED as usize);
    Event {
        kind,
        reason: output.reason as u8,
        side: output.side as u8,
        instrument: output.instrument,
        token: token_of(output.order_id),
        price: output.price,
        qty: output.qty,
        leaves_qty: output.leaves_qty,
    }
}

/// A stopping server settles every reservation down to the numbers it used, so the next one
/// numbers on without a skip (the store's own drop commits these last records).
impl Drop for Hub {
    fn drop(&mut self) {
        let mut log = self.log.borrow_mut();
        for client in &mut self.clients {
            if client.next_seq < client.reserved_seq {
                client.reserved_seq = client.next_seq;
                let bytes = client.next_seq.to_le_bytes();
                log.append(store::kind::NATIVE_RESERVED, client.credential.client, &[&bytes]);
            }
        }
        drop(log);
        for fix in self.clients.iter_mut().filter_map(|c| c.fix.as_mut()) {
            fix.store_mut().settle();
        }
    }
}

/// Sequences a native event, stores it (`kept`; else only its number, reserved in runs of
/// [`store::UNKEPT_SEQ_RESERVE`]), keeps it for replay and holds it for the live connection
/// until the store has it (or its number) on disk.
fn publish_native(
    client: &mut Client,
    event: Event,
    settings: &Settings,
    scratch: &mut Vec<u8>,
    log: &mut Log,
    kept: bool,
) {
    let seq = client.next_seq;
    client.next_seq += 1;
    if client.journal.len() == settings.replay_events_max {
        client.journal.pop_front();
    }
    client.journal.push_back(event);
    scratch.clear();
    native::encode_server(&ServerMsg::Sequenced { seq, event }, scratch);
    let id = client.credential.client;
    if kept {
        log.append(store::kind::NATIVE_EVENT, id, &[scratch]);
        client.reserved_seq = client.reserved_seq.max(seq + 1);
    } else if seq >= client.reserved_seq {
        client.reserved_seq = seq + store::UNKEPT_SEQ_RESERVE;
        log.append(store::kind::NATIVE_RESERVED, id, &[&client.reserved_seq.to_le_bytes()]);
    }
    if let Some(link) = &client.link {
        // A full outbox cuts the session off (counted when it detaches); routing goes on.
        log.hold(link, scratch, settings.outbox_bytes_max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::credentials::{Credential, Protocol};

    /// An order input with room for `room` requests until the tier "reads" them.
    struct Bounded {
        taken: Rc<RefCell<Vec<InboundOrder>>>,
        room: usize,
    }

    impl OrderEntry for Bounded {
        fn try_submit(&mut self, request: InboundOrder) -> Result<(), Refused> {
            let mut taken = self.taken.borrow_mut();
            if taken.len() == self.room {
                return Err(Refused::Busy);
            }
            taken.push(request);
            Ok(())
        }

        fn room_per_turn(&self) -> usize {
            self.room
        }
    }

    /// The engine's side of a [`Bounded`] entry.
    type EngineSide = Rc<RefCell<Vec<InboundOrder>>>;

    /// A hub over a [`Bounded`] entry with one native client per id in `clients` (and its
    /// store's folder, removed when dropped).
    fn bounded_hub(room: usize, clients: &[u32]) -> (Hub, EngineSide, tempfile::TempDir) {
        let engine_side = Rc::new(RefCell::new(Vec::new()));
        let ingress = Box::new(Bounded { taken: engine_side.clone(), room });
        let credentials = clients.iter().map(|&client| Credential {
            client,
            protocol: Protocol::Native,
            comp_id: format!("N{client}"),
            hash: String::new(),
        });
        let dir = tempfile::tempdir().unwrap();
        let settings = Settings { store_dir: dir.path().to_path_buf(), ..Settings::default() };
        let verifier = Verifier::start().unwrap();
        let hub = Hub::new(settings, credentials.collect(), ingress, verifier).unwrap();
        (hub, engine_side, dir)
    }

    fn new_order(client: u32) -> InboundOrder {
        InboundOrder { kind: exchange::msg::request_kind::NEW, client, ..InboundOrder::default() }
    }

    #[test]
    fn a_full_ingress_ring_answers_busy_and_never_grows() {
        let (mut hub, engine_side, _dir) = bounded_hub(2, &[1]);
        let request = new_order(1);
        assert_eq!(hub.submit(0, request), Ok(()));
        assert_eq!(hub.submit(0, request), Ok(()));
        assert_eq!(hub.submit(0, request), Err(Refused::Busy));
        assert_eq!(hub.clients[0].counters.busy, 1);
        assert_eq!(engine_side.borrow_mut().drain(..).count(), 2, "exactly the two admitted");
        hub.next_turn();
        assert_eq!(hub.submit(0, request), Ok(()), "room again once the engine has read");
    }

    #[test]
    fn a_flooding_session_takes_only_its_share_of_a_turn() {
        let (mut hub, engine_side, _dir) = bounded_hub(4, &[1, 2]);
        hub.attach_link(0, Rc::new(Link::default()));
        hub.attach_link(1, Rc::new(Link::default()));
        let flood: Vec<_> = (0..3).map(|_| hub.submit(0, new_order(1))).collect();
        assert_eq!(flood, [Ok(()), Ok(()), Err(Refused::Busy)], "half of the room each");
        assert_eq!(hub.submit(1, new_order(2)), Ok(()), "the other session still finds room");
        assert_eq!(hub.submit(1, new_order(2)), Ok(()));
        engine_side.borrow_mut().clear();
        hub.next_turn();
        hub.detach_link(1);
        let alone: Vec<_> = (0..5).map(|_| hub.submit(0, new_order(1))).collect();
        assert_eq!(alone[..4], [Ok(()); 4], "a session alone has the whole room");
        assert_eq!(alone[4], Err(Refused::Busy));
    }

    #[test]
    fn refusals_are_numbered_and_replayed_but_not_stored_one_by_one() {
        let (mut hub, _engine_side, dir) = bounded_hub(4, &[1]);
        let refusals = 3000u64;
        for token in 1..=refusals {
            let order =
                native::OrderRequest { client: 1, token: token as u32, ..Default::default() };
            hub.refuse_native(0, &order, gateway_reason::THROTTLED);
        }
        hub.commit();
        let written = hub.log.borrow().bytes_written;
        let reservations = refusals.div_ceil(store::UNKEPT_SEQ_RESERVE);
        assert!(written < 64 * reservations, "{written} bytes for {refusals} refusals");
        assert_eq!(hub.clients[0].next_seq, refusals + 1);
        let replayed = hub.clients[0].journal.back().copied().unwrap();
        assert_eq!((replayed.token, replayed.reason), (3000, gateway_reason::THROTTLED));
        drop(hub); // a stopping server settles its reservation

        let options = store::StoreOptions {
            sync: false,
            replay_events_max: 16,
            bytes_max: store::STORE_BYTES_MAX_DEFAULT,
            fix_resend_window: 16,
        };
        let (_, mut recovered) = Log::open(dir.path(), options).unwrap();
        let native = recovered.native.remove(&1).unwrap();
        assert_eq!(native.reserved, refusals + 1, "numbering goes on without a skip");
        assert!(native.events.is_empty(), "nothing kept but the numbers");
    }

    #[test]
    fn the_throttle_admits_its_rate_and_refills() {
        let mut throttle = Throttle::new(3);
        let start = Instant::now();
        assert!((0..3).all(|_| throttle.admit(start)));
        assert!(!throttle.admit(start));
        assert!(throttle.admit(start + Duration::from_millis(400)), "one token back after 1/3 s");
        assert!(!throttle.breached(), "one refusal of a rate of 3");
        let later = start + Duration::from_millis(450);
        assert!((0..998).all(|_| !throttle.admit(later)));
        assert!(!throttle.breached(), "999 refusals: within the burst allowance");
        assert!(!throttle.admit(later) && !throttle.admit(later));
        assert!(throttle.breached(), "1,001 refusals within a second");
    }
}
