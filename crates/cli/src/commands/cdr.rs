//! `leantier cdr ...`: run the pipeline with a planner config and compare with the prediction.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::planner::BudgetArg;
use super::values;
use crate::outcome::{BadInput, TargetMissed};
use clap::{Args as ClapArgs, Subcommand};
use experiments::plot::{BarChart, LinePlot};
use experiments::report::{Markdown, ReportDir, Table};
use planner::model::PipelineConfig;

use cdr::feed::{DbTarget, FEED_BATCH_ROWS_DEFAULT, FEED_BATCH_ROWS_MAX};
use cdr::online::{REPLAN_RATE_CHANGE_MIN_DEFAULT, TimelinePoint};
use cdr::predict::{Comparison, Offered, compare};
use cdr::run::{
    Arrivals, NODE_NAMES, NodeThreads, OnlineSettings, RateStep, RunSettings, RunSummary,
    run_pipeline,
};
use cdr::serialize::FSYNC_EVERY_RECORDS_DEFAULT;
use cdr::ticket::MALFORMED_EVERY_DEFAULT;
use cdr::validate::{
    ConfigurationSummary, DEFAULT_CONFIGURATIONS, RoundResult, ValidateSettings,
    all_configurations, default_scratch_dir, remove_scratch_dir, summarize, validate,
};

/// The call-data-ticket pipeline.
#[derive(Debug, ClapArgs)]
pub struct Args {
    #[command(subcommand)]
    pub command: Command,
}

/// The cdr subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the pipeline with the thread counts of a planner config; print measured vs
    /// predicted throughput and utilization per node.
    Run(RunArgs),
    /// Validate the model: for each configuration, measure the nodes and run the pipeline flat
    /// out back to back, interleaved and repeated; print predicted vs measured maximum
    /// throughput, the median ratio per configuration and its split into cores used / usable
    /// cores and the model's / the run's CPU per ticket.
    Validate(ValidateArgs),
}

/// `cdr validate`.
#[derive(Debug, ClapArgs)]
pub struct ValidateArgs {
    /// Rounds over all configurations (medians are taken over rounds).
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// How long each node is measured alone, per round, e.g. 300ms.
    #[arg(
        long,
        alias = "measure-s",
        value_name = "DURATION",
        value_parser = values::seconds,
        default_value = "300ms"
    )]
    pub measure: Duration,
    /// How long each flat-out run lasts, e.g. 1.5s (the defaults keep 3 rounds of the default
    /// four configurations about a minute).
    #[arg(
        long = "run",
        alias = "run-s",
        value_name = "DURATION",
        value_parser = values::seconds,
        default_value = "1.5s"
    )]
    pub run_for: Duration,
    /// Only these configurations (comma-separated, as every list flag, or repeated):
    /// feeder-bound, cpu-bound, cpu-bound-2-converters, feeder-bound-16-rows-2-decoders (the
    /// default four), fsync-bound-serializer.
    #[arg(long = "only", value_name = "NAME", value_delimiter = ',')]
    pub only: Vec<String>,
    /// Folder for the runs' files (default: a fresh folder under the system temp dir).
    #[arg(long)]
    pub scratch_dir: Option<PathBuf>,
    /// Generator seed of the first round (later rounds add the round number).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Fail (exit 3) if a configuration's median ratio is outside 1 ± this fraction.
    #[arg(long)]
    pub check: Option<f64>,
    /// What bounds the prediction. `cpu` (the default): the lower of the first node to
    /// saturate and the cores' bound, the cores scaled by a usable share and each hop charged
    /// the CPU that a short probe with the configuration's thread counts measures right before
    /// each run. `threads`: as published, every thread on a core of its own, so the first node
    /// to saturate alone (no probe).
    #[arg(long, value_enum, default_value_t = BudgetArg::Cpu)]
    pub budget: BudgetArg,
    /// Report folder: the results (every round and the medians) as JSON, CSV and Markdown
    /// with an SVG bar chart.
    #[arg(long, alias = "report", default_value = "leantier-report/cdr-validate")]
    pub out: PathBuf,
}

