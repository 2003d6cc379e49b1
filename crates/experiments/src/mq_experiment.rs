//! `mq experiment`: the standard experiments as single commands. Each starts its nodes in this
//! process (on 127.0.0.1, ephemeral ports) over the given store, runs [`crate::mq_load::run`] per
//! configuration, and prints a table (and a plot/report folder when asked).
//!
//! - `clients`: maximum throughput and response time as the client population grows;
//! - `scale`: scale-up (one node, more handlers and database workers) vs scale-out (more
//!   nodes with the base configuration each);
//! - `size`: response time vs message size;
//! - `factorial`: a 2^2·r design, database workers × group commit, analysed with
//!   [`crate::statistics::factorial_2kr`] (effects, % of variation, confidence intervals).

use crate::plot::LinePlot;
use crate::report::Table;
use crate::statistics::factorial_2kr;
use serde::Serialize;

use mq::server::{self, NodeConfig};
use mq::store::AnyStore;
use mq::{MqError, Result};

use crate::mq_load::{self as load, LoadConfig, LoadResult};

/// The standard experiments.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub enum Experiment {
    Clients,
    Scale,
    Size,
    Factorial,
}

impl Experiment {
    /// Every experiment.
    pub const ALL: [Experiment; 4] =
        [Experiment::Clients, Experiment::Scale, Experiment::Size, Experiment::Factorial];

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Experiment::Clients => "clients",
            Experiment::Scale => "scale",
            Experiment::Size => "size",
            Experiment::Factorial => "factorial",
        }
    }
}

#[derive(Clone, Debug)]
pub struct ExperimentConfig {
    pub store: String,
    pub node: NodeConfig,
    pub load: LoadConfig,
    /// Client populations (clients), levels (scale), or sizes in bytes (size).
    pub levels: Vec<usize>,
    pub replications: usize,
}

/// One measured configuration.
#[derive(Debug, Serialize)]
pub struct Point {
    pub label: String,
    pub level: usize,
    pub result: LoadResult,
}

/// Runs `load` against `nodes` fresh nodes configured by `node`.
async fn measure(
    store: &str,
    node: &NodeConfig,
    nodes: usize,
    load: &LoadConfig,
) -> Result<LoadResult> {
    let mut running = Vec::with_capacity(nodes);
    let mut load = load.clone();
    load.nodes.clear();
    for _ in 0..nodes {
        let s = AnyStore::open(store, node.db_workers).await?;
        let n = server::start("127.0.0.1:0", s, node.clone()).await?;
        load.nodes.push(n.addr.to_string());
        running.push(n);
    }
    let result = load::run(&load).await;
    for n in running {
        n.shutdown().await;
    }
    result
}

pub async fn run(
    kind: Experiment,
    config: &ExperimentConfig,
) -> Result<(Vec<Point>, Vec<Table>, Option<LinePlot>)> {
    match kind {
        Experiment::Clients => {
            sweep(config, "clients", |load, _, level| {
                load.clients = level;
                load.connections = level;
                1
            })
            .await
        }
        Experiment::Size => {
            sweep(config, "message bytes", |load, _, level| {
                load.message_bytes = level;
                1
            })
            .await
        }
        Experiment::Scale => scale(config).await,
        Experiment::Factorial => factorial(config).await,
    }
}

/// One configuration per level; `apply` adjusts the load/node and returns the node count.
async fn sweep(
    config: &ExperimentConfig,
    x_label: &str,
    apply: impl Fn(&mut LoadConfig, &mut NodeConfig, usize) -> usize,
) -> Result<(Vec<Point>, Vec<Table>, Option<LinePlot>)> {
    let mut points = Vec::new();
    for &level in &config.levels {
        let (mut load, mut node) = (config.load.clone(), config.node.clone());
        let nodes = apply(&mut load, &mut node, level);
        let result = measure(&config.store, &node, nodes, &load).await?;
        points.push(Point { label: format!("{x_label}={level}"), level, result });
    }
    let plot = LinePlot::new(&format!("throughput vs {x_label}"), x_label, "requests/s").series(
        "throughput",
        points.iter().map(|p| (p.level as f64, p.result.throughput_per_s)).collect(),
    );
    let table = points_table(&points);
    Ok((points, vec![table], Some(plot)))
}

