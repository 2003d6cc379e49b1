//! `SendBatch` frames through a real node over TCP (SQLite; PostgreSQL too when
//! `LEANTIER_PG_URL` is set): each send is checked and answered on its own, single frames keep
//! working beside batches on one connection, hostile batch frames get a reason and leave the
//! connection served, and full pipelines of batches are all answered.

use mq::client::Client;
use mq::protocol::{
    ErrorReply, PROTOCOL_VERSION, ReadMode, ReadTarget, Reason, ReplyBody, SEND_BATCH_MAX,
    SendOutcome, SendRef, decode_reply,
};
use mq::server::{self, NodeConfig, RunningNode};
use mq::store::AnyStore;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn unique(tag: &str) -> String {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    format!("{tag}-{}-{nanos}", std::process::id())
}

async fn sqlite_node(dir: &tempfile::TempDir, config: NodeConfig) -> RunningNode {
    let store = AnyStore::open(&format!("sqlite:{}", dir.path().display()), 1).await.unwrap();
    server::start("127.0.0.1:0", store, config).await.unwrap()
}

/// The outcomes of a `SendBatch` reply, or the panic message saying what came instead.
fn outcomes(result: Result<ReplyBody, ErrorReply>) -> Vec<SendOutcome> {
    match result {
        Ok(ReplyBody::SentBatch(outcomes)) => outcomes,
        other => panic!("expected a SentBatch reply, got {other:?}"),
    }
}

fn reasons(outcomes: &[SendOutcome]) -> Vec<Reason> {
    outcomes.iter().map(|o| o.as_ref().map_or_else(|e| e.reason, |_| Reason::Ok)).collect()
}

/// One batch mixing good sends with every per-send refusal; the good ones commit in order.
async fn a_mixed_batch_answers_each_send_with_its_own_reason(node: &RunningNode) {
    let addr = node.addr.to_string();
    let mut client = Client::connect(&addr).await.unwrap();
    let me = client.register(&unique("batcher"), b"secret").await.unwrap();
    let queue = unique("q");
    client.create_queue(&queue).await.unwrap();
    let big = vec![b'x'; 101];
    let send = |queue, receiver, content| SendRef { queue, receiver, content };
    let sends = [
        send(queue.as_str(), None, &b"first"[..]),
        send("no-such-queue", None, b"lost"),
        send(queue.as_str(), None, &big),
        send(queue.as_str(), Some(u64::MAX / 2), b"to nobody"),
        send(queue.as_str(), Some(me), b"second"),
    ];
    let first_id = client.submit_sends(&sends).await.unwrap();
    let (id, result) = client.receive().await.unwrap();
    assert_eq!(id, first_id, "the reply carries the batch's first request id");
    let outcomes = outcomes(result);
    let expected =
        [Reason::Ok, Reason::UnknownQueue, Reason::TooLarge, Reason::UnknownReceiver, Reason::Ok];
    assert_eq!(reasons(&outcomes), expected, "{outcomes:?}");
    let sent: Vec<u64> =
        outcomes.iter().filter_map(|o| o.as_ref().ok()).map(|s| s.message_id).collect();
    // Single frames still work on the same connection, numbered after the batch.
    for (content, message_id) in [(&b"first"[..], sent[0]), (b"second", sent[1])] {
        let m = client.read(ReadTarget::Queue(queue.clone()), ReadMode::Pop).await.unwrap();
        assert_eq!((m.id, m.content.as_slice()), (message_id, content));
    }
    let none = client.read(ReadTarget::Queue(queue.clone()), ReadMode::Pop).await;
    assert_eq!(none.unwrap_err().reason(), Some(Reason::NoMessage), "refused sends stored nothing");
    client.delete_queue(&queue, true).await.unwrap();
}

