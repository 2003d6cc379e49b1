//! `leantier journal bench`: journal throughput at several record sizes, the raw cost of a
//! 4 KiB append + `fdatasync` on the same disk, and the durable-reply latency of an open-loop
//! load under each policy, all in one run so the ratios compare like with like.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use pipeline::{ConnectorKind, RingConfig};
use serde::{Deserialize, Serialize};
use stats::open_loop::{ArrivalProcess, OpenLoopPlan, drive_sync};
use stats::{LatencyHistogram, LatencySummary};

use crate::report::{ReportDir, Table, latency_table};

use journal::DurableSeq;
use journal::FixedRecord;
use journal::writer::{JournalConfig, JournalWriter, Policy, Tail};

/// A latency run stops sending once the core is this far behind its schedule: the policy is
/// saturated at this rate, and the run says so instead of queueing for minutes.
pub const SATURATION_LAG_NS: u64 = 1_000_000_000;
/// Throughput target at 64-byte records with group commit (issue 4).
pub const TARGET_RECORDS_PER_S_AT_64B: f64 = 1_000_000.0;
/// Durable-reply p99 target, as a multiple of the raw 4 KiB fdatasync p99 (issue 4).
pub const TARGET_DURABLE_P99_OVER_RAW_SYNC: f64 = 2.0;
/// Record size of the latency runs.
const LATENCY_RECORD_BYTES: usize = 64;
/// Slots of the ring carrying pending replies from the core to the reply thread.
const PENDING_REPLIES_SLOTS: usize = 1 << 16;

/// Everything a bench run does; every field has a default (TOML `--config`, then flags).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BenchConfig {
    /// Where the journals are written (removed afterwards): the disk under test.
    pub dir: PathBuf,
    /// Record payload sizes of the throughput runs (64, 256 and/or 1024).
    pub record_bytes: Vec<usize>,
    /// Length of each throughput run.
    pub throughput_ms: u64,
    /// Samples of the raw 4 KiB append + fdatasync baseline.
    pub fsync_samples: u64,
    /// Arrival rate of the latency runs.
    pub rate_per_s: f64,
    /// Length of each latency run.
    pub latency_ms: u64,
    /// Policies of the latency runs.
    pub policies: Vec<Policy>,
    /// Seed of the (Poisson) arrival schedule.
    pub seed: u64,
    /// Wait strategy of the journal ring and the reply thread: spin, spin-yield, park, adaptive.
    pub wait: String,
}

impl BenchConfig {
    fn wait_strategy(&self) -> anyhow::Result<pipeline::WaitStrategy> {
        self.wait.parse().map_err(|reason: String| journal::JournalError::BadConfig(reason).into())
    }

    fn journal_config(&self, policy: Policy) -> anyhow::Result<JournalConfig> {
        let defaults = JournalConfig::default();
        let ring = RingConfig { wait: self.wait_strategy()?, ..defaults.ring };
        Ok(JournalConfig { policy, ring, ..defaults })
    }
}

