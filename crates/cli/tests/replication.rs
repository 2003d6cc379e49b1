//! `exchange serve --role engine` processes on a real three-node JetStream cluster: a leader
//! and a standby follow one shard's input log; the leader is killed with SIGKILL and a new
//! standby started, `LEANTIER_FAILOVER_KILLS` times (1 here; `scripts/soak-failover` runs 10).
//! Every appended order's report reaches the delivery edge's consumer exactly once, in sequence;
//! the time from each kill to the first report of the new leader is measured.

#[path = "common/fix_client.rs"]
mod fix_client;

use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddr};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use delivery::consumer::{self, SharedTally};
use delivery::edge::{EdgeOptions, start as start_edge};
use delivery::nats::NatsConnect;
use exchange::flow::{UniverseConfig, reference_master_data};
use exchange::msg::{InboundOrder, Reason, Side, request_kind};
use experiments::cluster::Cluster;
use gateway::fix::tag;
use replication::append::{AppendId, OrderLog};
use replication::follow::Follower;
use replication::layout::LogSettings;
use replication::lease::LEASE_TTL_DEFAULT;

/// Orders appended between two kills.
const ORDERS_PER_ROUND: u64 = 100;
/// The failover goal on this machine (docs/REPLICATION.md): kill → first report of the new
/// leader.
const FAILOVER_MAX: Duration = Duration::from_secs(2);
/// How long the open-loop loads wait after their schedule for answers still missing (a run
/// that has every answer ends at once): a node's kill can stall appends or the lease until
/// JetStream elects a new stream leader (5–11 s seen on this 2-vCPU host under load, appends
/// refused with "no stream found" meanwhile), and a loaded CI host slows every step.
const DRAIN: Duration = Duration::from_secs(30);

type Lines = std::io::Lines<BufReader<std::process::ChildStdout>>;

/// A fresh file in `dir` for a child's log (kept with the test's folder, printed on failure).
fn log_file(dir: &std::path::Path) -> std::fs::File {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    // Relaxed: a unique number, nothing else rides on it.
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::fs::File::create(dir.join(format!("serve-{n}.log"))).unwrap()
}

/// Prints the warnings, errors and lease events of every child's log in `dir` (a failed test's evidence).
fn print_warnings(dir: &std::path::Path) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("serve-") {
            continue;
        }
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        for line in text
            .lines()
            .filter(|l| l.contains("WARN") || l.contains("ERROR") || l.contains("lease"))
        {
            println!("{name}: {line}");
        }
    }
}

/// `leantier replication check` on shard 0 of the group in `dir`, listening until stopped.
struct Checker(Child);

impl Checker {
    fn start(dir: &std::path::Path, url: &str) -> Checker {
        let mut child = Command::new(env!("CARGO_BIN_EXE_leantier"))
            .args(["replication", "check", "--duration", "10m", "--config", "serve.toml"])
            .args(["--replicas", "3", "--nats", url])
            .current_dir(dir)
            .stdout(Stdio::piped())
            .stderr(log_file(dir))
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.as_mut().unwrap()).lines();
        let first = lines.next().expect("a line").unwrap();
        assert!(first.starts_with("listening to"), "{first}");
        Checker(child)
    }

    /// Stops the listening (SIGTERM) and waits for the replay: the exit status and the output.
    fn stop(mut self) -> (std::process::ExitStatus, String) {
        let pid = self.0.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        let mut out = String::new();
        std::io::Read::read_to_string(self.0.stdout.as_mut().unwrap(), &mut out).unwrap();
        (self.0.wait().unwrap(), out)
    }

    /// [`Checker::stop`], asserting that every record heard equals the replay's; the
    /// checker's verdict line.
    fn verdict(self) -> String {
        let (status, out) = self.stop();
        let verdict = out.lines().find(|l| l.starts_with("checked ")).unwrap_or_default();
        assert!(status.success(), "the checker found a difference: {out}");
        let clean = " 0 differ, 0 sequences heard with two contents, 0 not produced by the log";
        assert!(verdict.contains(clean), "{out}");
        assert!(!verdict.starts_with("checked 0 "), "nothing was checked: {out}");
        verdict.to_string()
    }
}

/// What the engine-process tests start from: a three-node cluster, a folder with
/// [`write_config`]'s config, and a runtime for the test's own NATS clients.
struct Setup {
    cluster: Cluster,
    url: String,
    dir: tempfile::TempDir,
    rt: tokio::runtime::Runtime,
}

impl Setup {
    fn new() -> Setup {
        let cluster = Cluster::start(3).unwrap();
        let url = cluster.url();
        let dir = tempfile::tempdir().unwrap();
        write_config(dir.path());
        let mut rt = tokio::runtime::Builder::new_multi_thread();
        let rt = rt.worker_threads(2).enable_all().build().unwrap();
        Setup { cluster, url, dir, rt }
    }
}

/// The log so far of the engine started as [`Process::named_engine`] `name`.
fn log_of(dir: &std::path::Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(format!("serve-{name}.log"))).unwrap_or_default()
}

/// Every child's log so far (the `serve-*` files in `dir`), one after the other.
fn logs(dir: &std::path::Path) -> String {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|entry| entry.file_name().to_string_lossy().starts_with("serve-"))
        .map(|entry| std::fs::read_to_string(entry.path()).unwrap_or_default())
        .collect()
}

/// A `leantier exchange serve` child, killed when dropped.
struct Process(Child);

impl Process {
    /// Starts `exchange serve` with `args` in `dir` and returns it with its first line.
    fn start(dir: &std::path::Path, args: &[&str]) -> (Process, String) {
        let (process, mut lines) = Process::start_reading(dir, args);
        let Some(Ok(first)) = lines.next() else {
            panic!("`exchange serve {}` printed nothing; its logs:\n{}", args.join(" "), logs(dir))
        };
        (process, first)
    }

    /// Starts `exchange serve` with `args` in `dir` and returns it with its output's lines.
    fn start_reading(dir: &std::path::Path, args: &[&str]) -> (Process, Lines) {
        Process::start_logging(dir, args, log_file(dir))
    }

    /// [`Process::start_reading`], logging to `log`.
    fn start_logging(dir: &std::path::Path, args: &[&str], log: std::fs::File) -> (Process, Lines) {
        let mut child = Command::new(env!("CARGO_BIN_EXE_leantier"))
            .args(["exchange", "serve", "--config", "serve.toml", "--replicas", "3"])
            .args(args)
            .current_dir(dir)
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        (Process(child), lines)
    }

    /// An engine of shard 0 logging to `serve-{name}.log` in `dir` ([`log_of`]).
    fn named_engine(dir: &std::path::Path, url: &str, name: &str) -> Process {
        let log = std::fs::File::create(dir.join(format!("serve-{name}.log"))).unwrap();
        let args = ["--role", "engine", "--nats", url];
        let (engine, mut lines) = Process::start_logging(dir, &args, log);
        let first = lines.next().expect("a line").unwrap();
        assert!(first.starts_with("engine for shard 0 following"), "{first}");
        engine
    }

    /// Sends `signal` (`STOP`, `CONT`, ...) to the process.
    fn signal(&self, signal: &str) {
        let pid = self.0.id().to_string();
        let sent = Command::new("kill").args([&format!("-{signal}"), &pid]).status().unwrap();
        assert!(sent.success(), "kill -{signal} {pid}");
    }

    fn engine(dir: &std::path::Path, url: &str) -> Process {
        Process::shard_engine(dir, url, (0, 1))
    }

    /// An engine of shard 0 with `extra` flags.
    fn engine_with(dir: &std::path::Path, url: &str, extra: &[&str]) -> Process {
        let mut args = vec!["--role", "engine", "--nats", url];
        args.extend_from_slice(extra);
        let (engine, first) = Process::start(dir, &args);
        assert!(first.starts_with("engine for shard 0 following"), "{first}");
        engine
    }

    /// An engine of `shard` of `shards`.
    fn shard_engine(dir: &std::path::Path, url: &str, (shard, shards): (u32, u32)) -> Process {
        let (shard, shards) = (shard.to_string(), shards.to_string());
        let args = ["--role", "engine", "--nats", url, "--shard", &shard, "--shards", &shards];
        let (engine, first) = Process::start(dir, &args);
        assert!(first.starts_with(&format!("engine for shard {shard} following")), "{first}");
        engine
    }

    /// A gateway of `shards` shards; its native address.
    fn gateway(dir: &std::path::Path, url: &str, shards: u32) -> (Process, SocketAddr) {
        let shards = shards.to_string();
        let args =
            ["--role", "gateway", "--nats", url, "--shards", &shards, "--listen", "127.0.0.1:0"];
        let (gateway, first) = Process::start(dir, &args);
        (gateway, native_address(&first))
    }

