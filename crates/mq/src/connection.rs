//! One client connection: a reading half that reads frames, checks and admits requests and
//! submits them to the database workers, and a writing half that writes the replies in request
//! order as their batches commit.
//!
//! Why no connection can hold the node:
//! - a request's handler slot is released when its batch commits (by the worker), not when its
//!   reply is written, so a client that stops reading keeps no slot and no worker;
//! - the replies owed to a connection form a bounded queue ([`PIPELINE_DEPTH_MAX`] entries):
//!   when it is full the node stops reading the connection (TCP flow control slows the client);
//!   a reply the client does not take within the write timeout closes the connection, counted
//!   as cut off and logged with the reason;
//! - the frame buffer grows with the bytes that arrive, within the node-wide budget
//!   ([`crate::frame`]), of which each connection has a reserved part and may hold at most a
//!   share of the rest ([`crate::share`]); before it registers, a connection may send no frame
//!   longer than the largest Register ([`PRE_REGISTRATION_FRAME_BYTES_MAX`]), so an
//!   unauthenticated stranger never holds more than its reserved part;
//! - the replies owed (committed, not yet written) hold node memory within a node-wide budget
//!   too: a request is admitted only once its largest possible reply is reserved, and is
//!   otherwise answered `Busy` before anything is dequeued (the `reply_memory` module); the
//!   reservation shrinks to the encoded reply and is released once the reply is written; each
//!   connection has a reserved part of that budget and may hold at most a share of the rest,
//!   so clients that stop reading their large replies leave every other client its small
//!   requests and a share of the large ones;
//! - a connection registers at most once at a time: the next frame is read only once the
//!   registration is answered (the `auth` module bounds registrations per address and node);
//! - a connection that completes no frame within the idle timeout while no reply is owed to it
//!   is closed (this also ends a frame trickled in too slowly, and a stalled TLS handshake);
//! - a connection that has not registered within the idle timeout of its first byte is closed
//!   however often it sends: an unregistered stranger holds a connection slot no longer.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, mpsc};

use crate::address::source_of;
use crate::config::NodeConfig;
use crate::frame::{FRAME_BUFFER_KEEP_BYTES, FrameBuffer, FrameError};
use crate::node::{
    Committed, Counters, Node, Pending, Work, book_slot_time, commit, fill_stats, slot_time_ns,
    unanswered, worker_lost,
};
use crate::protocol::{
    ErrorReply, FRAME_BYTES_MAX, IncomingFrame, LENGTH_PREFIX_BYTES, PROTOCOL_VERSION, ReadMode,
    Reason, ReplyBody, ReplyFrame, Request, RequestFrame, Secret, SendBatchFrame, SendOutcome,
    ServerTiming, decode_frame_reusing, encode_reply_as, error_reply_version,
};
use crate::replies::{Inbox, Outbox};
use crate::reply_memory::ReplyCharge;
use crate::share::ConnectionShare;
use crate::store::{Batch, Store, StoreOp};
use crate::util::{elapsed_ns, now_us};

/// Requests one connection may have in flight (read, not yet answered). Past it the node stops
/// reading that connection until the oldest reply is written, so a fast client is slowed down by
/// TCP flow control instead of growing a queue.
pub const PIPELINE_DEPTH_MAX: usize = 64;

/// Requests one connection may have with the database workers at once: its pipeline, the one
/// the writer waits for and the one the reader is handing over (the `replies` module's table).
const REPLIES_OUTSTANDING_MAX: usize = PIPELINE_DEPTH_MAX + 2;
/// Longest frame payload a connection may send before it has registered, in bytes: room for the
/// largest Register (a 128-byte name and a 1,024-byte secret). Not configurable: it follows from
/// the protocol's limits. A longer length prefix is answered `TooLarge` and the connection
/// closed, so a stranger's frame buffer never grows past its reserved part of frame memory.
pub const PRE_REGISTRATION_FRAME_BYTES_MAX: usize = 2048;

/// Counts a connection as open for as long as its task lives.
pub(crate) struct OpenConnection<'a>(&'a AtomicU64);

impl OpenConnection<'_> {
    pub(crate) fn new(counters: &Counters) -> OpenConnection<'_> {
        // Relaxed: a statistic (the limit is enforced by the accept loop's own count).
        counters.connections_open.fetch_add(1, Ordering::Relaxed);
        OpenConnection(&counters.connections_open)
    }
}

