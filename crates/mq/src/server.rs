//! The middleware node: a tokio listener, a bounded handler pool, a bounded wait queue in front
//! of it, and database workers that commit requests in batches (group commit).
//!
//! Request path: a connection's reading half reads a frame, decodes it, checks what needs no
//! database (registration state, sizes), takes a handler slot (or waits for one, or answers
//! `Busy` when [`NodeConfig::wait_queue_max`] requests already wait), hands the request to the
//! database workers through a channel, and goes on reading: a client may pipeline up to
//! [`PIPELINE_DEPTH_MAX`] requests, and the connection's writing half writes their replies in
//! request order as their batches commit. A worker takes everything waiting in the channel (up to
//! [`NodeConfig::batch_max`]), runs it in ONE transaction, commits, and only then releases the
//! replies. With `batch_max = 1` every request is its own transaction (batching off).
//!
//! Why pipelining matters: a batch can only hold requests that are waiting, and with one request
//! per connection a batch is at most (connections / workers) large; measured with 32 clients
//! and 4 workers on PostgreSQL, the mean batch was 5.5 requests, too small to amortise the
//! commit. With 16 requests in flight per client it was 44 (see docs/benchmarks/mq.md).
//!
//! Bounds: in-flight requests ≤ handler slots (each holds a slot until its batch commits, not
//! until its reply is written: a client that stops reading holds no slot and no worker), so the
//! worker channel (capacity = handler slots) never blocks a handler; waiting requests ≤
//! `wait_queue_max`; database connections ≤ `db_workers` (each worker uses one at a time).
//! Registrations (Argon2 hashing, then one store call) take neither: they have their own bounds
//! (the `auth` module).
//!
//! No connection can hold the node (see the `connection` module): connections ≤
//! [`NodeConfig::connections_max`], and ≤ [`NodeConfig::connections_per_address_max`] from one
//! source address (more are answered `ConnectionLimit` and closed); a connection
//! is closed when it completes no frame for [`NodeConfig::idle_timeout_ms`] with no reply owed,
//! or when a reply is not taken within [`NodeConfig::write_timeout_ms`]; frame buffers grow with
//! the bytes that arrive, within [`NodeConfig::frame_memory_bytes_max`] for the whole node; the
//! replies owed to all connections hold at most [`NodeConfig::reply_memory_bytes_max`] (a
//! request whose largest possible reply does not fit is answered `Busy` before the database
//! sees it: see the `reply_memory` module). Both memory bounds are shared fairly: part of each
//! is reserved for every connection, and one connection holds at most its share of the rest
//! (the `share` module). Registration (Argon2 hashing) has its own bounds, per node and per
//! source address (the `auth` and `address` modules). A failing `accept` is retried with a
//! growing pause and logged at most once per [`LOG_INTERVAL`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::util::elapsed_ns;

use serde::{Deserialize, Serialize};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Mutex, OwnedSemaphorePermit, Semaphore, mpsc, oneshot};

use crate::address::{ConnectionsPerSource, RegistrationLimits, source_of};
use crate::auth::Registrar;
use crate::error::{Result, io_failed};
use crate::frame::FRAME_CHUNK_BYTES;
use crate::protocol::{
    ErrorReply, NodeStats, ReadMode, Reason, ReplyBody, ReplyFrame, Request, SendOutcome, Sent,
    ServerTiming, encode_reply,
};
use crate::reply_memory::{REPLY_SMALL_BYTES_MAX, ReplyBounds};
use crate::share::SharedBudget;
use crate::store::{Batch, Store, StoreOp};

pub use crate::connection::PIPELINE_DEPTH_MAX;

/// Default of [`NodeConfig::connections_max`].
pub const CONNECTIONS_MAX_DEFAULT: usize = 1024;
/// Default of [`NodeConfig::idle_timeout_ms`].
pub const IDLE_TIMEOUT_MS_DEFAULT: u64 = 60_000;
/// Default of [`NodeConfig::write_timeout_ms`].
pub const WRITE_TIMEOUT_MS_DEFAULT: u64 = 10_000;
/// Default of [`NodeConfig::frame_memory_bytes_max`]: 64 frames of the largest size at once.
pub const FRAME_MEMORY_BYTES_MAX_DEFAULT: usize = 64 << 20;
/// Default of [`NodeConfig::reply_memory_bytes_max`]: with the default content limit, about
/// 15,000 owed message replies, or 240 connections' full pipelines.
pub const REPLY_MEMORY_BYTES_MAX_DEFAULT: usize = 64 << 20;
/// Default of [`NodeConfig::connections_per_address_max`]: half of the default connection
/// limit, so at least two addresses are needed to fill the node, while the load generator can
/// still open 512 connections from one host.
pub const CONNECTIONS_PER_ADDRESS_MAX_DEFAULT: usize = 512;
/// Default of [`NodeConfig::frame_memory_reserved_bytes`]: two frame chunks, room for a frame
/// of the default largest content (4 KiB) plus its fields; 8 MiB of the default 64 MiB budget
/// at 1,024 connections.
pub const FRAME_MEMORY_RESERVED_BYTES_DEFAULT: usize = 2 * FRAME_CHUNK_BYTES;
/// Default of [`NodeConfig::reply_memory_reserved_bytes`]: 32 small replies, or three message
/// replies of the default largest content; 16 MiB of the default 64 MiB budget at 1,024
/// connections.
pub const REPLY_MEMORY_RESERVED_BYTES_DEFAULT: usize = 16 << 10;
/// Default of [`NodeConfig::hashing_threads`]: each holds 19 MiB of Argon2 memory once used and
/// one core while hashing (tens of milliseconds per registration).
pub const HASHING_THREADS_DEFAULT: usize = 2;
/// Default of [`NodeConfig::hashing_queue_max`]: about a second of hashing work for two
/// threads.
pub const HASHING_QUEUE_MAX_DEFAULT: usize = 64;
/// Default of [`NodeConfig::registration_window_ms`].
pub const REGISTRATION_WINDOW_MS_DEFAULT: u64 = 60_000;
/// Default of [`NodeConfig::registration_attempts_per_address_max`]: about 34 per second over
/// the window, below the two default hashing threads' rate, and room for the load generator,
/// which registers every connection it opens.
pub const REGISTRATION_ATTEMPTS_PER_ADDRESS_MAX_DEFAULT: usize = 2048;
/// Default of [`NodeConfig::accounts_per_address_max`]: the load generator creates one account
/// per connection and run, so a sweep up to 512 connections from one host fits in a window.
pub const ACCOUNTS_PER_ADDRESS_MAX_DEFAULT: usize = 1024;
/// Shortest pause after a failed `accept` (out of descriptors, say); doubles per failure.
pub const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
/// Longest pause after a failed `accept`.
pub const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);
/// Failed accepts and refused connections are logged at most once per interval, with a count.
pub const LOG_INTERVAL: Duration = Duration::from_secs(5);

