//! Snapshots of the core's state, written off the critical path.
//!
//! The core's only pause is [`Snapshotter::offer`]: serialising its state into a recycled
//! buffer (a copy proportional to the state's size; the largest pause is recorded in
//! [`SnapshotStats::pause_ns_max`], and pauses over [`SNAPSHOT_PAUSE_BUDGET_NS`] are counted).
//! A background thread then waits until the journal's durable sequence covers the snapshot
//! (so a snapshot is never ahead of the journal), writes it atomically (temp file, fsync, rename, directory fsync), keeps the newest
//! [`SNAPSHOTS_KEPT`] and removes the segments older than the oldest kept one. Keeping two
//! lets recovery fall back to the previous snapshot if the newest one is damaged.
//!
//! File `{seq:020}.snap`: `magic[8] seq[8] state_hash[8] payload_bytes[8] crc32c[4] pad[4]`
//! then the payload; the CRC32C covers the 24 bytes after the magic and the payload.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::thread::JoinHandle;
use std::time::Instant;

use pipeline::WaitStrategy;

use crate::durable::DurableSeq;
use crate::error::{JournalError, io_context};
use crate::segment::{self, list_numbered, sync_dir};
use crate::state::StateMachine;

/// Snapshots kept on disk; the journal is kept from the oldest of them on.
pub const SNAPSHOTS_KEPT: usize = 2;
/// Serialisation buffers cycling between the core and the snapshot thread: with one being
/// written, the core can fill the other; with both busy, `offer` skips (never waits).
pub const SNAPSHOT_BUFFERS: usize = 2;

/// The longest the core should spend in [`Snapshotter::offer`]; longer pauses are counted in
/// [`SnapshotStats::pauses_over_budget`] (a state too large to copy between inputs needs a
/// copy-on-write structure instead).
pub const SNAPSHOT_PAUSE_BUDGET_NS: u64 = 1_000_000;

const SNAPSHOT_MAGIC: [u8; 8] = *b"LTJSNP01";
const SNAPSHOT_EXTENSION: &str = "snap";
const SNAPSHOT_HEADER_BYTES: usize = 40;

fn snapshot_crc(header_fields: &[u8], payload: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(header_fields), payload)
}

/// Writes a snapshot of the state at `seq` atomically; returns its path.
pub fn write(
    dir: &Path,
    seq: u64,
    state_hash: u64,
    payload: &[u8],
) -> Result<PathBuf, JournalError> {
    let mut header = [0u8; SNAPSHOT_HEADER_BYTES];
    header[..8].copy_from_slice(&SNAPSHOT_MAGIC);
    header[8..16].copy_from_slice(&seq.to_le_bytes());
    header[16..24].copy_from_slice(&state_hash.to_le_bytes());
    header[24..32].copy_from_slice(&(payload.len() as u64).to_le_bytes());
    let crc = snapshot_crc(&header[8..32], payload);
    header[32..36].copy_from_slice(&crc.to_le_bytes());
    let path = dir.join(format!("{seq:020}.{SNAPSHOT_EXTENSION}"));
    let temp = path.with_extension("snap.tmp");
    let context = || format!("writing snapshot {}", temp.display());
    let file = std::fs::File::create(&temp).map_err(io_context(context()))?;
    segment::write_all_at(&file, &header, 0).map_err(io_context(context()))?;
    segment::write_all_at(&file, payload, SNAPSHOT_HEADER_BYTES as u64)
        .map_err(io_context(context()))?;
    file.sync_all().map_err(io_context(context()))?;
    std::fs::rename(&temp, &path)
        .map_err(io_context(format!("renaming {} into place", temp.display())))?;
    sync_dir(dir)?;
    Ok(path)
}

/// Why a snapshot file was passed over.
fn validate(bytes: &[u8], named_seq: u64) -> Result<(u64, &[u8]), &'static str> {
    if bytes.len() < SNAPSHOT_HEADER_BYTES || bytes[..8] != SNAPSHOT_MAGIC {
        return Err("bad header");
    }
    let field = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    let (seq, state_hash, payload_bytes) = (field(8), field(16), field(24));
    let crc = u32::from_le_bytes(bytes[32..36].try_into().expect("4 bytes"));
    let payload = &bytes[SNAPSHOT_HEADER_BYTES..];
    if seq != named_seq || payload.len() as u64 != payload_bytes {
        return Err("sequence or length does not match");
    }
    if snapshot_crc(&bytes[8..32], payload) != crc {
        return Err("CRC mismatch");
    }
    Ok((state_hash, payload))
}

/// The snapshot files of `dir`, oldest first (intact or not).
pub fn list(dir: &Path) -> Result<Vec<(u64, PathBuf)>, JournalError> {
    list_numbered(dir, SNAPSHOT_EXTENSION)
}

/// The sequence of the newest snapshot whose file is intact (header and CRC). Recovery uses
/// the newest one that also restores to its recorded state hash, which needs the state type:
/// `journal check` has none, so it relies on this (the same file unless a snapshot passes
/// its CRC but is rejected by the state, i.e. was written by a different state type).
pub fn latest_intact_seq(dir: &Path) -> Result<Option<u64>, JournalError> {
    for (seq, path) in list(dir)?.into_iter().rev() {
        let bytes = std::fs::read(&path)
            .map_err(io_context(format!("reading snapshot {}", path.display())))?;
        match validate(&bytes, seq) {
            Ok(_) => return Ok(Some(seq)),
            Err(reason) => {
                tracing::warn!(file = %path.display(), reason, "skipping damaged snapshot")
            }
        }
    }
    Ok(None)
}