impl Drop for OpenConnection<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Why the node ended a connection.
#[derive(Debug, thiserror::Error)]
enum Closed {
    #[error("idle past the idle timeout")]
    Idle,
    #[error("not registered within the idle timeout")]
    NotRegistered,
    #[error("a reply was not taken within the write timeout")]
    WriteTimeout,
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Serves one accepted connection until it ends, then counts and logs why it ended.
pub(crate) async fn serve<S: Store>(
    stream: TcpStream,
    peer: SocketAddr,
    node: &Node<S>,
    tls: Option<tokio_rustls::TlsAcceptor>,
) {
    let _open = OpenConnection::new(&node.counters);
    let outcome = match (stream.set_nodelay(true), tls) {
        (Err(e), _) => Err(Closed::Io(e)),
        (Ok(()), None) => {
            let (read, write) = stream.into_split();
            serve_halves(read, write, peer, node).await
        }
        (Ok(()), Some(acceptor)) => {
            match tokio::time::timeout(node.config.idle_timeout(), acceptor.accept(stream)).await {
                Err(_) => Err(Closed::Idle),
                Ok(Err(e)) => Err(Closed::Io(e)),
                Ok(Ok(stream)) => {
                    let (read, write) = tokio::io::split(stream);
                    serve_halves(read, write, peer, node).await
                }
            }
        }
    };
    let counters = &node.counters;
    match outcome {
        Ok(()) => tracing::info!(%peer, "connection closed by the client"),
        Err(Closed::Idle) => {
            counters.connections_idle_closed.fetch_add(1, Ordering::Relaxed);
            tracing::info!(%peer, timeout_ms = node.config.idle_timeout_ms, "closed an idle connection");
        }
        Err(Closed::NotRegistered) => {
            counters.connections_idle_closed.fetch_add(1, Ordering::Relaxed);
            let timeout_ms = node.config.idle_timeout_ms;
            tracing::info!(%peer, timeout_ms, "closed a connection that did not register in time");
        }
        Err(Closed::WriteTimeout) => {
            counters.connections_cut_off.fetch_add(1, Ordering::Relaxed);
            let timeout_ms = node.config.write_timeout_ms;
            tracing::warn!(%peer, timeout_ms, "cut off a connection that does not take its replies");
        }
        Err(Closed::Io(error)) => tracing::debug!(%peer, %error, "connection failed"),
    }
}

async fn serve_halves<S: Store>(
    read: impl AsyncRead + Unpin,
    write: impl AsyncWrite + Unpin,
    peer: SocketAddr,
    node: &Node<S>,
) -> Result<(), Closed> {
    // Declared before the channel, whose queued replies hold charges against it.
    let open = &node.counters.connections_open;
    let shares = (node.frame_memory.connection(open), node.reply_memory.connection(open));
    let (in_flight, replies) = mpsc::channel(PIPELINE_DEPTH_MAX);
    // Requests read whose replies are not written yet. Relaxed: both halves run in this one
    // task, so the count orders nothing; it only tells the reader whether the client waits.
    let owed = AtomicUsize::new(0);
    let (outbox, inbox) = crate::replies::channel(REPLIES_OUTSTANDING_MAX);
    tokio::try_join!(
        read_requests(read, peer, (node, &shares.0, &shares.1), (&owed, &outbox), in_flight),
        write_replies(write, node, (&owed, inbox), replies)
    )?;
    Ok(())
}

/// A reply ready to be written.
struct Answer {
    request_id: u64,
    timing: ServerTiming,
    result: Result<ReplyBody, ErrorReply>,
    /// The connection closes after this reply (disconnect, unrecoverable framing error).
    last: bool,
    /// The protocol version stamped on the reply (an older one only for error replies to old
    /// clients; see `protocol::error_reply_version`).
    version: u8,
}

/// A request (or a `SendBatch` frame) handed to the database workers; its reply waits for the
/// batch's commit.
struct Submitted<'a> {
    request_id: u64,
    arrived: Instant,
    slot_taken: Instant,
    is_stats: bool,
    answer: Outcome,
    /// The node's reply memory held for the reply until it is written.
    charge: ReplyCharge<'a>,
    /// A `SendBatch` frame: its sends refused before the database (position in the frame, why),
    /// to be answered among the committed outcomes. `None` for one request.
    refused_sends: Option<Vec<(usize, ErrorReply)>>,
    /// Places in the connection's pipeline: 1, or a `SendBatch`'s sends.
    places: usize,
}

