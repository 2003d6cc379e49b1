//! `exchange serve`: gateway sessions on the exchange tier. One I/O thread (a tokio
//! current-thread runtime) runs the native and FIX listeners, the sessions, the router and the
//! metrics listener; the tier ([`exchange::tier::Tier`]) runs its stages on the threads its
//! layout plans. Sessions hand admitted orders to the tier's order input without waiting
//! (a full input answers "busy"); the tier's R-Senders hand each client's reports back through
//! reply rings ([`exchange::tier::reply_subscribers`]), and the router passes them to the
//! owning session. The gateway wires no stages of its own.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::thread::JoinHandle;

use exchange::durability::JournalOptions;
use exchange::tier::{
    GroupWait, ReplyReceiver, RunOptions, SubscriberFactory, Tier, TierConfig, TierControl,
    TierInputs, TierLayout, reply_subscribers,
};
use lab::stats::LatencyHistogram;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::{Notify, oneshot};

use crate::admin::{AdminError, AdminRequest};
use crate::credentials::Credential;
use crate::hub::{Hub, Settings};
use crate::metrics::LayoutInfo;
use crate::{fix_server, native_server};

/// Reports the router moves per ring and batch before it yields to the connections.
const ROUTE_BATCH_MAX: usize = 256;
/// Connections open at once; further ones are closed at accept.
pub const CONNECTIONS_MAX: usize = 1024;
/// Wait after a failed accept.
const ACCEPT_RETRY: std::time::Duration = std::time::Duration::from_millis(100);
/// Bytes of an HTTP request read before answering (the metrics listener's endpoints).
const METRICS_REQUEST_BYTES_MAX: usize = 4096;
/// Time an HTTP client has to send its request line.
const HTTP_REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// What `serve` runs.
pub struct ServeOptions {
    pub listen: SocketAddr,
    pub fix_listen: Option<SocketAddr>,
    pub metrics_listen: Option<SocketAddr>,
    pub settings: Settings,
    pub credentials: Vec<Credential>,
    /// The tier behind the sessions: its universe is the master data the pre-process checks
    /// orders against; its journal makes the books survive a restart.
    pub tier: TierConfig,
    /// The order rate the tier's layout is planned for, orders/s.
    pub planned_rate_per_s: f64,
    /// Where the tier's journals and master data live (used with a journal).
    pub journal_dir: PathBuf,
    /// Also hands every response, market data included, to these (the NATS publishers of
    /// `--nats`); `tier.gateways` subscribers per R-Sender.
    pub also: Option<SubscriberFactory>,
}

/// A running server.
pub struct Running {
    pub listen: SocketAddr,
    pub fix_listen: Option<SocketAddr>,
    pub metrics_listen: Option<SocketAddr>,
    /// The tier's thread layout.
    pub layout: TierLayout,
    stop: Option<oneshot::Sender<()>>,
    io: Option<JoinHandle<()>>,
    in_tier: InTierRequests,
}

/// Requests for the in-tier latency histogram, answered on the I/O thread.
type InTierRequests = tokio::sync::mpsc::UnboundedSender<oneshot::Sender<LatencyHistogram>>;

impl Running {
    /// The in-tier response times since the last call (arrival at the gateway → the tier's
    /// answer at the router, see [`crate::metrics::StageMetrics::in_tier`]), and a fresh
    /// histogram from now on; `None` once the server stopped. Call it from outside the
    /// server's runtime (it waits for the I/O thread's answer).
    pub fn take_in_tier_latency(&self) -> Option<LatencyHistogram> {
        let (reply, answer) = oneshot::channel();
        self.in_tier.send(reply).ok()?;
        answer.blocking_recv().ok()
    }

