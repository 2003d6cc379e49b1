//! The Feeder: batched inserts of converted tickets into a database.
//!
//! Each feeder worker owns one connection (the pool is one connection per worker, so a worker
//! never waits for another's connection) and inserts a batch of rows per transaction
//! (`FEED_BATCH_ROWS_DEFAULT`; one row per transaction makes the feeder the bottleneck, which
//! `cdr validate` uses to check the model where the feeder limits the pipeline).
//! SQLite (embedded, the default) admits one writer at a time: extra feeder threads only queue
//! on its write lock, which is why the planner's model fixes the SQLite feeder at one thread.
//! PostgreSQL is used when a URL is given.

use std::path::PathBuf;

use rusqlite::{Connection, TransactionBehavior, params};

use crate::convert::DbRow;
use crate::error::{CdrError, Result};

/// Rows per insert transaction by default.
pub const FEED_BATCH_ROWS_DEFAULT: usize = 256;
/// The largest batch a feeder accepts (its buffer is allocated up front).
pub const FEED_BATCH_ROWS_MAX: usize = 65_536;
/// How long a SQLite writer waits for the write lock before failing.
const SQLITE_BUSY_TIMEOUT_MS: u64 = 30_000;

/// Where the Feeder writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DbTarget {
    /// An SQLite database file.
    Sqlite(PathBuf),
    /// A PostgreSQL server and the table to fill.
    Postgres { url: String, table: String },
}

/// A connection able to insert a batch of rows in one transaction.
pub trait Database: Send {
    fn insert_batch(&mut self, rows: &[DbRow]) -> Result<()>;
}

const SQLITE_DDL: &str = "CREATE TABLE IF NOT EXISTS cdr (seq INTEGER NOT NULL, kind TEXT NOT NULL, \
     caller INTEGER NOT NULL, callee INTEGER NOT NULL, start_ms INTEGER NOT NULL, \
     duration_s INTEGER NOT NULL, volume_bytes INTEGER NOT NULL, cell_id INTEGER NOT NULL, \
     charge_micros INTEGER NOT NULL)";
const SQLITE_INSERT: &str = "INSERT INTO cdr VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)";

fn check_table_name(table: &str) -> Result<()> {
    let valid = !table.is_empty()
        && table.len() <= 63
        && table.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && !table.starts_with(|c: char| c.is_ascii_digit());
    if !valid {
        return Err(CdrError::BadInput(format!(
            "table name {table:?} must be 1..63 of [a-z0-9_], not starting with a digit"
        )));
    }
    Ok(())
}

impl DbTarget {
    /// Creates the table if needed.
    pub fn prepare(&self) -> Result<()> {
        match self {
            Self::Sqlite(path) => {
                let connection = open_sqlite(path)?;
                connection.execute(SQLITE_DDL, [])?;
                Ok(())
            }
            Self::Postgres { url, table } => {
                check_table_name(table)?;
                let ddl = format!(
                    "CREATE TABLE IF NOT EXISTS {table} (seq BIGINT NOT NULL, kind TEXT NOT NULL, \
                     caller BIGINT NOT NULL, callee BIGINT NOT NULL, start_ms BIGINT NOT NULL, \
                     duration_s INT NOT NULL, volume_bytes BIGINT NOT NULL, cell_id INT NOT NULL, \
                     charge_micros BIGINT NOT NULL)"
                );
                let mut connection = PostgresConnection::open(url, table)?;
                connection.batch_execute(&ddl)
            }
        }
    }

    /// Opens one connection for one feeder worker.
    pub fn connect(&self) -> Result<Box<dyn Database>> {
        Ok(match self {
            Self::Sqlite(path) => Box::new(SqliteConnection { connection: open_sqlite(path)? }),
            Self::Postgres { url, table } => Box::new(PostgresConnection::open(url, table)?),
        })
    }

    /// Rows in the table (for checks after a run).
    pub fn count_rows(&self) -> Result<u64> {
        match self {
            Self::Sqlite(path) => {
                let count: i64 =
                    open_sqlite(path)?
                        .query_row("SELECT count(*) FROM cdr", [], |row| row.get(0))?;
                Ok(count as u64)
            }
            Self::Postgres { url, table } => {
                let mut connection = PostgresConnection::open(url, table)?;
                connection.count()
            }
        }
    }

    /// Drops the table (PostgreSQL test and measurement tables).
    pub fn drop_table(&self) -> Result<()> {
        match self {
            Self::Sqlite(path) => {
                open_sqlite(path)?.execute("DROP TABLE IF EXISTS cdr", [])?;
                Ok(())
            }
            Self::Postgres { url, table } => {
                let mut connection = PostgresConnection::open(url, table)?;
                connection.batch_execute(&format!("DROP TABLE IF EXISTS {table}"))
            }
        }
    }
}

fn open_sqlite(path: &PathBuf) -> Result<Connection> {
    let connection = Connection::open(path).map_err(|source| CdrError::Sqlite {
        what: format!("cannot open SQLite database {}", path.display()),
        source,
    })?;
    connection.busy_timeout(std::time::Duration::from_millis(SQLITE_BUSY_TIMEOUT_MS))?;
    // WAL: readers never block the writer; NORMAL: durable at checkpoints, the usual WAL choice.
    connection.pragma_update(None, "journal_mode", "WAL")?;
    connection.pragma_update(None, "synchronous", "NORMAL")?;
    Ok(connection)
}

struct SqliteConnection {
    connection: Connection,
}

