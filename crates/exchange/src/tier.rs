//! The whole tier on the `pipeline` stage runtime, driven open-loop by the load generator.
//!
//! ```text
//!  load (gateway input) --by instrument--> preprocess (k) --by instrument--> core (s shards)
//!       |                                       (orders and refusals)             |
//!  event feed --> events --by instrument--------+---------------------> core      v
//!       |            \--------------------> masterdata <-- master feed    rprocess (1)
//!                                                                     --by gateway--> senders (N)
//!                                                                                     -> gateways
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
//!   response at the subscriber gateway, with per-stage splits from stamps in the messages.
//!
//! [`run`] reads as its steps: `recover` (the journals and master data, or a fresh start),
//! `graph::start` (the stages above, wired and started), `drive_load` (the open-loop load),
//! then the pipeline drains, `Durability::finish` stops the journal writers and snapshot
//! followers, and `Totals::collect` combines what each stage's workers handed back when they
//! finished ([`pipeline::stage::StageWorker::finish`], in `workers`).

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
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::error::ExchangeError::BadInput;
use crate::error::{ExchangeError, Result, journal_failed};
use lab::load::{DriveReport, OpenLoopPlan, OpenLoopSteps, Pacer, Shot, drive_steps_with};
use lab::stats::LatencyHistogram;
use pipeline::metrics::{StageMetrics, instant_ns, now_ns};
use pipeline::placement::{CpuId, PlacementPlan, Role};
use pipeline::stage::{Emitter, Flow, StageSpec};
use pipeline::{ConnectorKind, WaitStrategy};
use std::sync::mpsc::{self, RecvTimeoutError};

use journal::JournalWriter;
use journal::writer::WriterStats;

use crate::events::{Effect, ExternalEvent};
pub use choices::{Arrival, WaitChoice};
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
use crate::flow::{FlowConfig, FlowGenerator, UniverseConfig, reference_master_data};
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

/// A configuration of the tier (TOML via `lab::config`; every field has a default).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TierConfig {
    /// Pre-process workers (k).
    pub preprocess_workers: usize,
    /// Core shards (instruments are spread over them by the pipeline's key route).
    pub core_shards: usize,
    /// R-Senders (N), each with its own ring from the R-Processor.
    pub senders: usize,
    /// In-process subscriber gateways (clients and market-data topics map onto them).
    pub gateways: u32,
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
            gateways: 8,
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
        if self.gateways == 0 {
            return Err(BadInput("gateways must be > 0".into()));
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

/// What an experiment composes with the tier, none of it the tier's own: the open-loop load
/// generator's settings (arrivals, order flow, the scenario's external events and master-data
/// updates) and the in-process subscribers' simulated work. [`run`] drives the tier with it;
/// `exchange serve` has no generator (its sessions are the tier's source).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoadConfig {
    /// Arrival process: constant, poisson or bursty.
    pub arrival: Arrival,
    /// Bursty arrivals: on and off periods, µs.
    pub burst_on_us: u64,
    pub burst_off_us: u64,
    /// Seed of the arrival schedule (the order flow has its own, `flow.seed`).
    pub seed: u64,
    pub flow: FlowConfig,
    /// An external event (halt/resume/band change, cycling) every this many requests; 0 = none.
    pub events_every: u64,
    /// A master-data update every this many requests; 0 = none.
    pub master_updates_every: u64,
    /// Simulated per-message publish cost of the in-process subscribers (busy work on the
    /// R-Sender's thread, ns; 0 = none).
    pub publish_work_ns: u64,
}

impl Default for LoadConfig {
    fn default() -> Self {
        LoadConfig {
            arrival: Arrival::Poisson,
            burst_on_us: 1_000,
            burst_off_us: 1_000,
            seed: 7,
            flow: FlowConfig::default(),
            events_every: 50_000,
            master_updates_every: 100_000,
            publish_work_ns: 0,
        }
    }
}

impl LoadConfig {
    /// The settings' names, for telling a tier file's misplaced load settings apart.
    pub const FIELDS: [&str; 8] = [
        "arrival",
        "burst_on_us",
        "burst_off_us",
        "seed",
        "flow",
        "events_every",
        "master_updates_every",
        "publish_work_ns",
    ];

