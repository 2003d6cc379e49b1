//! `exchange load`: drives `exchange serve` (or any FIX 4.4 acceptor) open loop, over the native
//! protocol or FIX 4.4, and measures each order's latency from its intended send time to its
//! first report (accepted, rejected, or for FIX any ExecutionReport), as the client sees it.
//!
//! The schedule, the intended-time table and the histograms are shared; only the session part
//! (log on, encode an order, decode reports, log out) differs by protocol. One sender thread
//! follows `stats::open_loop`'s schedule and writes each order to the session whose turn it is; reader
//! threads match reports to intended times by the run's order number (native: one thread polls
//! every session, each session's tokens start at its next sequence number so a later run never
//! reuses one; FIX: one thread per session, the ClOrdID is the run's prefix and the order
//! number, so a later run never reuses one either).
//! Orders alternate buy and sell at one price, so they match and the book stays small. Rejects
//! are counted by reason, so a run the server refused says why.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::load::{RateSearch, RateSearchPlan, RateSearchReport};
use stats::LatencyHistogram;
use stats::open_loop::{OpenLoopPlan, drive_sync};

use gateway::client::{ClientError, ClientTls, NativeClient, Timeout};
use gateway::fix::unix_ns;
use gateway::fix::{self, Builder, Message, tag};
use gateway::native::{self, ClientMsg, OrderRequest, ServerMsg, event_kind};
use gateway::{Reader, Transport, Writer};

/// How long a reader waits, once the schedule has ended, without a report before it gives up on
/// the missing ones (the default of [`LoadOptions::drain`]).
pub const DRAIN_DEFAULT: Duration = Duration::from_secs(2);
/// How often a waiting reader checks whether every sent order was answered (it then ends
/// without waiting out the drain).
const READ_POLL: Duration = Duration::from_millis(20);
/// How often a native session heartbeats once its orders stopped: well inside the shortest
/// dead-link time a server is configured with (three heartbeat intervals).
const CLIENT_HEARTBEAT: Duration = Duration::from_millis(250);
/// How long a logon (or a FIX logout) may take.
const LOGON_TIMEOUT: Duration = Duration::from_secs(10);
/// Orders one run may send (tokens are u32 and intended times are kept per order).
pub const ORDERS_MAX: u64 = 50_000_000;
/// Marks an order whose first report was counted (or that was never sent).
const ANSWERED: u64 = u64::MAX;
/// HeartBtInt the FIX sessions ask for: longer than a run's quiet drain, so neither side
/// heartbeats or test-requests mid-run (the reader thread never has to write, and the sender
/// owns the outbound sequence numbers alone).
const FIX_HEART_BT_INT_S: i64 = 30;
/// Bytes a native reader reads at once (about a thousand reports).
const NATIVE_READ_BYTES: usize = 1024 * native::FRAME_BYTES_MAX;
/// Bytes read per `read` call of a FIX session.
const FIX_READ_CHUNK_BYTES: usize = 64 * 1024;

/// Read errors that mean the read timeout passed.
const QUIET: [std::io::ErrorKind; 2] =
    [std::io::ErrorKind::WouldBlock, std::io::ErrorKind::TimedOut];

/// Which protocol the sessions speak.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LoadProtocol {
    Native,
    /// FIX 4.4: each session logs on as its `comp_id` to `target_comp_id`, with
    /// ResetSeqNumFlag=Y and its secret as Password (554).
    Fix {
        target_comp_id: String,
    },
}

/// One session's credentials.
#[derive(Clone, Debug)]
pub struct LoadSession {
    pub client: u32,
    /// SenderCompID (FIX only).
    pub comp_id: String,
    pub secret: String,
}

/// What to drive.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    pub connect: SocketAddr,
    pub protocol: LoadProtocol,
    pub sessions: Vec<LoadSession>,
    pub plan: OpenLoopPlan,
    /// What the orders trade: the k-th pair of orders (a buy, then a sell) goes to
    /// `instruments[k % len]`, so every instrument sees crossing orders.
    pub instruments: Vec<Traded>,
    /// Connect with TLS (`exchange serve`'s `tls_cert`); `None`: plain TCP.
    pub tls: Option<ClientTls>,
    /// How long readers wait for missing answers after the schedule's last send, each report
    /// starting the wait again ([`DRAIN_DEFAULT`]). While the schedule runs they never give up:
    /// a quiet spell then (a failover) is not the end of the run.
    pub drain: Duration,
}

