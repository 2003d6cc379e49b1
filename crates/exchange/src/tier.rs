//! The whole tier on the `pipeline` stage runtime, as a service: started from its own start
//! options ([`TierStart`]), fed by its holder's inputs ([`Tier::start`]) or by an order source
//! it runs ([`Tier::start_with_source`], handed what it needs when it starts: [`SourceStart`]),
//! answering through its subscribers. Load runs are not the tier's: the open-loop load
//! generator is an order source of the `experiments` crate (`experiments::tier_load`).
//!
//! ```text
//!  orders (intake or source) --by instrument-> preprocess (k) --by instrument--> core (s shards)
//!       |                                       (orders and refusals)             |
//!  event feed --> events --by instrument--------+---------------------> core      v
//!       |            \--------------------> masterdata <-- master feed    rprocess (1)
//!                                                                     --by outlet---> senders (N)
//!                                                                                     -> outlets
//! ```
//!
//! * Pre-process workers are fed by instrument, so one instrument's flow keeps its order. A
//!   request the pre-process refused travels on to its core shard as a [`Refusal`], which the
//!   shard answers with the reject unsequenced and unjournaled (it changes no book): its reject
//!   keeps its place among the outputs of the orders around it, so with one pre-process
//!   worker and one core shard every output follows the input's order (what a replicated
//!   engine needs to number its outputs as every replica does).
//! * The core stage routes by instrument as well (orders and control messages alike), so an
//!   instrument's orders and its halts/bands meet in one shard, in one sequence. Each shard
//!   worker is the sequencer of its fan-in: it stamps a gap-free `seq` on every input and
//!   hands the resulting [`SequencedInput`] to its [`crate::core::MatchingCore`]; that record
//!   is the journaling boundary (the shard's journal appends it before `process`, see
//!   [`crate::durability`]), and replaying the recorded records reproduces the shard's output
//!   hash.
//! * The R-Processor holds each reply until the shard journal's durable sequence covers its
//!   input (`group`, `sync`); the critical-path latency ends when the core emits the output,
//!   the durable reply latency when the sender delivers it.
//! * The master-data process is the single writer of the
//!   [`SnapshotCell`](crate::master::SnapshotCell); the external events process sends each
//!   event both to the core (as a control message) and to the master-data process (so the
//!   pre-process sees halts and bands early). With a journal, the master-data
//!   process journals each update write-ahead before publishing it (`MasterWorker`).
//! * Each shard's snapshot follower (`durability::ShardSnapshotter`) runs beside the journal
//!   writer, off the critical path; the run stops it after the writer, once it has caught up.
//! * Latency is measured from each request's intended send time to the delivery of its first
//!   response at the subscriber outlet, with per-stage splits from stamps in the messages.
//!
//! [`Tier::start`] reads as its steps: the layout planned ([`plan_layout`]), `recover` (the
//! journals and master data, or a fresh start), `graph::start` (the stages above, wired and
//! started); [`Tier::stop`]: the pipeline drains, `Durability::finish` stops the journal
//! writers and snapshot followers, and `Totals::collect` combines what each stage's workers
//! handed back when they finished ([`pipeline::stage::StageWorker::finish`], in `workers`).

mod choices;
mod graph;
pub mod layout;
mod planned;
mod replica;
mod replies;
mod service;
mod source;
mod workers;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::ExchangeError::BadInput;
use crate::error::{ExchangeError, Result, journal_failed};
use pipeline::metrics::now_ns;
use pipeline::placement::{CpuId, Role};
use pipeline::stage::StageSpec;
use pipeline::{ConnectorKind, WaitStrategy};

use journal::JournalWriter;
use journal::writer::WriterStats;

