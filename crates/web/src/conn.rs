//! Connections: where every execution model accepts and serves them, with every phase timed.
//!
//! Every model (`single`, `pool`, `pinned` and `adaptive` in one process, and each process of
//! `prefork` and of the per-core `adaptive` layout) serves its connections through [`serve`]:
//! one accept loop per process, one task per connection (HTTP/1.1, hyper). Here:
//!
//! - **Connection limit.** At most `connections_max` connections are served at once per process,
//!   and at most `connections_per_address_max` from one client address. When a new connection
//!   finds either full, the longest-idle connection in its way (waiting for a request, none in
//!   progress and no answer being written; for the address bound, one of that address) is closed
//!   to make room, as nginx reuses its idle keep-alive connections when it runs out; only when
//!   none is idle is the new one answered 503 with code 010 (one write, before any request is
//!   read) and closed. Why both: without eviction, 512 connections that never send a byte held
//!   every slot until their idle timeout and every client was refused meanwhile; eviction alone
//!   would let one address hold every slot with connections that are never idle (each in a
//!   trickled header, or a request). Closing an idle keep-alive connection is what its client
//!   must expect anyway (the idle timeout does the same), and evicting the longest idle first
//!   closes the connection least likely to be reused. Refusals and evictions are logged once per
//!   [`REFUSAL_LOG_INTERVAL`] with their counts, not one line each.
//! - **Idle timeout.** A connection waiting for a request's first byte (a new one, or a keep-alive
//!   one after its answer) is closed after `idle_timeout`.
//! - **Write progress timeout.** An answer being written must make progress at least once per
//!   `idle_timeout`: a client that reads a large answer slowly keeps its connection; one that
//!   stops reading is closed `idle_timeout` after its last progress, and the answer's work
//!   reservation ([`crate::admission`]) is released as the connection drops it.
//! - **Header timeout.** From a request's first byte, its header must be complete within
//!   `header_timeout` however the bytes trickle in (slowloris); else the connection is closed.
//! - **Body timeout.** From the first read of a body, the whole body must arrive within
//!   `body_timeout`; else the request is answered 408 with code 013 and the connection closed.
//!   The clock starts when the body is first read, not when the header arrived, so time spent
//!   waiting for work admission ([`crate::admission`]) does not count against the client.
//!
//! How: the connection's socket is wrapped (`TimedIo`) so that a read or write that would
//! block also polls the connection's current deadline, and the request service moves that
//! deadline between phases (`ConnState`). An answer is written when hyper flushes the socket
//! with nothing left in its buffer (hyper flushes the socket only then), which ends the writing
//! phase. Nothing is allocated or locked for it per request in the steady state beyond the
//! connection's work share handed to the request: moving a deadline is two relaxed stores (and a
//! clock read), marking the connection idle or busy one atomic operation, the service wakes its
//! own task once per answer (one more poll, no system call), and the one timer per connection is
//! reset only when it fires (the deadline moved later meanwhile) or the deadline moves earlier
//! while a read waits (a header arriving in pieces). The accept loop keeps every connection's
//! state and scans them for the longest idle only when a bound is full (at most a few hundred
//! atomic loads); counting connections by address takes a lock once per connection, not per
//! request.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::serve::Listener;
use bytes::Bytes;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::{Notify, Semaphore};
use tokio::time::{Instant, Sleep};

use crate::admission::ConnectionWork;
use crate::api::{self, Failure};

