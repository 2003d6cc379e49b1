//! The R-Gateway against a forged retain reply on a real `nats-server` ($LEANTIER_NATS_URL, else
//! a child): a reply older than what was asked is not taken (the gap is declared lost with a
//! resync) and the gateway goes on delivering, instead of its sequencer dying on an assertion
//! while the process keeps accepting consumers.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::batch;
use delivery::consumer;
use delivery::gateway::{GatewayOptions, start};
use delivery::server::server_or_env;
use delivery::subjects::{data_subject, retain_subject};
use delivery::wire::{BATCH_RECORDS_MAX, Stream};
use futures_util::StreamExt;

const DEADLINE: Duration = Duration::from_secs(20);
const BATCH: u64 = BATCH_RECORDS_MAX as u64;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retain_reply_older_than_asked_is_refused_and_delivery_goes_on() {
    let (url, _server) = server_or_env().unwrap();
    let mut options = GatewayOptions::new(&url, 0, SocketAddr::from(([127, 0, 0, 1], 0)));
    options.prefix = format!("forged{}", std::process::id());
    let prefix = options.prefix.clone();
    let gateway = start(options).await.unwrap();
    let (tally, reading) = consumer::connect(gateway.local_addr(), 0).await.unwrap();
    let reader = tokio::spawn(reading);
    while gateway.report().consumers_connected < 1 {
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
        assert!(Instant::now() < deadline, "delivery stopped: {:?}", gateway.report());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let report = gateway.report();
    assert_eq!(report.resyncs, 1, "the gap is declared lost: {report:?}");
    assert_eq!(report.resync_records, BATCH, "{report:?}");
    assert_eq!(report.recovered, 0, "nothing taken from the forged reply: {report:?}");
    assert!(report.bad_messages >= 1, "the forged reply is counted: {report:?}");
    assert_eq!(report.received, 3 * BATCH, "every genuine record delivered: {report:?}");
    reader.abort();
    gateway.shutdown().await.unwrap();
}