/// Where a submitted request's result comes from.
enum Outcome {
    /// A worker commits it and answers it under this number (see the `replies` module).
    Worker(u64),
    /// Committed already, inline by this connection (see [`Node::is_idle`]); taken once.
    Ready(Option<Committed>),
}

/// What the reading half hands the writing half, in request order.
enum InFlight<'a> {
    Answered(Answer),
    Submitted(Submitted<'a>),
    /// A further pipeline place taken by the `SendBatch` before it (one per send after the
    /// first), so the channel's capacity bounds a connection's requests, not its frames.
    Place,
}

impl InFlight<'_> {
    fn places(&self) -> usize {
        match self {
            InFlight::Submitted(submitted) => submitted.places,
            InFlight::Answered(_) | InFlight::Place => 1,
        }
    }
}

async fn read_requests<'a, S: Store>(
    read: impl AsyncRead + Unpin,
    peer: SocketAddr,
    (node, frame_share, reply_share): (&'a Node<S>, &ConnectionShare<'_>, &'a ConnectionShare<'a>),
    (owed, outbox): (&AtomicUsize, &Outbox<Committed>),
    in_flight: mpsc::Sender<InFlight<'a>>,
) -> Result<(), Closed> {
    let mut read = BufReader::new(read);
    let mut frames = FrameBuffer::new(frame_share);
    let mut client_id: Option<u64> = None;
    // The batch this connection commits its lone requests in on an idle node, reused.
    let mut inline = Batch::default();
    let register_by = Instant::now() + node.config.idle_timeout();
    loop {
        frames.set_len_max(match client_id {
            None => PRE_REGISTRATION_FRAME_BYTES_MAX,
            Some(_) => FRAME_BYTES_MAX,
        });
        let wait = match client_id {
            None => register_by.saturating_duration_since(Instant::now()),
            Some(_) => node.config.idle_timeout(),
        };
        if wait.is_zero() {
            return Err(Closed::NotRegistered);
        }
        let received = match tokio::time::timeout(wait, frames.next_frame(&mut read)).await {
            Ok(received) => received,
            Err(_) if client_id.is_none() => return Err(Closed::NotRegistered),
            // Replies are still owed: the client is waiting for them, not idle. (The
            // writing half's timeout covers a client that does not take them.)
            Err(_) if owed.load(Ordering::Relaxed) > 0 => continue,
            Err(_) => return Err(Closed::Idle),
        };
        let arrived = Instant::now();
        let item = match received {
            Ok(()) => {
                // Relaxed: the count is this task's own (both halves run in it).
                let inline = (owed.load(Ordering::Relaxed) == 0).then_some(&mut inline);
                let context = (node, reply_share, peer, outbox);
                let item = on_frame(context, (&mut client_id, inline), frames.payload(), arrived);
                let item = item.await;
                frames.consume();
                item
            }
            Err(error) => match on_frame_error(node, peer, error, arrived)? {
                Some(item) => item,
                None => return Ok(()),
            },
        };
        if !hand_over(item, owed, &in_flight).await {
            return Ok(());
        }
    }
}

/// Decodes a frame and begins its request(s) (see [`begin`], [`begin_sends`]); a frame that
/// does not decode is answered with the decoder's reason.
async fn on_frame<'a, S: Store>(
    (node, reply_share, peer, outbox): (
        &'a Node<S>,
        &'a ConnectionShare<'a>,
        SocketAddr,
        &Outbox<Committed>,
    ),
    (client_id, inline): (&mut Option<u64>, Option<&mut Batch>),
    payload: &[u8],
    arrived: Instant,
) -> InFlight<'a> {
    let frame_bytes = (payload.len() + LENGTH_PREFIX_BYTES) as u64;
    node.counters.request_bytes.fetch_add(frame_bytes, Ordering::Relaxed);
    match decode_frame_reusing(payload, &mut &node.spares) {
        Err(e) => {
            // An empty payload has no version byte: answer in this version.
            let version = payload.first().copied().map_or(PROTOCOL_VERSION, error_reply_version);
            let refusal = Err(ErrorReply::new(e.reason, e.detail));
            let mut item = answered(e.request_id.unwrap_or(0), arrived, refusal, false);
            if let InFlight::Answered(answer) = &mut item {
                answer.version = version;
            }
            item
        }
        Ok(IncomingFrame::One(RequestFrame { request_id, request })) => {
            let context = (node, reply_share, peer, outbox);
            begin(context, (client_id, inline), request_id, request, arrived).await
        }
        Ok(IncomingFrame::Sends(batch)) => {
            begin_sends((node, reply_share, outbox), *client_id, batch, arrived).await
        }
    }
}

