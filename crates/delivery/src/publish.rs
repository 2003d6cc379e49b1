//! The NATS half of the R-Senders: each sender hands its responses to a publisher thread
//! through one ring per outlet (a ring push: no allocation, lock or system call); the
//! publisher drains what is there, encoding each response once, straight from its ring slot
//! into the outgoing batch of its subject, and publishes the drained batch as ONE NATS
//! message per subject. The batch as sent (a `Bytes` the client's queue shares) is the
//! retained window's entry too: sequencing and retaining cost no per-record copy, and the
//! subject's lock is taken once per batch. The client's connection task writes every queued
//! publish with one vectored write, so nothing is flushed per message. A heartbeat per subject (its next
//! sequence, every `heartbeat`) lets an edge see a lost tail; edges recover gaps from the
//! retained window over request/reply.
//!
//! Publishing never waits for an unreachable broker: while the client is reconnecting a batch
//! stays only in the retained window, is counted as unsent, and the edges recover it from
//! the window once the connection is back. While connected, a full client queue is
//! back-pressure (bounded by `PUBLISH_WAIT_MAX`).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use exchange::msg::Response;
use exchange::tier::{Subscriber, SubscriberFactory};
use futures_util::StreamExt;
use pipeline::ConnectorKind;
use pipeline::connector::{Receiver, Sender, connector_with};
use pipeline::ring::RingConfig;
use pipeline::wait::{Parker, WaitStrategy, Waiter};

use crate::clock::{EpochOffset, monotonic_ns};
use crate::entropy::{Entropy, OsEntropy};
use crate::error::{DeliveryError, Result, io_failed, nats_failed};
use crate::nats::{NatsConnect, connect};
use crate::subjects::{CONNECT_TIMEOUT, data_subject, parse_retain_subject};
use crate::wire::{
    BATCH_HEADER_BYTES, BATCH_RECORDS_MAX, BatchHeader, RECORD_BYTES, Record, RetainRequest, Stream,
};

/// Records kept per subject for gap recovery, by default.
pub const RETAIN_RECORDS_DEFAULT: usize = 8192;
/// Most records a subject's window may keep (85 MiB of records per subject).
pub const RETAIN_RECORDS_MAX: usize = 1 << 20;
/// Slots of each sender -> publisher ring (one per sender and outlet).
pub const PUBLISHER_RING_SLOTS: usize = 512;
/// How often every subject announces its next sequence, by default.
pub const HEARTBEAT_INTERVAL_DEFAULT: Duration = Duration::from_millis(50);
/// Longest a publisher thread waits for room in a connected client's queue before the batch is
/// left to the window (the edges then recover it).
pub const PUBLISH_WAIT_MAX: Duration = Duration::from_millis(100);
/// Most outlets a publisher serves (subjects are allocated up front).
pub const OUTLETS_MAX: u32 = 1024;
/// Bytes a subject's batch buffer allocates at a time: its batches are split off it (sharing
/// the allocation), so the allocator is called about once per this many bytes of the subject's
/// records, not per batch. A retained window pins the buffers its batches lie in: as they are
/// the subject's own and consecutive, at most its records' bytes and two buffers more.
const BATCH_BUFFER_BYTES: usize = 64 * 1024;

/// How the R-Senders publish.
#[derive(Clone, Debug)]
pub struct PublishOptions {
    pub nats: NatsConnect,
    /// First token of every subject (see [`crate::subjects`]).
    pub prefix: String,
    /// Outlets of the tier (`TierConfig::outlets`).
    pub outlets: u32,
    /// Records kept per subject for recovery (1..=[`RETAIN_RECORDS_MAX`]).
    pub retain_records: usize,
    /// How a publisher thread waits for its rings (and a sender on a full ring).
    pub wait: WaitStrategy,
    pub heartbeat: Duration,
}

/// What the publishers did (all counters since `connect`).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct PublishReport {
    /// Records handed to the NATS client (in batches).
    pub published: u64,
    pub batches: u64,
    /// Records whose batch the client could not take (kept in the window only).
    pub unsent: u64,
    /// Records sequenced and retained while this group member did not lead (not sent).
    pub withheld: u64,
    pub heartbeats: u64,
    pub retain_requests: u64,
    /// Records served from the retained windows.
    pub retained_served: u64,
    /// Records served recomputed by the group ([`Regenerate`]), older than the windows.
    pub regenerated_served: u64,
    /// Retain requests answered "nothing yet" because a regeneration failed to read what it
    /// needs ([`RegeneratedAnswer::Retry`]): the edge asks again.
    pub regenerations_failed: u64,
    /// Per subject, the next sequence it will assign (outlet-major, then stream).
    pub next_seqs: Vec<u64>,
}

/// One subject's retained window: the batches last published (each the payload as sent,
/// header included, shared with the client's queue), as many as hold the last `capacity`
/// records by sequence. Retaining a batch stores a reference, never a copy of its records.
struct Window {
    /// The first sequence this window ever held: 1, or where a restored publisher continues.
    first_seq: u64,
    next_seq: u64,
    /// Records served: the last `capacity` (the oldest batch kept may hold a few older ones).
    capacity: usize,
    /// Oldest first; consecutive sequences, the last one ending before `next_seq`.
    batches: VecDeque<RetainedBatch>,
    /// Records in `batches`.
    held: usize,
    /// The sender that publishes this subject; one writer per subject keeps the sequence
    /// gap-free, so a second one is a routing bug.
    owner: Option<usize>,
}

