//! `mq bench`: send and pop throughput and per-request latency of leantier mq against its peers
//! on the SAME database in the SAME run, with durable commits everywhere.
//!
//! PostgreSQL, each peer at one call per message and at its best (`window` messages per call):
//! - plain SQL: N connections committing `INSERT` / `DELETE … WHERE id = (SELECT … FOR UPDATE
//!   SKIP LOCKED)` one row per transaction, then multi-row statements (`INSERT … SELECT
//!   unnest($1)`, `DELETE … WHERE id IN (SELECT … LIMIT window …)`);
//! - pgmq (when its SQL is given): `pgmq.send` / `pgmq.pop`, then `pgmq.send_batch` /
//!   `pgmq.pop(queue, window)`;
//! - leantier: an in-process node (group commit on) driven by N TCP clients with one request in
//!   flight each (closed loop, like the peers' connections), then `window` pipelined, then
//!   (sends) `window` in flight as `SendBatch` frames of `send_batch` sends (one request frame
//!   and one reply frame per `send_batch` messages, the client library's batched send). Every
//!   reply waits for its batch's durable commit; the node's mean batch is printed.
//! - one client alone: plain SQL's single-row insert beside the node with one request in flight,
//!   so the difference of their medians is what the node adds to one request.
//!
//! Every row carries its per-message budget (CPU per message of the node, PostgreSQL, the load
//! generator and the host; statements and round trips per batch; bytes per message on each
//! wire: [`Budget`], the `mq_budget` module), and `--repeats` runs the whole comparison several
//! times for medians ([`summary_table`], [`median_budgets`]).
//!
//! Latency is per request, from the call (or the submit) to its answer; a batch call's latency
//! counts once per call. Clients register before a phase's clock starts. Pop phases stop at an
//! empty queue, so a peer's pops are capped by what its send phase left.
//!
//! SQLite: baseline = one `INSERT` per transaction; leantier embedded = the store's batch call
//! with `batch` sends per transaction, the next batch built while one commits (the ≥ 200K
//! durable sends/s target), plus the node over TCP.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::report::Table;
use serde::Serialize;
use stats::LatencyHistogram;

use mq::client::Client;
use mq::protocol::{ReadMode, ReadTarget, ReplyBody, Request, SEND_BATCH_MAX, SendRef};
use mq::server::{self, NodeConfig, NodeTotals, RunningNode};
use mq::store::wire::{WireCounters, WireTotals, connect_counted};
use mq::store::{AnyStore, Batch, Store, StoreOp};
use mq::{MqError, Result};

use crate::mq_budget::{CpuPerMessage, CpuSample, NODE_THREAD_NAME, postmaster_of};
use crate::mq_load::LOAD_SECRET;

/// Embedded SQLite target of the issue.
pub const SQLITE_SENDS_PER_S_TARGET: f64 = 100_000.0;

#[derive(Clone, Debug)]
pub struct BenchConfig {
    pub store: String,
    pub clients: usize,
    pub seconds: f64,
    pub content_bytes: usize,
    /// Sends per transaction in the embedded SQLite measurement.
    pub embedded_batch: usize,
    /// Requests each leantier client keeps in flight in the pipelined node measurement, and
    /// messages per call of the peers' batch statements.
    pub window: usize,
    /// Sends per `SendBatch` frame in the node's batched-send measurement (`window` in flight
    /// per client); 1 skips that measurement.
    pub send_batch: usize,
    pub node: NodeConfig,
    /// pgmq's install SQL (`pgmq.sql` from the crates.io `pgmq` crate); PostgreSQL only.
    pub pgmq_sql: Option<std::path::PathBuf>,
    /// Which parts run (all by default).
    pub parts: Vec<BenchPart>,
}

/// The parts of a bench run, each measured in the same run as the others asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BenchPart {
    /// Plain SQL and pgmq (PostgreSQL), the plain insert and the embedded store (SQLite).
    Peers,
    /// The node with N clients, one request in flight each, then `window`.
    Node,
    /// One client alone: plain SQL beside the node (PostgreSQL).
    OneClient,
}

impl BenchPart {
    pub const ALL: [BenchPart; 3] = [BenchPart::Peers, BenchPart::Node, BenchPart::OneClient];

    pub fn name(self) -> &'static str {
        match self {
            BenchPart::Peers => "peers",
            BenchPart::Node => "node",
            BenchPart::OneClient => "one-client",
        }
    }
}

/// The system name of the node's rows with `SendBatch` frames.
pub const NODE_BATCHED: &str = "leantier node, batch frames";

/// Whether a row is the node's (its CPU is measured apart).
fn is_node(system: &str) -> bool {
    system.starts_with("leantier node")
}

/// Queue name the pgmq measurement creates and drops.
const PGMQ_QUEUE: &str = "leantier_bench";

#[derive(Debug, Serialize)]
pub struct BenchRow {
    pub system: String,
    pub operation: String,
    pub clients: usize,
    /// Messages per call (peers) or requests in flight per client (leantier).
    pub per_call_or_in_flight: usize,
    pub ops: u64,
    pub per_s: f64,
    pub latency_us_p50: u64,
    pub latency_us_p99: u64,
    pub latency_us_max: u64,
    /// Mean requests per committed transaction at the node (node rows only).
    pub batch_mean: Option<f64>,
    #[serde(flatten)]
    pub budget: Budget,
}

