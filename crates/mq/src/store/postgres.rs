//! The shared store: PostgreSQL, reached through a bounded `deadpool-postgres` pool.
//!
//! A batch costs ONE round trip and a handful of statements, however many requests it holds:
//! the `plan` module cuts it into steps (a run of sends, a run of reads grouped by client and
//! target, a run of acks, each other request), each step is one call of a set-based SQL
//! statement over arrays (a multi-row insert, `mq_read_batch`, a `DELETE … USING unnest`), and BEGIN, the
//! steps and COMMIT are pipelined on one connection (see [`pipelined`]). Statements are
//! prepared once per connection.
//!
//! Several middleware nodes may share the database: reads that remove or lease a message select
//! it `FOR UPDATE SKIP LOCKED`, so two concurrent poppers never get the same row (the loser skips
//! to the next message instead of waiting), and the row is deleted in the same transaction.
//!
//! Schema changes are numbered migrations applied under an advisory lock, so nodes starting
//! together apply each migration exactly once.

use std::future::Future;
use std::pin::Pin;

use std::sync::Arc;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Row, Statement};

use super::wire::{CountedConnect, WireCounters, WireTotals};

use super::plan::{ReadGroup, Step, plan};
use super::{
    Batch, ClientRecord, MessageTable, OpResult, Store, StoreOp, check_name, not_owner,
    register_not_batched,
};
use crate::error::{MqError, Result};
use crate::protocol::{
    ErrorReply, LIST_QUEUES_MAX, Message, NodeStats, ReadMode, ReadTarget, Reason, ReplyBody,
    Request,
};

/// Arbitrary constant naming the advisory lock that serializes migrations.
const MIGRATION_LOCK_KEY: i64 = 0x6c65_616e_6d71;
/// Seconds a new database connection may take before the attempt counts as failed.
const CONNECT_TIMEOUT_S: u64 = 5;

/// Settings of the node's own sessions. Plans are generic: made once per statement and
/// connection, not at every call (the send statement's planning cost more than running it:
/// 400 → 270 µs per one-request batch, measured). Every statement the node sends takes a few
/// rows by key, so the right plan is always an index scan; a message table is a queue whose
/// statistics swing between empty and large, and a generic plan made while it looked empty
/// could be a sequential scan kept for the life of the connection, so sequential and bitmap
/// scans are priced out.
const SESSION_OPTIONS: &str =
    "-c plan_cache_mode=force_generic_plan -c enable_seqscan=off -c enable_bitmapscan=off";

/// Numbered migrations; a database at version v has run `MIGRATIONS[..v]`.
const MIGRATIONS: &[&str] = &[
    include_str!("postgres_v1.sql"),
    include_str!("postgres_v2.sql"),
    include_str!("postgres_v3.sql"),
    include_str!("postgres_v4.sql"),
    include_str!("postgres_v5.sql"),
    include_str!("postgres_v6.sql"),
    include_str!("postgres_v7.sql"),
];

#[derive(Clone, Debug)]
pub struct PostgresConfig {
    pub url: String,
    /// Most database connections this node opens.
    pub pool_connections: usize,
    /// Made so at open (see [`MessageTable`]); `None` leaves the table as it is.
    pub message_table: Option<MessageTable>,
}

#[derive(Clone)]
pub struct PostgresStore {
    pool: Pool,
    /// Bytes, batches, statements and round trips (see the `wire` module).
    wire: Arc<WireCounters>,
}

impl PostgresStore {
    /// Connects, builds the pool and applies pending migrations.
    pub async fn open(config: &PostgresConfig) -> Result<PostgresStore> {
        let mut pg: tokio_postgres::Config = config.url.parse().map_err(|source| {
            MqError::Postgres { what: "parsing the PostgreSQL URL".into(), source }
        })?;
        pg.connect_timeout(std::time::Duration::from_secs(CONNECT_TIMEOUT_S));
        pg.options(SESSION_OPTIONS);
        let wire = Arc::new(WireCounters::default());
        let manager = Manager::from_connect(
            pg,
            CountedConnect { counters: Arc::clone(&wire) },
            ManagerConfig { recycling_method: RecyclingMethod::Fast },
        );
        let pool = Pool::builder(manager)
            .max_size(config.pool_connections.max(1))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .build()?;
        let store = PostgresStore { pool, wire };
        store.migrate().await?;
        store.set_message_table(config.message_table).await?;
        Ok(store)
    }

