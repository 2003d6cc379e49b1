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
//! Bounds: in-flight requests ≤ handler slots (each holds a slot until its reply is ready), so
//! the worker channel (capacity = handler slots) never blocks a handler; waiting requests ≤
//! `wait_queue_max`; database connections ≤ `db_workers` (each worker uses one at a time).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::util::{elapsed_ns, now_us};

use anyhow::Context;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Mutex, Semaphore, mpsc, oneshot};

use crate::protocol::{
    ErrorReply, LENGTH_PREFIX_BYTES, NodeStats, ReadMode, Reason, ReplyBody, ReplyFrame, Request,
    RequestFrame, ServerTiming, check_frame_len, decode_request, encode_reply,
};
use crate::store::{Batch, Store, StoreOp};

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
}

impl Default for NodeConfig {
    fn default() -> NodeConfig {
        NodeConfig {
            handler_slots: 256,
            wait_queue_max: 4096,
            db_workers: 4,
            batch_max: 256,
            content_bytes_max: 4096,
            lease_ms_max: 3_600_000,
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
        Ok(())
    }
}

/// Counters behind the `Stats` reply. Relaxed everywhere: they are statistics read after the
/// fact, never used to order other memory.
#[derive(Default)]
struct Counters {
    sends_committed: AtomicU64,
    pops_committed: AtomicU64,
    batches_committed: AtomicU64,
    db_busy_ns: AtomicU64,
    handler_busy_ns: AtomicU64,
}

/// Handed from a handler to a database worker.
struct Pending {
    op: StoreOp,
    enqueued: Instant,
    reply: oneshot::Sender<Committed>,
}

/// What a worker hands back: the result plus where the time went.
struct Committed {
    result: Result<ReplyBody, ErrorReply>,
    worker_wait_ns: u64,
    db_ns: u64,
}

struct Node<S> {
    config: NodeConfig,
    store: S,
    handler_slots: Semaphore,
    waiting: AtomicUsize,
    to_workers: mpsc::Sender<Pending>,
    counters: Counters,
}

/// A running node; dropping it does not stop it, [`RunningNode::shutdown`] does.
pub struct RunningNode {
    pub addr: SocketAddr,
    tasks: tokio::task::JoinSet<()>,
}

impl RunningNode {
    /// Stops accepting and aborts all connection and worker tasks.
    pub async fn shutdown(mut self) {
        self.tasks.shutdown().await;
    }
}

/// Binds `listen` and serves until shut down.
pub async fn start<S: Store + Clone>(
    listen: &str,
    store: S,
    config: NodeConfig,
) -> anyhow::Result<RunningNode> {
    config.validate()?;
    let listener = TcpListener::bind(listen).await.with_context(|| format!("binding {listen}"))?;
    let addr = listener.local_addr()?;
    let (to_workers, from_handlers) = mpsc::channel(config.handler_slots);
    let node = Arc::new(Node {
        handler_slots: Semaphore::new(config.handler_slots),
        waiting: AtomicUsize::new(0),
        to_workers,
        counters: Counters::default(),
        store,
        config,
    });
    let mut tasks = tokio::task::JoinSet::new();
    let from_handlers = Arc::new(Mutex::new(from_handlers));
    for _ in 0..node.config.db_workers {
        tasks.spawn(db_worker(Arc::clone(&node), Arc::clone(&from_handlers)));
    }
    tasks.spawn(accept_loop(listener, node));
    tracing::info!(%addr, "mq node listening");
    Ok(RunningNode { addr, tasks })
}

async fn accept_loop<S: Store>(listener: TcpListener, node: Arc<Node<S>>) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let node = Arc::clone(&node);
                connections.spawn(async move {
                    if let Err(error) = serve_connection(stream, &node).await {
                        tracing::debug!(%peer, %error, "connection closed");
                    }
                });
            }
            Err(error) => {
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        while connections.try_join_next().is_some() {}
    }
}

/// Requests one connection may have in flight (read, not yet answered). Past it the node stops
/// reading that connection until the oldest reply is written, so a fast client is slowed down by
/// TCP flow control instead of growing a queue.
pub const PIPELINE_DEPTH_MAX: usize = 64;

