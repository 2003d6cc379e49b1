//! A checker for a live engine group: what its leaders published, compared record for record
//! with what the shard's input log says they must have published.
//!
//! [`capture`] listens to one shard's report and market-data subjects for a while and keeps
//! every record by (subject, sequence), whichever leader sent it; a sequence heard twice with
//! different contents is already a failure (two leaders disagreed). [`verify`] then replays the
//! shard's log from its newest snapshot through the tier's replica
//! (`crate::replay::GroupReplica`) and compares each captured record's content (routing,
//! audience, canonical output: [`Record::content`]) with the one computed for its sequence.
//! The clocks in a record are not compared. The tests use it after every fault; an operator
//! runs it against a live group as `leantier replication check`.

use std::collections::BTreeMap;
use std::time::Duration;

use delivery::publish::subject_index;
use delivery::wire::{Record, Stream, batch_records, decode_batch};
use exchange::tier::TierConfig;
use futures_util::StreamExt;

use crate::error::ReplicationError;
use crate::follow::Follower;
use crate::layout::LogSettings;
use crate::replay::GroupReplica;
use crate::snapshot::SnapshotStore;

/// Most differing records a report lists (the count covers them all).
pub const MISMATCHES_LISTED_MAX: usize = 20;

/// Records heard on one shard's data subjects.
#[derive(Debug, Default)]
pub struct Captured {
    /// Per (data subject index, sequence), the record's bytes.
    pub records: BTreeMap<(usize, u64), Record>,
    /// Sequences heard twice with different contents: (subject index, sequence).
    pub conflicts: Vec<(usize, u64)>,
    /// Messages on the subjects that are not batches of this release.
    pub malformed: u64,
}

/// What [`verify`] found.
#[derive(Debug, Default)]
pub struct CheckReport {
    /// Captured records compared with the replay.
    pub checked: u64,
    /// Captured records equal to the replay's.
    pub equal: u64,
    /// Captured records that differ or that the log does not produce, the first
    /// [`MISMATCHES_LISTED_MAX`]: (subject index, sequence).
    pub mismatches: Vec<(usize, u64)>,
    /// How many differ in all.
    pub mismatched: u64,
    /// Captured records past everything the log produces (a sequence no input made).
    pub unproduced: u64,
    /// Sequences heard twice with different contents.
    pub conflicts: u64,
    /// Captured records before the newest snapshot (the log was trimmed below them), which
    /// the replay cannot reach.
    pub not_covered: u64,
}

impl CheckReport {
    /// Whether every record compared was equal and no sequence was heard twice differently.
    pub fn passed(&self) -> bool {
        self.mismatched == 0 && self.unproduced == 0 && self.conflicts == 0
    }
}

/// Records every batch published on `publish_prefix`'s data subjects (a shard's, see
/// `LogSettings::publish_prefix`) for `duration`, or until `stop` completes.
pub async fn capture(
    client: &async_nats::Client,
    publish_prefix: &str,
    duration: Duration,
    stop: impl std::future::Future<Output = ()>,
) -> Result<Captured, ReplicationError> {
    let subject = format!("{publish_prefix}.data.>");
    let subscribing = client.subscribe(subject.clone()).await;
    let mut messages = subscribing
        .map_err(|e| ReplicationError::jetstream(format!("subscribing to {subject}"), e))?;
    let mut captured = Captured::default();
    let deadline = tokio::time::Instant::now() + duration;
    let mut stop = std::pin::pin!(stop);
    loop {
        let message = tokio::select! {
            message = tokio::time::timeout_at(deadline, messages.next()) => message,
            () = &mut stop => break,
        };
        let Ok(Some(message)) = message else { break };
        let Ok((header, records)) = decode_batch(&message.payload) else {
            captured.malformed += 1;
            continue;
        };
        let index = subject_index(header.outlet, header.stream);
        for (seq, record) in batch_records(&header, records) {
            let kept = captured.records.entry((index, seq)).or_insert(record);
            if kept.content() != record.content() {
                captured.conflicts.push((index, seq));
            }
        }
    }
    Ok(captured)
}

/// Replays `shard`'s log from its newest snapshot (`tier` as the engines run it) and compares
/// every captured record with the replay's record of the same subject and sequence.
pub async fn verify(
    client: async_nats::Client,
    log: &LogSettings,
    shard: u32,
    tier: &TierConfig,
    captured: &Captured,
) -> Result<CheckReport, ReplicationError> {
    let store = SnapshotStore::open(client.clone(), log).await?;
    let snapshot = store.latest(shard).await?;
    let mut replica = GroupReplica::starting(tier, snapshot.as_ref())?;
    let log_end = store.last_seq(shard).await?;
    let mut report =
        CheckReport { conflicts: captured.conflicts.len() as u64, ..Default::default() };
    let subjects = tier.outlets as usize * Stream::ALL.len();
    let first_replayed: Vec<u64> = (0..subjects).map(|index| replica.next_seq(index)).collect();
    let mut follower = Follower::open(client, log, shard, replica.applied_seq() + 1).await?;
    let compare = |index: usize, seq: u64, expected: &Record, report: &mut CheckReport| {
        let Some(heard) = captured.records.get(&(index, seq)) else { return };
        report.checked += 1;
        if heard.content() == expected.content() {
            report.equal += 1;
            return;
        }
        report.mismatched += 1;
        if report.mismatches.len() < MISMATCHES_LISTED_MAX {
            report.mismatches.push((index, seq));
        }
    };
    while replica.applied_seq() < log_end {
        let logged = follower.next().await;
        let logged =
            logged.ok_or_else(|| ReplicationError::jetstream("replaying", "the log ended"))??;
        replica.apply(&logged, &mut |index, seq, response| {
            compare(index, seq, &Record::encode(response, 0, 0), &mut report);
        });
    }
    for &(index, seq) in captured.records.keys() {
        if index >= subjects || seq >= replica.next_seq(index) {
            report.unproduced += 1;
            if report.mismatches.len() < MISMATCHES_LISTED_MAX {
                report.mismatches.push((index, seq));
            }
        } else if seq < first_replayed[index] {
            report.not_covered += 1;
        }
    }
    Ok(report)
}

/// The name of data subject `index` (`{outlet}.{stream}`), for reports.
pub fn subject_name(index: usize) -> String {
    let stream = Stream::ALL[index % Stream::ALL.len()];
    format!("{}.{}", index / Stream::ALL.len(), stream.name())
}
