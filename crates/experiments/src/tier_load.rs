//! The tier driven open-loop by its load generator: the lab's run of [`exchange::tier`]. The
//! generator is an ordinary order source of the tier ([`exchange::tier::OrderSource`]) when
//! the layout runs the entry inline, and a thread feeding the tier's inputs
//! ([`exchange::tier::TierInputs`]) otherwise; either way it issues the order flow on an
//! open-loop schedule (latency from each request's intended send time), with the scenario's
//! external events and master-data updates through the control input the tier hands it.
//!
//! [`run`] reads as its steps: the layout planned ([`exchange::tier::plan_layout`]), the tier
//! started ([`Tier::start`] or [`Tier::start_with_source`]), the load driven (`drive_load`, or
//! the inline source's turns), then the tier stops ([`Tier::stop`]: the stages drain, the
//! journals stop) and its report becomes the run's [`RunResult`].

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use exchange::ExchangeError::{self, BadInput};
use exchange::Result;
use exchange::durability::{JournalMode, JournalOptions};
use exchange::events::ExternalEvent;
use exchange::flow::{FlowConfig, FlowGenerator, UniverseConfig};
use exchange::master::{MasterData, MasterUpdate};
use exchange::msg::{InboundOrder, InstrumentId, REASON_COUNT};
use exchange::tier::{
    GroupWait, MasterReport, OrderSource, ReleasedSeqs, ShardJournalReport, ShardResult,
    SourceStart, SourceTurns, SubscriberFactory, Tier, TierConfig, TierControl, TierInputs,
    TierLayout, TierStart, TierStopped, in_process_subscribers, measured_utilization, plan_layout,
};
use pipeline::metrics::{StageMetrics, instant_ns, now_ns};
use pipeline::placement::{CpuId, PlacementPlan};
use pipeline::stage::{Emitter, Flow};
use stats::LatencyHistogram;
use stats::open_loop::{DriveReport, OpenLoopPlan, OpenLoopSteps, Pacer, Shot, drive_steps_with};

/// Arrival process of the load generator.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Arrival {
    /// Evenly spaced.
    Constant,
    /// Exponential inter-arrival times.
    #[default]
    Poisson,
    /// Poisson during `burst_on_us`, silent during `burst_off_us`, same mean rate.
    Bursty,
}

impl Arrival {
    /// The process at `rate_per_s`, with the bursty on/off periods in µs.
    pub fn process(
        self,
        rate_per_s: f64,
        burst_on_us: u64,
        burst_off_us: u64,
    ) -> stats::open_loop::ArrivalProcess {
        match self {
            Arrival::Constant => stats::open_loop::ArrivalProcess::Constant { rate_per_s },
            Arrival::Poisson => stats::open_loop::ArrivalProcess::Poisson { rate_per_s },
            Arrival::Bursty => stats::open_loop::ArrivalProcess::Bursty {
                rate_per_s,
                on_ns: burst_on_us * 1_000,
                off_ns: burst_off_us * 1_000,
            },
        }
    }

    /// The serde name.
    pub fn name(self) -> &'static str {
        match self {
            Arrival::Constant => "constant",
            Arrival::Poisson => "poisson",
            Arrival::Bursty => "bursty",
        }
    }
}

impl std::str::FromStr for Arrival {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        ops::config::parse_choice("arrival", text)
    }
}

impl std::fmt::Display for Arrival {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What an experiment composes with the tier, none of it the tier's own: the open-loop load
/// generator's settings (arrivals, order flow, the scenario's external events and master-data
/// updates) and the in-process subscribers' simulated work. [`run`] drives the tier with it;
/// `exchange serve` has no generator (its sessions are the tier's source).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoadConfig {
    /// Arrival process: constant, poisson or bursty.
    pub arrival: Arrival,
    /// Bursty arrivals: on and off periods, µs.
    pub burst_on_us: u64,
    pub burst_off_us: u64,
    /// Seed of the arrival schedule (the order flow has its own, `flow.seed`).
    pub seed: u64,
    pub flow: FlowConfig,
    /// An external event (halt/resume/band change, cycling) every this many requests; 0 = none.
    pub events_every: u64,
    /// A master-data update every this many requests; 0 = none.
    pub master_updates_every: u64,
    /// Simulated per-message publish cost of the in-process subscribers (busy work on the
    /// R-Sender's thread, ns; 0 = none).
    pub publish_work_ns: u64,
}

