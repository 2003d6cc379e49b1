//! `exchange serve`: one I/O thread (a tokio current-thread runtime) with the native and FIX
//! listeners, the router and the metrics listener, and the engine step where the layout puts
//! it ([`crate::layout`]): inline on the I/O thread, or on an engine thread of its own.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::thread::JoinHandle;

use exchange::core::CoreLimits;
use exchange::master::MasterData;
use exchange::msg::CoreOutput;
use pipeline::ring::{Consumer, RingConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::{Notify, oneshot};

use crate::credentials::Credential;
use crate::hub::{Hub, Settings};
use crate::layout::{Chosen, Layout, LayoutPlan};
use crate::{engine, fix_server, native_server};

/// Reports the router moves per batch before it yields to the connections.
const ROUTE_BATCH_MAX: usize = 256;
/// Connections open at once; further ones are closed at accept.
pub const CONNECTIONS_MAX: usize = 1024;
/// Wait after a failed accept.
const ACCEPT_RETRY: std::time::Duration = std::time::Duration::from_millis(100);
/// Bytes of a metrics request read before answering.
const METRICS_REQUEST_BYTES_MAX: usize = 4096;

/// What `serve` runs.
pub struct ServeOptions {
    pub listen: SocketAddr,
    pub fix_listen: Option<SocketAddr>,
    pub metrics_listen: Option<SocketAddr>,
    pub settings: Settings,
    pub credentials: Vec<Credential>,
    pub master: MasterData,
    pub core_limits: CoreLimits,
    pub ring: RingConfig,
    /// The engine's input journal.
    pub journal: engine::EngineJournal,
    /// The layout asked for.
    pub layout: Layout,
    /// The CPUs the layout is planned on (normally [`crate::layout::detect_topology`]).
    pub topology: pipeline::placement::Topology,
}

/// A running server.
pub struct Running {
    pub listen: SocketAddr,
    pub fix_listen: Option<SocketAddr>,
    pub metrics_listen: Option<SocketAddr>,
    /// The layout the server runs, and why.
    pub layout: LayoutPlan,
    stop: Option<oneshot::Sender<()>>,
    io: Option<JoinHandle<()>>,
}

impl Running {
    /// Stops accepting, closes every session and joins the threads.
    pub fn stop(mut self) {
        self.shutdown();
    }

    /// Waits until the server stops (it runs until stopped or killed).
    pub fn wait(mut self) {
        if let Some(io) = self.io.take() {
            let _ = io.join();
        }
    }

    fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(io) = self.io.take() {
            let _ = io.join();
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Why the server did not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("binding {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error("ring: {0}")]
    Ring(#[from] pipeline::ring::RingError),
    #[error("engine journal: {0:#}")]
    Journal(#[from] anyhow::Error),
}

fn bind(addr: SocketAddr) -> Result<std::net::TcpListener, ServeError> {
    let listener =
        std::net::TcpListener::bind(addr).map_err(|source| ServeError::Bind { addr, source })?;
    listener.set_nonblocking(true).map_err(|source| ServeError::Bind { addr, source })?;
    Ok(listener)
}

/// Binds the listeners, starts the engine and the I/O thread, and returns.
pub fn start(options: ServeOptions) -> Result<Running, ServeError> {
    let native = bind(options.listen)?;
    let fix = options.fix_listen.map(bind).transpose()?;
    let metrics = options.metrics_listen.map(bind).transpose()?;
    let local = |l: &std::net::TcpListener| l.local_addr().expect("bound listener has an address");
    let (listen, fix_listen, metrics_listen) =
        (local(&native), fix.as_ref().map(local), metrics.as_ref().map(local));
    let layout = crate::layout::plan(options.layout, &options.topology);
    tracing::info!(
        layout = layout.chosen.name(),
        requested = layout.requested.name(),
        usable_cpus = layout.usable_cpus,
        reason = %layout.reason,
        "serve layout"
    );
    let placement = match layout.chosen {
        Chosen::Inline => engine::Placement::Inline,
        Chosen::EngineThread { spin_cpu: Some(cpu) } => engine::Placement::SpinOn(cpu),
        Chosen::EngineThread { spin_cpu: None } => engine::Placement::Parked,
    };
    let link = engine::start(
        options.master,
        options.core_limits,
        &options.ring,
        &options.journal,
        placement,
    )?;
    if let Some(recovery) = &link.recovery {
        tracing::info!(
            recovered_seq = recovery.recovered_seq,
            replayed = recovery.replayed_records,
            snapshot = ?recovery.snapshot_seq,
            "engine journal recovered"
        );
    }
    let (settings, credentials) = (options.settings, options.credentials);
    let plan = layout.clone();
    let (stop, stopped) = oneshot::channel();
    // The hub holds `Rc`s, so it is built on the I/O thread; its result comes back here.
    let (built, hub_result) = std::sync::mpsc::sync_channel(1);
    let io = std::thread::Builder::new()
        .name("gateway-io".into())
        .spawn(move || {
            io_thread(settings, credentials, link, plan, (native, fix, metrics), built, stopped)
        })
        .expect("spawning the gateway I/O thread");
    hub_result.recv().expect("the I/O thread reports the hub")?;
    Ok(Running { listen, fix_listen, metrics_listen, layout, stop: Some(stop), io: Some(io) })
}

type Listeners =
    (std::net::TcpListener, Option<std::net::TcpListener>, Option<std::net::TcpListener>);

/// The I/O thread: builds the hub, runs the listeners and the router until stopped, then
/// stops the engine (its thread, or inline its journal) after the last session is gone.
fn io_thread(
    settings: Settings,
    credentials: Vec<Credential>,
    link: engine::EngineLink,
    layout: LayoutPlan,
    (native, fix, metrics): Listeners,
    built: std::sync::mpsc::SyncSender<Result<(), crate::store::StoreError>>,
    stopped: oneshot::Receiver<()>,
) {
    if let Some(cpus) = &layout.io_cpus
        && let Err(error) = pipeline::placement::pin_current_thread(cpus)
    {
        tracing::warn!(%error, "the I/O thread is not kept off the engine's CPU");
    }
    let books_recovered = link.recovery.is_some();
    let mut hub = match Hub::new(settings, credentials, link.ingress) {
        Ok(hub) => hub,
        Err(error) => {
            let _ = built.send(Err(error));
            return;
        }
    };
    hub.stage.engine_taken = link.taken;
    hub.stage.layout = Some(layout);
    hub.engine = link.inline;
    if !books_recovered {
        hub.forget_open_orders();
    }
    let _ = built.send(Ok(()));
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
    let hub = Rc::new(RefCell::new(hub));
    let local = tokio::task::LocalSet::new();
    let router = link.egress.map(|egress| (egress, link.reports_ready));
    local.block_on(&runtime, run(hub.clone(), native, fix, metrics, router, stopped));
    drop(local);
    let inline = hub.borrow_mut().engine.take();
    // Dropping the hub drops the ingress producer: an engine thread sees the ring closed.
    drop(hub);
    let stopped = match (link.thread, inline) {
        (Some(thread), _) => {
            thread.join().unwrap_or_else(|_| Err("the engine thread panicked".into()))
        }
        (None, Some(engine)) => engine.finish(),
        (None, None) => Ok(()),
    };
    if let Err(error) = stopped {
        tracing::error!(%error, "engine at shutdown");
    }
}

async fn run(
    hub: Rc<RefCell<Hub>>,
    native: std::net::TcpListener,
    fix: Option<std::net::TcpListener>,
    metrics: Option<std::net::TcpListener>,
    router: Option<(Consumer<CoreOutput>, std::sync::Arc<Notify>)>,
    stopped: oneshot::Receiver<()>,
) {
    let native = TcpListener::from_std(native).expect("tokio listener");
    tokio::task::spawn_local(accept_loop(hub.clone(), native, false));
    if let Some(fix) = fix {
        let fix = TcpListener::from_std(fix).expect("tokio listener");
        tokio::task::spawn_local(accept_loop(hub.clone(), fix, true));
    }
    cancel_recovered_orders(&hub);
    let synced = hub.borrow().log.borrow().synced_notify();
    if let Some(synced) = synced {
        tokio::task::spawn_local(release_loop(hub.clone(), synced));
    }
    if let Some(metrics) = metrics {
        let metrics = TcpListener::from_std(metrics).expect("tokio listener");
        tokio::task::spawn_local(metrics_loop(hub.clone(), metrics));
    }
    match router {
        Some((egress, ready)) => {
            tokio::select! {
                _ = route(hub, egress, ready) => {}
                _ = stopped => {}
            }
        }
        // Inline without the journal: sessions route their reports themselves.
        None => drop(stopped.await),
    }
}

/// Moves the reports another thread (the engine's or the release thread) published to their
/// sessions.
async fn route(
    hub: Rc<RefCell<Hub>>,
    mut egress: Consumer<CoreOutput>,
    ready: std::sync::Arc<Notify>,
) {
    loop {
        ready.notified().await;
        loop {
            let moved = {
                let mut hub = hub.borrow_mut();
                let moved = egress.read_batch(ROUTE_BATCH_MAX, |output| hub.route(output));
                hub.stage.egress_depth = egress.len();
                hub.commit();
                moved
            };
            if moved == 0 {
                break;
            }
            tokio::task::yield_now().await;
        }
        if egress.is_disconnected() {
            return;
        }
    }
}

/// Orders in the recovered books belong to sessions the restart ended: cancel-on-disconnect
/// applies to them as to any dropped session, from the start.
fn cancel_recovered_orders(hub: &Rc<RefCell<Hub>>) {
    let Some(grace) = hub.borrow().settings.cancel_on_disconnect else { return };
    let waiting: Vec<(usize, u64)> = hub
        .borrow()
        .clients
        .iter()
        .enumerate()
        .filter(|(_, client)| !client.open.is_empty())
        .map(|(at, client)| (at, client.generation))
        .collect();
    for (at, generation) in waiting {
        crate::session::cancel_after_grace(hub, at, generation, grace);
    }
}

/// Sends what the store's syncer has just made durable.
async fn release_loop(hub: Rc<RefCell<Hub>>, synced: std::sync::Arc<Notify>) {
    loop {
        synced.notified().await;
        hub.borrow().log.borrow_mut().release();
    }
}

async fn accept_loop(hub: Rc<RefCell<Hub>>, listener: TcpListener, fix: bool) {
    let open = Rc::new(std::cell::Cell::new(0usize));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of descriptors, say: back off instead of spinning on the error.
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(ACCEPT_RETRY).await;
                continue;
            }
        };
        if open.get() >= CONNECTIONS_MAX {
            tracing::warn!(%peer, "connection refused: {CONNECTIONS_MAX} open");
            continue;
        }
        open.set(open.get() + 1);
        let (hub, open) = (hub.clone(), open.clone());
        tokio::task::spawn_local(async move {
            if fix {
                fix_server::serve(hub, stream).await;
            } else {
                native_server::serve(hub, stream).await;
            }
            open.set(open.get() - 1);
        });
    }
}

async fn metrics_loop(hub: Rc<RefCell<Hub>>, listener: TcpListener) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            tokio::time::sleep(ACCEPT_RETRY).await;
            continue;
        };
        let hub = hub.clone();
        tokio::task::spawn_local(async move {
            let mut request = [0u8; METRICS_REQUEST_BYTES_MAX];
            let _ =
                tokio::time::timeout(std::time::Duration::from_secs(1), stream.read(&mut request))
                    .await;
            let body = crate::metrics::prometheus_text(&hub.borrow());
            let head = format!(
                "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(head.as_bytes()).await;
            let _ = stream.write_all(body.as_bytes()).await;
        });
    }
}