/// `cdr run`.
#[derive(Debug, ClapArgs)]
pub struct RunArgs {
    /// Pipeline config file (`config.toml` from `leantier plan optimize`).
    #[arg(long)]
    pub config: PathBuf,
    /// Poisson ticket rate per second; default: the config's planned rate.
    #[arg(long, allow_negative_numbers = true, conflicts_with_all = ["find_max", "rate_steps"])]
    pub rate: Option<f64>,
    /// Run the generator flat out and compare with the predicted maximum throughput.
    #[arg(long, alias = "max", conflicts_with = "rate_steps")]
    pub find_max: bool,
    /// A rate profile instead of one rate: Poisson steps `RATE:SECONDSs` back to back, e.g.
    /// `2000:10s,8000:10s,3000:10s` (also `ms`); the run lasts their sum (--duration is
    /// ignored).
    #[arg(long, value_name = "RATE:DURATION,...")]
    pub rate_steps: Option<String>,
    /// Online mode: a controller measures the arrival rate and utilizations every control
    /// interval, re-plans with the config's model when the rate moved past --replan-threshold,
    /// and resizes the nodes without losing tickets; prints and writes a timeline.
    #[arg(long)]
    pub online: bool,
    /// Online mode: workers spawned per node, the most the controller can use (nodes the
    /// model fixes, e.g. the SQLite feeder, keep their fixed count).
    #[arg(long, default_value_t = ONLINE_MAX_THREADS_DEFAULT, requires = "online")]
    pub max_threads: usize,
    /// Online mode: re-plan when the arrival rate moved more than this fraction from the rate
    /// the threads in force were planned for (hysteresis).
    #[arg(long, default_value_t = REPLAN_RATE_CHANGE_MIN_DEFAULT, requires = "online")]
    pub replan_threshold: f64,
    /// Online mode: time between controller measurements, e.g. 500ms (at least 200ms).
    #[arg(
        long,
        alias = "control-interval-ms",
        value_name = "DURATION",
        value_parser = values::millis,
        default_value = "500ms",
        requires = "online"
    )]
    pub control_interval: Duration,
    /// Override a node's thread count, `NAME=THREADS` (repeatable).
    #[arg(long = "threads", value_name = "NAME=THREADS")]
    pub threads: Vec<String>,
    /// How long the generator runs, e.g. 5s.
    #[arg(
        long,
        alias = "duration-s",
        value_name = "DURATION",
        value_parser = values::seconds,
        default_value = "5s"
    )]
    pub duration: Duration,
    /// Report folder: the comparison (JSON, CSV, Markdown; under 64 KiB whatever the run's
    /// length) or, online, the timeline with SVG plots (about 2 KiB per control interval).
    /// The pipeline's own output goes to --data-dir.
    #[arg(long, aliases = ["out-dir", "report"], default_value = "leantier-report/cdr-run")]
    pub out: PathBuf,
    /// Folder for the pipeline's own output: serialized files, reject files and the SQLite
    /// database (about 100 bytes per ticket: 300 MB for 2 s at 1.2M tickets/s); kept. Default:
    /// a fresh folder under the system temp dir, removed after the run.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// PostgreSQL URL for the feeder (default: SQLite in --out).
    #[arg(long, env = "LEANTIER_PG_URL")]
    pub db_url: Option<String>,
    /// Serializer fsync policy: one fdatasync per this many records (0 = only at the end).
    #[arg(long, default_value_t = FSYNC_EVERY_RECORDS_DEFAULT)]
    pub fsync_every: u64,
    /// Rows per feeder transaction (1..=65536).
    #[arg(long, default_value_t = FEED_BATCH_ROWS_DEFAULT)]
    pub feed_batch_rows: usize,
    /// Every n-th ticket is malformed (0 = none).
    #[arg(long, default_value_t = MALFORMED_EVERY_DEFAULT)]
    pub malformed_every: u64,
    /// Generator seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Fail (exit 3) if the measured throughput is outside ±this fraction of the prediction.
    #[arg(long)]
    pub check: Option<f64>,
}

