//! `leantier demo` and `leantier exchange ...`: the flags, and the tables, plots and report
//! folders of the runs and experiments that `experiments::exchange_experiments` performs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::values::{self, one_of};
use crate::outcome::BadInput;
use ::experiments::load::RateSearchReport;
use ::experiments::plot::{LinePlot, latency_percentile_plot};
use ::experiments::report::{
    Markdown, ReportDir, Table, cumulative_buckets_comparison_table, format_ns_as_us, latency_table,
};
use pipeline::metrics::StageMetrics;
use serde::Serialize;
use stats::{CumulativeBucket, LatencyHistogram, LatencySummary};

use ::experiments::exchange_experiments::{
    self as experiments, DEMO_RATES_PER_S, JournalExperiment, JournalRatios, LayoutBench,
    MaxRateSearch, PUBLISHED_PERCENTILES, SYNC_REQUESTS_MAX, Session,
    TARGET_CRITICAL_P99_GROUP_OVER_OFF, measure, published_comparison, rate_label,
};
use ::experiments::tier_load::{Arrival, LoadConfig, RunResult};
use exchange::durability::{JournalMode, JournalOptions};
use exchange::msg::Reason;
use exchange::tier::{
    LayoutChoice, STAGE_SPLIT_SAMPLE_EVERY, STAGE_SPLITS, ShardJournalReport, TierConfig,
    WaitChoice,
};

/// Width of the cumulative latency buckets.
pub const BUCKET_WIDTH_NS: u64 = 10_000;
/// Buckets shown before the "beyond" bucket.
pub const BUCKETS_MAX: usize = 12;
/// The max-rate search's default latency limit: p99 at or below this.
pub const MAX_RATE_P99_LIMIT_DEFAULT: &str = "100us";

/// Runs the exchange tier at 20K, 40K and 60K msg/s beside the published figures, then
/// searches the highest rate whose critical-path p99 stays within the limit (bracketed from
/// both sides, then bisected to 5%), and writes a report folder.
#[derive(clap::Args, Debug, Clone)]
pub struct DemoArgs {
    /// A shorter run with less precise tails.
    #[arg(long)]
    pub quick: bool,
    /// The tier's own critical path in-process, driven by its load generator, without a
    /// network (intended send time → core done, and → reply delivered).
    #[arg(long)]
    pub in_process: bool,
    /// Report folder.
    #[arg(long, default_value = "leantier-report/demo")]
    pub out: PathBuf,
    /// Latency limit of the max-rate searches, e.g. 100us: the highest rate whose p99 stays
    /// within it (order → ack and in-tier response; the durable reply's limit is 2× a raw
    /// fdatasync p99 measured in the same run). `--in-process`: the critical path's, and when
    /// no rate meets it the search runs again at 10× the limit.
    #[arg(
        long,
        alias = "p99-limit-us",
        value_name = "DURATION",
        value_parser = values::micros,
        default_value = MAX_RATE_P99_LIMIT_DEFAULT
    )]
    pub p99_limit: Duration,
    /// Journaling of the sequenced input (into a temporary directory): group holds each reply
    /// until its input is on disk; sync puts the fsync on the critical path; relaxed does not
    /// hold replies; off disables the journal.
    #[arg(long, value_parser = one_of(&JournalMode::ALL, JournalMode::name), default_value = "group")]
    pub journal: JournalMode,
    /// Thread layout: auto plans fused stage groups, workers, spinning and pinning from the
    /// usable CPUs and a calibration run (spinning threads on the CPUs with the fewest device
    /// interrupts; the load generator inline on the first thread when no CPU is spare);
    /// thread-per-stage runs one thread per stage worker.
    #[arg(long, value_parser = one_of(&LayoutChoice::ALL, LayoutChoice::name), default_value = "auto")]
    pub layout: LayoutChoice,
}

/// The reference exchange tier.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    #[command(subcommand)]
    pub command: ExchangeCommand,
}

#[derive(clap::Subcommand, Debug, Clone)]
pub enum ExchangeCommand {
    /// Runs one configuration at the given rates (and optionally the max-rate search).
    Run(RunArgs),
    /// Placement + spinning vs no placement + parking, at 20K/40K/60K msg/s.
    Placement(PlacementArgs),
    /// 1..6 R-Senders at one rate: latency, speedup vs 1 sender and the Karp–Flatt serial
    /// fraction.
    Senders(SendersArgs),
    /// Journal `sync` vs `group` vs `off` at 20K/40K/60K msg/s: critical-path and durable
    /// reply latency, the critical-path p99 ratio group/off and the durable p99 vs a raw 4 KiB
    /// fdatasync measured in the same run on the same disk.
    JournalExperiment(JournalExperimentArgs),
    /// Runs the tier as a network server: the native protocol and a FIX 4.4 acceptor.
    Serve(super::exchange_serve::ServeArgs),
    /// Sends a script of orders over the native protocol and prints the reports.
    Client(super::exchange_serve::ClientArgs),
    /// Prints the argon2 hash of a secret read from stdin, for the credentials file.
    HashSecret(super::exchange_serve::HashSecretArgs),
    /// Drives `exchange serve` open loop over the network and reports order → first report
    /// latency from each order's intended send time.
    Load(super::exchange_serve::LoadArgs),
    /// Runs one delivery edge on NATS: one outlet's responses to its TCP end consumers.
    Edge(super::delivery::EdgeArgs),
    /// `exchange edge`'s old name, run with a warning for one release.
    #[command(hide = true)]
    Gateway(super::delivery::EdgeArgs),
    /// Runs the tier with its R-Senders publishing over NATS, for `exchange edge`s.
    Publish(super::delivery::PublishArgs),
    /// The published delivery experiment (runs 1–7), in-process and over NATS.
    DeliveryExperiment(super::delivery::DeliveryExperimentArgs),
    /// R-Sender → NATS → delivery edge against a plain async-nats pair on the same server.
    DeliveryBench(super::delivery::DeliveryBenchArgs),
    /// The `auto` layout against thread-per-stage at each rate and at each one's maximum
    /// sustainable rate, interleaved in one run, with the ratio of each percentile.
    LayoutBench(LayoutBenchArgs),
}

