//! The engine (the tier, in this process, publishing over NATS) and two delivery edge processes
//! with one end consumer each, on a real `nats-server` child: every response reaches the
//! consumer of its edge exactly once and in order per subject, including across a server
//! restart in the middle of the run (gaps recovered from the retained window, or declared
//! with resync frames; nothing silently lost).

mod common;

use std::time::Duration;

use common::{EdgeChild, wait_for};
use delivery::consumer::{self, ConsumerTally};
use delivery::publish::{HEARTBEAT_INTERVAL_DEFAULT, NatsPublisher, PublishOptions, PublishReport};
use delivery::server::NatsServer;
use delivery::wire::Stream;
use exchange::durability::{JournalMode, JournalOptions};
use exchange::tier::TierConfig;
use experiments::tier_load::{RunOptions, run_with_subscribers};
use pipeline::WaitStrategy;

const OUTLETS: u32 = 2;
const RATE_PER_S: f64 = 10_000.0;
const RUN: Duration = Duration::from_millis(1500);

fn tier() -> TierConfig {
    TierConfig {
        outlets: OUTLETS,
        senders: 2,
        journal: JournalMode::OFF,
        ring_slots: 1024,
        ..TierConfig::default()
    }
}

fn options() -> RunOptions {
    RunOptions {
        rate_per_s: RATE_PER_S,
        duration: RUN,
        record_inputs: false,
        journal: JournalOptions::default(),
        released: None,
        stop: None,
        load: experiments::tier_load::LoadConfig::default(),
    }
}

/// Runs the tier over NATS with two edge children and their consumers; `mid_run` is called
/// (on another thread) halfway through. Returns the publisher's report, each consumer's tally
/// and each edge's report.
fn run_engine(
    server: &mut NatsServer,
    retain_records: usize,
    mid_run: impl FnOnce(&mut NatsServer) + Send,
) -> (PublishReport, Vec<ConsumerTally>, Vec<delivery::edge::EdgeReport>) {
    let url = server.url();
    let start = |g| EdgeChild::start(&[], &url, g, "127.0.0.1:0");
    run_engine_with(server, retain_records, mid_run, start)
}

/// [`run_engine`] with the edge children started by `start_edge(edge)`.
fn run_engine_with(
    server: &mut NatsServer,
    retain_records: usize,
    mid_run: impl FnOnce(&mut NatsServer) + Send,
    start_edge: impl Fn(u32) -> EdgeChild,
) -> (PublishReport, Vec<ConsumerTally>, Vec<delivery::edge::EdgeReport>) {
    let url = server.url();
    let edges: Vec<_> = (0..OUTLETS).map(start_edge).collect();
    let io =
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let mut tallies = Vec::new();
    for (edge, child) in edges.iter().enumerate() {
        let (tally, reading) = io.block_on(consumer::connect(child.address, edge as u32)).unwrap();
        io.spawn(reading);
        tallies.push(tally);
    }
    let publisher = NatsPublisher::connect(PublishOptions {
        nats: delivery::nats::NatsConnect::new(url),
        prefix: delivery::subjects::PREFIX_DEFAULT.into(),
        outlets: OUTLETS,
        retain_records,
        wait: WaitStrategy::Park,
        heartbeat: HEARTBEAT_INTERVAL_DEFAULT,
    })
    .unwrap();
    let result = std::thread::scope(|scope| {
        let engine = scope
            .spawn(|| run_with_subscribers(&tier(), options(), publisher.subscribers(), |_| {}));
        std::thread::sleep(RUN / 2);
        mid_run(server);
        engine.join().expect("engine thread")
    })
    .expect("the tier run");
    assert!(result.delivered > 0, "the tier delivered nothing");
    let report = publisher.drain().unwrap();
    let published: u64 = report.next_seqs.iter().map(|next| next - 1).sum();
    assert_eq!(published, result.delivered, "every delivered response got a sequence");
    assert_eq!(report.published + report.unsent, published);
    for (edge, tally) in tallies.iter().enumerate() {
        let target = [report.next_seqs[edge * 2], report.next_seqs[edge * 2 + 1]];
        wait_for(tally, target);
    }
    let reports = edges.into_iter().map(EdgeChild::stop).collect();
    let tallies = tallies.iter().map(|t| t.lock().unwrap().clone()).collect();
    (report, tallies, reports)
}

fn check_exactly_once(report: &PublishReport, tallies: &[ConsumerTally]) -> u64 {
    let mut resynced = 0;
    for (edge, tally) in tallies.iter().enumerate() {
        assert_eq!(tally.out_of_order, 0, "edge {edge}: a frame out of sequence");
        assert_eq!(tally.wrong_outlet, 0, "edge {edge}: another edge's record");
        for stream in Stream::ALL {
            let published = report.next_seqs[edge * 2 + stream as usize] - 1;
            let seen = tally.data[stream as usize] + tally.resynced[stream as usize];
            assert_eq!(seen, published, "edge {edge} {}: data + resync", stream.name());
        }
        resynced += tally.resynced.iter().sum::<u64>();
    }
    resynced
}

#[test]
fn every_response_reaches_its_edge_once_in_order() {
    let mut server = NatsServer::start().unwrap();
    let (report, tallies, edges) =
        run_engine(&mut server, delivery::publish::RETAIN_RECORDS_DEFAULT, |_| {});
    let resynced = check_exactly_once(&report, &tallies);
    assert_eq!(resynced, 0, "nothing may be lost without a server failure");
    for (edge, tally) in edges.iter().zip(&tallies) {
        assert_eq!(edge.received, tally.data.iter().sum::<u64>());
        assert_eq!(edge.delivered, edge.received, "one consumer: delivered = received");
        assert_eq!(edge.consumers_connected, 1);
    }
}