use crate::events::{Effect, ExternalEvent};
pub use choices::WaitChoice;
use graph::{ShardStart, StageStarts};
pub use layout::{GroupWait, LayoutChoice, ServiceTimes, TierLayout};
pub use planned::{
    CALIBRATION_DURATION, CALIBRATION_RATE_PER_S, Calibration, calibrate, measured_utilization,
    plan_layout,
};
pub use replica::TierReplica;
pub use replies::{ReplyReceiver, reply_subscribers};
pub use service::{Tier, TierControl, TierInputs, TierStart, TierStopped};
pub use source::{ORDER_SOURCE_STAGE, OrderSource, SourceFailed, SourceStart, SourceTurns};
use workers::{MasterWorker, SenderLatency};

use crate::core::{CoreCounters, CoreLimits};
use crate::durability::{
    JournalMode, JournalOptions, MasterRecovery, SNAPSHOT_EVERY_RECORDS_DEFAULT, ShardJournals,
    ShardRecovery, ShardSnapshotter, SnapshotReport, open_master, open_shards,
};
use crate::flow::{UniverseConfig, reference_master_data};
use crate::master::{MasterData, MasterUpdate};
use crate::msg::{
    Audience, ClientId, Command, CoreOutput, InboundOrder, InstrumentId, OrderId, OutputKind,
    Price, REASON_COUNT, Reason, Response, SequencedInput, Stamps,
};

/// Names of the per-stage latency splits, in path order.
pub const STAGE_SPLITS: [&str; 5] = ["preprocess", "core", "rprocess", "sender", "delivery"];
/// The per-stage splits are recorded for one in this many requests that reach the core (a
/// fixed stride, so no request's latency decides whether it is sampled): five histogram
/// records on every request were a twentieth of the critical thread's time. The critical path
/// and the end-to-end latency are recorded for every request.
pub const STAGE_SPLIT_SAMPLE_EVERY: u64 = 8;
/// Most workers of any one stage (a sanity bound on configs).
pub const STAGE_WORKERS_MAX: usize = 64;
/// Most instruments of a run's universe: every core shard lists every instrument, and a
/// reference ladder costs about 130 KiB per instrument per shard.
pub const UNIVERSE_INSTRUMENTS_MAX: u32 = 1024;

/// A configuration of the tier (TOML via `ops::config`; every field has a default).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TierConfig {
    /// Pre-process workers (k).
    pub preprocess_workers: usize,
    /// Core shards (instruments are spread over them by the pipeline's key route).
    pub core_shards: usize,
    /// R-Senders (N), each with its own ring from the R-Processor.
    pub senders: usize,
    /// Outlets: the subscriber slots every R-Sender delivers to (a client's reports go to
    /// outlet `client % outlets`, an instrument's market data to `instrument % outlets`).
    // `gateways`, the old key, is read for one release (issue 44).
    #[serde(alias = "gateways")]
    pub outlets: u32,
    /// Slots of every inbound ring (a power of two).
    pub ring_slots: usize,
    /// Most messages per ring batch.
    pub batch_slots: usize,
    /// Wait strategy of the critical stages: spin, spin-yield, park, adaptive, or auto (spin
    /// when every thread of the tier gets its own CPU, else park: on a shared, oversubscribed
    /// host a spinning or yielding thread steals the CPU from the thread it waits for).
    pub wait: WaitChoice,
    /// Pin workers to cores per the placement plan.
    pub placement: bool,
    /// Ring implementation: lock-free or blocking.
    pub connector: ConnectorKind,
    /// Resting orders per core shard.
    pub order_pool_slots: u32,
    /// Ended orders per core shard whose ids a new order may not take (a resend of one is
    /// refused as a duplicate: `matching::store::EndedOrders`); 0 keeps none.
    pub ended_order_ids: u32,
    /// The instruments and clients of the reference master data the tier starts from (unless
    /// `master_data` is given).
    pub universe: UniverseConfig,
    /// The master data to start from instead of the reference universe: an operator's
    /// instruments and clients files ([`crate::instruments::load`]). Not a TOML field (the
    /// server's configuration names the files).
    #[serde(skip)]
    pub master_data: Option<MasterData>,
    /// Journaling of each core shard's sequenced input: group, sync, relaxed or off.
    pub journal: JournalMode,
    /// A snapshot of each core shard every this many of its journaled inputs (0 = none; no
    /// effect with the journal off). Recovery then replays only the journal after it.
    pub snapshot_every_records: u64,
    /// Thread layout: `auto` plans which stages share a thread, their workers, which threads
    /// spin and which park, and pinning, from the usable CPUs and the stages' service times
    /// (`preprocess_workers`, `core_shards`, `senders`, `wait` and `placement` are then the
    /// planner's); `thread-per-stage` runs one thread per configured stage worker.
    pub layout: LayoutChoice,
    /// Per-stage service times the `auto` layout plans with, ns, as stages fed by a ring
    /// (default: measured by a short calibration run at start-up, see [`calibrate`]).
    pub service_ns: Option<ServiceTimes>,
    /// The same as stages fused after another on its thread (default: measured by a second
    /// calibration run with the chain fused; `service_ns` when only that is given).
    pub fused_service_ns: Option<ServiceTimes>,
    /// Run the load generator inline on the pre-process thread, before it (run to completion,
    /// no ring), or on a thread of its own; `None`: the layout decides
    /// ([`TierLayout::generator_inline`]). Inline needs one pre-process worker.
    pub generator_inline: Option<bool>,
    /// With a journal that syncs (`group`, `sync`): the R-Processor holds each reply until
    /// its input is durable (default). `false` hands replies on at once, for a caller that
    /// waits for [`Tier::durables`] itself (`exchange serve` overlaps that wait with its
    /// session store's fdatasync instead of running the two in series).
    pub hold_replies: bool,
    /// Every output follows the input's order: one pre-process worker and one core shard
    /// (whatever the layout plans), so every replica of a replicated engine numbers the same
    /// outputs in the same order (docs/REPLICATION.md). Not a TOML field (the engine role
    /// sets it).
    #[serde(skip)]
    pub ordered_outputs: bool,
}