    fn kill(mut self) {
        self.0.kill().unwrap(); // SIGKILL
        self.0.wait().unwrap();
    }

    /// SIGTERM; the exit status.
    fn terminate(mut self) -> std::process::ExitStatus {
        let pid = self.0.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        self.0.wait().unwrap()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The address in a server's `native listening on ADDR` line.
fn native_address(line: &str) -> SocketAddr {
    let address = line.strip_prefix("native listening on ");
    address.unwrap_or_else(|| panic!("not a native listen line: {line}")).parse().unwrap()
}

/// The address in a server's `metrics on http://ADDR/metrics` line.
fn metrics_address(line: &str) -> SocketAddr {
    let address = line.strip_prefix("metrics on http://").and_then(|l| l.strip_suffix("/metrics"));
    address.unwrap_or_else(|| panic!("not a metrics line: {line}")).parse().unwrap()
}

/// The bearer token of the admin endpoints in [`write_config`]'s config.
const ADMIN_TOKEN: &str = "t0ken";

/// A serve config with the reference market, one outlet, a client 1 (secret `pw`)
/// and [`ADMIN_TOKEN`] in `dir`.
fn write_config(dir: &std::path::Path) {
    let hash = gateway::credentials::hash_secret(b"pw").unwrap();
    std::fs::write(dir.join("clients.txt"), format!("1 native good {hash}\n")).unwrap();
    let tier = "[tier]\nlayout = \"thread-per-stage\"\nwait = \"park\"\npreprocess_workers = 1\nsenders = 1\noutlets = 1\n";
    let admin = format!("admin_token = \"{ADMIN_TOKEN}\"\n");
    std::fs::write(dir.join("serve.toml"), format!("credentials = \"clients.txt\"\n{admin}{tier}"))
        .unwrap();
}

fn order(seq: u64) -> InboundOrder {
    let band = *reference_master_data(&UniverseConfig::default()).instrument(1).unwrap();
    InboundOrder {
        kind: request_kind::NEW,
        side: Side::Buy as u8,
        instrument: 1,
        client: 1 + (seq % 4) as u32,
        order_id: seq,
        price: band.band_low,
        qty: 1,
        ..InboundOrder::default()
    }
}

fn reports(tally: &SharedTally) -> u64 {
    tally.lock().unwrap().data[0]
}

/// Asserts that the consumer of `tally` got every one of `total` orders' accepts exactly once,
/// its sequences without a gap or a repeat, and nothing declared lost (`context` says what
/// ran: a seed, a report).
fn assert_every_report_once(tally: &SharedTally, total: u64, context: &str) {
    let seen = tally.lock().unwrap().clone();
    assert_eq!(seen.data[0], total, "every order's accept exactly once: {context}");
    assert_eq!(seen.out_of_order, 0, "sequences without a gap or a repeat: {context}");
    assert_eq!(seen.resynced, [0, 0], "nothing declared lost: {context}");
}

/// Waits up to a minute for the consumer of `tally` to have `total` reports; on a timeout the
/// panic shows what the consumer and its delivery edge saw (a resync, a gap still open).
fn wait_for_every_report(
    tally: &SharedTally,
    total: u64,
    (edge, dir): (&delivery::edge::RunningEdge, &std::path::Path),
) {
    let started = Instant::now();
    while reports(tally) < total {
        if started.elapsed() > Duration::from_secs(60) {
            print_warnings(dir);
            let (data, resynced) = {
                let seen = tally.lock().unwrap();
                (seen.data, seen.resynced)
            };
            let report = edge.report();
            panic!("{total} reports, {data:?} seen, {resynced:?} resynced: {report:?}");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn wait_for(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < within, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn killed_leaders_lose_no_report_and_the_standby_takes_over_within_the_bound() {
    let kills: u32 = std::env::var("LEANTIER_FAILOVER_KILLS").map_or(1, |k| k.parse().unwrap());
    let cluster = Cluster::start(3).unwrap();
    let url = cluster.url();
    let dir = tempfile::tempdir().unwrap();
    let hash = gateway::credentials::hash_secret(b"pw").unwrap();
    std::fs::write(dir.path().join("clients.txt"), format!("1 native good {hash}\n")).unwrap();
    let tier = "[tier]\nlayout = \"thread-per-stage\"\nwait = \"park\"\npreprocess_workers = 1\nsenders = 1\noutlets = 1\n";
    std::fs::write(dir.path().join("serve.toml"), format!("credentials = \"clients.txt\"\n{tier}"))
        .unwrap();

    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (_r_gateway, tally) = edge_and_consumer(&rt, &url);
    let mut appender = Appender::open(&rt, &url);
    let mut append = |count| appender.append(count);

    let mut leader = Process::engine(dir.path(), &url);
    let total = append(ORDERS_PER_ROUND);
    wait_for("the first leader's reports", Duration::from_secs(30), || reports(&tally) >= total);
    let mut standby = Process::engine(dir.path(), &url);
    let mut failovers = Vec::new();
    for _ in 0..kills {
        let total = append(ORDERS_PER_ROUND);
        wait_for("the leader's reports", Duration::from_secs(30), || reports(&tally) >= total);
        std::thread::sleep(Duration::from_millis(300)); // the standby applies the round
        let killed_at = Instant::now();
        leader.kill();
        let total = append(1);
        wait_for("the new leader's first report", Duration::from_secs(30), || {
            reports(&tally) >= total
        });
        failovers.push(killed_at.elapsed());
        leader = standby;
        standby = Process::engine(dir.path(), &url);
    }
    let total = append(ORDERS_PER_ROUND);
    wait_for("the last reports", Duration::from_secs(30), || reports(&tally) >= total);
    std::thread::sleep(Duration::from_millis(300));
    drop((leader, standby));
    failovers.sort();
    let max = *failovers.last().unwrap();
    println!(
        "failover (SIGKILL → first report of the new leader) over {kills} kills: p50 {:?}, max {max:?}",
        failovers[failovers.len() / 2]
    );
    assert_every_report_once(&tally, total, "");
    assert!(max <= FAILOVER_MAX, "failover took {max:?} (goal {FAILOVER_MAX:?})");
}

/// A leader paused (SIGSTOP) past its lease wakes up (SIGCONT) after its standby took over,
/// then is stopped (SIGTERM): the successor keeps the lease (the woken leader's refused acquire
/// and its release on the way out leave the successor's write alone), and every order's report
/// reaches the consumer exactly once and in sequence, whatever the woken leader still had in
/// flight (its batches carry the old epoch and are fenced). Before the fence, the old leader's
/// release purged the successor's lease 100–200 ms later in every run.
#[test]
fn a_leader_paused_past_its_lease_then_stopped_leaves_its_successor_leading() {
    let Setup { cluster: _cluster, url, dir, rt } = Setup::new();
    let (edge, tally) = edge_and_consumer(&rt, &url);
    let mut appender = Appender::open(&rt, &url);
    let old = Process::named_engine(dir.path(), &url, "old");
    let checker = Checker::start(dir.path(), &url);
    let total = appender.append(ORDERS_PER_ROUND);
    wait_for("the first leader's reports", Duration::from_secs(30), || reports(&tally) >= total);
    let _successor = Process::named_engine(dir.path(), &url, "successor");
    std::thread::sleep(Duration::from_millis(300)); // the standby applies the first round
    old.signal("STOP");
    wait_for("the standby takes the lease", Duration::from_secs(10), || {
        log_of(dir.path(), "successor").contains("took the lease")
    });
    let total = appender.append(ORDERS_PER_ROUND);
    wait_for("the successor's reports", Duration::from_secs(30), || reports(&tally) >= total);
    old.signal("CONT");
    wait_for("the woken leader learns it lost", Duration::from_secs(10), || {
        log_of(dir.path(), "old").contains("lost the lease")
    });
    assert!(old.terminate().success(), "the woken leader drains and exits 0 on SIGTERM");
    // Two TTLs: a deleted lease would have been lost and taken again by now.
    std::thread::sleep(LEASE_TTL_DEFAULT * 2);
    let total = appender.append(ORDERS_PER_ROUND);
    wait_for("the last reports", Duration::from_secs(30), || reports(&tally) >= total);
    let successor = log_of(dir.path(), "successor");
    assert_eq!(successor.matches("took the lease").count(), 1, "one leadership:\n{successor}");
    assert!(!successor.contains("lost the lease"), "kept its lease:\n{successor}");
    assert_every_report_once(&tally, total, "");
    let report = edge.report();
    println!("paused leader: {} batches of the old epoch fenced", report.fenced);
    println!("replication check: {}", checker.verdict());
}

/// Engines that keep only 64 reports in memory; the leader is killed and, while the standby
/// waits out the lease, 2,000 orders are appended, which the standby applies: when it leads,
/// the delivery edge is far more than its window behind. The old reports are recomputed from the
/// input log (`replication::replay`), so every report arrives once and in sequence, none
/// declared lost. (Before, 6,846–12,471 of 40,000 reports were lost this way when the node
/// leading the lease stream died.)
#[test]
fn a_failover_past_the_retained_window_loses_no_report() {
    let Setup { cluster: _cluster, url, dir, rt } = Setup::new();
    let (edge, tally) = edge_and_consumer(&rt, &url);
    let mut appender = Appender::open(&rt, &url);
    let small_window = ["--retain-records", "64"];
    let leader = Process::engine_with(dir.path(), &url, &small_window);
    let total = appender.append(ORDERS_PER_ROUND);
    wait_for("the first leader's reports", Duration::from_secs(30), || reports(&tally) >= total);
    let _standby = Process::engine_with(dir.path(), &url, &small_window);
    std::thread::sleep(Duration::from_millis(300)); // the standby applies the first round
    leader.kill();
    let total = appender.append(2000);
    wait_for_every_report(&tally, total, (&edge, dir.path()));
    let report = edge.report();
    println!("failover past the window: {} records recovered", report.recovered);
    assert_every_report_once(&tally, total, &format!("{report:?}"));
    assert!(report.recovered > 64, "more recovered than the window held: {report:?}");
}

/// An engine whose outputs would differ from its group's (its config routes reports to two
/// outlets, the leader's to one: every report would be numbered differently) refuses
/// to start with exit 2, naming both fingerprints, while the leader goes on.
#[test]
fn an_engine_unlike_its_group_refuses_to_start() {
    let cluster = Cluster::start(3).unwrap();
    let url = cluster.url();
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    let _leader = Process::named_engine(dir.path(), &url, "leader");
    wait_for("the leader takes the lease", Duration::from_secs(10), || {
        log_of(dir.path(), "leader").contains("took the lease")
    });
    let other = tempfile::tempdir().unwrap();
    write_config(other.path());
    let config = std::fs::read_to_string(other.path().join("serve.toml")).unwrap();
    let config = config.replace("outlets = 1", "outlets = 2");
    std::fs::write(other.path().join("serve.toml"), config).unwrap();
    let refused = Command::new(env!("CARGO_BIN_EXE_leantier"))
        .args(["exchange", "serve", "--config", "serve.toml", "--replicas", "3"])
        .args(["--role", "engine", "--nats", &url])
        .current_dir(other.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "refused as bad input: {stderr}");
    assert!(stderr.contains("engine group mismatch"), "{stderr}");
    assert!(stderr.contains("lease holder has fingerprint="), "{stderr}");
    let (_gateway, address) = Process::gateway(dir.path(), &url, 1);
    let mut client = logged_in(address);
    let accepted = gateway::native::event_kind::ACCEPTED;
    assert_eq!(buy(&mut client, 1), Some(accepted), "the group still answers");
}

/// Appends orders from a thread of its own, one after the other (each waits for its quorum),
/// until stopped; how many were appended.
fn append_until(
    url: String,
    first: u64,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let mut appender = Appender::open(&rt, &url);
        appender.appended = first;
        // Relaxed: a stop flag, nothing rides on it.
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            appender.append(1);
        }
        appender.appended
    })
}

/// The scenario that lost 6,846–12,471 of 40,000 reports in 4 of 10 runs: the node leading the
/// lease stream is SIGKILLed under load and restarted 5 s later. While the lease stream elects
/// a new leader nobody can renew, so the leader's validity lapses and nobody publishes, but the
/// shard stream (led elsewhere, or re-elected too) goes on taking orders and every engine
/// applies them. Every order must be answered exactly once and in sequence, and reports may
/// stop for at most the lease stream's election time + 2 s.
#[test]
fn killing_the_node_that_leads_the_lease_stream_under_load_loses_no_report() {
    let lease_stream = replication::lease::LeaseSettings::new("leantier", 3).bucket;
    kill_the_node_leading_under_load(&lease_stream, "lease");
}

/// As above for the node leading shard 0's input stream: appends stall until the stream has a
/// new leader (the appender retries under the same message id), the engines go on from the
/// log, and every order is answered exactly once within the election time + 2 s.
#[test]
fn killing_the_node_that_leads_the_shard_stream_under_load_loses_no_report() {
    kill_the_node_leading_under_load(&LogSettings::new(3).stream(0), "shard");
}

/// SIGKILLs the node leading `stream` under continuous appends, restarts it 5 s later, and
/// asserts every order answered once, reports silent at most the election time + 2 s.
fn kill_the_node_leading_under_load(stream: &str, what: &str) {
    let Setup { mut cluster, url, dir, rt } = Setup::new();
    let (edge, tally) = edge_and_consumer(&rt, &url);
    let mut appender = Appender::open(&rt, &url);
    let _leader = Process::named_engine(dir.path(), &url, "a");
    let total = appender.append(ORDERS_PER_ROUND);
    wait_for("the first reports", Duration::from_secs(30), || reports(&tally) >= total);
    let _standby = Process::named_engine(dir.path(), &url, "b");
    let client = rt.block_on(delivery::nats::connect(&NatsConnect::new(&url), "test")).unwrap();
    let leader_node = rt.block_on(cluster.stream_leader(client.clone(), stream));
    let leader_node = leader_node.unwrap_or_else(|| panic!("the {what} stream has a leader"));
    // The election is watched from the nodes that stay up.
    let survivor = NatsConnect::new(cluster.url_without(leader_node));
    let client = rt.block_on(delivery::nats::connect(&survivor, "test")).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = append_until(url.clone(), total, stop.clone());
    std::thread::sleep(Duration::from_millis(500));
    let (killed_at, reports_at_kill) = (Instant::now(), reports(&tally));
    cluster.kill(leader_node);
    // The longest time without a new report from the kill on, watched on a thread of its own
    // so the election's polls do not delay it.
    let watched = tally.clone();
    let longest_silence = std::thread::spawn(move || {
        let (mut last, mut changed_at, mut longest) = (reports_at_kill, killed_at, Duration::ZERO);
        while killed_at.elapsed() < Duration::from_secs(20) {
            let now = reports(&watched);
            if now != last {
                (last, changed_at) = (now, Instant::now());
            }
            longest = longest.max(changed_at.elapsed());
            std::thread::sleep(Duration::from_millis(2));
        }
        longest
    });
    let mut elected_after = None;
    while killed_at.elapsed() < Duration::from_secs(20) {
        if elected_after.is_none()
            && rt.block_on(cluster.stream_leader(client.clone(), stream)).is_some()
        {
            elected_after = Some(killed_at.elapsed());
        }
        if killed_at.elapsed() > Duration::from_secs(5) && !cluster.is_up(leader_node) {
            cluster.restart(leader_node).unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let total = load.join().unwrap();
    wait_for_every_report(&tally, total, (&edge, dir.path()));
    let report = edge.report();
    let elected = elected_after.unwrap_or_else(|| panic!("a new {what}-stream leader"));
    let silence = longest_silence.join().unwrap();
    println!(
        "{what}-stream leader SIGKILLed: new leader elected after {elected:?}, longest time \
         without a report {silence:?}; {} orders, {} records recovered",
        total, report.recovered
    );
    assert_every_report_once(&tally, total, &format!("{report:?}"));
    let bound = elected + Duration::from_secs(2);
    assert!(silence <= bound, "reports stopped for {silence:?}, election {elected:?}");
}

/// A follower connected to a node that stays up while the node holding its consumer (an
/// ordered consumer is one replica) is SIGKILLed: the order appended next is delivered within
/// two stall checks and a subscription, not after async-nats's 10 s of missed idle heartbeats
/// (the stall behind one CI run's 15.5 s without reports above). The new consumer can be made
/// only once JetStream's meta group has a leader, so the bound runs from the kill and leaves
/// room for that election; `scripts/soak-replication-faults` runs it (not CI: that election's
/// time is the cluster's, not the follower's).
#[test]
#[ignore = "scripts/soak-replication-faults runs it: its bound includes JetStream's meta election"]
fn a_follower_whose_consumer_died_with_its_node_reads_on_within_two_stall_checks() {
    let Setup { mut cluster, url, rt, .. } = Setup::new();
    let _entered = rt.enter(); // the follower's subscriptions are dropped in the runtime
    let mut appender = Appender::open(&rt, &url);
    appender.append(1);
    let settings = LogSettings::new(3);
    let next = |follower: &mut Follower| {
        let next = rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(30), follower.next()).await
        });
        next.expect("a message within 30 s").expect("the consumer goes on").unwrap()
    };
    let checker = rt.block_on(delivery::nats::connect(&NatsConnect::new(&url), "test")).unwrap();
    // A follower whose connection is not on its consumer's node (tried until one is).
    let (mut follower, consumer_node) = (0..10)
        .find_map(|_| {
            let client = rt.block_on(delivery::nats::connect(&NatsConnect::new(&url), "test"));
            let client = client.unwrap();
            let connected = cluster.node_named(&client.server_info().server_name);
            let follower = rt.block_on(Follower::open(client, &settings, 0, 1)).unwrap();
            let hosts = rt.block_on(cluster.consumer_nodes(checker.clone(), &settings.stream(0)));
            let host = *hosts.first()?;
            (Some(host) != connected).then_some((follower, host))
        })
        .expect("a connection apart from the consumer's node");
    assert_eq!(next(&mut follower).stream_seq, 1);
    let killed_at = Instant::now();
    cluster.kill(consumer_node);
    appender.append(1); // retried under its id until the stream has a leader
    let appended_at = Instant::now();
    assert_eq!(next(&mut follower).stream_seq, 2, "the order appended after the kill");
    let waited = appended_at.elapsed();
    println!(
        "consumer's node killed: the append took {:?}, the follower read it {waited:?} later",
        appended_at - killed_at
    );
    // Measured before the stall check: 12.3 s after the append (async-nats's missed heartbeats,
    // then consumer creations timing out at JetStream's 5 s); after: 0–7 s from the kill.
    let bound = Duration::from_secs(10);
    let read_after_kill = killed_at.elapsed();
    assert!(read_after_kill <= bound, "read {read_after_kill:?} after the kill; bound {bound:?}");
}

/// Three engines under continuous appends, each paused (SIGSTOP) and resumed (SIGCONT) at
/// random, `LEANTIER_PAUSE_ROUNDS` times (3 here; `scripts/soak-replication-faults` runs more),
/// from a seed printed first (`LEANTIER_PAUSE_SEED` replays it): a pause shorter than the lease
/// keeps the leader, a longer one passes the lease on and the woken engine's late batches are
/// fenced. Every order is answered exactly once, in sequence, nothing resynced, and the checker
/// finds every record heard equal to a replay of the log.
#[test]
fn random_pauses_of_engines_under_load_lose_and_repeat_no_report() {
    let rounds: u32 = std::env::var("LEANTIER_PAUSE_ROUNDS").map_or(3, |r| r.parse().unwrap());
    let seed: u64 = std::env::var("LEANTIER_PAUSE_SEED").map_or_else(
        |_| std::time::UNIX_EPOCH.elapsed().unwrap().as_nanos() as u64,
        |s| s.parse().unwrap(),
    );
    println!("random pauses: seed {seed} (LEANTIER_PAUSE_SEED replays it), {rounds} rounds");
    let mut random = seed | 1;
    let mut next = |below: u64| {
        // xorshift64: small, seeded, the same sequence for the same seed.
        random ^= random << 13;
        random ^= random >> 7;
        random ^= random << 17;
        random % below
    };
    let Setup { cluster: _cluster, url, dir, rt } = Setup::new();
    let (edge, tally) = edge_and_consumer(&rt, &url);
    let engines: Vec<Process> =
        ["a", "b", "c"].iter().map(|name| Process::named_engine(dir.path(), &url, name)).collect();
    let checker = Checker::start(dir.path(), &url);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = append_until(url.clone(), 0, stop.clone());
    for _ in 0..rounds {
        std::thread::sleep(Duration::from_millis(300 + next(700)));
        let engine = &engines[next(3) as usize];
        let paused = Duration::from_millis(200 + next(1800));
        engine.signal("STOP");
        std::thread::sleep(paused);
        engine.signal("CONT");
    }
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let total = load.join().unwrap();
    wait_for_every_report(&tally, total, (&edge, dir.path()));
    let report = edge.report();
    println!(
        "random pauses: {total} orders, {} fenced, {} recovered",
        report.fenced, report.recovered
    );
    assert_every_report_once(&tally, total, &format!("seed {seed}, {report:?}"));
    println!("replication check: {}", checker.verdict());
}

/// Every sequenced event `client` receives until `quiet` passes without one: (seq, token, kind).
fn events_until_quiet(
    client: &mut gateway::client::NativeClient,
    quiet: Duration,
) -> Vec<(u64, u32, u8)> {
    let mut events = Vec::new();
    while let Ok(Some(message)) = client.recv(quiet) {
        if let gateway::native::ServerMsg::Sequenced { seq, event } = message {
            events.push((seq, event.token, event.kind));
        }
    }
    events
}

/// A gateway process SIGKILLed and started again on its store: the client logs in where it
/// left off and gets no report a second time (before, the restarted gateway recovered the
/// engines' whole retained window and routed every old accept and fill again as new events);
/// its next order is answered as usual.
#[test]
fn a_restarted_gateway_routes_no_report_twice() {
    let cluster = Cluster::start(3).unwrap();
    let url = cluster.url();
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    let _leader = Process::engine(dir.path(), &url);
    let (gateway, address) = Process::gateway(dir.path(), &url, 1);
    let mut client = logged_in(address);
    let accepted = gateway::native::event_kind::ACCEPTED;
    for token in 1..=5 {
        assert_eq!(buy(&mut client, token), Some(accepted), "order {token}");
    }
    let before = events_until_quiet(&mut client, Duration::from_millis(500));
    assert!(before.is_empty(), "every answer read: {before:?}");
    drop(client);
    gateway.kill();
    let (_gateway, address) = Process::gateway(dir.path(), &url, 1);
    let mut client = gateway::client::NativeClient::connect(address).unwrap();
    let login = client.login(1, "pw", 6, Duration::from_secs(10)).unwrap();
    assert!(matches!(login, gateway::native::ServerMsg::LoginAccepted { .. }), "{login:?}");
    // Longer than the engine's heartbeat: a gateway that would recover old reports has by now.
    let replayed = events_until_quiet(&mut client, Duration::from_secs(2));
    assert!(replayed.is_empty(), "reports routed a second time: {replayed:?}");
    let answer = answer_to_buy(&mut client, 6, 1).map(|(kind, _)| kind);
    assert_eq!(answer, Some(accepted), "the first order after the restart");
    let after = events_until_quiet(&mut client, Duration::from_millis(500));
    assert!(after.is_empty(), "one answer per order: {after:?}");
}

/// A gateway SIGKILLed while 2,000 orders' answers are flowing, then started again on its
/// store: the client logs in after the last event it read and at once resends every order it
/// has no answer for. Across the kill its events are one run of sequence numbers (none repeated,
/// none skipped) and every order is accepted and filled exactly once (buys and sells cross):
/// an order the log already held is refused as a duplicate when resent (by the core's kept
/// ended ids once it traded), never booked twice; a report the killed gateway had taken from
/// NATS but not stored is routed by its successor.
#[test]
fn a_gateway_killed_mid_burst_answers_every_order_exactly_once_after_its_restart() {
    const ORDERS: u32 = 2_000;
    let cluster = Cluster::start(3).unwrap();
    let url = cluster.url();
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    let _leader = Process::engine(dir.path(), &url);
    let (gateway, address) = Process::gateway(dir.path(), &url, 1);
    let mut client = logged_in(address);
    // Odd tokens buy, even ones sell, at one price: every order trades, so a resend of an
    // order that already ended (filled) meets the core's kept ended ids.
    let send = |client: &mut gateway::client::NativeClient, token: u32| {
        let side = if token % 2 == 1 { "buy" } else { "sell" };
        let line = format!("{side} {token} 1 1 100000");
        let order = gateway::client::parse_script_line(&line, 1).unwrap().unwrap();
        client.send(&order)
    };
    for token in 1..=ORDERS {
        send(&mut client, token).unwrap();
    }
    let mut events = Vec::new();
    while events.len() < ORDERS as usize / 4 {
        match client.recv(Duration::from_secs(10)) {
            Ok(Some(gateway::native::ServerMsg::Sequenced { seq, event })) => {
                events.push((seq, event))
            }
            Ok(Some(_)) => {}
            other => panic!("answers stopped at {} events: {other:?}", events.len()),
        }
    }
    gateway.kill();
    let (_gateway, address) = Process::gateway(dir.path(), &url, 1);
    let mut client = gateway::client::NativeClient::connect(address).unwrap();
    let next_seq = events.last().map_or(1, |(seq, _)| seq + 1);
    let login = client.login(1, "pw", next_seq, Duration::from_secs(10)).unwrap();
    assert!(matches!(login, gateway::native::ServerMsg::LoginAccepted { .. }), "{login:?}");
    // At once, as a client that lost its link would: every order without an answer read is
    // sent again, though the log holds them all (most booked and filled by now).
    let accepted = gateway::native::event_kind::ACCEPTED;
    let answered: std::collections::HashSet<u32> =
        events.iter().filter(|(_, e)| e.kind == accepted).map(|(_, e)| e.token).collect();
    let resent: Vec<u32> = (1..=ORDERS).filter(|token| !answered.contains(token)).collect();
    for &token in &resent {
        send(&mut client, token).unwrap();
    }
    while let Ok(Some(message)) = client.recv(Duration::from_secs(3)) {
        if let gateway::native::ServerMsg::Sequenced { seq, event } = message {
            events.push((seq, event));
        }
    }
    let seqs: Vec<u64> = events.iter().map(|(seq, _)| *seq).collect();
    let expected: Vec<u64> = (1..=seqs.len() as u64).collect();
    assert_eq!(seqs, expected, "one run of sequence numbers across the kill");
    let duplicate = exchange::msg::Reason::DuplicateOrderId as u8;
    let (mut accepts, mut fills) =
        (vec![0u32; ORDERS as usize + 1], vec![0u32; ORDERS as usize + 1]);
    for (seq, event) in &events {
        match event.kind {
            kind if kind == accepted => accepts[event.token as usize] += 1,
            gateway::native::event_kind::FILLED => fills[event.token as usize] += 1,
            gateway::native::event_kind::REJECTED
                if event.reason == duplicate && resent.contains(&event.token) => {}
            _ => panic!("event {seq} is not an accept, a fill or a resend's duplicate: {event:?}"),
        }
    }
    let not_once: Vec<(u32, u32, u32)> = (1..=ORDERS)
        .map(|token| (token, accepts[token as usize], fills[token as usize]))
        .filter(|&(_, accepts, fills)| (accepts, fills) != (1, 1))
        .collect();
    assert!(
        not_once.is_empty(),
        "(token, accepts, fills) not booked and filled once: {not_once:?}"
    );
    let refused = events.iter().filter(|(_, e)| e.reason == duplicate).count();
    println!("{} of {ORDERS} orders resent after the restart, {refused} refused", resent.len());
    assert!(refused > 0, "the resends met orders the log already held");
}

/// The FIX case: a FIX client's order of 3 is partly filled (1 traded with a native
/// client), its gateway process is SIGKILLed and started again on its store, and the client
/// logs on and asks for everything again (ResendRequest from 1, as a FIX engine does after a
/// restart). It gets exactly the two ExecutionReports it had, as PossDup copies with their
/// ExecIDs, and no fill it never had (before: a new ExecID, ExecType F, CumQty 2 with only 1
/// traded); its orders resent under their ClOrdIDs, the open one and one that filled before
/// the kill, are refused as duplicates, not booked.
#[test]
fn a_fix_client_after_its_gateways_restart_gets_its_reports_again_and_no_fill_it_never_had() {
    let cluster = Cluster::start(3).unwrap();
    let url = cluster.url();
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    let hash = gateway::credentials::hash_secret(b"pw").unwrap();
    let clients = format!("1 native good {hash}\n2 fix F2 {hash}\n");
    std::fs::write(dir.path().join("clients.txt"), clients).unwrap();
    let _leader = Process::engine(dir.path(), &url);
    let fix_gateway = |dir: &std::path::Path| {
        let args = ["--role", "gateway", "--nats", &url, "--listen", "127.0.0.1:0"];
        let (gateway, mut lines) =
            Process::start_reading(dir, &[&args[..], &["--fix-listen", "127.0.0.1:0"]].concat());
        let native = native_address(&lines.next().unwrap().unwrap());
        let fix_line = lines.next().unwrap().unwrap();
        let fix: SocketAddr =
            fix_line.strip_prefix("FIX 4.4 listening on ").expect(&fix_line).parse().unwrap();
        (gateway, native, fix)
    };
    let (gateway, native, fix) = fix_gateway(dir.path());
    let mut buyer = fix_client::FixClient::connect(fix, "F2", 1);
    buyer.logon("pw");
    let order = [
        (tag::CL_ORD_ID, "o1"),
        (tag::SYMBOL, "1"),
        (tag::SIDE, "1"),
        (tag::TRANSACT_TIME, "20260101-00:00:00.000"),
        (tag::ORDER_QTY, "3"),
        (tag::ORD_TYPE, "2"),
        (tag::PRICE, "100000"),
    ];
    buyer.send("D", &order);
    let accepted = buyer.recv();
    assert_eq!(fix_client::get(&accepted, tag::EXEC_TYPE), "0", "{accepted:?}");
    let mut seller = logged_in(native);
    let line = gateway::client::parse_script_line("sell 1 1 1 100000", 1).unwrap().unwrap();
    seller.send(&line).unwrap();
    let filled = buyer.recv();
    let field = |fields: &fix_client::Fields, t| fix_client::get(fields, t).to_owned();
    let partial = [tag::EXEC_TYPE, tag::CUM_QTY, tag::LEAVES_QTY].map(|t| field(&filled, t));
    assert_eq!(partial, ["F", "1", "2"], "{filled:?}");
    // A second order, at a better price, filled whole: it ends before the kill.
    let ended_order: Vec<(u32, &str)> = order
        .iter()
        .map(|&(t, v)| match t {
            tag::CL_ORD_ID => (t, "o2"),
            tag::ORDER_QTY => (t, "1"),
            tag::PRICE => (t, "100005"),
            _ => (t, v),
        })
        .collect();
    buyer.send("D", &ended_order);
    let accepted_2 = buyer.recv();
    let line = gateway::client::parse_script_line("sell 2 1 1 100005", 1).unwrap().unwrap();
    seller.send(&line).unwrap();
    let filled_2 = buyer.recv();
    let whole = [tag::CL_ORD_ID, tag::EXEC_TYPE, tag::LEAVES_QTY].map(|t| field(&filled_2, t));
    assert_eq!(whole, ["o2", "F", "0"], "{filled_2:?}");
    gateway.kill();

    let (_gateway, _, fix) = fix_gateway(dir.path());
    let mut buyer = fix_client::FixClient::connect(fix, "F2", buyer.next_seq);
    buyer.logon("pw");
    buyer.send("2", &[(tag::BEGIN_SEQ_NO, "1"), (tag::END_SEQ_NO, "0")]);
    let mut reports = Vec::new();
    while let Some(message) = buyer.recv_within(Duration::from_secs(3)) {
        if fix_client::get(&message, tag::MSG_TYPE) == "8" {
            reports.push(message);
        }
    }
    let seen: Vec<[String; 3]> = reports
        .iter()
        .map(|r| [tag::EXEC_ID, tag::EXEC_TYPE, tag::POSS_DUP_FLAG].map(|t| field(r, t)))
        .collect();
    let expected = [&accepted, &filled, &accepted_2, &filled_2]
        .map(|r| [field(r, tag::EXEC_ID), field(r, tag::EXEC_TYPE), "Y".into()]);
    assert_eq!(seen, expected, "exactly the reports it had, resent with their ExecIDs");
    for (resend, what) in [(&order[..], "live"), (&ended_order[..], "ended")] {
        buyer.send("D", resend);
        let answer = buyer.recv();
        let refused = [tag::MSG_TYPE, tag::EXEC_TYPE].map(|t| field(&answer, t));
        assert_eq!(refused, ["8", "8"], "a resent {what} ClOrdID is refused: {answer:?}");
    }
}

/// `replication check` is a checker that can fail: a forged report batch (a real sequence
/// with other contents) on the shard's subject makes it exit 1 naming the sequence.
#[test]
fn the_replication_checker_fails_on_a_record_its_log_does_not_produce() {
    let Setup { cluster: _cluster, url, dir, rt } = Setup::new();
    let (_r_gateway, tally) = edge_and_consumer(&rt, &url);
    let _leader = Process::engine(dir.path(), &url);
    let checker = Checker::start(dir.path(), &url);
    let mut appender = Appender::open(&rt, &url);
    let total = appender.append(20);
    wait_for("the reports", Duration::from_secs(30), || reports(&tally) >= total);
    let prefix = LogSettings::new(3).publish_prefix(0);
    let header = delivery::wire::BatchHeader {
        stream: delivery::wire::Stream::Reports,
        outlet: 0,
        instance: 7,
        epoch: 0,
        first_seq: 25,
        count: 1,
    };
    let mut forged = Vec::new();
    header.write(&mut forged);
    let record = delivery::wire::Record::encode(&exchange::msg::Response::default(), 0, 0);
    forged.extend_from_slice(&record.0);
    rt.block_on(async {
        let client = delivery::nats::connect(&NatsConnect::new(&url), "forger").await.unwrap();
        let subject = delivery::subjects::data_subject(&prefix, 0, delivery::wire::Stream::Reports);
        client.publish(subject, forged.into()).await.unwrap();
        client.flush().await.unwrap();
    });
    let (status, out) = checker.stop();
    assert_eq!(status.code(), Some(1), "the forged record is found: {out}");
    assert!(out.contains("differs or not produced: 0.reports sequence 25"), "{out}");
}

/// Sends `buy {token} 1 1 100000` (a resting buy of instrument 1); the answer's event kind.
/// A native session of client 1 (secret `pw`) at `address`, logged in.
fn logged_in(address: SocketAddr) -> gateway::client::NativeClient {
    let mut client = gateway::client::NativeClient::connect(address).unwrap();
    let login = client.login(1, "pw", 0, Duration::from_secs(10)).unwrap();
    assert!(matches!(login, gateway::native::ServerMsg::LoginAccepted { .. }), "{login:?}");
    client
}

fn buy(client: &mut gateway::client::NativeClient, token: u32) -> Option<u8> {
    buy_of(client, token, 1)
}

/// A resting buy of `instrument` (qty 1 at 100000 ticks, inside every reference band);
/// the answer's event kind.
fn buy_of(client: &mut gateway::client::NativeClient, token: u32, instrument: u32) -> Option<u8> {
    answer_to_buy(client, token, instrument).map(|(kind, _)| kind)
}

/// [`buy_of`]'s answer: its event kind and reason code.
fn answer_to_buy(
    client: &mut gateway::client::NativeClient,
    token: u32,
    instrument: u32,
) -> Option<(u8, u8)> {
    let line = format!("buy {token} {instrument} 1 100000");
    let order = gateway::client::parse_script_line(&line, 1);
    client.send(&order.unwrap().unwrap()).unwrap();
    event_of(client, token, |_| true).map(|event| (event.kind, event.reason))
}

/// The first event for `token` on `client`'s session whose kind `wanted` takes (`None`: none
/// within 10 s of the one before).
fn event_of(
    client: &mut gateway::client::NativeClient,
    token: u32,
    wanted: impl Fn(u8) -> bool,
) -> Option<gateway::native::Event> {
    loop {
        match client.recv(Duration::from_secs(10)) {
            Ok(Some(gateway::native::ServerMsg::Sequenced { event, .. }))
                if event.token == token && wanted(event.kind) =>
            {
                return Some(event);
            }
            Ok(Some(_)) => continue,
            _ => return None,
        }
    }
}

/// A gateway process and engine processes: a native client's orders are accepted through the
/// gateway → stream → engine → NATS → gateway, before and after the leading engine is killed;
/// the gateway stops on SIGTERM with exit 0.
#[test]
fn a_gateway_process_answers_its_clients_through_the_engines_and_a_failover() {
    let cluster = Cluster::start(3).unwrap();
    let url = cluster.url();
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    let leader = Process::engine(dir.path(), &url);
    let gateway_args = ["--role", "gateway", "--nats", &url, "--listen", "127.0.0.1:0"];
    let (gateway, first) = Process::start(dir.path(), &gateway_args);
    let address = native_address(&first);
    let mut client = logged_in(address);
    let accepted = gateway::native::event_kind::ACCEPTED;
    for token in 1..=20 {
        assert_eq!(buy(&mut client, token), Some(accepted), "order {token} before the kill");
    }
    let _standby = Process::engine(dir.path(), &url);
    std::thread::sleep(Duration::from_millis(500)); // the standby applies the first orders
    let killed_at = Instant::now();
    leader.kill();
    assert_eq!(buy(&mut client, 21), Some(accepted), "the first order after the kill");
    println!(
        "gateway client: SIGKILL of the leader → next order's report {:?}",
        killed_at.elapsed()
    );
    for token in 22..=40 {
        assert_eq!(buy(&mut client, token), Some(accepted), "order {token} after the kill");
    }
    drop(client);
    assert!(gateway.terminate().success(), "the gateway drains and exits 0 on SIGTERM");
}

/// `POST` `path` with the admin token to the endpoint at `admin`; the status line.
fn admin_post(admin: SocketAddr, path: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(admin).unwrap();
    let request = format!("POST {path} HTTP/1.1\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\n\r\n");
    stream.write_all(request.as_bytes()).unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    text.lines().next().unwrap_or_default().to_string()
}

/// An operator's halt on a gateway goes into the input log among the orders: the leader
/// refuses the orders behind it, the standby that takes over after the leader's SIGKILL
/// applied it too, and a resume through the gateway lifts it.
#[test]
fn an_admin_halt_on_a_gateway_holds_across_a_failover_until_the_resume() {
    let cluster = Cluster::start(3).unwrap();
    let url = cluster.url();
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    let leader = Process::engine(dir.path(), &url);
    let _standby = Process::engine(dir.path(), &url);
    let args = ["--role", "gateway", "--nats", &url, "--listen", "127.0.0.1:0"];
    let metrics = ["--metrics-listen", "127.0.0.1:0"];
    let (_gateway, mut lines) = Process::start_reading(dir.path(), &[&args[..], &metrics].concat());
    let first = lines.next().expect("a line").unwrap();
    let address = native_address(&first);
    let admin = metrics_address(&lines.next().expect("the metrics line").unwrap());
    let mut client = logged_in(address);
    let accepted = (gateway::native::event_kind::ACCEPTED, 0);
    let halted = (gateway::native::event_kind::REJECTED, Reason::InstrumentHalted as u8);
    assert_eq!(answer_to_buy(&mut client, 1, 1), Some(accepted), "before the halt");
    let status = admin_post(admin, "/admin/halt?instrument=1");
    assert!(status.ends_with("200 OK"), "{status}");
    // One appender, in order: the halt is in the log before the next order.
    assert_eq!(answer_to_buy(&mut client, 2, 1), Some(halted), "after the halt");
    assert_eq!(answer_to_buy(&mut client, 3, 2), Some(accepted), "another instrument trades");
    leader.kill();
    assert_eq!(answer_to_buy(&mut client, 4, 1), Some(halted), "the new leader holds the halt");
    let status = admin_post(admin, "/admin/resume?instrument=1");
    assert!(status.ends_with("200 OK"), "{status}");
    assert_eq!(answer_to_buy(&mut client, 5, 1), Some(accepted), "after the resume");
}

/// Every engine of the shard dies: an engine started afterwards restores the snapshot the
/// leader wrote (`--snapshot-every`), replays the log after it, and its book holds the orders
/// from before the snapshot (a sell takes the first buy).
#[test]
fn a_new_engine_restores_the_shards_snapshot_after_every_engine_died() {
    let cluster = Cluster::start(3).unwrap();
    let url = cluster.url();
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    let engine_args = ["--role", "engine", "--nats", &url, "--snapshot-every", "10"];
    let (leader, first) = Process::start(dir.path(), &engine_args);
    assert!(first.starts_with("engine for shard 0 following"), "{first}");
    let (_gateway, address) = Process::gateway(dir.path(), &url, 1);
    let mut client = logged_in(address);
    let accepted = gateway::native::event_kind::ACCEPTED;
    for token in 1..=25 {
        assert_eq!(buy(&mut client, token), Some(accepted), "order {token}");
    }
    let stored = "snapshot of shard 0 at input sequence 20";
    wait_for(stored, Duration::from_secs(30), || logs(dir.path()).contains(stored));
    leader.kill();
    let (_restored, first) = Process::start(dir.path(), &engine_args);
    assert!(first.starts_with("engine for shard 0 following"), "{first}");
    let sell = gateway::client::parse_script_line("sell 26 1 1 100000", 1).unwrap().unwrap();
    client.send(&sell).unwrap();
    let filled_kind = gateway::native::event_kind::FILLED;
    let filled = event_of(&mut client, 26, |kind| kind == filled_kind).is_some();
    let logs = logs(dir.path());
    if !filled {
        print_warnings(dir.path());
    }
    assert!(filled, "the restored book holds the buys: the sell fills");
    assert!(
        logs.contains("restored shard 0 at input sequence 20"),
        "the new engine started from the snapshot at 20"
    );
}

/// Two shards in two engine processes, one gateway: each instrument's orders go to its
/// shard's stream (`instrument % shards`) and are answered by that shard's engine.
#[test]
fn two_shards_each_book_their_own_instruments_behind_one_gateway() {
    let cluster = Cluster::start(3).unwrap();
    let url = cluster.url();
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    let _engine_1 = Process::shard_engine(dir.path(), &url, (1, 2));
    let args =
        ["--role", "engine", "--nats", &url, "--shards", "2", "--metrics-listen", "127.0.0.1:0"];
    let (_engine_0, mut lines) = Process::start_reading(dir.path(), &args);
    let metrics_line = lines.nth(1).expect("the metrics line").unwrap();
    let metrics = metrics_address(&metrics_line);
    let (_gateway, address) = Process::gateway(dir.path(), &url, 2);
    let mut client = logged_in(address);
    let accepted = gateway::native::event_kind::ACCEPTED;
    for token in 1..=20u32 {
        let instrument = 1 + token % 2; // 2, 1, 2, ...: both shards
        assert_eq!(buy_of(&mut client, token, instrument), Some(accepted), "order {token}");
    }
    check_engine_endpoint(metrics);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let settings = LogSettings { shards: 2, ..LogSettings::new(3) };
    for shard in 0..2 {
        let instruments: Vec<u32> = rt.block_on(async {
            let client = delivery::nats::connect(&NatsConnect::new(&url), "test").await.unwrap();
            let mut follower = Follower::open(client, &settings, shard, 1).await.unwrap();
            let mut instruments = Vec::new();
            for _ in 0..10 {
                let next = tokio::time::timeout(Duration::from_secs(5), follower.next()).await;
                instruments.push(next.unwrap().unwrap().unwrap().order.instrument);
            }
            instruments
        });
        assert!(instruments.iter().all(|i| i % 2 == shard), "shard {shard}: {instruments:?}");
    }
}

/// The engine's admin endpoint: ready, leading, its applied sequence as a gauge a real
/// Prometheus parser reads, `process_*`, 404 elsewhere.
fn check_engine_endpoint(metrics: SocketAddr) {
    assert_eq!(ops::endpoint::get(metrics, "/health").unwrap().0, 200);
    assert_eq!(ops::endpoint::get(metrics, "/ready").unwrap().0, 200);
    assert_eq!(ops::endpoint::get(metrics, "/nope").unwrap().0, 404);
    let (status, page) = ops::endpoint::get(metrics, "/metrics").unwrap();
    assert_eq!(status, 200, "{page}");
    let scrape = prometheus_parse::Scrape::parse(page.lines().map(|l| Ok(l.to_string()))).unwrap();
    let value = |name: &str| {
        let sample = scrape.samples.iter().find(|s| s.metric == name);
        match sample.unwrap_or_else(|| panic!("no {name} in {page}")).value {
            prometheus_parse::Value::Gauge(v) | prometheus_parse::Value::Counter(v) => v,
            ref other => panic!("{name}: {other:?}"),
        }
    };
    assert_eq!(value("engine_leader"), 1.0, "the only engine of shard 0 leads");
    assert!(value("engine_applied_input_seq") >= 10.0, "shard 0's ten orders applied");
    assert!(scrape.samples.iter().any(|s| s.metric.starts_with("process_")), "process metrics");
}

/// A network namespace joined to this one by a veth pair: `10.250.N.1` here, `10.250.N.2`
/// there; deleted when dropped.
struct Namespace {
    name: String,
    here: String,
    subnet: u8,
}

impl Namespace {
    /// `None` when this process may not make namespaces (not root, no `ip`).
    fn create() -> Option<Namespace> {
        let id = std::process::id() % 10_000;
        let subnet = (id % 200) as u8 + 20;
        let (name, here, there) = (format!("lt-part-{id}"), format!("ltr{id}"), format!("ltn{id}"));
        let ns = Namespace { name: name.clone(), here: here.clone(), subnet };
        let ip = |args: &[&str]| Command::new("ip").args(args).status().is_ok_and(|s| s.success());
        let inside = |args: &[&str]| {
            let mut all = vec!["netns", "exec", &name, "ip"];
            all.extend(args);
            ip(&all)
        };
        let (addr_here, addr_there) = (ns.here_addr(), format!("10.250.{subnet}.2/30"));
        let made = ip(&["netns", "add", &name])
            && ip(&["link", "add", &here, "type", "veth", "peer", "name", &there])
            && ip(&["link", "set", &there, "netns", &name])
            && ip(&["addr", "add", &format!("{addr_here}/30"), "dev", &here])
            && ip(&["link", "set", &here, "up"])
            && inside(&["addr", "add", &addr_there, "dev", &there])
            && inside(&["link", "set", &there, "up"])
            && inside(&["link", "set", "lo", "up"]);
        made.then_some(ns)
    }

    fn here_addr(&self) -> String {
        format!("10.250.{}.1", self.subnet)
    }

    /// Cuts (`false`) or restores (`true`) the link.
    fn link(&self, up: bool) {
        let state = if up { "up" } else { "down" };
        let done = Command::new("ip").args(["link", "set", &self.here, state]).status().unwrap();
        assert!(done.success(), "ip link set {} {state}", self.here);
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "del", &self.here]).status();
        let _ = Command::new("ip").args(["netns", "del", &self.name]).status();
    }
}

