//! The client library: one TCP connection, request ids increasing from 1. Every reply's id is
//! checked against the request it answers.
//!
//! [`Client::call`] and the typed helpers keep one request outstanding. For throughput a client
//! may pipeline instead: [`Client::submit`] several requests (buffered, written together), then
//! [`Client::receive`] their replies, which the node returns in request order. Each reply still
//! comes only after its request's commit; pipelining only lets one connection contribute several
//! requests to one group commit. A client with several sends ready submits them as one
//! `SendBatch` frame ([`Client::submit_sends`]), answered by one reply with an outcome per send:
//! one frame each way instead of one per message.
//!
//! Every wait is bounded ([`Timeouts`]): connecting, a call's reply, and a pipelined reply on a
//! connection gone silent each fail with [`ClientError::TimedOut`] naming the bound that fired,
//! so a client of a node that accepts and never answers gives up instead of waiting for ever.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufStream};
use tokio::net::TcpStream;

use crate::protocol::{
    ErrorReply, LENGTH_PREFIX_BYTES, Message, NodeStats, ReadMode, ReadTarget, ReplyBody,
    ReplyFrame, Request, RequestFrame, SEND_BATCH_MAX, Secret, SendRef, ServerTiming,
    check_frame_len, decode_reply, encode_request, encode_send_batch,
};

/// The byte stream under a client: plain TCP or TLS over it.
trait Transport: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Transport for T {}

/// Default bound on connecting (TCP, and the TLS handshake).
pub const CONNECT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);
/// Default bound on one call, from writing the request to its reply: a node commits a batch
/// in milliseconds, so ten seconds without an answer is a node that is not answering.
pub const REQUEST_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);
/// Default bound on a pipelined reply ([`Client::receive`]): how long a connection with
/// requests outstanding may stay silent.
pub const IDLE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);

/// How long a client waits, per kind of wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// Connecting: TCP, and the TLS handshake with TLS.
    pub connect: Duration,
    /// One [`Client::call`] (and every typed helper): the request's write and its reply.
    pub request: Duration,
    /// One [`Client::receive`] of a pipelined reply: the connection silent this long with
    /// requests outstanding.
    pub idle: Duration,
}

impl Default for Timeouts {
    fn default() -> Timeouts {
        Timeouts {
            connect: CONNECT_TIMEOUT_DEFAULT,
            request: REQUEST_TIMEOUT_DEFAULT,
            idle: IDLE_TIMEOUT_DEFAULT,
        }
    }
}

/// Which bound of [`Timeouts`] fired.
pub use ops::Timeout;

/// What a fired bound means for a node's client, for its error.
fn what(timeout: Timeout) -> &'static str {
    match timeout {
        Timeout::Connect => "no connection to the node",
        Timeout::Request => "the node did not answer the request",
        Timeout::Idle => "the connection stayed silent with replies outstanding",
    }
}

