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
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Mutex, OwnedSemaphorePermit, mpsc};

use crate::address::source_of;
use crate::error::{MqError, Result, io_failed};
use crate::node::{
    Committed, Counters, Node, NodeView, Pending, Work, book_slot_time, commit, slot_time_ns,
    unanswered,
};
use crate::protocol::{
    ErrorReply, Reason, ReplyBody, ReplyFrame, SendOutcome, Sent, ServerTiming, encode_reply,
};
use crate::store::{Batch, Store};
use crate::util::RateLimitedLog;

pub use crate::config::*;
pub use crate::connection::PIPELINE_DEPTH_MAX;
pub use crate::util::LOG_INTERVAL;

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

/// The runtime a node's tasks run on: its threads are the node's `io_threads` (name them or
/// set more before `build`). `mq serve`, `mq-node` and `mq bench` all start the node on one.
pub fn node_runtime(config: &NodeConfig) -> tokio::runtime::Builder {
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    runtime.worker_threads(config.io_threads).enable_all();
    runtime
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
    if config.busy_poll {
        busy_poll_fits()?;
    }
    let listener =
        TcpListener::bind(listen).await.map_err(io_failed(format!("binding {listen}")))?;
    let addr = listener.local_addr().map_err(io_failed("reading the bound address"))?;
    let (to_workers, from_handlers) = mpsc::channel(config.handler_slots);
    let node = Arc::new(Node::new(store, config, to_workers)?);
    let mut tasks = tokio::task::JoinSet::new();
    let from_handlers = Arc::new(Mutex::new(Intake { from_handlers, carried: Vec::new() }));
    for _ in 0..node.config.db_workers {
        tasks.spawn(db_worker(Arc::clone(&node), Arc::clone(&from_handlers)));
    }
    let tls = tls.map(tokio_rustls::TlsAcceptor::from);
    let (stop_accepting, stop) = tokio::sync::watch::channel(false);
    tasks.spawn(accept_loop(listener, Arc::clone(&node), tls, stop));
    if node.config.busy_poll {
        tasks.spawn(poll_while_idle());
    }
    tracing::info!(%addr, "mq node listening");
    Ok(RunningNode { addr, tasks, node, stop_accepting })
}

/// CPUs a busy-polling node needs: one for the thread that polls, one for everything that
/// sleeps (the hashing threads, the database on the same host, the OS).
pub const BUSY_POLL_CPUS_MIN: usize = 2;

/// Refuses `busy_poll` on a host (affinity mask, cgroup quota) that gives fewer than
/// [`BUSY_POLL_CPUS_MIN`] CPUs: the polling thread would take the only one.
fn busy_poll_fits() -> Result<()> {
    let usable_cpus = std::thread::available_parallelism().map_or(1, |cpus| cpus.get());
    if usable_cpus >= BUSY_POLL_CPUS_MIN {
        return Ok(());
    }
    Err(MqError::BadInput(format!(
        "busy_poll needs {BUSY_POLL_CPUS_MIN} usable CPUs (one polls, one for everything that \
         sleeps); this host gives {usable_cpus}: run without --busy-poll"
    )))
}

/// With `busy_poll`: keeps the node's one I/O thread turning. While a yielded task waits,
/// tokio looks at the sockets and timers with a zero timeout instead of sleeping in
/// `epoll_wait`, so a request or a database reply is read on the next turn, without the
/// thread's wake-up (two per lone request: about 40 µs of a lone send's p50 on this VM;
/// docs/benchmarks/mq.md, "Busy polling"). Ends when the node's tasks are shut down.
async fn poll_while_idle() {
    loop {
        tokio::task::yield_now().await;
    }
}

/// Shortest pause after a failed `accept` (out of descriptors, say); doubles per failure.
pub const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);

/// Longest pause after a failed `accept`.
pub const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

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

/// A request's (or a `SendBatch` frame's) place in its batch: where its reply goes and the
/// slots it releases.
struct Waiter {
    reply: crate::replies::ReplyTo<Committed>,
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
                    node.spares.op_lists.give_back(ops);
                    Some(n)
                }
            };
            let (reply, slot_taken, _slot) = (p.reply, p.slot_taken, p.slot);
            waiters.push(Waiter { reply, sends, worker_wait_ns, slot_taken, _slot });
        }
        let db_ns = commit(&node, &mut batch).await;
        release(&node, &mut waiters, &mut batch, db_ns);
        node.spares.sends.give_back(&mut batch.ops);
    }
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
fn release<S>(node: &Node<S>, waiters: &mut Vec<Waiter>, batch: &mut Batch, db_ns: u64) {
    let done = Instant::now();
    let mut held_ns = 0u64;
    let mut results = batch.results.drain(..);
    for waiter in waiters.drain(..) {
        let requests = waiter.sends.unwrap_or(1) as u64;
        held_ns = held_ns.saturating_add(slot_time_ns(waiter.slot_taken, done, requests));
        let result = match waiter.sends {
            None => results.next().unwrap_or_else(|| Err(unanswered())),
            Some(n) => {
                let mut outcomes = node.spares.outcome_lists.take();
                outcomes.extend(results.by_ref().take(n).map(send_outcome));
                if outcomes.len() == n {
                    Ok(ReplyBody::SentBatch(outcomes))
                } else {
                    Err(unanswered())
                }
            }
        };
        let committed = Committed { result, worker_wait_ns: waiter.worker_wait_ns, db_ns };
        waiter.reply.send(committed);
    }
    book_slot_time(&node.counters, held_ns);
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
