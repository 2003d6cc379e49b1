//! Restart PostgreSQL under load: a throwaway server of the test's own (never the shared one at
//! `LEANTIER_PG_URL`, which other tests use at the same time) is stopped with `-m fast` while
//! clients send and pop through an in-process node, kept down for a moment, and started again.
//!
//! During the outage every request must get an answer (a reason code) within a bound, never
//! hang; after the restart the node's pool reconnects and serves again; no acknowledged send
//! is lost and no message is popped twice.
//!
//! A second test kills the server (`-m immediate`: no checkpoint, crash recovery at the next
//! start) while pipelining clients keep large batches in flight, some of whose sends the
//! database refuses (an unknown queue, an unknown receiver): each refusal names its own
//! message with its reason while the batch's other sends commit, and every acknowledged send
//! is in the table after recovery.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mq::client::{Client, ClientError};
use mq::protocol::{ReadMode, ReadTarget, Reason, ReplyBody, Request};
use mq::server::{self, NodeConfig};
use mq::store::AnyStore;

/// Longest a request may stay unanswered, outage included, before the test calls it a hang.
const REPLY_TIMEOUT: Duration = Duration::from_secs(5);
/// Load before the stop, and how long the server stays down.
const LOAD_BEFORE_STOP: Duration = Duration::from_millis(800);
const OUTAGE: Duration = Duration::from_millis(1500);
/// Longest the node may take to serve again once the server is back.
const RECOVERY_MAX: Duration = Duration::from_secs(10);
/// Load after the node served again.
const LOAD_AFTER_RECOVERY: Duration = Duration::from_millis(800);
const SENDERS: usize = 3;
const POPPERS: usize = 2;

/// Where `initdb` and `pg_ctl` are, searched like `scripts/pg-env` does.
fn postgres_bin_dir() -> Option<PathBuf> {
    let has_tools = |dir: &Path| dir.join("pg_ctl").is_file() && dir.join("initdb").is_file();
    let path_dirs: Vec<PathBuf> =
        std::env::var_os("PATH").map(|p| std::env::split_paths(&p).collect()).unwrap_or_default();
    let mut versioned: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|entries| entries.filter_map(|e| e.ok()).map(|e| e.path().join("bin")).collect())
        .unwrap_or_default();
    versioned.sort();
    versioned.reverse(); // the newest major version first
    let fixed = [PathBuf::from("/usr/local/bin"), PathBuf::from("/usr/local/pgsql/bin")];
    path_dirs.into_iter().chain(versioned).chain(fixed).find(|d| has_tools(d))
}

/// The account the server runs as: none (the caller) unless the caller is root, which
/// PostgreSQL refuses; then `postgres`, created as a system user if absent (as pg-env does).
fn server_user() -> Option<&'static str> {
    let uid = std::fs::metadata("/proc/self").expect("procfs").uid();
    if uid != 0 {
        return None;
    }
    let exists = Command::new("id").arg("postgres").stdout(Stdio::null()).status().unwrap();
    if !exists.success() {
        let created = Command::new("useradd")
            .args(["--system", "--user-group", "--no-create-home", "--shell", "/bin/sh"])
            .arg("postgres")
            .status()
            .unwrap();
        assert!(created.success(), "useradd postgres");
    }
    Some("postgres")
}

/// A PostgreSQL server in a temporary directory, stopped (immediately) when dropped, so a
/// failing test never leaves it running.
struct ThrowawayPostgres {
    bin: PathBuf,
    user: Option<&'static str>,
    dir: tempfile::TempDir,
    port: u16,
}

impl ThrowawayPostgres {
    fn start(bin: PathBuf) -> ThrowawayPostgres {
        let user = server_user();
        let dir = tempfile::tempdir().unwrap();
        if let Some(user) = user {
            let chown = Command::new("chown").arg(user).arg(dir.path()).status().unwrap();
            assert!(chown.success(), "chown the data directory to {user}");
        }
        let server = ThrowawayPostgres { bin, user, dir, port: free_port() };
        let data = server.data_dir();
        server.run("initdb", &["-D", &data, "-U", "postgres", "--auth=trust", "--locale=C"]);
        server.pg_ctl_start();
        server
    }

    fn data_dir(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Runs one of the server's tools as the server user; panics with its output on failure.
    fn run(&self, tool: &str, args: &[&str]) {
        let program = self.bin.join(tool);
        let mut command = match self.user {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.args(["-u", user, "--"]).arg(&program);
                c
            }
            None => Command::new(&program),
        };
        let output = command.args(args).stdin(Stdio::null()).output().unwrap();
        assert!(
            output.status.success(),
            "{tool} {args:?}: {}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    fn pg_ctl_start(&self) {
        let (data, log) = (self.data_dir(), self.dir.path().join("server.log"));
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c max_connections=40",
            self.port,
            self.dir.path().display()
        );
        let log = log.display().to_string();
        self.run("pg_ctl", &["-D", &data, "-l", &log, "-w", "-t", "30", "-o", &options, "start"]);
    }