/// Online mode's default for `--max-threads`.
pub const ONLINE_MAX_THREADS_DEFAULT: usize = 4;
/// The shortest control interval: the runtime publishes metrics every 100 ms, so shorter
/// intervals would see stale counts.
const CONTROL_INTERVAL_MIN: Duration = Duration::from_millis(200);

/// Runs a `cdr` subcommand.
pub fn run(args: &Args) -> anyhow::Result<()> {
    match &args.command {
        Command::Run(run_args) => run_with_config(run_args),
        Command::Validate(validate_args) => run_validation(validate_args),
    }
}

fn apply_overrides(config: &mut PipelineConfig, overrides: &[String]) -> anyhow::Result<()> {
    for item in overrides {
        let parsed =
            item.split_once('=').and_then(|(name, n)| Some((name, n.parse::<u32>().ok()?)));
        let Some((name, threads)) = parsed.filter(|(_, n)| *n > 0) else {
            return Err(
                BadInput(format!("--threads expects NAME=THREADS (>= 1), got {item}")).into()
            );
        };
        let node = config.node.iter_mut().find(|node| node.name == name);
        let node =
            node.ok_or_else(|| BadInput(format!("--threads {item}: unknown node name {name}")))?;
        node.threads = threads;
    }
    Ok(())
}

fn node_threads(config: &PipelineConfig) -> anyhow::Result<NodeThreads> {
    let get = |name: &str| -> anyhow::Result<usize> {
        let threads = config.threads_of(name);
        let threads =
            threads.ok_or_else(|| BadInput(format!("config has no [[node]] named {name}")))?;
        if threads == 0 {
            return Err(BadInput(format!("node {name}: threads must be >= 1")).into());
        }
        Ok(threads as usize)
    };
    anyhow::ensure!(get("generator")? == 1, BadInput("the generator runs one thread".into()));
    Ok(NodeThreads {
        decoder: get("decoder")?,
        converter: get("converter")?,
        serializer: get("serializer")?,
        feeder: get("feeder")?,
    })
}

/// Parses `RATE:DURATION,...` (durations `10s`, `1.5s` or `500ms`).
pub fn parse_rate_steps(text: &str) -> Result<Vec<RateStep>, BadInput> {
    let bad = |item: &str, why: &str| {
        BadInput(format!("--rate-steps: {item}: {why} (expected RATE:SECONDSs or RATE:MSms)"))
    };
    text.split(',')
        .map(|item| {
            let (rate, duration) = item.split_once(':').ok_or_else(|| bad(item, "no ':'"))?;
            let rate_per_s: f64 = rate.trim().parse().map_err(|_| bad(item, "bad rate"))?;
            let duration = duration.trim();
            let seconds = match duration.strip_suffix("ms") {
                Some(ms) => ms.parse::<f64>().map(|ms| ms / 1e3),
                None => duration.strip_suffix('s').unwrap_or(duration).parse::<f64>(),
            };
            let seconds = seconds.map_err(|_| bad(item, "bad duration"))?;
            if !(rate_per_s.is_finite() && rate_per_s > 0.0) {
                return Err(bad(item, "the rate must be > 0"));
            }
            if !(seconds.is_finite() && seconds > 0.0) {
                return Err(bad(item, "the duration must be > 0"));
            }
            Ok(RateStep { rate_per_s, duration: Duration::from_secs_f64(seconds) })
        })
        .collect()
}

fn arrivals(args: &RunArgs, config: &PipelineConfig) -> anyhow::Result<Arrivals> {
    if args.duration.is_zero() {
        return Err(BadInput("--duration must be > 0".into()).into());
    }
    let duration = args.duration;
    Ok(match (&args.rate_steps, args.find_max, args.rate) {
        (Some(steps), _, _) => Arrivals::Steps(parse_rate_steps(steps)?),
        (None, true, _) => Arrivals::FlatOut(duration),
        (None, false, rate) => {
            Arrivals::poisson(rate.unwrap_or(config.arrival_rate_per_s), duration)
        }
    })
}

