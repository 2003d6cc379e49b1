//! The web load lab behind `web load`, `web matrix` and `web ratio`: one cell or the whole
//! {model} × {users} × {complexity} matrix, with the Python baseline measured in the same run,
//! its tables, report folder and target checks, and the paired-ratio helper. Cells are driven
//! by [`crate::web_load::drive`]. `leantier` parses the flags into [`LoadSettings`] and
//! [`MatrixSettings`] and calls [`run_load`] or [`run_matrix`].

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use stats::{BadInput, LatencySummary};
use web::exec::Model;
use web::serve::ServeConfig;
use web::server::Server;
use web::workload::Complexity;

use crate::load::ThroughputSeries;
use crate::plot::{BarChart, throughput_over_time_plot};
use crate::progress::progress_bar;
use crate::report::{Markdown, ReportDir, Table, format_ns_as_us, throughput_over_time_table};
use crate::web_load::{CellResult, LoadMode, Window, drive, exchanges};

/// How long a baseline server may take to start listening.
const BASELINE_START_TIMEOUT: Duration = Duration::from_secs(30);
/// The adaptive model must reach this fraction of the best fixed model in every cell.
const ADAPTIVE_RATIO_MIN: f64 = 0.95;
/// leantier must reach this multiple of the Python single process at medium-600 × 10 users.
const PYTHON_SPEEDUP_MIN: f64 = 100.0;
/// How long a request may go unanswered before it counts as timed out (`web load
/// --request-timeout`'s default; `web matrix` uses it as is).
pub const REQUEST_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);

/// What `web load` measures (its flags, in `leantier`'s `web load --help`).
#[derive(Debug, Clone)]
pub struct LoadSettings {
    /// Target URL; when absent an in-process server is started and `model` is used.
    pub url: Option<String>,
    /// Model of the in-process server (ignored with `url`).
    pub model: Model,
    /// Closed loop with this many users (ignored when `rate` is given).
    pub users: usize,
    /// Open loop at this constant request rate, requests/s, latency from the intended send time.
    pub rate: Option<f64>,
    /// Complexity level of the requests.
    pub complexity: Complexity,
    /// Measured time (after the warm-up).
    pub duration: Duration,
    /// Warm-up time, not measured.
    pub warmup: Duration,
    /// Width of the throughput-over-time intervals.
    pub interval: Duration,
    /// A request not answered this long after it was sent counts as timed out.
    pub request_timeout: Duration,
    /// Print the result as JSON as well.
    pub json: bool,
    /// Report folder (JSON, throughput-over-time CSV and SVG, Markdown).
    pub out: PathBuf,
    /// The arguments that make this program a prefork child (`web::serve::start_per_core`).
    pub child_args: Vec<OsString>,
}

/// What `web matrix` measures (its flags, in `leantier`'s `web matrix --help`).
#[derive(Debug, Clone)]
pub struct MatrixSettings {
    /// Models to compare.
    pub models: Vec<Model>,
    /// Closed-loop user counts.
    pub users: Vec<usize>,
    /// Complexity levels.
    pub complexity: Vec<Complexity>,
    /// Measured time per cell and round.
    pub duration: Duration,
    /// Warm-up time per cell and round.
    pub warmup: Duration,
    /// Rounds: in each round every model of a cell runs once, cells in turn, the models' order
    /// rotated (and reversed every other time) from cell to cell and round to round; each cell
    /// reports the median over the rounds.
    pub rounds: usize,
    /// Width of the throughput-over-time intervals.
    pub interval: Duration,
    /// Worker threads / processes of the leantier models (default: allowed CPUs).
    pub workers: Option<usize>,
    /// Python interpreter with Flask installed: adds the Python baselines.
    pub python: Option<PathBuf>,
    /// The baseline Flask app.
    pub python_app: PathBuf,
    /// Complexity levels at which the Python baselines run (first round only).
    pub python_complexity: Vec<Complexity>,
    /// Measured time per Python cell.
    pub python_duration: Duration,
    /// User counts at which the Python baselines run.
    pub python_users: Vec<usize>,
    /// Report folder (JSON, CSV, Markdown, SVG).
    pub out: PathBuf,
    /// The arguments that make this program a prefork child (`web::serve::start_per_core`).
    pub child_args: Vec<OsString>,
}

