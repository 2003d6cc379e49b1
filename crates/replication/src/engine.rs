//! One engine of a shard's group: the tier fed from the shard's input log, its R-Senders
//! publishing over NATS only while this engine holds the shard's lease.
//!
//! ```text
//!  snapshot store ──newest snapshot (start)──▶ tier, replica, publisher numbering
//!  follower thread ──queue (FOLLOW_QUEUE_SLOTS)──▶ tier source → pre-process → core → senders
//!   (stream order) └─queue──▶ snapshot replica ──every N, leader──▶ store, then trim  │
//!  lease task: acquire / renew, note progress ──opens or closes──▶ publish gate ◀── publisher
//! ```
//!
//! Every engine of the group applies every input (a hot standby) and sequences and retains
//! every output the same way; only the leader's gate is open. A standby that takes the lease
//! publishes from where its tier is; the gateways' delivery edges recover what the old leader never sent from the
//! new leader's retained window (the per-subject sequence continues: one instance id per
//! group). The engine keeps no journal of its own: the replicated stream, and the snapshot
//! below which it is trimmed (`crate::snapshot`), are the durable input.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TryRecvError, TrySendError};
use std::time::{Duration, Instant};

use delivery::clock::{EpochOffset, monotonic_ns};
use delivery::nats::NatsConnect;
use delivery::publish::{
    NatsPublisher, PublishGate, PublishOptions, PublishReport, PublisherGroup,
};
use exchange::durability::{JournalMode, JournalOptions, ShardRestore};
use exchange::msg::InboundOrder;
use exchange::tier::{OrderSource, Tier, TierConfig, TierStart};
use pipeline::metrics::now_ns;
use pipeline::stage::{Emitter, Flow};

use crate::error::ReplicationError;
use crate::fingerprint::Fingerprint;
use crate::follow::{Follower, LoggedOrder};
use crate::layout::LogSettings;
use crate::lease::{Lease, LeaseSettings};
use crate::replay::{GroupReplica, Regenerator};
use crate::snapshot::{EngineSnapshot, SnapshotStore};

/// Inputs queued between the follower thread and the tier's source.
pub const FOLLOW_QUEUE_SLOTS: usize = 8192;
/// Most inputs the source emits per call (one ring batch).
const SOURCE_BATCH_MAX: usize = 256;
/// How long the source waits for an input before returning to the tier's loop.
const SOURCE_IDLE_WAIT: Duration = Duration::from_millis(1);
/// How often the snapshot replica looks for queued inputs when it has caught up.
const SNAPSHOT_POLL: Duration = Duration::from_millis(1);
/// How many times a starting engine reads the newest snapshot again because the log was
/// trimmed past the one it read (each trim follows a newer snapshot).
const RESTORE_TRIES: u32 = 5;

/// How to run one engine.
#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// The NATS servers (comma-separated URLs of a cluster).
    pub nats: NatsConnect,
    /// The input log's layout.
    pub log: LogSettings,
    /// The lease's bucket and timing.
    pub lease: LeaseSettings,
    /// The shard this engine books.
    pub shard: u32,
    /// This engine's name in the lease (host and process).
    pub holder: String,
    /// The tier (its journal is switched off: the stream is the durable input; it runs one
    /// pre-process worker and one core shard, so its outputs follow the log's order). Its
    /// `snapshot_every_records` is how many inputs apart the leader writes the shard's
    /// snapshot (0: never; the log is then never trimmed).
    pub tier: TierConfig,
    /// How its R-Senders publish (`outlets` = `tier.outlets`; the subject prefix is the
    /// shard's, [`LogSettings::publish_prefix`]).
    pub publish: PublishOptions,
    /// The order rate the tier's layout is planned for, orders/s.
    pub planned_rate_per_s: f64,
}

