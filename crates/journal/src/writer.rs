//! The writer thread: drains its ring in batches, one `write` + one `fdatasync` per batch
//! (group commit), then publishes the durable sequence number.
//!
//! Steady state per batch: the ring read (no syscall), encoding into a buffer allocated once
//! at start-up, one `pwrite` and one `fdatasync`. The larger the backlog while a sync is in
//! flight, the larger the next batch: group commit amortises the sync over every record that
//! arrived during the previous one, which is how a ~1 ms disk sync still carries > 1M
//! records/s.
//!
//! Failure: any I/O error stops the writer for good, marks [`DurableSeq::has_failed`] and is
//! returned by [`JournalWriter::join`]. The durable sequence never moves past the last
//! successful sync, so no reply is released for data that may not be on disk. A failed
//! `fdatasync` is never retried: after one, Linux may have dropped the dirty pages, so a
//! retry could "succeed" over lost data.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pipeline::placement::{CpuId, PinnableThread, PlacementError, pin_thread};
use pipeline::{ConnectorKind, Receiver, RingConfig, Sender};

use crate::durable::DurableSeq;
use crate::error::{JournalError, io_context};
use crate::frame::{self, FRAME_HEADER_BYTES, PAYLOAD_BYTES_MAX};
use crate::reader::EndPosition;
use crate::record::Record;
use crate::segment::{self, SEGMENT_BYTES_DEFAULT, SEGMENT_BYTES_MIN, SEGMENT_HEADER_BYTES};
use crate::watermark::{WatermarkFile, WatermarkStore};

/// Default bound on records per write (and per sync).
pub const BATCH_RECORDS_MAX_DEFAULT: usize = 8192;
/// Upper bound on the batch buffer, whatever the record size.
pub const BATCH_BYTES_MAX: usize = 16 * 1024 * 1024;
/// Default flush period of the `relaxed` policy: its loss window on power failure.
pub const RELAXED_FLUSH_INTERVAL_US_DEFAULT: u64 = 10_000;
/// How long a `relaxed` writer with unsynced data sleeps between polls of its ring.
const RELAXED_IDLE_SLEEP: Duration = Duration::from_micros(100);

/// When a reply may be released relative to the fsync of its input.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// The core waits for the fsync of each record before going on: I/O on the critical path.
    Sync,
    /// The journal runs beside the core; replies wait until the durable sequence covers them.
    #[default]
    Group,
    /// Replies are not held; the writer syncs every `relaxed_flush_interval_us`. A power loss
    /// (not a process crash: written data is in the page cache) loses up to that window.
    Relaxed,
}

impl Policy {
    /// Every policy.
    pub const ALL: [Policy; 3] = [Policy::Sync, Policy::Group, Policy::Relaxed];

    /// The name used in flags and config files.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Sync => "sync",
            Policy::Group => "group",
            Policy::Relaxed => "relaxed",
        }
    }
}

/// How often the writer notes the durable sequence in the watermark file (an unsynced slot
/// write, off the sync path's critical order: after the publish).
pub const WATERMARK_NOTE_INTERVAL: Duration = Duration::from_secs(1);

/// How the journal writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JournalConfig {
    /// When a record counts as durable (see [`Policy`]).
    pub policy: Policy,
    /// Size of each pre-allocated segment file.
    pub segment_bytes: u64,
    /// Most records in one write + sync.
    pub batch_records_max: usize,
    /// `relaxed` only: time between syncs.
    pub relaxed_flush_interval_us: u64,
    /// The ring between the core and the writer (its size bounds the core's run-ahead).
    pub ring: RingConfig,
    /// Lock-free ring (default) or the mutex + condvar baseline, for experiments.
    pub connector: ConnectorKind,
}

impl Default for JournalConfig {
    fn default() -> Self {
        JournalConfig {
            policy: Policy::Group,
            segment_bytes: SEGMENT_BYTES_DEFAULT,
            batch_records_max: BATCH_RECORDS_MAX_DEFAULT,
            relaxed_flush_interval_us: RELAXED_FLUSH_INTERVAL_US_DEFAULT,
            ring: RingConfig {
                capacity_slots: 16_384,
                batch_slots_max: 4096,
                ..RingConfig::default()
            },
            connector: ConnectorKind::LockFree,
        }
    }
}

