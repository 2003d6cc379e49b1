//! A gateway without a tier (`gateway::remote`) whose appends go unacknowledged past their
//! retry window: on a real JetStream cluster (four nodes) with one engine, the client of such an
//! order gets one definite answer once the log tells whether the append landed.

mod common;
#[path = "common/fix_client.rs"]
mod fix_client;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use delivery::nats::NatsConnect;
use delivery::publish::{HEARTBEAT_INTERVAL_DEFAULT, PublishOptions, RETAIN_RECORDS_DEFAULT};
use exchange::durability::JournalMode;
use exchange::tier::TierConfig;
use experiments::cluster::Cluster;
use fix_client::{FixClient, new_order};
use gateway::Settings;
use gateway::client::NativeClient;
use gateway::credentials::{self, Credential, Protocol};
use gateway::fix::tag;
use gateway::native::{ClientMsg, Event, OrderRequest, ServerMsg, event_kind, gateway_reason};
use gateway::{RemoteOptions, RunningRemote};
use replication::append::OrderLog;
use replication::engine::{Engine, EngineOptions};
use replication::layout::LogSettings;
use replication::lease::LeaseSettings;

const SECRET: &str = "s3cret";
/// Generous on a loaded 2-core machine; a passing run never waits this long.
const WAIT: Duration = Duration::from_secs(20);
/// How long an append to a paused node takes to end unacknowledged with a 3 s deduplication
/// window: its first attempt's 2 s acknowledgement timeout, then one retry's (the window less
/// `DEDUP_MARGIN` is below `APPEND_ACK_TIMEOUT`, so the retries last that long), and a margin.
const GIVEN_UP_AFTER: Duration = Duration::from_millis(5_000);

fn log_settings() -> LogSettings {
    LogSettings { dedup_window: Duration::from_secs(3), ..LogSettings::new(3) }
}

fn tier() -> TierConfig {
    TierConfig { outlets: 1, journal: JournalMode::OFF, ..TierConfig::parked() }
}

/// The shard's one engine, on the nodes but `avoid`'s (a pause of that node leaves it alone).
fn engine(cluster: &Cluster, avoid: usize) -> Engine {
    let nats = NatsConnect::new(cluster.url_without(avoid));
    let tier = tier();
    let publish = PublishOptions {
        nats: nats.clone(),
        prefix: "leantier".into(),
        outlets: tier.outlets,
        retain_records: RETAIN_RECORDS_DEFAULT,
        wait: tier.wait_strategy(),
        heartbeat: HEARTBEAT_INTERVAL_DEFAULT,
    };
    let engine = Engine::start(EngineOptions {
        nats,
        log: log_settings(),
        lease: LeaseSettings::new("leantier", 3),
        shard: 0,
        holder: "engine".into(),
        tier,
        publish,
        planned_rate_per_s: 10_000.0,
    });
    engine.unwrap()
}

/// The gateway (native, FIX and metrics listeners), talking to node `node` alone until it
/// loses that connection; native clients 1..=3 and FIX client 11 (`F11`).
fn gateway(cluster: &Cluster, node: usize, store: &std::path::Path) -> RunningRemote {
    let any = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    let mut credentials = common::native_credentials(SECRET);
    let hash = credentials::hash_secret(fix_client::SECRET.as_bytes()).unwrap();
    credentials.push(Credential {
        client: 11,
        protocol: Protocol::Fix,
        comp_id: "F11".into(),
        hash,
    });
    gateway::start_remote(RemoteOptions {
        addresses: (any, Some(any), Some(any)),
        settings: Settings {
            store_dir: store.to_path_buf(),
            // The test's client stays silent through the pauses: no dead-link cut meanwhile.
            heartbeat: Duration::from_secs(60),
            ..Settings::default()
        },
        credentials,
        nats: NatsConnect::new(cluster.url_of(node)),
        log: log_settings(),
        tier_outlets: 1,
        gateway_id: 1,
    })
    .unwrap()
}

/// A resting buy of instrument 1 at the bottom of its band.
fn order(token: u32) -> OrderRequest {
    let master = exchange::flow::reference_master_data(&tier().universe);
    let band_low = master.instrument(1).unwrap().band_low;
    OrderRequest { client: 1, token, instrument: 1, price: band_low, qty: 1, ..Default::default() }
}

fn next_event(session: &mut NativeClient, within: Duration) -> Option<Event> {
    match session.recv(within).unwrap() {
        Some(ServerMsg::Sequenced { event, .. }) => Some(event),
        Some(ServerMsg::Heartbeat) => next_event(session, within),
        None => None,
        other => panic!("expected a sequenced event, got {other:?}"),
    }
}

/// The value of the gateway's counter `name` on its `/metrics`.
fn metric(remote: &RunningRemote, name: &str) -> u64 {
    let (status, page) = ops::endpoint::get(remote.addresses.2.unwrap(), "/metrics").unwrap();
    assert_eq!(status, 200);
    let line = page.lines().find(|line| line.starts_with(&format!("{name} ")));
    line.and_then(|line| line.split(' ').nth(1)?.parse().ok()).unwrap_or_else(|| panic!("{name}"))
}