/// A node's limits and switches; every field has a default and a `mq serve` flag.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeConfig {
    /// Requests served concurrently (the handler pool).
    pub handler_slots: usize,
    /// Requests that may wait for a handler slot; past it the answer is `Busy`.
    pub wait_queue_max: usize,
    /// Database workers, each using one pooled connection at a time.
    pub db_workers: usize,
    /// Most requests committed in one transaction; 1 turns group commit off.
    pub batch_max: usize,
    /// Largest message content accepted.
    pub content_bytes_max: usize,
    /// Longest lease a client may ask for.
    pub lease_ms_max: u32,
    /// Connections served at once; a connection past it is answered `ConnectionLimit` and
    /// closed.
    pub connections_max: usize,
    /// A connection that completes no request frame for this long while no reply is owed to it
    /// is closed (also bounds a TLS handshake).
    pub idle_timeout_ms: u64,
    /// A reply the peer does not take (TCP window closed) within this closes its connection.
    pub write_timeout_ms: u64,
    /// Bytes all connections' frame buffers may hold together; a frame that would pass it is
    /// answered `Busy` and its connection closed.
    pub frame_memory_bytes_max: usize,
    /// Bytes all replies owed to clients (committed, not yet written) may hold together. A
    /// request whose largest possible reply does not fit is answered `Busy` before it reaches
    /// the database, so no message is dequeued whose reply could not be held.
    pub reply_memory_bytes_max: usize,
    /// Connections one source address (an IPv4 address, an IPv6 /64) may hold at once; past it
    /// `ConnectionLimit` and closed.
    pub connections_per_address_max: usize,
    /// Bytes of `frame_memory_bytes_max` set aside for each of `connections_max` connections,
    /// which other connections cannot take (see the `share` module).
    pub frame_memory_reserved_bytes: usize,
    /// Bytes of `reply_memory_bytes_max` set aside for each of `connections_max` connections,
    /// which other connections cannot take (see the `share` module).
    pub reply_memory_reserved_bytes: usize,
    /// Threads hashing registration secrets (Argon2id, 19 MiB each once used).
    pub hashing_threads: usize,
    /// Registrations that may wait for a hashing thread; past it `Busy`.
    pub hashing_queue_max: usize,
    /// The window of the per-address registration bounds, in milliseconds.
    pub registration_window_ms: u64,
    /// Registrations one source address may attempt per window; past it `Busy`, unhashed.
    pub registration_attempts_per_address_max: usize,
    /// Accounts (new names) one source address may create per window; past it a registration
    /// under a new name is `Busy` (known names still authenticate).
    pub accounts_per_address_max: usize,
    /// PostgreSQL's message table, made so when the node opens its store: `logged` (durable)
    /// or `unlogged` (no write-ahead log: a PostgreSQL crash empties the table; see
    /// docs/MQ_PROTOCOL.md, "Delivery guarantees"); unset leaves it as the database has it.
    /// SQLite stores refuse `unlogged`.
    pub message_table: Option<crate::store::MessageTable>,
}

impl Default for NodeConfig {
    fn default() -> NodeConfig {
        NodeConfig {
            // 32 connections' full pipelines ([`PIPELINE_DEPTH_MAX`] each): with 256, 32
            // pipelining clients were held to 256 requests in flight and 55–79K sends/s; with
            // 2048, 100–107K (docs/benchmarks/mq.md).
            handler_slots: 2048,
            wait_queue_max: 4096,
            db_workers: 4,
            batch_max: 1024,
            content_bytes_max: 4096,
            lease_ms_max: 3_600_000,
            connections_max: CONNECTIONS_MAX_DEFAULT,
            idle_timeout_ms: IDLE_TIMEOUT_MS_DEFAULT,
            write_timeout_ms: WRITE_TIMEOUT_MS_DEFAULT,
            frame_memory_bytes_max: FRAME_MEMORY_BYTES_MAX_DEFAULT,
            reply_memory_bytes_max: REPLY_MEMORY_BYTES_MAX_DEFAULT,
            connections_per_address_max: CONNECTIONS_PER_ADDRESS_MAX_DEFAULT,
            frame_memory_reserved_bytes: FRAME_MEMORY_RESERVED_BYTES_DEFAULT,
            reply_memory_reserved_bytes: REPLY_MEMORY_RESERVED_BYTES_DEFAULT,
            hashing_threads: HASHING_THREADS_DEFAULT,
            hashing_queue_max: HASHING_QUEUE_MAX_DEFAULT,
            registration_window_ms: REGISTRATION_WINDOW_MS_DEFAULT,
            registration_attempts_per_address_max: REGISTRATION_ATTEMPTS_PER_ADDRESS_MAX_DEFAULT,
            accounts_per_address_max: ACCOUNTS_PER_ADDRESS_MAX_DEFAULT,
            message_table: None,
        }
    }
}