/// A phase's per-message budget (see the `mq_budget` module): CPU per message, and per batch
/// (per call for the peers, whose every call is one statement and one round trip) what the
/// database was sent.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Budget {
    #[serde(flatten)]
    pub cpu: CpuPerMessage,
    pub statements_per_batch: Option<f64>,
    pub round_trips_per_batch: Option<f64>,
    /// Bytes between clients and the node, both ways, per message (node rows only).
    pub client_bytes_per_message: Option<f64>,
    /// Bytes between the database and its client (the node, or the peer's connections), both
    /// ways, per message; TCP connections only.
    pub database_bytes_per_message: Option<f64>,
}

/// What one measured phase did: operations, each call's latency, its budget.
struct Phase {
    ops: u64,
    latency: LatencyHistogram,
    budget: Budget,
}

impl Phase {
    fn new() -> Phase {
        Phase { ops: 0, latency: LatencyHistogram::new(), budget: Budget::default() }
    }

    fn add(&mut self, other: Phase) {
        self.ops += other.ops;
        self.latency.merge(&other.latency);
    }
}

/// What a phase's budget is computed from, read at its start and at its end.
struct Readings {
    cpu: CpuSample,
    node: Option<NodeTotals>,
    wire: Option<WireTotals>,
}

impl Readings {
    fn take(
        postmaster: Option<u32>,
        node: Option<&RunningNode>,
        wire: Option<WireTotals>,
    ) -> Readings {
        Readings { cpu: CpuSample::read(postmaster), node: node.map(RunningNode::totals), wire }
    }

    /// The budget of `messages` moved between `self` (the start) and `end`. Without node
    /// totals the phase is a peer's, whose every call is one statement and one round trip.
    fn budget(&self, end: &Readings, messages: u64) -> Budget {
        let per_message = |n: u64| (messages > 0).then(|| n as f64 / messages as f64);
        let wire = match (&self.wire, &end.wire) {
            (Some(start), Some(end)) => Some(end.since(start)),
            _ => None,
        };
        let node = match (&self.node, &end.node) {
            (Some(start), Some(end)) => Some(end.since(start)),
            _ => None,
        };
        let per_batch = |f: fn(&WireTotals) -> u64| match (node, wire) {
            (None, _) => Some(1.0),
            (Some(_), Some(w)) if w.batches > 0 => Some(f(&w) as f64 / w.batches as f64),
            _ => None,
        };
        Budget {
            cpu: CpuPerMessage::between(&self.cpu, &end.cpu, messages),
            statements_per_batch: per_batch(|w| w.statements),
            round_trips_per_batch: per_batch(|w| w.round_trips),
            client_bytes_per_message: node
                .and_then(|n| per_message(n.request_bytes + n.reply_bytes)),
            database_bytes_per_message: wire
                .filter(|w| w.bytes_sent > 0)
                .and_then(|w| per_message(w.bytes_sent + w.bytes_received)),
        }
    }
}

/// Who ran a phase, for its row.
struct Shape<'a> {
    system: &'a str,
    clients: usize,
    per_call_or_in_flight: usize,
}

fn row(shape: &Shape<'_>, operation: &str, phase: &Phase, seconds: f64) -> BenchRow {
    let h = &phase.latency;
    BenchRow {
        system: shape.system.into(),
        operation: operation.into(),
        clients: shape.clients,
        per_call_or_in_flight: shape.per_call_or_in_flight,
        ops: phase.ops,
        per_s: phase.ops as f64 / seconds,
        latency_us_p50: h.value_at_percentile_ns(50.0) / 1000,
        latency_us_p99: h.value_at_percentile_ns(99.0) / 1000,
        latency_us_max: h.max_ns() / 1000,
        batch_mean: None,
        budget: phase.budget,
    }
}

/// Runs the comparison; returns rows plus the embedded SQLite rate when measured.
pub async fn run(config: &BenchConfig) -> Result<(Vec<BenchRow>, Option<f64>)> {
    let store = AnyStore::open(&config.store, config.node.db_workers).await?;
    let mut rows = Vec::new();
    let content = vec![b'x'; config.content_bytes];
    let mut embedded = None;
    let runs = |part| config.parts.contains(&part);
    let postmaster = match &store {
        AnyStore::Postgres(_) => local_postmaster(&config.store).await?,
        AnyStore::Sqlite(_) => None,
    };
    match &store {
        _ if !runs(BenchPart::Peers) => {}
        AnyStore::Postgres(_) => {
            rows.extend(postgres_peers(config, postmaster, &content).await?);
        }
        AnyStore::Sqlite(_) => {
            let dir = config.store.trim_start_matches("sqlite:");
            let sends = sqlite_baseline(std::path::Path::new(dir), config.seconds, &content)?;
            let shape = Shape { system: "plain SQL", clients: 1, per_call_or_in_flight: 1 };
            rows.push(row(&shape, "send", &sends, config.seconds));
            let n = embedded_sends(&store, config.embedded_batch, config.seconds, &content).await?;
            embedded = Some(n.ops as f64 / config.seconds);
            let shape = Shape {
                system: "leantier embedded",
                clients: 1,
                per_call_or_in_flight: config.embedded_batch,
            };
            rows.push(row(&shape, "send", &n, config.seconds));
        }
    }
    if runs(BenchPart::Node) {
        rows.extend(node_rows(config, postmaster, &content).await?);
    }
    if let (AnyStore::Postgres(_), true) = (&store, runs(BenchPart::OneClient)) {
        rows.extend(one_client(config, postmaster, &content).await?);
    }
    Ok((rows, embedded))
}

