//! One leader per shard: a lease held as the one live message of the shard's subject in a
//! JetStream stream whose messages expire after the lease's TTL (a key-value bucket's
//! mechanism — a subject per key, one message kept per subject, a compare-and-set on the
//! subject's last sequence — on a plain stream, which every JetStream server version serves).
//!
//! * **Acquire** appends with `Nats-Expected-Last-Subject-Sequence: 0`: refused while any
//!   holder's message is alive.
//! * **Renew** appends against the sequence the holder last wrote: refused once another
//!   holder wrote a newer one, so a holder that lost its lease learns it.
//! * **Validity.** A holder acts as leader only until `TTL − SAFETY_MARGIN` after the *start*
//!   of its last successful renewal. The entry it wrote is stored after that start, so it
//!   expires on the server no earlier than `start + TTL`; nobody can create the key before
//!   then. With the margin covering scheduling and the two clocks' rate difference, the old
//!   holder's validity ends before a new holder's begins: never two leaders at once, even
//!   when the old one is cut off and cannot hear that it lost (a partition, a paused process).
//! * A partition's minority side cannot write the bucket (no quorum): its holder's validity
//!   runs out and it stops; the majority side's standby takes the lease after the TTL.
//! * **Epoch.** A leadership is named by the stream sequence of the write that took it: the
//!   stream's sequences only grow (expiry and deletes never reuse one), so a later leadership
//!   always has a larger epoch. Every batch a leader publishes carries it, and receivers drop
//!   a batch older than the newest epoch they have seen (`delivery::edge`): a deposed
//!   leader that wakes from a pause cannot be heard once its successor was.
//! * **Only the holder releases.** Release deletes the holder's own last write by its
//!   sequence, never the subject: when a successor wrote since, that write is already gone
//!   (one message per subject) and the delete is a no-op. A refused acquire or renewal forgets
//!   the old write, so a paused holder that wakes up never touches its successor's lease.

use std::time::{Duration, Instant};

use async_nats::jetstream::ErrorCode;
use async_nats::jetstream::stream::DeleteMessageErrorKind;
use async_nats::jetstream::{self, context::PublishErrorKind, stream};

use crate::error::ReplicationError;
use crate::layout::retry_at_startup;

/// Lease TTL by default: a dead leader is replaced within about this long.
pub const LEASE_TTL_DEFAULT: Duration = Duration::from_secs(1);
/// How often a holder renews (and a standby tries to take the lease), by default.
pub const LEASE_RENEW_DEFAULT: Duration = Duration::from_millis(200);
/// How long before its lease could expire a holder stops acting as leader.
pub const LEASE_SAFETY_MARGIN: Duration = Duration::from_millis(150);
/// The smallest TTL JetStream ages entries out reliably at.
pub const LEASE_TTL_MIN: Duration = Duration::from_millis(500);

/// How a shard's lease is kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseSettings {
    /// The lease stream (one per deployment; a subject per shard).
    pub bucket: String,
    /// Entry lifetime ([`LEASE_TTL_DEFAULT`]).
    pub ttl: Duration,
    /// Renewal period ([`LEASE_RENEW_DEFAULT`]); well below `ttl − LEASE_SAFETY_MARGIN`.
    pub renew_every: Duration,
    /// Copies of the bucket (3 in a cluster).
    pub replicas: usize,
}

impl LeaseSettings {
    /// The default TTL and renewal on bucket `{PREFIX}_LEADERS` with `replicas` copies.
    ///
    /// ```
    /// use replication::lease::LeaseSettings;
    /// let settings = LeaseSettings::new("leantier", 3);
    /// assert_eq!(settings.bucket, "LEANTIER_LEADERS");
    /// assert!(settings.validate().is_ok());
    /// let slow = LeaseSettings { renew_every: settings.ttl, ..settings };
    /// assert!(slow.validate().is_err(), "a renewal per TTL lets the lease lapse");
    /// ```
    pub fn new(prefix: &str, replicas: usize) -> LeaseSettings {
        LeaseSettings {
            bucket: format!("{}_LEADERS", prefix.to_ascii_uppercase()),
            ttl: LEASE_TTL_DEFAULT,
            renew_every: LEASE_RENEW_DEFAULT,
            replicas,
        }
    }

