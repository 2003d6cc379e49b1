//! The load lab: one cell (`web load`) or the whole {model} × {users} × {complexity} matrix
//! (`web matrix`), with the Python baseline measured in the same run.
//!
//! Every cell drives HTTP load with pooled keep-alive connections from a separate tokio runtime
//! in this process. Closed loop: N users, each sending its next request when the previous answer
//! arrives (the study's test plan), warm-up trimmed. Open loop: a constant rate whose latency is
//! measured from each request's intended send time, so a stalled server cannot hide its queue
//! (no coordinated omission). Latencies go into `lab::stats` HDR histograms; tables, the report
//! folder and the SVG plots come from `lab::report`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use clap::Args as ClapArgs;
use lab::outcome::{BadInput, TargetMissed};
use lab::report::{BarChart, Markdown, ReportDir, Table, format_ns_as_us, progress_bar};
use lab::stats::LatencySummary;

use lab::load::{
    ArrivalProcess, AsyncOpenLoopOptions, ClosedLoopOptions, LoadReport, OpenLoopPlan, drive_async,
    drive_closed_loop,
};

use crate::cli::ServeConfig;
use crate::client::{JsonClient, UserConnections};
use crate::exec::Model;
use crate::server::Server;
use crate::workload::Complexity;

/// Distinct request bodies per cell (different ids and cells), sent round-robin.
const BODIES_PER_CELL: u64 = 8;
/// Seed of the open-loop schedule (constant arrivals do not use randomness, but plans carry one).
const OPEN_LOOP_SEED: u64 = 1;
/// How long a baseline server may take to start listening.
const BASELINE_START_TIMEOUT: Duration = Duration::from_secs(30);
/// The adaptive model must reach this fraction of the best fixed model in every cell.
const ADAPTIVE_RATIO_MIN: f64 = 0.95;
/// leantier must reach this multiple of the Python single process at medium-600 × 10 users.
const PYTHON_SPEEDUP_MIN: f64 = 100.0;

/// Arguments of `web load`.
#[derive(Debug, ClapArgs)]
pub struct LoadArgs {
    /// Target URL; when absent an in-process server is started and `--model` is used.
    #[arg(long)]
    pub url: Option<String>,
    /// Model of the in-process server (ignored with --url).
    #[arg(long, value_enum, default_value = "adaptive")]
    pub model: Model,
    /// Closed loop with this many users (ignored when --rate-per-s is given).
    #[arg(long, default_value_t = 10)]
    pub users: usize,
    /// Open loop at this constant request rate, latency from the intended send time.
    #[arg(long)]
    pub rate_per_s: Option<f64>,
    /// Complexity level of the requests.
    #[arg(long, value_enum, default_value = "medium-600")]
    pub complexity: Complexity,
    /// Measured seconds (after the warm-up).
    #[arg(long, default_value_t = 3.0)]
    pub duration_s: f64,
    /// Warm-up seconds, not measured.
    #[arg(long, default_value_t = 0.5)]
    pub warmup_s: f64,
    /// Print the result as JSON as well.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `web matrix`.
#[derive(Debug, ClapArgs)]
pub struct MatrixArgs {
    /// Models to compare.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "single,pool,pinned,prefork,adaptive"
    )]
    pub models: Vec<Model>,
    /// Closed-loop user counts.
    #[arg(long, value_delimiter = ',', default_value = "10,30,60")]
    pub users: Vec<usize>,
    /// Complexity levels.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "low,medium-600,medium-1000,high"
    )]
    pub complexity: Vec<Complexity>,
    /// Measured seconds per cell.
    #[arg(long, default_value_t = 1.5)]
    pub duration_s: f64,
    /// Warm-up seconds per cell.
    #[arg(long, default_value_t = 0.3)]
    pub warmup_s: f64,
    /// Worker threads / processes of the leantier models [default: allowed CPUs].
    #[arg(long)]
    pub workers: Option<usize>,
    /// Python interpreter with Flask installed: adds the Python baselines (see scripts/bench-web).
    #[arg(long)]
    pub python: Option<PathBuf>,
    /// The baseline Flask app.
    #[arg(long, default_value = "bench/web-python/app.py")]
    pub python_app: PathBuf,
    /// Complexity levels at which the Python baselines run (they are slow).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "low,medium-600")]
    pub python_complexity: Vec<Complexity>,
    /// Measured seconds per Python cell: a window much longer than the baseline's latency, or
    /// the closed loop's trimming (only requests started and finished inside it count) would
    /// undercount it.
    #[arg(long, default_value_t = 8.0)]
    pub python_duration_s: f64,
    /// User counts at which the Python baselines run.
    #[arg(long, value_delimiter = ',', default_value = "10")]
    pub python_users: Vec<usize>,
    /// Report folder (JSON, CSV, Markdown, SVG).
    #[arg(long, default_value = "reports/web-matrix")]
    pub report_dir: PathBuf,
    /// Exit with code 3 when a target (adaptive ≥ 0.95× best fixed; ≥ 100× Python) is missed.
    #[arg(long)]
    pub check: bool,
}

