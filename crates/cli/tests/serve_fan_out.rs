//! `exchange serve --nats`: one server takes orders from a FIX client (and a native one) and
//! also publishes every response over NATS to a delivery edge (`exchange edge`), all real
//! processes on loopback. A FIX client's fill reaches its FIX session AND the delivery edge's end
//! consumer, in the same order, and the consumer sees the FIX client's outlet subject
//! gap-free from sequence 1; this holds again after the server is killed and a new one starts
//! over the same store with `--journal group` (its book recovered from the journal).
//!
//! NATS: a private `nats-server` child (`scripts/nats-env` installs the package), else
//! `$LEANTIER_NATS_URL`; with neither, the test says SKIPPED and passes (see [`nats`]).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

#[path = "common/fix_client.rs"]
mod fix_client;
use fix_client::{FixClient, get};

use delivery::wire::{Frame, FrameDecoder, Record, Stream, WIRE_VERSION};
use exchange::msg::OutputKind;
use gateway::client::NativeClient;
use gateway::fix::tag;
use gateway::native::{ClientMsg, OrderRequest, ServerMsg};
use gateway::order_id;

/// Generous on a loaded 2-CPU host; a passing run never waits this long.
const WAIT: Duration = Duration::from_secs(10);
const SECRET: &str = "fan-out-secret";
/// The FIX client: client id 11, SenderCompID F11.
const FIX_CLIENT: u32 = 11;
const FIX_COMP_ID: &str = "F11";
/// Its counterparty, over the native protocol.
const NATIVE_CLIENT: u32 = 12;
/// The tier's outlets: client c's reports go to outlet c % OUTLETS, instrument i's market
/// data to outlet i % OUTLETS.
const OUTLETS: u32 = 2;
/// The delivery edge under test: the FIX client's (1), which also carries instrument 1's market
/// data; the native client's reports go to outlet 0.
const OUTLET: u32 = FIX_CLIENT % OUTLETS;
const INSTRUMENT: u32 = 1;
/// Instrument 1's reference price (on tick, inside the band).
const PRICE: i64 = 101_000;

// ---------------------------------------------------------------------------------------
// Child processes

/// A child process whose stdout and stderr lines are read by threads into channels, so every
/// wait for a line is bounded. Killed when dropped; its stderr is printed then if the test is
/// failing.
struct Proc {
    name: &'static str,
    child: Child,
    stdout: mpsc::Receiver<String>,
    stderr: mpsc::Receiver<String>,
    /// Every stderr line taken from the channel so far (for diagnostics).
    stderr_seen: Vec<String>,
}

fn lines_of(read: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (send, receive) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(read).lines() {
            let Ok(line) = line else { break };
            if send.send(line).is_err() {
                break;
            }
        }
    });
    receive
}

impl Proc {
    fn spawn(name: &'static str, args: &[&str]) -> Proc {
        let mut child = Command::new(env!("CARGO_BIN_EXE_leantier"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {name}: {e}"));
        let stdout = lines_of(child.stdout.take().expect("piped stdout"));
        let stderr = lines_of(child.stderr.take().expect("piped stderr"));
        Proc { name, child, stdout, stderr, stderr_seen: Vec::new() }
    }

    /// The next stdout line that starts with `prefix`, with the rest of the line.
    fn stdout_after(&mut self, prefix: &str) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stdout.recv_timeout(left) {
                Ok(line) => {
                    if let Some(rest) = line.strip_prefix(prefix) {
                        return rest.trim().to_string();
                    }
                }
                Err(error) => {
                    panic!("{}", self.failure(&format!("no `{prefix}...` line ({error})")))
                }
            }
        }
    }