impl NodeConfig {
    pub fn validate(&self) -> Result<(), crate::MqError> {
        let positive = [
            ("handler_slots", self.handler_slots),
            ("db_workers", self.db_workers),
            ("batch_max", self.batch_max),
            ("content_bytes_max", self.content_bytes_max),
            ("connections_max", self.connections_max),
            ("idle_timeout_ms", usize::try_from(self.idle_timeout_ms).unwrap_or(usize::MAX)),
            ("write_timeout_ms", usize::try_from(self.write_timeout_ms).unwrap_or(usize::MAX)),
            ("connections_per_address_max", self.connections_per_address_max),
            ("hashing_threads", self.hashing_threads),
            ("hashing_queue_max", self.hashing_queue_max),
            ("registration_window_ms", usize::try_from(self.registration_window_ms).unwrap_or(1)),
            ("registration_attempts_per_address_max", self.registration_attempts_per_address_max),
        ];
        for (name, value) in positive {
            if value == 0 {
                return Err(crate::MqError::BadInput(format!("{name} must be > 0")));
            }
        }
        if self.content_bytes_max > crate::protocol::FRAME_BYTES_MAX / 2 {
            return Err(crate::MqError::BadInput(
                "content_bytes_max must be ≤ half the frame limit".into(),
            ));
        }
        self.validate_memory()
    }

    /// Each memory budget holds every connection's reserved part plus one smallest charge
    /// beyond it, and a reserved part holds a small frame or reply.
    fn validate_memory(&self) -> Result<(), crate::MqError> {
        let bad = |detail: String| Err(crate::MqError::BadInput(detail));
        let largest_reply = ReplyBounds::new(self.content_bytes_max).largest();
        let budgets = [
            (
                "frame",
                self.frame_memory_bytes_max,
                self.frame_memory_reserved_bytes,
                FRAME_CHUNK_BYTES,
            ),
            ("reply", self.reply_memory_bytes_max, self.reply_memory_reserved_bytes, largest_reply),
        ];
        for (what, max, reserved, beyond) in budgets {
            let least = self.connections_max.saturating_mul(reserved).saturating_add(beyond);
            if max < least {
                return bad(format!(
                    "{what}_memory_bytes_max must be ≥ {least} (connections_max × \
                     {what}_memory_reserved_bytes + {beyond})"
                ));
            }
        }
        if self.frame_memory_reserved_bytes < FRAME_CHUNK_BYTES {
            return bad(format!("frame_memory_reserved_bytes must be ≥ {FRAME_CHUNK_BYTES}"));
        }
        if self.reply_memory_reserved_bytes < REPLY_SMALL_BYTES_MAX {
            return bad(format!("reply_memory_reserved_bytes must be ≥ {REPLY_SMALL_BYTES_MAX}"));
        }
        Ok(())
    }

    pub(crate) fn idle_timeout(&self) -> Duration {
        Duration::from_millis(self.idle_timeout_ms)
    }

    pub(crate) fn write_timeout(&self) -> Duration {
        Duration::from_millis(self.write_timeout_ms)
    }

    pub(crate) fn registration_limits(&self) -> RegistrationLimits {
        RegistrationLimits {
            window: Duration::from_millis(self.registration_window_ms),
            attempts_max: self.registration_attempts_per_address_max,
            accounts_max: self.accounts_per_address_max,
        }
    }
}

/// Counters behind the `Stats` reply. Relaxed everywhere: they are statistics read after the
/// fact, never used to order other memory.
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) sends_committed: AtomicU64,
    pub(crate) pops_committed: AtomicU64,
    pub(crate) batches_committed: AtomicU64,
    /// Of those, the lone requests committed by the connection that read them (an idle node,
    /// see [`Node::is_idle`]): no hand-off to a worker and back.
    pub(crate) batches_inline: AtomicU64,
    db_busy_ns: AtomicU64,
    handler_busy_ns: AtomicU64,
    pub(crate) connections_open: AtomicU64,
    pub(crate) connections_refused: AtomicU64,
    pub(crate) connections_cut_off: AtomicU64,
    pub(crate) connections_idle_closed: AtomicU64,
    pub(crate) reply_memory_refused: AtomicU64,
    /// Bytes of request frames read (length prefix included) and of replies written.
    pub(crate) request_bytes: AtomicU64,
    pub(crate) reply_bytes: AtomicU64,
    /// A request's time in the node: arrival → its reply encoded (queue wait, batch commit,
    /// waiting behind earlier replies of its connection).
    pub(crate) request_seconds: ops::BucketHistogram,
    /// A batch's transaction, begin to commit.
    pub(crate) batch_commit_seconds: ops::BucketHistogram,
}

/// What a handler hands a worker: one request, or the sends of one `SendBatch` frame (handed
/// over together: one channel message, one reply channel, one slot permit for all of them).
pub(crate) enum Work {
    One(StoreOp),
    Sends(Vec<StoreOp>),
}

/// Handed from a handler to a database worker.
pub(crate) struct Pending {
    pub(crate) work: Work,
    pub(crate) enqueued: Instant,
    pub(crate) slot_taken: Instant,
    /// The handler slots (one per request of `work`): released by the worker once the batch is
    /// committed, so a reply that waits to be written holds no slot.
    pub(crate) slot: OwnedSemaphorePermit,
    pub(crate) reply: oneshot::Sender<Committed>,
}