/// A published batch: its first sequence and its payload (header, then whole records).
struct RetainedBatch {
    first_seq: u64,
    payload: Bytes,
}

impl RetainedBatch {
    fn count(&self) -> usize {
        (self.payload.len() - BATCH_HEADER_BYTES) / RECORD_BYTES
    }

    /// The record at `seq` (inside this batch).
    fn record(&self, seq: u64) -> &[u8] {
        let at = BATCH_HEADER_BYTES + (seq - self.first_seq) as usize * RECORD_BYTES;
        &self.payload[at..at + RECORD_BYTES]
    }
}

impl Window {
    /// An empty window whose next record takes `next_seq`. Its batch list is allocated for
    /// the worst case (a record per batch), so retaining never allocates.
    fn continuing_at(capacity: usize, next_seq: u64) -> Window {
        let batches = VecDeque::with_capacity(capacity + 1);
        Window { first_seq: next_seq, next_seq, capacity, batches, held: 0, owner: None }
    }

    fn claim(&mut self, sender: usize) {
        let owner = *self.owner.get_or_insert(sender);
        assert_eq!(owner, sender, "two R-Senders publish one subject: its sequence would fork");
    }

    /// Keeps `payload` (a batch of `count` records numbered from `next_seq` on), dropping the
    /// oldest batches the last `capacity` records no longer need.
    fn retain(&mut self, payload: Bytes) {
        let batch = RetainedBatch { first_seq: self.next_seq, payload };
        let count = batch.count();
        if count == 0 {
            return;
        }
        self.next_seq += count as u64;
        self.held += count;
        self.batches.push_back(batch);
        while let Some(oldest) = self.batches.front() {
            if self.held - oldest.count() < self.capacity {
                break;
            }
            self.held -= oldest.count();
            self.batches.pop_front();
        }
    }

    fn oldest(&self) -> u64 {
        self.next_seq.saturating_sub(self.capacity as u64).max(self.first_seq)
    }

    /// The records `first..first + count` (all within `oldest()..next_seq`), in order.
    fn records(&self, first: u64, count: usize) -> impl Iterator<Item = &[u8]> {
        let from = self.batches.partition_point(|batch| batch.first_seq <= first).max(1) - 1;
        let seqs = first..first + count as u64;
        self.batches.range(from..).flat_map(move |batch| {
            let end = batch.first_seq + batch.count() as u64;
            let inside = seqs.start.max(batch.first_seq)..seqs.end.min(end);
            inside.map(move |seq| batch.record(seq))
        })
    }
}

struct SubjectState {
    name: async_nats::Subject,
    window: Mutex<Window>,
}

#[derive(Default)]
struct Counters {
    published: AtomicU64,
    batches: AtomicU64,
    unsent: AtomicU64,
    withheld: AtomicU64,
    heartbeats: AtomicU64,
    retain_requests: AtomicU64,
    retained_served: AtomicU64,
    regenerated_served: AtomicU64,
    regenerations_failed: AtomicU64,
    /// Whether the last publish was refused (so the outage is logged once, not per batch).
    refusing: AtomicBool,
}

/// Whether a publisher may publish now, and as which leadership. A replicated engine group
/// (the `replication` crate) runs one publisher per engine: every engine sequences and retains
/// the same records, and only the lease holder's gate is open. The holder moves the gate's
/// deadline forward on each renewal of its lease, so a holder cut off from renewing closes by
/// itself; every batch it publishes carries the lease's epoch ([`BatchHeader::epoch`]), so a
/// edge that heard a newer leader drops a deposed one's late batches.
#[derive(Debug, Default)]
pub struct PublishGate {
    /// Open until this absolute `CLOCK_MONOTONIC` time, ns (0: closed).
    open_until_abs_ns: AtomicU64,
    /// The epoch of the leadership that opened the gate last.
    epoch: AtomicU64,
}

impl PublishGate {
    /// A gate that is closed until [`PublishGate::open_until`].
    pub fn closed() -> Arc<PublishGate> {
        Arc::new(PublishGate::default())
    }

    /// Opens the gate for leadership `epoch` until `abs_ns` (absolute monotonic ns,
    /// [`crate::clock::monotonic_ns`]).
    pub fn open_until(&self, abs_ns: u64, epoch: u64) {
        // Relaxed, both: neither publishes other data. A publisher that pairs a new deadline
        // with the previous epoch stamps a batch older than it is (an edge then drops it and
        // recovers the records from the window): the safe direction. The epoch is stored first
        // so that a publisher which sees this deadline usually sees this epoch too.
        self.epoch.store(epoch, Ordering::Relaxed);
        self.open_until_abs_ns.store(abs_ns, Ordering::Relaxed);
    }

    /// Closes the gate at once.
    pub fn close(&self) {
        // Relaxed: see `open_until`.
        self.open_until_abs_ns.store(0, Ordering::Relaxed);
    }