impl Default for TierConfig {
    fn default() -> Self {
        TierConfig {
            preprocess_workers: 2,
            core_shards: 1,
            senders: 2,
            outlets: 8,
            ring_slots: 8192,
            batch_slots: 64,
            wait: WaitChoice::Auto,
            placement: false,
            connector: ConnectorKind::LockFree,
            order_pool_slots: crate::core::ORDER_POOL_SLOTS_DEFAULT,
            ended_order_ids: crate::core::ENDED_ORDER_IDS_DEFAULT,
            universe: UniverseConfig::default(),
            master_data: None,
            journal: JournalMode::default(),
            snapshot_every_records: SNAPSHOT_EVERY_RECORDS_DEFAULT,
            layout: LayoutChoice::Auto,
            service_ns: None,
            fused_service_ns: None,
            generator_inline: None,
            hold_replies: true,
            ordered_outputs: false,
        }
    }
}

impl TierConfig {
    /// The matching core's store sizes this configuration asks for.
    pub fn core_limits(&self) -> CoreLimits {
        CoreLimits {
            order_pool_slots: self.order_pool_slots,
            ended_order_ids: self.ended_order_ids,
        }
    }

    /// Who checks the halt and the band: the core alone in an ordered tier, where events
    /// come in the order flow ([`crate::events::OPERATOR_CLIENT`]); the pre-process too otherwise.
    pub fn state_checks(&self) -> crate::preprocess::StateChecks {
        use crate::preprocess::StateChecks;
        if self.ordered_outputs { StateChecks::Core } else { StateChecks::Preprocess }
    }

    /// The master data the tier starts from: `master_data`, else the reference universe.
    pub fn starting_master_data(&self) -> MasterData {
        self.master_data.clone().unwrap_or_else(|| reference_master_data(&self.universe))
    }

    /// One thread per stage with one worker each, every thread parking when idle and nothing
    /// pinned: a tier that costs no CPU while it waits (tests, a host shared with other work).
    ///
    /// ```
    /// use exchange::tier::{LayoutChoice, TierConfig, WaitChoice};
    /// let parked = TierConfig::parked();
    /// assert_eq!((parked.layout, parked.wait), (LayoutChoice::ThreadPerStage, WaitChoice::Park));
    /// assert!(parked.validate().is_ok());
    /// ```
    pub fn parked() -> TierConfig {
        TierConfig {
            preprocess_workers: 1,
            core_shards: 1,
            senders: 1,
            wait: WaitChoice::Park,
            layout: LayoutChoice::ThreadPerStage,
            ..TierConfig::default()
        }
    }