impl JournalConfig {
    fn validate(&self, payload_bytes: usize) -> Result<(), JournalError> {
        let bad = |reason: String| Err(JournalError::BadConfig(reason));
        let frame_len = frame::frame_bytes(payload_bytes);
        if payload_bytes == 0 || payload_bytes > PAYLOAD_BYTES_MAX {
            return bad(format!(
                "record payload of {payload_bytes} bytes (1..={PAYLOAD_BYTES_MAX})"
            ));
        }
        if self.segment_bytes < SEGMENT_BYTES_MIN.max(SEGMENT_HEADER_BYTES + frame_len as u64) {
            return bad(format!(
                "segment_bytes {} is below the minimum {SEGMENT_BYTES_MIN}",
                self.segment_bytes
            ));
        }
        if self.batch_records_max == 0 || self.batch_records_max * frame_len > BATCH_BYTES_MAX {
            return bad(format!(
                "batch_records_max {} must be >= 1 and keep a batch under {BATCH_BYTES_MAX} bytes",
                self.batch_records_max
            ));
        }
        if self.policy == Policy::Relaxed && self.relaxed_flush_interval_us == 0 {
            return bad("relaxed_flush_interval_us must be > 0".into());
        }
        self.ring.validate().map_err(|e| JournalError::BadConfig(e.to_string()))
    }
}

/// Where a writer starts: the directory, the first sequence it will write, and the segment to
/// append to (`None`: start a new one). Produced by [`crate::recover`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tail {
    /// The journal directory.
    pub dir: PathBuf,
    /// The sequence the next record must carry.
    pub next_seq: u64,
    /// The segment to append to and where its valid records end; `None`: start a new one.
    pub open_segment: Option<EndPosition>,
}

/// The writer's steady-state I/O calls, behind a trait so tests can inject the errors of a
/// full disk or a failing device into a real writer over real files.
pub trait SegmentIo: Send + 'static {
    /// Writes all of `bytes` at `offset`.
    fn write_at(&mut self, file: &File, bytes: &[u8], offset: u64) -> io::Result<()>;
    /// Makes what was written durable (`fdatasync`).
    fn sync_data(&mut self, file: &File) -> io::Result<()>;
    /// Writes a durable-watermark slot ([`crate::watermark`]) after a successful sync.
    fn write_slot(&mut self, file: &File, slot: &[u8], offset: u64) -> io::Result<()> {
        segment::write_all_at(file, slot, offset)
    }
}

/// The real thing: `pwrite` and `fdatasync`.
pub struct FileIo;

impl SegmentIo for FileIo {
    fn write_at(&mut self, file: &File, bytes: &[u8], offset: u64) -> io::Result<()> {
        segment::write_all_at(file, bytes, offset)
    }

    fn sync_data(&mut self, file: &File) -> io::Result<()> {
        file.sync_data()
    }
}

/// What a writer did, returned by [`JournalWriter::join`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct WriterStats {
    /// Records written.
    pub records: u64,
    /// Batches (group commits) written.
    pub batches: u64,
    /// `fdatasync` calls made.
    pub syncs: u64,
    /// Bytes written, frames and headers.
    pub bytes_written: u64,
    /// Segment files created.
    pub segments_created: u64,
}

/// The core's end: appends records, waiting for durability under the `sync` policy.
pub struct JournalSender<R: Record> {
    tx: Sender<R>,
    policy: Policy,
    durable: Arc<DurableSeq>,
    wait: pipeline::WaitStrategy,
}

impl<R: Record> JournalSender<R> {
    /// Hands `record` to the writer (waiting while the ring is full: back-pressure). Under
    /// `sync`, also waits until it is on disk.
    #[inline]
    pub fn append(&mut self, record: R) -> Result<(), JournalError> {
        self.tx.push(record).map_err(|_| JournalError::WriterStopped)?;
        if self.policy == Policy::Sync {
            self.durable.wait_for(record.seq(), self.wait)?;
        }
        Ok(())
    }

    /// The durable sequence this sender's records are covered by (for `sync`-style waits).
    pub fn durable(&self) -> &Arc<DurableSeq> {
        &self.durable
    }
}

/// The running writer thread.
pub struct JournalWriter {
    durable: Arc<DurableSeq>,
    thread: JoinHandle<Result<WriterStats, JournalError>>,
    pinnable: PinnableThread,
}

impl JournalWriter {
    /// Starts a writer at `tail` with real file I/O.
    pub fn spawn<R: Record>(
        tail: Tail,
        config: &JournalConfig,
    ) -> Result<(JournalSender<R>, JournalWriter), JournalError> {
        Self::spawn_with_io(tail, config, FileIo)
    }