/// One measured cell.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CellResult {
    pub target: String,
    pub complexity: Complexity,
    pub users: usize,
    pub throughput_per_s: f64,
    pub completed: u64,
    pub errors: u64,
    pub latency: LatencySummary,
    /// Completions in each measured second (throughput over time).
    pub completed_per_second: Vec<u64>,
}

impl CellResult {
    fn new(target: &str, complexity: Complexity, users: usize, report: &LoadReport) -> CellResult {
        if let Some(error) = &report.first_error {
            tracing::warn!(target, error, "requests failed");
        }
        CellResult {
            target: target.into(),
            complexity,
            users,
            throughput_per_s: report.throughput_per_s(),
            completed: report.ok,
            errors: report.errors + report.timeouts,
            latency: report.latency.summary(),
            completed_per_second: report.throughput.counts.clone(),
        }
    }
}

/// How a cell offers load.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LoadMode {
    /// N users, each with one request outstanding.
    Closed { users: usize },
    /// Constant arrivals; latency from the intended send time.
    Open { rate_per_s: f64 },
}

/// Drives one cell at `url` with `bodies` sent round-robin; a non-200 answer is an error.
pub fn drive(
    url: &str,
    bodies: Vec<Bytes>,
    mode: LoadMode,
    warmup: Duration,
    measure: Duration,
) -> anyhow::Result<LoadReport> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let bodies = std::sync::Arc::new(bodies);
    runtime.block_on(async move {
        match mode {
            LoadMode::Closed { users } => {
                let connections = std::sync::Arc::new(UserConnections::new(url, users)?);
                let options = ClosedLoopOptions {
                    users,
                    warm_up: warmup,
                    measure,
                    cool_down: Duration::ZERO,
                    ..ClosedLoopOptions::default()
                };
                let report = drive_closed_loop(&options, move |user, sequence| {
                    let connections = std::sync::Arc::clone(&connections);
                    let body = bodies[(user + sequence as usize) % bodies.len()].clone();
                    async move {
                        let status = connections.post(user, body).await?;
                        anyhow::ensure!(status == 200, "HTTP {status}");
                        anyhow::Ok(())
                    }
                })
                .await?;
                Ok(report)
            }
            LoadMode::Open { rate_per_s } => {
                let client = JsonClient::default();
                let url: std::sync::Arc<str> = url.into();
                let mut send = move |index: u64| {
                    let (client, url) = (client.clone(), std::sync::Arc::clone(&url));
                    let body = bodies[(index % bodies.len() as u64) as usize].clone();
                    async move {
                        let (status, _) = client.post(&url, body).await?;
                        anyhow::ensure!(status == 200, "HTTP {status}");
                        anyhow::Ok(())
                    }
                };
                let process = ArrivalProcess::Constant { rate_per_s };
                let options = AsyncOpenLoopOptions::default();
                if !warmup.is_zero() {
                    let plan = OpenLoopPlan { process, seed: OPEN_LOOP_SEED, duration: warmup };
                    drive_async(&plan, &options, &mut send).await?;
                }
                let plan = OpenLoopPlan { process, seed: OPEN_LOOP_SEED, duration: measure };
                Ok(drive_async(&plan, &options, &mut send).await?)
            }
        }
    })
}

