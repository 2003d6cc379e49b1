//! Shard snapshots taken by a follower, so the core never pauses for them.
//!
//! A follower thread per shard keeps a replica of the shard's state: it reads the journal's
//! records as soon as the writer has made them durable and applies them to its own
//! [`ShardState`] (the core is a pure function of its sequenced input, so the replica at
//! sequence `s` equals the core at `s`). Every `every_records` records it serialises the
//! replica, writes the snapshot atomically and removes the segments it makes unnecessary
//! (`journal::snapshot::{write, prune}`).
//!
//! Why a follower rather than serialising on the core's thread: the serialisation walks every
//! resting order (pointer chasing through the order pool), measured at 30-200 ns per order
//! here, so a core holding 70 000 resting orders would stop for 2-15 ms per snapshot: no
//! bound that matters to a low-latency path survives a book that size. Copy-on-write
//! (persistent books, or `fork`) would tax every mutation, or fault pages in under the core,
//! instead. The follower costs the core nothing (no code on its thread, no extra ring push)
//! and moves the work to an ancillary thread: the replica's matching plus the read (measured
//! 1.8-2.8 µs per record, spread evenly because it follows continuously) and a second copy of
//! the shard's memory.
//!
//! Reading while the writer appends: a frame at or below the durable sequence was written and
//! fdatasynced before the writer published that sequence (Acquire/Release through
//! `DurableSeq`), so it is complete in the page cache; the follower never reads past it. When
//! a segment's data ends (its pre-allocated zeros), the next record is in the segment named
//! after it, which the writer created before writing into it.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use journal::frame::{Decoded, decode, frame_bytes};
use journal::reader::EndPosition;
use journal::segment::{SEGMENT_HEADER_BYTES, segment_path};
use journal::{DurableSeq, Record, StateMachine, snapshot};
use pipeline::metrics::now_ns;
use pipeline::placement::{CpuId, PinnableThread, PlacementError, pin_thread};

use super::{ShardRecord, ShardState};

/// Bytes the follower reads from a segment per `pread`.
pub const FOLLOW_CHUNK_BYTES: usize = 64 * 1024;
/// How long the follower sleeps when it has caught up with the durable sequence.
pub const FOLLOW_POLL: Duration = Duration::from_millis(1);
const RECORD_FRAME_BYTES: usize = frame_bytes(ShardRecord::PAYLOAD_BYTES);

/// Reads a journal's records in order up to a durable sequence, while the writer appends.
struct JournalFollower {
    dir: PathBuf,
    next_seq: u64,
    /// The segment being read and the file offset of `chunk[0]`.
    segment: Option<(File, PathBuf, u64)>,
    chunk: Vec<u8>,
    chunk_len: usize,
    /// Read position in `chunk`.
    at: usize,
}

impl JournalFollower {
    /// Starts at `next_seq`, which the writer appends at `resume` (`None`: in a new segment).
    fn new(dir: PathBuf, next_seq: u64, resume: Option<EndPosition>) -> Result<Self, String> {
        let segment = match resume {
            Some(end) => {
                let file = File::open(&end.file)
                    .map_err(|e| format!("opening {}: {e}", end.file.display()))?;
                Some((file, end.file, end.offset))
            }
            None => None,
        };
        let chunk = vec![0; FOLLOW_CHUNK_BYTES];
        Ok(JournalFollower { dir, next_seq, segment, chunk, chunk_len: 0, at: 0 })
    }

    /// Applies every record from `next_seq` up to `durable_seq` to `state`; returns how many.
    fn follow(&mut self, durable_seq: u64, state: &mut ShardState) -> Result<u64, String> {
        let mut applied = 0;
        // Whether the chunk was read after `durable_seq` was: bytes read earlier may predate
        // the writer's latest frames (zeros, or a frame half written at the time).
        let mut fresh = false;
        while self.next_seq <= durable_seq {
            if self.chunk_len - self.at < RECORD_FRAME_BYTES {
                fresh = self.refill()?;
                if !fresh {
                    self.next_segment()?;
                }
                continue;
            }
            match decode(&self.chunk[self.at..self.chunk_len]) {
                Decoded::Valid { seq, payload, frame_bytes } if seq == self.next_seq => {
                    state.apply(seq, payload);
                    self.at += frame_bytes;
                    self.next_seq += 1;
                    applied += 1;
                }
                _ if !fresh => fresh = self.refill()?,
                // Freshly read and still no frame: the writer rolled to the next segment.
                Decoded::End => self.next_segment()?,
                _ => return Err(self.unexpected()),
            }
        }
        Ok(applied)
    }

    /// Reads the next chunk of the current segment; `false` when fewer than a frame's bytes
    /// are left in it (the writer rolled to the next segment).
    fn refill(&mut self) -> Result<bool, String> {
        let Some((file, path, offset)) = &mut self.segment else {
            return Ok(false);
        };
        *offset += self.at as u64;
        self.at = 0;
        self.chunk_len = 0;
        while self.chunk_len < FOLLOW_CHUNK_BYTES {
            let read = file
                .read_at(&mut self.chunk[self.chunk_len..], *offset + self.chunk_len as u64)
                .map_err(|e| format!("reading {}: {e}", path.display()))?;
            if read == 0 {
                break;
            }
            self.chunk_len += read;
        }
        Ok(self.chunk_len >= RECORD_FRAME_BYTES)
    }

