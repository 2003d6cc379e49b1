//! `leantier exchange edge`, `exchange delivery-experiment` and `exchange delivery-bench`:
//! response delivery over NATS (the `delivery` crate).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use delivery::DeliveryError::BadInput;
use delivery::edge::{
    CONSUMER_QUEUE_CHUNKS_DEFAULT, CONSUMERS_MAX_DEFAULT, EdgeOptions, EdgeReport,
    SEQ_AHEAD_MAX_DEFAULT,
};
use delivery::nats::{NatsAuth, NatsConnect, NatsTls, Secret};
use delivery::server::{NATS_URL_ENV, server_or_env};
use experiments::delivery_experiment::{
    self as experiment, BUCKET_UPPERS_US, Experiment, LAYOUTS, PUBLISHED_BUCKETS,
    PUBLISHED_P90_P99_US, Point, Settings,
};
use experiments::plot::latency_percentile_plot;
use experiments::report::{Markdown, ReportDir, Table, format_ns_as_us};
use experiments::tier_load::Arrival;

use super::values;

/// How every command that takes `--nats` logs in to the server and whether it uses TLS
/// (docs/DELIVERY.md). Secrets are never printed: prefer the environment variables to the
/// flags, which other users of the host can read in the process list.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct NatsAuthArgs {
    /// NATS user name (with --nats-password).
    #[arg(long)]
    pub nats_user: Option<String>,
    /// NATS password of --nats-user.
    #[arg(long, env = "LEANTIER_NATS_PASSWORD", hide_env_values = true)]
    pub nats_password: Option<String>,
    /// NATS authentication token.
    #[arg(long, env = "LEANTIER_NATS_TOKEN", hide_env_values = true)]
    pub nats_token: Option<String>,
    /// NATS credentials file (user JWT and nkey seed, as `nsc` writes it).
    #[arg(long, value_name = "FILE")]
    pub nats_creds: Option<PathBuf>,
    /// File holding a NATS nkey seed (`SU...`).
    #[arg(long, value_name = "FILE")]
    pub nats_nkey_seed: Option<PathBuf>,
    /// PEM CA the server's certificate must chain to; turns TLS on (so does a tls:// URL,
    /// with the system's roots).
    #[arg(long, value_name = "FILE")]
    pub nats_tls_ca: Option<PathBuf>,
    /// PEM client certificate, for a server that verifies clients (with --nats-tls-key).
    #[arg(long, value_name = "FILE")]
    pub nats_tls_cert: Option<PathBuf>,
    /// PEM key of --nats-tls-cert.
    #[arg(long, value_name = "FILE")]
    pub nats_tls_key: Option<PathBuf>,
}

impl NatsAuthArgs {
    /// The connection settings for `url`; one way to log in at most.
    pub fn connect(&self, url: &str) -> Result<NatsConnect, delivery::DeliveryError> {
        let ways = [
            self.nats_user.is_some() || self.nats_password.is_some(),
            self.nats_token.is_some(),
            self.nats_creds.is_some(),
            self.nats_nkey_seed.is_some(),
        ];
        if ways.into_iter().filter(|&way| way).count() > 1 {
            return Err(BadInput(
                "give one of --nats-user/--nats-password, --nats-token, --nats-creds and \
                 --nats-nkey-seed (or their environment variables)"
                    .into(),
            ));
        }
        let auth = match (&self.nats_user, &self.nats_password) {
            (Some(user), Some(password)) => {
                NatsAuth::UserPassword { user: user.clone(), password: Secret::new(password) }
            }
            (Some(_), None) | (None, Some(_)) => {
                let reason = "--nats-user and --nats-password (LEANTIER_NATS_PASSWORD) go together";
                return Err(BadInput(reason.into()));
            }
            (None, None) => self.token_or_files(),
        };
        let client_cert = match (&self.nats_tls_cert, &self.nats_tls_key) {
            (Some(cert), Some(key)) => Some((cert.clone(), key.clone())),
            (None, None) => None,
            _ => return Err(BadInput("--nats-tls-cert and --nats-tls-key go together".into())),
        };
        let tls = NatsTls { ca: self.nats_tls_ca.clone(), client_cert };
        Ok(NatsConnect { url: url.to_string(), auth, tls })
    }

