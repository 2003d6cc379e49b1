//! Native protocol connections: login with replay, heartbeats both ways with a dead-link
//! timeout, and orders into the tier.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Instant;

use exchange::msg::{InboundOrder, request_kind};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::admission::Ticket;
use crate::credentials::Verdict;
use crate::hub::Hub;
use crate::hub::order_id;
use crate::link::Link;
use crate::native::{
    self, ClientMsg, DecodeError, OrderRequest, ServerMsg, error_code, gateway_reason, login_reject,
};
use crate::session::{Conn, Flow, Stream, detach, write_final, write_or_end};
use crate::settings::DEAD_LINK_INTERVALS;

/// Bytes buffered from one connection (many frames per read).
const READ_BUFFER_BYTES: usize = 64 * native::FRAME_BYTES_MAX;

/// One native connection, from accept to close (its `TCP_NODELAY` set at accept).
pub async fn serve(hub: Rc<RefCell<Hub>>, mut stream: impl Stream, mut ticket: Ticket) {
    let mut buffer = Vec::with_capacity(READ_BUFFER_BYTES);
    let Some(at) = login(&hub, &mut stream, &mut buffer).await else { return };
    ticket.logged_in();
    let link = hub.borrow().client(at).link().cloned().expect("login attached a link");
    let mut conn = Conn::new(hub.borrow().settings().heartbeat);
    // Frames sent in the same write as the login are in the buffer already: handled before
    // the first wait for more bytes, as every read's are.
    let mut unread = !buffer.is_empty();
    let reason = loop {
        if std::mem::take(&mut unread) {
            let flow = drain(&mut hub.borrow_mut(), at, &link, &mut buffer);
            hub.borrow_mut().commit();
            if let Flow::Close(reason) = flow {
                write_final(&mut stream, &link, &mut conn).await;
                break reason;
            }
        }
        if let Err(reason) = write_or_end(&mut stream, &link, &mut conn).await {
            break reason;
        }
        if let Some(cut) = link.cut() {
            send_error(&mut stream, cut.error_code()).await;
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
                let now = Instant::now();
                if now.duration_since(conn.last_read) >= conn.heartbeat * DEAD_LINK_INTERVALS {
                    send_error(&mut stream, error_code::DEAD_LINK).await;
                    break "dead link";
                }
                if now.duration_since(conn.last_write) >= conn.heartbeat {
                    queue(&link, &ServerMsg::Heartbeat, &hub.borrow());
                }
            }
        }
    };
    tracing::info!(
        client = hub.borrow().client(at).credential().client,
        reason,
        "native session ended"
    );
    detach(&hub, at);
}

fn queue(link: &Link, msg: &ServerMsg, hub: &Hub) {
    let mut frame = Vec::with_capacity(native::FRAME_BYTES_MAX);
    native::encode_server(msg, &mut frame);
    link.send(&frame, hub.settings().outbox_bytes_max);
}

async fn send_error(stream: &mut impl Stream, code: u8) {
    let mut frame = Vec::with_capacity(native::FRAME_BYTES_MAX);
    native::encode_server(&ServerMsg::Error { code }, &mut frame);
    let _ = stream.write_all(&frame).await;
    let _ = stream.flush().await;
}

/// Decodes and handles every complete frame in `buffer`.
fn drain(hub: &mut Hub, at: usize, link: &Link, buffer: &mut Vec<u8>) -> Flow {
    let mut start = 0;
    let mut flow = Flow::Continue;
    while matches!(flow, Flow::Continue) {
        let decoded = match native::split_frame(&buffer[start..]) {
            Ok(None) => break,
            Ok(Some((version, kind, payload, len))) => {
                start += len;
                native::decode_client(version, kind, payload)
            }
            Err(error) => Err(error),
        };
        flow = match decoded {
            Ok(msg) => on_message(hub, at, msg),
            Err(error) => refuse(hub, link, error),
        };
    }
    buffer.drain(..start);
    flow
}

fn refuse(hub: &Hub, link: &Link, error: DecodeError) -> Flow {
    tracing::warn!(%error, "native: bad frame; ending the session");
    queue(link, &ServerMsg::Error { code: error.code() }, hub);
    Flow::Close("bad frame")
}

fn on_message(hub: &mut Hub, at: usize, msg: ClientMsg) -> Flow {
    let (kind, order) = match msg {
        ClientMsg::Heartbeat => return Flow::Continue,
        ClientMsg::Logout => return Flow::Close("logout"),
        ClientMsg::Login { .. } => {
            let link = hub.client(at).link().cloned().expect("logged on");
            queue(&link, &ServerMsg::Error { code: error_code::MALFORMED }, hub);
            return Flow::Close("second login");
        }
        ClientMsg::NewOrder(order) => (request_kind::NEW, order),
        ClientMsg::Cancel(order) => (request_kind::CANCEL, order),
        ClientMsg::Replace(order) => (request_kind::REPLACE, order),
    };
    let client = hub.client(at).credential().client;
    if order.client != client {
        hub.refuse_native(at, &order, gateway_reason::WRONG_CLIENT);
        return Flow::Continue;
    }
    if let Err(refused) = hub.submit(at, inbound(kind, &order)) {
        hub.refuse_native(at, &order, refused.reason());
    }
    Flow::Continue
}

