//! The input log and the lease against real `nats-server` clusters (three nodes on loopback
//! ports, children of the test, killed with SIGKILL).

use std::time::{Duration, Instant};

use experiments::cluster::Cluster;
use matching::msg::InboundOrder;
use replication::append::{AppendId, OrderLog};
use replication::follow::Follower;
use replication::layout::LogSettings;
use replication::lease::{Lease, LeaseSettings};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

async fn connect(url: &str) -> async_nats::Client {
    let options = async_nats::ConnectOptions::new().retry_on_initial_connect();
    let urls: Vec<async_nats::ServerAddr> = url.split(',').map(|u| u.parse().unwrap()).collect();
    tokio::time::timeout(Duration::from_secs(10), options.connect(urls))
        .await
        .expect("connect in time")
        .expect("connect")
}

fn order(instrument: u32, order_id: u64) -> InboundOrder {
    InboundOrder { instrument, client: 1, order_id, price: 100, qty: 1, ..InboundOrder::default() }
}

fn id(seq: u64) -> AppendId {
    AppendId { gateway: 1, run: 7, seq }
}

/// A gateway's retry (the same message id) is acknowledged with the first copy's sequence and
/// stores nothing; a follower reads every order once, in order, each on its instrument's shard.
#[test]
fn retries_never_store_twice_and_followers_read_in_order() {
    let cluster = Cluster::start(3).unwrap();
    runtime().block_on(async {
        let client = connect(&cluster.url()).await;
        let settings = LogSettings { shards: 2, ..LogSettings::new(3) };
        let log = OrderLog::open(client.clone(), settings.clone()).await.unwrap();
        for seq in 1..=10u64 {
            let appended = log.append(&order(seq as u32, seq), id(seq), 0).await.unwrap();
            assert_eq!(appended.shard, seq as u32 % 2);
            assert!(!appended.duplicate);
        }
        let first = log.append(&order(4, 4), id(4), 0).await.unwrap();
        assert!(first.duplicate, "the same id again is a duplicate");
        assert_eq!(first.stream_seq, 2, "answered with the first copy's sequence");
        for shard in 0..2 {
            let mut follower = Follower::open(client.clone(), &settings, shard, 1).await.unwrap();
            let mut seen = Vec::new();
            while seen.len() < 5 {
                let logged = tokio::time::timeout(Duration::from_secs(5), follower.next()).await;
                let logged = logged.expect("in time").expect("open").unwrap();
                assert_eq!(logged.stream_seq, seen.len() as u64 + 1);
                seen.push(logged.order.order_id);
            }
            let expected: Vec<u64> = (1..=10).filter(|s| s % 2 == u64::from(shard)).collect();
            assert_eq!(seen, expected, "shard {shard}: each order once, in append order");
        }
    });
}

/// Orders that arrived together go as one message: one append, one stream sequence, its retry
/// a duplicate; a follower hands them out in order, the last marked as the message's end.
#[test]
fn a_batch_is_one_message_read_back_record_by_record() {
    let cluster = Cluster::start(1).unwrap();
    runtime().block_on(async {
        let client = connect(&cluster.url()).await;
        let settings = LogSettings::new(1);
        let log = OrderLog::open(client.clone(), settings.clone()).await.unwrap();
        let single = log.append(&order(1, 1), id(1), 0).await.unwrap();
        assert_eq!((single.stream_seq, single.orders), (1, 1));
        let batch: Vec<(InboundOrder, u64)> = (2..=4).map(|n| (order(n as u32, n), n)).collect();
        let appended = log.start_append_batch(0, &batch, id(2)).await.await.unwrap();
        assert_eq!((appended.stream_seq, appended.orders, appended.duplicate), (2, 3, false));
        let again = log.start_append_batch(0, &batch, id(2)).await.await.unwrap();
        assert!(again.duplicate && again.stream_seq == 2, "a retried batch stores nothing");
        let mut follower = Follower::open(client, &settings, 0, 1).await.unwrap();
        let mut seen = Vec::new();
        while seen.len() < 4 {
            let logged = tokio::time::timeout(Duration::from_secs(5), follower.next()).await;
            let logged = logged.expect("in time").expect("open").unwrap();
            seen.push((logged.stream_seq, logged.order.order_id, logged.last_in_message));
        }
        let expected = [(1, 1, true), (2, 2, false), (2, 3, false), (2, 4, true)];
        assert_eq!(seen, expected, "in order, one stream sequence per message");
    });
}