    fn token_or_files(&self) -> NatsAuth {
        if let Some(token) = &self.nats_token {
            NatsAuth::Token(Secret::new(token))
        } else if let Some(path) = &self.nats_creds {
            NatsAuth::Credentials(path.clone())
        } else if let Some(path) = &self.nats_nkey_seed {
            NatsAuth::NkeySeed(path.clone())
        } else {
            NatsAuth::None
        }
    }
}

/// Runs one delivery edge (the R-Gateway of paper 001): subscribes to one outlet's NATS
/// subjects, serves end consumers over TCP (docs/DELIVERY.md), recovers gaps from the
/// R-Senders' retained windows and sends a resync frame beyond them; prints its counters when
/// stopped (Ctrl-C, SIGTERM, --duration).
#[derive(clap::Args, Debug, Clone)]
pub struct EdgeArgs {
    /// NATS server URL.
    #[arg(long, env = NATS_URL_ENV)]
    pub nats: String,
    #[command(flatten)]
    pub nats_auth: NatsAuthArgs,
    /// The outlet whose subjects this edge serves (the tier routes client c's reports to
    /// outlet c modulo its `outlets`, instrument i's market data to outlet i modulo them).
    #[arg(long, required_unless_present = "gateway")]
    pub outlet: Option<u32>,
    /// `--outlet`'s old spelling, read for one release with a warning.
    #[arg(long, hide = true, conflicts_with = "outlet")]
    pub gateway: Option<u32>,
    /// Address the end consumers connect to.
    #[arg(long, default_value = "127.0.0.1:7400")]
    pub listen: SocketAddr,
    /// First token of every subject (must match the publishing tier's).
    #[arg(long, default_value = delivery::subjects::PREFIX_DEFAULT)]
    pub prefix: String,
    /// Most end consumers at once; more are refused with a goodbye frame.
    #[arg(long, default_value_t = CONSUMERS_MAX_DEFAULT)]
    pub consumers_max: usize,
    /// Most end consumers from one source address (consumers are not authenticated: one
    /// address cannot take every seat); more are refused with a goodbye frame.
    #[arg(long, default_value_t = delivery::admission::CONSUMERS_PER_ADDRESS_MAX_DEFAULT)]
    pub consumers_per_address_max: usize,
    /// Chunks (one NATS batch each) queued per consumer; a consumer that falls this far
    /// behind is cut off.
    #[arg(long, default_value_t = CONSUMER_QUEUE_CHUNKS_DEFAULT)]
    pub consumer_queue_chunks: usize,
    /// Most a NATS message may claim beyond the next expected sequence and be applied at once;
    /// further claims must persist for a second with nothing nearer in between (the trust
    /// rule). Raise it with the publisher's --retain-records.
    #[arg(long, default_value_t = SEQ_AHEAD_MAX_DEFAULT)]
    pub seq_ahead_max: u64,
    /// Stop after this long, e.g. 10m (default: run until Ctrl-C or SIGTERM).
    #[arg(long, alias = "seconds", value_name = "DURATION", value_parser = values::seconds)]
    pub duration: Option<Duration>,
    #[command(flatten)]
    pub metrics: super::admin::MetricsFlags,
}