#[test]
fn a_server_restart_mid_run_loses_nothing_silently() {
    let mut server = NatsServer::start().unwrap();
    let (report, tallies, edges) =
        run_engine(&mut server, delivery::publish::RETAIN_RECORDS_MAX, |server| {
            server.restart().expect("restarting nats-server");
        });
    let resynced = check_exactly_once(&report, &tallies);
    let recovered: u64 = edges.iter().map(|g| g.recovered).sum();
    let gaps: u64 = edges.iter().map(|g| g.gaps).sum();
    eprintln!("restart: {report:?}; gaps {gaps}, recovered {recovered}, resynced {resynced}");
    // The window holds the whole run, so every gap is recoverable: no resync.
    assert_eq!(resynced, 0, "the retained window covered the run, yet records were lost");
    assert_eq!(edges.iter().map(|g| g.resyncs).sum::<u64>(), 0, "edges reported resyncs");
}

/// A server killed for a quarter of the run behind a 4-record window: what the outage lost
/// beyond the window is declared by resync frames. Whether an outage loses more than the window
/// depends on how much was in flight when the server died (async-nats buffers what is published
/// while it reconnects), which a loaded host can make small; the scenario is run again, up to
/// `TRIES` times, until an outage did, and every run checks that nothing was lost silently.
#[test]
fn records_beyond_the_window_are_declared_by_resync() {
    const TINY_WINDOW: usize = 4;
    const TRIES: u32 = 3;
    for attempt in 1..=TRIES {
        let mut server = NatsServer::start().unwrap();
        let (report, tallies, edges) = run_engine(&mut server, TINY_WINDOW, |server| {
            server.kill();
            std::thread::sleep(RUN / 4);
            server.restart().expect("restarting nats-server");
        });
        let resynced = check_exactly_once(&report, &tallies);
        if resynced > 0 {
            assert!(edges.iter().any(|g| g.resyncs > 0), "the edges declared them");
            return;
        }
        eprintln!("run {attempt}: the outage lost nothing beyond the window; again");
    }
    panic!("in {TRIES} runs no outage lost records beyond a {TINY_WINDOW}-record window");
}

/// A network namespace joined to this one by a veth pair, removed when dropped.
struct Namespace {
    name: String,
    host_ip: std::net::Ipv4Addr,
    inner_ip: std::net::Ipv4Addr,
}

impl Namespace {
    /// `None` (with the reason) where namespaces cannot be made here.
    fn create() -> Result<Namespace, String> {
        let id = std::process::id() % 200 + 20;
        let name = format!("ltd-{}", std::process::id());
        let (host_ip, inner_ip) = ([10, 231, id as u8, 1].into(), [10, 231, id as u8, 2].into());
        let (host_if, inner_if) = (format!("ltd{id}h"), format!("ltd{id}n"));
        let namespace = Namespace { name: name.clone(), host_ip, inner_ip };
        let steps: [&[&str]; 7] = [
            &["netns", "add", &name],
            &["link", "add", &host_if, "type", "veth", "peer", "name", &inner_if],
            &["link", "set", &inner_if, "netns", &name],
            &["addr", "add", &format!("{host_ip}/30"), "dev", &host_if],
            &["link", "set", &host_if, "up"],
            &["-n", &name, "addr", "add", &format!("{inner_ip}/30"), "dev", &inner_if],
            &["-n", &name, "link", "set", &inner_if, "up"],
        ];
        for step in steps {
            let output = std::process::Command::new("ip").args(step).output();
            match output {
                Ok(output) if output.status.success() => {}
                Ok(output) => {
                    return Err(format!(
                        "ip {step:?}: {}",
                        String::from_utf8_lossy(&output.stderr).trim()
                    ));
                }
                Err(error) => return Err(format!("cannot run ip: {error}")),
            }
        }
        Ok(namespace)
    }
}

impl Drop for Namespace {
    /// Deleting the namespace deletes its veth end, and with it the pair.
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip").args(["netns", "del", &self.name]).status();
    }
}

#[test]
fn a_edge_in_another_network_namespace_receives_everything() {
    let namespace = match Namespace::create() {
        Ok(namespace) => namespace,
        Err(reason) => {
            eprintln!("SKIPPED: no network namespace here ({reason})");
            return;
        }
    };
    let mut server = NatsServer::start_on(namespace.host_ip.into()).unwrap();
    let url = server.url();
    let listen = format!("{}:0", namespace.inner_ip);
    let exec = ["ip", "netns", "exec", namespace.name.as_str()];
    // Edge 0 runs in the namespace (its own stack, reached over the veth pair as another
    // host would be); edge 1 on this host.
    let start = |edge| match edge {
        0 => EdgeChild::start(&exec, &url, edge, &listen),
        _ => EdgeChild::start(&[], &url, edge, &format!("{}:0", namespace.host_ip)),
    };
    let (report, tallies, edges) =
        run_engine_with(&mut server, delivery::publish::RETAIN_RECORDS_DEFAULT, |_| {}, start);
    assert_eq!(check_exactly_once(&report, &tallies), 0);
    assert!(edges[0].received > 0, "the namespaced edge received nothing");
}