/// The newest snapshot that is intact and restores to its recorded hash; damaged ones are
/// skipped with a warning (recovery then needs the journal from the older snapshot on).
pub fn load_latest<S: StateMachine>(dir: &Path) -> Result<Option<(u64, S)>, JournalError> {
    for (seq, path) in list_numbered(dir, SNAPSHOT_EXTENSION)?.into_iter().rev() {
        let bytes = std::fs::read(&path)
            .map_err(io_context(format!("reading snapshot {}", path.display())))?;
        let restored = validate(&bytes, seq).and_then(|(state_hash, payload)| {
            let state = S::restore(payload).map_err(|_| "state rejected the payload")?;
            if state.state_hash() == state_hash {
                Ok(state)
            } else {
                Err("restored state hash differs")
            }
        });
        match restored {
            Ok(state) => return Ok(Some((seq, state))),
            Err(reason) => {
                tracing::warn!(file = %path.display(), reason, "skipping damaged snapshot")
            }
        }
    }
    Ok(None)
}

/// Keeps the newest [`SNAPSHOTS_KEPT`] snapshots and removes segments whose records all lie
/// at or below the oldest kept one. Never removes the last segment (the writer's).
pub fn prune(dir: &Path) -> Result<(), JournalError> {
    let snapshots = list_numbered(dir, SNAPSHOT_EXTENSION)?;
    if snapshots.len() < SNAPSHOTS_KEPT {
        return Ok(());
    }
    let (stale, kept) = snapshots.split_at(snapshots.len() - SNAPSHOTS_KEPT);
    let oldest_kept_seq = kept[0].0;
    let segments = segment::list_segments(dir)?;
    let covered = segments
        .windows(2)
        .filter(|pair| pair[1].first_seq <= oldest_kept_seq + 1)
        .map(|pair| &pair[0].path);
    for path in stale.iter().map(|(_, path)| path).chain(covered) {
        std::fs::remove_file(path).map_err(io_context(format!("removing {}", path.display())))?;
    }
    sync_dir(dir)
}

/// What the snapshotter did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SnapshotStats {
    /// Snapshots written.
    pub taken: u64,
    /// Offers skipped because the previous snapshot was still being written.
    pub skipped: u64,
    /// Longest time the core spent in `offer` (serialising), in ns.
    pub pause_ns_max: u64,
    /// Offers that paused the core longer than [`SNAPSHOT_PAUSE_BUDGET_NS`].
    pub pauses_over_budget: u64,
}

struct Request {
    seq: u64,
    state_hash: u64,
    payload: Vec<u8>,
}

/// The core's handle on the background snapshot thread.
pub struct Snapshotter {
    requests: SyncSender<Request>,
    free_buffers: Receiver<Vec<u8>>,
    thread: JoinHandle<Result<(), JournalError>>,
    stats: SnapshotStats,
}

impl Snapshotter {
    /// Starts the snapshot thread for the journal in `dir`, whose writer publishes `durable`.
    pub fn spawn(dir: PathBuf, durable: Arc<DurableSeq>) -> Result<Snapshotter, JournalError> {
        let (requests, incoming) = mpsc::sync_channel::<Request>(SNAPSHOT_BUFFERS);
        let (recycle, free_buffers) = mpsc::sync_channel(SNAPSHOT_BUFFERS);
        for _ in 0..SNAPSHOT_BUFFERS {
            recycle.send(Vec::new()).expect("the receiver is alive");
        }
        let thread = std::thread::Builder::new()
            .name("journal-snapshot".into())
            .spawn(move || {
                for request in incoming {
                    durable.wait_for(request.seq, WaitStrategy::Park)?;
                    write(&dir, request.seq, request.state_hash, &request.payload)?;
                    prune(&dir)?;
                    // The core may be gone already; then the buffer is simply freed.
                    let _ = recycle.send(request.payload);
                }
                Ok(())
            })
            .map_err(io_context("spawning the snapshot thread".into()))?;
        Ok(Snapshotter { requests, free_buffers, thread, stats: SnapshotStats::default() })
    }

    /// Snapshots `state`, which reflects every record up to `seq`. Never waits: returns
    /// `false` (and counts a skip) while both buffers are busy.
    pub fn offer<S: StateMachine>(&mut self, seq: u64, state: &S) -> bool {
        let Ok(mut payload) = self.free_buffers.try_recv() else {
            self.stats.skipped += 1;
            return false;
        };
        let started = Instant::now();
        payload.clear();
        state.write_snapshot(&mut payload);
        let state_hash = state.state_hash();
        let pause_ns = started.elapsed().as_nanos() as u64;
        self.stats.pause_ns_max = self.stats.pause_ns_max.max(pause_ns);
        self.stats.pauses_over_budget += u64::from(pause_ns > SNAPSHOT_PAUSE_BUDGET_NS);
        match self.requests.try_send(Request { seq, state_hash, payload }) {
            Ok(()) => {
                self.stats.taken += 1;
                true
            }
            // Full cannot happen (as many slots as buffers); Disconnected means the thread
            // stopped on an error, which `finish` reports.
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.stats.skipped += 1;
                false
            }
        }
    }

    /// Writes the pending snapshots and stops the thread.
    pub fn finish(self) -> Result<SnapshotStats, JournalError> {
        drop(self.requests);
        match self.thread.join() {
            Ok(result) => result.map(|()| self.stats),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}