    /// Whether publishing is allowed now.
    pub fn is_open(&self) -> bool {
        // Relaxed: see `open_until`.
        monotonic_ns() < self.open_until_abs_ns.load(Ordering::Relaxed)
    }

    /// The epoch batches are stamped with.
    pub fn epoch(&self) -> u64 {
        // Relaxed: see `open_until`.
        self.epoch.load(Ordering::Relaxed)
    }
}

/// Recomputes records that have left a retained window. A replicated engine group can: any
/// record follows from the shard's snapshot and the input log after it, which outlive the
/// in-memory window (the `replication` crate's engine). The leader's retain service asks it for
/// a range older than its window, so an edge that fell further behind than the window (a
/// failover during which the new leader applied many inputs, an edge restarted after long)
/// recovers instead of being told to resync.
pub trait Regenerate: Send + Sync + std::fmt::Debug {
    /// Records `from..=to` of `outlet`'s `stream`, from `from` on: a prefix of the range
    /// (empty when none can be recomputed, e.g. the log was trimmed past them), or
    /// [`RegenerationFailed`] when what it reads (a snapshot, the log) could not be read.
    fn regenerate(
        &self,
        outlet: u32,
        stream: Stream,
        from: u64,
        to: u64,
    ) -> futures_util::future::BoxFuture<'static, Result<Vec<Record>, RegenerationFailed>>;
}

/// A regeneration that could not read what it needs (the newest snapshot, the log): the
/// records may still be recomputable, so the retain service answers "nothing yet"
/// ([`regenerated_answer`]) rather than let the edge resync them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegenerationFailed(pub String);

/// A publisher that is one of a group sharing one sequence space (the engines that follow one
/// shard's input log): every member computes the same records in the same order, so all use
/// the group's `instance` id and edges accept the next member's batches as the same
/// publisher's; only the member whose `gate` is open publishes, heartbeats and answers retain
/// requests.
#[derive(Clone, Debug)]
pub struct PublisherGroup {
    /// The group's instance id (the same for every member).
    pub instance: u64,
    /// Open while this member leads.
    pub gate: Arc<PublishGate>,
    /// Per data subject (outlet-major, [`Stream::ALL`] order: [`subject_index`]), the
    /// sequence its next record takes: a member restored from a snapshot continues the
    /// group's numbering there. Empty: every subject starts at 1.
    pub next_seqs: Vec<u64>,
    /// What recomputes records older than the windows (`None`: such a range is lost).
    pub regenerate: Option<Arc<dyn Regenerate>>,
}

/// Where a data subject sits in [`PublisherGroup::next_seqs`].
pub fn subject_index(outlet: u32, stream: Stream) -> usize {
    outlet as usize * Stream::ALL.len() + stream as usize
}

/// Shared by the publisher threads, the heartbeat and the retain service.
struct Shared {
    client: async_nats::Client,
    /// This publisher's instance id, in every batch header ([`BatchHeader::instance`]).
    instance: u64,
    /// `None`: a publisher of its own, always publishing.
    gate: Option<Arc<PublishGate>>,
    /// The group's way to records older than the windows.
    regenerate: Option<Arc<dyn Regenerate>>,
    /// The publisher's runtime, for a publisher thread to wait on a full client queue.
    runtime: tokio::runtime::Handle,
    subjects: Vec<SubjectState>,
    counters: Counters,
}

/// Adds one to a statistics counter. Relaxed: the counters publish no other data and are read
/// after the threads that write them are joined (or as a monotonic progress figure).
fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

impl Shared {
    /// Whether this publisher publishes now (always, outside a group).
    fn leads(&self) -> bool {
        self.gate.as_ref().is_none_or(|gate| gate.is_open())
    }

    /// The leadership epoch its batches carry (0 outside a group).
    fn epoch(&self) -> u64 {
        self.gate.as_ref().map_or(0, |gate| gate.epoch())
    }

    fn subject(&self, outlet: u32, stream: Stream) -> &SubjectState {
        &self.subjects[subject_index(outlet, stream)]
    }

