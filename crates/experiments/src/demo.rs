//! The demo behind `leantier demo`: the deployed shape. `exchange serve` runs in-process on loopback (the
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
//! Then the highest rate whose p99 (of that view) stays within the view's limit, searched
//! three times (`SEARCH_REPEATS`): the report gives the median and the range, since one search on a
//! shared machine is noise. (`leantier demo --in-process`, the tier's own critical path
//! without a network, is `exchange_experiments`'.)

use exchange::instruments::InstrumentTable;
use exchange::master::MasterData;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use crate::data::{Cell, DataTable};
use crate::html::{HtmlPage, inline_svg, table_html};
use crate::load::{RateSearch, RateSearchPlan, RateSearchReport};
use crate::order_entry_load::{LoadOptions, LoadProtocol, LoadSession, Traded};
use crate::plot::{BarChart, latency_percentile_plot};
use crate::report::{Markdown, ReportDir, Table, format_ns_as_us};
use exchange::durability::JournalMode;
use exchange::flow::UniverseConfig;
use exchange::tier::TierConfig;
use gateway::Settings;
use gateway::{Running, ServeOptions};
use serde::Serialize;
use stats::open_loop::{ArrivalProcess, OpenLoopPlan};
use stats::{LatencyHistogram, LatencySummary};

use exchange::tier::LayoutChoice;

use crate::exchange_experiments::published_comparison;

/// The demo's server log, in its report folder (the binary writes the servers' logs there).
pub const LOG_FILE: &str = "servers.log";

/// What `leantier demo` runs (its flags, in `leantier demo --help`).
#[derive(Debug, Clone)]
pub struct DemoSettings {
    /// A shorter run with less precise tails.
    pub quick: bool,
    /// Report folder.
    pub out: std::path::PathBuf,
    /// Latency limit of the order → ack and in-tier max-rate searches (the durable reply's
    /// limit is 2× a raw fdatasync p99 measured in the same run).
    pub p99_limit: Duration,
    /// Journaling of the durable server's sequenced input.
    pub journal: JournalMode,
    /// The servers' thread layout.
    pub layout: LayoutChoice,
}

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
/// Each view's max-rate search runs this many times (median and range reported).
const SEARCH_REPEATS: usize = 3;
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

/// A view's max-rate searches, repeated.
#[derive(Serialize)]
struct ViewSearch {
    view: &'static str,
    /// The limit applies to this view's own p99.
    p99_limit_ns: u64,
    reports: Vec<RateSearchReport>,
}

impl ViewSearch {
    /// The highest passing rate of each search (`None`: even the lowest rate failed).
    fn passing_rates(&self) -> Vec<Option<f64>> {
        self.reports.iter().map(|r| r.last_passing_rate_per_s).collect()
    }

    /// Median, lowest and highest of the searches' highest passing rates (failed searches
    /// count as 0 msg/s), `None` without searches.
    fn median_and_range(&self) -> Option<(f64, f64, f64)> {
        let rates: Vec<f64> = self.passing_rates().iter().map(|r| r.unwrap_or(0.0)).collect();
        let low = rates.iter().copied().reduce(f64::min)?;
        let high = rates.iter().copied().reduce(f64::max)?;
        Some((stats::median(rates), low, high))
    }
}

#[derive(Serialize)]
struct DemoReport {
    raw_fdatasync: LatencySummary,
    rows: Vec<ViewRow>,
    searches: Vec<ViewSearch>,
    layout_volatile: Vec<String>,
    layout_durable: Vec<String>,
    /// Each view's latency at each rate, for the percentile plot and `.hgrm` files.
    #[serde(skip)]
    histograms: Vec<(String, LatencyHistogram)>,
}

/// Writes the reference universe as the files an operator would write (`instruments.toml`,
/// `clients.toml` in `dir`, the report's folder) and loads them back the way `exchange serve`
/// does.
fn reference_market_files(dir: &Path) -> anyhow::Result<(MasterData, InstrumentTable)> {
    let (instruments, clients) = (dir.join("instruments.toml"), dir.join("clients.toml"));
    std::fs::create_dir_all(dir)?;
    std::fs::write(
        &instruments,
        toml::to_string(&exchange::flow::reference_instruments(&UNIVERSE))?,
    )?;
    std::fs::write(&clients, toml::to_string(&exchange::flow::reference_clients(&UNIVERSE))?)?;
    let instruments = exchange::instruments::read_toml(&instruments)?;
    let clients = exchange::instruments::read_toml(&clients)?;
    Ok(exchange::instruments::load(&instruments, &clients)?)
}

