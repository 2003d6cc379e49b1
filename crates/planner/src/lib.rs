//! Capacity planner: queueing models of a multi-threaded data-flow pipeline and an optimizer
//! that computes how many threads each stage should run.
//!
//! Engineers usually guess thread counts. The planner instead measures each stage alone on the
//! target host (service rate per thread and the CPU share of a job: `measure`), models the
//! pipeline as an open feed-forward network of M/M/c/K nodes (`node`, `network`), and searches
//! thread counts (`optimize`) for one of two goals: the fewest threads that carry a given rate
//! under a utilization limit (consolidation), or the highest rate the host's cores can carry
//! (throughput). The answer is a TOML pipeline config (`model::PipelineConfig`) that the
//! pipeline reads, together with the predictions a run is compared against. By default the
//! optimizer plans as published (Σ threads ≤ cores, fixed nodes left out of the utilization
//! check); `options` selects leantier's refinement (a CPU-demand budget, fixed nodes bound the
//! rate) and the published rate stepping, and `compare` puts both plans side by side.
//!
//! Models are closed-form or recurrence based and allocation-free per node solve: an M/M/c/K
//! node costs O(c) regardless of K, computed in log space so `c = 256`, `K = 10^6` and `ρ ≥ 1`
//! neither overflow nor cancel. M/M/c (Erlang C) and the textbook M/M/1/K are independent
//! cross-checks. For closed interactive systems (clients with think time) `closed` provides
//! exact MVA, asymptotic bounds, and the operational laws used to check measured data.
//!
//! Invalid input (μ ≤ 0, negative rates or shares, unknown node names, a cycle) is rejected
//! with [`PlanError::BadInput`] and a message naming the node and field.

pub mod closed;
pub mod compare;
pub mod error;
pub mod measure;
pub mod model;
pub mod network;
pub mod node;
pub mod optimize;
pub mod options;
pub mod round;

pub use error::PlanError;
