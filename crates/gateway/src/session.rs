//! What both protocols' connections share: liveness timers, writing the outbox, and detaching
//! from the client state (with cancel-on-disconnect after the grace window).

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use crate::hub::Hub;
use crate::link::Link;

/// How often a connection checks its timers, at most.
const TIMER_TICK_MAX: Duration = Duration::from_millis(250);
/// Wait before retrying cancel-on-disconnect requests the full ingress ring refused.
const CANCEL_RETRY: Duration = Duration::from_millis(10);

/// How long a closing session waits for the store to release its last messages.
const CLOSE_FLUSH_TIMEOUT: Duration = Duration::from_secs(2);

/// A session's connection: the bare `TcpStream` on a plain listener, a TLS stream over it
/// on a TLS one ([`crate::tls`]). The sessions are generic over it, so the plain path is
/// compiled for the `TcpStream` itself and pays nothing for TLS.
pub trait Stream: AsyncRead + AsyncWrite + Unpin {}

impl<T: AsyncRead + AsyncWrite + Unpin> Stream for T {}

/// Whether a connection goes on.
pub enum Flow {
    Continue,
    Close(&'static str),
}

/// A connection's timers and its writer's buffer.
pub struct Conn {
    pub heartbeat: Duration,
    pub last_read: Instant,
    pub last_write: Instant,
    pub test_pending: bool,
    /// The outbox is swapped into here and written, so routing never waits on the socket.
    writing: Vec<u8>,
}

impl Conn {
    pub fn new(heartbeat: Duration) -> Conn {
        let now = Instant::now();
        Conn {
            heartbeat,
            last_read: now,
            last_write: now,
            test_pending: false,
            writing: Vec::new(),
        }
    }

    /// The longest a write may wait for the peer to read: as long as a silent peer is
    /// given ([`crate::settings::DEAD_LINK_INTERVALS`] heartbeats).
    pub fn write_timeout(&self) -> Duration {
        self.heartbeat * crate::settings::DEAD_LINK_INTERVALS
    }

    /// Time until the next timer check.
    pub fn tick(&self) -> Duration {
        (self.heartbeat / 4).min(TIMER_TICK_MAX)
    }
}

/// Writes whatever the link has queued, within [`Conn::write_timeout`]: a peer that stops
/// reading ends its session like a silent one (its timers, dead-link detection and
/// cancel-on-disconnect included), instead of holding the connection's task in a write.
pub async fn write_out(
    stream: &mut impl Stream,
    link: &Link,
    conn: &mut Conn,
) -> std::io::Result<()> {
    if link.is_written() {
        return Ok(());
    }
    link.take_out(&mut conn.writing);
    // The flush is free on a `TcpStream`; a TLS stream may hold records until it.
    let write = async {
        stream.write_all(&conn.writing).await?;
        stream.flush().await
    };
    let written = tokio::time::timeout(conn.write_timeout(), write).await;
    conn.writing.clear();
    conn.last_write = Instant::now();
    written.unwrap_or_else(|_| {
        Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "the peer stopped reading"))
    })
}

/// [`write_out`], or why the session ends.
pub async fn write_or_end(
    stream: &mut impl Stream,
    link: &Link,
    conn: &mut Conn,
) -> Result<(), &'static str> {
    match write_out(stream, link, conn).await {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::TimedOut => {
            Err("write timed out: the peer stopped reading")
        }
        Err(_) => Err("write failed"),
    }
}

/// Writes what the session queued before it closes, first waiting (boundedly) for the store
/// to release what it holds: a closing answer such as a Logout is held like any other message.
pub async fn write_final(stream: &mut impl Stream, link: &Link, conn: &mut Conn) {
    let deadline = tokio::time::Instant::now() + CLOSE_FLUSH_TIMEOUT;
    while link.is_holding() {
        if tokio::time::timeout_at(deadline, link.woken()).await.is_err() {
            break;
        }
    }
    let _ = write_out(stream, link, conn).await;
}

/// Detaches the connection from its client; after the grace window, if the client has not
/// come back, cancels its open orders.
pub fn detach(hub: &Rc<RefCell<Hub>>, at: usize) {
    let (generation, grace) = {
        let mut hub = hub.borrow_mut();
        let grace = hub.settings().cancel_on_disconnect;
        let client = hub.client_mut(at);
        if let Some(cut) = client.link().and_then(|link| link.cut()) {
            client.counters_mut().cut_off += 1;
            let reason = cut.reason();
            tracing::warn!(client = client.credential().client, reason, "session cut off");
        }
        hub.detach_link(at);
        (hub.client(at).generation(), grace)
    };
    if let Some(grace) = grace {
        cancel_after_grace(hub, at, generation, grace);
    }
}

/// After `grace`, unless the client connected since (its generation moved on), cancels its
/// open orders. Also run at start for clients with orders in the recovered books.
pub fn cancel_after_grace(hub: &Rc<RefCell<Hub>>, at: usize, generation: u64, grace: Duration) {
    let hub = hub.clone();
    tokio::task::spawn_local(async move {
        tokio::time::sleep(grace).await;
        if hub.borrow().client(at).generation() != generation {
            return; // reconnected (or reconnected and left again: that detach decides)
        }
        let cancels = hub.borrow().cancels_for(at);
        if !cancels.is_empty() {
            tracing::info!(
                client = hub.borrow().client(at).credential().client,
                orders = cancels.len(),
                "cancel on disconnect"
            );
        }
        for cancel in cancels {
            loop {
                let pushed = hub.borrow_mut().push_unthrottled(cancel);
                match pushed {
                    Err(crate::hub::Refused::Busy) => {}
                    _ => break, // pushed, or the tier is gone (shutdown)
                }
                tokio::time::sleep(CANCEL_RETRY).await;
            }
        }
        hub.borrow_mut().commit();
    });
}