    /// Moves to the segment that starts with `next_seq`.
    fn next_segment(&mut self) -> Result<(), String> {
        let path = segment_path(&self.dir, self.next_seq);
        if self.segment.as_ref().is_some_and(|(_, current, _)| *current == path) {
            return Err(self.unexpected());
        }
        let file = File::open(&path).map_err(|e| {
            format!(
                "record {} is durable but {} cannot be opened: {e}",
                self.next_seq,
                path.display()
            )
        })?;
        self.segment = Some((file, path, SEGMENT_HEADER_BYTES));
        (self.chunk_len, self.at) = (0, 0);
        Ok(())
    }

    fn unexpected(&self) -> String {
        let file = self.segment.as_ref().map(|(_, path, _)| path.display().to_string());
        format!("durable record {} is not where the follower expects it ({file:?})", self.next_seq)
    }
}

/// What one shard's snapshot follower did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SnapshotReport {
    pub every_records: u64,
    pub taken: u64,
    /// Records the replica applied.
    pub records_followed: u64,
    /// Mean time to read and apply one record on the follower thread, ns.
    pub follow_ns_per_record: u64,
    /// Longest time to serialise, write, fsync and rename one snapshot (off the core), ns.
    pub write_ns_max: u64,
    /// Resting orders in the largest snapshot.
    pub resting_orders_max: u32,
}

/// One shard's snapshot follower thread.
pub struct ShardSnapshotter {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Result<SnapshotReport, String>>,
    pinnable: PinnableThread,
}

impl ShardSnapshotter {
    /// Starts following the journal in `dir` from `next_seq` (appended at `resume`) with
    /// `replica` (a copy of the recovered state), snapshotting every `every_records` records.
    pub fn spawn(
        dir: PathBuf,
        durable: Arc<DurableSeq>,
        replica: ShardState,
        next_seq: u64,
        resume: Option<EndPosition>,
        every_records: u64,
    ) -> Result<ShardSnapshotter, String> {
        assert!(every_records > 0);
        let follower = JournalFollower::new(dir.clone(), next_seq, resume)?;
        let stop = Arc::new(AtomicBool::new(false));
        let task = FollowTask {
            dir,
            durable,
            replica,
            follower,
            every_records,
            stop: stop.clone(),
            report: SnapshotReport { every_records, ..SnapshotReport::default() },
        };
        let pinnable = PinnableThread::default();
        let recorder = pinnable.clone();
        let thread = std::thread::Builder::new()
            .name("shard-snapshots".into())
            .spawn(move || {
                recorder.record_current();
                task.run()
            })
            .map_err(|e| format!("spawning the snapshot follower: {e}"))?;
        Ok(ShardSnapshotter { stop, thread, pinnable })
    }

    /// Restricts the follower thread to `cpus` (off a tier's spinning threads' CPUs: it
    /// replays every durable record).
    pub fn pin_to(&self, cpus: &[CpuId]) -> Result<(), PlacementError> {
        pin_thread(&self.pinnable, cpus)
    }

    /// Catches up with the final durable sequence (call after the journal writer stopped),
    /// takes the snapshots due, and stops.
    pub fn finish(self) -> Result<SnapshotReport, String> {
        // Release: pairs with the follower's Acquire load; nothing else is published by it.
        self.stop.store(true, Ordering::Release);
        match self.thread.join() {
            Ok(result) => result,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

struct FollowTask {
    dir: PathBuf,
    durable: Arc<DurableSeq>,
    replica: ShardState,
    follower: JournalFollower,
    every_records: u64,
    stop: Arc<AtomicBool>,
    report: SnapshotReport,
}

impl FollowTask {
    fn run(mut self) -> Result<SnapshotReport, String> {
        let mut buffer = Vec::with_capacity(self.replica.snapshot_bytes_max());
        let mut follow_ns = 0;
        loop {
            // Read the flag before the durable sequence: once stopped, the writer has
            // published its last sequence, so this pass reaches the end.
            let stopping = self.stop.load(Ordering::Acquire);
            if self.durable.has_failed() {
                return Err("the journal writer failed; no further snapshots".into());
            }
            let durable_seq = self.durable.get();
            let next_snapshot = self.follower.next_seq.next_multiple_of(self.every_records);
            let started_ns = now_ns();
            let applied =
                self.follower.follow(durable_seq.min(next_snapshot), &mut self.replica)?;
            follow_ns += now_ns().saturating_sub(started_ns);
            self.report.records_followed += applied;
            if self.follower.next_seq == next_snapshot + 1 {
                self.snapshot(next_snapshot, &mut buffer)?;
            } else if stopping && self.follower.next_seq > durable_seq {
                break;
            } else if applied == 0 {
                std::thread::sleep(FOLLOW_POLL);
            }
        }
        self.report.follow_ns_per_record = follow_ns / self.report.records_followed.max(1);
        Ok(self.report)
    }

    fn snapshot(&mut self, seq: u64, buffer: &mut Vec<u8>) -> Result<(), String> {
        let started_ns = now_ns();
        buffer.clear();
        self.replica.write_snapshot(buffer);
        let state_hash = self.replica.state_hash();
        snapshot::write(&self.dir, seq, state_hash, buffer).map_err(|e| e.to_string())?;
        snapshot::prune(&self.dir).map_err(|e| e.to_string())?;
        let report = &mut self.report;
        report.taken += 1;
        report.write_ns_max = report.write_ns_max.max(now_ns().saturating_sub(started_ns));
        report.resting_orders_max =
            report.resting_orders_max.max(self.replica.core.resting_orders());
        Ok(())
    }
}