    /// Checks every field; errors are [`BadInput`] naming the field.
    pub fn validate(&self) -> Result<(), ExchangeError> {
        let workers_ok = |n: usize| (1..=STAGE_WORKERS_MAX).contains(&n);
        if !workers_ok(self.preprocess_workers)
            || !workers_ok(self.core_shards)
            || !workers_ok(self.senders)
        {
            return Err(BadInput(format!(
                "preprocess_workers, core_shards and senders must be in 1..={STAGE_WORKERS_MAX}"
            )));
        }
        if self.ordered_outputs && (self.preprocess_workers != 1 || self.core_shards != 1) {
            return Err(BadInput(
                "ordered outputs need one pre-process worker and one core shard".into(),
            ));
        }
        if self.outlets == 0 {
            return Err(BadInput("outlets must be > 0".into()));
        }
        if !self.ring_slots.is_power_of_two()
            || self.batch_slots == 0
            || self.batch_slots > self.ring_slots
        {
            return Err(BadInput(
                "ring_slots must be a power of two and batch_slots in 1..=ring_slots".into(),
            ));
        }
        if self.order_pool_slots == 0 || self.order_pool_slots > crate::core::ORDER_POOL_SLOTS_MAX {
            return Err(BadInput("order_pool_slots out of range".into()));
        }
        if self.ended_order_ids > crate::core::ENDED_ORDER_IDS_MAX {
            return Err(BadInput(format!(
                "ended_order_ids over {}",
                crate::core::ENDED_ORDER_IDS_MAX
            )));
        }
        if !(1..=UNIVERSE_INSTRUMENTS_MAX).contains(&self.universe.instruments)
            || self.universe.clients == 0
        {
            return Err(BadInput(format!(
                "universe needs instruments in 1..={UNIVERSE_INSTRUMENTS_MAX} and clients > 0"
            )));
        }
        for (name, service) in
            [("service_ns", self.service_ns), ("fused_service_ns", self.fused_service_ns)]
        {
            let Some(service) = service else { continue };
            let times =
                [service.preprocess_ns, service.core_ns, service.rprocess_ns, service.sender_ns];
            if times.iter().any(|ns| !ns.is_finite() || *ns <= 0.0) {
                return Err(BadInput(format!("{name}: every stage's time must be > 0 ns")));
            }
        }
        Ok(())
    }

    /// Whether the R-Processor holds replies until their input is durable.
    pub fn holds_replies(&self) -> bool {
        self.hold_replies && self.journal.holds_replies()
    }

    /// The wait strategy of the critical stages on this host.
    pub fn wait_strategy(&self) -> WaitStrategy {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        self.wait.strategy(self.threads(), cpus)
    }

    /// Threads the tier runs: every stage worker plus the load generator.
    pub fn threads(&self) -> usize {
        const SINGLE_WORKER_STAGES: usize = 3; // events, masterdata, rprocess
        const LOAD_THREADS: usize = 1;
        let journal_writers = if self.journal.policy().is_some() { self.core_shards } else { 0 };
        self.preprocess_workers
            + self.core_shards
            + self.senders
            + SINGLE_WORKER_STAGES
            + LOAD_THREADS
            + journal_writers
    }

    fn spec(&self, workers: usize, role: Role) -> StageSpec {
        let wait =
            if role == Role::Critical { self.wait_strategy() } else { WaitStrategy::default() };
        StageSpec { workers, role, ..StageSpec::default() }
            .with_wait(wait)
            .with_ring(self.ring_slots, self.batch_slots)
            .with_connector(self.connector)
    }
}

