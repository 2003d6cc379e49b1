//! The ring against the queues an engineer would otherwise use, in the same run: rtrb,
//! crossbeam (`ArrayQueue` and bounded channel), the `disruptor` crate,
//! `std::sync::mpsc::sync_channel` and the blocking baseline (`leantier bench ring`).
//!
//! Two measurements:
//! - **throughput**, 1 producer → 1 consumer, for each batch size and message size; trials
//!   are interleaved across peers (trial 1 of every peer, then trial 2, …) so that noise from
//!   other processes spreads evenly, and the median is reported with the ratio of leantier
//!   to the best peer;
//! - **ping-pong latency**: one message bounced between two pinned threads; half of each
//!   round trip is the one-way hop, reported as percentiles up to the maximum.
//!
//! Targets (issue 15): in every (message size, batch) cell leantier ≥ 1.0× the best peer,
//! and its one-way hop p50 no worse than the best peer's, pinned, in the same run. [`run`]
//! returns the measured [`RingReport`] with each target's verdict; rendering it is the
//! command line's job.
//!
//! [`loadgen`] measures the open-loop load generator (`leantier bench load-gen`).
//!
//! This crate exists so that `lab` (statistics and reports) stays a leaf: the peers it
//! measures (rtrb, crossbeam, disruptor) and `pipeline` are its dependencies, nobody else's.

pub mod harness;
pub mod loadgen;
pub mod peers;

use crate::progress::progress_bar;
use serde::Serialize;
use stats::{LatencyHistogram, LatencySummary, median};

use self::harness::{CacheSharing, CpuPair};
use self::peers::{Message8, Message64, Payload, Peer};

pub use self::harness::{BATCH_SLOTS_MAX, CAPACITY_SLOTS};

/// The throughput ratio to the best peer the ring must reach in every cell.
const THROUGHPUT_RATIO_TARGET: f64 = 1.0;
/// Fewest round trips a latency run may use (the first tenth is warm-up).
const ROUND_TRIPS_MIN: u64 = 10;

/// The benchmark's input was invalid.
#[derive(Debug, thiserror::Error)]
pub enum RingBenchError {
    /// A setting is out of range; the message names it.
    #[error("{0}")]
    BadInput(String),
}

/// What to measure.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Messages per throughput trial.
    pub messages: u64,
    /// Trials per cell; the median is reported.
    pub trials: usize,
    /// Batch sizes to measure (each 1..=[`BATCH_SLOTS_MAX`]).
    pub batches: Vec<usize>,
    /// Round trips per peer in the ping-pong latency test.
    pub round_trips: u64,
    /// Pin the two benchmark threads to CPUs.
    pub pin: bool,
}

impl Settings {
    /// A short run: 10× fewer messages and round trips, at most 3 trials.
    pub fn quick(mut self) -> Settings {
        self.messages = (self.messages / 10).max(1);
        self.round_trips = (self.round_trips / 10).max(1);
        self.trials = self.trials.min(3);
        self
    }

    /// Refuses settings the benchmark cannot run.
    pub fn validate(&self) -> Result<(), RingBenchError> {
        if let Some(bad) = self.batches.iter().find(|b| !(1..=BATCH_SLOTS_MAX).contains(*b)) {
            return Err(RingBenchError::BadInput(format!(
                "batch size {bad} is outside 1..={BATCH_SLOTS_MAX}"
            )));
        }
        if self.trials == 0 || self.messages == 0 || self.round_trips < ROUND_TRIPS_MIN {
            return Err(RingBenchError::BadInput(format!(
                "--trials and --messages must be ≥ 1, --round-trips ≥ {ROUND_TRIPS_MIN}"
            )));
        }
        Ok(())
    }
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

/// One peer's throughput in one (message size, batch) cell.
#[derive(Debug, Serialize)]
pub struct ThroughputCell {
    pub peer: &'static str,
    pub message_bytes: usize,
    pub batch: usize,
    pub trials_msgs_per_s: Vec<f64>,
    pub median_msgs_per_s: f64,
}

/// leantier against the best other peer in one cell.
#[derive(Debug, Serialize)]
pub struct Ratio {
    pub message_bytes: usize,
    pub batch: usize,
    pub leantier_msgs_per_s: f64,
    pub best_peer: &'static str,
    pub best_peer_msgs_per_s: f64,
    pub ratio: f64,
}

/// One peer's one-way hop latency (half a ping-pong round trip).
#[derive(Debug, Serialize)]
pub struct HopLatency {
    pub peer: &'static str,
    pub one_way_ns: LatencySummary,
}

/// A wait strategy's wake-up latency and the CPU an idle waiter burns.
#[derive(Debug, Serialize)]
pub struct WaitCost {
    pub strategy: &'static str,
    pub one_way_ns: LatencySummary,
    pub idle_cpu_fraction: f64,
}

/// One target with its measured value and verdict.
#[derive(Debug, Serialize)]
pub struct Target {
    pub name: String,
    pub measured: String,
    pub target: String,
    pub met: bool,
}

/// Everything one run measured.
#[derive(Debug, Serialize)]
pub struct RingReport {
    pub cpus: CpuPair,
    /// The sharing probe before the first trial and after the last: the host may move the
    /// two vCPUs between cores, and the ratios differ between the two topologies.
    pub cache_sharing: [CacheSharing; 2],
    pub capacity_slots: usize,
    pub messages_per_trial: u64,
    pub trials: usize,
    pub round_trips: u64,
    pub throughput: Vec<ThroughputCell>,
    pub ratios: Vec<Ratio>,
    pub latency: Vec<HopLatency>,
    pub wait_strategies: Vec<WaitCost>,
    pub targets: Vec<Target>,
}

impl RingReport {
    /// The names of the targets that were missed.
    pub fn missed_targets(&self) -> Vec<String> {
        self.targets.iter().filter(|t| !t.met).map(|t| t.name.clone()).collect()
    }
}

/// A run's report and the one-way latency histogram of each peer (same order as
/// `report.latency`), for CDF plots.
pub struct RingRun {
    pub report: RingReport,
    pub histograms: Vec<LatencyHistogram>,
}

/// The peers in the order they are measured and reported; leantier first.
pub fn peer_names() -> Vec<&'static str> {
    contenders().iter().map(|contender| contender.name).collect()
}

