//! Running the pipeline on the `pipeline` crate's stage runtime:
//! generator → decoder → converter → {serializer, feeder}.
//!
//! Each node is a stage with the configured worker count; the converter is connected to both
//! the serializer and the feeder, so the runtime copies every converted ticket to both
//! (fan-out). Rings are bounded, so an overloaded node pushes back on its upstream instead of
//! dropping tickets; at an unreachable rate the generator falls behind its schedule and the run
//! reports the rate it achieved.
//!
//! Every node but the generator is spawned with its maximum worker count and can be resized
//! while running (online mode, `crate::online`): the run loop measures the arrival rate and
//! utilizations every control interval, asks the controller, and resizes; deactivated workers
//! drain what they hold, so no ticket is lost or duplicated (`pipeline::active`).
//!
//! Workers keep their counts locally and publish them when they finish (no shared counter on
//! the hot path). A worker finishes by flushing its file, batch or reject log; an I/O error on
//! the hot path panics the worker, which the runtime turns into a failed run naming the stage.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use pipeline::stage::{
    Emitter, Flow, PipelineBuilder, Route, RunningPipeline, StageHandle, StageSpec,
};
use planner::model::NetworkSpec;
use stats::open_loop::{ArrivalProcess, Schedule};

use crate::convert::{Converted, convert};
use crate::error::{CdrError, Result, io_failed};
use crate::feed::{DbTarget, Feeder};
use crate::online::{Controller, TimelinePoint};
use crate::serialize::Serializer;
use crate::ticket::{RawTicket, Ticket, TicketGenerator, decode, sequence_of};

/// What the run was asked to carry, which the prediction is for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Offered {
    /// The generator ran flat out: the prediction is the maximum throughput.
    FlatOut,
    /// Poisson arrivals at this mean rate (tickets per second).
    Paced(f64),
}

/// Tickets the generator emits per call when running flat out or catching up.
pub const GENERATOR_BURST_TICKETS: u64 = 256;
/// Beyond this wait for the next scheduled ticket the generator sleeps instead of spinning.
const GENERATOR_SLEEP_ABOVE_NS: u64 = 200_000;

/// The node names, as in the model and config files.
pub const NODE_NAMES: [&str; 5] = ["generator", "decoder", "converter", "serializer", "feeder"];

/// Worker threads per node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct NodeThreads {
    pub decoder: usize,
    pub converter: usize,
    pub serializer: usize,
    pub feeder: usize,
}

impl NodeThreads {
    /// The counts in [`NODE_NAMES`] order after the generator.
    pub fn as_array(&self) -> [usize; 4] {
        [self.decoder, self.converter, self.serializer, self.feeder]
    }
}

/// One step of a rate profile: Poisson arrivals at `rate_per_s` for `duration`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RateStep {
    pub rate_per_s: f64,
    pub duration: Duration,
}

/// How the generator produces tickets.
#[derive(Clone, Debug, PartialEq)]
pub enum Arrivals {
    /// Flat out for this long (maximum throughput).
    FlatOut(Duration),
    /// Poisson arrivals, one rate per step, steps back to back.
    Steps(Vec<RateStep>),
}

impl Arrivals {
    /// Poisson arrivals at one rate.
    pub fn poisson(rate_per_s: f64, duration: Duration) -> Arrivals {
        Arrivals::Steps(vec![RateStep { rate_per_s, duration }])
    }

    /// How long the generator runs.
    pub fn duration(&self) -> Duration {
        match self {
            Arrivals::FlatOut(duration) => *duration,
            Arrivals::Steps(steps) => steps.iter().map(|step| step.duration).sum(),
        }
    }

    /// What the generator is asked to carry: flat out, or the steps' time-weighted mean rate.
    pub fn offered(&self) -> Offered {
        match self {
            Arrivals::FlatOut(_) => Offered::FlatOut,
            Arrivals::Steps(steps) => {
                let tickets: f64 =
                    steps.iter().map(|step| step.rate_per_s * step.duration.as_secs_f64()).sum();
                Offered::Paced(tickets / self.duration().as_secs_f64())
            }
        }
    }

    fn schedule(&self, seed: u64) -> Result<Option<StepSchedule>> {
        match self {
            Arrivals::FlatOut(_) => Ok(None),
            Arrivals::Steps(steps) => Ok(Some(StepSchedule::new(steps.clone(), seed)?)),
        }
    }
}

