//! The thread optimizer: the published algorithm, and leantier's refinement of it.
//!
//! Both goals start from one thread per node (or the node's fixed count) and add one thread at
//! a time to the node that limits the goal, so every added thread is one the goal needed:
//! - **consolidation**: at a given source rate, while some node is above the utilization limit,
//!   add a thread to the most utilized non-fixed one. A node only ever gains threads while it
//!   is over the limit at an arrival rate no higher than its final one, so each node ends with
//!   the fewest threads that keep it under the limit.
//! - **throughput**: find the highest source rate at which every checked node, the disk and the
//!   network stay under the limit (utilizations rise monotonically with the source rate, so
//!   bisection or the published stepping finds it), then add a thread to the node that binds;
//!   repeat until the binding resource cannot grow.
//!
//! [`Options`] choose the semantics (see `options`):
//! - **budget**: [`Budget::Threads`] (published) stops when another thread would make
//!   Σ threads exceed the cores; [`Budget::Cpu`] treats the cores as one more shared device
//!   whose utilization is `Σ_i (λ_eff,i / μ_i) · cpu_share_i / cores`, held under the same limit
//!   as every node, so I/O-bound nodes may run more threads than there are cores.
//! - **fixed nodes**: [`FixedNodes::Published`] leaves them out of the utilization check (the
//!   plan reports their offered load and backlog growth instead, see [`FixedNodeLoad`]);
//!   [`FixedNodes::BoundsRate`] checks them, so a fixed bottleneck stops the search.
//!
//! Both goals stop cleanly, naming the reason: the thread or core budget, the memory limit, the
//! disk or network bandwidth, a fixed bottleneck node, or the per-node thread cap.
//!
//! Worked example (the published one): host "Goedel", 8 cores, limit 0.8, μ = decoder 30 055,
//! converter 18 672, serializer 6 146, feeder 94 tickets/s, decoder → converter → {serializer,
//! feeder}. With the thread budget the feeder takes every spare thread: 1-1-1-5 (8 threads,
//! 376 tickets/s); the CPU budget counts the feeders' busy time only and plans 1-1-1-8. With
//! the feeder fixed at 1 and left out of the check, the rate climbs until the serializer wants
//! a fifth thread: 1-2-4-1 at 19 667 tickets/s, the feeder offered 209 times what it serves.

use serde::Serialize;

use crate::error::PlanError;
use crate::model::{NodeConfig, PipelineConfig};
use crate::network::Network;
use crate::node::NodeMetrics;
use crate::options::{Budget, FixedNodes, Options, RateSearch};
use crate::round;

/// Bisection steps for the highest sustainable rate (relative precision ~2^-40).
const RATE_BISECTION_STEPS: u32 = 40;
/// Doublings allowed while looking for a rate above the limit; a model still under the limit
/// after them has nothing that bounds its rate.
const RATE_DOUBLINGS_MAX: u32 = 200;
/// Rate steps one search may take (the published stepping); a guard against a tiny step.
const RATE_STEPS_MAX: u32 = 2_000_000;
/// Threads one node may reach; a guard against a near-zero `cpu_share` looping for long.
pub const THREADS_PER_NODE_MAX: u32 = 4096;
/// Relative slack when checking a utilization against the limit after bisection.
const LIMIT_EPSILON: f64 = 1e-9;

/// What the optimizer is asked for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Goal {
    /// The fewest threads that keep every node under the limit at this source rate.
    Consolidation {
        /// Source rate, jobs per second.
        arrival_rate_per_s: f64,
    },
    /// The highest source rate the core budget can sustain under the limit.
    Throughput,
}

/// The resource that limits a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Resource {
    /// A node (index into the network's nodes).
    Node(usize),
    /// The host's cores (CPU demand).
    Cpu,
    /// The host's disk bandwidth.
    Disk,
    /// The host's network bandwidth.
    Network,
}