    /// Checks every field; errors are [`BadInput`] naming the field.
    ///
    /// ```
    /// use exchange::flow::FlowConfig;
    /// use exchange::tier::LoadConfig;
    /// assert!(LoadConfig::default().validate().is_ok());
    /// let flow = FlowConfig { cancel_share: 0.8, replace_share: 0.5, ..FlowConfig::default() };
    /// assert!(LoadConfig { flow, ..LoadConfig::default() }.validate().is_err());
    /// ```
    pub fn validate(&self) -> Result<(), ExchangeError> {
        let flow = &self.flow;
        let shares = [
            flow.crossing_share,
            flow.cancel_share,
            flow.replace_share,
            flow.immediate_share,
            flow.invalid_share,
        ];
        if shares.iter().any(|share| !(0.0..=1.0).contains(share))
            || flow.cancel_share + flow.replace_share + flow.invalid_share > 1.0
        {
            return Err(BadInput(
                "flow shares must be in 0..=1, and cancel + replace + invalid <= 1".into(),
            ));
        }
        self.arrival_process(1.0)
            .validate()
            .map_err(|lab::error::BadInput(reason)| BadInput(reason))
    }

    /// The arrival process at `rate_per_s`.
    pub fn arrival_process(&self, rate_per_s: f64) -> lab::load::ArrivalProcess {
        self.arrival.process(rate_per_s, self.burst_on_us, self.burst_off_us)
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
/// instrument's gateway, everything else to the client's (`topic % gateways`).
pub fn response_to(output: CoreOutput, gateways: u32) -> Response {
    let market_data = matches!(output.kind, OutputKind::Trade | OutputKind::TopOfBook);
    let (audience, topic) = if market_data {
        (Audience::MarketData, output.instrument)
    } else {
        (Audience::Client, output.client)
    };
    let answers_request = output.answers_request();
    Response { audience, gateway: topic % gateways, answers_request, output }
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

/// A subscriber a sender delivers to (an in-process gateway here; network gateways later).
pub trait Subscriber: Send {
    fn deliver(&mut self, response: &Response);
}

/// Builds one R-Sender's subscribers, indexed by gateway (the argument is the sender's index).
/// [`run`] uses [`in_process_subscribers`]; the `delivery` crate plugs in NATS publishers.
pub type SubscriberFactory = Arc<dyn Fn(usize) -> Vec<Box<dyn Subscriber>> + Send + Sync>;

/// One [`InProcessGateway`] per gateway for every sender, each spending `publish_work_ns` of
/// busy work per response (a simulated publish cost; 0 = none).
pub fn in_process_subscribers(gateways: u32, publish_work_ns: u64) -> SubscriberFactory {
    Arc::new(move |_| {
        (0..gateways)
            .map(|_| {
                let gateway = InProcessGateway { publish_work_ns, ..InProcessGateway::default() };
                Box::new(gateway) as Box<dyn Subscriber>
            })
            .collect()
    })
}

/// The in-process gateway: counts what it receives per audience.
#[derive(Debug, Default)]
pub struct InProcessGateway {
    pub client_reports: u64,
    pub market_data: u64,
    /// Busy work per response, ns.
    pub publish_work_ns: u64,
}

impl Subscriber for InProcessGateway {
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

/// What one run measured.
pub struct RunResult {
    pub rate_per_s: f64,
    pub sent: u64,
    pub elapsed_s: f64,
    /// Intended send time -> first response delivered at the gateway, every request.
    pub end_to_end: LatencyHistogram,
    /// Intended send time -> response content final (core output emitted, or pre-process
    /// reject built), every request: the critical path, not waiting for any fsync.
    pub critical_path: LatencyHistogram,
    /// Per split of [`STAGE_SPLITS`]: one in [`STAGE_SPLIT_SAMPLE_EVERY`] of the requests that
    /// passed the pre-process.
    pub stage_latency: Vec<LatencyHistogram>,
    /// How late the generator issued requests.
    pub send_lag: LatencyHistogram,
    pub pipeline: Vec<StageMetrics>,
    /// Where the tier's threads were planned: each placed thread's CPUs, the floating CPUs,
    /// the OS's core, and what was compromised (`notes`); pinned only when `pinned`.
    pub placement: PlacementPlan,
    /// Whether the run pinned its threads to the plan's CPUs (`TierConfig::placement`).
    pub pinned: bool,
    pub rejects: [u64; REASON_COUNT],
    pub shards: Vec<ShardResult>,
    pub delivered: u64,
    pub journal_mode: JournalMode,
    /// Per shard: what recovery found and what the journal writer did.
    pub journal: Vec<ShardJournalReport>,
    /// The master data's journal (`None` when journaling is off).
    pub master: Option<MasterReport>,
    /// The thread layout the run used.
    pub layout: TierLayout,
    /// Per group of `layout`: the measured mean utilization of its threads (busy / elapsed).
    pub layout_utilization: Vec<f64>,
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

/// The scripted external events and master-data updates injected during a run.
struct Scenario {
    events_every: u64,
    master_every: u64,
    instruments: u32,
    step: u64,
}

impl Scenario {
    fn event(&mut self, index: u64, master: &MasterData) -> Option<ExternalEvent> {
        if self.events_every == 0 || index == 0 || !index.is_multiple_of(self.events_every) {
            return None;
        }
        self.step += 1;
        let instrument = (self.step / 3 % u64::from(self.instruments)) as InstrumentId;
        let listing = master.instrument(instrument)?;
        Some(match self.step % 3 {
            0 => ExternalEvent::CircuitBreaker(instrument),
            1 => ExternalEvent::Resume(instrument),
            _ => ExternalEvent::Band { instrument, low: listing.band_low, high: listing.band_high },
        })
    }

    fn master_update(&self, index: u64, master: &MasterData) -> Option<MasterUpdate> {
        if self.master_every == 0 || index == 0 || !index.is_multiple_of(self.master_every) {
            return None;
        }
        let update = index / self.master_every;
        let client = (update % master.clients.len() as u64) as u32;
        let limits = master.client(client)?;
        // Raises the limit by a few units per update: a visible change of the master data
        // (recovery must reproduce it) that no order of the flow is near.
        Some(MasterUpdate::ClientLimit {
            client,
            enabled: limits.enabled,
            order_value_max: limits.order_value_max + update,
        })
    }
}

/// Options of one run besides the configuration.
#[derive(Clone, Debug)]
pub struct RunOptions {
    pub rate_per_s: f64,
    pub duration: Duration,
    /// Keep every shard's sequenced input (for replay).
    pub record_inputs: bool,
    /// Where the shard journals live (a temporary directory by default) and how to recover.
    pub journal: JournalOptions,
    /// Publishes, per shard, the highest input sequence whose reply was delivered (the crash
    /// test's child reports it to its client); `None` in measured runs.
    pub released: Option<Arc<ReleasedSeqs>>,
    /// Ends the load early once set (a stop signal): the run then drains and reports as at
    /// the end of its duration; `None`: the load runs its whole duration.
    pub stop: Option<Arc<AtomicBool>>,
    /// The load generator's settings ([`run`]; unused by a tier fed by a source of its own).
    pub load: LoadConfig,
}

impl RunOptions {
    /// What starting the tier takes for this run: `config` (planned) on `layout`, this run's
    /// journal options, recording and released sequences, delivering to `subscribers`.
    fn tier_start(
        &self,
        config: &TierConfig,
        layout: &TierLayout,
        subscribers: SubscriberFactory,
    ) -> TierStart {
        TierStart {
            layout: Some(layout.clone()),
            journal: self.journal.clone(),
            record_inputs: self.record_inputs,
            released: self.released.clone(),
            ..TierStart::new(config.clone(), self.rate_per_s, subscribers)
        }
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

/// Builds the tier, drives it open-loop at `options.rate_per_s`, drains it and reports.
pub fn run(
    config: &TierConfig,
    options: RunOptions,
    progress: impl FnMut(u64),
) -> Result<RunResult, ExchangeError> {
    let subscribers = in_process_subscribers(config.gateways, options.load.publish_work_ns);
    run_with_subscribers(config, options, subscribers, progress)
}

/// [`run`] with the R-Senders delivering to `subscribers` (`config.gateways` per sender).
pub fn run_with_subscribers(
    config: &TierConfig,
    options: RunOptions,
    subscribers: SubscriberFactory,
    progress: impl FnMut(u64),
) -> Result<RunResult, ExchangeError> {
    config.validate()?;
    options.load.validate()?;
    let (planned, layout) = plan_layout(config, options.rate_per_s)?;
    run_with_layout(&planned, &layout, options, subscribers, progress)
}

/// [`run_with_subscribers`] with the layout already chosen (and `config` carrying its worker
/// counts).
fn run_with_layout(
    config: &TierConfig,
    layout: &TierLayout,
    options: RunOptions,
    subscribers: SubscriberFactory,
    progress: impl FnMut(u64),
) -> Result<RunResult, ExchangeError> {
    let master = config.starting_master_data();
    // Fixes the clock's epoch before the schedule's first intended time (`instant_ns`).
    let _ = now_ns();
    let start = options.tier_start(config, layout, subscribers);
    let (tier, driven) = if layout.generator_inline {
        let (run, source) = InlineRun::start(config, &options, &master)?;
        let tier = Tier::start_with_source(start, source)?;
        (tier, run.wait(progress))
    } else {
        let (tier, inputs) = Tier::start(start)?;
        let spins = layout.outside_threads_spin;
        let pacer = if spins { Pacer::spinning() } else { Pacer::default() };
        (tier, Some(drive_load(config, &options, &master, (inputs, pacer), progress)?))
    };
    let placement = tier.placement().clone();
    // The feeds are gone: every stage drains and stops, and each worker reports (or the
    // error that stopped the pipeline comes out here, before a missing report would).
    let stopped = tier.stop()?;
    let ended = "the inline load generator ended without a report";
    let (drive, disconnected) = driven.ok_or_else(|| ExchangeError::Failed(ended.into()))?;
    if disconnected {
        let stopped = "the pipeline stopped while the load was running";
        return Err(ExchangeError::Failed(stopped.into()));
    }
    let TierStopped { journal, totals, report, .. } = stopped;
    Ok(RunResult {
        rate_per_s: options.rate_per_s,
        sent: drive.sent,
        elapsed_s: drive.elapsed.as_secs_f64(),
        end_to_end: totals.latency.end_to_end,
        critical_path: totals.latency.critical_path,
        stage_latency: totals.latency.stage_latency,
        send_lag: drive.send_lag,
        pipeline: report.stages.clone(),
        placement,
        pinned: config.placement,
        rejects: totals.rejects,
        shards: totals.shards,
        delivered: totals.latency.delivered,
        journal_mode: config.journal,
        journal,
        master: totals.master,
        layout_utilization: measured_utilization(layout, &report.stages),
        layout: layout.clone(),
    })
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

impl RunResult {
    /// The CPUs the threads of layout group `index` were pinned to (empty: not pinned). A
    /// group's threads are named after the stage they start with, or after the load generator
    /// when it runs inline before the first group; parked groups without a CPU of their own
    /// float on the plan's floating CPUs.
    pub fn group_cpus(&self, index: usize) -> Vec<CpuId> {
        let group = &self.layout.groups[index];
        if !self.pinned {
            return Vec::new();
        }
        if group.wait == GroupWait::ParkFloating {
            return self.placement.floating_cpus.clone();
        }
        let head = if index == 0 && self.layout.generator_inline {
            INLINE_GENERATOR_STAGE
        } else {
            group.stages[0].name()
        };
        let prefix = format!("{head}/");
        let threads = self.placement.threads.iter().filter(|t| t.label.starts_with(&prefix));
        let mut cpus: Vec<CpuId> = threads.flat_map(|t| t.cpus.iter().copied()).collect();
        cpus.sort_unstable();
        cpus.dedup();
        cpus
    }
}

/// The pipeline stage (and thread name) of the load generator run inline.
pub const INLINE_GENERATOR_STAGE: &str = "generator";

/// Shots issued per turn of the inline generator at most, so that a generator behind its
/// schedule hands the chain bounded batches.
const INLINE_SHOTS_PER_TURN_MAX: usize = 64;

/// The main thread's side of a generator run inline on the chain's first thread (an order
/// source of the tier, [`TierLayout::generator_inline`]): how far it got, and where it reports
/// when done.
struct InlineRun {
    issued: Arc<AtomicU64>,
    reported: mpsc::Receiver<(DriveReport, bool)>,
}

/// How often the main thread reports an inline generator's progress while it runs.
const INLINE_PROGRESS_INTERVAL: Duration = Duration::from_millis(50);

impl InlineRun {
    /// The run's load generator as an order source: each turn issues every shot now due
    /// (the scenario's events and updates through the control input the tier handed it),
    /// which the fused chain then handles to completion; it stops after the last shot.
    fn start(
        config: &TierConfig,
        options: &RunOptions,
        master: &MasterData,
    ) -> Result<(InlineRun, OrderSource)> {
        let (report, reported) = mpsc::channel();
        let issued = Arc::new(AtomicU64::new(0));
        let counter = issued.clone();
        let mut load = Load::new(config.universe, &options.load, master);
        let mut steps = OpenLoopSteps::new(&open_loop_plan(options))?.until(options.stop.clone());
        let source = OrderSource::new(move |started: SourceStart| {
            let mut control = started.control;
            let turns = move |out: &mut Emitter<InboundOrder>| {
                let now = Instant::now();
                let mut disconnected = false;
                for _ in 0..INLINE_SHOTS_PER_TURN_MAX {
                    let Some(shot) = steps.due(now) else { break };
                    let send = |request, intended_ns| {
                        out.emit_with_ingress(request, intended_ns);
                        false
                    };
                    disconnected |= load.issue(&shot, &mut control, send);
                }
                // Relaxed: a progress count, stored once per turn.
                counter.store(steps.sent(), Ordering::Relaxed);
                if steps.finished() || disconnected {
                    let _ = report.send((steps.report(), disconnected));
                    return Flow::Stop;
                }
                Flow::Continue
            };
            Ok(Box::new(turns) as SourceTurns)
        });
        Ok((InlineRun { issued, reported }, source.named(INLINE_GENERATOR_STAGE)))
    }

    /// Reports the generator's progress until it is done: `(report, whether a feed was
    /// gone)`, or `None` when the generator ended without one (the pipeline aborted; the
    /// tier's `stop` says why).
    fn wait(self, mut progress: impl FnMut(u64)) -> Option<(DriveReport, bool)> {
        loop {
            match self.reported.recv_timeout(INLINE_PROGRESS_INTERVAL) {
                Ok(report) => return Some(report),
                // Relaxed: a progress count.
                Err(RecvTimeoutError::Timeout) => progress(self.issued.load(Ordering::Relaxed)),
                Err(RecvTimeoutError::Disconnected) => return None,
            }
        }
    }
}

/// What a run's load generator issues: the order flow and the scenario's events and
/// master-data updates, wherever the generator runs (its own thread, or inline on the chain's
/// first thread).
struct Load {
    generator: FlowGenerator,
    scenario: Scenario,
    master: MasterData,
}

impl Load {
    fn new(universe: UniverseConfig, load: &LoadConfig, master: &MasterData) -> Load {
        Load {
            generator: FlowGenerator::new(universe, load.flow),
            scenario: Scenario {
                events_every: load.events_every,
                master_every: load.master_updates_every,
                instruments: universe.instruments,
                step: 0,
            },
            master: master.clone(),
        }
    }

    /// Issues `shot`: its event and master-data update, if due, on their feeds, then its
    /// request through `send(request, intended_ns)`. Returns whether a feed was gone.
    fn issue(
        &mut self,
        shot: &Shot,
        control: &mut TierControl,
        send: impl FnOnce(InboundOrder, u64) -> bool,
    ) -> bool {
        let mut disconnected = false;
        let (mut request, _) = self.generator.next_request();
        // The schedule's own instant, on the stages' clock: no clock read per request.
        let intended_ns = instant_ns(shot.intended);
        request.stamps.intended_ns = intended_ns;
        if let Some(event) = self.scenario.event(shot.index, &self.master) {
            disconnected |= control.event(event).is_err();
        }
        if let Some(update) = self.scenario.master_update(shot.index, &self.master) {
            disconnected |= control.master_update(update).is_err();
        }
        disconnected | send(request, intended_ns)
    }
}

/// Drives the open-loop load into the feeds, with the scenario's events and master-data
/// updates, paced by `pacer`; returns the generator's report and whether the pipeline
/// stopped taking input.
fn drive_load(
    config: &TierConfig,
    options: &RunOptions,
    master: &MasterData,
    (inputs, pacer): (TierInputs, Pacer),
    mut progress: impl FnMut(u64),
) -> Result<(DriveReport, bool)> {
    let TierInputs { orders: mut gateway, mut control } = inputs;
    let mut load = Load::new(config.universe, &options.load, master);
    let steps = OpenLoopSteps::new(&open_loop_plan(options))?.until(options.stop.clone());
    let mut disconnected = false;
    let drive = drive_steps_with(steps, pacer, |shot| {
        if disconnected {
            return;
        }
        // Sent when issued: the pacer's last clock read, so publishing reads no clock.
        let issued_ns = instant_ns(shot.issued);
        let send = |request, intended_ns| {
            gateway
                .send_with_ingress(request, intended_ns)
                .and_then(|()| gateway.flush_at(issued_ns))
                .is_err()
        };
        disconnected |= load.issue(&shot, &mut control, send);
        if shot.index % 1024 == 0 {
            progress(shot.index);
        }
    });
    Ok((drive, disconnected))
}

fn open_loop_plan(options: &RunOptions) -> OpenLoopPlan {
    OpenLoopPlan {
        process: options.load.arrival_process(options.rate_per_s),
        seed: options.load.seed,
        duration: options.duration,
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
