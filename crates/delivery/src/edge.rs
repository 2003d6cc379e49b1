//! The delivery edge (the R-Gateway of paper 001): one per outlet. It subscribes to its
//! outlet's data subjects,
//! checks every record's sequence, recovers a gap from the sender's retained window over
//! request/reply, and beyond the window (or when recovery times out) tells its consumers
//! with an explicit resync frame, never with silence. End consumers connect over TCP, say
//! hello within [`HELLO_TIMEOUT`] and then receive every record of both streams in sequence
//! order (docs/DELIVERY.md).
//!
//! Bounds: at most `consumers_max` consumers; each has a queue of at most
//! `consumer_queue_chunks` chunks (a chunk is one NATS batch's frames, at most
//! `BATCH_RECORDS_MAX` frames), so memory is bounded per consumer and in total. A consumer
//! whose queue is full is cut off (it is slower than the stream); a write that stalls for
//! [`WRITE_TIMEOUT`] cuts it off too. Each event (consumer connected, gap, resync, cut off)
//! is logged once, when it happens.
//!
//! Anyone allowed on the NATS subjects can send the edge anything, so every message passes
//! the trust rule of docs/DELIVERY.md (one publisher instance, claims within
//! `seq_ahead_max`, gaps the publisher's window confirms) and no input reaches an assertion;
//! malformed and untrusted messages are counted and their warnings rate-limited.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_nats::StatusCode;
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use stats::LatencyHistogram;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

use crate::admission::{Admission, CONSUMERS_PER_ADDRESS_MAX_DEFAULT, Pending};
use crate::clock::monotonic_ns;
use crate::error::{DeliveryError, Result, io_failed, nats_failed};
use crate::nats::{NatsConnect, connect};
use crate::subjects::{CONNECT_TIMEOUT, outlet_wildcard, retain_subject};
use crate::wire::{
    BATCH_HEADER_BYTES, BATCH_RECORDS_MAX, BatchHeader, DATA_FRAME_BYTES, FRAME_BYTES_MAX,
    FRAME_PREFIX_BYTES, Frame, FrameDecoder, RECORD_BYTES, Record, RetainRequest, Stream,
    WIRE_VERSION, batch_range, data_frame_head, decode_batch,
};

/// A consumer must send its hello within this time.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// A write to a consumer that takes longer cuts the consumer off.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// One retain request may take this long before the range is reported as a resync.
pub const RECOVER_TIMEOUT: Duration = Duration::from_secs(2);
/// Default bound of queued chunks per consumer.
pub const CONSUMER_QUEUE_CHUNKS_DEFAULT: usize = 1024;
/// Default most consumers at once.
pub const CONSUMERS_MAX_DEFAULT: usize = 64;
/// Goodbye reasons (beyond the `WireError` codes 1..=7 of a refused hello).
pub const GOODBYE_SHUTDOWN: u8 = 100;
pub const GOODBYE_SLOW: u8 = 101;
pub const GOODBYE_FULL: u8 = 102;
/// A [`EdgeOptions::first_seqs`] entry meaning: from the first sequence heard.
pub const FIRST_SEQ_HEARD: u64 = 0;
/// Default most a NATS message may claim beyond the next expected sequence and still be
/// applied at once: the publisher's default retained window, the most a gap can be recovered.
pub const SEQ_AHEAD_MAX_DEFAULT: u64 = crate::publish::RETAIN_RECORDS_DEFAULT as u64;
/// How long claims beyond `seq_ahead_max` must keep coming, with nothing within it in between,
/// before they are applied (20 of the publisher's default heartbeats).
pub const AHEAD_CONFIRM: Duration = Duration::from_secs(1);
/// Malformed and untrusted messages are logged at most once per this interval each, with
/// their count since the last warning (and always counted in the report).
pub const WARNING_EVERY: Duration = Duration::from_secs(10);
/// Bytes the consumers' chunk buffer allocates at a time (chunks are split off it and shared
/// with every consumer's queue, so the allocator is called about once per this many bytes).
const CHUNK_BUFFER_BYTES: usize = 64 * 1024;
/// How long a goodbye frame may take before the connection is just closed.
const GOODBYE_TIMEOUT: Duration = Duration::from_millis(200);

/// How to run one edge.
#[derive(Clone, Debug)]
pub struct EdgeOptions {
    pub nats: NatsConnect,
    pub prefix: String,
    pub outlet: u32,
    /// Where TCP consumers connect; `None`: no listener, consumers only in process
    /// ([`RunningEdge::attach`]), so no socket hands the reports to anyone else.
    pub listen: Option<SocketAddr>,
    pub consumers_max: usize,
    /// Most consumers from one source address (see [`crate::admission`]).
    pub consumers_per_address_max: usize,
    pub consumer_queue_chunks: usize,
    /// Most a NATS message may claim beyond the next expected sequence and be applied at once
    /// (see the trust rule in docs/DELIVERY.md).
    pub seq_ahead_max: u64,
    /// Per stream ([`Stream::ALL`] order), the first sequence to deliver: 1 from the stream's
    /// start; a restarted edge passes one past what it delivered before, so nothing is
    /// delivered twice; 0 (`FIRST_SEQ_HEARD`): from the first sequence the served publisher
    /// names (an edge joining a running exchange has no client waiting for older records).
    pub first_seqs: [u64; 2],
}

