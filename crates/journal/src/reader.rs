//! Reading a journal's records in order from a sequence number, checking every frame's CRC.
//!
//! This is the plain reader (tools, tests, archives). It does not judge the journal: it knows
//! no durable watermark and no snapshot, and simply stops where the valid data of the last
//! segment ends. Whether a journal may be started from, and what a damaged end means, is
//! decided by [`crate::validate()`], which recovery and `journal check` share. It does refuse
//! what it cannot read past: a bad frame with a valid one after it
//! ([`JournalError::Corrupt`]) and a gap between segments ([`JournalError::MissingSegment`]).

use std::path::{Path, PathBuf};

use crate::error::{JournalError, io_context};
use crate::frame::{self, Decoded, FRAME_HEADER_BYTES};
use crate::segment::{self, SEGMENT_HEADER_BYTES, SegmentInfo};

/// Where a torn last record starts: everything from `offset` in `file` is not journal data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TornTail {
    /// The segment it is in.
    pub file: PathBuf,
    /// Where the torn record starts.
    pub offset: u64,
}

/// The end of the valid data: the last segment and the offset where the next frame goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndPosition {
    /// The last segment.
    pub file: PathBuf,
    /// Where its next frame goes.
    pub offset: u64,
}

struct Loaded {
    segment: SegmentInfo,
    bytes: Vec<u8>,
    offset: usize,
    is_last: bool,
}

/// Iterates the records of a journal directory in sequence order (see the module docs).
pub struct JournalReader {
    segments: Vec<SegmentInfo>,
    next_index: usize,
    current: Option<Loaded>,
    expected_seq: Option<u64>,
    from_seq: u64,
}

impl JournalReader {
    /// Opens `dir` to read records with sequence >= `from_seq`. Segments that end before
    /// `from_seq` are not read at all (they may already be removed after a snapshot).
    pub fn open(dir: &Path, from_seq: u64) -> Result<JournalReader, JournalError> {
        let mut segments = segment::list_segments(dir)?;
        let first_needed = segments.iter().rposition(|s| s.first_seq <= from_seq).unwrap_or(0);
        segments.drain(..first_needed);
        if let Some(first) = segments.first()
            && first.first_seq > from_seq
        {
            return Err(JournalError::MissingSegment {
                expected_seq: from_seq,
                found_first_seq: first.first_seq,
                file: first.path.clone(),
            });
        }
        Ok(JournalReader { segments, next_index: 0, current: None, expected_seq: None, from_seq })
    }

    /// The next record at or after `from_seq`: `Ok(None)` at the end of the data.
    pub fn next_record(&mut self) -> Result<Option<(u64, &[u8])>, JournalError> {
        let (seq, start, len) = loop {
            if self.current.is_none() && !self.load_next()? {
                return Ok(None);
            }
            let loaded = self.current.as_mut().expect("loaded above");
            let expected = self.expected_seq.expect("set when a segment is loaded");
            match frame::decode(&loaded.bytes[loaded.offset..]) {
                Decoded::Valid { seq, payload, frame_bytes } if seq == expected => {
                    let start = loaded.offset + FRAME_HEADER_BYTES;
                    let len = payload.len();
                    loaded.offset += frame_bytes;
                    self.expected_seq = Some(seq + 1);
                    if seq >= self.from_seq {
                        break (seq, start, len);
                    }
                }
                Decoded::End => self.finish_segment(false)?,
                Decoded::Valid { .. } | Decoded::Invalid => self.finish_segment(true)?,
            }
        };
        let loaded = self.current.as_ref().expect("a record was just read from it");
        Ok(Some((seq, &loaded.bytes[start..start + len])))
    }

    fn load_next(&mut self) -> Result<bool, JournalError> {
        let Some(segment) = self.segments.get(self.next_index).cloned() else {
            return Ok(false);
        };
        let bytes = std::fs::read(&segment.path)
            .map_err(io_context(format!("reading segment {}", segment.path.display())))?;
        let is_last = self.next_index + 1 == self.segments.len();
        if is_last && segment::is_unwritten_header(&bytes) {
            // A segment whose creation was cut short holds no data.
            self.next_index = self.segments.len();
            return Ok(false);
        }
        segment::check_header(&bytes, &segment)?;
        if let Some(expected) = self.expected_seq
            && segment.first_seq != expected
        {
            return Err(JournalError::MissingSegment {
                expected_seq: expected,
                found_first_seq: segment.first_seq,
                file: segment.path,
            });
        }
        self.expected_seq = Some(segment.first_seq);
        self.next_index += 1;
        self.current =
            Some(Loaded { segment, bytes, offset: SEGMENT_HEADER_BYTES as usize, is_last });
        Ok(true)
    }

    /// The data of the current segment ended at its offset, cleanly or at a bad frame.
    fn finish_segment(&mut self, bad_frame: bool) -> Result<(), JournalError> {
        let loaded = self.current.as_ref().expect("finishing a loaded segment");
        let expected = self.expected_seq.expect("set when a segment is loaded");
        let rest = &loaded.bytes[loaded.offset..];
        let valid_after = loaded.is_last && frame::find_valid_after(rest, expected - 1).is_some();
        if (bad_frame && !loaded.is_last) || valid_after {
            let (file, offset) = (loaded.segment.path.clone(), loaded.offset as u64);
            return Err(JournalError::Corrupt { file, offset, seq: expected });
        }
        if loaded.is_last {
            self.next_index = self.segments.len();
        }
        self.current = None;
        Ok(())
    }
}
