//! The one seam through which the tier draws its random ids: a publisher's instance id
//! (`publish`), a gateway run's id (`gateway::remote`). Production passes [`OsEntropy`];
//! `crates/sim` passes its seeded generator, so a simulated run's ids follow from its seed.
//! Generic, not a trait object: the callers draw once per run, never per message.
//!
//! Not behind it: the credentials' salts and stand-in hashes (`gateway::credentials`), which
//! must stay unpredictable; a simulation has no use for them.

/// A source of random 64-bit draws.
pub trait Entropy {
    /// The next draw.
    fn next_u64(&mut self) -> u64;
}

/// The OS-seeded source: std's per-process random hash keys (a fresh pair per draw),
/// mixed with the monotonic clock and the pid. Tells runs and publishers apart; not for
/// secrets.
#[derive(Clone, Copy, Debug, Default)]
pub struct OsEntropy;

impl Entropy for OsEntropy {
    fn next_u64(&mut self) -> u64 {
        use std::hash::{BuildHasher, Hasher};
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u64(crate::clock::monotonic_ns());
        hasher.write_u32(std::process::id());
        hasher.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn os_draws_differ() {
        let mut entropy = OsEntropy;
        let draws: std::collections::HashSet<u64> = (0..64).map(|_| entropy.next_u64()).collect();
        assert_eq!(draws.len(), 64, "64 draws, all different");
    }
}
