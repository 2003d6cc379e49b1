//! `exchange serve`: gateway sessions on the exchange tier. The tier
//! ([`exchange::tier::Tier`]) runs its stages on the threads its layout plans, and runs the
//! gateway's I/O loop (`crate::io`: the native and FIX listeners, the sessions, the store,
//! the router, the metrics and admin listener) as its order source: inline before the
//! pre-process on few CPUs, on a thread of its own otherwise. Its R-Senders hand each
//! client's reports back through reply queues (`exchange::tier::reply_subscribers`) that the
//! loop routes to the owning session. The gateway wires no stages of its own.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use exchange::ExchangeError;
use exchange::durability::JournalOptions;
use exchange::tier::{
    SubscriberFactory, Tier, TierConfig, TierLayout, TierStart, reply_subscribers,
};
use stats::LatencyHistogram;
use tokio::sync::{Notify, oneshot};

use crate::credentials::Credential;
use crate::io::{InTierRequest, IoSetup, describe};
use crate::settings::Settings;

pub use crate::error::ServeError;

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
    /// `--nats`); `tier.outlets` subscribers per R-Sender.
    pub also: Option<SubscriberFactory>,
}

/// A running server.
pub struct Running {
    pub listen: SocketAddr,
    pub fix_listen: Option<SocketAddr>,
    pub metrics_listen: Option<SocketAddr>,
    /// The tier's thread layout.
    pub layout: TierLayout,
    tier: Option<Tier>,
    stop: Arc<AtomicBool>,
    work: Arc<Notify>,
    in_tier: tokio::sync::mpsc::UnboundedSender<InTierRequest>,
}

impl Running {
    /// Stops accepting, closes every session, drains and stops the tier.
    pub fn stop(mut self) {
        self.shutdown();
    }

    /// Waits until the server stops (it runs until stopped or killed).
    pub fn wait(mut self) {
        self.finish();
    }

    /// The in-tier response times since the last call (arrival at the gateway → the tier's
    /// answer at the router, see `metrics::StageMetrics::in_tier`), and a fresh
    /// histogram from now on; `None` once the server stopped. Call it from outside the
    /// server's threads (it waits for the I/O loop's answer).
    pub fn take_in_tier_latency(&self) -> Option<LatencyHistogram> {
        let (reply, answer) = oneshot::channel();
        self.in_tier.send(reply).ok()?;
        self.work.notify_one();
        answer.blocking_recv().ok()
    }

    fn shutdown(&mut self) {
        // Release: the I/O loop that sees the flag stops after the turn it is in.
        self.stop.store(true, Ordering::Release);
        self.work.notify_one();
        self.finish();
    }

