//! Master data (instruments, clients) as immutable, versioned snapshots, and the cell that
//! publishes them to the pre-process workers without locks on the read path.
//!
//! The master-data process is the cell's single writer: it applies an update to a copy of the
//! current snapshot and publishes the copy. A pre-process worker reads through its own
//! [`SnapshotReader`]: one atomic load per message in the common case (version unchanged), and
//! on a new version an announce-then-load handshake, a one-slot hazard scheme:
//!
//! * reader: `announced.store(v, Release)` then `current.load(Acquire)`;
//! * writer: `current.store(new, Release)`, `version.store(new version, Release)`, then loads
//!   every `announced` (Acquire) and frees the retired snapshots older than the smallest
//!   announced version.
//!
//! A reader announces the version v it loaded, and the snapshot it then loads is v or newer
//! (`version` is stored after `current`), so a snapshot a reader holds is never older than its
//! own announcement, and the writer frees only versions older than every announcement it
//! sees. A reader always has an announcement in place (the one made at registration, under the
//! writer lock, or at its last refresh) and announcements only grow, so a scan that reads a
//! stale, older announcement frees less, never more: unlike hazard pointers or epochs, there is
//! no moment in which a reader uses a snapshot it has not announced, so no SeqCst store-load
//! handshake is needed. The Release store of a new announcement, read by the writer's Acquire
//! scan, orders the reader's reads of its previous snapshot before that snapshot's free. An
//! idle reader pins the versions from its own onwards; updates are rare, so the retired list
//! stays short. `tests/loom.rs` model-checks the protocol.

use std::sync::Arc;

use crate::book::Listing;
use crate::msg::{ClientId, InstrumentId, Price, Qty};
use crate::sync::{AtomicPtr, AtomicU64, Mutex, Ordering, Tracked, free};

/// Pre-process workers (snapshot readers) one cell supports.
#[cfg(not(loom))]
pub const SNAPSHOT_READERS_MAX: usize = 64;
/// Under loom: every reader slot is one more atomic load per publish for loom to interleave,
/// and the models use at most two readers.
#[cfg(loom)]
pub const SNAPSHOT_READERS_MAX: usize = 2;
/// Unused reader slot.
const NOT_READING: u64 = u64::MAX;

/// Trading status of an instrument.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Status {
    Active,
    Inactive,
}

/// An instrument's reference data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Instrument {
    /// Ladder geometry in the core (fixed at listing: the tick never changes intraday).
    pub listing: Listing,
    pub lot: Qty,
    pub qty_max: Qty,
    /// Inclusive price band, always on the ladder.
    pub band_low: Price,
    pub band_high: Price,
    pub status: Status,
    /// Halt or circuit breaker in force (set by the external events process).
    pub halted: bool,
}

/// A client's reference data and limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Client {
    pub enabled: bool,
    /// Largest value (price x quantity) of one order.
    pub order_value_max: u64,
}

/// One immutable version of the master data. Ids are dense: the tables are indexed by id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MasterData {
    pub version: u64,
    pub instruments: Vec<Option<Instrument>>,
    pub clients: Vec<Option<Client>>,
}

impl MasterData {
    pub fn instrument(&self, id: InstrumentId) -> Option<&Instrument> {
        self.instruments.get(id as usize)?.as_ref()
    }

    pub fn client(&self, id: ClientId) -> Option<&Client> {
        self.clients.get(id as usize)?.as_ref()
    }

    /// Every instrument's listing. Each core shard lists every instrument, so the pipeline's
    /// by-instrument route alone decides which shard owns which book.
    pub fn listings(&self) -> Vec<Listing> {
        self.instruments.iter().flatten().map(|i| i.listing).collect()
    }

