//! Running the pipeline on the `pipeline` crate's stage runtime:
//! generator → decoder → converter → {serializer, feeder}.
//!
//! Each node is a stage with the configured worker count; the converter is connected to both
//! the serializer and the feeder, so the runtime copies every converted ticket to both
//! (fan-out). Rings are bounded, so an overloaded node pushes back on its upstream instead of
//! dropping tickets; at an unreachable rate the generator falls behind its schedule and the run
//! reports the rate it achieved.
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

use lab::load::{ArrivalProcess, Schedule};
use pipeline::stage::{Emitter, Flow, PipelineBuilder, Route, StageSpec};

use crate::convert::{Converted, convert};
use crate::feed::{DbTarget, Feeder};
use crate::serialize::Serializer;
use crate::ticket::{RawTicket, Ticket, TicketGenerator, decode, sequence_of};

/// Tickets the generator emits per call when running flat out or catching up.
pub const GENERATOR_BURST_TICKETS: u64 = 256;
/// Beyond this wait for the next scheduled ticket the generator sleeps instead of spinning.
const GENERATOR_SLEEP_ABOVE_NS: u64 = 200_000;

/// The node names, as in the model and config files.
pub const NODE_NAMES: [&str; 5] = ["generator", "decoder", "converter", "serializer", "feeder"];

/// Worker threads per node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeThreads {
    pub decoder: usize,
    pub converter: usize,
    pub serializer: usize,
    pub feeder: usize,
}

/// One run's settings.
#[derive(Clone, Debug)]
pub struct RunSettings {
    pub threads: NodeThreads,
    /// Poisson arrivals at this rate; `None` runs the generator flat out (maximum throughput).
    pub rate_per_s: Option<f64>,
    pub duration: Duration,
    pub out_dir: PathBuf,
    pub database: DbTarget,
    /// Serializer fsync policy: one fdatasync per this many records (0 = only at the end).
    pub fsync_every_records: u64,
    /// Every n-th generated ticket is malformed (0 = none).
    pub malformed_every: u64,
    pub seed: u64,
}

/// Counts published by workers as they finish, and cold-path errors.
#[derive(Default)]
struct Totals {
    generated: AtomicU64,
    rejected: AtomicU64,
    serialized: AtomicU64,
    inserted: AtomicU64,
    errors: Mutex<Vec<String>>,
}

impl Totals {
    fn add(counter: &AtomicU64, count: u64) {
        // Relaxed: totals are read only after every worker thread has been joined, and the
        // join synchronizes with each worker's last write.
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
            self.totals.error(format!("feeder final batch: {error:#}"));
        }
        Totals::add(&self.totals.inserted, self.feeder.rows_inserted());
    }
}

/// The generator's handler: Poisson arrivals at `rate_per_s`, or flat out.
fn generator_handler(
    settings: &RunSettings,
    totals: Arc<Totals>,
) -> anyhow::Result<impl FnMut(&mut Emitter<RawTicket>) -> Flow + Send + 'static> {
    let mut generator = TicketGenerator::new(settings.seed, settings.malformed_every);
    let mut schedule = match settings.rate_per_s {
        Some(rate_per_s) => {
            Some(Schedule::new(ArrivalProcess::Poisson { rate_per_s }, settings.seed)?)
        }
        None => None,
    };
    let mut next_due_ns = schedule.as_mut().and_then(Iterator::next);
    let duration_ns = settings.duration.as_nanos() as u64;
    let mut start: Option<Instant> = None;
    let mut generated = 0_u64;
    Ok(move |emitter: &mut Emitter<RawTicket>| {
        let now_ns = start.get_or_insert_with(Instant::now).elapsed().as_nanos() as u64;
        if now_ns >= duration_ns {
            Totals::add(&totals.generated, std::mem::take(&mut generated));
            return Flow::Stop;
        }
        let mut burst = 0;
        while burst < GENERATOR_BURST_TICKETS {
            match (&mut schedule, next_due_ns) {
                (None, _) => {}
                (Some(schedule), Some(due_ns)) if due_ns <= now_ns => next_due_ns = schedule.next(),
                (Some(_), due_ns) => {
                    let wait_ns = due_ns.map_or(0, |due| due - now_ns);
                    if burst == 0 && wait_ns > GENERATOR_SLEEP_ABOVE_NS {
                        std::thread::sleep(Duration::from_nanos(wait_ns.min(duration_ns)));
                    }
                    break;
                }
            }
            emitter.emit(generator.next_ticket());
            generated += 1;
            burst += 1;
        }
        Flow::Continue
    })
}

