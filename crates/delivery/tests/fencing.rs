//! The delivery edge's fence against deposed leaders, on a real `nats-server` ($LEANTIER_NATS_URL,
//! else a child): once a batch of leadership epoch E was heard, batches, heartbeats and retain
//! replies of an older epoch are dropped and counted, however late they come (a leader paused
//! past its lease that wakes up and publishes); and an edge started at a sequence (a
//! restarted edge's kept position) delivers nothing before it.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{INSTANCE, batch_in_epoch};
use delivery::consumer;
use delivery::edge::{EdgeOptions, RunningEdge, start};
use delivery::server::server_or_env;
use delivery::subjects::data_subject;
use delivery::wire::{BATCH_RECORDS_MAX, Stream};

const DEADLINE: Duration = Duration::from_secs(20);
const BATCH: u64 = BATCH_RECORDS_MAX as u64;
const BATCH_COUNT: usize = BATCH_RECORDS_MAX;

async fn edge_on(url: &str, name: &str, first_seqs: [u64; 2]) -> (RunningEdge, String) {
    let mut options = EdgeOptions::new(url, 0, SocketAddr::from(([127, 0, 0, 1], 0)));
    options.prefix = format!("{name}{}", std::process::id());
    options.first_seqs = first_seqs;
    let prefix = options.prefix.clone();
    (start(options).await.unwrap(), prefix)
}

async fn wait_until(what: &str, edge: &RunningEdge, done: impl Fn(&RunningEdge) -> bool) {
    let deadline = Instant::now() + DEADLINE;
    while !done(edge) {
        assert!(Instant::now() < deadline, "{what}: {:?}", edge.report());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_leaders_late_batches_are_dropped_once_its_successor_was_heard() {
    let (url, _server) = server_or_env().unwrap();
    let (edge, prefix) = edge_on(&url, "fenced", [1; 2]).await;
    let (tally, reading) = consumer::connect(edge.local_addr().unwrap(), 0).await.unwrap();
    let reader = tokio::spawn(reading);
    wait_until("the consumer", &edge, |g| g.report().consumers_connected == 1).await;
    let client = async_nats::connect(url).await.unwrap();
    let subject = data_subject(&prefix, 0, Stream::Reports);
    let publish = |epoch, first_seq, count| {
        let payload = batch_in_epoch(INSTANCE, epoch, first_seq, count);
        client.publish(subject.clone(), payload.into())
    };
    // The old leader (epoch 5), then its successor (epoch 9) from the next sequence.
    publish(5, 1, BATCH_COUNT).await.unwrap();
    publish(9, BATCH + 1, BATCH_COUNT).await.unwrap();
    client.flush().await.unwrap();
    wait_until("both leaders' batches", &edge, |g| g.report().received == 2 * BATCH).await;
    // The old leader wakes up: its next batch, and a heartbeat, come after its successor's.
    publish(5, 2 * BATCH + 1, BATCH_COUNT).await.unwrap();
    publish(5, 2 * BATCH + 1, 0).await.unwrap();
    client.flush().await.unwrap();
    wait_until("the late batch fenced", &edge, |g| g.report().fenced == 2).await;
    // The successor's own next batch is delivered where the fenced one claimed to be.
    publish(9, 2 * BATCH + 1, BATCH_COUNT).await.unwrap();
    client.flush().await.unwrap();
    wait_until("the successor's batch", &edge, |g| g.report().received == 3 * BATCH).await;
    let report = edge.report();
    assert_eq!(report.epoch, 9, "{report:?}");
    assert_eq!((report.fenced, report.duplicates, report.gaps), (2, 0, 0), "{report:?}");
    let deadline = Instant::now() + DEADLINE;
    while consumer::next_seqs(&tally)[0] <= 3 * BATCH {
        assert!(Instant::now() < deadline, "consumer at {:?}", consumer::next_seqs(&tally));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    reader.abort();
    edge.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_edge_started_at_a_kept_position_delivers_nothing_before_it() {
    let (url, _server) = server_or_env().unwrap();
    let (edge, prefix) = edge_on(&url, "resumed", [BATCH + 1, 1]).await;
    let client = async_nats::connect(url).await.unwrap();
    let subject = data_subject(&prefix, 0, Stream::Reports);
    for first_seq in [1, BATCH + 1] {
        let payload = batch_in_epoch(INSTANCE, 3, first_seq, BATCH_COUNT);
        client.publish(subject.clone(), payload.into()).await.unwrap();
    }
    client.flush().await.unwrap();
    wait_until("the batch after the position", &edge, |g| g.report().received == BATCH).await;
    let report = edge.report();
    assert_eq!(report.duplicates, BATCH, "the batch before the position is dropped: {report:?}");
    assert_eq!((report.gaps, report.resyncs), (0, 0), "{report:?}");
    assert_eq!(report.next_seqs[0], 2 * BATCH + 1, "{report:?}");
    edge.shutdown().await.unwrap();
}

/// An edge whose kept position names a later record than the publisher holds (its store is
/// from another exchange, or the engines started over): the publisher's heartbeats, which
/// claim less, are counted and logged as untrusted, and nothing is delivered or resynced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_position_past_the_publishers_is_a_counted_drop_not_a_delivery() {
    let (url, _server) = server_or_env().unwrap();
    let (edge, prefix) = edge_on(&url, "ahead", [1_000, 1]).await;
    let client = async_nats::connect(url).await.unwrap();
    let subject = data_subject(&prefix, 0, Stream::Reports);
    let heartbeat = batch_in_epoch(INSTANCE, 3, 5, 0);
    client.publish(subject.clone(), heartbeat.into()).await.unwrap();
    client.flush().await.unwrap();
    wait_until("the heartbeat counted", &edge, |g| g.report().untrusted == 1).await;
    let report = edge.report();
    assert_eq!((report.received, report.resyncs, report.gaps), (0, 0, 0), "{report:?}");
    assert_eq!(report.next_seqs[0], 1_000, "the kept position stands: {report:?}");
    edge.shutdown().await.unwrap();
}

/// An edge with no kept position (`FIRST_SEQ_HEARD`) joining a running exchange starts at
/// the first sequence its publisher names: no recovery of everything before it, no resync.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_edge_without_a_position_starts_at_the_first_sequence_heard() {
    use delivery::edge::FIRST_SEQ_HEARD;
    let (url, _server) = server_or_env().unwrap();
    let (edge, prefix) = edge_on(&url, "joining", [FIRST_SEQ_HEARD; 2]).await;
    let client = async_nats::connect(url).await.unwrap();
    let subject = data_subject(&prefix, 0, Stream::Reports);
    let far = 1_000_000;
    for first_seq in [far, far + BATCH] {
        let payload = batch_in_epoch(INSTANCE, 3, first_seq, BATCH_COUNT);
        client.publish(subject.clone(), payload.into()).await.unwrap();
    }
    client.flush().await.unwrap();
    wait_until("both batches", &edge, |g| g.report().received == 2 * BATCH).await;
    let report = edge.report();
    assert_eq!((report.gaps, report.resyncs, report.untrusted), (0, 0, 0), "{report:?}");
    assert_eq!(report.next_seqs[0], far + 2 * BATCH, "{report:?}");
    edge.shutdown().await.unwrap();
}
