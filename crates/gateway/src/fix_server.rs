//! The FIX 4.4 acceptor's connections: logon, the session layer (sequence numbers, heartbeats,
//! test requests, resends with gap fill, rejects, logout) and the order messages D, F and G.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use exchange::instruments::{DecimalError, InstrumentTable};
use exchange::msg::{InboundOrder, Reason, request_kind};
use tokio::io::AsyncReadExt;

use crate::admission::Ticket;
use crate::credentials::Verdict;
use crate::fix::unix_ns;
use crate::fix::{self, Message, tag};
use crate::fix_session::{ClOrdId, ExecId, FixState, Order, Pending};
use crate::hub::Hub;
use crate::hub::order_id;
use crate::link::Link;
use crate::native::{Event, event_kind, gateway_reason};
use crate::sequence::{self, Inbound, ResendStep};
use crate::session::{Conn, Flow, Stream, detach, write_final, write_or_end};

/// Bytes buffered from one FIX connection: two of the largest messages.
const READ_BUFFER_BYTES: usize = 2 * (fix::BODY_BYTES_MAX + 64);
/// Messages one ResendRequest is answered with at most; the peer asks again for the rest.
const RESEND_MESSAGES_MAX: usize = 1000;
/// Largest HeartBtInt accepted, in seconds.
const HEART_BT_INT_MAX_S: u64 = 300;

/// SessionRejectReason codes (FIX 4.4 tag 373).
mod session_reject {
    pub const INVALID_TAG: i64 = 0;
    pub const REQUIRED_TAG_MISSING: i64 = 1;
    pub const VALUE_INCORRECT: i64 = 5;
    pub const COMP_ID_PROBLEM: i64 = 9;
}

/// One FIX connection, from accept to close (its `TCP_NODELAY` set at accept).
pub async fn serve(hub: Rc<RefCell<Hub>>, mut stream: impl Stream, mut ticket: Ticket) {
    let mut buffer = Vec::with_capacity(READ_BUFFER_BYTES);
    let Some((at, heartbeat)) = logon(&hub, &mut stream, &mut buffer).await else { return };
    ticket.logged_in();
    commit(&mut hub.borrow_mut(), at);
    let link = hub.borrow().client(at).link().cloned().expect("logon attached a link");
    let mut conn = Conn::new(heartbeat);
    let mut resend_requested = false;
    // Messages sent in the same write as the Logon are in the buffer already: handled before
    // the first wait for more bytes, as every read's are.
    let mut unread = !buffer.is_empty();
    let reason = loop {
        if std::mem::take(&mut unread) {
            let flow =
                read_batch(&mut hub.borrow_mut(), at, &link, &mut buffer, &mut resend_requested);
            if let Flow::Close(reason) = flow {
                write_final(&mut stream, &link, &mut conn).await;
                break reason;
            }
        }
        if let Err(reason) = write_or_end(&mut stream, &link, &mut conn).await {
            break reason;
        }
        if let Some(cut) = link.cut() {
            break cut.reason();
        }
        tokio::select! {
            read = stream.read_buf(&mut buffer) => match read {
                Ok(0) | Err(_) => break "peer closed",
                Ok(_) => {
                    conn.last_read = Instant::now();
                    unread = true;
                }
            },
            _ = link.woken() => {}
            _ = tokio::time::sleep(conn.tick()) => {
                let flow = on_timer(&mut hub.borrow_mut(), at, &link, &mut conn);
                commit(&mut hub.borrow_mut(), at);
                if let Flow::Close(reason) = flow {
                    write_final(&mut stream, &link, &mut conn).await;
                    break reason;
                }
            }
        }
    };
    tracing::info!(
        client = hub.borrow().client(at).credential().client,
        reason,
        "FIX session ended"
    );
    detach(&hub, at);
}

/// Handles what one read brought, then persists the inbound sequence number once.
fn read_batch(
    hub: &mut Hub,
    at: usize,
    link: &Rc<Link>,
    buffer: &mut Vec<u8>,
    resend_requested: &mut bool,
) -> Flow {
    let flow = drain(hub, at, link, buffer, resend_requested);
    commit(hub, at);
    flow
}