/// Why the optimizer stopped adding threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum StopReason {
    /// Consolidation reached its goal: every checked node is under the limit.
    AllUnderLimit,
    /// CPU demand reached the limit of the core budget ([`Budget::Cpu`]).
    CoreBudget,
    /// Another thread would make Σ threads exceed the cores ([`Budget::Threads`]).
    ThreadBudget,
    /// Another thread on the bottleneck node would exceed the host's memory.
    Memory,
    /// The bottleneck node has a fixed thread count ([`FixedNodes::BoundsRate`]).
    FixedNode,
    /// The bottleneck is the disk or network bandwidth, which threads cannot raise.
    Bandwidth,
    /// The bottleneck node reached [`THREADS_PER_NODE_MAX`].
    ThreadCap,
}

impl StopReason {
    /// A sentence for reports.
    pub fn describe(self) -> &'static str {
        match self {
            Self::AllUnderLimit => "every checked node is under the utilization limit",
            Self::CoreBudget => "CPU demand is at the limit of the core budget",
            Self::ThreadBudget => "another thread would make the threads outnumber the cores",
            Self::Memory => "another thread on the bottleneck would exceed the host's memory",
            Self::FixedNode => "the bottleneck node has a fixed thread count",
            Self::Bandwidth => "the bottleneck is device bandwidth, which threads cannot raise",
            Self::ThreadCap => "the bottleneck node reached the per-node thread cap",
        }
    }
}

/// The load on one fixed node at the planned rate, reported whatever the semantics (under
/// [`FixedNodes::Published`] it is the only check a fixed node gets).
///
/// The offered figures assume the published reading: the fixed node's queue is long enough to
/// absorb what it cannot serve, so what is offered beyond `c·μ` accumulates rather than being
/// refused. (The network solve still gives the node a finite buffer, so nodes downstream of it
/// see at most what it serves.)
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FixedNodeLoad {
    /// Index into the network's nodes.
    pub node: usize,
    /// Its fixed thread count c.
    pub threads: u32,
    /// Offered utilization λ/(c·μ); above 1 the node's queue grows without bound.
    #[serde(serialize_with = "round::serialize_measure")]
    pub offered_utilization: f64,
    /// How fast its backlog grows at the planned rate, max(0, λ − c·μ), jobs per second.
    #[serde(serialize_with = "round::serialize_measure")]
    pub backlog_growth_per_s: f64,
}

/// The optimizer's answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    /// `throughput` or `consolidation`.
    pub goal: &'static str,
    /// The semantics the plan was made with.
    pub options: Options,
    /// The source rate the plan is for.
    #[serde(serialize_with = "round::serialize_measure")]
    pub arrival_rate_per_s: f64,
    /// Threads per node, in model order.
    pub threads: Vec<u32>,
    /// Each node's metrics at `arrival_rate_per_s`.
    pub metrics: Vec<NodeMetrics>,
    /// The resource with the highest checked utilization (the one at the limit for
    /// `throughput`, or the node that wanted the thread the budget refused).
    pub bottleneck: Resource,
    /// Why thread adding stopped.
    pub stop: StopReason,
    /// Whether every checked node and device is under the limit at `arrival_rate_per_s` and
    /// the threads fit the thread budget.
    pub feasible: bool,
    /// CPU demand at `arrival_rate_per_s`, in cores: Σ busy threads · cpu_share.
    #[serde(serialize_with = "round::serialize_measure")]
    pub cpu_cores_demand: f64,
    /// Σ threads ≤ this under [`Budget::Threads`] (the cores rounded down).
    pub thread_budget: Option<u32>,
    /// Every node with a fixed thread count, in model order, with its offered load.
    pub fixed_nodes: Vec<FixedNodeLoad>,
    /// What a user must know about this plan (fixed nodes over the limit, a budget the
    /// starting configuration already exceeds), one sentence each.
    pub warnings: Vec<String>,
    /// Asymptotic bound: source rate at which the first node saturates (min c·μ/v).
    #[serde(serialize_with = "round::serialize_measure")]
    pub saturation_rate_per_s: f64,
    /// Asymptotic bound: the least possible end-to-end time (longest service chain).
    #[serde(serialize_with = "round::serialize_measure")]
    pub min_response_time_s: f64,
    /// Network solves performed (for the optimizer's own cost).
    pub evaluations: u64,
}