fn online_settings(args: &RunArgs, config: &PipelineConfig) -> anyhow::Result<OnlineSettings> {
    if args.max_threads == 0 {
        return Err(BadInput("--max-threads must be >= 1".into()).into());
    }
    if args.control_interval < CONTROL_INTERVAL_MIN {
        return Err(BadInput(format!(
            "--control-interval must be >= {CONTROL_INTERVAL_MIN:?} (metrics publish every \
             100 ms), got {:?}",
            args.control_interval
        ))
        .into());
    }
    let max_of = |name: &str| {
        let node = config.model.node.iter().find(|node| node.name == name);
        node.and_then(|node| node.fixed_threads).map_or(args.max_threads, |fixed| fixed as usize)
    };
    Ok(OnlineSettings {
        model: config.model.clone(),
        planned_rate_per_s: config.arrival_rate_per_s,
        max_threads: NodeThreads {
            decoder: max_of("decoder"),
            converter: max_of("converter"),
            serializer: max_of("serializer"),
            feeder: max_of("feeder"),
        },
        control_interval: args.control_interval,
        replan_rate_change_min: args.replan_threshold,
    })
}

fn run_with_config(args: &RunArgs) -> anyhow::Result<()> {
    let mut config: PipelineConfig = ops::config::load_toml(Some(&args.config))?;
    apply_overrides(&mut config, &args.threads)?;
    let threads = node_threads(&config)?;
    let arrivals = arrivals(args, &config)?;
    if !(1..=FEED_BATCH_ROWS_MAX).contains(&args.feed_batch_rows) {
        let rows = args.feed_batch_rows;
        return Err(BadInput(format!(
            "--feed-batch-rows must be in 1..={FEED_BATCH_ROWS_MAX}, got {rows}"
        ))
        .into());
    }
    let online = if args.online { Some(online_settings(args, &config)?) } else { None };
    let data_dir = args.data_dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("leantier-cdr-run-{}", std::process::id()))
    });
    let database = match &args.db_url {
        Some(url) => DbTarget::Postgres {
            url: url.clone(),
            table: format!("leantier_cdr_run_{}", std::process::id()),
        },
        None => DbTarget::Sqlite(data_dir.join("cdr.sqlite")),
    };
    let settings = RunSettings {
        threads,
        arrivals,
        online,
        out_dir: data_dir.clone(),
        database,
        fsync_every_records: args.fsync_every,
        feed_batch_rows: args.feed_batch_rows,
        malformed_every: args.malformed_every,
        seed: args.seed,
    };
    let summary = run_counted(&settings);
    if args.data_dir.is_none() && data_dir.exists() {
        std::fs::remove_dir_all(&data_dir)?;
    }
    let summary = summary?;
    let duration_s = settings.arrivals.duration().as_secs_f64();
    print_run(args, &summary, duration_s, config.model.host.cores);
    if args.online {
        return report_timeline(&summary.timeline, &args.out);
    }
    report_comparison(args, &config, &summary, &settings.arrivals)
}

/// Runs the pipeline and checks its accounting: every valid ticket reached both outputs and
/// the database gained exactly the rows the feeders inserted.
fn run_counted(settings: &RunSettings) -> anyhow::Result<RunSummary> {
    let database = &settings.database;
    // A --data-dir's SQLite file may hold earlier runs' rows: count what this run added.
    std::fs::create_dir_all(&settings.out_dir)?;
    database.prepare()?;
    let rows_before = database.count_rows()?;
    let summary = run_pipeline(settings)?;
    check_no_ticket_lost(&summary)?;
    let rows = database.count_rows().map(|rows| rows - rows_before);
    if let DbTarget::Postgres { .. } = database {
        database.drop_table()?;
    }
    let rows = rows?;
    anyhow::ensure!(
        rows == summary.inserted,
        "the run added {rows} database rows but the feeders inserted {}",
        summary.inserted
    );
    Ok(summary)
}

