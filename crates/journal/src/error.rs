//! Every way opening, reading or writing a journal can fail. Each variant names what a person
//! needs to act: the file, the offset, the sequence number.

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
    #[error("segment {} has a bad header (wrong magic or first sequence)", file.display())]
    BadSegmentHeader { file: PathBuf },
    #[error("record out of sequence: expected {expected}, got {got}")]
    OutOfSequence { expected: u64, got: u64 },
    #[error("invalid journal configuration: {0}")]
    BadConfig(String),
    #[error("the journal writer has stopped (it failed or was shut down); see its error")]
    WriterStopped,
}

/// Wraps an `io::Error` with what we were doing, for `map_err`.
pub(crate) fn io_context(context: String) -> impl FnOnce(io::Error) -> JournalError {
    move |source| JournalError::Io { context, source }
}
