//! The tier's experiments as library functions: the demo's fixed rates and maximum-rate
//! search, the placement experiment (pinning + spinning vs none + parking), the R-Senders
//! experiment (1..=6 senders: speedup and Karp–Flatt) and the journal experiment (`sync` vs
//! `group` vs off against a raw fdatasync measured in the same run). Each returns typed
//! results; `leantier` prints them and writes the report folders.

use std::path::Path;
use std::time::Duration;

use crate::load::{RateSearchPlan, RateSearchReport, search_max_rate};
use crate::progress::progress_bar;
use crate::report::{Table, format_ns_as_us};
use crate::statistics::{karp_flatt, speedup};
use serde::Serialize;
use stats::{LatencyHistogram, LatencySummary};

use crate::tier_load::{LoadConfig, RunOptions, RunResult, run as run_tier};
use exchange::ExchangeError::{self, BadInput};
use exchange::Result;
use exchange::durability::{JournalMode, JournalOptions};
use exchange::tier::{LayoutChoice, TierConfig, WaitChoice, calibrate};
use journal::Policy;

/// The demo's fixed arrival rates (the source design's 20K, 40K and 60K messages/s).
pub const DEMO_RATES_PER_S: [f64; 3] = [20_000.0, 40_000.0, 60_000.0];
/// The max-rate search never goes below this rate (a tier that fails it reports no rate).
pub const MAX_RATE_SEARCH_MIN_PER_S: f64 = 1_000.0;
/// The max-rate search never goes above this rate.
pub const MAX_RATE_SEARCH_MAX_PER_S: f64 = 8_000_000.0;
/// The max-rate search stops once the passing and failing rates are this close (relative).
pub const MAX_RATE_SEARCH_PRECISION: f64 = 0.05;
/// The max-rate search runs this many times (one search on a shared machine is noise): the
/// report gives the median and the range.
pub const MAX_RATE_SEARCHES: usize = 3;
/// Steps the max-rate search may take at most (bracketing from 1K to 8M and bisecting to 5%
/// takes at most 13 + 5), for the progress bar.
const MAX_RATE_SEARCH_STEPS_MAX: u64 = 18;
/// The published lean tier's figures (2014 hardware, with affinity): the percentiles of
/// [`PUBLISHED_PERCENTILES`] in µs at each of the demo's rates, for the demo to show beside
/// leantier's critical path.
pub const PUBLISHED_LATENCY_US: [(f64, [u64; 3]); 3] =
    [(20_000.0, [48, 49, 180]), (40_000.0, [63, 70, 314]), (60_000.0, [78, 90, 333])];
/// The percentiles the published figures give.
pub const PUBLISHED_PERCENTILES: [f64; 3] = [93.0, 95.0, 99.0];

/// Under `sync` every input costs an fdatasync (milliseconds on a shared disk), so a run at
/// 20K+ msg/s builds a backlog it drains at the disk's pace: sync runs stop after this many
/// requests so they end in seconds.
pub const SYNC_REQUESTS_MAX: f64 = 500.0;
/// Target: with `group`, critical-path p99 ≤ this × the p99 with the journal off.
pub const TARGET_CRITICAL_P99_GROUP_OVER_OFF: f64 = 1.2;
/// R-Senders tried by the senders experiment (1..=this).
pub const SENDERS_MAX: usize = 6;

/// How to search the maximum sustainable rate.
#[derive(Clone, Copy, Debug)]
pub struct MaxRateSearch {
    pub step_seconds: f64,
    pub p99_limit_us: u64,
}

/// When no rate meets the search's limit, it runs again at this many times the limit, so the
/// user still learns what the tier sustains (on a VM whose host stops busy vCPUs for
/// milliseconds, say, where no rate keeps a 100 µs p99).
pub const LOOSER_LIMIT_FACTOR: u64 = 10;