/// The leading engine runs in a network namespace of its own; a partition cuts it off. It
/// stops publishing when its lease's validity ends, the standby takes the lease, and the
/// consumer's reports go on exactly once and in sequence; once the partition heals, the old
/// leader stays a standby (it lost the lease) and nothing it had queued disturbs the stream.
#[test]
fn a_partitioned_leader_stops_and_the_standby_takes_over() {
    let Some(namespace) = Namespace::create() else {
        eprintln!(
            "SKIPPED a_partitioned_leader_stops_and_the_standby_takes_over: needs root and `ip netns`"
        );
        return;
    };
    let cluster = Cluster::start_on(3, Ipv4Addr::UNSPECIFIED).unwrap();
    let url = cluster.url();
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (edge, tally) = edge_and_consumer(&rt, &url);
    let mut appender = Appender::open(&rt, &url);
    let mut append = |count| appender.append(count);

    let url_there = cluster.url_at(namespace.here_addr().parse().unwrap());
    let log_path = dir.path().join("partitioned-engine.log");
    let partitioned = partitioned_engine(&namespace, dir.path(), &url_there, &log_path);
    let total = append(50);
    wait_for("the partitioned-to-be leader's reports", Duration::from_secs(30), || {
        reports(&tally) >= total
    });
    let args = ["--role", "engine", "--nats", &url, "--metrics-listen", "127.0.0.1:0"];
    let (_standby, mut lines) = Process::start_reading(dir.path(), &args);
    let line = lines.nth(1).expect("the metrics line").unwrap();
    let metrics = metrics_address(&line);
    std::thread::sleep(Duration::from_millis(500)); // the standby applies the first orders

    namespace.link(false);
    let cut_at = Instant::now();
    let total = append(1);
    wait_for("a report after the partition", Duration::from_secs(30), || reports(&tally) >= total);
    println!("partition → first report of the new leader: {:?}", cut_at.elapsed());
    let total = append(50);
    wait_for("the new leader's reports", Duration::from_secs(30), || reports(&tally) >= total);
    namespace.link(true);
    std::thread::sleep(Duration::from_secs(3)); // the old leader reconnects, finds it lost
    let total = append(50);
    wait_for("reports after the heal", Duration::from_secs(30), || reports(&tally) >= total);
    std::thread::sleep(Duration::from_millis(300));

    assert_every_report_once(&tally, total, "");
    let (status, page) = ops::endpoint::get(metrics, "/metrics").unwrap();
    assert_eq!(status, 200);
    assert!(page.lines().any(|l| l == "engine_leader 1"), "the standby leads: {page}");
    drop(partitioned);
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(log.contains("lost the lease"), "the cut-off leader knew it lost: {log}");
    assert_eq!(log.matches("took the lease").count(), 1, "and never took it back: {log}");
    drop(edge);
}