fn wait_for_metric(remote: &RunningRemote, name: &str, value: u64) {
    let started = Instant::now();
    while metric(remote, name) != value {
        assert!(started.elapsed() < WAIT, "{name} is not {value} within {WAIT:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The gateway's node pauses (SIGSTOP) while it holds an order's append, past the retry
/// window (streams with a 3 s deduplication window). Resumed (SIGCONT), the node hands the
/// append to the stream late: the gateway finds it in the log (counted as landed late) and
/// the client's only answer is the engine's accept, once. Paused again and killed (SIGKILL)
/// instead, the node takes the next append with it: the gateway, reconnected to another node,
/// finds no copy and answers the client with a `NotLogged` reject, its only answer (a FIX
/// client's order appended meanwhile: an ExecutionReport 150=8, 58=NotLogged).
#[test]
fn an_order_whose_append_went_unacknowledged_is_answered_once_the_log_tells() {
    // Four nodes, the shard's stream on three: the gateway talks to the fourth, whose pause
    // leaves the stream's Raft group alone (a paused member, resumed, may call an election
    // that deposes the leader and drops the copies it held: the append is then lost, and
    // "landed" would not be certain).
    let mut cluster = Cluster::start(4).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let node = rt.block_on(async {
        let client = delivery::nats::connect(&NatsConnect::new(cluster.url()), "test").await;
        let client = client.unwrap();
        OrderLog::open(client.clone(), log_settings()).await.unwrap();
        let stream = log_settings().stream(0);
        let started = Instant::now();
        loop {
            let holders = cluster.stream_nodes(client.clone(), &stream).await;
            if holders.len() == 3 {
                break (0..4).find(|node| !holders.contains(node)).unwrap();
            }
            assert!(started.elapsed() < WAIT, "the stream's replicas are known: {holders:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let engine = engine(&cluster, node);
    let store = tempfile::tempdir().unwrap();
    let remote = gateway(&cluster, node, store.path());
    let mut session = NativeClient::connect(remote.addresses.0).unwrap();
    assert!(matches!(session.login(1, SECRET, 0, WAIT).unwrap(), ServerMsg::LoginAccepted { .. }));
    let started = Instant::now();
    while !engine.leads() {
        assert!(started.elapsed() < WAIT, "the engine leads");
        std::thread::sleep(Duration::from_millis(20));
    }
    session.send(&ClientMsg::NewOrder(order(1))).unwrap();
    let accepted = next_event(&mut session, WAIT).expect("an answer");
    assert_eq!((accepted.kind, accepted.token), (event_kind::ACCEPTED, 1), "{accepted:?}");

    cluster.pause(node).unwrap();
    session.send(&ClientMsg::NewOrder(order(2))).unwrap();
    std::thread::sleep(GIVEN_UP_AFTER);
    cluster.resume(node).unwrap();
    let answer = next_event(&mut session, WAIT).expect("an answer");
    assert_eq!((answer.kind, answer.token), (event_kind::ACCEPTED, 2), "{answer:?}");
    wait_for_metric(&remote, "gateway_appends_landed_late_total", 1);
    assert_eq!(metric(&remote, "gateway_orders_not_logged_total"), 0);

    let mut fix = FixClient::connect(remote.addresses.1.unwrap(), "F11", 1);
    assert_eq!(fix.logon(&[]).msg_type(), "A");
    cluster.pause(node).unwrap();
    session.send(&ClientMsg::NewOrder(order(3))).unwrap();
    fix.send("D", &new_order("f1", "1", "1", "101000"));
    std::thread::sleep(GIVEN_UP_AFTER);
    cluster.kill(node);
    let answer = next_event(&mut session, WAIT).expect("an answer");
    let (kind, token, reason) = (answer.kind, answer.token, answer.reason);
    assert_eq!((kind, token, reason), (event_kind::REJECTED, 3, gateway_reason::NOT_LOGGED));
    let report = fix.recv();
    let fields = [tag::MSG_TYPE, tag::EXEC_TYPE, tag::ORD_STATUS, tag::CL_ORD_ID, tag::TEXT];
    let fields = fields.map(|field| report.get(field));
    assert_eq!(fields, ["8", "8", "8", "f1", "NotLogged"], "{report:?}");
    assert_eq!(metric(&remote, "gateway_orders_not_logged_total"), 2);
    assert_eq!(metric(&remote, "gateway_appends_landed_late_total"), 1);
    let extra = next_event(&mut session, Duration::from_secs(1));
    assert_eq!(extra, None, "one answer per order: order 2 booked once, order 3 never");
    assert_eq!(engine.stop().unwrap().applied_seq, 2, "the log holds orders 1 and 2 once");
    remote.stop();
}