    /// What the message table is now, after making it `wanted` (when given and different:
    /// `ALTER TABLE … SET [UN]LOGGED` rewrites the table and, since PostgreSQL 15, its id
    /// sequence, under the migration lock so nodes starting together do it once).
    async fn set_message_table(&self, wanted: Option<MessageTable>) -> Result<MessageTable> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK_KEY]).await?;
        let current = message_table_of(&tx).await?;
        let table = wanted.unwrap_or(current);
        if table != current {
            let sql = match table {
                MessageTable::Logged => "ALTER TABLE mq_messages SET LOGGED",
                MessageTable::Unlogged => "ALTER TABLE mq_messages SET UNLOGGED",
            };
            tx.batch_execute(sql).await.map_err(|source| MqError::Postgres {
                what: format!("making the message table {}", table.name()),
                source,
            })?;
        }
        tx.commit().await?;
        let (changed, message_table) = (table != current, table.name());
        match table {
            MessageTable::Logged => {
                tracing::info!(message_table, changed, "PostgreSQL message table is logged");
            }
            MessageTable::Unlogged => tracing::warn!(
                message_table,
                changed,
                "PostgreSQL message table is unlogged: a PostgreSQL crash empties it"
            ),
        }
        Ok(table)
    }

    /// Whether the message table is logged now.
    pub async fn message_table(&self) -> Result<MessageTable> {
        let client = self.pool.get().await?;
        message_table_of(&client).await
    }

    async fn migrate(&self) -> Result<()> {
        let mut client = self.pool.get().await?;
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
            let migrated = tx.batch_execute(sql).await;
            migrated.map_err(|source| MqError::Postgres {
                what: format!("migration {}", index + 1),
                source,
            })?;
            tx.execute("UPDATE mq_schema_version SET version = $1", &[&((index + 1) as i32)])
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// What the store has cost on the wire so far (see the `wire` module).
    pub fn wire_totals(&self) -> WireTotals {
        self.wire.totals()
    }

    /// Messages stored (all queues).
    pub async fn message_count(&self) -> Result<u64> {
        let client = self.pool.get().await?;
        let row = client.query_one("SELECT count(*) FROM mq_messages", &[]).await?;
        Ok(row.get::<_, i64>(0) as u64)
    }
}

async fn message_table_of(client: &impl deadpool_postgres::GenericClient) -> Result<MessageTable> {
    let sql = "SELECT relpersistence = 'u' FROM pg_class WHERE oid = 'mq_messages'::regclass";
    let unlogged: bool = client.query_one(sql, &[]).await?.get(0);
    Ok(if unlogged { MessageTable::Unlogged } else { MessageTable::Logged })
}

impl Store for PostgresStore {
    async fn execute_batch(&self, batch: &mut Batch) -> Result<()> {
        let steps = plan(&batch.ops);
        let planned: Vec<Planned<'_>> =
            steps.iter().map(|step| planned(&batch.ops, step)).collect();
        let client = self.pool.get().await?;
        let mut statements = Vec::with_capacity(planned.len());
        let cached_before = client.statement_cache.size();
        for step in &planned {
            statements.push(match step {
                Planned::Query(query) => Some(client.prepare_cached(query.sql).await?),
                Planned::Answered(_) => None,
            });
        }
        // Each statement prepared for the first time on this connection cost a round trip.
        let prepared = client.statement_cache.size().saturating_sub(cached_before) as u64;
        let sent = statements.iter().flatten().count() as u64;
        let sent = if sent > 1 { sent + 2 } else { sent };
        self.wire.batch(sent, prepared + u64::from(sent > 0));
        let answers = pipelined(&client, &planned, &statements).await?;
        let mut results =
            vec![Err(ErrorReply::new(Reason::Unavailable, "unanswered")); batch.ops.len()];
        for ((step, planned), rows) in steps.iter().zip(planned).zip(answers) {
            answer(&batch.ops, step, planned, &rows, &mut results)?;
        }
        batch.results = results;
        Ok(())
    }

    async fn claim_client(&self, name: &str, secret_hash: &str) -> Result<ClientRecord> {
        let client = self.pool.get().await?;
        let statement =
            client.prepare_cached("SELECT id, secret_hash FROM mq_claim_client($1, $2)").await?;
        let row = client.query_one(&statement, &[&name, &secret_hash]).await?;
        Ok(ClientRecord { id: row.get::<_, i64>(0) as u64, secret_hash: row.get(1) })
    }

    async fn find_client(&self, name: &str) -> Result<Option<ClientRecord>> {
        let client = self.pool.get().await?;
        let statement = client
            .prepare_cached(
                "SELECT id, secret_hash FROM mq_clients \
                 WHERE name = $1 AND secret_hash IS NOT NULL",
            )
            .await?;
        let row = client.query_opt(&statement, &[&name]).await?;
        Ok(row.map(|row| ClientRecord { id: row.get::<_, i64>(0) as u64, secret_hash: row.get(1) }))
    }

    /// One batch per pooled connection.
    fn parallel_batches_max(&self) -> usize {
        self.pool.status().max_size
    }
}

/// A parameter of a step's statement, borrowed from the batch's requests.
type Param<'a> = Box<dyn ToSql + Sync + Send + 'a>;

/// A step's statement with its parameters.
struct Query<'a> {
    sql: &'static str,
    params: Vec<Param<'a>>,
}

/// What a step needs from the database: a statement, or nothing (answered without it).
enum Planned<'a> {
    Query(Query<'a>),
    Answered(OpResult),
}

