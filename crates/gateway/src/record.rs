//! The store's record format (`crate::store`, "On disk"): a header with the payload's length,
//! its CRC32C and the record's kind and client, then the payload. Its own module so that
//! whatever writes records into a store batch (the store, the routed positions) shares one
//! encoder without depending on the store. Reading them back ([`scan`], [`tail`]) is pure
//! too: the store's recovery and `crates/sim`'s simulated store call the same code. A group-
//! commit batch ends with a [`kind::BATCH_END`] record, and [`scan`] hands a batch's records
//! on only once it has read that end: a batch is recovered whole or not at all. The batch end
//! claims the store's synced end ([`end_batch`]); the highest claim is recovery's durable
//! watermark, which tells damage (before it: skipped, the records after it kept) from a torn
//! write (after it: cut) — `crate::store`, "The durable watermark".

use std::io::Read;

use crate::fix;

/// Bytes of a record's header.
pub const HEADER_BYTES: usize = 13;
/// Bytes of a batch end record ([`end_batch`]): its header and its claim.
pub const BATCH_END_BYTES: usize = HEADER_BYTES + 8;
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
    /// The end of a group-commit batch, `[synced_end: u64]` (client 0; empty in stores
    /// written before the claim: read as 0), written last in each batch: recovery applies a
    /// batch's records only once it reads this ([`super::scan`]), and the highest
    /// `synced_end` is its durable watermark. Also the first record of every store created or
    /// compacted since: the store keeps batches.
    pub const BATCH_END: u8 = b'E';
}

/// Appends the record that ends a batch ([`kind::BATCH_END`]), with its claim: every byte of
/// the file before `synced_end` was on disk (an `fdatasync` had returned) when the batch was
/// written. The claim rides on the batch's own write and sync; recovery's watermark is the
/// highest claim it reads ([`Scanned::watermark`]).
pub fn end_batch(out: &mut Vec<u8>, synced_end: u64) {
    encode_record(out, kind::BATCH_END, 0, &[&synced_end.to_le_bytes()]);
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
    /// Whether recovery skipped damaged bytes before this record ([`Scanned::damaged`]): a
    /// session's numbers may then jump over the records lost there.
    pub after_damage: bool,
}

/// A damaged range recovery skipped: `from` (where the first bad record starts) up to `to`
/// (where the next valid record starts, or the file's end).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Damage {
    /// The first damaged byte's record.
    pub from: u64,
    /// The next valid record (or the file's end).
    pub to: u64,
}

impl Damage {
    /// The most records the range can have held (each at least a header long): how far a
    /// session's numbering must jump so that it never reuses a number one of them carried.
    pub fn records_max(&self) -> u64 {
        (self.to - self.from).div_ceil(HEADER_BYTES as u64)
    }
}

/// What [`scan`] read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Scanned {
    /// Where the records recovery applied end (the end of the last whole batch).
    pub end: u64,
    /// Whether those records hold a [`kind::BATCH_END`]: a store without one was written
    /// before batches were marked (or is new), and its writer must add one before its next
    /// batch so that a torn batch after it is recognised.
    pub marked: bool,
    /// The durable watermark: the highest synced end a valid batch end anywhere in the file
    /// claims ([`end_batch`]; 0: none). Every byte before it was on disk, so damage there is
    /// never a torn write.
    pub watermark: u64,
    /// Damaged ranges before the watermark, skipped: the records after them were applied.
    pub damaged: Vec<Damage>,
    /// Where a valid record that `apply` refused starts (recovery stopped there).
    pub refused: Option<u64>,
}

/// The bug `regress-store-cut-at-damage` puts back (never on in a served build; the
/// simulator's regression test finds it): recovery that trusts the records alone, ending the
/// store at the first bad record and cutting the rest as a torn tail, the watermark unread.
const CUT_AT_DAMAGE: bool = cfg!(feature = "regress-store-cut-at-damage");