/// Flags of the layout benchmark.
#[derive(clap::Args, Debug, Clone)]
pub struct LayoutBenchArgs {
    /// Arrival rates, msg/s, comma-separated.
    #[arg(
        allow_negative_numbers = true,
        long,
        alias = "rates",
        value_delimiter = ',',
        default_value = "20000,40000,60000"
    )]
    pub rate: Vec<f64>,
    /// Time per rate and layout, e.g. 3s.
    #[arg(
        long,
        alias = "seconds",
        value_name = "DURATION",
        value_parser = values::seconds,
        default_value = "3s"
    )]
    pub duration: Duration,
    /// Journal modes to run, comma-separated (each runs every rate and search).
    #[arg(long, value_delimiter = ',', value_parser = one_of(&JournalMode::ALL, JournalMode::name), default_value = "off,group")]
    pub journal: Vec<JournalMode>,
    /// Time per step of the maximum-rate searches, e.g. 1s (0s: no search).
    #[arg(
        long,
        alias = "step-seconds",
        value_name = "DURATION",
        value_parser = values::seconds,
        default_value = "1s"
    )]
    pub step: Duration,
    /// Latency limit of the maximum-rate searches: critical-path p99, e.g. 100us.
    #[arg(
        long,
        alias = "p99-limit-us",
        value_name = "DURATION",
        value_parser = values::micros,
        default_value = MAX_RATE_P99_LIMIT_DEFAULT
    )]
    pub p99_limit: Duration,
    /// Report folder.
    #[arg(long, default_value = "leantier-report/exchange-layout-bench")]
    pub out: PathBuf,
}

/// Flags of the journal experiment.
#[derive(clap::Args, Debug, Clone)]
pub struct JournalExperimentArgs {
    #[command(flatten)]
    pub common: ExperimentArgs,
    /// Report folder.
    #[arg(long, default_value = "leantier-report/exchange-journal-experiment")]
    pub out: PathBuf,
    /// Directory for the journals and the raw fdatasync baseline (its disk is the one
    /// measured; default: the system temporary directory).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// TOML tier configuration shared by every mode and rate (its `journal` field is set per
    /// mode), e.g. a lean one with fewer threads for a small host; default: the defaults.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Samples of the raw 4 KiB append + fdatasync baseline.
    #[arg(long, default_value_t = 300)]
    pub fsync_samples: u64,
    /// Exit with the "target missed" code when a ratio misses its target.
    #[arg(long)]
    pub check: bool,
}

/// Flags of `exchange run`; each given flag overrides the config file.
#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// TOML configuration: the tier's settings at the top level (`TierConfig`: workers,
    /// shards, senders, rings, wait, placement, journal, layout, universe...) and the load
    /// generator's under `[load]` (`LoadConfig`: arrival, burst_on_us, burst_off_us, seed,
    /// flow, events_every, master_updates_every, publish_work_ns); every field optional.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Arrival rates to run, msg/s, comma-separated.
    #[arg(
        allow_negative_numbers = true,
        long,
        alias = "rates",
        value_delimiter = ',',
        default_value = "20000,40000,60000"
    )]
    pub rate: Vec<f64>,
    /// Time per rate, e.g. 3s.
    #[arg(
        long,
        alias = "seconds",
        value_name = "DURATION",
        value_parser = values::seconds,
        default_value = "3s"
    )]
    pub duration: Duration,
    /// Also search the highest rate whose critical-path p99 stays within `--p99-limit`
    /// (bracketed from both sides of the highest fixed rate, then bisected to 5%).
    #[arg(long)]
    pub find_max: bool,
    /// Latency limit of the max-rate search, e.g. 100us (when no rate meets it, the search
    /// runs again at 10× the limit).
    #[arg(
        long,
        alias = "p99-limit-us",
        value_name = "DURATION",
        value_parser = values::micros,
        default_value = MAX_RATE_P99_LIMIT_DEFAULT
    )]
    pub p99_limit: Duration,
    /// Pre-process workers.
    #[arg(long)]
    pub preprocess_workers: Option<usize>,
    /// Core shards.
    #[arg(long)]
    pub core_shards: Option<usize>,
    /// R-Senders.
    #[arg(long)]
    pub senders: Option<usize>,
    /// Wait strategy of the critical stages: spin, spin-yield, park, adaptive.
    #[arg(long)]
    pub wait: Option<WaitChoice>,
    /// Pin workers per the placement plan (true or false).
    #[arg(long, value_name = "BOOL")]
    pub placement: Option<bool>,
    /// Thread layout: auto (the default: planned from the usable CPUs and a calibration run;
    /// it chooses pre-process workers, senders, waits, pinning away from device interrupts,
    /// and whether the load generator runs inline on the first thread) or thread-per-stage.
    #[arg(long, value_parser = one_of(&LayoutChoice::ALL, LayoutChoice::name))]
    pub layout: Option<LayoutChoice>,
    /// Arrival process: constant, poisson, bursty.
    #[arg(long)]
    pub arrival: Option<Arrival>,
    /// Journaling of the sequenced input: group (default: replies wait for their input's
    /// fsync), sync (the core waits for it), relaxed (replies not held), off.
    #[arg(long, value_parser = one_of(&JournalMode::ALL, JournalMode::name))]
    pub journal: Option<JournalMode>,
    /// A snapshot of each core shard every this many of its journaled inputs (0 = none):
    /// restart loads the newest valid one and replays only the journal after it.
    #[arg(long)]
    pub snapshot_every: Option<u64>,
    /// Data directory of the shard journals: the run recovers the state found there and
    /// continues its sequence (default: a fresh temporary directory per rate).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Start despite a refusal that repair can get past (a corrupt record, a journal ending
    /// below its durable watermark, a missing newest segment; see docs/JOURNAL.md): discards
    /// the damaged records and everything after them, logged loudly.
    #[arg(long)]
    pub repair: bool,
    /// Report folder.
    #[arg(long, default_value = "leantier-report/exchange-run")]
    pub out: PathBuf,
}

