//! How the optimizer reads the model: the published method or leantier's refinement.
//!
//! The published method bounds the **thread count** (Σ threads ≤ cores: every thread runs on
//! a core of its own, whatever its utilization), leaves a **fixed node out of the utilization
//! check** (its queue absorbs what it cannot serve, and the other nodes go on growing), and
//! raises the arrival rate in **steps** of a factor (1 + F). leantier's refinement bounds the
//! **CPU demand** (busy threads times the CPU share of their work), lets a fixed node **bound
//! the rate** like any bottleneck, and finds the rate by **bisection**. Each choice is one
//! field, so a plan can mix them; [`Options::default`] is the published method with bisection
//! (bisection and stepping agree within one step).

use serde::Serialize;

use crate::error::PlanError;

/// The smallest rate step accepted: below it a search needs millions of steps.
pub const RATE_STEP_MIN: f64 = 1e-6;
/// The largest rate step accepted (a step doubles the rate).
pub const RATE_STEP_MAX: f64 = 1.0;

/// What the host's cores bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Budget {
    /// Published: Σ threads ≤ cores (rounded down), every thread counted as one core.
    Threads,
    /// Refinement: CPU demand Σ (λ_eff,i / μ_i) · cpu_share_i ≤ limit · cores, so I/O-bound
    /// threads may outnumber the cores.
    Cpu,
}

/// How a node with a fixed thread count enters the utilization check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum FixedNodes {
    /// Published: fixed nodes are left out of the check; the plan reports each one's offered
    /// utilization λ/(c·μ) (above 1 its queue grows) and backlog growth, with a warning.
    Published,
    /// Refinement: a fixed node is checked like any other, so the rate stops where it reaches
    /// the limit.
    BoundsRate,
}

/// How the throughput goal searches the highest arrival rate (consolidation has a given rate).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum RateSearch {
    /// Bisection to a relative precision of about 2^-40.
    Bisection,
    /// Published: raise the rate by the factor (1 + F) per step; the answer is the last step
    /// under the limit, so it lies within one step below the bisection's.
    Step(f64),
}

/// The optimizer's semantics.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Options {
    /// What the cores bound.
    pub budget: Budget,
    /// Whether fixed nodes are checked against the limit.
    pub fixed_nodes: FixedNodes,
    /// How the throughput goal searches the rate.
    pub rate_search: RateSearch,
}

impl Options {
    /// The published method: thread budget, fixed nodes outside the check, bisection.
    pub const PUBLISHED: Options = Options {
        budget: Budget::Threads,
        fixed_nodes: FixedNodes::Published,
        rate_search: RateSearch::Bisection,
    };

    /// leantier's refinement: CPU-demand budget, fixed nodes bound the rate, bisection.
    pub const REFINED: Options = Options {
        budget: Budget::Cpu,
        fixed_nodes: FixedNodes::BoundsRate,
        rate_search: RateSearch::Bisection,
    };

    /// The same options with another rate search.
    pub fn with_rate_search(self, rate_search: RateSearch) -> Options {
        Options { rate_search, ..self }
    }

    /// Rejects a rate step outside [`RATE_STEP_MIN`]..=[`RATE_STEP_MAX`].
    pub fn validate(&self) -> Result<(), PlanError> {
        if let RateSearch::Step(step) = self.rate_search
            && !(RATE_STEP_MIN..=RATE_STEP_MAX).contains(&step)
        {
            return Err(PlanError::BadInput(format!(
                "the rate step must be in [{RATE_STEP_MIN}, {RATE_STEP_MAX}], got {step}"
            )));
        }
        Ok(())
    }

    /// Threads the host may run under [`Budget::Threads`]: the cores rounded down (a thread
    /// needs a whole core); `None` under [`Budget::Cpu`].
    pub fn thread_budget(&self, cores: f64) -> Option<u32> {
        match self.budget {
            // `as` saturates: cores are validated finite and > 0.
            Budget::Threads => Some(cores.floor() as u32),
            Budget::Cpu => None,
        }
    }
}

impl Default for Options {
    /// The published method ([`Options::PUBLISHED`]).
    fn default() -> Self {
        Options::PUBLISHED
    }
}