/// An instrument the load trades, at the price and quantity its orders carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Traded {
    pub instrument: u32,
    /// What a FIX order's Symbol (55) carries: the instruments file's symbol.
    pub symbol: String,
    /// In price units (10^-`price_decimals` of the currency).
    pub price: i64,
    /// Decimal places of the price unit: FIX's Price (44) is a decimal.
    pub price_decimals: u32,
    /// Each order's quantity: a lot, so every order is a whole number of lots.
    pub qty: u32,
}

impl Traded {
    /// An instrument of the reference universe (`exchange::flow`), whose symbols are the ids
    /// and whose prices are whole units, in single-unit orders.
    pub fn reference(instrument: u32, price: i64) -> Traded {
        Traded { instrument, symbol: instrument.to_string(), price, price_decimals: 0, qty: 1 }
    }
}

/// What a run measured.
#[derive(Clone, Debug)]
pub struct LoadResult {
    pub sent: u64,
    pub answered: u64,
    pub rejected: u64,
    /// The rejects by reason (the native reason's name, FIX's Text (58)).
    pub rejects: BTreeMap<String, u64>,
    pub elapsed: Duration,
    /// Intended send time → first report.
    pub latency: LatencyHistogram,
    /// How late the sender was (a high tail: the generator could not keep up).
    pub send_lag: LatencyHistogram,
}

/// Runs one open-loop load.
pub fn run(options: &LoadOptions) -> Result<LoadResult, ClientError> {
    let orders = options.plan.schedule().map_err(|e| failure(e.to_string()))?.count() as u64;
    if orders > ORDERS_MAX || options.sessions.is_empty() {
        return Err(failure(format!("1..={ORDERS_MAX} orders and at least one session")));
    }
    let clock = Arc::new(Clock::new(orders, options.drain));
    // The sender and the reader threads (started below, they inherit it) outrank other work
    // on a shared host, as `web load`'s generator does (crate::load::GENERATOR_NICE).
    let _priority = crate::load::GeneratorPriority::raise();
    match &options.protocol {
        LoadProtocol::Native => {
            let mut sessions = Vec::new();
            let mut readers = Vec::new();
            let count = options.sessions.len() as u32;
            for (at, session) in options.sessions.iter().enumerate() {
                let place = (at as u32, count, orders);
                let tls = options.tls.as_ref();
                let (sender, reader) =
                    NativeSender::log_on((options.connect, tls), session, place)?;
                sessions.push(sender);
                readers.push(reader);
            }
            let clock_of_reader = clock.clone();
            let reader = std::thread::spawn(move || native_reports(readers, &clock_of_reader));
            let mut result = drive(options, &clock, &mut sessions)?;
            keep_alive(&mut sessions, &reader);
            let tally = reader.join().map_err(|_| failure("native reader panicked".into()))?;
            result.add(&tally);
            Ok(result)
        }
        LoadProtocol::Fix { target_comp_id } => {
            let mut sessions = Vec::new();
            for session in &options.sessions {
                let tls = options.tls.as_ref();
                let target = (options.connect, target_comp_id.as_str(), tls);
                sessions.push(FixSender::log_on(target, session, &clock)?);
            }
            let mut result = drive(options, &clock, &mut sessions)?;
            for session in sessions {
                result.add(&session.finish()?);
            }
            Ok(result)
        }
    }
}

fn failure(text: String) -> ClientError {
    ClientError::Io(std::io::Error::other(text))
}

/// A login answered otherwise than accepted, in words ("login refused: bad credentials"),
/// not as the message's debug form (`LoginRejected { reason: 1 }`).
fn refused_login(client: u32, answer: &ServerMsg) -> ClientError {
    failure(format!("login of client {client}: {}", gateway::client::describe(answer, None)))
}

/// The intended send time of each token, and when the run began.
struct Clock {
    /// By order number (from 1): ns after `start`; ANSWERED once counted.
    intended: Vec<AtomicU64>,
    start: Instant,
    /// Orders sent, once the schedule has ended (u64::MAX before).
    sent: AtomicU64,
    /// Orders whose first report was counted.
    answered: AtomicU64,
    /// When the schedule ended: ns after `start` (valid once `sent` is set).
    sent_at_ns: AtomicU64,
    /// [`LoadOptions::drain`].
    drain: Duration,
}