/// The answer to a frame that could not be read, `None` when the client closed the stream, an
/// error when the stream failed.
fn on_frame_error<'a, S>(
    node: &Node<S>,
    peer: SocketAddr,
    error: FrameError,
    arrived: Instant,
) -> Result<Option<InFlight<'a>>, Closed> {
    Ok(match error {
        FrameError::Closed | FrameError::ClosedInFrame { .. } => None,
        FrameError::Io(e) => return Err(e.into()),
        // The stream cannot be resynchronised without reading the oversized payload:
        // answer and close.
        FrameError::TooLarge(e) => {
            Some(answered(0, arrived, Err(ErrorReply::new(e.reason, e.detail)), true))
        }
        FrameError::NodeMemory => {
            node.counters.connections_cut_off.fetch_add(1, Ordering::Relaxed);
            let bytes_max = node.config.frame_memory_bytes_max;
            tracing::warn!(%peer, bytes_max, "cut off a connection: frame memory share full");
            let detail = "frame memory: this connection's share or the node's is full";
            Some(answered(0, arrived, Err(ErrorReply::new(Reason::Busy, detail)), true))
        }
    })
}

/// Hands `item` (and the further pipeline places it takes) to the writing half; `false` when
/// the connection ends with it.
async fn hand_over<'a>(
    item: InFlight<'a>,
    owed: &AtomicUsize,
    in_flight: &mpsc::Sender<InFlight<'a>>,
) -> bool {
    let last = matches!(item, InFlight::Answered(Answer { last: true, .. }));
    let places = item.places();
    owed.fetch_add(places, Ordering::Relaxed);
    if in_flight.send(item).await.is_err() || last {
        return false;
    }
    for _ in 1..places {
        if in_flight.send(InFlight::Place).await.is_err() {
            return false;
        }
    }
    true
}

/// Runs `io` within the write timeout.
async fn bounded(
    limit: Duration,
    io: impl std::future::Future<Output = std::io::Result<()>>,
) -> Result<(), Closed> {
    // `timeout` polls `io` first: a write that completes at once arms no timer.
    tokio::time::timeout(limit, io).await.map_err(|_| Closed::WriteTimeout)?.map_err(Closed::Io)
}

async fn write_replies<'a, S: Store>(
    write: impl AsyncWrite + Unpin,
    node: &'a Node<S>,
    (owed, mut inbox): (&AtomicUsize, Inbox<Committed>),
    mut in_flight: mpsc::Receiver<InFlight<'a>>,
) -> Result<(), Closed> {
    let limit = node.config.write_timeout();
    let mut write = BufWriter::new(write);
    let mut out = Vec::new();
    while let Some(item) = in_flight.recv().await {
        let (answer, mut charge) = match item {
            InFlight::Place => {
                owed.fetch_sub(1, Ordering::Relaxed);
                if in_flight.is_empty() {
                    bounded(limit, write.flush()).await?;
                }
                continue;
            }
            InFlight::Answered(answer) => (answer, None),
            InFlight::Submitted(mut submitted) => {
                let committed = match &mut submitted.answer {
                    Outcome::Ready(committed) => committed.take().unwrap_or_else(worker_lost),
                    Outcome::Worker(number) => match inbox.try_take(*number) {
                        Some(committed) => committed,
                        None => {
                            // Replies already encoded must not wait for a later batch's commit.
                            bounded(limit, write.flush()).await?;
                            inbox.take(*number).await
                        }
                    },
                };
                (complete(node, &mut submitted, committed), Some(submitted.charge))
            }
        };
        out.clear();
        let frame = ReplyFrame {
            request_id: answer.request_id,
            timing: answer.timing,
            result: answer.result,
        };
        encode_reply_as(&frame, answer.version, &mut out);
        // From here the reply exists only as its encoding, which is what stays charged.
        if let Ok(ReplyBody::SentBatch(outcomes)) = frame.result {
            node.spares.outcome_lists.give_back(outcomes);
        }
        if let Some(charge) = &mut charge {
            charge.settle(out.len());
        }
        bounded(limit, write.write_all(&out)).await?;
        node.counters.reply_bytes.fetch_add(out.len() as u64, Ordering::Relaxed);
        drop(charge);
        if out.capacity() > FRAME_BUFFER_KEEP_BYTES {
            // A large reply's buffer is given back, so an idle connection keeps at most
            // FRAME_BUFFER_KEEP_BYTES of it (uncharged); the price, an allocation per reply
            // over that size, is small beside copying the reply.
            out = Vec::new();
        }
        owed.fetch_sub(1, Ordering::Relaxed);
        if answer.last {
            break;
        }
        // Coalesce: one flush (one syscall) for all replies that are ready together.
        if in_flight.is_empty() {
            bounded(limit, write.flush()).await?;
        }
    }
    bounded(limit, write.flush()).await
}

