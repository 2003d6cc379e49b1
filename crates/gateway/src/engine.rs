//! The tier binding: the exchange's pre-process checks and matching core run on the requests
//! the sessions push into a `pipeline` ring, and each execution report goes to the gateway's
//! router, which routes it to the owning session. The step runs where the serve layout puts it
//! ([`crate::layout`]): on a thread of its own, reports handed back over a second ring, or
//! inline on the I/O thread, reports handed straight to the router.
//!
//! The interface is narrow on purpose: [`InboundOrder`] in, [`CoreOutput`] (client audience
//! only) out. Order ids are `client << 32 | token`, so a report names its owner and the
//! client's own order number without any lookup.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;

use exchange::core::CoreLimits;
use exchange::durability::{
    JournalMode, JournalOptions, OpenedShard, SNAPSHOT_EVERY_RECORDS_DEFAULT, ShardJournals,
    ShardRecord, ShardRecovery, ShardSnapshotter, ShardState, open_shards,
};
use exchange::master::MasterData;
use exchange::msg::{ClientId, CoreOutput, InboundOrder, OrderId, OutputKind, SequencedInput};
use exchange::preprocess::check_against;
use journal::{DurableSeq, JournalSender, JournalWriter};
use pipeline::WaitStrategy;
use pipeline::metrics::now_ns;
use pipeline::placement::CpuId;
use pipeline::ring::{self, BatchError, Consumer, Producer, RingConfig};
use tokio::sync::Notify;

/// Requests the engine reads per batch before it wakes the router (engine thread) or routes
/// their reports (inline).
const ENGINE_BATCH_MAX: usize = 256;

/// The tier order id of a client's order number.
pub fn order_id(client: ClientId, token: u32) -> OrderId {
    (u64::from(client) << 32) | u64::from(token)
}

/// The client order number inside a tier order id.
pub fn token_of(order_id: OrderId) -> u32 {
    order_id as u32
}

/// Where the engine step runs (see [`crate::layout`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// On the I/O thread, which calls [`Engine::step`] after each unit of work.
    Inline,
    /// On the `gateway-engine` thread, pinned to this CPU and spinning on the ingress ring.
    SpinOn(CpuId),
    /// On the `gateway-engine` thread, parking when the ingress ring stays empty.
    Parked,
}

/// The gateway's ends of the engine.
pub struct EngineLink {
    /// Where sessions push requests; `Full` means the tier is busy.
    pub ingress: Producer<InboundOrder>,
    /// Execution reports published by another thread, in the core's order (with the journal
    /// on: once their input is durable): the engine thread's, or the release thread's.
    /// `None` inline without the journal: [`Engine::step`] hands reports over directly.
    pub egress: Option<Consumer<CoreOutput>>,
    /// Notified after reports are published on `egress`.
    pub reports_ready: Arc<Notify>,
    /// The engine thread, which also stops the journal; its result is the journal's.
    pub thread: Option<JoinHandle<Result<(), String>>>,
    /// The engine for the I/O thread to step (inline).
    pub inline: Option<Box<Engine>>,
    /// What the journal recovered (`None` with the journal off).
    pub recovery: Option<ShardRecovery>,
    /// Requests the engine has taken off the ingress ring (added after each batch).
    pub taken: Arc<AtomicU64>,
}

/// The engine's input journal (`exchange serve --journal`).
#[derive(Clone, Debug)]
pub struct EngineJournal {
    /// `off` (the default), or a journal policy (`group`: group commit on the journal's
    /// writer thread).
    pub mode: JournalMode,
    /// The journal's directory (unused with the journal off).
    pub dir: PathBuf,
}

impl Default for EngineJournal {
    fn default() -> Self {
        EngineJournal { mode: JournalMode::OFF, dir: PathBuf::new() }
    }
}