#[tokio::test]
async fn sqlite_mixed_batches_answer_each_send_with_its_own_reason() {
    let dir = tempfile::tempdir().unwrap();
    let node =
        sqlite_node(&dir, NodeConfig { content_bytes_max: 100, ..NodeConfig::default() }).await;
    a_mixed_batch_answers_each_send_with_its_own_reason(&node).await;
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_mixed_batches_answer_each_send_with_its_own_reason() {
    let Ok(url) = std::env::var("LEANTIER_PG_URL") else {
        println!("skipped: LEANTIER_PG_URL not set (eval \"$(scripts/pg-env)\")");
        return;
    };
    let store = AnyStore::open(&url, 2).await.unwrap();
    let config = NodeConfig { content_bytes_max: 100, db_workers: 2, ..NodeConfig::default() };
    let node = server::start("127.0.0.1:0", store, config).await.unwrap();
    a_mixed_batch_answers_each_send_with_its_own_reason(&node).await;
    node.shutdown().await;
}

/// Full pipelines of full batches, interleaved with single sends, from several connections at
/// once: every send is answered and committed, in each connection's order (one database
/// worker: with several, batches commit concurrently and a connection's order across them is
/// not promised), with the batches capped near `batch_max` (a frame's sends are never split,
/// so a collection that takes more carries it over to the next batch).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_batches_are_all_answered_and_committed_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let config = NodeConfig { batch_max: 100, db_workers: 1, ..NodeConfig::default() };
    let node = sqlite_node(&dir, config).await;
    let addr = node.addr.to_string();
    let queue = unique("q");
    let mut admin = Client::connect(&addr).await.unwrap();
    admin.register(&unique("admin"), b"secret").await.unwrap();
    admin.create_queue(&queue).await.unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..4u8 {
        let (addr, queue) = (addr.clone(), queue.clone());
        tasks.spawn(async move {
            let mut client = Client::connect(&addr).await.unwrap();
            client.register(&unique(&format!("p{c}")), b"secret").await.unwrap();
            let contents: Vec<Vec<u8>> = (0..SEND_BATCH_MAX).map(|i| vec![c, i as u8]).collect();
            let sends: Vec<SendRef<'_>> = contents
                .iter()
                .map(|content| SendRef { queue: &queue, receiver: None, content })
                .collect();
            // Four full batches exceed the connection's 64 places: the node stops reading
            // until replies are taken, and the client takes them after writing everything.
            let mut submitted = Vec::new();
            for round in 0..4 {
                submitted.push((client.submit_sends(&sends).await.unwrap(), SEND_BATCH_MAX));
                let single = mq::protocol::Request::Send {
                    queue: queue.clone(),
                    receiver: None,
                    content: vec![c, 200 + round],
                };
                submitted.push((client.submit(single).await.unwrap(), 1));
            }
            let mut ids = Vec::new();
            for (request_id, count) in submitted {
                let (id, result) = client.receive().await.unwrap();
                assert_eq!(id, request_id);
                match result.unwrap() {
                    ReplyBody::SentBatch(outcomes) => {
                        assert_eq!(outcomes.len(), count);
                        ids.extend(outcomes.into_iter().map(|o| o.unwrap().message_id));
                    }
                    ReplyBody::Sent { message_id, .. } => ids.push(message_id),
                    other => panic!("{other:?}"),
                }
            }
            assert!(ids.windows(2).all(|w| w[0] < w[1]), "a connection's sends commit in order");
            ids.len()
        });
    }
    let mut sent = 0;
    while let Some(done) = tasks.join_next().await {
        sent += done.unwrap();
    }
    assert_eq!(sent, 4 * 4 * (SEND_BATCH_MAX + 1));
    let stats = admin.stats(&queue).await.unwrap();
    assert_eq!(stats.queue_depth, sent as u64, "every answered send is stored");
    assert_eq!(stats.sends_committed, sent as u64);
    let mean = stats.sends_committed as f64 / stats.batches_committed.max(1) as f64;
    assert!(mean <= (100 + SEND_BATCH_MAX) as f64, "batches stay near batch_max: {mean}");
    node.shutdown().await;
}

async fn raw_call(stream: &mut tokio::net::TcpStream, payload: &[u8]) -> mq::protocol::ReplyFrame {
    stream.write_all(&(payload.len() as u32).to_be_bytes()).await.unwrap();
    stream.write_all(payload).await.unwrap();
    let mut prefix = [0; 4];
    stream.read_exact(&mut prefix).await.unwrap();
    let mut reply = vec![0; u32::from_be_bytes(prefix) as usize];
    stream.read_exact(&mut reply).await.unwrap();
    decode_reply(&reply).unwrap()
}

/// A `SendBatch` header (op 12) with request id 40 and `count`, then `body`.
fn batch_frame(count: u16, body: &[u8]) -> Vec<u8> {
    let mut frame = vec![PROTOCOL_VERSION, 12];
    frame.extend_from_slice(&40u64.to_be_bytes());
    frame.extend_from_slice(&count.to_be_bytes());
    frame.extend_from_slice(body);
    frame
}

/// One send of queue "q", no receiver, content "x", as bytes.
fn one_send() -> Vec<u8> {
    let mut send = vec![0, 1, b'q', 0];
    send.extend_from_slice(&1u32.to_be_bytes());
    send.push(b'x');
    send
}

#[tokio::test]
async fn hostile_batch_frames_get_a_reason_and_the_connection_stays_served() {
    let dir = tempfile::tempdir().unwrap();
    let node = sqlite_node(&dir, NodeConfig::default()).await;
    let addr = node.addr.to_string();
    let mut raw = tokio::net::TcpStream::connect(&addr).await.unwrap();
    // Before registering: every send of a batch is refused NotRegistered, one outcome each.
    let three = [one_send(), one_send(), one_send()].concat();
    let reply = raw_call(&mut raw, &batch_frame(3, &three)).await;
    assert_eq!(reply.request_id, 40);
    assert_eq!(reasons(&outcomes(reply.result)), [Reason::NotRegistered; 3]);
    let refusals = [
        (batch_frame(0, &[]), Reason::Malformed, "at least one"),
        (batch_frame(65, &three), Reason::TooLarge, "at most 64"),
        (batch_frame(u16::MAX, &[]), Reason::TooLarge, "at most 64"),
        (batch_frame(4, &three), Reason::Malformed, "truncated"),
        (batch_frame(2, &three), Reason::Malformed, "trailing"),
    ];
    for (frame, reason, detail) in refusals {
        let reply = raw_call(&mut raw, &frame).await;
        let error = reply.result.unwrap_err();
        assert_eq!((reply.request_id, error.reason), (40, reason), "{error}");
        assert!(error.detail.contains(detail), "{error}");
    }
    // Still served: the same connection registers and sends a batch.
    let mut client = Client::connect(&addr).await.unwrap();
    client.register(&unique("after"), b"secret").await.unwrap();
    client.create_queue("q").await.unwrap();
    let sends = [SendRef { queue: "q", receiver: None, content: b"x" }; 2];
    client.submit_sends(&sends).await.unwrap();
    assert_eq!(reasons(&outcomes(client.receive().await.unwrap().1)), [Reason::Ok; 2]);
    let refused = client.submit_sends(&[]).await.unwrap_err();
    assert!(refused.to_string().contains("1..=64"), "{refused}");
    node.shutdown().await;
}
