//! The embedded store: one SQLite file in WAL mode with `synchronous=FULL`, so every committed
//! batch is on disk (the WAL is fsynced at commit) before its replies leave the node.
//!
//! Message ids use AUTOINCREMENT: plain rowids are reused after the newest row is deleted, and a
//! reused id would make an ack or a duplicate check hit a different message.
//!
//! SQLite admits one writer at a time, so the store owns a single connection behind a mutex and
//! runs each batch on tokio's blocking pool; group commit is what makes it fast (one fsync per
//! batch instead of per message). The WAL is copied into the database file by a thread of its
//! own (`wal_checkpoint`), not by the commit that happens to fill it.

use std::path::Path;
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OptionalExtension, Transaction, params};

use super::{
    Batch, ClientRecord, OpResult, Store, StoreOp, check_name, not_owner, register_not_batched,
};
use crate::error::{MqError, Result, io_failed, poisoned};
use crate::protocol::{
    ErrorReply, LIST_QUEUES_MAX, Message, NodeStats, ReadMode, ReadTarget, Reason, ReplyBody,
    Request,
};

/// File name of the database inside the data directory.
pub const DB_FILE_NAME: &str = "mq.sqlite3";
/// How long a batch waits for a lock held by another process on the file before failing.
pub(super) const BUSY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS clients (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, secret_hash TEXT);
CREATE TABLE IF NOT EXISTS queues (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, owner_id INTEGER);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    queue_id INTEGER NOT NULL REFERENCES queues(id),
    sender_id INTEGER NOT NULL,
    receiver_id INTEGER,
    arrived_us INTEGER NOT NULL,
    visible_us INTEGER NOT NULL DEFAULT 0,
    leased_by INTEGER,
    deliveries INTEGER NOT NULL DEFAULT 0,
    content BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_by_queue ON messages(queue_id, id);
-- No index on sender alone (no query needs one) and only addressed messages in the receiver
-- index (`receiver_id = ?` implies NOT NULL, so the partial index serves reads for me):
-- fewer B-tree inserts per sent message. The DROPs upgrade files made by earlier versions.
DROP INDEX IF EXISTS messages_by_sender;
DROP INDEX IF EXISTS messages_by_receiver;
CREATE INDEX IF NOT EXISTS messages_for_receiver ON messages(receiver_id, id)
    WHERE receiver_id IS NOT NULL;
";

#[derive(Clone)]
pub struct SqliteStore {
    conn: Arc<Mutex<Connection>>,
}

impl SqliteStore {
    /// Opens (creating if needed) the database in `dir`.
    pub fn open(dir: &Path) -> Result<SqliteStore> {
        std::fs::create_dir_all(dir)
            .map_err(io_failed(format!("creating data dir {}", dir.display())))?;
        let path = dir.join(DB_FILE_NAME);
        let mut conn = Connection::open(&path).map_err(|source| MqError::Sqlite {
            what: format!("opening {}", path.display()),
            source,
        })?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        // FULL: the WAL is fsynced at every commit, so a committed batch survives power loss.
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        conn.busy_timeout(BUSY_TIMEOUT)?;
        conn.execute_batch(SCHEMA)?;
        // Files made before protocol 2 lack these columns (NULL: no secret, no owner).
        add_column_if_missing(&conn, "clients", "secret_hash", "TEXT")?;
        add_column_if_missing(&conn, "queues", "owner_id", "INTEGER")?;
        super::wal_checkpoint::start(&mut conn, &path)?;
        Ok(SqliteStore { conn: Arc::new(Mutex::new(conn)) })
    }

    /// Number of stored messages (all queues); used by tests and sanity checks.
    pub fn message_count(&self) -> Result<u64> {
        let conn = self.conn.lock().map_err(|_| poisoned())?;
        let n: i64 = conn.query_row("SELECT count(*) FROM messages", [], |r| r.get(0))?;
        Ok(n as u64)
    }
}

fn add_column_if_missing(conn: &Connection, table: &str, column: &str, kind: &str) -> Result<()> {
    let present = conn
        .prepare("SELECT 1 FROM pragma_table_info(?1) WHERE name = ?2")?
        .exists([table, column])?;
    if !present {
        conn.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column} {kind}"))?;
    }
    Ok(())
}

/// See [`Store::claim_client`]: a name without a secret (made before protocol 2) takes this one.
fn claim_client(conn: &Mutex<Connection>, name: &str, secret_hash: &str) -> Result<ClientRecord> {
    let mut conn = conn.lock().map_err(|_| poisoned())?;
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    tx.prepare_cached(
        "INSERT INTO clients(name, secret_hash) VALUES (?1, ?2) \
         ON CONFLICT(name) DO UPDATE SET secret_hash = ?2 WHERE secret_hash IS NULL",
    )?
    .execute([name, secret_hash])?;
    let (id, secret_hash): (i64, String) = tx
        .prepare_cached("SELECT id, secret_hash FROM clients WHERE name = ?1")?
        .query_row([name], |r| Ok((r.get(0)?, r.get(1)?)))?;
    tx.commit()?;
    Ok(ClientRecord { id: id as u64, secret_hash })
}

