//! Online mode: a controller that re-plans thread counts while the pipeline runs.
//!
//! Every control interval the run loop measures the arrival rate (tickets the generator
//! emitted in the interval) and each node's utilization (busy time over active workers ×
//! interval) and hands the rate to [`Controller::observe`]. The controller re-plans only when
//! the rate has moved more than `replan_rate_change_min` (relative) from the rate of the plan
//! in force: this hysteresis keeps Poisson noise and the metrics' publishing lag from
//! resizing the pipeline back and forth. A re-plan is the planner's consolidation at the
//! measured rate (the fewest threads that keep every node under the utilization limit, with
//! the planner's CPU-demand budget and fixed nodes bounding the rate: `Options::REFINED`),
//! clamped per node to the workers spawned for it. The run loop applies it with
//! `RunningPipeline::resize`, which moves no ticket: deactivated workers drain what they
//! hold (see `pipeline::active`).

use planner::model::NetworkSpec;
use planner::network::Network;
use planner::optimize::{Goal, optimize_with};
use planner::options::Options;
use serde::Serialize;

use crate::error::{CdrError, Result};

/// Default hysteresis: re-plan when the arrival rate moved more than this fraction from the
/// rate the threads were planned for.
pub const REPLAN_RATE_CHANGE_MIN_DEFAULT: f64 = 0.25;

/// Decides when to re-plan and what (pure: no clock, no pipeline; the run loop measures).
pub struct Controller {
    network: Network,
    /// Per node in model order: the most workers it can have (those spawned).
    max_threads: Vec<u32>,
    replan_rate_change_min: f64,
    /// The rate the threads in force were planned for (jobs per second).
    planned_rate_per_s: f64,
    threads: Vec<u32>,
}

/// A new plan to apply.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Replan {
    /// The measured arrival rate it was planned for.
    pub rate_per_s: f64,
    /// Threads per node in model order, within `1..=max`.
    pub threads: Vec<u32>,
    /// Whether the planner kept every node under the utilization limit within the clamps.
    pub feasible: bool,
    pub bottleneck: String,
}

impl Controller {
    /// `threads` are in force now, planned for `planned_rate_per_s`; both vectors are per node
    /// in model order.
    pub fn new(
        model: NetworkSpec,
        threads: Vec<u32>,
        max_threads: Vec<u32>,
        planned_rate_per_s: f64,
        replan_rate_change_min: f64,
    ) -> Result<Controller> {
        let network = Network::new(model)?;
        let nodes = network.nodes().len();
        let bad = |why: String| Err(CdrError::BadInput(why));
        if threads.len() != nodes || max_threads.len() != nodes {
            return bad(format!(
                "one thread count and one maximum per node expected ({nodes} nodes)"
            ));
        }
        if !threads.iter().zip(&max_threads).all(|(&now, &max)| 1 <= now && now <= max) {
            return bad(format!("thread counts {threads:?} outside 1..=max {max_threads:?}"));
        }
        if !(replan_rate_change_min.is_finite() && replan_rate_change_min >= 0.0) {
            return bad(format!(
                "the re-plan threshold must be a fraction >= 0, got {replan_rate_change_min}"
            ));
        }
        Ok(Controller { network, max_threads, replan_rate_change_min, planned_rate_per_s, threads })
    }

    /// The threads in force, per node in model order.
    pub fn threads(&self) -> &[u32] {
        &self.threads
    }

    /// The model's node names, in model order.
    pub fn node_names(&self) -> impl Iterator<Item = &str> {
        self.network.nodes().iter().map(|node| node.name.as_str())
    }

    /// Whether `rate_per_s` is far enough from the planned rate to re-plan.
    pub fn needs_replan(&self, rate_per_s: f64) -> bool {
        if rate_per_s.is_nan() || rate_per_s <= 0.0 {
            return false; // nothing arrived (start-up, or the generator stopped)
        }
        let planned = self.planned_rate_per_s;
        planned.is_nan()
            || planned <= 0.0
            || (rate_per_s - planned).abs() > self.replan_rate_change_min * planned
    }