/// A reply ready to be written.
struct Answer {
    request_id: u64,
    timing: ServerTiming,
    result: Result<ReplyBody, ErrorReply>,
    /// The connection closes after this reply (disconnect, unrecoverable framing error).
    last: bool,
}

/// A request handed to the database workers; its reply waits for the batch's commit.
struct Submitted<'a> {
    request_id: u64,
    arrived: Instant,
    slot_taken: Instant,
    is_stats: bool,
    /// Held until the reply is computed: in-flight requests ≤ handler slots.
    _slot: tokio::sync::SemaphorePermit<'a>,
    answer: oneshot::Receiver<Committed>,
}

/// What the reading half hands the writing half, in request order.
enum InFlight<'a> {
    Answered(Answer),
    Submitted(Submitted<'a>),
}

/// Serves one connection until it disconnects. Requests are pipelined: the reading half keeps
/// reading and submitting (up to [`PIPELINE_DEPTH_MAX`] in flight), the writing half writes the
/// replies in request order as their batches commit. Pipelining is what lets one connection
/// contribute many requests to one group commit; a client with one request outstanding at a time
/// sees the same behaviour as before.
async fn serve_connection<S: Store>(stream: TcpStream, node: &Node<S>) -> anyhow::Result<()> {
    stream.set_nodelay(true)?;
    let (read, write) = stream.into_split();
    let (in_flight, replies) = mpsc::channel(PIPELINE_DEPTH_MAX);
    tokio::try_join!(read_requests(read, node, in_flight), write_replies(write, node, replies))?;
    Ok(())
}

async fn read_requests<'a, S: Store>(
    read: tokio::net::tcp::OwnedReadHalf,
    node: &'a Node<S>,
    in_flight: mpsc::Sender<InFlight<'a>>,
) -> anyhow::Result<()> {
    let mut read = BufReader::new(read);
    let mut client_id: Option<u64> = None;
    let mut payload = Vec::new();
    loop {
        let mut prefix = [0u8; LENGTH_PREFIX_BYTES];
        match read.read_exact(&mut prefix).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e.into()),
        }
        let arrived = Instant::now();
        let item = match check_frame_len(prefix) {
            // The stream cannot be resynchronised without reading the oversized payload:
            // answer and close.
            Err(e) => answered(0, arrived, Err(ErrorReply::new(e.reason, e.detail)), true),
            Ok(len) => {
                payload.resize(len, 0);
                read.read_exact(&mut payload).await?;
                match decode_request(&payload) {
                    Err(e) => answered(
                        e.request_id.unwrap_or(0),
                        arrived,
                        Err(ErrorReply::new(e.reason, e.detail)),
                        false,
                    ),
                    Ok(RequestFrame { request_id, request }) => {
                        begin(node, &mut client_id, request_id, request, arrived).await
                    }
                }
            }
        };
        let last = matches!(item, InFlight::Answered(Answer { last: true, .. }));
        if in_flight.send(item).await.is_err() || last {
            return Ok(());
        }
    }
}

async fn write_replies<S: Store>(
    write: tokio::net::tcp::OwnedWriteHalf,
    node: &Node<S>,
    mut in_flight: mpsc::Receiver<InFlight<'_>>,
) -> anyhow::Result<()> {
    let mut write = BufWriter::new(write);
    let mut out = Vec::new();
    while let Some(item) = in_flight.recv().await {
        let answer = match item {
            InFlight::Answered(answer) => answer,
            InFlight::Submitted(mut submitted) => {
                let committed = match submitted.answer.try_recv() {
                    Ok(committed) => committed,
                    Err(oneshot::error::TryRecvError::Closed) => worker_lost(),
                    Err(oneshot::error::TryRecvError::Empty) => {
                        // Replies already encoded must not wait for a later batch's commit.
                        write.flush().await?;
                        (&mut submitted.answer).await.unwrap_or_else(|_| worker_lost())
                    }
                };
                complete(node, submitted, committed)
            }
        };
        out.clear();
        let frame = ReplyFrame {
            request_id: answer.request_id,
            timing: answer.timing,
            result: answer.result,
        };
        encode_reply(&frame, &mut out);
        write.write_all(&out).await?;
        if answer.last {
            break;
        }
        // Coalesce: one flush (one syscall) for all replies that are ready together.
        if in_flight.is_empty() {
            write.flush().await?;
        }
    }
    write.flush().await?;
    Ok(())
}

