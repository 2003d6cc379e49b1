//! Every way opening, reading or writing a journal can fail. Each variant names what a person
//! needs to act: the file, the offset, the sequence number; [`JournalError::reason`] gives a
//! stable, machine-readable reason code per variant (scripts match on it, never on the text).

use std::io;
use std::path::PathBuf;

/// Why a journal could not be opened, read, recovered or written.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// A system call failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done, to which file.
        context: String,
        /// The error the OS returned.
        #[source]
        source: io::Error,
    },
    /// A bad record with valid records after it: not a torn write.
    #[error(
        "corrupt record in {} at offset {offset} (expected sequence {seq}): CRC mismatch or bad \
         frame with valid records after it; refusing to start (use --repair to truncate the \
         journal there, discarding sequence {seq} and everything after it)",
        file.display()
    )]
    Corrupt {
        /// The segment.
        file: PathBuf,
        /// Where the bad record starts.
        offset: u64,
        /// The sequence expected there.
        seq: u64,
    },
    /// A gap between segments.
    #[error(
        "missing segment: the journal jumps from sequence {expected_seq} to {found_first_seq} \
         (segment {}); a segment file was removed or never written",
        file.display()
    )]
    MissingSegment {
        /// The sequence the next segment should start with.
        expected_seq: u64,
        /// The sequence the next segment found starts with.
        found_first_seq: u64,
        /// That segment.
        file: PathBuf,
    },
    /// A bad record at or below the durable watermark.
    #[error(
        "damaged durable record in {} at offset {offset} (sequence {seq}): the durable \
         watermark is {watermark}, so sequence {seq}..={watermark} were made durable (and may \
         have been acknowledged); this is corruption, not a torn write; refusing to start (use \
         --repair to truncate there, discarding sequence {seq} and everything after it)",
        file.display()
    )]
    CorruptDurable {
        /// The segment.
        file: PathBuf,
        /// Where the bad record starts.
        offset: u64,
        /// Its sequence.
        seq: u64,
        /// The durable watermark.
        watermark: u64,
    },
    /// The journal ends below its durable watermark.
    #[error(
        "the journal ends at sequence {last_seq} but the durable watermark is {watermark}: \
         sequence {}..={watermark} were made durable and are missing (the last segment, {}, was \
         truncated or emptied); refusing to start (--repair accepts the loss)",
        last_seq + 1,
        file.display()
    )]
    BelowWatermark {
        /// The last record found.
        last_seq: u64,
        /// The durable watermark.
        watermark: u64,
        /// The last segment.
        file: PathBuf,
    },
    /// The newest segment the watermark file names is gone.
    #[error(
        "segment {} is missing: the watermark file says it was created, so it held sequence \
         {first_seq} onwards (the journal was durable through at least {watermark}); \
         refusing to start (--repair accepts the loss)",
        file.display()
    )]
    NewestSegmentMissing {
        /// The missing segment.
        file: PathBuf,
        /// Its first sequence.
        first_seq: u64,
        /// The durable watermark.
        watermark: u64,
    },
    /// Journal files but no watermark file.
    #[error(
        "{} holds journal files but no watermark file ({}): it was removed, or the journal was \
         written by an older version; refusing to start (--repair rebuilds it from what is there)",
        dir.display(),
        crate::watermark::WATERMARK_FILE
    )]
    WatermarkMissing {
        /// The journal directory.
        dir: PathBuf,
    },
    /// The watermark file cannot be read as one.
    #[error(
        "watermark file {} is damaged ({why}); refusing to start (--repair rebuilds it from what \
         is there)",
        file.display()
    )]
    WatermarkDamaged {
        /// The watermark file.
        file: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// The newest segment's watermark slots are both unusable.
    #[error(
        "segment {} holds records {first_seq}..={last_seq} but neither of its two watermark \
         slots is valid (both blank or damaged): they are the only record of how far this, the \
         newest, segment was durable, so a tail cut on a record boundary cannot be told from a \
         clean end (the rest of the journal proves only {watermark}); refusing to start \
         (--repair accepts the journal as it ends, at {last_seq})",
        file.display()
    )]
    WatermarkSlotsBlank {
        /// The segment.
        file: PathBuf,
        /// Its first record's sequence.
        first_seq: u64,
        /// Its last record's sequence.
        last_seq: u64,
        /// What the rest of the journal proves durable.
        watermark: u64,
    },
    /// A segment whose header is not one of ours, or names the wrong first sequence.
    #[error("segment {} has a bad header (wrong magic or first sequence)", file.display())]
    BadSegmentHeader {
        /// The segment.
        file: PathBuf,
    },
    /// A record appended out of order: sequences must be gap-free and increasing.
    #[error("record out of sequence: expected {expected}, got {got}")]
    OutOfSequence {
        /// The sequence the journal expected.
        expected: u64,
        /// The sequence the record carried.
        got: u64,
    },
    /// The configuration is invalid; the message names the field.
    #[error("invalid journal configuration: {0}")]
    BadConfig(String),
    /// The writer thread is gone: appends can no longer become durable.
    #[error("the journal writer has stopped (it failed or was shut down); see its error")]
    WriterStopped,
}

impl JournalError {
    /// A stable reason code for this error, one per variant.
    pub fn reason(&self) -> &'static str {
        match self {
            JournalError::Io { .. } => "io",
            JournalError::Corrupt { .. } => "corrupt",
            JournalError::MissingSegment { .. } => "missing-segment",
            JournalError::CorruptDurable { .. } => "corrupt-durable",
            JournalError::BelowWatermark { .. } => "below-watermark",
            JournalError::NewestSegmentMissing { .. } => "newest-segment-missing",
            JournalError::WatermarkMissing { .. } => "watermark-missing",
            JournalError::WatermarkDamaged { .. } => "watermark-damaged",
            JournalError::WatermarkSlotsBlank { .. } => "watermark-slots-blank",
            JournalError::BadSegmentHeader { .. } => "bad-segment-header",
            JournalError::OutOfSequence { .. } => "out-of-sequence",
            JournalError::BadConfig(_) => "bad-config",
            JournalError::WriterStopped => "writer-stopped",
        }
    }

    /// Whether `--repair` can get past this refusal (by discarding what it names).
    pub fn is_repairable(&self) -> bool {
        matches!(
            self,
            JournalError::Corrupt { .. }
                | JournalError::CorruptDurable { .. }
                | JournalError::BelowWatermark { .. }
                | JournalError::NewestSegmentMissing { .. }
                | JournalError::WatermarkMissing { .. }
                | JournalError::WatermarkDamaged { .. }
                | JournalError::WatermarkSlotsBlank { .. }
        )
    }
}

/// Wraps an `io::Error` with what we were doing, for `map_err`.
pub(crate) fn io_context(context: String) -> impl FnOnce(io::Error) -> JournalError {
    move |source| JournalError::Io { context, source }
}
