//! What the PostgreSQL store costs on the wire: bytes each way on its connections, batches,
//! statements and round trips, counted as they happen (relaxed atomics, a few per batch and per
//! socket read or write, none per message). `leantier mq bench` divides them by the messages of
//! a phase for its per-message budget.
//!
//! Bytes are counted by wrapping the TCP stream the pool's connections run on
//! (`CountedConnect`, a `deadpool_postgres::Connect`, and [`connect_counted`]); a connection
//! over a Unix socket is made by tokio-postgres itself and its bytes are not counted.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_postgres::NoTls;
use tokio_postgres::config::Host;

/// Running totals of one store (all its connections). Relaxed: statistics read after the fact.
#[derive(Debug, Default)]
pub struct WireCounters {
    bytes_sent: AtomicU64,
    bytes_received: AtomicU64,
    batches: AtomicU64,
    statements: AtomicU64,
    round_trips: AtomicU64,
}

/// A reading of [`WireCounters`]; differences of two readings cover what happened between them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct WireTotals {
    /// Bytes the node wrote to PostgreSQL (TCP payload).
    pub bytes_sent: u64,
    /// Bytes the node read from PostgreSQL.
    pub bytes_received: u64,
    /// Batches executed (committed or not).
    pub batches: u64,
    /// Statements sent, BEGIN and COMMIT included.
    pub statements: u64,
    /// Times a batch waited for the server: one per pipelined batch, plus one per statement
    /// prepared on a connection for the first time.
    pub round_trips: u64,
}

impl WireTotals {
    /// `self - earlier`, saturating.
    pub fn since(&self, earlier: &WireTotals) -> WireTotals {
        WireTotals {
            bytes_sent: self.bytes_sent.saturating_sub(earlier.bytes_sent),
            bytes_received: self.bytes_received.saturating_sub(earlier.bytes_received),
            batches: self.batches.saturating_sub(earlier.batches),
            statements: self.statements.saturating_sub(earlier.statements),
            round_trips: self.round_trips.saturating_sub(earlier.round_trips),
        }
    }
}

impl WireCounters {
    pub fn totals(&self) -> WireTotals {
        WireTotals {
            bytes_sent: self.bytes_sent.load(Ordering::Relaxed),
            bytes_received: self.bytes_received.load(Ordering::Relaxed),
            batches: self.batches.load(Ordering::Relaxed),
            statements: self.statements.load(Ordering::Relaxed),
            round_trips: self.round_trips.load(Ordering::Relaxed),
        }
    }

    /// Counts one executed batch of `statements` statements and `round_trips` waits.
    pub(crate) fn batch(&self, statements: u64, round_trips: u64) {
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.statements.fetch_add(statements, Ordering::Relaxed);
        self.round_trips.fetch_add(round_trips, Ordering::Relaxed);
    }
}

/// A byte stream whose reads and writes are added to shared counters.
pub struct CountedStream<S> {
    inner: S,
    counters: Arc<WireCounters>,
}

impl<S> CountedStream<S> {
    pub fn new(inner: S, counters: Arc<WireCounters>) -> CountedStream<S> {
        CountedStream { inner, counters }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for CountedStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        let read = (buf.filled().len() - before) as u64;
        self.counters.bytes_received.fetch_add(read, Ordering::Relaxed);
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for CountedStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(written)) = &polled {
            self.counters.bytes_sent.fetch_add(*written as u64, Ordering::Relaxed);
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Opens the pool's connections over counted TCP streams (see the module docs).
pub(crate) struct CountedConnect {
    pub(crate) counters: Arc<WireCounters>,
}

type Connected = (tokio_postgres::Client, tokio::task::JoinHandle<()>);

impl deadpool_postgres::Connect for CountedConnect {
    fn connect(
        &self,
        pg: &tokio_postgres::Config,
    ) -> Pin<Box<dyn Future<Output = Result<Connected, tokio_postgres::Error>> + Send + '_>> {
        let pg = pg.clone();
        Box::pin(async move { connect_counted(&pg, Arc::clone(&self.counters)).await })
    }
}

/// Connects like `pg.connect(NoTls)` and spawns the connection, over a counted TCP stream
/// (see the module docs); a benchmark's own connections use it too, so its peers' bytes are
/// counted the same way as the node's.
pub async fn connect_counted(
    pg: &tokio_postgres::Config,
    counters: Arc<WireCounters>,
) -> Result<Connected, tokio_postgres::Error> {
    let Some(stream) = tcp_stream(pg).await else {
        // A Unix socket, or a TCP connect that failed: tokio-postgres connects (and reports
        // its own error) itself, uncounted.
        let (client, connection) = pg.connect(NoTls).await?;
        return Ok((client, spawn_connection(connection)));
    };
    let (client, connection) = pg.connect_raw(CountedStream::new(stream, counters), NoTls).await?;
    Ok((client, spawn_connection(connection)))
}

/// The first TCP host's stream, with Nagle off as tokio-postgres sets it (replies would
/// otherwise wait for delayed acknowledgements).
async fn tcp_stream(pg: &tokio_postgres::Config) -> Option<TcpStream> {
    let Some(Host::Tcp(host)) = pg.get_hosts().first() else { return None };
    let port = pg.get_ports().first().copied().unwrap_or(5432);
    let limit = pg.get_connect_timeout().copied().unwrap_or(std::time::Duration::from_secs(5));
    let stream =
        tokio::time::timeout(limit, TcpStream::connect((host.as_str(), port))).await.ok()?.ok()?;
    stream.set_nodelay(true).ok()?;
    Some(stream)
}

fn spawn_connection<S, T>(
    connection: tokio_postgres::Connection<S, T>,
) -> tokio::task::JoinHandle<()>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::warn!(%error, "PostgreSQL connection failed");
        }
    })
}
