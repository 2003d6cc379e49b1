//! The crate's typed error.

use std::time::Duration;

use exchange::msg::InboundOrder;

/// What went wrong talking to the replicated log or the lease.
#[derive(Debug, thiserror::Error)]
pub enum ReplicationError {
    /// Settings that cannot work (a bad prefix, zero shards, a TTL not above its renewal).
    #[error("bad replication settings: {0}")]
    BadSettings(String),
    /// JetStream refused or failed an operation (`what` names it; `reason` is the server's or
    /// client's words).
    #[error("JetStream {what}: {reason}")]
    JetStream {
        /// The operation, e.g. "creating stream LEANTIER_ORDERS_0".
        what: String,
        /// Why it failed.
        reason: String,
    },
    /// No acknowledgement from a quorum in time, after every retry: whether the append landed
    /// is for the log to tell ([`crate::append::OrderLog::find_appends`]).
    #[error("no acknowledgement for {} after {} attempts in {:?}", .0.id, .0.attempts, .0.waited)]
    NotAcknowledged(Box<Unacknowledged>),
    /// A follower found a hole in the stream: inputs were removed below a reader, so replay
    /// would not be the stream's order.
    #[error("stream {stream}: expected sequence {expected}, the stream delivered {found}")]
    Gap {
        /// The stream.
        stream: String,
        /// The next sequence the follower needed.
        expected: u64,
        /// What came instead.
        found: u64,
    },
    /// A stream message that is not an input-log record.
    #[error("stream {stream} sequence {seq}: {source}")]
    Record {
        /// The stream.
        stream: String,
        /// Its sequence.
        seq: u64,
        /// Why it is not a record.
        source: crate::record::RecordError,
    },
    /// A stored snapshot that does not read (damaged, or written by another release).
    #[error("bad engine snapshot: {0}")]
    BadSnapshot(String),
    /// An engine whose outputs would differ from its group's (`fingerprint`): it refuses to
    /// lead or follow.
    #[error("engine group mismatch: {0}")]
    Fingerprint(String),
    /// This engine no longer leads its shard (its lease lapsed or passed on), so a leader's
    /// write (`what`) was not made.
    #[error("no longer the shard's leader: {0} not done")]
    Deposed(&'static str),
    /// A server-side resource (an engine's runtime) could not be started.
    #[error("nats-server: {0}")]
    Server(String),
}

impl ReplicationError {
    pub(crate) fn jetstream(what: impl Into<String>, reason: impl std::fmt::Display) -> Self {
        ReplicationError::JetStream { what: what.into(), reason: reason.to_string() }
    }
}

/// An append that ended without an acknowledgement ([`ReplicationError::NotAcknowledged`]):
/// a copy may be in the log, or may still land there. Here, beside the error that carries it
/// (so the error needs nothing of the appender), and re-exported by [`crate::append`].
#[derive(Clone, Debug)]
pub struct Unacknowledged {
    /// The shard stream it was appended to.
    pub shard: u32,
    /// Its message id ([`crate::append::AppendId`]'s text).
    pub id: String,
    /// A sequence of the stream from before its first attempt: every copy of it that landed
    /// or will land is after it.
    pub after_seq: u64,
    /// Attempts made.
    pub attempts: u32,
    /// How long it was retried.
    pub waited: Duration,
    /// Its records, as appended.
    pub(crate) payload: bytes::Bytes,
}

impl Unacknowledged {
    /// The orders it carried, in their order.
    pub fn orders(&self) -> impl Iterator<Item = InboundOrder> + '_ {
        // Encoded here: the records read back (a record that did not would yield nothing).
        let records = crate::record::records(&self.payload).into_iter().flatten();
        records.filter_map(|bytes| crate::record::decode(bytes).ok().map(|(order, _)| order))
    }
}
