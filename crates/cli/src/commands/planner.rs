//! `leantier plan ...`: measure a pipeline, solve a node, optimize thread counts.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::outcome::BadInput;
use clap::{Args as ClapArgs, Subcommand, ValueEnum};
use lab::report::{Markdown, ReportDir, Table};

use planner::measure::Workload;
use planner::model::NetworkSpec;
use planner::network::Network;
use planner::node::MmcK;
use planner::optimize::{Goal, Plan, optimize};

/// Capacity planning: queueing models and the thread optimizer.
#[derive(Debug, ClapArgs)]
pub struct Args {
    #[command(subcommand)]
    pub command: Command,
}

/// The planner's subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Measure each node of a pipeline alone on this host and write a model file.
    Measure(MeasureArgs),
    /// Compute thread counts for a model file and write a pipeline config file.
    Optimize(OptimizeArgs),
    /// Solve one M/M/c/K node and print its measures.
    Node(NodeArgs),
}

/// `plan measure`.
#[derive(Debug, ClapArgs)]
pub struct MeasureArgs {
    /// The pipeline to measure (e.g. `cdr`).
    pub workload: String,
    /// Seconds each node runs alone.
    #[arg(long, default_value_t = 1.0)]
    pub duration_s: f64,
    /// Where to write the model file.
    #[arg(long, default_value = "cdr-model.toml")]
    pub out: PathBuf,
    /// Folder for the nodes' scratch files (output files, databases, the disk probe).
    #[arg(long)]
    pub scratch_dir: Option<PathBuf>,
    /// A workload setting, `KEY=VALUE` (repeatable); for cdr: `fsync_every_records`,
    /// `malformed_every`, `feed_batch_rows`, `database_url`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub settings: Vec<String>,
}

/// The optimizer's goal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GoalArg {
    /// The highest arrival rate the core budget sustains under the utilization limit.
    Throughput,
    /// The fewest threads that keep every node under the limit at `--rate`.
    Consolidation,
}

/// `plan optimize`.
#[derive(Debug, ClapArgs)]
pub struct OptimizeArgs {
    /// The model file (from `plan measure`, or written by hand).
    #[arg(long)]
    pub model: PathBuf,
    /// What to optimize for.
    #[arg(long, value_enum, default_value = "throughput")]
    pub goal: GoalArg,
    /// Source rate in tickets per second (required for consolidation).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Override the model's utilization limit (0..1).
    #[arg(long)]
    pub limit: Option<f64>,
    /// Override the model's core budget.
    #[arg(long)]
    pub cores: Option<f64>,
    /// Fix a node's thread count, `NAME=THREADS` (repeatable).
    #[arg(long = "fix", value_name = "NAME=THREADS")]
    pub fixed: Vec<String>,
    /// Where to write the pipeline config file.
    #[arg(long, default_value = "cdr-config.toml")]
    pub out: PathBuf,
    /// Also write the plan as JSON and Markdown into this folder.
    #[arg(long)]
    pub report: Option<PathBuf>,
}

/// `plan node`.
#[derive(Debug, ClapArgs)]
pub struct NodeArgs {
    /// Arrival rate λ, jobs per second.
    #[arg(long)]
    pub arrival_rate: f64,
    /// Service rate μ of one server, jobs per second.
    #[arg(long)]
    pub service_rate: f64,
    /// Servers c.
    #[arg(long, default_value_t = 1)]
    pub servers: u32,
    /// Capacity K: jobs in service plus waiting.
    #[arg(long)]
    pub capacity: u64,
}

/// Runs a `plan` subcommand; `workloads` are the pipelines `plan measure` can measure.
pub fn run(args: &Args, workloads: &[&dyn Workload]) -> anyhow::Result<()> {
    match &args.command {
        Command::Measure(measure) => run_measure(measure, workloads),
        Command::Optimize(optimize_args) => run_optimize(optimize_args),
        Command::Node(node) => run_node(node),
    }
}