fn answered<'a>(
    request_id: u64,
    arrived: Instant,
    result: Result<ReplyBody, ErrorReply>,
    last: bool,
) -> InFlight<'a> {
    let timing = ServerTiming { middleware_ns: elapsed_ns(arrived), ..ServerTiming::default() };
    InFlight::Answered(Answer { request_id, timing, result, last, version: PROTOCOL_VERSION })
}

/// Checks that need no database, then the reply's memory, then admission, then submission to
/// the database workers, or, on an idle node and with `inline` given (the connection owes no
/// reply), the commit itself. A registration is completed here: the requests read after it are
/// checked against its id.
async fn begin<'a, S: Store>(
    (node, reply_share, peer, outbox): (
        &'a Node<S>,
        &'a ConnectionShare<'a>,
        SocketAddr,
        &Outbox<Committed>,
    ),
    (client_id, inline): (&mut Option<u64>, Option<&mut Batch>),
    request_id: u64,
    request: Request,
    arrived: Instant,
) -> InFlight<'a> {
    if let Err(refusal) = precheck(&node.config, *client_id, &request) {
        return answered(request_id, arrived, Err(refusal), false);
    }
    let request = match request {
        Request::Disconnect => {
            return answered(request_id, arrived, Ok(ReplyBody::Disconnected), true);
        }
        // Relaxed: the flag only turns new work away; the drain counts what was taken.
        _ if node.stopping.load(Ordering::Relaxed) => {
            let refusal = ErrorReply::new(Reason::Unavailable, "the node is stopping");
            return answered(request_id, arrived, Err(refusal), false);
        }
        Request::Register { name, secret } => {
            let result = register(node, peer, client_id, &name, secret).await;
            return answered(request_id, arrived, result, false);
        }
        request => request,
    };
    // Before the database sees the request, so a dequeued message always has room for its reply.
    let charge = match node.reserve_reply(reply_share, &request) {
        Ok(charge) => charge,
        Err(busy) => return answered(request_id, arrived, Err(busy), false),
    };
    let Some(slot) = admit(node, 1).await else {
        let busy = ErrorReply::new(Reason::Busy, "wait queue full; retry later");
        return answered(request_id, arrived, Err(busy), false);
    };
    let slot_taken = Instant::now();
    let is_stats = matches!(request, Request::Stats { .. });
    let op = StoreOp { client_id: *client_id, now_us: now_us(), request };
    let answer = match inline.filter(|_| node.is_idle()) {
        Some(batch) => {
            Outcome::Ready(Some(commit_inline(node, batch, op, (slot, slot_taken)).await))
        }
        None => {
            let (reply, number) = outbox.reply_to();
            let pending =
                Pending { work: Work::One(op), enqueued: Instant::now(), slot_taken, slot, reply };
            if let Err(mpsc::error::SendError(unsent)) = node.to_workers.send(pending).await {
                unsent.reply.dismiss();
                return answered(request_id, arrived, worker_lost().result, false);
            }
            Outcome::Worker(number)
        }
    };
    let (refused_sends, places) = (None, 1);
    InFlight::Submitted(Submitted {
        request_id,
        arrived,
        slot_taken,
        is_stats,
        answer,
        charge,
        refused_sends,
        places,
    })
}

