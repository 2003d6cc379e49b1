/// Invalid input to a measurement (a rate, a schedule, a plan): the message says what and why.
/// Commands report it as bad input (exit 2).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BadInput(pub String);