/// The duration given by `--<flag>`, refused when zero (only a warm-up may be zero).
fn positive(duration: Duration, flag: &str) -> Result<Duration, BadInput> {
    if duration.is_zero() { Err(BadInput(format!("--{flag} must be > 0"))) } else { Ok(duration) }
}

fn start_in_process(workers: Option<usize>) -> anyhow::Result<Server> {
    let mut config = ServeConfig::default();
    if let Some(workers) = workers {
        config.workers = workers;
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(Server::start(listener, config.server_config()?)?)
}

/// `web load`: one cell. Exits 1 (after the table) when no request was answered well.
pub fn run_load(args: &LoadSettings) -> anyhow::Result<()> {
    let window = Window {
        warmup: args.warmup,
        measure: positive(args.duration, "duration")?,
        interval: positive(args.interval, "interval")?,
        request_timeout: positive(args.request_timeout, "request-timeout")?,
    };
    let mode = load_mode(args)?;
    // Kept alive until the cell is measured.
    let (mut server, mut per_core) = (None, None);
    let url = match &args.url {
        Some(url) => url.clone(),
        None if PER_CORE_MODELS.contains(&args.model) => {
            let config = ServeConfig {
                listen: SocketAddr::from(([127, 0, 0, 1], 0)),
                ..ServeConfig::default()
            };
            let started =
                per_core.insert(web::serve::start_per_core(&config, args.model, &args.child_args)?);
            format!("http://{}/matrix/{}", started.local_addr(), args.model.name())
        }
        None => {
            let started = server.insert(start_in_process(None)?);
            format!("http://{}/matrix/{}", started.local_addr(), args.model.name())
        }
    };
    let observed = drive(&url, exchanges(args.complexity), mode, window)?;
    let users = match mode {
        LoadMode::Closed { users } => users,
        LoadMode::Open { .. } => 0,
    };
    let result = CellResult::new(&url, (args.complexity, users, 0), &observed);
    let table = results_table("web load", std::slice::from_ref(&result));
    println!("{table}");
    let over_time = throughput_over_time_table(&[("throughput", &result.throughput_series)]);
    println!("throughput over time: {}", one_line(&over_time));
    if let LoadMode::Open { rate_per_s } = mode {
        let lag = &result.send_lag;
        println!(
            "open loop at {rate_per_s} req/s; latency from the intended send time; the \
             generator's own lag (inside the latency) p50 {} p99 {} max {} us",
            format_ns_as_us(lag.p50_ns),
            format_ns_as_us(lag.p99_ns),
            format_ns_as_us(lag.max_ns)
        );
    }
    let report = write_load_report(args, &url, &result, (&table, &over_time))?;
    println!("report: {}", report.path().display());
    if args.json {
        println!("{}", serde_json::to_string_pretty(&result)?);
    }
    match observed.nothing_answered(&url, &window) {
        Some(failed) => Err(failed.into()),
        None => Ok(()),
    }
}

/// Open loop at `--rate`, else closed loop with `--users`; a rate or user count that cannot
/// run is bad input.
fn load_mode(args: &LoadSettings) -> anyhow::Result<LoadMode> {
    Ok(match args.rate {
        Some(rate) if rate > 0.0 && rate.is_finite() => LoadMode::Open { rate_per_s: rate },
        Some(_) => return Err(BadInput("--rate must be > 0".into()).into()),
        None if args.users == 0 => return Err(BadInput("--users must be > 0".into()).into()),
        None => LoadMode::Closed { users: args.users },
    })
}

/// `web load`'s report folder: the result as JSON and CSV, the throughput over time as CSV
/// and SVG, and a README with both tables.
fn write_load_report(
    args: &LoadSettings,
    url: &str,
    result: &CellResult,
    (table, over_time): (&Table, &Table),
) -> anyhow::Result<ReportDir> {
    let report = ReportDir::create(&args.out)?;
    report.write_json("result.json", result)?;
    report.write_csv("result.csv", table)?;
    report.write_csv("throughput-over-time.csv", over_time)?;
    let plot = throughput_over_time_plot(
        &format!("Throughput over time, {}", args.complexity.name()),
        &[(url, &result.throughput_series)],
    );
    report.write_svg("throughput-over-time.svg", &plot.to_svg())?;
    let mut summary = Markdown::new();
    summary
        .heading(1, "web load")
        .table(table)
        .table(over_time)
        .image("throughput over time", "throughput-over-time.svg");
    report.write_markdown("README.md", summary.as_str())?;
    Ok(report)
}

/// The per-interval rates of a one-run over-time table, on one line.
fn one_line(over_time: &Table) -> String {
    let rates: Vec<&str> = over_time.rows().iter().map(|row| row[1].as_str()).collect();
    format!("[{}] req/s per interval", rates.join(", "))
}

/// One row per run: its round, cell, throughput, errors and latency percentiles.
fn results_table(title: &str, results: &[CellResult]) -> Table {
    let headers = ["round", "target", "complexity", "users", "req/s", "errors"];
    let mut table = Table::new(headers.into_iter().chain(LATENCY_HEADERS)).with_title(title);
    for r in results {
        let cells = [
            r.round.to_string(),
            r.target.clone(),
            r.complexity.name().to_string(),
            r.users.to_string(),
            format!("{:.1}", r.throughput_per_s),
            r.errors.to_string(),
        ];
        table.row(cells.into_iter().chain(latency_cells(&r.latency)));
    }
    table
}

const LATENCY_HEADERS: [&str; 4] = ["p50 us", "p99 us", "p99.9 us", "max us"];

fn latency_cells(latency: &LatencySummary) -> [String; 4] {
    [latency.p50_ns, latency.p99_ns, latency.p99_9_ns, latency.max_ns].map(format_ns_as_us)
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

/// `web matrix`: every model × users × complexity in interleaved rounds, plus the Python
/// baselines (first round only). Returns the targets missed (empty when all were met).
pub fn run_matrix(args: &MatrixSettings) -> anyhow::Result<Vec<String>> {
    let (samples, medians) = measure_matrix(args)?;
    let table = summary_table(&medians);
    println!("{table}");
    let checks = check_targets(&samples, &medians);
    println!("{}", checks.table);
    for line in &checks.headline {
        println!("{line}");
    }
    write_report(args, &samples, &medians, &table, &checks)?;
    Ok(checks.missed)
}

/// The matrix's measurements: every round of every cell, and each cell's median round.
pub fn measure_matrix(args: &MatrixSettings) -> anyhow::Result<(Vec<CellResult>, Vec<MedianCell>)> {
    let window = Window {
        warmup: args.warmup,
        measure: positive(args.duration, "duration")?,
        interval: positive(args.interval, "interval")?,
        request_timeout: REQUEST_TIMEOUT_DEFAULT,
    };
    let python_window =
        Window { measure: positive(args.python_duration, "python-duration")?, ..window };
    if args.users.contains(&0) {
        return Err(BadInput("--users must all be > 0".into()).into());
    }
    if args.rounds == 0 {
        return Err(BadInput("--rounds must be > 0".into()).into());
    }
    let servers = start_targets(args)?;
    let targets = &servers.targets;
    let cells: Vec<(Complexity, usize)> =
        args.complexity.iter().flat_map(|&c| args.users.iter().map(move |&u| (c, u))).collect();
    let runs = interleaved_runs(args, &cells, targets.len());
    let progress = progress_bar(runs.len() as u64, "web matrix");
    let mut samples = Vec::new();
    let mut exchanges_by_complexity = std::collections::HashMap::new();
    for Run { round, cell, target } in runs {
        let (complexity, users) = cells[cell];
        let target = &targets[target];
        progress.set_message(format!(
            "round {} {} {} {users}u",
            round + 1,
            target.label,
            complexity.name()
        ));
        let exchanges =
            exchanges_by_complexity.entry(complexity).or_insert_with(|| exchanges(complexity));
        let window = if target.python { python_window } else { window };
        let mode = LoadMode::Closed { users };
        let observed = drive(&target.url, Arc::clone(exchanges), mode, window)?;
        samples.push(CellResult::new(&target.label, (complexity, users, round), &observed));
        progress.inc(1);
    }
    progress.finish_and_clear();
    let medians = median_cells(&samples, &cells, targets);
    Ok((samples, medians))
}

/// The servers under test, stopped when dropped.
struct Servers {
    targets: Vec<Target>,
    _in_process: Server,
    _per_core: Vec<web::prefork::Prefork>,
    _baselines: Vec<Baseline>,
}

fn start_targets(args: &MatrixSettings) -> anyhow::Result<Servers> {
    let server = start_in_process(args.workers)?;
    if let Some(calibration) = server.calibration() {
        println!("{calibration}");
    }
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
        let children = web::serve::start_per_core(&config, model, &args.child_args)?;
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
    Ok(Servers { targets, _in_process: server, _per_core: per_core, _baselines: baselines })
}

/// One measurement: round, index into the cells, index into the targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Run {
    round: usize,
    cell: usize,
    target: usize,
}

/// The order of the measurements: round by round, cell by cell; within a cell every leantier
/// target once, starting at a different target in each cell and round (a rotation, reversed
/// every other time), so no model is always measured first or last or after the same model;
/// the Python targets (the last ones) in the first round only, in their cells.
fn interleaved_runs(
    args: &MatrixSettings,
    cells: &[(Complexity, usize)],
    targets: usize,
) -> Vec<Run> {
    let python_targets = if args.python.is_some() { 2 } else { 0 };
    let models = targets - python_targets;
    let mut runs = Vec::new();
    for round in 0..args.rounds {
        for (cell, &(complexity, users)) in cells.iter().enumerate() {
            // Rotated, and reversed every other time, so each model also follows different
            // models (a model measured right after another one inherits its leftovers).
            let first = (round + cell) % models.max(1);
            let order = (0..models).map(|i| (first + i) % models);
            if (round + cell) % 2 == 0 {
                runs.extend(order.map(|target| Run { round, cell, target }));
            } else {
                runs.extend(order.rev().map(|target| Run { round, cell, target }));
            }
            let python_cell =
                args.python_complexity.contains(&complexity) && args.python_users.contains(&users);
            if round == 0 && python_cell {
                runs.extend((models..targets).map(|target| Run { round, cell, target }));
            }
        }
    }
    runs
}

/// A cell's figures over its rounds: the median throughput with the lowest and highest, and
/// the round whose throughput is the median (its latency and series are reported).
#[derive(Debug, Clone, serde::Serialize)]
pub struct MedianCell {
    pub median: CellResult,
    pub rounds: usize,
    pub throughput_per_s_min: f64,
    pub throughput_per_s_max: f64,
    pub errors_all_rounds: u64,
}

/// One [`MedianCell`] per (target, complexity, users), in the order of `cells` and `targets`.
fn median_cells(
    samples: &[CellResult],
    cells: &[(Complexity, usize)],
    targets: &[Target],
) -> Vec<MedianCell> {
    let keys = cells.iter().flat_map(|&(complexity, users)| {
        targets.iter().map(move |target| (target.label.as_str(), complexity, users))
    });
    keys.filter(|&(target, complexity, users)| {
        samples.iter().any(|s| s.target == target && s.complexity == complexity && s.users == users)
    })
    .map(|(target, complexity, users)| {
        let mut rounds: Vec<&CellResult> = samples
            .iter()
            .filter(|s| s.target == target && s.complexity == complexity && s.users == users)
            .collect();
        rounds.sort_by(|a, b| a.throughput_per_s.total_cmp(&b.throughput_per_s));
        MedianCell {
            median: rounds[(rounds.len() - 1) / 2].clone(),
            rounds: rounds.len(),
            throughput_per_s_min: rounds[0].throughput_per_s,
            throughput_per_s_max: rounds[rounds.len() - 1].throughput_per_s,
            errors_all_rounds: rounds.iter().map(|r| r.errors).sum(),
        }
    })
    .collect()
}

fn summary_table(cells: &[MedianCell]) -> Table {
    let headers = [
        "target",
        "complexity",
        "users",
        "rounds",
        "median req/s",
        "min req/s",
        "max req/s",
        "errors",
    ];
    let mut table = Table::new(headers.into_iter().chain(LATENCY_HEADERS))
        .with_title("web matrix (closed loop; median over rounds, latency of the median round)");
    for cell in cells {
        let r = &cell.median;
        let cells = [
            r.target.clone(),
            r.complexity.name().to_string(),
            r.users.to_string(),
            cell.rounds.to_string(),
            format!("{:.1}", r.throughput_per_s),
            format!("{:.1}", cell.throughput_per_s_min),
            format!("{:.1}", cell.throughput_per_s_max),
            cell.errors_all_rounds.to_string(),
        ];
        table.row(cells.into_iter().chain(latency_cells(&r.latency)));
    }
    table
}

struct Checks {
    table: Table,
    missed: Vec<String>,
    /// The target ratios in one line each, for scripts and the summary.
    headline: Vec<String>,
}

/// Labels of the Python baselines start with this.
const PYTHON_LABEL_PREFIX: &str = "python-";

/// Models served as one pinned process per core (the others, `adaptive` in its default shared
/// layout included, run side by side in one process).
const PER_CORE_MODELS: [Model; 1] = [Model::Prefork];

const FIXED_MODELS: [&str; 4] = ["single", "pool", "pinned", "prefork"];

fn median_of(
    cells: &[MedianCell],
    target: &str,
    complexity: Complexity,
    users: usize,
) -> Option<f64> {
    cells
        .iter()
        .map(|c| &c.median)
        .find(|r| r.target == target && r.complexity == complexity && r.users == users)
        .map(|r| r.throughput_per_s)
}

/// Per round, adaptive over `best` (the runs of a round are interleaved, so each ratio pairs
/// measurements taken close together in time, under the same background load and host speed).
fn paired_ratios(
    samples: &[CellResult],
    complexity: Complexity,
    users: usize,
    best: &str,
) -> Vec<f64> {
    let rounds = samples.iter().map(|s| s.round).max().map_or(0, |r| r + 1);
    (0..rounds)
        .filter_map(|round| {
            let of = |target: &str| {
                samples
                    .iter()
                    .find(|s| {
                        s.round == round
                            && s.target == target
                            && s.complexity == complexity
                            && s.users == users
                    })
                    .map(|s| s.throughput_per_s)
            };
            Some(of("adaptive")? / of(best)?)
        })
        .collect()
}

/// Confidence of the interval shown around each paired-ratio median.
const RATIO_CONFIDENCE: f64 = 0.95;

/// The median of paired `ratios` and its distribution-free interval at `RATIO_CONFIDENCE` as
/// `low..high` (empty when the ratios are too few for one).
pub fn median_with_interval(ratios: Vec<f64>) -> (f64, String) {
    let interval = crate::statistics::median_ci(ratios.clone(), RATIO_CONFIDENCE)
        .map_or_else(String::new, |(low, high)| format!("{low:.3}..{high:.3}"));
    (stats::median(ratios), interval)
}

/// The median of `ours[i] / peer[i]` over the pairs and its 95% interval (`low..high`, empty
/// when the pairs are too few): `web ratio`, for scripts that run a peer tool alternately with
/// leantier (scripts/bench-web's wrk cross-check).
pub fn paired_ratio_of(ours: &[f64], peer: &[f64]) -> Result<(f64, String), BadInput> {
    if ours.len() != peer.len() || ours.is_empty() {
        return Err(BadInput(format!(
            "--ours and --peer need the same, non-zero number of runs (got {} and {})",
            ours.len(),
            peer.len()
        )));
    }
    let positive = |x: &f64| x.is_finite() && *x > 0.0;
    if !(ours.iter().all(positive) && peer.iter().all(positive)) {
        return Err(BadInput("throughputs must be finite and > 0".into()));
    }
    Ok(median_with_interval(ours.iter().zip(peer).map(|(o, p)| o / p).collect()))
}

/// The targets. Adaptive's ratio in a cell is the median over rounds of its paired ratio to the
/// best fixed model (the one with the highest median throughput there): pairing cancels the
/// host's drift between rounds, which a ratio of two medians would keep.
fn check_targets(samples: &[CellResult], cells: &[MedianCell]) -> Checks {
    let mut table =
        Table::new(["check", "complexity", "users", "ratio", "95% CI", "target", "met"])
            .with_title(
                "targets (adaptive: median of per-round paired ratios, distribution-free CI)",
            );
    let mut missed = Vec::new();
    let mut headline = Vec::new();
    let mut keys: Vec<(Complexity, usize)> =
        cells.iter().map(|c| (c.median.complexity, c.median.users)).collect();
    keys.dedup();
    let (mut adaptive_met, mut adaptive_cells, mut adaptive_worst) = (0, 0, f64::INFINITY);
    for (complexity, users) in keys {
        let Some(adaptive) = median_of(cells, "adaptive", complexity, users) else {
            continue;
        };
        let best = FIXED_MODELS
            .iter()
            .filter_map(|m| median_of(cells, m, complexity, users).map(|t| (t, *m)))
            .max_by(|a, b| a.0.total_cmp(&b.0));
        if let Some((_, name)) = best {
            let (ratio, interval) =
                median_with_interval(paired_ratios(samples, complexity, users, name));
            let check =
                Check { name: &format!("adaptive / best fixed ({name})"), complexity, users };
            let met =
                record(&mut table, &mut missed, &check, (ratio, &interval), ADAPTIVE_RATIO_MIN);
            adaptive_cells += 1;
            adaptive_met += usize::from(met);
            adaptive_worst = adaptive_worst.min(ratio);
        }
        if let Some(python) = median_of(cells, "python-single", complexity, users)
            && complexity == Complexity::Medium600
            && users == 10
        {
            let ratio = adaptive / python;
            let check = Check { name: "adaptive / python-single", complexity, users };
            record(&mut table, &mut missed, &check, (ratio, ""), PYTHON_SPEEDUP_MIN);
            headline.push(format!(
                "TARGET python: adaptive / python-single at medium-600 x 10 users = {ratio:.1}x (target >= {PYTHON_SPEEDUP_MIN}x)"
            ));
        }
    }
    if adaptive_cells > 0 {
        headline.push(format!(
            "TARGET adaptive: >= {ADAPTIVE_RATIO_MIN} x best fixed in {adaptive_met} of {adaptive_cells} cells; worst cell {adaptive_worst:.3}"
        ));
    }
    Checks { table, missed, headline }
}

/// The name and cell of one check.
struct Check<'a> {
    name: &'a str,
    complexity: Complexity,
    users: usize,
}

