//! The simulator's one error type.

/// What went wrong before or outside a simulated run (a run's violation is a result, not an
/// error: [`crate::run::Outcome`]).
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A fault list, seed file or setting that cannot be used, with the reason.
    #[error("{0}")]
    BadInput(String),
    /// A seed file that cannot be read.
    #[error("reading {what}")]
    Io {
        /// The file.
        what: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}
