//! The whole tier on the `pipeline` stage runtime, driven open-loop by the load generator.
//!
//! ```text
//!  load (gateway input) --by instrument--> preprocess (k) --by instrument--> core (s shards)
//!       |                                       | rejects (own input rings)        |
//!  event feed --> events --by instrument--------+---------------------> core      v
//!       |            \--------------------> masterdata <-- master feed    rprocess (1)
//!                                                                     --by gateway--> senders (N)
//!                                                                                     -> gateways
//! ```
//!
//! * Pre-process workers are fed by instrument, so one instrument's flow keeps its order; a
//!   reject goes straight to the R-Processor through the worker's own input ring, never to
//!   the core.
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
//! * The master-data process is the single writer of the [`SnapshotCell`]; the external events
//!   process sends each event both to the core (as a control message) and to the master-data
//!   process (so the pre-process sees halts and bands early). With a journal, the master-data
//!   process journals each update write-ahead before publishing it (`MasterWorker`).
//! * Each shard's snapshot follower (`durability::ShardSnapshotter`) runs beside the journal
//!   writer, off the critical path; the run stops it after the writer, once it has caught up.
//! * Latency is measured from each request's intended send time to the delivery of its first
//!   response at the subscriber gateway, with per-stage splits from stamps in the messages.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::error::ExchangeError;
use crate::error::ExchangeError::BadInput;
use lab::load::{ArrivalProcess, OpenLoopPlan, drive_sync};
use lab::stats::LatencyHistogram;
use pipeline::metrics::{StageMetrics, now_ns};
use pipeline::placement::Role;
use pipeline::stage::{Emitter, Input, PipelineBuilder, Route, StageSpec};
use pipeline::{ConnectorKind, WaitStrategy};

use journal::writer::WriterStats;
use journal::{DurableSeq, JournalSender, JournalWriter, Snapshotter};

use crate::core::{CoreCounters, CoreLimits};
use crate::durability::{
    JournalMode, JournalOptions, MasterJournal, MasterRecord, MasterRecovery, MasterState,
    SNAPSHOT_EVERY_RECORDS_DEFAULT, ShardRecord, ShardRecovery, ShardState, SnapshotReport,
    open_master, open_shards,
};
use crate::flow::{FlowConfig, FlowGenerator, UniverseConfig, reference_master_data};
use crate::master::{MasterData, MasterUpdate, SnapshotCell};
use crate::msg::{
    Audience, Command, CoreOutput, InboundOrder, InstrumentId, OutputKind, Price, REASON_COUNT,
    Reason, Response, SequencedInput, Stamps,
};
use crate::preprocess::Preprocessor;

/// Names of the per-stage latency splits, in path order.
pub const STAGE_SPLITS: [&str; 5] = ["preprocess", "core", "rprocess", "sender", "delivery"];
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
    pub wait: String,
    /// Pin workers to cores per the placement plan.
    pub placement: bool,
    /// Ring implementation: lock-free or blocking.
    pub connector: String,
    /// Arrival process: constant, poisson or bursty.
    pub arrival: String,
    /// Bursty arrivals: on and off periods, µs.
    pub burst_on_us: u64,
    pub burst_off_us: u64,
    /// Resting orders per core shard.
    pub order_pool_slots: u32,
    /// Simulated per-message publish cost of an R-Sender (busy work, ns; 0 = in-process only).
    pub publish_work_ns: u64,
    /// An external event (halt/resume/band change, cycling) every this many requests; 0 = none.
    pub events_every: u64,
    /// A master-data update every this many requests; 0 = none.
    pub master_updates_every: u64,
    pub universe: UniverseConfig,
    pub flow: FlowConfig,
    /// Seed of the arrival schedule.
    pub seed: u64,
    /// Journaling of each core shard's sequenced input: group, sync, relaxed or off.
    pub journal: JournalMode,
    /// A snapshot of each core shard every this many of its journaled inputs (0 = none; no
    /// effect with the journal off). Recovery then replays only the journal after it.
    pub snapshot_every_records: u64,
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
            wait: "auto".into(),
            placement: false,
            connector: "lock-free".into(),
            arrival: "poisson".into(),
            burst_on_us: 1_000,
            burst_off_us: 1_000,
            order_pool_slots: crate::store::ORDER_POOL_SLOTS_DEFAULT,
            publish_work_ns: 0,
            events_every: 50_000,
            master_updates_every: 100_000,
            universe: UniverseConfig::default(),
            flow: FlowConfig::default(),
            seed: 7,
            journal: JournalMode::Group,
            snapshot_every_records: SNAPSHOT_EVERY_RECORDS_DEFAULT,
        }
    }
}