/// Flags shared by the experiments.
#[derive(clap::Args, Debug, Clone)]
pub struct ExperimentArgs {
    /// Time per measured point, e.g. 3s.
    #[arg(
        long,
        alias = "seconds",
        value_name = "DURATION",
        value_parser = values::seconds,
        default_value = "3s"
    )]
    pub duration: Duration,
}

/// Flags of the placement experiment.
#[derive(clap::Args, Debug, Clone)]
pub struct PlacementArgs {
    #[command(flatten)]
    pub common: ExperimentArgs,
    /// Report folder.
    #[arg(long, default_value = "leantier-report/exchange-placement")]
    pub out: PathBuf,
}

/// Flags of the senders experiment.
#[derive(clap::Args, Debug, Clone)]
pub struct SendersArgs {
    #[command(flatten)]
    pub common: ExperimentArgs,
    /// Report folder.
    #[arg(long, default_value = "leantier-report/exchange-senders")]
    pub out: PathBuf,
    /// Arrival rate, msg/s.
    #[arg(long, allow_negative_numbers = true, default_value_t = 60_000.0)]
    pub rate: f64,
    /// Simulated publish cost per message in each sender, e.g. 2us (in-process delivery alone
    /// costs almost nothing, so without it more senders have nothing to parallelise).
    #[arg(
        long,
        alias = "publish-work-ns",
        value_name = "DURATION",
        value_parser = values::nanos,
        default_value = "2us"
    )]
    pub publish_work: Duration,
}

/// Dispatches `leantier exchange ...`.
pub fn run(args: &Args) -> anyhow::Result<()> {
    match &args.command {
        ExchangeCommand::Run(run_args) => run_configured(run_args),
        ExchangeCommand::Placement(experiment) => placement_experiment(experiment),
        ExchangeCommand::Senders(senders) => senders_experiment(senders),
        ExchangeCommand::JournalExperiment(journal) => journal_experiment(journal),
        ExchangeCommand::Serve(serve) => super::exchange_serve::serve(serve),
        ExchangeCommand::Client(client) => super::exchange_serve::client(client),
        ExchangeCommand::HashSecret(hash) => super::exchange_serve::hash_secret(hash),
        ExchangeCommand::Load(load) => super::exchange_serve::load(load),
        ExchangeCommand::Edge(edge) => super::delivery::edge(edge, false),
        ExchangeCommand::Gateway(edge) => super::delivery::edge(edge, true),
        ExchangeCommand::Publish(publish) => super::delivery::publish(publish),
        ExchangeCommand::DeliveryExperiment(run) => super::delivery::delivery_experiment(run),
        ExchangeCommand::DeliveryBench(bench) => super::delivery::delivery_bench(bench),
        ExchangeCommand::LayoutBench(bench) => layout_bench(bench),
    }
}

/// `leantier demo`.
pub fn run_in_process_demo(args: &DemoArgs) -> anyhow::Result<()> {
    let (seconds, step_seconds) = if args.quick { (1.5, 0.5) } else { (8.0, 2.0) };
    let search = MaxRateSearch { step_seconds, p99_limit_us: values::whole_micros(args.p99_limit) };
    let config = TierConfig { journal: args.journal, layout: args.layout, ..TierConfig::default() };
    let journal = JournalOptions::default();
    let load = LoadConfig::default();
    let session = measure(&config, &load, &DEMO_RATES_PER_S, seconds, Some(search), &journal)?;
    present(&session, &args.out, "leantier demo: the lean exchange tier")?;
    println!("\nReport: {}/summary.md (JSON, CSV and SVG plots beside it)", args.out.display());
    println!("Try next:");
    println!("  leantier demo                   # the same tier behind exchange serve, over TCP");
    println!("  leantier exchange placement     # pinning + spinning vs parking, side by side");
    println!("  leantier exchange senders       # 1..6 R-Senders: speedup and Karp–Flatt");
    println!("  leantier exchange run --config my.toml --rate 100000 --find-max");
    Ok(())
}

/// A run's configuration file: the tier's settings at the top level, the load generator's
/// under `[load]` (a load setting at the top level is named as misplaced).
pub fn load_run_config(path: Option<&Path>) -> anyhow::Result<(TierConfig, LoadConfig)> {
    let Some(path) = path else { return Ok(Default::default()) };
    let bad =
        |e: &dyn std::fmt::Display| BadInput(format!("invalid config {}: {e}", path.display()));
    let text = std::fs::read_to_string(path)
        .map_err(|e| BadInput(format!("cannot read config {}: {e}", path.display())))?;
    let mut table: toml::Table = toml::from_str(&text).map_err(|e| bad(&e))?;
    if let Some(key) = LoadConfig::FIELDS.iter().find(|key| table.contains_key(**key)) {
        let moved = format!("`{key}` is a load generator setting: put it under [load]");
        return Err(bad(&moved).into());
    }
    let load = match table.remove("load") {
        Some(load) => load.try_into().map_err(|e| bad(&format!("[load]: {e}")))?,
        None => LoadConfig::default(),
    };
    let tier = toml::Value::Table(table).try_into().map_err(|e| bad(&e))?;
    Ok((tier, load))
}

