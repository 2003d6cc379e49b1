//! The planner's error type.

/// Why the planner refused a model, a node or a request.
///
/// Library functions return it directly; commands pass it on through `anyhow::Result`, so a
/// caller tells bad input from a run-time failure with `downcast_ref::<PlanError>()`.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The input is invalid (μ ≤ 0, a negative share, an unknown node name, a cycle, an
    /// option out of range, a model in which nothing limits the rate); the message names the
    /// node or field and the value.
    #[error("{0}")]
    BadInput(String),
}