impl TierConfig {
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
        if self.order_pool_slots == 0 || self.order_pool_slots > crate::store::ORDER_POOL_SLOTS_MAX
        {
            return Err(BadInput("order_pool_slots out of range".into()));
        }
        if !(1..=UNIVERSE_INSTRUMENTS_MAX).contains(&self.universe.instruments)
            || self.universe.clients == 0
        {
            return Err(BadInput(format!(
                "universe needs instruments in 1..={UNIVERSE_INSTRUMENTS_MAX} and clients > 0"
            )));
        }
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
        self.wait_strategy()?;
        self.connector_kind()?;
        self.arrival_process(1.0)?
            .validate()
            .map_err(|lab::error::BadInput(reason)| BadInput(reason))
    }

    pub fn wait_strategy(&self) -> Result<WaitStrategy, ExchangeError> {
        if self.wait == "auto" {
            let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
            return Ok(if cpus > self.threads() {
                WaitStrategy::BusySpin
            } else {
                WaitStrategy::Park
            });
        }
        self.wait.parse().map_err(|e: String| BadInput(format!("wait: {e} (or auto)")))
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

    pub fn connector_kind(&self) -> Result<ConnectorKind, ExchangeError> {
        self.connector.parse().map_err(|e: String| BadInput(format!("connector: {e}")))
    }

    /// The arrival process at `rate_per_s`.
    pub fn arrival_process(&self, rate_per_s: f64) -> Result<ArrivalProcess, ExchangeError> {
        match self.arrival.as_str() {
            "constant" => Ok(ArrivalProcess::Constant { rate_per_s }),
            "poisson" => Ok(ArrivalProcess::Poisson { rate_per_s }),
            "bursty" => Ok(ArrivalProcess::Bursty {
                rate_per_s,
                on_ns: self.burst_on_us * 1_000,
                off_ns: self.burst_off_us * 1_000,
            }),
            other => {
                Err(BadInput(format!("arrival `{other}`: expected constant, poisson or bursty")))
            }
        }
    }

    fn spec(&self, workers: usize, role: Role) -> Result<StageSpec, ExchangeError> {
        let spec = StageSpec { workers, role, ..StageSpec::default() };
        Ok(spec
            .with_wait(if role == Role::Critical {
                self.wait_strategy()?
            } else {
                WaitStrategy::default()
            })
            .with_ring(self.ring_slots, self.batch_slots)
            .with_connector(self.connector_kind()?))
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
    pub stamps: Stamps,
}

/// An external event as it arrives from outside (market operations, a surveillance feed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ExternalEvent {
    #[default]
    None,
    Halt(InstrumentId),
    /// Halt caused by a price move (same effect as a halt; reported apart).
    CircuitBreaker(InstrumentId),
    Resume(InstrumentId),
    Band {
        instrument: InstrumentId,
        low: Price,
        high: Price,
    },
}

/// A subscriber a sender delivers to (an in-process gateway here; network gateways later).
pub trait Subscriber: Send {
    fn deliver(&mut self, response: &Response);
}

/// The in-process gateway: counts what it receives per audience.
#[derive(Debug, Default)]
pub struct InProcessGateway {
    pub client_reports: u64,
    pub market_data: u64,
}