impl Default for LoadConfig {
    fn default() -> Self {
        LoadConfig {
            arrival: Arrival::Poisson,
            burst_on_us: 1_000,
            burst_off_us: 1_000,
            seed: 7,
            flow: FlowConfig::default(),
            events_every: 50_000,
            master_updates_every: 100_000,
            publish_work_ns: 0,
        }
    }
}

impl LoadConfig {
    /// The settings' names, for telling a tier file's misplaced load settings apart.
    pub const FIELDS: [&str; 8] = [
        "arrival",
        "burst_on_us",
        "burst_off_us",
        "seed",
        "flow",
        "events_every",
        "master_updates_every",
        "publish_work_ns",
    ];

    /// Checks every field; errors are [`BadInput`] naming the field.
    ///
    /// ```
    /// use exchange::flow::FlowConfig;
    /// use experiments::tier_load::LoadConfig;
    /// assert!(LoadConfig::default().validate().is_ok());
    /// let flow = FlowConfig { cancel_share: 0.8, replace_share: 0.5, ..FlowConfig::default() };
    /// assert!(LoadConfig { flow, ..LoadConfig::default() }.validate().is_err());
    /// ```
    pub fn validate(&self) -> Result<(), ExchangeError> {
        let flow = &self.flow;
        let shares = [
            flow.crossing_share,
            flow.cancel_share,
            flow.replace_share,
            flow.immediate_share,
            flow.invalid_share,
        ];
        if shares.iter().any(|share| !(0.0..=1.0).contains(share))
            || flow.cancel_share + flow.replace_share + flow.invalid_share > 1.0
        {
            return Err(BadInput(
                "flow shares must be in 0..=1, and cancel + replace + invalid <= 1".into(),
            ));
        }
        self.arrival_process(1.0).validate().map_err(|stats::BadInput(reason)| BadInput(reason))
    }

    /// The arrival process at `rate_per_s`.
    pub fn arrival_process(&self, rate_per_s: f64) -> stats::open_loop::ArrivalProcess {
        self.arrival.process(rate_per_s, self.burst_on_us, self.burst_off_us)
    }
}

/// What one run measured.
pub struct RunResult {
    pub rate_per_s: f64,
    pub sent: u64,
    pub elapsed_s: f64,
    /// Intended send time -> first response delivered at the outlet, every request.
    pub end_to_end: LatencyHistogram,
    /// Intended send time -> response content final (core output emitted, or pre-process
    /// reject built), every request: the critical path, not waiting for any fsync.
    pub critical_path: LatencyHistogram,
    /// Per split of [`exchange::tier::STAGE_SPLITS`]: one in [`exchange::tier::STAGE_SPLIT_SAMPLE_EVERY`] of the requests that
    /// passed the pre-process.
    pub stage_latency: Vec<LatencyHistogram>,
    /// How late the generator issued requests.
    pub send_lag: LatencyHistogram,
    pub pipeline: Vec<StageMetrics>,
    /// Where the tier's threads were planned: each placed thread's CPUs, the floating CPUs,
    /// the OS's core, and what was compromised (`notes`); pinned only when `pinned`.
    pub placement: PlacementPlan,
    /// Whether the run pinned its threads to the plan's CPUs (`TierConfig::placement`).
    pub pinned: bool,
    pub rejects: [u64; REASON_COUNT],
    pub shards: Vec<ShardResult>,
    pub delivered: u64,
    pub journal_mode: JournalMode,
    /// Per shard: what recovery found and what the journal writer did.
    pub journal: Vec<ShardJournalReport>,
    /// The master data's journal (`None` when journaling is off).
    pub master: Option<MasterReport>,
    /// The thread layout the run used.
    pub layout: TierLayout,
    /// Per group of `layout`: the measured mean utilization of its threads (busy / elapsed).
    pub layout_utilization: Vec<f64>,
}

/// The scripted external events and master-data updates injected during a run.
struct Scenario {
    events_every: u64,
    master_every: u64,
    instruments: u32,
    step: u64,
}

impl Scenario {
    fn event(&mut self, index: u64, master: &MasterData) -> Option<ExternalEvent> {
        if self.events_every == 0 || index == 0 || !index.is_multiple_of(self.events_every) {
            return None;
        }
        self.step += 1;
        let instrument = (self.step / 3 % u64::from(self.instruments)) as InstrumentId;
        let listing = master.instrument(instrument)?;
        Some(match self.step % 3 {
            0 => ExternalEvent::CircuitBreaker(instrument),
            1 => ExternalEvent::Resume(instrument),
            _ => ExternalEvent::Band { instrument, low: listing.band_low, high: listing.band_high },
        })
    }