    /// Stops accepting, closes every session, drains and stops the tier, joins the threads.
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
    #[error("tier: {0:#}")]
    Tier(#[from] anyhow::Error),
}

fn bind(addr: SocketAddr) -> Result<std::net::TcpListener, ServeError> {
    let listener =
        std::net::TcpListener::bind(addr).map_err(|source| ServeError::Bind { addr, source })?;
    listener.set_nonblocking(true).map_err(|source| ServeError::Bind { addr, source })?;
    Ok(listener)
}

/// "preprocess+core:spin events+masterdata:park".
fn describe(layout: &TierLayout) -> String {
    let wait = |wait: GroupWait| match wait {
        GroupWait::Spin => "spin",
        GroupWait::ParkDedicated | GroupWait::ParkFloating => "park",
    };
    let groups = layout.groups.iter().map(|g| format!("{}:{}", g.label(), wait(g.wait)));
    groups.collect::<Vec<_>>().join(" ")
}

/// The tier's side of a running server, handed to the I/O thread.
struct TierLink {
    tier: Tier,
    inputs: TierInputs,
    replies: ReplyReceiver,
    reports_ready: Arc<Notify>,
    /// The store's syncer waits for these journals instead of the tier holding replies.
    journals: Option<Vec<Arc<journal::DurableSeq>>>,
}

/// Starts the tier: recovers its journals (with one), plans its layout and starts its stages,
/// its R-Senders handing client reports to the router. With a journal and a syncing store, the
/// store's syncer takes over the reply hold (docs/JOURNAL.md, "Durable replies in exchange
/// serve"); with an unsynced store the tier holds replies until its journal has their input.
fn start_tier(options: &ServeOptions) -> Result<TierLink, ServeError> {
    let journaled = options.tier.journal.holds_replies();
    let store_waits = journaled && options.settings.store_sync;
    let config = TierConfig { hold_replies: !store_waits, ..options.tier.clone() };
    let reports_ready = Arc::new(Notify::new());
    let wake = reports_ready.clone();
    let (subscribers, replies) = reply_subscribers(
        config.gateways,
        options.also.clone(),
        Arc::new(move || wake.notify_one()),
    );
    let run = RunOptions {
        rate_per_s: options.planned_rate_per_s,
        duration: std::time::Duration::ZERO,
        record_inputs: false,
        journal: JournalOptions {
            data_dir: options.tier.journal.policy().map(|_| options.journal_dir.clone()),
            ..JournalOptions::default()
        },
        released: None,
    };
    let (tier, inputs) = Tier::start(&config, &run, subscribers)?;
    let journals = store_waits.then(|| tier.durables().into_iter().flatten().collect());
    Ok(TierLink { tier, inputs, replies, reports_ready, journals })
}

/// Binds the listeners, starts the tier and the I/O thread, and returns.
pub fn start(options: ServeOptions) -> Result<Running, ServeError> {
    let native = bind(options.listen)?;
    let fix = options.fix_listen.map(bind).transpose()?;
    let metrics = options.metrics_listen.map(bind).transpose()?;
    let local = |l: &std::net::TcpListener| l.local_addr().expect("bound listener has an address");
    let (listen, fix_listen, metrics_listen) =
        (local(&native), fix.as_ref().map(local), metrics.as_ref().map(local));
    let link = start_tier(&options)?;
    let layout = link.tier.layout().clone();
    tracing::info!(
        groups = %describe(&layout),
        usable_cpus = layout.usable_cpus,
        journal = options.tier.journal.name(),
        "tier started"
    );
    let journaled = options.tier.journal.policy().is_some();
    let (settings, credentials) = (options.settings, options.credentials);
    let (stop, stopped) = oneshot::channel();
    let (in_tier, in_tier_requests) = tokio::sync::mpsc::unbounded_channel();
    // The hub holds `Rc`s, so it is built on the I/O thread; its result comes back here.
    let (built, hub_result) = std::sync::mpsc::sync_channel(1);
    let io = std::thread::Builder::new()
        .name("gateway-io".into())
        .spawn(move || {
            let io = IoThread { settings, credentials, journaled, link, in_tier_requests };
            io.run((native, fix, metrics), built, stopped)
        })
        .expect("spawning the gateway I/O thread");
    hub_result.recv().expect("the I/O thread reports the hub")?;
    let stop = Some(stop);
    Ok(Running { listen, fix_listen, metrics_listen, layout, stop, io: Some(io), in_tier })
}

type Listeners =
    (std::net::TcpListener, Option<std::net::TcpListener>, Option<std::net::TcpListener>);

/// What the I/O thread starts from.
struct IoThread {
    settings: Settings,
    credentials: Vec<Credential>,
    /// Whether the tier's books were recovered from its journal (else restored open orders
    /// are forgotten).
    journaled: bool,
    link: TierLink,
    in_tier_requests: tokio::sync::mpsc::UnboundedReceiver<oneshot::Sender<LatencyHistogram>>,
}

impl IoThread {
    /// Builds the hub, runs the listeners and the router until stopped, then drops the
    /// tier's inputs (the tier drains) and stops the tier.
    fn run(
        self,
        (native, fix, metrics): Listeners,
        built: std::sync::mpsc::SyncSender<Result<(), ServeError>>,
        stopped: oneshot::Receiver<()>,
    ) {
        let IoThread { settings, credentials, journaled, link, in_tier_requests } = self;
        let TierLink { tier, inputs, replies, reports_ready, journals } = link;
        let TierInputs { orders, control } = inputs;
        let mut hub = match Hub::new(settings, credentials, Box::new(orders)) {
            Ok(hub) => hub,
            Err(error) => {
                let _ = built.send(Err(error.into()));
                drop(control);
                let _ = tier.stop();
                return;
            }
        };
        if let Some(journals) = journals {
            let waits = hub.log.borrow_mut().wait_for_journals(journals);
            debug_assert!(waits, "a syncing store waits for the journals before its first commit");
        }
        let layout = tier.layout();
        let groups = describe(layout);
        hub.stage.layout = Some(LayoutInfo { groups, usable_cpus: layout.usable_cpus });
        if !journaled {
            hub.forget_open_orders();
        }
        let _ = built.send(Ok(()));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        let hub = Rc::new(RefCell::new(hub));
        let local = tokio::task::LocalSet::new();
        let router = (replies, reports_ready);
        let control = Rc::new(RefCell::new(control));
        let listeners = (native, fix, metrics);
        local.spawn_local(answer_in_tier(hub.clone(), in_tier_requests));
        local.block_on(&runtime, serve(hub.clone(), control.clone(), listeners, router, stopped));
        drop(local);
        // Dropping the hub drops the order input: with the control input gone too, the tier
        // drains and stops.
        drop(hub);
        drop(control);
        match tier.stop() {
            Ok(stopped) => tracing::info!(delivered = stopped.delivered, "tier stopped"),
            Err(error) => tracing::error!(error = %format!("{error:#}"), "tier at shutdown"),
        }
    }
}

async fn serve(
    hub: Rc<RefCell<Hub>>,
    control: Rc<RefCell<TierControl>>,
    (native, fix, metrics): Listeners,
    (replies, ready): (ReplyReceiver, Arc<Notify>),
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
        tokio::task::spawn_local(http_loop(hub.clone(), control, metrics));
    }
    tokio::select! {
        _ = route(hub, replies, ready) => {}
        _ = stopped => {}
    }
}

