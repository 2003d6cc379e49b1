//! The gateway's durable store: one append-only file (`gateway.store` in the store directory)
//! with every session's sequenced output — FIX messages sent and inbound sequence numbers, the
//! native protocol's sequenced events — so that a restarted server resends (FIX) or replays
//! (native) what a client missed, under the sequence numbers the client already saw.
//!
//! # Group commit, and the order of disk and socket
//!
//! Sessions append records to an in-memory batch ([`Log::append`]) and queue the bytes for
//! the client as *held* on its link ([`Log::hold`]). At the end of each unit of work on the I/O
//! thread (a batch of engine reports routed, one read from a connection, a timer)
//! [`Log::commit`] writes the whole batch with one `write` and asks the syncer thread for one
//! `fdatasync`; the held bytes are released to the connections only when that sync is done
//! ([`Log::release`]). So a client never sees a sequence number the store could forget, and a
//! restart never reuses one: the FIX session resumes without a sequence-number lock-out and
//! the native session replays exactly what it sent. The sync runs on its own thread, so the I/O
//! thread goes on reading and routing while the disk works, and every record that arrives during
//! one sync rides on the next (the batch grows with the load and the sync cost is shared).
//! With `store_sync` off the batch is written (it survives a killed process, not a power
//! failure) and released at once.
//!
//! # One wait for two disks
//!
//! An execution report is sent only once both its store record and the tier's journal record
//! of the order that caused it are on disk. Rather than the tier holding the report until its
//! journal fsync and the store then running its own (two fsyncs in series), the syncer takes
//! over the tier's reply hold ([`Log::wait_for_journals`]): each batch carries, per journal
//! shard, the highest input sequence its reports answer ([`Log::require`]), and the syncer
//! publishes the batch as durable only once its own `fdatasync` returned *and* each shard's
//! durable sequence covers that need (a second thread waits for the journals, so the syncer's
//! next `fdatasync` never waits for them). The two fsyncs overlap; a report waits for the
//! slower.
//!
//! The journal crate does not fit here: it stores fixed-size records with consecutive
//! sequence numbers of one stream, while this store interleaves variable-size FIX messages and
//! native events of many sessions, each numbered by its own session.
//!
//! # On disk
//!
//! Records `[payload_bytes: u32][crc32c: u32][kind: u8][client: u32][payload]`, little-endian;
//! the checksum covers kind, client and payload. Each batch ends with a [`kind::BATCH_END`]
//! record, written last in its `write`, and recovery applies a batch's records only once it
//! reads that end (`record::scan`): a power failure can write back some sectors of a batch and
//! not others (its reports, say, without the routed position after them), and such a batch is
//! dropped whole, so a restarted gateway never keeps reports without their position and routes
//! them again.
//!
//! # The durable watermark: damage or a torn write
//!
//! A bad record (cut short, failing its checksum) is either a write torn by a crash (never
//! released to any client, since release waits for the sync: it may be cut) or damage to
//! bytes that were synced (acknowledged: they may not be cut). Recovery tells them apart by
//! the store's durable end: each batch end carries a claim, `[synced_end: u64]`, the file's
//! end as of the newest `fdatasync` that had returned when the batch was written
//! ([`Log::commit`] takes it from the syncer's published epoch). The claim rides on its own
//! batch's write and sync, so it costs 8 bytes per batch and no I/O of its own (the journal's
//! watermark slots ride on the next sync the same way, `journal::watermark`); a claim never
//! names a byte that was not durable, and recovery's watermark is the highest valid claim in
//! the file, wherever it lies (`record::scan` reads past damage to find the claims after it).
//! Two slots in a header, as the journal has, would need a header this file never had (every
//! existing store would need rewriting) and an `fdatasync` of their own or a write in place
//! beside an `O_APPEND` file; a claim in the record stream needs neither.
//!
//! - Damage before the watermark is skipped: the scan resumes at the next valid record, the
//!   records after it are applied (a batch whose end lies after the damage keeps its
//!   surviving records), the range is logged (`gateway store: damaged records before the
//!   synced end skipped`) and shown as `gateway_store_damaged_bytes`, every session's
//!   numbering moves past the most numbers the skipped bytes can have held
//!   ([`Log::reserve_past_damage`]: one reservation record each, so no number a client saw is
//!   used again; a native replay fills the skipped numbers with "not kept" rejects, a FIX
//!   resend gap-fills them), and the store is compacted at the first chance, which drops the
//!   damage. Keeping the rest (rather than refusing to start) keeps every message sent after
//!   the damaged one; only the damaged record's own messages are gone (reported).
//! - A valid record before the watermark that does not decode is refused
//!   ([`StoreError::CorruptDurable`], naming the file, the offset and why: exit code 2).
//! - Anything after the watermark is a torn tail, cut as before as long as it is no longer
//!   than [`TORN_TAIL_BYTES_MAX`]; a longer one is damage, and the store refuses to open
//!   ([`StoreError::Corrupt`]) rather than drop acknowledged messages.
//!
//! The window that remains: a synced batch is claimed only by a batch written after its sync,
//! so damage to the newest synced batches (those the next batch has not claimed yet, or the
//! last before an idle spell) still reads as a torn tail and is cut, as in the journal before
//! its next sync. With `store_sync` off nothing is synced and nothing is claimed beyond what
//! the store held at open (every bad record is then a tear, as before).
//!
//! A store written before batch ends were recorded has none: its records are applied as they
//! are read, as they were, and [`Log::open`] appends (and syncs) a batch end to a store that
//! holds none (an old one, or a new empty one) before its first batch; a compacted file starts
//! and ends with one (the last claiming the whole file, which is synced before it replaces the
//! store). A store written before batch ends carried claims (empty batch ends) opens as it
//! did: its claims read as 0, so its damage is a tear, until the batches written from then on
//! claim it; a binary built before claims reads the new batch ends as it read the old ones.

use std::collections::{HashMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::io::{BufReader, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, PoisonError};
use std::thread::JoinHandle;

use journal::DurableSeq;
use pipeline::WaitStrategy;
use tokio::sync::Notify;

use crate::fix;
use crate::link::Link;
use crate::record::{self, Damage, Record, Scanned, Tail, encode_record};
use crate::routed::RoutedPositions;

#[path = "store_compact.rs"]
mod compact;
use crate::native::{self, Event, ServerMsg, event_kind};
pub use crate::record::kind;
pub use compact::FixIndex;

pub use crate::record::TORN_TAIL_BYTES_MAX;
/// The store's file name inside the store directory.
pub const FILE_NAME: &str = "gateway.store";
/// Default of [`StoreOptions::bytes_max`] (config `store_bytes_max`): 256 MiB. Past it the
/// store is compacted to what recovery needs. Large enough that compaction (a read of the
/// whole file and a write of what it keeps, on the I/O thread) is rare: at 1 KiB per order
/// and report pair, once per ~250 000 orders.
pub const STORE_BYTES_MAX_DEFAULT: u64 = 256 << 20;
/// Default of [`StoreOptions::fix_resend_window`] (config `fix_resend_window`): the newest
/// messages sent per FIX session that compaction keeps for resends, as many as the native
/// replay window keeps events. Older ones are answered with a SequenceReset-GapFill.
pub const FIX_RESEND_WINDOW_DEFAULT: usize = 1 << 14;

/// What the store keeps and how large it may grow.
#[derive(Clone, Copy, Debug)]
pub struct StoreOptions {
    /// `fdatasync` each batch before its held bytes are released.
    pub sync: bool,
    /// Native events kept per client for replay (recovery keeps as many).
    pub replay_events_max: usize,
    /// Bytes past which the file is compacted ([`Log::compact`]): it then grows again to
    /// at most this, or twice what compaction kept if that is more (no compaction storm
    /// when the retained windows alone fill the bound).
    pub bytes_max: u64,
    /// Sent messages kept per FIX session for resends when compacting (besides the
    /// ExecutionReports of orders still open, which rebuild the ClOrdID map at start).
    pub fix_resend_window: usize,
}

/// Sequence numbers a session reserves in the store at a time for messages the store does not
/// keep: one record per this many of them instead of one per message. A restarted server
/// goes on after the reservation, skipping what was not used (a FIX peer asks for the skipped
/// range and gets a gap fill; a native client replays "not kept" rejects).
pub const UNKEPT_SEQ_RESERVE: u64 = 1024;

/// Why the store cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("gateway store {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error(
        "gateway store {path}: bad record at byte {offset} with {tail_bytes} bytes after it \
         (a torn write is at most {TORN_TAIL_BYTES_MAX}); refusing to drop them"
    )]
    Corrupt { path: String, offset: u64, tail_bytes: u64 },
    /// Recovery could not apply records before the store's synced end (its durable
    /// watermark): they were acknowledged, so nothing is cut.
    #[error(
        "gateway store {path}: {why} (byte {offset}; synced up to byte {watermark}); refusing \
         to cut acknowledged records"
    )]
    CorruptDurable { path: String, offset: u64, watermark: u64, why: &'static str },
    #[error(
        "gateway store {path}: compaction kept the old file: the compacted one would recover \
         differently ({why})"
    )]
    CompactionMismatch { path: String, why: String },
    /// Another process owns the store directory (or its lock could not be taken).
    #[error("gateway store {dir}: another process owns it")]
    Owned { dir: String, source: ops::OpsError },
}