fn print_run(args: &RunArgs, summary: &RunSummary, duration_s: f64, model_cores: f64) {
    let rejects = match &args.data_dir {
        Some(dir) => format!("see {}/rejects-*.log", dir.display()),
        None => "keep them with --data-dir".into(),
    };
    println!(
        "generated {} tickets ({:.0}/s), rejected {} ({rejects}), serialized {}, inserted {}",
        summary.generated,
        summary.generated as f64 / duration_s,
        summary.rejected,
        summary.serialized,
        summary.inserted,
    );
    println!(
        "CPU used: {:.2} cores ({:.2} µs per generated ticket); model's core budget {model_cores:.2}",
        summary.cpu_s / summary.wall_s,
        summary.cpu_s * 1e6 / summary.generated.max(1) as f64,
    );
}

/// Measured against predicted, printed and written to `--out`; exit 3 outside `--check`.
fn report_comparison(
    args: &RunArgs,
    config: &PipelineConfig,
    summary: &RunSummary,
    arrivals: &Arrivals,
) -> anyhow::Result<()> {
    let offered = arrivals.offered();
    let duration_s = arrivals.duration().as_secs_f64();
    let comparison = compare(config, summary, duration_s, offered)?;
    let table = comparison_table(&comparison, offered == Offered::FlatOut);
    print!("{table}");
    let ratio = comparison.measured_throughput_per_s / comparison.predicted_throughput_per_s;
    if let Some(asked) = comparison.offered_rate_per_s {
        println!(
            "offered {asked:.0}/s (predicted for that rate); the generator made {:.0}/s",
            comparison.generated_per_s
        );
    }
    println!(
        "stored throughput measured {:.0}/s vs predicted {:.0}/s (ratio {ratio:.3})",
        comparison.measured_throughput_per_s, comparison.predicted_throughput_per_s,
    );
    let report = ReportDir::create(&args.out)?;
    report.write_json("comparison.json", &comparison)?;
    report.write_csv("comparison.csv", &table)?;
    let mut markdown = Markdown::new();
    markdown.heading(1, "cdr run: measured vs predicted").table(&table);
    report.write_markdown("comparison.md", markdown.as_str())?;
    if let Some(tolerance) = args.check
        && (ratio - 1.0).abs() > tolerance
    {
        return Err(TargetMissed(vec![format!(
            "measured/predicted throughput {ratio:.3} is outside 1 ± {tolerance}"
        )])
        .into());
    }
    Ok(())
}

/// The online timeline: time, measured arrival rate, threads and utilization per node.
pub fn timeline_table(timeline: &[TimelinePoint]) -> Table {
    let nodes = &NODE_NAMES[1..];
    let mut headers = vec!["time s".to_owned(), "arrivals/s".into(), "re-plan d/c/s/f".into()];
    headers.extend(nodes.iter().map(|node| format!("{node} threads")));
    headers.extend(nodes.iter().map(|node| format!("{node} util")));
    let mut table = Table::new(headers).with_title("online run timeline");
    for point in timeline {
        let mut row = vec![
            format!("{:.1}", point.time_s),
            format!("{:.0}", point.arrival_rate_per_s),
            point.replan_threads.as_ref().map_or_else(String::new, |threads| {
                let counts: Vec<String> = threads[1..].iter().map(u32::to_string).collect();
                format!("→ {}", counts.join("/"))
            }),
        ];
        row.extend(point.threads[1..].iter().map(u32::to_string));
        row.extend(point.utilization[1..].iter().map(|u| format!("{u:.3}")));
        table.row(row);
    }
    table
}

