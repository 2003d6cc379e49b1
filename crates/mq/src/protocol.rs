//! The wire protocol (version 2): length-prefixed binary frames, a request id on every request
//! and reply, a reason code on every reply. `docs/MQ_PROTOCOL.md` is the normative description;
//! this module is its only implementation (client and middleware both use it).
//!
//! Decoding never trusts a length field: every read is bounds-checked against the frame, and a
//! frame longer than [`FRAME_BYTES_MAX`] is refused before anything is allocated for it.

use std::fmt;

/// Protocol version carried in every frame; a node answers other versions with
/// [`Reason::UnsupportedVersion`].
pub const PROTOCOL_VERSION: u8 = 2;
/// Oldest version whose error reply has the layout of this one: a request of a version in
/// `PROTOCOL_VERSION_ERROR_COMPATIBLE..PROTOCOL_VERSION` is refused with an error reply stamped
/// with the request's own version, so an old client decodes it and shows the reason.
pub const PROTOCOL_VERSION_ERROR_COMPATIBLE: u8 = 1;
/// Largest frame payload (the bytes after the 4-byte length prefix) either side accepts.
pub const FRAME_BYTES_MAX: usize = 1 << 20;
/// Bytes of the length prefix.
pub const LENGTH_PREFIX_BYTES: usize = 4;
/// Largest name (client or queue) in bytes.
pub const NAME_BYTES_MAX: usize = 128;
/// Longest registration secret in bytes.
pub const SECRET_BYTES_MAX: usize = 1024;
/// Largest number of queue names in one `ListQueues` reply.
pub const LIST_QUEUES_MAX: usize = 1024;
/// Most sends in one `SendBatch` frame: a connection's pipeline depth (each send of a batch
/// takes one of the connection's in-flight places, so a batch never holds more than a client
/// could pipeline as single frames).
pub const SEND_BATCH_MAX: usize = 64;

/// Why a request failed; `Ok` on success. The numeric values are part of the protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Reason {
    Ok = 0,
    /// The frame could not be decoded (truncated field, bad UTF-8, bad flag byte, trailing bytes).
    Malformed = 1,
    UnsupportedVersion = 2,
    UnknownOp = 3,
    /// Frame or content larger than the node's configured maximum.
    TooLarge = 4,
    /// The connection has not registered a client yet.
    NotRegistered = 5,
    UnknownQueue = 6,
    QueueExists = 7,
    /// Delete of a queue holding messages without the purge flag.
    QueueNotEmpty = 8,
    UnknownReceiver = 9,
    /// No message matched the read.
    NoMessage = 10,
    /// Ack of a message that is not leased to this client (expired, acked, or someone else's).
    NotLeaseHolder = 11,
    /// The node's wait queue is full: retry later.
    Busy = 12,
    /// The database is unreachable or failed; nothing of the request was committed.
    Unavailable = 13,
    /// A name is empty or longer than [`NAME_BYTES_MAX`].
    InvalidName = 14,
    /// The connection already registered a client.
    AlreadyRegistered = 15,
    /// A lease of zero or longer than the node allows.
    InvalidLease = 16,
    /// Register under a name that is registered with another secret.
    BadCredentials = 17,
    /// Delete or purge of a queue owned by another client (or by no one).
    NotOwner = 18,
    /// The node holds its maximum number of connections; it closes this one.
    ConnectionLimit = 19,
    /// A secret is empty or longer than [`SECRET_BYTES_MAX`].
    InvalidSecret = 20,
}

impl Reason {
    /// The reason for a wire value; `None` for values this version does not know.
    pub fn from_u16(value: u16) -> Option<Reason> {
        use Reason::*;
        const ALL: [Reason; 21] = [
            Ok,
            Malformed,
            UnsupportedVersion,
            UnknownOp,
            TooLarge,
            NotRegistered,
            UnknownQueue,
            QueueExists,
            QueueNotEmpty,
            UnknownReceiver,
            NoMessage,
            NotLeaseHolder,
            Busy,
            Unavailable,
            InvalidName,
            AlreadyRegistered,
            InvalidLease,
            BadCredentials,
            NotOwner,
            ConnectionLimit,
            InvalidSecret,
        ];
        ALL.get(usize::from(value)).copied()
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self:?}({})", *self as u16)
    }
}

/// Which messages a read considers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReadTarget {
    /// The oldest message of the queue readable by me (addressed to me or to anyone).
    Queue(String),
    /// The oldest message addressed to me, optionally only from one queue and/or one sender.
    ForMe { queue: Option<String>, sender: Option<u64> },
}

/// What a read does with the message it finds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadMode {
    /// Remove it (at-most-once).
    Pop,
    /// Leave it.
    Peek,
    /// Hide it for the lease; it reappears unless acked in time (at-least-once).
    Lease { lease_ms: u32 },
}

/// A registration secret. Its `Debug` never shows the bytes, so a logged request cannot leak it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub Vec<u8>);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret({} bytes)", self.0.len())
    }
}

/// A client request. The request id travels beside it in [`RequestFrame`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// Claims `name` with `secret` (first registration) or proves it (later ones).
    Register {
        name: String,
        secret: Secret,
    },
    CreateQueue {
        name: String,
    },
    DeleteQueue {
        name: String,
        purge: bool,
    },
    Send {
        queue: String,
        receiver: Option<u64>,
        content: Vec<u8>,
    },
    Read {
        target: ReadTarget,
        mode: ReadMode,
    },
    Ack {
        message_id: u64,
    },
    ListQueues,
    /// Counters of the node and the depth of one queue (for load-run sanity checks).
    Stats {
        queue: String,
    },
    Disconnect,
}

/// One send of a [`SendBatchFrame`]: the fields of [`Request::Send`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchedSend {
    pub queue: String,
    pub receiver: Option<u64>,
    pub content: Vec<u8>,
}

impl BatchedSend {
    /// The lone request this send stands for.
    pub fn into_request(self) -> Request {
        Request::Send { queue: self.queue, receiver: self.receiver, content: self.content }
    }
}

/// A send borrowed from the caller, for encoding a `SendBatch` without copying.
#[derive(Clone, Copy, Debug)]
pub struct SendRef<'a> {
    pub queue: &'a str,
    pub receiver: Option<u64>,
    pub content: &'a [u8],
}