/// Registers the connection's client (`client_id` set on success).
async fn register<S: Store>(
    node: &Node<S>,
    peer: SocketAddr,
    client_id: &mut Option<u64>,
    name: &str,
    secret: Secret,
) -> Result<ReplyBody, ErrorReply> {
    let source = source_of(peer.ip());
    let registered = node.registrar.register(&node.store, source, name, secret).await;
    if let Ok(id) = &registered {
        // Once per connection (a login); failures are not logged here, so a flood of wrong
        // secrets cannot flood the log.
        tracing::info!(%peer, client_id = id, name, "client registered");
    }
    *client_id = registered.as_ref().ok().copied().or(*client_id);
    registered.map(|client_id| ReplyBody::Registered { client_id })
}

/// Commits `op` as a batch of its own in this connection's task (`batch` is the connection's,
/// reused), then frees its handler slot.
async fn commit_inline<S: Store>(
    node: &Node<S>,
    batch: &mut Batch,
    op: StoreOp,
    (slot, slot_taken): (OwnedSemaphorePermit, Instant),
) -> Committed {
    batch.ops.clear();
    batch.results.clear();
    batch.ops.push(op);
    let db_ns = commit(node, batch).await;
    node.counters.batches_inline.fetch_add(1, Ordering::Relaxed);
    book_slot_time(&node.counters, slot_time_ns(slot_taken, Instant::now(), 1));
    drop(slot);
    let result = batch.results.drain(..).next().unwrap_or_else(|| Err(unanswered()));
    // Now, not with the connection's next inline batch: a send's buffers serve the next decode.
    node.spares.sends.give_back(&mut batch.ops);
    Committed { result, worker_wait_ns: 0, db_ns }
}

/// [`begin`] for a `SendBatch` frame: each send is checked on its own (a refused one is
/// answered with its own reason among the others' outcomes), then the frame's reply memory is
/// reserved, handler slots taken (one per send, at most all of them) and the sends handed to
/// the database workers together. A frame refused whole (Busy, the node stopping) is answered
/// with every send's outcome carrying that reason.
async fn begin_sends<'a, S: Store>(
    (node, reply_share, outbox): (&'a Node<S>, &'a ConnectionShare<'a>, &Outbox<Committed>),
    client_id: Option<u64>,
    batch: SendBatchFrame,
    arrived: Instant,
) -> InFlight<'a> {
    let SendBatchFrame { request_id, mut sends } = batch;
    let count = sends.len();
    let refuse_all = |refusal: ErrorReply| {
        let outcomes = vec![Err(refusal); count];
        answered(request_id, arrived, Ok(ReplyBody::SentBatch(outcomes)), false)
    };
    // Relaxed: the flag only turns new work away; the drain counts what was taken.
    if node.stopping.load(Ordering::Relaxed) {
        return refuse_all(ErrorReply::new(Reason::Unavailable, "the node is stopping"));
    }
    let (mut ops, mut refused) = (node.spares.op_lists.take(), Vec::new());
    ops.reserve(count);
    let now = now_us();
    for (index, send) in sends.drain(..).enumerate() {
        let request = send.into_request();
        match precheck(&node.config, client_id, &request) {
            Ok(()) => ops.push(StoreOp { client_id, now_us: now, request }),
            Err(refusal) => refused.push((index, refusal)),
        }
    }
    node.spares.send_lists.give_back(sends);
    if ops.is_empty() {
        let outcomes = refused.into_iter().map(|(_, refusal)| Err(refusal)).collect();
        return answered(request_id, arrived, Ok(ReplyBody::SentBatch(outcomes)), false);
    }
    let bytes = node.reply_bounds.for_sends(count);
    let charge = match node.reserve_reply_bytes(reply_share, bytes) {
        Ok(charge) => charge,
        Err(busy) => return refuse_all(busy),
    };
    let Some(slot) = admit(node, ops.len()).await else {
        return refuse_all(ErrorReply::new(Reason::Busy, "wait queue full; retry later"));
    };
    let slot_taken = Instant::now();
    let (reply, number) = outbox.reply_to();
    let answer = Outcome::Worker(number);
    let work = Work::Sends(ops);
    let pending = Pending { work, enqueued: Instant::now(), slot_taken, slot, reply };
    if let Err(mpsc::error::SendError(unsent)) = node.to_workers.send(pending).await {
        unsent.reply.dismiss();
        return refuse_all(ErrorReply::new(Reason::Unavailable, "database worker stopped"));
    }
    let refused_sends = Some(refused);
    let is_stats = false;
    InFlight::Submitted(Submitted {
        request_id,
        arrived,
        slot_taken,
        is_stats,
        answer,
        charge,
        refused_sends,
        places: count,
    })
}