/// Default header timeout: a header is a few hundred bytes, sent at once by any real client.
pub const HEADER_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);
/// Default body timeout: a 16 MiB body (the default bound) needs about 1.3 MB/s.
pub const BODY_TIMEOUT_DEFAULT: Duration = Duration::from_secs(12);
/// Default keep-alive idle timeout, and the write progress timeout.
pub const IDLE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(60);
/// Default connection limit per process: half of the common 1024-descriptor limit, so the
/// process keeps descriptors for everything else.
pub const CONNECTIONS_MAX_DEFAULT: usize = 512;
/// Default connections per client address and process: half the default connection limit, so
/// one address can never hold every slot with connections that are never idle, while the load
/// lab's 60 users (all from one address) fit with room to spare.
pub const CONNECTIONS_PER_ADDRESS_MAX_DEFAULT: usize = CONNECTIONS_MAX_DEFAULT / 2;
/// The most a connection buffers of what it reads (hyper's default is 417 KB): with the
/// connection limit, it bounds the memory of connections that are not yet admitted, or whose
/// refused body is drained (in `tests/large_load.rs`, 46 refused 1.3 MB bodies drained at once:
/// peak RSS growth 33-36 MiB with the default, 26-27 MiB with this bound).
/// A header must fit in it.
pub const READ_BUFFER_BYTES_MAX: usize = 128 << 10;
/// How long a refused connection's 503 may take to write before the connection is dropped.
const REFUSAL_WRITE_TIMEOUT: Duration = Duration::from_millis(100);
/// At most one log line per interval about refused and evicted connections.
pub const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);
/// Tries to evict one idle connection before a new one is refused: each failed try found its
/// candidate starting a request meanwhile, which is rare; the bound keeps the accept loop's
/// work per connection bounded whatever the timing.
const EVICTION_TRIES_MAX: usize = 4;

/// The per-connection bounds of one process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ConnectionBounds {
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    /// Waiting for a request, and the longest an answer's write may make no progress.
    pub idle_timeout: Duration,
    pub connections_max: usize,
    /// Connections from one client address (IP) at once.
    pub connections_per_address_max: usize,
}

impl Default for ConnectionBounds {
    fn default() -> Self {
        ConnectionBounds {
            header_timeout: HEADER_TIMEOUT_DEFAULT,
            body_timeout: BODY_TIMEOUT_DEFAULT,
            idle_timeout: IDLE_TIMEOUT_DEFAULT,
            connections_max: CONNECTIONS_MAX_DEFAULT,
            connections_per_address_max: CONNECTIONS_PER_ADDRESS_MAX_DEFAULT,
        }
    }
}

impl ConnectionBounds {
    /// Why these bounds are unusable, if they are (a zero bound would refuse everything).
    pub fn check(&self) -> Result<(), String> {
        let timeouts = [
            ("header_timeout", self.header_timeout),
            ("body_timeout", self.body_timeout),
            ("idle_timeout", self.idle_timeout),
        ];
        if let Some((name, _)) = timeouts.iter().find(|(_, timeout)| timeout.is_zero()) {
            return Err(format!("{name} must be > 0"));
        }
        if self.connections_max == 0 || self.connections_max > Semaphore::MAX_PERMITS {
            return Err(format!("connections_max must be 1..={}", Semaphore::MAX_PERMITS));
        }
        if self.connections_per_address_max == 0 {
            return Err("connections_per_address_max must be > 0".into());
        }
        Ok(())
    }
}

/// Serves `router` on every connection `listener` accepts until `shutdown`, then stops
/// accepting and waits for the open connections to finish their requests.
pub async fn serve<L: Listener<Addr = SocketAddr>>(
    mut listener: L,
    router: Router,
    bounds: ConnectionBounds,
    shutdown: impl Future<Output = ()>,
) -> DrainReport {
    let graceful = GracefulShutdown::new();
    let mut slots = Slots::new(bounds);
    let mut log = AcceptLog::default();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (io, peer) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let slot = match slots.admit(peer.ip()) {
            Admitted::Free(slot) => slot,
            Admitted::Evicted(slot) => {
                log.note(Accepted::Evicted, &bounds);
                slot
            }
            Admitted::Refused(answer) => {
                log.note(Accepted::Refused, &bounds);
                tokio::spawn(refuse_connection(io, answer));
                continue;
            }
        };
        let connection =
            serve_connection(io, router.clone(), slot.state(), Some(graceful.watcher()));
        tokio::spawn(async move {
            connection.await;
            // Gives the slot back, unless an eviction already took it.
            drop(slot);
        });
    }
    drop(listener);
    let started = std::time::Instant::now();
    let open = graceful.count();
    // Connections finish the request they are in and close; past the bound the rest are cut.
    let drained = tokio::time::timeout(ops::stop::DRAIN_TIMEOUT, graceful.shutdown()).await;
    DrainReport { drained: drained.is_ok(), connections_open: open, elapsed: started.elapsed() }
}

