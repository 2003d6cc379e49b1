//! `leantier bench ring`: pipeline's lock-free ring against the queues an engineer would
//! otherwise use, in the same run: rtrb, crossbeam (`ArrayQueue` and bounded channel), the
//! `disruptor` crate, `std::sync::mpsc::sync_channel` and the blocking baseline.
//!
//! Two measurements:
//! - **throughput**, 1 producer → 1 consumer, for each batch size and message size; trials
//!   are interleaved across peers (trial 1 of every peer, then trial 2, …) so that noise from
//!   other processes spreads evenly, and the median is reported with the ratio of leantier
//!   to the best peer;
//! - **ping-pong latency**: one message bounced between two pinned threads; half of each
//!   round trip is the one-way hop, reported as percentiles up to the maximum.
//!
//! Targets (issue 2): at batch ≥ 16, leantier ≥ 1.0× the best peer; one-way hop p50 ≤ 100 ns
//! with pinned threads on two cores. `--check` turns a miss into exit code 3.

pub mod harness;
pub mod peers;

use std::path::PathBuf;

use serde::Serialize;

use self::harness::CpuPair;
use self::peers::{Message8, Message64, Payload, Peer};
use crate::outcome::{BadInput, TargetMissed};
use crate::report::{BarChart, Markdown, ReportDir, Table, latency_cdf_plot, progress_bar};
use crate::stats::{LatencyHistogram, LatencySummary};

pub use self::harness::{BATCH_SLOTS_MAX, CAPACITY_SLOTS};

/// The one-way hop p50 the ring must reach with pinned threads (issue 2).
const HOP_NS_P50_TARGET: u64 = 100;
/// The throughput ratio to the best peer the ring must reach at batch ≥ 16.
const THROUGHPUT_RATIO_TARGET: f64 = 1.0;
const BATCH_TARGET_MIN: usize = 16;

/// Ring throughput and latency against its peers, with the ratios.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Messages per throughput trial.
    #[arg(long, default_value_t = 2_000_000)]
    pub messages: u64,
    /// Trials per cell; the median is reported.
    #[arg(long, default_value_t = 5)]
    pub trials: usize,
    /// Batch sizes to measure (comma separated, each 1..=256).
    #[arg(long, value_delimiter = ',', default_value = "1,16,256")]
    pub batches: Vec<usize>,
    /// Round trips per peer in the ping-pong latency test.
    #[arg(long, default_value_t = 200_000)]
    pub round_trips: u64,
    /// A short run (10× fewer messages and round trips, 3 trials) for a quick look.
    #[arg(long)]
    pub quick: bool,
    /// Do not pin the two benchmark threads to CPUs.
    #[arg(long)]
    pub no_pin: bool,
    /// Folder for the report (JSON, CSV, Markdown, SVG).
    #[arg(long, default_value = "reports/bench-ring")]
    pub out: PathBuf,
    /// Exit with code 3 when a target is missed.
    #[arg(long)]
    pub check: bool,
}

type ThroughputFn = fn(u64, usize, CpuPair) -> anyhow::Result<f64>;
type PingPongFn = fn(u64, CpuPair) -> anyhow::Result<LatencyHistogram>;

struct Contender {
    name: &'static str,
    throughput_8: ThroughputFn,
    throughput_64: ThroughputFn,
    ping_pong: PingPongFn,
}

fn contender<P: Peer<Message8> + Peer<Message64>>() -> Contender {
    Contender {
        name: <P as Peer<Message8>>::NAME,
        throughput_8: harness::throughput::<P, Message8>,
        throughput_64: harness::throughput::<P, Message64>,
        ping_pong: harness::ping_pong::<P, Message8>,
    }
}

/// leantier first: the ratios compare it with every other entry.
fn contenders() -> Vec<Contender> {
    vec![
        contender::<peers::Leantier>(),
        contender::<peers::Rtrb>(),
        contender::<peers::CrossbeamArrayQueue>(),
        contender::<peers::ViaChannel<peers::CrossbeamChannel>>(),
        contender::<peers::Disruptor>(),
        contender::<peers::ViaChannel<peers::StdSyncChannel>>(),
        contender::<peers::Blocking>(),
    ]
}