/// The search to run again when `report` found no rate within its limit: the same search at
/// [`LOOSER_LIMIT_FACTOR`] times the limit. `None` when some rate passed.
pub fn looser_search(report: &RateSearchReport, search: MaxRateSearch) -> Option<MaxRateSearch> {
    report.last_passing_rate_per_s.is_none().then_some(MaxRateSearch {
        p99_limit_us: search.p99_limit_us.saturating_mul(LOOSER_LIMIT_FACTOR),
        ..search
    })
}

/// Everything one demo/run measured.
pub struct Session {
    pub config: TierConfig,
    /// The load generator's settings the runs used.
    pub load: LoadConfig,
    pub runs: Vec<RunResult>,
    /// [`MAX_RATE_SEARCHES`] max-rate searches (none without a search).
    pub max_rate: Vec<RateSearchReport>,
    /// The searches again at [`LOOSER_LIMIT_FACTOR`] × the limit, when no search found a rate
    /// that met it.
    pub max_rate_looser: Vec<RateSearchReport>,
}

/// Runs the tier at each rate for `seconds`, driven by the generator `load` describes, then
/// (with `search`) its maximum-rate search.
pub fn measure(
    config: &TierConfig,
    load: &LoadConfig,
    rates: &[f64],
    seconds: f64,
    search: Option<MaxRateSearch>,
    journal: &JournalOptions,
) -> Result<Session> {
    config.validate()?;
    load.validate()?;
    positive_rates_and_duration(rates, seconds)?;
    let config = &calibrated(config)?;
    let expected: f64 = rates.iter().map(|r| r * seconds).sum();
    let bar = progress_bar(expected as u64, "fixed rates");
    let mut runs = Vec::new();
    let mut done = 0u64;
    for &rate_per_s in rates {
        bar.set_message(format!("{} msg/s", rate_per_s as u64));
        let options = RunOptions {
            rate_per_s,
            duration: Duration::from_secs_f64(seconds),
            record_inputs: false,
            journal: journal.clone(),
            released: None,
            stop: None,
            load: load.clone(),
        };
        let result = run_tier(config, options, |sent| bar.set_position(done + sent))?;
        done += result.sent;
        runs.push(result);
    }
    bar.finish_and_clear();
    let searches = |search: Option<MaxRateSearch>| -> Result<Vec<RateSearchReport>> {
        let Some(search) = search else { return Ok(Vec::new()) };
        (0..MAX_RATE_SEARCHES).map(|_| find_max_rate(config, load, rates, search)).collect()
    };
    let max_rate = searches(search)?;
    let none_passed = max_rate.iter().all(|r| r.last_passing_rate_per_s.is_none());
    let looser = search
        .zip(max_rate.first().filter(|_| none_passed))
        .and_then(|(search, report)| looser_search(report, search));
    let max_rate_looser = searches(looser)?;
    Ok(Session { config: config.clone(), load: load.clone(), runs, max_rate, max_rate_looser })
}

/// `config` with its `auto` layout's service times measured once (every run of a session
/// then plans from the same calibration instead of calibrating again).
pub fn calibrated(config: &TierConfig) -> Result<TierConfig> {
    if config.layout != LayoutChoice::Auto || config.service_ns.is_some() {
        return Ok(config.clone());
    }
    let calibration = calibrate(config)?;
    Ok(TierConfig {
        service_ns: Some(calibration.service),
        fused_service_ns: Some(calibration.fused_service),
        ..config.clone()
    })
}

/// The highest rate whose critical-path p99 stays within the limit: bracketed from the
/// highest fixed rate (doubling while runs pass, halving while they fail), then bisected.
fn find_max_rate(
    config: &TierConfig,
    load: &LoadConfig,
    rates: &[f64],
    search: MaxRateSearch,
) -> Result<RateSearchReport> {
    let start = rates.iter().copied().fold(MAX_RATE_SEARCH_MIN_PER_S, f64::max);
    let plan = RateSearchPlan {
        start_rate_per_s: start.min(MAX_RATE_SEARCH_MAX_PER_S),
        min_rate_per_s: MAX_RATE_SEARCH_MIN_PER_S,
        max_rate_per_s: MAX_RATE_SEARCH_MAX_PER_S,
        percentile: 99.0,
        limit_ns: search.p99_limit_us * 1_000,
        precision: MAX_RATE_SEARCH_PRECISION,
    };
    let step_seconds = search.step_seconds;
    let bar = progress_bar(MAX_RATE_SEARCH_STEPS_MAX, "max-rate search");
    let report = search_max_rate(plan, |rate_per_s| {
        bar.set_message(format!("{} msg/s", rate_per_s as u64));
        bar.inc(1);
        let run = run_at(config, load, rate_per_s, step_seconds, JournalOptions::default())?;
        Ok::<_, ExchangeError>(run.critical_path)
    })?;
    bar.finish_and_clear();
    Ok(report)
}