/// Runs the optimizer with the published semantics ([`Options::default`]).
pub fn optimize(network: &Network, goal: Goal) -> Result<Plan, PlanError> {
    optimize_with(network, goal, Options::default())
}

/// Runs the optimizer on a validated network with the given semantics.
pub fn optimize_with(network: &Network, goal: Goal, options: Options) -> Result<Plan, PlanError> {
    options.validate()?;
    let mut search = Search::new(network, options)?;
    let (arrival_rate_per_s, bottleneck, stop) = match goal {
        Goal::Consolidation { arrival_rate_per_s } => {
            if !(arrival_rate_per_s.is_finite() && arrival_rate_per_s > 0.0) {
                return Err(PlanError::BadInput(format!(
                    "consolidation needs an arrival rate > 0, got {arrival_rate_per_s}"
                )));
            }
            let (bottleneck, stop) = search.consolidate(arrival_rate_per_s)?;
            (arrival_rate_per_s, bottleneck, stop)
        }
        Goal::Throughput => search.maximize_throughput()?,
    };
    let load = search.load_at(arrival_rate_per_s)?;
    let limit = network.spec().utilization_limit;
    let within_budget = search.thread_budget.is_none_or(|budget| search.thread_count() <= budget);
    let fixed_nodes = fixed_node_loads(network, &search.threads, &search.metrics);
    let mut plan = Plan {
        goal: match goal {
            Goal::Consolidation { .. } => "consolidation",
            Goal::Throughput => "throughput",
        },
        options,
        arrival_rate_per_s,
        saturation_rate_per_s: network.saturation_rate_per_s(&search.threads),
        min_response_time_s: network.min_response_time_s(),
        cpu_cores_demand: network.cpu_cores_demand(&search.metrics),
        threads: search.threads,
        metrics: search.metrics,
        bottleneck,
        stop,
        feasible: load.utilization <= limit * (1.0 + LIMIT_EPSILON) && within_budget,
        thread_budget: search.thread_budget,
        fixed_nodes,
        warnings: Vec::new(),
        evaluations: search.evaluations,
    };
    plan.warnings = plan_warnings(network, &plan);
    Ok(plan)
}

fn fixed_node_loads(
    network: &Network,
    threads: &[u32],
    metrics: &[NodeMetrics],
) -> Vec<FixedNodeLoad> {
    let nodes = network.nodes();
    (0..nodes.len())
        .filter(|&index| nodes[index].fixed_threads.is_some())
        .map(|index| {
            let capacity_per_s = f64::from(threads[index]) * nodes[index].service_rate_per_s;
            let offered_per_s = metrics[index].arrival_rate_per_s;
            FixedNodeLoad {
                node: index,
                threads: threads[index],
                offered_utilization: offered_per_s / capacity_per_s,
                backlog_growth_per_s: (offered_per_s - capacity_per_s).max(0.0),
            }
        })
        .collect()
}