    fn master_update(&self, index: u64, master: &MasterData) -> Option<MasterUpdate> {
        if self.master_every == 0 || index == 0 || !index.is_multiple_of(self.master_every) {
            return None;
        }
        let update = index / self.master_every;
        let client = (update % master.clients.len() as u64) as u32;
        let limits = master.client(client)?;
        // Raises the limit by a few units per update: a visible change of the master data
        // (recovery must reproduce it) that no order of the flow is near.
        Some(MasterUpdate::ClientLimit {
            client,
            enabled: limits.enabled,
            order_value_max: limits.order_value_max + update,
        })
    }
}

/// Options of one run besides the configuration.
#[derive(Clone, Debug)]
pub struct RunOptions {
    pub rate_per_s: f64,
    pub duration: Duration,
    /// Keep every shard's sequenced input (for replay).
    pub record_inputs: bool,
    /// Where the shard journals live (a temporary directory by default) and how to recover.
    pub journal: JournalOptions,
    /// Publishes, per shard, the highest input sequence whose reply was delivered (the crash
    /// test's child reports it to its client); `None` in measured runs.
    pub released: Option<Arc<ReleasedSeqs>>,
    /// Ends the load early once set (a stop signal): the run then drains and reports as at
    /// the end of its duration; `None`: the load runs its whole duration.
    pub stop: Option<Arc<AtomicBool>>,
    /// The load generator's settings ([`run`]; unused by a tier fed by a source of its own).
    pub load: LoadConfig,
}

impl RunOptions {
    /// What starting the tier takes for this run: `config` (planned) on `layout`, this run's
    /// journal options, recording and released sequences, delivering to `subscribers`.
    fn tier_start(
        &self,
        config: &TierConfig,
        layout: &TierLayout,
        subscribers: SubscriberFactory,
    ) -> TierStart {
        TierStart {
            layout: Some(layout.clone()),
            journal: self.journal.clone(),
            record_inputs: self.record_inputs,
            released: self.released.clone(),
            ..TierStart::new(config.clone(), self.rate_per_s, subscribers)
        }
    }
}

/// Builds the tier, drives it open-loop at `options.rate_per_s`, drains it and reports.
pub fn run(
    config: &TierConfig,
    options: RunOptions,
    progress: impl FnMut(u64),
) -> Result<RunResult, ExchangeError> {
    let subscribers = in_process_subscribers(config.outlets, options.load.publish_work_ns);
    run_with_subscribers(config, options, subscribers, progress)
}

/// [`run`] with the R-Senders delivering to `subscribers` (`config.outlets` per sender).
pub fn run_with_subscribers(
    config: &TierConfig,
    options: RunOptions,
    subscribers: SubscriberFactory,
    progress: impl FnMut(u64),
) -> Result<RunResult, ExchangeError> {
    config.validate()?;
    options.load.validate()?;
    let (planned, layout) = plan_layout(config, options.rate_per_s)?;
    run_with_layout(&planned, &layout, options, subscribers, progress)
}

/// [`run_with_subscribers`] with the layout already chosen (and `config` carrying its worker
/// counts).
fn run_with_layout(
    config: &TierConfig,
    layout: &TierLayout,
    options: RunOptions,
    subscribers: SubscriberFactory,
    progress: impl FnMut(u64),
) -> Result<RunResult, ExchangeError> {
    let master = config.starting_master_data();
    // Fixes the clock's epoch before the schedule's first intended time (`instant_ns`).
    let _ = now_ns();
    let start = options.tier_start(config, layout, subscribers);
    let (tier, driven) = if layout.generator_inline {
        let (run, source) = InlineRun::start(config, &options, &master)?;
        let tier = Tier::start_with_source(start, source)?;
        (tier, run.wait(progress))
    } else {
        let (tier, inputs) = Tier::start(start)?;
        let spins = layout.outside_threads_spin;
        let pacer = if spins { Pacer::spinning() } else { Pacer::default() };
        (tier, Some(drive_load(config, &options, &master, (inputs, pacer), progress)?))
    };
    let placement = tier.placement().clone();
    // The feeds are gone: every stage drains and stops, and each worker reports (or the
    // error that stopped the pipeline comes out here, before a missing report would).
    let stopped = tier.stop()?;
    let ended = "the inline load generator ended without a report";
    let (drive, disconnected) = driven.ok_or_else(|| ExchangeError::Failed(ended.into()))?;
    if disconnected {
        let stopped = "the pipeline stopped while the load was running";
        return Err(ExchangeError::Failed(stopped.into()));
    }
    let TierStopped {
        stages,
        journal,
        delivered,
        rejects,
        end_to_end,
        critical_path,
        stage_latency,
        shards,
        master,
    } = stopped;
    Ok(RunResult {
        rate_per_s: options.rate_per_s,
        sent: drive.sent,
        elapsed_s: drive.elapsed.as_secs_f64(),
        end_to_end,
        critical_path,
        stage_latency,
        send_lag: drive.send_lag,
        layout_utilization: measured_utilization(layout, &stages),
        pipeline: stages,
        placement,
        pinned: config.placement,
        rejects,
        shards,
        delivered,
        journal_mode: config.journal,
        journal,
        master,
        layout: layout.clone(),
    })
}