/// Ends a unit of work of a session: the session's inbound sequence number goes into the store's batch,
/// which is written now if the session sent something (released once durable); otherwise it
/// rides on the next write — the one carrying the execution reports of the orders just read —
/// so a read costs no store syscall of its own. A crash before that write loses only inbound
/// numbers whose messages nobody has acknowledged: the restarted server asks for them again.
fn commit(hub: &mut Hub, at: usize) {
    hub.client_mut(at).fix_mut().store_mut().save_next_in();
    hub.log().borrow_mut().commit_if_holding();
}

/// Heartbeats out when idle; a TestRequest when the peer is quiet; dead after two intervals.
fn on_timer(hub: &mut Hub, at: usize, link: &Rc<Link>, conn: &mut Conn) -> Flow {
    let limit = hub.settings().outbox_bytes_max;
    let fix = hub.client_mut(at).fix_mut();
    let now = Instant::now();
    if now.duration_since(conn.last_read) >= conn.heartbeat * 2 + conn.heartbeat / 5 {
        return Flow::Close("dead link: no answer to TestRequest");
    }
    if now.duration_since(conn.last_read) >= conn.heartbeat + conn.heartbeat / 5
        && !conn.test_pending
    {
        conn.test_pending = true;
        let id = fix::utc_timestamp(unix_ns());
        fix.send(b"1", Some(link), limit, |b| {
            b.field(tag::TEST_REQ_ID, &id);
        });
    } else if now.duration_since(conn.last_write) >= conn.heartbeat {
        fix.send(b"0", Some(link), limit, |_| {});
    }
    Flow::Continue
}

/// Processes every complete message in `buffer`.
fn drain(
    hub: &mut Hub,
    at: usize,
    link: &Rc<Link>,
    buffer: &mut Vec<u8>,
    resend_requested: &mut bool,
) -> Flow {
    let mut start = 0;
    let mut flow = Flow::Continue;
    while start < buffer.len() && matches!(flow, Flow::Continue) {
        match fix::split_frame(&buffer[start..]) {
            Ok(None) => break,
            Ok(Some(len)) => {
                flow = on_message(hub, at, link, &buffer[start..start + len], resend_requested);
                start += len;
            }
            Err(error) => {
                // Garbled: FIX says ignore it (no sequence number consumed) and go on. Counted,
                // not logged at warn: a flood of garbage must not become a flood of logs.
                tracing::debug!(%error, "FIX: garbled message ignored");
                hub.client_mut(at).counters_mut().garbled += 1;
                start += fix::resync(&buffer[start..]);
            }
        }
    }
    buffer.drain(..start);
    if buffer.len() == buffer.capacity() {
        return Flow::Close("read buffer full without a complete message");
    }
    flow
}

/// The session layer for one framed message of a logged-on session.
fn on_message(
    hub: &mut Hub,
    at: usize,
    link: &Rc<Link>,
    bytes: &[u8],
    resend_requested: &mut bool,
) -> Flow {
    let limit = hub.settings().outbox_bytes_max;
    let parsed = Message::parse(bytes);
    let costly = parsed.as_ref().is_ok_and(|m| matches!(m.msg_type(), b"1" | b"2"));
    if costly && !hub.admit_session_message(at) {
        let fix = hub.client_mut(at).fix_mut();
        return logout(fix, link, limit, "TestRequests or ResendRequests over the throttle");
    }
    let fix = hub.client_mut(at).fix_mut();
    let message = match parsed {
        Ok(message) => message,
        Err(error) => {
            let ref_seq = fix.store().next_in as i64;
            fix.store_mut().next_in += 1;
            reject(fix, link, limit, ref_seq, session_reject::INVALID_TAG, 0, &error.to_string());
            return Flow::Continue;
        }
    };
    let Some(seq) = message.get(tag::MSG_SEQ_NUM).and_then(fix::parse_u64) else {
        return logout(fix, link, limit, "MsgSeqNum (34) missing or not a number");
    };
    let comp_ok = message.get(tag::SENDER_COMP_ID) == Some(fix.comp_id().as_bytes())
        && message.get(tag::TARGET_COMP_ID) == Some(fix.our_comp_id().as_bytes());
    if !comp_ok {
        reject(fix, link, limit, seq as i64, session_reject::COMP_ID_PROBLEM, 49, "CompID problem");
        return logout(fix, link, limit, "CompID problem");
    }
    let msg_type = message.msg_type();
    let gap_fill = message.get(tag::GAP_FILL_FLAG) == Some(b"Y");
    if msg_type == b"4" && !gap_fill {
        return sequence_reset(fix, link, limit, &message, seq);
    }
    if msg_type == b"2" {
        resend(fix, link, limit, &message);
    }
    if let Some(flow) = take_sequence(fix, link, limit, &message, seq, resend_requested) {
        return flow;
    }
    if message.get(tag::SENDING_TIME).is_none() {
        reject(
            fix,
            link,
            limit,
            seq as i64,
            session_reject::REQUIRED_TAG_MISSING,
            52,
            "SendingTime missing",
        );
        return Flow::Continue;
    }
    dispatch(hub, at, link, &message, seq)
}