    /// Checks that a renewal fits twice in the lease's valid part.
    pub fn validate(&self) -> Result<(), ReplicationError> {
        let valid = self.ttl.saturating_sub(LEASE_SAFETY_MARGIN);
        if self.ttl < LEASE_TTL_MIN || self.renew_every.is_zero() || self.renew_every * 2 > valid {
            return Err(ReplicationError::BadSettings(format!(
                "lease TTL {:?} (≥ {LEASE_TTL_MIN:?}) must hold two renewals of {:?} plus the \
                 {LEASE_SAFETY_MARGIN:?} margin",
                self.ttl, self.renew_every
            )));
        }
        Ok(())
    }
}

/// The store's answer to a compare-and-set write of the lease subject.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CasOutcome {
    /// Written at this stream sequence.
    Written(u64),
    /// Refused: the subject's last sequence was not the expected one.
    Refused,
}

/// What a release deletes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReleaseTarget {
    /// The holder's own last write, by its sequence (a no-op once a successor wrote).
    Revision(u64),
    /// Every message of the subject, whoever wrote it: the blind purge the replication-faults
    /// work removed, put back only under the `regress-blind-release` feature so that the
    /// simulator (`crates/sim`) can prove it finds it.
    Subject,
}

/// A contender's lease without I/O (module docs: acquire, renew, validity, epoch, release):
/// [`Lease`] drives it over JetStream, the simulator over its simulated broker. `T` is the
/// contender's monotonic instant (`Instant` in production; a simulated one in `crates/sim`).
#[derive(Clone, Debug)]
pub struct LeaseCore<T> {
    ttl: Duration,
    /// The sequence this contender last wrote while holding the lease.
    revision: Option<u64>,
    /// The sequence of the write that took the lease this time (the leadership's epoch).
    epoch: Option<u64>,
    valid_until: Option<T>,
}

impl<T: Copy + Ord + std::ops::Add<Duration, Output = T>> LeaseCore<T> {
    /// A contender holding nothing, for a lease of `ttl`.
    pub fn new(ttl: Duration) -> LeaseCore<T> {
        LeaseCore { ttl, revision: None, epoch: None, valid_until: None }
    }

    /// Starts an acquire: forgets any earlier write (a refused acquire must never let a later
    /// release touch another holder's lease) and returns the subject sequence to expect (0).
    pub fn begin_acquire(&mut self) -> u64 {
        self.lose();
        0
    }

    /// The store's answer to the acquire begun at `started`: whether the lease is held.
    pub fn acquired(&mut self, outcome: CasOutcome, started: T) -> bool {
        match outcome {
            CasOutcome::Written(revision) => {
                self.epoch = Some(revision);
                self.held_from(revision, started)
            }
            CasOutcome::Refused => false,
        }
    }

    /// The subject sequence a renewal expects (`None`: nothing held, nothing to renew).
    pub fn renewal(&self) -> Option<u64> {
        self.revision
    }

    /// The store's answer to the renewal begun at `started`: whether the lease is still held.
    pub fn renewed(&mut self, outcome: CasOutcome, started: T) -> bool {
        match outcome {
            CasOutcome::Written(revision) => self.held_from(revision, started),
            CasOutcome::Refused => {
                self.lose();
                false
            }
        }
    }

    /// Until when this contender may act as leader at `now` (`None`: it does not hold it).
    pub fn valid_until(&self, now: T) -> Option<T> {
        self.valid_until.filter(|until| now < *until)
    }

    /// The epoch of the leadership held at `now` (`None`: not held).
    pub fn epoch(&self, now: T) -> Option<u64> {
        self.valid_until(now).and(self.epoch)
    }