impl EdgeOptions {
    pub fn new(nats_url: &str, outlet: u32, listen: SocketAddr) -> EdgeOptions {
        EdgeOptions {
            nats: NatsConnect::new(nats_url),
            prefix: crate::subjects::PREFIX_DEFAULT.to_string(),
            outlet,
            listen: Some(listen),
            consumers_max: CONSUMERS_MAX_DEFAULT,
            consumers_per_address_max: CONSUMERS_PER_ADDRESS_MAX_DEFAULT,
            consumer_queue_chunks: CONSUMER_QUEUE_CHUNKS_DEFAULT,
            seq_ahead_max: SEQ_AHEAD_MAX_DEFAULT,
            first_seqs: [1; 2],
        }
    }
}

/// The edge's counters.
#[derive(Debug, Default)]
struct Counters {
    received: AtomicU64,
    delivered: AtomicU64,
    duplicates: AtomicU64,
    gaps: AtomicU64,
    recovered: AtomicU64,
    resyncs: AtomicU64,
    resync_records: AtomicU64,
    consumers: AtomicU64,
    cut_off: AtomicU64,
    refused: AtomicU64,
    bad_messages: AtomicU64,
    untrusted: AtomicU64,
    fenced: AtomicU64,
    /// As [`EdgeLatency::answers`], for `/metrics` (buckets, not percentiles).
    answer_seconds: ops::BucketHistogram,
    /// As [`EdgeLatency::market_data`], for `/metrics`.
    market_data_seconds: ops::BucketHistogram,
}

/// Adds to a statistics counter. Relaxed: counters publish no other data.
fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

/// What an edge reports (at the end, or as a snapshot while it runs).
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct EdgeReport {
    pub outlet: u32,
    /// Records taken in order from NATS or recovered.
    pub received: u64,
    /// Records written to consumers (summed over consumers).
    pub delivered: u64,
    /// Records seen twice (a recovery overlapping a late batch) and dropped.
    pub duplicates: u64,
    pub gaps: u64,
    /// Records recovered from the retained window.
    pub recovered: u64,
    /// Resync frames sent (ranges lost for good).
    pub resyncs: u64,
    pub resync_records: u64,
    pub consumers_connected: u64,
    pub consumers_cut_off: u64,
    pub consumers_refused: u64,
    pub bad_messages: u64,
    /// Well-formed messages ignored by the trust rule: another publisher instance, a claim too
    /// far ahead, a gap the publisher's window denies, a retain reply from a stranger.
    #[serde(default)]
    pub untrusted: u64,
    /// Messages from a leadership older than the newest one heard (a deposed leader's late
    /// batches, heartbeats or retain replies), dropped.
    #[serde(default)]
    pub fenced: u64,
    /// The newest leadership epoch heard (0: a publisher of its own, or nothing yet).
    #[serde(default)]
    pub epoch: u64,
    /// Per stream, the next sequence expected.
    pub next_seqs: Vec<u64>,
}

/// What the edge measured, from each record's intended time (its request's arrival at the
/// tier, on the host's monotonic clock) to the record's arrival here.
#[derive(Clone, Debug, Default)]
pub struct EdgeLatency {
    /// Records answering a request (the first report of each).
    pub answers: LatencyHistogram,
    /// Market data (trades and top of book, stamped with the order that caused them).
    pub market_data: LatencyHistogram,
}

/// A consumer in the edge's own process ([`RunningEdge::attach`]).
pub struct InProcessConsumer {
    state: Arc<State>,
    chunks: mpsc::Receiver<(Bytes, u64)>,
}

impl InProcessConsumer {
    /// The next chunk of whole frames; `None` once the edge shut down or cut it off.
    pub async fn next_chunk(&mut self) -> Option<Bytes> {
        let (chunk, records) = self.chunks.recv().await?;
        add(&self.state.counters.delivered, records);
        Some(chunk)
    }
}

/// A consumer's queue, as the sequencer sees it.
struct ConsumerSlot {
    queue: mpsc::Sender<(Bytes, u64)>,
    peer: SocketAddr,
    /// Set when the sequencer cut the consumer off: its writer stops at once.
    cut: Arc<AtomicBool>,
}

struct State {
    options: EdgeOptions,
    client: async_nats::Client,
    counters: Counters,
    consumers: Mutex<Vec<ConsumerSlot>>,
    /// Bounds connections before their hello and consumers per address.
    admission: Arc<Admission>,
    /// Refused connections, logged at most once per [`WARNING_EVERY`].
    refusal_warning: Mutex<RateLimitedWarning>,
    next_seqs: Mutex<[u64; 2]>,
    /// The newest leadership epoch heard (only grows; see [`BatchHeader::epoch`]).
    epoch: AtomicU64,
}

/// A started edge.
pub struct RunningEdge {
    state: Arc<State>,
    local_addr: Option<SocketAddr>,
    stop: watch::Sender<bool>,
    sequencer: tokio::task::JoinHandle<EdgeLatency>,
    acceptor: Option<tokio::task::JoinHandle<()>>,
}

