//! HTTP/1.1 clients for the load lab and the tests: hyper's pooled client, and one connection
//! per closed-loop user.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{CONNECTION, CONTENT_TYPE, HOST};
use hyper::{Request, Uri, Version};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};

use crate::error::{Result, WebError, http_failed, io_failed};

/// Posts JSON bodies over pooled keep-alive connections.
#[derive(Clone)]
pub struct JsonClient {
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Default for JsonClient {
    fn default() -> Self {
        let mut connector = HttpConnector::new();
        // Small requests must not wait for Nagle's algorithm.
        connector.set_nodelay(true);
        JsonClient { client: Client::builder(TokioExecutor::new()).build(connector) }
    }
}

impl JsonClient {
    /// POSTs `body` to `url`; returns the status and the whole response body.
    pub async fn post(&self, url: &str, body: Bytes) -> Result<(u16, Bytes)> {
        let request = Request::post(url).header(CONTENT_TYPE, "application/json");
        let request = request.body(Full::new(body)).map_err(http_failed("building a request"))?;
        let response = self.client.request(request).await.map_err(http_failed("posting"))?;
        let status = response.status().as_u16();
        let body = response.into_body().collect().await;
        let body = body.map_err(http_failed("reading the answer"))?.to_bytes();
        Ok((status, body))
    }
}

/// One keep-alive HTTP/1.1 connection per closed-loop user: a user has at most one request
/// outstanding, so it needs no pool; each request costs one uncontended lock instead of a pool
/// look-up, which keeps the load generator's CPU share small on a host it shares with the server.
pub struct UserConnections {
    uri: Uri,
    connections: Vec<tokio::sync::Mutex<Option<SendRequest<Full<Bytes>>>>>,
}

impl UserConnections {
    /// Connections (opened lazily) for `users` users posting to `url`.
    pub fn new(url: &str, users: usize) -> Result<UserConnections> {
        let invalid = |why: String| WebError::BadInput(format!("invalid URL {url}: {why}"));
        let uri: Uri =
            url.parse().map_err(|e: hyper::http::uri::InvalidUri| invalid(e.to_string()))?;
        if uri.authority().is_none() {
            return Err(invalid("no host".into()));
        }
        let connections = (0..users).map(|_| tokio::sync::Mutex::new(None)).collect();
        Ok(UserConnections { uri, connections })
    }

    /// POSTs `body` on `user`'s connection (reconnecting when the server closed it); returns
    /// the status and the whole response body.
    pub async fn post(&self, user: usize, body: Bytes) -> Result<(u16, Bytes)> {
        let authority = self.uri.authority().expect("`new` checked the URL has a host").as_str();
        let mut slot = self.connections[user].lock().await;
        let sender = match slot.take() {
            Some(sender) if !sender.is_closed() => slot.insert(sender),
            _ => slot.insert(connect(authority).await?),
        };
        sender.ready().await.map_err(http_failed("waiting for the connection"))?;
        let request = Request::post(self.uri.path())
            .header(HOST, authority)
            .header(CONTENT_TYPE, "application/json")
            .body(Full::new(body))
            .map_err(http_failed("building a request"))?;
        let response = sender.send_request(request).await.map_err(http_failed("posting"))?;
        let closes = response.version() < Version::HTTP_11
            || response
                .headers()
                .get(CONNECTION)
                .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
        let status = response.status().as_u16();
        let answer = response.into_body().collect().await;
        let answer = answer.map_err(http_failed("reading the answer"))?.to_bytes();
        if closes {
            // The server ends the connection after this answer (e.g. an HTTP/1.0 server).
            *slot = None;
        }
        Ok((status, answer))
    }
}

async fn connect(authority: &str) -> Result<SendRequest<Full<Bytes>>> {
    let stream = tokio::net::TcpStream::connect(authority).await;
    let stream = stream.map_err(io_failed(format!("connecting to {authority}")))?;
    stream.set_nodelay(true).map_err(io_failed("setting TCP_NODELAY"))?;
    let handshake = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await;
    let (sender, connection) = handshake.map_err(http_failed("the HTTP/1.1 handshake"))?;
    tokio::spawn(async move {
        // Ends when the server or the sender closes the connection; nothing to report.
        let _ = connection.await;
    });
    Ok(sender)
}