/// All sends of a step in one statement (migration 3's `mq_send_batch`, as a statement: a SQL
/// function is parsed and planned again at every call, which was a fifth of the database's
/// time; a prepared statement keeps its plan). Ids are drawn in input order, so one client's
/// messages keep their order.
///
/// The queues named are locked FOR KEY SHARE once each (what the dropped foreign key did once
/// per row; see postgres_v6.sql), so a concurrent delete of the queue waits for this commit,
/// and a send after it finds no queue.
///
/// The answer is ONE row of two arrays in input order, the result codes (0, 6 unknown queue, 9
/// unknown receiver) and the new ids (0 where refused): one row instead of one per message
/// is less to send, and to decode (tokio-postgres allocates per row).
const SEND_SQL: &str = "
    WITH queues AS (
        SELECT q.id, q.name FROM mq_queues q WHERE q.name = ANY($2::text[]) FOR KEY SHARE
    ), input AS (
        SELECT i.ord, i.sender, i.receiver, i.content, i.now, q.id AS queue_id,
               (i.receiver IS NULL
                OR EXISTS (SELECT 1 FROM mq_clients c WHERE c.id = i.receiver)) AS receiver_ok
        FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::bytea[], $5::bigint[])
             WITH ORDINALITY AS i(sender, queue, receiver, content, now, ord)
        LEFT JOIN queues q ON q.name = i.queue
    ), numbered AS (
        SELECT input.*, CASE WHEN queue_id IS NOT NULL AND receiver_ok
                             THEN nextval('mq_messages_id_seq'::regclass) END AS new_id
        FROM input ORDER BY ord
    ), inserted AS (
        INSERT INTO mq_messages(id, queue_id, sender_id, receiver_id, arrived_us, content)
        SELECT new_id, queue_id, sender, receiver, now, content FROM numbered
        WHERE new_id IS NOT NULL
    )
    SELECT array_agg(CASE WHEN queue_id IS NULL THEN 6 WHEN NOT receiver_ok THEN 9 ELSE 0 END
                     ORDER BY ord),
           array_agg(coalesce(new_id, 0) ORDER BY ord)
    FROM numbered";
/// A run of sends all to ONE queue, none addressed (the common batch under load):
/// [`SEND_SQL`]'s lock and order without its per-message work (the queue and receiver joined
/// and checked per row, the result codes computed per row): the run's rows go in as one
/// `unnest` in input order, so their ids ascend in it and the answer sorts them back. Same
/// shape as [`SEND_SQL`] (all 0 and the ids, or all 6 for an unknown queue). `pgbench -c 4` of
/// 64-row statements on one server, three rounds: 155–164K messages/s against [`SEND_SQL`]'s
/// 136–144K and a bare `INSERT` into `mq_messages`'s 152–171K (docs/benchmarks/mq.md).
const SEND_ONE_QUEUE_SQL: &str = "
    WITH queue AS (
        SELECT q.id FROM mq_queues q WHERE q.name = $2 FOR KEY SHARE
    ), inserted AS (
        INSERT INTO mq_messages(queue_id, sender_id, arrived_us, content)
        SELECT queue.id, i.sender, i.now, i.content
        FROM queue, unnest($1::bigint[], $3::bytea[], $4::bigint[])
             WITH ORDINALITY AS i(sender, content, now, ord)
        ORDER BY i.ord
        RETURNING id
    )
    SELECT array_fill(CASE WHEN EXISTS (SELECT 1 FROM queue) THEN 0 ELSE 6 END,
                      ARRAY[cardinality($3::bytea[])]),
           coalesce((SELECT array_agg(id ORDER BY id) FROM inserted),
                    array_fill(0::bigint, ARRAY[cardinality($3::bytea[])]))";
/// A step of ONE send (the common batch at one request in flight): [`SEND_SQL`]'s checks and
/// lock on one row, without the arrays, their `unnest`, the ordinality join and the
/// aggregates, which cost PostgreSQL more than the row itself at one message per statement.
/// The answer has [`SEND_SQL`]'s shape (two one-element arrays), so both are read alike.
const SEND_ONE_SQL: &str = "
    WITH queue AS (
        SELECT q.id FROM mq_queues q WHERE q.name = $2 FOR KEY SHARE
    ), checked AS (
        SELECT queue.id AS queue_id,
               ($3::bigint IS NULL
                OR EXISTS (SELECT 1 FROM mq_clients c WHERE c.id = $3)) AS receiver_ok
        FROM queue
    ), inserted AS (
        INSERT INTO mq_messages(queue_id, sender_id, receiver_id, arrived_us, content)
        SELECT queue_id, $1, $3, $5, $4 FROM checked WHERE receiver_ok
        RETURNING id
    )
    SELECT ARRAY[CASE WHEN NOT EXISTS (SELECT 1 FROM checked) THEN 6
                      WHEN NOT (SELECT receiver_ok FROM checked) THEN 9 ELSE 0 END],
           ARRAY[coalesce((SELECT id FROM inserted), 0)]";
/// A step of ONE pop from a queue (the common read at one request in flight): `mq_read_batch`'s
/// selection (oldest visible, unaddressed or addressed to the reader, `SKIP LOCKED`) and delete
/// as one statement, without the PL/pgSQL call, its three statements and its arrays. Its rows
/// have [`READ_SQL`]'s shape (group 1; code 6 for an unknown queue), so both are read alike.
///
/// The queue's id is compared with `= ANY(ARRAY(…))`, not `= (SELECT …)`: the planner takes an
/// equality with a subquery's value for a constant it cannot see, estimates from the column's
/// statistics, and where one queue holds nearly every message (one distinct value) it found
/// every row matching and scanned the primary key in id order, filtering out the other
/// queues' rows: 250 ms per pop beside a queue of 500K messages. An array comparison is no
/// such constant, so the order asked for needs the queue's index (queue_id, id) under every
/// plan (`a_lone_pop_scans_its_queue_index_beside_a_queue_holding_every_message`).
const POP_ONE_SQL: &str = "
    WITH queue AS (
        SELECT q.id FROM mq_queues q WHERE q.name = $2
    ), picked AS (
        SELECT x.id FROM mq_messages x
        WHERE x.queue_id = ANY(ARRAY(SELECT id FROM queue)) AND (x.receiver_id IS NULL OR x.receiver_id = $1)
          AND x.visible_us <= $3
        ORDER BY x.queue_id, x.id LIMIT 1 FOR UPDATE SKIP LOCKED
    ), popped AS (
        DELETE FROM mq_messages x USING picked WHERE x.id = picked.id
        RETURNING x.id, x.sender_id, x.receiver_id, x.arrived_us, x.deliveries, x.content
    )
    SELECT 1, 0, id, $2::text, sender_id, receiver_id, arrived_us, deliveries, content FROM popped
    UNION ALL
    SELECT 1, 6, NULL::bigint, NULL::text, NULL::bigint, NULL::bigint, NULL::bigint,
           NULL::integer, NULL::bytea
    WHERE NOT EXISTS (SELECT 1 FROM queue)";