/// Many sends in one frame (op `SendBatch`): the sends are requests `request_id`,
/// `request_id + 1`, … in order, and are answered by one [`ReplyBody::SentBatch`] reply that
/// carries `request_id` and one outcome per send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SendBatchFrame {
    pub request_id: u64,
    /// 1..=[`SEND_BATCH_MAX`] sends.
    pub sends: Vec<BatchedSend>,
}

/// A decoded request frame: one request, or a batch of sends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IncomingFrame {
    One(RequestFrame),
    Sends(SendBatchFrame),
}

/// A committed send: the message's id and its arrival time at the middleware.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sent {
    pub message_id: u64,
    pub arrived_us: u64,
}

/// One send's outcome in a [`ReplyBody::SentBatch`]: each send of a batch succeeds or fails on
/// its own, with its own reason.
pub type SendOutcome = Result<Sent, ErrorReply>;

/// A message as delivered to a reader.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub id: u64,
    pub queue: String,
    pub sender: u64,
    pub receiver: Option<u64>,
    /// Arrival time at the middleware, microseconds since the Unix epoch.
    pub arrived_us: u64,
    /// How many leases this message has had (0 for plain reads).
    pub deliveries: u32,
    pub content: Vec<u8>,
}

/// Node counters returned by `Stats`; all counts since the node started.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeStats {
    pub sends_committed: u64,
    pub pops_committed: u64,
    pub batches_committed: u64,
    /// Sum over database workers of the time spent executing batches.
    pub db_busy_ns: u64,
    /// Sum over requests of the time a handler slot was held.
    pub handler_busy_ns: u64,
    pub handler_slots: u32,
    pub db_workers: u32,
    /// Messages currently stored in the queue named in the request.
    pub queue_depth: u64,
    /// Connections open now.
    pub connections_open: u64,
    /// Connections refused at the connection limit.
    pub connections_refused: u64,
    /// Connections closed by the node for not taking their replies in time or for a frame past
    /// the node-wide frame memory bound.
    pub connections_cut_off: u64,
    /// Connections closed after the idle timeout.
    pub connections_idle_closed: u64,
    /// Bytes of replies owed to clients (committed or being encoded, not yet written) now.
    pub reply_memory_bytes: u64,
    /// Most such bytes at once since the node started.
    pub reply_memory_bytes_peak: u64,
    /// Requests answered `Busy` because their largest possible reply did not fit the node's
    /// reply memory bound.
    pub reply_memory_refused: u64,
}

/// The successful result of a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplyBody {
    Registered {
        client_id: u64,
    },
    QueueCreated {
        queue_id: u64,
    },
    QueueDeleted {
        purged_messages: u64,
    },
    Sent {
        message_id: u64,
        arrived_us: u64,
    },
    Message(Message),
    Acked,
    Queues(Vec<String>),
    Stats(NodeStats),
    Disconnected,
    /// The answer to a `SendBatch` frame: one outcome per send, in the frame's order.
    SentBatch(Vec<SendOutcome>),
}

/// Where the middleware spent a request's time; zero where not applicable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServerTiming {
    /// Waiting for a handler slot and then for a database worker.
    pub queue_wait_ns: u64,
    /// The database transaction holding this request (shared with its batch).
    pub db_ns: u64,
    /// From frame arrival to reply encoding.
    pub middleware_ns: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestFrame {
    pub request_id: u64,
    pub request: Request,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplyFrame {
    pub request_id: u64,
    pub timing: ServerTiming,
    pub result: Result<ReplyBody, ErrorReply>,
}

/// A refused request: the reason code plus a human-readable detail.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{reason}: {detail}")]
pub struct ErrorReply {
    pub reason: Reason,
    pub detail: String,
}

impl ErrorReply {
    pub fn new(reason: Reason, detail: impl Into<String>) -> ErrorReply {
        ErrorReply { reason, detail: detail.into() }
    }
}

/// Why a frame payload could not be decoded. `request_id` is known when the header was intact,
/// so the node can still answer the request it belongs to.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{reason}: {detail}")]
pub struct DecodeError {
    pub reason: Reason,
    pub request_id: Option<u64>,
    pub detail: &'static str,
}

mod op {
    pub const REGISTER: u8 = 1;
    pub const CREATE_QUEUE: u8 = 2;
    pub const DELETE_QUEUE: u8 = 3;
    pub const SEND: u8 = 4;
    pub const POP: u8 = 5;
    pub const PEEK: u8 = 6;
    pub const LEASE: u8 = 7;
    pub const ACK: u8 = 8;
    pub const LIST_QUEUES: u8 = 9;
    pub const STATS: u8 = 10;
    pub const DISCONNECT: u8 = 11;
    pub const SEND_BATCH: u8 = 12;
}

mod reply_kind {
    pub const ERROR: u8 = 0;
    pub const REGISTERED: u8 = 1;
    pub const QUEUE_CREATED: u8 = 2;
    pub const QUEUE_DELETED: u8 = 3;
    pub const SENT: u8 = 4;
    pub const MESSAGE: u8 = 5;
    pub const ACKED: u8 = 6;
    pub const QUEUES: u8 = 7;
    pub const STATS: u8 = 8;
    pub const DISCONNECTED: u8 = 9;
    pub const SENT_BATCH: u8 = 10;
}

const TARGET_QUEUE: u8 = 0;
const TARGET_FOR_ME: u8 = 1;

// ---------------------------------------------------------------------------------------------
// Encoding: appends a whole frame (length prefix included) to a reusable buffer.

struct Writer<'a> {
    out: &'a mut Vec<u8>,
}