/// `future`, or [`ClientError::TimedOut`] after `after`.
async fn bounded<T>(
    which: Timeout,
    after: Duration,
    future: impl Future<Output = Result<T, ClientError>>,
) -> Result<T, ClientError> {
    match tokio::time::timeout(after, future).await {
        Ok(result) => result,
        Err(_) => Err(ClientError::TimedOut { which, after }),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The node answered with a reason code.
    #[error("refused: {0}")]
    Refused(ErrorReply),
    #[error("connection: {0}")]
    Io(#[from] std::io::Error),
    /// The node's reply could not be decoded or did not match the request.
    #[error("protocol: {0}")]
    Protocol(String),
    /// A bound of [`Timeouts`] fired; the connection is unusable after it (a reply may still
    /// be on its way).
    #[error("{} timeout ({}) fired: {}", which.name(), humantime_like(*after), what(*which))]
    TimedOut { which: Timeout, after: Duration },
}

/// `10s`, `500ms`: a duration as the command line's flags take it.
fn humantime_like(after: Duration) -> String {
    if after.subsec_millis() == 0 && after.as_secs() > 0 {
        format!("{}s", after.as_secs())
    } else {
        format!("{}ms", after.as_millis())
    }
}

impl ClientError {
    /// The node's reason code, when the node refused the request.
    pub fn reason(&self) -> Option<crate::protocol::Reason> {
        match self {
            ClientError::Refused(e) => Some(e.reason),
            _ => None,
        }
    }
}

pub struct Client {
    stream: BufStream<Box<dyn Transport>>,
    next_request_id: u64,
    /// Frames submitted whose replies have not been received yet, oldest first: the first
    /// request id of each and how many requests it holds (1, or a `SendBatch`'s sends).
    outstanding: VecDeque<(u64, usize)>,
    out: Vec<u8>,
    payload: Vec<u8>,
    client_id: Option<u64>,
    timeouts: Timeouts,
    /// Timing the node reported for the last reply.
    pub last_timing: ServerTiming,
}

impl Client {
    /// Connects over plain TCP with the default [`Timeouts`].
    pub async fn connect(addr: &str) -> Result<Client, ClientError> {
        Client::connect_with(addr, Timeouts::default()).await
    }

    /// Connects over plain TCP; every wait of this client is bounded by `timeouts`.
    pub async fn connect_with(addr: &str, timeouts: Timeouts) -> Result<Client, ClientError> {
        let stream = bounded(Timeout::Connect, timeouts.connect, async {
            let stream = TcpStream::connect(addr).await?;
            stream.set_nodelay(true)?;
            Ok(stream)
        });
        Ok(Client::over(Box::new(stream.await?), timeouts))
    }

    /// Connects over TLS with the default [`Timeouts`], checking the node's certificate
    /// against `tls`'s roots for `server_name` (a DNS name or an IP address in the
    /// certificate).
    pub async fn connect_tls(
        addr: &str,
        server_name: &str,
        tls: Arc<rustls::ClientConfig>,
    ) -> Result<Client, ClientError> {
        Client::connect_tls_with(addr, server_name, tls, Timeouts::default()).await
    }

    /// [`Client::connect_tls`] with `timeouts` (the handshake counts as connecting).
    pub async fn connect_tls_with(
        addr: &str,
        server_name: &str,
        tls: Arc<rustls::ClientConfig>,
        timeouts: Timeouts,
    ) -> Result<Client, ClientError> {
        let name = rustls::pki_types::ServerName::try_from(server_name.to_owned())
            .map_err(|e| ClientError::Protocol(format!("server name {server_name:?}: {e}")))?;
        let stream = bounded(Timeout::Connect, timeouts.connect, async {
            let stream = TcpStream::connect(addr).await?;
            stream.set_nodelay(true)?;
            Ok(tokio_rustls::TlsConnector::from(tls).connect(name, stream).await?)
        });
        Ok(Client::over(Box::new(stream.await?), timeouts))
    }

    fn over(stream: Box<dyn Transport>, timeouts: Timeouts) -> Client {
        Client {
            stream: BufStream::new(stream),
            next_request_id: 1,
            outstanding: VecDeque::new(),
            out: Vec::new(),
            payload: Vec::new(),
            client_id: None,
            timeouts,
            last_timing: ServerTiming::default(),
        }
    }

    /// The id the node gave this connection's client, once registered.
    pub fn client_id(&self) -> Option<u64> {
        self.client_id
    }

    /// Sends one request and waits for its reply (success or refusal).
    pub async fn call(&mut self, request: Request) -> Result<ReplyBody, ClientError> {
        if !self.outstanding.is_empty() {
            return Err(ClientError::Protocol(format!(
                "{} pipelined replies not received yet",
                self.outstanding.len()
            )));
        }
        let request_timeout = self.timeouts.request;
        let (_, result) = bounded(Timeout::Request, request_timeout, async {
            self.submit(request).await?;
            self.receive().await
        })
        .await?;
        result.map_err(ClientError::Refused)
    }

    /// Queues one request without waiting for its reply; returns its request id. Requests are
    /// written when the buffer fills or at the next [`Client::receive`]. Keep the number
    /// outstanding near the node's `PIPELINE_DEPTH_MAX`: past it the node stops reading this
    /// connection, and a client that only writes would wait on TCP flow control.
    pub async fn submit(&mut self, request: Request) -> Result<u64, ClientError> {
        let request_id = self.next_request_id;
        self.next_request_id += 1;
        self.out.clear();
        encode_request(&RequestFrame { request_id, request }, &mut self.out);
        self.stream.write_all(&self.out).await?;
        self.outstanding.push_back((request_id, 1));
        Ok(request_id)
    }

    /// Queues `sends` (1..=[`SEND_BATCH_MAX`]) as one `SendBatch` frame without waiting; they
    /// are requests `id`, `id + 1`, … where `id` is returned. Their reply, from
    /// [`Client::receive`], is one [`ReplyBody::SentBatch`] with an outcome per send, in order
    /// (each send commits or is refused on its own), or one error reply when the node refused
    /// the frame itself (`Malformed`; `UnknownOp` from a node older than `SendBatch`). Each
    /// send takes one of the connection's `PIPELINE_DEPTH_MAX` places, like a lone send.
    pub async fn submit_sends(&mut self, sends: &[SendRef<'_>]) -> Result<u64, ClientError> {
        if !(1..=SEND_BATCH_MAX).contains(&sends.len()) {
            return Err(ClientError::Protocol(format!(
                "a SendBatch holds 1..={SEND_BATCH_MAX} sends, not {}",
                sends.len()
            )));
        }
        let request_id = self.next_request_id;
        self.out.clear();
        let count = encode_send_batch(request_id, sends.iter().copied(), &mut self.out);
        self.stream.write_all(&self.out).await?;
        self.next_request_id += count as u64;
        self.outstanding.push_back((request_id, count));
        Ok(request_id)
    }

    /// Writes what is queued and waits for the oldest outstanding reply: (request id, result).
    /// A `SendBatch`'s reply carries its first request id.
    pub async fn receive(&mut self) -> Result<(u64, Result<ReplyBody, ErrorReply>), ClientError> {
        let Some(&(expected, requests)) = self.outstanding.front() else {
            return Err(ClientError::Protocol("no request outstanding".into()));
        };
        let reply = bounded(Timeout::Idle, self.timeouts.idle, async {
            self.stream.flush().await?;
            self.read_reply().await
        })
        .await?;
        if reply.request_id != expected {
            return Err(ClientError::Protocol(format!(
                "reply id {} answers request {expected}",
                reply.request_id
            )));
        }
        if let Ok(ReplyBody::SentBatch(outcomes)) = &reply.result
            && outcomes.len() != requests
        {
            return Err(ClientError::Protocol(format!(
                "{} outcomes answer a SendBatch of {requests}",
                outcomes.len()
            )));
        }
        self.outstanding.pop_front();
        self.last_timing = reply.timing;
        Ok((reply.request_id, reply.result))
    }

    async fn read_reply(&mut self) -> Result<ReplyFrame, ClientError> {
        let mut prefix = [0u8; LENGTH_PREFIX_BYTES];
        self.stream.read_exact(&mut prefix).await?;
        let len = check_frame_len(prefix).map_err(|e| ClientError::Protocol(e.to_string()))?;
        self.payload.resize(len, 0);
        self.stream.read_exact(&mut self.payload).await?;
        decode_reply(&self.payload).map_err(|e| ClientError::Protocol(e.to_string()))
    }

    /// Registers as `name`: the first registration of a name sets its secret, later ones must
    /// present it (`Refused(BadCredentials)` otherwise).
    pub async fn register(&mut self, name: &str, secret: &[u8]) -> Result<u64, ClientError> {
        let request = Request::Register { name: name.to_owned(), secret: Secret(secret.to_vec()) };
        match self.call(request).await? {
            ReplyBody::Registered { client_id } => {
                self.client_id = Some(client_id);
                Ok(client_id)
            }
            other => Err(unexpected(other)),
        }
    }

    pub async fn create_queue(&mut self, name: &str) -> Result<u64, ClientError> {
        match self.call(Request::CreateQueue { name: name.to_owned() }).await? {
            ReplyBody::QueueCreated { queue_id } => Ok(queue_id),
            other => Err(unexpected(other)),
        }
    }

    /// Deletes a queue; with `purge` its messages go too. Returns the number purged.
    pub async fn delete_queue(&mut self, name: &str, purge: bool) -> Result<u64, ClientError> {
        match self.call(Request::DeleteQueue { name: name.to_owned(), purge }).await? {
            ReplyBody::QueueDeleted { purged_messages } => Ok(purged_messages),
            other => Err(unexpected(other)),
        }
    }

    /// Sends a message; returns its id once it is committed.
    pub async fn send(
        &mut self,
        queue: &str,
        receiver: Option<u64>,
        content: &[u8],
    ) -> Result<u64, ClientError> {
        let request =
            Request::Send { queue: queue.to_owned(), receiver, content: content.to_vec() };
        match self.call(request).await? {
            ReplyBody::Sent { message_id, .. } => Ok(message_id),
            other => Err(unexpected(other)),
        }
    }

    /// Pops, peeks or leases one message; `Refused(NoMessage)` when none matches.
    pub async fn read(
        &mut self,
        target: ReadTarget,
        mode: ReadMode,
    ) -> Result<Message, ClientError> {
        match self.call(Request::Read { target, mode }).await? {
            ReplyBody::Message(m) => Ok(m),
            other => Err(unexpected(other)),
        }
    }

    pub async fn ack(&mut self, message_id: u64) -> Result<(), ClientError> {
        match self.call(Request::Ack { message_id }).await? {
            ReplyBody::Acked => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    pub async fn list_queues(&mut self) -> Result<Vec<String>, ClientError> {
        match self.call(Request::ListQueues).await? {
            ReplyBody::Queues(names) => Ok(names),
            other => Err(unexpected(other)),
        }
    }

    pub async fn stats(&mut self, queue: &str) -> Result<NodeStats, ClientError> {
        match self.call(Request::Stats { queue: queue.to_owned() }).await? {
            ReplyBody::Stats(stats) => Ok(stats),
            other => Err(unexpected(other)),
        }
    }

    pub async fn disconnect(mut self) -> Result<(), ClientError> {
        match self.call(Request::Disconnect).await? {
            ReplyBody::Disconnected => Ok(()),
            other => Err(unexpected(other)),
        }
    }
}

fn unexpected(body: ReplyBody) -> ClientError {
    ClientError::Protocol(format!("unexpected reply {body:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node that accepts connections and never answers; its address.
    async fn silent_node() -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        });
        addr
    }

    #[tokio::test]
    async fn a_silent_node_fires_the_request_bound_of_a_call_and_the_idle_bound_of_a_reply() {
        let timeouts = Timeouts {
            request: Duration::from_millis(100),
            idle: Duration::from_millis(150),
            ..Timeouts::default()
        };
        let addr = silent_node().await;
        let mut client = Client::connect_with(&addr, timeouts).await.unwrap();
        let error = client.list_queues().await.unwrap_err();
        assert!(matches!(error, ClientError::TimedOut { which: Timeout::Request, .. }), "{error}");
        let shown = error.to_string();
        assert!(shown.starts_with("request timeout (100ms) fired: the node did not"), "{shown}");

        let mut client = Client::connect_with(&addr, timeouts).await.unwrap();
        client.submit(Request::ListQueues).await.unwrap();
        let error = client.receive().await.unwrap_err();
        assert!(matches!(error, ClientError::TimedOut { which: Timeout::Idle, .. }), "{error}");
        assert!(error.to_string().starts_with("idle timeout (150ms) fired"), "{error}");
    }
}