/// A `SendBatch`'s reply: the committed outcomes with the sends refused before the database
/// put back at their places; a batch that failed whole answers each of its sends with why.
fn merge_sends(
    result: Result<ReplyBody, ErrorReply>,
    refused: Vec<(usize, ErrorReply)>,
    places: usize,
) -> Result<ReplyBody, ErrorReply> {
    let mut outcomes: Vec<SendOutcome> = match result {
        Ok(ReplyBody::SentBatch(outcomes)) => outcomes,
        Ok(other) => {
            let detail = format!("a SendBatch answered with {other:?}");
            vec![Err(ErrorReply::new(Reason::Unavailable, detail)); places - refused.len()]
        }
        Err(failed) => vec![Err(failed); places - refused.len()],
    };
    for (index, refusal) in refused {
        outcomes.insert(index.min(outcomes.len()), Err(refusal));
    }
    Ok(ReplyBody::SentBatch(outcomes))
}

/// Turns a committed result into the reply.
fn complete<S>(node: &Node<S>, submitted: &mut Submitted<'_>, committed: Committed) -> Answer {
    let admission_ns =
        u64::try_from((submitted.slot_taken - submitted.arrived).as_nanos()).unwrap_or(u64::MAX);
    let timing = ServerTiming {
        queue_wait_ns: admission_ns + committed.worker_wait_ns,
        db_ns: committed.db_ns,
        middleware_ns: elapsed_ns(submitted.arrived),
    };
    node.counters.request_seconds.record_since(submitted.arrived);
    let mut result = committed.result;
    if let (true, Ok(ReplyBody::Stats(stats))) = (submitted.is_stats, &mut result) {
        fill_stats(node, stats);
    }
    if let Some(refused) = submitted.refused_sends.take() {
        result = merge_sends(result, refused, submitted.places);
    }
    Answer {
        request_id: submitted.request_id,
        timing,
        result,
        last: false,
        version: PROTOCOL_VERSION,
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

/// Takes a handler slot per request (`requests` of them; at most all the node has, so a
/// `SendBatch` larger than the pool still gets in), waiting if allowed; `None` means the wait
/// queue is full.
async fn admit<S>(node: &Node<S>, requests: usize) -> Option<tokio::sync::OwnedSemaphorePermit> {
    let slots = u32::try_from(requests.clamp(1, node.config.handler_slots)).unwrap_or(u32::MAX);
    if let Ok(slot) = node.handler_slots.clone().try_acquire_many_owned(slots) {
        return Some(slot);
    }
    // Relaxed suffices: the semaphore orders the slot; the counter only bounds how many wait.
    if node.waiting.fetch_add(1, Ordering::Relaxed) >= node.config.wait_queue_max {
        node.waiting.fetch_sub(1, Ordering::Relaxed);
        return None;
    }
    let slot = node.handler_slots.clone().acquire_many_owned(slots).await.ok();
    node.waiting.fetch_sub(1, Ordering::Relaxed);
    slot
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{NAME_BYTES_MAX, SECRET_BYTES_MAX, Secret};

    #[test]
    fn the_largest_register_fits_the_pre_registration_frame_bound() {
        let name = "n".repeat(NAME_BYTES_MAX);
        let request = Request::Register { name, secret: Secret(vec![7; SECRET_BYTES_MAX]) };
        let mut out = Vec::new();
        crate::protocol::encode_request(&RequestFrame { request_id: u64::MAX, request }, &mut out);
        assert!(
            out.len() - LENGTH_PREFIX_BYTES <= PRE_REGISTRATION_FRAME_BYTES_MAX,
            "{}",
            out.len()
        );
    }
}