/// One run of `config` at a rate.
fn run_at(
    config: &TierConfig,
    load: &LoadConfig,
    rate_per_s: f64,
    seconds: f64,
    journal: JournalOptions,
) -> Result<RunResult, ExchangeError> {
    let options = RunOptions {
        rate_per_s,
        duration: Duration::from_secs_f64(seconds),
        record_inputs: false,
        journal,
        released: None,
        stop: None,
        load: load.clone(),
    };
    run_tier(config, options, |_| {})
}

/// The placement and senders experiments compare thread layouts; a held reply would add the
/// disk's fsync time to every latency they compare, so they run without a journal.
/// The experiments that compare thread counts, waits or pinning force one thread per stage.
fn unjournaled() -> TierConfig {
    TierConfig {
        journal: JournalMode::OFF,
        layout: LayoutChoice::ThreadPerStage,
        ..TierConfig::default()
    }
}

/// One layout at one rate in the placement experiment.
#[derive(Debug, Serialize)]
pub struct PlacementPoint {
    pub variant: &'static str,
    pub rate_per_s: f64,
    pub end_to_end: LatencySummary,
    /// The same latency in full, for percentile plots and `.hgrm` files.
    #[serde(skip)]
    pub end_to_end_histogram: LatencyHistogram,
    /// What placement reported (pinning refused, threads sharing a CPU, …).
    pub notes: Vec<String>,
}

/// Pinning + spinning against no placement + parking at the demo's rates.
pub fn placement(seconds: f64) -> Result<Vec<PlacementPoint>> {
    positive_rates_and_duration(&[], seconds)?;
    let unjournaled = unjournaled();
    let variants = [
        (
            "placement+spin",
            TierConfig { placement: true, wait: WaitChoice::Spin, ..unjournaled.clone() },
        ),
        (
            "none+park",
            TierConfig { placement: false, wait: WaitChoice::Park, ..unjournaled.clone() },
        ),
    ];
    let bar =
        progress_bar((variants.len() * DEMO_RATES_PER_S.len()) as u64, "placement experiment");
    let mut points = Vec::new();
    for rate_per_s in DEMO_RATES_PER_S {
        for (variant, config) in &variants {
            let result = run_at(
                config,
                &LoadConfig::default(),
                rate_per_s,
                seconds,
                JournalOptions::default(),
            )?;
            bar.inc(1);
            points.push(PlacementPoint {
                variant,
                rate_per_s,
                end_to_end: result.end_to_end.summary(),
                end_to_end_histogram: result.end_to_end.clone(),
                notes: result.placement.notes.clone(),
            });
        }
    }
    bar.finish_and_clear();
    Ok(points)
}

/// One sender count in the senders experiment.
#[derive(Debug, Serialize)]
pub struct SendersPoint {
    pub senders: usize,
    pub latency: LatencySummary,
    /// Mean latency with one sender over the mean with these.
    pub speedup: Option<f64>,
    /// The serial fraction the speedup implies.
    pub karp_flatt: Option<f64>,
}

/// Every rate and the duration are > 0; the refusal names them as the flags do (`rate`,
/// `duration`), with the values given, not the retired spellings (`rates`, `seconds`).
fn positive_rates_and_duration(rates: &[f64], seconds: f64) -> Result<()> {
    let positive = |value: f64| value.is_finite() && value > 0.0;
    if let Some(rate) = rates.iter().find(|rate| !positive(**rate)) {
        return Err(BadInput(format!("every rate must be > 0, got {rate}")));
    }
    if !positive(seconds) {
        return Err(BadInput(format!("the duration must be > 0, got {seconds} s")));
    }
    Ok(())
}