/// The node with N clients: one request in flight, then `window` (sends and pops), then
/// `window` in flight as `SendBatch` frames (sends only) unless `send_batch` is 1.
async fn node_rows(
    config: &BenchConfig,
    postmaster: Option<u32>,
    content: &[u8],
) -> Result<Vec<BenchRow>> {
    let (clients, window) = (config.clients, config.window.max(1));
    let send_batch = config.send_batch.clamp(1, SEND_BATCH_MAX).min(window);
    let mut drives = vec![
        ("leantier node", Drive { clients, window: 1, send_batch: 1, pops: true }),
        ("leantier node", Drive { clients, window, send_batch: 1, pops: true }),
    ];
    if send_batch > 1 {
        drives.push((NODE_BATCHED, Drive { clients, window, send_batch, pops: false }));
    }
    let mut rows = Vec::new();
    for (system, drive) in drives {
        let phases = through_node(config, postmaster, drive, content).await?;
        let shape = Shape { system, clients, per_call_or_in_flight: drive.window };
        for (operation, (phase, batch_mean)) in
            std::iter::once(("send", phases.sends)).chain(phases.pops.map(|p| ("pop", p)))
        {
            let mut r = row(&shape, operation, &phase, config.seconds);
            r.batch_mean = Some(batch_mean);
            rows.push(r);
        }
    }
    Ok(rows)
}

/// How the clients drive the node in one measurement.
#[derive(Clone, Copy, Debug)]
struct Drive {
    clients: usize,
    /// Requests (sends) each client keeps in flight.
    window: usize,
    /// Sends per frame: 1 = one `Send` frame per message, more = `SendBatch` frames.
    send_batch: usize,
    /// Whether a pop phase follows the sends.
    pops: bool,
}

/// The pid of the PostgreSQL server's postmaster when the server runs on this host (its CPU
/// is then measured; see the `mq_budget` module).
async fn local_postmaster(url: &str) -> Result<Option<u32>> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    let backend: i32 = client.query_one("SELECT pg_backend_pid()", &[]).await?.get(0);
    Ok(u32::try_from(backend).ok().and_then(postmaster_of))
}