/// Intended arrival offsets (ns since the start) over the steps of a rate profile; each step
/// is its own seeded Poisson schedule shifted to the step's start.
struct StepSchedule {
    steps: std::vec::IntoIter<RateStep>,
    seed: u64,
    current: Schedule,
    start_ns: u64,
    end_ns: u64,
}

impl StepSchedule {
    fn new(steps: Vec<RateStep>, seed: u64) -> Result<StepSchedule> {
        for step in &steps {
            ArrivalProcess::Poisson { rate_per_s: step.rate_per_s }.validate()?;
        }
        let mut steps = steps.into_iter();
        let empty = || CdrError::BadInput("a rate profile needs a step".into());
        let first = steps.next().ok_or_else(empty)?;
        let current =
            Schedule::new(ArrivalProcess::Poisson { rate_per_s: first.rate_per_s }, seed)?;
        Ok(StepSchedule { steps, seed, current, start_ns: 0, end_ns: duration_ns(first.duration) })
    }
}

impl Iterator for StepSchedule {
    type Item = u64;

    fn next(&mut self) -> Option<u64> {
        loop {
            let offset_ns = self.start_ns + self.current.next()?;
            if offset_ns < self.end_ns {
                return Some(offset_ns);
            }
            let step = self.steps.next()?;
            self.seed += 1;
            let process = ArrivalProcess::Poisson { rate_per_s: step.rate_per_s };
            self.current = Schedule::new(process, self.seed).ok()?;
            self.start_ns = self.end_ns;
            self.end_ns += duration_ns(step.duration);
        }
    }
}

fn duration_ns(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// Online mode: re-plan and resize while running (see `crate::online`).
#[derive(Clone, Debug)]
pub struct OnlineSettings {
    /// The planner model the controller re-plans with (from the config file).
    pub model: NetworkSpec,
    /// The rate the initial threads were planned for.
    pub planned_rate_per_s: f64,
    /// Workers spawned per node: the most the controller can activate.
    pub max_threads: NodeThreads,
    pub control_interval: Duration,
    /// Re-plan when the arrival rate moved more than this fraction from the planned rate.
    pub replan_rate_change_min: f64,
}

/// One run's settings.
#[derive(Clone, Debug)]
pub struct RunSettings {
    /// Threads per node at the start (all of the run unless online).
    pub threads: NodeThreads,
    pub arrivals: Arrivals,
    /// `Some`: a controller re-plans and resizes the nodes during the run.
    pub online: Option<OnlineSettings>,
    pub out_dir: PathBuf,
    pub database: DbTarget,
    /// Serializer fsync policy: one fdatasync per this many records (0 = only at the end).
    pub fsync_every_records: u64,
    /// Rows per feeder transaction.
    pub feed_batch_rows: usize,
    /// Every n-th generated ticket is malformed (0 = none).
    pub malformed_every: u64,
    pub seed: u64,
}

/// Counts published by workers as they finish, and cold-path errors.
#[derive(Default)]
struct Totals {
    /// Tickets emitted by the generator.
    generated: AtomicU64,
    /// Tickets whose arrival time has come (flat out: = generated); read live by the
    /// online controller.
    offered: AtomicU64,
    rejected: AtomicU64,
    serialized: AtomicU64,
    inserted: AtomicU64,
    errors: Mutex<Vec<String>>,
}

impl Totals {
    fn add(counter: &AtomicU64, count: u64) {
        // Relaxed: final totals are read after every worker thread has been joined (the join
        // synchronizes with each worker's last write); the online controller's live reads of
        // `generated` need only some recent value of the count itself, no other data.
        counter.fetch_add(count, Ordering::Relaxed);
    }

    fn error(&self, message: String) {
        self.errors.lock().unwrap_or_else(PoisonError::into_inner).push(message);
    }
}

/// What a run did.
#[derive(Debug, Clone)]
pub struct RunSummary {
    pub generated: u64,
    pub rejected: u64,
    pub serialized: u64,
    pub inserted: u64,
    pub wall_s: f64,
    /// CPU time of the whole process during the run (all threads).
    pub cpu_s: f64,
    /// Per stage, in pipeline order: name, workers, messages in, busy fraction.
    pub stages: Vec<StageSummary>,
    /// Online runs: one point per control interval (empty otherwise).
    pub timeline: Vec<TimelinePoint>,
}

/// One stage's counts from the runtime's metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct StageSummary {
    pub name: String,
    pub workers: usize,
    pub messages_in: u64,
    pub messages_out: u64,
    pub utilization: f64,
}

