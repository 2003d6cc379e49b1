//! Where messages live. A [`Store`] executes a batch of requests in ONE transaction: either all
//! of the batch's effects commit, or (on `Err`) none do. That single entry point is what makes
//! group commit possible: the middleware collects requests from many connections and hands them
//! over together, then releases the replies after the commit.
//!
//! Expected refusals (unknown queue, queue not empty, no message) are per-request results and do
//! not abort the batch; the implementations check them before writing, so a refused request
//! writes nothing. Any other failure (I/O, lost connection) aborts the whole batch.

mod plan;
mod postgres;
mod sqlite;
mod wal_checkpoint;
pub mod wire;

use std::future::Future;

pub use postgres::{PostgresConfig, PostgresStore};
pub use sqlite::{DB_FILE_NAME as SQLITE_DB_FILE, SqliteStore};

use crate::error::Result;
use crate::protocol::{ErrorReply, ReplyBody, Request};

/// One request as the store sees it: who asks, when it arrived, what it asks.
#[derive(Clone, Debug)]
pub struct StoreOp {
    /// The registered client of the connection; `None` only for `Register`.
    pub client_id: Option<u64>,
    /// Arrival time at the middleware, microseconds since the Unix epoch; also "now" for leases.
    pub now_us: u64,
    pub request: Request,
}

/// The result of one request of a batch.
pub type OpResult = Result<ReplyBody, ErrorReply>;

/// A batch and its results, reused from batch to batch so steady state allocates nothing for
/// the batch itself.
#[derive(Debug, Default)]
pub struct Batch {
    pub ops: Vec<StoreOp>,
    /// Filled by [`Store::execute_batch`], one per op, in order.
    pub results: Vec<OpResult>,
}

/// A registered client as [`Store::claim_client`] finds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientRecord {
    pub id: u64,
    /// The salted hash (PHC string) of the client's secret. Equal to the hash given to
    /// `claim_client` exactly when that call created the client or gave a client registered
    /// without a secret (before protocol 2) its first one.
    pub secret_hash: String,
}

/// A message store; see the module docs for the transaction contract.
pub trait Store: Send + Sync + 'static {
    /// Executes `batch.ops` in one transaction and fills `batch.results`. `Register` is not a
    /// batch operation (it is refused with `UnknownOp`): registration goes through
    /// [`Store::claim_client`], because the secret's hash is checked outside any transaction.
    fn execute_batch(&self, batch: &mut Batch) -> impl Future<Output = Result<()>> + Send;

    /// Registers `name` with `secret_hash` unless it is registered with a secret already, in
    /// one transaction; returns the client as stored (see [`ClientRecord::secret_hash`]).
    fn claim_client(
        &self,
        name: &str,
        secret_hash: &str,
    ) -> impl Future<Output = Result<ClientRecord>> + Send;

    /// The client registered under `name` with a secret, if any: registration looks the stored
    /// hash up first so a known name costs one verification and an unknown one one hash.
    fn find_client(&self, name: &str) -> impl Future<Output = Result<Option<ClientRecord>>> + Send;

    /// How many batches can usefully run at once: more database workers than this only split
    /// the requests into smaller batches that then wait for each other.
    fn parallel_batches_max(&self) -> usize;
}

/// Whether PostgreSQL writes the message table to its write-ahead log (the node's
/// `message_table` setting; unset leaves the table as the database has it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MessageTable {
    /// Durable: an acknowledged send survives any crash (PostgreSQL's default).
    Logged,
    /// No write-ahead log for messages (like pgmq's unlogged queues): cheaper sends and pops;
    /// an acknowledged message survives a node crash and a clean PostgreSQL restart but NOT a
    /// PostgreSQL crash, whose recovery empties the table (and restarts message ids), and it
    /// is not replicated to standbys (docs/MQ_PROTOCOL.md, "Delivery guarantees").
    Unlogged,
}

impl MessageTable {
    pub const ALL: [MessageTable; 2] = [MessageTable::Logged, MessageTable::Unlogged];

    pub fn name(self) -> &'static str {
        match self {
            MessageTable::Logged => "logged",
            MessageTable::Unlogged => "unlogged",
        }
    }
}

/// Which store a node uses: `sqlite:DIR` or a `postgres://` URL.
#[derive(Clone)]
pub enum AnyStore {
    Sqlite(SqliteStore),
    Postgres(PostgresStore),
}

impl AnyStore {
    /// The PostgreSQL store's wire totals (see [`wire`]); `None` for SQLite, which has no wire.
    pub fn wire_totals(&self) -> Option<wire::WireTotals> {
        match self {
            AnyStore::Sqlite(_) => None,
            AnyStore::Postgres(s) => Some(s.wire_totals()),
        }
    }

