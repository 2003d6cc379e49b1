//! The HTTP front: axum routes on a tokio runtime whose threads only move bytes.
//!
//! `POST /matrix` uses the configured model; `POST /matrix/{single,pool,pinned,adaptive}` use
//! that model whatever the default, so models can be compared side by side in one process (the
//! per-core models, `prefork` and the served `adaptive`, run in their own processes).
//! Connections are accepted and timed by [`crate::conn`]. A request's body is admitted by
//! [`crate::admission`] (its bytes reserved before they are read), read up to `body_bytes_max`
//! and handed to the model's [`Executor`] with its reservation, which grows to the request's
//! product and answer before it is multiplied (waiting here, on the reactor, when its lane has
//! no room at once) and is then owned by the answer's bytes: released when hyper has written
//! the last of them to the socket, or the connection closes. A larger body is refused with a 413 once the rest of
//! it has been read (see `REFUSED_BODY_DRAIN_BYTES_MAX`); so are a body that finds no room within
//! the work bound (503, code 009) and a transfer coding other than `chunked` (501, code 012). A
//! body whose chunked framing is malformed is answered 400 (code 011), one that does not arrive
//! within the body timeout 408 (code 013), and the connection is closed after either.

use std::collections::HashMap;
use std::error::Error;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, post};
use axum::serve::Listener;
use bytes::Bytes;
use http_body_util::BodyExt;
use tokio::sync::oneshot;

use crate::admission::{ConnectionWork, Reservation, Shortfall, WorkBounds, WorkBudget};
use crate::api::Failure;
use crate::conn::{self, BodyTimeout, ConnectionBounds};
use crate::exec::{Calibration, ExecConfig, Executor, Model, Reply};

pub use crate::admission::BODY_BYTES_MAX_DEFAULT;

/// The bounds of one server process beyond its executors: connections and work admission.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ServeBounds {
    pub connection: ConnectionBounds,
    pub work: WorkBounds,
}

/// Everything a server process needs.
#[derive(Debug, Clone, Copy)]
pub struct ServerConfig {
    /// The model behind `POST /matrix`.
    pub default_model: Model,
    pub exec: ExecConfig,
    /// Request bodies beyond this are refused with code 007 (HTTP 413).
    pub body_bytes_max: usize,
    /// Tokio reactor threads.
    pub io_threads: usize,
    pub bounds: ServeBounds,
}

/// The executors of one process, by model.
pub struct Executors {
    by_model: HashMap<Model, Arc<Executor>>,
    metrics: Arc<RequestMetrics>,
}

/// What `/metrics` shows of the matrix routes (docs/OPERATIONS.md, "Monitor"): recorded with
/// relaxed atomic additions as each answer is made, read at scrape time.
#[derive(Debug, Default)]
pub struct RequestMetrics {
    /// Arrival of a matrix request → its answer made (body read, work admitted, multiplied).
    latency: ops::BucketHistogram,
    answered: AtomicU64,
    /// Answered with a status of 400 or more (bounds, malformed bodies, timeouts).
    refused: AtomicU64,
    in_flight: AtomicI64,
}

/// Counts a matrix request in flight until dropped, then records its latency and status.
struct Timed<'a> {
    metrics: &'a RequestMetrics,
    started: std::time::Instant,
}