/// Connects, subscribes and listens; runs on the caller's tokio runtime.
pub async fn start(options: EdgeOptions) -> Result<RunningEdge> {
    crate::subjects::validate_prefix(&options.prefix).map_err(crate::DeliveryError::BadInput)?;
    if options.consumers_max == 0
        || options.consumers_per_address_max == 0
        || options.consumer_queue_chunks == 0
        || options.seq_ahead_max == 0
    {
        let reason = "consumers max, consumers per address max, consumer queue chunks and seq ahead max must be > 0".into();
        return Err(crate::DeliveryError::BadInput(reason));
    }
    let client = connect(&options.nats, "edge").await?;
    let subscribing = async {
        let subject = outlet_wildcard(&options.prefix, options.outlet);
        let subscription =
            client.subscribe(subject).await.map_err(nats_failed("subscribing to the data"))?;
        let inbox = client.new_inbox();
        let replies = client.subscribe(format!("{inbox}.*")).await;
        let replies = replies.map_err(nats_failed("subscribing to the replies"))?;
        client.flush().await.map_err(nats_failed("flushing the subscriptions"))?;
        Ok::<_, DeliveryError>((subscription, Replies { subscription: replies, inbox, sent: 0 }))
    };
    let (subscription, replies) =
        tokio::time::timeout(CONNECT_TIMEOUT, subscribing).await.map_err(|_| {
            let why = format!("NATS did not confirm the subscriptions in {CONNECT_TIMEOUT:?}");
            DeliveryError::Failed(why)
        })??;
    let (listener, local_addr) = match options.listen {
        Some(listen) => {
            let listening = TcpListener::bind(listen).await;
            let listener = listening.map_err(io_failed(format!("listening on {listen}")))?;
            let bound = listener.local_addr().map_err(io_failed("reading the listen address"))?;
            tracing::info!("edge {} listening on {bound}", options.outlet);
            (Some(listener), Some(bound))
        }
        None => (None, None),
    };
    let admission = Admission::new(options.consumers_max, options.consumers_per_address_max);
    let first_seqs = options.first_seqs;
    let state = Arc::new(State {
        options,
        client,
        counters: Counters::default(),
        consumers: Mutex::new(Vec::new()),
        admission,
        refusal_warning: Mutex::new(RateLimitedWarning::default()),
        next_seqs: Mutex::new(first_seqs),
        epoch: AtomicU64::new(0),
    });
    let (stop, stopped) = watch::channel(false);
    let sequencer = tokio::spawn(sequence(state.clone(), subscription, replies, stopped.clone()));
    let acceptor = listener.map(|listener| tokio::spawn(accept(state.clone(), listener, stopped)));
    Ok(RunningEdge { state, local_addr, stop, sequencer, acceptor })
}

impl RunningEdge {
    /// Where TCP consumers connect; `None` when started without a listener.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local_addr
    }

    /// The counters so far.
    pub fn report(&self) -> EdgeReport {
        report(&self.state)
    }

    /// A consumer in this process: the frames a TCP consumer would read (data, resync), in
    /// order, without the socket. Held to the same rule as one: cut off when its queue of
    /// `consumer_queue_chunks` is full. Not counted against `consumers_max`.
    ///
    /// ```no_run
    /// # async fn read(edge: &delivery::edge::RunningEdge) {
    /// let mut consumer = edge.attach();
    /// while let Some(chunk) = consumer.next_chunk().await {
    ///     // `chunk` holds whole frames: feed a `delivery::wire::FrameDecoder`.
    /// #   let _ = chunk;
    /// }
    /// // `None`: the edge shut down, or cut this consumer off.
    /// # }
    /// ```
    pub fn attach(&self) -> InProcessConsumer {
        let (queue, chunks) = mpsc::channel(self.state.options.consumer_queue_chunks);
        let peer = SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, 0));
        let slot = ConsumerSlot { queue, peer, cut: Arc::new(AtomicBool::new(false)) };
        self.state.consumers.lock().unwrap_or_else(PoisonError::into_inner).push(slot);
        add(&self.state.counters.consumers, 1);
        InProcessConsumer { state: self.state.clone(), chunks }
    }

    /// Whether the edge's NATS connection is up (what `/ready` reports).
    pub fn is_connected(&self) -> bool {
        self.state.client.connection_state() == async_nats::connection::State::Connected
    }

    /// Adds the edge's metrics to `registry` (docs/OPERATIONS.md, "Monitor").
    pub fn register_metrics(&self, registry: &mut ops::Registry) {
        type CounterOf = fn(&Counters) -> &AtomicU64;
        let counters: [(&str, &str, CounterOf); 12] = [
            (
                "delivery_edge_records_received",
                "records taken in order from NATS or recovered",
                |c| &c.received,
            ),
            ("delivery_edge_records_delivered", "records written to consumers (summed)", |c| {
                &c.delivered
            }),
            ("delivery_edge_duplicates", "records seen twice and dropped", |c| &c.duplicates),
            ("delivery_edge_gaps", "sequence gaps detected", |c| &c.gaps),
            ("delivery_edge_records_recovered", "records recovered from the window", |c| {
                &c.recovered
            }),
            ("delivery_edge_resyncs", "resync frames sent (ranges lost for good)", |c| &c.resyncs),
            ("delivery_edge_consumers_cut_off", "consumers cut off (queue full)", |c| &c.cut_off),
            ("delivery_edge_consumers_refused", "consumers refused at the limit", |c| &c.refused),
            ("delivery_edge_consumers_connected", "consumers that connected", |c| &c.consumers),
            ("delivery_edge_bad_messages", "malformed NATS messages ignored", |c| &c.bad_messages),
            ("delivery_edge_untrusted", "well-formed messages ignored by the trust rule", |c| {
                &c.untrusted
            }),
            ("delivery_edge_fenced", "messages of a leadership older than the newest heard", |c| {
                &c.fenced
            }),
        ];
        for (name, help, which) in counters {
            let state = Arc::clone(&self.state);
            let read = move || which(&state.counters).load(Ordering::Relaxed);
            registry.register(name, help, ops::read::counter(read));
        }
        let c = &self.state.counters;
        let help = "a request's arrival at the tier to its answer's record arriving here";
        registry.register("delivery_edge_answer_seconds", help, c.answer_seconds.clone());
        let help = "the causing order's arrival at the tier to a market-data record arriving here";
        registry.register("delivery_edge_market_data_seconds", help, c.market_data_seconds.clone());
    }

    /// Stops taking records and consumers, says goodbye to every consumer, and reports.
    pub async fn shutdown(self) -> Result<(EdgeReport, EdgeLatency)> {
        let _ = self.stop.send(true);
        let latency = self.sequencer.await?;
        if let Some(acceptor) = self.acceptor {
            acceptor.await?;
        }
        // Dropping the queues ends each writer after what is queued, with a goodbye.
        self.state.consumers.lock().unwrap_or_else(PoisonError::into_inner).clear();
        Ok((report(&self.state), latency))
    }
}