/// What a server's stop did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DrainReport {
    /// Every open connection finished its request within `ops::stop::DRAIN_TIMEOUT`.
    pub drained: bool,
    /// Connections open when the stop came.
    pub connections_open: usize,
    pub elapsed: Duration,
}

/// Serves one connection (any byte stream: a socket, or an in-memory pipe in tests and the
/// decoder soak) with the idle, header and body timeouts of `bounds`, until it closes.
pub async fn serve_io<T>(io: T, router: Router, bounds: ConnectionBounds, watcher: Option<Watcher>)
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    serve_connection(io, router, Arc::new(ConnState::new(bounds)), watcher).await;
}

/// Serves one connection until it closes, or until it is evicted while idle.
async fn serve_connection<T>(io: T, router: Router, state: Arc<ConnState>, watcher: Option<Watcher>)
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let bounds = state.bounds;
    let router = TowerToHyperService::new(router);
    // The connection's share of the work bound, handed to each of its requests.
    let work = Arc::new(ConnectionWork::default());
    let service = hyper::service::service_fn({
        let state = Arc::clone(&state);
        move |request: hyper::Request<Incoming>| {
            state.enter_request();
            let mut request =
                request.map(|body| Body::new(DeadlineBody::new(body, bounds.body_timeout)));
            request.extensions_mut().insert(Arc::clone(&work));
            let response = hyper::service::Service::call(&router, request);
            let state = Arc::clone(&state);
            async move {
                let response: Result<_, Infallible> = response.await;
                state.enter_writing();
                // hyper writes the answer and, without a timer of its own, does not read again
                // until the socket is readable: this wake polls the connection once more so
                // that TimedIo's waiting read arms the deadline.
                std::future::poll_fn(|cx| {
                    cx.waker().wake_by_ref();
                    Poll::Ready(())
                })
                .await;
                response
            }
        }
    });
    let io = TokioIo::new(TimedIo { io, state: Arc::clone(&state), timer: None });
    // No hyper timer: the header timeout is TimedIo's, which hyper's own would not tell apart
    // from the idle time before a request.
    let connection = hyper::server::conn::http1::Builder::new()
        .max_buf_size(READ_BUFFER_BYTES_MAX)
        .serve_connection(io, service);
    let serving = async move {
        match watcher {
            Some(watcher) => watcher.watch(connection).await,
            None => connection.await,
        }
    };
    // Dropping the connection closes its socket: an evicted connection is idle, so nothing of
    // a request is lost.
    let ended = tokio::select! {
        ended = serving => ended,
        () = state.evicted.notified() => {
            tracing::debug!("idle connection closed to admit a new one");
            return;
        }
    };
    if let Err(error) = ended {
        tracing::debug!(%error, "connection ended");
    }
}

/// What an over-limit connection is sent: a whole 503 response with code 010.
fn refusal_answer(failure: &Failure) -> Bytes {
    let mut body = Vec::new();
    api::write_failure(None, failure, &mut body);
    let head = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    Bytes::from([head.into_bytes(), body].concat())
}

async fn refuse_connection<T: AsyncWrite + Unpin>(mut io: T, answer: Bytes) {
    let write = async {
        io.write_all(&answer).await?;
        io.shutdown().await
    };
    // A client that does not take the answer at once loses it; the descriptor is not held.
    let _ = tokio::time::timeout(REFUSAL_WRITE_TIMEOUT, write).await;
}

/// The connections a process serves, kept by its accept loop: how many (in all and by address,
/// shared with the connection tasks, which give their slot back as they end) and each one's
/// state, scanned for the longest idle when a bound is full.
struct Slots {
    bounds: ConnectionBounds,
    counts: Arc<Mutex<SlotCounts>>,
    /// Every connection admitted, with its address; those that ended are pruned as it grows.
    admitted: Vec<(IpAddr, Arc<ConnState>)>,
    refusal: Bytes,
    address_refusal: Bytes,
}

