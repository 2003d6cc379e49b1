//! The HTTP admin endpoint every server exposes:
//!
//! * `GET /metrics`: the registry in the Prometheus text format (version 0.0.4), with the
//!   `process_*` metrics; behind `Authorization: Bearer TOKEN` when a metrics token is set;
//! * `GET /health`: 200 while the process answers (liveness);
//! * `GET /ready`: 200 once the server recovered and reached what it depends on (its
//!   database, NATS), 503 before that and while it stops (so a balancer drains it first);
//! * anything else: 404 (405 for another method on those three paths).
//!
//! [`Endpoint::serve`] answers on a listener of its own (`--metrics-listen`), on a thread of
//! its own with a current-thread runtime: a scrape renders there, never on a server's I/O or
//! core threads, which only add to atomics. A server whose own protocol is HTTP (`web
//! serve`) routes the three paths to [`Endpoint::answer`] instead.
//!
//! What the page and `/ready` show comes from a [`Source`]: one process's registry and
//! readiness flag ([`Endpoint::new`]), or any other view, such as a supervisor's over the
//! processes it runs ([`Endpoint::of`]; [`crate::merge`] joins their pages). A server with
//! endpoints of its own beside the three (the gateway's admin requests) adds them as
//! [`Routes`] ([`Endpoint::with_routes`]); they answer what the three do not.
//!
//! Bounds: at most [`HTTP_CONNECTIONS_MAX`] connections at once (more are closed unanswered),
//! one request per connection, [`HTTP_CONNECTION_TIMEOUT`] for the whole exchange.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Request, Response, StatusCode};
use prometheus_client::registry::Registry;
use tokio::sync::Semaphore;

use crate::OpsError;
use crate::process::ProcessCollector;

/// Connections the admin listener serves at once; beyond, new ones are closed unanswered. A
/// scraper and an operator need a handful; a flood of idle connections must not grow the
/// thread's memory without bound.
pub const HTTP_CONNECTIONS_MAX: usize = 16;
/// Time a client has to send its request and take its answer.
pub const HTTP_CONNECTION_TIMEOUT: Duration = Duration::from_secs(5);
/// The content type of `/metrics`.
pub const METRICS_CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Whether the server is ready for work; clones share the flag. Starts not ready.
#[derive(Clone, Debug, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    pub fn set(&self, ready: bool) {
        // Release/Acquire: a probe that sees "ready" sees the start-up that preceded it.
        self.0.store(ready, Ordering::Release);
    }

    pub fn is_ready(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// An answer: status, content type and body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    pub content_type: &'static str,
    pub body: String,
}

impl Answer {
    /// A plain-text answer.
    pub fn text(status: u16, body: impl Into<String>) -> Answer {
        Answer { status, content_type: "text/plain; charset=utf-8", body: body.into() }
    }
}

/// What an endpoint shows, asked at each request to `/metrics` or `/ready` on the thread that
/// answers it.
pub trait Source: Send + Sync + 'static {
    /// The `/metrics` page, in the Prometheus text format.
    fn page(&self) -> String;
    /// Whether `/ready` answers 200.
    fn is_ready(&self) -> bool;
}

/// A server's endpoints beside `/metrics`, `/health` and `/ready`, asked on the endpoint's
/// thread for every other request.
pub trait Routes: Send + Sync + 'static {
    /// The answer to `method path?query`, or `None` when the path is not one of these (404).
    /// `authorization` is the request's `Authorization` header, if any ([`bearer_matches`]
    /// checks a token in it).
    fn answer(
        &self,
        method: &str,
        path: &str,
        query: &str,
        authorization: Option<&str>,
    ) -> Option<Answer>;
}

/// One process's view: its registry (with the `process_*` metrics) and readiness flag.
struct Local {
    registry: Registry,
    readiness: Readiness,
}

impl Source for Local {
    fn page(&self) -> String {
        render(&self.registry)
    }

    fn is_ready(&self) -> bool {
        self.readiness.is_ready()
    }
}