/// What every thread of the engine shares. Each atomic is a counter or a status flag read on
/// its own (metrics, the lease's log lines, the stop request polled in loops): no other data is
/// published through one, so every access is `Relaxed`; what is published is decided by the
/// publish gate, which has its own argument.
#[derive(Debug, Default)]
struct EngineState {
    /// The last stream sequence whose every record was handed to the tier.
    applied_seq: AtomicU64,
    leads: AtomicBool,
    /// The epoch of the last leadership this engine took (0: none yet).
    epoch: AtomicU64,
    /// Times this engine took the lease.
    leaderships: AtomicU64,
    /// The input-log sequence of the last snapshot this engine wrote.
    snapshot_seq: AtomicU64,
    /// The input-log sequence of the snapshot it started from (0: the log's beginning).
    restored_seq: AtomicU64,
    stop: AtomicBool,
    /// The follower's error, if it stopped on one.
    failure: std::sync::Mutex<Option<String>>,
}

/// A running engine.
pub struct Engine {
    runtime: tokio::runtime::Runtime,
    tier: Option<Tier>,
    publisher: NatsPublisher,
    state: Arc<EngineState>,
    lease_task: Option<tokio::task::JoinHandle<()>>,
    notes_task: Option<tokio::task::JoinHandle<()>>,
    follower: Option<std::thread::JoinHandle<()>>,
    snapshots: Option<std::thread::JoinHandle<()>>,
    stop_follower: Arc<tokio::sync::Notify>,
    client: async_nats::Client,
}

/// What a stopped engine reports.
#[derive(Clone, Debug)]
pub struct EngineStopped {
    /// The last stream sequence the tier applied.
    pub applied_seq: u64,
    /// What its publisher did (records withheld while standing by included).
    pub published: PublishReport,
    /// Responses the tier's R-Senders delivered to the publisher.
    pub delivered: u64,
}

impl Engine {
    /// Connects, restores the shard's newest snapshot (if one was written), starts following
    /// the shard's stream after it, starts the tier on it and contends for the lease.
    pub fn start(options: EngineOptions) -> Result<Engine, ReplicationError> {
        options.log.validate()?;
        options.lease.validate()?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(format!("engine-{}-io", options.shard))
            .enable_all()
            .build()
            .map_err(|e| ReplicationError::Server(format!("engine runtime: {e}")))?;
        let client = runtime.block_on(delivery::nats::connect(&options.nats, "engine"));
        let client = client.map_err(|e| ReplicationError::jetstream("connecting", e))?;
        let store = runtime.block_on(SnapshotStore::open(client.clone(), &options.log))?;
        let fingerprint = Fingerprint::of(&options.tier);
        let lease_holder = format!("{} {}", options.holder, fingerprint.to_text());
        let lease = Lease::open(client.clone(), &options.lease, options.shard, &lease_holder);
        let lease = runtime.block_on(lease)?;
        runtime.block_on(check_group(&fingerprint, &lease, &store, options.shard))?;
        let start = runtime.block_on(starting_point(&store, &options))?;
        let after_seq = start.as_ref().map_or(0, |snapshot| snapshot.stream_seq);
        let gate = PublishGate::closed();
        let fenced_store = (store.clone(), gate.clone(), fingerprint.to_text());
        let taker = SnapshotTaker::new(&options, start.as_ref(), fenced_store, &runtime)?;
        let next_seqs = start.as_ref().map(|s| s.next_seqs.clone()).unwrap_or_default();
        let publisher = start_publisher(&options, (&client, &store), next_seqs, gate.clone())?;
        let follower = Follower::open(client.clone(), &options.log, options.shard, after_seq + 1);
        let follower = runtime.block_on(follower)?;
        let state = Arc::new(EngineState::default());
        // Relaxed: progress figures.
        state.applied_seq.store(after_seq, Ordering::Relaxed);
        state.restored_seq.store(after_seq, Ordering::Relaxed);
        let (queue, inputs) = std::sync::mpsc::sync_channel(FOLLOW_QUEUE_SLOTS);
        let (snapshot_queue, snapshot_inputs) = std::sync::mpsc::sync_channel(FOLLOW_QUEUE_SLOTS);
        let stop_follower = Arc::new(tokio::sync::Notify::new());
        let queues = [queue, snapshot_queue];
        let follow = spawn_follower(follower, queues, state.clone(), stop_follower.clone());
        let snapshots = spawn_snapshots(taker, snapshot_inputs, state.clone());
        let restore =
            start.map(|s| ShardRestore { last_seq: s.core_seq, snapshot: Arc::new(s.state) });
        let source = log_source(inputs, state.clone());
        let tier = start_tier(&options, publisher.subscribers(), source, restore)?;
        let progress = Progress { store, shard: options.shard, holder: options.holder.clone() };
        let every = options.lease.renew_every;
        let notes_task = runtime.spawn(note_progress(progress, every, state.clone()));
        let lease_task = runtime.spawn(keep_lease(lease, every, gate, state.clone(), fingerprint));
        Ok(Engine {
            runtime,
            tier: Some(tier),
            publisher,
            state,
            lease_task: Some(lease_task),
            notes_task: Some(notes_task),
            follower: Some(follow),
            snapshots: Some(snapshots),
            stop_follower,
            client,
        })
    }