fn plan_warnings(network: &Network, plan: &Plan) -> Vec<String> {
    let limit = network.spec().utilization_limit;
    let mut warnings = Vec::new();
    if plan.options.fixed_nodes == FixedNodes::Published {
        for load in plan.fixed_nodes.iter().filter(|load| load.offered_utilization > limit) {
            let name = &network.nodes()[load.node].name;
            let consequence = if load.offered_utilization > 1.0 {
                format!(
                    "its queue grows by {:.0} jobs/s at the planned rate",
                    load.backlog_growth_per_s
                )
            } else {
                "its queue is stable but waits are long".to_owned()
            };
            warnings.push(format!(
                "node {name} is fixed at {} thread(s) and left out of the utilization check: \
                 offered utilization {:.2} (limit {limit}); {consequence}",
                load.threads, load.offered_utilization
            ));
        }
    }
    if let Some(budget) = plan.thread_budget {
        let threads: u32 = plan.threads.iter().sum();
        if threads > budget {
            warnings.push(format!(
                "the starting configuration (one thread per node, or its fixed count) has \
                 {threads} threads; the thread budget is {budget} ({} cores rounded down)",
                network.spec().host.cores
            ));
        }
    }
    warnings
}

/// The most loaded resource at some rate.
#[derive(Debug, Clone, Copy)]
struct Load {
    worst: Resource,
    utilization: f64,
}

struct Search<'a> {
    network: &'a Network,
    options: Options,
    thread_budget: Option<u32>,
    threads: Vec<u32>,
    metrics: Vec<NodeMetrics>,
    memory_bytes: u64,
    evaluations: u64,
}

fn unbounded_rate() -> PlanError {
    PlanError::BadInput(
        "nothing limits the arrival rate: no checked node and no device reaches the \
         utilization limit at any rate (fixed nodes are left out of the check with the \
         published semantics; let them bound the rate instead)"
            .into(),
    )
}

impl<'a> Search<'a> {
    fn new(network: &'a Network, options: Options) -> Result<Self, PlanError> {
        let nodes = network.nodes();
        let threads: Vec<u32> = nodes.iter().map(|node| node.fixed_threads.unwrap_or(1)).collect();
        let memory_bytes = nodes
            .iter()
            .zip(&threads)
            .map(|(node, &t)| u64::from(t) * node.memory_bytes_per_thread)
            .sum();
        let host = &network.spec().host;
        if let Some(limit) = host.memory_bytes
            && memory_bytes > limit
        {
            return Err(PlanError::BadInput(format!(
                "the starting configuration needs {memory_bytes} bytes of memory; the host has {limit}"
            )));
        }
        Ok(Self {
            network,
            options,
            thread_budget: options.thread_budget(host.cores),
            metrics: vec![NodeMetrics::default(); nodes.len()],
            threads,
            memory_bytes,
            evaluations: 0,
        })
    }

    fn thread_count(&self) -> u32 {
        self.threads.iter().sum()
    }

    /// Whether node `index` is held under the limit (published: fixed nodes are not).
    fn checked(&self, index: usize) -> bool {
        self.options.fixed_nodes == FixedNodes::BoundsRate
            || self.network.nodes()[index].fixed_threads.is_none()
    }

    /// Solves the network at `rate` and returns its most loaded checked resource.
    fn load_at(&mut self, rate_per_s: f64) -> Result<Load, PlanError> {
        self.network.evaluate(rate_per_s, &self.threads, &mut self.metrics)?;
        self.evaluations += 1;
        let mut load = Load { worst: Resource::Node(0), utilization: f64::NEG_INFINITY };
        for (index, metrics) in self.metrics.iter().enumerate() {
            if self.checked(index) && metrics.utilization > load.utilization {
                load = Load { worst: Resource::Node(index), utilization: metrics.utilization };
            }
        }
        let host = &self.network.spec().host;
        let demand = self.network.device_demand(&self.metrics);
        // Under the thread budget a thread owns its core, so CPU demand is not a device.
        let cores = (self.options.budget == Budget::Cpu).then_some(host.cores);
        let devices = [
            (Resource::Cpu, self.network.cpu_cores_demand(&self.metrics), cores),
            (Resource::Disk, demand.disk_bytes_per_s, host.disk_bytes_per_s),
            (Resource::Network, demand.network_bytes_per_s, host.network_bytes_per_s),
        ];
        for (resource, demand, capacity) in devices {
            if let Some(capacity) = capacity
                && demand / capacity > load.utilization
            {
                load = Load { worst: resource, utilization: demand / capacity };
            }
        }
        Ok(load)
    }

