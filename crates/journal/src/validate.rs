//! The one validation of a journal directory, shared by recovery ([`crate::recover`]) and
//! `journal check`, so both always reach the same verdict. It only reads; recovery then acts
//! on the verdict (truncates a torn tail, removes a torn segment, carries out a repair).
//!
//! The rules, with `W` the durable watermark (the highest of: the watermark file, every
//! segment's watermark slots, the snapshot recovery starts from; see [`crate::watermark`])
//! and `S` that snapshot's sequence (0 without one):
//!
//! 1. A directory with no segment, no snapshot and no watermark file is *empty*: recovery
//!    starts a new journal there; `journal check` says so and fails (there is no journal to
//!    check). Journal files without a watermark file are refused (`watermark-missing`).
//! 2. Every record is read and CRC-checked, also those at or below `S`.
//! 3. Damage confined to records at or below `S` (a bad record, a bad header, a gap between
//!    segments) is *covered*: reported in [`Validation::covered`], not fatal, because the
//!    state comes from the snapshot (which was itself validated). It does cost the fallback
//!    to the older snapshot, which is why it is reported.
//! 4. Damage touching a record above `S`:
//!    - a bad record with a valid record after it: `corrupt` (refuse);
//!    - a gap between segments, or before the first one: `missing-segment` (refuse, no repair);
//!    - a bad last record (nothing valid after it) at or below `W`: `corrupt-durable` (refuse);
//!      above `W`: a torn write, truncated (it was never acknowledged);
//!    - the journal ending below `W` (a segment truncated on a record boundary or emptied):
//!      `below-watermark` (refuse);
//!    - the newest segment the watermark file names is gone: `newest-segment-missing`.
//! 5. The newest segment holds records but neither of its watermark slots is valid:
//!    `watermark-slots-blank` (refuse, whatever `S`). No crash leaves that (a segment is
//!    created with a valid slot and syncs overwrite one slot at a time), and without the slots
//!    a tail cut on a record boundary looks like a clean end when the watermark file still
//!    holds an old value. A newest segment with a header but no record and no slot is a
//!    creation cut short, not flagged.
//! 6. `repair` turns a repairable refusal ([`JournalError::is_repairable`]) into a
//!    [`RepairPlan`] naming what it discards; a gap is never repairable.
//!
//! Why a bad record followed by valid ones is corruption even above `W`: after a power
//! failure `W` may lag the acknowledged sequence by one batch (the slot write of the last
//! acknowledged batch rides on the next sync), and a torn batch can only leave a hole in the
//! middle after a power failure; refusing is the side that cannot lose an acknowledged record.

use std::path::{Path, PathBuf};

use crate::error::{JournalError, io_context};
use crate::frame::{self, Decoded};
use crate::reader::{EndPosition, TornTail};
use crate::segment::{self, SEGMENT_HEADER_BYTES, SegmentInfo};
use crate::snapshot;
use crate::watermark::{self, WatermarkFile};

/// What kind of damage a snapshot covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DamageKind {
    /// Records whose frames fail their CRC or framing.
    BadRecord,
    /// Records absent from the directory (a gap, or a journal ending early).
    MissingRecords,
    /// A segment whose header is not valid.
    BadHeader,
}

/// Damage found in records `first_seq..=last_seq`, all covered by the snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Damage {
    /// What is wrong.
    pub kind: DamageKind,
    /// The file it is in.
    pub file: PathBuf,
    /// Its byte offset.
    pub offset: u64,
    /// The first sequence it affects.
    pub first_seq: u64,
    /// The last sequence it affects.
    pub last_seq: u64,
}

/// `journal check`'s verdict on `dir`, read-only: [`validate`] against the newest intact
/// snapshot, as recovery would run it (without repair).
pub fn check(dir: &Path) -> Result<Validation, JournalError> {
    let snapshot_seq = snapshot::latest_intact_seq(dir)?;
    validate(dir, snapshot_seq, false, |_, _| {})
}