impl RunResult {
    /// The CPUs the threads of layout group `index` were pinned to (empty: not pinned). A
    /// group's threads are named after the stage they start with, or after the load generator
    /// when it runs inline before the first group; parked groups without a CPU of their own
    /// float on the plan's floating CPUs.
    pub fn group_cpus(&self, index: usize) -> Vec<CpuId> {
        let group = &self.layout.groups[index];
        if !self.pinned {
            return Vec::new();
        }
        if group.wait == GroupWait::ParkFloating {
            return self.placement.floating_cpus.clone();
        }
        let head = if index == 0 && self.layout.generator_inline {
            INLINE_GENERATOR_STAGE
        } else {
            group.stages[0].name()
        };
        let prefix = format!("{head}/");
        let threads = self.placement.threads.iter().filter(|t| t.label.starts_with(&prefix));
        let mut cpus: Vec<CpuId> = threads.flat_map(|t| t.cpus.iter().copied()).collect();
        cpus.sort_unstable();
        cpus.dedup();
        cpus
    }
}

/// The pipeline stage (and thread name) of the load generator run inline.
pub const INLINE_GENERATOR_STAGE: &str = "generator";

/// Shots issued per turn of the inline generator at most, so that a generator behind its
/// schedule hands the chain bounded batches.
const INLINE_SHOTS_PER_TURN_MAX: usize = 64;

/// The main thread's side of a generator run inline on the chain's first thread (an order
/// source of the tier, [`TierLayout::generator_inline`]): how far it got, and where it reports
/// when done.
struct InlineRun {
    issued: Arc<AtomicU64>,
    reported: mpsc::Receiver<(DriveReport, bool)>,
}

/// How often the main thread reports an inline generator's progress while it runs.
const INLINE_PROGRESS_INTERVAL: Duration = Duration::from_millis(50);

impl InlineRun {
    /// The run's load generator as an order source: each turn issues every shot now due
    /// (the scenario's events and updates through the control input the tier handed it),
    /// which the fused chain then handles to completion; it stops after the last shot.
    fn start(
        config: &TierConfig,
        options: &RunOptions,
        master: &MasterData,
    ) -> Result<(InlineRun, OrderSource)> {
        let (report, reported) = mpsc::channel();
        let issued = Arc::new(AtomicU64::new(0));
        let counter = issued.clone();
        let mut load = Load::new(config.universe, &options.load, master);
        let mut steps = OpenLoopSteps::new(&open_loop_plan(options))?.until(options.stop.clone());
        let source = OrderSource::new(move |started: SourceStart| {
            let mut control = started.control;
            let turns = move |out: &mut Emitter<InboundOrder>| {
                let now = Instant::now();
                let mut disconnected = false;
                for _ in 0..INLINE_SHOTS_PER_TURN_MAX {
                    let Some(shot) = steps.due(now) else { break };
                    let send = |request, intended_ns| {
                        out.emit_with_ingress(request, intended_ns);
                        false
                    };
                    disconnected |= load.issue(&shot, &mut control, send);
                }
                // Relaxed: a progress count, stored once per turn.
                counter.store(steps.sent(), Ordering::Relaxed);
                if steps.finished() || disconnected {
                    let _ = report.send((steps.report(), disconnected));
                    return Flow::Stop;
                }
                Flow::Continue
            };
            Ok(Box::new(turns) as SourceTurns)
        });
        Ok((InlineRun { issued, reported }, source.named(INLINE_GENERATOR_STAGE)))
    }

