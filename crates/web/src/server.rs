//! The HTTP front: axum routes on a tokio runtime whose threads only move bytes.
//!
//! `POST /matrix` uses the configured model; `POST /matrix/{single,pool,pinned,adaptive}` use
//! that model whatever the default, so models can be compared side by side in one process (the
//! per-core models, `prefork` and the served `adaptive`, run in their own processes). The
//! body is read up to `body_bytes_max` and handed to the model's [`Executor`]; a larger body is
//! refused with a 413 once the rest of it has been read (see `REFUSED_BODY_DRAIN_BYTES_MAX`).

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, post};
use axum::serve::Listener;
use http_body_util::{BodyExt, Limited};
use tokio::sync::oneshot;

use crate::api::Failure;
use crate::exec::{Calibration, ExecConfig, Executor, Model, Reply};

/// Default request-body bound: 16 MiB holds a 2000×2000 matrix of 3-digit cells.
pub const BODY_BYTES_MAX_DEFAULT: usize = 16 << 20;

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
}

/// The executors of one process, by model.
pub struct Executors {
    by_model: HashMap<Model, Arc<Executor>>,
}

impl Executors {
    /// Starts `models` (each with its own workers).
    pub fn start(models: &[Model], config: &ExecConfig) -> std::io::Result<Executors> {
        let mut by_model = HashMap::new();
        for &model in models {
            by_model.insert(model, Arc::new(Executor::start(model, config)?));
        }
        Ok(Executors { by_model })
    }

    /// One executor already started.
    pub fn of(executor: Executor) -> Executors {
        Executors { by_model: HashMap::from([(executor.model(), Arc::new(executor))]) }
    }

    /// The adaptive model's thresholds, when it runs here.
    pub fn calibration(&self) -> Option<Calibration> {
        self.by_model.get(&Model::Adaptive).and_then(|executor| executor.calibration())
    }

    /// `/matrix` to `default`, and `/matrix/<name>` to every started model.
    pub fn router(&self, default: Model, body_bytes_max: usize) -> Router {
        let mut router = Router::new();
        if let Some(executor) = self.by_model.get(&default) {
            router = router.route("/matrix", matrix_route(Arc::clone(executor), body_bytes_max));
        }
        for (model, executor) in &self.by_model {
            let path = format!("/matrix/{}", model.name());
            router = router.route(&path, matrix_route(Arc::clone(executor), body_bytes_max));
        }
        router
    }
}

fn matrix_route(executor: Arc<Executor>, body_bytes_max: usize) -> MethodRouter {
    post(move |request: Request| async move { handle(&executor, request, body_bytes_max).await })
}

async fn handle(executor: &Executor, request: Request, body_bytes_max: usize) -> Response {
    let declared_bytes = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok()?.parse::<u64>().ok());
    let mut body = request.into_body();
    if declared_bytes.is_some_and(|bytes| bytes > body_bytes_max as u64) {
        return refuse_too_large(body, declared_bytes, body_bytes_max).await;
    }
    // Chunked bodies have no Content-Length: the read itself stops at the bound. It borrows the
    // body so that the rest of a refused one can still be drained.
    match Limited::new(&mut body, body_bytes_max).collect().await {
        Ok(collected) => into_response(executor.execute(collected.to_bytes()).await),
        Err(_) => refuse_too_large(body, None, body_bytes_max).await,
    }
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
/// answers code 007.
async fn refuse_too_large(
    mut body: Body,
    declared_bytes: Option<u64>,
    body_bytes_max: usize,
) -> Response {
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
    into_response(Reply::failure(None, &Failure::body_too_large(body_bytes_max)))
}

fn into_response(reply: Reply) -> Response {
    let status = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, [(header::CONTENT_TYPE, "application/json")], Body::from(reply.body)).into_response()
}

/// Serves `router` on `listener` with `io_threads` reactor threads until `shutdown`.
pub fn serve_blocking(
    listener: std::net::TcpListener,
    router: Router,
    io_threads: usize,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    serve_on(move || tokio::net::TcpListener::from_std(listener), router, io_threads, shutdown)
}

/// Serves `router` on the listener that `listener` makes inside the runtime (tokio listeners
/// register with the runtime that is current when they are made).
pub fn serve_on<L: Listener>(
    listener: impl FnOnce() -> std::io::Result<L>,
    router: Router,
    io_threads: usize,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()>
where
    L::Addr: std::fmt::Debug,
{
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(io_threads.max(1))
        .thread_name("web-io")
        .enable_all()
        .build()?;
    let _entered = runtime.enter();
    let listener = listener()?;
    runtime.block_on(
        async move { axum::serve(listener, router).with_graceful_shutdown(shutdown).await },
    )
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
        let router = executors.router(config.default_model, config.body_bytes_max);
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new().name("web-server".into()).spawn(move || {
            // The router holds the executors; when serving ends they drop and their workers stop.
            serve_blocking(listener, router, config.io_threads, async move {
                let _ = stopped.await;
            })
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