/// `leantier exchange edge` (`exchange gateway`, its old name, warns first: `renamed`).
pub fn edge(args: &EdgeArgs, renamed: bool) -> anyhow::Result<()> {
    if renamed {
        tracing::warn!("'exchange gateway' is now 'exchange edge'; the old name goes next release");
    }
    let outlet = match (args.outlet, args.gateway) {
        (Some(outlet), _) => outlet,
        (None, Some(outlet)) => {
            tracing::warn!("--gateway is now --outlet; the old spelling goes next release");
            outlet
        }
        (None, None) => unreachable!("clap requires --outlet or --gateway"),
    };
    let options = EdgeOptions {
        nats: args.nats_auth.connect(&args.nats)?,
        prefix: args.prefix.clone(),
        outlet,
        listen: Some(args.listen),
        consumers_max: args.consumers_max,
        consumers_per_address_max: args.consumers_per_address_max,
        consumer_queue_chunks: args.consumer_queue_chunks,
        seq_ahead_max: args.seq_ahead_max,
        // A standalone delivery edge's consumers keep no place: each starts from the stream's.
        first_seqs: [1; 2],
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let report = runtime.block_on(async {
        // Heard from before the edge listens: a supervisor may stop it once it reads the
        // listen line.
        let stop_signal = ops::stop::stop_signal()?;
        let edge = delivery::edge::start(options).await?;
        let readiness = ops::Readiness::default();
        let mut registry = ops::Registry::default();
        edge.register_metrics(&mut registry);
        let _admin = args.metrics.serve(registry, &readiness)?;
        if let Some(listening) = edge.local_addr() {
            println!("edge of outlet {outlet} listening on {listening}");
        }
        let timer = async {
            match args.duration {
                Some(duration) => tokio::time::sleep(duration).await,
                None => std::future::pending().await,
            }
        };
        let signal = tokio::select! {
            signal = stop_signal => Some(signal),
            () = timer => None,
            // The client reconnects by itself; meanwhile consumers get nothing new.
            () = super::admin::follow_readiness(&readiness, "NATS", || edge.is_connected()) => {
                unreachable!("follows until stopped")
            }
        };
        readiness.set(false);
        let stopped = drain_edge(edge, signal).await?;
        anyhow::Ok(stopped)
    })?;
    let (report, latency) = report;
    println!("\n{}", edge_table(&report));
    print_edge_latency(&latency);
    Ok(())
}

/// Stops the delivery edge (`signal`: the stop signal that asked, `None` when `--duration` ended),
/// logging the stop and its counts.
async fn drain_edge(
    edge: delivery::edge::RunningEdge,
    signal: Option<&'static str>,
) -> anyhow::Result<(EdgeReport, delivery::edge::EdgeLatency)> {
    let stop_reason = signal.unwrap_or("--duration elapsed");
    tracing::info!(signal = stop_reason, "stop requested: draining");
    let stopped = edge.shutdown().await?;
    let report = &stopped.0;
    tracing::info!(
        signal = stop_reason,
        received = report.received,
        delivered = report.delivered,
        gaps = report.gaps,
        resyncs = report.resyncs,
        "delivery edge stopped"
    );
    if let Some(signal) = signal {
        super::admin::print_stopped(signal);
    }
    Ok(stopped)
}

/// What the delivery edge heard of each stream, from each record's intended send time.
fn print_edge_latency(latency: &delivery::edge::EdgeLatency) {
    for (what, histogram) in [("answers", &latency.answers), ("market data", &latency.market_data)]
    {
        if histogram.is_empty() {
            continue;
        }
        let summary = histogram.summary();
        println!(
            "{what}: intended send -> received here (same host clock): p50 {} µs, p99 {} µs, \
             max {} µs, {} records",
            format_ns_as_us(summary.p50_ns),
            format_ns_as_us(summary.p99_ns),
            format_ns_as_us(summary.max_ns),
            summary.count
        );
    }
}

fn edge_table(report: &EdgeReport) -> Table {
    let mut table =
        Table::new(["counter", "value"]).with_title(format!("edge of outlet {}", report.outlet));
    let rows = [
        ("records received (in order)", report.received),
        ("records delivered to consumers", report.delivered),
        ("gaps detected", report.gaps),
        ("records recovered from the window", report.recovered),
        ("resyncs sent", report.resyncs),
        ("records lost (resync)", report.resync_records),
        ("duplicates dropped", report.duplicates),
        ("consumers connected", report.consumers_connected),
        ("consumers cut off", report.consumers_cut_off),
        ("consumers refused", report.consumers_refused),
        ("malformed batches", report.bad_messages),
        ("untrusted messages ignored", report.untrusted),
    ];
    for (name, value) in rows {
        table.row([name.to_string(), value.to_string()]);
    }
    table
}

/// Runs the tier (the engine) with its R-Senders publishing over NATS, for delivery edges started
/// with `exchange edge`; prints the tier's latency and the publishers' counters.
#[derive(clap::Args, Debug, Clone)]
pub struct PublishArgs {
    /// NATS server URL.
    #[arg(long, env = NATS_URL_ENV)]
    pub nats: String,
    #[command(flatten)]
    pub nats_auth: NatsAuthArgs,
    /// TOML configuration: the tier's settings at the top level (`TierConfig`: workers,
    /// shards, senders, rings, wait, placement, journal, layout, universe...) and the load
    /// generator's under `[load]` (`LoadConfig`: arrival, burst_on_us, burst_off_us, seed,
    /// flow, events_every, master_updates_every, publish_work_ns); every field optional.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Arrival rate, msg/s.
    #[arg(long, allow_negative_numbers = true, default_value_t = 20_000.0)]
    pub rate: f64,
    /// How long the load runs, e.g. 5s (Ctrl-C or SIGTERM stops it sooner).
    #[arg(
        long,
        alias = "seconds",
        value_name = "DURATION",
        value_parser = values::seconds,
        default_value = "5s"
    )]
    pub duration: Duration,
    /// First token of every subject (the edges must use the same).
    #[arg(long, default_value = delivery::subjects::PREFIX_DEFAULT)]
    pub prefix: String,
    /// Records kept per subject for gap recovery.
    #[arg(long, default_value_t = delivery::publish::RETAIN_RECORDS_DEFAULT)]
    pub retain_records: usize,
    /// How long the retained windows stay up after the load, for the edges to recover, e.g. 2s.
    #[arg(
        long,
        alias = "linger-seconds",
        value_name = "DURATION",
        value_parser = values::seconds,
        default_value = "2s"
    )]
    pub linger: Duration,
}

