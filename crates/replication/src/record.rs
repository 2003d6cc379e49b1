//! One order as a record of the input log: a fixed 48-byte little-endian layout with a
//! version byte, so that a log written by one release is read, or refused, by the next. A log
//! message holds 1..=[`RECORDS_PER_MESSAGE_MAX`] records back to back (a gateway packs the
//! orders of one shard that arrived together: one append, one stream sequence).
//!
//! ```text
//! 0 version | 1 kind | 2 side | 3 order type | 4 time in force | 5..8 zero
//! 8 instrument u32 | 12 client u32 | 16 order id u64 | 24 price i64 | 32 qty u32 | 36..40 zero
//! 40 intended send time, absolute CLOCK_MONOTONIC ns u64 (latency only; not an input)
//! ```
//!
//! The codes stay raw (the pre-process checks them, as it does for orders off the network),
//! so a record carries exactly what the gateway received.

use matching::msg::{InboundOrder, Stamps};

/// Bytes of one record.
pub const RECORD_BYTES: usize = 48;
/// The layout version this release writes and reads.
pub const RECORD_VERSION: u8 = 1;
/// Most records one log message holds.
pub const RECORDS_PER_MESSAGE_MAX: usize = 64;

/// Why bytes are not a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// The message is not [`RECORD_BYTES`] long.
    #[error("an input-log record is {RECORD_BYTES} bytes, this one {0}")]
    Length(usize),
    /// Written by a release with another layout.
    #[error("input-log record version {0}; this release reads version {RECORD_VERSION}")]
    Version(u8),
    /// A message that is not 1..=[`RECORDS_PER_MESSAGE_MAX`] whole records.
    #[error(
        "an input-log message holds 1..={RECORDS_PER_MESSAGE_MAX} records of {RECORD_BYTES} \
         bytes, this one {0} bytes"
    )]
    MessageLength(usize),
}

/// The records of one log message, in order; `Err` when its length is not whole records.
///
/// ```
/// use replication::record::{RECORD_BYTES, RecordError, records};
/// assert_eq!(records(&[1; 2 * RECORD_BYTES]).unwrap().count(), 2);
/// assert_eq!(records(&[1; 50]).unwrap_err(), RecordError::MessageLength(50));
/// assert_eq!(records(&[]).unwrap_err(), RecordError::MessageLength(0));
/// ```
pub fn records(message: &[u8]) -> Result<std::slice::ChunksExact<'_, u8>, RecordError> {
    let whole = message.len().is_multiple_of(RECORD_BYTES);
    let count = message.len() / RECORD_BYTES;
    if !whole || !(1..=RECORDS_PER_MESSAGE_MAX).contains(&count) {
        return Err(RecordError::MessageLength(message.len()));
    }
    Ok(message.chunks_exact(RECORD_BYTES))
}

/// Encodes `order` with its intended send time (absolute monotonic ns, 0 when unknown).
///
/// ```
/// use matching::msg::InboundOrder;
/// use replication::record::{decode, encode};
/// let order = InboundOrder { instrument: 7, client: 3, order_id: 11, price: 10_125, qty: 100, ..InboundOrder::default() };
/// let (back, intended_abs_ns) = decode(&encode(&order, 42)).unwrap();
/// assert_eq!((back.instrument, back.price, intended_abs_ns), (7, 10_125, 42));
/// ```
pub fn encode(order: &InboundOrder, intended_abs_ns: u64) -> [u8; RECORD_BYTES] {
    let mut out = [0u8; RECORD_BYTES];
    out[0] = RECORD_VERSION;
    out[1..5].copy_from_slice(&[order.kind, order.side, order.order_type, order.time_in_force]);
    out[8..12].copy_from_slice(&order.instrument.to_le_bytes());
    out[12..16].copy_from_slice(&order.client.to_le_bytes());
    out[16..24].copy_from_slice(&order.order_id.to_le_bytes());
    out[24..32].copy_from_slice(&order.price.to_le_bytes());
    out[32..36].copy_from_slice(&order.qty.to_le_bytes());
    out[40..48].copy_from_slice(&intended_abs_ns.to_le_bytes());
    out
}

/// Decodes a record: the order (its stamps zero) and its intended send time.
///
/// ```
/// use replication::record::{RecordError, decode};
/// assert_eq!(decode(&[1; 47]).unwrap_err(), RecordError::Length(47));
/// assert_eq!(decode(&[9; 48]).unwrap_err(), RecordError::Version(9));
/// ```
pub fn decode(bytes: &[u8]) -> Result<(InboundOrder, u64), RecordError> {
    let bytes: &[u8; RECORD_BYTES] =
        bytes.try_into().map_err(|_| RecordError::Length(bytes.len()))?;
    if bytes[0] != RECORD_VERSION {
        return Err(RecordError::Version(bytes[0]));
    }
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    let order = InboundOrder {
        kind: bytes[1],
        side: bytes[2],
        order_type: bytes[3],
        time_in_force: bytes[4],
        instrument: u32_at(8),
        client: u32_at(12),
        order_id: u64_at(16),
        price: u64_at(24) as i64,
        qty: u32_at(32),
        stamps: Stamps::default(),
    };
    Ok((order, u64_at(40)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn every_order_survives_the_round_trip(
            codes in any::<[u8; 4]>(), ids in any::<(u32, u32, u64)>(),
            price in any::<i64>(), qty in any::<u32>(), intended in any::<u64>(),
        ) {
            let order = InboundOrder {
                kind: codes[0], side: codes[1], order_type: codes[2], time_in_force: codes[3],
                instrument: ids.0, client: ids.1, order_id: ids.2, price, qty,
                stamps: Stamps::default(),
            };
            prop_assert_eq!(decode(&encode(&order, intended)), Ok((order, intended)));
        }

        #[test]
        fn any_bytes_decode_or_fail_with_a_reason(bytes in proptest::collection::vec(any::<u8>(), 0..100)) {
            match decode(&bytes) {
                Ok((order, intended)) => prop_assert_eq!(&encode(&order, intended)[..5], &bytes[..5]),
                Err(RecordError::Length(n)) => prop_assert!(n != RECORD_BYTES),
                Err(RecordError::Version(v)) => prop_assert!(v != RECORD_VERSION),
                Err(RecordError::MessageLength(_)) => prop_assert!(false, "decode reads one record"),
            }
        }

        #[test]
        fn any_message_splits_into_whole_records_or_fails(len in 0usize..4000) {
            let message = vec![RECORD_VERSION; len];
            match records(&message) {
                Ok(chunks) => prop_assert_eq!(chunks.map(<[u8]>::len).sum::<usize>(), len),
                Err(RecordError::MessageLength(n)) => prop_assert_eq!(n, len),
                Err(other) => prop_assert!(false, "{other}"),
            }
        }
    }
}
