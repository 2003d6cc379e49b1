//! Start-up: the latest valid snapshot, then the journal after it, then resume.
//!
//! - A torn last record is zeroed with a warning (it was never acknowledged: its batch's sync
//!   had not returned).
//! - A last segment with no header (its creation was cut short, so it holds no data) is
//!   removed with a warning.
//! - Corruption with valid records after it stops start-up with [`JournalError::Corrupt`]
//!   (file, offset, sequence). With [`RecoverOptions::repair`], the journal is truncated there
//!   after a loud warning: the record and everything after it are discarded (later segments
//!   removed), and the state is what the records before it produce.
//! - A missing segment is [`JournalError::MissingSegment`]; there is no repair for a gap.

use std::path::Path;

use crate::error::{JournalError, io_context};
use crate::reader::{EndPosition, JournalReader, TornTail};
use crate::segment::{self, sync_dir};
use crate::snapshot;
use crate::writer::Tail;

/// The state the journal protects: a deterministic function of the input sequence.
pub trait StateMachine: Sized {
    /// Applies the record `seq` (payload as journaled). Must be deterministic: replaying the
    /// same records from the same state must give the same state.
    fn apply(&mut self, seq: u64, payload: &[u8]);
    /// Serialises the state (appending to `out`, which arrives empty).
    fn write_snapshot(&self, out: &mut Vec<u8>);
    /// Rebuilds a state from [`StateMachine::write_snapshot`]'s bytes; `Err` names why not.
    fn restore(bytes: &[u8]) -> Result<Self, String>;
    /// A digest of the whole state, to compare runs and validate snapshots.
    fn state_hash(&self) -> u64;
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecoverOptions {
    /// Truncate at a corrupt record instead of refusing to start.
    pub repair: bool,
}

/// A corruption that `repair` truncated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Repaired {
    pub file: std::path::PathBuf,
    pub offset: u64,
    /// The first discarded sequence number.
    pub seq: u64,
    pub segments_removed: usize,
}

/// The recovered state and where the writer resumes.
#[derive(Debug)]
pub struct Recovered<S> {
    pub state: S,
    /// Last sequence reflected in `state` (0: none).
    pub last_seq: u64,
    pub snapshot_seq: Option<u64>,
    pub replayed_records: u64,
    pub torn_tail: Option<TornTail>,
    pub repaired: Option<Repaired>,
    /// Hand this to [`crate::JournalWriter::spawn`].
    pub tail: Tail,
}

/// Recovers the state journaled in `dir` (created if missing), from `S::default()` when no
/// snapshot exists.
pub fn recover<S: StateMachine + Default>(
    dir: &Path,
    options: RecoverOptions,
) -> Result<Recovered<S>, JournalError> {
    recover_from(dir, options, S::default)
}

/// [`recover`] for a state whose empty value needs context (the exchange's core shard needs
/// its instrument listings): `initial` builds it when no snapshot exists.
pub fn recover_from<S: StateMachine>(
    dir: &Path,
    options: RecoverOptions,
    initial: impl FnOnce() -> S,
) -> Result<Recovered<S>, JournalError> {
    std::fs::create_dir_all(dir).map_err(io_context(format!("creating {}", dir.display())))?;
    let snapshot = snapshot::load_latest::<S>(dir)?;
    let snapshot_seq = snapshot.as_ref().map(|(seq, _)| *seq);
    let (from_seq, mut state) = match snapshot {
        Some((seq, state)) => (seq + 1, state),
        None => (1, initial()),
    };
    let mut reader = JournalReader::open(dir, from_seq)?;
    let mut replayed_records = 0;
    let mut repaired = None;
    loop {
        match reader.next_record() {
            Ok(Some((seq, payload))) => {
                state.apply(seq, payload);
                replayed_records += 1;
            }
            Ok(None) => break,
            Err(JournalError::Corrupt { file, offset, seq }) if options.repair => {
                repaired = Some(repair(dir, file, offset, seq)?);
                break;
            }
            Err(error) => return Err(error),
        }
    }
    if let Some(path) = reader.torn_segment() {
        tracing::warn!(file = %path.display(), "segment creation cut short (no header, no data): removing it");
        std::fs::remove_file(path).map_err(io_context(format!("removing {}", path.display())))?;
        sync_dir(dir)?;
    }
    let torn_tail = reader.torn_tail().cloned();
    if let Some(torn) = &torn_tail {
        tracing::warn!(
            file = %torn.file.display(),
            offset = torn.offset,
            "torn last record (an unfinished, never acknowledged write): truncating it"
        );
        segment::zero_from(&torn.file, torn.offset)?;
    }
    // Where the journal's data ends, and the sequence its next record must carry.
    let journal_end = match &repaired {
        Some(r) => Some((r.seq, EndPosition { file: r.file.clone(), offset: r.offset })),
        None => reader.next_seq().zip(reader.end_position().cloned()),
    };
    let last_seq = (from_seq - 1 + replayed_records).max(snapshot_seq.unwrap_or(0));
    let open_segment = match journal_end {
        // Append to the last segment only when it continues exactly where the state is; after
        // a repair below the snapshot, a fresh segment starts after the snapshot instead.
        Some((journal_next, end)) if journal_next == last_seq + 1 => Some(end),
        _ => None,
    };
    let tail = Tail { dir: dir.to_path_buf(), next_seq: last_seq + 1, open_segment };
    Ok(Recovered { state, last_seq, snapshot_seq, replayed_records, torn_tail, repaired, tail })
}

fn repair(
    dir: &Path,
    file: std::path::PathBuf,
    offset: u64,
    seq: u64,
) -> Result<Repaired, JournalError> {
    let later: Vec<_> =
        segment::list_segments(dir)?.into_iter().filter(|s| s.path > file).collect();
    tracing::warn!(
        file = %file.display(),
        offset,
        first_discarded_seq = seq,
        later_segments = later.len(),
        "REPAIR: truncating the journal at a corrupt record; sequence {seq} and every record after \
         it are DISCARDED"
    );
    segment::zero_from(&file, offset)?;
    for segment in &later {
        std::fs::remove_file(&segment.path)
            .map_err(io_context(format!("removing {}", segment.path.display())))?;
    }
    sync_dir(dir)?;
    Ok(Repaired { file, offset, seq, segments_removed: later.len() })
}