    /// Whether this engine leads (holds the lease and publishes).
    pub fn leads(&self) -> bool {
        // Relaxed: a status flag for callers; the gate decides what is published.
        self.state.leads.load(Ordering::Relaxed)
    }

    /// The last stream sequence whose every record was handed to the tier.
    pub fn applied_seq(&self) -> u64 {
        // Relaxed: a progress figure.
        self.state.applied_seq.load(Ordering::Relaxed)
    }

    /// The input-log sequence of the last snapshot this engine wrote (0: none).
    pub fn snapshot_seq(&self) -> u64 {
        // Relaxed: a progress figure.
        self.state.snapshot_seq.load(Ordering::Relaxed)
    }

    /// The input-log sequence of the snapshot it started from (0: the log's beginning).
    pub fn restored_seq(&self) -> u64 {
        // Relaxed: set before the engine was handed out.
        self.state.restored_seq.load(Ordering::Relaxed)
    }

    /// Whether it serves its part: following the log (no failure) over a live NATS connection
    /// (what `/ready` says).
    pub fn is_ready(&self) -> bool {
        let connected = self.client.connection_state() == async_nats::connection::State::Connected;
        connected && self.failure().is_none()
    }

    /// Adds the engine's metrics to `registry` (docs/REPLICATION.md, "Monitor").
    pub fn register_metrics(&self, registry: &mut ops::Registry) {
        let state = Arc::clone(&self.state);
        // Relaxed: progress figures (see the fields).
        let applied = move || state.applied_seq.load(Ordering::Relaxed) as i64;
        let help = "the last input-log sequence handed to the tier";
        registry.register("engine_applied_input_seq", help, ops::read::gauge(applied));
        let state = Arc::clone(&self.state);
        let leads = move || i64::from(state.leads.load(Ordering::Relaxed));
        let help = "1 while this engine holds its shard's lease and publishes";
        registry.register("engine_leader", help, ops::read::gauge(leads));
        let state = Arc::clone(&self.state);
        let taken = move || state.leaderships.load(Ordering::Relaxed);
        let help = "times this engine took its shard's lease";
        registry.register("engine_lease_taken", help, ops::read::counter(taken));
        let state = Arc::clone(&self.state);
        let snapshot = move || state.snapshot_seq.load(Ordering::Relaxed) as i64;
        let help = "the input-log sequence of the last snapshot this engine wrote";
        registry.register("engine_snapshot_input_seq", help, ops::read::gauge(snapshot));
    }

