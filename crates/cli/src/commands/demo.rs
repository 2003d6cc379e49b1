//! `leantier demo`: the deployed shape. `exchange serve` runs in-process on loopback (the
//! gateway's sessions on the exchange tier) and `exchange load`'s open-loop native sessions
//! drive it over TCP. Three views per rate, each a latency histogram to the maximum:
//!
//! * **in-tier response**: arrival at the gateway → the tier's answer at the router that hands
//!   it to the session (the published lean tier's scope: critical-path processes and the
//!   R-Service, no I/O fsync), from the durable server, set beside the published p93/p95/p99;
//! * **order → ack at the client**: intended send time → first report, volatile server
//!   (store not synced, journal off);
//! * **durable reply at the client**: intended send time → first report, durable server (the
//!   tier's journal and the session store, both fsynced, overlapped).
//!
//! Then the highest rate whose p99 stays within each view's limit. `--in-process` runs the
//! tier's own critical path without a network instead (the former demo).

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use exchange::durability::JournalMode;
use exchange::flow::{UniverseConfig, reference_master_data};
use exchange::tier::TierConfig;
use gateway::hub::Settings;
use gateway::load::{LoadOptions, LoadProtocol, LoadSession};
use gateway::server::{Running, ServeOptions};
use lab::load::{ArrivalProcess, OpenLoopPlan, RateSearch, RateSearchPlan, RateSearchReport};
use lab::report::{Markdown, ReportDir, Table, format_ns_as_us};
use lab::stats::{LatencyHistogram, LatencySummary};
use serde::Serialize;

use super::exchange::DemoArgs;

/// The rates of the published figures.
const DEMO_RATES_PER_S: [f64; 3] = [20_000.0, 40_000.0, 60_000.0];
/// Native sessions driving each server (clients 1..=4).
const SESSIONS: u32 = 4;
/// The instrument every order is for, and the universe's size.
const INSTRUMENT: u32 = 1;
const UNIVERSE: UniverseConfig = UniverseConfig { instruments: 4, clients: 8 };
/// The max-rate searches' range, orders/s.
const SEARCH_START_RATE_PER_S: f64 = 20_000.0;
const SEARCH_MIN_RATE_PER_S: f64 = 1_000.0;
const SEARCH_MAX_RATE_PER_S: f64 = 1_000_000.0;
/// A search stops once the bracket is this narrow (relative).
const SEARCH_PRECISION: f64 = 0.1;
/// The durable view's limit, in raw fdatasync p99s measured in the same run.
const DURABLE_LIMIT_FSYNCS: u64 = 2;
const SECRET: &str = "demo-secret";

/// One view at one rate.
#[derive(Serialize)]
struct ViewRow {
    view: &'static str,
    rate_per_s: f64,
    sent: u64,
    answered: u64,
    latency: LatencySummary,
    /// How late the load generator sent (its own lag, beside the latency).
    send_lag: LatencySummary,
}

/// A view's max-rate search.
#[derive(Serialize)]
struct ViewSearch {
    view: &'static str,
    p99_limit_ns: u64,
    report: RateSearchReport,
}

#[derive(Serialize)]
struct DemoReport {
    raw_fdatasync: LatencySummary,
    rows: Vec<ViewRow>,
    searches: Vec<ViewSearch>,
    layout_volatile: Vec<String>,
    layout_durable: Vec<String>,
}

/// A server of the demo and how to load it.
struct Server {
    running: Running,
    load: LoadOptions,
}

impl Server {
    fn start(dir: &Path, tier: TierConfig, store_sync: bool) -> anyhow::Result<Server> {
        let hash = gateway::credentials::hash_secret(SECRET.as_bytes())?;
        let credentials = (1..=SESSIONS)
            .map(|client| gateway::credentials::Credential {
                client,
                protocol: gateway::credentials::Protocol::Native,
                comp_id: format!("N{client}"),
                hash: hash.clone(),
            })
            .collect();
        let any: SocketAddr = "127.0.0.1:0".parse()?;
        let settings = Settings {
            store_dir: dir.join("store"),
            store_sync,
            throttle_msgs_per_s: 4_000_000,
            cancel_on_disconnect: None,
            ..Settings::default()
        };
        // The server's threads inherit the load generator's priority (as scripts/
        // bench-order-entry runs its servers), so neither side preempts the other on wake-up.
        let same_priority = lab::load::GeneratorPriority::raise();
        let running = gateway::server::start(ServeOptions {
            listen: any,
            fix_listen: None,
            metrics_listen: None,
            settings,
            credentials,
            tier: TierConfig { universe: UNIVERSE, ..tier },
            planned_rate_per_s: DEMO_RATES_PER_S[2],
            journal_dir: dir.join("tier"),
            also: None,
        })?;
        drop(same_priority);
        let band = reference_master_data(&UNIVERSE);
        let listing = band.instrument(INSTRUMENT).expect("the universe lists the instrument");
        let load = LoadOptions {
            connect: running.listen,
            protocol: LoadProtocol::Native,
            sessions: (1..=SESSIONS)
                .map(|client| LoadSession {
                    client,
                    comp_id: format!("N{client}"),
                    secret: SECRET.into(),
                })
                .collect(),
            plan: plan(SEARCH_START_RATE_PER_S, Duration::ZERO),
            instrument: INSTRUMENT,
            price: (listing.band_low + listing.band_high) / 2,
        };
        Ok(Server { running, load })
    }

