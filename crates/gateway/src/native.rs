//! The native binary protocol (docs/PROTOCOL.md): length-prefixed, versioned frames with a
//! fixed payload per message type, in the spirit of SoupBinTCP (login, heartbeats, sequenced
//! server messages with replay) and OUCH (orders and their events).
//!
//! Frame: `u16` big-endian length of what follows, `u8` version, `u8` type, payload. Every
//! payload has one exact size per type, so decoding is a bounds check and fixed-offset reads:
//! no allocation, and any other length is [`DecodeError::BadLength`].

use exchange::msg::{InstrumentId, Price, Qty};
use std::borrow::Cow;

/// The protocol version this build speaks.
pub const VERSION: u8 = 1;
/// Bytes of the length prefix.
pub const LENGTH_BYTES: usize = 2;
/// Largest frame (length prefix included) either side may send.
pub const FRAME_BYTES_MAX: usize = 64;
/// Bytes of a login secret on the wire (ASCII, NUL-padded).
pub const SECRET_BYTES: usize = 32;

/// Message type codes.
pub mod kind {
    // Client to server.
    pub const LOGIN: u8 = b'L';
    pub const NEW_ORDER: u8 = b'O';
    pub const CANCEL: u8 = b'X';
    pub const REPLACE: u8 = b'U';
    pub const LOGOUT: u8 = b'Z';
    // Both ways.
    pub const HEARTBEAT: u8 = b'H';
    // Server to client.
    pub const LOGIN_ACCEPTED: u8 = b'A';
    pub const LOGIN_REJECTED: u8 = b'J';
    pub const SEQUENCED: u8 = b'S';
    pub const ERROR: u8 = b'E';
}

/// What an order event ([`Event`]) reports.
pub mod event_kind {
    pub const ACCEPTED: u8 = 0;
    pub const PARTIALLY_FILLED: u8 = 1;
    pub const FILLED: u8 = 2;
    pub const CANCELLED: u8 = 3;
    pub const REPLACED: u8 = 4;
    pub const REJECTED: u8 = 5;
}

/// Reason codes the gateway adds to the tier's (`exchange::msg::Reason`, codes below 100).
pub mod gateway_reason {
    /// Over the session's message rate.
    pub const THROTTLED: u8 = 100;
    /// The tier's ingress ring is full.
    pub const BUSY: u8 = 101;
    /// The order names a client id other than the session's.
    pub const WRONG_CLIENT: u8 = 102;
    /// The server is stopping: it answers what it took and takes no more.
    pub const SHUTTING_DOWN: u8 = 103;
    /// Replayed after a restart in place of one of the gateway's own refusals (the reasons
    /// above), which the store does not keep: the token is 0 and the refused order never
    /// reached the exchange.
    pub const NOT_KEPT: u8 = 104;
    /// Not booked: a gateway without a tier gave up waiting for the input log's
    /// acknowledgement, and the log, once it answered, did not hold the order.
    pub const NOT_LOGGED: u8 = 105;
}

/// The name of a reject reason code, the tier's (`exchange::msg::Reason`) or the gateway's
/// ([`gateway_reason`]): what FIX Text (58) and `exchange client` show.
///
/// ```
/// use gateway::native::{gateway_reason, reason_name};
/// assert_eq!(reason_name(exchange::msg::Reason::PriceOffTick as u8), "PriceOffTick");
/// assert_eq!(reason_name(gateway_reason::THROTTLED), "Throttled");
/// assert_eq!(reason_name(gateway_reason::NOT_LOGGED), "NotLogged");
/// assert_eq!(reason_name(250), "250");
/// ```
pub fn reason_name(code: u8) -> Cow<'static, str> {
    let gateway_names =
        ["Throttled", "Busy", "WrongClient", "ShuttingDown", "NotKept", "NotLogged"];
    let gateway = code.checked_sub(gateway_reason::THROTTLED);
    if let Some(name) = gateway.and_then(|at| gateway_names.get(usize::from(at))) {
        return Cow::Borrowed(name);
    }
    match exchange::msg::Reason::ALL.get(usize::from(code)) {
        Some(reason) if code < gateway_reason::THROTTLED => Cow::Borrowed(reason.name()),
        _ => Cow::Owned(code.to_string()),
    }
}

