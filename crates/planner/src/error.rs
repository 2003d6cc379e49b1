//! The planner's error type.

use std::io;

/// Why the planner refused a model, a node or a request, or could not measure one.
///
/// Library functions return it directly; the command line maps [`PlanError::BadInput`] (found
/// anywhere in an error's chain of causes) to exit code 2.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The input is invalid (μ ≤ 0, a negative share, an unknown node name, a cycle, an
    /// option out of range, a model in which nothing limits the rate); the message names the
    /// node or field and the value.
    #[error("{0}")]
    BadInput(String),
    /// A measurement completed no job, so it gives no rate.
    #[error("{0}")]
    NothingMeasured(String),
    /// A file the host probe needs could not be written, synced or removed.
    #[error("{what}")]
    Io {
        /// What was being done, to which file.
        what: String,
        /// The error the OS returned.
        #[source]
        source: io::Error,
    },
    /// A [`Workload`](crate::measure::Workload) failed to measure its nodes; the cause is the
    /// workload's own error.
    #[error("measuring the {workload} workload")]
    Workload {
        /// The workload's name.
        workload: String,
        /// Its error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}