    /// One open-loop step at `rate`: the client's histogram and generator lag, and the
    /// in-tier histogram of the same orders.
    fn step(&self, rate: f64, seconds: f64) -> anyhow::Result<Step> {
        self.running.take_in_tier_latency(); // what came before this step
        let options =
            LoadOptions { plan: plan(rate, Duration::from_secs_f64(seconds)), ..self.load.clone() };
        let client = gateway::load::run(&options)?;
        let in_tier = self.running.take_in_tier_latency().unwrap_or_default();
        Ok(Step { client, in_tier })
    }

    fn groups(&self) -> Vec<String> {
        self.running.layout.groups.iter().map(|group| group.label()).collect()
    }
}

struct Step {
    client: gateway::load::LoadResult,
    in_tier: LatencyHistogram,
}

fn plan(rate_per_s: f64, duration: Duration) -> OpenLoopPlan {
    OpenLoopPlan { process: ArrivalProcess::Poisson { rate_per_s }, seed: 7, duration }
}

/// `leantier demo`.
pub fn run(args: &DemoArgs) -> anyhow::Result<()> {
    if args.in_process {
        return super::exchange::run_in_process_demo(args);
    }
    let (seconds, step_seconds, fsync_samples) =
        if args.quick { (1.0, 0.5, 200) } else { (3.0, 1.0, 1_000) };
    let dir = tempfile::tempdir()?;
    let fsync = lab::disk::raw_fdatasync(dir.path(), fsync_samples)?;
    let durable_limit_ns = DURABLE_LIMIT_FSYNCS * fsync.value_at_percentile_ns(99.0);
    let limit_ns = args.p99_limit_us * 1_000;
    let tier = TierConfig { layout: args.layout, ..TierConfig::default() };
    let mut rows = Vec::new();
    let mut searches = Vec::new();

    println!("volatile server (journal off, store not synced): order -> ack at the client");
    let volatile_tier = TierConfig { journal: JournalMode::OFF, ..tier.clone() };
    let volatile = Server::start(&dir.path().join("volatile"), volatile_tier, false)?;
    for rate in DEMO_RATES_PER_S {
        let step = volatile.step(rate, seconds)?;
        rows.push(row("order -> ack", rate, &step.client, &step.client.latency));
    }
    let ack = search(&volatile, limit_ns, step_seconds, |step| step.client.latency)?;
    searches.push(ViewSearch { view: "order -> ack", p99_limit_ns: limit_ns, report: ack });
    let layout_volatile = volatile.groups();
    drop(volatile);

    println!(
        "durable server (journal {}, store fdatasync): durable reply, in-tier response",
        args.journal.name()
    );
    let durable_tier = TierConfig { journal: args.journal, ..tier };
    let durable = Server::start(&dir.path().join("durable"), durable_tier, true)?;
    for rate in DEMO_RATES_PER_S {
        let step = durable.step(rate, seconds)?;
        rows.push(row("in-tier response", rate, &step.client, &step.in_tier));
        rows.push(row("durable reply", rate, &step.client, &step.client.latency));
    }
    let in_tier = search(&durable, limit_ns, step_seconds, |step| step.in_tier)?;
    searches.push(ViewSearch { view: "in-tier response", p99_limit_ns: limit_ns, report: in_tier });
    let reply = search(&durable, durable_limit_ns, step_seconds, |step| step.client.latency)?;
    searches.push(ViewSearch {
        view: "durable reply",
        p99_limit_ns: durable_limit_ns,
        report: reply,
    });
    let layout_durable = durable.groups();
    drop(durable);

    let report = DemoReport {
        raw_fdatasync: fsync.summary(),
        rows,
        searches,
        layout_volatile,
        layout_durable,
    };
    present(&report, &args.out)
}

fn row(
    view: &'static str,
    rate: f64,
    client: &gateway::load::LoadResult,
    latency: &LatencyHistogram,
) -> ViewRow {
    ViewRow {
        view,
        rate_per_s: rate,
        sent: client.sent,
        answered: client.answered,
        latency: latency.summary(),
        send_lag: client.send_lag.summary(),
    }
}