    /// Reports the generator's progress until it is done: `(report, whether a feed was
    /// gone)`, or `None` when the generator ended without one (the pipeline aborted; the
    /// tier's `stop` says why).
    fn wait(self, mut progress: impl FnMut(u64)) -> Option<(DriveReport, bool)> {
        loop {
            match self.reported.recv_timeout(INLINE_PROGRESS_INTERVAL) {
                Ok(report) => return Some(report),
                // Relaxed: a progress count.
                Err(RecvTimeoutError::Timeout) => progress(self.issued.load(Ordering::Relaxed)),
                Err(RecvTimeoutError::Disconnected) => return None,
            }
        }
    }
}

/// What a run's load generator issues: the order flow and the scenario's events and
/// master-data updates, wherever the generator runs (its own thread, or inline on the chain's
/// first thread).
struct Load {
    generator: FlowGenerator,
    scenario: Scenario,
    master: MasterData,
}

impl Load {
    fn new(universe: UniverseConfig, load: &LoadConfig, master: &MasterData) -> Load {
        Load {
            generator: FlowGenerator::new(universe, load.flow),
            scenario: Scenario {
                events_every: load.events_every,
                master_every: load.master_updates_every,
                instruments: universe.instruments,
                step: 0,
            },
            master: master.clone(),
        }
    }

    /// Issues `shot`: its event and master-data update, if due, on their feeds, then its
    /// request through `send(request, intended_ns)`. Returns whether a feed was gone.
    fn issue(
        &mut self,
        shot: &Shot,
        control: &mut TierControl,
        send: impl FnOnce(InboundOrder, u64) -> bool,
    ) -> bool {
        let mut disconnected = false;
        let (mut request, _) = self.generator.next_request();
        // The schedule's own instant, on the stages' clock: no clock read per request.
        let intended_ns = instant_ns(shot.intended);
        request.stamps.intended_ns = intended_ns;
        if let Some(event) = self.scenario.event(shot.index, &self.master) {
            disconnected |= control.event(event).is_err();
        }
        if let Some(update) = self.scenario.master_update(shot.index, &self.master) {
            disconnected |= control.master_update(update).is_err();
        }
        disconnected | send(request, intended_ns)
    }
}

/// Drives the open-loop load into the feeds, with the scenario's events and master-data
/// updates, paced by `pacer`; returns the generator's report and whether the pipeline
/// stopped taking input.
fn drive_load(
    config: &TierConfig,
    options: &RunOptions,
    master: &MasterData,
    (inputs, pacer): (TierInputs, Pacer),
    mut progress: impl FnMut(u64),
) -> Result<(DriveReport, bool)> {
    let TierInputs { orders: mut intake, mut control } = inputs;
    let mut load = Load::new(config.universe, &options.load, master);
    let steps = OpenLoopSteps::new(&open_loop_plan(options))?.until(options.stop.clone());
    let mut disconnected = false;
    let drive = drive_steps_with(steps, pacer, |shot| {
        if disconnected {
            return;
        }
        // Sent when issued: the pacer's last clock read, so publishing reads no clock.
        let issued_ns = instant_ns(shot.issued);
        let send = |request, intended_ns| {
            intake
                .send_with_ingress(request, intended_ns)
                .and_then(|()| intake.flush_at(issued_ns))
                .is_err()
        };
        disconnected |= load.issue(&shot, &mut control, send);
        if shot.index % 1024 == 0 {
            progress(shot.index);
        }
    });
    Ok((drive, disconnected))
}

fn open_loop_plan(options: &RunOptions) -> OpenLoopPlan {
    OpenLoopPlan {
        process: options.load.arrival_process(options.rate_per_s),
        seed: options.load.seed,
        duration: options.duration,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_load_settings_parse_from_toml_and_default_to_poisson() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("load.toml");
        std::fs::write(&file, "arrival = \"bursty\"\n").unwrap();
        let load: LoadConfig = ops::config::load_toml(Some(&file)).unwrap();
        assert_eq!(load.arrival, Arrival::Bursty);
        let load = serde_json::to_value(LoadConfig::default()).unwrap();
        assert_eq!(load["arrival"], "poisson");
        for arrival in [Arrival::Constant, Arrival::Poisson, Arrival::Bursty] {
            assert_eq!(serde_json::to_value(arrival).unwrap(), arrival.name());
            assert_eq!(arrival.name().parse::<Arrival>(), Ok(arrival));
        }
        let flow = FlowConfig { cancel_share: 0.8, replace_share: 0.5, ..FlowConfig::default() };
        assert!(LoadConfig { flow, ..LoadConfig::default() }.validate().is_err());
    }
}