fn report(state: &State) -> EdgeReport {
    let c = &state.counters;
    // Relaxed: see `add`.
    let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
    EdgeReport {
        outlet: state.options.outlet,
        received: load(&c.received),
        delivered: load(&c.delivered),
        duplicates: load(&c.duplicates),
        gaps: load(&c.gaps),
        recovered: load(&c.recovered),
        resyncs: load(&c.resyncs),
        resync_records: load(&c.resync_records),
        consumers_connected: load(&c.consumers),
        consumers_cut_off: load(&c.cut_off),
        consumers_refused: load(&c.refused),
        bad_messages: load(&c.bad_messages),
        untrusted: load(&c.untrusted),
        fenced: load(&c.fenced),
        epoch: load(&state.epoch),
        next_seqs: state.next_seqs.lock().unwrap_or_else(PoisonError::into_inner).to_vec(),
    }
}

/// The sequencer: one task, so records leave in sequence order per stream.
async fn sequence(
    state: Arc<State>,
    mut subscription: async_nats::Subscriber,
    replies: Replies,
    mut stopped: watch::Receiver<bool>,
) -> EdgeLatency {
    let mut sequencer = Sequencer {
        state,
        latency: EdgeLatency::default(),
        chunk: BytesMut::new(),
        publisher: None,
        far_since: [None; 2],
        replies,
        malformed_warning: RateLimitedWarning::default(),
        untrusted_warning: RateLimitedWarning::default(),
        fence: EpochFence::default(),
    };
    loop {
        tokio::select! {
            message = subscription.next() => match message {
                Some(message) => sequencer.on_batch(&message.payload).await,
                None => break,
            },
            _ = stopped.changed() => break,
        }
    }
    sequencer.latency
}

/// Where retain replies arrive: `{inbox}.{request}`. Anyone may answer a request, so the
/// edge reads every reply until a valid one comes, rather than taking the first.
struct Replies {
    subscription: async_nats::Subscriber,
    inbox: String,
    /// Requests sent so far (the last token of each reply subject).
    sent: u64,
}

/// Logs one class of event at most once per [`WARNING_EVERY`], with how many happened since,
/// so a flood of hostile messages is counted but does not flood the log.
#[derive(Default)]
struct RateLimitedWarning {
    last: Option<Instant>,
    since_last: u64,
}

impl RateLimitedWarning {
    fn warn(&mut self, outlet: u32, what: &str, why: &str) {
        self.since_last += 1;
        if self.last.is_some_and(|last| last.elapsed() < WARNING_EVERY) {
            return;
        }
        let count = std::mem::take(&mut self.since_last);
        tracing::warn!("edge {outlet}: {what} ({count} since the last warning): {why}");
        self.last = Some(Instant::now());
    }
}