    fn pg_ctl_stop(&self, mode: &str) {
        self.run("pg_ctl", &["-D", &self.data_dir(), "-m", mode, "-w", "-t", "30", "stop"]);
    }
}

impl Drop for ThrowawayPostgres {
    fn drop(&mut self) {
        if Path::new(&self.data_dir()).join("postmaster.pid").exists() {
            // Not `run`: a panic inside drop (while unwinding) would abort the test binary.
            let program = self.bin.join("pg_ctl");
            let data = self.data_dir();
            let args = ["-D", data.as_str(), "-m", "immediate", "-w", "stop"];
            let _ = match self.user {
                Some(user) => Command::new("runuser")
                    .args(["-u", user, "--"])
                    .arg(program)
                    .args(args)
                    .output(),
                None => Command::new(program).args(args).output(),
            };
        }
    }
}

/// A port nobody listens on now (the OS picks it; the window until the server binds it is
/// tiny on a test machine).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn unique(tag: &str) -> String {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    format!("{tag}-{}-{nanos}", std::process::id())
}

#[derive(Default)]
struct Seen {
    acked_sends: HashSet<u64>,
    popped: Vec<u64>,
    /// Pops answered with an error. The one a popper had in flight when the server stopped
    /// may have committed before the connection died (an ambiguous commit; pop is
    /// at-most-once), so it may account for one acknowledged message nobody sees again.
    failed_pops: usize,
    unavailable_replies: usize,
    connection_errors: usize,
    slowest_reply: Duration,
}