/// A FIX session's recovered state.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct FixRecovered {
    /// (MsgSeqNum, payload offset of the message in the file, length) of every message sent.
    pub index: Vec<(u64, u64, u32)>,
    /// Per entry of `index`, the OrderID of an ExecutionReport (0: another message), so
    /// that compaction keeps the reports of open orders without reading them again.
    pub order_ids: Vec<u32>,
    pub next_in: u64,
    /// The highest OrderID (37) sent: the session's order numbers go on above it, so an
    /// order of a restarted server never takes the id of one resting in a recovered book.
    pub order_id_max: u32,
    /// The last [`kind::FIX_NEXT_OUT`] since the last reset (0: none): no message at or above
    /// it was sent.
    pub next_out_reserved: u64,
}

/// A native session's recovered state.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct NativeRecovered {
    /// The newest events (at most the replay window), the oldest first.
    pub events: VecDeque<Event>,
    /// The sequence number of the next event kept.
    pub next_seq: u64,
    /// The last [`kind::NATIVE_RESERVED`] (0: none): no event at or above it was sent, and
    /// those from `next_seq` up to it that were sent are not kept.
    pub reserved: u64,
}

impl NativeRecovered {
    /// Appends `event` (the replay window keeps the newest `replay_events_max`).
    fn push(&mut self, event: Event, replay_events_max: usize) {
        if self.events.len() == replay_events_max {
            self.events.pop_front();
        }
        self.events.push_back(event);
        self.next_seq += 1;
    }

    /// Fills sequence numbers up to `seq` (exclusive), used by events the store did not
    /// keep, with [`crate::native::gateway_reason::NOT_KEPT`] rejects, so the replay window
    /// stays one run of numbers.
    pub fn fill_unkept(&mut self, seq: u64, replay_events_max: usize) {
        let not_kept = Event {
            kind: crate::native::event_kind::REJECTED,
            reason: crate::native::gateway_reason::NOT_KEPT,
            ..Event::default()
        };
        while self.next_seq < seq {
            self.push(not_kept, replay_events_max);
        }
    }
}

/// What the store held at start, by client id.
#[derive(Debug, Default)]
pub struct Recovered {
    pub fix: HashMap<u32, FixRecovered>,
    pub native: HashMap<u32, NativeRecovered>,
    /// Orders still open by the reports sent (token → instrument), either protocol: what
    /// cancel-on-disconnect cancels when the engine's books were recovered too.
    pub open: HashMap<u32, HashMap<u32, u32>>,
    /// Per (shard, slot), how far its reports were routed (a gateway without a tier).
    pub routed: HashMap<(u32, u32), crate::routed::Position>,
    /// How many session numbers the damaged records recovery skipped may have carried
    /// ([`Log::reserve_past_damage`] moves every session past them; 0: no damage).
    pub numbers_lost_max: u64,
}

/// The fdatasync thread's shared state.
struct SyncShared {
    /// Highest write epoch the I/O thread has asked to be made durable.
    requested: AtomicU64,
    /// Highest write epoch made durable.
    synced: AtomicU64,
    failed: AtomicBool,
    stop: AtomicBool,
    /// Notified after each sync (the I/O thread then releases held bytes).
    done: Arc<Notify>,
    /// The file the syncer syncs: replaced when compaction replaces the store's file.
    file: std::sync::Mutex<Arc<File>>,
    /// Per tier journal shard: its durable sequence and the highest input sequence the
    /// requested batches answer (set once, before the first commit).
    journals: OnceLock<Vec<(Arc<DurableSeq>, AtomicU64)>>,
    /// Highest write epoch whose reports' inputs the tier's journals have on disk (published
    /// by the journal waiter; unused without journals).
    journal_covered: AtomicU64,
}

/// The durable store.
pub struct Log {
    file: File,
    path: PathBuf,
    options: StoreOptions,
    /// Bytes at which the next compaction is due.
    compact_at: u64,
    /// Bytes in the file.
    end: u64,
    /// Records appended since the last commit.
    pending: Vec<u8>,
    /// Commits that wrote something (the write epoch of the newest data in the file).
    written_epoch: u64,
    /// `None`: `store_sync` off.
    sync: Option<(Arc<SyncShared>, JoinHandle<()>)>,
    /// The thread that waits for the tier's journals (with [`Log::wait_for_journals`]).
    journal_waiter: Option<JoinHandle<()>>,
    /// Links with held bytes, each once.
    waiting: Vec<Rc<Link>>,
    /// Per tier journal shard, the highest input sequence answered by a record appended so
    /// far (empty unless [`Log::wait_for_journals`]).
    journal_needs: Vec<u64>,
    write_failed: bool,
    /// The last write was refused for a full disk (its batch is still pending).
    refusing: bool,
    /// Writes refused for a full disk (metrics).
    pub writes_refused: u64,
    /// Test hook: this many next writes fail with `ENOSPC` after writing half their batch.
    #[cfg(test)]
    refuse_writes_for_tests: u32,
    /// Every byte before this was on disk when last seen (an `fdatasync` had returned): the
    /// claim each batch end carries (`record::end_batch`).
    synced_end: u64,
    /// Commits written and not yet seen synced: (write epoch, the file's end after it).
    unsynced: VecDeque<(u64, u64)>,
    /// Bytes of damaged records recovery skipped at open (metrics).
    pub damaged_bytes: u64,
    /// Commits that wrote, and the bytes they wrote (metrics).
    pub commits: u64,
    pub bytes_written: u64,
    /// How far a gateway without a tier routed each slot's reports: its records ride in the
    /// batch of the reports they count ([`Log::commit`]).
    pub routed: RoutedPositions,
    /// The store directory's lock, held while the log is open: one process writes the file
    /// (last, so that it is released after everything else dropped).
    _owner: ops::StoreLock,
}

impl Log {
    /// Opens (or creates) the store in `dir`, recovers what it holds (keeping at most
    /// `replay_events_max` events per native client) and, with `sync`, starts the syncer.
    pub fn open(dir: &Path, options: StoreOptions) -> Result<(Log, Recovered), StoreError> {
        let path = dir.join(FILE_NAME);
        let io = |source| StoreError::Io { path: path.display().to_string(), source };
        // Before the file is read: a second process would cut the live writer's tail.
        let owner = ops::StoreLock::acquire(dir)
            .map_err(|source| StoreError::Owned { dir: dir.display().to_string(), source })?;
        let file =
            OpenOptions::new().read(true).append(true).create(true).open(&path).map_err(io)?;
        let size = file.metadata().map_err(io)?.len();
        let (mut recovered, scanned) = recover(&file, options.replay_events_max).map_err(io)?;
        let end = scanned.end;
        match record::tail(&scanned, size) {
            Tail::Clean => {}
            Tail::Damaged(tail_bytes) => {
                let path = path.display().to_string();
                return Err(StoreError::Corrupt { path, offset: end, tail_bytes });
            }
            Tail::Durable { offset, why } => {
                let (path, watermark) = (path.display().to_string(), scanned.watermark);
                return Err(StoreError::CorruptDurable { path, offset, watermark, why });
            }
            Tail::Torn(tail_bytes) => {
                tracing::warn!(path = %path.display(), offset = end, tail_bytes, "gateway store: torn tail cut off");
                file.set_len(end).map_err(io)?;
            }
        }
        // What recovery read is on disk before any batch end claims it.
        file.sync_data().map_err(io)?;
        let end = match scanned.marked {
            true => end,
            false => mark_batches(&file, end).map_err(io)?,
        };
        let sync = match options.sync {
            true => Some(spawn_syncer(file.try_clone().map_err(io)?)),
            false => None,
        };
        let mut log = Log {
            file,
            path,
            options,
            compact_at: options.bytes_max,
            end,
            pending: Vec::with_capacity(1 << 16),
            written_epoch: 0,
            sync,
            waiting: Vec::new(),
            journal_waiter: None,
            journal_needs: Vec::new(),
            write_failed: false,
            refusing: false,
            writes_refused: 0,
            #[cfg(test)]
            refuse_writes_for_tests: 0,
            synced_end: end,
            unsynced: VecDeque::new(),
            damaged_bytes: 0,
            commits: 0,
            bytes_written: 0,
            routed: RoutedPositions::recovered(std::mem::take(&mut recovered.routed)),
            _owner: owner,
        };
        log.report_damage(&scanned.damaged, &mut recovered);
        Ok((log, recovered))
    }