impl Writer<'_> {
    fn u8(&mut self, v: u8) {
        self.out.push(v);
    }
    fn u16(&mut self, v: u16) {
        self.out.extend_from_slice(&v.to_be_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.out.extend_from_slice(&v.to_be_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.out.extend_from_slice(&v.to_be_bytes());
    }
    fn bool(&mut self, v: bool) {
        self.u8(u8::from(v));
    }
    /// Names are at most [`NAME_BYTES_MAX`] by protocol; longer ones are cut by the caller's
    /// validation, here the u16 prefix is saturated so the frame stays self-consistent.
    fn str(&mut self, s: &str) {
        let len = s.len().min(usize::from(u16::MAX));
        self.u16(len as u16);
        self.out.extend_from_slice(&s.as_bytes()[..len]);
    }
    fn bytes(&mut self, b: &[u8]) {
        self.u32(u32::try_from(b.len()).unwrap_or(u32::MAX));
        self.out.extend_from_slice(b);
    }
    fn opt_u64(&mut self, v: Option<u64>) {
        match v {
            None => self.u8(0),
            Some(v) => {
                self.u8(1);
                self.u64(v);
            }
        }
    }
    fn opt_str(&mut self, v: Option<&str>) {
        match v {
            None => self.u8(0),
            Some(v) => {
                self.u8(1);
                self.str(v);
            }
        }
    }
}

/// Runs `body` to write a frame's payload after a length prefix, then patches the prefix.
fn write_frame(out: &mut Vec<u8>, body: impl FnOnce(&mut Writer<'_>)) {
    let start = out.len();
    out.extend_from_slice(&[0; LENGTH_PREFIX_BYTES]);
    body(&mut Writer { out });
    let payload = out.len() - start - LENGTH_PREFIX_BYTES;
    let prefix = u32::try_from(payload).unwrap_or(u32::MAX).to_be_bytes();
    out[start..start + LENGTH_PREFIX_BYTES].copy_from_slice(&prefix);
}

/// Appends the frame of `frame` to `out`.
pub fn encode_request(frame: &RequestFrame, out: &mut Vec<u8>) {
    write_frame(out, |w| {
        w.u8(PROTOCOL_VERSION);
        w.u8(request_op(&frame.request));
        w.u64(frame.request_id);
        match &frame.request {
            Request::Register { name, secret } => {
                w.str(name);
                w.bytes(&secret.0);
            }
            Request::CreateQueue { name } => w.str(name),
            Request::DeleteQueue { name, purge } => {
                w.str(name);
                w.bool(*purge);
            }
            Request::Send { queue, receiver, content } => {
                w.str(queue);
                w.opt_u64(*receiver);
                w.bytes(content);
            }
            Request::Read { target, mode } => {
                match target {
                    ReadTarget::Queue(queue) => {
                        w.u8(TARGET_QUEUE);
                        w.str(queue);
                    }
                    ReadTarget::ForMe { queue, sender } => {
                        w.u8(TARGET_FOR_ME);
                        w.opt_str(queue.as_deref());
                        w.opt_u64(*sender);
                    }
                }
                if let ReadMode::Lease { lease_ms } = mode {
                    w.u32(*lease_ms);
                }
            }
            Request::Ack { message_id } => w.u64(*message_id),
            Request::Stats { queue } => w.str(queue),
            Request::ListQueues | Request::Disconnect => {}
        }
    });
}

/// Appends one `SendBatch` frame holding `sends` (requests `request_id`, `request_id + 1`, …);
/// returns how many sends it holds. The caller keeps them within 1..=[`SEND_BATCH_MAX`]; a
/// node refuses an empty or larger batch as a whole.
pub fn encode_send_batch<'a>(
    request_id: u64,
    sends: impl IntoIterator<Item = SendRef<'a>>,
    out: &mut Vec<u8>,
) -> usize {
    let mut count = 0usize;
    let mut count_at = 0;
    write_frame(out, |w| {
        w.u8(PROTOCOL_VERSION);
        w.u8(op::SEND_BATCH);
        w.u64(request_id);
        count_at = w.out.len();
        w.u16(0);
        for send in sends {
            w.str(send.queue);
            w.opt_u64(send.receiver);
            w.bytes(send.content);
            count += 1;
        }
    });
    let count_bytes = u16::try_from(count).unwrap_or(u16::MAX).to_be_bytes();
    out[count_at..count_at + 2].copy_from_slice(&count_bytes);
    count
}

fn request_op(request: &Request) -> u8 {
    match request {
        Request::Register { .. } => op::REGISTER,
        Request::CreateQueue { .. } => op::CREATE_QUEUE,
        Request::DeleteQueue { .. } => op::DELETE_QUEUE,
        Request::Send { .. } => op::SEND,
        Request::Read { mode: ReadMode::Pop, .. } => op::POP,
        Request::Read { mode: ReadMode::Peek, .. } => op::PEEK,
        Request::Read { mode: ReadMode::Lease { .. }, .. } => op::LEASE,
        Request::Ack { .. } => op::ACK,
        Request::ListQueues => op::LIST_QUEUES,
        Request::Stats { .. } => op::STATS,
        Request::Disconnect => op::DISCONNECT,
    }
}

/// Appends the frame of `frame` to `out`.
pub fn encode_reply(frame: &ReplyFrame, out: &mut Vec<u8>) {
    encode_reply_as(frame, PROTOCOL_VERSION, out);
}

/// The version to stamp on the error reply to a request of `request_version`: the request's own
/// when that version's error replies have this version's layout (so an old client can decode
/// why it was refused), this version otherwise.
pub fn error_reply_version(request_version: u8) -> u8 {
    if (PROTOCOL_VERSION_ERROR_COMPATIBLE..PROTOCOL_VERSION).contains(&request_version) {
        request_version
    } else {
        PROTOCOL_VERSION
    }
}

/// Appends the frame of `frame` stamped with `version`; any version other than
/// [`PROTOCOL_VERSION`] only for an error reply (see [`error_reply_version`]).
pub fn encode_reply_as(frame: &ReplyFrame, version: u8, out: &mut Vec<u8>) {
    assert!(
        version == PROTOCOL_VERSION || frame.result.is_err(),
        "only error replies are encoded for an older version"
    );
    write_frame(out, |w| {
        w.u8(version);
        w.u64(frame.request_id);
        w.u64(frame.timing.queue_wait_ns);
        w.u64(frame.timing.db_ns);
        w.u64(frame.timing.middleware_ns);
        match &frame.result {
            Err(error) => {
                w.u8(reply_kind::ERROR);
                w.u16(error.reason as u16);
                w.str(&error.detail);
            }
            Ok(body) => encode_reply_body(body, w),
        }
    });
}

fn encode_reply_body(body: &ReplyBody, w: &mut Writer<'_>) {
    match body {
        ReplyBody::Registered { client_id } => {
            w.u8(reply_kind::REGISTERED);
            w.u64(*client_id);
        }
        ReplyBody::QueueCreated { queue_id } => {
            w.u8(reply_kind::QUEUE_CREATED);
            w.u64(*queue_id);
        }
        ReplyBody::QueueDeleted { purged_messages } => {
            w.u8(reply_kind::QUEUE_DELETED);
            w.u64(*purged_messages);
        }
        ReplyBody::Sent { message_id, arrived_us } => {
            w.u8(reply_kind::SENT);
            w.u64(*message_id);
            w.u64(*arrived_us);
        }
        ReplyBody::Message(m) => {
            w.u8(reply_kind::MESSAGE);
            w.u64(m.id);
            w.str(&m.queue);
            w.u64(m.sender);
            w.opt_u64(m.receiver);
            w.u64(m.arrived_us);
            w.u32(m.deliveries);
            w.bytes(&m.content);
        }
        ReplyBody::Acked => w.u8(reply_kind::ACKED),
        ReplyBody::Queues(names) => {
            w.u8(reply_kind::QUEUES);
            w.u32(u32::try_from(names.len()).unwrap_or(u32::MAX));
            names.iter().for_each(|n| w.str(n));
        }
        ReplyBody::Stats(stats) => {
            w.u8(reply_kind::STATS);
            encode_stats(stats, w);
        }
        ReplyBody::Disconnected => w.u8(reply_kind::DISCONNECTED),
        ReplyBody::SentBatch(outcomes) => {
            w.u8(reply_kind::SENT_BATCH);
            encode_sent_batch(outcomes, w);
        }
    }
}

fn encode_stats(s: &NodeStats, w: &mut Writer<'_>) {
    let committed = [s.sends_committed, s.pops_committed, s.batches_committed];
    for v in committed.into_iter().chain([s.db_busy_ns, s.handler_busy_ns]) {
        w.u64(v);
    }
    w.u32(s.handler_slots);
    w.u32(s.db_workers);
    for v in [
        s.queue_depth,
        s.connections_open,
        s.connections_refused,
        s.connections_cut_off,
        s.connections_idle_closed,
        s.reply_memory_bytes,
        s.reply_memory_bytes_peak,
        s.reply_memory_refused,
    ] {
        w.u64(v);
    }
}

/// A batch's answers: each send's id and arrival, or its reason and detail.
fn encode_sent_batch(outcomes: &[SendOutcome], w: &mut Writer<'_>) {
    w.u16(u16::try_from(outcomes.len()).unwrap_or(u16::MAX));
    for outcome in outcomes {
        match outcome {
            Ok(sent) => {
                w.u16(Reason::Ok as u16);
                w.u64(sent.message_id);
                w.u64(sent.arrived_us);
            }
            Err(error) => {
                w.u16(error.reason as u16);
                w.str(&error.detail);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Decoding: from one frame payload (the bytes after the length prefix).

struct Reader<'a> {
    buf: &'a [u8],
    request_id: Option<u64>,
}

impl<'a> Reader<'a> {
    fn fail(&self, detail: &'static str) -> DecodeError {
        DecodeError { reason: Reason::Malformed, request_id: self.request_id, detail }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.buf.len() < n {
            return Err(self.fail("frame truncated"));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut a = [0; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }
    fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_be_bytes(self.array()?))
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(self.array()?))
    }
    fn bool(&mut self) -> Result<bool, DecodeError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(self.fail("flag byte is neither 0 nor 1")),
        }
    }
    fn str(&mut self) -> Result<String, DecodeError> {
        Ok(self.str_ref()?.to_owned())
    }
    fn str_ref(&mut self) -> Result<&'a str, DecodeError> {
        let len = usize::from(self.u16()?);
        let bytes = self.take(len)?;
        std::str::from_utf8(bytes).map_err(|_| self.fail("string is not UTF-8"))
    }
    fn bytes(&mut self) -> Result<Vec<u8>, DecodeError> {
        let len = self.u32()? as usize;
        Ok(self.take(len)?.to_vec())
    }
    fn opt_u64(&mut self) -> Result<Option<u64>, DecodeError> {
        if self.bool()? { Ok(Some(self.u64()?)) } else { Ok(None) }
    }
    fn opt_str(&mut self) -> Result<Option<String>, DecodeError> {
        if self.bool()? { Ok(Some(self.str()?)) } else { Ok(None) }
    }
    fn finish<T>(&self, value: T) -> Result<T, DecodeError> {
        if self.buf.is_empty() { Ok(value) } else { Err(self.fail("trailing bytes after body")) }
    }
}