/// A server of the demo and how to load it.
struct Server {
    running: Running,
    load: LoadOptions,
}

impl Server {
    fn start(
        dir: &Path,
        market: &(MasterData, InstrumentTable),
        tier: TierConfig,
        store_sync: bool,
    ) -> anyhow::Result<Server> {
        let (master, instruments) = market.clone();
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
            instruments: std::sync::Arc::new(instruments),
            ..Settings::default()
        };
        // The server's threads inherit the load generator's priority (as scripts/
        // bench-order-entry runs its servers), so neither side preempts the other on wake-up.
        let same_priority = crate::load::GeneratorPriority::raise();
        let running = gateway::start(ServeOptions {
            listen: any,
            fix_listen: None,
            metrics_listen: None,
            settings,
            credentials,
            tier: TierConfig { universe: UNIVERSE, master_data: Some(master.clone()), ..tier },
            planned_rate_per_s: DEMO_RATES_PER_S[2],
            journal_dir: dir.join("tier"),
            also: None,
        })?;
        drop(same_priority);
        let listing = master.instrument(INSTRUMENT).expect("the universe lists the instrument");
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
            instruments: vec![Traded::reference(
                INSTRUMENT,
                (listing.band_low + listing.band_high) / 2,
            )],
            tls: None,
            drain: crate::order_entry_load::DRAIN_DEFAULT,
        };
        Ok(Server { running, load })
    }

    /// One open-loop step at `rate`: the client's histogram and generator lag, and the
    /// in-tier histogram of the same orders.
    fn step(&self, rate: f64, seconds: f64) -> anyhow::Result<Step> {
        self.running.take_in_tier_latency(); // what came before this step
        let options =
            LoadOptions { plan: plan(rate, Duration::from_secs_f64(seconds)), ..self.load.clone() };
        let client = crate::order_entry_load::run(&options)?;
        let in_tier = self.running.take_in_tier_latency().unwrap_or_default();
        Ok(Step { client, in_tier })
    }

    fn groups(&self) -> Vec<String> {
        self.running.layout.groups.iter().map(|group| group.label()).collect()
    }
}

struct Step {
    client: crate::order_entry_load::LoadResult,
    in_tier: LatencyHistogram,
}

fn plan(rate_per_s: f64, duration: Duration) -> OpenLoopPlan {
    OpenLoopPlan { process: ArrivalProcess::Poisson { rate_per_s }, seed: 7, duration }
}

/// `leantier demo`: both servers, every view at the published rates, the searches, and the
/// report folder.
pub fn run(args: &DemoSettings) -> anyhow::Result<()> {
    let (seconds, step_seconds, fsync_samples) =
        if args.quick { (1.0, 0.5, 200) } else { (3.0, 1.0, 1_000) };
    let dir = tempfile::tempdir()?;
    let fsync = crate::disk::raw_fdatasync(dir.path(), fsync_samples)?;
    let durable_limit_ns = DURABLE_LIMIT_FSYNCS * fsync.value_at_percentile_ns(99.0);
    let limit_ns = stats::open_loop::duration_ns(args.p99_limit);
    let tier = TierConfig { layout: args.layout, ..TierConfig::default() };
    // The universe the servers list, written beside the report as an operator's files.
    let market = reference_market_files(&args.out)?;
    let mut rows = Vec::new();
    let mut histograms = Vec::new();
    let mut searches = Vec::new();

    println!("volatile server (journal off, store not synced): order -> ack at the client");
    let volatile_tier = TierConfig { journal: JournalMode::OFF, ..tier.clone() };
    let volatile = Server::start(&dir.path().join("volatile"), &market, volatile_tier, false)?;
    for rate in DEMO_RATES_PER_S {
        let step = volatile.step(rate, seconds)?;
        rows.push(row("order -> ack", rate, &step.client, &step.client.latency));
        histograms.push((format!("order-ack-{}k", rate / 1_000.0), step.client.latency));
    }
    let ack = search(&volatile, limit_ns, step_seconds, |step| step.client.latency)?;
    searches.push(ViewSearch { view: "order -> ack", p99_limit_ns: limit_ns, reports: ack });
    let layout_volatile = volatile.groups();
    drop(volatile);

    println!(
        "durable server (journal {}, store fdatasync): durable reply, in-tier response",
        args.journal.name()
    );
    let durable_tier = TierConfig { journal: args.journal, ..tier };
    let durable = Server::start(&dir.path().join("durable"), &market, durable_tier, true)?;
    for rate in DEMO_RATES_PER_S {
        let step = durable.step(rate, seconds)?;
        rows.push(row("in-tier response", rate, &step.client, &step.in_tier));
        rows.push(row("durable reply", rate, &step.client, &step.client.latency));
        histograms.push((format!("in-tier-{}k", rate / 1_000.0), step.in_tier));
        histograms.push((format!("durable-reply-{}k", rate / 1_000.0), step.client.latency));
    }
    let in_tier = search(&durable, limit_ns, step_seconds, |step| step.in_tier)?;
    searches.push(ViewSearch {
        view: "in-tier response",
        p99_limit_ns: limit_ns,
        reports: in_tier,
    });
    let reply = search(&durable, durable_limit_ns, step_seconds, |step| step.client.latency)?;
    searches.push(ViewSearch {
        view: "durable reply",
        p99_limit_ns: durable_limit_ns,
        reports: reply,
    });
    let layout_durable = durable.groups();
    drop(durable);

    let report = DemoReport {
        raw_fdatasync: fsync.summary(),
        rows,
        searches,
        layout_volatile,
        layout_durable,
        histograms,
    };
    present(&report, &args.out)
}