const READ_SQL: &str = "SELECT grp, code, id, queue, sender_id, receiver_id, arrived_us, \
                        deliveries, content FROM mq_read_batch($1, $2, $3, $4, $5, $6, $7, $8)";
/// The acks of a step that deleted their message (held by the acker, lease not expired), by
/// ordinal. The plan never puts one message id twice in a step.
const ACK_SQL: &str = "
    DELETE FROM mq_messages x
    USING unnest($1::bigint[], $2::bigint[], $3::bigint[]) WITH ORDINALITY AS a(id, me, now, ord)
    WHERE x.id = a.id AND x.leased_by = a.me AND x.visible_us > a.now
    RETURNING a.ord";

fn query<'a>(sql: &'static str, params: Vec<Param<'a>>) -> Planned<'a> {
    Planned::Query(Query { sql, params })
}

/// The statement of one step (see the `plan` module).
fn planned<'a>(ops: &'a [StoreOp], step: &Step) -> Planned<'a> {
    let me = |op: &StoreOp| op.client_id.unwrap_or(0) as i64;
    match step {
        Step::Sends(range) if range.len() == 1 => send_one_query(&ops[range.start]),
        Step::Sends(range) => sends_query(&ops[range.clone()]),
        Step::Reads(groups) => {
            let lone_pop = if let [group] = &groups[..] { pop_one_query(ops, group) } else { None };
            lone_pop.unwrap_or_else(|| read_query(ops, groups))
        }
        Step::Acks(range) => {
            let acks = &ops[range.clone()];
            let ids: Vec<i64> = acks
                .iter()
                .map(|op| match op.request {
                    Request::Ack { message_id } => message_id as i64,
                    _ => 0,
                })
                .collect();
            let mes: Vec<i64> = acks.iter().map(me).collect();
            let nows: Vec<i64> = acks.iter().map(|op| op.now_us as i64).collect();
            query(ACK_SQL, vec![Box::new(ids), Box::new(mes), Box::new(nows)])
        }
        Step::One(index) => one_query(&ops[*index]),
    }
}

/// A send's queue, receiver and content.
fn send_fields(op: &StoreOp) -> (&str, Option<u64>, &[u8]) {
    match &op.request {
        Request::Send { queue, receiver, content } => (queue, *receiver, content),
        _ => unreachable!("the plan puts only sends in a run of sends"),
    }
}

/// The statement of a run of sends: [`SEND_ONE_QUEUE_SQL`] when they all go to one queue,
/// unaddressed, else [`SEND_SQL`].
fn sends_query(sends: &[StoreOp]) -> Planned<'_> {
    let first_queue = sends.first().map(|op| send_fields(op).0);
    let one_queue = sends
        .iter()
        .all(|op| matches!(send_fields(op), (queue, None, _) if Some(queue) == first_queue));
    let senders: Vec<i64> = sends.iter().map(|op| op.client_id.unwrap_or(0) as i64).collect();
    let contents: Vec<&[u8]> = sends.iter().map(|op| send_fields(op).2).collect();
    let nows: Vec<i64> = sends.iter().map(|op| op.now_us as i64).collect();
    if let (true, Some(queue)) = (one_queue, first_queue) {
        let params: Vec<Param<'_>> =
            vec![Box::new(senders), Box::new(queue), Box::new(contents), Box::new(nows)];
        return query(SEND_ONE_QUEUE_SQL, params);
    }
    let queues: Vec<&str> = sends.iter().map(|op| send_fields(op).0).collect();
    let receivers: Vec<Option<i64>> =
        sends.iter().map(|op| send_fields(op).1.map(|r| r as i64)).collect();
    let params: Vec<Param<'_>> = vec![
        Box::new(senders),
        Box::new(queues),
        Box::new(receivers),
        Box::new(contents),
        Box::new(nows),
    ];
    query(SEND_SQL, params)
}

/// The one-row statement of a lone send ([`SEND_ONE_SQL`]).
fn send_one_query(op: &StoreOp) -> Planned<'_> {
    let (queue, receiver, content) = send_fields(op);
    let params: Vec<Param<'_>> = vec![
        Box::new(op.client_id.unwrap_or(0) as i64),
        Box::new(queue),
        Box::new(receiver.map(|r| r as i64)),
        Box::new(content),
        Box::new(op.now_us as i64),
    ];
    query(SEND_ONE_SQL, params)
}

