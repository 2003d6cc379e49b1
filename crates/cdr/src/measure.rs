//! `leantier plan measure cdr`: each node measured alone on this host with generated input.
//!
//! A node's real work runs flat out on one thread over a pre-generated batch of
//! `MEASURE_BATCH_TICKETS` inputs (so the measurement excludes producing the input): the
//! decoder decodes raw tickets, the converter converts decoded ones, the serializer appends
//! lines with the run's fsync policy, the feeder inserts rows in batches into a scratch
//! database. The generator is measured too: it shares the host's cores with the pipeline.
//!
//! Two corrections make the isolated measurements predict the running pipeline: the stage
//! runtime's own CPU cost per hop (measured with a no-op source → sink run) is added to each
//! node's CPU time, and on a shared host the time a thread waited for a core (measured with a
//! busy probe thread) is removed from its wall time, so μ and the CPU share describe an
//! uncontended core while `host.cores` holds the cores this process can actually get.

use std::hint::black_box;
use std::path::Path;
use std::time::Duration;

use crate::error::CdrError::BadInput;

use pipeline::stage::{Emitter, Flow, PipelineBuilder, Route, StageSpec};
use planner::PlanError;
use planner::measure::{
    NodeSample, ServiceTime, Workload, detect_host, measure_node, process_cpu_time_ns,
};
use planner::model::{NetworkSpec, NodeSpec, RouteSpec};

use crate::convert::{Converted, convert};
use crate::error::{CdrError, Result, io_failed};
use crate::feed::{DbTarget, FEED_BATCH_ROWS_DEFAULT, FEED_BATCH_ROWS_MAX, Feeder};
use crate::serialize::{FSYNC_EVERY_RECORDS_DEFAULT, Serializer};
use crate::ticket::{MALFORMED_EVERY_DEFAULT, RawTicket, Ticket, TicketGenerator, decode};

/// Inputs prepared per node and processed per measuring step.
pub const MEASURE_BATCH_TICKETS: usize = 4096;

/// The least time the I/O nodes (serializer, feeder) are measured, whatever the requested
/// duration: their cost has slow periodic parts (SQLite's WAL checkpoint every ~4 MB of WAL,
/// about a second of one-row transactions; bursts of slow fsyncs on a shared disk) that a
/// shorter measurement misses or over-weights.
pub const IO_NODE_MEASURE_MIN: Duration = Duration::from_secs(1);

/// Messages a calibration source emits per call.
const HOP_PROBE_BURST: usize = 256;

/// The share of a core one busy thread gets on this host now (1.0 on an idle host).
fn core_fraction(duration: Duration) -> Result<f64> {
    let sample = measure_node::<_, CdrError>(
        duration,
        &mut 0_u64,
        |state| {
            for i in 0..100_000_u64 {
                *state = black_box(state.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(i));
            }
            Ok(1)
        },
        |_| Ok(()),
    )?;
    Ok(sample.cpu_share())
}

/// CPU time the stage runtime spends per message and hop (send, ring, receive, metrics,
/// wake-ups), from a flat-out run of the cdr graph's shape (source → stage → stage → two
/// sinks, one worker each) with no-op handlers: the runtime's CPU time per ticket divided by
/// the four hops a ticket makes. Each node receives one hop per ticket, so each pays this on
/// top of its own work. The full shape matters: with more threads than cores, the wake-ups
/// and context switches of five threads cost more per hop than a two-thread probe shows.
fn hop_cpu_s(duration: Duration) -> Result<f64> {
    let run = run_probe_graph(duration, [1; 4], &ProbeWork::default())?;
    Ok(run.cpu_s / run.tickets as f64 / PROBE_HOPS_PER_TICKET)
}

/// Hops a ticket makes in the probe graph: one into each of decoder, converter and the two
/// sinks.
pub(crate) const PROBE_HOPS_PER_TICKET: f64 = 4.0;

/// CPU work each probe node burns per job, as spin-loop iterations (see [`spin`]), in graph
/// order: source (per ticket emitted), first stage, second stage, file sink, database sink.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct ProbeWork {
    pub spins_per_job: [u64; 5],
}

/// What a probe graph run did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct ProbeRun {
    /// Tickets that reached the database sink (every ticket reaches both sinks).
    pub tickets: u64,
    /// Process CPU time over the run, all threads.
    pub cpu_s: f64,
    /// Wall time, start to drained.
    pub wall_s: f64,
}

