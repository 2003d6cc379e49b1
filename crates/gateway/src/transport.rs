//! The clients' connection (`exchange client`, `exchange load`, tests): plain TCP, or TLS
//! (rustls) to a server whose certificate chains to a given CA, optionally presenting a client
//! certificate (mutual TLS). One thread uses a [`Transport`] whole; `exchange load` splits it
//! into a [`Writer`] for its sender thread and a [`Reader`] for its reader thread.
//!
//! A plain connection splits into two handles on the socket, as before. A TLS connection has
//! one rustls state for both directions, so its halves share it behind a mutex, held only while
//! rustls encrypts or decrypts: the socket is non-blocking, the writer waits for room with the
//! lock released, and the reader reads the socket without it, so neither half can hold up the
//! other while the peer is slow.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use rustls::pki_types::ServerName;
use rustls::{ClientConnection, StreamOwned};

use crate::error::ClientError;
use ops::Timeout;

/// Bytes of TLS records read from the socket at once (a little more than one full record).
const RECORD_READ_BYTES: usize = 17 * 1024;

/// What a client needs to connect with TLS: the configuration (trusted CA, own certificate)
/// and the name the server's certificate must carry.
#[derive(Clone)]
pub struct ClientTls {
    config: Arc<rustls::ClientConfig>,
    server_name: ServerName<'static>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls").field("server_name", &self.server_name).finish_non_exhaustive()
    }
}

impl ClientTls {
    /// `server_name`: a DNS name or an IP address the server's certificate must be for.
    pub fn new(
        config: Arc<rustls::ClientConfig>,
        server_name: &str,
    ) -> Result<ClientTls, ClientError> {
        let server_name = ServerName::try_from(server_name.to_owned()).map_err(|_| {
            ClientError::Tls(format!("{server_name:?} is neither a DNS name nor an IP address"))
        })?;
        Ok(ClientTls { config, server_name })
    }

    /// From the PEM files (`ops::tls::ClientFiles`); a refusal names the file and the reason.
    pub fn from_files(
        files: ops::tls::ClientFiles<'_>,
        server_name: &str,
    ) -> Result<ClientTls, ops::OpsError> {
        let config = ops::tls::client_config_from_files(files)?;
        ClientTls::new(config, server_name)
            .map_err(|error| ops::OpsError::Tls { what: error.to_string(), source: None })
    }
}

/// One client connection, used whole by one thread.
pub enum Transport {
    Plain(TcpStream),
    Tls(Box<StreamOwned<ClientConnection, TcpStream>>),
}

impl Transport {
    /// Connects to `addr` (and completes the TLS handshake) within `timeout`, else fails
    /// naming the connect timeout; `TCP_NODELAY` is set.
    pub fn connect(
        addr: SocketAddr,
        timeout: Duration,
        tls: Option<&ClientTls>,
    ) -> Result<Transport, ClientError> {
        let started = Instant::now();
        let socket = connect_within(addr, timeout)?;
        socket.set_nodelay(true)?;
        let Some(tls) = tls else { return Ok(Transport::Plain(socket)) };
        let mut conn = ClientConnection::new(tls.config.clone(), tls.server_name.clone())
            .map_err(|error| ClientError::Tls(error.to_string()))?;
        let left = timeout.saturating_sub(started.elapsed()).max(Duration::from_millis(1));
        socket.set_read_timeout(Some(left))?;
        socket.set_write_timeout(Some(left))?;
        let mut handshake_socket = &socket;
        while conn.is_handshaking() {
            if let Err(error) = conn.complete_io(&mut handshake_socket) {
                return Err(handshake_failed(addr, timeout, error));
            }
        }
        socket.set_read_timeout(None)?;
        socket.set_write_timeout(None)?;
        Ok(Transport::Tls(Box::new(StreamOwned::new(conn, socket))))
    }

    /// The TCP socket under it.
    pub fn socket(&self) -> &TcpStream {
        match self {
            Transport::Plain(socket) => socket,
            Transport::Tls(stream) => &stream.sock,
        }
    }