impl Clock {
    fn new(orders: u64, drain: Duration) -> Clock {
        let intended = (0..=orders).map(|_| AtomicU64::new(ANSWERED)).collect();
        Clock {
            intended,
            start: Instant::now(),
            sent: AtomicU64::new(u64::MAX),
            answered: AtomicU64::new(0),
            sent_at_ns: AtomicU64::new(0),
            drain,
        }
    }

    fn sending_done(&self, sent: u64) {
        let ended_ns = self.start.elapsed().as_nanos() as u64;
        // Relaxed: published by the release store of `sent` below.
        self.sent_at_ns.store(ended_ns, Ordering::Relaxed);
        // Release: a reader that sees `sent` also sees `sent_at_ns`.
        self.sent.store(sent, Ordering::Release);
    }

    /// Whether a reader quiet since `last_report` should stop: the schedule has ended and
    /// every order sent was answered, or the drain passed without a report since the later of
    /// the last report and the schedule's end. Never while the schedule runs: a reader that
    /// stopped during a failover's quiet spell would count every later answer as lost.
    fn drained(&self, last_report: Instant) -> bool {
        // Acquire: pairs with `sending_done`'s release, so `sent_at_ns` is the end's time.
        let sent = self.sent.load(Ordering::Acquire);
        if sent == u64::MAX {
            return false;
        }
        // Relaxed: a count; a late view costs one more poll.
        if self.answered.load(Ordering::Relaxed) >= sent {
            return true;
        }
        let ended = self.start + Duration::from_nanos(self.sent_at_ns.load(Ordering::Relaxed));
        last_report.max(ended).elapsed() >= self.drain
    }

    fn stamp(&self, number: u32, intended: Instant) {
        let intended_ns = intended.saturating_duration_since(self.start).as_nanos() as u64;
        // Relaxed: the reader reads it after the server's answer, which follows the write of
        // the order; the socket round trip orders them in practice, and a stale read only
        // mis-attributes one sample (never a crash).
        self.intended[number as usize].store(intended_ns, Ordering::Relaxed);
    }

    /// The latency of order `number`'s first report; `None` for later reports and unknown
    /// numbers.
    fn answer(&self, number: u64) -> Option<u64> {
        let slot = self.intended.get(usize::try_from(number).ok()?)?;
        // Relaxed: as in `stamp`; the swap itself makes each token count once.
        let sent_ns = slot.swap(ANSWERED, Ordering::Relaxed);
        let now_ns = self.start.elapsed().as_nanos() as u64;
        if sent_ns == ANSWERED {
            return None;
        }
        // Relaxed: a count read only by `drained`.
        self.answered.fetch_add(1, Ordering::Relaxed);
        Some(now_ns.saturating_sub(sent_ns))
    }
}

/// One reader's counts.
#[derive(Default)]
struct Tally {
    latency: LatencyHistogram,
    answered: u64,
    rejected: u64,
    rejects: BTreeMap<String, u64>,
}

impl Tally {
    /// Counts order `number`'s first report; `reject` is the reason when it was rejected.
    fn report(&mut self, clock: &Clock, number: u64, reject: Option<&str>) {
        if let Some(latency_ns) = clock.answer(number) {
            self.latency.record_ns(latency_ns);
            self.answered += 1;
            if let Some(reason) = reject {
                self.rejected += 1;
                count_reason(&mut self.rejects, reason, 1);
            }
        }
    }
}

/// Adds `count` rejects for `reason`; allocates only for a reason not seen yet.
fn count_reason(rejects: &mut BTreeMap<String, u64>, reason: &str, count: u64) {
    match rejects.get_mut(reason) {
        Some(seen) => *seen += count,
        None => {
            rejects.insert(reason.to_string(), count);
        }
    }
}

/// A logged-on session as the driver sees it; its reader thread runs beside it.
trait OrderSender {
    /// The token on the wire of this session's `nth` order (from 0), the run's order `number`
    /// (from 1, what the clock counts).
    fn token(&self, nth: u32, number: u32) -> u32;
    /// Sends `order`, of `traded` (its symbol and price scale, for FIX).
    fn send(&mut self, order: &OrderRequest, traded: &Traded) -> std::io::Result<()>;
}