impl Pending {
    /// Requests this work holds.
    fn requests(&self) -> usize {
        match &self.work {
            Work::One(_) => 1,
            Work::Sends(ops) => ops.len(),
        }
    }
}

/// What a worker hands back: the result plus where the time went.
pub(crate) struct Committed {
    pub(crate) result: Result<ReplyBody, ErrorReply>,
    pub(crate) worker_wait_ns: u64,
    pub(crate) db_ns: u64,
}

pub(crate) struct Node<S> {
    pub(crate) config: NodeConfig,
    pub(crate) store: S,
    pub(crate) handler_slots: Arc<Semaphore>,
    pub(crate) waiting: AtomicUsize,
    /// Batches in the store right now (the workers' and those committed inline by a connection,
    /// see [`Node::is_idle`]).
    batches_running: AtomicUsize,
    pub(crate) to_workers: mpsc::Sender<Pending>,
    pub(crate) counters: Counters,
    pub(crate) registrar: Registrar,
    /// Frame buffers; see the `frame` and `share` modules.
    pub(crate) frame_memory: SharedBudget,
    /// Replies owed to clients; see the `reply_memory` and `share` modules.
    pub(crate) reply_memory: SharedBudget,
    /// Open connections per source address (taken by the accept loop).
    pub(crate) sources: Arc<ConnectionsPerSource>,
    pub(crate) reply_bounds: ReplyBounds,
    /// Refusals for reply memory, logged once per [`LOG_INTERVAL`]. A lock, but taken only on
    /// the refusal path.
    pub(crate) reply_refusal_log: std::sync::Mutex<RateLimitedLog>,
    /// Set when the node stops: new requests are refused (`Unavailable`), see
    /// [`RunningNode::stop`].
    pub(crate) stopping: AtomicBool,
    /// The last batch failed (the database is down or refusing): `/ready` says no until one
    /// commits.
    store_failing: AtomicBool,
}

/// A running node; dropping it does not stop it, [`RunningNode::stop`] and
/// [`RunningNode::shutdown`] do.
pub struct RunningNode {
    pub addr: SocketAddr,
    tasks: tokio::task::JoinSet<()>,
    node: Arc<dyn NodeView>,
    stop_accepting: tokio::sync::watch::Sender<bool>,
}

/// A node's running totals, for a benchmark's per-message budget; differences of two readings
/// cover what happened between them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct NodeTotals {
    /// Bytes of request frames read from clients, length prefixes included.
    pub request_bytes: u64,
    /// Bytes of replies written to clients.
    pub reply_bytes: u64,
    pub batches_committed: u64,
    /// Of `batches_committed`, those a connection committed inline (a lone request on an idle
    /// node).
    pub batches_inline: u64,
    pub sends_committed: u64,
    pub pops_committed: u64,
}

impl NodeTotals {
    /// `self - earlier`, saturating.
    pub fn since(&self, earlier: &NodeTotals) -> NodeTotals {
        NodeTotals {
            request_bytes: self.request_bytes.saturating_sub(earlier.request_bytes),
            reply_bytes: self.reply_bytes.saturating_sub(earlier.reply_bytes),
            batches_committed: self.batches_committed.saturating_sub(earlier.batches_committed),
            batches_inline: self.batches_inline.saturating_sub(earlier.batches_inline),
            sends_committed: self.sends_committed.saturating_sub(earlier.sends_committed),
            pops_committed: self.pops_committed.saturating_sub(earlier.pops_committed),
        }
    }
}

/// What a graceful stop did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StopReport {
    /// Every request taken before the stop was committed and its reply written.
    pub drained: bool,
    /// Requests not yet committed when the drain ended (0 when drained).
    pub in_flight_left: usize,
    /// Connections open when the stop began (they are closed at its end).
    pub connections_open: u64,
    pub sends_committed: u64,
    pub pops_committed: u64,
    pub elapsed: Duration,
}

impl RunningNode {
    /// Stops accepting and aborts all connection and worker tasks.
    pub async fn shutdown(mut self) {
        self.tasks.shutdown().await;
    }

    /// Stops gracefully: stops accepting, refuses new requests on open connections
    /// (`Unavailable`, "the node is stopping"), waits up to `drain_timeout` until every request
    /// taken is committed and its reply written, then closes everything. A send acknowledged
    /// before or during the stop is committed (replies follow commits), so it is there for
    /// the next node on the same database.
    pub async fn stop(mut self, drain_timeout: Duration) -> StopReport {
        let started = Instant::now();
        self.node.begin_stop();
        let _ = self.stop_accepting.send(true);
        let connections_open = self.node.counter(|c| &c.connections_open);
        let deadline = started + drain_timeout;
        while !self.node.drained() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let (drained, in_flight_left) = (self.node.drained(), self.node.requests_in_flight());
        self.tasks.shutdown().await;
        StopReport {
            drained,
            in_flight_left,
            connections_open,
            sends_committed: self.node.counter(|c| &c.sends_committed),
            pops_committed: self.node.counter(|c| &c.pops_committed),
            elapsed: started.elapsed(),
        }
    }

    /// Whether the node takes work: not stopping, and its last batch committed (a node whose
    /// database is down answers every request `Unavailable`).
    pub fn is_ready(&self) -> bool {
        self.node.is_ready()
    }