/// Why a login was refused ([`ServerMsg::LoginRejected`]).
pub mod login_reject {
    pub const BAD_CREDENTIALS: u8 = 1;
    /// The requested replay sequence is older than the retained messages.
    pub const SEQUENCE_UNAVAILABLE: u8 = 2;
    /// The client id already has a live session.
    pub const ALREADY_LOGGED_IN: u8 = 3;
    /// Too many logins are being verified; try again later.
    pub const BUSY: u8 = 4;
}

/// Why the server ends a session ([`ServerMsg::Error`], then it closes the connection).
pub mod error_code {
    pub const MALFORMED: u8 = 1;
    pub const BAD_VERSION: u8 = 2;
    pub const UNKNOWN_TYPE: u8 = 3;
    pub const NOT_LOGGED_IN: u8 = 4;
    pub const DEAD_LINK: u8 = 5;
    pub const SLOW_CONSUMER: u8 = 6;
    /// Over twice its throttle's rate for a second.
    pub const THROTTLE_BREACH: u8 = 7;
}

/// An order request. `client` must be the session's own client id; `token` is the client's
/// order number, unique per client id.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OrderRequest {
    pub client: u32,
    pub token: u32,
    pub instrument: InstrumentId,
    pub side: u8,
    pub order_type: u8,
    pub time_in_force: u8,
    pub price: Price,
    pub qty: Qty,
}

/// A message from client to server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientMsg {
    /// `next_seq`: the first sequenced message the client wants (1 = everything since its
    /// first login; 0 = only messages from now on).
    Login {
        client: u32,
        secret: [u8; SECRET_BYTES],
        next_seq: u64,
    },
    Heartbeat,
    NewOrder(OrderRequest),
    /// Only `client`, `token` and `instrument` are read.
    Cancel(OrderRequest),
    /// `price` and `qty` are the new values.
    Replace(OrderRequest),
    Logout,
}

/// An order event, the payload of a sequenced server message.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Event {
    /// One of [`event_kind`].
    pub kind: u8,
    /// `exchange::msg::Reason` code or one of [`gateway_reason`]; 0 when none.
    pub reason: u8,
    pub side: u8,
    pub instrument: InstrumentId,
    pub token: u32,
    /// Execution price (fills) or order price.
    pub price: Price,
    /// Executed quantity (fills).
    pub qty: Qty,
    pub leaves_qty: Qty,
}

/// A message from server to client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServerMsg {
    /// `next_seq`: the sequence number the next sequenced message will carry after the replay.
    LoginAccepted {
        client: u32,
        next_seq: u64,
    },
    LoginRejected {
        reason: u8,
    },
    Heartbeat,
    Sequenced {
        seq: u64,
        event: Event,
    },
    Error {
        code: u8,
    },
}

/// Why bytes are not a valid frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("frame length {0} is outside 2..={max}", max = FRAME_BYTES_MAX - LENGTH_BYTES)]
    BadFrameLength(usize),
    #[error("protocol version {0}, this server speaks {VERSION}")]
    BadVersion(u8),
    #[error("unknown message type {0:#04x}")]
    UnknownType(u8),
    #[error("message type {kind:#04x} needs a {want}-byte payload, got {got}")]
    BadLength { kind: u8, want: usize, got: usize },
}

impl DecodeError {
    /// The [`error_code`] the server answers with.
    pub fn code(self) -> u8 {
        match self {
            DecodeError::BadVersion(_) => error_code::BAD_VERSION,
            DecodeError::UnknownType(_) => error_code::UNKNOWN_TYPE,
            DecodeError::BadFrameLength(_) | DecodeError::BadLength { .. } => error_code::MALFORMED,
        }
    }
}

/// Splits one frame off the front of `buffer`: `Ok(None)` when more bytes are needed,
/// `Ok(Some((version, type, payload, frame_bytes)))` otherwise.
#[allow(clippy::type_complexity)]
pub fn split_frame(buffer: &[u8]) -> Result<Option<(u8, u8, &[u8], usize)>, DecodeError> {
    let Some(prefix) = buffer.get(..LENGTH_BYTES) else { return Ok(None) };
    let length = u16::from_be_bytes([prefix[0], prefix[1]]) as usize;
    if !(2..=FRAME_BYTES_MAX - LENGTH_BYTES).contains(&length) {
        return Err(DecodeError::BadFrameLength(length));
    }
    let Some(body) = buffer.get(LENGTH_BYTES..LENGTH_BYTES + length) else { return Ok(None) };
    Ok(Some((body[0], body[1], &body[2..], LENGTH_BYTES + length)))
}