/// Decodes one request frame payload that holds one request (a `SendBatch` frame is refused
/// as `UnknownOp`: [`decode_frame`] takes both).
pub fn decode_request(payload: &[u8]) -> Result<RequestFrame, DecodeError> {
    match decode_frame(payload)? {
        IncomingFrame::One(frame) => Ok(frame),
        IncomingFrame::Sends(batch) => Err(DecodeError {
            reason: Reason::UnknownOp,
            request_id: Some(batch.request_id),
            detail: "a SendBatch frame where one request was expected",
        }),
    }
}

/// Decodes one request frame payload: one request, or a batch of sends.
///
/// ```
/// use mq::protocol::{IncomingFrame, Request, RequestFrame, decode_frame, encode_request};
///
/// let request = Request::Send { queue: "orders".into(), receiver: None, content: b"hi".to_vec() };
/// let mut payload = Vec::new();
/// encode_request(&RequestFrame { request_id: 7, request: request.clone() }, &mut payload);
/// let IncomingFrame::One(frame) = decode_frame(&payload[4..]).unwrap() else { panic!() };
/// assert_eq!((frame.request_id, frame.request), (7, request));
/// // A frame cut short is refused with a reason, never a panic.
/// assert!(decode_frame(&payload[4..10]).is_err());
/// ```
pub fn decode_frame(payload: &[u8]) -> Result<IncomingFrame, DecodeError> {
    decode_frame_reusing(payload, &mut <(String, Vec<u8>)>::default)
}