/// Plain SQL and pgmq at one message per call and at `window` per call.
async fn postgres_peers(
    config: &BenchConfig,
    postmaster: Option<u32>,
    content: &[u8],
) -> Result<Vec<BenchRow>> {
    let (url, clients, seconds, window) =
        (&config.store, config.clients, config.seconds, config.window.max(1));
    let mut rows = Vec::new();
    let (setup, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    if let Some(sql) = &config.pgmq_sql {
        install_pgmq(&setup, sql).await?;
    }
    for per_call in [1, window] {
        setup
            .batch_execute("DROP TABLE IF EXISTS mq_bench_plain; CREATE TABLE mq_bench_plain (id bigserial PRIMARY KEY, content bytea NOT NULL)")
            .await?;
        let (send, pop) = plain_statements(per_call);
        let param = if per_call == 1 {
            Param::Bytes(content.to_vec())
        } else {
            Param::BytesArray(vec![content.to_vec(); per_call])
        };
        let shape = Shape { system: "plain SQL", clients, per_call_or_in_flight: per_call };
        let sends = pg_phase(url, (clients, postmaster), seconds, &send, param).await?;
        rows.push(row(&shape, "send", &sends, seconds));
        let pops = pg_phase(url, (clients, postmaster), seconds, &pop, Param::None).await?;
        rows.push(row(&shape, "pop", &pops, seconds));
        setup.batch_execute("DROP TABLE mq_bench_plain").await?;
        if config.pgmq_sql.is_some() {
            rows.extend(pgmq(&setup, (config, postmaster), per_call, content).await?);
        }
    }
    Ok(rows)
}

/// Plain SQL's send and pop, one row or `per_call` rows per statement.
fn plain_statements(per_call: usize) -> (String, String) {
    if per_call == 1 {
        return (
            "INSERT INTO mq_bench_plain(content) VALUES ($1)".into(),
            "DELETE FROM mq_bench_plain WHERE id = (SELECT id FROM mq_bench_plain ORDER BY id \
             LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING content"
                .into(),
        );
    }
    (
        "INSERT INTO mq_bench_plain(content) SELECT unnest($1::bytea[])".into(),
        format!(
            "DELETE FROM mq_bench_plain WHERE id IN (SELECT id FROM mq_bench_plain ORDER BY id \
             LIMIT {per_call} FOR UPDATE SKIP LOCKED) RETURNING content"
        ),
    )
}

/// Installs pgmq's SQL unless its schema exists.
async fn install_pgmq(setup: &tokio_postgres::Client, sql_path: &std::path::Path) -> Result<()> {
    let schema = "SELECT 1 FROM pg_namespace WHERE nspname = 'pgmq'";
    if setup.query_opt(schema, &[]).await?.is_none() {
        let sql = std::fs::read_to_string(sql_path).map_err(|e| {
            MqError::BadInput(format!("cannot read pgmq SQL {}: {e}", sql_path.display()))
        })?;
        let installed = setup.batch_execute(&sql).await;
        installed
            .map_err(|source| MqError::Postgres { what: "installing pgmq's SQL".into(), source })?;
    }
    Ok(())
}

/// pgmq's `send` / `pop` (one message per autocommit call), or with `per_call` > 1 its batch
/// API: `send_batch` and `pop(queue, per_call)`.
async fn pgmq(
    setup: &tokio_postgres::Client,
    (config, postmaster): (&BenchConfig, Option<u32>),
    per_call: usize,
    content: &[u8],
) -> Result<Vec<BenchRow>> {
    let (url, clients, seconds) = (&config.store, config.clients, config.seconds);
    setup.execute("SELECT pgmq.create($1)", &[&PGMQ_QUEUE]).await?;
    let message = format!("{{\"c\": \"{}\"}}", String::from_utf8_lossy(content));
    let (send, param) = if per_call == 1 {
        ("SELECT pgmq.send('leantier_bench', $1::text::jsonb)".to_owned(), Param::Text(message))
    } else {
        (
            "SELECT pgmq.send_batch('leantier_bench', $1::text[]::jsonb[])".to_owned(),
            Param::TextArray(vec![message; per_call]),
        )
    };
    let pop = format!("SELECT msg_id FROM pgmq.pop('leantier_bench', {per_call})");
    let shape = Shape { system: "pgmq", clients, per_call_or_in_flight: per_call };
    let sends = pg_phase(url, (clients, postmaster), seconds, &send, param).await?;
    let pops = pg_phase(url, (clients, postmaster), seconds, &pop, Param::None).await?;
    setup.execute("SELECT pgmq.drop_queue($1)", &[&PGMQ_QUEUE]).await?;
    Ok(vec![row(&shape, "send", &sends, seconds), row(&shape, "pop", &pops, seconds)])
}

/// The one parameter of a measured statement.
#[derive(Clone)]
enum Param {
    None,
    Bytes(Vec<u8>),
    BytesArray(Vec<Vec<u8>>),
    Text(String),
    TextArray(Vec<String>),
}

impl Param {
    fn values(&self) -> Vec<&(dyn tokio_postgres::types::ToSql + Sync)> {
        match self {
            Param::None => vec![],
            Param::Bytes(b) => vec![b],
            Param::BytesArray(b) => vec![b],
            Param::Text(t) => vec![t],
            Param::TextArray(t) => vec![t],
        }
    }
}

/// N connections running `sql` in autocommit for `seconds`; counts rows touched or returned.
/// A connection stops early when a call touches nothing (a pop phase emptied the queue). The
/// connections' bytes are counted like the node's (`connect_counted`).
async fn pg_phase(
    url: &str,
    (clients, postmaster): (usize, Option<u32>),
    seconds: f64,
    sql: &str,
    param: Param,
) -> Result<Phase> {
    let pg: tokio_postgres::Config = url.parse()?;
    let wire = std::sync::Arc::new(WireCounters::default());
    let mut connections = Vec::with_capacity(clients);
    for _ in 0..clients {
        let (client, _connection) = connect_counted(&pg, std::sync::Arc::clone(&wire)).await?;
        let statement = client.prepare(sql).await?;
        connections.push((client, statement));
    }
    let start = Readings::take(postmaster, None, Some(wire.totals()));
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let mut tasks = tokio::task::JoinSet::new();
    for (client, statement) in connections {
        let param = param.clone();
        tasks.spawn(async move {
            let mut phase = Phase::new();
            let values = param.values();
            while Instant::now() < end {
                let start = Instant::now();
                let touched = client.execute(&statement, &values).await?;
                phase.latency.record_duration(start.elapsed());
                phase.ops += touched;
                if touched == 0 {
                    break;
                }
            }
            Ok::<_, MqError>(phase)
        });
    }
    let mut total = Phase::new();
    while let Some(phase) = tasks.join_next().await {
        total.add(phase??);
    }
    total.budget = start.budget(&Readings::take(postmaster, None, Some(wire.totals())), total.ops);
    Ok(total)
}

/// One client alone: plain SQL's single-row insert, then the node with one request in flight.
async fn one_client(
    config: &BenchConfig,
    postmaster: Option<u32>,
    content: &[u8],
) -> Result<Vec<BenchRow>> {
    let (url, seconds) = (&config.store, config.seconds);
    let (setup, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    setup
        .batch_execute("DROP TABLE IF EXISTS mq_bench_plain; CREATE TABLE mq_bench_plain (id bigserial PRIMARY KEY, content bytea NOT NULL)")
        .await?;
    let (send, pop) = plain_statements(1);
    let plain =
        pg_phase(url, (1, postmaster), seconds, &send, Param::Bytes(content.to_vec())).await?;
    // Pops of what the sends left, one at a time, as the node's pops below.
    let plain_pops = pg_phase(url, (1, postmaster), seconds, &pop, Param::None).await?;
    setup.batch_execute("DROP TABLE mq_bench_plain").await?;
    let alone = Drive { clients: 1, window: 1, send_batch: 1, pops: true };
    let node = through_node(config, postmaster, alone, content).await?;
    let plain_shape = Shape { system: "plain SQL", clients: 1, per_call_or_in_flight: 1 };
    let node_shape = Shape { system: "leantier node", clients: 1, per_call_or_in_flight: 1 };
    let mut node_sends = row(&node_shape, "send", &node.sends.0, seconds);
    node_sends.batch_mean = Some(node.sends.1);
    let mut rows = vec![row(&plain_shape, "send", &plain, seconds), node_sends];
    rows.push(row(&plain_shape, "pop", &plain_pops, seconds));
    if let Some((pops, batch_mean)) = &node.pops {
        let mut node_pops = row(&node_shape, "pop", pops, seconds);
        node_pops.batch_mean = Some(*batch_mean);
        rows.push(node_pops);
    }
    Ok(rows)
}

/// The headers of the ratio columns: against each peer at one message per call and at its
/// best (the higher of its one-per-call and batch rows), same operation and clients.
const RATIO_HEADERS: [&str; 4] = ["× plain 1/call", "× plain best", "× pgmq 1/call", "× pgmq best"];

/// `r`'s rate over each peer's rate in the same run (`rows`); see [`RATIO_HEADERS`].
fn ratios(rows: &[BenchRow], r: &BenchRow) -> [Option<f64>; 4] {
    let best = |system: &str, one_per_call: bool| {
        rows.iter()
            .filter(|b| b.operation == r.operation && b.system == system && b.clients == r.clients)
            .filter(|b| !one_per_call || b.per_call_or_in_flight == 1)
            .map(|b| b.per_s.max(1e-9))
            .reduce(f64::max)
            .map(|base| r.per_s / base)
    };
    [best("plain SQL", true), best("plain SQL", false), best("pgmq", true), best("pgmq", false)]
}

fn two_decimals(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.2}"))
}

/// The comparison table of one run: rates, latencies and ratios against each peer at one
/// message per call and at its best, same operation and clients.
pub fn table(rows: &[BenchRow]) -> Table {
    let mut headers = vec!["system", "op", "clients", "per call / in flight", "ops/s"];
    headers.extend(["p50 µs", "p99 µs", "max µs"]);
    headers.extend(RATIO_HEADERS);
    headers.push("mean batch");
    let mut t = Table::new(headers).with_title("mq bench (same run, same database)");
    for r in rows {
        let mut cells = vec![
            r.system.clone(),
            r.operation.clone(),
            r.clients.to_string(),
            r.per_call_or_in_flight.to_string(),
            format!("{:.0}", r.per_s),
            r.latency_us_p50.to_string(),
            r.latency_us_p99.to_string(),
            r.latency_us_max.to_string(),
        ];
        cells.extend(ratios(rows, r).map(two_decimals));
        cells.push(r.batch_mean.map_or_else(|| "-".into(), |b| format!("{b:.1}")));
        t.row(cells);
    }
    t
}

/// The median of `values` (the mean of the middle two for an even count); `None` if empty.
fn median(mut values: Vec<f64>) -> Option<f64> {
    values.retain(|v| v.is_finite());
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(values[n / 2]),
        _ => Some((values[n / 2 - 1] + values[n / 2]) / 2.0),
    }
}