    /// A writer and a reader for two threads.
    pub fn split(self) -> Result<(Writer, Reader), ClientError> {
        match self {
            Transport::Plain(socket) => {
                let writer = Writer(WriterKind::Plain(socket.try_clone()?));
                Ok((writer, Reader { socket, tls: None }))
            }
            Transport::Tls(stream) => {
                let StreamOwned { conn, sock } = *stream;
                sock.set_nonblocking(true)?;
                let shared = Arc::new(SharedTls { conn: Mutex::new(conn), socket: sock });
                let reader = TlsReader {
                    shared: shared.clone(),
                    raw: vec![0; RECORD_READ_BYTES].into_boxed_slice(),
                    raw_start: 0,
                    raw_end: 0,
                };
                let socket = shared.socket.try_clone()?;
                Ok((Writer(WriterKind::Tls(shared)), Reader { socket, tls: Some(reader) }))
            }
        }
    }
}

/// A failed handshake: the connect timeout when it took too long, else rustls' reason (an
/// untrusted certificate, a name that does not match, a client certificate refused).
fn handshake_failed(addr: SocketAddr, timeout: Duration, error: std::io::Error) -> ClientError {
    if matches!(error.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) {
        let waited_for = format!("no TLS handshake with {addr}");
        return ClientError::TimedOut {
            timeout: ops::Timeout::Connect,
            after: timeout,
            waited_for,
        };
    }
    ClientError::Tls(format!("TLS handshake with {addr}: {error}"))
}

impl Read for Transport {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Transport::Plain(socket) => socket.read(buf),
            Transport::Tls(stream) => stream.read(buf),
        }
    }
}

impl Write for Transport {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Transport::Plain(socket) => socket.write(buf),
            Transport::Tls(stream) => stream.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Transport::Plain(socket) => socket.flush(),
            Transport::Tls(stream) => stream.flush(),
        }
    }
}

/// The rustls state both halves of a split TLS connection share, and its (non-blocking) socket.
struct SharedTls {
    conn: Mutex<ClientConnection>,
    socket: TcpStream,
}

impl SharedTls {
    fn lock(&self) -> MutexGuard<'_, ClientConnection> {
        self.conn.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Waits until `socket` is readable (`POLLIN`) or writable (`POLLOUT`), or `timeout` passes.
fn wait_for(socket: &TcpStream, events: libc::c_short, timeout: Duration) {
    let mut fd = libc::pollfd { fd: socket.as_raw_fd(), events, revents: 0 };
    let millis = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: `fd` is one valid, writable pollfd that outlives the call; poll only writes its
    // `revents`.
    unsafe { libc::poll(&mut fd, 1, millis) };
}

/// The sending half.
pub struct Writer(WriterKind);

enum WriterKind {
    Plain(TcpStream),
    Tls(Arc<SharedTls>),
}

impl Write for Writer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match &mut self.0 {
            WriterKind::Plain(socket) => socket.write(buf),
            WriterKind::Tls(shared) => {
                // What fits in rustls' buffer (64 KiB), then out to the socket, until all is.
                let mut rest = buf;
                while !rest.is_empty() {
                    let taken = shared.lock().writer().write(rest)?;
                    rest = &rest[taken..];
                    flush_tls(shared)?;
                }
                Ok(buf.len())
            }
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match &mut self.0 {
            WriterKind::Plain(socket) => socket.flush(),
            WriterKind::Tls(shared) => flush_tls(shared),
        }
    }
}

/// Writes out every TLS record rustls holds, waiting for room with the lock released.
fn flush_tls(shared: &SharedTls) -> std::io::Result<()> {
    loop {
        let mut conn = shared.lock();
        if !conn.wants_write() {
            return Ok(());
        }
        match conn.write_tls(&mut &shared.socket) {
            Ok(_) => {}
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {
                drop(conn);
                wait_for(&shared.socket, libc::POLLOUT, Duration::from_millis(100));
            }
            Err(error) => return Err(error),
        }
    }
}