#[derive(Default)]
struct SlotCounts {
    total: usize,
    by_address: HashMap<IpAddr, usize>,
}

impl SlotCounts {
    fn take(&mut self, address: IpAddr) {
        self.total += 1;
        *self.by_address.entry(address).or_default() += 1;
    }

    fn give_back(&mut self, address: IpAddr) {
        self.total -= 1;
        if let Some(count) = self.by_address.get_mut(&address) {
            *count -= 1;
            if *count == 0 {
                self.by_address.remove(&address);
            }
        }
    }
}

/// How the accept loop took a new connection.
enum Admitted {
    /// A slot was free.
    Free(Slot),
    /// An idle connection was closed to make room.
    Evicted(Slot),
    /// No room: the connection is sent this answer and closed.
    Refused(Bytes),
}

/// One connection's slot: given back when it drops, unless the connection was evicted (the
/// eviction gave it back, to the connection that took its place).
struct Slot {
    address: IpAddr,
    state: Arc<ConnState>,
    counts: Arc<Mutex<SlotCounts>>,
}

impl Slot {
    fn state(&self) -> Arc<ConnState> {
        Arc::clone(&self.state)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if self.state.end() {
            lock(&self.counts).give_back(self.address);
        }
    }
}

/// The counts stay consistent whatever panicked while holding them (each update is one step).
fn lock(counts: &Mutex<SlotCounts>) -> std::sync::MutexGuard<'_, SlotCounts> {
    counts.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Slots {
    fn new(bounds: ConnectionBounds) -> Slots {
        let per_address = bounds.connections_per_address_max;
        Slots {
            bounds,
            counts: Arc::default(),
            admitted: Vec::new(),
            refusal: refusal_answer(&Failure::too_many_connections(bounds.connections_max)),
            address_refusal: refusal_answer(&Failure::too_many_connections_from_address(
                per_address,
            )),
        }
    }

    /// Takes a slot for a connection from `address`: a free one, or that of the longest-idle
    /// connection in the way (of the same address when the address bound is the one full).
    fn admit(&mut self, address: IpAddr) -> Admitted {
        let (total, from_address) = {
            let counts = lock(&self.counts);
            (counts.total, counts.by_address.get(&address).copied().unwrap_or(0))
        };
        let address_full = from_address >= self.bounds.connections_per_address_max;
        let evicted = if address_full {
            self.evict_longest_idle(Some(address))
        } else if total >= self.bounds.connections_max {
            self.evict_longest_idle(None)
        } else {
            false
        };
        if (address_full || total >= self.bounds.connections_max) && !evicted {
            let refusal = if address_full { &self.address_refusal } else { &self.refusal };
            return Admitted::Refused(refusal.clone());
        }
        lock(&self.counts).take(address);
        if self.admitted.len() >= 2 * self.bounds.connections_max {
            self.admitted.retain(|(_, state)| !state.is_gone());
        }
        let state = Arc::new(ConnState::new(self.bounds));
        self.admitted.push((address, Arc::clone(&state)));
        let slot = Slot { address, state, counts: Arc::clone(&self.counts) };
        if evicted { Admitted::Evicted(slot) } else { Admitted::Free(slot) }
    }

    /// Closes the connection (of `address`, if given) that has been idle longest and gives its
    /// slot back; `false` when none is idle.
    fn evict_longest_idle(&mut self, address: Option<IpAddr>) -> bool {
        self.admitted.retain(|(_, state)| !state.is_gone());
        for _ in 0..EVICTION_TRIES_MAX {
            let candidate = self
                .admitted
                .iter()
                .filter(|(from, _)| address.is_none_or(|address| address == *from))
                .filter_map(|(from, state)| Some((state.idle_since()?, *from, state)))
                .min_by_key(|(since, _, _)| *since);
            let Some((since, from, state)) = candidate else {
                return false;
            };
            if state.evict(since) {
                lock(&self.counts).give_back(from);
                return true;
            }
        }
        false
    }
}