/// 1..=[`SENDERS_MAX`] R-Senders at one rate, each doing `publish_work_ns` of work per message.
pub fn senders(rate_per_s: f64, seconds: f64, publish_work_ns: u64) -> Result<Vec<SendersPoint>> {
    positive_rates_and_duration(&[rate_per_s], seconds)?;
    let unjournaled = unjournaled();
    let bar = progress_bar(SENDERS_MAX as u64, "senders experiment");
    let mut results = Vec::new();
    for senders in 1..=SENDERS_MAX {
        let config = TierConfig { senders, ..unjournaled.clone() };
        let load = LoadConfig { publish_work_ns, ..LoadConfig::default() };
        let run = run_at(&config, &load, rate_per_s, seconds, JournalOptions::default())?;
        results.push((senders, run.end_to_end.summary()));
        bar.inc(1);
    }
    bar.finish_and_clear();
    let baseline_ns = results[0].1.mean_ns;
    let points = results
        .into_iter()
        .map(|(senders, latency)| {
            let gain = speedup(baseline_ns, latency.mean_ns).ok();
            let serial = gain.and_then(|s| karp_flatt(s, senders as f64).ok());
            SendersPoint { senders, latency, speedup: gain, karp_flatt: serial }
        })
        .collect();
    Ok(points)
}

/// One mode at one rate in the journal experiment.
#[derive(Debug, Serialize)]
pub struct JournalPoint {
    pub rate_per_s: f64,
    pub journal: JournalMode,
    pub sent: u64,
    pub critical_path: LatencySummary,
    pub reply: LatencySummary,
    pub fsyncs: u64,
}

/// The experiment's ratios at one rate (`None` where a p99 was 0).
#[derive(Debug, Serialize)]
pub struct JournalRatios {
    pub rate_per_s: f64,
    pub critical_p99_group_over_off: Option<f64>,
    pub durable_p99_group_over_raw_fsync: Option<f64>,
}

/// The journal experiment's measurements.
#[derive(Debug, Serialize)]
pub struct JournalExperiment {
    pub config: TierConfig,
    pub raw_fdatasync_4k: LatencySummary,
    pub points: Vec<JournalPoint>,
    pub ratios: Vec<JournalRatios>,
    /// The folder whose disk the runs wrote to (`--data`, else the system temp dir); their
    /// own files, in a subfolder of it, are removed when the experiment ends.
    #[serde(skip)]
    pub written_under: std::path::PathBuf,
}

fn ratio(numerator_ns: u64, denominator_ns: u64) -> Option<f64> {
    (denominator_ns > 0).then(|| numerator_ns as f64 / denominator_ns as f64)
}