struct DecoderWorker {
    rejects: BufWriter<File>,
    rejected: u64,
    totals: Arc<Totals>,
}

impl DecoderWorker {
    fn handle(&mut self, raw: &RawTicket, emitter: &mut Emitter<Ticket>) {
        match decode(raw) {
            Ok(ticket) => emitter.emit(ticket),
            Err(reason) => {
                self.rejected += 1;
                let mut line = [0_u8; 2 * crate::ticket::TICKET_BYTES];
                for (pair, byte) in line.chunks_exact_mut(2).zip(&raw.bytes) {
                    const HEX: &[u8; 16] = b"0123456789abcdef";
                    pair[0] = HEX[usize::from(byte >> 4)];
                    pair[1] = HEX[usize::from(byte & 0xf)];
                }
                let written = write!(self.rejects, "{} {} ", sequence_of(raw), reason.code())
                    .and_then(|()| self.rejects.write_all(&line))
                    .and_then(|()| self.rejects.write_all(b"\n"));
                if let Err(error) = written {
                    panic!("cannot write the reject file: {error}");
                }
            }
        }
    }
}

impl Drop for DecoderWorker {
    fn drop(&mut self) {
        Totals::add(&self.totals.rejected, self.rejected);
        if let Err(error) = self.rejects.flush().and_then(|()| self.rejects.get_ref().sync_data()) {
            self.totals.error(format!("reject file: {error}"));
        }
    }
}

struct SerializerWorker {
    serializer: Serializer,
    totals: Arc<Totals>,
}

impl Drop for SerializerWorker {
    fn drop(&mut self) {
        Totals::add(&self.totals.serialized, self.serializer.records_written());
        if let Err(error) = self.serializer.sync() {
            let path = self.serializer.path().display();
            self.totals.error(format!("serializer {path}: {error}"));
        }
    }
}

struct FeederWorker {
    feeder: Feeder,
    totals: Arc<Totals>,
}

impl Drop for FeederWorker {
    fn drop(&mut self) {
        if let Err(error) = self.feeder.flush() {
            self.totals.error(format!("feeder final batch: {}", ops::error_chain(&error)));
        }
        Totals::add(&self.totals.inserted, self.feeder.rows_inserted());
    }
}

/// The generator's handler: Poisson arrivals at `rate_per_s`, or flat out.
fn generator_handler(
    settings: &RunSettings,
    totals: Arc<Totals>,
) -> Result<impl FnMut(&mut Emitter<RawTicket>) -> Flow + Send + 'static> {
    let mut generator = TicketGenerator::new(settings.seed, settings.malformed_every);
    let mut schedule = settings.arrivals.schedule(settings.seed)?;
    let mut next_due_ns = schedule.as_mut().and_then(Iterator::next);
    let duration_ns = duration_ns(settings.arrivals.duration());
    let mut start: Option<Instant> = None;
    // Arrivals that are due but not yet emitted (the pipeline pushed back): they wait "at the
    // door" and are emitted as soon as the rings have room.
    let mut owed = 0_u64;
    Ok(move |emitter: &mut Emitter<RawTicket>| {
        let now_ns = start.get_or_insert_with(Instant::now).elapsed().as_nanos() as u64;
        if now_ns >= duration_ns {
            return Flow::Stop;
        }
        let burst = match &mut schedule {
            None => GENERATOR_BURST_TICKETS,
            Some(schedule) => {
                let mut arrived = 0;
                while next_due_ns.is_some_and(|due_ns| due_ns <= now_ns) {
                    arrived += 1;
                    next_due_ns = schedule.next();
                }
                // Offered load, published per call: the online controller plans for what
                // arrives, not for what a pushed-back pipeline managed to take.
                Totals::add(&totals.offered, arrived);
                owed += arrived;
                owed.min(GENERATOR_BURST_TICKETS)
            }
        };
        for _ in 0..burst {
            emitter.emit(generator.next_ticket());
        }
        Totals::add(&totals.generated, burst);
        if schedule.is_none() {
            Totals::add(&totals.offered, burst);
        } else {
            owed -= burst;
            // Nothing owed: sleep until the next arrival (or the end) when it is far enough.
            let next_ns = next_due_ns.unwrap_or(duration_ns).min(duration_ns);
            if owed == 0 && next_ns.saturating_sub(now_ns) > GENERATOR_SLEEP_ABOVE_NS {
                std::thread::sleep(Duration::from_nanos(next_ns - now_ns));
            }
        }
        Flow::Continue
    })
}

