//! Every way opening, reading or writing a journal can fail. Each variant names what a person
//! needs to act: the file, the offset, the sequence number; [`JournalError::reason`] gives a
//! stable, machine-readable reason code per variant (scripts match on it, never on the text).

use std::io;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
    #[error(
        "corrupt record in {} at offset {offset} (expected sequence {seq}): CRC mismatch or bad \
         frame with valid records after it; refusing to start (use --repair to truncate the \
         journal there, discarding sequence {seq} and everything after it)",
        file.display()
    )]
    Corrupt { file: PathBuf, offset: u64, seq: u64 },
    #[error(
        "missing segment: the journal jumps from sequence {expected_seq} to {found_first_seq} \
         (segment {}); a segment file was removed or never written",
        file.display()
    )]
    MissingSegment { expected_seq: u64, found_first_seq: u64, file: PathBuf },
    #[error(
        "damaged durable record in {} at offset {offset} (sequence {seq}): the durable \
         watermark is {watermark}, so sequence {seq}..={watermark} were made durable (and may \
         have been acknowledged); this is corruption, not a torn write; refusing to start (use \
         --repair to truncate there, discarding sequence {seq} and everything after it)",
        file.display()
    )]
    CorruptDurable { file: PathBuf, offset: u64, seq: u64, watermark: u64 },
    #[error(
        "the journal ends at sequence {last_seq} but the durable watermark is {watermark}: \
         sequence {}..={watermark} were made durable and are missing (the last segment, {}, was \
         truncated or emptied); refusing to start (--repair accepts the loss)",
        last_seq + 1,
        file.display()
    )]
    BelowWatermark { last_seq: u64, watermark: u64, file: PathBuf },
    #[error(
        "segment {} is missing: the watermark file says it was created, so it held sequence \
         {first_seq} onwards (the journal was durable through at least {watermark}); \
         refusing to start (--repair accepts the loss)",
        file.display()
    )]
    NewestSegmentMissing { file: PathBuf, first_seq: u64, watermark: u64 },
    #[error(
        "{} holds journal files but no watermark file ({}): it was removed, or the journal was \
         written by an older version; refusing to start (--repair rebuilds it from what is there)",
        dir.display(),
        crate::watermark::WATERMARK_FILE
    )]
    WatermarkMissing { dir: PathBuf },
    #[error(
        "watermark file {} is damaged ({why}); refusing to start (--repair rebuilds it from what \
         is there)",
        file.display()
    )]
    WatermarkDamaged { file: PathBuf, why: String },
    #[error(
        "segment {} holds records {first_seq}..={last_seq} but neither of its two watermark \
         slots is valid (both blank or damaged): they are the only record of how far this, the \
         newest, segment was durable, so a tail cut on a record boundary cannot be told from a \
         clean end (the rest of the journal proves only {watermark}); refusing to start \
         (--repair accepts the journal as it ends, at {last_seq})",
        file.display()
    )]
    WatermarkSlotsBlank { file: PathBuf, first_seq: u64, last_seq: u64, watermark: u64 },
    #[error("segment {} has a bad header (wrong magic or first sequence)", file.display())]
    BadSegmentHeader { file: PathBuf },
    #[error("record out of sequence: expected {expected}, got {got}")]
    OutOfSequence { expected: u64, got: u64 },
    #[error("invalid journal configuration: {0}")]
    BadConfig(String),
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
