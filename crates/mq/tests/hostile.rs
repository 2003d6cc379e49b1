//! Hostile clients (issue 17): none can freeze the node, exhaust its memory or descriptors, act
//! as another client or delete another client's queue; TLS works end to end.

mod common;

use std::process::Child;
use std::time::{Duration, Instant};

use mq::client::Client;
use mq::protocol::{
    FRAME_BYTES_MAX, NodeStats, ReadMode, ReadTarget, Reason, Request, RequestFrame, Secret,
    decode_reply, encode_request,
};
use mq::server::{self, NodeConfig, RunningNode};
use mq::store::AnyStore;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn unique(tag: &str) -> String {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    format!("{tag}-{}-{nanos}", std::process::id())
}

async fn sqlite_node(config: NodeConfig) -> (RunningNode, String, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = AnyStore::open(&format!("sqlite:{}", dir.path().display()), 1).await.unwrap();
    let node = server::start("127.0.0.1:0", store, config).await.unwrap();
    let addr = node.addr.to_string();
    (node, addr, dir)
}

async fn registered(addr: &str, name: &str, secret: &[u8]) -> Client {
    let mut client = Client::connect(addr).await.unwrap();
    client.register(name, secret).await.unwrap();
    client
}

/// Reads one reply frame off a raw connection: (version byte, decoded reply).
async fn read_raw_reply(stream: &mut TcpStream) -> (u8, mq::protocol::ReplyFrame) {
    let mut prefix = [0; 4];
    stream.read_exact(&mut prefix).await.unwrap();
    let mut payload = vec![0; u32::from_be_bytes(prefix) as usize];
    stream.read_exact(&mut payload).await.unwrap();
    let version = payload[0];
    payload[0] = mq::protocol::PROTOCOL_VERSION;
    (version, decode_reply(&payload).unwrap())
}

/// Polls `stats` until `done` holds, failing after `limit`.
async fn wait_for_stats(
    client: &mut Client,
    queue: &str,
    limit: Duration,
    done: impl Fn(&NodeStats) -> bool,
) -> NodeStats {
    let deadline = Instant::now() + limit;
    loop {
        let stats = client.stats(queue).await.unwrap();
        if done(&stats) {
            return stats;
        }
        assert!(Instant::now() < deadline, "stats never reached the expected state: {stats:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

const STUCK_CONNECTIONS: usize = 4;
const PEEKS_PER_STUCK_CONNECTION: u64 = 2000;

/// Four connections pipeline Peeks of a 4 KiB message with a 4 KiB receive buffer and never
/// read: before the fix their unwritten replies held every handler slot and the node froze.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_stop_reading_hold_no_slot_and_are_cut_off() {
    let write_timeout_ms = 4000;
    let config = NodeConfig { handler_slots: 128, write_timeout_ms, ..NodeConfig::default() };
    let (node, addr, _dir) = sqlite_node(config).await;
    let queue = unique("peeked");
    let mut owner = registered(&addr, &unique("owner"), b"owner secret").await;
    owner.create_queue(&queue).await.unwrap();
    owner.send(&queue, None, &[b'x'; 4096]).await.unwrap();

    let mut stuck = Vec::new();
    for i in 0..STUCK_CONNECTIONS {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let mut stream = socket.connect(node.addr).await.unwrap();
        let mut frames = Vec::new();
        let name = unique(&format!("stuck{i}"));
        let register = Request::Register { name, secret: Secret(b"s".to_vec()) };
        encode_request(&RequestFrame { request_id: 1, request: register }, &mut frames);
        stream.write_all(&frames).await.unwrap();
        let (_, reply) = read_raw_reply(&mut stream).await;
        assert!(reply.result.is_ok(), "{reply:?}");
        frames.clear();
        let peek = Request::Read { target: ReadTarget::Queue(queue.clone()), mode: ReadMode::Peek };
        for request_id in 2..2 + PEEKS_PER_STUCK_CONNECTION {
            encode_request(&RequestFrame { request_id, request: peek.clone() }, &mut frames);
        }
        // The node stops reading once its outbound queue is full; write from a task.
        let (read, mut write) = stream.into_split();
        let writer = tokio::spawn(async move {
            let _ = write.write_all(&frames).await;
            write
        });
        stuck.push((read, writer));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;

    let prompt = tokio::time::timeout(Duration::from_secs(3), async {
        let mut other = registered(&addr, &unique("other"), b"other secret").await;
        other.send(&queue, None, b"still served").await.unwrap();
        other
    })
    .await;
    let mut other = prompt.expect("a reading client is served while others stop reading");
    let stats = other.stats(&queue).await.unwrap();
    assert_eq!(
        (stats.connections_cut_off, stats.connections_open),
        (0, STUCK_CONNECTIONS as u64 + 2),
        "served while the stuck connections were still open, not because they were cut off"
    );
    let stats = wait_for_stats(&mut other, &queue, Duration::from_secs(15), |s| {
        s.connections_cut_off >= STUCK_CONNECTIONS as u64
    })
    .await;
    assert_eq!(stats.connections_cut_off, STUCK_CONNECTIONS as u64, "{stats:?}");
    // What the node wrote before cutting a connection off is there, then the connection ends.
    let (mut read, _writer) = stuck.pop().unwrap();
    let mut sink = vec![0; 1 << 16];
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match read.read(&mut sink).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    });
    ended.await.expect("a cut-off connection ends");
    node.shutdown().await;
}

/// The node's resident set size in KiB, from /proc.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS line");
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Kills the node child however the test ends.
struct NodeProcess(Child);

impl Drop for NodeProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_node(store: &str, extra: &[&str]) -> (NodeProcess, String) {
    let (child, addr) = common::spawn_node(store, 1, extra);
    (NodeProcess(child), addr)
}

/// Largest RSS seen over `window`, sampled every 100 ms.
async fn peak_rss_kib(pid: u32, window: Duration) -> u64 {
    let mut peak = rss_kib(pid);
    let until = Instant::now() + window;
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(100)).await;
        peak = peak.max(rss_kib(pid));
    }
    peak
}

