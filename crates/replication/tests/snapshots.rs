//! Snapshots and trimming on a real three-node JetStream cluster: the leader writes its shard's
//! snapshot every `EVERY` inputs and trims the log below it (and below every live engine's
//! progress); an engine started afterwards restores the snapshot (the log no longer holds the
//! inputs before it), catches up, takes over, and numbers its reports as the group did: the
//! consumer sees every report once, in sequence.

mod common;

use std::time::Duration;

use common::{client_reports, engine_options, shard_zero_consumer, wait_for};
use delivery::nats::NatsConnect;
use exchange::durability::JournalMode;
use exchange::flow::reference_master_data;
use exchange::msg::{InboundOrder, request_kind};
use exchange::tier::TierConfig;
use experiments::cluster::Cluster;
use replication::append::{AppendId, OrderLog};
use replication::engine::{Engine, EngineOptions};
use replication::layout::LogSettings;
use replication::snapshot::SnapshotStore;

/// Inputs between two snapshots.
const EVERY: u64 = 100;

fn options(url: &str, holder: &str) -> EngineOptions {
    let tier = TierConfig {
        outlets: 1,
        journal: JournalMode::OFF,
        snapshot_every_records: EVERY,
        ..TierConfig::parked()
    };
    engine_options(url, holder, tier)
}

/// Orders that rest on both sides without crossing (the snapshot holds a real book), every
/// fifth refused by the pre-process: each gets exactly one client report.
fn order(seq: u64) -> InboundOrder {
    let master = reference_master_data(&TierConfig::default().universe);
    let listed = master.instrument(1).unwrap();
    let buy = seq.is_multiple_of(2);
    InboundOrder {
        kind: request_kind::NEW,
        side: if buy { exchange::msg::Side::Buy } else { exchange::msg::Side::Sell } as u8,
        instrument: 1,
        client: 1 + (seq % 4) as u32,
        order_id: seq,
        price: if buy { listed.band_low } else { listed.band_high },
        qty: if seq.is_multiple_of(5) { 0 } else { 1 },
        ..InboundOrder::default()
    }
}

#[test]
fn a_restored_engine_continues_the_groups_books_and_numbering_on_a_trimmed_log() {
    let cluster = Cluster::start(3).unwrap();
    let url = cluster.url();
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (_gateway, tally) = shard_zero_consumer(&rt, &url);
    let (log, store) = rt.block_on(async {
        let client = delivery::nats::connect(&NatsConnect::new(&url), "test").await.unwrap();
        let log = OrderLog::open(client.clone(), LogSettings::new(3)).await.unwrap();
        (log, SnapshotStore::open(client, &LogSettings::new(3)).await.unwrap())
    });
    let append = |seqs: std::ops::RangeInclusive<u64>| {
        for seq in seqs {
            let id = AppendId { gateway: 1, run: 1, seq };
            rt.block_on(log.append(&order(seq), id, 0)).unwrap();
        }
    };
    let reports = || client_reports(&tally);

    let first = Engine::start(options(&url, "engine-a")).unwrap();
    wait_for("the first engine leads", Duration::from_secs(5), || first.leads());
    append(1..=250);
    wait_for("the leader's reports", Duration::from_secs(20), || reports() >= 250);
    wait_for("the snapshot at 200", Duration::from_secs(10), || first.snapshot_seq() == 200);
    let first_seq = rt.block_on(store.first_seq(0)).unwrap();
    assert_eq!(first_seq, 201, "the log is trimmed below the snapshot");
    let snapshot = rt.block_on(store.latest(0)).unwrap().expect("a snapshot is stored");
    assert_eq!(snapshot.stream_seq, 200);

    // Restored: without the snapshot it would meet the trimmed log's hole and fail.
    let second = Engine::start(options(&url, "engine-b")).unwrap();
    assert_eq!(second.restored_seq(), 200);
    wait_for("the new engine catches up", Duration::from_secs(20), || second.applied_seq() == 250);
    assert_eq!(second.failure(), None);

    // Both engines' progress notes (renewed with the lease) say 250.
    let noted = || rt.block_on(store.lowest_progress(0)).unwrap() == Some(250);
    wait_for("both engines note 250", Duration::from_secs(10), noted);
    let stopped = first.stop().unwrap();
    wait_for("the restored engine takes the lease", Duration::from_secs(5), || second.leads());
    append(251..=300);
    wait_for("the restored leader's reports", Duration::from_secs(20), || reports() >= 300);
    wait_for("its snapshot at 300", Duration::from_secs(10), || second.snapshot_seq() == 300);
    // The first engine's progress note (250) lives on for PROGRESS_TTL: the log keeps 251..
    let first_seq = rt.block_on(store.first_seq(0)).unwrap();
    assert_eq!(first_seq, 251, "trimmed below the lowest live progress, not the snapshot");
    let last = second.stop().unwrap();
    std::thread::sleep(Duration::from_millis(300)); // the last heartbeat's way to the consumer
    let seen = tally.lock().unwrap().clone();
    assert_eq!(seen.data[0], 300, "each order's report exactly once");
    assert_eq!(seen.out_of_order, 0, "sequences without a gap or a repeat");
    assert_eq!(seen.resynced, [0, 0], "nothing declared lost");
    assert_eq!(stopped.published.next_seqs[0], 251, "250 reports before the handover");
    assert_eq!(seen.next_seqs[0], last.published.next_seqs[0], "the numbering continued");
}

/// A stored snapshot that does not read (damaged in the store) stops an engine from starting,
/// with the reason, rather than letting it start from the log's first record and diverge.
#[test]
fn a_damaged_snapshot_refuses_the_start_with_its_reason() {
    let cluster = Cluster::start(1).unwrap();
    let url = cluster.url();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let client = delivery::nats::connect(&NatsConnect::new(&url), "test").await.unwrap();
        SnapshotStore::open(client.clone(), &LogSettings::new(1)).await.unwrap();
        let js = async_nats::jetstream::new(client);
        let objects = js.get_object_store("LEANTIER_SNAPSHOTS").await.unwrap();
        objects.put("shard-0", &mut &b"LTRSNAP1 but not a snapshot"[..]).await.unwrap();
    });
    let options = EngineOptions {
        log: LogSettings::new(1),
        lease: replication::lease::LeaseSettings::new("leantier", 1),
        ..options(&url, "engine-a")
    };
    let refused = Engine::start(options).err().expect("the start is refused");
    assert!(
        matches!(refused, replication::ReplicationError::BadSnapshot(_)),
        "a bad snapshot, said so: {refused}"
    );
}