fn answered(
    request_id: u64,
    arrived: Instant,
    result: Result<ReplyBody, ErrorReply>,
    last: bool,
) -> InFlight<'static> {
    let timing = ServerTiming { middleware_ns: elapsed_ns(arrived), ..ServerTiming::default() };
    InFlight::Answered(Answer { request_id, timing, result, last })
}

/// Checks that need no database, then admission, then submission to the database workers.
/// A registration is awaited here: the requests read after it are checked against its id.
async fn begin<'a, S: Store>(
    node: &'a Node<S>,
    client_id: &mut Option<u64>,
    request_id: u64,
    request: Request,
    arrived: Instant,
) -> InFlight<'a> {
    if let Err(refusal) = precheck(&node.config, *client_id, &request) {
        return answered(request_id, arrived, Err(refusal), false);
    }
    if matches!(request, Request::Disconnect) {
        return answered(request_id, arrived, Ok(ReplyBody::Disconnected), true);
    }
    let Some(slot) = admit(node).await else {
        let busy = ErrorReply::new(Reason::Busy, "wait queue full; retry later");
        return answered(request_id, arrived, Err(busy), false);
    };
    let slot_taken = Instant::now();
    let is_stats = matches!(request, Request::Stats { .. });
    let is_register = matches!(request, Request::Register { .. });
    let (reply, answer) = oneshot::channel();
    let op = StoreOp { client_id: *client_id, now_us: now_us(), request };
    let pending = Pending { op, enqueued: Instant::now(), reply };
    if node.to_workers.send(pending).await.is_err() {
        return answered(request_id, arrived, worker_lost().result, false);
    }
    let mut submitted =
        Submitted { request_id, arrived, slot_taken, is_stats, _slot: slot, answer };
    if !is_register {
        return InFlight::Submitted(submitted);
    }
    let committed = (&mut submitted.answer).await.unwrap_or_else(|_| worker_lost());
    let answer = complete(node, submitted, committed);
    if let Ok(ReplyBody::Registered { client_id: id }) = answer.result {
        *client_id = Some(id);
    }
    InFlight::Answered(answer)
}

/// Turns a committed result into the reply, releasing the handler slot.
fn complete<S>(node: &Node<S>, submitted: Submitted<'_>, committed: Committed) -> Answer {
    node.counters.handler_busy_ns.fetch_add(elapsed_ns(submitted.slot_taken), Ordering::Relaxed);
    let admission_ns =
        u64::try_from((submitted.slot_taken - submitted.arrived).as_nanos()).unwrap_or(u64::MAX);
    let timing = ServerTiming {
        queue_wait_ns: admission_ns + committed.worker_wait_ns,
        db_ns: committed.db_ns,
        middleware_ns: elapsed_ns(submitted.arrived),
    };
    let mut result = committed.result;
    if let (true, Ok(ReplyBody::Stats(stats))) = (submitted.is_stats, &mut result) {
        fill_stats(node, stats);
    }
    Answer { request_id: submitted.request_id, timing, result, last: false }
}

fn worker_lost() -> Committed {
    Committed {
        result: Err(ErrorReply::new(Reason::Unavailable, "database worker stopped")),
        worker_wait_ns: 0,
        db_ns: 0,
    }
}