/// The highest rate whose p99 of `view` stays within `limit_ns`, bracketed and bisected.
fn search(
    server: &Server,
    limit_ns: u64,
    step_seconds: f64,
    view: impl Fn(Step) -> LatencyHistogram,
) -> anyhow::Result<RateSearchReport> {
    let mut search = RateSearch::new(RateSearchPlan {
        start_rate_per_s: SEARCH_START_RATE_PER_S,
        min_rate_per_s: SEARCH_MIN_RATE_PER_S,
        max_rate_per_s: SEARCH_MAX_RATE_PER_S,
        percentile: 99.0,
        limit_ns,
        precision: SEARCH_PRECISION,
    })?;
    while let Some(rate) = search.next_rate() {
        let latency = view(server.step(rate, step_seconds)?);
        search.record(rate, &latency);
    }
    Ok(search.into_report())
}

fn views_table(rows: &[ViewRow]) -> Table {
    let headers = [
        "view",
        "rate",
        "sent",
        "answered",
        "p50 µs",
        "p93 µs",
        "p95 µs",
        "p99 µs",
        "max µs",
        "generator lag p99 µs",
    ];
    let mut table = Table::new(headers)
        .with_title("Three views of the same server, each from the intended send time (in-tier: from arrival at the gateway)");
    for row in rows {
        let l = &row.latency;
        table.row([
            row.view.to_string(),
            format!("{:.0}", row.rate_per_s),
            row.sent.to_string(),
            row.answered.to_string(),
            format_ns_as_us(l.p50_ns),
            format_ns_as_us(l.p93_ns),
            format_ns_as_us(l.p95_ns),
            format_ns_as_us(l.p99_ns),
            format_ns_as_us(l.max_ns),
            format_ns_as_us(row.send_lag.p99_ns),
        ]);
    }
    table
}

fn published_table(rows: &[ViewRow]) -> Table {
    let title = "In-tier response vs the published lean tier (same scope: critical-path \
                 processes and the R-Service, no fsync; ratio ≤ 1 is at or below it)";
    let ours = |rate: f64| {
        let row = rows.iter().find(|r| r.view == "in-tier response" && r.rate_per_s == rate)?;
        Some([row.latency.p93_ns, row.latency.p95_ns, row.latency.p99_ns])
    };
    let empty = || Table::new(["rate"]).with_title(title);
    super::exchange::published_comparison(title, "leantier in-tier µs", ours).unwrap_or_else(empty)
}

fn searches_table(searches: &[ViewSearch]) -> Table {
    let mut table = Table::new([
        "view",
        "p99 limit µs",
        "highest rate meeting it /s",
        "lowest rate missing it /s",
    ])
    .with_title("Highest rate per view (open loop, bracketed then bisected)");
    let rate = |rate: Option<f64>, none: &str| rate.map_or(none.to_string(), |r| format!("{r:.0}"));
    for search in searches {
        table.row([
            search.view.to_string(),
            format_ns_as_us(search.p99_limit_ns),
            rate(search.report.last_passing_rate_per_s, "none"),
            rate(search.report.first_failing_rate_per_s, "none up to the search's top"),
        ]);
    }
    table
}

fn present(report: &DemoReport, out: &Path) -> anyhow::Result<()> {
    let views = views_table(&report.rows);
    let published = published_table(&report.rows);
    let searches = searches_table(&report.searches);
    let fsync = format!(
        "raw fdatasync p50/p99 {} / {} µs (this disk, this run); tier layout: volatile {}, durable {}",
        format_ns_as_us(report.raw_fdatasync.p50_ns),
        format_ns_as_us(report.raw_fdatasync.p99_ns),
        report.layout_volatile.join(" | "),
        report.layout_durable.join(" | "),
    );
    println!("\n{views}\n{published}\n{searches}\n{fsync}");
    let dir = ReportDir::create(out)?;
    dir.write_json("summary.json", report)?;
    dir.write_csv("views.csv", &views)?;
    dir.write_csv("published.csv", &published)?;
    dir.write_csv("max_rates.csv", &searches)?;
    let mut markdown = Markdown::new();
    markdown.heading(1, "leantier demo: exchange serve on loopback").paragraph(&fsync);
    markdown.table(&views).table(&published).table(&searches);
    dir.write_markdown("summary.md", markdown.as_str())?;
    println!("\nReport: {}/summary.md (JSON and CSV beside it)", out.display());
    println!("Try next:");
    println!("  leantier demo --in-process      # the tier's own critical path, no network");
    println!("  leantier exchange serve --config serve.toml --nats nats://127.0.0.1:4222");
    Ok(())
}