/// Reads the store's records from `reader` in order and hands each valid one to `apply`, a
/// batch at a time: the records after a [`kind::BATCH_END`] reach `apply` only once the next
/// one is read, so a batch torn by a crash (its end marker missing) is dropped whole, never
/// its prefix. Records before the first marker (a store written before markers) are applied
/// as they are read.
///
/// A record cut short, longer than [`PAYLOAD_BYTES_MAX`] or failing its checksum is damage:
/// the scan looks for the next valid record after it and reads on, holding what it reads back
/// until a batch end's claim proves the damage lay before the synced end
/// ([`Scanned::watermark`]): then the damaged range is skipped ([`Scanned::damaged`]) and the
/// records after it are applied. Damage no claim proves is a torn write: nothing from the
/// batch it interrupted on is applied ([`tail`] decides whether to cut it). A record `apply`
/// refuses (it does not decode) ends what is applied; the scan still reads the claims after
/// it.
pub fn scan(reader: &mut impl Read, apply: impl FnMut(Record) -> bool) -> std::io::Result<Scanned> {
    let mut source = Source { reader, bytes: Vec::new(), start: 0, eof: false };
    let mut walk = Walk {
        apply,
        out: Scanned::default(),
        pending: Vec::new(),
        boundaries: Vec::new(),
        unproven: Vec::new(),
        batch_start: 0,
        seen_end: false,
        stopped: false,
    };
    let mut at = 0u64;
    loop {
        source.forget_before(at);
        match source.record_at(at)? {
            At::End => break,
            At::Record(len) => {
                let header = source.get(at, HEADER_BYTES + len)?.expect("checked by record_at");
                walk.record(at, header);
                at += (HEADER_BYTES + len) as u64;
            }
            At::Bad if CUT_AT_DAMAGE => break,
            At::Bad => {
                let to = source.next_record(at + 1)?;
                walk.damage(Damage { from: at, to: to.unwrap_or(source.end()) });
                match to {
                    Some(to) => at = to,
                    None => break,
                }
            }
        }
    }
    Ok(walk.out)
}

/// What lies at an offset of the store.
enum At {
    /// A valid record with a payload of this many bytes.
    Record(usize),
    /// A record cut short, too long or failing its checksum.
    Bad,
    /// The file's end.
    End,
}

/// Bytes read from the store a chunk at a time, kept from `start` on.
struct Source<'r, R> {
    reader: &'r mut R,
    bytes: Vec<u8>,
    /// The file offset of `bytes[0]`.
    start: u64,
    eof: bool,
}

/// Bytes read from the store at a time.
const CHUNK_BYTES: usize = 1 << 20;

impl<R: Read> Source<'_, R> {
    /// The file's bytes `at..at + len`, if it holds them (`at` not before what was forgotten).
    fn get(&mut self, at: u64, len: usize) -> std::io::Result<Option<&[u8]>> {
        let from = (at - self.start) as usize;
        while self.bytes.len() < from + len && !self.eof {
            let old = self.bytes.len();
            self.bytes.resize(old + CHUNK_BYTES, 0);
            let read = read_full(self.reader, &mut self.bytes[old..])?;
            self.bytes.truncate(old + read);
            self.eof = read < CHUNK_BYTES;
        }
        Ok(self.bytes.get(from..from + len))
    }

    /// The file's end (once read to it).
    fn end(&self) -> u64 {
        self.start + self.bytes.len() as u64
    }

    /// Drops the bytes before `at` once they fill a chunk (nothing reads before it again).
    fn forget_before(&mut self, at: u64) {
        let done = (at - self.start) as usize;
        if done >= CHUNK_BYTES {
            self.bytes.drain(..done);
            self.start = at;
        }
    }

    /// What lies at `at`.
    fn record_at(&mut self, at: u64) -> std::io::Result<At> {
        let Some(header) = self.get(at, HEADER_BYTES)? else {
            return Ok(if self.get(at, 1)?.is_none() { At::End } else { At::Bad });
        };
        let len = u32::from_le_bytes(header[0..4].try_into().expect("4 bytes")) as usize;
        if len > PAYLOAD_BYTES_MAX {
            return Ok(At::Bad);
        }
        let Some(record) = self.get(at, HEADER_BYTES + len)? else { return Ok(At::Bad) };
        let crc = u32::from_le_bytes(record[4..8].try_into().expect("4 bytes"));
        match crc32c::crc32c(&record[8..]) == crc {
            true => Ok(At::Record(len)),
            false => Ok(At::Bad),
        }
    }

    /// The first offset from `from` on where a valid record starts, if any.
    fn next_record(&mut self, from: u64) -> std::io::Result<Option<u64>> {
        let mut at = from;
        loop {
            match self.record_at(at)? {
                At::Record(_) => return Ok(Some(at)),
                At::End => return Ok(None),
                At::Bad => at += 1,
            }
        }
    }
}

/// A damage read but not yet proven to lie before the watermark.
#[derive(Clone, Copy, Debug)]
struct Unproven {
    damage: Damage,
    /// Where the batch it interrupted starts: the end of what may be applied while it stands.
    batch_start: u64,
}

