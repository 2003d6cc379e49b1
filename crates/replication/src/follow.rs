//! The engine's side of the input log: a shard's stream read in stream order from a chosen
//! sequence, every record checked to follow the one before it.
//!
//! The stream sequence (with a record's place in its message) is the shard's input sequence:
//! every engine that follows a stream applies the same inputs in the same order, so replicas
//! compute the same outputs (the tier's output hash says so). A hole (inputs removed below a
//! reader) is an error, never skipped; so is a message that does not read whole (no record of
//! it is delivered).

use async_nats::jetstream::{self, consumer::DeliverPolicy, consumer::push::OrderedConfig};
use std::time::Duration;

use futures_util::{FutureExt, StreamExt};
use matching::msg::InboundOrder;

use crate::error::ReplicationError;
use crate::layout::{LogSettings, retry_at_startup};
use crate::record;

/// One input as the stream holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoggedOrder {
    /// The stream sequence of its message (the shard's input sequence).
    pub stream_seq: u64,
    /// The last record of its message: after it, the engine's state is the state after
    /// `stream_seq` (what snapshots and progress count in).
    pub last_in_message: bool,
    /// The order (stamps zero).
    pub order: InboundOrder,
    /// When its client meant to send it, absolute monotonic ns (0: unknown).
    pub intended_abs_ns: u64,
}

/// How long the follower waits for a message before it asks the stream whether one is due. An
/// ordered consumer lives on one node (the stream's leader when it was made): when that node
/// dies while this connection's node stays up, async-nats notices only after two missed idle
/// heartbeats (10 s, fixed in async-nats 0.42). Two checks in a row that find the stream holding
/// the next sequence while nothing arrived subscribe again: a stalled consumer costs at most
/// about two intervals; an idle stream (nothing due) costs one stream-info request per interval.
pub const STALL_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// Reads one shard's stream in order.
pub struct Follower {
    stream: String,
    /// The stream and the connection, to subscribe again after a read failed.
    source: (jetstream::stream::Stream, async_nats::Client),
    next_seq: u64,
    messages: jetstream::consumer::push::Ordered,
    /// The last stall check found the next sequence in the stream, and nothing came since.
    due_at_last_check: bool,
    /// The current message's records not yet handed out.
    pending: std::collections::VecDeque<LoggedOrder>,
}

impl Follower {
    /// Follows `shard`'s stream from sequence `from_seq` (1: the beginning), through an
    /// ordered consumer (JetStream re-creates it past the last delivered sequence when a
    /// server fails, so the order survives a node's loss).
    pub async fn open(
        client: async_nats::Client,
        settings: &LogSettings,
        shard: u32,
        from_seq: u64,
    ) -> Result<Follower, ReplicationError> {
        let js = jetstream::new(client.clone());
        settings.ensure_streams(&js).await?;
        let name = settings.stream(shard);
        let what = format!("opening stream {name}");
        let stream = retry_at_startup(&what, || js.get_stream(&name)).await?;
        let next_seq = from_seq.max(1);
        let messages = subscribe(&stream, &client, &name, next_seq).await?;
        let pending = std::collections::VecDeque::with_capacity(record::RECORDS_PER_MESSAGE_MAX);
        let source = (stream, client);
        Ok(Follower { stream: name, source, next_seq, messages, due_at_last_check: false, pending })
    }