fn row(
    view: &'static str,
    rate: f64,
    client: &crate::order_entry_load::LoadResult,
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

/// The highest rate whose p99 of `view` stays within `limit_ns`, bracketed and bisected,
/// [`SEARCH_REPEATS`] times.
fn search(
    server: &Server,
    limit_ns: u64,
    step_seconds: f64,
    view: impl Fn(Step) -> LatencyHistogram,
) -> anyhow::Result<Vec<RateSearchReport>> {
    let plan = RateSearchPlan {
        start_rate_per_s: SEARCH_START_RATE_PER_S,
        min_rate_per_s: SEARCH_MIN_RATE_PER_S,
        max_rate_per_s: SEARCH_MAX_RATE_PER_S,
        percentile: 99.0,
        limit_ns,
        precision: SEARCH_PRECISION,
    };
    let mut reports = Vec::with_capacity(SEARCH_REPEATS);
    for _ in 0..SEARCH_REPEATS {
        let mut search = RateSearch::new(plan)?;
        while let Some(rate) = search.next_rate() {
            let latency = view(server.step(rate, step_seconds)?);
            search.record(rate, &latency);
        }
        reports.push(search.into_report());
    }
    Ok(reports)
}

fn views_table(rows: &[ViewRow]) -> Table {
    let headers = [
        "view",
        "rate",
        "sent",
        "answered",
        "p50 µs",
        "p90 µs",
        "p99 µs",
        "p99.9 µs",
        "p99.99 µs",
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
            format_ns_as_us(l.p90_ns),
            format_ns_as_us(l.p99_ns),
            format_ns_as_us(l.p99_9_ns),
            format_ns_as_us(l.p99_99_ns),
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
    published_comparison(title, "leantier in-tier µs", ours).unwrap_or_else(empty)
}

fn searches_table(searches: &[ViewSearch]) -> Table {
    let mut table = Table::new([
        "view (its own p99 is limited)",
        "p99 limit µs",
        "searches",
        "highest rate meeting it, median /s",
        "lowest /s",
        "highest /s",
    ])
    .with_title(format!(
        "Highest rate per view (open loop, bracketed then bisected, {SEARCH_REPEATS} searches; \
         a search where even {SEARCH_MIN_RATE_PER_S:.0}/s missed counts as 0)"
    ));
    for search in searches {
        let (median, low, high) = search.median_and_range().unwrap_or((0.0, 0.0, 0.0));
        table.row([
            search.view.to_string(),
            format_ns_as_us(search.p99_limit_ns),
            search.reports.len().to_string(),
            format!("{median:.0}"),
            format!("{low:.0}"),
            format!("{high:.0}"),
        ]);
    }
    table
}

/// The views at each rate, numbers as numbers.
fn views_data(rows: &[ViewRow]) -> DataTable {
    let mut table = DataTable::new(
        "views-latency",
        "Each view at each rate: counts and latency (µs)",
        [
            "view",
            "rate_msgs_per_s",
            "sent",
            "answered",
            "p50_us",
            "p90_us",
            "p93_us",
            "p95_us",
            "p99_us",
            "p99_9_us",
            "p99_99_us",
            "max_us",
            "generator_lag_p99_us",
        ],
    );
    let us = |ns: u64| Cell::from(ns as f64 / 1_000.0);
    for row in rows {
        let l = &row.latency;
        table.push(vec![
            row.view.into(),
            row.rate_per_s.into(),
            row.sent.into(),
            row.answered.into(),
            us(l.p50_ns),
            us(l.p90_ns),
            us(l.p93_ns),
            us(l.p95_ns),
            us(l.p99_ns),
            us(l.p99_9_ns),
            us(l.p99_99_ns),
            us(l.max_ns),
            us(row.send_lag.p99_ns),
        ]);
    }
    table
}

/// Each view's max-rate searches: the limit, then each search's highest passing rate.
fn max_rates_data(searches: &[ViewSearch]) -> DataTable {
    let mut table = DataTable::new(
        "max-rates",
        "Highest rate meeting each view's p99 limit, per search",
        [
            "view",
            "p99_limit_us",
            "search",
            "highest_passing_rate_msgs_per_s",
            "lowest_failing_rate_msgs_per_s",
        ],
    );
    for search in searches {
        for (index, report) in search.reports.iter().enumerate() {
            table.push(vec![
                search.view.into(),
                (search.p99_limit_ns as f64 / 1_000.0).into(),
                (index + 1).into(),
                report.last_passing_rate_per_s.into(),
                report.first_failing_rate_per_s.into(),
            ]);
        }
    }
    table
}

/// Median highest rate per view, with the range over the searches as whiskers.
fn max_rates_chart(searches: &[ViewSearch]) -> BarChart {
    let ranges: Vec<(f64, f64, f64)> =
        searches.iter().map(|s| s.median_and_range().unwrap_or((0.0, 0.0, 0.0))).collect();
    BarChart::new(
        "Highest rate meeting each view's own p99 limit",
        "rate (orders/s)",
        searches
            .iter()
            .map(|s| format!("{} (p99 ≤ {} µs)", s.view, format_ns_as_us(s.p99_limit_ns))),
    )
    .group_with_ranges(
        &format!("median of {SEARCH_REPEATS} searches (whiskers: range)"),
        ranges.iter().map(|r| r.0).collect(),
        ranges.iter().map(|r| Some((r.1, r.2))).collect(),
    )
    .limit("the published lean tier's top rate (60K msg/s)", DEMO_RATES_PER_S[2])
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
    let (views_data, max_rates_data) = (views_data(&report.rows), max_rates_data(&report.searches));
    dir.write_data(&views_data)?;
    dir.write_data(&max_rates_data)?;
    let max_rates_svg = max_rates_chart(&report.searches).to_svg();
    dir.write_svg("max-rates.svg", &max_rates_svg)?;
    let series: Vec<(&str, &LatencyHistogram)> =
        report.histograms.iter().map(|(name, histogram)| (name.as_str(), histogram)).collect();
    let latency_svg =
        latency_percentile_plot("Each view's latency by percentile, per rate", &series).to_svg();
    dir.write_svg("latency-percentiles.svg", &latency_svg)?;
    for (name, histogram) in &report.histograms {
        dir.write_hgrm(&format!("{name}.hgrm"), histogram)?;
    }
    let mut page = HtmlPage::new("leantier demo");
    page.heading(1, None, "leantier demo: exchange serve on loopback").paragraph(None, &fsync);
    page.raw(&table_html(&views_data)).raw(&inline_svg(&latency_svg));
    page.raw(&table_html(&max_rates_data)).raw(&inline_svg(&max_rates_svg));
    dir.write_text("index.html", &page.render())?;
    let mut markdown = Markdown::new();
    markdown.heading(1, "leantier demo: exchange serve on loopback").paragraph(&fsync);
    markdown.table(&views).table(&published).table(&searches);
    markdown
        .image("latency by percentile", "latency-percentiles.svg")
        .image("highest rate per view", "max-rates.svg");
    dir.write_markdown("summary.md", markdown.as_str())?;
    println!(
        "\nReport: {0}/index.html, {0}/summary.md (JSON, CSV and .hgrm beside them; \
         instruments.toml and clients.toml: the universe the servers listed; the servers' \
         logs: {0}/{1})",
        out.display(),
        LOG_FILE
    );
    println!("Try next:");
    println!("  leantier demo --in-process      # the tier's own critical path, no network");
    println!("  leantier exchange serve --config configs/serve.toml   # symbols, decimals, FIX");
    Ok(())
}