/// Emptied buffers a decoder fills instead of allocating ([`decode_frame_reusing`]). A
/// closure returning `(String, Vec<u8>)` is one: it gives each send's buffers, and a
/// `SendBatch`'s list of sends is a new vector.
///
/// ```
/// use mq::protocol::{BatchedSend, DecodeSpares, IncomingFrame, SendRef, decode_frame_reusing};
///
/// struct Kept(Vec<BatchedSend>);
/// impl DecodeSpares for Kept {
///     fn send_buffers(&mut self) -> (String, Vec<u8>) {
///         (String::new(), Vec::new())
///     }
///     fn send_list(&mut self) -> Vec<BatchedSend> {
///         std::mem::take(&mut self.0)
///     }
/// }
/// let mut payload = Vec::new();
/// let send = SendRef { queue: "q", receiver: None, content: b"hi" };
/// mq::protocol::encode_send_batch(7, [send], &mut payload);
/// let mut kept = Kept(Vec::with_capacity(64));
/// let IncomingFrame::Sends(frame) = decode_frame_reusing(&payload[4..], &mut kept).unwrap()
/// else {
///     panic!()
/// };
/// assert_eq!((frame.sends.len(), frame.sends.capacity()), (1, 64));
/// assert!(decode_frame_reusing(&payload[4..8], &mut kept).is_err());
/// ```
pub trait DecodeSpares {
    /// A send's queue name and content buffers, emptied, their capacity kept.
    fn send_buffers(&mut self) -> (String, Vec<u8>);

    /// An emptied vector for a `SendBatch`'s sends (a new one unless overridden).
    fn send_list(&mut self) -> Vec<BatchedSend> {
        Vec::new()
    }
}

impl<F: FnMut() -> (String, Vec<u8>)> DecodeSpares for F {
    fn send_buffers(&mut self) -> (String, Vec<u8>) {
        self()
    }
}

/// [`decode_frame`], each send's queue name and content decoded into a pair of buffers from
/// `spares`, and a `SendBatch`'s sends into its vector (emptied buffers whose capacity is
/// reused: a node decodes sends without allocating once its buffers have grown; see
/// [`DecodeSpares`]).
///
/// ```
/// use mq::protocol::{IncomingFrame, Request, RequestFrame, decode_frame_reusing, encode_request};
///
/// let request = Request::Send { queue: "q".into(), receiver: None, content: vec![5; 100] };
/// let mut payload = Vec::new();
/// encode_request(&RequestFrame { request_id: 1, request }, &mut payload);
/// let mut spare = || (String::with_capacity(16), Vec::with_capacity(4096));
/// let IncomingFrame::One(frame) = decode_frame_reusing(&payload[4..], &mut spare).unwrap() else {
///     panic!()
/// };
/// let Request::Send { content, .. } = &frame.request else { panic!() };
/// assert_eq!((content.len(), content.capacity()), (100, 4096));
/// assert!(decode_frame_reusing(&payload[4..9], &mut spare).is_err());
/// ```
pub fn decode_frame_reusing(
    payload: &[u8],
    spares: &mut dyn DecodeSpares,
) -> Result<IncomingFrame, DecodeError> {
    let mut r = Reader { buf: payload, request_id: None };
    let version = r.u8()?;
    let op = r.u8()?;
    let request_id = r.u64()?;
    r.request_id = Some(request_id);
    if version != PROTOCOL_VERSION {
        let detail =
            "this node speaks protocol version 2 (Register carries a secret): upgrade the client";
        return Err(DecodeError {
            reason: Reason::UnsupportedVersion,
            request_id: Some(request_id),
            detail,
        });
    }
    if op == op::SEND_BATCH {
        let sends = decode_sends(&mut r, spares)?;
        return r.finish(IncomingFrame::Sends(SendBatchFrame { request_id, sends }));
    }
    let request = match op {
        op::REGISTER => Request::Register { name: r.str()?, secret: Secret(r.bytes()?) },
        op::CREATE_QUEUE => Request::CreateQueue { name: r.str()? },
        op::DELETE_QUEUE => Request::DeleteQueue { name: r.str()?, purge: r.bool()? },
        op::SEND => decode_send(&mut r, spares.send_buffers())?.into_request(),
        op::POP => Request::Read { target: decode_target(&mut r)?, mode: ReadMode::Pop },
        op::PEEK => Request::Read { target: decode_target(&mut r)?, mode: ReadMode::Peek },
        op::LEASE => {
            let target = decode_target(&mut r)?;
            Request::Read { target, mode: ReadMode::Lease { lease_ms: r.u32()? } }
        }
        op::ACK => Request::Ack { message_id: r.u64()? },
        op::LIST_QUEUES => Request::ListQueues,
        op::STATS => Request::Stats { queue: r.str()? },
        op::DISCONNECT => Request::Disconnect,
        _ => {
            let detail = "unknown operation code";
            return Err(DecodeError {
                reason: Reason::UnknownOp,
                request_id: Some(request_id),
                detail,
            });
        }
    };
    r.finish(IncomingFrame::One(RequestFrame { request_id, request }))
}

/// A `SendBatch` body: a count within 1..=SEND_BATCH_MAX (checked before anything is
/// allocated for it), then that many sends.
fn decode_sends(
    r: &mut Reader<'_>,
    spares: &mut dyn DecodeSpares,
) -> Result<Vec<BatchedSend>, DecodeError> {
    let count = usize::from(r.u16()?);
    if count > SEND_BATCH_MAX {
        return Err(DecodeError {
            reason: Reason::TooLarge,
            request_id: r.request_id,
            detail: "a SendBatch holds at most 64 sends (SEND_BATCH_MAX)",
        });
    }
    if count == 0 {
        return Err(r.fail("a SendBatch holds at least one send"));
    }
    let mut sends = spares.send_list();
    sends.clear();
    sends.reserve(count);
    for _ in 0..count {
        sends.push(decode_send(r, spares.send_buffers())?);
    }
    Ok(sends)
}

/// A send's fields, its queue name and content copied into `(queue, content)`.
fn decode_send(
    r: &mut Reader<'_>,
    (mut queue, mut content): (String, Vec<u8>),
) -> Result<BatchedSend, DecodeError> {
    queue.clear();
    queue.push_str(r.str_ref()?);
    let receiver = r.opt_u64()?;
    content.clear();
    let len = r.u32()? as usize;
    content.extend_from_slice(r.take(len)?);
    Ok(BatchedSend { queue, receiver, content })
}

fn decode_sent_batch(r: &mut Reader<'_>) -> Result<ReplyBody, DecodeError> {
    let count = usize::from(r.u16()?);
    if count > SEND_BATCH_MAX {
        return Err(r.fail("a SentBatch reply holds at most 64 outcomes"));
    }
    let mut outcomes = Vec::with_capacity(count);
    for _ in 0..count {
        let code = r.u16()?;
        outcomes.push(match Reason::from_u16(code) {
            Some(Reason::Ok) => Ok(Sent { message_id: r.u64()?, arrived_us: r.u64()? }),
            Some(reason) => Err(ErrorReply { reason, detail: r.str()? }),
            None => return Err(r.fail("unknown reason code")),
        });
    }
    Ok(ReplyBody::SentBatch(outcomes))
}