/// [`scan`]'s state over the records it walks.
struct Walk<F> {
    apply: F,
    out: Scanned,
    /// Records read and not applied yet, each `[payload_at: u64][header][payload]`: the batch
    /// being read and, behind a damage not yet proven, every batch after it.
    pending: Vec<u8>,
    /// The complete batches in `pending`: where each ends there and in the file.
    boundaries: Vec<(usize, u64)>,
    unproven: Vec<Unproven>,
    /// Where the batch being read starts in the file.
    batch_start: u64,
    /// Whether a batch end has been read (before one, records are applied as read).
    seen_end: bool,
    /// Nothing more is applied (a record was refused, or more was held back than a torn
    /// write can be): only the claims are read on.
    stopped: bool,
}

impl<F: FnMut(Record) -> bool> Walk<F> {
    /// A valid record at `at` (`bytes`: its header and payload).
    fn record(&mut self, at: u64, bytes: &[u8]) {
        let record_end = at + bytes.len() as u64;
        if bytes[8] == kind::BATCH_END {
            let claim = bytes[HEADER_BYTES..].try_into().ok().map_or(0, u64::from_le_bytes);
            // A claim past its own record is not one this store wrote.
            if claim <= at {
                self.out.watermark = self.out.watermark.max(claim);
            }
            if !self.stopped {
                self.seen_end = true;
                self.boundaries.push((self.pending.len(), record_end));
                self.batch_start = record_end;
                self.settle();
            }
            return;
        }
        if self.stopped {
            return;
        }
        let as_read = !self.seen_end && self.unproven.is_empty() && self.pending.is_empty();
        self.pending.extend_from_slice(&(at + HEADER_BYTES as u64).to_le_bytes());
        self.pending.extend_from_slice(bytes);
        if as_read {
            self.boundaries.push((self.pending.len(), record_end));
            self.batch_start = record_end;
            self.settle();
        } else if !self.unproven.is_empty() && self.pending.len() as u64 > TORN_TAIL_BYTES_MAX {
            // Held back behind damage longer than a torn write can be: never a tear. (A batch
            // alone is not bounded here: a compacted file is one batch.)
            self.stop();
        }
    }

    /// Damage read at `damage.from`.
    fn damage(&mut self, damage: Damage) {
        if !self.stopped {
            self.unproven.push(Unproven { damage, batch_start: self.batch_start });
        }
    }

    /// Moves the damages the watermark now proves to [`Scanned::damaged`], then applies the
    /// complete batches no unproven damage holds back.
    fn settle(&mut self) {
        let proven = self.unproven.iter().take_while(|u| u.damage.from < self.out.watermark);
        let proven = proven.count();
        self.out.damaged.extend(self.unproven.drain(..proven).map(|u| u.damage));
        let limit = self.unproven.first().map_or(u64::MAX, |u| u.batch_start);
        let ready = self.boundaries.iter().take_while(|(_, end)| *end <= limit).count();
        let Some(&(bytes, end)) = ready.checked_sub(1).and_then(|last| self.boundaries.get(last))
        else {
            return;
        };
        if let Some(refused_at) = self.apply_pending(bytes) {
            self.out.refused = Some(refused_at);
            self.out.end = refused_at;
            return self.stop();
        }
        self.pending.drain(..bytes);
        self.boundaries.drain(..ready);
        self.boundaries.iter_mut().for_each(|(at, _)| *at -= bytes);
        self.out.end = end;
        self.out.marked |= self.seen_end;
    }

    /// Hands `pending[..bytes]`'s records to `apply`; where the first it refuses starts.
    fn apply_pending(&mut self, bytes: usize) -> Option<u64> {
        let first_damage = self.out.damaged.first().map_or(u64::MAX, |d| d.from);
        let mut at = 0;
        while at < bytes {
            let payload_at = u64::from_le_bytes(self.pending[at..at + 8].try_into().expect("8"));
            let header = &self.pending[at + 8..at + 8 + HEADER_BYTES];
            let len = u32::from_le_bytes(header[0..4].try_into().expect("4 bytes")) as usize;
            let client = u32::from_le_bytes(header[9..13].try_into().expect("4 bytes"));
            let payload = &self.pending[at + 8 + HEADER_BYTES..at + 8 + HEADER_BYTES + len];
            let after_damage = first_damage < payload_at;
            let record = Record { kind: header[8], client, payload, payload_at, after_damage };
            if !(self.apply)(record) {
                return Some(payload_at - HEADER_BYTES as u64);
            }
            at += 8 + HEADER_BYTES + len;
        }
        None
    }