    /// The node's running totals (see [`NodeTotals`]).
    pub fn totals(&self) -> NodeTotals {
        NodeTotals {
            request_bytes: self.node.counter(|c| &c.request_bytes),
            reply_bytes: self.node.counter(|c| &c.reply_bytes),
            batches_committed: self.node.counter(|c| &c.batches_committed),
            batches_inline: self.node.counter(|c| &c.batches_inline),
            sends_committed: self.node.counter(|c| &c.sends_committed),
            pops_committed: self.node.counter(|c| &c.pops_committed),
        }
    }

    /// Adds the node's metrics to `registry` (read at scrape time; see docs/OPERATIONS.md).
    pub fn register_metrics(&self, registry: &mut ops::Registry) {
        crate::metrics::register(Arc::clone(&self.node), registry);
    }
}

/// The node without its store type, for [`RunningNode`] and the metrics.
pub(crate) trait NodeView: Send + Sync {
    fn begin_stop(&self);
    /// Requests holding or waiting for a handler slot (taken, not yet committed).
    fn requests_in_flight(&self) -> usize;
    /// Nothing taken is unanswered: no request in flight, no reply owed.
    fn drained(&self) -> bool {
        self.requests_in_flight() == 0 && self.reply_memory_bytes() == 0
    }
    fn counter(&self, which: fn(&Counters) -> &AtomicU64) -> u64;
    fn counters(&self) -> &Counters;
    /// Bytes of replies owed to clients.
    fn reply_memory_bytes(&self) -> usize;
    fn is_ready(&self) -> bool;
}

impl<S: Send + Sync + 'static> NodeView for Node<S> {
    fn begin_stop(&self) {
        self.stopping.store(true, Ordering::Relaxed);
    }

    fn requests_in_flight(&self) -> usize {
        let holding = self.config.handler_slots - self.handler_slots.available_permits();
        holding + self.waiting.load(Ordering::Relaxed)
    }

    fn counter(&self, which: fn(&Counters) -> &AtomicU64) -> u64 {
        which(&self.counters).load(Ordering::Relaxed)
    }

    fn counters(&self) -> &Counters {
        &self.counters
    }

    fn reply_memory_bytes(&self) -> usize {
        self.reply_memory.used()
    }

    fn is_ready(&self) -> bool {
        !self.stopping.load(Ordering::Relaxed) && !self.store_failing.load(Ordering::Relaxed)
    }
}

/// Binds `listen` and serves until shut down.
pub async fn start<S: Store + Clone>(
    listen: &str,
    store: S,
    config: NodeConfig,
) -> Result<RunningNode> {
    start_with_tls(listen, store, config, None).await
}

/// [`start`], with TLS on every connection when `tls` is given (see [`crate::tls`]).
pub async fn start_with_tls<S: Store + Clone>(
    listen: &str,
    store: S,
    config: NodeConfig,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> Result<RunningNode> {
    config.validate()?;
    let listener =
        TcpListener::bind(listen).await.map_err(io_failed(format!("binding {listen}")))?;
    let addr = listener.local_addr().map_err(io_failed("reading the bound address"))?;
    let (to_workers, from_handlers) = mpsc::channel(config.handler_slots);
    let node = Arc::new(Node {
        handler_slots: Arc::new(Semaphore::new(config.handler_slots)),
        waiting: AtomicUsize::new(0),
        batches_running: AtomicUsize::new(0),
        to_workers,
        counters: Counters::default(),
        registrar: Registrar::new(
            config.hashing_threads,
            config.hashing_queue_max,
            config.registration_limits(),
        )
        .map_err(io_failed("starting the hashing threads"))?,
        frame_memory: crate::frame::node_budget(&config),
        reply_memory: crate::reply_memory::node_budget(&config),
        sources: Arc::default(),
        reply_bounds: ReplyBounds::new(config.content_bytes_max),
        reply_refusal_log: std::sync::Mutex::new(RateLimitedLog::new(LOG_INTERVAL)),
        stopping: AtomicBool::new(false),
        store_failing: AtomicBool::new(false),
        store,
        config,
    });
    let mut tasks = tokio::task::JoinSet::new();
    let from_handlers = Arc::new(Mutex::new(Intake { from_handlers, carried: Vec::new() }));
    for _ in 0..node.config.db_workers {
        tasks.spawn(db_worker(Arc::clone(&node), Arc::clone(&from_handlers)));
    }
    let tls = tls.map(tokio_rustls::TlsAcceptor::from);
    let (stop_accepting, stop) = tokio::sync::watch::channel(false);
    tasks.spawn(accept_loop(listener, Arc::clone(&node), tls, stop));
    tracing::info!(%addr, "mq node listening");
    Ok(RunningNode { addr, tasks, node, stop_accepting })
}

/// Counts events and says when to log them: the first at once, then at most one line per
/// interval carrying how many happened since the last line.
pub(crate) struct RateLimitedLog {
    interval: Duration,
    last_logged: Option<Instant>,
    unlogged: u64,
}

impl RateLimitedLog {
    pub(crate) fn new(interval: Duration) -> RateLimitedLog {
        RateLimitedLog { interval, last_logged: None, unlogged: 0 }
    }

    /// Notes one event at `now`; `Some(count)` when a line is due.
    pub(crate) fn note(&mut self, now: Instant) -> Option<u64> {
        self.unlogged += 1;
        if self.last_logged.is_some_and(|last| now.duration_since(last) < self.interval) {
            return None;
        }
        self.last_logged = Some(now);
        Some(std::mem::take(&mut self.unlogged))
    }
}

/// The pause after a failed accept: doubling from ACCEPT_BACKOFF_MIN to ACCEPT_BACKOFF_MAX,
/// back to the minimum after a success.
struct AcceptBackoff {
    pause: Duration,
}

impl AcceptBackoff {
    fn failed(&mut self) -> Duration {
        let pause = self.pause;
        self.pause = (self.pause * 2).min(ACCEPT_BACKOFF_MAX);
        pause
    }

    fn succeeded(&mut self) {
        self.pause = ACCEPT_BACKOFF_MIN;
    }
}

/// Accepts until `stop` turns true, then closes the listener and keeps the connections it
/// spawned (they drain) until the node's tasks are shut down.
async fn accept_loop<S: Store>(
    listener: TcpListener,
    node: Arc<Node<S>>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut connections = tokio::task::JoinSet::new();
    let mut backoff = AcceptBackoff { pause: ACCEPT_BACKOFF_MIN };
    let mut accept_errors = RateLimitedLog::new(LOG_INTERVAL);
    let mut refusals = RateLimitedLog::new(LOG_INTERVAL);
    let mut source_refusals = RateLimitedLog::new(LOG_INTERVAL);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.wait_for(|stopped| *stopped) => break,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                let pause = backoff.failed();
                if let Some(failures) = accept_errors.note(Instant::now()) {
                    tracing::warn!(%error, failures, ?pause, "accept failing; backing off");
                }
                tokio::time::sleep(pause).await;
                continue;
            }
        };
        backoff.succeeded();
        while connections.try_join_next().is_some() {}
        if connections.len() >= node.config.connections_max {
            refuse(stream, tls.is_some(), &node.counters, "the node is at its connection limit");
            if let Some(refused) = refusals.note(Instant::now()) {
                let limit = node.config.connections_max;
                tracing::warn!(refused, limit, "connection limit reached; refusing connections");
            }
            continue;
        }
        let limit = node.config.connections_per_address_max;
        let Some(counted) = node.sources.open(source_of(peer.ip()), limit) else {
            let detail = "this address is at its connection limit";
            refuse(stream, tls.is_some(), &node.counters, detail);
            if let Some(refused) = source_refusals.note(Instant::now()) {
                tracing::warn!(refused, limit, %peer, "an address's connection limit reached");
            }
            continue;
        };
        let (node, tls) = (Arc::clone(&node), tls.clone());
        connections.spawn(async move {
            let _counted = counted;
            crate::connection::serve(stream, peer, &node, tls).await;
        });
    }
    drop(listener);
    // The open connections answer what they took (refusing anything new) until the node's
    // tasks are shut down, which drops them with this task.
    std::future::pending::<()>().await;
    drop(connections);
}