    /// Why the follower stopped, if it failed (a hole in the stream, a bad record).
    pub fn failure(&self) -> Option<String> {
        self.state.failure.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Stops: gives the lease up (a standby takes it at once), stops following, drains the
    /// tier and the publisher.
    pub fn stop(mut self) -> Result<EngineStopped, ReplicationError> {
        // Relaxed: the source and the lease task poll it; nothing rides on it.
        self.state.stop.store(true, Ordering::Relaxed);
        if let Some(task) = self.lease_task.take() {
            let _ = self.runtime.block_on(task);
        }
        if let Some(task) = self.notes_task.take() {
            let _ = self.runtime.block_on(task);
        }
        self.stop_follower.notify_one();
        if let Some(follower) = self.follower.take() {
            let _ = follower.join();
        }
        // The follower is gone, so its queue is closed: the snapshot thread ends.
        if let Some(snapshots) = self.snapshots.take() {
            let _ = snapshots.join();
        }
        let tier = self.tier.take().expect("a running engine has its tier");
        let stopped = tier
            .stop()
            .map_err(|e| ReplicationError::jetstream("stopping the tier", format!("{e:#}")))?;
        let published = self.publisher.drain();
        let published =
            published.map_err(|e| ReplicationError::jetstream("draining", format!("{e:#}")))?;
        Ok(EngineStopped {
            applied_seq: self.applied_seq(),
            published,
            delivered: stopped.delivered,
        })
    }
}

/// The group's publisher instance id: the same for every engine of the shard's group (from
/// the prefix and shard), so gateways take a new leader's records as the same sequence's.
/// A stable hash ([`crate::fingerprint::stable_hash`]): engines built apart agree on it.
fn group_instance(options: &EngineOptions) -> u64 {
    let name = format!("{}/{}/engine-group", options.log.prefix, options.shard);
    crate::fingerprint::stable_hash(name.as_bytes())
}

/// The engine's publisher: a member of the shard's group (its instance id, numbering from
/// `next_seqs`, publishing while `gate` is open), recomputing reports older than its window
/// from the snapshots in `store` and the log.
fn start_publisher(
    options: &EngineOptions,
    (client, store): (&async_nats::Client, &SnapshotStore),
    next_seqs: Vec<u64>,
    gate: Arc<PublishGate>,
) -> Result<NatsPublisher, ReplicationError> {
    let (log, shard, tier) = (&options.log, options.shard, &options.tier);
    let regenerate = Regenerator::new(client.clone(), store.clone(), log, shard, tier);
    let group = PublisherGroup {
        instance: group_instance(options),
        gate,
        next_seqs,
        regenerate: Some(Arc::new(regenerate)),
    };
    let publish = PublishOptions { prefix: log.publish_prefix(shard), ..options.publish.clone() };
    NatsPublisher::connect_in_group(publish, group)
        .map_err(|e| ReplicationError::jetstream("starting the publisher", format!("{e:#}")))
}

fn start_tier(
    options: &EngineOptions,
    subscribers: exchange::tier::SubscriberFactory,
    source: OrderSource,
    restore: Option<ShardRestore>,
) -> Result<Tier, ReplicationError> {
    let tier = &options.tier;
    if tier.preprocess_workers != 1 || tier.core_shards != 1 {
        tracing::info!(
            "engine: one pre-process worker and one core shard (configured {} and {}), so every \
             engine of the group numbers its outputs alike; shards scale the engine",
            tier.preprocess_workers,
            tier.core_shards
        );
    }
    let config = TierConfig {
        journal: JournalMode::OFF,
        hold_replies: false,
        preprocess_workers: 1,
        core_shards: 1,
        ordered_outputs: true,
        ..tier.clone()
    };
    // No generator: the log is the tier's source.
    let journal = JournalOptions { restore, ..JournalOptions::default() };
    let start =
        TierStart { journal, ..TierStart::new(config, options.planned_rate_per_s, subscribers) };
    Tier::start_with_source(start, source)
        .map_err(|e| ReplicationError::jetstream("starting the tier", format!("{e:#}")))
}

/// Reads the stream on a thread of its own, queueing each input for the tier and for the
/// snapshot replica (a full queue holds the follower back: the stream keeps what they have not
/// taken yet).
fn spawn_follower(
    mut follower: Follower,
    queues: [SyncSender<LoggedOrder>; 2],
    state: Arc<EngineState>,
    stop: Arc<tokio::sync::Notify>,
) -> std::thread::JoinHandle<()> {
    let follow = async move {
        loop {
            let next = tokio::select! {
                next = follower.next() => next,
                () = stop.notified() => return,
            };
            let logged = match next {
                Some(Ok(logged)) => logged,
                Some(Err(error)) => return fail(&state, error.to_string()),
                None => return fail(&state, "the stream's consumer ended".into()),
            };
            for queue in &queues {
                if !hand_on(queue, logged, &stop).await {
                    return;
                }
            }
        }
    };
    std::thread::Builder::new()
        .name("engine-follow".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
            runtime.expect("a current-thread runtime").block_on(follow);
        })
        .expect("spawning the follower thread")
}

