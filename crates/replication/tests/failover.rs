//! A shard's engine group on a real three-node JetStream cluster: a leader and a hot standby
//! follow one input log; the delivery edge's consumer sees every report exactly once, in sequence,
//! before and after the leader stops and the standby takes over.

mod common;

use std::time::{Duration, Instant};

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
use replication::lease::LeaseSettings;

const ORDERS_PER_PHASE: u64 = 200;
/// How long the standby may take to lead once the leader stopped (it released the lease).
const TAKEOVER_MAX: Duration = Duration::from_secs(3);

fn tier() -> TierConfig {
    TierConfig { outlets: 1, journal: JournalMode::OFF, ..TierConfig::parked() }
}

fn engine(url: &str, holder: &str) -> Engine {
    Engine::start(options(url, holder)).unwrap()
}

fn options(url: &str, holder: &str) -> EngineOptions {
    engine_options(url, holder, tier())
}

/// Resting buys that never cross, every fifth refused by the pre-process (quantity 0): each
/// gets exactly one client report (its accept or its reject), and the rejects keep their
/// place in every engine's numbering.
fn order(seq: u64) -> InboundOrder {
    let master = reference_master_data(&tier().universe);
    let band = master.instrument(1).unwrap();
    InboundOrder {
        kind: request_kind::NEW,
        side: exchange::msg::Side::Buy as u8,
        instrument: 1,
        client: 1 + (seq % 4) as u32,
        order_id: seq,
        price: band.band_low,
        qty: if seq.is_multiple_of(5) { 0 } else { 1 },
        ..InboundOrder::default()
    }
}

#[test]
fn the_standby_takes_over_and_the_consumer_sees_every_report_once() {
    let cluster = Cluster::start(3).unwrap();
    let url = cluster.url();
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (_gateway, tally) = shard_zero_consumer(&rt, &url);
    let log = rt.block_on(async {
        let client = delivery::nats::connect(&NatsConnect::new(&url), "test").await.unwrap();
        OrderLog::open(client, LogSettings::new(3)).await.unwrap()
    });
    let append = |seq: u64| {
        let id = AppendId { gateway: 1, run: 1, seq };
        rt.block_on(log.append(&order(seq), id, 0)).unwrap();
    };

    let leader = engine(&url, "engine-a");
    wait_for("the first engine leads", Duration::from_secs(5), || leader.leads());
    let standby = engine(&url, "engine-b");
    for seq in 1..=ORDERS_PER_PHASE {
        append(seq);
    }
    wait_for("the leader's reports", Duration::from_secs(20), || {
        client_reports(&tally) >= ORDERS_PER_PHASE
    });
    wait_for("the standby applies every input", Duration::from_secs(20), || {
        standby.applied_seq() == ORDERS_PER_PHASE
    });
    assert!(!standby.leads(), "one leader");

    let stopped_at = Instant::now();
    let first = leader.stop().unwrap();
    assert_eq!(first.applied_seq, ORDERS_PER_PHASE);
    wait_for("the standby takes the lease", TAKEOVER_MAX, || standby.leads());
    println!("takeover after the leader's stop: {:?}", stopped_at.elapsed());
    for seq in ORDERS_PER_PHASE + 1..=2 * ORDERS_PER_PHASE {
        append(seq);
    }
    wait_for("the new leader's reports", Duration::from_secs(20), || {
        client_reports(&tally) >= 2 * ORDERS_PER_PHASE
    });
    let second = standby.stop().unwrap();
    std::thread::sleep(Duration::from_millis(300)); // the last heartbeat's way to the consumer
    let seen = tally.lock().unwrap().clone();
    assert_eq!(second.applied_seq, 2 * ORDERS_PER_PHASE);
    assert_eq!(seen.data[0], 2 * ORDERS_PER_PHASE, "each order's accept or reject exactly once");
    assert_eq!(seen.out_of_order, 0, "sequences without a gap or a repeat");
    assert_eq!(seen.resynced, [0, 0], "nothing declared lost");
    assert_eq!(seen.next_seqs[0], second.published.next_seqs[0], "the sequence continued");
    assert!(
        first.published.withheld == 0 && second.published.withheld > 0,
        "the standby held back"
    );
}

/// A record the engine cannot read (written past the gateways' codec) stops its follower with
/// the reason, and the engine gives its lease up so that a healthy standby can lead.
#[test]
fn an_engine_that_cannot_follow_gives_its_lease_up() {
    let cluster = Cluster::start(1).unwrap();
    let url = cluster.url();
    let leader = Engine::start(EngineOptions {
        log: LogSettings::new(1),
        lease: LeaseSettings::new("leantier", 1),
        ..options(&url, "engine-a")
    })
    .unwrap();
    wait_for("the engine leads", Duration::from_secs(5), || leader.leads());
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let client = delivery::nats::connect(&NatsConnect::new(&url), "test").await.unwrap();
        let js = async_nats::jetstream::new(client);
        let subject = LogSettings::new(1).subject(0);
        js.publish(subject, bytes::Bytes::from_static(b"not a record"))
            .await
            .unwrap()
            .await
            .unwrap();
    });
    wait_for("the engine gives its lease up", Duration::from_secs(5), || !leader.leads());
    let failure = leader.failure().expect("the follower's reason");
    assert!(failure.contains("sequence 1"), "{failure}");
}