/// Appends go on while one of three servers is killed and after it comes back; the stream
/// holds every acknowledged order exactly once (R3: a quorum survives one loss).
#[test]
fn a_killed_server_loses_no_acknowledged_order() {
    let mut cluster = Cluster::start(3).unwrap();
    let url = cluster.url();
    let rt = runtime();
    let settings = LogSettings::new(3);
    let log = rt.block_on(async {
        let client = connect(&url).await;
        OrderLog::open(client, settings.clone()).await.unwrap()
    });
    let mut acknowledged = 0u64;
    let mut longest_append = Duration::ZERO;
    for seq in 1..=300u64 {
        if seq == 100 {
            cluster.kill(0);
        }
        if seq == 200 {
            cluster.restart(0).unwrap();
        }
        let started = Instant::now();
        let appended = rt.block_on(log.append(&order(1, seq), id(seq), 0));
        longest_append = longest_append.max(started.elapsed());
        let appended = appended.unwrap_or_else(|e| panic!("order {seq}: {e}"));
        assert!(!appended.duplicate);
        acknowledged += 1;
    }
    println!("longest append across a server's kill and restart: {longest_append:?}");
    assert!(longest_append < Duration::from_secs(10), "a pause of {longest_append:?}");
    rt.block_on(async {
        let client = connect(&url).await;
        let mut follower = Follower::open(client, &settings, 0, 1).await.unwrap();
        for seq in 1..=acknowledged {
            let logged = tokio::time::timeout(Duration::from_secs(10), follower.next()).await;
            let logged = logged.expect("in time").expect("open").unwrap();
            assert_eq!((logged.stream_seq, logged.order.order_id), (seq, seq));
        }
    });
}

/// Two of three nodes SIGKILLed for 12 s (no quorum: no append can be acknowledged, longer
/// than the 10 s an append was retried before): the appends started meanwhile keep being
/// retried under their ids inside the deduplication window, and once the nodes are back every
/// one is acknowledged and the stream holds each order exactly once. Before, each
/// ended `NotAcknowledged` and its client never got an answer, whether or not it had landed.
#[test]
fn appends_outlast_a_quorum_loss_longer_than_a_retry_used_to_and_land_once() {
    let mut cluster = Cluster::start(3).unwrap();
    let rt = runtime();
    let settings = LogSettings::new(3);
    let log = rt.block_on(async {
        let client = connect(&cluster.url()).await;
        OrderLog::open(client, settings.clone()).await.unwrap()
    });
    rt.block_on(log.append(&order(0, 1), id(1), 0)).unwrap();
    cluster.kill(1);
    cluster.kill(2);
    let pending: Vec<_> = (2..=11)
        .map(|seq| {
            let started = rt.block_on(log.start_append(&order(0, seq), id(seq), 0));
            rt.spawn(started)
        })
        .collect();
    std::thread::sleep(Duration::from_secs(12));
    cluster.restart(1).unwrap();
    cluster.restart(2).unwrap();
    for (seq, append) in (2u64..).zip(pending) {
        let appended = rt.block_on(append).unwrap();
        assert!(appended.is_ok(), "order {seq} has a definite answer: {appended:?}");
    }
    rt.block_on(async {
        let client = connect(&cluster.url()).await;
        let mut follower = Follower::open(client, &settings, 0, 1).await.unwrap();
        let mut stored = Vec::new();
        for _ in 1..=11 {
            let logged = tokio::time::timeout(Duration::from_secs(10), follower.next()).await;
            stored.push(logged.expect("in time").expect("open").unwrap().order.order_id);
        }
        // Retries race each other: only their set is fixed (docs/REPLICATION.md, "Order within
        // a session").
        stored.sort_unstable();
        assert_eq!(stored, (1..=11).collect::<Vec<_>>(), "each order once");
        let extra = tokio::time::timeout(Duration::from_millis(500), follower.next()).await;
        assert!(extra.is_err(), "nothing stored twice: {extra:?}");
    });
}