/// What `repair` will do to get past a refusal (`cause`).
#[derive(Debug)]
pub struct RepairPlan {
    /// The refusal recovery would report.
    pub cause: JournalError,
    /// Where the journal is cut (`None`: nothing to cut, the records are already gone).
    pub truncate: Option<EndPosition>,
    /// Segments after the cut, removed.
    pub remove: Vec<PathBuf>,
    /// The first sequence discarded; everything after it goes too.
    pub first_discarded_seq: u64,
    /// Durable watermark before the repair: at least `first_discarded_seq..=watermark` were
    /// durable (and may have been acknowledged).
    pub watermark: u64,
}

/// The verdict on a journal directory.
#[derive(Debug, Default)]
pub struct Validation {
    /// No segment, no snapshot, no watermark file: no journal here (recovery starts one).
    pub empty: bool,
    /// Segment files found.
    pub segments: usize,
    /// The watermark file's content, if it was readable.
    pub watermark_file: Option<WatermarkFile>,
    /// The durable watermark `W`.
    pub watermark: u64,
    /// The newest valid snapshot's sequence, if any.
    pub snapshot_seq: Option<u64>,
    /// First sequence of the first segment (`None`: no segment).
    pub first_segment_seq: Option<u64>,
    /// Last record of the journal read in order (0: none); after a planned repair, the last
    /// one kept.
    pub last_seq: u64,
    /// Records above the snapshot, handed to the caller in order.
    pub records_after_snapshot: u64,
    /// Damage at or below the snapshot: reported, but the snapshot holds those records.
    pub covered: Vec<Damage>,
    /// A torn write at the end (above the watermark), which recovery truncates.
    pub torn_tail: Option<TornTail>,
    /// A newest segment whose creation was cut short (no header, no data).
    pub torn_segment: Option<PathBuf>,
    /// Where the next frame goes in the last segment.
    pub end: Option<EndPosition>,
    /// What `--repair` would discard to get past a refusal.
    pub repair: Option<RepairPlan>,
}

/// Validates the journal in `dir` against the snapshot at `snapshot_seq` (the one recovery
/// starts from), handing every record above it to `on_record` in order. `repair` turns a
/// repairable refusal into [`Validation::repair`]; without it, that refusal is the error.
/// The I/O (listing, the watermark file, each segment's bytes) is here; the verdict is
/// [`Scan::run`]'s, over bytes.
pub fn validate(
    dir: &Path,
    snapshot_seq: Option<u64>,
    repair: bool,
    on_record: impl FnMut(u64, &[u8]),
) -> Result<Validation, JournalError> {
    let segments = segment::list_segments(dir)?;
    let watermark_file = match watermark::read_file(dir) {
        Err(error) if repair && error.is_repairable() => {
            tracing::warn!(%error, "REPAIR: ignoring the damaged watermark file; it is rebuilt");
            None
        }
        other => other?,
    };
    if segments.is_empty() && watermark_file.is_none() && snapshot::list(dir)?.is_empty() {
        return Ok(Validation { empty: true, ..Validation::default() });
    }
    let scan = Scan { dir, segments: &segments, watermark_file, snapshot_seq, repair };
    let read = |segment: &SegmentInfo| {
        std::fs::read(&segment.path)
            .map_err(io_context(format!("reading segment {}", segment.path.display())))
    };
    scan.run(read, on_record)
}

/// The verdict on a journal's segments, without I/O: what [`validate`] decides once it has
/// listed the directory and read the watermark file, over each segment's bytes as a reader
/// hands them. Recovery and `journal check` reach it through [`validate`]; the simulator
/// (`crates/sim`) calls it over a simulated disk's bytes.
#[derive(Clone, Copy, Debug)]
pub struct Scan<'a> {
    /// The journal directory (named in errors; not read).
    pub dir: &'a Path,
    /// Its segments, in sequence order (a directory listing's [`segment::list_segments`]).
    pub segments: &'a [SegmentInfo],
    /// The watermark file's content (`None`: no file, or a damaged one that repair ignores).
    pub watermark_file: Option<WatermarkFile>,
    /// The snapshot recovery starts from.
    pub snapshot_seq: Option<u64>,
    /// Turn a repairable refusal into [`Validation::repair`].
    pub repair: bool,
}