impl Default for BenchConfig {
    fn default() -> Self {
        BenchConfig {
            dir: PathBuf::from("target/journal-bench"),
            record_bytes: vec![64, 256, 1024],
            throughput_ms: 1_500,
            fsync_samples: 300,
            rate_per_s: 20_000.0,
            latency_ms: 2_000,
            policies: vec![Policy::Group, Policy::Sync],
            seed: 1,
            wait: "adaptive".into(),
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct ThroughputResult {
    pub record_bytes: usize,
    pub records: u64,
    pub elapsed_s: f64,
    pub records_per_s: f64,
    /// Payload bytes per second.
    pub payload_mb_per_s: f64,
    /// Bytes written to disk per second (frames: payload + 16-byte header).
    pub disk_mb_per_s: f64,
    pub syncs: u64,
    pub records_per_sync: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct LatencyResult {
    pub policy: Policy,
    pub rate_per_s: f64,
    pub sent: u64,
    /// Inputs not sent because the core fell [`SATURATION_LAG_NS`] behind its schedule.
    pub not_sent_saturated: u64,
    /// Intended arrival → the core's `append` returned (the critical path's share).
    pub core_done: LatencySummary,
    /// Intended arrival → the durable sequence covers the input: when `group` and `sync`
    /// release the reply; under `relaxed` (reply released at core done) the loss window.
    pub durable_reply: LatencySummary,
    #[serde(skip)]
    pub durable_reply_histogram: LatencyHistogram,
}

#[derive(Clone, Debug, Serialize)]
pub struct BenchResults {
    pub config: BenchConfig,
    pub throughput: Vec<ThroughputResult>,
    /// Raw 4 KiB append + fdatasync on the same disk.
    pub raw_fdatasync: LatencySummary,
    pub latency: Vec<LatencyResult>,
}

/// Runs every part of the benchmark (the progress bar advances once per part).
pub fn run_all(config: &BenchConfig) -> anyhow::Result<BenchResults> {
    config.wait_strategy()?;
    let parts = config.record_bytes.len() + 1 + config.policies.len();
    let progress = crate::progress::progress_bar(parts as u64, "journal bench");
    std::fs::create_dir_all(&config.dir)
        .with_context(|| format!("creating {}", config.dir.display()))?;
    let mut throughput = Vec::new();
    for &record_bytes in &config.record_bytes {
        let duration = Duration::from_millis(config.throughput_ms);
        throughput.push(match record_bytes {
            64 => throughput_run::<64>(config, duration)?,
            256 => throughput_run::<256>(config, duration)?,
            1024 => throughput_run::<1024>(config, duration)?,
            other => {
                return Err(journal::JournalError::BadConfig(format!(
                    "record size {other} not benchmarked (64, 256 or 1024)"
                ))
                .into());
            }
        });
        progress.inc(1);
    }
    let raw_fdatasync = crate::disk::raw_fdatasync(&config.dir, config.fsync_samples)?.summary();
    progress.inc(1);
    let mut latency = Vec::new();
    for &policy in &config.policies {
        latency.push(latency_run(config, policy)?);
        progress.inc(1);
    }
    progress.finish_and_clear();
    Ok(BenchResults { config: config.clone(), throughput, raw_fdatasync, latency })
}

/// A fresh, empty directory for one run.
fn fresh_dir(root: &Path, name: &str) -> anyhow::Result<PathBuf> {
    let dir = root.join(name);
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

fn new_tail(dir: &Path) -> Tail {
    Tail { dir: dir.to_path_buf(), next_seq: 1, open_segment: None }
}

/// Appends `N`-byte records as fast as the core can for `duration` (group commit), then
/// waits until all are durable: records/s counts only records on disk.
fn throughput_run<const N: usize>(
    config: &BenchConfig,
    duration: Duration,
) -> anyhow::Result<ThroughputResult> {
    let dir = fresh_dir(&config.dir, &format!("throughput-{N}"))?;
    let journal_config = config.journal_config(Policy::Group)?;
    let (mut journal, writer) =
        JournalWriter::spawn::<FixedRecord<N>>(new_tail(&dir), &journal_config)?;
    let started = Instant::now();
    let mut seq = 0u64;
    // Reading the clock every 1024 records keeps it out of the per-record cost.
    while !seq.is_multiple_of(1024) || started.elapsed() < duration {
        seq += 1;
        let mut payload = [0u8; N];
        payload[..8].copy_from_slice(&seq.to_le_bytes());
        journal.append(FixedRecord { seq, payload })?;
    }
    drop(journal);
    let stats = writer.join()?;
    let elapsed_s = started.elapsed().as_secs_f64();
    std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    anyhow::ensure!(stats.records == seq, "writer wrote {} of {seq} records", stats.records);
    Ok(ThroughputResult {
        record_bytes: N,
        records: stats.records,
        elapsed_s,
        records_per_s: stats.records as f64 / elapsed_s,
        payload_mb_per_s: (stats.records * N as u64) as f64 / elapsed_s / 1e6,
        disk_mb_per_s: stats.bytes_written as f64 / elapsed_s / 1e6,
        syncs: stats.syncs,
        records_per_sync: stats.records as f64 / stats.syncs.max(1) as f64,
    })
}

/// A reply waiting for its input to be durable: what the core hands the response side.
#[derive(Clone, Copy, Debug, Default)]
struct PendingReply {
    seq: u64,
    intended_ns: u64,
}

/// Open-loop Poisson arrivals at `rate_per_s`: the core appends each input at its intended
/// time; a reply thread releases each reply once the durable sequence covers it. Latency is
/// measured from the intended time (no coordinated omission).
fn latency_run(config: &BenchConfig, policy: Policy) -> anyhow::Result<LatencyResult> {
    type Rec = FixedRecord<LATENCY_RECORD_BYTES>;
    let dir = fresh_dir(&config.dir, &format!("latency-{policy:?}"))?;
    let journal_config = config.journal_config(policy)?;
    let (mut journal, writer) = JournalWriter::spawn::<Rec>(new_tail(&dir), &journal_config)?;
    let pending_ring = RingConfig {
        capacity_slots: PENDING_REPLIES_SLOTS,
        batch_slots_max: 1024,
        ..RingConfig::default()
    };
    let (mut pending, pending_rx) =
        pipeline::connector::<PendingReply>(ConnectorKind::LockFree, &pending_ring)?;
    let base = Instant::now();
    let replies = spawn_reply_thread(pending_rx, writer.durable(), base, journal_config.ring.wait);

    let plan = OpenLoopPlan {
        process: ArrivalProcess::Poisson { rate_per_s: config.rate_per_s },
        seed: config.seed,
        duration: Duration::from_millis(config.latency_ms),
    };
    let mut core_done = LatencyHistogram::new();
    let (mut sent, mut not_sent) = (0u64, 0u64);
    let mut failure = None;
    drive_sync(&plan, |shot| {
        if failure.is_some() || shot.send_lag_ns() > SATURATION_LAG_NS {
            not_sent += 1;
            return;
        }
        let seq = sent + 1;
        if let Err(error) = journal.append(Rec { seq, payload: [0; LATENCY_RECORD_BYTES] }) {
            failure = Some(error);
            return;
        }
        core_done.record_ns(shot.latency_ns());
        let intended_ns = shot.intended.saturating_duration_since(base).as_nanos() as u64;
        if pending.push(PendingReply { seq, intended_ns }).is_err() {
            failure = Some(journal::JournalError::WriterStopped);
            return;
        }
        sent = seq;
    })?;
    drop((journal, pending));
    writer.join()?;
    if let Some(error) = failure {
        return Err(error.into());
    }
    let durable_reply = replies.join().expect("the reply thread does not panic")?;
    std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    Ok(LatencyResult {
        policy,
        rate_per_s: config.rate_per_s,
        sent,
        not_sent_saturated: not_sent,
        core_done: core_done.summary(),
        durable_reply: durable_reply.summary(),
        durable_reply_histogram: durable_reply,
    })
}

fn spawn_reply_thread(
    mut pending: pipeline::Receiver<PendingReply>,
    durable: Arc<DurableSeq>,
    base: Instant,
    wait: pipeline::WaitStrategy,
) -> std::thread::JoinHandle<Result<LatencyHistogram, journal::JournalError>> {
    std::thread::spawn(move || {
        let mut latency = LatencyHistogram::new();
        while let Ok(reply) = pending.pop() {
            durable.wait_for(reply.seq, wait)?;
            let now_ns = base.elapsed().as_nanos() as u64;
            latency.record_ns(now_ns.saturating_sub(reply.intended_ns));
        }
        Ok(latency)
    })
}

// ---------------------------------------------------------------------------------------------
// The report: tables, files and the targets' verdicts.

/// Prints `results`' tables and writes the report folder `out` (results.json, CSV tables,
/// results.md, the durable-reply percentile plot); returns the targets missed.
pub fn write_report(results: &BenchResults, out: &Path) -> anyhow::Result<Vec<String>> {
    let (throughput, latency, verdicts) = tables(results);
    let runs = runs_table(results);
    println!("{throughput}\n{latency}\n{runs}\n{verdicts}");
    let report = ReportDir::create(out)?;
    report.write_json("results.json", results)?;
    report.write_csv("throughput.csv", &throughput)?;
    report.write_csv("latency.csv", &latency)?;
    let mut markdown = crate::report::Markdown::new();
    markdown
        .heading(1, "Journal benchmark")
        .table(&throughput)
        .table(&latency)
        .table(&runs)
        .table(&verdicts);
    report.write_markdown("results.md", markdown.as_str())?;
    let series: Vec<_> =
        results.latency.iter().map(|r| (r.policy.name(), &r.durable_reply_histogram)).collect();
    let plot = crate::plot::latency_percentile_plot("Durable-reply latency", &series);
    report.write_svg("durable-reply-percentiles.svg", &plot.to_svg())?;
    println!("report written to {}", report.path().display());
    Ok(missed_targets(results))
}

fn tables(results: &BenchResults) -> (Table, Table, Table) {
    let mut throughput = Table::new([
        "record B",
        "records",
        "records/s",
        "payload MB/s",
        "disk MB/s",
        "syncs",
        "records/sync",
    ])
    .with_title("Journal throughput, group commit (records/s counts only durable records)");
    for r in &results.throughput {
        throughput.row([
            r.record_bytes.to_string(),
            r.records.to_string(),
            format!("{:.0}", r.records_per_s),
            format!("{:.1}", r.payload_mb_per_s),
            format!("{:.1}", r.disk_mb_per_s),
            r.syncs.to_string(),
            format!("{:.0}", r.records_per_sync),
        ]);
    }
    let labels: Vec<(String, _)> =
        std::iter::once(("raw 4 KiB append+fdatasync".to_string(), &results.raw_fdatasync))
            .chain(results.latency.iter().flat_map(|r| {
                let name = r.policy.name();
                [
                    (format!("{name}: core done"), &r.core_done),
                    (format!("{name}: durable"), &r.durable_reply),
                ]
            }))
            .collect();
    let rows: Vec<(&str, _)> =
        labels.iter().map(|(name, summary)| (name.as_str(), *summary)).collect();
    let latency = latency_table(&rows).with_title(format!(
        "Latency from the intended arrival (open loop, Poisson {} msg/s, 64 B records)",
        results.config.rate_per_s
    ));
    let mut verdicts = Table::new(["target", "measured", "ratio", "met"]).with_title("Targets");
    for verdict in verdicts_of(results) {
        verdicts.row([
            verdict.target,
            verdict.measured,
            format!("{:.2}", verdict.ratio),
            verdict.met.to_string(),
        ]);
    }
    (throughput, latency, verdicts)
}

/// How many inputs each latency run sent, and how many it gave up on when saturated.
fn runs_table(results: &BenchResults) -> Table {
    let mut runs = Table::new(["policy", "rate/s", "sent", "not sent (saturated)"])
        .with_title("Latency runs (a saturated policy stops sending once 1 s behind schedule)");
    for r in &results.latency {
        runs.row([
            r.policy.name().to_string(),
            format!("{:.0}", r.rate_per_s),
            r.sent.to_string(),
            r.not_sent_saturated.to_string(),
        ]);
    }
    runs
}

struct Verdict {
    target: String,
    measured: String,
    ratio: f64,
    met: bool,
}

fn verdicts_of(results: &BenchResults) -> Vec<Verdict> {
    let mut verdicts = Vec::new();
    if let Some(r) = results.throughput.iter().find(|r| r.record_bytes == 64) {
        let ratio = r.records_per_s / TARGET_RECORDS_PER_S_AT_64B;
        verdicts.push(Verdict {
            target: ">= 1M records/s at 64 B (ratio = measured / target)".into(),
            measured: format!("{:.0} records/s", r.records_per_s),
            ratio,
            met: ratio >= 1.0,
        });
    }
    if let Some(r) = results.latency.iter().find(|r| r.policy == Policy::Group) {
        let raw_p99 = results.raw_fdatasync.p99_ns.max(1) as f64;
        let ratio = r.durable_reply.p99_ns as f64 / raw_p99;
        verdicts.push(Verdict {
            target: "group durable-reply p99 <= 2x raw fdatasync p99 (ratio = p99 / raw p99)"
                .into(),
            measured: format!(
                "{} µs vs raw {} µs",
                r.durable_reply.p99_ns / 1000,
                results.raw_fdatasync.p99_ns / 1000
            ),
            ratio,
            met: ratio <= TARGET_DURABLE_P99_OVER_RAW_SYNC && r.not_sent_saturated == 0,
        });
    }
    verdicts
}

fn missed_targets(results: &BenchResults) -> Vec<String> {
    verdicts_of(results)
        .into_iter()
        .filter(|v| !v.met)
        .map(|v| format!("{}: {} (ratio {:.2})", v.target, v.measured, v.ratio))
        .collect()
}
