//! Segment files: `{first_seq:020}.seg` in the journal directory.
//!
//! The zero-padded sequence number of a segment's first record is its name, so sorting names
//! sorts segments, and a gap between one segment's last record and the next one's first is a
//! missing segment. Each file starts with a [`SEGMENT_HEADER_BYTES`] header page (magic +
//! first sequence, which must match the name, then the two durable-watermark slots of
//! [`crate::watermark`]) and is pre-allocated to its full size when created, so appends do not
//! grow the file; the unwritten rest reads as zeros, which ends the data. The header is a
//! whole page so that rewriting a watermark slot never rewrites a page holding records.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

use crate::error::{JournalError, io_context};

/// Default size of a segment file; a new segment is started when the next frame would not fit.
pub const SEGMENT_BYTES_DEFAULT: u64 = 64 * 1024 * 1024;
/// Smallest segment accepted (tests use small segments to exercise rolling): the header page
/// plus one page of records.
pub const SEGMENT_BYTES_MIN: u64 = 2 * SEGMENT_HEADER_BYTES;
/// Bytes at the start of a segment before its first frame: one page.
pub const SEGMENT_HEADER_BYTES: u64 = 4096;
/// Bytes of the header that name the segment (magic, first sequence).
const SEGMENT_NAME_BYTES: usize = 16;

/// Version 2 added the watermark slots (a version 1 segment is refused as a bad header).
const SEGMENT_MAGIC: [u8; 8] = *b"LTJSEG02";
const SEGMENT_EXTENSION: &str = "seg";

/// One segment file found in a journal directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentInfo {
    /// The sequence of its first record (its name).
    pub first_seq: u64,
    /// Its path.
    pub path: PathBuf,
}

/// The path of the segment whose first record is `first_seq`: the name sorts in sequence order.
pub fn segment_path(dir: &Path, first_seq: u64) -> PathBuf {
    dir.join(format!("{first_seq:020}.{SEGMENT_EXTENSION}"))
}

/// Parses `{digits}.{extension}`; other names are not ours and are ignored.
pub(crate) fn seq_from_name(path: &Path, extension: &str) -> Option<u64> {
    if path.extension()? != extension {
        return None;
    }
    let stem = path.file_stem()?.to_str()?;
    if stem.len() != 20 || !stem.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    stem.parse().ok()
}

/// Files of `dir` named `{seq:020}.{extension}`, sorted by sequence.
pub(crate) fn list_numbered(
    dir: &Path,
    extension: &str,
) -> Result<Vec<(u64, PathBuf)>, JournalError> {
    let entries =
        std::fs::read_dir(dir).map_err(io_context(format!("listing {}", dir.display())))?;
    let mut found = Vec::new();
    for entry in entries {
        let path = entry.map_err(io_context(format!("listing {}", dir.display())))?.path();
        if let Some(seq) = seq_from_name(&path, extension) {
            found.push((seq, path));
        }
    }
    found.sort();
    Ok(found)
}

/// The first sequence a segment file's name promises (`None`: not a segment name).
pub fn first_seq_of(path: &Path) -> Option<u64> {
    seq_from_name(path, SEGMENT_EXTENSION)
}

/// The segments of `dir`, in sequence order.
pub fn list_segments(dir: &Path) -> Result<Vec<SegmentInfo>, JournalError> {
    let found = list_numbered(dir, SEGMENT_EXTENSION)?;
    Ok(found.into_iter().map(|(first_seq, path)| SegmentInfo { first_seq, path }).collect())
}

/// Checks a segment's header against the sequence its name promises.
pub fn check_header(bytes: &[u8], segment: &SegmentInfo) -> Result<(), JournalError> {
    let header_ok = bytes.len() >= SEGMENT_NAME_BYTES
        && bytes[..8] == SEGMENT_MAGIC
        && bytes[8..16] == segment.first_seq.to_le_bytes();
    if header_ok {
        Ok(())
    } else {
        Err(JournalError::BadSegmentHeader { file: segment.path.clone() })
    }
}