impl Scan<'_> {
    /// Walks the segments in order, `read` handing each one's bytes, every record above the
    /// snapshot going to `on_record` (the rules: the module docs).
    pub fn run<B: AsRef<[u8]>>(
        &self,
        mut read: impl FnMut(&SegmentInfo) -> Result<B, JournalError>,
        on_record: impl FnMut(u64, &[u8]),
    ) -> Result<Validation, JournalError> {
        if self.watermark_file.is_none() {
            let missing = JournalError::WatermarkMissing { dir: self.dir.to_path_buf() };
            if !self.repair {
                return Err(missing);
            }
            tracing::warn!(%missing, "REPAIR: validating with the segments' watermark slots only");
        }
        let mut walk = Walk::new(self.segments, self.watermark_file, self.snapshot_seq, on_record);
        let walked = (0..self.segments.len())
            .try_for_each(|index| {
                let bytes = read(&self.segments[index])?;
                walk.segment(index, bytes.as_ref())
            })
            .and_then(|()| walk.finish(self.dir));
        let mut validation = walk.out;
        match walked {
            Ok(()) => Ok(validation),
            Err(cause) if self.repair && cause.is_repairable() => {
                validation.repair = Some(plan(cause, self.segments, &validation));
                Ok(validation)
            }
            Err(cause) => Err(cause),
        }
    }
}

/// What repairing `cause` discards.
fn plan(cause: JournalError, segments: &[SegmentInfo], found: &Validation) -> RepairPlan {
    let truncate = match &cause {
        JournalError::Corrupt { file, offset, .. }
        | JournalError::CorruptDurable { file, offset, .. } => {
            Some(EndPosition { file: file.clone(), offset: *offset })
        }
        _ => None,
    };
    let remove = match &truncate {
        Some(cut) => {
            segments.iter().filter(|s| s.path > cut.file).map(|s| s.path.clone()).collect()
        }
        None => Vec::new(),
    };
    RepairPlan {
        cause,
        truncate,
        remove,
        first_discarded_seq: found.last_seq.max(found.snapshot_seq.unwrap_or(0)) + 1,
        watermark: found.watermark,
    }
}

/// The bug `regress-truncate-at-corruption` puts back (never on in a served build; the
/// simulator's regression test finds it): recovery as a journal without a durable watermark
/// does it, trusting the frames alone — the first bad frame of the last segment ends the
/// journal as a torn write, the durable records after it are truncated, and nothing says
/// the journal ended below what was acknowledged.
const FRAMES_ALONE: bool = cfg!(feature = "regress-truncate-at-corruption");

/// The walk over the segments, in order.
struct Walk<'a, F> {
    segments: &'a [SegmentInfo],
    /// Records at or below this are covered by the snapshot.
    covered_upto: u64,
    /// The sequence the next frame must carry (`None`: no segment read yet).
    expected: Option<u64>,
    on_record: F,
    /// The newest segment has a valid header but no valid watermark slot (rule 4).
    newest_slots_blank: bool,
    out: Validation,
}

impl<'a, F: FnMut(u64, &[u8])> Walk<'a, F> {
    fn new(
        segments: &'a [SegmentInfo],
        watermark_file: Option<WatermarkFile>,
        snapshot_seq: Option<u64>,
        on_record: F,
    ) -> Self {
        let covered_upto = snapshot_seq.unwrap_or(0);
        let out = Validation {
            segments: segments.len(),
            watermark_file,
            watermark: watermark_file.map_or(0, |w| w.seq()).max(covered_upto),
            snapshot_seq,
            first_segment_seq: segments.first().map(|s| s.first_seq),
            ..Validation::default()
        };
        Walk { segments, covered_upto, expected: None, on_record, newest_slots_blank: false, out }
    }

    fn cover(&mut self, kind: DamageKind, file: &Path, offset: u64, first_seq: u64, last_seq: u64) {
        let file = file.to_path_buf();
        self.out.covered.push(Damage { kind, file, offset, first_seq, last_seq });
    }

    /// The first sequence of the segment after `index`, if any.
    fn next_first(&self, index: usize) -> Option<u64> {
        self.segments.get(index + 1).map(|s| s.first_seq)
    }