    /// Starts a writer whose writes and syncs go through `io` (fault-injection tests).
    pub fn spawn_with_io<R: Record, I: SegmentIo>(
        tail: Tail,
        config: &JournalConfig,
        io: I,
    ) -> Result<(JournalSender<R>, JournalWriter), JournalError> {
        config.validate(R::PAYLOAD_BYTES)?;
        assert!(tail.next_seq >= 1, "sequence numbers start at 1");
        let durable = DurableSeq::new(tail.next_seq - 1);
        let active = ActiveSegment::open(&tail, config.segment_bytes)?;
        // Before any record: the file names the segment being appended to and everything the
        // journal holds so far (recovery validated it), so deleting that segment is detected.
        let mut watermarks = WatermarkStore::open(&tail.dir)?;
        watermarks.write(&WatermarkFile {
            newest_segment: active.first_seq,
            durable_seq: tail.next_seq - 1,
        })?;
        let (tx, rx) = pipeline::connector::<R>(config.connector, &config.ring)
            .map_err(|e| JournalError::BadConfig(e.to_string()))?;
        let frame_len = frame::frame_bytes(R::PAYLOAD_BYTES);
        let state = WriterLoop {
            rx,
            io,
            dir: tail.dir,
            config: *config,
            active,
            watermarks,
            next_seq: tail.next_seq,
            synced_seq: tail.next_seq - 1,
            last_sync: Instant::now(),
            watermark_noted: Instant::now(),
            batch: vec![0u8; config.batch_records_max * frame_len],
            frame_len,
            durable: Arc::clone(&durable),
            stats: WriterStats::default(),
        };
        let pinnable = PinnableThread::default();
        let recorder = pinnable.clone();
        let thread = std::thread::Builder::new()
            .name("journal-writer".into())
            .spawn(move || {
                recorder.record_current();
                state.run()
            })
            .map_err(io_context("spawning the journal writer thread".into()))?;
        let sender = JournalSender {
            tx,
            policy: config.policy,
            durable: Arc::clone(&durable),
            wait: config.ring.wait,
        };
        Ok((sender, JournalWriter { durable, thread, pinnable }))
    }

    /// The highest sequence made durable, for the response side to release replies by.
    pub fn durable(&self) -> Arc<DurableSeq> {
        Arc::clone(&self.durable)
    }

    /// Restricts the writer thread to `cpus` (a tier keeps it off its spinning threads' CPUs:
    /// every group commit wakes it).
    pub fn pin_to(&self, cpus: &[CpuId]) -> Result<(), PlacementError> {
        pin_thread(&self.pinnable, cpus)
    }

