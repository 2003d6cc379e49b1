//! A replica of an ordered tier on one thread: what a tier with one pre-process worker and
//! one core shard ([`TierConfig::ordered_outputs`](super::TierConfig::ordered_outputs)) does
//! with each request, in the same order, without its rings.
//!
//! A replicated engine keeps one beside its tier to take snapshots off the tier's threads
//! (as the journal's snapshot follower does, `crate::durability`): the state of the core shard
//! after input `n`, and how many responses the tier had handed each outlet by then (the
//! sequence numbers its publisher had given out). The pre-process, the core and the
//! R-Processor's routing are pure functions of the input, so the replica at input `n` equals
//! the tier at input `n`; `tests/tier_replica.rs` checks it response for response.

use journal::StateMachine;

use super::{TierInput, preprocessed, response_to};
use crate::core::CoreLimits;
use crate::durability::ShardState;
use crate::error::{ExchangeError, Result};
use crate::master::MasterData;
use crate::msg::{InboundOrder, Response, SequencedInput, Stamps};
use crate::preprocess::{StateChecks, check_with};

/// The pre-process, core and R-Processor of an ordered tier, on the caller's thread.
pub struct TierReplica {
    master: MasterData,
    state: ShardState,
    /// The core's last input sequence (the tier's `SequencedInput::seq`).
    last_seq: u64,
    outlets: u32,
}

impl TierReplica {
    /// A replica of a tier starting from `master` with empty books, routing responses to
    /// `outlets` outlets (the tier's `outlets`).
    pub fn new(master: MasterData, limits: CoreLimits, outlets: u32) -> TierReplica {
        let state = ShardState::new(&master.listings(), limits);
        TierReplica { master, state, last_seq: 0, outlets }
    }

    /// A replica continuing from a core shard's snapshot (`ShardState`'s snapshot bytes) taken
    /// after its input `last_seq`; `Err` ([`ExchangeError::BadInput`]) when the bytes do not
    /// restore.
    pub fn restored(
        master: MasterData,
        outlets: u32,
        last_seq: u64,
        snapshot: &[u8],
    ) -> Result<TierReplica> {
        let state = ShardState::restore(snapshot)
            .map_err(|why| ExchangeError::BadInput(format!("a shard snapshot: {why}")))?;
        Ok(TierReplica { master, state, last_seq, outlets })
    }

    /// Handles one request as the tier would, handing `emit` each response the tier's
    /// R-Processor would hand its senders, in order (stamps zero).
    pub fn apply(&mut self, request: &InboundOrder, emit: &mut impl FnMut(&Response)) {
        let verdict = check_with(&self.master, request, StateChecks::Core);
        let input: TierInput = preprocessed(request, verdict, Stamps::default());
        let outlets = self.outlets;
        if let Some(refusal) = input.refused {
            let reject = refusal.reject(input.instrument, input.stamps);
            return emit(&response_to(reject, outlets));
        }
        self.last_seq += 1;
        let sequenced = SequencedInput {
            seq: self.last_seq,
            instrument: input.instrument,
            command: input.command,
            stamps: input.stamps,
        };
        self.state.process(&sequenced, &mut |output| emit(&response_to(*output, outlets)));
    }

    /// The core's last input sequence.
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// The core shard's snapshot (what [`TierReplica::restored`] and
    /// `durability::ShardRestore` take).
    pub fn snapshot(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(self.state.snapshot_bytes_max());
        self.state.write_snapshot(&mut bytes);
        bytes
    }
}