/// What the core stage consumes (from the pre-process and the events process) and what the
/// master-data process consumes (from the events process and the master-data feed).
#[derive(Clone, Copy, Debug, Default)]
pub struct TierInput {
    pub instrument: InstrumentId,
    /// For the core: an order command or a control message; `Nop` for pure master updates.
    pub command: Command,
    /// For the master-data process; `None` for orders.
    pub master: MasterUpdate,
    /// A request the pre-process refused (`command` is then `Nop`): the core answers it.
    pub refused: Option<Refusal>,
    pub stamps: Stamps,
}

/// What the pre-process hands the core for `request`, given its checks' `verdict`.
pub(crate) fn preprocessed(
    request: &InboundOrder,
    verdict: std::result::Result<crate::preprocess::Routed, Reason>,
    stamps: Stamps,
) -> TierInput {
    match verdict {
        Ok(routed) => TierInput {
            instrument: routed.instrument,
            command: routed.command,
            stamps,
            ..TierInput::default()
        },
        Err(reason) => TierInput {
            instrument: request.instrument,
            refused: Some(Refusal::of(request, reason)),
            stamps,
            ..TierInput::default()
        },
    }
}

/// How the R-Processor routes `output`: trades and top-of-book changes as market data to the
/// instrument's outlet, everything else to the client's (`topic % outlets`).
pub fn response_to(output: CoreOutput, outlets: u32) -> Response {
    let market_data = matches!(output.kind, OutputKind::Trade | OutputKind::TopOfBook);
    let (audience, topic) = if market_data {
        (Audience::MarketData, output.instrument)
    } else {
        (Audience::Client, output.client)
    };
    let answers_request = output.answers_request();
    Response { audience, outlet: topic % outlets, answers_request, output }
}

/// A request the pre-process refused, on its way to the core shard that answers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// Why.
    pub reason: Reason,
    /// Who sent it.
    pub client: ClientId,
    /// The order it named.
    pub order_id: OrderId,
    /// The price it named.
    pub price: Price,
}

impl Refusal {
    /// `request` refused for `reason`.
    pub fn of(request: &InboundOrder, reason: Reason) -> Refusal {
        let (client, order_id, price) = (request.client, request.order_id, request.price);
        Refusal { reason, client, order_id, price }
    }

    /// The reject that answers it (unsequenced: `seq` 0).
    pub fn reject(&self, instrument: InstrumentId, stamps: Stamps) -> CoreOutput {
        CoreOutput {
            kind: OutputKind::Rejected,
            reason: self.reason,
            instrument,
            client: self.client,
            order_id: self.order_id,
            price: self.price,
            stamps,
            ..CoreOutput::default()
        }
    }
}

/// A subscriber a sender delivers to (an in-process outlet, a reply queue, a NATS publisher).
pub trait Subscriber: Send {
    fn deliver(&mut self, response: &Response);
}

/// Builds one R-Sender's subscribers, indexed by outlet (the argument is the sender's index).
/// The lab's load runs use [`in_process_subscribers`]; the `delivery` crate plugs in NATS
/// publishers.
pub type SubscriberFactory = Arc<dyn Fn(usize) -> Vec<Box<dyn Subscriber>> + Send + Sync>;

/// One [`InProcessOutlet`] per outlet for every sender, each spending `publish_work_ns` of
/// busy work per response (a simulated publish cost; 0 = none).
pub fn in_process_subscribers(outlets: u32, publish_work_ns: u64) -> SubscriberFactory {
    Arc::new(move |_| {
        (0..outlets)
            .map(|_| {
                let outlet = InProcessOutlet { publish_work_ns, ..InProcessOutlet::default() };
                Box::new(outlet) as Box<dyn Subscriber>
            })
            .collect()
    })
}

/// The in-process outlet: counts what it receives per audience.
#[derive(Debug, Default)]
pub struct InProcessOutlet {
    pub client_reports: u64,
    pub market_data: u64,
    /// Busy work per response, ns.
    pub publish_work_ns: u64,
}

