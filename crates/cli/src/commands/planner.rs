//! `leantier plan ...`: measure a pipeline, solve a node, optimize thread counts.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::values;
use crate::outcome::{BadInput, TargetMissed};
use clap::{Args as ClapArgs, Subcommand, ValueEnum};
use experiments::report::{Markdown, ReportDir, Table};

use planner::compare::{Comparison, compare};
use planner::measure::Workload;
use planner::model::NetworkSpec;
use planner::network::Network;
use planner::node::MmcK;
use planner::optimize::{Goal, Plan, optimize_with};
use planner::options::{Budget, FixedNodes, Options, RateSearch};

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
    ///
    /// Budgets (`--budget`). `threads`, the default, is the published method's constraint:
    /// Σ threads ≤ cores (rounded down), every thread counted as one core whatever its
    /// utilization. `cpu` is leantier's refinement: the CPU demand Σ (λ_i/μ_i)·cpu_share_i stays
    /// under the utilization limit times the cores, so I/O-bound threads may outnumber the cores.
    ///
    /// Fixed nodes (`--fix`, or `fixed_threads` in the model). By default, as published, a fixed
    /// node is left out of the utilization check: its queue absorbs what it cannot serve and the
    /// other nodes go on growing; the plan reports its offered utilization λ/(c·μ) (above 1 its
    /// queue grows), its backlog growth per second, and a warning. `--fixed-bounds-rate` checks
    /// it like any node, so the rate stops where it reaches the limit.
    ///
    /// Worked example, the paper's host "Goedel" (8 cores, limit 0.8, μ: decoder 30055,
    /// converter 18672, serializer 6146, feeder 94 tickets/s; decoder → converter →
    /// {serializer, feeder}): throughput plans 1-1-1-5 at 376/s with `threads`, 1-1-1-8 with
    /// `cpu`. With `--fix feeder=1` it plans 1-2-4-1 at 19667/s (the feeder offered 209 times
    /// what it serves: a warning), or, with `--fixed-bounds-rate`, 1-1-1-1 at 75/s.
    /// `--compare` prints the published plan and the refinement side by side.
    ///
    /// When no configuration within the limits carries the rate (e.g. more nodes than cores
    /// under the threads budget), it says so, writes no config.toml (`--force` writes it
    /// anyway) and exits 3. Written numbers keep six significant digits; probabilities under
    /// 1e-9 are written as 0.
    Optimize(OptimizeArgs),
    /// Solve one M/M/c/K node and print its measures.
    Node(NodeArgs),
}

/// `plan measure`.
#[derive(Debug, ClapArgs)]
pub struct MeasureArgs {
    /// The pipeline to measure (e.g. `cdr`).
    pub workload: String,
    /// How long each node runs alone, e.g. 1s.
    #[arg(
        long,
        alias = "duration-s",
        value_name = "DURATION",
        value_parser = values::seconds,
        default_value = "1s"
    )]
    pub duration: Duration,
    /// Folder for the model file, `model.toml` (the input of `plan optimize --model`).
    #[arg(long, default_value = "leantier-report/plan-measure")]
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
    /// The model file (`model.toml` from `plan measure`, or written by hand).
    #[arg(long)]
    pub model: PathBuf,
    /// What to optimize for.
    #[arg(long, value_enum, default_value = "throughput")]
    pub goal: GoalArg,
    /// Source rate in tickets per second (required for consolidation).
    #[arg(long, allow_negative_numbers = true)]
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
    /// What the cores bound: `threads` (published: Σ threads ≤ cores) or `cpu` (CPU demand
    /// under the utilization limit).
    #[arg(long, value_enum, default_value = "threads")]
    pub budget: BudgetArg,
    /// Let fixed nodes bound the rate like any node (by default, as published, they are left
    /// out of the utilization check and their queue growth is reported).
    #[arg(long)]
    pub fixed_bounds_rate: bool,
    /// Search the highest rate as published, raising it by the factor (1 + F) per step (e.g.
    /// 0.001), instead of by bisection; the answers agree within one step.
    #[arg(long, value_name = "F")]
    pub rate_step: Option<f64>,
    /// Print the published plan (threads budget, fixed nodes left out) and leantier's
    /// refinement (cpu budget, fixed nodes bound the rate) side by side; writes no config.
    #[arg(long, conflicts_with_all = ["budget", "fixed_bounds_rate", "force"])]
    pub compare: bool,
    /// Write `config.toml` even when no configuration within the limits carries the rate
    /// (the command still exits 3 with its warning: the plan does not hold).
    #[arg(long)]
    pub force: bool,
    /// Folder for the pipeline config file, `config.toml` (the input of `cdr run --config`),
    /// and the plan as JSON, CSV and Markdown.
    #[arg(long, alias = "report", default_value = "leantier-report/plan-optimize")]
    pub out: PathBuf,
}