fn bodies(complexity: Complexity) -> Vec<Bytes> {
    (0..BODIES_PER_CELL)
        .map(|seed| Bytes::from(complexity.shape().request_body(seed + 1, seed)))
        .collect()
}

/// The duration given by a `--<flag>` in seconds; only a warm-up may be zero.
fn seconds(value: f64, flag: &str, zero_allowed: bool) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(value)
        .ok()
        .filter(|d| zero_allowed || !d.is_zero())
        .ok_or_else(|| BadInput(format!("--{flag} must be a positive number of seconds")).into())
}

fn start_in_process(workers: Option<usize>) -> anyhow::Result<Server> {
    let mut config = ServeConfig::default();
    if let Some(workers) = workers {
        config.workers = workers;
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(Server::start(listener, config.server_config()?)?)
}

/// `web load`: one cell.
pub fn run_load(args: &LoadArgs) -> anyhow::Result<()> {
    let duration = seconds(args.duration_s, "duration-s", false)?;
    let warmup = seconds(args.warmup_s, "warmup-s", true)?;
    let mode = match args.rate_per_s {
        Some(rate) if rate > 0.0 && rate.is_finite() => LoadMode::Open { rate_per_s: rate },
        Some(_) => return Err(BadInput("--rate-per-s must be > 0".into()).into()),
        None if args.users == 0 => return Err(BadInput("--users must be > 0".into()).into()),
        None => LoadMode::Closed { users: args.users },
    };
    // Kept alive until the cell is measured.
    let (mut server, mut per_core) = (None, None);
    let url = match &args.url {
        Some(url) => url.clone(),
        None if PER_CORE_MODELS.contains(&args.model) => {
            let config = ServeConfig {
                listen: SocketAddr::from(([127, 0, 0, 1], 0)),
                ..ServeConfig::default()
            };
            let started = per_core.insert(crate::cli::start_per_core(&config, args.model)?);
            format!("http://{}/matrix/{}", started.local_addr(), args.model.name())
        }
        None => {
            let started = server.insert(start_in_process(None)?);
            format!("http://{}/matrix/{}", started.local_addr(), args.model.name())
        }
    };
    let observed = drive(&url, bodies(args.complexity), mode, warmup, duration)?;
    let users = match mode {
        LoadMode::Closed { users } => users,
        LoadMode::Open { .. } => 0,
    };
    let result = CellResult::new(&url, args.complexity, users, &observed);
    println!("{}", results_table("web load", std::slice::from_ref(&result)));
    if let LoadMode::Open { rate_per_s } = mode {
        println!("open loop at {rate_per_s} req/s; latency from the intended send time");
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&result)?);
    }
    Ok(())
}

fn results_table(title: &str, results: &[CellResult]) -> Table {
    let mut table = Table::new([
        "target",
        "complexity",
        "users",
        "req/s",
        "errors",
        "p50 us",
        "p99 us",
        "p99.9 us",
        "max us",
    ])
    .with_title(title);
    for r in results {
        table.row([
            r.target.clone(),
            r.complexity.name().to_string(),
            r.users.to_string(),
            format!("{:.1}", r.throughput_per_s),
            r.errors.to_string(),
            format_ns_as_us(r.latency.p50_ns),
            format_ns_as_us(r.latency.p99_ns),
            format_ns_as_us(r.latency.p99_9_ns),
            format_ns_as_us(r.latency.max_ns),
        ]);
    }
    table
}

/// A server under test: label and URL.
struct Target {
    label: String,
    url: String,
    python: bool,
}

/// A Python baseline process, killed when dropped.
struct Baseline {
    child: Child,
}