struct Sequencer {
    state: Arc<State>,
    latency: EdgeLatency,
    /// Where the batches' frames are written; each batch's chunk is split off it.
    chunk: BytesMut,
    /// The publisher instance served: the first whose message was applied.
    publisher: Option<u64>,
    /// Per stream, since when every message has claimed more than `seq_ahead_max` beyond the
    /// next expected sequence (`None`: the last one did not).
    far_since: [Option<Instant>; 2],
    replies: Replies,
    malformed_warning: RateLimitedWarning,
    untrusted_warning: RateLimitedWarning,
    /// The fence's state (mirrored in `State::epoch` for reports).
    fence: EpochFence,
}

/// What the epoch fence says of a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fenced {
    /// From a leadership older than the newest heard: drop it.
    Stale,
    /// From the newest leadership heard.
    Current,
    /// From a newer leadership than any heard (`previous`: the newest before it, 0: none).
    Newer {
        /// The newest epoch heard before this one.
        previous: u64,
    },
}

/// A receiver's fence against deposed leaders, without I/O: the newest leadership epoch
/// heard, which only grows; a message of an older one is dropped ([`BatchHeader::epoch`]).
/// The edge's sequencer keeps one; the simulator (`crates/sim`) drives the same code.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EpochFence {
    newest: u64,
}

impl EpochFence {
    /// Judges a message of leadership `epoch`, remembering a newer one as the newest.
    pub fn admit(&mut self, epoch: u64) -> Fenced {
        let previous = self.newest;
        // Put back only under the `regress-unfenced-publish` feature: the receiver that
        // hears a deposed leader, for proving that the simulator finds it.
        if epoch < previous && !cfg!(feature = "regress-unfenced-publish") {
            return Fenced::Stale;
        }
        if epoch <= previous {
            return Fenced::Current;
        }
        self.newest = epoch;
        Fenced::Newer { previous }
    }

    /// The newest epoch heard (0: none).
    pub fn newest(&self) -> u64 {
        self.newest
    }
}

impl Sequencer {
    async fn on_batch(&mut self, payload: &[u8]) {
        let (header, records) = match decode_batch(payload) {
            Ok(decoded) if decoded.0.outlet == self.state.options.outlet => decoded,
            Ok((header, _)) => return self.bad(&format!("batch for outlet {}", header.outlet)),
            Err(error) => return self.bad(&error.to_string()),
        };
        if !self.current(&header) {
            return;
        }
        if self.next_seq(header.stream) == FIRST_SEQ_HEARD {
            self.start_at(header.stream, header.first_seq);
        }
        if !self.believe(&header) {
            return;
        }
        let stream = header.stream;
        let expected = self.next_seq(stream);
        if header.count == 0 && header.first_seq < expected {
            // The served publisher's heartbeats never go back (it sends them under the lock
            // its batches take): this one is not its own, or this edge started past what
            // the publisher holds (a kept position from an older, recreated log).
            let why = format!(
                "{} heartbeat at {} < {expected} (not the served publisher's, or a start \
                 position past what the engines hold)",
                stream.name(),
                header.first_seq
            );
            return self.untrusted(&why);
        }
        if header.first_seq > expected {
            self.recover(stream, expected, header.first_seq - 1, header.instance).await;
        }
        let next = self.next_seq(stream);
        if header.first_seq > next {
            // The publisher's own window denied the gap (it never assigned those sequences):
            // the claim is not the publisher's, and applying it would drop genuine records.
            let why =
                format!("{} batch at {} beyond the window's end", stream.name(), header.first_seq);
            return self.untrusted(&why);
        }
        // A recovery may have delivered the front of this batch already.
        let (first, in_order) = batch_range(&header, records, next, u64::MAX);
        let duplicates = header.count - in_order.len() / RECORD_BYTES;
        add(&self.state.counters.duplicates, duplicates as u64);
        self.deliver(stream, first, in_order);
    }

    /// The trust rule (docs/DELIVERY.md): a message is applied only if it comes from the
    /// publisher instance this edge serves (the first one applied) and claims at most
    /// `seq_ahead_max` beyond the next expected sequence, or keeps claiming beyond it for
    /// [`AHEAD_CONFIRM`] with nothing within it in between (a publisher back from a long
    /// outage sends nothing else; a stranger's claim is interrupted by the publisher's own
    /// heartbeats). Anything else is ignored and counted.
    fn believe(&mut self, header: &BatchHeader) -> bool {
        let served = self.publisher.unwrap_or(header.instance);
        if served != header.instance {
            let why = format!(
                "publisher instance {:016x}, this edge serves {served:016x} (a restarted \
                 engine needs its edges restarted)",
                header.instance
            );
            self.untrusted(&why);
            return false;
        }
        let stream = header.stream as usize;
        let bound = self.next_seq(header.stream).saturating_add(self.state.options.seq_ahead_max);
        if header.first_seq > bound {
            let since = *self.far_since[stream].get_or_insert_with(Instant::now);
            if since.elapsed() < AHEAD_CONFIRM {
                let name = header.stream.name();
                self.untrusted(&format!(
                    "{name} at {} beyond {bound} (seq_ahead_max)",
                    header.first_seq
                ));
                return false;
            }
        }
        self.far_since[stream] = None;
        if self.publisher.is_none() {
            let outlet = self.state.options.outlet;
            tracing::info!("edge {outlet}: serving publisher instance {served:016x}");
            self.publisher = Some(served);
        }
        true
    }

