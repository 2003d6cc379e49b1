//! Connections: where every execution model accepts and serves them, with every phase timed.
//!
//! Every model (`single`, `pool`, `pinned` and `adaptive` in one process, and each process of
//! `prefork` and of the per-core `adaptive` layout) serves its connections through [`serve`]:
//! one accept loop per process, one task per connection (HTTP/1.1, hyper). Here:
//!
//! - **Connection limit.** At most `connections_max` connections are served at once per process;
//!   one more is answered 503 with code 010 (one write, before any request is read) and closed.
//!   Refusals are logged once per [`REFUSAL_LOG_INTERVAL`] with their count, not one line each.
//! - **Idle timeout.** A connection waiting for a request's first byte (a new one, or a keep-alive
//!   one after its answer) is closed after `idle_timeout`. Writing an answer counts as activity,
//!   so a client that reads a large answer slowly keeps its connection; one that stops reading
//!   is closed `idle_timeout` after its last progress.
//! - **Header timeout.** From a request's first byte, its header must be complete within
//!   `header_timeout` however the bytes trickle in (slowloris); else the connection is closed.
//! - **Body timeout.** From the first read of a body, the whole body must arrive within
//!   `body_timeout`; else the request is answered 408 with code 013 and the connection closed.
//!   The clock starts when the body is first read, not when the header arrived, so time spent
//!   waiting for work admission ([`crate::admission`]) does not count against the client.
//!
//! How: the connection's socket is wrapped (`TimedIo`) so that a read or write that would
//! block also polls the connection's current deadline, and the request service moves that
//! deadline between phases (`ConnState`). Nothing is allocated or locked for it per request in
//! the steady state: moving a deadline is two relaxed stores (and a clock read), the service
//! wakes its own task once per answer (one more poll, no system call), and the one timer per
//! connection is reset only when it fires (the deadline moved later meanwhile) or the deadline
//! moves earlier while a read waits (a header arriving in pieces).

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::serve::Listener;
use bytes::Bytes;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::Semaphore;
use tokio::time::{Instant, Sleep};

use crate::api::{self, Failure};

/// Default header timeout: a header is a few hundred bytes, sent at once by any real client.
pub const HEADER_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);
/// Default body timeout: a 16 MiB body (the default bound) needs about 1.3 MB/s.
pub const BODY_TIMEOUT_DEFAULT: Duration = Duration::from_secs(12);
/// Default keep-alive idle timeout.
pub const IDLE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(60);
/// Default connection limit per process: half of the common 1024-descriptor limit, so the
/// process keeps descriptors for everything else.
pub const CONNECTIONS_MAX_DEFAULT: usize = 512;
/// The most a connection buffers of what it reads (hyper's default is 417 KB): with the
/// connection limit, it bounds the memory of connections that are not yet admitted, or whose
/// refused body is drained (in `tests/large_load.rs`, 46 refused 1.3 MB bodies drained at once:
/// peak RSS growth 33-36 MiB with the default, 26-27 MiB with this bound).
/// A header must fit in it.
pub const READ_BUFFER_BYTES_MAX: usize = 128 << 10;
/// How long a refused connection's 503 may take to write before the connection is dropped.
const REFUSAL_WRITE_TIMEOUT: Duration = Duration::from_millis(100);
/// At most one log line per interval about refused connections.
pub const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// The per-connection bounds of one process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ConnectionBounds {
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    pub idle_timeout: Duration,
    pub connections_max: usize,
}

impl Default for ConnectionBounds {
    fn default() -> Self {
        ConnectionBounds {
            header_timeout: HEADER_TIMEOUT_DEFAULT,
            body_timeout: BODY_TIMEOUT_DEFAULT,
            idle_timeout: IDLE_TIMEOUT_DEFAULT,
            connections_max: CONNECTIONS_MAX_DEFAULT,
        }
    }
}