/// The model file `plan measure` writes into its `--out` folder.
pub const MODEL_FILE: &str = "model.toml";
/// The pipeline config file `plan optimize` writes into its `--out` folder.
pub const CONFIG_FILE: &str = "config.toml";

/// What the cores bound (`--budget`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BudgetArg {
    /// Σ threads ≤ cores, every thread one core (published).
    Threads,
    /// CPU demand ≤ limit × cores (leantier's refinement).
    Cpu,
}

impl From<BudgetArg> for Budget {
    fn from(budget: BudgetArg) -> Budget {
        match budget {
            BudgetArg::Threads => Budget::Threads,
            BudgetArg::Cpu => Budget::Cpu,
        }
    }
}

impl OptimizeArgs {
    /// The optimizer options the flags select.
    pub fn options(&self) -> Options {
        Options {
            budget: self.budget.into(),
            fixed_nodes: if self.fixed_bounds_rate {
                FixedNodes::BoundsRate
            } else {
                FixedNodes::Published
            },
            rate_search: self.rate_step.map_or(RateSearch::Bisection, RateSearch::Step),
        }
    }
}

/// `plan node`.
#[derive(Debug, ClapArgs)]
pub struct NodeArgs {
    /// Arrival rate λ, jobs per second.
    #[arg(long, allow_negative_numbers = true, alias = "arrival-rate")]
    pub rate: f64,
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
    if args.duration.is_zero() {
        return Err(BadInput("--duration must be > 0".into()).into());
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
    let spec = workload.measure(args.duration, &scratch, &settings);
    if args.scratch_dir.is_none() {
        std::fs::remove_dir_all(&scratch)?;
    }
    let spec = spec?;
    print!("{}", model_table(&spec));
    std::fs::create_dir_all(&args.out)?;
    let model = args.out.join(MODEL_FILE);
    std::fs::write(&model, toml::to_string(&spec)?)?;
    println!("model written to {}", model.display());
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
    let mut spec: NetworkSpec = ops::config::load_toml(Some(&args.model))?;
    ops::config::override_with(&mut spec.utilization_limit, &args.limit);
    ops::config::override_with(&mut spec.host.cores, &args.cores);
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
    let options = args.options();
    if args.compare {
        let comparison = compare(&network, goal, options.rate_search)?;
        let table = comparison_table(&network, &comparison);
        print!("{table}");
        for plan in [&comparison.published, &comparison.refined] {
            let (label, binds) = (plan_label(plan), plan.bottleneck_name(&network));
            println!(
                "{label}: {binds} binds, {}; {}",
                plan.stop.describe(),
                budget_use(&network, plan)
            );
            print_warnings(plan);
        }
        return write_report(&args.out, &table, &comparison);
    }
    let started = std::time::Instant::now();
    let plan = optimize_with(&network, goal, options)?;
    let elapsed_ms = started.elapsed().as_secs_f64() * 1e3;
    let table = plan_table(&network, &plan);
    print!("{table}");
    println!(
        "bottleneck: {} ({}); {}; bounds: saturation {:.0}/s, min response {:.3} ms; \
         {} network solves in {elapsed_ms:.1} ms",
        plan.bottleneck_name(&network),
        plan.stop.describe(),
        budget_use(&network, &plan),
        plan.saturation_rate_per_s,
        plan.min_response_time_s * 1e3,
        plan.evaluations,
    );
    print_warnings(&plan);
    std::fs::create_dir_all(&args.out)?;
    let config_file = args.out.join(CONFIG_FILE);
    if plan.feasible || args.force {
        let config = plan.to_config(&network);
        std::fs::write(&config_file, toml::to_string(&config)?)?;
        println!("config written to {}", config_file.display());
    } else if config_file.exists() {
        // An earlier plan's config would otherwise pass for this one's.
        std::fs::remove_file(&config_file)?;
    }
    write_report(&args.out, &table, &plan)?;
    if !plan.feasible {
        let written = if args.force { "written anyway (--force)" } else { "not written" };
        return Err(TargetMissed(vec![format!(
            "no configuration within the limits carries {:.0} tickets/s; {CONFIG_FILE} {written}",
            plan.arrival_rate_per_s
        )])
        .into());
    }
    Ok(())
}

fn print_warnings(plan: &Plan) {
    for warning in &plan.warnings {
        println!("warning ({} plan): {warning}", plan_label(plan));
    }
}

fn plan_label(plan: &Plan) -> &'static str {
    match plan.options.budget {
        Budget::Threads => "threads budget",
        Budget::Cpu => "cpu budget",
    }
}