    /// Waits for a stderr (log) line containing `needle`.
    fn stderr_with(&mut self, needle: &str) {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stderr.recv_timeout(left) {
                Ok(line) => {
                    let found = line.contains(needle);
                    self.stderr_seen.push(line);
                    if found {
                        return;
                    }
                }
                Err(error) => {
                    panic!("{}", self.failure(&format!("no log line with {needle:?} ({error})")))
                }
            }
        }
    }

    /// `what` went wrong, with the process's name and its stderr so far.
    fn failure(&mut self, what: &str) -> String {
        self.stderr_seen.extend(self.stderr.try_iter());
        format!("{}: {what}; its stderr:\n{}", self.name, self.stderr_seen.join("\n"))
    }

    /// SIGKILL, as a crash (`exchange serve` has no signal handling: SIGTERM ends it the
    /// same way, without draining its publisher).
    fn kill(mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reaping the child");
    }

    /// SIGTERM, then every stdout line until the process exits (it must exit by itself).
    fn terminate(mut self) -> Vec<String> {
        let pid = self.child.id().to_string();
        let signalled = Command::new("kill").args(["-TERM", &pid]).status().expect("kill(1)");
        assert!(signalled.success(), "{}: kill -TERM {pid} failed", self.name);
        let mut lines = Vec::new();
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stdout.recv_timeout(left) {
                Ok(line) => lines.push(line),
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    panic!("{}: still running {WAIT:?} after SIGTERM", self.name)
                }
            }
        }
        let status = self.child.wait().expect("reaping the child");
        if !status.success() {
            panic!("{}", self.failure(&format!("exited with {status}")));
        }
        lines
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- {}", self.failure("the test failed"));
        }
    }
}

/// `exchange serve` over `dir/serve.toml` with a FIX and a native listener on free ports.
struct Server {
    proc: Proc,
    native: SocketAddr,
    fix: SocketAddr,
}

impl Server {
    fn start(dir: &Path, nats: &str) -> Server {
        let config = dir.join("serve.toml");
        let mut proc = Proc::spawn(
            "exchange serve",
            &[
                "exchange",
                "serve",
                "--config",
                config.to_str().expect("a UTF-8 path"),
                "--listen",
                "127.0.0.1:0",
                "--fix-listen",
                "127.0.0.1:0",
                "--journal",
                "group",
                "--nats",
                nats,
            ],
        );
        let native = proc.stdout_after("native listening on ").parse().expect("an address");
        let fix = proc.stdout_after("FIX 4.4 listening on ").parse().expect("an address");
        Server { proc, native, fix }
    }
}

/// `exchange edge` for [`OUTLET`] on a free port.
struct Edge {
    proc: Proc,
    address: SocketAddr,
}

/// The counters a delivery edge prints when stopped.
#[derive(Debug)]
struct EdgeCounters {
    received: u64,
    gaps: u64,
    resyncs: u64,
    duplicates: u64,
    consumers: u64,
    malformed: u64,
    untrusted: u64,
}

impl Edge {
    fn start(nats: &str) -> Edge {
        let outlet = OUTLET.to_string();
        // `info`: the edge logs each consumer it admits, which the test waits for.
        let args = ["--log", "info", "exchange", "edge", "--nats", nats, "--outlet"];
        let mut proc = Proc::spawn(
            "exchange edge",
            &[&args[..], &[outlet.as_str(), "--listen", "127.0.0.1:0"]].concat(),
        );
        // Printed once subscribed (the subscription is flushed to the server first).
        let address = proc
            .stdout_after(&format!("edge of outlet {OUTLET} listening on "))
            .parse()
            .expect("an address");
        Edge { proc, address }
    }

    /// A consumer, connected and admitted (the edge logged it): it sees every record the
    /// edge takes from now on.
    fn consumer(&mut self) -> Consumer {
        let consumer = Consumer::connect(self.address);
        let local = consumer.stream.local_addr().expect("a local address");
        self.proc.stderr_with(&format!("consumer {local} connected"));
        consumer
    }

    /// SIGTERM; the counters it prints.
    fn stop(self) -> EdgeCounters {
        let lines = self.proc.terminate();
        let counter = |name: &str| -> u64 {
            let line = lines
                .iter()
                .find(|line| line.starts_with(name))
                .unwrap_or_else(|| panic!("no `{name}` in the edge's report: {lines:#?}"));
            line.split_whitespace().last().and_then(|n| n.parse().ok()).expect("a count")
        };
        EdgeCounters {
            received: counter("records received (in order)"),
            gaps: counter("gaps detected"),
            resyncs: counter("resyncs sent"),
            duplicates: counter("duplicates dropped"),
            consumers: counter("consumers connected"),
            malformed: counter("malformed batches"),
            untrusted: counter("untrusted messages ignored"),
        }
    }
}

// ---------------------------------------------------------------------------------------
// The delivery edge's end consumer

/// A blocking end consumer that keeps every frame it receives.
struct Consumer {
    stream: TcpStream,
    decoder: FrameDecoder,
    frames: Vec<Frame>,
    closed: bool,
}