    /// Recovery skipped damaged records before the synced end: reports each range (the log,
    /// `gateway_store_damaged_bytes`), notes in `recovered` how many numbers the lost records
    /// may have carried, and has the store compacted at the first chance (the damage is then
    /// gone from it).
    fn report_damage(&mut self, damaged: &[Damage], recovered: &mut Recovered) {
        for damage in damaged {
            let (from, to) = (damage.from, damage.to);
            tracing::error!(path = %self.path.display(), from, to, "gateway store: damaged records before the synced end skipped; the records after them kept");
            self.damaged_bytes += to - from;
            recovered.numbers_lost_max += damage.records_max();
            self.compact_at = 0;
        }
    }

    /// After recovery skipped damaged records: moves each session's numbering (`sessions`:
    /// client id, and whether it runs FIX; besides every session the store recovered) past
    /// the numbers the lost records may have carried, with one reservation record each,
    /// committed now, so that no number a client saw is used again. Nothing without damage.
    pub fn reserve_past_damage(
        &mut self,
        recovered: &mut Recovered,
        sessions: impl IntoIterator<Item = (u32, bool)>,
    ) {
        let skip = std::mem::take(&mut recovered.numbers_lost_max);
        if skip == 0 {
            return;
        }
        let mut all: Vec<(u32, bool)> = sessions.into_iter().collect();
        all.extend(recovered.native.keys().map(|&client| (client, false)));
        all.extend(recovered.fix.keys().map(|&client| (client, true)));
        all.sort_unstable();
        all.dedup();
        for (client, fix) in all {
            if fix {
                let fix = recovered.fix.entry(client).or_default();
                let kept_next = fix.index.last().map_or(1, |&(seq, _, _)| seq + 1);
                fix.next_out_reserved = fix.next_out_reserved.max(kept_next) + skip;
                self.append(kind::FIX_NEXT_OUT, client, &[&fix.next_out_reserved.to_le_bytes()]);
            } else {
                let native = recovered.native.entry(client).or_default();
                native.reserved = native.reserved.max(native.next_seq.max(1)) + skip;
                self.append(kind::NATIVE_RESERVED, client, &[&native.reserved.to_le_bytes()]);
            }
        }
        self.commit();
    }

    /// Moves [`Log::synced_end`] up to the end of the newest batch the syncer has synced.
    fn advance_synced_end(&mut self) {
        let Some((shared, _)) = &self.sync else { return };
        // Acquire: pairs with the syncer's Release store after its fdatasync returned.
        let synced = shared.synced.load(Ordering::Acquire);
        while let Some(&(_, end)) = self.unsynced.front().filter(|(epoch, _)| *epoch <= synced) {
            self.synced_end = end;
            self.unsynced.pop_front();
        }
    }

    /// Appends a record to the batch; returns the file offset its payload will have.
    pub fn append(&mut self, kind: u8, client: u32, parts: &[&[u8]]) -> u64 {
        self.end + encode_record(&mut self.pending, kind, client, parts) as u64
    }

    /// Holds each batch until, besides its own `fdatasync`, every tier journal shard's durable
    /// sequence covers the inputs the batch's reports answer (see the module docs): a second
    /// thread waits for the journals while the syncer goes on syncing. Needs the syncer
    /// (`store_sync`) and must come before the first commit; `false` otherwise.
    pub fn wait_for_journals(&mut self, durables: Vec<Arc<DurableSeq>>) -> bool {
        let Some((shared, _)) = &self.sync else { return false };
        if self.written_epoch > 0 || self.journal_waiter.is_some() {
            return false;
        }
        self.journal_needs = vec![0; durables.len()];
        let journals = durables.into_iter().map(|d| (d, AtomicU64::new(0))).collect();
        if shared.journals.set(journals).is_err() {
            return false;
        }
        let state = shared.clone();
        let thread = std::thread::Builder::new()
            .name("gateway-journal-wait".into())
            .spawn(move || journal_wait_loop(&state))
            .expect("spawning the store's journal waiter");
        self.journal_waiter = Some(thread);
        true
    }

    /// Records that what is appended next answers input `seq` of journal shard `shard` (0: a
    /// reject no journaled input caused). Nothing unless [`Log::wait_for_journals`].
    pub fn require(&mut self, shard: u32, seq: u64) {
        if let Some(need) = self.journal_needs.get_mut(shard as usize) {
            *need = (*need).max(seq);
        }
    }

    /// Queues bytes for `link` that may reach the client only once the records appended so
    /// far are durable; past `limit` bytes queued the session is cut off as a slow consumer.
    pub fn hold(&mut self, link: &Rc<Link>, bytes: &[u8], limit: usize) {
        if link.hold(bytes, limit) && link.enlist() {
            self.waiting.push(link.clone());
        }
    }

    /// Reads `len` bytes at `offset` (written or still in the batch).
    pub fn read_at(&self, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
        let mut bytes = vec![0u8; len];
        if offset >= self.end {
            let at = (offset - self.end) as usize;
            bytes.copy_from_slice(&self.pending[at..at + len]);
        } else {
            self.file.read_exact_at(&mut bytes, offset)?;
        }
        Ok(bytes)
    }

    /// Writes the batch (one `write`), asks for its sync, marks what the links hold as
    /// waiting for it, and releases whatever is durable already.
    pub fn commit(&mut self) {
        self.routed.append_changed(&mut self.pending, self.written_epoch + 1);
        if !self.pending.is_empty() && !self.write_failed {
            self.advance_synced_end();
            let records_end = self.pending.len();
            record::end_batch(&mut self.pending, self.synced_end);
            if let Err(error) = self.write_pending() {
                self.pending.truncate(records_end); // the next try ends the batch again
                self.write_refused(error);
                return;
            }
            if std::mem::take(&mut self.refusing) {
                tracing::info!(path = %self.path.display(), "gateway store: writing again after a full disk");
            }
            self.end += self.pending.len() as u64;
            self.bytes_written += self.pending.len() as u64;
            self.pending.clear();
            self.written_epoch += 1;
            self.commits += 1;
            if self.sync.is_some() {
                self.unsynced.push_back((self.written_epoch, self.end));
            }
            if let Some((shared, thread)) = &self.sync {
                if let Some(journals) = shared.journals.get() {
                    for ((_, published), need) in journals.iter().zip(&self.journal_needs) {
                        // Relaxed: published by the Release store of `requested` below.
                        published.store(*need, Ordering::Relaxed);
                    }
                }
                // Release: the syncer that reads this epoch starts its fdatasync after the
                // write above returned, so the sync covers it (and it sees the needs above).
                shared.requested.store(self.written_epoch, Ordering::Release);
                thread.thread().unpark();
                if let Some(waiter) = &self.journal_waiter {
                    waiter.thread().unpark();
                }
            }
        }
        for link in &self.waiting {
            link.mark(self.written_epoch);
        }
        self.release();
    }