/// The ring with its consumer waiting under each strategy, for the wait-strategy table.
fn waiting_contenders() -> Vec<(pipeline::WaitStrategy, &'static str, PingPongFn)> {
    fn entry<const MODE: u8>() -> (pipeline::WaitStrategy, &'static str, PingPongFn) {
        let name = <peers::Pipeline<MODE> as Peer<Message8>>::NAME;
        (peers::wait_strategy(MODE), name, harness::ping_pong::<peers::Pipeline<MODE>, Message8>)
    }
    vec![
        entry::<{ peers::WAIT_SPIN }>(),
        entry::<{ peers::WAIT_SPIN_YIELD }>(),
        entry::<{ peers::WAIT_ADAPTIVE }>(),
        entry::<{ peers::WAIT_PARK }>(),
    ]
}

const MESSAGE_BYTES: [usize; 2] = [Message8::BYTES, Message64::BYTES];

#[derive(Debug, Serialize)]
struct ThroughputCell {
    peer: &'static str,
    message_bytes: usize,
    batch: usize,
    trials_msgs_per_s: Vec<f64>,
    median_msgs_per_s: f64,
}

#[derive(Debug, Serialize)]
struct Ratio {
    message_bytes: usize,
    batch: usize,
    leantier_msgs_per_s: f64,
    best_peer: &'static str,
    best_peer_msgs_per_s: f64,
    ratio: f64,
}

#[derive(Debug, Serialize)]
struct HopLatency {
    peer: &'static str,
    one_way_ns: LatencySummary,
}

#[derive(Debug, Serialize)]
struct WaitCost {
    strategy: &'static str,
    one_way_ns: LatencySummary,
    idle_cpu_fraction: f64,
}

#[derive(Debug, Serialize)]
struct Target {
    name: String,
    measured: String,
    target: String,
    met: bool,
}

#[derive(Debug, Serialize)]
struct RingReport {
    cpus: CpuPair,
    capacity_slots: usize,
    messages_per_trial: u64,
    trials: usize,
    round_trips: u64,
    throughput: Vec<ThroughputCell>,
    ratios: Vec<Ratio>,
    latency: Vec<HopLatency>,
    wait_strategies: Vec<WaitCost>,
    targets: Vec<Target>,
}

/// Runs the benchmark, prints the tables and writes the report folder.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let args = effective(args)?;
    let cpus = CpuPair::choose(!args.no_pin);
    if !cpus.is_pinned() {
        tracing::warn!("benchmark threads are not pinned: latency targets are not meaningful");
    }
    let contenders = contenders();
    let throughput = measure_throughput(&args, &contenders, cpus)?;
    let (latency, histograms) = measure_latency(&args, &contenders, cpus)?;
    let wait_strategies = measure_wait_strategies(&args, cpus)?;
    let ratios = ratios(&throughput);
    let targets = targets(&ratios, &latency, cpus);
    let report = RingReport {
        cpus,
        capacity_slots: CAPACITY_SLOTS,
        messages_per_trial: args.messages,
        trials: args.trials,
        round_trips: args.round_trips,
        throughput,
        ratios,
        latency,
        wait_strategies,
        targets,
    };
    write_report(&args, &report, &histograms)?;
    let missed: Vec<String> =
        report.targets.iter().filter(|t| !t.met).map(|t| t.name.clone()).collect();
    if args.check && !missed.is_empty() {
        return Err(TargetMissed(missed).into());
    }
    Ok(())
}

fn effective(args: &Args) -> anyhow::Result<Args> {
    let mut args = args.clone();
    if args.quick {
        args.messages = (args.messages / 10).max(1);
        args.round_trips = (args.round_trips / 10).max(1);
        args.trials = args.trials.min(3);
    }
    if let Some(bad) = args.batches.iter().find(|b| !(1..=BATCH_SLOTS_MAX).contains(*b)) {
        return Err(BadInput(format!("batch size {bad} is outside 1..={BATCH_SLOTS_MAX}")).into());
    }
    if args.trials == 0 || args.messages == 0 || args.round_trips < 10 {
        return Err(
            BadInput("--trials and --messages must be ≥ 1, --round-trips ≥ 10".into()).into()
        );
    }
    Ok(args)
}