/// The one-row statement of a group that is one pop from a queue ([`POP_ONE_SQL`]); `None` for
/// any other group.
fn pop_one_query<'a>(ops: &'a [StoreOp], group: &ReadGroup) -> Option<Planned<'a>> {
    let [member] = group.members[..] else { return None };
    let op = &ops[member];
    let Request::Read { target: ReadTarget::Queue(queue), mode: ReadMode::Pop } = &op.request
    else {
        return None;
    };
    let params: Vec<Param<'a>> = vec![
        Box::new(op.client_id.unwrap_or(0) as i64),
        Box::new(queue.as_str()),
        Box::new(group.now_us(ops) as i64),
    ];
    Some(query(POP_ONE_SQL, params))
}

/// The arguments of one read group (one element of each of `mq_read_batch`'s arrays).
struct ReadArgs<'a> {
    me: i64,
    to_me: bool,
    queue: Option<&'a str>,
    sender: Option<i64>,
    mode: i32,
    lease_us: i64,
    now_us: i64,
    count: i32,
}

fn read_args<'a>(ops: &'a [StoreOp], group: &ReadGroup) -> ReadArgs<'a> {
    let first = &ops[group.members[0]];
    let Request::Read { target, mode } = &first.request else {
        unreachable!("the plan groups only reads")
    };
    let (to_me, queue, sender) = match target {
        ReadTarget::Queue(q) => (false, Some(q.as_str()), None),
        ReadTarget::ForMe { queue, sender } => (true, queue.as_deref(), sender.map(|s| s as i64)),
    };
    let (mode, lease_us): (i32, i64) = match mode {
        ReadMode::Pop => (0, 0),
        ReadMode::Peek => (1, 0),
        ReadMode::Lease { lease_ms } => (2, i64::from(*lease_ms) * 1000),
    };
    ReadArgs {
        me: first.client_id.unwrap_or(0) as i64,
        to_me,
        queue,
        sender,
        mode,
        lease_us,
        now_us: group.now_us(ops) as i64,
        count: i32::try_from(group.members.len()).unwrap_or(i32::MAX),
    }
}

/// One array element per read group (see `mq_read_batch` in postgres_v5.sql).
fn read_query<'a>(ops: &'a [StoreOp], groups: &[ReadGroup]) -> Planned<'a> {
    let args: Vec<ReadArgs<'a>> = groups.iter().map(|g| read_args(ops, g)).collect();
    let params: Vec<Param<'a>> = vec![
        Box::new(args.iter().map(|a| a.me).collect::<Vec<_>>()),
        Box::new(args.iter().map(|a| a.to_me).collect::<Vec<_>>()),
        Box::new(args.iter().map(|a| a.queue).collect::<Vec<_>>()),
        Box::new(args.iter().map(|a| a.sender).collect::<Vec<_>>()),
        Box::new(args.iter().map(|a| a.mode).collect::<Vec<_>>()),
        Box::new(args.iter().map(|a| a.lease_us).collect::<Vec<_>>()),
        Box::new(args.iter().map(|a| a.now_us).collect::<Vec<_>>()),
        Box::new(args.iter().map(|a| a.count).collect::<Vec<_>>()),
    ];
    query(READ_SQL, params)
}

/// A request that is a step of its own: one call of its SQL function, or no call.
fn one_query(op: &StoreOp) -> Planned<'_> {
    let me = op.client_id.unwrap_or(0) as i64;
    match &op.request {
        Request::CreateQueue { name } => match check_name(name) {
            Err(e) => Planned::Answered(Err(e)),
            Ok(()) => query(
                "SELECT code, id FROM mq_create_queue($1, $2)",
                vec![Box::new(name.as_str()), Box::new(me)],
            ),
        },
        Request::DeleteQueue { name, purge } => query(
            "SELECT code, n, owner FROM mq_delete_queue($1, $2, $3)",
            vec![Box::new(name.as_str()), Box::new(*purge), Box::new(me)],
        ),
        Request::ListQueues => query(
            "SELECT name FROM mq_list_queues($1, $2)",
            vec![Box::new(me), Box::new(LIST_QUEUES_MAX as i64)],
        ),
        Request::Stats { queue } => {
            query("SELECT code, n FROM mq_queue_depth($1)", vec![Box::new(queue.as_str())])
        }
        Request::Register { .. } => Planned::Answered(Err(register_not_batched())),
        Request::Disconnect => Planned::Answered(Ok(ReplyBody::Disconnected)),
        Request::Send { .. } | Request::Read { .. } | Request::Ack { .. } => {
            unreachable!("the plan puts sends, reads and acks in their own steps")
        }
    }
}

/// A statement's answer while it is outstanding.
type Pending<'a> =
    Pin<Box<dyn Future<Output = Result<Vec<Row>, tokio_postgres::Error>> + Send + 'a>>;