/// A header of zeros or a file shorter than a header: a segment whose creation was cut short.
pub fn is_unwritten_header(bytes: &[u8]) -> bool {
    let header = &bytes[..bytes.len().min(SEGMENT_NAME_BYTES)];
    header.len() < SEGMENT_NAME_BYTES || header.iter().all(|&b| b == 0)
}

/// Creates, pre-allocates and durably names a new segment; returns it open for writing.
/// The directory is fsynced so the new name survives a crash before the first batch's sync.
/// Its first watermark slot says `first_seq - 1`: a segment is created only once every record
/// before it is durable.
pub fn create(dir: &Path, first_seq: u64, segment_bytes: u64) -> Result<File, JournalError> {
    assert!(segment_bytes >= SEGMENT_BYTES_MIN, "segment_bytes {segment_bytes} below minimum");
    let path = segment_path(dir, first_seq);
    let context = || format!("creating segment {}", path.display());
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(io_context(context()))?;
    preallocate(&file, segment_bytes).map_err(io_context(context()))?;
    write_all_at(&file, &header(first_seq), 0).map_err(io_context(context()))?;
    file.sync_all().map_err(io_context(context()))?;
    sync_dir(dir)?;
    Ok(file)
}

/// The header page of a new segment whose first record is `first_seq`: magic, first sequence,
/// and slot 0 saying `first_seq - 1` (every record before it is durable).
pub fn header(first_seq: u64) -> [u8; SEGMENT_HEADER_BYTES as usize] {
    let mut header = [0u8; SEGMENT_HEADER_BYTES as usize];
    header[..8].copy_from_slice(&SEGMENT_MAGIC);
    header[8..SEGMENT_NAME_BYTES].copy_from_slice(&first_seq.to_le_bytes());
    let slot = SLOT_OFFSETS[0] as usize;
    header[slot..slot + SLOT_BYTES].copy_from_slice(&encode_slot(first_seq, first_seq - 1));
    header
}

/// Reserves the blocks of the whole file up front (`fallocate`), so a later append neither
/// grows the file nor allocates blocks in the middle of a batch. Falls back to `set_len` (a
/// sparse file: same zeros, allocation deferred) where the file system lacks `fallocate`.
fn preallocate(file: &File, segment_bytes: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let length = libc::off_t::try_from(segment_bytes).map_err(io::Error::other)?;
    // SAFETY: the descriptor is open for writing and owned by `file` for the whole call.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, length) };
    match rc {
        0 => Ok(()),
        libc::EOPNOTSUPP | libc::EINVAL => file.set_len(segment_bytes),
        errno => Err(io::Error::from_raw_os_error(errno)),
    }
}

/// Makes `bytes[offset..]` of an existing segment zeros again (truncating a torn tail or a
/// repaired corruption), keeping its size, and syncs it.
pub fn zero_from(path: &Path, offset: u64) -> Result<(), JournalError> {
    let context = || format!("truncating {} at offset {offset}", path.display());
    let file = OpenOptions::new().write(true).open(path).map_err(io_context(context()))?;
    let segment_bytes = file.metadata().map_err(io_context(context()))?.len();
    file.set_len(offset).map_err(io_context(context()))?;
    preallocate(&file, segment_bytes).map_err(io_context(context()))?;
    file.sync_all().map_err(io_context(context()))
}

/// Writes all of `bytes` at `offset` (`pwrite`, retried until done).
pub fn write_all_at(file: &File, bytes: &[u8], offset: u64) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    file.write_all_at(bytes, offset)
}

/// fsyncs a directory, making the creation, rename or removal of its entries durable.
pub fn sync_dir(dir: &Path) -> Result<(), JournalError> {
    let context = || format!("syncing directory {}", dir.display());
    File::open(dir).map_err(io_context(context()))?.sync_all().map_err(io_context(context()))
}

// The header page's two durable-watermark slots (what they are for: `crate::watermark`).

/// Offsets of the two slots in a segment's header page: different sectors, so one torn
/// sector write cannot damage both.
pub const SLOT_OFFSETS: [u64; 2] = [512, 1024];
/// Bytes of one slot.
pub const SLOT_BYTES: usize = 24;