impl Subscriber for InProcessGateway {
    fn deliver(&mut self, response: &Response) {
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
    /// Per split of [`STAGE_SPLITS`] (requests that passed the pre-process).
    pub stage_latency: Vec<LatencyHistogram>,
    /// How late the generator issued requests.
    pub send_lag: LatencyHistogram,
    pub pipeline: Vec<StageMetrics>,
    pub placement_notes: Vec<String>,
    pub rejects: [u64; REASON_COUNT],
    pub shards: Vec<ShardResult>,
    pub delivered: u64,
    pub journal_mode: JournalMode,
    /// Per shard: what recovery found and what the journal writer did.
    pub journal: Vec<ShardJournalReport>,
    /// The master data's journal (`None` when journaling is off).
    pub master: Option<MasterReport>,
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

/// Results handed back by workers when their handlers are dropped (at worker exit).
#[derive(Default)]
struct Collected {
    shards: Vec<ShardResult>,
    end_to_end: LatencyHistogram,
    critical_path: LatencyHistogram,
    stage_latency: Vec<LatencyHistogram>,
    rejects: [u64; REASON_COUNT],
    delivered: u64,
    /// Replies never released because a journal writer failed.
    unreleased: u64,
    /// Snapshot threads or journals that stopped on an error.
    durability_errors: Vec<String>,
    master: Option<MasterReport>,
}

type Shared<T> = Arc<Mutex<T>>;

fn lock<T>(shared: &Shared<T>) -> std::sync::MutexGuard<'_, T> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

struct PreprocessWorker {
    preprocess: Preprocessor,
    worker: usize,
    rejects: Option<Input<CoreOutput>>,
    reject_inputs: Shared<Vec<Option<Input<CoreOutput>>>>,
}

impl PreprocessWorker {
    fn handle(&mut self, request: &InboundOrder, out: &mut Emitter<TierInput>) {
        let mut stamps = request.stamps;
        stamps.preprocess_in_ns = now_ns();
        stamps.ready_ns = stamps.preprocess_in_ns;
        match self.preprocess.check(request) {
            Ok(routed) => out.emit(TierInput {
                instrument: routed.instrument,
                command: routed.command,
                master: MasterUpdate::None,
                stamps,
            }),
            Err(reason) => {
                let reject = CoreOutput {
                    kind: OutputKind::Rejected,
                    reason,
                    instrument: request.instrument,
                    client: request.client,
                    order_id: request.order_id,
                    price: request.price,
                    stamps,
                    ..CoreOutput::default()
                };
                let (worker, inputs) = (self.worker, &self.reject_inputs);
                let rejects = self.rejects.get_or_insert_with(|| {
                    lock(inputs)[worker]
                        .take()
                        .expect("reject inputs are handed out before the load starts")
                });
                // Err only when the pipeline aborts; the run reports that failure itself.
                let _ = rejects.send_with_ingress(reject, out.ingress_ns());
                let _ = rejects.flush();
            }
        }
    }
}

impl Drop for PreprocessWorker {
    fn drop(&mut self) {
        // A worker that never rejected still owns its reject ring: close it so the R-Processor
        // can finish.
        drop(lock(&self.reject_inputs)[self.worker].take());
    }
}

struct CoreWorker {
    shard: usize,
    state: ShardState,
    /// The sequencer of this shard's fan-in: last assigned sequence number.
    last_seq: u64,
    /// The shard's journal (`None` when off).
    journal: Option<JournalSender<ShardRecord>>,
    /// The journal writer stopped: no later reply of this shard is released.
    journal_failed: bool,
    record: bool,
    recorded: Vec<SequencedInput>,
    collected: Shared<Collected>,
}

impl CoreWorker {
    fn handle(&mut self, input: &TierInput, out: &mut Emitter<CoreOutput>) {
        if input.command == Command::Nop {
            return;
        }
        self.last_seq += 1;
        let stamps = Stamps { core_in_ns: now_ns(), ..input.stamps };
        let sequenced = SequencedInput {
            seq: self.last_seq,
            instrument: input.instrument,
            command: input.command,
            stamps,
        };
        // The journaling boundary. `group`: a ring push (no syscall; a full ring waits, which
        // is back-pressure); `sync`: also waits for the record's fsync.
        if let Some(journal) = &mut self.journal
            && !self.journal_failed
            && journal.append(ShardRecord(sequenced)).is_err()
        {
            // The writer logged and returned its error; the durable sequence stops here,
            // so the R-Processor releases no later reply of this shard.
            self.journal_failed = true;
        }
        if self.record {
            self.recorded.push(sequenced);
        }
        let shard = self.shard as u32;
        self.state.process(&sequenced, &mut |output| {
            let stamps = Stamps { ready_ns: now_ns(), ..output.stamps };
            out.emit(CoreOutput { shard, stamps, ..*output });
        });
    }
}

impl Drop for CoreWorker {
    fn drop(&mut self) {
        let result = ShardResult {
            shard: self.shard,
            output_hash: self.state.hash.hex(),
            output_records: self.state.hash.records(),
            counters: self.state.core.counters(),
            recorded: std::mem::take(&mut self.recorded),
        };
        lock(&self.collected).shards.push(result);
    }
}

struct ResponseProcessor {
    gateways: u32,
    rejects: [u64; REASON_COUNT],
    /// Per shard, the journal's durable sequence when replies are held (`group`, `sync`).
    durables: Vec<Option<Arc<DurableSeq>>>,
    wait: WaitStrategy,
    unreleased: u64,
    collected: Shared<Collected>,
}

impl ResponseProcessor {
    /// The reply hold. A shard's outputs arrive in sequence order and its durable sequence
    /// only grows, so waiting for the head output releases every reply in order with no
    /// queue of its own (the inbound ring holds the rest); the core runs on meanwhile.
    fn durable(&self, output: &CoreOutput) -> bool {
        if output.seq == 0 {
            return true; // a pre-process reject: no journaled input caused it
        }
        match self.durables.get(output.shard as usize) {
            Some(Some(durable)) => durable.wait_for(output.seq, self.wait).is_ok(),
            _ => true,
        }
    }

    fn handle(&mut self, output: &CoreOutput, out: &mut Emitter<Response>) {
        if !self.durable(output) {
            self.unreleased += 1;
            return;
        }
        let output =
            CoreOutput { stamps: Stamps { rprocess_in_ns: now_ns(), ..output.stamps }, ..*output };
        if output.kind == OutputKind::Rejected {
            self.rejects[output.reason as usize] += 1;
        }
        let market_data = matches!(output.kind, OutputKind::Trade | OutputKind::TopOfBook);
        let (audience, topic) = if market_data {
            (Audience::MarketData, output.instrument)
        } else {
            (Audience::Client, output.client)
        };
        // The core answers a request first (accepted / replaced / cancelled / rejected);
        // fills and engine cancels that follow are not answers.
        let answers_request = match output.kind {
            OutputKind::Accepted | OutputKind::Replaced | OutputKind::Rejected => true,
            OutputKind::Cancelled => output.reason == Reason::CancelRequested,
            _ => false,
        };
        out.emit(Response { audience, gateway: topic % self.gateways, answers_request, output });
    }
}

impl Drop for ResponseProcessor {
    fn drop(&mut self) {
        let mut collected = lock(&self.collected);
        for (total, count) in collected.rejects.iter_mut().zip(self.rejects) {
            *total += count;
        }
        collected.unreleased += self.unreleased;
    }
}

struct SenderWorker {
    gateways: Vec<Box<dyn Subscriber>>,
    publish_work_ns: u64,
    end_to_end: LatencyHistogram,
    critical_path: LatencyHistogram,
    stage_latency: Vec<LatencyHistogram>,
    delivered: u64,
    released: Option<Arc<ReleasedSeqs>>,
    collected: Shared<Collected>,
}

impl SenderWorker {
    fn handle(&mut self, response: &Response) {
        let sender_in_ns = now_ns();
        if self.publish_work_ns > 0 {
            while now_ns() < sender_in_ns + self.publish_work_ns {
                std::hint::spin_loop();
            }
        }
        // The by-gateway route sends each gateway's responses to one sender, in order; each
        // sender holds a subscriber slot for every gateway and uses those routed to it.
        self.gateways[response.gateway as usize].deliver(response);
        self.delivered += 1;
        if let Some(released) = &self.released
            && response.output.seq > 0
        {
            released.record(response.output.shard, response.output.seq);
        }
        if !response.answers_request {
            return;
        }
        let done_ns = now_ns();
        let s = response.output.stamps;
        self.end_to_end.record_ns(done_ns.saturating_sub(s.intended_ns));
        self.critical_path.record_ns(s.ready_ns.saturating_sub(s.intended_ns));
        if s.core_in_ns == 0 {
            return; // a pre-process reject: it skipped the core
        }
        let splits = [
            s.preprocess_in_ns.saturating_sub(s.intended_ns),
            s.core_in_ns.saturating_sub(s.preprocess_in_ns),
            s.rprocess_in_ns.saturating_sub(s.core_in_ns),
            sender_in_ns.saturating_sub(s.rprocess_in_ns),
            done_ns.saturating_sub(sender_in_ns),
        ];
        for (histogram, ns) in self.stage_latency.iter_mut().zip(splits) {
            histogram.record_ns(ns);
        }
    }
}

impl Drop for SenderWorker {
    fn drop(&mut self) {
        let mut collected = lock(&self.collected);
        collected.end_to_end.merge(&self.end_to_end);
        collected.critical_path.merge(&self.critical_path);
        for (total, part) in collected.stage_latency.iter_mut().zip(&self.stage_latency) {
            total.merge(part);
        }
        collected.delivered += self.delivered;
    }
}

/// The master-data process: the single writer of the [`SnapshotCell`]. With a journal, each
/// update it applies is journaled write-ahead (the append returns after its fdatasync) and
/// only then published, so the pre-process never acts on master data a crash could lose.
struct MasterWorker {
    cell: Arc<SnapshotCell>,
    /// The writer's own copy of the current version (what it journals and snapshots).
    state: MasterState,
    journal: Option<JournalSender<MasterRecord>>,
    last_seq: u64,
    /// The snapshotter and its interval in journaled updates.
    snapshots: Option<(Snapshotter, u64)>,
    recovery: Option<MasterRecovery>,
    journaled: u64,
    collected: Shared<Collected>,
}

impl MasterWorker {
    /// The worker over `cell` (which holds `reference`), started from the recovered master
    /// data when journaling; also returns the journal's writer, for the run to join.
    fn start(
        journal: Option<MasterJournal>,
        cell: Arc<SnapshotCell>,
        reference: MasterData,
        collected: Shared<Collected>,
    ) -> (MasterWorker, Option<JournalWriter>) {
        let mut worker = MasterWorker {
            cell,
            state: MasterState { data: reference, refused: None },
            journal: None,
            last_seq: 0,
            snapshots: None,
            recovery: None,
            journaled: 0,
            collected,
        };
        let Some(journal) = journal else {
            return (worker, None);
        };
        worker.cell.publish(journal.state.data.clone());
        worker.state = journal.state;
        worker.journal = Some(journal.sender);
        worker.last_seq = journal.last_seq;
        worker.snapshots = journal.snapshots;
        worker.recovery = Some(journal.recovery);
        (worker, Some(journal.writer))
    }

    fn handle(&mut self, input: &TierInput) {
        if input.master == MasterUpdate::None {
            return;
        }
        let mut next = self.state.data.clone();
        if let Err(why) = next.apply(&input.master) {
            tracing::warn!("master-data update {:?} refused: {why}", input.master);
            return;
        }
        if let Some(journal) = &mut self.journal {
            let record = MasterRecord { seq: self.last_seq + 1, update: input.master };
            if let Err(error) = journal.append(record) {
                // Nothing is published after a failed journal write: the pre-process keeps
                // the last durable version, and the run reports the failure.
                let why = format!(
                    "master journal stopped, update {:?} not applied: {error}",
                    input.master
                );
                lock(&self.collected).durability_errors.push(why);
                self.journal = None;
                self.recovery = None;
                return;
            }
            self.last_seq += 1;
            self.journaled += 1;
        }
        self.state.data = next;
        self.cell.publish(self.state.data.clone());
        if let Some((snapshotter, every_records)) = &mut self.snapshots
            && self.last_seq.is_multiple_of(*every_records)
        {
            snapshotter.offer(self.last_seq, &self.state);
        }
    }
}

impl Drop for MasterWorker {
    fn drop(&mut self) {
        drop(self.journal.take());
        let taken = match self.snapshots.take().map(|(snapshotter, _)| snapshotter.finish()) {
            Some(Ok(stats)) => stats.taken,
            Some(Err(error)) => {
                let why = format!("master snapshot thread stopped: {error}");
                lock(&self.collected).durability_errors.push(why);
                0
            }
            None => 0,
        };
        let Some(recovery) = self.recovery.take() else {
            return;
        };
        lock(&self.collected).master = Some(MasterReport {
            recovery,
            updates_journaled: self.journaled,
            snapshots_taken: taken,
            final_digest: self.state.digest(),
        });
    }
}

fn external_event_effect(event: &ExternalEvent, master: &MasterData) -> TierInput {
    let (instrument, command, update) = match *event {
        ExternalEvent::None => return TierInput::default(),
        ExternalEvent::Halt(instrument) | ExternalEvent::CircuitBreaker(instrument) => {
            (instrument, Command::Halt, MasterUpdate::Halted { instrument, halted: true })
        }
        ExternalEvent::Resume(instrument) => {
            (instrument, Command::Resume, MasterUpdate::Halted { instrument, halted: false })
        }
        ExternalEvent::Band { instrument, low, high } => (
            instrument,
            Command::SetBand { low, high },
            MasterUpdate::Band { instrument, low, high },
        ),
    };
    // An event for an unknown instrument has no effect on the core.
    let command = if master.instrument(instrument).is_some() { command } else { Command::Nop };
    TierInput { instrument, command, master: update, stamps: Stamps::default() }
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
    mut progress: impl FnMut(u64),
) -> anyhow::Result<RunResult> {
    config.validate()?;
    let master = reference_master_data(&config.universe);
    let collected: Shared<Collected> = Arc::new(Mutex::new(Collected {
        stage_latency: STAGE_SPLITS.iter().map(|_| LatencyHistogram::new()).collect(),
        ..Collected::default()
    }));
    let listings = master.listings();
    let limits = CoreLimits { order_pool_slots: config.order_pool_slots };
    // Kept to the end of the run: it owns the temporary data directory, if any.
    let mut journals = open_shards(
        config.journal,
        &options.journal,
        config.snapshot_every_records,
        config.core_shards,
        &listings,
        limits,
    )?;
    let master_journal = match &journals.data_dir {
        Some(dir) => {
            Some(open_master(dir, &options.journal, config.snapshot_every_records, &master)?)
        }
        None => None,
    };
    let (master_worker, master_writer) = MasterWorker::start(
        master_journal,
        SnapshotCell::new(master.clone()),
        master.clone(),
        collected.clone(),
    );
    let cell = master_worker.cell.clone();
    let durables = journals.durables.clone();
    let mut writers = Vec::new();
    let mut snapshotters = Vec::new();
    let mut recoveries = Vec::new();
    let mut shard_starts = Vec::new();
    for shard in journals.shards.drain(..) {
        writers.push(shard.writer);
        snapshotters.push(shard.snapshots);
        recoveries.push(shard.recovery);
        shard_starts.push(Some((shard.state, shard.last_seq, shard.sender)));
    }
    let shard_starts = Arc::new(Mutex::new(shard_starts));
    let reject_inputs: Shared<Vec<Option<Input<CoreOutput>>>> = Arc::new(Mutex::new(Vec::new()));
    let mut graph = PipelineBuilder::new().pin_threads(config.placement);
    let by_instrument_order = || Route::by_key(|m: &InboundOrder| u64::from(m.instrument));
    let by_instrument = || Route::by_key(|m: &TierInput| u64::from(m.instrument));

    let gateway = graph.input::<InboundOrder>("gateway", 1);
    let event_feed = graph.input::<ExternalEvent>("event-feed", 1);
    let master_feed = graph.input::<TierInput>("master-feed", 1);
    let rejects = graph.input::<CoreOutput>("rejects", config.preprocess_workers);

    let preprocess = {
        let (cell, reject_inputs) = (cell.clone(), reject_inputs.clone());
        graph.stage(
            "preprocess",
            config.spec(config.preprocess_workers, Role::Critical)?,
            move |worker| {
                let reader = cell.reader().expect("preprocess workers <= SNAPSHOT_READERS_MAX");
                let mut state = PreprocessWorker {
                    preprocess: Preprocessor::new(reader),
                    worker,
                    rejects: None,
                    reject_inputs: reject_inputs.clone(),
                };
                move |request: &InboundOrder, out: &mut Emitter<TierInput>| {
                    state.handle(request, out)
                }
            },
        )
    };
    let events = {
        let cell = cell.clone();
        graph.stage("events", config.spec(1, Role::Ancillary)?, move |_| {
            let mut reader = cell.reader().expect("one events reader");
            move |event: &ExternalEvent, out: &mut Emitter<TierInput>| {
                let effect = external_event_effect(event, reader.current());
                out.emit(effect);
            }
        })
    };
    let masterdata = {
        let master_worker = Arc::new(Mutex::new(Some(master_worker)));
        graph.sink("masterdata", config.spec(1, Role::Ancillary)?, move |_| {
            let mut worker =
                lock(&master_worker).take().expect("one master-data worker, started once");
            move |input: &TierInput| worker.handle(input)
        })
    };
    let core = {
        let collected = collected.clone();
        let record = options.record_inputs;
        graph.stage("core", config.spec(config.core_shards, Role::Critical)?, move |shard| {
            let (state, last_seq, journal) = lock(&shard_starts)[shard]
                .take()
                .expect("one recovered state per core shard, taken once");
            let mut state = CoreWorker {
                shard,
                state,
                last_seq,
                journal,
                journal_failed: false,
                record,
                recorded: Vec::new(),
                collected: collected.clone(),
            };
            move |input: &TierInput, out: &mut Emitter<CoreOutput>| state.handle(input, out)
        })
    };
    let rprocess = {
        let (collected, gateways) = (collected.clone(), config.gateways);
        let durables = if config.journal.holds_replies() { durables } else { Vec::new() };
        let wait = config.wait_strategy()?;
        graph.stage("rprocess", config.spec(1, Role::Critical)?, move |_| {
            let mut state = ResponseProcessor {
                gateways,
                rejects: [0; REASON_COUNT],
                durables: durables.clone(),
                wait,
                unreleased: 0,
                collected: collected.clone(),
            };
            move |output: &CoreOutput, out: &mut Emitter<Response>| state.handle(output, out)
        })
    };
    let senders = {
        let (collected, gateways) = (collected.clone(), config.gateways);
        let publish_work_ns = config.publish_work_ns;
        let released = options.released.clone();
        graph.sink("sender", config.spec(config.senders, Role::Critical)?, move |_| {
            let mut state = SenderWorker {
                gateways: (0..gateways)
                    .map(|_| Box::new(InProcessGateway::default()) as Box<dyn Subscriber>)
                    .collect(),
                publish_work_ns,
                end_to_end: LatencyHistogram::new(),
                critical_path: LatencyHistogram::new(),
                stage_latency: STAGE_SPLITS.iter().map(|_| LatencyHistogram::new()).collect(),
                delivered: 0,
                released: released.clone(),
                collected: collected.clone(),
            };
            move |response: &Response| state.handle(response)
        })
    };
    graph.connect(gateway, preprocess, by_instrument_order());
    graph.connect(preprocess, core, by_instrument());
    graph.connect(event_feed, events, Route::RoundRobin);
    graph.connect(events, core, by_instrument());
    graph.connect(events, masterdata, Route::RoundRobin);
    graph.connect(master_feed, masterdata, Route::RoundRobin);
    graph.connect(core, rprocess, Route::RoundRobin);
    graph.connect(rejects, rprocess, Route::RoundRobin);
    graph.connect(rprocess, senders, Route::by_key(|r: &Response| u64::from(r.gateway)));

    let mut running = graph.start()?;
    let placement_notes = running.plan().notes.clone();
    let taken = running.take_inputs(rejects).expect("rejects input");
    *lock(&reject_inputs) = taken.into_iter().map(Some).collect();
    let mut gateway_input = running.take_inputs(gateway).expect("gateway input").remove(0);
    let mut event_input = running.take_inputs(event_feed).expect("event input").remove(0);
    let mut master_input = running.take_inputs(master_feed).expect("master input").remove(0);

    let mut generator = FlowGenerator::new(config.universe, config.flow);
    let mut scenario = Scenario {
        events_every: config.events_every,
        master_every: config.master_updates_every,
        instruments: config.universe.instruments,
        step: 0,
    };
    let plan = OpenLoopPlan {
        process: config.arrival_process(options.rate_per_s)?,
        seed: config.seed,
        duration: options.duration,
    };
    let mut disconnected = false;
    let drive = drive_sync(&plan, |shot| {
        if disconnected {
            return;
        }
        let (mut request, _) = generator.next_request();
        let intended_ns = now_ns().saturating_sub(shot.latency_ns());
        request.stamps.intended_ns = intended_ns;
        if let Some(event) = scenario.event(shot.index, &master) {
            disconnected |= event_input.send(event).and_then(|()| event_input.flush()).is_err();
        }
        if let Some(update) = scenario.master_update(shot.index, &master) {
            let input = TierInput { master: update, ..TierInput::default() };
            disconnected |= master_input.send(input).and_then(|()| master_input.flush()).is_err();
        }
        disconnected |= gateway_input
            .send_with_ingress(request, intended_ns)
            .and_then(|()| gateway_input.flush())
            .is_err();
        if shot.index % 1024 == 0 {
            progress(shot.index);
        }
    })?;
    drop((gateway_input, event_input, master_input));
    let report = running.wait()?;
    anyhow::ensure!(!disconnected, "the pipeline stopped while the load was running");
    // The core workers are gone, and with them the journal senders: each writer drains,
    // syncs and stops.
    let mut journal = Vec::with_capacity(writers.len());
    for ((writer, snapshotter), recovery) in writers.into_iter().zip(snapshotters).zip(recoveries) {
        let writer = writer.map(JournalWriter::join).transpose()?;
        // The writer has published its last durable sequence: the follower catches up with
        // it, takes the snapshots due and stops.
        let snapshots = snapshotter.map(|s| s.finish()).transpose().map_err(anyhow::Error::msg)?;
        journal.push(ShardJournalReport { recovery, writer, snapshots });
    }
    master_writer.map(JournalWriter::join).transpose()?;
    drop(journals);

    let mut collected = std::mem::take(&mut *lock(&collected));
    collected.shards.sort_by_key(|s| s.shard);
    anyhow::ensure!(
        collected.durability_errors.is_empty(),
        "{}",
        collected.durability_errors.join("; ")
    );
    anyhow::ensure!(
        collected.unreleased == 0,
        "a journal writer failed: {} replies were held back for good (never released)",
        collected.unreleased
    );
    Ok(RunResult {
        rate_per_s: options.rate_per_s,
        sent: drive.sent,
        elapsed_s: drive.elapsed.as_secs_f64(),
        end_to_end: collected.end_to_end,
        critical_path: collected.critical_path,
        stage_latency: collected.stage_latency,
        send_lag: drive.send_lag,
        pipeline: report.stages,
        placement_notes,
        rejects: collected.rejects,
        shards: collected.shards,
        delivered: collected.delivered,
        journal_mode: config.journal,
        journal,
        master: collected.master,
    })
}
