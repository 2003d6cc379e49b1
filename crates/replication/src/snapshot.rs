//! Snapshots of a shard's engine in JetStream's object store, and the input log trimmed below
//! them.
//!
//! A snapshot holds what an engine needs to continue a shard from input-log sequence `S`
//! instead of from the log's first record: the core shard's state after `S`, the core's own
//! input sequence, and per data subject the sequence number its next report takes (so a
//! restored engine numbers reports as its group does). Every engine computes it off its tier's
//! threads, on a replica (`exchange::tier::TierReplica`); the leader writes one every
//! `every_inputs` inputs as object `shard-{N}.{S}` of bucket `{PREFIX}_SNAPSHOTS` (replicated
//! like the log, `S` zero-padded to 20 digits). A reader takes the object with the largest `S`;
//! a writer removes the shard's objects below its own once it is stored. So a snapshot never
//! replaces a newer one: a deposed leader that wakes up from a pause and writes its older
//! snapshot adds an object nobody reads, which the next put removes.
//!
//! **Trimming.** Every engine notes how far it applied its shard's log as the one live message
//! of subject `{prefix}_progress.shard-{N}.{holder}` in stream `{PREFIX}_PROGRESS` (a
//! key-value bucket's mechanism on a plain stream, as the lease: renewed with the lease,
//! expiring after [`PROGRESS_TTL`]). After a put at `S` the leader purges the stream below
//! `min(S, every live engine's applied sequence) + 1`: a restoring engine finds every input
//! after the newest snapshot, and a standby that lags finds every input after its position.
//! An engine that starts notes its snapshot's `S` before it reads the log and then checks the
//! log still starts at or below `S + 1` (a trim may have passed between its read of the
//! snapshot and its note); if not, it reads the newer snapshot that trim followed. A trim that
//! read the notes just before the new note and purges just after the check can still pass it:
//! the follower then meets the hole and the engine stops with the reason (started again, it
//! reads the newer snapshot). Never silent, and rare: the window is one purge's round trip.
//!
//! Layout (little-endian), checked by a CRC32C over everything before it:
//!
//! ```text
//! "LTRSNAP1" | stream_seq u64 | core_seq u64 | subjects u32 | next_seq u64 × subjects
//! | state_bytes u64 | state | crc32c u32
//! ```

use std::time::Duration;

use async_nats::jetstream::{self, object_store, stream};
use futures_util::StreamExt;
use tokio::io::AsyncReadExt;

use crate::error::ReplicationError;
use crate::layout::{LogSettings, retry_at_startup};

/// How many inputs apart the leader writes its shard's snapshots by default.
pub const SNAPSHOT_EVERY_INPUTS_DEFAULT: u64 = 100_000;
/// How long an engine's progress note lives without renewal: an engine silent this long no
/// longer holds the log back from trimming (started again, it restores from a snapshot).
pub const PROGRESS_TTL: Duration = Duration::from_secs(30);
/// The most data subjects a snapshot may name (delivery's gateways × streams).
pub const SNAPSHOT_SUBJECTS_MAX: usize = 4096;
const MAGIC: &[u8; 8] = b"LTRSNAP1";
/// The snapshot format, as the group fingerprint names it.
pub const FORMAT: &str = "LTRSNAP1";
const FIXED_BYTES: usize = MAGIC.len() + 8 + 8 + 4 + 8 + 4;

/// The trim rule: the first input-log sequence a trim after a snapshot at `snapshot_seq`
/// keeps, when the lowest live progress note is `lowest_progress` (`None`: no note is live).
/// Everything below it is purged: a restoring engine needs the inputs after the newest
/// snapshot, a lagging standby those after its position. [`SnapshotStore::trim`] runs it over
/// JetStream, `crates/sim` over its simulated broker. The bug `regress-trim-leader-only` puts
/// back (never in a served build; `crates/sim` finds it): the other engines' notes ignored, the
/// log trimmed by the leader's own snapshot alone, past a lagging standby's position.
pub fn trim_keep_from(snapshot_seq: u64, lowest_progress: Option<u64>) -> u64 {
    let lowest = if cfg!(feature = "regress-trim-leader-only") { None } else { lowest_progress };
    lowest.unwrap_or(u64::MAX).min(snapshot_seq).saturating_add(1)
}