/// Where the engine's reports go.
enum Sink {
    /// A ring to another thread (the router or the release thread); a push waits while it is
    /// full, which only the engine thread may do: that other thread drains it meanwhile.
    Ring(Producer<CoreOutput>),
    /// Kept for the caller of [`Engine::step`] (inline, journal off). Its capacity stays
    /// from one step to the next, so steady state allocates nothing.
    Local(Vec<CoreOutput>),
    /// Inline with the journal: the ring to the release thread, never waited on. The I/O
    /// thread must not block there: the release thread may itself be waiting for the router,
    /// which is the I/O thread. What does not fit waits in `backlog` (one step's reports at
    /// most: the engine takes no request while it holds any), retried at the next step.
    Held { ring: Producer<CoreOutput>, backlog: VecDeque<CoreOutput> },
}

impl Sink {
    fn push(&mut self, output: &CoreOutput) {
        match self {
            // Err only when the router is gone (shutdown); nothing is left to answer.
            Sink::Ring(ring) => drop(ring.push_batch(std::slice::from_ref(output))),
            Sink::Local(reports) => reports.push(*output),
            Sink::Held { backlog, .. } => backlog.push_back(*output),
        }
    }

    /// Moves what the backlog holds into the release thread's ring, as far as it has room;
    /// whether the backlog is empty now.
    fn flush(&mut self) -> bool {
        let Sink::Held { ring, backlog } = self else { return true };
        while let Some(output) = backlog.front() {
            match ring.try_write_batch(1, |_, slot| *slot = *output) {
                Ok(()) => drop(backlog.pop_front()),
                Err(BatchError::Full) => return false,
                // The release thread is gone (shutdown): nothing is left to answer.
                Err(BatchError::Disconnected | BatchError::TooLarge { .. }) => backlog.clear(),
            }
        }
        true
    }
}

/// The engine step's state: the checks' master data, the books, the journal's sender, and
/// the threads to join when it stops.
pub struct Engine {
    requests: Consumer<InboundOrder>,
    reports: Sink,
    master: MasterData,
    state: ShardState,
    seq: u64,
    journal: Option<JournalSender<ShardRecord>>,
    taken: Arc<AtomicU64>,
    writer: Option<JournalWriter>,
    snapshots: Option<ShardSnapshotter>,
    release: Option<JoinHandle<()>>,
    _journals: ShardJournals,
}

impl Engine {
    /// Processes the requests waiting on the ingress ring (at most one batch, 256),
    /// then hands `route` the reports kept locally (inline, journal off; with a ring sink the
    /// reports are on their way already). Never waits; returns how many requests it took.
    pub fn step(&mut self, mut route: impl FnMut(&CoreOutput)) -> usize {
        if !self.reports.flush() {
            return 0; // the release thread's ring is full: requests wait on the ingress ring
        }
        let taken = self.read(false).unwrap_or(0);
        if let Sink::Local(reports) = &mut self.reports {
            reports.iter().for_each(&mut route);
            reports.clear();
        }
        self.reports.flush();
        taken
    }

    /// Reads a batch of requests through the step: what waits now, or with `wait` at least
    /// one (the ring's strategy: spin, or spin briefly and park). `None` once the ingress
    /// producer is gone and the ring drained.
    fn read(&mut self, wait: bool) -> Option<usize> {
        let Engine { requests, reports, master, state, seq, journal, .. } = self;
        let mut handle = |request: &InboundOrder| {
            let mut step = Step { master, seq: &mut *seq, journal: journal.as_mut() };
            step.process(state, request, reports);
        };
        let taken = if wait {
            requests.wait_read_batch(ENGINE_BATCH_MAX, &mut handle).ok()?
        } else {
            requests.read_batch(ENGINE_BATCH_MAX, &mut handle)
        };
        // Relaxed: a statistic for the metrics; nothing is published through it.
        self.taken.fetch_add(taken as u64, Ordering::Relaxed);
        Some(taken)
    }