    /// Gives the lease up: what to delete (`None`: nothing was held).
    pub fn release(&mut self) -> Option<ReleaseTarget> {
        let revision = self.revision?;
        self.lose();
        if cfg!(feature = "regress-blind-release") {
            return Some(ReleaseTarget::Subject);
        }
        Some(ReleaseTarget::Revision(revision))
    }

    fn held_from(&mut self, revision: u64, started: T) -> bool {
        self.revision = Some(revision);
        self.valid_until = Some(started + self.ttl.saturating_sub(LEASE_SAFETY_MARGIN));
        true
    }

    fn lose(&mut self) {
        self.revision = None;
        self.epoch = None;
        self.valid_until = None;
    }
}

/// One contender for one shard's lease.
pub struct Lease {
    js: jetstream::Context,
    stream: stream::Stream,
    subject: String,
    holder: bytes::Bytes,
    core: LeaseCore<Instant>,
}

impl Lease {
    /// Opens (creating when missing) the lease stream and contends for `shard`'s subject as
    /// `holder` (a name for logs: the host and process).
    pub async fn open(
        client: async_nats::Client,
        settings: &LeaseSettings,
        shard: u32,
        holder: &str,
    ) -> Result<Lease, ReplicationError> {
        settings.validate()?;
        let mut js = jetstream::new(client);
        js.set_timeout(settings.renew_every);
        let prefix = settings.bucket.to_ascii_lowercase();
        let config = stream::Config {
            name: settings.bucket.clone(),
            subjects: vec![format!("{prefix}.>")],
            max_age: settings.ttl,
            max_messages_per_subject: 1,
            num_replicas: settings.replicas,
            ..Default::default()
        };
        let what = format!("opening lease stream {}", settings.bucket);
        let stream = retry_at_startup(&what, || js.get_or_create_stream(config.clone())).await?;
        let holder = bytes::Bytes::copy_from_slice(holder.as_bytes());
        let subject = format!("{prefix}.shard-{shard}");
        Ok(Lease { js, stream, subject, holder, core: LeaseCore::new(settings.ttl) })
    }

    /// Takes the lease if nobody holds it. `Ok(false)`: another holder's message is alive (any
    /// write of this contender's is then gone or about to expire: it is forgotten, so a later
    /// [`Lease::release`] cannot touch the other holder's lease).
    pub async fn try_acquire(&mut self) -> Result<bool, ReplicationError> {
        let started = Instant::now();
        let expected = self.core.begin_acquire();
        match self.write_after(expected).await {
            Ok(revision) => Ok(self.core.acquired(CasOutcome::Written(revision), started)),
            Err(PublishErrorKind::WrongLastSequence) => {
                Ok(self.core.acquired(CasOutcome::Refused, started))
            }
            Err(kind) => Err(ReplicationError::jetstream(format!("taking {}", self.subject), kind)),
        }
    }

    /// Renews a held lease. `Ok(false)`: it was lost (another holder wrote the subject, or it
    /// expired); an error (no quorum, no server) leaves the validity running out on its own.
    pub async fn renew(&mut self) -> Result<bool, ReplicationError> {
        let Some(revision) = self.core.renewal() else { return Ok(false) };
        let started = Instant::now();
        match self.write_after(revision).await {
            Ok(revision) => Ok(self.core.renewed(CasOutcome::Written(revision), started)),
            Err(PublishErrorKind::WrongLastSequence) => {
                Ok(self.core.renewed(CasOutcome::Refused, started))
            }
            Err(kind) => {
                Err(ReplicationError::jetstream(format!("renewing {}", self.subject), kind))
            }
        }
    }

    /// Until when this contender may act as leader (`None`: it does not hold the lease).
    pub fn valid_until(&self) -> Option<Instant> {
        self.core.valid_until(Instant::now())
    }

