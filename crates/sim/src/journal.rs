//! An engine's tier journal on a simulated disk: the inputs it applied, framed as the
//! production journal frames them (`journal::frame`) in one segment with the production
//! header and watermark slots, written as the production writer does (frames, `fdatasync`,
//! then the slot of what that sync covered, which rides on the next sync, then the
//! acknowledgement), and recovered through the production scan (`journal::Scan`).

use std::path::{Path, PathBuf};

use exchange::msg::InboundOrder;
use journal::frame::{self, FRAME_HEADER_BYTES};
use journal::segment::{self, SEGMENT_HEADER_BYTES, SLOT_OFFSETS, SegmentInfo};
use journal::watermark::WatermarkFile;
use journal::{JournalError, Scan};

use crate::disk::{PendingSync, SimDisk};
use crate::rng::Rng;

/// Bytes of a record's payload (an input's fields).
const PAYLOAD_BYTES: usize = 32;
/// Bytes of a frame on disk.
const FRAME_BYTES: usize = frame::frame_bytes(PAYLOAD_BYTES);
/// The one segment's first sequence.
const FIRST_SEQ: u64 = 1;

/// What recovery found: the inputs, in order from sequence 1.
#[derive(Debug)]
pub struct Recovered {
    /// The records, sequence `n` at `n - 1`.
    pub orders: Vec<InboundOrder>,
    /// A torn tail was truncated.
    pub torn_tail: bool,
}

/// A sync in flight: its id, the last sequence it covers, what it makes durable.
#[derive(Debug)]
struct Syncing {
    id: u64,
    covers: u64,
    sectors: PendingSync,
}

/// An engine's journal.
#[derive(Debug)]
pub struct EngineJournal {
    /// The disk under it.
    pub disk: SimDisk,
    /// The next sequence to write.
    next_seq: u64,
    /// Applied inputs not written yet (the disk refused them), from `next_seq` on.
    unwritten: Vec<InboundOrder>,
    syncing: Option<Syncing>,
    next_sync: u64,
    next_slot: usize,
    /// The last sequence acknowledged durable (its sync completed).
    pub acked: u64,
}

impl Default for EngineJournal {
    fn default() -> Self {
        EngineJournal::created()
    }
}

impl EngineJournal {
    /// A new, empty journal: the segment's header durable.
    pub fn created() -> EngineJournal {
        EngineJournal {
            disk: SimDisk::created(&segment::header(FIRST_SEQ)),
            next_seq: FIRST_SEQ,
            unwritten: Vec::new(),
            syncing: None,
            next_sync: 0,
            next_slot: 1,
            acked: 0,
        }
    }

    /// The next sequence the journal expects.
    pub fn next_seq(&self) -> u64 {
        self.next_seq + self.unwritten.len() as u64
    }

    /// Queues an applied input ([`EngineJournal::write`] writes the queue, one write per
    /// batch of inputs as the writer thread does).
    pub fn queue(&mut self, order: InboundOrder) {
        self.unwritten.push(order);
    }

    /// Queues an applied input and writes what the disk takes.
    pub fn append(&mut self, order: InboundOrder, now_ns: u64) {
        self.queue(order);
        self.write(now_ns);
    }

    /// Writes the queued inputs' frames (all, or none while the disk is full).
    pub fn write(&mut self, now_ns: u64) {
        if self.unwritten.is_empty() {
            return;
        }
        let mut frames = vec![0u8; self.unwritten.len() * FRAME_BYTES];
        for (at, order) in self.unwritten.iter().enumerate() {
            let frame = &mut frames[at * FRAME_BYTES..(at + 1) * FRAME_BYTES];
            encode(order, &mut frame[FRAME_HEADER_BYTES..]);
            frame::seal(frame, self.next_seq + at as u64);
        }
        if self.disk.write(offset_of(self.next_seq), &frames, now_ns).is_ok() {
            self.next_seq += self.unwritten.len() as u64;
            self.unwritten.clear();
        }
    }

    /// Starts a sync when none is in flight and something written is not acknowledged: its id.
    pub fn begin_sync(&mut self) -> Option<u64> {
        let written = self.next_seq - 1;
        if self.syncing.is_some() || written == self.acked {
            return None;
        }
        self.next_sync += 1;
        let sectors = self.disk.begin_sync();
        self.syncing = Some(Syncing { id: self.next_sync, covers: written, sectors });
        Some(self.next_sync)
    }

    /// Sync `id` completed: its records are durable; the slot saying so is written (it rides
    /// on the next sync) and they are acknowledged. The acknowledged sequence, if it moved.
    pub fn synced(&mut self, id: u64) -> Option<u64> {
        let syncing = self.syncing.take_if(|syncing| syncing.id == id)?;
        self.disk.complete_sync(syncing.sectors);
        let slot = segment::encode_slot(FIRST_SEQ, syncing.covers);
        let offset = SLOT_OFFSETS[self.next_slot] as usize;
        self.disk.write_reserved(offset, &slot);
        self.next_slot ^= 1;
        self.acked = syncing.covers;
        Some(syncing.covers)
    }

    /// A power failure (torn write-back with `tear`): unsynced writes and queued inputs lost.
    pub fn power_loss(&mut self, tear: Option<&mut Rng>) {
        let in_flight = self.syncing.take().map(|syncing| syncing.sectors);
        self.disk.power_loss(in_flight, tear);
        self.unwritten.clear();
    }

