//! `exchange serve --role gateway`: the sessions (native and FIX) without a tier, for a
//! gateway on a host of its own (docs/REPLICATION.md).
//!
//! ```text
//!  sessions ─▶ I/O loop ─▶ append queue ─▶ appender ──JetStream──▶ shard streams ─▶ engines
//!     ▲                                                                          │
//!     └── reply queue ◀── report forwarders ◀── delivery edges ◀──NATS (per shard)───┘
//! ```
//!
//! The I/O loop is the one `exchange serve` runs (`crate::io`), on a thread of its own: it
//! hands each admitted order to the append queue (a full queue leaves orders staged, and a
//! full stage answers busy). The appender queues the orders on their shards' streams in
//! admission order, those of one shard that arrived together as one message (no wait for
//! more), under a message id (this gateway, this run, a counter) that JetStream deduplicates
//! when a lost acknowledgement makes it append again. Reports come back through
//! one in-process delivery edge per shard and outlet (`delivery::edge`: per-subject
//! sequences, gap recovery from the leader's retained window, the trust rule), read in process
//! (`RunningEdge::attach`: no socket between them) and handed to the sessions' reply queue
//! as the tier's R-Senders would.
//!
//! An append unacknowledged for the whole retry window (its outcome unknown: a copy may have
//! landed, or may still land) goes to the resolver, which asks the log
//! (`OrderLog::find_appends`) once it answers again, with backoff: found, the engines answer
//! its orders; absent, each order's client gets a `NotLogged` reject through the hub.

use std::collections::VecDeque;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use delivery::clock::EpochOffset;
use delivery::edge::{EdgeOptions, FIRST_SEQ_HEARD, InProcessConsumer, RunningEdge};
use delivery::entropy::{Entropy, OsEntropy};
use delivery::nats::NatsConnect;
use delivery::wire::{Frame, FrameDecoder, Record, Stream};
use exchange::msg::{Audience, CoreOutput, InboundOrder, Response};
use exchange::tier::{Subscriber, reply_subscribers};
use futures_util::{FutureExt, StreamExt};
use replication::ReplicationError;
use replication::append::{AppendId, AppendOutcome, Appended, OrderLog, Unacknowledged};
use replication::layout::LogSettings;
use replication::record::RECORDS_PER_MESSAGE_MAX;
use tokio::sync::Notify;

use crate::credentials::Credential;
use crate::delivered::DeliveredMark;
use crate::hub::Resolution;
use crate::io::{EventSink, IoSetup, STAGED_ORDERS_MAX, TierHandoff, Upstream};
use crate::metrics::LayoutInfo;
use crate::routed::DurableInputs;
use crate::server::{BoundAddresses, ServeError, bind_listeners};
use crate::settings::Settings;

/// Orders between the I/O loop and the appender.
pub const APPEND_QUEUE_SLOTS: usize = 8192;
/// Appends (log messages) awaiting their acknowledgement at once; beyond, the appender waits
/// (and the queue, then the stage, fill: the sessions are answered busy).
pub const APPENDS_IN_FLIGHT_MAX: usize = 4096;
/// Most orders the appender takes off its queue at once (then split into one message per
/// shard).
const BATCH_ORDERS_MAX: usize = 256;
/// First pause before the resolver asks the log again after it could not answer; it doubles
/// up to [`RESOLVE_PAUSE_MAX`].
const RESOLVE_PAUSE_FIRST: std::time::Duration = std::time::Duration::from_millis(250);
const RESOLVE_PAUSE_MAX: std::time::Duration = std::time::Duration::from_secs(10);
/// How often `/ready` follows the NATS connection.
const READINESS_POLL: std::time::Duration = std::time::Duration::from_millis(250);

/// What a gateway without a tier runs.
pub struct RemoteOptions {
    /// The native, FIX and metrics listeners' addresses.
    pub addresses: BoundAddresses,
    /// The sessions' settings (instruments and clients as the engines have them).
    pub settings: Settings,
    /// Who may log in.
    pub credentials: Vec<Credential>,
    /// The NATS servers (a cluster's URLs comma-separated).
    pub nats: NatsConnect,
    /// The input log's layout (as the engines have it).
    pub log: LogSettings,
    /// The engines' `tier.outlets`: the report subjects per shard.
    pub tier_outlets: u32,
    /// This gateway's id in every append's message id.
    pub gateway_id: u32,
}