/// Fixed-offset reader over a payload whose length was checked.
struct Fields<'a>(&'a [u8]);

impl Fields<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let (head, rest) = self.0.split_at(N);
        self.0 = rest;
        head.try_into().expect("split_at(N) yields N bytes")
    }
    fn u8(&mut self) -> u8 {
        self.take::<1>()[0]
    }
    fn u32(&mut self) -> u32 {
        u32::from_be_bytes(self.take())
    }
    fn u64(&mut self) -> u64 {
        u64::from_be_bytes(self.take())
    }
    fn i64(&mut self) -> i64 {
        i64::from_be_bytes(self.take())
    }
}

fn expect_len(kind: u8, payload: &[u8], want: usize) -> Result<Fields<'_>, DecodeError> {
    if payload.len() != want {
        return Err(DecodeError::BadLength { kind, want, got: payload.len() });
    }
    Ok(Fields(payload))
}

const LOGIN_BYTES: usize = 4 + SECRET_BYTES + 8;
const ORDER_BYTES: usize = 4 + 4 + 4 + 3 + 8 + 4;
const EVENT_BYTES: usize = 3 + 4 + 4 + 8 + 4 + 4;

fn order(fields: &mut Fields) -> OrderRequest {
    OrderRequest {
        client: fields.u32(),
        token: fields.u32(),
        instrument: fields.u32(),
        side: fields.u8(),
        order_type: fields.u8(),
        time_in_force: fields.u8(),
        price: fields.i64(),
        qty: fields.u32(),
    }
}

fn check_version(version: u8) -> Result<(), DecodeError> {
    if version == VERSION { Ok(()) } else { Err(DecodeError::BadVersion(version)) }
}

/// Decodes a client message from a frame's parts (see [`split_frame`]).
pub fn decode_client(version: u8, kind: u8, payload: &[u8]) -> Result<ClientMsg, DecodeError> {
    check_version(version)?;
    Ok(match kind {
        kind::LOGIN => {
            let mut fields = expect_len(kind, payload, LOGIN_BYTES)?;
            ClientMsg::Login { client: fields.u32(), secret: fields.take(), next_seq: fields.u64() }
        }
        kind::HEARTBEAT => {
            expect_len(kind, payload, 0)?;
            ClientMsg::Heartbeat
        }
        kind::LOGOUT => {
            expect_len(kind, payload, 0)?;
            ClientMsg::Logout
        }
        kind::NEW_ORDER => ClientMsg::NewOrder(order(&mut expect_len(kind, payload, ORDER_BYTES)?)),
        kind::CANCEL => ClientMsg::Cancel(order(&mut expect_len(kind, payload, ORDER_BYTES)?)),
        kind::REPLACE => ClientMsg::Replace(order(&mut expect_len(kind, payload, ORDER_BYTES)?)),
        other => return Err(DecodeError::UnknownType(other)),
    })
}

/// Decodes a server message from a frame's parts (see [`split_frame`]).
pub fn decode_server(version: u8, kind: u8, payload: &[u8]) -> Result<ServerMsg, DecodeError> {
    check_version(version)?;
    Ok(match kind {
        kind::LOGIN_ACCEPTED => {
            let mut fields = expect_len(kind, payload, 12)?;
            ServerMsg::LoginAccepted { client: fields.u32(), next_seq: fields.u64() }
        }
        kind::LOGIN_REJECTED => {
            ServerMsg::LoginRejected { reason: expect_len(kind, payload, 1)?.u8() }
        }
        kind::HEARTBEAT => {
            expect_len(kind, payload, 0)?;
            ServerMsg::Heartbeat
        }
        kind::SEQUENCED => {
            let mut fields = expect_len(kind, payload, 8 + EVENT_BYTES)?;
            let seq = fields.u64();
            let event = Event {
                kind: fields.u8(),
                reason: fields.u8(),
                side: fields.u8(),
                instrument: fields.u32(),
                token: fields.u32(),
                price: fields.i64(),
                qty: fields.u32(),
                leaves_qty: fields.u32(),
            };
            ServerMsg::Sequenced { seq, event }
        }
        kind::ERROR => ServerMsg::Error { code: expect_len(kind, payload, 1)?.u8() },
        other => return Err(DecodeError::UnknownType(other)),
    })
}