impl Drop for Baseline {
    fn drop(&mut self) {
        // The baseline serves until killed; an error means it already exited.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_python(
    python: &PathBuf,
    app: &PathBuf,
    mode: &str,
) -> anyhow::Result<(Baseline, SocketAddr)> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let child = Command::new(python)
        .arg(app)
        .args(["--mode", mode, "--port", &port.to_string()])
        .spawn()
        .with_context(|| format!("starting {} {}", python.display(), app.display()))?;
    let mut baseline = Baseline { child };
    let deadline = std::time::Instant::now() + BASELINE_START_TIMEOUT;
    while std::net::TcpStream::connect(addr).is_err() {
        if let Some(status) = baseline.child.try_wait()? {
            anyhow::bail!("python baseline ({mode}) exited: {status}");
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "python baseline ({mode}) did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok((baseline, addr))
}

/// `web matrix`: every model × users × complexity, plus the Python baselines.
pub fn run_matrix(args: &MatrixArgs) -> anyhow::Result<()> {
    let duration = seconds(args.duration_s, "duration-s", false)?;
    let python_duration = seconds(args.python_duration_s, "python-duration-s", false)?;
    let warmup = seconds(args.warmup_s, "warmup-s", true)?;
    if args.users.contains(&0) {
        return Err(BadInput("--users must all be > 0".into()).into());
    }
    let server = start_in_process(args.workers)?;
    let mut targets = Vec::new();
    for &model in &args.models {
        if !PER_CORE_MODELS.contains(&model) {
            let url = format!("http://{}/matrix/{}", server.local_addr(), model.name());
            targets.push(Target { label: model.name().into(), url, python: false });
        }
    }
    let mut per_core = Vec::new();
    for model in PER_CORE_MODELS.into_iter().filter(|model| args.models.contains(model)) {
        let mut config =
            ServeConfig { listen: SocketAddr::from(([127, 0, 0, 1], 0)), ..ServeConfig::default() };
        if let Some(workers) = args.workers {
            config.workers = workers;
        }
        let children = crate::cli::start_per_core(&config, model)?;
        let url = format!("http://{}/matrix/{}", children.local_addr(), model.name());
        targets.push(Target { label: model.name().into(), url, python: false });
        per_core.push(children);
    }
    let mut baselines = Vec::new();
    if let Some(python) = &args.python {
        for (label, mode) in [("python-single", "single"), ("python-mp", "multiprocessing")] {
            let (baseline, addr) = start_python(python, &args.python_app, mode)?;
            targets.push(Target {
                label: label.into(),
                url: format!("http://{addr}/matrix"),
                python: true,
            });
            baselines.push(baseline);
        }
    }
    let cells: Vec<(Complexity, usize, &Target)> = args
        .complexity
        .iter()
        .flat_map(|&c| args.users.iter().map(move |&u| (c, u)))
        .flat_map(|(c, u)| targets.iter().map(move |t| (c, u, t)))
        .filter(|(c, u, t)| {
            !t.python || (args.python_complexity.contains(c) && args.python_users.contains(u))
        })
        .collect();
    let progress = progress_bar(cells.len() as u64, "web matrix");
    let mut results = Vec::new();
    for (complexity, users, target) in cells {
        progress.set_message(format!("{} {} {users}u", target.label, complexity.name()));
        let measure = if target.python { python_duration } else { duration };
        let observed =
            drive(&target.url, bodies(complexity), LoadMode::Closed { users }, warmup, measure)?;
        results.push(CellResult::new(&target.label, complexity, users, &observed));
        progress.inc(1);
    }
    progress.finish_and_clear();
    drop((per_core, baselines, server));
    let table = results_table("web matrix (closed loop)", &results);
    println!("{table}");
    let checks = check_targets(&results);
    println!("{}", checks.table);
    write_report(args, &results, &table, &checks.table)?;
    if args.check && !checks.missed.is_empty() {
        return Err(TargetMissed(checks.missed).into());
    }
    Ok(())
}

struct Checks {
    table: Table,
    missed: Vec<String>,
}

/// Models served as one pinned process per core (the others run side by side in one process).
const PER_CORE_MODELS: [Model; 2] = [Model::Prefork, Model::Adaptive];

const FIXED_MODELS: [&str; 4] = ["single", "pool", "pinned", "prefork"];

fn throughput_of(
    results: &[CellResult],
    target: &str,
    complexity: Complexity,
    users: usize,
) -> Option<f64> {
    results
        .iter()
        .find(|r| r.target == target && r.complexity == complexity && r.users == users)
        .map(|r| r.throughput_per_s)
}

fn check_targets(results: &[CellResult]) -> Checks {
    let mut table = Table::new(["check", "complexity", "users", "ratio", "target", "met"])
        .with_title("targets");
    let mut missed = Vec::new();
    let mut cells: Vec<(Complexity, usize)> =
        results.iter().map(|r| (r.complexity, r.users)).collect();
    cells.dedup();
    for (complexity, users) in cells {
        let Some(adaptive) = throughput_of(results, "adaptive", complexity, users) else {
            continue;
        };
        let best = FIXED_MODELS
            .iter()
            .filter_map(|m| throughput_of(results, m, complexity, users).map(|t| (t, *m)))
            .max_by(|a, b| a.0.total_cmp(&b.0));
        if let Some((best, name)) = best {
            record(
                &mut table,
                &mut missed,
                &format!("adaptive / best fixed ({name})"),
                complexity,
                users,
                adaptive / best,
                ADAPTIVE_RATIO_MIN,
            );
        }
        if let Some(python) = throughput_of(results, "python-single", complexity, users)
            && complexity == Complexity::Medium600
            && users == 10
        {
            record(
                &mut table,
                &mut missed,
                "adaptive / python-single",
                complexity,
                users,
                adaptive / python,
                PYTHON_SPEEDUP_MIN,
            );
        }
    }
    Checks { table, missed }
}

fn record(
    table: &mut Table,
    missed: &mut Vec<String>,
    check: &str,
    complexity: Complexity,
    users: usize,
    ratio: f64,
    target: f64,
) {
    let met = ratio >= target;
    table.row([
        check.to_string(),
        complexity.name().to_string(),
        users.to_string(),
        format!("{ratio:.3}"),
        format!(">= {target}"),
        if met { "yes" } else { "NO" }.to_string(),
    ]);
    if !met {
        missed.push(format!(
            "{check} at {} x {users} users: {ratio:.3} < {target}",
            complexity.name()
        ));
    }
}

fn write_report(
    args: &MatrixArgs,
    results: &[CellResult],
    table: &Table,
    checks: &Table,
) -> anyhow::Result<()> {
    let report = ReportDir::create(&args.report_dir)?;
    report.write_json("results.json", results)?;
    report.write_csv("results.csv", table)?;
    let mut summary = Markdown::new();
    summary
        .heading(1, "web matrix")
        .paragraph(&format!(
            "Closed loop, {} s measured ({} s for Python cells) after {} s warm-up per cell; \
             shapes A rows×50 · B 50×20.",
            args.duration_s, args.python_duration_s, args.warmup_s
        ))
        .table(table)
        .table(checks);
    let mut targets: Vec<&str> = Vec::new();
    for r in results {
        if !targets.contains(&r.target.as_str()) {
            targets.push(&r.target);
        }
    }
    for &complexity in &args.complexity {
        let users: Vec<String> = args.users.iter().map(|u| format!("{u} users")).collect();
        let mut throughput = BarChart::new(
            &format!("Throughput, {}", complexity.name()),
            "requests/s",
            users.clone(),
        );
        let mut p99 =
            BarChart::new(&format!("p99 latency, {}", complexity.name()), "p99 ms", users);
        for target in &targets {
            let cell = |u: &usize| {
                results
                    .iter()
                    .find(|r| r.target == *target && r.complexity == complexity && r.users == *u)
            };
            let values = |f: &dyn Fn(&CellResult) -> f64| {
                args.users.iter().map(|u| cell(u).map_or(f64::NAN, f)).collect()
            };
            throughput = throughput.group(target, values(&|r| r.throughput_per_s));
            p99 = p99.group(target, values(&|r| r.latency.p99_ns as f64 / 1e6));
        }
        for (kind, chart) in [("throughput", throughput), ("p99", p99)] {
            let name = format!("{kind}-{}.svg", complexity.name());
            report.write_svg(&name, &chart.to_svg())?;
            summary.image(&format!("{kind} {}", complexity.name()), &name);
        }
    }
    report.write_markdown("README.md", summary.as_str())?;
    println!("report: {}", report.path().display());
    Ok(())
}