    /// Applies one update; an update that names an unknown id or would put the band off the
    /// ladder is refused (and counted by the caller).
    pub fn apply(&mut self, update: &MasterUpdate) -> Result<(), &'static str> {
        match *update {
            MasterUpdate::None => Ok(()),
            MasterUpdate::ClientLimit { client, enabled, order_value_max } => {
                *self.client_mut(client)? = Client { enabled, order_value_max };
                Ok(())
            }
            MasterUpdate::InstrumentStatus { instrument, status } => {
                self.instrument_mut(instrument)?.status = status;
                Ok(())
            }
            MasterUpdate::InstrumentLimits { instrument, lot, qty_max } => {
                if lot == 0 || qty_max < lot {
                    return Err("lot must be > 0 and <= qty_max");
                }
                let entry = self.instrument_mut(instrument)?;
                entry.lot = lot;
                entry.qty_max = qty_max;
                Ok(())
            }
            MasterUpdate::Halted { instrument, halted } => {
                self.instrument_mut(instrument)?.halted = halted;
                Ok(())
            }
            MasterUpdate::Band { instrument, low, high } => {
                let entry = self.instrument_mut(instrument)?;
                if !band_fits(&entry.listing, low, high) {
                    return Err("band must be on tick and on the ladder");
                }
                entry.band_low = low;
                entry.band_high = high;
                Ok(())
            }
        }
    }

    fn instrument_mut(&mut self, id: InstrumentId) -> Result<&mut Instrument, &'static str> {
        self.instruments.get_mut(id as usize).and_then(Option::as_mut).ok_or("unknown instrument")
    }

    fn client_mut(&mut self, id: ClientId) -> Result<&mut Client, &'static str> {
        self.clients.get_mut(id as usize).and_then(Option::as_mut).ok_or("unknown client")
    }
}

/// A change to the master data, as a fixed-size record (it travels on a ring).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MasterUpdate {
    #[default]
    None,
    InstrumentStatus {
        instrument: InstrumentId,
        status: Status,
    },
    InstrumentLimits {
        instrument: InstrumentId,
        lot: Qty,
        qty_max: Qty,
    },
    ClientLimit {
        client: ClientId,
        enabled: bool,
        order_value_max: u64,
    },
    /// Sent by the external events process so the pre-process sees halts early.
    Halted {
        instrument: InstrumentId,
        halted: bool,
    },
    /// Sent by the external events process on a price-band change.
    Band {
        instrument: InstrumentId,
        low: Price,
        high: Price,
    },
}

/// Whether `low..=high` is a band `listing` can hold: both ends on tick and on the ladder,
/// the low end not above the high one (what a band update, or an operator's band event, must
/// be).
pub(crate) fn band_fits(listing: &Listing, low: Price, high: Price) -> bool {
    listing.level_of(low).is_some() && listing.level_of(high).is_some() && low <= high
}

/// Publishes [`MasterData`] versions to readers (see the module docs for the protocol).
pub struct SnapshotCell {
    current: AtomicPtr<Snapshot>,
    /// Version of `current`; readers compare it with their cached version.
    version: AtomicU64,
    /// Per reader: the oldest version it may still be using, or [`NOT_READING`].
    announced: [AtomicU64; SNAPSHOT_READERS_MAX],
    /// Writer side only: every published snapshot not yet freed (current included). The lock
    /// is taken by the single writer and by reader registration, never on the read path.
    retired: Mutex<Vec<*mut Snapshot>>,
}

/// One published version, boxed; freed by hand (`crate::sync::free`).
type Snapshot = Tracked<MasterData>;

// SAFETY: the raw pointers in `retired` and `current` are owned boxes of `MasterData` (which is
// Send + Sync); they are only freed by the writer under the protocol in the module docs.
unsafe impl Send for SnapshotCell {}
// SAFETY: as above; shared access goes through atomics and the writer-side mutex.
unsafe impl Sync for SnapshotCell {}