fn decode_target(r: &mut Reader<'_>) -> Result<ReadTarget, DecodeError> {
    match r.u8()? {
        TARGET_QUEUE => Ok(ReadTarget::Queue(r.str()?)),
        TARGET_FOR_ME => Ok(ReadTarget::ForMe { queue: r.opt_str()?, sender: r.opt_u64()? }),
        _ => Err(r.fail("unknown read target")),
    }
}

/// Decodes one reply frame payload.
pub fn decode_reply(payload: &[u8]) -> Result<ReplyFrame, DecodeError> {
    let mut r = Reader { buf: payload, request_id: None };
    if r.u8()? != PROTOCOL_VERSION {
        return Err(DecodeError {
            reason: Reason::UnsupportedVersion,
            request_id: None,
            detail: "reply of another protocol version",
        });
    }
    let request_id = r.u64()?;
    r.request_id = Some(request_id);
    let timing = ServerTiming { queue_wait_ns: r.u64()?, db_ns: r.u64()?, middleware_ns: r.u64()? };
    let result = match r.u8()? {
        reply_kind::ERROR => {
            let code = r.u16()?;
            let reason = Reason::from_u16(code).ok_or_else(|| r.fail("unknown reason code"))?;
            Err(ErrorReply { reason, detail: r.str()? })
        }
        kind => Ok(decode_reply_body(kind, &mut r)?),
    };
    r.finish(ReplyFrame { request_id, timing, result })
}

fn decode_reply_body(kind: u8, r: &mut Reader<'_>) -> Result<ReplyBody, DecodeError> {
    Ok(match kind {
        reply_kind::REGISTERED => ReplyBody::Registered { client_id: r.u64()? },
        reply_kind::QUEUE_CREATED => ReplyBody::QueueCreated { queue_id: r.u64()? },
        reply_kind::QUEUE_DELETED => ReplyBody::QueueDeleted { purged_messages: r.u64()? },
        reply_kind::SENT => ReplyBody::Sent { message_id: r.u64()?, arrived_us: r.u64()? },
        reply_kind::MESSAGE => ReplyBody::Message(Message {
            id: r.u64()?,
            queue: r.str()?,
            sender: r.u64()?,
            receiver: r.opt_u64()?,
            arrived_us: r.u64()?,
            deliveries: r.u32()?,
            content: r.bytes()?,
        }),
        reply_kind::ACKED => ReplyBody::Acked,
        reply_kind::QUEUES => {
            let count = r.u32()? as usize;
            if count > LIST_QUEUES_MAX {
                return Err(r.fail("too many queue names"));
            }
            let mut names = Vec::with_capacity(count);
            for _ in 0..count {
                names.push(r.str()?);
            }
            ReplyBody::Queues(names)
        }
        reply_kind::STATS => ReplyBody::Stats(NodeStats {
            sends_committed: r.u64()?,
            pops_committed: r.u64()?,
            batches_committed: r.u64()?,
            db_busy_ns: r.u64()?,
            handler_busy_ns: r.u64()?,
            handler_slots: r.u32()?,
            db_workers: r.u32()?,
            queue_depth: r.u64()?,
            connections_open: r.u64()?,
            connections_refused: r.u64()?,
            connections_cut_off: r.u64()?,
            connections_idle_closed: r.u64()?,
            reply_memory_bytes: r.u64()?,
            reply_memory_bytes_peak: r.u64()?,
            reply_memory_refused: r.u64()?,
        }),
        reply_kind::DISCONNECTED => ReplyBody::Disconnected,
        reply_kind::SENT_BATCH => decode_sent_batch(r)?,
        _ => return Err(r.fail("unknown reply kind")),
    })
}

