//! A node over real TCP with real SQLite / PostgreSQL: bad input, several nodes on one
//! database, and SIGKILL of a node process under load.

mod common;

use std::collections::HashSet;
use std::process::Child;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mq::client::{Client, ClientError};
use mq::protocol::{
    FRAME_BYTES_MAX, ReadMode, ReadTarget, Reason, ReplyBody, Request, decode_reply,
};
use mq::server::{self, NodeConfig};
use mq::store::AnyStore;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn pg_url() -> Option<String> {
    let url = std::env::var("LEANTIER_PG_URL").ok();
    if url.is_none() {
        println!("skipped: LEANTIER_PG_URL not set (eval \"$(scripts/pg-env)\")");
    }
    url
}

fn unique(tag: &str) -> String {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    format!("{tag}-{}-{nanos}", std::process::id())
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

#[tokio::test]
async fn bad_input_gets_reason_codes_and_the_node_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let store = AnyStore::open(&format!("sqlite:{}", dir.path().display()), 1).await.unwrap();
    let config = NodeConfig { content_bytes_max: 100, ..NodeConfig::default() };
    let node = server::start("127.0.0.1:0", store, config).await.unwrap();
    let addr = node.addr.to_string();
    let mut raw = tokio::net::TcpStream::connect(&addr).await.unwrap();
    // version 2, op 9 (ListQueues), request id 77, then a stray byte.
    let mut frame = vec![mq::protocol::PROTOCOL_VERSION, 9];
    frame.extend_from_slice(&77u64.to_be_bytes());
    frame.push(0);
    let reply = raw_call(&mut raw, &frame).await;
    assert_eq!((reply.request_id, reply.result.unwrap_err().reason), (77, Reason::Malformed));
    frame.pop();
    let reply = raw_call(&mut raw, &frame).await;
    assert_eq!(
        reply.result.unwrap_err().reason,
        Reason::NotRegistered,
        "same connection still served"
    );
    frame[1] = 99;
    assert_eq!(raw_call(&mut raw, &frame).await.result.unwrap_err().reason, Reason::UnknownOp);
    let empty = raw_call(&mut raw, &[]).await;
    assert_eq!((empty.request_id, empty.result.unwrap_err().reason), (0, Reason::Malformed));

    let mut client = Client::connect(&addr).await.unwrap();
    let me = client.register(&unique("c"), b"secret").await.unwrap();
    assert_eq!(
        client.register("again", b"secret").await.unwrap_err().reason(),
        Some(Reason::AlreadyRegistered)
    );
    client.create_queue("q").await.unwrap();
    let big = vec![b'x'; 101];
    assert_eq!(client.send("q", None, &big).await.unwrap_err().reason(), Some(Reason::TooLarge));
    assert_eq!(
        client.send("nope", None, b"x").await.unwrap_err().reason(),
        Some(Reason::UnknownQueue)
    );
    let lease0 = client.read(ReadTarget::Queue("q".into()), ReadMode::Lease { lease_ms: 0 }).await;
    assert_eq!(lease0.unwrap_err().reason(), Some(Reason::InvalidLease));
    let id = client.send("q", Some(me), b"hello").await.unwrap();
    let m = client
        .read(ReadTarget::ForMe { queue: None, sender: Some(me) }, ReadMode::Pop)
        .await
        .unwrap();
    assert_eq!((m.id, m.content.as_slice()), (id, &b"hello"[..]));

    // An oversized length prefix is answered, then the connection is closed.
    raw.write_all(&((FRAME_BYTES_MAX + 1) as u32).to_be_bytes()).await.unwrap();
    let mut prefix = [0; 4];
    raw.read_exact(&mut prefix).await.unwrap();
    let mut reply = vec![0; u32::from_be_bytes(prefix) as usize];
    raw.read_exact(&mut reply).await.unwrap();
    assert_eq!(decode_reply(&reply).unwrap().result.unwrap_err().reason, Reason::TooLarge);
    assert_eq!(raw.read(&mut prefix).await.unwrap(), 0, "closed after an oversized frame");
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_on_one_postgres_never_pop_a_message_twice() {
    let Some(url) = pg_url() else { return };
    let config = NodeConfig { db_workers: 2, batch_max: 16, ..NodeConfig::default() };
    let mut nodes = Vec::new();
    for _ in 0..2 {
        let store = AnyStore::open(&url, config.db_workers).await.unwrap();
        nodes.push(server::start("127.0.0.1:0", store, config.clone()).await.unwrap());
    }
    let queue = unique("shared");
    let mut admin = Client::connect(&nodes[0].addr.to_string()).await.unwrap();
    admin.register(&unique("admin"), b"secret").await.unwrap();
    admin.create_queue(&queue).await.unwrap();
    const MESSAGES: usize = 300;
    let mut sent = HashSet::new();
    for i in 0..MESSAGES {
        sent.insert(admin.send(&queue, None, format!("m{i}").as_bytes()).await.unwrap());
    }
    let popped = Arc::new(Mutex::new(Vec::new()));
    let mut poppers = tokio::task::JoinSet::new();
    for p in 0..8 {
        let addr = nodes[p % 2].addr.to_string();
        let (queue, popped) = (queue.clone(), Arc::clone(&popped));
        poppers.spawn(async move {
            let mut c = Client::connect(&addr).await.unwrap();
            c.register(&unique("popper"), b"secret").await.unwrap();
            loop {
                match c.read(ReadTarget::Queue(queue.clone()), ReadMode::Pop).await {
                    Ok(m) => popped.lock().unwrap().push(m.id),
                    Err(e) if e.reason() == Some(Reason::NoMessage) => return,
                    Err(e) => panic!("{e}"),
                }
            }
        });
    }
    while let Some(done) = poppers.join_next().await {
        done.unwrap();
    }
    let popped = popped.lock().unwrap().clone();
    let distinct: HashSet<u64> = popped.iter().copied().collect();
    assert_eq!(distinct.len(), popped.len(), "a message was popped twice");
    assert_eq!(distinct, sent, "every sent message popped exactly once");
    admin.delete_queue(&queue, false).await.unwrap();
    for n in nodes {
        n.shutdown().await;
    }
}

/// A node as a child process; its listening address is read from its stderr.
fn spawn_node(store: &str) -> (Child, String) {
    common::spawn_node(store, 2, &[])
}

#[derive(Default)]
struct Seen {
    acked_sends: HashSet<u64>,
    popped: Vec<u64>,
    leased: Vec<u64>,
    /// Pops cut off by the crash: each may have committed without its reply arriving (pop is
    /// at-most-once), so each may account for one acknowledged message nobody saw again.
    pops_without_reply: usize,
}

async fn load_until_error(mut c: Client, queue: String, seen: Arc<Mutex<Seen>>, role: usize) {
    loop {
        let outcome: Result<(), ClientError> = match role {
            0 | 1 => c.send(&queue, None, &[b'x'; 200]).await.map(|id| {
                seen.lock().unwrap().acked_sends.insert(id);
            }),
            2 => c
                .read(ReadTarget::Queue(queue.clone()), ReadMode::Pop)
                .await
                .map(|m| seen.lock().unwrap().popped.push(m.id)),
            _ => c
                .read(ReadTarget::Queue(queue.clone()), ReadMode::Lease { lease_ms: 300 })
                .await
                .map(|m| seen.lock().unwrap().leased.push(m.id)),
        };
        match outcome {
            Ok(()) => {}
            Err(e) if e.reason() == Some(Reason::NoMessage) => {
                tokio::time::sleep(Duration::from_millis(1)).await
            }
            Err(_) => {
                if role == 2 {
                    seen.lock().unwrap().pops_without_reply += 1;
                }
                return;
            }
        }
    }
}

async fn sigkill_scenario(store: &str) {
    let (mut child, addr) = spawn_node(store);
    let queue = unique("crash");
    let admin_name = unique("admin");
    let mut admin = Client::connect(&addr).await.unwrap();
    admin.register(&admin_name, b"secret").await.unwrap();
    admin.create_queue(&queue).await.unwrap();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let mut workers = tokio::task::JoinSet::new();
    for role in 0..4 {
        // Registered before the load starts: registration hashes the secret (Argon2, tens of
        // ms each), which must not eat into the load before the kill.
        let mut c = Client::connect(&addr).await.unwrap();
        c.register(&unique("worker"), b"secret").await.unwrap();
        workers.spawn(load_until_error(c, queue.clone(), Arc::clone(&seen), role));
    }
    tokio::time::sleep(Duration::from_millis(800)).await;
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    while workers.join_next().await.is_some() {}

    let (mut child, addr) = spawn_node(store);
    tokio::time::sleep(Duration::from_millis(400)).await; // every lease (300 ms) has expired
    // The queue's owner drains it (registering again under its name), so it may delete it.
    let mut drain = Client::connect(&addr).await.unwrap();
    drain.register(&admin_name, b"secret").await.unwrap();
    let mut after = Vec::new();
    loop {
        match drain.read(ReadTarget::Queue(queue.clone()), ReadMode::Pop).await {
            Ok(m) => after.push(m.id),
            Err(e) if e.reason() == Some(Reason::NoMessage) => break,
            Err(e) => panic!("{e}"),
        }
    }
    drain.delete_queue(&queue, false).await.unwrap();
    child.kill().unwrap();
    child.wait().unwrap();

    let seen = seen.lock().unwrap();
    assert!(
        seen.acked_sends.len() > 10 && !seen.popped.is_empty(),
        "load ran: {} sends",
        seen.acked_sends.len()
    );
    let mut delivered: HashSet<u64> = HashSet::new();
    for id in seen.popped.iter().chain(&after) {
        assert!(delivered.insert(*id), "message {id} popped twice");
    }
    // A message that must come back: every acknowledged send, and every leased message (its
    // lease expired while the node was down). Each pop cut off by the crash may have committed
    // without its reply and so account for one of them nobody saw again, whichever it was: a
    // lease that expired before the crash leaves its message to the next pop.
    let owed: HashSet<u64> = seen.acked_sends.iter().chain(&seen.leased).copied().collect();
    let lost: Vec<_> = owed.iter().filter(|id| !delivered.contains(id)).collect();
    assert!(
        lost.len() <= seen.pops_without_reply,
        "acknowledged or leased messages {lost:?} lost ({} pops cut off; leased {:?}; popped {} before, {} after)",
        seen.pops_without_reply,
        seen.leased,
        seen.popped.len(),
        after.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_a_sqlite_node_loses_no_acknowledged_message() {
    let dir = tempfile::tempdir().unwrap();
    sigkill_scenario(&format!("sqlite:{}", dir.path().display())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_a_postgres_node_loses_no_acknowledged_message() {
    let Some(url) = pg_url() else { return };
    sigkill_scenario(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_wait_queue_answers_busy_and_the_slot_holder_completes() {
    let dir = tempfile::tempdir().unwrap();
    let store = AnyStore::open(&format!("sqlite:{}", dir.path().display()), 1).await.unwrap();
    let config =
        NodeConfig { handler_slots: 1, wait_queue_max: 0, db_workers: 1, ..NodeConfig::default() };
    let node = server::start("127.0.0.1:0", store, config).await.unwrap();
    let addr = node.addr.to_string();
    let mut a = Client::connect(&addr).await.unwrap();
    a.register("a", b"secret").await.unwrap();
    a.create_queue("q").await.unwrap();
    let mut b = Client::connect(&addr).await.unwrap();
    b.register("b", b"secret").await.unwrap();

    // Another process-level writer holds the database, so a's send occupies the only slot.
    let blocker = rusqlite::Connection::open(dir.path().join(mq::store::SQLITE_DB_FILE)).unwrap();
    blocker.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let holder = tokio::spawn(async move { a.send("q", None, b"first").await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(b.send("q", None, b"second").await.unwrap_err().reason(), Some(Reason::Busy));
    blocker.execute_batch("COMMIT").unwrap();
    holder.await.unwrap().expect("the slot holder's send commits once the lock is released");
    let m = b.read(ReadTarget::Queue("q".into()), ReadMode::Pop).await.unwrap();
    assert_eq!(m.content, b"first");
    assert_eq!(
        b.read(ReadTarget::Queue("q".into()), ReadMode::Pop).await.unwrap_err().reason(),
        Some(Reason::NoMessage)
    );
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_postgres_connections_give_errors_not_hangs_then_the_node_resumes() {
    let Some(url) = pg_url() else { return };
    let app = unique("mq-outage").replace('-', "_");
    let separator = if url.contains('?') { '&' } else { '?' };
    let node_url = format!("{url}{separator}application_name={app}");
    let store = AnyStore::open(&node_url, 2).await.unwrap();
    let config = NodeConfig { db_workers: 2, ..NodeConfig::default() };
    let node = server::start("127.0.0.1:0", store, config).await.unwrap();
    let mut c = Client::connect(&node.addr.to_string()).await.unwrap();
    c.register(&unique("outage"), b"secret").await.unwrap();
    let queue = unique("outage-q");
    c.create_queue(&queue).await.unwrap();
    c.send(&queue, None, b"before").await.unwrap();

    let (admin, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    let killed = admin
        .query_one("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1", &[&app])
        .await
        .unwrap()
        .get::<_, i64>(0);
    assert!(killed >= 1, "the node's connections were terminated");

    let mut unavailable = 0;
    let mut sent_after = None;
    for _ in 0..10 {
        let reply =
            tokio::time::timeout(Duration::from_secs(10), c.send(&queue, None, b"after")).await;
        match reply.expect("a reply, not a hang") {
            Ok(id) => {
                sent_after = Some(id);
                break;
            }
            Err(e) => {
                assert_eq!(e.reason(), Some(Reason::Unavailable), "{e}");
                unavailable += 1;
            }
        }
    }
    assert!(sent_after.is_some(), "the node reconnected ({unavailable} Unavailable replies first)");
    assert_eq!(c.delete_queue(&queue, true).await.unwrap(), 2, "both committed sends are there");
    node.shutdown().await;
}

/// Requests pipelined on one connection (registration included) are answered in request order,
/// refusals included, run in request order (a pop before a send finds nothing), every send
/// commits, and sends of one connection share commits.
async fn pipelined_scenario(store: &str) {
    const SENDS: u64 = 200;
    let store = AnyStore::open(store, 1).await.unwrap();
    let config = NodeConfig { db_workers: 1, ..NodeConfig::default() };
    let node = server::start("127.0.0.1:0", store, config).await.unwrap();
    let mut client = Client::connect(&node.addr.to_string()).await.unwrap();
    let queue = unique("pipe");
    let pop = || Request::Read { target: ReadTarget::Queue(queue.clone()), mode: ReadMode::Pop };
    let secret = mq::protocol::Secret(b"pipe secret".to_vec());
    client.submit(Request::Register { name: unique("pipe"), secret }).await.unwrap();
    client.submit(Request::CreateQueue { name: queue.clone() }).await.unwrap();
    client.submit(pop()).await.unwrap();
    for i in 0..SENDS {
        let to = if i == SENDS / 2 { "missing".to_owned() } else { queue.clone() };
        let content = i.to_be_bytes().to_vec();
        client.submit(Request::Send { queue: to, receiver: None, content }).await.unwrap();
    }
    let (_, registered) = client.receive().await.unwrap();
    assert!(matches!(registered, Ok(ReplyBody::Registered { .. })), "{registered:?}");
    let (_, created) = client.receive().await.unwrap();
    assert!(matches!(created, Ok(ReplyBody::QueueCreated { .. })), "{created:?}");
    let (_, early_pop) = client.receive().await.unwrap();
    assert_eq!(early_pop.unwrap_err().reason, Reason::NoMessage, "pop ran before the sends");
    let mut message_ids = Vec::new();
    for i in 0..SENDS {
        // `receive` itself fails if a reply answers another request than the oldest one.
        let (_, sent) = client.receive().await.unwrap();
        match sent {
            Ok(ReplyBody::Sent { message_id, .. }) => message_ids.push(message_id),
            Err(e) if i == SENDS / 2 => assert_eq!(e.reason, Reason::UnknownQueue),
            other => panic!("send {i}: {other:?}"),
        }
    }
    assert!(message_ids.windows(2).all(|w| w[0] < w[1]), "ids follow request order");
    let stats = client.stats(&queue).await.unwrap();
    assert_eq!(stats.queue_depth, SENDS - 1);
    assert_eq!(stats.sends_committed, SENDS - 1);
    assert!(
        stats.batches_committed < SENDS,
        "{} batches for {SENDS} pipelined sends: no commit was shared",
        stats.batches_committed
    );
    for i in (0..SENDS).filter(|&i| i != SENDS / 2) {
        let m = client.read(ReadTarget::Queue(queue.clone()), ReadMode::Pop).await.unwrap();
        assert_eq!(m.content, i.to_be_bytes(), "messages pop in send order");
    }
    client.delete_queue(&queue, false).await.unwrap();
    node.shutdown().await;
}

#[tokio::test]
async fn pipelined_requests_on_sqlite_run_in_order_and_share_commits() {
    let dir = tempfile::tempdir().unwrap();
    pipelined_scenario(&format!("sqlite:{}", dir.path().display())).await;
}

#[tokio::test]
async fn pipelined_requests_on_postgres_run_in_order_and_share_commits() {
    let Some(url) = pg_url() else { return };
    pipelined_scenario(&url).await;
}

/// A lone request on an idle node is committed by the connection that read it (no hand-off
/// to a worker); a pipelined burst goes to the workers after at most its first request; both
/// paths give the same answers, in request order, on SQLite and PostgreSQL.
#[tokio::test]
async fn lone_requests_commit_inline_and_a_pipelined_burst_goes_to_the_workers() {
    let dir = tempfile::tempdir().unwrap();
    let mut stores = vec![format!("sqlite:{}", dir.path().display())];
    stores.extend(pg_url());
    for url in stores {
        let store = AnyStore::open(&url, 4).await.unwrap();
        let node = server::start("127.0.0.1:0", store, NodeConfig::default()).await.unwrap();
        let mut client = Client::connect(&node.addr.to_string()).await.unwrap();
        client.register(&unique("inline"), b"secret").await.unwrap();
        let queue = unique("q");
        client.create_queue(&queue).await.unwrap();
        let before = node.totals();
        let mut sent = Vec::new();
        for i in 0..20u32 {
            let content = format!("lone {i}").into_bytes();
            sent.push((client.send(&queue, None, &content).await.unwrap(), content));
        }
        let lone = node.totals().since(&before);
        assert_eq!((lone.batches_inline, lone.batches_committed), (20, 20), "{url}: {lone:?}");

        let before = node.totals();
        for i in 0..64u32 {
            let content = format!("burst {i}").into_bytes();
            let request = Request::Send { queue: queue.clone(), receiver: None, content };
            client.submit(request).await.unwrap();
        }
        for i in 0..64u32 {
            let (_, reply) = client.receive().await.unwrap();
            let Ok(ReplyBody::Sent { message_id, .. }) = reply else { panic!("{url}: {reply:?}") };
            sent.push((message_id, format!("burst {i}").into_bytes()));
        }
        let burst = node.totals().since(&before);
        assert!(burst.batches_inline <= 1, "{url}: {burst:?}");
        assert!(burst.batches_committed < 64, "{url}: the workers batched the burst: {burst:?}");
        assert_eq!(burst.sends_committed, 64, "{url}");

        for (message_id, content) in &sent {
            let popped =
                client.read(ReadTarget::Queue(queue.clone()), ReadMode::Pop).await.unwrap();
            assert_eq!((popped.id, &popped.content), (*message_id, content), "{url}");
        }
        node.stop(Duration::from_secs(5)).await;
    }
}