/// What the accept loop did with a connection, for the log.
#[derive(Clone, Copy)]
enum Accepted {
    Refused,
    Evicted,
}

/// Counts refused and evicted connections and logs them at most once per
/// [`REFUSAL_LOG_INTERVAL`].
#[derive(Default)]
struct AcceptLog {
    logged_at: Option<Instant>,
    refused: u64,
    evicted: u64,
}

impl AcceptLog {
    fn note(&mut self, accepted: Accepted, bounds: &ConnectionBounds) {
        match accepted {
            Accepted::Refused => self.refused += 1,
            Accepted::Evicted => self.evicted += 1,
        }
        if self.logged_at.is_none_or(|at| at.elapsed() >= REFUSAL_LOG_INTERVAL) {
            tracing::warn!(
                refused = self.refused,
                evicted_idle = self.evicted,
                connections_max = bounds.connections_max,
                connections_per_address_max = bounds.connections_per_address_max,
                "connection limit reached; connections refused, and idle ones closed for new \
                 ones, since the last report"
            );
            self.logged_at = Some(Instant::now());
            self.refused = 0;
            self.evicted = 0;
        }
    }
}

/// Where a connection is in its request cycle, as far as its deadline goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Phase {
    /// Before a request's first byte: the idle timeout; the connection may be evicted.
    Waiting,
    /// From a request's first byte until its header is complete: the header timeout.
    Head,
    /// From the complete header until the answer is ready: no connection deadline (the body
    /// has its own, and computing is bounded by admission).
    Request,
    /// Writing an answer: the idle timeout from its last progress.
    Writing,
}

/// A connection's phase and deadline, moved by the request service and read by [`TimedIo`],
/// and whether it is idle, read by the accept loop.
struct ConnState {
    bounds: ConnectionBounds,
    phase: AtomicU8,
    /// Nanoseconds after [`EPOCH`]; [`NO_DEADLINE`] while a request is served.
    deadline_ns: AtomicU64,
    /// Nanoseconds after [`EPOCH`] since the connection has been idle (in [`Phase::Waiting`]),
    /// or [`BUSY`], [`EVICTED`] or [`ENDED`].
    idle_since_ns: AtomicU64,
    /// Told once the accept loop has evicted the connection.
    evicted: Notify,
}

/// The origin of every connection's clock, so that idle times compare across connections.
static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

const NO_DEADLINE: u64 = u64::MAX;
/// Not idle: a request or its answer is in progress.
const BUSY: u64 = u64::MAX;
/// Closed by the accept loop, which gave its slot to a new connection.
const EVICTED: u64 = u64::MAX - 1;
/// Ended by itself; its slot is given back.
const ENDED: u64 = u64::MAX - 2;

fn now_ns() -> u64 {
    u64::try_from(EPOCH.elapsed().as_nanos()).unwrap_or(ENDED - 1)
}

// Relaxed for the phase and deadline: the service and the socket wrapper run in the same task
// (hyper polls the service inside the connection's future), so their accesses are ordered by
// program order and, when the task moves between threads, by the runtime's own
// synchronisation. The idle word is shared with the accept loop: every change to it is one
// atomic read-modify-write, so the connection and an eviction cannot both win it.
impl ConnState {
    fn new(bounds: ConnectionBounds) -> ConnState {
        let state = ConnState {
            bounds,
            phase: AtomicU8::new(Phase::Waiting as u8),
            deadline_ns: AtomicU64::new(NO_DEADLINE),
            idle_since_ns: AtomicU64::new(now_ns()),
            evicted: Notify::new(),
        };
        state.set(Phase::Waiting, Some(bounds.idle_timeout));
        state
    }

    fn phase(&self) -> Phase {
        match self.phase.load(Ordering::Relaxed) {
            0 => Phase::Waiting,
            1 => Phase::Head,
            2 => Phase::Request,
            _ => Phase::Writing,
        }
    }