/// Queues `logged`, waiting while the queue is full; `false` once the engine stops.
async fn hand_on(
    queue: &SyncSender<LoggedOrder>,
    logged: LoggedOrder,
    stop: &tokio::sync::Notify,
) -> bool {
    let mut pending = logged;
    loop {
        match queue.try_send(pending) {
            Ok(()) => return true,
            Err(TrySendError::Full(back)) => pending = back,
            Err(TrySendError::Disconnected(_)) => return false,
        }
        tokio::select! {
            () = tokio::time::sleep(SOURCE_IDLE_WAIT) => {}
            () = stop.notified() => return false,
        }
    }
}

/// Refuses to start an engine whose outputs would differ from its group's: the lease holder's
/// fingerprint must equal its own, release included; the newest snapshot's settings too (a
/// snapshot of another release is how a group is upgraded). An earlier release's holder or
/// snapshot, which carries none, is not refused.
async fn check_group(
    fingerprint: &Fingerprint,
    lease: &Lease,
    store: &SnapshotStore,
    shard: u32,
) -> Result<(), ReplicationError> {
    if let Some(held) = lease.holder().await?.as_deref().and_then(Fingerprint::find_in) {
        fingerprint.admits(&held, &format!("shard {shard}'s lease holder"), true)?;
    }
    if let Some(stored) = store.latest_fingerprint(shard).await? {
        fingerprint.admits(&stored, &format!("shard {shard}'s newest snapshot"), false)?;
    }
    Ok(())
}

/// Where a starting engine begins: the shard's newest snapshot (`None`: the log's first
/// record), once its progress note holds the log from being trimmed past it.
async fn starting_point(
    store: &SnapshotStore,
    options: &EngineOptions,
) -> Result<Option<EngineSnapshot>, ReplicationError> {
    let shard = options.shard;
    for _ in 0..RESTORE_TRIES {
        let snapshot = store.latest(shard).await?;
        let after_seq = snapshot.as_ref().map_or(0, |snapshot| snapshot.stream_seq);
        store.note_progress(shard, &options.holder, after_seq).await?;
        let first_seq = store.first_seq(shard).await?;
        if first_seq <= after_seq + 1 {
            if after_seq > 0 {
                tracing::info!("engine: restored shard {shard} at input sequence {after_seq}");
            }
            return Ok(snapshot);
        }
        tracing::info!("engine: the log starts at {first_seq}, past snapshot {after_seq}");
    }
    Err(ReplicationError::Gap {
        stream: options.log.stream(shard),
        expected: 1,
        found: store.first_seq(shard).await?,
    })
}

/// The snapshot replica: applies every input as the tier does, and writes a snapshot every
/// `every` inputs while this engine leads.
struct SnapshotTaker {
    replica: GroupReplica,
    taken_seq: u64,
    every: u64,
    store: SnapshotStore,
    /// The engine's publish gate: open only while it leads, which a trim checks first.
    gate: Arc<PublishGate>,
    /// The group fingerprint's text, each snapshot's description.
    fingerprint: String,
    shard: u32,
    holder: String,
    runtime: tokio::runtime::Handle,
}

impl SnapshotTaker {
    fn new(
        options: &EngineOptions,
        start: Option<&EngineSnapshot>,
        (store, gate, fingerprint): (SnapshotStore, Arc<PublishGate>, String),
        runtime: &tokio::runtime::Runtime,
    ) -> Result<SnapshotTaker, ReplicationError> {
        let replica = GroupReplica::starting(&options.tier, start)?;
        let (every, shard) = (options.tier.snapshot_every_records, options.shard);
        let (holder, runtime) = (options.holder.clone(), runtime.handle().clone());
        let taken_seq = replica.applied_seq();
        Ok(SnapshotTaker {
            replica,
            taken_seq,
            every,
            store,
            gate,
            fingerprint,
            shard,
            holder,
            runtime,
        })
    }

    fn apply(&mut self, logged: &LoggedOrder) {
        self.replica.apply(logged, &mut |_, _, _| {});
    }

    /// Whether a snapshot is due after `logged` (only ever after a whole message).
    fn due(&self, logged: &LoggedOrder) -> bool {
        let every = self.every;
        logged.last_in_message && every > 0 && self.replica.applied_seq() - self.taken_seq >= every
    }

