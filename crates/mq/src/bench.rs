//! `mq bench`: send and pop throughput of leantier mq against a plain one-row-per-transaction
//! baseline on the SAME database in the SAME run, with durable commits on both sides.
//!
//! - PostgreSQL: baseline = N connections each committing `INSERT` (send) and
//!   `DELETE … WHERE id = (SELECT … FOR UPDATE SKIP LOCKED)` (pop) one row per transaction;
//!   leantier = an in-process node (group commit on) driven by N TCP clients.
//! - SQLite: baseline = one `INSERT` per transaction; leantier embedded = the store's batch call
//!   with `batch` sends per transaction (the ≥ 100K durable sends/s target), plus the node over
//!   TCP.

use std::time::{Duration, Instant};

use anyhow::Context;
use lab::report::Table;
use serde::Serialize;

use crate::client::Client;
use crate::protocol::{ReadMode, ReadTarget, Request};
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
    let (sends, pops) = through_node(store, config, &content).await?;
    rows.push(row("leantier node (TCP, group commit)", "send", sends, config.seconds));
    rows.push(row("leantier node (TCP, group commit)", "pop", pops, config.seconds));
    Ok((rows, embedded))
}

fn row(system: &str, operation: &str, ops: u64, seconds: f64) -> BenchRow {
    BenchRow {
        system: system.into(),
        operation: operation.into(),
        ops,
        per_s: ops as f64 / seconds,
    }
}

/// The comparison table with ratios against the baseline of the same operation.
pub fn table(rows: &[BenchRow]) -> Table {
    let mut t = Table::new(["system", "op", "ops", "ops/s", "× baseline"])
        .with_title("mq bench (same run)");
    for r in rows {
        let baseline =
            rows.iter().find(|b| b.operation == r.operation).map_or(1.0, |b| b.per_s.max(1e-9));
        t.row([
            r.system.clone(),
            r.operation.clone(),
            r.ops.to_string(),
            format!("{:.0}", r.per_s),
            format!("{:.2}", r.per_s / baseline),
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
            lab::outcome::BadInput(format!("cannot read pgmq SQL {}: {e}", sql_path.display()))
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

async fn through_node(
    store: AnyStore,
    config: &BenchConfig,
    content: &[u8],
) -> anyhow::Result<(u64, u64)> {
    let node = server::start("127.0.0.1:0", store, config.node.clone()).await?;
    let addr = node.addr.to_string();
    let queue = format!("bench-node-{}", crate::util::now_us());
    let mut admin = Client::connect(&addr).await?;
    admin.register(&format!("{queue}-admin")).await?;
    admin.create_queue(&queue).await?;
    let sends = node_phase(&addr, &queue, config, Some(content)).await?;
    let pops = node_phase(&addr, &queue, config, None).await?;
    admin.delete_queue(&queue, true).await?;
    node.shutdown().await;
    Ok((sends, pops))
}

async fn node_phase(
    addr: &str,
    queue: &str,
    config: &BenchConfig,
    content: Option<&[u8]>,
) -> anyhow::Result<u64> {
    let end = Instant::now() + Duration::from_secs_f64(config.seconds);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..config.clients {
        let mut client = Client::connect(addr).await?;
        client.register(&format!("{queue}-{i}")).await?;
        let (queue, content) = (queue.to_owned(), content.map(<[u8]>::to_vec));
        tasks.spawn(async move {
            let mut done = 0u64;
            while Instant::now() < end {
                match &content {
                    Some(c) => {
                        client.send(&queue, None, c).await?;
                        done += 1;
                    }
                    None => {
                        match client.read(ReadTarget::Queue(queue.clone()), ReadMode::Pop).await {
                            Ok(_) => done += 1,
                            Err(e) if e.reason() == Some(crate::protocol::Reason::NoMessage) => {
                                break;
                            }
                            Err(e) => return Err(e.into()),
                        }
                    }
                }
            }
            anyhow::Ok(done)
        });
    }
    let mut total = 0;
    while let Some(n) = tasks.join_next().await {
        total += n.context("bench client")??;
    }
    Ok(total)
}
