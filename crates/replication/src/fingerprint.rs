//! What must be equal across the engines of one shard's group for their outputs to be equal,
//! checked instead of assumed.
//!
//! Every engine of a group computes the same reports from the same log only if it runs the
//! same rules on the same data: the master data it starts from (instruments, bands, client
//! limits: read from files, not from the log), the tier settings that shape outputs (the
//! outlets reports are routed to, the order pool whose exhaustion rejects), and the
//! formats of the log records, snapshots and report batches. Those go into the *settings
//! fingerprint*; the binary's version is kept beside it. A leader writes both with its lease
//! and its snapshots; an engine whose fingerprint differs from the lease holder's or the
//! snapshot's refuses to start (`ReplicationError::Fingerprint`), and one that meets a holder
//! with another fingerprint while running stops following. A snapshot from another version
//! with the same settings is accepted: restarting every engine on a new release from the last
//! snapshot is how a group is upgraded (docs/REPLICATION.md, "Upgrade").

use exchange::tier::TierConfig;

use crate::error::ReplicationError;

/// This binary's version, beside the settings fingerprint.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// An engine's fingerprint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fingerprint {
    /// FNV-1a of everything that shapes the group's outputs (see the module).
    pub settings: u64,
    /// The binary's version ([`VERSION`] for this process).
    pub version: String,
}

impl Fingerprint {
    /// The fingerprint of an engine running `tier` with this binary.
    ///
    /// ```
    /// use exchange::tier::TierConfig;
    /// use replication::fingerprint::Fingerprint;
    /// let tier = TierConfig::parked();
    /// assert_eq!(Fingerprint::of(&tier), Fingerprint::of(&tier.clone()));
    /// let other = TierConfig { outlets: tier.outlets + 1, ..tier.clone() };
    /// assert_ne!(Fingerprint::of(&tier).settings, Fingerprint::of(&other).settings);
    /// ```
    pub fn of(tier: &TierConfig) -> Fingerprint {
        // The text hashed keeps its words ("gateways" is the outlets' old name): a snapshot
        // written by an earlier release with the same settings must keep its fingerprint.
        let shaping = format!(
            "log record v{} | snapshot {} | batch v{} | gateways {} | order pool {} | ended ids {} | {:?}",
            crate::record::RECORD_VERSION,
            crate::snapshot::FORMAT,
            delivery::wire::BATCH_VERSION,
            tier.outlets,
            tier.order_pool_slots,
            tier.ended_order_ids,
            tier.starting_master_data(),
        );
        Fingerprint { settings: stable_hash(shaping.as_bytes()), version: VERSION.to_string() }
    }

    /// As written beside a lease holder's name and in a snapshot's description.
    pub fn to_text(&self) -> String {
        format!("fingerprint={:016x} version={}", self.settings, self.version)
    }

    /// Reads [`Fingerprint::to_text`] at the end of `text` (`None`: it has none, e.g. written
    /// by an earlier release).
    pub fn find_in(text: &str) -> Option<Fingerprint> {
        let at = text.rfind("fingerprint=")?;
        let mut fields = text[at..].split(' ');
        let settings = fields.next()?.strip_prefix("fingerprint=")?;
        let version = fields.next()?.strip_prefix("version=")?;
        let settings = u64::from_str_radix(settings, 16).ok()?;
        Some(Fingerprint { settings, version: version.to_string() })
    }

    /// `Ok` when an engine with this fingerprint may join `found`'s group (`what` names where
    /// `found` was read; `same_version`: the binary's version must match too).
    pub fn admits(
        &self,
        found: &Fingerprint,
        what: &str,
        same_version: bool,
    ) -> Result<(), ReplicationError> {
        let version_differs = same_version && self.version != found.version;
        if self.settings == found.settings && !version_differs {
            return Ok(());
        }
        Err(ReplicationError::Fingerprint(format!(
            "{what} has {}, this engine {}: its outputs would differ (master-data files, tier \
             outlets or order pool, or the release); start every engine of the group alike",
            found.to_text(),
            self.to_text()
        )))
    }
}

/// FNV-1a, 64 bits: a hash whose values no compiler or library release changes (std's
/// `DefaultHasher` promises no stability, and engines of one group may be built apart).
pub fn stable_hash(bytes: &[u8]) -> u64 {
    const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes.iter().fold(FNV_OFFSET, |hash, &byte| (hash ^ u64::from(byte)).wrapping_mul(FNV_PRIME))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_is_fnv_1a_and_never_changes() {
        // FNV-1a's published test vectors: engines built by any compiler agree.
        assert_eq!(stable_hash(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(stable_hash(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(stable_hash(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn a_fingerprint_reads_back_and_a_foreign_one_is_refused_with_both_named() {
        let tier = TierConfig::parked();
        let ours = Fingerprint::of(&tier);
        let text = format!("host-1-abc {}", ours.to_text());
        assert_eq!(Fingerprint::find_in(&text), Some(ours.clone()));
        assert_eq!(Fingerprint::find_in("host-1-abc"), None, "an earlier release's holder");
        assert!(ours.admits(&ours, "the lease holder", true).is_ok());
        let mut master = tier.starting_master_data();
        master.clients.push(None);
        let other = Fingerprint::of(&TierConfig { master_data: Some(master), ..tier });
        let refused = ours.admits(&other, "the lease holder", true).unwrap_err().to_string();
        assert!(
            refused.contains(&other.to_text()) && refused.contains(&ours.to_text()),
            "{refused}"
        );
        let newer = Fingerprint { version: "9.9.9".into(), ..ours.clone() };
        assert!(ours.admits(&newer, "the snapshot", false).is_ok(), "an upgrade from a snapshot");
        assert!(ours.admits(&newer, "the lease holder", true).is_err(), "two releases at once");
    }
}