/// FIX's sequence rules for message `seq`: a possible duplicate of one taken is dropped, a
/// number too low ends the session, a gap asks for a resend (once until it is filled); the
/// expected number is taken and `None` says go on.
fn take_sequence(
    fix: &mut FixState,
    link: &Rc<Link>,
    limit: usize,
    message: &Message,
    seq: u64,
    resend_requested: &mut bool,
) -> Option<Flow> {
    let next_in = fix.store().next_in;
    let poss_dup = message.get(tag::POSS_DUP_FLAG) == Some(b"Y");
    match sequence::fix_inbound(next_in, seq, poss_dup, *resend_requested) {
        Inbound::DropDuplicate => Some(Flow::Continue),
        Inbound::TooLow => {
            let text = format!("MsgSeqNum too low, expecting {next_in} but received {seq}");
            Some(logout(fix, link, limit, &text))
        }
        Inbound::Gap(ask_from) => {
            if let Some(from) = ask_from {
                *resend_requested = true;
                fix.send(b"2", Some(link), limit, |b| {
                    b.int(tag::BEGIN_SEQ_NO, from as i64).int(tag::END_SEQ_NO, 0);
                });
            }
            Some(Flow::Continue)
        }
        Inbound::Take => {
            *resend_requested = false;
            fix.store_mut().next_in += 1;
            None
        }
    }
}

fn dispatch(hub: &mut Hub, at: usize, link: &Rc<Link>, message: &Message, seq: u64) -> Flow {
    let limit = hub.settings().outbox_bytes_max;
    let fix = hub.client_mut(at).fix_mut();
    match message.msg_type() {
        b"0" | b"2" | b"3" => Flow::Continue,
        b"1" => {
            let id = message.get(tag::TEST_REQ_ID).unwrap_or(b"");
            fix.send(b"0", Some(link), limit, |b| {
                b.field(tag::TEST_REQ_ID, id);
            });
            Flow::Continue
        }
        b"4" => sequence_reset(fix, link, limit, message, seq),
        b"5" => {
            fix.send(b"5", Some(link), limit, |_| {});
            Flow::Close("logout")
        }
        b"A" => logout(fix, link, limit, "Logon received on a logged-on session"),
        b"D" | b"F" | b"G" => {
            application(hub, at, link, message, seq);
            Flow::Continue
        }
        other => {
            fix.send(b"j", Some(link), limit, |b| {
                b.int(tag::REF_SEQ_NUM, seq as i64)
                    .field(tag::REF_MSG_TYPE, other)
                    .int(tag::BUSINESS_REJECT_REASON, 3)
                    .field(tag::TEXT, b"Unsupported Message Type");
            });
            Flow::Continue
        }
    }
}