    /// The next input, in stream order; waits until one is appended. `None`: the consumer
    /// ended (the connection closed). A read that fails (the consumer missed its heartbeats
    /// while a node died or the stream's leader moved), or a consumer that delivers nothing
    /// while the stream holds the next sequence ([`STALL_CHECK_INTERVAL`]), subscribes again
    /// at the next sequence instead of stopping the engine: nothing is skipped or read twice
    /// (`accept` checks each sequence); only a subscription that cannot be made within
    /// `STARTUP_WAIT` is an error.
    pub async fn next(&mut self) -> Option<Result<LoggedOrder, ReplicationError>> {
        if let Some(pending) = self.pending.pop_front() {
            return Some(Ok(pending));
        }
        let message = loop {
            // A message already there is taken without a timer (the stream's read is
            // cancel-safe: its state lives in `messages`); only a wait is timed.
            let read = match self.messages.next().now_or_never() {
                Some(ready) => Ok(ready),
                None => tokio::time::timeout(STALL_CHECK_INTERVAL, self.messages.next()).await,
            };
            let why = match read {
                Ok(read) => match read? {
                    Ok(message) => break message,
                    Err(error) => error.to_string(),
                },
                Err(_) if self.stalled().await => "the stream holds the next message".into(),
                Err(_) => continue,
            };
            let (stream, next_seq) = (&self.stream, self.next_seq);
            tracing::warn!("following {stream}: {why}; subscribing again at {next_seq}");
            let (source, client) = &self.source;
            match subscribe(source, client, stream, next_seq).await {
                Ok(messages) => self.messages = messages,
                Err(error) => return Some(Err(error)),
            }
            self.due_at_last_check = false;
        };
        self.due_at_last_check = false;
        let stream_seq = match message.info() {
            Ok(info) => info.stream_sequence,
            Err(error) => {
                let what = format!("message info on stream {}", self.stream);
                return Some(Err(ReplicationError::jetstream(what, error)));
            }
        };
        let accepted = self.accept(stream_seq, &message.payload);
        Some(accepted.map(|()| self.pending.pop_front().expect("a message holds a record")))
    }

    /// Whether the consumer has stalled: this check and the one before found the stream holding
    /// the next sequence while nothing was delivered. A check the stream cannot answer (no
    /// leader yet) finds nothing due.
    async fn stalled(&mut self) -> bool {
        let info = tokio::time::timeout(STALL_CHECK_INTERVAL, self.source.0.get_info()).await;
        let due = info.is_ok_and(|info| info.is_ok_and(|i| i.state.last_sequence >= self.next_seq));
        let stalled = due && self.due_at_last_check;
        self.due_at_last_check = due;
        stalled
    }

    /// The next sequence this follower will deliver.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Checks that message `stream_seq` follows the last and queues its records.
    fn accept(&mut self, stream_seq: u64, payload: &[u8]) -> Result<(), ReplicationError> {
        if stream_seq != self.next_seq {
            let (stream, expected) = (self.stream.clone(), self.next_seq);
            return Err(ReplicationError::Gap { stream, expected, found: stream_seq });
        }
        let bad = |source| ReplicationError::Record {
            stream: self.stream.clone(),
            seq: stream_seq,
            source,
        };
        let records = record::records(payload).map_err(bad)?;
        let count = records.len();
        for (at, bytes) in records.enumerate() {
            let (order, intended_abs_ns) = record::decode(bytes).map_err(|source| {
                self.pending.clear(); // all of a message or none of it
                bad(source)
            })?;
            let last_in_message = at + 1 == count;
            self.pending.push_back(LoggedOrder {
                stream_seq,
                last_in_message,
                order,
                intended_abs_ns,
            });
        }
        self.next_seq += 1;
        Ok(())
    }
}

/// An ordered consumer of `stream` (`name`) from `from_seq`, retried for `STARTUP_WAIT`.
async fn subscribe(
    stream: &jetstream::stream::Stream,
    client: &async_nats::Client,
    name: &str,
    from_seq: u64,
) -> Result<jetstream::consumer::push::Ordered, ReplicationError> {
    let config = OrderedConfig {
        deliver_subject: client.new_inbox(),
        deliver_policy: DeliverPolicy::ByStartSequence { start_sequence: from_seq },
        ..Default::default()
    };
    let what = format!("following stream {name}");
    // Each try bounded by the stall check's interval, not JetStream's 5 s request timeout.
    let create = || async {
        let created =
            tokio::time::timeout(STALL_CHECK_INTERVAL, stream.create_consumer(config.clone()));
        created.await.map_err(|_| "timed out".to_string())?.map_err(|e| e.to_string())
    };
    let consumer = retry_at_startup(&what, create).await?;
    let messages = consumer.messages().await;
    messages.map_err(|e| ReplicationError::jetstream(format!("reading {name}"), e))
}
