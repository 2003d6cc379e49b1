//! The one error `lab` reports to its callers.

/// The caller's input (a load plan, a config file, a rate search) is invalid; the message
/// names the offending value. The command line maps it to the bad-input exit code.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BadInput(pub String);