    fn set(&self, phase: Phase, timeout: Option<Duration>) {
        let deadline_ns = timeout.map_or(NO_DEADLINE, |timeout| {
            let ns = (EPOCH.elapsed() + timeout).as_nanos();
            u64::try_from(ns).unwrap_or(NO_DEADLINE - 1)
        });
        self.phase.store(phase as u8, Ordering::Relaxed);
        self.deadline_ns.store(deadline_ns, Ordering::Relaxed);
    }

    fn enter_request(&self) {
        self.leave_idle();
        self.set(Phase::Request, None);
    }

    fn enter_writing(&self) {
        self.set(Phase::Writing, Some(self.bounds.idle_timeout));
    }

    /// A request's first byte arrived; `false` when the connection was evicted meanwhile.
    fn on_read(&self) -> bool {
        if self.phase() != Phase::Waiting {
            return true;
        }
        self.set(Phase::Head, Some(self.bounds.header_timeout));
        self.leave_idle()
    }

    fn on_written(&self) {
        if self.phase() == Phase::Writing {
            self.enter_writing();
        }
    }

    /// hyper flushed the socket with nothing left to write: the answer is written.
    fn on_flushed(&self) {
        if self.phase() == Phase::Writing {
            self.set(Phase::Waiting, Some(self.bounds.idle_timeout));
            // Only from busy: an evicted or ended connection stays so.
            let _ = self.idle_since_ns.compare_exchange(
                BUSY,
                now_ns(),
                Ordering::AcqRel,
                Ordering::Relaxed,
            );
        }
    }

    /// Marks the connection busy; `false` when it was evicted.
    fn leave_idle(&self) -> bool {
        let update = |since: u64| (since < ENDED).then_some(BUSY);
        match self.idle_since_ns.fetch_update(Ordering::AcqRel, Ordering::Acquire, update) {
            Ok(_) => true,
            Err(state) => state != EVICTED,
        }
    }

    /// When the connection became idle, if it is idle now.
    fn idle_since(&self) -> Option<u64> {
        let since = self.idle_since_ns.load(Ordering::Acquire);
        (since < ENDED).then_some(since)
    }

    /// Claims the connection for eviction if it is still idle since `since`, and tells it.
    fn evict(&self, since: u64) -> bool {
        let claimed = self
            .idle_since_ns
            .compare_exchange(since, EVICTED, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok();
        if claimed {
            self.evicted.notify_one();
        }
        claimed
    }

    /// Marks the connection ended; `true` when its slot is still its own to give back.
    fn end(&self) -> bool {
        self.idle_since_ns.swap(ENDED, Ordering::AcqRel) != EVICTED
    }

    /// Ended or evicted: no longer a candidate.
    fn is_gone(&self) -> bool {
        matches!(self.idle_since_ns.load(Ordering::Acquire), ENDED | EVICTED)
    }

    fn deadline(&self) -> Option<Instant> {
        match self.deadline_ns.load(Ordering::Relaxed) {
            NO_DEADLINE => None,
            ns => Some(*EPOCH + Duration::from_nanos(ns)),
        }
    }
}

/// A connection's socket whose blocked reads and writes end with `TimedOut` at the connection's
/// deadline, which closes the connection.
struct TimedIo<T> {
    io: T,
    state: Arc<ConnState>,
    /// Created on the first wait with a deadline; fires at or before the current deadline.
    timer: Option<Pin<Box<Sleep>>>,
}

impl<T> TimedIo<T> {
    /// Called when the socket would block: pending until the deadline, then the error.
    fn poll_deadline<R>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<R>> {
        let Some(deadline) = self.state.deadline() else {
            return Poll::Pending;
        };
        let timer = self.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if timer.deadline() > deadline {
            timer.as_mut().reset(deadline);
        }
        loop {
            ready!(timer.as_mut().poll(cx));
            if Instant::now() >= deadline {
                let phase = self.state.phase();
                let message = match phase {
                    Phase::Head => "header timeout",
                    Phase::Writing => "write progress timeout",
                    Phase::Waiting | Phase::Request => "idle timeout",
                };
                return Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, message)));
            }
            // The timer was set for an earlier deadline that has since moved later.
            timer.as_mut().reset(deadline);
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for TimedIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Pending => this.poll_deadline(cx),
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before && !this.state.on_read() {
                    // Evicted while idle: its slot went to a new connection, so no request
                    // may start here (the eviction closes it at once).
                    let evicted = io::Error::new(io::ErrorKind::ConnectionAborted, "evicted");
                    return Poll::Ready(Err(evicted));
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
        }
    }
}