    /// Starts `stream` at `first_seq`, the first sequence heard (`FIRST_SEQ_HEARD`).
    fn start_at(&mut self, stream: Stream, first_seq: u64) {
        let outlet = self.state.options.outlet;
        tracing::info!("edge {outlet}: {} starts at {first_seq}, the first heard", stream.name());
        self.state.next_seqs.lock().unwrap_or_else(PoisonError::into_inner)[stream as usize] =
            first_seq;
    }

    /// The fence: `false` (counted) for a message of a leadership older than the newest one
    /// heard; a newer one becomes the newest. Only this task writes the epoch.
    fn current(&mut self, header: &BatchHeader) -> bool {
        match self.fence.admit(header.epoch) {
            Fenced::Stale => {
                add(&self.state.counters.fenced, 1);
                false
            }
            Fenced::Current => true,
            // `newest`: the newest epoch before this one (the log line's name, docs/LOGS.md).
            Fenced::Newer { previous: newest } => {
                // Relaxed: a figure for reports; the fence itself is this task's.
                self.state.epoch.store(header.epoch, Ordering::Relaxed);
                if newest > 0 {
                    let outlet = self.state.options.outlet;
                    tracing::info!(
                        "edge {outlet}: leadership epoch {} after {newest}",
                        header.epoch
                    );
                }
                true
            }
        }
    }

    fn bad(&mut self, why: &str) {
        add(&self.state.counters.bad_messages, 1);
        self.malformed_warning.warn(self.state.options.outlet, "malformed message dropped", why);
    }

    fn untrusted(&mut self, why: &str) {
        add(&self.state.counters.untrusted, 1);
        self.untrusted_warning.warn(self.state.options.outlet, "untrusted message ignored", why);
    }

    fn next_seq(&self, stream: Stream) -> u64 {
        self.state.next_seqs.lock().unwrap_or_else(PoisonError::into_inner)[stream as usize]
    }

    /// Recovers `first..=last` of `stream` from the retained window of publisher `instance`,
    /// reporting what is lost. A reply of no records numbered at or before `first` (a window
    /// that ends before it, or a regeneration that failed: `publish::regenerated_answer`)
    /// denies the gap for now: nothing is resynced, the next expected sequence stays, and the
    /// next batch or heartbeat past it asks again.
    async fn recover(&mut self, stream: Stream, first: u64, last: u64, instance: u64) {
        let outlet = self.state.options.outlet;
        add(&self.state.counters.gaps, 1);
        tracing::warn!("edge {outlet}: gap in {} {first}..={last}, recovering", stream.name());
        let mut from = first;
        while from <= last {
            let Some((header, payload)) = self.ask_window(stream, from, last, instance).await
            else {
                break;
            };
            if header.first_seq > from {
                self.resync(stream, from, (header.first_seq - 1).min(last));
            }
            if header.count == 0 {
                return;
            }
            // Only what was asked for, from the next expected on (a reply starting earlier is
            // not trusted to replace what was delivered).
            let (first, recovered) =
                batch_range(&header, &payload[BATCH_HEADER_BYTES..], from, last);
            // No overflow: `decode_batch` checked that the sequences fit.
            let next_from = header.first_seq + header.count as u64;
            if next_from <= from {
                self.bad("retain reply older than asked");
                break;
            }
            add(&self.state.counters.recovered, (recovered.len() / RECORD_BYTES) as u64);
            from = next_from;
            self.deliver(stream, first, recovered);
        }
        if from <= last {
            self.resync(stream, from, last);
        }
    }

    /// Asks the retained window for `from..=last` and waits up to [`RECOVER_TIMEOUT`] for a
    /// reply from publisher `instance` for this subject; other replies (a stranger answering
    /// too) are ignored and counted while the wait goes on. `None`: no valid reply in time,
    /// or nobody serves the window.
    async fn ask_window(
        &mut self,
        stream: Stream,
        from: u64,
        last: u64,
        instance: u64,
    ) -> Option<(BatchHeader, Bytes)> {
        let outlet = self.state.options.outlet;
        let subject = retain_subject(&self.state.options.prefix, outlet, stream);
        self.replies.sent += 1;
        let reply_to = format!("{}.{}", self.replies.inbox, self.replies.sent);
        let request = RetainRequest { from_seq: from, to_seq: last }.encode();
        let asked = self.state.client.publish_with_reply(subject, reply_to.clone(), request.into());
        asked.await.ok()?;
        let deadline = tokio::time::Instant::now() + RECOVER_TIMEOUT;
        loop {
            let reply = tokio::time::timeout_at(deadline, self.replies.subscription.next());
            let reply = reply.await.ok()??;
            if reply.subject.as_str() != reply_to {
                continue; // a late reply to an earlier request
            }
            if reply.status == Some(StatusCode::NO_RESPONDERS) {
                return None;
            }
            match decode_batch(&reply.payload) {
                Ok((header, _))
                    if (header.outlet, header.stream, header.instance)
                        == (outlet, stream, instance) =>
                {
                    if self.current(&header) {
                        return Some((header, reply.payload));
                    }
                }
                Ok(_) => self.untrusted("retain reply for another subject or publisher instance"),
                Err(error) => self.bad(&format!("retain reply: {error}")),
            }
        }
    }