/// Message sizes every throughput cell is measured at.
pub const MESSAGE_BYTES: [usize; 2] = [Message8::BYTES, Message64::BYTES];

/// Runs the benchmark (progress bars on stderr when it is a terminal).
pub fn run(settings: &Settings) -> anyhow::Result<RingRun> {
    settings.validate()?;
    let cpus = CpuPair::choose(settings.pin);
    if !cpus.is_pinned() {
        tracing::warn!("benchmark threads are not pinned: latency targets are not meaningful");
    }
    let contenders = contenders();
    let sharing_before = harness::probe_cache_sharing(cpus)?;
    let throughput = measure_throughput(settings, &contenders, cpus)?;
    let (latency, histograms) = measure_latency(settings, &contenders, cpus)?;
    let wait_strategies = measure_wait_strategies(settings, cpus)?;
    let cache_sharing = [sharing_before, harness::probe_cache_sharing(cpus)?];
    tracing::info!(
        before_ns = cache_sharing[0].line_transfer_ns,
        after_ns = cache_sharing[1].line_transfer_ns,
        "cache line transfer between the benchmark CPUs: {}",
        topology_label(&cache_sharing)
    );
    let ratios = ratios(&throughput);
    let targets = targets(&ratios, &latency, cpus, &cache_sharing);
    let report = RingReport {
        cpus,
        cache_sharing,
        capacity_slots: CAPACITY_SLOTS,
        messages_per_trial: settings.messages,
        trials: settings.trials,
        round_trips: settings.round_trips,
        throughput,
        ratios,
        latency,
        wait_strategies,
        targets,
    };
    Ok(RingRun { report, histograms })
}

