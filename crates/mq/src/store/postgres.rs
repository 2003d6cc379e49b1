//! The shared store: PostgreSQL, reached through a bounded `deadpool-postgres` pool. Every
//! operation is one call of a PL/pgSQL function (prepared once per connection), so a request is
//! one round trip, and a batch's calls are pipelined on one connection inside one transaction.
//!
//! Several middleware nodes may share the database: reads that remove or lease a message select
//! it `FOR UPDATE SKIP LOCKED`, so two concurrent poppers never get the same row (the loser skips
//! to the next message instead of waiting), and the row is deleted in the same transaction.
//!
//! Schema changes are numbered migrations applied under an advisory lock, so nodes starting
//! together apply each migration exactly once.

use anyhow::Context;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::{NoTls, Row};

use super::{
    Batch, ClientRecord, OpResult, Store, StoreOp, check_name, not_owner, register_not_batched,
};
use crate::protocol::{
    ErrorReply, LIST_QUEUES_MAX, Message, NodeStats, ReadMode, ReadTarget, Reason, ReplyBody,
    Request,
};

/// Arbitrary constant naming the advisory lock that serializes migrations.
const MIGRATION_LOCK_KEY: i64 = 0x6c65_616e_6d71;
/// Seconds a new database connection may take before the attempt counts as failed.
const CONNECT_TIMEOUT_S: u64 = 5;

/// Numbered migrations; a database at version v has run `MIGRATIONS[..v]`.
const MIGRATIONS: &[&str] = &[
    include_str!("postgres_v1.sql"),
    include_str!("postgres_v2.sql"),
    include_str!("postgres_v3.sql"),
    include_str!("postgres_v4.sql"),
];

#[derive(Clone, Debug)]
pub struct PostgresConfig {
    pub url: String,
    /// Most database connections this node opens.
    pub pool_connections: usize,
}

#[derive(Clone)]
pub struct PostgresStore {
    pool: Pool,
}

impl PostgresStore {
    /// Connects, builds the pool and applies pending migrations.
    pub async fn open(config: &PostgresConfig) -> anyhow::Result<PostgresStore> {
        let mut pg: tokio_postgres::Config =
            config.url.parse().context("parsing the PostgreSQL URL")?;
        pg.connect_timeout(std::time::Duration::from_secs(CONNECT_TIMEOUT_S));
        let manager = Manager::from_config(
            pg,
            NoTls,
            ManagerConfig { recycling_method: RecyclingMethod::Fast },
        );
        let pool = Pool::builder(manager)
            .max_size(config.pool_connections.max(1))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .build()
            .context("building the connection pool")?;
        let store = PostgresStore { pool };
        store.migrate().await?;
        Ok(store)
    }

    async fn migrate(&self) -> anyhow::Result<()> {
        let mut client = self.pool.get().await.context("connecting to PostgreSQL")?;
        let tx = client.transaction().await?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK_KEY]).await?;
        tx.batch_execute("CREATE TABLE IF NOT EXISTS mq_schema_version (version integer NOT NULL)")
            .await?;
        let row = tx.query_opt("SELECT version FROM mq_schema_version", &[]).await?;
        let current = row.map_or(0, |r| r.get::<_, i32>(0)) as usize;
        if current == 0 {
            tx.execute("INSERT INTO mq_schema_version VALUES (0)", &[]).await?;
        }
        for (index, sql) in MIGRATIONS.iter().enumerate().skip(current) {
            tx.batch_execute(sql).await.with_context(|| format!("migration {}", index + 1))?;
            tx.execute("UPDATE mq_schema_version SET version = $1", &[&((index + 1) as i32)])
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Messages stored (all queues).
    pub async fn message_count(&self) -> anyhow::Result<u64> {
        let client = self.pool.get().await?;
        let row = client.query_one("SELECT count(*) FROM mq_messages", &[]).await?;
        Ok(row.get::<_, i64>(0) as u64)
    }
}

