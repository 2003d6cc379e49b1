//! HTTP/1.1 clients for the load lab and the tests: hyper's pooled client, and one connection
//! per closed-loop user.

use anyhow::Context;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{CONNECTION, CONTENT_TYPE, HOST};
use hyper::{Request, Uri, Version};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};

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
    pub async fn post(&self, url: &str, body: Bytes) -> anyhow::Result<(u16, Bytes)> {
        let request =
            Request::post(url).header(CONTENT_TYPE, "application/json").body(Full::new(body))?;
        let response = self.client.request(request).await?;
        let status = response.status().as_u16();
        let body = response.into_body().collect().await?.to_bytes();
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
    pub fn new(url: &str, users: usize) -> anyhow::Result<UserConnections> {
        let uri: Uri = url.parse().with_context(|| format!("invalid URL {url}"))?;
        anyhow::ensure!(uri.authority().is_some(), "URL {url} has no host");
        let connections = (0..users).map(|_| tokio::sync::Mutex::new(None)).collect();
        Ok(UserConnections { uri, connections })
    }

    /// POSTs `body` on `user`'s connection (reconnecting when the server closed it); returns
    /// the status and the whole response body.
    pub async fn post(&self, user: usize, body: Bytes) -> anyhow::Result<(u16, Bytes)> {
        let authority = self.uri.authority().context("URL has a host")?.as_str();
        let mut slot = self.connections[user].lock().await;
        let sender = match slot.take() {
            Some(sender) if !sender.is_closed() => slot.insert(sender),
            _ => slot.insert(connect(authority).await?),
        };
        sender.ready().await?;
        let request = Request::post(self.uri.path())
            .header(HOST, authority)
            .header(CONTENT_TYPE, "application/json")
            .body(Full::new(body))?;
        let response = sender.send_request(request).await?;
        let closes = response.version() < Version::HTTP_11
            || response
                .headers()
                .get(CONNECTION)
                .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
        let status = response.status().as_u16();
        let answer = response.into_body().collect().await?.to_bytes();
        if closes {
            // The server ends the connection after this answer (e.g. an HTTP/1.0 server).
            *slot = None;
        }
        Ok((status, answer))
    }
}

async fn connect(authority: &str) -> anyhow::Result<SendRequest<Full<Bytes>>> {
    let stream = tokio::net::TcpStream::connect(authority).await?;
    stream.set_nodelay(true)?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        // Ends when the server or the sender closes the connection; nothing to report.
        let _ = connection.await;
    });
    Ok(sender)
}