impl Subscriber for InProcessOutlet {
    fn deliver(&mut self, response: &Response) {
        if self.publish_work_ns > 0 {
            // Simulated work per message, so timed from this message's own start.
            let work_start_ns = now_ns();
            while now_ns() < work_start_ns + self.publish_work_ns {
                std::hint::spin_loop();
            }
        }
        match response.audience {
            Audience::Client => self.client_reports += 1,
            Audience::MarketData => self.market_data += 1,
        }
    }
}

/// What one core shard reports after the run.
#[derive(Clone, Debug, Default)]
pub struct ShardResult {
    pub shard: usize,
    pub output_hash: String,
    pub output_records: u64,
    pub counters: CoreCounters,
    /// The shard's sequenced input, when the run was asked to record it.
    pub recorded: Vec<SequencedInput>,
}

/// The master data's journal over a run.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct MasterReport {
    pub recovery: MasterRecovery,
    /// Updates applied, journaled and published in this run.
    pub updates_journaled: u64,
    pub snapshots_taken: u64,
    /// Digest of the master data at the end of the run (a restart recovers exactly it).
    pub final_digest: String,
}

/// One shard's journal over a run.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ShardJournalReport {
    pub recovery: ShardRecovery,
    /// The writer's counters (`None` when journaling is off).
    pub writer: Option<WriterStats>,
    /// What the shard's snapshot follower did (`None` when snapshots are off).
    pub snapshots: Option<SnapshotReport>,
}

impl From<Effect> for TierInput {
    fn from(effect: Effect) -> TierInput {
        let Effect { instrument, command, master } = effect;
        TierInput { instrument, command, master, ..TierInput::default() }
    }
}

/// Per core shard, the highest input sequence with a delivered reply.
///
/// Concurrency argument: R-Senders `fetch_max` into it, any thread reads it. Under `group`
/// and `sync` a reply is delivered only after the R-Processor saw the journal's durable
/// sequence cover its input, so a value read here is at most the durable sequence of that
/// shard at some earlier moment.
#[derive(Debug)]
pub struct ReleasedSeqs {
    shards: Vec<AtomicU64>,
}

impl ReleasedSeqs {
    pub fn new(shards: usize) -> Arc<ReleasedSeqs> {
        Arc::new(ReleasedSeqs { shards: (0..shards).map(|_| AtomicU64::new(0)).collect() })
    }

    /// The highest sequence of `shard` with a delivered reply.
    pub fn get(&self, shard: usize) -> u64 {
        // Relaxed: a monotonic watermark with no data published through it; the durability
        // ordering was established by the R-Processor before the reply was delivered.
        self.shards[shard].load(Ordering::Relaxed)
    }

    fn record(&self, shard: u32, seq: u64) {
        if let Some(released) = self.shards.get(shard as usize) {
            // Relaxed: see `get`.
            released.fetch_max(seq, Ordering::Relaxed);
        }
    }
}

/// The journals' side of a run, kept from recovery to the end: the writers and snapshot
/// followers to stop, and the data directory (a temporary one is removed when this drops).
struct Durability {
    journals: ShardJournals,
    shards: Vec<(Option<JournalWriter>, Option<ShardSnapshotter>, ShardRecovery)>,
    master_writer: Option<JournalWriter>,
}

/// Recovers every shard and the master data (or starts them fresh) and splits the result into
/// what the stages start from and what the run stops at the end.
fn recover(
    config: &TierConfig,
    journal: &JournalOptions,
    master: &MasterData,
) -> Result<(StageStarts, Durability)> {
    let limits = config.core_limits();
    let mut journals = open_shards(
        config.journal,
        journal,
        config.snapshot_every_records,
        config.core_shards,
        &master.listings(),
        limits,
    )?;
    let master_journal = match &journals.data_dir {
        Some(dir) => Some(open_master(dir, journal, config.snapshot_every_records, master)?),
        None => None,
    };
    let (master_worker, master_writer) = MasterWorker::start(master_journal, master.clone());
    let mut shard_starts = Vec::with_capacity(journals.shards.len());
    let mut shards = Vec::with_capacity(journals.shards.len());
    for shard in journals.shards.drain(..) {
        let (state, last_seq, journal) = (shard.state, shard.last_seq, shard.sender);
        shard_starts.push(ShardStart { state, last_seq, journal });
        shards.push((shard.writer, shard.snapshots, shard.recovery));
    }
    let starts = StageStarts {
        shards: shard_starts,
        durables: journals.durables.clone(),
        master: master_worker,
    };
    Ok((starts, Durability { journals, shards, master_writer }))
}

