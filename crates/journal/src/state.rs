//! What a journal protects: a state that is a deterministic function of its input sequence,
//! which recovery rebuilds from a snapshot and the records after it.

/// The state the journal protects: a deterministic function of the input sequence.
pub trait StateMachine: Sized {
    /// Applies the record `seq` (payload as journaled). Must be deterministic: replaying the
    /// same records from the same state must give the same state.
    fn apply(&mut self, seq: u64, payload: &[u8]);
    /// Serialises the state (appending to `out`, which arrives empty).
    fn write_snapshot(&self, out: &mut Vec<u8>);
    /// Rebuilds a state from [`StateMachine::write_snapshot`]'s bytes; `Err` names why not.
    fn restore(bytes: &[u8]) -> Result<Self, String>;
    /// A digest of the whole state, to compare runs and validate snapshots.
    fn state_hash(&self) -> u64;
}
