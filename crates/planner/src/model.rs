//! The planner's input (a network model file) and output (a pipeline config file), as TOML.
//!
//! `leantier plan measure` writes a model file; `leantier plan optimize` reads it and writes a
//! config file; a pipeline (`leantier cdr run --config FILE`) reads its thread counts from the
//! config file and compares what it measures with the predictions recorded there.

use serde::{Deserialize, Serialize};

/// The default bound on a node's input queue, in jobs waiting (not counting those in service).
pub const BUFFER_SLOTS_DEFAULT: u64 = 1024;
/// The paper's utilization limit: a node above it gets another thread.
pub const UTILIZATION_LIMIT_DEFAULT: f64 = 0.8;

/// One node of a feed-forward network, as measured on the target host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSpec {
    /// Unique name, referenced by routes and by the pipeline config.
    pub name: String,
    /// Jobs per second one thread completes when never idle (μ).
    pub service_rate_per_s: f64,
    /// CPU time per job divided by wall service time per job: 1.0 for CPU-bound work, less
    /// when the thread waits on I/O. A thread reserves this much of a core.
    #[serde(default = "cpu_bound")]
    pub cpu_share: f64,
    /// Jobs that may wait in the node's input queue; K = threads + buffer_slots.
    #[serde(default = "buffer_slots_default")]
    pub buffer_slots: u64,
    /// Jobs arriving from outside per job of the source rate (1.0 for the entry node).
    #[serde(default)]
    pub external_share: f64,
    /// A thread count the optimizer must not change (e.g. a database feeder whose extra
    /// threads only add contention).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fixed_threads: Option<u32>,
    /// Bytes written to disk per job (checked against the host's disk bandwidth).
    #[serde(default)]
    pub disk_bytes_per_job: f64,
    /// Bytes sent over the network per job (checked against the host's network bandwidth).
    #[serde(default)]
    pub network_bytes_per_job: f64,
    /// Memory each thread of this node needs (stacks, batches, connections).
    #[serde(default)]
    pub memory_bytes_per_thread: u64,
}

impl NodeSpec {
    /// A CPU-bound node with the default buffer, no external arrivals and no limits.
    pub fn new(name: &str, service_rate_per_s: f64) -> Self {
        Self {
            name: name.into(),
            service_rate_per_s,
            cpu_share: 1.0,
            buffer_slots: BUFFER_SLOTS_DEFAULT,
            external_share: 0.0,
            fixed_threads: None,
            disk_bytes_per_job: 0.0,
            network_bytes_per_job: 0.0,
            memory_bytes_per_thread: 0,
        }
    }
}

/// Jobs flow `from` → `to`; each job completed by `from` sends `jobs_per_job` jobs to `to`.
/// Fan-out (a job copied to several successors) is one route per successor at 1.0; a split is
/// several routes whose shares sum to 1.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteSpec {
    /// Upstream node name.
    pub from: String,
    /// Downstream node name.
    pub to: String,
    /// Jobs sent downstream per job completed upstream.
    #[serde(default = "one")]
    pub jobs_per_job: f64,
}

/// The host's resources. Absent limits are not checked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostSpec {
    /// Cores available to the pipeline (CPU demand budget).
    pub cores: f64,
    /// Memory available to the pipeline's threads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    /// Sustained write bandwidth of the output disk (with the pipeline's fsync policy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_bytes_per_s: Option<f64>,
    /// Network bandwidth of the host's interface.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_bytes_per_s: Option<f64>,
}

impl Default for HostSpec {
    fn default() -> Self {
        Self { cores: 1.0, memory_bytes: None, disk_bytes_per_s: None, network_bytes_per_s: None }
    }
}

/// A model file: the host, the nodes and the routes of an open feed-forward network.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NetworkSpec {
    /// Highest utilization the optimizer accepts for a node, the disk or the network.
    pub utilization_limit: f64,
    /// Host resources.
    pub host: HostSpec,
    /// Nodes (`[[node]]` tables).
    pub node: Vec<NodeSpec>,
    /// Routes (`[[route]]` tables).
    pub route: Vec<RouteSpec>,
}

impl Default for NetworkSpec {
    fn default() -> Self {
        Self {
            utilization_limit: UTILIZATION_LIMIT_DEFAULT,
            host: HostSpec::default(),
            node: Vec::new(),
            route: Vec::new(),
        }
    }
}

/// A pipeline config file: the thread count of each node and what the planner predicts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct PipelineConfig {
    /// The goal the plan was made for: `throughput` or `consolidation`.
    pub goal: String,
    /// The source rate the prediction is for (the highest sustainable rate for `throughput`).
    pub arrival_rate_per_s: f64,
    /// Name of the node (or `disk`/`network`) that limits the rate.
    pub bottleneck: String,
    /// The model the plan was computed from, so a run can re-predict at the rate it achieved.
    pub model: NetworkSpec,
    /// Per-node settings and predictions (`[[node]]` tables).
    pub node: Vec<NodeConfig>,
}

/// One node's setting and predicted behaviour.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct NodeConfig {
    /// Node name, as in the model.
    pub name: String,
    /// Threads to run.
    pub threads: u32,
    /// Input queue bound, in jobs.
    pub buffer_slots: u64,
    /// Predicted utilization at `arrival_rate_per_s`.
    pub predicted_utilization: f64,
    /// Predicted throughput (accepted jobs per second).
    pub predicted_throughput_per_s: f64,
    /// Predicted mean time in the node.
    pub predicted_response_time_s: f64,
    /// Predicted blocking probability.
    pub predicted_blocking_probability: f64,
}

impl PipelineConfig {
    /// The thread count configured for `name`.
    pub fn threads_of(&self, name: &str) -> Option<u32> {
        self.node.iter().find(|node| node.name == name).map(|node| node.threads)
    }
}

fn cpu_bound() -> f64 {
    1.0
}

fn one() -> f64 {
    1.0
}

fn buffer_slots_default() -> u64 {
    BUFFER_SLOTS_DEFAULT
}
