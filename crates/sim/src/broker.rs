//! The simulated JetStream: three nodes whose stream leader fails and is re-elected after a
//! delay, the shard's input stream (appends de-duplicated by message id, reads from a
//! sequence) and the lease subject (compare-and-set on its last sequence, messages expiring a
//! TTL after their write by the broker's clock, deletes by sequence or, blind, by subject),
//! the snapshot store's newest snapshot, the engines' progress notes (expiring after
//! production's `PROGRESS_TTL`) and the input stream's trim (production's rule,
//! `replication::snapshot::trim_keep_from`).

use std::collections::HashMap;

use exchange::msg::InboundOrder;
use replication::lease::{CasOutcome, ReleaseTarget};
use replication::snapshot::{EngineSnapshot, PROGRESS_TTL, trim_keep_from};

use crate::rng::Rng;

/// Broker nodes (a replicated stream, R3).
pub const BROKER_NODES: usize = 3;
/// Shortest and longest stream-leader election after the leader dies, ns.
const ELECTION_NS: (u64, u64) = (1_000_000_000, 4_000_000_000);

/// A gateway run's append id: (gateway, run, counter) — the real `AppendId`'s parts.
pub type MessageId = (usize, u64, u64);

/// The lease subject's one live message.
#[derive(Clone, Copy, Debug)]
struct LeaseMessage {
    seq: u64,
    expires_ns: u64,
}

/// One shard's streams: its input log and its lease subject.
#[derive(Debug, Default)]
pub struct ShardStreams {
    /// Every input ever appended; sequence `n` is `log[n - 1]` (the checker's record: what the
    /// stream still serves starts at `first_seq`).
    pub log: Vec<InboundOrder>,
    /// The first sequence the stream still holds (below it: trimmed; 0 before any trim).
    pub first_seq: u64,
    /// The newest snapshot stored (a put of an older one is ignored).
    pub snapshot: Option<EngineSnapshot>,
    /// Per engine, its last progress note: the sequence it applied and when it was written.
    progress: HashMap<usize, (u64, u64)>,
    dedup: HashMap<MessageId, u64>,
    lease: Option<LeaseMessage>,
    /// The lease stream's last sequence (sequences only grow: expiry never reuses one).
    lease_seq: u64,
}

/// The broker's state.
#[derive(Debug)]
pub struct Broker {
    nodes_up: [bool; BROKER_NODES],
    leader: Option<usize>,
    /// No request is served before this (an election in progress).
    available_from_ns: u64,
    /// Per shard, its streams.
    pub shards: Vec<ShardStreams>,
    lease_ttl_ns: u64,
}

impl Broker {
    /// Three live nodes, node 0 leading, `shards` shards, a lease TTL of `lease_ttl_ns`.
    pub fn new(lease_ttl_ns: u64, shards: usize) -> Broker {
        Broker {
            nodes_up: [true; BROKER_NODES],
            leader: Some(0),
            available_from_ns: 0,
            shards: (0..shards).map(|_| ShardStreams::default()).collect(),
            lease_ttl_ns,
        }
    }

    /// Whether a request arriving at `now_ns` is served (a leader, a quorum, no election).
    pub fn available(&self, now_ns: u64) -> bool {
        let up = self.nodes_up.iter().filter(|up| **up).count();
        self.leader.is_some() && up * 2 > BROKER_NODES && now_ns >= self.available_from_ns
    }

    /// Node `node` dies; a dead leader is replaced by a live node after an election.
    pub fn kill_node(&mut self, node: usize, now_ns: u64, rng: &mut Rng) {
        self.nodes_up[node] = false;
        if self.leader == Some(node) {
            self.leader = self.nodes_up.iter().position(|up| *up);
            self.available_from_ns = now_ns + rng.range(ELECTION_NS.0, ELECTION_NS.1);
        }
    }

    /// Node `node` is back; a cluster without a leader elects one.
    pub fn restart_node(&mut self, node: usize, now_ns: u64, rng: &mut Rng) {
        self.nodes_up[node] = true;
        if self.leader.is_none() {
            self.leader = Some(node);
            self.available_from_ns = now_ns + rng.range(ELECTION_NS.0, ELECTION_NS.1);
        }
    }

    /// Inputs committed over every shard.
    pub fn committed(&self) -> u64 {
        self.shards.iter().map(|shard| shard.log.len() as u64).sum()
    }

    /// Appends `order` to `shard`'s log unless message `id` is there already; its sequence,
    /// and whether it is new.
    pub fn append(&mut self, shard: usize, id: MessageId, order: InboundOrder) -> (u64, bool) {
        let streams = &mut self.shards[shard];
        if let Some(seq) = streams.dedup.get(&id) {
            return (*seq, false);
        }
        streams.log.push(order);
        let seq = streams.log.len() as u64;
        streams.dedup.insert(id, seq);
        (seq, true)
    }

    /// `shard`'s inputs from sequence `from` on, at most `max`; `None` when `from` was
    /// trimmed away.
    pub fn read(&self, shard: usize, from: u64, max: usize) -> Option<&[InboundOrder]> {
        let streams = &self.shards[shard];
        if from < streams.first_seq {
            return None;
        }
        let log = &streams.log;
        let start = (from.max(1) - 1) as usize;
        let end = log.len().min(start.saturating_add(max));
        Some(log.get(start..end).unwrap_or(&[]))
    }

    /// Engine `engine` notes that it applied `shard`'s log up to `applied` (it holds the log
    /// back from a trim past `applied + 1` for `PROGRESS_TTL`).
    pub fn note_progress(&mut self, shard: usize, engine: usize, applied: u64, now_ns: u64) {
        self.shards[shard].progress.insert(engine, (applied, now_ns));
    }

