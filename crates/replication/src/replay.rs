//! A shard's outputs recomputed off the tier: the tier's one-thread replica
//! (`exchange::tier::TierReplica`) fed the input log in order, every response numbered as the
//! group's publishers number it (per data subject, from the snapshot's next sequences on).
//!
//! Two users: the snapshot thread (the state after an input, written while leading) and
//! [`Regenerator`], which recomputes reports that have left the leader's retained window, so
//! a delivery edge recovers them for as long as the log holds their inputs.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use delivery::clock::monotonic_ns;
use delivery::publish::{Regenerate, RegenerationFailed, subject_index};
use delivery::wire::{Record, Stream};
use exchange::msg::Response;
use exchange::tier::{TierConfig, TierReplica};
use futures_util::future::BoxFuture;

use crate::error::ReplicationError;
use crate::follow::{Follower, LoggedOrder};
use crate::layout::LogSettings;
use crate::snapshot::{EngineSnapshot, SnapshotStore};

/// Most records one regeneration recomputes and keeps for the requests that follow (a
/// delivery edge recovers a range a batch per request): 64 Ki records, about 6 MiB.
pub const REGENERATE_RECORDS_MAX: u64 = 1 << 16;
/// Longest a regeneration waits for the log's next input before it answers with what it has
/// (the log's end is read first, so this bounds only a stalled read).
const REGENERATE_IDLE_MAX: Duration = Duration::from_millis(500);

/// The tier replica of one shard's group, with each data subject's count of records.
pub struct GroupReplica {
    replica: TierReplica,
    /// Per data subject ([`subject_index`]), records so far.
    records: Vec<u64>,
    /// The last input-log sequence whose every record was applied.
    applied_seq: u64,
}

impl GroupReplica {
    /// The replica at `start` (a snapshot of the shard) or, without one, at the log's start.
    pub fn starting(
        tier: &TierConfig,
        start: Option<&EngineSnapshot>,
    ) -> Result<GroupReplica, ReplicationError> {
        let (master, outlets) = (tier.starting_master_data(), tier.outlets);
        let subjects = outlets as usize * Stream::ALL.len();
        let Some(snapshot) = start else {
            let limits = tier.core_limits();
            let replica = TierReplica::new(master, limits, outlets);
            return Ok(GroupReplica { replica, records: vec![0; subjects], applied_seq: 0 });
        };
        if snapshot.next_seqs.len() != subjects {
            let why =
                format!("{} subjects, the tier publishes {subjects}", snapshot.next_seqs.len());
            return Err(ReplicationError::BadSnapshot(why));
        }
        let replica = TierReplica::restored(master, outlets, snapshot.core_seq, &snapshot.state);
        let replica = replica.map_err(|e| ReplicationError::BadSnapshot(e.to_string()))?;
        let records = snapshot.next_seqs.iter().map(|next| next.saturating_sub(1)).collect();
        Ok(GroupReplica { replica, records, applied_seq: snapshot.stream_seq })
    }

    /// Applies one input as the tier does; `emit` gets each response with its data subject's
    /// index and the sequence the group's publisher gives it.
    pub fn apply(&mut self, logged: &LoggedOrder, emit: &mut impl FnMut(usize, u64, &Response)) {
        let records = &mut self.records;
        self.replica.apply(&logged.order, &mut |response| {
            let index = subject_index(response.outlet, Stream::of(response));
            records[index] += 1;
            emit(index, records[index], response);
        });
        if logged.last_in_message {
            self.applied_seq = logged.stream_seq;
        }
    }

    /// The last input-log sequence whose every record was applied.
    pub fn applied_seq(&self) -> u64 {
        self.applied_seq
    }

    /// The sequence the next record of data subject `index` takes.
    pub fn next_seq(&self, index: usize) -> u64 {
        self.records[index] + 1
    }

    /// The snapshot of the group's state after [`GroupReplica::applied_seq`].
    pub fn snapshot(&self) -> EngineSnapshot {
        EngineSnapshot {
            stream_seq: self.applied_seq,
            core_seq: self.replica.last_seq(),
            next_seqs: self.records.iter().map(|records| records + 1).collect(),
            state: self.replica.snapshot(),
        }
    }
}