/// Answers a connection past the limit with `ConnectionLimit` (plain TCP only: a TLS client
/// could not read it before the handshake) and closes it. The socket's send buffer is empty,
/// so the one small write does not block; if it fails the peer still sees the close.
fn refuse(stream: TcpStream, tls: bool, counters: &Counters, detail: &str) {
    counters.connections_refused.fetch_add(1, Ordering::Relaxed);
    if tls {
        return;
    }
    let refusal = ErrorReply::new(Reason::ConnectionLimit, detail);
    let frame = ReplyFrame { request_id: 0, timing: ServerTiming::default(), result: Err(refusal) };
    let mut out = Vec::new();
    encode_reply(&frame, &mut out);
    let _ = stream.try_write(&out);
}

pub(crate) fn worker_lost() -> Committed {
    Committed {
        result: Err(ErrorReply::new(Reason::Unavailable, "database worker stopped")),
        worker_wait_ns: 0,
        db_ns: 0,
    }
}

pub(crate) fn fill_stats<S>(node: &Node<S>, stats: &mut NodeStats) {
    let c = &node.counters;
    stats.sends_committed = c.sends_committed.load(Ordering::Relaxed);
    stats.pops_committed = c.pops_committed.load(Ordering::Relaxed);
    stats.batches_committed = c.batches_committed.load(Ordering::Relaxed);
    stats.db_busy_ns = c.db_busy_ns.load(Ordering::Relaxed);
    stats.handler_busy_ns = c.handler_busy_ns.load(Ordering::Relaxed);
    stats.handler_slots = u32::try_from(node.config.handler_slots).unwrap_or(u32::MAX);
    stats.db_workers = u32::try_from(node.config.db_workers).unwrap_or(u32::MAX);
    stats.connections_open = c.connections_open.load(Ordering::Relaxed);
    stats.connections_refused = c.connections_refused.load(Ordering::Relaxed);
    stats.connections_cut_off = c.connections_cut_off.load(Ordering::Relaxed);
    stats.connections_idle_closed = c.connections_idle_closed.load(Ordering::Relaxed);
    stats.reply_memory_bytes = node.reply_memory.used() as u64;
    stats.reply_memory_bytes_peak = node.reply_memory.peak() as u64;
    stats.reply_memory_refused = c.reply_memory_refused.load(Ordering::Relaxed);
}

/// A request's (or a `SendBatch` frame's) place in its batch: where its reply goes and the
/// slots it releases.
struct Waiter {
    reply: oneshot::Sender<Committed>,
    /// `Some(n)`: the n sends of one `SendBatch`, answered together by one `SentBatch`.
    sends: Option<usize>,
    worker_wait_ns: u64,
    slot_taken: Instant,
    _slot: OwnedSemaphorePermit,
}