    /// Hands `payload` to the client's queue: `false` when it could not (kept in the window
    /// only). While connected, a full queue is back-pressure and the publisher waits up to
    /// [`PUBLISH_WAIT_MAX`] (`wait`); while the server is unreachable it never waits, so the
    /// tier is not stalled by the broker. Heartbeats (on the runtime) never wait.
    fn publish(&self, subject: &async_nats::Subject, payload: Bytes, wait: bool) -> bool {
        let publish = self.client.publish(subject.clone(), payload);
        let mut publish = std::pin::pin!(publish);
        let mut sent = match publish.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(result) => result.is_ok(),
            Poll::Pending => false,
        };
        let connected = self.client.connection_state() == async_nats::connection::State::Connected;
        if !sent && wait && connected {
            let waited = async { tokio::time::timeout(PUBLISH_WAIT_MAX, publish).await };
            sent = matches!(self.runtime.block_on(waited), Ok(Ok(())));
        }
        // Relaxed: a log-once flag, no data rides on it.
        let was_refusing = self.counters.refusing.swap(!sent, Ordering::Relaxed);
        if !sent && !was_refusing {
            tracing::warn!("NATS client cannot take batches: they are kept in the windows only");
        } else if sent && was_refusing {
            tracing::info!("NATS client takes batches again");
        }
        sent
    }

    /// Sends every subject's next sequence (a batch of zero records).
    fn heartbeat(&self) {
        for (index, subject) in self.subjects.iter().enumerate() {
            let window = subject.window.lock().unwrap_or_else(PoisonError::into_inner);
            let header = BatchHeader {
                stream: Stream::ALL[index % Stream::ALL.len()],
                outlet: (index / Stream::ALL.len()) as u32,
                instance: self.instance,
                epoch: self.epoch(),
                first_seq: window.next_seq,
                count: 0,
            };
            let mut payload = Vec::with_capacity(BATCH_HEADER_BYTES);
            header.write(&mut payload);
            if self.publish(&subject.name, payload.into(), false) {
                add(&self.counters.heartbeats, 1);
            }
        }
    }

    /// The reply to a retain request: the records of the range (at most a batch) from its
    /// start, recomputed by the group when they left the window; else from the first one still
    /// retained; zero records when none is ([`retain_source`] decides).
    async fn answer(&self, outlet: u32, stream: Stream, request: RetainRequest) -> Vec<u8> {
        let oldest = self.subject(outlet, stream).window.lock();
        let oldest = oldest.unwrap_or_else(PoisonError::into_inner).oldest();
        if let (Some(regenerate), RetainSource::Regenerate { from, last }) =
            (&self.regenerate, retain_source(&request, oldest, self.regenerate.is_some()))
        {
            let regenerated = regenerate.regenerate(outlet, stream, from, last).await;
            match (regenerated_answer(&regenerated), regenerated) {
                (RegeneratedAnswer::Records, Ok(records)) => {
                    add(&self.counters.regenerated_served, records.len() as u64);
                    let records = records.iter().map(|record| &record.0[..]);
                    return self.reply(outlet, stream, from, count_of(records));
                }
                (RegeneratedAnswer::Retry, _) => {
                    add(&self.counters.regenerations_failed, 1);
                    return self.reply(outlet, stream, from, count_of(std::iter::empty()));
                }
                _ => {}
            }
        }
        self.retained(outlet, stream, request)
    }

    /// A reply of `count` `records` (each `RECORD_BYTES`), the first numbered `first_seq`.
    fn reply<'a>(
        &self,
        outlet: u32,
        stream: Stream,
        first_seq: u64,
        (count, records): (usize, impl Iterator<Item = &'a [u8]>),
    ) -> Vec<u8> {
        let (instance, epoch) = (self.instance, self.epoch());
        let header = BatchHeader { stream, outlet, instance, epoch, first_seq, count };
        let mut payload = Vec::with_capacity(BATCH_HEADER_BYTES + count * RECORD_BYTES);
        header.write(&mut payload);
        for record in records {
            payload.extend_from_slice(record);
        }
        assert_eq!(payload.len(), BATCH_HEADER_BYTES + count * RECORD_BYTES, "count records");
        payload
    }

    /// The window's part of a retain request's range (at most a batch), from the first record
    /// still retained; zero records when none is.
    fn retained(&self, outlet: u32, stream: Stream, request: RetainRequest) -> Vec<u8> {
        let window = self.subject(outlet, stream).window.lock();
        let window = window.unwrap_or_else(PoisonError::into_inner);
        let (first_seq, count) = window_part(&request, window.oldest(), window.next_seq);
        add(&self.counters.retained_served, count);
        let records = window.records(first_seq, count as usize);
        self.reply(outlet, stream, first_seq, (count as usize, records))
    }
}

/// Where a retain reply's records come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetainSource {
    /// Recomputed by the group: `from..=last` (at most a batch, all older than the window).
    Regenerate {
        /// The first record.
        from: u64,
        /// The last record.
        last: u64,
    },
    /// The retained window ([`window_part`]).
    Window,
}

/// The retain service's decision for `request` when the window's oldest record is `oldest`
/// and the group can (`can_regenerate`) recompute older ones. The bug `regress-window-only`
/// puts back (never in a served build; `crates/sim` finds it): a range older than the window
/// is answered from the window only, so an edge that fell behind it never gets it.
pub fn retain_source(request: &RetainRequest, oldest: u64, can_regenerate: bool) -> RetainSource {
    let regenerates = can_regenerate && !cfg!(feature = "regress-window-only");
    if !regenerates || request.from_seq >= oldest {
        return RetainSource::Window;
    }
    let last = request.to_seq.min(oldest - 1);
    let last = last.min(request.from_seq + BATCH_RECORDS_MAX as u64 - 1);
    RetainSource::Regenerate { from: request.from_seq, last }
}

/// How the retain service answers once the group tried to recompute a range
/// ([`RetainSource::Regenerate`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegeneratedAnswer {
    /// The records recomputed, from where the edge asked.
    Records,
    /// None can be recomputed (the newest snapshot is past them, their inputs trimmed): the
    /// window answers ([`window_part`]) and the edge resyncs what lies before it.
    Window,
    /// The regeneration failed to read what it needs: no records, numbered where the edge
    /// asked, so it resyncs nothing and asks again on its next gap (a heartbeat away).
    Retry,
}