fn reject(
    fix: &mut FixState,
    link: &Rc<Link>,
    limit: usize,
    ref_seq: i64,
    reason: i64,
    ref_tag: u32,
    text: &str,
) {
    fix.send(b"3", Some(link), limit, |b| {
        b.int(tag::REF_SEQ_NUM, ref_seq);
        if ref_tag != 0 {
            b.int(tag::REF_TAG_ID, i64::from(ref_tag));
        }
        b.int(tag::SESSION_REJECT_REASON, reason).field(tag::TEXT, text.as_bytes());
    });
}

fn logout(fix: &mut FixState, link: &Rc<Link>, limit: usize, text: &str) -> Flow {
    fix.send(b"5", Some(link), limit, |b| {
        b.field(tag::TEXT, text.as_bytes());
    });
    Flow::Close("logout sent")
}

fn sequence_reset(
    fix: &mut FixState,
    link: &Rc<Link>,
    limit: usize,
    message: &Message,
    seq: u64,
) -> Flow {
    let next_in = fix.store().next_in;
    let reset = message.get(tag::NEW_SEQ_NO).and_then(fix::parse_u64);
    match reset.and_then(|new_seq| sequence::fix_sequence_reset(next_in, new_seq)) {
        Some(new_seq) => fix.store_mut().next_in = new_seq,
        None => reject(
            fix,
            link,
            limit,
            seq as i64,
            session_reject::VALUE_INCORRECT,
            36,
            "NewSeqNo must not decrease",
        ),
    }
    Flow::Continue
}

/// Answers a ResendRequest: application messages again with PossDupFlag, session messages (and
/// anything no longer stored) as SequenceReset-GapFill.
fn resend(fix: &mut FixState, link: &Rc<Link>, limit: usize, message: &Message) {
    let begin = message.get(tag::BEGIN_SEQ_NO).and_then(fix::parse_u64).unwrap_or(1).max(1);
    let last = fix.store().next_out - 1;
    let asked_end = match message.get(tag::END_SEQ_NO).and_then(fix::parse_u64) {
        Some(end) if end != 0 && end < last => end,
        _ => last,
    };
    // At most RESEND_MESSAGES_MAX stored messages per request: the work (store reads on the
    // I/O thread) and the outbox it fills stay bounded however long the history (a range of
    // numbers the store does not hold is one gap fill, whatever its length). A Heartbeat with
    // the next sequence number then shows the peer the rest is still missing; it asks again.
    let stored = match fix.store().range(begin, asked_end, RESEND_MESSAGES_MAX) {
        Ok(stored) => stored,
        Err(error) => {
            tracing::error!(%error, "FIX store: reading for a resend failed");
            Vec::new()
        }
    };
    let end = match stored.last() {
        Some(&(seq, _)) if stored.len() == RESEND_MESSAGES_MAX => seq,
        _ => asked_end,
    };
    tracing::info!(comp_id = %fix.comp_id(), begin, end, "FIX resend");
    let parsed: Vec<(u64, Message)> = stored
        .iter()
        .filter_map(|(seq, bytes)| Message::parse(bytes).ok().map(|old| (*seq, old)))
        .collect();
    let kinds = parsed.iter().map(|(seq, old)| (*seq, fix::is_session_type(old.msg_type())));
    sequence::resend_plan(begin, end, kinds, |step| match step {
        ResendStep::GapFill { from, to } => gap_fill(fix, link, limit, from, to),
        ResendStep::Resend { at, seq } => resend_one(fix, link, limit, seq, &parsed[at].1),
    });
    if end < asked_end {
        fix.send(b"0", Some(link), limit, |_| {});
    }
}

fn gap_fill(fix: &mut FixState, link: &Rc<Link>, limit: usize, from: u64, to: u64) {
    let now = fix::utc_timestamp(unix_ns());
    fix.hold_rebuilt(link, limit, |builder, ours, theirs| {
        builder
            .begin(b"4", ours, theirs, from)
            .field(tag::SENDING_TIME, &now)
            .field(tag::POSS_DUP_FLAG, b"Y")
            .field(tag::GAP_FILL_FLAG, b"Y")
            .int(tag::NEW_SEQ_NO, to as i64);
    });
}