    /// The engine thread: steps as requests arrive, until the ingress producer is gone.
    fn run(mut self, spin_on: Option<CpuId>, wake: Option<Arc<Notify>>) -> Result<(), String> {
        if let Some(cpu) = spin_on
            && let Err(error) = pipeline::placement::pin_current_thread(&[cpu])
        {
            tracing::warn!(%error, cpu, "engine thread not pinned; it spins unpinned");
        }
        while self.read(true).is_some() {
            if let Some(wake) = &wake {
                wake.notify_one();
            }
        }
        self.finish()
    }

    /// Stops the journal (its writer drains and syncs once the sender is gone), the snapshot
    /// follower and the release thread; the result is the journal's.
    pub fn finish(self) -> Result<(), String> {
        let Engine { journal, reports, writer, snapshots, release, _journals, .. } = self;
        drop((journal, reports));
        let written = writer.map(|w| w.join().map(|_| ()).map_err(|e| e.to_string()));
        let snapped = snapshots.map(|s| s.finish().map(|_| ()));
        if let Some(release) = release {
            let _ = release.join();
        }
        drop(_journals);
        written.unwrap_or(Ok(())).and(snapped.unwrap_or(Ok(())))
    }
}
/// Opens the engine over `master` (a fixed snapshot: `serve` has no master-data feed) and
/// places its step. With the journal on, the book state is first recovered from
/// `journal.dir`, every sequenced input is journaled (group commit, off the engine's thread)
/// before the core processes it, and a release thread passes each report on only once the
/// journal has its input on disk — the tier's durable replies (`exchange::durability`),
/// reused. Inline, that release thread stays: it is what waits for the disk, so the I/O
/// thread never does.
pub fn start(
    master: MasterData,
    limits: CoreLimits,
    ring_config: &RingConfig,
    journal: &EngineJournal,
    placement: Placement,
) -> anyhow::Result<EngineLink> {
    let data_dir = journal.mode.policy().map(|_| journal.dir.clone());
    let options = JournalOptions { data_dir, ..JournalOptions::default() };
    let listings = master.listings();
    let mut journals =
        open_shards(journal.mode, &options, SNAPSHOT_EVERY_RECORDS_DEFAULT, 1, &listings, limits)?;
    let durable = journals.durables.pop().flatten();
    let shard = journals.shards.pop().expect("one shard opened");
    let recovery = shard.writer.as_ref().map(|_| shard.recovery.clone());
    // A spinning engine waits on the ingress ring by spinning (so the I/O thread's push pays
    // no wake-up); otherwise the ring's configured strategy.
    let ingress_config = match placement {
        Placement::SpinOn(_) => RingConfig { wait: WaitStrategy::BusySpin, ..*ring_config },
        Placement::Inline | Placement::Parked => *ring_config,
    };
    let (ingress, requests) = ring::spsc::<InboundOrder>(&ingress_config)?;
    let reports_ready = Arc::new(Notify::new());
    let (reports, egress, release) = match (durable, placement) {
        (Some(durable), _) => {
            let (held, to_release) = ring::spsc::<CoreOutput>(ring_config)?;
            let (reports, egress) = ring::spsc::<CoreOutput>(ring_config)?;
            let release = spawn_release(to_release, reports, durable, reports_ready.clone());
            let sink = match placement {
                Placement::Inline => Sink::Held { ring: held, backlog: VecDeque::new() },
                Placement::SpinOn(_) | Placement::Parked => Sink::Ring(held),
            };
            (sink, Some(egress), Some(release))
        }
        (None, Placement::Inline) => {
            (Sink::Local(Vec::with_capacity(ENGINE_BATCH_MAX)), None, None)
        }
        (None, Placement::SpinOn(_) | Placement::Parked) => {
            let (reports, egress) = ring::spsc::<CoreOutput>(ring_config)?;
            (Sink::Ring(reports), Some(egress), None)
        }
    };
    let wake = (release.is_none()).then(|| reports_ready.clone());
    let taken = Arc::new(AtomicU64::new(0));
    let OpenedShard { state, last_seq, sender, writer, snapshots, .. } = shard;
    let engine = Box::new(Engine {
        requests,
        reports,
        master,
        state,
        seq: last_seq,
        journal: sender,
        taken: taken.clone(),
        writer,
        snapshots,
        release,
        _journals: journals,
    });
    let (thread, inline) = match placement {
        Placement::Inline => (None, Some(engine)),
        Placement::SpinOn(_) | Placement::Parked => {
            let spin_on = match placement {
                Placement::SpinOn(cpu) => Some(cpu),
                _ => None,
            };
            let thread = std::thread::Builder::new()
                .name("gateway-engine".into())
                .spawn(move || Engine::run(*engine, spin_on, wake))
                .expect("spawning the engine thread");
            (Some(thread), None)
        }
    };
    Ok(EngineLink { ingress, egress, reports_ready, thread, inline, recovery, taken })
}