fn stage_spec(workers: usize, max_workers: usize) -> StageSpec {
    // Ancillary with the adaptive wait: the host may have fewer cores than workers, so
    // workers must park rather than spin (inactive ones park for the whole time they idle).
    StageSpec::ancillary(workers).with_max_workers(max_workers)
}

/// Workers spawned per node: the online maximum, never below the starting count.
fn spawned_threads(settings: &RunSettings) -> NodeThreads {
    let start = settings.threads;
    let Some(online) = &settings.online else { return start };
    let max = online.max_threads;
    NodeThreads {
        decoder: max.decoder.max(start.decoder),
        converter: max.converter.max(start.converter),
        serializer: max.serializer.max(start.serializer),
        feeder: max.feeder.max(start.feeder),
    }
}

/// The stages the controller resizes, in model order after the generator.
struct Resizable {
    decoder: StageHandle<RawTicket, Ticket>,
    converter: StageHandle<Ticket, Converted>,
    serializer: StageHandle<Converted, ()>,
    feeder: StageHandle<Converted, ()>,
}

impl Resizable {
    fn resize(&self, running: &RunningPipeline, threads: [usize; 4]) -> Result<()> {
        let [decoder, converter, serializer, feeder] = threads;
        running.resize(self.decoder, decoder)?;
        running.resize(self.converter, converter)?;
        running.resize(self.serializer, serializer)?;
        running.resize(self.feeder, feeder)?;
        Ok(())
    }
}

/// Runs the pipeline for the arrivals' duration and drains it.
pub fn run_pipeline(settings: &RunSettings) -> Result<RunSummary> {
    let out_dir = settings.out_dir.display();
    std::fs::create_dir_all(&settings.out_dir)
        .map_err(io_failed(format!("creating the output directory {out_dir}")))?;
    settings.database.prepare()?;
    let totals = Arc::new(Totals::default());
    let max = spawned_threads(settings);
    let (builder, resizable) = build_pipeline(settings, max, &totals)?;

    let started = Instant::now();
    let cpu_start_ns = planner::measure::process_cpu_time_ns();
    let running = builder.start()?;
    let timeline = match &settings.online {
        Some(online) => {
            let arrivals = || totals.offered.load(Ordering::Relaxed);
            control(&running, &resizable, settings, online, max, &arrivals, started)
        }
        None => Ok(Vec::new()),
    };
    let report = running.wait()?;
    let timeline = timeline?;
    let cpu_s = (planner::measure::process_cpu_time_ns() - cpu_start_ns) as f64 * 1e-9;
    let wall_s = started.elapsed().as_secs_f64();
    summarize(&totals, &report, Measured { wall_s, cpu_s, timeline })
}