impl<T: AsyncWrite + Unpin> TimedIo<T> {
    fn after_write(
        &mut self,
        cx: &mut Context<'_>,
        wrote: Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        match wrote {
            Poll::Pending => self.poll_deadline(cx),
            Poll::Ready(Ok(bytes)) => {
                if bytes > 0 {
                    self.state.on_written();
                }
                Poll::Ready(Ok(bytes))
            }
            Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for TimedIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let wrote = Pin::new(&mut this.io).poll_write(cx, buf);
        this.after_write(cx, wrote)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let wrote = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.after_write(cx, wrote)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // hyper flushes the socket only once its own buffer is written out.
        let flushed = ready!(Pin::new(&mut this.io).poll_flush(cx));
        if flushed.is_ok() {
            this.state.on_flushed();
        }
        Poll::Ready(flushed)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// A request body that ended because it did not arrive within the body timeout.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {} ms", .0.as_millis())]
pub struct BodyTimeout(pub Duration);

/// A request body with a deadline, counted from its first read.
struct DeadlineBody {
    inner: Incoming,
    timeout: Duration,
    started: Option<Instant>,
    /// Created on the first read that has to wait (most small bodies never wait).
    timer: Option<Pin<Box<Sleep>>>,
}

impl DeadlineBody {
    fn new(inner: Incoming, timeout: Duration) -> DeadlineBody {
        DeadlineBody { inner, timeout, started: None, timer: None }
    }
}

impl hyper::body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        let started = *this.started.get_or_insert_with(Instant::now);
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => Poll::Ready(frame.map(|frame| frame.map_err(Into::into))),
            Poll::Pending => {
                let deadline = started + this.timeout;
                let timer =
                    this.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                ready!(timer.as_mut().poll(cx));
                Poll::Ready(Some(Err(BodyTimeout(this.timeout).into())))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bounds() -> ConnectionBounds {
        ConnectionBounds {
            header_timeout: Duration::from_secs(2),
            body_timeout: Duration::from_secs(3),
            idle_timeout: Duration::from_secs(5),
            connections_max: 1,
            connections_per_address_max: 1,
        }
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap()
    }

    /// The deadline follows the phases: idle while waiting, the header timeout from a request's
    /// first byte, none while it is served, the idle timeout from each write's progress while
    /// its answer is written, and idle again once hyper flushed the whole answer.
    #[test]
    fn deadline_follows_the_phases() {
        let runtime = runtime();
        let _entered = runtime.enter();
        // `timeout` from now: between the instants taken around the call that set it.
        let set_within = |state: &ConnState, set: &dyn Fn(&ConnState), timeout: Duration| {
            let before = Instant::now();
            set(state);
            let deadline = state.deadline().unwrap();
            assert!(deadline >= before + timeout && deadline <= Instant::now() + timeout);
            deadline
        };
        let pause = || std::thread::sleep(Duration::from_millis(5));
        let fresh = set_within(
            &ConnState::new(bounds()),
            &|state| state.set(Phase::Waiting, Some(Duration::from_secs(5))),
            Duration::from_secs(5),
        );
        assert!(fresh > Instant::now(), "a new connection waits the idle timeout");
        let state = ConnState::new(bounds());
        assert_eq!(state.phase(), Phase::Waiting);
        let head = set_within(&state, &|state| assert!(state.on_read()), Duration::from_secs(2));
        assert_eq!(state.phase(), Phase::Head);
        pause();
        state.on_read();
        assert_eq!(state.deadline(), Some(head), "more header bytes do not extend it");
        state.enter_request();
        state.on_written();
        state.on_flushed();
        assert_eq!(state.deadline(), None, "a 100-continue does not arm a deadline");
        let writing = set_within(&state, &ConnState::enter_writing, Duration::from_secs(5));
        pause();
        let progressed = set_within(&state, &ConnState::on_written, Duration::from_secs(5));
        assert!(progressed > writing, "writing an answer is progress");
        assert_eq!(state.idle_since(), None, "not idle while the answer is written");
        set_within(&state, &ConnState::on_flushed, Duration::from_secs(5));
        assert_eq!(state.phase(), Phase::Waiting);
        assert!(state.idle_since().is_some(), "idle once the answer is written");
    }

    /// An idle connection can be claimed for eviction once, and then starts no request; a busy
    /// or ended one cannot be claimed, and only an unclaimed one gives its own slot back.
    #[test]
    fn only_an_idle_connection_is_evicted_and_its_slot_counted_once() {
        let _entered = runtime().enter();
        let state = ConnState::new(bounds());
        let since = state.idle_since().expect("a new connection is idle");
        assert!(state.evict(since));
        assert!(!state.evict(since), "claimed once");
        assert!(!state.on_read(), "an evicted connection starts no request");
        assert!(!state.end(), "the eviction gave its slot back");
        let busy = ConnState::new(bounds());
        let since = busy.idle_since().unwrap();
        assert!(busy.on_read());
        assert!(!busy.evict(since), "a connection with a request in progress is not evicted");
        assert!(busy.end() && busy.is_gone());
        assert!(!busy.evict(since), "nor an ended one");
    }

    /// Full slots: the longest-idle connection makes room, a busy one never does, and with
    /// none idle the new connection is refused; the address bound evicts within its address.
    #[test]
    fn full_slots_evict_the_longest_idle_connection_or_refuse() {
        let _entered = runtime().enter();
        let (a, b) = (IpAddr::from([10, 0, 0, 1]), IpAddr::from([10, 0, 0, 2]));
        let mut slots = Slots::new(ConnectionBounds { connections_max: 2, ..bounds() });
        let Admitted::Free(oldest) = slots.admit(a) else { panic!("a free slot") };
        let Admitted::Free(busy) = slots.admit(b) else { panic!("a free slot") };
        assert!(busy.state.on_read());
        assert!(matches!(slots.admit(b), Admitted::Refused(_)), "one per address, busy");
        let Admitted::Evicted(newer) = slots.admit(IpAddr::from([10, 0, 0, 3])) else {
            panic!("the idle connection makes room")
        };
        assert!(oldest.state.is_gone() && !busy.state.is_gone());
        assert!(newer.state.on_read());
        assert!(matches!(slots.admit(a), Admitted::Refused(_)), "nothing idle: refused");
        assert_eq!(lock(&slots.counts).total, 2);
        drop((oldest, busy));
        let Admitted::Free(_again) = slots.admit(a) else { panic!("an ended connection's slot") };
        assert_eq!(lock(&slots.counts).total, 2, "the evicted one was counted once");
    }

    #[test]
    fn zero_bounds_are_refused() {
        assert!(ConnectionBounds::default().check().is_ok());
        let zero = ConnectionBounds { body_timeout: Duration::ZERO, ..bounds() };
        assert!(zero.check().unwrap_err().contains("body_timeout"));
        let none = ConnectionBounds { connections_max: 0, ..bounds() };
        assert!(none.check().unwrap_err().contains("connections_max"));
        let nobody = ConnectionBounds { connections_per_address_max: 0, ..bounds() };
        assert!(nobody.check().unwrap_err().contains("connections_per_address_max"));
    }

    #[test]
    fn the_refusal_is_a_whole_503_with_code_010() {
        let answer = refusal_answer(&Failure::too_many_connections(7));
        let text = std::str::from_utf8(&answer).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 503 ") && head.contains("connection: close"));
        assert!(head.contains(&format!("content-length: {}", body.len())), "{head}");
        let json: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(json["errorCode"], "010");
        assert!(json["errorMessage"].as_str().unwrap().contains("at most 7"));
    }
}