/// Takes batches off the channel and commits them; see the module docs.
async fn db_worker<S: Store>(node: Arc<Node<S>>, intake: Arc<Mutex<Intake>>) {
    let mut pending = Vec::with_capacity(node.config.batch_max);
    let mut waiters: Vec<Waiter> = Vec::with_capacity(node.config.batch_max);
    let mut batch = Batch::default();
    loop {
        let batch_max = node.config.batch_max;
        if !collect(&intake, &mut pending, batch_max).await {
            return;
        }
        let started = Instant::now();
        batch.ops.clear();
        for p in pending.drain(..) {
            let worker_wait_ns =
                u64::try_from((started - p.enqueued).as_nanos()).unwrap_or(u64::MAX);
            let sends = match p.work {
                Work::One(op) => {
                    batch.ops.push(op);
                    None
                }
                Work::Sends(mut ops) => {
                    let n = ops.len();
                    batch.ops.append(&mut ops);
                    Some(n)
                }
            };
            let (reply, slot_taken, _slot) = (p.reply, p.slot_taken, p.slot);
            waiters.push(Waiter { reply, sends, worker_wait_ns, slot_taken, _slot });
        }
        let db_ns = commit(&node, &mut batch).await;
        release(&node.counters, &mut waiters, &mut batch, db_ns);
    }
}

/// Runs `batch` in one transaction and books it (its time, the readiness flag, the committed
/// counts); a batch the store fails is answered `Unavailable`, request by request. Returns the
/// transaction's time in ns. Called by the workers and, for a lone request on an idle node, by
/// the connection that read it (`connection::begin`).
///
/// Cancelling the future (a connection that dies while its inline batch runs) leaves no
/// transaction open: the store sends a batch's statements, BEGIN to COMMIT, on its first poll
/// (`store::postgres`), or runs it on a blocking thread (`store::sqlite`); the batch then
/// commits or not as if its client had gone away while a worker ran it.
pub(crate) async fn commit<S: Store>(node: &Node<S>, batch: &mut Batch) -> u64 {
    let started = Instant::now();
    let outcome = {
        let _running = Running::new(&node.batches_running);
        node.store.execute_batch(batch).await
    };
    let db_ns = elapsed_ns(started);
    node.counters.batch_commit_seconds.record_ns(db_ns);
    node.counters.db_busy_ns.fetch_add(db_ns, Ordering::Relaxed);
    // Relaxed: a health flag; it orders nothing.
    node.store_failing.store(outcome.is_err(), Ordering::Relaxed);
    match outcome {
        Ok(()) => count_committed(&node.counters, batch),
        Err(error) => {
            let error = ops::error_chain(&error);
            tracing::warn!(error, ops = batch.ops.len(), "batch rolled back");
            batch.results.clear();
            let refusal = ErrorReply::new(Reason::Unavailable, format!("database: {error}"));
            batch.results.resize(batch.ops.len(), Err(refusal));
        }
    }
    db_ns
}

/// Counts a batch in [`Node::is_idle`]'s `batches_running` while it lives (a cancelled
/// commit is uncounted too).
struct Running<'a>(&'a AtomicUsize);