    /// Waits for the writer to drain and sync everything (drop the sender first) and returns
    /// its statistics, or the error that stopped it.
    pub fn join(self) -> Result<WriterStats, JournalError> {
        match self.thread.join() {
            Ok(result) => result,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

/// The segment being appended to.
struct ActiveSegment {
    file: Option<File>,
    /// Its first sequence (0: none open).
    first_seq: u64,
    offset: u64,
    capacity: u64,
    /// The watermark slot the next sync writes (alternating).
    next_slot: usize,
    /// A slot was written after the segment's last sync.
    slot_unsynced: bool,
}

impl ActiveSegment {
    fn none(segment_bytes: u64) -> ActiveSegment {
        ActiveSegment {
            file: None,
            first_seq: 0,
            offset: 0,
            capacity: segment_bytes,
            next_slot: 0,
            slot_unsynced: false,
        }
    }

    /// A new segment, whose header holds slot 0 (see [`segment::create`]).
    fn created(file: File, first_seq: u64, segment_bytes: u64) -> ActiveSegment {
        ActiveSegment {
            file: Some(file),
            first_seq,
            offset: SEGMENT_HEADER_BYTES,
            capacity: segment_bytes,
            next_slot: 1,
            slot_unsynced: false,
        }
    }

    fn open(tail: &Tail, segment_bytes: u64) -> Result<ActiveSegment, JournalError> {
        let Some(end) = &tail.open_segment else {
            return Ok(ActiveSegment::none(segment_bytes));
        };
        let context = || format!("opening segment {} for append", end.file.display());
        let first_seq = segment::first_seq_of(&end.file).ok_or_else(|| {
            JournalError::BadConfig(format!("{} is not a segment name", end.file.display()))
        })?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&end.file)
            .map_err(io_context(context()))?;
        let capacity = file.metadata().map_err(io_context(context()))?.len();
        let mut header = [0u8; SEGMENT_HEADER_BYTES as usize];
        std::os::unix::fs::FileExt::read_exact_at(&file, &mut header, 0)
            .map_err(io_context(context()))?;
        // Recovery may have replayed records that reached only the page cache before a crash;
        // sync them before the durable sequence starts out claiming them.
        file.sync_data().map_err(io_context(context()))?;
        let next_slot = segment::next_slot(&header, first_seq);
        Ok(ActiveSegment {
            file: Some(file),
            first_seq,
            offset: end.offset,
            capacity,
            next_slot,
            slot_unsynced: false,
        })
    }

    fn room_records(&self, frame_len: usize) -> usize {
        match self.file {
            Some(_) => (self.capacity.saturating_sub(self.offset) / frame_len as u64) as usize,
            None => 0,
        }
    }
}

struct WriterLoop<R: Record, I: SegmentIo> {
    rx: Receiver<R>,
    io: I,
    dir: PathBuf,
    config: JournalConfig,
    active: ActiveSegment,
    watermarks: WatermarkStore,
    /// Sequence the next record must carry.
    next_seq: u64,
    /// Last sequence covered by a successful sync.
    synced_seq: u64,
    last_sync: Instant,
    /// When the watermark file last got the durable sequence.
    watermark_noted: Instant,
    batch: Vec<u8>,
    frame_len: usize,
    durable: Arc<DurableSeq>,
    stats: WriterStats,
}

impl<R: Record, I: SegmentIo> WriterLoop<R, I> {
    fn run(mut self) -> Result<WriterStats, JournalError> {
        // A panic must not leave a `sync` core or a reply thread waiting forever.
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.run_until_disconnected()
        }));
        if !matches!(outcome, Ok(Ok(()))) {
            self.durable.mark_failed();
        }
        match outcome {
            Ok(result) => result.map(|()| self.stats),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }

    fn run_until_disconnected(&mut self) -> Result<(), JournalError> {
        while let Some(records) = self.collect_batch()? {
            self.write_batch(records)?;
            let flush_due = match self.config.policy {
                Policy::Sync | Policy::Group => true,
                Policy::Relaxed => self.relaxed_flush_due(),
            };
            if flush_due {
                self.sync()?;
            }
        }
        self.sync()?;
        self.shut_down()
    }

    /// A clean shutdown leaves an exact watermark: the last slot synced and the file updated.
    fn shut_down(&mut self) -> Result<(), JournalError> {
        if self.active.slot_unsynced {
            let file = self.active.file.as_ref().expect("a slot was written to an open segment");
            self.io
                .sync_data(file)
                .map_err(io_context("fdatasync of the watermark slot at shutdown".into()))?;
            self.active.slot_unsynced = false;
        }
        let newest_segment = self.active.first_seq;
        self.watermarks.write(&WatermarkFile { newest_segment, durable_seq: self.synced_seq })
    }

    fn relaxed_flush_due(&self) -> bool {
        self.last_sync.elapsed() >= Duration::from_micros(self.config.relaxed_flush_interval_us)
    }

    /// Encodes the next batch into `self.batch`; `None` once the core hung up and the ring is
    /// drained. Group commit: waits for one record, then takes everything else available.
    fn collect_batch(&mut self) -> Result<Option<usize>, JournalError> {
        let room = self.room_records()?;
        let idle_with_unsynced =
            self.config.policy == Policy::Relaxed && self.synced_seq + 1 < self.next_seq;
        let frame_len = self.frame_len;
        // A Cell, because the loop below reads the count while `encode` holds its borrow.
        let filled = std::cell::Cell::new(0usize);
        let mut expected = self.next_seq;
        let mut out_of_sequence = None;
        let batch = &mut self.batch;
        let mut encode = |record: &R| {
            let index = filled.get();
            let frame = &mut batch[index * frame_len..(index + 1) * frame_len];
            record.encode(&mut frame[FRAME_HEADER_BYTES..]);
            frame::seal(frame, record.seq());
            if record.seq() != expected && out_of_sequence.is_none() {
                out_of_sequence = Some(JournalError::OutOfSequence { expected, got: record.seq() });
            }
            expected += 1;
            filled.set(index + 1);
        };
        if self.rx.read_batch(room, &mut encode) == 0 {
            if idle_with_unsynced {
                return self.relaxed_idle().map(|()| Some(0));
            }
            if self.rx.wait_read_batch(room, &mut encode).is_err() {
                return Ok(None);
            }
        }
        while filled.get() < room && self.rx.read_batch(room - filled.get(), &mut encode) > 0 {}
        if let Some(error) = out_of_sequence {
            return Err(error);
        }
        Ok(Some(filled.get()))
    }