/// A holder paused past its TTL (SIGSTOP) wakes up, finds a successor, and stops: its
/// refused acquire and its release on the way out leave the successor's lease alone, and the
/// successor's epoch is larger than the paused holder's.
#[test]
fn a_paused_holder_that_wakes_up_and_stops_leaves_its_successors_lease_alone() {
    let cluster = Cluster::start(3).unwrap();
    runtime().block_on(async {
        let client = connect(&cluster.url()).await;
        let settings = LeaseSettings::new("leantier", 3);
        let mut old = Lease::open(client.clone(), &settings, 0, "old").await.unwrap();
        let mut new = Lease::open(client.clone(), &settings, 0, "new").await.unwrap();
        assert!(old.try_acquire().await.unwrap());
        let old_epoch = old.epoch().expect("held");
        // The pause: no renewal until the successor holds the lease.
        let deadline = Instant::now() + settings.ttl * 5;
        while !new.try_acquire().await.unwrap() {
            assert!(Instant::now() < deadline, "the lease passes on once renewals stop");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let new_epoch = new.epoch().expect("held");
        assert!(new_epoch > old_epoch, "epochs grow: {new_epoch} after {old_epoch}");
        assert_eq!(old.epoch(), None, "the paused holder's validity ran out");
        // SIGCONT: the woken holder tries to lead again (its validity is gone), then stops.
        assert!(!old.try_acquire().await.unwrap(), "held by the successor: refused");
        old.release().await.unwrap();
        assert_eq!(new.holder().await.unwrap().as_deref(), Some("new"), "still the successor's");
        for _ in 0..(settings.ttl.as_millis() / settings.renew_every.as_millis() + 2) {
            tokio::time::sleep(settings.renew_every).await;
            assert!(new.renew().await.unwrap(), "the successor keeps renewing");
        }
        assert_eq!(new.epoch(), Some(new_epoch), "renewals keep the epoch");
        // The successor's lease lapses unrenewed; a release of a write that is gone is a no-op.
        tokio::time::sleep(settings.ttl * 3).await;
        new.release().await.unwrap();
    });
}

/// One holder at a time: a second contender is refused while the first renews; once the
/// first stops renewing, its validity ends before the second can take the lease.
#[test]
fn the_lease_has_one_holder_and_passes_on_when_renewals_stop() {
    let cluster = Cluster::start(3).unwrap();
    runtime().block_on(async {
        let client = connect(&cluster.url()).await;
        let settings = LeaseSettings::new("leantier", 3);
        let mut first = Lease::open(client.clone(), &settings, 0, "first").await.unwrap();
        let mut second = Lease::open(client.clone(), &settings, 0, "second").await.unwrap();
        assert!(first.try_acquire().await.unwrap());
        assert!(!second.try_acquire().await.unwrap(), "held: refused");
        for _ in 0..8 {
            tokio::time::sleep(settings.renew_every).await;
            assert!(first.renew().await.unwrap(), "renewals keep it");
            assert!(!second.try_acquire().await.unwrap(), "held through renewals");
        }
        assert_eq!(second.holder().await.unwrap().as_deref(), Some("first"));
        // The first holder stops renewing (a crash, a partition).
        let first_valid_until = first.valid_until().expect("held");
        let mut taken_at = None;
        let deadline = Instant::now() + settings.ttl * 5;
        while Instant::now() < deadline {
            if second.try_acquire().await.unwrap() {
                taken_at = Some(Instant::now());
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let taken_at = taken_at.expect("the lease passes on once renewals stop");
        assert!(taken_at > first_valid_until, "no overlap: the old validity ended first");
        assert!(!first.renew().await.unwrap(), "the old holder learns it lost");
        assert_eq!(first.valid_until(), None);
        second.release().await.unwrap();
        assert!(first.try_acquire().await.unwrap(), "a released lease is free at once");
    });
}