fn report_timeline(timeline: &[TimelinePoint], dir: &Path) -> anyhow::Result<()> {
    let table = timeline_table(timeline);
    print!("{table}");
    let replans = timeline.iter().filter(|point| point.replan_threads.is_some()).count();
    println!("{replans} re-plans over {} control intervals", timeline.len());
    let report = ReportDir::create(dir)?;
    report.write_json("timeline.json", timeline)?;
    report.write_csv("timeline.csv", &table)?;
    let series = |pick: &dyn Fn(&TimelinePoint) -> f64| -> Vec<(f64, f64)> {
        timeline.iter().map(|point| (point.time_s, pick(point))).collect()
    };
    let rate = LinePlot::new("online run: arrival rate", "time (s)", "tickets/s")
        .series("measured arrivals", series(&|point| point.arrival_rate_per_s));
    let mut threads = LinePlot::new("online run: active threads per node", "time (s)", "threads");
    let mut utilization = LinePlot::new("online run: utilization", "time (s)", "busy fraction");
    for (index, node) in NODE_NAMES.iter().enumerate().skip(1) {
        threads = threads.series(node, series(&|point| f64::from(point.threads[index])));
        utilization = utilization.series(node, series(&|point| point.utilization[index]));
    }
    report.write_svg("timeline-rate.svg", &rate.to_svg())?;
    report.write_svg("timeline-threads.svg", &threads.to_svg())?;
    report.write_svg("timeline-utilization.svg", &utilization.to_svg())?;
    let mut markdown = Markdown::new();
    markdown
        .heading(1, "cdr run --online: timeline")
        .image("arrival rate", "timeline-rate.svg")
        .image("threads", "timeline-threads.svg")
        .image("utilization", "timeline-utilization.svg")
        .table(&table);
    report.write_markdown("timeline.md", markdown.as_str())?;
    Ok(())
}

fn run_validation(args: &ValidateArgs) -> anyhow::Result<()> {
    let positive = |name: &str, value: Duration| {
        if value.is_zero() { Err(BadInput(format!("--{name} must be > 0"))) } else { Ok(value) }
    };
    if args.rounds == 0 {
        return Err(BadInput("--rounds must be >= 1".into()).into());
    }
    let configurations = chosen_configurations(&args.only)?;
    let settings = ValidateSettings {
        rounds: args.rounds,
        measure_duration: positive("measure", args.measure)?,
        run_duration: positive("run", args.run_for)?,
        scratch_dir: args.scratch_dir.clone().unwrap_or_else(default_scratch_dir),
        seed: args.seed,
        budget: args.budget.into(),
    };
    let progress = experiments::progress::progress_bar(
        (args.rounds * configurations.len()) as u64,
        "measure + run",
    );
    let results = validate(&configurations, &settings, |result| {
        tracing::info!(
            configuration = %result.configuration,
            round = result.round,
            predicted_per_s = result.predicted_per_s,
            measured_per_s = result.measured_per_s,
            "validation round"
        );
        progress.inc(1);
    });
    progress.finish_and_clear();
    if args.scratch_dir.is_none() {
        remove_scratch_dir(&settings.scratch_dir)?;
    }
    let results = results?;
    let summaries = summarize(&configurations, &results);
    let rounds_table = validation_rounds_table(&results);
    let table = validation_table(&summaries);
    print!("{rounds_table}");
    print!("{table}");
    write_validation_report(&args.out, (&results, &summaries), (&table, &rounds_table))?;
    if let Some(tolerance) = args.check {
        let missed: Vec<String> = summaries
            .iter()
            .filter(|s| (s.ratio_median - 1.0).abs() > tolerance)
            .map(|s| {
                format!(
                    "{}: median ratio {:.3} outside 1 ± {tolerance}",
                    s.configuration, s.ratio_median
                )
            })
            .collect();
        if !missed.is_empty() {
            return Err(TargetMissed(missed).into());
        }
    }
    Ok(())
}

/// The named configurations (`--only`), else the default first ones; an unknown name is bad
/// input.
fn chosen_configurations(only: &[String]) -> anyhow::Result<Vec<cdr::validate::Configuration>> {
    let mut configurations = all_configurations();
    if only.is_empty() {
        configurations.truncate(DEFAULT_CONFIGURATIONS);
        return Ok(configurations);
    }
    if let Some(unknown) = only.iter().find(|name| !configurations.iter().any(|c| &c.name == *name))
    {
        return Err(BadInput(format!("--only {unknown}: no such configuration")).into());
    }
    configurations.retain(|c| only.contains(&c.name));
    Ok(configurations)
}