impl<'a> Timed<'a> {
    fn start(metrics: &'a RequestMetrics) -> Timed<'a> {
        metrics.in_flight.fetch_add(1, Ordering::Relaxed);
        Timed { metrics, started: std::time::Instant::now() }
    }

    fn answered(self, status: StatusCode) {
        self.metrics.latency.record_since(self.started);
        self.metrics.answered.fetch_add(1, Ordering::Relaxed);
        if status.as_u16() >= 400 {
            self.metrics.refused.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Drop for Timed<'_> {
    fn drop(&mut self) {
        self.metrics.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Executors {
    /// Starts `models` (each with its own workers).
    pub fn start(models: &[Model], config: &ExecConfig) -> std::io::Result<Executors> {
        let mut by_model = HashMap::new();
        for &model in models {
            by_model.insert(model, Arc::new(Executor::start(model, config)?));
        }
        Ok(Executors { by_model, metrics: Arc::default() })
    }

    /// One executor already started.
    pub fn of(executor: Executor) -> Executors {
        let by_model = HashMap::from([(executor.model(), Arc::new(executor))]);
        Executors { by_model, metrics: Arc::default() }
    }

    /// The adaptive model's thresholds, when it runs here.
    pub fn calibration(&self) -> Option<Calibration> {
        self.by_model.get(&Model::Adaptive).and_then(|executor| executor.calibration())
    }

    /// `/matrix` to `default`, and `/matrix/<name>` to every started model; all routes share
    /// one work admission (`work`), so it bounds the whole process.
    pub fn router(&self, default: Model, body_bytes_max: usize, work: &WorkBounds) -> Router {
        let metrics = Arc::clone(&self.metrics);
        let intake = Arc::new(Intake { body_bytes_max, work: WorkBudget::new(work), metrics });
        let mut router = Router::new();
        if let Some(executor) = self.by_model.get(&default) {
            router = router.route("/matrix", matrix_route(Arc::clone(executor), &intake));
        }
        for (model, executor) in &self.by_model {
            let path = format!("/matrix/{}", model.name());
            router = router.route(&path, matrix_route(Arc::clone(executor), &intake));
        }
        router
    }
}

/// What every route of one process shares.
struct Intake {
    body_bytes_max: usize,
    work: WorkBudget,
    metrics: Arc<RequestMetrics>,
}

fn matrix_route(executor: Arc<Executor>, intake: &Arc<Intake>) -> MethodRouter {
    let intake = Arc::clone(intake);
    post(move |request: Request| async move {
        let timed = Timed::start(&intake.metrics);
        let response = handle(&executor, &intake, request).await;
        timed.answered(response.status());
        response
    })
}

impl Executors {
    /// Adds the matrix routes' metrics to `registry`.
    pub fn register_metrics(&self, registry: &mut ops::Registry) {
        let metrics = &self.metrics;
        let help = "a matrix request's arrival to its answer made";
        registry.register("web_request_seconds", help, metrics.latency.clone());
        let read = |which: fn(&RequestMetrics) -> &AtomicU64| {
            let metrics = Arc::clone(metrics);
            ops::read::counter(move || which(&metrics).load(Ordering::Relaxed))
        };
        registry.register("web_requests", "matrix requests answered", read(|m| &m.answered));
        let help = "matrix requests answered 4xx or 5xx (bounds, bad bodies, timeouts)";
        registry.register("web_requests_refused", help, read(|m| &m.refused));
        let in_flight = Arc::clone(metrics);
        let in_flight = ops::read::gauge(move || in_flight.in_flight.load(Ordering::Relaxed));
        registry.register("web_requests_in_flight", "matrix requests being answered", in_flight);
    }
}

/// `router` with the admin endpoint's `GET /metrics`, `/health` and `/ready` (see
/// `ops::endpoint`); every other path it does not route stays 404.
pub fn with_admin(router: Router, endpoint: ops::Endpoint) -> Router {
    let endpoint = Arc::new(endpoint);
    let answer = move |request: Request| {
        let endpoint = Arc::clone(&endpoint);
        async move {
            let authorization =
                request.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
            let path = request.uri().path();
            let Some(answer) = endpoint.answer(request.method().as_str(), path, authorization)
            else {
                return StatusCode::NOT_FOUND.into_response();
            };
            let status = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::OK);
            (status, [(header::CONTENT_TYPE, answer.content_type)], answer.body).into_response()
        }
    };
    ["/metrics", "/health", "/ready"]
        .into_iter()
        .fold(router, |router, path| router.route(path, axum::routing::get(answer.clone())))
}

async fn handle(executor: &Executor, intake: &Intake, request: Request) -> Response {
    // Set by crate::conn for every request; a router served some other way shares nothing.
    let connection = request.extensions().get::<Arc<ConnectionWork>>().cloned().unwrap_or_default();
    let (parts, mut body) = request.into_parts();
    if let Some(failure) = coding_failure(&parts.headers) {
        return closing(refuse(body, None, failure).await);
    }
    let declared_bytes = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok()?.parse::<u64>().ok());
    let body_bytes_max = intake.body_bytes_max;
    if declared_bytes.is_some_and(|bytes| bytes > body_bytes_max as u64) {
        return refuse(body, declared_bytes, Failure::body_too_large(body_bytes_max)).await;
    }
    // Within body_bytes_max, so within usize.
    let expected_bytes = declared_bytes.map_or(0, |bytes| bytes as usize);
    let mut reservation = match intake.work.reserve(expected_bytes, &connection).await {
        Ok(reservation) => reservation,
        Err(shortfall) => {
            let lane_full = Failure::work_bound_full(expected_bytes, intake.work.wait_timeout());
            let failure = refusal_of(shortfall, lane_full);
            return refuse(body, declared_bytes, failure).await;
        }
    };
    let refusal = match read_body(&mut body, intake, &mut reservation, expected_bytes).await {
        Ok(bytes) => return answer(executor, intake, bytes, reservation).await,
        Err(refusal) => refusal,
    };
    // Nothing of the body is kept from here on.
    drop(reservation);
    match refusal {
        BodyRefusal::AfterDrain(failure) => refuse(body, None, failure).await,
        BodyRefusal::Closing(failure) => {
            closing(into_response(Reply::failure(None, &failure), None))
        }
    }
}

/// Runs a read request within `room`. When its lane had no room at once for the request's
/// product and answer, waits for it here (a worker must not wait) and runs it again with the
/// room held; parsing twice is the cost of that rare case only.
async fn answer(executor: &Executor, intake: &Intake, body: Bytes, room: Reservation) -> Response {
    let mut done = executor.execute(body.clone(), Some(room)).await;
    if let Err(work_bytes) = done.reply
        && let Some(mut room) = done.room.take()
    {
        if let Err(shortfall) = room.hold(work_bytes).await {
            let lane_full = Failure::answer_room_full(work_bytes, intake.work.wait_timeout());
            return into_response(Reply::failure(None, &refusal_of(shortfall, lane_full)), None);
        }
        done = executor.execute(body, Some(room)).await;
    }
    let reply = done.reply.unwrap_or_else(|work_bytes| {
        Reply::failure(None, &Failure::answer_room_full(work_bytes, intake.work.wait_timeout()))
    });
    into_response(reply, done.room)
}

/// The refusal of a reservation that was not granted: `lane_full` when its lane had no room,
/// or the connection's share.
fn refusal_of(shortfall: Shortfall, lane_full: Failure) -> Failure {
    match shortfall {
        Shortfall::Lane => lane_full,
        Shortfall::Connection { held_bytes, share_bytes } => {
            Failure::connection_share_full(held_bytes, share_bytes)
        }
    }
}

/// Why a body was not read whole.
enum BodyRefusal {
    /// The body is well framed: read the rest, then answer.
    AfterDrain(Failure),
    /// The body cannot be read further: answer and close the connection.
    Closing(Failure),
}

/// Reads the whole body, growing `reservation` as it grows past what was declared.
async fn read_body(
    body: &mut Body,
    intake: &Intake,
    reservation: &mut Reservation,
    expected_bytes: usize,
) -> Result<Bytes, BodyRefusal> {
    // One frame (the common case) is kept as it came; more are joined into one buffer.
    let mut first: Option<Bytes> = None;
    let mut joined: Vec<u8> = Vec::new();
    let mut received_bytes = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|error| BodyRefusal::Closing(failure_of_body_error(&error)))?;
        let Ok(data) = frame.into_data() else {
            continue; // Trailers carry nothing the API reads.
        };
        received_bytes += data.len();
        if received_bytes > intake.body_bytes_max {
            return Err(BodyRefusal::AfterDrain(Failure::body_too_large(intake.body_bytes_max)));
        }
        if let Err(shortfall) = reservation.hold(received_bytes).await {
            let lane_full = Failure::work_bound_full(received_bytes, intake.work.wait_timeout());
            let failure = refusal_of(shortfall, lane_full);
            return Err(BodyRefusal::AfterDrain(failure));
        }
        match first.take() {
            None if joined.is_empty() => first = Some(data),
            earlier => {
                if let Some(earlier) = earlier {
                    joined.reserve(expected_bytes.max(received_bytes));
                    joined.extend_from_slice(&earlier);
                }
                joined.extend_from_slice(&data);
            }
        }
    }
    Ok(first.unwrap_or_else(|| Bytes::from(joined)))
}

/// The answer to a body that failed to arrive: its timeout (408), or broken framing (400).
fn failure_of_body_error(error: &axum::Error) -> Failure {
    let mut cause: &(dyn Error + 'static) = error;
    loop {
        if let Some(timeout) = cause.downcast_ref::<BodyTimeout>() {
            return Failure::body_timeout(timeout.0);
        }
        match cause.source() {
            Some(source) => cause = source,
            // hyper's innermost reason, e.g. "invalid chunk size line".
            None => return Failure::malformed_framing(cause),
        }
    }
}

/// Code 012 for a transfer coding other than `chunked`, code 011 for `chunked` applied twice
/// (hyper refuses, with a bare 400, a coding list that does not end in `chunked`).
fn coding_failure(headers: &HeaderMap) -> Option<Failure> {
    let mut chunked_count = 0;
    for value in headers.get_all(header::TRANSFER_ENCODING) {
        let Ok(text) = value.to_str() else {
            return Some(Failure::unsupported_coding(&String::from_utf8_lossy(value.as_bytes())));
        };
        for coding in text.split(',').map(str::trim).filter(|coding| !coding.is_empty()) {
            if !coding.eq_ignore_ascii_case("chunked") {
                return Some(Failure::unsupported_coding(coding));
            }
            chunked_count += 1;
        }
    }
    (chunked_count > 1).then(|| Failure::malformed_framing("chunked is applied more than once"))
}

/// The most of a refused body that is read (and dropped) before the 413 goes out.
///
/// A client sends its whole body before it reads the answer. Were the server to answer and close
/// while body bytes still arrive, the kernel would reset the connection, and the client would
/// see "broken pipe" or "connection reset" instead of the 413 and its reason code. Reading the
/// rest first costs the refused bytes once; beyond this bound, or after
/// [`REFUSED_BODY_DRAIN_TIMEOUT`], the server answers at once and the client may see the reset.
const REFUSED_BODY_DRAIN_BYTES_MAX: usize = 64 << 20;

/// The longest a refused body is read for (a slow sender must not hold the connection).
const REFUSED_BODY_DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// Reads and drops the rest of `body` (unless it declared more than the drain bound), then
/// answers `failure`. Nothing read is kept, so a refused body takes no memory.
async fn refuse(mut body: Body, declared_bytes: Option<u64>, failure: Failure) -> Response {
    if declared_bytes.is_none_or(|bytes| bytes <= REFUSED_BODY_DRAIN_BYTES_MAX as u64) {
        let drain = async {
            let mut drained_bytes = 0;
            while let Some(Ok(frame)) = body.frame().await {
                drained_bytes += frame.data_ref().map_or(0, |data| data.len());
                if drained_bytes > REFUSED_BODY_DRAIN_BYTES_MAX {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(REFUSED_BODY_DRAIN_TIMEOUT, drain).await;
    }
    into_response(Reply::failure(None, &failure), None)
}

/// `response` with `connection: close`, which hyper honours after writing it.
fn closing(mut response: Response) -> Response {
    response.headers_mut().insert(header::CONNECTION, header::HeaderValue::from_static("close"));
    response
}

/// An answer's bytes and the reservation that holds their room. hyper keeps the bytes (it
/// queues them for the socket without copying) until their last byte is written, or the
/// connection closes, and only then drops them: that is when the room is given back.
struct Answer {
    bytes: Vec<u8>,
    _room: Reservation,
}

impl AsRef<[u8]> for Answer {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

/// `reply` as a response whose bytes hold `room` until they are written.
fn into_response(reply: Reply, room: Option<Reservation>) -> Response {
    let status = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let bytes = match room {
        Some(room) => Bytes::from_owner(Answer { bytes: reply.body, _room: room }),
        None => Bytes::from(reply.body),
    };
    (status, [(header::CONTENT_TYPE, "application/json")], Body::from(bytes)).into_response()
}

/// Serves `router` on `listener` with `io_threads` reactor threads until `shutdown`.
pub fn serve_blocking(
    listener: std::net::TcpListener,
    router: Router,
    io_threads: usize,
    bounds: ConnectionBounds,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<conn::DrainReport> {
    listener.set_nonblocking(true)?;
    let listener = move || tokio::net::TcpListener::from_std(listener);
    serve_on(listener, router, io_threads, bounds, shutdown)
}

/// Serves `router` on the listener that `listener` makes inside the runtime (tokio listeners
/// register with the runtime that is current when they are made), within `bounds`: every
/// execution model serves its connections here.
pub fn serve_on<L: Listener<Addr = SocketAddr>>(
    listener: impl FnOnce() -> std::io::Result<L>,
    router: Router,
    io_threads: usize,
    bounds: ConnectionBounds,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<conn::DrainReport> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(io_threads.max(1))
        .thread_name("web-io")
        .enable_all()
        .build()?;
    let _entered = runtime.enter();
    let listener = listener()?;
    Ok(runtime.block_on(conn::serve(listener, router, bounds, shutdown)))
}

/// A server running on its own threads; stops when dropped.
pub struct Server {
    local_addr: SocketAddr,
    calibration: Option<Calibration>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<std::io::Result<()>>>,
}

impl Server {
    /// Starts every in-process model behind `listener` (bind `127.0.0.1:0` in tests).
    pub fn start(listener: std::net::TcpListener, config: ServerConfig) -> std::io::Result<Server> {
        let local_addr = listener.local_addr()?;
        let executors = Executors::start(&Model::IN_PROCESS, &config.exec)?;
        let calibration = executors.calibration();
        let router =
            executors.router(config.default_model, config.body_bytes_max, &config.bounds.work);
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new().name("web-server".into()).spawn(move || {
            // The router holds the executors; when serving ends they drop and their workers stop.
            serve_blocking(listener, router, config.io_threads, config.bounds.connection, async {
                let _ = stopped.await;
            })
            .map(drop)
        })?;
        Ok(Server { local_addr, calibration, stop: Some(stop), thread: Some(thread) })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The adaptive model's thresholds measured at start-up.
    pub fn calibration(&self) -> Option<Calibration> {
        self.calibration
    }

    /// Stops accepting, finishes in-flight requests and joins the server thread.
    pub fn stop(mut self) -> std::io::Result<()> {
        self.stop_and_join()
    }

    fn stop_and_join(&mut self) -> std::io::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match self.thread.take() {
            Some(thread) => {
                thread.join().map_err(|_| std::io::Error::other("server thread panicked"))?
            }
            None => Ok(()),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Err(error) = self.stop_and_join() {
            tracing::warn!(%error, "server stopped with an error");
        }
    }
}