    fn segment(&mut self, index: usize, bytes: &[u8]) -> Result<(), JournalError> {
        let segments = self.segments;
        let segment = &segments[index];
        let next_first = self.next_first(index);
        if next_first.is_none() && segment::is_unwritten_header(bytes) {
            return self.torn_segment(segment);
        }
        if let Err(error) = segment::check_header(bytes, segment) {
            // Only a segment followed by another has a known range that a snapshot can cover.
            return match next_first {
                Some(next) if next - 1 <= self.covered_upto => {
                    self.cover(
                        DamageKind::BadHeader,
                        &segment.path,
                        0,
                        segment.first_seq,
                        next - 1,
                    );
                    self.expected = Some(next);
                    Ok(())
                }
                _ => Err(error),
            };
        }
        let slots = segment::read_slots(bytes, segment.first_seq);
        self.out.watermark = self.out.watermark.max(slots.unwrap_or(0));
        self.newest_slots_blank = next_first.is_none() && slots.is_none();
        self.continuity(segment)?;
        self.frames(segment, bytes, next_first)
    }

    /// A newest segment with no header: a creation cut short, unless the watermark says
    /// records went into it (then its header was durable once: damage).
    fn torn_segment(&mut self, segment: &SegmentInfo) -> Result<(), JournalError> {
        let named = self.out.watermark_file.is_some_and(|w| w.newest_segment >= segment.first_seq);
        if named || segment.first_seq <= self.out.watermark {
            return Err(JournalError::BadSegmentHeader { file: segment.path.clone() });
        }
        self.out.torn_segment = Some(segment.path.clone());
        Ok(())
    }

    /// Checks that `segment` starts where the journal so far ends.
    fn continuity(&mut self, segment: &SegmentInfo) -> Result<(), JournalError> {
        // Before the first segment, records at or below the snapshot were pruned: normal.
        let expected = self.expected.unwrap_or(segment.first_seq.min(self.covered_upto + 1));
        let first = segment.first_seq;
        if first > expected && first - 1 <= self.covered_upto {
            self.cover(DamageKind::MissingRecords, &segment.path, 0, expected, first - 1);
        } else if first != expected {
            return Err(JournalError::MissingSegment {
                expected_seq: expected,
                found_first_seq: first,
                file: segment.path.clone(),
            });
        }
        self.expected = Some(first);
        // The journal read in order reaches at least here (an empty segment holds nothing).
        self.out.last_seq = first - 1;
        Ok(())
    }

    fn frames(
        &mut self,
        segment: &SegmentInfo,
        bytes: &[u8],
        next_first: Option<u64>,
    ) -> Result<(), JournalError> {
        let mut offset = SEGMENT_HEADER_BYTES as usize;
        loop {
            let expected = self.expected.expect("set by continuity");
            let rest = bytes.get(offset..).unwrap_or_default();
            match frame::decode(rest) {
                Decoded::Valid { seq, payload, frame_bytes } if seq == expected => {
                    if seq > self.covered_upto {
                        (self.on_record)(seq, payload);
                        self.out.records_after_snapshot += 1;
                    }
                    self.out.last_seq = seq;
                    self.expected = Some(seq + 1);
                    offset += frame_bytes;
                }
                // The data ends: before the next segment, or the journal's clean end.
                Decoded::End if next_first.is_some() || rest.iter().all(|&b| b == 0) => {
                    let (file, offset) = (segment.path.clone(), offset as u64);
                    self.out.end = Some(EndPosition { file, offset });
                    return Ok(());
                }
                _ => match self.bad_frame(segment, bytes, offset, next_first)? {
                    Some(resume) => offset = resume,
                    None => return Ok(()),
                },
            }
        }
    }

