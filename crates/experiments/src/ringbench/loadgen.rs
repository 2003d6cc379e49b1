//! `leantier bench load-gen`: how fast the open-loop generator ([`stats::open_loop::drive_sync`])
//! keeps its schedule on one thread, alone, into two sinks:
//! - **null**: the request is dropped (the generator's own cost: schedule, clock, lag record);
//! - **ring**: each request is pushed into a `pipeline` ring (one publish per request, as the
//!   tier's gateway feed does) that another thread drains, waiting with the default adaptive
//!   strategy.
//!
//! For each rate it reports whether the generator kept up (the run ended within
//! [`KEPT_UP_SLACK`] of its planned duration, so its backlog never grew beyond that), its
//! schedule lag percentiles (issue time − intended time), and the CPU its thread used
//! (`CLOCK_THREAD_CPUTIME_ID`, the harness's clock) over wall time: the cost of waiting at low rates.

use std::time::{Duration, Instant};

use serde::Serialize;
use stats::LatencySummary;
use stats::open_loop::{ArrivalProcess, OpenLoopPlan, drive_sync};

use super::RingBenchError;
use super::harness::thread_cpu_time;

/// A run kept up when it ended at most this fraction of its duration late.
pub const KEPT_UP_SLACK: f64 = 0.01;
/// Slots of the ring sink (the tier's default ring size).
const RING_SINK_CAPACITY_SLOTS: usize = 4096;
/// Most messages the ring sink's drain thread reads per batch.
const RING_SINK_READ_BATCH_MAX: usize = 256;

/// Where the generated requests go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Sink {
    Null,
    Ring,
}

impl Sink {
    pub const ALL: [Sink; 2] = [Sink::Null, Sink::Ring];

    pub fn name(self) -> &'static str {
        match self {
            Sink::Null => "null",
            Sink::Ring => "ring",
        }
    }
}

/// What to measure.
#[derive(Clone, Debug)]
pub struct LoadGenSettings {
    /// Target rates, requests per second, each measured for `step`.
    pub rates_per_s: Vec<f64>,
    pub step: Duration,
    /// Poisson arrivals when false (the tier's default), evenly spaced when true.
    pub constant: bool,
    pub sinks: Vec<Sink>,
}

impl LoadGenSettings {
    pub fn validate(&self) -> Result<(), RingBenchError> {
        let bad_rate = self.rates_per_s.iter().find(|rate| !(**rate > 0.0 && rate.is_finite()));
        if let Some(rate) = bad_rate {
            return Err(RingBenchError::BadInput(format!("rate {rate} must be positive")));
        }
        if self.rates_per_s.is_empty() || self.sinks.is_empty() || self.step.is_zero() {
            return Err(RingBenchError::BadInput(
                "need at least one rate, one sink and a non-zero step".into(),
            ));
        }
        Ok(())
    }

    fn process(&self, rate_per_s: f64) -> ArrivalProcess {
        if self.constant {
            ArrivalProcess::Constant { rate_per_s }
        } else {
            ArrivalProcess::Poisson { rate_per_s }
        }
    }
}

/// One (sink, rate) measurement.
#[derive(Clone, Debug, Serialize)]
pub struct LoadGenStep {
    pub sink: &'static str,
    pub target_rate_per_s: f64,
    pub sent: u64,
    pub achieved_rate_per_s: f64,
    pub kept_up: bool,
    /// Issue time − intended time.
    pub send_lag_ns: LatencySummary,
    /// The generator thread's CPU time over wall time.
    pub cpu_fraction: f64,
    /// The generator thread's CPU time per request.
    pub cpu_ns_per_request: f64,
    pub sleeps: u64,
    pub spin_window_ns: u64,
}