    /// Writes the snapshot after the last applied input, then trims the log below it.
    fn write(&mut self, state: &EngineState) {
        let snapshot = self.replica.snapshot();
        self.taken_seq = snapshot.stream_seq;
        let (store, shard, holder) = (&self.store, self.shard, self.holder.as_str());
        let gate = &self.gate;
        let written = self.runtime.block_on(async {
            store.put(shard, &snapshot, &self.fingerprint).await?;
            // Its own note, fresh: the follower has read at least this far.
            store.note_progress(shard, holder, snapshot.stream_seq).await?;
            // A deposed leader never trims: its snapshot may be older than the successor's
            // progress assumes (the notes bound a trim, but only the leader's view is current).
            if !gate.is_open() {
                return Err(ReplicationError::Deposed("trimming the log"));
            }
            store.trim(shard, snapshot.stream_seq).await
        });
        match written {
            Ok(first_seq) => {
                // Relaxed: a progress figure.
                state.snapshot_seq.store(snapshot.stream_seq, Ordering::Relaxed);
                tracing::info!(
                    "engine: snapshot of shard {shard} at input sequence {}; the log starts at {first_seq}",
                    snapshot.stream_seq
                );
            }
            Err(error) => tracing::warn!("engine: snapshot of shard {shard}: {error}"),
        }
    }
}

/// Runs the snapshot replica on a thread of its own until the follower closes its queue.
fn spawn_snapshots(
    mut taker: SnapshotTaker,
    inputs: Receiver<LoggedOrder>,
    state: Arc<EngineState>,
) -> std::thread::JoinHandle<()> {
    // Polled, not waited on: the replica is off the critical path, so it takes what queued
    // up every `SNAPSHOT_POLL` and the follower never pays a wake-up per input.
    let run = move || {
        loop {
            let logged = match inputs.try_recv() {
                Ok(logged) => logged,
                Err(TryRecvError::Empty) => {
                    std::thread::sleep(SNAPSHOT_POLL);
                    continue;
                }
                Err(TryRecvError::Disconnected) => return,
            };
            taker.apply(&logged);
            // Relaxed: a status flag; a snapshot written by a leader that just lost the lease
            // is as good as its successor's.
            if taker.due(&logged) && state.leads.load(Ordering::Relaxed) {
                taker.write(&state);
            }
        }
    };
    std::thread::Builder::new()
        .name("engine-snapshots".into())
        .spawn(run)
        .expect("spawning the snapshot thread")
}

fn fail(state: &EngineState, why: String) {
    tracing::error!("engine: following the input log stopped: {why}");
    *state.failure.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(why);
}

/// The tier's order source: the queued inputs in stream order, each with its client's
/// intended send time on the tier's clock.
fn log_source(inputs: Receiver<LoggedOrder>, state: Arc<EngineState>) -> OrderSource {
    let epoch = EpochOffset::measure().absolute(0);
    OrderSource::turns(move |out: &mut Emitter<InboundOrder>| {
        // Relaxed: see `Engine::stop`.
        if state.stop.load(Ordering::Relaxed) {
            return Flow::Stop;
        }
        let first = match inputs.recv_timeout(SOURCE_IDLE_WAIT) {
            Ok(first) => first,
            Err(RecvTimeoutError::Timeout) => return Flow::Continue,
            Err(RecvTimeoutError::Disconnected) => return Flow::Stop,
        };
        let mut next = Some(first);
        let mut emitted = 0;
        while let Some(logged) = next {
            let mut order = logged.order;
            order.stamps.intended_ns = match logged.intended_abs_ns {
                0 => now_ns(),
                abs_ns => abs_ns.saturating_sub(epoch),
            };
            out.emit_with_ingress(order, order.stamps.intended_ns);
            if logged.last_in_message {
                // Relaxed: a progress figure.
                state.applied_seq.store(logged.stream_seq, Ordering::Relaxed);
            }
            emitted += 1;
            next = if emitted < SOURCE_BATCH_MAX { inputs.try_recv().ok() } else { None };
        }
        Flow::Continue
    })
}