impl<'a> Running<'a> {
    fn new(running: &'a AtomicUsize) -> Running<'a> {
        // Relaxed: a hint for the inline path, which stays correct (only slower to batch)
        // whatever it reads; it orders no memory.
        running.fetch_add(1, Ordering::Relaxed);
        Running(running)
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl<S> Node<S> {
    /// No batch in the store and no work waiting for a worker: a lone request may then be
    /// committed by its connection at once, without two hand-offs to and from a worker (and
    /// their thread wake-ups). It is a hint: a worker that took work a moment ago may run its
    /// batch beside an inline one; both are ordinary concurrent transactions, and a
    /// connection commits inline only with nothing of its own in flight, so its requests keep
    /// their order.
    pub(crate) fn is_idle(&self) -> bool {
        let queued = self.to_workers.max_capacity() - self.to_workers.capacity();
        queued == 0 && self.batches_running.load(Ordering::Relaxed) == 0
    }
}

/// Adds the time `requests` held their handler slots (from `slot_taken` to `done`) to the
/// node's handler-busy total, for the `Stats` reply's utilisation.
pub(crate) fn book_slot_time(
    counters: &Counters,
    slot_taken: Instant,
    done: Instant,
    requests: u64,
) {
    let held = done.saturating_duration_since(slot_taken).as_nanos();
    let held = u64::try_from(held).unwrap_or(u64::MAX).saturating_mul(requests);
    counters.handler_busy_ns.fetch_add(held, Ordering::Relaxed);
}

/// Where the workers take their work: the handlers' channel, and the work the last collection
/// took beyond its batch (the next collection, by whichever worker, takes it first, so work
/// keeps its arrival order across batches).
struct Intake {
    from_handlers: mpsc::Receiver<Pending>,
    carried: Vec<Pending>,
}

/// Fills `pending` with the next batch's work: what the last collection carried over, then
/// (waiting for it when there is nothing else) whatever waits in the channel, until the batch
/// holds `batch_max` requests. A `SendBatch` frame's sends are never split, so a batch passes
/// `batch_max` by at most the sends of the frame that crosses it; work taken beyond that is
/// carried over. `false` once the channel is closed and nothing is left.
async fn collect(intake: &Mutex<Intake>, pending: &mut Vec<Pending>, batch_max: usize) -> bool {
    // One worker collects at a time; the others are committing meanwhile, which is exactly
    // when requests accumulate into the next batch.
    let mut intake = intake.lock().await;
    let Intake { from_handlers, carried } = &mut *intake;
    pending.append(carried);
    let mut requests: usize = pending.iter().map(Pending::requests).sum();
    while requests < batch_max && (pending.is_empty() || !from_handlers.is_empty()) {
        let from = pending.len();
        // Each piece of work holds at least one request, so this never takes too few.
        if from_handlers.recv_many(pending, batch_max - requests).await == 0 {
            return !pending.is_empty();
        }
        requests += pending[from..].iter().map(Pending::requests).sum::<usize>();
    }
    while let Some(last) = pending.last().map(Pending::requests) {
        if requests - last < batch_max {
            break;
        }
        requests -= last;
        carried.extend(pending.pop());
    }
    // Popped newest first: the carried work keeps its arrival order.
    carried.reverse();
    true
}

/// Hands each request (or `SendBatch` frame) of a finished batch its result and frees its
/// handler slots.
fn release(counters: &Counters, waiters: &mut Vec<Waiter>, batch: &mut Batch, db_ns: u64) {
    let done = Instant::now();
    let mut results = batch.results.drain(..);
    for waiter in waiters.drain(..) {
        book_slot_time(counters, waiter.slot_taken, done, waiter.sends.unwrap_or(1) as u64);
        let result = match waiter.sends {
            None => results.next().unwrap_or_else(|| Err(unanswered())),
            Some(n) => {
                let outcomes = results.by_ref().take(n).map(send_outcome).collect::<Vec<_>>();
                if outcomes.len() == n {
                    Ok(ReplyBody::SentBatch(outcomes))
                } else {
                    Err(unanswered())
                }
            }
        };
        let committed = Committed { result, worker_wait_ns: waiter.worker_wait_ns, db_ns };
        // A connection that has gone away dropped its receiver; nothing waits for this reply.
        let _ = waiter.reply.send(committed);
    }
}

/// A store that answers fewer results than requests breaks its contract; the requests left
/// over are answered as failed rather than silently dropped.
pub(crate) fn unanswered() -> ErrorReply {
    ErrorReply::new(Reason::Unavailable, "the store gave no result for this request")
}

/// A batched send's result as its `SentBatch` outcome.
fn send_outcome(result: Result<ReplyBody, ErrorReply>) -> SendOutcome {
    match result {
        Ok(ReplyBody::Sent { message_id, arrived_us }) => Ok(Sent { message_id, arrived_us }),
        Ok(other) => Err(ErrorReply::new(
            Reason::Unavailable,
            format!("the store answered a send with {other:?}"),
        )),
        Err(refused) => Err(refused),
    }
}

fn count_committed(counters: &Counters, batch: &Batch) {
    let (mut sends, mut pops) = (0, 0);
    for (op, result) in batch.ops.iter().zip(&batch.results) {
        match (&op.request, result) {
            (Request::Send { .. }, Ok(_)) => sends += 1,
            (Request::Read { mode: ReadMode::Pop, .. } | Request::Ack { .. }, Ok(_)) => pops += 1,
            _ => {}
        }
    }
    counters.sends_committed.fetch_add(sends, Ordering::Relaxed);
    counters.pops_committed.fetch_add(pops, Ordering::Relaxed);
    counters.batches_committed.fetch_add(1, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_of_events_is_logged_once_per_interval_with_its_count() {
        let mut log = RateLimitedLog::new(Duration::from_secs(5));
        let t0 = Instant::now();
        assert_eq!(log.note(t0), Some(1), "the first event is logged at once");
        let burst: Vec<_> = (1..=1000).map(|ms| log.note(t0 + Duration::from_millis(ms))).collect();
        assert!(burst.iter().all(Option::is_none), "no line within the interval");
        assert_eq!(log.note(t0 + Duration::from_secs(5)), Some(1001), "one line, with the count");
        assert_eq!(log.note(t0 + Duration::from_secs(6)), None);
    }

    #[test]
    fn accept_backoff_doubles_to_its_cap_and_resets_on_success() {
        let mut backoff = AcceptBackoff { pause: ACCEPT_BACKOFF_MIN };
        let pauses: Vec<_> = (0..10).map(|_| backoff.failed()).collect();
        assert_eq!(pauses[0], ACCEPT_BACKOFF_MIN);
        assert_eq!(pauses[1], ACCEPT_BACKOFF_MIN * 2);
        assert!(pauses.windows(2).all(|w| w[1] >= w[0]));
        assert_eq!(*pauses.last().unwrap(), ACCEPT_BACKOFF_MAX);
        backoff.succeeded();
        assert_eq!(backoff.failed(), ACCEPT_BACKOFF_MIN);
    }

    #[test]
    fn new_limits_are_validated() {
        let bad = [
            NodeConfig { connections_max: 0, ..NodeConfig::default() },
            NodeConfig { idle_timeout_ms: 0, ..NodeConfig::default() },
            NodeConfig { write_timeout_ms: 0, ..NodeConfig::default() },
            NodeConfig { frame_memory_bytes_max: 100, ..NodeConfig::default() },
            NodeConfig { reply_memory_bytes_max: 4096, ..NodeConfig::default() },
            NodeConfig { connections_per_address_max: 0, ..NodeConfig::default() },
            NodeConfig { hashing_threads: 0, ..NodeConfig::default() },
            NodeConfig { hashing_queue_max: 0, ..NodeConfig::default() },
            NodeConfig { registration_window_ms: 0, ..NodeConfig::default() },
            NodeConfig { registration_attempts_per_address_max: 0, ..NodeConfig::default() },
            NodeConfig { frame_memory_reserved_bytes: 100, ..NodeConfig::default() },
            NodeConfig { reply_memory_reserved_bytes: 100, ..NodeConfig::default() },
            // Every connection's reserved part must fit, with room beyond it.
            NodeConfig { frame_memory_bytes_max: 8 << 20, ..NodeConfig::default() },
            NodeConfig { reply_memory_reserved_bytes: 64 << 10, ..NodeConfig::default() },
        ];
        for config in bad {
            assert!(config.validate().is_err(), "{config:?}");
        }
        NodeConfig::default().validate().unwrap();
    }
}