/// How much of its budget a plan uses, in words.
fn budget_use(network: &Network, plan: &Plan) -> String {
    let cores = network.spec().host.cores;
    let threads: u32 = plan.threads.iter().sum();
    match plan.thread_budget {
        Some(budget) => format!(
            "{threads} threads of a budget of {budget} ({cores} cores); CPU demand {:.2}",
            plan.cpu_cores_demand
        ),
        None => {
            format!("CPU demand {:.2} of {cores} cores ({threads} threads)", plan.cpu_cores_demand)
        }
    }
}

/// The published plan and the refinement side by side, one row per node, then the rate and
/// what binds.
pub fn comparison_table(network: &Network, comparison: &Comparison) -> Table {
    let (published, refined) = (&comparison.published, &comparison.refined);
    let mut table = Table::new([
        "node",
        "fixed",
        "published threads",
        "published utilization",
        "refined threads",
        "refined utilization",
    ])
    .with_title(format!(
        "{} plans: published (threads budget, fixed nodes left out) vs refined (cpu budget, \
         fixed nodes bound the rate)",
        published.goal
    ));
    for row in comparison.rows(network) {
        table.row([
            row.node,
            if row.fixed { "yes" } else { "no" }.into(),
            row.threads[0].to_string(),
            format!("{:.3}", row.utilization[0]),
            row.threads[1].to_string(),
            format!("{:.3}", row.utilization[1]),
        ]);
    }
    let summary = |plan: &Plan| {
        [
            plan.threads.iter().sum::<u32>().to_string(),
            format!("{:.0}", plan.arrival_rate_per_s),
            format!("{:.2}", plan.cpu_cores_demand),
            plan.bottleneck_name(network).to_owned(),
            format!("{:?}", plan.stop),
        ]
    };
    let names = ["threads in all", "rate (tickets/s)", "CPU demand (cores)", "binds", "stop"];
    for ((name, left), right) in names.into_iter().zip(summary(published)).zip(summary(refined)) {
        table.row([name.into(), String::new(), left, String::new(), right, String::new()]);
    }
    table
}

fn write_report(dir: &Path, table: &Table, plan: &impl serde::Serialize) -> anyhow::Result<()> {
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
            match planner::round::probability(metrics.blocking_probability) {
                0.0 => "0".into(),
                p_k => format!("{p_k:.2e}"),
            },
            format!("{:.2}", metrics.loss_rate_per_s),
        ]);
    }
    table
}

