//! The node's shared state (configuration, store, handler slots, the workers' channel, memory
//! budgets, counters) and the commit of a batch, which the database workers (`server`) and a
//! connection committing a lone request inline (`connection`) both run.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::Instant;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

use crate::address::ConnectionsPerSource;
use crate::auth::Registrar;
use crate::config::NodeConfig;
use crate::error::{Result, io_failed};
use crate::protocol::{
    ErrorReply, FRAME_BYTES_MAX, LENGTH_PREFIX_BYTES, NodeStats, ReadMode, Reason, ReplyBody,
    Request,
};
use crate::reply_memory::{ReplyBounds, ReplyCharge};
use crate::share::{ConnectionShare, SharedBudget};
use crate::spare::Spares;
use crate::store::{Batch, Store, StoreOp};
use crate::util::{LOG_INTERVAL, RateLimitedLog, elapsed_ns};

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
    /// Where the worker answers (see the `replies` module).
    pub(crate) reply: crate::replies::ReplyTo<Committed>,
}

impl Pending {
    /// Requests this work holds.
    pub(crate) fn requests(&self) -> usize {
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
    /// Committed sends' buffers and `SendBatch` frames' vectors, for the next ones decoded
    /// (see the `spare` module).
    pub(crate) spares: Spares,
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

pub(crate) fn worker_lost() -> Committed {
    Committed {
        result: Err(ErrorReply::new(Reason::Unavailable, "database worker stopped")),
        worker_wait_ns: 0,
        db_ns: 0,
    }
}

impl crate::replies::Unanswered for Committed {
    fn unanswered() -> Committed {
        worker_lost()
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

/// The handler-slot time `requests` held their slots, from `slot_taken` to `done`, in ns (the
/// `Stats` reply's utilisation); callers sum a batch's and book it with [`book_slot_time`].
pub(crate) fn slot_time_ns(slot_taken: Instant, done: Instant, requests: u64) -> u64 {
    let held = done.saturating_duration_since(slot_taken).as_nanos();
    u64::try_from(held).unwrap_or(u64::MAX).saturating_mul(requests)
}

/// Adds `held_ns` of handler-slot time to the node's total: one atomic addition per batch.
pub(crate) fn book_slot_time(counters: &Counters, held_ns: u64) {
    counters.handler_busy_ns.fetch_add(held_ns, Ordering::Relaxed);
}

/// A store that answers fewer results than requests breaks its contract; the requests left
/// over are answered as failed rather than silently dropped.
pub(crate) fn unanswered() -> ErrorReply {
    ErrorReply::new(Reason::Unavailable, "the store gave no result for this request")
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

impl<S> Node<S> {
    /// The node's state for `config` (validated by the caller), with its hashing threads
    /// started; requests for the database workers go to `to_workers`.
    pub(crate) fn new(
        store: S,
        config: NodeConfig,
        to_workers: mpsc::Sender<Pending>,
    ) -> Result<Self> {
        let registrar = Registrar::new(
            config.hashing_threads,
            config.hashing_queue_max,
            config.registration_limits(),
        )
        .map_err(io_failed("starting the hashing threads"))?;
        let reply_bounds = ReplyBounds::new(config.content_bytes_max);
        Ok(Node {
            handler_slots: Arc::new(Semaphore::new(config.handler_slots)),
            waiting: AtomicUsize::new(0),
            batches_running: AtomicUsize::new(0),
            to_workers,
            counters: Counters::default(),
            registrar,
            // A connection's share of the rest never goes below one largest frame or reply.
            frame_memory: SharedBudget::new(
                config.frame_memory_bytes_max,
                config.connections_max,
                config.frame_memory_reserved_bytes,
                LENGTH_PREFIX_BYTES + FRAME_BYTES_MAX,
            ),
            reply_memory: SharedBudget::new(
                config.reply_memory_bytes_max,
                config.connections_max,
                config.reply_memory_reserved_bytes,
                reply_bounds.largest(),
            ),
            sources: Arc::default(),
            reply_bounds,
            reply_refusal_log: std::sync::Mutex::new(RateLimitedLog::new(LOG_INTERVAL)),
            stopping: AtomicBool::new(false),
            store_failing: AtomicBool::new(false),
            spares: Spares::new(),
            store,
            config,
        })
    }

    /// Reserves the largest reply `request` can get in the connection's account of the node's
    /// reply memory (the `reply_memory` module), or refuses it with `Busy` (counted, and
    /// logged at most once per `LOG_INTERVAL`).
    pub(crate) fn reserve_reply<'a>(
        &self,
        connection: &'a ConnectionShare<'a>,
        request: &Request,
    ) -> Result<ReplyCharge<'a>, ErrorReply> {
        self.reserve_reply_bytes(connection, self.reply_bounds.for_request(request))
    }

    /// [`Node::reserve_reply`] for a reply of at most `bytes` (a `SendBatch`'s:
    /// [`ReplyBounds::for_sends`]).
    pub(crate) fn reserve_reply_bytes<'a>(
        &self,
        connection: &'a ConnectionShare<'a>,
        bytes: usize,
    ) -> Result<ReplyCharge<'a>, ErrorReply> {
        if let Some(charge) = ReplyCharge::try_new(connection, bytes) {
            return Ok(charge);
        }
        // Relaxed: a statistic.
        self.counters.reply_memory_refused.fetch_add(1, Ordering::Relaxed);
        let log = &self.reply_refusal_log;
        let due = log.lock().unwrap_or_else(PoisonError::into_inner).note(Instant::now());
        if let Some(refused) = due {
            let bytes_max = self.config.reply_memory_bytes_max;
            tracing::warn!(refused, bytes_max, "reply memory share full; answering requests Busy");
        }
        Err(ErrorReply::new(
            Reason::Busy,
            "reply memory: this connection's share is full (read the replies owed) or the node's \
             is; retry later",
        ))
    }
}