/// An engine's state after one input-log sequence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineSnapshot {
    /// The last input-log sequence applied.
    pub stream_seq: u64,
    /// The core's last input sequence (inputs the pre-process passed).
    pub core_seq: u64,
    /// Per data subject (`delivery::publish::subject_index`), its next report's sequence.
    pub next_seqs: Vec<u64>,
    /// The core shard's state (`ShardState`'s snapshot bytes).
    pub state: Vec<u8>,
}

impl EngineSnapshot {
    /// The bytes stored.
    ///
    /// ```
    /// use replication::snapshot::EngineSnapshot;
    /// let snapshot = EngineSnapshot { stream_seq: 9, core_seq: 7, next_seqs: vec![3, 1], state: vec![1, 2] };
    /// assert_eq!(EngineSnapshot::decode(&snapshot.encode()).unwrap(), snapshot);
    /// ```
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(FIXED_BYTES + 8 * self.next_seqs.len() + self.state.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&self.stream_seq.to_le_bytes());
        out.extend_from_slice(&self.core_seq.to_le_bytes());
        out.extend_from_slice(&(self.next_seqs.len() as u32).to_le_bytes());
        for next_seq in &self.next_seqs {
            out.extend_from_slice(&next_seq.to_le_bytes());
        }
        out.extend_from_slice(&(self.state.len() as u64).to_le_bytes());
        out.extend_from_slice(&self.state);
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Reads [`EngineSnapshot::encode`]'s bytes; `Err` ([`ReplicationError::BadSnapshot`])
    /// names what is wrong.
    ///
    /// ```
    /// use replication::snapshot::EngineSnapshot;
    /// let mut bytes = EngineSnapshot { stream_seq: 1, core_seq: 1, next_seqs: vec![], state: vec![] }.encode();
    /// bytes[9] ^= 1;
    /// assert!(EngineSnapshot::decode(&bytes).unwrap_err().to_string().contains("checksum"));
    /// ```
    pub fn decode(bytes: &[u8]) -> Result<EngineSnapshot, ReplicationError> {
        let bad = |why: String| ReplicationError::BadSnapshot(why);
        if bytes.len() < FIXED_BYTES || &bytes[..MAGIC.len()] != MAGIC {
            return Err(bad(format!("{} bytes without the snapshot header", bytes.len())));
        }
        let (body, crc) = bytes.split_at(bytes.len() - 4);
        let crc = u32::from_le_bytes(crc.try_into().expect("4 bytes"));
        if crc32c::crc32c(body) != crc {
            return Err(bad("checksum mismatch".into()));
        }
        let mut reader = Reader { bytes: &body[MAGIC.len()..] };
        let stream_seq = reader.u64()?;
        let core_seq = reader.u64()?;
        let subjects = reader.u32()? as usize;
        if subjects > SNAPSHOT_SUBJECTS_MAX {
            return Err(bad(format!("{subjects} subjects (at most {SNAPSHOT_SUBJECTS_MAX})")));
        }
        let next_seqs = (0..subjects).map(|_| reader.u64()).collect::<Result<Vec<_>, _>>()?;
        let state_bytes = reader.u64()?;
        if state_bytes != reader.bytes.len() as u64 {
            return Err(bad(format!(
                "{state_bytes} state bytes named, {} there",
                reader.bytes.len()
            )));
        }
        Ok(EngineSnapshot { stream_seq, core_seq, next_seqs, state: reader.bytes.to_vec() })
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], ReplicationError> {
        let Some((head, rest)) = self.bytes.split_first_chunk::<N>() else {
            return Err(ReplicationError::BadSnapshot("the snapshot ends early".into()));
        };
        self.bytes = rest;
        Ok(*head)
    }

    fn u64(&mut self) -> Result<u64, ReplicationError> {
        self.take().map(u64::from_le_bytes)
    }

    fn u32(&mut self) -> Result<u32, ReplicationError> {
        self.take().map(u32::from_le_bytes)
    }
}

