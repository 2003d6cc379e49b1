//! What the engine-group tests share: an engine's options on a loopback cluster, a delivery edge
//! with its consumer reading shard 0's reports, and waiting for a condition.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use delivery::consumer::{self, SharedTally};
use delivery::edge::{self, EdgeOptions, RunningEdge};
use delivery::nats::NatsConnect;
use delivery::publish::{HEARTBEAT_INTERVAL_DEFAULT, PublishOptions, RETAIN_RECORDS_DEFAULT};
use exchange::tier::TierConfig;
use replication::engine::EngineOptions;
use replication::layout::LogSettings;
use replication::lease::LeaseSettings;

/// One engine of shard 0 on a three-node cluster at `url`, running `tier`.
pub fn engine_options(url: &str, holder: &str, tier: TierConfig) -> EngineOptions {
    let nats = NatsConnect::new(url);
    let publish = PublishOptions {
        nats: nats.clone(),
        prefix: "leantier".into(),
        outlets: tier.outlets,
        retain_records: RETAIN_RECORDS_DEFAULT,
        wait: tier.wait_strategy(),
        heartbeat: HEARTBEAT_INTERVAL_DEFAULT,
    };
    EngineOptions {
        nats,
        log: LogSettings::new(3),
        lease: LeaseSettings::new("leantier", 3),
        shard: 0,
        holder: holder.into(),
        tier,
        publish,
        planned_rate_per_s: 10_000.0,
    }
}

/// A delivery edge for shard 0's outlet 0 and a consumer counting what it hands on
/// (the gateway must live as long as the tally is read).
pub fn shard_zero_consumer(rt: &tokio::runtime::Runtime, url: &str) -> (RunningEdge, SharedTally) {
    let listen = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    let gateway = rt
        .block_on(edge::start(EdgeOptions {
            prefix: LogSettings::new(3).publish_prefix(0),
            ..EdgeOptions::new(url, 0, listen)
        }))
        .unwrap();
    let (tally, reading) =
        rt.block_on(consumer::connect(gateway.local_addr().unwrap(), 0)).unwrap();
    rt.spawn(reading);
    (gateway, tally)
}

/// Client reports the consumer counted.
pub fn client_reports(tally: &SharedTally) -> u64 {
    tally.lock().unwrap().data[0]
}

/// Waits until `done`, failing the test past `within`; returns how long it took.
pub fn wait_for(what: &str, within: Duration, mut done: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < within, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
    started.elapsed()
}
