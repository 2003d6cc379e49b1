//! The one error type of this crate: what failed, with the lower layer's error as its source.

use std::io;

use journal::JournalError;
use pipeline::stage::PipelineError;

/// Why the tier could not be configured, started, run or stopped.
///
/// The command line maps [`ExchangeError::BadInput`] (and a cause that is another crate's bad
/// input, such as [`ExchangeError::Plan`] refusing a model) to exit code 2, so each variant
/// keeps its cause as the [`source`](std::error::Error::source), never flattened into text.
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    /// The caller's input (configuration, flags, request) is invalid; the message names it.
    #[error("{0}")]
    BadInput(String),
    /// A file or directory the tier needs could not be used.
    #[error("{what}")]
    Io {
        /// What was being done, to which path.
        what: String,
        /// The error the OS returned.
        #[source]
        source: io::Error,
    },
    /// A shard's or the master data's journal could not be opened, recovered or written.
    #[error("{what}")]
    Journal {
        /// What was being done, to which journal.
        what: String,
        /// The journal's own error (its `reason` tells a repairable refusal apart).
        #[source]
        source: JournalError,
    },
    /// The stages' pipeline failed: a stage panicked or stopped with an error.
    #[error("the tier's pipeline failed")]
    Pipeline(#[from] PipelineError),
    /// The planner refused the tier's queueing model or layout.
    #[error("planning the tier's layout")]
    Plan(#[from] planner::PlanError),
    /// The load's options are invalid (the lab's check of an arrival process or schedule).
    #[error("the load's options")]
    Load(#[from] stats::BadInput),
    /// Another process owns the data directory (its journals): the tier does not start.
    #[error("the tier's data directory {} has another owner", dir.display())]
    Owned {
        /// The data directory.
        dir: std::path::PathBuf,
        /// The lock's refusal (naming the holder), or why the lock could not be taken.
        #[source]
        source: ops::OpsError,
    },
    /// The tier's order source could not start (its own error is the cause).
    #[error("the tier's order source did not start")]
    SourceFailed(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A run or a recovery ended without what it had to produce; the message says what.
    #[error("{0}")]
    Failed(String),
}

/// Wraps a journal error with what the tier was doing, for `map_err`.
pub(crate) fn journal_failed(
    what: impl Into<String>,
) -> impl FnOnce(JournalError) -> ExchangeError {
    let what = what.into();
    move |source| ExchangeError::Journal { what, source }
}

/// Wraps an I/O error with what the tier was doing, for `map_err`.
pub(crate) fn io_failed(what: impl Into<String>) -> impl FnOnce(io::Error) -> ExchangeError {
    let what = what.into();
    move |source| ExchangeError::Io { what, source }
}

/// This crate's result: `Ok(T)` or an [`ExchangeError`].
pub type Result<T, E = ExchangeError> = std::result::Result<T, E>;