/// One client's closed loop until `stop`: sends or pops, reconnecting after a lost
/// connection. Every request is bounded by `REPLY_TIMEOUT`; a timeout fails the test.
async fn client_loop(
    mut client: Option<Client>,
    addr: String,
    queue: String,
    seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
    sends: bool,
) {
    // Relaxed: the flag only ends the loop; the data it guards is behind `seen`'s mutex.
    while !stop.load(Ordering::Relaxed) {
        let c = match client.as_mut() {
            Some(c) => c,
            None => match connect(&addr).await {
                Ok(c) => client.insert(c),
                Err(_) => {
                    seen.lock().unwrap().connection_errors += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
        };
        let started = Instant::now();
        let outcome = if sends {
            let reply = tokio::time::timeout(REPLY_TIMEOUT, c.send(&queue, None, &[b'x'; 100]));
            reply.await.expect("a send hung").map(|id| {
                seen.lock().unwrap().acked_sends.insert(id);
            })
        } else {
            let reply = c.read(ReadTarget::Queue(queue.clone()), ReadMode::Pop);
            let reply = tokio::time::timeout(REPLY_TIMEOUT, reply).await.expect("a pop hung");
            reply.map(|m| seen.lock().unwrap().popped.push(m.id))
        };
        let refused = seen.lock().unwrap().record(started.elapsed(), outcome, sends);
        if refused {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

impl Seen {
    /// Records one request's reply time and failure; true when the node refused it.
    fn record(&mut self, took: Duration, outcome: Result<(), ClientError>, sends: bool) -> bool {
        self.slowest_reply = self.slowest_reply.max(took);
        match outcome {
            Ok(()) => false,
            Err(e) if e.reason() == Some(Reason::NoMessage) => false,
            Err(ClientError::Refused(r)) => {
                assert_eq!(r.reason, Reason::Unavailable, "outage reply: {r:?}");
                self.unavailable_replies += 1;
                self.failed_pops += usize::from(!sends);
                true
            }
            Err(other) => panic!("the node dropped a client instead of answering: {other}"),
        }
    }
}

async fn connect(addr: &str) -> Result<Client, ClientError> {
    let mut c = Client::connect(addr).await?;
    c.register(&unique("restart"), b"secret").await?;
    Ok(c)
}

/// Sends until one is acknowledged; returns how long that took.
async fn wait_until_serving(addr: &str, queue: &str) -> Duration {
    let started = Instant::now();
    let mut c = connect(addr).await.expect("the node itself stays up");
    loop {
        let reply = tokio::time::timeout(REPLY_TIMEOUT, c.send(queue, None, b"probe")).await;
        match reply.expect("a probe send hung") {
            // The probe is deliberately left in the queue: the drain pops it too.
            Ok(_) => return started.elapsed(),
            Err(e) => assert_eq!(e.reason(), Some(Reason::Unavailable), "{e}"),
        }
        assert!(started.elapsed() < RECOVERY_MAX, "the node did not reconnect to PostgreSQL");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restart_under_load_gives_errors_not_hangs_and_loses_nothing() {
    let Some(bin) = postgres_bin_dir() else {
        println!("skipped: no PostgreSQL binaries");
        return;
    };
    let started = Instant::now();
    let pg = ThrowawayPostgres::start(bin);
    let store = AnyStore::open(&pg.url(), 2).await.unwrap();
    let node =
        server::start("127.0.0.1:0", store, NodeConfig { db_workers: 2, ..Default::default() })
            .await
            .unwrap();
    let addr = node.addr.to_string();
    let queue = unique("restart-q");
    let mut admin = connect(&addr).await.unwrap();
    admin.create_queue(&queue).await.unwrap();

    let seen = Arc::new(Mutex::new(Seen::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = tokio::task::JoinSet::new();
    for i in 0..SENDERS + POPPERS {
        // Registered before the load starts: registration hashes the secret (Argon2, tens of
        // ms each), which must not eat into the load before the stop.
        let client = Some(connect(&addr).await.unwrap());
        let (addr, queue, seen) = (addr.clone(), queue.clone(), Arc::clone(&seen));
        clients.spawn(client_loop(client, addr, queue, seen, Arc::clone(&stop), i < SENDERS));
    }
    tokio::time::sleep(LOAD_BEFORE_STOP).await;
    let sends_before = seen.lock().unwrap().acked_sends.len();
    let pg_ref = &pg;
    tokio::task::block_in_place(|| pg_ref.pg_ctl_stop("fast"));
    tokio::time::sleep(OUTAGE).await;
    let unavailable_during_outage = seen.lock().unwrap().unavailable_replies;
    tokio::task::block_in_place(|| pg_ref.pg_ctl_start());
    let recovery = wait_until_serving(&addr, &queue).await;
    let sends_at_recovery = seen.lock().unwrap().acked_sends.len();
    tokio::time::sleep(LOAD_AFTER_RECOVERY).await;
    // Relaxed: see `client_loop`; joining the tasks below orders everything they did.
    stop.store(true, Ordering::Relaxed);
    while let Some(done) = clients.join_next().await {
        done.unwrap();
    }

    let mut after = Vec::new();
    loop {
        match admin.read(ReadTarget::Queue(queue.clone()), ReadMode::Pop).await {
            Ok(m) => after.push(m.id),
            Err(e) if e.reason() == Some(Reason::NoMessage) => break,
            Err(e) => panic!("drain: {e}"),
        }
    }
    node.shutdown().await;
    drop(pg);

    let seen = seen.lock().unwrap();
    println!(
        "sends acked {} ({sends_before} before the stop, {} after recovery), pops {}, drained {}, \
         Unavailable replies {} ({unavailable_during_outage} during the outage), failed pops {}, \
         connection errors {}, slowest reply {:?}, recovery {recovery:?}, test {:?}",
        seen.acked_sends.len(),
        seen.acked_sends.len() - sends_at_recovery,
        seen.popped.len(),
        after.len(),
        seen.unavailable_replies,
        seen.failed_pops,
        seen.connection_errors,
        seen.slowest_reply,
        started.elapsed()
    );
    assert!(sends_before > 10 && !seen.popped.is_empty(), "load ran before the stop");
    assert!(unavailable_during_outage > 0, "the outage was seen as Unavailable replies");
    assert!(seen.acked_sends.len() > sends_at_recovery, "clients were served after the restart");
    assert_eq!(seen.connection_errors, 0, "the node kept accepting connections");
    let mut delivered = HashSet::new();
    for id in seen.popped.iter().chain(&after) {
        assert!(delivered.insert(*id), "message {id} popped twice");
    }
    // At the stop each popper had at most one pop in flight; later pops meet a server that
    // is down, so they cannot have committed.
    let ambiguous_pops = seen.failed_pops.min(POPPERS);
    let lost = seen.acked_sends.iter().filter(|id| !delivered.contains(id)).count();
    assert!(
        lost <= ambiguous_pops,
        "{lost} acknowledged sends lost; at most {ambiguous_pops} pops had an ambiguous outcome"
    );
}

/// Requests each pipelining client keeps in flight in the kill test.
const KILL_WINDOW: usize = 32;
/// A receiver id no client has.
const UNKNOWN_RECEIVER: u64 = u64::MAX >> 1;

/// What a request of the kill test is, so its reply can be checked against it.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Good,
    MissingQueue,
    MissingReceiver,
}

impl Kind {
    /// Every tenth request is refused for its queue, every tenth (offset 5) for its receiver.
    fn of(n: u64) -> Kind {
        match n % 10 {
            0 => Kind::MissingQueue,
            5 => Kind::MissingReceiver,
            _ => Kind::Good,
        }
    }

    fn request(self, queue: &str) -> Request {
        let (queue, receiver) = match self {
            Kind::Good => (queue.to_owned(), None),
            Kind::MissingQueue => (format!("{queue}-missing"), None),
            Kind::MissingReceiver => (queue.to_owned(), Some(UNKNOWN_RECEIVER)),
        };
        Request::Send { queue, receiver, content: vec![b'k'; 200] }
    }
}

#[derive(Default)]
struct KillSeen {
    acked: Vec<u64>,
    refused_by_database: usize,
    unavailable: usize,
}

/// Keeps `KILL_WINDOW` sends in flight until `stop`, checking each reply against its kind:
/// a good send is acknowledged or `Unavailable` (the outage), a bad one refused for its own
/// reason or `Unavailable`; anything else fails the test.
async fn pipelined_sender(mut client: Client, queue: String, stop: Arc<AtomicBool>) -> KillSeen {
    let mut seen = KillSeen::default();
    let mut in_flight = std::collections::VecDeque::new();
    let mut n = 0u64;
    loop {
        // Relaxed: the flag only ends the loop.
        while !stop.load(Ordering::Relaxed) && in_flight.len() < KILL_WINDOW {
            let kind = Kind::of(n);
            n += 1;
            client.submit(kind.request(&queue)).await.expect("the node keeps the connection");
            in_flight.push_back(kind);
        }
        let Some(kind) = in_flight.pop_front() else { return seen };
        let reply = tokio::time::timeout(REPLY_TIMEOUT, client.receive()).await;
        let (_, result) = reply.expect("a send hung").expect("the node keeps the connection");
        match (kind, result) {
            (Kind::Good, Ok(ReplyBody::Sent { message_id, .. })) => seen.acked.push(message_id),
            (_, Err(e)) if e.reason == Reason::Unavailable => seen.unavailable += 1,
            (Kind::MissingQueue, Err(e)) if e.reason == Reason::UnknownQueue => {
                seen.refused_by_database += 1;
            }
            (Kind::MissingReceiver, Err(e)) if e.reason == Reason::UnknownReceiver => {
                seen.refused_by_database += 1;
            }
            (kind, other) => panic!("a {kind:?} send answered {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_postgres_mid_batch_loses_no_acknowledged_send() {
    let Some(bin) = postgres_bin_dir() else {
        println!("skipped: no PostgreSQL binaries");
        return;
    };
    let started = Instant::now();
    let pg = ThrowawayPostgres::start(bin);
    let store = AnyStore::open(&pg.url(), 2).await.unwrap();
    let node =
        server::start("127.0.0.1:0", store, NodeConfig { db_workers: 2, ..Default::default() })
            .await
            .unwrap();
    let addr = node.addr.to_string();
    let queue = unique("kill-q");
    connect(&addr).await.unwrap().create_queue(&queue).await.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let mut senders = tokio::task::JoinSet::new();
    for _ in 0..2 {
        let client = connect(&addr).await.unwrap();
        senders.spawn(pipelined_sender(client, queue.clone(), Arc::clone(&stop)));
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    let pg_ref = &pg;
    tokio::task::block_in_place(|| pg_ref.pg_ctl_stop("immediate"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    tokio::task::block_in_place(|| pg_ref.pg_ctl_start());
    let recovery = wait_until_serving(&addr, &queue).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Relaxed: joining the tasks below orders what they did.
    stop.store(true, Ordering::Relaxed);
    let mut seen = KillSeen::default();
    while let Some(done) = senders.join_next().await {
        let one = done.unwrap();
        seen.acked.extend(one.acked);
        seen.refused_by_database += one.refused_by_database;
        seen.unavailable += one.unavailable;
    }
    node.shutdown().await;

    let (db, connection) = tokio_postgres::connect(&pg.url(), tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    let stored: HashSet<i64> = db
        .query("SELECT id FROM mq_messages", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    let lost = seen.acked.iter().filter(|id| !stored.contains(&(**id as i64))).count();
    println!(
        "acked {}, refused by the database {}, Unavailable {}, stored {}, recovery {recovery:?}, \
         test {:?}",
        seen.acked.len(),
        seen.refused_by_database,
        seen.unavailable,
        stored.len(),
        started.elapsed()
    );
    assert!(seen.acked.len() > 100, "batches committed before and after the kill");
    assert!(seen.refused_by_database > 10, "the refused sends were answered one by one");
    assert!(seen.unavailable > 0, "the kill was seen as Unavailable replies");
    assert_eq!(lost, 0, "acknowledged sends missing after crash recovery");
}
