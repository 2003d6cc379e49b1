//! The errors of this crate that a caller may want to tell apart.

/// An error the caller can act on; anything else travels as a plain `anyhow` error.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The model or its parameters are invalid; the message names the node and field.
    #[error("{0}")]
    BadInput(String),
}
