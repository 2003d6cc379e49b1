//! What the journal stores: fixed-size, sequenced input records.
//!
//! The core hands records to the writer through a `pipeline` ring, whose slots are
//! pre-allocated `Copy + Default` values, so a record type is plain data. A record encodes
//! itself straight into the writer's batch buffer ([`Record::encode`]): no allocation and no
//! intermediate copy per record.

/// A record the journal can write. Sequence numbers start at 1 and are consecutive: the
/// writer refuses a gap or a repeat ([`crate::JournalError::OutOfSequence`]).
pub trait Record: Copy + Default + Send + 'static {
    /// Encoded size in bytes; the same for every record of the type (1..=`PAYLOAD_BYTES_MAX`).
    const PAYLOAD_BYTES: usize;

    /// The input's sequence number, assigned by the sequencer in front of the core.
    fn seq(&self) -> u64;

    /// Writes exactly `PAYLOAD_BYTES` bytes into `payload`.
    fn encode(&self, payload: &mut [u8]);
}

/// A ready-made record: a sequence number and `N` opaque bytes. An adopter with an input
/// type of its own either implements [`Record`] for it or copies its encoding into this.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FixedRecord<const N: usize> {
    /// Its sequence number.
    pub seq: u64,
    /// Its payload bytes.
    pub payload: [u8; N],
}

// `[u8; N]: Default` only exists for N <= 32, hence the manual impl.
impl<const N: usize> Default for FixedRecord<N> {
    fn default() -> Self {
        FixedRecord { seq: 0, payload: [0; N] }
    }
}

impl<const N: usize> Record for FixedRecord<N> {
    const PAYLOAD_BYTES: usize = N;

    fn seq(&self) -> u64 {
        self.seq
    }

    fn encode(&self, payload: &mut [u8]) {
        payload.copy_from_slice(&self.payload);
    }
}