/// Where an engine notes how far it applied its shard's log.
struct Progress {
    store: SnapshotStore,
    shard: u32,
    holder: String,
}

/// Notes the engine's progress every `every` until it stops, on a task of its own: a slow
/// JetStream answer (up to its 5 s timeout) delays a note, never a lease renewal.
async fn note_progress(progress: Progress, every: Duration, state: Arc<EngineState>) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Relaxed: see `Engine::stop`.
    while !state.stop.load(Ordering::Relaxed) {
        ticks.tick().await;
        let applied = state.applied_seq.load(Ordering::Relaxed);
        if let Err(error) =
            progress.store.note_progress(progress.shard, &progress.holder, applied).await
        {
            tracing::debug!("engine progress: {error}");
        }
    }
}

/// Holds or contends for the lease until the engine stops or its follower fails, keeping the
/// gate open exactly while the lease is valid and stamped with the leadership's epoch; then
/// releases the lease (its own write only: see `Lease::release`). A tick waits on nothing but
/// the lease's own write, bounded by the renewal period.
async fn keep_lease(
    mut lease: Lease,
    every: Duration,
    gate: Arc<PublishGate>,
    state: Arc<EngineState>,
    fingerprint: Fingerprint,
) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Relaxed: see `Engine::stop`.
    while !state.stop.load(Ordering::Relaxed) {
        ticks.tick().await;
        if state.failure.lock().unwrap_or_else(std::sync::PoisonError::into_inner).is_some() {
            // Its tier no longer follows the log: a healthy standby must lead, at once.
            tracing::error!("engine: no longer following the input log: giving the lease up");
            break;
        }
        let held = lease.valid_until().is_some();
        let outcome = if held { lease.renew().await } else { lease.try_acquire().await };
        match &outcome {
            Err(error) => tracing::debug!("engine lease: {error}"),
            Ok(false) => follow_alike(&lease, &fingerprint, &state).await,
            Ok(true) => {}
        }
        let leads = match (lease.valid_until(), lease.epoch()) {
            (Some(until), Some(epoch)) => {
                gate.open_until(abs_ns_of(until), epoch);
                // Relaxed: a figure for metrics and the snapshot thread's trim fence.
                state.epoch.store(epoch, Ordering::Relaxed);
                true
            }
            _ => {
                gate.close();
                false
            }
        };
        log_leadership(&state, leads);
    }
    gate.close();
    // Relaxed: a status flag (the gate, closed above, decides what is published).
    state.leads.store(false, Ordering::Relaxed);
    if let Err(error) = lease.release().await {
        tracing::warn!("engine: releasing the lease: {error}");
    }
}

/// A standby that finds the lease held by an engine with another fingerprint stops following
/// (its outputs would differ from the leader's): the failure is reported, `/ready` turns false.
async fn follow_alike(lease: &Lease, fingerprint: &Fingerprint, state: &EngineState) {
    let Ok(Some(holder)) = lease.holder().await else { return };
    let Some(held) = Fingerprint::find_in(&holder) else { return };
    if let Err(error) = fingerprint.admits(&held, "the lease holder", true) {
        fail(state, error.to_string());
    }
}

/// Sets the `leads` flag and logs a change of leadership once.
fn log_leadership(state: &EngineState, leads: bool) {
    // Relaxed: a status flag (the gate decides what is published).
    let was_leading = state.leads.swap(leads, Ordering::Relaxed);
    let applied = state.applied_seq.load(Ordering::Relaxed);
    match (was_leading, leads) {
        (false, true) => {
            state.leaderships.fetch_add(1, Ordering::Relaxed);
            let epoch = state.epoch.load(Ordering::Relaxed);
            tracing::info!("engine: took the lease (epoch {epoch}) at input sequence {applied}");
        }
        (true, false) => tracing::warn!("engine: lost the lease at input sequence {applied}"),
        _ => {}
    }
}

/// `at` as absolute `CLOCK_MONOTONIC` ns (what [`PublishGate`] compares with).
fn abs_ns_of(at: Instant) -> u64 {
    let ahead = at.saturating_duration_since(Instant::now());
    monotonic_ns() + ahead.as_nanos() as u64
}