fn resend_one(fix: &mut FixState, link: &Rc<Link>, limit: usize, seq: u64, old: &Message) {
    const HEADER: [u32; 9] = [8, 9, 35, 49, 56, 34, 52, 43, 122];
    let now = fix::utc_timestamp(unix_ns());
    fix.hold_rebuilt(link, limit, |builder, ours, theirs| {
        builder
            .begin(old.msg_type(), ours, theirs, seq)
            .field(tag::SENDING_TIME, &now)
            .field(tag::POSS_DUP_FLAG, b"Y")
            .field(tag::ORIG_SENDING_TIME, old.get(tag::SENDING_TIME).unwrap_or(&now));
        let fields = old.fields().filter(|(t, _)| !HEADER.contains(t) && *t != tag::CHECKSUM);
        for (field, value) in fields {
            builder.field(field, value);
        }
    });
}

/// Reads the Logon, checks it, verifies the password off the I/O thread, attaches the session.
async fn logon(
    hub: &Rc<RefCell<Hub>>,
    stream: &mut impl Stream,
    buffer: &mut Vec<u8>,
) -> Option<(usize, Duration)> {
    let timeout = hub.borrow().settings().logon_timeout;
    let len = tokio::time::timeout(timeout, read_frame(stream, buffer)).await.ok()??;
    let message = Message::parse(&buffer[..len]).ok()?;
    let field = |t| message.get(t);
    if message.msg_type() != b"A" {
        tracing::warn!("FIX: first message is not a Logon; disconnecting");
        return None;
    }
    let at = hub.borrow().fix_client_index(field(tag::SENDER_COMP_ID).unwrap_or(b""));
    // An unknown SenderCompID is checked against a stand-in hash: it takes as long as a known.
    let hash = at.map(|at| hub.borrow().client(at).credential().hash.clone());
    let password = field(tag::PASSWORD).unwrap_or(b"");
    let pending = hub.borrow().verifier().verify(hash, password);
    let verdict = pending.await;
    let at = at?;
    let ask = LogonAsk::of(&message)?;
    buffer.drain(..len);
    accept_logon(&mut hub.borrow_mut(), at, verdict, &ask)
}

/// What a Logon asks for besides its identity and password.
struct LogonAsk {
    seq: u64,
    /// HeartBtInt (108), when it is within `1..=HEART_BT_INT_MAX_S`.
    heartbeat_s: Option<u64>,
    /// ResetSeqNumFlag (141): both sides start again at 1.
    reset: bool,
    /// TargetCompID (56): who the client thinks it logs on to.
    to_us: Option<Vec<u8>>,
}

impl LogonAsk {
    /// `None` without a MsgSeqNum.
    fn of(message: &Message) -> Option<LogonAsk> {
        let field = |t| message.get(t);
        let seq = field(tag::MSG_SEQ_NUM).and_then(fix::parse_u64)?;
        let heartbeat_s = field(tag::HEART_BT_INT)
            .and_then(fix::parse_u64)
            .filter(|s| (1..=HEART_BT_INT_MAX_S).contains(s));
        let reset = field(tag::RESET_SEQ_NUM_FLAG) == Some(b"Y");
        let to_us = field(tag::TARGET_COMP_ID).map(|t| t.to_vec());
        Some(LogonAsk { seq, heartbeat_s, reset, to_us })
    }
}