impl Consumer {
    fn connect(address: SocketAddr) -> Consumer {
        let mut stream = TcpStream::connect(address).expect("connecting to the delivery edge");
        stream.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let mut hello = Vec::new();
        Frame::Hello { version: WIRE_VERSION }.write(&mut hello);
        stream.write_all(&hello).expect("sending the hello");
        Consumer { stream, decoder: FrameDecoder::default(), frames: Vec::new(), closed: false }
    }

    /// Reads one socket read's worth of frames (or none within the read timeout).
    fn read_some(&mut self) {
        let mut buffer = [0u8; 4096];
        match self.stream.read(&mut buffer) {
            Ok(0) => self.closed = true,
            Ok(n) => {
                self.decoder.extend(&buffer[..n]);
                while let Some(frame) = self.decoder.next_frame().expect("a well-framed stream") {
                    self.frames.push(frame);
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => panic!("reading from the delivery edge: {e}"),
        }
    }

    /// Reads until `done(frames)` holds.
    fn read_until(&mut self, what: &str, done: impl Fn(&[Frame]) -> bool) {
        let deadline = Instant::now() + WAIT;
        while !done(&self.frames) {
            assert!(!self.closed, "the delivery edge closed the consumer before {what}");
            assert!(
                Instant::now() < deadline,
                "the consumer did not get {what} within {WAIT:?}; it got {:#?}",
                self.frames
            );
            self.read_some();
        }
    }

    /// Reads until the edge closes the connection (after it was told to stop).
    fn read_to_end(&mut self) {
        let deadline = Instant::now() + WAIT;
        while !self.closed {
            assert!(Instant::now() < deadline, "the delivery edge kept the consumer open");
            self.read_some();
        }
    }
}

/// The data records of `stream` among `frames`, checked gap-free: sequences `first`,
/// `first + 1`, ..., no resync frame, every record routed to [`OUTLET`].
fn gap_free(frames: &[Frame], stream: Stream, first: u64) -> Vec<Record> {
    let mut next = first;
    let mut records = Vec::new();
    for frame in frames {
        match frame {
            Frame::Data { stream: s, seq, record, .. } if *s == stream => {
                assert_eq!(*seq, next, "{}: sequence {seq} where {next} was due", stream.name());
                assert_eq!(
                    record.outlet(),
                    OUTLET,
                    "{}: a record of another outlet",
                    stream.name()
                );
                next += 1;
                records.push(*record);
            }
            Frame::Resync { stream: s, first_seq, last_seq } if *s == stream => {
                panic!("{}: records {first_seq}..={last_seq} declared lost", stream.name())
            }
            _ => {}
        }
    }
    records
}

fn data_count(frames: &[Frame], stream: Stream) -> usize {
    frames.iter().filter(|f| matches!(f, Frame::Data { stream: s, .. } if *s == stream)).count()
}

/// The fields of a record's canonical output bytes (`CoreOutput::canonical_bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Output {
    kind: u8,
    client: u32,
    order_id: u64,
    price: i64,
    qty: u32,
    leaves_qty: u32,
    contra_order_id: u64,
}

fn output_of(record: &Record) -> Output {
    let b = record.output_bytes();
    let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
    let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
    // seq u64, kind, reason, side, instrument u32, client u32, order id u64, price i64,
    // qty u32, leaves u32, contra order id u64, best ask i64.
    Output {
        kind: b[8],
        client: u32_at(15),
        order_id: u64_at(19),
        price: u64_at(27) as i64,
        qty: u32_at(35),
        leaves_qty: u32_at(39),
        contra_order_id: u64_at(43),
    }
}

// ---------------------------------------------------------------------------------------
// FIX: the part of crates/gateway/tests/common/fix_client.rs this test needs

/// An execution report as both sides can state it: ExecType, OrderID (the client's order
/// number), LeavesQty, and LastQty/LastPx of a fill.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Report {
    exec_type: u8,
    order: u32,
    leaves_qty: u32,
    fill: Option<(u32, i64)>,
}