/// The generator → decoder → converter → serializer + feeder graph, each stage's workers
/// created up front (their files and database connections), and the handles of the stages
/// the online controller resizes.
fn build_pipeline(
    settings: &RunSettings,
    max: NodeThreads,
    totals: &Arc<Totals>,
) -> Result<(PipelineBuilder, Resizable)> {
    let threads = settings.threads;
    let mut builder = PipelineBuilder::new().pin_threads(false);
    let mut generate = Some(generator_handler(settings, totals.clone())?);
    let generator = builder.source("generator", StageSpec::ancillary(1), move |_| {
        generate.take().expect("the generator has one worker")
    });
    let mut decoders = decoder_workers(settings, max.decoder, totals)?;
    let decoder =
        builder.stage("decoder", stage_spec(threads.decoder, max.decoder), move |worker| {
            let mut state = decoders[worker].take().expect("one handler per worker");
            move |raw: &RawTicket, emitter: &mut Emitter<Ticket>| state.handle(raw, emitter)
        });
    let converter_spec = stage_spec(threads.converter, max.converter);
    let converter = builder.stage("converter", converter_spec, |_| {
        |ticket: &Ticket, emitter: &mut Emitter<Converted>| emitter.emit(convert(ticket))
    });
    let serializer_spec = stage_spec(threads.serializer, max.serializer);
    let mut serializers = serializer_workers(settings, serializer_spec.spawned_workers(), totals)?;
    let serializer = builder.sink("serializer", serializer_spec, move |worker| {
        let mut state = serializers[worker].take().expect("one handler per worker");
        move |converted: &Converted| {
            if let Err(error) = state.serializer.write(converted) {
                panic!("serializer {}: {error}", state.serializer.path().display());
            }
        }
    });
    let feeder_spec = stage_spec(threads.feeder, max.feeder);
    let mut feeders = feeder_workers(settings, feeder_spec.spawned_workers(), totals)?;
    let feeder = builder.sink("feeder", feeder_spec, move |worker| {
        let mut state = feeders[worker].take().expect("one handler per worker");
        move |converted: &Converted| {
            if let Err(error) = state.feeder.insert(&converted.row) {
                panic!("feeder insert: {}", ops::error_chain(&error));
            }
        }
    });
    builder.connect(generator, decoder, Route::RoundRobin);
    builder.connect(decoder, converter, Route::RoundRobin);
    builder.connect(converter, serializer, Route::RoundRobin);
    builder.connect(converter, feeder, Route::RoundRobin);
    Ok((builder, Resizable { decoder, converter, serializer, feeder }))
}

/// One decoder state per worker, each with its own reject file.
fn decoder_workers(
    settings: &RunSettings,
    workers: usize,
    totals: &Arc<Totals>,
) -> Result<Vec<Option<DecoderWorker>>> {
    let mut decoders = Vec::new();
    for worker in 0..workers {
        let path = settings.out_dir.join(format!("rejects-{worker}.log"));
        let created = File::create(&path);
        let created = created.map_err(io_failed(format!("creating {}", path.display())))?;
        let rejects = BufWriter::new(created);
        decoders.push(Some(DecoderWorker { rejects, rejected: 0, totals: totals.clone() }));
    }
    Ok(decoders)
}

/// One serializer per worker, each writing its own file in the output directory.
fn serializer_workers(
    settings: &RunSettings,
    workers: usize,
    totals: &Arc<Totals>,
) -> Result<Vec<Option<SerializerWorker>>> {
    let out_dir = settings.out_dir.display();
    let mut serializers = Vec::new();
    for worker in 0..workers {
        let serializer =
            Serializer::create(&settings.out_dir, worker, settings.fsync_every_records)
                .map_err(io_failed(format!("creating a serializer in {out_dir}")))?;
        serializers.push(Some(SerializerWorker { serializer, totals: totals.clone() }));
    }
    Ok(serializers)
}

/// One feeder per worker, each on its own database connection.
fn feeder_workers(
    settings: &RunSettings,
    workers: usize,
    totals: &Arc<Totals>,
) -> Result<Vec<Option<FeederWorker>>> {
    let mut feeders = Vec::new();
    for _ in 0..workers {
        let feeder = Feeder::new(settings.database.connect()?, settings.feed_batch_rows);
        feeders.push(Some(FeederWorker { feeder, totals: totals.clone() }));
    }
    Ok(feeders)
}

/// What the run measured beside the pipeline's own report.
struct Measured {
    wall_s: f64,
    cpu_s: f64,
    timeline: Vec<TimelinePoint>,
}

/// The run's summary from its counters and the pipeline's per-stage report, or the errors
/// its workers collected.
fn summarize(
    totals: &Totals,
    report: &pipeline::stage::PipelineReport,
    measured: Measured,
) -> Result<RunSummary> {
    let errors = std::mem::take(&mut *totals.errors.lock().unwrap_or_else(PoisonError::into_inner));
    if !errors.is_empty() {
        let why = format!("the run finished with errors: {}", errors.join("; "));
        return Err(CdrError::Failed(why));
    }
    let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
    let stages = report.stages.iter().map(|stage| StageSummary {
        name: stage.stage.clone(),
        workers: stage.workers,
        messages_in: stage.messages_in,
        messages_out: stage.messages_out,
        utilization: stage.utilization,
    });
    Ok(RunSummary {
        generated: load(&totals.generated),
        rejected: load(&totals.rejected),
        serialized: load(&totals.serialized),
        inserted: load(&totals.inserted),
        wall_s: measured.wall_s,
        cpu_s: measured.cpu_s,
        stages: stages.collect(),
        timeline: measured.timeline,
    })
}