/// `leantier exchange publish`. SIGTERM or SIGINT ends the load early: the tier drains, the
/// publishers flush what it answered, the windows linger at most
/// [`delivery::publish::LINGER_AFTER_STOP_MAX`], one summary line is logged and the process
/// exits 0, all within `ops::stop::DRAIN_TIMEOUT` (past it, a watchdog cuts the rest).
pub fn publish(args: &PublishArgs) -> anyhow::Result<()> {
    let (config, load) = super::exchange::load_run_config(args.config.as_deref())?;
    let stop = Arc::new(AtomicBool::new(false));
    let signal = stop_on_signal(stop.clone())?;
    let run = experiments::tier_load::RunOptions {
        rate_per_s: args.rate,
        duration: args.duration,
        record_inputs: false,
        journal: exchange::durability::JournalOptions::default(),
        released: None,
        stop: Some(stop),
        load,
    };
    let options = delivery::publish::PublishOptions {
        nats: args.nats_auth.connect(&args.nats)?,
        prefix: args.prefix.clone(),
        outlets: config.outlets,
        retain_records: args.retain_records,
        wait: config.wait_strategy(),
        heartbeat: delivery::publish::HEARTBEAT_INTERVAL_DEFAULT,
    };
    println!("publishing to {} outlets at {} msg/s", config.outlets, args.rate);
    let (result, report) =
        experiments::delivery_experiment::run_engine(&config, run, options, args.linger, |_| {})?;
    let signal = signal.get().copied();
    tracing::info!(
        signal = signal.unwrap_or("--duration elapsed"),
        sent = result.sent,
        delivered = result.delivered,
        published = report.published,
        unsent = report.unsent,
        "tier publisher stopped"
    );
    println!("\n{}", publish_table(&result, &report, args.rate, config.outlets));
    let summary = result.end_to_end.summary();
    println!(
        "intended send -> handed to the publisher: p50 {} µs, p99 {} µs (outlets measure the rest)",
        format_ns_as_us(summary.p50_ns),
        format_ns_as_us(summary.p99_ns)
    );
    if let Some(signal) = signal {
        super::admin::print_stopped(signal);
    }
    Ok(())
}