/// Appends resting buys of instrument 1 to shard 0's log, as a gateway would (ids 1, 2, ...).
struct Appender<'a> {
    rt: &'a tokio::runtime::Runtime,
    log: OrderLog,
    appended: u64,
}

impl<'a> Appender<'a> {
    fn open(rt: &'a tokio::runtime::Runtime, url: &str) -> Appender<'a> {
        let log = rt.block_on(async {
            let client = delivery::nats::connect(&NatsConnect::new(url), "test").await.unwrap();
            OrderLog::open(client, LogSettings::new(3)).await.unwrap()
        });
        Appender { rt, log, appended: 0 }
    }

    /// Appends `count` more orders; how many were appended in all.
    fn append(&mut self, count: u64) -> u64 {
        for _ in 0..count {
            self.appended += 1;
            let id = AppendId { gateway: 1, run: 1, seq: self.appended };
            self.rt.block_on(self.log.append(&order(self.appended), id, 0)).unwrap();
        }
        self.appended
    }
}

/// A delivery edge for shard 0's outlet 0 and a consumer of it.
fn edge_and_consumer(
    rt: &tokio::runtime::Runtime,
    url: &str,
) -> (delivery::edge::RunningEdge, SharedTally) {
    let listen = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    let prefix = LogSettings::new(3).publish_prefix(0);
    let options = EdgeOptions { prefix, ..EdgeOptions::new(url, 0, listen) };
    let edge = rt.block_on(start_edge(options)).unwrap();
    let (tally, reading) = rt.block_on(consumer::connect(edge.local_addr().unwrap(), 0)).unwrap();
    rt.spawn(reading);
    (edge, tally)
}

/// An engine inside `namespace`, logging to `log` at info.
fn partitioned_engine(
    namespace: &Namespace,
    dir: &std::path::Path,
    url: &str,
    log: &std::path::Path,
) -> Process {
    let log = std::fs::File::create(log).unwrap();
    let mut child = Command::new("ip")
        .args(["netns", "exec", &namespace.name, env!("CARGO_BIN_EXE_leantier")])
        .args(["exchange", "serve", "--config", "serve.toml", "--replicas", "3"])
        .args(["--role", "engine", "--nats", url])
        .env("LEANTIER_LOG", "info")
        .current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().expect("a line").unwrap();
    assert!(first.starts_with("engine for shard 0 following"), "{first}");
    Process(child)
}

/// A serve config in `dir` whose credentials let native clients 1 and 2 and FIX clients 11 and
/// 12 (`F11`, `F12`) log in with secret `pw`.
fn write_load_config(dir: &std::path::Path) {
    write_config(dir);
    let hash = gateway::credentials::hash_secret(b"pw").unwrap();
    let lines: String =
        [(1, "native", "N1"), (2, "native", "N2"), (11, "fix", "F11"), (12, "fix", "F12")]
            .iter()
            .map(|(client, protocol, comp)| format!("{client} {protocol} {comp} {hash}\n"))
            .collect();
    std::fs::write(dir.join("clients.txt"), lines).unwrap();
}

/// Open-loop load (Poisson, 300 orders/s) of `protocol` sessions for `clients` against a
/// gateway at `address`, for `duration`.
fn open_loop(
    address: SocketAddr,
    protocol: experiments::order_entry_load::LoadProtocol,
    clients: [(u32, &str); 2],
    duration: Duration,
) -> experiments::order_entry_load::LoadOptions {
    let band = *reference_master_data(&UniverseConfig::default()).instrument(1).unwrap();
    let sessions = clients.map(|(client, comp_id)| experiments::order_entry_load::LoadSession {
        client,
        comp_id: comp_id.into(),
        secret: "pw".into(),
    });
    experiments::order_entry_load::LoadOptions {
        connect: address,
        protocol,
        sessions: sessions.to_vec(),
        plan: stats::open_loop::OpenLoopPlan {
            process: stats::open_loop::ArrivalProcess::Poisson { rate_per_s: 300.0 },
            seed: 7,
            duration,
        },
        instruments: vec![experiments::order_entry_load::Traded::reference(
            1,
            (band.band_low + band.band_high) / 2,
        )],
        tls: None,
        drain: DRAIN,
    }
}

/// The NATS node a gateway process is connected to SIGKILLed under open-loop load and
/// restarted 3 s later: the gateway was given only that node's URL (it learns the others from
/// the cluster), reconnects to another, appends again what was not acknowledged and reads the
/// reports from there on. Every order sent is answered (accepted, or its trade), none rejected.
#[test]
fn killing_the_gateways_nats_node_under_load_loses_no_order() {
    let mut cluster = Cluster::start(3).unwrap();
    let url = cluster.url();
    let dirs = [(); 2].map(|()| tempfile::tempdir().unwrap());
    for dir in &dirs {
        write_load_config(dir.path());
    }
    let _leader = Process::engine(dirs[0].path(), &url);
    let _standby = Process::engine(dirs[0].path(), &url);
    const GATEWAYS_NODE: usize = 2;
    let (_gateway, native) = Process::gateway(dirs[1].path(), &cluster.url_of(GATEWAYS_NODE), 1);
    let protocol = experiments::order_entry_load::LoadProtocol::Native;
    let options = open_loop(native, protocol, [(1, "N1"), (2, "N2")], Duration::from_secs(7));
    let load = std::thread::spawn(move || experiments::order_entry_load::run(&options).unwrap());
    std::thread::sleep(Duration::from_secs(2));
    cluster.kill(GATEWAYS_NODE);
    std::thread::sleep(Duration::from_secs(3));
    cluster.restart(GATEWAYS_NODE).unwrap();
    let result = load.join().unwrap();
    println!(
        "gateway's node SIGKILLed: sent {}, answered {}, rejected {}, latency max {:.1} ms",
        result.sent,
        result.answered,
        result.rejected,
        result.latency.max_ns() as f64 / 1e6
    );
    if result.answered != result.sent {
        dirs.iter().for_each(|dir| print_warnings(dir.path()));
    }
    assert!(result.sent > 1_000, "the load ran");
    assert_eq!(result.answered, result.sent, "every order answered");
    assert_eq!(result.rejected, 0, "none rejected");
}

/// Two gateway processes (native sessions on one, FIX on the other) under open-loop load while
/// the leading engine is SIGKILLed `LEANTIER_FAILOVER_KILLS` times (a new standby started each
/// time): every order sent is answered (accepted, or its trade) and none is rejected.
#[test]
fn open_loop_fix_and_native_clients_lose_no_order_across_leader_kills() {
    let kills: u32 = std::env::var("LEANTIER_FAILOVER_KILLS").map_or(1, |k| k.parse().unwrap());
    let cluster = Cluster::start(3).unwrap();
    let url = cluster.url();
    let dirs = [(); 3].map(|()| tempfile::tempdir().unwrap());
    for dir in &dirs {
        write_load_config(dir.path());
    }
    let mut leader = Process::engine(dirs[0].path(), &url);
    let mut standby = Process::engine(dirs[0].path(), &url);
    let (_native_gateway, native) = Process::gateway(dirs[1].path(), &url, 1);
    let fix_args = [
        "--role",
        "gateway",
        "--nats",
        &url,
        "--listen",
        "127.0.0.1:0",
        "--fix-listen",
        "127.0.0.1:0",
    ];
    let (_fix_gateway, mut lines) = Process::start_reading(dirs[2].path(), &fix_args);
    let fix_line = lines.nth(1).expect("the FIX line").unwrap();
    let fix: SocketAddr =
        fix_line.strip_prefix("FIX 4.4 listening on ").expect(&fix_line).parse().unwrap();

    let every = Duration::from_millis(2500);
    let duration = every * (kills + 1);
    let fix_protocol =
        experiments::order_entry_load::LoadProtocol::Fix { target_comp_id: "LEANTIER".into() };
    let loads = [
        open_loop(
            native,
            experiments::order_entry_load::LoadProtocol::Native,
            [(1, "N1"), (2, "N2")],
            duration,
        ),
        open_loop(fix, fix_protocol, [(11, "F11"), (12, "F12")], duration),
    ]
    .map(|options| {
        std::thread::spawn(move || experiments::order_entry_load::run(&options).unwrap())
    });
    for _ in 0..kills {
        std::thread::sleep(every);
        leader.kill();
        leader = standby;
        standby = Process::engine(dirs[0].path(), &url);
    }
    for (load, name) in loads.into_iter().zip(["native", "FIX"]) {
        let result = load.join().unwrap();
        println!(
            "{name}: sent {}, answered {}, rejected {}",
            result.sent, result.answered, result.rejected
        );
        if result.answered != result.sent {
            dirs.iter().for_each(|dir| print_warnings(dir.path()));
        }
        assert!(result.sent > 300, "{name}: the load ran");
        assert_eq!(result.answered, result.sent, "{name}: every order answered");
        assert_eq!(result.rejected, 0, "{name}: none rejected");
    }
}

/// A gateway's `/ready` follows its NATS connection: 200 while the cluster answers, 503 once
/// every node is gone (no order would reach an engine).
#[test]
fn a_gateway_is_ready_only_while_it_reaches_nats() {
    let mut cluster = Cluster::start(3).unwrap();
    let url = cluster.url();
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    let args = [
        "--role",
        "gateway",
        "--nats",
        &url,
        "--listen",
        "127.0.0.1:0",
        "--metrics-listen",
        "127.0.0.1:0",
    ];
    let (_gateway, mut lines) = Process::start_reading(dir.path(), &args);
    let line = lines.nth(1).expect("the metrics line").unwrap();
    let metrics = metrics_address(&line);
    assert_eq!(ops::endpoint::get(metrics, "/ready").unwrap().0, 200);
    for node in 0..3 {
        cluster.kill(node);
    }
    wait_for("/ready says not ready", Duration::from_secs(10), || {
        ops::endpoint::get(metrics, "/ready").unwrap().0 == 503
    });
    assert_eq!(ops::endpoint::get(metrics, "/health").unwrap().0, 200, "alive all the same");
}