/// Encodes the slot recording `durable_seq` in the segment starting at `first_seq`.
pub fn encode_slot(first_seq: u64, durable_seq: u64) -> [u8; SLOT_BYTES] {
    let mut slot = [0u8; SLOT_BYTES];
    slot[..8].copy_from_slice(&durable_seq.to_le_bytes());
    slot[8..16].copy_from_slice(&first_seq.to_le_bytes());
    let crc = crc32c::crc32c(&slot[..16]);
    slot[16..20].copy_from_slice(&crc.to_le_bytes());
    slot
}

/// The value of slot `index` of a segment's bytes, if that slot is valid.
fn slot_value(bytes: &[u8], index: usize, first_seq: u64) -> Option<u64> {
    let offset = SLOT_OFFSETS[index] as usize;
    let slot = bytes.get(offset..offset + SLOT_BYTES)?;
    let crc = u32::from_le_bytes(slot[16..20].try_into().expect("4 bytes"));
    let valid = crc32c::crc32c(&slot[..16]) == crc && slot[8..16] == first_seq.to_le_bytes();
    valid.then(|| u64::from_le_bytes(slot[..8].try_into().expect("8 bytes")))
}

/// The highest valid slot of a segment's bytes (`None`: neither slot is valid).
pub fn read_slots(bytes: &[u8], first_seq: u64) -> Option<u64> {
    (0..SLOT_OFFSETS.len()).filter_map(|index| slot_value(bytes, index, first_seq)).max()
}

/// Index of the slot the next write should go to: the lower (or invalid) one, so the
/// highest value always survives a torn write.
pub fn next_slot(bytes: &[u8], first_seq: u64) -> usize {
    usize::from(slot_value(bytes, 1, first_seq) < slot_value(bytes, 0, first_seq))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_validate_per_segment_and_the_highest_valid_one_wins() {
        let mut header = vec![0u8; SEGMENT_HEADER_BYTES as usize];
        assert_eq!(read_slots(&header, 7), None);
        let [first, second] = SLOT_OFFSETS.map(|offset| offset as usize);
        header[first..first + SLOT_BYTES].copy_from_slice(&encode_slot(7, 100));
        header[second..second + SLOT_BYTES].copy_from_slice(&encode_slot(7, 90));
        assert_eq!(read_slots(&header, 7), Some(100));
        assert_eq!(next_slot(&header, 7), 1, "the lower slot is overwritten next");
        assert_eq!(read_slots(&header, 8), None, "a slot names its segment");
        header[first + 3] ^= 1;
        assert_eq!(read_slots(&header, 7), Some(90), "a damaged slot falls back to the other");
        assert_eq!(next_slot(&header, 7), 0, "and is the one overwritten next");
    }

    #[test]
    fn names_sort_in_sequence_order_and_foreign_files_are_ignored() {
        let dir = tempfile::tempdir().unwrap();
        for seq in [1000, 1, 20] {
            create(dir.path(), seq, SEGMENT_BYTES_MIN).unwrap();
        }
        std::fs::write(dir.path().join("notes.txt"), "x").unwrap();
        std::fs::write(dir.path().join("12.seg"), "short name").unwrap();
        let firsts: Vec<u64> =
            list_segments(dir.path()).unwrap().iter().map(|s| s.first_seq).collect();
        assert_eq!(firsts, [1, 20, 1000]);
    }

    #[test]
    fn created_segment_is_preallocated_with_a_matching_header() {
        let dir = tempfile::tempdir().unwrap();
        create(dir.path(), 77, 3 * SEGMENT_HEADER_BYTES).unwrap();
        let segment = list_segments(dir.path()).unwrap().remove(0);
        let bytes = std::fs::read(&segment.path).unwrap();
        assert_eq!(bytes.len() as u64, 3 * SEGMENT_HEADER_BYTES);
        check_header(&bytes, &segment).unwrap();
        assert_eq!(read_slots(&bytes, 77), Some(76), "records before it are durable");
        let renamed = SegmentInfo { first_seq: 78, path: segment.path.clone() };
        assert!(matches!(
            check_header(&bytes, &renamed),
            Err(JournalError::BadSegmentHeader { .. })
        ));
        assert!(create(dir.path(), 77, SEGMENT_BYTES_MIN).is_err(), "never overwritten");
    }
}
