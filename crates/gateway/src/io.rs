//! The gateway's I/O loop as the tier's order source ([`exchange::tier::OrderSource`]): a
//! tokio current-thread runtime with the native and FIX listeners, the sessions and the
//! answers to the metrics and admin endpoint (`crate::admin`, on a thread of its own), run a
//! turn at a time by the tier on the thread its layout gives the
//! entry. On few CPUs that is the chain's first thread: decode → checks → matching → R-Sender →
//! reply queue → route → encode → store → socket runs to completion on one thread, with no
//! wake-up between the gateway and the tier; elsewhere the loop has a thread of its own ahead
//! of the pre-process ring.
//!
//! Each turn ([`IoLoop::turn`]) routes the replies the R-Senders queued (never waiting for
//! them: `exchange::tier::reply_subscribers`), runs the sessions' ready work (or, with
//! nothing to do, waits in the runtime's `epoll_wait` until a socket, a timer, a reply or a
//! stop request wakes it), then emits the orders the sessions admitted meanwhile.
//!
//! The loop's state holds `Rc`s (one thread, no locks), so it is built on the tier's thread
//! when the source starts, from what the tier hands it then ([`exchange::tier::SourceStart`]),
//! and kept in a thread-local ([`IO_LOOP`]); the source itself only carries what is `Send`.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use exchange::events::ExternalEvent;
use exchange::msg::InboundOrder;
use exchange::tier::{
    GroupWait, OrderSource, ReplyReceiver, SourceStart, SourceTurns, TierControl, TierLayout,
};
use pipeline::stage::{Emitter, Flow};
use stats::LatencyHistogram;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{Notify, oneshot};

use crate::admin::{AdminAsk, EndpointSetup, HTTP_CONNECTIONS_MAX, LoopAsks};
use crate::admission::Admission;
use crate::credentials::Credential;
use crate::error::ServeError;
use crate::hub::{Hub, OrderEntry, Refused, Resolution};
use crate::metrics::LayoutInfo;
use crate::settings::Settings;
use crate::{fix_server, native_server};

/// Replies routed per reply queue and read before the store's batch is committed.
const ROUTE_BATCH_MAX: usize = 256;
/// Orders the sessions may admit between two turns; beyond, they are refused as busy (fewer
/// when the tier's rings are smaller: [`IoSetup::staged_max`]).
pub const STAGED_ORDERS_MAX: usize = 4096;
/// Longest wait of an idle turn: the tier's stages that share the loop's thread also read
/// their other inputs (external events into the core) between turns.
const IDLE_WAIT_MAX: Duration = Duration::from_millis(10);
/// The longest a stopping server waits for the tier to answer what it took, the store to
/// sync it and the sessions to write it.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a TLS session's end waits to send its close_notify.
const TLS_CLOSE_TIMEOUT: Duration = Duration::from_secs(1);
/// Wait after a failed accept.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// The listeners: native, FIX, metrics and admin.
pub(crate) type Listeners =
    (std::net::TcpListener, Option<std::net::TcpListener>, Option<std::net::TcpListener>);

/// Requests for the in-tier latency histogram, answered on the loop's thread.
pub(crate) type InTierRequest = oneshot::Sender<LatencyHistogram>;

/// What the loop reaches beyond its sessions: the tier's control input (or the input log), the
/// journals the store's syncer waits for, the tier's layout.
pub(crate) struct TierHandoff {
    pub(crate) upstream: Upstream,
    pub(crate) journals: Option<Vec<Arc<journal::DurableSeq>>>,
    pub(crate) layout: LayoutInfo,
}

/// Where the admin endpoints' external events go.
pub(crate) enum EventSink {
    /// The tier's control input (the tier runs in this process).
    Tier(TierControl),
    /// The input log, as operator requests among the orders (`crate::remote`): every engine
    /// of the instrument's shard applies the event at the same place in its input.
    Log(tokio::sync::mpsc::Sender<InboundOrder>),
}