/// Burns `iterations` of a dependent multiply-add chain: CPU work that the optimizer cannot
/// remove and that touches no memory, so its cost per iteration is stable across threads.
pub(crate) fn spin(iterations: u64) {
    let mut state = 1_u64;
    for i in 0..iterations {
        state = black_box(state.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(i));
    }
    black_box(state);
}

/// Runs the cdr graph's shape (source → stage → stage → two sinks, `workers` per stage after
/// the source, the stage runtime's settings of `cdr run`) flat out for `duration`, every node
/// burning `work` per job instead of its real work.
pub(crate) fn run_probe_graph(
    duration: Duration,
    workers: [usize; 4],
    work: &ProbeWork,
) -> Result<ProbeRun> {
    let [source_spins, first_spins, second_spins, file_spins, database_spins] = work.spins_per_job;
    let spec = |workers: usize| StageSpec::ancillary(workers).with_max_workers(workers);
    let mut builder = PipelineBuilder::new().pin_threads(false);
    let source = builder.source("probe-source", StageSpec::ancillary(1), move |_| {
        // The clock starts at the source's first call, not when the graph is built: starting
        // six threads on a loaded host can take longer than a short probe.
        let mut deadline = None;
        move |emitter: &mut Emitter<RawTicket>| {
            let now = std::time::Instant::now();
            if now >= *deadline.get_or_insert(now + duration) {
                return Flow::Stop;
            }
            for _ in 0..HOP_PROBE_BURST {
                spin(source_spins);
                emitter.emit(RawTicket::default());
            }
            Flow::Continue
        }
    });
    let forward = |spins: u64| {
        move |_| {
            move |raw: &RawTicket, emitter: &mut Emitter<RawTicket>| {
                spin(spins);
                emitter.emit(*raw)
            }
        }
    };
    let first = builder.stage("probe-first", spec(workers[0]), forward(first_spins));
    let second = builder.stage("probe-second", spec(workers[1]), forward(second_spins));
    let sink = |spins: u64| {
        move |_| {
            move |raw: &RawTicket| {
                spin(spins);
                black_box(raw);
            }
        }
    };
    let file_sink = builder.sink("probe-file", spec(workers[2]), sink(file_spins));
    let database_sink = builder.sink("probe-database", spec(workers[3]), sink(database_spins));
    builder.connect(source, first, Route::RoundRobin);
    builder.connect(first, second, Route::RoundRobin);
    builder.connect(second, file_sink, Route::RoundRobin);
    builder.connect(second, database_sink, Route::RoundRobin);
    let started = std::time::Instant::now();
    let cpu_start_ns = process_cpu_time_ns();
    let report = builder.start()?.wait()?;
    let cpu_s = (process_cpu_time_ns() - cpu_start_ns) as f64 * 1e-9;
    let wall_s = started.elapsed().as_secs_f64();
    let tickets =
        report.stages.iter().find(|s| s.stage == "probe-database").map_or(0, |s| s.messages_in);
    if tickets == 0 {
        return Err(CdrError::Failed("the probe graph moved no message".into()));
    }
    Ok(ProbeRun { tickets, cpu_s, wall_s })
}

/// A measured model and the runtime CPU per hop included in each node's CPU time.
#[derive(Debug, Clone, PartialEq)]
pub struct MeasuredModel {
    pub model: NetworkSpec,
    /// Calibrated with one worker per stage ([`hop_cpu_s`]); the generator pays none.
    pub hop_cpu_s: f64,
}

/// The cdr pipeline as a planner workload.
pub struct CdrWorkload {
    /// Serializer fsync policy to measure with (records per fdatasync; 0 = only at the end).
    pub fsync_every_records: u64,
    /// Every n-th ticket is malformed (0 = none): the decoder→converter route carries the rest.
    pub malformed_every: u64,
    /// PostgreSQL URL for the feeder; SQLite in the scratch folder when `None`.
    pub database_url: Option<String>,
    /// Rows per feeder transaction.
    pub feed_batch_rows: usize,
}

impl Default for CdrWorkload {
    /// The defaults of `leantier cdr run`: SQLite, its fsync policy and malformed share.
    fn default() -> Self {
        Self {
            fsync_every_records: FSYNC_EVERY_RECORDS_DEFAULT,
            malformed_every: MALFORMED_EVERY_DEFAULT,
            database_url: None,
            feed_batch_rows: FEED_BATCH_ROWS_DEFAULT,
        }
    }
}