/// Every step, and per sink the highest rate that kept up.
#[derive(Clone, Debug, Serialize)]
pub struct LoadGenReport {
    pub steps: Vec<LoadGenStep>,
    pub highest_kept_up: Vec<(&'static str, Option<f64>)>,
}

/// Runs every (sink, rate) step in order, on the calling thread.
pub fn run(settings: &LoadGenSettings) -> anyhow::Result<LoadGenReport> {
    settings.validate()?;
    let mut steps = Vec::new();
    for &sink in &settings.sinks {
        for &rate_per_s in &settings.rates_per_s {
            let plan = OpenLoopPlan {
                process: settings.process(rate_per_s),
                seed: 1,
                duration: settings.step,
            };
            steps.push(measure(sink, &plan)?);
        }
    }
    let highest_kept_up = settings
        .sinks
        .iter()
        .map(|sink| {
            let kept_up = steps.iter().filter(|s| s.sink == sink.name() && s.kept_up);
            (sink.name(), kept_up.map(|s| s.target_rate_per_s).reduce(f64::max))
        })
        .collect();
    Ok(LoadGenReport { steps, highest_kept_up })
}

/// Drives `plan` into `sink` and measures the generator thread.
pub fn measure(sink: Sink, plan: &OpenLoopPlan) -> anyhow::Result<LoadGenStep> {
    let cpu_before = thread_cpu_time();
    let wall = Instant::now();
    let report = match sink {
        Sink::Null => {
            let mut checksum = 0u64;
            let report = drive_sync(plan, |shot| checksum = checksum.wrapping_add(shot.index))?;
            std::hint::black_box(checksum);
            report
        }
        Sink::Ring => drive_into_ring(plan)?,
    };
    let cpu = thread_cpu_time().saturating_sub(cpu_before);
    let wall = wall.elapsed();
    let late_limit = plan.duration.mul_f64(1.0 + KEPT_UP_SLACK);
    Ok(LoadGenStep {
        sink: sink.name(),
        target_rate_per_s: plan.process.rate_per_s(),
        sent: report.sent,
        achieved_rate_per_s: report.achieved_rate_per_s(),
        kept_up: report.elapsed <= late_limit,
        send_lag_ns: report.send_lag.summary(),
        cpu_fraction: cpu.as_secs_f64() / wall.as_secs_f64(),
        cpu_ns_per_request: cpu.as_nanos() as f64 / report.sent.max(1) as f64,
        sleeps: report.sleeps,
        spin_window_ns: u64::try_from(report.spin_window.as_nanos()).unwrap_or(u64::MAX),
    })
}

/// Pushes each request's index into a ring that another thread drains; fails unless the
/// drain received every request exactly once, in order.
fn drive_into_ring(plan: &OpenLoopPlan) -> anyhow::Result<stats::open_loop::DriveReport> {
    let config = pipeline::RingConfig {
        capacity_slots: RING_SINK_CAPACITY_SLOTS,
        batch_slots_max: RING_SINK_READ_BATCH_MAX,
        wait: pipeline::WaitStrategy::default(),
    };
    let (mut tx, mut rx) = pipeline::connector::<u64>(pipeline::ConnectorKind::LockFree, &config)?;
    let drain = std::thread::spawn(move || {
        let (mut received, mut in_order) = (0u64, true);
        while rx
            .wait_read_batch(RING_SINK_READ_BATCH_MAX, |index| {
                in_order &= *index == received;
                received += 1;
            })
            .is_ok()
        {}
        (received, in_order)
    });
    let mut disconnected = false;
    let report = drive_sync(plan, |shot| disconnected |= tx.push(shot.index).is_err())?;
    drop(tx);
    let (received, in_order) = drain.join().map_err(|_| anyhow::anyhow!("drain panicked"))?;
    anyhow::ensure!(!disconnected, "the drain thread stopped early");
    anyhow::ensure!(
        received == report.sent && in_order,
        "ring sink received {received} of {} requests (in order: {in_order})",
        report.sent
    );
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// At a low rate the generator sleeps between requests instead of spinning through the
    /// gaps, and every request reaches the ring's drain thread.
    #[test]
    fn at_a_low_rate_every_request_arrives_and_the_generator_mostly_sleeps() {
        let settings = LoadGenSettings {
            rates_per_s: vec![1_000.0],
            step: Duration::from_millis(300),
            constant: true,
            sinks: Sink::ALL.to_vec(),
        };
        let report = run(&settings).unwrap();
        assert_eq!(report.steps.len(), 2);
        for step in &report.steps {
            // Constant spacing: exactly one request per ms of the plan.
            assert_eq!(step.sent, 300, "{}", step.sink);
            assert!(step.sleeps >= 150, "{}: slept {} times", step.sink, step.sleeps);
            // A generator spinning through the gaps would use its whole share of a core.
            assert!(step.cpu_fraction < 0.3, "{}: {:.3} of a core", step.sink, step.cpu_fraction);
        }
    }

    #[test]
    fn bad_settings_are_refused_with_a_reason() {
        let settings = LoadGenSettings {
            rates_per_s: vec![0.0],
            step: Duration::from_millis(1),
            constant: false,
            sinks: vec![Sink::Null],
        };
        let RingBenchError::BadInput(reason) = settings.validate().unwrap_err();
        assert!(reason.contains("rate 0"), "{reason}");
        let no_sinks = LoadGenSettings { rates_per_s: vec![1.0], sinks: vec![], ..settings };
        assert!(no_sinks.validate().is_err());
    }
}