    /// Observes the arrival rate of the last interval; returns a new plan when the rate moved
    /// past the threshold (the threads may come out unchanged: the caller resizes anyway,
    /// which is a no-op then).
    pub fn observe(&mut self, rate_per_s: f64) -> Result<Option<Replan>> {
        if !self.needs_replan(rate_per_s) {
            return Ok(None);
        }
        // The refinement, explicitly (as before the published semantics became the default):
        // an fsync-bound serializer needs threads by the CPU they use, not one core each (the
        // stages alone already outnumber a 2-core host's cores), and a feeder fixed at one
        // thread must bound the plan rather than let its queue grow unseen.
        let goal = Goal::Consolidation { arrival_rate_per_s: rate_per_s };
        let plan = optimize_with(&self.network, goal, Options::REFINED)?;
        let threads: Vec<u32> =
            plan.threads.iter().zip(&self.max_threads).map(|(&n, &max)| n.clamp(1, max)).collect();
        let clamped = threads != plan.threads;
        let replan = Replan {
            rate_per_s,
            feasible: plan.feasible && !clamped,
            bottleneck: plan.bottleneck_name(&self.network).to_owned(),
            threads,
        };
        self.planned_rate_per_s = rate_per_s;
        self.threads.clone_from(&replan.threads);
        Ok(Some(replan))
    }
}

/// One control interval of an online run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TimelinePoint {
    /// Seconds since the run started, at the end of the interval.
    pub time_s: f64,
    /// Tickets the generator emitted per second in the interval.
    pub arrival_rate_per_s: f64,
    /// When the controller re-planned at the end of this interval: the threads per node (model
    /// order) in force from then on.
    pub replan_threads: Option<Vec<u32>>,
    /// Per node in model order: active workers during the interval.
    pub threads: Vec<u32>,
    /// Per node in model order: busy time / (active workers × interval).
    pub utilization: Vec<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use planner::model::{HostSpec, NodeSpec, RouteSpec};

    /// generator → worker: one node that needs ⌈rate / (0.8 · 1000)⌉ threads.
    fn model() -> NetworkSpec {
        let mut generator = NodeSpec::new("generator", 1e6);
        generator.fixed_threads = Some(1);
        generator.external_share = 1.0;
        NetworkSpec {
            host: HostSpec { cores: 64.0, ..HostSpec::default() },
            node: vec![generator, NodeSpec::new("worker", 1000.0)],
            route: vec![RouteSpec {
                from: "generator".into(),
                to: "worker".into(),
                jobs_per_job: 1.0,
            }],
            ..NetworkSpec::default()
        }
    }

    #[test]
    fn replans_only_past_the_threshold_and_clamps_to_the_maximum() {
        let mut controller = Controller::new(model(), vec![1, 1], vec![1, 8], 700.0, 0.25).unwrap();
        for within in [700.0, 560.0, 874.0, 0.0] {
            assert_eq!(controller.observe(within).unwrap(), None, "{within}/s is within 25%");
        }
        let grow = controller.observe(3000.0).unwrap().expect("3000/s is past 25%");
        assert_eq!(grow.threads, [1, 4], "3000 / (0.8 · 1000) → 4 threads");
        assert!(grow.feasible);
        assert_eq!(
            controller.observe(3500.0).unwrap(),
            None,
            "the new plan's rate is the reference"
        );
        let clamped = controller.observe(20_000.0).unwrap().unwrap();
        assert_eq!(clamped.threads, [1, 8]);
        assert!(!clamped.feasible, "25 threads were needed, 8 spawned");
        let shrink = controller.observe(500.0).unwrap().unwrap();
        assert_eq!(shrink.threads, [1, 1]);
        assert_eq!(controller.threads(), [1, 1]);
    }

    #[test]
    fn bad_thresholds_and_thread_counts_are_refused() {
        assert!(Controller::new(model(), vec![1, 1], vec![1, 8], 1.0, -0.1).is_err());
        assert!(Controller::new(model(), vec![1, 9], vec![1, 8], 1.0, 0.2).is_err());
        assert!(Controller::new(model(), vec![1], vec![1], 1.0, 0.2).is_err());
    }
}
