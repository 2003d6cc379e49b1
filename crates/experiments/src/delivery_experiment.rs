//! The published response-delivery experiment: seven layouts of the R-Processor → R-Senders
//! hop, each measured where the paper's R-Gateway stands, twice — in-process (at the tier's
//! outlets, its own subscribers) and over
//! NATS (publisher threads → `nats-server` → one delivery edge per outlet, in this process,
//! with latency from each request's intended send time to the edge's receipt, in absolute
//! `CLOCK_MONOTONIC` time).
//!
//! | run | connector  | senders | placement |
//! |-----|------------|---------|-----------|
//! | 1   | blocking   | 20      | no        |
//! | 2   | lock-free  | 20      | no        |
//! | 3–7 | lock-free  | 6, 4, 3, 2, 1 | yes |

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::tier_load::{
    Arrival, LoadConfig, RunOptions, RunResult, run as run_tier, run_with_subscribers,
};
use exchange::durability::{JournalMode, JournalOptions};
use exchange::tier::{LayoutChoice, TierConfig};
use pipeline::ConnectorKind;
use stats::{LatencyHistogram, LatencySummary};

use delivery::edge::{EdgeOptions, RunningEdge, start as start_edge};
use delivery::nats::NatsConnect;
use delivery::publish::{
    HEARTBEAT_INTERVAL_DEFAULT, LINGER_AFTER_STOP_MAX, NatsPublisher, PublishOptions,
    PublishReport, RETAIN_RECORDS_DEFAULT,
};
use delivery::subjects::PREFIX_DEFAULT;
use delivery::{DeliveryError, Result};

/// One layout of the experiment.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct Layout {
    pub run: usize,
    pub connector: ConnectorKind,
    pub senders: usize,
    pub placement: bool,
}

/// The published experiment's seven runs.
pub const LAYOUTS: [Layout; 7] = [
    Layout { run: 1, connector: ConnectorKind::Blocking, senders: 20, placement: false },
    Layout { run: 2, connector: ConnectorKind::LockFree, senders: 20, placement: false },
    Layout { run: 3, connector: ConnectorKind::LockFree, senders: 6, placement: true },
    Layout { run: 4, connector: ConnectorKind::LockFree, senders: 4, placement: true },
    Layout { run: 5, connector: ConnectorKind::LockFree, senders: 3, placement: true },
    Layout { run: 6, connector: ConnectorKind::LockFree, senders: 2, placement: true },
    Layout { run: 7, connector: ConnectorKind::LockFree, senders: 1, placement: true },
];

/// Width of the published buckets.
pub const BUCKET_WIDTH_NS: u64 = 10_000;
/// The published table's buckets end at 30, 40, ..., 120 µs (the "21–30 … 111–120" columns).
pub const BUCKET_UPPERS_US: [u64; 10] = [30, 40, 50, 60, 70, 80, 90, 100, 110, 120];
/// Published cumulative % within each of [`BUCKET_UPPERS_US`], by run.
pub const PUBLISHED_BUCKETS: [(usize, [f64; 10]); 2] = [
    (1, [0.131, 6.193, 16.171, 34.237, 62.610, 82.029, 91.530, 95.296, 97.091, 98.109]),
    (5, [83.946, 94.470, 97.902, 99.189, 99.685, 99.858, 99.926, 99.956, 99.969, 99.975]),
];
/// Published p90 / p99 in µs, by run (run 5 is "3 senders on dedicated cores").
pub const PUBLISHED_P90_P99_US: [(usize, u64, u64); 3] = [(1, 90, 140), (2, 60, 110), (5, 35, 60)];
/// The tier's outlets in every run: at least the largest sender count, so every sender of
/// runs 1–2 has an outlet routed to it.
pub const EXPERIMENT_OUTLETS: u32 = 20;
/// How long the delivery edges may take to catch up after the tier's run.
pub const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(30);

/// The experiment's settings.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Settings {
    pub rate_per_s: f64,
    pub seconds: f64,
    pub arrival: Arrival,
    /// NATS server for the second measurement of every run; `None`: in-process only.
    pub nats: Option<NatsConnect>,
}

/// How a run's responses reached the receiving end (outlet or edge).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Transport {
    InProcess,
    Nats,
}

impl Transport {
    pub fn name(self) -> &'static str {
        match self {
            Transport::InProcess => "in-process",
            Transport::Nats => "nats",
        }
    }
}