/// Hands the in-tier histogram to whoever asks, starting a fresh one.
async fn answer_in_tier(
    hub: Rc<RefCell<Hub>>,
    mut requests: tokio::sync::mpsc::UnboundedReceiver<oneshot::Sender<LatencyHistogram>>,
) {
    while let Some(reply) = requests.recv().await {
        let taken = std::mem::take(&mut hub.borrow_mut().stage.in_tier);
        let _ = reply.send(taken);
    }
}

/// Moves the reports the tier's R-Senders published to their sessions.
async fn route(hub: Rc<RefCell<Hub>>, mut replies: ReplyReceiver, ready: Arc<Notify>) {
    loop {
        ready.notified().await;
        loop {
            let moved = {
                let mut hub = hub.borrow_mut();
                let moved = replies.read(ROUTE_BATCH_MAX, |output| hub.route(output));
                hub.stage.egress_depth = replies.pending();
                hub.commit();
                moved
            };
            if moved == 0 {
                break;
            }
            tokio::task::yield_now().await;
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

/// The metrics listener's HTTP endpoints ([`crate::admin`]): one request per connection.
async fn http_loop(
    hub: Rc<RefCell<Hub>>,
    control: Rc<RefCell<TierControl>>,
    listener: TcpListener,
) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            tokio::time::sleep(ACCEPT_RETRY).await;
            continue;
        };
        let (hub, control) = (hub.clone(), control.clone());
        tokio::task::spawn_local(async move {
            let mut request = [0u8; METRICS_REQUEST_BYTES_MAX];
            let read = stream.read(&mut request);
            let read = tokio::time::timeout(HTTP_REQUEST_TIMEOUT, read).await;
            let read = read.ok().and_then(Result::ok).unwrap_or(0);
            let text = String::from_utf8_lossy(&request[..read]);
            let line = text.lines().next().unwrap_or("");
            let (status, content_type, body) = match crate::admin::parse(line) {
                Ok(AdminRequest::Metrics) => {
                    let body = crate::metrics::prometheus_text(&hub.borrow());
                    (200, "text/plain; version=0.0.4", body)
                }
                Ok(AdminRequest::Health | AdminRequest::Ready) => {
                    (200, "text/plain", "ok\n".into())
                }
                Ok(AdminRequest::Event(event)) => match control.borrow_mut().event(event) {
                    Ok(()) => {
                        tracing::info!(?event, "admin: external event sent to the tier");
                        (200, "text/plain", format!("sent {event:?}\n"))
                    }
                    Err(_) => (503, "text/plain", "the tier is stopping\n".into()),
                },
                Err(AdminError { status, reason }) => (status, "text/plain", format!("{reason}\n")),
            };
            let head = format!(
                "HTTP/1.0 {status} {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\r\n",
                status_text(status),
                body.len()
            );
            let _ = stream.write_all(head.as_bytes()).await;
            let _ = stream.write_all(body.as_bytes()).await;
        });
    }
}

fn status_text(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        _ => "Service Unavailable",
    }
}