/// The snapshots and progress notes of one exchange (one prefix).
#[derive(Clone)]
pub struct SnapshotStore {
    objects: object_store::ObjectStore,
    progress: stream::Stream,
    js: jetstream::Context,
    log: LogSettings,
}

impl SnapshotStore {
    /// Opens (creating when missing) the snapshot bucket, the progress stream and the shard
    /// streams, with the log's replicas; retries for [`crate::layout::STARTUP_WAIT`].
    pub async fn open(
        client: async_nats::Client,
        log: &LogSettings,
    ) -> Result<SnapshotStore, ReplicationError> {
        log.validate()?;
        let js = jetstream::new(client);
        let upper = log.prefix.to_ascii_uppercase();
        let bucket = format!("{upper}_SNAPSHOTS");
        let objects = retry_at_startup(&format!("opening object store {bucket}"), || async {
            match js.get_object_store(&bucket).await {
                Ok(store) => Ok(store),
                Err(_) => js.create_object_store(objects_config(&bucket, log)).await.map_err(|e| {
                    ReplicationError::jetstream(format!("creating object store {bucket}"), e)
                }),
            }
        })
        .await?;
        let config = stream::Config {
            name: format!("{upper}_PROGRESS"),
            subjects: vec![format!("{}_progress.>", log.prefix)],
            max_messages_per_subject: 1,
            max_age: PROGRESS_TTL,
            num_replicas: log.replicas,
            storage: stream::StorageType::File,
            ..Default::default()
        };
        let what = format!("opening stream {}", config.name);
        let progress = retry_at_startup(&what, || js.get_or_create_stream(config.clone())).await?;
        log.ensure_streams(&js).await?;
        Ok(SnapshotStore { objects, progress, js, log: log.clone() })
    }

    /// The newest snapshot of `shard` (the largest input-log sequence), if one was written.
    pub async fn latest(&self, shard: u32) -> Result<Option<EngineSnapshot>, ReplicationError> {
        let stored = self.stored(shard).await?;
        let Some((_, name, _)) = stored.into_iter().max() else { return Ok(None) };
        let mut object = match self.objects.get(&name).await {
            Ok(object) => object,
            Err(error) if error.kind() == object_store::GetErrorKind::NotFound => return Ok(None),
            Err(error) => {
                return Err(ReplicationError::jetstream(format!("reading {name}"), error));
            }
        };
        let mut bytes = Vec::new();
        let read = object.read_to_end(&mut bytes).await;
        read.map_err(|e| ReplicationError::jetstream(format!("reading {name}"), e))?;
        EngineSnapshot::decode(&bytes).map(Some)
    }

    /// The group fingerprint the newest snapshot of `shard` was written with (`None`: no
    /// snapshot, or one of an earlier release).
    pub async fn latest_fingerprint(
        &self,
        shard: u32,
    ) -> Result<Option<crate::fingerprint::Fingerprint>, ReplicationError> {
        let newest = self.stored(shard).await?.into_iter().max();
        let description = newest.and_then(|(_, _, description)| description);
        Ok(description.as_deref().and_then(crate::fingerprint::Fingerprint::find_in))
    }

    /// Stores `snapshot` for `shard` described by `description` (the writer's group
    /// fingerprint), then removes the shard's snapshots below it (never one above: a newer
    /// snapshot written meanwhile stays the newest).
    pub async fn put(
        &self,
        shard: u32,
        snapshot: &EngineSnapshot,
        description: &str,
    ) -> Result<(), ReplicationError> {
        let (name, bytes) = (object_name(shard, snapshot.stream_seq), snapshot.encode());
        let meta = object_store::ObjectMetadata {
            name: name.clone(),
            description: Some(description.to_string()),
            ..Default::default()
        };
        let stored = self.objects.put(meta, &mut bytes.as_slice()).await;
        stored.map_err(|e| ReplicationError::jetstream(format!("writing {name}"), e))?;
        for (stream_seq, older, _) in self.stored(shard).await? {
            if stream_seq < snapshot.stream_seq {
                let deleted = self.objects.delete(&older).await;
                deleted.map_err(|e| ReplicationError::jetstream(format!("removing {older}"), e))?;
            }
        }
        Ok(())
    }