/// Sets `stop` on SIGTERM or SIGINT and keeps the signal's name. The handlers are installed
/// before this returns, so a supervisor that signals right after the start line is heard. A
/// drain that outlasts `ops::stop::DRAIN_TIMEOUT` is cut, as every server's is
/// (docs/OPERATIONS.md): the watchdog logs a warning and exits 0.
fn stop_on_signal(stop: Arc<AtomicBool>) -> anyhow::Result<Arc<OnceLock<&'static str>>> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let signal = runtime.block_on(async { ops::stop::stop_signal() })?;
    let heard = Arc::new(OnceLock::new());
    let named = heard.clone();
    std::thread::spawn(move || {
        let _ = named.set(runtime.block_on(signal));
        tracing::info!("stop requested: ending the load, draining");
        // Release: the load generator's Acquire sees the stop with everything before it.
        stop.store(true, Ordering::Release);
        std::thread::sleep(ops::stop::DRAIN_TIMEOUT);
        tracing::warn!(bound = ?ops::stop::DRAIN_TIMEOUT, "the drain outlasted its bound: cut");
        std::process::exit(i32::from(crate::outcome::EXIT_OK));
    });
    Ok(heard)
}

fn publish_table(
    result: &experiments::tier_load::RunResult,
    report: &delivery::publish::PublishReport,
    rate: f64,
    outlets: u32,
) -> Table {
    let mut table = Table::new(["counter", "value"]).with_title(format!(
        "tier over NATS: {} requests at {rate} msg/s, {outlets} outlets",
        result.sent
    ));
    let rows = [
        ("responses delivered to the publishers", result.delivered),
        ("records published (handed to NATS)", report.published),
        ("NATS messages (batches)", report.batches),
        ("records unsent (window only)", report.unsent),
        ("heartbeats", report.heartbeats),
        ("retain requests", report.retain_requests),
        ("records served from windows", report.retained_served),
    ];
    for (name, value) in rows {
        table.row([name.to_string(), value.to_string()]);
    }
    table
}

/// The published response-delivery experiment: runs 1–7 (blocking buffer + 20 senders;
/// lock-free + 20 senders; lock-free + placement with 6, 4, 3, 2, 1 senders), cumulative % per
/// 10 µs bucket, p90, p99 and throughput measured at the outlets in-process and at the delivery edges over NATS,
/// beside the published table.
#[derive(clap::Args, Debug, Clone)]
pub struct DeliveryExperimentArgs {
    /// Arrival rate, msg/s.
    #[arg(long, allow_negative_numbers = true, default_value_t = 20_000.0)]
    pub rate: f64,
    /// Time per run and transport, e.g. 2s.
    #[arg(
        long,
        alias = "seconds",
        value_name = "DURATION",
        value_parser = values::seconds,
        default_value = "2s"
    )]
    pub duration: Duration,
    /// Arrival process: poisson or bursty (constant is allowed but not the experiment's).
    #[arg(long, default_value = "poisson")]
    pub arrival: Arrival,
    /// NATS server URL (default: $LEANTIER_NATS_URL, else a nats-server child on a free port).
    #[arg(long)]
    pub nats: Option<String>,
    /// Login and TLS for the server of --nats or $LEANTIER_NATS_URL.
    #[command(flatten)]
    pub nats_auth: NatsAuthArgs,
    /// Measure in-process only.
    #[arg(long)]
    pub no_nats: bool,
    /// Report folder.
    #[arg(long, default_value = "leantier-report/exchange-delivery-experiment")]
    pub out: PathBuf,
}

