//! The one error type of this crate: what failed, with the lower layer's error as its source.

use std::io;

use crate::nats::NatsConnectError;
use crate::wire::WireError;

/// Why a publisher, an edge, a consumer or a `nats-server` child could not start or run.
///
/// The command line maps [`DeliveryError::BadInput`] (and a cause that is another crate's bad
/// input, such as the tier's) to exit code 2, so each variant keeps its cause as the
/// [`source`](std::error::Error::source), never flattened into text.
#[derive(Debug, thiserror::Error)]
pub enum DeliveryError {
    /// The caller's input (options, a subject prefix) is invalid; the message names it.
    #[error("{0}")]
    BadInput(String),
    /// A socket, a runtime or a child process could not be used.
    #[error("{what}")]
    Io {
        /// What was being done, to which address or program.
        what: String,
        /// The error the OS returned.
        #[source]
        source: io::Error,
    },
    /// No NATS connection could be made (address, credentials, TLS); its message names the
    /// server and what to check, so it is shown as it is.
    #[error(transparent)]
    Connect(#[from] NatsConnectError),
    /// A NATS request on an open connection (subscribe, publish, flush) failed.
    #[error("{what}")]
    Nats {
        /// What was asked of NATS.
        what: String,
        /// The client's error.
        #[source]
        source: async_nats::Error,
    },
    /// The edge sent bytes that are not a frame of [`crate::wire`].
    #[error("reading the edge's stream")]
    Wire(#[from] WireError),
    /// The exchange tier that publishes the records failed.
    #[error("the tier failed")]
    Tier(#[from] exchange::ExchangeError),
    /// One of the edge's tasks panicked or was cancelled.
    #[error("an edge task failed")]
    Task(#[from] tokio::task::JoinError),
    /// Something did not happen in time or as it had to; the message says what.
    #[error("{0}")]
    Failed(String),
}

/// Wraps an I/O error with what was being done, for `map_err`.
pub fn io_failed(what: impl Into<String>) -> impl FnOnce(io::Error) -> DeliveryError {
    let what = what.into();
    move |source| DeliveryError::Io { what, source }
}

/// Wraps a NATS client error with what was asked of NATS, for `map_err`.
pub fn nats_failed<E: Into<async_nats::Error>>(
    what: impl Into<String>,
) -> impl FnOnce(E) -> DeliveryError {
    let what = what.into();
    move |source| DeliveryError::Nats { what, source: source.into() }
}

/// This crate's result: `Ok(T)` or a [`DeliveryError`].
pub type Result<T, E = DeliveryError> = std::result::Result<T, E>;