impl SnapshotCell {
    pub fn new(mut initial: MasterData) -> Arc<SnapshotCell> {
        initial.version = initial.version.max(1);
        let version = initial.version;
        let first = Box::into_raw(Box::new(Tracked::new(initial)));
        Arc::new(SnapshotCell {
            current: AtomicPtr::new(first),
            version: AtomicU64::new(version),
            announced: std::array::from_fn(|_| AtomicU64::new(NOT_READING)),
            retired: Mutex::new(vec![first]),
        })
    }

    /// A copy of the current snapshot (for the writer to modify, or for inspection).
    pub fn load_copy(&self) -> MasterData {
        let retired = self.retired.lock().expect("snapshot writer lock");
        let current = self.current.load(Ordering::Acquire); // Acquire: see the snapshot's contents.
        // SAFETY: holding the writer lock, nothing frees `current` (only `publish` frees, under it).
        let copy = unsafe { (*current).get().clone() };
        drop(retired);
        copy
    }

    /// Publishes `next` as the new version (the master-data process is the only caller).
    pub fn publish(&self, mut next: MasterData) -> u64 {
        let mut retired = self.retired.lock().expect("snapshot writer lock");
        let version = self.version.load(Ordering::Relaxed) + 1; // Relaxed: only this writer stores it.
        next.version = version;
        let fresh = Box::into_raw(Box::new(Tracked::new(next)));
        // Release: a reader that loads the pointer sees the snapshot's contents.
        self.current.store(fresh, Ordering::Release);
        // Release: a reader that sees the new version also sees the snapshot it names.
        self.version.store(version, Ordering::Release);
        retired.push(fresh);
        // Acquire: pairs with each reader's Release announcement, so its reads of the versions
        // it announced past happen before they are freed below.
        let oldest_in_use =
            self.announced.iter().map(|a| a.load(Ordering::Acquire)).min().unwrap_or(NOT_READING);
        retired.retain(|&snapshot| {
            // SAFETY: every pointer in `retired` is a live box until freed right here.
            let old = unsafe { (*snapshot).get().version } < oldest_in_use && snapshot != fresh;
            if old {
                // SAFETY: every reader holds a snapshot no older than its announcement, and its
                // announcement is no older than what this scan read (module docs), so none holds
                // this one; it leaves `retired` here, so it is freed exactly once.
                unsafe { free(snapshot) };
            }
            !old
        });
        version
    }

    /// Registers a reader; `None` when [`SNAPSHOT_READERS_MAX`] readers exist.
    pub fn reader(self: &Arc<SnapshotCell>) -> Option<SnapshotReader> {
        let _writer = self.retired.lock().expect("snapshot writer lock");
        let version = self.version.load(Ordering::Acquire); // Acquire: pairs with publish's Release.
        let slot = self.announced.iter().position(|a| {
            // AcqRel: claims a free slot atomically; holding the writer lock, no publish scans
            // concurrently, so the announcement is in place before the next scan.
            a.compare_exchange(NOT_READING, version, Ordering::AcqRel, Ordering::Relaxed).is_ok()
        })?;
        // Holding the writer lock, `current` cannot change or be freed; the announce above
        // protects it afterwards.
        let current = self.current.load(Ordering::Acquire);
        // SAFETY: `current` is live (see above).
        let cached_version = unsafe { (*current).get().version };
        Some(SnapshotReader { cell: Arc::clone(self), slot, cached: current, cached_version })
    }

    /// Snapshots not yet freed (bounded by updates while some reader idles).
    pub fn retained_versions(&self) -> usize {
        self.retired.lock().expect("snapshot writer lock").len()
    }
}

impl Drop for SnapshotCell {
    fn drop(&mut self) {
        let mut retired = self.retired.lock().expect("snapshot writer lock");
        for snapshot in retired.drain(..) {
            // SAFETY: no reader exists (each holds an Arc of the cell); each box freed once.
            unsafe { free(snapshot) };
        }
    }
}

/// One pre-process worker's handle on the snapshots.
pub struct SnapshotReader {
    cell: Arc<SnapshotCell>,
    slot: usize,
    cached: *const Snapshot,
    cached_version: u64,
}