    /// Tells every consumer that `first..=last` of `stream` is lost, and moves past it.
    fn resync(&mut self, stream: Stream, first: u64, last: u64) {
        let outlet = self.state.options.outlet;
        tracing::warn!("edge {outlet}: {} {first}..={last} lost: resync sent", stream.name());
        add(&self.state.counters.resyncs, 1);
        add(&self.state.counters.resync_records, last - first + 1);
        let mut frame = Vec::new();
        Frame::Resync { stream, first_seq: first, last_seq: last }.write(&mut frame);
        self.state.next_seqs.lock().unwrap_or_else(PoisonError::into_inner)[stream as usize] =
            last + 1;
        self.fan_out(frame.into(), 0);
    }

    /// Hands `records` (whole records, consecutive sequences from `first`, the next expected)
    /// to every consumer. Each record's bytes are copied once, into its frame, and only while
    /// a consumer is there to read it.
    fn deliver(&mut self, stream: Stream, first: u64, records: &[u8]) {
        let count = records.len() / RECORD_BYTES;
        if count == 0 {
            return;
        }
        {
            let mut next = self.state.next_seqs.lock().unwrap_or_else(PoisonError::into_inner);
            // The callers hand out from the next expected on; anything else would silently
            // reorder every consumer's stream, so it is refused (and would be a bug here).
            if first != next[stream as usize] {
                drop(next);
                return self
                    .bad(&format!("{} records from {first}, out of sequence", stream.name()));
            }
            next[stream as usize] = first + count as u64;
        }
        let received_abs_ns = monotonic_ns();
        for bytes in records.chunks_exact(RECORD_BYTES) {
            let record = Record(bytes.try_into().expect("chunks_exact of RECORD_BYTES"));
            let latency_ns = received_abs_ns.saturating_sub(record.intended_abs_ns());
            let counters = &self.state.counters;
            if stream == Stream::MarketData {
                self.latency.market_data.record_ns(latency_ns);
                counters.market_data_seconds.record_ns(latency_ns);
            } else if record.answers_request() {
                self.latency.answers.record_ns(latency_ns);
                counters.answer_seconds.record_ns(latency_ns);
            }
        }
        add(&self.state.counters.received, count as u64);
        if self.state.consumers.lock().unwrap_or_else(PoisonError::into_inner).is_empty() {
            return;
        }
        let chunk = self.frames(stream, first, records, received_abs_ns);
        self.fan_out(chunk, count as u64);
    }

    /// The data frames of `records` (consecutive sequences from `first`), as one chunk.
    fn frames(
        &mut self,
        stream: Stream,
        first: u64,
        records: &[u8],
        received_abs_ns: u64,
    ) -> Bytes {
        if self.chunk.capacity() < BATCH_RECORDS_MAX * DATA_FRAME_BYTES {
            self.chunk = BytesMut::with_capacity(CHUNK_BUFFER_BYTES);
        }
        for (seq, bytes) in (first..).zip(records.chunks_exact(RECORD_BYTES)) {
            self.chunk.extend_from_slice(&data_frame_head(stream, seq, received_abs_ns));
            self.chunk.extend_from_slice(bytes);
        }
        self.chunk.split().freeze()
    }

    /// Queues `chunk` for every consumer; a consumer whose queue is full is cut off.
    fn fan_out(&mut self, chunk: Bytes, records: u64) {
        let mut consumers = self.state.consumers.lock().unwrap_or_else(PoisonError::into_inner);
        consumers.retain(|consumer| match consumer.queue.try_send((chunk.clone(), records)) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                // Release: pairs with the writer's Acquire load; no data rides on it beyond
                // the flag itself, but the writer must not miss it once the queue closes.
                consumer.cut.store(true, Ordering::Release);
                add(&self.state.counters.cut_off, 1);
                tracing::warn!(
                    "edge {}: consumer {} cut off: {} chunks queued (consumer_queue_chunks)",
                    self.state.options.outlet,
                    consumer.peer,
                    self.state.options.consumer_queue_chunks
                );
                false
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        });
    }
}

/// Wait after a failed accept.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// Accepts consumers until stopped.
async fn accept(state: Arc<State>, listener: TcpListener, mut stopped: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => match state.admission.arrive(peer.ip()) {
                    Ok(pending) => {
                        tokio::spawn(admit(state.clone(), stream, peer, pending));
                    }
                    // Closed at once: no task, buffer or descriptor is kept for it.
                    Err(refusal) => refuse(&state, peer, &refusal.to_string()),
                },
                Err(error) => {
                    // Out of descriptors, say: back off instead of spinning (and logging) on
                    // the error.
                    tracing::warn!("edge accept failed: {error}; retrying in {ACCEPT_RETRY:?}");
                    tokio::time::sleep(ACCEPT_RETRY).await;
                }
            },
            _ = stopped.changed() => break,
        }
    }
}

