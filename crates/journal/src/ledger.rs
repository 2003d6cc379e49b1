//! The reference state machine of the crash tests, the soak script and the benchmarks: an
//! account ledger applying transfers. Small, deterministic, and sensitive to every mistake
//! recovery could make: a record applied twice, skipped or reordered changes the balances
//! (and so the hash), and `out_of_order` counts any sequence that is not the previous plus one.

use crate::record::FixedRecord;
use crate::state::StateMachine;

/// Accounts in the reference ledger.
pub const LEDGER_ACCOUNTS: usize = 1024;
/// Bytes of an encoded transfer: from (u32), to (u32), amount (u64), seq echo (u64).
pub const TRANSFER_BYTES: usize = 24;
const INITIAL_BALANCE: i64 = 1_000_000;
const AMOUNT_MAX: u64 = 5_000;
const COUNTERS: usize = 4;

/// A journaled transfer.
pub type TransferRecord = FixedRecord<TRANSFER_BYTES>;

/// splitmix64: a fixed, portable mixing function, so inputs are the same on every build.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The deterministic input with sequence `seq` of the input stream `seed`: any process can
/// regenerate it, which is how a restarted client "resends" what was not acknowledged.
pub fn transfer_for(seed: u64, seq: u64) -> TransferRecord {
    let x = mix(seed ^ mix(seq));
    let from = (x % LEDGER_ACCOUNTS as u64) as u32;
    let to = ((x >> 20) % LEDGER_ACCOUNTS as u64) as u32;
    let amount = (x >> 40) % AMOUNT_MAX + 1;
    let mut payload = [0u8; TRANSFER_BYTES];
    payload[..4].copy_from_slice(&from.to_le_bytes());
    payload[4..8].copy_from_slice(&to.to_le_bytes());
    payload[8..16].copy_from_slice(&amount.to_le_bytes());
    payload[16..24].copy_from_slice(&seq.to_le_bytes());
    TransferRecord { seq, payload }
}

/// The reference state machine: account balances moved by transfers, with a running hash, so
/// the crash tests can check a recovered state against a replay from scratch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ledger {
    balances: Vec<i64>,
    applied: u64,
    last_seq: u64,
    rejected: u64,
    out_of_order: u64,
}

impl Default for Ledger {
    fn default() -> Self {
        Ledger {
            balances: vec![INITIAL_BALANCE; LEDGER_ACCOUNTS],
            applied: 0,
            last_seq: 0,
            rejected: 0,
            out_of_order: 0,
        }
    }
}

impl Ledger {
    /// Records applied (accepted or rejected); equals `last_seq` when each was applied once.
    pub fn applied(&self) -> u64 {
        self.applied
    }

    /// The sequence of the last transfer applied.
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// Records whose sequence was not the previous one plus one: must stay 0.
    pub fn out_of_order(&self) -> u64 {
        self.out_of_order
    }

    /// Sum of all balances: transfers conserve it.
    pub fn total_balance(&self) -> i64 {
        self.balances.iter().sum()
    }

    /// The state after an uninterrupted run over inputs `1..=last_seq` of stream `seed`.
    pub fn replay_from_scratch(seed: u64, last_seq: u64) -> Ledger {
        let mut ledger = Ledger::default();
        for seq in 1..=last_seq {
            ledger.apply(seq, &transfer_for(seed, seq).payload);
        }
        ledger
    }
}

impl StateMachine for Ledger {
    fn apply(&mut self, seq: u64, payload: &[u8]) {
        if seq != self.last_seq + 1 {
            self.out_of_order += 1;
        }
        self.applied += 1;
        self.last_seq = seq;
        let field = |range: std::ops::Range<usize>| {
            payload.get(range).map(|b| b.iter().rev().fold(0u64, |acc, &x| acc << 8 | x as u64))
        };
        let (Some(from), Some(to), Some(amount)) = (field(0..4), field(4..8), field(8..16)) else {
            self.rejected += 1;
            return;
        };
        let (from, to) = (from as usize, to as usize);
        let amount = amount as i64;
        if from >= LEDGER_ACCOUNTS || to >= LEDGER_ACCOUNTS || self.balances[from] < amount {
            self.rejected += 1;
            return;
        }
        self.balances[from] -= amount;
        self.balances[to] += amount;
    }

    fn write_snapshot(&self, out: &mut Vec<u8>) {
        for counter in [self.applied, self.last_seq, self.rejected, self.out_of_order] {
            out.extend_from_slice(&counter.to_le_bytes());
        }
        for balance in &self.balances {
            out.extend_from_slice(&balance.to_le_bytes());
        }
    }

    fn restore(bytes: &[u8]) -> Result<Self, String> {
        let expected = (COUNTERS + LEDGER_ACCOUNTS) * 8;
        if bytes.len() != expected {
            return Err(format!("ledger snapshot of {} bytes, expected {expected}", bytes.len()));
        }
        let mut words =
            bytes.chunks_exact(8).map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")));
        let mut next = || words.next().expect("length checked above");
        let (applied, last_seq, rejected, out_of_order) = (next(), next(), next(), next());
        let balances = (0..LEDGER_ACCOUNTS).map(|_| next() as i64).collect();
        Ok(Ledger { balances, applied, last_seq, rejected, out_of_order })
    }

    fn state_hash(&self) -> u64 {
        let mut bytes = Vec::with_capacity((COUNTERS + LEDGER_ACCOUNTS) * 8);
        self.write_snapshot(&mut bytes);
        let digest = blake3::hash(&bytes);
        u64::from_le_bytes(digest.as_bytes()[..8].try_into().expect("8 bytes"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_round_trips_and_a_double_apply_changes_the_hash() {
        let ledger = Ledger::replay_from_scratch(7, 5_000);
        assert_eq!((ledger.applied(), ledger.out_of_order()), (5_000, 0));
        assert_eq!(ledger.total_balance(), INITIAL_BALANCE * LEDGER_ACCOUNTS as i64);
        let mut bytes = Vec::new();
        ledger.write_snapshot(&mut bytes);
        assert_eq!(Ledger::restore(&bytes).unwrap(), ledger);
        assert!(Ledger::restore(&bytes[1..]).is_err());
        let mut twice = ledger.clone();
        twice.apply(5_000, &transfer_for(7, 5_000).payload);
        assert_ne!(twice.state_hash(), ledger.state_hash());
        assert_eq!(twice.out_of_order(), 1);
    }
}