/// See [`Store::find_client`].
fn find_client(conn: &Mutex<Connection>, name: &str) -> Result<Option<ClientRecord>> {
    let conn = conn.lock().map_err(|_| poisoned())?;
    let mut statement = conn.prepare_cached(
        "SELECT id, secret_hash FROM clients WHERE name = ?1 AND secret_hash IS NOT NULL",
    )?;
    let record = statement
        .query_row([name], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)))
        .optional()?;
    Ok(record.map(|(id, secret_hash)| ClientRecord { id: id as u64, secret_hash }))
}

impl Store for SqliteStore {
    async fn find_client(&self, name: &str) -> Result<Option<ClientRecord>> {
        let conn = Arc::clone(&self.conn);
        let name = name.to_owned();
        tokio::task::spawn_blocking(move || find_client(&conn, &name)).await?
    }

    async fn claim_client(&self, name: &str, secret_hash: &str) -> Result<ClientRecord> {
        let conn = Arc::clone(&self.conn);
        let (name, secret_hash) = (name.to_owned(), secret_hash.to_owned());
        tokio::task::spawn_blocking(move || claim_client(&conn, &name, &secret_hash)).await?
    }

    async fn execute_batch(&self, batch: &mut Batch) -> Result<()> {
        let conn = Arc::clone(&self.conn);
        let mut owned = std::mem::take(batch);
        let (owned, outcome) = tokio::task::spawn_blocking(move || {
            let outcome = run_batch(&conn, &mut owned);
            (owned, outcome)
        })
        .await?;
        *batch = owned;
        outcome
    }

    /// SQLite has one writer at a time.
    fn parallel_batches_max(&self) -> usize {
        1
    }
}

fn run_batch(conn: &Mutex<Connection>, batch: &mut Batch) -> Result<()> {
    let mut conn = conn.lock().map_err(|_| poisoned())?;
    // IMMEDIATE takes the write lock up front, so a lock held by another process is waited for
    // (busy timeout); a deferred transaction upgrading to write would fail at once instead.
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    batch.results.clear();
    let mut sends = Sends::default();
    for op in &batch.ops {
        batch.results.push(execute(&tx, op, &mut sends)?);
    }
    drop(sends);
    tx.commit()?;
    Ok(())
}

/// What the sends of one batch share: the queue of the previous send (a batch of sends to one
/// queue looks it up once; a delete in the batch forgets it) and the insert statement, taken
/// from the statement cache once per batch instead of once per message (each cache lookup
/// hashes the SQL and allocates its key).
#[derive(Default)]
struct Sends<'tx> {
    last_queue: Option<(String, i64)>,
    insert: Option<rusqlite::CachedStatement<'tx>>,
}

const INSERT_MESSAGE_SQL: &str = "INSERT INTO messages(queue_id, sender_id, receiver_id, arrived_us, content) \
                                  VALUES (?1, ?2, ?3, ?4, ?5)";

/// Runs one op; `Err` is a database failure (aborts the batch), `Ok(Err)` a refusal.
fn execute<'tx>(
    tx: &'tx Transaction<'_>,
    op: &StoreOp,
    sends: &mut Sends<'tx>,
) -> rusqlite::Result<OpResult> {
    let me = op.client_id.unwrap_or(0) as i64;
    let now = op.now_us as i64;
    match &op.request {
        Request::Register { .. } => Ok(Err(register_not_batched())),
        Request::CreateQueue { name } => create_queue(tx, me, name),
        Request::DeleteQueue { name, purge } => {
            sends.last_queue = None;
            delete_queue(tx, me, name, *purge)
        }
        Request::Send { queue, receiver, content } => {
            let message = (me, *receiver, content.as_slice());
            send(tx, sends, queue, message, op.now_us)
        }
        Request::Read { target, mode } => read(tx, me, now, target, *mode),
        Request::Ack { message_id } => ack(tx, me, now, *message_id),
        Request::ListQueues => {
            let mut stmt = tx.prepare_cached(
                "SELECT q.name FROM queues q WHERE EXISTS (SELECT 1 FROM messages m WHERE m.queue_id = q.id \
                 AND (m.receiver_id = ?1 OR m.receiver_id IS NULL)) ORDER BY q.name LIMIT ?2",
            )?;
            let names = stmt
                .query_map(params![me, LIST_QUEUES_MAX as i64], |r| r.get(0))?
                .collect::<rusqlite::Result<Vec<String>>>()?;
            Ok(Ok(ReplyBody::Queues(names)))
        }
        Request::Stats { queue } => queue_stats(tx, queue),
        Request::Disconnect => Ok(Ok(ReplyBody::Disconnected)),
    }
}