/// One run measured over one transport.
#[derive(Debug, serde::Serialize)]
pub struct Point {
    pub layout: Layout,
    pub transport: Transport,
    /// Cumulative % within each of [`BUCKET_UPPERS_US`].
    pub cumulative_percent: [f64; 10],
    /// % beyond the last bucket.
    pub beyond_percent: f64,
    pub latency: LatencySummary,
    /// Responses measured at the outlets or edges per second of the run.
    pub throughput_per_s: f64,
    pub sent: u64,
    /// Over NATS: what the publishers and edges counted.
    pub publish: Option<PublishReport>,
    pub edge_totals: Option<EdgeTotals>,
    #[serde(skip)]
    pub histogram: LatencyHistogram,
}

/// The edges' counters summed over the run's edges.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct EdgeTotals {
    pub received: u64,
    pub gaps: u64,
    pub recovered: u64,
    pub resyncs: u64,
}

/// What the experiment measured.
#[derive(Debug, serde::Serialize)]
pub struct Experiment {
    pub settings: Settings,
    pub cores: usize,
    pub points: Vec<Point>,
}

fn tier(layout: &Layout) -> TierConfig {
    TierConfig {
        // The experiment compares these thread layouts: the planner must not choose its own.
        layout: LayoutChoice::ThreadPerStage,
        connector: layout.connector,
        senders: layout.senders,
        placement: layout.placement,
        outlets: EXPERIMENT_OUTLETS,
        // Replies are not held for an fsync: the experiment compares delivery layouts.
        journal: JournalMode::OFF,
        ..TierConfig::default()
    }
}

fn run_options(settings: &Settings) -> RunOptions {
    RunOptions {
        rate_per_s: settings.rate_per_s,
        duration: Duration::from_secs_f64(settings.seconds),
        record_inputs: false,
        journal: JournalOptions::default(),
        released: None,
        stop: None,
        load: LoadConfig { arrival: settings.arrival, ..LoadConfig::default() },
    }
}