// SAFETY: the reader owns its slot; the snapshot it points at is immutable and kept alive by
// its announcement, so moving the reader to another thread is fine.
unsafe impl Send for SnapshotReader {}

impl SnapshotReader {
    /// The newest snapshot: one Acquire load when nothing changed.
    pub fn current(&mut self) -> &MasterData {
        // Acquire: pairs with publish's Release store of the version.
        let version = self.cell.version.load(Ordering::Acquire);
        if version != self.cached_version {
            // Release: our reads of the snapshot we announced before happen before its free
            // (the writer's scan loads this with Acquire).
            self.cell.announced[self.slot].store(version, Ordering::Release);
            // Acquire: pairs with publish's Release store; we read the snapshot's contents.
            let current = self.cell.current.load(Ordering::Acquire);
            self.cached = current;
            // SAFETY: announced <= current's version, so the writer keeps it.
            self.cached_version = unsafe { (*current).get().version };
        }
        // SAFETY: as above; the announcement stays until the next refresh, which takes &mut self.
        unsafe { (*self.cached).get() }
    }
}

impl Drop for SnapshotReader {
    fn drop(&mut self) {
        // Release: our reads of the snapshot happen before the writer's scan (Acquire) sees the
        // slot free and frees it.
        self.cell.announced[self.slot].store(NOT_READING, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data() -> MasterData {
        let listing = Listing { instrument: 0, ladder_low: 100, tick: 1, levels: 100 };
        let instrument = Instrument {
            listing,
            lot: 1,
            qty_max: 100,
            band_low: 100,
            band_high: 199,
            status: Status::Active,
            halted: false,
        };
        MasterData { version: 0, instruments: vec![Some(instrument)], clients: vec![None] }
    }

    #[test]
    fn readers_see_new_versions_and_old_ones_are_freed() {
        let cell = SnapshotCell::new(data());
        let mut reader = cell.reader().unwrap();
        assert_eq!(reader.current().version, 1);
        let mut next = cell.load_copy();
        next.apply(&MasterUpdate::Halted { instrument: 0, halted: true }).unwrap();
        assert_eq!(cell.publish(next), 2);
        assert!(reader.current().instrument(0).unwrap().halted);
        // The reader now announces version 2, so publishing 3 frees 1 and 2 stays until the
        // reader refreshes.
        cell.publish(cell.load_copy());
        assert_eq!(cell.retained_versions(), 2);
        assert_eq!(reader.current().version, 3);
        cell.publish(cell.load_copy());
        assert_eq!(cell.retained_versions(), 2);
        drop(reader);
        cell.publish(cell.load_copy());
        assert_eq!(cell.retained_versions(), 1);
    }

    #[test]
    fn invalid_updates_are_refused() {
        let mut master = data();
        assert!(master.apply(&MasterUpdate::Band { instrument: 0, low: 50, high: 150 }).is_err());
        assert!(master.apply(&MasterUpdate::Halted { instrument: 9, halted: true }).is_err());
        assert!(
            master
                .apply(&MasterUpdate::ClientLimit { client: 0, enabled: true, order_value_max: 1 })
                .is_err()
        );
        assert!(
            master
                .apply(&MasterUpdate::InstrumentLimits { instrument: 0, lot: 0, qty_max: 1 })
                .is_err()
        );
    }

    #[test]
    fn concurrent_reads_during_publishes_never_see_freed_data() {
        let cell = SnapshotCell::new(data());
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let mut reader = cell.reader().unwrap();
                std::thread::spawn(move || {
                    let mut last = 0;
                    for _ in 0..20_000 {
                        let snapshot = reader.current();
                        assert!(snapshot.version >= last);
                        assert_eq!(snapshot.instruments.len(), 1);
                        last = snapshot.version;
                    }
                })
            })
            .collect();
        for _ in 0..2_000 {
            cell.publish(cell.load_copy());
        }
        for reader in readers {
            reader.join().unwrap();
        }
    }
}