/// `cdr validate`'s report folder: every round and the summaries as JSON and CSV, the median
/// ratios as a bar chart, and both tables in `validation.md`.
fn write_validation_report(
    out: &std::path::Path,
    (results, summaries): (&[cdr::validate::RoundResult], &[cdr::validate::ConfigurationSummary]),
    (table, rounds_table): (&Table, &Table),
) -> anyhow::Result<()> {
    let report = ReportDir::create(out)?;
    report.write_json("validation-rounds.json", &results)?;
    report.write_json("validation.json", &summaries)?;
    report.write_csv("validation-rounds.csv", rounds_table)?;
    report.write_csv("validation.csv", table)?;
    let chart = BarChart::new(
        "measured / predicted maximum throughput (median over rounds)",
        "ratio",
        summaries.iter().map(|s| s.configuration.clone()),
    )
    .group("median ratio", summaries.iter().map(|s| s.ratio_median).collect());
    report.write_svg("validation.svg", &chart.to_svg())?;
    let mut markdown = Markdown::new();
    markdown
        .heading(1, "cdr validate: measured vs predicted maximum throughput")
        .image("median ratio per configuration", "validation.svg")
        .table(table)
        .table(rounds_table);
    report.write_markdown("validation.md", markdown.as_str())?;
    Ok(())
}

/// Every round of a validation.
pub fn validation_rounds_table(results: &[RoundResult]) -> Table {
    let mut table = Table::new([
        "configuration",
        "round",
        "bottleneck (model)",
        "cores before",
        "cores after",
        "cores used",
        "usable share (probe)",
        "hop ns",
        "predicted/s",
        "measured/s",
        "ratio",
        "= cores used/usable",
        "× c_model/c_run",
    ])
    .with_title("validation rounds (measurement, probe, then run, back to back)");
    for result in results {
        table.row([
            result.configuration.clone(),
            result.round.to_string(),
            result.predicted_bottleneck.clone(),
            format!("{:.2}", result.cores_before),
            format!("{:.2}", result.cores_after),
            format!("{:.2}", result.cores_used),
            format!("{:.3}", result.usable_core_share),
            format!("{:.0}", result.hop_cpu_s * 1e9),
            format!("{:.0}", result.predicted_per_s),
            format!("{:.0}", result.measured_per_s),
            format!("{:.3}", result.ratio()),
            format!("{:.3}", result.cores_used_share),
            format!("{:.3}", result.cpu_model_over_run),
        ]);
    }
    table
}

/// Medians per configuration.
pub fn validation_table(summaries: &[ConfigurationSummary]) -> Table {
    let mut table = Table::new([
        "configuration",
        "threads d/c/s/f",
        "bottleneck (model)",
        "predicted/s (median)",
        "measured/s (median)",
        "ratio (median)",
        "ratio range",
        "usable share (probe)",
        "cores used/usable",
        "c_model/c_run",
    ])
    .with_title("measured vs predicted maximum throughput");
    for summary in summaries {
        let [d, c, s, f] = summary.threads.as_array();
        table.row([
            summary.configuration.clone(),
            format!("{d}/{c}/{s}/{f}"),
            summary.predicted_bottleneck.clone(),
            format!("{:.0}", summary.predicted_per_s_median),
            format!("{:.0}", summary.measured_per_s_median),
            format!("{:.3}", summary.ratio_median),
            format!("{:.3}–{:.3}", summary.ratio_min, summary.ratio_max),
            format!("{:.3}", summary.usable_core_share_median),
            format!("{:.3}", summary.cores_used_share_median),
            format!("{:.3}", summary.cpu_model_over_run_median),
        ]);
    }
    table
}

/// Every valid ticket reached both outputs; every other one is in a reject file.
fn check_no_ticket_lost(summary: &RunSummary) -> anyhow::Result<()> {
    let valid = summary.generated - summary.rejected;
    anyhow::ensure!(
        summary.serialized == valid && summary.inserted == valid,
        "ticket accounting mismatch: generated {} - rejected {} = {valid}, serialized {}, inserted {}",
        summary.generated,
        summary.rejected,
        summary.serialized,
        summary.inserted
    );
    Ok(())
}