/// Several runs of the same bench (each run's rows in the same order): per row the median
/// rate with its range, the median p50 and p99, and the median of each run's own ratios (each
/// ratio is taken within one run, where the contenders shared the machine's state).
pub fn summary_table(runs: &[Vec<BenchRow>]) -> Table {
    let mut headers = vec!["system", "op", "clients", "per call / in flight"];
    headers.extend(["ops/s (median)", "ops/s (min–max)", "p50 µs", "p99 µs"]);
    headers.extend(RATIO_HEADERS);
    headers.push("mean batch");
    let title =
        format!("mq bench, medians of {} runs (ratios per run, then the median)", runs.len());
    let mut t = Table::new(headers).with_title(title);
    let Some(first) = runs.first() else { return t };
    for (i, r) in first.iter().enumerate() {
        let same: Vec<(&Vec<BenchRow>, &BenchRow)> =
            runs.iter().filter_map(|run| run.get(i).map(|row| (run, row))).collect();
        let of =
            |f: &dyn Fn(&BenchRow) -> f64| median(same.iter().map(|(_, row)| f(row)).collect());
        let rates: Vec<f64> = same.iter().map(|(_, row)| row.per_s).collect();
        let (low, high) = rates.iter().fold((f64::MAX, 0.0f64), |(l, h), &v| (l.min(v), h.max(v)));
        let mut cells = vec![
            r.system.clone(),
            r.operation.clone(),
            r.clients.to_string(),
            r.per_call_or_in_flight.to_string(),
            format!("{:.0}", of(&|row| row.per_s).unwrap_or(0.0)),
            format!("{low:.0}–{high:.0}"),
            format!("{:.0}", of(&|row| row.latency_us_p50 as f64).unwrap_or(0.0)),
            format!("{:.0}", of(&|row| row.latency_us_p99 as f64).unwrap_or(0.0)),
        ];
        for k in 0..RATIO_HEADERS.len() {
            let per_run = same.iter().filter_map(|(run, row)| ratios(run, row)[k]).collect();
            cells.push(two_decimals(median(per_run)));
        }
        let batches = same.iter().filter_map(|(_, row)| row.batch_mean).collect::<Vec<_>>();
        cells.push(median(batches).map_or_else(|| "-".into(), |b| format!("{b:.1}")));
        t.row(cells);
    }
    t
}

