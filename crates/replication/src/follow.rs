//! The engine's side of the input log: a shard's stream read in stream order from a chosen
//! sequence, every record checked to follow the one before it.
//!
//! The stream sequence is the shard's input sequence: every engine that follows a stream
//! applies the same inputs in the same order, so replicas compute the same outputs (the
//! tier's output hash says so). A hole (inputs removed below a reader) is an error, never
//! skipped.

use async_nats::jetstream::{self, consumer::DeliverPolicy, consumer::push::OrderedConfig};
use futures_util::StreamExt;
use matching::msg::InboundOrder;

use crate::error::ReplicationError;
use crate::layout::{LogSettings, retry_at_startup};
use crate::record;

/// One input as the stream holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoggedOrder {
    /// Its stream sequence (the shard's input sequence).
    pub stream_seq: u64,
    /// The order (stamps zero).
    pub order: InboundOrder,
    /// When its client meant to send it, absolute monotonic ns (0: unknown).
    pub intended_abs_ns: u64,
}

/// Reads one shard's stream in order.
pub struct Follower {
    stream: String,
    next_seq: u64,
    messages: jetstream::consumer::push::Ordered,
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
        let config = OrderedConfig {
            deliver_subject: client.new_inbox(),
            deliver_policy: DeliverPolicy::ByStartSequence { start_sequence: from_seq.max(1) },
            ..Default::default()
        };
        let what = format!("following stream {name}");
        let consumer = retry_at_startup(&what, || stream.create_consumer(config.clone())).await?;
        let messages = consumer.messages().await;
        let messages =
            messages.map_err(|e| ReplicationError::jetstream(format!("reading {name}"), e))?;
        Ok(Follower { stream: name, next_seq: from_seq.max(1), messages })
    }

    /// The next input, in stream order; waits until one is appended. `None`: the consumer
    /// ended (the connection closed).
    pub async fn next(&mut self) -> Option<Result<LoggedOrder, ReplicationError>> {
        let message = match self.messages.next().await? {
            Ok(message) => message,
            Err(error) => {
                let what = format!("reading stream {}", self.stream);
                return Some(Err(ReplicationError::jetstream(what, error)));
            }
        };
        let stream_seq = match message.info() {
            Ok(info) => info.stream_sequence,
            Err(error) => {
                let what = format!("message info on stream {}", self.stream);
                return Some(Err(ReplicationError::jetstream(what, error)));
            }
        };
        Some(self.accept(stream_seq, &message.payload))
    }

    /// The next sequence this follower will deliver.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    fn accept(&mut self, stream_seq: u64, payload: &[u8]) -> Result<LoggedOrder, ReplicationError> {
        if stream_seq != self.next_seq {
            let (stream, expected) = (self.stream.clone(), self.next_seq);
            return Err(ReplicationError::Gap { stream, expected, found: stream_seq });
        }
        let (order, intended_abs_ns) = record::decode(payload).map_err(|source| {
            ReplicationError::Record { stream: self.stream.clone(), seq: stream_seq, source }
        })?;
        self.next_seq += 1;
        Ok(LoggedOrder { stream_seq, order, intended_abs_ns })
    }
}
