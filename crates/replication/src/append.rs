//! The gateway's side of the input log: each order appended to its shard's stream under a
//! message id that names where it came from, acknowledged once a quorum of the stream's
//! replicas stored it.
//!
//! A gateway that loses an acknowledgement (a node died, a leader moved) appends again under
//! the same id: inside the stream's deduplication window JetStream answers with the first
//! copy's sequence and `duplicate`, so a retry never books a second order.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use matching::msg::InboundOrder;

use crate::error::ReplicationError;
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

/// Appends orders to their shard streams; cheap to clone (one client, shared settings).
#[derive(Clone)]
pub struct OrderLog {
    client: async_nats::Client,
    js: jetstream::Context,
    settings: Arc<LogSettings>,
    /// Each shard's subject, made once (cheap to clone per append).
    subjects: Arc<[async_nats::Subject]>,
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
        let settings = Arc::new(settings);
        Ok(OrderLog { client, js, settings, subjects, retry_for })
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
                Some(ack) => Ok(message.appended(ack)),
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
                Ok(ack) => return Ok(message.appended(ack)),
                Err(reason) => {
                    tracing::debug!("append {}, attempt {attempts}: {reason}", message.id);
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(RETRY_PAUSE_MAX);
                }
            }
        }
        let (id, waited) = (message.id, started.elapsed());
        Err(ReplicationError::NotAcknowledged { id, attempts, waited })
    }
}

/// Orders ready to append: their stream's subject, message id and records.
struct Message {
    shard: u32,
    subject: async_nats::Subject,
    id: String,
    payload: bytes::Bytes,
    orders: usize,
}

impl Message {
    fn headers(&self) -> async_nats::HeaderMap {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(async_nats::header::NATS_MESSAGE_ID, self.id.as_str());
        headers
    }

    fn appended(&self, ack: jetstream::publish::PublishAck) -> Appended {
        let (shard, orders) = (self.shard, self.orders);
        Appended { shard, stream_seq: ack.sequence, duplicate: ack.duplicate, orders }
    }
}
