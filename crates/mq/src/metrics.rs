//! What a node shows on `mq serve --metrics-listen` (docs/OPERATIONS.md, "Monitor"): its
//! counters and gauges, read from the node's own atomics at scrape time, and two latency
//! histograms recorded on the request path with relaxed atomic additions.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use crate::node::{Counters, NodeView};

type CounterOf = fn(&Counters) -> &AtomicU64;

/// Adds the node's metrics to `registry`.
pub(crate) fn register(node: Arc<dyn NodeView>, registry: &mut ops::Registry) {
    let counters: [(&str, &str, CounterOf); 8] = [
        ("mq_sends_committed", "sends committed (each acknowledged after its commit)", |c| {
            &c.sends_committed
        }),
        ("mq_pops_committed", "pops and acks committed", |c| &c.pops_committed),
        ("mq_batches_committed", "transactions committed (group commit)", |c| &c.batches_committed),
        (
            "mq_batches_inline",
            "of those, lone requests committed by their connection (idle node)",
            |c| &c.batches_inline,
        ),
        ("mq_connections_refused", "connections refused at a connection limit", |c| {
            &c.connections_refused
        }),
        ("mq_connections_cut_off", "connections cut off (replies not taken, frame memory)", |c| {
            &c.connections_cut_off
        }),
        ("mq_connections_idle_closed", "connections closed idle or unregistered", |c| {
            &c.connections_idle_closed
        }),
        ("mq_reply_memory_refused", "requests answered Busy: no room for their reply", |c| {
            &c.reply_memory_refused
        }),
    ];
    for (name, help, which) in counters {
        let node = Arc::clone(&node);
        registry.register(name, help, ops::read::counter(move || node.counter(which)));
    }
    let open = Arc::clone(&node);
    let open = move || open.counter(|c| &c.connections_open) as i64;
    registry.register("mq_connections_open", "connections open", ops::read::gauge(open));
    let in_flight = Arc::clone(&node);
    let in_flight = move || in_flight.requests_in_flight() as i64;
    registry.register(
        "mq_requests_in_flight",
        "requests holding or waiting for a handler slot",
        ops::read::gauge(in_flight),
    );
    let owed = Arc::clone(&node);
    let owed = move || owed.reply_memory_bytes() as i64;
    registry.register(
        "mq_reply_memory_bytes",
        "bytes of replies owed to clients",
        ops::read::gauge(owed),
    );
    let counters = node.counters();
    registry.register(
        "mq_request_seconds",
        "a request's time in the node, arrival to its reply encoded",
        counters.request_seconds.clone(),
    );
    registry.register(
        "mq_batch_commit_seconds",
        "a batch's transaction, begin to commit",
        counters.batch_commit_seconds.clone(),
    );
}