/// Passes reports on once the journal covers their input (in order: a report waits for the
/// ones before it, as the tier's R-Processor holds replies). Reports of no input (pre-process
/// rejects, `seq` 0) wait only for those before them.
fn spawn_release(
    mut held: Consumer<CoreOutput>,
    mut egress: Producer<CoreOutput>,
    durable: Arc<DurableSeq>,
    wake: Arc<Notify>,
) -> JoinHandle<()> {
    std::thread::Builder::new()
        .name("gateway-release".into())
        .spawn(move || {
            let mut failed = false;
            let mut pass = |output: &CoreOutput| {
                if failed || durable.wait_for(output.seq, WaitStrategy::default()).is_err() {
                    // The journal stopped: no report whose input may be lost is ever sent.
                    if !failed {
                        tracing::error!("engine journal failed; holding every report from now on");
                    }
                    failed = true;
                    return;
                }
                // Err only when the router is gone (shutdown).
                let _ = egress.push_batch(std::slice::from_ref(output));
            };
            while held.wait_read_batch(ENGINE_BATCH_MAX, &mut pass).is_ok() {
                wake.notify_one();
            }
        })
        .expect("spawning the release thread")
}

/// One request through the pre-process checks, the journal and the core.
struct Step<'a> {
    master: &'a MasterData,
    seq: &'a mut u64,
    journal: Option<&'a mut JournalSender<ShardRecord>>,
}

impl Step<'_> {
    fn process(&mut self, state: &mut ShardState, request: &InboundOrder, reports: &mut Sink) {
        let mut send = |output: &CoreOutput| {
            if matches!(output.kind, OutputKind::Trade | OutputKind::TopOfBook) {
                return; // market data: no subscriber in `serve`
            }
            let mut output = *output;
            output.stamps.ready_ns = now_ns();
            reports.push(&output);
        };
        let mut request = *request;
        request.stamps.core_in_ns = now_ns();
        let request = &request;
        match check_against(self.master, request) {
            Ok(routed) => {
                *self.seq += 1;
                let input = SequencedInput {
                    seq: *self.seq,
                    instrument: routed.instrument,
                    command: routed.command,
                    stamps: request.stamps,
                };
                if let Some(journal) = self.journal.as_mut()
                    && journal.append(ShardRecord(input)).is_err()
                {
                    // The writer stopped (and logged why); the release thread holds every
                    // report from here on, so the input is processed but never acknowledged.
                    self.journal = None;
                }
                state.process(&input, &mut send);
            }
            Err(reason) => send(&CoreOutput {
                kind: OutputKind::Rejected,
                reason,
                side: exchange::msg::Side::from_code(request.side).unwrap_or_default(),
                instrument: request.instrument,
                client: request.client,
                order_id: request.order_id,
                price: request.price,
                stamps: request.stamps,
                ..CoreOutput::default()
            }),
        }
    }
}