fn stage_spec(workers: usize) -> StageSpec {
    // Ancillary with the adaptive wait: the host may have fewer cores than workers, so
    // workers must park rather than spin.
    StageSpec::ancillary(workers)
}

/// Runs the pipeline for `settings.duration` and drains it.
pub fn run_pipeline(settings: &RunSettings) -> anyhow::Result<RunSummary> {
    std::fs::create_dir_all(&settings.out_dir)?;
    settings.database.prepare()?;
    let totals = Arc::new(Totals::default());
    let threads = settings.threads;
    let mut builder = PipelineBuilder::new().pin_threads(false);

    let generate = generator_handler(settings, totals.clone())?;
    let mut generate = Some(generate);
    let generator = builder.source("generator", stage_spec(1), move |_| {
        generate.take().expect("the generator has one worker")
    });

    let mut decoders = Vec::new();
    for worker in 0..threads.decoder {
        let path = settings.out_dir.join(format!("rejects-{worker}.log"));
        let rejects = BufWriter::new(File::create(&path)?);
        decoders.push(Some(DecoderWorker { rejects, rejected: 0, totals: totals.clone() }));
    }
    let decoder = builder.stage("decoder", stage_spec(threads.decoder), move |worker| {
        let mut state = decoders[worker].take().expect("one handler per worker");
        move |raw: &RawTicket, emitter: &mut Emitter<Ticket>| state.handle(raw, emitter)
    });
    let converter = builder.stage("converter", stage_spec(threads.converter), |_| {
        |ticket: &Ticket, emitter: &mut Emitter<Converted>| emitter.emit(convert(ticket))
    });

    let mut serializers = Vec::new();
    for worker in 0..threads.serializer {
        let serializer =
            Serializer::create(&settings.out_dir, worker, settings.fsync_every_records)?;
        serializers.push(Some(SerializerWorker { serializer, totals: totals.clone() }));
    }
    let serializer = builder.sink("serializer", stage_spec(threads.serializer), move |worker| {
        let mut state = serializers[worker].take().expect("one handler per worker");
        move |converted: &Converted| {
            if let Err(error) = state.serializer.write(converted) {
                panic!("serializer {}: {error}", state.serializer.path().display());
            }
        }
    });

    let mut feeders = Vec::new();
    for _ in 0..threads.feeder {
        let feeder = Feeder::new(settings.database.connect()?);
        feeders.push(Some(FeederWorker { feeder, totals: totals.clone() }));
    }
    let feeder = builder.sink("feeder", stage_spec(threads.feeder), move |worker| {
        let mut state = feeders[worker].take().expect("one handler per worker");
        move |converted: &Converted| {
            if let Err(error) = state.feeder.insert(&converted.row) {
                panic!("feeder insert: {error:#}");
            }
        }
    });

    builder.connect(generator, decoder, Route::RoundRobin);
    builder.connect(decoder, converter, Route::RoundRobin);
    builder.connect(converter, serializer, Route::RoundRobin);
    builder.connect(converter, feeder, Route::RoundRobin);

    let started = Instant::now();
    let cpu_start_ns = planner::measure::process_cpu_time_ns();
    let report = builder.start()?.wait()?;
    let cpu_s = (planner::measure::process_cpu_time_ns() - cpu_start_ns) as f64 * 1e-9;
    let wall_s = started.elapsed().as_secs_f64();
    let errors = std::mem::take(&mut *totals.errors.lock().unwrap_or_else(PoisonError::into_inner));
    anyhow::ensure!(errors.is_empty(), "the run finished with errors: {}", errors.join("; "));
    let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
    Ok(RunSummary {
        generated: load(&totals.generated),
        rejected: load(&totals.rejected),
        serialized: load(&totals.serialized),
        inserted: load(&totals.inserted),
        wall_s,
        cpu_s,
        stages: report
            .stages
            .iter()
            .map(|stage| StageSummary {
                name: stage.stage.clone(),
                workers: stage.workers,
                messages_in: stage.messages_in,
                messages_out: stage.messages_out,
                utilization: stage.utilization,
            })
            .collect(),
    })
}