    /// The most utilized checked non-fixed node over the limit, or why none can take a thread.
    fn consolidate(&mut self, rate_per_s: f64) -> Result<(Resource, StopReason), PlanError> {
        let limit = self.network.spec().utilization_limit;
        loop {
            let load = self.load_at(rate_per_s)?;
            if load.utilization <= limit {
                return Ok((load.worst, StopReason::AllUnderLimit));
            }
            match load.worst {
                Resource::Node(_) => {}
                Resource::Cpu => return Ok((load.worst, StopReason::CoreBudget)),
                Resource::Disk | Resource::Network => {
                    return Ok((load.worst, StopReason::Bandwidth));
                }
            }
            let candidate = self
                .metrics
                .iter()
                .enumerate()
                .filter(|(index, m)| {
                    m.utilization > limit && self.network.nodes()[*index].fixed_threads.is_none()
                })
                .max_by(|a, b| a.1.utilization.total_cmp(&b.1.utilization))
                .map(|(index, _)| index);
            let Some(node) = candidate else {
                return Ok((load.worst, StopReason::FixedNode));
            };
            if let Err(stop) = self.add_thread(node) {
                return Ok((Resource::Node(node), stop));
            }
        }
    }

    fn maximize_throughput(&mut self) -> Result<(f64, Resource, StopReason), PlanError> {
        let mut hint_per_s = self.network.saturation_rate_per_s(&self.threads);
        loop {
            let (rate_per_s, bottleneck) = match self.options.rate_search {
                RateSearch::Bisection => self.max_rate_bisection(hint_per_s)?,
                RateSearch::Step(step) => self.max_rate_stepping(hint_per_s, step)?,
            };
            let stop = match bottleneck {
                Resource::Node(node) => self.add_thread(node).err(),
                Resource::Cpu => Some(StopReason::CoreBudget),
                Resource::Disk | Resource::Network => Some(StopReason::Bandwidth),
            };
            if let Some(stop) = stop {
                return Ok((rate_per_s, bottleneck, stop));
            }
            hint_per_s = rate_per_s;
        }
    }

    /// The highest rate with every checked resource under the limit, and the resource that
    /// binds just above it. `hint_per_s` is a guess (the previous answer) to bracket from.
    fn max_rate_bisection(&mut self, hint_per_s: f64) -> Result<(f64, Resource), PlanError> {
        let limit = self.network.spec().utilization_limit;
        let mut low = 0.0;
        let mut high = hint_per_s.max(f64::MIN_POSITIVE);
        let mut above = self.load_at(high)?;
        let mut doublings = 0;
        while above.utilization <= limit {
            low = high;
            high *= 2.0;
            doublings += 1;
            if doublings > RATE_DOUBLINGS_MAX {
                return Err(unbounded_rate());
            }
            above = self.load_at(high)?;
        }
        for _ in 0..RATE_BISECTION_STEPS {
            let middle = 0.5 * (low + high);
            let load = self.load_at(middle)?;
            if load.utilization <= limit {
                low = middle;
            } else {
                high = middle;
                above = load;
            }
        }
        Ok((low, above.worst))
    }

