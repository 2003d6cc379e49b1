//! The errors of this crate that a caller may want to tell apart.

/// An error the caller can act on; anything else travels as a plain `anyhow` error.
#[derive(Debug, thiserror::Error)]
pub enum MqError {
    /// The caller's input (configuration, flags, request) is invalid; the message names it.
    #[error("{0}")]
    BadInput(String),
}
