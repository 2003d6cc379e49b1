//! Start-up: the latest valid snapshot, then the journal after it, then resume.
//!
//! The verdict is [`crate::validate::validate`]'s, the same function `journal check` runs:
//! see its module docs for every rule. Recovery then acts on it:
//!
//! - covered damage (records at or below the snapshot) is logged as a warning;
//! - a torn last record (above the durable watermark: never acknowledged) is zeroed with a
//!   warning;
//! - a last segment with no header (its creation was cut short, so it holds no data) is
//!   removed with a warning;
//! - a refusal is returned as the error; with [`RecoverOptions::repair`], a repairable one is
//!   carried out after a loud warning naming every discarded sequence: the journal is cut at
//!   the damage (later segments removed), the durable watermark is lowered to what is kept,
//!   and the state is what the records before the cut produce. A gap between segments is
//!   never repaired.

use std::path::Path;

use crate::error::{JournalError, io_context};
use crate::reader::{EndPosition, TornTail};
use crate::segment::{self, sync_dir};
use crate::snapshot;
use crate::state::StateMachine;
use crate::validate::{RepairPlan, Validation, validate};
use crate::watermark::{self, WatermarkFile, WatermarkStore};
use crate::writer::Tail;

/// How [`recover`] treats damage it would otherwise refuse.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecoverOptions {
    /// Truncate at a corrupt record instead of refusing to start.
    pub repair: bool,
}

/// What `repair` discarded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Repaired {
    /// The refusal it got past ([`JournalError::reason`]).
    pub reason: &'static str,
    /// Where the journal was cut (`None`: the records were already gone).
    pub truncated: Option<EndPosition>,
    /// The first discarded sequence number: it and everything after it are gone.
    pub first_discarded_seq: u64,
    /// The durable watermark before the repair: `first_discarded_seq..=watermark` were
    /// durable and may have been acknowledged.
    pub watermark: u64,
    /// Whole segments removed.
    pub segments_removed: usize,
}

/// The recovered state and where the writer resumes.
#[derive(Debug)]
pub struct Recovered<S> {
    /// The recovered state: the snapshot plus every record after it.
    pub state: S,
    /// Last sequence reflected in `state` (0: none).
    pub last_seq: u64,
    /// The snapshot recovery started from, if any.
    pub snapshot_seq: Option<u64>,
    /// Records applied after the snapshot.
    pub replayed_records: u64,
    /// The torn write truncated at the end, if there was one.
    pub torn_tail: Option<TornTail>,
    /// What repair discarded, when it was asked for and needed.
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
    let mut state = match snapshot {
        Some((_, state)) => state,
        None => initial(),
    };
    let validation =
        validate(dir, snapshot_seq, options.repair, |seq, payload| state.apply(seq, payload))?;
    for damage in &validation.covered {
        tracing::warn!(
            file = %damage.file.display(),
            offset = damage.offset,
            kind = ?damage.kind,
            "damaged records {}..={} are covered by snapshot {}: starting from it (the fallback \
             to an older snapshot is lost)",
            damage.first_seq,
            damage.last_seq,
            snapshot_seq.unwrap_or(0)
        );
    }
    if let Some(path) = &validation.torn_segment {
        tracing::warn!(
            file = %path.display(),
            "segment creation cut short (no header, no data): removing it"
        );
        std::fs::remove_file(path).map_err(io_context(format!("removing {}", path.display())))?;
        sync_dir(dir)?;
    }
    if let Some(torn) = &validation.torn_tail {
        tracing::warn!(
            file = %torn.file.display(),
            offset = torn.offset,
            watermark = validation.watermark,
            "torn last record above the durable watermark (an unfinished, never acknowledged \
             write): truncating it"
        );
        segment::zero_from(&torn.file, torn.offset)?;
    }
    let repaired = match &validation.repair {
        Some(plan) => Some(repair(dir, plan, &validation)?),
        None => None,
    };
    Ok(resume(dir, state, snapshot_seq, &validation, repaired))
}

/// Where the writer resumes after `validation` (and its repair).
fn resume<S>(
    dir: &Path,
    state: S,
    snapshot_seq: Option<u64>,
    validation: &Validation,
    repaired: Option<Repaired>,
) -> Recovered<S> {
    let journal_last = validation.last_seq;
    let last_seq = journal_last.max(snapshot_seq.unwrap_or(0));
    let end = match &repaired {
        Some(Repaired { truncated: Some(cut), .. }) => Some(cut.clone()),
        _ => validation.end.clone(),
    };
    // Append to the last segment only when it continues exactly where the state is; when the
    // snapshot is ahead of the journal (covered damage), a fresh segment starts after it.
    let open_segment = end.filter(|_| journal_last == last_seq);
    let tail = Tail { dir: dir.to_path_buf(), next_seq: last_seq + 1, open_segment };
    Recovered {
        state,
        last_seq,
        snapshot_seq,
        replayed_records: validation.records_after_snapshot,
        torn_tail: validation.torn_tail.clone(),
        repaired,
        tail,
    }
}

/// Carries out `plan`: cuts the journal, removes what follows, lowers the watermark.
fn repair(
    dir: &Path,
    plan: &RepairPlan,
    validation: &Validation,
) -> Result<Repaired, JournalError> {
    tracing::warn!(
        reason = plan.cause.reason(),
        cause = %plan.cause,
        first_discarded_seq = plan.first_discarded_seq,
        watermark = plan.watermark,
        segments_removed = plan.remove.len(),
        "REPAIR: sequence {} and every record after it are DISCARDED ({}..={} were durable and \
         may have been acknowledged)",
        plan.first_discarded_seq,
        plan.first_discarded_seq,
        plan.watermark.max(plan.first_discarded_seq)
    );
    if let Some(cut) = &plan.truncate {
        segment::zero_from(&cut.file, cut.offset)?;
    }
    for path in &plan.remove {
        std::fs::remove_file(path).map_err(io_context(format!("removing {}", path.display())))?;
    }
    sync_dir(dir)?;
    let kept_last = plan.first_discarded_seq - 1;
    let last_segment = segment::list_segments(dir)?.pop();
    if let Some(last) = &last_segment {
        watermark::reset_slots(
            &last.path,
            last.first_seq,
            validation.last_seq.max(last.first_seq - 1),
        )?;
    }
    let newest_segment = last_segment.map_or(0, |s| s.first_seq);
    let durable_seq = kept_last.max(validation.snapshot_seq.unwrap_or(0));
    WatermarkStore::open(dir)?.write(&WatermarkFile { newest_segment, durable_seq })?;
    Ok(Repaired {
        reason: plan.cause.reason(),
        truncated: plan.truncate.clone(),
        first_discarded_seq: plan.first_discarded_seq,
        watermark: plan.watermark,
        segments_removed: plan.remove.len(),
    })
}