/// Checks a frame's length prefix before its payload is read.
pub fn check_frame_len(prefix: [u8; LENGTH_PREFIX_BYTES]) -> Result<usize, DecodeError> {
    let len = u32::from_be_bytes(prefix) as usize;
    if len > FRAME_BYTES_MAX {
        return Err(DecodeError {
            reason: Reason::TooLarge,
            request_id: None,
            detail: "frame longer than FRAME_BYTES_MAX",
        });
    }
    Ok(len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn name() -> impl Strategy<Value = String> {
        "[a-z0-9_é]{0,20}"
    }

    fn target() -> impl Strategy<Value = ReadTarget> {
        prop_oneof![
            name().prop_map(ReadTarget::Queue),
            (proptest::option::of(name()), proptest::option::of(any::<u64>()))
                .prop_map(|(queue, sender)| ReadTarget::ForMe { queue, sender }),
        ]
    }

    fn mode() -> impl Strategy<Value = ReadMode> {
        prop_oneof![
            Just(ReadMode::Pop),
            Just(ReadMode::Peek),
            any::<u32>().prop_map(|lease_ms| ReadMode::Lease { lease_ms }),
        ]
    }

    fn request() -> impl Strategy<Value = Request> {
        prop_oneof![
            (name(), proptest::collection::vec(any::<u8>(), 0..40))
                .prop_map(|(name, secret)| Request::Register { name, secret: Secret(secret) }),
            name().prop_map(|name| Request::CreateQueue { name }),
            (name(), any::<bool>()).prop_map(|(name, purge)| Request::DeleteQueue { name, purge }),
            (
                name(),
                proptest::option::of(any::<u64>()),
                proptest::collection::vec(any::<u8>(), 0..300)
            )
                .prop_map(|(queue, receiver, content)| Request::Send {
                    queue,
                    receiver,
                    content
                }),
            (target(), mode()).prop_map(|(target, mode)| Request::Read { target, mode }),
            any::<u64>().prop_map(|message_id| Request::Ack { message_id }),
            Just(Request::ListQueues),
            name().prop_map(|queue| Request::Stats { queue }),
            Just(Request::Disconnect),
        ]
    }

    fn reply_body() -> impl Strategy<Value = ReplyBody> {
        let message = (any::<u64>(), name(), any::<u64>(), proptest::option::of(any::<u64>()))
            .prop_flat_map(|(id, queue, sender, receiver)| {
                (any::<u64>(), any::<u32>(), proptest::collection::vec(any::<u8>(), 0..100))
                    .prop_map(move |(arrived_us, deliveries, content)| {
                        ReplyBody::Message(Message {
                            id,
                            queue: queue.clone(),
                            sender,
                            receiver,
                            arrived_us,
                            deliveries,
                            content,
                        })
                    })
            });
        prop_oneof![
            any::<u64>().prop_map(|client_id| ReplyBody::Registered { client_id }),
            any::<u64>().prop_map(|queue_id| ReplyBody::QueueCreated { queue_id }),
            any::<u64>().prop_map(|purged_messages| ReplyBody::QueueDeleted { purged_messages }),
            (any::<u64>(), any::<u64>())
                .prop_map(|(message_id, arrived_us)| ReplyBody::Sent { message_id, arrived_us }),
            message,
            Just(ReplyBody::Acked),
            proptest::collection::vec(name(), 0..10).prop_map(ReplyBody::Queues),
            (any::<[u64; 13]>(), any::<u32>(), any::<u32>()).prop_map(
                |(v, handler_slots, db_workers)| {
                    ReplyBody::Stats(NodeStats {
                        sends_committed: v[0],
                        pops_committed: v[1],
                        batches_committed: v[2],
                        db_busy_ns: v[3],
                        handler_busy_ns: v[4],
                        handler_slots,
                        db_workers,
                        queue_depth: v[5],
                        connections_open: v[6],
                        connections_refused: v[7],
                        connections_cut_off: v[8],
                        connections_idle_closed: v[9],
                        reply_memory_bytes: v[10],
                        reply_memory_bytes_peak: v[11],
                        reply_memory_refused: v[12],
                    })
                }
            ),
            Just(ReplyBody::Disconnected),
            proptest::collection::vec(send_outcome(), 0..=SEND_BATCH_MAX)
                .prop_map(ReplyBody::SentBatch),
        ]
    }

    fn send_outcome() -> impl Strategy<Value = SendOutcome> {
        prop_oneof![
            (any::<u64>(), any::<u64>())
                .prop_map(|(message_id, arrived_us)| Ok(Sent { message_id, arrived_us })),
            (reason(), name()).prop_map(|(r, d)| Err(ErrorReply::new(r, d))),
        ]
    }

    fn batched_send() -> impl Strategy<Value = BatchedSend> {
        (name(), proptest::option::of(any::<u64>()), proptest::collection::vec(any::<u8>(), 0..100))
            .prop_map(|(queue, receiver, content)| BatchedSend { queue, receiver, content })
    }

    fn encoded_batch(request_id: u64, sends: &[BatchedSend]) -> Vec<u8> {
        let refs = sends.iter().map(|s| SendRef {
            queue: &s.queue,
            receiver: s.receiver,
            content: &s.content,
        });
        let mut out = Vec::new();
        assert_eq!(encode_send_batch(request_id, refs, &mut out), sends.len());
        out.split_off(LENGTH_PREFIX_BYTES)
    }

    /// A SendBatch header (version, op, request id 5) with `count`, followed by `body`.
    fn batch_header(count: u16, body: &[u8]) -> Vec<u8> {
        let mut payload = vec![PROTOCOL_VERSION, op::SEND_BATCH];
        payload.extend_from_slice(&5u64.to_be_bytes());
        payload.extend_from_slice(&count.to_be_bytes());
        payload.extend_from_slice(body);
        payload
    }

    fn reason() -> impl Strategy<Value = Reason> {
        (1u16..=20).prop_map(|v| Reason::from_u16(v).expect("1..=20 are reasons"))
    }

    fn payload(frame: &[u8]) -> &[u8] {
        let len = check_frame_len(frame[..4].try_into().unwrap()).unwrap();
        assert_eq!(len, frame.len() - LENGTH_PREFIX_BYTES, "length prefix covers the payload");
        &frame[LENGTH_PREFIX_BYTES..]
    }

    proptest! {
        #[test]
        fn request_roundtrips(request_id in any::<u64>(), request in request()) {
            let frame = RequestFrame { request_id, request };
            let mut out = Vec::new();
            encode_request(&frame, &mut out);
            prop_assert_eq!(decode_request(payload(&out)).unwrap(), frame);
        }

        #[test]
        fn reply_roundtrips(
            request_id in any::<u64>(),
            t in any::<[u64; 3]>(),
            result in prop_oneof![
                reply_body().prop_map(Ok),
                (reason(), name()).prop_map(|(r, d)| Err(ErrorReply::new(r, d))),
            ],
        ) {
            let timing = ServerTiming { queue_wait_ns: t[0], db_ns: t[1], middleware_ns: t[2] };
            let frame = ReplyFrame { request_id, timing, result };
            let mut out = Vec::new();
            encode_reply(&frame, &mut out);
            prop_assert_eq!(decode_reply(payload(&out)).unwrap(), frame);
        }

        /// Whatever decodes re-encodes to exactly its bytes: the decoder accepts nothing the
        /// encoder would not produce (valid requests with random bytes overwritten).
        #[test]
        fn decoding_is_canonical(
            request in request(),
            damage in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
        ) {
            let mut out = Vec::new();
            encode_request(&RequestFrame { request_id: 9, request }, &mut out);
            let mut payload = out.split_off(LENGTH_PREFIX_BYTES);
            for (at, byte) in damage {
                let at = at.index(payload.len());
                payload[at] = byte;
            }
            if let Ok(frame) = decode_request(&payload) {
                let mut again = Vec::new();
                encode_request(&frame, &mut again);
                prop_assert_eq!(&again[LENGTH_PREFIX_BYTES..], payload.as_slice());
            }
        }

        #[test]
        fn send_batches_roundtrip(
            request_id in any::<u64>(),
            sends in proptest::collection::vec(batched_send(), 1..=SEND_BATCH_MAX),
        ) {
            let payload = encoded_batch(request_id, &sends);
            let frame = SendBatchFrame { request_id, sends };
            prop_assert_eq!(decode_frame(&payload).unwrap(), IncomingFrame::Sends(frame));
        }

        /// A damaged batch either fails with a reason that keeps the request id, or decodes to
        /// something that re-encodes to exactly its bytes.
        #[test]
        fn damaged_send_batches_fail_cleanly_or_decode_canonically(
            sends in proptest::collection::vec(batched_send(), 1..8),
            damage in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        ) {
            let mut payload = encoded_batch(9, &sends);
            for (at, byte) in damage {
                let at = at.index(payload.len());
                payload[at] = byte;
            }
            match decode_frame(&payload) {
                Ok(IncomingFrame::Sends(batch)) => {
                    prop_assert!((1..=SEND_BATCH_MAX).contains(&batch.sends.len()));
                    let again = encoded_batch(batch.request_id, &batch.sends);
                    prop_assert_eq!(again, payload);
                }
                Ok(IncomingFrame::One(frame)) => {
                    let mut again = Vec::new();
                    encode_request(&frame, &mut again);
                    prop_assert_eq!(&again[LENGTH_PREFIX_BYTES..], payload.as_slice());
                }
                Err(e) => prop_assert!(
                    matches!(e.reason, Reason::Malformed | Reason::TooLarge | Reason::UnknownOp
                        | Reason::UnsupportedVersion),
                    "{e}"
                ),
            }
        }

        #[test]
        fn truncated_send_batches_are_malformed(
            sends in proptest::collection::vec(batched_send(), 1..8),
            cut in any::<prop::sample::Index>(),
        ) {
            let payload = encoded_batch(11, &sends);
            let cut_at = cut.index(payload.len());
            let e = decode_frame(&payload[..cut_at]).unwrap_err();
            prop_assert_eq!(e.reason, Reason::Malformed);
            let mut longer = payload.clone();
            longer.push(0);
            let e = decode_frame(&longer).unwrap_err();
            prop_assert_eq!((e.reason, e.request_id), (Reason::Malformed, Some(11)));
        }

        #[test]
        fn random_bodies_after_a_batch_header_never_panic(
            count in any::<u16>(),
            body in proptest::collection::vec(any::<u8>(), 0..400),
        ) {
            match decode_frame(&batch_header(count, &body)) {
                Ok(IncomingFrame::Sends(batch)) => {
                    prop_assert_eq!(batch.sends.len(), usize::from(count));
                }
                Ok(IncomingFrame::One(_)) => prop_assert!(false, "a batch decoded as one request"),
                Err(e) => prop_assert_eq!(e.request_id, Some(5)),
            }
        }

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode_request(&bytes);
            let _ = decode_reply(&bytes);
        }

        #[test]
        fn truncated_or_extended_frames_are_malformed(request in request(), cut in any::<prop::sample::Index>()) {
            let mut out = Vec::new();
            encode_request(&RequestFrame { request_id: 7, request }, &mut out);
            let body = &out[LENGTH_PREFIX_BYTES..];
            let cut_at = cut.index(body.len());
            if let Err(e) = decode_request(&body[..cut_at]) {
                prop_assert!(matches!(e.reason, Reason::Malformed));
            } else {
                prop_assert!(false, "a truncated frame decoded");
            }
            let mut longer = body.to_vec();
            longer.push(0);
            let e = decode_request(&longer).unwrap_err();
            prop_assert_eq!(e.reason, Reason::Malformed);
            prop_assert_eq!(e.request_id, Some(7));
        }
    }

    #[test]
    fn a_send_batch_count_outside_one_to_the_maximum_is_refused_with_its_reason() {
        let e = decode_frame(&batch_header(0, &[])).unwrap_err();
        assert_eq!((e.reason, e.request_id), (Reason::Malformed, Some(5)));
        assert!(e.detail.contains("at least one"), "{e}");
        // Refused on the count alone: the body is never read (or allocated for).
        for count in [SEND_BATCH_MAX as u16 + 1, u16::MAX] {
            let e = decode_frame(&batch_header(count, &[])).unwrap_err();
            assert_eq!((e.reason, e.request_id), (Reason::TooLarge, Some(5)), "{count}");
            assert!(e.detail.contains("at most 64"), "{e}");
        }
        let sends = vec![
            BatchedSend { queue: "q".into(), receiver: None, content: vec![1] };
            SEND_BATCH_MAX
        ];
        let payload = encoded_batch(5, &sends);
        assert!(
            matches!(decode_frame(&payload), Ok(IncomingFrame::Sends(b)) if b.sends.len() == 64)
        );
        let e = decode_request(&payload).unwrap_err();
        assert_eq!((e.reason, e.request_id), (Reason::UnknownOp, Some(5)), "{e}");
    }

    #[test]
    fn a_sent_batch_reply_past_the_maximum_or_with_an_unknown_code_is_malformed() {
        let mut out = Vec::new();
        let outcomes = vec![Ok(Sent { message_id: 1, arrived_us: 2 }); SEND_BATCH_MAX + 1];
        let frame = ReplyFrame {
            request_id: 3,
            timing: ServerTiming::default(),
            result: Ok(ReplyBody::SentBatch(outcomes)),
        };
        encode_reply(&frame, &mut out);
        let e = decode_reply(&out[LENGTH_PREFIX_BYTES..]).unwrap_err();
        assert_eq!((e.reason, e.request_id), (Reason::Malformed, Some(3)));
        out.clear();
        let one = ReplyFrame {
            result: Ok(ReplyBody::SentBatch(vec![Err(ErrorReply::new(Reason::Busy, "b"))])),
            ..frame
        };
        encode_reply(&one, &mut out);
        // The outcome's reason code sits after the header (37 bytes), the kind and the count.
        let code_at = LENGTH_PREFIX_BYTES + 1 + 8 * 4 + 1 + 2;
        out[code_at..code_at + 2].copy_from_slice(&999u16.to_be_bytes());
        let e = decode_reply(&out[LENGTH_PREFIX_BYTES..]).unwrap_err();
        assert_eq!(e.detail, "unknown reason code");
    }

    #[test]
    fn oversized_length_prefix_is_refused_before_reading() {
        let prefix = u32::try_from(FRAME_BYTES_MAX + 1).unwrap().to_be_bytes();
        assert_eq!(check_frame_len(prefix).unwrap_err().reason, Reason::TooLarge);
    }

    #[test]
    fn wrong_version_and_unknown_op_keep_the_request_id() {
        let mut frame = vec![9, op::LIST_QUEUES];
        frame.extend_from_slice(&42u64.to_be_bytes());
        let e = decode_request(&frame).unwrap_err();
        assert_eq!((e.reason, e.request_id), (Reason::UnsupportedVersion, Some(42)));
        frame[0] = PROTOCOL_VERSION;
        frame[1] = 200;
        let e = decode_request(&frame).unwrap_err();
        assert_eq!((e.reason, e.request_id), (Reason::UnknownOp, Some(42)));
    }
}