/// Each row's budget as the median over runs, field by field (see [`budget_table`]).
pub fn median_budgets(runs: &[Vec<BenchRow>]) -> Vec<BenchRow> {
    let Some(first) = runs.first() else { return Vec::new() };
    let mut rows = Vec::with_capacity(first.len());
    for (i, r) in first.iter().enumerate() {
        let same: Vec<&BenchRow> = runs.iter().filter_map(|run| run.get(i)).collect();
        let of = |f: fn(&BenchRow) -> Option<f64>| {
            median(same.iter().filter_map(|row| f(row)).collect())
        };
        let cpu = CpuPerMessage {
            node_us: of(|row| row.budget.cpu.node_us),
            postgres_us: of(|row| row.budget.cpu.postgres_us),
            load_generator_us: of(|row| row.budget.cpu.load_generator_us),
            host_us: of(|row| row.budget.cpu.host_us),
        };
        let budget = Budget {
            cpu,
            statements_per_batch: of(|row| row.budget.statements_per_batch),
            round_trips_per_batch: of(|row| row.budget.round_trips_per_batch),
            client_bytes_per_message: of(|row| row.budget.client_bytes_per_message),
            database_bytes_per_message: of(|row| row.budget.database_bytes_per_message),
        };
        rows.push(BenchRow {
            system: r.system.clone(),
            operation: r.operation.clone(),
            clients: r.clients,
            per_call_or_in_flight: r.per_call_or_in_flight,
            ops: of(|row| Some(row.ops as f64)).unwrap_or(0.0) as u64,
            per_s: of(|row| Some(row.per_s)).unwrap_or(0.0),
            latency_us_p50: of(|row| Some(row.latency_us_p50 as f64)).unwrap_or(0.0) as u64,
            latency_us_p99: of(|row| Some(row.latency_us_p99 as f64)).unwrap_or(0.0) as u64,
            latency_us_max: of(|row| Some(row.latency_us_max as f64)).unwrap_or(0.0) as u64,
            batch_mean: of(|row| row.batch_mean),
            budget,
        });
    }
    rows
}

/// The per-message budget of every row (see [`Budget`]): where each message's CPU went and
/// what crossed the wires, so the node's rows read line by line against the peers'.
pub fn budget_table(rows: &[BenchRow]) -> Table {
    let mut t = Table::new([
        "system",
        "op",
        "clients",
        "per call / in flight",
        "ops/s",
        "node CPU µs/msg",
        "PostgreSQL CPU µs/msg",
        "load generator CPU µs/msg",
        "host CPU µs/msg",
        "msgs/batch",
        "statements/batch",
        "round trips/batch",
        "client⇄node B/msg",
        "⇄database B/msg",
    ])
    .with_title("per-message budget (same run; per call for the peers)");
    let cell = |v: Option<f64>, decimals: usize| {
        v.map_or_else(|| "-".into(), |v| format!("{v:.decimals$}"))
    };
    for r in rows {
        let b = &r.budget;
        let batch =
            r.batch_mean.or((!is_node(&r.system)).then_some(r.per_call_or_in_flight as f64));
        t.row([
            r.system.clone(),
            r.operation.clone(),
            r.clients.to_string(),
            r.per_call_or_in_flight.to_string(),
            format!("{:.0}", r.per_s),
            cell(b.cpu.node_us.filter(|_| is_node(&r.system)), 1),
            cell(b.cpu.postgres_us, 1),
            cell(b.cpu.load_generator_us, 1),
            cell(b.cpu.host_us, 1),
            cell(batch, 1),
            cell(b.statements_per_batch, 2),
            cell(b.round_trips_per_batch, 2),
            cell(b.client_bytes_per_message, 0),
            cell(b.database_bytes_per_message, 0),
        ]);
    }
    t
}

/// The host's load averages (1, 5, 15 minutes), for the report; `None` off Linux.
pub fn load_average() -> Option<String> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    Some(text.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
}

fn sqlite_baseline(dir: &std::path::Path, seconds: f64, content: &[u8]) -> Result<Phase> {
    let conn = rusqlite::Connection::open(dir.join(mq::store::SQLITE_DB_FILE))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.execute_batch("DROP TABLE IF EXISTS bench_plain; CREATE TABLE bench_plain (id INTEGER PRIMARY KEY, content BLOB NOT NULL)")?;
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let mut phase = Phase::new();
    let mut insert = conn.prepare("INSERT INTO bench_plain(content) VALUES (?1)")?;
    let readings = Readings::take(None, None, None);
    while Instant::now() < end {
        let start = Instant::now();
        phase.ops += insert.execute([content])? as u64;
        phase.latency.record_duration(start.elapsed());
    }
    phase.budget = embedded_budget(&readings, phase.ops);
    drop(insert);
    conn.execute_batch("DROP TABLE bench_plain")?;
    Ok(phase)
}