    /// `shard`'s stored snapshots: (input-log sequence, object name, description). A name
    /// without a sequence (`shard-{N}`, an earlier release's) sorts first.
    async fn stored(
        &self,
        shard: u32,
    ) -> Result<Vec<(u64, String, Option<String>)>, ReplicationError> {
        let what = "listing the snapshots";
        let list = self.objects.list().await.map_err(|e| ReplicationError::jetstream(what, e))?;
        let infos: Vec<_> = list.collect().await;
        let legacy = format!("shard-{shard}");
        let mut stored = Vec::new();
        for info in infos {
            let info = info.map_err(|e| ReplicationError::jetstream(what, e))?;
            if info.deleted {
                continue;
            }
            let seq = match info.name.strip_prefix(&legacy) {
                Some("") => Some(0),
                Some(rest) => rest.strip_prefix('.').and_then(|seq| seq.parse::<u64>().ok()),
                None => None,
            };
            if let Some(seq) = seq {
                stored.push((seq, info.name, info.description));
            }
        }
        Ok(stored)
    }

    /// Notes that `holder` applied `shard`'s log up to `applied_seq` (it then holds the log
    /// back from trimming past `applied_seq + 1` for [`PROGRESS_TTL`]).
    pub async fn note_progress(
        &self,
        shard: u32,
        holder: &str,
        applied_seq: u64,
    ) -> Result<(), ReplicationError> {
        let subject = progress_subject(&self.log, shard, holder);
        let what = format!("noting progress on {subject}");
        let noted = self.js.publish(subject, applied_seq.to_le_bytes().to_vec().into()).await;
        let noted = noted.map_err(|e| ReplicationError::jetstream(&what, e))?;
        noted.await.map_err(|e| ReplicationError::jetstream(&what, e))?;
        Ok(())
    }

    /// Purges `shard`'s stream below `min(snapshot_seq, every noted progress) + 1`; returns
    /// the stream's first sequence afterwards.
    pub async fn trim(&self, shard: u32, snapshot_seq: u64) -> Result<u64, ReplicationError> {
        let keep_from = trim_keep_from(snapshot_seq, self.lowest_progress(shard).await?);
        let first_seq = self.first_seq(shard).await?;
        if keep_from <= first_seq {
            // Nothing below it left. (A purge "up to 1" would empty the stream on some
            // server versions: it is never sent.)
            return Ok(first_seq);
        }
        let name = self.log.stream(shard);
        let what = format!("trimming stream {name}");
        let stream = self.js.get_stream(&name).await;
        let stream = stream.map_err(|e| ReplicationError::jetstream(&what, e))?;
        let purged = stream.purge().sequence(keep_from).await;
        purged.map_err(|e| ReplicationError::jetstream(&what, e))?;
        self.first_seq(shard).await
    }

    /// The first sequence `shard`'s stream still holds (the next one to be written when empty).
    pub async fn first_seq(&self, shard: u32) -> Result<u64, ReplicationError> {
        Ok(self.stream_state(shard).await?.first_sequence.max(1))
    }

    /// The last sequence written to `shard`'s stream (0: none yet).
    pub async fn last_seq(&self, shard: u32) -> Result<u64, ReplicationError> {
        Ok(self.stream_state(shard).await?.last_sequence)
    }

    async fn stream_state(&self, shard: u32) -> Result<stream::State, ReplicationError> {
        let name = self.log.stream(shard);
        let what = format!("reading stream {name}'s state");
        let mut stream = self.js.get_stream(&name).await;
        let stream = stream.as_mut().map_err(|e| ReplicationError::jetstream(&what, e))?;
        let info = stream.info().await.map_err(|e| ReplicationError::jetstream(&what, e))?;
        Ok(info.state.clone())
    }