/// What the FIX session must have sent for a record of the FIX client's report stream.
fn report_of_record(record: &Record) -> Report {
    let out = output_of(record);
    assert_eq!(
        out.client, FIX_CLIENT,
        "a report of client {} on the FIX client's subject",
        out.client
    );
    assert_eq!(out.order_id >> 32, u64::from(FIX_CLIENT), "order id {:#x}", out.order_id);
    let exec_type = match out.kind {
        k if k == OutputKind::Accepted as u8 => b'0',
        k if k == OutputKind::PartiallyFilled as u8 || k == OutputKind::Filled as u8 => b'F',
        k if k == OutputKind::Cancelled as u8 => b'4',
        k if k == OutputKind::Replaced as u8 => b'5',
        k if k == OutputKind::Rejected as u8 => b'8',
        other => panic!("market data kind {other} on the report stream"),
    };
    let fill = (exec_type == b'F').then_some((out.qty, out.price));
    let leaves_qty = if exec_type == b'8' { 0 } else { out.leaves_qty };
    Report { exec_type, order: out.order_id as u32, leaves_qty, fill }
}

impl FixClient {
    fn buy(&mut self, cl_ord_id: &str, qty: u32) {
        let (qty, price) = (qty.to_string(), PRICE.to_string());
        let symbol = INSTRUMENT.to_string();
        self.send(
            "D",
            &[
                (tag::CL_ORD_ID, cl_ord_id),
                (tag::SYMBOL, &symbol),
                (tag::SIDE, "1"),
                (tag::TRANSACT_TIME, "20240101-00:00:00.000"),
                (tag::ORDER_QTY, &qty),
                (tag::ORD_TYPE, "2"),
                (tag::PRICE, &price),
            ],
        );
    }

    /// Execution reports of `cl_ord_id` until (and including) the first with OrdStatus
    /// `status` (0: new, 2: filled).
    fn reports_until(&mut self, cl_ord_id: &str, status: &str) -> Vec<Report> {
        let mut reports = Vec::new();
        loop {
            let message = self.recv();
            if get(&message, tag::MSG_TYPE) != "8" {
                continue; // heartbeats, test requests
            }
            assert_eq!(get(&message, tag::CL_ORD_ID), cl_ord_id, "{message:?}");
            let number = |t: u32| {
                let value = get(&message, t);
                value.parse::<i64>().unwrap_or_else(|_| panic!("tag {t}: {message:?}"))
            };
            let exec_type = get(&message, tag::EXEC_TYPE).as_bytes()[0];
            let fill =
                (exec_type == b'F').then(|| (number(tag::LAST_QTY) as u32, number(tag::LAST_PX)));
            reports.push(Report {
                exec_type,
                order: number(tag::ORDER_ID) as u32,
                leaves_qty: number(tag::LEAVES_QTY) as u32,
                fill,
            });
            if get(&message, tag::ORD_STATUS) == status {
                return reports;
            }
            assert!(reports.len() < 8, "{cl_ord_id} never reached OrdStatus {status}: {reports:?}");
        }
    }
}

fn sell(native: &mut NativeClient, token: u32, qty: u32) {
    let order = OrderRequest {
        client: NATIVE_CLIENT,
        token,
        instrument: INSTRUMENT,
        side: 1,
        order_type: 0,
        time_in_force: 0,
        price: PRICE,
        qty,
    };
    native.send(&ClientMsg::NewOrder(order)).expect("sending the sell");
}

// ---------------------------------------------------------------------------------------
// Set-up

