//! Open feed-forward networks of M/M/c/K nodes.
//!
//! Nodes are solved in topological order. A node's offered rate is its external share of the
//! source rate plus, for every route into it, the upstream node's *accepted* rate times the
//! route's jobs per job, so arrivals are thinned by upstream blocking. Fan-out (one job copied
//! to several successors) is a route per successor; the decomposition treats each node's input
//! as Poisson, the standard approximation for such networks.

use crate::error::PlanError;

use crate::model::{NetworkSpec, NodeSpec};
use crate::node::{MmcK, NodeMetrics};

/// A validated network: known names, sane parameters, no cycle.
#[derive(Debug, Clone)]
pub struct Network {
    spec: NetworkSpec,
    /// Node indices in an order where every route goes forward.
    order: Vec<usize>,
    /// For each node, its routes in: (upstream index, jobs per job).
    inbound: Vec<Vec<(usize, f64)>>,
}

/// Per-second demand on the host's shared devices at some source rate.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct DeviceDemand {
    /// Disk bytes written per second.
    pub disk_bytes_per_s: f64,
    /// Network bytes sent per second.
    pub network_bytes_per_s: f64,
}

fn check_node(node: &NodeSpec) -> Result<(), PlanError> {
    let name = &node.name;
    let positive = |value: f64| value.is_finite() && value > 0.0;
    let non_negative = |value: f64| value.is_finite() && value >= 0.0;
    if !positive(node.service_rate_per_s) {
        return Err(PlanError::BadInput(format!(
            "node {name}: service_rate_per_s (μ) must be > 0, got {}",
            node.service_rate_per_s
        )));
    }
    if !(positive(node.cpu_share) && node.cpu_share <= 1.0) {
        return Err(PlanError::BadInput(format!(
            "node {name}: cpu_share must be in (0, 1], got {}",
            node.cpu_share
        )));
    }
    let rates = [
        ("external_share", node.external_share),
        ("disk_bytes_per_job", node.disk_bytes_per_job),
        ("network_bytes_per_job", node.network_bytes_per_job),
    ];
    for (field, value) in rates {
        if !non_negative(value) {
            return Err(PlanError::BadInput(format!(
                "node {name}: {field} must be >= 0, got {value}"
            )));
        }
    }
    if node.fixed_threads == Some(0) {
        return Err(PlanError::BadInput(format!("node {name}: fixed_threads must be >= 1")));
    }
    Ok(())
}

fn check_host(spec: &NetworkSpec) -> Result<(), PlanError> {
    let limit = spec.utilization_limit;
    if !(limit > 0.0 && limit < 1.0) {
        return Err(PlanError::BadInput(format!(
            "utilization_limit must be in (0, 1), got {limit}"
        )));
    }
    let host = &spec.host;
    if !(host.cores.is_finite() && host.cores > 0.0) {
        return Err(PlanError::BadInput(format!("host.cores must be > 0, got {}", host.cores)));
    }
    for (field, value) in [
        ("disk_bytes_per_s", host.disk_bytes_per_s),
        ("network_bytes_per_s", host.network_bytes_per_s),
    ] {
        if let Some(value) = value
            && !(value.is_finite() && value > 0.0)
        {
            return Err(PlanError::BadInput(format!("host.{field} must be > 0, got {value}")));
        }
    }
    Ok(())
}

impl Network {
    /// Validates the model: μ > 0, shares and byte counts ≥ 0, unique node names, routes
    /// between known nodes, no cycle, at least one node with external arrivals.
    pub fn new(spec: NetworkSpec) -> Result<Self, PlanError> {
        check_host(&spec)?;
        if spec.node.is_empty() {
            return Err(PlanError::BadInput("the model has no [[node]]".into()));
        }
        for (index, node) in spec.node.iter().enumerate() {
            check_node(node)?;
            if spec.node[..index].iter().any(|other| other.name == node.name) {
                return Err(PlanError::BadInput(format!("node name {} is used twice", node.name)));
            }
        }
        if spec.node.iter().all(|node| node.external_share == 0.0) {
            return Err(PlanError::BadInput(
                "no node has external_share > 0: nothing enters the network".into(),
            ));
        }
        let inbound = inbound_routes(&spec)?;
        let order = topological_order(&spec, &inbound)?;
        Ok(Self { spec, order, inbound })
    }

    /// The validated model.
    pub fn spec(&self) -> &NetworkSpec {
        &self.spec
    }

    /// The nodes, in model order (the order of every per-node slice).
    pub fn nodes(&self) -> &[NodeSpec] {
        &self.spec.node
    }

    /// Index of the node called `name`.
    pub fn index_of(&self, name: &str) -> Result<usize, PlanError> {
        self.spec
            .node
            .iter()
            .position(|node| node.name == name)
            .ok_or_else(|| PlanError::BadInput(format!("unknown node name {name}")))
    }