/// Runs every layout in-process and (with a NATS URL) over NATS; `progress` is told each
/// finished measurement.
pub fn run(settings: &Settings, mut progress: impl FnMut(&Point)) -> Result<Experiment> {
    let positive = |value: f64| value.is_finite() && value > 0.0;
    if !positive(settings.rate_per_s) || !positive(settings.seconds) {
        let reason = format!(
            "the rate and the duration must be > 0, got rate {}, duration {} s",
            settings.rate_per_s, settings.seconds
        );
        return Err(DeliveryError::BadInput(reason));
    }
    let mut points = Vec::new();
    for layout in LAYOUTS {
        let config = tier(&layout);
        let result = run_tier(&config, run_options(settings), |_| {})?;
        let throughput = result.end_to_end.count() as f64 / result.elapsed_s;
        let point = point(layout, Transport::InProcess, result.end_to_end, throughput, result.sent);
        progress(&point);
        points.push(point);
        if let Some(nats) = &settings.nats {
            let point = over_nats(layout, &config, settings, nats)?;
            progress(&point);
            points.push(point);
        }
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    Ok(Experiment { settings: settings.clone(), cores, points })
}

fn point(
    layout: Layout,
    transport: Transport,
    histogram: LatencyHistogram,
    throughput_per_s: f64,
    sent: u64,
) -> Point {
    let (cumulative_percent, beyond_percent) = published_buckets(&histogram);
    Point {
        layout,
        transport,
        cumulative_percent,
        beyond_percent,
        latency: histogram.summary(),
        throughput_per_s,
        sent,
        publish: None,
        edge_totals: None,
        histogram,
    }
}

/// Cumulative % at each of [`BUCKET_UPPERS_US`] and the % beyond the last (an empty
/// histogram shows 0%).
pub fn published_buckets(histogram: &LatencyHistogram) -> ([f64; 10], f64) {
    let last_us = BUCKET_UPPERS_US[BUCKET_UPPERS_US.len() - 1];
    let buckets_max = (last_us * 1_000 / BUCKET_WIDTH_NS) as usize;
    let buckets = histogram.cumulative_buckets(BUCKET_WIDTH_NS, buckets_max);
    let at = |upper_us: u64| {
        let index = (upper_us * 1_000 / BUCKET_WIDTH_NS) as usize - 1;
        match buckets.get(index) {
            Some(bucket) if bucket.upper_ns.is_some() => bucket.cumulative_percent,
            _ if buckets.is_empty() => 0.0,
            // Buckets stop once 100% is reached.
            _ => 100.0,
        }
    };
    let cumulative = BUCKET_UPPERS_US.map(at);
    let beyond = if buckets.is_empty() { 0.0 } else { 100.0 - cumulative[cumulative.len() - 1] };
    (cumulative, beyond)
}

/// The layout over NATS: publisher, one in-process delivery edge per outlet, the run, then
/// the edges catch up and report.
fn over_nats(
    layout: Layout,
    config: &TierConfig,
    settings: &Settings,
    nats: &NatsConnect,
) -> Result<Point> {
    let io = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build();
    let io = io.map_err(|source| DeliveryError::Io {
        what: "starting the edges' runtime".into(),
        source,
    })?;
    let listen = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    let edges: Vec<RunningEdge> = io.block_on(async {
        let mut edges = Vec::new();
        for outlet in 0..config.outlets {
            let options =
                EdgeOptions { nats: nats.clone(), ..EdgeOptions::new("", outlet, listen) };
            edges.push(start_edge(options).await?);
        }
        Ok::<_, DeliveryError>(edges)
    })?;
    let publisher = NatsPublisher::connect(PublishOptions {
        nats: nats.clone(),
        prefix: PREFIX_DEFAULT.to_string(),
        outlets: config.outlets,
        retain_records: RETAIN_RECORDS_DEFAULT,
        wait: config.wait_strategy(),
        heartbeat: HEARTBEAT_INTERVAL_DEFAULT,
    })?;
    let result =
        run_with_subscribers(config, run_options(settings), publisher.subscribers(), |_| {})?;
    let publish = publisher.drain()?;
    wait_caught_up(&edges, &publish)?;
    let mut histogram = LatencyHistogram::new();
    let mut totals = EdgeTotals::default();
    for edge in edges {
        let (report, latency) = io.block_on(edge.shutdown())?;
        histogram.merge(&latency.answers);
        totals.received += report.received;
        totals.gaps += report.gaps;
        totals.recovered += report.recovered;
        totals.resyncs += report.resyncs;
    }
    let throughput = histogram.count() as f64 / result.elapsed_s;
    let mut point = point(layout, Transport::Nats, histogram, throughput, result.sent);
    point.publish = Some(publish);
    point.edge_totals = Some(totals);
    Ok(point)
}

/// Waits until every edge expects the publisher's next sequence on both streams.
fn wait_caught_up(edges: &[RunningEdge], publish: &PublishReport) -> Result<()> {
    let deadline = Instant::now() + CATCH_UP_TIMEOUT;
    for (index, edge) in edges.iter().enumerate() {
        let target = &publish.next_seqs[index * 2..index * 2 + 2];
        while edge.report().next_seqs != target {
            if Instant::now() >= deadline {
                return Err(DeliveryError::Failed(format!(
                    "edge {index} did not catch up within {CATCH_UP_TIMEOUT:?}: at {:?}, \
                     publisher at {target:?}",
                    edge.report().next_seqs
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    Ok(())
}

/// Runs the tier with its R-Senders publishing over NATS (the engine process), then keeps the
/// retained windows and heartbeats up for `linger` so the edges recover what they missed. Once
/// `run.stop` is set (a stop signal) the load ends, the publishers flush what the tier
/// answered, and the linger is cut to [`LINGER_AFTER_STOP_MAX`].
pub fn run_engine(
    config: &TierConfig,
    run: RunOptions,
    publish: PublishOptions,
    linger: Duration,
    progress: impl FnMut(u64),
) -> Result<(RunResult, PublishReport), DeliveryError> {
    if publish.outlets != config.outlets {
        return Err(DeliveryError::Failed(format!(
            "publisher outlets {} != tier outlets {}",
            publish.outlets, config.outlets
        )));
    }
    let publisher = NatsPublisher::connect(publish)?;
    let stop = run.stop.clone();
    let result = run_with_subscribers(config, run, publisher.subscribers(), progress)?;
    publisher.drain()?;
    let stopped = stop.is_some_and(|stop| stop.load(Ordering::Acquire));
    std::thread::sleep(if stopped { linger.min(LINGER_AFTER_STOP_MAX) } else { linger });
    Ok((result, publisher.report()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn published_buckets_are_cumulative_at_30_to_120_us() {
        // 25 µs, 35 µs, 95 µs and 500 µs: a quarter each.
        let histogram = LatencyHistogram::from_samples_ns(&[25_000, 35_000, 95_000, 500_000]);
        let (cumulative, beyond) = published_buckets(&histogram);
        assert_eq!(cumulative[0], 25.0); // ≤ 30 µs
        assert_eq!(cumulative[1], 50.0); // ≤ 40 µs
        assert_eq!(cumulative[6], 50.0); // ≤ 90 µs
        assert_eq!(cumulative[7], 75.0); // ≤ 100 µs
        assert_eq!(cumulative[9], 75.0); // ≤ 120 µs
        assert_eq!(beyond, 25.0);
        let (empty, beyond) = published_buckets(&LatencyHistogram::new());
        assert_eq!((empty, beyond), ([0.0; 10], 0.0));
    }
}