/// `sync` vs `group` vs off at the demo's rates, and a raw 4 KiB append + fdatasync measured
/// in the same run, in a temporary directory under `data` (default: the system's).
pub fn journal_modes(
    base: &TierConfig,
    seconds: f64,
    fsync_samples: u64,
    data: Option<&Path>,
) -> Result<JournalExperiment> {
    positive_rates_and_duration(&[], seconds)?;
    if fsync_samples == 0 {
        return Err(BadInput("the fsync samples must be > 0".into()));
    }
    base.validate()?;
    let mut temp = tempfile::Builder::new();
    temp.prefix("journal-experiment-");
    let root = match data {
        Some(dir) => temp.tempdir_in(dir),
        None => temp.tempdir(),
    };
    let io_failed = |what: &str| {
        let what = what.to_string();
        move |source| ExchangeError::Io { what, source }
    };
    let root = root.map_err(io_failed("creating the experiment's data directory"))?;
    let raw_fsync = crate::disk::raw_fdatasync(root.path(), fsync_samples)
        .map_err(io_failed("measuring raw fdatasync"))?
        .summary();
    let modes = [Policy::Sync.into(), Policy::Group.into(), JournalMode::OFF];
    let bar = progress_bar((modes.len() * DEMO_RATES_PER_S.len()) as u64, "journal experiment");
    let mut points = Vec::new();
    for rate_per_s in DEMO_RATES_PER_S {
        for journal in modes {
            let seconds = match journal {
                JournalMode(Some(Policy::Sync)) => seconds.min(SYNC_REQUESTS_MAX / rate_per_s),
                _ => seconds,
            };
            let config = TierConfig { journal, ..base.clone() };
            let options = JournalOptions {
                // With the journal off there is nothing to write (a data dir is refused).
                data_dir: journal
                    .policy()
                    .map(|_| root.path().join(format!("{journal:?}-{rate_per_s}"))),
                ..JournalOptions::default()
            };
            let run = run_at(&config, &LoadConfig::default(), rate_per_s, seconds, options)?;
            bar.inc(1);
            points.push(JournalPoint {
                rate_per_s,
                journal,
                sent: run.sent,
                critical_path: run.critical_path.summary(),
                reply: run.end_to_end.summary(),
                fsyncs: run.journal.iter().filter_map(|j| j.writer).map(|w| w.syncs).sum(),
            });
        }
    }
    bar.finish_and_clear();
    let ratios = journal_ratios(&points, raw_fsync.p99_ns);
    Ok(JournalExperiment {
        config: base.clone(),
        raw_fdatasync_4k: raw_fsync,
        points,
        ratios,
        written_under: data.map_or_else(std::env::temp_dir, std::path::Path::to_path_buf),
    })
}

fn journal_ratios(points: &[JournalPoint], raw_fsync_p99_ns: u64) -> Vec<JournalRatios> {
    let p99 = |rate: f64, mode: JournalMode, reply: bool| {
        points
            .iter()
            .find(|p| p.rate_per_s == rate && p.journal == mode)
            .map_or(0, |p| if reply { p.reply.p99_ns } else { p.critical_path.p99_ns })
    };
    DEMO_RATES_PER_S
        .iter()
        .map(|&rate| JournalRatios {
            rate_per_s: rate,
            critical_p99_group_over_off: ratio(
                p99(rate, Policy::Group.into(), false),
                p99(rate, JournalMode::OFF, false),
            ),
            durable_p99_group_over_raw_fsync: ratio(
                p99(rate, Policy::Group.into(), true),
                raw_fsync_p99_ns,
            ),
        })
        .collect()
}

/// One point of the layout benchmark: both layouts at one rate and journal mode, same run.
pub struct LayoutPoint {
    pub journal: JournalMode,
    pub rate_per_s: f64,
    pub auto: RunResult,
    pub thread_per_stage: RunResult,
}

/// The highest rate each layout sustains within the p99 limit, per journal mode.
pub struct LayoutMaxRates {
    pub journal: JournalMode,
    pub auto: RateSearchReport,
    pub thread_per_stage: RateSearchReport,
}

/// `auto` against thread-per-stage (today's defaults otherwise), interleaved rate by rate.
pub struct LayoutBench {
    pub points: Vec<LayoutPoint>,
    pub max_rates: Vec<LayoutMaxRates>,
}

/// Runs the tier with the `auto` layout and with thread-per-stage at each rate, for each
/// journal mode, alternating the two per rate so both see the same host; then (with
/// `search`) each one's maximum-rate search.
pub fn layout_bench(
    rates: &[f64],
    seconds: f64,
    journals: &[JournalMode],
    search: Option<MaxRateSearch>,
) -> Result<LayoutBench> {
    positive_rates_and_duration(rates, seconds)?;
    let mut bench = LayoutBench { points: Vec::new(), max_rates: Vec::new() };
    for &journal in journals {
        let auto = calibrated(&TierConfig { journal, ..TierConfig::default() })?;
        let spread =
            TierConfig { journal, layout: LayoutChoice::ThreadPerStage, ..TierConfig::default() };
        for &rate_per_s in rates {
            let auto_run = run_at(
                &auto,
                &LoadConfig::default(),
                rate_per_s,
                seconds,
                JournalOptions::default(),
            )?;
            let spread_run = run_at(
                &spread,
                &LoadConfig::default(),
                rate_per_s,
                seconds,
                JournalOptions::default(),
            )?;
            let point =
                LayoutPoint { journal, rate_per_s, auto: auto_run, thread_per_stage: spread_run };
            bench.points.push(point);
        }
        if let Some(search) = search {
            let auto_max = find_max_rate(&auto, &LoadConfig::default(), rates, search)?;
            let spread_max = find_max_rate(&spread, &LoadConfig::default(), rates, search)?;
            let max = LayoutMaxRates { journal, auto: auto_max, thread_per_stage: spread_max };
            bench.max_rates.push(max);
        }
    }
    Ok(bench)
}