/// The online controller, starting from the run's thread counts with `max` as the bound; a
/// model whose nodes are not the pipeline's, in its order, is bad input.
fn online_controller(
    settings: &RunSettings,
    online: &OnlineSettings,
    max: NodeThreads,
) -> Result<Controller> {
    let to_u32 = |threads: NodeThreads| {
        let [d, c, s, f] = threads.as_array().map(|n| n as u32);
        vec![1, d, c, s, f]
    };
    let controller = Controller::new(
        online.model.clone(),
        to_u32(settings.threads),
        to_u32(max),
        online.planned_rate_per_s,
        online.replan_rate_change_min,
    )?;
    if !controller.node_names().eq(NODE_NAMES) {
        let why = format!("online mode needs the model's nodes in the order {NODE_NAMES:?}");
        return Err(CdrError::BadInput(why));
    }
    Ok(controller)
}

/// Logs a re-plan and resizes the four nodes to its thread counts.
fn apply_replan(
    running: &RunningPipeline,
    resizable: &Resizable,
    replan: &crate::online::Replan,
) -> Result<()> {
    tracing::info!(
        rate_per_s = replan.rate_per_s,
        threads = ?replan.threads,
        feasible = replan.feasible,
        bottleneck = %replan.bottleneck,
        "online: re-planned"
    );
    let five = "a plan has the generator's and the four nodes' thread counts";
    let [_, d, c, s, f] = <[u32; 5]>::try_from(replan.threads.as_slice()).expect(five);
    resizable.resize(running, [d, c, s, f].map(|n| n as usize))?;
    Ok(())
}

/// The online control loop (on the caller's thread until the generator's time is up): every
/// interval, measure the arrival rate and utilizations, let the controller decide, resize.
fn control(
    running: &RunningPipeline,
    resizable: &Resizable,
    settings: &RunSettings,
    online: &OnlineSettings,
    max: NodeThreads,
    arrivals_so_far: &dyn Fn() -> u64,
    started: Instant,
) -> Result<Vec<TimelinePoint>> {
    let mut controller = online_controller(settings, online, max)?;
    let interval_s = online.control_interval.as_secs_f64();
    let mut previous = running.metrics();
    let mut previous_arrivals = arrivals_so_far();
    let mut previous_at = Instant::now();
    let mut timeline = Vec::new();
    while started.elapsed() < settings.arrivals.duration() {
        std::thread::sleep(online.control_interval);
        let metrics = running.metrics();
        let arrivals = arrivals_so_far();
        let elapsed_s = previous_at.elapsed().as_secs_f64().max(interval_s * 1e-3);
        previous_at = Instant::now();
        let threads_in_force = controller.threads().to_vec();
        let arrival_rate_per_s = (arrivals - previous_arrivals) as f64 / elapsed_s;
        previous_arrivals = arrivals;
        let utilization = metrics
            .iter()
            .zip(&previous)
            .zip(&threads_in_force)
            .map(|((now, before), &threads)| {
                (now.busy_ns - before.busy_ns) as f64 * 1e-9 / (f64::from(threads) * elapsed_s)
            })
            .collect();
        previous = metrics;
        // The interval in which the generator stops is partial: nothing to plan for after it.
        let generator_done = started.elapsed() >= settings.arrivals.duration();
        let replan = if generator_done { None } else { controller.observe(arrival_rate_per_s)? };
        if let Some(replan) = &replan {
            apply_replan(running, resizable, replan)?;
        }
        timeline.push(TimelinePoint {
            time_s: started.elapsed().as_secs_f64(),
            arrival_rate_per_s,
            replan_threads: replan.map(|replan| replan.threads),
            threads: threads_in_force,
            utilization,
        });
    }
    Ok(timeline)
}