fn run_measure(args: &MeasureArgs, workloads: &[&dyn Workload]) -> anyhow::Result<()> {
    let Some(workload) = workloads.iter().find(|w| w.name() == args.workload) else {
        let known: Vec<&str> = workloads.iter().map(|w| w.name()).collect();
        return Err(BadInput(format!(
            "unknown workload {}; known: {}",
            args.workload,
            known.join(", ")
        ))
        .into());
    };
    if !(args.duration_s.is_finite() && args.duration_s > 0.0) {
        return Err(BadInput(format!("--duration-s must be > 0, got {}", args.duration_s)).into());
    }
    let scratch = match &args.scratch_dir {
        Some(dir) => dir.clone(),
        None => std::env::temp_dir().join(format!("leantier-measure-{}", std::process::id())),
    };
    let mut settings = Vec::new();
    for item in &args.settings {
        let (key, value) = item
            .split_once('=')
            .ok_or_else(|| BadInput(format!("--set expects KEY=VALUE, got {item}")))?;
        settings.push((key.to_string(), value.to_string()));
    }
    std::fs::create_dir_all(&scratch)?;
    let spec = workload.measure(Duration::from_secs_f64(args.duration_s), &scratch, &settings);
    if args.scratch_dir.is_none() {
        std::fs::remove_dir_all(&scratch)?;
    }
    let spec = spec?;
    print!("{}", model_table(&spec));
    std::fs::write(&args.out, toml::to_string(&spec)?)?;
    println!("model written to {}", args.out.display());
    Ok(())
}

fn model_table(spec: &NetworkSpec) -> Table {
    let host = &spec.host;
    let mut table = Table::new(["node", "μ per thread (/s)", "cpu share", "buffer", "fixed"])
        .with_title(format!(
            "measured model: {} cores, disk {}, memory {}",
            host.cores,
            host.disk_bytes_per_s.map_or("-".into(), |b| format!("{:.0} MB/s", b / 1e6)),
            host.memory_bytes.map_or("-".into(), |b| format!("{:.1} GiB", b as f64 / 1073741824.0)),
        ));
    for node in &spec.node {
        table.row([
            node.name.clone(),
            format!("{:.0}", node.service_rate_per_s),
            format!("{:.2}", node.cpu_share),
            node.buffer_slots.to_string(),
            node.fixed_threads.map_or("-".into(), |t| t.to_string()),
        ]);
    }
    table
}

fn load_network(args: &OptimizeArgs) -> anyhow::Result<Network> {
    if !args.model.exists() {
        return Err(BadInput(format!("model file {} does not exist", args.model.display())).into());
    }
    let mut spec: NetworkSpec = lab::config::load_toml(Some(&args.model))?;
    lab::config::override_with(&mut spec.utilization_limit, &args.limit);
    lab::config::override_with(&mut spec.host.cores, &args.cores);
    for fix in &args.fixed {
        let (name, threads) = fix
            .split_once('=')
            .ok_or_else(|| BadInput(format!("--fix expects NAME=THREADS, got {fix}")))?;
        let threads: u32 =
            threads.parse().map_err(|_| BadInput(format!("--fix {fix}: bad thread count")))?;
        let node = spec
            .node
            .iter_mut()
            .find(|node| node.name == name)
            .ok_or_else(|| BadInput(format!("--fix {fix}: unknown node name {name}")))?;
        node.fixed_threads = Some(threads);
    }
    Ok(Network::new(spec)?)
}

fn run_optimize(args: &OptimizeArgs) -> anyhow::Result<()> {
    let network = load_network(args)?;
    let goal = match (args.goal, args.rate) {
        (GoalArg::Throughput, _) => Goal::Throughput,
        (GoalArg::Consolidation, Some(arrival_rate_per_s)) => {
            Goal::Consolidation { arrival_rate_per_s }
        }
        (GoalArg::Consolidation, None) => {
            return Err(BadInput("--goal consolidation needs --rate".into()).into());
        }
    };
    let started = std::time::Instant::now();
    let plan = optimize(&network, goal)?;
    let elapsed_ms = started.elapsed().as_secs_f64() * 1e3;
    let table = plan_table(&network, &plan);
    print!("{table}");
    println!(
        "bottleneck: {} ({}); CPU demand {:.2} of {} cores; bounds: saturation {:.0}/s, \
         min response {:.3} ms; {} network solves in {elapsed_ms:.1} ms",
        plan.bottleneck_name(&network),
        plan.stop.describe(),
        plan.cpu_cores_demand,
        network.spec().host.cores,
        plan.saturation_rate_per_s,
        plan.min_response_time_s * 1e3,
        plan.evaluations,
    );
    if !plan.feasible {
        println!("warning: no configuration within the limits carries this rate");
    }
    let config = plan.to_config(&network);
    std::fs::write(&args.out, toml::to_string(&config)?)?;
    println!("config written to {}", args.out.display());
    if let Some(dir) = &args.report {
        write_report(dir, &table, &plan)?;
    }
    Ok(())
}

