//! The thread optimizer (the paper's algorithm, with a CPU-demand core budget).
//!
//! Both goals start from one thread per node (or the node's fixed count) and add one thread at
//! a time to the node that limits the goal, so every added thread is one the goal needed:
//! - **consolidation**: at a given source rate, while some node is above the utilization limit,
//!   add a thread to the most utilized non-fixed one. A node only ever gains threads while it
//!   is over the limit at an arrival rate no higher than its final one, so each node ends with
//!   the fewest threads that keep it under the limit.
//! - **throughput**: find the highest source rate at which every node, the disk and the network
//!   stay under the limit (bisection: utilizations rise monotonically with the source rate), then
//!   add a thread to the node that binds; repeat until the binding resource cannot grow.
//!
//! The core budget constrains CPU *demand*, not the thread count: the host's cores are one more
//! shared device whose utilization is `Σ_i (λ_eff,i / μ_i) · cpu_share_i / cores` (busy
//! threads times the CPU share of their work), held under the same limit as every node. An
//! I/O-bound node (small `cpu_share`) may therefore run more threads than there are cores,
//! while CPU-bound nodes cannot be given more busy threads than the cores carry. Both goals
//! stop cleanly, naming the reason, at the core budget, the memory limit, the disk or network
//! bandwidth, or a fixed bottleneck node.

use crate::error::PlanError;
use crate::error::PlanError::BadInput;
use serde::Serialize;

use crate::model::{NodeConfig, PipelineConfig};
use crate::network::Network;
use crate::node::NodeMetrics;

/// Bisection steps for the highest sustainable rate (relative precision ~2^-40).
const RATE_BISECTION_STEPS: u32 = 40;
/// Doublings allowed while looking for a rate above the limit.
const RATE_DOUBLINGS_MAX: u32 = 200;
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
    /// Consolidation reached its goal: every node is under the limit.
    AllUnderLimit,
    /// CPU demand reached the limit of the core budget; more threads cannot raise the rate.
    CoreBudget,
    /// Another thread on the bottleneck node would exceed the host's memory.
    Memory,
    /// The bottleneck node has a fixed thread count.
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
            Self::AllUnderLimit => "every node is under the utilization limit",
            Self::CoreBudget => "CPU demand is at the limit of the core budget",
            Self::Memory => "another thread on the bottleneck would exceed the host's memory",
            Self::FixedNode => "the bottleneck node has a fixed thread count",
            Self::Bandwidth => "the bottleneck is device bandwidth, which threads cannot raise",
            Self::ThreadCap => "the bottleneck node reached the per-node thread cap",
        }
    }
}

/// The optimizer's answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    /// `throughput` or `consolidation`.
    pub goal: &'static str,
    /// The source rate the plan is for.
    pub arrival_rate_per_s: f64,
    /// Threads per node, in model order.
    pub threads: Vec<u32>,
    /// Each node's metrics at `arrival_rate_per_s`.
    pub metrics: Vec<NodeMetrics>,
    /// The resource with the highest utilization (the one at the limit for `throughput`).
    pub bottleneck: Resource,
    /// Why thread adding stopped.
    pub stop: StopReason,
    /// Whether every node and device is under the limit at `arrival_rate_per_s`.
    pub feasible: bool,
    /// CPU demand at `arrival_rate_per_s`, in cores: Σ busy threads · cpu_share.
    pub cpu_cores_demand: f64,
    /// Asymptotic bound: source rate at which the first node saturates (min c·μ/v).
    pub saturation_rate_per_s: f64,
    /// Asymptotic bound: the least possible end-to-end time (longest service chain).
    pub min_response_time_s: f64,
    /// Network solves performed (for the optimizer's own cost).
    pub evaluations: u64,
}