fn node(name: &str, time: ServiceTime) -> NodeSpec {
    NodeSpec { cpu_share: time.cpu_share(), ..NodeSpec::new(name, time.service_rate_per_s()) }
}

fn route(from: &str, to: &str, jobs_per_job: f64) -> RouteSpec {
    RouteSpec { from: from.into(), to: to.into(), jobs_per_job }
}

impl CdrWorkload {
    fn inputs(&self) -> (Vec<RawTicket>, Vec<Ticket>, Vec<Converted>) {
        let mut generator = TicketGenerator::new(1, 0);
        let raw: Vec<RawTicket> =
            (0..MEASURE_BATCH_TICKETS).map(|_| generator.next_ticket()).collect();
        let decoded: Vec<Ticket> = raw.iter().filter_map(|raw| decode(raw).ok()).collect();
        let converted = decoded.iter().map(convert).collect();
        (raw, decoded, converted)
    }

    fn database(&self, scratch_dir: &Path) -> DbTarget {
        match &self.database_url {
            Some(url) => DbTarget::Postgres {
                url: url.clone(),
                table: format!("leantier_cdr_measure_{}", std::process::id()),
            },
            None => DbTarget::Sqlite(scratch_dir.join("cdr-measure.sqlite")),
        }
    }
}

impl Workload for CdrWorkload {
    fn name(&self) -> &str {
        "cdr"
    }

    fn measure(
        &self,
        duration: Duration,
        scratch_dir: &Path,
        settings: &[(String, String)],
    ) -> Result<NetworkSpec, PlanError> {
        let measured =
            self.with_settings(settings).and_then(|w| w.measure_nodes(duration, scratch_dir));
        measured.map_err(|error| PlanError::Workload {
            workload: "cdr".into(),
            source: Box::new(error),
        })
    }
}

impl CdrWorkload {
    /// A copy with `KEY=VALUE` settings applied.
    pub fn with_settings(&self, settings: &[(String, String)]) -> Result<CdrWorkload> {
        let mut workload = CdrWorkload { database_url: self.database_url.clone(), ..*self };
        for (key, value) in settings {
            let number = || {
                value.parse::<u64>().map_err(|_| BadInput(format!("{key}: not a count: {value}")))
            };
            match key.as_str() {
                "fsync_every_records" => workload.fsync_every_records = number()?,
                "malformed_every" => workload.malformed_every = number()?,
                "feed_batch_rows" => {
                    let rows = number()?;
                    if !(1..=FEED_BATCH_ROWS_MAX as u64).contains(&rows) {
                        return Err(BadInput(format!(
                            "feed_batch_rows must be in 1..={FEED_BATCH_ROWS_MAX}, got {rows}"
                        )));
                    }
                    workload.feed_batch_rows = rows as usize;
                }
                "database_url" => workload.database_url = Some(value.clone()),
                _ => {
                    return Err(BadInput(format!(
                        "unknown cdr setting {key} (known: fsync_every_records, \
                         malformed_every, feed_batch_rows, database_url)"
                    )));
                }
            }
        }
        Ok(workload)
    }

    fn measure_nodes(&self, duration: Duration, scratch_dir: &Path) -> Result<NetworkSpec> {
        Ok(self.measure_with_hop(duration, scratch_dir)?.model)
    }