impl ConnectionBounds {
    /// Why these bounds are unusable, if they are (a zero bound would refuse everything).
    pub fn check(&self) -> Result<(), String> {
        let timeouts = [
            ("header_timeout", self.header_timeout),
            ("body_timeout", self.body_timeout),
            ("idle_timeout", self.idle_timeout),
        ];
        if let Some((name, _)) = timeouts.iter().find(|(_, timeout)| timeout.is_zero()) {
            return Err(format!("{name} must be > 0"));
        }
        if self.connections_max == 0 || self.connections_max > Semaphore::MAX_PERMITS {
            return Err(format!("connections_max must be 1..={}", Semaphore::MAX_PERMITS));
        }
        Ok(())
    }
}

/// Serves `router` on every connection `listener` accepts until `shutdown`, then stops
/// accepting and waits for the open connections to finish their requests.
pub async fn serve<L: Listener>(
    mut listener: L,
    router: Router,
    bounds: ConnectionBounds,
    shutdown: impl Future<Output = ()>,
) {
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(bounds.connections_max));
    let refusal = refusal_answer(bounds.connections_max);
    let mut refusals = RefusalLog::default();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let io = tokio::select! {
            (io, _) = listener.accept() => io,
            () = &mut shutdown => break,
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            refusals.note(bounds.connections_max);
            tokio::spawn(refuse_connection(io, refusal.clone()));
            continue;
        };
        let connection = serve_io(io, router.clone(), bounds, Some(graceful.watcher()));
        tokio::spawn(async move {
            connection.await;
            drop(slot);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// Serves one connection (any byte stream: a socket, or an in-memory pipe in tests and the
/// decoder soak) with the idle, header and body timeouts of `bounds`, until it closes.
pub async fn serve_io<T>(io: T, router: Router, bounds: ConnectionBounds, watcher: Option<Watcher>)
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let state = Arc::new(ConnState::new(bounds));
    let router = TowerToHyperService::new(router);
    let service = hyper::service::service_fn({
        let state = Arc::clone(&state);
        move |request: hyper::Request<Incoming>| {
            state.enter_request();
            let request =
                request.map(|body| Body::new(DeadlineBody::new(body, bounds.body_timeout)));
            let response = hyper::service::Service::call(&router, request);
            let state = Arc::clone(&state);
            async move {
                let response: Result<_, Infallible> = response.await;
                state.enter_waiting();
                // hyper writes the answer and, without a timer of its own, does not read again
                // until the socket is readable: this wake polls the connection once more so
                // that TimedIo's waiting read arms the idle deadline.
                std::future::poll_fn(|cx| {
                    cx.waker().wake_by_ref();
                    Poll::Ready(())
                })
                .await;
                response
            }
        }
    });
    let io = TokioIo::new(TimedIo { io, state, timer: None });
    // No hyper timer: the header timeout is TimedIo's, which hyper's own would not tell apart
    // from the idle time before a request.
    let connection = hyper::server::conn::http1::Builder::new()
        .max_buf_size(READ_BUFFER_BYTES_MAX)
        .serve_connection(io, service);
    let ended = match watcher {
        Some(watcher) => watcher.watch(connection).await,
        None => connection.await,
    };
    if let Err(error) = ended {
        tracing::debug!(%error, "connection ended");
    }
}

/// What an over-limit connection is sent: a whole 503 response with code 010.
fn refusal_answer(connections_max: usize) -> Bytes {
    let mut body = Vec::new();
    api::write_failure(None, &Failure::too_many_connections(connections_max), &mut body);
    let head = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    Bytes::from([head.into_bytes(), body].concat())
}

async fn refuse_connection<T: AsyncWrite + Unpin>(mut io: T, answer: Bytes) {
    let write = async {
        io.write_all(&answer).await?;
        io.shutdown().await
    };
    // A client that does not take the answer at once loses it; the descriptor is not held.
    let _ = tokio::time::timeout(REFUSAL_WRITE_TIMEOUT, write).await;
}

/// Counts refused connections and logs them at most once per [`REFUSAL_LOG_INTERVAL`].
#[derive(Default)]
struct RefusalLog {
    logged_at: Option<Instant>,
    unlogged: u64,
}

impl RefusalLog {
    fn note(&mut self, connections_max: usize) {
        self.unlogged += 1;
        if self.logged_at.is_none_or(|at| at.elapsed() >= REFUSAL_LOG_INTERVAL) {
            tracing::warn!(
                refused = self.unlogged,
                connections_max,
                "connection limit reached; refused connections since the last report"
            );
            self.logged_at = Some(Instant::now());
            self.unlogged = 0;
        }
    }
}

/// Where a connection is in its request cycle, as far as its deadline goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Phase {
    /// Before a request's first byte, or writing an answer: the idle timeout.
    Waiting,
    /// From a request's first byte until its header is complete: the header timeout.
    Head,
    /// From the complete header until the answer is ready: no connection deadline (the body
    /// has its own, and computing is bounded by admission).
    Request,
}