fn write_report(dir: &Path, table: &Table, plan: &Plan) -> anyhow::Result<()> {
    let report = ReportDir::create(dir)?;
    report.write_json("plan.json", plan)?;
    report.write_csv("plan.csv", table)?;
    let mut markdown = Markdown::new();
    markdown.heading(1, "Thread plan").table(table);
    report.write_markdown("plan.md", markdown.as_str())?;
    println!("report written to {}", dir.display());
    Ok(())
}

/// The per-node table of a plan.
pub fn plan_table(network: &Network, plan: &Plan) -> Table {
    let mut table = Table::new([
        "node",
        "threads",
        "fixed",
        "utilization",
        "throughput/s",
        "W (ms)",
        "P_K",
        "loss/s",
    ])
    .with_title(format!("{} plan at {:.0} tickets/s", plan.goal, plan.arrival_rate_per_s));
    for ((node, threads), metrics) in network.nodes().iter().zip(&plan.threads).zip(&plan.metrics) {
        table.row([
            node.name.clone(),
            threads.to_string(),
            if node.fixed_threads.is_some() { "yes" } else { "no" }.into(),
            format!("{:.3}", metrics.utilization),
            format!("{:.0}", metrics.effective_rate_per_s),
            format!("{:.4}", metrics.response_time_s * 1e3),
            format!("{:.2e}", metrics.blocking_probability),
            format!("{:.2}", metrics.loss_rate_per_s),
        ]);
    }
    table
}

fn run_node(args: &NodeArgs) -> anyhow::Result<()> {
    let model = MmcK::new(args.arrival_rate, args.service_rate, args.servers, args.capacity)?;
    let m = *model.solve().metrics();
    let mut table = Table::new(["measure", "value"]).with_title("M/M/c/K node");
    for (name, value) in [
        ("P0", m.idle_probability),
        ("P_K (blocking)", m.blocking_probability),
        ("λ_eff (/s)", m.effective_rate_per_s),
        ("loss rate (/s)", m.loss_rate_per_s),
        ("utilization", m.utilization),
        ("L", m.jobs_in_node),
        ("Lq", m.jobs_in_queue),
        ("W (s)", m.response_time_s),
        ("Wq (s)", m.waiting_time_s),
    ] {
        table.row([name.to_string(), format!("{value:.6}")]);
    }
    print!("{table}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(model: PathBuf, fixed: &[&str]) -> OptimizeArgs {
        OptimizeArgs {
            model,
            goal: GoalArg::Throughput,
            rate: None,
            limit: None,
            cores: Some(4.0),
            fixed: fixed.iter().map(|f| f.to_string()).collect(),
            out: PathBuf::from("unused.toml"),
            report: None,
        }
    }

    #[test]
    fn model_file_flags_and_bad_input() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.toml");
        std::fs::write(
            &path,
            "[host]\ncores = 1.0\n[[node]]\nname = \"a\"\nservice_rate_per_s = 10.0\n\
             external_share = 1.0\n[[node]]\nname = \"b\"\nservice_rate_per_s = 5.0\n\
             [[route]]\nfrom = \"a\"\nto = \"b\"\n",
        )
        .unwrap();
        let network = load_network(&args(path.clone(), &["b=2"])).unwrap();
        assert_eq!(network.spec().host.cores, 4.0, "--cores overrides the file");
        assert_eq!(network.nodes()[1].fixed_threads, Some(2));
        for fixed in ["b", "b=x", "c=1"] {
            let error = load_network(&args(path.clone(), &[fixed])).unwrap_err();
            assert!(error.downcast_ref::<BadInput>().is_some(), "{fixed}: {error}");
        }
        let missing = load_network(&args(dir.path().join("nope.toml"), &[])).unwrap_err();
        assert!(missing.to_string().contains("does not exist"), "{missing}");
    }
}