const FLOOD_CONNECTIONS: usize = 400;
const PARTIAL_FRAME_CONNECTIONS: usize = 64;
const PARTIAL_FRAME_BYTES: usize = 768 * 1024;
const NODE_FRAME_MEMORY_BYTES: usize = 8 << 20;
/// Growth of the node's RSS the floods may cause. Before the fix the prefix-only flood alone
/// took FLOOD_CONNECTIONS MiB (each declared megabyte allocated and zeroed at once), and kept it.
const RSS_GROWTH_MAX_KIB: u64 = 40 * 1024;

/// FLOOD_CONNECTIONS connections each send only a 1 MiB length prefix, then close; the node's
/// (peak RSS while they are open, RSS after they closed), in KiB.
async fn prefix_flood(addr: &str, pid: u32, watcher: &mut Client, queue: &str) -> (u64, u64) {
    let mut flood = Vec::new();
    for _ in 0..FLOOD_CONNECTIONS {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(&(FRAME_BYTES_MAX as u32).to_be_bytes()).await.unwrap();
        flood.push(stream);
    }
    // A stranger may not declare a frame longer than a Register: each is refused TooLarge and
    // closed as soon as the node reads its prefix.
    let during = peak_rss_kib(pid, Duration::from_millis(700)).await;
    drop(flood);
    wait_for_stats(watcher, queue, Duration::from_secs(10), |s| s.connections_open == 1).await;
    (during, peak_rss_kib(pid, Duration::from_millis(300)).await)
}