    fn stop(&mut self) {
        self.stopped = true;
        self.pending = Vec::new();
        self.boundaries.clear();
        self.unproven.clear();
    }
}

/// What recovery does with the bytes after the records [`scan`] applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tail {
    /// None: the store ends with its valid records.
    Clean,
    /// A write torn by a crash (never released to any client): cut off this many bytes.
    Torn(u64),
    /// Longer than a torn write can be: damage; the store refuses to open.
    Damaged(u64),
    /// What recovery could not apply starts at `offset`, before the synced end: the records
    /// there were acknowledged, so the store refuses to open rather than cut them.
    Durable {
        /// Where the records recovery could not apply start.
        offset: u64,
        /// Why (a record that does not decode; damage held back past what a tear can be).
        why: &'static str,
    },
}

/// The verdict on a store of `size` bytes that `scanned` read.
pub fn tail(scanned: &Scanned, size: u64) -> Tail {
    let watermark = if CUT_AT_DAMAGE { 0 } else { scanned.watermark };
    if let Some(offset) = scanned.refused.filter(|&offset| offset < watermark) {
        return Tail::Durable { offset, why: "a record before the synced end does not decode" };
    }
    if scanned.end < watermark {
        let why = "damage before the synced end with more after it than a torn write holds";
        return Tail::Durable { offset: scanned.end, why };
    }
    match size.saturating_sub(scanned.end) {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `bytes`' records as [`scan`] hands them on: (kind, payload length), and what it read.
    fn read(bytes: &[u8]) -> (Vec<(u8, usize)>, Scanned) {
        let mut records = Vec::new();
        let scanned = scan(&mut &bytes[..], |record| {
            records.push((record.kind, record.payload.len()));
            true
        })
        .unwrap();
        (records, scanned)
    }

    /// A compacted file is one batch between two batch ends, however large: it is read whole.
    #[test]
    fn a_batch_longer_than_a_torn_write_is_read_whole() {
        let mut bytes = Vec::new();
        end_batch(&mut bytes, 0);
        let payload = vec![7u8; 4096];
        let count = (TORN_TAIL_BYTES_MAX as usize / payload.len()) + 10;
        for _ in 0..count {
            encode_record(&mut bytes, kind::NATIVE_EVENT, 1, &[&payload]);
        }
        let whole = bytes.len() as u64;
        end_batch(&mut bytes, whole);
        let (records, scanned) = read(&bytes);
        assert_eq!(records.len(), count);
        assert_eq!(
            (scanned.end, scanned.watermark, scanned.marked),
            (bytes.len() as u64, whole, true)
        );
        assert_eq!(tail(&scanned, bytes.len() as u64), Tail::Clean);
    }

    /// Three batches; the second's record damaged. The third batch's claim covers it: skipped,
    /// the rest applied. Without that claim it is a torn write: nothing from it on applied.
    #[test]
    fn damage_is_skipped_when_a_later_claim_covers_it_and_cut_when_none_does() {
        let batch = |bytes: &mut Vec<u8>, claim: u64| {
            encode_record(bytes, kind::NATIVE_EVENT, 1, &[b"an event"]);
            end_batch(bytes, claim);
        };
        let mut bytes = Vec::new();
        end_batch(&mut bytes, 0);
        batch(&mut bytes, 0);
        let second = bytes.len();
        batch(&mut bytes, 0);
        let covered = bytes.len() as u64;
        batch(&mut bytes, covered);
        let mut damaged = bytes.clone();
        damaged[second + HEADER_BYTES + 2] ^= 1;
        let (records, scanned) = read(&damaged);
        assert_eq!(records.iter().filter(|r| r.0 == kind::NATIVE_EVENT).count(), 2);
        assert_eq!(scanned.damaged, [Damage { from: second as u64, to: second as u64 + 21 }]);
        assert_eq!(
            (scanned.end, tail(&scanned, bytes.len() as u64)),
            (bytes.len() as u64, Tail::Clean)
        );
        // The same damage with the last batch not claiming it: a torn write from the second on.
        let mut unclaimed = Vec::new();
        end_batch(&mut unclaimed, 0);
        for _ in 0..3 {
            batch(&mut unclaimed, 0);
        }
        unclaimed[second + HEADER_BYTES + 2] ^= 1;
        let (records, scanned) = read(&unclaimed);
        assert_eq!((records.len(), scanned.end), (1, second as u64), "{records:?}");
        let torn = unclaimed.len() - second;
        assert_eq!(tail(&scanned, unclaimed.len() as u64), Tail::Torn(torn as u64));
    }
}
