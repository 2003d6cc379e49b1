//! The leader's retain service with a regenerator whose reads fail, on a real `nats-server`
//! ($LEANTIER_NATS_URL, else a child): an edge behind the window is answered "nothing yet"
//! while the regeneration fails (it resyncs nothing and asks again), and resyncs the range
//! only once the group says none of it can be recomputed (its inputs trimmed away).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use delivery::edge::{EdgeOptions, EdgeReport, RunningEdge, start};
use delivery::nats::NatsConnect;
use delivery::publish::{
    NatsPublisher, PublishGate, PublishOptions, PublisherGroup, Regenerate, RegenerationFailed,
};
use delivery::server::server_or_env;
use delivery::wire::{Record, Stream};
use futures_util::future::BoxFuture;
use pipeline::WaitStrategy;

const DEADLINE: Duration = Duration::from_secs(20);
/// Where the group's numbering goes on (a leader restored from a snapshot there).
const RESTORED_AT: u64 = 300;
/// Where the edge starts: the range before `RESTORED_AT` is older than every window.
const EDGE_AT: u64 = 10;

/// A regenerator whose snapshot reads fail while `failing`; afterwards it can recompute
/// nothing (the log trimmed past the range).
#[derive(Debug, Default)]
struct Flaky {
    failing: AtomicBool,
    calls: AtomicU64,
}

impl Regenerate for Flaky {
    fn regenerate(
        &self,
        _outlet: u32,
        _stream: Stream,
        _from: u64,
        _to: u64,
    ) -> BoxFuture<'static, Result<Vec<Record>, RegenerationFailed>> {
        // SeqCst, both: a test's counters, read from the test thread.
        self.calls.fetch_add(1, Ordering::SeqCst);
        let failing = self.failing.load(Ordering::SeqCst);
        Box::pin(async move {
            match failing {
                true => Err(RegenerationFailed("snapshot read: timed out".into())),
                false => Ok(Vec::new()),
            }
        })
    }
}

fn wait_until(what: &str, edge: &RunningEdge, done: impl Fn(&EdgeReport) -> bool) {
    let deadline = Instant::now() + DEADLINE;
    while !done(&edge.report()) {
        assert!(Instant::now() < deadline, "{what}: {:?}", edge.report());
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_failed_regeneration_is_asked_again_and_only_an_unrecomputable_range_is_resynced() {
    let (url, _server) = server_or_env().unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let prefix = format!("regen{}", std::process::id());
    let mut options = EdgeOptions::new(&url, 0, SocketAddr::from(([127, 0, 0, 1], 0)));
    options.prefix = prefix.clone();
    options.first_seqs = [EDGE_AT; 2];
    let edge = runtime.block_on(start(options)).unwrap();
    let flaky = Arc::new(Flaky { failing: AtomicBool::new(true), ..Flaky::default() });
    let gate = PublishGate::closed();
    gate.open_until(u64::MAX, 1);
    let group = PublisherGroup {
        instance: 7,
        gate,
        next_seqs: vec![RESTORED_AT; Stream::ALL.len()],
        regenerate: Some(flaky.clone()),
    };
    let options = PublishOptions {
        nats: NatsConnect::new(url),
        prefix,
        outlets: 1,
        retain_records: 64,
        wait: WaitStrategy::Park,
        heartbeat: Duration::from_millis(20),
    };
    let publisher = NatsPublisher::connect_in_group(options, group).unwrap();
    // The heartbeats show the gap; each ask meets a failed regeneration: nothing is resynced
    // and the edge asks again.
    let deadline = Instant::now() + DEADLINE;
    while flaky.calls.load(Ordering::SeqCst) < 6 {
        assert!(Instant::now() < deadline, "asked again: {:?}", edge.report());
        std::thread::sleep(Duration::from_millis(5));
    }
    let report = edge.report();
    assert_eq!((report.resyncs, report.resync_records), (0, 0), "{report:?}");
    assert_eq!(report.next_seqs, [EDGE_AT; 2], "the gap stays open: {report:?}");
    assert!(publisher.report().regenerations_failed >= 6, "{:?}", publisher.report());
    // The reads work again and the group can recompute none of the range: the window
    // answers and the edge resyncs what lies before it, once per stream.
    flaky.failing.store(false, Ordering::SeqCst);
    let range = RESTORED_AT - EDGE_AT;
    wait_until("the resync", &edge, |r| r.resync_records == range * 2);
    let report = edge.report();
    assert_eq!((report.resyncs, report.next_seqs.clone()), (2, vec![RESTORED_AT; 2]));
    publisher.drain().unwrap();
    runtime.block_on(edge.shutdown()).unwrap();
}
