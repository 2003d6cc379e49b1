//! `mq bench`: send and pop throughput of leantier mq against a plain one-row-per-transaction
//! baseline on the SAME database in the SAME run, with durable commits on both sides.
//!
//! - PostgreSQL: baseline = N connections each committing `INSERT` (send) and
//!   `DELETE … WHERE id = (SELECT … FOR UPDATE SKIP LOCKED)` (pop) one row per transaction;
//!   leantier = an in-process node (group commit on) driven by N TCP clients, measured twice:
//!   with one request in flight per client (closed loop, like the baselines), then with
//!   `window` requests pipelined per client (how brokers are driven for throughput). Every
//!   reply still waits for its batch's durable commit. The node's mean batch size is printed.
//! - SQLite: baseline = one `INSERT` per transaction; leantier embedded = the store's batch call
//!   with `batch` sends per transaction (the ≥ 100K durable sends/s target), plus the node over
//!   TCP.

use std::time::{Duration, Instant};

use anyhow::Context;
use lab::report::Table;
use serde::Serialize;

use crate::client::Client;
use crate::load::LOAD_SECRET;
use crate::protocol::{NodeStats, ReadMode, ReadTarget, Request};
use crate::server::{self, NodeConfig};
use crate::store::{AnyStore, Batch, Store, StoreOp};

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
    /// Requests each client keeps in flight in the pipelined node measurement.
    pub window: usize,
    pub node: NodeConfig,
    /// pgmq's install SQL (`pgmq.sql` from the crates.io `pgmq` crate); PostgreSQL only.
    pub pgmq_sql: Option<std::path::PathBuf>,
}

/// Queue name the pgmq measurement creates and drops.
const PGMQ_QUEUE: &str = "leantier_bench";

#[derive(Debug, Serialize)]
pub struct BenchRow {
    pub system: String,
    pub operation: String,
    pub ops: u64,
    pub per_s: f64,
    /// Mean requests per committed transaction at the node (node rows only).
    pub batch_mean: Option<f64>,
}

/// Runs the comparison; returns rows plus the embedded SQLite rate when measured.
pub async fn run(config: &BenchConfig) -> anyhow::Result<(Vec<BenchRow>, Option<f64>)> {
    let store = AnyStore::open(&config.store, config.node.db_workers).await?;
    let mut rows = Vec::new();
    let content = vec![b'x'; config.content_bytes];
    let mut embedded = None;
    match &store {
        AnyStore::Postgres(_) => {
            let (sends, pops) =
                postgres_baseline(&config.store, config.clients, config.seconds, &content).await?;
            rows.push(row("plain SQL (1 row/txn)", "send", sends, config.seconds));
            rows.push(row("plain SQL (1 row/txn)", "pop", pops, config.seconds));
            if let Some(sql) = &config.pgmq_sql {
                let (sends, pops) =
                    pgmq(&config.store, sql, config.clients, config.seconds, &content).await?;
                rows.push(row("pgmq (send / pop)", "send", sends, config.seconds));
                rows.push(row("pgmq (send / pop)", "pop", pops, config.seconds));
            }
        }
        AnyStore::Sqlite(_) => {
            let dir = config.store.trim_start_matches("sqlite:");
            let sends = sqlite_baseline(std::path::Path::new(dir), config.seconds, &content)?;
            rows.push(row("plain SQL (1 row/txn)", "send", sends, config.seconds));
            let n = embedded_sends(&store, config.embedded_batch, config.seconds, &content).await?;
            embedded = Some(n as f64 / config.seconds);
            rows.push(row(
                &format!("leantier embedded ({} /txn)", config.embedded_batch),
                "send",
                n,
                config.seconds,
            ));
        }
    }
    for window in [1, config.window.max(1)] {
        let system = format!("leantier node ({} clients × {window} in flight)", config.clients);
        let phases = through_node(store.clone(), config, window, &content).await?;
        for (operation, phase) in [("send", phases.sends), ("pop", phases.pops)] {
            let mut r = row(&system, operation, phase.ops, config.seconds);
            r.batch_mean = Some(phase.batch_mean);
            rows.push(r);
        }
    }
    Ok((rows, embedded))
}

fn row(system: &str, operation: &str, ops: u64, seconds: f64) -> BenchRow {
    BenchRow {
        system: system.into(),
        operation: operation.into(),
        ops,
        per_s: ops as f64 / seconds,
        batch_mean: None,
    }
}