fn create_queue(tx: &Transaction<'_>, me: i64, name: &str) -> rusqlite::Result<OpResult> {
    if let Err(e) = check_name(name) {
        return Ok(Err(e));
    }
    let id: Option<i64> = tx
        .prepare_cached("INSERT INTO queues(name, owner_id) VALUES (?1, ?2) ON CONFLICT(name) DO NOTHING RETURNING id")?
        .query_row(params![name, me], |r| r.get(0))
        .optional()?;
    Ok(match id {
        Some(id) => Ok(ReplyBody::QueueCreated { queue_id: id as u64 }),
        None => Err(ErrorReply::new(Reason::QueueExists, format!("queue {name:?} exists"))),
    })
}

/// A send of `(sender, receiver, content)` to `queue`, stamped `now_us`; the queue's id and the
/// insert statement are kept in `sends` for the batch's next send.
fn send<'tx>(
    tx: &'tx Transaction<'_>,
    sends: &mut Sends<'tx>,
    queue: &str,
    (me, receiver, content): (i64, Option<u64>, &[u8]),
    now_us: u64,
) -> rusqlite::Result<OpResult> {
    let queue_id = match &sends.last_queue {
        Some((name, id)) if name == queue => *id,
        _ => {
            let Some(id) = queue_id(tx, queue)? else {
                return Ok(Err(unknown_queue(queue)));
            };
            sends.last_queue = Some((queue.to_owned(), id));
            id
        }
    };
    if let Some(receiver) = receiver {
        let known =
            tx.prepare_cached("SELECT 1 FROM clients WHERE id = ?1")?.exists([receiver as i64])?;
        if !known {
            let detail = format!("no client {receiver}");
            return Ok(Err(ErrorReply::new(Reason::UnknownReceiver, detail)));
        }
    }
    let insert = match &mut sends.insert {
        Some(insert) => insert,
        empty => empty.insert(tx.prepare_cached(INSERT_MESSAGE_SQL)?),
    };
    let receiver = receiver.map(|r| r as i64);
    insert.execute(params![queue_id, me, receiver, now_us as i64, content])?;
    let id = tx.last_insert_rowid();
    Ok(Ok(ReplyBody::Sent { message_id: id as u64, arrived_us: now_us }))
}

fn ack(tx: &Transaction<'_>, me: i64, now: i64, message_id: u64) -> rusqlite::Result<OpResult> {
    let deleted = tx
        .prepare_cached(
            "DELETE FROM messages WHERE id = ?1 AND leased_by = ?2 AND visible_us > ?3",
        )?
        .execute(params![message_id as i64, me, now])?;
    Ok(if deleted == 1 {
        Ok(ReplyBody::Acked)
    } else {
        let detail = format!("message {message_id} is not leased to you");
        Err(ErrorReply::new(Reason::NotLeaseHolder, detail))
    })
}

fn queue_stats(tx: &Transaction<'_>, queue: &str) -> rusqlite::Result<OpResult> {
    let Some(queue_id) = queue_id(tx, queue)? else {
        return Ok(Err(unknown_queue(queue)));
    };
    let depth: i64 = tx
        .prepare_cached("SELECT count(*) FROM messages WHERE queue_id = ?1")?
        .query_row([queue_id], |r| r.get(0))?;
    Ok(Ok(ReplyBody::Stats(NodeStats { queue_depth: depth as u64, ..NodeStats::default() })))
}

fn unknown_queue(queue: &str) -> ErrorReply {
    ErrorReply::new(Reason::UnknownQueue, format!("no queue {queue:?}"))
}

fn queue_id(tx: &Transaction<'_>, name: &str) -> rusqlite::Result<Option<i64>> {
    tx.prepare_cached("SELECT id FROM queues WHERE name = ?1")?
        .query_row([name], |r| r.get(0))
        .optional()
}

