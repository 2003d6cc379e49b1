//! Metrics: per-worker recording, publish-by-swap, merged snapshots, serialisation.

use pipeline::metrics::{PUBLISH_INTERVAL_NS, StageMetrics, StageMetricsHub, now_ns};

#[test]
fn nothing_is_published_before_the_interval_and_everything_after_finish() {
    let hub = StageMetricsHub::new("core", 2);
    let mut worker = hub.worker(0);
    for service_ns in 1..=1000 {
        worker.recorder().record_batch(1, service_ns, 2 * service_ns);
    }
    worker.recorder().add_messages_out(990);
    worker.maybe_publish(now_ns());
    assert_eq!(hub.snapshot().messages_in, 0, "published before the interval");

    worker.maybe_publish(now_ns() + PUBLISH_INTERVAL_NS);
    let live = hub.snapshot();
    assert_eq!((live.messages_in, live.messages_out, live.busy_ns), (1000, 990, 500_500));
    assert_eq!(live.service_ns.count, 1000);
    assert_eq!((live.service_ns.min, live.service_ns.max), (1, 1000));
    assert!((499..=501).contains(&live.service_ns.p50), "p50 {}", live.service_ns.p50);
    assert!((1998..=2002).contains(&live.hop_latency_ns.max), "{}", live.hop_latency_ns.max);

    // After the swap the worker records into a fresh recorder; finish() hands over the rest.
    worker.recorder().record_batch(1, 7, 7);
    worker.recorder().record_end_to_end(12_345);
    worker.finish();
    let done = hub.snapshot();
    assert_eq!(done.messages_in, 1001);
    assert_eq!(done.end_to_end_ns.count, 1);
    assert_eq!(done.workers, 2);
    assert!(done.idle_ns > 0 && done.utilization > 0.0 && done.utilization <= 1.0);
}

#[test]
fn a_batch_records_its_mean_service_time_and_oldest_hop_for_every_message() {
    let hub = StageMetricsHub::new("core", 1);
    let mut worker = hub.worker(0);
    worker.recorder().record_batch(4, 400, 50);
    worker.recorder().record_batch(0, 999, 999);
    worker.finish();
    let snapshot = hub.snapshot();
    assert_eq!((snapshot.messages_in, snapshot.busy_ns), (4, 400), "an empty batch adds nothing");
    assert_eq!(snapshot.service_ns.count, 4);
    assert_eq!((snapshot.service_ns.min, snapshot.service_ns.max), (100, 100));
    assert_eq!(snapshot.hop_latency_ns.count, 4);
    assert_eq!((snapshot.hop_latency_ns.min, snapshot.hop_latency_ns.max), (50, 50));
}

#[test]
fn a_full_mailbox_keeps_data_with_the_worker_until_collected() {
    let hub = StageMetricsHub::new("audit", 1);
    let mut worker = hub.worker(0);
    worker.recorder().record_batch(1, 10, 10);
    worker.maybe_publish(now_ns() + PUBLISH_INTERVAL_NS);
    // Nobody collected the first publish: the second cannot swap and must not lose data.
    worker.recorder().record_batch(1, 20, 20);
    worker.maybe_publish(now_ns() + 2 * PUBLISH_INTERVAL_NS);
    assert_eq!(hub.snapshot().messages_in, 1, "only the first span was handed over");
    worker.maybe_publish(now_ns() + 4 * PUBLISH_INTERVAL_NS);
    assert_eq!(hub.snapshot().messages_in, 2, "the spare came back, so the second went too");
}

#[test]
fn queue_depth_and_latencies_out_of_range_are_clamped_not_lost() {
    let hub = StageMetricsHub::new("sink", 1);
    let mut worker = hub.worker(0);
    worker.recorder().record_queue_depth(0);
    worker.recorder().record_queue_depth(1 << 40);
    worker.recorder().record_batch(1, u64::MAX, 0);
    worker.finish();
    let snapshot = hub.snapshot();
    assert_eq!(snapshot.queue_depth_slots.count, 2);
    assert_eq!(snapshot.service_ns.count, 1);
    assert!(snapshot.service_ns.max >= pipeline::metrics::LATENCY_NS_MAX);
}

#[test]
fn snapshots_serialise_and_read_back() {
    let hub = StageMetricsHub::new("pre", 1);
    let mut worker = hub.worker(0);
    worker.recorder().record_batch(1, 100, 50);
    worker.finish();
    let snapshot = hub.snapshot();
    assert!(snapshot.histograms.is_some());
    let json = serde_json::to_string(&snapshot).unwrap();
    let back: StageMetrics = serde_json::from_str(&json).unwrap();
    assert_eq!(back.stage, "pre");
    assert_eq!(back.service_ns, snapshot.service_ns);
    assert!(back.histograms.is_none(), "histograms are not serialised");
}