    /// The lowest input sequence any live engine of `shard` noted as applied (`None`: no note
    /// is live): with the newest snapshot, what bounds the next trim.
    pub async fn lowest_progress(&self, shard: u32) -> Result<Option<u64>, ReplicationError> {
        let what = "reading the engines' progress";
        let filter = format!("{}.*", progress_prefix(&self.log, shard));
        let subjects = self.progress.info_with_subjects(&filter).await;
        let subjects = subjects.map_err(|e| ReplicationError::jetstream(what, e))?;
        let subjects: Vec<String> =
            subjects.filter_map(|found| async move { found.ok().map(|(s, _)| s) }).collect().await;
        let mut lowest: Option<u64> = None;
        for subject in subjects {
            // Gone meanwhile (expired), or not a note of this release: no say.
            let Ok(note) = self.progress.get_last_raw_message_by_subject(&subject).await else {
                continue;
            };
            let Ok(applied) = note.payload[..].try_into().map(u64::from_le_bytes) else {
                continue;
            };
            lowest = Some(lowest.map_or(applied, |low| low.min(applied)));
        }
        Ok(lowest)
    }
}

fn objects_config(bucket: &str, log: &LogSettings) -> object_store::Config {
    object_store::Config {
        bucket: bucket.to_string(),
        num_replicas: log.replicas,
        storage: jetstream::stream::StorageType::File,
        ..Default::default()
    }
}

/// `shard-{N}.{S}`, `S` zero-padded so that names sort as their sequences.
fn object_name(shard: u32, stream_seq: u64) -> String {
    format!("shard-{shard}.{stream_seq:020}")
}

/// `{prefix}_progress.shard-{N}`: the notes of `shard`'s engines are the tokens below it.
fn progress_prefix(log: &LogSettings, shard: u32) -> String {
    format!("{}_progress.shard-{shard}", log.prefix)
}

/// `{prefix}_progress.shard-{N}.{holder}`, every character of `holder` a subject token may
/// not hold (or a wildcard) replaced by `_`.
fn progress_subject(log: &LogSettings, shard: u32, holder: &str) -> String {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '=');
    let holder: String = holder.chars().map(|c| if allowed(c) { c } else { '_' }).collect();
    format!("{}.{holder}", progress_prefix(log, shard))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trim_keeps_what_the_newest_snapshot_and_every_live_note_need() {
        assert_eq!(trim_keep_from(100, None), 101, "no note: the snapshot bounds it");
        assert_eq!(trim_keep_from(100, Some(250)), 101, "notes ahead: the snapshot bounds it");
        assert_eq!(trim_keep_from(0, None), 1, "no snapshot taken: nothing trimmed");
        assert_eq!(trim_keep_from(u64::MAX, None), u64::MAX, "no overflow");
        if cfg!(feature = "regress-trim-leader-only") {
            assert_eq!(trim_keep_from(100, Some(40)), 101, "the bug: the lagging note ignored");
        } else {
            assert_eq!(trim_keep_from(100, Some(40)), 41, "a lagging standby holds it back");
        }
    }
    use proptest::prelude::*;

    #[test]
    fn progress_subjects_hold_one_token_per_holder() {
        let log = LogSettings::new(1);
        let subject = progress_subject(&log, 2, "host.a:1 2>*");
        assert_eq!(subject, "leantier_progress.shard-2.host_a_1_2__");
        assert_eq!(progress_subject(&log, 2, "*"), "leantier_progress.shard-2._", "no wildcard");
    }

    proptest! {
        #[test]
        fn any_bytes_decode_or_are_refused_without_a_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = EngineSnapshot::decode(&bytes);
        }

        #[test]
        fn a_damaged_byte_is_refused(
            next_seqs in proptest::collection::vec(any::<u64>(), 0..8),
            state in proptest::collection::vec(any::<u8>(), 0..64),
            at in any::<prop::sample::Index>(),
            flip in 1u8..,
        ) {
            let snapshot = EngineSnapshot { stream_seq: 5, core_seq: 4, next_seqs, state };
            let mut bytes = snapshot.encode();
            prop_assert_eq!(EngineSnapshot::decode(&bytes).unwrap(), snapshot);
            let at = at.index(bytes.len());
            bytes[at] ^= flip;
            prop_assert!(EngineSnapshot::decode(&bytes).is_err());
        }
    }
}