/// Answers client `at`'s Logon, whose password check said `verdict`: refused (logged, `None`),
/// or its session starts on a new link, with the heartbeat interval it asked for.
fn accept_logon(
    hub: &mut Hub,
    at: usize,
    verdict: Verdict,
    ask: &LogonAsk,
) -> Option<(usize, Duration)> {
    let limit = hub.settings().outbox_bytes_max;
    let ours = hub.settings().fix_comp_id.clone();
    let client = hub.client_mut(at);
    let refusal = match () {
        _ if verdict == Verdict::Busy => Some("too many logons being verified: try again"),
        _ if verdict != Verdict::Match => Some("bad password"),
        _ if client.link().is_some() => Some("session already logged on"),
        _ if ask.to_us.as_deref() != Some(ours.as_bytes()) => {
            Some("TargetCompID is not this acceptor")
        }
        _ if ask.heartbeat_s.is_none() => Some("HeartBtInt (108) missing or outside 1..=300"),
        _ => None,
    };
    let fix = client.fix_mut();
    if let Some(text) = refusal {
        tracing::warn!(comp_id = %fix.comp_id(), text, "FIX logon refused");
        return None;
    }
    if ask.reset {
        fix.reset_session();
    }
    if ask.seq < fix.store().next_in {
        tracing::warn!(comp_id = %fix.comp_id(), seq = ask.seq, expected = fix.store().next_in, "FIX logon refused: MsgSeqNum too low");
        return None;
    }
    let link = Rc::new(Link::default());
    let heartbeat_s = ask.heartbeat_s.expect("checked above");
    confirm_logon(fix, &link, limit, ask, heartbeat_s);
    client.counters_mut().logons += 1;
    tracing::info!(comp_id = %client.credential().comp_id, "FIX logon");
    hub.attach_link(at, link);
    Some((at, Duration::from_secs(heartbeat_s)))
}

/// Sends the accepted Logon back, then a ResendRequest for what the client sent beyond what
/// the session expected (or takes its Logon's number as expected).
fn confirm_logon(
    fix: &mut FixState,
    link: &Rc<Link>,
    limit: usize,
    ask: &LogonAsk,
    heartbeat_s: u64,
) {
    fix.send(b"A", Some(link), limit, |b| {
        b.int(tag::ENCRYPT_METHOD, 0).int(tag::HEART_BT_INT, heartbeat_s as i64);
        if ask.reset {
            b.field(tag::RESET_SEQ_NUM_FLAG, b"Y");
        }
    });
    if ask.seq > fix.store().next_in {
        let from = fix.store().next_in as i64;
        fix.send(b"2", Some(link), limit, |b| {
            b.int(tag::BEGIN_SEQ_NO, from).int(tag::END_SEQ_NO, 0);
        });
    } else {
        fix.store_mut().next_in += 1;
    }
}

/// Reads until one valid frame is at the front of `buffer`; `None` on garbage or close.
async fn read_frame(stream: &mut impl Stream, buffer: &mut Vec<u8>) -> Option<usize> {
    loop {
        match fix::split_frame(buffer) {
            Ok(Some(len)) => return Some(len),
            Ok(None) if buffer.len() < buffer.capacity() => {}
            _ => {
                tracing::warn!("FIX: garbage before logon; disconnecting");
                return None;
            }
        }
        if stream.read_buf(buffer).await.ok()? == 0 {
            return None;
        }
    }
}

/// NewOrderSingle, OrderCancelRequest, OrderCancelReplaceRequest.
fn application(hub: &mut Hub, at: usize, link: &Rc<Link>, message: &Message, seq: u64) {
    let limit = hub.settings().outbox_bytes_max;
    let client_id = hub.client(at).credential().client;
    let fields = order_fields(message, &hub.settings().instruments);
    let fix = hub.client_mut(at).fix_mut();
    let request = match fields {
        Ok(request) => request,
        Err((ref_tag, reason, text)) => {
            return reject(fix, link, limit, seq as i64, reason, ref_tag, text);
        }
    };
    let wrong_client =
        message.get(tag::ACCOUNT).is_some_and(|a| fix::parse_u64(a) != Some(u64::from(client_id)));
    let prepared = match message.msg_type() {
        b"D" => new_order(fix, &request, client_id),
        _ => amend(fix, &request, client_id, message.msg_type() == b"G"),
    };
    let (token, inbound) = match prepared {
        Ok(prepared) => prepared,
        Err(Refusal::Report(token, reason)) => {
            return fix.report(&rejected(token, reason), ExecId::Session, Some(link), limit);
        }
        Err(Refusal::CancelReject(order, reason)) => {
            return fix.cancel_reject(0, &order, reason, Some(link), limit);
        }
    };
    let refused = if wrong_client {
        Some(gateway_reason::WRONG_CLIENT)
    } else if let Some(reason) = request.terms.off_grid {
        Some(reason as u8)
    } else {
        hub.submit(at, inbound).err().map(|r| r.reason())
    };
    if let Some(reason) = refused {
        let client = hub.client_mut(at);
        client.counters_mut().rejects[usize::from(reason)] += 1;
        let fix = client.fix_mut();
        fix.report(&rejected(token, reason), ExecId::Session, Some(link), limit);
    }
}