impl EventSink {
    /// Where events go, for the log line.
    fn destination(&self) -> &'static str {
        match self {
            EventSink::Tier(_) => "the tier",
            EventSink::Log(_) => "the input log",
        }
    }

    /// Hands `event` on; `Err` says why it could not be.
    fn send(&mut self, event: ExternalEvent) -> Result<(), &'static str> {
        match self {
            EventSink::Tier(control) => control.event(event).map_err(|_| "the tier is stopping"),
            EventSink::Log(appends) => {
                let request = event.as_request().ok_or("no event")?;
                appends.try_send(request).map_err(|error| match error {
                    TrySendError::Full(_) => "the input log's append queue is full",
                    TrySendError::Closed(_) => "the gateway is stopping",
                })
            }
        }
    }
}

/// What the admin endpoints reach beyond the sessions.
pub(crate) struct Upstream {
    /// Where admin events go.
    pub(crate) events: EventSink,
    /// For a gateway without a tier: whether its NATS connection (the input log, the reports)
    /// is up, kept by `crate::remote`; `/ready` answers 503 while it is not.
    pub(crate) reachable: Option<Arc<AtomicBool>>,
}

/// What the loop is built from: everything that crosses onto the tier's thread.
pub(crate) struct IoSetup {
    pub(crate) settings: Settings,
    pub(crate) credentials: Vec<Credential>,
    /// Whether the tier's books were recovered from its journal (else the open orders the
    /// store restored are forgotten).
    pub(crate) journaled: bool,
    pub(crate) listeners: Listeners,
    pub(crate) replies: ReplyReceiver,
    /// Notified when replies are queued, orders staged, or a stop is requested.
    pub(crate) work: Arc<Notify>,
    pub(crate) stop: Arc<AtomicBool>,
    pub(crate) in_tier: tokio::sync::mpsc::UnboundedReceiver<InTierRequest>,
    /// Orders one turn may hand the tier: [`STAGED_ORDERS_MAX`], or the tier's ring size when
    /// smaller. On few CPUs the pre-process sends a turn's rejects into a ring that this thread
    /// reads only between turns (`pipeline`'s fused drain), so a turn must fit in it.
    pub(crate) staged_max: usize,
    /// A gateway without a tier: where the store publishes how far each slot's reports are
    /// durably routed (`crate::routed`); `None` inside a tier.
    pub(crate) routed: Option<Arc<crate::routed::DurableInputs>>,
    /// A gateway without a tier: what the input log said of appends whose acknowledgement
    /// was given up on (`crate::remote`), for the hub to count and answer.
    pub(crate) resolutions: Option<tokio::sync::mpsc::UnboundedReceiver<Resolution>>,
}

thread_local! {
    /// The loop of the server whose source runs on this thread (one per thread: the tier
    /// runs one source per server, on a thread of its own or on the chain's first).
    static IO_LOOP: RefCell<Option<IoLoop>> = const { RefCell::new(None) };
}

/// The order source the tier runs: builds the loop on the source's thread from what the tier
/// hands it when it starts (its control input, its durable sequences when the store's syncer
/// waits for the journals, `store_waits`, and its layout), then turns it, and tears it down
/// when it stops. The loop's start-up error is the source's ([`ServeError`]).
/// Refuses a busy-polling loop the layout cannot give a CPU of its own: it needs one CPU per
/// spinning thread (counting the loop's, which spins already when it runs inline in a spinning
/// first group) and one more for everything that parks (the other stages, the store's syncer,
/// the OS).
fn busy_poll_fits(layout: &TierLayout) -> Result<(), ServeError> {
    let first_spins = layout.groups.first().is_some_and(|group| group.spins());
    let loop_counted = layout.generator_inline && first_spins;
    let needed_cpus = layout.spinning_threads() + usize::from(!loop_counted) + 1;
    if needed_cpus <= layout.usable_cpus {
        return Ok(());
    }
    let (usable_cpus, layout) = (layout.usable_cpus, describe(layout));
    Err(ServeError::BusyPollCpus { needed_cpus, usable_cpus, layout })
}

