//! The published method's plan beside leantier's refinement, for the same model and goal.
//!
//! The two differ in what the cores bound (threads vs CPU demand) and in whether a fixed node
//! bounds the rate (see `options`); putting them side by side shows what the refinement changes
//! and which resource binds in each.

use serde::Serialize;

use crate::error::PlanError;
use crate::network::Network;
use crate::optimize::{Goal, Plan, optimize_with};
use crate::options::{Options, RateSearch};

/// Both plans for one model and goal.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    /// [`Options::PUBLISHED`]: thread budget, fixed nodes outside the utilization check.
    pub published: Plan,
    /// [`Options::REFINED`]: CPU-demand budget, fixed nodes bound the rate.
    pub refined: Plan,
}

/// One node in both plans.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ComparisonRow {
    /// Node name.
    pub node: String,
    /// Whether the model fixes its thread count.
    pub fixed: bool,
    /// Threads in the published plan, then in the refined one.
    pub threads: [u32; 2],
    /// Utilization as each plan reports it ([`Plan::utilization_of`]), same order.
    pub utilization: [f64; 2],
}

/// Plans `goal` both ways, with the same rate search for both (so only the semantics differ).
pub fn compare(
    network: &Network,
    goal: Goal,
    rate_search: RateSearch,
) -> Result<Comparison, PlanError> {
    Ok(Comparison {
        published: optimize_with(network, goal, Options::PUBLISHED.with_rate_search(rate_search))?,
        refined: optimize_with(network, goal, Options::REFINED.with_rate_search(rate_search))?,
    })
}

impl Comparison {
    /// The per-node rows, in model order.
    pub fn rows(&self, network: &Network) -> Vec<ComparisonRow> {
        network
            .nodes()
            .iter()
            .enumerate()
            .map(|(index, node)| ComparisonRow {
                node: node.name.clone(),
                fixed: node.fixed_threads.is_some(),
                threads: [self.published.threads[index], self.refined.threads[index]],
                utilization: [
                    self.published.utilization_of(index),
                    self.refined.utilization_of(index),
                ],
            })
            .collect()
    }
}