impl Durability {
    /// Restricts the journal writers and snapshot followers to `cpus` (the plan's floating
    /// CPUs): spawned before the plan existed, they would otherwise wake up on a spinning
    /// critical thread's CPU and preempt it (docs/benchmarks/tier-layout.md has what that
    /// cost the critical path). A thread that cannot be pinned runs as it is.
    fn pin_helpers_to(&self, cpus: &[CpuId]) {
        let writers = self.shards.iter().filter_map(|(writer, ..)| writer.as_ref());
        for writer in writers.chain(self.master_writer.as_ref()) {
            if let Err(error) = writer.pin_to(cpus) {
                tracing::warn!("placement: journal writer not pinned to CPUs {cpus:?}: {error}");
            }
        }
        for follower in self.shards.iter().filter_map(|(_, follower, _)| follower.as_ref()) {
            if let Err(error) = follower.pin_to(cpus) {
                tracing::warn!("placement: snapshot follower not pinned to CPUs {cpus:?}: {error}");
            }
        }
    }

    /// Once the pipeline finished (the core workers and the master-data worker are gone, and
    /// with them the journal senders): each writer drains, syncs and stops, then its snapshot
    /// follower catches up with the last durable sequence, takes the snapshots due and stops.
    fn finish(self) -> Result<Vec<ShardJournalReport>> {
        let mut reports = Vec::with_capacity(self.shards.len());
        for (writer, snapshotter, recovery) in self.shards {
            let stopping = journal_failed(format!(
                "stopping the journal writer of {}",
                recovery.dir.display()
            ));
            let writer = writer.map(JournalWriter::join).transpose().map_err(stopping)?;
            let snapshots =
                snapshotter.map(|s| s.finish()).transpose().map_err(ExchangeError::Failed)?;
            reports.push(ShardJournalReport { recovery, writer, snapshots });
        }
        let stopping = journal_failed("stopping the master data's journal writer");
        self.master_writer.map(JournalWriter::join).transpose().map_err(stopping)?;
        drop(self.journals);
        Ok(reports)
    }
}

/// The stages' reports, combined.
struct Totals {
    latency: SenderLatency,
    rejects: [u64; REASON_COUNT],
    shards: Vec<ShardResult>,
    master: Option<MasterReport>,
}

impl Totals {
    /// Takes every worker's result (the pipeline finished cleanly, so each worker did) and
    /// fails the run if a journal stopped.
    fn collect(reports: graph::StageReports) -> Result<Totals> {
        let finished = "every worker finished: the pipeline ended without an error";
        let mut latency = SenderLatency::new();
        for sender in reports.senders.take().expect(finished) {
            latency.merge(&sender);
        }
        let mut rejects = [0; REASON_COUNT];
        let mut unreleased = 0;
        for responses in reports.responses.take().expect(finished) {
            for (total, count) in rejects.iter_mut().zip(responses.rejects) {
                *total += count;
            }
            unreleased += responses.unreleased;
        }
        let mut master = None;
        let mut errors = Vec::new();
        for outcome in reports.master.take().expect(finished) {
            master = outcome.report;
            errors.extend(outcome.errors);
        }
        if !errors.is_empty() {
            return Err(ExchangeError::Failed(errors.join("; ")));
        }
        if unreleased != 0 {
            return Err(ExchangeError::Failed(format!(
                "a journal writer failed: {unreleased} replies were held back for good (never \
                 released)"
            )));
        }
        let shards = reports.shards.take().expect(finished);
        Ok(Totals { latency, rejects, shards, master })
    }
}