fn run_configured(args: &RunArgs) -> anyhow::Result<()> {
    let (mut config, mut load) = load_run_config(args.config.as_deref())?;
    ops::config::override_with(&mut config.preprocess_workers, &args.preprocess_workers);
    ops::config::override_with(&mut config.core_shards, &args.core_shards);
    ops::config::override_with(&mut config.senders, &args.senders);
    ops::config::override_with(&mut config.wait, &args.wait);
    ops::config::override_with(&mut config.placement, &args.placement);
    ops::config::override_with(&mut config.layout, &args.layout);
    ops::config::override_with(&mut load.arrival, &args.arrival);
    ops::config::override_with(&mut config.journal, &args.journal);
    ops::config::override_with(&mut config.snapshot_every_records, &args.snapshot_every);
    let search = args.find_max.then_some(MaxRateSearch {
        step_seconds: (args.duration.as_secs_f64() / 2.0).max(0.3),
        p99_limit_us: values::whole_micros(args.p99_limit),
    });
    let journal = JournalOptions {
        data_dir: args.data.clone(),
        repair: args.repair,
        ..JournalOptions::default()
    };
    let seconds = args.duration.as_secs_f64();
    let session = measure(&config, &load, &args.rate, seconds, search, &journal)?;
    present(&session, &args.out, "leantier exchange run")
}

#[derive(Serialize)]
struct RunSummary {
    rate_per_s: f64,
    sent: u64,
    achieved_rate_per_s: f64,
    journal_mode: JournalMode,
    /// Intended send -> response ready (core done), not waiting for any fsync.
    critical_path: LatencySummary,
    /// Intended send -> reply delivered (after its input's fsync when replies are held).
    end_to_end: LatencySummary,
    /// Per stage split, over one in `stage_split_sample_every` of the requests that reached
    /// the core.
    stages: BTreeMap<String, LatencySummary>,
    stage_split_sample_every: u64,
    cumulative_10us: Vec<CumulativeBucket>,
    send_lag: LatencySummary,
    pipeline: Vec<StageMetrics>,
    rejects: BTreeMap<String, u64>,
    output_hashes: Vec<String>,
    placement_notes: Vec<String>,
    journal: Vec<ShardJournalReport>,
}

fn summarize(run: &RunResult) -> RunSummary {
    RunSummary {
        rate_per_s: run.rate_per_s,
        sent: run.sent,
        achieved_rate_per_s: run.sent as f64 / run.elapsed_s.max(f64::MIN_POSITIVE),
        journal_mode: run.journal_mode,
        critical_path: run.critical_path.summary(),
        end_to_end: run.end_to_end.summary(),
        stages: STAGE_SPLITS
            .iter()
            .zip(&run.stage_latency)
            .map(|(name, h)| (name.to_string(), h.summary()))
            .collect(),
        stage_split_sample_every: STAGE_SPLIT_SAMPLE_EVERY,
        cumulative_10us: run.end_to_end.cumulative_buckets(BUCKET_WIDTH_NS, BUCKETS_MAX),
        send_lag: run.send_lag.summary(),
        pipeline: run.pipeline.clone(),
        rejects: Reason::ALL
            .iter()
            .filter(|r| run.rejects[**r as usize] > 0)
            .map(|r| (format!("{r:?}"), run.rejects[*r as usize]))
            .collect(),
        output_hashes: run.shards.iter().map(|s| s.output_hash.clone()).collect(),
        placement_notes: run.placement.notes.clone(),
        journal: run.journal.clone(),
    }
}

/// What the end-to-end row measures under `mode`.
fn reply_label(mode: JournalMode) -> &'static str {
    if mode.holds_replies() { "durable reply" } else { "reply (not held)" }
}

fn latency_tables(runs: &[RunResult]) -> Table {
    let labels: Vec<String> = runs
        .iter()
        .flat_map(|run| {
            let rate = rate_label(run.rate_per_s);
            let reply = reply_label(run.journal_mode);
            [format!("critical path @{rate}"), format!("{reply} @{rate}")]
                .into_iter()
                .chain(STAGE_SPLITS.iter().map(|s| format!("  {s} @{rate}")))
                .chain([format!("  generator late @{rate}")])
                .collect::<Vec<_>>()
        })
        .collect();
    let summaries: Vec<LatencySummary> = runs
        .iter()
        .flat_map(|run| {
            [run.critical_path.summary(), run.end_to_end.summary()]
                .into_iter()
                .chain(run.stage_latency.iter().map(|h| h.summary()))
                .chain([run.send_lag.summary()])
        })
        .collect();
    let rows: Vec<(&str, &LatencySummary)> =
        labels.iter().map(String::as_str).zip(&summaries).collect();
    latency_table(&rows).with_title(format!(
        "Latency from the intended send time, µs. Critical path: until the response is ready \
         (core done), no fsync wait. Durable reply: until delivered, after its input's fsync. \
         Stages: one in {STAGE_SPLIT_SAMPLE_EVERY} of the requests that reached the core. \
         Generator late: how far behind its schedule the load generator sent (already inside \
         every latency above; its tail is time the generator's thread did not run, e.g. a \
         VM's vCPU stopped by its host)",
    ))
}

