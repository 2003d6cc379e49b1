//! The one error type of this crate: what failed, with the lower layer's error as its source.

use std::io;

/// Why a node, a store, a TLS configuration or a load run could not start or went wrong.
///
/// The command line maps [`MqError::BadInput`] to exit code 2; every other variant keeps its
/// cause as the [`source`](std::error::Error::source), never flattened into text (a node's
/// error reply shows the chain, `ops::error_chain`).
#[derive(Debug, thiserror::Error)]
pub enum MqError {
    /// The caller's input (configuration, flags, request) is invalid; the message names it.
    #[error("{0}")]
    BadInput(String),
    /// A file, a socket or a runtime could not be used.
    #[error("{what}")]
    Io {
        /// What was being done, to which path or address.
        what: String,
        /// The error the OS returned.
        #[source]
        source: io::Error,
    },
    /// The SQLite store failed (opening, migrating, a statement, a transaction).
    #[error("{what}")]
    Sqlite {
        /// What the store was doing.
        what: String,
        /// SQLite's error.
        #[source]
        source: rusqlite::Error,
    },
    /// The PostgreSQL store failed (a statement, a transaction, a migration).
    #[error("{what}")]
    Postgres {
        /// What the store was doing.
        what: String,
        /// The PostgreSQL client's error.
        #[source]
        source: tokio_postgres::Error,
    },
    /// No PostgreSQL connection could be had from the pool.
    #[error("connecting to PostgreSQL")]
    Pool(#[from] deadpool_postgres::PoolError),
    /// The PostgreSQL connection pool could not be built.
    #[error("building the PostgreSQL connection pool")]
    PoolBuild(#[from] deadpool_postgres::BuildError),
    /// The store answered something its statements cannot produce, or its lock was poisoned.
    #[error("the store: {0}")]
    Store(String),
    /// A certificate, a key or a CA file is unusable for TLS.
    #[error("{what}")]
    Tls {
        /// What was being read or built.
        what: &'static str,
        /// rustls' error, or the PEM parser's.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A client request failed (the node refused it, the connection or the protocol broke).
    #[error("a client request")]
    Client(#[from] crate::client::ClientError),
    /// A blocking task of the store panicked or was cancelled.
    #[error("a store task failed")]
    Task(#[from] tokio::task::JoinError),
    /// Another process owns the SQLite store's directory (or its lock could not be taken).
    #[error("the SQLite store {dir} has another owner")]
    Owned {
        /// The store's directory.
        dir: String,
        /// The lock's refusal, naming the holder.
        #[source]
        source: ops::OpsError,
    },
    /// A run did not end as it had to; the message says what.
    #[error("{0}")]
    Failed(String),
}

/// A SQLite error at a call site that names nothing more specific than the store itself.
impl From<rusqlite::Error> for MqError {
    fn from(source: rusqlite::Error) -> Self {
        MqError::Sqlite { what: "the SQLite store".into(), source }
    }
}

/// A PostgreSQL error at a call site that names nothing more specific than the store itself.
impl From<tokio_postgres::Error> for MqError {
    fn from(source: tokio_postgres::Error) -> Self {
        MqError::Postgres { what: "the PostgreSQL store".into(), source }
    }
}

/// Wraps an I/O error with what was being done, for `map_err`.
pub(crate) fn io_failed(what: impl Into<String>) -> impl FnOnce(io::Error) -> MqError {
    let what = what.into();
    move |source| MqError::Io { what, source }
}

/// Wraps a TLS or PEM error with what was being read or built, for `map_err`.
pub(crate) fn tls_failed<E: std::error::Error + Send + Sync + 'static>(
    what: &'static str,
) -> impl FnOnce(E) -> MqError {
    move |source| MqError::Tls { what, source: Box::new(source) }
}

/// The error of a store whose mutex a panicking thread left poisoned.
pub(crate) fn poisoned() -> MqError {
    MqError::Store("sqlite mutex poisoned".into())
}

/// This crate's result: `Ok(T)` or an [`MqError`].
pub type Result<T, E = MqError> = std::result::Result<T, E>;