    /// Solves every node at `source_rate_per_s` with `threads[i]` threads at node `i`.
    pub fn evaluate(
        &self,
        source_rate_per_s: f64,
        threads: &[u32],
        metrics: &mut [NodeMetrics],
    ) -> Result<(), PlanError> {
        assert_eq!(threads.len(), self.spec.node.len(), "one thread count per node");
        assert_eq!(metrics.len(), self.spec.node.len(), "one metrics slot per node");
        for &index in &self.order {
            let node = &self.spec.node[index];
            let upstream: f64 = self.inbound[index]
                .iter()
                .map(|&(from, jobs_per_job)| metrics[from].effective_rate_per_s * jobs_per_job)
                .sum();
            let arrival_rate_per_s = source_rate_per_s * node.external_share + upstream;
            let capacity_jobs = u64::from(threads[index]).saturating_add(node.buffer_slots);
            let model = MmcK::new(
                arrival_rate_per_s,
                node.service_rate_per_s,
                threads[index],
                capacity_jobs,
            )
            .map_err(|error| PlanError::BadInput(format!("node {}: {error}", node.name)))?;
            metrics[index] = *model.solve().metrics();
        }
        Ok(())
    }

    /// Jobs each node receives per source job when nothing is blocked.
    pub fn visit_ratios(&self) -> Vec<f64> {
        let mut visits = vec![0.0; self.spec.node.len()];
        for &index in &self.order {
            let upstream: f64 =
                self.inbound[index].iter().map(|&(from, share)| visits[from] * share).sum();
            visits[index] = self.spec.node[index].external_share + upstream;
        }
        visits
    }

    /// Asymptotic bound: the source rate at which the first node saturates (min c·μ/v),
    /// ignoring blocking.
    pub fn saturation_rate_per_s(&self, threads: &[u32]) -> f64 {
        self.visit_ratios()
            .iter()
            .zip(&self.spec.node)
            .zip(threads)
            .filter(|((visits, _), _)| **visits > 0.0)
            .map(|((visits, node), &threads)| f64::from(threads) * node.service_rate_per_s / visits)
            .fold(f64::INFINITY, f64::min)
    }

    /// Asymptotic bound: the longest chain of mean service times from an entry to an exit (a
    /// fanned-out job is done when its slowest branch is).
    pub fn min_response_time_s(&self) -> f64 {
        let mut finish_s = vec![0.0_f64; self.spec.node.len()];
        for &index in &self.order {
            let start_s =
                self.inbound[index].iter().map(|&(from, _)| finish_s[from]).fold(0.0, f64::max);
            finish_s[index] = start_s + 1.0 / self.spec.node[index].service_rate_per_s;
        }
        finish_s.into_iter().fold(0.0, f64::max)
    }

    /// Cores kept busy by solved metrics: Σ (λ_eff / μ) · cpu_share over the nodes.
    pub fn cpu_cores_demand(&self, metrics: &[NodeMetrics]) -> f64 {
        self.spec
            .node
            .iter()
            .zip(metrics)
            .map(|(node, m)| m.effective_rate_per_s / node.service_rate_per_s * node.cpu_share)
            .sum()
    }

    /// Disk and network bytes per second implied by solved metrics.
    pub fn device_demand(&self, metrics: &[NodeMetrics]) -> DeviceDemand {
        let mut demand = DeviceDemand::default();
        for (node, metrics) in self.spec.node.iter().zip(metrics) {
            demand.disk_bytes_per_s += metrics.effective_rate_per_s * node.disk_bytes_per_job;
            demand.network_bytes_per_s += metrics.effective_rate_per_s * node.network_bytes_per_job;
        }
        demand
    }
}

fn inbound_routes(spec: &NetworkSpec) -> Result<Vec<Vec<(usize, f64)>>, PlanError> {
    let index_of = |name: &str| {
        spec.node
            .iter()
            .position(|node| node.name == name)
            .ok_or_else(|| PlanError::BadInput(format!("route names unknown node {name}")))
    };
    let mut inbound = vec![Vec::new(); spec.node.len()];
    for route in &spec.route {
        let from = index_of(&route.from)?;
        let to = index_of(&route.to)?;
        if !(route.jobs_per_job.is_finite() && route.jobs_per_job >= 0.0) {
            return Err(PlanError::BadInput(format!(
                "route {} -> {}: jobs_per_job must be >= 0, got {}",
                route.from, route.to, route.jobs_per_job
            )));
        }
        inbound[to].push((from, route.jobs_per_job));
    }
    Ok(inbound)
}

/// Kahn's algorithm; a leftover node lies on a cycle.
fn topological_order(
    spec: &NetworkSpec,
    inbound: &[Vec<(usize, f64)>],
) -> Result<Vec<usize>, PlanError> {
    let count = spec.node.len();
    let mut pending: Vec<usize> = inbound.iter().map(Vec::len).collect();
    let mut order: Vec<usize> = (0..count).filter(|&index| pending[index] == 0).collect();
    let mut next = 0;
    while next < order.len() {
        let done = order[next];
        next += 1;
        for (to, routes) in inbound.iter().enumerate() {
            for _ in routes.iter().filter(|&&(from, _)| from == done) {
                pending[to] -= 1;
                if pending[to] == 0 {
                    order.push(to);
                }
            }
        }
    }
    if order.len() < count {
        let on_cycle: Vec<&str> = (0..count)
            .filter(|index| pending[*index] > 0)
            .map(|index| spec.node[index].name.as_str())
            .collect();
        return Err(PlanError::BadInput(format!(
            "the routes form a cycle (a feed-forward network has none) through: {}",
            on_cycle.join(", ")
        )));
    }
    Ok(order)
}
