//! The one error type of this crate: what failed, with the lower layer's error as its source.

use std::io;

/// A boxed error of the HTTP stack (hyper, http), kept as the cause of [`WebError::Http`].
pub type HttpCause = Box<dyn std::error::Error + Send + Sync>;

/// Why the service could not be configured, started or run, or a client request failed.
///
/// The command line maps [`WebError::BadInput`] to exit code 2; every other variant keeps its
/// cause as the [`source`](std::error::Error::source), never flattened into text.
#[derive(Debug, thiserror::Error)]
pub enum WebError {
    /// The caller's input (configuration, flags, request) is invalid; the message names it.
    #[error("{0}")]
    BadInput(String),
    /// A socket, a thread, a runtime or a child process could not be used.
    #[error("{what}")]
    Io {
        /// What was being done, to which address or program.
        what: String,
        /// The error the OS returned.
        #[source]
        source: io::Error,
    },
    /// An HTTP request or its answer failed in the HTTP stack.
    #[error("{what}")]
    Http {
        /// What was being done.
        what: &'static str,
        /// The HTTP stack's error.
        #[source]
        source: HttpCause,
    },
    /// The admin endpoint (`/metrics`, `/health`, `/ready`) could not be served.
    #[error("the admin endpoint")]
    Admin(#[from] ops::OpsError),
    /// A prefork child's specification (JSON in its environment) could not be written or read.
    #[error("the prefork child's specification")]
    ChildSpec(#[source] serde_json::Error),
    /// A child exited, an answer was wrong, or something else did not happen as it had to; the
    /// message says what.
    #[error("{0}")]
    Failed(String),
}

/// Wraps an I/O error with what was being done, for `map_err`.
pub(crate) fn io_failed(what: impl Into<String>) -> impl FnOnce(io::Error) -> WebError {
    let what = what.into();
    move |source| WebError::Io { what, source }
}

/// Wraps an HTTP stack error with what was being done, for `map_err`.
pub(crate) fn http_failed<E: Into<HttpCause>>(what: &'static str) -> impl FnOnce(E) -> WebError {
    move |source| WebError::Http { what, source: source.into() }
}

/// This crate's result: `Ok(T)` or a [`WebError`].
pub type Result<T, E = WebError> = std::result::Result<T, E>;