    /// Stores `snapshot` as `shard`'s newest unless a newer one is there.
    pub fn put_snapshot(&mut self, shard: usize, snapshot: EngineSnapshot) {
        let newest = &mut self.shards[shard].snapshot;
        if newest.as_ref().is_none_or(|kept| kept.stream_seq < snapshot.stream_seq) {
            *newest = Some(snapshot);
        }
    }

    /// Trims `shard`'s log after a snapshot at `snapshot_seq` by production's rule (below
    /// the snapshot and every live progress note); the first sequence it keeps.
    pub fn trim(&mut self, shard: usize, snapshot_seq: u64, now_ns: u64) -> u64 {
        let ttl_ns = PROGRESS_TTL.as_nanos() as u64;
        let streams = &mut self.shards[shard];
        let live = streams.progress.values().filter(|(_, noted)| now_ns - noted < ttl_ns);
        let lowest = live.map(|(applied, _)| *applied).min();
        let keep_from = trim_keep_from(snapshot_seq, lowest);
        streams.first_seq = streams.first_seq.max(keep_from);
        streams.first_seq
    }

    /// Writes `shard`'s lease subject if its last live sequence is `expected` (0: none alive).
    pub fn lease_cas(&mut self, shard: usize, expected: u64, now_ns: u64) -> CasOutcome {
        let ttl_ns = self.lease_ttl_ns;
        let streams = &mut self.shards[shard];
        streams.expire(now_ns);
        if streams.lease.map_or(0, |message| message.seq) != expected {
            return CasOutcome::Refused;
        }
        streams.lease_seq += 1;
        let expires_ns = now_ns + ttl_ns;
        streams.lease = Some(LeaseMessage { seq: streams.lease_seq, expires_ns });
        CasOutcome::Written(streams.lease_seq)
    }

    /// Deletes what a release of `shard`'s lease names.
    pub fn lease_delete(&mut self, shard: usize, target: ReleaseTarget, now_ns: u64) {
        let streams = &mut self.shards[shard];
        streams.expire(now_ns);
        let doomed = match target {
            ReleaseTarget::Revision(seq) => streams.lease.is_some_and(|message| message.seq == seq),
            ReleaseTarget::Subject => true,
        };
        if doomed {
            streams.lease = None;
        }
    }
}

impl ShardStreams {
    fn expire(&mut self, now_ns: u64) {
        if self.lease.is_some_and(|message| message.expires_ns <= now_ns) {
            self.lease = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lease_subject_refuses_a_stale_writer_expires_and_never_reuses_a_sequence() {
        let mut broker = Broker::new(1_000, 2);
        assert_eq!(broker.lease_cas(0, 0, 0), CasOutcome::Written(1));
        assert_eq!(broker.lease_cas(0, 0, 10), CasOutcome::Refused, "held by another");
        assert_eq!(broker.lease_cas(1, 0, 10), CasOutcome::Written(1), "another shard's lease");
        assert_eq!(broker.lease_cas(0, 1, 10), CasOutcome::Written(2), "the holder renews");
        assert_eq!(broker.lease_cas(0, 2, 1_010), CasOutcome::Refused, "expired");
        assert_eq!(broker.lease_cas(0, 0, 1_010), CasOutcome::Written(3));
        broker.lease_delete(0, ReleaseTarget::Revision(2), 1_020);
        assert_eq!(broker.lease_cas(0, 0, 1_020), CasOutcome::Refused, "not the live write");
        broker.lease_delete(0, ReleaseTarget::Revision(3), 1_020);
        assert_eq!(broker.lease_cas(0, 0, 1_030), CasOutcome::Written(4));
    }

    #[test]
    fn appends_are_deduplicated_by_message_id() {
        let mut broker = Broker::new(1_000, 2);
        let order = InboundOrder::default();
        assert_eq!(broker.append(0, (0, 1, 1), order), (1, true));
        assert_eq!(broker.append(0, (0, 1, 1), order), (1, false));
        assert_eq!(broker.append(0, (0, 2, 1), order), (2, true), "another run's counter");
        assert_eq!(broker.append(1, (0, 1, 1), order), (1, true), "another shard's log");
        assert_eq!(broker.read(0, 2, 10).map(<[_]>::len), Some(1));
        assert_eq!(broker.read(0, 3, 10).map(<[_]>::len), Some(0));
        assert_eq!(broker.committed(), 3);
    }

    #[test]
    fn a_trim_keeps_what_the_snapshot_and_every_live_note_need() {
        let mut broker = Broker::new(1_000, 1);
        for counter in 0..10 {
            broker.append(0, (0, 1, counter), InboundOrder::default());
        }
        broker.note_progress(0, 0, 8, 0);
        broker.note_progress(0, 1, 4, 0);
        let lagging = if cfg!(feature = "regress-trim-leader-only") { 7 } else { 5 };
        assert_eq!(broker.trim(0, 6, 10), lagging, "engine 1's note holds the log at 5");
        assert!(broker.read(0, 4, 10).is_none(), "trimmed away");
        let expired = PROGRESS_TTL.as_nanos() as u64;
        broker.note_progress(0, 0, 9, expired);
        assert_eq!(
            broker.trim(0, 6, expired),
            7,
            "engine 1's note expired: the snapshot bounds it"
        );
        assert_eq!(broker.trim(0, 3, expired), 7, "a trim never moves the start back");
    }
}