/// What the appender did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AppendTally {
    /// Orders acknowledged by their stream.
    pub appended: u64,
    /// Appends JetStream recognised as retries of one already stored.
    pub duplicates: u64,
    /// Orders whose append went unacknowledged for the whole retry window (handed to the
    /// resolver, which asks the log whether they landed).
    pub failed: u64,
}

/// A running gateway without a tier.
pub struct RunningRemote {
    /// The bound addresses: native, FIX, metrics.
    pub addresses: BoundAddresses,
    stop: Arc<AtomicBool>,
    work: Arc<Notify>,
    io: Option<std::thread::JoinHandle<()>>,
    appender: Option<tokio::task::JoinHandle<AppendTally>>,
    edges: Vec<RunningEdge>,
    runtime: tokio::runtime::Runtime,
}

impl RunningRemote {
    /// Stops accepting, answers what the sessions took (as the engines report it), lets
    /// every append finish and stops the delivery edges.
    pub fn stop(mut self) -> AppendTally {
        // Release: the I/O loop that sees the flag drains and stops.
        self.stop.store(true, Ordering::Release);
        self.work.notify_one();
        if let Some(io) = self.io.take() {
            let _ = io.join();
        }
        let appender = self.appender.take().expect("a running gateway has its appender");
        let tally = self.runtime.block_on(appender).unwrap_or_default();
        for edge in std::mem::take(&mut self.edges) {
            let _ = self.runtime.block_on(edge.shutdown());
        }
        tracing::info!(?tally, "gateway stopped");
        tally
    }
}

/// Connects to NATS, opens the input log, starts the delivery edges and the report forwarders,
/// then the I/O loop; returns once the loop serves.
pub fn start(mut options: RemoteOptions) -> Result<RunningRemote, ServeError> {
    if options.settings.instruments.is_empty() {
        let universe = exchange::flow::UniverseConfig::default();
        options.settings.instruments = Arc::new(exchange::flow::reference_market(&universe).1);
    }
    let (listeners, addresses) = bind_listeners(options.addresses, &options.settings)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("gateway-nats")
        .enable_all()
        .build()
        .map_err(|e| remote_error("runtime", e))?;
    let client = runtime.block_on(delivery::nats::connect(&options.nats, "gateway"));
    let client = client.map_err(|e| remote_error("NATS", e))?;
    let log = runtime.block_on(OrderLog::open(client, options.log.clone()))?;
    let reachable = Arc::new(AtomicBool::new(true));
    runtime.spawn(follow_connection(log.clone(), reachable.clone()));
    let work = Arc::new(Notify::new());
    let wake = work.clone();
    let (subscribers, replies) = reply_subscribers(1, None, Arc::new(move || wake.notify_one()));
    let durable = DurableInputs::new(options.log.shards, options.tier_outlets);
    let mut edges = Vec::new();
    for (index, subject) in report_subjects(&options).enumerate() {
        let (edge, mark) = start_edge(&options, &runtime, subject)?;
        let resume = ResumePoint::new(subject, mark, durable.clone());
        runtime.spawn(forward_reports(edge.attach(), resume, subscribers(index)));
        edges.push(edge);
    }
    let (orders, queued) = tokio::sync::mpsc::channel(APPEND_QUEUE_SLOTS);
    let (unacknowledged, to_resolve) = tokio::sync::mpsc::unbounded_channel();
    let (resolved, resolutions) = tokio::sync::mpsc::unbounded_channel();
    runtime.spawn(resolve_appends(log.clone(), to_resolve, resolved));
    let appender = runtime.spawn(append_orders(log, queued, options.gateway_id, unacknowledged));
    let stop = Arc::new(AtomicBool::new(false));
    let (built, io_built) = std::sync::mpsc::sync_channel(1);
    let layout = LayoutInfo { groups: "gateway (JetStream input log)".into(), usable_cpus: 0 };
    let events = EventSink::Log(orders.clone());
    let upstream = Upstream { events, reachable: Some(reachable) };
    let handoff = TierHandoff { upstream, journals: None, layout };
    let setup = IoSetup {
        settings: options.settings,
        credentials: options.credentials,
        journaled: true, // the engines' books outlive this process
        listeners,
        replies,
        work: work.clone(),
        stop: stop.clone(),
        in_tier: tokio::sync::mpsc::unbounded_channel().1,
        staged_max: STAGED_ORDERS_MAX,
        routed: Some(durable),
        resolutions: Some(resolutions),
    };
    let io = std::thread::Builder::new()
        .name("gateway-io".into())
        .spawn(move || {
            let take = move |order| orders.try_send(order).is_ok();
            crate::io::run_loop((setup, handoff), built, take)
        })
        .map_err(|e| remote_error("I/O thread", e))?;
    match io_built.recv() {
        Ok(Ok(())) => {}
        Ok(Err(error)) => return Err(error),
        Err(_) => return Err(remote_error("I/O loop", "stopped before serving")),
    }
    let (io, appender) = (Some(io), Some(appender));
    Ok(RunningRemote { addresses, stop, work, io, appender, edges, runtime })
}