/// Adds `check` with `(ratio, its confidence interval)` to the table; returns whether it met `target`.
fn record(
    table: &mut Table,
    missed: &mut Vec<String>,
    check: &Check<'_>,
    (ratio, interval): (f64, &str),
    target: f64,
) -> bool {
    let met = ratio >= target;
    table.row([
        check.name.to_string(),
        check.complexity.name().to_string(),
        check.users.to_string(),
        format!("{ratio:.3}"),
        interval.to_string(),
        format!(">= {target}"),
        if met { "yes" } else { "NO" }.to_string(),
    ]);
    if !met {
        missed.push(format!(
            "{} at {} x {} users: {ratio:.3} < {target}",
            check.name,
            check.complexity.name(),
            check.users
        ));
    }
    met
}

fn write_report(
    args: &MatrixSettings,
    samples: &[CellResult],
    cells: &[MedianCell],
    table: &Table,
    checks: &Checks,
) -> anyhow::Result<()> {
    let report = ReportDir::create(&args.out)?;
    report.write_json("results.json", cells)?;
    report.write_json("samples.json", samples)?;
    report.write_csv("results.csv", table)?;
    report.write_csv("samples.csv", &results_table("every run", samples))?;
    report.write_csv("throughput-over-time.csv", &over_time_long_table(samples))?;
    let mut summary = Markdown::new();
    summary
        .heading(1, "web matrix")
        .paragraph(&format!(
            "Closed loop, {} rounds; per round and cell {} s measured ({} s for Python cells, \
             first round only) after {} s warm-up; models interleaved within each cell, their \
             order rotated. Shapes A rows×50 · B 50×20. Throughput over time per cell: \
             `throughput-over-time.csv` ({} ms intervals, every round).",
            args.rounds,
            args.duration.as_secs_f64(),
            args.python_duration.as_secs_f64(),
            args.warmup.as_secs_f64(),
            args.interval.as_millis()
        ))
        .table(table)
        .table(&checks.table);
    for line in &checks.headline {
        summary.paragraph(line);
    }
    let mut targets: Vec<&str> = Vec::new();
    for c in cells {
        if !targets.contains(&c.median.target.as_str()) {
            targets.push(&c.median.target);
        }
    }
    for &complexity in &args.complexity {
        write_bar_charts(&report, &mut summary, args, cells, &targets, complexity)?;
        for &users in &args.users {
            let series: Vec<(&str, &ThroughputSeries)> = cells
                .iter()
                .map(|c| &c.median)
                // The Python cells' 8 s windows at ~15 req/s would flatten the leantier lines;
                // their series are in the CSV.
                .filter(|r| r.complexity == complexity && r.users == users)
                .filter(|r| !r.target.starts_with(PYTHON_LABEL_PREFIX))
                .map(|r| (r.target.as_str(), &r.throughput_series))
                .collect();
            let title = format!(
                "Throughput over time, {} x {users} users (median round)",
                complexity.name()
            );
            let name = format!("throughput-over-time-{}-{users}u.svg", complexity.name());
            report.write_svg(&name, &throughput_over_time_plot(&title, &series).to_svg())?;
            summary.image(&title, &name);
        }
    }
    report.write_markdown("README.md", summary.as_str())?;
    println!("report: {}", report.path().display());
    Ok(())
}

