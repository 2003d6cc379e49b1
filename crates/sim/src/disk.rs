//! A simulated disk under one file: writes land in a page cache, a sync makes the sectors
//! written before it durable when it completes, a power failure loses what was not synced
//! (and may tear the last sector being written back), a durable sector's bytes may flip, and
//! a full disk refuses writes for a while.

use std::collections::BTreeSet;

use crate::rng::Rng;

/// Bytes of a sector: the unit a write-back persists (or tears).
pub const SECTOR_BYTES: usize = 512;

/// A write refused: the disk is full.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DiskFull;

/// The sectors a sync in flight makes durable, as they were when it was issued.
#[derive(Debug, Default)]
pub struct PendingSync {
    sectors: Vec<(usize, Vec<u8>)>,
}

/// One file on one disk.
#[derive(Debug, Default)]
pub struct SimDisk {
    /// What the process reads: every write, synced or not.
    pub cache: Vec<u8>,
    /// What a power failure leaves.
    durable: Vec<u8>,
    /// Sectors written since the sync that captured them.
    dirty: BTreeSet<usize>,
    /// Writes are refused until this true time, ns.
    pub full_until_ns: u64,
}

impl SimDisk {
    /// A file whose first bytes are `bytes`, durable (created and synced).
    pub fn created(bytes: &[u8]) -> SimDisk {
        SimDisk { cache: bytes.to_vec(), durable: bytes.to_vec(), ..SimDisk::default() }
    }

    /// Writes `bytes` at `offset` into the page cache; refused while the disk is full.
    pub fn write(&mut self, offset: usize, bytes: &[u8], now_ns: u64) -> Result<(), DiskFull> {
        if now_ns < self.full_until_ns {
            return Err(DiskFull);
        }
        self.write_reserved(offset, bytes);
        Ok(())
    }

    /// Writes into space already allocated (a header page): a full disk does not refuse it.
    pub fn write_reserved(&mut self, offset: usize, bytes: &[u8]) {
        let end = offset + bytes.len();
        if self.cache.len() < end {
            self.cache.resize(end, 0);
        }
        self.cache[offset..end].copy_from_slice(bytes);
        self.dirty.extend(offset / SECTOR_BYTES..end.div_ceil(SECTOR_BYTES));
    }

    /// Starts a sync: the sectors written so far, as they are now.
    pub fn begin_sync(&mut self) -> PendingSync {
        let sectors = std::mem::take(&mut self.dirty)
            .into_iter()
            .map(|sector| (sector, self.sector(&self.cache, sector).to_vec()))
            .collect();
        PendingSync { sectors }
    }

    /// A sync completed: what it captured is durable.
    pub fn complete_sync(&mut self, sync: PendingSync) {
        for (sector, bytes) in sync.sectors {
            self.persist(sector, &bytes);
        }
    }

    /// Everything written is durable (a clean shutdown's last sync).
    pub fn sync_all(&mut self) {
        let sync = self.begin_sync();
        self.complete_sync(sync);
    }

    /// A power failure: the page cache is lost. With `tear`, the write-back in progress
    /// persisted a random share of the unsynced sectors (`in_flight` among them) and tore the
    /// last one: its new bytes up to a random point, garbage where it changed after that.
    pub fn power_loss(
        &mut self,
        in_flight: impl IntoIterator<Item = PendingSync>,
        tear: Option<&mut Rng>,
    ) {
        if let Some(rng) = tear {
            let mut unsynced: Vec<(usize, Vec<u8>)> =
                in_flight.into_iter().flat_map(|s| s.sectors).collect();
            let dirty = std::mem::take(&mut self.dirty);
            unsynced.extend(dirty.into_iter().map(|s| (s, self.sector(&self.cache, s).to_vec())));
            unsynced.sort_by_key(|(sector, _)| *sector);
            if let Some((last, bytes)) = unsynced.pop() {
                let torn = self.torn(last, &bytes, rng);
                self.persist(last, &torn);
            }
            for (sector, bytes) in unsynced {
                if rng.chance(0.5) {
                    self.persist(sector, &bytes);
                }
            }
        }
        self.dirty.clear();
        self.cache.clone_from(&self.durable);
    }

    /// `new` (sector `sector`'s content being written back) torn at a random point.
    fn torn(&self, sector: usize, new: &[u8], rng: &mut Rng) -> Vec<u8> {
        let old = self.sector(&self.durable, sector).to_vec();
        let cut = rng.range(0, new.len() as u64 + 1) as usize;
        let mut torn = new.to_vec();
        for at in cut..torn.len() {
            if old.get(at).copied().unwrap_or(0) != new[at] {
                torn[at] = rng.next_u64() as u8;
            }
        }
        torn
    }

    /// The bytes a power failure leaves.
    pub fn durable(&self) -> &[u8] {
        &self.durable
    }

    /// Flips a bit of each of 1–8 bytes at `offset..` (within its sector), durable and cached.
    pub fn flip(&mut self, offset: usize, rng: &mut Rng) {
        let sector_end = (offset / SECTOR_BYTES + 1) * SECTOR_BYTES;
        let end = sector_end.min(self.durable.len()).min(offset + rng.range(1, 9) as usize);
        for at in offset..end {
            let bit = 1u8 << rng.range(0, 8);
            self.durable[at] ^= bit;
            if let Some(byte) = self.cache.get_mut(at) {
                *byte ^= bit;
            }
        }
    }

    /// `bytes[offset..]` zeros again, durably (production's `segment::zero_from`).
    pub fn zero_from(&mut self, offset: usize) {
        for bytes in [&mut self.cache, &mut self.durable] {
            bytes.truncate(offset);
        }
        self.dirty.retain(|sector| sector * SECTOR_BYTES < offset);
    }

    fn sector<'a>(&self, bytes: &'a [u8], sector: usize) -> &'a [u8] {
        let start = (sector * SECTOR_BYTES).min(bytes.len());
        &bytes[start..((sector + 1) * SECTOR_BYTES).min(bytes.len())]
    }

    fn persist(&mut self, sector: usize, bytes: &[u8]) {
        let start = sector * SECTOR_BYTES;
        if self.durable.len() < start + bytes.len() {
            self.durable.resize(start + bytes.len(), 0);
        }
        self.durable[start..start + bytes.len()].copy_from_slice(bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsynced_writes_are_lost_synced_ones_survive_and_a_full_disk_refuses() {
        let mut disk = SimDisk::created(&[1; 600]);
        disk.write(600, &[2; 100], 0).unwrap();
        let sync = disk.begin_sync();
        disk.write(700, &[3; 10], 0).unwrap();
        disk.complete_sync(sync);
        disk.power_loss(None, None);
        assert_eq!(disk.cache.len(), 700, "the write after the sync's start is gone");
        assert_eq!(&disk.cache[600..700], &[2; 100]);
        disk.full_until_ns = 10;
        assert_eq!(disk.write(700, &[4], 5), Err(DiskFull));
        assert!(disk.write(700, &[4], 10).is_ok());
    }

    #[test]
    fn a_torn_write_back_changes_only_bytes_that_were_being_written() {
        let mut rng = Rng::new(7);
        for _ in 0..100 {
            let mut disk = SimDisk::created(&[9; 700]);
            disk.write(700, &[5; 200], 0).unwrap();
            disk.power_loss(None, Some(&mut rng));
            assert_eq!(&disk.cache[..700], &[9; 700], "durable bytes are never torn");
        }
    }
}