/// Appends frames to a reusable buffer (no allocation once it has grown to its working size).
struct FrameWriter<'a> {
    out: &'a mut Vec<u8>,
    start: usize,
}

impl<'a> FrameWriter<'a> {
    fn new(out: &'a mut Vec<u8>, kind: u8) -> FrameWriter<'a> {
        let start = out.len();
        out.extend_from_slice(&[0, 0, VERSION, kind]);
        FrameWriter { out, start }
    }
    fn put(&mut self, bytes: &[u8]) -> &mut Self {
        self.out.extend_from_slice(bytes);
        self
    }
    fn finish(&mut self) {
        let length = self.out.len() - self.start - LENGTH_BYTES;
        assert!(length + LENGTH_BYTES <= FRAME_BYTES_MAX, "frame over FRAME_BYTES_MAX");
        self.out[self.start..self.start + 2].copy_from_slice(&(length as u16).to_be_bytes());
    }
}

fn put_order(frame: &mut FrameWriter, order: &OrderRequest) {
    frame
        .put(&order.client.to_be_bytes())
        .put(&order.token.to_be_bytes())
        .put(&order.instrument.to_be_bytes())
        .put(&[order.side, order.order_type, order.time_in_force])
        .put(&order.price.to_be_bytes())
        .put(&order.qty.to_be_bytes());
}

/// Appends one client message as a frame to `out`.
pub fn encode_client(msg: &ClientMsg, out: &mut Vec<u8>) {
    let (kind, order) = match msg {
        ClientMsg::Login { client, secret, next_seq } => {
            let mut frame = FrameWriter::new(out, kind::LOGIN);
            frame.put(&client.to_be_bytes()).put(secret).put(&next_seq.to_be_bytes());
            return frame.finish();
        }
        ClientMsg::Heartbeat => return FrameWriter::new(out, kind::HEARTBEAT).finish(),
        ClientMsg::Logout => return FrameWriter::new(out, kind::LOGOUT).finish(),
        ClientMsg::NewOrder(order) => (kind::NEW_ORDER, order),
        ClientMsg::Cancel(order) => (kind::CANCEL, order),
        ClientMsg::Replace(order) => (kind::REPLACE, order),
    };
    let mut frame = FrameWriter::new(out, kind);
    put_order(&mut frame, order);
    frame.finish();
}

/// Appends one server message as a frame to `out`.
pub fn encode_server(msg: &ServerMsg, out: &mut Vec<u8>) {
    match msg {
        ServerMsg::LoginAccepted { client, next_seq } => {
            let mut frame = FrameWriter::new(out, kind::LOGIN_ACCEPTED);
            frame.put(&client.to_be_bytes()).put(&next_seq.to_be_bytes());
            frame.finish();
        }
        ServerMsg::LoginRejected { reason } => {
            FrameWriter::new(out, kind::LOGIN_REJECTED).put(&[*reason]).finish()
        }
        ServerMsg::Heartbeat => FrameWriter::new(out, kind::HEARTBEAT).finish(),
        ServerMsg::Sequenced { seq, event } => {
            let mut frame = FrameWriter::new(out, kind::SEQUENCED);
            frame
                .put(&seq.to_be_bytes())
                .put(&[event.kind, event.reason, event.side])
                .put(&event.instrument.to_be_bytes())
                .put(&event.token.to_be_bytes())
                .put(&event.price.to_be_bytes())
                .put(&event.qty.to_be_bytes())
                .put(&event.leaves_qty.to_be_bytes());
            frame.finish();
        }
        ServerMsg::Error { code } => FrameWriter::new(out, kind::ERROR).put(&[*code]).finish(),
    }
}

/// Copies a secret into its fixed wire field; `None` if it is longer than [`SECRET_BYTES`].
pub fn secret_field(secret: &str) -> Option<[u8; SECRET_BYTES]> {
    let bytes = secret.as_bytes();
    let mut field = [0u8; SECRET_BYTES];
    field.get_mut(..bytes.len())?.copy_from_slice(bytes);
    Some(field)
}

/// The secret in a wire field, without its NUL padding.
pub fn secret_text(field: &[u8; SECRET_BYTES]) -> &[u8] {
    let end = field.iter().position(|&b| b == 0).unwrap_or(SECRET_BYTES);
    &field[..end]
}