    /// `relaxed` with nothing to read but unsynced data: sync when due, else nap briefly
    /// (blocking in the ring's wait would postpone the timed flush indefinitely).
    fn relaxed_idle(&mut self) -> Result<(), JournalError> {
        if self.relaxed_flush_due() || self.rx.is_disconnected() {
            return self.sync();
        }
        std::thread::sleep(RELAXED_IDLE_SLEEP);
        Ok(())
    }

    /// Records that fit in the active segment and the batch, rolling to a new segment first
    /// when not even one fits.
    fn room_records(&mut self) -> Result<usize, JournalError> {
        let mut room = self.active.room_records(self.frame_len);
        if room == 0 {
            self.roll()?;
            room = self.active.room_records(self.frame_len);
            assert!(room > 0, "a fresh segment holds at least one frame (checked by validate)");
        }
        Ok(room.min(self.config.batch_records_max))
    }

    /// Starts the next segment. The watermark file names it before any record goes into it,
    /// so its deletion is detected even though its own slots go with it (one more fsync per
    /// segment, not per batch).
    fn roll(&mut self) -> Result<(), JournalError> {
        self.sync()?;
        let first_seq = self.next_seq;
        let file = segment::create(&self.dir, first_seq, self.config.segment_bytes)?;
        self.active = ActiveSegment::created(file, first_seq, self.config.segment_bytes);
        let watermark = WatermarkFile { newest_segment: first_seq, durable_seq: self.synced_seq };
        self.watermarks.write(&watermark)?;
        self.stats.segments_created += 1;
        Ok(())
    }

    fn write_batch(&mut self, records: usize) -> Result<(), JournalError> {
        if records == 0 {
            return Ok(());
        }
        let bytes = &self.batch[..records * self.frame_len];
        let file = self.active.file.as_ref().expect("room_records opened a segment");
        let offset = self.active.offset;
        self.io.write_at(file, bytes, offset).map_err(io_context(format!(
            "writing {} records at sequence {}",
            records, self.next_seq
        )))?;
        self.active.offset += bytes.len() as u64;
        self.next_seq += records as u64;
        self.stats.records += records as u64;
        self.stats.batches += 1;
        self.stats.bytes_written += bytes.len() as u64;
        Ok(())
    }

    /// fdatasync, record the durable watermark, then publish: from here on, replies up to
    /// `next_seq - 1` may be released. The slot is written after the sync (so it never claims
    /// data that is not durable) and before the publish (so every released reply is covered by
    /// a slot that survives a process crash); it reaches the disk with the next sync.
    fn sync(&mut self) -> Result<(), JournalError> {
        let written_seq = self.next_seq - 1;
        if written_seq == self.synced_seq {
            return Ok(());
        }
        let file = self.active.file.as_ref().expect("data was written to an open segment");
        self.io
            .sync_data(file)
            .map_err(io_context(format!("fdatasync of records up to sequence {written_seq}")))?;
        let slot = segment::encode_slot(self.active.first_seq, written_seq);
        let slot_offset = segment::SLOT_OFFSETS[self.active.next_slot];
        self.io
            .write_slot(file, &slot, slot_offset)
            .map_err(io_context(format!("writing the durable watermark {written_seq}")))?;
        self.active.next_slot ^= 1;
        self.active.slot_unsynced = true;
        self.synced_seq = written_seq;
        self.last_sync = Instant::now();
        self.stats.syncs += 1;
        self.durable.publish(written_seq);
        self.note_watermark(written_seq);
        Ok(())
    }

    /// Once per [`WATERMARK_NOTE_INTERVAL`], the durable sequence into the watermark file
    /// (no sync of its own: see [`WatermarkStore::note`]). A failure is logged, not fatal: the
    /// records are durable and the segment's slots say so.
    fn note_watermark(&mut self, durable_seq: u64) {
        if self.watermark_noted.elapsed() < WATERMARK_NOTE_INTERVAL {
            return;
        }
        self.watermark_noted = Instant::now();
        let watermark = WatermarkFile { newest_segment: self.active.first_seq, durable_seq };
        if let Err(error) = self.watermarks.note(&watermark) {
            tracing::warn!(%error, "journal: noting the durable watermark in its file");
        }
    }
}
