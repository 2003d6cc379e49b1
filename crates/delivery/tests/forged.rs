//! The delivery edge against forged NATS messages on a real `nats-server` ($LEANTIER_NATS_URL, else
//! a child): a retain reply older than what was asked is not taken (the gap is declared lost
//! with a resync) and the edge goes on delivering, instead of its sequencer dying on an
//! assertion; forged heartbeats and retain replies (another instance, or the genuine instance
//! copied but claiming too far ahead, or a gap the publisher's window denies) are ignored and
//! counted, so no genuine record is dropped as a duplicate.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{INSTANCE, batch, batch_of};
use delivery::consumer;
use delivery::edge::{EdgeOptions, start};
use delivery::server::server_or_env;
use delivery::subjects::{data_subject, retain_subject};
use delivery::wire::{BATCH_RECORDS_MAX, RetainRequest, Stream};
use futures_util::StreamExt;

const DEADLINE: Duration = Duration::from_secs(20);
const BATCH: u64 = BATCH_RECORDS_MAX as u64;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retain_reply_older_than_asked_is_refused_and_delivery_goes_on() {
    let (url, _server) = server_or_env().unwrap();
    let mut options = EdgeOptions::new(&url, 0, SocketAddr::from(([127, 0, 0, 1], 0)));
    options.prefix = format!("forged{}", std::process::id());
    let prefix = options.prefix.clone();
    let edge = start(options).await.unwrap();
    let (tally, reading) = consumer::connect(edge.local_addr().unwrap(), 0).await.unwrap();
    let reader = tokio::spawn(reading);
    while edge.report().consumers_connected < 1 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let client = async_nats::connect(url).await.unwrap();
    // The forger answers every retain request with records 1.. (older than any gap).
    let mut requests = client.subscribe(retain_subject(&prefix, 0, Stream::Reports)).await.unwrap();
    let forger = client.clone();
    tokio::spawn(async move {
        while let Some(request) = requests.next().await {
            if let Some(reply) = request.reply {
                let _ = forger.publish(reply, batch(1).into()).await;
            }
        }
    });
    client.flush().await.unwrap();
    let subject = data_subject(&prefix, 0, Stream::Reports);
    // 1..=BATCH, then a gap (BATCH+1..=2·BATCH), then 2·BATCH+1..=3·BATCH and one more batch.
    for first_seq in [1, 2 * BATCH + 1, 3 * BATCH + 1] {
        client.publish(subject.clone(), batch(first_seq).into()).await.unwrap();
    }
    client.flush().await.unwrap();
    let deadline = Instant::now() + DEADLINE;
    while consumer::next_seqs(&tally)[0] <= 4 * BATCH {
        assert!(Instant::now() < deadline, "delivery stopped: {:?}", edge.report());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let report = edge.report();
    assert_eq!(report.resyncs, 1, "the gap is declared lost: {report:?}");
    assert_eq!(report.resync_records, BATCH, "{report:?}");
    assert_eq!(report.recovered, 0, "nothing taken from the forged reply: {report:?}");
    assert!(report.bad_messages >= 1, "the forged reply is counted: {report:?}");
    assert_eq!(report.received, 3 * BATCH, "every genuine record delivered: {report:?}");
    reader.abort();
    edge.shutdown().await.unwrap();
}

/// A stranger's publisher instance.
const STRANGER: u64 = 0xbad;
/// A sequence far beyond anything published (and beyond `seq_ahead_max`).
const FAR: u64 = 1 << 40;
/// How long the genuine publisher takes to answer a retain request: the stranger is faster.
const GENUINE_REPLY_DELAY: Duration = Duration::from_millis(100);

/// Answers every retain request of edge 0's report stream with `answer(request)`, after
/// `delay`.
async fn answer_retains(
    client: &async_nats::Client,
    prefix: &str,
    delay: Duration,
    answer: impl Fn(RetainRequest) -> Vec<u8> + Send + 'static,
) {
    let mut requests = client.subscribe(retain_subject(prefix, 0, Stream::Reports)).await.unwrap();
    let replier = client.clone();
    tokio::spawn(async move {
        while let Some(request) = requests.next().await {
            let (Some(reply), Ok(asked)) = (request.reply, RetainRequest::decode(&request.payload))
            else {
                continue;
            };
            tokio::time::sleep(delay).await;
            let _ = replier.publish(reply, answer(asked).into()).await;
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_heartbeats_and_replies_do_not_drop_genuine_records() {
    let (url, _server) = server_or_env().unwrap();
    let mut options = EdgeOptions::new(&url, 0, SocketAddr::from(([127, 0, 0, 1], 0)));
    options.prefix = format!("hostile{}", std::process::id());
    let prefix = options.prefix.clone();
    let edge = start(options).await.unwrap();
    let (tally, reading) = consumer::connect(edge.local_addr().unwrap(), 0).await.unwrap();
    let reader = tokio::spawn(reading);
    wait_until("the consumer", || edge.report().consumers_connected == 1).await;
    let client = async_nats::connect(url).await.unwrap();
    // The genuine publisher has assigned 1..=BATCH when the forgeries come: its window answers
    // as `publish` does (nothing at or after `from`: zero records at max(next, from)).
    answer_retains(&client, &prefix, GENUINE_REPLY_DELAY, |asked| {
        batch_of(INSTANCE, asked.from_seq.max(BATCH + 1), 0)
    })
    .await;
    // The stranger answers first: everything up to FAR is gone.
    answer_retains(&client, &prefix, Duration::ZERO, |_| batch_of(STRANGER, FAR, 0)).await;
    client.flush().await.unwrap();
    let subject = data_subject(&prefix, 0, Stream::Reports);
    client.publish(subject.clone(), batch(1).into()).await.unwrap();
    wait_until("the first genuine batch", || edge.report().received == BATCH).await;
    let forgeries = [
        batch_of(STRANGER, FAR, 0),
        batch_of(STRANGER, BATCH + 100, 0),
        // The genuine instance is no secret (every subscriber sees it): copied, too far ahead,
        batch_of(INSTANCE, FAR, 0),
        // and copied within the bound: a gap the genuine window denies.
        batch_of(INSTANCE, BATCH + 100, 0),
    ];
    for forged in forgeries {
        client.publish(subject.clone(), forged.into()).await.unwrap();
    }
    for first_seq in [BATCH + 1, 2 * BATCH + 1] {
        client.publish(subject.clone(), batch(first_seq).into()).await.unwrap();
    }
    client.flush().await.unwrap();
    wait_until("every genuine batch", || edge.report().received >= 3 * BATCH).await;
    let report = edge.report();
    assert_eq!(report.received, 3 * BATCH, "{report:?}");
    assert_eq!((report.resyncs, report.duplicates), (0, 0), "nothing dropped: {report:?}");
    assert!(report.untrusted >= 4, "every forgery counted: {report:?}");
    assert_eq!(report.next_seqs[0], 3 * BATCH + 1, "{report:?}");
    let seen = tally.lock().unwrap().clone();
    assert_eq!((seen.data[0], seen.resynced[0], seen.out_of_order), (3 * BATCH, 0, 0), "{seen:?}");
    reader.abort();
    edge.shutdown().await.unwrap();
}

/// Waits until `done`, failing the test after [`DEADLINE`].
async fn wait_until(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + DEADLINE;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