    /// The frame at `offset` is bad: resumes after covered damage (`Some(offset)`), ends the
    /// segment (`None`), or refuses.
    fn bad_frame(
        &mut self,
        segment: &SegmentInfo,
        bytes: &[u8],
        offset: usize,
        next_first: Option<u64>,
    ) -> Result<Option<usize>, JournalError> {
        let seq = self.expected.expect("set by continuity");
        let file = &segment.path;
        if FRAMES_ALONE && next_first.is_none() {
            self.out.end = Some(EndPosition { file: file.clone(), offset: offset as u64 });
            self.out.torn_tail = Some(TornTail { file: file.clone(), offset: offset as u64 });
            return Ok(None);
        }
        let corrupt = || JournalError::Corrupt { file: file.clone(), offset: offset as u64, seq };
        if let Some(skip) = frame::find_valid_after(&bytes[offset..], seq - 1) {
            let Decoded::Valid { seq: resume_seq, .. } = frame::decode(&bytes[offset + skip..])
            else {
                unreachable!("find_valid_after returns the offset of a valid frame");
            };
            if resume_seq - 1 > self.covered_upto {
                return Err(corrupt());
            }
            self.cover(DamageKind::BadRecord, file, offset as u64, seq, resume_seq - 1);
            self.expected = Some(resume_seq);
            return Ok(Some(offset + skip));
        }
        match next_first {
            Some(next) if next - 1 <= self.covered_upto => {
                self.cover(DamageKind::BadRecord, file, offset as u64, seq, next - 1);
                self.expected = Some(next);
                Ok(None)
            }
            Some(_) => Err(corrupt()),
            None => self.tail_damage(file, offset as u64, seq).map(|()| None),
        }
    }

    /// Bad bytes at the end of the last segment, nothing valid after them.
    fn tail_damage(&mut self, file: &Path, offset: u64, seq: u64) -> Result<(), JournalError> {
        self.out.end = Some(EndPosition { file: file.to_path_buf(), offset });
        let watermark = self.out.watermark;
        if seq > watermark {
            self.out.torn_tail = Some(TornTail { file: file.to_path_buf(), offset });
        } else if watermark <= self.covered_upto {
            self.cover(DamageKind::BadRecord, file, offset, seq, watermark);
        } else {
            return Err(JournalError::CorruptDurable {
                file: file.to_path_buf(),
                offset,
                seq,
                watermark,
            });
        }
        Ok(())
    }

    /// After the last segment: the journal must reach the watermark and hold the newest
    /// segment the watermark file names.
    fn finish(&mut self, dir: &Path) -> Result<(), JournalError> {
        let watermark = self.out.watermark;
        if let Some(named) = self.out.watermark_file.map(|w| w.newest_segment)
            && named > 0
            && self.segments.iter().all(|s| s.first_seq < named)
        {
            let file = segment::segment_path(dir, named);
            return Err(JournalError::NewestSegmentMissing { file, first_seq: named, watermark });
        }
        let last_seq = self.out.last_seq;
        let last_file = self.segments.last().map_or(dir, |s| s.path.as_path()).to_path_buf();
        let covered_to = self.out.covered.last().map_or(0, |d| d.last_seq);
        if last_seq < self.covered_upto && covered_to < self.covered_upto {
            self.cover(DamageKind::MissingRecords, &last_file, 0, last_seq + 1, self.covered_upto);
        }
        if !FRAMES_ALONE && last_seq.max(self.covered_upto) < watermark {
            let last_seq = last_seq.max(self.covered_upto);
            return Err(JournalError::BelowWatermark { last_seq, watermark, file: last_file });
        }
        self.blank_slots()
    }

    /// The newest segment holds records but neither watermark slot is valid. A segment is
    /// created with slot 0 valid (`first_seq - 1`, synced before any record goes in) and each
    /// sync overwrites one slot at a time, so no crash leaves both invalid: something blanked
    /// them, and with them the only proof of how far this segment was durable (the watermark
    /// file may hold its value from the writer's start). Older segments are not checked: the
    /// next segment exists only once each of their records was durable, and continuity proves
    /// they end where it starts.
    fn blank_slots(&self) -> Result<(), JournalError> {
        let Some(newest) = self.segments.last().filter(|_| self.newest_slots_blank) else {
            return Ok(());
        };
        let last_seq = self.out.last_seq;
        if last_seq < newest.first_seq {
            // No record: a creation cut between the header's first sector and its slot's.
            return Ok(());
        }
        Err(JournalError::WatermarkSlotsBlank {
            file: newest.path.clone(),
            first_seq: newest.first_seq,
            last_seq,
            watermark: self.out.watermark,
        })
    }
}