fn measure_throughput(
    settings: &Settings,
    contenders: &[Contender],
    cpus: CpuPair,
) -> anyhow::Result<Vec<ThroughputCell>> {
    let mut cells = Vec::new();
    for &message_bytes in &MESSAGE_BYTES {
        for &batch in &settings.batches {
            for contender in contenders {
                cells.push(ThroughputCell {
                    peer: contender.name,
                    message_bytes,
                    batch,
                    trials_msgs_per_s: Vec::with_capacity(settings.trials),
                    median_msgs_per_s: 0.0,
                });
            }
        }
    }
    let bar = progress_bar((cells.len() * settings.trials) as u64, "ring throughput");
    for _ in 0..settings.trials {
        for (index, cell) in cells.iter_mut().enumerate() {
            let contender = &contenders[index % contenders.len()];
            let measure = if cell.message_bytes == Message8::BYTES {
                contender.throughput_8
            } else {
                contender.throughput_64
            };
            cell.trials_msgs_per_s.push(measure(settings.messages, cell.batch, cpus)?);
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    for cell in &mut cells {
        cell.median_msgs_per_s = median(cell.trials_msgs_per_s.clone());
    }
    Ok(cells)
}

fn measure_latency(
    settings: &Settings,
    contenders: &[Contender],
    cpus: CpuPair,
) -> anyhow::Result<(Vec<HopLatency>, Vec<LatencyHistogram>)> {
    let bar = progress_bar(contenders.len() as u64, "ping-pong latency");
    let mut rows = Vec::new();
    let mut histograms = Vec::new();
    for contender in contenders {
        let histogram = (contender.ping_pong)(settings.round_trips, cpus)?;
        rows.push(HopLatency { peer: contender.name, one_way_ns: histogram.summary() });
        histograms.push(histogram);
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok((rows, histograms))
}

fn measure_wait_strategies(settings: &Settings, cpus: CpuPair) -> anyhow::Result<Vec<WaitCost>> {
    let contenders = waiting_contenders();
    let bar = progress_bar(contenders.len() as u64, "wait strategies");
    let mut costs = Vec::new();
    for (strategy, name, ping_pong) in contenders {
        costs.push(WaitCost {
            strategy: name,
            one_way_ns: ping_pong(settings.round_trips, cpus)?.summary(),
            idle_cpu_fraction: harness::idle_cpu_fraction(strategy)?,
        });
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(costs)
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

/// The topology the probes found, for target names: the same before and after the run, or
/// "sharing changed" (then the run mixes both and its ratios belong to neither).
pub fn topology_label(cache_sharing: &[CacheSharing; 2]) -> String {
    let [before, after] = cache_sharing;
    if before.shared == after.shared {
        before.label().to_string()
    } else {
        format!("sharing changed: {} then {}", before.label(), after.label())
    }
}

fn targets(
    ratios: &[Ratio],
    latency: &[HopLatency],
    cpus: CpuPair,
    cache_sharing: &[CacheSharing; 2],
) -> Vec<Target> {
    let topology = topology_label(cache_sharing);
    let mut targets: Vec<Target> = ratios
        .iter()
        .map(|ratio| Target {
            name: format!(
                "throughput {} B batch {} ({topology})",
                ratio.message_bytes, ratio.batch
            ),
            measured: format!("{:.2}x {}", ratio.ratio, ratio.best_peer),
            target: format!(">= {THROUGHPUT_RATIO_TARGET:.1}x best peer"),
            met: ratio.ratio >= THROUGHPUT_RATIO_TARGET,
        })
        .collect();
    let (own, others) = latency.split_first().expect("leantier is the first contender");
    let hop_p50_ns = own.one_way_ns.p50_ns;
    let best = others.iter().min_by_key(|row| row.one_way_ns.p50_ns);
    let (best_peer, best_p50_ns) =
        best.map_or(("none", u64::MAX), |row| (row.peer, row.one_way_ns.p50_ns));
    targets.push(Target {
        name: format!("one-way hop p50 (pinned, {topology})"),
        measured: format!("{hop_p50_ns} ns{}", if cpus.is_pinned() { "" } else { " (unpinned)" }),
        target: format!("<= {best_p50_ns} ns ({best_peer})"),
        met: cpus.is_pinned() && hop_p50_ns <= best_p50_ns,
    });
    targets
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
    fn the_sharing_probe_times_a_line_transfer_and_labels_the_topology() {
        let cpus = CpuPair { producer: None, consumer: None };
        let probe = harness::probe_cache_sharing(cpus).unwrap();
        assert!(probe.line_transfer_ns > 0, "{probe:?}");
        assert_eq!(probe.shared, probe.line_transfer_ns < harness::SHARED_CACHE_TRANSFER_NS_MAX);
        let shared = CacheSharing { line_transfer_ns: 50, shared: true };
        let separate = CacheSharing { line_transfer_ns: 230, shared: false };
        assert_eq!(topology_label(&[shared, shared]), "shared cache");
        assert_eq!(topology_label(&[separate, separate]), "separate caches");
        let changed = topology_label(&[shared, separate]);
        assert_eq!(changed, "sharing changed: shared cache then separate caches");
        let ratio = Ratio {
            message_bytes: 8,
            batch: 1,
            leantier_msgs_per_s: 2.0,
            best_peer: "rtrb",
            best_peer_msgs_per_s: 1.0,
            ratio: 2.0,
        };
        let hop = |peer| HopLatency { peer, one_way_ns: LatencyHistogram::new().summary() };
        let latency = [hop("leantier ring"), hop("rtrb")];
        let named = targets(&[ratio], &latency, cpus, &[separate, separate]);
        assert_eq!(named[0].name, "throughput 8 B batch 1 (separate caches)");
        assert!(named[0].met);
    }

    #[test]
    fn bad_settings_are_bad_input() {
        let settings =
            Settings { messages: 10, trials: 1, batches: vec![512], round_trips: 100, pin: false };
        let RingBenchError::BadInput(reason) = settings.validate().unwrap_err();
        assert!(reason.contains("512"), "{reason}");
        let too_few_round_trips = Settings { batches: vec![16], round_trips: 9, ..settings };
        assert!(too_few_round_trips.validate().is_err());
        assert!(Settings { round_trips: 10, ..too_few_round_trips }.validate().is_ok());
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
    }
}