    /// A clean stop: the writer drains, syncs, and writes its last slot durably.
    pub fn clean_stop(&mut self, now_ns: u64) {
        self.write(now_ns);
        self.syncing = None;
        let written = self.next_seq - 1;
        let slot = segment::encode_slot(FIRST_SEQ, written);
        let offset = SLOT_OFFSETS[self.next_slot] as usize;
        self.disk.write_reserved(offset, &slot);
        self.next_slot ^= 1;
        self.disk.sync_all();
        self.unwritten.clear();
        self.acked = written;
    }

    /// Recovers through the production scan: the records, or the refusal's reason. A torn
    /// tail is truncated (as production's recovery does) and writing resumes after the last
    /// record.
    pub fn recover(&mut self) -> Result<Recovered, String> {
        let segments = [SegmentInfo { first_seq: FIRST_SEQ, path: segment_path() }];
        let scan = Scan {
            dir: Path::new("sim-journal"),
            segments: &segments,
            watermark_file: Some(WatermarkFile { newest_segment: FIRST_SEQ, durable_seq: 0 }),
            snapshot_seq: None,
            repair: false,
        };
        let mut orders = Vec::new();
        let disk = &self.disk;
        let read = |_: &SegmentInfo| Ok::<&[u8], JournalError>(&disk.cache);
        let validation = scan
            .run(read, |_, payload| orders.push(decode(payload)))
            .map_err(|error| format!("{} ({error})", error.reason()))?;
        let torn_tail = validation.torn_tail.is_some();
        if let Some(torn) = &validation.torn_tail {
            self.disk.zero_from(torn.offset as usize);
        }
        self.next_seq = validation.last_seq + 1;
        self.next_slot = segment::next_slot(&self.disk.cache, FIRST_SEQ);
        self.acked = validation.last_seq;
        Ok(Recovered { orders, torn_tail })
    }

    /// Where the records the durable slots prove durable end (the header's end if none).
    pub fn proven_durable_end(&self) -> usize {
        let proven = segment::read_slots(&self.disk.cache, FIRST_SEQ).unwrap_or(0);
        offset_of(proven + 1).min(self.disk.cache.len())
    }
}

fn segment_path() -> PathBuf {
    segment::segment_path(Path::new("sim-journal"), FIRST_SEQ)
}

/// Where record `seq`'s frame starts (frames are all the same size).
fn offset_of(seq: u64) -> usize {
    SEGMENT_HEADER_BYTES as usize + (seq - FIRST_SEQ) as usize * FRAME_BYTES
}

fn encode(order: &InboundOrder, out: &mut [u8]) {
    out[..4].copy_from_slice(&[order.kind, order.side, order.order_type, order.time_in_force]);
    out[4..8].copy_from_slice(&order.instrument.to_le_bytes());
    out[8..12].copy_from_slice(&order.client.to_le_bytes());
    out[12..20].copy_from_slice(&order.order_id.to_le_bytes());
    out[20..28].copy_from_slice(&order.price.to_le_bytes());
    out[28..32].copy_from_slice(&order.qty.to_le_bytes());
}

fn decode(payload: &[u8]) -> InboundOrder {
    let field = |at: usize, n: usize| &payload[at..at + n];
    InboundOrder {
        kind: payload[0],
        side: payload[1],
        order_type: payload[2],
        time_in_force: payload[3],
        instrument: u32::from_le_bytes(field(4, 4).try_into().expect("4 bytes")),
        client: u32::from_le_bytes(field(8, 4).try_into().expect("4 bytes")),
        order_id: u64::from_le_bytes(field(12, 8).try_into().expect("8 bytes")),
        price: i64::from_le_bytes(field(20, 8).try_into().expect("8 bytes")),
        qty: u32::from_le_bytes(field(28, 4).try_into().expect("4 bytes")),
        ..InboundOrder::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(id: u64) -> InboundOrder {
        InboundOrder {
            kind: 1,
            instrument: 2,
            client: 3,
            order_id: id,
            price: -5,
            qty: 7,
            ..InboundOrder::default()
        }
    }

    #[test]
    fn acknowledged_records_survive_a_power_failure_and_unsynced_ones_do_not() {
        let mut journal = EngineJournal::created();
        for id in 1..=3 {
            journal.append(order(id), 0);
        }
        let sync = journal.begin_sync().expect("records to sync");
        assert_eq!(journal.synced(sync), Some(3));
        journal.append(order(4), 0);
        journal.power_loss(None);
        let recovered = journal.recover().expect("an intact journal");
        assert_eq!(recovered.orders, (1..=3).map(order).collect::<Vec<_>>());
        assert_eq!(journal.next_seq(), 4);
    }

    #[test]
    fn a_full_disk_acknowledges_nothing_until_it_takes_the_writes() {
        let mut journal = EngineJournal::created();
        journal.disk.full_until_ns = 100;
        journal.append(order(1), 50);
        assert_eq!(journal.begin_sync(), None, "nothing written, nothing to sync");
        assert_eq!(journal.acked, 0);
        journal.write(100);
        let sync = journal.begin_sync().expect("written once the disk has room");
        assert_eq!(journal.synced(sync), Some(1));
        assert_eq!(journal.next_seq(), 2);
    }

    #[test]
    fn a_flipped_durable_record_is_refused_not_dropped() {
        let mut journal = EngineJournal::created();
        for round in 0..3 {
            journal.append(order(round), 0);
            let sync = journal.begin_sync().unwrap();
            journal.synced(sync);
        }
        journal.clean_stop(0);
        let mut rng = Rng::new(1);
        journal.disk.flip(offset_of(2) + 20, &mut rng);
        let refused = journal.recover().expect_err("a corrupt durable record");
        assert!(refused.starts_with("corrupt"), "{refused}");
    }
}