/// The answer for a regeneration that came to `regenerated` (production's retain service
/// and `crates/sim`'s model of it both decide here). A failed one answered from the window
/// (before `crates/sim` found it) let an edge behind the window resync records the group
/// could recompute a moment later.
pub fn regenerated_answer<T, E>(regenerated: &Result<Vec<T>, E>) -> RegeneratedAnswer {
    match regenerated {
        Ok(records) if !records.is_empty() => RegeneratedAnswer::Records,
        Ok(_) => RegeneratedAnswer::Window,
        Err(_) => RegeneratedAnswer::Retry,
    }
}

/// The window's part of `request` (a window holding `oldest..next_seq`): the reply's first
/// sequence and its count of records (at most a batch, from the first still retained; zero
/// records, numbered where the window goes on, when none is).
pub fn window_part(request: &RetainRequest, oldest: u64, next_seq: u64) -> (u64, u64) {
    let first = request.from_seq.max(oldest);
    let last = request.to_seq.min(next_seq.saturating_sub(1));
    let count = if first > last { 0 } else { (last - first + 1).min(BATCH_RECORDS_MAX as u64) };
    let first_seq = if count == 0 { next_seq.max(first) } else { first };
    (first_seq, count)
}

/// An exact-size iterator as its length and itself (what [`Shared::reply`] takes).
fn count_of<I: ExactSizeIterator>(items: I) -> (usize, I) {
    (items.len(), items)
}

/// A fresh random instance id, drawn from `entropy` (production: [`OsEntropy`]). It tells
/// publisher runs apart; it is not a secret (every subscriber sees it).
pub fn new_instance_id(entropy: &mut impl Entropy) -> u64 {
    entropy.next_u64()
}

/// The R-Senders' NATS side: connects, serves the retained windows and the heartbeats, and
/// builds each sender's subscribers ([`NatsPublisher::subscribers`]).
pub struct NatsPublisher {
    runtime: tokio::runtime::Runtime,
    shared: Arc<Shared>,
    options: PublishOptions,
    threads: Arc<Mutex<Vec<JoinHandle<()>>>>,
    services: Vec<tokio::task::JoinHandle<()>>,
}

impl NatsPublisher {
    /// Connects to `options.nats` and starts the retain service and the heartbeat.
    pub fn connect(options: PublishOptions) -> Result<NatsPublisher> {
        NatsPublisher::connect_member(options, None)
    }

    /// [`NatsPublisher::connect`] as a member of `group`: the group's instance id, publishing
    /// only while its gate is open (records are sequenced and retained either way).
    pub fn connect_in_group(
        options: PublishOptions,
        group: PublisherGroup,
    ) -> Result<NatsPublisher> {
        NatsPublisher::connect_member(options, Some(group))
    }

    fn connect_member(
        options: PublishOptions,
        group: Option<PublisherGroup>,
    ) -> Result<NatsPublisher> {
        check_member_options(&options, group.as_ref())?;
        // Two runtime threads: the client's connection task and the services; the publishing
        // itself runs on the publisher threads.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("nats-publisher-io")
            .enable_all()
            .build()
            .map_err(io_failed("starting the publisher's runtime"))?;
        let client = runtime.block_on(connect(&options.nats, "publisher"))?;
        let instance =
            group.as_ref().map_or_else(|| new_instance_id(&mut OsEntropy), |group| group.instance);
        let next_seqs = group.as_ref().map(|group| group.next_seqs.clone()).unwrap_or_default();
        let (gate, regenerate) = match group {
            Some(group) => (Some(group.gate), group.regenerate),
            None => (None, None),
        };
        tracing::info!("publisher instance {instance:016x}");
        let subjects = subject_states(&options, &next_seqs);
        let handle = runtime.handle().clone();
        let counters = Counters::default();
        let shared = Arc::new(Shared {
            client,
            instance,
            gate,
            regenerate,
            runtime: handle,
            subjects,
            counters,
        });
        let retain_subjects = format!("{}.retain.>", options.prefix);
        let subscribing = async {
            let subscribing = shared.client.subscribe(retain_subjects);
            tokio::time::timeout(CONNECT_TIMEOUT, subscribing).await
        };
        let retain = runtime.block_on(subscribing).map_err(|_| {
            let why = format!("NATS did not take the retain subscription in {CONNECT_TIMEOUT:?}");
            DeliveryError::Failed(why)
        })?;
        let retain = retain.map_err(nats_failed("subscribing to the retain requests"))?;
        let services = vec![
            runtime.spawn(serve_retained(shared.clone(), options.prefix.clone(), retain)),
            runtime.spawn(heartbeats(shared.clone(), options.heartbeat)),
        ];
        let threads = Arc::new(Mutex::new(Vec::new()));
        Ok(NatsPublisher { runtime, shared, options, threads, services })
    }