fn run_node(args: &NodeArgs) -> anyhow::Result<()> {
    let model = MmcK::new(args.rate, args.service_rate, args.servers, args.capacity)?;
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
            budget: BudgetArg::Threads,
            fixed_bounds_rate: false,
            rate_step: None,
            compare: false,
            force: false,
            out: PathBuf::from("unused"),
        }
    }

    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(subcommand)]
        command: Command,
    }

    fn parse(flags: &[&str]) -> Result<OptimizeArgs, clap::Error> {
        use clap::Parser;
        let argv = ["plan", "optimize", "--model", "m.toml"].iter().chain(flags);
        match Cli::try_parse_from(argv)?.command {
            Command::Optimize(args) => Ok(args),
            other => panic!("parsed {other:?}"),
        }
    }

    #[test]
    fn optimize_flags_select_the_options() {
        assert_eq!(parse(&[]).unwrap().options(), Options::PUBLISHED);
        let refined = parse(&["--budget", "cpu", "--fixed-bounds-rate"]).unwrap();
        assert_eq!(refined.options(), Options::REFINED);
        let stepped = parse(&["--rate-step", "0.001"]).unwrap().options();
        assert_eq!(stepped, Options::PUBLISHED.with_rate_search(RateSearch::Step(0.001)));
        assert!(parse(&["--compare"]).unwrap().compare);
        for conflicting in
            [&["--compare", "--budget", "cpu"][..], &["--compare", "--fixed-bounds-rate"]]
        {
            let error = parse(conflicting).unwrap_err();
            assert_eq!(error.kind(), clap::error::ErrorKind::ArgumentConflict, "{conflicting:?}");
        }
        assert!(parse(&["--budget", "cores"]).is_err());
    }

    #[test]
    fn optimize_help_explains_budgets_and_fixed_nodes() {
        use clap::CommandFactory;
        let mut cli = Cli::command();
        let help = cli.find_subcommand_mut("optimize").unwrap().render_long_help().to_string();
        for needle in [
            "Σ threads ≤ cores",
            "CPU demand",
            "left out of the utilization check",
            "--fixed-bounds-rate",
            "Goedel",
            "1-1-1-5",
            "1-2-4-1",
            "--rate-step <F>",
            "--compare",
        ] {
            assert!(help.contains(needle), "help lacks {needle}:\n{help}");
        }
    }

    /// The paper's Goedel host with the feeder fixed at one thread, as a model file.
    const GOEDEL_MODEL: &str = "utilization_limit = 0.8\n[host]\ncores = 8.0\n\
        [[node]]\nname = \"decoder\"\nservice_rate_per_s = 30055.0\nexternal_share = 1.0\n\
        [[node]]\nname = \"converter\"\nservice_rate_per_s = 18672.0\n\
        [[node]]\nname = \"serializer\"\nservice_rate_per_s = 6146.0\n\
        [[node]]\nname = \"feeder\"\nservice_rate_per_s = 94.0\nfixed_threads = 1\n\
        [[route]]\nfrom = \"decoder\"\nto = \"converter\"\n\
        [[route]]\nfrom = \"converter\"\nto = \"serializer\"\n\
        [[route]]\nfrom = \"converter\"\nto = \"feeder\"\n";

    #[test]
    fn compare_prints_both_plans_and_writes_no_config() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("goedel.toml");
        std::fs::write(&model, GOEDEL_MODEL).unwrap();
        let mut args = args(model, &[]);
        args.cores = None;
        args.compare = true;
        args.out = dir.path().join("report");
        run_optimize(&args).unwrap();
        assert!(!args.out.join(CONFIG_FILE).exists(), "--compare writes no config");
        let network = load_network(&args).unwrap();
        let comparison = compare(&network, Goal::Throughput, RateSearch::Bisection).unwrap();
        let table = comparison_table(&network, &comparison);
        let column = |index: usize| -> Vec<&str> {
            table.rows().iter().take(4).map(|row| row[index].as_str()).collect()
        };
        assert_eq!((column(2), column(4)), (vec!["1", "2", "4", "1"], vec!["1", "1", "1", "1"]));
        let rate = table.rows().iter().find(|row| row[0] == "rate (tickets/s)").unwrap();
        assert_eq!((rate[2].as_str(), rate[4].as_str()), ("19667", "75"));
        let json = std::fs::read_to_string(dir.path().join("report/plan.json")).unwrap();
        assert!(json.contains("\"published\"") && json.contains("\"refined\""), "{json}");
    }

    /// Two nodes on one core: the threads budget (Σ threads ≤ 1) cannot hold a thread each.
    const TOO_SMALL_MODEL: &str = "[host]\ncores = 1.0\n\
        [[node]]\nname = \"a\"\nservice_rate_per_s = 1000.0\nexternal_share = 1.0\n\
        [[node]]\nname = \"b\"\nservice_rate_per_s = 300.0\n\
        [[route]]\nfrom = \"a\"\nto = \"b\"\n";

    #[test]
    fn a_plan_that_does_not_hold_exits_3_and_writes_a_config_only_when_forced() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("model.toml");
        std::fs::write(&model, TOO_SMALL_MODEL).unwrap();
        let mut args = args(model, &[]);
        args.cores = None;
        args.out = dir.path().join("report");
        std::fs::create_dir_all(&args.out).unwrap();
        std::fs::write(args.out.join(CONFIG_FILE), "stale").unwrap();
        let error = run_optimize(&args).unwrap_err();
        assert_eq!(crate::outcome::exit_code(&Err(error)), crate::outcome::EXIT_TARGET_MISSED);
        assert!(!args.out.join(CONFIG_FILE).exists(), "no config, not even an earlier one");
        assert!(args.out.join("plan.json").exists(), "the plan is still reported");
        args.force = true;
        let error = run_optimize(&args).unwrap_err();
        assert!(error.to_string().contains("written anyway (--force)"), "{error}");
        let config = std::fs::read_to_string(args.out.join(CONFIG_FILE)).unwrap();
        assert!(config.contains("threads = 1"), "{config}");
        args.cores = Some(4.0);
        args.force = false;
        run_optimize(&args).unwrap();
    }

    /// Every number in config.toml and plan.json is short: no 300-digit decimals of a
    /// blocking probability that means "never", no 0.7999999999 for 0.8.
    #[test]
    fn written_numbers_are_rounded_to_what_they_mean() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("goedel.toml");
        std::fs::write(&model, GOEDEL_MODEL).unwrap();
        let mut args = args(model, &[]);
        args.cores = None;
        args.out = dir.path().join("report");
        run_optimize(&args).unwrap();
        for file in [CONFIG_FILE, "plan.json"] {
            let text = std::fs::read_to_string(args.out.join(file)).unwrap();
            let longest = text
                .split(|c: char| !(c.is_ascii_digit() || c == '.'))
                .map(str::len)
                .max()
                .unwrap();
            assert!(longest <= 14, "{file} has a {longest}-character number:\n{text}");
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
            assert!(crate::outcome::is_bad_input(&error), "{fixed}: {error}");
        }
        let mut cycle = std::fs::read_to_string(&path).unwrap();
        cycle.push_str("[[route]]\nfrom = \"b\"\nto = \"a\"\n");
        std::fs::write(&path, cycle).unwrap();
        let error = load_network(&args(path.clone(), &[])).unwrap_err();
        assert!(crate::outcome::is_bad_input(&error), "a bad model keeps exit code 2");
        let missing = load_network(&args(dir.path().join("nope.toml"), &[])).unwrap_err();
        assert!(missing.to_string().contains("does not exist"), "{missing}");
    }
}