/// One in-process delivery edge of `shard`'s outlet `slot` (no listener: the reports go to
/// this process's sessions only), starting where this gateway's kept position says it left off.
fn start_edge(
    options: &RemoteOptions,
    runtime: &tokio::runtime::Runtime,
    (shard, slot): (u32, u32),
) -> Result<(RunningEdge, DeliveredMark), ServeError> {
    let mark = DeliveredMark::open(&options.settings.store_dir, shard, slot);
    let mark = mark.map_err(|e| remote_error("the delivered reports' position", e))?;
    if mark.first_seqs() != [delivery::edge::FIRST_SEQ_HEARD; 2] {
        let [reports, md] = mark.first_seqs();
        tracing::info!(
            "gateway: shard {shard} slot {slot} resumes at report {reports}, market data {md}"
        );
    }
    let gateway_options = EdgeOptions {
        nats: options.nats.clone(),
        prefix: options.log.publish_prefix(shard),
        listen: None,
        first_seqs: mark.first_seqs(),
        ..EdgeOptions::new("", slot, SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
    };
    let edge = runtime.block_on(delivery::edge::start(gateway_options));
    let edge = edge.map_err(|e| remote_error("delivery edge", format!("{e:#}")))?;
    Ok((edge, mark))
}

/// Keeps `reachable` equal to whether the log's connection is up (polled every
/// [`READINESS_POLL`]), logging each change once.
async fn follow_connection(log: OrderLog, reachable: Arc<AtomicBool>) {
    loop {
        let up = log.is_connected();
        // Relaxed: a status flag for `/ready`.
        if reachable.swap(up, Ordering::Relaxed) != up {
            match up {
                true => tracing::info!("gateway: NATS reachable again: ready"),
                false => tracing::warn!("gateway: NATS unreachable: not ready until it is back"),
            }
        }
        tokio::time::sleep(READINESS_POLL).await;
    }
}

fn remote_error(what: &str, why: impl std::fmt::Display) -> ServeError {
    ServeError::Remote(format!("{what}: {why}"))
}

/// Every (shard, outlet) whose report subjects this gateway reads.
fn report_subjects(options: &RemoteOptions) -> impl Iterator<Item = (u32, u32)> + use<> {
    let slots = options.tier_outlets;
    (0..options.log.shards).flat_map(move |shard| (0..slots).map(move |slot| (shard, slot)))
}

/// A gateway run's id (its appends' message ids carry it), drawn from `entropy`
/// (production: [`OsEntropy`]; `crates/sim`: its seeded generator).
pub fn new_run_id(entropy: &mut impl Entropy) -> u64 {
    entropy.next_u64()
}

/// Queues the orders on their streams in admission order, those of one shard that arrived
/// together as one message (up to `RECORDS_PER_MESSAGE_MAX`: no wait for more), counts
/// the acknowledgements and hands appends that went unacknowledged to `unacknowledged`.
async fn append_orders(
    log: OrderLog,
    mut queued: tokio::sync::mpsc::Receiver<InboundOrder>,
    gateway: u32,
    unacknowledged: Unresolved,
) -> AppendTally {
    // This run's id: a retry inside the run reuses its message id; a new run never collides.
    let run = new_run_id(&mut OsEntropy);
    let epoch = EpochOffset::measure().absolute(0);
    let (mut tally, mut seq) = (AppendTally::default(), 0u64);
    let mut in_flight = futures_util::stream::FuturesUnordered::new();
    let mut by_shard: Vec<Vec<(InboundOrder, u64)>> =
        (0..log.settings().shards).map(|_| Vec::with_capacity(RECORDS_PER_MESSAGE_MAX)).collect();
    loop {
        let room = in_flight.len() < APPENDS_IN_FLIGHT_MAX;
        tokio::select! {
            order = queued.recv(), if room => {
                let Some(order) = order else { break };
                let mut next = Some(order);
                let mut taken = 0;
                while let Some(order) = next {
                    let shard = log.settings().shard_of(order.instrument) as usize;
                    by_shard[shard].push((order, epoch + order.stamps.intended_ns));
                    taken += 1;
                    let full = by_shard[shard].len() == RECORDS_PER_MESSAGE_MAX;
                    next = if full || taken == BATCH_ORDERS_MAX { None } else { queued.try_recv().ok() };
                    if full {
                        break;
                    }
                }
                for (shard, orders) in by_shard.iter_mut().enumerate() {
                    if orders.is_empty() {
                        continue;
                    }
                    seq += 1;
                    let id = AppendId { gateway, run, seq };
                    // Queued before `push` borrows the set (its futures are `Send`, not `Sync`).
                    let acknowledged = log.start_append_batch(shard as u32, orders, id).await;
                    let held = orders.len() as u64;
                    in_flight.push(acknowledged.map(move |done| (held, done)));
                    orders.clear();
                }
            }
            Some((held, done)) = in_flight.next() => count(&mut tally, held, done, &unacknowledged),
        }
    }
    while let Some((held, done)) = in_flight.next().await {
        count(&mut tally, held, done, &unacknowledged);
    }
    tally
}

/// Where appends that went unacknowledged go to be resolved.
type Unresolved = tokio::sync::mpsc::UnboundedSender<Unacknowledged>;

/// Counts the `orders` of one message by how its append ended, and hands an unacknowledged
/// one to the resolver.
fn count(
    tally: &mut AppendTally,
    orders: u64,
    done: Result<Appended, ReplicationError>,
    unresolved: &Unresolved,
) {
    let error = match done {
        Ok(appended) if appended.duplicate => return tally.duplicates += orders,
        Ok(_) => return tally.appended += orders,
        Err(error) => error,
    };
    tally.failed += orders;
    // Logged when the count passes 1, 2, 4, ...: an outage is told, not flooded.
    let before = tally.failed - orders;
    if (before + 1).next_power_of_two() <= tally.failed {
        let failed = tally.failed;
        tracing::warn!(failed, "append unacknowledged, asking the log whether it landed: {error}");
    }
    match error {
        ReplicationError::NotAcknowledged(append) => {
            // Closed only when the runtime stops with the gateway.
            let _ = unresolved.send(*append);
        }
        other => tracing::error!("order not accepted by the log: {other}"),
    }
}

/// Asks the log, once it answers, whether each append that went unacknowledged landed (all
/// of a shard's pending appends in one search, again after a pause that doubles up to
/// [`RESOLVE_PAUSE_MAX`] while the log cannot answer), logs each outcome once and hands it to
/// the hub: landed, the engines answer; absent, the hub answers each order with a reject.
async fn resolve_appends(
    log: OrderLog,
    mut unacknowledged: tokio::sync::mpsc::UnboundedReceiver<Unacknowledged>,
    resolved: tokio::sync::mpsc::UnboundedSender<Resolution>,
) {
    let mut pending: Vec<Vec<Unacknowledged>> =
        (0..log.settings().shards).map(|_| Vec::new()).collect();
    let mut pause = RESOLVE_PAUSE_FIRST;
    loop {
        if pending.iter().all(Vec::is_empty) {
            let Some(append) = unacknowledged.recv().await else { return };
            pending[append.shard as usize].push(append);
        }
        while let Ok(append) = unacknowledged.try_recv() {
            pending[append.shard as usize].push(append);
        }
        let mut unanswered = false;
        for (shard, appends) in pending.iter_mut().enumerate().filter(|(_, a)| !a.is_empty()) {
            match log.find_appends(shard as u32, appends).await {
                Ok(outcomes) => {
                    for (append, outcome) in appends.drain(..).zip(outcomes) {
                        hand_on(&append, outcome, &resolved);
                    }
                }
                Err(error) => {
                    unanswered = true;
                    let (waiting, again) = (appends.len(), pause);
                    tracing::warn!(
                        shard,
                        waiting,
                        "the log cannot tell yet ({error}): again in {again:?}"
                    );
                }
            }
        }
        if unanswered {
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(RESOLVE_PAUSE_MAX);
        } else {
            pause = RESOLVE_PAUSE_FIRST;
        }
    }
}

/// Logs one append's outcome and hands it to the hub.
fn hand_on(
    append: &Unacknowledged,
    outcome: AppendOutcome,
    resolved: &tokio::sync::mpsc::UnboundedSender<Resolution>,
) {
    let (id, shard, orders) = (&append.id, append.shard, append.orders().count() as u64);
    // The hub is gone only when the gateway stops.
    let _ = match outcome {
        AppendOutcome::Landed(seq) => {
            tracing::info!(
                shard,
                orders,
                "append {id} landed late at {seq}: the engines answer it"
            );
            resolved.send(Resolution::LandedLate { orders })
        }
        AppendOutcome::Absent => {
            tracing::warn!(shard, orders, "append {id} is not in the log: its orders are rejected");
            append.orders().try_for_each(|order| resolved.send(Resolution::NotTaken(order)))
        }
        AppendOutcome::Unknown => {
            tracing::error!(
                shard,
                orders,
                "append {id}: the log can no longer tell whether it landed (trimmed past it, or \
                 beyond the search's bound): its clients get no answer"
            );
            resolved.send(Resolution::Unknown { orders })
        }
    };
}

/// Boundaries between inputs kept while their positions are not yet durable; beyond, the
/// oldest are dropped (the kept start then stays further back: safe, only more to re-read).
const INPUT_BOUNDARIES_MAX: usize = 1 << 16;
/// Least time between two writes of a kept start: it is a hint kept behind the store, so a
/// staler one costs a restart only a longer re-read, while a write per NATS batch cost a
/// system call per batch at high rates.
const RESUME_WRITE_INTERVAL: std::time::Duration = std::time::Duration::from_millis(50);

/// Where a restarted gateway's delivery edge starts reading one (shard, slot)'s reports: the first
/// report of the newest input whose routed position the store made durable (`crate::routed`).
struct ResumePoint {
    subject: (u32, u32),
    mark: DeliveredMark,
    durable: Arc<DurableInputs>,
    /// (input, stream sequence of its first report) of the inputs handed on, oldest first.
    boundaries: VecDeque<(u64, u64)>,
    /// The input of the last report handed on.
    input_seq: u64,
    /// When the kept start was last written.
    written_at: std::time::Instant,
}

impl ResumePoint {
    fn new(subject: (u32, u32), mark: DeliveredMark, durable: Arc<DurableInputs>) -> Self {
        let written_at = std::time::Instant::now();
        ResumePoint {
            subject,
            mark,
            durable,
            boundaries: VecDeque::new(),
            input_seq: 0,
            written_at,
        }
    }

    fn handed_on(&mut self, stream: Stream, seq: u64, record: Option<&Record>) {
        match (stream, record.map(Record::output_seq)) {
            (Stream::Reports, Some(input)) if input != 0 && input != self.input_seq => {
                if self.mark.first_seqs()[Stream::Reports as usize] == FIRST_SEQ_HEARD {
                    // Nothing kept yet: a restart must at least come back to this run's first
                    // report (starting at the first sequence heard would skip what this run
                    // handed on but the store never made durable).
                    self.mark.keep_from(Stream::Reports, seq);
                    if let Err(error) = self.mark.write_if_moved() {
                        tracing::error!("gateway: keeping the reports' start: {error}");
                    }
                }
                if self.boundaries.len() == INPUT_BOUNDARIES_MAX {
                    self.boundaries.pop_front();
                }
                self.boundaries.push_back((input, seq));
                self.input_seq = input;
            }
            (Stream::Reports, _) => {}
            (Stream::MarketData, _) => self.mark.handed_on(stream, seq),
        }
    }

    /// Moves the kept start up to the newest input whose position is durable and writes it
    /// when it moved (at most once per [`RESUME_WRITE_INTERVAL`]).
    fn keep(&mut self) {
        if self.written_at.elapsed() < RESUME_WRITE_INTERVAL {
            return;
        }
        self.written_at = std::time::Instant::now();
        let durable = self.durable.get(self.subject.0, self.subject.1);
        while self.boundaries.get(1).is_some_and(|&(input, _)| input <= durable) {
            self.boundaries.pop_front();
        }
        if let Some(&(_, seq)) = self.boundaries.front().filter(|(input, _)| *input <= durable) {
            self.mark.keep_from(Stream::Reports, seq);
        }
        if let Err(error) = self.mark.write_if_moved() {
            tracing::error!("gateway: keeping the delivered reports' position: {error}");
        }
    }
}

/// Reads one delivery edge's frames (in process: no socket between them), hands each client
/// report to the sessions' reply queue, and after each chunk moves where a restart resumes
/// (`resume`): never past what the session store holds, so a restarted gateway neither skips
/// a report nor (the hub drops what it already routed) routes one twice.
async fn forward_reports(
    mut edge: InProcessConsumer,
    mut resume: ResumePoint,
    mut subscribers: Vec<Box<dyn Subscriber>>,
) {
    let epoch = EpochOffset::measure().absolute(0);
    let mut decoder = FrameDecoder::default();
    while let Some(chunk) = edge.next_chunk().await {
        decoder.extend(&chunk);
        while let Ok(Some(frame)) = decoder.next_frame() {
            match frame {
                Frame::Data { stream: Stream::Reports, seq, record, .. } => {
                    resume.handed_on(Stream::Reports, seq, Some(&record));
                    match response_of(&record, epoch) {
                        Some(response) => subscribers[0].deliver(&response),
                        None => tracing::warn!("gateway: a report with unknown codes dropped"),
                    }
                }
                Frame::Data { stream, seq, .. } => resume.handed_on(stream, seq, None),
                Frame::Resync { stream, first_seq, last_seq } => {
                    resume.handed_on(stream, last_seq, None);
                    tracing::error!(
                        "gateway: {} {first_seq}..={last_seq} lost beyond the engines' retained window",
                        stream.name()
                    )
                }
                Frame::Goodbye { .. } => return,
                Frame::Hello { .. } => {}
            }
        }
        resume.keep();
    }
    // A shutdown (or a cut-off, which the delivery edge itself warned about).
    tracing::debug!("gateway: delivery edge {:?} stopped handing reports on", resume.subject);
}

/// The client report a record carries, its intended time on this process's clock.
fn response_of(record: &Record, epoch_abs_ns: u64) -> Option<Response> {
    let mut output = CoreOutput::from_canonical(record.output_bytes().try_into().ok()?)?;
    output.shard = record.shard();
    output.stamps.intended_ns = record.intended_abs_ns().saturating_sub(epoch_abs_ns);
    Some(Response {
        audience: Audience::Client,
        outlet: record.outlet(),
        answers_request: record.answers_request(),
        output,
    })
}