/// Sends the schedule's orders over `sessions`; the answers are the readers' to count.
fn drive<S: OrderSender>(
    options: &LoadOptions,
    clock: &Clock,
    sessions: &mut [S],
) -> Result<LoadResult, ClientError> {
    let mut write_error = None;
    let report = drive_sync(&options.plan, |shot| {
        let number = shot.index as u32 + 1;
        let session = shot.index as usize % sessions.len();
        let token = sessions[session].token((shot.index / sessions.len() as u64) as u32, number);
        let traded = &options.instruments[(shot.index / 2) as usize % options.instruments.len()];
        let order = OrderRequest {
            client: options.sessions[session].client,
            token,
            instrument: traded.instrument,
            side: (shot.index % 2) as u8,
            price: traded.price,
            qty: traded.qty,
            ..OrderRequest::default()
        };
        clock.stamp(number, shot.intended);
        if let Err(error) = sessions[session].send(&order, traded) {
            write_error.get_or_insert(error);
        }
    })
    .map_err(|e| failure(e.to_string()))?;
    clock.sending_done(report.sent);
    if let Some(error) = write_error {
        return Err(error.into());
    }
    Ok(LoadResult {
        sent: report.sent,
        answered: 0,
        rejected: 0,
        rejects: BTreeMap::new(),
        elapsed: report.elapsed,
        latency: LatencyHistogram::new(),
        send_lag: report.send_lag,
    })
}

/// Heartbeats every native session while the shared reader still waits for answers: the
/// server ends a link it heard nothing on for three of its heartbeat intervals, and a drain
/// (a failover's missing answers) outlasts that once the schedule's orders stop. A failed
/// write is left to the reader, which sees the link close.
fn keep_alive(sessions: &mut [NativeSender], reader: &std::thread::JoinHandle<Tally>) {
    let mut last_heartbeat = Instant::now();
    while !reader.is_finished() {
        if last_heartbeat.elapsed() >= CLIENT_HEARTBEAT {
            sessions.iter_mut().for_each(|session| _ = session.heartbeat());
            last_heartbeat = Instant::now();
        }
        std::thread::sleep(READ_POLL);
    }
}

impl LoadResult {
    fn add(&mut self, tally: &Tally) {
        self.latency.merge(&tally.latency);
        self.answered += tally.answered;
        self.rejected += tally.rejected;
        for (reason, &count) in &tally.rejects {
            count_reason(&mut self.rejects, reason, count);
        }
    }

    /// The most frequent reject reason and its count; `None` without rejects.
    pub fn main_reject(&self) -> Option<(&str, u64)> {
        let most = self.rejects.iter().max_by_key(|(_, count)| **count)?;
        Some((most.0.as_str(), *most.1))
    }
}

