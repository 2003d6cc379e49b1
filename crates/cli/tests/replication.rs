//! `exchange serve --role engine` processes on a real three-node JetStream cluster: a leader
//! and a standby follow one shard's input log; the leader is killed with SIGKILL and a new
//! standby started, `LEANTIER_FAILOVER_KILLS` times (1 here; `scripts/soak-failover` runs 10).
//! Every appended order's report reaches the R-Gateway's consumer exactly once, in sequence;
//! the time from each kill to the first report of the new leader is measured.

use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddr};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use delivery::consumer::{self, SharedTally};
use delivery::gateway::{GatewayOptions, start as start_r_gateway};
use delivery::nats::NatsConnect;
use exchange::flow::{UniverseConfig, reference_master_data};
use exchange::msg::{InboundOrder, Side, request_kind};
use replication::append::{AppendId, OrderLog};
use replication::cluster::Cluster;
use replication::layout::LogSettings;

/// Orders appended between two kills.
const ORDERS_PER_ROUND: u64 = 100;
/// The failover goal on this machine (docs/REPLICATION.md): kill → first report of the new
/// leader.
const FAILOVER_MAX: Duration = Duration::from_secs(2);

struct EngineProcess(Child);

impl EngineProcess {
    fn start(dir: &std::path::Path, url: &str) -> EngineProcess {
        let mut child = Command::new(env!("CARGO_BIN_EXE_leantier"))
            .args(["exchange", "serve", "--role", "engine", "--nats", url, "--replicas", "3"])
            .args(["--config", "serve.toml"])
            .current_dir(dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = lines.next().expect("a line").unwrap();
        assert!(first.starts_with("engine for shard 0 following"), "{first}");
        EngineProcess(child)
    }

    fn kill(mut self) {
        self.0.kill().unwrap(); // SIGKILL
        self.0.wait().unwrap();
    }
}

impl Drop for EngineProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn order(seq: u64) -> InboundOrder {
    let band = *reference_master_data(&UniverseConfig::default()).instrument(1).unwrap();
    InboundOrder {
        kind: request_kind::NEW,
        side: Side::Buy as u8,
        instrument: 1,
        client: 1 + (seq % 4) as u32,
        order_id: seq,
        price: band.band_low,
        qty: 1,
        ..InboundOrder::default()
    }
}

fn reports(tally: &SharedTally) -> u64 {
    tally.lock().unwrap().data[0]
}

fn wait_for(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < within, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn killed_leaders_lose_no_report_and_the_standby_takes_over_within_the_bound() {
    let kills: u32 = std::env::var("LEANTIER_FAILOVER_KILLS").map_or(1, |k| k.parse().unwrap());
    let cluster = Cluster::start(3).unwrap();
    let url = cluster.url();
    let dir = tempfile::tempdir().unwrap();
    let hash = gateway::credentials::hash_secret(b"pw").unwrap();
    std::fs::write(dir.path().join("clients.txt"), format!("1 native good {hash}\n")).unwrap();
    let tier = "[tier]\nlayout = \"thread-per-stage\"\nwait = \"park\"\npreprocess_workers = 1\nsenders = 1\ngateways = 1\n";
    std::fs::write(dir.path().join("serve.toml"), format!("credentials = \"clients.txt\"\n{tier}"))
        .unwrap();

    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let listen = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    let r_gateway = rt.block_on(start_r_gateway(GatewayOptions::new(&url, 0, listen))).unwrap();
    let (tally, reading) = rt.block_on(consumer::connect(r_gateway.local_addr(), 0)).unwrap();
    rt.spawn(reading);
    let log = rt.block_on(async {
        let client = delivery::nats::connect(&NatsConnect::new(&url), "test").await.unwrap();
        OrderLog::open(client, LogSettings::new(3)).await.unwrap()
    });
    let mut appended = 0u64;
    let mut append = |count: u64| {
        for _ in 0..count {
            appended += 1;
            let id = AppendId { gateway: 1, session: 1, seq: appended };
            rt.block_on(log.append(&order(appended), id, 0)).unwrap();
        }
        appended
    };

    let mut leader = EngineProcess::start(dir.path(), &url);
    let total = append(ORDERS_PER_ROUND);
    wait_for("the first leader's reports", Duration::from_secs(30), || reports(&tally) >= total);
    let mut standby = EngineProcess::start(dir.path(), &url);
    let mut failovers = Vec::new();
    for _ in 0..kills {
        let total = append(ORDERS_PER_ROUND);
        wait_for("the leader's reports", Duration::from_secs(30), || reports(&tally) >= total);
        std::thread::sleep(Duration::from_millis(300)); // the standby applies the round
        let killed_at = Instant::now();
        leader.kill();
        let total = append(1);
        wait_for("the new leader's first report", Duration::from_secs(30), || {
            reports(&tally) >= total
        });
        failovers.push(killed_at.elapsed());
        leader = standby;
        standby = EngineProcess::start(dir.path(), &url);
    }
    let total = append(ORDERS_PER_ROUND);
    wait_for("the last reports", Duration::from_secs(30), || reports(&tally) >= total);
    std::thread::sleep(Duration::from_millis(300));
    drop((leader, standby));
    failovers.sort();
    let max = *failovers.last().unwrap();
    println!(
        "failover (SIGKILL → first report of the new leader) over {kills} kills: p50 {:?}, max {max:?}",
        failovers[failovers.len() / 2]
    );
    let seen = tally.lock().unwrap().clone();
    assert_eq!(seen.data[0], total, "every order's accept exactly once");
    assert_eq!(seen.out_of_order, 0, "sequences without a gap or a repeat");
    assert_eq!(seen.resynced, [0, 0], "nothing declared lost");
    assert!(max <= FAILOVER_MAX, "failover took {max:?} (goal {FAILOVER_MAX:?})");
}
