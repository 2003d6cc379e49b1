//! The store's record format (`crate::store`, "On disk"): a header with the payload's length,
//! its CRC32C and the record's kind and client, then the payload. Its own module so that
//! whatever writes records into a store batch (the store, the routed positions) shares one
//! encoder without depending on the store. Reading them back ([`scan`], [`tail`]) is pure
//! too: the store's recovery and `crates/sim`'s simulated store call the same code. A group-
//! commit batch ends with a [`kind::BATCH_END`] record, and [`scan`] hands a batch's records
//! on only once it has read that end: a batch is recovered whole or not at all.

use std::io::Read;

use crate::fix;

/// Bytes of a record's header.
pub const HEADER_BYTES: usize = 13;
/// Longest tail recovery cuts off as a torn write. A batch is bounded by what one unit of work
/// produces (a route batch of 256 reports, one read buffer of requests): far below this.
pub const TORN_TAIL_BYTES_MAX: u64 = 8 << 20;
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
    /// The end of a group-commit batch (empty payload, client 0), written last in each
    /// batch: recovery applies a batch's records only once it reads this ([`scan`]). Also
    /// the first record of every store created or compacted since: the store keeps batches.
    pub const BATCH_END: u8 = b'E';
}

/// Appends the record that ends a batch ([`kind::BATCH_END`]).
pub fn end_batch(out: &mut Vec<u8>) {
    encode_record(out, kind::BATCH_END, 0, &[]);
}

/// Appends a record to `out`; returns the offset its payload has in `out`.
pub fn encode_record(out: &mut Vec<u8>, kind: u8, client: u32, parts: &[&[u8]]) -> usize {
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

/// One record as recovery reads it.
#[derive(Clone, Copy, Debug)]
pub struct Record<'a> {
    /// One of [`kind`] (not checked here: the caller's `apply` refuses what it cannot decode).
    pub kind: u8,
    /// The client it belongs to.
    pub client: u32,
    /// Its payload.
    pub payload: &'a [u8],
    /// Where the payload lies in the store.
    pub payload_at: u64,
}

/// What [`scan`] read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scanned {
    /// Where the records recovery applied end (the end of the last whole batch).
    pub end: u64,
    /// Whether those records hold a [`kind::BATCH_END`]: a store without one was written
    /// before batches were marked (or is new), and its writer must add one before its next
    /// batch so that a torn batch after it is recognised.
    pub marked: bool,
}

/// Reads records from `reader` in order and hands each valid one to `apply`, a batch at a
/// time: the records after a [`kind::BATCH_END`] reach `apply` only once the next one is
/// read, so a batch torn by a crash (its end marker missing) is dropped whole, never its
/// prefix. Records before the first marker (a store written before markers) are applied as
/// they are read. Stops at a record cut short, longer than [`PAYLOAD_BYTES_MAX`] or failing
/// its checksum, or one `apply` refuses (it does not decode).
pub fn scan(
    reader: &mut impl Read,
    mut apply: impl FnMut(Record) -> bool,
) -> std::io::Result<Scanned> {
    let mut scanned = Scanned { end: 0, marked: false };
    // The records read since the last marker (headers and payloads) and where they start.
    let mut batch = Vec::new();
    let mut at = 0u64;
    let mut payload = vec![0u8; PAYLOAD_BYTES_MAX];
    loop {
        let mut header = [0u8; HEADER_BYTES];
        if read_full(reader, &mut header)? < HEADER_BYTES {
            break;
        }
        let len = u32::from_le_bytes(header[0..4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(header[4..8].try_into().expect("4 bytes"));
        if len > PAYLOAD_BYTES_MAX || read_full(reader, &mut payload[..len])? < len {
            break;
        }
        let payload = &payload[..len];
        if crc32c::crc32c_append(crc32c::crc32c(&header[8..13]), payload) != crc {
            break;
        }
        let record_end = at + (HEADER_BYTES + len) as u64;
        if header[8] == kind::BATCH_END {
            match apply_batch(&batch, scanned.end, &mut apply) {
                Some(refused_at) => return Ok(Scanned { end: refused_at, ..scanned }),
                None => scanned = Scanned { end: record_end, marked: true },
            }
            batch.clear();
        } else if scanned.marked {
            batch.extend_from_slice(&header);
            batch.extend_from_slice(payload);
        } else {
            let client = u32::from_le_bytes(header[9..13].try_into().expect("4 bytes"));
            let payload_at = at + HEADER_BYTES as u64;
            if !apply(Record { kind: header[8], client, payload, payload_at }) {
                break;
            }
            scanned.end = record_end;
        }
        at = record_end;
    }
    Ok(scanned)
}

/// Hands `batch`'s records (read and checked by [`scan`]; the first at file offset `from`)
/// to `apply`; where the first one it refuses starts, if it refuses one.
fn apply_batch(batch: &[u8], from: u64, apply: &mut impl FnMut(Record) -> bool) -> Option<u64> {
    let mut at = 0;
    while at < batch.len() {
        let header = &batch[at..at + HEADER_BYTES];
        let len = u32::from_le_bytes(header[0..4].try_into().expect("4 bytes")) as usize;
        let client = u32::from_le_bytes(header[9..13].try_into().expect("4 bytes"));
        let payload = &batch[at + HEADER_BYTES..at + HEADER_BYTES + len];
        let payload_at = from + (at + HEADER_BYTES) as u64;
        if !apply(Record { kind: header[8], client, payload, payload_at }) {
            return Some(from + at as u64);
        }
        at += HEADER_BYTES + len;
    }
    None
}

/// What recovery does with the bytes after the valid records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tail {
    /// None: the store ends with its valid records.
    Clean,
    /// A write torn by a crash (never released to any client): cut off this many bytes.
    Torn(u64),
    /// Longer than a torn write can be: damage; the store refuses to open.
    Damaged(u64),
}

/// The verdict on a store of `size` bytes whose valid records end at `end`.
pub fn tail(end: u64, size: u64) -> Tail {
    match size.saturating_sub(end) {
        0 => Tail::Clean,
        bytes if bytes > TORN_TAIL_BYTES_MAX => Tail::Damaged(bytes),
        bytes => Tail::Torn(bytes),
    }
}

/// Reads until `buffer` is full or the reader ends; how much it read.
fn read_full(reader: &mut impl Read, buffer: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buffer.len() {
        match reader.read(&mut buffer[filled..])? {
            0 => break,
            n => filled += n,
        }
    }
    Ok(filled)
}