fn delete_queue(
    tx: &Transaction<'_>,
    me: i64,
    name: &str,
    purge: bool,
) -> rusqlite::Result<OpResult> {
    let found: Option<(i64, Option<i64>)> = tx
        .prepare_cached("SELECT id, owner_id FROM queues WHERE name = ?1")?
        .query_row([name], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    let Some((id, owner)) = found else {
        return Ok(Err(unknown_queue(name)));
    };
    if owner != Some(me) {
        return Ok(Err(not_owner(name, owner.map(|o| o as u64))));
    }
    let holding: i64 = tx
        .prepare_cached("SELECT count(*) FROM messages WHERE queue_id = ?1")?
        .query_row([id], |r| r.get(0))?;
    if holding > 0 && !purge {
        let detail = format!("queue {name:?} holds {holding} messages; delete with purge");
        return Ok(Err(ErrorReply::new(Reason::QueueNotEmpty, detail)));
    }
    tx.prepare_cached("DELETE FROM messages WHERE queue_id = ?1")?.execute([id])?;
    tx.prepare_cached("DELETE FROM queues WHERE id = ?1")?.execute([id])?;
    Ok(Ok(ReplyBody::QueueDeleted { purged_messages: holding as u64 }))
}

const MESSAGE_COLUMNS: &str = "SELECT m.id, q.name, m.sender_id, m.receiver_id, m.arrived_us, m.deliveries, m.content \
     FROM messages m JOIN queues q ON q.id = m.queue_id";

fn read(
    tx: &Transaction<'_>,
    me: i64,
    now: i64,
    target: &ReadTarget,
    mode: ReadMode,
) -> rusqlite::Result<OpResult> {
    let row_to_message = |r: &rusqlite::Row<'_>| {
        Ok(Message {
            id: r.get::<_, i64>(0)? as u64,
            queue: r.get(1)?,
            sender: r.get::<_, i64>(2)? as u64,
            receiver: r.get::<_, Option<i64>>(3)?.map(|v| v as u64),
            arrived_us: r.get::<_, i64>(4)? as u64,
            deliveries: r.get::<_, i64>(5)? as u32,
            content: r.get(6)?,
        })
    };
    let found = match target {
        ReadTarget::Queue(queue) => {
            let Some(queue_id) = queue_id(tx, queue)? else {
                return Ok(Err(unknown_queue(queue)));
            };
            let sql = format!(
                "{MESSAGE_COLUMNS} WHERE m.queue_id = ?1 AND (m.receiver_id IS NULL OR m.receiver_id = ?2) \
                 AND m.visible_us <= ?3 ORDER BY m.id LIMIT 1"
            );
            tx.prepare_cached(&sql)?
                .query_row(params![queue_id, me, now], row_to_message)
                .optional()?
        }
        ReadTarget::ForMe { queue, sender } => {
            let queue_id = match queue {
                None => None,
                Some(queue) => match queue_id(tx, queue)? {
                    None => return Ok(Err(unknown_queue(queue))),
                    id => id,
                },
            };
            let sql = format!(
                "{MESSAGE_COLUMNS} WHERE m.receiver_id = ?1 AND (?2 IS NULL OR m.queue_id = ?2) \
                 AND (?3 IS NULL OR m.sender_id = ?3) AND m.visible_us <= ?4 ORDER BY m.id LIMIT 1"
            );
            let sender = sender.map(|s| s as i64);
            tx.prepare_cached(&sql)?
                .query_row(params![me, queue_id, sender, now], row_to_message)
                .optional()?
        }
    };
    let Some(mut message) = found else {
        return Ok(Err(ErrorReply::new(Reason::NoMessage, "no message matches")));
    };
    match mode {
        ReadMode::Peek => {}
        ReadMode::Pop => {
            tx.prepare_cached("DELETE FROM messages WHERE id = ?1")?
                .execute([message.id as i64])?;
        }
        ReadMode::Lease { lease_ms } => {
            let visible_us = now + i64::from(lease_ms) * 1000;
            tx.prepare_cached("UPDATE messages SET visible_us = ?2, leased_by = ?3, deliveries = deliveries + 1 WHERE id = ?1")?
                .execute(params![message.id as i64, visible_us, me])?;
            message.deliveries += 1;
        }
    }
    Ok(Ok(ReplyBody::Message(message)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_unlogged_message_table_is_refused_with_its_reason() {
        use crate::store::{AnyStore, MessageTable};
        let dir = tempfile::tempdir().unwrap();
        let spec = format!("sqlite:{}", dir.path().display());
        let refused = AnyStore::open_with(&spec, 1, Some(MessageTable::Unlogged)).await;
        let error = refused.err().expect("SQLite refuses unlogged").to_string();
        assert!(error.contains("PostgreSQL option"), "{error}");
        assert!(AnyStore::open_with(&spec, 1, Some(MessageTable::Logged)).await.is_ok());
    }

    #[tokio::test]
    async fn sqlite_passes_the_store_scenario() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path()).unwrap();
        super::super::conformance::scenario(&store).await;
        super::super::conformance::mixed_batch(&store).await;
        // Reopening finds the committed state (the schema is idempotent, data persisted).
        drop(store);
        let reopened = SqliteStore::open(dir.path()).unwrap();
        assert_eq!(reopened.message_count().unwrap(), 0, "the scenario purged its queue");
    }
}