fn journal_table(runs: &[RunResult]) -> Table {
    let mut table = Table::new([
        "rate",
        "shard",
        "journal",
        "recovered seq",
        "replayed",
        "records written",
        "fsyncs",
        "records/fsync",
        "from snapshot",
        "recovery ms",
        "snapshots",
        "resting orders",
        "follow ns/record",
        "snapshot write max ms",
    ])
    .with_title(
        "Journal per core shard (recovery at start; writer and snapshot follower over the run: \
         the follower replays durable records into a replica and writes its snapshots, the \
         core never pauses for them)",
    );
    for run in runs {
        for shard in &run.journal {
            let writer = shard.writer.unwrap_or_default();
            table.row([
                rate_label(run.rate_per_s),
                shard.recovery.shard.to_string(),
                format!("{:?}", run.journal_mode).to_lowercase(),
                shard.recovery.recovered_seq.to_string(),
                shard.recovery.replayed_records.to_string(),
                writer.records.to_string(),
                writer.syncs.to_string(),
                format!("{:.1}", writer.records as f64 / writer.syncs.max(1) as f64),
                shard.recovery.snapshot_seq.map_or("-".into(), |seq| seq.to_string()),
                format!("{:.1}", shard.recovery.recovery_ns as f64 / 1e6),
                shard.snapshots.map_or("off".into(), |s| s.taken.to_string()),
                shard.snapshots.map_or("-".into(), |s| s.resting_orders_max.to_string()),
                shard.snapshots.map_or("-".into(), |s| s.follow_ns_per_record.to_string()),
                shard
                    .snapshots
                    .map_or("-".into(), |s| format!("{:.1}", s.write_ns_max as f64 / 1e6)),
            ]);
        }
    }
    table
}

/// The cumulative 10 µs buckets of one latency of every run.
fn buckets_table(
    runs: &[RunResult],
    what: &str,
    latency: fn(&RunResult) -> &LatencyHistogram,
) -> Table {
    let labels: Vec<String> =
        runs.iter().map(|r| format!("@{}", rate_label(r.rate_per_s))).collect();
    let series: Vec<(&str, &LatencyHistogram)> =
        labels.iter().map(String::as_str).zip(runs.iter().map(latency)).collect();
    cumulative_buckets_comparison_table(&series, BUCKET_WIDTH_NS, BUCKETS_MAX)
        .with_title(format!("{what}: cumulative % of requests within 10 µs buckets"))
}

/// leantier's critical path beside the published lean tier at the published rates.
fn published_table(runs: &[RunResult]) -> Option<Table> {
    let title = "Critical path vs the published lean tier (2014 hardware, affinity); ratio = \
                 leantier / published (≤ 1 is at or below the published figure)";
    let ours = |rate: f64| {
        let run = runs.iter().find(|run| run.rate_per_s == rate)?;
        Some(PUBLISHED_PERCENTILES.map(|p| run.critical_path.value_at_percentile_ns(p)))
    };
    published_comparison(title, "leantier critical path µs", ours)
}

fn stages_table(runs: &[RunResult]) -> Table {
    let mut table = Table::new([
        "rate",
        "stage",
        "thread group",
        "workers",
        "messages",
        "throughput msg/s",
        "group utilization %",
    ])
    .with_title(
        "Throughput per stage (generator: messages sent) and utilization per thread group, on \
         its first stage (stages joined by + share the group's thread)",
    );
    for run in runs {
        for stage in &run.pipeline {
            let row = super::tier_report::stage_row(run, stage);
            let utilization = row
                .utilization
                .map_or(format!("in {}", row.group), |u| format!("{:.1}", u * 100.0));
            table.row([
                rate_label(run.rate_per_s),
                row.stage,
                row.group,
                row.workers.to_string(),
                row.messages.to_string(),
                format!("{:.0}", row.throughput_per_s),
                utilization,
            ]);
        }
    }
    table
}

fn rejects_table(runs: &[RunResult]) -> Table {
    let headers =
        std::iter::once("reason".to_string()).chain(runs.iter().map(|r| rate_label(r.rate_per_s)));
    let mut table = Table::new(headers).with_title("Rejects by reason");
    for reason in Reason::ALL {
        if runs.iter().all(|r| r.rejects[reason as usize] == 0) {
            continue;
        }
        table.row(
            std::iter::once(format!("{reason:?}"))
                .chain(runs.iter().map(|r| r.rejects[reason as usize].to_string())),
        );
    }
    table
}

/// What repeated max-rate searches found, in a sentence: the median highest passing rate
/// and the range (a search where even the lowest rate failed counts as 0); `None` without one.
fn max_rate_summary(reports: &[RateSearchReport]) -> Option<String> {
    let first = reports.first()?;
    let limit = format_ns_as_us(first.plan.limit_ns);
    let rates: Vec<f64> =
        reports.iter().map(|r| r.last_passing_rate_per_s.unwrap_or(0.0)).collect();
    let (low, high) =
        rates.iter().fold((f64::INFINITY, 0.0_f64), |(l, h), &r| (l.min(r), h.max(r)));
    if high == 0.0 {
        let lowest = first.plan.min_rate_per_s;
        return Some(format!(
            "Even {lowest:.0} msg/s missed critical-path p99 ≤ {limit} µs in {} searches",
            rates.len()
        ));
    }
    Some(format!(
        "Maximum sustainable rate (critical-path p99 ≤ {limit} µs): median {:.0} msg/s over {} searches (range {low:.0}–{high:.0})",
        stats::median(rates.clone()),
        rates.len()
    ))
}

/// Critical-path p99 at each step of each search, against the rate, with the limit.
fn max_rate_plot(reports: &[RateSearchReport]) -> Option<LinePlot> {
    let limit_us = reports.first()?.plan.limit_ns as f64 / 1_000.0;
    let mut plot = LinePlot::new("Critical-path p99 vs arrival rate", "rate (msg/s)", "p99 (µs)");
    for (index, report) in reports.iter().enumerate() {
        let mut points: Vec<(f64, f64)> =
            report.steps.iter().map(|s| (s.rate_per_s, s.value_ns as f64 / 1_000.0)).collect();
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        plot = plot.series(&format!("search {}", index + 1), points);
    }
    Some(plot.limit(&format!("p99 limit {limit_us} µs"), limit_us).y_log())
}

