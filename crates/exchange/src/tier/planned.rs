//! The `auto` layout at start-up: the host's usable CPUs, the stages' service times from a
//! short calibration run, the plan ([`super::layout::plan`]), and afterwards each thread
//! group's measured utilization beside the prediction.

use std::time::Duration;

use pipeline::metrics::{StageMetrics, instant_ns, now_ns};
use stats::open_loop::{ArrivalProcess, OpenLoopPlan, OpenLoopSteps, Pacer, drive_steps_with};

use super::layout::{
    CHAIN, GroupWait, LayoutChoice, LayoutRequest, ServiceTimes, ThreadGroup, TierLayout,
    TierStage, plan,
};
use super::service::{Tier, TierInputs, TierStart};
use super::{TierConfig, in_process_subscribers};
use crate::durability::JournalMode;
use crate::error::ExchangeError::{self, BadInput};
use crate::error::Result;
use crate::flow::{FlowConfig, FlowGenerator};

/// Mean arrival rate of the calibration run: low enough for any host to carry with one
/// thread per stage, high enough for thousands of samples per stage.
pub const CALIBRATION_RATE_PER_S: f64 = 20_000.0;
/// The calibration's arrivals come in bursts (about 100 requests within
/// [`CALIBRATION_BURST_ON_US`], then silence), so each stage handles batches with warm caches
/// as it does at the high rates where the plan matters. Requests one at a time, each after a
/// wake-up, measured the sender at 2–3× its steady-state service time (cold histograms, the
/// per-batch clock reads unshared), and the plan split a thread that had room.
pub const CALIBRATION_BURST_ON_US: u64 = 50;
/// The silence after each calibration burst.
pub const CALIBRATION_BURST_OFF_US: u64 = 4_950;
/// Length of the calibration run.
pub const CALIBRATION_DURATION: Duration = Duration::from_millis(300);
/// Seed of the calibration's arrival schedule.
const CALIBRATION_SEED: u64 = 7;
/// Threads outside the tier that need a CPU while it runs: the load generator.
const OUTSIDE_THREADS: usize = 1;

/// The critical stages' service times, as ring-fed stages and as fused ones.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Calibration {
    /// Each stage on a thread of its own, fed by a ring.
    pub service: ServiceTimes,
    /// The chain on one thread: the pre-process ring-fed, the others fused after it.
    pub fused_service: ServiceTimes,
}

/// Measures each critical stage's service time twice: with one thread per stage, and with the
/// chain fused on one thread (a fused stage's input is still in its thread's cache, so it
/// costs less than the same stage behind a ring, whose input crosses cores). Each run: one
/// worker per stage, parked and unplaced (so a small host is not reported oversubscribed),
/// journal off, for [`CALIBRATION_DURATION`] at [`CALIBRATION_RATE_PER_S`] in bursts; each
/// stage's median handler time per message is its service time (the median, not the mean: on
/// a shared host a preempted handler adds milliseconds to a few samples).
pub fn calibrate(config: &TierConfig) -> Result<Calibration> {
    let apart = CHAIN.iter().map(|&stage| vec![stage]).collect();
    Ok(Calibration {
        service: calibrate_groups(config, apart)?,
        fused_service: calibrate_groups(config, vec![CHAIN.to_vec()])?,
    })
}

/// One calibration run with the chain's stages grouped onto threads as `chain_groups` says.
fn calibrate_groups(
    config: &TierConfig,
    chain_groups: Vec<Vec<TierStage>>,
) -> Result<ServiceTimes> {
    let probe = TierConfig {
        layout: LayoutChoice::Auto,
        journal: JournalMode::OFF,
        preprocess_workers: 1,
        core_shards: 1,
        senders: 1,
        placement: false,
        // The generated flow trades the reference universe, whatever the server lists.
        master_data: None,
        ..config.clone()
    };
    let parked = |stages: Vec<TierStage>| ThreadGroup {
        stages,
        workers: 1,
        wait: GroupWait::ParkFloating,
        predicted_utilization: 0.0,
    };
    let ancillary = [TierStage::Events, TierStage::Masterdata].map(|stage| vec![stage]);
    let layout = TierLayout {
        groups: chain_groups.into_iter().chain(ancillary).map(parked).collect(),
        usable_cpus: super::layout::usable_cpus(host_cpus(), None),
        busy_elsewhere_cpus: 0.0,
        predicted_latency_ns: 0.0,
        saturated: false,
        outside_threads_spin: false,
        generator_inline: false,
    };
    let stages = calibration_run(probe, layout)?;
    let median = |stage: TierStage| -> Result<f64> {
        let metrics = stages.iter().find(|m| m.stage == stage.name());
        let failed =
            |why: &str| ExchangeError::Failed(format!("calibration: `{}` {why}", stage.name()));
        let metrics = metrics.ok_or_else(|| failed("reported no metrics"))?;
        if metrics.messages_in == 0 {
            return Err(failed("saw no message"));
        }
        Ok(metrics.service_ns.p50.max(1) as f64)
    };
    Ok(ServiceTimes {
        preprocess_ns: median(TierStage::Preprocess)?,
        core_ns: median(TierStage::Core)?,
        rprocess_ns: median(TierStage::Rprocess)?,
        sender_ns: median(TierStage::Sender)?,
    })
}

