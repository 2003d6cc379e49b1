//! A blocking native-protocol client: what `exchange client` and the tests use.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use crate::native::{self, ClientMsg, ServerMsg};

/// Bytes read per `read` call.
const READ_CHUNK_BYTES: usize = 4096;

/// Why the client could not go on.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("connection: {0}")]
    Io(#[from] std::io::Error),
    #[error("the server sent a bad frame: {0}")]
    Decode(#[from] native::DecodeError),
    #[error("the server closed the connection")]
    Closed,
    #[error("secret is longer than {} bytes", native::SECRET_BYTES)]
    SecretTooLong,
}

/// One connection to `exchange serve`'s native listener.
pub struct NativeClient {
    stream: TcpStream,
    buffer: Vec<u8>,
    out: Vec<u8>,
}

impl NativeClient {
    pub fn connect(addr: SocketAddr) -> Result<NativeClient, ClientError> {
        let stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        Ok(NativeClient { stream, buffer: Vec::new(), out: Vec::new() })
    }

    /// Sends a Login and returns the server's answer.
    pub fn login(
        &mut self,
        client: u32,
        secret: &str,
        next_seq: u64,
        timeout: Duration,
    ) -> Result<ServerMsg, ClientError> {
        let secret = native::secret_field(secret).ok_or(ClientError::SecretTooLong)?;
        self.send(&ClientMsg::Login { client, secret, next_seq })?;
        self.recv(timeout)?.ok_or(ClientError::Closed)
    }

    pub fn send(&mut self, msg: &ClientMsg) -> Result<(), ClientError> {
        self.out.clear();
        native::encode_client(msg, &mut self.out);
        self.stream.write_all(&self.out)?;
        Ok(())
    }

    /// Sends raw bytes (tests of hostile input).
    pub fn send_raw(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        Ok(self.stream.write_all(bytes)?)
    }

    /// The next server message, skipping heartbeats; `Ok(None)` on timeout.
    pub fn recv(&mut self, timeout: Duration) -> Result<Option<ServerMsg>, ClientError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some((version, kind, payload, len)) = native::split_frame(&self.buffer)? {
                let msg = native::decode_server(version, kind, payload);
                self.buffer.drain(..len);
                match msg? {
                    ServerMsg::Heartbeat => {
                        self.send(&ClientMsg::Heartbeat)?;
                        continue;
                    }
                    msg => return Ok(Some(msg)),
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            self.stream.set_read_timeout(Some(left))?;
            let mut chunk = [0u8; READ_CHUNK_BYTES];
            match self.stream.read(&mut chunk) {
                Ok(0) => return Err(ClientError::Closed),
                Ok(n) => self.buffer.extend_from_slice(&chunk[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return Ok(None);
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}