fn max_rate_table(report: &RateSearchReport) -> Table {
    let mut table = Table::new(["step", "rate msg/s", "p99 µs", "max µs", "within limit"])
        .with_title(format!(
            "Max-rate search (critical-path p99 ≤ {} µs): bracketed from the highest fixed rate, \
             then bisected to {:.0}%",
            format_ns_as_us(report.plan.limit_ns),
            report.plan.precision * 100.0
        ));
    for (number, step) in report.steps.iter().enumerate() {
        table.row([
            (number + 1).to_string(),
            format!("{:.0}", step.rate_per_s),
            format_ns_as_us(step.value_ns),
            format_ns_as_us(step.summary.max_ns),
            if step.passed { "yes" } else { "no" }.to_string(),
        ]);
    }
    table
}

fn present(session: &Session, out: &std::path::Path, title: &str) -> anyhow::Result<()> {
    let runs = &session.runs;
    let tables = session_tables(session);
    for table in &tables {
        println!("\n{table}");
    }
    let max_line = [&session.max_rate, &session.max_rate_looser]
        .into_iter()
        .filter_map(|reports| max_rate_summary(reports))
        .collect::<Vec<_>>()
        .join("; ");
    if !max_line.is_empty() {
        println!("\n{max_line}");
    }
    for note in runs.first().map(|r| r.placement.notes.as_slice()).unwrap_or_default() {
        println!("placement: {note}");
    }
    let dir = ReportDir::create(out)?;
    write_report_data(&dir, session)?;
    let mut markdown = Markdown::new();
    markdown.heading(1, title);
    markdown.paragraph(&format!(
        "Open-loop load ({} arrivals), latency from each request's intended send time to its \
         first response at the subscriber outlet; journal `{}` (critical path: until the \
         response is ready; durable reply: until delivered after its input's fsync). {}.",
        session.load.arrival,
        session.config.journal.name(),
        runs.first().map_or("No run".to_string(), super::tier_report::layout_sentence),
    ));
    for table in &tables {
        markdown.table(table);
    }
    if let Some(plot) = max_rate_plot(&session.max_rate) {
        dir.write_svg("max-rate.svg", &plot.to_svg())?;
        markdown.paragraph(&max_line).image("p99 vs rate", "max-rate.svg");
    }
    markdown
        .image("latency by percentile", "latency-percentiles.svg")
        .image("per-stage p99", "stage-breakdown.svg");
    dir.write_markdown("summary.md", markdown.as_str())?;
    Ok(())
}

/// The session's tables, in the order the terminal and the summary show them.
fn session_tables(session: &Session) -> Vec<Table> {
    let runs = &session.runs;
    let mut tables = vec![layout_table(runs.iter()), latency_tables(runs)];
    tables.extend(published_table(runs));
    tables.extend([
        buckets_table(runs, "Critical path", |run| &run.critical_path),
        buckets_table(runs, "Durable reply", |run| &run.end_to_end),
        stages_table(runs),
        rejects_table(runs),
        journal_table(runs),
    ]);
    let searches: Vec<&RateSearchReport> =
        session.max_rate.iter().chain(&session.max_rate_looser).collect();
    tables.extend(searches.iter().map(|report| max_rate_table(report)));
    tables
}

/// The report folder's data: `report.json`, the runs' data files and the latency plots.
fn write_report_data(dir: &ReportDir, session: &Session) -> anyhow::Result<()> {
    let runs = &session.runs;
    #[derive(Serialize)]
    struct ReportJson<'a> {
        config: &'a TierConfig,
        load: &'a LoadConfig,
        runs: Vec<RunSummary>,
        max_rate: &'a [RateSearchReport],
        max_rate_looser: &'a [RateSearchReport],
    }
    let json = ReportJson {
        config: &session.config,
        load: &session.load,
        runs: runs.iter().map(summarize).collect(),
        max_rate: &session.max_rate,
        max_rate_looser: &session.max_rate_looser,
    };
    dir.write_json("report.json", &json)?;
    write_run_data(dir, runs)?;
    let labels: Vec<String> = runs.iter().map(|r| rate_label(r.rate_per_s)).collect();
    let series: Vec<(&str, &stats::LatencyHistogram)> =
        labels.iter().map(String::as_str).zip(runs.iter().map(|r| &r.end_to_end)).collect();
    dir.write_svg(
        "latency-percentiles.svg",
        &latency_percentile_plot("End-to-end latency by percentile, per rate", &series).to_svg(),
    )?;
    if let Some(run) = runs.last() {
        let series: Vec<(&str, &LatencyHistogram)> =
            STAGE_SPLITS.iter().copied().zip(&run.stage_latency).collect();
        let title = format!("Latency per stage by percentile @{}", rate_label(run.rate_per_s));
        dir.write_svg("stage-breakdown.svg", &latency_percentile_plot(&title, &series).to_svg())?;
    }
    Ok(())
}

/// The runs' numbers as data files: latency, stages, and the cumulative buckets of both views.
fn write_run_data(dir: &ReportDir, runs: &[RunResult]) -> anyhow::Result<()> {
    use super::tier_report::{buckets_data, latency_data, stages_data};
    dir.write_data(&latency_data(runs))?;
    dir.write_data(&stages_data(runs))?;
    let views: [(&str, super::tier_report::LatencyOf); 2] =
        [("critical-path", |r| &r.critical_path), ("reply", |r| &r.end_to_end)];
    for (view, latency) in views {
        dir.write_data(&buckets_data(runs, view, latency, BUCKET_WIDTH_NS, BUCKETS_MAX))?;
    }
    Ok(())
}