    /// Opens the store named by `spec` (`sqlite:DIR` or `postgres://...`), applying migrations.
    pub async fn open(spec: &str, pool_connections: usize) -> Result<AnyStore> {
        AnyStore::open_with(spec, pool_connections, None).await
    }

    /// [`AnyStore::open`], then makes PostgreSQL's message table `message_table` (unset: as
    /// it is). SQLite refuses `Unlogged`: its nearest equivalent (`synchronous=OFF`) risks the
    /// whole file on a power loss, not only the messages, and is not offered.
    pub async fn open_with(
        spec: &str,
        pool_connections: usize,
        message_table: Option<MessageTable>,
    ) -> Result<AnyStore> {
        if let Some(dir) = spec.strip_prefix("sqlite:") {
            if message_table == Some(MessageTable::Unlogged) {
                return Err(crate::MqError::BadInput(
                    "message_table = unlogged is a PostgreSQL option; SQLite stores are always \
                     logged (synchronous=FULL)"
                        .into(),
                ));
            }
            let store = SqliteStore::open(std::path::Path::new(dir))?;
            return Ok(AnyStore::Sqlite(store));
        }
        if spec.starts_with("postgres://") || spec.starts_with("postgresql://") {
            let config = PostgresConfig { url: spec.to_owned(), pool_connections, message_table };
            return Ok(AnyStore::Postgres(PostgresStore::open(&config).await?));
        }
        Err(crate::MqError::BadInput(format!(
            "store {spec:?} is neither sqlite:DIR nor a postgres:// URL"
        )))
    }
}

/// Takes the lock of the store named by `spec` for the life of the returned value, so that one
/// process writes an embedded database (`sqlite:DIR`: `DIR/LOCK`, see [`ops::lock`]); `None`
/// for PostgreSQL, whose server orders several nodes' transactions (nodes share it by design).
/// Commands call it before [`AnyStore::open`]; `open` itself does not, because a process's
/// in-process nodes (an experiment's) open one directory several times.
pub fn claim(spec: &str) -> Result<Option<ops::StoreLock>> {
    let Some(dir) = spec.strip_prefix("sqlite:") else { return Ok(None) };
    let lock = ops::StoreLock::acquire(std::path::Path::new(dir))
        .map_err(|source| crate::MqError::Owned { dir: dir.to_string(), source })?;
    Ok(Some(lock))
}

impl Store for AnyStore {
    async fn execute_batch(&self, batch: &mut Batch) -> Result<()> {
        match self {
            AnyStore::Sqlite(s) => s.execute_batch(batch).await,
            AnyStore::Postgres(s) => s.execute_batch(batch).await,
        }
    }

    async fn claim_client(&self, name: &str, secret_hash: &str) -> Result<ClientRecord> {
        match self {
            AnyStore::Sqlite(s) => s.claim_client(name, secret_hash).await,
            AnyStore::Postgres(s) => s.claim_client(name, secret_hash).await,
        }
    }

    async fn find_client(&self, name: &str) -> Result<Option<ClientRecord>> {
        match self {
            AnyStore::Sqlite(s) => s.find_client(name).await,
            AnyStore::Postgres(s) => s.find_client(name).await,
        }
    }

    fn parallel_batches_max(&self) -> usize {
        match self {
            AnyStore::Sqlite(s) => s.parallel_batches_max(),
            AnyStore::Postgres(s) => s.parallel_batches_max(),
        }
    }
}

/// Validates a client or queue name.
pub(crate) fn check_name(name: &str) -> Result<(), ErrorReply> {
    use crate::protocol::{NAME_BYTES_MAX, Reason};
    if name.is_empty() || name.len() > NAME_BYTES_MAX {
        return Err(ErrorReply::new(
            Reason::InvalidName,
            format!("names are 1..={NAME_BYTES_MAX} bytes"),
        ));
    }
    Ok(())
}

/// The refusal of a `Register` found in a batch (see [`Store::execute_batch`]).
pub(crate) fn register_not_batched() -> ErrorReply {
    ErrorReply::new(
        crate::protocol::Reason::UnknownOp,
        "Register is not a batch operation (Store::claim_client)",
    )
}

/// The refusal of a delete or purge by a client that does not own the queue.
pub(crate) fn not_owner(queue: &str, owner: Option<u64>) -> ErrorReply {
    let detail = match owner {
        Some(owner) => format!("queue {queue:?} is owned by client {owner}"),
        None => format!("queue {queue:?} has no owner (created before protocol 2)"),
    };
    ErrorReply::new(crate::protocol::Reason::NotOwner, detail)
}

#[cfg(test)]
pub(crate) mod conformance;