pub(crate) fn order_source(setup: IoSetup, store_waits: bool) -> OrderSource {
    OrderSource::new(move |started: SourceStart| {
        let SourceStart { control, durables, layout } = started;
        if setup.settings.busy_poll {
            busy_poll_fits(&layout)?;
        }
        let journals = store_waits.then(|| durables.into_iter().flatten().collect());
        let layout = LayoutInfo { groups: describe(&layout), usable_cpus: layout.usable_cpus };
        let upstream = Upstream { events: EventSink::Tier(control), reachable: None };
        let io = IoLoop::build(setup, TierHandoff { upstream, journals, layout })?;
        IO_LOOP.with(|slot| *slot.borrow_mut() = Some(io));
        let turns = |out: &mut Emitter<InboundOrder>| {
            IO_LOOP.with(|slot| {
                let mut emit = |order: InboundOrder| {
                    out.emit_with_ingress(order, order.stamps.intended_ns);
                    true
                };
                turn(&mut slot.borrow_mut(), &mut emit)
            })
        };
        Ok(Box::new(turns) as SourceTurns)
    })
}

/// "preprocess+core:spin events+masterdata:park".
pub(crate) fn describe(layout: &TierLayout) -> String {
    let wait = |wait: GroupWait| match wait {
        GroupWait::Spin => "spin",
        GroupWait::ParkDedicated | GroupWait::ParkFloating => "park",
    };
    let groups = layout.groups.iter().map(|g| format!("{}:{}", g.label(), wait(g.wait)));
    groups.collect::<Vec<_>>().join(" ")
}

/// Runs the loop on this thread until it stops, handing each admitted order to `out`, which
/// says whether it took it (a gateway without a tier: `crate::remote`). An order `out` does
/// not take stays staged for the next turn, and a full stage answers busy. `built` hears
/// whether the loop started.
pub(crate) fn run_loop(
    (setup, handoff): (IoSetup, TierHandoff),
    built: std::sync::mpsc::SyncSender<Result<(), ServeError>>,
    mut out: impl FnMut(InboundOrder) -> bool,
) {
    let mut slot = match IoLoop::build(setup, handoff) {
        Ok(io) => Some(io),
        Err(error) => {
            let _ = built.send(Err(error));
            return;
        }
    };
    let _ = built.send(Ok(()));
    while matches!(turn(&mut slot, &mut out), Flow::Continue) {}
}

/// Runs one turn of the loop in `slot`; a loop that stops is dropped (its sessions, store and
/// control input go now, on this thread).
fn turn(slot: &mut Option<IoLoop>, out: &mut dyn FnMut(InboundOrder) -> bool) -> Flow {
    let Some(io) = slot.as_mut() else { return Flow::Stop };
    let flow = io.turn(out);
    if matches!(flow, Flow::Stop) {
        slot.take();
    }
    flow
}

/// Orders admitted by the sessions, waiting for the turn's end to enter the tier.
struct Staged {
    orders: RefCell<Vec<InboundOrder>>,
    /// See [`IoSetup::staged_max`].
    max: usize,
    work: Arc<Notify>,
}

/// The hub's order entry: the staging buffer (a full one answers busy).
struct StagedEntry(Rc<Staged>);

impl OrderEntry for StagedEntry {
    fn try_submit(&mut self, request: InboundOrder) -> Result<(), Refused> {
        let mut orders = self.0.orders.borrow_mut();
        if orders.len() == self.0.max {
            return Err(Refused::Busy);
        }
        // The first staged order ends an idle wait; the rest ride on the same turn.
        if orders.is_empty() {
            self.0.work.notify_one();
        }
        orders.push(request);
        Ok(())
    }

    fn room_per_turn(&self) -> usize {
        self.0.max
    }
}