async fn scale(config: &ExperimentConfig) -> Result<(Vec<Point>, Vec<Table>, Option<LinePlot>)> {
    let mut points = Vec::new();
    for &level in &config.levels {
        let mut up = config.node.clone();
        up.handler_slots *= level;
        up.db_workers *= level;
        let result = measure(&config.store, &up, 1, &config.load).await?;
        points.push(Point { label: format!("scale-up ×{level}"), level, result });
        let result = measure(&config.store, &config.node, level, &config.load).await?;
        points.push(Point { label: format!("scale-out {level} nodes"), level, result });
    }
    let series = |prefix: &str| {
        points
            .iter()
            .filter(|p| p.label.starts_with(prefix))
            .map(|p| (p.level as f64, p.result.throughput_per_s))
            .collect()
    };
    let plot = LinePlot::new("scale-up vs scale-out", "factor (×resources or nodes)", "requests/s")
        .series("scale-up", series("scale-up"))
        .series("scale-out", series("scale-out"));
    let table = points_table(&points);
    Ok((points, vec![table], Some(plot)))
}

/// 2^2·r: A = database workers (base vs 4×base), B = group commit (batch_max 1 vs base).
async fn factorial(
    config: &ExperimentConfig,
) -> Result<(Vec<Point>, Vec<Table>, Option<LinePlot>)> {
    let factors = ["db_workers", "group_commit"];
    let mut responses = Vec::with_capacity(4);
    let mut points = Vec::new();
    for run in 0..4usize {
        let mut node = config.node.clone();
        node.db_workers =
            if run & 1 == 1 { config.node.db_workers * 4 } else { config.node.db_workers };
        node.batch_max = if run & 2 == 2 { config.node.batch_max } else { 1 };
        let mut replications = Vec::with_capacity(config.replications);
        for r in 0..config.replications {
            let result = measure(&config.store, &node, 1, &config.load).await?;
            replications.push(result.throughput_per_s);
            let label = format!("workers={} batch_max={} rep={r}", node.db_workers, node.batch_max);
            points.push(Point { label, level: run, result });
        }
        responses.push(replications);
    }
    let analysis = factorial_2kr(&factors, &responses, load::CONFIDENCE)
        .map_err(|e| MqError::Failed(format!("analysing the experiment: {e}")))?;
    let mut effects =
        Table::new(["effect", "q (req/s)", "% variation", "95% CI"]).with_title(format!(
            "2^2·{} factorial on throughput (mean {:.0} req/s, error {:.1}% of variation)",
            config.replications, analysis.mean, analysis.error_percent
        ));
    for e in &analysis.effects {
        let ci = match (e.ci_low, e.ci_high) {
            (Some(l), Some(h)) => format!("[{l:.0}, {h:.0}]"),
            _ => "n/a (r = 1)".into(),
        };
        effects.row([
            e.name.clone(),
            format!("{:.0}", e.value),
            format!("{:.1}", e.variation_percent),
            ci,
        ]);
    }
    let table = points_table(&points);
    Ok((points, vec![table, effects], None))
}

fn points_table(points: &[Point]) -> Table {
    let mut t = Table::new([
        "configuration",
        "req/s",
        "95% CI",
        "mean µs",
        "p99 µs",
        "db util",
        "bottleneck",
        "sanity",
    ]);
    for p in points {
        let r = &p.result;
        let ci = r.throughput_ci.map_or("n/a".into(), |(l, h)| format!("[{l:.0}, {h:.0}]"));
        t.row([
            p.label.clone(),
            format!("{:.0}", r.throughput_per_s),
            ci,
            format!("{:.0}", r.response_mean_ns / 1e3),
            format!("{:.0}", r.response.p99_ns as f64 / 1e3),
            format!("{:.2}", r.db_utilization),
            r.bottleneck.split(':').next().unwrap_or("").to_owned(),
            if r.sanity_ok { "ok".into() } else { "FAILED".into() },
        ]);
    }
    t
}