impl Database for SqliteConnection {
    fn insert_batch(&mut self, rows: &[DbRow]) -> Result<()> {
        // IMMEDIATE takes the write lock up front, so concurrent writers queue on the busy
        // timeout instead of failing a lock upgrade.
        let transaction =
            self.connection.transaction_with_behavior(TransactionBehavior::Immediate)?;
        {
            let mut insert = transaction.prepare_cached(SQLITE_INSERT)?;
            for row in rows {
                insert.execute(params![
                    row.sequence,
                    row.kind.as_str(),
                    row.caller,
                    row.callee,
                    row.start_ms,
                    row.duration_s,
                    row.volume_bytes,
                    row.cell_id,
                    row.charge_micros
                ])?;
            }
        }
        transaction.commit()?;
        Ok(())
    }
}

/// A PostgreSQL connection driven by its own current-thread runtime (a feeder worker is a
/// plain thread; the runtime only polls this connection).
struct PostgresConnection {
    runtime: tokio::runtime::Runtime,
    client: tokio_postgres::Client,
    insert_sql: String,
    columns: Columns,
}

/// Column buffers for one `unnest` insert, reused across batches.
#[derive(Default)]
struct Columns {
    sequence: Vec<i64>,
    kind: Vec<&'static str>,
    caller: Vec<i64>,
    callee: Vec<i64>,
    start_ms: Vec<i64>,
    duration_s: Vec<i32>,
    volume_bytes: Vec<i64>,
    cell_id: Vec<i32>,
    charge_micros: Vec<i64>,
}

impl Columns {
    fn fill(&mut self, rows: &[DbRow]) {
        self.sequence.clear();
        self.kind.clear();
        self.caller.clear();
        self.callee.clear();
        self.start_ms.clear();
        self.duration_s.clear();
        self.volume_bytes.clear();
        self.cell_id.clear();
        self.charge_micros.clear();
        for row in rows {
            self.sequence.push(row.sequence);
            self.kind.push(row.kind.as_str());
            self.caller.push(row.caller);
            self.callee.push(row.callee);
            self.start_ms.push(row.start_ms);
            self.duration_s.push(row.duration_s);
            self.volume_bytes.push(row.volume_bytes);
            self.cell_id.push(row.cell_id);
            self.charge_micros.push(row.charge_micros);
        }
    }
}

impl PostgresConnection {
    fn open(url: &str, table: &str) -> Result<Self> {
        check_table_name(table)?;
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
        let runtime = runtime.map_err(|source| CdrError::Io {
            what: "starting the PostgreSQL connection's runtime".into(),
            source,
        })?;
        let (client, connection) =
            runtime.block_on(tokio_postgres::connect(url, tokio_postgres::NoTls)).map_err(
                |source| CdrError::Postgres { what: "cannot connect to PostgreSQL".into(), source },
            )?;
        runtime.spawn(async move {
            if let Err(error) = connection.await {
                tracing::error!(%error, "PostgreSQL connection closed");
            }
        });
        let insert_sql = format!(
            "INSERT INTO {table} SELECT * FROM unnest($1::int8[], $2::text[], $3::int8[], \
             $4::int8[], $5::int8[], $6::int4[], $7::int8[], $8::int4[], $9::int8[])"
        );
        Ok(Self { runtime, client, insert_sql, columns: Columns::default() })
    }

    fn batch_execute(&mut self, sql: &str) -> Result<()> {
        self.runtime.block_on(self.client.batch_execute(sql))?;
        Ok(())
    }

    fn count(&mut self) -> Result<u64> {
        let sql =
            self.insert_sql.split_whitespace().nth(2).map(|t| format!("SELECT count(*) FROM {t}"));
        let sql = sql.expect("the insert statement names its table");
        let row = self.runtime.block_on(self.client.query_one(&sql, &[]))?;
        Ok(row.get::<_, i64>(0) as u64)
    }
}

impl Database for PostgresConnection {
    fn insert_batch(&mut self, rows: &[DbRow]) -> Result<()> {
        self.columns.fill(rows);
        let c = &self.columns;
        self.runtime.block_on(self.client.execute(
            &self.insert_sql,
            &[
                &c.sequence,
                &c.kind,
                &c.caller,
                &c.callee,
                &c.start_ms,
                &c.duration_s,
                &c.volume_bytes,
                &c.cell_id,
                &c.charge_micros,
            ],
        ))?;
        Ok(())
    }
}

/// One feeder worker: buffers rows and inserts them a batch at a time.
pub struct Feeder {
    database: Box<dyn Database>,
    batch: Vec<DbRow>,
    batch_rows: usize,
    rows_inserted: u64,
}

impl Feeder {
    /// A feeder committing `batch_rows` rows per transaction (clamped to
    /// `1..=FEED_BATCH_ROWS_MAX`; callers validate user input).
    pub fn new(database: Box<dyn Database>, batch_rows: usize) -> Self {
        let batch_rows = batch_rows.clamp(1, FEED_BATCH_ROWS_MAX);
        Self { database, batch: Vec::with_capacity(batch_rows), batch_rows, rows_inserted: 0 }
    }

    /// Buffers a row; inserts the batch once it is full.
    pub fn insert(&mut self, row: &DbRow) -> Result<()> {
        self.batch.push(*row);
        if self.batch.len() >= self.batch_rows {
            self.flush()?;
        }
        Ok(())
    }

    /// Inserts whatever is buffered.
    pub fn flush(&mut self) -> Result<()> {
        if self.batch.is_empty() {
            return Ok(());
        }
        self.database.insert_batch(&self.batch)?;
        self.rows_inserted += self.batch.len() as u64;
        self.batch.clear();
        Ok(())
    }

    /// Rows committed by this worker.
    pub fn rows_inserted(&self) -> u64 {
        self.rows_inserted
    }
}