/// The comparison table with ratios against the baseline and (when measured) pgmq, for the
/// same operation.
pub fn table(rows: &[BenchRow]) -> Table {
    let mut t = Table::new(["system", "op", "ops", "ops/s", "× baseline", "× pgmq", "mean batch"])
        .with_title("mq bench (same run)");
    let rate_of = |operation: &str, system_prefix: &str| {
        rows.iter()
            .find(|b| b.operation == operation && b.system.starts_with(system_prefix))
            .map(|b| b.per_s.max(1e-9))
    };
    for r in rows {
        let ratio =
            |base: Option<f64>| base.map_or_else(|| "-".into(), |b| format!("{:.2}", r.per_s / b));
        t.row([
            r.system.clone(),
            r.operation.clone(),
            r.ops.to_string(),
            format!("{:.0}", r.per_s),
            ratio(rate_of(&r.operation, "plain")),
            ratio(rate_of(&r.operation, "pgmq")),
            r.batch_mean.map_or_else(|| "-".into(), |b| format!("{b:.1}")),
        ]);
    }
    t
}

async fn postgres_baseline(
    url: &str,
    clients: usize,
    seconds: f64,
    content: &[u8],
) -> anyhow::Result<(u64, u64)> {
    let (setup, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    setup
        .batch_execute("DROP TABLE IF EXISTS mq_bench_plain; CREATE TABLE mq_bench_plain (id bigserial PRIMARY KEY, content bytea NOT NULL)")
        .await?;
    let insert = "INSERT INTO mq_bench_plain(content) VALUES ($1)";
    let delete = "DELETE FROM mq_bench_plain WHERE id = (SELECT id FROM mq_bench_plain ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING content";
    let sends = pg_phase(url, clients, seconds, insert, Param::Bytes(content.to_vec())).await?;
    let pops = pg_phase(url, clients, seconds, delete, Param::None).await?;
    setup.batch_execute("DROP TABLE mq_bench_plain").await?;
    Ok((sends, pops))
}

/// Installs pgmq's SQL (unless its schema exists) and measures `pgmq.send` / `pgmq.pop`, one
/// message per autocommit call, like the plain baseline.
async fn pgmq(
    url: &str,
    sql_path: &std::path::Path,
    clients: usize,
    seconds: f64,
    content: &[u8],
) -> anyhow::Result<(u64, u64)> {
    let (setup, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    let schema = "SELECT 1 FROM pg_namespace WHERE nspname = 'pgmq'";
    if setup.query_opt(schema, &[]).await?.is_none() {
        let sql = std::fs::read_to_string(sql_path).map_err(|e| {
            crate::MqError::BadInput(format!("cannot read pgmq SQL {}: {e}", sql_path.display()))
        })?;
        setup.batch_execute(&sql).await.context("installing pgmq's SQL")?;
    }
    setup.execute("SELECT pgmq.create($1)", &[&PGMQ_QUEUE]).await?;
    let message = format!("{{\"c\": \"{}\"}}", String::from_utf8_lossy(content));
    let send = "SELECT pgmq.send('leantier_bench', $1::text::jsonb)";
    let pop = "SELECT msg_id FROM pgmq.pop('leantier_bench')";
    let sends = pg_phase(url, clients, seconds, send, Param::Text(message)).await?;
    let pops = pg_phase(url, clients, seconds, pop, Param::None).await?;
    setup.execute("SELECT pgmq.drop_queue($1)", &[&PGMQ_QUEUE]).await?;
    Ok((sends, pops))
}

/// The one parameter of a measured statement.
#[derive(Clone)]
enum Param {
    None,
    Bytes(Vec<u8>),
    Text(String),
}

/// N connections running `sql` in autocommit for `seconds`; counts rows touched or returned.
async fn pg_phase(
    url: &str,
    clients: usize,
    seconds: f64,
    sql: &'static str,
    param: Param,
) -> anyhow::Result<u64> {
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..clients {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
        tokio::spawn(connection);
        let param = param.clone();
        tasks.spawn(async move {
            let statement = client.prepare(sql).await?;
            let mut done = 0u64;
            while Instant::now() < end {
                let touched = match &param {
                    Param::None => client.execute(&statement, &[]).await?,
                    Param::Bytes(b) => client.execute(&statement, &[b]).await?,
                    Param::Text(t) => client.execute(&statement, &[t]).await?,
                };
                done += touched;
            }
            anyhow::Ok(done)
        });
    }
    let mut total = 0;
    while let Some(n) = tasks.join_next().await {
        total += n??;
    }
    Ok(total)
}

fn sqlite_baseline(dir: &std::path::Path, seconds: f64, content: &[u8]) -> anyhow::Result<u64> {
    let conn = rusqlite::Connection::open(dir.join(crate::store::SQLITE_DB_FILE))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.execute_batch("DROP TABLE IF EXISTS bench_plain; CREATE TABLE bench_plain (id INTEGER PRIMARY KEY, content BLOB NOT NULL)")?;
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let mut done = 0;
    let mut insert = conn.prepare("INSERT INTO bench_plain(content) VALUES (?1)")?;
    while Instant::now() < end {
        done += insert.execute([content])? as u64;
    }
    drop(insert);
    conn.execute_batch("DROP TABLE bench_plain")?;
    Ok(done)
}

async fn embedded_sends(
    store: &AnyStore,
    batch_size: usize,
    seconds: f64,
    content: &[u8],
) -> anyhow::Result<u64> {
    let queue = format!("bench-embedded-{}", crate::util::now_us());
    let mut batch = Batch::default();
    let op = |request| StoreOp { client_id: Some(1), now_us: crate::util::now_us(), request };
    batch.ops.push(op(Request::CreateQueue { name: queue.clone() }));
    store.execute_batch(&mut batch).await?;
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let mut sent = 0;
    while Instant::now() < end {
        batch.ops.clear();
        for _ in 0..batch_size {
            batch.ops.push(op(Request::Send {
                queue: queue.clone(),
                receiver: None,
                content: content.to_vec(),
            }));
        }
        store.execute_batch(&mut batch).await?;
        sent += batch.results.iter().filter(|r| r.is_ok()).count() as u64;
    }
    batch.ops.clear();
    batch.ops.push(op(Request::DeleteQueue { name: queue, purge: true }));
    store.execute_batch(&mut batch).await?;
    Ok(sent)
}

/// One node measurement: ops done and the node's mean requests per transaction.
struct NodePhase {
    ops: u64,
    batch_mean: f64,
}

struct NodePhases {
    sends: NodePhase,
    pops: NodePhase,
}

async fn through_node(
    store: AnyStore,
    config: &BenchConfig,
    window: usize,
    content: &[u8],
) -> anyhow::Result<NodePhases> {
    let node = server::start("127.0.0.1:0", store, config.node.clone()).await?;
    let addr = node.addr.to_string();
    let queue = format!("bench-node-{}", crate::util::now_us());
    let mut admin = Client::connect(&addr).await?;
    admin.register(&format!("{queue}-admin"), LOAD_SECRET).await?;
    admin.create_queue(&queue).await?;
    let before = admin.stats(&queue).await?;
    let sends = node_phase(&addr, &queue, config, window, Some(content)).await?;
    let middle = admin.stats(&queue).await?;
    let pops = node_phase(&addr, &queue, config, window, None).await?;
    let after = admin.stats(&queue).await?;
    admin.delete_queue(&queue, true).await?;
    node.shutdown().await;
    // Each phase's committed operations over its transactions (the stats calls themselves
    // are one-request transactions; they slightly lower the mean).
    let batch_mean = |committed: u64, from: &NodeStats, to: &NodeStats| {
        committed as f64 / (to.batches_committed - from.batches_committed).max(1) as f64
    };
    Ok(NodePhases {
        sends: NodePhase { ops: sends, batch_mean: batch_mean(sends, &before, &middle) },
        pops: NodePhase { ops: pops, batch_mean: batch_mean(pops, &middle, &after) },
    })
}

/// `config.clients` clients, each keeping `window` requests in flight until the phase ends
/// (sends when `content` is given, else pops until the queue is empty). Returns the ops done.
async fn node_phase(
    addr: &str,
    queue: &str,
    config: &BenchConfig,
    window: usize,
    content: Option<&[u8]>,
) -> anyhow::Result<u64> {
    let end = Instant::now() + Duration::from_secs_f64(config.seconds);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..config.clients {
        let mut client = Client::connect(addr).await?;
        client.register(&format!("{queue}-{i}"), LOAD_SECRET).await?;
        let (queue, content) = (queue.to_owned(), content.map(<[u8]>::to_vec));
        tasks.spawn(async move {
            let request = || match &content {
                Some(c) => {
                    Request::Send { queue: queue.clone(), receiver: None, content: c.clone() }
                }
                None => {
                    Request::Read { target: ReadTarget::Queue(queue.clone()), mode: ReadMode::Pop }
                }
            };
            let (mut done, mut in_flight, mut drained) = (0u64, 0usize, false);
            loop {
                while !drained && in_flight < window && Instant::now() < end {
                    client.submit(request()).await?;
                    in_flight += 1;
                }
                if in_flight == 0 {
                    return anyhow::Ok(done);
                }
                let (_, result) = client.receive().await?;
                in_flight -= 1;
                match result {
                    Ok(_) => done += 1,
                    Err(e) if e.reason == crate::protocol::Reason::NoMessage => drained = true,
                    Err(e) => return Err(crate::client::ClientError::Refused(e).into()),
                }
            }
        });
    }
    let mut total = 0;
    while let Some(n) = tasks.join_next().await {
        total += n.context("bench client")??;
    }
    Ok(total)
}