    /// Waits for the tier: its I/O loop stops (on a stop request), its stages drain, its
    /// journals stop.
    fn finish(&mut self) {
        let Some(tier) = self.tier.take() else { return };
        match tier.stop() {
            Ok(stopped) => tracing::info!(delivered = stopped.delivered, "tier stopped"),
            Err(error) => tracing::error!(error = %ops::error_chain(&error), "tier at shutdown"),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn bind(addr: SocketAddr) -> Result<std::net::TcpListener, ServeError> {
    let listener =
        std::net::TcpListener::bind(addr).map_err(|source| ServeError::Bind { addr, source })?;
    listener.set_nonblocking(true).map_err(|source| ServeError::Bind { addr, source })?;
    Ok(listener)
}

/// The bound addresses of the native, FIX and metrics listeners.
pub type BoundAddresses = (SocketAddr, Option<SocketAddr>, Option<SocketAddr>);

/// Binds the native, FIX and metrics listeners (refusing a store another process owns and an
/// exposed `/metrics` first).
pub(crate) fn bind_listeners(
    (listen, fix_listen, metrics_listen): BoundAddresses,
    settings: &Settings,
) -> Result<(crate::io::Listeners, BoundAddresses), ServeError> {
    probe_store_owner(settings)?;
    if let Some(addr) = metrics_listen {
        check_metrics_exposure(addr, settings)?;
    }
    let native = bind(listen)?;
    let fix = fix_listen.map(bind).transpose()?;
    let metrics = metrics_listen.map(bind).transpose()?;
    let local = |l: &std::net::TcpListener| l.local_addr().expect("bound listener has an address");
    let addresses = (local(&native), fix.as_ref().map(local), metrics.as_ref().map(local));
    Ok(((native, fix, metrics), addresses))
}

/// Refuses a store another process owns before anything is bound: a second server started
/// with the first one's config is told who holds the store, not that a port is taken. Only a
/// probe: the store's log takes the lock it holds while open (`store::Log::open`), and the
/// tier its journals' (`exchange::durability::open_shards`).
fn probe_store_owner(settings: &Settings) -> Result<(), ServeError> {
    let dir = &settings.store_dir;
    let probe = ops::StoreLock::acquire(dir).map_err(|source| crate::store::StoreError::Owned {
        dir: dir.display().to_string(),
        source,
    })?;
    drop(probe);
    Ok(())
}

/// Refuses an open `/metrics` on an address other hosts can reach: the page shows the
/// server's activity (and, with `metrics_per_client`, every client id). With a
/// `metrics_token` any address is allowed; loopback needs none.
fn check_metrics_exposure(addr: SocketAddr, settings: &Settings) -> Result<(), ServeError> {
    if addr.ip().is_loopback() || settings.metrics_token.is_some() {
        return Ok(());
    }
    Err(ServeError::MetricsExposed { addr })
}

/// Binds the listeners, starts the tier with the gateway's I/O loop as its order source, and
/// returns once the loop has opened the store. With a journal and a syncing store, the store's
/// syncer takes over the reply hold (docs/JOURNAL.md, "Durable replies in exchange serve");
/// with an unsynced store, or with NATS subscribers (`also`), the tier holds replies until
/// its journal has their input.
pub fn start(mut options: ServeOptions) -> Result<Running, ServeError> {
    if options.settings.instruments.is_empty() && options.tier.master_data.is_none() {
        let table = exchange::flow::reference_market(&options.tier.universe).1;
        options.settings.instruments = Arc::new(table);
    }
    let addresses = (options.listen, options.fix_listen, options.metrics_listen);
    let (listeners, (listen, fix_listen, metrics_listen)) =
        bind_listeners(addresses, &options.settings)?;
    let journaled = options.tier.journal.holds_replies();
    // The store's syncer can take over the reply hold only for what goes through the store:
    // with NATS subscribers beside the sessions, the tier holds every reply itself, so that
    // nothing is published before its input is on disk.
    let store_waits = journaled && options.settings.store_sync && options.also.is_none();
    let config = TierConfig { hold_replies: !store_waits, ..options.tier.clone() };
    let work = Arc::new(Notify::new());
    let wake = work.clone();
    let wake = Arc::new(move || wake.notify_one());
    let (subscribers, replies) = reply_subscribers(config.outlets, options.also.clone(), wake);
    let stop = Arc::new(AtomicBool::new(false));
    let (in_tier, in_tier_requests) = tokio::sync::mpsc::unbounded_channel();
    let setup = IoSetup {
        settings: options.settings,
        credentials: options.credentials,
        journaled: options.tier.journal.policy().is_some(),
        listeners,
        replies,
        work: work.clone(),
        stop: stop.clone(),
        in_tier: in_tier_requests,
        resolutions: None,
        staged_max: crate::io::STAGED_ORDERS_MAX.min(options.tier.ring_slots),
        routed: None,
    };
    let start = TierStart {
        journal: JournalOptions {
            data_dir: options.tier.journal.policy().map(|_| options.journal_dir.clone()),
            ..JournalOptions::default()
        },
        ..TierStart::new(config, options.planned_rate_per_s, subscribers)
    };
    // The tier hands the loop its control input, journals and layout when it starts it, and
    // returns once the loop has opened the store (or with the loop's error).
    let source = crate::io::order_source(setup, store_waits);
    let tier = Tier::start_with_source(start, source).map_err(source_error)?;
    let layout = tier.layout().clone();
    tracing::info!(
        groups = %describe(&layout),
        usable_cpus = layout.usable_cpus,
        entry_inline = layout.generator_inline,
        journal = options.tier.journal.name(),
        "tier started"
    );
    Ok(Running {
        listen,
        fix_listen,
        metrics_listen,
        layout,
        tier: Some(tier),
        stop,
        work,
        in_tier,
    })
}

/// The loop's own start-up error when the source failed to start (a store another process
/// owns, the verifiers), else the tier's.
fn source_error(error: ExchangeError) -> ServeError {
    match error {
        ExchangeError::SourceFailed(failed) => match failed.downcast::<ServeError>() {
            Ok(serve) => *serve,
            Err(other) => ServeError::Tier(ExchangeError::SourceFailed(other)),
        },
        other => ServeError::Tier(other),
    }
}