/// The store's batch call as an embedding program drives it: the next batch's sends are built
/// while the current one commits (two batches in turn), so the building overlaps the commit as
/// a node's decoding overlaps its workers'. A batch's latency runs from the start of its
/// building to its commit.
async fn embedded_sends(
    store: &AnyStore,
    batch_size: usize,
    seconds: f64,
    content: &[u8],
) -> Result<Phase> {
    let queue = format!("bench-embedded-{}", mq::util::now_us());
    let mut committing = Batch::default();
    committing.ops.push(embedded_op(Request::CreateQueue { name: queue.clone() }));
    store.execute_batch(&mut committing).await?;
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let mut phase = Phase::new();
    let readings = Readings::take(None, None, None);
    let mut building = Batch::default();
    let mut built_at = Instant::now();
    fill_sends(&mut committing, batch_size, &queue, content);
    while Instant::now() < end {
        let next_built_at = Instant::now();
        let (committed, ()) = tokio::join!(store.execute_batch(&mut committing), async {
            fill_sends(&mut building, batch_size, &queue, content)
        });
        committed?;
        phase.latency.record_duration(built_at.elapsed());
        phase.ops += committing.results.iter().filter(|r| r.is_ok()).count() as u64;
        std::mem::swap(&mut committing, &mut building);
        built_at = next_built_at;
    }
    phase.budget = embedded_budget(&readings, phase.ops);
    committing.ops.clear();
    committing.ops.push(embedded_op(Request::DeleteQueue { name: queue, purge: true }));
    store.execute_batch(&mut committing).await?;
    Ok(phase)
}

fn embedded_op(request: Request) -> StoreOp {
    StoreOp { client_id: Some(1), now_us: mq::util::now_us(), request }
}

/// Replaces `batch`'s requests with `count` sends of `content` to `queue`.
fn fill_sends(batch: &mut Batch, count: usize, queue: &str, content: &[u8]) {
    batch.ops.clear();
    for _ in 0..count {
        let send =
            Request::Send { queue: queue.to_owned(), receiver: None, content: content.to_vec() };
        batch.ops.push(embedded_op(send));
    }
}

/// The budget of an in-process SQLite phase since `start`: its CPU (all of it this process's,
/// shown as the load generator's) and the host's; SQLite has no statements on a wire.
fn embedded_budget(start: &Readings, messages: u64) -> Budget {
    let cpu = start.budget(&Readings::take(None, None, None), messages).cpu;
    Budget { cpu, ..Budget::default() }
}

/// One node measurement per operation: the phase and the node's mean requests per transaction.
struct NodePhases {
    sends: (Phase, f64),
    /// `None` when the drive had no pop phase.
    pops: Option<(Phase, f64)>,
}

/// The node on its own runtime (threads named [`NODE_THREAD_NAME`], so its CPU is told apart
/// from the load generator's) with its own store, as a separate process would have, driven by
/// TCP clients as `drive` says: sends, then pops.
async fn through_node(
    config: &BenchConfig,
    postmaster: Option<u32>,
    drive: Drive,
    content: &[u8],
) -> Result<NodePhases> {
    if config.store.starts_with("postgres") {
        vacuum_messages(&config.store).await?;
    }
    let runtime = server::node_runtime(&config.node)
        .thread_name(NODE_THREAD_NAME)
        .build()
        .map_err(|source| MqError::Io { what: "starting the node's runtime".into(), source })?;
    let (spec, node_config) = (config.store.clone(), config.node.clone());
    let (node, store) = runtime
        .spawn(async move {
            let (workers, table) = (node_config.db_workers, node_config.message_table);
            let store = AnyStore::open_with(&spec, workers, table).await?;
            let node = server::start("127.0.0.1:0", store.clone(), node_config).await?;
            Ok::<_, MqError>((node, store))
        })
        .await??;
    let measured = node_phases(&node, &store, config, (postmaster, drive), content).await;
    let _ = runtime.spawn(node.shutdown()).await;
    runtime.shutdown_background();
    measured
}

/// Registers the clients, then measures the send phase and the pop phase with their budgets.
async fn node_phases(
    node: &RunningNode,
    store: &AnyStore,
    config: &BenchConfig,
    (postmaster, drive): (Option<u32>, Drive),
    content: &[u8],
) -> Result<NodePhases> {
    let addr = node.addr.to_string();
    let queue = format!("bench-node-{}", mq::util::now_us());
    let mut admin = Client::connect(&addr).await?;
    admin.register(&format!("{queue}-admin"), LOAD_SECRET).await?;
    admin.create_queue(&queue).await?;
    let mut users = Vec::with_capacity(drive.clients);
    for i in 0..drive.clients {
        let mut client = Client::connect(&addr).await?;
        client.register(&format!("{queue}-{i}"), LOAD_SECRET).await?;
        users.push(client);
    }
    let readings = || Readings::take(postmaster, Some(node), store.wire_totals());
    let start = readings();
    let (mut sends, users) =
        node_phase(users, &queue, config.seconds, drive, Some(content)).await?;
    let middle = readings();
    let mut pops = match drive.pops {
        true => Some(node_phase(users, &queue, config.seconds, drive, None).await?.0),
        false => None,
    };
    let end = readings();
    admin.delete_queue(&queue, true).await?;
    sends.budget = start.budget(&middle, sends.ops);
    if let Some(pops) = &mut pops {
        pops.budget = middle.budget(&end, pops.ops);
    }
    let batch_mean = |committed: u64, from: &Readings, to: &Readings| {
        let batches = match (from.node, to.node) {
            (Some(from), Some(to)) => to.since(&from).batches_committed,
            _ => 0,
        };
        committed as f64 / batches.max(1) as f64
    };
    let sent = sends.ops;
    Ok(NodePhases {
        sends: (sends, batch_mean(sent, &start, &middle)),
        pops: pops.map(|pops| {
            let popped = pops.ops;
            (pops, batch_mean(popped, &middle, &end))
        }),
    })
}