/// The loop's state on its thread.
pub(crate) struct IoLoop {
    /// Declared first so that the sessions' tasks go before the hub and the runtime (and the
    /// metrics and admin endpoint with them, `AdminAsked`).
    local: tokio::task::LocalSet,
    runtime: tokio::runtime::Runtime,
    hub: Rc<RefCell<Hub>>,
    staged: Rc<Staged>,
    replies: ReplyReceiver,
    work: Arc<Notify>,
    stop: Arc<AtomicBool>,
    /// When the stop request was seen (the drain's start).
    draining_since: Option<std::time::Instant>,
    /// An idle turn polls instead of waiting ([`Settings::busy_poll`]).
    busy_poll: bool,
}

impl IoLoop {
    fn build(setup: IoSetup, handoff: TierHandoff) -> Result<IoLoop, ServeError> {
        let TierHandoff { upstream, journals, layout } = handoff;
        let IoSetup {
            settings,
            credentials,
            journaled,
            listeners,
            replies,
            work,
            stop,
            staged_max,
            routed,
            resolutions,
            in_tier,
        } = setup;
        let busy_poll = settings.busy_poll;
        let orders = RefCell::new(Vec::new());
        let staged = Rc::new(Staged { orders, max: staged_max, work: work.clone() });
        let entry = Box::new(StagedEntry(staged.clone()));
        let verifier = crate::credentials::Verifier::start()?;
        let mut hub = Hub::new(settings, credentials, entry, verifier)?;
        if let Some(journals) = journals {
            let waits = hub.log().borrow_mut().wait_for_journals(journals);
            debug_assert!(waits, "a syncing store waits for the journals before its first commit");
        }
        if let Some(durable) = routed {
            hub.log().borrow_mut().routed.share(durable);
        }
        hub.set_layout(layout);
        if !journaled {
            hub.forget_open_orders();
        }
        staged.orders.borrow_mut().reserve_exact(staged.max);
        let runtime =
            tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let local = tokio::task::LocalSet::new();
        let hub = Rc::new(RefCell::new(hub));
        let (native, fix, metrics) = listeners;
        serve_endpoint(metrics, &hub, upstream, &work, &local)?;
        local.spawn_local(start_tasks(hub.clone(), (native, fix), in_tier));
        if let Some(resolutions) = resolutions {
            local.spawn_local(answer_resolutions(hub.clone(), resolutions));
        }
        let draining_since = None;
        Ok(IoLoop { local, runtime, hub, staged, replies, work, stop, draining_since, busy_poll })
    }

    /// One turn: route the queued replies, run the sessions' ready work (waiting for some
    /// when there is none), emit the orders admitted meanwhile.
    fn turn(&mut self, out: &mut dyn FnMut(InboundOrder) -> bool) -> Flow {
        let routed = self.route_replies();
        // Acquire: pairs with the Release in `Running::shutdown`.
        if self.stop.load(Ordering::Acquire) && self.drained() {
            return Flow::Stop;
        }
        let idle = routed == 0 && self.staged.orders.borrow().is_empty();
        if idle && !self.busy_poll {
            let work = &self.work;
            // The timer is made inside the runtime (it needs its clock).
            self.local.block_on(&self.runtime, async {
                let _ = tokio::time::timeout(IDLE_WAIT_MAX, work.notified()).await;
            });
        } else {
            // A yield makes the runtime poll its sockets without waiting (epoll_wait with no
            // timeout) before it runs the tasks again.
            self.local.block_on(&self.runtime, tokio::task::yield_now());
        }
        let mut staged = self.staged.orders.borrow_mut();
        let taken = staged.iter().take_while(|order| out(**order)).count();
        staged.drain(..taken);
        drop(staged);
        self.hub.borrow_mut().next_turn();
        Flow::Continue
    }