/// Runs the optimizer on a validated network.
pub fn optimize(network: &Network, goal: Goal) -> Result<Plan, PlanError> {
    let mut search = Search::new(network)?;
    let (arrival_rate_per_s, bottleneck, stop) = match goal {
        Goal::Consolidation { arrival_rate_per_s } => {
            if !(arrival_rate_per_s.is_finite() && arrival_rate_per_s > 0.0) {
                return Err(BadInput(format!(
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
    let cpu_cores_demand = network.cpu_cores_demand(&search.metrics);
    Ok(Plan {
        goal: match goal {
            Goal::Consolidation { .. } => "consolidation",
            Goal::Throughput => "throughput",
        },
        arrival_rate_per_s,
        saturation_rate_per_s: network.saturation_rate_per_s(&search.threads),
        min_response_time_s: network.min_response_time_s(),
        threads: search.threads,
        metrics: search.metrics,
        bottleneck,
        stop,
        feasible: load.utilization <= limit * (1.0 + LIMIT_EPSILON),
        cpu_cores_demand,
        evaluations: search.evaluations,
    })
}

/// The most loaded resource at some rate.
#[derive(Debug, Clone, Copy)]
struct Load {
    worst: Resource,
    utilization: f64,
}

struct Search<'a> {
    network: &'a Network,
    threads: Vec<u32>,
    metrics: Vec<NodeMetrics>,
    memory_bytes: u64,
    evaluations: u64,
}

impl<'a> Search<'a> {
    fn new(network: &'a Network) -> Result<Self, PlanError> {
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
            return Err(BadInput(format!(
                "the starting configuration needs {memory_bytes} bytes of memory; the host has {limit}"
            )));
        }
        Ok(Self {
            network,
            metrics: vec![NodeMetrics::default(); nodes.len()],
            threads,
            memory_bytes,
            evaluations: 0,
        })
    }

    /// Solves the network at `rate` and returns its most loaded resource.
    fn load_at(&mut self, rate_per_s: f64) -> Result<Load, PlanError> {
        self.network.evaluate(rate_per_s, &self.threads, &mut self.metrics)?;
        self.evaluations += 1;
        let mut load = Load { worst: Resource::Node(0), utilization: f64::NEG_INFINITY };
        for (index, metrics) in self.metrics.iter().enumerate() {
            if metrics.utilization > load.utilization {
                load = Load { worst: Resource::Node(index), utilization: metrics.utilization };
            }
        }
        let host = &self.network.spec().host;
        let demand = self.network.device_demand(&self.metrics);
        let devices = [
            (Resource::Cpu, self.network.cpu_cores_demand(&self.metrics), Some(host.cores)),
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

    /// The most utilized non-fixed node over the limit, or why none can take a thread.
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
            let (rate_per_s, bottleneck) = self.max_rate(hint_per_s)?;
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

    /// The highest rate with every resource under the limit, and the resource that binds
    /// just above it. `hint_per_s` is a guess (the previous answer) to bracket from.
    fn max_rate(&mut self, hint_per_s: f64) -> Result<(f64, Resource), PlanError> {
        let limit = self.network.spec().utilization_limit;
        let mut low = 0.0;
        let mut high = hint_per_s.max(f64::MIN_POSITIVE);
        let mut above = self.load_at(high)?;
        let mut doublings = 0;
        while above.utilization <= limit {
            low = high;
            high *= 2.0;
            doublings += 1;
            assert!(doublings <= RATE_DOUBLINGS_MAX, "utilization must reach a limit below 1");
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
                predicted_utilization: metrics.utilization,
                predicted_throughput_per_s: metrics.effective_rate_per_s,
                predicted_response_time_s: metrics.response_time_s,
                predicted_blocking_probability: metrics.blocking_probability,
            })
            .collect();
        PipelineConfig {
            goal: self.goal.into(),
            arrival_rate_per_s: self.arrival_rate_per_s,
            bottleneck: self.bottleneck_name(network).into(),
            model: network.spec().clone(),
            node,
        }
    }
}