/// `leantier exchange delivery-experiment`.
pub fn delivery_experiment(args: &DeliveryExperimentArgs) -> anyhow::Result<()> {
    let (url, _server) = match (&args.nats, args.no_nats) {
        (_, true) => (None, None),
        (Some(url), false) => (Some(url.clone()), None),
        (None, false) => {
            let (url, server) = server_or_env()?;
            (Some(url), server)
        }
    };
    let settings = Settings {
        rate_per_s: args.rate,
        seconds: args.duration.as_secs_f64(),
        arrival: args.arrival,
        nats: url.map(|url| args.nats_auth.connect(&url)).transpose()?,
    };
    let bar = experiments::progress::progress_bar(
        (LAYOUTS.len() * if settings.nats.is_some() { 2 } else { 1 }) as u64,
        "delivery experiment",
    );
    let result = experiment::run(&settings, |point| {
        bar.set_message(format!("run {} {}", point.layout.run, point.transport.name()));
        bar.inc(1);
    })?;
    bar.finish_and_clear();
    let (measured, published) = (measured_table(&result), published_table());
    println!("\n{measured}\n\n{published}");
    let dir = ReportDir::create(&args.out)?;
    let series: Vec<(String, &stats::LatencyHistogram)> =
        result.points.iter().map(|p| (label(p), &p.histogram)).collect();
    let series: Vec<(&str, &stats::LatencyHistogram)> =
        series.iter().map(|(l, h)| (l.as_str(), *h)).collect();
    let plot = latency_percentile_plot("Delivery latency at the outlet or edge", &series);
    dir.write_svg("latency-percentiles.svg", &plot.to_svg())?;
    dir.write_csv("measured.csv", &measured)?;
    dir.write_json("experiment.json", &result)?;
    let mut markdown = Markdown::new();
    markdown
        .heading(1, "Delivery experiment")
        .table(&measured)
        .table(&published)
        .image("latency by percentile", "latency-percentiles.svg");
    dir.write_markdown("README.md", markdown.as_str())?;
    println!("\nReport: {}", dir.path().display());
    Ok(())
}

fn label(point: &Point) -> String {
    format!("run {} {}", point.layout.run, point.transport.name())
}

fn bucket_headers() -> impl Iterator<Item = String> {
    BUCKET_UPPERS_US
        .iter()
        .map(|upper| format!("{}–{}", upper - 9, upper))
        .chain(std::iter::once(format!("> {}", BUCKET_UPPERS_US[BUCKET_UPPERS_US.len() - 1])))
}

fn measured_table(result: &Experiment) -> Table {
    let headers = ["run", "connector", "senders", "placement", "transport"]
        .map(String::from)
        .into_iter()
        .chain(bucket_headers())
        .chain(["p90 µs", "p99 µs", "resp/s", "gaps", "resyncs"].map(String::from));
    let mut table = Table::new(headers).with_title(format!(
        "Measured at the outlet or edge: cumulative % within each bucket (µs), {} cores, {} msg/s {:?}",
        result.cores, result.settings.rate_per_s, result.settings.arrival
    ));
    for point in &result.points {
        let totals = point.edge_totals.clone().unwrap_or_default();
        let nats = point.edge_totals.is_some();
        let optional = |value: u64| if nats { value.to_string() } else { "-".into() };
        let layout = point.layout;
        let cells = [
            layout.run.to_string(),
            connector_name(layout.connector).to_string(),
            layout.senders.to_string(),
            layout.placement.to_string(),
            point.transport.name().to_string(),
        ]
        .into_iter()
        .chain(point.cumulative_percent.iter().map(|p| format!("{p:.3}")))
        .chain(std::iter::once(format!("{:.3}", point.beyond_percent)))
        .chain([
            format_ns_as_us(point.latency.p90_ns),
            format_ns_as_us(point.latency.p99_ns),
            format!("{:.0}", point.throughput_per_s),
            optional(totals.gaps),
            optional(totals.resyncs),
        ]);
        table.row(cells);
    }
    table
}

fn connector_name(kind: pipeline::ConnectorKind) -> &'static str {
    match kind {
        pipeline::ConnectorKind::LockFree => "lock-free",
        pipeline::ConnectorKind::Blocking => "blocking",
    }
}

fn published_table() -> Table {
    let headers = ["run"]
        .map(String::from)
        .into_iter()
        .chain(bucket_headers())
        .chain(["p90 µs", "p99 µs"].map(String::from));
    let mut table =
        Table::new(headers).with_title("Published (2014 hardware, % of packets within)");
    for layout in LAYOUTS {
        let buckets = PUBLISHED_BUCKETS.iter().find(|(run, _)| *run == layout.run);
        let tails = PUBLISHED_P90_P99_US.iter().find(|(run, _, _)| *run == layout.run);
        if buckets.is_none() && tails.is_none() {
            continue;
        }
        let bucket_cells: Vec<String> = match buckets {
            Some((_, percents)) => {
                let beyond = 100.0 - percents[percents.len() - 1];
                percents.iter().chain(std::iter::once(&beyond)).map(|p| format!("{p:.3}")).collect()
            }
            None => vec!["-".to_string(); BUCKET_UPPERS_US.len() + 1],
        };
        let (p90, p99) = tails
            .map_or(("-".into(), "-".into()), |(_, p90, p99)| (p90.to_string(), p99.to_string()));
        table.row(std::iter::once(layout.run.to_string()).chain(bucket_cells).chain([p90, p99]));
    }
    table
}