/// Throughput and p99 bars per target for one complexity level (medians over the rounds).
fn write_bar_charts(
    report: &ReportDir,
    summary: &mut Markdown,
    args: &MatrixSettings,
    cells: &[MedianCell],
    targets: &[&str],
    complexity: Complexity,
) -> anyhow::Result<()> {
    let users: Vec<String> = args.users.iter().map(|u| format!("{u} users")).collect();
    let mut throughput =
        BarChart::new(&format!("Throughput, {}", complexity.name()), "requests/s", users.clone());
    let mut p99 = BarChart::new(&format!("p99 latency, {}", complexity.name()), "p99 ms", users);
    for target in targets {
        let cell = |u: &usize| {
            cells
                .iter()
                .map(|c| &c.median)
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
    Ok(())
}

/// Throughput over time of every run, one row per interval (long format for spreadsheets).
fn over_time_long_table(samples: &[CellResult]) -> Table {
    let mut table = Table::new(["round", "target", "complexity", "users", "t (s)", "req/s"]);
    for r in samples {
        let step_s = r.throughput_series.interval.as_secs_f64();
        for (index, rate) in r.throughput_series.rates_per_s().iter().enumerate() {
            table.row([
                r.round.to_string(),
                r.target.clone(),
                r.complexity.name().to_string(),
                r.users.to_string(),
                format!("{:.3}", (index + 1) as f64 * step_s),
                format!("{rate:.1}"),
            ]);
        }
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `web matrix`'s defaults with three rounds and a Python interpreter.
    fn three_rounds_with_python() -> MatrixSettings {
        MatrixSettings {
            models: Model::ALL.to_vec(),
            users: vec![10, 30, 60],
            complexity: Complexity::ALL.to_vec(),
            duration: Duration::from_millis(350),
            warmup: Duration::from_millis(150),
            rounds: 3,
            interval: Duration::from_millis(100),
            workers: None,
            python: Some("python3".into()),
            python_app: "bench/web-python/app.py".into(),
            python_complexity: vec![Complexity::Medium600],
            python_duration: Duration::from_secs(8),
            python_users: vec![10],
            out: PathBuf::new(),
            child_args: Vec::new(),
        }
    }

    fn sample(target: &str, round: usize, throughput_per_s: f64) -> CellResult {
        CellResult {
            target: target.into(),
            complexity: Complexity::Low,
            users: 10,
            round,
            throughput_per_s,
            completed: 0,
            errors: 0,
            latency: stats::LatencyHistogram::new().summary(),
            send_lag: stats::LatencyHistogram::new().summary(),
            throughput_series: ThroughputSeries {
                interval: Duration::from_secs(1),
                counts: vec![],
            },
        }
    }

    #[test]
    fn rounds_interleave_every_model_in_rotating_order() {
        let args = three_rounds_with_python();
        let cells: Vec<(Complexity, usize)> =
            args.complexity.iter().flat_map(|&c| args.users.iter().map(move |&u| (c, u))).collect();
        // 5 models and the two Python baselines (targets 5 and 6).
        let runs = interleaved_runs(&args, &cells, 7);
        let mut followers = std::collections::HashSet::new();
        for round in 0..3 {
            for (cell, &key) in cells.iter().enumerate() {
                let order: Vec<usize> = runs
                    .iter()
                    .filter(|r| r.round == round && r.cell == cell)
                    .map(|r| r.target)
                    .collect();
                let mut models: Vec<usize> = order.iter().copied().filter(|&t| t < 5).collect();
                assert_eq!(order[..5], models[..], "models first, Python after them");
                followers.extend(models.windows(2).map(|pair| (pair[0], pair[1])));
                models.sort_unstable();
                assert_eq!(models, [0, 1, 2, 3, 4], "each model once per round and cell");
                let python = key == (Complexity::Medium600, 10) && round == 0;
                assert_eq!(order.len(), if python { 7 } else { 5 }, "round {round} cell {cell}");
            }
        }
        // Each model is measured after more than one other model.
        for model in 0..5 {
            let before: std::collections::HashSet<usize> =
                followers.iter().filter(|(_, after)| *after == model).map(|(b, _)| *b).collect();
            assert!(before.len() >= 2, "model {model} always follows {before:?}");
        }
    }

    #[test]
    fn ratio_pairs_runs_in_order_and_refuses_bad_input() {
        let ours = [100.0, 200.0, 300.0, 400.0, 500.0, 600.0];
        let peer = [100.0, 100.0, 300.0, 800.0, 500.0, 300.0];
        // Ratios 1, 2, 1, 0.5, 1, 2: median 1; six pairs give the widest 95% interval.
        assert_eq!(paired_ratio_of(&ours, &peer).unwrap(), (1.0, "0.500..2.000".to_string()));
        assert_eq!(paired_ratio_of(&ours[..3], &peer[..3]).unwrap(), (1.0, String::new()));
        let uneven = paired_ratio_of(&ours, &peer[..5]).unwrap_err();
        assert!(uneven.0.contains("same, non-zero number"), "{uneven}");
        assert!(paired_ratio_of(&[], &[]).is_err());
        assert!(paired_ratio_of(&[1.0], &[0.0]).unwrap_err().0.contains("> 0"));
        assert!(paired_ratio_of(&[f64::NAN], &[1.0]).is_err());
    }

    #[test]
    fn cells_report_the_median_round_and_paired_ratios() {
        // The host drifts: round 2 is slow for adaptive's run. Paired per round, adaptive is
        // 0.96, 0.97 and 0.75 of prefork (median 0.96: met); a ratio of the medians would read
        // 150 / 200 = 0.75. Pinned beats prefork in round 0 only: prefork is best by median.
        let samples = vec![
            sample("prefork", 0, 100.0),
            sample("pinned", 0, 120.0),
            sample("adaptive", 0, 96.0),
            sample("prefork", 1, 300.0),
            sample("pinned", 1, 150.0),
            sample("adaptive", 1, 290.0),
            sample("prefork", 2, 200.0),
            sample("pinned", 2, 140.0),
            sample("adaptive", 2, 150.0),
        ];
        let targets: Vec<Target> = ["prefork", "pinned", "adaptive"]
            .map(|label| Target { label: label.into(), url: String::new(), python: false })
            .into();
        let cells = median_cells(&samples, &[(Complexity::Low, 10)], &targets);
        assert_eq!(cells.len(), 3);
        assert_eq!(cells[0].median.target, "prefork");
        assert_eq!((cells[0].median.throughput_per_s, cells[0].median.round), (200.0, 2));
        assert_eq!((cells[0].throughput_per_s_min, cells[0].throughput_per_s_max), (100.0, 300.0));
        let paired = paired_ratios(&samples, Complexity::Low, 10, "prefork");
        assert_eq!(paired, vec![0.96, 290.0 / 300.0, 0.75]);
        let checks = check_targets(&samples, &cells);
        assert!(checks.missed.is_empty(), "paired median 0.96 meets 0.95: {:?}", checks.missed);
        assert!(
            checks.headline[0].contains("1 of 1 cells; worst cell 0.960"),
            "{:?}",
            checks.headline
        );
        // One more slow round for adaptive turns the median below the target.
        let mut slower = samples.clone();
        slower.extend([sample("prefork", 3, 200.0), sample("adaptive", 3, 100.0)]);
        slower.extend([sample("prefork", 4, 200.0), sample("adaptive", 4, 100.0)]);
        let cells = median_cells(&slower, &[(Complexity::Low, 10)], &targets);
        let checks = check_targets(&slower, &cells);
        assert_eq!(checks.missed.len(), 1, "{:?}", checks.missed);
    }
}