/// Starts the node on a vacuumed message table, as the peers start on fresh tables: the purge
/// that ends a measurement leaves every message it deleted as a dead tuple at the head of the
/// indexes, and the next measurement's pops would walk them until autovacuum runs (pops fell
/// to under 1K/s right after a previous run, 72K/s after a vacuum, measured).
async fn vacuum_messages(url: &str) -> Result<()> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    let vacuumed = client.batch_execute("VACUUM ANALYZE mq_messages").await;
    vacuumed.map_err(|source| MqError::Postgres { what: "vacuuming mq_messages".into(), source })
}

/// Each registered client keeps `drive.window` requests in flight until the phase ends (sends
/// when `content` is given, else pops until the queue is empty). Returns the phase and the
/// clients.
async fn node_phase(
    users: Vec<Client>,
    queue: &str,
    seconds: f64,
    drive: Drive,
    content: Option<&[u8]>,
) -> Result<(Phase, Vec<Client>)> {
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let mut tasks = tokio::task::JoinSet::new();
    for client in users {
        let (queue, content) = (queue.to_owned(), content.map(<[u8]>::to_vec));
        tasks.spawn(client_phase(client, queue, content, drive, end));
    }
    let (mut total, mut users) = (Phase::new(), Vec::new());
    while let Some(done) = tasks.join_next().await {
        let (phase, client) = done??;
        total.add(phase);
        users.push(client);
    }
    Ok((total, users))
}

/// One client's part of a node phase; replies come in request order, so each frame's latency
/// runs from its submit time at the front of `submitted`. With `drive.send_batch` > 1 sends
/// go out as `SendBatch` frames, each submitted once that many places are free in the window.
async fn client_phase(
    mut client: Client,
    queue: String,
    content: Option<Vec<u8>>,
    drive: Drive,
    end: Instant,
) -> Result<(Phase, Client)> {
    let request = || match &content {
        Some(c) => Request::Send { queue: queue.clone(), receiver: None, content: c.clone() },
        None => Request::Read { target: ReadTarget::Queue(queue.clone()), mode: ReadMode::Pop },
    };
    let batched = content
        .as_deref()
        .filter(|_| drive.send_batch > 1)
        .map(|content| vec![SendRef { queue: &queue, receiver: None, content }; drive.send_batch]);
    let mut phase = Phase::new();
    // Each frame in flight: when it was submitted, and how many requests it holds.
    let mut submitted: VecDeque<(Instant, usize)> = VecDeque::with_capacity(drive.window);
    let (mut in_flight, mut drained) = (0, false);
    loop {
        while !drained && Instant::now() < end {
            let frame = batched.as_ref().map_or(1, Vec::len);
            if in_flight + frame > drive.window {
                break;
            }
            submitted.push_back((Instant::now(), frame));
            match &batched {
                Some(sends) => client.submit_sends(sends).await?,
                None => client.submit(request()).await?,
            };
            in_flight += frame;
        }
        let Some((start, frame)) = submitted.pop_front() else { return Ok((phase, client)) };
        let (_, result) = client.receive().await?;
        phase.latency.record_duration(start.elapsed());
        in_flight -= frame;
        match result {
            Ok(ReplyBody::SentBatch(outcomes)) => {
                for outcome in outcomes {
                    outcome.map_err(mq::client::ClientError::Refused)?;
                    phase.ops += 1;
                }
            }
            Ok(_) => phase.ops += 1,
            Err(e) if e.reason == mq::protocol::Reason::NoMessage => drained = true,
            Err(e) => return Err(mq::client::ClientError::Refused(e).into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bench_row(system: &str, per_call: usize, per_s: f64, p50: u64) -> BenchRow {
        BenchRow {
            system: system.into(),
            operation: "send".into(),
            clients: 32,
            per_call_or_in_flight: per_call,
            ops: per_s as u64,
            per_s,
            latency_us_p50: p50,
            latency_us_p99: p50 * 2,
            latency_us_max: p50 * 3,
            batch_mean: None,
            budget: Budget::default(),
        }
    }

    #[test]
    fn medians_take_the_middle_value_or_the_mean_of_the_middle_two() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(vec![f64::NAN, 5.0]), Some(5.0));
        assert_eq!(median(vec![]), None);
    }

    #[test]
    fn the_summary_takes_each_ratio_within_its_run_then_the_median() {
        // The node is 0.5× plain in every run although both rates swing between runs.
        let run = |scale: f64| {
            vec![
                bench_row("plain SQL", 64, 100.0 * scale, 10),
                bench_row("leantier node", 64, 50.0 * scale, 20),
            ]
        };
        let runs = vec![run(1.0), run(3.0), run(2.0)];
        let table = summary_table(&runs);
        let node = table.rows().iter().find(|r| r[0] == "leantier node").expect("the node's row");
        assert_eq!(node[4], "100", "median rate: {node:?}");
        assert_eq!(node[5], "50–150", "range: {node:?}");
        assert_eq!(node[9], "0.50", "× plain best, per run: {node:?}");
        let budgets = median_budgets(&runs);
        assert_eq!(budgets[1].per_s, 100.0);
        assert_eq!(budgets[1].latency_us_p50, 20);
    }
}