    /// The epoch of the leadership held now (`None`: not held): the lease stream's sequence of
    /// the write that took it, larger than every earlier leadership's of this shard.
    pub fn epoch(&self) -> Option<u64> {
        self.core.epoch(Instant::now())
    }

    /// Gives the lease up at once (a stopping leader), so a standby need not wait the TTL.
    /// Deletes this holder's own last write only: if anyone wrote the subject since, that
    /// write is gone already and nothing is deleted.
    pub async fn release(&mut self) -> Result<(), ReplicationError> {
        let revision = match self.core.release() {
            None => return Ok(()),
            Some(ReleaseTarget::Revision(revision)) => revision,
            Some(ReleaseTarget::Subject) => {
                let purged = self.stream.purge().filter(self.subject.clone()).await;
                let what = format!("releasing {}", self.subject);
                return purged.map(|_| ()).map_err(|e| ReplicationError::jetstream(what, e));
            }
        };
        match self.stream.delete_message(revision).await {
            Ok(_) => Ok(()),
            // Expired, or replaced by a successor's write: not ours to delete any more (the
            // server answers "no message found" under the delete's own code).
            Err(error)
                if matches!(error.kind(), DeleteMessageErrorKind::JetStream(e)
                if [ErrorCode::NO_MESSAGE_FOUND, ErrorCode::STREAM_MESSAGE_DELETE_FAILED]
                    .contains(&e.error_code())) =>
            {
                Ok(())
            }
            Err(error) => {
                Err(ReplicationError::jetstream(format!("releasing {}", self.subject), error))
            }
        }
    }

    /// Who holds the lease now, by the stream (`None`: nobody).
    pub async fn holder(&self) -> Result<Option<String>, ReplicationError> {
        match self.stream.get_last_raw_message_by_subject(&self.subject).await {
            Ok(message) => Ok(Some(String::from_utf8_lossy(&message.payload).into_owned())),
            Err(error) if error.kind() == stream::LastRawMessageErrorKind::NoMessageFound => {
                Ok(None)
            }
            Err(error) => {
                Err(ReplicationError::jetstream(format!("reading {}", self.subject), error))
            }
        }
    }

    /// Writes this holder's name if the subject's last sequence is `expected` (0: none alive);
    /// the new sequence.
    async fn write_after(&self, expected: u64) -> Result<u64, PublishErrorKind> {
        let mut headers = async_nats::HeaderMap::new();
        let expected = expected.to_string();
        headers.insert(async_nats::header::NATS_EXPECTED_LAST_SUBJECT_SEQUENCE, expected.as_str());
        let publish =
            self.js.publish_with_headers(self.subject.clone(), headers, self.holder.clone());
        let ack = publish.await.map_err(|e| e.kind())?.await.map_err(|e| e.kind())?;
        Ok(ack.sequence)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_holder_that_learns_nothing_releases_only_its_own_write_and_a_refusal_forgets_it() {
        let ttl = Duration::from_secs(1);
        let mut core: LeaseCore<Duration> = LeaseCore::new(ttl);
        let start = Duration::ZERO;
        assert_eq!(core.begin_acquire(), 0, "an acquire expects no live message");
        assert!(core.acquired(CasOutcome::Written(7), start));
        assert_eq!(core.epoch(start), Some(7));
        let end = start + ttl - LEASE_SAFETY_MARGIN;
        assert_eq!(core.epoch(end), None, "validity ends the margin before the TTL");
        assert_eq!(core.renewal(), Some(7));
        if cfg!(feature = "regress-blind-release") {
            assert_eq!(core.release(), Some(ReleaseTarget::Subject));
        } else {
            assert_eq!(core.release(), Some(ReleaseTarget::Revision(7)));
        }
        assert!(core.acquired(CasOutcome::Written(9), start));
        assert!(!core.renewed(CasOutcome::Refused, start));
        assert_eq!(core.release(), None, "a refused renewal forgot the write");
    }
}