/// Counts a refused connection and warns about it, rate-limited (a flood must not flood the
/// log).
fn refuse(state: &State, peer: SocketAddr, why: &str) {
    add(&state.counters.refused, 1);
    let mut warning = state.refusal_warning.lock().unwrap_or_else(PoisonError::into_inner);
    warning.warn(state.options.outlet, &format!("consumer {peer} refused"), why);
}

/// Reads the hello (within [`HELLO_TIMEOUT`]), seats the consumer and writes to it.
async fn admit(state: Arc<State>, mut stream: TcpStream, peer: SocketAddr, pending: Pending) {
    let outlet = state.options.outlet;
    let _ = stream.set_nodelay(true);
    let hello = match tokio::time::timeout(HELLO_TIMEOUT, read_hello(&mut stream)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(code)) => Err(code),
        Err(_) => Err(crate::wire::WireError::Truncated("hello timeout").code()),
    };
    if let Err(reason) = hello {
        refuse(&state, peer, &format!("bad hello (reason {reason})"));
        return goodbye(&mut stream, reason).await;
    }
    let _seat = match pending.seat() {
        Ok(seat) => seat,
        Err(refusal) => {
            refuse(&state, peer, &refusal.to_string());
            return goodbye(&mut stream, GOODBYE_FULL).await;
        }
    };
    let (queue, chunks) = mpsc::channel(state.options.consumer_queue_chunks);
    let cut = Arc::new(AtomicBool::new(false));
    let slot = ConsumerSlot { queue, peer, cut: cut.clone() };
    state.consumers.lock().unwrap_or_else(PoisonError::into_inner).push(slot);
    add(&state.counters.consumers, 1);
    tracing::info!("edge {outlet}: consumer {peer} connected");
    write_chunks(&state, stream, peer, chunks, &cut).await;
}

async fn read_hello(stream: &mut TcpStream) -> Result<(), u8> {
    let mut decoder = FrameDecoder::default();
    let mut buffer = [0u8; FRAME_PREFIX_BYTES + FRAME_BYTES_MAX];
    loop {
        match decoder.next_frame() {
            Ok(Some(Frame::Hello { version: WIRE_VERSION })) => return Ok(()),
            Ok(Some(Frame::Hello { version })) => {
                return Err(crate::wire::WireError::Version(version).code());
            }
            Ok(Some(_)) => return Err(crate::wire::WireError::FrameType(0).code()),
            Ok(None) => {}
            Err(error) => return Err(error.code()),
        }
        let n = stream.read(&mut buffer).await.map_err(|_| 1u8)?;
        if n == 0 {
            return Err(crate::wire::WireError::Truncated("hello").code());
        }
        decoder.extend(&buffer[..n]);
    }
}

/// Writes queued chunks until the queue closes (shutdown or cut off) or a write fails or
/// stalls past [`WRITE_TIMEOUT`].
async fn write_chunks(
    state: &State,
    mut stream: TcpStream,
    peer: SocketAddr,
    mut chunks: mpsc::Receiver<(Bytes, u64)>,
    cut: &AtomicBool,
) {
    let outlet = state.options.outlet;
    // Acquire: pairs with the sequencer's Release store of the flag.
    let is_cut = || cut.load(Ordering::Acquire);
    while let Some((chunk, records)) = chunks.recv().await {
        if is_cut() {
            break;
        }
        match tokio::time::timeout(WRITE_TIMEOUT, stream.write_all(&chunk)).await {
            Ok(Ok(())) => add(&state.counters.delivered, records),
            Ok(Err(error)) => {
                tracing::info!("edge {outlet}: consumer {peer} left ({error})");
                return;
            }
            Err(_) => {
                if !is_cut() {
                    add(&state.counters.cut_off, 1);
                    tracing::warn!("edge {outlet}: consumer {peer} cut off: write stalled");
                }
                return goodbye(&mut stream, GOODBYE_SLOW).await;
            }
        }
    }
    // The queue was closed or abandoned: a shutdown, or a cut-off by the sequencer.
    goodbye(&mut stream, if is_cut() { GOODBYE_SLOW } else { GOODBYE_SHUTDOWN }).await;
}

async fn goodbye(stream: &mut TcpStream, reason: u8) {
    let mut frame = Vec::new();
    Frame::Goodbye { reason }.write(&mut frame);
    let _ = tokio::time::timeout(GOODBYE_TIMEOUT, stream.write_all(&frame)).await;
    let _ = stream.shutdown().await;
}

#[cfg(test)]
mod fence_tests {
    use super::{EpochFence, Fenced};

    #[test]
    fn the_fence_drops_an_older_leadership_once_a_newer_one_was_heard() {
        let mut fence = EpochFence::default();
        assert_eq!(fence.admit(5), Fenced::Newer { previous: 0 });
        assert_eq!(fence.admit(5), Fenced::Current);
        assert_eq!(fence.admit(9), Fenced::Newer { previous: 5 });
        let late = fence.admit(5);
        if cfg!(feature = "regress-unfenced-publish") {
            assert_eq!(late, Fenced::Current);
        } else {
            assert_eq!(late, Fenced::Stale, "a deposed leader's late batch");
        }
        assert_eq!(fence.newest(), 9);
    }
}