/// Recomputes a shard's reports from its newest snapshot and the input log after it, for the
/// leader's retain service ([`Regenerate`]). The last run's records are kept, so a gateway
/// that recovers a long range a batch per request costs one replay, not one per batch.
#[derive(Clone)]
pub struct Regenerator(Arc<Source>);

struct Source {
    client: async_nats::Client,
    store: SnapshotStore,
    log: LogSettings,
    shard: u32,
    tier: TierConfig,
    /// The last run: (data subject index, its first sequence, its records).
    kept: Mutex<Option<(usize, u64, Vec<Record>)>>,
}

impl std::fmt::Debug for Regenerator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Regenerator {{ shard: {} }}", self.0.shard)
    }
}

impl Regenerator {
    /// Regenerates `shard`'s reports of a group running `tier`, reading `log` over `client`.
    pub fn new(
        client: async_nats::Client,
        store: SnapshotStore,
        log: &LogSettings,
        shard: u32,
        tier: &TierConfig,
    ) -> Regenerator {
        let (log, tier, kept) = (log.clone(), tier.clone(), Mutex::new(None));
        Regenerator(Arc::new(Source { client, store, log, shard, tier, kept }))
    }
}

impl Regenerate for Regenerator {
    fn regenerate(
        &self,
        outlet: u32,
        stream: Stream,
        from: u64,
        to: u64,
    ) -> BoxFuture<'static, Result<Vec<Record>, RegenerationFailed>> {
        let source = Arc::clone(&self.0);
        Box::pin(async move {
            let index = subject_index(outlet, stream);
            if let Some(records) = source.kept_range(index, from, to) {
                return Ok(records);
            }
            match source.replay(index, from).await {
                Ok(records) => {
                    let wanted = records.iter().take((to - from + 1) as usize).copied().collect();
                    *source.kept.lock().unwrap_or_else(PoisonError::into_inner) =
                        Some((index, from, records));
                    Ok(wanted)
                }
                // The retain service answers "nothing yet": the edge asks again rather than
                // resync records a later read may recompute.
                Err(error) => {
                    tracing::warn!("engine: regenerating reports from {from}: {error}");
                    Err(RegenerationFailed(error.to_string()))
                }
            }
        })
    }
}

impl Source {
    /// `from..=to` of subject `index` from the last run, if it holds `from`.
    fn kept_range(&self, index: usize, from: u64, to: u64) -> Option<Vec<Record>> {
        let kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        let (kept_index, first, records) = kept.as_ref()?;
        let end = first + records.len() as u64;
        if *kept_index != index || from < *first || from >= end {
            return None;
        }
        let (start, stop) = ((from - first) as usize, (to.min(end - 1) - first) as usize);
        Some(records[start..=stop].to_vec())
    }

    /// Replays the log from the newest snapshot until subject `index` has
    /// [`REGENERATE_RECORDS_MAX`] records from `from` on, or the log ends; the records from
    /// `from` (none when the snapshot is past it: the inputs were trimmed away).
    async fn replay(&self, index: usize, from: u64) -> Result<Vec<Record>, ReplicationError> {
        let snapshot = self.store.latest(self.shard).await?;
        let mut replica = GroupReplica::starting(&self.tier, snapshot.as_ref())?;
        if replica.next_seq(index) > from {
            return Ok(Vec::new());
        }
        // The log's end now: the records asked for were produced before it.
        let log_end = self.store.last_seq(self.shard).await?;
        let follower =
            Follower::open(self.client.clone(), &self.log, self.shard, replica.applied_seq() + 1);
        let mut follower = follower.await?;
        let last = from + REGENERATE_RECORDS_MAX - 1;
        let mut records = Vec::new();
        while replica.applied_seq() < log_end && replica.next_seq(index) <= last {
            let next = tokio::time::timeout(REGENERATE_IDLE_MAX, follower.next()).await;
            let Ok(Some(logged)) = next else { break };
            let logged = logged?;
            replica.apply(&logged, &mut |subject, seq, response| {
                if subject == index && (from..=last).contains(&seq) {
                    records.push(Record::encode(response, logged.intended_abs_ns, monotonic_ns()));
                }
            });
        }
        Ok(records)
    }
}