    /// A stopping server: refuses new requests (from the first call on), and says whether
    /// every request taken is answered, synced and written, or [`DRAIN_TIMEOUT`] passed.
    fn drained(&mut self) -> bool {
        let hub = &self.hub;
        let since = *self.draining_since.get_or_insert_with(|| {
            hub.borrow_mut().start_draining();
            tracing::info!("stopping: new orders are refused, those taken are answered");
            std::time::Instant::now()
        });
        let hub = self.hub.borrow();
        hub.log().borrow_mut().commit_if_holding();
        let drained = hub.drained() && self.staged.orders.borrow().is_empty();
        let waited = since.elapsed();
        if !drained && waited < DRAIN_TIMEOUT {
            return false;
        }
        let (taken, answered) = hub.taken_and_answered();
        let waited_ms = waited.as_millis() as u64;
        tracing::info!(drained, answered, taken, waited_ms, "stopped serving");
        true
    }

    /// Routes what the R-Senders queued to the sessions and commits the store's batch.
    fn route_replies(&mut self) -> usize {
        let mut hub = self.hub.borrow_mut();
        let routed = self.replies.read(ROUTE_BATCH_MAX, |output| hub.route(output));
        hub.set_reply_depth(self.replies.pending());
        if routed > 0 {
            hub.commit();
        }
        hub.compact_store_if_due();
        routed
    }
}

/// Starts the listeners' tasks, the store's release task and the in-tier histogram's.
async fn start_tasks(
    hub: Rc<RefCell<Hub>>,
    (native, fix): (std::net::TcpListener, Option<std::net::TcpListener>),
    in_tier: tokio::sync::mpsc::UnboundedReceiver<InTierRequest>,
) {
    // One admission for both listeners: the bounds count every connection of the server.
    let admission = Rc::new(RefCell::new(Admission::default()));
    let native = TcpListener::from_std(native).expect("tokio listener");
    tokio::task::spawn_local(accept_loop(hub.clone(), admission.clone(), native, false));
    if let Some(fix) = fix {
        let fix = TcpListener::from_std(fix).expect("tokio listener");
        tokio::task::spawn_local(accept_loop(hub.clone(), admission, fix, true));
    }
    cancel_recovered_orders(&hub);
    let synced = hub.borrow().log().borrow().synced_notify();
    if let Some(synced) = synced {
        tokio::task::spawn_local(release_loop(hub.clone(), synced));
    }
    tokio::task::spawn_local(answer_in_tier(hub, in_tier));
}

/// Starts the metrics and admin endpoint on `listener` (none without one), ready from now on,
/// and the loop's task that answers its asks (`work` wakes the loop for them).
fn serve_endpoint(
    listener: Option<std::net::TcpListener>,
    hub: &Rc<RefCell<Hub>>,
    upstream: Upstream,
    work: &Arc<Notify>,
    local: &tokio::task::LocalSet,
) -> Result<(), ServeError> {
    let Some(listener) = listener else { return Ok(()) };
    let (asks, asked) = tokio::sync::mpsc::channel(HTTP_CONNECTIONS_MAX);
    let (settings, ready) = (hub.borrow().settings().clone(), hub.borrow().readiness().clone());
    let setup = EndpointSetup {
        metrics_token: settings.metrics_token,
        admin_token: settings.admin_token,
        loop_asks: LoopAsks { asks, work: work.clone() },
        ready: ready.clone(),
        reachable: upstream.reachable.clone(),
    };
    let listening = crate::admin::serve(listener, setup).map_err(ServeError::Metrics)?;
    let asked = AdminAsked { asks: asked, _listening: listening };
    local.spawn_local(answer_admin(hub.clone(), upstream, asked));
    ready.set(true);
    Ok(())
}

/// The loop's end of the admin endpoint, dropped with the loop's tasks: first the asks
/// (an ask waiting for its answer gets none at once), then the endpoint (its thread is
/// stopped and joined).
struct AdminAsked {
    asks: tokio::sync::mpsc::Receiver<AdminAsk>,
    _listening: ops::endpoint::Listening,
}