/// Many connections send only a 1 MiB length prefix, then many send most of a 1 MiB frame: the
/// node's RSS stays bounded during each flood and comes back down after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floods_of_declared_and_partial_frames_keep_node_memory_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let frame_memory = NODE_FRAME_MEMORY_BYTES.to_string();
    // 512 connections' reserved parts (8 KiB each) take half of the small frame budget.
    let config = dir.path().join("node.toml");
    std::fs::write(&config, "connections_max = 512\n").unwrap();
    let (node, addr) = spawn_node(
        &format!("sqlite:{}", dir.path().display()),
        &["--frame-memory-bytes-max", &frame_memory, "--config", config.to_str().unwrap()],
    );
    let pid = node.0.id();
    let queue = unique("flood");
    let mut watcher = registered(&addr, &unique("watcher"), b"w").await;
    watcher.create_queue(&queue).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let baseline = rss_kib(pid);

    let (during_prefixes, after_prefixes) = prefix_flood(&addr, pid, &mut watcher, &queue).await;

    let mut partial = tokio::task::JoinSet::new();
    for _ in 0..PARTIAL_FRAME_CONNECTIONS {
        let mut stream = TcpStream::connect(&addr).await.unwrap();
        partial.spawn(async move {
            let mut bytes = (FRAME_BYTES_MAX as u32).to_be_bytes().to_vec();
            bytes.resize(4 + PARTIAL_FRAME_BYTES, 7);
            // Refused connections are closed while they write: errors are expected.
            let _ = stream.write_all(&bytes).await;
            stream
        });
    }
    let mut held = Vec::new();
    while let Some(stream) = partial.join_next().await {
        held.push(stream.unwrap());
    }
    // Unregistered, each is refused TooLarge at its prefix (before round two, most were cut
    // off once the node frame budget was full).
    let stats =
        wait_for_stats(&mut watcher, &queue, Duration::from_secs(10), |s| s.connections_open == 1)
            .await;
    let during_partial = peak_rss_kib(pid, Duration::from_millis(500)).await;
    drop(held);
    wait_for_stats(&mut watcher, &queue, Duration::from_secs(10), |s| s.connections_open == 1)
        .await;
    let after_partial = peak_rss_kib(pid, Duration::from_millis(300)).await;

    println!(
        "node RSS KiB: baseline {baseline}; {FLOOD_CONNECTIONS} bare 1 MiB prefixes: during \
         {during_prefixes}, after {after_prefixes}; {PARTIAL_FRAME_CONNECTIONS} × {} KiB of 1 MiB \
         frames (node frame budget {} MiB): during {during_partial}, after {after_partial}; \
         cut off {}",
        PARTIAL_FRAME_BYTES / 1024,
        NODE_FRAME_MEMORY_BYTES >> 20,
        stats.connections_cut_off
    );
    for (what, rss) in [
        ("during the prefix flood", during_prefixes),
        ("after the prefix flood", after_prefixes),
        ("during the partial-frame flood", during_partial),
        ("after the partial-frame flood", after_partial),
    ] {
        assert!(
            rss < baseline + RSS_GROWTH_MAX_KIB,
            "node RSS {what}: {rss} KiB, baseline {baseline} KiB"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_cannot_be_registered_without_its_secret() {
    let (node, addr, _dir) = sqlite_node(NodeConfig::default()).await;
    let name = unique("alice");
    let mut alice = registered(&addr, &name, b"alice's secret").await;
    let alice_id = alice.client_id().unwrap();
    let queue = unique("inbox");
    alice.create_queue(&queue).await.unwrap();
    alice.send(&queue, Some(alice_id), b"private").await.unwrap();

    let mut mallory = Client::connect(&addr).await.unwrap();
    let refused = mallory.register(&name, b"a guess").await.unwrap_err();
    assert_eq!(refused.reason(), Some(Reason::BadCredentials), "{refused}");
    let read = mallory.read(ReadTarget::ForMe { queue: None, sender: None }, ReadMode::Pop).await;
    assert_eq!(read.unwrap_err().reason(), Some(Reason::NotRegistered), "still nobody");
    let empty = mallory.register(&unique("mallory"), b"").await.unwrap_err();
    assert_eq!(empty.reason(), Some(Reason::InvalidSecret));

    let mut again = registered(&addr, &name, b"alice's secret").await;
    assert_eq!(again.client_id(), Some(alice_id), "the right secret is the same client");
    let m = again.read(ReadTarget::ForMe { queue: None, sender: None }, ReadMode::Pop).await;
    assert_eq!(m.unwrap().content, b"private");

    // A version-1 client (no secret in Register) is told why, in a reply it can decode.
    let mut old = TcpStream::connect(&addr).await.unwrap();
    let mut frame = vec![1, 1];
    frame.extend_from_slice(&5u64.to_be_bytes());
    frame.extend_from_slice(&(name.len() as u16).to_be_bytes());
    frame.extend_from_slice(name.as_bytes());
    old.write_all(&(frame.len() as u32).to_be_bytes()).await.unwrap();
    old.write_all(&frame).await.unwrap();
    let (version, reply) = read_raw_reply(&mut old).await;
    let error = reply.result.unwrap_err();
    assert_eq!((version, reply.request_id, error.reason), (1, 5, Reason::UnsupportedVersion));
    assert!(error.detail.contains("version 2"), "{}", error.detail);
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_owner_deletes_or_purges_a_queue() {
    let (node, addr, _dir) = sqlite_node(NodeConfig::default()).await;
    let mut alice = registered(&addr, &unique("alice"), b"a").await;
    let mut bob = registered(&addr, &unique("bob"), b"b").await;
    let queue = unique("alice's");
    alice.create_queue(&queue).await.unwrap();
    alice.send(&queue, None, b"kept").await.unwrap();
    for purge in [false, true] {
        let refused = bob.delete_queue(&queue, purge).await.unwrap_err();
        assert_eq!(refused.reason(), Some(Reason::NotOwner), "purge={purge}: {refused}");
    }
    let m = bob.read(ReadTarget::Queue(queue.clone()), ReadMode::Peek).await.unwrap();
    assert_eq!(m.content, b"kept", "the refused purge removed nothing");
    assert_eq!(alice.delete_queue(&queue, true).await.unwrap(), 1);
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connection_limit_refuses_and_idle_connections_are_closed() {
    let config = NodeConfig { connections_max: 3, idle_timeout_ms: 1500, ..NodeConfig::default() };
    let (node, addr, _dir) = sqlite_node(config).await;
    let queue = unique("q");
    let mut a = registered(&addr, &unique("a"), b"a").await;
    a.create_queue(&queue).await.unwrap();
    let mut b = registered(&addr, &unique("b"), b"b").await;
    // A slow-loris: half a length prefix, then nothing.
    let mut trickler = TcpStream::connect(&addr).await.unwrap();
    trickler.write_all(&[0, 0]).await.unwrap();
    wait_for_stats(&mut b, &queue, Duration::from_secs(5), |s| s.connections_open == 3).await;

    let mut fourth = TcpStream::connect(&addr).await.unwrap();
    let (_, reply) = read_raw_reply(&mut fourth).await;
    assert_eq!(reply.result.unwrap_err().reason, Reason::ConnectionLimit);
    assert_eq!(fourth.read(&mut [0; 1]).await.unwrap(), 0, "closed after the refusal");
    let stats = b.stats(&queue).await.unwrap();
    assert_eq!((stats.connections_refused, stats.connections_open), (1, 3), "{stats:?}");

    tokio::time::sleep(Duration::from_millis(3000)).await;
    assert!(a.stats(&queue).await.is_err(), "an idle connection was closed");
    let mut rest = [0; 1];
    let trickle_end = trickler.read(&mut rest).await;
    assert!(matches!(trickle_end, Ok(0) | Err(_)), "a half-sent frame is closed: {trickle_end:?}");
    let mut c = registered(&addr, &unique("c"), b"c").await;
    let stats = c.stats(&queue).await.unwrap();
    assert_eq!(stats.connections_idle_closed, 3, "{stats:?}");
    assert_eq!(stats.connections_open, 1, "{stats:?}");
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_round_trip_with_a_generated_certificate() {
    let rcgen::CertifiedKey { cert, signing_key } =
        rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let cert_pem = cert.pem();
    let server =
        mq::tls::server_config(cert_pem.as_bytes(), signing_key.serialize_pem().as_bytes())
            .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = AnyStore::open(&format!("sqlite:{}", dir.path().display()), 1).await.unwrap();
    let node = server::start_with_tls("127.0.0.1:0", store, NodeConfig::default(), Some(server))
        .await
        .unwrap();
    let addr = node.addr.to_string();

    let trust = mq::tls::client_config(cert_pem.as_bytes()).unwrap();
    let mut client = Client::connect_tls(&addr, "localhost", trust.clone()).await.unwrap();
    client.register(&unique("tls"), b"t").await.unwrap();
    let queue = unique("tls-q");
    client.create_queue(&queue).await.unwrap();
    let id = client.send(&queue, None, b"over tls").await.unwrap();
    let m = client.read(ReadTarget::Queue(queue.clone()), ReadMode::Pop).await.unwrap();
    assert_eq!((m.id, m.content.as_slice()), (id, &b"over tls"[..]));

    let wrong_name = Client::connect_tls(&addr, "elsewhere.example", trust).await;
    assert!(wrong_name.is_err(), "a certificate for another name is rejected");
    let plain = tokio::time::timeout(Duration::from_secs(5), async {
        let mut plain = Client::connect(&addr).await?;
        plain.register(&unique("plain"), b"p").await
    })
    .await
    .expect("a plain client gets an error, not a hang");
    assert!(plain.is_err(), "plain TCP to a TLS listener fails");
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_never_registers_is_closed_however_often_it_sends() {
    let config = NodeConfig { idle_timeout_ms: 1_000, ..NodeConfig::default() };
    let (node, addr, _dir) = sqlite_node(config).await;
    let mut stranger = TcpStream::connect(&addr).await.unwrap();
    let started = std::time::Instant::now();
    // A frame every 200 ms (inside the idle timeout), never a Register: each is refused.
    let closed_after = loop {
        let mut frame = Vec::new();
        let request = Request::Read { target: ReadTarget::Queue("q".into()), mode: ReadMode::Peek };
        encode_request(&RequestFrame { request_id: 1, request }, &mut frame);
        if stranger.write_all(&frame).await.is_err() {
            break started.elapsed();
        }
        let mut prefix = [0; 4];
        match tokio::time::timeout(Duration::from_millis(200), stranger.read(&mut prefix)).await {
            Ok(Ok(0) | Err(_)) => break started.elapsed(),
            Ok(Ok(_)) => {
                let mut rest = vec![0; 4096];
                let _ =
                    tokio::time::timeout(Duration::from_millis(50), stranger.read(&mut rest)).await;
            }
            Err(_) => {}
        }
        assert!(started.elapsed() < Duration::from_secs(10), "the stranger is never closed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(closed_after >= Duration::from_millis(900), "closed too early: {closed_after:?}");
    let mut c = registered(&addr, &unique("c"), b"c").await;
    let queue = unique("q");
    c.create_queue(&queue).await.unwrap();
    let stats = c.stats(&queue).await.unwrap();
    assert_eq!(stats.connections_idle_closed, 1, "counted with the idle closes: {stats:?}");
    node.shutdown().await;
}