/// One calibration run: the reference order flow, in bursts at [`CALIBRATION_RATE_PER_S`] for
/// [`CALIBRATION_DURATION`], fed from this thread into a tier on `layout`; returns each
/// stage's metrics once the tier drained.
fn calibration_run(probe: TierConfig, layout: TierLayout) -> Result<Vec<StageMetrics>> {
    let subscribers = in_process_subscribers(probe.outlets, 0);
    let start = TierStart {
        layout: Some(layout),
        ..TierStart::new(probe, CALIBRATION_RATE_PER_S, subscribers)
    };
    let mut flow = FlowGenerator::new(start.config.universe, FlowConfig::default());
    let process = ArrivalProcess::Bursty {
        rate_per_s: CALIBRATION_RATE_PER_S,
        on_ns: CALIBRATION_BURST_ON_US * 1_000,
        off_ns: CALIBRATION_BURST_OFF_US * 1_000,
    };
    let plan = OpenLoopPlan { process, seed: CALIBRATION_SEED, duration: CALIBRATION_DURATION };
    let steps = OpenLoopSteps::new(&plan)?;
    // Fixes the clock's epoch before the schedule's first intended time (`instant_ns`).
    let _ = now_ns();
    let (tier, TierInputs { mut orders, control }) = Tier::start(start)?;
    let mut disconnected = false;
    drive_steps_with(steps, Pacer::default(), |shot| {
        if disconnected {
            return;
        }
        let (mut request, _) = flow.next_request();
        request.stamps.intended_ns = instant_ns(shot.intended);
        // Sent when issued: the pacer's last clock read, so publishing reads no clock.
        let issued_ns = instant_ns(shot.issued);
        let sent = orders.send_with_ingress(request, request.stamps.intended_ns);
        disconnected = sent.and_then(|()| orders.flush_at(issued_ns)).is_err();
    });
    drop((orders, control)); // the tier drains and its stages end
    let stopped = tier.stop()?;
    if disconnected {
        let stopped = "calibration: the pipeline stopped while the load was running";
        return Err(ExchangeError::Failed(stopped.into()));
    }
    Ok(stopped.stages)
}

/// The layout a run at `rate_per_s` uses, and the configuration with its worker counts:
/// `config` as it is for thread-per-stage; for `auto`, the plan for this host from
/// `config.service_ns` (calibrated now when not given).
pub fn plan_layout(config: &TierConfig, rate_per_s: f64) -> Result<(TierConfig, TierLayout)> {
    let (planned, mut layout) = plan_threads(config, rate_per_s)?;
    if let Some(inline) = config.generator_inline {
        if inline && layout.groups[0].workers != 1 {
            let reason = "generator_inline needs the pre-process on one thread (one worker)";
            return Err(BadInput(reason.into()));
        }
        layout.generator_inline = inline;
    }
    Ok((planned, layout))
}

/// [`plan_layout`] before the configuration's say on where the generator runs.
fn plan_threads(config: &TierConfig, rate_per_s: f64) -> Result<(TierConfig, TierLayout)> {
    if config.layout == LayoutChoice::ThreadPerStage {
        return Ok((config.clone(), thread_per_stage(config)));
    }
    let Calibration { service, fused_service } = match config.service_ns {
        Some(service) => {
            Calibration { service, fused_service: config.fused_service_ns.unwrap_or(service) }
        }
        None => calibrate(config)?,
    };
    let request = LayoutRequest {
        cpus: host_cpus(),
        cpu_quota_cores: pipeline::quota::current_cpu_quota_cores(),
        service,
        fused_service,
        rate_per_s,
        holds_replies: config.holds_replies(),
        outside_threads: OUTSIDE_THREADS,
        core_shards: config.core_shards,
        ordered_outputs: config.ordered_outputs,
        busy_elsewhere_cpus: busy_elsewhere_cpus(),
    };
    let layout = plan(&request);
    let planned = TierConfig {
        preprocess_workers: layout.workers_of(TierStage::Preprocess),
        senders: layout.workers_of(TierStage::Sender),
        // The layout pins what spins on a dedicated CPU; nothing else is placed.
        placement: layout.spinning_threads() > 0,
        service_ns: Some(service),
        fused_service_ns: Some(fused_service),
        ..config.clone()
    };
    Ok((planned, layout))
}