fn placement_experiment(args: &PlacementArgs) -> anyhow::Result<()> {
    let points = experiments::placement(args.common.duration.as_secs_f64())?;
    let labels: Vec<String> = points
        .iter()
        .map(|point| format!("{} @{}", point.variant, rate_label(point.rate_per_s)))
        .collect();
    let rows: Vec<(&str, &LatencySummary)> =
        labels.iter().map(String::as_str).zip(points.iter().map(|p| &p.end_to_end)).collect();
    let table = latency_table(&rows)
        .with_title("End-to-end latency, µs: placement + spinning vs none + parking");
    println!("\n{table}");
    let mut notes: Vec<String> = points
        .iter()
        .flat_map(|point| point.notes.iter().map(|note| format!("{}: {note}", point.variant)))
        .collect();
    notes.sort();
    notes.dedup();
    for note in &notes {
        println!("{note}");
    }
    let dir = ReportDir::create(&args.out)?;
    dir.write_csv("placement.csv", &table)?;
    let json: Vec<(&String, &LatencySummary)> =
        labels.iter().zip(points.iter().map(|p| &p.end_to_end)).collect();
    dir.write_json("placement.json", &json)?;
    println!("\nReport: {}", dir.path().display());
    Ok(())
}

fn senders_experiment(args: &SendersArgs) -> anyhow::Result<()> {
    let publish_work_ns = values::whole_nanos(args.publish_work);
    let seconds = args.common.duration.as_secs_f64();
    let points = experiments::senders(args.rate, seconds, publish_work_ns)?;
    let mut table =
        Table::new(["senders", "mean µs", "p90 µs", "p99 µs", "max µs", "speedup", "Karp–Flatt e"])
            .with_title(format!(
                "R-Senders at {} msg/s, {publish_work_ns} ns publish work per message",
                args.rate
            ));
    let number = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.3}"));
    for point in &points {
        table.row([
            point.senders.to_string(),
            format!("{:.1}", point.latency.mean_ns / 1_000.0),
            format_ns_as_us(point.latency.p90_ns),
            format_ns_as_us(point.latency.p99_ns),
            format_ns_as_us(point.latency.max_ns),
            number(point.speedup),
            number(point.karp_flatt),
        ]);
    }
    println!("\n{table}");
    let dir = ReportDir::create(&args.out)?;
    dir.write_csv("senders.csv", &table)?;
    dir.write_json("senders.json", &points)?;
    println!("\nReport: {}", dir.path().display());
    Ok(())
}

fn journal_experiment(args: &JournalExperimentArgs) -> anyhow::Result<()> {
    let base: TierConfig = ops::config::load_toml(args.config.as_deref())?;
    let experiment = experiments::journal_modes(
        &base,
        args.common.duration.as_secs_f64(),
        args.fsync_samples,
        args.data.as_deref(),
    )?;
    let latency = journal_latency_table(&experiment);
    let (targets, missed) = journal_targets_table(&experiment.ratios);
    println!("\n{latency}\n\n{targets}");
    println!(
        "sync runs stop after {SYNC_REQUESTS_MAX} requests (one fdatasync each); journals \
         written under {} (removed after the runs)",
        experiment.written_under.display()
    );
    let dir = ReportDir::create(&args.out)?;
    dir.write_csv("latency.csv", &latency)?;
    dir.write_csv("targets.csv", &targets)?;
    dir.write_json("journal-experiment.json", &experiment)?;
    println!("\nReport: {}", dir.path().display());
    if args.check && !missed.is_empty() {
        return Err(crate::outcome::TargetMissed(missed).into());
    }
    Ok(())
}

fn journal_latency_table(experiment: &JournalExperiment) -> Table {
    let mut labels = vec!["raw 4 KiB append + fdatasync".to_string()];
    let mut summaries = vec![experiment.raw_fdatasync_4k];
    for point in &experiment.points {
        let mode = format!("{:?}", point.journal).to_lowercase();
        let rate = rate_label(point.rate_per_s);
        labels.push(format!("{mode} critical path @{rate} ({} req)", point.sent));
        labels.push(format!("{mode} {} @{rate}", reply_label(point.journal)));
        summaries.extend([point.critical_path, point.reply]);
    }
    let rows: Vec<(&str, &LatencySummary)> =
        labels.iter().map(String::as_str).zip(&summaries).collect();
    latency_table(&rows).with_title(
        "Latency from the intended send time, µs: journal sync vs group vs off (same run)",
    )
}

/// The targets table and the names of the targets missed.
fn journal_targets_table(ratios: &[JournalRatios]) -> (Table, Vec<String>) {
    let mut targets = Table::new([
        "rate",
        "critical p99 group/off",
        &format!("target ≤ {TARGET_CRITICAL_P99_GROUP_OVER_OFF}"),
        "durable p99 group / raw fsync p99",
        &format!("target ≤ {}", ::experiments::journal_bench::TARGET_DURABLE_P99_OVER_RAW_SYNC),
    ])
    .with_title("Targets, measured in this run");
    let mut missed = Vec::new();
    for r in ratios {
        let mut verdict = |value: Option<f64>, target: f64, what: &str| match value {
            Some(v) if v <= target => "met".to_string(),
            Some(v) => {
                missed.push(format!("{what} at {}: {v:.2} > {target}", rate_label(r.rate_per_s)));
                "missed".to_string()
            }
            None => "n/a".to_string(),
        };
        let number = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
        let critical = verdict(
            r.critical_p99_group_over_off,
            TARGET_CRITICAL_P99_GROUP_OVER_OFF,
            "critical-path p99 group/off",
        );
        let durable = verdict(
            r.durable_p99_group_over_raw_fsync,
            ::experiments::journal_bench::TARGET_DURABLE_P99_OVER_RAW_SYNC,
            "durable p99 / raw fdatasync p99",
        );
        targets.row([
            rate_label(r.rate_per_s),
            number(r.critical_p99_group_over_off),
            critical,
            number(r.durable_p99_group_over_raw_fsync),
            durable,
        ]);
    }
    (targets, missed)
}