fn measure_throughput(
    args: &Args,
    contenders: &[Contender],
    cpus: CpuPair,
) -> anyhow::Result<Vec<ThroughputCell>> {
    let mut cells = Vec::new();
    for &message_bytes in &MESSAGE_BYTES {
        for &batch in &args.batches {
            for contender in contenders {
                cells.push(ThroughputCell {
                    peer: contender.name,
                    message_bytes,
                    batch,
                    trials_msgs_per_s: Vec::with_capacity(args.trials),
                    median_msgs_per_s: 0.0,
                });
            }
        }
    }
    let bar = progress_bar((cells.len() * args.trials) as u64, "ring throughput");
    for _ in 0..args.trials {
        for (index, cell) in cells.iter_mut().enumerate() {
            let contender = &contenders[index % contenders.len()];
            let measure = if cell.message_bytes == Message8::BYTES {
                contender.throughput_8
            } else {
                contender.throughput_64
            };
            cell.trials_msgs_per_s.push(measure(args.messages, cell.batch, cpus)?);
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    for cell in &mut cells {
        cell.median_msgs_per_s = median(&cell.trials_msgs_per_s);
    }
    Ok(cells)
}

fn measure_latency(
    args: &Args,
    contenders: &[Contender],
    cpus: CpuPair,
) -> anyhow::Result<(Vec<HopLatency>, Vec<LatencyHistogram>)> {
    let bar = progress_bar(contenders.len() as u64, "ping-pong latency");
    let mut rows = Vec::new();
    let mut histograms = Vec::new();
    for contender in contenders {
        let histogram = (contender.ping_pong)(args.round_trips, cpus)?;
        rows.push(HopLatency { peer: contender.name, one_way_ns: histogram.summary() });
        histograms.push(histogram);
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok((rows, histograms))
}

fn measure_wait_strategies(args: &Args, cpus: CpuPair) -> anyhow::Result<Vec<WaitCost>> {
    let contenders = waiting_contenders();
    let bar = progress_bar(contenders.len() as u64, "wait strategies");
    let mut costs = Vec::new();
    for (strategy, name, ping_pong) in contenders {
        costs.push(WaitCost {
            strategy: name,
            one_way_ns: ping_pong(args.round_trips, cpus)?.summary(),
            idle_cpu_fraction: harness::idle_cpu_fraction(strategy)?,
        });
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(costs)
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let middle = sorted.len() / 2;
    if sorted.len() % 2 == 1 { sorted[middle] } else { (sorted[middle - 1] + sorted[middle]) / 2.0 }
}

/// leantier against the best other contender in every (message size, batch) cell.
fn ratios(cells: &[ThroughputCell]) -> Vec<Ratio> {
    let leantier = contenders()[0].name;
    let mut ratios = Vec::new();
    for own in cells.iter().filter(|cell| cell.peer == leantier) {
        let same_cell = |cell: &&ThroughputCell| {
            cell.message_bytes == own.message_bytes
                && cell.batch == own.batch
                && cell.peer != leantier
        };
        let Some(best) = cells
            .iter()
            .filter(same_cell)
            .max_by(|a, b| a.median_msgs_per_s.total_cmp(&b.median_msgs_per_s))
        else {
            continue;
        };
        ratios.push(Ratio {
            message_bytes: own.message_bytes,
            batch: own.batch,
            leantier_msgs_per_s: own.median_msgs_per_s,
            best_peer: best.peer,
            best_peer_msgs_per_s: best.median_msgs_per_s,
            ratio: own.median_msgs_per_s / best.median_msgs_per_s,
        });
    }
    ratios
}

fn targets(ratios: &[Ratio], latency: &[HopLatency], cpus: CpuPair) -> Vec<Target> {
    let mut targets: Vec<Target> = ratios
        .iter()
        .filter(|ratio| ratio.batch >= BATCH_TARGET_MIN)
        .map(|ratio| Target {
            name: format!("throughput {} B batch {}", ratio.message_bytes, ratio.batch),
            measured: format!("{:.2}x {}", ratio.ratio, ratio.best_peer),
            target: format!(">= {THROUGHPUT_RATIO_TARGET:.1}x best peer"),
            met: ratio.ratio >= THROUGHPUT_RATIO_TARGET,
        })
        .collect();
    let hop_p50_ns = latency[0].one_way_ns.p50_ns;
    targets.push(Target {
        name: "one-way hop p50 (pinned)".into(),
        measured: format!("{hop_p50_ns} ns{}", if cpus.is_pinned() { "" } else { " (unpinned)" }),
        target: format!("<= {HOP_NS_P50_TARGET} ns"),
        met: cpus.is_pinned() && hop_p50_ns <= HOP_NS_P50_TARGET,
    });
    targets
}

fn throughput_table(report: &RingReport) -> Table {
    let mut table = Table::new(["message", "batch", "queue", "median Mmsg/s", "vs leantier"])
        .with_title("1 producer -> 1 consumer throughput (median of trials)");
    for ratio in &report.ratios {
        for cell in report
            .throughput
            .iter()
            .filter(|c| c.message_bytes == ratio.message_bytes && c.batch == ratio.batch)
        {
            table.row([
                format!("{} B", cell.message_bytes),
                cell.batch.to_string(),
                cell.peer.to_string(),
                format!("{:.2}", cell.median_msgs_per_s / 1e6),
                format!("{:.2}x", ratio.leantier_msgs_per_s / cell.median_msgs_per_s),
            ]);
        }
    }
    table
}

fn latency_table(report: &RingReport) -> Table {
    let mut table =
        Table::new(["queue", "p50 ns", "p90 ns", "p99 ns", "p99.9 ns", "p99.99 ns", "max ns"])
            .with_title("ping-pong one-way hop (round trip / 2)");
    for row in &report.latency {
        let s = &row.one_way_ns;
        table.row([
            row.peer.to_string(),
            s.p50_ns.to_string(),
            s.p90_ns.to_string(),
            s.p99_ns.to_string(),
            s.p99_9_ns.to_string(),
            s.p99_99_ns.to_string(),
            s.max_ns.to_string(),
        ]);
    }
    table
}

fn wait_table(report: &RingReport) -> Table {
    let mut table =
        Table::new(["consumer waits by", "hop p50 ns", "hop p99 ns", "hop max ns", "idle CPU %"])
            .with_title("wait strategies: wake-up cost (ping-pong) and CPU burnt while idle");
    for cost in &report.wait_strategies {
        let s = &cost.one_way_ns;
        table.row([
            cost.strategy.to_string(),
            s.p50_ns.to_string(),
            s.p99_ns.to_string(),
            s.max_ns.to_string(),
            format!("{:.1}", cost.idle_cpu_fraction * 100.0),
        ]);
    }
    table
}

fn targets_table(report: &RingReport) -> Table {
    let mut table = Table::new(["target", "measured", "required", "met"]).with_title("targets");
    for target in &report.targets {
        let met = if target.met { "yes" } else { "NO" };
        table.row([
            target.name.clone(),
            target.measured.clone(),
            target.target.clone(),
            met.into(),
        ]);
    }
    table
}

fn write_report(
    args: &Args,
    report: &RingReport,
    histograms: &[LatencyHistogram],
) -> anyhow::Result<()> {
    let tables = [
        throughput_table(report),
        latency_table(report),
        wait_table(report),
        targets_table(report),
    ];
    for table in &tables {
        println!("{table}");
    }
    let dir = ReportDir::create(&args.out)?;
    dir.write_json("ring.json", report)?;
    dir.write_csv("throughput.csv", &tables[0])?;
    dir.write_csv("latency.csv", &tables[1])?;
    dir.write_csv("wait-strategies.csv", &tables[2])?;
    let labelled: Vec<(&str, &LatencyHistogram)> =
        report.latency.iter().map(|row| row.peer).zip(histograms).collect();
    dir.write_svg(
        "latency-cdf.svg",
        &latency_cdf_plot("one-way hop latency", &labelled).x_log().to_svg(),
    )?;
    let mut markdown = Markdown::new();
    markdown.heading(1, "leantier bench ring");
    markdown.paragraph(&format!(
        "CPUs: producer {:?}, consumer {:?}; capacity {} slots; {} messages × {} trials per cell.",
        report.cpus.producer, report.cpus.consumer, CAPACITY_SLOTS, args.messages, args.trials
    ));
    for &message_bytes in &MESSAGE_BYTES {
        let name = format!("throughput-{message_bytes}B.svg");
        dir.write_svg(&name, &throughput_chart(report, message_bytes).to_svg())?;
        markdown.image(&format!("throughput {message_bytes} B"), &name);
    }
    for table in &tables {
        markdown.table(table);
    }
    markdown.image("latency CDF", "latency-cdf.svg");
    dir.write_markdown("README.md", markdown.as_str())?;
    println!("report: {}", dir.path().display());
    Ok(())
}

fn throughput_chart(report: &RingReport, message_bytes: usize) -> BarChart {
    let batches: Vec<usize> = report
        .ratios
        .iter()
        .filter(|r| r.message_bytes == message_bytes)
        .map(|r| r.batch)
        .collect();
    let mut chart = BarChart::new(
        &format!("throughput, {message_bytes}-byte messages"),
        "million messages / s",
        batches.iter().map(|batch| format!("batch {batch}")),
    );
    for contender in contenders() {
        let values = batches
            .iter()
            .map(|&batch| {
                report
                    .throughput
                    .iter()
                    .find(|c| {
                        c.peer == contender.name
                            && c.batch == batch
                            && c.message_bytes == message_bytes
                    })
                    .map_or(0.0, |c| c.median_msgs_per_s / 1e6)
            })
            .collect();
        chart = chart.group(contender.name, values);
    }
    chart
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_contender_moves_messages_intact_at_every_size() {
        let cpus = CpuPair { producer: None, consumer: None };
        for contender in contenders() {
            for batch in [1, 16, 256] {
                assert!(
                    (contender.throughput_8)(5_000, batch, cpus).unwrap() > 0.0,
                    "{}",
                    contender.name
                );
                assert!(
                    (contender.throughput_64)(5_000, batch, cpus).unwrap() > 0.0,
                    "{}",
                    contender.name
                );
            }
            let histogram = (contender.ping_pong)(200, cpus).unwrap();
            assert_eq!(histogram.count(), 200 - 200 / 10, "{}", contender.name);
        }
    }

    #[test]
    fn a_parked_waiter_burns_far_less_cpu_than_a_spinning_one() {
        let parked = harness::idle_cpu_fraction(pipeline::WaitStrategy::Park).unwrap();
        let spinning = harness::idle_cpu_fraction(pipeline::WaitStrategy::BusySpin).unwrap();
        assert!(parked < 0.05, "parked waiter used {parked:.3} of a CPU");
        assert!(spinning > parked, "spinning {spinning:.3} vs parked {parked:.3}");
        for (_, name, ping_pong) in waiting_contenders() {
            let cpus = CpuPair { producer: None, consumer: None };
            assert_eq!(ping_pong(100, cpus).unwrap().count(), 90, "{name}");
        }
    }

    #[test]
    fn bad_batch_sizes_are_bad_input() {
        let args = Args {
            messages: 10,
            trials: 1,
            batches: vec![512],
            round_trips: 100,
            quick: false,
            no_pin: true,
            out: PathBuf::from("unused"),
            check: false,
        };
        let error = effective(&args).unwrap_err();
        assert!(error.downcast_ref::<BadInput>().is_some());
        assert!(error.to_string().contains("512"));
    }

    #[test]
    fn ratios_compare_with_the_best_other_queue() {
        let cell = |peer, rate| ThroughputCell {
            peer,
            message_bytes: 8,
            batch: 16,
            trials_msgs_per_s: vec![rate],
            median_msgs_per_s: rate,
        };
        let leantier = contenders()[0].name;
        let ratios = ratios(&[cell(leantier, 30.0), cell("a", 10.0), cell("b", 20.0)]);
        assert_eq!(ratios.len(), 1);
        assert_eq!(ratios[0].best_peer, "b");
        assert!((ratios[0].ratio - 1.5).abs() < 1e-12);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