/// A connection's phase and deadline, moved by the request service and read by [`TimedIo`].
struct ConnState {
    bounds: ConnectionBounds,
    /// The origin of `deadline_ns`.
    epoch: Instant,
    phase: AtomicU8,
    /// Nanoseconds after `epoch`; [`NO_DEADLINE`] while a request is served.
    deadline_ns: AtomicU64,
}

const NO_DEADLINE: u64 = u64::MAX;

// Relaxed throughout: the service and the socket wrapper run in the same task (hyper polls the
// service inside the connection's future), so their accesses are ordered by program order and,
// when the task moves between threads, by the runtime's own synchronisation.
impl ConnState {
    fn new(bounds: ConnectionBounds) -> ConnState {
        let state = ConnState {
            bounds,
            epoch: Instant::now(),
            phase: AtomicU8::new(Phase::Waiting as u8),
            deadline_ns: AtomicU64::new(NO_DEADLINE),
        };
        state.enter_waiting();
        state
    }

    fn phase(&self) -> Phase {
        match self.phase.load(Ordering::Relaxed) {
            0 => Phase::Waiting,
            1 => Phase::Head,
            _ => Phase::Request,
        }
    }

    fn set(&self, phase: Phase, timeout: Option<Duration>) {
        let deadline_ns = timeout.map_or(NO_DEADLINE, |timeout| {
            let ns = (self.epoch.elapsed() + timeout).as_nanos();
            u64::try_from(ns).unwrap_or(NO_DEADLINE - 1)
        });
        self.phase.store(phase as u8, Ordering::Relaxed);
        self.deadline_ns.store(deadline_ns, Ordering::Relaxed);
    }

    fn enter_request(&self) {
        self.set(Phase::Request, None);
    }

    fn enter_waiting(&self) {
        self.set(Phase::Waiting, Some(self.bounds.idle_timeout));
    }

    fn on_read(&self) {
        if self.phase() == Phase::Waiting {
            self.set(Phase::Head, Some(self.bounds.header_timeout));
        }
    }

    fn on_written(&self) {
        if self.phase() == Phase::Waiting {
            self.enter_waiting();
        }
    }

    fn deadline(&self) -> Option<Instant> {
        match self.deadline_ns.load(Ordering::Relaxed) {
            NO_DEADLINE => None,
            ns => Some(self.epoch + Duration::from_nanos(ns)),
        }
    }
}

/// A connection's socket whose blocked reads and writes end with `TimedOut` at the connection's
/// deadline, which closes the connection.
struct TimedIo<T> {
    io: T,
    state: Arc<ConnState>,
    /// Created on the first wait with a deadline; fires at or before the current deadline.
    timer: Option<Pin<Box<Sleep>>>,
}

impl<T> TimedIo<T> {
    /// Called when the socket would block: pending until the deadline, then the error.
    fn poll_deadline<R>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<R>> {
        let Some(deadline) = self.state.deadline() else {
            return Poll::Pending;
        };
        let timer = self.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if timer.deadline() > deadline {
            timer.as_mut().reset(deadline);
        }
        loop {
            ready!(timer.as_mut().poll(cx));
            if Instant::now() >= deadline {
                let phase = self.state.phase();
                let message = match phase {
                    Phase::Head => "header timeout",
                    Phase::Waiting | Phase::Request => "idle timeout",
                };
                return Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, message)));
            }
            // The timer was set for an earlier deadline that has since moved later.
            timer.as_mut().reset(deadline);
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for TimedIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Pending => this.poll_deadline(cx),
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    this.state.on_read();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
        }
    }
}