    /// Writes the batch at the file's end (one `write`).
    fn write_pending(&mut self) -> std::io::Result<()> {
        #[cfg(test)]
        if self.refuse_writes_for_tests > 0 {
            self.refuse_writes_for_tests -= 1;
            // Half the batch reaches the file first, as a write cut short by ENOSPC leaves it.
            let _ = (&self.file).write_all(&self.pending[..self.pending.len() / 2]);
            return Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
        }
        (&self.file).write_all(&self.pending)
    }

    /// A write of the batch failed. A full disk (`ENOSPC`, `EDQUOT`) may pass: what reached
    /// the file is cut off again (the next write appends at the same offset, so the offsets
    /// handed out by [`Log::append`] stay right), the batch stays pending with its held bytes
    /// and the next commit tries again. Anything else, or a cut that fails, holds all output
    /// for good: sessions stall and are cut off. Either way nothing of the batch is released.
    fn write_refused(&mut self, error: std::io::Error) {
        let full = matches!(error.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT));
        if full && self.file.set_len(self.end).is_ok() {
            self.writes_refused += 1;
            if !std::mem::replace(&mut self.refusing, true) {
                tracing::warn!(path = %self.path.display(), %error, "gateway store: disk full; holding output and trying again at each commit");
            }
            return;
        }
        tracing::error!(path = %self.path.display(), %error, "gateway store: write failed; holding all output");
        self.write_failed = true;
    }

    /// [`Log::commit`] if some link holds bytes; otherwise the batch waits for the next one.
    pub fn commit_if_holding(&mut self) {
        if !self.waiting.is_empty() {
            self.commit();
        }
    }

    /// Moves held bytes whose records are durable to their links' outboxes.
    pub fn release(&mut self) {
        if self.write_failed {
            return;
        }
        let durable = self.durable_epoch();
        self.routed.publish_durable(durable);
        self.waiting.retain(|link| {
            let still = link.release(durable);
            link.stay_listed(still);
            still
        });
    }

    /// The newest write epoch whose batch is durable (synced, and covered by the tier's
    /// journals where the store waits for them; written, with `store_sync` off).
    pub fn durable_epoch(&self) -> u64 {
        match &self.sync {
            // Acquire: pairs with the syncer's Release store after its fdatasync returned
            // (and the journal waiter's after the journals covered the batch).
            Some((shared, _)) if self.journal_waiter.is_some() => shared
                .synced
                .load(Ordering::Acquire)
                .min(shared.journal_covered.load(Ordering::Acquire)),
            Some((shared, _)) => shared.synced.load(Ordering::Acquire),
            None => self.written_epoch,
        }
    }

    /// Whether some link holds bytes that wait for a sync.
    pub fn is_holding(&self) -> bool {
        !self.waiting.is_empty()
    }

    /// Notified after each sync; `None` with `store_sync` off.
    pub fn synced_notify(&self) -> Option<Arc<Notify>> {
        self.sync.as_ref().map(|(shared, _)| shared.done.clone())
    }

    /// Whether a write or sync failed (output is held from then on).
    pub fn has_failed(&self) -> bool {
        // Relaxed: a status flag read for metrics; no data is published through it.
        self.write_failed
            || self.sync.as_ref().is_some_and(|(shared, _)| shared.failed.load(Ordering::Relaxed))
    }
}

impl Drop for Log {
    fn drop(&mut self) {
        self.commit(); // what waited for a later write (inbound sequence numbers)
        if let Some((shared, thread)) = self.sync.take() {
            // Relaxed: the unpark/join below synchronise; the flag only ends the loops.
            shared.stop.store(true, Ordering::Relaxed);
            for thread in std::iter::once(thread).chain(self.journal_waiter.take()) {
                thread.thread().unpark();
                let _ = thread.join();
            }
        }
    }
}

/// Keeps a client's open orders (token → instrument) up to date with one of its events.
pub(crate) fn track_open(open: &mut HashMap<u32, u32>, event: &Event) {
    match event.kind {
        event_kind::ACCEPTED if event.leaves_qty > 0 => {
            open.insert(event.token, event.instrument);
        }
        event_kind::FILLED | event_kind::CANCELLED => {
            open.remove(&event.token);
        }
        _ => {}
    }
}

fn spawn_syncer(file: File) -> (Arc<SyncShared>, JoinHandle<()>) {
    let shared = Arc::new(SyncShared {
        requested: AtomicU64::new(0),
        synced: AtomicU64::new(0),
        failed: AtomicBool::new(false),
        stop: AtomicBool::new(false),
        done: Arc::new(Notify::new()),
        journals: OnceLock::new(),
        journal_covered: AtomicU64::new(0),
        file: std::sync::Mutex::new(Arc::new(file)),
    });
    let state = shared.clone();
    let thread = std::thread::Builder::new()
        .name("gateway-store-sync".into())
        .spawn(move || sync_loop(&state))
        .expect("spawning the store's sync thread");
    (shared, thread)
}

/// One `fdatasync` for everything written since the last one, then publish and notify.
fn sync_loop(shared: &SyncShared) {
    follow_requests(shared, &shared.synced, || {
        // The lock only picks the current file; the sync runs without it. A sync of a file
        // that compaction has just replaced is still right: the new file was synced whole.
        let file = shared.file.lock().unwrap_or_else(PoisonError::into_inner).clone();
        // Never retried (a failed fdatasync may have dropped the dirty pages).
        file.sync_data().map_err(|error| format!("fdatasync failed: {error}"))
    });
}

/// The journal waiter: for each requested epoch, waits until the tier's journals cover what
/// its batch answers, then publishes the epoch and notifies. Beside the syncer, so that the
/// store's next `fdatasync` never waits for the journal's.
fn journal_wait_loop(shared: &SyncShared) {
    follow_requests(shared, &shared.journal_covered, || {
        if journals_cover(shared) { Ok(()) } else { Err("the tier's journal failed".into()) }
    });
}

/// Runs `make_durable` for the newest requested write epoch whenever one is pending, then
/// publishes that epoch in `published` and notifies the I/O thread; parks in between and
/// ends on a stop request, or on the first failure (output is held from then on).
fn follow_requests(
    shared: &SyncShared,
    published: &AtomicU64,
    mut make_durable: impl FnMut() -> Result<(), String>,
) {
    let mut done = 0;
    loop {
        // Acquire: pairs with the Release in `commit`; the write (and the batch's journal
        // needs) precede the work below.
        let target = shared.requested.load(Ordering::Acquire);
        if target > done {
            if let Err(error) = make_durable() {
                tracing::error!(%error, "gateway store: holding all output");
                // Relaxed: read only for metrics.
                shared.failed.store(true, Ordering::Relaxed);
                return;
            }
            done = target;
            // Release: the I/O thread that sees this epoch may send what it covers.
            published.store(target, Ordering::Release);
            shared.done.notify_one();
        } else if shared.stop.load(Ordering::Relaxed) {
            return;
        } else {
            std::thread::park();
        }
    }
}

/// Waits until each tier journal shard's durable sequence covers what the requested batches
/// answer; `false` if a journal failed first (it will never cover them).
fn journals_cover(shared: &SyncShared) -> bool {
    let Some(journals) = shared.journals.get() else { return true };
    journals.iter().all(|(durable, need)| {
        // Relaxed: ordered by the Acquire load of `requested` (see `Log::commit`).
        let need = need.load(Ordering::Relaxed);
        durable.wait_for(need, WaitStrategy::default()).is_ok()
    })
}

/// Reads every whole batch's valid records; returns what they hold and where they end.
fn recover(file: &File, replay_events_max: usize) -> std::io::Result<(Recovered, Scanned)> {
    let mut reader = BufReader::with_capacity(1 << 20, file);
    let mut recovered = Recovered::default();
    let scanned =
        record::scan(&mut reader, |record| apply(&mut recovered, record, replay_events_max))?;
    Ok((recovered, scanned))
}

/// Appends a [`kind::BATCH_END`] to a store that holds none (new, or written before batches
/// were marked) at `end` and syncs it, so that from the next batch on a torn batch is
/// dropped whole; returns the store's new end. What it held before stays as it recovered.
fn mark_batches(file: &File, end: u64) -> std::io::Result<u64> {
    let mut marker = Vec::with_capacity(record::HEADER_BYTES + 8);
    // Its caller synced the `end` bytes before it.
    record::end_batch(&mut marker, end);
    let mut writer = file;
    writer.write_all(&marker)?;
    file.sync_data()?;
    Ok(end + marker.len() as u64)
}