/// The receiving half: [`Reader::read_within`] for a thread of its own, or [`Reader::read`]
/// after `poll` on [`Reader::socket`] said bytes are there (`pending` first).
pub struct Reader {
    socket: TcpStream,
    tls: Option<TlsReader>,
}

/// The TLS records read from the socket and not yet decrypted.
struct TlsReader {
    shared: Arc<SharedTls>,
    raw: Box<[u8]>,
    raw_start: usize,
    raw_end: usize,
}

impl Reader {
    /// The socket to `poll`.
    pub fn socket(&self) -> &TcpStream {
        &self.socket
    }

    /// Whether bytes already read from the socket wait to be decrypted (TLS), so a reader that
    /// polls the socket must call [`Reader::read`] without waiting for it.
    pub fn pending(&self) -> bool {
        self.tls.as_ref().is_some_and(|tls| tls.raw_start < tls.raw_end)
    }

    /// What is there: plain, one read of the socket (a blocking one, so call it once `poll`
    /// says bytes or the close are there); TLS, what decrypts from the bytes read before and
    /// from one non-blocking read of the socket. `WouldBlock` when nothing is ready.
    pub fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match &mut self.tls {
            None => self.socket.read(buf),
            Some(tls) => tls.read(buf),
        }
    }

    /// [`Reader::read`], waiting up to `timeout` for bytes; `WouldBlock` or `TimedOut` when
    /// none came.
    pub fn read_within(&mut self, buf: &mut [u8], timeout: Duration) -> std::io::Result<usize> {
        if self.tls.is_none() {
            self.socket.set_read_timeout(Some(timeout.max(Duration::from_millis(1))))?;
            return self.socket.read(buf);
        }
        let deadline = Instant::now() + timeout;
        loop {
            match self.read(buf) {
                Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {}
                done => return done,
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(std::io::ErrorKind::WouldBlock.into());
            }
            wait_for(&self.socket, libc::POLLIN, left);
        }
    }
}

impl TlsReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let mut conn = self.shared.lock();
        let mut filled = plaintext(&mut conn, buf)?;
        while filled < buf.len() {
            if self.raw_start == self.raw_end {
                if filled > 0 {
                    break;
                }
                // The socket is read without the lock: the writer may encrypt meanwhile.
                drop(conn);
                match (&self.shared.socket).read(&mut self.raw) {
                    Ok(0) => return Ok(0),
                    Ok(n) => (self.raw_start, self.raw_end) = (0, n),
                    Err(error) => return Err(error),
                }
                conn = self.shared.lock();
            }
            let mut records = &self.raw[self.raw_start..self.raw_end];
            self.raw_start += conn.read_tls(&mut records)?;
            conn.process_new_packets().map_err(std::io::Error::other)?;
            filled += plaintext(&mut conn, &mut buf[filled..])?;
        }
        Ok(filled)
    }
}

/// The decrypted bytes rustls holds, into `buf`.
fn plaintext(conn: &mut ClientConnection, buf: &mut [u8]) -> std::io::Result<usize> {
    match conn.reader().read(buf) {
        Ok(n) => Ok(n),
        Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => Ok(0),
        Err(error) => Err(error),
    }
}

/// A TCP connection to `addr` opened within `timeout`, else an error naming the connect
/// timeout.
pub(crate) fn connect_within(
    addr: SocketAddr,
    timeout: Duration,
) -> Result<TcpStream, ClientError> {
    match TcpStream::connect_timeout(&addr, timeout) {
        Ok(stream) => Ok(stream),
        Err(e) if matches!(e.kind(), std::io::ErrorKind::TimedOut) => {
            let waited_for = format!("no connection to {addr}");
            Err(ClientError::TimedOut { timeout: Timeout::Connect, after: timeout, waited_for })
        }
        Err(e) => Err(e.into()),
    }
}