fn rejected(token: u32, reason: u8) -> Event {
    Event { kind: event_kind::REJECTED, reason, token, ..Event::default() }
}

/// The fields of D, F and G, parsed.
struct OrderFields<'a> {
    cl_ord_id: ClOrdId,
    orig_cl_ord_id: Option<&'a [u8]>,
    instrument: u32,
    side: u8,
    /// What a new order or a replace asks for (all zero for a cancel).
    terms: OrderTerms,
}

/// The terms of a new order or a replace.
#[derive(Default)]
struct OrderTerms {
    order_type: u8,
    time_in_force: u8,
    price: i64,
    qty: u32,
    /// A price or quantity no whole number of units expresses: refused with this reason.
    off_grid: Option<Reason>,
}

type FieldError = (u32, i64, &'static str);

/// Tag `t` of `message`, or the session reject for its absence.
fn required<'a>(message: &Message<'a>, t: u32) -> Result<&'a [u8], FieldError> {
    message.get(t).ok_or((t, session_reject::REQUIRED_TAG_MISSING, "required tag missing"))
}

/// The session reject for tag `t`'s value.
fn bad(t: u32) -> FieldError {
    (t, session_reject::VALUE_INCORRECT, "value is incorrect for this tag")
}

/// Tag `t` of `message` as text, or the session reject for its absence or its bytes.
fn text<'a>(message: &Message<'a>, t: u32) -> Result<&'a str, FieldError> {
    required(message, t).and_then(|v| std::str::from_utf8(v).map_err(|_| bad(t)))
}

fn order_fields<'a>(
    message: &Message<'a>,
    instruments: &InstrumentTable,
) -> Result<OrderFields<'a>, FieldError> {
    let required = |t: u32| required(message, t);
    let is_new_or_replace = message.msg_type() != b"F";
    let cl_ord_id = ClOrdId::new(required(tag::CL_ORD_ID)?).ok_or(bad(tag::CL_ORD_ID))?;
    let orig_cl_ord_id = if is_new_or_replace && message.msg_type() == b"D" {
        None
    } else {
        Some(required(tag::ORIG_CL_ORD_ID)?)
    };
    let instrument = instruments.id_of(text(message, tag::SYMBOL)?).ok_or((
        tag::SYMBOL,
        session_reject::VALUE_INCORRECT,
        "unknown symbol",
    ))?;
    let side = match required(tag::SIDE)? {
        b"1" => 0,
        b"2" => 1,
        _ => return Err(bad(tag::SIDE)),
    };
    required(tag::TRANSACT_TIME)?;
    let terms =
        if is_new_or_replace { order_terms(message, instruments)? } else { OrderTerms::default() };
    Ok(OrderFields { cl_ord_id, orig_cl_ord_id, instrument, side, terms })
}

/// A new order's or a replace's quantity, type, price and time in force.
fn order_terms(message: &Message, instruments: &InstrumentTable) -> Result<OrderTerms, FieldError> {
    // Decimals convert exactly or not at all: one that no whole number of units expresses is
    // refused by name (off tick, off lot); one that is not a number is a session reject.
    let mut off_grid = None;
    let mut exact = |t: u32, converted: Result<i64, DecimalError>, reason: Reason| match converted {
        Ok(units) => Ok(units),
        Err(DecimalError::TooPrecise) => {
            off_grid = Some(reason);
            Ok(0)
        }
        Err(_) => Err(bad(t)),
    };
    let qty = InstrumentTable::qty_units(text(message, tag::ORDER_QTY)?).map(i64::from);
    let qty = u32::try_from(exact(tag::ORDER_QTY, qty, Reason::QuantityOffLot)?)
        .map_err(|_| bad(tag::ORDER_QTY))?;
    let (order_type, price) = match required(message, tag::ORD_TYPE)? {
        b"1" => (1, 0),
        b"2" => {
            let price = instruments.price_units(text(message, tag::PRICE)?);
            (0, exact(tag::PRICE, price, Reason::PriceOffTick)?)
        }
        _ => return Err(bad(tag::ORD_TYPE)),
    };
    let time_in_force = match message.get(tag::TIME_IN_FORCE) {
        None | Some(b"0") => 0,
        Some(b"3") => 1,
        Some(b"4") => 2,
        Some(_) => return Err(bad(tag::TIME_IN_FORCE)),
    };
    Ok(OrderTerms { order_type, time_in_force, price, qty, off_grid })
}

