//! Where a gateway without a tier (`crate::remote`) resumes reading each (shard, slot)'s
//! reports after a restart: a hint kept *behind* what its session store holds (the store's
//! routed positions, `crate::routed`, decide what is routed again; this file only saves
//! re-reading the whole stream).
//!
//! One small file per (shard, outlet) under the store directory,
//! `delivered/shard-{S}-slot-{G}`: a magic and, per stream ([`Stream::ALL`] order), the next
//! sequence to read (0: none kept yet: a gateway that never handed a record on starts at the
//! first sequence it hears, `delivery::edge::FIRST_SEQ_HEARD`, rather than at the stream's
//! start, which a running exchange left far behind). For reports it is the first report of the
//! newest input whose routed position is durable in the store; it is rewritten in place (one
//! `pwrite` of [`MARK_BYTES`]) when it moved, at most every 50 ms (`RESUME_WRITE_INTERVAL`
//! in `crate::remote`), not per report or batch. A position older than the store's costs a re-read (the
//! hub drops what it routed already); market data resumes after what was handed on.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use delivery::wire::Stream;

/// Magic of a delivered-position file.
const MAGIC: &[u8; 8] = b"LTDLVRD1";
/// Bytes of a position: the magic, then one little-endian u64 per stream.
pub const MARK_BYTES: usize = MAGIC.len() + 8 * Stream::ALL.len();

/// One (shard, slot)'s delivered position, open for rewriting.
pub struct DeliveredMark {
    file: File,
    /// Per stream, the next sequence to hand on (0: none kept).
    next_seqs: [u64; 2],
    /// What the file holds.
    written: [u64; 2],
}

impl DeliveredMark {
    /// Opens (creating when missing) the position of `shard`'s reports for `slot` under
    /// `store_dir`. A file that does not hold a position (damaged, or not ours) is an error
    /// naming it: starting from 1 would route every retained report again.
    pub fn open(store_dir: &Path, shard: u32, slot: u32) -> std::io::Result<DeliveredMark> {
        let dir = store_dir.join("delivered");
        std::fs::create_dir_all(&dir)?;
        let path = dir.join(format!("shard-{shard}-slot-{slot}"));
        let file =
            File::options().read(true).write(true).create(true).truncate(false).open(&path)?;
        let mut bytes = [0u8; MARK_BYTES];
        let read = file.read_at(&mut bytes, 0)?;
        let next_seqs = match read {
            0 => [0; 2],
            MARK_BYTES if &bytes[..MAGIC.len()] == MAGIC => [u64_at(&bytes, 0), u64_at(&bytes, 1)],
            _ => {
                let why = format!("{} holds no delivered position ({read} bytes)", path.display());
                return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, why));
            }
        };
        Ok(DeliveredMark { file, next_seqs, written: next_seqs })
    }

    /// Per stream, the first sequence not yet handed on (what the delivery edge starts at; 0:
    /// none kept, from the first sequence heard).
    pub fn first_seqs(&self) -> [u64; 2] {
        self.next_seqs
    }

    /// Notes that `stream`'s records up to `seq` were handed on (kept in memory until
    /// [`DeliveredMark::write_if_moved`]).
    pub fn handed_on(&mut self, stream: Stream, seq: u64) {
        self.keep_from(stream, seq + 1);
    }

    /// Notes that a restart may start `stream` at `next_seq` (positions only move forward).
    pub fn keep_from(&mut self, stream: Stream, next_seq: u64) {
        let next = &mut self.next_seqs[stream as usize];
        *next = (*next).max(next_seq);
    }

    /// Rewrites the file with the position noted so far, if it moved (one `pwrite`).
    pub fn write_if_moved(&mut self) -> std::io::Result<()> {
        if self.written == self.next_seqs {
            return Ok(());
        }
        let mut bytes = [0u8; MARK_BYTES];
        bytes[..MAGIC.len()].copy_from_slice(MAGIC);
        for (index, next) in self.next_seqs.iter().enumerate() {
            let at = MAGIC.len() + 8 * index;
            bytes[at..at + 8].copy_from_slice(&next.to_le_bytes());
        }
        self.file.write_all_at(&bytes, 0)?;
        self.written = self.next_seqs;
        Ok(())
    }
}

fn u64_at(bytes: &[u8; MARK_BYTES], index: usize) -> u64 {
    let at = MAGIC.len() + 8 * index;
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes inside a mark"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_position_survives_reopening_and_a_damaged_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut mark = DeliveredMark::open(dir.path(), 1, 0).unwrap();
        assert_eq!(mark.first_seqs(), [0, 0], "a new gateway starts at the first heard");
        mark.handed_on(Stream::Reports, 12);
        mark.handed_on(Stream::Reports, 7);
        mark.handed_on(Stream::MarketData, 30);
        mark.write_if_moved().unwrap();
        drop(mark);
        let mark = DeliveredMark::open(dir.path(), 1, 0).unwrap();
        assert_eq!(mark.first_seqs(), [13, 31], "positions only grow, and are kept");
        assert_eq!(DeliveredMark::open(dir.path(), 0, 0).unwrap().first_seqs(), [0, 0]);
        std::fs::write(dir.path().join("delivered/shard-1-slot-0"), b"not a position").unwrap();
        let refused = DeliveredMark::open(dir.path(), 1, 0).err().expect("refused");
        assert!(refused.to_string().contains("holds no delivered position"), "{refused}");
    }
}