/// Credentials (hashed by `exchange hash-secret`) and the serve config in `dir`.
fn write_config(dir: &Path) {
    let mut hashing = Command::new(env!("CARGO_BIN_EXE_leantier"))
        .args(["exchange", "hash-secret"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawning hash-secret");
    writeln!(hashing.stdin.take().unwrap(), "{SECRET}").unwrap();
    let output = hashing.wait_with_output().unwrap();
    assert!(output.status.success(), "hash-secret failed");
    let hash = String::from_utf8(output.stdout).unwrap().trim().to_string();
    let credentials = format!(
        "{FIX_CLIENT} fix {FIX_COMP_ID} {hash}\n{NATIVE_CLIENT} native N{NATIVE_CLIENT} {hash}\n"
    );
    std::fs::write(dir.join("credentials"), credentials).unwrap();
    // One thread per stage, all parked when idle: the test costs no CPU while it waits.
    // Cancel-on-disconnect off: the native client's resting sell must outlive the kill.
    let config = format!(
        r#"credentials = "credentials"
store_dir = "store"
cancel_on_disconnect_ms = 0
instruments = 4
clients = 16

[tier]
layout = "thread-per-stage"
wait = "park"
preprocess_workers = 1
core_shards = 1
senders = 1
outlets = {OUTLETS}
"#
    );
    std::fs::write(dir.join("serve.toml"), config).unwrap();
}

/// The NATS server: a `nats-server` child of this test's own, else `$LEANTIER_NATS_URL`;
/// `None` (with a loud SKIPPED line) with neither.
///
/// A child first, unlike `delivery::server::server_or_env`: `exchange serve --nats` publishes
/// under the default subject prefix and has no option to change it, so two runs of this test
/// on one shared server (two `cargo test`s on one host, both after `scripts/nats-env`) feed
/// each other's edges; that was seen to fail this test.
fn nats() -> Option<(String, Option<delivery::server::NatsServer>)> {
    let child = match delivery::server::NatsServer::start() {
        Ok(server) => return Some((server.url(), Some(server))),
        Err(error) => error,
    };
    match std::env::var(delivery::server::NATS_URL_ENV) {
        Ok(url) if !url.is_empty() => {
            eprintln!("no nats-server child ({child:#}): using the shared server at {url}");
            Some((url, None))
        }
        _ => {
            // Past the test harness's capture (`eprintln!` output of a passing test is not
            // shown): a skip must be seen.
            let _ = writeln!(
                std::io::stderr(),
                "\n*** SKIPPED: no NATS (run scripts/nats-env): {child:#} ***\n\
                 *** serve_fan_out checked nothing ***\n"
            );
            None
        }
    }
}

// ---------------------------------------------------------------------------------------

#[test]
fn a_fix_fill_reaches_the_fix_session_and_the_delivery_edge_in_order_across_a_restart() {
    let Some((url, _nats_child)) = nats() else { return };
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());

    // Run 1. The delivery edge and its consumer are up before the server publishes anything, so
    // the consumer must see both of outlet 1's subjects from sequence 1.
    let mut edge = Edge::start(&url);
    let mut consumer = edge.consumer();
    let server = Server::start(dir.path(), &url);
    let mut fix = FixClient::connect(server.fix, FIX_COMP_ID, 1);
    fix.logon(SECRET);
    let mut native = NativeClient::connect(server.native).unwrap();
    let login = native.login(NATIVE_CLIENT, SECRET, 0, WAIT).unwrap();
    assert!(matches!(login, ServerMsg::LoginAccepted { .. }), "native login: {login:?}");
    // The FIX client rests a buy of 3; the native client sells 5 into it: the FIX order is
    // filled (3 at PRICE) and 2 of the sell rest on the book.
    fix.buy("k1", 3);
    let mut before = fix.reports_until("k1", "0");
    sell(&mut native, 1, 5);
    before.extend(fix.reports_until("k1", "2"));
    assert_eq!(
        before.last().and_then(|r| r.fill),
        Some((3, PRICE)),
        "the FIX session's fill: {before:?}"
    );
    // The same reports, in the same order, on outlet 1's report subject: nothing else is
    // routed there (the native client's go to outlet 0). Market data: a trade of 3 between
    // the two orders.
    let resting_sell = order_id(NATIVE_CLIENT, 1);
    let trade_of = |aggressor: u64, resting: u64, qty: u32| {
        move |frames: &[Frame]| {
            gap_free(frames, Stream::MarketData, 1).iter().map(output_of).any(|o| {
                o.kind == OutputKind::Trade as u8
                    && (o.order_id, o.contra_order_id, o.qty, o.price)
                        == (aggressor, resting, qty, PRICE)
            })
        }
    };
    let trade_1 = trade_of(resting_sell, order_id(FIX_CLIENT, 1), 3);
    consumer.read_until("run 1's reports and trade", |frames| {
        data_count(frames, Stream::Reports) >= before.len() && trade_1(frames)
    });
    let reports: Vec<Report> =
        gap_free(&consumer.frames, Stream::Reports, 1).iter().map(report_of_record).collect();
    assert_eq!(reports, before, "the consumer's reports are the FIX session's, in order");

    // Kill the server (the fill reached the FIX session, so its input is journaled).
    //
    // What happens to the NATS numbering (checked here, 2026-11): the new server's publisher
    // numbers every subject from 1 again (a fresh `NatsPublisher`; nothing of the old run's
    // sequences is stored), so the delivery edge is restarted with the server, as docs/DELIVERY.md
    // asks. The run-1 edge is kept running through run 2 to show why: it counts run 2's
    // heartbeats as malformed ("sequence went back") and drops run 2's records below its old
    // next sequence as duplicates, telling its consumer nothing (no resync frame). Had run 2
    // published more records on a subject than run 1, it would hand run 2's records from its
    // old next sequence on to the consumer as if they continued run 1's stream: a
    // gap-free-looking stream that silently lacks run 2's first records (seen with a run 2
    // of four orders after a run 1 of one: run 2's reports 2..=4 arrived as 2..=4 after run
    // 1's 1, run 2's 1 was lost without a resync).
    server.proc.kill();
    drop(native);
    // Every record of run 1 was published before this (records carry their absolute
    // CLOCK_MONOTONIC publish time); every record of run 2 after it.
    let restarted_ns = delivery::clock::monotonic_ns();
    let stale_edge = edge;
    let mut stale_consumer = consumer;
    let mut edge = Edge::start(&url);
    let mut consumer = edge.consumer();

    // Run 2, over the same store: the FIX session goes on from its sequence numbers, and the
    // recovered book still holds the 2 left of the sell, which a buy of 2 meets.
    let server = Server::start(dir.path(), &url);
    let mut fix = FixClient::connect(server.fix, FIX_COMP_ID, fix.next_seq);
    fix.logon(SECRET);
    fix.buy("k2", 2);
    let after = fix.reports_until("k2", "2");
    assert_eq!(
        after.last().map(|r| (r.order, r.fill)),
        Some((2, Some((2, PRICE)))),
        "k2 (order 2) met the resting sell the killed server had accepted: {after:?}"
    );
    let trade_2 = trade_of(order_id(FIX_CLIENT, 2), resting_sell, 2);
    consumer.read_until("run 2's reports and trade", |frames| {
        data_count(frames, Stream::Reports) >= after.len() && trade_2(frames)
    });

    // Stop everything, then check what each consumer got until its edge closed the
    // connection: nothing beyond the expected, nothing replayed from run 1. (`exchange
    // edge` exits right after `RunningEdge::shutdown` returns, dropping its runtime
    // with the consumer writers' tasks in it: the shutdown goodbye, and whatever was still
    // queued for a consumer, may never be written. Seen under load: the stream ended at a
    // data frame without the goodbye. So no assertion here on how the stream ends.)
    server.proc.kill();
    let counters = edge.stop();
    consumer.read_to_end();
    // From sequence 1 again: the new server's numbering restarted.
    let reports: Vec<Report> =
        gap_free(&consumer.frames, Stream::Reports, 1).iter().map(report_of_record).collect();
    assert_eq!(reports, after, "run 2: the consumer's reports are the FIX session's, in order");
    let trades: Vec<Output> = gap_free(&consumer.frames, Stream::MarketData, 1)
        .iter()
        .map(output_of)
        .filter(|o| o.kind == OutputKind::Trade as u8)
        .collect();
    assert_eq!(trades.len(), 1, "run 2's one trade, none of run 1 replayed: {trades:?}");
    assert!(trade_2(&consumer.frames), "run 2's trade on the market-data subject");
    assert_eq!((counters.gaps, counters.resyncs), (0, 0), "run 2's edge: {counters:?}");
    assert_eq!((counters.duplicates, counters.malformed), (0, 0), "run 2's edge: {counters:?}");
    assert_eq!(counters.consumers, 1, "{counters:?}");
    let data = data_count(&consumer.frames, Stream::Reports)
        + data_count(&consumer.frames, Stream::MarketData);
    assert!(data as u64 <= counters.received, "{data} data frames from {counters:?}");

    // The run-1 edge: the restarted publisher is a new instance (its id is on every batch),
    // so the edge ignored its messages as untrusted, and handed its consumer no record of
    // run 2 (a run-2 record here would have come under run 1's numbering).
    let stale = stale_edge.stop();
    stale_consumer.read_to_end();
    eprintln!("the run-1 edge across the restart: {stale:?}");
    assert!(stale.untrusted > 0, "the new instance's messages are ignored as untrusted: {stale:?}");
    let run_2_records: Vec<(u64, Output)> = stale_consumer
        .frames
        .iter()
        .filter_map(|frame| match frame {
            Frame::Data { seq, record, .. } if record.published_abs_ns() > restarted_ns => {
                Some((*seq, output_of(record)))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        run_2_records,
        [],
        "the run-1 edge handed out run 2's records under run 1's numbering"
    );
}