/// Applies one record; `false` if it does not decode.
fn apply(recovered: &mut Recovered, record: Record, replay_events_max: usize) -> bool {
    let Record { kind, client, payload, payload_at: at, after_damage } = record;
    match kind {
        kind::FIX_SENT
        | kind::FIX_NEXT_IN
        | kind::FIX_NEXT_OUT
        | kind::FIX_RESET
        | kind::FIX_ORDER_ID_MAX => return apply_fix(recovered, kind, client, payload, at),
        kind::NATIVE_NEXT | kind::NATIVE_RESERVED | kind::NATIVE_EVENT => {
            let native = NativeRecord { kind, client, payload, after_damage };
            return apply_native(recovered, native, replay_events_max);
        }
        kind::ROUTED => {
            let Some((key, position)) = crate::routed::decode(payload) else { return false };
            recovered.routed.insert(key, position);
        }
        kind::OPEN_ORDER => {
            let field = |at: usize| {
                payload.get(at..at + 4).map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
            };
            let (Some(token), Some(instrument)) = (field(0), field(4)) else { return false };
            recovered.open.entry(client).or_default().insert(token, instrument);
        }
        _ => return false,
    }
    true
}

/// The little-endian u64 at `from` in `payload`, if it holds one.
fn u64_at(payload: &[u8], from: usize) -> Option<u64> {
    payload.get(from..from + 8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
}

/// [`apply`] for a FIX session's record (`at`: where its payload is in the file).
fn apply_fix(recovered: &mut Recovered, kind: u8, client: u32, payload: &[u8], at: u64) -> bool {
    match kind {
        kind::FIX_SENT => {
            let Some(seq) = u64_at(payload, 0) else { return false };
            let fix = recovered.fix.entry(client).or_default();
            fix.index.push((seq, at + 8, (payload.len() - 8) as u32));
            let order_id = match fix::Message::parse(&payload[8..]) {
                Ok(message) => {
                    let open = recovered.open.entry(client).or_default();
                    fix_order_state(&message, &mut fix.order_id_max, open)
                }
                Err(_) => 0,
            };
            fix.order_ids.push(order_id);
        }
        kind::FIX_NEXT_IN => {
            let Some(next_in) = u64_at(payload, 0) else { return false };
            recovered.fix.entry(client).or_default().next_in = next_in;
        }
        kind::FIX_NEXT_OUT => {
            let Some(reserved) = u64_at(payload, 0) else { return false };
            // The last one is the tightest bound: a stopping server settles its reservation
            // down to what it used (`fix_session::Store::settle`).
            recovered.fix.entry(client).or_default().next_out_reserved = reserved;
        }
        kind::FIX_RESET => {
            // Order numbers are not reset: the books may still hold the session's orders.
            let fix = recovered.fix.entry(client).or_default();
            fix.index.clear();
            fix.order_ids.clear();
            fix.next_in = 1;
            fix.next_out_reserved = 0;
        }
        kind::FIX_ORDER_ID_MAX => {
            let Some(max) = payload.try_into().ok().map(u32::from_le_bytes) else { return false };
            let fix = recovered.fix.entry(client).or_default();
            fix.order_id_max = fix.order_id_max.max(max);
        }
        _ => return false,
    }
    true
}

/// A native session's record as [`apply_native`] reads it.
struct NativeRecord<'a> {
    kind: u8,
    client: u32,
    payload: &'a [u8],
    /// Recovery skipped damaged records before it: a gap may be what they held.
    after_damage: bool,
}

/// [`apply`] for a native session's record.
fn apply_native(recovered: &mut Recovered, record: NativeRecord, replay_events_max: usize) -> bool {
    let NativeRecord { kind, client, payload, after_damage } = record;
    match kind {
        kind::NATIVE_NEXT => {
            let Some(next_seq) = u64_at(payload, 0) else { return false };
            let native = recovered.native.entry(client).or_default();
            native.events.clear();
            native.next_seq = next_seq;
        }
        kind::NATIVE_RESERVED => {
            let Some(reserved) = u64_at(payload, 0) else { return false };
            recovered.native.entry(client).or_default().reserved = reserved;
        }
        kind::NATIVE_EVENT => {
            let decoded =
                native::split_frame(payload).ok().flatten().and_then(|(version, kind, body, _)| {
                    native::decode_server(version, kind, body).ok()
                });
            let Some(ServerMsg::Sequenced { seq, event }) = decoded else { return false };
            let native = recovered.native.entry(client).or_default();
            if native.next_seq == 0 {
                native.next_seq = seq;
            }
            // A gap is what unkept events left, within a reservation, or what damaged records
            // held; any other is not what this server wrote.
            let unexplained = seq >= native.reserved && !after_damage;
            if seq < native.next_seq || (seq > native.next_seq && unexplained) {
                return false;
            }
            native.fill_unkept(seq, replay_events_max);
            native.push(event, replay_events_max);
            track_open(recovered.open.entry(client).or_default(), &event);
        }
        _ => return false,
    }
    true
}

