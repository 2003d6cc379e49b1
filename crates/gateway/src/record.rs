//! The store's record format (`crate::store`, "On disk"): a header with the payload's length,
//! its CRC32C and the record's kind and client, then the payload. Its own module so that
//! whatever writes records into a store batch (the store, the routed positions) shares one
//! encoder without depending on the store.

use crate::fix;

/// Bytes of a record's header.
pub(crate) const HEADER_BYTES: usize = 13;
/// Largest payload: a FIX message (header and trailer included) and its sequence number.
pub const PAYLOAD_BYTES_MAX: usize = fix::BODY_BYTES_MAX + 256;

/// Record kinds.
pub mod kind {
    /// A FIX message sent: `[MsgSeqNum: u64][the message]`.
    pub const FIX_SENT: u8 = b'M';
    /// The next expected inbound FIX MsgSeqNum: `[u64]`.
    pub const FIX_NEXT_IN: u8 = b'I';
    /// ResetSeqNumFlag: the session starts again at 1 both ways (empty payload).
    pub const FIX_RESET: u8 = b'R';
    /// A native sequenced event: its wire frame (`ServerMsg::Sequenced`).
    pub const NATIVE_EVENT: u8 = b'S';
    /// Compaction: the highest OrderID a FIX session ever sent, `[u32]` (its reports may be
    /// gone).
    pub const FIX_ORDER_ID_MAX: u8 = b'X';
    /// Compaction: a native client's stream goes on at this sequence number, `[u64]` (the
    /// events before it are gone).
    pub const NATIVE_NEXT: u8 = b'N';
    /// Compaction: an order still open, `[token: u32][instrument: u32]` (its reports may be
    /// gone); written after every other record of the compacted file.
    pub const OPEN_ORDER: u8 = b'O';
    /// A FIX session's outbound MsgSeqNums below this `[u64]` may have been used by messages
    /// the store does not keep (session messages; a resend gap-fills them): it goes on there.
    pub const FIX_NEXT_OUT: u8 = b'U';
    /// A native client's sequence numbers below this `[u64]` may have been used by events the
    /// store does not keep (the gateway's own refusals): recovery fills them with
    /// [`crate::native::gateway_reason::NOT_KEPT`] rejects and numbering goes on there.
    pub const NATIVE_RESERVED: u8 = b'V';
    /// A gateway without a tier: how far one (shard, slot)'s reports were routed
    /// (`crate::routed`), in the batch of the reports it counts; client field 0.
    pub const ROUTED: u8 = b'P';
}

/// Appends a record to `out`; returns the offset its payload has in `out`.
pub(crate) fn encode_record(out: &mut Vec<u8>, kind: u8, client: u32, parts: &[&[u8]]) -> usize {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    // Release-build check: a longer record would be written but refused by recovery.
    assert!(len <= PAYLOAD_BYTES_MAX, "store record of {len} bytes");
    let mut crc = crc32c::crc32c(&[kind]);
    crc = crc32c::crc32c_append(crc, &client.to_le_bytes());
    for part in parts {
        crc = crc32c::crc32c_append(crc, part);
    }
    out.extend_from_slice(&(len as u32).to_le_bytes());
    out.extend_from_slice(&crc.to_le_bytes());
    out.push(kind);
    out.extend_from_slice(&client.to_le_bytes());
    let offset = out.len();
    for part in parts {
        out.extend_from_slice(part);
    }
    offset
}