    /// The factory the tier calls once per R-Sender: one ring per outlet into a new
    /// publisher thread of that sender.
    pub fn subscribers(&self) -> SubscriberFactory {
        let (shared, options, threads) =
            (self.shared.clone(), self.options.clone(), self.threads.clone());
        Arc::new(move |sender| {
            let config = RingConfig {
                capacity_slots: PUBLISHER_RING_SLOTS,
                batch_slots_max: BATCH_RECORDS_MAX.min(PUBLISHER_RING_SLOTS),
                wait: options.wait,
            };
            let parker = Parker::new();
            let (mut subscribers, mut rings) = (Vec::new(), Vec::new());
            for _ in 0..options.outlets {
                let (tx, rx) =
                    connector_with(ConnectorKind::LockFree, &config, Parker::new(), parker.clone())
                        .expect("PUBLISHER_RING_SLOTS is a valid ring size");
                subscribers.push(Box::new(RingSubscriber { ring: tx }) as Box<dyn Subscriber>);
                rings.push(rx);
            }
            let publisher = PublisherThread {
                sender,
                rings,
                waiter: Waiter::new(options.wait, parker),
                shared: shared.clone(),
                offset: EpochOffset::measure(),
                batches: (0..options.outlets).map(|_| Default::default()).collect(),
            };
            let thread = std::thread::Builder::new()
                .name(format!("nats-pub-{sender}"))
                .spawn(move || publisher.run())
                .expect("spawning a publisher thread");
            threads.lock().unwrap_or_else(PoisonError::into_inner).push(thread);
            subscribers
        })
    }

    /// Waits for every publisher thread (they end once the tier's senders finished), sends a
    /// last heartbeat, flushes the client and reports. The retain service keeps answering
    /// until the publisher is dropped, so edges can still recover.
    pub fn drain(&self) -> Result<PublishReport> {
        let threads =
            std::mem::take(&mut *self.threads.lock().unwrap_or_else(PoisonError::into_inner));
        for thread in threads {
            let panicked = || DeliveryError::Failed("a NATS publisher thread panicked".into());
            thread.join().map_err(|_| panicked())?;
        }
        if self.shared.leads() {
            self.shared.heartbeat();
        }
        let client = &self.shared.client;
        let flush = async { tokio::time::timeout(CONNECT_TIMEOUT, client.flush()).await };
        if !matches!(self.runtime.block_on(flush), Ok(Ok(()))) {
            tracing::warn!(
                "NATS flush did not complete; the delivery edges recover from the windows"
            );
        }
        Ok(self.report())
    }

    /// The counters so far.
    pub fn report(&self) -> PublishReport {
        let c = &self.shared.counters;
        // Relaxed: see `add`.
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        PublishReport {
            published: load(&c.published),
            batches: load(&c.batches),
            unsent: load(&c.unsent),
            withheld: load(&c.withheld),
            heartbeats: load(&c.heartbeats),
            retain_requests: load(&c.retain_requests),
            retained_served: load(&c.retained_served),
            regenerated_served: load(&c.regenerated_served),
            regenerations_failed: load(&c.regenerations_failed),
            next_seqs: self
                .shared
                .subjects
                .iter()
                .map(|s| s.window.lock().unwrap_or_else(PoisonError::into_inner).next_seq)
                .collect(),
        }
    }
}

/// Refuses options a member publisher cannot run with: a bad prefix, a retained window,
/// outlet count or heartbeat out of range, or a group continuing a different number of
/// subjects than it publishes.
fn check_member_options(options: &PublishOptions, group: Option<&PublisherGroup>) -> Result<()> {
    crate::subjects::validate_prefix(&options.prefix).map_err(crate::DeliveryError::BadInput)?;
    if !(1..=RETAIN_RECORDS_MAX).contains(&options.retain_records)
        || !(1..=OUTLETS_MAX).contains(&options.outlets)
        || options.heartbeat.is_zero()
    {
        return Err(crate::DeliveryError::BadInput(format!(
            "retain records must be in 1..={RETAIN_RECORDS_MAX}, outlets in \
             1..={OUTLETS_MAX}, heartbeat > 0"
        )));
    }
    let subjects = options.outlets as usize * Stream::ALL.len();
    let resumed = group.map_or(0, |group| group.next_seqs.len());
    if resumed != 0 && resumed != subjects {
        return Err(crate::DeliveryError::BadInput(format!(
            "{resumed} subjects to continue, {subjects} published"
        )));
    }
    Ok(())
}

/// Every data subject's state, each window continuing at the group's next sequence for it
/// (1 for a new publisher).
fn subject_states(options: &PublishOptions, next_seqs: &[u64]) -> Vec<SubjectState> {
    (0..options.outlets)
        .flat_map(|outlet| Stream::ALL.map(|stream| (outlet, stream)))
        .map(|(outlet, stream)| {
            let next_seq = next_seqs.get(subject_index(outlet, stream)).copied().unwrap_or(1);
            let window = Window::continuing_at(options.retain_records, next_seq.max(1));
            let name = data_subject(&options.prefix, outlet, stream).into();
            SubjectState { name, window: Mutex::new(window) }
        })
        .collect()
}

impl Drop for NatsPublisher {
    fn drop(&mut self) {
        for service in &self.services {
            service.abort();
        }
    }
}