fn inbound(kind: u8, order: &OrderRequest) -> InboundOrder {
    InboundOrder {
        kind,
        side: order.side,
        order_type: order.order_type,
        time_in_force: order.time_in_force,
        instrument: order.instrument,
        client: order.client,
        order_id: order_id(order.client, order.token),
        price: order.price,
        qty: order.qty,
        ..InboundOrder::default()
    }
}

/// Reads the Login, verifies the secret off the I/O thread, replays, attaches the session.
async fn login(
    hub: &Rc<RefCell<Hub>>,
    stream: &mut impl Stream,
    buffer: &mut Vec<u8>,
) -> Option<usize> {
    let timeout = hub.borrow().settings().logon_timeout;
    let msg = tokio::time::timeout(timeout, read_login(stream, buffer)).await.ok()?;
    let (client, secret, next_seq) = match msg {
        Ok(ClientMsg::Login { client, secret, next_seq }) => (client, secret, next_seq),
        Ok(_) => return answer(stream, ServerMsg::Error { code: error_code::NOT_LOGGED_IN }).await,
        Err(Some(error)) => return answer(stream, ServerMsg::Error { code: error.code() }).await,
        Err(None) => return None,
    };
    let native = |at: &usize| {
        hub.borrow().client(*at).credential().protocol == crate::credentials::Protocol::Native
    };
    let at = hub.borrow().client_index(client).filter(native);
    // An unknown client is checked against a stand-in hash: it takes as long as a known one.
    let hash = at.map(|at| hub.borrow().client(at).credential().hash.clone());
    let verdict = hub.borrow().verifier().verify(hash, native::secret_text(&secret));
    let reject = |reason| ServerMsg::LoginRejected { reason };
    match verdict.await {
        Verdict::Match => {}
        Verdict::NoMatch => return answer(stream, reject(login_reject::BAD_CREDENTIALS)).await,
        Verdict::Busy => return answer(stream, reject(login_reject::BUSY)).await,
    }
    let at = at.expect("a match is a known client's");
    let attached = attach(&mut hub.borrow_mut(), at, next_seq);
    match attached {
        Ok(()) => {
            hub.borrow_mut().commit();
            Some(at)
        }
        Err(reason) => answer(stream, reject(reason)).await,
    }
}

/// Attaches a new link to a verified client and queues the login answer and the replay.
fn attach(hub: &mut Hub, at: usize, next_seq: u64) -> Result<(), u8> {
    let client = hub.client(at);
    if client.link().is_some() {
        return Err(login_reject::ALREADY_LOGGED_IN);
    }
    let from =
        crate::sequence::native_replay_from(next_seq, client.next_seq(), client.first_kept_seq())
            .map_err(|_| login_reject::SEQUENCE_UNAVAILABLE)?;
    let accepted = ServerMsg::LoginAccepted { client: client.credential().client, next_seq: from };
    let mut frames = Vec::with_capacity(native::FRAME_BYTES_MAX);
    native::encode_server(&accepted, &mut frames);
    for (seq, event) in client.replay_from(from) {
        native::encode_server(&ServerMsg::Sequenced { seq, event }, &mut frames);
    }
    // The replay bypasses the outbox bound: it is bounded by `replay_events_max` frames and
    // is written before the session takes new reports. It is held like them: the newest
    // events it replays may still wait for their sync.
    let link = Rc::new(Link::default());
    hub.log().borrow_mut().hold(&link, &frames, usize::MAX);
    let client = hub.client_mut(at);
    client.counters_mut().logons += 1;
    tracing::info!(client = client.credential().client, replay_from = from, "native login");
    hub.attach_link(at, link);
    Ok(())
}

async fn answer(stream: &mut impl Stream, msg: ServerMsg) -> Option<usize> {
    let mut frame = Vec::with_capacity(native::FRAME_BYTES_MAX);
    native::encode_server(&msg, &mut frame);
    let _ = stream.write_all(&frame).await;
    let _ = stream.flush().await;
    None
}

/// Reads the first frame: `Err(None)` if the peer closed, `Err(Some(_))` if it is malformed.
async fn read_login(
    stream: &mut impl Stream,
    buffer: &mut Vec<u8>,
) -> Result<ClientMsg, Option<DecodeError>> {
    loop {
        match native::split_frame(buffer) {
            Ok(Some((version, kind, payload, len))) => {
                let msg = native::decode_client(version, kind, payload);
                buffer.drain(..len);
                return msg.map_err(Some);
            }
            Ok(None) => {}
            Err(error) => return Err(Some(error)),
        }
        match stream.read_buf(buffer).await {
            Ok(0) | Err(_) => return Err(None),
            Ok(_) => {}
        }
    }
}
