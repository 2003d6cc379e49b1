//! The gateway's side of the input log: each order appended to its shard's stream under a
//! message id that names where it came from, acknowledged once a quorum of the stream's
//! replicas stored it.
//!
//! A gateway that loses an acknowledgement (a node died, a leader moved) appends again under
//! the same id: inside the stream's deduplication window JetStream answers with the first
//! copy's sequence and `duplicate`, so a retry never books a second order.
//!
//! An append still unacknowledged when retrying would leave that window ends
//! [`ReplicationError::NotAcknowledged`] with an [`Unacknowledged`]: its outcome is unknown
//! (a copy may have landed, or may still land), and [`OrderLog::find_appends`] asks the log
//! which it was once the log answers again.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_nats::header::NATS_MESSAGE_ID;
use async_nats::jetstream;
use async_nats::jetstream::consumer::{DeliverPolicy, push::OrderedConfig};
use async_nats::jetstream::context::PublishErrorKind;
use futures_util::StreamExt;
use matching::msg::InboundOrder;

use crate::error::ReplicationError;
pub use crate::error::Unacknowledged;
use crate::layout::LogSettings;
use crate::record::{self, RECORDS_PER_MESSAGE_MAX};

/// How long one append waits for its acknowledgement.
pub const APPEND_ACK_TIMEOUT: Duration = Duration::from_secs(2);
/// How much of the streams' deduplication window an append's retries leave unused: an append
/// is retried under its id until the window, less this margin, has passed since its first
/// attempt, so every retry falls inside the window of any copy an earlier attempt stored. A
/// node's loss or a leader's move costs seconds; a longer outage ends, within the window, with
/// the order booked once and reported, never with an answer that it was lost while it landed.
pub const DEDUP_MARGIN: Duration = Duration::from_secs(10);
/// First pause before a retry after a refusal that came at once (disconnected, no stream
/// leader yet); it doubles up to [`RETRY_PAUSE_MAX`].
const RETRY_PAUSE_FIRST: Duration = Duration::from_millis(20);
const RETRY_PAUSE_MAX: Duration = Duration::from_millis(500);
/// Most log messages one [`OrderLog::find_appends`] reads (headers only, about 100 bytes
/// each): past them, an append not found yet is [`AppendOutcome::Unknown`]. A search covers
/// what every gateway appended to the shard while this one's append went unacknowledged (at
/// 1,000 messages/s, a 2 min window is 120,000 messages).
pub const FIND_SCAN_MESSAGES_MAX: u64 = 1_000_000;
/// How long a search waits for the next message of its range before it fails (and is tried
/// again later).
const FIND_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Which append a log message is: unique per message as long as each run's counter is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AppendId {
    /// The gateway process.
    pub gateway: u32,
    /// The gateway's run: a restarted gateway takes a new one, so its ids never meet a
    /// previous run's inside the deduplication window.
    pub run: u64,
    /// The message's number in that run (a retry of the message keeps it).
    pub seq: u64,
}

impl fmt::Display for AppendId {
    /// The JetStream message id: `{gateway}-{run}-{seq}`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}-{}", self.gateway, self.run, self.seq)
    }
}

/// An acknowledged append.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Appended {
    /// The shard stream that holds the order.
    pub shard: u32,
    /// Its sequence there: the shard's input sequence.
    pub stream_seq: u64,
    /// The id was appended before (a retry): nothing new was stored.
    pub duplicate: bool,
    /// Orders the message holds.
    pub orders: usize,
}

/// What the log says of an [`Unacknowledged`] append ([`OrderLog::find_appends`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AppendOutcome {
    /// A copy is in the stream at this sequence: the engines apply it and report it.
    Landed(u64),
    /// No copy is in the stream, and none handed to the log before the search can land any
    /// more: its orders were not booked.
    Absent,
    /// The log cannot tell: the stream was trimmed into the range a copy would be in, or the
    /// range is longer than [`FIND_SCAN_MESSAGES_MAX`] and the part read holds none.
    Unknown,
}

/// Appends orders to their shard streams; cheap to clone (one client, shared settings).
#[derive(Clone)]
pub struct OrderLog {
    client: async_nats::Client,
    js: jetstream::Context,
    settings: Arc<LogSettings>,
    /// Each shard's subject, made once (cheap to clone per append).
    subjects: Arc<[async_nats::Subject]>,
    /// Per shard, the newest stream sequence known to be stored (at open, then each
    /// acknowledgement's): a copy of an append started after it was read lands after it.
    stored_seq: Arc<[AtomicU64]>,
    /// How long an append is retried: the streams' shortest deduplication window less
    /// [`DEDUP_MARGIN`].
    retry_for: Duration,
}