impl Store for PostgresStore {
    async fn execute_batch(&self, batch: &mut Batch) -> anyhow::Result<()> {
        let mut client = self.pool.get().await.context("connecting to PostgreSQL")?;
        let tx = client.transaction().await?;
        // Requests run in batch order (a connection may pipeline, so a later request can
        // depend on an earlier one). Each run of consecutive sends is ONE set-based call; each
        // run of other requests is issued at once, so tokio-postgres pipelines it on the
        // connection: one round trip per run, not one per request.
        batch.results.clear();
        let mut rest = batch.ops.as_slice();
        while let Some(first) = rest.first() {
            let sends_run = is_send(first);
            let run_len = rest.iter().take_while(|op| is_send(op) == sends_run).count();
            let (run, after) = rest.split_at(run_len);
            if sends_run {
                send_all(&tx, run, &mut batch.results).await?;
            } else {
                for result in futures_join_all(run.iter().map(|op| execute(&tx, op))).await {
                    batch.results.push(result?);
                }
            }
            rest = after;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn claim_client(&self, name: &str, secret_hash: &str) -> anyhow::Result<ClientRecord> {
        let client = self.pool.get().await.context("connecting to PostgreSQL")?;
        let statement =
            client.prepare_cached("SELECT id, secret_hash FROM mq_claim_client($1, $2)").await?;
        let row = client.query_one(&statement, &[&name, &secret_hash]).await?;
        Ok(ClientRecord { id: row.get::<_, i64>(0) as u64, secret_hash: row.get(1) })
    }

    /// One batch per pooled connection.
    fn parallel_batches_max(&self) -> usize {
        self.pool.status().max_size
    }
}

fn is_send(op: &StoreOp) -> bool {
    matches!(op.request, Request::Send { .. })
}

/// Runs `sends` (all of them sends) in one `mq_send_batch` call; appends one result per send.
async fn send_all(
    tx: &deadpool_postgres::Transaction<'_>,
    sends: &[StoreOp],
    results: &mut Vec<OpResult>,
) -> anyhow::Result<()> {
    let n = sends.len();
    let (mut senders, mut queues, mut receivers, mut contents, mut nows) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    for op in sends {
        let Request::Send { queue, receiver, content } = &op.request else {
            anyhow::bail!("send_all given a non-send request");
        };
        senders.push(op.client_id.unwrap_or(0) as i64);
        queues.push(queue.as_str());
        receivers.push(receiver.map(|r| r as i64));
        contents.push(content.as_slice());
        nows.push(op.now_us as i64);
    }
    let statement =
        tx.prepare_cached("SELECT ord, code, id FROM mq_send_batch($1, $2, $3, $4, $5)").await?;
    let rows = tx.query(&statement, &[&senders, &queues, &receivers, &contents, &nows]).await?;
    anyhow::ensure!(rows.len() == n, "mq_send_batch returned {} rows for {n} sends", rows.len());
    for (i, (row, op)) in rows.iter().zip(sends).enumerate() {
        let code: i32 = row.get(1);
        results.push(match code {
            0 => Ok(ReplyBody::Sent {
                message_id: row.get::<_, i64>(2) as u64,
                arrived_us: op.now_us,
            }),
            6 => Err(refusal(code, format!("no queue {:?}", queues[i]))),
            _ => Err(refusal(code, format!("no client {:?}", receivers[i]))),
        });
    }
    Ok(())
}

/// Polls all futures concurrently, returning their outputs in order.
async fn futures_join_all<F: std::future::Future>(
    futures: impl Iterator<Item = F>,
) -> Vec<F::Output> {
    let mut set: Vec<std::pin::Pin<Box<F>>> = futures.map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = set.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (future, output) in set.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => *output = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending { std::task::Poll::Pending } else { std::task::Poll::Ready(()) }
    })
    .await;
    outputs.into_iter().map(|o| o.expect("every future completed")).collect()
}

/// Result codes of the SQL functions (see postgres_v1.sql); 0 is success.
fn refusal(code: i32, detail: String) -> ErrorReply {
    let reason = match code {
        6 => Reason::UnknownQueue,
        7 => Reason::QueueExists,
        8 => Reason::QueueNotEmpty,
        9 => Reason::UnknownReceiver,
        10 => Reason::NoMessage,
        11 => Reason::NotLeaseHolder,
        _ => Reason::Unavailable,
    };
    ErrorReply::new(reason, detail)
}

