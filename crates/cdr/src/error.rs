//! The one error type of this crate: what failed, with the lower layer's error as its source.

use std::io;

/// Why a CDR run, a measurement, a prediction or the feeder's database failed.
///
/// The command line maps [`CdrError::BadInput`] (and a cause that is another crate's bad
/// input, such as the planner's) to exit code 2, so each variant keeps its cause as the
/// [`source`](std::error::Error::source), never flattened into text.
#[derive(Debug, thiserror::Error)]
pub enum CdrError {
    /// The caller's input (configuration, flags, request) is invalid; the message names it.
    #[error("{0}")]
    BadInput(String),
    /// A scratch file or directory could not be used.
    #[error("{what}")]
    Io {
        /// What was being done, to which path.
        what: String,
        /// The error the OS returned.
        #[source]
        source: io::Error,
    },
    /// The feeder's SQLite database failed.
    #[error("{what}")]
    Sqlite {
        /// What was being done, to which database.
        what: String,
        /// SQLite's error.
        #[source]
        source: rusqlite::Error,
    },
    /// The feeder's PostgreSQL database failed.
    #[error("{what}")]
    Postgres {
        /// What was being done, to which server or table.
        what: String,
        /// The PostgreSQL client's error.
        #[source]
        source: tokio_postgres::Error,
    },
    /// The planner refused the model or could not measure a node.
    #[error("the planner")]
    Plan(#[from] planner::PlanError),
    /// The stages' pipeline failed: a stage panicked or stopped with an error.
    #[error("the CDR pipeline failed")]
    Pipeline(#[from] pipeline::stage::PipelineError),
    /// The run's options are invalid (the lab's check of a load plan).
    #[error("the run's options")]
    Load(#[from] stats::BadInput),
    /// A run or a measurement did not produce what it had to; the message says what.
    #[error("{0}")]
    Failed(String),
}

/// A SQLite error at a call site that names nothing more specific than the feeder's database.
impl From<rusqlite::Error> for CdrError {
    fn from(source: rusqlite::Error) -> Self {
        CdrError::Sqlite { what: "the feeder's SQLite database".into(), source }
    }
}

/// A PostgreSQL error at a call site that names nothing more specific than the feeder's table.
impl From<tokio_postgres::Error> for CdrError {
    fn from(source: tokio_postgres::Error) -> Self {
        CdrError::Postgres { what: "the feeder's PostgreSQL table".into(), source }
    }
}

/// Wraps an I/O error with what was being done, for `map_err`.
pub(crate) fn io_failed(what: impl Into<String>) -> impl FnOnce(io::Error) -> CdrError {
    let what = what.into();
    move |source| CdrError::Io { what, source }
}

/// This crate's result: `Ok(T)` or a [`CdrError`].
pub type Result<T, E = CdrError> = std::result::Result<T, E>;