impl OrderLog {
    /// Opens the log on `client`, creating the shard streams that do not exist yet.
    pub async fn open(
        client: async_nats::Client,
        settings: LogSettings,
    ) -> Result<OrderLog, ReplicationError> {
        let mut js = jetstream::new(client.clone());
        js.set_timeout(APPEND_ACK_TIMEOUT);
        let dedup_window = settings.ensure_streams(&js).await?;
        let retry_for = dedup_window.saturating_sub(DEDUP_MARGIN).max(APPEND_ACK_TIMEOUT);
        let subjects = (0..settings.shards).map(|shard| settings.subject(shard).into()).collect();
        let mut stored_seq = Vec::with_capacity(settings.shards as usize);
        for shard in 0..settings.shards {
            stored_seq.push(AtomicU64::new(last_seq(&js, &settings.stream(shard)).await?));
        }
        let (settings, stored_seq) = (Arc::new(settings), stored_seq.into());
        Ok(OrderLog { client, js, settings, subjects, stored_seq, retry_for })
    }

    /// Whether its NATS connection is up now (what a gateway's `/ready` follows).
    pub fn is_connected(&self) -> bool {
        self.client.connection_state() == async_nats::connection::State::Connected
    }

    /// The log's layout.
    pub fn settings(&self) -> &LogSettings {
        &self.settings
    }

    /// Appends `order` to its instrument's shard stream under `id`, retrying (same id) until
    /// a quorum acknowledged it or the streams' deduplication window (less [`DEDUP_MARGIN`]) passed.
    pub async fn append(
        &self,
        order: &InboundOrder,
        id: AppendId,
        intended_abs_ns: u64,
    ) -> Result<Appended, ReplicationError> {
        let shard = self.settings.shard_of(order.instrument);
        let message = self.message(shard, &[(*order, intended_abs_ns)], id);
        self.retry(message, std::time::Instant::now()).await
    }

