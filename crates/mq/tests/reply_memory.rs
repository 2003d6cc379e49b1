//! The node-wide bound on owed reply memory (`NodeConfig::reply_memory_bytes_max`): a client
//! that pipelines pops of large messages and stops reading holds no more than its connection's
//! reserved part plus its share of the rest, other clients are still served — large reads
//! included — and every pop refused for memory leaves its message in the queue.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use mq::client::Client;
use mq::protocol::{
    NodeStats, ReadMode, ReadTarget, Reason, ReplyBody, ReplyFrame, Request, RequestFrame, Secret,
    decode_reply, encode_request,
};
use mq::server::{self, NodeConfig};
use mq::store::AnyStore;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedReadHalf;

const CONTENT_BYTES: usize = 256 << 10;
const REPLY_MEMORY_BYTES_MAX: usize = 2 << 20;
const CONNECTIONS_MAX: usize = 16;
const RESERVED_BYTES: usize = 16 << 10;
/// What one connection may hold while two are open: its reserved part and half of the shared
/// rest (the `share` module).
const CONNECTION_SHARE_BYTES: usize =
    RESERVED_BYTES + (REPLY_MEMORY_BYTES_MAX - CONNECTIONS_MAX * RESERVED_BYTES) / 2;
/// Small reservations (512 B each) the other client's requests may hold at the same time.
const SMALL_REPLIES_BYTES: usize = 4 * 512;
/// Messages in the queue, all popped by the stalled client in one pipeline: 10 MiB of replies,
/// more than the node's socket send buffer can take (Linux caps it at `tcp_wmem`'s maximum,
/// 4 MiB by default) plus the bound, so some pops must be refused however fast the node
/// writes.
const MESSAGES: u64 = 40;
const STEP: Duration = Duration::from_millis(50);

fn unique(tag: &str) -> String {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    format!("{tag}-{}-{nanos}", std::process::id())
}

/// Content whose first 8 bytes name the message, so a lost or doubled message is seen.
fn content(index: u64) -> Vec<u8> {
    let mut content = vec![b'x'; CONTENT_BYTES];
    content[..8].copy_from_slice(&index.to_be_bytes());
    content
}

fn index_of(content: &[u8]) -> u64 {
    u64::from_be_bytes(content[..8].try_into().unwrap())
}

async fn read_reply(read: &mut OwnedReadHalf) -> ReplyFrame {
    let mut prefix = [0; 4];
    read.read_exact(&mut prefix).await.unwrap();
    let mut payload = vec![0; u32::from_be_bytes(prefix) as usize];
    read.read_exact(&mut payload).await.unwrap();
    decode_reply(&payload).unwrap()
}

async fn stats_when(
    client: &mut Client,
    queue: &str,
    done: impl Fn(&NodeStats) -> bool,
) -> NodeStats {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let stats = client.stats(queue).await.unwrap();
        if done(&stats) {
            return stats;
        }
        assert!(Instant::now() < deadline, "stats never reached the expected state: {stats:?}");
        tokio::time::sleep(STEP).await;
    }
}