/// The source of the page and readiness, and the optional token behind `/metrics`.
#[derive(Clone)]
pub struct Endpoint {
    source: Arc<dyn Source>,
    metrics_token: Option<String>,
    routes: Option<Arc<dyn Routes>>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token itself.
        let token = self.metrics_token.as_ref().map(|_| "<set>");
        f.debug_struct("Endpoint").field("metrics_token", &token).finish_non_exhaustive()
    }
}

/// The registry in the Prometheus text format.
pub fn render(registry: &Registry) -> String {
    let mut page = String::new();
    // Writing into a String fails only if a metric's own encoding does, which ours never do.
    if let Err(error) = prometheus_client::encoding::prometheus_text::encode(&mut page, registry) {
        tracing::warn!(%error, "a metric failed to encode");
    }
    page
}

/// Refuses an open `/metrics` on an address other hosts can reach (the page shows the
/// server's activity): any address with a token, loopback without one.
pub fn check_exposure(listen: SocketAddr, has_token: bool) -> Result<(), String> {
    if listen.ip().is_loopback() || has_token {
        return Ok(());
    }
    Err(format!(
        "metrics listener on {listen}: not a loopback address and no metrics token; /metrics \
         would show the server's activity to anyone who can reach it"
    ))
}

impl Endpoint {
    /// An endpoint over `registry`, to which it adds the `process_*` metrics.
    pub fn new(mut registry: Registry, readiness: Readiness) -> Endpoint {
        registry.register_collector(Box::new(ProcessCollector));
        Endpoint::of(Local { registry, readiness })
    }

    /// An endpoint over any source (which adds the `process_*` metrics itself, if it shows
    /// them).
    pub fn of(source: impl Source) -> Endpoint {
        Endpoint { source: Arc::new(source), metrics_token: None, routes: None }
    }

    /// Answers the paths other than the three with `routes` (404 where they answer `None`).
    pub fn with_routes(mut self, routes: impl Routes) -> Endpoint {
        self.routes = Some(Arc::new(routes));
        self
    }

    /// Requires `Authorization: Bearer TOKEN` on `/metrics` when `token` is given.
    pub fn with_metrics_token(mut self, token: Option<String>) -> Endpoint {
        self.metrics_token = token;
        self
    }

    /// The answer to `method path` (the path without its query), or `None` when the path is
    /// none of the three (a server with routes of its own goes on routing it).
    /// `authorization` is the request's `Authorization` header, if any.
    pub fn answer(&self, method: &str, path: &str, authorization: Option<&str>) -> Option<Answer> {
        if !matches!(path, "/metrics" | "/health" | "/ready") {
            return None;
        }
        if method != "GET" && method != "HEAD" {
            return Some(Answer::text(405, format!("{path} takes GET\n")));
        }
        Some(match path {
            "/health" => Answer::text(200, "ok\n"),
            "/ready" if self.source.is_ready() => Answer::text(200, "ready\n"),
            "/ready" => Answer::text(503, "not ready\n"),
            _ => self.metrics(authorization),
        })
    }

    fn metrics(&self, authorization: Option<&str>) -> Answer {
        if let Some(token) = &self.metrics_token
            && !bearer_matches(authorization, token)
        {
            return Answer::text(401, "missing or wrong bearer token\n");
        }
        Answer { status: 200, content_type: METRICS_CONTENT_TYPE, body: self.source.page() }
    }

    /// Answers on `listen` from a thread of its own until the returned handle is dropped.
    pub fn serve(self, listen: SocketAddr) -> Result<Listening, OpsError> {
        check_exposure(listen, self.metrics_token.is_some()).map_err(OpsError::Exposed)?;
        let listener = std::net::TcpListener::bind(listen);
        let listener =
            listener.map_err(|source| OpsError::Io { what: "binding", listen, source })?;
        self.serve_on(listener)
    }