/// R-Sender → NATS → delivery edge throughput and latency against a plain async-nats publisher and
/// subscriber moving the same records on the same server in the same run (target: ≥ 0.8× the
/// plain batched pair's throughput).
#[derive(clap::Args, Debug, Clone)]
pub struct DeliveryBenchArgs {
    /// NATS server URL (default: $LEANTIER_NATS_URL, else a nats-server child on a free port).
    #[arg(long)]
    pub nats: Option<String>,
    /// Login and TLS for the server of --nats or $LEANTIER_NATS_URL.
    #[command(flatten)]
    pub nats_auth: NatsAuthArgs,
    /// Records per repeat and contender.
    #[arg(long, default_value_t = 200_000)]
    pub records: u64,
    /// Repeats (medians are reported).
    #[arg(long, default_value_t = 5)]
    pub repeats: usize,
    /// How the sender and its publisher thread wait on their ring: auto (the tier's rule:
    /// spin with a CPU per thread, else park), spin, spin-yield, park, adaptive.
    #[arg(long, default_value = "auto")]
    pub wait: exchange::tier::WaitChoice,
    /// Exit with the "target missed" code when the ratio is below the target.
    #[arg(long)]
    pub check: bool,
    /// Report folder: the contenders as JSON, CSV and Markdown.
    #[arg(long, default_value = "leantier-report/exchange-delivery-bench")]
    pub out: PathBuf,
}

/// `leantier exchange delivery-bench`.
pub fn delivery_bench(args: &DeliveryBenchArgs) -> anyhow::Result<()> {
    let (url, _server) = match &args.nats {
        Some(url) => (url.clone(), None),
        None => server_or_env()?,
    };
    let nats = args.nats_auth.connect(&url)?;
    let report = experiments::delivery_bench::run(&nats, args.records, args.repeats, args.wait)?;
    let mut table = Table::new(["contender", "records/s (median)", "p50 µs", "p99 µs", "max µs"])
        .with_title(format!(
            "{} records x {} repeats, wait {}; leantier sent {:.1} records per NATS message",
            report.records,
            report.repeats,
            report.wait.name(),
            report.records_per_message
        ));
    for contender in [&report.leantier, &report.plain_batched, &report.plain_per_record] {
        table.row([
            contender.name.to_string(),
            format!("{:.0}", contender.throughput_per_s),
            format_ns_as_us(contender.latency.p50_ns),
            format_ns_as_us(contender.latency.p99_ns),
            format_ns_as_us(contender.latency.max_ns),
        ]);
    }
    println!("\n{table}");
    let target = experiments::delivery_bench::TARGET_THROUGHPUT_RATIO;
    let ratios = format!(
        "leantier / plain-batched: {:.2}x (target >= {target}x); leantier / plain-per-record: {:.2}x",
        report.ratio_batched, report.ratio_per_record
    );
    println!("{ratios}");
    let folder = ReportDir::create(&args.out)?;
    folder.write_json("delivery-bench.json", &report)?;
    folder.write_csv("delivery-bench.csv", &table)?;
    let mut markdown = Markdown::new();
    markdown.heading(1, "exchange delivery-bench").table(&table).paragraph(&ratios);
    folder.write_markdown("delivery-bench.md", markdown.as_str())?;
    println!("report written to {}", args.out.display());
    if args.check && report.ratio_batched < target {
        return Err(crate::outcome::TargetMissed(vec![format!(
            "leantier / plain-batched throughput {:.2}x < {target}x",
            report.ratio_batched
        )])
        .into());
    }
    Ok(())
}