/// Answers the admin endpoint's asks on the loop's thread: a copy of the page's counters, or
/// an external event handed on.
async fn answer_admin(hub: Rc<RefCell<Hub>>, mut upstream: Upstream, mut asked: AdminAsked) {
    while let Some(ask) = asked.asks.recv().await {
        match ask {
            AdminAsk::Snapshot(reply) => {
                let _ = reply.send(hub.borrow().metrics_snapshot());
            }
            AdminAsk::Event(event, reply) => {
                let sent = upstream.events.send(event).map(|()| upstream.events.destination());
                if let Ok(to) = sent {
                    tracing::info!(?event, "admin: external event sent to {to}");
                }
                let _ = reply.send(sent);
            }
        }
    }
}

/// Hands the in-tier histogram to whoever asks, starting a fresh one.
async fn answer_in_tier(
    hub: Rc<RefCell<Hub>>,
    mut requests: tokio::sync::mpsc::UnboundedReceiver<InTierRequest>,
) {
    while let Some(reply) = requests.recv().await {
        let taken = hub.borrow_mut().take_in_tier_latency();
        let _ = reply.send(taken);
    }
}

/// Counts what the input log said of appends given up unacknowledged, answers the orders it
/// does not hold, and commits the store's batch of those answers.
async fn answer_resolutions(
    hub: Rc<RefCell<Hub>>,
    mut resolutions: tokio::sync::mpsc::UnboundedReceiver<Resolution>,
) {
    while let Some(first) = resolutions.recv().await {
        let mut hub = hub.borrow_mut();
        hub.resolved(&first);
        while let Ok(next) = resolutions.try_recv() {
            hub.resolved(&next);
        }
        hub.commit();
    }
}

/// Orders in the recovered books belong to sessions the restart ended: cancel-on-disconnect
/// applies to them as to any dropped session, from the start.
fn cancel_recovered_orders(hub: &Rc<RefCell<Hub>>) {
    let Some(grace) = hub.borrow().settings().cancel_on_disconnect else { return };
    let waiting = hub.borrow().with_open_orders();
    for (at, generation) in waiting {
        crate::session::cancel_after_grace(hub, at, generation, grace);
    }
}

/// Sends what the store's syncer has just made durable.
async fn release_loop(hub: Rc<RefCell<Hub>>, synced: std::sync::Arc<Notify>) {
    loop {
        synced.notified().await;
        hub.borrow().log().borrow_mut().release();
    }
}

async fn accept_loop(
    hub: Rc<RefCell<Hub>>,
    admission: Rc<RefCell<Admission>>,
    listener: TcpListener,
    fix: bool,
) {
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
        let Ok(ticket) = Admission::admit(&admission, peer.ip()) else { continue };
        // Without it, Nagle holds each small report until the previous one is acknowledged:
        // tens of ms at low rates, where the peer's delayed ACK has nothing to ride on.
        let _ = stream.set_nodelay(true);
        let hub = hub.clone();
        let tls = hub.borrow().settings().tls.clone();
        tokio::task::spawn_local(async move {
            let Some(tls) = tls else { return serve_session(hub, stream, ticket, fix).await };
            let timeout = hub.borrow().settings().logon_timeout;
            match tls.accept(stream, timeout).await {
                Ok(mut stream) => {
                    serve_session(hub, &mut stream, ticket, fix).await;
                    // close_notify: without it a TLS peer cannot tell the end from a cut.
                    let _ = tokio::time::timeout(TLS_CLOSE_TIMEOUT, stream.shutdown()).await;
                }
                // No session began: a client with the wrong CA, no certificate (mutual TLS) or
                // plain TCP on a TLS port gets the TLS alert and the close, nothing more.
                Err(reason) => tracing::warn!(%peer, fix, reason, "TLS handshake failed"),
            }
        });
    }
}

/// One session on its stream: a plain `TcpStream` or a TLS stream ([`crate::tls`]).
async fn serve_session(
    hub: Rc<RefCell<Hub>>,
    stream: impl crate::session::Stream,
    ticket: crate::admission::Ticket,
    fix: bool,
) {
    if fix {
        fix_server::serve(hub, stream, ticket).await;
    } else {
        native_server::serve(hub, stream, ticket).await;
    }
}