enum Refusal {
    /// An ExecutionReport with ExecType Rejected for this token.
    Report(u32, u8),
    /// An OrderCancelReject (the order is not known).
    CancelReject(Box<Order>, u32),
}

fn new_order(
    fix: &mut FixState,
    request: &OrderFields,
    client: u32,
) -> Result<(u32, InboundOrder), Refusal> {
    let token = fix.take_token();
    let order = Order {
        cl_ord_id: request.cl_ord_id,
        side: b'1' + request.side,
        order_qty: request.terms.qty,
        price: request.terms.price,
        instrument: request.instrument,
        ..Order::default()
    };
    if !fix.open_order(token, order) {
        return Err(Refusal::Report(token, exchange::msg::Reason::DuplicateOrderId as u8));
    }
    Ok((token, inbound(request_kind::NEW, request, client, token)))
}

fn amend(
    fix: &mut FixState,
    request: &OrderFields,
    client: u32,
    replace: bool,
) -> Result<(u32, InboundOrder), Refusal> {
    const UNKNOWN_ORDER: u32 = exchange::msg::Reason::UnknownOrder as u32;
    let orig = request.orig_cl_ord_id.and_then(ClOrdId::new).unwrap_or_default();
    let pending = if replace {
        Pending::Replace {
            cl_ord_id: request.cl_ord_id,
            order_qty: request.terms.qty,
            price: request.terms.price,
        }
    } else {
        Pending::Cancel(request.cl_ord_id)
    };
    let stub = Order { cl_ord_id: orig, pending, ..Order::default() };
    let Some(token) = fix.token_of(&orig) else {
        return Err(Refusal::CancelReject(Box::new(stub), UNKNOWN_ORDER));
    };
    if replace && fix.token_of(&request.cl_ord_id).is_some() {
        // The new ClOrdID names a live order (or this one): taking it would leave that
        // order impossible to cancel by its ClOrdID.
        const DUPLICATE: u32 = exchange::msg::Reason::DuplicateOrderId as u32;
        return Err(Refusal::CancelReject(Box::new(stub), DUPLICATE));
    }
    let order = fix.order_mut(token);
    if !matches!(order.pending, Pending::None) {
        return Err(Refusal::CancelReject(Box::new(stub), UNKNOWN_ORDER));
    }
    order.pending = pending;
    let mut inbound = inbound(
        if replace { request_kind::REPLACE } else { request_kind::CANCEL },
        request,
        client,
        token,
    );
    inbound.instrument = order.instrument;
    if replace {
        match request.terms.qty.checked_sub(order.cum_qty).filter(|&q| q > 0) {
            Some(remaining) => inbound.qty = remaining,
            None => {
                order.pending = Pending::None;
                let order = *order;
                return Err(Refusal::CancelReject(
                    Box::new(Order { pending, ..order }),
                    UNKNOWN_ORDER,
                ));
            }
        }
    }
    Ok((token, inbound))
}

fn inbound(kind: u8, request: &OrderFields, client: u32, token: u32) -> InboundOrder {
    InboundOrder {
        kind,
        side: request.side,
        order_type: request.terms.order_type,
        time_in_force: request.terms.time_in_force,
        instrument: request.instrument,
        client,
        order_id: order_id(client, token),
        price: request.terms.price,
        qty: request.terms.qty,
        ..InboundOrder::default()
    }
}