/// Each run's thread groups: stages, workers, wait, predicted and measured utilization.
fn layout_table<'a>(runs: impl IntoIterator<Item = &'a RunResult>) -> Table {
    let headers = [
        "rate",
        "thread group",
        "workers",
        "wait",
        "predicted util %",
        "measured util %",
        "CPUs usable / busy elsewhere",
        "pinned to CPUs",
    ];
    let mut table = Table::new(headers).with_title(
        "Thread layout per run (auto: planned from the usable CPUs and calibrated service times; \
         stages joined by + share a thread; measured util is time inside the handlers, so a \
         group holding replies for the journal counts its wait for the fsync, parked or not; \
         spinning threads get the CPUs that take the fewest device interrupts, parked ones \
         float on the rest)",
    );
    for run in runs {
        for (index, (group, measured)) in
            run.layout.groups.iter().zip(&run.layout_utilization).enumerate()
        {
            let modeled = group.predicted_utilization > 0.0;
            table.row([
                rate_label(run.rate_per_s),
                group.label(),
                group.workers.to_string(),
                format!("{:?}", group.wait),
                if modeled {
                    format!("{:.1}", group.predicted_utilization * 100.0)
                } else {
                    "-".into()
                },
                format!("{:.1}", measured * 100.0),
                format!("{} / {:.1}", run.layout.usable_cpus, run.layout.busy_elsewhere_cpus),
                group_cpus(run, index),
            ]);
        }
        let (generator, generator_wait) = if run.layout.generator_inline {
            ("(load generator, inline before preprocess)", "Spin")
        } else if run.layout.outside_threads_spin {
            ("(load generator, outside the tier)", "Spin")
        } else {
            ("(load generator, outside the tier)", "SleepAdaptive")
        };
        table.row([
            rate_label(run.rate_per_s),
            generator.into(),
            "1".into(),
            generator_wait.into(),
            "-".into(),
            "-".into(),
            format!("{} / {:.1}", run.layout.usable_cpus, run.layout.busy_elsewhere_cpus),
            if run.layout.generator_inline { group_cpus(run, 0) } else { "-".into() },
        ]);
    }
    table
}

/// `run`'s group `index` pinned CPUs as a list ("-": not pinned).
fn group_cpus(run: &RunResult, index: usize) -> String {
    let cpus = run.group_cpus(index);
    if cpus.is_empty() {
        return "-".into();
    }
    cpus.iter().map(ToString::to_string).collect::<Vec<_>>().join(",")
}

fn layout_bench(args: &LayoutBenchArgs) -> anyhow::Result<()> {
    let search = (!args.step.is_zero()).then_some(MaxRateSearch {
        step_seconds: args.step.as_secs_f64(),
        p99_limit_us: values::whole_micros(args.p99_limit),
    });
    let seconds = args.duration.as_secs_f64();
    let bench = experiments::layout_bench(&args.rate, seconds, &args.journal, search)?;
    let mut tables = vec![layout_ratio_table(&bench)];
    if !bench.max_rates.is_empty() {
        tables.push(layout_max_rate_table(&bench));
    }
    tables.push(layout_table(bench.points.iter().map(|point| &point.auto)));
    let dir = ReportDir::create(&args.out)?;
    let mut markdown = Markdown::new();
    markdown.heading(1, "leantier exchange layout-bench: auto vs thread-per-stage");
    for (index, table) in tables.iter().enumerate() {
        println!("\n{table}");
        dir.write_csv(&format!("table-{index}.csv"), table)?;
        markdown.table(table);
    }
    dir.write_markdown("summary.md", markdown.as_str())?;
    println!("\nReport: {}/summary.md", args.out.display());
    Ok(())
}

/// The percentiles the layout benchmark compares.
const LAYOUT_PERCENTILES: [f64; 4] = [50.0, 93.0, 95.0, 99.0];

fn layout_ratio_table(bench: &LayoutBench) -> Table {
    let headers = [
        "journal",
        "rate",
        "percentile",
        "auto µs",
        "thread-per-stage µs",
        "ratio auto / thread-per-stage",
    ];
    let mut table = Table::new(headers).with_title(
        "Critical-path latency: auto vs thread-per-stage, same run (ratio < 1: auto faster)",
    );
    for point in &bench.points {
        for percentile in LAYOUT_PERCENTILES {
            let auto_ns = point.auto.critical_path.value_at_percentile_ns(percentile);
            let spread_ns = point.thread_per_stage.critical_path.value_at_percentile_ns(percentile);
            table.row([
                point.journal.name().to_string(),
                rate_label(point.rate_per_s),
                format!("p{percentile:.0}"),
                format_ns_as_us(auto_ns),
                format_ns_as_us(spread_ns),
                format!("{:.2}", auto_ns as f64 / spread_ns.max(1) as f64),
            ]);
        }
    }
    table
}

fn layout_max_rate_table(bench: &LayoutBench) -> Table {
    let headers =
        ["journal", "auto msg/s", "thread-per-stage msg/s", "ratio auto / thread-per-stage"];
    let mut table = Table::new(headers)
        .with_title("Highest rate with critical-path p99 within the limit (bracketed, bisected)");
    let rate = |report: &RateSearchReport| report.last_passing_rate_per_s;
    let shown = |rate: Option<f64>| rate.map_or("none".to_string(), |r| format!("{r:.0}"));
    for max in &bench.max_rates {
        let (auto, spread) = (rate(&max.auto), rate(&max.thread_per_stage));
        let ratio = match (auto, spread) {
            (Some(auto), Some(spread)) => format!("{:.2}", auto / spread),
            _ => "-".to_string(),
        };
        table.row([max.journal.name().to_string(), shown(auto), shown(spread), ratio]);
    }
    table
}