impl<T: AsyncWrite + Unpin> TimedIo<T> {
    fn after_write(
        &mut self,
        cx: &mut Context<'_>,
        wrote: Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        match wrote {
            Poll::Pending => self.poll_deadline(cx),
            Poll::Ready(Ok(bytes)) => {
                if bytes > 0 {
                    self.state.on_written();
                }
                Poll::Ready(Ok(bytes))
            }
            Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for TimedIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let wrote = Pin::new(&mut this.io).poll_write(cx, buf);
        this.after_write(cx, wrote)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let wrote = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.after_write(cx, wrote)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// A request body that ended because it did not arrive within the body timeout.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {} ms", .0.as_millis())]
pub struct BodyTimeout(pub Duration);

/// A request body with a deadline, counted from its first read.
struct DeadlineBody {
    inner: Incoming,
    timeout: Duration,
    started: Option<Instant>,
    /// Created on the first read that has to wait (most small bodies never wait).
    timer: Option<Pin<Box<Sleep>>>,
}

impl DeadlineBody {
    fn new(inner: Incoming, timeout: Duration) -> DeadlineBody {
        DeadlineBody { inner, timeout, started: None, timer: None }
    }
}

impl hyper::body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        let started = *this.started.get_or_insert_with(Instant::now);
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => Poll::Ready(frame.map(|frame| frame.map_err(Into::into))),
            Poll::Pending => {
                let deadline = started + this.timeout;
                let timer =
                    this.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                ready!(timer.as_mut().poll(cx));
                Poll::Ready(Some(Err(BodyTimeout(this.timeout).into())))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bounds() -> ConnectionBounds {
        ConnectionBounds {
            header_timeout: Duration::from_secs(2),
            body_timeout: Duration::from_secs(3),
            idle_timeout: Duration::from_secs(5),
            connections_max: 1,
        }
    }

    /// The deadline follows the phases: idle while waiting (and while an answer makes
    /// progress), the header timeout from a request's first byte, none while it is served.
    #[test]
    fn deadline_follows_the_phases() {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let _entered = runtime.enter();
        // `timeout` from now: between the instants taken around the call that set it.
        let set_within = |state: &ConnState, set: &dyn Fn(&ConnState), timeout: Duration| {
            let before = Instant::now();
            set(state);
            let deadline = state.deadline().unwrap();
            assert!(deadline >= before + timeout && deadline <= Instant::now() + timeout);
            deadline
        };
        let pause = || std::thread::sleep(Duration::from_millis(5));
        let state = ConnState::new(bounds());
        set_within(&state, &ConnState::enter_waiting, Duration::from_secs(5));
        let head = set_within(&state, &ConnState::on_read, Duration::from_secs(2));
        assert_eq!(state.phase(), Phase::Head);
        pause();
        state.on_read();
        assert_eq!(state.deadline(), Some(head), "more header bytes do not extend it");
        state.enter_request();
        assert_eq!(state.deadline(), None);
        state.on_written();
        assert_eq!(state.deadline(), None, "a 100-continue does not arm the idle timeout");
        let idle = set_within(&state, &ConnState::enter_waiting, Duration::from_secs(5));
        pause();
        let progressed = set_within(&state, &ConnState::on_written, Duration::from_secs(5));
        assert!(progressed > idle, "writing an answer is progress");
    }

    #[test]
    fn zero_bounds_are_refused() {
        assert!(ConnectionBounds::default().check().is_ok());
        let zero = ConnectionBounds { body_timeout: Duration::ZERO, ..bounds() };
        assert!(zero.check().unwrap_err().contains("body_timeout"));
        let none = ConnectionBounds { connections_max: 0, ..bounds() };
        assert!(none.check().unwrap_err().contains("connections_max"));
    }

    #[test]
    fn the_refusal_is_a_whole_503_with_code_010() {
        let answer = refusal_answer(7);
        let text = std::str::from_utf8(&answer).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 503 ") && head.contains("connection: close"));
        assert!(head.contains(&format!("content-length: {}", body.len())), "{head}");
        let json: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(json["errorCode"], "010");
        assert!(json["errorMessage"].as_str().unwrap().contains("at most 7"));
    }
}
