//! The shortened stability run of CI: `mq load` (closed loop, sends and pops) against a real
//! node on a real SQLite store for a few seconds, then the same sanity checks and operational
//! laws the long run (`scripts/mq-stability`) reports.

use experiments::mq_load::{self as load, LoadConfig};
use mq::server::{self, NodeConfig};
use mq::store::AnyStore;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_stability_run_passes_every_sanity_check() {
    let data = tempfile::tempdir().unwrap();
    let store = AnyStore::open(&format!("sqlite:{}", data.path().display()), 1).await.unwrap();
    let node = server::start("127.0.0.1:0", store, NodeConfig::default()).await.unwrap();
    let config = LoadConfig {
        nodes: vec![node.addr.to_string()],
        clients: 8,
        connections: 4,
        send_percent: 60,
        message_bytes: 200,
        think_ms: 0,
        duration_s: 4.0,
        warmup_s: 0.5,
        cooldown_s: 0.5,
        ..LoadConfig::default()
    };
    let result = load::run(&config).await.unwrap();
    node.shutdown().await;

    let counts = &result.counts;
    assert_eq!(counts.protocol_errors, 0, "every reply must match its request id");
    assert!(counts.sends_ok > 100 && counts.pops_ok > 0, "load did not run: {counts:?}");
    assert!(result.sanity_ok, "client, middleware and database counts disagree: {counts:?}");
    assert_eq!(result.middleware_sends, counts.sends_ok);
    assert_eq!(result.middleware_pops, counts.pops_ok);
    assert_eq!(result.queue_depth, counts.sends_ok - counts.pops_ok);
    assert!(result.throughput_per_s > 0.0);
    // Interactive response-time law (N/X − Z) against the measured mean: closed loop with no
    // think time, so they must agree within the client-side overhead (generous bound).
    let ratio = result.response_time_law_ns / result.response_mean_ns;
    assert!((0.5..2.0).contains(&ratio), "response-time law off by {ratio:.2}x");
}