/// After a stop signal the retained windows stay up at most this long: with the flush (at
/// most `CONNECT_TIMEOUT`, 5 s) the drain stays within `ops::stop::DRAIN_TIMEOUT` (10 s).
pub const LINGER_AFTER_STOP_MAX: Duration = Duration::from_secs(2);

/// The sender's side: a ring push per response.
struct RingSubscriber {
    ring: Sender<Response>,
}

impl Subscriber for RingSubscriber {
    fn deliver(&mut self, response: &Response) {
        // The publisher thread ends only after every ring of its sender disconnected, so a
        // disconnected ring here means it panicked: fail the run, never drop silently.
        self.ring.push(*response).expect("the NATS publisher thread of this sender stopped");
    }
}

/// One sender's publisher: drains its rings, sequences, retains and publishes.
struct PublisherThread {
    sender: usize,
    /// Indexed by outlet.
    rings: Vec<Receiver<Response>>,
    waiter: Waiter,
    shared: Arc<Shared>,
    offset: EpochOffset,
    /// Per outlet and stream, the batch being encoded: a header's room, then the records
    /// (split off as the payload when published; the buffer's allocation is shared with the
    /// payloads, so a subject's buffer is its own: see [`BATCH_BUFFER_BYTES`]).
    batches: Vec<[BytesMut; 2]>,
}

impl PublisherThread {
    fn run(mut self) {
        loop {
            let mut handled = 0;
            for outlet in 0..self.rings.len() {
                handled += self.drain(outlet);
            }
            if handled > 0 {
                continue;
            }
            if self.rings.iter_mut().all(|ring| ring.is_disconnected()) {
                break;
            }
            let rings = &mut self.rings;
            self.waiter.wait_until(|| {
                rings.iter().any(|ring| !ring.is_empty())
                    || rings.iter_mut().all(|ring| ring.is_disconnected())
            });
        }
    }

    /// Encodes what `outlet`'s ring holds (at most a batch) into one batch per stream and
    /// publishes them; the number of records.
    fn drain(&mut self, outlet: usize) -> usize {
        if self.rings[outlet].is_empty() {
            return 0;
        }
        let published_abs_ns = monotonic_ns();
        let batches = &mut self.batches[outlet];
        for batch in batches.iter_mut() {
            if batch.capacity() < BATCH_HEADER_BYTES + BATCH_RECORDS_MAX * RECORD_BYTES {
                *batch = BytesMut::with_capacity(BATCH_BUFFER_BYTES);
            }
            batch.put_bytes(0, BATCH_HEADER_BYTES);
        }
        let offset = self.offset;
        let drained = self.rings[outlet].read_batch(BATCH_RECORDS_MAX, |response| {
            let batch = &mut batches[Stream::of(response) as usize];
            let at = batch.len();
            batch.put_bytes(0, RECORD_BYTES);
            let slot = (&mut batch[at..]).try_into().expect("RECORD_BYTES just added");
            let intended_abs_ns = offset.absolute(response.output.stamps.intended_ns);
            Record::encode_into(response, intended_abs_ns, published_abs_ns, slot);
        });
        for stream in Stream::ALL {
            let batch = &mut self.batches[outlet][stream as usize];
            let count = (batch.len() - BATCH_HEADER_BYTES) / RECORD_BYTES;
            if count == 0 {
                batch.clear();
                continue;
            }
            let payload = batch.split();
            self.publish(outlet as u32, stream, count, payload);
        }
        drained
    }

    /// Numbers, retains and publishes the `count` records encoded in `payload` after its
    /// header's room.
    fn publish(&self, outlet: u32, stream: Stream, count: usize, mut payload: BytesMut) {
        let subject = self.shared.subject(outlet, stream);
        // Locked per batch (not per record), against the heartbeat and the retain service;
        // held across the hand-off to the client so a heartbeat never overtakes this batch.
        let mut window = subject.window.lock().unwrap_or_else(PoisonError::into_inner);
        window.claim(self.sender);
        let (instance, epoch) = (self.shared.instance, self.shared.epoch());
        let first_seq = window.next_seq;
        let header = BatchHeader { stream, outlet, instance, epoch, first_seq, count };
        payload[..BATCH_HEADER_BYTES].copy_from_slice(&header.encode());
        let payload = payload.freeze();
        window.retain(payload.clone());
        let counters = &self.shared.counters;
        if !self.shared.leads() {
            add(&counters.withheld, count as u64);
        } else if self.shared.publish(&subject.name, payload, true) {
            add(&counters.published, count as u64);
            add(&counters.batches, 1);
        } else {
            add(&counters.unsent, count as u64);
        }
    }
}

async fn heartbeats(shared: Arc<Shared>, every: Duration) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        if shared.leads() {
            shared.heartbeat();
        }
    }
}