/// Per node: threads, measured and predicted throughput and utilization.
pub fn comparison_table(comparison: &Comparison, flat_out: bool) -> Table {
    let title = if flat_out { "maximum throughput run" } else { "paced run" };
    let mut table = Table::new([
        "node",
        "threads",
        "measured/s",
        "predicted/s",
        "ratio",
        "measured util",
        "predicted util",
    ])
    .with_title(title);
    for node in &comparison.nodes {
        table.row([
            node.name.clone(),
            node.threads.to_string(),
            format!("{:.0}", node.measured_throughput_per_s),
            format!("{:.0}", node.predicted_throughput_per_s),
            format!("{:.3}", node.throughput_ratio()),
            format!("{:.3}", node.measured_utilization),
            format!("{:.3}", node.predicted_utilization),
        ]);
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;
    use planner::model::NodeConfig;

    fn config() -> PipelineConfig {
        let node = |name: &str| NodeConfig { name: name.into(), threads: 1, ..Default::default() };
        PipelineConfig {
            node: ["generator", "decoder", "converter", "serializer", "feeder"].map(node).to_vec(),
            ..Default::default()
        }
    }

    #[test]
    fn thread_overrides_apply_and_bad_ones_are_bad_input() {
        let mut config = config();
        apply_overrides(&mut config, &["converter=3".into()]).unwrap();
        assert_eq!(node_threads(&config).unwrap().converter, 3);
        for bad in ["converter", "converter=0", "converter=x", "convertor=2"] {
            let error = apply_overrides(&mut config, &[bad.into()]).unwrap_err();
            assert!(crate::outcome::is_bad_input(&error), "{bad}: {error}");
        }
        config.node.retain(|node| node.name != "feeder");
        let error = node_threads(&config).unwrap_err();
        assert!(error.to_string().contains("no [[node]] named feeder"), "{error}");
    }

    #[test]
    fn rate_steps_parse_and_bad_ones_are_bad_input() {
        let steps = parse_rate_steps("2000:10s, 8000:1.5s,3000:250ms").unwrap();
        let rates: Vec<f64> = steps.iter().map(|step| step.rate_per_s).collect();
        let millis: Vec<u128> = steps.iter().map(|step| step.duration.as_millis()).collect();
        assert_eq!((rates, millis), (vec![2000.0, 8000.0, 3000.0], vec![10_000, 1500, 250]));
        for bad in ["2000", "x:1s", "2000:xs", "0:1s", "2000:0s", "-5:1s", "2000:1s,"] {
            let error = parse_rate_steps(bad).unwrap_err();
            assert!(error.0.contains("--rate-steps"), "{bad}: {error}");
        }
    }

    /// The help names the default configurations' count once, as the code has it (it said
    /// "three" in one place and "four" in another).
    #[test]
    fn validate_help_counts_the_default_configurations_as_the_code_does() {
        use clap::CommandFactory;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(subcommand)]
            command: Command,
        }
        let mut cli = Cli::command();
        let help = cli.find_subcommand_mut("validate").unwrap().render_long_help().to_string();
        let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
        let words = ["zero", "one", "two", "three", "four", "five", "six"];
        let count = words[DEFAULT_CONFIGURATIONS];
        assert!(help.contains(&format!("default {count} configurations")), "{help}");
        assert!(help.contains(&format!("(the default {count})")), "{help}");
        for (n, other) in words.iter().enumerate().filter(|(n, _)| *n != DEFAULT_CONFIGURATIONS) {
            assert!(!help.contains(&format!("default {other}")), "{n}: {help}");
        }
        let names = all_configurations();
        let listed = names.iter().take(DEFAULT_CONFIGURATIONS).map(|c| c.name.as_str());
        assert!(listed.clone().all(|name| help.contains(name)), "{help}");
    }

    #[test]
    fn lost_tickets_are_reported() {
        let summary = RunSummary {
            generated: 100,
            rejected: 2,
            serialized: 98,
            inserted: 97,
            wall_s: 1.0,
            cpu_s: 0.5,
            stages: Vec::new(),
            timeline: Vec::new(),
        };
        let error = check_no_ticket_lost(&summary).unwrap_err();
        assert!(error.to_string().contains("inserted 97"), "{error}");
        check_no_ticket_lost(&RunSummary { inserted: 98, ..summary }).unwrap();
    }
}