/// What a sent FIX message says about the session's orders: the highest OrderID, and, for an
/// ExecutionReport, whether its order is still open (as [`track_open`] reads native events).
/// Returns the OrderID of an ExecutionReport (0: another message).
fn fix_order_state(
    message: &fix::Message,
    order_id_max: &mut u32,
    open: &mut HashMap<u32, u32>,
) -> u32 {
    let number = |t| message.get(t).and_then(fix::parse_u64).and_then(|n| u32::try_from(n).ok());
    let Some(token) = number(fix::tag::ORDER_ID) else { return 0 };
    *order_id_max = (*order_id_max).max(token);
    if message.msg_type() != b"8" {
        return 0;
    }
    let leaves_qty = number(fix::tag::LEAVES_QTY).unwrap_or(0);
    let kind = match message.get(fix::tag::EXEC_TYPE) {
        Some(b"0") => event_kind::ACCEPTED,
        Some(b"F") if leaves_qty == 0 => event_kind::FILLED,
        Some(b"4") => event_kind::CANCELLED,
        _ => return token,
    };
    let instrument = number(fix::tag::SYMBOL).unwrap_or(0);
    track_open(open, &Event { kind, token, instrument, leaves_qty, ..Event::default() });
    token
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Options of a store that is never compacted.
    /// One log writes a store: a second opening is refused naming the lock, and the store is
    /// free again once the first closed (issue 41).
    #[test]
    fn a_store_open_in_one_log_is_refused_to_a_second_until_it_closes() {
        let dir = tempfile::tempdir().unwrap();
        let (first, _) = Log::open(dir.path(), options(false, 16)).unwrap();
        let Err(StoreError::Owned { source, .. }) = Log::open(dir.path(), options(false, 16))
        else {
            panic!("one store opened twice");
        };
        assert!(matches!(source, ops::OpsError::Held { .. }), "{source}");
        drop(first);
        Log::open(dir.path(), options(false, 16)).expect("free once the first closed");
    }

    fn options(sync: bool, replay_events_max: usize) -> StoreOptions {
        StoreOptions {
            sync,
            replay_events_max,
            bytes_max: u64::MAX,
            fix_resend_window: FIX_RESEND_WINDOW_DEFAULT,
        }
    }

    fn event(token: u32) -> Event {
        Event { kind: event_kind::ACCEPTED, token, qty: 3, leaves_qty: 3, ..Event::default() }
    }

    fn append_event(log: &mut Log, client: u32, seq: u64, token: u32) {
        let mut frame = Vec::new();
        native::encode_server(&ServerMsg::Sequenced { seq, event: event(token) }, &mut frame);
        log.append(kind::NATIVE_EVENT, client, &[&frame]);
    }

    /// An ExecutionReport with OrderID `order_id`.
    fn report(order_id: i64) -> Vec<u8> {
        let mut builder = fix::Builder::default();
        builder.begin(b"8", b"LEANTIER", b"F2", 5).int(fix::tag::ORDER_ID, order_id);
        builder.finish().to_vec()
    }

    /// A store with two native events of client 1 and FIX state of client 2, committed.
    fn filled(dir: &Path) {
        let (mut log, _) = Log::open(dir, options(false, 16)).unwrap();
        append_event(&mut log, 1, 1, 70);
        append_event(&mut log, 1, 2, 71);
        log.append(kind::FIX_SENT, 2, &[&5u64.to_le_bytes(), &report(41)]);
        log.append(kind::FIX_NEXT_IN, 2, &[&9u64.to_le_bytes()]);
        log.commit();
    }

    #[test]
    fn recovery_returns_what_was_committed_and_cuts_a_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        filled(dir.path());
        let path = dir.path().join(FILE_NAME);
        let size = std::fs::metadata(&path).unwrap().len();
        // A crash mid-write: half a record's header at the end.
        let mut file = OpenOptions::new().append(true).open(&path).unwrap();
        file.write_all(&[40, 0, 0, 0, 1, 2]).unwrap();
        let (log, recovered) = Log::open(dir.path(), options(false, 16)).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), size, "the torn tail is cut");
        let native = &recovered.native[&1];
        assert_eq!(native.next_seq, 3);
        assert_eq!(native.events, [event(70), event(71)]);
        let fix = &recovered.fix[&2];
        assert_eq!((fix.next_in, fix.index.len(), fix.index[0].0), (9, 1, 5));
        assert_eq!(fix.order_id_max, 41);
        let (_, offset, len) = fix.index[0];
        assert_eq!(log.read_at(offset, len as usize).unwrap(), report(41));
    }

    /// A batch whose write-back a power failure tore after its reports but before its end
    /// marker: recovery drops it whole (its reports and its routed position), never a prefix.
    #[test]
    fn a_batch_without_its_end_marker_is_dropped_whole() {
        let dir = tempfile::tempdir().unwrap();
        filled(dir.path());
        let path = dir.path().join(FILE_NAME);
        let size = std::fs::metadata(&path).unwrap().len();
        let (mut log, _) = Log::open(dir.path(), options(false, 16)).unwrap();
        append_event(&mut log, 1, 3, 72);
        let position = crate::routed::Position { input_seq: 9, reports: 4 };
        log.append(kind::ROUTED, 0, &[&crate::routed::encode(0, 0, position)]);
        log.commit();
        drop(log);
        let read = |path: &Path| recover(&File::open(path).unwrap(), 16).unwrap().0;
        let whole = read(&path);
        assert_eq!((whole.native[&1].next_seq, whole.routed.len()), (4, 1), "synced whole");
        // The batch's records persisted, its marker did not.
        let file = OpenOptions::new().write(true).open(&path).unwrap();
        file.set_len(file.metadata().unwrap().len() - record::HEADER_BYTES as u64).unwrap();
        drop(file);
        let torn = read(&path);
        assert_eq!(torn.native[&1].next_seq, 3, "the torn batch's event is dropped");
        assert!(torn.routed.is_empty(), "and its routed position with it");
        Log::open(dir.path(), options(false, 16)).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), size, "the torn batch is cut");
    }

    /// A store written before batches were marked recovers every valid record as before;
    /// opening it marks it, so a torn batch written after that is dropped whole.
    #[test]
    fn a_store_without_markers_recovers_as_before_and_is_marked_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        let mut old = Vec::new();
        for (seq, token) in [(1u64, 70), (2, 71)] {
            let mut frame = Vec::new();
            native::encode_server(&ServerMsg::Sequenced { seq, event: event(token) }, &mut frame);
            encode_record(&mut old, kind::NATIVE_EVENT, 1, &[&frame]);
        }
        std::fs::write(&path, &old).unwrap();
        let (mut log, recovered) = Log::open(dir.path(), options(false, 16)).unwrap();
        assert_eq!(recovered.native[&1].events, [event(70), event(71)]);
        let marked = std::fs::metadata(&path).unwrap().len();
        assert_eq!(marked, (old.len() + record::BATCH_END_BYTES) as u64, "a marker after them");
        append_event(&mut log, 1, 3, 72);
        log.commit();
        drop(log);
        let whole = std::fs::metadata(&path).unwrap().len();
        let file = OpenOptions::new().write(true).open(&path).unwrap();
        file.set_len(whole - record::HEADER_BYTES as u64).unwrap();
        drop(file);
        let (_, recovered) = Log::open(dir.path(), options(false, 16)).unwrap();
        assert_eq!(recovered.native[&1].events, [event(70), event(71)]);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), marked);
    }

    #[test]
    fn a_replay_window_keeps_the_newest_events_and_a_reset_forgets_a_fix_session() {
        let dir = tempfile::tempdir().unwrap();
        filled(dir.path());
        let (mut log, _) = Log::open(dir.path(), options(false, 16)).unwrap();
        log.append(kind::FIX_RESET, 2, &[]);
        log.commit();
        drop(log);
        let (_, recovered) = Log::open(dir.path(), options(false, 1)).unwrap();
        assert_eq!(recovered.native[&1].events, [event(71)]);
        assert_eq!(recovered.native[&1].next_seq, 3);
        let fix = &recovered.fix[&2];
        assert_eq!((fix.next_in, fix.index.len(), fix.order_id_max), (1, 0, 41));
    }

    #[test]
    fn open_orders_are_rebuilt_from_both_protocols_reports() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = Log::open(dir.path(), options(false, 16)).unwrap();
        append_event(&mut log, 1, 1, 70); // native: accepted, 3 left
        let report = execution_report;
        for (seq, bytes) in
            [(1, report(1, b"0", 5, 10)), (2, report(2, b"0", 6, 10)), (3, report(3, b"4", 6, 0))]
        {
            log.append(kind::FIX_SENT, 2, &[&(seq as u64).to_le_bytes(), &bytes]);
        }
        log.commit();
        drop(log);
        let (_, recovered) = Log::open(dir.path(), options(false, 16)).unwrap();
        assert_eq!(recovered.open[&1], HashMap::from([(70, 0)]));
        assert_eq!(recovered.open[&2], HashMap::from([(5, 3)]), "6 was cancelled");
        assert_eq!(recovered.fix[&2].order_id_max, 6);
    }

    #[test]
    fn numbers_used_by_unkept_events_are_filled_within_a_reservation_and_nowhere_else() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = Log::open(dir.path(), options(false, 16)).unwrap();
        append_event(&mut log, 1, 1, 1);
        log.append(kind::NATIVE_RESERVED, 1, &[&100u64.to_le_bytes()]); // refusals 2 and 3
        append_event(&mut log, 1, 4, 4);
        append_event(&mut log, 2, 1, 1);
        append_event(&mut log, 2, 3, 3); // a gap no reservation covers
        log.commit();
        drop(log);
        let (_, recovered) = Log::open(dir.path(), options(false, 16)).unwrap();
        let first = &recovered.native[&1];
        let reasons: Vec<u8> = first.events.iter().map(|e| e.reason).collect();
        let not_kept = native::gateway_reason::NOT_KEPT;
        assert_eq!(reasons, [0, not_kept, not_kept, 0], "{first:?}");
        assert_eq!((first.next_seq, first.reserved), (5, 100));
        assert_eq!(recovered.native[&2].next_seq, 2, "recovery stops at the unexplained gap");
    }

    /// Commits the batch and waits until the syncer has synced it (so the next batch end
    /// claims it).
    /// Releases `log`'s held output each time its syncer reports, until `link` holds nothing;
    /// `what` names the report waited for when it does not come within 10 s.
    fn release_once_synced(log: &mut Log, link: &Link, synced: &tokio::sync::Notify, what: &str) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        while link.is_holding() {
            runtime.block_on(async {
                tokio::time::timeout(std::time::Duration::from_secs(10), synced.notified())
                    .await
                    .expect(what);
            });
            log.release();
        }
    }

    fn commit_synced(log: &mut Log) {
        log.commit();
        while log.durable_epoch() < log.written_epoch {
            std::thread::yield_now();
        }
        log.release();
    }

    /// Three synced batches of client 1's native events 1..=3 and client 2's FIX messages
    /// 1..=3, one of each per batch, and a fourth batch that claims them; returns where each
    /// of the first three batches' native event payload starts.
    fn synced_batches(dir: &Path) -> Vec<u64> {
        let (mut log, _) = Log::open(dir, options(true, 16)).unwrap();
        let mut events_at = Vec::new();
        for seq in 1..=3u64 {
            let mut frame = Vec::new();
            let sequenced = ServerMsg::Sequenced { seq, event: event(70 + seq as u32) };
            native::encode_server(&sequenced, &mut frame);
            events_at.push(log.append(kind::NATIVE_EVENT, 1, &[&frame]));
            log.append(kind::FIX_SENT, 2, &[&seq.to_le_bytes(), &report(40 + seq as i64)]);
            commit_synced(&mut log);
        }
        log.append(kind::FIX_NEXT_IN, 2, &[&9u64.to_le_bytes()]);
        commit_synced(&mut log);
        events_at
    }

    fn flip(path: &Path, at: u64) {
        let mut bytes = std::fs::read(path).unwrap();
        bytes[at as usize] ^= 0x10;
        std::fs::write(path, &bytes).unwrap();
    }

    /// Issue 42: a flipped byte in a synced batch is damage, not a torn write: recovery skips
    /// the damaged record, keeps every record after it, numbers each session past what the
    /// lost record could have held (durably), reports the range, and compacts the damage away.
    #[test]
    fn a_flipped_byte_before_the_synced_end_loses_only_its_record_and_numbering_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let events_at = synced_batches(dir.path());
        let path = dir.path().join(FILE_NAME);
        let size = std::fs::metadata(&path).unwrap().len();
        flip(&path, events_at[1] + 3); // client 1's event 2
        let (mut log, mut recovered) = Log::open(dir.path(), options(true, 16)).unwrap();
        assert!(log.damaged_bytes > 0, "the damaged range is reported");
        log.reserve_past_damage(&mut recovered, [(1, false), (2, true), (3, false)]);
        assert!(recovered.native[&3].reserved > 1, "a session without records moves on too");
        assert!(std::fs::metadata(&path).unwrap().len() > size, "nothing cut; reservations added");
        let native = &recovered.native[&1];
        let tokens: Vec<u32> = native.events.iter().map(|e| e.token).collect();
        let not_kept = native::gateway_reason::NOT_KEPT;
        assert_eq!(tokens, [71, 0, 73], "event 3, after the damage, is kept: {native:?}");
        assert_eq!(native.events[1].reason, not_kept, "event 2's number is filled");
        assert!(native.reserved > 4, "numbering goes on past what the lost record held");
        let fix = &recovered.fix[&2];
        let seqs: Vec<u64> = fix.index.iter().map(|m| m.0).collect();
        assert_eq!((seqs, fix.next_in), (vec![1, 2, 3], 9), "the FIX session is whole");
        assert!(fix.next_out_reserved > 4);
        let reserved = (native.reserved, fix.next_out_reserved);
        assert!(log.compaction_due(), "the damage is compacted away at the first chance");
        log.compact().unwrap();
        drop(log);
        let (log, again) = Log::open(dir.path(), options(true, 16)).unwrap();
        assert_eq!(log.damaged_bytes, 0, "compaction left no damage");
        assert_eq!((again.native[&1].reserved, again.fix[&2].next_out_reserved), reserved);
    }

    /// The batch no later batch end claims is still a torn write when damaged: cut as before.
    #[test]
    fn damage_after_the_synced_end_is_still_cut_as_a_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let events_at = synced_batches(dir.path());
        let (mut log, _) = Log::open(dir.path(), options(true, 16)).unwrap();
        append_event(&mut log, 1, 4, 74);
        log.commit(); // claims the batches before; nothing claims this one
        drop(log);
        let path = dir.path().join(FILE_NAME);
        let size = std::fs::metadata(&path).unwrap().len();
        let bytes = std::fs::read(&path).unwrap();
        let last_at = size - (record::HEADER_BYTES as u64 + 8) - 20;
        flip(&path, last_at); // inside the last batch's event
        let (log, recovered) = Log::open(dir.path(), options(true, 16)).unwrap();
        assert_eq!(log.damaged_bytes, 0);
        assert_eq!(recovered.native[&1].next_seq, 4, "the unclaimed batch is cut");
        let cut = std::fs::metadata(&path).unwrap().len();
        assert!(cut < size && cut > events_at[2], "{cut} of {size}");
        assert_eq!(
            std::fs::read(&path).unwrap()[..(cut - 21) as usize],
            bytes[..(cut - 21) as usize]
        );
    }

    /// A valid record before the synced end that does not decode is refused, naming the
    /// file, the offset and why; nothing is cut.
    #[test]
    fn an_undecodable_record_before_the_synced_end_is_refused_not_cut() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = Log::open(dir.path(), options(true, 16)).unwrap();
        append_event(&mut log, 1, 1, 70);
        let bad_at = log.append(kind::NATIVE_EVENT, 1, &[b"not a frame"]) - 13;
        commit_synced(&mut log);
        append_event(&mut log, 1, 2, 71);
        commit_synced(&mut log);
        drop(log);
        let path = dir.path().join(FILE_NAME);
        let size = std::fs::metadata(&path).unwrap().len();
        let error = Log::open(dir.path(), options(true, 16)).err().expect("refused");
        let StoreError::CorruptDurable { offset, watermark, .. } = &error else {
            panic!("{error}");
        };
        assert_eq!(*offset, bad_at, "{error}");
        assert!(*watermark > bad_at, "{error}");
        assert!(error.to_string().contains("does not decode"), "{error}");
        assert_eq!(std::fs::metadata(&path).unwrap().len(), size, "nothing cut");
    }

    #[test]
    fn damage_longer_than_a_torn_write_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        filled(dir.path());
        let path = dir.path().join(FILE_NAME);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[5] ^= 0xff; // the first record's checksum
        bytes.resize(bytes.len() + TORN_TAIL_BYTES_MAX as usize + 1, 0);
        std::fs::write(&path, &bytes).unwrap();
        let error = Log::open(dir.path(), options(false, 16)).err().expect("refused");
        // The marker's damage lies before the batch's claim and is skipped; the zeros are not.
        assert!(matches!(error, StoreError::Corrupt { offset: 21.., .. }), "{error}");
        assert_eq!(std::fs::metadata(&path).unwrap().len(), bytes.len() as u64, "nothing cut");
    }

    #[test]
    fn held_bytes_wait_for_the_tier_journal_as_well_as_the_store() {
        use journal::{FixedRecord, JournalConfig, JournalWriter, Tail};
        let dir = tempfile::tempdir().unwrap();
        let journal_dir = dir.path().join("journal");
        std::fs::create_dir_all(&journal_dir).unwrap();
        let tail = Tail { dir: journal_dir, next_seq: 1, open_segment: None };
        let config = JournalConfig::default();
        let (mut sender, writer) = JournalWriter::spawn::<FixedRecord<8>>(tail, &config).unwrap();
        let (mut log, _) = Log::open(&dir.path().join("store"), options(true, 16)).unwrap();
        assert!(log.wait_for_journals(vec![writer.durable()]));
        let synced = log.synced_notify().expect("sync on");
        let link = Rc::new(Link::default());
        log.require(0, 1); // the report answers journal input 1, not appended yet
        append_event(&mut log, 1, 1, 70);
        log.hold(&link, b"report", 1 << 10);
        log.commit();
        // The store's own fdatasync is done in milliseconds; its batch must still wait.
        std::thread::sleep(std::time::Duration::from_millis(300));
        log.release();
        assert!(link.is_holding(), "released before the journal had the report's input");
        sender.append(FixedRecord { seq: 1, payload: [0; 8] }).unwrap();
        release_once_synced(
            &mut log,
            &link,
            &synced,
            "the syncer reports once the journal covers the batch",
        );
        assert_eq!(link.written_for_tests().as_slice(), b"report");
        drop(sender);
        writer.join().unwrap();
    }

    /// A full disk refuses a batch: nothing of it is released or left in the file, the store
    /// has not failed, and the next commit writes it with what came since.
    #[test]
    fn a_batch_a_full_disk_refuses_is_held_and_written_by_the_next_commit() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = Log::open(dir.path(), options(true, 16)).unwrap();
        let synced = log.synced_notify().expect("sync on");
        let path = dir.path().join(FILE_NAME);
        let size = std::fs::metadata(&path).unwrap().len();
        let link = Rc::new(Link::default());
        append_event(&mut log, 1, 1, 70);
        log.hold(&link, b"first", 1 << 10);
        log.refuse_writes_for_tests = 2;
        log.commit();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), size, "the half written is cut");
        assert_eq!((log.writes_refused, log.has_failed(), log.commits), (1, false, 0));
        // Its offsets name this file: no compaction replaces it while the batch waits.
        assert!(log.compact().is_err(), "compacted over a refused batch");
        assert_eq!((log.writes_refused, log.has_failed()), (2, false));
        std::thread::sleep(std::time::Duration::from_millis(50));
        log.release();
        assert!(link.is_holding(), "nothing released of a batch not written");
        append_event(&mut log, 1, 2, 71);
        log.hold(&link, b" second", 1 << 10);
        log.commit();
        release_once_synced(&mut log, &link, &synced, "the syncer reports");
        assert_eq!(link.written_for_tests().as_slice(), b"first second");
        drop(log);
        let (_, recovered) = Log::open(dir.path(), options(false, 16)).unwrap();
        assert_eq!(recovered.native[&1].events, [event(70), event(71)], "one batch, whole");
    }

    #[test]
    fn held_bytes_reach_the_outbox_only_after_the_sync_of_their_batch() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = Log::open(dir.path(), options(true, 16)).unwrap();
        let synced = log.synced_notify().expect("sync on");
        let link = Rc::new(Link::default());
        append_event(&mut log, 1, 1, 70);
        log.hold(&link, b"first", 1 << 10);
        log.commit();
        release_once_synced(&mut log, &link, &synced, "the syncer reports");
        assert_eq!(link.written_for_tests().as_slice(), b"first");
        // Held after the commit: waits for the next one, whatever the syncer does meanwhile.
        log.hold(&link, b"second", 1 << 10);
        log.release();
        assert_eq!(link.written_for_tests().as_slice(), b"first");
        assert!(link.is_holding());
        assert_eq!((log.commits, log.has_failed()), (1, false));
    }

    /// A FIX ExecutionReport: MsgSeqNum `seq`, OrderID `order_id`, ExecType `exec_type`.
    fn execution_report(seq: u64, exec_type: &[u8], order_id: i64, leaves: i64) -> Vec<u8> {
        let mut builder = fix::Builder::default();
        builder
            .begin(b"8", b"LEANTIER", b"F2", seq)
            .int(fix::tag::ORDER_ID, order_id)
            .field(fix::tag::EXEC_TYPE, exec_type)
            .int(fix::tag::SYMBOL, 3)
            .int(fix::tag::LEAVES_QTY, leaves);
        builder.finish().to_vec()
    }

    /// Client 1 (native): token 1 accepted and open, then 199 events of closed orders.
    /// Client 2 (FIX): order 5 accepted and open at MsgSeqNum 1, then 99 reports of orders
    /// 6.. filled at once; next inbound 77.
    fn traffic(log: &mut Log) -> u64 {
        append_event(log, 1, 1, 1);
        for seq in 2..=200 {
            let filled = Event { kind: event_kind::FILLED, token: seq as u32, ..Event::default() };
            let mut frame = Vec::new();
            native::encode_server(&ServerMsg::Sequenced { seq, event: filled }, &mut frame);
            log.append(kind::NATIVE_EVENT, 1, &[&frame]);
        }
        log.append(kind::FIX_SENT, 2, &[&1u64.to_le_bytes(), &execution_report(1, b"0", 5, 10)]);
        for seq in 2..=100u64 {
            let report = execution_report(seq, b"F", 4 + seq as i64, 0);
            log.append(kind::FIX_SENT, 2, &[&seq.to_le_bytes(), &report]);
        }
        log.append(kind::FIX_NEXT_IN, 2, &[&77u64.to_le_bytes()]);
        log.commit();
        log.end
    }

    #[test]
    fn routed_positions_ride_in_their_reports_batch_and_survive_compaction() {
        use crate::routed::DurableInputs;
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = Log::open(dir.path(), options(true, 16)).unwrap();
        let durable = DurableInputs::new(1, 2);
        log.routed.share(durable.clone());
        let report = |seq, client| exchange::msg::CoreOutput { seq, client, ..Default::default() };
        for (seq, client) in [(4, 1), (4, 2), (5, 1)] {
            assert!(log.routed.admit(&report(seq, client)));
            append_event(&mut log, client, seq, 1);
        }
        assert_eq!(durable.get(0, 1), 0, "nothing is durable before a commit");
        log.commit();
        let synced = log.synced_notify().unwrap();
        while log.durable_epoch() < 1 {
            futures_util::FutureExt::now_or_never(synced.notified());
            std::thread::yield_now();
        }
        log.release();
        assert_eq!((durable.get(0, 1), durable.get(0, 0)), (5, 4), "slot 1: input 5; slot 0: 4");
        log.compact().unwrap();
        drop(log);
        let (mut log, _) = Log::open(dir.path(), options(false, 16)).unwrap();
        log.routed.share(DurableInputs::new(1, 2));
        // Read again from each slot's first kept input: what was routed is dropped.
        let routed: Vec<bool> = [(5, 1), (6, 1), (4, 2), (5, 2)]
            .into_iter()
            .map(|(seq, client)| log.routed.admit(&report(seq, client)))
            .collect();
        assert_eq!(routed, [false, true, false, true], "compaction kept the positions");
    }

    #[test]
    fn past_its_bound_the_store_is_compacted_to_what_recovery_needs() {
        let dir = tempfile::tempdir().unwrap();
        let options = StoreOptions {
            sync: true,
            replay_events_max: 4,
            bytes_max: 8 << 10,
            fix_resend_window: 3,
        };
        let (mut log, _) = Log::open(dir.path(), options).unwrap();
        let before = traffic(&mut log);
        assert!(before > options.bytes_max && log.compaction_due(), "{before} bytes");
        let indices = log.compact().unwrap();
        let path = dir.path().join(FILE_NAME);
        let after = std::fs::metadata(&path).unwrap().len();
        assert!(after < options.bytes_max / 2, "{before} bytes compacted to {after}");
        assert!(!log.compaction_due());
        let seqs: Vec<u64> = indices[&2].iter().map(|m| m.0).collect();
        assert_eq!(seqs, [1, 98, 99, 100], "the open order's report and the resend window");
        let (_, offset, len) = indices[&2][1];
        assert_eq!(log.read_at(offset, len as usize).unwrap(), execution_report(98, b"F", 102, 0));

        // Written after the compaction, into the new file; then a restart.
        append_event(&mut log, 1, 201, 300);
        log.commit();
        drop(log);
        let (_, recovered) = Log::open(dir.path(), options).unwrap();
        let native = &recovered.native[&1];
        assert_eq!(native.next_seq, 202, "numbering goes on");
        assert_eq!(native.events.len(), 4);
        assert_eq!(native.events.back(), Some(&event(300)));
        assert_eq!(recovered.open[&1], HashMap::from([(1, 0), (300, 0)]), "open before and after");
        let fix = &recovered.fix[&2];
        assert_eq!((fix.next_in, fix.order_id_max), (77, 104));
        assert_eq!(fix.index.iter().map(|m| m.0).collect::<Vec<_>>(), [1, 98, 99, 100]);
        assert_eq!(recovered.open[&2], HashMap::from([(5, 3)]));
    }

    #[test]
    fn a_store_under_its_bound_or_whose_kept_state_fills_it_is_not_compacted_again() {
        let dir = tempfile::tempdir().unwrap();
        let roomy = StoreOptions { bytes_max: 1 << 20, ..options(false, 1 << 10) };
        let (mut log, _) = Log::open(dir.path(), roomy).unwrap();
        traffic(&mut log);
        assert!(!log.compaction_due(), "under its bound");
        drop(log);
        // Everything is kept (windows larger than the traffic): no smaller file is possible,
        // so the next compaction waits until the file has doubled.
        let tight = StoreOptions { bytes_max: 1 << 10, ..roomy };
        let (mut log, _) = Log::open(dir.path(), tight).unwrap();
        assert!(log.compaction_due());
        log.compact().unwrap();
        let kept = log.end;
        assert!(kept > tight.bytes_max && !log.compaction_due(), "{kept}");
        assert_eq!(log.compact_at, 2 * kept);
    }
}