/// A rate as the tables label it: `20K/s`, or `500/s` below a thousand.
pub fn rate_label(rate_per_s: f64) -> String {
    if rate_per_s >= 1_000.0 {
        format!("{:.0}K/s", rate_per_s / 1_000.0)
    } else {
        format!("{rate_per_s:.0}/s")
    }
}

/// A leantier figure beside the published lean tier's at each published rate and percentile
/// (`ours(rate)`: ns at [`PUBLISHED_PERCENTILES`], `None` where the rate was not run), with
/// the ratio; `None` when no published rate was run.
pub fn published_comparison(
    title: &str,
    column: &str,
    ours: impl Fn(f64) -> Option<[u64; 3]>,
) -> Option<Table> {
    let mut table =
        Table::new(["rate", "percentile", column, "published µs", "ratio"]).with_title(title);
    let mut rows = 0;
    for (rate, published_us) in PUBLISHED_LATENCY_US {
        let Some(ours_ns) = ours(rate) else { continue };
        for ((percentile, ours_ns), published_us) in
            PUBLISHED_PERCENTILES.iter().zip(ours_ns).zip(published_us)
        {
            table.row([
                rate_label(rate),
                format!("p{percentile:.0}"),
                format_ns_as_us(ours_ns),
                published_us.to_string(),
                format!("{:.2}", ours_ns as f64 / (published_us * 1_000) as f64),
            ]);
            rows += 1;
        }
    }
    (rows > 0).then_some(table)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::RateSearchPlan;

    /// The refusals name the flags as they are now spelled, with the value given.
    #[test]
    fn a_bad_rate_or_duration_is_named_as_the_flags_are() {
        let text = |error: ExchangeError| error.to_string();
        let rate = text(senders(-5.0, 1.0, 0).unwrap_err());
        assert!(rate.contains("every rate must be > 0, got -5"), "{rate}");
        let duration = text(placement(0.0).unwrap_err());
        assert!(duration.contains("the duration must be > 0, got 0 s"), "{duration}");
        for error in [rate, duration] {
            assert!(!error.contains("seconds") && !error.contains("rates"), "{error}");
        }
    }

    fn report(last_passing_rate_per_s: Option<f64>) -> RateSearchReport {
        let plan = RateSearchPlan {
            start_rate_per_s: 60_000.0,
            min_rate_per_s: MAX_RATE_SEARCH_MIN_PER_S,
            max_rate_per_s: MAX_RATE_SEARCH_MAX_PER_S,
            percentile: 99.0,
            limit_ns: 100_000,
            precision: MAX_RATE_SEARCH_PRECISION,
        };
        RateSearchReport {
            plan,
            steps: Vec::new(),
            last_passing_rate_per_s,
            first_failing_rate_per_s: Some(1_000.0),
        }
    }

    #[test]
    fn a_search_that_found_no_rate_runs_again_at_a_looser_limit_only() {
        let search = MaxRateSearch { step_seconds: 0.5, p99_limit_us: 100 };
        let looser = looser_search(&report(None), search).expect("no rate passed");
        assert_eq!(looser.p99_limit_us, 100 * LOOSER_LIMIT_FACTOR);
        assert_eq!(looser.step_seconds, search.step_seconds);
        assert!(looser_search(&report(Some(26_250.0)), search).is_none());
    }
}