/// Registers on a raw connection with a small receive buffer and pipelines `MESSAGES` pops
/// without reading a reply; returns the reading half (the writing half is kept in a task).
async fn stalled_popper(addr: std::net::SocketAddr, queue: &str) -> OwnedReadHalf {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let stream = socket.connect(addr).await.unwrap();
    let (mut read, mut write) = stream.into_split();
    let mut frames = Vec::new();
    let register = Request::Register { name: unique("stalled"), secret: Secret(b"s".to_vec()) };
    encode_request(&RequestFrame { request_id: 0, request: register }, &mut frames);
    write.write_all(&frames).await.unwrap();
    assert!(read_reply(&mut read).await.result.is_ok());
    frames.clear();
    let pop = Request::Read { target: ReadTarget::Queue(queue.to_owned()), mode: ReadMode::Pop };
    for request_id in 1..=MESSAGES {
        encode_request(&RequestFrame { request_id, request: pop.clone() }, &mut frames);
    }
    tokio::spawn(async move {
        write.write_all(&frames).await.unwrap();
        // Kept open: closing would end the connection.
        std::future::pending::<()>().await;
    });
    read
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_reader_of_large_messages_stays_within_the_bound_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = AnyStore::open(&format!("sqlite:{}", dir.path().display()), 1).await.unwrap();
    let config = NodeConfig {
        content_bytes_max: CONTENT_BYTES,
        reply_memory_bytes_max: REPLY_MEMORY_BYTES_MAX,
        connections_max: CONNECTIONS_MAX,
        reply_memory_reserved_bytes: RESERVED_BYTES,
        write_timeout_ms: 60_000,
        ..NodeConfig::default()
    };
    let node = server::start("127.0.0.1:0", store, config).await.unwrap();
    let addr = node.addr.to_string();
    let queue = unique("large");
    let mut other = Client::connect(&addr).await.unwrap();
    other.register(&unique("other"), b"other secret").await.unwrap();
    other.create_queue(&queue).await.unwrap();
    for index in 0..MESSAGES {
        other.send(&queue, None, &content(index)).await.unwrap();
    }

    let mut stalled = stalled_popper(node.addr, &queue).await;
    // Every pop is either committed (its reply owed) or refused; none is left waiting.
    stats_when(&mut other, &queue, |s| s.pops_committed + s.reply_memory_refused == MESSAGES).await;
    // Asked again: the depth read by the first Stats may predate the last pop's commit.
    let stats = other.stats(&queue).await.unwrap();
    let popped = stats.pops_committed;
    assert_eq!(popped + stats.reply_memory_refused, MESSAGES, "{stats:?}");
    assert!(stats.reply_memory_refused > 0, "the share refused some pops: {stats:?}");
    let held_max = (CONNECTION_SHARE_BYTES + SMALL_REPLIES_BYTES) as u64;
    assert!(stats.reply_memory_bytes_peak <= held_max, "one connection's share: {stats:?}");
    assert_eq!(stats.queue_depth, MESSAGES - popped, "a refused pop dequeues nothing");

    // Another client is served meanwhile, a large read included: the stalled connection holds
    // only its share of the node's reply memory.
    let served = tokio::time::timeout(Duration::from_secs(5), async {
        let pop = Request::Read { target: ReadTarget::Queue(queue.clone()), mode: ReadMode::Pop };
        let large = other.call(pop).await;
        other.send(&queue, None, b"small").await.unwrap();
        (large, other.stats(&queue).await.unwrap())
    });
    let (large, stats) = served.await.expect("another client is served while one stalls");
    let Ok(ReplyBody::Message(large)) = large else {
        panic!("a large read by another client is served, not refused: {large:?}")
    };
    assert_eq!((stats.connections_open, stats.connections_cut_off), (2, 0), "{stats:?}");

    // The stalled client now reads: every committed pop's message reaches it, in order.
    let mut seen = BTreeSet::from([index_of(&large.content)]);
    let mut busy = 0;
    for request_id in 1..=MESSAGES {
        let reply = tokio::time::timeout(Duration::from_secs(20), read_reply(&mut stalled))
            .await
            .expect("the owed replies are written once the client reads");
        assert_eq!(reply.request_id, request_id);
        match reply.result {
            Ok(ReplyBody::Message(message)) => assert!(seen.insert(index_of(&message.content))),
            Err(error) if error.reason == Reason::Busy => busy += 1,
            other => panic!("unexpected reply {other:?}"),
        }
    }
    assert_eq!((seen.len() as u64, busy), (popped + 1, MESSAGES - popped));

    // Every message refused is still in the queue: together they are all messages, once each.
    while let Ok(ReplyBody::Message(message)) = other
        .call(Request::Read { target: ReadTarget::Queue(queue.clone()), mode: ReadMode::Pop })
        .await
    {
        if message.content != b"small" {
            assert!(seen.insert(index_of(&message.content)), "delivered twice");
        }
    }
    assert_eq!(seen, (0..MESSAGES).collect::<BTreeSet<_>>(), "no message lost");
    let stats = other.stats(&queue).await.unwrap();
    // Only this Stats request's own small reservation is held once every reply is written.
    assert!(stats.reply_memory_bytes <= 512, "{stats:?}");
    node.shutdown().await;
}