/// BEGIN, every step's statement and COMMIT issued together: ONE round trip for the whole
/// batch, however many steps it has (a batch of one statement needs no BEGIN and COMMIT). tokio-postgres sends a request when its future is first
/// polled and [`join_in_order`] first-polls in order, so the server runs them in this order. A
/// failing statement aborts the transaction: the statements after it fail too and the COMMIT
/// rolls back, so a batch commits all of its effects or none. Returns one row set per step.
async fn pipelined(
    client: &tokio_postgres::Client,
    planned: &[Planned<'_>],
    statements: &[Option<Statement>],
) -> Result<Vec<Vec<Row>>, tokio_postgres::Error> {
    let params: Vec<Vec<&(dyn ToSql + Sync)>> = planned
        .iter()
        .map(|step| match step {
            Planned::Query(query) => query.params.iter().map(|p| p.as_ref() as _).collect(),
            Planned::Answered(_) => Vec::new(),
        })
        .collect();
    // One statement is a transaction by itself (autocommit): the common batch at low load
    // (a run of sends, or of reads) then costs one message each way, like a plain INSERT.
    let explicit = statements.iter().flatten().count() > 1;
    let mut pending: Vec<Pending<'_>> = Vec::with_capacity(planned.len() + 2);
    if explicit {
        pending.push(Box::pin(async { client.batch_execute("BEGIN").await.map(|()| Vec::new()) }));
    }
    for (statement, params) in statements.iter().zip(&params) {
        pending.push(match statement {
            Some(statement) => Box::pin(client.query(statement, params)),
            None => Box::pin(std::future::ready(Ok(Vec::new()))),
        });
    }
    if explicit {
        pending.push(Box::pin(async { client.batch_execute("COMMIT").await.map(|()| Vec::new()) }));
    }
    let mut answers = join_in_order(pending).await.into_iter().collect::<Result<Vec<_>, _>>()?;
    if explicit {
        answers.pop();
        answers.remove(0);
    }
    Ok(answers)
}

/// Polls all futures until each completes, first-polling them in order; outputs in order.
async fn join_in_order<T>(
    mut futures: Vec<Pin<Box<dyn Future<Output = T> + Send + '_>>>,
) -> Vec<T> {
    let mut outputs: Vec<Option<T>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (future, output) in futures.iter_mut().zip(outputs.iter_mut()) {
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

/// Fills the results of one step's requests from its rows.
fn answer(
    ops: &[StoreOp],
    step: &Step,
    planned: Planned<'_>,
    rows: &[Row],
    results: &mut [OpResult],
) -> Result<()> {
    match step {
        Step::Sends(range) => answer_sends(&ops[range.clone()], rows, &mut results[range.clone()]),
        Step::Reads(groups) => answer_reads(ops, groups, rows, results),
        Step::Acks(range) => {
            answer_acks(&ops[range.clone()], rows, &mut results[range.clone()]);
            Ok(())
        }
        Step::One(index) => {
            results[*index] = match planned {
                Planned::Answered(result) => result,
                Planned::Query(_) => answer_one(&ops[*index], rows)?,
            };
            Ok(())
        }
    }
}

fn answer_sends(sends: &[StoreOp], rows: &[Row], results: &mut [OpResult]) -> Result<()> {
    let n = sends.len();
    let answer: Option<(Vec<i32>, Vec<i64>)> = match rows {
        [row] => Some((row.try_get(0)?, row.try_get(1)?)),
        _ => None,
    };
    let Some((codes, ids)) = answer.filter(|(c, i)| c.len() == n && i.len() == n) else {
        let why = format!("the send statement did not answer each of {n} sends");
        return Err(MqError::Store(why));
    };
    for (((code, id), op), result) in codes.into_iter().zip(ids).zip(sends).zip(results) {
        let Request::Send { queue, receiver, .. } = &op.request else { continue };
        *result = match code {
            0 => Ok(ReplyBody::Sent { message_id: id as u64, arrived_us: op.now_us }),
            6 => Err(refusal(code, format!("no queue {queue:?}"))),
            _ => Err(refusal(code, format!("no client {receiver:?}"))),
        };
    }
    Ok(())
}

/// Hands each group's messages to its reads in order: the n oldest to n pops or leases, the
/// oldest to every peek; a read left without one gets `NoMessage`.
fn answer_reads(
    ops: &[StoreOp],
    groups: &[ReadGroup],
    rows: &[Row],
    results: &mut [OpResult],
) -> Result<()> {
    let mut found: Vec<Vec<&Row>> = groups.iter().map(|_| Vec::new()).collect();
    for row in rows {
        let group = usize::try_from(row.get::<_, i32>(0) - 1).ok().and_then(|g| found.get_mut(g));
        let Some(group) = group else {
            return Err(MqError::Store("mq_read_batch answered an unknown group".into()));
        };
        group.push(row);
    }
    for (group, mut rows) in groups.iter().zip(found) {
        rows.sort_by_key(|row| row.get::<_, Option<i64>>(2));
        let peek =
            matches!(ops[group.members[0]].request, Request::Read { mode: ReadMode::Peek, .. });
        let unknown_queue = rows.iter().any(|row| row.get::<_, i32>(1) == 6);
        for (k, &member) in group.members.iter().enumerate() {
            let row = if peek { rows.first() } else { rows.get(k) };
            results[member] = match row {
                _ if unknown_queue => Err(refusal(6, "unknown queue".to_owned())),
                Some(row) => Ok(ReplyBody::Message(message_of(row))),
                None => Err(refusal(10, "no message matches".to_owned())),
            };
        }
    }
    Ok(())
}

fn message_of(r: &Row) -> Message {
    Message {
        id: r.get::<_, i64>(2) as u64,
        queue: r.get(3),
        sender: r.get::<_, i64>(4) as u64,
        receiver: r.get::<_, Option<i64>>(5).map(|v| v as u64),
        arrived_us: r.get::<_, i64>(6) as u64,
        deliveries: r.get::<_, i32>(7) as u32,
        content: r.get(8),
    }
}

fn answer_acks(acks: &[StoreOp], rows: &[Row], results: &mut [OpResult]) {
    for (ord, (op, result)) in acks.iter().zip(results).enumerate() {
        let deleted = rows.iter().any(|row| row.get::<_, i64>(0) == ord as i64 + 1);
        let Request::Ack { message_id } = op.request else { continue };
        *result = if deleted {
            Ok(ReplyBody::Acked)
        } else {
            Err(refusal(11, format!("message {message_id} is not leased to you")))
        };
    }
}

/// The answer of a request that was a step of its own.
fn answer_one(op: &StoreOp, rows: &[Row]) -> Result<OpResult> {
    if let Request::ListQueues = op.request {
        return Ok(Ok(ReplyBody::Queues(rows.iter().map(|r| r.get(0)).collect())));
    }
    let [row] = rows else {
        return Err(MqError::Store(format!("{} rows for {:?}", rows.len(), op.request)));
    };
    Ok(match &op.request {
        Request::CreateQueue { name } => coded(
            row,
            || format!("queue {name:?} exists"),
            |r| ReplyBody::QueueCreated { queue_id: r.get::<_, i64>(1) as u64 },
        ),
        Request::DeleteQueue { name, .. } => {
            if row.get::<_, i32>(0) == 18 {
                return Ok(Err(not_owner(name, row.get::<_, Option<i64>>(2).map(|o| o as u64))));
            }
            coded(
                row,
                || format!("queue {name:?}: not found, or holds messages (delete with purge)"),
                |r| ReplyBody::QueueDeleted { purged_messages: r.get::<_, i64>(1) as u64 },
            )
        }
        Request::Stats { queue } => coded(
            row,
            || format!("no queue {queue:?}"),
            |r| {
                ReplyBody::Stats(NodeStats {
                    queue_depth: r.get::<_, i64>(1) as u64,
                    ..NodeStats::default()
                })
            },
        ),
        other => return Err(MqError::Store(format!("{other:?} has no statement of its own"))),
    })
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
    use crate::store::conformance::unique;

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
        let store = PostgresStore::open(&PostgresConfig {
            url: url.clone(),
            pool_connections: 2,
            message_table: None,
        })
        .await
        .unwrap();
        super::super::conformance::scenario(&store).await;
        super::super::conformance::mixed_batch(&store).await;
        // A second node opening the same database finds the migrations applied.
        PostgresStore::open(&PostgresConfig { url, pool_connections: 1, message_table: None })
            .await
            .unwrap();
    }

    /// The foreign key is gone (postgres_v6.sql); the send statements' KEY SHARE lock keeps
    /// what it guaranteed: sends racing the deletion of their queue either commit before it
    /// (and are purged with it) or find no queue, so no message outlives its queue. Rounds
    /// alternate batches of 50 (the set-based statement) and of 1 (the one-row statement).
    #[tokio::test]
    async fn sends_racing_a_queue_deletion_leave_no_message_behind() {
        let Some(url) = pg_url() else { return };
        let store =
            PostgresStore::open(&PostgresConfig { url, pool_connections: 4, message_table: None })
                .await
                .unwrap();
        let owner = store.claim_client(&unique("racer"), "hash").await.unwrap().id;
        let op = |request| StoreOp { client_id: Some(owner), now_us: 1, request };
        let (mut refused_after_delete, mut purged) = (0, 0);
        for round in 0..40 {
            let batch = if round % 2 == 0 { 50 } else { 1 };
            let queue = unique("race");
            let mut create = Batch::default();
            create.ops.push(op(Request::CreateQueue { name: queue.clone() }));
            store.execute_batch(&mut create).await.unwrap();
            let (mut sends, mut delete) = (Batch::default(), Batch::default());
            for _ in 0..batch {
                let content = vec![1; 100];
                sends.ops.push(op(Request::Send { queue: queue.clone(), receiver: None, content }));
            }
            delete.ops.push(op(Request::DeleteQueue { name: queue.clone(), purge: true }));
            let (sent, deleted) =
                tokio::join!(store.execute_batch(&mut sends), store.execute_batch(&mut delete));
            sent.unwrap();
            deleted.unwrap();
            match &delete.results[0] {
                Ok(ReplyBody::QueueDeleted { purged_messages }) => purged += purged_messages,
                other => panic!("the owner's delete succeeds: {other:?}"),
            }
            let refused = sends.results.iter().filter(|r| r.is_err()).count();
            assert!(
                refused == 0 || refused == batch,
                "a batch is one statement: {refused} refused"
            );
            refused_after_delete += refused / batch;
        }
        let client = store.pool.get().await.unwrap();
        let orphans = "SELECT count(*) FROM mq_messages m \
                       WHERE NOT EXISTS (SELECT 1 FROM mq_queues q WHERE q.id = m.queue_id)";
        let orphans: i64 = client.query_one(orphans, &[]).await.unwrap().get(0);
        assert_eq!(orphans, 0, "messages of deleted queues");
        println!(
            "{refused_after_delete} of 40 send batches came after the delete, {purged} purged"
        );
    }

    /// Every migration applies to an empty database (the shared test database usually has
    /// them applied already), and the store works on the result.
    #[tokio::test]
    async fn migrations_apply_to_a_fresh_database() {
        let Some(url) = pg_url() else { return };
        let fresh = FreshDatabase::create(&url, "mq_fresh").await;
        let store = fresh.open(None).await;
        super::super::conformance::scenario(&store).await;
        drop(store);
        fresh.drop_it().await;
    }

    /// `message_table`: unlogged makes the table and its id sequence unlogged, the store
    /// works as before on it, a node without the setting leaves it so, and logged makes it
    /// durable again. (That a PostgreSQL crash empties an unlogged table is PostgreSQL's
    /// documented behaviour, stated in docs/MQ_PROTOCOL.md, not re-tested here.)
    #[tokio::test]
    async fn the_message_table_is_made_unlogged_and_logged_again_on_request() {
        let Some(url) = pg_url() else { return };
        let fresh = FreshDatabase::create(&url, "mq_unlogged").await;
        let persistence = "SELECT string_agg(relname || '=' || relpersistence::text, ',' ORDER BY relname)                            FROM pg_class WHERE relname IN ('mq_messages', 'mq_messages_id_seq')";
        let store = fresh.open(Some(MessageTable::Unlogged)).await;
        let client = store.pool.get().await.unwrap();
        let shown: String = client.query_one(persistence, &[]).await.unwrap().get(0);
        assert_eq!(shown, "mq_messages=u,mq_messages_id_seq=u");
        super::super::conformance::scenario(&store).await;
        drop((client, store));
        let store = fresh.open(None).await;
        assert_eq!(store.message_table().await.unwrap(), MessageTable::Unlogged, "left as is");
        drop(store);
        let store = fresh.open(Some(MessageTable::Logged)).await;
        let client = store.pool.get().await.unwrap();
        let shown: String = client.query_one(persistence, &[]).await.unwrap().get(0);
        assert_eq!(shown, "mq_messages=p,mq_messages_id_seq=p");
        drop((client, store));
        fresh.drop_it().await;
    }

    /// A lone pop from a small queue beside a queue holding every other message (the
    /// statistics then know one queue) scans the queue's index under the generic and the
    /// custom plan, and pops the small queue's message. With `queue_id = (SELECT …)` both
    /// plans scanned the primary key, filtering every other message (see [`POP_ONE_SQL`]).
    #[tokio::test]
    async fn a_lone_pop_scans_its_queue_index_beside_a_queue_holding_every_message() {
        let Some(url) = pg_url() else { return };
        let fresh = FreshDatabase::create(&url, "mq_skewed").await;
        let store = fresh.open(None).await;
        let owner = store.claim_client("owner", "hash").await.unwrap().id;
        let op = |request| StoreOp { client_id: Some(owner), now_us: 1, request };
        let mut setup = Batch::default();
        for name in ["big", "small"] {
            setup.ops.push(op(Request::CreateQueue { name: name.into() }));
        }
        store.execute_batch(&mut setup).await.unwrap();
        let client = store.pool.get().await.unwrap();
        client
            .batch_execute(
                "INSERT INTO mq_messages(queue_id, sender_id, arrived_us, content) \
                 SELECT (SELECT id FROM mq_queues WHERE name = 'big'), 1, 0, '\\x00' \
                 FROM generate_series(1, 20000); ANALYZE mq_messages;",
            )
            .await
            .unwrap();
        // After the statistics were taken: they know one queue.
        let mut send = Batch::default();
        let content = b"the small queue's".to_vec();
        send.ops.push(op(Request::Send { queue: "small".into(), receiver: None, content }));
        store.execute_batch(&mut send).await.unwrap();
        client
            .batch_execute(&format!("PREPARE pop(bigint, text, bigint) AS {POP_ONE_SQL}"))
            .await
            .unwrap();
        for plans in ["force_generic_plan", "force_custom_plan"] {
            client.batch_execute(&format!("SET plan_cache_mode = {plans}")).await.unwrap();
            let explain = "EXPLAIN EXECUTE pop(1, 'small', 2)";
            let plan: Vec<String> =
                client.query(explain, &[]).await.unwrap().iter().map(|row| row.get(0)).collect();
            let plan = plan.join("\n");
            assert!(plan.contains("Index Scan using mq_messages_by_queue"), "{plans}:\n{plan}");
        }
        drop(client);
        let mut pop = Batch::default();
        let target = ReadTarget::Queue("small".into());
        pop.ops.push(op(Request::Read { target, mode: ReadMode::Pop }));
        store.execute_batch(&mut pop).await.unwrap();
        match &pop.results[0] {
            Ok(ReplyBody::Message(message)) => assert_eq!(message.content, b"the small queue's"),
            other => panic!("the small queue's message: {other:?}"),
        }
        drop(store);
        fresh.drop_it().await;
    }

    /// A database of its own for one test, made from the test database's URL and dropped by
    /// [`FreshDatabase::drop_it`].
    struct FreshDatabase {
        admin: tokio_postgres::Client,
        base: String,
        name: String,
    }

    impl FreshDatabase {
        async fn create(url: &str, tag: &str) -> FreshDatabase {
            let (admin, connection) =
                tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
            tokio::spawn(connection);
            let name = format!("{tag}_{}_{}", std::process::id(), crate::util::now_us());
            admin.batch_execute(&format!("CREATE DATABASE {name}")).await.unwrap();
            let (base, _) = url.rsplit_once('/').expect("URL has a database path");
            FreshDatabase { admin, base: base.to_string(), name }
        }

        /// A store on it (two pooled connections), its message table made `message_table`.
        async fn open(&self, message_table: Option<MessageTable>) -> PostgresStore {
            let url = format!("{}/{}", self.base, self.name);
            let config = PostgresConfig { url, pool_connections: 2, message_table };
            PostgresStore::open(&config).await.unwrap()
        }

        async fn drop_it(self) {
            let drop = format!("DROP DATABASE {} WITH (FORCE)", self.name);
            self.admin.batch_execute(&drop).await.unwrap();
        }
    }
}
