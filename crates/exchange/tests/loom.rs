//! Model checks of the master-data snapshot cell, the crate's hand-made memory reclamation.
//! Run with:
//! `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p leantier-exchange --release --test loom`
//! Without `--cfg loom` this file compiles to nothing.
//!
//! Under loom every read of a snapshot and its free are tracked cell accesses
//! (`Tracked` in the crate's `sync` module): a read not ordered before the free (use after free) or not
//! ordered after the snapshot was built (torn data) fails the model as a causality violation.
#![cfg(loom)]

use exchange::master::{Client, MasterData, MasterUpdate, SnapshotCell};
use loom::thread;

/// Bounded model checking: every interleaving with at most this many preemptions.
const PREEMPTION_BOUND: usize = 3;
/// Versions the writer publishes after the initial one.
const PUBLISHES: u64 = 2;

fn model(test: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(PREEMPTION_BOUND);
    builder.check(test);
}

/// Master data whose one client limit equals `version`, so a reader can tell a snapshot's
/// contents from its version.
fn data(version: u64) -> MasterData {
    let client = Client { enabled: true, order_value_max: version };
    MasterData { version, instruments: Vec::new(), clients: vec![Some(client)] }
}

fn limit(master: &MasterData) -> u64 {
    master.client(0).expect("client 0").order_value_max
}

/// Publishes versions 2..=1 + PUBLISHES, each carrying its own version as client 0's limit.
fn publish_all(cell: &SnapshotCell) {
    for version in 2..=1 + PUBLISHES {
        let mut next = cell.load_copy();
        let update =
            MasterUpdate::ClientLimit { client: 0, enabled: true, order_value_max: version };
        next.apply(&update).expect("client 0 exists");
        cell.publish(next);
    }
}

/// Two readers refresh while the writer publishes and frees: every snapshot a reader gets is
/// whole (its contents match its version), versions never go back, and loom sees no read of a
/// freed or half-published snapshot.
#[test]
fn a_reader_never_sees_freed_or_torn_data() {
    model(|| {
        let cell = SnapshotCell::new(data(1));
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let mut reader = cell.reader().expect("a reader slot");
                thread::spawn(move || {
                    let mut last = 0;
                    for _ in 0..2 {
                        let snapshot = reader.current();
                        assert_eq!(limit(snapshot), snapshot.version, "torn snapshot");
                        assert!(snapshot.version >= last, "versions go back");
                        last = snapshot.version;
                    }
                })
            })
            .collect();
        publish_all(&cell);
        for reader in readers {
            reader.join().unwrap();
        }
    });
}

/// Once `publish` returned (here: the writer thread was joined), a reader's next look returns
/// that version, whatever it saw meanwhile; and the versions it no longer uses are freed.
#[test]
fn every_published_version_becomes_visible() {
    model(|| {
        let cell = SnapshotCell::new(data(1));
        let mut reader = cell.reader().expect("a reader slot");
        let writer = {
            let cell = cell.clone();
            thread::spawn(move || publish_all(&cell))
        };
        let early = reader.current().version;
        assert!((1..=1 + PUBLISHES).contains(&early));
        writer.join().unwrap();
        let snapshot = reader.current();
        assert_eq!(snapshot.version, 1 + PUBLISHES, "the last publish is visible");
        assert_eq!(limit(snapshot), 1 + PUBLISHES);
        drop(reader);
        cell.publish(cell.load_copy());
        assert_eq!(cell.retained_versions(), 1, "versions no reader holds are freed");
    });
}
