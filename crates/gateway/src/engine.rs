//! The tier binding: one thread runs the exchange's pre-process checks and matching core on
//! the requests the sessions push into a `pipeline` ring, and pushes each execution report
//! into a second ring that the gateway's router drains and routes to the owning session.
//!
//! The interface is narrow on purpose: [`InboundOrder`] in, [`CoreOutput`] (client audience
//! only) out. Order ids are `client << 32 | token`, so a report names its owner and the
//! client's own order number without any lookup.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;

use exchange::core::CoreLimits;
use exchange::durability::{
    JournalMode, JournalOptions, OpenedShard, SNAPSHOT_EVERY_RECORDS_DEFAULT, ShardRecord,
    ShardRecovery, ShardState, open_shards,
};
use exchange::master::MasterData;
use exchange::msg::{ClientId, CoreOutput, InboundOrder, OrderId, OutputKind, SequencedInput};
use exchange::preprocess::check_against;
use journal::{DurableSeq, JournalSender};
use pipeline::WaitStrategy;
use pipeline::metrics::now_ns;
use pipeline::ring::{self, Consumer, Producer, RingConfig};
use tokio::sync::Notify;

/// Requests the engine reads per batch before it wakes the router.
const ENGINE_BATCH_MAX: usize = 256;

/// The tier order id of a client's order number.
pub fn order_id(client: ClientId, token: u32) -> OrderId {
    (u64::from(client) << 32) | u64::from(token)
}

/// The client order number inside a tier order id.
pub fn token_of(order_id: OrderId) -> u32 {
    order_id as u32
}

/// The gateway's ends of the engine.
pub struct EngineLink {
    /// Where sessions push requests; `Full` means the tier is busy.
    pub ingress: Producer<InboundOrder>,
    /// Execution reports, in the core's order (with the journal on: once their input is
    /// durable).
    pub egress: Consumer<CoreOutput>,
    /// Notified after reports are published on `egress`.
    pub reports_ready: Arc<Notify>,
    /// The engine thread, which also stops the journal; its result is the journal's.
    pub thread: JoinHandle<Result<(), String>>,
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

/// Starts the engine thread over `master` (a fixed snapshot: `serve` has no master-data feed).
/// With the journal on, the book state is first recovered from `journal.dir`, every sequenced
/// input is journaled (group commit, off the engine thread) before the core processes it, and
/// a release thread passes each report on only once the journal has its input on disk — the
/// tier's durable replies (`exchange::durability`), reused.
pub fn start(
    master: MasterData,
    limits: CoreLimits,
    ring_config: &RingConfig,
    journal: &EngineJournal,
) -> anyhow::Result<EngineLink> {
    let data_dir = journal.mode.policy().map(|_| journal.dir.clone());
    let options = JournalOptions { data_dir, ..JournalOptions::default() };
    let listings = master.listings();
    let mut journals =
        open_shards(journal.mode, &options, SNAPSHOT_EVERY_RECORDS_DEFAULT, 1, &listings, limits)?;
    let durable = journals.durables.pop().flatten();
    let shard = journals.shards.pop().expect("one shard opened");
    let recovery = shard.writer.as_ref().map(|_| shard.recovery.clone());
    let (ingress, mut requests) = ring::spsc::<InboundOrder>(ring_config)?;
    let (mut reports, egress) = ring::spsc::<CoreOutput>(ring_config)?;
    let reports_ready = Arc::new(Notify::new());
    let wake = reports_ready.clone();
    let taken = Arc::new(AtomicU64::new(0));
    let counted = taken.clone();
    let release = match durable {
        Some(durable) => {
            let (held, to_release) = ring::spsc::<CoreOutput>(ring_config)?;
            let release = spawn_release(to_release, reports, durable, wake.clone());
            reports = held;
            Some(release)
        }
        None => None,
    };
    let thread = std::thread::Builder::new()
        .name("gateway-engine".into())
        .spawn(move || {
            let OpenedShard { mut state, last_seq, mut sender, writer, snapshots, .. } = shard;
            let mut seq = last_seq;
            let mut handle = |request: &InboundOrder| {
                let mut step = Step { master: &master, seq: &mut seq, journal: sender.as_mut() };
                step.process(&mut state, request, &mut reports);
            };
            while let Ok(batch) = requests.wait_read_batch(ENGINE_BATCH_MAX, &mut handle) {
                // Relaxed: a statistic for the metrics; nothing is published through it.
                counted.fetch_add(batch as u64, Ordering::Relaxed);
                if release.is_none() {
                    wake.notify_one();
                }
            }
            // Shutdown: the writer drains and syncs once its sender is gone.
            drop((sender, reports));
            let written = writer.map(|w| w.join().map(|_| ()).map_err(|e| e.to_string()));
            let snapped = snapshots.map(|s| s.finish().map(|_| ()));
            if let Some(release) = release {
                let _ = release.join();
            }
            drop(journals);
            written.unwrap_or(Ok(())).and(snapped.unwrap_or(Ok(())))
        })
        .expect("spawning the engine thread");
    Ok(EngineLink { ingress, egress, reports_ready, thread, recovery, taken })
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
    fn process(
        &mut self,
        state: &mut ShardState,
        request: &InboundOrder,
        reports: &mut Producer<CoreOutput>,
    ) {
        let mut send = |output: &CoreOutput| {
            if matches!(output.kind, OutputKind::Trade | OutputKind::TopOfBook) {
                return; // market data: no subscriber in `serve`
            }
            let mut output = *output;
            output.stamps.ready_ns = now_ns();
            // Err only when the router is gone (shutdown); nothing is left to answer.
            let _ = reports.push_batch(std::slice::from_ref(&output));
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
