//! The delivery edge's consumer side on a real `nats-server` ($LEANTIER_NATS_URL, else a child): a consumer that stops reading is cut
//! off at the named queue bound without holding back the others, and a bad hello is refused
//! with a reason code; without a listener, only an in-process consumer reads.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::batch;
use delivery::consumer;
use delivery::edge::{EdgeOptions, GOODBYE_SLOW, RunningEdge, start};
use delivery::server::server_or_env;
use delivery::subjects::data_subject;
use delivery::wire::{BATCH_RECORDS_MAX, Frame, FrameDecoder, Stream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const QUEUE_CHUNKS: usize = 64;
/// Enough batches to fill a stalled consumer's socket buffers and then its queue.
const BATCHES: u64 = 2_000;
const DEADLINE: Duration = Duration::from_secs(30);
/// Batches published between waits for the live consumer (well under `QUEUE_CHUNKS`).
const PACE_BATCHES: u64 = 8;

/// Waits until the live consumer has every record up to `last`.
async fn wait_live(tally: &consumer::SharedTally, edge: &RunningEdge, last: u64) {
    let deadline = Instant::now() + DEADLINE;
    while consumer::next_seqs(tally)[0] <= last {
        assert!(
            Instant::now() < deadline,
            "live consumer stuck at {:?}: {:?}",
            consumer::next_seqs(tally),
            edge.report()
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_consumer_is_cut_off_and_the_others_keep_up() {
    let (url, _server) = server_or_env().unwrap();
    let mut options = EdgeOptions::new(&url, 0, SocketAddr::from(([127, 0, 0, 1], 0)));
    options.consumer_queue_chunks = QUEUE_CHUNKS;
    // Its own subjects: the server may be shared ($LEANTIER_NATS_URL).
    options.prefix = format!("cutoff{}", std::process::id());
    let prefix = options.prefix.clone();
    let edge = start(options).await.unwrap();
    // The stalled consumer says hello and never reads.
    let mut stalled = TcpStream::connect(edge.local_addr().unwrap()).await.unwrap();
    let mut hello = Vec::new();
    Frame::Hello { version: delivery::wire::WIRE_VERSION }.write(&mut hello);
    stalled.write_all(&hello).await.unwrap();
    let (tally, reading) = consumer::connect(edge.local_addr().unwrap(), 0).await.unwrap();
    let reader = tokio::spawn(reading);
    while edge.report().consumers_connected < 2 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let client = async_nats::connect(url).await.unwrap();
    let subject = data_subject(&prefix, 0, Stream::Reports);
    for index in 0..BATCHES {
        let first_seq = 1 + index * BATCH_RECORDS_MAX as u64;
        client.publish(subject.clone(), batch(first_seq).into()).await.unwrap();
        if index % PACE_BATCHES == PACE_BATCHES - 1 {
            // Wait for the live consumer, so only the stalled one falls behind (a loaded
            // 2-core host must not decide who is slow).
            client.flush().await.unwrap();
            wait_live(&tally, &edge, first_seq + BATCH_RECORDS_MAX as u64 - 1).await;
        }
    }
    client.flush().await.unwrap();
    let records = BATCHES * BATCH_RECORDS_MAX as u64;
    wait_live(&tally, &edge, records).await;
    let report = edge.report();
    assert_eq!(report.consumers_cut_off, 1, "exactly the stalled consumer is cut off");
    assert_eq!(report.gaps, 0);
    let tally = tally.lock().unwrap().clone();
    assert_eq!(tally.data[0], records, "the live consumer got every record");
    assert_eq!(tally.out_of_order, 0);
    // Draining the stalled consumer's socket shows the stream ends (with the slow goodbye
    // when it still fits) rather than going on silently.
    let (edge_report, _) = edge.shutdown().await.unwrap();
    assert_eq!(edge_report.consumers_cut_off, 1);
    let mut decoder = FrameDecoder::default();
    let mut buffer = vec![0u8; 1 << 16];
    let mut goodbye = None;
    while let Ok(Ok(n)) = tokio::time::timeout(DEADLINE, stalled.read(&mut buffer)).await {
        if n == 0 {
            break;
        }
        decoder.extend(&buffer[..n]);
        while let Some(frame) = decoder.next_frame().unwrap() {
            if let Frame::Goodbye { reason } = frame {
                goodbye = Some(reason);
            }
        }
    }
    assert!(goodbye.is_none_or(|reason| reason == GOODBYE_SLOW), "goodbye {goodbye:?}");
    reader.abort();
}

#[tokio::test]
async fn a_bad_hello_is_refused_with_a_reason() {
    let (url, _server) = server_or_env().unwrap();
    let mut options = EdgeOptions::new(&url, 0, SocketAddr::from(([127, 0, 0, 1], 0)));
    options.prefix = format!("hello{}", std::process::id());
    let edge = start(options).await.unwrap();
    let mut stream = TcpStream::connect(edge.local_addr().unwrap()).await.unwrap();
    // A plausible length, then a body that is not a hello.
    stream.write_all(&[6, 0, 0, 0, 0x10, b'N', b'O', b'P', b'E', 1]).await.unwrap();
    let mut reply = Vec::new();
    tokio::time::timeout(DEADLINE, stream.read_to_end(&mut reply)).await.unwrap().unwrap();
    let mut decoder = FrameDecoder::default();
    decoder.extend(&reply);
    let frame = decoder.next_frame().unwrap();
    assert_eq!(frame, Some(Frame::Goodbye { reason: delivery::wire::WireError::Magic.code() }));
    assert_eq!(edge.report().consumers_refused, 1);
    edge.shutdown().await.unwrap();
}

/// An edge started without a listener (as the edge role runs its delivery edges) has no
/// address, and an in-process consumer reads every record in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_listener_only_an_in_process_consumer_reads() {
    let (url, _server) = server_or_env().unwrap();
    let mut options = EdgeOptions::new(&url, 0, SocketAddr::from(([127, 0, 0, 1], 0)));
    options.listen = None;
    options.prefix = format!("inproc{}", std::process::id());
    let prefix = options.prefix.clone();
    let edge = start(options).await.unwrap();
    assert_eq!(edge.local_addr(), None, "no consumer port");
    let mut consumer = edge.attach();
    let client = async_nats::connect(url).await.unwrap();
    let subject = data_subject(&prefix, 0, Stream::Reports);
    const IN_PROCESS_BATCHES: u64 = 4;
    for index in 0..IN_PROCESS_BATCHES {
        let first_seq = 1 + index * BATCH_RECORDS_MAX as u64;
        client.publish(subject.clone(), batch(first_seq).into()).await.unwrap();
    }
    client.flush().await.unwrap();
    let (mut decoder, mut next_seq) = (FrameDecoder::default(), 1);
    let records = IN_PROCESS_BATCHES * BATCH_RECORDS_MAX as u64;
    while next_seq <= records {
        let chunk = tokio::time::timeout(DEADLINE, consumer.next_chunk()).await.unwrap();
        decoder.extend(&chunk.expect("the edge still runs"));
        while let Some(frame) = decoder.next_frame().unwrap() {
            let Frame::Data { stream: Stream::Reports, seq, .. } = frame else {
                panic!("{frame:?}")
            };
            assert_eq!(seq, next_seq, "in order, none missing");
            next_seq += 1;
        }
    }
    let (report, _) = edge.shutdown().await.unwrap();
    assert_eq!(report.gaps, 0);
}