/// Clock ticks per second of /proc's CPU times (`USER_HZ`: 100 in Linux's user ABI).
const USER_HZ: f64 = 100.0;
/// How long [`busy_elsewhere_cpus`] watches the host before a run.
pub const HOST_LOAD_WINDOW: Duration = Duration::from_millis(100);

/// CPUs that other processes kept busy over [`HOST_LOAD_WINDOW`]: the busy time of all CPUs
/// (`/proc/stat`) less this process's own (`/proc/self/stat`), per unit of wall time. 0 when
/// either cannot be read (then every usable CPU counts as free).
fn busy_elsewhere_cpus() -> f64 {
    let sample = || Some((host_busy_ticks()?, own_busy_ticks()?));
    let Some((host_before, own_before)) = sample() else { return 0.0 };
    let started = std::time::Instant::now();
    std::thread::sleep(HOST_LOAD_WINDOW);
    let Some((host_after, own_after)) = sample() else { return 0.0 };
    let others =
        host_after.saturating_sub(host_before) as f64 - own_after.saturating_sub(own_before) as f64;
    (others / USER_HZ / started.elapsed().as_secs_f64()).max(0.0)
}

/// Busy clock ticks of all CPUs: the `cpu` line of /proc/stat less idle and iowait.
fn host_busy_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let fields: Vec<u64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    let (idle, iowait) = (*fields.get(3)?, *fields.get(4)?);
    Some(fields.iter().sum::<u64>() - idle - iowait)
}

/// This process's user + system clock ticks (fields 14 and 15 of /proc/self/stat).
fn own_busy_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name may hold spaces; the fields after it start past the last ')'.
    let after = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    // `after` starts at field 3 (state), so field n is at index n - 3.
    let user: u64 = fields.get(11)?.parse().ok()?;
    let system: u64 = fields.get(12)?.parse().ok()?;
    Some(user + system)
}

/// CPUs in this process's affinity mask (all online CPUs if it cannot be read).
fn host_cpus() -> usize {
    match pipeline::placement::current_affinity() {
        Ok(cpus) if !cpus.is_empty() => cpus.len(),
        _ => std::thread::available_parallelism().map_or(1, |n| n.get()),
    }
}

/// One group per stage with the configured workers (not modeled: no predictions).
fn thread_per_stage(config: &TierConfig) -> TierLayout {
    let spins = config.wait_strategy() == pipeline::WaitStrategy::BusySpin;
    let critical_wait = if spins { GroupWait::Spin } else { GroupWait::ParkDedicated };
    let workers = |stage: TierStage| match stage {
        TierStage::Preprocess => config.preprocess_workers,
        TierStage::Core => config.core_shards,
        TierStage::Sender => config.senders,
        TierStage::Rprocess | TierStage::Events | TierStage::Masterdata => 1,
    };
    let ancillary = [TierStage::Events, TierStage::Masterdata];
    let groups = CHAIN
        .iter()
        .map(|&stage| (stage, critical_wait))
        .chain(ancillary.map(|stage| (stage, GroupWait::ParkDedicated)))
        .map(|(stage, wait)| ThreadGroup {
            stages: vec![stage],
            workers: workers(stage),
            wait,
            predicted_utilization: 0.0,
        })
        .collect();
    let usable_cpus =
        super::layout::usable_cpus(host_cpus(), pipeline::quota::current_cpu_quota_cores());
    TierLayout {
        groups,
        usable_cpus,
        busy_elsewhere_cpus: 0.0,
        predicted_latency_ns: 0.0,
        saturated: false,
        outside_threads_spin: false,
        generator_inline: false,
    }
}

/// Per group: its threads' measured mean utilization, the busy time of every stage it runs
/// over the wall time of its first stage's workers.
pub fn measured_utilization(layout: &TierLayout, stages: &[StageMetrics]) -> Vec<f64> {
    let of = |stage: TierStage| stages.iter().find(|m| m.stage == stage.name());
    layout
        .groups
        .iter()
        .map(|group| {
            let busy_ns: u64 = group.stages.iter().filter_map(|&s| of(s)).map(|m| m.busy_ns).sum();
            let head = group.stages.first().and_then(|&s| of(s));
            let elapsed_ns = head.map_or(0, |m| m.busy_ns + m.idle_ns);
            if elapsed_ns == 0 { 0.0 } else { busy_ns as f64 / elapsed_ns as f64 }
        })
        .collect()
}