/// Searches the highest rate meeting `plan` on several targets side by side: one step per
/// target in turn (so the targets share the host's conditions), the same rates while their
/// searches agree. `measure(target, rate)` runs one step.
pub fn search_side_by_side<E: From<ClientError>>(
    plan: RateSearchPlan,
    targets: usize,
    mut measure: impl FnMut(usize, f64) -> Result<LatencyHistogram, E>,
) -> Result<Vec<RateSearchReport>, E> {
    let search = RateSearch::new(plan).map_err(|e| failure(e.to_string()))?;
    let mut searches = vec![search; targets];
    loop {
        let mut measured = false;
        for (target, search) in searches.iter_mut().enumerate() {
            if let Some(rate) = search.next_rate() {
                let latency = measure(target, rate)?;
                search.record(rate, &latency);
                measured = true;
            }
        }
        if !measured {
            return Ok(searches.into_iter().map(RateSearch::into_report).collect());
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Native protocol.

/// A native session's sending half; [`native_reports`] reads every session on one thread.
struct NativeSender {
    writer: Writer,
    frame: Vec<u8>,
    tokens: TokenSpace,
}

/// Which tokens a native session's orders take in this run: its `nth` order's is `first +
/// nth`. `first` is the session's next sequence number at login: every order of an earlier
/// run of this client took a token below its first event's number and produced at least one
/// event, so this run never reuses a token of an order that rests or ended, which the
/// engines refuse as a duplicate (`matching::store::EndedOrders`).
#[derive(Clone, Copy)]
struct TokenSpace {
    first: u32,
    /// The session's place in the run and the run's sessions: the run's order number of a
    /// token is `(token - first) * sessions + session + 1`.
    session: u32,
    sessions: u32,
}

impl TokenSpace {
    /// The run's order number of `token` (`u64::MAX`: not one of this run's).
    fn number_of(&self, token: u32) -> u64 {
        token.checked_sub(self.first).map_or(u64::MAX, |nth| {
            u64::from(nth) * u64::from(self.sessions) + u64::from(self.session) + 1
        })
    }
}

impl NativeSender {
    /// Logs on as the run's `session`th of `sessions` (over TLS when `tls` is given);
    /// returns the sending half and the receiving half for the shared reader.
    fn log_on(
        (connect, tls): (SocketAddr, Option<&ClientTls>),
        credentials: &LoadSession,
        (session, sessions, orders): (u32, u32, u64),
    ) -> Result<(NativeSender, NativeInbox), ClientError> {
        let mut client = NativeClient::connect_with(connect, LOGON_TIMEOUT, tls)?;
        let next_seq =
            match client.login(credentials.client, &credentials.secret, 0, LOGON_TIMEOUT)? {
                ServerMsg::LoginAccepted { next_seq, .. } => next_seq,
                other => return Err(refused_login(credentials.client, &other)),
            };
        let per_session = orders.div_ceil(u64::from(sessions));
        let first = u32::try_from(next_seq.max(1))
            .ok()
            .filter(|first| u64::from(*first) + per_session <= u64::from(u32::MAX))
            .ok_or_else(|| {
                failure(format!(
                    "client {}: its tokens are used up (next sequence {next_seq})",
                    credentials.client
                ))
            })?;
        let tokens = TokenSpace { first, session, sessions };
        let (writer, reader, pending) = client.split()?;
        let frame = Vec::with_capacity(native::FRAME_BYTES_MAX);
        Ok((NativeSender { writer, frame, tokens }, NativeInbox::new(reader, &pending, tokens)))
    }
}

impl OrderSender for NativeSender {
    fn token(&self, nth: u32, _number: u32) -> u32 {
        self.tokens.first + nth
    }

    fn send(&mut self, order: &OrderRequest, _traded: &Traded) -> std::io::Result<()> {
        self.frame.clear();
        native::encode_client(&ClientMsg::NewOrder(*order), &mut self.frame);
        self.writer.write_all(&self.frame)
    }
}

impl NativeSender {
    fn heartbeat(&mut self) -> std::io::Result<()> {
        self.frame.clear();
        native::encode_client(&ClientMsg::Heartbeat, &mut self.frame);
        self.writer.write_all(&self.frame)
    }
}

/// One native connection as the shared reader sees it.
struct NativeInbox {
    stream: Reader,
    buffer: Vec<u8>,
    filled: usize,
    open: bool,
    tokens: TokenSpace,
}

impl NativeInbox {
    fn new(stream: Reader, pending: &[u8], tokens: TokenSpace) -> NativeInbox {
        // Plain: blocking (the flag would be the writer's too: it shares the file
        // description), but read only after `poll` says bytes or the close are there, so a
        // read never waits. TLS: non-blocking, and read while it has records pending.
        let mut buffer = vec![0u8; NATIVE_READ_BYTES.max(pending.len())];
        buffer[..pending.len()].copy_from_slice(pending);
        NativeInbox { stream, buffer, filled: pending.len(), open: true, tokens }
    }

    /// Counts the reports in the bytes read so far (whole frames), keeping a partial one.
    fn count(&mut self, tally: &mut Tally, clock: &Clock) {
        let mut start = 0;
        while let Ok(Some((version, kind, payload, len))) =
            native::split_frame(&self.buffer[start..self.filled])
        {
            start += len;
            if let Ok(ServerMsg::Sequenced { event, .. }) =
                native::decode_server(version, kind, payload)
                && matches!(event.kind, event_kind::ACCEPTED | event_kind::REJECTED)
            {
                let rejected = event.kind == event_kind::REJECTED;
                let reason = rejected.then(|| native::reason_name(event.reason));
                tally.report(clock, self.tokens.number_of(event.token), reason.as_deref());
            }
        }
        self.buffer.copy_within(start..self.filled, 0);
        self.filled -= start;
    }

    /// Reads what has arrived (one `read`); whether it brought anything.
    fn read(&mut self) -> bool {
        match self.stream.read(&mut self.buffer[self.filled..]) {
            Ok(0) => self.open = false,
            Ok(n) => {
                self.filled += n;
                return true;
            }
            Err(e) if QUIET.contains(&e.kind()) => {}
            Err(_) => self.open = false,
        }
        false
    }
}

/// Counts every native session's reports on one thread, woken by `poll` when any has bytes,
/// until every order sent is answered or the drain passes without a report. One thread
/// rather than one per session: on a host the server shares, each extra reader is another
/// thread to wake per report (a fill reaches two sessions at once). Heartbeats are not
/// answered: the sender's orders keep the links alive while the run lasts.
fn native_reports(mut inboxes: Vec<NativeInbox>, clock: &Clock) -> Tally {
    let mut tally = Tally::default();
    let mut fds: Vec<libc::pollfd> = inboxes
        .iter()
        .map(|inbox| libc::pollfd {
            fd: inbox.stream.socket().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    inboxes.iter_mut().for_each(|inbox| inbox.count(&mut tally, clock));
    let mut last_report = Instant::now();
    while inboxes.iter().any(|inbox| inbox.open) {
        // TLS records read but not yet decrypted: no waiting for the socket then.
        let pending = inboxes.iter().any(|inbox| inbox.open && inbox.stream.pending());
        let wait_ms = if pending { 0 } else { READ_POLL.as_millis() as i32 };
        // SAFETY: `fds` is a valid, writable array of `fds.len()` pollfd structs that outlives
        // the call; poll only writes their `revents`.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, wait_ms) };
        let mut read = false;
        if ready > 0 || pending {
            for (inbox, fd) in inboxes.iter_mut().zip(&mut fds) {
                let ready = fd.revents != 0 || (inbox.open && inbox.stream.pending());
                if ready && inbox.read() {
                    inbox.count(&mut tally, clock);
                    read = true;
                }
                if !inbox.open {
                    fd.fd = -1; // poll skips it from now on
                }
            }
        }
        if read {
            last_report = Instant::now();
        } else if clock.drained(last_report) {
            break;
        }
    }
    tally
}

// ---------------------------------------------------------------------------------------------
// FIX 4.4.

struct FixSender {
    stream: Writer,
    builder: Builder,
    comp_id: String,
    target_comp_id: String,
    next_seq: u64,
    /// This run's ClOrdIDs, written in place per order.
    cl_ord_id: ClOrdId,
    reader: std::thread::JoinHandle<(Tally, FixReader)>,
}

/// A run's ClOrdIDs: `R<run>-<order number>`, where the run is the wall clock's milliseconds at
/// the run's logon. An acceptor keeps a session's orders across runs (one left resting by a
/// run, or a whole run's within its duplicate window), so a number alone would repeat a
/// ClOrdID the next run and be refused as a duplicate; 24 bytes at most, within the gateway's
/// 32.
#[derive(Clone)]
struct ClOrdId {
    /// `R<run>-` then room for the number's digits.
    bytes: [u8; 32],
    prefix_len: usize,
}

impl ClOrdId {
    fn for_this_run() -> ClOrdId {
        let run_ms = unix_ns() / 1_000_000;
        let mut bytes = [0u8; 32];
        let prefix = format!("R{run_ms}-");
        bytes[..prefix.len()].copy_from_slice(prefix.as_bytes());
        ClOrdId { bytes, prefix_len: prefix.len() }
    }

    /// The ClOrdID of order `number`.
    fn of(&mut self, number: u32) -> &[u8] {
        let mut digits = [0u8; 10];
        let mut at = digits.len();
        let mut rest = number;
        loop {
            at -= 1;
            digits[at] = b'0' + (rest % 10) as u8;
            rest /= 10;
            if rest == 0 {
                break;
            }
        }
        let end = self.prefix_len + digits.len() - at;
        self.bytes[self.prefix_len..end].copy_from_slice(&digits[at..]);
        &self.bytes[..end]
    }

    /// The order number of a report's ClOrdID; `None` when it is not one of this run's.
    fn number_of(&self, cl_ord_id: &[u8]) -> Option<u64> {
        cl_ord_id.strip_prefix(&self.bytes[..self.prefix_len]).and_then(fix::parse_u64)
    }
}

impl FixSender {
    /// Logs on to the acceptor at `connect` (`target_comp_id`, TLS when `tls` is given).
    fn log_on(
        (connect, target_comp_id, tls): (SocketAddr, &str, Option<&ClientTls>),
        credentials: &LoadSession,
        clock: &Arc<Clock>,
    ) -> Result<FixSender, ClientError> {
        let (mut stream, reader) = Transport::connect(connect, LOGON_TIMEOUT, tls)?.split()?;
        let mut builder = Builder::default();
        builder
            .begin(b"A", credentials.comp_id.as_bytes(), target_comp_id.as_bytes(), 1)
            .field(tag::SENDING_TIME, &fix::utc_timestamp(unix_ns()))
            .int(tag::ENCRYPT_METHOD, 0)
            .int(tag::HEART_BT_INT, FIX_HEART_BT_INT_S)
            .field(tag::RESET_SEQ_NUM_FLAG, b"Y")
            .field(tag::PASSWORD, credentials.secret.as_bytes());
        stream.write_all(builder.finish())?;
        let mut reader = FixReader::new(reader);
        let deadline = Instant::now() + LOGON_TIMEOUT;
        let answer = reader.next_type(deadline)?;
        let comp_id = &credentials.comp_id;
        match answer.as_deref() {
            Some(b"A") => {}
            // An acceptor ignores a logon from a SenderCompID it does not know: say so.
            None if !reader.closed => {
                let waited_for = format!(
                    "no answer to the FIX logon of {comp_id} to {target_comp_id} (does the \
                     server's credentials file list {comp_id}?)"
                );
                let after = LOGON_TIMEOUT;
                return Err(ClientError::TimedOut { timeout: Timeout::Request, after, waited_for });
            }
            other => {
                let answer = other.map(String::from_utf8_lossy);
                let refused = format!("FIX logon of {comp_id} to {target_comp_id} refused");
                return Err(failure(format!("{refused} (answer: {answer:?})")));
            }
        }
        let clock = clock.clone();
        let cl_ord_id = ClOrdId::for_this_run();
        let ours = cl_ord_id.clone();
        let reader = std::thread::spawn(move || reader.reports(&clock, &ours));
        Ok(FixSender {
            stream,
            builder,
            comp_id: credentials.comp_id.clone(),
            target_comp_id: target_comp_id.into(),
            next_seq: 2,
            cl_ord_id,
            reader,
        })
    }
}

impl OrderSender for FixSender {
    /// The run's order number, which the ClOrdID carries after the run's prefix.
    fn token(&self, _nth: u32, number: u32) -> u32 {
        number
    }

    fn send(&mut self, order: &OrderRequest, traded: &Traded) -> std::io::Result<()> {
        let now = fix::utc_timestamp(unix_ns());
        let side: &[u8] = if order.side == 0 { b"1" } else { b"2" };
        self.builder
            .begin(b"D", self.comp_id.as_bytes(), self.target_comp_id.as_bytes(), self.next_seq)
            .field(tag::SENDING_TIME, &now)
            .field(tag::CL_ORD_ID, self.cl_ord_id.of(order.token))
            .field(tag::SYMBOL, traded.symbol.as_bytes())
            .field(tag::SIDE, side)
            .field(tag::TRANSACT_TIME, &now)
            .int(tag::ORDER_QTY, i64::from(order.qty))
            .field(tag::ORD_TYPE, b"2")
            .decimal(tag::PRICE, order.price, traded.price_decimals)
            .field(tag::TIME_IN_FORCE, b"0");
        self.next_seq += 1;
        self.stream.write_all(self.builder.finish())
    }
}

impl FixSender {
    /// Waits for the reader (it ends once every order sent is answered, or after the drain
    /// without a report), then logs out and waits for the acceptor to close the connection, so the next run's logon
    /// with the same CompIDs finds the session free.
    fn finish(mut self) -> Result<Tally, ClientError> {
        let (tally, mut closing) =
            self.reader.join().map_err(|_| failure("FIX reader thread panicked".into()))?;
        self.builder
            .begin(b"5", self.comp_id.as_bytes(), self.target_comp_id.as_bytes(), self.next_seq)
            .field(tag::SENDING_TIME, &fix::utc_timestamp(unix_ns()));
        self.stream.write_all(self.builder.finish())?;
        let deadline = Instant::now() + LOGON_TIMEOUT;
        while closing.next_type(deadline)?.is_some() {}
        Ok(tally)
    }
}

/// The receiving half of a FIX session.
struct FixReader {
    stream: Reader,
    buffer: Vec<u8>,
    /// Where the unread messages in `buffer` begin.
    start: usize,
    chunk: Box<[u8]>,
    /// The peer closed the connection.
    closed: bool,
}

impl FixReader {
    fn new(stream: Reader) -> FixReader {
        FixReader {
            stream,
            buffer: Vec::with_capacity(FIX_READ_CHUNK_BYTES * 2),
            start: 0,
            chunk: vec![0; FIX_READ_CHUNK_BYTES].into_boxed_slice(),
            closed: false,
        }
    }

    /// Calls `on_message` with the next valid message; `Ok(false)` on close or at `deadline`.
    fn next(
        &mut self,
        deadline: Instant,
        mut on_message: impl FnMut(&Message),
    ) -> Result<bool, ClientError> {
        loop {
            match fix::split_frame(&self.buffer[self.start..]) {
                Ok(Some(len)) => {
                    let bytes = &self.buffer[self.start..self.start + len];
                    self.start += len;
                    if let Ok(message) = Message::parse(bytes) {
                        on_message(&message);
                        return Ok(true);
                    }
                    continue;
                }
                Ok(None) => {}
                Err(_) => {
                    self.start += fix::resync(&self.buffer[self.start..]);
                    continue;
                }
            }
            self.buffer.drain(..self.start);
            self.start = 0;
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || self.closed {
                return Ok(false);
            }
            match self.stream.read_within(&mut self.chunk, left) {
                Ok(0) => self.closed = true,
                Ok(n) => self.buffer.extend_from_slice(&self.chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => self.closed = true,
                Err(e) if QUIET.contains(&e.kind()) => return Ok(false),
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// The MsgType of the next message; `None` on close or at `deadline`.
    fn next_type(&mut self, deadline: Instant) -> Result<Option<Vec<u8>>, ClientError> {
        let mut msg_type = None;
        self.next(deadline, |message| msg_type = Some(message.msg_type().to_vec()))?;
        Ok(msg_type)
    }

    /// Counts ExecutionReports until every order sent is answered, the drain passes
    /// without a message, or a Logout.
    fn reports(mut self, clock: &Clock, ours: &ClOrdId) -> (Tally, FixReader) {
        let mut tally = Tally::default();
        let mut logged_out = false;
        let mut last_report = Instant::now();
        while !logged_out {
            let more = self.next(Instant::now() + READ_POLL, |message| match message.msg_type() {
                b"8" => {
                    let token = message.get(tag::CL_ORD_ID).and_then(|id| ours.number_of(id));
                    let rejected = message.get(tag::EXEC_TYPE) == Some(b"8");
                    let text = message.get(tag::TEXT).map(String::from_utf8_lossy);
                    let reason = rejected.then(|| text.unwrap_or("no Text (58)".into()));
                    tally.report(clock, token.unwrap_or(u64::MAX), reason.as_deref());
                }
                b"5" => logged_out = true,
                _ => {}
            });
            match more {
                Ok(true) => last_report = Instant::now(),
                Ok(false) if !self.closed && !clock.drained(last_report) => {}
                Ok(false) | Err(_) => break,
            }
        }
        (tally, self)
    }
}

#[cfg(test)]
mod refused_login_tests {
    use super::*;

    #[test]
    fn a_refused_login_is_a_sentence() {
        let answer = ServerMsg::LoginRejected { reason: native::login_reject::BAD_CREDENTIALS };
        let error = refused_login(1, &answer).to_string();
        assert!(error.ends_with("login of client 1: login refused: bad credentials"), "{error}");
    }
}

#[cfg(test)]
mod cl_ord_id_tests {
    use super::*;

    #[test]
    fn a_runs_cl_ord_ids_carry_its_numbers_and_no_other_runs() {
        let mut ours = ClOrdId::for_this_run();
        for number in [0, 7, 10, 123_456, u32::MAX] {
            let id = ours.of(number).to_vec();
            assert!(id.len() <= 32, "{} bytes", id.len());
            assert_eq!(ours.number_of(&id), Some(u64::from(number)));
        }
        // Another run's prefix: its milliseconds differ.
        let mut other = ClOrdId::for_this_run();
        other.bytes[1] = if other.bytes[1] == b'9' { b'8' } else { b'9' };
        assert_eq!(ours.number_of(other.of(7)), None, "another run's ClOrdID is not ours");
        assert_eq!(ours.number_of(b"7"), None, "a bare number is not ours");
    }
}