    /// [`Endpoint::serve`] on a listener bound already (a server that reports its addresses
    /// before it serves).
    pub fn serve_on(self, listener: std::net::TcpListener) -> Result<Listening, OpsError> {
        let listen = listener.local_addr();
        let listen = listen.map_err(|source| OpsError::Io {
            what: "reading the bound address",
            listen: SocketAddr::from(([0, 0, 0, 0], 0)),
            source,
        })?;
        check_exposure(listen, self.metrics_token.is_some()).map_err(OpsError::Exposed)?;
        let failed = |what| move |source| OpsError::Io { what, listen, source };
        listener.set_nonblocking(true).map_err(failed("setting the listener non-blocking"))?;
        let addr = listener.local_addr().map_err(failed("reading the bound address"))?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
        let runtime = runtime.map_err(failed("starting the endpoint's runtime"))?;
        let thread = std::thread::Builder::new().name("admin-http".into()).spawn(move || {
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
                tokio::select! {
                    () = accept_loop(listener, Arc::new(self)) => {}
                    _ = stopped => {}
                }
            });
        });
        let thread = thread.map_err(failed("spawning the endpoint's thread"))?;
        Ok(Listening { addr, stop: Some(stop), thread: Some(thread) })
    }
}

/// The admin listener; dropping it stops the listener and joins its thread.
#[derive(Debug)]
pub struct Listening {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Listening {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn accept_loop(listener: tokio::net::TcpListener, endpoint: Arc<Endpoint>) {
    let open = Arc::new(Semaphore::new(HTTP_CONNECTIONS_MAX));
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                // Out of descriptors, say: pause rather than spin.
                tracing::debug!(%error, "admin listener: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = Arc::clone(&open).try_acquire_owned() else { continue };
        let endpoint = Arc::clone(&endpoint);
        tokio::spawn(async move {
            let service =
                hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
                    let answer = route(&endpoint, &request);
                    async move { Ok::<_, Infallible>(answer) }
                });
            let connection = hyper::server::conn::http1::Builder::new()
                .keep_alive(false)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            let _ = tokio::time::timeout(HTTP_CONNECTION_TIMEOUT, connection).await;
            drop(permit);
        });
    }
}

fn route(endpoint: &Endpoint, request: &Request<hyper::body::Incoming>) -> Response<Full<Bytes>> {
    let authorization =
        request.headers().get(hyper::header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    let (method, path) = (request.method().as_str(), request.uri().path());
    let query = request.uri().query().unwrap_or("");
    let answer = endpoint
        .answer(method, path, authorization)
        .or_else(|| endpoint.routes.as_ref()?.answer(method, path, query, authorization))
        .unwrap_or_else(|| Answer::text(404, format!("no endpoint {path}\n")));
    let mut response = Response::new(Full::new(Bytes::from(answer.body)));
    *response.status_mut() = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::OK);
    let content_type = hyper::header::HeaderValue::from_static(answer.content_type);
    response.headers_mut().insert(hyper::header::CONTENT_TYPE, content_type);
    response
}

/// Whether `authorization` (a request's `Authorization` header) is `Bearer token`, compared
/// in time that depends on the lengths only.
pub fn bearer_matches(authorization: Option<&str>, token: &str) -> bool {
    let presented = authorization.and_then(|value| value.strip_prefix("Bearer "));
    presented.is_some_and(|p| same_secret(p.as_bytes(), token.as_bytes()))
}

/// Compares in time that depends on the lengths only, not on where the bytes differ.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

/// A blocking `GET path` against `addr` (HTTP/1.0, one request per connection): the status
/// and body. For probes and tests, which should not need an HTTP client crate.
pub fn get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    fetch(addr, path, None, HTTP_CONNECTION_TIMEOUT)
}

/// [`get`] with `Authorization: Bearer TOKEN` when `token` is given, connecting and reading
/// within `timeout` each: how a supervisor scrapes the processes it runs.
pub fn fetch(
    addr: SocketAddr,
    path: &str,
    token: Option<&str>,
    timeout: Duration,
) -> std::io::Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    let authorization = token.map(|token| format!("Authorization: Bearer {token}\r\n"));
    let authorization = authorization.unwrap_or_default();
    let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n{authorization}\r\n");
    // One write: a server that answers its first read must see the whole request in it.
    stream.write_all(request.as_bytes())?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let malformed = || std::io::Error::new(std::io::ErrorKind::InvalidData, "malformed response");
    let (head, body) = response.split_once("\r\n\r\n").ok_or_else(malformed)?;
    let status = head.split_ascii_whitespace().nth(1).and_then(|s| s.parse().ok());
    Ok((status.ok_or_else(malformed)?, body.to_string()))
}