/// Answers retain requests (`{prefix}.retain.{outlet}.{stream}`); a malformed request gets
/// no answer (the edge's request times out and it reports a resync) and is logged.
async fn serve_retained(shared: Arc<Shared>, prefix: String, mut requests: async_nats::Subscriber) {
    while let Some(message) = requests.next().await {
        let Some(reply) = message.reply else { continue };
        if !shared.leads() {
            continue; // the group's leader answers
        }
        let parsed = parse_retain_subject(&prefix, &message.subject)
            .filter(|(outlet, _)| (*outlet as usize) < shared.subjects.len() / Stream::ALL.len());
        let (Some((outlet, stream)), Ok(request)) =
            (parsed, RetainRequest::decode(&message.payload))
        else {
            tracing::warn!("malformed retain request on {}", message.subject);
            continue;
        };
        add(&shared.counters.retain_requests, 1);
        let payload = shared.answer(outlet, stream, request).await;
        if let Err(error) = shared.client.publish(reply, payload.into()).await {
            tracing::warn!("retain reply to outlet {outlet} failed: {error}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch payload of one record per tag (each tagged in both clocks).
    fn batch(tags: std::ops::RangeInclusive<u64>) -> Bytes {
        let mut payload = vec![0; BATCH_HEADER_BYTES];
        for tag in tags {
            payload.extend_from_slice(&Record::encode(&Response::default(), tag, tag).0);
        }
        payload.into()
    }

    #[test]
    fn a_range_older_than_the_window_is_regenerated_and_the_rest_comes_from_the_window() {
        let request = RetainRequest { from_seq: 10, to_seq: 500 };
        let source = retain_source(&request, 100, true);
        if cfg!(feature = "regress-window-only") {
            assert_eq!(source, RetainSource::Window);
        } else {
            assert_eq!(source, RetainSource::Regenerate { from: 10, last: 99 });
        }
        assert_eq!(retain_source(&request, 100, false), RetainSource::Window);
        assert_eq!(retain_source(&request, 10, true), RetainSource::Window);
        assert_eq!(window_part(&request, 100, 301), (100, 201), "from the oldest retained");
        assert_eq!(window_part(&request, 1, 5), (10, 0), "none yet: numbered where asked");
    }

    #[test]
    fn a_failed_regeneration_answers_nothing_yet_and_only_an_empty_one_falls_back_to_the_window() {
        let failed: Result<Vec<u8>, RegenerationFailed> =
            Err(RegenerationFailed("snapshot read: timed out".into()));
        assert_eq!(regenerated_answer(&failed), RegeneratedAnswer::Retry);
        let trimmed: Result<Vec<u8>, RegenerationFailed> = Ok(Vec::new());
        assert_eq!(regenerated_answer(&trimmed), RegeneratedAnswer::Window);
        let recomputed: Result<Vec<u8>, RegenerationFailed> = Ok(vec![7]);
        assert_eq!(regenerated_answer(&recomputed), RegeneratedAnswer::Records);
    }

    fn tags(window: &Window, first: u64, count: usize) -> Vec<u64> {
        let records = window.records(first, count);
        records.map(|bytes| Record(bytes.try_into().unwrap()).intended_abs_ns()).collect()
    }

    #[test]
    fn a_continuing_window_holds_nothing_before_its_first_sequence() {
        let mut window = Window::continuing_at(4, 101);
        assert_eq!((window.oldest(), window.next_seq), (101, 101), "empty: nothing to serve");
        window.retain(batch(101..=103));
        assert_eq!((window.oldest(), window.next_seq), (101, 104));
        assert_eq!(tags(&window, 102, 1), [102]);
        window.retain(batch(104..=106));
        assert_eq!((window.oldest(), window.next_seq), (103, 107), "then the last capacity");
        assert_eq!(tags(&window, 103, 4), [103, 104, 105, 106], "across two batches");
    }

    #[test]
    fn the_window_keeps_the_last_capacity_records_by_sequence() {
        let mut window = Window::continuing_at(4, 1);
        assert_eq!((window.oldest(), window.next_seq), (1, 1));
        for tag in 1..=6 {
            window.retain(batch(tag..=tag));
        }
        assert_eq!((window.oldest(), window.next_seq), (3, 7));
        assert_eq!(tags(&window, 3, 4), [3, 4, 5, 6]);
        assert_eq!(window.batches.len(), 4, "a batch past the last 4 records is dropped");
    }

    #[test]
    fn the_window_drops_only_batches_the_last_capacity_records_do_not_need() {
        let mut window = Window::continuing_at(4, 1);
        window.retain(batch(1..=3));
        window.retain(batch(4..=5));
        window.retain(batch(6..=6));
        // 3..=6 are served; the first batch holds 3, so it stays.
        assert_eq!((window.oldest(), window.batches.len(), window.held), (3, 3, 6));
        assert_eq!(tags(&window, 3, 4), [3, 4, 5, 6]);
        window.retain(batch(7..=7));
        assert_eq!((window.oldest(), window.batches.len(), window.held), (4, 3, 4));
        window.retain(batch(8..=17));
        assert_eq!((window.oldest(), window.batches.len()), (14, 1), "one batch over capacity");
        assert_eq!(tags(&window, 14, 4), [14, 15, 16, 17]);
        window.retain(vec![0; BATCH_HEADER_BYTES].into());
        assert_eq!(window.next_seq, 18, "an empty batch takes no sequence");
    }

    #[test]
    #[should_panic(expected = "two R-Senders publish one subject")]
    fn a_second_sender_on_a_subject_is_refused() {
        let mut window = Window::continuing_at(1, 1);
        window.claim(0);
        window.claim(1);
    }
}