async fn execute(
    tx: &deadpool_postgres::Transaction<'_>,
    op: &StoreOp,
) -> anyhow::Result<OpResult> {
    let me = op.client_id.unwrap_or(0) as i64;
    let now = op.now_us as i64;
    Ok(match &op.request {
        Request::Register { .. } => Err(register_not_batched()),
        Request::CreateQueue { name } => {
            if let Err(e) = check_name(name) {
                return Ok(Err(e));
            }
            let row =
                call(tx, "SELECT code, id FROM mq_create_queue($1, $2)", &[name, &me]).await?;
            coded(
                &row,
                || format!("queue {name:?} exists"),
                |r| ReplyBody::QueueCreated { queue_id: r.get::<_, i64>(1) as u64 },
            )
        }
        Request::DeleteQueue { name, purge } => {
            let row = call(
                tx,
                "SELECT code, n, owner FROM mq_delete_queue($1, $2, $3)",
                &[name, purge, &me],
            )
            .await?;
            if row.get::<_, i32>(0) == 18 {
                return Ok(Err(not_owner(name, row.get::<_, Option<i64>>(2).map(|o| o as u64))));
            }
            coded(
                &row,
                || format!("queue {name:?}: not found, or holds messages (delete with purge)"),
                |r| ReplyBody::QueueDeleted { purged_messages: r.get::<_, i64>(1) as u64 },
            )
        }
        Request::Send { .. } => unreachable!("sends are executed together by send_all"),
        Request::Read { target, mode } => {
            let (to_me, queue, sender) = match target {
                ReadTarget::Queue(q) => (false, Some(q.as_str()), None),
                ReadTarget::ForMe { queue, sender } => {
                    (true, queue.as_deref(), sender.map(|s| s as i64))
                }
            };
            let (mode_code, lease_us): (i32, i64) = match mode {
                ReadMode::Pop => (0, 0),
                ReadMode::Peek => (1, 0),
                ReadMode::Lease { lease_ms } => (2, i64::from(*lease_ms) * 1000),
            };
            let row = call(
                tx,
                "SELECT code, id, queue, sender_id, receiver_id, arrived_us, deliveries, content \
                 FROM mq_read($1, $2, $3, $4, $5, $6, $7)",
                &[&me, &to_me, &queue, &sender, &mode_code, &lease_us, &now],
            )
            .await?;
            coded(
                &row,
                || "no message matches (or unknown queue)".to_owned(),
                |r| {
                    ReplyBody::Message(Message {
                        id: r.get::<_, i64>(1) as u64,
                        queue: r.get(2),
                        sender: r.get::<_, i64>(3) as u64,
                        receiver: r.get::<_, Option<i64>>(4).map(|v| v as u64),
                        arrived_us: r.get::<_, i64>(5) as u64,
                        deliveries: r.get::<_, i32>(6) as u32,
                        content: r.get(7),
                    })
                },
            )
        }
        Request::Ack { message_id } => {
            let row =
                call(tx, "SELECT mq_ack($1, $2, $3)", &[&(*message_id as i64), &me, &now]).await?;
            coded(
                &row,
                || format!("message {message_id} is not leased to you"),
                |_| ReplyBody::Acked,
            )
        }
        Request::ListQueues => {
            let limit = LIST_QUEUES_MAX as i64;
            let rows = tx.query("SELECT name FROM mq_list_queues($1, $2)", &[&me, &limit]).await?;
            Ok(ReplyBody::Queues(rows.iter().map(|r| r.get(0)).collect()))
        }
        Request::Stats { queue } => {
            let row = call(tx, "SELECT code, n FROM mq_queue_depth($1)", &[queue]).await?;
            coded(
                &row,
                || format!("no queue {queue:?}"),
                |r| {
                    ReplyBody::Stats(NodeStats {
                        queue_depth: r.get::<_, i64>(1) as u64,
                        ..NodeStats::default()
                    })
                },
            )
        }
        Request::Disconnect => Ok(ReplyBody::Disconnected),
    })
}

async fn call(
    tx: &deadpool_postgres::Transaction<'_>,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> anyhow::Result<Row> {
    let statement = tx.prepare_cached(sql).await?;
    Ok(tx.query_one(&statement, params).await?)
}

/// Maps a `(code, ...)` row: code 0 → `ok(row)`, otherwise the refusal the code names; the
/// detail for a code that is a mismatch rather than a missing row is specialised below.
fn coded(
    row: &Row,
    detail: impl FnOnce() -> String,
    ok: impl FnOnce(&Row) -> ReplyBody,
) -> OpResult {
    let code: i32 = row.get(0);
    if code == 0 {
        return Ok(ok(row));
    }
    let detail = match code {
        6 => "unknown queue".to_owned(),
        10 => "no message matches".to_owned(),
        _ => detail(),
    };
    Err(refusal(code, detail))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The test database's URL, or `None` after printing why the test is skipped.
    pub(crate) fn pg_url() -> Option<String> {
        let url = std::env::var("LEANTIER_PG_URL").ok();
        if url.is_none() {
            println!("skipped: LEANTIER_PG_URL not set (eval \"$(scripts/pg-env)\")");
        }
        url
    }

    #[tokio::test]
    async fn postgres_passes_the_store_scenario() {
        let Some(url) = pg_url() else { return };
        let store = PostgresStore::open(&PostgresConfig { url: url.clone(), pool_connections: 2 })
            .await
            .unwrap();
        super::super::conformance::scenario(&store).await;
        // A second node opening the same database finds the migrations applied.
        PostgresStore::open(&PostgresConfig { url, pool_connections: 1 }).await.unwrap();
    }

    /// Every migration applies to an empty database (the shared test database usually has
    /// them applied already), and the store works on the result.
    #[tokio::test]
    async fn migrations_apply_to_a_fresh_database() {
        let Some(url) = pg_url() else { return };
        let (admin, connection) = tokio_postgres::connect(&url, NoTls).await.unwrap();
        tokio::spawn(connection);
        let name = format!("mq_fresh_{}_{}", std::process::id(), crate::util::now_us());
        admin.batch_execute(&format!("CREATE DATABASE {name}")).await.unwrap();
        let (base, _) = url.rsplit_once('/').expect("URL has a database path");
        let config = PostgresConfig { url: format!("{base}/{name}"), pool_connections: 2 };
        let store = PostgresStore::open(&config).await.unwrap();
        super::super::conformance::scenario(&store).await;
        drop(store);
        admin.batch_execute(&format!("DROP DATABASE {name} WITH (FORCE)")).await.unwrap();
    }
}