    /// Queues `order` for its stream now, and returns the wait for its acknowledgement (which
    /// retries as [`OrderLog::append`] does). One caller's orders reach the stream in the order
    /// of its calls (one connection keeps them in order), so a session's cancel never overtakes
    /// its order; only a retry after a lost acknowledgement can land behind later orders.
    pub async fn start_append(
        &self,
        order: &InboundOrder,
        id: AppendId,
        intended_abs_ns: u64,
    ) -> impl Future<Output = Result<Appended, ReplicationError>> + Send + 'static + use<> {
        let shard = self.settings.shard_of(order.instrument);
        self.start_append_batch(shard, &[(*order, intended_abs_ns)], id).await
    }

    /// [`OrderLog::start_append`] for 1..=[`RECORDS_PER_MESSAGE_MAX`] orders of `shard`'s
    /// instruments (each with its intended send time) as one message: one append, one stream
    /// sequence, one message id. Panics on an empty, oversized or mixed-shard batch (a caller's
    /// bug that would book orders on the wrong shard).
    pub async fn start_append_batch(
        &self,
        shard: u32,
        orders: &[(InboundOrder, u64)],
        id: AppendId,
    ) -> impl Future<Output = Result<Appended, ReplicationError>> + Send + 'static + use<> {
        let message = self.message(shard, orders, id);
        let (started, log) = (std::time::Instant::now(), self.clone());
        let queued = self
            .js
            .publish_with_headers(
                message.subject.clone(),
                message.headers(),
                message.payload.clone(),
            )
            .await;
        async move {
            // Moved out before the await: the acknowledgement future is `Send`, not `Sync`.
            let acked = match queued {
                Ok(ack) => ack.await.ok(),
                Err(_) => None,
            };
            match acked {
                Some(ack) => Ok(log.appended(&message, ack)),
                None => log.retry(message, started).await,
            }
        }
    }

    /// `orders` of `shard` ready to append as one message.
    fn message(&self, shard: u32, orders: &[(InboundOrder, u64)], id: AppendId) -> Message {
        assert!(
            (1..=RECORDS_PER_MESSAGE_MAX).contains(&orders.len()),
            "a log message holds 1..={RECORDS_PER_MESSAGE_MAX} orders, not {}",
            orders.len()
        );
        let mut payload = bytes::BytesMut::with_capacity(orders.len() * record::RECORD_BYTES);
        for (order, intended_abs_ns) in orders {
            let of = self.settings.shard_of(order.instrument);
            assert_eq!(of, shard, "instrument {} is shard {of}'s", order.instrument);
            payload.extend_from_slice(&record::encode(order, *intended_abs_ns));
        }
        Message {
            shard,
            subject: self.subjects[shard as usize].clone(),
            id: id.to_string(),
            payload: payload.freeze(),
            orders: orders.len(),
            // Relaxed: any value read is a sequence stored before this message's first
            // attempt (made after this read), so every copy of it lands after it.
            after_seq: self.stored_seq[shard as usize].load(Ordering::Relaxed),
        }
    }

    /// Appends `message` until acknowledged or the streams' deduplication window (less [`DEDUP_MARGIN`]) after `started`.
    async fn retry(
        &self,
        message: Message,
        started: std::time::Instant,
    ) -> Result<Appended, ReplicationError> {
        let (mut attempts, mut pause) = (0, RETRY_PAUSE_FIRST);
        while attempts == 0 || started.elapsed() < self.retry_for {
            attempts += 1;
            let publish = self.js.publish_with_headers(
                message.subject.clone(),
                message.headers(),
                message.payload.clone(),
            );
            let acked = match publish.await {
                Ok(ack) => ack.await.map_err(|error| error.to_string()),
                Err(error) => Err(error.to_string()),
            };
            match acked {
                Ok(ack) => return Ok(self.appended(&message, ack)),
                Err(reason) => {
                    tracing::debug!("append {}, attempt {attempts}: {reason}", message.id);
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(RETRY_PAUSE_MAX);
                }
            }
        }
        let (shard, id, after_seq, payload) =
            (message.shard, message.id, message.after_seq, message.payload);
        let waited = started.elapsed();
        let unacknowledged = Unacknowledged { shard, id, after_seq, attempts, waited, payload };
        Err(ReplicationError::NotAcknowledged(Box::new(unacknowledged)))
    }

    /// Tells, for `appends` of `shard` that ended unacknowledged, whether each landed, in
    /// their order. An error (the log unreachable, no stream leader yet, a read that stalled)
    /// is no outcome: ask again later.
    ///
    /// It publishes a barrier on this client's connection, then reads the stream (headers
    /// only, on an ordered consumer) after the appends' [`Unacknowledged::after_seq`] up to the
    /// sequence the barrier's refusal names, looking for their message ids. Why a copy cannot
    /// land after an [`AppendOutcome::Absent`] (the late-landing race: a copy still buffered
    /// in this client while it was disconnected, or in a paused server's socket or queue):
    /// * every copy is a publish this client sent before the search, on its one connection;
    ///   the barrier follows them there, and NATS keeps one connection's messages in order up
    ///   to the stream's leader, which takes a stream's publishes one at a time in arrival
    ///   order and puts them in the stream's Raft log in that order;
    /// * the leader checks the barrier's expected last sequence (`u64::MAX`: never true, so
    ///   the barrier is never stored) when it applies it (nats-server 2.9; 2.11 and later when
    ///   it proposes it), so its refusal names a sequence at or after every copy's, and the
    ///   search reads up to it (waiting for it when it was only proposed);
    /// * a copy a deposed leader proposed that never committed is gone for good: its
    ///   successor's log replaces it (Raft), and a copy a deposed leader had not proposed yet
    ///   it drops.
    ///
    /// Not covered: a copy held by a server this client has since left (its connection broke
    /// and it reconnected to another node) reaches the leader when that server reads it, which
    /// may be after the barrier; the engines then book the order after its client was told it
    /// was not, and report it.
    pub async fn find_appends(
        &self,
        shard: u32,
        appends: &[Unacknowledged],
    ) -> Result<Vec<AppendOutcome>, ReplicationError> {
        let through = self.barrier(shard).await?;
        let name = self.settings.stream(shard);
        let what = format!("opening stream {name}");
        let stream = self.js.get_stream(&name).await;
        let stream = stream.map_err(|e| ReplicationError::jetstream(&what, e))?;
        let first_seq = stream.cached_info().state.first_sequence.max(1);
        let after = appends.iter().map(|a| a.after_seq).min().unwrap_or(through);
        let from = (after + 1).max(first_seq);
        let to = through.min(from.saturating_add(FIND_SCAN_MESSAGES_MAX - 1));
        let mut found: std::collections::HashMap<&str, u64> =
            appends.iter().map(|a| (a.id.as_str(), 0)).collect();
        if from <= to {
            self.scan(shard, &stream, from..=to, &mut found).await?;
        }
        let outcome = |append: &Unacknowledged| match found[append.id.as_str()] {
            0 if append.after_seq + 1 < first_seq || to < through => AppendOutcome::Unknown,
            0 => AppendOutcome::Absent,
            seq => AppendOutcome::Landed(seq),
        };
        Ok(appends.iter().map(outcome).collect())
    }

    /// Reads `stream` over `range` (headers only) and notes where each message id of `found`
    /// is, until every one is found or the range is read.
    async fn scan(
        &self,
        shard: u32,
        stream: &jetstream::stream::Stream,
        range: std::ops::RangeInclusive<u64>,
        found: &mut std::collections::HashMap<&str, u64>,
    ) -> Result<(), ReplicationError> {
        let what = format!("searching stream {}", self.settings.stream(shard));
        let failed = |error: &dyn fmt::Display| ReplicationError::jetstream(&what, error);
        let config = OrderedConfig {
            deliver_subject: self.client.new_inbox(),
            deliver_policy: DeliverPolicy::ByStartSequence { start_sequence: *range.start() },
            headers_only: true,
            ..Default::default()
        };
        let consumer = stream.create_consumer(config).await.map_err(|e| failed(&e))?;
        let mut messages = consumer.messages().await.map_err(|e| failed(&e))?;
        let mut missing = found.len();
        while missing > 0 {
            let message = match tokio::time::timeout(FIND_READ_TIMEOUT, messages.next()).await {
                Ok(Some(Ok(message))) => message,
                Ok(Some(Err(error))) => return Err(failed(&error)),
                Ok(None) => return Err(failed(&"the consumer ended")),
                Err(_) => return Err(failed(&"read timed out")),
            };
            let seq = message.info().map_err(|e| failed(&e))?.stream_sequence;
            let id = message.headers.as_ref().and_then(|h| h.get(NATS_MESSAGE_ID));
            if let Some(at) = id.and_then(|id| found.get_mut(id.as_str()))
                && *at == 0
            {
                *at = seq;
                missing -= 1;
                // Relaxed: as in `appended` (a sequence read from the stream is stored).
                self.stored_seq[shard as usize].fetch_max(seq, Ordering::Relaxed);
            }
            if seq >= *range.end() {
                break;
            }
        }
        Ok(())
    }

    /// The stream's last sequence as its leader saw it once every publish this client made
    /// before reached it: a publish expecting the last sequence `u64::MAX`, which the leader
    /// refuses (never stores), naming the sequence (see [`OrderLog::find_appends`]).
    async fn barrier(&self, shard: u32) -> Result<u64, ReplicationError> {
        let what = || format!("the search barrier on {}", self.settings.stream(shard));
        let mut headers = async_nats::HeaderMap::new();
        let never = u64::MAX.to_string();
        headers.insert(async_nats::header::NATS_EXPECTED_LAST_SEQUENCE, never.as_str());
        let subject = self.subjects[shard as usize].clone();
        let queued = self.js.publish_with_headers(subject, headers, bytes::Bytes::new()).await;
        let refused = match queued.map_err(|e| ReplicationError::jetstream(what(), e))?.await {
            Err(refused) if refused.kind() == PublishErrorKind::WrongLastSequence => refused,
            Err(error) => return Err(ReplicationError::jetstream(what(), error)),
            Ok(ack) => {
                let why =
                    format!("stored at {}: the server ignored its expected sequence", ack.sequence);
                return Err(ReplicationError::jetstream(what(), why));
            }
        };
        // "wrong last sequence: N (code 400, error code 10071)".
        let text = refused.to_string();
        let digits = text
            .rsplit_once("sequence: ")
            .map(|(_, tail)| tail.split(|c: char| !c.is_ascii_digit()).next().unwrap_or_default());
        let seq = digits.and_then(|digits| digits.parse().ok());
        seq.ok_or_else(|| ReplicationError::jetstream(what(), format!("unread refusal: {text}")))
    }

    /// `message`'s acknowledgement, its sequence now known to be stored.
    fn appended(&self, message: &Message, ack: jetstream::publish::PublishAck) -> Appended {
        // Relaxed: a lower bound, read before later appends' first attempt ([`Message`]).
        self.stored_seq[message.shard as usize].fetch_max(ack.sequence, Ordering::Relaxed);
        let (shard, orders) = (message.shard, message.orders);
        Appended { shard, stream_seq: ack.sequence, duplicate: ack.duplicate, orders }
    }
}

/// `name`'s last sequence now (0: empty).
async fn last_seq(js: &jetstream::Context, name: &str) -> Result<u64, ReplicationError> {
    let what = format!("reading stream {name}");
    let stream = crate::layout::retry_at_startup(&what, || js.get_stream(name)).await?;
    Ok(stream.cached_info().state.last_sequence)
}

/// Orders ready to append: their stream's subject, message id and records.
struct Message {
    shard: u32,
    subject: async_nats::Subject,
    id: String,
    payload: bytes::Bytes,
    orders: usize,
    /// [`Unacknowledged::after_seq`].
    after_seq: u64,
}

impl Message {
    fn headers(&self) -> async_nats::HeaderMap {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(NATS_MESSAGE_ID, self.id.as_str());
        headers
    }
}