    /// Measures every node alone (as [`Workload::measure`]) and also returns the calibrated
    /// runtime CPU per hop that each node's CPU time includes, so a caller can replace it with
    /// a hop cost measured under other thread counts (`crate::sharing`).
    pub fn measure_with_hop(
        &self,
        duration: Duration,
        scratch_dir: &Path,
    ) -> Result<MeasuredModel> {
        let host = detect_host(scratch_dir, duration)?;
        let core_fraction = core_fraction(duration)?;
        let hop_cpu_s = hop_cpu_s(duration)?;
        let (raw, decoded, converted) = self.inputs();
        let [generated, decoding, converting] = self.measure_cpu_nodes(duration, &raw, &decoded)?;
        let (serializing, line_bytes) =
            self.measure_serializer(duration, scratch_dir, &converted)?;
        let database = self.database(scratch_dir);
        let feeding = self.measure_feeder(duration, &database, &converted)?;

        let timed = |sample: &planner::measure::NodeSample, hops: f64| {
            sample.uncontended(core_fraction, hops * hop_cpu_s)
        };
        let mut generator_node = node("generator", timed(&generated, 0.0));
        generator_node.external_share = 1.0;
        generator_node.fixed_threads = Some(1);
        let mut serializer_node = node("serializer", timed(&serializing, 1.0));
        serializer_node.disk_bytes_per_job = line_bytes;
        let mut feeder_node = node("feeder", timed(&feeding, 1.0));
        if matches!(database, DbTarget::Sqlite(_)) {
            // SQLite has one writer at a time: more feeder threads only queue on its lock.
            feeder_node.fixed_threads = Some(1);
        }
        let valid_share = match self.malformed_every {
            0 => 1.0,
            every => 1.0 - 1.0 / every as f64,
        };
        let model = NetworkSpec {
            host,
            node: vec![
                generator_node,
                node("decoder", timed(&decoding, 1.0)),
                node("converter", timed(&converting, 1.0)),
                serializer_node,
                feeder_node,
            ],
            route: vec![
                route("generator", "decoder", 1.0),
                route("decoder", "converter", valid_share),
                route("converter", "serializer", 1.0),
                route("converter", "feeder", 1.0),
            ],
            ..NetworkSpec::default()
        };
        Ok(MeasuredModel { model, hop_cpu_s })
    }

    /// The generator, the decoder and the converter, each measured alone on one thread.
    fn measure_cpu_nodes(
        &self,
        duration: Duration,
        raw: &[RawTicket],
        decoded: &[Ticket],
    ) -> Result<[NodeSample; 3]> {
        let batch = MEASURE_BATCH_TICKETS as u64;
        let mut generator = TicketGenerator::new(2, self.malformed_every);
        let generated = measure_node::<_, CdrError>(
            duration,
            &mut generator,
            |generator| {
                (0..batch).for_each(|_| {
                    black_box(generator.next_ticket());
                });
                Ok(batch)
            },
            |_| Ok(()),
        )?;
        let decode_all = |_: &mut ()| {
            raw.iter().for_each(|raw| {
                let _ = black_box(decode(raw));
            });
            Ok(batch)
        };
        let decoding = measure_node::<_, CdrError>(duration, &mut (), decode_all, |_| Ok(()))?;
        let convert_all = |_: &mut ()| {
            decoded.iter().for_each(|ticket| {
                black_box(convert(ticket));
            });
            Ok(decoded.len() as u64)
        };
        let converting = measure_node::<_, CdrError>(duration, &mut (), convert_all, |_| Ok(()))?;
        Ok([generated, decoding, converting])
    }

    /// The serializer alone, writing `converted` to a file in `scratch_dir` (with its syncs),
    /// and the records' mean line length in bytes.
    fn measure_serializer(
        &self,
        duration: Duration,
        scratch_dir: &Path,
        converted: &[Converted],
    ) -> Result<(NodeSample, f64)> {
        let mut serializer = Serializer::create(scratch_dir, 0, self.fsync_every_records)
            .map_err(io_failed(format!("creating a serializer in {}", scratch_dir.display())))?;
        let line_bytes =
            converted.iter().map(|c| c.line().len()).sum::<usize>() as f64 / converted.len() as f64;
        let serializing = measure_node::<_, CdrError>(
            duration.max(IO_NODE_MEASURE_MIN),
            &mut serializer,
            |serializer| {
                for record in converted {
                    serializer.write(record).map_err(io_failed("serializing a record"))?;
                }
                Ok(converted.len() as u64)
            },
            |serializer| serializer.sync().map_err(io_failed("syncing the serializer's file")),
        )?;
        Ok((serializing, line_bytes))
    }

    /// The feeder alone, inserting `converted` into a table it creates (and drops after).
    fn measure_feeder(
        &self,
        duration: Duration,
        database: &DbTarget,
        converted: &[Converted],
    ) -> Result<NodeSample> {
        database.prepare()?;
        let mut feeder = Feeder::new(database.connect()?, self.feed_batch_rows);
        let feeding = measure_node::<_, CdrError>(
            duration.max(IO_NODE_MEASURE_MIN),
            &mut feeder,
            |feeder| {
                for record in converted {
                    feeder.insert(&record.row)?;
                }
                Ok(converted.len() as u64)
            },
            |feeder| feeder.flush(),
        );
        database.drop_table()?;
        feeding
    }
}