fn precheck(
    config: &NodeConfig,
    client_id: Option<u64>,
    request: &Request,
) -> Result<(), ErrorReply> {
    match (request, client_id) {
        (Request::Register { .. }, Some(id)) => {
            return Err(ErrorReply::new(
                Reason::AlreadyRegistered,
                format!("this connection is client {id}"),
            ));
        }
        (Request::Register { .. } | Request::Disconnect, _) | (_, Some(_)) => {}
        (_, None) => return Err(ErrorReply::new(Reason::NotRegistered, "register first")),
    }
    match request {
        Request::Send { content, .. } if content.len() > config.content_bytes_max => {
            Err(ErrorReply::new(
                Reason::TooLarge,
                format!("content of {} bytes exceeds {}", content.len(), config.content_bytes_max),
            ))
        }
        Request::Read { mode: ReadMode::Lease { lease_ms }, .. }
            if *lease_ms == 0 || *lease_ms > config.lease_ms_max =>
        {
            Err(ErrorReply::new(
                Reason::InvalidLease,
                format!("lease must be 1..={} ms", config.lease_ms_max),
            ))
        }
        _ => Ok(()),
    }
}

/// Takes a handler slot, waiting if allowed; `None` means the wait queue is full.
async fn admit<S>(node: &Node<S>) -> Option<tokio::sync::SemaphorePermit<'_>> {
    if let Ok(slot) = node.handler_slots.try_acquire() {
        return Some(slot);
    }
    // AcqRel on the counter is not needed for memory safety (the semaphore orders the slot);
    // Relaxed suffices because the counter only bounds how many tasks wait.
    if node.waiting.fetch_add(1, Ordering::Relaxed) >= node.config.wait_queue_max {
        node.waiting.fetch_sub(1, Ordering::Relaxed);
        return None;
    }
    let slot = node.handler_slots.acquire().await.ok();
    node.waiting.fetch_sub(1, Ordering::Relaxed);
    slot
}

fn fill_stats<S>(node: &Node<S>, stats: &mut NodeStats) {
    let c = &node.counters;
    stats.sends_committed = c.sends_committed.load(Ordering::Relaxed);
    stats.pops_committed = c.pops_committed.load(Ordering::Relaxed);
    stats.batches_committed = c.batches_committed.load(Ordering::Relaxed);
    stats.db_busy_ns = c.db_busy_ns.load(Ordering::Relaxed);
    stats.handler_busy_ns = c.handler_busy_ns.load(Ordering::Relaxed);
    stats.handler_slots = u32::try_from(node.config.handler_slots).unwrap_or(u32::MAX);
    stats.db_workers = u32::try_from(node.config.db_workers).unwrap_or(u32::MAX);
}

/// Takes batches off the channel and commits them; see the module docs.
async fn db_worker<S: Store>(
    node: Arc<Node<S>>,
    from_handlers: Arc<Mutex<mpsc::Receiver<Pending>>>,
) {
    let mut pending = Vec::with_capacity(node.config.batch_max);
    let mut replies = Vec::with_capacity(node.config.batch_max);
    let mut batch = Batch::default();
    loop {
        {
            // One worker collects at a time; the others are committing meanwhile, which is
            // exactly when requests accumulate into the next batch.
            let mut from_handlers = from_handlers.lock().await;
            if from_handlers.recv_many(&mut pending, node.config.batch_max).await == 0 {
                return;
            }
        }
        let started = Instant::now();
        batch.ops.clear();
        replies.clear();
        for p in pending.drain(..) {
            let waited = u64::try_from((started - p.enqueued).as_nanos()).unwrap_or(u64::MAX);
            batch.ops.push(p.op);
            replies.push((p.reply, waited));
        }
        let outcome = node.store.execute_batch(&mut batch).await;
        let db_ns = elapsed_ns(started);
        node.counters.db_busy_ns.fetch_add(db_ns, Ordering::Relaxed);
        match outcome {
            Ok(()) => {
                count_committed(&node.counters, &batch);
                for ((reply, worker_wait_ns), result) in
                    replies.drain(..).zip(batch.results.drain(..))
                {
                    let _ = reply.send(Committed { result, worker_wait_ns, db_ns });
                }
            }
            Err(error) => {
                tracing::warn!(
                    error = format!("{error:#}"),
                    ops = batch.ops.len(),
                    "batch rolled back"
                );
                for (reply, worker_wait_ns) in replies.drain(..) {
                    let result =
                        Err(ErrorReply::new(Reason::Unavailable, format!("database: {error:#}")));
                    let _ = reply.send(Committed { result, worker_wait_ns, db_ns });
                }
            }
        }
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