    /// The published search: on the grid `hint·(1+step)^k`, the highest rate with every
    /// checked resource under the limit (stepping down from the hint while it is over, then
    /// up while the next step is under), and the resource that binds one step above it.
    /// Starting from the previous answer rather than from zero changes only which grid the
    /// steps lie on, not the thread choices; it saves the steps from zero to there.
    fn max_rate_stepping(
        &mut self,
        hint_per_s: f64,
        step: f64,
    ) -> Result<(f64, Resource), PlanError> {
        let limit = self.network.spec().utilization_limit;
        let factor = 1.0 + step;
        let ceiling_per_s = hint_per_s * 2f64.powi(RATE_DOUBLINGS_MAX as i32);
        let too_small = || {
            PlanError::BadInput(format!(
                "the rate search needs more than {RATE_STEPS_MAX} steps of {step}; \
                 use a larger step or bisection"
            ))
        };
        let mut rate_per_s = hint_per_s.max(f64::MIN_POSITIVE);
        let mut steps = 0;
        while self.load_at(rate_per_s)?.utilization > limit {
            rate_per_s /= factor;
            steps += 1;
            if steps > RATE_STEPS_MAX {
                return Err(too_small());
            }
        }
        loop {
            let next_per_s = rate_per_s * factor;
            let load = self.load_at(next_per_s)?;
            if load.utilization > limit {
                return Ok((rate_per_s, load.worst));
            }
            if next_per_s > ceiling_per_s {
                return Err(unbounded_rate());
            }
            rate_per_s = next_per_s;
            steps += 1;
            if steps > RATE_STEPS_MAX {
                return Err(too_small());
            }
        }
    }

    /// Adds a thread to `node` unless a limit forbids it.
    fn add_thread(&mut self, node: usize) -> Result<(), StopReason> {
        let spec = &self.network.nodes()[node];
        let host = &self.network.spec().host;
        if spec.fixed_threads.is_some() {
            return Err(StopReason::FixedNode);
        }
        if self.threads[node] >= THREADS_PER_NODE_MAX {
            return Err(StopReason::ThreadCap);
        }
        if self.thread_budget.is_some_and(|budget| self.thread_count() >= budget) {
            return Err(StopReason::ThreadBudget);
        }
        let memory_bytes = self.memory_bytes + spec.memory_bytes_per_thread;
        if host.memory_bytes.is_some_and(|limit| memory_bytes > limit) {
            return Err(StopReason::Memory);
        }
        self.threads[node] += 1;
        self.memory_bytes = memory_bytes;
        Ok(())
    }
}

impl Plan {
    /// Name of the bottleneck resource.
    pub fn bottleneck_name<'n>(&self, network: &'n Network) -> &'n str {
        match self.bottleneck {
            Resource::Node(index) => &network.nodes()[index].name,
            Resource::Cpu => "cpu",
            Resource::Disk => "disk",
            Resource::Network => "network",
        }
    }

    /// Node `index`'s utilization as the plan reports it: λ_eff/(c·μ), except for a fixed node
    /// left out of the check, whose offered λ/(c·μ) is reported (above 1: its queue grows).
    pub fn utilization_of(&self, index: usize) -> f64 {
        let unchecked = self.options.fixed_nodes == FixedNodes::Published;
        match self.fixed_nodes.iter().find(|load| load.node == index) {
            Some(load) if unchecked => load.offered_utilization,
            _ => self.metrics[index].utilization,
        }
    }

    /// The pipeline config file for this plan, with its predictions.
    pub fn to_config(&self, network: &Network) -> PipelineConfig {
        let node = network
            .nodes()
            .iter()
            .zip(&self.threads)
            .zip(&self.metrics)
            .map(|((spec, &threads), metrics)| NodeConfig {
                name: spec.name.clone(),
                threads,
                buffer_slots: spec.buffer_slots,
                predicted_utilization: round::measure(metrics.utilization),
                predicted_throughput_per_s: round::measure(metrics.effective_rate_per_s),
                predicted_response_time_s: round::measure(metrics.response_time_s),
                predicted_blocking_probability: round::probability(metrics.blocking_probability),
            })
            .collect();
        PipelineConfig {
            goal: self.goal.into(),
            arrival_rate_per_s: round::measure(self.arrival_rate_per_s),
            bottleneck: self.bottleneck_name(network).into(),
            model: network.spec().clone(),
            node,
        }
    }
}
